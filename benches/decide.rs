//! The autoscaling decider's own cost: one decision (`Decider::observe`) with 10 000 workers.
//!
//! `cargo bench --bench decide` feeds a decider one measurement per simulated second (the
//! executor's default period) for 8 000 local threads and 2 000 worker processes, with
//! throughputs that move, and prints the time per decision and its ratio to 10 ms: 1% of one
//! core at one decision per second. The executor also gathers the measurement (one pass over
//! the core's workers under the job's lock); that pass is not timed here.

use std::hint::black_box;
use std::time::{Duration, Instant};

use malleable::schedule::{Autoscale, Decider, Measurement};

fn main() {
    let (locals, remotes) = (8_000usize, 2_000usize);
    let policy = Autoscale::throughput(4.5e6)
        .local(1, 2 * locals)
        .remote(0, 2 * remotes);
    let mut local_rates: Vec<f64> = (0..locals).map(|i| 400.0 + (i % 97) as f64).collect();
    let mut remote_rates: Vec<f64> = (0..remotes).map(|i| 800.0 + (i % 89) as f64).collect();
    let rounds = 20_000u64;
    let mut best = Duration::MAX;
    let mut decisions = 0;
    for _ in 0..5 {
        let mut decider = Decider::new(policy);
        let mut done = 0u64;
        let (mut local, mut remote) = (locals, remotes);
        let t0 = Instant::now();
        for s in 1..=rounds {
            // The load moves a little every second, and steps every 100 s; the throughput
            // follows the worker count.
            let wobble = 1.0 + 0.05 * ((s % 7) as f64 - 3.0) / 3.0;
            let step = if (s / 100) % 2 == 0 { 1.0 } else { 0.6 };
            let scale = (local + remote) as f64 / (locals + remotes) as f64;
            local_rates[(s as usize) % locals] *= 1.0 + 1e-6;
            remote_rates[(s as usize) % remotes] *= 1.0 - 1e-6;
            done += (4.4e6 * wobble * step * scale) as u64;
            let m = Measurement {
                now: Duration::from_secs(s),
                done,
                left: None,
                local,
                remote,
                local_rates: &local_rates,
                remote_rates: &remote_rates,
            };
            if let Some(d) = black_box(decider.observe(black_box(&m))) {
                // Worker processes join at once here.
                (local, remote) = (d.local, d.remote);
                decisions += 1;
            }
        }
        best = best.min(t0.elapsed());
    }
    let per = best / rounds as u32;
    let budget = Duration::from_millis(10);
    println!(
        "decide: {} workers, {:.2} µs per decision (best of 5 runs of {rounds}), {:.5} of the \
         10 ms budget (1% of a core at 1 decision/s); {} decisions per run",
        locals + remotes,
        per.as_secs_f64() * 1e6,
        per.as_secs_f64() / budget.as_secs_f64(),
        decisions / 5,
    );
}
