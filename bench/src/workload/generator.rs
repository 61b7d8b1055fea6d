//! Synthetic workloads, deterministic for a seed.
//!
//! A workload is one or more [`Stream`]s, each an arrival process over a time window
//! and a mix of [`TenantSpec`]s. Each stream draws its arrivals and its contents from
//! two separate ChaCha8 streams of the seed, so changing a length distribution leaves
//! the arrival times unchanged (and the other way round).
//!
//! Prefix structure: a tenant has `system_prompts` shared prompts of
//! `system_prompt_blocks` whole blocks each; a request starts with one of them (picked
//! Zipf-like, prompt k with weight 1/(k+1), as a few prompts dominate in practice)
//! followed by its own unique blocks, so hash ids repeat within a tenant and never
//! across tenants. Every request's `hash_ids` cover its whole prompt, as the engine
//! model requires.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Exp};

use super::dist::LengthDist;
use super::{Request, Workload};

/// One kind of traffic: its lengths, objectives and shared prompts.
#[derive(Clone, Debug, PartialEq)]
pub struct TenantSpec {
    /// `None` leaves the request without a tenant.
    pub name: Option<String>,
    /// Relative weight of this tenant among its stream's arrivals.
    pub share: f64,
    /// Tokens after the system prompt.
    pub input: LengthDist,
    pub output: LengthDist,
    /// Objectives to stamp on requests; `None` leaves them to an `SloRule`.
    pub slo_ttft_ms: Option<f64>,
    pub slo_tpot_ms: Option<f64>,
    pub system_prompts: u32,
    pub system_prompt_blocks: u32,
}

impl TenantSpec {
    /// Interactive chat: short prompts behind one of 8 one-block system prompts,
    /// ≈ 200-token answers, TTFT 500 ms and TPOT 50 ms.
    pub fn chat() -> Self {
        TenantSpec {
            name: Some("chat".into()),
            share: 1.0,
            input: LengthDist::lognormal(400.0, 0.8).expect("valid constant"),
            output: LengthDist::lognormal(200.0, 0.7).expect("valid constant"),
            slo_ttft_ms: Some(500.0),
            slo_tpot_ms: Some(50.0),
            system_prompts: 8,
            system_prompt_blocks: 1,
        }
    }

    /// Long-document summarisation: 8k–32k-token prompts behind one shared one-block
    /// instruction, ≈ 300-token summaries, loose objectives (TTFT 10 s, TPOT 200 ms).
    pub fn batch() -> Self {
        TenantSpec {
            name: Some("batch".into()),
            share: 1.0,
            input: LengthDist::uniform(8_192 - 512, 32_768 - 512).expect("valid constant"),
            output: LengthDist::lognormal(300.0, 0.5).expect("valid constant"),
            slo_ttft_ms: Some(10_000.0),
            slo_tpot_ms: Some(200.0),
            system_prompts: 1,
            system_prompt_blocks: 1,
        }
    }

    /// No tenant, no objectives, no shared prompt.
    pub fn plain(input: LengthDist, output: LengthDist) -> Self {
        TenantSpec {
            name: None,
            share: 1.0,
            input,
            output,
            slo_ttft_ms: None,
            slo_tpot_ms: None,
            system_prompts: 0,
            system_prompt_blocks: 0,
        }
    }
}

/// How arrivals are spaced in time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arrivals {
    /// Poisson process at `rate` requests per second.
    Poisson { rate: f64 },
    /// Markov-modulated Poisson process with two states: `rate_on` during bursts of
    /// mean length `mean_on_s`, `rate_off` between them (mean `mean_off_s`); sojourns
    /// are exponential; the process starts in the off state. Long-run mean rate is
    /// `(rate_on·mean_on + rate_off·mean_off) / (mean_on + mean_off)`.
    OnOff {
        rate_on: f64,
        rate_off: f64,
        mean_on_s: f64,
        mean_off_s: f64,
    },
}

impl Arrivals {
    pub fn mean_rate(&self) -> f64 {
        match *self {
            Arrivals::Poisson { rate } => rate,
            Arrivals::OnOff {
                rate_on,
                rate_off,
                mean_on_s,
                mean_off_s,
            } => (rate_on * mean_on_s + rate_off * mean_off_s) / (mean_on_s + mean_off_s),
        }
    }

