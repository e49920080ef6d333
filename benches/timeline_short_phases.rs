//! What the timeline ([`Builder::timeline`](malleable::Builder::timeline)) costs a job whose
//! phases are short: the same job with and without a timeline, in interleaved pairs.
//!
//! `cargo bench --bench timeline_short_phases` runs a job of 2 000 phases of 32 768 cheap
//! iterations (a phase lasts about a hundred microseconds, so one record per phase is as dense as a
//! timeline gets) on 2 local workers, `TIMELINE_RUNS` pairs (default 9), each pair in both
//! orders alternately, and prints every pair's times, the median ratio (with ÷ without: 1.00
//! is no cost), the ratio of the summed times, the median ratio of the CPU time the process
//! used (less sensitive to other load on the machine than wall-clock time), and the records
//! written.

use std::time::{Duration, Instant};

use malleable::reduce::Sum;
use malleable::{Chunking, Executor, Fold, Folded, Next};
use serde::{Deserialize, Serialize};

const PHASES: u64 = 2000;
const N: u64 = 32_768;

#[derive(Serialize, Deserialize)]
struct Short {
    phase: u64,
}

impl Fold for Short {
    const NAME: &'static str = "short-phases";
    type Acc = u64;
    type Reducer = Sum<u64>;
    type Input = ();
    fn iterations(&self) -> u64 {
        N
    }
    fn reducer(&self) -> Sum<u64> {
        Sum::new()
    }
    fn body(&self, _: &(), acc: &mut u64, i: u64) {
        *acc = acc.wrapping_add(std::hint::black_box(i ^ self.phase));
    }
    fn end_phase(&mut self, _: &u64) -> Next {
        self.phase += 1;
        if self.phase == PHASES {
            Next::Finish
        } else {
            Next::Continue
        }
    }
}

/// CPU time of this process so far (user + system, all threads).
fn cpu() -> Duration {
    // SAFETY: `getrusage` writes one `rusage` into the zeroed value it is given, which
    // outlives the call.
    let usage = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// One run: its wall-clock time and the CPU time the process used meanwhile (the writer
/// thread's included, up to the shutdown that waits for it).
fn run(timeline: Option<&std::path::Path>) -> (Duration, Duration) {
    let mut b = Executor::builder()
        .local_workers(2)
        .chunking(Chunking::Count(8));
    if let Some(p) = timeline {
        b = b.timeline(p);
    }
    let exec = b.build().expect("an executor");
    let c = cpu();
    let t = Instant::now();
    let value = exec
        .run(Folded(Short { phase: 0 }))
        .expect("the job")
        .into_value();
    let took = t.elapsed();
    std::hint::black_box(value);
    exec.shutdown().expect("a clean shutdown");
    (took, cpu() - c)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` asks for the list of benchmarks.
    }
    let runs: usize = std::env::var("TIMELINE_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(9);
    let log = std::env::temp_dir().join(format!("malleable-bench-{}.jsonl", std::process::id()));
    run(None); // warm-up
    println!(
        "{PHASES} phases of {N} iterations, 2 local workers; {runs} pairs (ms without / with a \
         timeline; wall clock, then CPU time)"
    );
    let mut ratios = Vec::with_capacity(runs);
    let mut cpu_ratios = Vec::with_capacity(runs);
    let (mut all_without, mut all_with) = (0.0, 0.0);
    for i in 0..runs {
        let ((without, cpu_without), (with, cpu_with)) = if i % 2 == 0 {
            let a = run(None);
            (a, run(Some(&log)))
        } else {
            let b = run(Some(&log));
            (run(None), b)
        };
        let r = with.as_secs_f64() / without.as_secs_f64();
        let rc = cpu_with.as_secs_f64() / cpu_without.as_secs_f64();
        cpu_ratios.push(rc);
        all_without += without.as_secs_f64();
        all_with += with.as_secs_f64();
        println!(
            "  pair {i:>2}: {:>7.1} / {:>7.1}  ratio {r:.3}   CPU {:>7.1} / {:>7.1}  ratio {rc:.3}",
            without.as_secs_f64() * 1e3,
            with.as_secs_f64() * 1e3,
            cpu_without.as_secs_f64() * 1e3,
            cpu_with.as_secs_f64() * 1e3
        );
        ratios.push(r);
    }
    ratios.sort_by(f64::total_cmp);
    let records = malleable::timeline::read(&log).map_or(0, |r| r.len());
    println!(
        "median ratio (with ÷ without): {:.3}  (min {:.3}, max {:.3}); {records} records per run",
        ratios[ratios.len() / 2],
        ratios[0],
        ratios[ratios.len() - 1]
    );
    println!("ratio of the totals: {:.3}", all_with / all_without);
    cpu_ratios.sort_by(f64::total_cmp);
    println!(
        "median CPU-time ratio: {:.3}  (min {:.3}, max {:.3})",
        cpu_ratios[cpu_ratios.len() / 2],
        cpu_ratios[0],
        cpu_ratios[cpu_ratios.len() - 1]
    );
    let _ = std::fs::remove_file(&log);
}
