//! Metric names, all in one place.
//!
//! The executor reports through the [`metrics`] facade; install any recorder (Prometheus,
//! statsd, …) to collect them. Every metric carries the label `job` (the job's
//! [`Job::NAME`](crate::Job::NAME)). Workers batch their updates: counters and the step-time
//! histogram are written when a chunk ends or is handed back, never per step or per iteration.
//!
//! | name | kind | unit | what |
//! | --- | --- | --- | --- |
//! | `malleable_chunks_done_total` | counter | chunks | chunks finished |
//! | `malleable_steps_total` | counter | steps | `Chunk::step` calls |
//! | `malleable_handoffs_total` | counter | chunks | chunks handed back at an adjustment point |
//! | `malleable_step_seconds` | histogram | seconds | duration of one step (log₂ buckets: each sample is its bucket's lower bound) |
//! | `malleable_workers` | gauge | workers | local workers of the job (threads, or 1 when inline) |
//! | `malleable_phases_total` | counter | phases | phases finished |
//! | `malleable_snapshot_pause_seconds` | histogram | seconds | a worker's pause to capture its chunk for a snapshot (serialize + hand over) |
//! | `malleable_remote_workers` | gauge | connections | worker processes connected to a job (label `job`) |
//! | `malleable_peer_errors_total` | counter | peers | refused handshakes and lost worker connections (label `kind`) |
//! | `malleable_partitions_moved_total` | counter | partitions | owned partitions handed to a worker other than the one that held them |
//! | `malleable_rollbacks_total` | counter | rollbacks | owned partitions lost with a worker process: the job went back to its latest committed snapshot |
//! | `malleable_shutdown_abandoned_total` | counter | connections, writes | what an executor's shutdown or a job's end gave up waiting for (label `kind`: `connection`, `snapshot_write`; no `job` label) |
//! | `malleable_snapshot_failures_total` | counter | snapshots | snapshots that failed (asked for, periodic or a suspend's), whatever the cause; each is also logged and kept on the handle ([`JobHandle::last_snapshot_error`](crate::JobHandle::last_snapshot_error)) |
//! | `malleable_autoscale_decisions_total` | counter | decisions | decisions of the autoscaler ([`Builder::autoscale`](crate::Builder::autoscale)) carried out (label `reason`: [`Reason::name`](crate::schedule::Reason::name)) |

use std::time::Duration;

use metrics::{Counter, Histogram};

/// Chunks finished.
pub const CHUNKS_DONE: &str = "malleable_chunks_done_total";
/// `Chunk::step` calls.
pub const STEPS: &str = "malleable_steps_total";
/// Chunks handed back at an adjustment point (retire, cancel).
pub const HANDOFFS: &str = "malleable_handoffs_total";
/// Duration of one step, in seconds.
pub const STEP_SECONDS: &str = "malleable_step_seconds";
/// Local workers of a job.
pub const WORKERS: &str = "malleable_workers";
/// Phases finished.
pub const PHASES: &str = "malleable_phases_total";
/// A worker's pause to capture its chunk for a snapshot, in seconds.
pub const SNAPSHOT_PAUSE: &str = "malleable_snapshot_pause_seconds";
/// Worker processes connected to a job.
pub const REMOTE_WORKERS: &str = "malleable_remote_workers";
/// Refused handshakes and lost worker connections, by kind of error.
pub const PEER_ERRORS: &str = "malleable_peer_errors_total";
/// Owned partitions handed to a worker other than the one that held them.
pub const PARTITIONS_MOVED: &str = "malleable_partitions_moved_total";
/// Rollbacks to the latest committed snapshot after owned partitions were lost.
pub const ROLLBACKS: &str = "malleable_rollbacks_total";
/// What a graceful shutdown gave up waiting for, by kind (`connection`: a worker process not
/// yet sent its `End`; `snapshot_write`: a write in flight).
pub const SHUTDOWN_ABANDONED: &str = "malleable_shutdown_abandoned_total";
/// Snapshots that failed, whoever asked for them.
pub const SNAPSHOT_FAILURES: &str = "malleable_snapshot_failures_total";
/// Decisions of the autoscaler carried out, by reason.
pub const AUTOSCALE_DECISIONS: &str = "malleable_autoscale_decisions_total";

/// A worker's batch of step measurements: a log₂ histogram of step nanoseconds and counts,
/// flushed to the recorder when a chunk ends.
#[derive(Debug)]
pub(crate) struct StepStats {
    buckets: [u32; 64],
    steps: u64,
    busy: Duration,
    steps_counter: Counter,
    chunks_counter: Counter,
    handoffs_counter: Counter,
    histogram: Histogram,
    pause: Histogram,
    /// Size of this worker's last snapshot capture, to size the next one's buffer.
    pub(crate) capture_hint: usize,
}

impl StepStats {
    pub(crate) fn new(job: &'static str) -> StepStats {
        StepStats {
            buckets: [0; 64],
            steps: 0,
            busy: Duration::ZERO,
            steps_counter: metrics::counter!(STEPS, "job" => job),
            chunks_counter: metrics::counter!(CHUNKS_DONE, "job" => job),
            handoffs_counter: metrics::counter!(HANDOFFS, "job" => job),
            histogram: metrics::histogram!(STEP_SECONDS, "job" => job),
            pause: metrics::histogram!(SNAPSHOT_PAUSE, "job" => job),
            capture_hint: 0,
        }
    }

    /// Records one step; no allocation, no atomic.
    #[inline]
    pub(crate) fn record(&mut self, d: Duration) {
        let nanos = d.as_nanos() as u64;
        self.buckets[(64 - nanos.leading_zeros()) as usize & 63] += 1;
        self.steps += 1;
        self.busy += d;
    }

    /// Records a snapshot capture pause (rare: once per chunk per snapshot).
    pub(crate) fn record_pause(&mut self, d: Duration) {
        self.pause.record(d.as_secs_f64());
    }

    /// Time spent in steps since the last flush.
    pub(crate) fn busy(&self) -> Duration {
        self.busy
    }

    /// Sends the batch to the recorder; `done` tells whether the chunk finished or was handed back.
    pub(crate) fn flush(&mut self, done: bool) {
        self.steps_counter.increment(self.steps);
        if done {
            self.chunks_counter.increment(1);
        } else {
            self.handoffs_counter.increment(1);
        }
        for (i, n) in self.buckets.iter_mut().enumerate() {
            if *n > 0 {
                let lower = if i == 0 {
                    0.0
                } else {
                    (1u64 << (i - 1)) as f64 * 1e-9
                };
                self.histogram.record_many(lower, *n as usize);
                *n = 0;
            }
        }
        self.steps = 0;
        self.busy = Duration::ZERO;
    }
}
