//! The executor (the coordinator): builder, job handles and outcomes; it wires the pure
//! core and cut (`crate::schedule`) to local threads, worker processes and the store.
//!
//! - `mod.rs` (this file): [`Executor`], [`Builder`], and starting a job run.
//! - `handle.rs`: [`JobHandle`] (scale, progress, cancel, wait or await) and [`Outcome`].
//! - `job_run.rs`: one job run: where workers' events meet the core's and the cut's commands.
//! - `links.rs`: the driver side of a run: the job's lock ([`Guard`](job_run::Guard)), the
//!   mailboxes, cells and connections its orders go out through, and its store operations,
//!   carried out when the lock is released.
//! - `connection.rs`: the socket task of a worker process (frames in and out, heartbeats,
//!   its lease), and starting processes by a launcher.
//! - `threads.rs`: local worker threads and the inline worker, hosts of the chunk runner.
//! - `updates.rs`: [`ProgressUpdates`], the receiving end of the progress channel.
//! - `members.rs`: a worker of the job, local or remote, behind one type.
//! - `local.rs`: local workers as the state sees them (how many, which retire, inline).
//! - `remote.rs`: the job's side of worker processes (their connections and slots).
//! - `snapshot.rs`: the executor's side of the snapshot cut: its commands, the marker's
//!   manifest, the snapshot configuration.
//! - `io.rs`: the store's driver (writing complete cuts, reading a rollback's snapshot back),
//!   and resume.
//! - `rollback.rs`: owned partitions lost with a worker process: back to the latest snapshot.
//! - `from_snapshot.rs`: which chunk states are still a restored snapshot's bytes, so that
//!   one that does not decode names the snapshot.
//! - `shutdown.rs`: the graceful, bounded end of the executor's I/O (frames queued for worker
//!   processes are delivered, snapshot writes in flight finish).
//! - `triggers.rs`: the job's timer task (snapshot period, deadline, signals, token, and the
//!   autoscaler's period).
//! - `autoscale.rs`: measures the job for its autoscaling decider and carries out decisions.
//! - `lease.rs`: the job id's lease of a run: taken at submit, renewed, released at its end.
//!
//! - `sim.rs` (tests only): the deterministic simulation of whole clusters; with the hidden
//!   `sim` feature also built for the bench of the coordinator at scale (`sim/scale.rs`).
//!
//! This layer imports every leaf layer (`schedule`, `run`, `snapshot`, the wire) and never
//! the worker process (`crate::worker`), which never imports it either (but for the
//! simulation, which runs both).
//!
//! # Deciding and carrying out
//!
//! A run's [`State`](job_run::State) decides; it does not act. Its inputs are calls: a
//! worker's event (`report`, `on_remote`), a process joining or gone (`join_remote`,
//! `drop_conn`), a store operation's outcome (`snapshot_written`, `rolled_back`,
//! `parts_read`), the handle's requests, and the time, which the driver sets when it takes
//! the lock (`State::now`: the state reads no clock). Its outputs are queued: frames for
//! worker processes (`Remotes::outbox`), orders for local workers (`links::Order`), store
//! operations (`links::StoreOp`); the driver carries them out, in order, before it
//! releases the lock (`links.rs`). So the same state runs under the deterministic
//! simulation (`sim.rs`), which feeds it the same calls from simulated processes, store and
//! clock, and which found three ordering bugs no process test had (see its replayed
//! histories).
//!
//! `tests/it/layering.rs` holds the state's files to it: they start no task or thread, hold
//! no channel or atomic, read no clock and never name the run's shared handle. Its reports
//! are orders too: the run's progress (`Order::Progress`), a snapshot's outcome for whoever
//! asked (`Order::Reply`), the timeline's records (`Order::Record`); the handles of worker
//! processes a launcher started are the driver's (`Links::launched`), the state counts them.
//! What the state still does itself: it counts metrics through the `metrics` crate's handles
//! (an increment in memory, no I/O and no wait, made once per run: `crate::metrics`), and
//! runs the job's code (its `next`, encoding and decoding, `output`), which is part of what
//! it decides.
//!
//! Why calls, not one `handle(Input)` with a polled `Vec<Output>` as in sans-IO protocol
//! crates: each input here is already a method with its own typed arguments, and the
//! orders are polled once per lock by the one driver that holds it (`Guard`'s drop); an
//! input enum would add a match that only forwards to those methods. The simulation drives
//! the same methods, and polls the same queues.
//!
//! # Inline mode
//!
//! With zero local workers the job runs on the thread that waits for it with the blocking
//! [`JobHandle::wait`] (or [`Executor::run`]): that thread joins the core as a worker. Raising
//! the count retires the inline worker at its next adjustment point and spawns threads;
//! lowering it to zero retires the threads and the waiting thread takes over. A job that is
//! awaited (async) with zero workers runs inline on one helper thread, never on a runtime
//! thread; so does one that nobody waits for but a program polls
//! (`JobHandle::is_finished`, `JobHandle::progress`) for a second, unless the executor
//! listens for worker processes (`handle.rs`).

