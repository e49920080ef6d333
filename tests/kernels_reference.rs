//! The reference kernels of `examples/kernels/` that partitioned runs are checked against
//! (`heat3d`, `cg`, `ft`): their rayon versions give the sequential bits at 1, 2 and 3
//! threads, the pieces a partitioned run computes with (pencils with halos, blocks of rows,
//! transpose blocks) give them too when run by hand here, and each solves what it claims to.

#[path = "../examples/kernels/mod.rs"]
mod kernels;

use kernels::ft::C;
use kernels::{cg, ft, heat3d};
use malleable::Blocks;
use malleable::blocks::Face;

/// Runs `f` in a rayon pool of `threads` threads.
fn with_threads<T: Send>(threads: usize, f: impl FnOnce() -> T + Send) -> T {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a rayon pool")
        .install(f)
}

fn bits(v: &[f64]) -> Vec<u64> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn cbits(v: &[C]) -> Vec<(u64, u64)> {
    v.iter().map(|c| (c.re.to_bits(), c.im.to_bits())).collect()
}

// ---------------------------------------------------------------------------------------
// heat3d

#[test]
fn heat3d_rayon_gives_the_sequential_bits() {
    let d = heat3d::Dims {
        nz: 11,
        ny: 9,
        nx: 13,
    };
    let seq = heat3d::sequential(d, 25);
    assert!(seq.change > 0.0);
    for threads in 1..=3 {
        let par = with_threads(threads, || heat3d::rayon(d, 25));
        assert_eq!(par.digest, seq.digest, "{threads} threads");
        assert_eq!(bits(&par.changes), bits(&seq.changes));
        assert_eq!(bits(&par.grid), bits(&seq.grid));
    }
}

/// Pencils with one-cell halos, swept one after the other and given their neighbours'
/// boundary layers between phases as `Blocks` names them: what a run of partitions does.
fn heat3d_by_pencils(d: heat3d::Dims, cut: [u64; 2], phases: u64) -> (Vec<f64>, Vec<u64>) {
    let blocks = Blocks::pencils([d.nz as u64, d.ny as u64, d.nx as u64], cut).unwrap();
    let mut bricks: Vec<heat3d::Brick> = (0..blocks.len())
        .map(|c| {
            let [z, y, _] = blocks.extent(c);
            heat3d::Brick::new(
                d,
                z.start as usize..z.end as usize,
                y.start as usize..y.end as usize,
            )
        })
        .collect();
    let mut changes = Vec::new();
    for phase in 0..phases {
        if phase > 0 {
            // Every brick's pieces for its neighbours, then each takes its own in.
            let sent: Vec<Vec<(u64, Vec<f64>)>> = (0..blocks.len())
                .map(|c| {
                    blocks
                        .neighbours(c)
                        .into_iter()
                        .map(|n| {
                            let f = blocks.face(c, n).unwrap();
                            (n, bricks[c as usize].boundary(f.dim, f.low))
                        })
                        .collect()
                })
                .collect();
            for (from, pieces) in sent.into_iter().enumerate() {
                for (to, cells) in pieces {
                    let Face { dim, low } = blocks.face(to, from as u64).unwrap();
                    bricks[to as usize].set_halo(dim, low, &cells);
                }
            }
        }
        let change = if phase % 2 == 0 {
            bricks.iter_mut().fold(0.0f64, |m, b| m.max(b.sweep()))
        } else {
            // A plane at a time, as steps of a partition would, the brick serialized and
            // read back (as by a snapshot or a move) between two planes.
            let mut change = 0.0f64;
            for b in &mut bricks {
                while let Some(c) = b.sweep_next() {
                    change = change.max(c);
                    let bytes = postcard::to_allocvec(&*b).unwrap();
                    *b = postcard::from_bytes(&bytes).unwrap();
                }
                b.swap();
            }
            change
        };
        changes.push(change);
    }
    let mut hashes: Vec<(u64, u64)> = bricks.iter().flat_map(|b| b.line_hashes()).collect();
    hashes.sort_unstable();
    (changes, hashes.into_iter().map(|(_, h)| h).collect())
}

#[test]
fn heat3d_pencils_with_halos_give_the_sequential_bits() {
    let d = heat3d::Dims {
        nz: 10,
        ny: 7,
        nx: 6,
    };
    let seq = heat3d::sequential(d, 12);
    for cut in [[1, 1], [2, 1], [1, 3], [3, 2], [4, 7], [10, 7]] {
        let (changes, hashes) = heat3d_by_pencils(d, cut, 12);
        assert_eq!(bits(&changes), bits(&seq.changes), "{cut:?}");
        assert_eq!(hashes, seq.digest.hashes, "{cut:?}");
    }
}

