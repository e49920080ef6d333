//! A vibrating membrane (the 2-D wave equation, leapfrog in time) as a malleable job whose
//! grid stays on the workers, checked bit for bit against a plain sequential loop.
//!
//! The scheme has three levels: `uⁿ⁺¹ = 2uⁿ − uⁿ⁻¹ + C²·Δuⁿ`, with the five-point Laplacian
//! `Δ` and the membrane held at 0 on its edges. It starts from rest with a bump in the
//! middle: the first step is the half step `u¹ = u⁰ + ½C²·Δu⁰`. Each time step is one phase.
//!
//! The job (`Membrane`) uses what `Rows` offers for such a scheme:
//!
//! - `Sweep::ThreeLevel`: a cell is one `f64`; the row `update` writes holds, on entry, the
//!   row two phases back (`uⁿ⁻¹`), and the rows next to it are the previous phase's (`uⁿ`),
//!   which is all a neighbouring band reads: halos carry `uⁿ` only.
//! - `Window::phase` tells `update` it is in the first step (the half step), and
//!   `Window::last` that it is in the last (where each row's hash is taken): the job value
//!   counts no phases.
//! - A `Series` keeps each step's `Σu²` and the displacement at a probe point, in the job
//!   value at the coordinator, never sent to worker processes; it is also what `end_phase`
//!   counts the steps with.
//!
//! For comparison the same membrane runs as `Rows` cells of `[f64; 2]` (`uⁿ`, `uⁿ⁻¹`) with a
//! Jacobi sweep, the way a three-level scheme had to be written before, and with rayon.
//!
//! Checks: the final grid (a hash of each row's cells) and every step's `Σu²` and probe value
//! are the sequential loop's, bit for bit, for the malleable run of both formulations (2
//! workers) and for rayon (2 threads).
//!
//! ```text
//! cargo run --release --example wave
//! cargo run --release --example wave -- --n 2000 --steps 500
//! ```
//!
//! Options: `--n N` (1000: an `N × N` membrane), `--steps K` (400), `--bands B` (32).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use malleable::reduce::CollectInOrder;
use malleable::rows::{Rows, Sweep, Window};
use malleable::{Banded, Executor, Next, Series};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// Courant number squared (`c·Δt/Δx` = 0.5: stable below 1/√2).
const C2: f64 = 0.25;

// ---------------------------------------------------------------------------------------
// The row update all versions share.

/// The initial displacement of row `i` of an `n × n` membrane: a smooth bump off-centre,
/// 0 on the edges.
fn init(n: u64, i: u64, row: &mut [f64]) {
    let w = row.len();
    let (y, ny) = (i as f64, (n - 1) as f64);
    for (j, x) in row.iter_mut().enumerate() {
        let xj = j as f64 / (w - 1) as f64;
        let yi = y / ny;
        let r2 = (xj - 0.4).powi(2) + (yi - 0.45).powi(2);
        *x = if i == 0 || i + 1 == n || j == 0 || j + 1 == w {
            0.0
        } else {
            (-r2 * 80.0).exp()
        };
    }
}

/// Row `i` of step `phase + 1` into `row`, which holds it as of step `phase - 1`; `above`,
/// `old`, `below` are rows `i - 1`, `i`, `i + 1` of step `phase`. Step 0 is the half step of a
/// start from rest (`row` then holds the initial row and is not read).
#[inline]
fn row(phase: u64, above: &[f64], old: &[f64], below: &[f64], row: &mut [f64]) {
    let w = old.len();
    row[0] = 0.0;
    row[w - 1] = 0.0;
    if phase == 0 {
        for j in 1..w - 1 {
            let lap = above[j] + below[j] + old[j - 1] + old[j + 1] - 4.0 * old[j];
            row[j] = old[j] + 0.5 * C2 * lap;
        }
    } else {
        for j in 1..w - 1 {
            let lap = above[j] + below[j] + old[j - 1] + old[j + 1] - 4.0 * old[j];
            row[j] = 2.0 * old[j] - row[j] + C2 * lap;
        }
    }
}

/// The sum of a row's squares, left to right.
fn squares(row: &[f64]) -> f64 {
    row.iter().map(|x| x * x).sum()
}

/// FNV-1a over the bits of a row's cells.
fn hash(cells: &[f64]) -> u64 {
    hash_of(cells.iter().copied())
}