    /// Arrival times in `[start_s, end_s)`; none for non-positive or non-finite
    /// parameters; at most [`MAX_REQUESTS`].
    fn times(&self, start_s: f64, end_s: f64, rng: &mut ChaCha8Rng) -> Vec<f64> {
        let mut out = Vec::new();
        match *self {
            Arrivals::Poisson { rate } => poisson_in(rate, start_s, end_s, rng, &mut out),
            Arrivals::OnOff {
                rate_on,
                rate_off,
                mean_on_s,
                mean_off_s,
            } => {
                let sojourn = |mean: f64| {
                    (mean.is_finite() && mean > 0.0)
                        .then(|| Exp::new(1.0 / mean).ok())
                        .flatten()
                };
                let (Some(on_len), Some(off_len)) = (sojourn(mean_on_s), sojourn(mean_off_s))
                else {
                    return out;
                };
                let mut t = start_s;
                let mut on = false;
                while t < end_s && out.len() < MAX_REQUESTS {
                    let len = if on {
                        on_len.sample(rng)
                    } else {
                        off_len.sample(rng)
                    };
                    let state_end = (t + len).min(end_s);
                    // Memorylessness: the gap that overshoots the state is just dropped.
                    poisson_in(
                        if on { rate_on } else { rate_off },
                        t,
                        state_end,
                        rng,
                        &mut out,
                    );
                    t = state_end;
                    on = !on;
                }
            }
        }
        out.truncate(MAX_REQUESTS);
        out
    }
}

/// Most arrivals one stream generates (a guard against absurd specs).
pub const MAX_REQUESTS: usize = 5_000_000;

fn poisson_in(rate: f64, from: f64, to: f64, rng: &mut ChaCha8Rng, out: &mut Vec<f64>) {
    if !(rate.is_finite() && rate > 0.0) {
        return;
    }
    let Ok(gap) = Exp::new(rate) else { return };
    let mut t = from;
    while out.len() < MAX_REQUESTS {
        t += gap.sample(rng);
        if t >= to {
            break;
        }
        out.push(t);
    }
}

/// Arrivals over a time window, each drawn from one of `tenants` by share.
#[derive(Clone, Debug, PartialEq)]
pub struct Stream {
    pub arrivals: Arrivals,
    pub start_s: f64,
    pub end_s: f64,
    pub tenants: Vec<TenantSpec>,
}

/// Everything needed to generate a workload.
#[derive(Clone, Debug, PartialEq)]
pub struct GenSpec {
    pub name: String,
    pub seed: u64,
    /// Tokens per hash id.
    pub block_tokens: u32,
    pub streams: Vec<Stream>,
}

impl GenSpec {
    pub fn generate(&self) -> Workload {
        let block = self.block_tokens.max(1);
        let mut next_id: u64 = 0;
        let mut requests = Vec::new();
        for (si, stream) in self.streams.iter().enumerate() {
            // Shared prompts get their ids first so they are the same for every request.
            let prompts: Vec<Vec<Vec<u64>>> = stream
                .tenants
                .iter()
                .map(|t| {
                    (0..t.system_prompts)
                        .map(|_| {
                            (0..t.system_prompt_blocks)
                                .map(|_| {
                                    next_id += 1;
                                    next_id
                                })
                                .collect()
                        })
                        .collect()
                })
                .collect();
            let mut arr_rng = ChaCha8Rng::seed_from_u64(self.seed);
            arr_rng.set_stream(2 * si as u64);
            let mut body_rng = ChaCha8Rng::seed_from_u64(self.seed);
            body_rng.set_stream(2 * si as u64 + 1);
            let total_share: f64 = stream.tenants.iter().map(|t| t.share.max(0.0)).sum();
            if total_share <= 0.0 {
                continue;
            }
            for t in stream
                .arrivals
                .times(stream.start_s, stream.end_s, &mut arr_rng)
            {
                let ti = pick_weighted(
                    &mut body_rng,
                    stream.tenants.iter().map(|t| t.share.max(0.0)),
                    total_share,
                );
                let tenant = &stream.tenants[ti];
                let mut hash_ids: Vec<u64> = Vec::new();
                let mut prefix_tokens = 0u32;
                if !prompts[ti].is_empty() {
                    let n = prompts[ti].len();
                    let harmonic: f64 = (1..=n).map(|k| 1.0 / k as f64).sum();
                    let k = pick_weighted(&mut body_rng, (1..=n).map(|k| 1.0 / k as f64), harmonic);
                    hash_ids.extend_from_slice(&prompts[ti][k]);
                    prefix_tokens = tenant.system_prompt_blocks.saturating_mul(block);
                }
                let user = tenant.input.sample(&mut body_rng);
                let output = tenant.output.sample(&mut body_rng);
                for _ in 0..user.div_ceil(block) {
                    next_id += 1;
                    hash_ids.push(next_id);
                }
                requests.push(Request {
                    id: 0,
                    arrival_s: t,
                    input_tokens: prefix_tokens.saturating_add(user),
                    output_tokens: output,
                    hash_ids,
                    block_tokens: block,
                    tenant: tenant.name.clone(),
                    slo_ttft_ms: tenant.slo_ttft_ms,
                    slo_tpot_ms: tenant.slo_tpot_ms,
                });
            }
        }
        // Generated times are absolute (a stream may start late): sort, keep the clock.
        requests.sort_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s));
        for (i, r) in requests.iter_mut().enumerate() {
            r.id = i as u64;
        }
        Workload {
            name: self.name.clone(),
            requests,
        }
    }
}

