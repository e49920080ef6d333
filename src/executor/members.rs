//! The workers of one job run, local or remote, behind one type.
//!
//! Every worker of the ledger (a [`WorkerId`]) is a [`Member`]: a local thread or the inline
//! worker (a mailbox and an attention cell, `local.rs`), or a slot of a worker process (its
//! connection and slot number, `remote.rs`). Which one a worker is, is decided here and only
//! here; the commands of the core and of the cut are dispatched by kind in one place each
//! (`State::execute` in `job_run.rs`, `State::cut_commands` in `snapshot.rs`).

use crate::schedule::idhash::{IdMap, IdSet};
use std::sync::Arc;

use crate::job::Job;
use crate::run::{Assignment, Cell};
use crate::schedule::ProcessId;
use crate::schedule::WorkerId;

/// A message of the state for a local worker (or for the thread waiting in inline mode).
pub(crate) enum Msg<J: Job> {
    /// Run a chunk of the current phase as worker `worker`.
    Run {
        worker: WorkerId,
        assignment: Assignment<J::Chunk>,
        job: Arc<J>,
    },
    /// This worker id is released: a thread exits, the inline waiter goes back to waiting.
    Release,
}

/// A message as a local worker's thread gets it from the driver (`links.rs`): a run comes
/// with the worker's attention cell, the flags the state raises through the driver.
pub(crate) enum Mail<J: Job> {
    /// Run a chunk of the current phase as worker `worker`.
    Run {
        worker: WorkerId,
        assignment: Assignment<J::Chunk>,
        job: Arc<J>,
        cell: Arc<Cell>,
    },
    /// This worker id is released: a thread exits, the inline waiter goes back to waiting.
    Release,
    /// Something changed (the job ended, or the inline role may be needed): look again.
    Wake,
}

/// A local thread, or the inline worker. Its mailbox and attention cell are the driver's
/// (`links.rs`).
pub(crate) struct Local {
    /// Iterations its running chunk has done, as its cell said when the lock was taken.
    pub(crate) progress: u64,
    pub(crate) inline: bool,
    pub(crate) retiring: bool,
}

/// A slot of a worker process (the chunk it holds is the core's: `Core::running_on`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RemoteSlot {
    pub(crate) conn: ProcessId,
    pub(crate) slot: u32,
}

/// A worker of the job.
pub(crate) enum Member {
    Local(Local),
    Remote(RemoteSlot),
}

/// The job's workers, their ids, and the local target.
pub(crate) struct Members<J: Job> {
    table: IdMap<WorkerId, Member>,
    /// The local workers among them: a few threads beside what may be tens of thousands of
    /// remote slots, looked at after every event.
    local_ids: IdSet<WorkerId>,
    next_id: WorkerId,
    /// Requested local worker threads.
    pub(crate) target: usize,
    /// Whether a thread is blocked in `wait` (or a helper stands in for an awaiting task):
    /// it runs the job when `target` is 0. Its mailbox is the driver's (`links.rs`).
    pub(crate) waiting: bool,
    gauge: metrics::Gauge,
    job: std::marker::PhantomData<fn() -> J>,
}

impl<J: Job> Members<J> {
    pub(crate) fn new(target: usize) -> Members<J> {
        Members {
            table: IdMap::default(),
            local_ids: IdSet::default(),
            next_id: 0,
            target,
            waiting: false,
            gauge: metrics::gauge!(crate::metrics::WORKERS, "job" => J::NAME),
            job: std::marker::PhantomData,
        }
    }

    fn join(&mut self, member: Member) -> WorkerId {
        let w = self.next_id;
        self.next_id += 1;
        if let Member::Local(_) = member {
            self.local_ids.insert(w);
        }
        self.table.insert(w, member);
        w
    }

    /// A new local worker (a thread, or the inline worker).
    pub(crate) fn join_local(&mut self, inline: bool) -> WorkerId {
        self.join(Member::Local(Local {
            progress: 0,
            inline,
            retiring: false,
        }))
    }

    /// A new slot of connection `conn`.
    pub(crate) fn join_slot(&mut self, conn: ProcessId, slot: u32) -> WorkerId {
        self.join(Member::Remote(RemoteSlot { conn, slot }))
    }

    pub(crate) fn get(&self, w: WorkerId) -> Option<&Member> {
        self.table.get(&w)
    }

    pub(crate) fn local(&self, w: WorkerId) -> Option<&Local> {
        match self.table.get(&w) {
            Some(Member::Local(l)) => Some(l),
            _ => None,
        }
    }

    pub(crate) fn local_mut(&mut self, w: WorkerId) -> Option<&mut Local> {
        match self.table.get_mut(&w) {
            Some(Member::Local(l)) => Some(l),
            _ => None,
        }
    }

    pub(crate) fn remove(&mut self, w: WorkerId) -> Option<Member> {
        self.local_ids.remove(&w);
        self.table.remove(&w)
    }

    /// Every worker, local or remote, in the order they joined.
    pub(crate) fn ids(&self) -> impl Iterator<Item = WorkerId> + use<J> {
        let mut ids: Vec<WorkerId> = self.table.keys().copied().collect();
        ids.sort_unstable();
        ids.into_iter()
    }

    /// The local workers.
    pub(crate) fn locals(&self) -> impl Iterator<Item = (WorkerId, &Local)> {
        self.local_ids
            .iter()
            .filter_map(|&w| match self.table.get(&w) {
                Some(Member::Local(l)) => Some((w, l)),
                _ => None,
            })
    }

    /// Local workers (threads, retiring ones included, or the inline worker).
    pub(crate) fn local_count(&self) -> usize {
        self.local_ids.len()
    }

    /// Forgets every remote slot (the job ended; their connections get `End`).
    pub(crate) fn drop_slots(&mut self) {
        self.table.retain(|_, m| matches!(m, Member::Local(_)));
    }

    /// Updates the gauge of local workers.
    pub(crate) fn update_gauge(&self) {
        self.gauge.set(self.local_count() as f64);
    }
}
