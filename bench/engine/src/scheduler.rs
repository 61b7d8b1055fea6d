//! The engine: a vLLM-v1 scheduler over a [`BlockPool`], timed by a [`StepCost`].
//!
//! One `step()` = one vLLM iteration:
//! 1. RUNNING requests in order each get `min(remaining, budget)` tokens (1 for a
//!    decode). When their blocks cannot be allocated the NEWEST running request is
//!    recompute-preempted (it may be the one being scheduled) and goes to the FRONT
//!    of the waiting queue with `num_computed = 0`, its blocks freed to the LRU
//!    with their hashes (so re-admission usually hits them).
//! 2. Only if nothing was preempted: WAITING requests in order while budget is left
//!    and `running < max_num_seqs`. Prefix lookup (full blocks only, leaving at
//!    least one token to compute), admission per [`Admission`], first chunk
//!    `min(uncached, budget)`. A failed admission stops admission for this step.
//! 3. The batch's duration comes from the cost model; the clock advances; requests
//!    whose whole sequence is computed emit a token at the END of the step.
//!
//! Invariants: every running request holds exactly `ceil(tokens scheduled so far /
//! block_size)` blocks; blocks are conserved (`free + held = usable`, checked by
//! [`Engine::check_invariants`]); the same seed and calls give the same events.
//! Cost per step: O(running + newly scheduled blocks), no allocation after warm-up.

use std::collections::VecDeque;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::LogNormal;

use super::block_pool::{BlockPool, KvLog, MixMap};
use super::error::EngineError;
use super::hashing::mix64;
use super::profile::{Admission, Profile};
use super::request_state::{Phase, ReqState};
use super::types::{EngineRequest, EngineStats, Event, FinishReason, StepInfo};

/// A deterministic, cloneable model of one vLLM replica's engine.
#[derive(Clone, Debug)]
pub struct Engine {
    profile: Profile,
    pool: BlockPool,
    reqs: Vec<ReqState>,
    vacant: Vec<u32>,
    index: MixMap<u64, u32>,
    running: Vec<u32>,
    waiting: VecDeque<u32>,
    // Reused per-step buffers.
    batch: Vec<(u32, u32)>,
    hits: Vec<u32>,
    done: Vec<u32>,
    events: Vec<Event>,
    // Clock and knobs.
    now_s: f64,
    slowdown: f64,
    noise: Option<LogNormal<f64>>,
    noise_sigma: f64,
    rng: ChaCha8Rng,
    seed: u64,
    submissions: u64,
    /// Σ over running requests of `growth_reserved()` (0 unless FullSequence).
    growth_reserved: u64,
    stats: EngineStats,
}

fn blocks_for(tokens: u32, bs: u32) -> u32 {
    tokens.div_ceil(bs)
}

impl Engine {
    /// An idle engine for `profile` (validated), with noise off and slowdown 1.
    pub fn new(profile: &Profile, seed: u64) -> Result<Engine, EngineError> {
        profile.validate()?;
        Ok(Engine {
            pool: BlockPool::new(profile.num_gpu_blocks),
            profile: profile.clone(),
            reqs: Vec::new(),
            vacant: Vec::new(),
            index: MixMap::default(),
            running: Vec::new(),
            waiting: VecDeque::new(),
            batch: Vec::new(),
            hits: Vec::new(),
            done: Vec::new(),
            events: Vec::new(),
            now_s: 0.0,
            slowdown: 1.0,
            noise: None,
            noise_sigma: 0.0,
            rng: ChaCha8Rng::seed_from_u64(seed),
            seed,
            submissions: 0,
            growth_reserved: 0,
            stats: EngineStats {
                num_gpu_blocks: profile.num_gpu_blocks,
                block_size: profile.block_size,
                ..EngineStats::default()
            },
        })
    }

    /// Starts logging prefix-cache changes for KV-event publishing (off by default:
    /// the simulator does not pay for it).
    pub fn enable_kv_log(&mut self) {
        self.pool.enable_kv_log();
    }

    /// Moves the prefix-cache changes since the last call into `out`, in order.
    pub fn drain_kv_log(&mut self, out: &mut Vec<KvLog>) {
        self.pool.drain_kv_log(out);
    }

    /// The profile this engine runs.
    pub fn profile(&self) -> &Profile {
        &self.profile
    }

