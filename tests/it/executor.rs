//! The local executor, through the public API: scaling, inline mode, panics, bad input,
//! async, cancel, progress and phases.

use crate::common;

use std::time::{Duration, Instant};

use common::{Kernel, sequential};
use malleable::reduce::{CollectInOrder, Sum};
use malleable::{
    BoxError, Chunk, Chunking, Error, Executor, Fold, Folded, Input, Job, Schedule, Site, Step,
};
use serde::{Deserialize, Serialize};

fn exec(workers: usize, chunking: Chunking) -> Executor {
    Executor::builder()
        .local_workers(workers)
        .chunking(chunking)
        .build()
        .unwrap()
}

#[test]
fn value_is_bitwise_the_sequential_fold_for_any_worker_count() {
    let chunking = Chunking::Size(777);
    let job = Kernel::new(50_000, 13);
    let expected = sequential(&job, chunking);
    for workers in [0, 1, 2, 3, 5] {
        let got = exec(workers, chunking)
            .run(job.clone())
            .unwrap()
            .into_value();
        assert_eq!(
            got.sum.to_bits(),
            expected.sum.to_bits(),
            "workers = {workers}"
        );
        assert_eq!(got, expected);
    }
}

#[test]
fn retired_workers_hand_over_live_state() {
    // Slow steps so that scaling happens mid-chunk; the step count proves that a chunk handed
    // back was resumed, not restarted (a restart would take extra steps).
    let chunking = Chunking::Count(4);
    let mut job = Kernel::new(4_000, 2);
    job.spin = 2_000;
    let expected = sequential(&job, chunking);
    let handle = exec(4, chunking).submit(job).unwrap();
    let ctl = handle.clone();
    let scaler = std::thread::spawn(move || {
        for n in [1, 3, 0, 2, 0, 4, 1] {
            std::thread::sleep(Duration::from_millis(3));
            ctl.set_local_workers(n);
        }
    });
    let got = handle.wait().unwrap().finished().unwrap().value;
    scaler.join().unwrap();
    assert_eq!(got, expected);
}

#[test]
fn every_schedule_covers_each_index_once() {
    #[derive(Serialize, Deserialize)]
    struct Indices(u64);
    impl Fold for Indices {
        const NAME: &'static str = "indices";
        type Acc = Vec<u64>;
        type Reducer = CollectInOrder<u64>;
        type Input = ();
        fn iterations(&self) -> u64 {
            self.0
        }
        fn reducer(&self) -> CollectInOrder<u64> {
            CollectInOrder::new()
        }
        fn body(&self, _: &(), acc: &mut Vec<u64>, i: u64) {
            acc.push(i);
        }
    }
    for schedule in [
        Schedule::Dynamic,
        Schedule::Static,
        Schedule::Guided(Default::default()),
    ] {
        for n in [0, 1, 999, 10_007] {
            let e = Executor::builder()
                .local_workers(3)
                .schedule(schedule)
                .chunking(Chunking::Size(64))
                .build()
                .unwrap();
            let v = e.run(Folded(Indices(n))).unwrap().into_value();
            assert_eq!(v, (0..n).collect::<Vec<_>>(), "{schedule:?} n={n}");
        }
    }
}

#[test]
fn zero_iterations_finish_at_once_with_the_identity() {
    for workers in [0, 2] {
        let v = exec(workers, Chunking::default())
            .run(Kernel::new(0, 1))
            .unwrap()
            .into_value();
        assert_eq!(v.iterations, 0);
        assert_eq!(v.sum, 0.0);
    }
}

#[test]
fn zero_chunking_is_refused_and_oversized_is_clamped() {
    let e = Executor::builder()
        .chunking(Chunking::Size(0))
        .build()
        .unwrap_err();
    assert!(matches!(e, Error::InvalidConfig(_)), "{e}");
    assert!(matches!(
        Executor::builder().chunking(Chunking::Count(0)).build(),
        Err(Error::InvalidConfig(_))
    ));
    let job = Kernel::new(100, 7);
    let v = exec(2, Chunking::Size(1 << 50))
        .run(job.clone())
        .unwrap()
        .into_value();
    assert_eq!(v, sequential(&job, Chunking::Size(100)));
}

#[test]
fn a_panicking_step_is_a_typed_error_and_other_jobs_go_on() {
    let e = exec(2, Chunking::Size(100));
    let mut bad = Kernel::new(10_000, 10);
    bad.panic_at = Some(5_555);
    let mut good = Kernel::new(200_000, 10);
    good.spin = 10;
    let good_handle = e.submit(good.clone()).unwrap();
    let err = e.run(bad).unwrap_err();
    match &err {
        Error::Panicked {
            job,
            site: Site::Chunk {
                phase: 0,
                chunk: 55,
            },
            message,
        } => {
            assert_eq!(*job, "test-kernel");
            assert!(message.contains("boom at 5555"), "{message}");
        }
        other => panic!("unexpected {other:?}"),
    }
    let v = good_handle.wait().unwrap().finished().unwrap().value;
    assert_eq!(v, sequential(&good, Chunking::Size(100)));
}

