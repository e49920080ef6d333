//! The user contract: [`Job`], [`Chunk`], [`Step`], [`Next`] and [`Input`].
//!
//! A job is one parallel computation: a small serializable value that says how large the
//! current phase's iteration space is and how to make a state machine ([`Chunk`]) for a range
//! of it. The executor cuts the space into chunks when a phase starts, runs their steps on
//! whatever workers it has, and folds the chunk outputs with the job's [`Reducer`] in chunk
//! order. Between two steps (an *adjustment point*) a chunk may be moved to another worker,
//! serialized into a snapshot, or handed back by a worker that is being retired.

use std::error::Error as StdError;
use std::ops::Range;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::reduce::Reducer;

/// The value of a job's reduction: what a phase (and the whole job) produces.
pub type Value<J> = <<J as Job>::Reducer as Reducer>::Value;

/// A boxed error, as returned by [`Input::load`].
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// One parallel computation, possibly iterated over several phases.
///
/// The job value is small: it travels to every remote worker once per phase and into every
/// snapshot. Large read-only data are *referenced* by the job (a path, a key, a seed) and
/// loaded once per process through [`Job::Input`].
///
/// # Example
///
/// ```
/// use std::ops::Range;
/// use malleable::{Chunk, Executor, Job, Step, reduce::Sum};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)]
/// struct Squares { n: u64 }
///
/// #[derive(Serialize, Deserialize)]
/// struct SquaresChunk { next: u64, end: u64, acc: u64 }
///
/// impl Job for Squares {
///     const NAME: &'static str = "squares";
///     type Chunk = SquaresChunk;
///     type Reducer = Sum<u64>;
///     type Input = ();
///     fn iterations(&self) -> u64 { self.n }
///     fn chunk(&self, range: Range<u64>) -> SquaresChunk {
///         SquaresChunk { next: range.start, end: range.end, acc: 0 }
///     }
///     fn reducer(&self) -> Sum<u64> { Sum::new() }
/// }
///
/// impl Chunk for SquaresChunk {
///     type Job = Squares;
///     type Output = u64;
///     fn step(&mut self, _job: &Squares, _input: &()) -> Step<u64> {
///         // A bounded slice of work: at most 1000 iterations per step.
///         let stop = self.end.min(self.next + 1000);
///         for i in self.next..stop { self.acc += i * i; }
///         self.next = stop;
///         if self.next == self.end { Step::Done(self.acc) } else { Step::Yield }
///     }
/// }
///
/// let exec = Executor::builder().local_workers(2).build()?;
/// let value = exec.run(Squares { n: 10_000 })?.into_value();
/// assert_eq!(value, (0..10_000u64).map(|i| i * i).sum::<u64>());
/// # Ok::<(), malleable::Error>(())
/// ```
pub trait Job: Serialize + DeserializeOwned + Send + Sync + Sized + 'static {
    /// Stable name: identifies the job's code on remote workers and in snapshots.
    const NAME: &'static str;
    /// The state machine that works through one chunk of a phase.
    type Chunk: Chunk<Job = Self>;
    /// How chunk outputs are combined; they are combined in chunk order.
    type Reducer: Reducer<Value = <Self::Chunk as Chunk>::Output>;
    /// Read-only data built once per process from the job (use `()` when there is none).
    type Input: Input<Self>;

    /// Size of the current phase's iteration space, `0..iterations()`.
    fn iterations(&self) -> u64;
    /// A fresh state machine for `range` of the current phase.
    fn chunk(&self, range: Range<u64>) -> Self::Chunk;
    /// The reducer of the current phase.
    fn reducer(&self) -> Self::Reducer;
    /// Called at the barrier after a phase with the phase's reduced value. May update the job
    /// (the small, broadcast part of its state) and ask for another phase.
    ///
    /// The default finishes after the first phase.
    fn end_phase(&mut self, value: &Value<Self>) -> Next {
        let _ = value;
        Next::Finish
    }
}

/// The body of a loop over one chunk, as a resumable state machine.
///
/// Everything the loop needs to go on must live in `self` (serialized with the chunk), in the
/// job, or in the job's input.
pub trait Chunk: Serialize + DeserializeOwned + Send + Sized + 'static {
    /// The job this chunk belongs to.
    type Job: Job<Chunk = Self>;
    /// What a finished chunk contributes to the reduction.
    type Output: Serialize + DeserializeOwned + Send + 'static;

    /// Does a bounded slice of work (aim for 10 µs – 10 ms) and returns.
    ///
    /// Between two calls the executor may serialize this value, move it to another worker or
    /// process, or drop the worker. After `Step::Done` the chunk is never stepped again.
    fn step(&mut self, job: &Self::Job, input: &<Self::Job as Job>::Input) -> Step<Self::Output>;

    /// Iterations of this chunk already done, for progress reports; `None` (the default) when
    /// the chunk cannot tell, in which case progress counts whole chunks.
    fn iterations_done(&self) -> Option<u64> {
        None
    }
}

/// What one [`Chunk::step`] ended with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step<T> {
    /// More work remains; the chunk is at an adjustment point.
    Yield,
    /// The chunk is finished with this output.
    Done(T),
}

/// What [`Job::end_phase`] asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Run another phase (the job has been updated for it).
    Continue,
    /// The job is finished; its value is the last phase's value.
    Finish,
}

/// Read-only data a job needs on every worker, built once per process from the job value.
///
/// The job references the data (a path, a key, a seed); `load` builds it. The executor loads
/// it lazily, once per job run in each process that runs steps, and shares it between that
/// process's workers. It is never shipped to remote workers nor written into snapshots.
pub trait Input<J>: Send + Sync + Sized + 'static {
    /// Builds the input from the job value (the job as submitted or restored).
    ///
    /// # Errors
    ///
    /// Any error ends the job with [`Error::Input`](crate::Error::Input).
    fn load(job: &J) -> Result<Self, BoxError>;
}

impl<J> Input<J> for () {
    fn load(_job: &J) -> Result<(), BoxError> {
        Ok(())
    }
}
