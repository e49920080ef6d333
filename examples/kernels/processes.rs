//! The processes mode of the examples whose partitions exchange pieces (`heat3d`, `cg`, `ft`,
//! each with `--processes`): the same job, run by worker processes of the same program that
//! come and go while it runs, its result checked bit for bit as in the threads mode.
//!
//! # The scenario
//!
//! The coordinator keeps no local worker (`local_workers(0)`), and listens on loopback. With
//! no local worker every partition lives in a worker process between phases, so every piece
//! a partition sends crosses between processes (directly, or through the coordinator) and
//! the traffic printed at the end is the whole job's; nothing runs before a process has
//! joined; and the process that is killed always holds partitions that only it had, so the
//! kill always rolls the job back. (With one local worker the coordinator would hold some
//! partitions itself, and a kill could find the process holding none.)
//!
//! Snapshots go to a temporary folder, asked for by the thread that drives the scenario
//! every `gap` phases (a tenth of the job's phases, at least one), one at a time: a snapshot
//! may take longer than many short phases, and requests would pile up. While the job runs:
//!
//! 1. `scale_remote(2)` starts two worker processes through a [`LocalLauncher`]: this
//!    program re-executed with `--worker ADDR` ([`serve_if_worker`], one compute thread
//!    each);
//! 2. `gap` phases after both have joined, `scale_remote(3)` starts a third;
//! 3. `gap` phases after it has joined, `retire_remote(1)` retires it (the most recently
//!    joined): it hands its partitions back and ends. No snapshot is under way meanwhile
//!    (see the comment at this step in [`run`]);
//! 4. `gap` phases later, and once a snapshot has been committed, the first process is killed
//!    with SIGKILL: the partitions only it held are lost, and the job rolls back to its
//!    latest committed snapshot by itself and goes on with the process left. The handles of
//!    launched processes are the executor's, so each process writes its process id to the
//!    temporary folder, named by its launch number (`{index}`), and `kill -KILL` is given it.
//!
//! A step that the job's end comes before is an error: the run was too short to show the
//! scenario (give it more phases). The scenario waits for the job's end by polling it, and
//! calls `wait` only then: with no local worker, the thread in `wait` would compute.
//!
//! # What is printed
//!
//! Each step as it happens, with the time and phase; after the job, the coordinator's
//! [`Traffic`] in all and per phase run, the snapshots and the [`Rollback`]s; and one line
//! per worker process from the [`Served`] its `serve` returned (its bytes to the coordinator
//! and the halos it pushed to and received from its peers), which each process writes to
//! the temporary folder for the coordinator to print in order (the killed one writes none).
//! The example prints each phase's time, marking the phases that ran again after the
//! rollback ([`timed`]).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use malleable::cluster::{self, LocalLauncher, Registry, Served, WorkerOptions};
use malleable::{
    BoxError, Executor, Finished, Job, JobHandle, Outcome, Progress, Rollback, SnapshotRequest,
    Traffic,
};

use super::stencil::PhaseEnd;

/// The command-line flag of the processes mode.
pub(crate) const FLAG: &str = "--processes";

/// Worker processes at the start, and at the largest.
const FIRST: usize = 2;
const MOST: usize = 3;

/// The launched process that is retired (its number among those the job launched): the
/// third, the most recently joined. And the one killed: one of the first two.
const RETIRED: usize = 2;
const KILLED: usize = 0;

/// How long a step may wait for what it started (a process to join, a rollback).
const PATIENCE: Duration = Duration::from_secs(60);

/// How long the coordinator waits for a worker process's report once the job has ended.
const REPORT_PATIENCE: Duration = Duration::from_secs(10);

/// Where an example's malleable run runs: on local threads, or in the processes mode (the
/// module's docs).
#[derive(Debug)]
pub(crate) struct Runner {
    /// An executor with local threads, built before the run is timed; `None` in the
    /// processes mode, which builds one of its own for each run, listening for the worker
    /// processes it starts.
    threads: Option<Executor>,
}

impl Runner {
    /// `workers` local threads, or the processes mode if `processes`.
    pub(crate) fn new(workers: usize, processes: bool) -> Result<Runner, BoxError> {
        let threads = if processes {
            None
        } else {
            Some(Executor::builder().local_workers(workers).build()?)
        };
        Ok(Runner { threads })
    }