mod autoscale;
mod connection;
mod copies;
mod drain;
mod finish;
mod from_snapshot;
mod handle;
mod io;
mod job_run;
mod lease;
mod lifecycle;
mod links;
mod local;
mod members;
mod progress;
mod recovery;
mod remote;
mod rollback;
mod shutdown;
mod signals;
// Built for the crate's tests, and with the hidden `sim` feature for its benches.
#[cfg(any(test, feature = "sim"))]
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) mod sim;
mod snapshot;
mod threads;
mod triggers;
mod updates;
mod watch;

pub use autoscale::AutoscaleStatus;
pub use copies::Copies;
pub use handle::{Finished, JobFuture, JobHandle, Outcome, SnapshotRequest};
pub use lifecycle::{Resubmit, Resume};
pub use progress::Progress;
pub use recovery::Recovered;
pub use remote::{RemoteProcess, Traffic};
pub use rollback::Rollback;
pub use snapshot::{At, Resumed};
pub use updates::ProgressUpdates;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::error::{Error, Result, Site};
use crate::job::Job;
use crate::run::{Held, Inputs, SuspendToken, catch};
use crate::schedule::{Chunking, Core, Plan, Schedule};
use crate::wire::listener::{ClusterConfig, Listener};
use job_run::{Shared, State};
use snapshot::{SnapshotConfig, Snapshots};

/// Runs jobs on local worker threads.
///
/// Cheap to clone; holds only configuration. Each submitted job gets its own threads.
///
/// # Shutdown
///
/// Dropping the last clone of an executor (or calling [`Executor::shutdown`]) waits, up to
/// [`Builder::shutdown_timeout`], until every worker process whose job ended has been sent
/// its `End` (so it exits normally instead of reporting a lost connection) and every
/// snapshot write in flight has finished. Jobs still running are not waited for: they run on
/// while their handles live. What is still pending at the time limit is abandoned, logged
/// and counted ([`SHUTDOWN_ABANDONED`](crate::metrics::SHUTDOWN_ABANDONED)); an abandoned
/// snapshot is never torn, only not committed.
#[derive(Debug, Clone)]
pub struct Executor {
    config: Config,
    io: Arc<IoRuntime>,
    listener: Option<Arc<Listener>>,
    /// Shared by the clones; drains the I/O when the last one is dropped.
    last: Arc<LastClone>,
}

/// Drains the executor's I/O when the last clone of an [`Executor`] is dropped.
#[derive(Debug)]
struct LastClone {
    io: Arc<IoRuntime>,
    timeout: Duration,
    timeline: Option<Arc<crate::timeline::Sink>>,
    /// Set by [`Executor::shutdown`], which drained already.
    drained: std::sync::atomic::AtomicBool,
}

impl Drop for LastClone {
    fn drop(&mut self) {
        if self.drained.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let (io, timeout) = (Arc::clone(&self.io), self.timeout);
        let timeline = self.timeline.take();
        let drain = move || {
            let left = io.drain(None, timeout);
            shutdown::report("the executor's shutdown", left, timeout);
            watch::flush(timeline.as_deref(), timeout);
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            // Inside an async context: blocking here would stall a runtime thread, so the
            // drain goes on in the background (the runtimes live until it is done). A program
            // that returns at once should call `Executor::shutdown` from `spawn_blocking`.
            let spawned = std::thread::Builder::new()
                .name("malleable-shutdown".into())
                .spawn(drain);
            if let Err(e) = spawned {
                tracing::warn!(
                    error = &e as &dyn std::error::Error,
                    "no thread to drain the executor's I/O"
                );
            }
        } else {
            drain();
        }
    }
}

#[derive(Debug, Clone)]
struct Config {
    shutdown_timeout: Duration,
    /// How long `build` waits for the store's check (`None`: no check).
    check_store: Option<Duration>,
    /// Remove a job's snapshots once it has finished (`lifecycle.rs`).
    remove_when_finished: bool,
    /// Whether `submit_or_resume` may start a job afresh (`lifecycle.rs`).
    resume: lifecycle::Resume,
    /// What `submit_or_resume` does with a submitted job that differs (`lifecycle.rs`).
    resubmit: lifecycle::Resubmit,
    /// What a job run was submitted with and its shape, recorded in its snapshots
    /// (`io.rs`); empty in the executor's own configuration.
    origin: io::Origin,
    local_workers: usize,
    schedule: Schedule,
    chunking: Chunking,
    snapshots: SnapshotConfig,
    cluster: ClusterConfig,
    autoscale: Option<crate::schedule::Autoscale>,
    /// Buddy copies every this many phases ([`Builder::buddy_copies`]).
    buddy_copies: Option<u64>,
    /// The file of [`Builder::timeline`], and its writer once built.
    timeline_path: Option<std::path::PathBuf>,
    timeline: Option<Arc<crate::timeline::Sink>>,
    /// The length of a job id's lease ([`Builder::job_lease`]).
    lease: Duration,
    /// The lease of the job run's id: set only in a run's own copy (`lease.rs`).
    run_lease: Option<lease::RunLease>,
}

