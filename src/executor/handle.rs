//! The handle of a running job, and what a job ends with.

use std::fmt;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use super::job_run::State;
use super::progress::Progress;
use super::updates::ProgressUpdates;
use super::{Shared, threads};
use crate::error::{Error, Result};
use crate::job::{Job, Value};
use crate::snapshot::SnapshotId;
use tokio::sync::oneshot;

/// How a job ended.
#[non_exhaustive]
pub enum Outcome<J: Job> {
    /// Every phase ran; the job and its value.
    Finished(Finished<J>),
    /// The job was suspended to this committed snapshot; resume it with
    /// [`Executor::resume`](crate::Executor::resume).
    Suspended(SnapshotId),
}

impl<J: Job> Outcome<J> {
    /// The finished job, if it finished.
    pub fn finished(self) -> Option<Finished<J>> {
        match self {
            Outcome::Finished(f) => Some(f),
            Outcome::Suspended(_) => None,
        }
    }
}

impl<J: Job> fmt::Debug for Outcome<J>
where
    Value<J>: fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Finished(x) => f.debug_tuple("Finished").field(x).finish(),
            Outcome::Suspended(id) => f.debug_tuple("Suspended").field(id).finish(),
        }
    }
}

/// A finished job: the job as its last `end_phase` left it, and the last phase's value; for
/// a job with owned partitions that asks for them
/// ([`Partition::gather_at_end`](crate::Partition::gather_at_end),
/// [`Rows::gather_at_end`](crate::Rows::gather_at_end)), its final partitions too.
///
/// A pattern that takes it apart names its fields with `..`
/// (`let Finished { job, value, .. } = done;`).
pub struct Finished<J: Job> {
    /// The job after its last phase.
    pub job: J,
    /// The value of the last phase.
    pub value: Value<J>,
    /// The final partitions in chunk order, when gathered.
    pub(crate) partitions: Option<Vec<J::Chunk>>,
}

impl<J: Job> Finished<J> {
    /// A finished job with no gathered partitions.
    pub(crate) fn new(job: J, value: Value<J>) -> Finished<J> {
        Finished {
            job,
            value,
            partitions: None,
        }
    }

    /// The value of the last phase.
    pub fn into_value(self) -> Value<J> {
        self.value
    }

    /// The job's final partitions (its chunks as the last phase left them) in chunk order,
    /// brought here from the workers that held them, when the job asked for them
    /// ([`Partition::gather_at_end`](crate::Partition::gather_at_end)); `None` otherwise.
    /// They are the same bits for any worker count and any scaling history.
    pub fn partitions(&self) -> Option<&[J::Chunk]> {
        self.partitions.as_deref()
    }

    /// The final partitions, taken out (see [`partitions`](Self::partitions)).
    pub fn into_partitions(self) -> Option<Vec<J::Chunk>> {
        self.partitions
    }
}

impl<J: Job> fmt::Debug for Finished<J>
where
    Value<J>: fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Finished")
            .field("job", &J::NAME)
            .field("value", &self.value)
            .finish()
    }
}

/// A running job: scale it, watch it, cancel it, wait for it or await it.
///
/// Clones control the same job, so one thread can wait (and compute, in inline mode) while
/// another scales it. The outcome is delivered once: to the first `wait` or `.await` that
/// sees it; later ones get [`Error::OutcomeTaken`]. Dropping every handle leaves the job
/// running to its end in the background.
pub struct JobHandle<J: Job> {
    pub(super) shared: Arc<Shared<J>>,
    /// What the polls of the handles of this job saw (shared by the clones).
    polls: Arc<Polls>,
}

impl<J: Job> Clone for JobHandle<J> {
    fn clone(&self) -> Self {
        JobHandle {
            shared: Arc::clone(&self.shared),
            polls: Arc::clone(&self.polls),
        }
    }
}

/// How long polls ([`JobHandle::is_finished`], [`JobHandle::progress`]) must see a job that
/// no worker can run (no local worker, nobody in `wait`, no worker process, no listener for
/// one) before a helper thread takes the inline role: long enough that a program which looks
/// at its job once and then waits for it computes on its own waiting thread, short enough
/// that a program polling in a loop does not notice.
const UNATTENDED_GRACE: Duration = Duration::from_secs(1);

/// How long polls must see a job of an executor that listens for worker processes with no
/// local worker, no worker process connected and nobody in `wait` before a warning says that
/// it waits (worker processes may take a while to start and connect).
const UNATTENDED_LISTENING_WARNING: Duration = Duration::from_secs(5);

