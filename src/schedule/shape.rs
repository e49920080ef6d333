//! The shape of a job's owned partitions: which partitions exchange pieces with which.
//!
//! One answer to "who are my neighbours", asked by everyone who routes a piece or keeps
//! neighbours together: the barrier that hands each partition its pieces (`job_run.rs`), the
//! coordinator that checks the pieces a worker process hands back (`remote.rs`) and the
//! reassignment that places a partition next to a neighbour (`owned.rs`). A worker process
//! needs no shape: the pieces it exports are addressed.
//!
//! A [`Partition`](crate::Partition) job's partitions form a chain (a grid cut in bands of
//! rows): partition `c` neighbours `c - 1` and `c + 1`. An [`Exchange`](crate::Exchange)
//! job declares any graph ([`Exchange::neighbours`](crate::Exchange::neighbours)), checked
//! here once per run: in range, not itself, each once, symmetric. Kept as compressed rows
//! (one offset per chunk, the neighbours sorted), so that 320,000 partitions of a
//! 3-D grid cost a few megabytes and a lookup is a slice.

use std::sync::Arc;

use super::ChunkId;
use crate::exchange::{GraphError, Pattern};

/// The neighbours of the owned partitions of a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Shape {
    /// `len` partitions, `c` neighbouring `c - 1` and `c + 1`.
    Chain { len: ChunkId },
    /// Any graph.
    Graph(Arc<Graph>),
}

/// A neighbour graph in compressed rows: the neighbours of `c` are
/// `to[start[c]..start[c + 1]]`, sorted.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Graph {
    start: Vec<usize>,
    to: Vec<ChunkId>,
}

impl Shape {
    /// A chain of `len` partitions: `c` neighbours `c - 1` and `c + 1`.
    pub(crate) const fn chain(len: ChunkId) -> Shape {
        Shape::Chain { len }
    }

    /// The graph of `len` partitions whose neighbours `of` gives, checked.
    ///
    /// # Errors
    ///
    /// The first chunk (in order) whose neighbours are out of range, itself, named twice, or
    /// do not name it back.
    pub(crate) fn graph(
        len: ChunkId,
        mut of: impl FnMut(ChunkId) -> Vec<ChunkId>,
    ) -> Result<Shape, (ChunkId, GraphError)> {
        let mut start = Vec::with_capacity(len as usize + 1);
        let mut to = Vec::new();
        start.push(0);
        for c in 0..len {
            let mut n = of(c);
            n.sort_unstable();
            for (i, &x) in n.iter().enumerate() {
                if x >= len {
                    return Err((
                        c,
                        GraphError::OutOfRange {
                            neighbour: x,
                            chunks: len,
                        },
                    ));
                }
                if x == c {
                    return Err((c, GraphError::Itself));
                }
                if i > 0 && n[i - 1] == x {
                    return Err((c, GraphError::Twice { neighbour: x }));
                }
            }
            to.extend_from_slice(&n);
            start.push(to.len());
        }
        let g = Graph { start, to };
        for c in 0..len {
            for &n in g.of(c) {
                if g.of(n).binary_search(&c).is_err() {
                    return Err((c, GraphError::NotSymmetric { neighbour: n }));
                }
            }
        }
        Ok(Shape::Graph(Arc::new(g)))
    }

    /// How many partitions.
    pub(crate) fn len(&self) -> ChunkId {
        match self {
            Shape::Chain { len } => *len,
            Shape::Graph(g) => (g.start.len() - 1) as ChunkId,
        }
    }

    /// The neighbours of `chunk`, in chunk order.
    pub(crate) fn neighbours(&self, chunk: ChunkId) -> impl Iterator<Item = ChunkId> + '_ {
        let (chain, graph): (Option<[Option<ChunkId>; 2]>, &[ChunkId]) = match self {
            Shape::Chain { len } => (
                Some([
                    chunk.checked_sub(1),
                    chunk.checked_add(1).filter(|&n| n < *len),
                ]),
                &[],
            ),
            Shape::Graph(g) if chunk < self.len() => (None, g.of(chunk)),
            Shape::Graph(_) => (None, &[]),
        };
        chain
            .into_iter()
            .flatten()
            .flatten()
            .chain(graph.iter().copied())
    }

    /// Whether a partition of `from` may address a piece to `to` in `pattern`: a neighbour,
    /// every chunk in an all-to-all, everyone (`None`) in an allgather.
    pub(crate) fn may_send(&self, pattern: Pattern, from: ChunkId, to: Option<ChunkId>) -> bool {
        match (pattern, to) {
            // A chain's two neighbours, without walking them (asked for every halo that
            // every partition exports).
            (Pattern::Neighbours, Some(to)) => match self {
                Shape::Chain { len } => {
                    from.checked_sub(1) == Some(to)
                        || (from.checked_add(1) == Some(to) && to < *len)
                }
                Shape::Graph(_) => self.neighbours(from).any(|n| n == to),
            },
            (Pattern::AllToAll, Some(to)) => to < self.len(),
            (Pattern::Allgather, None) => true,
            _ => false,
        }
    }

    /// How many pieces a partition of `from` exports in `pattern`.
    pub(crate) fn sends(&self, pattern: Pattern, from: ChunkId) -> usize {
        match pattern {
            Pattern::Nothing => 0,
            Pattern::Neighbours => match self {
                Shape::Chain { len } => {
                    usize::from(from > 0)
                        + usize::from(from.checked_add(1).is_some_and(|n| n < *len))
                }
                Shape::Graph(_) => self.neighbours(from).count(),
            },
            Pattern::Allgather => 1,
            Pattern::AllToAll => self.len() as usize,
        }
    }
}

