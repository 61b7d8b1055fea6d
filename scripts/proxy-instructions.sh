#!/usr/bin/env bash
# Instructions the router executes per proxied request, counted by callgrind: a
# measure of the proxy's own work that the shared machine's noise does not move
# (two runs of one binary agree within 0.1%; `proxy-overhead`'s CPU per request moves
# by 3-4% between runs), so changes worth 1% can be told apart.
#
# The router (`headroom serve`, policy slo, the byte estimator, two replicas) runs
# under callgrind with instrumentation off; after 200 warm-up requests it is switched
# on for N requests (4 keep-alive clients, a 2 KB completions prompt, streamed with
# usage), then dumped. Upstreams: `headroom-bench slow-upstream`, 20 token events
# 1 ms apart, one event per write (as vLLM sends them). Background tasks (probes,
# scrapes) in that window count too: a few thousand instructions per second.
#
# Usage: scripts/proxy-instructions.sh [HEADROOM_BINARY] [N]
#   (default: target/release/headroom, 1000). Needs valgrind and python3, and
#   `cargo build --release -p headroom -p headroom-bench`. `CALLGRIND_OUT=FILE` keeps
#   the profile (read it with `callgrind_annotate --inclusive=yes FILE`).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${1:-$root/target/release/headroom}"
n="${2:-1000}"
bench="$root/target/release/headroom-bench"
command -v valgrind >/dev/null || { echo "valgrind not found (apt-get install valgrind)" >&2; exit 2; }
command -v python3 >/dev/null || { echo "python3 not found" >&2; exit 2; }
[ -x "$bin" ] && [ -x "$bench" ] || { echo "build first: cargo build --release -p headroom -p headroom-bench" >&2; exit 2; }

dir="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
up1=$(port); up2=$(port); rt=$(port)

cat >"$dir/client.py" <<'EOF'
import http.client, json, sys
port, n = int(sys.argv[1]), int(sys.argv[2])
prompt = ("The quick brown fox jumps over the lazy dog. " * 46)[:2000]
body = json.dumps({"model": "llama-3-8b", "prompt": prompt, "max_tokens": 20, "stream": True,
                   "stream_options": {"include_usage": True}})
c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
for _ in range(n):
    c.request("POST", "/v1/completions", body, {"content-type": "application/json"})
    r = c.getresponse()
    d = r.read()
    if r.status != 200 or b"[DONE]" not in d:
        sys.exit(f"bad answer: {r.status} {d[:200]!r}")
EOF

"$bench" slow-upstream --listen "127.0.0.1:$up1" --listen "127.0.0.1:$up2" \
  --tokens 20 --interval-ms 1 >"$dir/upstream.log" 2>&1 &
pids+=($!)
valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$dir/cg.out" \
  "$bin" --log warn serve --listen "127.0.0.1:$rt" --policy slo \
  --tokenizer llama-3-8b=estimate \
  --replica "http://127.0.0.1:$up1,name=u0,class=fixed" \
  --replica "http://127.0.0.1:$up2,name=u1,class=fixed" >"$dir/router.log" 2>&1 &
router=$!
pids+=($router)
for _ in $(seq 1 120); do
  curl -sf -o /dev/null "http://127.0.0.1:$rt/ready" && break
  sleep 1
done
curl -sf -o /dev/null "http://127.0.0.1:$rt/ready" || { cat "$dir/router.log" >&2; exit 1; }

python3 "$dir/client.py" "$rt" 200
callgrind_control -i on "$router" >/dev/null
clients=()
for _ in 1 2 3 4; do
  python3 "$dir/client.py" "$rt" $((n / 4)) &
  clients+=($!)
done
for c in "${clients[@]}"; do wait "$c"; done
callgrind_control -d "$router" >/dev/null
ir=$(awk '/^totals:/ {print $2}' "$dir/cg.out.1")
if [ -n "${CALLGRIND_OUT:-}" ]; then cp "$dir/cg.out.1" "$CALLGRIND_OUT"; fi
echo "instructions per request: $((ir / (n / 4 * 4))) ($ir over $((n / 4 * 4)) requests, $(basename "$bin") at $bin)"