/// What polls saw of a job that no worker runs ([`JobHandle::attend`]).
#[derive(Debug, Default)]
struct Polls {
    /// The first of the polls in a row that saw it so (`None` once one saw a worker).
    since: Mutex<Option<Instant>>,
    /// Whether a poll already warned that the job waits for worker processes.
    warned: std::sync::atomic::AtomicBool,
}

/// Whether no worker can run the job: no local worker (target 0) and nobody in `wait` or
/// awaiting it to run it inline, no worker process connected, and it has not ended.
fn unattended<J: Job>(st: &State<J>) -> bool {
    !st.ended && st.members.target == 0 && !st.members.waiting && st.remote_count() == 0
}

/// Gives the inline role (the job's worker while it has zero local workers) to a new helper
/// thread, which runs the job's chunks until the job ends. `st` is the job's state, locked.
fn start_inline_helper<J: Job>(
    shared: &Arc<Shared<J>>,
    mut st: super::job_run::Guard<'_, J>,
) -> std::io::Result<()> {
    let (tx, rx) = crossbeam_channel::unbounded::<super::members::Mail<J>>();
    let (state, links) = st.links();
    links.set_waiter(state, Some(tx));
    st.settle();
    drop(st);
    let shared2 = Arc::clone(shared);
    let spawned = std::thread::Builder::new()
        .name(format!("malleable-{}-inline", J::NAME))
        .spawn(move || {
            threads::serve_inline(&shared2, &rx);
            // It returns when the job has ended, or earlier if a `wait` took the role over
            // (its mailbox replaced this one, and this one's inline worker was released):
            // then the mailbox is the waiting thread's, and stays.
            let mut st = shared2.lock();
            if st.ended {
                let (state, links) = st.links();
                links.set_waiter(state, None);
            }
        });
    if let Err(e) = spawned {
        let mut st = shared.lock();
        let (state, links) = st.links();
        links.set_waiter(state, None);
        return Err(e);
    }
    Ok(())
}

impl<J: Job> fmt::Debug for JobHandle<J> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobHandle")
            .field("job", &J::NAME)
            .finish_non_exhaustive()
    }
}

impl<J: Job> JobHandle<J> {
    pub(super) fn new(shared: Arc<Shared<J>>) -> Self {
        JobHandle {
            shared,
            polls: Arc::default(),
        }
    }

    /// Called by the polls ([`JobHandle::is_finished`], [`JobHandle::progress`]): a job that
    /// no worker can run and that polls have seen so for [`UNATTENDED_GRACE`] gets a helper
    /// thread in the inline role, as `.await` gives it one, with a warning (the program
    /// polls and never waits, so nothing else would ever run it). An executor that listens
    /// for worker processes gets no helper (the job waits for them, or for `wait`), but a
    /// warning after [`UNATTENDED_LISTENING_WARNING`].
    fn attend(&self) {
        let st = self.shared.lock();
        let mut since = self.polls.since.lock().unwrap_or_else(|p| p.into_inner());
        if !unattended(&st) {
            *since = None;
            return;
        }
        let now = Instant::now();
        let waited = now - *since.get_or_insert(now);
        if self.shared.listener.is_some() {
            if waited >= UNATTENDED_LISTENING_WARNING
                && !self
                    .polls
                    .warned
                    .swap(true, std::sync::atomic::Ordering::Relaxed)
            {
                tracing::warn!(
                    job = J::NAME,
                    seconds = waited.as_secs(),
                    "the job has no worker: zero local workers, no worker process connected, \
                     and no thread in wait(); it makes no progress until worker processes \
                     connect, local workers are added (set_local_workers) or a thread calls \
                     wait(), which runs it inline"
                );
            }
            return;
        }
        if waited < UNATTENDED_GRACE {
            return;
        }
        *since = None;
        drop(since);
        tracing::warn!(
            job = J::NAME,
            "the job has zero local workers and no thread in wait() to run it inline, and it \
             is polled: a helper thread now runs it inline until it ends (give it local \
             workers, or call wait() instead of polling, to choose the thread that computes)"
        );
        if let Err(e) = start_inline_helper(&self.shared, st) {
            self.shared.lock().fail(Error::Spawn(e));
        }
    }

    /// Grows or shrinks the job's local worker threads. New threads start at once; a
    /// retired worker hands its chunk over with its live state at its next adjustment point
    /// and exits. Zero runs the job inline on the thread blocked in [`JobHandle::wait`].
    pub fn set_local_workers(&self, n: usize) {
        self.shared.lock().set_target(n);
    }

