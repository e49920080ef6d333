//! The Java Grande Forum SOR benchmark (section 2, thread version: red-black successive
//! over-relaxation) as a malleable job whose grid stays on the workers, checked against
//! JGF's own reference value and, bit for bit, against the sequential loop.
//!
//! The grid is JGF's: `n × n` cells from `java.util.Random(10101010)`, 100 red-black
//! iterations with ω = 1.25 (see `kernels/stencil.rs`, module `sor`). Each half-sweep is one
//! phase ([`Sweep::InPlace`](malleable::rows::Sweep::InPlace)), 200 phases in all.
//!
//! Checks:
//!
//! 1. The sequential loop's `Gtotal` (JGF's: the interior cells summed in row-major order)
//!    is within JGF's tolerance (1e-12) of the thread suite's reference value for the size.
//! 2. The rayon run (2 threads) and the malleable run (2 workers) give the sequential
//!    loop's final grid bit for bit (a hash of each row's cells).
//! 3. The malleable run's `Gtotal`, which it adds up from per-row sums in row order (the
//!    grid never comes back in one piece), equals the sequential loop's grid summed the same
//!    way, bit for bit, and is within JGF's tolerance of the reference value too.
//!
//! ```text
//! cargo run --release --example sor            # JGF size A (1000 × 1000)
//! cargo run --release --example sor -- C       # size B or C (1500, 2000)
//! cargo run --release --example sor -- --n 4000 --iterations 20   # no JGF reference then
//! ```

#[path = "kernels/mod.rs"]
mod kernels;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use malleable::{Banded, Executor};
use rayon::ThreadPoolBuilder;

use kernels::stencil::sor::{self, Solution, Sor};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The grid's side, the iterations, and JGF's size letter and reference `Gtotal` if any.
struct Args {
    n: usize,
    iterations: u64,
    reference: Option<(char, f64)>,
}

fn parse_args() -> Result<Args, Error> {
    let mut args = Args {
        n: 1000,
        iterations: sor::ITERATIONS,
        reference: None,
    };
    let mut size = Some('A');
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "A" | "B" | "C" | "a" | "b" | "c" => size = a.to_uppercase().chars().next(),
            "--n" => {
                args.n = value()?.replace('_', "").parse()?;
                size = None;
            }
            "--iterations" => {
                args.iterations = value()?.parse()?;
                size = None;
            }
            other => return Err(format!("unknown argument {other:?} (see the file's docs)").into()),
        }
    }
    if let Some(letter) = size {
        let (_, n, gtotal) = sor::REFERENCE
            .into_iter()
            .find(|(l, _, _)| *l == letter)
            .expect("sizes A, B and C");
        (args.n, args.iterations, args.reference) = (n, sor::ITERATIONS, Some((letter, gtotal)));
    }
    if args.n < 3 || args.iterations == 0 {
        return Err("need --n of at least 3 and at least 1 iteration".into());
    }
    Ok(args)
}

/// Iterations per second, as JGF reports SOR.
fn rate(iterations: u64, t: Duration) -> f64 {
    iterations as f64 / t.as_secs_f64()
}

/// Whether a run's grid is the sequential loop's; prints the verdict.
fn same_grid(what: &str, got: &Solution, reference: &Solution) -> bool {
    match got.digest.first_difference(&reference.digest) {
        None => {
            println!("check  {what}: the final grid is the sequential loop's, bit for bit");
            true
        }
        Some(row) => {
            println!("check  {what}: FAILED: row {row} of the final grid differs");
            false
        }
    }
}

/// Whether `gtotal` is within JGF's tolerance of the reference; prints the verdict.
fn jgf_validate(what: &str, gtotal: f64, reference: Option<(char, f64)>) -> bool {
    match reference {
        Some((size, refval)) => {
            let dev = (gtotal - refval).abs();
            let ok = dev <= sor::TOLERANCE;
            println!(
                "check  {what}: Gtotal {gtotal:?}, JGF's size {size} {refval:?}: deviation \
                 {dev:.3e} {} {:.0e}{}",
                if ok { "<=" } else { ">" },
                sor::TOLERANCE,
                if ok { "" } else { "  FAILED" }
            );
            ok
        }
        None => {
            println!("check  {what}: Gtotal {gtotal:?} (no JGF reference for this size)");
            true
        }
    }
}

fn main() -> ExitCode {
    kernels::exit_code(parse_args().and_then(|args| run(&args)))
}

fn run(args: &Args) -> Result<bool, Error> {
    let (n, iterations) = (args.n, args.iterations);
    println!(
        "JGF SOR{}: {n} × {n}, {iterations} red-black iterations ({} phases), ω = {}",
        match args.reference {
            Some((size, _)) => format!(" size {size}"),
            None => String::new(),
        },
        2 * iterations,
        sor::OMEGA
    );

    let t = Instant::now();
    let reference = sor::sequential(n, iterations);
    let t_seq = t.elapsed();
    let grid = reference
        .grid
        .as_deref()
        .expect("the sequential run keeps its grid");
    let gtotal = sor::gtotal(grid, n);

    let pool = ThreadPoolBuilder::new().num_threads(2).build()?;
    let t = Instant::now();
    let by_rayon = pool.install(|| sor::rayon(n, iterations, 32));
    let t_rayon = t.elapsed();

    let exec = Executor::builder().local_workers(2).build()?;
    let t = Instant::now();
    let done = exec.run(Banded(Sor::new(n as u64, iterations)))?;
    let t_mall = t.elapsed();
    let by_malleable = Sor::solution(&done);

    println!(
        "sequential    {:>7.3} s  {:>7.1} iterations/s",
        t_seq.as_secs_f64(),
        rate(iterations, t_seq)
    );
    println!(
        "rayon (2)     {:>7.3} s  {:>7.1} iterations/s",
        t_rayon.as_secs_f64(),
        rate(iterations, t_rayon)
    );
    println!(
        "malleable (2) {:>7.3} s  {:>7.1} iterations/s  (32 bands of rows)",
        t_mall.as_secs_f64(),
        rate(iterations, t_mall)
    );

    let mut ok = jgf_validate("sequential", gtotal, args.reference);
    ok &= same_grid("rayon", &by_rayon, &reference);
    ok &= same_grid("malleable", &by_malleable, &reference);
    let rows_equal = by_malleable.gtotal_by_rows.to_bits() == reference.gtotal_by_rows.to_bits();
    println!(
        "check  malleable: Gtotal from row sums {:?} {} the sequential grid's {:?}{}",
        by_malleable.gtotal_by_rows,
        if rows_equal { "==" } else { "!=" },
        reference.gtotal_by_rows,
        if rows_equal { "" } else { "  FAILED" }
    );
    ok &= rows_equal;
    ok &= jgf_validate("malleable", by_malleable.gtotal_by_rows, args.reference);
    println!(
        "\n{}",
        if ok {
            "Validation PASSED"
        } else {
            "Validation FAILED"
        }
    );
    Ok(ok)
}
