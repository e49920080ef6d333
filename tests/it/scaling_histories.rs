//! proptest: random sizes, chunkings, schedules, worker counts and scaling histories (grow,
//! shrink, down to inline and back) give the sequential fold bit for bit.

use crate::common;

use std::time::Duration;

use common::{Kernel, sequential};
use malleable::{Chunking, Executor, Guided, Schedule};
use proptest::prelude::*;

/// Sizes from empty to a few tens of thousands of iterations.
fn sizes() -> impl Strategy<Value = u64> {
    prop_oneof![Just(0u64), 1..100u64, 100..40_000u64]
}

/// Uniform chunkings only (the reference computes their boundaries).
fn chunkings() -> impl Strategy<Value = Chunking> {
    prop_oneof![
        (1..200u64).prop_map(Chunking::Count),
        (1..5_000u64).prop_map(Chunking::Size)
    ]
}

fn schedules() -> impl Strategy<Value = Schedule> {
    prop_oneof![Just(Schedule::Dynamic), Just(Schedule::Static)]
}

/// Worker counts, inline (0) included.
fn workers() -> impl Strategy<Value = usize> {
    0..5usize
}

/// A scaling history: (pause in µs, new local worker count).
fn histories() -> impl Strategy<Value = Vec<(u64, usize)>> {
    prop::collection::vec((0..1_500u64, workers()), 0..8)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn value_equals_the_sequential_fold_bit_for_bit(
        n in sizes(),
        chunking in chunkings(),
        schedule in schedules(),
        start in workers(),
        history in histories(),
        per_step in 1..64u64,
    ) {
        let mut job = Kernel::new(n, per_step);
        job.spin = 20;
        let expected = sequential(&job, chunking);
        let exec = Executor::builder().local_workers(start).schedule(schedule).chunking(chunking).build().unwrap();
        let handle = exec.submit(job).unwrap();
        let ctl = handle.clone();
        let scaler = std::thread::spawn(move || {
            for (pause, n) in history {
                std::thread::sleep(Duration::from_micros(pause));
                ctl.set_local_workers(n);
            }
        });
        let got = handle.wait().unwrap().finished().unwrap().value;
        scaler.join().unwrap();
        prop_assert_eq!(got.sum.to_bits(), expected.sum.to_bits());
        // Same step count: every handed-over chunk resumed from its live state.
        prop_assert_eq!(got, expected);
    }

    #[test]
    fn guided_is_deterministic_across_worker_counts(
        n in sizes(),
        gw in 1..8u32,
        min_chunk in 1..300u64,
        a in workers(),
        b in workers(),
    ) {
        let schedule = Schedule::Guided(Guided { workers: gw, min_chunk });
        let run = |w: usize| {
            let exec = Executor::builder().local_workers(w).schedule(schedule).build().unwrap();
            exec.run(Kernel::new(n, 7)).unwrap().into_value()
        };
        let (x, y) = (run(a), run(b));
        prop_assert_eq!(x.sum.to_bits(), y.sum.to_bits());
        prop_assert_eq!(x.iterations, n);
    }
}
