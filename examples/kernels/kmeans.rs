//! k-means helpers: generated 2-D points, nearest-centroid assignment, per-cluster sums and
//! the centroid update.
//!
//! Points come from a seed (`k` true centers, a spread of noise around each), so a job can
//! reference them by seed and every process builds the same set.

use serde::{Deserialize, Serialize};

use super::{random_at, unit_f64};

/// A point in the plane.
pub(crate) type Point = [f64; 2];

/// The running sums of one cluster: Σx, Σy and the number of points.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct ClusterSum {
    pub(crate) x: f64,
    pub(crate) y: f64,
    pub(crate) count: u64,
}

impl ClusterSum {
    /// Adds `other` into `self` (the order of additions matters for floats: callers fix it).
    #[inline]
    pub(crate) fn add(&mut self, other: &ClusterSum) {
        self.x += other.x;
        self.y += other.y;
        self.count += other.count;
    }
}

/// The `k` true centers of the generated data, on a circle of radius 10.
pub(crate) fn true_centers(seed: u64, k: usize) -> Vec<Point> {
    (0..k)
        .map(|c| {
            let jitter = unit_f64(random_at(seed ^ 0xC0FFEE, c as u64)) * 0.5;
            let a = std::f64::consts::TAU * (c as f64 + jitter) / k as f64;
            [10.0 * a.cos(), 10.0 * a.sin()]
        })
        .collect()
}

/// Point `i` of the data set `(seed, k)`: a true center plus noise of spread ~1.5.
#[inline]
pub(crate) fn point(seed: u64, k: usize, centers: &[Point], i: u64) -> Point {
    let r = random_at(seed, i);
    let c = &centers[(r % k as u64) as usize];
    // Sum of uniforms: a bell-shaped noise without transcendental functions.
    let n = |j: u64| {
        let mut s = 0.0;
        for t in 0..3 {
            s += unit_f64(random_at(seed.wrapping_add(j), 4 * i + t)) - 0.5;
        }
        s * 3.0
    };
    [c[0] + n(1), c[1] + n(2)]
}

/// The `n` points of the data set `(seed, k)`.
pub(crate) fn generate(seed: u64, k: usize, n: u64) -> Vec<Point> {
    let centers = true_centers(seed, k);
    (0..n).map(|i| point(seed, k, &centers, i)).collect()
}

/// Initial centroids by farthest-point traversal of the first 4096 points: the first point,
/// then repeatedly the point farthest from those already chosen (deterministic).
pub(crate) fn initial_centroids(points: &[Point], k: usize) -> Vec<Point> {
    let sample = &points[..points.len().min(4096)];
    let mut chosen = vec![sample[0]];
    let mut dist: Vec<f64> = sample.iter().map(|&p| dist2(p, sample[0])).collect();
    while chosen.len() < k {
        let (far, _) =
            dist.iter().enumerate().fold(
                (0, -1.0),
                |best, (i, &d)| if d > best.1 { (i, d) } else { best },
            );
        let c = sample[far];
        chosen.push(c);
        for (d, &p) in dist.iter_mut().zip(sample) {
            *d = d.min(dist2(p, c));
        }
    }
    chosen
}

/// Squared distance.
#[inline]
fn dist2(p: Point, q: Point) -> f64 {
    let (dx, dy) = (p[0] - q[0], p[1] - q[1]);
    dx * dx + dy * dy
}

/// The index of the centroid nearest to `p` (the first one on ties).
#[inline]
pub(crate) fn nearest(p: Point, centroids: &[Point]) -> usize {
    let mut best = (f64::INFINITY, 0);
    for (c, &q) in centroids.iter().enumerate() {
        let d = dist2(p, q);
        if d < best.0 {
            best = (d, c);
        }
    }
    best.1
}

/// Adds each point of `points` to the sums of its nearest centroid, in order.
#[inline]
pub(crate) fn accumulate(points: &[Point], centroids: &[Point], sums: &mut [ClusterSum]) {
    for &p in points {
        let s = &mut sums[nearest(p, centroids)];
        s.x += p[0];
        s.y += p[1];
        s.count += 1;
    }
}

/// Moves each centroid to the mean of its cluster (an empty cluster keeps its centroid) and
/// returns the largest distance a centroid moved.
pub(crate) fn update(centroids: &mut [Point], sums: &[ClusterSum]) -> f64 {
    let mut shift: f64 = 0.0;
    for (c, s) in centroids.iter_mut().zip(sums) {
        if s.count == 0 {
            continue;
        }
        let n = s.count as f64;
        let new = [s.x / n, s.y / n];
        let (dx, dy) = (new[0] - c[0], new[1] - c[1]);
        shift = shift.max((dx * dx + dy * dy).sqrt());
        *c = new;
    }
    shift
}

/// The sequential reference of a chunked k-means: each iteration sums every chunk of
/// `chunk` points from zero, adds the chunk sums in chunk order onto zero, then moves the
/// centroids; it stops when no centroid moved more than `tol` or after `max_iter` iterations.
/// Returns the centroids and the number of iterations.
pub(crate) fn sequential(
    points: &[Point],
    mut centroids: Vec<Point>,
    chunk: usize,
    max_iter: u32,
    tol: f64,
) -> (Vec<Point>, u32) {
    let k = centroids.len();
    let mut iters = 0;
    loop {
        let mut total = vec![ClusterSum::default(); k];
        let mut part = vec![ClusterSum::default(); k];
        for block in points.chunks(chunk) {
            part.fill(ClusterSum::default());
            accumulate(block, &centroids, &mut part);
            for (t, p) in total.iter_mut().zip(&part) {
                t.add(p);
            }
        }
        let shift = update(&mut centroids, &total);
        iters += 1;
        if shift <= tol || iters >= max_iter {
            return (centroids, iters);
        }
    }
}
