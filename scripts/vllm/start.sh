#!/usr/bin/env bash
# Starts N real vLLM (CPU) servers on 127.0.0.1 serving the tiny local model(s) under
# one name, and waits until every one answers GET /health with 200.
#
# Usage: scripts/vllm/start.sh N [BASE_PORT]
#   BASE_PORT given: server i listens on BASE_PORT+i (fails if a port is taken).
#   BASE_PORT omitted: N free ports are picked.
# Prints progress on stderr and the run directory alone on the last stdout line:
#   RUN=$(scripts/vllm/start.sh 2) && cat "$RUN/servers.txt"; scripts/vllm/stop.sh "$RUN"
# Run directory: servers.txt (one URL a line), server-I.{pid,port,log}, run-id,
# scratch/I (TMPDIR and caches of server I).
#
# Env: HEADROOM_CACHE (venv and model location, default ~/.cache/headroom),
#      HEADROOM_VLLM_MODEL (model dir, default $HEADROOM_CACHE/tiny-llama),
#      HEADROOM_VLLM_MODELS (model dirs, comma-separated: server i serves entry
#        i mod count, e.g. "$CACHE/tiny-llama,$CACHE/tiny-llama-big" for a
#        heterogeneous pair; default HEADROOM_VLLM_MODEL),
#      HEADROOM_VLLM_RUN_DIR (default: a new dir under ${TMPDIR:-/tmp}),
#      HEADROOM_VLLM_TIMEOUT (seconds to healthy, default 300),
#      HEADROOM_VLLM_EXTRA_ARGS (extra api_server flags, word-split),
#      HEADROOM_VLLM_DEV_MODE=1 (vLLM's dev endpoints, e.g. POST /reset_prefix_cache),
#      HEADROOM_VLLM_PIN (default 1: the whole server — API server, engine core, worker —
#        on core i mod nproc, not only its compute threads, so servers sharing this
#        machine do not take each other's CPU, as replicas on separate hosts would not;
#        0: only the compute threads, where a busy server slows the other's front end
#        and a router is rewarded for piling everything on one server).
#
# Invariants: every process started here runs in $RUN/scratch/I and carries
# HEADROOM_VLLM_RUN_ID in its environment (children inherit both); stop.sh finds and
# kills by those, so nothing outlives the run. On any failure here, whatever was
# started is stopped.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${HEADROOM_CACHE:-$HOME/.cache/headroom}"
VENV="$CACHE/vllm-venv"
MODEL="${HEADROOM_VLLM_MODEL:-$CACHE/tiny-llama}"
TIMEOUT="${HEADROOM_VLLM_TIMEOUT:-300}"