    /// Runs `job`; in the processes mode, its summary comes with the result.
    pub(crate) fn run<J: Job>(&self, job: J) -> Result<(Finished<J>, Option<Summary>), BoxError> {
        match &self.threads {
            Some(exec) => Ok((exec.run(job)?, None)),
            None => run(job).map(|(done, summary)| (done, Some(summary))),
        }
    }
}

// ---------------------------------------------------------------------------------------
// The worker side.

/// If the command line says `--worker ADDR`, serves the coordinator at `ADDR` (a worker
/// process of job type `J`, one compute thread) and returns its exit status; `None`
/// otherwise. With `--pid-file PATH` it writes its process id there first; with
/// `--report PATH` it writes its line about what it did there instead of printing it.
pub(crate) fn serve_if_worker<J: Job>() -> Option<ExitCode> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opt = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let addr = opt("--worker")?;
    let served = worker::<J>(&addr, opt("--pid-file"), opt("--report"));
    Some(super::exit_code(served.map(|()| true)))
}

fn worker<J: Job>(
    addr: &str,
    pid_file: Option<String>,
    report: Option<String>,
) -> Result<(), BoxError> {
    if let Some(path) = pid_file {
        write_whole(Path::new(&path), &std::process::id().to_string())?;
    }
    let options = WorkerOptions::from_env()?.threads(1).stop_on_signals();
    let served = cluster::serve(addr, &Registry::new().register::<J>(), options);
    let line = match &served {
        Ok(served) => served_line(served),
        Err(e) => format!("serve failed: {e}"),
    };
    match report {
        Some(path) => write_whole(Path::new(&path), &line)?,
        None => println!("worker {}: {line}", std::process::id()),
    }
    served.map(drop).map_err(Into::into)
}

/// What a worker process did, in one line.
fn served_line(s: &Served) -> String {
    let p = &s.peers;
    format!(
        "{} chunk{}, {} to the coordinator; to its peers {} halos, {} ({} kept there, {} \
         unreachable); from its peers {} halos ({} kept); between its own partitions {} \
         halos handed over live{}",
        s.chunks_done,
        if s.chunks_done == 1 { "" } else { "s" },
        bytes(s.bytes_to_coordinator),
        p.halos_pushed,
        bytes(p.halo_bytes_pushed),
        p.halos_kept_by_peers,
        p.halos_unreachable,
        p.halos_received,
        p.halos_kept_here,
        p.halos_live,
        if s.left {
            "; left on a stop request"
        } else {
            ""
        }
    )
}

/// Writes `text` to `path` whole or not at all (a reader never sees half of it).
fn write_whole(path: &Path, text: &str) -> std::io::Result<()> {
    let partial = path.with_extension("partial");
    std::fs::write(&partial, text)?;
    std::fs::rename(&partial, path)
}

// ---------------------------------------------------------------------------------------
// The coordinator side.

/// What the processes mode saw besides the job's result, printed by [`Summary::print`].
#[derive(Debug)]
pub(crate) struct Summary {
    traffic: Traffic,
    rollbacks: Vec<Rollback>,
    /// Snapshots committed, and failed (one under way when a process is killed fails:
    /// what it was to capture is lost), and the phases between two.
    snapshots: u64,
    failed: u64,
    gap: u64,
    /// Each launched process's line, in launch order.
    workers: Vec<String>,
}

