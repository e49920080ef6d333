//! Runs one chunk: steps back to back, one flag load per step, the host asked only when the
//! flag is raised.
//!
//! # The per-step path
//!
//! One `Chunk::step` call, one clock read, one increment of a local histogram bucket, one
//! `Relaxed` load of the worker's own flag ([`Cell::raised`]), and every 8 ms one `Relaxed`
//! store of the chunk's progress to the worker's own cache line. No lock, no allocation, no
//! shared counter, no call into the host: everything else happens once per chunk or once per
//! request.
//!
//! # What a run ends with
//!
//! Exactly one [`Ran`]: the chunk's output ([`Ran::Done`]), its live state handed back
//! ([`Ran::Yielded`], when the host said [`Attend::Stop`]), or the error that lost it
//! ([`Ran::Failed`]: the input did not load, a restored state did not decode, user code
//! panicked). A snapshot capture ([`Attend::Capture`]) does not end the run: the state is
//! serialized, handed to [`Host::captured`], and the same chunk goes on.

use std::ops::Range;
use std::time::{Duration, Instant};

use super::{Cell, Held, Inputs, catch};
use crate::codec;
use crate::error::{Error, Site};
use crate::exchange::{At, Outbox, Piece};
use crate::job::{Chunk, Job, Step, output_due};
use crate::metrics::StepStats;
use crate::schedule::{ChunkId, Work};

/// How often a runner publishes the progress of its chunk.
const PUBLISH_EVERY: Duration = Duration::from_millis(8);

/// What the runner does at an adjustment point where the flag was raised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attend {
    /// Nothing for this chunk: go on.
    Continue,
    /// Serialize the chunk for a snapshot, hand the bytes to [`Host::captured`], go on.
    Capture,
    /// Stop and hand the chunk back.
    Stop,
}

/// Where a runner's requests come from and its captures go: the job's lock for local
/// workers, a queue and a socket for the threads of a worker process.
pub(crate) trait Host {
    /// The flag was raised at an adjustment point: take its bits ([`Cell::take`]), read the
    /// requests, and say what to do with the running chunk.
    fn attend(&mut self, cell: &Cell) -> Attend;

    /// The running chunk's state serialized for a snapshot, or why it could not be.
    fn captured(&mut self, state: Result<Vec<u8>, codec::Error>);
}

/// A chunk to run.
pub(crate) struct Assignment<C> {
    pub(crate) chunk: ChunkId,
    pub(crate) phase: u64,
    /// The job's chunks (a partition addresses its pieces to chunks).
    pub(crate) chunks: u64,
    pub(crate) range: Range<u64>,
    /// From scratch, or the state it was handed back with.
    pub(crate) state: Option<Held<C>>,
}

/// An owned partition after its chunk's last step of a phase, and the pieces it exported.
pub(crate) struct Kept<C> {
    pub(crate) state: C,
    /// Addressed to their partitions (halos of a chain: the chunk before, the chunk after).
    pub(crate) halos: Outbox<Piece>,
}

/// How a run ended.
pub(crate) enum Ran<C: Chunk> {
    /// The chunk is finished; for owned partitions (`Job::OWNERSHIP`) the partition stays,
    /// with its halos.
    Done {
        output: C::Output,
        kept: Option<Kept<C>>,
        work: Work,
    },
    /// The host asked for the chunk back; this is its state.
    Yielded { state: C, work: Work },
    /// The chunk's state is lost: the job cannot go on.
    Failed(Error),
}

