#!/usr/bin/env bash
# Runs every check and test Headroom has. CI (.ci/run) calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
# One-shot builds gain nothing from incremental state, which doubles target/ on disk.
export CARGO_INCREMENTAL=0

echo "== fmt";    cargo fmt --all -- --check
echo "== clippy"; cargo clippy --workspace --all-targets -- -D warnings
echo "== chromium (the dashboard test)"; scripts/install-chromium.sh
echo "== tests";  cargo test --workspace
echo "== deploy"; deploy/check.sh
echo "== openai client"; scripts/py/test-openai-client.sh
echo "== real vLLM (installs vLLM's CPU build into ~/.cache/headroom once)"; scripts/vllm/test-real.sh
echo "== real vLLM prefill/decode pair"; scripts/vllm/pd-check.sh
