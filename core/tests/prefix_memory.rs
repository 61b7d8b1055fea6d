//! The prefix index's memory at millions of blocks: heap bytes per entry, measured
//! with a counting allocator, stay within `BYTES_PER_ENTRY`, and the entry count
//! within `max_entries` however many blocks arrive. Its own test binary, because the
//! counting allocator is process-wide.
//!
//! Run: `cargo test -p headroom-core --test prefix_memory -- --nocapture` (prints the
//! figures).

// SAFETY: the one `unsafe` in the workspace. `Counting` forwards every call unchanged
// to `System` (same layout, same pointer), so it upholds `GlobalAlloc`'s contract
// exactly as `System` does; it only adds to an atomic counter on the side.
#![allow(unsafe_code)]

use std::{
    alloc::{GlobalAlloc, Layout, System},
    sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed},
};

use headroom_core::prefix::{BYTES_PER_ENTRY, Cursor, PrefixIndex};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size(), Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size(), Relaxed);
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new, Relaxed);
        LIVE.fetch_sub(l.size(), Relaxed);
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static A: Counting = Counting;

/// Prompts of 64 blocks, a quarter of them sent to a second replica too (shared
/// prefixes), until `blocks` distinct blocks have been recorded.
fn fill(idx: &PrefixIndex, cursors: &[AtomicU64], blocks: u64) {
    let mut chain = Vec::with_capacity(64);
    for p in 0..blocks / 64 {
        chain.clear();
        chain.extend((0..64u64).map(|j| (p * 64 + j + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)));
        let r = (p % 8) as usize;
        idx.record(&cursors[r], r as u32, &chain, 0);
        if p % 4 == 0 {
            let s = (r + 1) % 8;
            idx.record(&cursors[s], s as u32, &chain, 0);
        }
    }
}

#[test]
fn bytes_per_entry_are_bounded_at_millions_of_blocks() {
    let cursors: Vec<AtomicU64> = (0..8).map(|_| AtomicU64::new(0)).collect();
    for (cap, blocks) in [(1usize << 20, 1u64 << 20), (1 << 21, 3 << 20)] {
        let before = LIVE.load(Relaxed);
        let idx = PrefixIndex::new(cap);
        fill(&idx, &cursors, blocks);
        let bytes = LIVE.load(Relaxed) - before;
        let n = idx.len();
        let per = bytes as f64 / n as f64;
        println!(
            "prefix index: max_entries {cap}, {blocks} blocks recorded → {n} entries, {:.1} MiB, {per:.1} bytes per entry",
            bytes as f64 / (1 << 20) as f64
        );
        assert!(n <= cap, "{n} entries over the cap {cap}");
        assert!(
            n >= cap / 2 || n as u64 >= blocks / 2,
            "kept too little: {n}"
        );
        assert!(
            per <= BYTES_PER_ENTRY as f64,
            "{per:.1} bytes per entry > {BYTES_PER_ENTRY}"
        );
        // The newest prompt is still found, by its two holders.
        let p = blocks / 64 - 4;
        let chain: Vec<u64> = (0..64u64)
            .map(|j| (p * 64 + j + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect();
        let view: Vec<Cursor> = (0..8)
            .map(|r| Cursor {
                replica: r,
                seq: cursors[r as usize].load(Relaxed),
                capacity: u64::MAX,
            })
            .collect();
        let mut out = [0u32; 8];
        idx.match_lengths(&chain, &view, &mut out);
        let r = (p % 8) as usize;
        assert_eq!((out[r], out[(r + 1) % 8]), (64, 64), "{out:?}");
        drop(idx);
    }
}
