//! The same kernels run sequentially, in rayon and in malleable, at 1 and 2 threads.
//!
//! Kernels (from `examples/kernels/`), each sized so that one sequential run takes about
//! 100–200 ms:
//!
//! - `montecarlo`: π by Monte Carlo, 50 M samples (a counter-based RNG per sample); a sum.
//! - `crypt`: IDEA encryption of 8 MiB, one 8-byte block per iteration; a new buffer.
//! - `crypt2`: the round trip of 8 MiB in two phases, encrypt into a new buffer, then decrypt
//!   it in place; malleable keeps each chunk's ciphertext in its owned partition
//!   (`CryptRoundTrip`), nothing is copied at the barrier. The result is the digest of each
//!   phase.
//! - `raytrace`: a 640×480 image, 4 rays per pixel, one row per iteration; a new buffer.
//!
//! Each kernel runs five ways: `sequential` (a plain loop), `rayon/1` and `rayon/2` (a
//! `ThreadPoolBuilder` pool of 1 or 2 threads, built once, the work run with `install`), and
//! `malleable/1` and `malleable/2` (an executor with 1 or 2 local workers and the default
//! chunking, `Count(1024)`, running the examples' jobs from `examples/kernels/jobs.rs`; every
//! run is a new job, so its threads are spawned per run, as in real use). Rayon writes the buffers in place; malleable chunks return owned `Vec`s that
//! `CollectInOrder` concatenates, which is what a malleable loop has to do since a chunk's
//! output must be a value that can move between workers.
//!
//! # Running
//!
//! ```text
//! cargo bench --bench loop_vs_rayon                  # criterion groups, then the ratio table
//! cargo bench --bench loop_vs_rayon -- --ratios      # the ratio table only (about 15 s)
//! cargo bench --bench loop_vs_rayon -- crypt         # criterion filter, then the ratio table
//! LOOP_VS_RAYON_RUNS=15 cargo bench --bench loop_vs_rayon -- --ratios   # more timed runs
//! cargo test --bench loop_vs_rayon                   # a quick checked pass at 1/16 size
//! ```
//!
//! The ratio table comes from this process's own timing, not criterion's: every variant of a
//! kernel runs `LOOP_VS_RAYON_RUNS` times (default 7), interleaved round-robin so that drift
//! in machine load hits all variants alike, and the table shows the median time of each and
//! these throughput ratios (above 1 means malleable is faster):
//!
//! - `m1/r1` = malleable at 1 worker ÷ rayon at 1 thread,
//! - `m2/r2` = malleable at 2 workers ÷ rayon at 2 threads,
//! - `m1/seq` = malleable at 1 worker ÷ the sequential loop (the cost of the machinery),
//! - `m2/m1` = malleable's own scaling from 1 to 2 workers.
//!
//! Before anything is timed, every variant's result is checked against the sequential one.

#[path = "../examples/kernels/mod.rs"]
mod kernels;

use std::hint::black_box;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use criterion::{Criterion, SamplingMode, Throughput};
use malleable::{Executor, Folded};
use rayon::prelude::*;
use rayon::{ThreadPool, ThreadPoolBuilder};

use kernels::crypt::{self, Subkeys};
use kernels::jobs::{self, Crypt, CryptRoundTrip, Digest, Direction, Pi, Render};
use kernels::montecarlo;
use kernels::raytrace::{self, Scene};

const MC_SEED: u64 = 2024;
const CRYPT_KEY_SEED: u64 = 7;
const RT_SAMPLES: u32 = 2;

/// Input sizes: full under `cargo bench`, 1/16 under `cargo test` (unoptimized build).
#[derive(Debug, Clone, Copy)]
struct Sizes {
    mc_samples: u64,
    crypt_bytes: usize,
    rt_width: u32,
    rt_height: u32,
}

const FULL: Sizes = Sizes {
    mc_samples: 50_000_000,
    crypt_bytes: 8 << 20,
    rt_width: 640,
    rt_height: 480,
};

const QUICK: Sizes = Sizes {
    mc_samples: FULL.mc_samples / 16,
    crypt_bytes: FULL.crypt_bytes / 16,
    rt_width: FULL.rt_width / 4,
    rt_height: FULL.rt_height / 4,
};

