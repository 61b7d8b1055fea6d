//! Typed, versioned values carried by the mesh (chitchat keys and QUIC datagrams).
//!
//! Every value travels as `magic + schema version + kind + timestamp + rkyv archive`
//! ([`codec`]); receivers validate before use and count what they refuse.

pub mod codec;
mod types;

pub use codec::{
    Decoded, EncodeError, HARD_MAX_VALUE_BYTES, HEADER_LEN, MAGIC, RejectReason, SCHEMA_VERSION,
    decode, decode_text, encode, encode_text,
};
pub use types::*;

/// Stable 64-bit key for a replica URL (xxh3), the same on every node and release.
pub fn replica_key(url: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(url.as_bytes())
}
