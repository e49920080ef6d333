//! One set of malleability scenarios, each run against two kinds of workers, the way one
//! integration suite runs against every backend of a store: local worker threads
//! ([`Kind::Local`]) and worker processes connected over loopback TCP ([`Kind::Processes`]).
//!
//! Each scenario is written once, as a function of a [`Harness`] (start, grow, shrink, retire
//! one, lose one, snapshot, suspend, resume), and `scenarios!` makes two tests of it,
//! `<scenario>_local` and `<scenario>_processes`. Every scenario checks the final value bit for
//! bit against a sequential computation of the same job.
//!
//! The job is the walk of `tests/common/walk.rs` (an order-sensitive f64 sum over phases, each
//! phase depending on the one before), whose steps sleep 1 ms so that workers come and go in
//! the middle of a run. Each test runs it under a job name of its own ([`Scenario`]): the
//! handoff counter of `malleable::metrics`, the only public record of a partial chunk handed
//! back by a local thread, is labelled by job name alone, and the tests of this binary run in
//! parallel in one process.
//!
//! Worker processes are this test binary, re-executed by [`ProcessLauncher`] to run
//! [`worker_process`] (an ignored test, so a normal run skips it); the handle starts and
//! retires them with `scale_remote` and `retire_remote`. A coordinator of worker processes has
//! no local worker, so that every chunk runs in a process.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use malleable::cluster::{
    self, LaunchSpec, Launched, Launcher, Registry, TOKEN_ENV, WorkerOptions,
};
use malleable::snapshot::SnapshotId;
use malleable::{
    At, BoxError, Chunk, Chunking, Error, Executor, Finished, Input, Job, JobHandle, Next, Outcome,
    Progress, Step,
};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use serde::{Deserialize, Serialize};

mod common;

use common::walk::{PACE_ENV, Pace, Total, TotalSum, Walk, WalkChunk, pace};

const CHUNK: u64 = 500;
const CHUNKING: Chunking = Chunking::Size(CHUNK);
/// Iterations of the first phase (the second has one more).
const N: u64 = 16_000;
const PHASES: u64 = 2;
/// Iterations per step: a chunk is 25 steps of about 1 ms each.
const PER_STEP: u64 = 20;
/// How long a poll waits for a condition before the test fails (a guard against hangs, far
/// above what any condition takes).
const PATIENCE: Duration = Duration::from_secs(30);
/// Set in a worker process: the coordinator's address.
const ADDR_ENV: &str = "MALLEABLE_SCENARIO_WORKER_ADDR";

// ---------------------------------------------------------------------------------------
// The scenarios, each written once.
// ---------------------------------------------------------------------------------------

/// Makes `<scenario>_local` and `<scenario>_processes` of each scenario, each with a job name
/// of its own, and the registry of every job type for the worker processes.
macro_rules! scenarios {
    ($($id:literal: $scenario:ident => $local:ident, $processes:ident;)*) => {
        $(
            #[test]
            fn $local() {
                const S: usize = 2 * $id;
                assert_eq!(
                    Scenario::<S>::NAME,
                    concat!("scenario-", stringify!($scenario), "-local")
                );
                $scenario::<S>(Kind::Local);
            }

            #[test]
            fn $processes() {
                const S: usize = 2 * $id + 1;
                assert_eq!(
                    Scenario::<S>::NAME,
                    concat!("scenario-", stringify!($scenario), "-processes")
                );
                $scenario::<S>(Kind::Processes);
            }
        )*

        /// Every job type of the suite: what a worker process serves.
        fn registry() -> Registry {
            Registry::new()
                $(
                    .register::<Scenario<{ 2 * $id }>>()
                    .register::<Scenario<{ 2 * $id + 1 }>>()
                )*
        }
    };
}

scenarios! {
    0: grow => grow_local, grow_processes;
    1: shrink => shrink_local, shrink_processes;
    2: retire => retire_local, retire_processes;
    3: lose => lose_local, lose_processes;
    4: snapshot => snapshot_local, snapshot_processes;
    5: suspend => suspend_local, suspend_processes;
    6: resume => resume_local, resume_processes;
}

