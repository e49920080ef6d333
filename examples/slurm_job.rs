//! A malleable job in a Slurm batch allocation: it runs until it finishes or until the
//! allocation ends, suspends to its snapshot store in time, and goes on in the next
//! allocation, with whatever worker count that one has. `examples/slurm/job.sbatch` is the
//! batch script that runs it; copy both.
//!
//! The job is the heat plate of `examples/heat.rs` (a Jacobi sweep per phase over a grid
//! cut into bands of rows that stay on their workers), under its own name, `heat-slurm`.
//!
//! 1. If the store holds a committed snapshot of the job id, it is resumed (any worker
//!    count); otherwise the job starts from phase 0.
//! 2. The executor suspends the job on SIGUSR1 or SIGTERM (`suspend_on_signals`: the batch
//!    script asks Slurm for `--signal=B:USR1@120`, and Slurm sends SIGTERM at the limit
//!    anyway) and before the end of the allocation (`deadline`, read with
//!    `malleable::slurm::allocation_deadline`), whichever comes first.
//! 3. With `--processes K`, it also listens for worker processes and starts K of them with
//!    `srun` inside the allocation (this program in worker mode, `--worker ADDR`, one job
//!    step each).
//! 4. Suspended: it prints the snapshot and exits 0; submit the script again to go on.
//!    Finished: it prints the result and, with `--check`, compares it bit for bit with the
//!    plain sequential loop (every row of the final grid and the largest change of every
//!    phase); it exits 1 if they differ.
//!
//! ```text
//! sbatch examples/slurm/job.sbatch                   # the first part
//! sbatch examples/slurm/job.sbatch                   # and the next, until it finishes
//! cargo run --release --example slurm_job -- --store file:///tmp/heat --check   # no Slurm
//! ```
//!
//! Options: `--store URL` (required), `--job-id ID` (`heat-slurm`), `--n N` (256: an
//! `N × N` plate), `--phases K` (2000), `--workers W` (local worker threads, 1),
//! `--processes K` (0), `--launch TEMPLATE` (the launcher's command, by default
//! `malleable::slurm::SRUN_LAUNCH`: `srun --ntasks=1 --exact {bin} --worker {addr}`),
//! `--no-deadline` (do not read the allocation's end time: only a signal suspends),
//! `--check`.
//!
//! The environment variable [`PACE_ENV`] (milliseconds) slows down each process that has
//! it: the worker that holds the plate's first row sleeps that long in every phase. Tests
//! use it to make a first part last longer than its signal takes to arrive; it never
//! changes the value, and a resumed part without it runs at full speed.

#[path = "kernels/mod.rs"]
mod kernels;

use std::process::ExitCode;
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime};

use malleable::cluster::{self, CommandLauncher, Registry, WorkerOptions};
use malleable::reduce::Max;
use malleable::rows::{Rows, Window};
use malleable::snapshot::Store;
use malleable::{At, Banded, Executor, Next, Outcome, slurm};
use serde::{Deserialize, Serialize};

use kernels::stencil::heat::{self, Heat, Solution};
use kernels::stencil::{Checked, Digest, Report, trace};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// Milliseconds the worker holding row 0 sleeps per phase, in processes that have it.
const PACE_ENV: &str = "HEAT_SLURM_PACE_MS";

struct Args {
    store: Option<String>,
    job_id: String,
    n: u64,
    phases: u64,
    workers: usize,
    processes: usize,
    launch: String,
    deadline: bool,
    check: bool,
    /// Worker mode: serve the coordinator at this address.
    worker: Option<String>,
}

fn parse_args() -> Result<Args, Error> {
    let mut args = Args {
        store: None,
        job_id: "heat-slurm".to_owned(),
        n: 256,
        phases: 2000,
        workers: 1,
        processes: 0,
        launch: slurm::SRUN_LAUNCH.to_owned(),
        deadline: true,
        check: false,
        worker: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--store" => args.store = Some(value()?.trim_end_matches('/').to_owned()),
            "--job-id" => args.job_id = value()?,
            "--n" => args.n = value()?.replace('_', "").parse()?,
            "--phases" => args.phases = value()?.replace('_', "").parse()?,
            "--workers" => args.workers = value()?.parse()?,
            "--processes" => args.processes = value()?.parse()?,
            "--launch" => args.launch = value()?,
            "--no-deadline" => args.deadline = false,
            "--check" => args.check = true,
            "--worker" => args.worker = Some(value()?),
            other => return Err(format!("unknown argument {other:?} (see the file's docs)").into()),
        }
    }
    if args.n < 3 || args.phases == 0 {
        return Err("need --n of at least 3 and at least one phase".into());
    }
    Ok(args)
}

