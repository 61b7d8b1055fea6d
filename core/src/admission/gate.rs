//! The node's admission gate: tenants' buckets, queues, running counts and virtual
//! finish tags behind one lock (held for `O(tenants)` per grant, no I/O under it).
//! See the module docs of [`super`] for the rules and formulas.

use std::{collections::HashMap, sync::Arc};

use parking_lot::Mutex;

use super::{
    Ask, GateConfig, MAX_TENANTS, Over, Poll, Refusal, TenantLimits, bucket::Bucket,
    queue::EdfQueue,
};

/// Shortest wait handed out (s).
const MIN_WAIT_S: f64 = 0.001;
/// Weight of the newest hold time in the decayed mean.
const HOLD_ALPHA: f64 = 0.2;
/// Hold time assumed before any request finished (s).
const PRIOR_HOLD_S: f64 = 1.0;

#[derive(Debug)]
struct Tenant {
    name: String,
    limits: TenantLimits,
    requests: Option<Bucket>,
    tokens: Option<Bucket>,
    running: u32,
    queue: EdfQueue,
    /// Tickets granted a slot and not yet collected (the slot is in `running`).
    granted: Vec<u64>,
    /// Virtual finish tag of its latest start.
    finish: f64,
    hold_s: Option<f64>,
}

impl Tenant {
    fn weight(&self) -> f64 {
        let w = self.limits.weight;
        if w.is_finite() && w > 0.0 { w } else { 1.0 }
    }

    fn active(&self) -> bool {
        self.running > 0 || !self.queue.is_empty()
    }

    fn at_concurrency(&self) -> bool {
        self.limits.max_concurrency > 0 && self.running >= self.limits.max_concurrency
    }

    /// Applies (possibly reloaded) limits; a rate set to 0 drops its bucket.
    fn set_limits(&mut self, l: TenantLimits, now_s: f64) {
        fn rate(b: &mut Option<Bucket>, per_minute: f64, now_s: f64) {
            match b {
                _ if !(per_minute > 0.0 && per_minute.is_finite()) => *b = None,
                Some(b) if b.rate() != per_minute => b.set_rate(per_minute, now_s),
                Some(_) => {}
                None => *b = Some(Bucket::per_minute(per_minute, now_s)),
            }
        }
        rate(&mut self.requests, l.rpm, now_s);
        rate(&mut self.tokens, l.tpm, now_s);
        self.limits = l;
    }
}

#[derive(Debug)]
struct State {
    tenants: Vec<Tenant>,
    by_name: HashMap<String, usize>,
    running: usize,
    queued: usize,
    seq: u64,
    vclock: f64,
    /// The latest time the gate was told (times a release without one).
    now_s: f64,
    capacity: Option<usize>,
    hold_s: Option<f64>,
}

fn decayed(mean: Option<f64>, x: f64) -> Option<f64> {
    Some(mean.map_or(x, |m| m + HOLD_ALPHA * (x - m)))
}

impl State {
    fn tell(&mut self, now_s: f64, capacity: Option<usize>) {
        if now_s.is_finite() {
            self.now_s = self.now_s.max(now_s);
        }
        self.capacity = capacity;
    }

    fn active_weight(&self) -> f64 {
        self.tenants
            .iter()
            .filter(|t| t.active())
            .map(Tenant::weight)
            .sum()
    }

    /// Tenant `i`'s share of the capacity among the active tenants (itself included).
    fn share(&self, i: usize, active_w: f64) -> Option<f64> {
        let t = &self.tenants[i];
        let w = t.weight();
        let total = if t.active() { active_w } else { active_w + w };
        self.capacity
            .map(|c| (c as f64 * w / total.max(f64::MIN_POSITIVE)).floor())
    }

    /// At capacity and tenant `i` running its share or more.
    fn over_share(&self, i: usize, active_w: f64) -> bool {
        match (self.capacity, self.share(i, active_w)) {
            (Some(c), Some(s)) => self.running >= c && f64::from(self.tenants[i].running) >= s,
            _ => false,
        }
    }