/// Starts with one worker and grows to three in the middle of the first phase.
fn grow<const S: usize>(kind: Kind) {
    let job = walk();
    let mut h = Harness::<S>::start(kind, 1, &job);
    h.until_done(CHUNK);
    let p = h.grow(3);
    assert_mid_run(&p, &job, "growing to 3 workers");
    let fin = h.finished();
    assert_exact(&fin, &job);
    // Worker processes report what they did: each of the three finished chunks. (Local threads
    // report nothing per thread; there the exact value is the check.)
    if kind == Kind::Processes {
        let reports = h.reports();
        assert_eq!(reports.len(), 3, "{reports:?}");
        for r in &reports {
            assert!(r.count("done") > 0, "{reports:?}");
        }
    }
}

/// Starts with three workers and shrinks to one in the middle of the run.
fn shrink<const S: usize>(kind: Kind) {
    let job = walk();
    let mut h = Harness::<S>::start(kind, 3, &job);
    h.until_done(3 * CHUNK);
    let p = h.shrink(1);
    assert_mid_run(&p, &job, "shrinking to 1 worker");
    let fin = h.finished();
    assert_exact(&fin, &job);
}

/// Retires one worker while it holds a chunk: the partial chunk is handed back (the handoff
/// count of the retired worker says so) and another worker finishes it (the job ends, every
/// iteration counted once, with the exact value).
fn retire<const S: usize>(kind: Kind) {
    let job = walk();
    let mut h = Harness::<S>::start(kind, 3, &job);
    h.until_done(3 * CHUNK);
    let mut handed = Vec::new();
    for _ in 0..5 {
        let (n, p) = h.retire_one();
        assert_mid_run(&p, &job, "retiring a worker");
        handed.push(n);
        if n > 0 {
            break;
        }
        // Nothing partial to hand back: the chunk it held ended on the very step at which it
        // was asked to stop (a step's `Done` comes before the flag is read), or it held none
        // (near the end of a phase, with no chunk pending). Replace it and retire again.
        h.grow(3);
    }
    // A worker process's thread holds the chunk it runs and the next one
    // (`SLOTS_PER_THREAD`); the next one is handed back too, and counts as partial when it
    // came with a state (a chunk an earlier retire handed back): at most one per slot.
    let most = match kind {
        Kind::Local => 1,
        Kind::Processes => u64::from(malleable::cluster::frame::SLOTS_PER_THREAD),
    };
    assert!(
        handed.last().is_some_and(|&n| (1..=most).contains(&n)),
        "partial chunks handed back by the retired worker (per attempt: {handed:?}), 1 to {most} expected"
    );
    let fin = h.finished();
    assert_exact(&fin, &job);
}

/// Loses a worker without a word in the middle of the run. For worker processes: SIGKILL in
/// the middle of a step. Local threads cannot be lost (see [`Harness::lose_one`] for what the
/// local kind does instead).
fn lose<const S: usize>(kind: Kind) {
    let job = walk();
    let mut h = Harness::<S>::start(kind, 2, &job);
    h.until_done(3 * CHUNK);
    let p = h.lose_one();
    assert_mid_run(&p, &job, "losing a worker");
    let fin = h.finished();
    assert_exact(&fin, &job);
}

/// Takes a coordinated snapshot in the middle of the run, lets the job finish, then resumes
/// the snapshot to the end.
fn snapshot<const S: usize>(kind: Kind) {
    let job = walk();
    let mut h = Harness::<S>::start(kind, 2, &job);
    h.until_done(3 * CHUNK);
    let id = h.snapshot();
    assert_mid_run(&h.progress(), &job, "the snapshot");
    let fin = h.finished();
    assert_exact(&fin, &job);
    // The snapshot restores: resumed, with the same kind and count of workers, where it was
    // taken (not from the start), to the exact value.
    let (mut r, restored) = h.resume(kind, 2, At::Epoch(id.epoch));
    assert_mid_run(&restored, &job, "the restored snapshot");
    let fin = r.finished();
    assert_exact(&fin, &job);
}

