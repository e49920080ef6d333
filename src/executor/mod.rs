//! The executor: builder, job handles and outcomes; it wires the sans-IO core to workers.
//!
//! - `mod.rs` (this file): [`Executor`], [`Builder`], and the shared state of one job run.
//! - `handle.rs`: [`JobHandle`] (scale, progress, cancel, wait or await) and [`Outcome`].
//! - `local.rs`: local worker threads and the inline worker, hosts of the chunk runner.
//! - `remote.rs`: the job's side of worker processes (their connections and slots).
//! - `snapshot.rs`: the snapshot cut, the background write, suspend and resume.
//!
//! # How a job runs
//!
//! Each submitted job gets its own state (`Shared`): the core behind one mutex, the local
//! workers' mailboxes (crossbeam channels) and their attention flags. There is no global
//! pool: two executors, or two jobs of one executor, never share threads.
//!
//! A worker runs steps back to back and reads one atomic flag per step. It takes the mutex
//! only when a chunk ends or it was interrupted; under the mutex it feeds the event to the
//! core and carries out the commands the core returns (sending `Run` and `Release` messages,
//! setting flags). Every command is carried out before the mutex is released, so a flag is
//! never set for a request the core has already withdrawn.
//!
//! # Inline mode
//!
//! With zero local workers the job runs on the thread that waits for it with the blocking
//! [`JobHandle::wait`] (or [`Executor::run`]): that thread joins the core as a worker. Raising
//! the count retires the inline worker at its next adjustment point and spawns threads;
//! lowering it to zero retires the threads and the waiting thread takes over. A job that is
//! awaited (async) with zero workers runs inline on one helper thread, never on a runtime
//! thread.

mod handle;
mod local;
mod remote;
mod snapshot;

pub use handle::{Finished, JobFuture, JobHandle, Outcome, Progress, SnapshotRequest};
pub use snapshot::At;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Waker;
use std::time::{Duration, Instant, SystemTime};

use crossbeam_channel::Sender;

use crate::error::{Error, Result, Site};
use crate::job::{Job, Next, Value};
use crate::run::{Assignment, Cell, Held, INTERRUPT, Inputs, SuspendToken, catch};
use crate::schedule::{Chunking, Command, Core, Event, Plan, Schedule, WorkerId};
use crate::wire::listener::{ClusterConfig, Listener};
use snapshot::{Captured, SnapshotConfig, Snapshots};

/// Runs jobs on local worker threads.
///
/// Cheap to clone; holds only configuration. Each submitted job gets its own threads.
#[derive(Debug, Clone)]
pub struct Executor {
    config: Config,
    io: Arc<IoRuntime>,
    listener: Option<Arc<Listener>>,
}

#[derive(Debug, Clone)]
struct Config {
    local_workers: usize,
    schedule: Schedule,
    chunking: Chunking,
    snapshots: SnapshotConfig,
    cluster: ClusterConfig,
}

/// The executor's I/O runtime: one tokio thread for snapshot writes, timers and signals.
/// It is never a runtime of the caller's, and compute never runs on it.
#[derive(Debug)]
pub(crate) struct IoRuntime(Option<tokio::runtime::Runtime>);

impl IoRuntime {
    fn new() -> Result<IoRuntime> {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("malleable-io")
            .enable_all()
            .build()
            .map(|rt| IoRuntime(Some(rt)))
            .map_err(Error::Spawn)
    }

    pub(crate) fn handle(&self) -> &tokio::runtime::Handle {
        self.0
            .as_ref()
            .expect("the runtime lives until drop")
            .handle()
    }
}

impl Drop for IoRuntime {
    fn drop(&mut self) {
        // Dropping a runtime blocks, which panics inside an async context; this does not.
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
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
                local_workers: threads,
                schedule: Schedule::default(),
                chunking: Chunking::default(),
                snapshots: SnapshotConfig::default(),
                cluster: ClusterConfig::default(),
            },
        }
    }
}

