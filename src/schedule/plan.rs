//! Chunk boundaries of a phase.

use std::ops::Range;

use serde::{Deserialize, Serialize};

use super::{Guided, Schedule};

/// A chunking policy that cannot cut a phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum Invalid {
    /// `Chunking::Count(0)`.
    #[error("chunk count must be at least 1")]
    ZeroCount,
    /// `Chunking::Size(0)`.
    #[error("chunk size must be at least 1")]
    ZeroSize,
}

/// How a phase's iteration space is cut into chunks.
///
/// The cut depends only on this policy and the phase's size, never on the number of workers,
/// which is what makes the value independent of the worker count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Chunking {
    /// About this many chunks of equal size (at least 1). More chunks than iterations are
    /// clamped to one iteration per chunk.
    Count(u64),
    /// Chunks of this many iterations (at least 1); the last one may be shorter. A size larger
    /// than the space is clamped to a single chunk.
    Size(u64),
}

impl Default for Chunking {
    /// `Count(1024)`: enough chunks to balance dozens of workers, few enough that the cost of
    /// handing out a chunk (about a microsecond) is noise.
    fn default() -> Self {
        Chunking::Count(1024)
    }
}

impl Chunking {
    /// Checks the policy: a count or size of zero is an error.
    pub(crate) fn validate(self) -> Result<(), Invalid> {
        match self {
            Chunking::Count(0) => Err(Invalid::ZeroCount),
            Chunking::Size(0) => Err(Invalid::ZeroSize),
            _ => Ok(()),
        }
    }
}

/// The chunks of one phase: `len()` contiguous ranges covering `0..n` in order.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Plan {
    /// Chunks of `size` iterations (the last one shorter).
    Uniform { n: u64, size: u64 },
    /// `bounds[c]..bounds[c + 1]` is chunk `c`; `bounds` starts at 0 and ends at `n`.
    Explicit { bounds: Vec<u64> },
}

impl Plan {
    /// The plan for a phase of `n` iterations.
    pub fn new(n: u64, schedule: Schedule, chunking: Chunking) -> Plan {
        match schedule {
            Schedule::Guided(g) => Plan::Explicit {
                bounds: g.bounds(n),
            },
            Schedule::Dynamic | Schedule::Static => {
                let size = match chunking {
                    Chunking::Size(s) => s.clamp(1, n.max(1)),
                    Chunking::Count(c) => n.div_ceil(c.max(1)).max(1),
                };
                Plan::Uniform { n, size }
            }
        }
    }

    /// Number of chunks.
    #[allow(clippy::len_without_is_empty)] // a plan with no chunk is just `len() == 0`
    pub fn len(&self) -> u64 {
        match self {
            Plan::Uniform { n, size } => n.div_ceil(*size),
            Plan::Explicit { bounds } => bounds.len().saturating_sub(1) as u64,
        }
    }

    /// Total iterations.
    pub fn iterations(&self) -> u64 {
        match self {
            Plan::Uniform { n, .. } => *n,
            Plan::Explicit { bounds } => bounds.last().copied().unwrap_or(0),
        }
    }

    /// The range of chunk `c` (`c < len()`).
    pub fn range(&self, c: u64) -> Range<u64> {
        match self {
            Plan::Uniform { n, size } => {
                let start = c * size;
                start..(start + size).min(*n)
            }
            Plan::Explicit { bounds } => bounds[c as usize]..bounds[c as usize + 1],
        }
    }
}

impl Guided {
    /// Bounds `[0, …, n]`: each chunk takes `remaining / (2 × workers)` iterations, at least
    /// `min_chunk`.
    fn bounds(self, n: u64) -> Vec<u64> {
        let divisor = 2 * u64::from(self.workers.max(1));
        let min = self.min_chunk.max(1);
        let mut bounds = vec![0];
        let mut at = 0;
        while at < n {
            let size = ((n - at) / divisor).max(min).min(n - at);
            at += size;
            bounds.push(at);
        }
        bounds
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_cover(plan: &Plan, n: u64) {
        let mut at = 0;
        for c in 0..plan.len() {
            let r = plan.range(c);
            assert_eq!(r.start, at);
            assert!(r.end > r.start);
            at = r.end;
        }
        assert_eq!(at, n);
        assert_eq!(plan.iterations(), n);
    }

    #[test]
    fn plans_cover_the_space() {
        for n in [0, 1, 7, 100, 1001] {
            for ch in [
                Chunking::Count(1),
                Chunking::Count(3),
                Chunking::Count(5000),
                Chunking::Size(1),
                Chunking::Size(64),
                Chunking::Size(1 << 40),
            ] {
                check_cover(&Plan::new(n, Schedule::Dynamic, ch), n);
            }
            check_cover(
                &Plan::new(n, Schedule::Guided(Guided::default()), Chunking::default()),
                n,
            );
        }
        assert!(Chunking::Size(0).validate().is_err());
        assert!(Chunking::Count(0).validate().is_err());
    }

    #[test]
    fn guided_chunks_shrink() {
        let g = Guided {
            workers: 4,
            min_chunk: 10,
        };
        let b = g.bounds(10_000);
        let sizes: Vec<u64> = b.windows(2).map(|w| w[1] - w[0]).collect();
        assert_eq!(sizes[0], 1250);
        assert!(sizes.windows(2).all(|w| w[0] >= w[1] || w[1] <= 10));
    }
}
