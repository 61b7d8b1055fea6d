//! The simulation loop.
//!
//! Invariants: events run in (time, insertion) order; every random choice comes from
//! a generator seeded by the config, so a run is a pure function of (workload,
//! config); the router nodes only see what a real router sees — their own bookings,
//! peers' gossiped bookings (late by the gossip delay), scraped metrics (as of the last
//! scrape), and the latencies they measure. Tokens reach a node as a live router gets
//! them: in the chunks each replica's front end ([`Frontend`]: stream interval, API-server
//! cost, steps merged while it is busy) delivers, at the delivery time, so TTFT, ledger
//! progress and TPOT labels come from chunk arrivals, not engine steps. Engines may run
//! constants other than the profile the router is configured with (profile files,
//! `engine_mismatch`); nothing reads the engine model's internals or constants except
//! the `oracle` policy, which exists to bound what is achievable.

use std::{str::FromStr, sync::Arc, time::Instant};

use headroom_core::{
    admission::{Ask, Over, Permit, Poll, Refusal, Ticket},
    blocks,
    decide::{self, Learn, RouteInputs, RoutedTarget},
    ledger::{Booking, Load},
    lifecycle::{self, Admission, Admit, DeferLimits, Finished, Reported},
    pd::{self, PdAdmit, PdInputs, PdPlan},
    policy::{
        self, ExactCached, PolicyName, PolicySettings, RequestProfile, Slo,
        candidates::CandidateParams, features,
    },
    prefix::PrefixIndex,
    scraped::{EngineKind, Scraped},
    view::PeerLoad,
};
use headroom_engine::{
    Chunk, Engine, EngineRequest, Frontend, Profile, block_hashes_for_hash_ids, hashing::mix64,
    tokens_for_hash_ids,
};
use headroom_predictor::{Learner, ModelState, Prediction, ReplicaKey, SharedPredictor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{
    config::SimConfig,
    node::{SimNode, replica_view},
    oracle,
    queue::EventQueue,
    result::{LoadSample, ReplicaInfo, RequestRecord, RunResult},
};
use crate::workload::Workload;

/// Largest number of router prefix blocks hashed per request.
const MAX_ROUTER_BLOCKS: usize = 8192;

/// Engine request ids of prefill stages: request `i`'s is `i | PREFILL_STAGE`, so its
/// chunks are told from the decode stage's (`i`) on their way back.
const PREFILL_STAGE: u64 = 1 << 62;

#[derive(Clone, Copy, Debug)]
enum Ev {
    Arrival(u32),
    /// A deferred request asks again.
    Retry(u32),
    StepEnd(u32),
    /// A replica's front end finishes a service: its chunks reach the router.
    Frontend(u32),
    Scrape(u32),
    Gossip,
    GossipDeliver(u32),
    Publish,
    Federate,
    LoadSample,
    Slowdown(u32),
    /// `cfg.dark[i]` begins (true) or ends (false).
    Dark(u32, bool),
    /// Request `i`'s KV has reached its decode replica: the decode engine starts it.
    DecodeStart(u32),
}

struct SimReplica {
    engine: Engine,
    /// The API server: when the engine's tokens reach the router, and in what chunks.
    frontend: Frontend,
    stepping: bool,
    /// Requests placed here and not finished (ground truth, for load samples).
    inflight: u32,
}

/// A request between placement and completion.
struct Live {
    node: u32,
    replica: u32,
    booking: Booking,
    dispatched_s: f64,
    first_s: Option<f64>,
    last_s: f64,
    tokens: u32,
    learn: Learn,
    fallback: Option<&'static str>,
    /// Its admission slot, released when it finishes.
    permit: Option<Permit>,
    /// When the router placed it (its first stage's dispatch).
    placed_s: f64,
    /// The forecast reported for it (the pair's, end to end, when disaggregated).
    reported: Prediction,
    /// A decode stage learns no TTFT (its first token includes the prefill and the
    /// transfer, which P's model and the link learn).
    ttft_learned: bool,
    /// Disaggregated: the prefill replica, and the link to learn at the first token
    /// (P's key, D's key, tokens moved, D's first-step forecast in s).
    prefill_replica: Option<u32>,
    link: Option<(ReplicaKey, ReplicaKey, u32, f64)>,
}

/// A disaggregated request while its prefill stage runs.
struct Prefilling {
    node: u32,
    plan: PdPlan,
    profile: RequestProfile,
    booking: Booking,
    dispatched_s: f64,
    engine_hashes: Vec<u64>,
    max_tokens: u32,
    permit: Option<Permit>,
}

/// A decode stage waiting for its KV to arrive.
struct DecodeWait {
    replica: u32,
    req: EngineRequest,
}

/// Per-request data computed once at arrival.
struct Prepared {
    /// The node that took the request.
    node: usize,
    profile: RequestProfile,
    /// Its deadline and deferral slot (released when it is placed or refused).
    admission: Admission,
    engine_hashes: Vec<u64>,
    max_tokens: u32,
    /// Its place at the node's admission gate until it starts; then its permit.
    ticket: Option<Ticket>,
    permit: Option<Permit>,
    /// The gate refused it on arrival (`429 share`, `503 capacity`, ...).
    refused: Option<String>,
}

/// A gate refusal as a record's label: the status the proxy answers, and why.
fn admission_label(r: &Refusal) -> String {
    let status = match r.over {
        Over::Tenant => 429,
        Over::Fleet => 503,
    };
    format!("{status} {}", r.reason)
}

/// What the gate said about a request, acted on once its borrow ends.
enum Gated {
    Pass,
    Wait(f64),
    Refuse(String),
}

/// Errors that stop a simulation before it starts.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("fleet: {0}")]
    Fleet(String),
    #[error("unknown policy `{0}`")]
    Policy(String),
    #[error("workload is empty")]
    EmptyWorkload,
}

