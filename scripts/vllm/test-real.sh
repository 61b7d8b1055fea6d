#!/usr/bin/env bash
# The router's integration suite against REAL vLLM (CPU build, tiny local model).
#
# Prepares the cached venv and models (installs on a fresh machine, ~1 s after), starts
# two vLLM servers of different speed while the test binary builds — the tiny model and
# its big variant (same tokenizer, served under one name) — runs
# router/tests/real_vllm.rs against them one test at a time, and always stops them.
#
# Usage: scripts/vllm/test-real.sh [extra libtest args, e.g. a test name filter]
# Env:   HEADROOM_CACHE, HEADROOM_VLLM_TIMEOUT (see start.sh), CARGO_TARGET_DIR,
#        HEADROOM_REAL_VLLM_KEEP=1 keeps the run dir (server logs) after a pass,
#        HEADROOM_REAL_VLLM_ACCURACY=full runs t4b's full accuracy mode (~15 min),
#        HEADROOM_ROUTER_JOURNAL_DIR=DIR: each router writes its learner journal there
#        and t4b its client records (replay: predictor/tests/real_cpu_journal.rs),
#        HEADROOM_LOAD_TOOLS=0 skips the load tools' short form, HEADROOM_LOAD_TOOLS_OUT
#        keeps their reports there (default: the run dir, removed after a pass),
#        HEADROOM_REAL_VLLM_PROFILE=release builds the tests and the router they start
#        optimised (default: the debug build CI uses; the router's own time per request,
#        larger there, lands in every client-side TTFT).
#
# Before the Rust suite, the load tools operators run (guidellm, `vllm bench serve`,
# inference-perf where a Python >= 3.12 is found) drive a router in front of the same
# servers, 8 requests each (scripts/vllm/load-tools.sh); the suite fails when a tool
# fails or a request through the router does not succeed.
# Exports to the tests: HEADROOM_REAL_VLLM=1, HEADROOM_VLLM_URLS (comma-separated),
#        HEADROOM_VLLM_RUN_DIR (start.sh run dir: pid and port files, logs),
#        HEADROOM_VLLM_TOKENIZER (the tokenizer.json the servers use).
# Exit status: the tests' (1 also when preparation or startup fails).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
T0=$(date +%s)
log() { printf '[test-real %s +%ss] %s\n' "$(date +%H:%M:%S)" "$(($(date +%s) - T0))" "$*" >&2; }

WORK="$(mktemp -d "${TMPDIR:-/tmp}/headroom-real-vllm.XXXXXX")"
SERVERS="$WORK/servers"
start_pid=""
setup_pid=""
status=1

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    if [[ -n "$start_pid" ]] && kill -0 "$start_pid" 2>/dev/null; then
        # start.sh stops what it started when it is interrupted.
        kill -TERM "$start_pid" 2>/dev/null || true
        wait "$start_pid" 2>/dev/null || true
    fi
    if [[ -n "$setup_pid" ]] && kill -0 "$setup_pid" 2>/dev/null; then
        kill -TERM "$setup_pid" 2>/dev/null || true
        wait "$setup_pid" 2>/dev/null || true
    fi
    if [[ -f "$SERVERS/run-id" ]]; then
        log "stopping the servers"
        "$HERE/stop.sh" "$SERVERS" || log "WARNING: stop.sh failed; see $SERVERS"
    fi
    if ((rc == 0)) && [[ "${HEADROOM_REAL_VLLM_KEEP:-}" != 1 ]]; then
        rm -rf "$WORK"
    else
        log "server logs kept in $SERVERS"
    fi
    log "done (exit $rc)"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log "preparing the vLLM venv and the tiny model (cached after the first run)"
MODEL_DIR="$("$HERE/prepare.sh" | tail -n 1)"
[[ -f "$MODEL_DIR/tokenizer.json" ]] || { log "ERROR: no tokenizer.json in '$MODEL_DIR'"; exit 1; }
log "model: $MODEL_DIR"

# Servers take 1-3 minutes to start; build the tests meanwhile.
BIG_DIR="$(dirname "$MODEL_DIR")/tiny-llama-big"
[[ -f "$BIG_DIR/config.json" ]] || { log "ERROR: no big model in '$BIG_DIR'"; exit 1; }
log "starting 2 vLLM servers, $(basename "$MODEL_DIR") and $(basename "$BIG_DIR") (log: $WORK/start.log)"
HEADROOM_VLLM_MODELS="$MODEL_DIR,$BIG_DIR" HEADROOM_VLLM_RUN_DIR="$SERVERS" \
    "$HERE/start.sh" 2 >"$WORK/start.out" 2>"$WORK/start.log" &
start_pid=$!

if [[ "${HEADROOM_LOAD_TOOLS:-1}" != 0 ]]; then
    # The load tools' venv installs (once) while the servers start and the tests build.
    "$ROOT/scripts/py/setup-load-tools.sh" >"$WORK/load-tools-setup.log" 2>&1 &
    setup_pid=$!
fi

PROFILE="${HEADROOM_REAL_VLLM_PROFILE:-debug}"
case "$PROFILE" in
    debug) PROFILE_ARGS=() ;;
    release) PROFILE_ARGS=(--release) ;;
    *) log "ERROR: HEADROOM_REAL_VLLM_PROFILE must be debug or release, not '$PROFILE'"; exit 1 ;;
esac
log "building the test binary ($PROFILE)"
# --workspace, not -p headroom: the features `cargo test --workspace` resolved, so right
# after it this is a no-op (-p resolves them apart and rebuilt the router).
(cd "$ROOT" && cargo test "${PROFILE_ARGS[@]}" --workspace --test real_vllm --no-run)

log "waiting for the servers"
if ! wait "$start_pid"; then
    start_pid=""
    log "ERROR: the servers did not start"
    cat "$WORK/start.log" >&2
    exit 1
fi
start_pid=""
log "servers: $(paste -sd' ' "$SERVERS/servers.txt")"

export HEADROOM_REAL_VLLM=1
HEADROOM_VLLM_URLS="$(paste -sd, "$SERVERS/servers.txt")"
export HEADROOM_VLLM_URLS
export HEADROOM_VLLM_RUN_DIR="$SERVERS"
export HEADROOM_VLLM_TOKENIZER="$MODEL_DIR/tokenizer.json"

if [[ "${HEADROOM_LOAD_TOOLS:-1}" != 0 ]]; then
    if ! wait "$setup_pid"; then
        log "ERROR: installing the load tools failed"
        tail -n 30 "$WORK/load-tools-setup.log" >&2
        exit 1
    fi
    LT_OUT="${HEADROOM_LOAD_TOOLS_OUT:-$WORK/load-tools}"
    log "load tools through the router, short form (log: $WORK/load-tools.log)"
    if ! HEADROOM_LOAD_URLS="$HEADROOM_VLLM_URLS" HEADROOM_LOAD_REQUESTS=8 \
        HEADROOM_LOAD_EXPECT=8 HEADROOM_BIN="${CARGO_TARGET_DIR:-$ROOT/target}/$PROFILE/headroom" \
        "$HERE/load-tools.sh" "$LT_OUT" >"$WORK/load-tools.log" 2>&1; then
        log "ERROR: the load tools' short form failed"
        tail -n 40 "$WORK/load-tools.log" >&2
        exit 1
    fi
    cat "$LT_OUT/report.md" >&2
fi

log "running router/tests/real_vllm.rs"
set +e
(cd "$ROOT" && cargo test "${PROFILE_ARGS[@]}" --workspace --test real_vllm -- --test-threads=1 --nocapture "$@")
status=$?
set -e
log "tests finished with status $status"
exit "$status"
