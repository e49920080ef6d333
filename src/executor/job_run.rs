//! One job run: where the events of workers meet the commands of the core and the cut.
//!
//! Each submitted job gets its own [`Shared`]: the configuration, the input loaded once, and
//! the [`State`] behind one mutex. There is no global pool: two executors, or two jobs of one
//! executor, never share threads.
//!
//! A worker runs steps back to back and reads one atomic flag per step. It takes the mutex
//! only when a chunk ends, it was interrupted, or it captured its chunk for a snapshot; under
//! the mutex its event is fed to the cut (`snapshot.rs`) and to the core, and the commands
//! they return are carried out (`Run` and `Release` messages, flags, frames to worker
//! processes) before the mutex is released, so a flag is never set for a request the core has
//! already withdrawn.
//!
//! # Who owns what
//!
//! [`State`] is split by the file that changes it: the ledger, the job value and the result
//! here; the workers in `members.rs` (local threads in `local.rs`); connections of worker
//! processes in `remote.rs`; snapshot bookkeeping in `snapshot.rs`.

use crate::schedule::idhash::{IdMap, IdSet};
use std::sync::Arc;
use std::time::Duration;

use super::links::Order;
use super::members::{Member, Members, Msg};
use super::progress::Publisher;
use super::remote::{Fetch, Remotes};
use super::rollback::Rollback;
use super::snapshot::{self, Captured, Snapshots};
use super::{Config, Outcome};
use crate::error::{Error, Result, Site};
use crate::exchange::{At, Inbox, Outbox, Piece};
use crate::job::{Job, Next, Value};
use crate::run::{Assignment, Held, INTERRUPT, Inputs, catch};
use crate::schedule::{ChunkId, Command, Core, Event, Plan, ProcessId, Shape, WorkerId};

/// A halo (a piece of an exchange) as it reached the coordinator: exported by a local
/// worker, as bytes from a worker process, or kept by a worker process for its own partition
/// (protocol 12, see [`frame::Halo`](crate::wire::frame::Halo)) until that partition's
/// `Begin` names it, or until the process sends it up (`Released`) before the partition
/// leaves it.
pub(crate) enum HeldHalo {
    Live(Piece),
    Bytes(bytes::Bytes),
    Kept(ProcessId),
}

impl HeldHalo {
    /// Another handle on the halo, for one more receiver: an allgather's piece goes to
    /// every partition. `None` for a live piece owned by its one receiver.
    pub(crate) fn share(&self) -> Option<HeldHalo> {
        match self {
            HeldHalo::Live(p) => p.share().map(HeldHalo::Live),
            HeldHalo::Bytes(b) => Some(HeldHalo::Bytes(b.clone())),
            HeldHalo::Kept(c) => Some(HeldHalo::Kept(*c)),
        }
    }

    /// The halos of an inbox, to begin partition `chunk` here. A halo still kept by a
    /// worker process never reached here: that process let the partition go without it.
    pub(crate) fn live<J: Job>(
        mut inbox: Inbox<HeldHalo>,
        hooks: &crate::job::Hooks<J>,
        chunk: ChunkId,
    ) -> Result<Inbox<Piece>> {
        let mut live = Vec::with_capacity(inbox.len());
        HeldHalo::live_into(&mut inbox, hooks, chunk, &mut live)?;
        Ok(live)
    }

    /// [`HeldHalo::live`] from buffers the barrier reuses: `inbox` is drained into `live`.
    pub(crate) fn live_into<J: Job>(
        inbox: &mut Inbox<HeldHalo>,
        hooks: &crate::job::Hooks<J>,
        chunk: ChunkId,
        live: &mut Inbox<Piece>,
    ) -> Result<()> {
        for (from, h) in inbox.drain(..) {
            live.push((
                from,
                match h {
                    HeldHalo::Live(h) => h,
                    HeldHalo::Bytes(b) => (hooks.decode_halo)(&b)?,
                    HeldHalo::Kept(conn) => return Err(kept_astray(conn, chunk)),
                },
            ));
        }
        Ok(())
    }

    /// The halos of an inbox on the wire, for partition `chunk` held by worker process
    /// `holder`: `inbox` is drained (the barrier reuses it). The pieces of the senders of
    /// `gathered` (an allgather's, by sender) are named, not carried: the process gets them
    /// once, in the phase's `Gathered`.
    pub(crate) fn wire<J: Job>(
        inbox: &mut Inbox<HeldHalo>,
        hooks: &crate::job::Hooks<J>,
        chunk: ChunkId,
        holder: ProcessId,
        gathered: &[(ChunkId, HeldHalo)],
    ) -> Result<Inbox<crate::wire::frame::Halo>> {
        use crate::wire::frame::Halo as Wire;
        let mut wire = Vec::with_capacity(inbox.len());
        for (from, h) in inbox.drain(..) {
            if gathered.binary_search_by_key(&from, |(c, _)| *c).is_ok() {
                wire.push((from, Wire::Gathered));
                continue;
            }
            wire.push((
                from,
                match h {
                    HeldHalo::Bytes(b) => Wire::Sent(b),
                    HeldHalo::Live(h) => Wire::Sent((hooks.encode_halo)(&h)?.into()),
                    HeldHalo::Kept(conn) if conn == holder => Wire::Kept,
                    HeldHalo::Kept(conn) => return Err(kept_astray(conn, chunk)),
                },
            ));
        }
        Ok(wire)
    }
}

