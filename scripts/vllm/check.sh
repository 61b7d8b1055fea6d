#!/usr/bin/env bash
# End-to-end check of the real-engine environment: prepare (venv + tiny model),
# the client venv, N servers, the OpenAI-client smoke test, then stop. Prints the
# time of each phase. Everything it starts is stopped on every exit path.
#
# Usage: scripts/vllm/check.sh [--servers N] [--capture-fixtures [DIR]]
#   --capture-fixtures: before the smoke test, re-capture the unit-test fixtures
#   from the first (still untouched) server into DIR (default scripts/vllm/fixtures).
# Env:   HEADROOM_CACHE (default ~/.cache/headroom)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"

servers=2
capture=""
while (($#)); do
    case "$1" in
        --servers) servers="${2:?--servers needs a number}"; shift 2 ;;
        --capture-fixtures)
            if [[ $# -ge 2 && "$2" != --* ]]; then capture="$2"; shift 2
            else capture="$HERE/fixtures"; shift; fi ;;
        *) echo "usage: $0 [--servers N] [--capture-fixtures [DIR]]" >&2; exit 2 ;;
    esac
done

phase() { printf '[vllm-check %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
t() { date +%s; }

RUN=""
cleanup() {
    if [[ -n "$RUN" ]]; then "$HERE/stop.sh" "$RUN" || true; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

t0=$(t)
model="$("$HERE/prepare.sh" | tail -n 1)"
t1=$(t)
phase "prepare (venv + model): $((t1 - t0)) s -> $model"
clients="$("$ROOT/scripts/py/setup-clients.sh" | tail -n 1)"
t2=$(t)
phase "client venv: $((t2 - t1)) s -> $clients"
RUN="$("$HERE/start.sh" "$servers" | tail -n 1)"
t3=$(t)
phase "start $servers servers to healthy: $((t3 - t2)) s -> $RUN"

# Memory of each server (API server + engine + worker), proportional set size.
while read -r url; do
    port="${url##*:}"
    for f in "$RUN"/server-*.port; do
        [[ "$(cat "$f")" == "$port" ]] || continue
        i="${f##*/server-}"; i="${i%.port}"
        kb=0
        for d in /proc/[0-9]*; do
            cwd="$(readlink "$d/cwd" 2>/dev/null)" || continue
            [[ "$cwd" == "$RUN/scratch/$i" ]] || continue
            pss="$(awk '/^Pss:/ {print $2}' "$d/smaps_rollup" 2>/dev/null || echo 0)"
            kb=$((kb + ${pss:-0}))
        done
        phase "server $i ($url): PSS $((kb / 1024)) MiB"
    done
done <"$RUN/servers.txt"

if [[ -n "$capture" ]]; then
    python3 "$HERE/capture-fixtures.py" "$(head -n 1 "$RUN/servers.txt")" "$capture" --model-dir "$model"
    phase "fixtures captured into $capture"
fi
"$clients/bin/python" "$HERE/smoke.py" "$RUN/servers.txt"
t4=$(t)
phase "smoke: $((t4 - t3)) s"
"$HERE/stop.sh" "$RUN"
RUN=""
phase "stop: $(($(t) - t4)) s; total $(($(t) - t0)) s"
