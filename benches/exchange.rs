//! Partitions that exchange pieces (`Exchange`), against rayon and the sequential loop in the
//! same process: the three kernels of the examples, each checked bit for bit.
//!
//! - `heat3d`: a 7-point Jacobi stencil on an `N³` grid cut in pencils (`Blocks::pencils`)
//!   that exchange faces with their neighbours (`Pattern::Neighbours`).
//! - `cg`: conjugate gradients on a sparse SPD matrix, rows cut in blocks, the search
//!   direction gathered every iteration (`Pattern::Allgather`, read through
//!   `Pieces::concat`).
//! - `ft`: NAS FT's pattern on a 2-D complex grid, FFTs along rows with all-to-all
//!   transposes between them (`Pattern::AllToAll`).
//!
//! Each variant (`sequential`, `rayon/1`, `rayon/2`, `malleable/1`, `malleable/2`,
//! `processes/2`) runs `EXCHANGE_RUNS` times (default 5), interleaved round-robin, every
//! result checked against the sequential one; the medians are printed with the ratios (above
//! 1: malleable faster): `exchange heat3d 2 threads: 0.93× rayon`. The malleable runs include
//! starting the executor and making the partitions; the rayon and sequential runs include
//! setting their data up the same way (the matrix of `cg` is built once, outside every run).
//!
//! `processes/2` is the job run by 2 worker processes (this binary re-executed with
//! `--worker ADDR`, one compute thread each, pieces sent process to process) for a
//! coordinator that computes nothing, on loopback; printed against `malleable/2`, the same
//! job on 2 local threads (`exchange heat3d 2 processes: 0.91× 2 threads`). Its time runs
//! from the job's submission to its result: the processes are started before, wait for the
//! job, and join it in the first milliseconds (their handshake is in the time); the matrix
//! of `cg` is built by each process before (as the local runs find it built).
//! `EXCHANGE_PROCESSES=0` leaves them out.
//!
//! ```text
//! cargo bench --bench exchange
//! EXCHANGE_RUNS=9 cargo bench --bench exchange -- heat3d
//! ```
//!
//! Without `--bench` (as under `cargo test --bench exchange`) the sizes are tiny: a checked
//! pass, not a measurement.

#![allow(clippy::duplicate_mod)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use malleable::cluster::{Registry, WorkerOptions};
use malleable::{Executor, Job};
use rayon::ThreadPoolBuilder;

mod support;

#[path = "../tests/common/log.rs"]
mod log;

#[allow(dead_code)]
#[path = "../examples/heat3d.rs"]
mod heat3d_example;

#[allow(dead_code)]
#[path = "../examples/cg.rs"]
mod cg_example;

#[allow(dead_code)]
#[path = "../examples/ft.rs"]
mod ft_example;

/// A run's result to compare: the trace of its phases' scalars and the hash of each line
/// of its final state (each example's `Digest`; every example includes its own copy of the
/// kernels, so each has its own type).
type Bits = (u64, Vec<u64>);

/// One way to run a kernel: its name and a run that returns its result, and the time it
/// took if the run measures it itself (else the whole call is timed).
type Variant<'a> = (String, Box<dyn Fn() -> (Bits, Option<Duration>) + 'a>);

/// A variant whose whole call is timed.
fn whole<'a>(name: &str, run: impl Fn() -> Bits + 'a) -> Variant<'a> {
    (name.into(), Box::new(move || (run(), None)))
}

/// Runs `$body` with the phase ends of example module `$m`'s kernels watched, and adds the
/// gaps between them (every phase's time but the first's, which makes the partitions) to
/// `$into`, a `RefCell<Vec<Duration>>`.
macro_rules! phase_gaps {
    ($m:ident, $into:expr, $body:expr) => {{
        let ends = $m::kernels::stencil::watch_phases();
        let result = $body;
        let at: Vec<Instant> = ends.try_iter().map(|e| e.at).collect();
        $into
            .borrow_mut()
            .extend(at.windows(2).map(|w| w[1].duration_since(w[0])));
        result
    }};
}