    fn may_start(&self, i: usize, active_w: f64) -> bool {
        !self.tenants[i].at_concurrency() && !self.over_share(i, active_w)
    }

    /// Grants slots to waiters while any may start: highest band, then lowest virtual
    /// start, then earliest deadline.
    fn grant_ready(&mut self) {
        loop {
            let active_w = self.active_weight();
            let mut best: Option<(usize, (i32, f64, f64))> = None;
            for i in 0..self.tenants.len() {
                let t = &self.tenants[i];
                let Some((deadline, _)) = t.queue.head() else {
                    continue;
                };
                if !self.may_start(i, active_w) {
                    continue;
                }
                let key = (t.limits.priority, self.vclock.max(t.finish), deadline);
                let better = best.is_none_or(|(_, b)| {
                    key.0 > b.0
                        || (key.0 == b.0
                            && (key.1 < b.1 || (key.1 == b.1 && key.2.total_cmp(&b.2).is_lt())))
                });
                if better {
                    best = Some((i, key));
                }
            }
            let Some((i, (_, start, _))) = best else {
                return;
            };
            let t = &mut self.tenants[i];
            let Some((_, seq)) = t.queue.pop() else {
                return;
            };
            t.granted.push(seq);
            t.running += 1;
            t.finish = start + 1.0 / t.weight();
            self.queued -= 1;
            self.running += 1;
            // Virtual time: the least tag among the backlogged (a start granted out
            // of tag order, to a tenant under its share, must not erase others' credit).
            let least = self
                .tenants
                .iter()
                .filter(|t| !t.queue.is_empty())
                .map(|t| t.finish)
                .fold(f64::INFINITY, f64::min);
            if least.is_finite() {
                self.vclock = self.vclock.max(least);
            }
        }
    }

    fn release(&mut self, i: usize, held_s: Option<f64>) {
        let t = &mut self.tenants[i];
        t.running = t.running.saturating_sub(1);
        self.running = self.running.saturating_sub(1);
        if let Some(h) = held_s.filter(|h| h.is_finite() && *h >= 0.0) {
            t.hold_s = decayed(t.hold_s, h);
            self.hold_s = decayed(self.hold_s, h);
        }
        self.grant_ready();
    }

    fn hold(&self, i: usize) -> f64 {
        self.tenants[i]
            .hold_s
            .or(self.hold_s)
            .unwrap_or(PRIOR_HOLD_S)
    }

    /// Why tenant `i`'s waiter cannot start, as a refusal.
    fn refusal(&self, i: usize, full: Option<&'static str>) -> Refusal {
        let t = &self.tenants[i];
        let active_w = self.active_weight();
        let waiting = t.queue.len() as f64 + 1.0;
        let tenant_wait = self.hold(i) * waiting / f64::from(t.running.max(1));
        if t.at_concurrency() {
            return Refusal {
                over: Over::Tenant,
                reason: "concurrency",
                retry_after_s: tenant_wait,
                message: format!(
                    "Tenant `{}` is at its limit of {} concurrent requests.",
                    t.name, t.limits.max_concurrency
                ),
            };
        }
        if t.running > 0 && (self.over_share(i, active_w) || full.is_some()) {
            let share = self.share(i, active_w).unwrap_or(0.0);
            return Refusal {
                over: Over::Tenant,
                reason: "share",
                retry_after_s: tenant_wait,
                message: format!(
                    "Tenant `{}` is using its fair share of capacity ({} of {} requests).",
                    t.name,
                    t.running,
                    share.max(1.0)
                ),
            };
        }
        let fleet_wait = self.hold_s.unwrap_or(PRIOR_HOLD_S) * (self.queued as f64 + 1.0)
            / self.running.max(1) as f64;
        Refusal {
            over: Over::Fleet,
            reason: full.unwrap_or("capacity"),
            retry_after_s: fleet_wait,
            message: "The fleet is at capacity; try again later.".into(),
        }
    }