/// Sorts the exports of a phase (by sender) into the inboxes of their `len` receivers,
/// each in sender order (`inboxes` is the barrier's, reused: emptied first). A piece
/// addressed to everyone (an allgather's) goes to every partition. A live piece owned by
/// one receiver addressed to everyone cannot be: it is an internal error.
///
/// The emptied outboxes go to `spare` (up to `len` of them), for the next phase's exports
/// (`Remotes::count_halos`): a phase then allocates no outbox. A handle on each piece
/// addressed to everyone goes to `gathered` (emptied first), by sender: worker processes
/// get those once each (`ToWorker::Gathered`).
pub(crate) fn route(
    exports: impl IntoIterator<Item = Option<Outbox<HeldHalo>>>,
    len: usize,
    inboxes: &mut Vec<Inbox<HeldHalo>>,
    spare: &mut Vec<Outbox<HeldHalo>>,
    gathered: &mut Vec<(ChunkId, HeldHalo)>,
) -> Result<()> {
    gathered.clear();
    inboxes.iter_mut().for_each(Vec::clear);
    inboxes.resize_with(len, Vec::new);
    for (from, out) in exports.into_iter().enumerate() {
        let Some(mut out) = out else { continue };
        for (to, h) in out.drain(..) {
            match to {
                Some(to) => {
                    if let Some(inbox) = inboxes.get_mut(to as usize) {
                        inbox.push((from as ChunkId, h));
                    }
                }
                None => {
                    for inbox in inboxes.iter_mut() {
                        let Some(h) = h.share() else {
                            return Err(Error::Internal(format!(
                                "partition {from} exported a piece for everyone that cannot be shared"
                            )));
                        };
                        inbox.push((from as ChunkId, h));
                    }
                    if gathered.last().is_some_and(|(c, _)| *c == from as ChunkId) {
                        return Err(Error::Internal(format!(
                            "partition {from} exported two pieces for everyone"
                        )));
                    }
                    gathered.push((from as ChunkId, h));
                }
            }
        }
        if spare.len() < len {
            spare.push(out);
        }
    }
    Ok(())
}

/// The neighbours of the owned partitions of `job` in `chunks` chunks (a chain for a
/// [`Partition`](crate::Partition), the declared graph for an
/// [`Exchange`](crate::Exchange)), checked.
///
/// # Errors
///
/// [`Error::Neighbours`] if the declared graph is not one; [`Error::Panicked`] if the job's
/// `neighbours` panicked.
pub(crate) fn shape_of<J: Job>(job: &J, chunks: u64, phase: u64) -> Result<Shape> {
    match J::OWNERSHIP.hooks.and_then(|h| h.neighbours) {
        None => Ok(Shape::chain(chunks)),
        Some(of) => catch(Site::Job { phase }, J::NAME, || {
            Shape::graph(chunks, |c| of(job, c, chunks))
        })?
        .map_err(|(chunk, problem)| Error::Neighbours {
            job: J::NAME,
            chunk,
            problem,
        }),
    }
}

/// A halo kept by worker process `conn` is needed for partition `chunk`, which is no longer
/// there: the process handed the partition back without the halo (`Released`).
fn kept_astray(conn: ProcessId, chunk: ChunkId) -> Error {
    Error::Cluster(crate::wire::Error::Rejected {
        peer: format!("worker process {conn}"),
        what: "a kept halo",
        reason: format!(
            "it kept a halo for partition {chunk} and handed the partition back without it"
        ),
        source: None,
    })
}

pub(crate) use super::links::{Guard, Locked, Shared};

/// A pause of the workers that a locked section of the state costs (they wait for the
/// lock), which the driver times and records.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Pause {
    /// A cut's marker ([`SNAPSHOT_PAUSE`](crate::metrics::SNAPSHOT_PAUSE)).
    Marker,
    /// A partition the cut waits for serialized as it ends
    /// ([`SNAPSHOT_PAUSE_DONE`](crate::metrics::SNAPSHOT_PAUSE_DONE)).
    Done,
}

/// The state of one job run, behind the job's mutex.
pub(crate) struct State<J: Job> {
    /// The run's configuration (the executor's, with the job's schedule).
    pub(crate) config: Arc<Config>,
    /// The job's input, loaded once (for outputs of partitions held here).
    pub(crate) inputs: Arc<Inputs<J>>,
    pub(crate) core: Core<J::Reducer, Held<J::Chunk>>,
    /// The job; `None` only while it is handed to the caller at the end.
    pub(crate) job: Option<Arc<J>>,
    pub(crate) phase: u64,
    /// Iterations of the finished phases.
    pub(crate) iterations_before: u64,
    pub(crate) result: Option<Result<Outcome<J>>>,
    /// Set once, when the result is stored (it stays set after the result is taken).
    pub(crate) ended: bool,
    /// Orders for local workers, carried out when the lock is released (`links.rs`).
    pub(crate) orders: Vec<Order<J>>,
    /// Operations on the snapshot store, started when the lock is released (`links.rs`).
    pub(crate) store_ops: Vec<super::links::StoreOp>,
    /// The core's command buffer, reused.
    pub(crate) out: Vec<Command<Held<J::Chunk>>>,
    /// The job's workers, local or remote (`members.rs`).
    pub(crate) members: Members<J>,
    /// Connections of worker processes (`remote.rs`).
    pub(crate) remote: Remotes,
    /// Snapshot bookkeeping (`snapshot.rs`).
    pub(crate) snap: Snapshots,
    /// Owned partitions: the pieces each done chunk of the phase exported, addressed,
    /// handed to their receivers at the barrier.
    pub(crate) exports: Vec<Option<Outbox<HeldHalo>>>,
    /// Owned partitions: who exchanges pieces with whom, checked when the run started.
    pub(crate) shape: Shape,
    /// The barrier's buffers, reused from phase to phase: each partition's pieces as they
    /// came, and one partition's as it begins.
    pub(crate) inboxes: (Vec<Inbox<HeldHalo>>, Inbox<Piece>),
    /// Owned partitions restored by a rollback and done in the snapshot's phase, placed on
    /// a worker process that exports their halos (`rollback.rs`): the barrier waits for
    /// them.
    pub(crate) exporting: IdSet<ChunkId>,
    /// Owned partitions: moves the core had counted at the last barrier (for the counter).
    pub(crate) moved: u64,
    /// Owned partitions lost: the rollback under way (`rollback.rs`).
    pub(crate) rollback: crate::schedule::RollbackMachine,
    /// The rollbacks done, for the handle.
    pub(crate) rollbacks: Vec<Rollback>,
    /// What the autoscaler did and learned, for the handle (`autoscale.rs`); `None` without
    /// a policy or before its first measurement.
    pub(crate) autoscale: Option<super::AutoscaleStatus>,
    /// Events from workers the ledger no longer had, dropped (`stale_event`).
    pub(crate) stale_events: u64,
    /// Since when the run recovers from its last rollback (until a phase is done again).
    pub(crate) recovering: Option<Duration>,
    /// A local recovery under way (`recovery.rs`): the barrier waits for it.
    pub(crate) recovery: Option<super::recovery::Recovery>,
    /// Local recoveries so far, for the handle, and the next one's number.
    pub(crate) recoveries: Vec<super::recovery::Recovered>,
    pub(crate) next_recovery: u64,
    /// Local recoveries given up for a rollback (another loss meanwhile, a failed replay).
    pub(crate) recoveries_abandoned: u64,
    /// Partitions a recovery given up had asked back of their buddy (`Surrender`): their
    /// answer is dropped when it comes.
    pub(crate) late_surrenders: IdSet<(ProcessId, ChunkId)>,
    /// Rollbacks' resets so far: the restored partitions placed on processes after the last
    /// one are the current placement (`Remotes::exports_asked`).
    pub(crate) placements: u64,
    /// The time since the run started, set by the driver each time it takes the lock: the
    /// state reads no clock.
    pub(crate) now: Duration,
    /// A pause of the workers this locked section costs, timed by the driver until the lock
    /// is released.
    pub(crate) pause: Option<Pause>,
    /// The last phase ended; its partitions are output and gathered (`finish.rs`).
    pub(crate) finishing: Option<super::finish::Finishing<J>>,
    /// Progress: the rate meter and the updates (`progress.rs`).
    pub(crate) published: Publisher,
    /// Metrics and timeline of the run (`watch.rs`).
    pub(crate) watch: super::watch::Watch,
}

