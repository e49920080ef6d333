//! The owned-partitions targets on the heat solver (2-D Jacobi, `Banded(Heat)` from
//! `examples/kernels/stencil.rs`, 32 bands), `N × N` `f64` (N = 4000: a 128 MB grid, two with
//! the double buffer), each part ending with one summary line:
//!
//! 1. **Doubling**: 1 local worker; when phase `P/2` of `P` (100 of 200) has ended,
//!    `set_local_workers(2)`. Phase times are the gaps between the phase ends the job's
//!    `end_phase` reports at the barrier. Printed: the median phase before (phases `P/4` to
//!    `P/2 - 1`, 50-99), after (`P/2 + P/20` to the end, 110-199), the speed-up before ÷ after
//!    (target ≥ 1.8×), and the longest phase of the transition (`P/2` to `P/2 + P/20 - 1`,
//!    where partitions move) ÷ the median after (target ≤ 2×), with the partitions moved
//!    (`malleable_partitions_moved_total`). The final grid is checked bit for bit against the
//!    sequential loop.
//! 2. **Remote vs local**: the same solver (`PARTITIONS_REMOTE_PHASES` phases, default 50) on
//!    2 local threads, then on 2 worker processes over loopback (this binary re-executed with
//!    `--worker ADDR`, one thread each; the coordinator has no local worker) that push their
//!    halos to each other (direct), then on 2 that send them through the coordinator
//!    (relayed, `MALLEABLE_DIRECT_HALOS=0`). The processes start before the job is
//!    submitted, as in `benches/cluster.rs`. Runs go back to back, in turn; the ratios are
//!    local time ÷ remote time, the medians over the rounds (target ≥ 0.95× for direct), and
//!    relayed time ÷ direct time. Values are checked equal.
//! 3. **Snapshot pause**: 2 local workers (16 bands each, at the barrier), snapshots asked for
//!    at points spread over a phase. Three measures:
//!    - `malleable_snapshot_pause_seconds` without an `at` label is recorded by a worker that
//!      serializes the band it is running (one band, its current rows and the rows this phase
//!      has computed so far); its median is compared with postcard serializing such a band
//!      alone. At N = 4000 a band's step is about the whole band (about 1 ms), so a running
//!      band usually reaches the cut as `Done` before it would capture (then it is serialized
//!      under the job's lock, label `at` = `done`), and this line may have no sample at all:
//!      it says so.
//!    - The same metric with `at` = `marker`: how long the marker held the job's lock while it
//!      serialized the bands waiting in the ledger (the bulk of a 128 MB grid, on every core,
//!      while the workers wait for the lock). Its median is compared with postcard
//!      serializing one worker's half of the grid alone (16 bands, one thread), which is what
//!      each core does at the marker.
//!    - From outside: how much longer the phase in which a snapshot was asked for took than
//!      the median phase without one, against the same half alone. It includes the store
//!      write going on in the background, so it is an upper bound.
//!
//!    Target for each: ≤ 1.1×. And the size of the newest manifest in the folder store
//!    (target < 64 KiB), with the total size of its parts.
//! 4. **Recovery**: 2 worker processes (no local worker), a snapshot every
//!    `PARTITIONS_SNAPSHOT_MS` (default 1000) to a local folder, one process killed with SIGKILL
//!    at the first commit seen after 60 % of the phases (while no cut is open); the job rolls back by
//!    itself. From the handle's [`Rollback`](malleable::Rollback): the time from the loss to the
//!    first phase done again ÷ reading that snapshot from the store (target ≤ 1.5×): after
//!    the run, `Store::read` of the same snapshot, manifest and every part, checksums
//!    checked, warm page cache, median of 5 (what a resume reads). (The rollback's own read
//!    used to be the measure; the coordinator now reads only the manifest and the parts it
//!    hands out itself, the processes read theirs, so it no longer reads the snapshot.)
//!    Printed with it: the rollback's own read, the kill-to-phase time seen from outside and
//!    a raw read of the same files (`std::fs::read`, warm page cache). Also printed: the phase after the
//!    one recovered (the restored bands that were done in the snapshot's phase run there
//!    first, so part of the rollback's cost lands in it, and the target's measure does not
//!    see it) and the median phase on the one process left. The final grid is checked bit for
//!    bit.
//! 5. **Buddy copies** ([`Builder::buddy_copies`](malleable::Builder::buddy_copies)): 2
//!    worker processes (one thread each, halos direct), `PARTITIONS_COPY_PHASES` phases
//!    (default 100), with a copy of every partition into the other process's memory every
//!    `PARTITIONS_COPY_EVERY` phases (default 20), through memory both processes map (the
//!    default between processes of a node) and over the links
//!    ([`WorkerOptions::shared_copies`](malleable::cluster::WorkerOptions::shared_copies)
//!    off), against the same without copies, in turn. Printed: each run with copies ÷ the
//!    run without, whole and from the third copy barrier on (the steady state: the first
//!    two rounds encode into memory mapped for the first time), the median over the rounds
//!    (target: overhead ≤ 3%), and what the phases after its barriers took over the run's
//!    own median (a measure the machine's drift between runs does not blur); the pause,
//!    the phase after each copy barrier of the steady state against the run's own median
//!    phase, ÷ copying a process's bytes into memory already mapped (target ≤ 1.1×), ÷ two
//!    threads doing so at once (both processes copy at a barrier) and ÷ postcard
//!    serializing one process's half of the grid alone into fresh memory; and the copies'
//!    bytes per process. Values are checked equal.
//! 6. **Local recovery**: 4 worker processes (one thread each, no local worker), one
//!    killed with SIGKILL `PARTITIONS_LOCAL_AFTER` phases (default 10) after a buddy-copy
//!    barrier (copies every `PARTITIONS_COPY_EVERY`, default 20; no snapshot store): its
//!    partitions are replayed from their copies while the others go on. Against the same
//!    run with snapshots (to a local folder, every `PARTITIONS_SNAPSHOT_MS`) and no copies,
//!    whose kill, right after a commit, rolls everyone back. Printed: the time from the
//!    kill to the next phase done, both ways, and their ratio (target ≥ 3×); the recovery's
//!    own time (loss to every partition back), the phases replayed and the median phase.
//!    Values are checked against the sequential loop.
//!
//! ```text
//! cargo bench --bench partitions                         # all six, 4000 × 4000
//! PARTITIONS_ONLY=doubling cargo bench --bench partitions # one part: doubling, remote,
//!                                                         # pause, recovery, copies
//!                                                         # or local
//! PARTITIONS_N=1000 PARTITIONS_PHASES=80 cargo bench --bench partitions  # smaller, quicker
//! cargo test --bench partitions                          # a quick checked pass (N = 200)
//! ```
//!
//! Other knobs: `PARTITIONS_PAIRS` (remote/local pairs, default 3), `PARTITIONS_SNAPSHOTS`
//! (snapshots for the pause, default 8), `PARTITIONS_RECOVERIES` (kill runs, default 1),
//! `PARTITIONS_LOG` (`debug`, `info`: the coordinator's and the processes' logs on stderr).
//! The machine has 2 cores: every figure is noisy when other work shares it.

#[path = "../examples/kernels/mod.rs"]
mod kernels;

mod support;

#[path = "../tests/common/log.rs"]
mod log;