/// [`hash`] of cells as they come.
fn hash_of(cells: impl Iterator<Item = f64>) -> u64 {
    cells.fold(0xCBF2_9CE4_8422_2325, |h, x| {
        (h ^ x.to_bits()).wrapping_mul(0x0100_0000_01B3)
    })
}

/// The probe: the displacement of cell `(n / 3, n / 3)`.
fn probe(n: u64) -> (u64, usize) {
    (n / 3, (n / 3) as usize)
}

/// The end of a run: each row's hash of the final grid, and every step's `Σu²` (summed row
/// by row in row order) and probe value, in bits.
#[derive(Debug, PartialEq, Eq)]
struct Solution {
    hashes: Vec<u64>,
    series: Vec<[u64; 2]>,
}

// ---------------------------------------------------------------------------------------
// The plain loops.

/// Two buffers, `uⁿ` and `uⁿ⁻¹`; step `p` writes `uⁿ⁺¹` over `uⁿ⁻¹`, then they swap.
fn sequential(n: u64, steps: u64) -> Solution {
    let w = n as usize;
    let mut cur = vec![0.0; w * w];
    for (i, r) in cur.chunks_exact_mut(w).enumerate() {
        init(n, i as u64, r);
    }
    let mut older = cur.clone();
    let (pi, pj) = probe(n);
    let mut series = Vec::new();
    for p in 0..steps {
        let mut total = 0.0;
        for i in 0..w {
            let dst = &mut older[i * w..(i + 1) * w];
            if i == 0 || i + 1 == w {
                dst.copy_from_slice(&cur[i * w..(i + 1) * w]);
            } else {
                let (a, o, b) = (
                    &cur[(i - 1) * w..i * w],
                    &cur[i * w..(i + 1) * w],
                    &cur[(i + 1) * w..(i + 2) * w],
                );
                row(p, a, o, b, dst);
            }
            total += squares(dst);
        }
        series.push([total.to_bits(), older[pi as usize * w + pj].to_bits()]);
        std::mem::swap(&mut cur, &mut older);
    }
    Solution {
        hashes: cur.chunks_exact(w).map(hash).collect(),
        series,
    }
}

/// The same with rayon, a task per row; the per-row sums are added in row order.
fn with_rayon(n: u64, steps: u64) -> Solution {
    let w = n as usize;
    let mut cur = vec![0.0; w * w];
    cur.par_chunks_exact_mut(w)
        .enumerate()
        .for_each(|(i, r)| init(n, i as u64, r));
    let mut older = cur.clone();
    let (pi, pj) = probe(n);
    let mut series = Vec::new();
    let mut sums = vec![0.0; w];
    for p in 0..steps {
        let c = &cur;
        older
            .par_chunks_exact_mut(w)
            .zip(sums.par_iter_mut())
            .enumerate()
            .for_each(|(i, (dst, sum))| {
                if i == 0 || i + 1 == w {
                    dst.copy_from_slice(&c[i * w..(i + 1) * w]);
                } else {
                    let (a, o, b) = (
                        &c[(i - 1) * w..i * w],
                        &c[i * w..(i + 1) * w],
                        &c[(i + 1) * w..(i + 2) * w],
                    );
                    row(p, a, o, b, dst);
                }
                *sum = squares(dst);
            });
        let total = sums.iter().sum::<f64>();
        series.push([total.to_bits(), older[pi as usize * w + pj].to_bits()]);
        std::mem::swap(&mut cur, &mut older);
    }
    Solution {
        hashes: cur.par_chunks_exact(w).map(hash).collect(),
        series,
    }
}

// ---------------------------------------------------------------------------------------
// The malleable job.

/// What a row reports for a step: its sum of squares, the probe's value if it holds the
/// probe, and its hash in the last step.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
struct RowReport {
    squares: f64,
    probe: Option<f64>,
    hash: Option<u64>,
}

/// Each row's report, in row order.
type Reports = Vec<RowReport>;

/// The membrane as a `Rows` job: `exec.run(Banded(Membrane::new(n, steps)))`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Membrane {
    n: u64,
    steps: u64,
    bands: u64,
    /// Each step's `[Σu², probe]`; its length is the steps done.
    series: Series,
}

