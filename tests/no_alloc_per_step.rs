//! No allocation on the per-step path: a counting global allocator shows that a job with 100×
//! more steps (same chunks, same workers) allocates no more.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use malleable::reduce::Sum;
use malleable::{Chunk, Chunking, Executor, Job, Step};
use serde::{Deserialize, Serialize};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// This thread's allocations: a test of one thread's steps counts these, as threads of
    /// an executor another test dropped may still be winding down (and allocating).
    static MINE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

fn count() {
    ALLOCS.fetch_add(1, Ordering::Relaxed);
    // `try_with`: a thread being torn down still allocates.
    let _ = MINE.try_with(|m| m.set(m.get() + 1));
}

// SAFETY: forwards to the system allocator unchanged; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The count is the process's: the tests take turns.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[derive(Serialize, Deserialize)]
struct Steps {
    per_step: u64,
}

#[derive(Serialize, Deserialize)]
struct StepsChunk {
    next: u64,
    end: u64,
    acc: u64,
}

impl Job for Steps {
    const NAME: &'static str = "steps";
    type Chunk = StepsChunk;
    type Reducer = Sum<u64>;
    type Input = ();
    fn iterations(&self) -> u64 {
        400_000
    }
    fn chunk(&self, r: std::ops::Range<u64>) -> StepsChunk {
        StepsChunk {
            next: r.start,
            end: r.end,
            acc: 0,
        }
    }
    fn reducer(&self) -> Sum<u64> {
        Sum::new()
    }
}

impl Chunk for StepsChunk {
    type Job = Steps;
    type Output = u64;
    fn step(&mut self, job: &Steps, _: &()) -> Step<u64> {
        let stop = self.end.min(self.next + job.per_step);
        for i in self.next..stop {
            self.acc = self.acc.wrapping_add(i * i);
        }
        self.next = stop;
        if self.next == self.end {
            Step::Done(self.acc)
        } else {
            Step::Yield
        }
    }
    fn iterations_done(&self) -> Option<u64> {
        Some(self.next)
    }
}

fn allocations(per_step: u64) -> (u64, u64) {
    let exec = Executor::builder()
        .local_workers(2)
        .chunking(Chunking::Count(8))
        .build()
        .unwrap();
    let before = ALLOCS.load(Ordering::SeqCst);
    let v = exec.run(Steps { per_step }).unwrap().into_value();
    (ALLOCS.load(Ordering::SeqCst) - before, v)
}

#[test]
fn steps_do_not_allocate() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    allocations(1000); // warm up lazily initialized statics
    let (few, a) = allocations(1000); // 400 steps
    let (many, b) = allocations(10); // 40 000 steps
    assert_eq!(a, b);
    eprintln!("allocations: 400 steps {few}, 40 000 steps {many}");
    // Thread start-up and per-chunk messages allocate a little and not always exactly the same
    // amount; per-step allocation would add at least 39 600.
    assert!(
        many <= few + 64,
        "400 steps: {few} allocations; 40 000 steps: {many}"
    );
}

/// A grid of `Rows` whose steps are one row each (`target_step` of a nanosecond).
#[derive(Serialize, Deserialize)]
struct Grid;

impl malleable::Rows for Grid {
    const NAME: &'static str = "grid";
    type Element = u64;
    type Acc = u64;
    type Reducer = Sum<u64>;
    type Input = ();
    fn height(&self) -> u64 {
        2000
    }
    fn width(&self) -> usize {
        8
    }
    fn bands(&self) -> u64 {
        1
    }
    fn reducer(&self) -> Sum<u64> {
        Sum::new()
    }
    fn init(&self, _: &(), i: u64, row: &mut [u64]) {
        row.fill(i);
    }
    fn update(&self, _: &(), _: u64, win: malleable::rows::Window<'_, u64>, acc: &mut u64) {
        for (x, o) in win.row.iter_mut().zip(win.old) {
            *x = o + win.above.map_or(0, |a| a[0]) + win.below.map_or(0, |b| b[0]);
            *acc = acc.wrapping_add(*x);
        }
    }
    fn target_step(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(1)
    }
}

/// A band's step (a row here) allocates nothing once the band is made: a band used to name
/// itself in a new `String` at every step, for an error it reports only when it does not fit
/// its grid.
#[test]
fn a_band_s_steps_do_not_allocate() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let job = malleable::Banded(Grid);
    let input = malleable::rows::BandedInput(());
    let mut band = job.chunk(0..2000);
    // The first step makes the band's rows.
    assert!(matches!(band.step(&job, &input), Step::Yield));
    // This thread's count: the other test's executor may still have threads winding down.
    let before = MINE.with(|m| m.get());
    let mut steps = 1;
    while let Step::Yield = band.step(&job, &input) {
        steps += 1;
    }
    let allocated = MINE.with(|m| m.get()) - before;
    assert!(steps >= 1000, "{steps} steps: the batch did not stay small");
    assert_eq!(allocated, 0, "{steps} steps allocated {allocated} times");
}