    /// Engine clock in model seconds (advanced by steps and [`Engine::advance_to`]).
    pub fn now_s(&self) -> f64 {
        self.now_s
    }

    /// Moves the clock forward to `t` (time passing with no step, e.g. idle or
    /// stalled). Earlier times are ignored.
    pub fn advance_to(&mut self, t: f64) {
        if t > self.now_s {
            self.now_s = t;
        }
    }

    /// Multiplies every later step duration by `factor` (a fault knob; 1 = normal).
    pub fn set_slowdown(&mut self, factor: f64) -> Result<(), EngineError> {
        if !factor.is_finite() || factor <= 0.0 || factor > 1000.0 {
            return Err(EngineError::InvalidKnob(format!(
                "slowdown {factor} not in (0, 1000]"
            )));
        }
        self.slowdown = factor;
        Ok(())
    }

    /// Current slowdown factor.
    pub fn slowdown(&self) -> f64 {
        self.slowdown
    }

    /// Multiplies each step duration by a seeded lognormal with mean 1 and log-sd
    /// `sigma` (0 turns noise off).
    pub fn set_step_noise(&mut self, sigma: f64) -> Result<(), EngineError> {
        if !sigma.is_finite() || !(0.0..=2.0).contains(&sigma) {
            return Err(EngineError::InvalidKnob(format!(
                "noise sigma {sigma} not in [0, 2]"
            )));
        }
        self.noise_sigma = sigma;
        self.noise = if sigma == 0.0 {
            None
        } else {
            let d = LogNormal::new(-sigma * sigma / 2.0, sigma)
                .map_err(|e| EngineError::InvalidKnob(e.to_string()))?;
            Some(d)
        };
        Ok(())
    }

    /// No request waiting or running.
    /// Leading blocks of `block_hashes` in the prefix cache now: what the engine's
    /// KV events would let a router know exactly.
    pub fn cached_prefix_blocks(&self, block_hashes: &[u64]) -> u32 {
        self.pool.cached_prefix(block_hashes)
    }

    /// Receives a remote prefill's blocks (a KV transfer) into the prefix cache: each
    /// hash not held yet takes a free block, is published and left evictable, so the
    /// request that follows hits it instead of prefilling. Returns how many blocks
    /// were pulled (those already held move nothing).
    pub fn import_blocks(&mut self, block_hashes: &[u64]) -> u32 {
        let mut pulled = 0;
        for &h in block_hashes {
            if self.pool.lookup(h).is_some() {
                continue;
            }
            let Some(b) = self.pool.allocate() else {
                break;
            };
            pulled += u32::from(self.pool.register(b, h));
            self.pool.release(b);
        }
        pulled
    }

    pub fn is_idle(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty()
    }

    /// Whether `id` is queued or running.
    pub fn contains(&self, id: u64) -> bool {
        self.index.contains_key(&id)
    }

    /// Queues a request, stamped as arriving now.
    pub fn submit(&mut self, req: EngineRequest) -> Result<(), EngineError> {
        let now = self.now_s;
        self.submit_at(req, now)
    }

