//! The mesh is partitioned under load by the harness's UDP relay, first 2+1
//! (`{n0, n1} | {n2}`), healed, then 1+1+1 (every node alone), healed again. The
//! nodes' HTTP fronts stay reachable: only gossip and QUIC datagrams are cut.
//!
//! Expected: nothing crashes and no request fails; on each side the nodes across the
//! cut are marked dead and their placements expire (within `DETECT_BOUND_S`); while
//! cut off each node routes on what it sees itself, as an unmeshed node would — every
//! request succeeds and no replica starves (the quality bar we hold it to here); after
//! each heal every node sees all three members live again with fresh placements from
//! each peer within `HEAL_BOUND_S`.

use super::common::{base_plan, share_in};
use crate::check::{self, Check};
use crate::client::EndClass;
use crate::observe::NodeSample;
use crate::relay::NetFaults;
use crate::scenario::{Ctx, Finished, Plan, RunOptions};

pub const ABOUT: &str = "mesh partitioned 2+1 by the UDP relay, healed, partitioned 1+1+1, healed";

/// Bound for each side to mark the nodes across the cut dead and forget their
/// placements (s): chitchat's failure detector plus the 3 s peer TTL, with the margin
/// `router-kill` allows a starved machine (measured ≈ 1 s).
pub const DETECT_BOUND_S: f64 = 20.0;
/// Bound for membership and peers' placements to be whole again after a heal (s).
pub const HEAL_BOUND_S: f64 = 5.0;
/// How long a partition is held after both sides noticed it (s).
const HOLD_S: f64 = 1.5;

/// The partitions, in order: (label, group of each node).
const PARTITIONS: [(&str, [u8; 3]); 2] = [("2+1", [0, 0, 1]), ("1+1+1", [0, 1, 2])];

pub fn plan(o: &RunOptions) -> Plan {
    let mut p = base_plan(o, 3);
    p.cluster.relay = true;
    p.fault_s = 0.2 * o.duration_s;
    p
}

/// Waits until every node marks every node outside its group dead with no fresh
/// placements from it; records the time per node as checks.
pub async fn wait_cut(ctx: &mut Ctx<'_>, label: &str, groups: &[u8], from: f64, bound: f64) {
    let ids: Vec<String> = ctx.cluster.routers.iter().map(|r| r.id.clone()).collect();
    let nodes: Vec<usize> = (0..ids.len()).collect();
    let (g, idv) = (groups.to_vec(), ids.clone());
    let got = ctx
        .wait_all(&nodes, bound, move |s| {
            s.members.is_some()
                && idv.iter().enumerate().all(|(j, id)| {
                    g.get(s.node) == g.get(j)
                        || s.member(id)
                            .is_none_or(|m| !m.live && m.inflight_replicas.is_none())
                })
        })
        .await;
    let took: Vec<Option<f64>> = got.iter().map(|t| t.map(|t| t - from)).collect();
    let worst = took.iter().try_fold(0.0f64, |w, t| t.map(|t| w.max(t)));
    let mut c = check::within(
        &format!(
            "{label}: every node marks the nodes across the cut dead and forgets their placements"
        ),
        "cut seen on every side",
        worst,
        bound,
    );
    c.detail = format!("{} ({})", c.detail, per_node(&ids, &took));
    ctx.log.checks.push(c);
    if let Some(w) = worst {
        ctx.log.numbers.insert(format!("{label}_detect_s"), w);
    }
}