/// The executor's runtimes, never a runtime of the caller's, and never running compute:
///
/// - `io`: one tokio thread for connections of worker processes, timers and signals;
/// - `writer`: one tokio thread (and its blocking pool, where file I/O runs) for snapshot
///   writes, at background priority (`SCHED_BATCH` on Linux): a write that starts while
///   every core computes does not preempt a worker; it runs when a core is free or at the
///   scheduler's next tick. The write is started by the worker whose capture completes the
///   cut; at normal priority the woken writer preempted that worker inside its snapshot
///   pause (`snapshot_costs`, 8 interleaved runs, median pause ÷ serializing alone for a
///   64 KiB state: 1.76× at normal priority, 1.35× at batch priority).
#[derive(Debug)]
pub(crate) struct IoRuntime {
    io: Option<tokio::runtime::Runtime>,
    writer: Option<tokio::runtime::Runtime>,
    /// The connection tasks of worker processes (see `shutdown.rs`).
    connections: Arc<shutdown::Connections>,
}

impl IoRuntime {
    fn new() -> Result<IoRuntime> {
        let io = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("malleable-io")
            .enable_all()
            .build()
            .map_err(Error::Spawn)?;
        let writer = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("malleable-writer")
            .on_thread_start(background_priority)
            .enable_all()
            .build()
            .map_err(Error::Spawn)?;
        Ok(IoRuntime {
            io: Some(io),
            writer: Some(writer),
            connections: Arc::default(),
        })
    }

    /// Tracks the task of a connection of job run `job` (see `shutdown.rs`, step 1).
    pub(crate) fn track(
        &self,
        job: shutdown::JobKey,
        tx: &tokio::sync::mpsc::UnboundedSender<crate::wire::frame::ToWorker>,
    ) -> shutdown::Tracked {
        self.connections.track(job, tx)
    }

    /// Waits, up to `timeout`, until the connections that were told to end (of `job`, or of
    /// every job) have delivered their last frames and, without a `job`, until no snapshot
    /// write is in flight (`shutdown.rs`, step 5). Blocks the calling thread; what is left.
    pub(crate) fn drain(
        &self,
        job: Option<shutdown::JobKey>,
        timeout: Duration,
    ) -> shutdown::Pending {
        shutdown::wait(timeout, || shutdown::Pending {
            connections: self.connections.ending(job),
            writes: match (job, &self.writer) {
                (None, Some(w)) => w.metrics().num_alive_tasks(),
                _ => 0,
            },
        })
    }

    /// Waits up to `timeout` until no snapshot write of any job is running; returns the
    /// writer's tasks still running then.
    pub(crate) fn drain_writes(&self, timeout: Duration) -> shutdown::Pending {
        shutdown::wait(timeout, || shutdown::Pending {
            connections: 0,
            writes: self
                .writer
                .as_ref()
                .map_or(0, |w| w.metrics().num_alive_tasks()),
        })
    }

    pub(crate) fn handle(&self) -> &tokio::runtime::Handle {
        self.io
            .as_ref()
            .expect("the runtime lives until drop")
            .handle()
    }

    /// The snapshot writer's runtime.
    pub(crate) fn writer(&self) -> &tokio::runtime::Handle {
        self.writer
            .as_ref()
            .expect("the runtime lives until drop")
            .handle()
    }
}

impl Drop for IoRuntime {
    fn drop(&mut self) {
        // Dropping a runtime blocks, which panics inside an async context; this does not.
        for rt in [self.io.take(), self.writer.take()].into_iter().flatten() {
            rt.shutdown_background();
        }
    }
}

/// Puts the calling thread at background priority (`SCHED_BATCH`): it never preempts a
/// thread of normal priority when it wakes up. Best effort: if the kernel refuses, the thread
/// keeps its priority, which is only slower for the workers, never wrong.
fn background_priority() {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: `sched_setscheduler` with pid 0 changes only the calling thread's policy; it
        // reads `param`, a valid initialized value that outlives the call, and touches no
        // other memory.
        let refused = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) } != 0;
        if refused {
            tracing::debug!("the snapshot writer keeps its scheduling priority");
        }
    }
}

/// Configures an [`Executor`].
#[derive(Debug, Clone)]
pub struct Builder {
    config: Config,
}

impl Default for Builder {
    fn default() -> Self {
        let threads = std::thread::available_parallelism().map_or(1, usize::from);
        Builder {
            config: Config {
                shutdown_timeout: Duration::from_secs(10),
                check_store: Some(Duration::from_secs(10)),
                remove_when_finished: false,
                resume: lifecycle::Resume::default(),
                resubmit: lifecycle::Resubmit::default(),
                origin: io::Origin::default(),
                local_workers: threads,
                schedule: Schedule::default(),
                chunking: Chunking::default(),
                snapshots: SnapshotConfig::default(),
                cluster: ClusterConfig::default(),
                autoscale: None,
                buddy_copies: None,
                timeline_path: None,
                timeline: None,
                lease: crate::snapshot::DEFAULT_LEASE,
                run_lease: None,
            },
        }
    }
}

impl Builder {
    /// Local worker threads each job starts with (default: the available parallelism).
    ///
    /// Zero runs jobs inline on the thread that waits for them ([`JobHandle::wait`],
    /// [`Executor::run`]; a helper thread while a job is awaited), and on worker processes.
    /// Until a thread waits, such a job runs only on worker processes; a program that polls
    /// [`JobHandle::is_finished`] or [`JobHandle::progress`] instead of waiting gets a helper
    /// thread for it after a second, with a warning, unless the executor listens for worker
    /// processes (see [`JobHandle::is_finished`]).
    pub fn local_workers(mut self, n: usize) -> Self {
        self.config.local_workers = n;
        self
    }

