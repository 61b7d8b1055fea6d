#!/usr/bin/env bash
# Real-vLLM check of the KV-event index (headroom-kv-events).
#
# Starts one tiny CPU vLLM with KV events on
#   --kv-events-config {"enable_kv_cache_events":true,"publisher":"zmq",
#                       "endpoint":"tcp://*:P","replay_endpoint":"tcp://*:R","topic":"kv-events"}
# (plus start.sh's --enable-prompt-tokens-details), then runs the
# `vllm_check` example: token-id prompts with shared prefixes, the index's
# predicted cached tokens against the engine's usage.prompt_tokens_details.
# cached_tokens for every request, vLLM's sha256 block hashes reproduced, a
# subscriber gap caught up by replay, and an engine restart (same ports) timed
# until the index is correct again. Stops the server on every exit path.
#
# Usage: scripts/vllm/kv-events-check.sh          (exit 0 = every check passed)
# Env:   HEADROOM_CACHE, HEADROOM_VLLM_TIMEOUT (as start.sh), CARGO_TARGET_DIR.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
log() { printf '[kv-events-check %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# STATE, ROUTER_PID and the exit-path cleanup (servers, router, scratch dir).
# shellcheck source=scripts/vllm/check-state.sh
source "$HERE/check-state.sh"

free_ports() {
    python3 - "$1" <<'PY'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}
read -r API EV RP < <(free_ports 3)
KV_CFG="{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\"endpoint\":\"tcp://*:$EV\",\"replay_endpoint\":\"tcp://*:$RP\",\"topic\":\"kv-events\"}"
export HEADROOM_VLLM_EXTRA_ARGS="--kv-events-config $KV_CFG"

log "prepare (cached after the first run)"
"$HERE/prepare.sh" >&2
log "building the checker while the server starts"
(cd "$ROOT" && cargo build -q -p headroom-kv-events --example vllm_check) &
build=$!
t0=$(date +%s)
RUN="$("$HERE/start.sh" 1 "$API" | tail -n 1)"
echo "$RUN" >"$STATE/run"
log "vLLM healthy after $(($(date +%s) - t0)) s: http://127.0.0.1:$API, events tcp://127.0.0.1:$EV, replay $RP"
wait "$build"
log "GET /kv_event_sources: $(curl -s "http://127.0.0.1:$API/kv_event_sources")"
BIN="${CARGO_TARGET_DIR:-$ROOT/target}/debug/examples/vllm_check"

# The restart: stop the server, start a new one on the same ports (seq from 0,
# empty cache); the run dir in $STATE/run follows so cleanup stops the new one.
RESTART="'$HERE/stop.sh' \"\$(cat '$STATE/run')\" >&2 && '$HERE/start.sh' 1 $API | tail -n 1 > '$STATE/run.new' && mv '$STATE/run.new' '$STATE/run'"
"$BIN" --api "http://127.0.0.1:$API" --events "tcp://127.0.0.1:$EV" \
    --replay "tcp://127.0.0.1:$RP" --topic kv-events --block-size 32 \
    --restart-cmd "$RESTART"
log "passed in $(($(date +%s) - t0)) s"
