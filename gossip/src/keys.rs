//! Key naming. Keys are small and many (one per replica or per kind, never one blob per
//! node): a single value larger than a chitchat message would stall that node's state.
//! Keys starting with [`RESERVED_PREFIX`] belong to the mesh itself.

use crate::error::MeshError;

pub const RESERVED_PREFIX: &str = "hr.";
pub const MAX_KEY_LEN: usize = 128;
/// The reserved key carrying a node's region.
pub(crate) const REGION_KEY: &str = "hr.region";

/// Checks a user key: 1–128 bytes of printable ASCII without spaces, not reserved.
pub fn validate_key(key: &str) -> Result<(), MeshError> {
    let bad = |why| Err(MeshError::BadKey(key.to_string(), why));
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return bad("must be 1-128 bytes");
    }
    if !key.bytes().all(|b| b.is_ascii_graphic()) {
        return bad("only printable ASCII without spaces");
    }
    if key.starts_with(RESERVED_PREFIX) {
        return bad("the hr. prefix is reserved");
    }
    Ok(())
}

/// The node's own `NodeInfo`.
pub fn node_info() -> String {
    "info".into()
}

/// The node's `InflightVector`.
pub fn inflight() -> String {
    "inflight".into()
}

/// A `ReplicaScrape` for one replica key.
pub fn scrape(replica: u64) -> String {
    format!("scrape/{replica:016x}")
}

/// A `PrefixDelta` for one replica key.
pub fn prefix(replica: u64) -> String {
    format!("prefix/{replica:016x}")
}

/// The `KvDelta` slot for `seq` of one replica (slots rotate: `seq mod window`).
pub fn kv_delta(replica: u64, seq: u64, window: u64) -> String {
    format!("kv/{replica:016x}/d{}", seq % window.max(1))
}

/// Part `part` of one replica's `KvSnapshot`.
pub fn kv_snapshot(replica: u64, part: u16) -> String {
    format!("kv/{replica:016x}/s{part}")
}

/// One `PredictorSlot` (split large federations over several slots).
pub fn predictor(slot: u32) -> String {
    format!("pred/{slot}")
}

/// A region's `RegionSummary`.
pub fn summary(region: &str) -> String {
    format!("summary/{region}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers_make_valid_keys_and_bad_keys_are_refused() {
        for k in [
            node_info(),
            inflight(),
            scrape(u64::MAX),
            prefix(1),
            kv_delta(u64::MAX, 65, 64),
            kv_snapshot(u64::MAX, 63),
            predictor(3),
            summary("eu-west"),
        ] {
            validate_key(&k).unwrap();
        }
        for k in ["", "a b", "hr.region", "é", &"x".repeat(129)] {
            assert!(validate_key(k).is_err(), "{k:?} should be refused");
        }
    }
}
