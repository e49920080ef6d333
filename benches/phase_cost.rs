//! The fixed cost of a phase (issue 21's short-phase target): what a phase of owned
//! partitions costs beyond its work, as a function of the number of partitions.
//!
//! The job is a stencil of almost no work: `P` bands of one row of `WIDTH` `f64` each
//! (`Banded(Tiny)`), every row the mean of its two neighbours' (a Jacobi sweep; the edge rows
//! are copied), the phase's value the sum of every cell (`Sum<f64>` in chunk order). A
//! phase is then its barrier, its halos (two rows a band), its reduction and a few hundred
//! nanoseconds of arithmetic: what the target calls the fixed cost of a phase.
//!
//! Run for `P` in {4, 16, 64, 256} (`PHASE_COST_P`, comma-separated), each way in turn:
//!
//! - *seq*: the same sweep and sum written as a plain loop on this thread (the work);
//! - *rayon 1*, *rayon 2*: the same written the usual way with rayon (a pool of 1 or 2
//!   threads, `par_chunks_mut` over the rows and a sequential sum of the row sums, so that
//!   the value is the same bits);
//! - *local 1*, *local 2*: an executor of 1 or 2 local threads;
//! - *procs 2* (unless `PHASE_COST_PROCS=0`): a coordinator with no local worker and 2
//!   worker processes over loopback (this binary re-executed with `--worker ADDR`, one
//!   thread each, halos pushed between them), started before the job is submitted.
//!
//! A phase's time is the gap between two consecutive phase ends: the job's `end_phase`,
//! which runs at the barrier, records an `Instant`; the loops record one after each phase.
//! Printed per run: the median phase (µs) over phases after the first tenth. Then, per way,
//! the least-squares line through its medians against `P`: the intercept (the fixed cost
//! of a phase) and the slope (the cost per partition), against the targets: with local
//! threads ≤ 20 µs + 1 µs per partition, with worker processes ≤ 150 µs. Every run's value
//! is checked bit for bit against the plain loop's.
//!
//! ```text
//! cargo bench --bench phase_cost
//! PHASE_COST_PHASES=4000 PHASE_COST_P=8,32 cargo bench --bench phase_cost
//! PHASE_COST_WAYS="local 2,procs 2" cargo bench --bench phase_cost  # those ways only
//! cargo test --bench phase_cost        # a quick checked pass
//! ```
//!
//! The machine has 2 cores: 2 threads or 2 processes share them with the coordinator and
//! the processes' I/O threads, and every figure moves with other work on the machine.

use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use malleable::cluster::{Registry, WorkerOptions};
use malleable::reduce::Sum;
use malleable::rows::Window;
use malleable::{Banded, Executor, Job, JobHandle, Next, Outcome, Rows};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

mod support;

use support::{fit, list};

/// Cells in a row: 128 bytes, a halo.
const WIDTH: usize = 16;

/// The ends of the phases of the job running in this process (one job at a time).
static ENDS: Mutex<Vec<Instant>> = Mutex::new(Vec::new());

/// `bands` bands of one row each, for `phases` phases.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Tiny {
    bands: u64,
    phases: u64,
    phase: u64,
}

impl Tiny {
    fn new(bands: u64, phases: u64) -> Tiny {
        Tiny {
            bands,
            phases,
            phase: 0,
        }
    }
}

impl Rows for Tiny {
    const NAME: &'static str = "phase-cost";
    type Element = f64;
    type Acc = f64;
    type Reducer = Sum<f64>;
    type Input = ();

    fn height(&self) -> u64 {
        self.bands
    }
    fn width(&self) -> usize {
        WIDTH
    }
    fn bands(&self) -> u64 {
        self.bands
    }
    fn reducer(&self) -> Sum<f64> {
        Sum::new()
    }
    fn init(&self, _: &(), i: u64, row: &mut [f64]) {
        init(i, row);
    }
    fn update(&self, _: &(), _: u64, win: Window<'_, f64>, acc: &mut f64) {
        *acc += sweep(win.above, win.old, win.below, win.row);
    }
    fn end_phase(&mut self, _: &f64) -> Next {
        ENDS.lock().expect("the phase ends").push(Instant::now());
        self.phase += 1;
        if self.phase < self.phases {
            Next::Continue
        } else {
            Next::Finish
        }
    }
    fn phases(&self) -> Option<u64> {
        Some(self.phases)
    }
}

fn init(i: u64, row: &mut [f64]) {
    for (j, x) in row.iter_mut().enumerate() {
        *x = (i as usize * WIDTH + j) as f64;
    }
}

/// Row `row` from the rows around it; returns its sum, from 0.0 in cell order.
fn sweep(above: Option<&[f64]>, old: &[f64], below: Option<&[f64]>, row: &mut [f64]) -> f64 {
    match (above, below) {
        (Some(a), Some(b)) => {
            for j in 0..row.len() {
                row[j] = 0.5 * (a[j] + b[j]);
            }
        }
        _ => row.copy_from_slice(old),
    }
    row.iter().fold(0.0, |s, x| s + x)
}

