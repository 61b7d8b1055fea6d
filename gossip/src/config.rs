//! Mesh configuration: the one place defaults live ([`MeshConfig::new`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::error::MeshError;
use crate::fault::FaultInjector;
use crate::seeds::SeedResolver;
use crate::tls::{TlsIdentity, validate_node_id};
use crate::wire::{HARD_MAX_VALUE_BYTES, KindPolicies};

/// Failure-detector settings (chitchat's phi-accrual detector: a member is dead once the
/// time since its last heartbeat exceeds `phi_threshold` × the smoothed mean heartbeat
/// interval; the mean starts from `initial_interval` with weight 5).
#[derive(Debug, Clone, PartialEq)]
pub struct FailureDetection {
    pub phi_threshold: f64,
    /// Prior for the mean heartbeat interval; a few gossip intervals is right.
    pub initial_interval: Duration,
    /// Heartbeat gaps longer than this are not sampled.
    pub max_interval: Duration,
    /// How long a dead member's state is kept (and it is occasionally probed).
    pub dead_node_grace_period: Duration,
}

impl FailureDetection {
    /// Defaults scaled to a gossip interval.
    pub fn for_interval(gossip_interval: Duration) -> Self {
        Self {
            phi_threshold: 8.0,
            initial_interval: gossip_interval * 5,
            max_interval: Duration::from_secs(10).max(gossip_interval * 20),
            dead_node_grace_period: Duration::from_secs(15 * 60),
        }
    }
}

/// The low-rate cross-region cluster (`<cluster_id>/global`): it carries only the kinds
/// whose [`crate::KindPolicy::crosses_regions`] is set (the router's region summaries and
/// predictor slots).
#[derive(Debug, Clone, PartialEq)]
pub struct CrossRegion {
    pub enabled: bool,
    /// `host:port` of nodes in other regions (any node of each remote region will do).
    pub remote_seeds: Vec<String>,
    pub gossip_interval: Duration,
    pub failure: FailureDetection,
    pub value_ttl: Duration,
}

/// Everything a [`crate::Mesh`] needs. Build with [`MeshConfig::new`] and adjust fields.
#[derive(Clone)]
pub struct MeshConfig {
    /// This node's id; must equal the DNS name in its certificate.
    pub node_id: String,
    /// Cluster name. The regional chitchat cluster is `<cluster_id>/<region>`.
    pub cluster_id: String,
    pub region: String,
    /// QUIC (UDP) bind address. Port 0 picks a free port.
    pub listen_addr: SocketAddr,
    /// Address peers use to reach this node; defaults to the bound address, which must
    /// then not be a wildcard.
    pub advertise_addr: Option<SocketAddr>,
    /// Same-region seeds as `host:port`; hostnames are re-resolved every
    /// `dns_refresh_interval`.
    pub seeds: Vec<String>,
    pub gossip_interval: Duration,
    pub failure: FailureDetection,
    pub tls: TlsIdentity,
    /// A value not refreshed for this long disappears everywhere. The mesh refreshes this
    /// node's values on its own every `value_ttl / 3` while it runs, so a value outlives
    /// its publisher by at most about `value_ttl`.
    pub value_ttl: Duration,
    /// Cap on one encoded value (bytes before base64), at most
    /// [`HARD_MAX_VALUE_BYTES`].
    pub max_value_bytes: usize,
    pub cross_region: CrossRegion,
    pub dns_refresh_interval: Duration,
    /// Queue length of each subscriber.
    pub event_buffer: usize,
    /// Queue length of messages waiting for one peer.
    pub send_queue: usize,
    /// Stream write and inbound handshake timeout.
    pub connect_timeout: Duration,
    /// Timeout of one outgoing dial; a quarter of it is the back-off after a failed dial.
    /// Short, because a dial started while a peer is unreachable retransmits its
    /// handshake with doubling gaps: a long one could sleep for seconds after the peer
    /// is back. At most `connect_timeout`.
    pub dial_timeout: Duration,
    /// A connection on which we sent and heard nothing back (not even an ACK) for this
    /// long is dropped and redialled. QUIC's own loss timer doubles on every silent
    /// probe, so after a partition of T seconds an old connection may sleep for about
    /// T more before it notices the path is back; a fresh dial does not wait.
    pub silent_after: Duration,
    /// RTT assumed during the QUIC handshake (quinn's default is 333 ms; a lost handshake
    /// packet is resent after about 3× this).
    pub handshake_rtt: Duration,
    /// QUIC idle timeout and keep-alive interval.
    pub idle_timeout: Duration,
    pub keep_alive: Duration,
    /// Send gossip frames zstd-compressed (receivers always accept both). Off only
    /// while upgrading a mesh from nodes that predate compressed frames.
    pub compress_frames: bool,
    /// What the mesh does per value kind (measurement, cross-region); the user's schema
    /// sets it. Unset kinds: regional only, kept alive by the refresher.
    pub kinds: KindPolicies,
    /// Test hook: a shared partition table.
    pub fault: Option<FaultInjector>,
    /// Seed hostname resolver; `None` uses the system resolver.
    pub resolver: Option<Arc<dyn SeedResolver>>,
}