    /// Queues a request that arrived at `arrival_s`. An arrival in the past (during
    /// the step just run) only sets the stamp TTFT is measured from; one in the
    /// future first advances the clock.
    pub fn submit_at(&mut self, req: EngineRequest, arrival_s: f64) -> Result<(), EngineError> {
        let p = &self.profile;
        let bs = p.block_size;
        if req.prompt_tokens == 0 || req.max_output_tokens == 0 {
            return Err(EngineError::InvalidRequest(
                "prompt_tokens and max_output_tokens must be >= 1".into(),
            ));
        }
        let total = u64::from(req.prompt_tokens) + u64::from(req.max_output_tokens);
        if total > u64::from(p.max_model_len) {
            return Err(EngineError::InvalidRequest(format!(
                "prompt ({}) + max_tokens ({}) = {total} exceeds max_model_len {}",
                req.prompt_tokens, req.max_output_tokens, p.max_model_len
            )));
        }
        if req.block_hashes.len() as u64 > u64::from(req.prompt_tokens / bs) {
            return Err(EngineError::InvalidRequest(format!(
                "{} block hashes for a {}-token prompt of {bs}-token blocks",
                req.block_hashes.len(),
                req.prompt_tokens
            )));
        }
        if !arrival_s.is_finite() {
            return Err(EngineError::InvalidRequest(
                "arrival time is not finite".into(),
            ));
        }
        if self.index.contains_key(&req.id) {
            return Err(EngineError::DuplicateId(req.id));
        }
        self.advance_to(arrival_s);
        let slot = match self.vacant.pop() {
            Some(s) => s,
            None => {
                self.reqs.push(ReqState::vacant());
                (self.reqs.len() - 1) as u32
            }
        };
        self.submissions += 1;
        let salt = mix64(self.seed ^ mix64(self.submissions));
        let r = &mut self.reqs[slot as usize];
        let (stop_after, stop_reason) = match req.eos_after {
            Some(n) if n >= 1 && n < req.max_output_tokens => (n, FinishReason::Stop),
            _ => (req.max_output_tokens, FinishReason::Length),
        };
        let reserve_blocks = match self.profile.admission {
            Admission::FullInput => 0,
            Admission::FullSequence => blocks_for(req.prompt_tokens + req.max_output_tokens, bs),
        };
        let mut table = std::mem::take(&mut r.table);
        table.clear();
        *r = ReqState {
            id: req.id,
            phase: Phase::Waiting,
            prompt: req.prompt_tokens,
            max_output: req.max_output_tokens,
            stop_after,
            stop_reason,
            hashes: req.block_hashes,
            salt,
            table,
            reserve_blocks,
            arrival_s,
            last_token_s: arrival_s,
            ..ReqState::vacant()
        };
        self.index.insert(req.id, slot);
        self.waiting.push_back(slot);
        Ok(())
    }

    /// Removes a queued or running request, freeing its blocks. False if unknown.
    pub fn abort(&mut self, id: u64) -> bool {
        let Some(slot) = self.index.get(&id).copied() else {
            return false;
        };
        match self.reqs[slot as usize].phase {
            Phase::Running => {
                self.growth_reserved -= self.reqs[slot as usize].growth_reserved();
                if let Some(pos) = self.running.iter().position(|&s| s == slot) {
                    self.running.remove(pos);
                }
            }
            Phase::Waiting => {
                if let Some(pos) = self.waiting.iter().position(|&s| s == slot) {
                    self.waiting.remove(pos);
                }
            }
            Phase::Vacant => return false,
        }
        self.stats.finished_abort += 1;
        self.release(slot);
        true
    }

    /// Events of the last `step()` (empty after an idle step).
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// Gauges and counters now.
    pub fn stats(&self) -> EngineStats {
        let usable = f64::from(self.pool.usable());
        EngineStats {
            now_s: self.now_s,
            running: self.running.len() as u32,
            waiting: self.waiting.len() as u32,
            kv_cache_usage: 1.0 - f64::from(self.pool.num_free()) / usable,
            free_blocks: self.pool.num_free(),
            cached_blocks: self.pool.num_cached() as u32,
            ..self.stats
        }
    }

    /// Verifies block conservation and per-request block tables; O(blocks + reqs).
    pub fn check_invariants(&self) -> Result<(), String> {
        self.pool.check()?;
        let mut held = vec![0u32; self.pool.usable() as usize + 1];
        for &slot in &self.running {
            for &b in &self.reqs[slot as usize].table {
                held[b as usize] += 1;
            }
        }
        for &slot in &self.waiting {
            if !self.reqs[slot as usize].table.is_empty() {
                return Err(format!("waiting slot {slot} holds blocks"));
            }
        }
        for (b, &n) in held.iter().enumerate().skip(1) {
            if n != self.pool.ref_cnt(b as u32) {
                return Err(format!(
                    "block {b}: held by {n} requests, ref {}",
                    self.pool.ref_cnt(b as u32)
                ));
            }
        }
        let used = held.iter().skip(1).filter(|&&n| n > 0).count() as u32;
        if used + self.pool.num_free() != self.pool.usable() {
            return Err(format!(
                "blocks not conserved: used {used} + free {} != usable {}",
                self.pool.num_free(),
                self.pool.usable()
            ));
        }
        let promised: u64 = self
            .running
            .iter()
            .map(|&s| self.reqs[s as usize].growth_reserved())
            .sum();
        if promised != self.growth_reserved {
            return Err(format!(
                "growth reserve {} != sum {promised}",
                self.growth_reserved
            ));
        }
        if self.index.len() != self.running.len() + self.waiting.len() {
            return Err("index out of sync with queues".into());
        }
        Ok(())
    }