/// The plain loop: the value of the last phase and each phase's end.
fn sequential(bands: u64, phases: u64) -> (f64, Vec<Instant>) {
    let n = bands as usize;
    let mut old = vec![0.0; n * WIDTH];
    let mut new = vec![0.0; n * WIDTH];
    for (i, row) in old.chunks_mut(WIDTH).enumerate() {
        init(i as u64, row);
    }
    let mut ends = Vec::with_capacity(phases as usize);
    let mut value = 0.0;
    for _ in 0..phases {
        value = 0.0;
        for i in 0..n {
            let above = (i > 0).then(|| &old[(i - 1) * WIDTH..i * WIDTH]);
            let below = (i + 1 < n).then(|| &old[(i + 1) * WIDTH..(i + 2) * WIDTH]);
            let s = sweep(
                above,
                &old[i * WIDTH..(i + 1) * WIDTH],
                below,
                &mut new[i * WIDTH..(i + 1) * WIDTH],
            );
            value += 0.0 + s;
        }
        std::mem::swap(&mut old, &mut new);
        ends.push(Instant::now());
    }
    (value, ends)
}

/// The same with rayon on `threads` threads, as one writes it: the rows in parallel, then
/// the row sums added in order.
fn with_rayon(bands: u64, phases: u64, threads: usize) -> (f64, Vec<Instant>) {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a rayon pool");
    let n = bands as usize;
    let mut old = vec![0.0; n * WIDTH];
    let mut new = vec![0.0; n * WIDTH];
    let mut sums = vec![0.0; n];
    for (i, row) in old.chunks_mut(WIDTH).enumerate() {
        init(i as u64, row);
    }
    let mut ends = Vec::with_capacity(phases as usize);
    let mut value = 0.0;
    pool.install(|| {
        for _ in 0..phases {
            let o = &old;
            new.par_chunks_mut(WIDTH)
                .zip(sums.par_iter_mut())
                .enumerate()
                .for_each(|(i, (row, sum))| {
                    let above = (i > 0).then(|| &o[(i - 1) * WIDTH..i * WIDTH]);
                    let below = (i + 1 < n).then(|| &o[(i + 1) * WIDTH..(i + 2) * WIDTH]);
                    *sum = sweep(above, &o[i * WIDTH..(i + 1) * WIDTH], below, row);
                });
            value = sums.iter().fold(0.0, |v, s| v + (0.0 + s));
            std::mem::swap(&mut old, &mut new);
            ends.push(Instant::now());
        }
    });
    (value, ends)
}

fn finish<J: Job>(h: JobHandle<J>) -> malleable::Finished<J> {
    match h.wait().expect("the job") {
        Outcome::Finished(f) => f,
        Outcome::Suspended(id) => panic!("suspended at {id}"),
        _ => panic!("not finished"),
    }
}

/// The job on an executor of `threads` local threads.
fn local(bands: u64, phases: u64, threads: usize) -> (f64, Vec<Instant>) {
    let exec = Executor::builder()
        .local_workers(threads)
        .build()
        .expect("an executor");
    ENDS.lock().expect("the phase ends").clear();
    let h = exec
        .submit(Banded(Tiny::new(bands, phases)))
        .expect("submit");
    let f = finish(h);
    (
        f.value,
        std::mem::take(&mut *ENDS.lock().expect("the phase ends")),
    )
}

/// The job on 2 worker processes over loopback, one thread each: the ends of the phases
/// after both joined.
fn processes(bands: u64, phases: u64) -> (f64, Vec<Instant>) {
    let (exec, addr) = support::loopback_coordinator();
    let workers: Vec<Child> = (0..2).map(|_| spawn_worker(&addr)).collect();
    ENDS.lock().expect("the phase ends").clear();
    let h = exec
        .submit(Banded(Tiny::new(bands, phases)))
        .expect("submit");
    // Only the phases both processes ran: the first may start the job alone.
    while h.remote_workers() < 2 && !h.is_finished() {
        std::thread::sleep(Duration::from_micros(200));
    }
    let from = ENDS.lock().expect("the phase ends").len();
    let f = finish(h.clone());
    let t = h.traffic();
    let n = phases as f64;
    eprintln!(
        "  procs 2, {bands} partitions: per phase {:.1} messages in and {:.1} out through the \
         coordinator, {:.0} halo bytes relayed in, {:.1} halos pushed between the processes \
         ({} peers found unreachable); {} partitions moved in the run",
        t.messages_in as f64 / n,
        t.messages_out as f64 / n,
        t.halo_bytes_in as f64 / n,
        t.halos_direct as f64 / n,
        t.peers_unreachable,
        t.partitions_moved,
    );
    for mut w in workers {
        let _ = w.wait();
    }
    let mut ends = std::mem::take(&mut *ENDS.lock().expect("the phase ends"));
    assert!(
        from + 20 <= ends.len(),
        "the second worker process joined after phase {from} of {}",
        ends.len()
    );
    // (Counted as phases: the first ones, run by one process, are only dropped.)
    ends.drain(..from);
    (f.value, ends)
}

