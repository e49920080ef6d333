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
///
/// # Printing
///
/// `Display` is this error's own message; its causes are its
/// [`source`](std::error::Error::source) chain. `Debug` (`{:?}`, what `main` prints for an
/// error returned with `?`) is the whole report, each cause once, in order, as `anyhow`
/// prints it:
///
/// ```text
/// job heat: loading its input failed
///
/// Caused by:
///     0: reading the table /data/table.bin
///     1: no such file
/// ```
///
/// The alternate form (`{:#?}`) is the structure: variant names and fields, nested.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A builder or submit setting is out of range.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// The timeline of [`Builder::timeline`](crate::Builder::timeline) could not be created.
    #[error("cannot create the timeline {path}")]
    Timeline {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
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
    /// A partition's [`Partition::output`](crate::Partition::output) (or
    /// [`Rows::output`](crate::Rows::output)) returned an error: the job is stopped.
    #[error("job {job}: the output of chunk {chunk} after phase {phase} failed")]
    Output {
        /// The job's name.
        job: &'static str,
        /// The phase whose end was being written (0-based).
        phase: u64,
        /// The chunk whose partition it was.
        chunk: u64,
        /// What the hook returned (from a worker process: its text and its causes').
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
    /// The snapshot store given to [`Builder::snapshots`](crate::Builder::snapshots) cannot be
    /// written, checked at [`Builder::build`](crate::Builder::build): no source when it did
    /// not answer in time.
    #[error(
        "the snapshot store {url} cannot be used: {}; checked when the executor was built \
         (Builder::check_store(false) skips the check)",
        match source {
            Some(_) => "a test object could not be written, read back and deleted",
            None => "it did not answer within the check's time limit",
        }
    )]
    StoreUnusable {
        /// The store's URL.
        url: String,
        /// The check's time limit.
        within: std::time::Duration,
        /// Why, when the store answered.
        #[source]
        source: Option<Box<crate::snapshot::Error>>,
    },
    /// [`Executor::submit_or_resume`](crate::Executor::submit_or_resume) with
    /// [`Resume::Required`](crate::Resume::Required) found no committed snapshot of the job
    /// in the store, and did not start it afresh.
    #[error(
        "nothing to resume: the store {store} holds no committed snapshot of job id {job_id:?}{}",
        others_text(others)
    )]
    NothingToResume {
        /// The store's URL (without credentials).
        store: String,
        /// The job id looked for.
        job_id: String,
        /// Other job ids the store holds, the most alike first (at most 5): a misspelt job
        /// id shows among them, and none at all hints at a misspelt store URL.
        others: Vec<String>,
    },
    /// [`Executor::submit_or_resume`](crate::Executor::submit_or_resume) was given a job
    /// value other than the one the run of the snapshot it would resume was submitted with
    /// (another grid, more steps), and the job did not take the change
    /// ([`Job::resumed_with`](crate::Job::resumed_with), whose default takes none): nothing
    /// ran and nothing was written. The values are compared as their serialized bytes,
    /// shown here as 64-bit digests. Accept the change in `Job::resumed_with`, resume the
    /// job as stored with
    /// [`Builder::resubmit_policy`](crate::Builder::resubmit_policy)`(`[`Resubmit::UseStored`](crate::Resubmit::UseStored)`)`,
    /// or start the new job under another job id.
    #[error(
        "job {job}: the job submitted (digest {submitted}) is not the one the run of snapshot \
         {snapshot} was submitted with (digest {started_with}){}, and the job does not take \
         the change",
        field_text(field)
    )]
    ResumedJobDiffers {
        /// The job's name.
        job: &'static str,
        /// The snapshot that would have been resumed.
        snapshot: crate::snapshot::SnapshotId,
        /// The digest of the submitted job value's bytes.
        submitted: crate::Fingerprint,
        /// The digest of the bytes of the job value the snapshot's run was submitted with.
        started_with: crate::Fingerprint,
        /// The first field (`Heat.steps`) whose value differs, when the job's layout could
        /// be traced and both values walked.
        field: Option<String>,
        /// What [`Job::resumed_with`](crate::Job::resumed_with) returned.
        #[source]
        refusal: BoxError,
    },
    /// A resume found that the job's shape in this program is not the one the snapshot was
    /// written with: the iterations or chunks of its phase, for a [`Rows`](crate::Rows)
    /// grid its height, bands, rows per band, width or element size, or an owned partition
    /// whose range or width does not fit the job. Checked before anything runs (a grid of
    /// another width would otherwise resume on the old one, or hand a row of the wrong
    /// length to the job's code). The shape is fixed for a job: resume with the code that
    /// wrote the snapshot, or start the new shape afresh under another job id.
    #[error(
        "job {job} cannot resume snapshot {snapshot}: {what} is {code} in this program's \
         code but {written} in the snapshot"
    )]
    ShapeChanged {
        /// The job's name.
        job: &'static str,
        /// The snapshot.
        snapshot: crate::snapshot::SnapshotId,
        /// What differs, with its unit (`"width (cells per row)"`, `"iterations of phase
        /// 2"`, `"rows of band 29"`).
        what: String,
        /// Its value in the snapshot.
        written: u64,
        /// Its value in this program's code (for the job value as stored).
        code: u64,
    },
    /// Another run holds the job id's lease in the store: this run was refused before any
    /// work (two runs of one job id would interleave their snapshots). A run started while
    /// the store could not be reached takes the lease later, before its first commit, and
    /// ends with this error if it finds the job id held then. The holder's lease
    /// expires unless it renews it; a run that ended released it, a run that died holds it
    /// until then (see [`Builder::job_lease`](crate::Builder::job_lease)).
    #[error(
        "job id {job_id:?} is held in {store} by another run: {}; its lease expires in {} \
         unless that run renews it",
        match holder {
            Some(h) => h.to_string(),
            None => "a run whose lease record cannot be read".to_owned(),
        },
        lease_secs(*expires_in)
    )]
    JobIdHeld {
        /// The job id.
        job_id: String,
        /// The store's URL (without credentials).
        store: String,
        /// The run that holds it, when its lease record can be read.
        holder: Option<Box<crate::snapshot::LeaseHolder>>,
        /// How long until its lease expires unless renewed, as this run judges it (see
        /// "Clocks" in [`Builder::job_lease`](crate::Builder::job_lease)).
        expires_in: std::time::Duration,
    },
    /// This run lost its job id's lease (another run took it over after it expired, or it
    /// could not be renewed in time): it commits no snapshot any more, and ended. The
    /// source is the last error of a renewal, if one failed.
    #[error("job id {job_id:?} in {store}: this run lost its lease ({reason}) and stopped")]
    LeaseLost {
        /// The job id.
        job_id: String,
        /// The store's URL (without credentials).
        store: String,
        /// How it was lost.
        reason: crate::snapshot::LeaseLoss,
        /// The last failure to renew it, if any.
        #[source]
        source: Option<std::sync::Arc<crate::snapshot::Error>>,
    },
    /// A cluster error: an address that cannot be listened on or dialled, a missing token,
    /// a refused handshake.
    #[error(transparent)]
    Cluster(#[from] crate::wire::Error),
    /// A snapshot could not be taken; the job goes on and the previous committed snapshot
    /// stays the latest. The source is why (shared by every requester of that snapshot).
    #[error("snapshot failed")]
    SnapshotFailed(#[source] Cause),
    /// [`Builder::max_snapshot_failures`](crate::Builder::max_snapshot_failures) snapshots
    /// failed in a row, so the job was ended rather than run on without a restore point.
    /// The last committed snapshot, if any, stays in the store: resume from it. The source
    /// is the last failure's cause.
    #[error("job {job} ended after {failures} snapshots in a row failed")]
    SnapshotsFailing {
        /// The job's name.
        job: &'static str,
        /// Snapshots that failed in a row.
        failures: u32,
        /// The last snapshot this run committed or was resumed from, if any.
        last_committed: Option<crate::snapshot::SnapshotId>,
        /// Why the last one failed.
        #[source]
        last: Cause,
    },
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
    /// [`Executor::shutdown`](crate::Executor::shutdown) gave up waiting: worker processes
    /// of ended jobs not yet sent their `End`, or snapshot writes still in flight, were
    /// abandoned.
    #[error(
        "the executor's shutdown gave up after {after:?}: {connections} worker connections had \
         not delivered their last frames, {writes} snapshot write tasks were still running"
    )]
    ShutdownTimedOut {
        /// Connections to worker processes of ended jobs that had not delivered `End`.
        connections: usize,
        /// Tasks of snapshot writes still running: a snapshot's write and each of its parts'
        /// uploads count one.
        writes: usize,
        /// The time limit.
        after: std::time::Duration,
    },
    /// A worker thread could not be started.
    #[error("could not start a worker thread")]
    Spawn(#[source] std::io::Error),
    /// Owned partitions were lost with the worker that held them (a worker process that
    /// died after the first phase) and the run had committed no snapshot to roll back to:
    /// the job cannot go on from this run's state. With snapshots (a period, a deadline or
    /// an explicit one) the job rolls back instead ([`JobHandle::rollbacks`]).
    ///
    /// [`JobHandle::rollbacks`]: crate::JobHandle::rollbacks
    #[error(
        "job {job} lost the owned partitions of chunks {chunks:?} with their worker, and no snapshot was committed to roll back to"
    )]
    PartitionsLost {
        /// The job's name.
        job: &'static str,
        /// The chunks whose partitions were lost.
        chunks: Vec<u64>,
    },
    /// The owned partition of `chunk` was lost with the worker process that held it before
    /// it was taken: the cause of a snapshot that needed it (the job itself rolls back, see
    /// [`JobHandle::rollbacks`](crate::JobHandle::rollbacks)), or of a local worker's wait
    /// for it. ([`Error::PartitionsLost`] is the end of a job with nothing to roll back to.)
    #[error(
        "job {job} lost the owned partition of chunk {chunk} with its worker before it was taken"
    )]
    PartitionGone {
        /// The job's name.
        job: &'static str,
        /// The chunk whose partition was lost.
        chunk: u64,
    },
    /// Owned partitions were lost with their worker and the snapshot to roll back to could
    /// not be read back (the source says why: the store, a damaged part, a job that does not
    /// decode). The snapshot stays in the store.
    #[error(
        "job {job} lost the owned partitions of chunks {lost:?} and could not roll back to snapshot {epoch}"
    )]
    RollbackFailed {
        /// The job's name.
        job: &'static str,
        /// The chunks whose partitions were lost.
        lost: Vec<u64>,
        /// The epoch of the snapshot it tried to roll back to.
        epoch: u64,
        /// Why the snapshot could not be read or restored.
        #[source]
        source: Box<Error>,
    },
    /// After a rollback, a worker process could not read from the snapshot store the part of
    /// a restored partition placed on it (the source is its error, as it reported it). The
    /// snapshot stays in the store.
    #[error(
        "job {job}: worker process {peer} could not read the restored partition of chunk {chunk} from the snapshot store"
    )]
    PartUnreadable {
        /// The job's name.
        job: &'static str,
        /// The chunk.
        chunk: u64,
        /// The worker process.
        peer: String,
        /// Its error.
        #[source]
        source: BoxError,
    },
    /// A job whose partitions exchange pieces ([`Exchange`](crate::Exchange)) declared
    /// neighbours that are not a graph pieces can be routed on: found when a run starts,
    /// before anything runs.
    #[error("job {job}: the neighbours of chunk {chunk} are not a graph")]
    Neighbours {
        /// The job's name.
        job: &'static str,
        /// The first chunk (in chunk order) whose neighbours are at fault.
        chunk: u64,
        /// What is wrong with them.
        #[source]
        problem: crate::exchange::GraphError,
    },
    /// A job with owned partitions asked for a phase cut into other chunks than its first:
    /// its partitions would not fit. Its iterations and chunking must stay the same.
    #[error(
        "job {job} has owned partitions, but phase {phase} has {found} iterations in {found_chunks} chunks where the job has {expected} in {expected_chunks}"
    )]
    PartitionsChanged {
        /// The job's name.
        job: &'static str,
        /// The phase that would not fit.
        phase: u64,
        /// Iterations of the job's phases.
        expected: u64,
        /// Chunks of the job's phases.
        expected_chunks: u64,
        /// Iterations the phase asked for.
        found: u64,
        /// Chunks the phase asked for.
        found_chunks: u64,
    },
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
/// …"`, each cause said once as [`error_chain`] prints it (what this variant carried as a
/// `String` before it kept its cause), so `cause.contains("credentials")` still finds a word
/// anywhere in the chain.
///
/// `Debug` is the report of the error (`{:?}`) or its structure (`{:#?}`), as
/// [`Error`]'s.
#[derive(Clone)]
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
        let text = error_chain(&error);
        Cause {
            error: std::sync::Arc::new(error),
            text,
        }
    }
}

