//! Heat diffusion on a plate (a Jacobi five-point stencil) as a malleable job whose grid
//! stays on the workers: it grows from one worker to two halfway through, takes a snapshot,
//! is suspended, and is resumed in a new executor with another worker count. The result is
//! checked bit for bit against the sequential loop (and a rayon run) after all of that.
//!
//! The plate is `N × N` cells of `f64`, its top edge held at 1.0 and its other edges at 0.0;
//! each phase is one sweep, double-buffered; its scalar is the largest change of a cell.
//! Submitted as `Banded(Heat)` (see `kernels/stencil.rs`), the grid is cut into 32 bands of
//! rows, each made once and updated in place on the worker that holds it; only the first and
//! last rows of a band cross the barrier.
//!
//! 1. The sequential loop and a rayon run (2 threads) give the reference.
//! 2. The malleable run starts with 1 worker and prints the time of every phase, measured
//!    between the phase ends its `end_phase` reports at the barrier.
//! 3. At half the phases it grows to 2 workers; at 60 % it takes a snapshot; at 70 % it is
//!    suspended (the snapshot of the suspend is committed, the job ends). The phase ends are
//!    printed as this thread reads them, so while it waits for the snapshot the job runs
//!    ahead of the printout, and the suspend lands a few phases later than 70 %: the
//!    requests say in which phase the job really was.
//! 4. A new executor resumes the latest snapshot with `--resume-workers` workers (3) and
//!    finishes; another resumes the 60 % snapshot with 1 worker and finishes too.
//! 5. With worker processes: a new run with 1 local worker and 2 worker processes (this
//!    program re-executed with `--worker ADDR`) takes a snapshot at 30 % of the phases; at
//!    50 % one process is killed with SIGKILL, taking the only copy of its partitions. The
//!    job rolls back to the snapshot by itself and goes on with the local worker and the
//!    process left; the rollback's report says how long it took. At 80 % the process left
//!    is drained with a grace period of 5 s (a spot instance's notice): it hands its
//!    partitions back and leaves, and the program prints how long that took.
//! 6. Every run must give the reference's bits: every row of the final grid (a hash of its
//!    cells' bits) and the largest change of every phase. The program exits non-zero if not.
//!
//! ```text
//! cargo run --release --example heat
//! cargo run --release --example heat -- --n 4000 --phases 400 --resume-workers 1
//! ```
//!
//! Options: `--n N` (1000), `--phases K` (200), `--resume-workers W` (3), `--store URL`
//! (default: a fresh folder under the system's temporary directory), `--timeline FILE`: the
//! timeline of the first run (steps 2 and 3) goes to `FILE`, the one with worker processes
//! (step 5) to `FILE` with `-processes` before its extension; turn either into an HTML
//! report with `cargo run --features cli --bin malleable-report -- FILE`.
//!
//! On a terminal a progress bar (fed by `JobHandle::progress`) follows each run below the
//! phase lines; when the output is not a terminal only the lines are printed.

#[path = "kernels/mod.rs"]
mod kernels;

use std::process::{Command, ExitCode};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use malleable::cluster::{self, Registry, WorkerOptions};
use malleable::{At, Banded, Executor, JobHandle, Outcome};
use rayon::ThreadPoolBuilder;

use kernels::stencil::heat::{self, Heat, Solution};
use kernels::stencil::{PhaseEnd, watch_phases};

type Error = Box<dyn std::error::Error + Send + Sync>;

struct Args {
    n: u64,
    phases: u64,
    resume_workers: usize,
    store: Option<String>,
    timeline: Option<std::path::PathBuf>,
    /// Worker mode: serve the coordinator at this address.
    worker: Option<String>,
}

