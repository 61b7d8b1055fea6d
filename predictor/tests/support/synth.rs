//! Synthetic ground truth for tests, benches and the evaluation example: a step-level
//! model of a vLLM-v1-like engine (chunked prefill, FCFS, decode-first token budget, KV
//! admission) with the Llama-3-8B constants of engine-and-traces.md §2.3. It is *not*
//! the predictor's feature map: step costs are piecewise linear in tokens, decode
//! contexts grow, decoders finish and join, later arrivals fill leftover budget, and
//! every step carries lognormal noise — so a fit is an approximation, as in reality.
#![allow(dead_code)]

use headroom_predictor::{Observation, ReplicaKey, Sample};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Exp, LogNormal, Poisson};

/// Step-time constants of one engine (ms).
#[derive(Clone, Copy, Debug)]
pub struct Engine {
    pub t0: f64,
    pub c_req: f64,
    pub w: f64,
    pub t_tok: f64,
    pub n0: f64,
    pub alpha: f64,
    pub beta: f64,
    pub budget: f64,
    /// Multiplies every step (a slowed replica has slow > 1).
    pub slow: f64,
    /// Lognormal σ of each step's time.
    pub step_noise: f64,
    /// Fixed per-request overhead outside the engine (ms).
    pub overhead_ms: f64,
}

impl Engine {
    pub fn h100() -> Self {
        Self {
            t0: 0.6,
            c_req: 0.008,
            w: 5.9,
            t_tok: 0.0214,
            n0: 192.0,
            alpha: 5.0e-5,
            beta: 1.5e-6,
            budget: 8192.0,
            slow: 1.0,
            step_noise: 0.05,
            overhead_ms: 1.5,
        }
    }

    pub fn a100() -> Self {
        Self {
            t0: 0.6,
            c_req: 0.01,
            w: 9.7,
            t_tok: 0.066,
            n0: 128.0,
            alpha: 8.5e-5,
            beta: 2.9e-6,
            budget: 2048.0,
            slow: 1.0,
            step_noise: 0.05,
            overhead_ms: 1.5,
        }
    }

    pub fn slowed(mut self, f: f64) -> Self {
        self.slow = f;
        self
    }

    fn step(&self, rng: &mut ChaCha8Rng, n_reqs: f64, tokens: f64, ctx: f64, pairs: f64) -> f64 {
        let base = self.t0
            + self.c_req * n_reqs
            + self.w
            + self.t_tok * (tokens - self.n0).max(0.0)
            + self.alpha * ctx
            + self.beta * pairs;
        let noise = LogNormal::new(0.0, self.step_noise).map_or(1.0, |d| d.sample(rng));
        base * self.slow * noise
    }
}

/// How loaded the generated situations are.
#[derive(Clone, Copy, Debug)]
pub struct Load {
    /// Queued (pre-first-token) requests ahead: uniform in 0..=max_queue.
    pub max_queue: usize,
    /// Uncached prompt of each queued request: uniform in this range (tokens).
    pub queued_prompt: (f64, f64),
    /// Decoding requests: uniform in 0..=max_decoding.
    pub max_decoding: usize,
    /// Prefill inflow: uniform in 0..max_inflow tokens/s.
    pub max_inflow: f64,
    /// Own prompt: log-uniform in this range.
    pub prompt: (f64, f64),
    /// Mean output length (tokens) of every request.
    pub mean_output: f64,
    /// KV capacity (tokens).
    pub kv_capacity: f64,
}

impl Load {
    pub fn moderate() -> Self {
        Self {
            max_queue: 6,
            queued_prompt: (200.0, 4000.0),
            max_decoding: 64,
            max_inflow: 8000.0,
            prompt: (100.0, 8000.0),
            mean_output: 200.0,
            kv_capacity: 440_000.0,
        }
    }
}

/// One generated situation: what the router sees, plus hidden truth for the simulation.
pub struct Situation {
    pub obs: Observation,
    queued: Vec<(f64, f64)>,
    decoders: Vec<(f64, f64)>,
    own_output: f64,
}

fn loguniform(rng: &mut ChaCha8Rng, lo: f64, hi: f64) -> f64 {
    (lo.ln() + rng.random::<f64>() * (hi.ln() - lo.ln())).exp()
}

