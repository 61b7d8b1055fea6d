#!/usr/bin/env python3
"""Times a random-weight Llama-3-8B-shaped model's engine steps on one GPU with plain
PyTorch (BF16, SDPA attention, CUDA graphs for the decode shapes as vLLM uses them), to
check the engine model's step-time form (bench/engine/src/profile.rs, `StepCost`):

    T = T0 + T_lin(N) + Σ attention,  T_lin(N) = W + t_tok·max(0, N − N0),
    decode attention α·(k + 1) per request, prefill attention β·(c·k + c²/2)

Measured, each a median of repeated CUDA-event timings:
  lin:     N one-token sequences with no context (T_lin(N) plus a negligible attention)
  decode:  B sequences decoding one token each over k cached tokens (attention α term)
  prefill: one prompt of c tokens from an empty cache (T_lin(c) + β·c²/2)

Writes $OUT/step_time.json (raw timings and least-squares fits of W, t_tok, N0, α, β).
No vLLM (not installed there): this checks the physics of the kernels a real engine
runs, not vLLM's scheduler or its paged-attention kernels.
"""
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

H, LAYERS, QH, KVH, HD, FF, VOCAB = 4096, 32, 32, 8, 128, 14336, 128256
DEV = "cuda"
DT = torch.bfloat16
OUT = os.environ.get("OUT", ".")
T_START = time.time()
BUDGET_S = float(os.environ.get("STEP_TIME_BUDGET_S", "400"))


def log(*a):
    print(f"[{time.time() - T_START:6.1f}s]", *a, flush=True)


class Layer:
    def __init__(self, g):
        s = 0.02

        def w(*shape):
            return (torch.randn(*shape, generator=g, device=DEV, dtype=torch.float32) * s).to(DT)

        self.qkv = w((QH + 2 * KVH) * HD, H)
        self.o = w(H, QH * HD)
        self.gate_up = w(2 * FF, H)
        self.down = w(H, FF)
        self.n1 = torch.ones(H, device=DEV, dtype=DT)
        self.n2 = torch.ones(H, device=DEV, dtype=DT)


def rms(x, w):
    v = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(v + 1e-5)).to(DT) * w


def forward(layers, lm_head, x, attend):
    """x: [T, H] hidden states of T new tokens; attend(i, q, k, v) -> [T, QH*HD]."""
    for i, L in enumerate(layers):
        h = rms(x, L.n1)
        qkv = h @ L.qkv.t()
        q, k, v = qkv.split([QH * HD, KVH * HD, KVH * HD], dim=-1)
        a = attend(i, q, k, v)
        x = x + a @ L.o.t()
        h = rms(x, L.n2)
        gu = h @ L.gate_up.t()
        gt, up = gu.chunk(2, dim=-1)
        x = x + (F.silu(gt) * up) @ L.down.t()
    return x


def timed(fn, reps=15, warm=3):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


