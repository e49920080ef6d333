//! The worker process's side: dial the coordinator, shake hands, and run chunks on N threads
//! with the same chunk runner as local workers (`crate::run`), until the job ends or the
//! process is asked to stop.
//!
//! - `mod.rs` (this file): [`serve`], [`Registry`], [`WorkerOptions`], [`Served`]; the
//!   membership protocol as a worker process sees it.
//! - `machine.rs`: the protocol of steps 1-7 as a pure machine (events in, orders polled; no
//!   sockets, tasks, channels or clock): which slots are live, the answers about held
//!   partitions and their order, placements, parts this process writes to the job's store
//!   itself, the lease, leave and end.
//! - `io.rs`: the I/O task, the machine's pump: frames in and out, timers, the job's own
//!   code (job values, halos, held and placed partitions), the store's tasks.
//! - `halos.rs`: the partitions in this process and the halos kept for them.
//! - `peers.rs`: the links to the other worker processes of the job, which send each
//!   other halos directly (protocol 20): tasks that move frames and decide nothing.
//! - `thread.rs`: a compute thread and its slots, a host of the chunk runner.
//!
//! This layer combines the wire (`crate::cluster`), the runner (`crate::run`) and the store
//! (`crate::snapshot`); it never imports the executor, and the executor never imports it.
//! Its public items are re-exported under [`crate::cluster`].
//!
//! # Membership, as a worker process sees it
//!
//! 0. *Dial.* The worker process dials the coordinator and shakes hands (`handshake.rs`:
//!    the protocol version, the token, and a job whose name and [`Job::VERSION`] it has
//!    registered). With [`WorkerOptions::wait_for_job`], a coordinator that does not listen
//!    yet or runs none of its jobs yet is dialled again, with a growing pause, until it does
//!    or the wait is over.
//! 1. *Join.* After the handshake the coordinator counts each of the process's threads as
//!    [`SLOTS_PER_THREAD`] workers of the job (*slots*). It sends the job value of the current
//!    phase once (`Phase`), then `Run`s, each for a slot.
//! 2. *Run.* A thread runs its slots' chunks one at a time, in the order they came, step after
//!    step, reading one flag per step, and sends `Done` with the output when a chunk ends: one
//!    message per chunk, never per step. While it runs one chunk, the next waits in its queue,
//!    so it never idles for a round trip. Messages that arrive together are sent together (one
//!    flush for all that are queued).
//! 3. *Adjust.* `Interrupt` and `Capture` name the slot and chunk they are for; the I/O task
//!    queues them for the thread and sets its flag; the thread acts on them at its next
//!    adjustment point: for the chunk it runs, it hands the chunk back (`Yielded`) or sends
//!    its state (`Captured`); for a chunk still waiting, it does so at once with the state the
//!    chunk came with (from scratch: a new chunk's state); for a chunk it no longer holds it
//!    does nothing (the chunk ended first and its `Done` crossed the request on the wire; the
//!    coordinator takes the `Done`). `Abandon` (a rollback) stops the chunk the same way but
//!    drops it, with its partition, and answers `Abandoned` with no state.
//! 4. *Heartbeats* go both ways every heartbeat period, with each slot's progress. A side that
//!    hears nothing for a lease gives the other up: the coordinator puts the slots' chunks back
//!    with the last state it holds; the worker stops computing and returns an error.
//! 5. *Leave.* A stop request (the stop token, or SIGTERM/SIGINT with
//!    [`WorkerOptions::stop_on_signals`]) sends `Leave`; the coordinator retires the slots,
//!    whose chunks come back as `Yielded` at their next adjustment point, then sends `End`.
//! 6. *End.* `End` (the job finished, was suspended, failed or cancelled, or this process was
//!    retired): the threads stop and [`serve`] returns.
//! 7. *Snapshot parts.* Once a snapshot is committed, the coordinator offers the store
//!    (`Store`: its URL without credentials, non-secret options, and that snapshot as a
//!    witness). The I/O task opens the URL with this process's own environment (credentials
//!    stay where they are) and reads the witness's manifest; if it is there with the same
//!    creation time, the store is the coordinator's, and from then on a state captured for a
//!    snapshot is written to the epoch folder the `Capture` names and reported as
//!    `CapturedPart` (its key, size and checksum) instead of crossing the wire; so is a
//!    partition this process holds, asked for with `CaptureHeld`, reported as
//!    `CapturedHeldPart`. The writes run in the background: the threads go on computing and
//!    the I/O task goes on serving; while a held partition's part is written, the messages
//!    about that chunk wait behind its answer (`machine.rs`, "Order of the answers about a
//!    held partition"). Until then, or if the store cannot be reached from here (another disk
//!    behind the same `file://` path, no credentials), states go to the coordinator as
//!    `Captured` and `CapturedHeld`, which writes them; a write that fails here is logged as
//!    a warning, its state goes to the coordinator, and so do all later ones. [`Served`]
//!    counts both kinds (`parts_written`, `parts_sent`). Either way the coordinator's writer
//!    lists the part in the manifest and is the only one to commit.
//!
//! Why no chunk is lost or counted twice: a chunk leaves a slot only as `Done` or `Yielded`
//! (at most one per `Run`: a `Run` is in the thread's queue or running until exactly one of
//! them is sent, and a request for a chunk the thread no longer holds is ignored),
//! or with the slot's loss, which the coordinator handles as `Lost` in its ledger (the
//! ledger's invariant: a chunk is with exactly one worker or pending). A message of a lost
//! slot that arrives late is refused by the ledger, not merged.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::codec::Framed;

