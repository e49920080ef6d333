//! The pure coordinator at scale: `State`, driven by the crate's deterministic simulation
//! (`malleable::__bench::coordinator_phases`, the `sim` feature) with `N` simulated worker
//! processes of one thread each, holding `P` owned partitions each: the simulation's banded
//! grid with `N × P` bands of one row of three cells, run for `PHASES` phases (default 4).
//! The processes answer at once: each in turn takes every message on its way to it, runs all
//! it was given and sends every answer, which the coordinator takes as it comes.
//!
//! What is timed: only the coordinator. An `Instant` is read around each call into the state
//! (`join_remote` for each process, `on_remote` for each answer) together with the routing of
//! the orders that call queued; the simulated processes' own work (decoding, running the
//! chunks, encoding answers) runs between the readings and is not counted. A phase's time
//! runs from its first answer to its barrier (the next phase's orders included); the first
//! phase's orders are sent while the processes join, and counted in "joins".
//!
//! Printed, for N in {250, 500, 1000, 2500, 5000, 10000} × P in {8, 16, 32} (`COORD_SCALE_N`
//! and `COORD_SCALE_P`, comma-separated, change the grid; the last row is 10,000 × 32). A size
//! whose coordinator time, extrapolated from the largest size of its `P` run (joins growing
//! at least as N^2, a phase at least as N, or as the last two sizes grew: see
//! `BENCHMARKS.md`), is over `COORD_SCALE_BUDGET_S` (default 300) is not run: its row says "NOT RUN" with the predicted
//! joins and phase, and so does a list at the end (`COORD_SCALE_BUDGET_S=inf` runs every size,
//! however long):
//! - per size: the coordinator's time to take the processes in, its median phase (phases
//!   after the first; the first places every partition), its slowest phase, messages in and
//!   out per phase, the nanoseconds per partition and per process in a phase, and the
//!   partitions each process ran in the last phase (fewest–most), and the whole run's wall
//!   time with the simulated processes;
//! - the fitted slopes (least squares through the points of one `P`, and over all points):
//!   nanoseconds per process per phase at fixed `P`, and per partition per phase;
//! - whether a phase's cost is linear: its cost at the largest `N` over its cost at the
//!   smallest, against the ratio of their sizes, for each `P`.
//!
//! Each run's value is checked against the sequential loop's.
//!
//! ```text
//! cargo bench --features sim --bench coordinator_scale
//! ```

use std::time::Duration;

use malleable::__bench::{Spent, coordinator_phases};

mod support;

use support::{fit, list};

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs.get(xs.len() / 2).copied().unwrap_or_default()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

struct Row {
    n: usize,
    p: usize,
    spent: Spent,
    /// The median phase after the first.
    phase: Duration,
}

