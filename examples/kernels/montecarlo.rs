//! Monte Carlo π: throw points into the unit square, count those inside the quarter circle.
//!
//! Point `i` comes from a counter-based generator (`random_at(seed, i)`), so it does not depend
//! on which worker draws it or in what order: any split of `0..n` counts the same points.

use super::random_at;

/// Whether sample `i` of stream `seed` falls inside the unit quarter circle.
///
/// One 64-bit random value gives two 32-bit coordinates `x, y` in `[0, 2³²)`; the point is
/// inside when `x² + y² < 2⁶⁴`, tested exactly in integers (each square fits in a `u64`, and
/// the sum overflows exactly when it reaches 2⁶⁴).
#[inline]
pub(crate) fn in_circle(seed: u64, i: u64) -> bool {
    let r = random_at(seed, i);
    let (x, y) = (r >> 32, r & 0xFFFF_FFFF);
    !(x * x).overflowing_add(y * y).1
}

/// How many of the samples in `range` fall inside the circle.
#[inline]
pub(crate) fn count_range(seed: u64, range: std::ops::Range<u64>) -> u64 {
    let mut hits = 0;
    for i in range {
        hits += u64::from(in_circle(seed, i));
    }
    hits
}

/// The sequential reference: hits among samples `0..n`.
pub(crate) fn sequential(seed: u64, n: u64) -> u64 {
    count_range(seed, 0..n)
}

/// π estimated from `hits` among `n` samples.
pub(crate) fn estimate(hits: u64, n: u64) -> f64 {
    4.0 * hits as f64 / n as f64
}