use crate::job::Job;
use crate::run::{Cell, Inputs, SuspendToken};
use crate::wire::Error;
use crate::wire::frame;
use crate::wire::handshake::{self, Token};
use crate::wire::transport;

mod halos;
mod io;
mod live;
mod machine;
mod peers;
pub(crate) mod replay;
// Built for the crate's tests, and with the hidden `sim` feature for its benches.
#[cfg(any(test, feature = "sim"))]
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) mod sim;
mod thread;

use io::Io;
use thread::Thread;

type Runner = fn(&tokio::runtime::Runtime, Session) -> Result<Served, Error>;
/// [`crate::Layout::of`] a registered job.
type LayoutOf = fn() -> &'static crate::Layout;

/// The environment variable [`WorkerOptions::from_env`] reads
/// [`WorkerOptions::wait_for_job`] from: a number of seconds, such as `30` or `2.5`.
pub const WAIT_FOR_JOB_ENV: &str = "MALLEABLE_WAIT_FOR_JOB";

/// The environment variable [`WorkerOptions::from_env`] reads [`WorkerOptions::grace`] from:
/// a number of seconds.
pub const GRACE_ENV: &str = "MALLEABLE_GRACE";

/// The environment variable [`WorkerOptions::from_env`] reads [`WorkerOptions::node`] from.
pub const NODE_ENV: &str = "MALLEABLE_NODE";

/// The environment variable [`WorkerOptions::from_env`] reads
/// [`WorkerOptions::direct_halos`] from: `1` (the default) or `0`.
pub const DIRECT_HALOS_ENV: &str = "MALLEABLE_DIRECT_HALOS";
/// Whether a worker process's buddy copies go through memory its peers of the node map
/// (`1`, the default) or over their links (`0`): [`WorkerOptions::shared_copies`].
pub const SHARED_COPIES_ENV: &str = "MALLEABLE_SHARED_COPIES";

/// The job types a worker process can run.
#[derive(Clone, Default)]
pub struct Registry {
    jobs: Vec<(&'static str, u32, Runner)>,
    /// The layout of each job's types, by name ([`crate::Layout::of`] the job).
    layouts: Vec<(&'static str, LayoutOf)>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.jobs.iter().map(|(n, v, _)| format!("{n} v{v}")))
            .finish()
    }
}

impl Registry {
    /// No job types.
    pub fn new() -> Registry {
        Registry::default()
    }

    /// Adds job type `J`, known by its [`Job::NAME`] and [`Job::VERSION`]: the coordinator
    /// gives this worker a job of that name only if its version is the same, and if the
    /// serialized [`Layout`](crate::Layout) of its types is the same (else the worker is
    /// refused with [`Error::JobLayout`]).
    pub fn register<J: Job>(mut self) -> Registry {
        if !self.jobs.iter().any(|(n, _, _)| *n == J::NAME) {
            self.jobs.push((J::NAME, J::VERSION, run_job::<J>));
            self.layouts.push((J::NAME, crate::Layout::of::<J>));
        }
        self
    }