/// The bits of a digest of any example's copy of the kernels.
macro_rules! bits {
    ($d:expr) => {{
        let d = $d;
        (d.trace, d.hashes)
    }};
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(i) = args.iter().position(|a| a == "--worker") {
        let flag = |f: &str| args.iter().any(|a| a == f);
        return worker(&args[i + 1], flag("--bench"), flag("--cg"));
    }
    log::log_if_asked("EXCHANGE_LOG", "coordinator");
    let measuring = args.iter().any(|a| a == "--bench");
    let only: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    let wanted = |k: &str| only.is_empty() || only.iter().any(|o| k.contains(o.as_str()));
    let runs: usize = std::env::var("EXCHANGE_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if measuring { 5 } else { 1 });
    let mut lines = Vec::new();
    if wanted("heat3d") {
        lines.extend(heat3d(measuring, runs));
    }
    if wanted("cg") {
        lines.extend(cg(measuring, runs));
    }
    if wanted("ft") {
        lines.extend(ft(measuring, runs));
    }
    println!();
    for l in lines {
        println!("{l}");
    }
}

/// Runs every variant `runs` times, round-robin; checks each result against the first
/// variant's (the sequential loop); the median time of each.
fn measure(variants: &[Variant<'_>], runs: usize) -> Vec<Duration> {
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); variants.len()];
    let mut reference = None;
    for _ in 0..runs {
        for (i, (name, run)) in variants.iter().enumerate() {
            let t = Instant::now();
            let (got, took) = run();
            times[i].push(took.unwrap_or_else(|| t.elapsed()));
            match &reference {
                None => reference = Some(got),
                Some(r) => assert!(got == *r, "{name} differs from the sequential loop"),
            }
        }
    }
    times
        .into_iter()
        .map(|mut t| {
            t.sort();
            t[t.len() / 2]
        })
        .collect()
}

