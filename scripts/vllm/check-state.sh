# Sourced by the single-server checks (pd-check.sh, kv-router-check.sh,
# kv-events-check.sh), after they define `log` and HERE: a scratch dir in STATE, and on
# every exit path the router in ROUTER_PID stopped, the servers whose start.sh run dir
# is in "$STATE/run" stopped, the router log's tail shown on failure, STATE removed.
# shellcheck shell=bash

STATE="$(mktemp -d)"
ROUTER_PID=""
cleanup() {
    local rc=$?
    if [[ -n "$ROUTER_PID" ]]; then
        kill "$ROUTER_PID" 2>/dev/null || true
        wait "$ROUTER_PID" 2>/dev/null || true
    fi
    if [[ -f "$STATE/run" ]]; then
        "$HERE/stop.sh" "$(cat "$STATE/run")" >&2 || true
    fi
    if ((rc != 0)) && [[ -f "$STATE/router.log" ]]; then
        log "router log (tail):"; tail -n 30 "$STATE/router.log" >&2 || true
    fi
    rm -rf "$STATE"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