    /// The requested number of local worker threads.
    pub fn local_workers(&self) -> usize {
        self.shared.lock().members.target
    }

    /// A progress report. Takes the job's lock briefly; fine to call every few milliseconds.
    ///
    /// A poll, like [`JobHandle::is_finished`]: on a job that no worker runs, it may start a
    /// helper thread (see there).
    pub fn progress(&self) -> Progress {
        self.attend();
        self.shared.lock().progress()
    }

    /// Progress as it is published (at most every 100 ms while the job runs, at every phase
    /// end, and once when it ends), to wait for instead of polling: a blocking iterator, or
    /// [`ProgressUpdates::changed`] in async code.
    pub fn progress_updates(&self) -> ProgressUpdates {
        ProgressUpdates::new(self.shared.lock().links().1.subscribe_progress())
    }

    /// The rollbacks the job went through (owned partitions lost with a worker process, the
    /// job back at its latest committed snapshot), oldest first: what was lost, where it went
    /// back to, and how long each step took.
    pub fn rollbacks(&self) -> Vec<super::Rollback> {
        self.shared.lock().rollbacks.clone()
    }

    /// Events that came from a worker the job no longer had (a thread or a worker process's
    /// slot already lost, retired, or left behind by a rollback) and were dropped: news that
    /// arrived late, not a fault. Each is also logged at debug level and counted in
    /// [`STALE_EVENTS`](crate::metrics::STALE_EVENTS).
    pub fn stale_events(&self) -> u64 {
        self.shared.lock().stale_events
    }

    /// What the job's autoscaler ([`Builder::autoscale`](crate::Builder::autoscale)) has
    /// decided and measured so far: its decisions (each also logged and counted in
    /// [`AUTOSCALE_DECISIONS`](crate::metrics::AUTOSCALE_DECISIONS)), the last one with its
    /// reason, the costs it learned, and, when its last measurement decided nothing, why
    /// ([`AutoscaleStatus::waiting`](super::AutoscaleStatus::waiting): cooling down,
    /// "measuring: 3 of 10 samples", on target, at the maximum, …). `None` without a policy,
    /// or before its first measurement (one period after the start).
    pub fn autoscale(&self) -> Option<super::AutoscaleStatus> {
        self.shared.lock().autoscale
    }

    /// Snapshots of this job that failed so far (asked for, periodic or a suspend's),
    /// whatever the cause. Each is also logged and counted
    /// ([`SNAPSHOT_FAILURES`](crate::metrics::SNAPSHOT_FAILURES)).
    pub fn snapshot_failures(&self) -> u64 {
        self.shared.lock().snap.failures.total
    }

    /// Why the last failed snapshot failed (its error, with its sources), if one did.
    pub fn last_snapshot_error(&self) -> Option<crate::Cause> {
        self.shared.lock().snap.failures.last.clone()
    }

    /// For a job started by [`Executor::resume`](crate::Executor::resume): the snapshot it
    /// was resumed from, and the damaged newer ones [`At::Latest`](crate::At::Latest) passed
    /// over, with why.
    pub fn resumed(&self) -> Option<super::Resumed> {
        self.shared.lock().snap.resumed.clone()
    }

    /// Worker processes connected to the job, retiring ones excluded.
    pub fn remote_workers(&self) -> usize {
        self.shared.lock().remote_count()
    }

    /// The roster: every worker process connected to the job (retiring ones included), in
    /// the order they joined, with the node each runs on, its threads and the chunks on its
    /// slots now.
    pub fn remote_processes(&self) -> Vec<super::RemoteProcess> {
        self.shared.lock().roster()
    }

    /// What crossed between the coordinator and the job's worker processes so far: messages
    /// each way, and the bytes of the halos relayed among them.
    pub fn traffic(&self) -> super::Traffic {
        let st = self.shared.lock();
        super::Traffic {
            partitions_moved: st.core.partitions_moved(),
            ..st.remote.traffic
        }
    }

    /// The local recoveries the job went through so far: partitions lost with a worker
    /// process and replayed from their buddy copies while the others went on
    /// ([`Builder::buddy_copies`](crate::Builder::buddy_copies)). A loss that could not be
    /// recovered so rolled the job back instead ([`JobHandle::rollbacks`]).
    pub fn recoveries(&self) -> Vec<super::Recovered> {
        self.shared.lock().recoveries.clone()
    }