/// Suspends in the middle of the run: the job ends with `Outcome::Suspended` and the id of
/// the snapshot the suspend committed.
fn suspend<const S: usize>(kind: Kind) {
    let job = walk();
    let mut h = Harness::<S>::start(kind, 2, &job);
    h.until_done(3 * CHUNK);
    let id = h.suspend();
    match h.outcome() {
        Outcome::Suspended(s) => assert_eq!(s, id),
        Outcome::Finished(f) => panic!("finished, not suspended: {f:?}"),
        _ => panic!("neither finished nor suspended"),
    }
    assert_mid_run(&h.progress(), &job, "the suspend");
}

/// Suspends with two workers, then resumes that snapshot with three workers of the other kind,
/// and again with one of the same kind: the value is exact both times.
fn resume<const S: usize>(kind: Kind) {
    let job = walk();
    let mut h = Harness::<S>::start(kind, 2, &job);
    h.until_done(3 * CHUNK);
    let id = h.suspend();
    assert!(matches!(h.outcome(), Outcome::Suspended(ref s) if *s == id));
    for (kind, n) in [(kind.other(), 3), (kind, 1)] {
        let (mut r, restored) = h.resume(kind, n, At::Epoch(id.epoch));
        assert_mid_run(&restored, &job, "the restored suspension");
        let fin = r.finished();
        assert_exact(&fin, &job);
    }
}

// ---------------------------------------------------------------------------------------
// The job and its checks.
// ---------------------------------------------------------------------------------------

/// A walk of two phases whose steps sleep 1 ms, in this process and in worker processes; a
/// tag of its own for [`pace`].
fn walk() -> Walk {
    static TAGS: AtomicU64 = AtomicU64::new(1);
    let tag = TAGS.fetch_add(1, Ordering::Relaxed);
    pace(tag, true);
    Walk {
        tag,
        n: N,
        per_step: PER_STEP,
        phases: PHASES,
        phase: 0,
        carry: 0.0,
        history: Vec::new(),
    }
}

/// Iterations of every phase of `job`.
fn total(job: &Walk) -> u64 {
    (0..job.phases).map(|p| job.n + p).sum()
}

/// The value, the iteration count and every phase's sum are those of the sequential loop.
fn assert_exact<const S: usize>(fin: &Finished<Scenario<S>>, job: &Walk) {
    let (want, history) = common::walk::sequential(job, CHUNK);
    assert_eq!(fin.value.sum.to_bits(), want.sum.to_bits(), "{fin:?}");
    assert_eq!(fin.value.iterations, want.iterations);
    let got: Vec<u64> = fin.job.0.history.iter().map(|x| x.to_bits()).collect();
    let want: Vec<u64> = history.iter().map(|x| x.to_bits()).collect();
    assert_eq!(got, want);
}

/// `p` was observed in the middle of the run: some iterations done, not all.
fn assert_mid_run(p: &Progress, job: &Walk, what: &str) {
    assert!(
        p.done_all_phases > 0 && p.done_all_phases < total(job),
        "{what} did not happen in the middle of the run: {p:?}"
    );
}

/// Job names, one per test: index `2 * scenario` for local threads, `+ 1` for processes.
const NAMES: [&str; 14] = [
    "scenario-grow-local",
    "scenario-grow-processes",
    "scenario-shrink-local",
    "scenario-shrink-processes",
    "scenario-retire-local",
    "scenario-retire-processes",
    "scenario-lose-local",
    "scenario-lose-processes",
    "scenario-snapshot-local",
    "scenario-snapshot-processes",
    "scenario-suspend-local",
    "scenario-suspend-processes",
    "scenario-resume-local",
    "scenario-resume-processes",
];

/// The walk under job name `NAMES[S]`; everything else is the walk's.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(transparent)]
struct Scenario<const S: usize>(Walk);