#[test]
fn heat3d_relaxes_to_the_linear_profile_from_below() {
    let d = heat3d::Dims::cube(8);
    let s = heat3d::sequential(d, 600);
    // The largest change never grows (up to rounding: a few ulps of the cells, once it is
    // that small) and ends negligible.
    for w in s.changes.windows(2) {
        assert!(w[1] <= w[0] + 1e-15, "{} after {}", w[1], w[0]);
    }
    assert!(s.change < 1e-13, "{}", s.change);
    for (i, &v) in s.grid.iter().enumerate() {
        let z = i / (d.ny * d.nx);
        let want = d.steady(z);
        assert!((v - want).abs() < 1e-12, "cell {i}: {v} vs {want}");
    }
    // From the cold start the cells rise: never above the steady state on the way.
    let early = heat3d::sequential(d, 20);
    for (i, &v) in early.grid.iter().enumerate() {
        let want = d.steady(i / (d.ny * d.nx));
        assert!((0.0..=want + 1e-15).contains(&v), "cell {i}: {v} vs {want}");
    }
}

// ---------------------------------------------------------------------------------------
// cg

fn small_cg() -> (cg::Csr, Vec<f64>) {
    let a = cg::matrix(cg::Spec {
        side: 6,
        extra: 3,
        shift: 0.5,
        seed: 7,
    });
    let b = cg::rhs(a.n, 7);
    (a, b)
}

#[test]
fn cg_matrix_is_symmetric_bit_for_bit_and_diagonally_dominant() {
    let (a, _) = small_cg();
    assert_eq!(a.n, 216);
    assert!(a.entries() > 216 * 7, "{} entries", a.entries());
    for i in 0..a.n {
        let (cols, vals) = a.row(i);
        assert!(cols.windows(2).all(|w| w[0] < w[1]), "row {i} sorted");
        let mut diag = None;
        let mut off = 0.0;
        for (&j, &v) in cols.iter().zip(vals) {
            let j = j as usize;
            if j == i {
                diag = Some(v);
                continue;
            }
            off += v.abs();
            let (cj, vj) = a.row(j);
            let at = cj.binary_search(&(i as u32)).expect("the mirrored entry");
            assert_eq!(vj[at].to_bits(), v.to_bits(), "({i}, {j})");
        }
        assert!(diag.expect("a diagonal") > off, "row {i}");
    }
}

#[test]
fn cg_rayon_gives_the_sequential_bits_for_each_block_count() {
    let (a, b) = small_cg();
    for blocks in [1, 5, 16] {
        let seq = cg::sequential(&a, &b, 30, blocks);
        for threads in 1..=3 {
            let par = with_threads(threads, || cg::rayon(&a, &b, 30, blocks));
            assert_eq!(par.digest, seq.digest, "{blocks} blocks, {threads} threads");
            assert_eq!(bits(&par.x), bits(&seq.x));
            assert_eq!(bits(&par.rhos), bits(&seq.rhos));
        }
    }
}

#[test]
fn cg_converges_on_an_spd_system() {
    let (a, b) = small_cg();
    let s = cg::sequential(&a, &b, 80, 4);
    let res = cg::relative_residual(&a, &s.x, &b);
    assert!(res < 1e-10, "relative residual {res}");
    let norm_b: f64 = b.iter().map(|v| v * v).sum();
    assert!(s.rhos.last().unwrap() / norm_b < 1e-20);
}

