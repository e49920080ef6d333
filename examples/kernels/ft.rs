//! A spectral time-stepper on a 2-D complex grid: the pattern of NAS FT.
//!
//! The grid has `ny × nx` complex cells (both powers of two), row-major. NAS FT, in two
//! dimensions:
//!
//! 1. `u` is filled from a seed ([`init_row`]) and transformed forward once ([`forward`]):
//!    FFTs of its rows (along x), a transpose, FFTs of the rows again (along y). The
//!    spectrum is then held *transposed*: row `kx`, column `ky`.
//! 2. Every step `t = 1, 2, …` multiplies the spectrum by the evolution factor
//!    `exp(−4π²α(k̄x² + k̄y²))` in place ([`evolve_row`]; `k̄ = k` below `n/2`, `k − n` from
//!    it), so after `t` steps it has been multiplied `t` times, as NAS's `evolve` does; then
//!    transforms a copy back ([`inverse`]: inverse FFTs of the transposed rows, a transpose,
//!    inverse FFTs of the rows; each 1-D inverse divides by its length), and takes the
//!    step's checksum of the result: the sum of the 1024 cells `(y, x) = (3j mod ny, j mod nx)`
//!    for `j = 1..=1024`, added in `j` order ([`checksum`]).
//!
//! The FFT is this module's own: an iterative radix-2 transform ([`Fft`]), twiddles computed
//! once per length from `cos`/`sin` (no recurrence).
//!
//! # The transpose as blocks
//!
//! For a run whose partitions hold rows, the transpose is an all-to-all: with `P`
//! partitions, partition `i` holds rows [`band`]`(rows, P, i)` and sends partition `j` the
//! block of its rows restricted to the columns of `j` ([`block_for`]); partition `j`
//! assembles the pieces from every partition, in sender order, into its rows of the
//! transposed grid ([`assemble`]). A transpose moves values without arithmetic, so it gives
//! the same bits however it is cut; every row transform, factor and checksum is per row or
//! per cell, so [`sequential`] (the reference), [`rayon`] (one task per row) and a run of
//! partitions all give the same bits.

use std::f64::consts::PI;
use std::ops::Range;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::stencil::{Digest, hash_cells, trace};
use super::{random_at, unit_f64};

/// A complex number.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct C {
    pub(crate) re: f64,
    pub(crate) im: f64,
}

impl C {
    pub(crate) const ZERO: C = C { re: 0.0, im: 0.0 };

    #[inline]
    fn add(self, o: C) -> C {
        C {
            re: self.re + o.re,
            im: self.im + o.im,
        }
    }

    #[inline]
    fn sub(self, o: C) -> C {
        C {
            re: self.re - o.re,
            im: self.im - o.im,
        }
    }

    #[inline]
    fn mul(self, o: C) -> C {
        C {
            re: self.re * o.re - self.im * o.im,
            im: self.re * o.im + self.im * o.re,
        }
    }

    #[inline]
    fn scale(self, s: f64) -> C {
        C {
            re: self.re * s,
            im: self.im * s,
        }
    }

    #[inline]
    fn conj(self) -> C {
        C {
            re: self.re,
            im: -self.im,
        }
    }

    /// Its bits, for a hash: the real parts then the imaginary ones would do as well; this
    /// is interleaved.
    fn flat(cells: &[C]) -> Vec<f64> {
        cells.iter().flat_map(|c| [c.re, c.im]).collect()
    }
}

/// An iterative radix-2 FFT of one length (a power of two).
#[derive(Debug, Clone)]
pub(crate) struct Fft {
    n: usize,
    /// `exp(−2πik/n)` for `k < n/2`.
    twiddles: Vec<C>,
}

impl Fft {
    /// # Panics
    ///
    /// If `n` is not a power of two.
    pub(crate) fn new(n: usize) -> Fft {
        assert!(n.is_power_of_two(), "an FFT of length {n}");
        let twiddles = (0..n / 2)
            .map(|k| {
                let a = -2.0 * PI * k as f64 / n as f64;
                C {
                    re: a.cos(),
                    im: a.sin(),
                }
            })
            .collect();
        Fft { n, twiddles }
    }

    /// The forward transform in place: `X[k] = Σ x[m] exp(−2πimk/n)`.
    pub(crate) fn forward(&self, a: &mut [C]) {
        self.transform(a, false);
    }