    /// The buddy copies of the job's owned partitions
    /// ([`Builder::buddy_copies`](crate::Builder::buddy_copies)): how many partitions have
    /// one now, their bytes, the most one process keeps, and the rounds so far.
    pub fn copies(&self) -> super::Copies {
        self.shared.lock().remote.buddies.report()
    }

    /// Gracefully retires the `n` most recently joined worker processes: their threads hand
    /// their chunks back at their next adjustment point, then the processes are told to end.
    pub fn retire_remote(&self, n: usize) {
        self.shared.lock().retire_remote(n);
    }

    /// Brings the job to `n` worker processes: starts the missing ones with the executor's
    /// [`Launcher`](crate::cluster::Launcher) (they join when they have connected), or retires
    /// the most recent ones gracefully. Processes started earlier that have not connected yet
    /// count as present.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] without [`Builder::listen`](crate::Builder::listen) and
    /// [`Builder::launcher`](crate::Builder::launcher); [`Error::Spawn`] if a process could
    /// not be started (those started before it stay).
    pub fn scale_remote(&self, n: usize) -> Result<()> {
        super::connection::scale_remote(&self.shared, n)
    }

    /// Cancels the job: workers stop at their next adjustment point, and waiting returns
    /// [`Error::Cancelled`]. No effect on a job that has already ended. The run's job id
    /// lease ([`Builder::job_lease`](crate::Builder::job_lease)) is released once it has
    /// ended, in the background: [`wait`](Self::wait) for it before starting another run
    /// of the same job id.
    pub fn cancel(&self) {
        let mut st = self.shared.lock();
        st.fail(Error::Cancelled { job: J::NAME });
    }

    /// Takes a coordinated snapshot: each running chunk is serialized at its next adjustment
    /// point while the job goes on; the returned request resolves to the committed id
    /// (`.await` it, or [`SnapshotRequest::wait`]).
    pub fn snapshot(&self) -> SnapshotRequest {
        let rx = self.shared.lock().ask_snapshot(false);
        SnapshotRequest { rx, job: J::NAME }
    }

    /// Suspends the job: running chunks are handed back at their next adjustment point, a
    /// snapshot is committed, and the job ends with [`Outcome::Suspended`]. The returned
    /// request resolves to the snapshot's id. If the snapshot fails, the job goes on.
    pub fn suspend(&self) -> SnapshotRequest {
        let rx = self.shared.lock().ask_snapshot(true);
        SnapshotRequest { rx, job: J::NAME }
    }

    /// Whether the job has ended (finished, failed or cancelled).
    ///
    /// # A job with zero local workers
    ///
    /// With zero local workers ([`Builder::local_workers`](crate::Builder::local_workers)`(0)`
    /// or [`JobHandle::set_local_workers`]`(0)`) the job runs inline on the thread in
    /// [`JobHandle::wait`] (or on a helper thread while it is awaited), and on worker
    /// processes. A program that polls this (or [`JobHandle::progress`]) in a loop and waits
    /// only once it is finished would never see it finish: so once polls have seen such a job
    /// without any worker (nobody in `wait`, no worker process) for a second, a helper
    /// thread takes the inline role and runs it to its end, and a warning is logged. A
    /// program that looks at its job and then waits for it within that second computes on
    /// its waiting thread as before. On an executor that listens for worker processes
    /// ([`Builder::listen`](crate::Builder::listen)) no helper is started: the job waits for
    /// them (or for `wait`), and polls log a warning once after five seconds of that.
    pub fn is_finished(&self) -> bool {
        self.attend();
        self.shared.lock().outcome_ready()
    }

    /// Blocks until the job ends. With zero local workers, the calling thread runs the job.
    /// Wait from one thread at a time. A snapshot being written when the job ended commits
    /// (or fails) before this returns: the snapshots in the store are final then. Before it returns, the job's worker processes have
    /// been sent their `End` (up to [`Builder::shutdown_timeout`](crate::Builder::shutdown_timeout)),
    /// so a program may exit right after without cutting them off.
    ///
    /// # Errors
    ///
    /// [`Error::Panicked`] if user code panicked, [`Error::Cancelled`], [`Error::Input`],
    /// [`Error::Spawn`].
    pub fn wait(self) -> Result<Outcome<J>> {
        let (tx, rx) = crossbeam_channel::unbounded();
        {
            let mut st = self.shared.lock();
            let (state, links) = st.links();
            links.set_waiter(state, Some(tx));
            st.settle();
        }
        threads::serve_inline(&self.shared, &rx);
        let result = {
            let mut st = self.shared.lock();
            let (state, links) = st.links();
            links.set_waiter(state, None);
            st.result
                .take()
                .unwrap_or(Err(Error::OutcomeTaken { job: J::NAME }))
        };
        // The job's worker processes were sent `End`: it reaches them before this returns,
        // so a program that exits right after does not cut them off.
        let timeout = self.shared.config.shutdown_timeout;
        let key = super::shutdown::job_key(&self.shared);
        let left = self.shared.io.drain(Some(key), timeout);
        super::shutdown::report(&format!("the end of job {}", J::NAME), left, timeout);
        if let Ok(Outcome::Finished(_)) = &result {
            if self.shared.config.remove_when_finished {
                super::lifecycle::remove_finished(&self.shared, timeout);
            }
        }
        // The job id is free for another run once this returns.
        super::lease::release(&self.shared);
        result
    }
}