#[test]
fn a_panic_in_end_phase_or_reducer_or_input_is_a_typed_error() {
    #[derive(Serialize, Deserialize)]
    struct Bad {
        what: u8,
    }
    #[derive(Serialize, Deserialize)]
    struct BadChunk(u64);
    struct BadInput;
    impl Input<Bad> for BadInput {
        fn load(job: &Bad) -> Result<Self, BoxError> {
            if job.what == 2 {
                Err("no such file".into())
            } else {
                Ok(BadInput)
            }
        }
    }
    struct PanickyReducer;
    impl malleable::reduce::Reducer for PanickyReducer {
        type Value = u64;
        fn identity(&self) -> u64 {
            0
        }
        fn combine(&self, _: &mut u64, _: u64) {
            panic!("combine failed");
        }
    }
    impl Job for Bad {
        const NAME: &'static str = "bad";
        type Chunk = BadChunk;
        type Reducer = PanickyReducer;
        type Input = BadInput;
        fn iterations(&self) -> u64 {
            10
        }
        fn chunk(&self, r: std::ops::Range<u64>) -> BadChunk {
            BadChunk(r.start)
        }
        fn reducer(&self) -> PanickyReducer {
            PanickyReducer
        }
        fn end_phase(&mut self, _: &u64) -> malleable::Next {
            panic!("end_phase failed")
        }
    }
    impl Chunk for BadChunk {
        type Job = Bad;
        type Output = u64;
        fn step(&mut self, job: &Bad, _: &BadInput) -> Step<u64> {
            if job.what == 0 {
                Step::Done(0)
            } else {
                Step::Done(self.0)
            }
        }
    }
    // what = 0: combine is called (every chunk outputs 0, combine still runs) and panics.
    let err = exec(2, Chunking::Size(3)).run(Bad { what: 0 }).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Panicked {
                site: Site::Chunk { .. } | Site::Reducer { .. },
                ..
            }
        ),
        "{err:?}"
    );
    let err = exec(0, Chunking::Size(3)).run(Bad { what: 2 }).unwrap_err();
    assert!(matches!(&err, Error::Input { job: "bad", .. }), "{err:?}");
    assert!(
        std::error::Error::source(&err)
            .unwrap()
            .to_string()
            .contains("no such file")
    );
}

#[test]
fn end_phase_panic_is_a_typed_error() {
    #[derive(Serialize, Deserialize)]
    struct P;
    impl Fold for P {
        const NAME: &'static str = "p";
        type Acc = u64;
        type Reducer = Sum<u64>;
        type Input = ();
        fn iterations(&self) -> u64 {
            100
        }
        fn reducer(&self) -> Sum<u64> {
            Sum::new()
        }
        fn body(&self, _: &(), acc: &mut u64, i: u64) {
            *acc += i;
        }
        fn end_phase(&mut self, _: &u64) -> malleable::Next {
            panic!("end of phase exploded")
        }
    }
    let err = exec(1, Chunking::Size(10)).run(Folded(P)).unwrap_err();
    assert!(
        matches!(&err, Error::Panicked { site: Site::Job { phase: 0 }, message, .. } if message.contains("exploded")),
        "{err:?}"
    );
}

#[test]
fn phases_run_in_order_and_the_job_comes_back() {
    let chunking = Chunking::Size(500);
    let mut job = Kernel::new(20_000, 7);
    job.phases = 4;
    let handle = exec(2, chunking).submit(job.clone()).unwrap();
    let ctl = handle.clone();
    let t = std::thread::spawn(move || {
        for n in [0, 3, 1] {
            std::thread::sleep(Duration::from_millis(1));
            ctl.set_local_workers(n);
        }
    });
    let fin = handle.wait().unwrap().finished().unwrap();
    t.join().unwrap();
    assert_eq!(fin.job.history.len(), 4);
    for p in 0..4 {
        let mut at = job.clone();
        at.phase = p;
        assert_eq!(
            fin.job.history[p as usize].to_bits(),
            sequential(&at, chunking).sum.to_bits(),
            "phase {p}"
        );
    }
    assert_eq!(fin.value.iterations, 20_003);
}

#[test]
fn cancel_stops_the_job_with_a_typed_error() {
    let mut job = Kernel::new(u64::MAX / 2, 100);
    job.spin = 10;
    let handle = exec(2, Chunking::Count(64)).submit(job).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let t0 = Instant::now();
    handle.cancel();
    assert!(matches!(
        handle.wait(),
        Err(Error::Cancelled { job: "test-kernel" })
    ));
    assert!(t0.elapsed() < Duration::from_secs(2));
}

