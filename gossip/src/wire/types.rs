//! The typed values the mesh carries. Plain structs: rkyv-archived on the wire (see
//! [`super::codec`]), owned and `Clone` in memory.
//!
//! Invariants checked on both encode and decode (see [`WireValue::validate`]): bounded list
//! lengths ([`PREFIX_DELTA_CAP`], [`MAX_LOADS`], [`MAX_STAT_BLOCKS`], [`KV_DELTA_CAP`],
//! [`KV_PART_CAP`]), predictor blocks whose
//! vector lengths match their dimension, finite floats in predictor statistics.

use rkyv::{Archive, Deserialize, Serialize};

/// Most block hashes a [`PrefixDelta`] may carry.
pub const PREFIX_DELTA_CAP: usize = 512;
/// Most replicas an [`InflightVector`] may list.
pub const MAX_LOADS: usize = 1024;
/// Most blocks a [`PredictorSlot`] may carry (the byte cap usually bites first).
pub const MAX_STAT_BLOCKS: usize = 256;
/// Largest predictor feature dimension.
pub const MAX_STAT_DIM: u8 = 64;
/// Most block keys a [`KvDelta`] may carry (stored + removed).
pub const KV_DELTA_CAP: usize = 3072;
/// Most block keys one [`KvSnapshot`] part may carry.
pub const KV_PART_CAP: usize = 3072;
/// Most parts of one [`KvSnapshot`].
pub const KV_MAX_PARTS: u16 = 64;
/// Delta slots per replica (`kv/<replica>/d<seq mod KV_WINDOW>`).
pub const KV_WINDOW: u64 = 64;
/// Longest string field (region, URLs, versions), in bytes.
pub const MAX_STRING: usize = 512;

/// What a router node says about itself.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct NodeInfo {
    pub region: String,
    /// Where the node serves HTTP (`host:port`).
    pub http_addr: String,
    /// Wall-clock start time, ms since the Unix epoch.
    pub started_at_ms: u64,
    /// Software version string.
    pub version: String,
}

/// This node's in-flight work on one replica.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq)]
pub struct ReplicaLoad {
    /// Replica key ([`crate::replica_key`] of its URL).
    pub replica: u64,
    /// Requests placed there and not yet finished.
    pub requests: u32,
    /// Prompt tokens still waiting for prefill.
    pub queued_prefill_tokens: u32,
    /// Requests in their decode phase.
    pub decoding_requests: u32,
    /// Sum of context lengths of the decoding requests.
    pub decode_context_tokens: u32,
    /// Prefill tokens per second this node is sending there (recent rate).
    pub prefill_inflow_tps: f32,
    /// Requests placed there that have not produced a first token.
    pub queued_requests: u32,
    /// Σ (u·k + u²/2) over those requests: their prefill attention work (token pairs).
    pub queued_attention_pairs: f32,
    /// Σ expected remaining output tokens of the decoding requests.
    pub decode_remaining_tokens: u32,
    /// Tightest TPOT objective (ms) among requests in flight there; 0 = none.
    pub min_tpot_slo_ms: f32,
}

/// This node's in-flight placements per replica. Latest-wins by `seq`.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct InflightVector {
    /// Increases with every vector this node emits (per process lifetime).
    pub seq: u64,
    /// Wall-clock time of the snapshot, ms since the Unix epoch.
    pub at_ms: u64,
    pub loads: Vec<ReplicaLoad>,
}

/// A scraped replica's engine state.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ReplicaScrape {
    pub replica: u64,
    pub url: String,
    pub running: u32,
    pub waiting: u32,
    /// KV-cache usage in [0, 1].
    pub kv_usage: f32,
    pub num_gpu_blocks: u32,
    pub block_size: u32,
    /// Prefix-cache hit counter (tokens), monotone.
    pub prefix_hits: u64,
    /// Prefix-cache query counter (tokens), monotone.
    pub prefix_queries: u64,
    /// Preemption counter, monotone.
    pub preemptions: u64,
    pub scraped_at_ms: u64,
    pub healthy: bool,
}

