//! The sans-IO core driven by simulated workers: chunk events per second on one core, and
//! memory per pending chunk.
//!
//! `cargo bench --bench core_events` prints, for the dynamic and static schedules, a run of
//! 10 000 workers over 10 000 000 chunks (every chunk handed out and completed: one `Done`
//! event each, answered by the core with the worker's next `Run`), then criterion measures a
//! 1 000 000-chunk run. `-- --quick-table` prints the table alone.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use malleable::reduce::Sum;
use malleable::schedule::{Command, Core, Event, Plan, Work};
use malleable::{Chunking, Schedule};

/// Counts live heap bytes, to measure what the core holds per pending chunk.
struct Live;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts bytes.
unsafe impl GlobalAlloc for Live {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Live = Live;

struct Run {
    /// `Done` events, each answered with the worker's next `Run`.
    events: u64,
    /// Joins plus the phase start (the static deal).
    setup: Duration,
    elapsed: Duration,
    bytes_per_pending: f64,
}

/// Joins `workers` between phases, starts a phase of `chunks` chunks (the static schedule
/// deals them once), then completes every chunk, always answering the oldest outstanding run.
fn drive(schedule: Schedule, workers: u64, chunks: u64) -> Run {
    let before = LIVE.load(Ordering::Relaxed);
    let empty = Plan::new(0, schedule, Chunking::Size(1));
    let mut core: Core<Sum<u64>, ()> = Core::new(schedule, empty, Sum::new());
    let mut out = Vec::with_capacity(16);
    let mut running = std::collections::VecDeque::with_capacity(workers as usize);
    let t0 = Instant::now();
    for w in 0..workers {
        core.handle(Event::Joined { worker: w }, &mut out).unwrap();
    }
    assert!(out.is_empty() && core.phase_complete());
    core.finish_phase();
    core.start_phase(
        Plan::new(chunks, schedule, Chunking::Size(1)),
        Sum::new(),
        &mut out,
    );
    for c in out.drain(..) {
        if let Command::Run { worker, chunk, .. } = c {
            running.push_back((worker, chunk));
        }
    }
    let setup = t0.elapsed();
    let t0 = Instant::now();
    // Everything is dealt or on the pile now: the core's memory for ~`chunks` pending chunks.
    let held = LIVE.load(Ordering::Relaxed) - before;
    let pending = chunks - running.len() as u64;
    let mut events = 0;
    let work = Work {
        iterations: 1,
        busy: Duration::from_micros(1),
    };
    while let Some((worker, chunk)) = running.pop_front() {
        core.handle(
            Event::Done {
                kept: None,
                worker,
                chunk,
                output: 1,
                work,
            },
            &mut out,
        )
        .unwrap();
        events += 1;
        for c in out.drain(..) {
            if let Command::Run { worker, chunk, .. } = c {
                running.push_back((worker, chunk));
            }
        }
    }
    let elapsed = t0.elapsed();
    assert!(core.phase_complete());
    assert_eq!(black_box(core.finish_phase()), chunks);
    Run {
        events,
        elapsed,
        setup,
        bytes_per_pending: held as f64 / pending.max(1) as f64,
    }
}

fn table() {
    println!("core_events: 10 000 workers, 10 000 000 chunks, one core");
    println!(
        "{:<10} {:>10} {:>12} {:>14} {:>20}",
        "schedule", "setup", "Done events", "events/s", "bytes/pending chunk"
    );
    for (name, schedule) in [("dynamic", Schedule::Dynamic), ("static", Schedule::Static)] {
        let r = drive(schedule, 10_000, 10_000_000);
        println!(
            "{:<10} {:>10.1?} {:>12} {:>14.0} {:>20.2}",
            name,
            r.setup,
            r.events,
            r.events as f64 / r.elapsed.as_secs_f64(),
            r.bytes_per_pending
        );
    }
}

fn main() {
    table();
    if std::env::args().any(|a| a == "--quick-table") {
        return;
    }
    let mut c = Criterion::default().configure_from_args().sample_size(10);
    let mut g = c.benchmark_group("core_events");
    g.throughput(Throughput::Elements(1_000_000));
    g.bench_function("dynamic_1k_workers_1M_chunks", |b| {
        b.iter(|| drive(Schedule::Dynamic, 1_000, 1_000_000).events)
    });
    g.bench_function("static_1k_workers_1M_chunks", |b| {
        b.iter(|| drive(Schedule::Static, 1_000, 1_000_000).events)
    });
    g.finish();
    c.final_summary();
}
