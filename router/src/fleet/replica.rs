//! One replica: identity, served models, scraped state, health and this node's ledger.

use std::sync::{Arc, atomic::AtomicU64};

use super::health::Health;
use crate::{config::ReplicaConfig, ledger::Ledger};

pub use headroom_core::view::{ModelEntry, PeerLoad, ServedModels, key_of};

#[derive(Debug)]
pub struct Replica {
    /// Process-local id, never reused.
    pub id: u32,
    pub base: http::Uri,
    pub url: String,
    /// Shared, not copied: every decision record names its candidates.
    pub name: Arc<str>,
    pub key: u64,
    pub class: Arc<str>,
    pub class_key: u64,
    /// Its region (a replica configured without one is in its node's region).
    pub region: String,
    /// In another region than the node's: the round trip there (ms); `None` in region.
    pub remote_rtt_ms: Option<f64>,
    /// Set while a fresh summary from its (remote) region says no replica there is
    /// healthy (`mesh/regions.rs`): not routable whatever this node's probes say.
    pub region_dark: std::sync::atomic::AtomicBool,
    /// Its part in a disaggregated fleet.
    pub role: headroom_core::view::Role,
    pub max_batched_tokens: Option<u32>,
    /// Its engine schedules by priority (`[[replicas]] deadline_priority`); unset:
    /// the node's `[proxy] deadline_priority`.
    pub deadline_priority: Option<bool>,
    pub ledger: Arc<Ledger>,
    /// Insertion cursor of this replica in the prefix index.
    pub prefix_cursor: AtomicU64,
    /// Copy cells (seqlocks), not `ArcSwap`s: every decision reads both for every
    /// candidate, and a read is then two plain loads instead of four atomic
    /// read-modify-writes on cache lines all decision threads share. Each keeps the
    /// few numbers a shortlist reads beside it ([`super::cells`]).
    pub scraped: super::cells::ScrapedCell,
    /// What it serves (`/v1/models`); decisions ask through its memo.
    pub models: super::models::ModelsCell,
    pub health: Health,
    /// In-flight work of other router nodes here, as last gossiped.
    pub peer_load: super::cells::PeerLoadCell,
    /// Where its KV-cache events come from, when configured.
    pub kv: Option<super::kv_feed::KvSource>,
}

impl Replica {
    /// Builds a replica from its config for a node in `node_region`, whose round trips
    /// to other regions `regions` gives; `id` comes from the fleet.
    pub fn new(
        id: u32,
        rc: &ReplicaConfig,
        node_region: &str,
        regions: &headroom_core::region::RegionsConfig,
    ) -> Result<Self, String> {
        // Credentials never leave the config: not in names, URLs, keys or logs.
        let base = super::strip_userinfo(&super::parse_base_url(&rc.url)?);
        let url = super::redact_url(rc.url.trim_end_matches('/'));
        let name = rc.name.clone().unwrap_or_else(|| {
            base.authority()
                .map(|a| a.to_string())
                .unwrap_or_else(|| url.clone())
        });
        let class = rc
            .class
            .clone()
            .unwrap_or_else(|| format!("replica:{name}"));
        Ok(Self {
            id,
            base,
            // Keyed by URL: every node names the same replica the same way.
            key: key_of(&url),
            class_key: key_of(&class),
            url,
            name: name.into(),
            class: class.into(),
            region: rc.region.clone().unwrap_or_else(|| node_region.to_string()),
            remote_rtt_ms: regions.remote_rtt_ms(node_region, rc.region.as_deref()),
            region_dark: Default::default(),
            role: rc.role,
            max_batched_tokens: rc.max_batched_tokens,
            deadline_priority: rc.deadline_priority,
            ledger: Ledger::new(),
            prefix_cursor: AtomicU64::new(0),
            scraped: Default::default(),
            models: Default::default(),
            health: Health::default(),
            peer_load: Default::default(),
            kv: super::kv_feed::KvSource::of(rc),
        })
    }

    /// KV capacity in tokens, from the scraped cache config.
    pub fn kv_capacity_tokens(&self) -> Option<u64> {
        self.scraped.load()?.kv_capacity_tokens()
    }
}
