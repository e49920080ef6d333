//! The executor reports through the `metrics` facade, in batches.

use malleable::reduce::Sum;
use malleable::{Chunking, Executor, Fold, Folded};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Count(u64);

impl Fold for Count {
    const NAME: &'static str = "count-job";
    type Acc = u64;
    type Reducer = Sum<u64>;
    type Input = ();
    fn iterations(&self) -> u64 {
        self.0
    }
    fn reducer(&self) -> Sum<u64> {
        Sum::new()
    }
    fn body(&self, _: &(), acc: &mut u64, _: u64) {
        *acc += 1;
    }
}

#[test]
fn chunks_steps_workers_and_step_times_are_reported() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().unwrap();
    let exec = Executor::builder()
        .local_workers(2)
        .chunking(Chunking::Count(32))
        .build()
        .unwrap();
    assert_eq!(
        exec.run(Folded(Count(100_000))).unwrap().into_value(),
        100_000
    );

    let mut chunks = None;
    let mut steps = None;
    let mut samples = 0;
    let mut gauge = false;
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        assert!(
            key.labels()
                .any(|l| l.key() == "job" && l.value() == "count-job"),
            "{key:?}"
        );
        match (key.name(), value) {
            (malleable::metrics::CHUNKS_DONE, DebugValue::Counter(c)) => chunks = Some(c),
            (malleable::metrics::STEPS, DebugValue::Counter(c)) => steps = Some(c),
            (malleable::metrics::STEP_SECONDS, DebugValue::Histogram(h)) => samples = h.len(),
            (malleable::metrics::WORKERS, DebugValue::Gauge(_)) => gauge = true,
            _ => {}
        }
    }
    assert_eq!(chunks, Some(32));
    let steps = steps.expect("steps counter");
    assert!(steps >= 32, "{steps}");
    assert!(
        samples > 0 && samples as u64 <= steps,
        "histogram samples are batched per bucket: {samples}"
    );
    assert!(gauge);
}