#[cfg(feature = "s3")]
#[allow(dead_code)]
#[path = "../tests/support/seaweed.rs"]
mod seaweed;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use malleable::cluster::{Registry, WorkerOptions};
use malleable::rows::{Band, BandedInput};
use malleable::{Banded, Chunk, Executor, Job, JobHandle, Outcome, Partition, Step};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

use kernels::stencil::heat::{self, Heat, Solution};
use kernels::stencil::{PhaseEnd, watch_phases};

/// The sizes of a run.
#[derive(Debug, Clone, Copy)]
struct Sizes {
    /// The grid's side.
    n: u64,
    /// Phases of the doubling and recovery runs.
    phases: u64,
    /// Phases of each remote/local run.
    remote_phases: u64,
    /// Remote/local pairs.
    pairs: usize,
    /// Snapshots taken for the pause.
    snapshots: usize,
    /// Recovery runs.
    recoveries: usize,
    /// The snapshot period of the recovery runs.
    period: Duration,
    /// Whether this is the quick pass (`cargo test`).
    quick: bool,
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.replace('_', "").parse().ok())
        .filter(|&v| v > 0)
        .unwrap_or(default)
}

impl Sizes {
    fn new(quick: bool) -> Sizes {
        // The quick pass runs many short phases so that the kill lands after a snapshot.
        let (n, phases, remote_phases, pairs, snapshots, period_ms) = if quick {
            (200, 40, 10, 1, 3, 300)
        } else {
            (4000, 200, 50, 3, 8, 1000)
        };
        Sizes {
            n: env_or("PARTITIONS_N", n).max(3),
            phases: env_or("PARTITIONS_PHASES", phases).max(20),
            remote_phases: env_or("PARTITIONS_REMOTE_PHASES", remote_phases),
            pairs: env_or("PARTITIONS_PAIRS", pairs) as usize,
            snapshots: env_or("PARTITIONS_SNAPSHOTS", snapshots) as usize,
            recoveries: env_or("PARTITIONS_RECOVERIES", 1) as usize,
            period: Duration::from_millis(env_or("PARTITIONS_SNAPSHOT_MS", period_ms)),
            quick,
        }
    }

    /// Phases of a recovery run: the quick pass's grid is tiny, so it runs longer.
    fn recovery_phases(&self) -> u64 {
        if self.quick {
            self.phases.max(300)
        } else {
            self.phases
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--worker") {
        return worker(&args[i + 1]);
    }
    if args.iter().any(|a| a == "--list") {
        return;
    }
    log::log_if_asked("PARTITIONS_LOG", "coordinator");
    // `cargo bench` passes `--bench`; `cargo test` does not, and wants a quick pass.
    let quick = !args.iter().any(|a| a == "--bench");
    let s = Sizes::new(quick);
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().expect("the metrics recorder");
    let only = std::env::var("PARTITIONS_ONLY").ok();
    let part = |name: &str| only.as_deref().is_none_or(|o| o == name);
    println!(
        "partitions: heat {n} × {n} f64 ({:.0} MB per grid), 32 bands; {} hardware threads{}",
        (s.n * s.n * 8) as f64 / 1e6,
        std::thread::available_parallelism().map_or(1, usize::from),
        if quick { " (quick pass)" } else { "" },
        n = s.n,
    );
    let mut summary = Vec::new();
    let mut reference: Option<(u64, Solution)> = None;
    let mut reference_for = |phases: u64| -> Solution {
        match &reference {
            Some((p, r)) if *p == phases => r.clone(),
            _ => {
                let t = Instant::now();
                let r = heat::sequential(s.n as usize, phases);
                println!(
                    "sequential reference, {phases} phases: {:.3} s",
                    t.elapsed().as_secs_f64()
                );
                reference = Some((phases, r.clone()));
                r
            }
        }
    };
    if part("doubling") {
        summary.extend(doubling(s, &snapshotter, &reference_for(s.phases)));
    }
    if part("remote") {
        summary.extend(remote_vs_local(s, &snapshotter));
    }
    if part("pause") {
        summary.extend(pause(s, &snapshotter));
    }
    if part("recovery") {
        let r = reference_for(s.recovery_phases());
        summary.extend(recovery(s, &r));
    }
    if part("copies") {
        summary.extend(copies(s));
    }
    if part("local") {
        let phases = if s.quick { 60 } else { 120 };
        let r = reference_for(phases);
        summary.extend(local_recovery(s, phases, &r));
    }
    println!();
    for line in summary {
        println!("{line}");
    }
}

// ---------------------------------------------------------------------------------------
// Shared pieces.

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn median(mut v: Vec<Duration>) -> Duration {
    support::percentile(&mut v, 0.5)
}

fn median_f64(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Panics unless `got` has the reference's bits (every row, every phase's largest change).
fn check(what: &str, got: &Solution, reference: &Solution) {
    if let Some(row) = got.digest.first_difference(&reference.digest) {
        panic!("{what}: row {row} of the final grid differs from the sequential loop's");
    }
    assert!(
        got.digest == reference.digest && got.change.to_bits() == reference.change.to_bits(),
        "{what}: the phases' largest changes differ from the sequential loop's"
    );
}

/// Waits for a job that nobody computes inline (zero local workers) without joining it.
fn finish<J: Job>(h: JobHandle<J>) -> malleable::Finished<J> {
    while !h.is_finished() {
        std::thread::sleep(Duration::from_millis(1));
    }
    match h.wait().expect("the job") {
        Outcome::Finished(f) => f,
        Outcome::Suspended(id) => panic!("suspended at {id}"),
        _ => panic!("not finished"),
    }
}

/// How long a job may go without a phase end before the bench fails.
const STALL: Duration = Duration::from_secs(120);

/// The phase ends of a job as they arrive, with the time of each phase (from the previous
/// end, or from `since` for the first).
struct Phases {
    log: Receiver<PhaseEnd>,
    last: Instant,
    /// `(phase, its time, its end)`, in the order reported (a rollback repeats phases).
    seen: Vec<(u64, Duration, Instant)>,
}

impl Phases {
    fn watch(since: Instant) -> Phases {
        Phases {
            log: watch_phases(),
            last: since,
            seen: Vec::new(),
        }
    }

    /// The next phase end, or `None` once the job has ended and every end was read.
    fn next<J: Job>(&mut self, h: &JobHandle<J>) -> Option<PhaseEnd> {
        loop {
            match self.log.recv_timeout(Duration::from_millis(5)) {
                Ok(e) => {
                    self.seen.push((e.phase, e.at - self.last, e.at));
                    self.last = e.at;
                    return Some(e);
                }
                Err(RecvTimeoutError::Timeout) if h.is_finished() => return None,
                Err(RecvTimeoutError::Timeout) => {
                    // A job that stops making progress fails the bench instead of hanging it.
                    assert!(
                        self.last.elapsed() < STALL,
                        "no phase ended for {STALL:?} (progress {:?}, rollbacks {:?})",
                        h.progress(),
                        h.rollbacks()
                    );
                }
                Err(RecvTimeoutError::Disconnected) => panic!("the phase log closed"),
            }
        }
    }

    /// Takes in the phase ends already reported (after the job has ended).
    fn drain(&mut self) {
        while let Ok(e) = self.log.try_recv() {
            self.seen.push((e.phase, e.at - self.last, e.at));
            self.last = e.at;
        }
    }