static SIZES: OnceLock<Sizes> = OnceLock::new();

fn sizes() -> Sizes {
    *SIZES.get_or_init(|| FULL)
}

// ---------------------------------------------------------------------------------------
// Monte Carlo π

fn mc_sequential() -> u64 {
    montecarlo::sequential(MC_SEED, sizes().mc_samples)
}

fn mc_rayon(pool: &ThreadPool) -> u64 {
    pool.install(|| {
        (0..sizes().mc_samples)
            .into_par_iter()
            .map(|i| u64::from(montecarlo::in_circle(MC_SEED, i)))
            .sum()
    })
}

fn mc_malleable(exec: &Executor) -> u64 {
    exec.run(Folded(Pi {
        samples: sizes().mc_samples,
        seed: MC_SEED,
    }))
    .expect("montecarlo job")
    .into_value()
}

// ---------------------------------------------------------------------------------------
// IDEA encryption

/// The name the plaintext is published under, for the crypt job.
const PLAINTEXT: &str = "plaintext";

/// The plaintext, built and published once per process.
fn plaintext() -> &'static [u8] {
    static PLAIN: OnceLock<Arc<Vec<u8>>> = OnceLock::new();
    PLAIN.get_or_init(|| jobs::publish(PLAINTEXT, crypt::plaintext(42, sizes().crypt_bytes)))
}

fn subkeys() -> Subkeys {
    crypt::encrypt_key(crypt::user_key(CRYPT_KEY_SEED))
}

fn crypt_sequential() -> Vec<u8> {
    crypt::sequential(plaintext(), &subkeys())
}

fn crypt_rayon(pool: &ThreadPool) -> Vec<u8> {
    let (plain, key) = (plaintext(), subkeys());
    let mut out = vec![0u8; plain.len()];
    pool.install(|| {
        out.par_chunks_exact_mut(8)
            .zip(plain.par_chunks_exact(8))
            .for_each(|(o, i)| {
                o.copy_from_slice(&crypt::cipher_block(i.try_into().expect("8 bytes"), &key));
            });
    });
    out
}

fn crypt_malleable(exec: &Executor) -> Vec<u8> {
    exec.run(Crypt {
        buffer: PLAINTEXT.into(),
        blocks: (plaintext().len() / 8) as u64,
        key: crypt::user_key(CRYPT_KEY_SEED),
        direction: Direction::Encrypt,
    })
    .expect("crypt job")
    .into_value()
    .into() // `Vec<u8>: From<BytesMut>` takes over the allocation, no copy
}

// ---------------------------------------------------------------------------------------
// Ray tracing

fn scene() -> Scene {
    Scene::new(sizes().rt_width, sizes().rt_height, RT_SAMPLES)
}

fn rt_sequential() -> Vec<u8> {
    raytrace::sequential(&scene())
}

fn rt_rayon(pool: &ThreadPool) -> Vec<u8> {
    let scene = scene();
    let mut img = vec![0u8; scene.row_bytes() * scene.height() as usize];
    pool.install(|| {
        img.par_chunks_mut(scene.row_bytes())
            .enumerate()
            .for_each(|(y, row)| scene.render_row(y as u32, row));
    });
    img
}

fn rt_malleable(exec: &Executor) -> Vec<u8> {
    exec.run(Folded(Render {
        width: sizes().rt_width,
        height: sizes().rt_height,
        samples: RT_SAMPLES,
    }))
    .expect("raytrace job")
    .into_value()
}

// ---------------------------------------------------------------------------------------
// IDEA round trip

/// The digests of the ciphertext and of the round trip's result.
type Digests = (Digest, Digest);

/// The digest of `buf` against the plaintext, in parallel per 64 KiB, combined.
fn digest_rayon(buf: &[u8], plain: &[u8]) -> Digest {
    buf.par_chunks(64 << 10)
        .zip(plain.par_chunks(64 << 10))
        .enumerate()
        .map(|(k, (b, p))| Digest::of((k * (8 << 10)) as u64, b, p))
        .reduce(Digest::default, |mut a, b| {
            a.hash ^= b.hash;
            a.differ += b.differ;
            a
        })
}

