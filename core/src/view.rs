//! What the routing core reads of a replica: [`ReplicaView`], which the host
//! implements over its own state (the router over its fleet's atomics, the simulator
//! over plain fields).
//!
//! Invariants: a view's `id` is unique within the slice handed to one decision and is
//! never reused for another replica; `predictor_key` is equal on every node for the
//! same replica; `routable` is the host's whole verdict on health and readiness (the
//! core never probes). Reading a view never blocks for long: the router's loads are
//! lock-free snapshots, the ledger's one short lock.

use std::sync::{Arc, atomic::AtomicU64};

use headroom_predictor::ReplicaKey;
use xxhash_rust::xxh3::xxh3_64;

use crate::{ledger::Ledger, ledger::Load, scraped::Scraped};

/// Stable 64-bit key of a name (replica, class): equal on every node.
pub fn key_of(name: &str) -> u64 {
    xxh3_64(name.as_bytes())
}

/// A model (or LoRA adapter) a replica serves.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ModelEntry {
    pub id: String,
    /// Base model of an adapter.
    pub parent: Option<String>,
    pub max_model_len: Option<u32>,
}

/// What `/v1/models` last said.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ServedModels {
    pub models: Vec<ModelEntry>,
    /// False until `/v1/models` answered once.
    pub known: bool,
}

/// Whether a replica serves a model, as far as the host knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Serving {
    /// Its model list is not known yet (it might).
    NotYetKnown,
    /// Its model list is known and the model is not in it.
    No,
    /// It serves the model, with this context length where known (an adapter
    /// inherits its base model's).
    Yes { max_model_len: Option<u32> },
}

impl ServedModels {
    pub fn get(&self, id: &str) -> Option<&ModelEntry> {
        self.models.iter().find(|m| m.id == id)
    }

    /// Whether `model` is served here, and its context.
    pub fn serving(&self, model: &str) -> Serving {
        let Some(entry) = self.get(model) else {
            return if self.known {
                Serving::No
            } else {
                Serving::NotYetKnown
            };
        };
        let max_model_len = entry.max_model_len.or_else(|| {
            entry
                .parent
                .as_deref()
                .and_then(|p| self.get(p))
                .and_then(|m| m.max_model_len)
        });
        Serving::Yes { max_model_len }
    }
}

/// What a replica does in a disaggregated (prefill/decode) fleet.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Prefills prompts and hands their KV cache to a decode replica (vLLM
    /// `kv_transfer_params.do_remote_decode`); never decodes a client's output.
    Prefill,
    /// Decodes after a remote prefill (`do_remote_prefill`); serves whole requests too
    /// where no `both` replica can (it prefills locally).
    Decode,
    /// Serves whole requests (the unified engine).
    #[default]
    Both,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Prefill => "prefill",
            Role::Decode => "decode",
            Role::Both => "both",
        }
    }

    /// Whether it takes a whole request (prefill and decode on one engine).
    pub fn serves_unified(self) -> bool {
        self != Role::Prefill
    }
}

impl std::str::FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "prefill" => Ok(Role::Prefill),
            "decode" => Ok(Role::Decode),
            "both" => Ok(Role::Both),
            other => Err(format!(
                "role `{other}` is not one of prefill, decode, both"
            )),
        }
    }
}

/// Peers' load on a replica and when it was last refreshed (node time axis).
#[derive(Clone, Copy, Debug, Default)]
pub struct PeerLoad {
    pub load: Load,
    pub updated_s: f64,
}

/// The few numbers a shortlist ([`crate::policy::shortlist`]) reads of every eligible
/// replica of a large fleet, of the peers' load and the last scrape: what
/// [`ReplicaView::light`] returns without copying either whole.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LightRead {
    /// The peers' `Load::queued_prefill_tokens` and `decode_remaining_tokens` here.
    pub peer_queued_prefill_tokens: f64,
    pub peer_decode_remaining_tokens: f64,
    /// From the last scrape, however old; `None` before the first.
    pub scrape: Option<ScrapeShape>,
}

/// Of one scrape: when it was taken, the KV capacity and the engine's cache block.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScrapeShape {
    pub at_s: f64,
    pub kv_capacity_tokens: Option<u64>,
    pub block_size: Option<u32>,
}

impl LightRead {
    /// The light read of `peer` and `scraped`.
    pub fn of(peer: &PeerLoad, scraped: Option<&Scraped>) -> Self {
        Self {
            peer_queued_prefill_tokens: peer.load.queued_prefill_tokens,
            peer_decode_remaining_tokens: peer.load.decode_remaining_tokens,
            scrape: scraped.map(|s| ScrapeShape {
                at_s: s.at_s,
                kv_capacity_tokens: s.kv_capacity_tokens(),
                block_size: s.block_size,
            }),
        }
    }
}

