//! The mesh schema: what routers tell each other, as rkyv archives inside the gossip
//! crate's opaque values ([`headroom_gossip::Value`]: kind tag, schema version, bytes).
//!
//! Invariants:
//! - every kind has one current schema version ([`Kind::version`]); a value of an unknown
//!   kind or of a version this node does not know is ignored and counted ([`Refused`]),
//!   never misread. Bump a kind's version on any change to its struct. Version 0 is a
//!   kind's layout from before per-kind versions (that frame's reserved byte was zero).
//! - payloads are validated on both encode and decode ([`WireValue::validate`]): bounded
//!   list lengths, predictor blocks whose vectors match their dimension, finite floats;
//!   the archive itself with bytecheck on a 16-byte-aligned copy. Decoding never panics.
//! - the router's own types travel as they are where they fit the wire
//!   ([`headroom_predictor::StatsBlock`]); the others are compact encodings with one
//!   conversion each, next to the type they convert (`peers.rs`, `kv.rs`, here for
//!   scrapes), lossless for what they carry.

use headroom_core::scraped::{EngineKind, Scraped};
use headroom_gossip::{KindPolicies, KindPolicy, Value};
use headroom_predictor::StatsBlock;
use rkyv::{Archive, Deserialize, Serialize, rancor, util::AlignedVec};

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

/// This node's in-flight work on one replica: the compact form of the ledger's
/// `Load` (`peers.rs` converts).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq)]
pub struct ReplicaLoad {
    /// Replica key (`Replica::key`).
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

/// A scraped replica's engine state (version 1: the engine kind and an unknown KV usage
/// travel; version 0 forced vLLM and sent an unknown KV usage as 0).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ReplicaScrape {
    pub replica: u64,
    pub url: String,
    /// [`engine_code`] of the engine whose metric names were found.
    pub engine: u8,
    pub running: u32,
    pub waiting: u32,
    /// KV-cache usage in [0, 1], when the engine reported it.
    pub kv_usage: Option<f64>,
    pub num_gpu_blocks: Option<u32>,
    pub block_size: Option<u32>,
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
/// `share` and `mirror` modules for the protocol; `kv.rs` converts).
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

/// A predictor-federation payload: the predictor's own blocks.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct PredictorSlot {
    pub blocks: Vec<StatsBlock>,
}

/// Per-region aggregates for cross-region travel (`regions.rs` folds them into
/// `headroom_core::region::RegionReport`s).
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

/// Every value routers share.
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

/// The kind tag of a value (the gossip value's `kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    NodeInfo = 1,
    Inflight = 2,
    Scrape = 3,
    Prefix = 4,
    Predictor = 5,
    Summary = 6,
    KvDelta = 7,
    KvSnapshot = 8,
}

impl Kind {
    pub const ALL: [Kind; 8] = [
        Self::NodeInfo,
        Self::Inflight,
        Self::Scrape,
        Self::Prefix,
        Self::Predictor,
        Self::Summary,
        Self::KvDelta,
        Self::KvSnapshot,
    ];

    pub fn from_u8(b: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|k| *k as u8 == b)
    }

    /// The schema version this node writes and reads for the kind.
    pub fn version(self) -> u8 {
        match self {
            Self::Scrape => 1,
            _ => 0,
        }
    }

    /// What the mesh does with the kind: scrapes are measurements (never re-stamped,
    /// so an old one expires); only predictor slots and region summaries cross regions.
    pub fn policy(self) -> KindPolicy {
        KindPolicy {
            measurement: self == Self::Scrape,
            crosses_regions: matches!(self, Self::Predictor | Self::Summary),
        }
    }
}

/// The policies of every kind, for `MeshConfig::kinds`.
pub fn policies() -> KindPolicies {
    let mut p = KindPolicies::default();
    for k in Kind::ALL {
        p.set(k as u8, k.policy());
    }
    p
}

/// Why a received value was ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refused {
    /// A kind tag this node does not know.
    UnknownKind,
    /// A schema version of a known kind this node does not know.
    UnknownVersion,
    /// The archive failed validation.
    Malformed,
    /// The archive is well-formed but breaks a semantic rule (caps, shapes, finiteness).
    Invalid,
}

