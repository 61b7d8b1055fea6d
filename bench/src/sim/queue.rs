//! The event queue: earliest time first, ties in insertion order, so a run is a pure
//! function of its inputs and seed.

use std::{cmp::Reverse, collections::BinaryHeap};

/// Min-heap of `(time, sequence, event)`.
pub struct EventQueue<E> {
    heap: BinaryHeap<Reverse<(u64, u64, Slot<E>)>>,
    seq: u64,
}

/// Wrapper so events need no ordering of their own.
struct Slot<E>(E);

impl<E> PartialEq for Slot<E> {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl<E> Eq for Slot<E> {}
impl<E> PartialOrd for Slot<E> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<E> Ord for Slot<E> {
    fn cmp(&self, _: &Self) -> std::cmp::Ordering {
        std::cmp::Ordering::Equal
    }
}

/// Order-preserving key of a non-negative time (IEEE bits sort like the values).
fn key(t: f64) -> u64 {
    t.max(0.0).to_bits()
}

impl<E> EventQueue<E> {
    pub fn new() -> Self {
        Self {
            heap: BinaryHeap::new(),
            seq: 0,
        }
    }

    pub fn push(&mut self, t: f64, e: E) {
        self.seq += 1;
        self.heap.push(Reverse((key(t), self.seq, Slot(e))));
    }

    pub fn pop(&mut self) -> Option<(f64, E)> {
        self.heap
            .pop()
            .map(|Reverse((k, _, Slot(e)))| (f64::from_bits(k), e))
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

impl<E> Default for EventQueue<E> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn time_order_then_insertion_order() {
        let mut q = super::EventQueue::new();
        q.push(2.0, "c");
        q.push(1.0, "a");
        q.push(1.0, "b");
        q.push(0.0, "z");
        let got: Vec<_> = std::iter::from_fn(|| q.pop()).map(|(_, e)| e).collect();
        assert_eq!(got, vec!["z", "a", "b", "c"]);
    }
}
