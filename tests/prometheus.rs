//! The crate's metrics through `metrics-exporter-prometheus`, scraped over loopback HTTP while
//! a real job runs: the families of `malleable::metrics` for phases, progress, workers,
//! snapshots and autoscaling decisions are there, and their values move with the job.
//!
//! The job runs phase after phase until the test lets it finish (a flag read by `end_phase`),
//! so every step below happens while it runs, whatever the machine's speed; the waits have
//! a generous safety limit that fails the test with what was missing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use malleable::metrics as m;
use malleable::reduce::Sum;
use malleable::schedule::{Autoscale, Hysteresis};
use malleable::{Chunking, Executor, Fold, Folded, JobHandle, Next};
use serde::{Deserialize, Serialize};

#[allow(dead_code)]
#[path = "../examples/prometheus.rs"]
mod example;

use example::{Sample, parse, scrape, value};

/// Set by the test: the job finishes at its next barrier.
static FINISH: AtomicBool = AtomicBool::new(false);

/// Σ i over `0..n` per phase, each iteration waiting 20 µs; phases until `FINISH`.
#[derive(Serialize, Deserialize)]
struct Watched {
    n: u64,
}

impl Fold for Watched {
    const NAME: &'static str = "watched";
    type Acc = u64;
    type Reducer = Sum<u64>;
    type Input = ();
    fn iterations(&self) -> u64 {
        self.n
    }
    fn reducer(&self) -> Sum<u64> {
        Sum::new()
    }
    fn body(&self, _: &(), acc: &mut u64, i: u64) {
        std::thread::sleep(Duration::from_micros(20));
        *acc += i;
    }
    fn end_phase(&mut self, _: &u64) -> Next {
        if FINISH.load(Ordering::Acquire) {
            Next::Finish
        } else {
            Next::Continue
        }
    }
}

/// Polls `what` every 2 ms until it holds; fails the test after a generous limit.
fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "waited two minutes for {what}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn get(samples: &[Sample], name: &str) -> f64 {
    value(samples, name, "watched").unwrap_or_else(|| {
        let names: std::collections::BTreeSet<&str> =
            samples.iter().map(|s| s.name.as_str()).collect();
        panic!("no {name} for job watched in the scrape; families: {names:?}")
    })
}

fn phase(h: &JobHandle<Folded<Watched>>) -> u64 {
    h.progress().phase
}

#[test]
fn a_scrape_shows_the_families_and_their_values_move_with_the_job() {
    let addr = example::free_port().unwrap();
    example::install(addr).unwrap();
    let store = std::env::temp_dir().join(format!("malleable-prom-{}", std::process::id()));
    let policy = Autoscale::throughput(1e12) // out of reach: grows to its maximum, 2
        .local(1, 2)
        .period(Duration::from_millis(50))
        .hysteresis(Hysteresis {
            cooldown: Duration::from_millis(200),
            window: 4,
            ..Hysteresis::default()
        });
    let exec = Executor::builder()
        .local_workers(1)
        .chunking(Chunking::Count(16))
        .snapshots(format!("file://{}", store.display()))
        .autoscale(policy)
        .build()
        .unwrap();
    let n = 500;
    let handle = exec.submit(Folded(Watched { n })).unwrap();

    // 1. While it runs with one worker: phases, progress, workers.
    wait_for("phase 2", || phase(&handle) >= 2);
    let first = parse(&scrape(addr).unwrap()).unwrap();
    let phases_1 = get(&first, m::PHASES);
    assert!(phases_1 >= 2.0, "{phases_1}");
    let phase_count = format!("{}_count", m::PHASE_SECONDS);
    assert!(get(&first, &phase_count) >= 2.0);
    assert!(get(&first, m::PHASE) >= 2.0);
    assert_eq!(get(&first, m::PHASE_ITERATIONS), n as f64);
    assert!(get(&first, m::ITERATIONS_DONE) >= 2.0 * n as f64);
    assert_eq!(get(&first, m::WORKERS_DRAINING), 0.0);
    assert_eq!(get(&first, m::WORKERS_JOINING), 0.0);
    let steps_1 = get(&first, m::STEPS);
    // The phase histogram has its buckets (the example sets them for `*_seconds`).
    assert!(
        first
            .iter()
            .any(|s| s.name == format!("{}_bucket", m::PHASE_SECONDS)
                && s.label("le") == Some("+Inf")),
        "no +Inf bucket of the phase histogram"
    );

    // 2. The autoscaler grows it to two workers; a snapshot is committed.
    wait_for("the autoscaler's grow to 2 workers", || {
        handle.local_workers() == 2
    });
    let id = handle.snapshot().wait().unwrap();
    wait_for("a phase after the snapshot", || {
        phase(&handle) >= phases_1 as u64 + 2
    });
    let second = parse(&scrape(addr).unwrap()).unwrap();
    assert!(get(&second, m::PHASES) > phases_1, "phases moved");
    assert!(get(&second, m::PHASE) > get(&first, m::PHASE));
    assert!(get(&second, m::ITERATIONS_DONE) > get(&first, m::ITERATIONS_DONE));
    assert!(get(&second, m::STEPS) > steps_1);
    assert_eq!(get(&second, m::WORKERS), 2.0);
    let grown: f64 = second
        .iter()
        .filter(|s| {
            s.name == m::AUTOSCALE_DECISIONS
                && s.label("job") == Some("watched")
                && s.label("reason") == Some("below_target")
        })
        .map(|s| s.value)
        .sum();
    assert!(grown >= 1.0, "no below_target decision counted");
    assert!(get(&second, m::SNAPSHOTS) >= 1.0, "snapshot {id} counted");
    assert!(get(&second, m::SNAPSHOT_BYTES) > 0.0);
    assert!(get(&second, &format!("{}_count", m::SNAPSHOT_SECONDS)) >= 1.0);
    assert!(get(&second, &format!("{}_sum", m::SNAPSHOT_SECONDS)) > 0.0);
    assert_eq!(get(&second, m::SNAPSHOT_FAILURES), 0.0);

    // 3. It finishes: the last scrape adds up.
    FINISH.store(true, Ordering::Release);
    let value_ = handle.wait().unwrap().finished().unwrap().into_value();
    assert_eq!(value_, n * (n - 1) / 2);
    let last = parse(&scrape(addr).unwrap()).unwrap();
    let phases = get(&last, m::PHASES);
    assert!(phases > get(&second, m::PHASES));
    assert_eq!(get(&last, &phase_count), phases, "one duration per phase");
    assert_eq!(get(&last, m::PHASE), phases - 1.0);
    assert_eq!(get(&last, m::ITERATIONS_DONE), phases * n as f64);
    assert_eq!(get(&last, m::PHASE_ITERATIONS_DONE), n as f64);
    assert_eq!(get(&last, m::WORKERS), 0.0, "every worker left");
    let _ = std::fs::remove_dir_all(&store);
}
