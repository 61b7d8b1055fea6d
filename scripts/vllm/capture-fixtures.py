#!/usr/bin/env python3
"""Captures real vLLM responses, byte for byte, as fixtures for the router's unit tests.

    python3 scripts/vllm/capture-fixtures.py URL [OUT_DIR] [--model-dir DIR]

URL is one running server from start.sh (loopback); OUT_DIR defaults to
scripts/vllm/fixtures. Standard library only. Every file is listed in OUT_DIR/index.json
with the request that produced it, the HTTP status and the content type. Bodies are
stored exactly as received (SSE framing included); nothing is reformatted.

The "loaded" metrics snapshot is taken while several long requests run at once, so
running/waiting/KV-usage gauges are non-zero; how busy it gets depends on the machine.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

MODEL = "tiny-llama"
WORDS = (
    "router replica prefix cache token latency request queue budget decode prefill "
    "objective headroom mesh gossip predictor engine block memory batch stream"
).split()


def words(n: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n))


def request(url: str, body: dict | None = None, timeout: float = 120) -> tuple[int, str, bytes]:
    """Returns (status, content-type, raw body); HTTP errors are results, not exceptions."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.headers.get("content-type", ""), resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("content-type", ""), e.read()


def compact(value):
    """The request as recorded in index.json, long generated prompts elided."""
    if isinstance(value, dict):
        return {k: compact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [compact(v) for v in value]
    if isinstance(value, str) and len(value) > 200:
        return f"<{len(value)} chars of seeded filler words, see capture-fixtures.py>"
    return value


def gauge(metrics: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", metrics, re.M)
    return float(m.group(1)) if m else 0.0


class Capture:
    def __init__(self, base: str, out: Path):
        self.base = base.rstrip("/")
        self.out = out
        self.index: dict[str, dict] = {}

    def save(self, name: str, method: str, path: str, body: dict | None, expect: int | None = None,
             note: str = "") -> bytes:
        status, ctype, raw = request(self.base + path, body)
        if expect is not None and status != expect:
            raise SystemExit(f"{name}: {method} {path} gave {status}, expected {expect}: {raw[:300]!r}")
        (self.out / name).write_bytes(raw)
        entry = {"method": method, "path": path, "status": status, "content_type": ctype}
        if body is not None:
            entry["request"] = compact(body)
        if note:
            entry["note"] = note
        self.index[name] = entry
        print(f"  {name}: {status} {ctype} {len(raw)} bytes", file=sys.stderr)
        return raw

    def put_metrics(self, name: str, scraped: tuple[int, str, bytes], note: str) -> None:
        status, ctype, raw = scraped
        if status != 200:
            raise SystemExit(f"{name}: GET /metrics gave {status}")
        (self.out / name).write_bytes(raw)
        self.index[name] = {"method": "GET", "path": "/metrics", "status": status,
                            "content_type": ctype, "note": note}
        print(f"  {name}: {len(raw)} bytes", file=sys.stderr)


Scrape = tuple[int, str, bytes]


def loaded_metrics(base: str, n_requests: int = 8, prompt_words: int = 850,
                   max_tokens: int = 96, limit_s: float = 120) -> tuple[Scrape, Scrape]:
    """Runs n_requests long, distinct requests at once; returns (busiest snapshot, after)."""
    errors: list[str] = []

    def one(i: int) -> None:
        body = {"model": MODEL, "prompt": words(prompt_words, 5000 + i), "max_tokens": max_tokens,
                "ignore_eos": True, "temperature": 0}
        status, _, raw = request(base + "/v1/completions", body, timeout=limit_s)
        if status != 200:
            errors.append(f"{status} {raw[:200]!r}")

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n_requests)]
    for t in threads:
        t.start()
    best: Scrape = (0, "", b"")
    best_score = -1.0
    deadline = time.monotonic() + limit_s
    while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
        scraped = request(base + "/metrics", timeout=10)
        text = scraped[2].decode()
        score = (gauge(text, "vllm:num_requests_waiting") * 10
                 + gauge(text, "vllm:num_requests_running")
                 + gauge(text, "vllm:kv_cache_usage_perc"))
        if score > best_score:
            best, best_score = scraped, score
        time.sleep(0.05)
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    if any(t.is_alive() for t in threads):
        raise SystemExit(f"load requests still running after {limit_s} s")
    if errors:
        raise SystemExit(f"load requests failed: {errors}")
    return best, request(base + "/metrics", timeout=10)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("out", nargs="?", type=Path, default=Path(__file__).resolve().parent / "fixtures")
    ap.add_argument("--model-dir", type=Path, help="copy tokenizer.json and the model manifest from here")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    c = Capture(args.url, args.out)
    print(f"capturing from {c.base} into {args.out}", file=sys.stderr)

    c.put_metrics("metrics-fresh.txt", request(c.base + "/metrics"),
                  "before this script sent any request; on a just-started server, counters are zero")
    c.save("models.json", "GET", "/v1/models", None, 200)
    c.save("version.json", "GET", "/version", None, 200)
    short = "The router sends each request where its objectives hold."
    c.save("tokenize.json", "POST", "/tokenize", {"model": MODEL, "prompt": short}, 200)
    c.save("completion.json", "POST", "/v1/completions",
           {"model": MODEL, "prompt": short, "max_tokens": 16, "temperature": 0, "ignore_eos": True}, 200)
    c.save("completion-stream-usage.sse", "POST", "/v1/completions",
           {"model": MODEL, "prompt": short, "max_tokens": 16, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}, 200)
    c.save("completion-stream-chunk-usage.sse", "POST", "/v1/completions",
           {"model": MODEL, "prompt": short, "max_tokens": 8, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
           200, "usage in every chunk, as the router asks for it")
    c.save("completion-stream-no-usage.sse", "POST", "/v1/completions",
           {"model": MODEL, "prompt": short, "max_tokens": 8, "temperature": 0, "ignore_eos": True,
            "stream": True}, 200, "no stream_options: the stream carries no usage chunk")
    chat_msgs = [{"role": "system", "content": "Be brief."},
                 {"role": "user", "content": "Describe a prefix cache in one line."}]
    c.save("chat.json", "POST", "/v1/chat/completions",
           {"model": MODEL, "messages": chat_msgs, "max_tokens": 16, "temperature": 0, "ignore_eos": True}, 200)
    c.save("chat-stream-usage.sse", "POST", "/v1/chat/completions",
           {"model": MODEL, "messages": chat_msgs, "max_tokens": 16, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}, 200)
    c.save("chat-stream-chunk-usage.sse", "POST", "/v1/chat/completions",
           {"model": MODEL, "messages": chat_msgs, "max_tokens": 8, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
           200, "usage in every chunk, as the router asks for it")
    # Greedy output repeats itself, so a piece of an earlier answer makes a stop
    # string that fires: finish_reason "stop", stop_reason set, fewer tokens.
    probe = json.loads(request(c.base + "/v1/completions",
                               {"model": MODEL, "prompt": short, "max_tokens": 8, "temperature": 0,
                                "ignore_eos": True})[2])["choices"][0]["text"]
    stop = probe[len(probe) // 2:len(probe) // 2 + 3] or "0"
    c.save("completion-stop.json", "POST", "/v1/completions",
           {"model": MODEL, "prompt": short, "max_tokens": 64, "temperature": 0, "ignore_eos": True,
            "stop": [stop]}, 200, "stop string taken from a greedy probe, so it fires early")

    c.save("error-unknown-model.json", "POST", "/v1/completions",
           {"model": "no-such-model", "prompt": short, "max_tokens": 4}, None)
    c.save("error-prompt-too-long.json", "POST", "/v1/completions",
           {"model": MODEL, "prompt": words(2500, 7), "max_tokens": 4}, None,
           "prompt longer than max_model_len 4096")
    c.save("error-max-tokens-too-large.json", "POST", "/v1/completions",
           {"model": MODEL, "prompt": short, "max_tokens": 5000}, None,
           "prompt + max_tokens exceed max_model_len 4096")
    c.save("error-stream-prompt-too-long.json", "POST", "/v1/chat/completions",
           {"model": MODEL, "messages": [{"role": "user", "content": words(2500, 8)}], "max_tokens": 4,
            "stream": True, "stream_options": {"include_usage": True}}, None,
           "streaming request rejected before the stream starts")
    c.save("error-bad-json.json", "POST", "/v1/completions", {"model": MODEL, "max_tokens": "many"}, None,
           "missing prompt, non-integer max_tokens")

    print("  loading the server for the busy /metrics snapshot...", file=sys.stderr)
    busy, after = loaded_metrics(c.base)
    c.put_metrics("metrics-loaded.txt", busy,
                  "taken while 8 distinct ~2,000-token prompts (max_tokens 96) ran at once")
    c.put_metrics("metrics-after-load.txt", after, "taken right after the load finished")

    # The same long prompt twice: the second send is served from the prefix cache.
    repeat = {"model": MODEL, "prompt": words(850, 9000), "max_tokens": 4, "temperature": 0,
              "ignore_eos": True}
    for _ in range(2):
        status, _, raw = request(c.base + "/v1/completions", repeat)
        if status != 200:
            raise SystemExit(f"prefix-cache request failed: {status} {raw[:200]!r}")
    c.put_metrics("metrics-prefix-hit.txt", request(c.base + "/metrics"),
                  "after one ~2,000-token prompt was sent twice: prefix_cache_hits_total > 0")

    if args.model_dir:
        shutil.copyfile(args.model_dir / "tokenizer.json", args.out / "tiny-llama-tokenizer.json")
        shutil.copyfile(args.model_dir / "headroom-model.json", args.out / "tiny-llama-manifest.json")
        c.index["tiny-llama-tokenizer.json"] = {"note": "the tokenizer of the model these fixtures came from"}
        c.index["tiny-llama-manifest.json"] = {"note": "that model's build manifest (make-tiny-model.py)"}

    (args.out / "index.json").write_text(json.dumps(c.index, indent=2, sort_keys=True) + "\n")
    print(f"wrote {len(c.index)} fixtures and index.json", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