/// Runs the scenario of the module's docs around `job`.
fn run<J: Job>(job: J) -> Result<(Finished<J>, Summary), BoxError> {
    let folder = Folder::new(J::NAME)?;
    let exe = std::env::current_exe()?;
    let each = |what: &str| folder.0.join(format!("worker-{{index}}.{what}"));
    let launcher = LocalLauncher::new(&exe).args([
        "--worker".into(),
        "{addr}".into(),
        "--pid-file".into(),
        each("pid").into_os_string(),
        "--report".into(),
        each("txt").into_os_string(),
    ]);
    let store = folder.0.join("snapshots");
    let exec = Executor::builder()
        .local_workers(0)
        .listen("127.0.0.1:0")
        .heartbeat(Duration::from_millis(200), Duration::from_secs(2))
        .snapshots(format!("file://{}", store.display()))
        .launcher(launcher)
        .build()?;
    let addr = exec.local_addr().ok_or("not listening")?;

    let handle = exec.submit(job)?;
    let phases = handle.progress().phases.unwrap_or(10);
    let gap = (phases / 10).max(1);
    println!(
        "processes: the coordinator listens on {addr} with no local worker; a snapshot every \
         {gap} phases to {}",
        store.display()
    );
    let mut d = Driver::new(&handle, gap);

    // 1. Two worker processes.
    handle.scale_remote(FIRST)?;
    d.until("two worker processes joined", |d| {
        d.handle.remote_workers() == FIRST
    })?;
    d.say(d.now(), "scale_remote(2): two worker processes joined");

    // 2. A third.
    d.phases_later("scale_remote(3)", gap)?;
    handle.scale_remote(MOST)?;
    d.until("a third worker process joined", |d| {
        d.handle.remote_workers() == MOST
    })?;
    d.say(d.now(), "scale_remote(3): a third worker process joined");

    // 3. Back to two, snapshots going on (a capture the retiring process writes after its
    // slot handed its chunk back is dropped as late, and nothing is lost).
    d.phases_later("retire_remote(1)", gap)?;
    let asked = d.now();
    handle.retire_remote(1);
    d.until("the third process retired", |d| {
        d.handle.remote_workers() == FIRST
    })?;
    d.say(asked, "retire_remote(1): the third worker process retires");
    d.until("the third process ended", |d| {
        d.handle.remote_processes().len() == FIRST
    })?;

    // 4. SIGKILL, after a committed snapshot.
    d.phases_later("the kill", gap)?;
    d.until("a committed snapshot", |d| d.snapshots.committed > 0)?;
    let pid = std::fs::read_to_string(folder.0.join(format!("worker-{KILLED}.pid")))?;
    let rollbacks_before = handle.rollbacks().len();
    let asked = d.now();
    let killed = Command::new("kill").args(["-KILL", pid.trim()]).status()?;
    if !killed.success() {
        return Err(format!("kill -KILL {}: {killed}", pid.trim()).into());
    }
    d.say(
        asked,
        &format!(
            "worker process {KILLED} (pid {}) killed with SIGKILL",
            pid.trim()
        ),
    );
    d.until("the rollback", |d| {
        d.handle.rollbacks().len() > rollbacks_before
    })?;
    if let Some(r) = handle.rollbacks().last() {
        d.say(
            d.now(),
            &format!(
                "rolled back from phase {} to the snapshot of phase {} ({} partitions lost)",
                r.from_phase,
                r.to_phase,
                r.lost.len()
            ),
        );
    }

    // The end: what the coordinator counted, then the outcome.
    while !handle.is_finished() {
        d.tick();
        std::thread::sleep(Duration::from_millis(1));
    }
    let traffic = handle.traffic();
    let rollbacks = handle.rollbacks();
    let failed = handle.snapshot_failures();
    let snapshots = d.snapshots;
    let done = match handle.wait()? {
        Outcome::Finished(f) => f,
        Outcome::Suspended(id) => return Err(format!("the job was suspended to {id:?}").into()),
        _ => return Err("the job did not finish".into()),
    };
    let snapshots = snapshots.finish();
    let workers = (0..MOST)
        .map(|i| report(&folder.0, i))
        .collect::<Result<_, _>>()?;
    Ok((
        done,
        Summary {
            traffic,
            rollbacks,
            snapshots,
            failed,
            gap,
            workers,
        },
    ))
}

/// The line of launched process `i`, once it has written it (the killed one writes none).
fn report(folder: &Path, i: usize) -> Result<String, BoxError> {
    let pid = std::fs::read_to_string(folder.join(format!("worker-{i}.pid")))?;
    let role = match i {
        KILLED => {
            return Ok(format!(
                "worker process {i} (pid {}): killed with SIGKILL, no report",
                pid.trim()
            ));
        }
        RETIRED => "retired",
        _ => "to the end",
    };
    let who = format!("worker process {i} (pid {}, {role})", pid.trim());
    let path = folder.join(format!("worker-{i}.txt"));
    let start = Instant::now();
    loop {
        match std::fs::read_to_string(&path) {
            Ok(line) => return Ok(format!("{who}: {line}")),
            Err(_) if start.elapsed() < REPORT_PATIENCE => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(format!("{who} wrote no report: {e}").into()),
        }
    }
}