    /// The time of each phase `0..phases`, from a run without rollback.
    fn times(&self, phases: u64) -> Vec<Duration> {
        assert_eq!(self.seen.len() as u64, phases, "one end per phase");
        self.seen.iter().map(|&(_, d, _)| d).collect()
    }
}

/// The sum of a counter over all its labels.
fn counter(snapshotter: &Snapshotter, name: &str) -> u64 {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == name)
        .map(|(.., value)| match value {
            DebugValue::Counter(c) => c,
            _ => 0,
        })
        .sum()
}

/// A counter's values by one of its labels, summed over the others, since the last snapshot
/// (the debugging recorder's snapshot takes its counters' values, so one snapshot must
/// serve every label).
fn counter_by(
    snapshotter: &Snapshotter,
    name: &str,
    label: &str,
) -> std::collections::BTreeMap<String, u64> {
    let mut by = std::collections::BTreeMap::new();
    for (key, .., value) in snapshotter.snapshot().into_vec() {
        let (DebugValue::Counter(c), true) = (value, key.key().name() == name) else {
            continue;
        };
        for l in key.key().labels().filter(|l| l.key() == label) {
            *by.entry(l.value().to_owned()).or_insert(0) += c;
        }
    }
    by
}

/// A fresh folder for a snapshot store: its URL and path.
fn folder(name: &str) -> (String, PathBuf) {
    let dir = std::env::temp_dir().join(format!(
        "malleable-bench-partitions-{name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a temporary folder");
    (format!("file://{}", dir.display()), dir)
}

/// The manifests under `dir/job_id` (one folder per epoch), oldest epoch first.
fn manifests(dir: &Path, job_id: &str) -> Vec<PathBuf> {
    let Ok(epochs) = std::fs::read_dir(dir.join(job_id)) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = epochs
        .flatten()
        .map(|e| e.path().join("manifest"))
        .filter(|p| p.is_file())
        .collect();
    found.sort();
    found
}

// ---------------------------------------------------------------------------------------
// Worker processes.

/// Worker mode: serve the coordinator at `addr` with one thread until its job ends.
fn worker(addr: &str) {
    log::log_if_asked("PARTITIONS_LOG", "worker process");
    let registry = Registry::new().register::<Banded<Heat>>();
    let direct = std::env::var("MALLEABLE_DIRECT_HALOS").map_or(true, |v| v != "0");
    let shared = std::env::var("MALLEABLE_SHARED_COPIES").map_or(true, |v| v != "0");
    let options = WorkerOptions::default()
        .threads(1)
        .direct_halos(direct)
        .shared_copies(shared);
    support::serve_until_the_end(addr, &registry, &options);
}

/// This binary re-executed as a worker process serving the coordinator at `addr`, with
/// more environment (an S3 store's credentials, whether halos go direct).
fn spawn_worker_env(addr: &str, env: &[(String, String)]) -> Child {
    Command::new(std::env::current_exe().expect("the bench binary"))
        .args(["--worker", addr])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::null())
        .spawn()
        .expect("a worker process")
}

/// The recovery's snapshot store: a local folder, or with `PARTITIONS_STORE=s3` (and the
/// feature `s3`) a SeaweedFS S3 server started here, as the tests start it: its URL, the
/// store options, the worker processes' environment (the keys: a process takes its
/// credentials from its own environment), and the folder (for a raw read of its files).
#[allow(clippy::type_complexity)]
fn recovery_store(
    run: usize,
) -> (
    String,
    Vec<(String, String)>,
    Vec<(String, String)>,
    Option<PathBuf>,
) {
    if std::env::var("PARTITIONS_STORE").as_deref() != Ok("s3") {
        let (url, dir) = folder("recovery");
        return (url, Vec::new(), Vec::new(), Some(dir));
    }
    #[cfg(feature = "s3")]
    {
        let server = seaweed::server();
        let url = format!(
            "s3://{}/bench-recovery-{}-{run}",
            seaweed::BUCKET,
            std::process::id()
        );
        let env = vec![
            (
                "AWS_ACCESS_KEY_ID".to_owned(),
                seaweed::ACCESS_KEY.to_owned(),
            ),
            (
                "AWS_SECRET_ACCESS_KEY".to_owned(),
                seaweed::SECRET_KEY.to_owned(),
            ),
        ];
        (url, server.options(), env, None)
    }
    #[cfg(not(feature = "s3"))]
    panic!(
        "PARTITIONS_STORE=s3 needs the feature s3 (cargo bench --features s3 --bench partitions); run {run}"
    )
}

/// An executor with no local worker that listens on loopback.
fn coordinator() -> malleable::Builder {
    Executor::builder().local_workers(0).listen("127.0.0.1:0")
}

// ---------------------------------------------------------------------------------------
// 1. Doubling.

fn doubling(s: Sizes, snapshotter: &Snapshotter, reference: &Solution) -> Vec<String> {
    let phases = s.phases;
    let grow_at = phases / 2;
    let settle = grow_at + (phases / 20).max(1);
    println!(
        "\n== doubling: 1 local worker, 2 once phase {grow_at} of {phases} has ended ({} MB grid)",
        (s.n * s.n * 8) as f64 / 1e6
    );
    let exec = Executor::builder()
        .local_workers(1)
        .build()
        .expect("an executor");
    let moved_before = counter(snapshotter, malleable::metrics::PARTITIONS_MOVED);
    let started = Instant::now();
    let mut log = Phases::watch(started);
    let h = exec.submit(Banded(Heat::new(s.n, phases))).expect("submit");
    let mut grew_in = None;
    while let Some(e) = log.next(&h) {
        if e.phase + 1 == grow_at {
            h.set_local_workers(2);
            grew_in = Some(h.progress().phase);
        }
    }
    let done = h
        .wait()
        .expect("the doubling job")
        .finished()
        .expect("finished");
    check("doubling", &Heat::solution(&done), reference);
    let moved = counter(snapshotter, malleable::metrics::PARTITIONS_MOVED) - moved_before;
    let times = log.times(phases);
    let before = median(times[(phases / 4) as usize..grow_at as usize].to_vec());
    let after = median(times[settle as usize..].to_vec());
    let (peak_at, peak) = (grow_at..settle)
        .map(|p| (p, times[p as usize]))
        .max_by_key(|&(_, d)| d)
        .expect("a transition phase");
    println!(
        "phases {}..{}: {:?} ms",
        grow_at.saturating_sub(3),
        (settle + 3).min(phases),
        times[grow_at.saturating_sub(3) as usize..(settle + 3).min(phases) as usize]
            .iter()
            .map(|d| (ms(*d) * 10.0).round() / 10.0)
            .collect::<Vec<_>>()
    );
    println!(
        "grew while phase {} ran; {moved} partitions moved; total {:.3} s; check ok (the \
         sequential loop's bits)",
        grew_in.unwrap_or(grow_at),
        started.elapsed().as_secs_f64()
    );
    println!(
        "median phase {:.2} ms before (phases {}-{}), {:.2} ms after (phases {}-{}); longest \
         phase of the move: {peak_at}, {:.2} ms",
        ms(before),
        phases / 4,
        grow_at - 1,
        ms(after),
        settle,
        phases - 1,
        ms(peak)
    );
    vec![
        format!(
            "partitions doubling speed-up: {:.2}x (target >= 1.8x)",
            before.as_secs_f64() / after.as_secs_f64()
        ),
        format!(
            "partitions doubling move phase: {:.2}x a phase after (target <= 2x)",
            peak.as_secs_f64() / after.as_secs_f64()
        ),
    ]
}

