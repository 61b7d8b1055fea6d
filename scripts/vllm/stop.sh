#!/usr/bin/env bash
# Stops the vLLM servers of one run started by start.sh, and verifies they are gone.
#
# Usage: scripts/vllm/stop.sh RUN_DIR
# Env:   HEADROOM_VLLM_STOP_GRACE (seconds between SIGTERM and SIGKILL, default 20)
#
# SIGTERM goes to each API server's process group (vLLM shuts its engine children
# down on it); after the grace period every process still carrying this run's
# HEADROOM_VLLM_RUN_ID in its environment gets SIGKILL. Only processes with that id
# are ever signalled, so a recycled PID is never hit. Safe to call twice.
set -euo pipefail

log() { printf '[vllm-stop %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[[ $# -eq 1 ]] || { echo "usage: $0 RUN_DIR" >&2; exit 2; }
RUN="$1"
GRACE="${HEADROOM_VLLM_STOP_GRACE:-20}"
[[ "$GRACE" =~ ^[0-9]+$ ]] || die "HEADROOM_VLLM_STOP_GRACE must be whole seconds"
[[ -d "$RUN" ]] || die "no run dir $RUN"
[[ -f "$RUN/run-id" ]] || die "$RUN has no run-id; not a start.sh run dir"
RUN_ID="$(cat "$RUN/run-id")"
[[ -n "$RUN_ID" ]] || die "$RUN/run-id is empty"

# PIDs of every live process whose environment names this run.
run_pids() {
    local f pid
    for f in /proc/[0-9]*/environ; do
        pid="${f#/proc/}"
        pid="${pid%/environ}"
        [[ "$pid" == "$$" || "$pid" == "$BASHPID" ]] && continue
        if tr '\0' '\n' <"$f" 2>/dev/null | grep -qxF "HEADROOM_VLLM_RUN_ID=$RUN_ID"; then
            echo "$pid"
        fi
    done
}

owned() { tr '\0' '\n' <"/proc/$1/environ" 2>/dev/null | grep -qxF "HEADROOM_VLLM_RUN_ID=$RUN_ID"; }

mapfile -t pids < <(run_pids)
if ((${#pids[@]} == 0)); then
    log "nothing running for $RUN"
    touch "$RUN/stopped"
    exit 0
fi
log "stopping ${#pids[@]} processes of $RUN"

shopt -s nullglob
for f in "$RUN"/server-*.pid; do
    pid="$(cat "$f")"
    [[ "$pid" =~ ^[0-9]+$ ]] || continue
    if owned "$pid"; then
        # Whole group first (the server and engine children), then the PID itself
        # in case it is not a group leader.
        kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    fi
done
shopt -u nullglob

deadline=$(($(date +%s) + GRACE))
while (($(date +%s) < deadline)); do
    mapfile -t pids < <(run_pids)
    ((${#pids[@]} == 0)) && break
    sleep 0.5
done

mapfile -t pids < <(run_pids)
if ((${#pids[@]} > 0)); then
    log "still alive after ${GRACE} s: ${pids[*]}; sending SIGKILL"
    for pid in "${pids[@]}"; do
        if owned "$pid"; then kill -KILL "$pid" 2>/dev/null || true; fi
    done
    for _ in $(seq 1 20); do
        mapfile -t pids < <(run_pids)
        ((${#pids[@]} == 0)) && break
        sleep 0.25
    done
fi

mapfile -t pids < <(run_pids)
# Zombies awaiting reaping by a parent are dead already; ignore them.
alive=()
for pid in "${pids[@]}"; do
    state="$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null || true)"
    [[ -n "$state" && "$state" != Z ]] && alive+=("$pid")
done
((${#alive[@]} == 0)) || die "processes of $RUN survived SIGKILL: ${alive[*]}"
touch "$RUN/stopped"
log "stopped"
