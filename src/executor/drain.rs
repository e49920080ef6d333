//! Draining worker processes within a grace period: a spot instance's notice (30 s on two
//! clouds, 120 s on a third), a pod's termination grace period (30 s by default).
//!
//! [`JobHandle::drain_remote`] retires the processes at once (their threads hand their chunks
//! back at their next adjustment point, their owned partitions come back as bytes) and then
//! watches the clock. A process that is still connected when the grace period is nearly over
//! (a margin of twice the longest snapshot so far plus one second, or half the grace period
//! before any snapshot was timed) makes the job take a snapshot, so that what the process
//! still holds is in a committed snapshot before it can be lost. A process still connected
//! when the grace period ends is let go: the connection is dropped as a lost one, and its
//! partitions, if it still held any, are recovered by rolling back to that snapshot. Every
//! step is logged, and what was given up is counted in
//! [`DRAINS_OVERRUN`](crate::metrics::DRAINS_OVERRUN).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::JobHandle;
use super::job_run::Shared;
use crate::job::Job;
use crate::schedule::ProcessId;

impl<J: Job> JobHandle<J> {
    /// Drains the `n` most recently joined worker processes within `grace`: they are retired
    /// at once; if one is still there near the end of `grace`, a snapshot is taken; if one is
    /// still there at the end, it is let go (see the module's docs: a job with owned
    /// partitions then rolls back to that snapshot). Returns how many processes are drained.
    pub fn drain_remote(&self, n: usize, grace: Duration) -> usize {
        let ids = {
            let mut st = self.shared.lock();
            let ids = st.newest_conns(n);
            for &id in &ids {
                st.retire_conn(id);
            }
            ids
        };
        if ids.is_empty() {
            return 0;
        }
        let count = ids.len();
        watch_drain(&self.shared, ids, grace);
        count
    }
}

/// Watches the drain of connections `ids` (already retired) for `grace`; see the module's
/// docs. Also for a worker process that left with a grace period of its own
/// ([`WorkerOptions::grace`](crate::cluster::WorkerOptions::grace)).
pub(crate) fn watch_drain<J: Job>(shared: &Arc<Shared<J>>, ids: Vec<ProcessId>, grace: Duration) {
    tracing::info!(
        job = J::NAME,
        processes = ids.len(),
        ?grace,
        "draining worker processes"
    );
    let weak = Arc::downgrade(shared);
    shared
        .io
        .handle()
        .spawn(watch(weak, ids, grace, Instant::now()));
}

/// The clock of one drain.
async fn watch<J: Job>(
    weak: std::sync::Weak<Shared<J>>,
    ids: Vec<ProcessId>,
    grace: Duration,
    start: Instant,
) {
    let left = |shared: &Arc<Shared<J>>| -> Vec<ProcessId> {
        let st = shared.lock();
        if st.ended {
            return Vec::new();
        }
        ids.iter()
            .copied()
            .filter(|&id| st.is_connected(id))
            .collect()
    };
    let margin = {
        let Some(shared) = weak.upgrade() else { return };
        let longest = shared.lock().snap.longest;
        longest.map_or(grace / 2, |l| (2 * l + Duration::from_secs(1)).min(grace))
    };
    // Until the margin: are they gone?
    let snapshot_at = start + grace.saturating_sub(margin);
    while Instant::now() < snapshot_at {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let Some(shared) = weak.upgrade() else { return };
        if left(&shared).is_empty() {
            tracing::info!(job = J::NAME, took = ?start.elapsed(), "the drained worker processes have left");
            return;
        }
    }
    // Near the end: a snapshot of what they still hold.
    let reply = {
        let Some(shared) = weak.upgrade() else { return };
        let still = left(&shared);
        if still.is_empty() {
            return;
        }
        tracing::warn!(
            job = J::NAME,
            processes = still.len(),
            "drained worker processes are still there near the end of their grace period: taking a snapshot"
        );
        shared.lock().ask_snapshot(false)
    };
    let end = start + grace;
    let snapshot = tokio::time::timeout_at(end.into(), reply).await;
    match snapshot {
        Ok(Ok(Ok(id))) => {
            tracing::info!(job = J::NAME, snapshot = %id, "snapshot taken within the grace period")
        }
        Ok(Ok(Err(error))) => tracing::warn!(
            job = J::NAME,
            error = &error as &dyn std::error::Error,
            "the drain's snapshot failed"
        ),
        Ok(Err(_)) | Err(_) => tracing::warn!(
            job = J::NAME,
            "the drain's snapshot was not committed within the grace period"
        ),
    }
    // The end of the grace period: whoever is still there is let go.
    tokio::time::sleep_until(end.into()).await;
    let Some(shared) = weak.upgrade() else { return };
    let still = left(&shared);
    if still.is_empty() {
        return;
    }
    metrics::counter!(crate::metrics::DRAINS_OVERRUN, "job" => J::NAME)
        .increment(still.len() as u64);
    tracing::warn!(
        job = J::NAME,
        processes = still.len(),
        "drained worker processes outlived their grace period: let go"
    );
    let mut st = shared.lock();
    for id in still {
        st.let_go(id);
    }
}