fn decrypt_in_place(block: &mut [u8], dk: &Subkeys) {
    let c: [u8; 8] = (&*block).try_into().expect("8 bytes");
    block.copy_from_slice(&crypt::cipher_block(&c, dk));
}

fn crypt2_sequential() -> Digests {
    let (plain, ek) = (plaintext(), subkeys());
    let dk = crypt::decrypt_key(&ek);
    let mut buf = crypt::sequential(plain, &ek);
    let first = Digest::of(0, &buf, plain);
    buf.chunks_exact_mut(8)
        .for_each(|b| decrypt_in_place(b, &dk));
    (first, Digest::of(0, &buf, plain))
}

fn crypt2_rayon(pool: &ThreadPool) -> Digests {
    let plain = plaintext();
    let dk = crypt::decrypt_key(&subkeys());
    let mut buf = crypt_rayon(pool);
    pool.install(|| {
        let first = digest_rayon(&buf, plain);
        buf.par_chunks_exact_mut(8)
            .for_each(|b| decrypt_in_place(b, &dk));
        (first, digest_rayon(&buf, plain))
    })
}

fn crypt2_malleable(exec: &Executor) -> Digests {
    let done = exec
        .run(CryptRoundTrip {
            buffer: PLAINTEXT.into(),
            blocks: (plaintext().len() / 8) as u64,
            key: crypt::user_key(CRYPT_KEY_SEED),
            phase: 0,
            encrypted: None,
        })
        .expect("crypt round trip");
    (done.job.encrypted.expect("phase 0 ran"), done.value)
}

// ---------------------------------------------------------------------------------------
// The harness

/// The thread pools and executors, at 1 and 2 threads.
struct Runners {
    rayon: [ThreadPool; 2],
    malleable: [Executor; 2],
}

impl Runners {
    fn new() -> Runners {
        let pool = |n| {
            ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .expect("rayon pool")
        };
        let exec = |n| {
            Executor::builder()
                .local_workers(n)
                .build()
                .expect("executor")
        };
        Runners {
            rayon: [pool(1), pool(2)],
            malleable: [exec(1), exec(2)],
        }
    }
}

/// The five ways to run a kernel, in table order.
const VARIANTS: [&str; 5] = [
    "sequential",
    "rayon/1",
    "rayon/2",
    "malleable/1",
    "malleable/2",
];

/// One kernel: its name, its work per run, and how to run it each way (`variant` indexes
/// [`VARIANTS`]). The runner returns the result, for the checks and `black_box`.
struct Kernel<T> {
    name: &'static str,
    throughput: Throughput,
    run: fn(&Runners, usize) -> T,
}

fn dispatch<T>(
    r: &Runners,
    variant: usize,
    seq: fn() -> T,
    ray: fn(&ThreadPool) -> T,
    mal: fn(&Executor) -> T,
) -> T {
    match variant {
        0 => seq(),
        1 | 2 => ray(&r.rayon[variant - 1]),
        _ => mal(&r.malleable[variant - 3]),
    }
}

fn montecarlo_kernel() -> Kernel<u64> {
    Kernel {
        name: "montecarlo",
        throughput: Throughput::Elements(sizes().mc_samples),
        run: |r, v| dispatch(r, v, mc_sequential, mc_rayon, mc_malleable),
    }
}

fn crypt_kernel() -> Kernel<Vec<u8>> {
    Kernel {
        name: "crypt",
        throughput: Throughput::Bytes(sizes().crypt_bytes as u64),
        run: |r, v| dispatch(r, v, crypt_sequential, crypt_rayon, crypt_malleable),
    }
}

fn crypt2_kernel() -> Kernel<Digests> {
    Kernel {
        name: "crypt2",
        throughput: Throughput::Bytes(2 * sizes().crypt_bytes as u64),
        run: |r, v| dispatch(r, v, crypt2_sequential, crypt2_rayon, crypt2_malleable),
    }
}

fn raytrace_kernel() -> Kernel<Vec<u8>> {
    Kernel {
        name: "raytrace",
        throughput: Throughput::Elements(u64::from(sizes().rt_width * sizes().rt_height)),
        run: |r, v| dispatch(r, v, rt_sequential, rt_rayon, rt_malleable),
    }
}