    /// How chunks are handed to workers (default [`Schedule::Dynamic`]).
    pub fn schedule(mut self, schedule: Schedule) -> Self {
        self.config.schedule = schedule;
        self
    }

    /// How each phase is cut into chunks (default [`Chunking::Count`]`(1024)`). Ignored by
    /// [`Schedule::Guided`], which has its own sizes.
    pub fn chunking(mut self, chunking: Chunking) -> Self {
        self.config.chunking = chunking;
        self
    }

    /// Where snapshots go: `file:///path`, a folder's path (`snaps`, `./snaps`,
    /// `/scratch/snaps`; a relative one resolved against the current directory when the
    /// store is opened), `memory://`, or `s3://bucket/prefix` (feature `s3`). The default is
    /// the local folder `./snapshots`, created at the first snapshot.
    pub fn snapshots(mut self, url: impl Into<String>) -> Self {
        self.config.snapshots.url = Some(url.into());
        self
    }

    /// Snapshots go to this store (any `object_store` backend, wrapped with
    /// [`Store::from_object_store`](crate::snapshot::Store::from_object_store)).
    pub fn snapshot_store(mut self, store: crate::snapshot::Store) -> Self {
        self.config.snapshots.set_store(store);
        self
    }

    /// An option of the snapshot store, as `object_store` names them (for S3: `endpoint`,
    /// `region`, `access_key_id`, `secret_access_key`, `allow_http`, …); the usual `AWS_*`
    /// environment variables are read too.
    pub fn snapshot_option(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.config
            .snapshots
            .options
            .push((key.into(), value.into()));
        self
    }

    /// The job id snapshots are stored under (default: the job's [`Job::NAME`]).
    pub fn job_id(mut self, id: impl Into<String>) -> Self {
        self.config.snapshots.job_id = Some(id.into());
        self
    }

    /// How long a run's hold on its job id lasts unless renewed (default 30 s, at least
    /// [`MIN_LEASE`](crate::snapshot::MIN_LEASE)).
    ///
    /// A run that may write snapshots (a store given with [`snapshots`](Self::snapshots) or
    /// [`snapshot_store`](Self::snapshot_store), a snapshot period, a deadline, signals or a
    /// token, and every run of [`Executor::resume`] and [`Executor::submit_or_resume`])
    /// first takes its job id's *lease* in the store (an object under
    /// `{prefix}/{job_id}/lease/`), renews it every quarter of this length on the
    /// executor's I/O thread, and releases it when the job ends (finished, suspended,
    /// failed or cancelled; [`JobHandle::wait`] and awaiting return once it is released).
    /// A second run of the same job id, in this process or any other, is refused at submit
    /// with [`Error::JobIdHeld`], which names the holder (host, process id, when it took
    /// it), before any work. A run that died without releasing it holds the job id until the
    /// lease expires: a later run then takes it over (or, when it is known to be dead,
    /// deleting `{prefix}/{job_id}/lease/` frees the job id at once). A run that loses its lease (not
    /// renewed in time, taken over) commits no snapshot any more and ends with
    /// [`Error::LeaseLost`]. A run with no store given and no snapshot trigger takes no lease
    /// (a snapshot asked for by hand is then committed without one).
    ///
    /// # Clocks
    ///
    /// Expiry is judged by the run that wants to take the lease over: the newest lease
    /// record's date *as the store dates it* must be a lease length behind this host's
    /// clock, and the record must then stay unrenewed while this run watches it for half a
    /// lease on its own monotonic clock. A live holder renews every quarter lease, so clock
    /// skew between hosts never takes a live lease; a taker whose clock is behind only
    /// waits longer. See the protocol in the source's `snapshot/lease.rs` for the window
    /// that remains (a holder frozen between its check and its commit).
    pub fn job_lease(mut self, length: Duration) -> Self {
        self.config.lease = length;
        self
    }

    /// Committed snapshots kept per job (default 2, at least 1; the newest is never deleted).
    /// Old ones are deleted before each commit, once its parts are written, so the store
    /// never holds more than `k` (for `k = 1`, after the commit: briefly two). Parts an
    /// incremental snapshot shares with an older one stay as long as a kept snapshot
    /// references them (see [`Builder::full_snapshot_every`]).
    pub fn keep_snapshots(mut self, k: usize) -> Self {
        self.config.snapshots.keep = k.max(1);
        self
    }

    /// Takes a coordinated snapshot every `period` while a job runs. A periodic snapshot
    /// that fails is logged, counted and kept on the handle
    /// ([`JobHandle::last_snapshot_error`]); see [`Builder::max_snapshot_failures`].
    pub fn snapshot_every(mut self, period: Duration) -> Self {
        self.config.snapshots.every = Some(period);
        self
    }

    /// Ends a job with [`Error::SnapshotsFailing`] once `n` of its snapshots in a row have
    /// failed (periodic, asked for or a suspend's; a commit starts the count again), rather
    /// than let it run on without a restore point. The error carries the count, the last
    /// cause and the last committed snapshot, which stays restorable. Default: never (the
    /// job runs on; failures are logged, counted and on the handle). `n` is at least 1.
    pub fn max_snapshot_failures(mut self, n: u32) -> Self {
        self.config.snapshots.max_failures = Some(n.max(1));
        self
    }

