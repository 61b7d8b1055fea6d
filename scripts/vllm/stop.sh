#!/usr/bin/env bash
# Stops the vLLM servers of one run started by start.sh, and verifies they are gone.
#
# Usage: scripts/vllm/stop.sh RUN_DIR
# Env:   HEADROOM_VLLM_STOP_GRACE (seconds between SIGTERM and SIGKILL, default 20)
#
# A process belongs to the run when its cwd is under RUN_DIR/scratch/ or its
# environment holds the run's HEADROOM_VLLM_RUN_ID (start.sh sets both; children
# inherit them; vLLM's setproctitle clobbers the environ view of its engine
# processes, hence the cwd). Only such processes are signalled, so a recycled PID is
# never hit. SIGTERM first (the API server shuts its engine down), SIGKILL to
# whatever remains after the grace period. Safe to call twice.
set -euo pipefail

log() { printf '[vllm-stop %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[[ $# -eq 1 ]] || { echo "usage: $0 RUN_DIR" >&2; exit 2; }
GRACE="${HEADROOM_VLLM_STOP_GRACE:-20}"
[[ "$GRACE" =~ ^[0-9]+$ ]] || die "HEADROOM_VLLM_STOP_GRACE must be whole seconds"
[[ -d "$1" ]] || die "no run dir $1"
RUN="$(cd "$1" && pwd)"
[[ -f "$RUN/run-id" ]] || die "$RUN has no run-id; not a start.sh run dir"
RUN_ID="$(cat "$RUN/run-id")"
[[ -n "$RUN_ID" ]] || die "$RUN/run-id is empty"
SCRATCH="$RUN/scratch"

# True when live process $1 belongs to this run (zombies and vanished PIDs: false).
owned() {
    local cwd
    cwd="$(readlink "/proc/$1/cwd" 2>/dev/null)" || return 1
    [[ "$cwd" == "$SCRATCH"/* || "$cwd" == "$SCRATCH/"*" (deleted)" ]] && return 0
    { tr '\0' '\n' <"/proc/$1/environ" | grep -qxF "HEADROOM_VLLM_RUN_ID=$RUN_ID"; } 2>/dev/null
}

run_pids() {
    local d pid
    for d in /proc/[0-9]*; do
        pid="${d#/proc/}"
        [[ "$pid" == "$$" || "$pid" == "$BASHPID" ]] && continue
        if owned "$pid"; then echo "$pid"; fi
    done
}

mapfile -t pids < <(run_pids)
if ((${#pids[@]} == 0)); then
    log "nothing running for $RUN"
    touch "$RUN/stopped"
    exit 0
fi
log "stopping ${#pids[@]} processes of $RUN"

# Each API server leads its own process group (setsid in start.sh): signal the
# group so engine processes hear it too, then every owned PID directly.
shopt -s nullglob
for f in "$RUN"/server-*.pid; do
    pid="$(cat "$f")"
    [[ "$pid" =~ ^[0-9]+$ ]] || continue
    if owned "$pid"; then kill -TERM -- "-$pid" 2>/dev/null || true; fi
done
shopt -u nullglob
for pid in "${pids[@]}"; do
    if owned "$pid"; then kill -TERM "$pid" 2>/dev/null || true; fi
done

deadline=$(($(date +%s) + GRACE))
while (($(date +%s) < deadline)); do
    mapfile -t pids < <(run_pids)
    ((${#pids[@]} == 0)) && break
    sleep 0.5
done

mapfile -t pids < <(run_pids)
if ((${#pids[@]} > 0)); then
    log "still alive after ${GRACE} s: ${pids[*]}; sending SIGKILL"
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        for pid in "${pids[@]}"; do
            if owned "$pid"; then kill -KILL "$pid" 2>/dev/null || true; fi
        done
        sleep 0.3
        mapfile -t pids < <(run_pids)
        ((${#pids[@]} == 0)) && break
    done
fi

((${#pids[@]} == 0)) || die "processes of $RUN survived SIGKILL: ${pids[*]}"
touch "$RUN/stopped"
log "stopped"