#[derive(Debug, Serialize, Deserialize)]
#[serde(transparent)]
struct ScenarioChunk<const S: usize>(WalkChunk);

/// The walk's pace.
struct ScenarioPace(Pace);

impl<const S: usize> Input<Scenario<S>> for ScenarioPace {
    fn load(job: &Scenario<S>) -> Result<ScenarioPace, BoxError> {
        <Pace as Input<Walk>>::load(&job.0).map(ScenarioPace)
    }
}

impl<const S: usize> Job for Scenario<S> {
    const NAME: &'static str = NAMES[S];
    type Chunk = ScenarioChunk<S>;
    type Reducer = TotalSum;
    type Input = ScenarioPace;

    fn iterations(&self) -> u64 {
        self.0.iterations()
    }
    fn chunk(&self, range: Range<u64>) -> ScenarioChunk<S> {
        ScenarioChunk(self.0.chunk(range))
    }
    fn reducer(&self) -> TotalSum {
        self.0.reducer()
    }
    fn end_phase(&mut self, value: &Total) -> Next {
        self.0.end_phase(value)
    }
}

impl<const S: usize> Chunk for ScenarioChunk<S> {
    type Job = Scenario<S>;
    type Output = Total;
    fn step(&mut self, job: &Scenario<S>, pace: &ScenarioPace) -> Step<Total> {
        self.0.step(&job.0, &pace.0)
    }
    fn iterations_done(&self) -> Option<u64> {
        self.0.iterations_done()
    }
}

// ---------------------------------------------------------------------------------------
// The harness: one job run on one kind of workers.
// ---------------------------------------------------------------------------------------

/// The kind of workers a scenario runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Worker threads of the coordinator's process (`set_local_workers`).
    Local,
    /// Worker processes of one thread each, on loopback TCP (`scale_remote`,
    /// `retire_remote`); the coordinator has no local worker.
    Processes,
}

impl Kind {
    fn other(self) -> Kind {
        match self {
            Kind::Local => Kind::Processes,
            Kind::Processes => Kind::Local,
        }
    }
}

/// One job run (a submitted job, or a resumed snapshot) on one kind of workers.
struct Harness<const S: usize> {
    kind: Kind,
    /// The test's folder: the snapshot store and the worker processes' output.
    folder: Arc<Folder>,
    /// The executor (for a coordinator of processes: its listener, and the peers it lost).
    exec: Executor,
    handle: JobHandle<Scenario<S>>,
    /// The worker processes this run started, in the order they joined.
    procs: Procs,
}

impl<const S: usize> Harness<S> {
    /// Submits `job` with `n` workers of `kind`, in a fresh folder.
    fn start(kind: Kind, n: usize, job: &Walk) -> Harness<S> {
        // Before any thread of this test's job exists: its counters register with the recorder.
        handoffs(Scenario::<S>::NAME);
        let folder = Arc::new(Folder::new(Scenario::<S>::NAME));
        let procs = Procs::default();
        let local = if kind == Kind::Local { n } else { 0 };
        let exec = executor(kind, &folder, &procs, local);
        let handle = exec.submit(Scenario::<S>(job.clone())).unwrap();
        let mut h = Harness {
            kind,
            folder,
            exec,
            handle,
            procs,
        };
        if kind == Kind::Processes {
            h.grow(n);
        }
        h
    }

    /// Resumes a snapshot of this run's store with `n` workers of `kind`. Returns the run and
    /// its progress before any worker computed: what the snapshot restored.
    fn resume(&self, kind: Kind, n: usize, at: At) -> (Harness<S>, Progress) {
        let procs = Procs::default();
        let exec = executor(kind, &self.folder, &procs, 0);
        let handle = exec.resume::<Scenario<S>>(&self.folder.url, at).unwrap();
        // No local worker and nobody waiting: nothing runs until workers are added.
        let restored = handle.progress();
        let mut h = Harness {
            kind,
            folder: Arc::clone(&self.folder),
            exec,
            handle,
            procs,
        };
        h.grow(n);
        (h, restored)
    }