impl MeshConfig {
    /// Gossip round period. 100 ms gives sub-250 ms propagation to 16 nodes on loopback at
    /// a few kB/s per node (see gossip/README.md for the measurements).
    pub const DEFAULT_GOSSIP_INTERVAL: Duration = Duration::from_millis(100);
    pub const DEFAULT_VALUE_TTL: Duration = Duration::from_secs(30);
    pub const DEFAULT_MAX_VALUE_BYTES: usize = 16 * 1024;

    pub fn new(
        node_id: impl Into<String>,
        region: impl Into<String>,
        listen_addr: SocketAddr,
        tls: TlsIdentity,
    ) -> Self {
        let gi = Self::DEFAULT_GOSSIP_INTERVAL;
        let global_gi = Duration::from_secs(1);
        Self {
            node_id: node_id.into(),
            cluster_id: "headroom".into(),
            region: region.into(),
            listen_addr,
            advertise_addr: None,
            seeds: Vec::new(),
            gossip_interval: gi,
            failure: FailureDetection::for_interval(gi),
            tls,
            value_ttl: Self::DEFAULT_VALUE_TTL,
            max_value_bytes: Self::DEFAULT_MAX_VALUE_BYTES,
            cross_region: CrossRegion {
                enabled: true,
                remote_seeds: Vec::new(),
                gossip_interval: global_gi,
                failure: FailureDetection::for_interval(global_gi),
                value_ttl: Duration::from_secs(60),
            },
            dns_refresh_interval: Duration::from_secs(15),
            event_buffer: 4096,
            send_queue: 16,
            connect_timeout: Duration::from_secs(5),
            dial_timeout: Duration::from_millis(1500),
            silent_after: Duration::from_secs(1),
            handshake_rtt: Duration::from_millis(100),
            idle_timeout: Duration::from_secs(30),
            keep_alive: Duration::from_secs(5),
            compress_frames: true,
            kinds: KindPolicies::default(),
            fault: None,
            resolver: None,
        }
    }

    /// Sets the gossip interval and rescales the failure detector to it.
    pub fn with_gossip_interval(mut self, interval: Duration) -> Self {
        self.gossip_interval = interval;
        self.failure = FailureDetection::for_interval(interval);
        self
    }

