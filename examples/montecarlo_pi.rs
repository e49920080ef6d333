//! Monte Carlo estimate of π as a malleable loop.
//!
//! Sample `i` is drawn from a counter-based generator, so the count of hits is the same
//! whatever the worker count or the scaling history; the example checks it exactly against
//! a sequential count.
//!
//! ```text
//! cargo run --release --example montecarlo_pi [SAMPLES]
//! ```

#[path = "kernels/mod.rs"]
mod kernels;

use std::time::Instant;

use malleable::reduce::Count;
use malleable::{Executor, Fold, Folded};
use serde::{Deserialize, Serialize};

use kernels::montecarlo;

/// The loop: one iteration per sample, the accumulator counts hits.
#[derive(Serialize, Deserialize)]
struct Pi {
    samples: u64,
    seed: u64,
}

impl Fold for Pi {
    const NAME: &'static str = "montecarlo-pi";
    type Acc = u64;
    type Reducer = Count;
    type Input = ();

    fn iterations(&self) -> u64 {
        self.samples
    }

    fn reducer(&self) -> Count {
        Count
    }

    #[inline]
    fn body(&self, _: &(), hits: &mut u64, i: u64) {
        *hits += u64::from(montecarlo::in_circle(self.seed, i));
    }
}

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