    fn progress(&self) -> Progress {
        self.handle.progress()
    }

    /// The workers of this run's kind that `p` counts.
    fn workers(&self, p: &Progress) -> usize {
        match self.kind {
            Kind::Local => p.local_workers,
            Kind::Processes => p.remote_workers,
        }
    }

    /// Polls until the run counts `n` workers of its kind; returns the progress that did.
    fn until_workers(&self, n: usize) -> Progress {
        let mut seen = None;
        until(format!("{n} {:?} workers", self.kind), || {
            let p = self.progress();
            let done = self.workers(&p) == n;
            seen = Some(p);
            done
        });
        seen.expect("polled at least once")
    }

    /// Polls until `iterations` are done, all phases counted.
    fn until_done(&self, iterations: u64) {
        until(format!("{iterations} iterations done"), || {
            self.progress().done_all_phases >= iterations
        });
    }

    /// Grows to `n` workers; returns the progress once they are all there.
    fn grow(&mut self, n: usize) -> Progress {
        match self.kind {
            Kind::Local => {
                self.handle.set_local_workers(n);
                self.until_workers(n)
            }
            Kind::Processes => {
                // One process at a time, so that the join order is the launch order:
                // `retire_remote` retires the most recently joined.
                let mut p = self.progress();
                for k in self.workers(&p) + 1..=n {
                    self.handle.scale_remote(k).unwrap();
                    p = self.until_workers(k);
                }
                p
            }
        }
    }

    /// Shrinks to `n` workers; returns the progress once the others have left.
    fn shrink(&mut self, n: usize) -> Progress {
        match self.kind {
            // Retiring threads count until they have handed their chunk back and exited.
            Kind::Local => {
                self.handle.set_local_workers(n);
                self.until_workers(n)
            }
            Kind::Processes => {
                let leaving = self.serving().split_off(n);
                self.set_fate(&leaving, Fate::Retired);
                self.handle.scale_remote(n).unwrap();
                for &i in &leaving {
                    let r = self.until_exited(i);
                    r.assert_clean();
                    assert!(r.line.contains("left=false"), "retired, not left: {r:?}");
                }
                self.until_workers(n)
            }
        }
    }

    /// Retires the most recent worker; returns the partial chunks it handed back (from the
    /// `malleable_handoffs_total` metric: of this test's job in this process for a thread, of
    /// the worker process for a process) and the progress once it has gone.
    fn retire_one(&mut self) -> (u64, Progress) {
        match self.kind {
            Kind::Local => {
                let before = handoffs(Scenario::<S>::NAME);
                let n = self.handle.local_workers();
                // Retires the most recent thread; it counts until it has handed back and exited.
                self.handle.set_local_workers(n - 1);
                let p = self.until_workers(n - 1);
                (handoffs(Scenario::<S>::NAME) - before, p)
            }
            Kind::Processes => {
                let last = *self.serving().last().expect("a serving worker process");
                self.set_fate(&[last], Fate::Retired);
                self.handle.retire_remote(1);
                let r = self.until_exited(last);
                r.assert_clean();
                assert!(r.line.contains("left=false"), "retired, not left: {r:?}");
                (r.count("handoffs"), self.progress())
            }
        }
    }