    /// The layout of the registered job `name`'s types ([`Layout::untraceable`] for a name
    /// not registered).
    ///
    /// [`Layout::untraceable`]: crate::Layout::untraceable
    fn layout(&self, name: &str) -> crate::Layout {
        self.layouts
            .iter()
            .find(|(n, _)| *n == name)
            .map_or_else(crate::Layout::untraceable, |(_, layout)| layout().clone())
    }

    /// The registered job names.
    pub fn names(&self) -> Vec<String> {
        self.jobs.iter().map(|(n, _, _)| (*n).to_owned()).collect()
    }

    /// The registered job names, versions and layouts.
    fn types(&self) -> Vec<handshake::JobType> {
        self.jobs
            .iter()
            .map(|(n, v, _)| handshake::JobType::new(*n, *v, &self.layout(n)))
            .collect()
    }
}

/// How a worker process serves.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    threads: usize,
    token: Option<Token>,
    max_frame: usize,
    max_message: usize,
    timeout: Duration,
    wait_for_job: Duration,
    stop: Option<SuspendToken>,
    signals: bool,
    grace: Option<Duration>,
    node: String,
    direct_halos: bool,
    copy_memory: u64,
    buffer_memory: usize,
    shared_copies: bool,
}

impl Default for WorkerOptions {
    fn default() -> Self {
        WorkerOptions {
            threads: std::thread::available_parallelism().map_or(1, usize::from),
            token: None,
            max_frame: frame::DEFAULT_MAX_FRAME,
            max_message: frame::DEFAULT_MAX_MESSAGE,
            timeout: Duration::from_secs(10),
            wait_for_job: Duration::ZERO,
            stop: None,
            signals: false,
            grace: None,
            node: crate::snapshot::lease::host_name(),
            direct_halos: true,
            copy_memory: u64::MAX,
            buffer_memory: DEFAULT_BUFFER_MEMORY,
            shared_copies: true,
        }
    }
}

impl WorkerOptions {
    /// The defaults: as many threads as the machine's parallelism, the token from
    /// [`TOKEN_ENV`](crate::cluster::TOKEN_ENV) if set, and [`wait_for_job`](Self::wait_for_job)
    /// from [`WAIT_FOR_JOB_ENV`] (seconds) if set.
    ///
    /// # Errors
    ///
    /// [`Error::Token`] if the token's variable is set but empty; [`Error::Environment`] if
    /// [`WAIT_FOR_JOB_ENV`] is set to something other than a number of seconds.
    pub fn from_env() -> Result<WorkerOptions, Error> {
        let wait_for_job = match std::env::var_os(WAIT_FOR_JOB_ENV) {
            None => Duration::ZERO,
            Some(v) => seconds(WAIT_FOR_JOB_ENV, &v.to_string_lossy())?,
        };
        let grace = match std::env::var_os(GRACE_ENV) {
            None => None,
            Some(v) => Some(seconds(GRACE_ENV, &v.to_string_lossy())?),
        };
        let mut options = WorkerOptions {
            token: Token::from_env()?,
            wait_for_job,
            grace,
            ..WorkerOptions::default()
        };
        if let Some(node) = std::env::var_os(NODE_ENV) {
            options.node = node.to_string_lossy().into_owned();
        }
        if let Some(v) = std::env::var_os(DIRECT_HALOS_ENV) {
            options.direct_halos = on_off(DIRECT_HALOS_ENV, &v.to_string_lossy())?;
        }
        if let Some(v) = std::env::var_os(SHARED_COPIES_ENV) {
            options.shared_copies = on_off(SHARED_COPIES_ENV, &v.to_string_lossy())?;
        }
        Ok(options)
    }

    /// Compute threads (at least 1).
    pub fn threads(mut self, n: usize) -> Self {
        self.threads = n.max(1);
        self
    }

    /// The shared token.
    pub fn token(mut self, token: Token) -> Self {
        self.token = Some(token);
        self
    }

