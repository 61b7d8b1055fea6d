//! Versioned binary framing of [`WireValue`]s.
//!
//! Layout (little endian):
//! ```text
//! 0..2   magic "HR"
//! 2..4   schema version (u16) — SCHEMA_VERSION
//! 4      kind (WireKind)
//! 5..8   reserved, zero
//! 8..16  published_at_ms (u64): publisher's wall clock
//! 16..   rkyv archive of the kind's struct
//! ```
//! Invariants: decoding never panics on any input; every failure maps to one
//! [`RejectReason`]; the archive is validated with bytecheck (`rkyv::from_bytes`) on a
//! 16-byte-aligned copy, because network buffers carry no alignment guarantee.
//! Inside chitchat (whose values are strings) the frame travels as unpadded base64.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD_NO_PAD;
use rkyv::rancor;
use rkyv::util::AlignedVec;

use super::types::*;

/// First two bytes of every encoded value.
pub const MAGIC: [u8; 2] = *b"HR";
/// Current schema version. Bump on any change to a wire struct; keep the N-1 decoder.
pub const SCHEMA_VERSION: u16 = 2;
/// Bytes before the archive.
pub const HEADER_LEN: usize = 16;
/// Upper bound for any configured value cap: a value plus a 300-node digest must fit
/// one chitchat message (65 507 B) after base64, or that node's state stalls forever.
pub const HARD_MAX_VALUE_BYTES: usize = 32 * 1024;

/// Why a received value was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejectReason {
    /// Larger than the configured cap.
    Oversized,
    /// Not base64 (chitchat values only).
    BadEncoding,
    /// Shorter than the header or wrong magic.
    BadMagic,
    /// Unknown schema version.
    BadVersion,
    /// Unknown kind byte or non-zero reserved bytes.
    BadKind,
    /// The archive failed validation.
    Malformed,
    /// The archive is well-formed but breaks a semantic rule (caps, shapes, finiteness).
    Invalid,
}

impl RejectReason {
    pub const ALL: [RejectReason; 7] = [
        Self::Oversized,
        Self::BadEncoding,
        Self::BadMagic,
        Self::BadVersion,
        Self::BadKind,
        Self::Malformed,
        Self::Invalid,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Oversized => "oversized",
            Self::BadEncoding => "bad_encoding",
            Self::BadMagic => "bad_magic",
            Self::BadVersion => "bad_version",
            Self::BadKind => "bad_kind",
            Self::Malformed => "malformed",
            Self::Invalid => "invalid",
        }
    }
}

/// A decoded value with the publisher's timestamp.
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    pub value: WireValue,
    pub published_at_ms: u64,
}

/// Encoding failures (local bugs or oversized values, never network input).
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    #[error("value breaks a wire rule: {0}")]
    Invalid(&'static str),
    #[error("encoded value is {size} bytes, over the cap of {cap}")]
    TooLarge { size: usize, cap: usize },
    #[error("rkyv serialization failed: {0}")]
    Archive(String),
}

/// Encodes `value` into a framed binary payload, refusing anything over `cap` bytes.
pub fn encode(value: &WireValue, published_at_ms: u64, cap: usize) -> Result<Vec<u8>, EncodeError> {
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
    let size = HEADER_LEN + archive.len();
    if size > cap {
        return Err(EncodeError::TooLarge { size, cap });
    }
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&SCHEMA_VERSION.to_le_bytes());
    out.push(value.kind() as u8);
    out.extend_from_slice(&[0, 0, 0]);
    out.extend_from_slice(&published_at_ms.to_le_bytes());
    out.extend_from_slice(&archive);
    Ok(out)
}

/// Encodes for a chitchat value (base64 text).
pub fn encode_text(
    value: &WireValue,
    published_at_ms: u64,
    cap: usize,
) -> Result<String, EncodeError> {
    Ok(STANDARD_NO_PAD.encode(encode(value, published_at_ms, cap)?))
}

