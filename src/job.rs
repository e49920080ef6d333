//! The user contract: [`Job`], [`Chunk`], [`Step`], [`Next`] and [`Input`].
//!
//! A job is one parallel computation: a small serializable value that says how large the
//! current phase's iteration space is and how to make a state machine ([`Chunk`]) for a range
//! of it. The executor cuts the space into chunks when a phase starts, runs their steps on
//! whatever workers it has, and folds the chunk outputs with the job's [`Reducer`] in chunk
//! order. Between two steps (an *adjustment point*) a chunk may be moved to another worker,
//! serialized into a snapshot, or handed back by a worker that is being retired.
//!
//! # Owned partitions
//!
//! A job whose chunks keep large data from phase to phase (a simulation's grid) declares it
//! with [`Job::OWNERSHIP`] = [`Ownership::PARTITIONS`] and implements [`Partition`] for its
//! chunk. Then a chunk is made once, for phase 0, and lives for the whole job: it is the
//! *partition* of its range, mutated in place by its steps in every phase. After its last step
//! of a phase it exports [`Partition::Halo`]s for its two neighbours; before its first step of
//! the next phase it receives theirs ([`Partition::begin_phase`]). Only halos cross the
//! barrier; partitions stay with the worker that holds them (affinity) and move, as few as
//! possible, only when workers join or leave or their measured speeds diverge. Chunk
//! boundaries are fixed for the job (every phase has the iterations of the first), so the value
//! stays deterministic. The [`Rows`](crate::Rows) shortcut does all of this for a grid
//! partitioned by rows.