    /// The maximum frame length (default 64 MiB). A longer message (a chunk state, an
    /// output) is sent in pieces.
    pub fn max_frame(mut self, bytes: usize) -> Self {
        self.max_frame = bytes;
        self
    }

    /// The maximum length of a message the coordinator may send in pieces (default 4 GiB):
    /// the most memory the connection's incoming message can take.
    pub fn max_message(mut self, bytes: usize) -> Self {
        self.max_message = bytes;
        self
    }

    /// Time limit for connecting and for the handshake (default 10 s).
    pub fn timeout(mut self, d: Duration) -> Self {
        self.timeout = d;
        self
    }

    /// How long [`serve`] waits for the coordinator to run a job of this worker (default
    /// zero: it does not wait). While the coordinator is not listening yet (the connection
    /// is refused) or runs none of the registered jobs ([`Error::UnknownJob`]), `serve`
    /// tries again with a growing pause (from 50 ms, doubling, up to 1 s), and returns that
    /// error once `d` has passed since the first attempt. Each attempt is logged (`tracing`,
    /// debug; the first wait at info) and the coordinator records each refusal. Other errors
    /// (a wrong token, another version) end `serve` at once, and so does the stop token of
    /// [`stop_on`](Self::stop_on) (with the last refusal). Also read from
    /// [`WAIT_FOR_JOB_ENV`] by [`from_env`](Self::from_env).
    pub fn wait_for_job(mut self, d: Duration) -> Self {
        self.wait_for_job = d;
        self
    }

    /// Leave the job gracefully when `token` fires.
    pub fn stop_on(mut self, token: &SuspendToken) -> Self {
        self.stop = Some(token.clone());
        self
    }

    /// Leave the job gracefully on SIGTERM or SIGINT.
    pub fn stop_on_signals(mut self) -> Self {
        self.signals = true;
        self
    }

    /// When this process is asked to stop (the stop token, or a signal with
    /// [`stop_on_signals`](Self::stop_on_signals)), it has `grace` before it is gone (a spot
    /// instance's notice, a pod's termination grace period): the coordinator drains it as
    /// [`JobHandle::drain_remote`](crate::JobHandle::drain_remote) does, taking a snapshot
    /// near the end of `grace` if the process still holds work, and letting it go at the end.
    /// Also read from [`GRACE_ENV`] (seconds) by [`from_env`](Self::from_env).
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = Some(grace);
        self
    }

    /// The node this process runs on, as the coordinator's roster shows it
    /// ([`JobHandle::remote_processes`](crate::JobHandle::remote_processes)): processes of one
    /// node share its memory and its fate. Default: the host's name; also read from
    /// [`NODE_ENV`] by [`from_env`](Self::from_env) (for processes that share a host but stand
    /// for nodes apart, as in tests). At most
    /// [`NODE_MAX`](crate::cluster::handshake::NODE_MAX) bytes: a longer name fails the
    /// handshake ([`Error::HandshakeTooLarge`]) before anything is sent.
    pub fn node(mut self, name: impl Into<String>) -> Self {
        self.node = name.into();
        self
    }

    /// Whether this process exchanges halos of owned partitions directly with the job's
    /// other worker processes (default: yes). It then listens for its peers on the address
    /// it reaches the coordinator from (any free port; a token is needed unless that is
    /// loopback), pushes each halo for a partition another process holds to that process,
    /// and keeps those its peers push here: halos between processes no longer cross the
    /// coordinator. Off, its halos go through the coordinator (the relay), as do those of a
    /// peer it cannot reach. Also read from [`DIRECT_HALOS_ENV`] (`1` or `0`) by
    /// [`from_env`](Self::from_env).
    pub fn direct_halos(mut self, on: bool) -> Self {
        self.direct_halos = on;
        self
    }

    /// The most bytes of buddy copies this process keeps in memory for its peers (default:
    /// no limit but the coordinator's, which gives each partition's copy to one process).
    /// A job with buddy copies ([`Builder::buddy_copies`](crate::Builder::buddy_copies))
    /// has each worker process copy the partitions it holds into another process's memory;
    /// a copy that would pass this limit is refused, and its partition has no copy (counted
    /// on the coordinator's handle, [`JobHandle::copies`](crate::JobHandle::copies)).
    pub fn copy_memory(mut self, bytes: u64) -> Self {
        self.copy_memory = bytes;
        self
    }

    /// The most bytes of large buffers this process keeps for reuse (default 1 GiB; 0 keeps
    /// none). A buddy copy round encodes each partition it copies, and reads each copy it
    /// receives, into memory; kept from one round to the next (the copies a newer round
    /// replaced, the bytes of copies sent), that memory's pages are mapped already, and the
    /// round does not wait for the kernel to map and clear fresh ones (on the copies bench,
    /// a plain copy of 64 MB took 3-7 ms into mapped memory and 24-35 ms into fresh
    /// memory). A buffer not used again within a minute is let go. With
    /// [`shared_copies`](Self::shared_copies), the same limit bounds the memory files copies
    /// are encoded into: those free for the next round, and, apart, those lent to buddies
    /// (past it, the oldest lent ones are forgotten: never written again, their pages gone
    /// once their buddy lets go of them).
    pub fn buffer_memory(mut self, bytes: usize) -> Self {
        self.buffer_memory = bytes;
        self
    }

    /// Whether buddy copies between this process and its peers of the same node go through
    /// memory both map (default on, on Linux): the process encodes a copy into a memory
    /// file and its buddy maps it, so that the copy's bytes do not cross the link; a buddy
    /// on another node, or one that cannot map it, gets the bytes over the link instead
    /// (counted on both sides, [`PeerTraffic::copies_not_shared`]). Off, this process
    /// neither shares its copies nor maps its peers'. Also read from [`SHARED_COPIES_ENV`]
    /// (`1` or `0`) by [`from_env`](Self::from_env).
    ///
    /// On the copies bench (2 processes of one node, 64 MB each copied every 20 phases), the
    /// copies cost the run 1.26-1.35x through the link and the encoding alone 1.01-1.05x:
    /// the transmission was nearly all of it (`BENCHMARKS.md`).
    pub fn shared_copies(mut self, on: bool) -> Self {
        self.shared_copies = on;
        self
    }
}

