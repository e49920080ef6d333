//! Quickstart: an elastic loop that grows and shrinks while it runs, and still gives the
//! same value, bit for bit, as a plain sequential loop.
//!
//! The loop computes π = ∫₀¹ 4/(1+x²) dx by the midpoint rule as an `f64` sum, written as a
//! [`Fold`] (the loop body over one iteration; the library owns the loop counter and the
//! accumulator). A helper thread blocks in [`JobHandle::wait`] on a clone of the handle, while
//! the main thread watches [`JobHandle::progress`] every 200 ms and rescales the running job:
//! 1 worker → 2 workers → 0 workers (inline: the thread blocked in `wait` computes the loop
//! itself) → 2 workers. (With zero workers and nobody waiting, a job simply pauses.)
//!
//! On a terminal, a progress bar fed by the same `progress()` stays below the report lines
//! (`indicatif`; it hides itself when the output is not a terminal).
//!
//! ```text
//! cargo run --release --example quickstart [ITERATIONS]
//! ```

use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use malleable::reduce::Sum;
use malleable::{Chunking, Executor, Fold, Folded, JobHandle, Progress};
use serde::{Deserialize, Serialize};

/// Iterations per chunk. The value depends on the chunk boundaries (each chunk sums from 0.0,
/// then the chunk sums are added in order), never on the workers; fixing the size lets the
/// sequential check below sum in exactly the same order.
const CHUNK: u64 = 1 << 20;

/// π by the midpoint rule with `n` intervals (the sum of the heights; times `1/n` at the end).
#[derive(Serialize, Deserialize)]
struct MidpointPi {
    n: u64,
}

impl MidpointPi {
    #[inline]
    fn height(&self, i: u64) -> f64 {
        let x = (i as f64 + 0.5) / self.n as f64;
        4.0 / (1.0 + x * x)
    }
}

impl Fold for MidpointPi {
    const NAME: &'static str = "quickstart-pi";
    type Acc = f64;
    type Reducer = Sum<f64>;
    type Input = ();

    fn iterations(&self) -> u64 {
        self.n
    }

    fn reducer(&self) -> Sum<f64> {
        Sum::new()
    }

    #[inline]
    fn body(&self, _: &(), acc: &mut f64, i: u64) {
        *acc += self.height(i);
    }
}

/// The same sum as a plain loop: chunk by chunk from 0.0, chunk sums added in order.
fn sequential(job: &MidpointPi) -> f64 {
    let mut total = 0.0;
    let mut start = 0;
    while start < job.n {
        let end = job.n.min(start + CHUNK);
        let mut chunk = 0.0;
        for i in start..end {
            chunk += job.height(i);
        }
        total += chunk;
        start = end;
    }
    total
}

/// A progress bar over the loop's iterations, below the lines (hidden when stderr is not a
/// terminal).
fn progress_bar(total: u64) -> ProgressBar {
    let style = ProgressStyle::with_template(
        "{spinner} {elapsed_precise} {wide_bar} {percent:>3}%  {msg}, eta {eta}",
    )
    .expect("a valid template");
    ProgressBar::new(total).with_style(style)
}

/// One line of progress; `last` is the previous report and when it was taken.
fn report(
    h: &JobHandle<Folded<MidpointPi>>,
    bar: &ProgressBar,
    t0: Instant,
    last: &mut (Instant, u64),
) {
    let p = h.progress();
    bar.set_position(p.done);
    bar.set_message(format!(
        "{} local worker{}",
        p.local_workers,
        if p.local_workers == 1 { "" } else { "s" }
    ));
    let now = Instant::now();
    // A single-phase job: `done` counts the iterations of the whole loop.
    let recent = p.done.saturating_sub(last.1) as f64 / (now - last.0).as_secs_f64();
    *last = (now, p.done);
    bar.suspend(|| {
        println!(
            "  {:>5.2} s  {:>5.1}% done  {:>4.0} M it/s now  {:>4.0} M it/s average  {} local worker{} (target {})",
            t0.elapsed().as_secs_f64(),
            100.0 * p.done as f64 / p.total as f64,
            recent / 1e6,
            p.rate / 1e6,
            p.local_workers,
            if p.local_workers == 1 { "" } else { "s" },
            h.local_workers(),
        )
    });
}

/// Reports every 200 ms until `until` says stop or the job ends.
fn watch(
    h: &JobHandle<Folded<MidpointPi>>,
    bar: &ProgressBar,
    t0: Instant,
    last: &mut (Instant, u64),
    mut until: impl FnMut(&Progress) -> bool,
) {
    loop {
        std::thread::sleep(Duration::from_millis(200));
        if h.is_finished() {
            return;
        }
        report(h, bar, t0, last);
        if until(&h.progress()) {
            return;
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: u64 = match std::env::args().nth(1) {
        Some(s) => s.replace('_', "").parse()?,
        None => 1_000_000_000,
    };
    let fraction = |p: &Progress| p.done as f64 / p.total as f64;

    let exec = Executor::builder()
        .local_workers(1)
        .chunking(Chunking::Size(CHUNK))
        .build()?;
    let t0 = Instant::now();
    let mut last = (t0, 0);
    let handle = exec.submit(Folded(MidpointPi { n }))?;
    println!("submitted {n} iterations with 1 local worker");

    // Whoever waits runs the job when it has zero workers; here a helper thread waits, on a
    // clone of the handle, so that the main thread stays free to watch and scale.
    let waiter = std::thread::spawn({
        let handle = handle.clone();
        move || handle.wait()
    });

    let bar = progress_bar(n);
    let say = |line: &str| bar.suspend(|| println!("{line}"));
    watch(&handle, &bar, t0, &mut last, |p| fraction(p) >= 0.2);
    say("-> set_local_workers(2)");
    handle.set_local_workers(2);

    watch(&handle, &bar, t0, &mut last, |p| fraction(p) >= 0.45);
    say("-> set_local_workers(0): the thread blocked in wait() runs the loop inline");
    handle.set_local_workers(0);

    watch(&handle, &bar, t0, &mut last, |p| fraction(p) >= 0.7);
    say("-> set_local_workers(2)");
    handle.set_local_workers(2);

    watch(&handle, &bar, t0, &mut last, |_| false);
    bar.finish_and_clear();
    let outcome = waiter.join().expect("the waiting thread panicked")?;
    let sum = outcome.finished().expect("finished").into_value();
    println!("  {:>5.2} s  done", t0.elapsed().as_secs_f64());

    let pi = sum / n as f64;
    println!(
        "pi = {pi:.15}  (error {:+.1e}), sum bits {:#018x}",
        pi - std::f64::consts::PI,
        sum.to_bits()
    );

    let t = Instant::now();
    let expected = sequential(&MidpointPi { n });
    println!(
        "sequential loop: {:.2} s, sum bits {:#018x}",
        t.elapsed().as_secs_f64(),
        expected.to_bits()
    );
    if sum.to_bits() != expected.to_bits() {
        eprintln!("FAILED: the elastic loop gave {sum:e}, the sequential loop {expected:e}");
        std::process::exit(1);
    }
    println!("check: ok, bit-identical to the sequential loop despite 1 -> 2 -> 0 (inline) -> 2");
    Ok(())
}