pub struct Simulator<'w> {
    cfg: SimConfig,
    wl: &'w Workload,
    profiles: Vec<Profile>,
    q: EventQueue<Ev>,
    replicas: Vec<SimReplica>,
    nodes: Vec<SimNode>,
    prepared: Vec<Option<Prepared>>,
    live: Vec<Option<Live>>,
    prefilling: Vec<Option<Prefilling>>,
    decode_wait: Vec<Option<DecodeWait>>,
    records: Vec<RequestRecord>,
    load: Vec<LoadSample>,
    decision_ns: Vec<u32>,
    /// In-flight vectors in transit: (sent at, per node, per replica).
    gossip: Vec<Option<(f64, Vec<Vec<Load>>)>>,
    /// Latest vectors peers have received from each node.
    heard: Vec<Vec<Load>>,
    arrivals_left: usize,
    rng: ChaCha8Rng,
    end_s: f64,
}

/// Every policy the simulator can run, in report order.
pub const ALL_POLICIES: [&str; 10] = [
    "round-robin",
    "least-request",
    "token-load",
    "prefix-affinity",
    "llmd-weighted",
    "sglang-cache-aware",
    "dynamo-kv",
    "llmd-predicted",
    "slo",
    "oracle",
];

fn build_policy(
    name: &str,
    predictor: Arc<SharedPredictor>,
    cfg: &SimConfig,
) -> Result<Box<dyn policy::Policy>, SimError> {
    let settings = PolicySettings {
        slo: cfg.slo.clone(),
        ..PolicySettings::default()
    };
    // The oracle decides in `Simulator::oracle_decide`; its policy object is never asked.
    let p = match name {
        "oracle" => PolicyName::TokenLoad,
        _ => PolicyName::from_str(name).map_err(|_| SimError::Policy(name.to_string()))?,
    };
    Ok(policy::build(p, predictor, &settings))
}