impl<J: Job> State<J> {
    /// The state of a run starting at `phase` with this ledger.
    pub(crate) fn new(
        (config, inputs): (Arc<Config>, Arc<Inputs<J>>),
        (core, shape): (Core<J::Reducer, Held<J::Chunk>>, Shape),
        job: J,
        phase: u64,
        iterations_before: u64,
        snap: Snapshots,
        target: usize,
    ) -> State<J> {
        let phases = catch(Site::Job { phase }, J::NAME, || job.phases()).unwrap_or(None);
        let published = Publisher::new(
            Duration::ZERO,
            iterations_before + core.progress().0,
            phases,
        );
        State {
            remote: Remotes::with_copies(config.buddy_copies),
            config,
            inputs,
            core,
            job: Some(Arc::new(job)),
            phase,
            iterations_before,
            result: None,
            ended: false,
            orders: Vec::new(),
            store_ops: Vec::new(),
            placements: 0,
            now: Duration::ZERO,
            pause: None,
            out: Vec::new(),
            members: Members::new(target),
            snap,
            exports: Vec::new(),
            shape,
            inboxes: Default::default(),
            exporting: Default::default(),
            moved: 0,
            rollback: Default::default(),
            rollbacks: Vec::new(),
            autoscale: None,
            stale_events: 0,
            recovering: None,
            recovery: None,
            recoveries: Vec::new(),
            next_recovery: 0,
            recoveries_abandoned: 0,
            late_surrenders: IdSet::default(),
            finishing: None,
            published,
            watch: super::watch::Watch::new(J::NAME),
        }
    }
}

impl<J: Job> State<J> {
    /// Whether the job's outcome can be handed out: the job ended and no snapshot write it
    /// started is still in flight. A periodic snapshot written while the last phase ended
    /// commits (or fails) before `wait` returns, so that a program that removes its
    /// snapshots after `wait` never leaves a manifest whose parts it removed.
    pub(crate) fn outcome_ready(&self) -> bool {
        self.ended && !self.snap.cut.is_writing()
    }

    /// Wakes whoever waits for the outcome (the waiting thread's mailbox, an awaiting task).
    pub(crate) fn wake_waiters(&mut self) {
        self.orders.push(Order::Wake);
    }
}

impl<J: Job> State<J> {
    /// A worker's report: feeds it to the core, then settles (phase ends, worker target).
    /// A command for `me` is returned instead of sent.
    pub(crate) fn report(
        &mut self,
        event: Event<Held<J::Chunk>, Value<J>>,
        me: Option<WorkerId>,
    ) -> Option<Msg<J>> {
        let mine = self.feed(event, me);
        self.settle();
        mine
    }

    /// Feeds an event to the core and carries out the resulting commands; does not settle,
    /// so that `reconcile` can call it without re-entering itself. A command for `me` is
    /// returned instead of sent.
    pub(crate) fn feed(
        &mut self,
        event: Event<Held<J::Chunk>, Value<J>>,
        me: Option<WorkerId>,
    ) -> Option<Msg<J>> {
        match self.feed_at(event, me, None) {
            Ok(mine) => mine,
            // Local workers never send an event the ledger refuses; if one does, stop the
            // job rather than risk a wrong value.
            Err(rejected) => {
                self.fail(Error::Internal(rejected.to_string()));
                None
            }
        }
    }

    /// Feeds an event from a remote worker, with a `Done`'s output as it came over the wire:
    /// one the ledger refuses is returned (the connection is then dropped) and changes
    /// nothing.
    pub(crate) fn feed_checked(
        &mut self,
        event: Event<Held<J::Chunk>, Value<J>>,
        output_bytes: Option<bytes::Bytes>,
    ) -> std::result::Result<(), crate::schedule::Rejected> {
        self.feed_at(event, None, output_bytes).map(|_| ())
    }