// ---------------------------------------------------------------------------------------
// 2. Remote vs local.

fn remote_vs_local(s: Sizes, snapshotter: &Snapshotter) -> Vec<String> {
    let phases = s.remote_phases;
    println!(
        "\n== 2 worker processes over loopback (halos direct, then relayed) vs 2 local threads, \
         {phases} phases, {} rounds",
        s.pairs
    );
    let job = || Banded(Heat::new(s.n, phases));
    let local = Executor::builder()
        .local_workers(2)
        .build()
        .expect("an executor");
    let (mut direct_ratios, mut relayed_ratios, mut relay_costs) =
        (Vec::new(), Vec::new(), Vec::new());
    let (mut tl, mut td, mut tr) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..s.pairs {
        let t = Instant::now();
        let expected = Heat::solution(&local.run(job()).expect("the local run"));
        let l = t.elapsed();
        let remote = |direct: bool| {
            let exec = coordinator().build().expect("a coordinator");
            let addr = exec.local_addr().expect("listening").to_string();
            let env = [(
                "MALLEABLE_DIRECT_HALOS".to_owned(),
                if direct { "1" } else { "0" }.to_owned(),
            )];
            let workers = [spawn_worker_env(&addr, &env), spawn_worker_env(&addr, &env)];
            // Let them start before the clock does.
            std::thread::sleep(Duration::from_millis(if s.quick { 100 } else { 700 }));
            // Only this job's halos from here on.
            let _ = counter_by(snapshotter, malleable::metrics::HALOS, "route");
            let t = Instant::now();
            let h = exec.submit(job()).expect("submit");
            let done = finish(h.clone());
            let r = t.elapsed();
            // Kept by the ended run: read once it is over, not while it is timed.
            let traffic = h.traffic();
            for mut w in workers {
                let _ = w.wait();
            }
            check("remote", &Heat::solution(&done), &expected);
            let halos = counter_by(snapshotter, malleable::metrics::HALOS, "route");
            let halos = |route| halos.get(route).copied().unwrap_or(0);
            let name = if direct { "direct" } else { "relayed" };
            println!(
                "round {}: {name}: local {:.3} s, remote {:.3} s: {:.2}x; halos kept in the \
                 processes {}, pushed between them {}, relayed by the coordinator {}",
                round + 1,
                l.as_secs_f64(),
                r.as_secs_f64(),
                l.as_secs_f64() / r.as_secs_f64(),
                halos("kept"),
                halos("direct"),
                halos("relayed"),
            );
            let per_phase = |n: u64| n as f64 / phases as f64;
            println!(
                "round {}: {name}: through the coordinator per phase: {:.1} messages in, {:.1} \
                 out ({:.1} per process; target <= 2), {:.0} halo bytes in, {:.0} out; {:.1} \
                 halos a phase between the processes directly; {} partitions moved in the run",
                round + 1,
                per_phase(traffic.messages_in),
                per_phase(traffic.messages_out),
                per_phase(traffic.messages_in + traffic.messages_out) / 2.0,
                per_phase(traffic.halo_bytes_in),
                per_phase(traffic.halo_bytes_out),
                per_phase(traffic.halos_direct),
                traffic.partitions_moved,
            );
            r
        };
        // Alternate which goes first, so that neither always runs on a warmer machine.
        let (d, r) = if round % 2 == 0 {
            let d = remote(true);
            (d, remote(false))
        } else {
            let r = remote(false);
            (remote(true), r)
        };
        direct_ratios.push(l.as_secs_f64() / d.as_secs_f64());
        relayed_ratios.push(l.as_secs_f64() / r.as_secs_f64());
        relay_costs.push(r.as_secs_f64() / d.as_secs_f64());
        tl.push(l);
        td.push(d);
        tr.push(r);
    }
    println!(
        "medians: local {:.3} s, direct {:.3} s, relayed {:.3} s; values equal",
        median(tl).as_secs_f64(),
        median(td).as_secs_f64(),
        median(tr).as_secs_f64()
    );
    let rounds = s.pairs;
    vec![
        format!(
            "partitions remote (halos direct) vs local: {:.2}x (local time / remote time, median of {rounds} rounds; target >= 0.95x)",
            median_f64(direct_ratios)
        ),
        format!(
            "partitions remote (halos relayed) vs local: {:.2}x; relayed time / direct time: {:.2}x (median of {rounds} rounds)",
            median_f64(relayed_ratios),
            median_f64(relay_costs)
        ),
    ]
}

// ---------------------------------------------------------------------------------------
// 3. Snapshot pause.

/// Band `b` of the grid as it waits at a barrier: initialized, one phase computed, given its
/// halos (`begin_phase`), its progress rewound.
fn barrier_band(job: &Banded<Heat>, b: u64) -> Band<Heat> {
    let (n, bands) = (job.0.n, job.0.bands);
    let per = n.div_ceil(bands);
    let range = b * per..((b + 1) * per).min(n);
    let input = BandedInput(());
    let mut band = job.chunk(range);
    while let Step::Yield = band.step(job, &input) {}
    band.begin_phase(job, None, None);
    band
}

/// Postcard serializing `states` one after the other on this thread: the median of `runs`.
/// The bytes are kept until the timing ends, as a snapshot keeps them until they are
/// written, so each run serializes into fresh memory.
fn serialize_alone<T: serde::Serialize>(states: &[T], runs: usize) -> (Duration, usize) {
    let mut bytes = 0;
    let times = (0..runs)
        .map(|_| {
            let t = Instant::now();
            let out: Vec<Vec<u8>> = states
                .iter()
                .map(|s| postcard::to_allocvec(s).expect("postcard"))
                .collect();
            let took = t.elapsed();
            bytes = std::hint::black_box(&out).iter().map(Vec::len).sum();
            took
        })
        .collect();
    (median(times), bytes)
}

/// A plain copy of `bytes` bytes, median of `runs`: into a buffer whose pages are mapped
/// already, and into a fresh one (its pages faulted in as the copy touches them).
fn copy_alone(bytes: usize, runs: usize) -> (Duration, Duration) {
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    let mapped = (0..runs)
        .map(|_| {
            let t = Instant::now();
            dst.copy_from_slice(&src);
            std::hint::black_box(&dst);
            t.elapsed()
        })
        .collect();
    let fresh = (0..runs)
        .map(|_| {
            let t = Instant::now();
            let out = src.clone();
            let took = t.elapsed();
            drop(std::hint::black_box(out));
            took
        })
        .collect();
    (median(mapped), median(fresh))
}

/// As the copy into memory already mapped of [`copy_alone`], by two threads at once, each
/// its own `bytes`: what the two processes of the copies bench do at one barrier. The time
/// until both are done, median of `runs`.
fn copy_pair(bytes: usize, runs: usize) -> Duration {
    let mut bufs: Vec<(Vec<u8>, Vec<u8>)> = (0..2)
        .map(|_| (vec![1u8; bytes], vec![0u8; bytes]))
        .collect();
    let took = (0..runs)
        .map(|_| {
            let start = std::sync::Barrier::new(3);
            std::thread::scope(|scope| {
                for (src, dst) in &mut bufs {
                    let start = &start;
                    scope.spawn(move || {
                        start.wait();
                        dst.copy_from_slice(src);
                        std::hint::black_box(&dst);
                    });
                }
                start.wait();
                Instant::now()
            })
            .elapsed()
        })
        .collect();
    median(took)
}

