//! Heat diffusion in a box: a 7-point Jacobi stencil on an `nz × ny × nx` grid.
//!
//! The boundary cells (the six faces of the box) are held at `1 − z/(nz − 1)`, a temperature
//! falling linearly from the bottom face to the top one; the interior starts at 0.0. A phase
//! is one Jacobi sweep, double-buffered: every interior cell becomes the mean of its six
//! neighbours from the previous phase, summed as `((z− + z+) + (y− + y+)) + (x− + x+)` and
//! times `1/6`. The phase's scalar is the largest change of a cell (a max: exact, so the
//! order cells are visited in does not matter). Since the boundary is linear in `z`, the
//! steady state is the linear profile `1 − z/(nz − 1)` everywhere, which the sweeps approach
//! from below: from the cold start every cell rises monotonically, and the largest change
//! never grows from one phase to the next.
//!
//! The grid is stored row-major, `(z · ny + y) · nx + x`: an x *line* `(z, y)` is contiguous,
//! and [`line`] computes one from its five neighbouring lines of the previous phase. Every
//! version calls it for every interior line, so they give the same bits:
//!
//! - [`sequential`]: the plain loop over phases, planes and lines, the reference;
//! - [`rayon`]: one rayon task per z plane;
//! - [`Brick`]: a pencil of the grid (a range of z and of y, all of x) with a one-cell halo
//!   around it in z and y, for a run whose partitions are pencils: it sweeps its own lines,
//!   exports its boundary layers ([`Brick::boundary`]) and takes its neighbours' in as its
//!   halos ([`Brick::set_halo`]). Its halos are filled with the initial values when it is
//!   made, so the first phase needs no exchange.
//!
//! A run ends with a [`Digest`]: the hash of each line of the final grid in line order
//! (`z · ny + y`) and the trace of the phases' largest changes.

use std::ops::Range;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::stencil::{Digest, hash_cells, trace};

/// The grid's size: cells along z, y and x (each at least 3, so that there is an interior).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Dims {
    pub(crate) nz: usize,
    pub(crate) ny: usize,
    pub(crate) nx: usize,
}

impl Dims {
    pub(crate) fn cube(n: usize) -> Dims {
        Dims {
            nz: n,
            ny: n,
            nx: n,
        }
    }

    pub(crate) fn cells(self) -> usize {
        self.nz * self.ny * self.nx
    }

    /// Whether line `(z, y)` is on the boundary (all its cells fixed).
    pub(crate) fn boundary_line(self, z: usize, y: usize) -> bool {
        z == 0 || z + 1 == self.nz || y == 0 || y + 1 == self.ny
    }

    /// The fixed temperature of the boundary cells of plane `z`.
    pub(crate) fn wall(self, z: usize) -> f64 {
        1.0 - z as f64 / (self.nz - 1) as f64
    }

    /// Line `(z, y)` before the first phase.
    pub(crate) fn init_line(self, z: usize, y: usize, line: &mut [f64]) {
        let wall = self.wall(z);
        if self.boundary_line(z, y) {
            line.fill(wall);
        } else {
            line.fill(0.0);
            line[0] = wall;
            line[self.nx - 1] = wall;
        }
    }

    /// The steady state at plane `z`.
    pub(crate) fn steady(self, z: usize) -> f64 {
        self.wall(z)
    }
}

const SIXTH: f64 = 1.0 / 6.0;