    /// Feeds an event to the core and carries out the commands; returns the command for
    /// `me`, or the ledger's refusal. `output_bytes` is a `Done`'s output already encoded.
    fn feed_at(
        &mut self,
        event: Event<Held<J::Chunk>, Value<J>>,
        me: Option<WorkerId>,
        output_bytes: Option<bytes::Bytes>,
    ) -> std::result::Result<Option<Msg<J>>, crate::schedule::Rejected> {
        // A worker the ledger no longer has (lost, retired, left behind by a rollback) may
        // still have news on its way: it is late, not wrong, and is dropped and counted.
        if !matches!(event, Event::Joined { .. }) && !self.core.knows(event.worker()) {
            self.stale_event(&event);
            return Ok(None);
        }
        if let Event::Joined { worker } = &event {
            // The slots of one worker process are balanced as one (`schedule/owned.rs`).
            if let Some(Member::Remote(slot)) = self.members.get(*worker) {
                self.core.set_process(*worker, slot.conn);
            }
        }
        if self.snap.cut.is_open() {
            // Protocol step 2 of `schedule/cut.rs`: the output or handed-back state of a chunk
            // the cut waits for, from the worker the marker saw it on (an event the ledger
            // will refuse comes from another worker and does not reach the cut).
            match &event {
                Event::Done {
                    worker,
                    chunk,
                    output,
                    kept,
                    ..
                } if self.snap.cut.waits_for(*worker, *chunk) => {
                    let bytes = match output_bytes {
                        Some(b) => Ok(b),
                        None => crate::codec::encode("a chunk output", output)
                            .map(Into::into)
                            .map_err(Error::from),
                    };
                    // An owned partition that ended before its capture is serialized here,
                    // under the lock (it ended between the marker and its next step: for a
                    // band whose step is the whole band, the usual case). The lock is held
                    // meanwhile: a pause of the workers that need it, recorded as one (by
                    // the driver, which times the locked section).
                    let captured = bytes.and_then(|o| match kept.as_ref().map(Held::to_bytes) {
                        Some(Some(p)) => {
                            let p = p.map_err(Error::from)?;
                            Ok(Captured::Kept(o, snapshot::Part::New(p)))
                        }
                        // It stayed with the worker process that ran it.
                        Some(None) => {
                            if let Some(conn) = kept.as_ref().and_then(Held::elsewhere) {
                                self.snap.kept_by.insert(*chunk, conn);
                            }
                            Ok(Captured::KeptHeld(o))
                        }
                        None => Ok(Captured::Output(o)),
                    });
                    if matches!(captured, Ok(Captured::Kept(..))) {
                        self.pause = Some(Pause::Done);
                    }
                    self.captured(*worker, *chunk, captured);
                }
                Event::Yielded {
                    worker,
                    chunk,
                    state,
                    ..
                } if self.snap.cut.waits_for(*worker, *chunk) => {
                    let bytes = match state.to_bytes() {
                        Some(b) => b.map_err(Error::from),
                        None => Err(Error::Internal(
                            "a handed-back state that is not here".into(),
                        )),
                    };
                    let captured = bytes.map(|b| Captured::State(snapshot::Part::New(b)));
                    self.captured(*worker, *chunk, captured);
                }
                _ => {}
            }
        }
        let joined = matches!(event, Event::Joined { .. });
        let mut out = std::mem::take(&mut self.out);
        let phase = self.phase;
        // `handle` runs the reducer's `combine`: a panic there ends the job, not the worker.
        let mut rejected = None;
        match catch(Site::Reducer { phase }, J::NAME, || {
            self.core.handle(event, &mut out)
        }) {
            Ok(Ok(())) => {}
            Ok(Err(r)) => rejected = Some(r),
            Err(panic) => self.fail(panic),
        }
        let mine = self.execute(&mut out, me);
        self.out = out;
        if joined && rejected.is_none() {
            self.recall_grants();
        }
        match rejected {
            Some(r) => Err(r),
            None => Ok(mine),
        }
    }

    /// An event from a worker the ledger no longer has: dropped, logged and counted.
    fn stale_event(&mut self, event: &Event<Held<J::Chunk>, Value<J>>) {
        self.stale_events += 1;
        metrics::counter!(crate::metrics::STALE_EVENTS, "job" => J::NAME).increment(1);
        let kind = match event {
            Event::Joined { .. } => "joined",
            Event::Done { .. } => "done",
            Event::Yielded { .. } => "yielded",
            Event::StateReport { .. } => "state report",
            Event::Returned { .. } => "returned",
            Event::Retire { .. } => "retire",
            Event::Lost { .. } => "lost",
        };
        tracing::debug!(
            job = J::NAME,
            worker = event.worker(),
            kind,
            "an event from a worker the ledger no longer has: dropped"
        );
    }

