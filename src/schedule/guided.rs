//! The guided schedule: shrinking chunk sizes.
//!
//! OpenMP's guided schedule sizes each chunk from the work left and the *current* number of
//! threads, which would make chunk boundaries — and so a floating-point value — depend on the
//! worker count. Here the sizes are computed when the phase starts from a *declared* worker
//! count ([`Guided::workers`]), so the boundaries, and the value, are the same whatever the
//! actual worker count and history: guided keeps the determinism guarantee. Chunks are then
//! handed out like the dynamic schedule (lowest index first).

use serde::{Deserialize, Serialize};

/// Parameters of [`Schedule::Guided`](super::Schedule::Guided).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Guided {
    /// The worker count the sizes are computed for (≥ 1): each chunk takes
    /// `remaining / (2 × workers)` iterations. It is fixed, not the live count, so the value
    /// stays deterministic.
    pub workers: u32,
    /// The smallest chunk, in iterations (≥ 1).
    pub min_chunk: u64,
}

impl Default for Guided {
    /// 16 workers, chunks of at least 64 iterations.
    fn default() -> Self {
        Guided {
            workers: 16,
            min_chunk: 64,
        }
    }
}