// ---------------------------------------------------------------------------------------
// The job: the heat plate, paced in processes that ask for it.

/// The heat plate under this program's own name (a snapshot names its job type).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Plate(Heat);

/// This process's pace, read once from [`PACE_ENV`].
fn pace() -> Duration {
    static PACE: OnceLock<Duration> = OnceLock::new();
    *PACE.get_or_init(|| {
        std::env::var(PACE_ENV)
            .ok()
            .and_then(|ms| ms.parse().ok())
            .map_or(Duration::ZERO, Duration::from_millis)
    })
}

impl Rows for Plate {
    const NAME: &'static str = "heat-slurm";
    type Element = f64;
    type Acc = Report<f64>;
    type Reducer = Checked<Max<f64>>;
    type Input = ();

    fn height(&self) -> u64 {
        self.0.height()
    }
    fn width(&self) -> usize {
        self.0.width()
    }
    fn bands(&self) -> u64 {
        self.0.bands()
    }
    fn reducer(&self) -> Checked<Max<f64>> {
        self.0.reducer()
    }
    fn init(&self, input: &(), i: u64, row: &mut [f64]) {
        self.0.init(input, i, row);
    }
    fn update(&self, input: &(), i: u64, window: Window<'_, f64>, acc: &mut Report<f64>) {
        if i == 0 && !pace().is_zero() {
            std::thread::sleep(pace());
        }
        self.0.update(input, i, window, acc);
    }
    fn end_phase(&mut self, report: &Report<f64>) -> Next {
        self.0.end_phase(report)
    }
}

// ---------------------------------------------------------------------------------------

fn main() -> ExitCode {
    let start = |args: Args| match &args.worker {
        Some(addr) => worker(addr),
        None => run(&args),
    };
    match parse_args().and_then(start) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("slurm_job: error: {}", chain(&*e));
            ExitCode::FAILURE
        }
    }
}

/// Worker mode: one thread per CPU of this job step, until the job ends.
fn worker(addr: &str) -> Result<bool, Error> {
    let threads = std::env::var("SLURM_CPUS_PER_TASK")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(1);
    println!(
        "slurm_job: worker process {} (job {}, step {}, node {}) dials {addr} with {threads} \
         thread{}",
        std::process::id(),
        env_or_none("SLURM_JOB_ID"),
        env_or_none("SLURM_STEP_ID"),
        env_or_none("SLURMD_NODENAME"),
        if threads == 1 { "" } else { "s" }
    );
    let options = WorkerOptions::from_env()?
        .threads(threads)
        .stop_on_signals();
    let registry = Registry::new().register::<Banded<Plate>>();
    cluster::serve(addr, &registry, options)?;
    Ok(true)
}

fn env_or_none(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| "none".to_owned())
}

