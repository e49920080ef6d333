//! The driver side of a job run: the mailboxes of its local workers and of the thread that
//! waits for it, the connections of its worker processes, and the orders that go out
//! through them.
//!
//! [`State`] decides and queues; it never sends. It queues frames for worker processes
//! (`Remotes::outbox`) and [`Order`]s for local workers; each locked section ends by carrying
//! them out ([`Guard`](super::job_run::Guard)'s drop), in the order they were queued and
//! before the lock is released, so a worker never sees an order the state has already
//! withdrawn. The mailboxes live here, not in the state: the state names a worker by its
//! [`WorkerId`] and a worker process by its [`ProcessId`], and holds no channel.

use std::collections::HashMap;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Instant;

use bytes::Bytes;

use crossbeam_channel::Sender;
use tokio::sync::mpsc::UnboundedSender;

use super::job_run::{Pause, State};
use super::members::{Mail, Msg};
use super::snapshot::{Header, Part, Reply};
use super::threads::thread_main;
use super::{Config, IoRuntime};
use crate::error::Error;
use crate::job::Job;
use crate::run::Held;
use crate::run::Inputs;
use crate::schedule::{ProcessId, WorkerId, Write};
use crate::snapshot::{PartRef, SnapshotId};
use crate::wire::frame::ToWorker;
use crate::wire::listener::Listener;

/// Everything one job run shares between its workers and its handle.
pub(crate) struct Shared<J: Job> {
    pub(crate) config: Arc<Config>,
    pub(crate) io: Arc<IoRuntime>,
    pub(crate) listener: Option<Arc<Listener>>,
    pub(crate) inputs: Arc<Inputs<J>>,
    pub(crate) started: Instant,
    /// This, for the threads its orders spawn (`links.rs`).
    pub(crate) me: Weak<Shared<J>>,
    pub(crate) state: Mutex<Locked<J>>,
}

/// What the job's mutex guards: the state, which decides, and the links its orders go out
/// through.
pub(crate) struct Locked<J: Job> {
    pub(crate) state: State<J>,
    pub(crate) links: Links<J>,
}

impl<J: Job> Locked<J> {
    pub(crate) fn new(state: State<J>) -> Locked<J> {
        let links = Links {
            timeline: state.config.timeline.clone(),
            ..Links::default()
        };
        Locked { state, links }
    }
}

/// The job's state, locked: the orders it queued go out when the guard drops, before the
/// lock is released (`links.rs`).
pub(crate) struct Guard<'a, J: Job> {
    locked: MutexGuard<'a, Locked<J>>,
    shared: &'a Shared<J>,
    /// When the lock was taken.
    at: Instant,
}

impl<J: Job> Guard<'_, J> {
    /// The run's progress, with each local worker's read from its cell now.
    pub(crate) fn progress(&mut self) -> super::Progress {
        let (state, links) = self.links();
        links.read_progress(state);
        state.progress()
    }

    /// Asks the state for a snapshot (or a suspend); the receiver gets its outcome.
    pub(crate) fn ask_snapshot(
        &mut self,
        suspend: bool,
    ) -> tokio::sync::oneshot::Receiver<crate::Result<crate::snapshot::SnapshotId>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (state, links) = self.links();
        let reply = links.reply_to(tx);
        if suspend {
            state.request_suspend(Some(reply));
        } else {
            state.request_snapshot(reply);
        }
        rx
    }

    /// The links the state's orders go out through.
    pub(crate) fn links(&mut self) -> (&mut State<J>, &mut Links<J>) {
        let Locked { state, links } = &mut *self.locked;
        (state, links)
    }
}

impl<J: Job> Deref for Guard<'_, J> {
    type Target = State<J>;

    fn deref(&self) -> &State<J> {
        &self.locked.state
    }
}

impl<J: Job> DerefMut for Guard<'_, J> {
    fn deref_mut(&mut self) -> &mut State<J> {
        &mut self.locked.state
    }
}

impl<J: Job> Drop for Guard<'_, J> {
    fn drop(&mut self) {
        let Locked { state, links } = &mut *self.locked;
        if let Some(pause) = state.pause.take() {
            let seconds = self.at.elapsed().as_secs_f64();
            let m = &state.watch.metrics;
            match pause {
                Pause::Marker => m.snapshot_pause.record(seconds),
                Pause::Done => m.snapshot_pause_done.record(seconds),
            }
        }
        links.carry_out(state, self.shared);
    }
}