impl<J: Job> IntoFuture for JobHandle<J> {
    type Output = Result<Outcome<J>>;
    type IntoFuture = JobFuture<J>;

    /// Awaiting never blocks the runtime's threads; with zero local workers the job runs
    /// inline on one helper thread. Unlike [`JobHandle::wait`], it does not wait for the
    /// job's worker processes to be sent their `End`: before a program returns, call
    /// [`Executor::shutdown`](crate::Executor::shutdown) (in `spawn_blocking`), which does.
    fn into_future(self) -> JobFuture<J> {
        JobFuture {
            shared: self.shared,
            helper: false,
            releasing: None,
        }
    }
}

/// A snapshot in progress, from [`JobHandle::snapshot`] or [`JobHandle::suspend`]: await it,
/// or block with [`SnapshotRequest::wait`].
#[derive(Debug)]
pub struct SnapshotRequest {
    rx: oneshot::Receiver<Result<SnapshotId>>,
    job: &'static str,
}

impl SnapshotRequest {
    /// Blocks until the snapshot is committed or failed. Do not call it from an async
    /// context; `.await` the request there.
    ///
    /// # Errors
    ///
    /// [`Error::SnapshotFailed`] (the job goes on), [`Error::Ended`].
    pub fn wait(self) -> Result<SnapshotId> {
        let job = self.job;
        self.rx.blocking_recv().unwrap_or(Err(Error::Ended { job }))
    }
}

impl Future for SnapshotRequest {
    type Output = Result<SnapshotId>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let job = self.job;
        Pin::new(&mut self.rx)
            .poll(cx)
            .map(|r| r.unwrap_or(Err(Error::Ended { job })))
    }
}

/// The future of a job's outcome; see [`JobHandle`]'s `IntoFuture`.
pub struct JobFuture<J: Job> {
    shared: Arc<Shared<J>>,
    helper: bool,
    /// The release of the job id's lease, once the outcome is ready (`lease.rs`).
    releasing: Option<tokio::task::JoinHandle<()>>,
}

impl<J: Job> fmt::Debug for JobFuture<J> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobFuture")
            .field("job", &J::NAME)
            .finish_non_exhaustive()
    }
}

impl<J: Job> Future for JobFuture<J> {
    type Output = Result<Outcome<J>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // The job id's lease is released before the outcome is handed out.
        if let Some(releasing) = self.releasing.as_mut() {
            if Pin::new(releasing).poll(cx).is_pending() {
                return Poll::Pending;
            }
        } else if let Some(lease) = self.shared.config.run_lease.clone() {
            if lease.gone().is_none() && self.shared.lock().outcome_ready() {
                let mut releasing = self
                    .shared
                    .io
                    .handle()
                    .spawn(async move { lease.release().await });
                let pending = Pin::new(&mut releasing).poll(cx).is_pending();
                self.releasing = Some(releasing);
                if pending {
                    return Poll::Pending;
                }
            }
        }
        let mut st = self.shared.lock();
        if st.outcome_ready() {
            return Poll::Ready(
                st.result
                    .take()
                    .unwrap_or(Err(Error::OutcomeTaken { job: J::NAME })),
            );
        }
        st.links().1.set_waker(cx.waker().clone());
        if !self.helper && !st.members.waiting {
            // The inline role, should the target be or become zero, goes to a helper thread.
            if let Err(e) = start_inline_helper(&self.shared, st) {
                let mut st = self.shared.lock();
                st.fail(Error::Spawn(e));
                return Poll::Ready(
                    st.result
                        .take()
                        .unwrap_or(Err(Error::Cancelled { job: J::NAME })),
                );
            }
            self.helper = true;
        }
        Poll::Pending
    }
}