fn pause(s: Sizes, snapshotter: &Snapshotter) -> Vec<String> {
    let snapshots = s.snapshots;
    println!("\n== snapshot pause: 2 local workers, {snapshots} snapshots asked for mid-phase");
    let (url, dir) = folder("pause");
    let job_id = "pause";
    let exec = Executor::builder()
        .local_workers(2)
        .snapshots(&url)
        .job_id(job_id)
        .build()
        .expect("an executor");
    let started = Instant::now();
    let mut log = Phases::watch(started);
    let h = exec
        .submit(Banded(Heat::new(s.n, u64::MAX / 2)))
        .expect("submit");
    // Warm up: both workers hold their bands, and a median phase without snapshots.
    for _ in 0..6 {
        log.next(&h).expect("a phase");
    }
    let _ = snapshotter.snapshot(); // clears earlier pause samples
    let mut asked_in = Vec::new();
    let mut commits = Vec::new();
    for k in 0..snapshots {
        // A few quiet phases, then a request at a point spread over the next phase.
        for _ in 0..3 {
            log.next(&h).expect("a phase");
        }
        let quiet: Vec<Duration> = log.seen[log.seen.len() - 3..]
            .iter()
            .map(|&(_, d, _)| d)
            .collect();
        let offset = median(quiet).mul_f64((k as f64 + 0.5) / snapshots as f64);
        std::thread::sleep(offset);
        let phase = h.progress().phase;
        let t = Instant::now();
        h.snapshot().wait().expect("a snapshot");
        commits.push(t.elapsed());
        asked_in.push(phase);
    }
    for _ in 0..3 {
        log.next(&h).expect("a phase");
    }
    h.cancel();
    let _ = h.wait();
    log.drain();
    // Pause samples by where they were taken: a worker capturing its running band (no `at`
    // label), the marker holding the job's lock (`at` = `marker`), a band that ended before
    // its capture serialized under the lock (`at` = `done`).
    let (mut pauses, mut marker, mut at_done) = (Vec::new(), Vec::new(), Vec::new());
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        if key.key().name() == malleable::metrics::SNAPSHOT_PAUSE {
            if let DebugValue::Histogram(v) = value {
                let at = key
                    .key()
                    .labels()
                    .find(|l| l.key() == "at")
                    .map(|l| l.value().to_owned());
                let into = match at.as_deref() {
                    Some("marker") => &mut marker,
                    Some("done") => &mut at_done,
                    _ => &mut pauses,
                };
                into.extend(
                    v.into_iter()
                        .map(|x| Duration::from_secs_f64(x.into_inner())),
                );
            }
        }
    }

    // From outside: each snapshot phase's time against the median of the others (after the
    // warm-up). A request may land on the barrier; the phase after it is counted too.
    let by_phase: std::collections::BTreeMap<u64, Duration> =
        log.seen.iter().map(|&(p, d, _)| (p, d)).collect();
    let touched = |p: u64| asked_in.iter().any(|&a| p == a || p == a + 1);
    let normal = median(
        by_phase
            .iter()
            .filter(|&(&p, _)| p >= 6 && !touched(p))
            .map(|(_, &d)| d)
            .collect(),
    );
    let stretches: Vec<Duration> = asked_in
        .iter()
        .map(|&a| {
            let extra = |p: u64| {
                by_phase
                    .get(&p)
                    .map_or(Duration::ZERO, |d| d.saturating_sub(normal))
            };
            extra(a) + extra(a + 1)
        })
        .collect();

    for &a in &asked_in {
        println!(
            "phases {a}..{}: {:?} ms",
            a + 5,
            (a..a + 5)
                .map(|p| by_phase
                    .get(&p)
                    .map_or(-1.0, |d| (ms(*d) * 10.0).round() / 10.0))
                .collect::<Vec<_>>()
        );
    }
    // The newest manifest and its parts.
    let found = manifests(&dir, job_id);
    let newest = found.last().expect("a committed manifest");
    let manifest_bytes = std::fs::metadata(newest).expect("the manifest").len();
    let manifest = malleable::snapshot::decode_manifest(&std::fs::read(newest).expect("read"))
        .expect("a manifest");
    let part_bytes: u64 = manifest
        .parts
        .iter()
        .chain(&manifest.kept)
        .map(|p| p.size)
        .sum();
    let part_count = manifest.parts.len() + manifest.kept.len();
    let _ = std::fs::remove_dir_all(&dir);

    // Alone: one worker's half of the grid at a barrier (16 bands), and one band halfway
    // through a phase (its current rows and half of the new ones).
    let job = Banded(Heat::new(s.n, u64::MAX / 2));
    let bands = job.0.bands;
    let half: Vec<Band<Heat>> = (0..bands / 2).map(|b| barrier_band(&job, b)).collect();
    let (half_alone, half_bytes) = serialize_alone(&half, 9);
    let mut running = barrier_band(&job, bands / 4);
    let per = s.n.div_ceil(bands);
    while running.iterations_done().unwrap_or(per) < per / 2 {
        let _ = running.step(&job, &BandedInput(()));
    }
    let rows = running.iterations_done().unwrap_or(0);
    let (band_alone, band_bytes) = serialize_alone(std::slice::from_ref(&running), 15);
    drop(half);

    let pause_p50 = if pauses.is_empty() {
        None
    } else {
        Some(median(pauses.clone()))
    };
    let marker_p50 = (!marker.is_empty()).then(|| median(marker.clone()));
    let stretch = median(stretches.clone());
    println!(
        "snapshots asked for in phases {asked_in:?}; committed after {:?} ms",
        commits.iter().map(|d| ms(*d).round()).collect::<Vec<_>>()
    );
    println!(
        "metric {}: {} samples, p50 {}; one band {rows} rows into its phase ({band_bytes} bytes) \
         serialized alone {:.2} ms",
        malleable::metrics::SNAPSHOT_PAUSE,
        pauses.len(),
        pause_p50.map_or("-".to_owned(), |p| format!("{:.2} ms", ms(p))),
        ms(band_alone)
    );
    println!(
        "metric {} at the marker (the job's lock held while the waiting bands are serialized, \
         every worker that needs it waits): {} samples {:?} ms; at a band's end under the lock: \
         {} samples, p50 {}",
        malleable::metrics::SNAPSHOT_PAUSE,
        marker.len(),
        marker
            .iter()
            .map(|d| (ms(*d) * 10.0).round() / 10.0)
            .collect::<Vec<_>>(),
        at_done.len(),
        if at_done.is_empty() {
            "-".to_owned()
        } else {
            format!("{:.2} ms", ms(median(at_done.clone())))
        }
    );
    println!(
        "phase stretch per snapshot {:?} ms (median phase without {:.2} ms); one worker's half \
         ({} bands, {half_bytes} bytes) serialized alone {:.2} ms",
        stretches
            .iter()
            .map(|d| (ms(*d) * 10.0).round() / 10.0)
            .collect::<Vec<_>>(),
        ms(normal),
        bands / 2,
        ms(half_alone)
    );
    println!(
        "newest manifest: {manifest_bytes} bytes, {part_count} parts of {part_bytes} bytes in all (grid {} bytes)",
        s.n * s.n * 8
    );
    vec![
        format!(
            "partitions snapshot pause (metric, a running band): {} (target <= 1.1x)",
            pause_p50.map_or("no samples".to_owned(), |p| format!(
                "{:.2}x",
                p.as_secs_f64() / band_alone.as_secs_f64()
            ))
        ),
        format!(
            "partitions snapshot pause (metric, the marker's hold, p50): {} (target <= 1.1x)",
            marker_p50.map_or("no samples".to_owned(), |p| format!(
                "{:.2}x a worker's half alone ({:.1} ms / {:.1} ms)",
                p.as_secs_f64() / half_alone.as_secs_f64(),
                ms(p),
                ms(half_alone)
            ))
        ),
        format!(
            "partitions snapshot pause (phase stretch, a worker's half): {:.2}x (target <= 1.1x)",
            stretch.as_secs_f64() / half_alone.as_secs_f64()
        ),
        format!("partitions manifest size: {manifest_bytes} bytes (target < 65536)"),
    ]
}