use std::error::Error as StdError;
use std::fmt;
use std::ops::Range;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::exchange::{At, Exchange, Gathered, Inbox, Outbox, Pattern, Piece};
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
    /// The version of the job's serialized form (default 1). Bump it when the serialized
    /// form of the job value, its chunk (the chunk state), the chunk's output or its
    /// partition changes (a field added, removed, reordered or retyped): a worker process
    /// built with another version of the job is then refused in the handshake with an error
    /// naming both versions ([`cluster::Error::JobVersion`](crate::cluster::Error::JobVersion)),
    /// instead of failing to decode what it is sent. A change of the fields that was not
    /// followed by a new version is found anyway by the [`Layout`](crate::Layout) of the
    /// job's types, in snapshots and in the handshake
    /// ([`cluster::Error::JobLayout`](crate::cluster::Error::JobLayout)); keep the version
    /// for what a layout does not see (the meaning of the bytes, a custom `Serialize`).
    const VERSION: u32 = 1;
    /// The state machine that works through one chunk of a phase.
    type Chunk: Chunk<Job = Self>;
    /// How chunk outputs are combined; they are combined in chunk order.
    type Reducer: Reducer<Value = <Self::Chunk as Chunk>::Output>;
    /// Read-only data built once per process from the job (use `()` when there is none).
    type Input: Input<Self>;

    /// Whether chunks are made fresh every phase ([`Ownership::NONE`], the default) or are
    /// owned partitions that live across phases ([`Ownership::PARTITIONS`], for a job whose
    /// chunk implements [`Partition`], which says how they work).
    const OWNERSHIP: Ownership<Self> = Ownership::NONE;

    /// Size of the current phase's iteration space, `0..iterations()`.
    fn iterations(&self) -> u64;
    /// A fresh state machine for `range` of the current phase. For a job with owned
    /// partitions this is called once per chunk, for the first phase: it makes the partition.
    fn chunk(&self, range: Range<u64>) -> Self::Chunk;
    /// The reducer of the current phase.
    fn reducer(&self) -> Self::Reducer;
    /// How this job's phases are cut into chunks, overriding the executor's
    /// [`Builder::chunking`](crate::Builder::chunking); `None` (the default) keeps the
    /// executor's. A job with owned partitions is cut the same way in every phase.
    fn chunking(&self) -> Option<crate::Chunking> {
        None
    }
    /// How many phases the job runs in all, when it knows: a hint for the job-level ETA of
    /// [`Progress`](crate::Progress) and for the autoscaler's deadline. Asked at the start
    /// and after every phase (it may change its answer). The default says nothing.
    fn phases(&self) -> Option<u64> {
        None
    }
    /// Called at the barrier after a phase with the phase's reduced value. May update the job
    /// (the small, broadcast part of its state) and ask for another phase.
    ///
    /// The default finishes after the first phase.
    fn end_phase(&mut self, value: &Value<Self>) -> Next {
        let _ = value;
        Next::Finish
    }
    /// Called on `self`, the job value as a snapshot stored it, when
    /// [`Executor::submit_or_resume`](crate::Executor::submit_or_resume) resumes that
    /// snapshot with a `submitted` job value whose bytes differ from those of the value the
    /// snapshot's run was submitted with (`started_with`): `Ok` takes the change (updating
    /// `self` as it needs: "500 more steps" is `self.steps = submitted.steps`), and the run
    /// then counts as submitted with `submitted`; `Err` refuses it, and `submit_or_resume`
    /// fails with [`Error::ResumedJobDiffers`](crate::Error::ResumedJobDiffers) carrying it,
    /// before anything runs.
    ///
    /// The default refuses every change. Only what later phases do may change: the current
    /// phase's iterations and the job's shape (for owned partitions, its chunks) are checked
    /// after this call, and a change is [`Error::ShapeChanged`](crate::Error::ShapeChanged).
    ///
    /// # Errors
    ///
    /// Whatever refuses the change, in words the user will read.
    ///
    /// # Example
    ///
    /// ```
    /// # use std::ops::Range;
    /// # use malleable::{BoxError, Chunk, Job, Next, Step, reduce::Sum};
    /// # use serde::{Deserialize, Serialize};
    /// #[derive(Serialize, Deserialize, PartialEq)]
    /// struct Walk { n: u64, steps: u64, done: u64 }
    /// # #[derive(Serialize, Deserialize)]
    /// # struct WalkChunk;
    /// # impl Chunk for WalkChunk {
    /// #     type Job = Walk;
    /// #     type Output = u64;
    /// #     fn step(&mut self, _: &Walk, _: &()) -> Step<u64> { Step::Done(0) }
    /// # }
    ///
    /// impl Job for Walk {
    ///     // ...
    /// #   const NAME: &'static str = "walk";
    /// #   type Chunk = WalkChunk;
    /// #   type Reducer = Sum<u64>;
    /// #   type Input = ();
    /// #   fn iterations(&self) -> u64 { self.n }
    /// #   fn chunk(&self, _: Range<u64>) -> WalkChunk { WalkChunk }
    /// #   fn reducer(&self) -> Sum<u64> { Sum::new() }
    ///     fn end_phase(&mut self, _: &u64) -> Next {
    ///         self.done += 1;
    ///         if self.done < self.steps { Next::Continue } else { Next::Finish }
    ///     }
    ///     /// More (or fewer) steps may be asked for; nothing else may change.
    ///     fn resumed_with(&mut self, submitted: Walk, started_with: &Walk) -> Result<(), BoxError> {
    ///         if submitted.n != started_with.n {
    ///             return Err(format!("n is {}, was {}", submitted.n, started_with.n).into());
    ///         }
    ///         self.steps = submitted.steps;
    ///         Ok(())
    ///     }
    /// }
    ///
    /// // Stored after 4 of 6 steps; submitted again with 9.
    /// let started_with = Walk { n: 10, steps: 6, done: 0 };
    /// let mut stored = Walk { n: 10, steps: 6, done: 4 };
    /// stored.resumed_with(Walk { n: 10, steps: 9, done: 0 }, &started_with)?;
    /// assert_eq!((stored.steps, stored.done), (9, 4));
    /// assert!(stored.resumed_with(Walk { n: 20, steps: 9, done: 0 }, &started_with).is_err());
    /// # Ok::<(), BoxError>(())
    /// ```
    fn resumed_with(&mut self, submitted: Self, started_with: &Self) -> Result<(), BoxError> {
        let _ = (submitted, started_with);
        Err(Box::new(NoChange))
    }
}

