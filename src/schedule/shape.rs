//! The shape of a job's owned partitions: which partitions read each other's halos.
//!
//! One answer to "who are my neighbours", asked by everyone who routes a halo or keeps
//! neighbours together: the barrier that hands each partition its halos (`job_run.rs`), the
//! coordinator that matches the halos a worker process hands back (`remote.rs`), the
//! reassignment that places a partition next to a neighbour (`owned.rs`), and the worker
//! process that keeps halos between its own partitions (`worker/halos.rs`).
//!
//! Every job's partitions form a chain today (a grid cut in bands of rows): partition `c`
//! reads, before its next phase, the halo partition `c - 1` exported towards it (its
//! *before*) and the one partition `c + 1` exported towards it (its *after*); each partition
//! exports one halo towards each of its neighbours. Other shapes (tiles of a 2-D grid,
//! pencils or blocks of a 3-D one, a graph) answer the same questions.

use super::ChunkId;

/// Which of a partition's neighbours, seen from the partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Side {
    /// The neighbour before it (the band above).
    Before,
    /// The neighbour after it (the band below).
    After,
}

impl Side {
    /// The side the partition is on, seen from its neighbour on this side.
    pub(crate) fn opposite(self) -> Side {
        match self {
            Side::Before => Side::After,
            Side::After => Side::Before,
        }
    }
}

/// The neighbours of the owned partitions of a job of `len` chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shape {
    len: ChunkId,
}

impl Shape {
    /// A chain of `len` partitions: `c` neighbours `c - 1` and `c + 1`.
    pub(crate) const fn chain(len: ChunkId) -> Shape {
        Shape { len }
    }

    /// The neighbour of `chunk` on `side`, whose halo `chunk` reads there; `None` at an end
    /// of the chain.
    pub(crate) fn neighbour(self, chunk: ChunkId, side: Side) -> Option<ChunkId> {
        match side {
            Side::Before => chunk.checked_sub(1),
            Side::After => chunk.checked_add(1).filter(|&n| n < self.len),
        }
    }

    /// The neighbours of `chunk`, before then after.
    pub(crate) fn neighbours(self, chunk: ChunkId) -> impl Iterator<Item = ChunkId> {
        [Side::Before, Side::After]
            .into_iter()
            .filter_map(move |side| self.neighbour(chunk, side))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_neighbours_the_partitions_next_to_each_one() {
        let s = Shape::chain(4);
        assert_eq!(s.neighbours(0).collect::<Vec<_>>(), vec![1]);
        assert_eq!(s.neighbours(2).collect::<Vec<_>>(), vec![1, 3]);
        assert_eq!(s.neighbours(3).collect::<Vec<_>>(), vec![2]);
        assert_eq!(s.neighbour(0, Side::Before), None);
        assert_eq!(s.neighbour(3, Side::After), None);
        assert_eq!(Shape::chain(1).neighbours(0).count(), 0);
        assert_eq!(
            Shape::chain(u64::MAX).neighbour(u64::MAX, Side::After),
            None
        );
    }
}
