//! Watching a job run: the coordinator-side metrics of `crate::metrics` (workers draining
//! and joining, phase times, progress, snapshots) and the records of its timeline
//! (`crate::timeline`), both fed at the same few places: a change of the workers or the
//! ledger (`settle`), a phase's barrier, a snapshot's commit or failure, a loss, an
//! autoscaling decision, a rollback, the end.
//!
//! Every hook runs under the job's lock, which its caller already holds, and costs a few
//! atomic updates of metric handles made once per run ([`JobMetrics`]) and, with a timeline,
//! one `try_send` to its writer thread (`timeline/sink.rs`): no lock, no I/O and no wait of
//! its own. Nothing here runs per step.

use std::sync::Arc;
use std::time::Duration;

use super::Outcome;
use super::job_run::State;
use super::snapshot::Part;
use crate::error::{Error, Result};
use crate::job::Job;
use crate::metrics::JobMetrics;
use crate::schedule::{ChunkId, Decision};
use crate::snapshot::{Manifest, SnapshotId};
use crate::timeline::{Ending, Event, Sink};

/// What a job run reports, and what it last reported.
pub(crate) struct Watch {
    pub(crate) metrics: JobMetrics,
    /// Whether the run has a timeline: its records go out as orders (`links::Order::Record`).
    recording: bool,
    /// When the current phase started (or the run, or its restart after a rollback).
    phase_started: Duration,
    /// The workers last recorded: local, remote, draining, joining.
    last: (usize, usize, usize, usize),
}

impl Watch {
    pub(crate) fn new(job: &'static str) -> Watch {
        Watch {
            metrics: JobMetrics::new(job),
            recording: false,
            phase_started: Duration::ZERO,
            last: (0, 0, 0, 0),
        }
    }
}

/// Opens the timeline of [`Builder::timeline`](crate::Builder::timeline).
pub(crate) fn open(path: &std::path::Path) -> Result<Arc<Sink>> {
    Sink::create(path)
        .map(Arc::new)
        .map_err(|source| Error::Timeline {
            path: path.to_owned(),
            source,
        })
}

/// Waits up to `timeout` until the timeline has written what it was sent.
pub(crate) fn flush(timeline: Option<&Sink>, timeout: Duration) {
    if let Some(sink) = timeline {
        if !sink.flush(timeout) {
            tracing::warn!("the timeline's writer did not catch up within {timeout:?}");
        }
    }
}

/// Bytes of the parts a snapshot writes (reused parts are already in the store).
pub(crate) fn new_bytes(parts: &[(ChunkId, Part)], kept: &[(ChunkId, Part)]) -> u64 {
    parts
        .iter()
        .chain(kept)
        .map(|(_, p)| match p {
            Part::New(b) => b.len() as u64,
            Part::Reuse(_) => 0,
        })
        .sum()
}

/// Bytes of a committed snapshot's manifest (encoded again, off the job's lock: once per
/// snapshot, on the writer's runtime).
pub(crate) fn manifest_bytes(written: &Result<SnapshotId>, manifest: &Manifest) -> u64 {
    match written {
        Ok(_) => crate::snapshot::format::encode_manifest(manifest).len() as u64,
        Err(_) => 0,
    }
}

impl<J: Job> State<J> {
    /// Queues a record for the timeline, if there is one, with the workers now.
    fn record(&mut self, event: Event) {
        if self.watch.recording {
            let (local, remote) = (self.members.local_count(), self.remote_count());
            self.orders
                .push(super::links::Order::Record(local, remote, event));
        }
    }

    /// The run starts (submitted or resumed): its timeline, and its first record.
    pub(crate) fn watch_start(&mut self) {
        self.watch.recording = self.config.timeline.is_some();
        self.watch.phase_started = self.now;
        // Only a resumed run starts knowing a committed epoch.
        self.record(Event::Start {
            phase: self.phase,
            iterations: self.core.progress().1,
            resumed_from: self.snap.last_epoch,
        });
        self.watch_members();
    }

    /// After any change (`settle`): the workers and the progress.
    pub(crate) fn watch_members(&mut self) {
        let local = self.members.local_count();
        let remote = self.remote_count();
        let retiring = self.members.locals().filter(|(_, l)| l.retiring).count();
        let (remote_retiring, joining) = self.remote.membership();
        let draining = retiring + remote_retiring;
        let m = &self.watch.metrics;
        let (done, total) = self.core.progress();
        m.phase.set(self.phase as f64);
        m.phase_done.set(done as f64);
        m.phase_total.set(total as f64);
        m.done.set((self.iterations_before + done) as f64);
        m.draining.set(draining as f64);
        m.joining.set(joining as f64);
        let now = (local, remote, draining, joining);
        // After the end the workers only leave: the gauges follow, the timeline has ended.
        if now != self.watch.last && !self.ended {
            self.watch.last = now;
            self.record(Event::Workers {
                draining: draining as u64,
                joining: joining as u64,
            });
        }
    }

