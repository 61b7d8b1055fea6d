//! A replica's scrape and peers' load, each a copy cell (seqlock) beside the few numbers
//! a shortlist reads of every replica (`ReplicaView::light`).
//!
//! Why: on a fleet of 1,024 the shortlist's light pass reads every eligible replica,
//! and copying the two cells whole (≈ 100 and ≈ 130 bytes through crossbeam's striped
//! seqlocks) was 12% of a decision. The numbers are written after their cell, each an
//! `f64` or `u64` in its own atomic: a reader may pair a new cell with old numbers for
//! an instant, which only delays by one write what the next decision sees.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crossbeam_utils::atomic::AtomicCell;
use headroom_core::{
    scraped::Scraped,
    view::{LightRead, PeerLoad, ScrapeShape},
};

/// `u64::MAX` stands for `None` in the `Option<u64>` and `Option<u32>` slots.
const NONE: u64 = u64::MAX;

/// The last scrape, and its time, KV capacity and engine block.
#[derive(Debug)]
pub struct ScrapedCell {
    cell: AtomicCell<Option<Scraped>>,
    /// f64 bits of `at_s`; NaN before the first scrape.
    at_s: AtomicU64,
    kv_capacity_tokens: AtomicU64,
    block_size: AtomicU64,
}

impl Default for ScrapedCell {
    fn default() -> Self {
        Self {
            cell: AtomicCell::new(None),
            at_s: AtomicU64::new(f64::NAN.to_bits()),
            kv_capacity_tokens: AtomicU64::new(NONE),
            block_size: AtomicU64::new(NONE),
        }
    }
}

impl ScrapedCell {
    pub fn load(&self) -> Option<Scraped> {
        self.cell.load()
    }

    pub fn store(&self, s: Option<Scraped>) {
        self.cell.store(s);
        let (at, cap, block) = match s {
            Some(s) => (
                s.at_s,
                s.kv_capacity_tokens().unwrap_or(NONE),
                s.block_size.map_or(NONE, u64::from),
            ),
            None => (f64::NAN, NONE, NONE),
        };
        self.kv_capacity_tokens.store(cap, Relaxed);
        self.block_size.store(block, Relaxed);
        self.at_s.store(at.to_bits(), Relaxed);
    }

    /// The scrape's shape without copying the scrape.
    pub fn shape(&self) -> Option<ScrapeShape> {
        let at_s = f64::from_bits(self.at_s.load(Relaxed));
        if at_s.is_nan() {
            return None;
        }
        let some = |x: u64| (x != NONE).then_some(x);
        Some(ScrapeShape {
            at_s,
            kv_capacity_tokens: some(self.kv_capacity_tokens.load(Relaxed)),
            block_size: some(self.block_size.load(Relaxed)).map(|b| b as u32),
        })
    }
}

/// Peers' load here, and its two outstanding-token terms.
#[derive(Debug)]
pub struct PeerLoadCell {
    cell: AtomicCell<PeerLoad>,
    /// f64 bits of `load.queued_prefill_tokens` and `load.decode_remaining_tokens`.
    queued_prefill_tokens: AtomicU64,
    decode_remaining_tokens: AtomicU64,
}

impl Default for PeerLoadCell {
    fn default() -> Self {
        Self {
            cell: AtomicCell::new(PeerLoad::default()),
            queued_prefill_tokens: AtomicU64::new(0f64.to_bits()),
            decode_remaining_tokens: AtomicU64::new(0f64.to_bits()),
        }
    }
}

impl PeerLoadCell {
    pub fn load(&self) -> PeerLoad {
        self.cell.load()
    }

    pub fn store(&self, p: PeerLoad) {
        self.cell.store(p);
        self.queued_prefill_tokens
            .store(p.load.queued_prefill_tokens.to_bits(), Relaxed);
        self.decode_remaining_tokens
            .store(p.load.decode_remaining_tokens.to_bits(), Relaxed);
    }
}

/// The light read of a replica's two cells.
pub fn light(scraped: &ScrapedCell, peers: &PeerLoadCell) -> LightRead {
    LightRead {
        peer_queued_prefill_tokens: f64::from_bits(peers.queued_prefill_tokens.load(Relaxed)),
        peer_decode_remaining_tokens: f64::from_bits(peers.decode_remaining_tokens.load(Relaxed)),
        scrape: scraped.shape(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use headroom_core::{ledger::Load, scraped::EngineKind};

    /// The light read equals the one made from copies of the cells, before the first
    /// store, after stores, and after a scrape is cleared.
    #[test]
    fn the_light_read_is_the_cells_own() {
        let (s, p) = (ScrapedCell::default(), PeerLoadCell::default());
        let from_copies =
            |s: &ScrapedCell, p: &PeerLoadCell| LightRead::of(&p.load(), s.load().as_ref());
        assert_eq!(light(&s, &p), from_copies(&s, &p));
        let scrape = Scraped {
            at_s: 12.5,
            engine: EngineKind::Vllm,
            running: 3.0,
            waiting: 1.0,
            kv_usage: Some(0.4),
            num_gpu_blocks: Some(27_000),
            block_size: Some(16),
            prefix_queries: 0.0,
            prefix_hits: 0.0,
            preemptions: 0.0,
            preemption_rate: 0.0,
            rejected_values: 0,
        };
        s.store(Some(scrape));
        p.store(PeerLoad {
            load: Load {
                queued_prefill_tokens: 1234.5,
                decode_remaining_tokens: 99.0,
                requests: 4.0,
                ..Load::default()
            },
            updated_s: 12.0,
        });
        let l = light(&s, &p);
        assert_eq!(l, from_copies(&s, &p));
        assert_eq!(
            l.scrape.and_then(|x| x.kv_capacity_tokens),
            Some(27_000 * 16)
        );
        s.store(Some(Scraped {
            num_gpu_blocks: None,
            block_size: None,
            ..scrape
        }));
        assert_eq!(light(&s, &p), from_copies(&s, &p));
        s.store(None);
        assert_eq!(light(&s, &p), from_copies(&s, &p));
        assert_eq!(light(&s, &p).scrape, None);
    }
}