impl Graph {
    fn of(&self, c: ChunkId) -> &[ChunkId] {
        let c = c as usize;
        &self.to[self.start[c]..self.start[c + 1]]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chain answers `may_send` and `sends` for its neighbours as a walk of them does, at
    /// its ends and past them too.
    #[test]
    fn a_chain_answers_for_its_neighbours_as_their_walk() {
        for len in [0, 1, 2, 5, u64::MAX] {
            let s = Shape::chain(len);
            let near = [0, 1, 2, 3, 4, 5, 6, u64::MAX - 1, u64::MAX];
            for from in near {
                assert_eq!(
                    s.sends(Pattern::Neighbours, from),
                    s.neighbours(from).count(),
                    "{len} {from}"
                );
                for to in near {
                    assert_eq!(
                        s.may_send(Pattern::Neighbours, from, Some(to)),
                        s.neighbours(from).any(|n| n == to),
                        "{len} {from} {to}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_chain_neighbours_the_partitions_next_to_each_one() {
        let s = Shape::chain(4);
        assert_eq!(s.neighbours(0).collect::<Vec<_>>(), vec![1]);
        assert_eq!(s.neighbours(2).collect::<Vec<_>>(), vec![1, 3]);
        assert_eq!(s.neighbours(3).collect::<Vec<_>>(), vec![2]);
        assert_eq!(Shape::chain(1).neighbours(0).count(), 0);
        assert_eq!(Shape::chain(u64::MAX).neighbours(u64::MAX).count(), 1);
    }

    /// A 2 x 3 grid of tiles: each tile neighbours the tiles that share a side.
    #[test]
    fn a_graph_gives_each_partition_its_declared_neighbours_sorted() {
        let tiles = |c: u64| {
            let (r, k) = (c / 3, c % 3);
            let mut n = Vec::new();
            if k + 1 < 3 {
                n.push(c + 1);
            }
            if k > 0 {
                n.push(c - 1);
            }
            if r == 0 {
                n.push(c + 3);
            } else {
                n.push(c - 3);
            }
            n
        };
        let s = Shape::graph(6, tiles).unwrap();
        assert_eq!(s.len(), 6);
        assert_eq!(s.neighbours(0).collect::<Vec<_>>(), vec![1, 3]);
        assert_eq!(s.neighbours(4).collect::<Vec<_>>(), vec![1, 3, 5]);
        assert!(s.may_send(Pattern::Neighbours, 4, Some(5)));
        assert!(!s.may_send(Pattern::Neighbours, 4, Some(0)));
        assert!(!s.may_send(Pattern::Neighbours, 4, None));
        assert!(s.may_send(Pattern::AllToAll, 4, Some(0)));
        assert!(!s.may_send(Pattern::AllToAll, 4, Some(6)));
        assert!(s.may_send(Pattern::Allgather, 4, None));
        assert!(!s.may_send(Pattern::Nothing, 4, Some(5)));
        assert_eq!(s.sends(Pattern::AllToAll, 0), 6);
        assert_eq!(s.sends(Pattern::Neighbours, 4), 3);
    }

    #[test]
    fn a_graph_that_is_not_one_is_refused_at_the_first_chunk_at_fault() {
        assert_eq!(
            Shape::graph(3, |c| if c == 1 { vec![3] } else { vec![] }),
            Err((
                1,
                GraphError::OutOfRange {
                    neighbour: 3,
                    chunks: 3
                }
            ))
        );
        assert_eq!(Shape::graph(3, |c| vec![c]), Err((0, GraphError::Itself)));
        assert_eq!(
            Shape::graph(3, |c| if c == 0 { vec![1, 1] } else { vec![0] }),
            Err((0, GraphError::Twice { neighbour: 1 }))
        );
        // 0 -> 2 but 2 does not name 0.
        assert_eq!(
            Shape::graph(3, |c| match c {
                0 => vec![1, 2],
                1 => vec![0],
                _ => vec![],
            }),
            Err((0, GraphError::NotSymmetric { neighbour: 2 }))
        );
    }
}