    /// The inverse transform in place, divided by `n`: `inverse(forward(x)) ≈ x`.
    pub(crate) fn inverse(&self, a: &mut [C]) {
        self.transform(a, true);
        let s = 1.0 / self.n as f64;
        for c in a {
            *c = c.scale(s);
        }
    }

    fn transform(&self, a: &mut [C], inverse: bool) {
        let n = self.n;
        assert_eq!(a.len(), n, "a row of the wrong length");
        if n == 1 {
            return;
        }
        let shift = usize::BITS - n.trailing_zeros();
        for i in 0..n {
            let j = i.reverse_bits() >> shift;
            if i < j {
                a.swap(i, j);
            }
        }
        let mut len = 2;
        while len <= n {
            let (half, stride) = (len / 2, n / len);
            for chunk in a.chunks_exact_mut(len) {
                let (lo, hi) = chunk.split_at_mut(half);
                for (k, (u, v)) in lo.iter_mut().zip(hi.iter_mut()).enumerate() {
                    let w = self.twiddles[k * stride];
                    let w = if inverse { w.conj() } else { w };
                    let t = v.mul(w);
                    (*u, *v) = (u.add(t), u.sub(t));
                }
            }
            len *= 2;
        }
    }
}

/// The problem: the grid's size, the diffusion constant and the seed of the initial values.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub(crate) struct Spec {
    pub(crate) ny: usize,
    pub(crate) nx: usize,
    pub(crate) alpha: f64,
    pub(crate) seed: u64,
}

/// NAS FT's checksum takes 1024 cells.
pub(crate) const CHECKSUM_CELLS: u64 = 1024;

impl Spec {
    /// A problem of `ny × nx` cells (powers of two) with NAS FT's `α = 10⁻⁶` scaled up by
    /// 1000 for the small grids of tests, and a seed.
    pub(crate) fn new(ny: usize, nx: usize, seed: u64) -> Spec {
        assert!(ny.is_power_of_two() && nx.is_power_of_two(), "{ny} × {nx}");
        Spec {
            ny,
            nx,
            alpha: 1e-3,
            seed,
        }
    }

    /// The cell `(y, x)` of checksum term `j` (1-based, as NAS counts).
    pub(crate) fn pick(&self, j: u64) -> (usize, usize) {
        (
            (3 * j % self.ny as u64) as usize,
            (j % self.nx as u64) as usize,
        )
    }
}

/// Row `y` of the initial grid: each part uniform in `[0, 1)` from the seed.
pub(crate) fn init_row(spec: &Spec, y: usize, row: &mut [C]) {
    for (x, c) in row.iter_mut().enumerate() {
        let i = 2 * (y * spec.nx + x) as u64;
        *c = C {
            re: unit_f64(random_at(spec.seed, i)),
            im: unit_f64(random_at(spec.seed, i + 1)),
        };
    }
}

/// `k̄²` for wave number `k` of a length `n`.
fn wave2(k: usize, n: usize) -> f64 {
    let k = if k < n / 2 {
        k as f64
    } else {
        k as f64 - n as f64
    };
    k * k
}

/// The evolution factors of transposed row `kx` (`ny` of them, one per `ky`).
pub(crate) fn factors_row(spec: &Spec, kx: usize) -> Vec<f64> {
    let ap = -4.0 * spec.alpha * PI * PI;
    let wx = wave2(kx, spec.nx);
    (0..spec.ny)
        .map(|ky| (ap * (wx + wave2(ky, spec.ny))).exp())
        .collect()
}

/// One step's evolution of a transposed row of the spectrum, in place.
#[inline]
pub(crate) fn evolve_row(row: &mut [C], factors: &[f64]) {
    for (c, &f) in row.iter_mut().zip(factors) {
        *c = c.scale(f);
    }
}

/// Band `i` of `n` rows cut into `parts` parts: `⌊n/P⌋` or `⌈n/P⌉` rows, the larger bands
/// first (as `malleable::Blocks` cuts a dimension; for powers of two and `P` dividing `n`
/// it is `[i·n/P, (i+1)·n/P)`).
pub(crate) fn band(n: usize, parts: usize, i: usize) -> Range<usize> {
    let (q, r) = (n / parts, n % parts);
    let start = i * q + i.min(r);
    start..start + q + usize::from(i < r)
}