fn run(args: &Args) -> Result<bool, Error> {
    let url = args
        .store
        .clone()
        .ok_or("--store URL is required (the batch script passes one)")?;
    let mut builder = Executor::builder()
        .local_workers(args.workers)
        .snapshots(url.clone())
        .job_id(args.job_id.clone())
        .suspend_on_signals();
    if args.deadline {
        match slurm::allocation_deadline() {
            Ok(end) => {
                let left = end.duration_since(SystemTime::now()).unwrap_or_default();
                println!(
                    "slurm_job: deadline: the allocation ends in {} s",
                    left.as_secs()
                );
                builder = builder.deadline(end);
            }
            // Outside an allocation, or with no time limit: only a signal suspends.
            Err(e) => println!("slurm_job: no deadline: {}", chain(&e)),
        }
    }
    if args.processes > 0 {
        // The node's name, so that workers on other nodes of the allocation can dial it; a
        // token is then needed (the batch script makes one, srun passes it to the steps).
        let host = std::env::var("SLURMD_NODENAME").unwrap_or_else(|_| "localhost".to_owned());
        builder = builder
            .listen(format!("{host}:0"))
            .launcher(CommandLauncher::new(&args.launch)?);
    }
    let exec = builder.build()?;

    let started = Instant::now();
    let latest = latest_snapshot(&url, &args.job_id)?;
    let handle = match &latest {
        Some(id) => {
            let handle = exec.resume::<Banded<Plate>>(&url, At::Latest)?;
            println!(
                "slurm_job: resuming {id} in phase {} with {} local worker{}",
                handle.progress().phase,
                args.workers,
                if args.workers == 1 { "" } else { "s" }
            );
            handle
        }
        None => {
            println!(
                "slurm_job: starting {} ({} phases of a {n} × {n} plate) with {} local \
                 worker{}",
                args.job_id,
                args.phases,
                args.workers,
                if args.workers == 1 { "" } else { "s" },
                n = args.n,
            );
            exec.submit(Banded(Plate(Heat::new(args.n, args.phases))))?
        }
    };
    if args.processes > 0 {
        handle.scale_remote(args.processes)?;
        println!(
            "slurm_job: started {} worker process{} with `{}`, listening on {}",
            args.processes,
            if args.processes == 1 { "" } else { "es" },
            args.launch,
            exec.local_addr().map_or("?".to_owned(), |a| a.to_string()),
        );
    }
    // From here on SIGUSR1 and SIGTERM suspend the job (the handlers are installed by the
    // first submit or resume).
    println!("slurm_job: running, pid {}", std::process::id());
    // The most worker processes seen at once, for the printout.
    let mut joined = 0;
    while !handle.is_finished() {
        joined = joined.max(handle.remote_workers());
        std::thread::sleep(Duration::from_millis(20));
    }
    if args.processes > 0 {
        println!("slurm_job: worker processes joined: {joined}");
    }
    let outcome = handle.wait()?;
    let elapsed = started.elapsed().as_secs_f64();
    match outcome {
        Outcome::Suspended(id) => {
            println!(
                "slurm_job: suspended to {id} after {elapsed:.1} s; submit the script again \
                 to go on"
            );
            Ok(true)
        }
        Outcome::Finished(done) => {
            let plate = &done.job.0.0;
            let got = Solution {
                digest: Digest {
                    trace: plate.trace,
                    hashes: done.value.hashes.clone(),
                },
                change: plate.change,
            };
            println!(
                "slurm_job: finished after {} phases ({elapsed:.1} s for this part): {}",
                plate.phase,
                show(&got)
            );
            if !args.check {
                return Ok(true);
            }
            let reference = heat::sequential(plate.n as usize, plate.phases);
            println!("slurm_job: sequential loop: {}", show(&reference));
            let same = got.digest == reference.digest
                && got.change.to_bits() == reference.change.to_bits();
            println!(
                "slurm_job: check {}",
                if same {
                    "ok: bit-identical to the sequential loop"
                } else {
                    "FAILED: not the sequential loop's bits"
                }
            );
            Ok(same)
        }
        _ => Err("an unknown outcome".into()),
    }
}

/// The newest committed snapshot of `job_id` in the store at `url`, if any.
fn latest_snapshot(
    url: &str,
    job_id: &str,
) -> Result<Option<malleable::snapshot::SnapshotId>, Error> {
    let store = Store::open(url)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    Ok(runtime.block_on(store.latest(job_id))?)
}

/// A result as one line: the last phase's largest change, the trace of all of them, and a
/// hash of the row hashes of the final grid.
fn show(s: &Solution) -> String {
    let rows = s
        .digest
        .hashes
        .iter()
        .fold(Digest::EMPTY_TRACE, |h, &r| trace(h, f64::from_bits(r)));
    format!(
        "change {:016x} trace {:016x} rows {:016x} ({} rows)",
        s.change.to_bits(),
        s.digest.trace,
        rows,
        s.digest.hashes.len()
    )
}

/// An error and its causes, on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut shown = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        shown.push_str(&format!(": {c}"));
        cause = c.source();
    }
    shown
}