impl<'w> Simulator<'w> {
    pub fn new(wl: &'w Workload, cfg: SimConfig) -> Result<Self, SimError> {
        if wl.requests.is_empty() {
            return Err(SimError::EmptyWorkload);
        }
        // `profiles` are what the router's configuration says (class name, limits);
        // `truth` what each engine really runs (profile files, mismatch).
        let mut profiles = Vec::new();
        let mut truth = Vec::new();
        let fleet_err = |e: headroom_engine::EngineError| SimError::Fleet(e.to_string());
        for g in &cfg.fleet {
            let p = Profile::by_name(&g.profile).map_err(fleet_err)?;
            let file = cfg.engine_files.iter().find(|(c, _)| *c == g.profile);
            let (true_p, noise) = match file {
                Some((_, f)) => {
                    let mut t = f.apply(&g.profile).map_err(fleet_err)?;
                    t.name = g.profile.clone();
                    (t, f.step_noise.unwrap_or(cfg.step_noise))
                }
                None => (p.clone(), cfg.step_noise),
            };
            // The router is configured with the engine's real limits (an operator sets
            // them); only the speed is unknown to it.
            let mut view = p;
            view.max_num_batched_tokens = true_p.max_num_batched_tokens;
            view.max_model_len = true_p.max_model_len;
            for _ in 0..g.count {
                let i = truth.len() as u64;
                let seed = mix64(cfg.seed ^ mix64(0x6d69_736d_6174_6368 ^ i));
                // `!= 0` so that NaN reaches `mismatched` and is refused there.
                let t = if cfg.engine_mismatch != 0.0 {
                    true_p
                        .mismatched(cfg.engine_mismatch, seed)
                        .map_err(fleet_err)?
                } else {
                    true_p.clone()
                };
                truth.push((t, noise));
                profiles.push(view.clone());
            }
        }
        let mut replicas = Vec::new();
        for (i, (p, noise)) in truth.iter().enumerate() {
            let mut engine = Engine::new(p, cfg.seed.wrapping_mul(1000).wrapping_add(i as u64))
                .map_err(fleet_err)?;
            // Always set: 0 turns it off, and a bad value is refused here.
            engine.set_step_noise(*noise).map_err(fleet_err)?;
            replicas.push(SimReplica {
                frontend: Frontend::new(p.stream_interval, p.frontend).map_err(fleet_err)?,
                engine,
                stepping: false,
                inflight: 0,
            });
        }
        let replica_regions = cfg.replica_regions();
        let roles = cfg.replica_roles();
        let mut nodes = Vec::new();
        for n in 0..cfg.routers.max(1) {
            let region = cfg.node_region(n);
            let name = format!("node-{n}");
            let mut learner = Learner::new(cfg.predictor.clone());
            learner.set_node_id(&name);
            let predictor = Arc::new(SharedPredictor::new(learner.snapshot(0.0)));
            let views = profiles
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let role = roles.get(i).copied().unwrap_or_default();
                    let mut v = replica_view(i, p, &cfg.model, role);
                    v.remote_rtt_ms = cfg
                        .regions
                        .remote_rtt_ms(&region, replica_regions.get(i).map(String::as_str));
                    v
                })
                .collect();
            nodes.push(SimNode {
                id: n,
                name,
                region,
                views,
                prefix: PrefixIndex::new(1 << 21),
                policy: build_policy(&cfg.policy, predictor.clone(), &cfg)?,
                predictor,
                learner,
                outputs: Default::default(),
                deferrals: lifecycle::Deferrals::new(),
                gate: headroom_core::admission::Gate::new(cfg.admission),
                rng: ChaCha8Rng::seed_from_u64(cfg.seed ^ (0x5EED_0000 + n as u64)),
                dirty: false,
                links: pd::Links::new(cfg.pd.link_model()),
            });
        }
        let n_req = wl.requests.len();
        let heard = vec![vec![Load::default(); profiles.len()]; nodes.len()];
        Ok(Self {
            rng: ChaCha8Rng::seed_from_u64(cfg.seed),
            cfg,
            wl,
            profiles,
            q: EventQueue::new(),
            replicas,
            nodes,
            prepared: (0..n_req).map(|_| None).collect(),
            live: (0..n_req).map(|_| None).collect(),
            prefilling: (0..n_req).map(|_| None).collect(),
            decode_wait: (0..n_req).map(|_| None).collect(),
            records: Vec::with_capacity(n_req),
            load: Vec::new(),
            decision_ns: Vec::with_capacity(n_req),
            gossip: Vec::new(),
            heard,
            arrivals_left: n_req,
            end_s: 0.0,
        })
    }

    /// Runs to completion: every request served (or rejected).
    pub fn run(mut self) -> RunResult {
        let k = self.cfg.rate_scale.max(1e-9);
        let t0 = self.wl.requests[0].arrival_s;
        for (i, r) in self.wl.requests.iter().enumerate() {
            self.q.push((r.arrival_s - t0) / k, Ev::Arrival(i as u32));
        }
        for n in 0..self.nodes.len() {
            // Nodes scrape at their own phase, as independent processes would.
            let phase = self.rng.random::<f64>() * self.cfg.scrape_interval_s;
            self.q.push(phase, Ev::Scrape(n as u32));
        }
        if self.cfg.mesh && self.nodes.len() > 1 {
            self.q.push(self.cfg.gossip_interval_s, Ev::Gossip);
        }
        self.q.push(self.cfg.publish_interval_s, Ev::Publish);
        if self.cfg.federation_interval_s > 0.0 && self.nodes.len() > 1 {
            self.q.push(self.cfg.federation_interval_s, Ev::Federate);
        }
        self.q.push(0.0, Ev::LoadSample);
        for (i, s) in self.cfg.slowdowns.clone().iter().enumerate() {
            self.q.push(s.at_s, Ev::Slowdown(i as u32));
        }
        for (i, d) in self.cfg.dark.clone().iter().enumerate() {
            self.q.push(d.from_s, Ev::Dark(i as u32, true));
            self.q.push(d.to_s, Ev::Dark(i as u32, false));
        }
        while let Some((t, ev)) = self.q.pop() {
            if self.done() {
                break;
            }
            self.end_s = t;
            match ev {
                Ev::Arrival(i) => self.arrive(i as usize, t),
                Ev::Retry(i) => self.decide(i as usize, t),
                Ev::StepEnd(r) => self.step_end(r as usize, t),
                Ev::Frontend(r) => self.frontend_done(r as usize, t),
                Ev::Scrape(n) => self.scrape(n as usize, t),
                Ev::Gossip => self.gossip_send(t),
                Ev::GossipDeliver(b) => self.gossip_deliver(b as usize),
                Ev::Publish => self.publish(t),
                Ev::Federate => self.federate(t),
                Ev::LoadSample => self.sample_load(t),
                Ev::Dark(i, dark) => self.set_dark(i as usize, dark),
                Ev::DecodeStart(i) => self.decode_start(i as usize, t),
                Ev::Slowdown(i) => {
                    let s = &self.cfg.slowdowns[i as usize];
                    if let Some(r) = self.replicas.get_mut(s.replica as usize) {
                        let _ = r.engine.set_slowdown(s.factor);
                    }
                }
            }
        }
        self.records.sort_by_key(|r| r.id);
        RunResult {
            policy: self.cfg.policy.clone(),
            workload: self.wl.name.clone(),
            rate_scale: self.cfg.rate_scale,
            seed: self.cfg.seed,
            routers: self.nodes.len() as u32,
            replicas: self
                .profiles
                .iter()
                .enumerate()
                .map(|(i, p)| ReplicaInfo {
                    name: format!("r{i}-{}", p.name),
                    profile: p.name.clone(),
                })
                .collect(),
            records: self.records,
            load: self.load,
            decision_ns: self.decision_ns,
            sim_duration_s: self.end_s,
        }
    }

    fn done(&self) -> bool {
        self.arrivals_left == 0
            && self.live.iter().all(Option::is_none)
            && self.prefilling.iter().all(Option::is_none)
            && self.records.len() >= self.wl.requests.len()
    }

    /// Request `i`'s arrival on the simulated time axis.
    fn arrival_s(&self, i: usize) -> f64 {
        (self.wl.requests[i].arrival_s - self.wl.requests[0].arrival_s)
            / self.cfg.rate_scale.max(1e-9)
    }

    fn prepare(&self, i: usize, node: usize) -> Option<Prepared> {
        let r = &self.wl.requests[i];
        let block = self.profiles[0].block_size as usize;
        let (engine_hashes, router_blocks) = if r.hash_ids.is_empty() {
            (Vec::new(), Vec::new())
        } else {
            let bt = r.block_tokens.max(1);
            let eh = block_hashes_for_hash_ids(&r.hash_ids, r.input_tokens, bt, block, 0).ok()?;
            let toks = tokens_for_hash_ids(&r.hash_ids, r.input_tokens, bt).ok()?;
            let shape =
                blocks::shape_of_ids(&toks, self.cfg.block_tokens as usize, MAX_ROUTER_BLOCKS);
            (eh, shape.blocks)
        };
        let min_ctx = self
            .profiles
            .iter()
            .map(|p| p.max_model_len)
            .max()
            .unwrap_or(0);
        let room = min_ctx.saturating_sub(r.input_tokens);
        let want = ((r.output_tokens as f64 * self.cfg.max_tokens_factor) as u32)
            .max(self.cfg.max_tokens_min);
        let max_tokens = want.min(room).max(r.output_tokens.min(room)).max(1);
        let n = &self.nodes[node];
        let profile = RequestProfile {
            model: self.cfg.model.clone(),
            prompt_tokens: r.input_tokens,
            blocks: router_blocks,
            max_tokens: Some(max_tokens),
            expected_output_tokens: n.outputs.estimate(&self.cfg.model, Some(max_tokens), false),
            slo: Slo {
                ttft_ms: r.slo_ttft_ms.unwrap_or(self.cfg.default_slo_ttft_ms),
                tpot_ms: r.slo_tpot_ms.unwrap_or(self.cfg.default_slo_tpot_ms),
            },
            priority: 0,
            fallback: self.cfg.fallback,
            stream: true,
            exact_cached: Vec::new(),
        };
        let limits = DeferLimits {
            budget: self.cfg.slo.defer_budget,
            max_deferred: self.cfg.slo.max_deferred,
            max_wait_s: self.cfg.admission.max_wait_s,
        };
        let arrived_s = self.arrival_s(i);
        let admission = Admission::new(&profile, arrived_s, limits, n.deferrals.clone());
        let tenant = r.tenant.as_deref().unwrap_or("default");
        let ask = Ask {
            tenant,
            limits: self
                .cfg
                .tenant_limits
                .iter()
                .find(|(name, _)| name == tenant)
                .map(|(_, l)| *l)
                .unwrap_or_default(),
            tokens: profile
                .prompt_tokens
                .saturating_add(profile.expected_output_tokens),
            deadline_s: limits.deadline_s(&profile, arrived_s),
            replicas: n.views.len(),
        };
        let (ticket, refused) = match n.gate.arrive(&ask, arrived_s) {
            Ok(t) => (Some(t), None),
            Err(r) => (None, Some(admission_label(&r))),
        };
        Some(Prepared {
            node,
            admission,
            profile,
            engine_hashes,
            max_tokens,
            ticket,
            permit: None,
            refused,
        })
    }

    fn arrive(&mut self, i: usize, t: f64) {
        self.arrivals_left -= 1;
        let node = match (&self.wl.requests[i].tenant, self.cfg.pin_tenants) {
            (Some(t), true) => {
                (xxhash_rust::xxh3::xxh3_64(t.as_bytes()) % self.nodes.len() as u64) as usize
            }
            _ => self.rng.random_range(0..self.nodes.len()),
        };
        match self.prepare(i, node) {
            Some(Prepared {
                refused: Some(why), ..
            }) => self.reject(i, node as u32, t, &why),
            Some(p) => {
                self.prepared[i] = Some(p);
                self.decide(i, t);
            }
            None => self.reject(i, node as u32, t, "unservable request"),
        }
    }

    fn reject(&mut self, i: usize, node: u32, _t: f64, why: &str) {
        let r = &self.wl.requests[i];
        self.records.push(RequestRecord {
            id: r.id,
            tenant: r.tenant.clone(),
            arrival_s: r.arrival_s,
            replica: None,
            node,
            input_tokens: r.input_tokens,
            output_tokens: 0,
            slo_ttft_ms: r.slo_ttft_ms.unwrap_or(self.cfg.default_slo_ttft_ms),
            slo_tpot_ms: r.slo_tpot_ms.unwrap_or(self.cfg.default_slo_tpot_ms),
            fallback: Some(why.to_string()),
            rejected: true,
            ..Default::default()
        });
        self.prepared[i] = None;
    }

    /// Routes request `i` at `t` with its node's policy through the request lifecycle
    /// the binary runs (the same defer budget, limit, labels).
    fn decide(&mut self, i: usize, t: f64) {
        // The tenant's turn at the gate first, as `headroom serve` takes it.
        let gated = match self.prepared[i].as_mut() {
            Some(prep) => match prep.ticket.as_mut().map(|tk| tk.poll(t)) {
                Some(Poll::Go(p)) => {
                    prep.permit = Some(p);
                    prep.ticket = None;
                    Gated::Pass
                }
                Some(Poll::Wait(s)) => Gated::Wait(s),
                Some(Poll::Refuse(r)) => Gated::Refuse(admission_label(&r)),
                None => Gated::Pass,
            },
            None => return,
        };
        match gated {
            Gated::Pass => {}
            Gated::Wait(s) => return self.q.push(t + s, Ev::Retry(i as u32)),
            Gated::Refuse(why) => {
                let node = self.prepared[i].as_ref().map_or(0, |p| p.node as u32);
                return self.reject(i, node, t, &why);
            }
        }
        if self.cfg.policy == "oracle" {
            return self.oracle_decide(i, t);
        }
        let Some(prep) = self.prepared[i].as_mut() else {
            return;
        };
        if self.cfg.precise_prefix {
            let bs = self.profiles[0].block_size.max(1);
            let prompt = prep.profile.prompt_tokens;
            let views = &self.nodes[prep.node].views;
            prep.profile.exact_cached = self
                .replicas
                .iter()
                .zip(views.iter())
                .map(|(rep, v)| {
                    let blocks = rep.engine.cached_prefix_blocks(&prep.engine_hashes);
                    ExactCached {
                        replica: v.id,
                        // vLLM's rule: whole blocks, never the prompt's last token.
                        tokens: blocks.min(prompt.saturating_sub(1) / bs) * bs,
                        complete: true,
                    }
                })
                .collect();
        }
        let node_ix = prep.node;
        let node = &mut self.nodes[node_ix];
        let inputs = RouteInputs {
            policy: node.policy.as_ref(),
            predictor: &node.predictor,
            prefix: &node.prefix,
            replicas: node.views.as_slice(),
            params: CandidateParams {
                block_tokens: self.cfg.block_tokens,
                stale_after_s: 2.0,
            },
            max_targets: 1,
        };
        // A fleet with prefill replicas: the (P, D) pair first, as the proxy asks
        // (`proxy::pd::choose`); no plan means the request runs unified.
        if self.cfg.disaggregated() {
            let started = Instant::now();
            let pd_inputs = PdInputs {
                cfg: &self.cfg.pd,
                slo: &self.cfg.slo,
                links: &node.links,
            };
            let planned = pd::plan(&inputs, &pd_inputs, &prep.profile, t, &mut node.rng);
            let ns = started.elapsed().as_nanos().min(u32::MAX as u128) as u32;
            match planned {
                Ok(Some(plan)) => {
                    self.decision_ns.push(ns);
                    match pd::admit(&mut prep.admission, plan, &prep.profile, &self.cfg.slo, t) {
                        PdAdmit::Go(plan) => self.place_pd(i, node_ix, *plan, t),
                        PdAdmit::Wait(after_s) => self.q.push(t + after_s, Ev::Retry(i as u32)),
                        PdAdmit::Reject(no) => self.reject(i, node_ix as u32, t, &no.reason),
                    }
                    return;
                }
                Ok(None) => {}
                Err(e) => {
                    let why = e.to_string();
                    self.reject(i, node_ix as u32, t, &why);
                    return;
                }
            }
        }
        // The TTFT objective left after any deferral (`Admission::remaining`), as the
        // proxy asks it; the tenant's own objectives are restored for what follows.
        let asked = prep.profile.slo;
        prep.profile.slo = prep.admission.remaining(asked, t);
        let routed = decide::route(&inputs, &prep.profile, t, &mut node.rng);
        prep.profile.slo = asked;
        let routed = match routed {
            Ok(r) => r,
            Err(e) => {
                let why = e.to_string();
                self.reject(i, node_ix as u32, t, &why);
                return;
            }
        };
        self.decision_ns
            .push(routed.decision_ns.min(u32::MAX as u64) as u32);
        match prep.admission.admit(routed, t) {
            Admit::Go { targets, fallback } => {
                let Some(target) = targets.into_iter().next() else {
                    self.reject(i, node_ix as u32, t, "no target");
                    return;
                };
                self.place(i, node_ix, target, fallback, t);
            }
            Admit::Wait(after_s) => self.q.push(t + after_s, Ev::Retry(i as u32)),
            Admit::Reject(no) => self.reject(i, node_ix as u32, t, &no.reason),
        }
    }

    /// The oracle's decision: fork every candidate's engine (see `oracle`).
    fn oracle_decide(&mut self, i: usize, t: f64) {
        let Some(prep) = self.prepared[i].as_ref() else {
            return;
        };
        let node_ix = prep.node;
        let node = &self.nodes[node_ix];
        let params = CandidateParams {
            block_tokens: self.cfg.block_tokens,
            stale_after_s: 2.0,
        };
        let started = Instant::now();
        let cands =
            match policy::build_candidates(&prep.profile, &node.views, &node.prefix, params, t) {
                Ok(c) => c,
                Err(e) => {
                    let why = e.to_string();
                    self.reject(i, node_ix as u32, t, &why);
                    return;
                }
            };
        let w = &self.wl.requests[i];
        let forecasts: Vec<Option<(f64, f64)>> = cands
            .iter()
            .map(|c| {
                let req = EngineRequest {
                    id: u64::MAX - 1,
                    prompt_tokens: w.input_tokens,
                    block_hashes: prep.engine_hashes.clone(),
                    max_output_tokens: prep.max_tokens,
                    eos_after: Some(w.output_tokens.max(1)),
                };
                oracle::forecast(&self.replicas[c.index].engine, req, t)
            })
            .collect();
        let order = oracle::choose(
            &forecasts,
            prep.profile.slo.ttft_ms / 1e3,
            prep.profile.slo.tpot_ms / 1e3,
        );
        self.decision_ns
            .push(started.elapsed().as_nanos().min(u32::MAX as u128) as u32);
        let c = &cands[order[0]];
        let key = features::key(c);
        let obs = features::observation(&prep.profile, c);
        let target = RoutedTarget {
            index: c.index,
            cached_tokens: c.cached_tokens,
            learn: Learn {
                key,
                obs,
                prediction: headroom_core::region::with_rtt(
                    node.predictor.load().predict(key, &obs),
                    headroom_core::region::rtt_of(c),
                ),
                rtt_ms: headroom_core::region::rtt_of(c),
            },
        };
        drop(cands);
        self.place(i, node_ix, target, None, t);
    }

    fn place(
        &mut self,
        i: usize,
        node_ix: usize,
        target: RoutedTarget,
        fallback: Option<&'static str>,
        t: f64,
    ) {
        let Some(mut prep) = self.prepared[i].take() else {
            return;
        };
        let permit = prep.permit.take();
        let r = target.index;
        let node = &self.nodes[node_ix];
        let view = &node.views[r];
        let booking = lifecycle::book(view, &prep.profile, &target, t);
        // Simulated engines accept every submission they can hold: the prefix is theirs.
        lifecycle::remember_prefix(
            &node.prefix,
            view,
            &prep.profile,
            &target,
            self.cfg.block_tokens,
        );
        let w = &self.wl.requests[i];
        let req = EngineRequest {
            id: i as u64,
            prompt_tokens: w.input_tokens,
            block_hashes: prep.engine_hashes,
            max_output_tokens: prep.max_tokens,
            eos_after: Some(w.output_tokens.max(1)),
        };
        let rep = &mut self.replicas[r];
        if let Err(e) = rep.engine.submit_at(req, t) {
            drop(booking);
            self.reject(i, node_ix as u32, t, &e.to_string());
            return;
        }
        rep.inflight += 1;
        self.live[i] = Some(Live {
            node: node_ix as u32,
            replica: r as u32,
            booking,
            dispatched_s: t,
            first_s: None,
            last_s: t,
            tokens: 0,
            reported: target.learn.prediction,
            learn: target.learn,
            fallback,
            permit,
            placed_s: t,
            ttft_learned: false,
            prefill_replica: None,
            link: None,
        });
        if !rep.stepping {
            self.start_step(r, t);
        }
    }

    /// Starts a disaggregated request: its prefill stage on the plan's P (one output
    /// token, as `proxy::pd` sends it), booked there until P answers.
    fn place_pd(&mut self, i: usize, node_ix: usize, plan: PdPlan, t: f64) {
        let Some(mut prep) = self.prepared[i].take() else {
            return;
        };
        let Some(p) = plan.prefill.first().cloned() else {
            self.reject(i, node_ix as u32, t, "no prefill target");
            return;
        };
        let node = &self.nodes[node_ix];
        let pre = pd::prefill_profile(&prep.profile);
        let booking = lifecycle::book(&node.views[p.index], &pre, &p, t);
        let w = &self.wl.requests[i];
        let req = EngineRequest {
            id: i as u64 | PREFILL_STAGE,
            prompt_tokens: w.input_tokens,
            block_hashes: prep.engine_hashes.clone(),
            max_output_tokens: 1,
            eos_after: Some(1),
        };
        let rep = &mut self.replicas[p.index];
        if let Err(e) = rep.engine.submit_at(req, t) {
            drop(booking);
            self.reject(i, node_ix as u32, t, &e.to_string());
            return;
        }
        rep.inflight += 1;
        let stepping = rep.stepping;
        self.prefilling[i] = Some(Prefilling {
            node: node_ix as u32,
            plan,
            profile: prep.profile,
            booking,
            dispatched_s: t,
            engine_hashes: prep.engine_hashes,
            max_tokens: prep.max_tokens,
            permit: prep.permit.take(),
        });
        if !stepping {
            self.start_step(p.index, t);
        }
    }

    /// P answered request `i`'s prefill at `t`: P's model learns its TTFT, the index
    /// that P holds the prompt; the decode request goes to D, which pulls the KV over
    /// the link (the blocks it did not hold) and then decodes.
    fn prefill_done(&mut self, i: usize, t: f64) {
        let Some(pf) = self.prefilling[i].take() else {
            return;
        };
        let (Some(p), Some(d)) = (pf.plan.prefill.first(), pf.plan.decode.first()) else {
            return;
        };
        self.replicas[p.index].inflight -= 1;
        let node = &mut self.nodes[pf.node as usize];
        let mut booking = pf.booking;
        booking.first_token(t);
        booking.complete();
        let ttft_ms = (t - pf.dispatched_s) * 1e3 + p.learn.rtt_ms;
        if let Some(s) = lifecycle::first_token_sample(&p.learn, t, ttft_ms, Reported::default()) {
            node.learner.observe(&s);
            node.dirty = true;
        }
        let pre = pd::prefill_profile(&pf.profile);
        lifecycle::remember_prefix(
            &node.prefix,
            &node.views[p.index],
            &pre,
            p,
            self.cfg.block_tokens,
        );
        // D's ledger has the request from now: the router sent it.
        let booking = lifecycle::book(&node.views[d.index], &pf.profile, d, t);
        // D will hold the whole prompt once the transfer lands.
        let whole = RoutedTarget {
            cached_tokens: 0,
            ..d.clone()
        };
        lifecycle::remember_prefix(
            &node.prefix,
            &node.views[d.index],
            &pf.profile,
            &whole,
            self.cfg.block_tokens,
        );
        let w = &self.wl.requests[i];
        let bs = self.profiles[d.index].block_size.max(1);
        let n = pf.engine_hashes.len().min((w.input_tokens / bs) as usize);
        let pulled = self.replicas[d.index]
            .engine
            .import_blocks(&pf.engine_hashes[..n]);
        let arrive_s = t + self.cfg.transfer_s(pulled.saturating_mul(bs));
        let d_pred = d.learn.prediction;
        let step_s = if d_pred.tpot_state == ModelState::Warm {
            d_pred.tpot_ms / 1e3
        } else {
            0.0
        };
        self.replicas[d.index].inflight += 1;
        self.live[i] = Some(Live {
            node: pf.node,
            replica: d.index as u32,
            booking,
            dispatched_s: t,
            first_s: None,
            last_s: t,
            tokens: 0,
            learn: d.learn,
            fallback: pf.plan.fallback,
            permit: pf.permit,
            placed_s: pf.dispatched_s,
            reported: pf.plan.prediction,
            ttft_learned: true,
            prefill_replica: Some(p.index as u32),
            link: Some((p.learn.key, d.learn.key, pf.plan.transfer_tokens, step_s)),
        });
        self.decode_wait[i] = Some(DecodeWait {
            replica: d.index as u32,
            req: EngineRequest {
                id: i as u64,
                prompt_tokens: w.input_tokens,
                block_hashes: pf.engine_hashes,
                max_output_tokens: pf.max_tokens,
                eos_after: Some(w.output_tokens.max(1)),
            },
        });
        self.q.push(arrive_s, Ev::DecodeStart(i as u32));
    }

    /// Request `i`'s KV landed on its decode replica: the engine takes it.
    fn decode_start(&mut self, i: usize, t: f64) {
        let Some(dw) = self.decode_wait[i].take() else {
            return;
        };
        let r = dw.replica as usize;
        let rep = &mut self.replicas[r];
        if let Err(e) = rep.engine.submit_at(dw.req, t) {
            if let Some(l) = self.live[i].take() {
                self.replicas[r].inflight -= 1;
                l.booking.complete();
                if let Some(p) = l.permit {
                    p.release(t);
                }
                let why = e.to_string();
                self.reject(i, l.node, t, &why);
            }
            return;
        }
        if !rep.stepping {
            self.start_step(r, t);
        }
    }

    fn start_step(&mut self, r: usize, t: f64) {
        let rep = &mut self.replicas[r];
        rep.engine.advance_to(t);
        let info = rep.engine.step();
        if info.idle {
            rep.stepping = false;
            return;
        }
        rep.stepping = true;
        let end = rep.engine.now_s();
        self.q.push(end, Ev::StepEnd(r as u32));
    }

    /// A step ended: its tokens go to the replica's front end, which delivers them now
    /// (idle and free), later (a service with a cost), or after the service in progress.
    fn step_end(&mut self, r: usize, t: f64) {
        let rep = &mut self.replicas[r];
        if let Some(end) = rep.frontend.accept(t, rep.engine.events()) {
            self.frontend_at(r, end, t);
        }
        self.replicas[r].stepping = false;
        if !self.replicas[r].engine.is_idle() {
            self.start_step(r, t);
        }
    }

    /// Delivers a service ending at `end` now if it ends now, else at `end`.
    fn frontend_at(&mut self, r: usize, end: f64, t: f64) {
        if end <= t {
            self.frontend_done(r, t);
        } else {
            self.q.push(end, Ev::Frontend(r as u32));
        }
    }

    /// A front-end service ended at `t`: the router sees its chunks.
    fn frontend_done(&mut self, r: usize, t: f64) {
        let (chunks, next) = self.replicas[r].frontend.complete();
        for c in chunks {
            self.deliver(c, t);
        }
        if let Some(end) = next {
            self.frontend_at(r, end, t);
        }
    }

    /// One chunk reaches the router at `t`: what a live router measures TTFT, TPOT and
    /// its ledger's progress from.
    fn deliver(&mut self, c: Chunk, t: f64) {
        if c.id & PREFILL_STAGE != 0 {
            // The prefill stage's one token: P answered.
            if c.finish.is_some() {
                self.prefill_done((c.id & !PREFILL_STAGE) as usize, t);
            }
            return;
        }
        if let Some(l) = self.live[c.id as usize].as_mut() {
            if c.first
                && let Some((p_key, d_key, tokens, step_s)) = l.link.take()
            {
                // The link learns D's first byte less D's first step, as the proxy does.
                let node = &mut self.nodes[l.node as usize];
                node.links.observe(
                    p_key,
                    d_key,
                    tokens,
                    ((t - l.dispatched_s) - step_s).max(0.0),
                );
            }
            if c.first {
                l.first_s = Some(t);
                l.booking.first_token(t);
            }
            if c.first && !l.ttft_learned {
                // As the proxy does: the TTFT label is learned at the first token, not
                // when the stream ends (a long output would delay it by seconds). A
                // remote replica's first token reaches the node one round trip later.
                let ttft_ms = (t - l.dispatched_s) * 1e3 + l.learn.rtt_ms;
                let node = &mut self.nodes[l.node as usize];
                if let Some(s) =
                    lifecycle::first_token_sample(&l.learn, t, ttft_ms, Reported::default())
                {
                    node.learner.observe(&s);
                    node.dirty = true;
                }
            }
            l.last_s = t;
            l.tokens += c.tokens;
            l.booking.generated(c.tokens, t);
        }
        if let Some(f) = c.finish {
            self.finish(c.id as usize, f.output_tokens, f.cached_tokens, t);
        }
    }

    fn finish(&mut self, i: usize, output_tokens: u32, cached_tokens: u32, t: f64) {
        let Some(l) = self.live[i].take() else { return };
        self.replicas[l.replica as usize].inflight -= 1;
        let w = &self.wl.requests[i];
        let arrival = (w.arrival_s - self.wl.requests[0].arrival_s) / self.cfg.rate_scale.max(1e-9);
        // The network's round trip (0 in region): once on the first token and the end;
        // tokens stream at the engine's pace in between.
        let rtt_s = l.learn.rtt_ms / 1e3;
        let ttft_dispatch = l.first_s.map(|f| (f - l.dispatched_s + rtt_s) * 1e3);
        let tpot = match l.first_s {
            Some(f) if output_tokens >= 2 => Some((l.last_s - f) / (output_tokens - 1) as f64),
            _ => None,
        };
        let node = &mut self.nodes[l.node as usize];
        node.outputs.observe(&self.cfg.model, output_tokens);
        // Simulated requests never fail; their engine reports no prompt-token details
        // (vLLM without `--enable-prompt-tokens-details`), so the estimate is learned.
        let finished = Finished {
            ok: true,
            ttft_ms: ttft_dispatch,
            // Learned at the first token already (see `deliver`), or not this
            // stage's to learn (a decode stage).
            ttft_learned: l.first_s.is_some() || l.ttft_learned,
            upstream_ms: (t - l.dispatched_s + rtt_s) * 1e3,
            tpot_ms: tpot.map(|x| x * 1e3),
            output_tokens,
            reported: Reported::default(),
        };
        for s in finished.samples(&l.learn, t) {
            node.learner.observe(&s);
            node.dirty = true;
        }
        l.booking.complete();
        if let Some(p) = l.permit {
            p.release(t);
        }
        // `ttft_s` counts from arrival: the forecast it is scored against adds the time
        // the request already waited at the router (held or deferred), known at dispatch.
        let p = l.reported;
        let waited_ms = (l.placed_s - arrival).max(0.0) * 1e3;
        self.records.push(RequestRecord {
            id: w.id,
            tenant: w.tenant.clone(),
            arrival_s: arrival,
            replica: Some(l.replica),
            node: l.node,
            input_tokens: w.input_tokens,
            output_tokens,
            cached_tokens,
            est_cached_tokens: Some(l.learn.obs.cached_tokens as u32),
            ttft_s: l.first_s.map(|f| f + rtt_s - arrival),
            tpot_s: tpot,
            e2e_s: Some(t + rtt_s - arrival),
            slo_ttft_ms: w.slo_ttft_ms.unwrap_or(self.cfg.default_slo_ttft_ms),
            slo_tpot_ms: w.slo_tpot_ms.unwrap_or(self.cfg.default_slo_tpot_ms),
            predicted_ttft_ms: Some(waited_ms + p.ttft_ms),
            predicted_ttft_upper_ms: Some(waited_ms + p.ttft_upper_ms),
            predicted_tpot_ms: Some(p.tpot_ms),
            predicted_tpot_upper_ms: Some(p.tpot_upper_ms),
            fallback: l.fallback.map(str::to_string),
            rejected: false,
            prefill_replica: l.prefill_replica,
        });
    }

    /// Node `n` reads every replica's metrics, as its scraper would.
    fn scrape(&mut self, n: usize, t: f64) {
        for (r, rep) in self.replicas.iter().enumerate() {
            let s = rep.engine.stats();
            let view = &mut self.nodes[n].views[r];
            let prev = view.scraped.clone();
            let preemptions = s.preemptions as f64;
            let rate = match prev.as_deref() {
                Some(p) if t > p.at_s => (preemptions - p.preemptions).max(0.0) / (t - p.at_s),
                _ => 0.0,
            };
            view.scraped = Some(Arc::new(Scraped {
                at_s: t,
                engine: EngineKind::Vllm,
                running: s.running as f64,
                waiting: s.waiting as f64,
                kv_usage: Some(s.kv_cache_usage),
                num_gpu_blocks: Some(s.num_gpu_blocks),
                block_size: Some(s.block_size),
                prefix_queries: s.prefix_cache_queries as f64,
                prefix_hits: s.prefix_cache_hits as f64,
                preemptions,
                preemption_rate: rate,
                rejected_values: 0,
            }));
        }
        if !self.quiet() {
            self.q
                .push(t + self.cfg.scrape_interval_s, Ev::Scrape(n as u32));
        }
    }

    /// No more work will ever arrive or run: periodic ticks stop rescheduling.
    fn quiet(&self) -> bool {
        self.arrivals_left == 0
            && self.live.iter().all(Option::is_none)
            && self.prefilling.iter().all(Option::is_none)
    }

    fn gossip_send(&mut self, t: f64) {
        let batch: Vec<Vec<Load>> = self.nodes.iter().map(|n| n.own_loads(t)).collect();
        self.gossip.push(Some((t, batch)));
        self.q.push(
            t + self.cfg.gossip_delay_s,
            Ev::GossipDeliver((self.gossip.len() - 1) as u32),
        );
        if !self.quiet() {
            self.q.push(t + self.cfg.gossip_interval_s, Ev::Gossip);
        }
    }

    fn gossip_deliver(&mut self, b: usize) {
        let Some((sent, batch)) = self.gossip.get_mut(b).and_then(Option::take) else {
            return;
        };
        self.heard = batch;
        let n_nodes = self.nodes.len();
        // In-flight vectors travel in a region's own cluster only, as the mesh's do.
        let regions: Vec<String> = self.nodes.iter().map(|n| n.region.clone()).collect();
        for j in 0..n_nodes {
            for r in 0..self.replicas.len() {
                let mut sum = Load::default();
                for k in (0..n_nodes).filter(|&k| k != j && regions[k] == regions[j]) {
                    sum = sum.plus(&self.heard[k][r]);
                }
                self.nodes[j].views[r].peer_load = PeerLoad {
                    load: sum,
                    updated_s: sent,
                };
            }
        }
    }

    fn publish(&mut self, t: f64) {
        for n in &mut self.nodes {
            if n.dirty {
                n.learner.tick(t);
                n.predictor.store(n.learner.snapshot(t));
                n.dirty = false;
            }
        }
        if !self.quiet() {
            self.q.push(t + self.cfg.publish_interval_s, Ev::Publish);
        }
    }

    fn federate(&mut self, t: f64) {
        let slots: Vec<_> = self
            .nodes
            .iter()
            .map(|n| n.learner.export_slot(&n.name, t))
            .collect();
        let regions: Vec<String> = self.nodes.iter().map(|n| n.region.clone()).collect();
        for (j, n) in self.nodes.iter_mut().enumerate() {
            for (k, slot) in slots.iter().enumerate() {
                if k == j {
                    continue;
                }
                // Across regions the class statistics travel, not replica corrections.
                let slot = if regions[k] == regions[j] {
                    slot.clone()
                } else {
                    headroom_core::region::cross_region_slot(slot.clone())
                };
                if n.learner.merge_peer_slot(slot).is_ok() {
                    n.dirty = true;
                }
            }
        }
        if !self.quiet() {
            self.q
                .push(t + self.cfg.federation_interval_s, Ev::Federate);
        }
    }

    /// Region `cfg.dark[i]`'s replicas go down (`dark`) or come back, in every node's
    /// health view at once.
    fn set_dark(&mut self, i: usize, dark: bool) {
        let Some(d) = self.cfg.dark.get(i) else {
            return;
        };
        let regions = self.cfg.replica_regions();
        for n in &mut self.nodes {
            for (v, r) in n.views.iter_mut().zip(&regions) {
                if *r == d.region {
                    v.routable = !dark;
                }
            }
        }
    }

    fn sample_load(&mut self, t: f64) {
        self.load.push(LoadSample {
            t_s: t,
            inflight: self.replicas.iter().map(|r| r.inflight).collect(),
        });
        if !self.quiet() {
            self.q
                .push(t + self.cfg.load_sample_interval_s, Ev::LoadSample);
        }
    }
}

/// Runs one simulation.
pub fn simulate(wl: &Workload, cfg: SimConfig) -> Result<RunResult, SimError> {
    let started = Instant::now();
    let out = Simulator::new(wl, cfg)?.run();
    tracing::debug!(
        "simulated {} requests in {:?}",
        out.records.len(),
        started.elapsed()
    );
    Ok(out)
}
