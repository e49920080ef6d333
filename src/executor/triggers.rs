//! The job's timer task: the snapshot period, the deadline, the signals or token that ask
//! for a suspend, and the autoscaler's period (`autoscale.rs`). One task per job on the
//! executor's I/O runtime, holding the job weakly.

use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use super::autoscale::Scaler;
use super::job_run::Shared;
use super::signals::Signals;
use crate::job::Job;

/// Starts the job's snapshot and suspend triggers (period, deadline, signals, token) and its
/// autoscaler on the I/O runtime. The task holds the job weakly and ends with it.
pub(crate) fn spawn_triggers<J: Job>(shared: &Arc<Shared<J>>) {
    let cfg = &shared.config.snapshots;
    let autoscale = shared.config.autoscale;
    if cfg.every.is_none()
        && cfg.deadline.is_none()
        && cfg.signals.is_empty()
        && cfg.token.is_none()
        && autoscale.is_none()
    {
        return;
    }
    let weak: Weak<Shared<J>> = Arc::downgrade(shared);
    let (every, deadline, token) = (cfg.every, cfg.deadline, cfg.token.clone());
    let io = shared.io.handle().clone();
    // Signal streams must be created inside the runtime.
    let _enter = io.enter();
    let mut signals = Signals::new(&cfg.signals, J::NAME);
    let submitted = SystemTime::now();
    io.spawn(async move {
        let start = tokio::time::Instant::now();
        let mut tick = every.map(|d| tokio::time::interval_at(start + d, d));
        let mut scaler = autoscale.map(Scaler::new);
        let mut scale_tick = autoscale.map(|a| {
            let mut i = tokio::time::interval_at(start + a.period, a.period);
            i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            i
        });
        // Once a suspend is wanted (deadline, signal, token), it is asked for again every
        // second until the job has ended: a suspend whose snapshot failed is retried.
        let mut want_suspend = false;
        let mut last_ask: Option<std::time::Instant> = None;
        loop {
            let longest = match weak.upgrade() {
                Some(shared) => {
                    let st = shared.lock();
                    if st.ended {
                        return;
                    }
                    st.snap.longest
                }
                None => return,
            };
            if want_suspend {
                if last_ask.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                    let Some(shared) = weak.upgrade() else { return };
                    shared.lock().request_suspend(None);
                    last_ask = Some(std::time::Instant::now());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            // Before any snapshot was timed: ten seconds, but at most half the time the job
            // was given, so a short deadline still leaves it time to work.
            let margin = longest.map_or_else(
                || {
                    let given = deadline.and_then(|d| d.duration_since(submitted).ok()).unwrap_or_default();
                    Duration::from_secs(10).min(given / 2)
                },
                |l| 2 * l + Duration::from_secs(1),
            );
            let until_deadline = deadline.map(|d| d.duration_since(SystemTime::now() + margin).unwrap_or(Duration::ZERO));
            let suspend = tokio::select! {
                _ = async { tick.as_mut().expect("guarded").tick().await }, if tick.is_some() => false,
                _ = async { scale_tick.as_mut().expect("guarded").tick().await }, if scale_tick.is_some() => {
                    let Some(shared) = weak.upgrade() else { return };
                    if !scaler.as_mut().expect("with its tick").tick(&shared) {
                        return;
                    }
                    continue;
                }
                _ = tokio::time::sleep(until_deadline.unwrap_or(Duration::MAX)), if until_deadline.is_some() => true,
                signal = signals.recv(), if !signals.is_empty() => {
                    tracing::info!(job = J::NAME, signal, "a signal asks the job to suspend");
                    true
                }
                _ = async { token.as_ref().expect("guarded").fired().await }, if token.is_some() => true,
                // Look again at the deadline's margin and whether the job ended.
                _ = tokio::time::sleep(Duration::from_millis(200)) => continue,
            };
            if suspend {
                want_suspend = true;
                continue;
            }
            let Some(shared) = weak.upgrade() else { return };
            // Nobody waits for a periodic snapshot's outcome (it is logged and counted).
            let _ignored = shared.lock().ask_snapshot(false);
        }
    });
}
