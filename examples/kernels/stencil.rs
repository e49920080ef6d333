//! Stencils over a grid of rows that lives across phases: a Jacobi heat solver, the Java
//! Grande Forum's red-black SOR and a D2Q9 Lattice-Boltzmann channel.
//!
//! Each kernel comes three ways, which give the same bits:
//!
//! - `sequential`: the plain loop over phases and rows, the reference;
//! - `rayon`: the same rows with `par_chunks_mut` (run it inside a pool's `install`);
//! - a [`Rows`] implementation, run by the executor as `Banded(kernel)`: the grid cut into
//!   bands of rows that stay on their workers from phase to phase.
//!
//! All three call the same function for one row (`heat::row`, `sor::row`, `lbm::row`), in the
//! same row order within a phase, so the arithmetic is the same; what the check tests is the
//! machinery around it (bands, halos, swaps, snapshots, workers joining).
//!
//! # How a result is compared
//!
//! Every run ends with a [`Digest`]: a hash of each row of the final grid (their cells' bits),
//! and a hash of the scalar each phase reported (the largest change, the mass, …). A
//! malleable run computes the row hashes in its last phase, on the workers that hold the rows,
//! and returns them through the reduction in row order ([`Checked`] around the kernel's own
//! reducer); no grid crosses the barrier. Scalars that are sums are summed per row first,
//! then over the rows in row order, in every version, so they do not depend on where the
//! bands start.
//!
//! Unlike the plain kernels next to it, this module knows `malleable`: it holds the [`Rows`]
//! impls, next to the loops they must agree with.

use std::sync::Mutex;
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::Instant;

use malleable::reduce::{CollectInOrder, Max, Reducer};
use malleable::rows::{Rows, Sweep, Window};
use malleable::{Banded, Finished, Next};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

// ---------------------------------------------------------------------------------------
// What every run ends with.

/// The FNV-1a offset basis and prime, used word by word.
const FNV_OFFSET: u64 = 0xCBF2_9CE4_8422_2325;
const FNV_PRIME: u64 = 0x0100_0000_01B3;

/// A hash of a row's cells, bit for bit (FNV-1a over 64-bit words).
pub(crate) fn hash_cells(cells: &[f64]) -> u64 {
    cells
        .iter()
        .fold(FNV_OFFSET, |h, x| (h ^ x.to_bits()).wrapping_mul(FNV_PRIME))
}

/// Folds one more scalar into a trace of scalars (start from [`Digest::EMPTY_TRACE`]).
pub(crate) fn trace(h: u64, x: f64) -> u64 {
    (h ^ x.to_bits()).wrapping_mul(FNV_PRIME)
}

/// The end of a run, to compare runs bit for bit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Digest {
    /// [`trace`] of the scalars of every phase, in phase order.
    pub(crate) trace: u64,
    /// [`hash_cells`] of every row of the final grid, in row order.
    pub(crate) hashes: Vec<u64>,
}

impl Digest {
    pub(crate) const EMPTY_TRACE: u64 = FNV_OFFSET;

    /// The first row that differs from `other`'s, if any (`Some(len)` for a missing row).
    pub(crate) fn first_difference(&self, other: &Digest) -> Option<usize> {
        let rows = self.hashes.len().max(other.hashes.len());
        (0..rows).find(|&i| self.hashes.get(i) != other.hashes.get(i))
    }
}

/// How an example names what its [`Digest`] covers, for [`check_all`].
pub(crate) struct Wording {
    /// One hashed item and where it is: `("line", "of the final grid")`.
    pub(crate) item: (&'static str, &'static str),
    /// Said when every item matches but the trace of scalars does not.
    pub(crate) trace: &'static str,
    /// Said when everything matches.
    pub(crate) ok: &'static str,
}

/// Prints each run's check against `reference` and the verdict; whether all passed.
pub(crate) fn check_all(reference: &Digest, runs: &[(&str, &Digest)], w: &Wording) -> bool {
    let mut ok = true;
    for (what, got) in runs {
        let verdict = match got.first_difference(reference) {
            Some(i) => format!("FAILED: {} {i} {} differs", w.item.0, w.item.1),
            None if got.trace != reference.trace => format!("FAILED: {}", w.trace),
            None => format!("ok: {}", w.ok),
        };
        println!("check  {what}: {verdict}");
        ok &= verdict.starts_with("ok");
    }
    println!("\n{}", if ok { "all checks passed" } else { "FAILED" });
    ok
}

/// What a band reports for a phase: the kernel's value and, in the last phase only, the hash
/// of each of its rows in row order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Report<T> {
    pub(crate) value: T,
    pub(crate) hashes: Vec<u64>,
}

/// Combines [`Report`]s in band order: the values with the kernel's reducer, the row hashes
/// concatenated.
#[derive(Debug, Default)]
pub(crate) struct Checked<R>(pub(crate) R);