def graphed(fn):
    """Captures fn in a CUDA graph (as vLLM runs decode steps) and returns a replayer."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def main():
    torch.manual_seed(0)
    g = torch.Generator(device=DEV)
    g.manual_seed(0)
    log("torch", torch.__version__, torch.cuda.get_device_name(0))
    layers = [Layer(g) for _ in range(LAYERS)]
    lm_head = (torch.randn(VOCAB, H, generator=g, device=DEV, dtype=torch.float32) * 0.02).to(DT)
    res = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "model": "Llama-3-8B shape, random BF16 weights, no RoPE", "lin": [], "decode": [], "prefill": []}

    def logits(x, rows):
        return x[rows] @ lm_head.t()

    # T_lin(N): N sequences of one token, no context (attention over the token itself).
    for n in [1, 8, 32, 64, 128, 192, 256, 384, 512, 1024, 2048, 4096, 8192]:
        x = torch.randn(n, H, device=DEV, dtype=DT)
        rows = torch.arange(n, device=DEV)

        def attend(i, q, k, v):
            return v.view(n, KVH, 1, HD).expand(n, KVH, QH // KVH, HD).reshape(n, QH * HD)

        fn = lambda: logits(forward(layers, lm_head, x, attend), rows)  # noqa: E731
        run = graphed(fn) if n <= 512 else fn
        ms = timed(run)
        res["lin"].append({"tokens": n, "ms": ms})
        log(f"lin N={n}: {ms:.3f} ms")

    # Decode: B sequences, k cached tokens each, one new token each (GQA as 4 queries
    # per KV head over that head's cache: the same arithmetic and KV reads).
    for b, k in [(1, 512), (1, 4096), (1, 16384), (8, 2048), (8, 8192), (32, 1024),
                 (32, 4096), (64, 2048), (128, 1024), (128, 2048), (256, 1024)]:
        if time.time() - T_START > BUDGET_S:
            log("budget reached; stopping decode sweep")
            break
        cache = [(torch.randn(b, KVH, k, HD, device=DEV, dtype=DT),
                  torch.randn(b, KVH, k, HD, device=DEV, dtype=DT)) for _ in range(LAYERS)]
        x = torch.randn(b, H, device=DEV, dtype=DT)
        rows = torch.arange(b, device=DEV)

        def attend(i, q, kk, vv, cache=cache, b=b):
            q = q.view(b, KVH, QH // KVH, HD)
            kc, vc = cache[i]
            o = F.scaled_dot_product_attention(q, kc, vc)
            return o.reshape(b, QH * HD)

        fn = lambda: logits(forward(layers, lm_head, x, attend), rows)  # noqa: E731
        ms = timed(graphed(fn))
        res["decode"].append({"batch": b, "context": k, "ms": ms})
        log(f"decode B={b} k={k}: {ms:.3f} ms")
        del cache
        torch.cuda.empty_cache()

    # Prefill: one prompt of c tokens, causal, from an empty cache.
    for c in [256, 512, 1024, 2048, 4096, 8192, 16384]:
        if time.time() - T_START > BUDGET_S:
            log("budget reached; stopping prefill sweep")
            break
        x = torch.randn(c, H, device=DEV, dtype=DT)
        rows = torch.tensor([c - 1], device=DEV)

        def attend(i, q, kk, vv, c=c):
            q = q.view(1, c, QH, HD).transpose(1, 2)
            kk = kk.view(1, c, KVH, HD).transpose(1, 2).repeat_interleave(QH // KVH, dim=1)
            vv = vv.view(1, c, KVH, HD).transpose(1, 2).repeat_interleave(QH // KVH, dim=1)
            o = F.scaled_dot_product_attention(q, kk, vv, is_causal=True)
            return o.transpose(1, 2).reshape(c, QH * HD)

        fn = lambda: logits(forward(layers, lm_head, x, attend), rows)  # noqa: E731
        ms = timed(fn, reps=7)
        res["prefill"].append({"tokens": c, "ms": ms})
        log(f"prefill c={c}: {ms:.3f} ms")

    res["fit"] = fit(res)
    log("fit", json.dumps(res["fit"]))
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "step_time.json"), "w") as f:
        json.dump(res, f, indent=1)


def lstsq(xs, ys):
    """Least squares y = a + b·x; returns (a, b)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - b * mx, b


def fit(res):
    lin = res["lin"]
    # N0 by the best two-segment fit: flat W below N0, W + t_tok·(N − N0) above.
    best = None
    for n0 in [64, 128, 192, 256, 384, 512]:
        flat = [r["ms"] for r in lin if r["tokens"] <= n0]
        hi = [r for r in lin if r["tokens"] > n0]
        if len(flat) < 2 or len(hi) < 2:
            continue
        w = statistics.median(flat)
        t_tok = sum((r["ms"] - w) * (r["tokens"] - n0) for r in hi) / sum((r["tokens"] - n0) ** 2 for r in hi)
        err = sum((r["ms"] - (w + t_tok * max(0, r["tokens"] - n0))) ** 2 for r in lin)
        if best is None or err < best[0]:
            best = (err, n0, w, t_tok)
    _, n0, w, t_tok = best
    t_lin = lambda n: w + t_tok * max(0, n - n0)  # noqa: E731
    # α: decode time beyond T_lin(B), per KV token read (B·(k+1)).
    dec = res["decode"]
    alpha_pts = [(r["batch"] * (r["context"] + 1), r["ms"] - t_lin(r["batch"])) for r in dec]
    _, alpha = lstsq([p[0] for p in alpha_pts], [p[1] for p in alpha_pts])
    # β: prefill time beyond T_lin(c), per query-key pair (c²/2).
    pre = res["prefill"]
    beta_pts = [(r["tokens"] ** 2 / 2, r["ms"] - t_lin(r["tokens"])) for r in pre]
    _, beta = lstsq([p[0] for p in beta_pts], [p[1] for p in beta_pts])
    return {"w_ms": w, "t_tok_ms": t_tok, "n0_tokens": n0, "alpha_ms": alpha, "beta_ms": beta,
            "decode_residuals_ms": [round(p[1] - alpha * p[0], 3) for p in alpha_pts],
            "prefill_residuals_ms": [round(p[1] - beta * p[0], 3) for p in beta_pts]}


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # report what ran before the failure
        print("FAILED:", repr(e), file=sys.stderr)
        raise