    /// Writes every `n`-th snapshot in full (counted since the last full one; `n` at least
    /// 1, so `1` writes every snapshot in full). Other snapshots are incremental: a chunk
    /// whose state did not change since the last commit is referenced, not written again,
    /// so snapshots share parts and one damaged part breaks all of those that reference it.
    /// With `full_snapshot_every(1)` the [`Builder::keep_snapshots`] kept snapshots are
    /// independent restore points. The first snapshot of a resumed run is full. Default:
    /// every snapshot incremental.
    pub fn full_snapshot_every(mut self, n: u32) -> Self {
        self.config.snapshots.full_every = Some(n.max(1));
        self
    }

    /// Suspends jobs before `deadline` (say, the end of a batch allocation): the final
    /// snapshot starts early enough to commit before it, by a margin of twice the longest
    /// snapshot measured so far plus one second (before any was measured: ten seconds, or
    /// half the time from submit to the deadline if that is less). A suspend whose snapshot
    /// fails is retried every second. In a Slurm job, [`crate::slurm::allocation_deadline`]
    /// gives the end of the allocation.
    pub fn deadline(mut self, deadline: SystemTime) -> Self {
        self.config.snapshots.deadline = Some(deadline);
        self
    }

    /// Suspends jobs on SIGINT (Ctrl-C), SIGTERM and SIGUSR1: what a person, a service
    /// manager and a batch scheduler send before they stop a program. The same as
    /// [`suspend_on`](Self::suspend_on) with those three.
    pub fn suspend_on_signals(self) -> Self {
        self.suspend_on([libc::SIGINT, libc::SIGTERM, libc::SIGUSR1])
    }

    /// Suspends jobs on these signals (numbers as in `libc`, say `libc::SIGUSR2`), replacing
    /// any set given before; an empty set installs nothing. No handler is installed unless a
    /// set is given; once installed (at the first submit), the handlers stay for the life of
    /// the process, so these signals no longer terminate it by default, with one exception:
    /// SIGINT. A second SIGINT while a suspend is under way ends the process as Ctrl-C
    /// would have (the suspend's snapshot may then be lost, the previous ones are not), and
    /// when the last job watching SIGINT has ended, SIGINT terminates the process again
    /// (the default action is restored, also for any other handler of SIGINT the program
    /// installed through tokio).
    pub fn suspend_on(mut self, signals: impl IntoIterator<Item = i32>) -> Self {
        let mut set: Vec<i32> = signals.into_iter().collect();
        set.sort_unstable();
        set.dedup();
        self.config.snapshots.signals = set;
        self
    }

    /// Suspends jobs when `token` is triggered, for programs with their own trigger.
    pub fn suspend_token(mut self, token: &SuspendToken) -> Self {
        self.config.snapshots.token = Some(token.clone());
        self
    }

    /// Accepts remote worker processes on `addr` (say `127.0.0.1:0`, or `0.0.0.0:7070`):
    /// they join the running job whose name they know. An address other than loopback needs
    /// a token ([`Builder::cluster_token`], or the environment variable
    /// [`TOKEN_ENV`](crate::cluster::TOKEN_ENV)).
    pub fn listen(mut self, addr: impl Into<String>) -> Self {
        self.config.cluster.listen = Some(addr.into());
        self
    }

    /// The token remote workers must prove they hold (default: from the environment
    /// variable [`TOKEN_ENV`](crate::cluster::TOKEN_ENV), if set).
    pub fn cluster_token(mut self, token: crate::wire::Token) -> Self {
        self.config.cluster.token = Some(token);
        self
    }

    /// How often the coordinator and its workers send heartbeats (default 500 ms) and how
    /// long either waits for a frame before it gives the other up (default 5 s).
    pub fn heartbeat(mut self, every: Duration, lease: Duration) -> Self {
        self.config.cluster.heartbeat = every;
        self.config.cluster.lease = lease.max(every);
        self
    }

    /// The time limit of a worker's handshake (default 5 s).
    pub fn handshake_timeout(mut self, d: Duration) -> Self {
        self.config.cluster.handshake_timeout = d;
        self
    }

    /// The maximum frame length on worker connections (default 64 MiB). A longer message
    /// (a job value, a chunk state, an output) is sent in pieces.
    pub fn max_frame(mut self, bytes: usize) -> Self {
        self.config.cluster.max_frame = bytes;
        self
    }

    /// The maximum length of a message a worker process may send in pieces (default 4 GiB):
    /// the most memory one connection's incoming message can take.
    pub fn max_message(mut self, bytes: usize) -> Self {
        self.config.cluster.max_message = bytes;
        self
    }

    /// How long dropping the executor, [`Executor::shutdown`] and [`JobHandle::wait`] wait
    /// for what is under way to complete (default 10 s): `End` frames to worker processes of
    /// ended jobs, and (the executor only) snapshot writes in flight. See
    /// [`Executor`]'s "Shutdown".
    pub fn shutdown_timeout(mut self, d: Duration) -> Self {
        self.config.shutdown_timeout = d;
        self
    }

