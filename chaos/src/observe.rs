//! Watching the routers while a scenario runs: every `period`, each node's
//! `/debug/replicas` (health, ejections, own and peer in-flight per replica) and, in
//! a mesh, `/debug/cluster` (live members, whose placements it still holds).
//!
//! Invariants: polls of different nodes run concurrently, each bounded by a short
//! timeout, so a killed or paused node shows up as an unreachable sample without
//! delaying the others; the sampler stops when its token is cancelled and returns
//! everything it saw.

use std::sync::Arc;
use std::time::{Duration, Instant};

use headroom_bench::live::client::{HttpClient, http_client};
use serde::Serialize;
use serde_json::Value;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::http::get_json;

/// One replica as one node sees it.
#[derive(Clone, Debug, Serialize)]
pub struct ReplicaView {
    pub name: String,
    pub health: String,
    pub routable: bool,
    pub ejections: u64,
    /// The node's own clock: seconds from its last ejection to this answer.
    pub last_ejection_age_s: Option<f64>,
    pub inflight: f64,
    /// This node's requests there that have had their first token.
    pub decoding: f64,
    pub peer_inflight: f64,
}

/// One member as one node sees it.
#[derive(Clone, Debug, Serialize)]
pub struct MemberView {
    pub node_id: String,
    pub live: bool,
    /// Replicas for which this node holds a fresh report of the member's placements.
    pub inflight_replicas: Option<u64>,
    /// The node's estimate of this member's clock skew (ms; > 0: the member is behind).
    pub clock_skew_ms: Option<i64>,
}

/// What node `node` answered at `t_s` (None when it did not answer in time).
#[derive(Clone, Debug, Serialize)]
pub struct NodeSample {
    pub t_s: f64,
    pub node: usize,
    pub replicas: Option<Vec<ReplicaView>>,
    pub members: Option<Vec<MemberView>>,
}

impl NodeSample {
    pub fn replica(&self, name: &str) -> Option<&ReplicaView> {
        self.replicas.as_ref()?.iter().find(|r| r.name == name)
    }
    /// Region members this node reports live (sorted).
    pub fn live_members(&self) -> Option<Vec<String>> {
        let mut v: Vec<String> = self
            .members
            .as_ref()?
            .iter()
            .filter(|m| m.live)
            .map(|m| m.node_id.clone())
            .collect();
        v.sort();
        Some(v)
    }
    pub fn member(&self, id: &str) -> Option<&MemberView> {
        self.members.as_ref()?.iter().find(|m| m.node_id == id)
    }
}

/// Reads `/debug/replicas` into views.
pub fn parse_replicas(v: &Value) -> Option<Vec<ReplicaView>> {
    Some(
        v["replicas"]
            .as_array()?
            .iter()
            .map(|r| ReplicaView {
                name: r["name"].as_str().unwrap_or_default().to_string(),
                health: r["health"].as_str().unwrap_or_default().to_string(),
                routable: r["routable"] == true,
                ejections: r["ejections"].as_u64().unwrap_or(0),
                last_ejection_age_s: r["last_ejection_age_s"].as_f64(),
                inflight: r["inflight"]["requests"].as_f64().unwrap_or(f64::NAN),
                decoding: r["inflight"]["decoding_requests"].as_f64().unwrap_or(0.0),
                peer_inflight: r["peer_inflight"]["requests"].as_f64().unwrap_or(0.0),
            })
            .collect(),
    )
}

/// Reads `/debug/cluster` members of this node's region.
pub fn parse_members(v: &Value) -> Option<Vec<MemberView>> {
    Some(
        v["members"]
            .as_array()?
            .iter()
            .filter(|m| m["scope"] == "region" || m.get("scope").is_none())
            .map(|m| MemberView {
                node_id: m["node_id"].as_str().unwrap_or_default().to_string(),
                live: m["live"] == true,
                inflight_replicas: m["inflight_replicas"].as_u64(),
                clock_skew_ms: m["clock_skew_ms"].as_i64(),
            })
            .collect(),
    )
}

