//! Chunk plans, schedules and the sans-IO core that owns the ledger.
//!
//! - `plan.rs`: where a phase's chunk boundaries come from ([`Chunking`]); they are fixed when
//!   the phase starts and never depend on the number of workers.
//! - `dynamic.rs`: the shared pile in index order ([`Schedule::Dynamic`], the default).
//! - `static_.rs`: round-robin deal with the two-step reassignment ([`Schedule::Static`]).
//! - `guided.rs`: shrinking chunk sizes ([`Schedule::Guided`]); handed out like dynamic.
//! - `core.rs`: the deterministic state machine — events in (worker joined, chunk done, chunk
//!   handed back, retire, worker lost), commands out (run chunk C on W, interrupt W, release W).
//!   It has no threads, clocks or I/O.
//! - `cut.rs`: the snapshot cut, also a state machine (marker, captures, the output that
//!   wins over a state, quiescence for a suspend, one write at a time), driven next to the
//!   core by the executor and by the tests.
//! - `rollback.rs`: the decisions of a rollback to a committed snapshot (when to read,
//!   which epoch, when a loss starts it over or ends the job), a state machine too.
//! - `shape.rs`: which owned partitions neighbour each other (whose halos each reads): the
//!   one place that says so.
//! - `decide.rs`: the autoscaling decider ([`Decider`]): measured throughputs, work left and
//!   the time in, worker counts out, each decision with its [`Reason`]; also a state machine.
//!
//! This layer is pure: no async runtime, no channels, no shared counters, no clock, and not
//! the crate's error type (its refusals are its own small types: [`Rejected`], `Invalid` for
//! a chunking policy and [`InvalidPolicy`] for an autoscaling policy).
//!
//! # What every schedule keeps
//!
//! Every schedule keeps both determinism (the value is bit-identical for any worker count and
//! history, because boundaries are fixed per phase and outputs merge in chunk order) and
//! exactly-once (a chunk's output is merged once; a handed-back chunk resumes from the state it
//! was handed back with).

mod core;
mod cut;
mod decide;
mod dynamic;
mod guided;
pub(crate) mod idhash;
mod owned;
mod plan;
mod rollback;
mod shape;
mod static_;

// The sans-IO core is public (hidden) only so the crate's benchmarks can drive it; it is not
// a stable API.
#[doc(hidden)]
pub use self::core::{ChunkId, Command, Core, Event, ProcessId, Rejected, Work, WorkerId};
#[doc(hidden)]
pub use cut::{Captured, Cut, CutCommand, Write, Written};
pub use decide::{
    Autoscale, Bounds, Costs, Decider, Decision, Direction, Goal, Hysteresis, InvalidPolicy, Kind,
    Measurement, Reason, Waiting,
};
pub use guided::Guided;
pub use plan::Chunking;
pub(crate) use plan::Invalid;
#[doc(hidden)]
pub use plan::Plan;
pub(crate) use rollback::{RollbackCommand, RollbackMachine, RollbackRecord};
pub(crate) use shape::Shape;

use serde::{Deserialize, Serialize};

/// How chunks are handed to workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Schedule {
    /// A shared pile in index order; an idle worker takes the lowest pending chunk. New
    /// workers join with no extra work, and faster workers naturally take more chunks.
    #[default]
    Dynamic,
    /// Chunks dealt round-robin over the workers (sorted by id) when a phase starts, so a
    /// chunk tends to stay on the same worker from phase to phase. When the worker count
    /// changes: (1) deal again round-robin over the new workers, skipping finished and running
    /// chunks; (2) move unstarted chunks from the most to the least loaded worker, load being
    /// pending iterations divided by the worker's measured throughput. A worker whose queue is
    /// empty waits for the phase to end: static never steals.
    Static,
    /// Shrinking chunks, handed out like [`Schedule::Dynamic`]; see [`Guided`].
    Guided(Guided),
}
