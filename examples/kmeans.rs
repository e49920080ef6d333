//! k-means clustering as a multi-phase malleable job.
//!
//! Each phase is one Lloyd iteration: a loop over the points that sums, per cluster, the
//! coordinates and the count of the points nearest to each centroid (a custom [`Reducer`]
//! adds the per-chunk sums in chunk order). At the barrier, [`Job::end_phase`] moves the
//! centroids to the means and asks for another phase until no centroid moves more than the
//! tolerance. The points are the job's [`Input`], generated once per process from a seed; the
//! job itself stays small (the centroids travel with it). The final centroids come from
//! [`Finished::job`] and are checked bit for bit against a sequential k-means with the same
//! chunked summation order.
//!
//! ```text
//! cargo run --release --example kmeans [POINTS]
//! ```

#[path = "kernels/mod.rs"]
mod kernels;

use std::ops::Range;
use std::time::Instant;

use malleable::reduce::Reducer;
use malleable::{BoxError, Chunk, Chunking, Executor, Finished, Input, Job, Next, Step};
use serde::{Deserialize, Serialize};

use kernels::kmeans::{self, ClusterSum, Point};

/// Points per chunk: fixed, so that the sequential reference can sum in the same order.
const CHUNK: u64 = 16_384;
/// Points per step.
const STEP: u64 = 4096;

/// The k-means job: the data set's description, the current centroids and the stopping rule.
#[derive(Serialize, Deserialize)]
struct KMeans {
    seed: u64,
    points: u64,
    /// The current centroids (`k` of them).
    centroids: Vec<Point>,
    /// Stop when no centroid moves more than this.
    tol: f64,
    max_iter: u32,
    /// Iterations done, and the last largest move.
    iter: u32,
    shift: f64,
}

/// The points, built once per process from the seed.
struct Points(Vec<Point>);

impl Input<KMeans> for Points {
    fn load(job: &KMeans) -> Result<Self, BoxError> {
        Ok(Points(kmeans::generate(
            job.seed,
            job.centroids.len(),
            job.points,
        )))
    }
}

/// Adds per-cluster sums element by element: identity `k` zero sums.
struct ClusterSums {
    k: usize,
}

impl Reducer for ClusterSums {
    type Value = Vec<ClusterSum>;

    fn identity(&self) -> Vec<ClusterSum> {
        vec![ClusterSum::default(); self.k]
    }

    fn combine(&self, acc: &mut Vec<ClusterSum>, next: Vec<ClusterSum>) {
        for (a, n) in acc.iter_mut().zip(&next) {
            a.add(n);
        }
    }
}

/// A range of points and the sums of the points seen so far.
#[derive(Serialize, Deserialize)]
struct KChunk {
    start: u64,
    next: u64,
    end: u64,
    sums: Vec<ClusterSum>,
}

impl Job for KMeans {
    const NAME: &'static str = "kmeans";
    type Chunk = KChunk;
    type Reducer = ClusterSums;
    type Input = Points;

    fn iterations(&self) -> u64 {
        self.points
    }

    fn chunk(&self, range: Range<u64>) -> KChunk {
        KChunk {
            start: range.start,
            next: range.start,
            end: range.end,
            sums: vec![ClusterSum::default(); self.centroids.len()],
        }
    }

    fn reducer(&self) -> ClusterSums {
        ClusterSums {
            k: self.centroids.len(),
        }
    }

    fn end_phase(&mut self, sums: &Vec<ClusterSum>) -> Next {
        self.shift = kmeans::update(&mut self.centroids, sums);
        self.iter += 1;
        if self.shift <= self.tol || self.iter >= self.max_iter {
            Next::Finish
        } else {
            Next::Continue
        }
    }
}

impl Chunk for KChunk {
    type Job = KMeans;
    type Output = Vec<ClusterSum>;

    fn step(&mut self, job: &KMeans, points: &Points) -> Step<Vec<ClusterSum>> {
        let stop = self.end.min(self.next + STEP);
        kmeans::accumulate(
            &points.0[self.next as usize..stop as usize],
            &job.centroids,
            &mut self.sums,
        );
        self.next = stop;
        if self.next == self.end {
            Step::Done(std::mem::take(&mut self.sums))
        } else {
            Step::Yield
        }
    }

    fn iterations_done(&self) -> Option<u64> {
        Some(self.next - self.start)
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: u64 = match std::env::args().nth(1) {
        Some(s) => s.replace('_', "").parse()?,
        None => 4_000_000,
    };
    let (seed, k, tol, max_iter) = (11, 8, 1e-9, 100);

    // The initial centroids are picked from the data, as any user of the job would.
    let t = Instant::now();
    let points = kmeans::generate(seed, k, n);
    let init = kmeans::initial_centroids(&points, k);
    let generate = t.elapsed();

    let exec = Executor::builder()
        .chunking(Chunking::Size(CHUNK))
        .build()?;
    let t = Instant::now();
    let Finished {
        job, value: sums, ..
    } = exec.run(KMeans {
        seed,
        points: n,
        centroids: init.clone(),
        tol,
        max_iter,
        iter: 0,
        shift: f64::INFINITY,
    })?;
    let parallel = t.elapsed();

    let t = Instant::now();
    let (expected, expected_iters) =
        kmeans::sequential(&points, init, CHUNK as usize, max_iter, tol);
    let sequential = t.elapsed();

    println!(
        "points       {n} in {k} clusters (data generated in {:.3} s)",
        generate.as_secs_f64()
    );
    println!(
        "iterations   {} (last move {:.2e}, tolerance {tol:.0e})",
        job.iter, job.shift
    );
    let truth = kmeans::true_centers(seed, k);
    for (c, (p, s)) in job.centroids.iter().zip(&sums).enumerate() {
        // The generating center nearest to this centroid, for comparison.
        let t = truth[kmeans::nearest(*p, &truth)];
        println!(
            "centroid {c}   ({:>8.4}, {:>8.4})  {:>7} points   true center ({:>8.4}, {:>8.4})",
            p[0], p[1], s.count, t[0], t[1]
        );
    }
    println!(
        "malleable    {:>7.3} s  ({:.1} ms per iteration, {} workers; includes generating the points in Input::load)",
        parallel.as_secs_f64(),
        parallel.saturating_sub(generate).as_secs_f64() * 1e3 / f64::from(job.iter),
        std::thread::available_parallelism().map_or(1, usize::from)
    );
    println!(
        "sequential   {:>7.3} s  ({:.1} ms per iteration; speedup {:.2}x)",
        sequential.as_secs_f64(),
        sequential.as_secs_f64() * 1e3 / f64::from(expected_iters),
        sequential.as_secs_f64() / parallel.as_secs_f64()
    );

    let bits = |cs: &[Point]| -> Vec<[u64; 2]> {
        cs.iter()
            .map(|p| [p[0].to_bits(), p[1].to_bits()])
            .collect()
    };
    if job.iter != expected_iters || bits(&job.centroids) != bits(&expected) {
        eprintln!(
            "FAILED: malleable gave {:?} after {} iterations, the sequential k-means {:?} after {}",
            job.centroids, job.iter, expected, expected_iters
        );
        std::process::exit(1);
    }
    println!(
        "check        ok: same centroids bit for bit and same iteration count as the sequential k-means"
    );
    Ok(())
}