/// Runs `a` until it is done, or the host stops it, or it fails.
pub(crate) fn run<J: Job>(
    job: &J,
    inputs: &Inputs<J>,
    a: Assignment<J::Chunk>,
    cell: &Cell,
    stats: &mut StepStats,
    host: &mut impl Host,
) -> Ran<J::Chunk> {
    let Assignment {
        chunk,
        phase,
        chunks,
        range,
        state,
    } = a;
    let input = match inputs.get(job) {
        Ok(input) => input,
        Err(e) => return Ran::Failed(e),
    };
    let fresh = state.is_none();
    // A state that arrived as bytes (a restore, a remote worker) is decoded here, on the
    // worker that runs it.
    let state = match state.map(Held::into_live).transpose() {
        Ok(state) => state,
        Err(e) => return Ran::Failed(e),
    };
    let ran = catch(Site::Chunk { phase, chunk }, J::NAME, || {
        let mut c = match state {
            Some(c) => c,
            None => job.chunk(range.clone()),
        };
        c.running_in(phase);
        let before = c.iterations_done().unwrap_or(0);
        let output = loop {
            if let Some(output) = steps(&mut c, job, input, cell, stats) {
                break Some(output);
            }
            match host.attend(cell) {
                Attend::Continue => {}
                Attend::Stop => break None,
                Attend::Capture => capture(&c, stats, |bytes| host.captured(bytes)),
            }
        };
        let iterations = iterations_run(&c, before, fresh, output.is_some(), &range);
        (c, output, iterations)
    });
    let (c, output, iterations) = match ran {
        Ok(r) => r,
        Err(e) => return Ran::Failed(e),
    };
    // An owned partition exports its halos on the worker, right after its last step, and
    // is output there after an output phase (`Partition::output_every`).
    let kept = match (&output, J::OWNERSHIP.hooks) {
        (Some(_), Some(hooks)) => {
            let exported = catch(Site::Chunk { phase, chunk }, J::NAME, || {
                let halos = (hooks.export)(
                    &c,
                    job,
                    At {
                        chunk,
                        chunks,
                        phase,
                    },
                );
                (halos, output_due((hooks.output_every)(job), phase))
            });
            let halos = match exported {
                Ok((halos, false)) => halos,
                Ok((halos, true)) => match super::output(&hooks, &c, job, input, phase, chunk) {
                    Ok(()) => halos,
                    Err(e) => return Ran::Failed(e),
                },
                Err(e) => return Ran::Failed(e),
            };
            Some(halos)
        }
        _ => None,
    };
    let work = Work {
        iterations,
        busy: stats.busy(),
    };
    stats.flush(output.is_some());
    match (output, kept) {
        (Some(output), Some(halos)) => Ran::Done {
            output,
            kept: Some(Kept { state: c, halos }),
            work,
        },
        (Some(output), None) => Ran::Done {
            output,
            kept: None,
            work,
        },
        (None, _) => Ran::Yielded { state: c, work },
    }
}

/// Serializes a running chunk for a snapshot into a buffer of the size of the worker's last
/// capture, hands the bytes over, and records the pause.
fn capture<C: serde::Serialize>(
    c: &C,
    stats: &mut StepStats,
    hand_over: impl FnOnce(Result<Vec<u8>, codec::Error>),
) {
    let paused = Instant::now();
    let bytes = codec::encode_sized("a chunk state", c, stats.capture_hint);
    if let Ok(b) = &bytes {
        stats.capture_hint = b.len();
    }
    hand_over(bytes);
    stats.record_pause(paused.elapsed());
}

/// Iterations done in this run of a chunk: what `iterations_done` says moved since `before`,
/// or, for a chunk that cannot tell, its whole range if it ran from scratch to the end.
fn iterations_run<C: Chunk>(
    c: &C,
    before: u64,
    fresh: bool,
    finished: bool,
    range: &Range<u64>,
) -> u64 {
    match c.iterations_done() {
        Some(now) => now.saturating_sub(before),
        None if fresh && finished => range.end - range.start,
        None => 0,
    }
}

/// Steps `c` until it is done (`Some(output)`) or the flag is raised (`None`).
#[inline]
fn steps<C: Chunk>(
    c: &mut C,
    job: &C::Job,
    input: &<C::Job as Job>::Input,
    cell: &Cell,
    stats: &mut StepStats,
) -> Option<C::Output> {
    let mut last = Instant::now();
    let mut since_publish = Duration::ZERO;
    loop {
        let step = c.step(job, input);
        let now = Instant::now();
        let took = now - last;
        last = now;
        stats.record(took);
        if let Step::Done(output) = step {
            return Some(output);
        }
        if cell.raised() {
            return None;
        }
        since_publish += took;
        if since_publish >= PUBLISH_EVERY {
            since_publish = Duration::ZERO;
            if let Some(done) = c.iterations_done() {
                cell.publish(done);
            }
        }
    }
}
