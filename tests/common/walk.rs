//! The walk job of the process-level tests (crash consistency, signals): phases of an
//! order-sensitive f64 sum, each phase depending on the one before (`carry`), so a phase
//! restored wrong poisons every later one.
//!
//! Its steps sleep where a test needs them to last: in a child process started with
//! [`PACE_ENV`] set, and for jobs whose `tag` is paced in this process ([`pace`]). The pace is
//! a property of the process (the job's `Input`), never of the job or its value, so every
//! resume computes at full speed.

use std::ops::Range;
use std::sync::Mutex;
use std::time::Duration;

use malleable::reduce::Reducer;
use malleable::{BoxError, Chunk, Input, Job, Next, Step};
use serde::{Deserialize, Serialize};

/// Set in a child process: every walk step there sleeps [`PACE`].
pub const PACE_ENV: &str = "MALLEABLE_TEST_PACE";
/// A paced step sleeps this long (unless [`PACE_ENV`] gives another number of milliseconds).
pub const PACE: Duration = Duration::from_millis(1);

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Walk {
    /// Names this run for [`pace`]; not used by the computation.
    pub tag: u64,
    pub n: u64,
    pub per_step: u64,
    pub phases: u64,
    pub phase: u64,
    pub carry: f64,
    /// The sum of every finished phase.
    pub history: Vec<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Total {
    pub sum: f64,
    pub iterations: u64,
}

pub struct TotalSum;

impl Reducer for TotalSum {
    type Value = Total;
    fn identity(&self) -> Total {
        Total {
            sum: 0.0,
            iterations: 0,
        }
    }
    fn combine(&self, acc: &mut Total, next: Total) {
        acc.sum += next.sum;
        acc.iterations += next.iterations;
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub struct WalkChunk {
    next: u64,
    end: u64,
    acc: Total,
}

/// Tags of the jobs whose steps sleep in this process (besides every job in the child).
static PACED: Mutex<Vec<u64>> = Mutex::new(Vec::new());

pub fn pace(tag: u64, on: bool) {
    let mut paced = PACED.lock().unwrap();
    paced.retain(|&t| t != tag);
    if on {
        paced.push(tag);
    }
}

/// Per-process pace, read once per job run when its first step needs it.
pub struct Pace(Duration);

impl Input<Walk> for Pace {
    fn load(job: &Walk) -> Result<Pace, BoxError> {
        let paced =
            std::env::var_os(PACE_ENV).is_some() || PACED.lock().unwrap().contains(&job.tag);
        // The variable's value, when a number, is the pace in milliseconds.
        let pace = std::env::var(PACE_ENV)
            .ok()
            .and_then(|v| v.parse().ok())
            .map_or(PACE, Duration::from_millis);
        Ok(Pace(if paced { pace } else { Duration::ZERO }))
    }
}

pub fn term(i: u64, phase: u64, carry: f64) -> f64 {
    let x = (i ^ phase.wrapping_mul(0x9E37_79B9)) as f64 + carry;
    1.0 / (1.0 + x.abs()) + (x * 1e-3).sin() * 1e7
}

impl Job for Walk {
    const NAME: &'static str = "walk";
    type Chunk = WalkChunk;
    type Reducer = TotalSum;
    type Input = Pace;

    fn iterations(&self) -> u64 {
        self.n + self.phase
    }
    fn chunk(&self, range: Range<u64>) -> WalkChunk {
        WalkChunk {
            next: range.start,
            end: range.end,
            acc: TotalSum.identity(),
        }
    }
    fn reducer(&self) -> TotalSum {
        TotalSum
    }
    fn end_phase(&mut self, value: &Total) -> Next {
        assert_eq!(value.iterations, self.iterations(), "exactly once");
        self.history.push(value.sum);
        self.carry = value.sum.rem_euclid(1000.0);
        self.phase += 1;
        if self.phase < self.phases {
            Next::Continue
        } else {
            Next::Finish
        }
    }
}

impl Chunk for WalkChunk {
    type Job = Walk;
    type Output = Total;
    fn step(&mut self, job: &Walk, pace: &Pace) -> Step<Total> {
        let stop = self.end.min(self.next + job.per_step);
        for i in self.next..stop {
            self.acc.sum += term(i, job.phase, job.carry);
            self.acc.iterations += 1;
        }
        self.next = stop;
        if !pace.0.is_zero() {
            std::thread::sleep(pace.0);
        }
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

/// The same computation as a plain loop: chunks of `chunk` iterations summed from zero, chunk
/// sums added in chunk order; returns the last phase's total and every phase's sum.
pub fn sequential(job: &Walk, chunk: u64) -> (Total, Vec<f64>) {
    let mut job = job.clone();
    loop {
        let n = job.iterations();
        let mut total = TotalSum.identity();
        let mut start = 0;
        while start < n {
            let end = n.min(start + chunk);
            let mut acc = TotalSum.identity();
            for i in start..end {
                acc.sum += term(i, job.phase, job.carry);
                acc.iterations += 1;
            }
            TotalSum.combine(&mut total, acc);
            start = end;
        }
        if job.end_phase(&total) == Next::Finish {
            return (total, job.history);
        }
    }
}
