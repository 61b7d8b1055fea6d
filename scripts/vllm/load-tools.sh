#!/usr/bin/env bash
# The load tools operators already run, pointed at Headroom in front of two real vLLM
# CPU servers (the heterogeneous pair of test-real.sh), each in a short form; their
# reports are kept beside the router's own view of the same requests.
#
# Usage: scripts/vllm/load-tools.sh [--emulator] [OUT]
#   default OUT: bench/results/load-tools/vllm (or .../emulator)
#   --emulator   two `headroom-replica` emulators instead of vLLM (no vLLM needed)
# Env: HEADROOM_BIN (router binary; default: `cargo build -p headroom`, dev profile),
#      HEADROOM_REPLICA_BIN (emulator; default: `cargo build -p headroom-replica`),
#      HEADROOM_LOAD_REQUESTS (per tool, default 20), HEADROOM_LOAD_RATE (req/s, 2),
#      HEADROOM_LOAD_INPUT / HEADROOM_LOAD_OUTPUT (tokens, 256 / 32), HEADROOM_CACHE,
#      HEADROOM_LOAD_EXPECT=N: fail unless every tool's N requests succeeded (CI),
#      HEADROOM_LOAD_URLS (comma-separated: servers already running, e.g. the suite's
#      in test-real.sh, used instead of starting a pair; not stopped here).
#
# Writes OUT/: decision-record-cold.json and decision-record.json (GET
# /debug/decisions/{id} of one streamed request before and after the tools ran, its
# response headers in decision-record*-headers.txt), guidellm/
# (report.json + console.txt), vllm-bench-serve/ (result.json + console.txt),
# inference-perf/ where it installed, requests.jsonl (the router's request log),
# headroom-summary.json (/debug/summary), headroom-metrics.txt, windows.tsv and
# report.md (scripts/vllm/load-tools-report.py). Everything started here is stopped on
# exit, also on failure or Ctrl-C. test-real.sh (CI) runs it in its shortest form
# (HEADROOM_LOAD_REQUESTS=8) against the suite's servers; each tool's start-up is
# 10-40 s on 2 cores, so the default 20 requests is a by-hand run.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
CACHE="${HEADROOM_CACHE:-$HOME/.cache/headroom}"
EMU=0
if [[ "${1:-}" == "--emulator" ]]; then EMU=1; shift; fi
OUT="${1:-$ROOT/bench/results/load-tools/$([[ $EMU == 1 ]] && echo emulator || echo vllm)}"
N="${HEADROOM_LOAD_REQUESTS:-20}"
RATE="${HEADROOM_LOAD_RATE:-2}"
IN="${HEADROOM_LOAD_INPUT:-256}"
OUTTOK="${HEADROOM_LOAD_OUTPUT:-32}"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"