impl Membrane {
    fn new(n: u64, steps: u64, bands: u64) -> Membrane {
        Membrane {
            n,
            steps,
            bands,
            series: Series::new(2),
        }
    }
}

/// A step's record from its rows' reports, summed in row order.
fn record(reports: &Reports) -> [f64; 2] {
    let total = reports.iter().map(|r| r.squares).sum::<f64>();
    let probe = reports.iter().find_map(|r| r.probe).unwrap_or(f64::NAN);
    [total, probe]
}

/// The report of row `i` once written.
fn report(n: u64, i: u64, last: bool, cells: &[f64]) -> RowReport {
    let (pi, pj) = probe(n);
    RowReport {
        squares: squares(cells),
        probe: (i == pi).then(|| cells[pj]),
        hash: last.then(|| hash(cells)),
    }
}

impl Rows for Membrane {
    const NAME: &'static str = "wave-membrane";
    const SWEEP: Sweep = Sweep::ThreeLevel;
    type Element = f64;
    type Acc = Reports;
    type Reducer = CollectInOrder<RowReport>;
    type Input = ();

    fn height(&self) -> u64 {
        self.n
    }
    fn width(&self) -> usize {
        self.n as usize
    }
    fn bands(&self) -> u64 {
        self.bands
    }
    fn reducer(&self) -> Self::Reducer {
        CollectInOrder::new()
    }
    fn init(&self, _: &(), i: u64, r: &mut [f64]) {
        init(self.n, i, r);
    }
    fn update(&self, _: &(), i: u64, win: Window<'_, f64>, acc: &mut Reports) {
        match (win.above, win.below) {
            (Some(a), Some(b)) => row(win.phase, a, win.old, b, win.row),
            _ => win.row.copy_from_slice(win.old),
        }
        acc.push(report(self.n, i, win.last, win.row));
    }
    fn end_phase(&mut self, reports: &Reports) -> Next {
        self.series.push(&record(reports));
        if (self.series.len() as u64) < self.steps {
            Next::Continue
        } else {
            Next::Finish
        }
    }
    fn phases(&self) -> Option<u64> {
        Some(self.steps)
    }
}

/// The same membrane as cells of `[uⁿ, uⁿ⁻¹]` with a Jacobi sweep, as a three-level scheme
/// had to be written before `Sweep::ThreeLevel`: the older level rides in every cell (and in
/// every halo), and is copied forward at every step.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct PairedMembrane(Membrane);

impl Rows for PairedMembrane {
    const NAME: &'static str = "wave-membrane-paired";
    type Element = [f64; 2];
    type Acc = Reports;
    type Reducer = CollectInOrder<RowReport>;
    type Input = ();

    fn height(&self) -> u64 {
        self.0.n
    }
    fn width(&self) -> usize {
        self.0.n as usize
    }
    fn bands(&self) -> u64 {
        self.0.bands
    }
    fn reducer(&self) -> Self::Reducer {
        CollectInOrder::new()
    }
    fn init(&self, _: &(), i: u64, r: &mut [[f64; 2]]) {
        let mut u = vec![0.0; r.len()];
        init(self.0.n, i, &mut u);
        for (c, u) in r.iter_mut().zip(u) {
            *c = [u, u];
        }
    }
    fn update(&self, _: &(), i: u64, win: Window<'_, [f64; 2]>, acc: &mut Reports) {
        let (old, w) = (win.old, win.old.len());
        match (win.above, win.below) {
            (Some(a), Some(b)) => {
                // As `row`, reading `uⁿ` and `uⁿ⁻¹` from the cells.
                win.row[0] = [0.0, old[0][0]];
                win.row[w - 1] = [0.0, old[w - 1][0]];
                for j in 1..w - 1 {
                    let u = old[j][0];
                    let lap = a[j][0] + b[j][0] + old[j - 1][0] + old[j + 1][0] - 4.0 * u;
                    let next = if win.phase == 0 {
                        u + 0.5 * C2 * lap
                    } else {
                        2.0 * u - old[j][1] + C2 * lap
                    };
                    win.row[j] = [next, u];
                }
            }
            _ => {
                for (dst, c) in win.row.iter_mut().zip(old) {
                    *dst = [c[0], c[0]];
                }
            }
        }
        let u = || win.row.iter().map(|c| c[0]);
        let (pi, pj) = probe(self.0.n);
        acc.push(RowReport {
            squares: u().map(|x| x * x).sum(),
            probe: (i == pi).then(|| win.row[pj][0]),
            hash: win.last.then(|| hash_of(u())),
        });
    }
    fn end_phase(&mut self, reports: &Reports) -> Next {
        self.0.end_phase(reports)
    }
    fn phases(&self) -> Option<u64> {
        self.0.phases()
    }
}