/// An on/off environment variable's value.
fn on_off(var: &'static str, value: &str) -> Result<bool, Error> {
    match value {
        "1" | "true" | "on" => Ok(true),
        "0" | "false" | "off" => Ok(false),
        other => Err(Error::Environment {
            var,
            value: other.to_owned(),
            expected: "1 or 0 (on or off)",
        }),
    }
}

/// The default of [`WorkerOptions::buffer_memory`].
pub(crate) const DEFAULT_BUFFER_MEMORY: usize = 1 << 30;

/// What a worker process did, from [`serve`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Served {
    /// The job's name.
    pub job: String,
    /// Chunks finished here.
    pub chunks_done: u64,
    /// Chunks handed back (retire, leave, suspend).
    pub chunks_yielded: u64,
    /// Whether this process left because it was asked to stop.
    pub left: bool,
    /// From dialling the coordinator to the first chunk received (the join latency), if one
    /// was.
    pub first_run_after: Option<Duration>,
    /// Snapshot parts this process wrote to the job's store itself: states of running
    /// chunks and partitions it holds.
    pub parts_written: u64,
    /// Snapshot parts this process sent to the coordinator as bytes, for it to write: all of
    /// them until the store is shown to be reachable from here, and each whose write failed
    /// here (logged as a warning; this process then stops writing parts).
    pub parts_sent: u64,
    /// Connections tried until the coordinator took this worker, that one included (1 when
    /// it took it at once; more while [`WorkerOptions::wait_for_job`] waited for the job).
    pub attempts: u32,
    /// Bytes of the frames this process sent to the coordinator.
    pub bytes_to_coordinator: u64,
    /// What this process exchanged with its peers directly
    /// ([`WorkerOptions::direct_halos`]).
    pub peers: PeerTraffic,
}

