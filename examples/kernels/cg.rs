//! Conjugate gradients on a sparse symmetric positive definite matrix: the pattern of NAS CG.
//!
//! The matrix ([`matrix`], from a [`Spec`]) is the 7-point stencil of a `side³` grid (an
//! entry −1 between grid neighbours) plus `extra` random long-range couplings per row, each
//! mirrored to keep it symmetric (NAS CG's matrix is also random and irregular), with a
//! diagonal of the row's absolute off-diagonal sum plus `shift`: strictly diagonally
//! dominant with a positive diagonal, hence positive definite. It is generated from a seed
//! in one deterministic pass, in compressed sparse rows ([`Csr`]).
//!
//! [`sequential`] and [`rayon`] solve `A x = b` from `x = 0` with a fixed number of plain CG
//! iterations:
//!
//! ```text
//! r = b; p = r; ρ = r·r
//! repeat: q = A p; α = ρ / (p·q); x += α p; r −= α q; ρ' = r·r; β = ρ'/ρ; ρ = ρ'; p = r + β p
//! ```
//!
//! # Dot products in a fixed order
//!
//! The rows are cut into a fixed number `B` of *blocks* ([`block`]: as equal as possible,
//! the larger first, as `malleable::Blocks` cuts a dimension). Everything per row is computed
//! per block ([`spmv_rows`], [`update_xr`], [`update_p`]); a dot product is the sum over each
//! block's rows in row order ([`dot`]), then the blocks' partial sums added in block order
//! from 0.0 ([`sum_in_order`]). The sequential version loops over the blocks, the rayon one
//! runs them in parallel and adds the partials in order, and a malleable run with one chunk
//! per block does the same with its reducer: all give the same bits for any thread count.
//! The phase scalar is `ρ = r·r` after each iteration.

use std::ops::Range;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::stencil::{Digest, hash_cells, trace};
use super::{random_at, unit_f64};

/// How a matrix is generated.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub(crate) struct Spec {
    /// The grid's side: the matrix has `side³` rows.
    pub(crate) side: usize,
    /// Random long-range couplings generated per row (each also lands in the row it
    /// couples to; one that falls on the diagonal is dropped).
    pub(crate) extra: usize,
    /// Added to the diagonal on top of the row's absolute off-diagonal sum (> 0).
    pub(crate) shift: f64,
    pub(crate) seed: u64,
}

/// A sparse matrix in compressed sparse rows: row `i`'s entries are
/// `col[ptr[i]..ptr[i + 1]]`, `val[…]`, columns ascending.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Csr {
    pub(crate) n: usize,
    pub(crate) ptr: Vec<usize>,
    pub(crate) col: Vec<u32>,
    pub(crate) val: Vec<f64>,
}

impl Csr {
    pub(crate) fn row(&self, i: usize) -> (&[u32], &[f64]) {
        let r = self.ptr[i]..self.ptr[i + 1];
        (&self.col[r.clone()], &self.val[r])
    }

    pub(crate) fn entries(&self) -> usize {
        self.val.len()
    }
}

/// Generates the matrix of `spec` (see the [module docs](self)).
pub(crate) fn matrix(spec: Spec) -> Csr {
    let s = spec.side;
    let n = s * s * s;
    assert!(n > 0 && n <= u32::MAX as usize, "a side of {s}");
    // Off-diagonal entries of each row, in the order they are generated.
    let mut rows: Vec<Vec<(u32, f64)>> = vec![Vec::new(); n];
    for z in 0..s {
        for y in 0..s {
            for x in 0..s {
                let i = (z * s + y) * s + x;
                let mut near = |j: usize| rows[i].push((j as u32, -1.0));
                if z > 0 {
                    near(i - s * s);
                }
                if y > 0 {
                    near(i - s);
                }
                if x > 0 {
                    near(i - 1);
                }
                if x + 1 < s {
                    near(i + 1);
                }
                if y + 1 < s {
                    near(i + s);
                }
                if z + 1 < s {
                    near(i + s * s);
                }
            }
        }
    }
    for i in 0..n {
        for k in 0..spec.extra {
            let draw = (i * spec.extra + k) as u64;
            let j = (random_at(spec.seed, 2 * draw) % n as u64) as usize;
            if j == i {
                continue;
            }
            let v = -0.5 * unit_f64(random_at(spec.seed, 2 * draw + 1));
            rows[i].push((j as u32, v));
            rows[j].push((i as u32, v));
        }
    }
    let mut csr = Csr {
        n,
        ptr: Vec::with_capacity(n + 1),
        col: Vec::new(),
        val: Vec::new(),
    };
    csr.ptr.push(0);
    for (i, mut row) in rows.into_iter().enumerate() {
        // A stable sort: entries of one column are added in the order they were generated.
        row.sort_by_key(|&(j, _)| j);
        let mut merged: Vec<(u32, f64)> = Vec::with_capacity(row.len() + 1);
        for (j, v) in row {
            match merged.last_mut() {
                Some((last, sum)) if *last == j => *sum += v,
                _ => merged.push((j, v)),
            }
        }
        let diag = merged.iter().fold(spec.shift, |s, &(_, v)| s + v.abs());
        let at = merged.partition_point(|&(j, _)| (j as usize) < i);
        merged.insert(at, (i as u32, diag));
        for (j, v) in merged {
            csr.col.push(j);
            csr.val.push(v);
        }
        csr.ptr.push(csr.col.len());
    }
    csr
}

