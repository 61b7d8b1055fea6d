#!/usr/bin/env bash
# Real-vLLM check of prefill/decode disaggregation THROUGH `headroom serve`.
#
# Starts two tiny CPU vLLM servers (the same model) with vLLM's shared-storage KV
# connector on one path,
#   --kv-transfer-config {"kv_connector":"ExampleConnector","kv_role":"kv_both",
#                         "kv_connector_extra_config":{"shared_storage_path":DIR}}
# (the one connector of vLLM's CPU build that needs no GPU library: NixlConnector needs
# the `nixl` package), and a router with server 0 as `role=prefill`, server 1 as
# `role=decode` and `[pd] connector = "shared-storage"`. Then, for completions and chat,
# streamed and not: the response is 200 and names P (`x-headroom-prefill-replica`) and
# D (`x-headroom-replica`); D reports most of the prompt as cached (the KV P stored,
# found by the prompt's hash: `usage.prompt_tokens_details.cached_tokens`); and D's
# greedy output from the KV it loaded equals P's own from the KV P computed. Stops the
# servers and the router on every exit path.
#
# Usage: scripts/vllm/pd-check.sh          (exit 0 = every check passed)
# Env:   HEADROOM_CACHE, HEADROOM_VLLM_TIMEOUT (as start.sh), CARGO_TARGET_DIR.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
log() { printf '[pd-check %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# STATE, ROUTER_PID and the exit-path cleanup (servers, router, scratch dir).
# shellcheck source=scripts/vllm/check-state.sh
source "$HERE/check-state.sh"

mkdir -p "$STATE/kv"
# No spaces: start.sh word-splits HEADROOM_VLLM_EXTRA_ARGS.
KV_CFG="{\"kv_connector\":\"ExampleConnector\",\"kv_role\":\"kv_both\",\"kv_connector_extra_config\":{\"shared_storage_path\":\"$STATE/kv\"}}"
export HEADROOM_VLLM_EXTRA_ARGS="--kv-transfer-config $KV_CFG"

log "prepare (cached after the first run)"
MODEL_DIR="$("$HERE/prepare.sh" | tail -n 1)"
log "building the router while the servers start"
# As `cargo test --workspace` builds it (a no-op after it; `-p` resolves features apart).
(cd "$ROOT" && cargo test -q --workspace --no-run) &
build=$!
t0=$(date +%s)
RUN="$(HEADROOM_VLLM_MODELS="$MODEL_DIR" "$HERE/start.sh" 2 | tail -n 1)"
echo "$RUN" >"$STATE/run"
mapfile -t URLS <"$RUN/servers.txt"
log "vLLM healthy after $(($(date +%s) - t0)) s: ${URLS[*]}"
wait "$build"
BIN="${CARGO_TARGET_DIR:-$ROOT/target}/debug/headroom"
ROUTER="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
cat >"$STATE/headroom.toml" <<EOF
[pd]
connector = "shared-storage"
min_prompt_tokens = 64

[[models]]
name = "tiny-llama"
tokenizer = 'hf:$MODEL_DIR/tokenizer.json'

[[replicas]]
url = "${URLS[0]}"
name = "vllm-p"
role = "prefill"

[[replicas]]
url = "${URLS[1]}"
name = "vllm-d"
role = "decode"
EOF
HEADROOM_LOG=info "$BIN" serve --config "$STATE/headroom.toml" --listen "127.0.0.1:$ROUTER" \
    --policy slo >"$STATE/router.log" 2>&1 &
ROUTER_PID=$!

python3 - "http://127.0.0.1:$ROUTER" "${URLS[0]}" <<'PY'
import json, sys, time, urllib.request

router, prefill_url = sys.argv[1], sys.argv[2]

def post(base, path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return r.status, dict(r.headers), r.read()

for _ in range(300):
    try:
        with urllib.request.urlopen(router + "/v1/models", timeout=2) as r:
            if r.status == 200 and json.load(r)["data"]:
                break
    except Exception:
        pass
    time.sleep(0.1)
else:
    sys.exit("the router never listed the model")
time.sleep(1.0)  # first scrapes and /v1/models of both replicas

def text_of(endpoint, raw, stream):
    """(generated text, usage) of a response body."""
    if not stream:
        v = json.loads(raw)
        c = v["choices"][0]
        return (c["message"]["content"] if endpoint.startswith("chat") else c["text"]), v["usage"]
    out, usage = "", None
    for line in raw.decode().splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        v = json.loads(line[6:])
        if v.get("usage"):
            usage = v["usage"]
        for c in v.get("choices", []):
            out += c.get("text") or (c.get("delta") or {}).get("content") or ""
    return out, usage

def body(endpoint, prompt, stream):
    b = {"model": "tiny-llama", "max_tokens": 16, "temperature": 0, "ignore_eos": True,
         "stream": stream}
    if stream:
        b["stream_options"] = {"include_usage": True}
    if endpoint == "completions":
        b["prompt"] = prompt
    else:
        b["messages"] = [{"role": "user", "content": prompt}]
    return b

failures = 0
for k, (endpoint, stream) in enumerate([("completions", False), ("completions", True),
                                        ("chat/completions", False), ("chat/completions", True)]):
    prompt = f"Case {k}. " + " ".join(f"The quick brown fox number {i} jumps." for i in range(60))
    status, h, raw = post(router, "/v1/" + endpoint, body(endpoint, prompt, stream))
    got, usage = text_of(endpoint, raw, stream)
    prompt_tokens = usage["prompt_tokens"]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    # The same prompt unified on P, from the KV P computed itself: greedy, so D's
    # output from the KV it loaded must be the same text.
    _, _, raw2 = post(prefill_url, "/v1/" + endpoint, body(endpoint, prompt, False))
    ref, _ = text_of(endpoint, raw2, False)
    p, d = h.get("x-headroom-prefill-replica"), h.get("x-headroom-replica")
    ok = (status == 200 and p == "vllm-p" and d == "vllm-d"
          and cached >= prompt_tokens // 2 and got == ref and got)
    failures += not ok
    print(f"{'PASS' if ok else 'FAIL'} {endpoint} stream={stream}: {status}, P={p}, D={d}, "
          f"D's cached tokens {cached} of {prompt_tokens}, output {'==' if got == ref else '!='} "
          f"P's unified ({got[:40]!r})")
sys.exit(1 if failures else 0)
PY
log "every check passed"