/// Waits until every node sees every member live and holds fresh placements from
/// each peer; records the time per node as a check.
pub async fn wait_whole(ctx: &mut Ctx<'_>, label: &str, from: f64, bound: f64) {
    let ids: Vec<String> = ctx.cluster.routers.iter().map(|r| r.id.clone()).collect();
    let nodes: Vec<usize> = (0..ids.len()).collect();
    let idv = ids.clone();
    let got = ctx
        .wait_all_joint(&nodes, bound, move |s, round| {
            s.live_members().is_some_and(|m| m.len() == idv.len())
                && idv.iter().enumerate().all(|(j, id)| {
                    j == s.node
                        // Heard from again since the cut forgot it — or the peer has
                        // nothing in flight itself (this round's own sample), so there
                        // is nothing to hear: the outbox sends busy replicas only.
                        || s.member(id).is_some_and(|m| m.inflight_replicas.is_some())
                        || round.iter().any(|p| p.node == j && idle(p))
                })
        })
        .await;
    let took: Vec<Option<f64>> = got.iter().map(|t| t.map(|t| (t - from).max(0.0))).collect();
    let worst = took.iter().try_fold(0.0f64, |w, t| t.map(|t| w.max(t)));
    let mut c = check::within(
        &format!("{label}: membership and peers' placements whole again on every node"),
        "converged",
        worst,
        bound,
    );
    c.detail = format!("{} ({})", c.detail, per_node(&ids, &took));
    ctx.log.checks.push(c);
    if let Some(w) = worst {
        ctx.log.numbers.insert(format!("{label}_converge_s"), w);
    }
}

/// How fresh one node's view of its peers was over a window.
#[derive(Debug, Default)]
pub struct Freshness {
    /// Samples in which every peer was live with fresh placements.
    pub fresh: usize,
    /// Samples judged.
    pub judged: usize,
    /// The first few samples that were not fresh: when, and which peer was missing.
    pub stale: Vec<String>,
}

impl Freshness {
    pub fn share(&self) -> f64 {
        self.fresh as f64 / self.judged.max(1) as f64
    }

    /// The stale samples, for a check's detail (empty when none).
    pub fn stale_note(&self) -> String {
        if self.stale.is_empty() {
            String::new()
        } else {
            format!("; not fresh at {}", self.stale.join(", "))
        }
    }
}

/// Stale samples listed in a [`Freshness`].
const STALE_LISTED: usize = 6;
/// How far from a sample the peer's own sample may be to say it had nothing in flight (s).
const IDLE_MATCH_S: f64 = 0.3;

/// Whether a node's own sample shows nothing of its own in flight on any replica.
fn idle(s: &NodeSample) -> bool {
    s.replicas
        .as_ref()
        .is_some_and(|rs| rs.iter().all(|r| r.inflight == 0.0))
}

/// Whether `peer` itself reported nothing in flight on any replica in its sample nearest
/// to `t_s`: then there were no placements to hold, and their absence is not staleness.
fn peer_idle(f: &Finished<'_>, peer: usize, t_s: f64) -> bool {
    f.samples
        .iter()
        .filter(|s| s.node == peer && (s.t_s - t_s).abs() <= IDLE_MATCH_S)
        .min_by(|a, b| (a.t_s - t_s).abs().total_cmp(&(b.t_s - t_s).abs()))
        .is_some_and(idle)
}

/// Per node: in how many of its samples taken in `[from, to)` (and outside `skip`)
/// it saw every peer live with fresh placements. A peer that had nothing in flight
/// itself is not held to having placements seen.
pub fn fresh_samples(
    f: &Finished<'_>,
    node: usize,
    from: f64,
    to: f64,
    skip: Option<(f64, f64)>,
) -> Freshness {
    let mut out = Freshness::default();
    for s in f
        .samples
        .iter()
        .filter(|s| s.node == node && s.members.is_some() && s.t_s >= from && s.t_s < to)
        .filter(|s| skip.is_none_or(|(a, b)| s.t_s < a || s.t_s >= b))
    {
        out.judged += 1;
        let missing: Vec<&str> = f
            .router_ids
            .iter()
            .enumerate()
            .filter(|(j, peer)| {
                *j != node
                    && !s.member(peer).is_some_and(|m| {
                        m.live
                            && (m.inflight_replicas.is_some_and(|k| k > 0)
                                || peer_idle(f, *j, s.t_s))
                    })
            })
            .map(|(_, peer)| peer.as_str())
            .collect();
        if missing.is_empty() {
            out.fresh += 1;
        } else if out.stale.len() < STALE_LISTED {
            out.stale
                .push(format!("{:.2} s (no {})", s.t_s, missing.join(", ")));
        }
    }
    out
}