    /// Whether [`build`](Self::build) checks that the store given to
    /// [`snapshots`](Self::snapshots) can be written (default: yes, within 10 s): it puts,
    /// reads back and deletes a small object, so a missing bucket, refused credentials or an
    /// endpoint that does not answer fail at once rather than at the first snapshot. Turn it
    /// off for a store that is expected to come up later; a store given as an object
    /// ([`snapshot_store`](Self::snapshot_store)) and the default folder are not checked.
    pub fn check_store(mut self, check: bool) -> Self {
        self.config.check_store =
            check.then_some(self.config.check_store.unwrap_or(Duration::from_secs(10)));
        self
    }

    /// How long [`build`](Self::build)'s store check may take (default 10 s): an endpoint
    /// that does not answer within it fails the build with [`Error::StoreUnusable`].
    pub fn store_check_timeout(mut self, d: Duration) -> Self {
        if self.config.check_store.is_some() {
            self.config.check_store = Some(d);
        }
        self
    }

    /// Removes a job's snapshots from the store once it has finished (its value is in hand:
    /// the snapshots could only resume a job that is done), in [`JobHandle::wait`] after any
    /// snapshot write still in flight. A suspended, failed or cancelled job keeps them. A
    /// removal that fails does not fail the job: it is logged, counted in
    /// [`SNAPSHOT_REMOVAL_FAILURES`](crate::metrics::SNAPSHOT_REMOVAL_FAILURES), and
    /// [`Executor::remove_snapshots`] can finish it.
    pub fn remove_snapshots_when_finished(mut self) -> Self {
        self.config.remove_when_finished = true;
        self
    }

    /// Whether [`Executor::submit_or_resume`] (and its async twin) may start a job afresh
    /// when the store holds no committed snapshot of it (default [`Resume::IfAny`]: yes).
    /// [`Resume::Required`] refuses to, with [`Error::NothingToResume`], for a program that
    /// is being restarted and must go on where it stopped: a misspelt store path or job id
    /// then fails at once instead of computing from the start into a new folder.
    pub fn resume_policy(mut self, resume: Resume) -> Self {
        self.config.resume = resume;
        self
    }

    /// What [`Executor::submit_or_resume`] (and its async twin) does when the job it is
    /// given is not the one the run of the snapshot it resumes was submitted with (their
    /// serialized bytes differ: another grid size, more steps): by default
    /// ([`Resubmit::AskJob`]) [`Job::resumed_with`] decides, and its default refuses with
    /// [`Error::ResumedJobDiffers`] before anything runs; [`Resubmit::UseStored`] resumes the
    /// job as the snapshot stored it and ignores the submitted value (logged at info).
    pub fn resubmit_policy(mut self, resubmit: Resubmit) -> Self {
        self.config.resubmit = resubmit;
        self
    }

    /// Starts worker processes for [`JobHandle::scale_remote`].
    pub fn launcher(mut self, launcher: impl crate::wire::Launcher + 'static) -> Self {
        self.config.cluster.launcher = Some(Arc::new(launcher));
        self
    }

    /// Buddy copies of owned partitions, for local recovery, every `every` phases (0: none,
    /// the default). At the barrier after every `every`-th phase, each worker
    /// process copies the partitions it holds, as the phase left them, into the memory of
    /// another worker process (on another node if the roster has one; only processes that
    /// exchange halos directly, [`WorkerOptions::direct_halos`](crate::cluster::WorkerOptions::direct_halos),
    /// take copies), process to process, never through the coordinator. Each partition has
    /// at most one copy; [`JobHandle::copies`] shows them, with the memory they take per
    /// process (bounded in each process by
    /// [`WorkerOptions::copy_memory`](crate::cluster::WorkerOptions::copy_memory)).
    ///
    /// Each process also keeps the halos its partitions exported since the oldest copy.
    /// When a worker process is lost with partitions, they are replayed from their copies,
    /// in the process that keeps them, to the phase the job is in, while every other
    /// partition goes on: nothing rolls back and nothing is read from the store
    /// ([`JobHandle::recoveries`]). A loss that cannot be replayed so (a copy lost too, a
    /// partition in the coordinator's own hands sending it halos, a snapshot being taken,
    /// ...) rolls the job back as without copies, and the log says why.
    ///
    /// Partitions on the coordinator's own threads need no copy: they are lost only with the
    /// coordinator. The copies cost a pause at the barriers where they are taken
    /// (`BENCHMARKS.md`, buddy copies and local recovery).
    pub fn buddy_copies(mut self, every: u64) -> Self {
        self.config.buddy_copies = Some(every).filter(|&k| k > 0);
        self
    }

    /// Scales each job's workers by itself with this policy: once per period its throughput
    /// is measured and a [`Decider`](crate::schedule::Decider) decides, within the policy's
    /// bounds, through the same paths as [`JobHandle::set_local_workers`] and
    /// [`JobHandle::scale_remote`]; each decision is logged (`tracing`, level info) with its
    /// reason and counted ([`AUTOSCALE_DECISIONS`](crate::metrics::AUTOSCALE_DECISIONS)).
    /// Scaling by hand still works: the decider adopts the new count and waits a cool-down.
    pub fn autoscale(mut self, policy: crate::schedule::Autoscale) -> Self {
        self.config.autoscale = Some(policy);
        self
    }