log() { printf '[vllm-start %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

usage() { echo "usage: $0 N [BASE_PORT]   (N servers, 1..16)" >&2; exit 2; }
[[ $# -ge 1 && $# -le 2 ]] || usage
N="$1"
BASE_PORT="${2:-}"
if ! [[ "$N" =~ ^[0-9]+$ ]] || ((N < 1 || N > 16)); then usage; fi
if [[ -n "$BASE_PORT" ]]; then
    if ! [[ "$BASE_PORT" =~ ^[0-9]+$ ]] || ((BASE_PORT < 1024 || BASE_PORT + N > 65535)); then
        die "BASE_PORT must be a number in 1024..$((65535 - N))"
    fi
fi
[[ "$TIMEOUT" =~ ^[0-9]+$ ]] || die "HEADROOM_VLLM_TIMEOUT must be whole seconds"

[[ -f "$VENV/.headroom-complete" && -x "$VENV/bin/python" ]] \
    || die "no complete vLLM venv at $VENV; run scripts/vllm/setup.sh (or scripts/vllm/prepare.sh)"
IFS=, read -r -a models <<<"${HEADROOM_VLLM_MODELS:-$MODEL}"
((${#models[@]} >= 1)) || die "HEADROOM_VLLM_MODELS names no model"
for m in "${!models[@]}"; do
    dir="${models[$m]}"
    [[ -f "$dir/headroom-model.json" && -f "$dir/config.json" ]] \
        || die "no tiny model at $dir; run scripts/vllm/prepare.sh (or make-tiny-model.py in the venv)"
    # Absolute paths: each server runs in its own scratch dir.
    models[$m]="$(cd "$dir" && pwd)"
done
command -v curl >/dev/null || die "curl is required"
VPY="$(cd "$VENV/bin" && pwd)/python"

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

ports=()
if [[ -n "$BASE_PORT" ]]; then
    for ((i = 0; i < N; i++)); do
        p=$((BASE_PORT + i))
        port_in_use "$p" && die "port $p on 127.0.0.1 is already in use"
        ports+=("$p")
    done
else
    # Hold all sockets at once so the N picks are distinct.
    mapfile -t ports < <("$VPY" - "$N" <<'PYEOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
for s in socks:
    print(s.getsockname()[1])
PYEOF
)
    ((${#ports[@]} == N)) || die "could not pick $N free ports"
fi

if [[ -n "${HEADROOM_VLLM_RUN_DIR:-}" ]]; then
    RUN="$HEADROOM_VLLM_RUN_DIR"
    mkdir -p "$RUN"
    [[ -z "$(ls -A "$RUN")" ]] || die "run dir $RUN is not empty"
else
    RUN="$(mktemp -d "${TMPDIR:-/tmp}/headroom-vllm.XXXXXX")"
fi
RUN="$(cd "$RUN" && pwd)"
RUN_ID="headroom-vllm-$(date +%s)-$$-$RANDOM"
echo "$RUN_ID" >"$RUN/run-id"
: >"$RUN/servers.txt"

started=0
cleanup_on_failure() {
    local rc=$?
    if ((rc != 0 && started)); then
        log "stopping what was started (run dir $RUN)"
        "$HERE/stop.sh" "$RUN" >&2 || true
    fi
}
trap cleanup_on_failure EXIT
trap 'exit 130' INT TERM

cores="$(nproc)"
[[ "${HEADROOM_VLLM_PIN:-1}" =~ ^[01]$ ]] || die "HEADROOM_VLLM_PIN must be 0 or 1, not '${HEADROOM_VLLM_PIN}'"
pin_server() { # I: the taskset prefix for server I, or nothing
    if [[ "${HEADROOM_VLLM_PIN:-1}" == 1 ]]; then echo "taskset -c $(($1 % cores))"; fi
}
((N <= cores)) || log "warning: $N servers on $cores cores; servers will share cores"

read -r -a extra <<<"${HEADROOM_VLLM_EXTRA_ARGS:-}"
for ((i = 0; i < N; i++)); do
    port="${ports[$i]}"
    model="${models[$((i % ${#models[@]}))]}"
    scratch="$RUN/scratch/$i"
    pin="$(pin_server "$i")"
    mkdir -p "$scratch/tmp" "$scratch/vllm-cache" "$scratch/inductor" "$scratch/hf"
    started=1
    # setsid: own process group, so a terminal's Ctrl-C does not reach it and
    # stop.sh can signal the whole server at once. The cwd (scratch dir) marks the
    # server and its children as ours even after vLLM retitles them.
    (
        cd "$scratch"
        exec env HEADROOM_VLLM_RUN_ID="$RUN_ID" \
            VLLM_TARGET_DEVICE=cpu \
            VLLM_CPU_KVCACHE_SPACE=1 \
            VLLM_CPU_OMP_THREADS_BIND="$((i % cores))" \
            VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
            VLLM_SERVER_DEV_MODE="${HEADROOM_VLLM_DEV_MODE:-0}" \
            HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HOME="$scratch/hf" \
            TMPDIR="$scratch/tmp" \
            VLLM_CACHE_ROOT="$scratch/vllm-cache" \
            TORCHINDUCTOR_CACHE_DIR="$scratch/inductor" \
            setsid $pin "$VPY" -m vllm.entrypoints.openai.api_server \
            --model "$model" --served-model-name tiny-llama \
            --host 127.0.0.1 --port "$port" \
            --max-model-len 4096 --enable-prefix-caching --enforce-eager \
            --block-size 32 --num-gpu-blocks-override 256 \
            --enable-prompt-tokens-details --enable-per-request-metrics \
            "${extra[@]}" \
            >"$RUN/server-$i.log" 2>&1 </dev/null
    ) &
    pid=$!
    echo "$pid" >"$RUN/server-$i.pid"
    echo "$port" >"$RUN/server-$i.port"
    echo "http://127.0.0.1:$port" >>"$RUN/servers.txt"
    echo "$model" >"$RUN/server-$i.model"
    log "server $i: pid $pid, http://127.0.0.1:$port, $(basename "$model"), core $((i % cores)), log $RUN/server-$i.log"
done

t0=$(date +%s)
deadline=$((t0 + TIMEOUT))
declare -A ready=()
while ((${#ready[@]} < N)); do
    for ((i = 0; i < N; i++)); do
        [[ -n "${ready[$i]:-}" ]] && continue
        pid="$(cat "$RUN/server-$i.pid")"
        if ! kill -0 "$pid" 2>/dev/null; then
            log "server $i (pid $pid) exited before becoming healthy; log tail:"
            tail -n 40 "$RUN/server-$i.log" >&2 || true
            exit 1
        fi
        code="$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 \
            "http://127.0.0.1:${ports[$i]}/health" || true)"
        if [[ "$code" == 200 ]]; then
            ready[$i]=1
            log "server $i healthy after $(($(date +%s) - t0)) s"
        fi
    done
    ((${#ready[@]} == N)) && break
    if (($(date +%s) >= deadline)); then
        for ((i = 0; i < N; i++)); do
            [[ -n "${ready[$i]:-}" ]] && continue
            log "server $i not healthy after $TIMEOUT s; log tail:"
            tail -n 40 "$RUN/server-$i.log" >&2 || true
        done
        exit 1
    fi
    sleep 1
done

log "all $N servers healthy in $(($(date +%s) - t0)) s; stop with: $HERE/stop.sh $RUN"
echo "$RUN"
