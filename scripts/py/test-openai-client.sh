#!/usr/bin/env bash
# The official OpenAI Python client against `headroom serve` in front of two emulated
# replicas on loopback. Run by scripts/test.sh (the client venv is built once into
# ~/.cache/headroom by setup-clients.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."

VENV="$(scripts/py/setup-clients.sh | tail -n 1)"
# The binaries `cargo test --workspace` builds (a no-op right after it, as in
# scripts/test.sh): a release build only for this functional check cost CI ~7 minutes,
# and `cargo build -p …` resolves features differently and rebuilds for ~5.
cargo test -q --workspace --no-run
BIN="${CARGO_TARGET_DIR:-target}/debug"
WORK="$(mktemp -d)"
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

# Started in this shell (not in `$(…)`, whose subshell would lose the pid and leave the
# replica running after the test).
start_replica() {
    "$BIN/headroom-replica" --listen 127.0.0.1:0 --model tiny --profile h100-llama3-8b --time-scale 0.2 --seed "$1" >"$WORK/r$1.log" 2>&1 &
    PIDS+=("$!")
}
addr_of() {
    for _ in $(seq 100); do
        addr="$(grep -o 'http://127[0-9.:]*' "$WORK/r$1.log" | head -n 1 || true)"
        [[ -n "$addr" ]] && { echo "$addr"; return; }
        sleep 0.1
    done
    echo "replica $1 did not start" >&2; cat "$WORK/r$1.log" >&2; exit 1
}
start_replica 1
start_replica 2
R1="$(addr_of 1)"
R2="$(addr_of 2)"
PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
"$BIN/headroom" --log warn serve --listen "127.0.0.1:$PORT" --replica "$R1" --replica "$R2" --tokenizer tiny=cl100k >"$WORK/router.log" 2>&1 &
PIDS+=("$!")
for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$PORT/ready" >/dev/null && break
    sleep 0.1
done
curl -sf "http://127.0.0.1:$PORT/ready" >/dev/null || { echo "router not ready" >&2; cat "$WORK/router.log" >&2; exit 1; }
"$VENV/bin/python" scripts/py/openai_client_check.py "http://127.0.0.1:$PORT/v1" tiny