/// The piece a partition sends partition `j` in a transpose: its rows (`rows`, `width`
/// cells each) restricted to `cols`, the columns partition `j` holds after the transpose;
/// row-major, `rows.len() / width` rows of `cols.len()` cells.
pub(crate) fn block_for(rows: &[C], width: usize, cols: Range<usize>) -> Vec<C> {
    let mut out = Vec::with_capacity(rows.len() / width * cols.len());
    for row in rows.chunks_exact(width) {
        out.extend_from_slice(&row[cols.clone()]);
    }
    out
}

/// A partition's rows of the transposed grid from the pieces every partition sent it, in
/// sender order (so their rows follow each other: together they are the `height` rows of
/// the grid before the transpose, restricted to this partition's `cols` columns). The result
/// has `cols` rows of `height` cells: row `c` is column `c` of the pieces.
///
/// # Panics
///
/// If the pieces do not hold `height` rows of `cols` cells between them.
pub(crate) fn assemble<'a>(
    pieces: impl IntoIterator<Item = &'a [C]>,
    cols: usize,
    height: usize,
) -> Vec<C> {
    let mut out = vec![C::ZERO; cols * height];
    let mut at = 0; // the first row of the next piece
    for piece in pieces {
        assert_eq!(piece.len() % cols, 0, "a piece of {} cells", piece.len());
        for (r, row) in piece.chunks_exact(cols).enumerate() {
            for (c, &v) in row.iter().enumerate() {
                out[c * height + at + r] = v;
            }
        }
        at += piece.len() / cols;
    }
    assert_eq!(at, height, "pieces of {at} rows in all, not {height}");
    out
}

/// The whole grid transposed: `rows × cols` into `cols × rows`.
pub(crate) fn transpose(grid: &[C], rows: usize, cols: usize) -> Vec<C> {
    let mut out = vec![C::ZERO; grid.len()];
    for (c, o) in out.chunks_exact_mut(rows).enumerate() {
        for (r, v) in o.iter_mut().enumerate() {
            *v = grid[r * cols + c];
        }
    }
    out
}

/// [`transpose`], one rayon task per row of the result.
pub(crate) fn transpose_par(grid: &[C], rows: usize, cols: usize) -> Vec<C> {
    let mut out = vec![C::ZERO; grid.len()];
    out.par_chunks_exact_mut(rows)
        .enumerate()
        .for_each(|(c, o)| {
            for (r, v) in o.iter_mut().enumerate() {
                *v = grid[r * cols + c];
            }
        });
    out
}

/// The checksum of a grid in normal layout: the 1024 picked cells added in `j` order.
pub(crate) fn checksum(spec: &Spec, grid: &[C]) -> C {
    sum_picks((1..=CHECKSUM_CELLS).map(|j| {
        let (y, x) = spec.pick(j);
        grid[y * spec.nx + x]
    }))
}

/// The checksum terms that fall in a partition's rows `rows` (normal layout, `rows` of the
/// grid as `cells`): `(j, value)`, `j` ascending. The terms of all partitions, merged by `j`,
/// go to [`sum_picks`].
pub(crate) fn picks_in(spec: &Spec, rows: Range<usize>, cells: &[C]) -> Vec<(u64, C)> {
    (1..=CHECKSUM_CELLS)
        .filter_map(|j| {
            let (y, x) = spec.pick(j);
            rows.contains(&y)
                .then(|| (j, cells[(y - rows.start) * spec.nx + x]))
        })
        .collect()
}

/// Checksum terms added in order from zero.
pub(crate) fn sum_picks(values: impl IntoIterator<Item = C>) -> C {
    values.into_iter().fold(C::ZERO, C::add)
}

/// The result of a run.
#[derive(Debug, Clone)]
pub(crate) struct Solution {
    /// The trace of every step's checksum (real then imaginary part) and the hash of each
    /// row of the last step's grid (normal layout).
    pub(crate) digest: Digest,
    pub(crate) checksums: Vec<C>,
    /// The last step's grid, normal layout.
    pub(crate) last: Vec<C>,
}

fn solution(spec: &Spec, checksums: Vec<C>, last: Vec<C>) -> Solution {
    let trace = checksums
        .iter()
        .fold(Digest::EMPTY_TRACE, |t, c| trace(trace(t, c.re), c.im));
    Solution {
        digest: Digest {
            trace,
            hashes: last
                .chunks_exact(spec.nx)
                .map(|r| hash_cells(&C::flat(r)))
                .collect(),
        },
        checksums,
        last,
    }
}

