//! Block-level invariants of the engine: LRU eviction order through real requests,
//! and random workloads that must conserve blocks and finish every request.

use std::collections::HashMap;

use headroom_engine::{Engine, EngineRequest, Event, Profile, block_hashes_for_tokens};
use proptest::prelude::*;

fn small_profile(blocks: u32) -> Profile {
    let mut p = Profile::by_name("a100-llama3-8b").expect("profile");
    p.num_gpu_blocks = blocks;
    p.max_model_len = ((blocks - 1) * 16).min(4096);
    p
}

fn hashes(group: u32, len: u32) -> Vec<u64> {
    let toks: Vec<u32> = (0..len)
        .map(|i| i.wrapping_mul(40_503) ^ (group << 20))
        .collect();
    block_hashes_for_tokens(&toks, 16)
}

fn drain(e: &mut Engine) -> Vec<Event> {
    let mut out = Vec::new();
    for _ in 0..200_000 {
        if e.is_idle() {
            return out;
        }
        e.step();
        out.extend_from_slice(e.events());
    }
    panic!("did not drain");
}

fn cached_of(events: &[Event], id: u64) -> u32 {
    events
        .iter()
        .find_map(|e| match e {
            Event::Finished {
                id: i,
                cached_tokens,
                ..
            } if *i == id => Some(*cached_tokens),
            _ => None,
        })
        .expect("finished")
}

#[test]
fn least_recently_used_prefix_is_evicted_first_and_suffixes_before_prefixes() {
    let mut e = Engine::new(&small_profile(300), 0).expect("engine"); // 299 usable
    e.submit(EngineRequest::new(1, 1600, hashes(1, 1600), 1))
        .expect("A"); // 100 blocks
    drain(&mut e);
    e.submit(EngineRequest::new(2, 1600, hashes(2, 1600), 1))
        .expect("B");
    drain(&mut e);
    // C needs 188 blocks: 99 never-used ones, then 89 of A's (the older release),
    // A's LAST blocks first. B stays whole and A keeps its first 11 blocks.
    e.submit(EngineRequest::new(3, 3000, hashes(3, 3000), 1))
        .expect("C");
    drain(&mut e);
    e.check_invariants().expect("invariants");
    // B hits 99 blocks and allocates 1: the LRU head is A's 11th block.
    e.submit(EngineRequest::new(4, 1600, hashes(2, 1600), 1))
        .expect("B again");
    let ev = drain(&mut e);
    assert_eq!(
        cached_of(&ev, 4),
        99 * 16,
        "B fully cached (minus the last block)"
    );
    e.submit(EngineRequest::new(5, 1600, hashes(1, 1600), 1))
        .expect("A again");
    let ev = drain(&mut e);
    assert_eq!(
        cached_of(&ev, 5),
        10 * 16,
        "A kept only its 10 leading blocks"
    );
    e.check_invariants().expect("invariants");
}

#[test]
fn preempted_request_resumes_from_its_cached_blocks() {
    let mut e = Engine::new(&small_profile(200), 0).expect("engine"); // 199 usable
    // Two requests whose decode growth overflows KV: the newer one is preempted,
    // then re-admitted with prefix hits on its own (prompt and output) blocks.
    e.submit(EngineRequest::new(1, 1500, hashes(1, 1500), 1500))
        .expect("a");
    e.submit(EngineRequest::new(2, 1500, hashes(2, 1500), 1500))
        .expect("b");
    let ev = drain(&mut e);
    let st = e.stats();
    assert!(st.preemptions >= 1);
    assert!(ev.iter().any(|x| matches!(x, Event::Preempted { id: 2 })));
    assert!(
        st.prefix_cache_hits > 0,
        "re-admission after preemption hits the blocks it left in the LRU"
    );
    assert_eq!(st.generation_tokens, 3000);
}

#[derive(Debug, Clone)]
enum Op {
    Submit { group: u32, len: u32, out: u32 },
    Steps(u8),
    Abort(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u32..4, 1u32..2500, 1u32..400).prop_map(|(group, len, out)| Op::Submit {
            group,
            len,
            out
        }),
        (1u8..30).prop_map(Op::Steps),
        any::<u8>().prop_map(Op::Abort),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn random_workloads_conserve_blocks_and_finish_everything(ops in prop::collection::vec(op(), 1..60)) {
        let mut e = Engine::new(&small_profile(420), 9).expect("engine");
        let mut want: HashMap<u64, u32> = HashMap::new();
        let mut next = 0u64;
        let mut got: HashMap<u64, u32> = HashMap::new();
        let mut finished: HashMap<u64, u32> = HashMap::new();
        let note = |evs: &[Event], got: &mut HashMap<u64, u32>, fin: &mut HashMap<u64, u32>| {
            for ev in evs {
                match ev {
                    Event::FirstToken { id, .. } | Event::Token { id, .. } => *got.entry(*id).or_default() += 1,
                    Event::Finished { id, output_tokens, .. } => { fin.insert(*id, *output_tokens); }
                    Event::Preempted { .. } => {}
                }
            }
        };
        for op in ops {
            match op {
                Op::Submit { group, len, out } => {
                    let h = hashes(group, len);
                    e.submit(EngineRequest::new(next, len, h, out)).expect("fits");
                    want.insert(next, out);
                    next += 1;
                }
                Op::Steps(n) => for _ in 0..n {
                    e.step();
                    note(e.events(), &mut got, &mut finished);
                    prop_assert!(e.check_invariants().is_ok(), "{:?}", e.check_invariants());
                },
                Op::Abort(k) => if next > 0 {
                    let id = u64::from(k) % next;
                    if e.abort(id) { want.remove(&id); got.remove(&id); }
                },
            }
            prop_assert!(e.check_invariants().is_ok(), "{:?}", e.check_invariants());
        }
        while !e.is_idle() {
            e.step();
            note(e.events(), &mut got, &mut finished);
        }
        prop_assert!(e.check_invariants().is_ok());
        prop_assert_eq!(e.stats().free_blocks, 419);
        for (id, out) in &want {
            prop_assert_eq!(finished.get(id), Some(out), "request {} finished with its length", id);
            prop_assert_eq!(got.get(id), Some(out), "request {} got each token once", id);
        }
    }
}