/// An interior line of the next phase from the previous phase's line itself (`old`, whose
/// x neighbours are its own cells) and its four neighbouring lines (z − 1, y − 1, y + 1,
/// z + 1); the two end cells (on the x faces) are copied. Returns the largest change.
#[inline]
pub(crate) fn line(
    zm: &[f64],
    ym: &[f64],
    old: &[f64],
    yp: &[f64],
    zp: &[f64],
    new: &mut [f64],
) -> f64 {
    let w = old.len();
    new[0] = old[0];
    new[w - 1] = old[w - 1];
    let m = w - 2;
    // Equal lengths, so that the loop runs without bounds checks.
    let (zm, ym, yp, zp) = (&zm[1..=m], &ym[1..=m], &yp[1..=m], &zp[1..=m]);
    let (left, mid, right) = (&old[..m], &old[1..=m], &old[2..]);
    let out = &mut new[1..=m];
    // The largest change in `LANES` separate maxima so the loop vectorizes; `max` is exact.
    const LANES: usize = 4;
    let mut change = [0.0f64; LANES];
    let cell = |j: usize| SIXTH * (((zm[j] + zp[j]) + (ym[j] + yp[j])) + (left[j] + right[j]));
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

/// The result of a run: its digest and the last phase's largest change, and the final grid.
#[derive(Debug, Clone)]
pub(crate) struct Solution {
    pub(crate) digest: Digest,
    pub(crate) change: f64,
    /// The largest change of every phase, in phase order.
    pub(crate) changes: Vec<f64>,
    pub(crate) grid: Vec<f64>,
}

/// The initial grid.
pub(crate) fn initial(d: Dims) -> Vec<f64> {
    let mut g = vec![0.0; d.cells()];
    for (i, l) in g.chunks_exact_mut(d.nx).enumerate() {
        d.init_line(i / d.ny, i % d.ny, l);
    }
    g
}

/// Plane `z` of the next phase into `new` (`ny · nx` cells) from the whole grid `old`;
/// returns its largest change.
fn plane(d: Dims, old: &[f64], z: usize, new: &mut [f64]) -> f64 {
    let (nx, plane) = (d.nx, d.ny * d.nx);
    let at = |z: usize, y: usize| &old[z * plane + y * nx..z * plane + (y + 1) * nx];
    let mut change = 0.0f64;
    for (y, out) in new.chunks_exact_mut(nx).enumerate() {
        if d.boundary_line(z, y) {
            out.copy_from_slice(at(z, y));
        } else {
            let c = line(
                at(z - 1, y),
                at(z, y - 1),
                at(z, y),
                at(z, y + 1),
                at(z + 1, y),
                out,
            );
            change = change.max(c);
        }
    }
    change
}

fn solution(d: Dims, grid: Vec<f64>, changes: Vec<f64>, hashes: Vec<u64>) -> Solution {
    debug_assert_eq!(hashes.len(), d.nz * d.ny);
    Solution {
        digest: Digest {
            trace: changes
                .iter()
                .fold(Digest::EMPTY_TRACE, |t, &c| trace(t, c)),
            hashes,
        },
        change: changes.last().copied().unwrap_or(f64::NAN),
        changes,
        grid,
    }
}

/// The sequential reference: `phases` Jacobi sweeps.
pub(crate) fn sequential(d: Dims, phases: u64) -> Solution {
    let mut cur = initial(d);
    let mut new = vec![0.0; d.cells()];
    let mut changes = Vec::new();
    for _ in 0..phases {
        let mut change = 0.0f64;
        for (z, out) in new.chunks_exact_mut(d.ny * d.nx).enumerate() {
            change = change.max(plane(d, &cur, z, out));
        }
        changes.push(change);
        std::mem::swap(&mut cur, &mut new);
    }
    let hashes = cur.chunks_exact(d.nx).map(hash_cells).collect();
    solution(d, cur, changes, hashes)
}

/// The same sweeps with one rayon task per z plane, in the current rayon pool.
pub(crate) fn rayon(d: Dims, phases: u64) -> Solution {
    let mut cur = initial(d);
    let mut new = vec![0.0; d.cells()];
    let mut changes = Vec::new();
    for _ in 0..phases {
        let old = &cur;
        let change = new
            .par_chunks_exact_mut(d.ny * d.nx)
            .enumerate()
            .map(|(z, out)| plane(d, old, z, out))
            .reduce(|| 0.0, f64::max);
        changes.push(change);
        std::mem::swap(&mut cur, &mut new);
    }
    let hashes = cur.par_chunks_exact(d.nx).map(hash_cells).collect();
    solution(d, cur, changes, hashes)
}

/// A pencil of the grid: planes `z`, rows `y`, all of x, with a one-cell halo around it in z
/// and y (the layers of the neighbouring pencils it reads; outside the grid they are never
/// read). Stored as `(z.len() + 2) × (y.len() + 2)` lines of `nx` cells, local line
/// `(lz, ly)` holding global line `(z.start + lz − 1, y.start + ly − 1)`, in two buffers:
/// the phase's values (with the halos) and the next phase's, written a plane at a time
/// ([`Brick::sweep_next`]).
///
/// Serialized (a partition in a snapshot, or moved to another worker) it is its current
/// buffer and the planes of the next one swept so far, never the rest of the second buffer,
/// and read back it checks that the sizes agree (an error, not a panic, on bad bytes).
#[derive(Debug, Clone)]
pub(crate) struct Brick {
    pub(crate) dims: Dims,
    pub(crate) z: Range<usize>,
    pub(crate) y: Range<usize>,
    /// Own planes of the next phase swept so far (in order).
    done: usize,
    cur: Vec<f64>,
    new: Vec<f64>,
}

/// A [`Brick`] as it is serialized.
#[derive(Serialize)]
struct BrickRef<'a> {
    dims: Dims,
    z: &'a Range<usize>,
    y: &'a Range<usize>,
    done: usize,
    cur: &'a [f64],
    /// The local planes `1..=done` of the next phase's buffer.
    swept: &'a [f64],
}