impl<R: Reducer> Reducer for Checked<R> {
    type Value = Report<R::Value>;

    fn identity(&self) -> Report<R::Value> {
        Report {
            value: self.0.identity(),
            hashes: Vec::new(),
        }
    }

    fn combine(&self, acc: &mut Report<R::Value>, mut next: Report<R::Value>) {
        self.0.combine(&mut acc.value, next.value);
        acc.hashes.append(&mut next.hashes);
    }
}

/// Row hashes of a whole grid, `width` cells per row (the sequential and rayon versions).
pub(crate) fn grid_hashes(grid: &[f64], width: usize) -> Vec<u64> {
    grid.chunks_exact(width).map(hash_cells).collect()
}

/// [`grid_hashes`], a row per rayon task.
pub(crate) fn grid_hashes_par(grid: &[f64], width: usize) -> Vec<u64> {
    grid.par_chunks_exact(width).map(hash_cells).collect()
}

// ---------------------------------------------------------------------------------------
// Phase ends, for a program that prints them.

/// The end of a phase, as a kernel's `end_phase` saw it at the barrier.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PhaseEnd {
    pub(crate) kernel: &'static str,
    /// The phase that ended (0-based).
    pub(crate) phase: u64,
    /// Its scalar (the heat solver's largest change, the channel's kinetic energy, …).
    pub(crate) value: f64,
    pub(crate) at: Instant,
}

/// Where `end_phase` sends phase ends. A process-wide slot rather than a field of the job:
/// a job restored from a snapshot is a new value, and its phases should still be reported.
static PHASE_ENDS: Mutex<Option<Sender<PhaseEnd>>> = Mutex::new(None);

/// Reports every following phase end of any kernel of this module in this process to the
/// returned receiver (replacing an earlier one).
pub(crate) fn watch_phases() -> Receiver<PhaseEnd> {
    let (tx, rx) = mpsc::channel();
    *PHASE_ENDS.lock().expect("phase log") = Some(tx);
    rx
}

/// Reports a phase end to the receiver of [`watch_phases`], if any.
pub(crate) fn phase_ended(kernel: &'static str, phase: u64, value: f64) {
    if let Some(tx) = &*PHASE_ENDS.lock().expect("phase log") {
        let _ = tx.send(PhaseEnd {
            kernel,
            phase,
            value,
            at: Instant::now(),
        });
    }
}

/// Rows per band when `height` rows are cut into `bands` bands, as `Chunking::Count` cuts
/// them (`ceil(height / bands)`, the last band shorter).
pub(crate) fn band_rows(height: usize, bands: usize) -> usize {
    height.div_ceil(bands.max(1)).max(1)
}

// ---------------------------------------------------------------------------------------
// Heat: 2-D Jacobi diffusion.

pub(crate) mod heat {
    //! Heat diffusion on an `n × n` plate: the top edge is held at 1.0, the other edges at
    //! 0.0, the interior starts at 0.0. A phase is one Jacobi sweep of the five-point stencil
    //! (every interior cell becomes the mean of its four neighbours from the previous phase),
    //! double-buffered; its scalar is the largest change of a cell, combined with `Max`.

    use super::*;

    /// The value of row `i` before the first phase.
    pub(crate) fn init(i: u64, row: &mut [f64]) {
        row.fill(if i == 0 { 1.0 } else { 0.0 });
    }

    /// Row `i` of the next phase from rows `i - 1`, `i`, `i + 1` of this one (an interior
    /// row: the edges of the row are copied); returns the largest change of a cell.
    #[inline]
    pub(crate) fn row(above: &[f64], old: &[f64], below: &[f64], new: &mut [f64]) -> f64 {
        let w = old.len();
        new[0] = old[0];
        new[w - 1] = old[w - 1];
        let m = w - 2;
        // Equal lengths, so the loop runs without bounds checks.
        let (up, down) = (&above[1..=m], &below[1..=m]);
        let (left, mid, right) = (&old[..m], &old[1..=m], &old[2..]);
        let out = &mut new[1..=m];
        // The largest change is kept in `LANES` separate maxima, so that the loop is not one
        // chain of dependent comparisons and vectorizes; `max` is exact, so splitting it does
        // not change the result.
        const LANES: usize = 4;
        let mut change = [0.0f64; LANES];
        let cell = |j: usize| 0.25 * ((up[j] + down[j]) + (left[j] + right[j]));
        let whole = m / LANES * LANES;
        for base in (0..whole).step_by(LANES) {
            for (l, c) in change.iter_mut().enumerate() {
                let v = cell(base + l);
                *c = c.max((v - mid[base + l]).abs());
                out[base + l] = v;
            }
        }
        for j in whole..m {
            let v = cell(j);
            change[0] = change[0].max((v - mid[j]).abs());
            out[j] = v;
        }
        change.into_iter().fold(0.0, f64::max)
    }

