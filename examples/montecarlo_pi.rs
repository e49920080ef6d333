//! Monte Carlo estimate of π as a malleable loop.
//!
//! The loop ([`Pi`], in `kernels/jobs.rs`) has one iteration per sample and an accumulator
//! that counts hits. Sample `i` is drawn from a counter-based generator, so the count of hits
//! is the same whatever the worker count or the scaling history; the example checks it
//! exactly against a sequential count.
//!
//! ```text
//! cargo run --release --example montecarlo_pi [SAMPLES]
//! ```

#[path = "kernels/mod.rs"]
mod kernels;

use std::time::Instant;

use malleable::{Executor, Folded};

use kernels::jobs::Pi;
use kernels::montecarlo;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let samples: u64 = match std::env::args().nth(1) {
        Some(s) => s.replace('_', "").parse()?,
        None => 1_000_000_000,
    };
    let seed = 2024;

    let exec = Executor::builder().build()?;
    let t = Instant::now();
    let hits = exec.run(Folded(Pi { samples, seed }))?.into_value();
    let parallel = t.elapsed();

    let t = Instant::now();
    let expected = montecarlo::sequential(seed, samples);
    let sequential = t.elapsed();

    let pi = montecarlo::estimate(hits, samples);
    println!("samples      {samples}");
    println!("hits         {hits}");
    println!(
        "pi           {pi:.8}  (error {:+.2e})",
        pi - std::f64::consts::PI
    );
    println!(
        "malleable    {:>8.3} s  ({:.0} M samples/s, {} workers)",
        parallel.as_secs_f64(),
        samples as f64 / parallel.as_secs_f64() / 1e6,
        std::thread::available_parallelism().map_or(1, usize::from)
    );
    println!(
        "sequential   {:>8.3} s  (speedup {:.2}x)",
        sequential.as_secs_f64(),
        sequential.as_secs_f64() / parallel.as_secs_f64()
    );
    if hits != expected {
        eprintln!("FAILED: malleable counted {hits} hits, the sequential loop {expected}");
        std::process::exit(1);
    }
    println!("check        ok: same hit count as the sequential loop");
    Ok(())
}