/// The 1-D transforms of a grid: along x (rows of the normal layout) and along y (rows of
/// the transposed one).
#[derive(Debug, Clone)]
pub(crate) struct Plans {
    pub(crate) fx: Fft,
    pub(crate) fy: Fft,
}

impl Plans {
    pub(crate) fn new(spec: &Spec) -> Plans {
        Plans {
            fx: Fft::new(spec.nx),
            fy: Fft::new(spec.ny),
        }
    }
}

/// The forward 2-D transform of a grid in normal layout: the spectrum, transposed.
pub(crate) fn forward(spec: &Spec, plans: &Plans, grid: &mut [C]) -> Vec<C> {
    let Plans { fx, fy } = plans;
    grid.chunks_exact_mut(spec.nx).for_each(|r| fx.forward(r));
    let mut t = transpose(grid, spec.ny, spec.nx);
    t.chunks_exact_mut(spec.ny).for_each(|r| fy.forward(r));
    t
}

/// The inverse 2-D transform of a transposed spectrum: the grid in normal layout.
pub(crate) fn inverse(spec: &Spec, plans: &Plans, spectrum: &mut [C]) -> Vec<C> {
    let Plans { fx, fy } = plans;
    spectrum
        .chunks_exact_mut(spec.ny)
        .for_each(|r| fy.inverse(r));
    let mut g = transpose(spectrum, spec.nx, spec.ny);
    g.chunks_exact_mut(spec.nx).for_each(|r| fx.inverse(r));
    g
}

/// The initial grid.
pub(crate) fn initial(spec: &Spec) -> Vec<C> {
    let mut g = vec![C::ZERO; spec.ny * spec.nx];
    for (y, r) in g.chunks_exact_mut(spec.nx).enumerate() {
        init_row(spec, y, r);
    }
    g
}

/// The sequential reference: `steps` time steps.
pub(crate) fn sequential(spec: &Spec, steps: u64) -> Solution {
    let plans = Plans::new(spec);
    let mut u = initial(spec);
    let mut spectrum = forward(spec, &plans, &mut u);
    let factors: Vec<f64> = (0..spec.nx).flat_map(|kx| factors_row(spec, kx)).collect();
    let mut checksums = Vec::new();
    let mut last = u;
    for _ in 0..steps {
        for (row, f) in spectrum
            .chunks_exact_mut(spec.ny)
            .zip(factors.chunks_exact(spec.ny))
        {
            evolve_row(row, f);
        }
        let mut copy = spectrum.clone();
        last = inverse(spec, &plans, &mut copy);
        checksums.push(checksum(spec, &last));
    }
    solution(spec, checksums, last)
}

/// The same steps with one rayon task per row (and per row of each transpose), in the
/// current rayon pool.
pub(crate) fn rayon(spec: &Spec, steps: u64) -> Solution {
    let (ny, nx) = (spec.ny, spec.nx);
    let Plans { fx, fy } = Plans::new(spec);
    let mut u = vec![C::ZERO; ny * nx];
    u.par_chunks_exact_mut(nx)
        .enumerate()
        .for_each(|(y, r)| init_row(spec, y, r));
    u.par_chunks_exact_mut(nx).for_each(|r| fx.forward(r));
    let mut spectrum = transpose_par(&u, ny, nx);
    spectrum
        .par_chunks_exact_mut(ny)
        .for_each(|r| fy.forward(r));
    let factors: Vec<Vec<f64>> = (0..nx)
        .into_par_iter()
        .map(|kx| factors_row(spec, kx))
        .collect();
    let mut checksums = Vec::new();
    let mut last = u;
    for _ in 0..steps {
        let mut copy = vec![C::ZERO; ny * nx];
        spectrum
            .par_chunks_exact_mut(ny)
            .zip(copy.par_chunks_exact_mut(ny))
            .zip(&factors)
            .for_each(|((row, out), f)| {
                evolve_row(row, f);
                out.copy_from_slice(row);
                fy.inverse(out);
            });
        last = transpose_par(&copy, nx, ny);
        last.par_chunks_exact_mut(nx).for_each(|r| fx.inverse(r));
        checksums.push(checksum(spec, &last));
    }
    solution(spec, checksums, last)
}