#[test]
fn progress_reports_advance_and_end_complete() {
    let mut job = Kernel::new(200_000, 50);
    job.spin = 50;
    let handle = exec(2, Chunking::Count(16)).submit(job).unwrap();
    let mut last = 0;
    let mut seen_partial = false;
    while !handle.is_finished() {
        let p = handle.progress();
        assert!(p.done <= p.total && p.total == 200_000, "{p:?}");
        assert!(p.done_all_phases >= last);
        last = p.done_all_phases;
        seen_partial |= p.done > 0 && p.done < p.total;
        std::thread::sleep(Duration::from_millis(2));
    }
    let p = handle.progress();
    assert_eq!((p.done, p.total), (200_000, 200_000));
    assert!(
        seen_partial,
        "progress was never seen between 0 and the total"
    );
    handle.wait().unwrap();
}

#[test]
fn async_await_does_not_block_a_current_thread_runtime() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let chunking = Chunking::Size(1000);
    let job = Kernel::new(100_000, 10);
    let expected = sequential(&job, chunking);
    for workers in [2, 0] {
        let handle = exec(workers, chunking).submit(job.clone()).unwrap();
        let ticks = rt.block_on(async {
            // A task that keeps ticking proves the runtime thread is free while the job runs.
            let ticker = tokio::spawn(async {
                let mut n = 0u32;
                loop {
                    tokio::time::sleep(Duration::from_micros(200)).await;
                    n += 1;
                    if n == 5 {
                        return n;
                    }
                }
            });
            let out = handle.await.unwrap().finished().unwrap();
            assert_eq!(out.value, expected);
            ticker.await.unwrap()
        });
        assert_eq!(ticks, 5);
    }
}

#[test]
fn two_executors_do_not_share_anything() {
    let a = exec(1, Chunking::Size(100));
    let b = exec(2, Chunking::Size(100));
    let ja = a.submit(Kernel::new(30_000, 5)).unwrap();
    let jb = b.submit(Kernel::new(30_000, 5)).unwrap();
    ja.set_local_workers(0);
    assert_eq!(jb.local_workers(), 2);
    let (va, vb) = (ja.wait().unwrap(), jb.wait().unwrap());
    assert_eq!(va.finished().unwrap().value, vb.finished().unwrap().value);
}

#[test]
fn a_second_wait_gets_outcome_taken() {
    let h = exec(1, Chunking::Size(10))
        .submit(Kernel::new(100, 3))
        .unwrap();
    let h2 = h.clone();
    h.wait().unwrap();
    let second = h2.wait();
    assert!(
        matches!(second, Err(Error::OutcomeTaken { .. })),
        "{:?}",
        second.map(|_| ())
    );
}

/// Names of this process's threads that belong to job `name`.
fn job_threads(name: &str) -> Vec<String> {
    let prefix = format!("malleable-{name}-");
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|c| c.trim().to_owned())
        .filter(|c| c.starts_with(&prefix))
        .collect()
}

