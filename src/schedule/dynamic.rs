//! The dynamic schedule: a shared pile of pending chunks, lowest index first.
//!
//! Chunks never started are represented by a cursor (no memory per chunk); chunks handed back
//! (by a retired or lost worker) sit in a small ordered set. Taking the lowest index first keeps
//! outputs arriving close to chunk order, so the ordered merge holds few of them.

use std::collections::BTreeSet;

use super::ChunkId;

/// The pending chunks of a phase under the dynamic (or guided) schedule.
#[derive(Debug)]
pub(super) struct Pile {
    /// Chunks `cursor..len` have never been handed out.
    cursor: ChunkId,
    len: ChunkId,
    /// Chunks below `cursor` that were handed back and are pending again.
    returned: BTreeSet<ChunkId>,
}

impl Pile {
    pub(super) fn new(len: ChunkId) -> Pile {
        Pile {
            cursor: 0,
            len,
            returned: BTreeSet::new(),
        }
    }

    /// A pile of `len` chunks of which only `pending` (increasing) are pending: the others
    /// are done. Chunks above the last done one cost no memory.
    pub(super) fn with_pending(len: ChunkId, pending: &[ChunkId], done_below: ChunkId) -> Pile {
        let cursor = done_below.min(len);
        let returned = pending.iter().copied().filter(|&c| c < cursor).collect();
        Pile {
            cursor,
            len,
            returned,
        }
    }

    /// The lowest pending chunk, removed from the pile.
    pub(super) fn take(&mut self) -> Option<ChunkId> {
        match self.returned.first() {
            Some(&c) if c < self.cursor => {
                self.returned.pop_first();
                Some(c)
            }
            _ if self.cursor < self.len => {
                self.cursor += 1;
                Some(self.cursor - 1)
            }
            _ => None,
        }
    }

    /// Puts a chunk that was handed out back on the pile.
    pub(super) fn put_back(&mut self, c: ChunkId) {
        debug_assert!(c < self.cursor);
        self.returned.insert(c);
    }

    /// Whether no chunk is pending.
    #[cfg(test)]
    pub(super) fn is_empty(&self) -> bool {
        self.returned.is_empty() && self.cursor >= self.len
    }

    /// Every pending chunk, in index order.
    pub(super) fn pending(&self) -> impl Iterator<Item = ChunkId> + '_ {
        self.returned.iter().copied().chain(self.cursor..self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lowest_first_and_returned_chunks_come_back() {
        let mut p = Pile::new(4);
        assert_eq!(p.take(), Some(0));
        assert_eq!(p.take(), Some(1));
        p.put_back(0);
        assert_eq!(p.pending().collect::<Vec<_>>(), vec![0, 2, 3]);
        assert_eq!(p.take(), Some(0));
        assert_eq!(p.take(), Some(2));
        assert_eq!(p.take(), Some(3));
        assert!(p.is_empty());
        assert_eq!(p.take(), None);
    }
}