pub fn situation(rng: &mut ChaCha8Rng, e: &Engine, l: &Load) -> Situation {
    let prompt = loguniform(rng, l.prompt.0, l.prompt.1).round();
    let cached = if rng.random::<f64>() < 0.5 {
        0.0
    } else {
        (prompt * rng.random::<f64>() * 0.8 / 16.0).floor() * 16.0
    };
    let exp_out = Exp::new(1.0 / l.mean_output).expect("positive mean");
    let nq = rng.random_range(0..=l.max_queue);
    let queued: Vec<(f64, f64)> = (0..nq)
        .map(|_| {
            let u = rng
                .random_range(l.queued_prompt.0..l.queued_prompt.1)
                .round();
            let k = if rng.random::<f64>() < 0.5 {
                0.0
            } else {
                (u * rng.random::<f64>()).round()
            };
            (u, k)
        })
        .collect();
    let nd = rng.random_range(0..=l.max_decoding);
    let decoders: Vec<(f64, f64)> = (0..nd)
        .map(|_| {
            let ctx = rng.random_range(300.0..6000.0f64).round();
            let rem = exp_out.sample(rng).ceil().max(1.0);
            (ctx, rem)
        })
        .collect();
    let inflow = rng.random::<f64>() * l.max_inflow;
    let ctx_dec: f64 = decoders.iter().map(|d| d.0).sum();
    let own_output = (exp_out.sample(rng).ceil()).clamp(2.0, 1024.0);
    let obs = Observation {
        prompt_tokens: prompt,
        cached_tokens: cached,
        expected_output_tokens: l.mean_output,
        queued_prefill_tokens: queued.iter().map(|q| q.0).sum(),
        queued_requests: nq as f64,
        queued_attention_pairs: queued.iter().map(|(u, k)| u * k + 0.5 * u * u).sum(),
        decoding_requests: nd as f64,
        decode_context_tokens: ctx_dec,
        // The router only knows the mean remaining output, not the truth.
        decode_remaining_tokens: nd as f64 * l.mean_output,
        prefill_inflow_tps: inflow,
        kv_usage: ctx_dec / l.kv_capacity,
        kv_capacity_tokens: l.kv_capacity,
        scraped_waiting: nq as f64,
        scraped_running: nd as f64,
        preemption_rate: 0.0,
        metric_age_s: 0.5,
        max_batched_tokens: e.budget,
        // This synthetic engine starts every placement at a step boundary.
        step_residual_ms: 0.0,
    };
    Situation {
        obs,
        queued,
        decoders,
        own_output,
    }
}

/// Simulated TTFT (ms) of the request placed in `s` on engine `e`.
pub fn ttft(rng: &mut ChaCha8Rng, e: &Engine, s: &Situation) -> f64 {
    let o = &s.obs;
    let mut t = 0.0;
    let mut dec: Vec<(f64, f64)> = s.decoders.clone();
    // KV admission: decode-only steps until enough context frees.
    let need = o.decode_context_tokens
        + o.queued_prefill_tokens
        + o.prompt_tokens
        + 0.5 * o.expected_output_tokens;
    let mut deficit = need - o.kv_capacity_tokens;
    while deficit > 0.0 && !dec.is_empty() {
        let n = dec.len() as f64;
        let ctx: f64 = dec.iter().map(|d| d.0).sum();
        t += e.step(rng, n, n, ctx, 0.0);
        for d in dec.iter_mut() {
            d.0 += 1.0;
            d.1 -= 1.0;
        }
        let freed: f64 = dec.iter().filter(|d| d.1 <= 0.0).map(|d| d.0).sum();
        deficit -= freed;
        dec.retain(|d| d.1 > 0.0);
    }
    // FCFS chunked prefill of the queue, then our own prompt.
    let own_u = (o.prompt_tokens - o.cached_tokens).max(1.0);
    let mut work: Vec<(f64, f64)> = s.queued.clone();
    work.push((own_u, o.cached_tokens));
    let mut i = 0;
    let mut done_in_current = 0.0;
    while i < work.len() {
        let n_dec = dec.len() as f64;
        let mut left = (e.budget - n_dec).max(1.0);
        let mut tokens = n_dec;
        let mut pairs = 0.0;
        let mut n_reqs = n_dec;
        let mut finished_own = false;
        while left > 0.0 && i < work.len() {
            let (u, k) = work[i];
            let c = (u - done_in_current).min(left);
            let kk = k + done_in_current;
            pairs += c * kk + 0.5 * c * c;
            tokens += c;
            left -= c;
            n_reqs += 1.0;
            done_in_current += c;
            if done_in_current >= u {
                if i == work.len() - 1 {
                    finished_own = true;
                }
                i += 1;
                done_in_current = 0.0;
            }
        }
        if finished_own && left > 0.0 {
            // Later arrivals fill the leftover budget of our last step.
            let arrived = o.prefill_inflow_tps * (t + 1.0) / 1000.0;
            let co = Poisson::new(arrived.max(1e-9))
                .map_or(0.0, |d| d.sample(rng))
                .min(left);
            tokens += co;
            pairs += 0.5 * co * co;
            n_reqs += (co / 1000.0).ceil();
        }
        let ctx: f64 = dec.iter().map(|d| d.0).sum();
        t += e.step(rng, n_reqs, tokens, ctx, pairs);
        for d in dec.iter_mut() {
            d.0 += 1.0;
            d.1 -= 1.0;
        }
        dec.retain(|d| d.1 > 0.0);
    }
    t + e.overhead_ms
}

