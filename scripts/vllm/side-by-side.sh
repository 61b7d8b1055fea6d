#!/usr/bin/env bash
# Headroom (`slo` and `token-load`) against the PyPI routers `vllm-router` and
# `sglang-router` (`cache_aware`) on the same two real vLLM (CPU) servers of different
# speed — the tiny model and its big variant, one name — same workload, one run: SLO
# attainment, TTFT/TPOT p50/p95, router CPU and peak RSS, written by
# `headroom-bench live` to OUT/side_by_side.md.
#
# Usage: scripts/vllm/side-by-side.sh [OUT]   (default: bench/results/real-vllm)
# Env: HEADROOM_SBS_WORKLOAD (generator spec), HEADROOM_SBS_SLO (`ttft=…,tpot=…`, ms),
#      HEADROOM_SBS_WARMUP_S (seconds of each replay not scored; the router learns),
#      HEADROOM_SBS_SYSTEMS (which to run, default all four),
#      HEADROOM_SBS_FRESH_SERVERS=1 (a freshly started pair for every system),
#      HEADROOM_SBS_JOURNAL_DIR (Headroom's routers write their learner's journal to
#      DIR/SYSTEM.jsonl, `predictor_journal`; replay: predictor/tests/real_cpu_journal.rs),
#      HEADROOM_SBS_CONFIG_EXTRA (TOML appended to every Headroom system's config, e.g.
#      a `[scrape]` table), HEADROOM_CACHE (venvs and models, as scripts/vllm/prepare.sh).
#      A Headroom system is `headroom-POLICY` (any of `headroom serve --policy`), and
#      may carry a variant, `headroom-slo+NAME` (or `headroom-token-load+NAME`, …): that policy with the TOML in HEADROOM_SBS_EXTRA_NAME
#      appended to its config, for A/B runs of a setting on one fleet in one run;
#      and/or the `headroom` binary in HEADROOM_SBS_BIN_NAME, for A/B runs of a code
#      change (e.g. the previous commit's release build copied aside).
# Headroom's decision records go to OUT/decisions-SYSTEM.json (`/debug/decisions`); the
# engines' own preemption and token counters over each system's replay to
# OUT/engine_counters.md.
#
# Every system routes to the same servers in turn; the servers are started once, and
# before each system the script waits until neither has a request running or waiting
# (so none inherits another's backlog), times three direct requests to each (the
# "probe ms before" column of engine_counters.md: a machine that slowed down shows
# there) and resets their prefix caches (vLLM's dev endpoint), so none inherits
# another's cached prompts. At a load near the pair's knee the order matters (a replay
# can tip the pair into a backlog that never drains); compare systems over several
# seeds with the order rotated.
# Everything started here is stopped on exit, also on failure or Ctrl-C.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
CACHE="${HEADROOM_CACHE:-$HOME/.cache/headroom}"
OUT="${1:-$ROOT/bench/results/real-vllm}"
WORKLOAD="${HEADROOM_SBS_WORKLOAD:-poisson:rate=1.5,duration=60,input=lognormal(600,0.6),output=lognormal(64,0.5),prompts=4,prompt_blocks=4,block=64,seed=3}"
SLO="${HEADROOM_SBS_SLO:-ttft=1500,tpot=60}"
WARMUP="${HEADROOM_SBS_WARMUP_S:-0}"
SYSTEMS="${HEADROOM_SBS_SYSTEMS:-headroom-slo headroom-token-load vllm-router sglang-router}"
PY="$CACHE/py-clients/bin"