    /// Frees a request's blocks (tail first, so a prefix outlives its suffix in
    /// the LRU, as vLLM does) and vacates its slot.
    fn release(&mut self, slot: u32) {
        let r = &mut self.reqs[slot as usize];
        for &b in r.table.iter().rev() {
            self.pool.release(b);
        }
        r.table.clear();
        r.hashes = Vec::new();
        r.phase = Phase::Vacant;
        let id = r.id;
        self.index.remove(&id);
        self.vacant.push(slot);
    }

    /// Recompute preemption of a running request (already removed from `running`).
    fn preempt(&mut self, slot: u32) {
        let r = &mut self.reqs[slot as usize];
        self.growth_reserved -= r.growth_reserved();
        for &b in r.table.iter().rev() {
            self.pool.release(b);
        }
        r.table.clear();
        r.num_computed = 0;
        r.hashed = 0;
        r.phase = Phase::Waiting;
        let id = r.id;
        self.waiting.push_front(slot);
        self.stats.preemptions += 1;
        self.events.push(Event::Preempted { id });
    }

    /// Runs one iteration; see the module docs. Idle engines return `idle: true`.
    pub fn step(&mut self) -> StepInfo {
        self.events.clear();
        if self.is_idle() {
            return StepInfo {
                idle: true,
                ..StepInfo::default()
            };
        }
        let bs = self.profile.block_size;
        let mut budget = self.profile.max_num_batched_tokens;
        let mut num_preempted = 0u32;
        self.batch.clear();

        // 1. Running requests.
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let slot = self.running[i];
            let r = &self.reqs[slot as usize];
            let num_new = (r.total() - r.num_computed).min(budget);
            let need = blocks_for(r.num_computed + num_new, bs) - r.table.len() as u32;
            let mut self_preempted = false;
            while need > self.pool.num_free() {
                let Some(victim) = self.running.pop() else {
                    break;
                };
                self.preempt(victim);
                num_preempted += 1;
                if victim == slot {
                    self_preempted = true;
                    break;
                }
            }
            if self_preempted {
                break;
            }
            let r = &mut self.reqs[slot as usize];
            self.growth_reserved -= r.growth_reserved();
            for _ in 0..need {
                // Cannot fail: `need <= num_free` was just ensured.
                if let Some(b) = self.pool.allocate() {
                    r.table.push(b);
                }
            }
            self.growth_reserved += r.growth_reserved();
            self.batch.push((slot, num_new));
            budget -= num_new;
            i += 1;
        }

        // 2. Waiting requests, only in a step without preemption.
        if num_preempted == 0 {
            self.admit_waiting(&mut budget);
        }