/// What a worker process exchanged with its peers directly ([`Served::peers`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PeerTraffic {
    /// Halos this process pushed to the processes that hold their partitions.
    pub halos_pushed: u64,
    /// Their bytes.
    pub halo_bytes_pushed: u64,
    /// Of those, the ones their receiver kept (the others went through the coordinator).
    pub halos_kept_by_peers: u64,
    /// Halos its peers pushed here.
    pub halos_received: u64,
    /// Of those, the ones it kept for its partitions (the others it refused).
    pub halos_kept_here: u64,
    /// Pushes that failed because their peer was unreachable (they went through the
    /// coordinator).
    pub halos_unreachable: u64,
    /// Halos its partitions exported for partitions of this process, handed over as the
    /// values exported, not decoded from their bytes again.
    pub halos_live: u64,
    /// Links of peers that broke the peer protocol, ended by this process.
    pub links_refused: u64,
    /// Connections to this process's peer listener whose handshake was refused (a stranger,
    /// another token, another run; at most the last 256 are counted).
    pub handshakes_refused: u64,
    /// Buddy copies of the partitions held here pushed to peers.
    pub copies_pushed: u64,
    /// Their bytes.
    pub copy_bytes_pushed: u64,
    /// Of those, the ones their buddy kept.
    pub copies_kept_by_peers: u64,
    /// Buddy copies peers pushed here.
    pub copies_received: u64,
    /// Of those, the ones this process kept.
    pub copies_kept_here: u64,
    /// Buddy copies kept here for peers when the process ended.
    pub copies_held: u64,
    /// Their bytes.
    pub copy_bytes_held: u64,
    /// The bytes of the halo log when the process ended (the halos its partitions exported
    /// since the oldest buddy copy, kept to replay a lost neighbour).
    pub log_bytes: u64,
    /// Buffers of 64 KiB or more (partitions encoded here for copies and captures, long
    /// frames read from peers) that reused memory kept from earlier ones
    /// ([`WorkerOptions::buffer_memory`]).
    pub buffers_reused: u64,
    /// Those that were allocated, none kept fitting.
    pub buffers_made: u64,
    /// The bytes kept for reuse when the process ended.
    pub buffer_bytes_kept: u64,
    /// Buddy copies of the partitions held here lent to a buddy of this node through
    /// memory it maps ([`WorkerOptions::shared_copies`]), their bytes not sent.
    pub copies_shared: u64,
    /// Of those, the ones the buddy did not map (another node, sharing off there): sent
    /// over the link after all, as every later copy to that buddy.
    pub copies_not_shared: u64,
    /// Buddy copies peers of this node shared here, mapped.
    pub copies_mapped: u64,
    /// Shared copies this process did not map (answered so: their bytes came instead).
    pub copies_not_mapped: u64,
    /// Shared copies whose buddy let go of them, so that their memory served again.
    pub copies_released: u64,
    /// The bytes of the memory files kept for copies when the process ended (those its
    /// buddies still map included).
    pub shared_bytes_kept: u64,
}

/// A number of seconds in an environment variable.
fn seconds(var: &'static str, value: &str) -> Result<Duration, Error> {
    value
        .trim()
        .parse::<f64>()
        .ok()
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .ok_or_else(|| Error::Environment {
            var,
            value: value.to_owned(),
            expected: "a number of seconds (such as 30 or 2.5)",
        })
}

/// Whether `serve` may try again after `e` while it waits for the job: the coordinator runs
/// none of this worker's jobs yet, or does not listen yet.
fn worth_waiting(e: &Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    match e {
        // A later run of the job may come.
        Error::UnknownJob { .. } | Error::JobEnded { .. } => true,
        Error::Address { source, .. } => {
            matches!(
                source.kind(),
                ConnectionRefused | ConnectionReset | ConnectionAborted
            )
        }
        _ => false,
    }
}

/// An established connection, before the job type is known.
pub(crate) struct Session {
    framed: Framed<transport::Stream, crate::wire::frame::Codec>,
    peer: String,
    job: String,
    heartbeat: Duration,
    lease: Duration,
    options: WorkerOptions,
    dialled: std::time::Instant,
    attempts: u32,
}

