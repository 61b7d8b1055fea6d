//! Turns one chitchat cluster's state into [`MeshEvent`]s and member snapshots.
//!
//! Invariants:
//! - chitchat's mutex is held only to copy out what changed (versions are compared under
//!   the lock; values of changed keys are cloned); decoding and event fan-out happen after
//!   it is released.
//! - A node's keys are rescanned only when its (max_version, last_gc_version) changed or it
//!   came back to life, so a quiet cluster costs O(nodes) per pass.
//! - Values are reported only for live members; a member that dies gets `MemberLeft` and
//!   its cache is cleared, so rejoining replays its current values.
//! - A value whose frame is refused is counted once per version; payloads are passed on
//!   undecoded (the user decodes them).

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use chitchat::{Chitchat, ChitchatId, Heartbeat};
use parking_lot::Mutex;
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

use crate::clock::now_ms;
use crate::events::{EventHub, MemberInfo, MemberSnap, MeshEvent, Scope, try_send};
use crate::keys::{REGION_KEY, RESERVED_PREFIX};
use crate::stats::Counters;
use crate::transport::KnownPeers;
use crate::wire::{self, Value};

/// Shared between the observer task and the mesh handle.
pub(crate) struct ObserverShared {
    pub notify: Notify,
    pub replays: Mutex<Vec<mpsc::Sender<MeshEvent>>>,
    pub members: ArcSwap<Vec<MemberSnap>>,
}

impl ObserverShared {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            notify: Notify::new(),
            replays: Mutex::new(Vec::new()),
            members: ArcSwap::from_pointee(Vec::new()),
        })
    }
}

#[derive(Default)]
struct NodeView {
    live: bool,
    sig: (u64, u64),
    heartbeat: Heartbeat,
    last_seen: Option<Instant>,
    region: Option<String>,
    /// key → (version, decoded value or None if refused)
    keys: HashMap<String, (u64, Option<(Value, u64)>)>,
}

pub(crate) struct Observer {
    pub scope: Scope,
    pub chitchat: Arc<tokio::sync::Mutex<Chitchat>>,
    pub shared: Arc<ObserverShared>,
    pub hub: Arc<EventHub>,
    pub counters: Arc<Counters>,
    pub known: Arc<KnownPeers>,
    pub max_value_bytes: usize,
    pub interval: Duration,
    pub cancel: CancellationToken,
    nodes: HashMap<ChitchatId, NodeView>,
}

/// What a pass copied out from under the lock.
struct Changes {
    joined: Vec<ChitchatId>,
    left: Vec<ChitchatId>,
    values: Vec<(ChitchatId, String, u64, String)>,
    removed: Vec<(ChitchatId, String)>,
}