    pub(crate) fn validate(&self) -> Result<(), MeshError> {
        let bad = |m: String| Err(MeshError::Config(m));
        validate_node_id(&self.node_id).map_err(MeshError::Tls)?;
        if self.tls.node_id() != self.node_id {
            return bad(format!(
                "TLS identity is for {:?} but node_id is {:?}",
                self.tls.node_id(),
                self.node_id
            ));
        }
        for (what, v) in [("region", &self.region), ("cluster_id", &self.cluster_id)] {
            let ok = !v.is_empty()
                && v.len() <= 64
                && v.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
            if !ok {
                return bad(format!("{what} {v:?} must be 1-64 of [A-Za-z0-9._-]"));
            }
        }
        if self.region == "global" {
            return bad("region name \"global\" is reserved".into());
        }
        for (what, d) in [
            ("gossip_interval", self.gossip_interval),
            (
                "cross_region.gossip_interval",
                self.cross_region.gossip_interval,
            ),
            ("value_ttl", self.value_ttl),
            ("cross_region.value_ttl", self.cross_region.value_ttl),
            ("dns_refresh_interval", self.dns_refresh_interval),
            ("connect_timeout", self.connect_timeout),
            ("dial_timeout", self.dial_timeout),
            ("silent_after", self.silent_after),
            ("handshake_rtt", self.handshake_rtt),
        ] {
            if d.is_zero() {
                return bad(format!("{what} must be positive"));
            }
        }
        if self.dial_timeout > self.connect_timeout {
            return bad("dial_timeout must not exceed connect_timeout".into());
        }
        if self.silent_after < self.handshake_rtt * 2 {
            return bad("silent_after must be at least twice handshake_rtt".into());
        }
        if self.value_ttl < self.gossip_interval * 10 {
            return bad("value_ttl must be at least 10 gossip intervals".into());
        }
        if self.max_value_bytes < 64 || self.max_value_bytes > HARD_MAX_VALUE_BYTES {
            return bad(format!(
                "max_value_bytes must be within 64..={HARD_MAX_VALUE_BYTES}"
            ));
        }
        if self.event_buffer == 0 || self.send_queue == 0 {
            return bad("event_buffer and send_queue must be positive".into());
        }
        for f in [&self.failure, &self.cross_region.failure] {
            if !(f.phi_threshold.is_finite() && f.phi_threshold > 0.0)
                || f.initial_interval.is_zero()
            {
                return bad(
                    "failure detection needs phi_threshold > 0 and initial_interval > 0".into(),
                );
            }
        }
        Ok(())
    }
}

impl std::fmt::Debug for MeshConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MeshConfig")
            .field("node_id", &self.node_id)
            .field("cluster_id", &self.cluster_id)
            .field("region", &self.region)
            .field("listen_addr", &self.listen_addr)
            .field("advertise_addr", &self.advertise_addr)
            .field("seeds", &self.seeds)
            .field("gossip_interval", &self.gossip_interval)
            .field("failure", &self.failure)
            .field("value_ttl", &self.value_ttl)
            .field("max_value_bytes", &self.max_value_bytes)
            .field("cross_region", &self.cross_region)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn config() -> MeshConfig {
        let ck = rcgen::generate_simple_self_signed(vec!["a".to_string()]).unwrap();
        let pem = ck.cert.pem();
        let key = ck.signing_key.serialize_pem();
        let tls =
            TlsIdentity::from_pem(pem.as_bytes(), pem.as_bytes(), key.as_bytes(), "a").unwrap();
        MeshConfig::new("a", "r1", "127.0.0.1:0".parse().unwrap(), tls)
    }

    #[test]
    fn the_defaults_are_valid() {
        config().validate().unwrap();
    }

    #[test]
    fn a_dial_longer_than_the_connect_timeout_is_refused() {
        let mut c = config();
        c.dial_timeout = c.connect_timeout + Duration::from_millis(1);
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("dial_timeout"), "{e}");
    }

    #[test]
    fn silence_shorter_than_a_round_trip_is_refused() {
        let mut c = config();
        c.silent_after = c.handshake_rtt;
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("silent_after"), "{e}");
        c.silent_after = Duration::ZERO;
        assert!(c.validate().is_err());
    }
}