/// The refusal of the default [`Job::resumed_with`] (and of [`Rows`](crate::Rows)' and
/// [`Fold`](crate::Fold)'s).
#[derive(Debug, thiserror::Error)]
#[error(
    "the job takes no change on resume (the default of Job::resumed_with): implement it to \
     take one, resume the job as stored with Builder::resubmit_policy(Resubmit::UseStored), \
     or submit the new job under another job id"
)]
pub(crate) struct NoChange;

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

    /// Called on the worker before the chunk's steps, each time the chunk is handed to a
    /// worker (thread or process), with the 0-based phase those steps belong to: the
    /// executor's count, which a snapshot records, so it is the same after a move, a
    /// rollback or a resume. The default ignores it. ([`Rows`](crate::Rows) bands show it
    /// to `update` as [`Window::phase`](crate::rows::Window::phase).)
    fn running_in(&mut self, phase: u64) {
        let _ = phase;
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

/// A chunk that owns its range's data for the whole job: an *owned partition*.
///
/// A job whose chunks keep large data from phase to phase (a simulation's grid) declares it
/// with [`Job::OWNERSHIP`] = [`Ownership::PARTITIONS`] and implements this trait for its
/// chunk. A chunk is then made once, for phase 0, and lives for the whole job, mutated in
/// place by its steps in every phase. After its last step of a phase it exports a
/// [`Partition::Halo`] for each neighbour; before its first step of the next phase it
/// receives theirs ([`Partition::begin_phase`]). Only halos cross the barrier; partitions
/// stay with the worker that holds them (a thread or a worker process) and move, as few as
/// possible, only when workers join or leave or their measured speeds diverge. Chunk
/// boundaries are fixed for the job (every phase has the iterations of the first), so the
/// value stays deterministic. The [`Rows`](crate::Rows) shortcut does all of this for a grid
/// partitioned by rows.
///
/// The chunk's steps work through its range in every phase, and its state (the partition and
/// the progress within the phase) is what a snapshot stores and a retired worker hands over.
/// A chunk that finished a phase keeps its state: it is not dropped after [`Step::Done`].
pub trait Partition: Chunk {
    /// What a partition exports for a neighbour at the end of a phase (for a five-point
    /// stencil over rows: its first or its last row).
    type Halo: serde::Serialize + DeserializeOwned + Send + 'static;

    /// Called on the worker right after the step that returned [`Step::Done`]: the halos the
    /// neighbours read in the next phase, `(for the chunk before, for the chunk after)`. The
    /// first chunk's first and the last chunk's second halo are dropped.
    fn export(&self, job: &Self::Job) -> (Self::Halo, Self::Halo);

    /// Called at the barrier before the chunk's first step of every phase after the first,
    /// with the job as [`Job::end_phase`] left it and what the neighbours exported for this
    /// chunk: `before` from the chunk before (`None` for the first chunk), `after` from the
    /// chunk after (`None` for the last). It should only take the halos in and rewind the
    /// chunk's progress to the start of its range: it runs while the workers wait.
    fn begin_phase(
        &mut self,
        job: &Self::Job,
        before: Option<Self::Halo>,
        after: Option<Self::Halo>,
    );

    /// How often the partitions are handed to [`Partition::output`]: `Some(k)` after every
    /// `k`-th phase (phases `k - 1`, `2k - 1`, … counted from 0) and after the job's last
    /// phase; `Some(0)` after the last phase only; `None` (the default) never. Asked on the
    /// worker at each chunk's end with the job as it ran the phase, and once more when the
    /// job finishes.
    fn output_every(job: &Self::Job) -> Option<u64> {
        let _ = job;
        None
    }

    /// Writes out this partition as phase `phase` left it (an image, a VTK or HDF5 piece),
    /// when [`Partition::output_every`] asks for it. It runs where the partition is, with
    /// no message to the coordinator: on the worker right after the step that ended the
    /// phase (a thread of this process or of a worker process), or, after the job's last
    /// phase when that was not an output phase already, once the job finished (in this
    /// process for the partitions held here, in the worker process that holds the others),
    /// before [`Executor::run`](crate::Executor::run) returns. `job` is the job as it ran
    /// `phase` (before its `end_phase`).
    ///
    /// A phase that runs again (after a rollback to a snapshot, or a resume) is output
    /// again: write each phase to its own name, replacing what is there.
    ///
    /// # Errors
    ///
    /// An error ends the job with [`Error::Output`](crate::Error::Output); a panic with
    /// [`Error::Panicked`](crate::Error::Panicked) at the chunk.
    fn output(
        &self,
        job: &Self::Job,
        input: &<Self::Job as Job>::Input,
        phase: u64,
    ) -> Result<(), BoxError> {
        let _ = (job, input, phase);
        Ok(())
    }

    /// Whether the finished job hands its partitions back to the caller, in chunk order
    /// ([`Finished::partitions`](crate::Finished::partitions)): those held by worker
    /// processes are brought back first. The default (`false`) leaves them where they are.
    fn gather_at_end(job: &Self::Job) -> bool {
        let _ = job;
        false
    }
}

/// Whether partitions are output ([`Partition::output`]) after `phase` when they are output
/// `every` phases (see [`Partition::output_every`]), not counting the job's last phase.
pub(crate) fn output_due(every: Option<u64>, phase: u64) -> bool {
    matches!(every, Some(k) if k > 0 && (phase + 1) % k == 0)
}

/// Whether a job's chunks are owned partitions: the value of [`Job::OWNERSHIP`].
pub struct Ownership<J: Job> {
    pub(crate) hooks: Option<Hooks<J>>,
}

/// The [`Partition`] or [`Exchange`](crate::Exchange) methods of a job's chunk, reachable
/// from code generic over any [`Job`]. Both are carried as an exchange: a chain's halos are
/// pieces addressed to the chunk before and the chunk after.
pub(crate) struct Hooks<J: Job> {
    /// Every piece the partition exports at the end of a phase, addressed.
    pub(crate) export: fn(&J::Chunk, &J, At) -> Outbox<Piece>,
    /// Begins the next phase of partition `chunk` with the pieces addressed to it, in the
    /// senders' chunk order (and the barrier's shared concatenations, if it keeps them).
    pub(crate) begin: fn(&mut J::Chunk, &J, u64, &mut Inbox<Piece>, Option<&Gathered>),
    /// A piece's bytes, for a worker process (or from one). A piece decoded is its
    /// receiver's own (an allgather's too, where it came with a partition that moved).
    pub(crate) encode_halo: fn(&Piece) -> Result<Vec<u8>, crate::codec::Error>,
    pub(crate) decode_halo: DecodePiece,
    /// An allgather's piece from its bytes, shared by every receiver in the process that
    /// decoded it (protocol 23: a worker process decodes each once a phase). `None`: the
    /// job's partitions exchange with their neighbours only (a [`Partition`]'s halos need
    /// not be `Sync`).
    pub(crate) decode_shared: Option<DecodePiece>,
    /// [`Exchange::neighbours`](crate::Exchange::neighbours); a chain's are `c - 1`, `c + 1`.
    pub(crate) neighbours: Option<Neighbours<J>>,
    /// [`Exchange::pattern`](crate::Exchange::pattern); a chain's is always its neighbours.
    pub(crate) pattern: fn(&J, u64) -> Pattern,
    /// Traces the halo's type, for the job's [`Layout`](crate::Layout).
    pub(crate) trace_halo: crate::layout::Trace,
    /// [`Partition::output_every`].
    pub(crate) output_every: fn(&J) -> Option<u64>,
    /// [`Partition::output`].
    pub(crate) output: Output<J>,
    /// [`Partition::gather_at_end`].
    pub(crate) gather: fn(&J) -> bool,
    /// The job's dimensions beyond its plan, recorded in every snapshot and checked on
    /// resume ([`Manifest::shape`](crate::snapshot::Manifest::shape)); `None`: none.
    pub(crate) shape: Option<fn(&J) -> Vec<crate::snapshot::Dimension>>,
    /// Checks a stored partition's bytes (chunk, its range in the job's plan) against the
    /// job before anything runs, without decoding all of it; `None`: not checked.
    pub(crate) fits: Option<Fits<J>>,
}

/// A piece from its bytes.
pub(crate) type DecodePiece = fn(&[u8]) -> Result<Piece, crate::codec::Error>;

/// [`Exchange::neighbours`](crate::Exchange::neighbours): the job, a chunk, the chunks.
pub(crate) type Neighbours<J> = fn(&J, u64, u64) -> Vec<u64>;

/// [`Partition::output`] of a job's chunk: the partition, the job, its input, the phase.
pub(crate) type Output<J> =
    fn(&<J as Job>::Chunk, &J, &<J as Job>::Input, u64) -> Result<(), BoxError>;

/// Checks the stored bytes of the partition of a chunk against the job and the chunk's
/// range in the job's plan: [`Hooks::fits`].
pub(crate) type Fits<J> = fn(&J, u64, Range<u64>, &[u8]) -> Result<(), Misfit>;

/// How a stored partition does not fit the job (see [`Hooks::fits`]): becomes
/// [`Error::ShapeChanged`](crate::Error::ShapeChanged).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Misfit {
    /// What differs, with its unit.
    pub(crate) what: String,
    /// The partition's value.
    pub(crate) written: u64,
    /// The job's.
    pub(crate) code: u64,
}