/// Simulated TPOT (ms per token) of the request placed in `s` on engine `e`.
pub fn tpot(rng: &mut ChaCha8Rng, e: &Engine, s: &Situation) -> f64 {
    let o = &s.obs;
    let exp_out = Exp::new(1.0 / o.expected_output_tokens.max(1.0)).expect("positive mean");
    let mut dec: Vec<(f64, f64)> = s.decoders.clone();
    // Queued requests finish prefill before us and decode alongside.
    for (u, k) in &s.queued {
        dec.push((u + k, exp_out.sample(rng).ceil().max(1.0)));
    }
    let own_ctx0 = o.prompt_tokens;
    let steps = (s.own_output - 1.0).clamp(1.0, 256.0) as usize;
    let mut pending = 0.0;
    let mut last = 10.0;
    let mut total = 0.0;
    for j in 0..steps {
        pending += Poisson::new((o.prefill_inflow_tps * last / 1000.0).max(1e-9))
            .map_or(0.0, |d| d.sample(rng));
        let n = dec.len() as f64 + 1.0;
        let chunk = pending.min((e.budget - n).max(0.0));
        pending -= chunk;
        let ctx: f64 = dec.iter().map(|d| d.0).sum::<f64>() + own_ctx0 + j as f64;
        let pairs = 0.5 * chunk * chunk;
        let reqs = n + if chunk > 0.0 { 1.0 } else { 0.0 };
        last = e.step(rng, reqs, n + chunk, ctx, pairs);
        total += last;
        for d in dec.iter_mut() {
            d.0 += 1.0;
            d.1 -= 1.0;
        }
        dec.retain(|d| d.1 > 0.0);
        // Prefilled arrivals join the decode batch (≈ one request per 1500 tokens).
        let joins = (chunk / 1500.0).floor() as usize;
        for _ in 0..joins {
            dec.push((1500.0, exp_out.sample(rng).ceil().max(1.0)));
        }
    }
    total / steps as f64
}

/// Multiply by lognormal noise of log-s.d. `sigma` (unpredictable per-request variation).
pub fn noisy(rng: &mut ChaCha8Rng, y: f64, sigma: f64) -> f64 {
    y * LogNormal::new(0.0, sigma).map_or(1.0, |d| d.sample(rng))
}

/// One label of engine `e` under load `l` for `key` at `at_s`: a fresh situation, its
/// simulated TTFT and TPOT, 50 output tokens.
pub fn sample(rng: &mut ChaCha8Rng, e: &Engine, l: &Load, key: ReplicaKey, at_s: f64) -> Sample {
    let s = situation(rng, e, l);
    let ttft_ms = ttft(rng, e, &s);
    let tpot_ms = tpot(rng, e, &s);
    Sample {
        key,
        obs: s.obs,
        at_s,
        ttft_ms: Some(ttft_ms),
        tpot_ms: Some(tpot_ms),
        output_tokens: 50,
        ..Default::default()
    }
}
