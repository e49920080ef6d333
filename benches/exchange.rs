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
//! Each variant (`sequential`, `rayon/1`, `rayon/2`, `malleable/1`, `malleable/2`) runs
//! `EXCHANGE_RUNS` times (default 5), interleaved round-robin, every result checked against
//! the sequential one; the medians are printed with the ratios (above 1: malleable faster):
//! `exchange heat3d 2 threads: 0.93× rayon`. The malleable runs include starting the
//! executor and making the partitions; the rayon and sequential runs include setting their
//! data up the same way (the matrix of `cg` is built once, outside every run).
//!
//! ```text
//! cargo bench --bench exchange
//! EXCHANGE_RUNS=9 cargo bench --bench exchange -- heat3d
//! ```
//!
//! Without `--bench` (as under `cargo test --bench exchange`) the sizes are tiny: a checked
//! pass, not a measurement.

#![allow(clippy::duplicate_mod)]

use std::time::{Duration, Instant};

use malleable::Executor;
use rayon::ThreadPoolBuilder;

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

/// One way to run a kernel: its name and a run that returns its result.
type Variant<'a> = (String, Box<dyn Fn() -> Bits + 'a>);

/// The bits of a digest of any example's copy of the kernels.
macro_rules! bits {
    ($d:expr) => {{
        let d = $d;
        (d.trace, d.hashes)
    }};
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
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
            let got = run();
            times[i].push(t.elapsed());
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
    vec![
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
    ]
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
    let (p1, p2) = (pool(1), pool(2));
    let (e1, e2) = (executor(1), executor(2));
    let mall = |e: &Executor, w| {
        let done = e
            .run(heat3d_example::job(&args(w)).expect("the job"))
            .expect("the run");
        bits!(heat3d_example::digest(&done))
    };
    let variants: Vec<Variant<'_>> = vec![
        (
            "sequential".into(),
            Box::new(move || bits!(heat3d::sequential(d, a.phases).digest)),
        ),
        (
            "rayon/1".into(),
            Box::new(|| bits!(p1.install(|| heat3d::rayon(d, a.phases)).digest)),
        ),
        (
            "rayon/2".into(),
            Box::new(|| bits!(p2.install(|| heat3d::rayon(d, a.phases)).digest)),
        ),
        ("malleable/1".into(), Box::new(|| mall(&e1, 1))),
        ("malleable/2".into(), Box::new(|| mall(&e2, 2))),
    ];
    let medians = measure(&variants, runs);
    report("heat3d", &variants, &medians)
}

fn cg(measuring: bool, runs: usize) -> Vec<String> {
    use cg_example::kernels::cg;
    let args = |workers| cg_example::Args {
        side: if measuring { 64 } else { 6 },
        iterations: if measuring { 25 } else { 3 },
        blocks: 8,
        workers,
        processes: false,
    };
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
    let variants: Vec<Variant<'_>> = vec![
        (
            "sequential".into(),
            Box::new(|| bits!(cg::sequential(&m, &b, it, blocks).digest)),
        ),
        (
            "rayon/1".into(),
            Box::new(|| bits!(p1.install(|| cg::rayon(&m, &b, it, blocks)).digest)),
        ),
        (
            "rayon/2".into(),
            Box::new(|| bits!(p2.install(|| cg::rayon(&m, &b, it, blocks)).digest)),
        ),
        ("malleable/1".into(), Box::new(|| mall(&e1, 1))),
        ("malleable/2".into(), Box::new(|| mall(&e2, 2))),
    ];
    let medians = measure(&variants, runs);
    report("cg", &variants, &medians)
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
    let variants: Vec<Variant<'_>> = vec![
        (
            "sequential".into(),
            Box::new(|| bits!(ft::sequential(&spec, steps).digest)),
        ),
        (
            "rayon/1".into(),
            Box::new(|| bits!(p1.install(|| ft::rayon(&spec, steps)).digest)),
        ),
        (
            "rayon/2".into(),
            Box::new(|| bits!(p2.install(|| ft::rayon(&spec, steps)).digest)),
        ),
        ("malleable/1".into(), Box::new(|| mall(&e1, 1))),
        ("malleable/2".into(), Box::new(|| mall(&e2, 2))),
    ];
    let medians = measure(&variants, runs);
    report("ft", &variants, &medians)
}