/// One replica as the routing core sees it.
pub trait ReplicaView: Send + Sync + std::fmt::Debug {
    /// Host-local id, unique and never reused.
    fn id(&self) -> u32;
    /// Display name (headers, reasons).
    fn name(&self) -> &str;
    /// The predictor's key: (replica, class), equal on every node.
    fn predictor_key(&self) -> ReplicaKey;
    /// The engine's per-step token budget, if configured.
    fn max_batched_tokens(&self) -> Option<u32>;
    /// Whether it serves `model`.
    fn serving(&self, model: &str) -> Serving;
    /// Healthy and ready to take a request now.
    fn routable(&self) -> bool;
    /// The last scrape, however old (a copy: read per candidate per decision).
    fn scraped(&self) -> Option<Scraped>;
    /// Other router nodes' in-flight work here.
    fn peer_load(&self) -> PeerLoad;
    /// This node's bookings here.
    fn ledger(&self) -> &Arc<Ledger>;
    /// This replica's insertion cursor in the node's prefix index.
    fn prefix_cursor(&self) -> &AtomicU64;
    /// `None` when the replica is in the deciding node's region; else the round trip
    /// between the two regions (ms), which the client's TTFT pays once
    /// ([`crate::region`]).
    fn remote_rtt_ms(&self) -> Option<f64> {
        None
    }
    /// Its part in a disaggregated fleet (`both` unless configured).
    fn role(&self) -> Role {
        Role::Both
    }
    /// [`LightRead::of`] its peers' load and last scrape. A host that keeps those few
    /// numbers beside its cells answers without copying the cells (the router does).
    fn light(&self) -> LightRead {
        LightRead::of(&self.peer_load(), self.scraped().as_ref())
    }
}

impl<T: ReplicaView + ?Sized> ReplicaView for Arc<T> {
    fn id(&self) -> u32 {
        (**self).id()
    }
    fn name(&self) -> &str {
        (**self).name()
    }
    fn predictor_key(&self) -> ReplicaKey {
        (**self).predictor_key()
    }
    fn max_batched_tokens(&self) -> Option<u32> {
        (**self).max_batched_tokens()
    }
    fn serving(&self, model: &str) -> Serving {
        (**self).serving(model)
    }
    fn routable(&self) -> bool {
        (**self).routable()
    }
    fn scraped(&self) -> Option<Scraped> {
        (**self).scraped()
    }
    fn peer_load(&self) -> PeerLoad {
        (**self).peer_load()
    }
    fn ledger(&self) -> &Arc<Ledger> {
        (**self).ledger()
    }
    fn prefix_cursor(&self) -> &AtomicU64 {
        (**self).prefix_cursor()
    }
    fn remote_rtt_ms(&self) -> Option<f64> {
        (**self).remote_rtt_ms()
    }
    fn role(&self) -> Role {
        (**self).role()
    }
    fn light(&self) -> LightRead {
        (**self).light()
    }
}

/// A replica held in plain fields: what the simulator and tests fill directly.
#[derive(Debug)]
pub struct PlainReplica {
    pub id: u32,
    pub name: String,
    pub key: ReplicaKey,
    pub max_batched_tokens: Option<u32>,
    pub models: ServedModels,
    pub routable: bool,
    pub scraped: Option<Arc<Scraped>>,
    pub peer_load: PeerLoad,
    pub ledger: Arc<Ledger>,
    pub prefix_cursor: AtomicU64,
    /// In another region than the node's, this far (round trip, ms); `None` in region.
    pub remote_rtt_ms: Option<f64>,
    pub role: Role,
}

impl PlainReplica {
    /// A routable replica named `name` of class `class`, serving `model` with
    /// `max_model_len` of context; keys derive from the names as on every node.
    pub fn new(id: u32, name: &str, class: &str, model: &str, max_model_len: Option<u32>) -> Self {
        Self {
            id,
            name: name.to_string(),
            key: ReplicaKey::new(key_of(name), key_of(class)),
            max_batched_tokens: None,
            models: ServedModels {
                models: vec![ModelEntry {
                    id: model.to_string(),
                    parent: None,
                    max_model_len,
                }],
                known: true,
            },
            routable: true,
            scraped: None,
            peer_load: PeerLoad::default(),
            ledger: Ledger::new(),
            prefix_cursor: AtomicU64::new(0),
            remote_rtt_ms: None,
            role: Role::Both,
        }
    }
}

impl ReplicaView for PlainReplica {
    fn id(&self) -> u32 {
        self.id
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn predictor_key(&self) -> ReplicaKey {
        self.key
    }
    fn max_batched_tokens(&self) -> Option<u32> {
        self.max_batched_tokens
    }
    fn serving(&self, model: &str) -> Serving {
        self.models.serving(model)
    }
    fn routable(&self) -> bool {
        self.routable
    }
    fn scraped(&self) -> Option<Scraped> {
        self.scraped.as_deref().copied()
    }
    fn peer_load(&self) -> PeerLoad {
        self.peer_load
    }
    fn ledger(&self) -> &Arc<Ledger> {
        &self.ledger
    }
    fn prefix_cursor(&self) -> &AtomicU64 {
        &self.prefix_cursor
    }
    fn remote_rtt_ms(&self) -> Option<f64> {
        self.remote_rtt_ms
    }
    fn role(&self) -> Role {
        self.role
    }
}