/// Runs every variant once and checks it against the sequential result.
fn check<T: PartialEq>(r: &Runners, k: &Kernel<T>) {
    let expected = (k.run)(r, 0);
    for (v, name) in VARIANTS.iter().enumerate().skip(1) {
        assert!(
            (k.run)(r, v) == expected,
            "{}: {name} differs from the sequential result",
            k.name
        );
    }
}

fn criterion_group<T>(c: &mut Criterion, r: &Runners, k: &Kernel<T>) {
    let mut g = c.benchmark_group(k.name);
    g.throughput(k.throughput.clone())
        .sampling_mode(SamplingMode::Flat)
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for (v, name) in VARIANTS.iter().enumerate() {
        g.bench_function(*name, |b| b.iter(|| black_box((k.run)(r, v))));
    }
    g.finish();
}

/// Median time of each variant over `runs` interleaved runs.
fn medians<T>(r: &Runners, k: &Kernel<T>, runs: usize) -> [Duration; 5] {
    let mut times: [Vec<Duration>; 5] = Default::default();
    for _ in 0..runs {
        for (v, t) in times.iter_mut().enumerate() {
            let start = Instant::now();
            black_box((k.run)(r, v));
            t.push(start.elapsed());
        }
    }
    times.map(|mut t| {
        t.sort_unstable();
        t[t.len() / 2]
    })
}

/// One row of the ratio table.
fn ratio_row<T>(r: &Runners, k: &Kernel<T>, runs: usize) {
    let [seq, r1, r2, m1, m2] = medians(r, k, runs).map(|d| d.as_secs_f64());
    // Throughput ratios are inverse time ratios.
    println!(
        "| {:<10} | {:>7.1} | {:>7.1} | {:>7.1} | {:>7.1} | {:>7.1} | {:>5.2} | {:>5.2} | {:>6.2} | {:>5.2} |",
        k.name,
        seq * 1e3,
        r1 * 1e3,
        r2 * 1e3,
        m1 * 1e3,
        m2 * 1e3,
        r1 / m1,
        r2 / m2,
        seq / m1,
        m1 / m2
    );
}

fn ratio_table(r: &Runners) {
    let runs = std::env::var("LOOP_VS_RAYON_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|&n: &usize| n > 0)
        .unwrap_or(7);
    println!();
    println!(
        "Median of {runs} interleaved runs (ms); throughput ratios, > 1 = malleable faster \
         ({} hardware threads):",
        std::thread::available_parallelism().map_or(1, usize::from)
    );
    println!();
    println!(
        "| kernel     |     seq | rayon@1 | rayon@2 |  mall@1 |  mall@2 | m1/r1 | m2/r2 | m1/seq | m2/m1 |"
    );
    println!(
        "|------------|--------:|--------:|--------:|--------:|--------:|------:|------:|-------:|------:|"
    );
    ratio_row(r, &montecarlo_kernel(), runs);
    ratio_row(r, &crypt_kernel(), runs);
    ratio_row(r, &crypt2_kernel(), runs);
    ratio_row(r, &raytrace_kernel(), runs);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let has = |a: &str| args.iter().any(|x| x == a);
    // `cargo bench` passes `--bench`; `cargo test` does not, and wants a quick pass.
    let bench = has("--bench") && !has("--test");
    SIZES
        .set(if bench || has("--ratios") {
            FULL
        } else {
            QUICK
        })
        .expect("sizes are set once, first");
    let runners = Runners::new();

    check(&runners, &montecarlo_kernel());
    check(&runners, &crypt_kernel());
    check(&runners, &crypt2_kernel());
    check(&runners, &raytrace_kernel());

    if has("--ratios") {
        ratio_table(&runners);
        return;
    }

    let mut c = Criterion::default().configure_from_args();
    criterion_group(&mut c, &runners, &montecarlo_kernel());
    criterion_group(&mut c, &runners, &crypt_kernel());
    criterion_group(&mut c, &runners, &crypt2_kernel());
    criterion_group(&mut c, &runners, &raytrace_kernel());
    c.final_summary();

    // Under `cargo test` (no `--bench`), criterion ran each benchmark once; skip the table.
    if bench && !has("--list") {
        ratio_table(&runners);
    }
}