    /// Writes a timeline of every job run to the file at `path` (created, or truncated):
    /// one JSON line per event (joins, leaves, losses, autoscaling decisions, phase ends,
    /// snapshots, suspends, rollbacks, the end), each with its time; see
    /// [`timeline`](crate::timeline) for the format and [`timeline::report`](crate::timeline::report)
    /// (or the `malleable-report` command) for an HTML report of it. Written by a thread of
    /// its own through a bounded queue: a job never waits for it, and a record that cannot be
    /// written is logged and counted, never an error of the job.
    pub fn timeline(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.config.timeline_path = Some(path.into());
        self
    }

    /// Builds the executor.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a job lease shorter than
    /// [`MIN_LEASE`](crate::snapshot::MIN_LEASE), a chunk count or size of zero, a guided schedule with
    /// zero workers or a zero minimum chunk, or an autoscaling policy out of bounds
    /// ([`Autoscale::validate`](crate::schedule::Autoscale::validate), or worker processes
    /// without a listener and a launcher); [`Error::Snapshot`] for a snapshot URL that
    /// cannot be opened; [`Error::Spawn`] if the I/O thread cannot start;
    /// [`Error::Timeline`] if the timeline's file cannot be created;
    /// [`Error::Cluster`] for an address that cannot be listened on, or one other than
    /// loopback without a token.
    pub fn build(mut self) -> Result<Executor> {
        signals::check(&self.config.snapshots.signals).map_err(Error::InvalidConfig)?;
        if self.config.lease < crate::snapshot::MIN_LEASE {
            return Err(Error::InvalidConfig(format!(
                "a job id's lease of {:?} is shorter than the minimum, {:?}",
                self.config.lease,
                crate::snapshot::MIN_LEASE
            )));
        }
        if self.config.snapshots.url.is_some() {
            self.config.snapshots.store()?;
        }
        self.config
            .chunking
            .validate()
            .map_err(|e: crate::schedule::Invalid| Error::InvalidConfig(e.to_string()))?;
        if let Schedule::Guided(g) = self.config.schedule {
            if g.workers == 0 || g.min_chunk == 0 {
                return Err(Error::InvalidConfig(
                    "guided schedule needs workers >= 1 and min_chunk >= 1".into(),
                ));
            }
        }
        if let Some(a) = &self.config.autoscale {
            a.validate()
                .map_err(|e| Error::InvalidConfig(e.to_string()))?;
            let cluster = &self.config.cluster;
            if a.bounds.max_remote > 0 && (cluster.listen.is_none() || cluster.launcher.is_none()) {
                return Err(Error::InvalidConfig(
                    "autoscaling worker processes needs Builder::listen and Builder::launcher"
                        .into(),
                ));
            }
        }
        if self.config.cluster.token.is_none() {
            self.config.cluster.token = crate::wire::Token::from_env()?;
        }
        if let Some(id) = &self.config.snapshots.job_id {
            crate::snapshot::check_job_id(id)?;
        }
        if let Some(path) = &self.config.timeline_path {
            self.config.timeline = Some(watch::open(path)?);
        }
        let io = Arc::new(IoRuntime::new()?);
        if let (Some(url), Some(within)) = (&self.config.snapshots.url, self.config.check_store) {
            let store = self.config.snapshots.store()?;
            let checked = io::block_on_io(io.handle(), async move {
                Ok(tokio::time::timeout(within, store.check_writable()).await)
            })?;
            let unusable = |source| Error::StoreUnusable {
                url: url.clone(),
                within,
                source,
            };
            match checked {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(unusable(Some(Box::new(e)))),
                Err(_) => return Err(unusable(None)),
            }
        }
        let listener = match self.config.cluster.listen {
            Some(_) => Some(Listener::start(io.handle(), self.config.cluster.clone())?),
            None => None,
        };
        let last = Arc::new(LastClone {
            io: Arc::clone(&io),
            timeout: self.config.shutdown_timeout,
            timeline: self.config.timeline.clone(),
            drained: std::sync::atomic::AtomicBool::new(false),
        });
        Ok(Executor {
            config: self.config,
            io,
            listener,
            last,
        })
    }
}

impl Executor {
    /// A builder with the defaults.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// The address remote workers dial, if the executor listens
    /// ([`Builder::listen`]; with port 0 this is the port chosen).
    pub fn local_addr(&self) -> Option<std::net::SocketAddr> {
        self.listener.as_ref().map(|l| l.addr())
    }

    /// Waits, up to [`Builder::shutdown_timeout`], until every worker process of an ended job
    /// has been sent its `End` and every snapshot write in flight has finished, then drops
    /// this handle on the executor (see "Shutdown" above). Dropping the last clone does the
    /// same; call this to learn whether it all completed, or from an async context (inside
    /// `spawn_blocking`: it blocks). Dropping clones afterwards does not wait again. Jobs still
    /// running are not waited for and go on while their handles live.
    ///
    /// # Errors
    ///
    /// [`Error::ShutdownTimedOut`] with what was still under way at the time limit (it is
    /// abandoned; it is also logged and counted).
    pub fn shutdown(self) -> Result<()> {
        let timeout = self.config.shutdown_timeout;
        let left = self.io.drain(None, timeout);
        self.last
            .drained
            .store(true, std::sync::atomic::Ordering::Relaxed);
        shutdown::report("the executor's shutdown", left, timeout);
        watch::flush(self.config.timeline.as_deref(), timeout);
        if left.connections == 0 && left.writes == 0 {
            Ok(())
        } else {
            Err(Error::ShutdownTimedOut {
                connections: left.connections,
                writes: left.writes,
                after: timeout,
            })
        }
    }