/// Snapshot requests, one at a time, waited for by a helper thread; those committed.
struct Snapshots {
    asked: mpsc::Sender<SnapshotRequest>,
    outcomes: mpsc::Receiver<malleable::Result<malleable::snapshot::SnapshotId>>,
    waiter: std::thread::JoinHandle<()>,
    /// Whether one was asked for and has not committed or failed yet.
    in_flight: bool,
    committed: u64,
}

impl Snapshots {
    fn new() -> Snapshots {
        let (asked, requests) = mpsc::channel::<SnapshotRequest>();
        let (done, outcomes) = mpsc::channel();
        let waiter = std::thread::spawn(move || {
            for request in requests {
                let _ = done.send(request.wait());
            }
        });
        Snapshots {
            asked,
            outcomes,
            waiter,
            in_flight: false,
            committed: 0,
        }
    }

    /// Takes in the outcome of the snapshot in flight, if it has one.
    fn poll(&mut self) {
        for outcome in self.outcomes.try_iter() {
            self.in_flight = false;
            self.committed += u64::from(outcome.is_ok());
        }
    }

    fn ask(&mut self, request: SnapshotRequest) {
        self.in_flight = self.asked.send(request).is_ok();
    }

    /// Once the job has ended: those committed in all.
    fn finish(mut self) -> u64 {
        drop(self.asked);
        let _ = self.waiter.join();
        self.committed += self.outcomes.try_iter().filter(Result::is_ok).count() as u64;
        self.committed
    }
}

/// The thread that drives the scenario: waits for phases and conditions, asks for a
/// snapshot every `gap` phases meanwhile, and prints each step.
struct Driver<'h, J: Job> {
    handle: &'h JobHandle<J>,
    started: Instant,
    gap: u64,
    /// The phase at which the next snapshot is asked for.
    next_snapshot: u64,
    snapshots: Snapshots,
}

impl<'h, J: Job> Driver<'h, J> {
    fn new(handle: &'h JobHandle<J>, gap: u64) -> Self {
        Driver {
            handle,
            started: Instant::now(),
            gap,
            next_snapshot: gap,
            snapshots: Snapshots::new(),
        }
    }

    /// Asks for a snapshot if `gap` phases have ended since the last one was asked for and
    /// that one has committed (or failed: the crate logs it, the handle counts it, and the
    /// job goes on). Phases may be much shorter than a snapshot takes; one at a time, they
    /// do not pile up.
    fn tick(&mut self) {
        self.snapshots.poll();
        let phase = self.handle.progress().phase;
        if phase >= self.next_snapshot && !self.snapshots.in_flight {
            self.snapshots.ask(self.handle.snapshot());
            self.next_snapshot = phase + self.gap;
        }
    }