/// Decodes a framed binary payload. Never panics.
pub fn decode(bytes: &[u8], cap: usize) -> Result<Decoded, RejectReason> {
    if bytes.len() > cap {
        return Err(RejectReason::Oversized);
    }
    if bytes.len() < HEADER_LEN || bytes[0..2] != MAGIC {
        return Err(RejectReason::BadMagic);
    }
    let version = u16::from_le_bytes([bytes[2], bytes[3]]);
    if version != SCHEMA_VERSION {
        return Err(RejectReason::BadVersion);
    }
    let kind = WireKind::from_u8(bytes[4]).ok_or(RejectReason::BadKind)?;
    if bytes[5..8] != [0, 0, 0] {
        return Err(RejectReason::BadKind);
    }
    let mut ts = [0u8; 8];
    ts.copy_from_slice(&bytes[8..16]);
    let published_at_ms = u64::from_le_bytes(ts);
    // The archive must sit on an aligned buffer for checked access.
    let mut aligned: AlignedVec<16> = AlignedVec::with_capacity(bytes.len() - HEADER_LEN);
    aligned.extend_from_slice(&bytes[HEADER_LEN..]);
    let value = match kind {
        WireKind::NodeInfo => from::<NodeInfo>(&aligned).map(WireValue::NodeInfo),
        WireKind::Inflight => from::<InflightVector>(&aligned).map(WireValue::Inflight),
        WireKind::Scrape => from::<ReplicaScrape>(&aligned).map(WireValue::Scrape),
        WireKind::Prefix => from::<PrefixDelta>(&aligned).map(WireValue::Prefix),
        WireKind::Predictor => from::<PredictorSlot>(&aligned).map(WireValue::Predictor),
        WireKind::Summary => from::<RegionSummary>(&aligned).map(WireValue::Summary),
        WireKind::KvDelta => from::<KvDelta>(&aligned).map(WireValue::KvDelta),
        WireKind::KvSnapshot => from::<KvSnapshot>(&aligned).map(WireValue::KvSnapshot),
    }?;
    value.validate().map_err(|_| RejectReason::Invalid)?;
    Ok(Decoded {
        value,
        published_at_ms,
    })
}

/// Decodes a chitchat value (base64 text) whose binary form may be at most `cap` bytes.
pub fn decode_text(text: &str, cap: usize) -> Result<Decoded, RejectReason> {
    // 4 base64 chars per 3 bytes: reject before allocating anything large.
    if text.len() > cap.div_ceil(3) * 4 {
        return Err(RejectReason::Oversized);
    }
    let bytes = STANDARD_NO_PAD
        .decode(text.as_bytes())
        .map_err(|_| RejectReason::BadEncoding)?;
    decode(&bytes, cap)
}

