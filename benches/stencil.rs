//! Grids that live across phases: the executor's owned partitions (`Banded`, from
//! `malleable::rows`) against rayon and the sequential loop, at 1 and 2 threads, on grids
//! much larger than the cache.
//!
//! Kernels (from `examples/kernels/stencil.rs`, the same row update in every variant):
//!
//! - `jacobi`: the heat solver, a five-point Jacobi sweep over `N × N` `f64`s, double-buffered
//!   (two grids of 128 MB at N = 4000); 50 sweeps. Memory-bound: per cell it reads one value
//!   and writes one, with four additions and a multiply in between.
//! - `sor`: the Java Grande Forum's red-black SOR (ω = 1.25, JGF's random grid), `N × N`,
//!   25 red-black iterations = 50 half-sweeps, each a phase that updates half the cells in
//!   place. JGF's own sizes (1000 to 2000, 8 to 32 MB) fit in this machine's 32 MB L3 cache,
//!   which would measure the cache, not the memory the grids of real runs live in; at 4000 the
//!   grid is 128 MB, four times the cache, so each half-sweep streams it from memory.
//!
//! Each kernel runs five ways: `sequential` (the plain loop), `rayon/1` and `rayon/2` (a
//! `ThreadPoolBuilder` pool of 1 or 2 threads; rows or bands of rows with `par_chunks_mut`),
//! and `malleable/1` and `malleable/2` (an executor with 1 or 2 local workers running
//! `Banded(kernel)`, 32 bands of rows; every run is a new job). Every run includes setting the
//! grid up and hashing the final rows (the check below), so all variants do the same work.
//!
//! Every variant runs `STENCIL_RUNS` times (default 5), interleaved round-robin so that drift
//! in machine load hits all of them alike; every run's result is checked bit for bit against
//! the sequential loop's (a hash of each final row and of each phase's scalar), and the
//! median time is reported with the memory bandwidth it implies: 16 bytes per cell per phase
//! (the cell read once and written once; for SOR the half of the cells that are not updated
//! are still read and written back, since they share cache lines with those that are). The
//! write-allocate reads of a Jacobi sweep are not counted, and set-up is in the time, so the
//! figure is a lower bound on the traffic; compare it with about 12 GB/s per core.
//!
//! # Running
//!
//! ```text
//! cargo bench --bench stencil                     # per-run times, the table, the ratios
//! cargo bench --bench stencil -- --ratios         # the table and the ratios only
//! cargo bench --bench stencil -- sor              # one kernel
//! STENCIL_N=2000 STENCIL_PHASES=20 STENCIL_RUNS=3 cargo bench --bench stencil -- --ratios
//! ```
//!
//! The output ends with one line per kernel and thread count, throughput ratios (above 1 means
//! malleable is faster): `stencil jacobi 1 thread: 0.97× rayon`, `stencil jacobi 2 threads:
//! 0.95× rayon` (malleable with N workers against rayon with N threads), and `stencil jacobi
//! 1 worker: 0.98× sequential` (the cost of the machinery). Without `--bench` (as under
//! `cargo test --bench stencil`) the sizes are tiny: a checked pass, not a measurement.

#[path = "../examples/kernels/mod.rs"]
mod kernels;

use std::hint::black_box;
use std::time::{Duration, Instant};

use malleable::{Banded, Executor};
use rayon::{ThreadPool, ThreadPoolBuilder};

use kernels::stencil::Digest;
use kernels::stencil::heat::{self, Heat};
use kernels::stencil::sor::{self, Sor};

/// Bands of rows, for malleable and for rayon's SOR.
const BANDS: u64 = 32;
/// Bytes of memory traffic per cell per phase (see the module docs).
const BYTES_PER_CELL: f64 = 16.0;

/// The sizes of a run.
#[derive(Debug, Clone, Copy)]
struct Sizes {
    /// The grid's side.
    n: usize,
    /// Phases per run: Jacobi sweeps, SOR half-sweeps (rounded down to even).
    phases: u64,
    /// Timed runs per variant.
    runs: usize,
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.replace('_', "").parse().ok())
        .filter(|&v| v > 0)
        .unwrap_or(default)
}

impl Sizes {
    fn new(full: bool) -> Sizes {
        let (n, phases, runs) = if full { (4000, 50, 5) } else { (200, 6, 1) };
        Sizes {
            n: env_or("STENCIL_N", n).max(3) as usize,
            phases: env_or("STENCIL_PHASES", phases).max(2),
            runs: env_or("STENCIL_RUNS", runs) as usize,
        }
    }
}

/// The thread pools and executors, at 1 and 2 threads.
struct Runners {
    rayon: [ThreadPool; 2],
    malleable: [Executor; 2],
}

impl Runners {
    fn new() -> Runners {
        let pool = |n| {
            ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .expect("rayon pool")
        };
        let exec = |n| {
            Executor::builder()
                .local_workers(n)
                .build()
                .expect("executor")
        };
        Runners {
            rayon: [pool(1), pool(2)],
            malleable: [exec(1), exec(2)],
        }
    }
}

/// The five ways to run a kernel, in table order.
const VARIANTS: [&str; 5] = [
    "sequential",
    "rayon/1",
    "rayon/2",
    "malleable/1",
    "malleable/2",
];

/// A kernel: its name, its phases per run, and how to run it each way (`variant` indexes
/// [`VARIANTS`]), down to the digest of its result.
struct Kernel {
    name: &'static str,
    phases: u64,
    run: fn(&Runners, Sizes, usize) -> Digest,
}