    fn tenant(&mut self, name: &str, limits: TenantLimits, now_s: f64) -> Option<usize> {
        if let Some(&i) = self.by_name.get(name) {
            self.tenants[i].set_limits(limits, now_s);
            return Some(i);
        }
        if self.tenants.len() >= MAX_TENANTS {
            return None;
        }
        let mut t = Tenant {
            name: name.to_string(),
            limits,
            requests: None,
            tokens: None,
            running: 0,
            queue: EdfQueue::default(),
            granted: Vec::new(),
            finish: 0.0,
            hold_s: None,
        };
        t.set_limits(limits, now_s);
        self.tenants.push(t);
        self.by_name
            .insert(name.to_string(), self.tenants.len() - 1);
        Some(self.tenants.len() - 1)
    }
}

/// The node's admission gate, shared by its requests.
#[derive(Debug)]
pub struct Gate {
    cfg: GateConfig,
    state: Mutex<State>,
}

/// A tenant's running and waiting requests (for metrics and tests).
#[derive(Clone, Debug, PartialEq)]
pub struct TenantLoad {
    pub tenant: String,
    pub running: u32,
    pub queued: usize,
}

impl Gate {
    pub fn new(cfg: GateConfig) -> Arc<Self> {
        Arc::new(Self {
            cfg,
            state: Mutex::new(State {
                tenants: Vec::new(),
                by_name: HashMap::new(),
                running: 0,
                queued: 0,
                seq: 0,
                vclock: 0.0,
                now_s: 0.0,
                capacity: None,
                hold_s: None,
            }),
        })
    }

    pub fn config(&self) -> GateConfig {
        self.cfg
    }

    /// Each tenant's running and waiting requests now.
    pub fn load(&self) -> Vec<TenantLoad> {
        let s = self.state.lock();
        s.tenants
            .iter()
            .map(|t| TenantLoad {
                tenant: t.name.clone(),
                running: t.running,
                queued: t.queue.len(),
            })
            .collect()
    }

    /// A request arrives: refused at once (rate, full queue) or queued; poll the
    /// ticket (at once, then after each wait) until it starts or is refused.
    pub fn arrive(self: &Arc<Self>, ask: &Ask, now_s: f64) -> Result<Ticket, Refusal> {
        let mut s = self.state.lock();
        s.tell(now_s, self.cfg.capacity(ask.replicas));
        let Some(i) = s.tenant(ask.tenant, ask.limits, now_s) else {
            return Err(Refusal {
                over: Over::Fleet,
                reason: "tenants",
                retry_after_s: 60.0,
                message: format!("The router tracks at most {MAX_TENANTS} tenants."),
            });
        };
        let tokens = f64::from(ask.tokens);
        let t = &mut s.tenants[i];
        let rated =
            |b: &mut Option<Bucket>, n: f64| b.as_mut().map_or(Ok(()), |b| b.check(n, now_s));
        if let Err(w) = rated(&mut t.requests, 1.0) {
            return Err(Refusal {
                over: Over::Tenant,
                reason: "rate_requests",
                retry_after_s: w,
                message: format!(
                    "Tenant `{}` is over its limit of {} requests per minute.",
                    t.name, t.limits.rpm
                ),
            });
        }
        if let Err(w) = rated(&mut t.tokens, tokens) {
            let never = if w.is_finite() {
                ""
            } else {
                " (this request alone exceeds it)"
            };
            return Err(Refusal {
                over: Over::Tenant,
                reason: "rate_tokens",
                retry_after_s: w,
                message: format!(
                    "Tenant `{}` is over its limit of {} tokens per minute{never}.",
                    t.name, t.limits.tpm
                ),
            });
        }
        let seq = s.seq;
        s.seq += 1;
        s.tenants[i].queue.push(ask.deadline_s, seq);
        s.queued += 1;
        s.grant_ready();
        if !s.tenants[i].granted.contains(&seq) {
            let active_w = s.active_weight();
            let w = s.tenants[i].weight();
            let mine = (self.cfg.max_queued as f64 * w / active_w.max(w))
                .ceil()
                .max(1.0);
            let full = if s.queued > self.cfg.max_queued {
                Some("queue_full")
            } else if s.tenants[i].queue.len() as f64 > mine {
                Some("queue_share")
            } else {
                None
            };
            if let Some(why) = full {
                s.tenants[i].queue.remove(ask.deadline_s, seq);
                s.queued -= 1;
                return Err(s.refusal(i, Some(why)));
            }
        }
        let t = &mut s.tenants[i];
        for (b, n) in [(&mut t.requests, 1.0), (&mut t.tokens, tokens)] {
            if let Some(b) = b {
                b.take(n, now_s);
            }
        }
        Ok(Ticket {
            gate: self.clone(),
            tenant: i,
            seq,
            deadline_s: ask.deadline_s,
            replicas: ask.replicas,
            done: false,
            waited: false,
        })
    }
}