impl<J: Job> fmt::Debug for Shared<J> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("job", &J::NAME)
            .finish_non_exhaustive()
    }
}

impl<J: Job> Shared<J> {
    pub(crate) fn lock(&self) -> Guard<'_, J> {
        // A panic never happens while the lock is held (user code under it is caught), but be
        // robust: the state stays consistent, so a poisoned lock is still usable.
        let mut locked = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let at = Instant::now();
        locked.state.now = at.saturating_duration_since(self.started);
        let Locked { state, links } = &mut *locked;
        state.published.listening = links.progress_listened();
        // Local workers' progress is read only for someone who wants it (`Guard::progress`).
        if state.published.listening {
            links.read_progress(state);
        }
        Guard {
            locked,
            shared: self,
            at,
        }
    }
}

/// An operation of the state on the job's snapshot store, carried out on the I/O runtime
/// by [`Links::carry_out`]; its outcome comes back to the state as a call
/// (`State::snapshot_written`, `State::rolled_back`, `State::parts_read`).
pub(crate) enum StoreOp {
    /// Protocol step 3 of `schedule/cut.rs`: write a complete cut, in an epoch after
    /// `after` (`io.rs`).
    Write {
        cut: Box<Write<Header, Part, Bytes, Reply>>,
        after: Option<u64>,
    },
    /// Read back and decode the manifest of `epoch` for rollback `attempt` (`rollback.rs`).
    ReadManifest { epoch: u64, attempt: u64 },
    /// Read the parts `need` of snapshot `id` for rollback `attempt` (`rollback.rs`).
    ReadParts {
        id: SnapshotId,
        need: Vec<PartRef>,
        attempt: u64,
    },
}

/// An order of the state for a local worker, carried out by [`Links::carry_out`].
pub(crate) enum Order<J: Job> {
    /// A message for local worker `0` (a thread, or the thread waiting inline). A
    /// [`Msg::Release`] also forgets its mailbox.
    Local(WorkerId, Msg<J>),
    /// Raise these bits of local worker `0`'s attention cell (`run/cell.rs`): a request
    /// about the chunk it runs.
    Raise(WorkerId, u8),
    /// Lower them (a request withdrawn).
    Lower(WorkerId, u8),
    /// A new thread for local worker `0`.
    Spawn(WorkerId),
    /// The thread waiting for the job becomes local worker `0` (the inline worker).
    Inline(WorkerId),
    /// Worker processes `0` were retired with a grace period `1` to drain in (`drain.rs`).
    Drain(Vec<ProcessId>, std::time::Duration),
    /// The bytes of partition `0`, asked back from its process for a local runner that
    /// waits for them (or why they will not come).
    Fetched(crate::schedule::ChunkId, crate::Result<Bytes>),
    /// The run's progress, for its receivers ([`ProgressUpdates`](super::ProgressUpdates)).
    Progress(super::Progress),
    /// The outcome of a snapshot for whoever asked for it.
    Reply(Reply, crate::Result<crate::snapshot::SnapshotId>),
    /// Whoever waits for the outcome looks again: the waiting thread's mailbox, an awaiting
    /// task.
    Wake,
    /// A record for the run's timeline (`watch.rs`), with the local and remote workers when
    /// it happened.
    Record(usize, usize, crate::timeline::Event),
}

/// A local worker as its driver knows it: its thread's mailbox, and the attention cell it
/// shares with that thread.
struct LocalLink<J: Job> {
    tx: Sender<Mail<J>>,
    cell: Arc<crate::run::Cell>,
}

/// The mailboxes and connections the orders of one job run go out through.
pub(crate) struct Links<J: Job> {
    /// Local workers' mailboxes (the inline worker's is the waiting thread's).
    locals: HashMap<WorkerId, LocalLink<J>>,
    /// The mailbox of the thread blocked in `wait`, or of the helper standing in for an
    /// awaiting task.
    waiter: Option<Sender<Mail<J>>>,
    /// The task awaiting the outcome, if any.
    waker: Option<std::task::Waker>,
    /// Each worker process's connection task.
    conns: HashMap<ProcessId, UnboundedSender<ToWorker>>,
    /// Who waits for a snapshot's outcome, by the number the state knows them by.
    replies: HashMap<u64, Answer>,
    next_reply: u64,
    /// The run's progress channel.
    progress: tokio::sync::watch::Sender<Option<super::Progress>>,
    /// Channels of local runners waiting for a partition on its way, by chunk.
    fetched: HashMap<crate::schedule::ChunkId, crossbeam_channel::Sender<crate::Result<Bytes>>>,
    /// The run's timeline, if it has one (`Builder::timeline`).
    timeline: Option<Arc<crate::timeline::Sink>>,
    /// Worker processes started by `scale_remote` that may still be running
    /// (`connection.rs`; the state counts them: `Remotes::launched`).
    pub(crate) launched: Vec<Box<dyn crate::wire::Launched>>,
}