    /// Waits until `cond` holds, asking for snapshots meanwhile; an error if the job ends
    /// first, or after [`PATIENCE`].
    fn until(&mut self, what: &str, cond: impl Fn(&Self) -> bool) -> Result<(), BoxError> {
        let start = Instant::now();
        loop {
            self.tick();
            if cond(self) {
                return Ok(());
            }
            if self.handle.is_finished() {
                let p = self.handle.progress();
                return Err(format!(
                    "the job ended (phase {} of {}) before {what}: give it more phases",
                    p.phase,
                    p.phases.unwrap_or(0)
                )
                .into());
            }
            if start.elapsed() > PATIENCE {
                let last = self.handle.last_snapshot_error();
                return Err(format!(
                    "{what}: not after {PATIENCE:?} (the last failed snapshot: {last:?})"
                )
                .into());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Waits for `n` phases to end from now, before `what`.
    fn phases_later(&mut self, what: &str, n: u64) -> Result<(), BoxError> {
        let at = self.handle.progress().phase + n;
        self.until(&format!("phase {at} ({what})"), |d| {
            d.handle.progress().phase >= at
        })
    }

    /// The time since the start, the phase and the processes now.
    fn now(&self) -> (Duration, Progress) {
        (self.started.elapsed(), self.handle.progress())
    }

    /// Prints a step, as it stood `at` (from [`Driver::now`]).
    fn say(&self, at: (Duration, Progress), what: &str) {
        let (t, p) = at;
        let n = p.remote_workers;
        println!(
            "{:>7.3} s  phase {:>4}  {n} process{}  {what}",
            t.as_secs_f64(),
            p.phase,
            if n == 1 { " " } else { "es" }
        );
    }
}

impl Summary {
    /// Prints the coordinator's traffic (in all, and per phase over `phases_run`, the
    /// phases ended, those run again after a rollback included), the snapshots and
    /// rollbacks, and each worker process's line.
    pub(crate) fn print(&self, phases_run: u64) {
        let t = &self.traffic;
        let per = |n: u64| n as f64 / phases_run.max(1) as f64;
        println!(
            "coordinator  {} messages in, {} out ({:.1} and {:.1} per phase); relayed halos {} \
             in, {} out ({} and {} per phase); {} halos direct ({:.1} per phase), {} peers \
             unreachable",
            t.messages_in,
            t.messages_out,
            per(t.messages_in),
            per(t.messages_out),
            bytes(t.halo_bytes_in),
            bytes(t.halo_bytes_out),
            bytes(per(t.halo_bytes_in) as u64),
            bytes(per(t.halo_bytes_out) as u64),
            t.halos_direct,
            per(t.halos_direct),
            t.peers_unreachable
        );
        println!(
            "snapshots    {} committed, {} failed, one asked for every {} phases",
            self.snapshots, self.failed, self.gap
        );
        for r in &self.rollbacks {
            println!(
                "rollback     {} partitions lost in phase {}, back to phase {} (epoch {}): \
                 quiesced in {:.1} ms, read in {:.1} ms, restarted in {:.1} ms{}",
                r.lost.len(),
                r.from_phase,
                r.to_phase,
                r.epoch,
                ms(r.quiesce),
                ms(r.read),
                ms(r.restart),
                r.recovered
                    .map(|d| format!(", a phase done again in {:.1} ms", ms(d)))
                    .unwrap_or_default()
            );
        }
        for line in &self.workers {
            println!("{line}");
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A byte count for people: B, kB, MB or GB (powers of ten).
fn bytes(n: u64) -> String {
    match n {
        0..1_000 => format!("{n} B"),
        1_000..1_000_000 => format!("{:.1} kB", n as f64 / 1e3),
        1_000_000..1_000_000_000 => format!("{:.2} MB", n as f64 / 1e6),
        _ => format!("{:.2} GB", n as f64 / 1e9),
    }
}

/// The phase ends of a run in order, each with its time (from the end of the one before, or
/// `start`) and, after a rollback, a mark on the phases that ran again ("" otherwise).
pub(crate) fn timed(
    ends: impl IntoIterator<Item = PhaseEnd>,
    start: Instant,
) -> Vec<(PhaseEnd, Duration, &'static str)> {
    let mut last = start;
    let mut highest = None;
    ends.into_iter()
        .map(|end| {
            let again = highest.is_some_and(|h| end.phase <= h);
            highest = highest.max(Some(end.phase));
            let took = end.at - last;
            last = end.at;
            (end, took, if again { "  (again)" } else { "" })
        })
        .collect()
}

/// A temporary folder for one run's snapshots and worker files, removed when dropped.
struct Folder(PathBuf);

impl Folder {
    fn new(name: &str) -> std::io::Result<Folder> {
        let dir =
            std::env::temp_dir().join(format!("malleable-{name}-processes-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        Ok(Folder(dir))
    }
}

impl Drop for Folder {
    /// Removes the folder. When the scenario ends early with an error, worker processes
    /// may still be writing their reports into it as it goes: a file written after the
    /// removal listed the folder fails it, and the removal is tried again (a report
    /// written after the folder is gone fails, and creates nothing).
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir_all(&self.0).is_ok() || !self.0.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
