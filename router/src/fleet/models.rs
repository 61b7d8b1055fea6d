//! A replica's served-models list, and a per-thread memo of the decision's question
//! ("does it serve this model, with what context?").
//!
//! Why: every decision asks it of every replica, and an `ArcSwap` load (two atomic
//! read-modify-writes) plus a scan of the list was ≈ 7% of a decision at 100 to 1,024
//! candidates. The list changes only when `/v1/models` answers differently, so each
//! store sets a new version and a thread reuses its last answer while the version (one
//! plain load; a unique stamp per store) and the model asked about are the same.

use std::{
    cell::RefCell,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use arc_swap::{ArcSwap, Guard};
use headroom_core::view::{ServedModels, Serving};

/// The list, and the stamp of its last store.
#[derive(Debug, Default)]
pub struct ModelsCell {
    list: ArcSwap<ServedModels>,
    /// Unique in the process per store (0: never stored, the empty list, whose answers
    /// are the same in every cell): a memo slot that names it names this cell's list,
    /// whichever replica (of whichever fleet) had the slot before.
    version: AtomicU64,
}

/// Stamps for [`ModelsCell::store`].
static STAMPS: AtomicU64 = AtomicU64::new(1);

impl ModelsCell {
    pub fn load(&self) -> Guard<Arc<ServedModels>> {
        self.list.load()
    }

    /// Replaces the list; answers memoised before are not used after it.
    pub fn store(&self, models: Arc<ServedModels>) {
        let stamp = STAMPS.fetch_add(1, Ordering::Relaxed);
        self.list.store(models);
        // After the store, as a read-modify-write: a reader that sees this stamp then
        // loads this list or a later one (also past concurrent stores, whose swaps
        // chain), so a memo tagged with it is never older than the list it names.
        self.version.swap(stamp, Ordering::AcqRel);
    }

    /// Whether `replica` (this cell's owner, a process-local id) serves `model`:
    /// the list's own answer, from this thread's memo while nothing changed.
    pub fn serving(&self, replica: u32, model: &str) -> Serving {
        let version = self.version.load(Ordering::Acquire);
        MEMO.with(|m| {
            let mut m = m.borrow_mut();
            if m.model != model {
                // Another model asked about: every slot's answer is for the old one.
                m.model.clear();
                m.model.push_str(model);
                m.generation = m.generation.wrapping_add(1);
            }
            let generation = m.generation;
            let slot = &mut m.slots[replica as usize % SLOTS];
            if slot.replica == replica && slot.version == version && slot.generation == generation {
                return slot.serving;
            }
            let serving = self.list.load().serving(model);
            *slot = Slot {
                replica,
                generation,
                version,
                serving,
            };
            serving
        })
    }
}

/// Slots per thread (direct-mapped by replica id): a fleet of this many replicas or
/// fewer never evicts an answer; 32 bytes each.
const SLOTS: usize = 4096;

#[derive(Clone, Copy)]
struct Slot {
    replica: u32,
    /// The thread's `Memo::generation` when filled (which model it answers for).
    generation: u32,
    version: u64,
    serving: Serving,
}

struct Memo {
    model: String,
    generation: u32,
    slots: Box<[Slot]>,
}

thread_local! {
    static MEMO: RefCell<Memo> = RefCell::new(Memo {
        model: String::new(),
        generation: 0,
        // No replica has id u32::MAX (ids count up from 0): every slot starts empty.
        slots: vec![
            Slot {
                replica: u32::MAX,
                generation: 0,
                version: 0,
                serving: Serving::NotYetKnown,
            };
            SLOTS
        ]
        .into_boxed_slice(),
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use headroom_core::view::ModelEntry;

    fn list(ids: &[(&str, Option<u32>)]) -> Arc<ServedModels> {
        Arc::new(ServedModels {
            models: ids
                .iter()
                .map(|(id, len)| ModelEntry {
                    id: (*id).into(),
                    parent: None,
                    max_model_len: *len,
                })
                .collect(),
            known: true,
        })
    }

    /// The memo answers as the list does: across stores, models, and replicas whose
    /// ids share a slot.
    #[test]
    fn memoised_answers_follow_the_list() {
        let (a, b) = (ModelsCell::default(), ModelsCell::default());
        assert_eq!(a.serving(1, "m"), Serving::NotYetKnown);
        a.store(list(&[("m", Some(4096))]));
        let yes = |n| Serving::Yes {
            max_model_len: Some(n),
        };
        for _ in 0..2 {
            assert_eq!(a.serving(1, "m"), yes(4096));
            assert_eq!(a.serving(1, "x"), Serving::No);
        }
        b.store(list(&[("x", Some(8192))]));
        // Same slot (ids 1 and 1 + SLOTS), different cells.
        let far = 1 + SLOTS as u32;
        assert_eq!(b.serving(far, "x"), yes(8192));
        assert_eq!(a.serving(1, "x"), Serving::No);
        assert_eq!(b.serving(far, "x"), yes(8192));
        a.store(list(&[("m", Some(2048)), ("x", None)]));
        assert_eq!(
            a.serving(1, "x"),
            Serving::Yes {
                max_model_len: None
            }
        );
        assert_eq!(a.serving(1, "m"), yes(2048));
    }
}
