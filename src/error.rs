//! The crate's error type.

use std::fmt;

use crate::job::BoxError;

/// A `Result` with the crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Where a user callback panicked.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Site {
    /// `Job::chunk` or `Chunk::step` of chunk `chunk` (0-based) in phase `phase`.
    Chunk {
        /// The phase (0-based).
        phase: u64,
        /// The chunk index within the phase.
        chunk: u64,
    },
    /// `Reducer::combine` or `Reducer::identity` in phase `phase`.
    Reducer {
        /// The phase (0-based).
        phase: u64,
    },
    /// `Job::end_phase`, `Job::iterations` or `Job::reducer` between phases.
    Job {
        /// The phase (0-based) that had ended or was starting.
        phase: u64,
    },
    /// `Input::load`.
    Input,
}

impl fmt::Display for Site {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Site::Chunk { phase, chunk } => write!(f, "chunk {chunk} of phase {phase}"),
            Site::Reducer { phase } => write!(f, "the reducer in phase {phase}"),
            Site::Job { phase } => write!(f, "the job between phases (phase {phase})"),
            Site::Input => f.write_str("the input loader"),
        }
    }
}

/// Errors of the executor and of job runs.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A builder or submit setting is out of range.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// User code panicked; the job is stopped, the process and other jobs go on.
    #[error("job {job} panicked in {site}: {message}")]
    Panicked {
        /// The job's name.
        job: &'static str,
        /// Where it panicked.
        site: Site,
        /// The panic message, when it was a string.
        message: String,
    },
    /// The job's [`Input`](crate::Input) could not be loaded.
    #[error("job {job}: loading its input failed")]
    Input {
        /// The job's name.
        job: &'static str,
        /// What the loader returned.
        #[source]
        source: BoxError,
    },
    /// The job was cancelled through its handle.
    #[error("job {job} was cancelled")]
    Cancelled {
        /// The job's name.
        job: &'static str,
    },
    /// Another clone of the handle already took the outcome.
    #[error("the outcome of job {job} was already taken by another handle")]
    OutcomeTaken {
        /// The job's name.
        job: &'static str,
    },
    /// A snapshot store or snapshot error (opening, reading, a corrupt or foreign snapshot).
    #[error(transparent)]
    Snapshot(#[from] crate::snapshot::Error),
    /// A cluster error: an address that cannot be listened on or dialled, a missing token,
    /// a refused handshake.
    #[error(transparent)]
    Cluster(#[from] crate::wire::Error),
    /// A snapshot could not be taken; the job goes on and the previous committed snapshot
    /// stays the latest. The source is why (shared by every requester of that snapshot).
    #[error("snapshot failed")]
    SnapshotFailed(#[source] Cause),
    /// A value could not be encoded or decoded with the snapshot codec.
    #[error("could not encode or decode {what}")]
    Codec {
        /// What it was.
        what: &'static str,
        /// The codec's error.
        #[source]
        source: postcard::Error,
    },
    /// The job was suspended to this snapshot (from [`Executor::run`](crate::Executor::run),
    /// which expects the job to finish).
    #[error("job suspended to snapshot {0}")]
    Suspended(crate::snapshot::SnapshotId),
    /// The job has already ended: nothing to snapshot or suspend.
    #[error("job {job} has already ended")]
    Ended {
        /// The job's name.
        job: &'static str,
    },
    /// A bug in this crate caught by a consistency check; the job is stopped rather than
    /// risk a wrong value. Please report it.
    #[error("internal error: {0}")]
    Internal(String),
    /// A worker thread could not be started.
    #[error("could not start a worker thread")]
    Spawn(#[source] std::io::Error),
}

impl From<crate::codec::Error> for Error {
    fn from(e: crate::codec::Error) -> Error {
        Error::Codec {
            what: e.what,
            source: e.source,
        }
    }
}

/// Why something failed, shared by everyone who waited for it (every requester of one
/// snapshot gets the same cause).
///
/// It is the error itself through [`std::error::Error::source`] and [`Cause::error`], so a
/// report walks the whole chain once. It also derefs to the chain's text, `"outer: inner:
/// …"` (what this variant carried as a `String` before it kept its cause), so
/// `cause.contains("credentials")` still finds a word anywhere in the chain.
#[derive(Debug, Clone)]
pub struct Cause {
    error: std::sync::Arc<Error>,
    text: String,
}

impl Cause {
    /// The error.
    pub fn error(&self) -> &Error {
        &self.error
    }

    pub(crate) fn new(error: Error) -> Cause {
        let mut text = error.to_string();
        let mut next = std::error::Error::source(&error);
        while let Some(e) = next {
            text.push_str(": ");
            text.push_str(&e.to_string());
            next = e.source();
        }
        Cause {
            error: std::sync::Arc::new(error),
            text,
        }
    }
}

impl std::ops::Deref for Cause {
    type Target = str;
    fn deref(&self) -> &str {
        &self.text
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl std::error::Error for Cause {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.error.source()
    }
}

/// The message of a caught panic payload.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a non-string panic payload".to_owned()
    }
}