fn pick_weighted(rng: &mut ChaCha8Rng, weights: impl Iterator<Item = f64>, total: f64) -> usize {
    let mut x = rng.random::<f64>() * total;
    let mut last = 0;
    for (i, w) in weights.enumerate() {
        last = i;
        if x < w {
            return i;
        }
        x -= w;
    }
    last
}

/// Poisson arrivals of one plain tenant over `[0, duration_s)`.
pub fn poisson(rate: f64, duration_s: f64, tenant: TenantSpec, seed: u64) -> GenSpec {
    GenSpec {
        name: format!("poisson-{rate}rps"),
        seed,
        block_tokens: 512,
        streams: vec![Stream {
            arrivals: Arrivals::Poisson { rate },
            start_s: 0.0,
            end_s: duration_s,
            tenants: vec![tenant],
        }],
    }
}

/// On-off (MMPP-2) arrivals of one tenant over `[0, duration_s)`.
pub fn bursty(arrivals: Arrivals, duration_s: f64, tenant: TenantSpec, seed: u64) -> GenSpec {
    GenSpec {
        name: format!("bursty-{:.3}rps", arrivals.mean_rate()),
        seed,
        block_tokens: 512,
        streams: vec![Stream {
            arrivals,
            start_s: 0.0,
            end_s: duration_s,
            tenants: vec![tenant],
        }],
    }
}

/// Poisson arrivals at `rate` split among tenants by their shares.
pub fn mixed(rate: f64, duration_s: f64, tenants: Vec<TenantSpec>, seed: u64) -> GenSpec {
    GenSpec {
        name: format!("mixed-{rate}rps"),
        seed,
        block_tokens: 512,
        streams: vec![Stream {
            arrivals: Arrivals::Poisson { rate },
            start_s: 0.0,
            end_s: duration_s,
            tenants,
        }],
    }
}

/// The incident of the design: steady interactive chat at `chat_rate` over
/// `[0, duration_s)`, and a long-context summarisation batch at `batch_rate` during
/// `[start_s, start_s + length_s)` only.
#[derive(Clone, Debug, PartialEq)]
pub struct Incident {
    pub chat_rate: f64,
    pub batch_rate: f64,
    pub start_s: f64,
    pub length_s: f64,
    pub duration_s: f64,
    pub chat: TenantSpec,
    pub batch: TenantSpec,
    pub seed: u64,
}

impl Default for Incident {
    fn default() -> Self {
        Incident {
            chat_rate: 10.0,
            batch_rate: 1.0,
            start_s: 60.0,
            length_s: 120.0,
            duration_s: 300.0,
            chat: TenantSpec::chat(),
            batch: TenantSpec::batch(),
            seed: 0,
        }
    }
}

impl Incident {
    pub fn spec(&self) -> GenSpec {
        GenSpec {
            name: format!(
                "incident-chat{}rps-batch{}rps-at{}s-for{}s",
                self.chat_rate, self.batch_rate, self.start_s, self.length_s
            ),
            seed: self.seed,
            block_tokens: 512,
            streams: vec![
                Stream {
                    arrivals: Arrivals::Poisson {
                        rate: self.chat_rate,
                    },
                    start_s: 0.0,
                    end_s: self.duration_s,
                    tenants: vec![self.chat.clone()],
                },
                Stream {
                    arrivals: Arrivals::Poisson {
                        rate: self.batch_rate,
                    },
                    start_s: self.start_s,
                    end_s: (self.start_s + self.length_s).min(self.duration_s),
                    tenants: vec![self.batch.clone()],
                },
            ],
        }
    }
}