#[test]
fn workers_exit_after_a_failure_or_cancel() {
    #[derive(Serialize, Deserialize)]
    struct Lk(bool);
    impl Fold for Lk {
        const NAME: &'static str = "lk";
        type Acc = u64;
        type Reducer = Sum<u64>;
        type Input = ();
        fn iterations(&self) -> u64 {
            1 << 40
        }
        fn reducer(&self) -> Sum<u64> {
            Sum::new()
        }
        fn body(&self, _: &(), acc: &mut u64, i: u64) {
            if self.0 && i == 1 << 20 {
                panic!("lk");
            }
            *acc += i;
        }
    }
    let e = exec(3, Chunking::Count(1 << 16));
    assert!(matches!(
        e.run(Folded(Lk(true))),
        Err(Error::Panicked { .. })
    ));
    let h = e.submit(Folded(Lk(false))).unwrap();
    std::thread::sleep(Duration::from_millis(10));
    h.cancel();
    assert!(matches!(h.wait(), Err(Error::Cancelled { .. })));
    let t0 = Instant::now();
    while !job_threads("lk").is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "threads left: {:?}",
            job_threads("lk")
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn going_inline_while_threads_run_makes_exactly_one_inline_worker() {
    let mut job = Kernel::new(2_000_000, 50);
    job.spin = 20;
    let handle = exec(2, Chunking::Count(256)).submit(job).unwrap();
    let waiter = {
        let h = handle.clone();
        std::thread::spawn(move || h.wait())
    };
    std::thread::sleep(Duration::from_millis(20));
    handle.set_local_workers(0);
    let t0 = Instant::now();
    // The two threads retire at their next adjustment point; then only the inline worker is left.
    while handle.progress().local_workers != 1 {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "{:?}",
            handle.progress()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    handle.set_local_workers(3);
    while handle.progress().local_workers != 3 && !handle.is_finished() {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "{:?}",
            handle.progress()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    handle.cancel();
    let _ = waiter.join().unwrap();
}

#[test]
fn progress_after_the_end_counts_each_iteration_once() {
    let mut job = Kernel::new(10_000, 10);
    job.phases = 3;
    let h = exec(2, Chunking::Size(100)).submit(job).unwrap();
    while !h.is_finished() {
        std::thread::sleep(Duration::from_millis(1));
    }
    let p = h.progress();
    assert_eq!(p.done_all_phases, 10_000 + 10_001 + 10_002, "{p:?}");
}

/// A writer of log lines into a buffer the test reads.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// Runs `f` with the warnings of this thread logged here.
    fn during<T>(&self, f: impl FnOnce() -> T) -> T {
        let me = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_writer(move || me.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, f)
    }
}

/// With zero local workers and nobody in `wait()`, a program that polls `is_finished()` in a
/// loop sees its job finish: polls that see no worker for a second give the job a helper
/// thread, with a warning. (The job used to run only inside `wait()`, so the loop never
/// ended: the loop runs on a thread and the test gives it a bounded time.)
#[test]
fn polling_a_job_with_zero_local_workers_finishes_it() {
    let chunking = Chunking::Count(16);
    let job = Kernel::new(20_000, 10);
    let expected = sequential(&job, chunking);
    let handle = exec(0, chunking).submit(job).unwrap();
    let log = Captured::default();
    let (done, finished) = std::sync::mpsc::channel();
    {
        let (h, log) = (handle.clone(), log.clone());
        std::thread::spawn(move || {
            log.during(|| {
                while !h.is_finished() {
                    std::thread::sleep(Duration::from_millis(5));
                }
            });
            let _ = done.send(());
        });
    }
    finished
        .recv_timeout(Duration::from_secs(60))
        .expect("polling is_finished() never saw the job finish: it ran only inside wait()");
    let got = handle.wait().unwrap().finished().unwrap().into_value();
    assert_eq!(got, expected);
    let text = log.text();
    assert!(
        text.contains("WARN") && text.contains("a helper thread now runs it inline"),
        "{text}"
    );
}

/// Which threads ran the body of [`Whose`].
static COMPUTED_ON: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Σ i over `0..n`, noting the thread that runs each iteration.
#[derive(Serialize, Deserialize)]
struct Whose {
    n: u64,
}

impl Fold for Whose {
    const NAME: &'static str = "whose";
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
        let name = std::thread::current().name().unwrap_or("?").to_owned();
        let mut on = COMPUTED_ON.lock().unwrap();
        if !on.contains(&name) {
            on.push(name);
        }
        *acc += i;
    }
}

/// A program that looks at its inline job and then waits for it computes it on its waiting
/// thread: the helper of polled jobs does not take the role from it.
#[test]
fn a_look_then_wait_computes_on_the_waiting_thread() {
    let handle = exec(0, Chunking::Count(8))
        .submit(malleable::Folded(Whose { n: 100_000 }))
        .unwrap();
    assert!(!handle.is_finished());
    assert_eq!(handle.progress().done, 0, "nothing runs it before wait()");
    let value = handle.wait().unwrap().finished().unwrap().into_value();
    assert_eq!(value, 100_000 * 99_999 / 2);
    let me = std::thread::current().name().unwrap().to_owned();
    assert_eq!(*COMPUTED_ON.lock().unwrap(), [me]);
}

/// On an executor that listens for worker processes, a polled job with no worker waits for
/// them (no helper thread), and a warning says why it makes no progress.
#[test]
fn a_polled_job_that_waits_for_worker_processes_is_warned_about() {
    let exec = Executor::builder()
        .local_workers(0)
        .listen("127.0.0.1:0")
        .build()
        .unwrap();
    let mut job = Kernel::new(10_000, 10);
    job.spin = 10;
    let handle = exec.submit(job).unwrap();
    let log = Captured::default();
    let t0 = Instant::now();
    log.during(|| {
        while !log
            .text()
            .contains("it makes no progress until worker processes connect")
        {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "no warning: {}",
                log.text()
            );
            assert!(!handle.is_finished());
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    assert!(t0.elapsed() >= Duration::from_secs(4), "warned at once");
    let p = handle.progress();
    assert_eq!((p.done, p.local_workers), (0, 0), "no helper thread: {p:?}");
    handle.cancel();
    assert!(matches!(handle.wait(), Err(Error::Cancelled { .. })));
}