    /// Row `i` of the next phase, edge rows included (they are copied, change 0).
    #[inline]
    fn any_row(grid: &[f64], n: usize, i: usize, new: &mut [f64]) -> f64 {
        let old = &grid[i * n..(i + 1) * n];
        if i == 0 || i == n - 1 {
            new.copy_from_slice(old);
            0.0
        } else {
            row(
                &grid[(i - 1) * n..i * n],
                old,
                &grid[(i + 1) * n..(i + 2) * n],
                new,
            )
        }
    }

    /// The result of a run: its digest and the last phase's largest change.
    #[derive(Debug, Clone)]
    pub(crate) struct Solution {
        pub(crate) digest: Digest,
        pub(crate) change: f64,
    }

    /// The sequential reference: `phases` Jacobi sweeps of an `n × n` plate.
    pub(crate) fn sequential(n: usize, phases: u64) -> Solution {
        let mut cur = vec![0.0; n * n];
        cur.chunks_exact_mut(n)
            .enumerate()
            .for_each(|(i, r)| init(i as u64, r));
        let mut new = vec![0.0; n * n];
        let (mut t, mut change) = (Digest::EMPTY_TRACE, 0.0);
        for _ in 0..phases {
            change = 0.0f64;
            for (i, r) in new.chunks_exact_mut(n).enumerate() {
                change = change.max(any_row(&cur, n, i, r));
            }
            t = trace(t, change);
            std::mem::swap(&mut cur, &mut new);
        }
        Solution {
            digest: Digest {
                trace: t,
                hashes: grid_hashes(&cur, n),
            },
            change,
        }
    }

    /// The same sweeps with one rayon task per row, in the current rayon pool.
    pub(crate) fn rayon(n: usize, phases: u64) -> Solution {
        let mut cur = vec![0.0; n * n];
        cur.par_chunks_exact_mut(n)
            .enumerate()
            .for_each(|(i, r)| init(i as u64, r));
        let mut new = vec![0.0; n * n];
        let (mut t, mut change) = (Digest::EMPTY_TRACE, 0.0);
        for _ in 0..phases {
            let old = &cur;
            change = new
                .par_chunks_exact_mut(n)
                .enumerate()
                .map(|(i, r)| any_row(old, n, i, r))
                .reduce(|| 0.0, f64::max);
            t = trace(t, change);
            std::mem::swap(&mut cur, &mut new);
        }
        Solution {
            digest: Digest {
                trace: t,
                hashes: grid_hashes_par(&cur, n),
            },
            change,
        }
    }

    /// The plate as a malleable job: `exec.run(Banded(Heat::new(n, phases)))`.
    #[derive(Debug, Clone, Serialize, Deserialize)]
    pub(crate) struct Heat {
        pub(crate) n: u64,
        pub(crate) phases: u64,
        pub(crate) bands: u64,
        /// Phases done.
        pub(crate) phase: u64,
        /// The last phase's largest change, and the trace of all of them.
        pub(crate) change: f64,
        pub(crate) trace: u64,
    }

    impl Heat {
        pub(crate) fn new(n: u64, phases: u64) -> Heat {
            Heat {
                n,
                phases,
                bands: 32,
                phase: 0,
                change: f64::NAN,
                trace: Digest::EMPTY_TRACE,
            }
        }

        /// The result of a finished run.
        pub(crate) fn solution(done: &Finished<Banded<Heat>>) -> Solution {
            Solution {
                digest: Digest {
                    trace: done.job.0.trace,
                    hashes: done.value.hashes.clone(),
                },
                change: done.job.0.change,
            }
        }
    }

