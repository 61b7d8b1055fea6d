#!/usr/bin/env bash
# Real-vLLM check of the router's precise prefix-cache counts (issue 16): requests go
# THROUGH `headroom serve`, which follows the engine's KV events.
#
# Starts one tiny CPU vLLM with
#   --kv-events-config {"enable_kv_cache_events":true,"publisher":"zmq",
#                       "endpoint":"tcp://*:P","replay_endpoint":"tcp://*:R","topic":"kv-events"}
# (plus start.sh's --enable-prompt-tokens-details), and a router with
#   --replica http://127.0.0.1:API,kv-events=discover
# (publisher read from the engine's GET /kv_event_sources, block size from its
# /metrics). Token-id prompts with shared prefixes: for every request the router's
# x-headroom-cached-tokens (what it routed on, source `precise`) must equal the
# engine's usage.prompt_tokens_details.cached_tokens. Then the engine restarts on
# the same ports (empty cache, sequence from 0): the time from its /health answering
# 200 until the router's feed is `precise` with an empty index is measured, and the
# next requests must match again. Stops the server and the router on every exit path.
#
# Usage: scripts/vllm/kv-router-check.sh          (exit 0 = every check passed)
# Env:   HEADROOM_CACHE, HEADROOM_VLLM_TIMEOUT (as start.sh), CARGO_TARGET_DIR.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
log() { printf '[kv-router-check %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# STATE, ROUTER_PID and the exit-path cleanup (servers, router, scratch dir).
# shellcheck source=scripts/vllm/check-state.sh
source "$HERE/check-state.sh"

read -r API EV RP ROUTER < <(python3 - <<'PY'
import socket
socks = []
for _ in range(4):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
)
KV_CFG="{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\"endpoint\":\"tcp://*:$EV\",\"replay_endpoint\":\"tcp://*:$RP\",\"topic\":\"kv-events\"}"
export HEADROOM_VLLM_EXTRA_ARGS="--kv-events-config $KV_CFG"

log "prepare (cached after the first run)"
"$HERE/prepare.sh" >&2
log "building the router while the server starts"
(cd "$ROOT" && cargo build -q -p headroom --bin headroom) &
build=$!
t0=$(date +%s)
RUN="$("$HERE/start.sh" 1 "$API" | tail -n 1)"
echo "$RUN" >"$STATE/run"
log "vLLM healthy after $(($(date +%s) - t0)) s: http://127.0.0.1:$API, events tcp://127.0.0.1:$EV, replay $RP"
wait "$build"
BIN="${CARGO_TARGET_DIR:-$ROOT/target}/debug/headroom"
HEADROOM_LOG=info "$BIN" serve --listen "127.0.0.1:$ROUTER" --policy least-request \
    --replica "http://127.0.0.1:$API,kv-events=discover" >"$STATE/router.log" 2>&1 &
ROUTER_PID=$!

RESTART="'$HERE/stop.sh' \"\$(cat '$STATE/run')\" >&2 && '$HERE/start.sh' 1 $API | tail -n 1 > '$STATE/run.new' && mv '$STATE/run.new' '$STATE/run'"
python3 - "http://127.0.0.1:$ROUTER" "$RESTART" <<'PY'
import json, subprocess, sys, time, urllib.request

router, restart = sys.argv[1], sys.argv[2]

def get(path):
    with urllib.request.urlopen(router + path, timeout=10) as r:
        return json.load(r)

def feed():
    try:
        return get("/debug/replicas")["replicas"][0]["kv_events"] or {}
    except Exception:
        return {}

def until(what, limit, ok):
    t = time.monotonic()
    while True:
        f = feed()
        if ok(f):
            return time.monotonic() - t
        if time.monotonic() - t > limit:
            sys.exit(f"timed out after {limit} s waiting for {what}: {f}")
        time.sleep(0.01)

def tokens(seed, n):
    # Deterministic ids in 10..4000 (the tiny model's vocab is 4096), as vllm_check.
    x = (seed * 0x9E3779B97F4A7C15 | 1) & (2**64 - 1)
    out = []
    for _ in range(n):
        x ^= (x << 13) & (2**64 - 1); x ^= x >> 7; x ^= (x << 17) & (2**64 - 1)
        out.append(10 + x % 3990)
    return out

def prompts(rnd):
    pre = [tokens(1, 120), tokens(2, 330), tokens(3, 700)]
    out = []
    for i in range(12):
        out.append(pre[i % 3] + tokens(100 + rnd * 1000 + i, 20 + (i * 37) % 180))
        if i % 4 == 3:
            out.append(list(out[-1]))
    return out

def settle():
    # Events reach the index within ~10 ms of the response; wait until the feed has
    # applied nothing new for 150 ms.
    last, stable = None, time.monotonic()
    while time.monotonic() - stable < 0.15:
        n = feed().get("batches_applied")
        if n != last:
            last, stable = n, time.monotonic()
        time.sleep(0.02)

def send(toks):
    body = json.dumps({"model": "tiny-llama", "prompt": toks, "max_tokens": 1,
                       "temperature": 0}).encode()
    req = urllib.request.Request(router + "/v1/completions", body,
                                 {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        h = r.headers
        v = json.load(r)
    eng = (v["usage"].get("prompt_tokens_details") or {}).get("cached_tokens")
    return int(h["x-headroom-cached-tokens"]), h["x-headroom-cached-tokens-source"], eng

bad = total = 0
def run(label, rnd):
    global bad, total
    for i, p in enumerate(prompts(rnd)):
        mine, src, eng = send(p)
        ok = src == "precise" and mine == eng
        total += 1; bad += 0 if ok else 1
        print(f"{label} {i:2d}: {len(p):4d} tokens  router {mine:4d} ({src})  engine {eng}  {'ok' if ok else 'MISMATCH'}", flush=True)
        settle()

t = until("precise at start", 120, lambda f: f.get("state") == "precise")
f = feed()
print(f"router feed precise {t*1000:.0f} ms after first poll; endpoint {f.get('endpoint')} block_size {f.get('block_size')}", flush=True)
run("before", 0)
held = feed().get("blocks", 0)
print(f"index holds {held} blocks before the restart", flush=True)
t_stop = time.monotonic()
subprocess.run(["bash", "-c", restart], check=True)
healthy = time.monotonic()
print(f"engine restarted (stop + start {healthy - t_stop:.0f} s)", flush=True)
t = until("precise with an empty index after the restart", 60,
          lambda f: f.get("state") == "precise" and f.get("blocks") == 0)
print(f"router feed precise with an empty index {t*1000:.0f} ms after the new engine's /health answered 200 (restarts {feed().get('restarts')}, connects {feed().get('connects')})", flush=True)
# The router's own health probe must re-admit the replica before requests route.
t0 = time.monotonic()
while True:
    r = get("/debug/replicas")["replicas"][0]
    if r.get("routable"):
        break
    if time.monotonic() - t0 > 30:
        sys.exit("replica never re-admitted")
    time.sleep(0.05)
run("after ", 1)
print(f"SUMMARY: {total - bad} of {total} requests: router x-headroom-cached-tokens == engine cached_tokens (precise)", flush=True)
sys.exit(1 if bad else 0)
PY
log "passed in $(($(date +%s) - t0)) s"