impl<J: Job> Clone for Hooks<J> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<J: Job> Copy for Hooks<J> {}

impl<J: Job> Ownership<J> {
    /// Chunks are made fresh every phase by [`Job::chunk`] and dropped when done.
    pub const NONE: Ownership<J> = Ownership { hooks: None };

    /// Whether chunks are owned partitions.
    pub const fn is_partitioned(&self) -> bool {
        self.hooks.is_some()
    }
}

impl<J: Job> Ownership<J>
where
    J::Chunk: Partition,
{
    /// Chunks are owned partitions that live across phases (see [`Partition`]).
    pub const PARTITIONS: Ownership<J> = Ownership {
        hooks: Some(Hooks {
            export: export_chain::<J>,
            begin: begin_chain::<J>,
            encode_halo: crate::exchange::encode_erased::<<J::Chunk as Partition>::Halo>,
            decode_halo: crate::exchange::decode_erased::<<J::Chunk as Partition>::Halo>,
            decode_shared: None,
            neighbours: None,
            pattern: |_, _| Pattern::Neighbours,
            trace_halo: crate::layout::trace::<<J::Chunk as Partition>::Halo>,
            output_every: <J::Chunk as Partition>::output_every,
            output: <J::Chunk as Partition>::output,
            gather: <J::Chunk as Partition>::gather_at_end,
            shape: None,
            fits: None,
        }),
    };
}