// ---------------------------------------------------------------------------------------
// 4. Recovery.

/// Part 4. The process is killed right after a snapshot has committed (a new manifest seen
/// at a phase end), so that no cut is open when it dies and the rollback measured is one
/// read, not a wait for a write in flight. (A kill while a cut was open, a snapshot every
/// 20 ms on a small grid, once left the job stuck: the rollback waited for the write in
/// flight and nothing went on with it when the write ended. `tests/it/partitions_kill_stress.rs`
/// kills at such moments.) The snapshot period is long enough for the next cut not to start
/// before the rollback.
fn recovery(s: Sizes, reference: &Solution) -> Vec<String> {
    let phases = s.recovery_phases();
    let kill_at = phases * 6 / 10;
    println!(
        "\n== recovery: 2 worker processes, a snapshot every {:?}, one killed (SIGKILL) from \
         phase {kill_at} of {phases}",
        s.period
    );
    let mut ratios = Vec::new();
    let io = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    for run in 0..s.recoveries {
        let (url, options, env, dir) = recovery_store(run);
        let job_id = format!("recovery-{run}");
        let mut builder = coordinator()
            .snapshots(&url)
            .job_id(&job_id)
            .snapshot_every(s.period)
            // Keeps the snapshot rolled back to, for the reads below.
            .keep_snapshots(1000);
        for (k, v) in &options {
            builder = builder.snapshot_option(k, v);
        }
        let exec = builder.build().expect("a coordinator");
        let store =
            malleable::snapshot::Store::open_with(&url, options.clone()).expect("the store");
        let commits = || io.block_on(store.epochs(&job_id)).map_or(0, |e| e.len());
        let addr = exec.local_addr().expect("listening").to_string();
        let mut workers = [spawn_worker_env(&addr, &env), spawn_worker_env(&addr, &env)];
        std::thread::sleep(Duration::from_millis(if s.quick { 100 } else { 700 }));
        let started = Instant::now();
        let mut log = Phases::watch(started);
        let h = exec.submit(Banded(Heat::new(s.n, phases))).expect("submit");
        let mut killed: Option<Instant> = None;
        let mut back: Option<Instant> = None;
        // Phase ends after the kill: the first is `back`.
        let mut after: Vec<Instant> = Vec::new();
        let mut committed = 0;
        while let Some(e) = log.next(&h) {
            // The kill lands right after a commit, while no cut is open: see `recovery`'s
            // docs for why.
            let now = commits();
            let fresh = now > committed;
            committed = now;
            match killed {
                None if e.phase + 1 >= kill_at && h.remote_workers() == 2 && fresh => {
                    workers[0].kill().expect("SIGKILL");
                    killed = Some(Instant::now());
                    let _ = workers[0].wait();
                    println!("killed one process after phase {}", e.phase);
                }
                Some(k) if e.at > k => {
                    back.get_or_insert(e.at);
                    after.push(e.at);
                }
                _ => {}
            }
        }
        let done = finish(h.clone());
        let _ = workers[1].wait();
        check("recovery", &Heat::solution(&done), reference);
        let killed = killed.expect("the job ended before a snapshot was committed: more phases?");
        let rollbacks = h.rollbacks();
        assert_eq!(rollbacks.len(), 1, "one rollback after one kill");
        let rb = &rollbacks[0];
        let recovered = rb.recovered.expect("a phase done after the rollback");

        // A folder's files read raw (manifest and parts), warm in the page cache.
        let raw = dir.as_ref().map(|dir| {
            let manifest_path = dir
                .join(&job_id)
                .join(format!("{:020}", rb.epoch))
                .join("manifest");
            median(
                (0..5)
                    .map(|_| {
                        let t = Instant::now();
                        let bytes = std::fs::read(&manifest_path).expect("the manifest");
                        let m = malleable::snapshot::decode_manifest(&bytes).expect("a manifest");
                        for p in m.parts.iter().chain(&m.kept) {
                            std::hint::black_box(std::fs::read(dir.join(&p.key)).expect("a part"));
                        }
                        t.elapsed()
                    })
                    .collect(),
            )
        });
        // The target's measure: the same snapshot read from the store through the library,
        // manifest and every part, checksums checked (what a resume reads), warm as well.
        let id = malleable::snapshot::SnapshotId::new(job_id.clone(), rb.epoch);
        let full = median(
            (0..5)
                .map(|_| {
                    let t = Instant::now();
                    let read = io.block_on(store.read(&id)).expect("the snapshot");
                    std::hint::black_box(read);
                    t.elapsed()
                })
                .collect(),
        );
        if let Some(dir) = &dir {
            let _ = std::fs::remove_dir_all(dir);
        }
        // The phase after the one recovered: the restored bands that were done in the
        // snapshot's phase run there first (decoded at the barrier, then sent to the process
        // left), so it is part of the rollback's cost; and a phase on the one process left.
        let gaps: Vec<Duration> = after.windows(2).map(|w| w[1] - w[0]).collect();
        let next = gaps
            .first()
            .map_or("-".to_owned(), |d| format!("{:.1} ms", ms(*d)));
        let steady = if gaps.len() > 2 {
            format!("{:.1} ms", ms(median(gaps[2..].to_vec())))
        } else {
            "-".to_owned()
        };
        println!(
            "run {}: {} partitions lost in phase {}, back to snapshot {} (phase {}): quiet after \
             {:.1} ms, read {:.1} ms, running again {:.1} ms, a phase done again {:.1} ms \
             (from the kill, seen from here: {}), the phase after it {next} (a phase on the \
             process left: {steady}); the snapshot read from the store {:.1} ms (raw read of \
             its files: {}): {:.2}x; check ok",
            run + 1,
            rb.lost.len(),
            rb.from_phase,
            rb.epoch,
            rb.to_phase,
            ms(rb.quiesce),
            ms(rb.read),
            ms(rb.restart),
            ms(recovered),
            back.map_or("-".to_owned(), |b| format!("{:.1} ms", ms(b - killed))),
            ms(full),
            raw.map_or("-".to_owned(), |r| format!("{:.1} ms", ms(r))),
            recovered.as_secs_f64() / full.as_secs_f64().max(1e-9),
        );
        ratios.push(recovered.as_secs_f64() / full.as_secs_f64().max(1e-9));
    }
    vec![format!(
        "partitions recovery: {:.2}x the snapshot read (loss to a phase done again / the snapshot read from the store, median of {}; target <= 1.5x)",
        median_f64(ratios),
        s.recoveries
    )]
}

// ---------------------------------------------------------------------------------------
// 5. Buddy copies.