impl Builder {
    /// Local worker threads each job starts with (default: the available parallelism).
    /// Zero runs jobs inline on the thread that waits for them.
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

    /// Where snapshots go: `file:///path`, `memory://`, or `s3://bucket/prefix` (feature
    /// `s3`). The default is the local folder `./snapshots`, created at the first snapshot.
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

    /// Committed snapshots kept per job (default 2, at least 1; the newest is never deleted).
    pub fn keep_snapshots(mut self, k: usize) -> Self {
        self.config.snapshots.keep = k.max(1);
        self
    }

    /// Takes a coordinated snapshot every `period` while a job runs.
    pub fn snapshot_every(mut self, period: Duration) -> Self {
        self.config.snapshots.every = Some(period);
        self
    }

    /// Suspends jobs before `deadline` (say, the end of a batch allocation): the final
    /// snapshot starts early enough to commit before it, by a margin of twice the longest
    /// snapshot measured so far plus one second (before any was measured: ten seconds, or
    /// half the time from submit to the deadline if that is less). A suspend whose snapshot
    /// fails is retried every second.
    pub fn deadline(mut self, deadline: SystemTime) -> Self {
        self.config.snapshots.deadline = Some(deadline);
        self
    }

    /// Suspends jobs on SIGTERM and SIGUSR1, which batch schedulers send before a time limit.
    /// No handler is installed unless this is called; once installed (at the first submit),
    /// the handlers stay for the life of the process, so these signals no longer terminate it
    /// by default.
    pub fn suspend_on_signals(mut self) -> Self {
        self.config.snapshots.signals = true;
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

    /// The maximum frame length on worker connections (default 64 MiB).
    pub fn max_frame(mut self, bytes: usize) -> Self {
        self.config.cluster.max_frame = bytes;
        self
    }

    /// Starts worker processes for [`JobHandle::scale_remote`].
    pub fn launcher(mut self, launcher: impl crate::wire::Launcher + 'static) -> Self {
        self.config.cluster.launcher = Some(Arc::new(launcher));
        self
    }

    /// Builds the executor.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a chunk count or size of zero, or a guided schedule with
    /// zero workers or a zero minimum chunk; [`Error::Snapshot`] for a snapshot URL that
    /// cannot be opened; [`Error::Spawn`] if the I/O thread cannot start;
    /// [`Error::Cluster`] for an address that cannot be listened on, or one other than
    /// loopback without a token.
    pub fn build(mut self) -> Result<Executor> {
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
        if self.config.cluster.token.is_none() {
            self.config.cluster.token = crate::wire::Token::from_env()?;
        }
        let io = Arc::new(IoRuntime::new()?);
        let listener = match self.config.cluster.listen {
            Some(_) => Some(Listener::start(io.handle(), self.config.cluster.clone())?),
            None => None,
        };
        Ok(Executor {
            config: self.config,
            io,
            listener,
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

    /// The most recent refused peers and lost worker connections (at most 256), oldest first.
    pub fn peer_errors(&self) -> Vec<Arc<crate::wire::Error>> {
        self.listener.as_ref().map_or_else(Vec::new, |l| l.errors())
    }

    /// Starts `job` in the background on its own worker threads.
    ///
    /// # Errors
    ///
    /// [`Error::Panicked`] if `iterations` or `reducer` panics on the first phase;
    /// [`Error::Spawn`] if a worker thread cannot be started.
    pub fn submit<J: Job>(&self, job: J) -> Result<JobHandle<J>> {
        let core = first_phase(&job, &self.config)?;
        self.launch(
            job,
            core,
            0,
            0,
            Snapshots::default(),
            self.config.schedule,
            self.config.chunking,
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
        schedule: Schedule,
        chunking: Chunking,
    ) -> Result<JobHandle<J>> {
        let config = Config {
            schedule,
            chunking,
            ..self.config.clone()
        };
        let shared = Arc::new(Shared {
            config,
            io: Arc::clone(&self.io),
            listener: self.listener.clone(),
            inputs: Inputs::default(),
            started: Instant::now(),
            state: Mutex::new(State {
                core,
                job: Some(Arc::new(job)),
                phase,
                iterations_before,
                snap,
                target: self.config.local_workers,
                locals: HashMap::new(),
                waiter: None,
                next_id: 0,
                result: None,
                ended: false,
                waker: None,
                out: Vec::new(),
                remote: remote::Remotes::default(),
                launched: Vec::new(),
                workers_gauge: metrics::gauge!(crate::metrics::WORKERS, "job" => J::NAME),
            }),
        });
        {
            let mut st = shared.lock();
            st.settle(&shared);
            if let Some(Err(e)) = st.result.take_if(|r| r.is_err()) {
                return Err(e);
            }
        }
        snapshot::spawn_triggers(&shared);
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

/// The plan and reducer of the first phase, with user panics caught.
fn first_phase<J: Job>(job: &J, config: &Config) -> Result<Core<J::Reducer, Held<J::Chunk>>> {
    catch(Site::Job { phase: 0 }, J::NAME, || {
        let plan = Plan::new(job.iterations(), config.schedule, config.chunking);
        Core::new(config.schedule, plan, job.reducer())
    })
}

/// A message to a local worker (or to the thread waiting in inline mode).
pub(crate) enum Msg<J: Job> {
    /// Run a chunk of the current phase as worker `worker`.
    Run {
        worker: WorkerId,
        assignment: Assignment<J::Chunk>,
        job: Arc<J>,
        cell: Arc<Cell>,
    },
    /// This worker id is released: a thread exits, the inline waiter goes back to waiting.
    Release,
    /// Something changed (the job ended, or the inline role may be needed): look again.
    Wake,
}

struct Local<J: Job> {
    tx: Sender<Msg<J>>,
    cell: Arc<Cell>,
    inline: bool,
    retiring: bool,
}

/// Everything one job run shares between its workers and its handle.
pub(crate) struct Shared<J: Job> {
    config: Config,
    io: Arc<IoRuntime>,
    listener: Option<Arc<Listener>>,
    inputs: Inputs<J>,
    started: Instant,
    state: Mutex<State<J>>,
}

impl<J: Job> fmt::Debug for Shared<J> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("job", &J::NAME)
            .finish_non_exhaustive()
    }
}

pub(crate) struct State<J: Job> {
    core: Core<J::Reducer, Held<J::Chunk>>,
    /// The job; `None` only while it is handed to the caller at the end.
    job: Option<Arc<J>>,
    phase: u64,
    /// Iterations of the finished phases.
    iterations_before: u64,
    /// Snapshot bookkeeping (`snapshot.rs`).
    snap: Snapshots,
    /// Requested local worker threads.
    target: usize,
    locals: HashMap<WorkerId, Local<J>>,
    /// The mailbox of the thread blocked in `wait`, which runs the job when `target` is 0.
    waiter: Option<Sender<Msg<J>>>,
    next_id: WorkerId,
    result: Option<Result<Outcome<J>>>,
    /// Set once, when the result is stored (it stays set after the result is taken).
    pub(crate) ended: bool,
    waker: Option<Waker>,
    /// The core's command buffer, reused.
    out: Vec<Command<Held<J::Chunk>>>,
    /// Remote worker processes and their slots (`remote.rs`).
    remote: remote::Remotes,
    /// Worker processes started by `scale_remote`.
    launched: Vec<Box<dyn crate::wire::Launched>>,
    workers_gauge: metrics::Gauge,
}

impl<J: Job> Shared<J> {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State<J>> {
        // A panic never happens while the lock is held (user code under it is caught), but be
        // robust: the state stays consistent, so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<J: Job> State<J> {
    /// A worker's report: feeds it to the core, then settles (phase ends, worker target).
    /// A command for `me` is returned instead of sent.
    pub(crate) fn report(
        &mut self,
        shared: &Arc<Shared<J>>,
        event: Event<Held<J::Chunk>, Value<J>>,
        me: Option<WorkerId>,
    ) -> Option<Msg<J>> {
        let mine = self.feed(shared, event, me);
        self.settle(shared);
        mine
    }

    /// Feeds an event to the core and carries out the resulting commands; does not settle,
    /// so that `reconcile` can call it without re-entering itself. A command for `me` is
    /// returned instead of sent.
    fn feed(
        &mut self,
        shared: &Arc<Shared<J>>,
        event: Event<Held<J::Chunk>, Value<J>>,
        me: Option<WorkerId>,
    ) -> Option<Msg<J>> {
        match self.feed_at(shared, event, me, None) {
            Ok(mine) => mine,
            // Local workers never send an event the ledger refuses; if one does, stop the
            // job rather than risk a wrong value.
            Err(rejected) => {
                self.fail(shared, Error::Internal(rejected.to_string()));
                None
            }
        }
    }

    /// Feeds an event from a remote worker, with a `Done`'s output as it came over the wire:
    /// one the ledger refuses is returned (the connection is then dropped) and changes
    /// nothing.
    fn feed_checked(
        &mut self,
        shared: &Arc<Shared<J>>,
        event: Event<Held<J::Chunk>, Value<J>>,
        output_bytes: Option<bytes::Bytes>,
    ) -> std::result::Result<(), crate::schedule::Rejected> {
        self.feed_at(shared, event, None, output_bytes).map(|_| ())
    }

    /// Feeds an event to the core and carries out the commands; returns the command for
    /// `me`, or the ledger's refusal. `output_bytes` is a `Done`'s output already encoded.
    fn feed_at(
        &mut self,
        shared: &Arc<Shared<J>>,
        event: Event<Held<J::Chunk>, Value<J>>,
        me: Option<WorkerId>,
        output_bytes: Option<bytes::Bytes>,
    ) -> std::result::Result<Option<Msg<J>>, crate::schedule::Rejected> {
        if self.snap.cut.is_open() {
            // Protocol step 2 of `schedule/cut.rs`: the output or handed-back state of a chunk
            // the cut waits for, from the worker the marker saw it on (an event the ledger
            // will refuse comes from another worker and does not reach the cut).
            match &event {
                Event::Done {
                    worker,
                    chunk,
                    output,
                    ..
                } if self.snap.cut.waits_for(*worker, *chunk) => {
                    let bytes = match output_bytes {
                        Some(b) => Ok(b),
                        None => crate::codec::encode("a chunk output", output)
                            .map(Into::into)
                            .map_err(Error::from),
                    };
                    self.captured(shared, *worker, *chunk, bytes.map(Captured::Output));
                }
                Event::Yielded {
                    worker,
                    chunk,
                    state,
                    ..
                } if self.snap.cut.waits_for(*worker, *chunk) => {
                    let bytes = state.to_bytes().map_err(Error::from);
                    let captured = bytes.map(|b| Captured::State(snapshot::Part::New(b)));
                    self.captured(shared, *worker, *chunk, captured);
                }
                _ => {}
            }
        }
        let mut out = std::mem::take(&mut self.out);
        let phase = self.phase;
        // `handle` runs the reducer's `combine`: a panic there ends the job, not the worker.
        let mut rejected = None;
        match catch(Site::Reducer { phase }, J::NAME, || {
            self.core.handle(event, &mut out)
        }) {
            Ok(Ok(())) => {}
            Ok(Err(r)) => rejected = Some(r),
            Err(panic) => self.fail(shared, panic),
        }
        let mine = self.execute(&mut out, me);
        self.out = out;
        match rejected {
            Some(r) => Err(r),
            None => Ok(mine),
        }
    }

    /// Carries out core commands; returns the one addressed to `me`.
    fn execute(
        &mut self,
        out: &mut Vec<Command<Held<J::Chunk>>>,
        me: Option<WorkerId>,
    ) -> Option<Msg<J>> {
        let mut mine = None;
        let mut failed = None;
        for cmd in out.drain(..) {
            match cmd {
                Command::Run {
                    worker,
                    chunk,
                    range,
                    state,
                } => {
                    let (Some(local), Some(job)) = (self.locals.get(&worker), self.job.as_ref())
                    else {
                        self.run_remote(&mut failed, worker, chunk, range, state);
                        continue;
                    };
                    local.cell.publish(0);
                    self.snap.on_run(chunk);
                    let msg = Msg::Run {
                        worker,
                        assignment: Assignment {
                            chunk,
                            phase: self.phase,
                            range,
                            state,
                        },
                        job: Arc::clone(job),
                        cell: Arc::clone(&local.cell),
                    };
                    if me == Some(worker) {
                        mine = Some(msg);
                    } else {
                        let _ = local.tx.send(msg);
                    }
                }
                Command::Interrupt { worker } => {
                    if let Some(local) = self.locals.get(&worker) {
                        local.cell.raise(INTERRUPT);
                    } else {
                        self.interrupt_remote(worker);
                    }
                }
                Command::Release { worker } => {
                    if let Some(local) = self.locals.remove(&worker) {
                        if me == Some(worker) {
                            mine = Some(Msg::Release);
                        } else {
                            let _ = local.tx.send(Msg::Release);
                        }
                    } else {
                        self.release_remote(worker);
                    }
                }
            }
        }
        if let Some(e) = failed {
            if !self.ended {
                self.complete(Err(e));
            }
        }
        mine
    }

    /// After any change: end finished phases, then bring the workers to the target.
    pub(crate) fn settle(&mut self, shared: &Arc<Shared<J>>) {
        while !self.ended && self.core.phase_complete() {
            self.end_phase(shared);
        }
        self.reconcile(shared);
        self.poll_cut(shared);
        self.workers_gauge.set(self.locals.len() as f64);
    }

    /// The barrier between phases: every chunk is done and no worker holds the job.
    fn end_phase(&mut self, shared: &Arc<Shared<J>>) {
        let phase = self.phase;
        let value = match catch(Site::Reducer { phase }, J::NAME, || {
            self.core.finish_phase()
        }) {
            Ok(v) => v,
            Err(e) => return self.fail(shared, e),
        };
        let Some(arc) = self.job.take() else { return };
        // Workers drop their handle on the job before they report, and no chunk is pending,
        // so this is the last one.
        let mut job = match Arc::try_unwrap(arc) {
            Ok(job) => job,
            Err(arc) => {
                self.job = Some(arc);
                return self.fail(
                    shared,
                    Error::Internal("job still shared at a phase barrier".into()),
                );
            }
        };
        metrics::counter!(crate::metrics::PHASES, "job" => J::NAME).increment(1);
        let next = match catch(Site::Job { phase }, J::NAME, || job.end_phase(&value)) {
            Ok(next) => next,
            Err(e) => return self.fail(shared, e),
        };
        match next {
            Next::Finish => self.complete(Ok(Outcome::Finished(Finished { job, value }))),
            Next::Continue => {
                let (plan, reducer) = match catch(Site::Job { phase: phase + 1 }, J::NAME, || {
                    (
                        Plan::new(
                            job.iterations(),
                            shared.config.schedule,
                            shared.config.chunking,
                        ),
                        job.reducer(),
                    )
                }) {
                    Ok(x) => x,
                    Err(e) => return self.fail(shared, e),
                };
                self.iterations_before += self.core.progress().1;
                self.phase += 1;
                self.job = Some(Arc::new(job));
                let mut out = std::mem::take(&mut self.out);
                let started = catch(Site::Reducer { phase: phase + 1 }, J::NAME, || {
                    self.core.start_phase(plan, reducer, &mut out)
                });
                if let Err(e) = started {
                    self.out = out;
                    return self.fail(shared, e);
                }
                // Nobody is waiting for a reply here: every worker is idle in its mailbox.
                let mine = self.execute(&mut out, None);
                debug_assert!(mine.is_none());
                self.out = out;
            }
        }
    }

    /// Brings the local workers to the target: spawn or retire threads, start or stop the
    /// inline worker.
    fn reconcile(&mut self, shared: &Arc<Shared<J>>) {
        if self.ended {
            return;
        }
        let threads: Vec<WorkerId> = {
            let mut v: Vec<WorkerId> = self
                .locals
                .iter()
                .filter(|(_, l)| !l.inline && !l.retiring)
                .map(|(&w, _)| w)
                .collect();
            v.sort_unstable();
            v
        };
        let inline: Option<WorkerId> = self
            .locals
            .iter()
            .find(|(_, l)| l.inline && !l.retiring)
            .map(|(&w, _)| w);
        for &w in threads.iter().skip(self.target).rev() {
            self.retire(shared, w);
        }
        for _ in threads.len()..self.target {
            if let Err(e) = self.spawn(shared) {
                return self.fail(shared, e);
            }
        }
        match (self.target, inline) {
            (0, None) => {
                if let Some(tx) = self.waiter.clone() {
                    let w = self.join(tx, true);
                    let _ = self.feed(shared, Event::Joined { worker: w }, None);
                }
            }
            (1.., Some(w)) => self.retire(shared, w),
            _ => {}
        }
    }

    fn join(&mut self, tx: Sender<Msg<J>>, inline: bool) -> WorkerId {
        let w = self.next_id;
        self.next_id += 1;
        self.locals.insert(
            w,
            Local {
                tx,
                cell: Arc::default(),
                inline,
                retiring: false,
            },
        );
        w
    }

    fn spawn(&mut self, shared: &Arc<Shared<J>>) -> Result<()> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let w = self.join(tx, false);
        let shared2 = Arc::clone(shared);
        let spawned = std::thread::Builder::new()
            .name(format!("malleable-{}-{w}", J::NAME))
            .spawn(move || local::thread_main(shared2, rx));
        if let Err(e) = spawned {
            self.locals.remove(&w);
            return Err(Error::Spawn(e));
        }
        let _ = self.feed(shared, Event::Joined { worker: w }, None);
        Ok(())
    }

    fn retire(&mut self, shared: &Arc<Shared<J>>, w: WorkerId) {
        if let Some(l) = self.locals.get_mut(&w) {
            l.retiring = true;
            let _ = self.feed(shared, Event::Retire { worker: w }, None);
        }
    }

    /// Ends the run with an error: every worker is retired (running ones hand their chunk
    /// back at their next adjustment point and exit).
    pub(crate) fn fail(&mut self, _shared: &Arc<Shared<J>>, error: Error) {
        if !self.ended {
            self.complete(Err(error));
        }
    }

    /// Stores the result, stops every worker and wakes whoever waits.
    fn complete(&mut self, result: Result<Outcome<J>>) {
        self.result = Some(result);
        self.ended = true;
        // A snapshot that cannot complete any more (its chunks will not be captured) or has
        // not started: its requesters get an error rather than wait forever.
        self.snap.end(J::NAME);
        let mut out = std::mem::take(&mut self.out);
        self.core.halt(&mut out);
        let ids: Vec<WorkerId> = self.locals.keys().copied().collect();
        for w in ids {
            let _ = self.core.handle(Event::Retire { worker: w }, &mut out);
        }
        let mine = self.execute(&mut out, None);
        debug_assert!(mine.is_none());
        self.out = out;
        self.end_remotes();
        if let Some(tx) = &self.waiter {
            let _ = tx.send(Msg::Wake);
        }
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }

    /// Forgets a local worker that left the core without a `Release` command.
    pub(crate) fn release(&mut self, worker: WorkerId) {
        self.locals.remove(&worker);
    }

    /// The caller's new target for local threads.
    pub(crate) fn set_target(&mut self, shared: &Arc<Shared<J>>, n: usize) {
        self.target = n;
        self.settle(shared);
    }
}