    /// Carries out core commands; returns the one addressed to `me`.
    pub(crate) fn execute(
        &mut self,
        out: &mut Vec<Command<Held<J::Chunk>>>,
        me: Option<WorkerId>,
    ) -> Option<Msg<J>> {
        let mut mine = None;
        let mut failed = None;
        let mut released = Vec::new();
        for cmd in out.drain(..) {
            match cmd {
                Command::Run {
                    worker,
                    chunk,
                    range,
                    mut state,
                } => {
                    // A partition held by a worker process, for a local worker: its runner
                    // waits for the bytes.
                    let from = state.as_ref().and_then(Held::elsewhere);
                    if let (Some(Member::Local(_)), Some(from)) = (self.members.get(worker), from) {
                        state = Some(self.fetch_local(chunk, from));
                    }
                    match (self.members.get(worker), self.job.as_ref()) {
                        (Some(Member::Local(_)), Some(job)) => {
                            let msg = Msg::Run {
                                worker,
                                assignment: Assignment {
                                    chunk,
                                    phase: self.phase,
                                    chunks: self.core.plan().len(),
                                    range,
                                    state,
                                },
                                job: Arc::clone(job),
                            };
                            self.snap.on_run(chunk);
                            if me == Some(worker) {
                                mine = Some(msg);
                            } else {
                                self.orders.push(Order::Local(worker, msg));
                            }
                        }
                        (Some(Member::Remote(slot)), _) => {
                            let slot = *slot;
                            self.run_remote(&mut failed, worker, slot, chunk, range, state);
                        }
                        _ => {}
                    }
                }
                Command::Interrupt { worker } => match self.members.get(worker) {
                    Some(Member::Local(_)) => self.orders.push(Order::Raise(worker, INTERRUPT)),
                    Some(Member::Remote(slot)) => self.interrupt_remote(worker, *slot),
                    None => {}
                },
                Command::Release { worker } => match self.members.remove(worker) {
                    Some(Member::Local(_)) => {
                        if me == Some(worker) {
                            mine = Some(Msg::Release);
                        } else {
                            self.orders.push(Order::Local(worker, Msg::Release));
                        }
                    }
                    Some(Member::Remote(slot)) => {
                        self.release_remote(slot);
                        released.push(slot.conn);
                    }
                    None => {}
                },
            }
        }
        // After every command: a `Run` among them may ask a released slot's process for a
        // partition the slot gave back (the ledger no longer lists it as held there).
        for conn in released {
            self.end_if_drained(conn);
        }
        if let Some(e) = failed {
            if !self.ended {
                self.complete(Err(e));
            }
        }
        mine
    }

    /// After any change: end finished phases, then bring the workers to the target.
    pub(crate) fn settle(&mut self) {
        if !self.ended && !self.rolling_back() && !self.core.lost_partitions().is_empty() {
            // A finishing job rolls back like one at a barrier, and finishes again.
            self.finishing = None;
            self.partitions_lost(&[]);
        }
        if self.rolling_back() {
            self.reconcile();
            self.poll_rollback();
            self.members.update_gauge();
            self.watch_members();
            return;
        }
        // Partitions placed after a rollback export their halos where they are: the barrier
        // waits for them.
        while !self.ended
            && self.finishing.is_none()
            && self.recovery.is_none()
            && self.core.phase_complete()
            && self.exporting.is_empty()
        {
            self.end_phase();
        }
        self.poll_finish();
        self.reconcile();
        self.poll_cut();
        self.members.update_gauge();
        self.publish_progress(false);
        self.watch_members();
    }

    /// The barrier between phases: every chunk is done and no worker holds the job.
    fn end_phase(&mut self) {
        let phase = self.phase;
        let value = match catch(Site::Reducer { phase }, J::NAME, || {
            self.core.finish_phase()
        }) {
            Ok(v) => v,
            Err(e) => return self.fail(e),
        };
        let Some(arc) = self.job.take() else { return };
        // Workers drop their handle on the job before they report, and no chunk is pending,
        // so this is the last one.
        let mut job = match Arc::try_unwrap(arc) {
            Ok(job) => job,
            Err(arc) => {
                self.job = Some(arc);
                return self.fail(Error::Internal(
                    "job still shared at a phase barrier".into(),
                ));
            }
        };
        metrics::counter!(crate::metrics::PHASES, "job" => J::NAME).increment(1);
        self.watch_phase_end(phase);
        self.phase_done_after_rollback();
        // The job as it ran this phase, if the last output would need it.
        let ran = match super::finish::before_end_phase(&job, phase) {
            Ok(ran) => ran,
            Err(e) => return self.fail(e),
        };
        let next = match catch(Site::Job { phase }, J::NAME, || job.end_phase(&value)) {
            Ok(next) => next,
            Err(e) => return self.fail(e),
        };
        match next {
            Next::Finish => self.finish(job, value, phase, ran),
            Next::Continue => {
                let (plan, reducer, phases) =
                    match catch(Site::Job { phase: phase + 1 }, J::NAME, || {
                        let chunking = job.chunking().unwrap_or(self.config.chunking);
                        (
                            Plan::new(job.iterations(), self.config.schedule, chunking),
                            job.reducer(),
                            job.phases(),
                        )
                    }) {
                        Ok(x) => x,
                        Err(e) => return self.fail(e),
                    };
                if self.core.is_partitioned() {
                    if let Err(e) = self.begin_partitions(&job, &plan, phase + 1) {
                        self.job = None;
                        return self.fail(e);
                    }
                }
                self.iterations_before += self.core.progress().1;
                self.phase += 1;
                self.job = Some(Arc::new(job));
                let mut out = std::mem::take(&mut self.out);
                let started = catch(Site::Reducer { phase: phase + 1 }, J::NAME, || {
                    self.core.start_phase(plan, reducer, &mut out)
                });
                if let Err(e) = started {
                    self.out = out;
                    return self.fail(e);
                }
                // Nobody is waiting for a reply here: every worker is idle in its mailbox.
                let mine = self.execute(&mut out, None);
                debug_assert!(mine.is_none());
                self.out = out;
                self.published.phases = phases;
                self.publish_progress(true);
            }
        }
    }

    /// Keeps the halos a done chunk exported until the barrier.
    pub(crate) fn keep_halos(&mut self, chunk: ChunkId, halos: Outbox<HeldHalo>) {
        let c = chunk as usize;
        if self.exports.len() <= c {
            self.exports
                .resize_with(self.core.plan().len().max(c as u64 + 1) as usize, || None);
        }
        if let Some(r) = self.recovery.as_mut() {
            // Pushed to a process lost since (its answer came before the loss, this report
            // after): refilled from the sender's log too.
            r.kept_at_lost(chunk, &halos);
        }
        self.exports[c] = Some(halos);
    }