    /// Loses a worker without a word; returns the progress once the run goes on without it.
    ///
    /// Worker processes: the most recent one gets SIGKILL. Its one thread sleeps 1 ms in each
    /// step, so the signal lands in the middle of a step; the coordinator sees the connection
    /// close and puts the process's chunks back with the last states it holds.
    ///
    /// Local threads: a thread cannot be killed, and the public API has no way to lose one:
    /// the only local path by which a worker leaves without handing its chunk back is a panic
    /// in user code (or an input that fails to load), and that ends the job with an error
    /// (`Error::Panicked`, `Error::Input`) by design. What a loss means for the value, work done and then
    /// gone without a hand-back, recomputed from the last state held, is here exercised
    /// at the granularity a local run has: the whole run after a committed snapshot. The run
    /// goes on past the snapshot, is cancelled (its chunks' states are dropped, never
    /// written), and the snapshot is resumed with one thread fewer; the work done since the
    /// snapshot is lost and done again. This is the restore path, not the ledger's `Lost`
    /// event, which only a remote worker's loss reaches.
    fn lose_one(&mut self) -> Progress {
        match self.kind {
            Kind::Local => {
                let n = self.handle.local_workers();
                let id = self.snapshot();
                let after_snapshot = self.progress().done_all_phases;
                self.until_done(after_snapshot + 2 * CHUNK);
                let before_loss = self.progress();
                self.handle.cancel();
                match self.handle.clone().wait() {
                    Err(Error::Cancelled { .. }) => {}
                    other => panic!("not cancelled: {:?}", other.map(|_| ())),
                }
                let (resumed, restored) = self.resume(Kind::Local, n - 1, At::Epoch(id.epoch));
                assert!(
                    restored.done_all_phases < before_loss.done_all_phases,
                    "the work since the snapshot was lost: {restored:?} / {before_loss:?}"
                );
                *self = resumed;
                self.progress()
            }
            Kind::Processes => {
                let serving = self.serving();
                let victim = *serving.last().expect("a serving worker process");
                self.set_fate(&[victim], Fate::Killed);
                let child = Arc::clone(&self.procs.lock().unwrap()[victim].child);
                child.lock().unwrap().kill().unwrap();
                let p = self.until_workers(serving.len() - 1);
                let r = self.until_exited(victim);
                assert_eq!(r.status.signal(), Some(9), "killed by SIGKILL: {r:?}");
                let errors = self.exec.peer_errors();
                assert!(
                    errors.iter().any(|e| matches!(
                        **e,
                        cluster::Error::Closed { .. } | cluster::Error::Io { .. }
                    )),
                    "the coordinator saw the connection go: {errors:?}"
                );
                p
            }
        }
    }

    /// Takes a coordinated snapshot; returns its id once committed.
    fn snapshot(&self) -> SnapshotId {
        self.handle.snapshot().wait().unwrap()
    }

    /// Suspends; returns the id of the committed snapshot.
    fn suspend(&self) -> SnapshotId {
        self.handle.suspend().wait().unwrap()
    }

    /// Waits for the end of the run; checks that every worker process still serving exited
    /// cleanly.
    fn outcome(&mut self) -> Outcome<Scenario<S>> {
        // A thread blocked in `wait` becomes the inline worker of a job with no local worker,
        // which a coordinator of processes is: wait only once the job has ended. (The same
        // poll guards local runs against hangs.)
        until("the end of the run", || self.handle.is_finished());
        let outcome = self.handle.clone().wait().unwrap();
        for i in self.serving() {
            self.until_exited(i).assert_clean();
        }
        outcome
    }

    /// The run's outcome, which must be a finished job.
    fn finished(&mut self) -> Finished<Scenario<S>> {
        match self.outcome() {
            Outcome::Finished(f) => f,
            Outcome::Suspended(id) => panic!("suspended to {id}, not finished"),
            _ => panic!("neither finished nor suspended"),
        }
    }

    /// The reports of the worker processes that have exited, in join order.
    fn reports(&self) -> Vec<Report> {
        self.procs
            .lock()
            .unwrap()
            .iter()
            .filter_map(|p| p.ended.clone())
            .collect()
    }

    /// Worker processes neither retired nor killed nor exited, in join order.
    fn serving(&self) -> Vec<usize> {
        let procs = self.procs.lock().unwrap();
        (0..procs.len())
            .filter(|&i| procs[i].fate == Fate::Serving && procs[i].ended.is_none())
            .collect()
    }

    fn set_fate(&self, which: &[usize], fate: Fate) {
        let mut procs = self.procs.lock().unwrap();
        for &i in which {
            procs[i].fate = fate;
        }
    }

