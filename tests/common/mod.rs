//! A test kernel with knobs: an f64 sum with a step count, optional panics, optional phases.
#![allow(dead_code, unreachable_pub)]

pub mod grid;
pub mod log;
pub mod netns;
pub mod procs;
pub mod raw;
pub mod slow;
pub mod walk;

use std::ops::Range;

use malleable::reduce::Reducer;
use malleable::{Chunk, Chunking, Job, Next, Step};
use serde::{Deserialize, Serialize};

/// The name, for `--exact`, of test `test` of the module whose `module_path!()` is
/// `module`: a test binary re-executed as a worker or child process runs only that test.
/// In the shared binary (`tests/it/main.rs`) a test's name starts with its module's
/// (`cluster_versions::worker_process`); in a binary of its own it is the bare name.
pub fn exact(module: &str, test: &str) -> String {
    match module.split_once("::") {
        Some((_, path)) => format!("{path}::{test}"),
        None => test.to_owned(),
    }
}

/// Waits until `cond` holds, checking every 5 ms; fails the test, naming `what`, after
/// `patience`.
pub fn until(what: &str, patience: std::time::Duration, mut cond: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !cond() {
        assert!(start.elapsed() < patience, "timed out: {what}");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// A snapshot folder of its own for one test (`prefix`, `name` and this process's id),
/// emptied: its path and its `file://` URL.
pub fn folder(prefix: &str, name: &str) -> (std::path::PathBuf, String) {
    let dir =
        std::env::temp_dir().join(format!("malleable-{prefix}-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let url = format!("file://{}", dir.display());
    (dir, url)
}

/// The term of iteration `i` (phase `p`): values that make f64 addition order-sensitive.
pub fn term(i: u64, p: u64) -> f64 {
    let x = (i ^ (p * 0x9E37_79B9)) as f64;
    1.0 / (1.0 + x) + (x * 1e-3).sin() * 1e7
}

/// Output and value: the f64 sum and the number of steps taken, so a test can tell a chunk
/// resumed from its state (same step count as one uninterrupted run) from one restarted.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SumSteps {
    pub sum: f64,
    pub steps: u64,
    pub iterations: u64,
}

pub struct SumStepsReducer;

impl Reducer for SumStepsReducer {
    type Value = SumSteps;
    fn identity(&self) -> SumSteps {
        SumSteps {
            sum: 0.0,
            steps: 0,
            iterations: 0,
        }
    }
    fn combine(&self, acc: &mut SumSteps, next: SumSteps) {
        acc.sum += next.sum;
        acc.steps += next.steps;
        acc.iterations += next.iterations;
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Kernel {
    pub n: u64,
    /// Iterations per step.
    pub per_step: u64,
    /// Spin this many rounds per iteration, to make steps last.
    pub spin: u32,
    /// Panic in `step` when reaching this index.
    pub panic_at: Option<u64>,
    /// Phases to run; each phase's size is `n + phase`.
    pub phases: u64,
    pub phase: u64,
    /// Values of the finished phases.
    pub history: Vec<f64>,
}

impl Kernel {
    pub fn new(n: u64, per_step: u64) -> Kernel {
        Kernel {
            n,
            per_step,
            spin: 0,
            panic_at: None,
            phases: 1,
            phase: 0,
            history: Vec::new(),
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub struct KChunk {
    next: u64,
    end: u64,
    acc: SumSteps,
}

impl Job for Kernel {
    const NAME: &'static str = "test-kernel";
    type Chunk = KChunk;
    type Reducer = SumStepsReducer;
    type Input = ();

    fn iterations(&self) -> u64 {
        self.n + self.phase
    }
    fn chunk(&self, range: Range<u64>) -> KChunk {
        KChunk {
            next: range.start,
            end: range.end,
            acc: SumStepsReducer.identity(),
        }
    }
    fn reducer(&self) -> SumStepsReducer {
        SumStepsReducer
    }
    fn end_phase(&mut self, value: &SumSteps) -> Next {
        self.history.push(value.sum);
        self.phase += 1;
        if self.phase < self.phases {
            Next::Continue
        } else {
            Next::Finish
        }
    }
}

impl Chunk for KChunk {
    type Job = Kernel;
    type Output = SumSteps;
    fn step(&mut self, job: &Kernel, _: &()) -> Step<SumSteps> {
        let stop = self.end.min(self.next + job.per_step);
        for i in self.next..stop {
            if job.panic_at == Some(i) {
                panic!("boom at {i}");
            }
            let mut t = term(i, job.phase);
            for _ in 0..job.spin {
                t = std::hint::black_box(t);
            }
            self.acc.sum += t;
            self.acc.iterations += 1;
        }
        self.acc.steps += 1;
        self.next = stop;
        if self.next == self.end {
            Step::Done(self.acc)
        } else {
            Step::Yield
        }
    }
    fn iterations_done(&self) -> Option<u64> {
        Some(self.acc.iterations)
    }
}

/// Chunk ranges of `0..n` for a uniform chunking (as the executor cuts them).
pub fn chunk_ranges(n: u64, chunking: Chunking) -> Vec<Range<u64>> {
    let size = match chunking {
        Chunking::Size(s) => s.clamp(1, n.max(1)),
        Chunking::Count(c) => n.div_ceil(c.max(1)).max(1),
        _ => unreachable!(),
    };
    (0..n.div_ceil(size))
        .map(|c| c * size..((c + 1) * size).min(n))
        .collect()
}

/// The sequential answer: each chunk folded from the identity, chunk values added in order.
pub fn sequential(job: &Kernel, chunking: Chunking) -> SumSteps {
    let n = job.n + job.phase;
    let mut total = SumStepsReducer.identity();
    for r in chunk_ranges(n, chunking) {
        let mut acc = SumStepsReducer.identity();
        let mut i = r.start;
        while i < r.end {
            let stop = r.end.min(i + job.per_step);
            for j in i..stop {
                acc.sum += term(j, job.phase);
                acc.iterations += 1;
            }
            acc.steps += 1;
            i = stop;
        }
        SumStepsReducer.combine(&mut total, acc);
    }
    total
}

/// An error's text and its sources' texts, outermost first.
pub fn chain(e: &dyn std::error::Error) -> Vec<String> {
    let mut texts = vec![e.to_string()];
    let mut next = e.source();
    while let Some(s) = next {
        texts.push(s.to_string());
        next = s.source();
    }
    texts
}
