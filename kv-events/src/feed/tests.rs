use std::collections::HashMap;

use proptest::prelude::*;

use super::*;
use crate::chain::{chain_next, chain_root};
use crate::index::ReplicaId;
use crate::wire::{BlockRemoved, BlockStored, EventBatch, ExternalHash, KvEvent, encode_batch};

const BS: u32 = 4;

fn rid() -> ReplicaId {
    ReplicaId::new(0).expect("id")
}

fn feed(replay: bool) -> (Feed, BlockIndex) {
    (
        Feed::new(ReplicaBlocks::new(rid(), BS, 10_000), replay),
        BlockIndex::new(10_000),
    )
}

fn store(id: u64, parent: Option<u64>) -> KvEvent {
    KvEvent::Stored(BlockStored {
        block_hashes: vec![ExternalHash::Int(id)],
        parent_block_hash: parent.map(ExternalHash::Int),
        token_ids: vec![id as u32; BS as usize],
        block_size: BS,
        medium: Some("GPU".into()),
        ..Default::default()
    })
}

fn remove(id: u64) -> KvEvent {
    KvEvent::Removed(BlockRemoved {
        block_hashes: vec![ExternalHash::Int(id)],
        medium: Some("GPU".into()),
        group_idx: None,
    })
}

fn batch(ts: f64, events: Vec<KvEvent>) -> Bytes {
    Bytes::from(encode_batch(&EventBatch {
        ts,
        events,
        data_parallel_rank: Some(0),
        unknown_events: 0,
    }))
}

fn root_chain(id: u64) -> u64 {
    chain_next(chain_root(0), &[id as u32; BS as usize])
}

fn held(ix: &BlockIndex, id: u64) -> bool {
    ix.holders(root_chain(id)) & 1 != 0
}

/// Batch `i` stores root block `100 + i`.
fn stream(n: u64) -> Vec<Bytes> {
    (0..n)
        .map(|i| batch(i as f64, vec![store(100 + i, None)]))
        .collect()
}

/// A replay buffer holding `s` as batches 0, 1, ….
fn numbered(s: &[Bytes]) -> Vec<(u64, Bytes)> {
    s.iter()
        .cloned()
        .enumerate()
        .map(|(i, p)| (i as u64, p))
        .collect()
}

/// Runs replays until the feed needs none; more than 10 in a row is a livelock.
fn settle(f: &mut Feed, ix: &mut BlockIndex, buf: &[(u64, Bytes)], mut act: Action) {
    for _ in 0..10 {
        let Action::Replay { from } = act else {
            return;
        };
        act = replay(f, ix, buf, from);
    }
    panic!("replays never settle: {:?}", f.status());
}

fn replay(f: &mut Feed, ix: &mut BlockIndex, buf: &[(u64, Bytes)], from: u64) -> Action {
    for (s, p) in buf.iter().filter(|(s, _)| *s >= from) {
        f.replay_entry(ix, *s, p);
    }
    f.replay_end(ix)
}

#[test]
fn in_order_from_zero_is_precise_and_duplicates_drop() {
    let (mut f, mut ix) = feed(true);
    assert_eq!(f.state(), FeedState::Approximate);
    let s = stream(3);
    for (i, p) in s.iter().enumerate() {
        assert_eq!(f.live(&mut ix, i as u64, p.clone()), Action::None);
    }
    assert_eq!(f.state(), FeedState::Precise);
    assert!(held(&ix, 100) && held(&ix, 102));
    assert_eq!(f.live(&mut ix, 1, s[1].clone()), Action::None);
    assert_eq!(f.status().counters.duplicates, 1);
    assert_eq!(f.state(), FeedState::Precise);
}

#[test]
fn gap_is_filled_by_replay_from_the_last_applied_batch() {
    let (mut f, mut ix) = feed(true);
    let s = stream(6);
    let buf = numbered(&s);
    f.live(&mut ix, 0, s[0].clone());
    f.live(&mut ix, 1, s[1].clone());
    // 2 and 3 lost; 4 arrives.
    assert_eq!(f.live(&mut ix, 4, s[4].clone()), Action::Replay { from: 1 });
    // 5 arrives during the replay and waits.
    assert_eq!(f.live(&mut ix, 5, s[5].clone()), Action::None);
    assert_eq!(replay(&mut f, &mut ix, &buf[..5], 1), Action::None);
    assert_eq!(f.state(), FeedState::Precise);
    assert_eq!(f.status().next_seq, Some(6));
    assert!((100..106).all(|id| held(&ix, id)));
    assert_eq!(f.status().counters.gaps, 1);
}

