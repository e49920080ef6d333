//! The ordered merge of chunk outputs.
//!
//! Outputs arrive in any order (workers finish chunks when they finish them); the merge folds
//! them into the phase value strictly in chunk order. An output that arrives before its
//! predecessors waits in `held` until they are merged. With the dynamic schedule chunks are
//! handed out in index order, so `held` stays about as small as the number of workers.

use std::collections::BTreeMap;

use super::Reducer;

/// Folds chunk outputs `0, 1, 2, …` in order, whatever order they arrive in.
#[derive(Debug)]
pub(crate) struct OrderedMerge<V> {
    /// Chunks `0..next` have been folded into `acc`.
    next: u64,
    acc: V,
    /// Outputs of chunks `> next`, waiting for their predecessors.
    held: BTreeMap<u64, V>,
}

impl<V> OrderedMerge<V> {
    /// An empty merge starting from `identity`.
    pub(crate) fn new(identity: V) -> Self {
        OrderedMerge {
            next: 0,
            acc: identity,
            held: BTreeMap::new(),
        }
    }

    /// Adds the output of `chunk`. Returns `false` (and drops `value`) when that chunk's output
    /// was already added: an output is merged exactly once.
    pub(crate) fn add<R: Reducer<Value = V>>(&mut self, reducer: &R, chunk: u64, value: V) -> bool {
        if chunk < self.next || self.held.contains_key(&chunk) {
            return false;
        }
        if chunk != self.next {
            self.held.insert(chunk, value);
            return true;
        }
        reducer.combine(&mut self.acc, value);
        self.next += 1;
        while let Some(v) = self.held.remove(&self.next) {
            reducer.combine(&mut self.acc, v);
            self.next += 1;
        }
        true
    }

    /// A merge that has folded chunks `0..merged` into `acc` and holds `held` (chunks above
    /// `merged`), as a snapshot recorded it. Folds any held output that is next in line.
    pub(crate) fn restore<R: Reducer<Value = V>>(
        reducer: &R,
        merged: u64,
        acc: V,
        held: impl IntoIterator<Item = (u64, V)>,
    ) -> Self {
        let mut m = OrderedMerge {
            next: merged,
            acc,
            held: BTreeMap::new(),
        };
        for (c, v) in held {
            m.add(reducer, c, v);
        }
        m
    }

    /// Whether the output of `chunk` has been added.
    pub(crate) fn contains(&self, chunk: u64) -> bool {
        chunk < self.next || self.held.contains_key(&chunk)
    }

    /// Outputs waiting for an earlier chunk, in chunk order.
    pub(crate) fn held(&self) -> impl Iterator<Item = (u64, &V)> {
        self.held.iter().map(|(c, v)| (*c, v))
    }

    /// The folded value of chunks `0..merged()`.
    pub(crate) fn value(&self) -> &V {
        &self.acc
    }

    /// Chunks `0..merged()` are folded into the value.
    pub(crate) fn merged(&self) -> u64 {
        self.next
    }

    /// The value, once every output has been added (`held` is then empty).
    pub(crate) fn into_value(self) -> V {
        debug_assert!(self.held.is_empty());
        self.acc
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reduce::CollectInOrder;

    #[test]
    fn any_arrival_order_gives_chunk_order() {
        let r = CollectInOrder::<u64>::new();
        let mut m = OrderedMerge::new(Vec::new());
        for c in [3u64, 0, 2, 1, 5, 4] {
            assert!(m.add(&r, c, vec![c]));
        }
        assert!(
            !m.add(&r, 2, vec![99]),
            "a second output of one chunk is refused"
        );
        assert_eq!(m.merged(), 6);
        assert_eq!(m.into_value(), vec![0, 1, 2, 3, 4, 5]);
    }
}
