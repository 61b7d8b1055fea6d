#!/usr/bin/env bash
# A venv with the load tools operators already run, to point at the router:
# guidellm (pinned), and inference-perf where this machine's Python allows it.
# (`vllm bench serve` comes with the vLLM venv: scripts/vllm/bench-serve.py.)
#
# Usage: scripts/py/setup-load-tools.sh   (prints the venv path on its last line)
# Env:   HEADROOM_CACHE (default ~/.cache/headroom), PYTHON (default python3),
#        PYTHON312 (a Python >= 3.12 for inference-perf; default: python3.13 or
#        python3.12 on PATH or under pyenv's versions, else inference-perf is skipped
#        and the log says why), HEADROOM_LOAD_TOOLS_BASE (a venv of the same Python
#        whose packages guidellm may reuse; default: the vLLM venv when it exists)
#
# Size: guidellm requires torch. Alone it pulls torch with its CUDA wheels from PyPI
# (~6 GB, 2026-12-01); layered on the vLLM venv (a .pth line naming that venv's
# site-packages, so pip finds torch, transformers and numpy already installed and
# installs only the rest into this venv, which shadows the base) it adds ~150 MB, which
# is what lets the real-vLLM suite run it in CI. The base venv is never written to.
# Invariant: reused only when its marker holds exactly $RECIPE (written last, after
# each console script ran `--help`); otherwise rebuilt from scratch.
set -euo pipefail

GUIDELLM_VERSION=0.8.1
INFERENCE_PERF_VERSION=0.7.0

CACHE="${HEADROOM_CACHE:-$HOME/.cache/headroom}"
VENV="$CACHE/load-tools"
MARKER="$VENV/.headroom-complete"
LOG="$CACHE/logs/load-tools-setup.log"
PY="${PYTHON:-python3}"
mkdir -p "$CACHE/logs"

log() { printf '[load-tools %s] %s\n' "$(date +%H:%M:%S)" "$*" | tee -a "$LOG" >&2; }
die() {
    log "FAILED: $*"
    log "full log: $LOG (last lines follow)"
    tail -n 30 "$LOG" >&2 || true
    exit 1
}

# inference-perf 0.7.0 (and every release before it) declares Requires-Python >= 3.12.
# The first candidate that runs and is new enough (pyenv's shims are on PATH for
# versions that are not selected, and fail when run).
PYENV_ROOT="${PYENV_ROOT:-$HOME/.pyenv}"
PY312=""
for c in ${PYTHON312:-} python3.12 python3.13 \
    "$PYENV_ROOT"/versions/3.12*/bin/python3 "$PYENV_ROOT"/versions/3.13*/bin/python3; do
    if "$c" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
        PY312="$c"
        break
    fi
done
IPERF="skip"
if [[ -n "$PY312" ]]; then
    IPERF="inference-perf==${INFERENCE_PERF_VERSION}"
fi
BASE="${HEADROOM_LOAD_TOOLS_BASE-$CACHE/vllm-venv}"
BASE_SITE=""
if [[ -n "$BASE" && -x "$BASE/bin/python" ]]; then
    # Only a base of the very same interpreter version can share compiled packages.
    if [[ "$("$BASE/bin/python" -c 'import sys; print(sys.version_info[:2])')" == \
          "$("$PY" -c 'import sys; print(sys.version_info[:2])')" ]]; then
        BASE_SITE="$("$BASE/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    fi
fi
RECIPE="guidellm==${GUIDELLM_VERSION} ${IPERF} base=${BASE_SITE:-none} recipe=2"

exec 9>"$CACHE/load-tools.lock"
flock -w 1800 9 || die "timed out waiting for another setup holding $CACHE/load-tools.lock"

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
pip_q() { "$1" -m pip --disable-pip-version-check --no-input "${@:2}" >>"$LOG" 2>&1; }
pip_q "$VENV/bin/python" install --upgrade pip || die "pip upgrade failed"
if [[ -n "$BASE_SITE" ]]; then
    # Appended after this venv's own site-packages: what pip installs here wins.
    site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    printf '%s\n' "$BASE_SITE" > "$site/zz-headroom-base.pth"
    log "installing guidellm==$GUIDELLM_VERSION over $BASE_SITE (torch reused)"
else
    log "installing guidellm==$GUIDELLM_VERSION (torch and its CUDA wheels come with it: several GB)"
fi
pip_q "$VENV/bin/python" install "guidellm==$GUIDELLM_VERSION" || die "pip install guidellm failed"
"$VENV/bin/guidellm" run --help >>"$LOG" 2>&1 || die "guidellm run --help failed"

if [[ "$IPERF" == skip ]]; then
    log "inference-perf skipped: $INFERENCE_PERF_VERSION requires Python >= 3.12 and none was found ($("$PY" --version 2>&1) here; set PYTHON312)"
else
    # A venv of its own: it needs a newer interpreter than guidellm's.
    "$PY312" -m venv "$VENV/iperf" >>"$LOG" 2>&1 || die "$PY312 -m venv failed"
    pip_q "$VENV/iperf/bin/python" install "$IPERF" || die "pip install $IPERF failed"
    "$VENV/iperf/bin/inference-perf" --help >>"$LOG" 2>&1 || die "inference-perf --help failed"
    ln -sf "$VENV/iperf/bin/inference-perf" "$VENV/bin/inference-perf"
fi

printf '%s' "$RECIPE" >"$MARKER"
log "done in $(($(date +%s) - start)) s; venv size $(du -sh "$VENV" | cut -f1)"
echo "$VENV"