#[test]
fn restart_seen_in_replay_refetches_from_zero() {
    let (mut f, mut ix) = feed(true);
    let old = stream(5);
    for (i, p) in old.iter().enumerate() {
        f.live(&mut ix, i as u64, p.clone());
    }
    // The engine restarted and published 6 new batches; we reconnect.
    let new: Vec<(u64, Bytes)> = (0..6)
        .map(|i| (i, batch(1e6 + i as f64, vec![store(900 + i, None)])))
        .collect();
    assert_eq!(f.connected(&mut ix), Action::Replay { from: 4 });
    assert_eq!(replay(&mut f, &mut ix, &new, 4), Action::Replay { from: 0 });
    assert_eq!(replay(&mut f, &mut ix, &new, 0), Action::None);
    assert_eq!(f.state(), FeedState::Precise);
    assert!(!held(&ix, 100), "the old engine's blocks are gone");
    assert!((900..906).all(|id| held(&ix, id)));
    assert_eq!(f.status().counters.restarts, 1);
}

#[test]
fn live_seq_regression_is_a_restart() {
    let (mut f, mut ix) = feed(false);
    for (i, p) in stream(4).iter().enumerate() {
        f.live(&mut ix, i as u64, p.clone());
    }
    f.live(&mut ix, 0, batch(7e6, vec![store(500, None)]));
    assert_eq!(f.state(), FeedState::Precise);
    assert!(held(&ix, 500) && !held(&ix, 100));
}

#[test]
fn rolled_over_buffer_recovers_until_a_reset() {
    let (mut f, mut ix) = feed(true);
    let s = stream(10);
    // Subscribing late: first frame 8; the buffer only holds 5..10.
    assert_eq!(f.live(&mut ix, 8, s[8].clone()), Action::Replay { from: 0 });
    let buf: Vec<(u64, Bytes)> = (5..10).map(|i| (i, s[i as usize].clone())).collect();
    assert_eq!(replay(&mut f, &mut ix, &buf, 0), Action::None);
    assert_eq!(f.state(), FeedState::Recovering);
    assert!(held(&ix, 105) && !held(&ix, 104));
    f.live(
        &mut ix,
        10,
        batch(10.0, vec![KvEvent::AllCleared, store(1, None)]),
    );
    assert_eq!(f.state(), FeedState::Precise);
    assert!(held(&ix, 1) && !held(&ix, 105));
}

#[test]
fn without_replay_a_gap_resyncs_and_orphans_are_skipped() {
    let (mut f, mut ix) = feed(false);
    f.live(&mut ix, 0, batch(0.0, vec![store(1, None)]));
    f.live(
        &mut ix,
        2,
        batch(2.0, vec![store(2, Some(1)), store(3, None)]),
    );
    assert_eq!(f.state(), FeedState::Recovering);
    assert!(!held(&ix, 1) && held(&ix, 3));
    assert_eq!(f.status().apply.orphaned_blocks, 1);
}

#[test]
fn garbage_payload_and_failed_replay_resync() {
    let (mut f, mut ix) = feed(true);
    f.live(&mut ix, 0, batch(0.0, vec![store(1, None)]));
    f.live(&mut ix, 1, Bytes::from_static(b"\xc1garbage"));
    assert_eq!(f.status().counters.undecodable, 1);
    assert_eq!(f.state(), FeedState::Recovering);
    assert!(!held(&ix, 1));
    assert_eq!(
        f.live(&mut ix, 5, batch(5.0, vec![store(5, None)])),
        Action::Replay { from: 1 }
    );
    assert_eq!(f.replay_failed(&mut ix), Action::None);
    assert_eq!(f.state(), FeedState::Recovering);
    assert!(
        held(&ix, 5),
        "the pending frame is followed after the failure"
    );
    f.mark_stale();
    assert_eq!(f.state(), FeedState::Approximate);
    f.live(&mut ix, 6, batch(6.0, vec![]));
    assert_eq!(f.state(), FeedState::Recovering);
}

