//! Clock skew: in a 3-node mesh (behind the UDP relay) n1's wall clock runs 5 s ahead
//! and n2's 5 s behind n0's (`HEADROOM_CLOCK_OFFSET_MS`). Everything the nodes share
//! is stamped with the publisher's wall clock, and peers' placements expire after a
//! 3 s TTL: uncorrected, n2's reports would look 5 s old (discarded on arrival) and
//! n1's from the future.
//!
//! Expected: once the mesh has formed, every node holds fresh placements from each peer
//! that has any (the receivers estimate each peer's skew from its datagrams,
//! `gossip/src/skew.rs`); when
//! n1 is cut off (2+1 partition) its placements still expire on the others, and theirs
//! on it, within the bound; after the heal everything is fresh again. No request fails.
//! (The predictor's federation under skew is covered in `predictor/tests/federation.rs`:
//! forward-decayed statistics merge within 1% of unskewed ones.)

use super::common::base_plan;
use super::net_partition::{DETECT_BOUND_S, HEAL_BOUND_S, fresh_samples, wait_cut, wait_whole};
use crate::check::Check;
use crate::relay::NetFaults;
use crate::scenario::{Ctx, Finished, Plan, RunOptions};

pub const ABOUT: &str =
    "n1's clock 5 s ahead, n2's 5 s behind: placements stay fresh, expire when cut off, return";

/// Clock offsets of n0, n1, n2 (ms).
pub const OFFSETS_MS: [i64; 3] = [0, 5_000, -5_000];
/// The node cut off.
const CUT: usize = 1;
/// Share of samples outside the partition in which a node must hold fresh placements
/// from every peer (a report refreshes every 20 ms–1 s; a sample may race a restart of
/// the vector).
const MIN_FRESH: f64 = 0.9;

pub fn plan(o: &RunOptions) -> Plan {
    let mut p = base_plan(o, 3);
    p.cluster.relay = true;
    p.cluster.clock_offsets_ms = OFFSETS_MS.to_vec();
    p
}

pub async fn inject(ctx: &mut Ctx<'_>) {
    ctx.log.settle_s = 0.0;
    wait_whole(ctx, "skewed clocks", ctx.now_s(), HEAL_BOUND_S).await;
    let formed = ctx.now_s();
    ctx.log.numbers.insert(FORMED.into(), formed);
    ctx.at(ctx.plan.fault_s).await;
    let Some(relay) = &ctx.cluster.relay else {
        return ctx.fail("no relay in this cluster");
    };
    let at = ctx.now_s();
    let mut groups = vec![0u8; ctx.cluster.routers.len()];
    groups[CUT] = 1;
    relay.set(NetFaults {
        groups: groups.clone(),
        ..NetFaults::default()
    });
    ctx.note(format!("n{CUT} cut off {groups:?}"));
    ctx.log.fault_s = Some(at);
    wait_cut(ctx, "n1 cut off", &groups, at, DETECT_BOUND_S).await;
    ctx.at(ctx.now_s() + 1.0).await;
    let healed = ctx.now_s();
    if let Some(relay) = &ctx.cluster.relay {
        relay.set(NetFaults::default());
    }
    ctx.note("healed");
    ctx.log.recover_s = Some(healed);
    wait_whole(ctx, "healed", healed, HEAL_BOUND_S).await;
}

pub fn checks(f: &Finished<'_>) -> Vec<Check> {
    let (cut, heal) = (
        f.log.fault_s.unwrap_or(f.load_end_s),
        f.log.recover_s.unwrap_or(f.load_end_s),
    );
    // Judged outside the partition and the time the mesh took to be whole after it.
    let back = heal
        + f.log
            .numbers
            .get("healed_converge_s")
            .copied()
            .unwrap_or(HEAL_BOUND_S);
    // From when the mesh first formed (its own check bounds that), not from start-up.
    let formed = f.log.numbers.get(FORMED).copied().unwrap_or(HEAL_BOUND_S);
    let mut out = vec![skew_estimates(f, (cut, back))];
    for (n, id) in f.router_ids.iter().enumerate() {
        let fr = fresh_samples(f, n, formed, f.load_end_s, Some((cut, back)));
        let share = fr.share();
        out.push(Check::new(
            &format!(
                "{id} (clock {:+} s) holds fresh placements from every peer",
                OFFSETS_MS.get(n).copied().unwrap_or(0) as f64 / 1e3
            ),
            fr.judged >= MIN_JUDGED && share >= MIN_FRESH,
            format!(
                "{} of {} samples outside the partition ({:.0}%, need ≥ {:.0}% of ≥ {MIN_JUDGED}){}",
                fr.fresh,
                fr.judged,
                share * 100.0,
                MIN_FRESH * 100.0,
                fr.stale_note()
            ),
        ));
    }
    out
}

/// When the mesh was first whole (s from the start), in the log's numbers.
const FORMED: &str = "mesh_formed_s";

/// Fewest samples a node's freshness is judged on.
const MIN_JUDGED: usize = 5;

/// Largest error of a node's estimate of a peer's skew accepted (ms): loopback delay
/// and scheduling under load.
const SKEW_TOLERANCE_MS: i64 = 250;

/// The median of each node's estimates of each peer's skew (over its samples outside
/// `skip`) matches the offsets set.
fn skew_estimates(f: &Finished<'_>, skip: (f64, f64)) -> Check {
    let mut parts = Vec::new();
    let mut pass = true;
    for (n, id) in f.router_ids.iter().enumerate() {
        for (j, peer) in f.router_ids.iter().enumerate() {
            if j == n {
                continue;
            }
            let want =
                OFFSETS_MS.get(n).copied().unwrap_or(0) - OFFSETS_MS.get(j).copied().unwrap_or(0);
            let mut seen: Vec<i64> = f
                .samples
                .iter()
                .filter(|s| s.node == n && (s.t_s < skip.0 || s.t_s >= skip.1))
                .filter_map(|s| s.member(peer)?.clock_skew_ms)
                .collect();
            seen.sort_unstable();
            let got = seen.get(seen.len() / 2).copied();
            pass &= got.is_some_and(|g| (g - want).abs() <= SKEW_TOLERANCE_MS);
            parts.push(format!(
                "{id} sees {peer} {} ms (true {want:+})",
                got.map_or("-".into(), |g| format!("{g:+}"))
            ));
        }
    }
    Check::new(
        &format!("every node estimates each peer's clock skew within {SKEW_TOLERANCE_MS} ms"),
        pass,
        parts.join("; "),
    )
}