/// Serves one job of the coordinator at `addr` as a worker process: connects, shakes hands,
/// runs chunks on `options`' threads, and returns when the job ends, this process is retired,
/// or it leaves after a stop request. Blocks the calling thread.
///
/// With [`WorkerOptions::wait_for_job`], a coordinator that does not listen yet or runs none
/// of the registered jobs yet is tried again until it does, or the time is up.
///
/// # Errors
///
/// [`Error`] for a coordinator that cannot be reached or refuses this worker (wrong token:
/// [`Error::Auth`]; another protocol version; no job in common: [`Error::UnknownJob`]; the
/// job in another version: [`Error::JobVersion`]; the job in its version but with types of
/// another layout: [`Error::JobLayout`]), or a connection lost before the end.
pub fn serve(addr: &str, registry: &Registry, options: WorkerOptions) -> Result<Served, Error> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| Error::Address {
            addr: addr.to_owned(),
            source,
        })?;
    let session = rt.block_on(connect_waiting(addr, registry, options))?;
    let runner = registry
        .jobs
        .iter()
        .find(|(n, _, _)| *n == session.job)
        .map(|(_, _, r)| *r)
        .ok_or_else(|| Error::Rejected {
            peer: session.peer.clone(),
            what: "a welcome",
            reason: format!("job {:?} is not one of this worker's", session.job),
            source: None,
        })?;
    runner(&rt, session)
}

/// [`connect`], again and again while [`worth_waiting`] and the options' wait allows.
async fn connect_waiting(
    addr: &str,
    registry: &Registry,
    options: WorkerOptions,
) -> Result<Session, Error> {
    let started = tokio::time::Instant::now();
    let deadline = started + options.wait_for_job;
    let mut pause = Duration::from_millis(50);
    let mut attempts = 0;
    loop {
        attempts += 1;
        let e = match connect(addr, registry, options.clone()).await {
            Ok(mut session) => {
                session.attempts = attempts;
                return Ok(session);
            }
            Err(e) => e,
        };
        let now = tokio::time::Instant::now();
        if !worth_waiting(&e) || now >= deadline {
            if attempts > 1 {
                tracing::warn!(
                    addr,
                    attempts,
                    waited = ?now - started,
                    error = %e,
                    "gave up waiting for the coordinator's job"
                );
            }
            return Err(e);
        }
        if attempts == 1 {
            tracing::info!(addr, wait = ?options.wait_for_job, error = %e, "waiting for the coordinator's job");
        } else {
            tracing::debug!(addr, attempts, error = %e, "still waiting for the coordinator's job");
        }
        let stop = options.stop.clone();
        tokio::select! {
            () = tokio::time::sleep_until((now + pause).min(deadline)) => {}
            () = async { stop.as_ref().expect("guarded").fired().await }, if stop.is_some() => {
                tracing::info!(addr, attempts, "stopped while waiting for the coordinator's job");
                return Err(e);
            }
        }
        pause = (pause * 2).min(Duration::from_secs(1));
    }
}

async fn connect(
    addr: &str,
    registry: &Registry,
    options: WorkerOptions,
) -> Result<Session, Error> {
    let timeout = options.timeout;
    let dialled = std::time::Instant::now();
    let (stream, peer) = transport::dial(addr, timeout).await?;
    let mut framed = Framed::new(stream, frame::codec(options.max_frame));
    let threads = u32::try_from(options.threads).unwrap_or(u32::MAX);
    let shake = handshake::worker(
        &mut framed,
        &peer,
        options.token.as_ref(),
        options.max_frame,
        registry.types(),
        |name| registry.layout(name),
        handshake::Me {
            threads,
            node: &options.node,
        },
    );
    let welcomed =
        tokio::time::timeout(timeout, shake)
            .await
            .map_err(|_| Error::HandshakeTimeout {
                peer: peer.clone(),
                after: timeout,
            })??;
    Ok(Session {
        framed,
        peer,
        job: welcomed.job,
        heartbeat: Duration::from_millis(welcomed.heartbeat_ms.max(1)),
        lease: Duration::from_millis(welcomed.lease_ms.max(1)),
        options,
        dialled,
        attempts: 1,
    })
}

