//! The emulator's KV events: the engine's prefix-cache log turned into vLLM's
//! `BlockStored` / `BlockRemoved` batches, published with vLLM's framing and replay
//! protocol by [`headroom_kv_events::publisher`].
//!
//! Invariants:
//! - One batch per engine step that changed the prefix cache, in the log's order
//!   (an eviction precedes the store that reuses its block).
//! - Consecutive stored blocks of one request form one `BlockStored` (as vLLM
//!   sends them); `token_ids` are the prompt's tokens, and for blocks past the
//!   prompt (output) tokens derived from the block hash, since the emulator does
//!   not generate real tokens. Block hashes are the engine's (Headroom's chain), as
//!   integers, `medium` `GPU`, `lora_name` the adapter.
//! - Publishing never blocks the driver (bounded queue; overflow is counted and
//!   shows up as a sequence gap to subscribers, as with vLLM).

use std::collections::HashMap;
use std::sync::Arc;

use headroom_engine::{Engine, KvLog};
use headroom_kv_events::publisher::Publisher;
use headroom_kv_events::wire::{BlockRemoved, BlockStored, EventBatch, ExternalHash, KvEvent};

/// What `headroom-replica --kv-events-endpoint` configures.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvEventsOptions {
    /// PUB bind address, e.g. `tcp://127.0.0.1:5557`.
    pub endpoint: String,
    /// ROUTER replay bind address.
    pub replay_endpoint: Option<String>,
    pub topic: String,
    /// Batches kept for replay.
    pub buffer_steps: usize,
}

/// A submitted prompt, kept while its request is in the engine.
#[derive(Clone, Debug)]
pub struct KvPrompt {
    pub tokens: Arc<[u32]>,
    pub adapter: Option<String>,
}

/// The driver's publishing state.
pub struct KvPublish {
    publisher: Publisher,
    block_size: u32,
    prompts: HashMap<u64, KvPrompt>,
    log: Vec<KvLog>,
}

impl KvPublish {
    pub fn new(publisher: Publisher, block_size: u32) -> Self {
        KvPublish {
            publisher,
            block_size: block_size.max(1),
            prompts: HashMap::new(),
            log: Vec::new(),
        }
    }

    pub fn publisher(&self) -> &Publisher {
        &self.publisher
    }

    pub fn track(&mut self, id: u64, prompt: KvPrompt) {
        self.prompts.insert(id, prompt);
    }

    pub fn forget(&mut self, id: u64) {
        self.prompts.remove(&id);
    }

    fn tokens(&self, request: u64, block: u32, hash: u64) -> Vec<u32> {
        let bs = self.block_size as usize;
        let start = block as usize * bs;
        let prompt = self.prompts.get(&request).map(|p| &p.tokens[..]);
        (0..bs)
            .map(|o| {
                prompt
                    .and_then(|t| t.get(start + o).copied())
                    .unwrap_or_else(|| headroom_engine::hashing::token_for_hash_id(hash, o as u32))
            })
            .collect()
    }

    /// Publishes what the engine's last step changed (nothing when unchanged).
    pub fn flush(&mut self, engine: &mut Engine, ts: f64) {
        engine.drain_kv_log(&mut self.log);
        if self.log.is_empty() {
            return;
        }
        let mut events: Vec<KvEvent> = Vec::new();
        // (request, last block) of the BlockStored being extended.
        let mut open: Option<(u64, u32)> = None;
        let log = std::mem::take(&mut self.log);
        for ev in &log {
            match *ev {
                KvLog::Stored {
                    request,
                    block,
                    hash,
                    parent,
                } => {
                    let toks = self.tokens(request, block, hash);
                    if open == Some((request, block.wrapping_sub(1)))
                        && let Some(KvEvent::Stored(s)) = events.last_mut()
                    {
                        s.block_hashes.push(ExternalHash::Int(hash));
                        s.token_ids.extend_from_slice(&toks);
                    } else {
                        let adapter = self.prompts.get(&request).and_then(|p| p.adapter.clone());
                        events.push(KvEvent::Stored(BlockStored {
                            block_hashes: vec![ExternalHash::Int(hash)],
                            parent_block_hash: parent.map(ExternalHash::Int),
                            token_ids: toks,
                            block_size: self.block_size,
                            lora_id: None,
                            medium: Some("GPU".into()),
                            lora_name: adapter,
                            group_idx: None,
                        }));
                    }
                    open = Some((request, block));
                }
                KvLog::Removed { hash } => {
                    open = None;
                    match events.last_mut() {
                        Some(KvEvent::Removed(r)) => r.block_hashes.push(ExternalHash::Int(hash)),
                        _ => events.push(KvEvent::Removed(BlockRemoved {
                            block_hashes: vec![ExternalHash::Int(hash)],
                            medium: Some("GPU".into()),
                            group_idx: None,
                        })),
                    }
                }
            }
        }
        self.log = log;
        self.log.clear();
        self.publisher.try_publish(EventBatch {
            ts,
            events,
            data_parallel_rank: Some(0),
            unknown_events: 0,
        });
    }
}
