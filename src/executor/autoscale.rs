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
use crate::schedule::{Autoscale, Decider, Decision, Goal, Measurement};
use crate::wire::frame::SLOTS_PER_THREAD;

impl Autoscale {
    /// Reach `per_second` iterations per second with the fewest workers: between 1 and the
    /// available parallelism local threads, no worker process (change with
    /// [`Autoscale::local`] and [`Autoscale::remote`]).
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

/// The decider of one job run and the buffers its measurements are built in.
#[derive(Debug)]
pub(crate) struct Scaler {
    decider: Decider,
    local_rates: Vec<f64>,
    remote_rates: Vec<f64>,
    per_conn: HashMap<u64, f64>,
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
            // Two slots per thread alternate on one thread: a process's rate is its slots'
            // rates summed over the slots per thread.
            self.remote_rates.clear();
            self.remote_rates.extend(
                self.per_conn
                    .values()
                    .map(|r| r / f64::from(SLOTS_PER_THREAD)),
            );
            let progress = st.progress();
            let later = policy
                .phases
                .or(progress.phases)
                .map_or(0, |n| n.saturating_sub(progress.phase + 1));
            let left = (progress.total - progress.done) + later * progress.total;
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
            left: Some(left),
            local,
            remote,
            local_rates: &self.local_rates,
            remote_rates: &self.remote_rates,
        };
        if let Some(d) = self.decider.observe(&m) {
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
        shared.lock().set_target(shared, d.local);
    }
    if d.remote != d.from_remote {
        if let Err(e) = super::remote::scale_remote(shared, d.remote) {
            tracing::warn!(job = J::NAME, error = %e, "autoscale: worker processes not started");
        }
    }
}