fn run_job<J: Job>(rt: &tokio::runtime::Runtime, session: Session) -> Result<Served, Error> {
    let Session {
        framed,
        peer,
        job: name,
        heartbeat,
        lease,
        options,
        dialled,
        attempts,
    } = session;
    let (out_tx, out_rx) = tokio::sync::mpsc::unbounded_channel();
    let inputs: Arc<Inputs<J>> = Arc::default();
    let held: thread::HeldParts<J::Chunk> = Arc::default();
    let mut threads: Vec<Thread<J>> = Vec::with_capacity(options.threads);
    for index in 0..options.threads {
        let (tx, rx) = crossbeam_channel::unbounded();
        let cell: Arc<Cell> = Arc::default();
        let (cell2, out, inputs) = (Arc::clone(&cell), out_tx.clone(), Arc::clone(&inputs));
        let held = Arc::clone(&held);
        let thread = std::thread::Builder::new()
            .name(format!("malleable-remote-{index}"))
            .spawn(move || thread::main::<J>(&rx, &cell2, &out, &inputs, &held))
            .map_err(|source| Error::Io {
                peer: peer.clone(),
                source,
            })?;
        threads.push(Thread::new(tx, cell, thread));
    }
    // Kept until the I/O loop ends: a process whose slots were all released may still hold
    // owned partitions, so it leaves on the coordinator's `End`, not when its threads stop.
    let _held_open = out_tx;
    let io = Io {
        peer: peer.clone(),
        heartbeat,
        lease,
        max_frame: options.max_frame,
        max_message: options.max_message,
        stop: options.stop.clone(),
        signals: options.signals,
        grace: options.grace,
        dialled,
        first_run: std::cell::Cell::new(None),
        parts_written: std::cell::Cell::new(0),
        parts_sent: std::cell::Cell::new(0),
        direct: options
            .direct_halos
            .then(|| (options.token.clone(), options.timeout)),
        peer_counts: std::cell::Cell::new(Default::default()),
        bytes_sent: std::cell::Cell::new(0),
        copy_memory: options.copy_memory,
        copies_held: std::cell::Cell::new((0, 0)),
        log_bytes: std::cell::Cell::new(0),
        buffers: std::sync::Arc::new(crate::wire::buffers::Buffers::new(options.buffer_memory)),
        segments: options
            .shared_copies
            .then(|| crate::wire::shared::Segments::new(options.buffer_memory))
            .flatten()
            .map(std::sync::Arc::new),
        map_shared: options.shared_copies,
    };
    let ended = rt.block_on(io.run(framed, &mut threads, &held, &inputs, out_rx));
    // Whatever happened, the threads stop: their queues close and their flags are raised.
    let mut done = (0, 0);
    for s in &mut threads {
        s.stop();
    }
    for s in &mut threads {
        if let Some((d, y)) = s.join() {
            done.0 += d;
            done.1 += y;
        }
    }
    let left = ended?;
    Ok(Served {
        job: name,
        chunks_done: done.0,
        chunks_yielded: done.1,
        left,
        first_run_after: io.first_run.get(),
        parts_written: io.parts_written.get(),
        parts_sent: io.parts_sent.get(),
        attempts,
        bytes_to_coordinator: io.bytes_sent.get(),
        peers: {
            let c = io.peer_counts.get();
            let reuse = io.buffers.reuse();
            let sharing = io
                .segments
                .as_ref()
                .map(|s| s.sharing())
                .unwrap_or_default();
            PeerTraffic {
                halos_pushed: c.pushed,
                halo_bytes_pushed: c.bytes_pushed,
                halos_kept_by_peers: c.kept,
                halos_received: c.received,
                halos_kept_here: c.accepted,
                halos_unreachable: c.unreachable,
                halos_live: held.live().taken(),
                links_refused: c.refused_links,
                handshakes_refused: c.refused_handshakes,
                copies_pushed: c.copies_pushed,
                copy_bytes_pushed: c.copy_bytes_pushed,
                copies_kept_by_peers: c.copies_kept,
                copies_received: c.copies_received,
                copies_kept_here: c.copies_accepted,
                copies_held: io.copies_held.get().0 as u64,
                copy_bytes_held: io.copies_held.get().1,
                log_bytes: io.log_bytes.get(),
                buffers_reused: reuse.reused,
                buffers_made: reuse.made,
                buffer_bytes_kept: reuse.kept as u64,
                copies_shared: sharing.lent,
                copies_not_shared: c.shared.not_shared,
                copies_mapped: c.shared.mapped,
                copies_not_mapped: c.shared.not_mapped,
                copies_released: sharing.released,
                shared_bytes_kept: sharing.bytes,
            }
        },
    })
}