    /// Owned partitions at the barrier: checks that the next phase is cut as the job's first,
    /// then hands each kept partition its neighbours' halos ([`Partition::begin_phase`]).
    /// A partition restored from a snapshot is decoded here, and one whose halos were not
    /// exported in this run (it finished before the snapshot it was restored from) exports
    /// them now; restored partitions are decoded and export on every core
    /// ([`decode_restored`]).
    ///
    /// [`Partition::begin_phase`]: crate::Partition::begin_phase
    fn begin_partitions(&mut self, job: &J, plan: &Plan, next: u64) -> Result<()> {
        let now = self.core.plan();
        if plan != now {
            return Err(Error::PartitionsChanged {
                job: J::NAME,
                phase: next,
                expected: now.iterations(),
                expected_chunks: now.len(),
                found: plan.iterations(),
                found_chunks: plan.len(),
            });
        }
        let Some(hooks) = J::OWNERSHIP.hooks else {
            return Ok(());
        };
        let len = plan.len() as usize;
        self.exports.resize_with(len, || None);
        let phase = next - 1;
        let chunks = plan.len();
        // Restored partitions (still the snapshot's bytes): decoded, and their halos
        // exported, here, on as many threads as the machine has. What a partition held here
        // exports at a barrier is the coordinator's halo log of that phase (`HERE`);
        // unrecorded, a copy of that phase could not be replayed, its neighbour's log
        // beginning a phase later.
        let mut restored = Vec::new();
        for (chunk, held) in self.core.kept_mut() {
            if let Held::Bytes(b) = held {
                let export = self.exports[chunk as usize].is_none();
                restored.push((chunk, std::mem::take(b), export));
            }
        }
        if !restored.is_empty() {
            let mut decoded: IdMap<ChunkId, Decoded<J>> =
                IdMap::with_capacity_and_hasher(restored.len(), Default::default());
            // The first error in chunk order, as when they were decoded one by one.
            for (chunk, r) in decode_restored(job, hooks.export, (phase, chunks), restored)? {
                // Still the snapshot's bytes: one that does not decode names it.
                decoded.insert(
                    chunk,
                    r.map_err(|e| self.snap.from_snapshot.blame(chunk, e))?,
                );
            }
            for (chunk, held) in self.core.kept_mut() {
                if let Some((live, halos)) = decoded.remove(&chunk) {
                    *held = Held::Live(Box::new(live));
                    if let Some(out) = halos {
                        self.exports[chunk as usize] = Some(live_outbox(out));
                        self.remote
                            .buddies
                            .exported(chunk, super::copies::HERE, phase);
                    }
                }
            }
        }
        for (chunk, held) in self.core.kept_mut() {
            let slot = &mut self.exports[chunk as usize];
            if slot.is_none() {
                if let Held::Live(c) = held {
                    let at = At {
                        chunk,
                        chunks,
                        phase,
                    };
                    let out = catch(Site::Chunk { phase, chunk }, J::NAME, || {
                        (hooks.export)(c, job, at)
                    })?;
                    *slot = Some(live_outbox(out));
                    self.remote
                        .buddies
                        .exported(chunk, super::copies::HERE, phase);
                }
            }
        }
        // Every chunk's pieces, sorted into their receivers' inboxes.
        let (mut inboxes, mut live) = std::mem::take(&mut self.inboxes);
        // An allgather's pieces, by sender (nothing allocated in other phases).
        let mut everyone = Vec::new();
        route(
            self.exports.drain(..),
            len,
            &mut inboxes,
            &mut self.remote.spare,
            &mut everyone,
        )?;
        // What partitions gather at this barrier, built once for all (`Pieces::concat`).
        let gathered = crate::exchange::Gathered::default();
        let mut remote_begins = Vec::with_capacity(len);
        // Partitions in the coordinator's own hands need no copy (`copies.rs`).
        let mut live_here = Vec::new();
        let copies_due = self.remote.buddies.due(phase);
        for (chunk, held) in self.core.kept_mut() {
            // The partition changes: no part of it in the store is current any more.
            self.snap.on_run(chunk);
            let Some(inbox) = inboxes.get_mut(chunk as usize) else {
                return Err(Error::Internal(format!(
                    "partition {chunk} is past the job's {len} chunks at the barrier"
                )));
            };
            match held {
                Held::Live(part) => {
                    if copies_due {
                        live_here.push(chunk);
                    }
                    live.clear();
                    HeldHalo::live_into(inbox, &hooks, chunk, &mut live)?;
                    catch(Site::Chunk { phase: next, chunk }, J::NAME, || {
                        (hooks.begin)(part, job, chunk, &mut live, Some(&gathered))
                    })?;
                }
                // Held by a worker process: it gets the halos after the new job value; one on
                // its way back here (its holder leaves) takes them when it arrives.
                Held::Elsewhere(conn) => match self.remote.fetching(chunk) {
                    Some(fetch) => *fetch = Fetch::Begin(std::mem::take(inbox)),
                    None => remote_begins.push((
                        *conn,
                        chunk,
                        HeldHalo::wire(inbox, &hooks, chunk, *conn, &everyone)?,
                    )),
                },
                Held::Bytes(_) | Held::Fetch(_) | Held::Asked(_) => {
                    return Err(Error::Internal(format!(
                        "partition {chunk} is not at hand at the barrier"
                    )));
                }
            }
        }
        inboxes.iter_mut().for_each(Vec::clear);
        live.clear();
        self.inboxes = (inboxes, live);
        // Halos released for the phase that ended found their sender's `Done` by now (those
        // that did not were released for nobody).
        self.remote.early.clear();
        if !live_here.is_empty() {
            self.remote.drop_copies_of(&live_here, phase);
        }
        let copies = self.remote.buddies.enabled();
        if !remote_begins.is_empty() || copies {
            let job_bytes = bytes::Bytes::from(crate::codec::encode_for_workers("the job", job)?);
            if copies {
                // A replay from a copy runs this phase again with this value.
                self.remote.buddies.job_value(next, job_bytes.clone());
            }
            if !remote_begins.is_empty() {
                // Each process gets an allgather's pieces once; each is encoded once.
                let pieces = everyone
                    .into_iter()
                    .map(|(from, h)| {
                        Ok((
                            from,
                            match h {
                                HeldHalo::Bytes(b) => b,
                                HeldHalo::Live(p) => (hooks.encode_halo)(&p)?.into(),
                                HeldHalo::Kept(conn) => return Err(kept_astray(conn, from)),
                            },
                        ))
                    })
                    .collect::<Result<Vec<_>>>()?;
                self.remote
                    .begin_remote((next, plan.len()), job_bytes, remote_begins, pieces);
            }
        }
        // Every partition changed: nothing of the last snapshot can be reused.
        self.snap.cache.clear();
        let moved = self.core.partitions_moved();
        metrics::counter!(crate::metrics::PARTITIONS_MOVED, "job" => J::NAME)
            .increment(moved - self.moved);
        self.moved = moved;
        let (kept, relayed, direct) = std::mem::take(&mut self.remote.halos);
        if kept + relayed + direct > 0 {
            metrics::counter!(crate::metrics::HALOS, "job" => J::NAME, "route" => "kept")
                .increment(kept);
            metrics::counter!(crate::metrics::HALOS, "job" => J::NAME, "route" => "relayed")
                .increment(relayed);
            metrics::counter!(crate::metrics::HALOS, "job" => J::NAME, "route" => "direct")
                .increment(direct);
        }
        Ok(())
    }