/// The right-hand side: `b[i]` uniform in `[0.5, 1.5)`, from `seed`.
pub(crate) fn rhs(n: usize, seed: u64) -> Vec<f64> {
    rhs_rows(0..n, seed)
}

/// Rows `rows` of [`rhs`]: each a function of its index alone.
pub(crate) fn rhs_rows(rows: Range<usize>, seed: u64) -> Vec<f64> {
    rows.map(|i| 0.5 + unit_f64(random_at(seed ^ 0x5EED, i as u64)))
        .collect()
}

/// Block `k` of `n` rows cut into `blocks` blocks: `⌊n/B⌋` or `⌈n/B⌉` rows, the larger
/// blocks first.
pub(crate) fn block(n: usize, blocks: usize, k: usize) -> Range<usize> {
    let (q, r) = (n / blocks, n % blocks);
    let start = k * q + k.min(r);
    start..start + q + usize::from(k < r)
}

/// `out[i − rows.start] = (A x)[i]` for `i` in `rows`: each row's products summed in column
/// order from 0.0. `x` is the whole vector.
#[inline]
pub(crate) fn spmv_rows(a: &Csr, x: &[f64], rows: Range<usize>, out: &mut [f64]) {
    debug_assert_eq!(out.len(), rows.len());
    for (o, i) in out.iter_mut().zip(rows) {
        let (cols, vals) = a.row(i);
        let mut s = 0.0;
        for (&j, &v) in cols.iter().zip(vals) {
            s += v * x[j as usize];
        }
        *o = s;
    }
}

/// `a · b` over a block (equal lengths), summed in order from 0.0.
#[inline]
pub(crate) fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).fold(0.0, |s, (x, y)| s + x * y)
}

/// [`dot`] over `rows` of two whole vectors.
pub(crate) fn dot_rows(a: &[f64], b: &[f64], rows: Range<usize>) -> f64 {
    dot(&a[rows.clone()], &b[rows])
}

/// The blocks' partial sums, added in block order from 0.0.
pub(crate) fn sum_in_order(partials: impl IntoIterator<Item = f64>) -> f64 {
    partials.into_iter().fold(0.0, |s, p| s + p)
}

/// `x += α p; r −= α q` over a block; returns the block's `r · r` after it.
#[inline]
pub(crate) fn update_xr(alpha: f64, x: &mut [f64], r: &mut [f64], p: &[f64], q: &[f64]) -> f64 {
    for (xi, pi) in x.iter_mut().zip(p) {
        *xi += alpha * pi;
    }
    for (ri, qi) in r.iter_mut().zip(q) {
        *ri -= alpha * qi;
    }
    dot(r, r)
}

/// `p = r + β p` over a block.
#[inline]
pub(crate) fn update_p(beta: f64, p: &mut [f64], r: &[f64]) {
    for (pi, ri) in p.iter_mut().zip(r) {
        *pi = ri + beta * *pi;
    }
}

/// The result of a solve.
#[derive(Debug, Clone)]
pub(crate) struct Solution {
    /// The hash of `x` per block, and the trace of ρ after every iteration.
    pub(crate) digest: Digest,
    pub(crate) x: Vec<f64>,
    /// ρ = r·r after every iteration.
    pub(crate) rhos: Vec<f64>,
}

fn solution(x: Vec<f64>, rhos: Vec<f64>, blocks: usize) -> Solution {
    let n = x.len();
    Solution {
        digest: Digest {
            trace: rhos.iter().fold(Digest::EMPTY_TRACE, |t, &r| trace(t, r)),
            hashes: (0..blocks)
                .map(|k| hash_cells(&x[block(n, blocks, k)]))
                .collect(),
        },
        x,
        rhos,
    }
}

