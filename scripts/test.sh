#!/usr/bin/env bash
# Runs every check and test Headroom has. CI (.ci/run) calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
# One-shot builds gain nothing from incremental state, which doubles target/ on disk.
export CARGO_INCREMENTAL=0

# vLLM's CPU build and the models (a few minutes on a fresh machine, mostly download)
# install while the workspace compiles; test-real.sh's own prepare then finds them
# (prepare.sh locks, so the two never race).
# Its own process group, so that an early exit stops all of it.
mkdir -p target
setsid scripts/vllm/prepare.sh >target/vllm-prepare.log 2>&1 &
prepare_pid=$!
trap 'kill -TERM -- "-$prepare_pid" 2>/dev/null || true' EXIT

echo "== fmt";    cargo fmt --all -- --check
echo "== clippy"; cargo clippy --workspace --all-targets -- -D warnings
echo "== chromium (the dashboard test)"; scripts/install-chromium.sh
echo "== tests";  cargo test --workspace
echo "== deploy"; deploy/check.sh
echo "== openai client"; scripts/py/test-openai-client.sh
echo "== real vLLM (installs vLLM's CPU build into ~/.cache/headroom once)"
wait "$prepare_pid" || { echo "vLLM preparation in the background failed (retried below):"; tail -n 20 target/vllm-prepare.log; }
scripts/vllm/test-real.sh
echo "== real vLLM prefill/decode pair"; scripts/vllm/pd-check.sh