    /// Ends the run with an error: every worker is retired (running ones hand their chunk
    /// back at their next adjustment point and exit).
    pub(crate) fn fail(&mut self, error: Error) {
        if !self.ended {
            self.complete(Err(error));
        }
    }

    /// Stores the result, stops every worker and wakes whoever waits.
    pub(crate) fn complete(&mut self, result: Result<Outcome<J>>) {
        self.watch_end(&result);
        self.result = Some(result);
        self.ended = true;
        // A snapshot that cannot complete any more (its chunks will not be captured) or has
        // not started: its requesters get an error rather than wait forever.
        for r in self.snap.end() {
            self.answer(r, Err(Error::Ended { job: J::NAME }));
        }
        let mut out = std::mem::take(&mut self.out);
        self.core.halt(&mut out);
        let ids: Vec<WorkerId> = self.members.locals().map(|(w, _)| w).collect();
        for w in ids {
            let _ = self.core.handle(Event::Retire { worker: w }, &mut out);
        }
        let mine = self.execute(&mut out, None);
        debug_assert!(mine.is_none());
        self.out = out;
        self.end_remotes();
        self.publish_progress(true);
        self.wake_waiters();
    }
}

/// A restored partition at the barrier as it comes out of [`decode_restored`]: the live
/// partition and, if it was asked for, the halos it exports.
type Decoded<J> = (<J as Job>::Chunk, Option<Outbox<Piece>>);

/// Live pieces, as the barrier keeps them.
fn live_outbox(out: Outbox<Piece>) -> Outbox<HeldHalo> {
    out.into_iter()
        .map(|(to, p)| (to, HeldHalo::Live(p)))
        .collect()
}