    /// Polls until worker process `i` has exited; returns its report.
    fn until_exited(&self, i: usize) -> Report {
        let child = Arc::clone(&self.procs.lock().unwrap()[i].child);
        let mut status = None;
        until(format!("worker process {i} to exit"), || {
            status = child.lock().unwrap().try_wait().unwrap();
            status.is_some()
        });
        let out = self.procs.lock().unwrap()[i].out.clone();
        let text = std::fs::read_to_string(&out).unwrap_or_default();
        let line = text
            .lines()
            .find_map(|l| {
                let at = l.find("SERVED").or_else(|| l.find("WORKER ERROR"))?;
                Some(l[at..].to_owned())
            })
            .unwrap_or_default();
        let report = Report {
            status: status.expect("exited"),
            line,
        };
        self.procs.lock().unwrap()[i].ended = Some(report.clone());
        report
    }
}

impl<const S: usize> Drop for Harness<S> {
    /// Kills the worker processes of a run that a failed assertion left behind.
    fn drop(&mut self) {
        let procs = self.procs.lock().unwrap_or_else(|p| p.into_inner());
        for p in procs.iter().filter(|p| p.ended.is_none()) {
            let mut child = p.child.lock().unwrap_or_else(|p| p.into_inner());
            if matches!(child.try_wait(), Ok(None)) {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// An executor for `kind`, with `local` threads and snapshots in `folder`.
fn executor(kind: Kind, folder: &Folder, procs: &Procs, local: usize) -> Executor {
    let builder = Executor::builder()
        .local_workers(local)
        .chunking(CHUNKING)
        .snapshots(&folder.url);
    match kind {
        Kind::Local => builder,
        Kind::Processes => builder
            .listen("127.0.0.1:0")
            .heartbeat(Duration::from_millis(100), Duration::from_secs(2))
            .launcher(ProcessLauncher {
                dir: folder.dir.clone(),
                procs: Arc::clone(procs),
            }),
    }
    .build()
    .unwrap()
}

/// Polls `cond` every 5 ms; fails the test after [`PATIENCE`].
fn until(what: impl std::fmt::Display, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < PATIENCE, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A fresh folder per test under the target's temporary folder: the snapshot store (a
/// `file://` URL, which worker processes reach too) and the worker processes' output. Kept
/// when the test fails.
#[derive(Debug)]
struct Folder {
    dir: PathBuf,
    url: String,
}

impl Folder {
    fn new(name: &str) -> Folder {
        let dir =
            Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("store")).unwrap();
        Folder {
            url: format!("file://{}", dir.join("store").display()),
            dir,
        }
    }
}

impl Drop for Folder {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Handoffs of local threads, from the metrics.
// ---------------------------------------------------------------------------------------

/// Partial chunks handed back by the threads of job `job` in this process so far
/// (`malleable_handoffs_total`). The recorder is installed by the first call; reading it resets
/// its counters, so every count read is kept here, by job name.
fn handoffs(job: &str) -> u64 {
    static RECORDER: OnceLock<Mutex<(Snapshotter, HashMap<String, u64>)>> = OnceLock::new();
    let recorder = RECORDER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("no other recorder in this test binary");
        Mutex::new((snapshotter, HashMap::new()))
    });
    let mut guard = recorder.lock().unwrap();
    let (snapshotter, totals) = &mut *guard;
    for (name, n) in handoff_counts(snapshotter) {
        *totals.entry(name).or_default() += n;
    }
    totals.get(job).copied().unwrap_or(0)
}

/// The handoff counters a recorder holds, by job name (read and reset).
fn handoff_counts(snapshotter: &Snapshotter) -> Vec<(String, u64)> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| {
            let key = key.key();
            let DebugValue::Counter(n) = value else {
                return None;
            };
            if key.name() != malleable::metrics::HANDOFFS {
                return None;
            }
            let job = key.labels().find(|l| l.key() == "job")?.value().to_owned();
            Some((job, n))
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// Worker processes.
// ---------------------------------------------------------------------------------------

/// The entry point of worker processes: serves the suite's jobs on one thread and prints
/// what it did, with the partial chunks it handed back (`handoffs`, from its own metrics: a
/// chunk that waited in its queue and went back untouched is counted in `yielded` only).
#[test]
#[ignore = "the body of the worker processes the scenarios start"]
fn worker_process() {
    let Ok(addr) = std::env::var(ADDR_ENV) else {
        return;
    };
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().unwrap();
    let options = WorkerOptions::from_env().unwrap().threads(1);
    match cluster::serve(&addr, &registry(), options) {
        Ok(served) => {
            let handoffs: u64 = handoff_counts(&snapshotter).iter().map(|(_, n)| n).sum();
            println!(
                "SERVED job={} done={} yielded={} left={} parts={} handoffs={handoffs}",
                served.job,
                served.chunks_done,
                served.chunks_yielded,
                served.left,
                served.parts_written
            );
            std::process::exit(0);
        }
        Err(e) => {
            println!("WORKER ERROR {e}");
            std::process::exit(3);
        }
    }
}

/// The worker processes of a run, in launch order (which is join order: see
/// [`Harness::grow`]).
type Procs = Arc<Mutex<Vec<Proc>>>;

#[derive(Debug)]
struct Proc {
    /// Shared with the [`Launched`] the executor holds.
    child: Arc<Mutex<Child>>,
    /// Its standard output.
    out: PathBuf,
    fate: Fate,
    ended: Option<Report>,
}

/// What the harness did to a worker process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Serving,
    Retired,
    Killed,
}

/// How a worker process ended: its exit status and its report line.
#[derive(Debug, Clone)]
struct Report {
    status: ExitStatus,
    line: String,
}

impl Report {
    /// A count in the report (`done`, `yielded`, `handoffs`, ...).
    fn count(&self, what: &str) -> u64 {
        self.line
            .split_whitespace()
            .find_map(|w| w.strip_prefix(what)?.strip_prefix('='))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no {what} in {self:?}"))
    }

    fn assert_clean(&self) {
        assert!(
            self.status.success() && self.line.starts_with("SERVED"),
            "{self:?}"
        );
    }
}

/// Starts this test binary as a worker process of one thread, its steps paced, its output in
/// a file of the test's folder; keeps it in the run's [`Procs`].
///
/// A launcher of the suite's own rather than `LocalLauncher`, because the test needs each
/// process's `Child`: to SIGKILL one, and to collect its exit status and output.
#[derive(Debug)]
struct ProcessLauncher {
    dir: PathBuf,
    procs: Procs,
}

impl Launcher for ProcessLauncher {
    fn launch(&self, spec: &LaunchSpec) -> io::Result<Box<dyn Launched>> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let out = self.dir.join(format!(
            "worker-{}.out",
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.args(["--exact", "worker_process", "--ignored", "--nocapture"])
            .args(["--test-threads", "1"])
            .env(ADDR_ENV, spec.addr.to_string())
            .env(PACE_ENV, "1")
            .stdin(Stdio::null())
            .stdout(File::create(&out)?);
        // `Token` has no public accessor for its secret, so a launcher of one's own cannot
        // pass `spec.token` on. The coordinator's token can only come from this process's
        // environment here (no `cluster_token` is set), which the child inherits.
        if spec.token.is_none() {
            cmd.env_remove(TOKEN_ENV);
        }
        let child = Arc::new(Mutex::new(cmd.spawn()?));
        self.procs.lock().unwrap().push(Proc {
            child: Arc::clone(&child),
            out,
            fate: Fate::Serving,
            ended: None,
        });
        Ok(Box::new(Started(child)))
    }
}

/// A worker process as the executor holds it.
#[derive(Debug)]
struct Started(Arc<Mutex<Child>>);

impl Launched for Started {
    fn describe(&self) -> String {
        format!("scenario worker process {}", self.0.lock().unwrap().id())
    }

    fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        self.0.lock().unwrap().try_wait()
    }

    fn kill(&mut self) -> io::Result<()> {
        let mut child = self.0.lock().unwrap();
        match child.kill() {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::InvalidInput => {}
            Err(e) => return Err(e),
        }
        child.wait().map(drop)
    }
}