    impl Rows for Heat {
        const NAME: &'static str = "heat";
        type Element = f64;
        type Acc = Report<f64>;
        type Reducer = Checked<Max<f64>>;
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
        fn reducer(&self) -> Checked<Max<f64>> {
            Checked(Max::new())
        }
        fn init(&self, _: &(), i: u64, row: &mut [f64]) {
            init(i, row);
        }
        fn update(&self, _: &(), _i: u64, win: Window<'_, f64>, acc: &mut Report<f64>) {
            let change = match (win.above, win.below) {
                (Some(above), Some(below)) => row(above, win.old, below, win.row),
                _ => {
                    win.row.copy_from_slice(win.old);
                    0.0
                }
            };
            acc.value = acc.value.max(change);
            if self.phase + 1 == self.phases {
                acc.hashes.push(hash_cells(win.row));
            }
        }
        fn end_phase(&mut self, report: &Report<f64>) -> Next {
            self.change = report.value;
            self.trace = trace(self.trace, report.value);
            phase_ended(Self::NAME, self.phase, report.value);
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
}

// ---------------------------------------------------------------------------------------
// SOR: the Java Grande Forum's red-black successive over-relaxation.

pub(crate) mod sor {
    //! Successive over-relaxation of the Laplace equation as in the Java Grande Forum
    //! benchmark suite, section 2, thread version (`SOR.java`, `JGFSORBench.java`).
    //!
    //! - The grid is `n × n` (size A: 1000, B: 1500, C: 2000), filled row by row with
    //!   `java.util.Random(10101010).nextDouble() * 1e-6` ([`JavaRandom`]). Its edge rows and
    //!   columns are never updated.
    //! - ω = 1.25: a cell becomes `ω/4 · (up + down + left + right) + (1 − ω) · itself`, the
    //!   sums in that order, as Java evaluates them (no fused multiply-add).
    //! - The threaded version is red-black: each of its 100 iterations is two half-sweeps
    //!   with a barrier between them; half-sweep `p` updates the interior cells with
    //!   `(i + j) % 2 == p % 2` (the threads' loop over every other row `i` updates the odd
    //!   columns of row `i` and the even ones of row `i - 1`, which is that set). A cell's
    //!   neighbours all have the other colour, so the order inside a half-sweep does not
    //!   matter: the bits are those of any thread count. Here a half-sweep is one phase
    //!   ([`Sweep::InPlace`]), 200 phases for 100 iterations.
    //! - `Gtotal`, the check value, is the plain sum of the interior cells in row-major order.
    //!   The threaded suite's reference values are below ([`REFERENCE`]); they differ from the
    //!   sequential suite's, which sweeps in lexicographic order instead of red-black.
    //!
    //! The [`Rows`] version returns, in its last phase, the sum of each row's interior cells;
    //! [`gtotal_by_rows`] adds them in row order (a different rounding from JGF's single
    //! running sum, so the example compares it with the sequential loop's own row sums bit
    //! for bit, and with JGF's value at JGF's tolerance).

    use super::*;

    /// JGF's ω.
    pub(crate) const OMEGA: f64 = 1.25;
    /// JGF's `RANDOM_SEED`.
    pub(crate) const SEED: i64 = 10101010;
    /// JGF's `JACOBI_NUM_ITER`: red-black iterations (two phases each).
    pub(crate) const ITERATIONS: u64 = 100;
    /// JGF's tolerance on `Gtotal`.
    pub(crate) const TOLERANCE: f64 = 1.0e-12;
    /// JGF's sizes A, B, C and the threaded suite's `Gtotal` for each (`JGFvalidate`).
    pub(crate) const REFERENCE: [(char, usize, f64); 3] = [
        ('A', 1000, 0.498574406322512),
        ('B', 1500, 1.1234778980135105),
        ('C', 2000, 1.9954895063582696),
    ];

    /// `java.util.Random`: a 48-bit linear congruential generator.
    #[derive(Debug, Clone)]
    pub(crate) struct JavaRandom {
        state: u64,
    }

    impl JavaRandom {
        const MULTIPLIER: u64 = 0x5_DEEC_E66D;
        const ADDEND: u64 = 0xB;
        const MASK: u64 = (1 << 48) - 1;

        /// `new Random(seed)`.
        pub(crate) fn new(seed: i64) -> JavaRandom {
            JavaRandom {
                state: (seed as u64 ^ Self::MULTIPLIER) & Self::MASK,
            }
        }

        /// `next(bits)`, for `bits <= 31` (non-negative then).
        fn next(&mut self, bits: u32) -> u64 {
            self.state = (self
                .state
                .wrapping_mul(Self::MULTIPLIER)
                .wrapping_add(Self::ADDEND))
                & Self::MASK;
            self.state >> (48 - bits)
        }

        /// `nextDouble()`: 53 random bits over 2⁵³.
        pub(crate) fn next_double(&mut self) -> f64 {
            ((self.next(26) << 27) + self.next(27)) as f64 * (1.0 / (1u64 << 53) as f64)
        }

        /// Skips `doubles` calls of [`next_double`](Self::next_double) (two steps each) in
        /// O(log n): `k` steps of `x ↦ a·x + c` are `x ↦ aᵏ·x + c·(aᵏ⁻¹ + … + 1)`, composed
        /// by squaring. Arithmetic mod 2⁶⁴ then masked is arithmetic mod 2⁴⁸.
        pub(crate) fn skip_doubles(&mut self, doubles: u64) {
            let (mut a, mut c) = (1u64, 0u64); // the steps taken so far
            let (mut sq_a, mut sq_c) = (Self::MULTIPLIER, Self::ADDEND); // 2^bit steps
            let mut k = doubles.wrapping_mul(2);
            while k > 0 {
                if k & 1 == 1 {
                    a = a.wrapping_mul(sq_a);
                    c = c.wrapping_mul(sq_a).wrapping_add(sq_c);
                }
                sq_c = sq_a.wrapping_add(1).wrapping_mul(sq_c);
                sq_a = sq_a.wrapping_mul(sq_a);
                k >>= 1;
            }
            self.state = a.wrapping_mul(self.state).wrapping_add(c) & Self::MASK;
        }
    }

