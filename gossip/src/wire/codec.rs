//! The frame around a [`Value`].
//!
//! Layout (little endian):
//! ```text
//! 0..2   magic "HR"
//! 2..4   frame version (u16) — FRAME_VERSION
//! 4      kind (the user's tag)
//! 5      the kind's schema version (was reserved zero before per-kind versions, so
//!        version 0 of a kind is its layout of that time)
//! 6..8   reserved, zero
//! 8..16  published_at_ms (u64): publisher's wall clock
//! 16..   payload (opaque to the mesh)
//! ```
//! Invariants: decoding never panics on any input; every failure maps to one
//! [`RejectReason`]; the payload is not read here (its user decodes and validates it).
//! Inside chitchat (whose values are strings) the frame travels as unpadded base64.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD_NO_PAD;
use bytes::Bytes;

use super::Value;

/// First two bytes of every encoded value.
pub const MAGIC: [u8; 2] = *b"HR";
/// Version of this frame layout (not of any payload's schema: see [`Value::version`]).
pub const FRAME_VERSION: u16 = 2;
/// Bytes before the payload.
pub const HEADER_LEN: usize = 16;
/// Upper bound for any configured value cap: a value plus a 300-node digest must fit
/// one chitchat message (65 507 B) after base64, or that node's state stalls forever.
pub const HARD_MAX_VALUE_BYTES: usize = 32 * 1024;

/// Why a received frame was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejectReason {
    /// Larger than the configured cap.
    Oversized,
    /// Not base64 (chitchat values only).
    BadEncoding,
    /// Shorter than the header or wrong magic.
    BadMagic,
    /// Unknown frame version.
    BadVersion,
    /// Non-zero reserved bytes.
    BadHeader,
}

impl RejectReason {
    pub const ALL: [RejectReason; 5] = [
        Self::Oversized,
        Self::BadEncoding,
        Self::BadMagic,
        Self::BadVersion,
        Self::BadHeader,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Oversized => "oversized",
            Self::BadEncoding => "bad_encoding",
            Self::BadMagic => "bad_magic",
            Self::BadVersion => "bad_version",
            Self::BadHeader => "bad_header",
        }
    }
}

/// A decoded frame: the value and the publisher's timestamp.
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    pub value: Value,
    pub published_at_ms: u64,
}

/// Encoding failures (oversized values, never network input).
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    #[error("encoded value is {size} bytes, over the cap of {cap}")]
    TooLarge { size: usize, cap: usize },
}

/// Frames `value`, refusing anything over `cap` bytes.
pub fn encode(value: &Value, published_at_ms: u64, cap: usize) -> Result<Vec<u8>, EncodeError> {
    let size = HEADER_LEN + value.payload.len();
    if size > cap {
        return Err(EncodeError::TooLarge { size, cap });
    }
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FRAME_VERSION.to_le_bytes());
    out.push(value.kind);
    out.push(value.version);
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(&published_at_ms.to_le_bytes());
    out.extend_from_slice(&value.payload);
    Ok(out)
}

/// Encodes for a chitchat value (base64 text).
pub fn encode_text(value: &Value, published_at_ms: u64, cap: usize) -> Result<String, EncodeError> {
    Ok(STANDARD_NO_PAD.encode(encode(value, published_at_ms, cap)?))
}

/// Decodes a frame; the payload is a slice of `bytes` (no copy). Never panics.
pub fn decode(bytes: Bytes, cap: usize) -> Result<Decoded, RejectReason> {
    if bytes.len() > cap {
        return Err(RejectReason::Oversized);
    }
    if bytes.len() < HEADER_LEN || bytes[0..2] != MAGIC {
        return Err(RejectReason::BadMagic);
    }
    if u16::from_le_bytes([bytes[2], bytes[3]]) != FRAME_VERSION {
        return Err(RejectReason::BadVersion);
    }
    if bytes[6..8] != [0, 0] {
        return Err(RejectReason::BadHeader);
    }
    let mut ts = [0u8; 8];
    ts.copy_from_slice(&bytes[8..16]);
    Ok(Decoded {
        value: Value {
            kind: bytes[4],
            version: bytes[5],
            payload: bytes.slice(HEADER_LEN..),
        },
        published_at_ms: u64::from_le_bytes(ts),
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
    decode(Bytes::from(bytes), cap)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn sample() -> Value {
        Value::new(3, 1, (0..40u8).collect::<Vec<u8>>())
    }

    #[test]
    fn a_value_round_trips_in_binary_and_text() {
        let v = sample();
        let b = encode(&v, 77, 4096).unwrap();
        assert_eq!(
            decode(Bytes::from(b), 4096).unwrap(),
            Decoded {
                value: v.clone(),
                published_at_ms: 77
            }
        );
        let t = encode_text(&v, 78, 4096).unwrap();
        assert_eq!(decode_text(&t, 4096).unwrap().value, v);
        // Kind and version travel as they are: the mesh does not judge them.
        let odd = Value::new(250, 9, vec![]);
        let b = encode(&odd, 1, 4096).unwrap();
        assert_eq!(decode(Bytes::from(b), 4096).unwrap().value, odd);
    }

    #[test]
    fn each_corruption_maps_to_its_reason() {
        let good = encode(&sample(), 1, 4096).unwrap();
        let d = |b: &[u8], cap| decode(Bytes::copy_from_slice(b), cap);
        let mut bad_magic = good.clone();
        bad_magic[0] = b'X';
        let mut bad_version = good.clone();
        bad_version[2] = 99;
        let mut reserved = good.clone();
        reserved[6] = 1;
        assert_eq!(d(&bad_magic, 4096), Err(RejectReason::BadMagic));
        assert_eq!(d(&good[..10], 4096), Err(RejectReason::BadMagic));
        assert_eq!(d(&bad_version, 4096), Err(RejectReason::BadVersion));
        assert_eq!(d(&reserved, 4096), Err(RejectReason::BadHeader));
        assert_eq!(d(&good, good.len() - 1), Err(RejectReason::Oversized));
        assert_eq!(decode_text("@@@@", 4096), Err(RejectReason::BadEncoding));
        assert_eq!(
            decode_text(&"A".repeat(6000), 4096),
            Err(RejectReason::Oversized)
        );
        assert!(matches!(
            encode(&sample(), 1, 20),
            Err(EncodeError::TooLarge { .. })
        ));
    }

    #[test]
    fn random_and_mutated_input_never_panics() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let good = encode(&sample(), 1, 4096).unwrap();
        for i in 0..20_000 {
            let mut b = good.clone();
            if i % 2 == 0 {
                for _ in 0..1 + i % 4 {
                    let p = rng.random_range(0..b.len());
                    b[p] = rng.random();
                }
            } else {
                let n = rng.random_range(0..300);
                b = (0..n).map(|_| rng.random()).collect();
            }
            let _ = decode(Bytes::from(b), 4096);
        }
    }
}
