//! Kernels shared by the examples and the benchmarks (`loop_vs_rayon`, `stencil`, …).
//!
//! Plain, fast functions with no knowledge of `malleable`: one iteration of each loop, plus the
//! sequential reference the examples check their parallel results against. Every kernel is a
//! pure function of its iteration index (and read-only data), so an iteration gives the same
//! result whoever runs it, and none allocates per iteration.
//!
//! [`jobs`] knows `malleable`: it wraps kernels in the malleable jobs that both the examples
//! and the benchmark run. So does [`stencil`], whose kernels are not per iteration but per row
//! of a grid that lives across phases: it keeps each grid's sequential loop, rayon version and
//! [`Rows`](malleable::Rows) implementation together, since the three share one row update.
//!
//! [`heat3d`], [`cg`] and [`ft`] are the kernels of runs whose partitions exchange more than
//! halos with the chunks before and after (a 3-D stencil on pencils, conjugate gradients,
//! a spectral solver's transposes): each has a sequential reference and a rayon version
//! that give the same bits, and the pieces (per block of rows, per pencil, per transpose
//! block) a partitioned run computes with; `tests/kernels_reference.rs` checks them.
//! [`processes`] is the processes mode of those three examples (`--processes`): worker
//! processes of the same program that join, retire and are killed while the job runs.
//!
//! Include it with `#[path = "kernels/mod.rs"] mod kernels;` (from `benches/`:
//! `#[path = "../examples/kernels/mod.rs"]`). Cargo does not build this folder as an example
//! since it has no `main.rs`.

// Each example uses only some of the kernels and jobs.
#![allow(dead_code)]

pub(crate) mod cg;
pub(crate) mod crypt;
pub(crate) mod ft;
pub(crate) mod heat3d;
pub(crate) mod jobs;
pub(crate) mod kmeans;
pub(crate) mod montecarlo;
pub(crate) mod processes;
pub(crate) mod raytrace;
pub(crate) mod stencil;

/// An example's exit status: success when its checks passed; failure on a mismatch, or on
/// an error, which is printed.
pub(crate) fn exit_code<E: std::fmt::Display>(checked: Result<bool, E>) -> std::process::ExitCode {
    match checked {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// The splitmix64 finalizer: a good 64-bit mix, used as a counter-based random generator
/// (`splitmix64(seed + i * GOLDEN)` is the `i`-th output of a splitmix64 stream).
#[inline]
pub(crate) fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(GOLDEN);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The splitmix64 increment (2⁶⁴ / φ).
pub(crate) const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// Random value number `i` of the stream `seed`: independent of who asks and in what order.
#[inline]
pub(crate) fn random_at(seed: u64, i: u64) -> u64 {
    splitmix64(seed.wrapping_add(i.wrapping_mul(GOLDEN)))
}

/// A uniform `f64` in `[0, 1)` from the top 53 bits of `r`.
#[inline]
pub(crate) fn unit_f64(r: u64) -> f64 {
    (r >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}
