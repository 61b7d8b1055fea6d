//! One tenant's waiting requests, earliest deadline first (EDF), ties by arrival.
//!
//! Invariant: each ticket number appears at most once; `len` is the number of waiting
//! requests, so the gate's memory for waiters is `O(queued)` and bounded by its cap.

use std::collections::BTreeSet;

/// A waiting request's place: its deadline on the node's axis (s) and ticket number.
#[derive(Clone, Copy, Debug)]
struct Key(f64, u64);

impl PartialEq for Key {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o).is_eq()
    }
}
impl Eq for Key {}
impl PartialOrd for Key {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Key {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&o.0).then(self.1.cmp(&o.1))
    }
}

/// Waiting requests of one tenant, ordered by deadline.
#[derive(Debug, Default)]
pub struct EdfQueue {
    keys: BTreeSet<Key>,
}

impl EdfQueue {
    pub fn push(&mut self, deadline_s: f64, seq: u64) {
        self.keys.insert(Key(deadline_s, seq));
    }

    /// Removes a waiter (it left, or its deadline came); false when absent.
    pub fn remove(&mut self, deadline_s: f64, seq: u64) -> bool {
        self.keys.remove(&Key(deadline_s, seq))
    }

    /// The earliest deadline and its ticket.
    pub fn head(&self) -> Option<(f64, u64)> {
        self.keys.first().map(|k| (k.0, k.1))
    }

    pub fn pop(&mut self) -> Option<(f64, u64)> {
        self.keys.pop_first().map(|k| (k.0, k.1))
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn earliest_deadline_first_then_arrival() {
        let mut q = EdfQueue::default();
        q.push(3.0, 1);
        q.push(1.0, 2);
        q.push(1.0, 3);
        q.push(2.0, 4);
        assert!(q.remove(2.0, 4));
        assert!(!q.remove(2.0, 4));
        let order: Vec<u64> = std::iter::from_fn(|| q.pop().map(|(_, s)| s)).collect();
        assert_eq!(order, [2, 3, 1]);
    }
}