/// Block hashes recently routed to one replica (approximate prefix-cache view).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct PrefixDelta {
    pub replica: u64,
    /// At most [`PREFIX_DELTA_CAP`] hashes, most recent last.
    pub hashes: Vec<u64>,
}

/// A change of one replica's engine-reported blocks (its KV events), from the node
/// that follows them. Numbered per `epoch` without holes (see `headroom-kv-events`'
/// `share` and `mirror` modules for the protocol).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct KvDelta {
    pub replica: u64,
    pub epoch: u64,
    pub seq: u64,
    /// The owner's feed state: 0 precise, 1 recovering, 2 approximate.
    pub state: u8,
    pub block_size: u32,
    /// Every block of the replica was dropped before `removed` and `stored`.
    pub clear: bool,
    /// Chain keys no longer held.
    pub removed: Vec<u64>,
    /// Chain keys now held.
    pub stored: Vec<u64>,
}

/// One part of a snapshot of a replica's blocks, as of delta `as_of` of `epoch`.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct KvSnapshot {
    pub replica: u64,
    pub epoch: u64,
    pub as_of: u64,
    pub part: u16,
    pub parts: u16,
    /// False when the owner shared only a subset (over the part cap, or its index evicted).
    pub complete: bool,
    pub block_size: u32,
    pub hashes: Vec<u64>,
}

/// One block of mergeable sufficient statistics (weighted least squares on `dim` features).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct StatBlock {
    /// Which model/hardware group the statistics belong to.
    pub group: u64,
    /// Which target (e.g. 0 = TTFT, 1 = TPOT); meaning owned by the predictor crate.
    pub target: u8,
    pub dim: u8,
    /// Upper triangle of XᵀWX, row-major, `dim*(dim+1)/2` entries.
    pub a_upper: Vec<f64>,
    /// XᵀWy, `dim` entries.
    pub b: Vec<f64>,
    pub sum_w: f64,
    pub sum_wyy: f64,
    pub n: u64,
    /// Time landmark (s) for forward-decayed weights.
    pub landmark_s: f64,
}

/// A predictor-federation payload: opaque to the mesh beyond shape checks.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct PredictorSlot {
    pub blocks: Vec<StatBlock>,
}

/// Per-region aggregates for cross-region travel.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct RegionSummary {
    pub region: String,
    pub routers: u32,
    pub replicas: u32,
    pub healthy_replicas: u32,
    /// Mean free KV fraction over healthy replicas with a fresh scrape, [0, 1].
    pub free_kv_fraction: f32,
    /// Requests in flight on the region's replicas (the publisher's and its region
    /// peers' bookings).
    pub in_flight: f32,
    pub at_ms: u64,
}

/// Every value the mesh carries.
#[derive(Debug, Clone, PartialEq)]
pub enum WireValue {
    NodeInfo(NodeInfo),
    Inflight(InflightVector),
    Scrape(ReplicaScrape),
    Prefix(PrefixDelta),
    Predictor(PredictorSlot),
    Summary(RegionSummary),
    KvDelta(KvDelta),
    KvSnapshot(KvSnapshot),
}

/// The kind byte in a value's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum WireKind {
    NodeInfo = 1,
    Inflight = 2,
    Scrape = 3,
    Prefix = 4,
    Predictor = 5,
    Summary = 6,
    KvDelta = 7,
    KvSnapshot = 8,
}

impl WireKind {
    pub fn from_u8(b: u8) -> Option<Self> {
        Some(match b {
            1 => Self::NodeInfo,
            2 => Self::Inflight,
            3 => Self::Scrape,
            4 => Self::Prefix,
            5 => Self::Predictor,
            6 => Self::Summary,
            7 => Self::KvDelta,
            8 => Self::KvSnapshot,
            _ => return None,
        })
    }

