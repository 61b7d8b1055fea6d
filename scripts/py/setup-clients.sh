#!/usr/bin/env bash
# A small venv, separate from vLLM's, with the official OpenAI Python client and the
# PyPI peer routers for side-by-side runs (vllm-router, sglang-router).
#
# Usage: scripts/py/setup-clients.sh      (prints the venv path on its last line)
# Env:   HEADROOM_CACHE (default ~/.cache/headroom), PYTHON (default python3)
#
# Invariant: reused only when its marker holds exactly $RECIPE (written last, after
# every import and console script checked out); otherwise rebuilt from scratch.
set -euo pipefail

OPENAI_VERSION=3.57.0
VLLM_ROUTER_VERSION=0.1.17
SGLANG_ROUTER_VERSION=0.3.2
RECIPE="openai==${OPENAI_VERSION} vllm-router==${VLLM_ROUTER_VERSION} sglang-router==${SGLANG_ROUTER_VERSION} recipe=1"

CACHE="${HEADROOM_CACHE:-$HOME/.cache/headroom}"
VENV="$CACHE/py-clients"
MARKER="$VENV/.headroom-complete"
LOG="$CACHE/logs/py-clients-setup.log"
PY="${PYTHON:-python3}"
mkdir -p "$CACHE/logs"

log() { printf '[py-clients %s] %s\n' "$(date +%H:%M:%S)" "$*" | tee -a "$LOG" >&2; }
die() {
    log "FAILED: $*"
    log "full log: $LOG (last lines follow)"
    tail -n 30 "$LOG" >&2 || true
    exit 1
}

exec 9>"$CACHE/py-clients.lock"
flock -w 900 9 || die "timed out waiting for another setup holding $CACHE/py-clients.lock"

if [[ -f "$MARKER" && "$(cat "$MARKER")" == "$RECIPE" && -x "$VENV/bin/python" ]]; then
    log "reusing $VENV ($RECIPE)"
    echo "$VENV"
    exit 0
fi

command -v "$PY" >/dev/null || die "$PY not found"
start=$(date +%s)
: >"$LOG"
log "building $VENV ($RECIPE); log: $LOG"
rm -rf "$VENV"
"$PY" -m venv "$VENV" >>"$LOG" 2>&1 || die "python -m venv failed"
VPY="$VENV/bin/python"
pip_q() { "$VPY" -m pip --disable-pip-version-check --no-input "$@" >>"$LOG" 2>&1; }
pip_q install --upgrade pip || die "pip upgrade failed"
log "installing openai, vllm-router, sglang-router"
pip_q install "openai==$OPENAI_VERSION" "vllm-router==$VLLM_ROUTER_VERSION" \
    "sglang-router==$SGLANG_ROUTER_VERSION" || die "pip install failed"

"$VPY" -c 'import openai; print("openai", openai.__version__)' >>"$LOG" 2>&1 \
    || die "'import openai' failed"
for exe in vllm-router sglang-router; do
    [[ -x "$VENV/bin/$exe" ]] || die "console script $exe missing from $VENV/bin"
    "$VENV/bin/$exe" --help >>"$LOG" 2>&1 || die "$exe --help failed"
done

printf '%s' "$RECIPE" >"$MARKER"
log "done in $(($(date +%s) - start)) s; venv size $(du -sh "$VENV" | cut -f1)"
echo "$VENV"
