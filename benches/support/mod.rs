//! Pieces shared by the benches (`mod support;`): a compute-bound fold, a percentile, a
//! list of sizes from the environment and a least-squares line.
#![allow(dead_code)]

use std::time::Duration;

use malleable::Fold;
use malleable::reduce::Sum;
use serde::{Deserialize, Serialize};

/// A compute-bound fold over `0..n`: a few multiplies and shifts per iteration, no memory.
#[derive(Serialize, Deserialize)]
pub(crate) struct Mix(pub(crate) u64);

impl Fold for Mix {
    const NAME: &'static str = "mix";
    type Acc = u64;
    type Reducer = Sum<u64>;
    type Input = ();
    fn iterations(&self) -> u64 {
        self.0
    }
    fn reducer(&self) -> Sum<u64> {
        Sum::new()
    }
    fn body(&self, _: &(), acc: &mut u64, i: u64) {
        let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        x ^= x >> 31;
        *acc = acc.wrapping_add(x.wrapping_mul(0xBF58_476D_1CE4_E5B9));
    }
}

/// The `p` quantile (0..=1) of `v`, which it sorts.
pub(crate) fn percentile(v: &mut [Duration], p: f64) -> Duration {
    v.sort_unstable();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// The comma-separated numbers of environment variable `var`, or `default`.
pub(crate) fn list<T: Copy + std::str::FromStr>(var: &str, default: &[T]) -> Vec<T>
where
    T::Err: std::fmt::Display,
{
    match std::env::var(var) {
        Ok(s) => s
            .split(',')
            .map(|x| {
                x.trim()
                    .parse()
                    .unwrap_or_else(|e| panic!("{var}: {x:?}: {e}"))
            })
            .collect(),
        Err(_) => default.to_vec(),
    }
}

/// Least squares slope and intercept of `y` against `x`.
pub(crate) fn fit(points: &[(f64, f64)]) -> (f64, f64) {
    let n = points.len() as f64;
    let (sx, sy) = points
        .iter()
        .fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let (mx, my) = (sx / n, sy / n);
    let sxx: f64 = points.iter().map(|(x, _)| (x - mx) * (x - mx)).sum();
    let sxy: f64 = points.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
    let slope = if sxx > 0.0 { sxy / sxx } else { 0.0 };
    (slope, my - slope * mx)
}

/// A worker process's body: serves the coordinator at `addr` until its job ends. Started
/// before its job is submitted, it is refused as a worker of no running job until then, and
/// tries again; a job that ended before it could join (a short one, done by the other
/// processes) ends it quietly; any other error ends the process with code 3.
pub(crate) fn serve_until_the_end(
    addr: &str,
    registry: &malleable::cluster::Registry,
    options: &malleable::cluster::WorkerOptions,
) {
    loop {
        match malleable::cluster::serve(addr, registry, options.clone()) {
            Err(malleable::cluster::Error::UnknownJob { .. }) => {
                std::thread::sleep(Duration::from_micros(500));
            }
            Ok(_) | Err(malleable::cluster::Error::JobEnded { .. }) => return,
            Err(e) => {
                eprintln!("worker: {e}");
                std::process::exit(3);
            }
        }
    }
}

/// A coordinator that computes nothing (no local worker), listening on loopback for worker
/// processes, and its address.
pub(crate) fn loopback_coordinator() -> (malleable::Executor, String) {
    let exec = malleable::Executor::builder()
        .local_workers(0)
        .listen("127.0.0.1:0")
        .build()
        .expect("a coordinator");
    let addr = exec.local_addr().expect("listening").to_string();
    (exec, addr)
}