    /// Row `i` of JGF's `RandomMatrix(n, n, new Random(seed))`.
    pub(crate) fn init(seed: i64, n: usize, i: u64, row: &mut [f64]) {
        let mut r = JavaRandom::new(seed);
        r.skip_doubles(i * n as u64);
        for x in row {
            *x = r.next_double() * 1e-6;
        }
    }

    /// The colour half-sweep `phase` updates: cells with `(i + j) % 2 == colour`.
    pub(crate) fn colour(phase: u64) -> u64 {
        phase % 2
    }

    /// Updates the cells of colour `colour` of interior row `i` in place, from the row above
    /// and the row below (whose cells of that colour it does not read).
    #[inline]
    pub(crate) fn row(i: u64, colour: u64, above: &[f64], row: &mut [f64], below: &[f64]) {
        let n = row.len();
        let (above, below) = (&above[..n], &below[..n]);
        let (omega_over_four, one_minus_omega) = (OMEGA * 0.25, 1.0 - OMEGA);
        let first = if (i + 1) % 2 == colour { 1 } else { 2 };
        for j in (first..n - 1).step_by(2) {
            row[j] = omega_over_four * (above[j] + below[j] + row[j - 1] + row[j + 1])
                + one_minus_omega * row[j];
        }
    }

    /// The sum of a row's interior cells (all but its first and last), left to right.
    pub(crate) fn interior_sum(row: &[f64]) -> f64 {
        row[1..row.len() - 1].iter().fold(0.0, |s, x| s + x)
    }

    /// JGF's `Gtotal`: the interior cells of an `n × n` grid summed in row-major order.
    pub(crate) fn gtotal(grid: &[f64], n: usize) -> f64 {
        let mut total = 0.0;
        for i in 1..n - 1 {
            for j in 1..n - 1 {
                total += grid[i * n + j];
            }
        }
        total
    }

    /// `Gtotal` as the malleable version computes it: per-row sums, then over the rows.
    pub(crate) fn gtotal_by_rows(row_sums: &[f64]) -> f64 {
        row_sums.iter().fold(0.0, |s, x| s + x)
    }

    /// The result of a run.
    #[derive(Debug, Clone)]
    pub(crate) struct Solution {
        pub(crate) digest: Digest,
        /// [`gtotal_by_rows`] of the final grid.
        pub(crate) gtotal_by_rows: f64,
        /// The final grid, when the version has it in one piece (not the malleable one).
        pub(crate) grid: Option<Vec<f64>>,
    }

    fn solution(grid: Vec<f64>, n: usize, hashes: Vec<u64>) -> Solution {
        let sums: Vec<f64> = (1..n - 1)
            .map(|i| interior_sum(&grid[i * n..(i + 1) * n]))
            .collect();
        let total = gtotal_by_rows(&sums);
        Solution {
            digest: Digest {
                trace: trace(Digest::EMPTY_TRACE, total),
                hashes,
            },
            gtotal_by_rows: total,
            grid: Some(grid),
        }
    }

    /// The sequential reference: JGF's matrix, then `iterations` red-black iterations as a
    /// plain loop over the half-sweeps and the interior rows.
    pub(crate) fn sequential(n: usize, iterations: u64) -> Solution {
        let mut r = JavaRandom::new(SEED);
        let mut g: Vec<f64> = (0..n * n).map(|_| r.next_double() * 1e-6).collect();
        for p in 0..2 * iterations {
            for i in 1..n - 1 {
                let (head, tail) = g.split_at_mut(i * n);
                let (mid, rest) = tail.split_at_mut(n);
                row(i as u64, colour(p), &head[(i - 1) * n..], mid, &rest[..n]);
            }
        }
        let hashes = grid_hashes(&g, n);
        solution(g, n, hashes)
    }

    /// The same half-sweeps over `bands` bands of rows, one rayon task per band. A band's
    /// first and last rows read the rows next to it from copies taken before the half-sweep
    /// (the cells they read are of the colour the half-sweep does not write).
    pub(crate) fn rayon(n: usize, iterations: u64, bands: usize) -> Solution {
        let mut g = vec![0.0; n * n];
        g.par_chunks_exact_mut(n)
            .enumerate()
            .for_each(|(i, r)| init(SEED, n, i as u64, r));
        let per = band_rows(n, bands);
        let count = n.div_ceil(per);
        let mut halos = vec![(vec![0.0; n], vec![0.0; n]); count];
        for p in 0..2 * iterations {
            for (b, (up, down)) in halos.iter_mut().enumerate() {
                let (start, end) = (b * per, ((b + 1) * per).min(n));
                if start > 0 {
                    up.copy_from_slice(&g[(start - 1) * n..start * n]);
                }
                if end < n {
                    down.copy_from_slice(&g[end * n..(end + 1) * n]);
                }
            }
            g.par_chunks_mut(per * n)
                .zip(halos.par_iter())
                .enumerate()
                .for_each(|(b, (band, (up, down)))| {
                    let rows = band.len() / n;
                    for k in 0..rows {
                        let i = b * per + k;
                        if i == 0 || i == n - 1 {
                            continue;
                        }
                        let (head, tail) = band.split_at_mut(k * n);
                        let (mid, rest) = tail.split_at_mut(n);
                        let above = if k == 0 {
                            &up[..]
                        } else {
                            &head[(k - 1) * n..]
                        };
                        let below = if k + 1 == rows { &down[..] } else { &rest[..n] };
                        row(i as u64, colour(p), above, mid, below);
                    }
                });
        }
        let hashes = grid_hashes_par(&g, n);
        solution(g, n, hashes)
    }