impl<J: Job> Ownership<J>
where
    J::Chunk: Exchange,
{
    /// Chunks are owned partitions that live across phases and exchange pieces with any
    /// partitions (see [`Exchange`]).
    pub const EXCHANGES: Ownership<J> = Ownership {
        hooks: Some(Hooks {
            export: crate::exchange::export_erased::<J>,
            begin: |c, job, _, inbox, gathered| {
                crate::exchange::begin_erased::<J>(c, job, inbox, gathered)
            },
            encode_halo: crate::exchange::encode_erased::<<J::Chunk as Exchange>::Piece>,
            decode_halo: crate::exchange::decode_erased::<<J::Chunk as Exchange>::Piece>,
            decode_shared: Some(
                crate::exchange::decode_shared_erased::<<J::Chunk as Exchange>::Piece>,
            ),
            neighbours: Some(<J::Chunk as Exchange>::neighbours),
            pattern: <J::Chunk as Exchange>::pattern,
            trace_halo: crate::layout::trace::<<J::Chunk as Exchange>::Piece>,
            output_every: <J::Chunk as Exchange>::output_every,
            output: <J::Chunk as Exchange>::output,
            gather: <J::Chunk as Exchange>::gather_at_end,
            shape: None,
            fits: None,
        }),
    };
}