/// Where a snapshot's outcome goes.
pub(crate) type Answer = tokio::sync::oneshot::Sender<crate::Result<crate::snapshot::SnapshotId>>;

impl<J: Job> Default for Links<J> {
    fn default() -> Self {
        Links {
            locals: HashMap::new(),
            waiter: None,
            waker: None,
            conns: HashMap::new(),
            replies: HashMap::new(),
            next_reply: 0,
            progress: tokio::sync::watch::Sender::new(None),
            fetched: HashMap::new(),
            timeline: None,
            launched: Vec::new(),
        }
    }
}

impl<J: Job> Links<J> {
    /// The connection task of worker process `id`, which the state has just joined.
    pub(crate) fn link_conn(&mut self, id: ProcessId, tx: UnboundedSender<ToWorker>) {
        self.conns.insert(id, tx);
    }

    /// The mailbox of the thread that waits for the job (and runs it inline at target 0).
    pub(crate) fn set_waiter(&mut self, state: &mut State<J>, tx: Option<Sender<Mail<J>>>) {
        state.members.waiting = tx.is_some();
        self.waiter = tx;
    }

    /// A message for a local worker as it goes to its thread: a run comes with the
    /// worker's attention cell (its progress reset), and a partition the state asked back
    /// from its process ([`Held::Asked`]) becomes a channel the runner waits on.
    pub(crate) fn prepare(&mut self, msg: Msg<J>) -> Mail<J> {
        match msg {
            Msg::Run {
                worker,
                mut assignment,
                job,
            } => {
                if let Some(Held::Asked(chunk)) = assignment.state {
                    let (tx, rx) = crossbeam_channel::bounded(1);
                    self.fetched.insert(chunk, tx);
                    assignment.state = Some(Held::Fetch(rx));
                }
                let cell = self
                    .locals
                    .get(&worker)
                    .map_or_else(Arc::default, |l| Arc::clone(&l.cell));
                cell.publish(0);
                Mail::Run {
                    worker,
                    assignment,
                    job,
                    cell,
                }
            }
            Msg::Release => Mail::Release,
        }
    }

    /// Each local worker's progress, from its cell, into the state (when the lock is taken).
    pub(crate) fn read_progress(&self, state: &mut State<J>) {
        for (&w, l) in &self.locals {
            if let Some(local) = state.members.local_mut(w) {
                local.progress = l.cell.progress();
            }
        }
    }

    /// A receiver of the run's progress.
    pub(crate) fn subscribe_progress(
        &self,
    ) -> tokio::sync::watch::Receiver<Option<super::Progress>> {
        self.progress.subscribe()
    }

    /// Whether anyone receives the run's progress.
    pub(crate) fn progress_listened(&self) -> bool {
        !self.progress.is_closed()
    }

    /// A snapshot's requester: the number the state answers it by.
    pub(crate) fn reply_to(&mut self, answer: Answer) -> Reply {
        let r = Reply(self.next_reply);
        self.next_reply += 1;
        self.replies.insert(r.0, answer);
        r
    }

    /// The task to wake when the job's outcome is ready.
    pub(crate) fn set_waker(&mut self, waker: std::task::Waker) {
        self.waker = Some(waker);
    }

