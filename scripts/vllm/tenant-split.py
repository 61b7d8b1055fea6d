#!/usr/bin/env python3
"""Where a side-by-side run's misses are: per system, per tenant and per server.

Reads the `run-*.json` records `scripts/vllm/side-by-side.sh` leaves in each OUT directory
(scored requests only: the warm-up is not in them) and `engine_counters.md` beside them,
and prints per system:

- attainment over the scored requests (a refused request is a miss, as in the table of
  `side_by_side.md`);
- per tenant, met / scored, and how many were refused (HTTP 503 from the router: a no-fit
  or standing-queue refusal of a `reject` tenant);
- per tenant and server, met / placed (Headroom's records only: the external routers'
  records say server 0 for every request, so their split is not shown);
- from the engines' counters, each server's preemptions and prompt tokens over the
  replay (vLLM's `prompt_tokens_total`): how the work was split.

With `--buckets S`, also the misses of one tenant (`--tenant`, default `chat`) per S
seconds of arrival, one column per system: whether systems missed in the same bursts.

Usage: scripts/vllm/tenant-split.py [--buckets S] [--tenant NAME] OUT [OUT ...]
"""

import argparse
import collections
import glob
import json
import os


def met(r):
    """Whether a record met both objectives (a refusal or a failure is a miss)."""
    if r.get("rejected") or r.get("ttft_s") is None:
        return False
    if r["ttft_s"] * 1e3 > r["slo_ttft_ms"]:
        return False
    return r.get("tpot_s") is None or r["tpot_s"] * 1e3 <= r["slo_tpot_ms"]


def refused(r):
    return "HTTP 503" in str(r.get("fallback") or "")


def engine_counters(out):
    """System → [(server, preemptions, prompt tokens)] in server order."""
    rows = collections.defaultdict(list)
    path = os.path.join(out, "engine_counters.md")
    if not os.path.exists(path):
        return rows
    for line in open(path):
        f = [x.strip() for x in line.strip().strip("|").split("|")]
        if len(f) >= 5 and f[2].isdigit():
            rows[f[0]].append((f[1], int(f[2]), int(f[3])))
    return rows


def systems(out):
    for path in sorted(glob.glob(os.path.join(out, "run-*.json"))):
        name = os.path.basename(path)[len("run-"):-len(".json")]
        yield name, json.load(open(path))["records"]


def report(out):
    counters = engine_counters(out)
    print(out)
    for name, recs in systems(out):
        c = collections.Counter()
        for r in recs:
            t, ok = r["tenant"], met(r)
            c["all"] += 1
            c["all met"] += ok
            c[t] += 1
            c[t + " met"] += ok
            c[t + " refused"] += refused(r)
            # Refused, or turned away as unservable (HTTP 400/404): never placed.
            if not refused(r) and "HTTP 4" not in str(r.get("fallback") or ""):
                c[(t, r["replica"])] += 1
                c[(t, r["replica"], "met")] += ok
        tenants = sorted({r["tenant"] for r in recs})
        att = 100.0 * c["all met"] / max(c["all"], 1)
        parts = [f"{t} {c[t + ' met']}/{c[t]} (refused {c[t + ' refused']})" for t in tenants]
        print(f"  {name}: {att:.1f}%  " + ", ".join(parts))
        if name.startswith("headroom"):
            servers = sorted({k[1] for k in c if isinstance(k, tuple)})
            split = [
                f"{t}@{s} {c[(t, s, 'met')]}/{c[(t, s)]}" for t in tenants for s in servers
            ]
            print("    placed: " + ", ".join(split))
        # engine_counters.md names a variant with `+`, run files with `-`.
        for label, rows in counters.items():
            if label.replace("+", "-") == name:
                print(
                    "    engines: "
                    + ", ".join(f"server {i}: {p} preemptions, {t // 1000}k prompt tokens"
                                for i, (_, p, t) in enumerate(rows))
                )


def buckets(out, width, tenant):
    cols = {}
    for name, recs in systems(out):
        c = collections.Counter()
        for r in recs:
            if r["tenant"] != tenant:
                continue
            b = int(r["arrival_s"] // width)
            c[(b, "n")] += 1
            c[(b, "miss")] += not met(r)
        cols[name] = c
    if not cols:
        return
    last = max(k[0] for c in cols.values() for k in c)
    first = min(k[0] for c in cols.values() for k in c)
    print(f"  {tenant} misses per {width:g} s of arrival: " + " | ".join(cols))
    for b in range(first, last + 1):
        cells = [f"{c[(b, 'miss')]}/{c[(b, 'n')]}" for c in cols.values()]
        print(f"  {b * width:6.0f} s  " + "  ".join(x.rjust(8) for x in cells))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="+", help="side-by-side.sh OUT directories")
    ap.add_argument("--buckets", type=float, help="seconds per arrival bucket")
    ap.add_argument("--tenant", default="chat")
    a = ap.parse_args()
    for out in a.out:
        report(out)
        if a.buckets:
            buckets(out, a.buckets, a.tenant)


if __name__ == "__main__":
    main()
