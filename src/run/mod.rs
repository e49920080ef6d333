//! The chunk runner: one way to run a chunk's steps, used by local threads, the inline worker
//! and the threads of remote worker processes.
//!
//! - `cell.rs`: the per-worker attention flag and progress, and the one memory-ordering
//!   contract every requester and every runner follows.
//! - `runner.rs`: runs a chunk's steps until it is done, handed back or captured, asking its
//!   [`Host`] what to do whenever the flag is raised.
//! - `stop.rs`: the [`SuspendToken`](crate::SuspendToken) (a cancellation token).
//!
//! This layer knows the user contract ([`Job`](crate::Job), [`Chunk`](crate::Chunk)) and the
//! codec, never the executor, the wire or the store: where a request comes from (the job's
//! lock, a frame) and where a result goes (the ledger, a socket) is the host's business.

mod cell;
mod runner;
mod stop;
mod wait;

pub(crate) use cell::{CAPTURE, Cell, INTERRUPT, MAIL};
pub(crate) use runner::{Assignment, Attend, Host, Ran, run};
pub use stop::SuspendToken;
pub(crate) use wait::receive;

use std::sync::{Arc, OnceLock};

use crate::codec;
use crate::error::{Error, Site, panic_message};
use crate::job::{BoxError, Input, Job};

/// Runs user code, turning a panic into [`Error::Panicked`].
pub(crate) fn catch<T>(site: Site, job: &'static str, f: impl FnOnce() -> T) -> Result<T, Error> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|p| Error::Panicked {
        job,
        site,
        message: panic_message(p.as_ref()),
    })
}

/// Hands partition `c` of `chunk` to [`Partition::output`](crate::Partition::output) for
/// phase `phase`: a panic is [`Error::Panicked`] at the chunk, an error [`Error::Output`].
pub(crate) fn output<J: Job>(
    hooks: &crate::job::Hooks<J>,
    c: &J::Chunk,
    job: &J,
    input: &J::Input,
    phase: u64,
    chunk: u64,
) -> Result<(), Error> {
    catch(Site::Chunk { phase, chunk }, J::NAME, || {
        (hooks.output)(c, job, input, phase)
    })?
    .map_err(|source| Error::Output {
        job: J::NAME,
        phase,
        chunk,
        source,
    })
}

/// A chunk's state as whoever holds it has it: live, or as the bytes it arrived in (from a
/// snapshot, or from a remote worker).
///
/// Bytes are decoded only by the worker that runs the chunk next: a restore reads the parts
/// and starts (decoding is spread over the workers and overlaps computing), and a state that
/// goes from one remote worker to another is never decoded on the way. A worker process
/// decodes a state that arrives for a slot on its blocking pool while the thread runs the
/// chunk before it (`worker/thread.rs`, `decode_ahead`). Restored owned partitions that were
/// done in the snapshot's phase are decoded by the coordinator at the next barrier, to export
/// their halos (`begin_partitions`, on every core).
pub(crate) enum Held<C> {
    /// Boxed: the ledger moves states between its tables at every run and every end of
    /// one, and a partition may be hundreds of bytes (most are `Elsewhere` in a cluster).
    Live(Box<C>),
    Bytes(bytes::Bytes),
    /// An owned partition held by the worker process of this connection (the executor's
    /// number for it): only that process has its state.
    Elsewhere(crate::schedule::ProcessId),
    /// An owned partition on its way from the worker process that held it: the worker that
    /// runs it waits for its bytes (an error if that process was lost on the way).
    Fetch(crossbeam_channel::Receiver<Result<bytes::Bytes, Error>>),
    /// An owned partition asked back from the worker process that held it, for a local
    /// worker: as the coordinator's state knows it. Its driver gives the worker a channel in
    /// its place ([`Held::Fetch`]) when it hands the chunk over, and sends the bytes on it.
    Asked(crate::schedule::ChunkId),
}

impl<C: serde::Serialize + serde::de::DeserializeOwned> Held<C> {
    /// The live state, decoding it if needed (and waiting for it, if it is on its way).
    pub(crate) fn into_live(self) -> Result<C, Error> {
        match self {
            Held::Live(c) => Ok(*c),
            Held::Bytes(b) => Ok(codec::decode("a chunk state", &b)?),
            Held::Fetch(rx) => match rx.recv() {
                Ok(Ok(b)) => Ok(codec::decode("a chunk state", &b)?),
                Ok(Err(e)) => Err(e),
                Err(_) => Err(Error::Internal(
                    "a partition on its way was dropped without an answer".into(),
                )),
            },
            Held::Elsewhere(_) | Held::Asked(_) => Err(Error::Internal(
                "the state of a partition held by a worker process was asked for here".into(),
            )),
        }
    }

    /// The state's bytes, encoding it if needed; `None` for a partition that is not here
    /// (held by, or on its way from, a worker process).
    pub(crate) fn to_bytes(&self) -> Option<Result<bytes::Bytes, codec::Error>> {
        match self {
            Held::Live(c) => Some(codec::encode("a chunk state", c).map(bytes::Bytes::from)),
            Held::Bytes(b) => Some(Ok(b.clone())),
            Held::Elsewhere(_) | Held::Fetch(_) | Held::Asked(_) => None,
        }
    }

    /// The connection of the worker process that holds this partition, if one does.
    pub(crate) fn elsewhere(&self) -> Option<crate::schedule::ProcessId> {
        match self {
            Held::Elsewhere(c) => Some(*c),
            _ => None,
        }
    }
}

/// Why a job's input did not load, shared by every worker of the process that asks for it.
#[derive(Debug, Clone)]
pub(crate) enum InputFailure {
    /// `Input::load` returned this error.
    Error(Arc<BoxError>),
    /// `Input::load` panicked with this message.
    Panicked(String),
}

/// A job's input, loaded once per process and job run by the first worker that needs it.
pub(crate) struct Inputs<J: Job>(OnceLock<Result<J::Input, InputFailure>>);

impl<J: Job> Default for Inputs<J> {
    fn default() -> Self {
        Inputs(OnceLock::new())
    }
}

impl<J: Job> Inputs<J> {
    /// The input, loading it on first use.
    ///
    /// # Errors
    ///
    /// [`Error::Input`] with the loader's error as its source, or [`Error::Panicked`] at
    /// [`Site::Input`] if it panicked: the same error for every worker that asks.
    pub(crate) fn get(&self, job: &J) -> Result<&J::Input, Error> {
        let loaded = self.0.get_or_init(|| {
            match catch(Site::Input, J::NAME, || <J::Input as Input<J>>::load(job)) {
                Ok(Ok(input)) => Ok(input),
                Ok(Err(e)) => Err(InputFailure::Error(Arc::new(e))),
                Err(Error::Panicked { message, .. }) => Err(InputFailure::Panicked(message)),
                Err(other) => Err(InputFailure::Panicked(other.to_string())),
            }
        });
        loaded.as_ref().map_err(|f| match f {
            InputFailure::Error(e) => Error::Input {
                job: J::NAME,
                source: Box::new(SharedError(Arc::clone(e))),
            },
            InputFailure::Panicked(message) => Error::Panicked {
                job: J::NAME,
                site: Site::Input,
                message: message.clone(),
            },
        })
    }
}

/// An error shared by several workers (the input's), seen through as itself: its `Display`
/// and `source` are the original's.
#[derive(Debug)]
struct SharedError(Arc<BoxError>);

impl std::fmt::Display for SharedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for SharedError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}