    /// Carries out what `state` queued, in order, until nothing is left (carrying out an
    /// order can fail, and the state's answer queues more); then forgets the mailboxes and
    /// connections the state no longer names.
    pub(crate) fn carry_out(&mut self, state: &mut State<J>, shared: &Shared<J>) {
        loop {
            for (id, frame) in state.remote.take_outbox() {
                if let Some(tx) = self.conns.get(&id) {
                    let _ = tx.send(frame);
                }
            }
            if !state.store_ops.is_empty() {
                let ops = std::mem::take(&mut state.store_ops);
                if let Some(shared) = shared.me.upgrade() {
                    ops.into_iter().for_each(|op| store_op(&shared, op));
                }
            }
            if state.orders.is_empty() {
                break;
            }
            for order in std::mem::take(&mut state.orders) {
                self.carry(order, state, shared);
            }
        }
        // A runner whose partition the state no longer fetches (the job ended) is let go.
        if !self.fetched.is_empty() {
            self.fetched
                .retain(|&c, _| state.remote.fetching_for_local(c));
        }
        if self.conns.len() != state.remote.conns.len() {
            self.conns
                .retain(|id, _| state.remote.conns.contains_key(id));
        }
        // Requests the state can no longer answer (its outcome is out, no write is in
        // flight) end as the job did.
        if !self.replies.is_empty() && state.outcome_ready() {
            tracing::warn!(
                job = J::NAME,
                requests = self.replies.len(),
                "snapshot requests the job ended without answering: answered as ended"
            );
            for (_, answer) in self.replies.drain() {
                let _ = answer.send(Err(Error::Ended { job: J::NAME }));
            }
        }
        if self.locals.len() != state.members.local_count() {
            self.locals.retain(|w, _| state.members.local(*w).is_some());
        }
    }

    fn carry(&mut self, order: Order<J>, state: &mut State<J>, shared: &Shared<J>) {
        match order {
            Order::Local(w, msg) => {
                let release = matches!(msg, Msg::Release);
                let mail = self.prepare(msg);
                if let Some(l) = self.locals.get(&w) {
                    let _ = l.tx.send(mail);
                }
                if release {
                    self.locals.remove(&w);
                }
            }
            Order::Raise(w, bits) => {
                if let Some(l) = self.locals.get(&w) {
                    l.cell.raise(bits);
                }
            }
            Order::Lower(w, bits) => {
                if let Some(l) = self.locals.get(&w) {
                    l.cell.lower(bits);
                }
            }
            Order::Spawn(w) => {
                let (tx, rx) = crossbeam_channel::unbounded();
                let spawned = shared.me.upgrade().map(|shared| {
                    std::thread::Builder::new()
                        .name(format!("malleable-{}-{w}", J::NAME))
                        .spawn(move || thread_main(shared, rx))
                });
                match spawned {
                    Some(Ok(_)) => {
                        let cell = Arc::default();
                        self.locals.insert(w, LocalLink { tx, cell });
                    }
                    // The job's handle and workers are gone: nothing runs it any more.
                    None => {}
                    Some(Err(e)) if !state.ended => state.complete(Err(Error::Spawn(e))),
                    Some(Err(_)) => {}
                }
            }
            Order::Inline(w) => {
                if let Some(tx) = &self.waiter {
                    let (tx, cell) = (tx.clone(), Arc::default());
                    self.locals.insert(w, LocalLink { tx, cell });
                }
            }
            Order::Drain(ids, grace) => {
                if let Some(shared) = shared.me.upgrade() {
                    super::drain::watch_drain(&shared, ids, grace);
                }
            }
            Order::Fetched(chunk, bytes) => {
                if let Some(tx) = self.fetched.remove(&chunk) {
                    let _ = tx.send(bytes);
                }
            }
            Order::Progress(p) => {
                self.progress.send_replace(Some(p));
            }
            Order::Reply(r, result) => {
                if let Some(answer) = self.replies.remove(&r.0) {
                    let _ = answer.send(result);
                }
            }
            Order::Record(local, remote, event) => {
                if let Some(sink) = &self.timeline {
                    sink.send(J::NAME, local, remote, event);
                }
            }
            Order::Wake => {
                if let Some(tx) = &self.waiter {
                    let _ = tx.send(Mail::Wake);
                }
                if let Some(w) = self.waker.take() {
                    w.wake();
                }
            }
        }
    }
}

/// Starts `op` on the I/O runtime.
fn store_op<J: Job>(shared: &Arc<Shared<J>>, op: StoreOp) {
    let shared = Arc::clone(shared);
    match op {
        StoreOp::Write { cut, after } => super::io::write(shared, *cut, after),
        StoreOp::ReadManifest { epoch, attempt } => {
            super::io::read_back(shared, epoch, attempt);
        }
        StoreOp::ReadParts { id, need, attempt } => {
            super::io::read_parts(shared, id, need, attempt);
        }
    }
}