fn jacobi(r: &Runners, s: Sizes, variant: usize) -> Digest {
    let (n, phases) = (s.n, s.phases);
    let solution = match variant {
        0 => heat::sequential(n, phases),
        1 | 2 => r.rayon[variant - 1].install(|| heat::rayon(n, phases)),
        _ => {
            let job = Heat {
                bands: BANDS,
                ..Heat::new(n as u64, phases)
            };
            let done = r.malleable[variant - 3]
                .run(Banded(job))
                .expect("the jacobi job");
            Heat::solution(&done)
        }
    };
    // The trace covers every phase's largest change, the last one included.
    solution.digest
}

fn sor(r: &Runners, s: Sizes, variant: usize) -> Digest {
    let (n, iterations) = (s.n, s.phases / 2);
    let solution = match variant {
        0 => sor::sequential(n, iterations),
        1 | 2 => r.rayon[variant - 1].install(|| sor::rayon(n, iterations, BANDS as usize)),
        _ => {
            let job = Sor {
                bands: BANDS,
                ..Sor::new(n as u64, iterations)
            };
            let done = r.malleable[variant - 3]
                .run(Banded(job))
                .expect("the sor job");
            Sor::solution(&done)
        }
    };
    // Drops the grid of the sequential and rayon versions inside the timed run, as the
    // malleable one drops its bands inside its run.
    solution.digest
}

fn kernels(s: Sizes) -> [Kernel; 2] {
    [
        Kernel {
            name: "jacobi",
            phases: s.phases,
            run: jacobi,
        },
        Kernel {
            name: "sor",
            phases: s.phases / 2 * 2,
            run: sor,
        },
    ]
}

/// Median time of each variant over `s.runs` interleaved runs, every result checked against
/// the sequential one.
fn medians(r: &Runners, s: Sizes, k: &Kernel, verbose: bool) -> [Duration; 5] {
    let mut times: [Vec<Duration>; 5] = Default::default();
    let mut expected: Option<Digest> = None;
    for run in 0..s.runs {
        for (v, t) in times.iter_mut().enumerate() {
            let start = Instant::now();
            let digest = black_box((k.run)(r, s, v));
            let took = start.elapsed();
            t.push(took);
            match &expected {
                None => expected = Some(digest),
                Some(e) => {
                    if let Some(row) = digest.first_difference(e) {
                        panic!(
                            "{} {}: row {row} of the final grid differs from the sequential loop's",
                            k.name, VARIANTS[v]
                        );
                    }
                    assert!(
                        digest == *e,
                        "{} {}: the phases' scalars differ from the sequential loop's",
                        k.name,
                        VARIANTS[v]
                    );
                }
            }
            if verbose {
                println!(
                    "  {} run {}: {:<12} {:>8.1} ms",
                    k.name,
                    run + 1,
                    VARIANTS[v],
                    took.as_secs_f64() * 1e3
                );
            }
        }
    }
    times.map(|mut t| {
        t.sort_unstable();
        t[t.len() / 2]
    })
}

/// Measures a kernel: its rows of the table and its ratio lines.
fn measure(r: &Runners, s: Sizes, k: &Kernel, verbose: bool) -> (Vec<String>, Vec<String>) {
    let m = medians(r, s, k, verbose);
    let cells = (s.n * s.n) as f64;
    let rows = m
        .iter()
        .enumerate()
        .map(|(v, t)| {
            let per_phase = t.as_secs_f64() / k.phases as f64;
            format!(
                "| {:<6} | {:<11} | {:>8.3} | {:>8.2} | {:>6.2} |",
                k.name,
                VARIANTS[v],
                t.as_secs_f64(),
                per_phase * 1e3,
                BYTES_PER_CELL * cells / per_phase / 1e9
            )
        })
        .collect();
    let [seq, r1, r2, m1, m2] = m.map(|d| d.as_secs_f64());
    // Throughput ratios are inverse time ratios.
    let ratios = vec![
        format!("stencil {} 1 thread: {:.2}× rayon", k.name, r1 / m1),
        format!("stencil {} 2 threads: {:.2}× rayon", k.name, r2 / m2),
        format!("stencil {} 1 worker: {:.2}× sequential", k.name, seq / m1),
    ];
    (rows, ratios)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let has = |a: &str| args.iter().any(|x| x == a);
    // `cargo bench` passes `--bench`; `cargo test` does not, and wants a quick pass.
    let full = has("--bench") || has("--ratios");
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    if has("--list") {
        return;
    }
    let s = Sizes::new(full);
    let runners = Runners::new();
    let selected: Vec<Kernel> = kernels(s)
        .into_iter()
        .filter(|k| filters.is_empty() || filters.iter().any(|f| k.name.contains(f.as_str())))
        .collect();

    println!(
        "stencil: {n} × {n} f64 ({:.0} MB per grid), {} phases per run ({} SOR iterations), \
         {BANDS} bands; median of {} interleaved runs; {} hardware threads",
        (s.n * s.n * 8) as f64 / 1e6,
        s.phases,
        s.phases / 2,
        s.runs,
        std::thread::available_parallelism().map_or(1, usize::from),
        n = s.n,
    );
    let verbose = !has("--ratios");
    let (mut table, mut ratios) = (Vec::new(), Vec::new());
    for k in &selected {
        if verbose {
            println!("{}:", k.name);
        }
        let (rows, lines) = measure(&runners, s, k, verbose);
        table.extend(rows);
        ratios.extend(lines);
    }
    println!();
    println!("| kernel | variant     | median s | ms/phase |   GB/s |");
    println!("|--------|-------------|---------:|---------:|-------:|");
    for row in table {
        println!("{row}");
    }
    println!();
    for line in ratios {
        println!("{line}");
    }
}