/// Polls one node once.
pub async fn sample_node(
    client: &HttpClient,
    url: &str,
    node: usize,
    mesh: bool,
    t0: Instant,
    timeout: Duration,
) -> NodeSample {
    let (ru, cu) = (
        format!("{url}/debug/replicas"),
        format!("{url}/debug/cluster"),
    );
    let replicas = get_json(client, &ru, timeout);
    let (r, m) = if mesh {
        let members = get_json(client, &cu, timeout);
        let (r, m) = tokio::join!(replicas, members);
        (r, m.ok().and_then(|v| parse_members(&v)))
    } else {
        (replicas.await, None)
    };
    NodeSample {
        t_s: t0.elapsed().as_secs_f64(),
        node,
        replicas: r.ok().and_then(|v| parse_replicas(&v)),
        members: m,
    }
}

/// Polls every node of a scenario until stopped.
pub struct Sampler {
    stop: CancellationToken,
    task: JoinHandle<Vec<NodeSample>>,
}

impl Sampler {
    pub fn start(urls: Vec<String>, mesh: bool, t0: Instant, period: Duration) -> Sampler {
        let stop = CancellationToken::new();
        let token = stop.clone();
        let urls = Arc::new(urls);
        let task = tokio::spawn(async move {
            let client = http_client();
            let mut out = Vec::new();
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = token.cancelled() => return out,
                    _ = tick.tick() => {}
                }
                let polls = urls.iter().enumerate().map(|(i, u)| {
                    sample_node(
                        &client,
                        u,
                        i,
                        mesh,
                        t0,
                        period.max(Duration::from_millis(300)),
                    )
                });
                out.extend(futures_util::future::join_all(polls).await);
            }
        });
        Sampler { stop, task }
    }

    /// Stops polling and returns every sample (time order per node).
    pub async fn finish(self) -> Vec<NodeSample> {
        self.stop.cancel();
        self.task.await.unwrap_or_default()
    }
}

/// Facts about one replica's health on one node, read from a sample series.
#[derive(Clone, Debug, Default, Serialize)]
pub struct HealthTrace {
    /// First time at or after the fault the replica was seen ejected (state or counter).
    pub ejected_s: Option<f64>,
    /// First time at or after `readmit_from` it was seen routable.
    pub readmitted_s: Option<f64>,
    /// Ejections counted by the node over the samples.
    pub ejections: u64,
    /// Samples in which it was not routable.
    pub unroutable_samples: usize,
}

/// Traces `replica` on `node` in `samples`: ejection after `fault_s`, re-admission
/// after `readmit_from` (when given).
pub fn health_trace(
    samples: &[NodeSample],
    node: usize,
    replica: &str,
    fault_s: f64,
    readmit_from: Option<f64>,
) -> HealthTrace {
    let mut t = HealthTrace::default();
    let mut base_ejections: Option<u64> = None;
    for s in samples.iter().filter(|s| s.node == node) {
        let Some(r) = s.replica(replica) else {
            continue;
        };
        if s.t_s < fault_s {
            base_ejections = Some(r.ejections);
            continue;
        }
        let base = base_ejections.unwrap_or(0);
        t.ejections = r.ejections.saturating_sub(base);
        if !r.routable {
            t.unroutable_samples += 1;
        }
        if t.ejected_s.is_none() && (!r.routable || r.ejections > base) {
            // Dated by the node itself when it says (the sample may arrive up to a
            // polling period later); never before the fault it answers.
            let dated = r
                .last_ejection_age_s
                .filter(|_| r.ejections > base)
                .map_or(s.t_s, |age| (s.t_s - age).max(fault_s));
            t.ejected_s = Some(dated);
        }
        if let Some(from) = readmit_from
            && t.readmitted_s.is_none()
            && s.t_s >= from
            && r.routable
        {
            t.readmitted_s = Some(s.t_s);
        }
    }
    t
}
