//! The ordered merge of chunk outputs.
//!
//! Outputs arrive in any order (workers finish chunks when they finish them); the merge folds
//! them into the phase value strictly in chunk order. An output that arrives before its
//! predecessors waits in `held` until they are merged. With the dynamic schedule chunks are
//! handed out in index order, so `held` stays about as small as the number of workers.
//!
//! `held` is a window indexed by chunk, from the first chunk not merged to the last that
//! arrived: each output is placed and found in O(1), whatever order the outputs come in. (A
//! map ordered by chunk cost O(log n) per output, with cache misses: thousands of worker
//! processes answer a phase in any order, so most of a phase's outputs waited in it.)

use std::collections::VecDeque;

use super::Reducer;

/// Folds chunk outputs `0, 1, 2, …` in order, whatever order they arrive in.
#[derive(Debug)]
pub(crate) struct OrderedMerge<V> {
    /// Chunks `0..next` have been folded into `acc`.
    next: u64,
    acc: V,
    /// Outputs of chunks `> next`, waiting for their predecessors: `held[i]` is chunk
    /// `next + i`'s (so `held[0]`, if any, is `None`), up to the last one that arrived.
    held: VecDeque<Option<V>>,
}

impl<V> OrderedMerge<V> {
    /// An empty merge starting from `identity`.
    pub(crate) fn new(identity: V) -> Self {
        OrderedMerge {
            next: 0,
            acc: identity,
            held: VecDeque::new(),
        }
    }

    /// Adds the output of `chunk`. Returns `false` (and drops `value`) when that chunk's output
    /// was already added: an output is merged exactly once.
    pub(crate) fn add<R: Reducer<Value = V>>(&mut self, reducer: &R, chunk: u64, value: V) -> bool {
        if self.contains(chunk) {
            return false;
        }
        let at = (chunk - self.next) as usize;
        if at > 0 {
            if self.held.len() <= at {
                self.held.resize_with(at + 1, || None);
            }
            self.held[at] = Some(value);
            return true;
        }
        reducer.combine(&mut self.acc, value);
        self.next += 1;
        self.held.pop_front();
        while let Some(Some(v)) = self.held.front_mut().map(Option::take) {
            reducer.combine(&mut self.acc, v);
            self.next += 1;
            self.held.pop_front();
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
            held: VecDeque::new(),
        };
        for (c, v) in held {
            m.add(reducer, c, v);
        }
        m
    }

    /// Whether the output of `chunk` has been added.
    pub(crate) fn contains(&self, chunk: u64) -> bool {
        chunk < self.next
            || usize::try_from(chunk - self.next)
                .ok()
                .and_then(|at| self.held.get(at))
                .is_some_and(Option::is_some)
    }

    /// Outputs waiting for an earlier chunk, in chunk order.
    pub(crate) fn held(&self) -> impl Iterator<Item = (u64, &V)> {
        let next = self.next;
        self.held
            .iter()
            .enumerate()
            .filter_map(move |(i, v)| Some((next + i as u64, v.as_ref()?)))
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
        debug_assert!(self.held.iter().all(Option::is_none));
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

    /// Outputs held behind a gap are listed in chunk order and counted as added; a restore
    /// from them folds those that are next in line, and the rest stay held.
    #[test]
    fn held_outputs_are_listed_in_chunk_order_and_restore() {
        let r = CollectInOrder::<u64>::new();
        let mut m = OrderedMerge::new(Vec::new());
        for c in [7u64, 2, 5, 0] {
            assert!(m.add(&r, c, vec![c]));
        }
        assert_eq!(m.merged(), 1);
        let held: Vec<(u64, Vec<u64>)> = m.held().map(|(c, v)| (c, v.clone())).collect();
        assert_eq!(held, vec![(2, vec![2]), (5, vec![5]), (7, vec![7])]);
        assert!(m.contains(0) && m.contains(5) && m.contains(7));
        assert!(!m.contains(1) && !m.contains(6) && !m.contains(8) && !m.contains(u64::MAX));
        assert!(!m.add(&r, 5, vec![99]));
        let mut back = OrderedMerge::restore(&r, 1, vec![0], held);
        assert!(back.add(&r, 1, vec![1]));
        assert_eq!(back.merged(), 3);
        assert_eq!(back.held().map(|(c, _)| c).collect::<Vec<_>>(), vec![5, 7]);
        for c in [6, 4, 3] {
            assert!(back.add(&r, c, vec![c]));
        }
        assert_eq!(back.merged(), 8);
        assert_eq!(back.held().count(), 0);
        assert_eq!(back.into_value(), (0..8).collect::<Vec<_>>());
    }
}