impl Refused {
    pub const ALL: [Refused; 4] = [
        Self::UnknownKind,
        Self::UnknownVersion,
        Self::Malformed,
        Self::Invalid,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::UnknownKind => "unknown_kind",
            Self::UnknownVersion => "unknown_version",
            Self::Malformed => "malformed",
            Self::Invalid => "invalid",
        }
    }
}

/// Encoding failures (local bugs, never network input).
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    #[error("value breaks a wire rule: {0}")]
    Invalid(&'static str),
    #[error("rkyv serialization failed: {0}")]
    Archive(String),
}

/// The engine kind's code in [`ReplicaScrape::engine`].
pub fn engine_code(e: EngineKind) -> u8 {
    match e {
        EngineKind::Vllm => 0,
        EngineKind::Sglang => 1,
        EngineKind::Unknown => 2,
    }
}

/// The engine kind of a code ([`WireValue::validate`] refuses others).
pub fn engine_of(code: u8) -> EngineKind {
    match code {
        0 => EngineKind::Vllm,
        1 => EngineKind::Sglang,
        _ => EngineKind::Unknown,
    }
}

impl ReplicaScrape {
    /// The wire form of scrape `s` of replica (`replica`, `url`), made at
    /// `scraped_at_ms` (publisher's wall clock).
    pub fn of(replica: u64, url: &str, healthy: bool, s: &Scraped, scraped_at_ms: u64) -> Self {
        let n = |x: f64| x.clamp(0.0, u32::MAX as f64) as u32;
        let c = |x: f64| x.max(0.0) as u64;
        ReplicaScrape {
            replica,
            url: url.to_string(),
            engine: engine_code(s.engine),
            running: n(s.running),
            waiting: n(s.waiting),
            kv_usage: s.kv_usage,
            num_gpu_blocks: s.num_gpu_blocks,
            block_size: s.block_size,
            prefix_hits: c(s.prefix_hits),
            prefix_queries: c(s.prefix_queries),
            preemptions: c(s.preemptions),
            scraped_at_ms,
            healthy,
        }
    }

    /// The scrape as this node keeps it, made at `at_s` (this node's axis); the
    /// preemption rate is derived from `prev`. Engine counts and counters are integers,
    /// so `of` then `to_scraped` gives back what was scraped (the rate and the count of
    /// rejected samples are the receiver's own).
    pub fn to_scraped(&self, at_s: f64, prev: Option<&Scraped>) -> Scraped {
        let preemptions = self.preemptions as f64;
        let preemption_rate = match prev {
            Some(p) if at_s > p.at_s && preemptions >= p.preemptions => {
                (preemptions - p.preemptions) / (at_s - p.at_s)
            }
            _ => 0.0,
        };
        Scraped {
            at_s,
            engine: engine_of(self.engine),
            running: f64::from(self.running),
            waiting: f64::from(self.waiting),
            kv_usage: self.kv_usage.map(|u| u.clamp(0.0, 1.0)),
            num_gpu_blocks: self.num_gpu_blocks,
            block_size: self.block_size,
            prefix_queries: self.prefix_queries as f64,
            prefix_hits: self.prefix_hits as f64,
            preemptions,
            preemption_rate,
            rejected_values: 0,
        }
    }
}

