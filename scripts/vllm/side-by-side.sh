#!/usr/bin/env bash
# Headroom against the PyPI routers `vllm-router` and `sglang-router` on the same two
# real vLLM (CPU) servers, same workload, one run: SLO attainment, TTFT/TPOT p50/p95,
# router CPU and peak RSS, written by `headroom-bench live` to OUT/side_by_side.md.
#
# Usage: scripts/vllm/side-by-side.sh [OUT]   (default: bench/results/real-vllm)
# Env: HEADROOM_SBS_WORKLOAD (generator spec), HEADROOM_SBS_SLO (`ttft=…,tpot=…`, ms),
#      HEADROOM_CACHE (venvs and model, as scripts/vllm/setup.sh).
#
# Every system routes to the same servers in turn; the servers are started once, so
# later systems see warmer prefix caches only for prompts they share with earlier ones
# (each system's workload uses its own seed-stable prompts; see the report's note).
# Everything started here is stopped on exit, also on failure or Ctrl-C.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
CACHE="${HEADROOM_CACHE:-$HOME/.cache/headroom}"
OUT="${1:-$ROOT/bench/results/real-vllm}"
WORKLOAD="${HEADROOM_SBS_WORKLOAD:-poisson:rate=1.5,duration=60,input=lognormal(600,0.6),output=lognormal(64,0.5),prompts=4,prompt_blocks=4,block=64,seed=3}"
SLO="${HEADROOM_SBS_SLO:-ttft=1500,tpot=60}"
PY="$CACHE/py-clients/bin"

log() { printf '[side-by-side %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

"$HERE/setup.sh" >&2
"$ROOT/scripts/py/setup-clients.sh" >&2
(cd "$ROOT" && cargo build --release -q -p headroom -p headroom-bench) || die "build failed"
BIN="$ROOT/target/release"

RUN=""
ROUTER_PID=""
cleanup() {
    trap - EXIT INT TERM
    if [[ -n "$ROUTER_PID" ]]; then kill -TERM "$ROUTER_PID" 2>/dev/null || true; wait "$ROUTER_PID" 2>/dev/null || true; fi
    if [[ -n "$RUN" ]]; then "$HERE/stop.sh" "$RUN" >&2 || log "WARNING: stop.sh failed; see $RUN"; fi
}
trap cleanup EXIT INT TERM

RUN="$("$HERE/start.sh" 2 | tail -n 1)"
mapfile -t URLS < "$RUN/servers.txt"
log "servers: ${URLS[*]}"
mkdir -p "$OUT"
rm -f "$OUT"/run-*.json "$OUT"/live-*.json

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

wait_up() { # URL PATH
    for _ in $(seq 1 150); do
        if curl -sf -o /dev/null "$1$2"; then return 0; fi
        sleep 0.2
    done
    die "$1$2 never answered"
}

# One system: start its router (command in "$@"), replay the workload through it, stop it.
measure() { # LABEL PORT CMD...
    local label="$1" port="$2"; shift 2
    log "$label: starting"
    "$@" > "$OUT/$label.log" 2>&1 &
    ROUTER_PID=$!
    wait_up "http://127.0.0.1:$port" /v1/models
    sleep 2 # health checks and scrapes settle
    log "$label: replaying $WORKLOAD"
    "$BIN/headroom-bench" live --target "http://127.0.0.1:$port" --label "$label" \
        --target-pid "$ROUTER_PID" --workload "$WORKLOAD" --slo "$SLO" --model tiny-llama \
        --max-model-len 4096 --text-prompts --request-timeout-s 120 --out "$OUT" >&2
    kill -TERM "$ROUTER_PID" 2>/dev/null || true
    wait "$ROUTER_PID" 2>/dev/null || true
    ROUTER_PID=""
}

CONF="$OUT/headroom.toml"
{
    printf '[prefix]\nblock_tokens = 32\n\n'
    # The servers' own tokenizer and chat template: exact prompt counts and blocks.
    if [[ -f "$CACHE/tiny-llama/tokenizer.json" ]]; then
        printf "[[models]]\nname = \"tiny-llama\"\ntokenizer = 'hf:%s'\n\n" "$CACHE/tiny-llama/tokenizer.json"
    fi
    for i in "${!URLS[@]}"; do
        printf '[[replicas]]\nurl = "%s"\nname = "vllm-%s"\nclass = "cpu-tiny-llama"\n\n' "${URLS[$i]}" "$i"
    done
} > "$CONF"

P=$(free_port); measure headroom-slo "$P" "$BIN/headroom" serve --config "$CONF" --listen "127.0.0.1:$P" --policy slo
P=$(free_port); Q=$(free_port)
measure vllm-router "$P" "$PY/vllm-router" --host 127.0.0.1 --port "$P" --worker-urls "${URLS[@]}" \
    --policy cache_aware --prometheus-host 127.0.0.1 --prometheus-port "$Q"
P=$(free_port); Q=$(free_port)
measure sglang-router "$P" "$PY/sglang-router" launch --host 127.0.0.1 --port "$P" --worker-urls "${URLS[@]}" \
    --policy cache_aware --prometheus-host 127.0.0.1 --prometheus-port "$Q"

log "wrote $OUT/side_by_side.md"
cat "$OUT/side_by_side.md"
