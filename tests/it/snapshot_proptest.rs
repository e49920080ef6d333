//! proptest: random snapshot and suspend points, restores with other worker counts (inline
//! included), several in a row: the value is bit-identical to the uninterrupted run.

use crate::common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::{Kernel, sequential};
use malleable::{At, Chunking, Executor, Outcome, Schedule};
use proptest::prelude::*;

#[derive(Debug, Clone, Copy)]
enum Op {
    /// Sleep this many µs, then take a snapshot (and remember it).
    Snapshot(u64),
    /// Sleep, then suspend and resume from the latest snapshot with this many workers.
    SuspendResume(u64, usize),
    /// Sleep, then resume a *second* copy from the last remembered snapshot with this many
    /// workers and check that it finishes with the right value too. The copy writes its
    /// snapshots to a store of its own: a job id is owned by one run at a time in a store
    /// (its lease), and a second run of it there is refused.
    Fork(u64, usize),
    /// Sleep, then change the local worker count.
    Scale(u64, usize),
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        3 => (0..3_000u64).prop_map(Op::Snapshot),
        3 => (0..3_000u64, 0..4usize).prop_map(|(t, w)| Op::SuspendResume(t, w)),
        1 => (0..3_000u64, 0..4usize).prop_map(|(t, w)| Op::Fork(t, w)),
        2 => (0..2_000u64, 0..4usize).prop_map(|(t, w)| Op::Scale(t, w)),
    ];
    prop::collection::vec(op, 1..6)
}

fn chunkings() -> impl Strategy<Value = Chunking> {
    prop_oneof![
        (1..64u64).prop_map(Chunking::Count),
        (50..3_000u64).prop_map(Chunking::Size)
    ]
}

static CASE: AtomicU64 = AtomicU64::new(0);

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn snapshots_and_restores_keep_the_value_bit_for_bit(
        n in 1..20_000u64,
        chunking in chunkings(),
        schedule in prop_oneof![Just(Schedule::Dynamic), Just(Schedule::Static)],
        start in 0..4usize,
        phases in 1..3u64,
        ops in ops(),
    ) {
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("snap-prop-{}-{}", std::process::id(), CASE.fetch_add(1, Ordering::Relaxed)));
        let _ = std::fs::remove_dir_all(&dir);
        let url = format!("file://{}", dir.display());
        let mut job = Kernel::new(n, 3);
        job.spin = 200;
        job.phases = phases;
        let mut last_phase = job.clone();
        last_phase.phase = phases - 1;
        let expected = sequential(&last_phase, chunking);
        let exec = |w: usize| Executor::builder().local_workers(w).schedule(schedule).chunking(chunking).snapshots(&url).keep_snapshots(64).build().unwrap();

        let mut handle = exec(start).submit(job).unwrap();
        let mut remembered = None;
        let mut forks = Vec::new();
        for op in ops {
            match op {
                Op::Snapshot(t) => {
                    std::thread::sleep(Duration::from_micros(t));
                    if let Ok(id) = handle.snapshot().wait() {
                        remembered = Some(id);
                    }
                }
                Op::SuspendResume(t, w) => {
                    std::thread::sleep(Duration::from_micros(t));
                    let suspended = handle.suspend().wait();
                    let waited = handle.clone().wait().unwrap();
                    match (suspended, waited) {
                        (Ok(id), Outcome::Suspended(id2)) => {
                            prop_assert_eq!(&id, &id2);
                            handle = exec(w).resume::<Kernel>(&url, At::Latest).unwrap();
                        }
                        // The job finished before the suspend took hold.
                        (Err(_), Outcome::Finished(f)) => {
                            prop_assert_eq!(f.value, expected);
                            return Ok(());
                        }
                        (s, o) => prop_assert!(false, "suspend {:?} but outcome {:?}", s, o.finished().map(|f| f.value)),
                    }
                }
                Op::Fork(t, w) => {
                    std::thread::sleep(Duration::from_micros(t));
                    if let Some(id) = &remembered {
                        let own = format!("file://{}", dir.join(format!("fork-{}", forks.len())).display());
                        let fork = Executor::builder().local_workers(w).schedule(schedule).chunking(chunking).snapshots(&own).build().unwrap();
                        forks.push(fork.resume::<Kernel>(&url, At::Epoch(id.epoch)).unwrap());
                    }
                }
                Op::Scale(t, w) => {
                    std::thread::sleep(Duration::from_micros(t));
                    handle.set_local_workers(w);
                }
            }
        }
        let fin = handle.wait().unwrap().finished().unwrap();
        prop_assert_eq!(fin.value.sum.to_bits(), expected.sum.to_bits());
        prop_assert_eq!(fin.value, expected);
        for f in forks {
            let v = f.wait().unwrap().finished().unwrap().value;
            prop_assert_eq!(v, expected);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