#[test]
fn cg_blocks_cut_the_rows_exactly() {
    for n in [1, 7, 64, 100] {
        for blocks in 1..=n.min(9) {
            let cut: Vec<_> = (0..blocks).map(|k| cg::block(n, blocks, k)).collect();
            assert_eq!(cut[0].start, 0);
            assert_eq!(cut[blocks - 1].end, n);
            assert!(cut.windows(2).all(|w| w[0].end == w[1].start));
            assert!(cut.windows(2).all(|w| w[0].len() >= w[1].len()));
            // As malleable::Blocks cuts a dimension.
            let b = Blocks::tiles([n as u64, 1], [blocks as u64, 1]).unwrap();
            for (k, r) in cut.iter().enumerate() {
                let [_, y, _] = b.extent(k as u64);
                assert_eq!(y, r.start as u64..r.end as u64);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// ft

fn random_row(n: usize, seed: u64) -> Vec<C> {
    let spec = ft::Spec::new(1, n, seed);
    let mut row = vec![C::ZERO; n];
    ft::init_row(&spec, 0, &mut row);
    row
}

#[test]
fn fft_forward_then_inverse_returns_the_input() {
    for n in [1, 2, 4, 8, 64, 1024] {
        let x = random_row(n, n as u64);
        let fft = ft::Fft::new(n);
        let mut y = x.clone();
        fft.forward(&mut y);
        fft.inverse(&mut y);
        for (a, b) in x.iter().zip(&y) {
            assert!(
                (a.re - b.re).abs() < 1e-12 && (a.im - b.im).abs() < 1e-12,
                "n = {n}"
            );
        }
    }
}

#[test]
fn fft_is_the_discrete_fourier_transform() {
    let n = 32;
    let x = random_row(n, 3);
    let mut y = x.clone();
    ft::Fft::new(n).forward(&mut y);
    for (k, yk) in y.iter().enumerate() {
        let (mut re, mut im) = (0.0, 0.0);
        for (m, xm) in x.iter().enumerate() {
            let a = -2.0 * std::f64::consts::PI * (m * k % n) as f64 / n as f64;
            re += xm.re * a.cos() - xm.im * a.sin();
            im += xm.re * a.sin() + xm.im * a.cos();
        }
        assert!(
            (yk.re - re).abs() < 1e-12 && (yk.im - im).abs() < 1e-12,
            "k = {k}"
        );
    }
}

#[test]
fn ft_rayon_gives_the_sequential_bits() {
    for (ny, nx) in [(16, 32), (32, 8)] {
        let spec = ft::Spec::new(ny, nx, 11);
        let seq = ft::sequential(&spec, 6);
        for threads in 1..=3 {
            let par = with_threads(threads, || ft::rayon(&spec, 6));
            assert_eq!(par.digest, seq.digest, "{ny} × {nx}, {threads} threads");
            assert_eq!(cbits(&par.checksums), cbits(&seq.checksums));
        }
    }
}

#[test]
fn ft_transpose_blocks_assemble_the_transpose() {
    let (rows, cols) = (8, 16);
    let grid: Vec<C> = (0..rows * cols)
        .map(|i| C {
            re: i as f64,
            im: -(i as f64),
        })
        .collect();
    let want = ft::transpose(&grid, rows, cols);
    for parts in 1..=rows {
        for j in 0..parts {
            let mine = ft::band(cols, parts, j);
            let pieces: Vec<Vec<C>> = (0..parts)
                .map(|i| {
                    let r = ft::band(rows, parts, i);
                    ft::block_for(&grid[r.start * cols..r.end * cols], cols, mine.clone())
                })
                .collect();
            let got = ft::assemble(pieces.iter().map(Vec::as_slice), mine.len(), rows);
            assert_eq!(
                got,
                want[mine.start * rows..mine.end * rows],
                "{parts} parts"
            );
        }
    }
    assert_eq!(ft::transpose_par(&grid, rows, cols), want);
}

/// A transpose by pieces between `parts` partitions: partition `i` holds `rows[i]` (its
/// rows of a grid of `height` rows, `width` cells each); returns each partition's rows of
/// the transposed grid.
fn all_to_all(rows: &[Vec<C>], width: usize, height: usize) -> Vec<Vec<C>> {
    let parts = rows.len();
    (0..parts)
        .map(|j| {
            let mine = ft::band(width, parts, j);
            let pieces: Vec<Vec<C>> = rows
                .iter()
                .map(|r| ft::block_for(r, width, mine.clone()))
                .collect();
            ft::assemble(pieces.iter().map(Vec::as_slice), mine.len(), height)
        })
        .collect()
}

/// NAS FT by partitions of rows, run by hand: what a run of partitions with all-to-all
/// transposes does.
fn ft_by_partitions(spec: &ft::Spec, parts: usize, steps: u64) -> (Vec<C>, Vec<u64>) {
    let (ny, nx) = (spec.ny, spec.nx);
    let (fx, fy) = (ft::Fft::new(nx), ft::Fft::new(ny));
    let normal = |i| ft::band(ny, parts, i);
    let spectral = |j| ft::band(nx, parts, j);
    let mut u: Vec<Vec<C>> = (0..parts)
        .map(|i| {
            let mut rows = vec![C::ZERO; normal(i).len() * nx];
            for (k, r) in rows.chunks_exact_mut(nx).enumerate() {
                ft::init_row(spec, normal(i).start + k, r);
                fx.forward(r);
            }
            rows
        })
        .collect();
    let mut spectrum = all_to_all(&u, nx, ny);
    let mut factors = Vec::new();
    for (j, rows) in spectrum.iter_mut().enumerate() {
        rows.chunks_exact_mut(ny).for_each(|r| fy.forward(r));
        factors.push(
            spectral(j)
                .flat_map(|kx| ft::factors_row(spec, kx))
                .collect::<Vec<_>>(),
        );
    }
    let mut checksums = Vec::new();
    for _ in 0..steps {
        let copies: Vec<Vec<C>> = spectrum
            .iter_mut()
            .zip(&factors)
            .map(|(rows, f)| {
                let mut copy = Vec::with_capacity(rows.len());
                for (r, fr) in rows.chunks_exact_mut(ny).zip(f.chunks_exact(ny)) {
                    ft::evolve_row(r, fr);
                    copy.extend_from_slice(r);
                }
                copy.chunks_exact_mut(ny).for_each(|r| fy.inverse(r));
                copy
            })
            .collect();
        u = all_to_all(&copies, ny, nx);
        let mut picks = Vec::new();
        for (i, rows) in u.iter_mut().enumerate() {
            rows.chunks_exact_mut(nx).for_each(|r| fx.inverse(r));
            picks.extend(ft::picks_in(spec, normal(i), rows));
        }
        picks.sort_by_key(|&(j, _)| j);
        assert_eq!(picks.len() as u64, ft::CHECKSUM_CELLS);
        checksums.push(ft::sum_picks(picks.into_iter().map(|(_, v)| v)));
    }
    let last: Vec<C> = u.concat();
    let hashes = last
        .chunks_exact(nx)
        .map(|r| {
            let flat: Vec<f64> = r.iter().flat_map(|c| [c.re, c.im]).collect();
            kernels::stencil::hash_cells(&flat)
        })
        .collect();
    (checksums, hashes)
}

#[test]
fn ft_by_partitions_with_all_to_all_transposes_gives_the_sequential_bits() {
    let spec = ft::Spec::new(16, 8, 5);
    let seq = ft::sequential(&spec, 4);
    for parts in [1, 2, 3, 5, 8] {
        let (checksums, hashes) = ft_by_partitions(&spec, parts, 4);
        assert_eq!(
            cbits(&checksums),
            cbits(&seq.checksums),
            "{parts} partitions"
        );
        assert_eq!(hashes, seq.digest.hashes, "{parts} partitions");
    }
}

#[test]
fn ft_keeps_the_mean_and_damps_the_rest() {
    let spec = ft::Spec::new(32, 32, 9);
    let u0 = ft::initial(&spec);
    let mean = |g: &[C]| {
        let n = g.len() as f64;
        g.iter().fold(C::ZERO, |s, c| C {
            re: s.re + c.re / n,
            im: s.im + c.im / n,
        })
    };
    let spread = |g: &[C], m: C| g.iter().map(|c| (c.re - m.re).powi(2)).sum::<f64>();
    let m0 = mean(&u0);
    let s = ft::sequential(&spec, 8);
    let m = mean(&s.last);
    assert!((m.re - m0.re).abs() < 1e-12 && (m.im - m0.im).abs() < 1e-12);
    // The zero mode is kept, every other one decays: the spread around the mean shrinks.
    assert!(spread(&s.last, m) < 0.5 * spread(&u0, m0));
    assert_eq!(s.checksums.len(), 8);
    // One step of a sequence of 8 is the whole of a run of 1.
    let one = ft::sequential(&spec, 1);
    assert_eq!(cbits(&one.checksums), cbits(&s.checksums[..1]));
}

#[test]
fn heat3d_brick_bytes_that_do_not_fit_are_an_error() {
    let d = heat3d::Dims::cube(6);
    let mut b = heat3d::Brick::new(d, 2..4, 1..5);
    b.sweep_next();
    let bytes = postcard::to_allocvec(&b).unwrap();
    let back: heat3d::Brick = postcard::from_bytes(&bytes).unwrap();
    assert_eq!(postcard::to_allocvec(&back).unwrap(), bytes);
    // Tampered with in JSON, whose fields can be named.
    let json = serde_json::to_string(&b).unwrap();
    for (from, to) in [
        ("\"done\":1", "\"done\":3"), // more planes than it has
        (
            "\"z\":{\"start\":2,\"end\":4}",
            "\"z\":{\"start\":2,\"end\":7}",
        ), // past the grid
        ("\"cur\":[", "\"cur\":[0.5,"), // a cell too many
        ("\"nx\":6", "\"nx\":2"),     // no interior
    ] {
        assert!(json.contains(from), "{from}");
        let bad = json.replacen(from, to, 1);
        let err = serde_json::from_str::<heat3d::Brick>(&bad).unwrap_err();
        assert!(err.to_string().contains("a brick"), "{err}");
    }
}