fn per_node(ids: &[String], took: &[Option<f64>]) -> String {
    ids.iter()
        .zip(took)
        .map(|(id, t)| {
            format!(
                "{id}: {}",
                t.map_or("never".into(), |t| format!("{t:.2} s"))
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

pub async fn inject(ctx: &mut Ctx<'_>) {
    ctx.at(ctx.plan.fault_s).await;
    ctx.log.settle_s = ctx.now_s();
    for (k, (label, groups)) in PARTITIONS.iter().enumerate() {
        let Some(relay) = &ctx.cluster.relay else {
            return ctx.fail("no relay in this cluster");
        };
        let at = ctx.now_s();
        relay.set(NetFaults {
            groups: groups.to_vec(),
            ..NetFaults::default()
        });
        ctx.note(format!("partition {label} {groups:?}"));
        if k == 0 {
            ctx.log.fault_s = Some(at);
        }
        ctx.log.numbers.insert(format!("{label}_start_s"), at);
        wait_cut(ctx, label, groups, at, DETECT_BOUND_S).await;
        ctx.note(format!("{label}: every side noticed"));
        ctx.at(ctx.now_s() + HOLD_S).await;
        let healed = ctx.now_s();
        if let Some(relay) = &ctx.cluster.relay {
            relay.set(NetFaults::default());
        }
        ctx.note(format!("{label} healed"));
        ctx.log.numbers.insert(format!("{label}_heal_s"), healed);
        if k == 0 {
            ctx.log.recover_s = Some(healed);
        }
        wait_whole(ctx, label, healed, HEAL_BOUND_S).await;
        ctx.note(format!("{label}: mesh whole again"));
    }
    if let Some(relay) = &ctx.cluster.relay {
        let c = relay.counts();
        ctx.log
            .numbers
            .insert("relay_forwarded".into(), c.forwarded as f64);
        ctx.log
            .numbers
            .insert("relay_partitioned".into(), c.partitioned as f64);
    }
}

pub fn checks(f: &Finished<'_>) -> Vec<Check> {
    let mut out = Vec::new();
    let dropped = f
        .log
        .numbers
        .get("relay_partitioned")
        .copied()
        .unwrap_or(0.0);
    out.push(Check::new(
        "the relay cut the mesh's datagrams",
        dropped > 0.0,
        format!(
            "{dropped} datagrams dropped across the cuts, {} relayed",
            f.log.numbers.get("relay_forwarded").copied().unwrap_or(0.0)
        ),
    ));
    let names: Vec<String> = (0..f.plan.cluster.replica_profiles.len())
        .map(|i| format!("r{i}"))
        .collect();
    for (label, _) in PARTITIONS {
        let (Some(from), Some(to)) = (
            f.log.numbers.get(&format!("{label}_start_s")),
            f.log.numbers.get(&format!("{label}_heal_s")),
        ) else {
            continue;
        };
        let during: Vec<_> = f
            .records
            .iter()
            .filter(|r| r.sent_s >= *from && r.sent_s < *to)
            .collect();
        let ok = during.iter().filter(|r| r.class == EndClass::Ok).count();
        let ttft: Vec<f64> = during
            .iter()
            .filter_map(|r| Some(r.first_token_s? - r.sent_s))
            .collect();
        let shares: Vec<(usize, usize)> =
            names.iter().map(|n| share_in(f, n, *from, *to)).collect();
        let total = shares.first().map_or(0, |s| s.1);
        let floor = 1.0 / (4.0 * names.len() as f64);
        let starved = shares
            .iter()
            .any(|(on, all)| (*on as f64) < floor * *all as f64);
        out.push(Check::new(
            &format!("{label}: while cut, every request succeeds and no replica starves"),
            !during.is_empty() && ok == during.len() && (total < check::MIN_JUDGED || !starved),
            format!(
                "{ok} of {} requests sent during the partition answered whole; per replica {}; TTFT p50 {} ms, p90 {} ms",
                during.len(),
                names
                    .iter()
                    .zip(&shares)
                    .map(|(n, (on, _))| format!("{n} {on}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                ms(check::quantile(&ttft, 0.5)),
                ms(check::quantile(&ttft, 0.9)),
            ),
        ));
    }
    out
}

fn ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{:.0}", v * 1e3))
}