        // 3. Execute: duration, clock, tokens.
        let duration_s = self.batch_duration_s();
        self.now_s += duration_s;
        self.stats.steps += 1;
        self.stats.busy_s += duration_s;
        let num_reqs = self.batch.len() as u32;
        let mut num_tokens = 0u32;
        for k in 0..self.batch.len() {
            let (slot, n) = self.batch[k];
            num_tokens += n;
            self.advance_request(slot, n);
        }
        if !self.done.is_empty() {
            let reqs = &self.reqs;
            self.running
                .retain(|&s| reqs[s as usize].phase == Phase::Running);
            let done = std::mem::take(&mut self.done);
            for &slot in &done {
                self.release(slot);
            }
            self.done = done;
            self.done.clear();
        }
        StepInfo {
            duration_s,
            num_reqs,
            num_tokens,
            num_preempted,
            idle: false,
        }
    }

    fn admit_waiting(&mut self, budget: &mut u32) {
        let bs = self.profile.block_size;
        let max_seqs = self.profile.max_num_seqs as usize;
        while *budget > 0 && self.running.len() < max_seqs {
            let Some(&slot) = self.waiting.front() else {
                break;
            };
            let r = &self.reqs[slot as usize];
            let total = r.total();
            // Prefix lookup: full blocks only, at least one token left to compute.
            let limit = (r.hashes.len() as u32).min((total - 1) / bs) as usize;
            self.hits.clear();
            let mut evictable = 0u32;
            for &h in &r.hashes[..limit] {
                match self.pool.lookup(h) {
                    Some(b) => {
                        evictable += u32::from(self.pool.ref_cnt(b) == 0);
                        self.hits.push(b);
                    }
                    None => break,
                }
            }
            let n_hit = self.hits.len() as u32;
            // FullInput: the current sequence must fit. FullSequence: prompt + max
            // output must fit beside the growth already promised to running requests.
            let (reserve_tokens, promised) = match self.profile.admission {
                Admission::FullInput => (total, 0),
                Admission::FullSequence => (r.prompt + r.max_output, self.growth_reserved),
            };
            let need = u64::from(blocks_for(reserve_tokens, bs) - n_hit + evictable);
            if need + promised > u64::from(self.pool.num_free()) {
                break;
            }
            let cached = n_hit * bs;
            let num_new = (total - cached).min(*budget);
            let new_blocks = blocks_for(cached + num_new, bs) - n_hit;
            self.waiting.pop_front();
            for &b in &self.hits {
                self.pool.touch(b);
            }
            let r = &mut self.reqs[slot as usize];
            r.table.extend_from_slice(&self.hits);
            for _ in 0..new_blocks {
                if let Some(b) = self.pool.allocate() {
                    r.table.push(b);
                }
            }
            self.growth_reserved += r.growth_reserved();
            r.num_computed = cached;
            r.hashed = n_hit;
            r.phase = Phase::Running;
            if !r.admitted_once {
                r.admitted_once = true;
                r.cached_tokens = cached;
            }
            self.stats.prefix_cache_queries += u64::from(total);
            self.stats.prefix_cache_hits += u64::from(cached);
            self.running.push(slot);
            self.batch.push((slot, num_new));
            *budget -= num_new;
        }
    }

    /// Modelled duration (seconds) of the current batch.
    fn batch_duration_s(&mut self) -> f64 {
        let c = self.profile.cost;
        let mut tokens = 0u64;
        let mut attention = 0.0;
        for &(slot, n) in &self.batch {
            let k = self.reqs[slot as usize].num_computed;
            tokens += u64::from(n);
            attention += c.attention_ms(u64::from(n), u64::from(k));
        }
        let ms = c.t0_ms + c.c_req_ms * self.batch.len() as f64 + c.t_lin_ms(tokens) + attention;
        let noise = match &self.noise {
            Some(d) => self.rng.sample(d),
            None => 1.0,
        };
        ms * self.slowdown * noise / 1000.0
    }

    /// Applies `n` computed tokens to a scheduled request; emits its token if the
    /// whole sequence is now computed.
    fn advance_request(&mut self, slot: u32, n: u32) {
        let bs = self.profile.block_size;
        let now = self.now_s;
        let r = &mut self.reqs[slot as usize];
        r.num_computed += n;
        let full = (r.num_computed / bs) as usize;
        for j in r.hashed as usize..full {
            let h = r.hash_of_block(j);
            if self.pool.register(r.table[j], h) {
                let parent = (j > 0).then(|| r.hash_of_block(j - 1));
                self.pool.log(KvLog::Stored {
                    request: r.id,
                    block: j as u32,
                    hash: h,
                    parent,
                });
            }
        }
        r.hashed = full as u32;
        if r.num_computed < r.total() {
            return; // mid-prefill chunk
        }
        r.generated += 1;
        self.stats.generation_tokens += 1;
        match r.first_token_s {
            None => {
                r.first_token_s = Some(now);
                self.stats.prompt_tokens += u64::from(r.prompt);
                self.events.push(Event::FirstToken {
                    id: r.id,
                    ttft_s: now - r.arrival_s,
                });
            }
            Some(_) => self.events.push(Event::Token {
                id: r.id,
                itl_s: now - r.last_token_s,
            }),
        }
        r.last_token_s = now;
        if r.generated >= r.stop_after {
            match r.stop_reason {
                FinishReason::Stop => self.stats.finished_stop += 1,
                _ => self.stats.finished_length += 1,
            }
            self.events.push(Event::Finished {
                id: r.id,
                reason: r.stop_reason,
                prompt_tokens: r.prompt,
                output_tokens: r.generated,
                cached_tokens: r.cached_tokens,
                e2e_s: now - r.arrival_s,
            });
            self.growth_reserved -= r.growth_reserved();
            r.phase = Phase::Vacant; // leaves `running` in the retain below
            self.done.push(slot);
        }
    }
}