    /// A phase reached its barrier.
    pub(crate) fn watch_phase_end(&mut self, phase: u64) {
        let seconds = (self.now.saturating_sub(self.watch.phase_started)).as_secs_f64();
        self.watch.phase_started = self.now;
        self.watch.metrics.phase_seconds.record(seconds);
        self.record(Event::PhaseEnd {
            phase,
            seconds,
            iterations: self.core.progress().1,
        });
    }

    /// A snapshot's write ended: committed, or failed.
    pub(crate) fn watch_snapshot(
        &mut self,
        written: &Result<SnapshotId>,
        took: Duration,
        bytes: u64,
        suspend: bool,
    ) {
        let m = &self.watch.metrics;
        let event = match written {
            Ok(id) => {
                m.snapshots.increment(1);
                m.snapshot_seconds.record(took.as_secs_f64());
                m.snapshot_bytes.increment(bytes);
                Event::Snapshot {
                    epoch: id.epoch,
                    seconds: took.as_secs_f64(),
                    bytes,
                    suspend,
                }
            }
            // Counted by `snapshot_failed` (`snapshot.rs`), with every other failure.
            Err(e) => Event::SnapshotFailed {
                seconds: Some(took.as_secs_f64()),
                error: chain(e),
            },
        };
        self.record(event);
    }

    /// A snapshot failed before its write (a state did not serialize, the job ended).
    pub(crate) fn watch_snapshot_failed(&mut self, error: &Error) {
        self.record(Event::SnapshotFailed {
            seconds: None,
            error: chain(error),
        });
    }

    /// A worker process was lost.
    pub(crate) fn watch_lost(&mut self, peer: &str) {
        self.record(Event::Lost {
            peer: peer.to_owned(),
        });
    }

    /// The autoscaler's decision, before it is carried out.
    pub(crate) fn watch_decision(&mut self, d: &Decision) {
        self.record(Event::Autoscale {
            from_local: d.from_local as u64,
            from_remote: d.from_remote as u64,
            to_local: d.local as u64,
            to_remote: d.remote as u64,
            reason: d.reason.name().to_owned(),
            detail: d.to_string(),
        });
    }

    /// Owned partitions were lost: a rollback to `epoch` starts.
    pub(crate) fn watch_rollback(&mut self, lost: &[ChunkId], epoch: u64) {
        self.record(Event::Rollback {
            lost: lost.to_vec(),
            from_phase: self.phase,
            epoch,
        });
    }

    /// A local recovery is done (the last of `recoveries`).
    pub(crate) fn watch_recovered(&mut self) {
        if let Some(r) = self.recoveries.last() {
            let event = Event::Recovered {
                lost: r.lost.clone(),
                phase: r.phase,
                copy_phase: r.copy_phase,
                buddy: r.buddy,
                seconds: r.took.as_secs_f64(),
            };
            self.record(event);
        }
    }

    /// A rollback is done (the last of `rollbacks`): the phase restarts now.
    pub(crate) fn watch_rolled_back(&mut self) {
        self.watch.phase_started = self.now;
        if let Some(rb) = self.rollbacks.last() {
            let event = Event::RolledBack {
                epoch: rb.epoch,
                to_phase: rb.to_phase,
                seconds: rb.restart.as_secs_f64(),
            };
            self.record(event);
        }
    }

    /// The run ends with `result`.
    pub(crate) fn watch_end(&mut self, result: &Result<Outcome<J>>) {
        let (outcome, epoch, error) = match result {
            Ok(Outcome::Finished(_)) => (Ending::Finished, None, None),
            Ok(Outcome::Suspended(id)) => (Ending::Suspended, Some(id.epoch), None),
            Err(e) => (Ending::Failed, None, Some(chain(e))),
        };
        if let Some(error) = &error {
            tracing::warn!(job = J::NAME, phase = self.phase, %error, "the job ends with an error");
        }
        self.record(Event::End {
            outcome,
            phase: self.phase,
            epoch,
            error,
        });
    }
}

/// An error and its causes on one line.
fn chain(e: &dyn std::error::Error) -> String {
    crate::error::chain_texts(e).join(": ")
}