/// A request waiting at the gate (or granted and not yet started). Dropping it gives
/// back its place or its slot.
#[derive(Debug)]
pub struct Ticket {
    gate: Arc<Gate>,
    tenant: usize,
    seq: u64,
    deadline_s: f64,
    replicas: usize,
    done: bool,
    waited: bool,
}

impl Ticket {
    /// Whether it has been told to wait at least once.
    pub fn waited(&self) -> bool {
        self.waited
    }

    /// Updates the fleet size the capacity is computed from (replicas come and go).
    pub fn set_replicas(&mut self, replicas: usize) {
        self.replicas = replicas;
    }

    /// Starts, waits or is refused at `now_s`.
    pub fn poll(&mut self, now_s: f64) -> Poll {
        if self.done {
            return Poll::Wait(self.gate.cfg.poll_s.max(MIN_WAIT_S));
        }
        let mut s = self.gate.state.lock();
        s.tell(now_s, self.gate.cfg.capacity(self.replicas));
        s.grant_ready();
        let t = &mut s.tenants[self.tenant];
        if let Some(k) = t.granted.iter().position(|g| *g == self.seq) {
            t.granted.swap_remove(k);
            self.done = true;
            return Poll::Go(Permit {
                gate: self.gate.clone(),
                tenant: self.tenant,
                start_s: now_s,
                waited: self.waited,
                released: false,
            });
        }
        if now_s >= self.deadline_s {
            if t.queue.remove(self.deadline_s, self.seq) {
                s.queued -= 1;
            }
            self.done = true;
            return Poll::Refuse(s.refusal(self.tenant, None));
        }
        self.waited = true;
        let left = self.deadline_s - now_s;
        Poll::Wait(self.gate.cfg.poll_s.min(left).max(MIN_WAIT_S))
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut s = self.gate.state.lock();
        let t = &mut s.tenants[self.tenant];
        if let Some(k) = t.granted.iter().position(|g| *g == self.seq) {
            // Granted but never collected: the slot goes to the next waiter.
            t.granted.swap_remove(k);
            s.release(self.tenant, None);
        } else if t.queue.remove(self.deadline_s, self.seq) {
            s.queued -= 1;
        }
    }
}

/// A running request's slot; released on drop (or by [`Permit::release`] with the
/// time, which also teaches the gate how long requests hold their slots).
#[derive(Debug)]
pub struct Permit {
    gate: Arc<Gate>,
    tenant: usize,
    start_s: f64,
    waited: bool,
    released: bool,
}

impl Permit {
    /// Whether the request waited at the gate before it started.
    pub fn waited(&self) -> bool {
        self.waited
    }

    /// Ends the request at `now_s`.
    pub fn release(mut self, now_s: f64) {
        self.finish(Some(now_s));
    }

    fn finish(&mut self, now_s: Option<f64>) {
        if std::mem::replace(&mut self.released, true) {
            return;
        }
        let mut s = self.gate.state.lock();
        let cap = s.capacity;
        if let Some(n) = now_s {
            s.tell(n, cap);
        }
        let held = s.now_s - self.start_s;
        s.release(self.tenant, Some(held));
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.finish(None);
    }
}
