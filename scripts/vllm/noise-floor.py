"""The TTFT noise floor a router sees on one real vLLM server (stdlib only).

    python3 scripts/vllm/noise-floor.py URL [N=30] [WORDS=400]

Sends N streamed completions one at a time (0.2 s apart), each a distinct prompt of
WORDS words (no prefix-cache hits; ~2.5 tokens a word with the tiny model's
tokenizer) and 8 output tokens, to a server nothing else is using. Every request is
the same work, so any spread in its TTFT is noise no forecast can remove. Prints, for
the TTFT measured at this client (what a router measures: send -> first token) and
the engine's own (`--enable-per-request-metrics`: arrival at the engine -> first
token), the median, the median |ln(y / median)| (the floor under a forecast's median
|log error|), and the extremes.
"""

import json
import math
import random
import statistics as st
import sys
import time
import urllib.request


def spread(xs):
    xs = [x for x in xs if x]
    m = st.median(xs)
    return m, st.median(abs(math.log(x / m)) for x in xs), min(xs), max(xs)


def main():
    url = sys.argv[1].rstrip("/")
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    words = int(sys.argv[3]) if len(sys.argv) > 3 else 400
    rng = random.Random(7)
    vocab = ("alpha beta gamma delta router replica token prefill decode cache queue "
             "engine latency model server").split()
    rows = []
    for i in range(n):
        prompt = f"{i} " + " ".join(rng.choice(vocab) for _ in range(words))
        body = json.dumps({
            "model": "tiny-llama", "prompt": prompt, "max_tokens": 8, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True},
        }).encode()
        req = urllib.request.Request(url + "/v1/completions", body,
                                     {"content-type": "application/json"})
        t0 = time.perf_counter()
        first, engine, prompt_tokens = None, {}, None
        with urllib.request.urlopen(req, timeout=60) as r:
            for line in r:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                d = json.loads(line[6:])
                if first is None and d.get("choices") and d["choices"][0].get("text"):
                    first = time.perf_counter()
                if d.get("usage"):
                    prompt_tokens = d["usage"].get("prompt_tokens")
                if d.get("metrics"):
                    engine = d["metrics"]
        if first is None:
            sys.exit(f"request {i}: no token streamed")
        rows.append(((first - t0) * 1e3, engine.get("time_to_first_token_ms"), prompt_tokens))
        time.sleep(0.2)
    tokens = st.median(r[2] for r in rows if r[2])
    print(f"{url}: {n} serial requests of {tokens:.0f} prompt tokens")
    for name, col in (("client", 0), ("engine", 1)):
        xs = [r[col] for r in rows]
        if not any(xs):
            print(f"  {name}: not reported (start the server with --enable-per-request-metrics)")
            continue
        m, floor, lo, hi = spread(xs)
        print(f"  {name} TTFT: median {m:.1f} ms, median |ln(y/median)| {floor:.3f}, "
              f"min {lo:.1f}, max {hi:.1f}")


if __name__ == "__main__":
    main()
