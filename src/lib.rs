//! Malleable parallel loops: loops whose workers grow and shrink while they run.
//!
//! Implement [`Job`] and [`Chunk`] for the body of a loop — a resumable state machine whose
//! live state is serde-serializable — or just [`Fold`] for a body over single iterations, and
//! run it on an [`Executor`]. While it runs, [`JobHandle::set_local_workers`] grows or shrinks
//! its worker threads (down to zero: the waiting thread computes inline); a retired worker
//! hands its partial chunk over with its live state. The value is the same, bit for bit,
//! whatever happened on the way.
//!
//! ```
//! use malleable::{Executor, Fold, Folded, reduce::Sum};
//! use serde::{Deserialize, Serialize};
//!
//! /// Σ 1/i² for i in 1..=n, as a plain loop body.
//! #[derive(Serialize, Deserialize)]
//! struct Basel { n: u64 }
//!
//! impl Fold for Basel {
//!     const NAME: &'static str = "basel";
//!     type Acc = f64;
//!     type Reducer = Sum<f64>;
//!     type Input = ();
//!     fn iterations(&self) -> u64 { self.n }
//!     fn reducer(&self) -> Sum<f64> { Sum::new() }
//!     fn body(&self, _: &(), acc: &mut f64, i: u64) {
//!         let x = (i + 1) as f64;
//!         *acc += 1.0 / (x * x);
//!     }
//! }
//!
//! let exec = Executor::builder().local_workers(2).build()?;
//! let handle = exec.submit(Folded(Basel { n: 2_000_000 }))?;
//! handle.set_local_workers(1); // shrink while it runs
//! handle.set_local_workers(3); // and grow
//! let sum = handle.wait()?.finished().unwrap().into_value();
//! assert!((sum - std::f64::consts::PI.powi(2) / 6.0).abs() < 1e-6);
//!
//! // Bit for bit the same with another worker count, including inline (zero threads).
//! let inline = Executor::builder().local_workers(0).build()?;
//! assert_eq!(inline.run(Folded(Basel { n: 2_000_000 }))?.into_value().to_bits(), sum.to_bits());
//! # Ok::<(), malleable::Error>(())
//! ```
//!
//! # Guarantees
//!
//! - **Exactly once.** Every iteration's contribution reaches the value once, whatever the
//!   scaling history: a chunk runs on one worker at a time, is handed back with its live state,
//!   and its output is merged once.
//! - **Deterministic value.** Chunk boundaries are fixed when a phase starts, from the
//!   [`Chunking`] policy and the phase size alone, and outputs are folded in chunk order; the
//!   value is bit-identical for any worker count and history, floating-point sums included.
//!   Every [`Schedule`] keeps this (see [`schedule::Guided`] for how guided does).
//! - **No round trip per step.** A worker runs steps back to back and reads one atomic flag
//!   per step; it talks to the core only when a chunk ends or it is asked to adjust.
//! - **Panics are errors.** A panic in user code ends that job with [`Error::Panicked`]; the
//!   process and other jobs go on.
//!
//! # Layout
//!
//! - [`job`](Job): the user contract ([`Job`], [`Chunk`], [`Step`], [`Next`], [`Input`]).
//! - [`Fold`]: the fold shortcut over single iterations.
//! - [`Rows`]: the shortcut for a grid cut in bands of rows that live across phases;
//!   [`Series`]: a per-phase record a job keeps at the coordinator.
//! - [`Layout`]: the serialized layout of a job's types, traced and recorded in snapshots.
//! - [`reduce`]: [`Reducer`](reduce::Reducer), the built-ins and the ordered merge.
//! - [`schedule`]: chunk plans, schedules and the sans-IO core.
//! - [`Executor`], [`JobHandle`]: local worker threads, scaling, progress, async and blocking.
//! - [`snapshot`]: the snapshot format and store (coordinated snapshots, suspend, resume).
//! - [`cluster`]: remote worker processes over TCP ([`cluster::serve`], launchers, the
//!   handshake and frames); the coordinator side is [`Builder::listen`].
//! - [`metrics`]: the names of the metrics the executor reports.
//! - [`slurm`]: the end of the Slurm allocation this process runs in, for
//!   [`Builder::deadline`].
//! - [`timeline`]: the opt-in log of a run ([`Builder::timeline`]) and its HTML report.
//!
//! Inside the crate the layers are (see each module's docs). A layer imports only layers above
//! it in this table, plus the crate-wide `error` and `metrics`; the edges (runner, store,
//! wire) meet only in the worker process and in the executor, which never import each other.
//!
//! | module | folder | what |
//! | --- | --- | --- |
//! | `reduce`, `codec` | `src/reduce/`, `src/codec.rs` | reducers and the ordered merge; the one codec |
//! | `job`, `fold`, `layout` | `src/job.rs`, `src/fold.rs`, `src/layout.rs` | the user contract; the traced layout of its types |
//! | `schedule` | `src/schedule/` | pure: plans, schedules, the ledger (`core`), the snapshot cut (`cut`); no threads, clocks, atomics or I/O |
//! | `run` | `src/run/` | the one chunk runner of local threads, the inline worker and remote threads, and its flag contract |
//! | `snapshot` | `src/snapshot/` | the storage edge: format, store, commit protocol, retention |
//! | `wire` | `src/wire/` | the wire: frames, handshake, listener, launchers; no `Job` |
//! | `worker` | `src/worker/` | the worker process: [`cluster::serve`] = wire + runner + store |
//! | `executor` | `src/executor/` | the coordinator: core + cut + members, local threads, remote connections, I/O |
//! | `slurm` | `src/slurm.rs` | a leaf on its own: reads the allocation's end time from Slurm; imports nothing of the crate |
//!
//! The public [`cluster`] module is the face of two of them: the wire and the worker process.