impl Observer {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        scope: Scope,
        chitchat: Arc<tokio::sync::Mutex<Chitchat>>,
        shared: Arc<ObserverShared>,
        hub: Arc<EventHub>,
        counters: Arc<Counters>,
        known: Arc<KnownPeers>,
        max_value_bytes: usize,
        interval: Duration,
        cancel: CancellationToken,
    ) -> Self {
        Self {
            scope,
            chitchat,
            shared,
            hub,
            counters,
            known,
            max_value_bytes,
            interval,
            cancel,
            nodes: HashMap::new(),
        }
    }

    pub async fn run(mut self) {
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = self.cancel.cancelled() => break,
                _ = self.shared.notify.notified() => {},
                _ = tick.tick() => {},
            }
            self.pass().await;
        }
    }

    async fn pass(&mut self) {
        let changes = {
            let chitchat = self.chitchat.clone();
            let cc = chitchat.lock().await;
            self.collect(&cc)
        };
        // Views and member snapshots are updated before events go out, so a consumer
        // reacting to an event sees `members()` agree with it.
        let events = self.apply(changes);
        self.publish_members();
        for ev in events {
            self.hub.emit(ev);
        }
        self.replay();
    }

    fn collect(&mut self, cc: &Chitchat) -> Changes {
        let now = Instant::now();
        let self_id = cc.self_chitchat_id().clone();
        let live: HashSet<&ChitchatId> = cc.live_nodes().collect();
        let mut ch = Changes {
            joined: Vec::new(),
            left: Vec::new(),
            values: Vec::new(),
            removed: Vec::new(),
        };
        let states = cc.node_states();
        for (id, ns) in states {
            if *id == self_id {
                continue;
            }
            let view = self.nodes.entry(id.clone()).or_default();
            if view.heartbeat != ns.heartbeat() {
                view.heartbeat = ns.heartbeat();
                view.last_seen = Some(now);
            }
            let is_live = live.contains(id);
            if !is_live {
                if view.live {
                    view.live = false;
                    view.sig = (0, 0);
                    view.keys.clear();
                    ch.left.push(id.clone());
                }
                continue;
            }
            let sig = (ns.max_version(), ns.last_gc_version());
            let rejoined = !view.live;
            if rejoined {
                view.live = true;
                ch.joined.push(id.clone());
            }
            if !rejoined && sig == view.sig {
                continue;
            }
            view.sig = sig;
            let mut present: HashSet<&str> = HashSet::new();
            for (k, vv) in ns.key_values_including_deleted() {
                if vv.is_deleted() {
                    continue;
                }
                if k == REGION_KEY {
                    view.region = Some(vv.value.clone());
                    continue;
                }
                if k.starts_with(RESERVED_PREFIX) {
                    continue;
                }
                present.insert(k);
                if view.keys.get(k).map(|e| e.0) != Some(vv.version) {
                    ch.values
                        .push((id.clone(), k.to_string(), vv.version, vv.value.clone()));
                }
            }
            let gone: Vec<String> = view
                .keys
                .keys()
                .filter(|k| !present.contains(k.as_str()))
                .cloned()
                .collect();
            for k in gone {
                view.keys.remove(&k);
                ch.removed.push((id.clone(), k));
            }
        }
        // Nodes chitchat forgot entirely (dead-node grace period over).
        let forgotten: Vec<ChitchatId> = self
            .nodes
            .keys()
            .filter(|id| !states.contains_key(*id))
            .cloned()
            .collect();
        for id in forgotten {
            if let Some(v) = self.nodes.remove(&id)
                && v.live
            {
                ch.left.push(id);
            }
        }
        ch
    }

    fn apply(&mut self, ch: Changes) -> Vec<MeshEvent> {
        let scope = self.scope;
        let mut events = Vec::new();
        for id in &ch.joined {
            let region = self.nodes.get(id).and_then(|v| v.region.clone());
            events.push(MeshEvent::MemberJoined {
                node: id.node_id.clone(),
                scope,
                region,
                addr: id.gossip_advertise_addr,
            });
        }
        for (id, key, version, text) in ch.values {
            let decoded = match wire::decode_text(&text, self.max_value_bytes) {
                Ok(d) => Some((d.value, d.published_at_ms)),
                Err(r) => {
                    self.counters.reject(r);
                    None
                }
            };
            if let Some((value, at)) = &decoded {
                events.push(MeshEvent::Value {
                    node: id.node_id.clone(),
                    scope,
                    key: key.clone(),
                    value: value.clone(),
                    age: self.hub.skew.value_age(&id.node_id, *at, now_ms()),
                });
            }
            if let Some(view) = self.nodes.get_mut(&id) {
                view.keys.insert(key, (version, decoded));
            }
        }
        for (id, key) in ch.removed {
            events.push(MeshEvent::ValueRemoved {
                node: id.node_id.clone(),
                scope,
                key,
            });
        }
        for id in ch.left {
            events.push(MeshEvent::MemberLeft {
                node: id.node_id.clone(),
                scope,
            });
        }
        events
    }

    fn publish_members(&self) {
        let mut known: HashMap<SocketAddr, Arc<str>> = HashMap::new();
        let mut out = Vec::with_capacity(self.nodes.len());
        for (id, v) in &self.nodes {
            if v.live {
                known.insert(id.gossip_advertise_addr, id.node_id.clone());
            }
            let mut keys: Vec<String> = v.keys.keys().cloned().collect();
            keys.sort();
            out.push(MemberSnap {
                info: MemberInfo {
                    node_id: id.node_id.clone(),
                    scope: self.scope,
                    region: v.region.clone(),
                    live: v.live,
                    last_seen_age: Duration::ZERO,
                    keys,
                    addr: id.gossip_advertise_addr,
                    generation: id.generation_id,
                    is_self: false,
                },
                last_seen: v.last_seen.unwrap_or_else(Instant::now),
            });
        }
        self.known.store(Arc::new(known));
        self.shared.members.store(Arc::new(out));
    }

    /// Sends the full current view to subscribers that joined since the last pass.
    fn replay(&self) {
        let pending: Vec<_> = std::mem::take(&mut *self.shared.replays.lock());
        for tx in pending {
            for (id, v) in self.nodes.iter().filter(|(_, v)| v.live) {
                try_send(
                    &tx,
                    MeshEvent::MemberJoined {
                        node: id.node_id.clone(),
                        scope: self.scope,
                        region: v.region.clone(),
                        addr: id.gossip_advertise_addr,
                    },
                    &self.counters,
                );
                for (key, (_, val)) in &v.keys {
                    if let Some((value, at)) = val {
                        try_send(
                            &tx,
                            MeshEvent::Value {
                                node: id.node_id.clone(),
                                scope: self.scope,
                                key: key.clone(),
                                value: value.clone(),
                                age: self.hub.skew.value_age(&id.node_id, *at, now_ms()),
                            },
                            &self.counters,
                        );
                    }
                }
            }
        }
    }
}