/// Prints the table of `kernel` and returns its ratio lines.
fn report(kernel: &str, variants: &[Variant<'_>], medians: &[Duration]) -> Vec<String> {
    for ((name, _), t) in variants.iter().zip(medians) {
        println!(
            "| {kernel:<7} | {name:<12} | {:>9.3} ms |",
            t.as_secs_f64() * 1e3
        );
    }
    let at = |name: &str| {
        let i = variants
            .iter()
            .position(|(n, _)| n == name)
            .expect("a variant");
        medians[i].as_secs_f64()
    };
    let mut lines = vec![
        format!(
            "exchange {kernel} 1 thread: {:.2}× rayon",
            at("rayon/1") / at("malleable/1")
        ),
        format!(
            "exchange {kernel} 2 threads: {:.2}× rayon",
            at("rayon/2") / at("malleable/2")
        ),
        format!(
            "exchange {kernel} 1 worker: {:.2}× sequential",
            at("sequential") / at("malleable/1")
        ),
    ];
    if variants.iter().any(|(n, _)| n == PROCESSES) {
        lines.push(format!(
            "exchange {kernel} 2 processes: {:.2}× 2 threads",
            at("malleable/2") / at(PROCESSES)
        ));
    }
    lines
}

/// The phases' times after the first of `malleable/2` and of [`PROCESSES`], all runs
/// together: what a phase costs once the partitions are made, without the job's start and
/// end (with worker processes, the end brings every partition back to the coordinator).
#[derive(Default)]
struct Gaps {
    threads: std::cell::RefCell<Vec<Duration>>,
    processes: std::cell::RefCell<Vec<Duration>>,
}

impl Gaps {
    /// The ratio of the median phases, if both were measured.
    fn line(&self, kernel: &str) -> Option<String> {
        let median = |v: &std::cell::RefCell<Vec<Duration>>| {
            let mut v = v.borrow().clone();
            (!v.is_empty()).then(|| support::percentile(&mut v, 0.5))
        };
        let (t, p) = (median(&self.threads)?, median(&self.processes)?);
        Some(format!(
            "exchange {kernel} 2 processes, median phase after the first: {:.2}× 2 threads \
             ({:.2} ms against {:.2} ms)",
            t.as_secs_f64() / p.as_secs_f64(),
            p.as_secs_f64() * 1e3,
            t.as_secs_f64() * 1e3,
        ))
    }
}

/// The name of the variant run by worker processes.
const PROCESSES: &str = "processes/2";

/// Whether the variants include [`PROCESSES`] (`EXCHANGE_PROCESSES=0` leaves it out).
fn with_processes() -> bool {
    std::env::var("EXCHANGE_PROCESSES").map_or(true, |v| v != "0")
}

/// This binary as a worker process of any of the three jobs, serving the coordinator at
/// `addr` with one compute thread until its job ends. A worker for `cg` (`--cg`) builds its
/// matrix first, as the coordinator's process has it built.
fn worker(addr: &str, measuring: bool, cg: bool) {
    log::log_if_asked("EXCHANGE_LOG", "worker process");
    if cg {
        let spec = cg_example::spec(&cg_args(measuring, 1));
        cg_example::publish(spec, cg_example::kernels::cg::matrix(spec));
    }
    let registry = Registry::new()
        .register::<heat3d_example::Heat3d>()
        .register::<cg_example::Cg>()
        .register::<ft_example::Ft>();
    let options = WorkerOptions::default().threads(1);
    support::serve_until_the_end(addr, &registry, &options);
}

/// `job`, run by 2 worker processes of this binary for a coordinator that computes nothing:
/// the result, and the time from its submission to its result.
fn processes<J: Job>(job: J, measuring: bool) -> (malleable::Finished<J>, Duration) {
    let cg = J::NAME == cg_example::Cg::NAME;
    let (exec, addr) = support::loopback_coordinator();
    let spawn = || -> Child {
        let mut cmd = Command::new(std::env::current_exe().expect("the bench binary"));
        cmd.args(["--worker", &addr]);
        if measuring {
            cmd.arg("--bench");
        }
        if cg {
            cmd.arg("--cg");
        }
        cmd.stdout(Stdio::null()).spawn().expect("a worker process")
    };
    let workers = [spawn(), spawn()];
    // Long enough for both to start and build `cg`'s matrix: they wait for the job.
    std::thread::sleep(Duration::from_millis(if measuring { 400 } else { 100 }));
    let t = Instant::now();
    let h = exec.submit(job).expect("submit");
    // Not `wait`: a thread in `wait` would compute (the executor's thread of last resort).
    // Nor a poll: polling every 200 µs woke this thread some 500 times a run, each time
    // preempting a worker process's compute thread on this 2-core machine. The progress
    // reports come at each phase end (and every 100 ms), the last when the job ends.
    let mut updates = h.progress_updates();
    while updates.next().is_some() {}
    let took = t.elapsed();
    let done = h.wait().expect("the run").finished().expect("finished");
    for mut w in workers {
        let _ = w.wait();
    }
    (done, took)
}

fn pool(threads: usize) -> rayon::ThreadPool {
    ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a rayon pool")
}

fn executor(workers: usize) -> Executor {
    Executor::builder()
        .local_workers(workers)
        .build()
        .expect("an executor")
}

fn heat3d(measuring: bool, runs: usize) -> Vec<String> {
    use heat3d_example::kernels::heat3d::{self, Dims};
    let args = |workers| heat3d_example::Args {
        n: if measuring { 160 } else { 12 },
        cut: [4, 2],
        phases: if measuring { 30 } else { 3 },
        workers,
        processes: false,
    };
    let a = args(1);
    println!(
        "\n== heat3d: {0}³ cells, {1} phases, {2} x {3} pencils",
        a.n, a.phases, a.cut[0], a.cut[1]
    );
    let d = Dims::cube(a.n);
    let gaps = Gaps::default();
    let (p1, p2) = (pool(1), pool(2));
    let (e1, e2) = (executor(1), executor(2));
    let mall = |e: &Executor, w| {
        let done = e
            .run(heat3d_example::job(&args(w)).expect("the job"))
            .expect("the run");
        bits!(heat3d_example::digest(&done))
    };
    let mut variants: Vec<Variant<'_>> = vec![
        whole("sequential", move || {
            bits!(heat3d::sequential(d, a.phases).digest)
        }),
        whole("rayon/1", || {
            bits!(p1.install(|| heat3d::rayon(d, a.phases)).digest)
        }),
        whole("rayon/2", || {
            bits!(p2.install(|| heat3d::rayon(d, a.phases)).digest)
        }),
        whole("malleable/1", || mall(&e1, 1)),
        whole("malleable/2", || {
            phase_gaps!(heat3d_example, gaps.threads, mall(&e2, 2))
        }),
    ];
    if with_processes() {
        variants.push((
            PROCESSES.into(),
            Box::new(|| {
                let job = heat3d_example::job(&args(2)).expect("the job");
                let (done, took) =
                    phase_gaps!(heat3d_example, gaps.processes, processes(job, measuring));
                (bits!(heat3d_example::digest(&done)), Some(took))
            }),
        ));
    }
    let medians = measure(&variants, runs);
    let mut lines = report("heat3d", &variants, &medians);
    lines.extend(gaps.line("heat3d"));
    lines
}

