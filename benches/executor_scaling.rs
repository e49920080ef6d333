//! Scale latency and chunking overhead of the local executor.
//!
//! `cargo bench --bench executor_scaling` prints:
//! - grow latency: `set_local_workers(n + 1)` → the new worker's first step;
//! - retire latency: `set_local_workers(n - 1)` → the retired worker's thread is released
//!   (it handed its chunk back and left);
//!   both as p50 / p99 over 200 scalings, next to the step length (targets: ≤ one step + 1 ms);
//! - the cost of 64 chunks per worker against 4 chunks per worker at 2 workers (target ≤ 1%),
//!   median of 15 alternating runs.

use std::cell::Cell;
use std::sync::Mutex;
use std::time::{Duration, Instant};

mod support;

use malleable::reduce::Sum;
use malleable::{Chunking, Executor, Fold, Folded};
use serde::{Deserialize, Serialize};
use support::{Mix, percentile};

/// When each worker thread ran its first step, and when each one exited.
static FIRST_STEPS: Mutex<Vec<Instant>> = Mutex::new(Vec::new());
static EXITS: Mutex<Vec<Instant>> = Mutex::new(Vec::new());

struct ExitStamp;
impl Drop for ExitStamp {
    fn drop(&mut self) {
        EXITS.lock().unwrap().push(Instant::now());
    }
}

thread_local! {
    static SEEN: Cell<bool> = const { Cell::new(false) };
    static STAMP: ExitStamp = const { ExitStamp };
}

/// A loop whose steps last about `step_us` microseconds and which notes each worker thread's
/// first step and exit.
#[derive(Serialize, Deserialize)]
struct Spin {
    n: u64,
    step_us: u64,
}

impl Fold for Spin {
    const NAME: &'static str = "spin";
    type Acc = u64;
    type Reducer = Sum<u64>;
    type Input = ();
    fn iterations(&self) -> u64 {
        self.n
    }
    fn reducer(&self) -> Sum<u64> {
        Sum::new()
    }
    fn body(&self, _: &(), acc: &mut u64, i: u64) {
        if !SEEN.with(Cell::get) {
            SEEN.with(|s| s.set(true));
            FIRST_STEPS.lock().unwrap().push(Instant::now());
            STAMP.with(|_| {});
        }
        *acc = acc.wrapping_add(std::hint::black_box(i).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    }
    fn target_step(&self) -> Duration {
        Duration::from_micros(self.step_us)
    }
}

fn latencies(step_us: u64) {
    let exec = Executor::builder()
        .local_workers(1)
        .chunking(Chunking::Count(1 << 20))
        .build()
        .unwrap();
    let handle = exec
        .submit(Folded(Spin {
            n: u64::MAX / 4,
            step_us,
        }))
        .unwrap();
    std::thread::sleep(Duration::from_millis(50)); // let the step length settle
    let (mut grow, mut retire) = (Vec::new(), Vec::new());
    for _ in 0..200 {
        let before = FIRST_STEPS.lock().unwrap().len();
        let t0 = Instant::now();
        handle.set_local_workers(2);
        let first = loop {
            if let Some(&t) = FIRST_STEPS.lock().unwrap().get(before) {
                break t;
            }
            std::thread::sleep(Duration::from_micros(20));
        };
        grow.push(first - t0);
        std::thread::sleep(Duration::from_millis(2));
        let before = EXITS.lock().unwrap().len();
        let t0 = Instant::now();
        handle.set_local_workers(1);
        let exit = loop {
            if let Some(&t) = EXITS.lock().unwrap().get(before) {
                break t;
            }
            std::thread::sleep(Duration::from_micros(20));
        };
        retire.push(exit - t0);
    }
    handle.cancel();
    let _ = handle.wait();
    println!(
        "step ≈ {:>5} µs | grow p50 {:>8.1?} p99 {:>8.1?} | retire p50 {:>8.1?} p99 {:>8.1?} | bound (step + 1 ms) {:?}",
        step_us,
        percentile(&mut grow, 0.5),
        percentile(&mut grow, 0.99),
        percentile(&mut retire, 0.5),
        percentile(&mut retire, 0.99),
        Duration::from_micros(step_us) + Duration::from_millis(1),
    );
}

fn chunk_overhead() {
    // The same loop, 2 workers, 8 vs 128 chunks in all: 4 vs 64 chunks per worker.
    let n = 400_000_000;
    let time = |chunks: u64| {
        let exec = Executor::builder()
            .local_workers(2)
            .chunking(Chunking::Count(chunks))
            .build()
            .unwrap();
        let t0 = Instant::now();
        let v = exec.run(Folded(Mix(n))).unwrap().into_value();
        (t0.elapsed(), v)
    };
    let (mut few, mut many) = (Vec::new(), Vec::new());
    for _ in 0..15 {
        let (a, va) = time(8);
        let (b, vb) = time(128);
        assert_eq!(va, vb);
        few.push(a);
        many.push(b);
    }
    let (a, b) = (percentile(&mut few, 0.5), percentile(&mut many, 0.5));
    println!(
        "chunks per worker: 4 → {a:.1?}, 64 → {b:.1?}; cost of 64 vs 4: {:+.2}%",
        (b.as_secs_f64() / a.as_secs_f64() - 1.0) * 100.0
    );
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo bench -- --list` asks for the benchmark names; this bench has no criterion group
    }
    println!("executor_scaling: scale latency (200 grow + 200 retire each)");
    for step_us in [100, 1000] {
        latencies(step_us);
    }
    chunk_overhead();
}
