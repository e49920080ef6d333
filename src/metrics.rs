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
//! | `malleable_snapshot_pause_seconds` | histogram | seconds | how long a snapshot held workers back: a worker's pause to capture its running chunk (serialize + hand over; label `job` only); the marker's hold of the job's lock while it serializes the states waiting in the ledger (label `at` = `marker`: every worker that needs the lock meanwhile waits, at a barrier all of them); an owned partition that ended before its capture, serialized under the lock (label `at` = `done`) |
//! | `malleable_remote_workers` | gauge | connections | worker processes connected to a job (label `job`) |
//! | `malleable_peer_errors_total` | counter | peers | refused handshakes and lost worker connections (label `kind`) |
//! | `malleable_partitions_moved_total` | counter | partitions | owned partitions handed to a worker other than the one that held them |
//! | `malleable_halos_total` | counter | halos | halos exported by owned partitions in worker processes, counted at each barrier (label `route`: `kept`, stayed in the process for a partition there; `relayed`, sent to the coordinator, for a partition elsewhere or whose place was not known) |
//! | `malleable_remote_messages_total` | counter | messages | messages between the coordinator and worker processes, a batch counting once: a phase costs one each way per process (label `direction`: `in`, `out`) |
//! | `malleable_stale_events_total` | counter | events | events from a worker the job's ledger no longer has (a thread or slot already lost, retired or left behind by a rollback), dropped: such a worker's news is late, not wrong |
//! | `malleable_rollbacks_total` | counter | rollbacks | owned partitions lost with a worker process: the job went back to its latest committed snapshot |
//! | `malleable_shutdown_abandoned_total` | counter | connections, writes | what an executor's shutdown or a job's end gave up waiting for (label `kind`: `connection`, `snapshot_write`; no `job` label) |
//! | `malleable_snapshot_failures_total` | counter | snapshots | snapshots that failed (asked for, periodic or a suspend's), whatever the cause; each is also logged and kept on the handle ([`JobHandle::last_snapshot_error`](crate::JobHandle::last_snapshot_error)) |
//! | `malleable_autoscale_decisions_total` | counter | decisions | decisions of the autoscaler ([`Builder::autoscale`](crate::Builder::autoscale)) carried out (label `reason`: [`Reason::name`](crate::schedule::Reason::name)) |
//! | `malleable_workers_draining` | gauge | workers | local threads and worker processes retiring (handing their chunks back) |
//! | `malleable_workers_joining` | gauge | processes | worker processes started by the launcher, not connected yet |
//! | `malleable_phase_seconds` | histogram | seconds | duration of a phase, from its start to its barrier |
//! | `malleable_phase` | gauge | phase | the current phase (0-based) |
//! | `malleable_phase_iterations_done` | gauge | iterations | iterations of the current phase in finished chunks |
//! | `malleable_phase_iterations` | gauge | iterations | iterations of the current phase |
//! | `malleable_iterations_done` | gauge | iterations | iterations in finished chunks since the job started, all phases (with those before a resume) |
//! | `malleable_snapshots_total` | counter | snapshots | snapshots committed |
//! | `malleable_snapshot_seconds` | histogram | seconds | a committed snapshot, from its marker to its commit |
//! | `malleable_snapshot_bytes_total` | counter | bytes | bytes written for committed snapshots: their manifests and new parts (parts reused from an earlier snapshot are not counted) |
//! | `malleable_snapshot_remote_parts_total` | counter | parts | snapshot parts received from worker processes (label `part`: `running`, a running chunk's state, or `held`, a partition the process holds; label `written_by`: `worker`, written to the store by the process and received as a reference, or `coordinator`, received as bytes for the coordinator to write) |
//! | `malleable_snapshot_removal_failures_total` | counter | removals | a finished job's snapshots that could not be removed ([`Builder::remove_snapshots_when_finished`](crate::Builder::remove_snapshots_when_finished)) |
//! | `malleable_drains_overrun_total` | counter | processes | worker processes still connected at the end of their drain's grace period, let go ([`JobHandle::drain_remote`](crate::JobHandle::drain_remote)) |
//! | `malleable_peer_links_total` | counter | links | links between worker processes that send each other halos (protocol 20), in the process at either end (label `event`: `up`, a handshake completed; `down`, a link ended by itself: closed by the other side, silent for a lease, or a frame that broke the protocol; `refused`, a handshake that failed, or a dial that did not connect; label `direction`: `dialled`, `accepted`; no `job` label) |
//! | `malleable_timeline_errors_total` | counter | records | timeline records lost (label `kind`: `dropped`, the writer's queue was full; `write`, a write or flush failed; no `job` label) |
//!
//! Membership, progress and phase metrics are updated when something changes at the
//! coordinator (a chunk ends, a worker joins or leaves, a phase ends), under the job's lock
//! it already holds, through handles made once per job run: no lock and no allocation of
//! their own, and nothing per step.