/// Worker mode: serve the coordinator at `addr` with one thread until its job ends.
fn worker(addr: &str) {
    let registry = Registry::new().register::<Banded<Tiny>>();
    let options = WorkerOptions::default().threads(1);
    support::serve_until_the_end(addr, &registry, &options);
}

fn spawn_worker(addr: &str) -> Child {
    Command::new(std::env::current_exe().expect("the bench binary"))
        .args(["--worker", addr])
        .stdout(Stdio::null())
        .spawn()
        .expect("a worker process")
}

/// The median gap between consecutive ends, after the first tenth of the phases.
fn median_phase(ends: &[Instant]) -> Duration {
    let skip = (ends.len() / 10).max(1);
    let mut gaps: Vec<Duration> = ends[skip..]
        .windows(2)
        .map(|w| w[1].duration_since(w[0]))
        .collect();
    gaps.sort_unstable();
    gaps.get(gaps.len() / 2).copied().unwrap_or_default()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--worker") {
        return worker(&args[i + 1]);
    }
    if args.iter().any(|a| a == "--list") {
        return;
    }
    // `cargo bench` passes `--bench`; `cargo test` does not, and wants a quick pass.
    let quick = !args.iter().any(|a| a == "--bench");
    let phases = std::env::var("PHASE_COST_PHASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if quick { 300 } else { 2000 })
        .max(20);
    let sizes: &[u64] = if quick { &[4, 16] } else { &[4, 16, 64, 256] };
    let ps = list("PHASE_COST_P", sizes);
    let procs = std::env::var("PHASE_COST_PROCS").map_or(true, |v| v != "0");
    type Way = (&'static str, fn(u64, u64) -> (f64, Vec<Instant>));
    let mut ways: Vec<Way> = vec![
        ("seq", sequential),
        ("rayon 1", |b, p| with_rayon(b, p, 1)),
        ("rayon 2", |b, p| with_rayon(b, p, 2)),
        ("local 1", |b, p| local(b, p, 1)),
        ("local 2", |b, p| local(b, p, 2)),
    ];
    if procs {
        ways.push(("procs 2", processes));
    }
    // `PHASE_COST_WAYS=local 1,procs 2`: only those (and the plain loop, the reference).
    if let Ok(only) = std::env::var("PHASE_COST_WAYS") {
        let only: Vec<&str> = only.split(',').map(str::trim).collect();
        ways.retain(|(name, _)| *name == "seq" || only.contains(name));
    }
    println!(
        "the fixed cost of a phase: bands of one row of {WIDTH} f64, {phases} phases a run; \
         median phase in µs{}",
        if quick { " (quick pass)" } else { "" }
    );
    print!("{:>5}", "P");
    for (name, _) in &ways {
        print!(" {name:>9}");
    }
    println!();
    let mut medians: Vec<Vec<(f64, f64)>> = vec![Vec::new(); ways.len()];
    for &p in &ps {
        print!("{p:>5}");
        let mut want = None;
        for (k, (name, run)) in ways.iter().enumerate() {
            let (value, ends) = run(p, phases);
            if *name == "procs 2" {
                assert!(ends.len() >= 20, "{name}: {} phases timed", ends.len());
            } else {
                assert_eq!(ends.len() as u64, phases, "{name}: phases ended");
            }
            match want {
                None => want = Some(value),
                Some(w) => assert_eq!(
                    value.to_bits(),
                    f64::to_bits(w),
                    "{name} at P = {p}: {value} against the plain loop's {w}"
                ),
            }
            let m = median_phase(&ends).as_secs_f64() * 1e6;
            medians[k].push((p as f64, m));
            print!(" {m:>9.1}");
        }
        println!();
    }
    println!("values equal to the plain loop's, bit for bit");
    println!("\nper way, the least-squares line through the medians: fixed µs + µs per partition");
    for (k, (name, _)) in ways.iter().enumerate() {
        let (slope, intercept) = fit(&medians[k]);
        let target = match *name {
            "local 1" | "local 2" => {
                let met = intercept <= 20.0 && slope <= 1.0;
                format!(
                    " (target <= 20 µs + 1 µs per partition: {})",
                    if met { "met" } else { "not met" }
                )
            }
            "procs 2" => format!(
                " (target <= 150 µs: {})",
                if intercept <= 150.0 { "met" } else { "not met" }
            ),
            _ => String::new(),
        };
        println!("{name:>9}: {intercept:8.1} µs + {slope:6.3} µs per partition{target}");
    }
}