fn copies(s: Sizes) -> Vec<String> {
    let (phases, every) = if s.quick {
        (
            env_or("PARTITIONS_COPY_PHASES", 12),
            env_or("PARTITIONS_COPY_EVERY", 3),
        )
    } else {
        (
            env_or("PARTITIONS_COPY_PHASES", 100),
            env_or("PARTITIONS_COPY_EVERY", 20),
        )
    };
    println!(
        "\n== buddy copies: 2 worker processes, a copy every {every} phases through memory both \
         map, and over the links, against none, {phases} phases, {} rounds",
        s.pairs
    );
    let job = || Banded(Heat::new(s.n, phases));
    // One run: its time, its phases' times, what the handle says of the copies, the value.
    // `copies`: none, through memory both processes map (the default), or over the links.
    let run = |copies: Copying| {
        let exec = coordinator()
            .buddy_copies(if copies == Copying::None { 0 } else { every })
            .build()
            .expect("a coordinator");
        let addr = exec.local_addr().expect("listening").to_string();
        let env = match copies {
            Copying::Link => vec![("MALLEABLE_SHARED_COPIES".to_owned(), "0".to_owned())],
            _ => Vec::new(),
        };
        let workers = [spawn_worker_env(&addr, &env), spawn_worker_env(&addr, &env)];
        std::thread::sleep(Duration::from_millis(if s.quick { 100 } else { 700 }));
        let t = Instant::now();
        let mut log = Phases::watch(t);
        let h = exec.submit(job()).expect("submit");
        while log.next(&h).is_some() {}
        let done = finish(h.clone());
        let took = t.elapsed();
        log.drain();
        for mut w in workers {
            let _ = w.wait();
        }
        let times: Vec<(u64, Duration)> = log.seen.iter().map(|&(p, d, _)| (p, d)).collect();
        (took, times, h.copies(), Heat::solution(&done))
    };
    // The steady state: the phases from the third copy barrier on (the first two rounds
    // encode into memory the process maps for the first time; from the third on, into the
    // memory of the copies their buddy let go of).
    let steady = |times: &[(u64, Duration)]| -> Duration {
        times
            .iter()
            .filter(|(p, _)| *p >= 2 * every)
            .map(|&(_, d)| d)
            .sum()
    };
    let modes = [Copying::None, Copying::Shared, Copying::Link];
    let mut ratios = [Vec::new(), Vec::new()];
    let mut steadies = [Vec::new(), Vec::new()];
    let mut pauses = [Vec::new(), Vec::new()];
    // Within each run with copies, from the third barrier on: what the phases after a
    // copy barrier took over the run's own median phase, ÷ the run's time from there. This
    // does not see a cost spread over every phase (the halo log), but neither does it see
    // the machine's speed drift between runs, which is larger than the target here.
    let mut direct = [Vec::new(), Vec::new()];
    let mut last = None;
    let mut reference: Option<Solution> = None;
    for round in 0..s.pairs {
        // Each round in another order, so that none runs always first.
        let mut got: [Option<_>; 3] = [None, None, None];
        for k in (0..3).map(|k| (round + k) % 3) {
            got[k] = Some(run(modes[k]));
        }
        let [Some(without), Some(shared), Some(link)] = got else {
            unreachable!("three runs")
        };
        for (_, _, _, value) in [&without, &shared, &link] {
            match &reference {
                Some(r) => check("copies", value, r),
                None => reference = Some(value.clone()),
            }
        }
        // The median phase of the run without copies, past the first few.
        let normal = median(
            without
                .1
                .iter()
                .filter(|(p, _)| *p >= 3)
                .map(|&(_, d)| d)
                .collect(),
        );
        let mut line = format!(
            "round {}: without copies {:.3} s (median phase {:.1} ms)",
            round + 1,
            without.0.as_secs_f64(),
            ms(normal)
        );
        for (i, with) in [&shared, &link].into_iter().enumerate() {
            // Against the run's own median phase: the machine's speed drifts between runs.
            let own = median(
                with.1
                    .iter()
                    .filter(|(p, _)| *p >= 3)
                    .map(|&(_, d)| d)
                    .collect(),
            );
            for &(p, d) in &with.1 {
                if p >= 2 * every && p % every == 0 {
                    pauses[i].push(d.saturating_sub(own));
                }
            }
            let excess: Duration = with
                .1
                .iter()
                .filter(|(p, _)| *p >= 2 * every && p % every == 0)
                .map(|&(_, d)| d.saturating_sub(own))
                .sum();
            direct[i].push(excess.as_secs_f64() / steady(&with.1).as_secs_f64());
            let ratio = with.0.as_secs_f64() / without.0.as_secs_f64();
            let steady_ratio = steady(&with.1).as_secs_f64() / steady(&without.1).as_secs_f64();
            ratios[i].push(ratio);
            steadies[i].push(steady_ratio);
            line += &format!(
                "; {} {:.3} s: {ratio:.3}x, from phase {} {steady_ratio:.3}x",
                ["shared", "over the links"][i],
                with.0.as_secs_f64(),
                2 * every
            );
        }
        println!("{line}; copies {:?}", shared.2);
        last = Some(shared.2);
    }
    // What a process does at a copy barrier, alone: postcard of its half of the grid.
    let heat = Banded(Heat::new(s.n, phases));
    let half: Vec<Band<Heat>> = (0..heat.0.bands / 2)
        .map(|b| barrier_band(&heat, b))
        .collect();
    let (alone, bytes) = serialize_alone(&half, 5);
    let (mapped, fresh) = copy_alone(bytes, 5);
    let pair = copy_pair(bytes, 5);
    let [pause_shared, pause_link] = pauses.clone().map(median);
    println!(
        "pauses after copy barriers from phase {}: shared {:?} ms, over the links {:?} ms; \
         serializing one process's half ({:.0} MB) alone {:.1} ms; copying as many bytes into \
         memory already mapped {:.1} ms (two threads at once, each as many: {:.1} ms), into \
         fresh memory {:.1} ms",
        2 * every,
        pauses[0].iter().map(|&d| ms(d).round()).collect::<Vec<_>>(),
        pauses[1].iter().map(|&d| ms(d).round()).collect::<Vec<_>>(),
        bytes as f64 / 1e6,
        ms(alone),
        ms(mapped),
        ms(pair),
        ms(fresh),
    );
    let c = last.unwrap_or_default();
    let [ratio_shared, ratio_link] = ratios.map(median_f64);
    let [steady_shared, steady_link] = steadies.map(median_f64);
    let [direct_shared, direct_link] = direct.map(median_f64);
    vec![
        format!(
            "buddy copies every {every} phases, shared: run with ÷ without {ratio_shared:.3}x, \
             from phase {} {steady_shared:.3}x (median of {} rounds; target <= 1.03x), the \
             phases after its barriers over the run's median {:.1}%; over the links \
             {ratio_link:.3}x, {steady_link:.3}x, {:.1}%",
            2 * every,
            s.pairs,
            100.0 * direct_shared,
            100.0 * direct_link,
        ),
        format!(
            "buddy copy pause from phase {}, shared: {:.1} ms, {:.2}x copying a process's bytes \
             into memory already mapped (target <= 1.1x), {:.2}x both processes doing so at \
             once (as at a barrier), {:.2}x serializing them alone into fresh memory; over the \
             links {:.1} ms; copies kept {:.0} MB, at most {:.0} MB in one process",
            2 * every,
            ms(pause_shared),
            pause_shared.as_secs_f64() / mapped.as_secs_f64().max(1e-9),
            pause_shared.as_secs_f64() / pair.as_secs_f64().max(1e-9),
            pause_shared.as_secs_f64() / alone.as_secs_f64().max(1e-9),
            ms(pause_link),
            c.bytes as f64 / 1e6,
            c.max_bytes_per_process as f64 / 1e6,
        ),
    ]
}

