//! A graceful, bounded shutdown of the executor's I/O: what has been sent must arrive, what
//! is being written must be committed, before the program that owns the executor returns.
//!
//! The executor's runtimes are its own, so nothing waits for their tasks: a program that
//! returned right after [`JobHandle::wait`](super::JobHandle::wait) exited while the job's
//! `End` frames were still queued for its worker processes (which then reported `Closed` for
//! a job that had finished) and while a snapshot's parts were still being written.
//!
//! # The protocol
//!
//! 1. Every connection task of a worker process is *tracked* from the moment it is spawned
//!    until it ends ([`Connections::track`]), with a weak handle on the job's sender to it.
//! 2. A job lets go of a connection by dropping its sender, and only after it queued the
//!    connection's last message (`End`) or after the connection was lost. So a tracked
//!    connection whose sender is gone is *ending*: it has frames to deliver, then closes.
//! 3. A connection task ends after it has flushed `End` and closed its side of the socket,
//!    or after its peer closed, broke the protocol or let its lease expire. So an ending
//!    connection ends within a lease even if the worker process hangs.
//! 4. A snapshot write is a task of the writer runtime (its parts are tasks there too), so
//!    writes in flight are the runtime's alive tasks.
//! 5. [`IoRuntime::drain`](super::IoRuntime::drain) waits until no connection is ending (of
//!    one job, for `JobHandle::wait`; of any job, when the executor shuts down) and, for the
//!    executor, no write is in flight; or until its time limit, after which what is left is
//!    logged, counted ([`SHUTDOWN_ABANDONED`](crate::metrics::SHUTDOWN_ABANDONED)) and
//!    reported. Connections of jobs still running are not waited for: nothing was queued for
//!    them to deliver.
//!
//! The wait polls (every 2 ms) rather than being woken: it runs once, at the end, and the
//! two things it waits for live in different runtimes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::mpsc::{UnboundedSender, WeakUnboundedSender};

use crate::wire::frame::ToWorker;

/// The connection tasks of worker processes, for [`IoRuntime::drain`](super::IoRuntime::drain).
#[derive(Debug, Default)]
pub(crate) struct Connections {
    entries: Mutex<Vec<Entry>>,
    next: AtomicU64,
}

#[derive(Debug)]
struct Entry {
    id: u64,
    job: JobKey,
    sender: WeakUnboundedSender<ToWorker>,
}

/// Which job run a connection belongs to: the address of its shared state (stable while the
/// connection's task holds it).
pub(crate) type JobKey = usize;

/// The key of the job run whose shared state is `shared`.
pub(crate) fn job_key<T>(shared: &Arc<T>) -> JobKey {
    Arc::as_ptr(shared).cast::<()>() as usize
}

/// A tracked connection task; untracked when dropped (with the task).
#[derive(Debug)]
pub(crate) struct Tracked {
    connections: Arc<Connections>,
    id: u64,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        let mut entries = self
            .connections
            .entries
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        entries.retain(|e| e.id != self.id);
    }
}

impl Connections {
    /// Step 1: tracks the task of a connection of `job`, to which the job sends through `tx`
    /// (or one of its clones).
    pub(crate) fn track(self: &Arc<Self>, job: JobKey, tx: &UnboundedSender<ToWorker>) -> Tracked {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.push(Entry {
            id,
            job,
            sender: tx.downgrade(),
        });
        Tracked {
            connections: Arc::clone(self),
            id,
        }
    }

    /// Step 2: connections (of `job`, or of any job) that the job let go of and whose task
    /// has not ended.
    pub(crate) fn ending(&self, job: Option<JobKey>) -> usize {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries
            .iter()
            .filter(|e| job.is_none_or(|j| e.job == j) && e.sender.strong_count() == 0)
            .count()
    }
}

/// What a drain left behind when its time was up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Pending {
    /// Connections that had not delivered their last frames.
    pub(crate) connections: usize,
    /// Tasks of snapshot writes still running (a write and each of its parts' uploads).
    pub(crate) writes: usize,
}

impl Pending {
    fn is_empty(self) -> bool {
        self == Pending::default()
    }
}

/// Step 5: polls `pending` until it is empty or `timeout` has passed; what was left.
pub(crate) fn wait(timeout: Duration, mut pending: impl FnMut() -> Pending) -> Pending {
    let deadline = Instant::now() + timeout;
    loop {
        let left = pending();
        if left.is_empty() || Instant::now() >= deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Logs and counts what a drain (`what`: "the executor's shutdown", "the end of job X")
/// abandoned after `timeout`.
pub(crate) fn report(what: &str, left: Pending, timeout: Duration) {
    if left.is_empty() {
        return;
    }
    tracing::warn!(
        connections = left.connections,
        writes = left.writes,
        ?timeout,
        "{what}: gave up waiting; worker processes may not have been told that the job \
         ended, and snapshot writes in flight were abandoned (no snapshot is torn: an \
         uncommitted one is ignored)"
    );
    let abandoned = |kind: &'static str, n: usize| {
        if n > 0 {
            metrics::counter!(crate::metrics::SHUTDOWN_ABANDONED, "kind" => kind)
                .increment(n as u64);
        }
    };
    abandoned("connection", left.connections);
    abandoned("snapshot_write", left.writes);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_is_ending_once_its_job_lets_go_until_its_task_ends() {
        let connections = Arc::<Connections>::default();
        let (tx_a, _rx_a) = tokio::sync::mpsc::unbounded_channel();
        let (tx_b, _rx_b) = tokio::sync::mpsc::unbounded_channel();
        let a = connections.track(1, &tx_a);
        let b = connections.track(2, &tx_b);
        assert_eq!(connections.ending(None), 0);
        drop(tx_a);
        assert_eq!(connections.ending(None), 1);
        assert_eq!(connections.ending(Some(1)), 1);
        assert_eq!(connections.ending(Some(2)), 0);
        drop(a);
        assert_eq!(connections.ending(None), 0);
        // A task that ends before its job lets go was never ending.
        drop(b);
        drop(tx_b);
        assert_eq!(connections.ending(None), 0);
    }

    #[test]
    fn a_wait_ends_when_nothing_is_left_or_at_its_limit() {
        let mut left = 3;
        let got = wait(Duration::from_secs(60), || {
            left -= 1;
            Pending {
                connections: left,
                writes: 0,
            }
        });
        assert_eq!(got, Pending::default());
        let stuck = Pending {
            connections: 1,
            writes: 2,
        };
        assert_eq!(wait(Duration::ZERO, || stuck), stuck);
    }
}