    /// The most recent refused peers and lost worker connections (at most 256), oldest first.
    pub fn peer_errors(&self) -> Vec<Arc<crate::wire::Error>> {
        self.listener.as_ref().map_or_else(Vec::new, |l| l.errors())
    }

    /// Starts `job` in the background on its own worker threads.
    ///
    /// A run that may write snapshots first takes its job id's lease in the store (see
    /// [`Builder::job_lease`]): this blocks while it does (a few requests; half a lease
    /// when the lease of a run that died is to be taken over).
    ///
    /// # Errors
    ///
    /// [`Error::JobIdHeld`] if another run holds the job id (nothing was started);
    /// [`Error::Snapshot`] if the store cannot be read or written for the lease;
    /// [`Error::Panicked`] if `iterations` or `reducer` panics on the first phase;
    /// [`Error::Spawn`] if a worker thread cannot be started.
    pub fn submit<J: Job>(&self, job: J) -> Result<JobHandle<J>> {
        let lease = if lease::wanted(&self.config) {
            let store = self.config.snapshots.store()?;
            Some(self.take_lease::<J>(&store)?)
        } else {
            None
        };
        self.leased(lease, |lease| self.submit_leased(job, lease))
    }

    /// [`Executor::submit`] with the job id's lease taken already (or none).
    fn submit_leased<J: Job>(
        &self,
        job: J,
        lease: Option<lease::RunLease>,
    ) -> Result<JobHandle<J>> {
        let (core, chunking) = first_phase(&job, &self.config)?;
        let origin = io::Origin::new(Some(crate::codec::encode("the job", &job)?), &job, 0)?;
        self.launch(
            job,
            core,
            0,
            0,
            Snapshots::default(),
            (self.config.schedule, chunking),
            origin,
            lease,
        )
    }

    /// Starts a job run from its first phase or from a restored ledger.
    #[allow(clippy::too_many_arguments)]
    fn launch<J: Job>(
        &self,
        job: J,
        core: Core<J::Reducer, Held<J::Chunk>>,
        phase: u64,
        iterations_before: u64,
        snap: Snapshots,
        (schedule, chunking): (Schedule, Chunking),
        origin: io::Origin,
        lease: Option<lease::RunLease>,
    ) -> Result<JobHandle<J>> {
        // Owned partitions: a declared neighbour graph that is not one is refused before
        // anything runs.
        let shape = job_run::shape_of(&job, core.plan().len(), phase)?;
        let config = Config {
            schedule,
            chunking,
            origin,
            run_lease: lease,
            ..self.config.clone()
        };
        let (config, inputs) = (Arc::new(config), Arc::new(Inputs::default()));
        let state = State::new(
            (Arc::clone(&config), Arc::clone(&inputs)),
            (core, shape),
            job,
            phase,
            iterations_before,
            snap,
            self.config.local_workers,
        );
        let shared = Arc::new_cyclic(|me| Shared {
            config,
            io: Arc::clone(&self.io),
            listener: self.listener.clone(),
            inputs,
            started: Instant::now(),
            me: me.clone(),
            state: Mutex::new(job_run::Locked::new(state)),
        });
        {
            let mut st = shared.lock();
            st.watch_start();
            st.settle();
            if let Some(Err(e)) = st.result.take_if(|r| r.is_err()) {
                return Err(e);
            }
        }
        lease::spawn_renewal(&shared);
        triggers::spawn_triggers(&shared);
        if let Some(l) = &self.listener {
            let weak: std::sync::Weak<dyn crate::wire::listener::Attach> =
                Arc::downgrade(&shared) as _;
            l.register(weak);
        }
        Ok(JobHandle::new(shared))
    }

    /// Runs `job` to the end, blocking the calling thread (which computes too when the
    /// executor has zero local workers).
    ///
    /// # Errors
    ///
    /// As [`Executor::submit`] and [`JobHandle::wait`].
    pub fn run<J: Job>(&self, job: J) -> Result<Finished<J>> {
        match self.submit(job)?.wait()? {
            Outcome::Finished(f) => Ok(f),
            Outcome::Suspended(id) => Err(Error::Suspended(id)),
        }
    }
}

/// The core of a job run: its ledger over chunk states held live or as bytes.
pub(crate) type JobCore<J> = Core<<J as Job>::Reducer, Held<<J as Job>::Chunk>>;

/// The core of the first phase and the job's chunking (its own, or the executor's), with
/// user panics caught.
fn first_phase<J: Job>(job: &J, config: &Config) -> Result<(JobCore<J>, Chunking)> {
    let (core, chunking) = catch(Site::Job { phase: 0 }, J::NAME, || {
        let chunking = job.chunking().unwrap_or(config.chunking);
        let plan = Plan::new(job.iterations(), config.schedule, chunking);
        (Core::new(config.schedule, plan, job.reducer()), chunking)
    })?;
    chunking
        .validate()
        .map_err(|e: crate::schedule::Invalid| Error::InvalidConfig(e.to_string()))?;
    let core = if J::OWNERSHIP.is_partitioned() {
        core.with_partitions(0)
    } else {
        core
    };
    Ok((core, chunking))
}