/// A [`Brick`] as it is read back, before it is checked.
#[derive(Deserialize)]
struct BrickOwned {
    dims: Dims,
    z: Range<usize>,
    y: Range<usize>,
    done: usize,
    cur: Vec<f64>,
    swept: Vec<f64>,
}

impl Serialize for Brick {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let plane = self.plane_len();
        BrickRef {
            dims: self.dims,
            z: &self.z,
            y: &self.y,
            done: self.done,
            cur: &self.cur,
            swept: &self.new[plane..plane * (self.done + 1)],
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for Brick {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Brick, D::Error> {
        use serde::de::Error;
        let b = BrickOwned::deserialize(d)?;
        let fits = |r: &Range<usize>, n: usize| r.start < r.end && r.end <= n;
        if b.dims.nz < 3 || b.dims.ny < 3 || b.dims.nx < 3 {
            return Err(D::Error::custom(format!(
                "a brick of a grid of {:?}",
                b.dims
            )));
        }
        if !fits(&b.z, b.dims.nz) || !fits(&b.y, b.dims.ny) || b.done > b.z.len() {
            return Err(D::Error::custom(format!(
                "a brick of planes {:?}, rows {:?} ({} swept) in a grid of {:?}",
                b.z, b.y, b.done, b.dims
            )));
        }
        let plane = (b.y.len() + 2) * b.dims.nx;
        let cells = (b.z.len() + 2) * plane;
        if b.cur.len() != cells || b.swept.len() != b.done * plane {
            return Err(D::Error::custom(format!(
                "a brick of {} and {} cells, not {cells} and {}",
                b.cur.len(),
                b.swept.len(),
                b.done * plane
            )));
        }
        let mut new = vec![0.0; cells];
        new[plane..plane * (b.done + 1)].copy_from_slice(&b.swept);
        Ok(Brick {
            dims: b.dims,
            z: b.z,
            y: b.y,
            done: b.done,
            cur: b.cur,
            new,
        })
    }
}

impl Brick {
    /// The pencil of planes `z` and rows `y`, its cells and halos at their initial values.
    ///
    /// # Panics
    ///
    /// If the ranges are empty or outside the grid.
    pub(crate) fn new(dims: Dims, z: Range<usize>, y: Range<usize>) -> Brick {
        assert!(!z.is_empty() && z.end <= dims.nz && !y.is_empty() && y.end <= dims.ny);
        let (lz, ly) = (z.len() + 2, y.len() + 2);
        let mut cur = vec![0.0; lz * ly * dims.nx];
        for (i, l) in cur.chunks_exact_mut(dims.nx).enumerate() {
            let (gz, gy) = (
                (z.start + i / ly).wrapping_sub(1),
                (y.start + i % ly).wrapping_sub(1),
            );
            if gz < dims.nz && gy < dims.ny {
                dims.init_line(gz, gy, l);
            }
        }
        let new = cur.clone();
        Brick {
            dims,
            z,
            y,
            done: 0,
            cur,
            new,
        }
    }

    /// Cells in a local plane, halo lines included.
    fn plane_len(&self) -> usize {
        (self.y.len() + 2) * self.dims.nx
    }

    fn local(&self, lz: usize, ly: usize) -> Range<usize> {
        let at = (lz * (self.y.len() + 2) + ly) * self.dims.nx;
        at..at + self.dims.nx
    }

    /// One Jacobi sweep of the pencil's own lines (the halos are not touched); returns the
    /// largest change. The same as [`Brick::sweep_next`] until it returns `None`, then
    /// [`Brick::swap`].
    pub(crate) fn sweep(&mut self) -> f64 {
        let mut change = 0.0f64;
        while let Some(c) = self.sweep_next() {
            change = change.max(c);
        }
        self.swap();
        change
    }

    /// The next phase's values of the next own plane not swept yet, into the second buffer;
    /// returns its largest change, `None` once every plane is swept. A step of a partition
    /// can be a plane.
    pub(crate) fn sweep_next(&mut self) -> Option<f64> {
        if self.done == self.z.len() {
            return None;
        }
        let (d, nx, ly) = (self.dims, self.dims.nx, self.y.len() + 2);
        let lz = self.done + 1;
        let at = |lz: usize, ly_: usize| (lz * ly + ly_) * nx;
        let old = &self.cur;
        let l = |a: usize| &old[a..a + nx];
        let mut change = 0.0f64;
        for y in 1..=self.y.len() {
            let (gz, gy) = (self.z.start + self.done, self.y.start + y - 1);
            let here = at(lz, y);
            let out = &mut self.new[here..here + nx];
            if d.boundary_line(gz, gy) {
                out.copy_from_slice(l(here));
            } else {
                let c = line(
                    l(at(lz - 1, y)),
                    l(at(lz, y - 1)),
                    l(here),
                    l(at(lz, y + 1)),
                    l(at(lz + 1, y)),
                    out,
                );
                change = change.max(c);
            }
        }
        self.done += 1;
        Some(change)
    }

    /// Whether every own plane is swept: the phase can end ([`Brick::swap`]).
    pub(crate) fn swept_all(&self) -> bool {
        self.done == self.z.len()
    }

    /// Ends a phase: the planes swept become the pencil's values. Its halos are then stale
    /// until [`Brick::set_halo`] gives it its neighbours' boundaries.
    ///
    /// # Panics
    ///
    /// If a plane is not swept yet.
    pub(crate) fn swap(&mut self) {
        assert_eq!(
            self.done,
            self.z.len(),
            "a phase ended before its last plane"
        );
        std::mem::swap(&mut self.cur, &mut self.new);
        self.done = 0;
    }

    /// The local lines of the layer on face `(dim, low)` (`dim` 0: z, 1: y), own cells
    /// (`halo == false`) or the halo just outside.
    fn layer(&self, dim: usize, low: bool, halo: bool) -> Vec<(usize, usize)> {
        let (nz, ny) = (self.z.len(), self.y.len());
        let pick = |n: usize| match (low, halo) {
            (true, false) => 1,
            (true, true) => 0,
            (false, false) => n,
            (false, true) => n + 1,
        };
        match dim {
            0 => (1..=ny).map(|y| (pick(nz), y)).collect(),
            1 => (1..=nz).map(|z| (z, pick(ny))).collect(),
            _ => panic!("a pencil spans all of x: it has no x face"),
        }
    }

    /// Its cells on face `(dim, low)` (`dim` 0: z, 1: y), one layer, lines in order: what the
    /// neighbour across that face reads as its halo in the next phase.
    pub(crate) fn boundary(&self, dim: usize, low: bool) -> Vec<f64> {
        let mut out = Vec::new();
        for (lz, ly) in self.layer(dim, low, false) {
            out.extend_from_slice(&self.cur[self.local(lz, ly)]);
        }
        out
    }

    /// Takes in the halo on face `(dim, low)`: the neighbour's [`Brick::boundary`] on the
    /// opposite face.
    ///
    /// # Panics
    ///
    /// If `cells` is not one layer of that face.
    pub(crate) fn set_halo(&mut self, dim: usize, low: bool, cells: &[f64]) {
        let layer = self.layer(dim, low, true);
        assert_eq!(
            cells.len(),
            layer.len() * self.dims.nx,
            "a halo of the wrong size"
        );
        for ((lz, ly), src) in layer.into_iter().zip(cells.chunks_exact(self.dims.nx)) {
            let r = self.local(lz, ly);
            self.cur[r].copy_from_slice(src);
        }
    }

    /// The hash of each of its own lines, with the line's global index `z · ny + y`.
    pub(crate) fn line_hashes(&self) -> Vec<(u64, u64)> {
        let mut out = Vec::with_capacity(self.z.len() * self.y.len());
        for z in self.z.clone() {
            for y in self.y.clone() {
                let l = self.local(z - self.z.start + 1, y - self.y.start + 1);
                out.push(((z * self.dims.ny + y) as u64, hash_cells(&self.cur[l])));
            }
        }
        out
    }
}