use std::time::Duration;

use metrics::{Counter, Gauge, Histogram};

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
/// How long a snapshot held workers back, in seconds: a worker's capture of its running
/// chunk, or the marker's hold of the job's lock while it serializes the states waiting in
/// the ledger.
pub const SNAPSHOT_PAUSE: &str = "malleable_snapshot_pause_seconds";
/// Worker processes connected to a job.
pub const REMOTE_WORKERS: &str = "malleable_remote_workers";
/// Refused handshakes and lost worker connections, by kind of error.
pub const PEER_ERRORS: &str = "malleable_peer_errors_total";
/// Owned partitions handed to a worker other than the one that held them.
pub const PARTITIONS_MOVED: &str = "malleable_partitions_moved_total";
/// Halos exported by partitions in worker processes (label `route`: `kept` in their
/// process, `relayed` through the coordinator, `direct` to the process of their partition).
pub const HALOS: &str = "malleable_halos_total";
/// Messages between the coordinator and worker processes, a batch counting once (label
/// `direction`: `in`, from the processes; `out`, to them).
pub const REMOTE_MESSAGES: &str = "malleable_remote_messages_total";
/// Times a worker process could not reach a peer of the data plane (or lost its link to
/// it): its halos for that peer go through the coordinator for a while (2 phases, doubling
/// with each failure up to 64), then it is offered again.
pub const PEERS_UNREACHABLE: &str = "malleable_peers_unreachable_total";
/// Rollbacks to the latest committed snapshot after owned partitions were lost.
pub const ROLLBACKS: &str = "malleable_rollbacks_total";
/// Events from a worker that the job's ledger no longer has, dropped.
pub const STALE_EVENTS: &str = "malleable_stale_events_total";
/// What a graceful shutdown gave up waiting for, by kind (`connection`: a worker process not
/// yet sent its `End`; `snapshot_write`: a write in flight).
pub const SHUTDOWN_ABANDONED: &str = "malleable_shutdown_abandoned_total";
/// Removals of a finished job's snapshots
/// ([`Builder::remove_snapshots_when_finished`](crate::Builder::remove_snapshots_when_finished))
/// that failed or were given up.
pub const SNAPSHOT_REMOVAL_FAILURES: &str = "malleable_snapshot_removal_failures_total";
/// Worker processes still connected at the end of their drain's grace period, let go
/// ([`JobHandle::drain_remote`](crate::JobHandle::drain_remote)).
pub const DRAINS_OVERRUN: &str = "malleable_drains_overrun_total";
/// Decisions of the autoscaler carried out, by reason.
pub const AUTOSCALE_DECISIONS: &str = "malleable_autoscale_decisions_total";

