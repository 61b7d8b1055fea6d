//! `[mesh]`: the settings of the mesh between router nodes (the runtime that applies
//! them is `crate::mesh`).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Mesh settings (`[mesh]`); the mesh is off unless `listen` is set.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MeshSettings {
    /// UDP address for gossip (QUIC).
    pub listen: Option<std::net::SocketAddr>,
    /// Address peers should use, if not `listen`.
    pub advertise: Option<std::net::SocketAddr>,
    /// Seeds: `host:port` (a DNS name resolving to every router works).
    pub peers: Vec<String>,
    /// Directory with `ca.pem`, `<node>.pem`, `<node>.key` (see `headroom certs`).
    pub tls_dir: Option<PathBuf>,
    pub region: String,
    pub cluster_id: String,
    /// Seeds in other regions (summaries and predictor federation only).
    pub remote_region_peers: Vec<String>,
    pub gossip_interval_ms: u64,
    /// How often this node's in-flight vector is checked for changes.
    pub inflight_interval_ms: u64,
    /// Resend the in-flight vector at least this often even if unchanged.
    pub heartbeat_ms: u64,
    /// Peers' reports older than this count as nothing.
    pub peer_ttl_ms: u64,
    /// Nodes that scrape each replica.
    pub scrape_owners: usize,
    /// A replica's scrape goes to peers at most this often (a quarter of it when it
    /// changed materially; `scrapes.rs`).
    pub scrape_publish_ms: u64,
    pub prefix_interval_ms: u64,
    pub predictor_interval_ms: u64,
    /// Use QUIC datagrams for in-flight updates (else gossip only).
    pub datagrams: bool,
    /// zstd-compress gossip frames (≈ 3× smaller digests). Turn off only while a mesh
    /// still has nodes from before compressed frames (they refuse them).
    pub compress: bool,
    /// At start, how long to watch for a live node with this node's id before joining
    /// (the start is refused if one is found); 0 skips the check.
    pub duplicate_check_ms: u64,
}

impl Default for MeshSettings {
    fn default() -> Self {
        Self {
            listen: None,
            advertise: None,
            peers: Vec::new(),
            tls_dir: None,
            region: "local".into(),
            cluster_id: "headroom".into(),
            remote_region_peers: Vec::new(),
            gossip_interval_ms: 100,
            inflight_interval_ms: 20,
            heartbeat_ms: 1_000,
            peer_ttl_ms: 3_000,
            scrape_owners: 2,
            scrape_publish_ms: 1_000,
            prefix_interval_ms: 250,
            predictor_interval_ms: 2_000,
            datagrams: true,
            compress: true,
            duplicate_check_ms: 3_000,
        }
    }
}