impl<J: Job> Ownership<J> {
    /// These owned partitions, whose job records its `shape` in every snapshot and whose
    /// stored partitions `fits` checks on resume (the crate's [`Banded`](crate::Banded)).
    pub(crate) const fn checked(
        self,
        shape: fn(&J) -> Vec<crate::snapshot::Dimension>,
        fits: Fits<J>,
    ) -> Ownership<J> {
        match self.hooks {
            Some(h) => Ownership {
                hooks: Some(Hooks {
                    shape: Some(shape),
                    fits: Some(fits),
                    ..h
                }),
            },
            None => self,
        }
    }
}

impl<J: Job> fmt::Debug for Ownership<J> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.is_partitioned() {
            "Ownership::PARTITIONS"
        } else {
            "Ownership::NONE"
        })
    }
}

/// A chain's halos as pieces: the one for the chunk before, then the one for the chunk
/// after (none past either end).
fn export_chain<J: Job>(c: &J::Chunk, job: &J, at: At) -> Outbox<Piece>
where
    J::Chunk: Partition,
{
    let (before, after) = c.export(job);
    let mut out = Vec::with_capacity(2);
    if let Some(b) = at.chunk.checked_sub(1) {
        out.push((Some(b), Piece::Own(Box::new(before))));
    }
    if at.chunk + 1 < at.chunks {
        out.push((Some(at.chunk + 1), Piece::Own(Box::new(after))));
    }
    out
}

/// A chain's [`Partition::begin_phase`] with the pieces from the chunk before and after.
fn begin_chain<J: Job>(
    c: &mut J::Chunk,
    job: &J,
    chunk: u64,
    inbox: &mut Inbox<Piece>,
    _: Option<&Gathered>,
) where
    J::Chunk: Partition,
{
    let (mut before, mut after) = (None, None);
    // The executor only ever hands a chunk the halos its own type exported.
    for (from, piece) in inbox.drain(..) {
        let halo = piece.take::<<J::Chunk as Partition>::Halo>();
        if Some(from) == chunk.checked_sub(1) {
            before = halo;
        } else if Some(from) == chunk.checked_add(1) {
            after = halo;
        }
    }
    c.begin_phase(job, before, after);
}

/// Jobs for the crate's unit tests.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::{Chunk, Job, Step};

    /// A job of one chunk that is done at its first step: for tests of what surrounds a
    /// job (the wire, errors), not of its chunks.
    #[derive(serde::Serialize, serde::Deserialize)]
    pub(crate) struct Idle;

    /// The chunk of [`Idle`].
    #[derive(serde::Serialize, serde::Deserialize)]
    pub(crate) struct IdleChunk;

    impl Job for Idle {
        const NAME: &'static str = "idle";
        type Chunk = IdleChunk;
        type Reducer = crate::reduce::Sum<u64>;
        type Input = ();
        fn iterations(&self) -> u64 {
            1
        }
        fn chunk(&self, _: std::ops::Range<u64>) -> IdleChunk {
            IdleChunk
        }
        fn reducer(&self) -> Self::Reducer {
            crate::reduce::Sum::new()
        }
    }

    impl Chunk for IdleChunk {
        type Job = Idle;
        type Output = u64;
        fn step(&mut self, _: &Idle, _: &()) -> Step<u64> {
            Step::Done(0)
        }
    }
}