fn from<T>(bytes: &[u8]) -> Result<T, RejectReason>
where
    T: rkyv::Archive,
    T::Archived: for<'a> rkyv::bytecheck::CheckBytes<rkyv::api::high::HighValidator<'a, rancor::Error>>
        + rkyv::Deserialize<T, rkyv::api::high::HighDeserializer<rancor::Error>>,
{
    rkyv::from_bytes::<T, rancor::Error>(bytes).map_err(|_| RejectReason::Malformed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

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
            WireValue::Scrape(ReplicaScrape {
                replica: 7,
                url: "http://r:8000".into(),
                running: 1,
                waiting: 2,
                kv_usage: 0.25,
                num_gpu_blocks: 1000,
                block_size: 16,
                prefix_hits: 10,
                prefix_queries: 20,
                preemptions: 0,
                scraped_at_ms: 11,
                healthy: true,
            }),
            WireValue::Prefix(PrefixDelta {
                replica: 7,
                hashes: vec![1, 2, 3],
            }),
            WireValue::Predictor(PredictorSlot {
                blocks: vec![StatBlock {
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
        assert!(encode(&WireValue::KvDelta(d.clone()), 0, 1 << 20).is_err());
        let d = KvDelta {
            removed: vec![],
            state: 3,
            ..d
        };
        assert!(encode(&WireValue::KvDelta(d), 0, 1 << 20).is_err());
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
        assert!(encode(&WireValue::KvSnapshot(p), 0, 1 << 20).is_err());
        // A full part fits the router's 32 KiB values.
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
        let n = encode(&WireValue::KvSnapshot(full), 0, 1 << 20)
            .unwrap()
            .len();
        assert!(n <= 32 * 1024, "{n} bytes");
    }

    #[test]
    fn every_kind_round_trips_in_binary_and_text() {
        for v in samples() {
            let b = encode(&v, 77, 4096).unwrap();
            assert_eq!(
                decode(&b, 4096).unwrap(),
                Decoded {
                    value: v.clone(),
                    published_at_ms: 77
                }
            );
            let t = encode_text(&v, 78, 4096).unwrap();
            assert_eq!(decode_text(&t, 4096).unwrap().value, v);
        }
    }

    #[test]
    fn each_corruption_maps_to_its_reason() {
        let good = encode(&samples()[1], 1, 4096).unwrap();
        let mut bad_magic = good.clone();
        bad_magic[0] = b'X';
        let mut bad_version = good.clone();
        bad_version[2] = 99;
        let mut bad_kind = good.clone();
        bad_kind[4] = 0;
        let mut reserved = good.clone();
        reserved[6] = 1;
        let mut truncated = good.clone();
        truncated.truncate(good.len() - 3);
        assert_eq!(decode(&bad_magic, 4096), Err(RejectReason::BadMagic));
        assert_eq!(decode(&good[..10], 4096), Err(RejectReason::BadMagic));
        assert_eq!(decode(&bad_version, 4096), Err(RejectReason::BadVersion));
        assert_eq!(decode(&bad_kind, 4096), Err(RejectReason::BadKind));
        assert_eq!(decode(&reserved, 4096), Err(RejectReason::BadKind));
        assert_eq!(decode(&truncated, 4096), Err(RejectReason::Malformed));
        assert_eq!(decode(&good, good.len() - 1), Err(RejectReason::Oversized));
        assert_eq!(decode_text("@@@@", 4096), Err(RejectReason::BadEncoding));
        assert_eq!(
            decode_text(&"A".repeat(6000), 4096),
            Err(RejectReason::Oversized)
        );
        let shape = WireValue::Predictor(PredictorSlot {
            blocks: vec![StatBlock {
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
        });
        assert!(matches!(
            encode(&shape, 1, 4096),
            Err(EncodeError::Invalid(_))
        ));
        assert!(matches!(
            encode(&samples()[4], 1, 20),
            Err(EncodeError::TooLarge { .. })
        ));
    }

    #[test]
    fn random_and_mutated_input_never_panics() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let goods: Vec<Vec<u8>> = samples()
            .iter()
            .map(|v| encode(v, 1, 4096).unwrap())
            .collect();
        for i in 0..20_000 {
            let mut b = goods[i % goods.len()].clone();
            // Flip a few bytes past the header, or write random bytes of random length.
            if i % 2 == 0 {
                for _ in 0..1 + i % 4 {
                    let p = rng.random_range(0..b.len());
                    b[p] = rng.random();
                }
            } else {
                let n = rng.random_range(0..300);
                b = (0..n).map(|_| rng.random()).collect();
                if n >= HEADER_LEN {
                    b[..2].copy_from_slice(&MAGIC);
                    b[2..4].copy_from_slice(&SCHEMA_VERSION.to_le_bytes());
                    b[4] = 1 + (i % 6) as u8;
                    b[5..8].fill(0);
                }
            }
            if let Ok(d) = decode(&b, 4096) {
                assert!(d.value.validate().is_ok());
            }
        }
    }
}