#[test]
fn silence_asks_the_replay_endpoint_for_a_lost_last_batch() {
    let (mut f, mut ix) = feed(true);
    let s = stream(3);
    let buf = numbered(&s);
    f.live(&mut ix, 0, s[0].clone());
    f.live(&mut ix, 1, s[1].clone());
    // Batch 2 is the last one published and never arrives live: no later frame
    // shows the gap, only the silence does.
    assert_eq!(f.silent(), Action::Replay { from: 1 });
    assert_eq!(f.state(), FeedState::Approximate);
    assert_eq!(replay(&mut f, &mut ix, &buf, 1), Action::None);
    assert_eq!(f.state(), FeedState::Precise);
    assert!(held(&ix, 102));
    assert_eq!(f.status().next_seq, Some(3));

    // Silence again, and the engine's buffer holds nothing new: it did not publish
    // what the router expected, so the replica stays approximate and keeps its blocks.
    assert_eq!(f.silent(), Action::Replay { from: 2 });
    assert_eq!(replay(&mut f, &mut ix, &buf, 2), Action::None);
    assert_eq!(f.state(), FeedState::Approximate);
    assert!(held(&ix, 100) && held(&ix, 102));
    // A silence check whose replay fails resyncs nothing either.
    assert_eq!(f.silent(), Action::Replay { from: 2 });
    assert_eq!(f.replay_failed(&mut ix), Action::None);
    assert_eq!(f.state(), FeedState::Approximate);
    assert!(held(&ix, 100) && held(&ix, 102));
    assert_eq!(f.status().counters.resyncs, 0);
    // The next live batch makes it precise again.
    f.live(&mut ix, 3, batch(3.0, vec![store(103, None)]));
    assert_eq!(f.state(), FeedState::Precise);

    // Without a replay endpoint, silence only marks the feed stale.
    let (mut g, mut gx) = feed(false);
    g.live(&mut gx, 0, s[0].clone());
    assert_eq!(g.silent(), Action::None);
    assert_eq!(g.state(), FeedState::Approximate);
}

/// A model engine: stores root and child blocks, evicts, sometimes resets; every
/// batch kept (the replay buffer holds the last `buffer`).
fn engine_batches(ops: &[(u8, u8)]) -> (Vec<Bytes>, HashMap<u64, u64>) {
    let mut truth: HashMap<u64, u64> = HashMap::new(); // engine id → chain
    let mut next_id = 1u64;
    let mut out = Vec::new();
    for (i, &(kind, pick)) in ops.iter().enumerate() {
        let mut evs = Vec::new();
        match kind % 8 {
            0..=3 => {
                let id = next_id;
                next_id += 1;
                let parent = (kind % 8 >= 2 && !truth.is_empty()).then(|| {
                    *truth
                        .keys()
                        .nth(pick as usize % truth.len())
                        .expect("nonempty")
                });
                let pc = parent.map_or(chain_root(0), |p| truth[&p]);
                truth.insert(id, chain_next(pc, &[id as u32; BS as usize]));
                evs.push(store(id, parent));
            }
            4..=6 if !truth.is_empty() => {
                let id = *truth
                    .keys()
                    .nth(pick as usize % truth.len())
                    .expect("nonempty");
                truth.remove(&id);
                evs.push(remove(id));
            }
            7 if pick % 16 == 0 => {
                truth.clear();
                evs.push(KvEvent::AllCleared);
            }
            _ => {}
        }
        out.push(batch(i as f64, evs));
    }
    (out, truth)
}

proptest! {
    /// Whatever is lost, duplicated or replayed: a `precise` feed's index equals
    /// the engine's blocks, a `recovering` one holds a subset of them.
    #[test]
    fn index_tracks_the_engine_through_loss(
        ops in proptest::collection::vec((0u8..8, 0u8..255), 1..120),
        loss in proptest::collection::vec(0u8..10, 120),
        buffer in 1usize..40,
        has_replay in proptest::bool::ANY,
    ) {
        let (batches, truth) = engine_batches(&ops);
        let (mut f, mut ix) = feed(has_replay);
        let mut act = Action::None;
        for (i, p) in batches.iter().enumerate() {
            let seq = i as u64;
            let buf: Vec<(u64, Bytes)> = batches.iter().cloned().enumerate()
                .map(|(j, p)| (j as u64, p)).skip((i + 1).saturating_sub(buffer)).take_while(|(j, _)| *j <= seq).collect();
            settle(&mut f, &mut ix, &buf, act);
            act = Action::None;
            match loss[i % loss.len()] {
                0 | 1 => {}                                     // lost
                2 => { act = f.live(&mut ix, seq, p.clone());   // duplicated
                       if act == Action::None { act = f.live(&mut ix, seq, p.clone()); } }
                _ => act = f.live(&mut ix, seq, p.clone()),
            }
        }
        let buf: Vec<(u64, Bytes)> = batches.iter().cloned().enumerate()
            .map(|(j, p)| (j as u64, p)).skip(batches.len().saturating_sub(buffer)).collect();
        settle(&mut f, &mut ix, &buf, act);
        // A final reconnect catches up whatever was lost at the tail.
        let act = f.connected(&mut ix);
        settle(&mut f, &mut ix, &buf, act);
        prop_assert!(ix.check().is_ok());
        let want: std::collections::HashSet<u64> = truth.values().copied().collect();
        let mut got = std::collections::HashSet::new();
        for c in want.iter() { if ix.holders(*c) & 1 != 0 { got.insert(*c); } }
        prop_assert_eq!(ix.len(), got.len(), "index holds chains the engine does not");
        if f.state() == FeedState::Precise {
            prop_assert_eq!(got, want);
        }
    }
}