/// Decodes the partitions restored from a snapshot (`(chunk, bytes, export)`) and exports
/// the halos of those asked to, at the barrier of phase `phase`; the results in chunk order.
///
/// They are spread over as many scoped threads as the machine has, as `encode_pending`
/// spreads a cut's encoding, instead of one after the other: after a rollback most of the
/// grid is restored here, under the job's lock, while every worker waits for the next phase
/// (`BENCHMARKS.md`, owned partitions, has the figures). Each partition is
/// decoded and exported on its own, so the result is the one the serial loop gave: a
/// partition that does not decode is [`Error::Codec`] (which the caller blames on the
/// snapshot the run was restored from: `from_snapshot.rs`), a panic in the job's code (its
/// `Deserialize` or `export`) is [`Error::Panicked`] at the chunk.
///
/// # Errors
///
/// Per chunk, as above; [`Error::Internal`] if a helper thread could not give its results.
fn decode_restored<J: Job>(
    job: &J,
    export: fn(&J::Chunk, &J, At) -> Outbox<Piece>,
    (phase, chunks): (u64, u64),
    parts: Vec<(ChunkId, bytes::Bytes, bool)>,
) -> Result<Vec<(ChunkId, Result<Decoded<J>>)>> {
    let one = |(chunk, bytes, exports): (ChunkId, bytes::Bytes, bool)| {
        let site = Site::Chunk { phase, chunk };
        let live = catch(site.clone(), J::NAME, || {
            crate::codec::decode::<J::Chunk>("a chunk state", &bytes)
        })
        .and_then(|r| r.map_err(Error::from));
        drop(bytes);
        let r = live.and_then(|c| {
            if !exports {
                return Ok((c, None));
            }
            let at = At {
                chunk,
                chunks,
                phase,
            };
            let halos = catch(site, J::NAME, || export(&c, job, at))?;
            Ok((c, Some(halos)))
        });
        (chunk, r)
    };
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(parts.len());
    if threads < 2 {
        return Ok(parts.into_iter().map(one).collect());
    }
    let mut groups: Vec<Vec<_>> = (0..threads).map(|_| Vec::new()).collect();
    for (i, p) in parts.into_iter().enumerate() {
        groups[i % threads].push(p);
    }
    let one = &one;
    let joined: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = groups
            .into_iter()
            .map(|group| scope.spawn(move || group.into_iter().map(one).collect::<Vec<_>>()))
            .collect();
        handles.into_iter().map(|h| h.join()).collect()
    });
    let mut all = Vec::new();
    for j in joined {
        all.extend(j.map_err(|_| {
            Error::Internal("a thread decoding restored partitions stopped".into())
        })?);
    }
    all.sort_by_key(|(c, _)| *c);
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{Chunk, Partition, Step};
    use serde::{Deserialize, Serialize};

    /// A partitioned job whose partition `panic_at` panics when it exports.
    #[derive(Serialize, Deserialize)]
    struct Strips {
        panic_at: u64,
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Strip {
        chunk: u64,
        cells: Vec<u64>,
    }

    impl Job for Strips {
        const NAME: &'static str = "strips";
        const OWNERSHIP: crate::Ownership<Self> = crate::Ownership::PARTITIONS;
        type Chunk = Strip;
        type Reducer = crate::reduce::Sum<u64>;
        type Input = ();
        fn iterations(&self) -> u64 {
            8
        }
        fn chunk(&self, range: std::ops::Range<u64>) -> Strip {
            Strip {
                chunk: range.start,
                cells: Vec::new(),
            }
        }
        fn reducer(&self) -> Self::Reducer {
            crate::reduce::Sum::new()
        }
    }

    impl Chunk for Strip {
        type Job = Strips;
        type Output = u64;
        fn step(&mut self, _: &Strips, _: &()) -> Step<u64> {
            Step::Done(0)
        }
    }

    impl Partition for Strip {
        type Halo = u64;
        fn export(&self, job: &Strips) -> (u64, u64) {
            assert!(self.chunk != job.panic_at, "export of {}", self.chunk);
            (self.cells[0], self.cells[self.cells.len() - 1])
        }
        fn begin_phase(&mut self, _: &Strips, _: Option<u64>, _: Option<u64>) {}
    }

    fn strip(chunk: u64) -> Strip {
        Strip {
            chunk,
            cells: (0..1000).map(|i| chunk * 10_000 + i).collect(),
        }
    }

    /// The halos of strip `c` of 10, in the middle (one for the chunk before, one for the
    /// chunk after).
    fn halos(c: u64, h: Option<Outbox<Piece>>) -> Option<(u64, u64)> {
        h.map(|out| {
            let v: Vec<(Option<u64>, u64)> = out
                .into_iter()
                .map(|(to, p)| (to, p.take::<u64>().unwrap()))
                .collect();
            assert_eq!(v.len(), 2);
            assert_eq!((v[0].0, v[1].0), (Some(c - 1), Some(c + 1)));
            (v[0].1, v[1].1)
        })
    }

    /// Restored partitions decoded at the barrier on several threads come back in chunk
    /// order, each its own partition with its own halos (only where asked); one that does not
    /// decode is `Codec` and one whose export panics is `Panicked` at its chunk, the others
    /// decode all the same.
    #[test]
    fn restored_partitions_decode_in_parallel_each_as_alone() {
        let job = Strips { panic_at: 5 };
        let export = crate::job::Ownership::<Strips>::PARTITIONS
            .hooks
            .unwrap()
            .export;
        let mut parts: Vec<(ChunkId, bytes::Bytes, bool)> = (0..9u64)
            .rev()
            .map(|c| {
                let bytes = crate::codec::encode("a chunk state", &strip(c)).unwrap();
                (c, bytes.into(), c % 3 != 0)
            })
            .collect();
        parts[4].1 = bytes::Bytes::from_static(&[0xff; 3]); // chunk 4
        let got = decode_restored(&job, export, (7, 10), parts).unwrap();
        assert_eq!(
            got.iter().map(|(c, _)| *c).collect::<Vec<_>>(),
            (0..9).collect::<Vec<_>>()
        );
        for (c, r) in got {
            match c {
                4 => assert!(
                    matches!(
                        r,
                        Err(Error::Codec {
                            what: "a chunk state",
                            ..
                        })
                    ),
                    "{c}"
                ),
                5 => assert!(
                    matches!(
                        &r,
                        Err(Error::Panicked { site: Site::Chunk { phase: 7, chunk: 5 }, message, .. })
                            if message.contains("export of 5")
                    ),
                    "{c}"
                ),
                _ => {
                    let (live, h) = r.unwrap();
                    assert_eq!(live, strip(c));
                    let want = (c % 3 != 0).then(|| (c * 10_000, c * 10_000 + 999));
                    assert_eq!(halos(c, h), want, "{c}");
                }
            }
        }
        assert!(
            decode_restored(&job, export, (7, 10), Vec::new())
                .unwrap()
                .is_empty()
        );
    }

    /// A halo kept by a worker process goes back to it as `Kept` only for a partition it
    /// still holds: needed here, or by another process, it is a typed error naming the
    /// process (it handed the partition back without the halo), never a silent stale halo.
    #[test]
    fn a_kept_halo_is_named_back_only_to_its_keeper() {
        use crate::wire::frame::Halo as Wire;
        const P3: ProcessId = ProcessId(3);
        let hooks = crate::job::Ownership::<Strips>::PARTITIONS.hooks.unwrap();
        let wire = |h, holder| HeldHalo::wire(&mut vec![(4, h)], &hooks, 5, holder, &[]);
        assert_eq!(wire(HeldHalo::Kept(P3), P3).unwrap(), vec![(4, Wire::Kept)]);
        let sent = wire(HeldHalo::Live(Piece::Own(Box::new(7u64))), P3).unwrap();
        assert_eq!(
            sent,
            vec![(
                4,
                Wire::Sent(crate::codec::encode("h", &7u64).unwrap().into())
            )]
        );
        let astray = |r: Result<_>| match r {
            Err(Error::Cluster(crate::wire::Error::Rejected {
                peer, what, reason, ..
            })) => {
                assert_eq!(peer, "worker process 3");
                assert_eq!(what, "a kept halo");
                assert!(reason.contains("partition 5"), "{reason}");
            }
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("accepted"),
        };
        astray(wire(HeldHalo::Kept(P3), ProcessId(4)).map(|_| ()));
        astray(HeldHalo::live(vec![(4, HeldHalo::Kept(P3))], &hooks, 5).map(|_| ()));
        let bytes = crate::codec::encode("h", &9u64).unwrap();
        let live = HeldHalo::live(vec![(6, HeldHalo::Bytes(bytes.into()))], &hooks, 5).unwrap();
        assert_eq!(live.len(), 1);
        let (from, piece) = live.into_iter().next().unwrap();
        assert_eq!((from, piece.take::<u64>()), (6, Some(9)));
    }
}