impl fmt::Debug for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if f.alternate() {
            f.debug_tuple("Cause").field(&self.error).finish()
        } else {
            write_report(self, f)
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

/// A lease's time left, rounded to tenths of a second (`12.3 s`).
fn lease_secs(d: std::time::Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

/// The end of [`Error::NothingToResume`]'s message: what else the store holds.
fn others_text(others: &[String]) -> String {
    if others.is_empty() {
        "; it holds no job at all (is its URL right?)".to_owned()
    } else {
        format!("; job ids in it: {}", others.join(", "))
    }
}

/// The part of [`Error::ResumedJobDiffers`]'s message that names the field that differs.
fn field_text(field: &Option<String>) -> String {
    match field {
        Some(f) => format!("; they differ first in `{f}`"),
        None => String::new(),
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

/// The text of `e` and of each of its sources, outermost first, each said once: an error as
/// the log, the timeline and the wire carry it.
///
/// This crate's errors do not print their source in their own message, but other crates'
/// do: `object_store`'s S3 errors print theirs, which print theirs, so a refused connection
/// read three times over. A source whose text the link before it already contains is left
/// out (its own sources are still walked).
pub(crate) fn chain_texts(e: &dyn std::error::Error) -> Vec<String> {
    let mut texts = vec![e.to_string()];
    let mut next = e.source();
    while let Some(s) = next {
        let text = s.to_string();
        if !texts.last().is_some_and(|said| said.contains(&text)) {
            texts.push(text);
        }
        next = s.source();
    }
    texts
}

/// An error and its causes on one line, `error: cause: cause of the cause`, each said once
/// (a cause whose text the one before it already contains, as `object_store`'s errors
/// contain their sources', is left out): how the `snapshots` command prints an error, and
/// the text a [`Cause`] derefs to.
///
/// ```
/// let e = malleable::snapshot::Store::open("ftp://host/x").unwrap_err();
/// assert_eq!(
///     malleable::error_chain(&e),
///     "invalid store URL \"ftp://host/x\": unsupported scheme \"ftp\": use file://, memory:// or s3://"
/// );
/// ```
pub fn error_chain(e: &dyn std::error::Error) -> String {
    chain_texts(e).join(": ")
}

/// Writes `e` as a report: its message, then each of its sources once, outermost first,
/// under "Caused by:" (numbered when there are several; a message of several lines stays
/// indented), the layout `anyhow` gives `{:?}`. `Debug` of the crate's public errors, so
/// that an error `main` returns with `?` prints as a readable chain.
pub(crate) fn write_report(e: &dyn std::error::Error, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    let texts = chain_texts(e);
    let Some((message, causes)) = texts.split_first() else {
        return Ok(());
    };
    f.write_str(message)?;
    if causes.is_empty() {
        return Ok(());
    }
    f.write_str("\n\nCaused by:")?;
    let numbered = causes.len() > 1;
    for (n, cause) in causes.iter().enumerate() {
        for (i, line) in cause.split('\n').enumerate() {
            f.write_str("\n")?;
            match (i, numbered) {
                (0, true) => write!(f, "{n:>5}: ")?,
                (_, true) => f.write_str("       ")?,
                (_, false) => f.write_str("    ")?,
            }
            f.write_str(line)?;
        }
    }
    Ok(())
}

/// `Debug` for a public error enum: the report ([`write_report`]) for `{:?}`, the structure
/// (as `#[derive(Debug)]` gives it) for `{:#?}`. Every variant is listed with every field,
/// and the match has no wildcard, so a variant or a field added to the enum and not here is
/// a compile error.
///
/// ```text
/// debug_as_report!(Error {
///     Io { peer, source },
///     Token(text),
/// });
/// ```
macro_rules! debug_as_report {
    ($ty:ident { $( $variant:ident $( ( $($pos:ident),* ) )? $( { $($field:ident),* } )? ),* $(,)? }) => {
        impl ::std::fmt::Debug for $ty {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                if !f.alternate() {
                    return $crate::error::write_report(self, f);
                }
                match self {
                    $(
                        $ty::$variant $( ( $($pos),* ) )? $( { $($field),* } )? => {
                            $( return f.debug_tuple(stringify!($variant))
                                $( .field($pos) )*
                                .finish(); )?
                            $( return f.debug_struct(stringify!($variant))
                                $( .field(stringify!($field), $field) )*
                                .finish(); )?
                        }
                    )*
                }
            }
        }
    };
}
pub(crate) use debug_as_report;

debug_as_report!(Error {
    InvalidConfig(text),
    Timeline { path, source },
    Panicked { job, site, message },
    Input { job, source },
    Output { job, phase, chunk, source },
    Cancelled { job },
    OutcomeTaken { job },
    Snapshot(inner),
    StoreUnusable { url, within, source },
    Cluster(inner),
    SnapshotFailed(cause),
    SnapshotsFailing { job, failures, last_committed, last },
    Codec { what, source },
    Suspended(id),
    Ended { job },
    Internal(text),
    ShutdownTimedOut { connections, writes, after },
    Spawn(source),
    PartitionsLost { job, chunks },
    PartitionGone { job, chunk },
    RollbackFailed { job, lost, epoch, source },
    PartUnreadable { job, chunk, peer, source },
    PartitionsChanged { job, phase, expected, expected_chunks, found, found_chunks },
    Neighbours { job, chunk, problem },
    NothingToResume { store, job_id, others },
    ResumedJobDiffers { job, snapshot, submitted, started_with, field, refusal },
    ShapeChanged { job, snapshot, what, written, code },
    JobIdHeld { job_id, store, holder, expires_in },
    LeaseLost { job_id, store, reason, source },
});

#[cfg(test)]
mod tests {
    //! Chained `Display`: a variant that exposes its cause through `source()` does not print
    //! it in its own message too, so a report that walks the chain shows each cause once.

    use std::error::Error as StdError;
    use std::io;

    use super::{Cause, Error};
    use crate::snapshot::Error as SnapshotError;
    use crate::wire::Error as ClusterError;

    /// The text of `e` and of every source, none left out (`chain_texts` leaves out those
    /// their parent repeats, which is what this test looks for).
    fn raw_texts(e: &dyn StdError) -> Vec<String> {
        let mut texts = vec![e.to_string()];
        let mut next = e.source();
        while let Some(s) = next {
            texts.push(s.to_string());
            next = s.source();
        }
        texts
    }

    /// Whether no link of `e`'s chain prints its source's message; if one does, which.
    fn no_repeats(e: &dyn StdError) -> Result<(), String> {
        let texts = raw_texts(e);
        if texts.len() < 2 {
            return Err(format!("{e:?} has no source"));
        }
        match texts.windows(2).find(|pair| pair[0].contains(&pair[1])) {
            None => Ok(()),
            Some(pair) => Err(format!("{:?} repeats its cause {:?}", pair[0], pair[1])),
        }
    }

    /// An input loader's error: a context with the I/O error as its source.
    #[derive(Debug, thiserror::Error)]
    #[error("reading the table {path}")]
    struct Context {
        path: &'static str,
        #[source]
        source: io::Error,
    }

    fn io_error() -> io::Error {
        io::Error::new(io::ErrorKind::ConnectionReset, "the peer reset the socket")
    }

    fn codec_error() -> postcard::Error {
        postcard::Error::DeserializeUnexpectedEnd
    }

    // Sources of the store's variants: object_store variants without a source of their own
    // (object_store's variants that have one print it too, which is not this crate's to fix).
    fn store_error() -> object_store::Error {
        object_store::Error::NotImplemented {
            operation: "put_opts".to_owned(),
            implementer: "a test store".to_owned(),
        }
    }

    /// One value of every variant of `cluster::Error` that has a source.
    fn cluster_errors() -> Vec<ClusterError> {
        // Naming every variant: a new one must be sorted here, with a value if it has a
        // source.
        let sourced = |e: &ClusterError| match e {
            ClusterError::Io { .. }
            | ClusterError::Address { .. }
            | ClusterError::Undecodable { .. } => true,
            ClusterError::Closed { .. }
            | ClusterError::HandshakeTimeout { .. }
            | ClusterError::LeaseExpired { .. }
            | ClusterError::NotAPeer { .. }
            | ClusterError::Version { .. }
            | ClusterError::Auth { .. }
            | ClusterError::UnknownJob { .. }
            | ClusterError::JobEnded { .. }
            | ClusterError::JobVersion { .. }
            | ClusterError::JobLayout { .. }
            | ClusterError::Rejected { .. }
            | ClusterError::Environment { .. }
            | ClusterError::FrameTooLarge { .. }
            | ClusterError::HandshakeTooLarge { .. }
            | ClusterError::MessageTooLarge { .. }
            | ClusterError::Malformed { .. }
            | ClusterError::Refused { .. }
            | ClusterError::PeerSession { .. }
            | ClusterError::NoToken { .. }
            | ClusterError::Token(_) => false,
        };
        let all = vec![
            ClusterError::Io {
                peer: "127.0.0.1:7070".to_owned(),
                source: io_error(),
            },
            ClusterError::Address {
                addr: "example.invalid:7070".to_owned(),
                source: io::Error::new(io::ErrorKind::NotFound, "no such host"),
            },
            ClusterError::Undecodable {
                peer: "127.0.0.1:7070".to_owned(),
                job: "walk".to_owned(),
                version: 1,
                what: "a chunk output",
                here: true,
                source: codec_error(),
            },
        ];
        assert!(all.iter().all(sourced));
        all
    }

    /// One value of every variant of `snapshot::Error` that has a source.
    fn snapshot_errors() -> Vec<SnapshotError> {
        let sourced = |e: &SnapshotError| match e {
            SnapshotError::Decode { .. }
            | SnapshotError::Damaged { .. }
            | SnapshotError::Undecodable { .. }
            | SnapshotError::Denied { .. }
            | SnapshotError::Store { .. }
            | SnapshotError::Io { .. } => true,
            SnapshotError::BadMagic { .. }
            | SnapshotError::UnsupportedVersion { .. }
            | SnapshotError::Truncated { .. }
            | SnapshotError::TrailingBytes { .. }
            | SnapshotError::Size { .. }
            | SnapshotError::Checksum { .. }
            | SnapshotError::WrongJob { .. }
            | SnapshotError::WrongJobVersion { .. }
            | SnapshotError::LayoutChanged { .. }
            | SnapshotError::Inconsistent(_)
            | SnapshotError::NotFound { .. }
            | SnapshotError::EpochTaken { .. }
            | SnapshotError::InvalidJobId { .. }
            | SnapshotError::InvalidId { .. }
            | SnapshotError::InvalidUrl { .. }
            | SnapshotError::InvalidOption { .. }
            | SnapshotError::NoSuchStore { .. } => false,
        };
        let all = vec![
            SnapshotError::Decode {
                what: "the manifest".to_owned(),
                source: codec_error(),
            },
            SnapshotError::Damaged {
                snapshot: crate::snapshot::SnapshotId::new("job", 4),
                object: "job/00000000000000000003/parts/0-1-00ff".to_owned(),
                check: crate::snapshot::Check::Missing,
                source: Box::new(SnapshotError::NotFound {
                    what: "object \"job/00000000000000000003/parts/0-1-00ff\"".to_owned(),
                }),
            },
            SnapshotError::Undecodable {
                snapshot: crate::snapshot::SnapshotId::new("job", 4),
                what: "the job",
                source: codec_error(),
            },
            SnapshotError::Denied {
                op: "put",
                key: "job/manifests/1".to_owned(),
                source: store_error(),
            },
            SnapshotError::Store {
                op: "get",
                key: "job/parts/1".to_owned(),
                source: store_error(),
            },
            SnapshotError::Io {
                what: "cannot create the snapshot folder /nowhere".to_owned(),
                source: io::Error::new(io::ErrorKind::PermissionDenied, "read-only disk"),
            },
        ];
        assert!(all.iter().all(sourced));
        all
    }

    /// One value of every variant of the crate's `Error` that has a source; the transparent
    /// ones once per source variant of what they wrap.
    fn errors() -> Vec<Error> {
        let sourced = |e: &Error| match e {
            Error::Input { .. }
            | Error::Output { .. }
            | Error::Snapshot(_)
            | Error::Cluster(_)
            | Error::SnapshotFailed(_)
            | Error::Codec { .. }
            | Error::RollbackFailed { .. }
            | Error::PartUnreadable { .. }
            | Error::StoreUnusable { .. }
            | Error::Timeline { .. }
            | Error::SnapshotsFailing { .. }
            | Error::ResumedJobDiffers { .. }
            | Error::LeaseLost { .. }
            | Error::Neighbours { .. }
            | Error::Spawn(_) => true,
            Error::InvalidConfig(_)
            | Error::Panicked { .. }
            | Error::Cancelled { .. }
            | Error::OutcomeTaken { .. }
            | Error::Suspended(_)
            | Error::Ended { .. }
            | Error::Internal(_)
            | Error::PartitionsChanged { .. }
            | Error::PartitionsLost { .. }
            | Error::PartitionGone { .. }
            | Error::NothingToResume { .. }
            | Error::ShapeChanged { .. }
            | Error::JobIdHeld { .. }
            | Error::ShutdownTimedOut { .. } => false,
        };
        let mut all = vec![
            Error::Input {
                job: "walk",
                source: Box::new(Context {
                    path: "/data/table.bin",
                    source: io::Error::new(io::ErrorKind::NotFound, "no such file"),
                }),
            },
            Error::Codec {
                what: "a chunk state",
                source: codec_error(),
            },
            Error::Output {
                job: "heat",
                phase: 9,
                chunk: 2,
                source: Box::new(io::Error::new(io::ErrorKind::StorageFull, "disk full")),
            },
            Error::Spawn(io::Error::new(io::ErrorKind::OutOfMemory, "no memory")),
            Error::Timeline {
                path: "/read-only/run.jsonl".into(),
                source: io::Error::new(io::ErrorKind::PermissionDenied, "read-only disk"),
            },
            Error::SnapshotFailed(Cause::new(Error::Codec {
                what: "a chunk state",
                source: codec_error(),
            })),
            Error::StoreUnusable {
                url: "s3://bucket/prefix".into(),
                within: std::time::Duration::from_secs(10),
                source: Some(Box::new(crate::snapshot::Error::Io {
                    what: "cannot connect".into(),
                    source: io::Error::new(io::ErrorKind::ConnectionRefused, "refused"),
                })),
            },
            Error::SnapshotsFailing {
                job: "heat",
                failures: 3,
                last_committed: None,
                last: Cause::new(Error::Codec {
                    what: "a chunk state",
                    source: codec_error(),
                }),
            },
            Error::PartUnreadable {
                job: "heat",
                chunk: 3,
                peer: "127.0.0.1:4000".into(),
                source: Box::new(Context {
                    path: "/data/table.bin",
                    source: io::Error::new(io::ErrorKind::NotFound, "no such file"),
                }),
            },
            Error::Neighbours {
                job: "heat3d",
                chunk: 4,
                problem: crate::exchange::GraphError::NotSymmetric { neighbour: 5 },
            },
            Error::RollbackFailed {
                job: "heat",
                lost: vec![3],
                epoch: 7,
                source: Box::new(Error::Codec {
                    what: "the job",
                    source: codec_error(),
                }),
            },
            Error::ResumedJobDiffers {
                job: "heat",
                snapshot: crate::snapshot::SnapshotId::new("heat", 3),
                submitted: crate::Fingerprint(1),
                started_with: crate::Fingerprint(2),
                field: Some("Heat.steps".into()),
                refusal: "the grid's size cannot change".into(),
            },
            Error::LeaseLost {
                job_id: "heat".into(),
                store: "s3://bucket/prefix".into(),
                reason: crate::snapshot::LeaseLoss::Expired,
                source: Some(std::sync::Arc::new(crate::snapshot::Error::Io {
                    what: "cannot connect".into(),
                    source: io::Error::new(io::ErrorKind::ConnectionRefused, "refused"),
                })),
            },
        ];
        all.extend(cluster_errors().into_iter().map(Error::Cluster));
        all.extend(snapshot_errors().into_iter().map(Error::Snapshot));
        // A snapshot that failed for each cluster and store reason.
        all.extend(
            cluster_errors()
                .into_iter()
                .map(|e| Error::SnapshotFailed(Cause::new(Error::Cluster(e)))),
        );
        all.extend(
            snapshot_errors()
                .into_iter()
                .map(|e| Error::SnapshotFailed(Cause::new(Error::Snapshot(e)))),
        );
        assert!(all.iter().all(sourced));
        all
    }

    #[test]
    fn no_variant_prints_its_source() {
        let mut checked = 0;
        let mut repeats = Vec::new();
        let cluster = cluster_errors();
        let snapshot = snapshot_errors();
        let crate_errors = errors();
        let all = (cluster.iter().map(|e| e as &dyn StdError))
            .chain(snapshot.iter().map(|e| e as &dyn StdError))
            .chain(crate_errors.iter().map(|e| e as &dyn StdError));
        for e in all {
            checked += 1;
            if let Err(why) = no_repeats(e) {
                repeats.push(why);
            }
        }
        assert!(checked >= 20, "only {checked} values checked");
        assert!(repeats.is_empty(), "{}", repeats.join("\n"));
    }

    #[test]
    fn the_context_stays_in_the_message() {
        let [io, address, _] = <[ClusterError; 3]>::try_from(cluster_errors()).unwrap();
        assert_eq!(io.to_string(), "connection with 127.0.0.1:7070");
        assert_eq!(address.to_string(), "address example.invalid:7070");
        assert_eq!(
            super::chain_texts(&Error::SnapshotFailed(Cause::new(Error::Cluster(io)))),
            [
                "snapshot failed",
                "connection with 127.0.0.1:7070",
                "the peer reset the socket"
            ]
        );
    }

    /// An error of another crate that prints its source in its own message, as
    /// `object_store`'s and its HTTP client's do.
    #[derive(Debug, thiserror::Error)]
    #[error("tcp connect error: {source}")]
    struct Loud {
        source: io::Error,
    }

    /// A store error as an S3 endpoint that refuses connections gives it: every level of
    /// `object_store` prints the one below. Each is said once.
    #[test]
    fn a_cause_its_parent_already_says_is_said_once() {
        let refused = || SnapshotError::Store {
            op: "list",
            key: String::new(),
            source: object_store::Error::Generic {
                store: "S3",
                source: Box::new(Loud {
                    source: io::Error::new(
                        io::ErrorKind::ConnectionRefused,
                        "Connection refused (os error 111)",
                    ),
                }),
            },
        };
        let once = "object store list of \"\" failed: Generic S3 error: tcp connect error: \
                    Connection refused (os error 111)";
        assert_eq!(raw_texts(&refused()).len(), 4);
        assert_eq!(super::error_chain(&refused()), once);
        assert_eq!(super::chain_texts(&refused()).len(), 2);
        let cause = Cause::new(Error::Snapshot(refused()));
        assert_eq!(&*cause, once);
        assert_eq!(
            super::error_chain(&Error::SnapshotFailed(cause)),
            format!("snapshot failed: {once}")
        );
        // The sources are all still there, for code that looks for the refused connection.
        let error = refused();
        let mut next: Option<&dyn StdError> = Some(&error);
        let mut io_found = false;
        while let Some(e) = next {
            io_found |= e.downcast_ref::<io::Error>().is_some();
            next = e.source();
        }
        assert!(io_found);
    }

    /// `{:?}` (what `main` prints for an error returned with `?`) is the report: the message,
    /// then each cause once, in order; `{:#?}` is the structure, with the variants' names.
    #[test]
    fn debug_is_the_report_and_the_alternate_form_the_structure() {
        let err = Error::RollbackFailed {
            job: "heat",
            lost: vec![3],
            epoch: 7,
            source: Box::new(Error::Input {
                job: "heat",
                source: Box::new(Context {
                    path: "/data/table.bin",
                    source: io::Error::new(io::ErrorKind::NotFound, "no such file"),
                }),
            }),
        };
        assert_eq!(
            format!("{err:?}"),
            "job heat lost the owned partitions of chunks [3] and could not roll back to \
             snapshot 7\n\
             \n\
             Caused by:\n    \
             0: job heat: loading its input failed\n    \
             1: reading the table /data/table.bin\n    \
             2: no such file"
        );
        let structure = format!("{err:#?}");
        for part in [
            "RollbackFailed {",
            "job: \"heat\"",
            "epoch: 7",
            "Input {",
            "Context {",
            "NotFound",
        ] {
            assert!(structure.contains(part), "{part:?} not in {structure}");
        }
        // One cause: not numbered (as anyhow prints it).
        let spawn = Error::Spawn(io::Error::new(io::ErrorKind::OutOfMemory, "no memory"));
        assert_eq!(
            format!("{spawn:?}"),
            "could not start a worker thread\n\nCaused by:\n    no memory"
        );
        // No cause: the message alone.
        let cancelled = Error::Cancelled { job: "heat" };
        assert_eq!(format!("{cancelled:?}"), "job heat was cancelled");
        assert_eq!(
            format!("{cancelled:#?}"),
            "Cancelled {\n    job: \"heat\",\n}"
        );
    }

    /// The areas' errors print the same way, alone and inside the crate's error (whose
    /// transparent variants are their inner error's report); a message of several lines
    /// stays indented under its number.
    #[test]
    fn the_areas_errors_print_as_reports_too() {
        let auth = || ClusterError::Auth {
            peer: "10.0.0.7:7070".to_owned(),
            failure: crate::wire::AuthFailure::CoordinatorProof { token: true },
        };
        let shown = format!("{:?}", auth());
        assert_eq!(shown, auth().to_string());
        assert!(shown.starts_with("the coordinator at 10.0.0.7:7070 does not hold"));
        assert!(!shown.contains("Auth {"), "{shown}");
        assert_eq!(format!("{:?}", Error::Cluster(auth())), shown);
        let structure = format!("{:#?}", Error::Cluster(auth()));
        assert!(
            structure.starts_with("Cluster(\n    Auth {") && structure.contains("CoordinatorProof"),
            "{structure}"
        );

        let damaged = snapshot_errors().swap_remove(1);
        let report = format!("{damaged:?}");
        let texts = super::chain_texts(&damaged);
        assert_eq!(texts.len(), 2);
        assert_eq!(
            report,
            format!("{}\n\nCaused by:\n    {}", texts[0], texts[1])
        );
        assert!(format!("{damaged:#?}").contains("Damaged {"));

        let two_lines = Error::SnapshotFailed(Cause::new(Error::Input {
            job: "walk",
            source: "first line\nsecond line".into(),
        }));
        assert_eq!(
            format!("{two_lines:?}"),
            "snapshot failed\n\nCaused by:\n    \
             0: job walk: loading its input failed\n    \
             1: first line\n       second line"
        );
        let cause = Cause::new(Error::Spawn(io::Error::other("no threads")));
        assert_eq!(
            format!("{cause:?}"),
            "could not start a worker thread\n\nCaused by:\n    no threads"
        );
        assert!(format!("{cause:#?}").starts_with("Cause(\n    Spawn("));
    }

    #[test]
    fn a_cause_reads_as_its_whole_chain_once() {
        let cause = Cause::new(Error::Cluster(ClusterError::Address {
            addr: "example.invalid:7070".to_owned(),
            source: io::Error::new(io::ErrorKind::NotFound, "no such host"),
        }));
        assert_eq!(&*cause, "address example.invalid:7070: no such host");
    }
}