/// The exponent `e` of `y ∝ x^e` through the last two points.
fn exponent(points: &[(f64, f64)]) -> Option<f64> {
    let [.., (x1, y1), (x2, y2)] = points else {
        return None;
    };
    (x2 > x1 && *y1 > 0.0 && *y2 > 0.0).then(|| (y2 / y1).ln() / (x2 / x1).ln())
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is taken.
    let ns = list("COORD_SCALE_N", &[250, 500, 1000, 2500, 5000, 10_000]);
    let ps = list("COORD_SCALE_P", &[8, 16, 32]);
    let phases = std::env::var("PHASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4u64)
        .max(2);
    let budget: f64 = std::env::var("COORD_SCALE_BUDGET_S")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300.0);
    println!(
        "the coordinator alone, {phases} phases, processes of 1 thread answering at once \
         (times are the coordinator's only; a size whose predicted coordinator time is \
         over {budget} s is not run, and says so)"
    );
    println!(
        "{:>6} {:>3} {:>8} | {:>9} {:>9} {:>9} | {:>8} {:>8} | {:>7} {:>8} | {:>7} | {:>7}",
        "N",
        "P",
        "bands",
        "joins ms",
        "phase ms",
        "max ms",
        "in/ph",
        "out/ph",
        "ns/part",
        "ns/proc",
        "held",
        "wall s"
    );
    let mut rows: Vec<Row> = Vec::new();
    let mut skipped = Vec::new();
    // Sizes in the order of the table: P outer, N inner, so the last row is the largest of
    // both.
    for &p in &ps {
        for &n in &ns {
            // What this size would take, from the largest size of this P run so far: the
            // joins grow at least as N^2 (while the first phase is fresh, each process's join
            // deals every partition again), a phase at least as N (each message costs about
            // the same), or faster where the last two sizes grew faster.
            let of_p: Vec<&Row> = rows.iter().filter(|r| r.p == p).collect();
            let grow = |f: fn(&Row) -> f64, floor: f64| -> Option<(f64, f64)> {
                let pts: Vec<(f64, f64)> = of_p.iter().map(|r| (r.n as f64, f(r))).collect();
                let e = exponent(&pts).unwrap_or(floor).max(floor);
                let &(x, y) = pts.last()?;
                Some((y * (n as f64 / x).powf(e), e))
            };
            let joins = grow(|r| r.spent.joins.as_secs_f64(), 2.0);
            let phase = grow(|r| r.phase.as_secs_f64(), 1.0);
            if let (Some((joins, ej)), Some((phase, ep))) = (joins, phase) {
                let wall = joins + phase * phases as f64;
                if wall > budget {
                    println!(
                        "{n:>6} {p:>3} {:>8} | NOT RUN: predicted at least {joins:.0} s of joins \
                         (N^{ej:.1}), {phase:.1} s a phase (N^{ep:.1})",
                        n * p
                    );
                    skipped.push((n, p, wall, joins, phase));
                    continue;
                }
            }
            let spent = match coordinator_phases(n, p, phases) {
                Ok(s) => s,
                Err(e) => panic!("{n} processes x {p} partitions: {e}"),
            };
            let later: Vec<Duration> = spent.phases.iter().skip(1).copied().collect();
            let phase = median(later);
            let slowest = spent.phases.iter().max().copied().unwrap_or_default();
            let per = |x: u64| x as f64 / phases as f64;
            let ns_part = phase.as_nanos() as f64 / (n * p) as f64;
            let ns_proc = phase.as_nanos() as f64 / n as f64;
            println!(
                "{:>6} {:>3} {:>8} | {:>9.1} {:>9.1} {:>9.1} | {:>8.0} {:>8.0} | {:>7.0} {:>8.0} \
                 | {:>3}-{:<3} | {:>7.1}",
                n,
                p,
                n * p,
                ms(spent.joins),
                ms(phase),
                ms(slowest),
                per(spent.received),
                per(spent.sent),
                ns_part,
                ns_proc,
                spent.held.0,
                spent.held.1,
                spent.wall.as_secs_f64(),
            );
            rows.push(Row { n, p, spent, phase });
        }
    }

    println!();
    println!("slopes (least squares over the median phase after the first, sizes run):");
    for &p in &ps {
        let pts: Vec<(f64, f64)> = rows
            .iter()
            .filter(|r| r.p == p)
            .map(|r| (r.n as f64, r.phase.as_nanos() as f64))
            .collect();
        if pts.len() < 2 {
            continue;
        }
        let (slope, at0) = fit(&pts);
        println!(
            "  P = {p:>2}: {slope:>8.0} ns per process per phase ({:.0} ns per partition), \
             intercept {:.2} ms",
            slope / p as f64,
            at0 / 1e6
        );
    }
    let pts: Vec<(f64, f64)> = rows
        .iter()
        .map(|r| ((r.n * r.p) as f64, r.phase.as_nanos() as f64))
        .collect();
    let (slope, at0) = fit(&pts);
    println!(
        "  all sizes: {slope:.0} ns per partition per phase, intercept {:.2} ms",
        at0 / 1e6
    );
    let pts: Vec<(f64, f64)> = rows
        .iter()
        .map(|r| (r.n as f64, r.spent.joins.as_nanos() as f64))
        .collect();
    let (slope, _) = fit(&pts);
    println!("  joins, all sizes: {slope:.0} ns per process joined");

    println!();
    println!(
        "linearity (cost at the largest N run over cost at the smallest, against N's ratio; \
         e: the exponent of N between them):"
    );
    for &p in &ps {
        let of_p: Vec<&Row> = rows.iter().filter(|r| r.p == p).collect();
        let (Some(lo), Some(hi)) = (
            of_p.iter().min_by_key(|r| r.n),
            of_p.iter().max_by_key(|r| r.n),
        ) else {
            continue;
        };
        if lo.n == hi.n {
            continue;
        }
        let size = hi.n as f64 / lo.n as f64;
        let phase = hi.phase.as_secs_f64() / lo.phase.as_secs_f64().max(1e-12);
        let joins = hi.spent.joins.as_secs_f64() / lo.spent.joins.as_secs_f64().max(1e-12);
        let verdict = |r: f64| {
            if r <= size * 1.3 {
                "linear"
            } else {
                "worse than linear"
            }
        };
        println!(
            "  P = {p:>2}, N {} to {}: phase x{phase:.1} (e = {:.1}, {}), joins x{joins:.1} \
             (e = {:.1}, {})",
            lo.n,
            hi.n,
            phase.ln() / size.ln(),
            verdict(phase),
            joins.ln() / size.ln(),
            verdict(joins)
        );
    }
    if !skipped.is_empty() {
        println!();
        println!(
            "NOT RUN ({} sizes, over the {budget} s budget; COORD_SCALE_BUDGET_S=inf runs them):",
            skipped.len()
        );
        for (n, p, wall, joins, phase) in skipped {
            println!(
                "  {n} x {p}: predicted at least {wall:.0} s of coordinator: {joins:.0} s of \
                 joins, {phase:.1} s a phase"
            );
        }
    }
}