fn parse_args() -> Result<Args, Error> {
    let mut args = Args {
        n: 1000,
        phases: 200,
        resume_workers: 3,
        store: None,
        timeline: None,
        worker: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--n" => args.n = value()?.replace('_', "").parse()?,
            "--phases" => args.phases = value()?.replace('_', "").parse()?,
            "--resume-workers" => args.resume_workers = value()?.parse()?,
            "--store" => args.store = Some(value()?.trim_end_matches('/').to_owned()),
            "--worker" => args.worker = Some(value()?),
            "--timeline" => args.timeline = Some(value()?.into()),
            other => return Err(format!("unknown argument {other:?} (see the file's docs)").into()),
        }
    }
    if args.n < 3 || args.phases < 10 {
        return Err("need --n of at least 3 and --phases of at least 10".into());
    }
    Ok(args)
}

/// `path` with `suffix` before its extension.
fn with_suffix(path: &std::path::Path, suffix: &str) -> std::path::PathBuf {
    let stem = path.file_stem().unwrap_or_default().to_string_lossy();
    let name = match path.extension() {
        Some(ext) => format!("{stem}{suffix}.{}", ext.to_string_lossy()),
        None => format!("{stem}{suffix}"),
    };
    path.with_file_name(name)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A progress bar over a job's `phases` phases, in thousandths of a phase (hidden when
/// stderr is not a terminal).
fn progress_bar(phases: u64) -> ProgressBar {
    let style = ProgressStyle::with_template(
        "{spinner} {elapsed_precise} {wide_bar} phase {msg} ({percent}%, eta {eta})",
    )
    .expect("a valid template");
    ProgressBar::new(phases * 1000).with_style(style)
}

/// Prints each phase end of the job behind `handle` as it arrives (the time since the
/// previous one, or since `since` for the first), and calls `at_phase` with each; returns
/// when the job has ended and every phase end it reported has been printed. Below the lines,
/// a progress bar over the job's `total` phases, fed by `JobHandle::progress`.
fn follow<J: malleable::Job>(
    handle: &JobHandle<J>,
    phases: &Receiver<PhaseEnd>,
    total: u64,
    since: Instant,
    mut at_phase: impl FnMut(&PhaseEnd) -> Result<(), Error>,
) -> Result<(), Error> {
    let bar = progress_bar(total);
    let result = follow_with(handle, phases, &bar, since, &mut at_phase);
    bar.finish_and_clear();
    result
}

fn follow_with<J: malleable::Job>(
    handle: &JobHandle<J>,
    phases: &Receiver<PhaseEnd>,
    bar: &ProgressBar,
    since: Instant,
    at_phase: &mut impl FnMut(&PhaseEnd) -> Result<(), Error>,
) -> Result<(), Error> {
    let mut last = since;
    loop {
        // The bar counts thousandths of phases: the phase, plus the fraction of it done.
        let p = handle.progress();
        let within = (p.done * 1000).checked_div(p.total).unwrap_or(0);
        bar.set_position(p.phase * 1000 + within);
        bar.set_message(format!("{}/{}", p.phase, bar.length().unwrap_or(0) / 1000));
        match phases.recv_timeout(Duration::from_millis(5)) {
            Ok(e) => {
                // The workers now (none once the job has ended).
                let p = handle.progress();
                let plural = |k: usize| if k == 1 { "" } else { "s" };
                let workers = match (p.local_workers, handle.remote_workers()) {
                    (0, 0) => String::new(),
                    (l, 0) => format!("  ({l} local worker{})", plural(l)),
                    (l, r) => format!(
                        "  ({l} local worker{}, {r} process{})",
                        plural(l),
                        if r == 1 { "" } else { "es" }
                    ),
                };
                bar.suspend(|| {
                    println!(
                        "  phase {:>5}  {:>8.3} ms  max change {:.3e}{workers}",
                        e.phase,
                        ms(e.at.duration_since(last)),
                        e.value,
                    )
                });
                last = e.at;
                at_phase(&e)?;
            }
            Err(RecvTimeoutError::Timeout) if handle.is_finished() => return Ok(()),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return Err("the phase log closed".into()),
        }
    }
}

/// Compares a run with the reference; prints the verdict and returns whether it holds.
fn check(what: &str, got: &Solution, reference: &Solution) -> bool {
    let same_change = got.change.to_bits() == reference.change.to_bits();
    match got.digest.first_difference(&reference.digest) {
        None if got.digest == reference.digest && same_change => {
            println!("check  {what}: ok, bit-identical to the sequential loop");
            true
        }
        None => {
            println!(
                "check  {what}: FAILED: the grid is the same but the phases' largest changes \
                 differ (trace {:016x}, expected {:016x})",
                got.digest.trace, reference.digest.trace
            );
            false
        }
        Some(row) => {
            println!(
                "check  {what}: FAILED: row {row} of the final grid differs from the \
                 sequential loop's ({} rows compared)",
                reference.digest.hashes.len()
            );
            false
        }
    }
}

fn main() -> ExitCode {
    let start = |args: Args| match &args.worker {
        Some(addr) => worker(addr),
        None => run(&args),
    };
    match parse_args().and_then(start) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<bool, Error> {
    let (n, phases) = (args.n, args.phases);
    println!(
        "heat: a {n} × {n} plate, {phases} Jacobi sweeps ({:.1} MB per grid, two grids)",
        (n * n * 8) as f64 / 1e6
    );

    let t = Instant::now();
    let reference = heat::sequential(n as usize, phases);
    let t_seq = t.elapsed();
    println!(
        "sequential  {:>8.3} s  ({:.3} ms per phase, last max change {:.3e})",
        t_seq.as_secs_f64(),
        ms(t_seq) / phases as f64,
        reference.change
    );

    let pool = ThreadPoolBuilder::new().num_threads(2).build()?;
    let t = Instant::now();
    let by_rayon = pool.install(|| heat::rayon(n as usize, phases));
    let t_rayon = t.elapsed();
    println!(
        "rayon (2)   {:>8.3} s  ({:.3} ms per phase)",
        t_rayon.as_secs_f64(),
        ms(t_rayon) / phases as f64
    );
    let mut ok = check("rayon", &by_rayon, &reference);

    // The malleable run: 1 worker, then 2, a snapshot, a suspend.
    let url = match &args.store {
        Some(url) => url.clone(),
        None => {
            let dir = std::env::temp_dir().join(format!("malleable-heat-{}", std::process::id()));
            format!("file://{}", dir.display())
        }
    };
    let (grow_at, snapshot_at, suspend_at) = (phases / 2, phases * 6 / 10, phases * 7 / 10);
    println!(
        "\nmalleable: 1 worker; 2 from phase {grow_at}; a snapshot from phase {snapshot_at}; a \
         suspend from phase {suspend_at} (store {url})"
    );
    let log = watch_phases();
    let mut builder = Executor::builder().local_workers(1).snapshots(url.clone());
    if let Some(path) = &args.timeline {
        builder = builder.timeline(path);
    }
    let exec = builder.build()?;
    let started = Instant::now();
    let handle = exec.submit(Banded(Heat::new(n, phases)))?;
    let mut snapshot = None;
    let mut suspended = false;
    follow(&handle, &log, phases, started, |e| {
        let done = e.phase + 1;
        if done == grow_at {
            handle.set_local_workers(2);
            println!("  -> 2 local workers");
        }
        // Phase ends are printed as they are read; the phase the job is really in is the
        // progress's. The snapshot is waited for on a thread of its own: while this one
        // waited, the job ran on without the printout, and on short phases it ended before
        // the suspend below was asked for.
        if done >= snapshot_at && snapshot.is_none() {
            let (t, during) = (Instant::now(), handle.progress().phase);
            let request = handle.snapshot();
            println!("  -> snapshot requested in phase {during}");
            snapshot = Some(std::thread::spawn(move || (request.wait(), t.elapsed())));
        }
        if done >= suspend_at && !suspended {
            let (t, during) = (Instant::now(), handle.progress().phase);
            let id = handle.suspend().wait()?;
            println!(
                "  -> suspend requested in phase {during}: snapshot {id} committed {:.1} ms \
                 later, the job has ended",
                ms(t.elapsed())
            );
            suspended = true;
        }
        Ok(())
    })?;
    let first_part = started.elapsed();
    let latest = match handle.wait()? {
        Outcome::Suspended(id) => id,
        Outcome::Finished(_) => {
            return Err(format!(
                "the job finished before it was suspended (its {phases} phases are too quick: \
                 more --phases?)"
            )
            .into());
        }
        _ => return Err("an unknown outcome".into()),
    };
    let (snapshot, took) = snapshot
        .ok_or("no snapshot was taken")?
        .join()
        .map_err(|_| "the thread waiting for the snapshot panicked")?;
    let snapshot = snapshot?;
    println!(
        "  -> snapshot {snapshot} committed {:.1} ms after it was requested (the job went on \
         meanwhile)",
        ms(took)
    );

    // Resume the suspend's snapshot with another worker count.
    println!(
        "\nresume {latest} with {} local worker{}",
        args.resume_workers,
        if args.resume_workers == 1 { "" } else { "s" }
    );
    let resumed_at = Instant::now();
    let handle = Executor::builder()
        .local_workers(args.resume_workers)
        .build()?
        .resume::<Banded<Heat>>(&url, At::Latest)?;
    println!("resumed in phase {}", handle.progress().phase);
    follow(&handle, &log, phases, resumed_at, |_| Ok(()))?;
    let second_part = resumed_at.elapsed();
    let done = handle
        .wait()?
        .finished()
        .ok_or("the resumed job did not finish")?;
    if done.job.0.phase != phases {
        return Err(format!("the resumed job ended after {} phases", done.job.0.phase).into());
    }
    println!(
        "malleable   {:>8.3} s  (1 → 2 workers, snapshot, suspend: {:.3} s; resumed with {}: {:.3} s)",
        (first_part + second_part).as_secs_f64(),
        first_part.as_secs_f64(),
        args.resume_workers,
        second_part.as_secs_f64()
    );
    ok &= check(
        "malleable, suspended and resumed",
        &Heat::solution(&done),
        &reference,
    );

    // And the earlier snapshot, taken while the job ran, with a single worker.
    println!("\nresume {snapshot} with 1 local worker");
    let resumed_at = Instant::now();
    let handle = Executor::builder()
        .local_workers(1)
        .build()?
        .resume::<Banded<Heat>>(&url, At::Epoch(snapshot.epoch))?;
    println!("resumed in phase {}", handle.progress().phase);
    follow(&handle, &log, phases, resumed_at, |_| Ok(()))?;
    let done = handle
        .wait()?
        .finished()
        .ok_or("the job resumed from the snapshot did not finish")?;
    println!(
        "malleable   {:>8.3} s  (from the snapshot, 1 worker)",
        resumed_at.elapsed().as_secs_f64()
    );
    ok &= check(
        "malleable, resumed from the snapshot",
        &Heat::solution(&done),
        &reference,
    );

    ok &= with_processes(args, &url, &log, &reference)?;

    if args.store.is_none() {
        if let Some(dir) = url.strip_prefix("file://") {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
    println!(
        "\n{}",
        if ok {
            "all runs give the sequential loop's bits"
        } else {
            "FAILED"
        }
    );
    Ok(ok)
}

/// Worker mode: serve the coordinator at `addr` with one thread until the job ends.
fn worker(addr: &str) -> Result<bool, Error> {
    let options = WorkerOptions::from_env()?.threads(1);
    let registry = Registry::new().register::<Banded<Heat>>();
    cluster::serve(addr, &registry, options)?;
    Ok(true)
}

/// Step 5: 1 local worker and 2 worker processes; a snapshot at 30 %, one process killed at
/// 50 %; the job rolls back by itself and must still give the reference's bits.
fn with_processes(
    args: &Args,
    url: &str,
    log: &Receiver<PhaseEnd>,
    reference: &Solution,
) -> Result<bool, Error> {
    let phases = args.phases;
    let (snapshot_at, kill_at) = (phases * 3 / 10, phases / 2);
    println!(
        "\nwith worker processes: 1 local worker and 2 processes; a snapshot from phase \
         {snapshot_at}; one process killed at phase {kill_at}"
    );
    let mut builder = Executor::builder()
        .local_workers(1)
        .listen("127.0.0.1:0")
        .snapshots(url)
        .job_id("heat-with-processes");
    if let Some(path) = &args.timeline {
        builder = builder.timeline(with_suffix(path, "-processes"));
    }
    let exec = builder.build()?;
    let addr = exec.local_addr().ok_or("no listening address")?.to_string();
    let exe = std::env::current_exe()?;
    let spawn = || Command::new(&exe).args(["--worker", &addr]).spawn();
    let started = Instant::now();
    let handle = exec.submit(Banded(Heat::new(args.n, phases)))?;
    let mut workers = [spawn()?, spawn()?];
    let (mut snapshot, mut killed) = (None, false);
    let drain_at = phases * 8 / 10;
    let mut drained: Option<Instant> = None;
    let mut left: Option<Duration> = None;
    follow(&handle, log, phases, started, |e| {
        let done = e.phase + 1;
        if done >= snapshot_at && snapshot.is_none() {
            // Both processes hold partitions before the snapshot (they join within a few
            // phases; the job runs on meanwhile).
            let t = Instant::now();
            while handle.remote_workers() < 2 && t.elapsed() < Duration::from_secs(30) {
                std::thread::sleep(Duration::from_millis(1));
            }
            let id = handle.snapshot().wait()?;
            println!(
                "  -> snapshot {id} ({} worker processes)",
                handle.remote_workers()
            );
            snapshot = Some(id);
        }
        if done >= kill_at && !killed && snapshot.is_some() {
            let victim = &mut workers[0];
            victim.kill()?;
            victim.wait()?;
            println!("  -> worker process {} killed (SIGKILL)", victim.id());
            killed = true;
        }
        if done >= drain_at && killed && drained.is_none() && handle.rollbacks().len() == 1 {
            let n = handle.drain_remote(1, Duration::from_secs(5));
            println!("  -> {n} worker process drained with a grace period of 5 s");
            drained = Some(Instant::now());
        }
        if let (Some(t), None) = (drained, left) {
            if workers[1].try_wait()?.is_some() {
                left = Some(t.elapsed());
            }
        }
        Ok(())
    })?;
    let done = handle
        .clone()
        .wait()?
        .finished()
        .ok_or("the job with worker processes did not finish")?;
    for w in &mut workers[1..] {
        w.wait()?;
    }
    match (drained, left) {
        (Some(_), Some(d)) => println!(
            "drain      the process handed its partitions back and exited {:.1} ms after the \
             notice (grace period 5 s)",
            ms(d)
        ),
        (Some(_), None) => println!("drain      the process exited after the job's end"),
        _ => {}
    }
    println!(
        "malleable   {:>8.3} s  (1 local worker, 2 processes, one killed)",
        started.elapsed().as_secs_f64()
    );
    let rollbacks = handle.rollbacks();
    for r in &rollbacks {
        println!(
            "rollback   partitions of chunks {:?} lost in phase {}; back to snapshot {} (phase \
             {}): quiet after {:.1} ms, snapshot read in {:.1} ms, running again after {:.1} ms, \
             a phase done again after {}",
            r.lost,
            r.from_phase,
            r.epoch,
            r.to_phase,
            ms(r.quiesce),
            ms(r.read),
            ms(r.restart),
            r.recovered
                .map_or("(none)".to_owned(), |d| format!("{:.1} ms", ms(d))),
        );
        if let Some(rec) = r.recovered {
            println!(
                "rollback   recovery / snapshot read: {:.2}x",
                rec.as_secs_f64() / r.read.as_secs_f64().max(1e-9)
            );
        }
    }
    let mut ok = check(
        "malleable with worker processes, one killed",
        &Heat::solution(&done),
        reference,
    );
    if killed && rollbacks.len() != 1 {
        println!(
            "check  FAILED: {} rollbacks after one killed process",
            rollbacks.len()
        );
        ok = false;
    }
    Ok(ok)
}
