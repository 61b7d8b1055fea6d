#!/usr/bin/env python3
"""cal.py DECISIONS.json [skip_first_n]: per replica and regime, TTFT/TPOT coverage of the
chosen candidate's bound, median log error, and fallback counts."""
import json, sys, math, collections, gzip
p = sys.argv[1]
f = gzip.open(p) if p.endswith('.gz') else open(p)
recs = sorted(json.load(f)['records'], key=lambda r: r['at_unix_ms'])
skip = int(sys.argv[2]) if len(sys.argv) > 2 else 0
recs = [r for r in recs[skip:] if r.get('decision')]
fb = collections.Counter((r['decision'].get('fallback') or 'model') for r in recs)
print('decisions', len(recs), dict(fb))
g = collections.defaultdict(list)
for r in recs:
    m = r.get('measured') or {}
    if m.get('status') != 'ok' or not m.get('ttft_ms'): continue
    c = next((c for c in r['decision']['candidates'] if c['replica'] == m['replica']), None)
    if not c: continue
    pr = c['predicted']; ld = c['load']
    q = ld['queued_prefill_tokens']
    reg = 'q0' if q <= 0 and ld['queued_requests'] <= 0 else ('q<1k' if q < 1000 else 'q>=1k')
    fbk = r['decision'].get('fallback') or 'model'
    for key in [(m['replica'], 'all'), (m['replica'], reg)]:
        g[key].append((m['ttft_ms'], pr['ttft_ms'], pr['ttft_upper_ms'], m.get('tpot_ms'), pr['tpot_ms'], pr['tpot_upper_ms'], fbk, bool(m.get('ttft_met') and m.get('tpot_met') is not False)))
def med(xs):
    xs = sorted(xs); n = len(xs)
    return float('nan') if n == 0 else (xs[n//2] if n % 2 else 0.5*(xs[n//2-1]+xs[n//2]))
print(f"{'replica':8} {'regime':6} {'n':>4} {'ttft_cov':>8} {'ttft_mdlog':>10} {'ttft_MdAPE':>10} {'tpot_cov':>8} {'tpot_MdAPE':>10} {'met':>5}")
for key in sorted(g):
    v = g[key]
    cov = sum(a <= u for a, _, u, *_ in v) / len(v)
    mdl = med([math.log(a / p) for a, p, *_ in v])
    mdape = med([abs(a - p) / a for a, p, *_ in v])
    tv = [(t, tp, tu) for *_, t, tp, tu, _, _ in v if t]
    tcov = sum(t <= tu for t, _, tu in tv) / max(1, len(tv))
    tmd = med([abs(t - tp) / t for t, tp, _ in tv])
    met = sum(x[-1] for x in v) / len(v)
    print(f"{key[0]:8} {key[1]:6} {len(v):4} {cov:8.3f} {mdl:10.3f} {mdape:10.3f} {tcov:8.3f} {tmd:10.3f} {met:5.3f}")