/// How a run of the copies bench takes its buddy copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Copying {
    None,
    Shared,
    Link,
}

// ---------------------------------------------------------------------------------------
// 6. Local recovery.

fn local_recovery(s: Sizes, phases: u64, reference: &Solution) -> Vec<String> {
    let every = env_or("PARTITIONS_COPY_EVERY", if s.quick { 5 } else { 20 });
    let after = env_or("PARTITIONS_LOCAL_AFTER", if s.quick { 3 } else { 10 });
    println!(
        "\n== local recovery: 4 worker processes, a copy every {every} phases, one killed \
         {after} phases after a copy barrier, against a rollback to a snapshot; {phases} phases"
    );
    // One run: the time from the kill to the next phase done, the phase times before it, and
    // the handle's record of the recovery or the rollback.
    let run = |local: bool| {
        let (url, dir) = folder(if local { "local" } else { "global" });
        let mut builder = coordinator();
        builder = if local {
            builder.buddy_copies(every)
        } else {
            builder
                .snapshots(&url)
                .job_id("local-vs-global")
                .snapshot_every(if s.quick {
                    Duration::from_millis(20)
                } else {
                    s.period
                })
                // Every commit stays, so that each one is seen (a new epoch folder).
                .keep_snapshots(1000)
        };
        let exec = builder.build().expect("a coordinator");
        let addr = exec.local_addr().expect("listening").to_string();
        let mut workers: Vec<Child> = (0..4).map(|_| spawn_worker_env(&addr, &[])).collect();
        std::thread::sleep(Duration::from_millis(if s.quick { 100 } else { 700 }));
        let started = Instant::now();
        let mut log = Phases::watch(started);
        let h = exec.submit(Banded(Heat::new(s.n, phases))).expect("submit");
        // Committed snapshots: epoch folders with their manifest.
        let commits = || manifests(&dir, "local-vs-global").len();
        let (mut committed, mut committed_at) = (0, None);
        let mut killed: Option<(Instant, u64)> = None;
        let mut back: Option<Instant> = None;
        // The first phase end past the phase of the kill (a rollback does phases again).
        let mut caught: Option<Instant> = None;
        // The end of the fifth phase past the kill's: what the phases after it cost too (a
        // copy round for the replayed partitions, partitions moved off the buddy).
        let mut fifth: Option<Instant> = None;
        while let Some(e) = log.next(&h) {
            if let Some((k, at)) = killed {
                if e.at > k && e.phase > at {
                    caught.get_or_insert(e.at);
                }
                if e.at > k && e.phase >= at + 5 {
                    fifth.get_or_insert(e.at);
                }
            }
            match killed {
                None => {
                    // As long after the last copy, or the last commit, both ways.
                    let due = if local {
                        e.phase >= every && (e.phase + 1) % every == after % every
                    } else {
                        let now = commits();
                        if now > committed {
                            committed = now;
                            committed_at = Some(e.phase);
                        }
                        committed_at.is_some_and(|c| e.phase >= c + after)
                    };
                    if due && h.remote_workers() == 4 {
                        if local {
                            println!("copies at the kill: {:?}", h.copies());
                        }
                        workers[0].kill().expect("SIGKILL");
                        let _ = workers[0].wait();
                        killed = Some((Instant::now(), e.phase));
                    }
                }
                Some((k, _)) if e.at > k => {
                    back.get_or_insert(e.at);
                }
                _ => {}
            }
        }
        let done = finish(h.clone());
        for mut w in workers.into_iter().skip(1) {
            let _ = w.wait();
        }
        check("local recovery", &Heat::solution(&done), reference);
        let _ = std::fs::remove_dir_all(&dir);
        let (k, at) = killed.expect("a kill: more phases?");
        let gap = back.expect("a phase after the kill") - k;
        let caught = caught.expect("a phase past the kill's") - k;
        let fifth = fifth.expect("five phases past the kill's") - k;
        let normal = median(
            log.seen
                .iter()
                .filter(|&&(p, _, _)| p >= 3 && p < at)
                .map(|&(_, d, _)| d)
                .collect(),
        );
        (
            gap,
            caught,
            fifth,
            normal,
            h.recoveries(),
            h.rollbacks(),
            at,
        )
    };
    let (mut local_gaps, mut global_gaps, mut global_caught) = (Vec::new(), Vec::new(), Vec::new());
    let (mut local_fifth, mut global_fifth) = (Vec::new(), Vec::new());
    for round in 0..s.pairs {
        let (lg, _, lf, ln, rec, rb, at) = run(true);
        assert!(rb.is_empty(), "a local recovery, not a rollback: {rb:?}");
        let r = rec.first().expect("a recovery");
        println!(
            "round {}: local: killed after phase {at}, {} partitions replayed from phase {} to \
             {} ({} phases) in {:.1} ms; the next phase done {:.1} ms after the kill, the \
             fifth {:.1} ms after it (median phase before {:.1} ms); nothing read from a store",
            round + 1,
            r.lost.len(),
            r.copy_phase,
            r.phase,
            r.phase - r.copy_phase,
            ms(r.took),
            ms(lg),
            ms(lf),
            ms(ln),
        );
        let (gg, gc, gf, gn, _, rb, at) = run(false);
        let r = rb.first().expect("a rollback");
        println!(
            "round {}: global: killed after phase {at}, back to phase {}: a phase done {:.1} ms \
             after the kill, past the kill's phase {:.1} ms after it, the fifth phase past it \
             {:.1} ms (median phase before {:.1} ms); {:.2}x, {:.2}x and {:.2}x the local \
             recovery",
            round + 1,
            r.to_phase,
            ms(gg),
            ms(gc),
            ms(gf),
            ms(gn),
            gg.as_secs_f64() / lg.as_secs_f64().max(1e-9),
            gc.as_secs_f64() / lg.as_secs_f64().max(1e-9),
            gf.as_secs_f64() / lf.as_secs_f64().max(1e-9),
        );
        local_gaps.push(lg);
        global_gaps.push(gg);
        global_caught.push(gc);
        local_fifth.push(lf);
        global_fifth.push(gf);
    }
    let (l, g, c) = (
        median(local_gaps),
        median(global_gaps),
        median(global_caught),
    );
    let (lf, gf) = (median(local_fifth), median(global_fifth));
    vec![format!(
        "local recovery: kill to the next phase {:.1} ms; rolling back: a phase done {:.1} ms ({:.2}x), past the kill's phase {:.1} ms ({:.2}x) (medians of {}; target >= 3x); the fifth phase past the kill's: {:.1} ms local, {:.1} ms rolling back ({:.2}x)",
        ms(l),
        ms(g),
        g.as_secs_f64() / l.as_secs_f64().max(1e-9),
        ms(c),
        c.as_secs_f64() / l.as_secs_f64().max(1e-9),
        s.pairs,
        ms(lf),
        ms(gf),
        gf.as_secs_f64() / lf.as_secs_f64().max(1e-9),
    )]
}
