#!/usr/bin/env python3
"""The router's own TTFT bound coverage from its learner journals.

Usage: scripts/vllm/router-coverage.py DIR [SKIP]

DIR holds the journals of an accuracy run (HEADROOM_ROUTER_JOURNAL_DIR: one
`router-PID.jsonl` per seed, one `client-seedN.jsonl` beside each). For each journal
and class, after the first SKIP (default 100) TTFT labels: the share of labels within
the bound the router issued (dispatch -> first token, the part the router forecasts),
the median label/forecast ratio and the median bound/forecast ratio; and from the
client records, the share of the client's TTFTs within the header's bound, with the
amounts by which the misses were over (ms).
"""
import glob
import json
import os
import statistics
import sys


def main():
    d = sys.argv[1]
    skip = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    for f in sorted(glob.glob(os.path.join(d, "router-*.jsonl"))):
        by = {}
        with open(f) as fh:
            for line in fh:
                r = json.loads(line)
                if r.get("kind") != "sample" or r.get("ttft_ms") is None or r.get("censored"):
                    continue
                by.setdefault(r["key"]["class"], []).append(r)
        for c, rs in sorted(by.items()):
            sc = [r for r in rs[skip:] if r.get("issued")]
            if not sc:
                continue
            cov = sum(r["ttft_ms"] <= r["issued"]["ttft_upper_ms"] for r in sc) / len(sc)
            ratio = statistics.median(r["ttft_ms"] / r["issued"]["ttft_ms"] for r in sc)
            width = statistics.median(r["issued"]["ttft_upper_ms"] / r["issued"]["ttft_ms"] for r in sc)
            print(f"{os.path.basename(f)} class {c}: {len(sc)} labels, router-side p90 coverage "
                  f"{cov:.2f}, median label/forecast {ratio:.2f}, median bound/forecast {width:.2f}")
    for f in sorted(glob.glob(os.path.join(d, "client-*.jsonl"))):
        with open(f) as fh:
            rs = [json.loads(line) for line in fh]
        for s in sorted({r["server"] for r in rs}):
            x = [r for r in rs if r["server"] == s][skip:]
            if not x:
                continue
            cov = sum(r["ttft_ms"] <= r["pred_ttft_upper_ms"] for r in x) / len(x)
            over = sorted(round(r["ttft_ms"] - r["pred_ttft_upper_ms"], 1)
                          for r in x if r["ttft_ms"] > r["pred_ttft_upper_ms"])
            print(f"{os.path.basename(f)} server {s}: {len(x)} requests, client-side p90 coverage "
                  f"{cov:.2f}; misses over the bound by (ms): {over}")


if __name__ == "__main__":
    main()