impl WireValue {
    pub fn kind(&self) -> Kind {
        match self {
            Self::NodeInfo(_) => Kind::NodeInfo,
            Self::Inflight(_) => Kind::Inflight,
            Self::Scrape(_) => Kind::Scrape,
            Self::Prefix(_) => Kind::Prefix,
            Self::Predictor(_) => Kind::Predictor,
            Self::Summary(_) => Kind::Summary,
            Self::KvDelta(_) => Kind::KvDelta,
            Self::KvSnapshot(_) => Kind::KvSnapshot,
        }
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
                if r.kv_usage.is_some_and(|u| !u.is_finite()) {
                    return Err("kv_usage not finite");
                }
                if r.engine > 2 {
                    return Err("unknown engine code");
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

/// Encodes `value` as a mesh value of its kind's current version.
pub fn encode(value: &WireValue) -> Result<Value, EncodeError> {
    value.validate().map_err(EncodeError::Invalid)?;
    let archive = match value {
        WireValue::NodeInfo(v) => rkyv::to_bytes::<rancor::Error>(v),
        WireValue::Inflight(v) => rkyv::to_bytes::<rancor::Error>(v),
        WireValue::Scrape(v) => rkyv::to_bytes::<rancor::Error>(v),
        WireValue::Prefix(v) => rkyv::to_bytes::<rancor::Error>(v),
        WireValue::Predictor(v) => rkyv::to_bytes::<rancor::Error>(v),
        WireValue::Summary(v) => rkyv::to_bytes::<rancor::Error>(v),
        WireValue::KvDelta(v) => rkyv::to_bytes::<rancor::Error>(v),
        WireValue::KvSnapshot(v) => rkyv::to_bytes::<rancor::Error>(v),
    }
    .map_err(|e| EncodeError::Archive(e.to_string()))?;
    let kind = value.kind();
    Ok(Value::new(kind as u8, kind.version(), archive.to_vec()))
}

/// Decodes and validates a mesh value. Never panics; an unknown kind or version is
/// refused before its payload is read.
pub fn decode(value: &Value) -> Result<WireValue, Refused> {
    let kind = Kind::from_u8(value.kind).ok_or(Refused::UnknownKind)?;
    if value.version != kind.version() {
        return Err(Refused::UnknownVersion);
    }
    // The archive must sit on an aligned buffer for checked access.
    let mut aligned: AlignedVec<16> = AlignedVec::with_capacity(value.payload.len());
    aligned.extend_from_slice(&value.payload);
    let v = match kind {
        Kind::NodeInfo => from::<NodeInfo>(&aligned).map(WireValue::NodeInfo),
        Kind::Inflight => from::<InflightVector>(&aligned).map(WireValue::Inflight),
        Kind::Scrape => from::<ReplicaScrape>(&aligned).map(WireValue::Scrape),
        Kind::Prefix => from::<PrefixDelta>(&aligned).map(WireValue::Prefix),
        Kind::Predictor => from::<PredictorSlot>(&aligned).map(WireValue::Predictor),
        Kind::Summary => from::<RegionSummary>(&aligned).map(WireValue::Summary),
        Kind::KvDelta => from::<KvDelta>(&aligned).map(WireValue::KvDelta),
        Kind::KvSnapshot => from::<KvSnapshot>(&aligned).map(WireValue::KvSnapshot),
    }?;
    v.validate().map_err(|_| Refused::Invalid)?;
    Ok(v)
}

fn from<T>(bytes: &[u8]) -> Result<T, Refused>
where
    T: rkyv::Archive,
    T::Archived: for<'a> rkyv::bytecheck::CheckBytes<rkyv::api::high::HighValidator<'a, rancor::Error>>
        + rkyv::Deserialize<T, rkyv::api::high::HighDeserializer<rancor::Error>>,
{
    rkyv::from_bytes::<T, rancor::Error>(bytes).map_err(|_| Refused::Malformed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn scrape() -> ReplicaScrape {
        ReplicaScrape {
            replica: 7,
            url: "http://r:8000".into(),
            engine: engine_code(EngineKind::Sglang),
            running: 1,
            waiting: 2,
            kv_usage: None,
            num_gpu_blocks: Some(1000),
            block_size: Some(16),
            prefix_hits: 10,
            prefix_queries: 20,
            preemptions: 0,
            scraped_at_ms: 11,
            healthy: true,
        }
    }

    pub(crate) fn samples() -> Vec<WireValue> {
        vec![
            WireValue::NodeInfo(NodeInfo {
                region: "eu".into(),
                http_addr: "10.0.0.1:8080".into(),
                started_at_ms: 5,
                version: "0.1.0".into(),
            }),
            WireValue::Inflight(InflightVector {
                seq: 9,
                at_ms: 10,
                loads: vec![ReplicaLoad {
                    replica: 1,
                    requests: 2,
                    queued_prefill_tokens: 3,
                    decoding_requests: 4,
                    decode_context_tokens: 5,
                    prefill_inflow_tps: 6.5,
                    queued_requests: 0,
                    queued_attention_pairs: 0.0,
                    decode_remaining_tokens: 0,
                    min_tpot_slo_ms: 0.0,
                }],
            }),
            WireValue::Scrape(scrape()),
            WireValue::Prefix(PrefixDelta {
                replica: 7,
                hashes: vec![1, 2, 3],
            }),
            WireValue::Predictor(PredictorSlot {
                blocks: vec![StatsBlock {
                    group: 1,
                    target: 1,
                    dim: 1,
                    a_upper: vec![2.0],
                    b: vec![3.0],
                    sum_w: 1.0,
                    sum_wyy: 9.0,
                    n: 1,
                    landmark_s: 0.0,
                }],
            }),
            WireValue::Summary(RegionSummary {
                region: "eu".into(),
                routers: 3,
                replicas: 8,
                healthy_replicas: 8,
                free_kv_fraction: 0.4,
                in_flight: 3.0,
                at_ms: 12,
            }),
            WireValue::KvDelta(KvDelta {
                replica: 7,
                epoch: 1_700_000_000_000,
                seq: 3,
                state: 0,
                block_size: 16,
                clear: true,
                removed: vec![4],
                stored: vec![5, 6],
            }),
            WireValue::KvSnapshot(KvSnapshot {
                replica: 7,
                epoch: 1_700_000_000_000,
                as_of: 2,
                part: 1,
                parts: 2,
                complete: true,
                block_size: 16,
                hashes: vec![8, 9],
            }),
        ]
    }

    #[test]
    fn every_kind_round_trips_through_a_mesh_value_and_its_frame() {
        for v in samples() {
            let m = encode(&v).unwrap();
            assert_eq!((m.kind, m.version), (v.kind() as u8, v.kind().version()));
            assert_eq!(decode(&m).unwrap(), v);
            // And through the gossip frame, as a peer receives it.
            let text = headroom_gossip::wire::encode_text(&m, 1, 32 * 1024).unwrap();
            let back = headroom_gossip::wire::decode_text(&text, 32 * 1024).unwrap();
            assert_eq!(decode(&back.value).unwrap(), v);
        }
    }

    #[test]
    fn an_unknown_kind_or_version_is_refused_never_misread() {
        let good = encode(&samples()[1]).unwrap();
        // A newer peer's version of a known kind: ignored, even though it would parse.
        let newer = Value::new(good.kind, good.version + 1, good.payload.clone());
        assert_eq!(decode(&newer), Err(Refused::UnknownVersion));
        // An older peer's scrape (version 0 forced vLLM and lost an unknown KV usage).
        let old = Value::new(
            Kind::Scrape as u8,
            0,
            encode(&samples()[2]).unwrap().payload,
        );
        assert_eq!(decode(&old), Err(Refused::UnknownVersion));
        // A kind this node has never heard of.
        assert_eq!(
            decode(&Value::new(200, 0, good.payload.clone())),
            Err(Refused::UnknownKind)
        );
        assert_eq!(decode(&Value::new(0, 0, vec![])), Err(Refused::UnknownKind));
        // A payload of one kind under another kind's tag does not validate as it.
        let swapped = Value::new(Kind::NodeInfo as u8, 0, good.payload.clone());
        assert!(decode(&swapped).is_err());
    }

    #[test]
    fn the_policies_keep_scrapes_measurements_and_only_summaries_and_slots_global() {
        let p = policies();
        for k in Kind::ALL {
            assert_eq!(p.get(k as u8).measurement, k == Kind::Scrape, "{k:?}");
            assert_eq!(
                p.get(k as u8).crosses_regions,
                matches!(k, Kind::Predictor | Kind::Summary),
                "{k:?}"
            );
        }
        assert_eq!(p.get(99), KindPolicy::default());
    }

    #[test]
    fn a_scrape_round_trips_losslessly() {
        for (engine, kv) in [
            (EngineKind::Sglang, None),
            (EngineKind::Unknown, Some(0.61)),
            (EngineKind::Vllm, Some(0.0)),
        ] {
            let s = Scraped {
                at_s: 5.0,
                engine,
                running: 3.0,
                waiting: 9.0,
                kv_usage: kv,
                num_gpu_blocks: None,
                block_size: Some(16),
                prefix_queries: 1e12,
                prefix_hits: 4e11,
                preemptions: 2.0,
                preemption_rate: 0.0,
                rejected_values: 0,
            };
            let w = ReplicaScrape::of(7, "http://r", true, &s, 1);
            let v = decode(&encode(&WireValue::Scrape(w)).unwrap()).unwrap();
            let WireValue::Scrape(w) = v else {
                panic!("not a scrape")
            };
            assert_eq!(w.to_scraped(5.0, None), s);
        }
    }

    #[test]
    fn kv_values_out_of_range_are_refused() {
        let d = KvDelta {
            replica: 7,
            epoch: 1,
            seq: 1,
            state: 0,
            block_size: 16,
            clear: false,
            removed: vec![0; KV_DELTA_CAP],
            stored: vec![1],
        };
        assert!(encode(&WireValue::KvDelta(d.clone())).is_err());
        let d = KvDelta {
            removed: vec![],
            state: 3,
            ..d
        };
        assert!(encode(&WireValue::KvDelta(d)).is_err());
        let p = KvSnapshot {
            replica: 7,
            epoch: 1,
            as_of: 0,
            part: 2,
            parts: 2,
            complete: true,
            block_size: 16,
            hashes: vec![],
        };
        assert!(encode(&WireValue::KvSnapshot(p)).is_err());
        // A full part fits the router's 32 KiB values, header included.
        let full = KvSnapshot {
            replica: 7,
            epoch: 1,
            as_of: 0,
            part: 0,
            parts: 1,
            complete: true,
            block_size: 16,
            hashes: vec![u64::MAX; KV_PART_CAP],
        };
        let n = encode(&WireValue::KvSnapshot(full)).unwrap().payload.len();
        assert!(
            n + headroom_gossip::wire::HEADER_LEN <= 32 * 1024,
            "{n} bytes"
        );
        // An invalid predictor block is refused on encode and on decode.
        let shape = PredictorSlot {
            blocks: vec![StatsBlock {
                group: 1,
                target: 0,
                dim: 2,
                a_upper: vec![1.0],
                b: vec![1.0, 2.0],
                sum_w: 1.0,
                sum_wyy: 1.0,
                n: 1,
                landmark_s: 0.0,
            }],
        };
        assert!(matches!(
            encode(&WireValue::Predictor(shape.clone())),
            Err(EncodeError::Invalid(_))
        ));
        let raw = rkyv::to_bytes::<rancor::Error>(&shape).unwrap().to_vec();
        assert_eq!(
            decode(&Value::new(Kind::Predictor as u8, 0, raw)),
            Err(Refused::Invalid)
        );
    }

    #[test]
    fn payload_sizes_stay_compact() {
        let size = |v: WireValue| encode(&v).unwrap().payload.len();
        let loads = |n: usize| {
            WireValue::Inflight(InflightVector {
                seq: 1,
                at_ms: 2,
                loads: vec![
                    ReplicaLoad {
                        replica: 0,
                        requests: 0,
                        queued_prefill_tokens: 0,
                        decoding_requests: 0,
                        decode_context_tokens: 0,
                        prefill_inflow_tps: 0.0,
                        queued_requests: 0,
                        queued_attention_pairs: 0.0,
                        decode_remaining_tokens: 0,
                        min_tpot_slo_ms: 0.0,
                    };
                    n
                ],
            })
        };
        // 48 B per load, as before the schema moved here.
        assert_eq!(size(loads(17)) - size(loads(1)), 16 * 48);
        // A scrape stays well under the ≈ 200 B that `scrapes.rs` budgets.
        let n = size(WireValue::Scrape(scrape()));
        assert!(n <= 160, "{n} bytes");
    }

    #[test]
    fn random_and_mutated_payloads_never_panic() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let goods: Vec<Value> = samples().iter().map(|v| encode(v).unwrap()).collect();
        for i in 0..20_000 {
            let g = &goods[i % goods.len()];
            let mut b = g.payload.to_vec();
            if i % 2 == 0 {
                for _ in 0..1 + i % 4 {
                    let p = rng.random_range(0..b.len());
                    b[p] = rng.random();
                }
            } else {
                let n = rng.random_range(0..300);
                b = (0..n).map(|_| rng.random()).collect();
            }
            if let Ok(v) = decode(&Value::new(g.kind, g.version, b)) {
                assert!(v.validate().is_ok());
            }
        }
    }
}