    /// Kinds allowed on the cross-region cluster.
    pub fn crosses_regions(self) -> bool {
        matches!(self, Self::Predictor | Self::Summary)
    }
}

impl WireValue {
    pub fn kind(&self) -> WireKind {
        match self {
            Self::NodeInfo(_) => WireKind::NodeInfo,
            Self::Inflight(_) => WireKind::Inflight,
            Self::Scrape(_) => WireKind::Scrape,
            Self::Prefix(_) => WireKind::Prefix,
            Self::Predictor(_) => WireKind::Predictor,
            Self::Summary(_) => WireKind::Summary,
            Self::KvDelta(_) => WireKind::KvDelta,
            Self::KvSnapshot(_) => WireKind::KvSnapshot,
        }
    }

    /// A measurement: what was true when it was published (an engine's scrape). The
    /// mesh never re-stamps one to keep it alive — a refreshed timestamp would make an
    /// old scrape look new to every peer — so one its publisher stops sending expires.
    pub fn is_measurement(&self) -> bool {
        matches!(self, Self::Scrape(_))
    }

    /// Semantic checks beyond what the archive format guarantees.
    pub fn validate(&self) -> Result<(), &'static str> {
        fn s(v: &str) -> Result<(), &'static str> {
            if v.len() > MAX_STRING {
                return Err("string field too long");
            }
            Ok(())
        }
        match self {
            Self::NodeInfo(n) => {
                s(&n.region)?;
                s(&n.http_addr)?;
                s(&n.version)
            }
            Self::Inflight(v) => {
                if v.loads.len() > MAX_LOADS {
                    return Err("too many replica loads");
                }
                let ok = |x: f32| x.is_finite() && x >= 0.0;
                if v.loads.iter().any(|l| {
                    !(ok(l.prefill_inflow_tps)
                        && ok(l.queued_attention_pairs)
                        && ok(l.min_tpot_slo_ms))
                }) {
                    return Err("non-finite or negative load");
                }
                Ok(())
            }
            Self::Scrape(r) => {
                s(&r.url)?;
                if !r.kv_usage.is_finite() {
                    return Err("kv_usage not finite");
                }
                Ok(())
            }
            Self::Prefix(p) => {
                if p.hashes.len() > PREFIX_DELTA_CAP {
                    return Err("prefix delta over cap");
                }
                Ok(())
            }
            Self::Predictor(p) => {
                if p.blocks.len() > MAX_STAT_BLOCKS {
                    return Err("too many stat blocks");
                }
                for b in &p.blocks {
                    if b.dim > MAX_STAT_DIM {
                        return Err("stat block dimension too large");
                    }
                    let d = b.dim as usize;
                    if b.a_upper.len() != d * (d + 1) / 2 || b.b.len() != d {
                        return Err("stat block shape does not match its dimension");
                    }
                    let finite = b.a_upper.iter().chain(&b.b).all(|x| x.is_finite())
                        && b.sum_w.is_finite()
                        && b.sum_wyy.is_finite()
                        && b.landmark_s.is_finite();
                    if !finite {
                        return Err("non-finite predictor statistic");
                    }
                }
                Ok(())
            }
            Self::Summary(r) => s(&r.region),
            Self::KvDelta(d) => {
                if d.stored.len() + d.removed.len() > KV_DELTA_CAP {
                    return Err("kv delta over cap");
                }
                if d.state > 2 || d.seq == 0 {
                    return Err("kv delta state or seq out of range");
                }
                Ok(())
            }
            Self::KvSnapshot(p) => {
                if p.hashes.len() > KV_PART_CAP {
                    return Err("kv snapshot part over cap");
                }
                if p.parts == 0 || p.parts > KV_MAX_PARTS || p.part >= p.parts {
                    return Err("kv snapshot part out of range");
                }
                Ok(())
            }
        }
    }
}