#![doc(test(attr(deny(warnings))))]

pub mod blocks;
mod codec;
mod error;
pub mod exchange;
mod executor;
mod fold;
mod job;
mod layout;
pub mod metrics;
pub mod reduce;
pub mod rows;
mod run;
pub mod schedule;
mod series;
pub mod slurm;
pub mod snapshot;
pub mod timeline;
mod wire;
mod worker;

/// The crate's deterministic cluster simulation, opened for its benches (the `sim` feature);
/// not a stable API.
#[cfg(feature = "sim")]
#[doc(hidden)]
pub mod __bench {
    pub use crate::executor::sim::scale::{Spent, coordinator_phases};
}

pub mod cluster {
    //! Remote workers: worker processes that dial the coordinator over TCP, join a running
    //! job, leave it, or fail, at any time.
    //!
    //! A worker process is the user's own binary calling [`serve`] with a [`Registry`] of the
    //! job types it can run; no code crosses the network, only job values, chunk states and
    //! outputs. The coordinator's side is [`Builder::listen`](crate::Builder::listen) and
    //! [`JobHandle::scale_remote`](crate::JobHandle::scale_remote), which starts processes
    //! through a [`Launcher`].
    //!
    //! This module is the face of two layers: the wire (`src/wire/`: [`frame`],
    //! [`handshake`], [`peer`], launchers, [`Error`]) and the worker process (`src/worker/`:
    //! [`serve`], [`Registry`], [`WorkerOptions`], [`Served`]).

    pub use crate::wire::{
        AuthFailure, CommandLauncher, Error, LaunchSpec, Launched, Launcher, LocalLauncher,
        TOKEN_ENV, Token, frame, handshake, peer,
    };
    pub use crate::worker::{
        DIRECT_HALOS_ENV, GRACE_ENV, NODE_ENV, PeerTraffic, Registry, SHARED_COPIES_ENV, Served,
        WAIT_FOR_JOB_ENV, WorkerOptions, serve,
    };
}

pub use blocks::Blocks;
pub use error::{Cause, Error, Result, Site, error_chain};
pub use exchange::{Exchange, Pattern, Pieces};
pub use executor::{
    At, AutoscaleStatus, Builder, Copies, Executor, Finished, JobFuture, JobHandle, Outcome,
    Progress, ProgressUpdates, Recovered, RemoteProcess, Resubmit, Resume, Resumed, Rollback,
    SnapshotRequest, Traffic,
};
pub use fold::{DEFAULT_STEP, Fold, FoldChunk, FoldInput, Folded};
pub use job::{BoxError, Chunk, Input, Job, Next, Ownership, Partition, Step, Value};
pub use layout::{Fingerprint, Layout};
pub use rows::{Banded, Rows};
pub use run::SuspendToken;
pub use schedule::{Chunking, Guided, Schedule};
pub use series::Series;