/// The sequential reference: `iterations` CG iterations on `A x = b` from `x = 0`, dot
/// products reduced over `blocks` blocks of rows.
///
/// # Panics
///
/// If `blocks` is 0 or more than the rows.
pub(crate) fn sequential(a: &Csr, b: &[f64], iterations: u64, blocks: usize) -> Solution {
    let n = a.n;
    assert!(blocks >= 1 && blocks <= n, "{blocks} blocks of {n} rows");
    let bl = |k| block(n, blocks, k);
    let mut x = vec![0.0; n];
    let mut r = b.to_vec();
    let mut p = r.clone();
    let mut q = vec![0.0; n];
    let mut rho = sum_in_order((0..blocks).map(|k| dot_rows(&r, &r, bl(k))));
    let mut rhos = Vec::new();
    for _ in 0..iterations {
        let mut pq = Vec::with_capacity(blocks);
        for k in 0..blocks {
            spmv_rows(a, &p, bl(k), &mut q[bl(k)]);
            pq.push(dot_rows(&p, &q, bl(k)));
        }
        let alpha = rho / sum_in_order(pq);
        let rr: Vec<f64> = (0..blocks)
            .map(|k| {
                let rows = bl(k);
                update_xr(
                    alpha,
                    &mut x[rows.clone()],
                    &mut r[rows.clone()],
                    &p[rows.clone()],
                    &q[rows],
                )
            })
            .collect();
        let next = sum_in_order(rr);
        let beta = next / rho;
        rho = next;
        for k in 0..blocks {
            update_p(beta, &mut p[bl(k)], &r[bl(k)]);
        }
        rhos.push(rho);
    }
    solution(x, rhos, blocks)
}

/// `v` cut into the `blocks` blocks of [`block`], as mutable slices in block order.
pub(crate) fn split_blocks_mut(v: &mut [f64], blocks: usize) -> Vec<&mut [f64]> {
    let n = v.len();
    let mut out = Vec::with_capacity(blocks);
    let mut rest = v;
    for k in 0..blocks {
        let (head, tail) = rest.split_at_mut(block(n, blocks, k).len());
        out.push(head);
        rest = tail;
    }
    out
}

/// The same iterations with one rayon task per block (in the current rayon pool), the
/// partial sums added in block order.
///
/// # Panics
///
/// If `blocks` is 0 or more than the rows.
pub(crate) fn rayon(a: &Csr, b: &[f64], iterations: u64, blocks: usize) -> Solution {
    let n = a.n;
    assert!(blocks >= 1 && blocks <= n, "{blocks} blocks of {n} rows");
    let mut x = vec![0.0; n];
    let mut r = b.to_vec();
    let mut p = r.clone();
    let mut q = vec![0.0; n];
    let partials: Vec<f64> = (0..blocks)
        .into_par_iter()
        .map(|k| dot_rows(&r, &r, block(n, blocks, k)))
        .collect();
    let mut rho = sum_in_order(partials);
    let mut rhos = Vec::new();
    for _ in 0..iterations {
        let pv = &p;
        let pq: Vec<f64> = split_blocks_mut(&mut q, blocks)
            .into_par_iter()
            .enumerate()
            .map(|(k, qk)| {
                let rows = block(n, blocks, k);
                spmv_rows(a, pv, rows.clone(), qk);
                dot(&pv[rows], qk)
            })
            .collect();
        let alpha = rho / sum_in_order(pq);
        let rr: Vec<f64> = (
            split_blocks_mut(&mut x, blocks),
            split_blocks_mut(&mut r, blocks),
        )
            .into_par_iter()
            .enumerate()
            .map(|(k, (xk, rk))| {
                let rows = block(n, blocks, k);
                update_xr(alpha, xk, rk, &p[rows.clone()], &q[rows])
            })
            .collect();
        let next = sum_in_order(rr);
        let beta = next / rho;
        rho = next;
        let rv = &r;
        split_blocks_mut(&mut p, blocks)
            .into_par_iter()
            .enumerate()
            .for_each(|(k, pk)| update_p(beta, pk, &rv[block(n, blocks, k)]));
        rhos.push(rho);
    }
    solution(x, rhos, blocks)
}

/// `‖b − A x‖₂ / ‖b‖₂`, computed plainly (a check, not part of the kernel).
pub(crate) fn relative_residual(a: &Csr, x: &[f64], b: &[f64]) -> f64 {
    let mut ax = vec![0.0; a.n];
    spmv_rows(a, x, 0..a.n, &mut ax);
    let res: f64 = ax.iter().zip(b).map(|(y, b)| (b - y) * (b - y)).sum();
    let norm: f64 = b.iter().map(|b| b * b).sum();
    (res / norm).sqrt()
}
