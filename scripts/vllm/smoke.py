#!/usr/bin/env python3
"""End-to-end check of running vLLM servers with the official OpenAI client.

Run with the py-clients venv (scripts/py/setup-clients.sh):

    "$CLIENTS/bin/python" scripts/vllm/smoke.py "$RUN/servers.txt"   # or URL...

Per server: /v1/models names tiny-llama with max_model_len 4096; a completion with
ignore_eos returns exactly max_tokens tokens; a streaming chat with
stream_options.include_usage ends with a usage chunk whose choices are empty; /metrics
carries the metric names the router scrapes; a repeated ~2,000-token prompt raises
vllm:prefix_cache_hits_total and answers faster. Prints a JSON summary; exits 1 on
the first failed check. Talks to the given URLs only (loopback in our scripts).
"""

from __future__ import annotations

import json
import random
import re
import sys
import time
import urllib.request
from pathlib import Path

from openai import OpenAI

MODEL = "tiny-llama"
# Names the router's scraper depends on (vLLM 0.32, V1 engine).
REQUIRED_METRICS = [
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:inter_token_latency_seconds_bucket",
    "vllm:e2e_request_latency_seconds_bucket",
    "vllm:request_queue_time_seconds_bucket",
    "vllm:cache_config_info",
]
SAMPLE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


class CheckFailed(Exception):
    pass


def check(cond: bool, what: str) -> None:
    if not cond:
        raise CheckFailed(what)


def http_get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.read().decode()


def http_post_json(url: str, body: dict) -> dict:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def metric_sum(text: str, name: str) -> float:
    """Sum of all samples of `name` (any labels)."""
    total, seen = 0.0, False
    for line in text.splitlines():
        m = SAMPLE_RE.match(line)
        if m and m.group(1) == name:
            total += float(m.group(3))
            seen = True
    check(seen, f"/metrics has no sample of {name}")
    return total


def long_prompt(base: str, target_tokens: int, seed: int) -> tuple[str, int]:
    """Deterministic English-ish text of about target_tokens tokens, measured by /tokenize."""
    rng = random.Random(seed)
    words = (
        "router replica prefix cache token latency request queue budget decode prefill "
        "objective headroom mesh gossip predictor engine block memory batch stream"
    ).split()
    text = ""
    n = 0
    while n < target_tokens:
        # Small steps so the result lands just past the target.
        text += " ".join(rng.choice(words) for _ in range(20)) + ".\n"
        n = len(http_post_json(f"{base}/tokenize", {"model": MODEL, "prompt": text})["tokens"])
    return text, n


def ttft_seconds(client: OpenAI, prompt: str) -> float:
    t0 = time.monotonic()
    stream = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=1, temperature=0, stream=True
    )
    first = None
    for _ in stream:
        if first is None:
            first = time.monotonic() - t0
    check(first is not None, "streaming completion produced no chunk")
    return first


def smoke_one(base: str, seed: int) -> dict:
    client = OpenAI(base_url=f"{base}/v1", api_key="unused", timeout=120, max_retries=0)
    out: dict = {"url": base}

    models = client.models.list()
    ids = [m.id for m in models.data]
    check(ids == [MODEL], f"/v1/models lists {ids}, want [{MODEL}]")
    check(getattr(models.data[0], "max_model_len", None) == 4096, "max_model_len is not 4096")

    comp = client.completions.create(
        model=MODEL,
        prompt="The router sends each request where its objectives hold.",
        max_tokens=16,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    check(comp.usage is not None and comp.usage.completion_tokens == 16, f"completion usage {comp.usage}")
    check(comp.choices[0].finish_reason == "length", f"finish_reason {comp.choices[0].finish_reason}")
    out["completion_usage"] = comp.usage.model_dump()

    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Describe a prefix cache in one line."}],
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    check(len(chunks) >= 2, f"stream had {len(chunks)} chunks")
    last = chunks[-1]
    check(last.usage is not None and last.choices == [], "last stream chunk is not the usage chunk")
    check(last.usage.completion_tokens == 24, f"stream usage {last.usage}")
    check(all(c.usage is None for c in chunks[:-1]), "usage appeared before the final chunk")
    text = "".join((c.choices[0].delta.content or "") for c in chunks if c.choices)
    out["chat_stream"] = {
        "chunks": len(chunks),
        "content_chunks": sum(1 for c in chunks if c.choices and c.choices[0].delta.content),
        "usage": last.usage.model_dump(),
        "text_chars": len(text),
    }

    metrics = http_get(f"{base}/metrics")
    names = {m.group(1) for m in map(SAMPLE_RE.match, metrics.splitlines()) if m}
    missing = [n for n in REQUIRED_METRICS if n not in names]
    check(not missing, f"/metrics lacks {missing}")
    check('model_name="tiny-llama"' in metrics, "metrics lack model_name label")

    prompt, ntok = long_prompt(base, 2000, seed)
    hits0 = metric_sum(http_get(f"{base}/metrics"), "vllm:prefix_cache_hits_total")
    cold = ttft_seconds(client, prompt)
    hits1 = metric_sum(http_get(f"{base}/metrics"), "vllm:prefix_cache_hits_total")
    warm = ttft_seconds(client, prompt)
    hits2 = metric_sum(http_get(f"{base}/metrics"), "vllm:prefix_cache_hits_total")
    check(hits2 - hits1 >= 0.9 * ntok - 32, f"prefix hits rose {hits2 - hits1} for a {ntok}-token repeat")
    out["prefix_cache"] = {
        "prompt_tokens": ntok,
        "hits_first_send": hits1 - hits0,
        "hits_repeat": hits2 - hits1,
        "ttft_cold_ms": round(cold * 1000, 1),
        "ttft_cached_ms": round(warm * 1000, 1),
    }
    return out


def main() -> int:
    args = sys.argv[1:]
    if len(args) == 1 and Path(args[0]).is_file():
        args = [l.strip() for l in Path(args[0]).read_text().splitlines() if l.strip()]
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    results = []
    try:
        for i, base in enumerate(args):
            results.append(smoke_one(base.rstrip("/"), seed=1000 + i))
    except CheckFailed as e:
        print(f"smoke: FAILED: {e}", file=sys.stderr)
        print(json.dumps(results, indent=2))
        return 1
    print(json.dumps(results, indent=2))
    print(f"smoke: {len(results)} servers passed", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
