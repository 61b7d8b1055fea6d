//! The values the mesh carries: opaque, versioned payloads (chitchat keys and QUIC
//! datagrams). The mesh never reads a payload; its user (the router, `router/src/mesh/
//! schema.rs`) owns the schema, encodes and validates.
//!
//! - [`Value`] — a kind tag, the kind's schema version, and the payload bytes.
//! - [`KindPolicies`] — what the mesh does per kind (set by its user in `MeshConfig`):
//!   whether a value is a measurement (never re-stamped by the refresher) and whether it
//!   may travel on the cross-region cluster.
//! - [`codec`] — the frame around a value (`magic + frame version + kind + kind version +
//!   timestamp + payload`); receivers refuse and count corrupt frames.

pub mod codec;

use bytes::Bytes;

pub use codec::{
    Decoded, EncodeError, FRAME_VERSION, HARD_MAX_VALUE_BYTES, HEADER_LEN, MAGIC, RejectReason,
    decode, decode_text, encode, encode_text,
};

/// One value as the mesh carries it: opaque beyond its kind and version.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Value {
    /// Which schema type the payload is (the user's registry).
    pub kind: u8,
    /// That type's schema version; a receiver that does not know it ignores the value.
    pub version: u8,
    pub payload: Bytes,
}

impl Value {
    pub fn new(kind: u8, version: u8, payload: impl Into<Bytes>) -> Self {
        Self {
            kind,
            version,
            payload: payload.into(),
        }
    }
}

/// What the mesh does with values of one kind. The default: regional only, kept alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KindPolicy {
    /// What was true when it was published (an engine's scrape). The mesh never
    /// re-stamps one to keep it alive — a refreshed timestamp would make an old
    /// measurement look new to every peer — so one its publisher stops sending expires.
    pub measurement: bool,
    /// Allowed on the cross-region cluster ([`crate::Mesh::publish_global`]).
    pub crosses_regions: bool,
}

/// A [`KindPolicy`] per kind tag; unset kinds get the default.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct KindPolicies([KindPolicy; 256]);

impl Default for KindPolicies {
    fn default() -> Self {
        Self([KindPolicy::default(); 256])
    }
}

impl std::fmt::Debug for KindPolicies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(
                self.0
                    .iter()
                    .enumerate()
                    .filter(|(_, p)| **p != KindPolicy::default()),
            )
            .finish()
    }
}

impl KindPolicies {
    /// Sets the policy of `kind`.
    pub fn set(&mut self, kind: u8, policy: KindPolicy) -> &mut Self {
        self.0[usize::from(kind)] = policy;
        self
    }

    pub fn get(&self, kind: u8) -> KindPolicy {
        self.0[usize::from(kind)]
    }
}