/// Local threads and worker processes retiring.
pub const WORKERS_DRAINING: &str = "malleable_workers_draining";
/// Worker processes started by the launcher, not connected yet.
pub const WORKERS_JOINING: &str = "malleable_workers_joining";
/// Duration of a phase, in seconds.
pub const PHASE_SECONDS: &str = "malleable_phase_seconds";
/// The current phase.
pub const PHASE: &str = "malleable_phase";
/// Iterations of the current phase in finished chunks.
pub const PHASE_ITERATIONS_DONE: &str = "malleable_phase_iterations_done";
/// Iterations of the current phase.
pub const PHASE_ITERATIONS: &str = "malleable_phase_iterations";
/// Iterations in finished chunks since the job started, all phases.
pub const ITERATIONS_DONE: &str = "malleable_iterations_done";
/// Snapshots committed.
pub const SNAPSHOTS: &str = "malleable_snapshots_total";
/// A committed snapshot's duration, marker to commit, in seconds.
pub const SNAPSHOT_SECONDS: &str = "malleable_snapshot_seconds";
/// Bytes written for committed snapshots (manifests and new parts).
pub const SNAPSHOT_BYTES: &str = "malleable_snapshot_bytes_total";
/// Snapshot parts received from worker processes, by what they are of (`part`: `running`,
/// `held`) and who writes them (`written_by`: `worker`, `coordinator`).
pub const REMOTE_PARTS: &str = "malleable_snapshot_remote_parts_total";
/// Snapshots that failed.
pub const SNAPSHOT_FAILURES: &str = "malleable_snapshot_failures_total";
/// Links between worker processes that send each other halos, by event (`up`, `down`,
/// `refused`) and direction (`dialled`, `accepted`).
pub const PEER_LINKS: &str = "malleable_peer_links_total";
/// Buddy copies of owned partitions made in worker processes' memory, by outcome (`kept` by
/// the buddy, `refused`: not kept, or no buddy).
pub const BUDDY_COPIES: &str = "malleable_buddy_copies_total";
/// The bytes of the buddy copies worker processes keep now.
pub const BUDDY_COPY_BYTES: &str = "malleable_buddy_copy_bytes";
/// Local recoveries: partitions lost with a worker process replayed from their buddy copies
/// while the others went on (no rollback).
pub const RECOVERIES: &str = "malleable_recoveries_total";
/// Timeline records lost, by kind (`dropped`, `write`).
pub const TIMELINE_ERRORS: &str = "malleable_timeline_errors_total";

/// The handles of one job run's coordinator-side metrics, made once (registering a handle
/// allocates; updating one does not).
#[derive(Debug)]
pub(crate) struct JobMetrics {
    pub(crate) draining: Gauge,
    pub(crate) joining: Gauge,
    pub(crate) phase_seconds: Histogram,
    pub(crate) phase: Gauge,
    pub(crate) phase_done: Gauge,
    pub(crate) phase_total: Gauge,
    pub(crate) done: Gauge,
    pub(crate) snapshots: Counter,
    pub(crate) snapshot_seconds: Histogram,
    pub(crate) snapshot_bytes: Counter,
    /// The marker's hold of the job's lock ([`SNAPSHOT_PAUSE`], label `at` = `marker`).
    pub(crate) snapshot_pause: Histogram,
    /// A partition that ended before its capture, serialized under the job's lock
    /// ([`SNAPSHOT_PAUSE`], label `at` = `done`).
    pub(crate) snapshot_pause_done: Histogram,
    /// Registered with the others, so that a scrape shows 0 before any failure.
    pub(crate) snapshot_failures: Counter,
}

impl JobMetrics {
    pub(crate) fn new(job: &'static str) -> JobMetrics {
        JobMetrics {
            draining: metrics::gauge!(WORKERS_DRAINING, "job" => job),
            joining: metrics::gauge!(WORKERS_JOINING, "job" => job),
            phase_seconds: metrics::histogram!(PHASE_SECONDS, "job" => job),
            phase: metrics::gauge!(PHASE, "job" => job),
            phase_done: metrics::gauge!(PHASE_ITERATIONS_DONE, "job" => job),
            phase_total: metrics::gauge!(PHASE_ITERATIONS, "job" => job),
            done: metrics::gauge!(ITERATIONS_DONE, "job" => job),
            snapshots: metrics::counter!(SNAPSHOTS, "job" => job),
            snapshot_seconds: metrics::histogram!(SNAPSHOT_SECONDS, "job" => job),
            snapshot_bytes: metrics::counter!(SNAPSHOT_BYTES, "job" => job),
            snapshot_pause: metrics::histogram!(SNAPSHOT_PAUSE, "job" => job, "at" => "marker"),
            snapshot_pause_done: metrics::histogram!(SNAPSHOT_PAUSE, "job" => job, "at" => "done"),
            snapshot_failures: metrics::counter!(SNAPSHOT_FAILURES, "job" => job),
        }
    }
}

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