/// The sizes of `cg`, for `workers` local threads.
fn cg_args(measuring: bool, workers: usize) -> cg_example::Args {
    cg_example::Args {
        side: if measuring { 64 } else { 6 },
        iterations: if measuring { 25 } else { 3 },
        blocks: 8,
        workers,
        processes: false,
    }
}

fn cg(measuring: bool, runs: usize) -> Vec<String> {
    use cg_example::kernels::cg;
    let args = |workers| cg_args(measuring, workers);
    let a1 = args(1);
    let spec = cg_example::spec(&a1);
    let m = cg_example::publish(spec, cg::matrix(spec));
    let b = cg::rhs(m.n, spec.seed);
    println!(
        "\n== cg: {} rows, {} entries, {} iterations, {} blocks",
        m.n,
        m.entries(),
        a1.iterations,
        a1.blocks
    );
    let (p1, p2) = (pool(1), pool(2));
    let (e1, e2) = (executor(1), executor(2));
    let mall = |e: &Executor, w| {
        let done = e.run(cg_example::job(&args(w))).expect("the run");
        bits!(cg_example::digest(&done))
    };
    let (it, blocks) = (a1.iterations, a1.blocks);
    let gaps = Gaps::default();
    let mut variants: Vec<Variant<'_>> = vec![
        whole("sequential", || {
            bits!(cg::sequential(&m, &b, it, blocks).digest)
        }),
        whole("rayon/1", || {
            bits!(p1.install(|| cg::rayon(&m, &b, it, blocks)).digest)
        }),
        whole("rayon/2", || {
            bits!(p2.install(|| cg::rayon(&m, &b, it, blocks)).digest)
        }),
        whole("malleable/1", || mall(&e1, 1)),
        whole("malleable/2", || {
            phase_gaps!(cg_example, gaps.threads, mall(&e2, 2))
        }),
    ];
    if with_processes() {
        variants.push((
            PROCESSES.into(),
            Box::new(|| {
                let (done, took) = phase_gaps!(
                    cg_example,
                    gaps.processes,
                    processes(cg_example::job(&args(2)), measuring)
                );
                (bits!(cg_example::digest(&done)), Some(took))
            }),
        ));
    }
    let medians = measure(&variants, runs);
    let mut lines = report("cg", &variants, &medians);
    lines.extend(gaps.line("cg"));
    lines
}

fn ft(measuring: bool, runs: usize) -> Vec<String> {
    use ft_example::kernels::ft;
    let args = |workers| ft_example::Args {
        ny: if measuring { 512 } else { 16 },
        nx: if measuring { 512 } else { 16 },
        steps: if measuring { 8 } else { 2 },
        parts: 8,
        workers,
        processes: false,
    };
    let a1 = args(1);
    let spec = ft_example::spec(&a1);
    println!(
        "\n== ft: {} x {} complex cells, {} steps, {} partitions",
        a1.ny, a1.nx, a1.steps, a1.parts
    );
    let (p1, p2) = (pool(1), pool(2));
    let (e1, e2) = (executor(1), executor(2));
    let mall = |e: &Executor, w| {
        let done = e.run(ft_example::job(&args(w))).expect("the run");
        bits!(ft_example::digest(&done))
    };
    let steps = a1.steps;
    let gaps = Gaps::default();
    let mut variants: Vec<Variant<'_>> = vec![
        whole("sequential", || bits!(ft::sequential(&spec, steps).digest)),
        whole("rayon/1", || {
            bits!(p1.install(|| ft::rayon(&spec, steps)).digest)
        }),
        whole("rayon/2", || {
            bits!(p2.install(|| ft::rayon(&spec, steps)).digest)
        }),
        whole("malleable/1", || mall(&e1, 1)),
        whole("malleable/2", || {
            phase_gaps!(ft_example, gaps.threads, mall(&e2, 2))
        }),
    ];
    if with_processes() {
        variants.push((
            PROCESSES.into(),
            Box::new(|| {
                let (done, took) = phase_gaps!(
                    ft_example,
                    gaps.processes,
                    processes(ft_example::job(&args(2)), measuring)
                );
                (bits!(ft_example::digest(&done)), Some(took))
            }),
        ));
    }
    let medians = measure(&variants, runs);
    let mut lines = report("ft", &variants, &medians);
    lines.extend(gaps.line("ft"));
    lines
}
