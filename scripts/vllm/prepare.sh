#!/usr/bin/env bash
# One idempotent step for tests and CI: the vLLM CPU venv (setup.sh) and the tiny
# models (make-tiny-model.py: the small one and the big one with the same tokenizer,
# the suite's heterogeneous pair). Fast when all are already cached (~1 s).
#
# Usage: scripts/vllm/prepare.sh      (prints the small model's dir on its last line)
# Env:   HEADROOM_CACHE (default ~/.cache/headroom)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${HEADROOM_CACHE:-$HOME/.cache/headroom}"

venv="$("$HERE/setup.sh" | tail -n 1)"
[[ -x "$venv/bin/python" ]] || { echo "prepare: setup.sh gave no venv" >&2; exit 1; }

# The model build is cheap but must not race a second caller writing the same dir.
mkdir -p "$CACHE"
exec 9>"$CACHE/tiny-llama.lock"
flock -w 600 9 || { echo "prepare: timed out waiting for $CACHE/tiny-llama.lock" >&2; exit 1; }
HEADROOM_CACHE="$CACHE" "$venv/bin/python" "$HERE/make-tiny-model.py" --variant big \
    --out "$CACHE/tiny-llama-big" >/dev/null
HEADROOM_CACHE="$CACHE" "$venv/bin/python" "$HERE/make-tiny-model.py" --variant small \
    --out "$CACHE/tiny-llama" | tail -n 1
