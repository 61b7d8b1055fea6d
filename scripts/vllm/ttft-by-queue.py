#!/usr/bin/env python3
"""TTFT forecast against measured TTFT, by the queue the chosen replica had at decision time.

Reads the decision records `scripts/vllm/side-by-side.sh` saves (`decisions-*.json`, from
`/debug/decisions`; gzipped copies too) in one or more directories, pairs each request's forecast
for the replica it went to with the TTFT the router measured there, and prints:

- per bucket of that replica's oldest queued stream's age (`load.queue_age_s`: the oldest
  request this node placed there that has no first token yet) the number of labels, the
  medians of measured TTFT, forecast and age, the share within the forecast's p90 bound,
  and the median log error (log measured/forecast; > 0 is a forecast too low);
- the mean and median |log error| of the forecast alone and of `forecast + b * age` for a
  few `b`: how much of the error the age the router already sees would explain;
- where the records carry the forecast's terms (`ttft_terms_ms`), per bucket of the
  admission-wait term the wait the engine actually imposed, inferred as measured TTFT
  minus the forecast's other terms: whether that term is too low or too high.

Usage: scripts/vllm/ttft-by-queue.py DIR [DIR ...]
"""

import glob
import gzip
import json
import math
import sys

AGE_BUCKETS_MS = [(0, 1), (1, 200), (200, 500), (500, 1000), (1000, math.inf)]
AGE_WEIGHTS = [0.0, 0.25, 0.5, 0.75, 1.0]
WAIT_BUCKETS_MS = [(0, 0.001), (0.001, 50), (50, 150), (150, 300), (300, 600), (600, 1200),
                   (1200, math.inf)]


def percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def median(xs):
    return percentile(xs, 0.5)


def bucketed(rows, col, edges):
    """(lo, hi, rows whose column `col` lies in [lo, hi)) for each non-empty bucket."""
    for lo, hi in edges:
        sub = [r for r in rows if lo <= r[col] < hi]
        if sub:
            yield lo, hi, sub


def labels(dirs):
    """(forecast ms, bound ms, measured ms, age ms, admission-wait term ms or None) per
    request that has the first four."""
    out = []
    for d in dirs:
        paths = glob.glob(f"{d}/decisions-*.json") + glob.glob(f"{d}/decisions-*.json.gz")
        for path in sorted(paths):
            opener = gzip.open if path.endswith(".gz") else open
            with opener(path, "rt") as f:
                records = json.load(f).get("records", [])
            for r in records:
                m = r.get("measured") or {}
                ttft = m.get("ttft_ms")
                if not ttft:
                    continue
                cands = (r.get("decision") or {}).get("candidates") or []
                chosen = [c for c in cands if c.get("replica") == m.get("replica")]
                if not chosen:
                    continue
                c = chosen[0]
                p = c.get("predicted") or {}
                if not p.get("ttft_ms") or not p.get("ttft_upper_ms"):
                    continue
                age = (c.get("load") or {}).get("queue_age_s", 0.0) * 1e3
                wait = (c.get("ttft_terms_ms") or {}).get("admission_wait")
                out.append((p["ttft_ms"], p["ttft_upper_ms"], ttft, age, wait))
    return out


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    rows = labels(sys.argv[1:])
    if not rows:
        sys.exit("no decision records with a forecast and a measured TTFT")
    print(f"{len(rows)} labels")
    print("| oldest queued age, ms | labels | measured p50 ms | forecast p50 ms | age p50 ms "
          "| within p90 bound | median log err |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for lo, hi, sub in bucketed(rows, 3, AGE_BUCKETS_MS):
        cov = sum(1 for f, u, y, a, _ in sub if y <= u) / len(sub)
        err = median(math.log(y / f) for f, u, y, a, _ in sub)
        print(f"| {lo:g}–{hi:g} | {len(sub)} | {median(r[2] for r in sub):.0f} "
              f"| {median(r[0] for r in sub):.0f} | {median(r[3] for r in sub):.0f} "
              f"| {cov:.2f} | {err:+.2f} |")
    print()
    print("| forecast + b × age | mean abs log err | median abs log err |")
    print("|---|---:|---:|")
    for b in AGE_WEIGHTS:
        e = [abs(math.log((f + b * a) / y)) for f, u, y, a, _ in rows]
        print(f"| b = {b:g} | {sum(e) / len(e):.3f} | {median(e):.3f} |")
    termed = [r for r in rows if r[4] is not None]
    if not termed:
        return
    print()
    print(f"{len(termed)} labels with the forecast's terms")
    print("| admission-wait term, ms | labels | term p50 | imposed p25 | imposed p50 "
          "| imposed p75 | queued age p50 |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for lo, hi, sub in bucketed(termed, 4, WAIT_BUCKETS_MS):
        # What the engine imposed beyond the forecast's other terms.
        imposed = [y - (f - w) for f, u, y, a, w in sub]
        print(f"| {lo:g}–{hi:g} | {len(sub)} | {median(r[4] for r in sub):.0f} "
              f"| {percentile(imposed, 0.25):.0f} | {median(imposed):.0f} "
              f"| {percentile(imposed, 0.75):.0f} | {median(r[3] for r in sub):.0f} |")


if __name__ == "__main__":
    main()