    /// JGF's SOR as a malleable job: `exec.run(Banded(Sor::new(n, iterations)))`.
    #[derive(Debug, Clone, Serialize, Deserialize)]
    pub(crate) struct Sor {
        pub(crate) n: u64,
        pub(crate) iterations: u64,
        pub(crate) bands: u64,
        /// Half-sweeps done.
        pub(crate) phase: u64,
    }

    impl Sor {
        pub(crate) fn new(n: u64, iterations: u64) -> Sor {
            Sor {
                n,
                iterations,
                bands: 32,
                phase: 0,
            }
        }

        fn last_phase(&self) -> bool {
            self.phase + 1 == 2 * self.iterations
        }

        /// The result of a finished run (the interior row sums come with the last phase).
        pub(crate) fn solution(done: &Finished<Banded<Sor>>) -> Solution {
            let total = gtotal_by_rows(&done.value.value);
            Solution {
                digest: Digest {
                    trace: trace(Digest::EMPTY_TRACE, total),
                    hashes: done.value.hashes.clone(),
                },
                gtotal_by_rows: total,
                grid: None,
            }
        }
    }

    impl Rows for Sor {
        const NAME: &'static str = "jgf-sor";
        const SWEEP: Sweep = Sweep::InPlace;
        type Element = f64;
        /// In the last phase: the interior sum of each interior row, in row order.
        type Acc = Report<Vec<f64>>;
        type Reducer = Checked<CollectInOrder<f64>>;
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
        fn reducer(&self) -> Checked<CollectInOrder<f64>> {
            Checked(CollectInOrder::new())
        }
        fn init(&self, _: &(), i: u64, r: &mut [f64]) {
            init(SEED, self.n as usize, i, r);
        }
        fn update(&self, _: &(), i: u64, win: Window<'_, f64>, acc: &mut Report<Vec<f64>>) {
            let interior = match (win.above, win.below) {
                (Some(above), Some(below)) => {
                    row(i, colour(self.phase), above, win.row, below);
                    true
                }
                _ => false, // an edge row: never updated
            };
            if self.last_phase() {
                if interior {
                    acc.value.push(interior_sum(win.row));
                }
                acc.hashes.push(hash_cells(win.row));
            }
        }
        fn end_phase(&mut self, _: &Report<Vec<f64>>) -> Next {
            phase_ended(Self::NAME, self.phase, f64::NAN);
            self.phase += 1;
            if self.phase < 2 * self.iterations {
                Next::Continue
            } else {
                Next::Finish
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// LBM: a D2Q9 Lattice-Boltzmann channel.

pub(crate) mod lbm {
    //! A D2Q9 Lattice-Boltzmann channel (plane Poiseuille flow): `height` rows of `width`
    //! cells, walls above the first row and below the last (half-way bounce-back), periodic
    //! left to right, driven by a constant body force along the channel; BGK collision with
    //! relaxation time `tau` (viscosity `ν = (tau − ½)/3`). A cell is its nine distributions
    //! after collision, `[f64; 9]`.
    //!
    //! A phase is one time step, pull scheme: cell `(x, y)` gathers distribution `k` from the
    //! cell `(x − cₖₓ, y − cₖᵧ)` of the previous step (rows `y − 1`, `y`, `y + 1`:
    //! [`Sweep::Jacobi`]), or its own opposite one where that cell would be a wall, then
    //! collides. Its scalars are the mass and the kinetic energy, summed per row, then over
    //! the rows in row order. Started at rest, the flow approaches the parabolic profile whose
    //! centre speed is `F·H² / (8ν)`.
    //!
    //! The benchmarks of the paper this crate follows ran a 3-D, 120³ Lattice-Boltzmann
    //! kernel for 50 time steps; this one is its 2-D counterpart, with the same structure per
    //! step (gather from neighbours, collide, a barrier).

    use super::*;

    pub(crate) type Cell = [f64; 9];

    /// Velocities: rest, the four axes (E, S, W, N in grid terms: y grows with the row
    /// index), then the four diagonals.
    const CX: [i64; 9] = [0, 1, 0, -1, 0, 1, -1, -1, 1];
    const CY: [i64; 9] = [0, 0, 1, 0, -1, 1, 1, -1, -1];
    const OPPOSITE: [usize; 9] = [0, 3, 4, 1, 2, 7, 8, 5, 6];
    const W: [f64; 9] = [
        4.0 / 9.0,
        1.0 / 9.0,
        1.0 / 9.0,
        1.0 / 9.0,
        1.0 / 9.0,
        1.0 / 36.0,
        1.0 / 36.0,
        1.0 / 36.0,
        1.0 / 36.0,
    ];

    /// The physics of a channel (the grid's size aside).
    #[derive(Debug, Clone, Copy, Serialize, Deserialize)]
    pub(crate) struct Fluid {
        /// BGK relaxation time (> ½).
        pub(crate) tau: f64,
        /// Body force along the channel, per unit volume.
        pub(crate) force: f64,
    }

    impl Fluid {
        pub(crate) fn viscosity(self) -> f64 {
            (self.tau - 0.5) / 3.0
        }

        /// The steady centre-line speed of a channel of `height` rows.
        pub(crate) fn poiseuille_max(self, height: u64) -> f64 {
            let h = height as f64;
            self.force * h * h / (8.0 * self.viscosity())
        }
    }

    /// The equilibrium distributions at rest with density 1: the initial cell.
    pub(crate) fn at_rest() -> Cell {
        W
    }

    /// Row `y` of the next step from rows `y − 1` (`None` at the top wall), `y` and `y + 1`
    /// (`None` at the bottom wall) of this one; returns the row's `[mass, kinetic energy]`.
    pub(crate) fn row(
        fluid: Fluid,
        above: Option<&[Cell]>,
        old: &[Cell],
        below: Option<&[Cell]>,
        new: &mut [Cell],
    ) -> [f64; 2] {
        let w = old.len();
        let omega = 1.0 / fluid.tau;
        let (mut mass, mut energy) = (0.0, 0.0);
        for x in 0..w {
            let west = if x == 0 { w - 1 } else { x - 1 };
            let east = if x + 1 == w { 0 } else { x + 1 };
            // The source column of each velocity: x − cₓ, periodic.
            let from = |k: usize| match CX[k] {
                1 => west,
                -1 => east,
                _ => x,
            };
            let mut f = [0.0; 9];
            for k in 0..9 {
                let src = match CY[k] {
                    1 => above,  // from row y − 1
                    -1 => below, // from row y + 1
                    _ => Some(old),
                };
                f[k] = match src {
                    Some(r) => r[from(k)][k],
                    None => old[x][OPPOSITE[k]], // bounced back from the wall
                };
            }
            let rho = f.iter().fold(0.0, |s, v| s + v);
            let (mut jx, mut jy) = (0.0, 0.0);
            for k in 1..9 {
                jx += CX[k] as f64 * f[k];
                jy += CY[k] as f64 * f[k];
            }
            let (ux, uy) = (jx / rho, jy / rho);
            let usq = ux * ux + uy * uy;
            let out = &mut new[x];
            for k in 0..9 {
                let cu = CX[k] as f64 * ux + CY[k] as f64 * uy;
                let feq = W[k] * rho * (1.0 + 3.0 * cu + 4.5 * cu * cu - 1.5 * usq);
                out[k] = f[k] + omega * (feq - f[k]) + 3.0 * W[k] * CX[k] as f64 * fluid.force;
            }
            mass += rho;
            energy += 0.5 * rho * usq;
        }
        [mass, energy]
    }

    /// The speed along the channel of a cell (from its post-collision distributions).
    pub(crate) fn speed(c: &Cell) -> f64 {
        let rho = c.iter().fold(0.0, |s, v| s + v);
        let jx = (0..9).fold(0.0, |s, k| s + CX[k] as f64 * c[k]);
        jx / rho
    }

    /// The result of a run.
    #[derive(Debug, Clone)]
    pub(crate) struct Solution {
        pub(crate) digest: Digest,
        /// The last step's mass and kinetic energy.
        pub(crate) mass: f64,
        pub(crate) energy: f64,
        /// The final grid, when the version has it in one piece.
        pub(crate) grid: Option<Vec<Cell>>,
    }

    /// A step's scalars: the rows' `[mass, energy]` summed in row order.
    fn totals(rows: &[[f64; 2]]) -> [f64; 2] {
        rows.iter()
            .fold([0.0, 0.0], |[m, e], [rm, re]| [m + rm, e + re])
    }

    fn cell_hashes(grid: &[Cell], width: usize) -> Vec<u64> {
        grid.chunks_exact(width)
            .map(|r| hash_cells(r.as_flattened()))
            .collect()
    }

    /// The row `y` of a grid of `height` rows and its two neighbours (`None` at a wall).
    fn window(grid: &[Cell], w: usize, height: usize, y: usize) -> [Option<&[Cell]>; 3] {
        let at = |r: usize| Some(&grid[r * w..(r + 1) * w]);
        [
            if y == 0 { None } else { at(y - 1) },
            at(y),
            if y + 1 == height { None } else { at(y + 1) },
        ]
    }

    /// The sequential reference: `steps` time steps of a `width × height` channel.
    pub(crate) fn sequential(width: usize, height: usize, fluid: Fluid, steps: u64) -> Solution {
        let mut cur = vec![at_rest(); width * height];
        let mut new = cur.clone();
        let (mut t, mut last) = (Digest::EMPTY_TRACE, [0.0; 2]);
        for _ in 0..steps {
            let mut rows = Vec::with_capacity(height);
            for (y, r) in new.chunks_exact_mut(width).enumerate() {
                let [above, old, below] = window(&cur, width, height, y);
                rows.push(row(fluid, above, old.expect("the row itself"), below, r));
            }
            last = totals(&rows);
            t = trace(trace(t, last[0]), last[1]);
            std::mem::swap(&mut cur, &mut new);
        }
        Solution {
            digest: Digest {
                trace: t,
                hashes: cell_hashes(&cur, width),
            },
            mass: last[0],
            energy: last[1],
            grid: Some(cur),
        }
    }

    /// The same steps with one rayon task per row, in the current rayon pool.
    pub(crate) fn rayon(width: usize, height: usize, fluid: Fluid, steps: u64) -> Solution {
        let mut cur = vec![at_rest(); width * height];
        let mut new = cur.clone();
        let (mut t, mut last) = (Digest::EMPTY_TRACE, [0.0; 2]);
        for _ in 0..steps {
            let old = &cur;
            let rows: Vec<[f64; 2]> = new
                .par_chunks_exact_mut(width)
                .enumerate()
                .map(|(y, r)| {
                    let [above, mid, below] = window(old, width, height, y);
                    row(fluid, above, mid.expect("the row itself"), below, r)
                })
                .collect();
            last = totals(&rows);
            t = trace(trace(t, last[0]), last[1]);
            std::mem::swap(&mut cur, &mut new);
        }
        Solution {
            digest: Digest {
                trace: t,
                hashes: cell_hashes(&cur, width),
            },
            mass: last[0],
            energy: last[1],
            grid: Some(cur),
        }
    }

    /// The channel as a malleable job: `exec.run(Banded(Lbm::new(…)))`.
    #[derive(Debug, Clone, Serialize, Deserialize)]
    pub(crate) struct Lbm {
        pub(crate) width: u64,
        pub(crate) height: u64,
        pub(crate) fluid: Fluid,
        pub(crate) steps: u64,
        pub(crate) bands: u64,
        /// Steps done, the last one's mass and energy, and the trace of all of them.
        pub(crate) step: u64,
        pub(crate) mass: f64,
        pub(crate) energy: f64,
        pub(crate) trace: u64,
    }

    impl Lbm {
        pub(crate) fn new(width: u64, height: u64, fluid: Fluid, steps: u64) -> Lbm {
            Lbm {
                width,
                height,
                fluid,
                steps,
                bands: 16,
                step: 0,
                mass: f64::NAN,
                energy: f64::NAN,
                trace: Digest::EMPTY_TRACE,
            }
        }

        /// The result of a finished run.
        pub(crate) fn solution(done: &Finished<Banded<Lbm>>) -> Solution {
            let job = &done.job.0;
            Solution {
                digest: Digest {
                    trace: job.trace,
                    hashes: done.value.hashes.clone(),
                },
                mass: job.mass,
                energy: job.energy,
                grid: None,
            }
        }
    }

    impl Rows for Lbm {
        const NAME: &'static str = "lbm-channel";
        type Element = Cell;
        /// Each row's `[mass, kinetic energy]`, in row order.
        type Acc = Report<Vec<[f64; 2]>>;
        type Reducer = Checked<CollectInOrder<[f64; 2]>>;
        type Input = ();

        fn height(&self) -> u64 {
            self.height
        }
        fn width(&self) -> usize {
            self.width as usize
        }
        fn bands(&self) -> u64 {
            self.bands
        }
        fn reducer(&self) -> Checked<CollectInOrder<[f64; 2]>> {
            Checked(CollectInOrder::new())
        }
        fn init(&self, _: &(), _y: u64, r: &mut [Cell]) {
            r.fill(at_rest());
        }
        fn update(&self, _: &(), _y: u64, win: Window<'_, Cell>, acc: &mut Self::Acc) {
            let totals = row(self.fluid, win.above, win.old, win.below, win.row);
            acc.value.push(totals);
            if self.step + 1 == self.steps {
                acc.hashes.push(hash_cells(win.row.as_flattened()));
            }
        }
        fn end_phase(&mut self, report: &Self::Acc) -> Next {
            [self.mass, self.energy] = totals(&report.value);
            self.trace = trace(trace(self.trace, self.mass), self.energy);
            phase_ended(Self::NAME, self.step, self.energy);
            self.step += 1;
            if self.step < self.steps {
                Next::Continue
            } else {
                Next::Finish
            }
        }
    }
}