/// A finished membrane's solution.
fn solution(job: &Membrane, value: &[RowReport]) -> Solution {
    Solution {
        hashes: value.iter().filter_map(|r| r.hash).collect(),
        series: job
            .series
            .iter()
            .map(|r| [r[0].to_bits(), r[1].to_bits()])
            .collect(),
    }
}

// ---------------------------------------------------------------------------------------

struct Args {
    n: u64,
    steps: u64,
    bands: u64,
}

fn parse_args() -> Result<Args, Error> {
    let mut args = Args {
        n: 1000,
        steps: 400,
        bands: 32,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--n" => args.n = value()?.replace('_', "").parse()?,
            "--steps" => args.steps = value()?.replace('_', "").parse()?,
            "--bands" => args.bands = value()?.parse()?,
            other => return Err(format!("unknown argument {other:?} (see the file's docs)").into()),
        }
    }
    if args.n < 3 || args.steps == 0 || args.bands == 0 {
        return Err("need --n of at least 3, --steps and --bands of at least 1".into());
    }
    Ok(args)
}

fn main() -> ExitCode {
    match parse_args().and_then(|args| run(&args)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Whether `got` is the sequential loop's; prints the verdict.
fn check(what: &str, got: &Solution, reference: &Solution) -> bool {
    let verdict = if let Some(i) = (0..reference.hashes.len().max(got.hashes.len()))
        .find(|&i| got.hashes.get(i) != reference.hashes.get(i))
    {
        format!("FAILED: row {i} of the final grid differs")
    } else if got.series != reference.series {
        let step = (0..reference.series.len().max(got.series.len()))
            .find(|&p| got.series.get(p) != reference.series.get(p))
            .unwrap_or(0);
        format!("FAILED: the grid is the same but step {step}'s Σu² or probe differs")
    } else {
        "ok: the final grid and every step's Σu² and probe, bit for bit".to_owned()
    };
    println!("check  {what}: {verdict}");
    verdict.starts_with("ok")
}

fn run(args: &Args) -> Result<bool, Error> {
    let (n, steps, bands) = (args.n, args.steps, args.bands);
    println!("wave: {n} × {n} membrane, {steps} leapfrog steps, C² = {C2}, {bands} bands");
    let mups = |t: Duration| (n * n) as f64 * steps as f64 / t.as_secs_f64() / 1e6;
    let line = |what: &str, t: Duration| {
        println!(
            "{what:<32} {:>7.3} s  {:>7.1} M cell updates/s",
            t.as_secs_f64(),
            mups(t)
        )
    };

    let t = Instant::now();
    let reference = sequential(n, steps);
    line("sequential", t.elapsed());

    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build()?;
    let t = Instant::now();
    let by_rayon = pool.install(|| with_rayon(n, steps));
    line("rayon (2)", t.elapsed());

    let exec = Executor::builder().local_workers(2).build()?;
    let t = Instant::now();
    let done = exec.run(Banded(Membrane::new(n, steps, bands)))?;
    line("malleable (2), ThreeLevel f64", t.elapsed());
    let by_malleable = solution(&done.job.0, &done.value);

    let t = Instant::now();
    let paired = exec.run(Banded(PairedMembrane(Membrane::new(n, steps, bands))))?;
    line("malleable (2), [f64; 2] cells", t.elapsed());
    let by_paired = solution(&paired.job.0.0, &paired.value);

    if let Some(last) = done.job.0.series.last() {
        println!(
            "end    Σu² {:.6e}, probe {:+.6e} after {} steps (series of {} records)",
            last[0],
            last[1],
            steps,
            done.job.0.series.len()
        );
    }
    let mut ok = check("rayon", &by_rayon, &reference);
    ok &= check("malleable, ThreeLevel", &by_malleable, &reference);
    ok &= check("malleable, [f64; 2] cells", &by_paired, &reference);
    println!("\n{}", if ok { "all checks passed" } else { "FAILED" });
    Ok(ok)
}
