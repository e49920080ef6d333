//! Autoscaling, the executor's side: once per period the job's timer task (`triggers.rs`)
//! measures the job, asks its [`Decider`] and carries out the decision with the job's own
//! scaling paths ([`JobHandle::set_local_workers`](crate::JobHandle::set_local_workers),
//! [`JobHandle::scale_remote`](crate::JobHandle::scale_remote)), logging it with its reason
//! and counting it ([`AUTOSCALE_DECISIONS`](crate::metrics::AUTOSCALE_DECISIONS)).
//!
//! The decider itself is pure (`schedule/decide.rs`); this file only measures and applies.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::job_run::Shared;
use super::members::Member;
use crate::job::Job;
use crate::schedule::{Autoscale, Decider, Decision, Goal, Kind, Measurement, Waiting};

impl Autoscale {
    /// Reach `per_second` iterations per second with the fewest workers: between 1 and the
    /// available parallelism local threads, no worker process (change with
    /// [`Autoscale::local`] and [`Autoscale::remote`]).
    ///
    /// With the other defaults (a measurement every 500 ms, a cool-down of 3 s after the
    /// start and after each change, a window of 10 measurements) the first decision can come
    /// about 8.5 s after the job starts; until then, and whenever it decides nothing,
    /// [`JobHandle::autoscale`](crate::JobHandle::autoscale) says why
    /// ([`AutoscaleStatus::waiting`]).
    pub fn throughput(per_second: f64) -> Autoscale {
        Autoscale::with_goal(Goal::Throughput(per_second), parallelism())
    }

    /// Finish within `time` of the job's start (its submit or its resume) with the fewest
    /// worker-seconds; bounds as [`Autoscale::throughput`]. A job of several phases says how
    /// many with [`Job::phases`](crate::Job::phases) or [`Autoscale::phases`].
    pub fn finish_within(time: Duration) -> Autoscale {
        Autoscale::with_goal(Goal::FinishWithin(time), parallelism())
    }
}

fn parallelism() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// What a job's autoscaler has decided and learned, from
/// [`JobHandle::autoscale`](crate::JobHandle::autoscale).
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct AutoscaleStatus {
    /// Decisions taken in this run of the job.
    pub decisions: u64,
    /// The last one, with its reason.
    pub last: Option<Decision>,
    /// The measured delay from asking for a worker process to its joining (the configured
    /// [`Costs::remote_join`](crate::schedule::Costs::remote_join) until one joined).
    pub join_delay: Duration,
    /// Bytes of owned partitions that moved per worker process added or removed: measured
    /// (the configured [`Costs::move_bytes`](crate::schedule::Costs::move_bytes) until a
    /// change of worker processes was measured). Partitions moving between the local
    /// threads of this process are not copied and cost no bytes.
    pub move_bytes: u64,
    /// Bytes per second partitions arrived from worker processes at (the configured
    /// [`Costs::bandwidth`](crate::schedule::Costs::bandwidth) until one arrived).
    pub bandwidth: f64,
    /// Why the last measurement took no decision: what the autoscaler waits for (the
    /// cool-down, the window of measurements filling, its goal reached, its bounds, …), also
    /// logged at debug level at every measurement. `None` when the last measurement took a
    /// decision (then `last` is it).
    pub waiting: Option<Waiting>,
}

/// The decider of one job run and the buffers its measurements are built in.
#[derive(Debug)]
pub(crate) struct Scaler {
    decider: Decider,
    local_rates: Vec<f64>,
    remote_rates: Vec<f64>,
    per_conn: HashMap<crate::schedule::ProcessId, f64>,
}

impl Scaler {
    pub(crate) fn new(policy: Autoscale) -> Scaler {
        Scaler {
            decider: Decider::new(policy),
            local_rates: Vec::new(),
            remote_rates: Vec::new(),
            per_conn: HashMap::new(),
        }
    }

    /// Measures the job, asks the decider, and carries out its decision. Returns false once
    /// the job has ended.
    pub(crate) fn tick<J: Job>(&mut self, shared: &Arc<Shared<J>>) -> bool {
        let policy = *self.decider.policy();
        let (done, left, local, remote) = {
            let mut st = shared.lock();
            if st.ended {
                return false;
            }
            self.local_rates.clear();
            self.per_conn.clear();
            for (w, rate) in st.core.throughputs() {
                match st.members.get(w) {
                    Some(Member::Local(l)) if !l.retiring => self.local_rates.push(rate),
                    Some(Member::Remote(slot)) => {
                        *self.per_conn.entry(slot.conn).or_default() += rate;
                    }
                    _ => {}
                }
            }
            // A process's rate is its slots' rates summed: each slot is measured over the time
            // its chunk spent on the thread, its wait behind the other slots included (see
            // `SLOTS_PER_THREAD`).
            self.remote_rates.clear();
            self.remote_rates.extend(self.per_conn.values().copied());
            // What moved since the last look: the cost of the last change.
            let (bytes, took) = std::mem::take(&mut st.remote.fetched);
            self.decider.moved(bytes, took);
            self.decider
                .moved(std::mem::take(&mut st.remote.sent), Duration::ZERO);
            let progress = st.progress();
            // The work left: the current phase's and, when the job says how many phases it
            // runs, the later ones' (each as large). Without a count, a deadline takes the
            // current phase as the last (as `Autoscale::phases` documents); a throughput
            // goal takes the work left as unknown, so that the job is not judged about to
            // end at every phase's tail (which would stop every grow that takes a join).
            let now_left = progress.total - progress.done;
            let left = match (policy.phases.or(progress.phases), policy.goal) {
                (Some(n), _) => {
                    Some(now_left + n.saturating_sub(progress.phase + 1) * progress.total)
                }
                (None, Goal::FinishWithin(_)) => Some(now_left),
                (None, _) => None,
            };
            (
                progress.done_all_phases,
                left,
                st.members.target,
                st.remote_count(),
            )
        };
        let m = Measurement {
            now: shared.started.elapsed(),
            done,
            left,
            local,
            remote,
            local_rates: &self.local_rates,
            remote_rates: &self.remote_rates,
        };
        let decision = self.decider.observe(&m);
        let mut st = shared.lock();
        let last = decision.or(st.autoscale.and_then(|a| a.last));
        st.autoscale = Some(AutoscaleStatus {
            decisions: self.decider.decisions(),
            last,
            join_delay: self.decider.join_delay(),
            move_bytes: self.decider.move_bytes(Kind::Remote),
            bandwidth: self.decider.bandwidth(),
            waiting: self.decider.waiting(),
        });
        drop(st);
        if let Some(w) = self.decider.waiting() {
            tracing::debug!(
                job = J::NAME,
                decisions = self.decider.decisions(),
                waiting = %w,
                "autoscale: no decision"
            );
        }
        if let Some(d) = decision {
            apply(shared, &d);
        }
        true
    }
}

/// Carries out a decision, logs it with its reason and counts it.
fn apply<J: Job>(shared: &Arc<Shared<J>>, d: &Decision) {
    tracing::info!(job = J::NAME, decision = %d, "autoscale");
    let reason = d.reason.name();
    metrics::counter!(crate::metrics::AUTOSCALE_DECISIONS, "job" => J::NAME, "reason" => reason)
        .increment(1);
    shared.lock().watch_decision(d);
    if d.local != d.from_local {
        shared.lock().set_target(d.local);
    }
    if d.remote != d.from_remote {
        if let Err(e) = super::connection::scale_remote(shared, d.remote) {
            tracing::warn!(job = J::NAME, error = %e, "autoscale: worker processes not started");
        }
    }
}