log() { printf '[load-tools %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
now_ms() { python3 -c 'import time; print(int(time.time() * 1000))'; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_up() { # URL
    for _ in $(seq 1 300); do
        if curl -sf -o /dev/null "$1"; then return 0; fi
        sleep 0.2
    done
    die "$1 never answered"
}

RUN=""
PIDS=()
cleanup() {
    trap - EXIT INT TERM
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    if [[ -n "$RUN" ]]; then "$HERE/stop.sh" "$RUN" >&2 || log "WARNING: stop.sh failed; see $RUN"; fi
}
trap cleanup EXIT INT TERM

MODEL_DIR="$CACHE/tiny-llama"
if [[ $EMU == 0 ]]; then
    MODEL_DIR="$("$HERE/prepare.sh" | tail -n 1)"
fi
[[ -f "$MODEL_DIR/tokenizer.json" ]] || die "no tokenizer at $MODEL_DIR (run scripts/vllm/prepare.sh)"
VENV="$("$ROOT/scripts/py/setup-load-tools.sh" | tail -n 1)"
VLLM_PY="$CACHE/vllm-venv/bin/python"

BIN="${HEADROOM_BIN:-}"
if [[ -z "$BIN" ]]; then
    (cd "$ROOT" && cargo build -q -p headroom --bin headroom) || die "build failed"
    BIN="$TARGET/debug/headroom"
fi

rm -rf "$OUT"
mkdir -p "$OUT"
URLS=()
if [[ $EMU == 1 ]]; then
    REP="${HEADROOM_REPLICA_BIN:-}"
    if [[ -z "$REP" ]]; then
        (cd "$ROOT" && cargo build -q -p headroom-replica --bin headroom-replica) || die "build failed"
        REP="$TARGET/debug/headroom-replica"
    fi
    for i in 0 1; do
        p="$(free_port)"
        # A fast and a slow profile: a heterogeneous pair, like the real one.
        prof=$([[ $i == 0 ]] && echo h100-llama3-8b || echo l4-llama3-8b)
        "$REP" --listen "127.0.0.1:$p" --model tiny-llama --profile "$prof" --seed "$i" \
            > "$OUT/replica-$i.log" 2>&1 &
        PIDS+=($!)
        URLS+=("http://127.0.0.1:$p")
    done
elif [[ -n "${HEADROOM_LOAD_URLS:-}" ]]; then
    IFS=, read -r -a URLS <<< "$HEADROOM_LOAD_URLS"
else
    RUN="$(HEADROOM_VLLM_MODELS="$MODEL_DIR,$(dirname "$MODEL_DIR")/tiny-llama-big" "$HERE/start.sh" 2 | tail -n 1)"
    mapfile -t URLS < "$RUN/servers.txt"
fi
for u in "${URLS[@]}"; do wait_up "$u/v1/models"; done
log "replicas: ${URLS[*]}"

PORT="$(free_port)"
CONF="$OUT/headroom.toml"
{
    printf "listen = \"127.0.0.1:%s\"\nrequest_log = '%s'\n\n" "$PORT" "$OUT/requests.jsonl"
    printf '[prefix]\nblock_tokens = 32\n\n'
    printf "[[models]]\nname = \"tiny-llama\"\ntokenizer = 'hf:%s'\n\n" "$MODEL_DIR/tokenizer.json"
    for i in "${!URLS[@]}"; do
        printf '[[replicas]]\nurl = "%s"\nname = "replica-%s"\n\n' "${URLS[$i]}" "$i"
    done
} > "$CONF"
"$BIN" --log info serve --config "$CONF" > "$OUT/headroom.log" 2>&1 &
PIDS+=($!)
R="http://127.0.0.1:$PORT"
wait_up "$R/ready"
sleep 1 # scrapes and health settle

# One streamed request and its decision record: OUT/NAME.json, headers in NAME-headers.txt.
decision_record() { # NAME
    curl -sf -D "$OUT/$1-headers.txt" -o "$OUT/$1-response.txt" "$R/v1/chat/completions" \
        -H 'content-type: application/json' \
        -d '{"model":"tiny-llama","stream":true,"max_tokens":16,"messages":[{"role":"user","content":"Explain in one sentence why a router needs to predict latency."}]}' \
        || die "the request through the router failed"
    local id
    id="$(grep -i '^x-headroom-decision-id:' "$OUT/$1-headers.txt" | tr -d '\r' | awk '{print $2}')"
    [[ -n "$id" ]] || die "no x-headroom-decision-id header"
    sleep 0.5 # the record gets its measurements when the body has ended
    curl -sf "$R/debug/decisions/$id" | python3 -m json.tool > "$OUT/$1.json"
}
log "a request on a cold router and its decision record"
decision_record decision-record-cold

: > "$OUT/windows.tsv"
window() { printf '%s\t%s\t%s\n' "$1" "$2" "$(now_ms)" >> "$OUT/windows.tsv"; }

log "guidellm: $N requests at $RATE/s, $IN in / $OUTTOK out tokens"
mkdir -p "$OUT/guidellm"
t0="$(now_ms)"
HF_HUB_OFFLINE=1 "$VENV/bin/guidellm" run \
    --backend "kind=openai_http,target=$R,model=tiny-llama" \
    --profile "kind=constant,rate=$RATE" --constraint "kind=max_requests,count=$N" \
    --data "kind=synthetic_text,prompt_tokens=$IN,output_tokens=$OUTTOK" \
    --tokenizer "kind=hf_auto,model=$MODEL_DIR" \
    --output "kind=json,path=$OUT/guidellm/report.json" \
    --disable-console-interactive > "$OUT/guidellm/console.txt" 2>&1 \
    || die "guidellm failed: see $OUT/guidellm/console.txt"
window guidellm "$t0"

if [[ -x "$VLLM_PY" ]]; then
    log "vllm bench serve: $N requests at $RATE/s"
    mkdir -p "$OUT/vllm-bench-serve"
    t0="$(now_ms)"
    HF_HUB_OFFLINE=1 "$VLLM_PY" "$HERE/bench-serve.py" --backend openai --base-url "$R" \
        --endpoint /v1/completions --model tiny-llama --tokenizer "$MODEL_DIR" \
        --dataset-name random --random-input-len "$IN" --random-output-len "$OUTTOK" \
        --num-prompts "$N" --request-rate "$RATE" --seed 1 --ready-check-timeout-sec 60 \
        --save-result --result-dir "$OUT/vllm-bench-serve" --result-filename result.json \
        > "$OUT/vllm-bench-serve/console.txt" 2>&1 \
        || die "vllm bench serve failed: see $OUT/vllm-bench-serve/console.txt"
    window vllm-bench-serve "$t0"
else
    log "vllm bench serve skipped: no vLLM venv at $CACHE/vllm-venv (scripts/vllm/setup.sh)"
fi

if [[ -x "$VENV/bin/inference-perf" ]]; then
    log "inference-perf: $N requests at $RATE/s"
    mkdir -p "$OUT/inference-perf"
    cat > "$OUT/inference-perf/config.yml" <<YAML
load:
  type: constant
  stages:
  - rate: $RATE
    duration: $(( (N + RATE - 1) / RATE ))
api:
  type: completion
  streaming: true
server:
  type: vllm
  model_name: tiny-llama
  base_url: $R
  ignore_eos: true
tokenizer:
  pretrained_model_name_or_path: $MODEL_DIR
data:
  type: random
  input_distribution: {min: $IN, max: $IN, mean: $IN, std_dev: 0}
  output_distribution: {min: $OUTTOK, max: $OUTTOK, mean: $OUTTOK, std_dev: 0}
report:
  request_lifecycle: {summary: true, per_request: false}
storage:
  local_storage: {path: $OUT/inference-perf}
YAML
    t0="$(now_ms)"
    HF_HUB_OFFLINE=1 "$VENV/bin/inference-perf" --config_file "$OUT/inference-perf/config.yml" \
        > "$OUT/inference-perf/console.txt" 2>&1 \
        || die "inference-perf failed: see $OUT/inference-perf/console.txt"
    window inference-perf "$t0"
else
    log "inference-perf skipped: not installed (see scripts/py/setup-load-tools.sh)"
fi

log "a request once the tools have warmed the predictor, and its decision record"
decision_record decision-record
sleep 0.5
curl -sf "$R/debug/summary" | python3 -m json.tool > "$OUT/headroom-summary.json"
curl -sf "$R/metrics" > "$OUT/headroom-metrics.txt"
# The request log is flushed by its writer thread after each burst.
sleep 0.5
python3 "$HERE/load-tools-report.py" "$OUT" ${HEADROOM_LOAD_EXPECT:+--expect "$HEADROOM_LOAD_EXPECT"} >&2
log "done: $OUT"