log() { printf '[side-by-side %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

MODEL_DIR="$("$HERE/prepare.sh" | tail -n 1)"
"$ROOT/scripts/py/setup-clients.sh" >&2
(cd "$ROOT" && cargo build --release -q -p headroom -p headroom-bench) || die "build failed"
BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release"

RUN=""
ROUTER_PID=""
cleanup() {
    trap - EXIT INT TERM
    if [[ -n "$ROUTER_PID" ]]; then kill -TERM "$ROUTER_PID" 2>/dev/null || true; wait "$ROUTER_PID" 2>/dev/null || true; fi
    if [[ -n "$RUN" ]]; then "$HERE/stop.sh" "$RUN" >&2 || log "WARNING: stop.sh failed; see $RUN"; fi
}
trap cleanup EXIT INT TERM

# Start the pair (RUN, URLS). With HEADROOM_SBS_FRESH_SERVERS=1 every system after the
# first gets a freshly started pair (and the config its URLs): on this machine a pair
# that has served replays preempts more on the next one (2026-12-06 §9: 73/68, then
# 104/78, then 124/94 preemptions per server over three replays of one seed, probes
# unchanged), which favours whichever system runs first.
start_servers() {
    RUN="$(HEADROOM_VLLM_DEV_MODE=1 HEADROOM_VLLM_MODELS="$MODEL_DIR,$(dirname "$MODEL_DIR")/tiny-llama-big" \
        "$HERE/start.sh" 2 | tail -n 1)"
    mapfile -t URLS < "$RUN/servers.txt"
    log "servers: ${URLS[*]}"
}
start_servers
mkdir -p "$OUT"
rm -f "$OUT"/run-*.json "$OUT"/live-*.json
printf '| system | server | preemptions | prompt tokens computed | generated tokens | probe ms before |\n|---|---|---:|---:|---:|---:|\n' \
    > "$OUT/engine_counters.md"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

wait_up() { # URL PATH
    for _ in $(seq 1 150); do
        if curl -sf -o /dev/null "$1$2"; then return 0; fi
        sleep 0.2
    done
    die "$1$2 never answered"
}

# The engines' own counters (summed over their label sets), one line per server:
# preemptions, prompt tokens computed (recomputation after a preemption included) and
# generated tokens. Their deltas over a system's replay go to OUT/engine_counters.md.
COUNTERS='vllm:num_preemptions_total vllm:prompt_tokens_total vllm:generation_tokens_total'
engine_counters() {
    local u
    for u in "${URLS[@]}"; do
        curl -sf "$u/metrics" | awk -v names="$COUNTERS" '
            BEGIN { n = split(names, k, " ") }
            { name = $1; sub(/\{.*/, "", name); for (i = 1; i <= n; i++) if (name == k[i]) v[i] += $NF }
            END { for (i = 1; i <= n; i++) printf "%d ", v[i]; print "" }' || echo "? ? ?"
    done
}

# Wait until no server has a request running or waiting: a replay that ended in a
# backlog (or a router stopped with streams open) must not hand its queue to the next
# system. Logs how long that took and what was left.
wait_idle() { # LABEL
    local t0=$SECONDS busy u left n
    for _ in $(seq 1 600); do
        busy=0; left=""
        for u in "${URLS[@]}"; do
            n="$(curl -sf "$u/metrics" | awk '
                { name = $1; sub(/\{.*/, "", name) }
                name == "vllm:num_requests_running" || name == "vllm:num_requests_waiting" { v += $NF }
                END { printf "%d", v }')" || n=0
            busy=$((busy + n)); left="$left $n"
        done
        if (( busy == 0 )); then
            log "$1: servers idle after $((SECONDS - t0)) s"
            return 0
        fi
        sleep 0.5
    done
    log "WARNING $1: servers still busy after 300 s (running+waiting:$left)"
}

# Each server's speed just before a system runs, so a replay on a machine that slowed
# down can be told from a router that did worse: the median of three direct requests
# (a 300-word prompt not seen before, 32 output tokens, not streamed), in ms.
probe_ms() {
    local u i t
    for u in "${URLS[@]}"; do
        for i in 1 2 3; do
            curl -sf -o /dev/null -w '%{time_total}\n' "$u/v1/completions" -H 'content-type: application/json' \
                -d "{\"model\":\"tiny-llama\",\"prompt\":\"probe $RANDOM $i $(printf 'word%.0s ' $(seq 1 300))\",\"max_tokens\":32,\"min_tokens\":32,\"ignore_eos\":true}" \
                || echo nan
        done | sort -g | sed -n 2p | awk '{ printf "%.0f ", $1 * 1000 }'
    done
}

# One system: start its router (command in "$@"), replay the workload through it, stop it.
measure() { # LABEL PORT CMD...
    local label="$1" port="$2"; shift 2
    local before after i probe
    wait_idle "$label"
    probe="$(probe_ms)"
    log "$label: probe (ms per server): $probe"
    log "$label: resetting the servers' prefix caches"
    for u in "${URLS[@]}"; do curl -sf -X POST "$u/reset_prefix_cache" >/dev/null || die "reset_prefix_cache on $u"; done
    log "$label: starting"
    "$@" > "$OUT/$label.log" 2>&1 &
    ROUTER_PID=$!
    wait_up "http://127.0.0.1:$port" /v1/models
    sleep 2 # health checks and scrapes settle
    mapfile -t before < <(engine_counters)
    log "$label: replaying $WORKLOAD"
    "$BIN/headroom-bench" live --target "http://127.0.0.1:$port" --label "$label" \
        --target-pid "$ROUTER_PID" --workload "$WORKLOAD" --slo "$SLO" --model tiny-llama \
        --max-model-len 4096 --text-prompts --request-timeout-s 120 --warmup-s "$WARMUP" --out "$OUT" >&2
    # Headroom's decision records (what each candidate was predicted, why it won or
    # lost, what was measured), newest first, for reading a run afterwards.
    if [[ "$label" == headroom-* ]]; then
        curl -sf "http://127.0.0.1:$port/debug/decisions?limit=4096" > "$OUT/decisions-$label.json" \
            || log "$label: no decision records"
    fi
    mapfile -t after < <(engine_counters)
    for i in "${!URLS[@]}"; do
        read -r -a b <<< "${before[$i]}"; read -r -a a <<< "${after[$i]}"
        if [[ "${b[0]}" =~ ^[0-9]+$ && "${a[0]}" =~ ^[0-9]+$ ]]; then
            read -r -a pr <<< "$probe"
            printf '| %s | %s | %d | %d | %d | %s |\n' "$label" "${URLS[$i]}" \
                $((a[0] - b[0])) $((a[1] - b[1])) $((a[2] - b[2])) "${pr[$i]:-?}" >> "$OUT/engine_counters.md"
        fi
    done
    kill -TERM "$ROUTER_PID" 2>/dev/null || true
    wait "$ROUTER_PID" 2>/dev/null || true
    ROUTER_PID=""
}

CONF="$OUT/headroom.toml"
write_conf() {
{
    printf '[prefix]\nblock_tokens = 32\n\n'
    # The servers' own tokenizer and chat template: exact prompt counts and blocks.
    if [[ -f "$CACHE/tiny-llama/tokenizer.json" ]]; then
        printf "[[models]]\nname = \"tiny-llama\"\ntokenizer = 'hf:%s'\n\n" "$CACHE/tiny-llama/tokenizer.json"
    fi
    for i in "${!URLS[@]}"; do
        # A class per model: the two servers differ in speed.
        printf '[[replicas]]\nurl = "%s"\nname = "vllm-%s"\nclass = "cpu-%s"\n\n' \
            "${URLS[$i]}" "$i" "$(basename "$(cat "$RUN/server-$i.model")")"
    done
} > "$CONF"
}
write_conf

# One config per Headroom system: the shared one, plus its own learner journal if asked.
conf_for() { # SYSTEM
    local c="$OUT/$1.toml"
    {
        if [[ -n "${HEADROOM_SBS_JOURNAL_DIR:-}" ]]; then
            mkdir -p "$HEADROOM_SBS_JOURNAL_DIR"
            printf "predictor_journal = '%s'\n\n" "$HEADROOM_SBS_JOURNAL_DIR/$1.jsonl"
        fi
        cat "$CONF"
        if [[ -n "${HEADROOM_SBS_CONFIG_EXTRA:-}" ]]; then printf '%s\n' "$HEADROOM_SBS_CONFIG_EXTRA"; fi
        if [[ "$1" == *+* ]]; then
            local var="HEADROOM_SBS_EXTRA_${1#*+}"
            var="${var//-/_}"
            local bin="HEADROOM_SBS_BIN_${1#*+}"
            bin="${bin//-/_}"
            [[ -n "${!var:-}" || -n "${!bin:-}" ]] || die "$1: set $var to the TOML of this variant (or $bin to its binary)"
            printf '%s\n' "${!var:-}"
        fi
    } > "$c"
    echo "$c"
}

# A variant's own binary (HEADROOM_SBS_BIN_NAME), else this checkout's release build.
bin_for() {
    local b=""
    if [[ "$1" == *+* ]]; then b="HEADROOM_SBS_BIN_${1#*+}"; b="${b//-/_}"; b="${!b:-}"; fi
    [[ -z "$b" || -x "$b" ]] || die "$1: $b is not an executable"
    echo "${b:-$BIN/headroom}"
}

FIRST=1
for sys in $SYSTEMS; do
    if [[ "${HEADROOM_SBS_FRESH_SERVERS:-0}" == 1 && $FIRST == 0 ]]; then
        log "$sys: restarting the servers"
        "$HERE/stop.sh" "$RUN" >&2 || log "WARNING: stop.sh failed; see $RUN"
        RUN=""
        start_servers
        write_conf
    fi
    FIRST=0
    P=$(free_port); Q=$(free_port)
    case "$sys" in
        headroom-*) # any Headroom policy: headroom-POLICY[+VARIANT]
            policy="${sys#headroom-}"; policy="${policy%%+*}"
            measure "$sys" "$P" "$(bin_for "$sys")" serve --config "$(conf_for "$sys")" --listen "127.0.0.1:$P" --policy "$policy" ;;
        vllm-router) measure "$sys" "$P" "$PY/vllm-router" --host 127.0.0.1 --port "$P" --worker-urls "${URLS[@]}" \
            --policy cache_aware --prometheus-host 127.0.0.1 --prometheus-port "$Q" ;;
        sglang-router) measure "$sys" "$P" "$PY/sglang-router" launch --host 127.0.0.1 --port "$P" --worker-urls "${URLS[@]}" \
            --policy cache_aware --prometheus-host 127.0.0.1 --prometheus-port "$Q" ;;
        *) die "unknown system $sys (headroom-POLICY[+VARIANT], vllm-router, sglang-router)" ;;
    esac
done

log "wrote $OUT/side_by_side.md"
cat "$OUT/side_by_side.md" "$OUT/engine_counters.md"
