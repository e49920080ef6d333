//! Owned partitions lost with a worker process: the job rolls back to its latest committed
//! snapshot, automatically, and goes on with the workers it has left.
//!
//! A partition lives only where it ran (`Held::Elsewhere`); after the first phase it cannot
//! be made again from nothing, so a worker process that dies with partitions takes state
//! the job needs. Every other worker's state is newer than any snapshot, and a phase mixes
//! neighbours' halos, so the only consistent state to go back to is a whole committed cut.
//!
//! Which step comes next, to which snapshot, and whether a loss starts the rollback over or
//! ends the job is decided by the pure [`RollbackMachine`](crate::schedule::RollbackMachine)
//! (`schedule/rollback.rs`, unit-tested through every ordering of losses, commits and
//! reads); this file carries its commands out: it halts, reads, resets and places.
//!
//! 1. *Halt.* The loss is noticed (`drop_conn`, or the core when a running partition had no
//!    copy): the core stops handing out chunks and every running chunk is interrupted. A
//!    local worker hands its chunk back; a worker process drops its chunks (`Abandon`,
//!    answered by `Abandoned`) instead of sending back states that the reset throws away
//!    (a band's state is megabytes).
//!    Snapshot requests stay queued; no new cut starts.
//! 2. *Quiesce.* The run waits until no chunk runs, no partition is on its way between
//!    workers (`Surrender`) and no snapshot is being written (a write in flight that commits
//!    is a newer restore point, and it is the one taken). Local workers whose partition was on
//!    its way from the lost process leave and are replaced at once (`threads.rs`,
//!    `abandon`), so that the replacement joins the restored ledger in step 4 and is dealt
//!    partitions with the others.
//! 3. *Read.* The manifest of the snapshot the run last committed (or resumed from) is read
//!    on the I/O runtime, outside the lock; the parts stay in the store for now.
//! 4. *Reset.* Under the lock the ledger, the job value, the phase and the snapshot
//!    bookkeeping are replaced by the snapshot's, and the restored ledger is halted; every
//!    worker process is told to forget the partitions it holds (`Forget`) and gets the job
//!    value again before its next chunk; every worker joins the restored ledger. Requests
//!    waiting for a snapshot (or a suspend) are asked again of the restored run.
//! 5. *Place.* Every restored partition that a process which reads the store runs next goes
//!    to it as a reference to the snapshot's part (`PlacePart`): the process reads it, size
//!    and checksum checked, while the coordinator goes on.
//! 6. *Read the rest.* The coordinator reads the parts it hands out itself (those of local
//!    workers, and of processes that do not read the store), checked; those processes get
//!    theirs as bytes (`Place`); then the restored ledger hands out chunks. Those that ended
//!    the snapshot's phase export their halos where they are placed (`Exported`); the
//!    barrier waits for them. A loss before this step ends reads the snapshot again.
//!
//! Why in this order: the processes read their parts while the coordinator reads only what
//! it hands out itself, so the time from the loss to the next phase holds one read of the
//! grid, not two; restored partitions go to their processes at once, not with each `Run`,
//! and export their halos where they are (`BENCHMARKS.md`, recovery, has the figures).
//!
//! The value stays exact: the restored run is the run a `resume` of that snapshot would be,
//! with the same workers (see `io.rs`). A run that committed no snapshot yet (none taken,
//! or none written since it started) goes back to the start of its first phase if the loss
//! came there (every partition is made anew from the job value, which no phase changed
//! yet); in a later phase it has nothing to go back to and ends with
//! [`Error::PartitionsLost`]. A snapshot that cannot be read back ends it with
//! [`Error::RollbackFailed`] naming why.

use crate::schedule::idhash::IdMap;
use std::sync::Arc;
use std::time::Duration;

use super::io::{Restored, read_manifest, restore};
use super::job_run::State;
use super::links::StoreOp;
use super::members::Member;
use super::remote::Fetch;
use super::snapshot::{SnapshotConfig, Snapshots};
use crate::error::Error;
use crate::job::Job;
use crate::run::Held;
use crate::schedule::ProcessId;
use crate::schedule::{ChunkId, Event, RollbackCommand, RollbackRecord, WorkerId};
use crate::snapshot::{PartRef, SnapshotId};
use crate::wire::frame::ToWorker;

/// A rollback the job went through, from [`JobHandle::rollbacks`](crate::JobHandle::rollbacks).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Rollback {
    /// The chunks whose partitions were lost.
    pub lost: Vec<ChunkId>,
    /// The phase the job was in when they were lost.
    pub from_phase: u64,
    /// The epoch of the snapshot it went back to.
    pub epoch: u64,
    /// The phase of that snapshot.
    pub to_phase: u64,
    /// From the loss until no chunk of the lost run was running any more.
    pub quiesce: Duration,
    /// Reading the snapshot back from the store at the coordinator: the manifest, and the
    /// parts it hands out itself (checksums checked). Worker processes that read the store
    /// read their own parts meanwhile, and those are not in it.
    pub read: Duration,
    /// From the loss until the restored run handed out its first chunks.
    pub restart: Duration,
    /// From the loss until the restored run finished a phase again; `None` until then.
    pub recovered: Option<Duration>,
    /// Times the rollback started over because a worker process was lost with restored
    /// partitions before the coordinator had read its own parts (step 6); 0 mostly. `lost`
    /// counts the partitions of every loss.
    pub started_over: u64,
    /// The loss came in the job's first phase with no snapshot committed: the run went back
    /// to the start of that phase, its partitions made anew from the job value (`epoch` is 0
    /// then, nothing was read, and the timeline has no rollback events for it).
    pub from_start: bool,
}

impl<J: Job> State<J> {
    /// Whether a rollback is under way (the core is halted and must stay so).
    pub(crate) fn rolling_back(&self) -> bool {
        self.rollback.is_under_way()
    }

    /// Owned partitions were lost: roll back to the latest committed snapshot, or end the job
    /// with [`Error::PartitionsLost`] if there is none. `lost` adds chunks the core does not
    /// know as lost yet (a process's held partitions, noticed before its slots leave).
    pub(crate) fn partitions_lost(&mut self, lost: &[ChunkId]) {
        if self.ended {
            return;
        }
        let mut chunks: Vec<ChunkId> = self.core.lost_partitions().to_vec();
        chunks.extend_from_slice(lost);
        let before = self.rollback.attempt();
        if before.is_none() {
            tracing::warn!(job = J::NAME, lost = ?chunks, phase = self.phase, "owned partitions were lost");
        }
        let mut out = Vec::new();
        let (committed, writing) = (self.snap.last_epoch, self.snap.cut.is_writing());
        let now = self.now;
        self.rollback
            .lost(&chunks, self.phase, committed, writing, now, &mut out);
        if before.is_some() && self.rollback.attempt() != before {
            tracing::warn!(job = J::NAME, lost = ?chunks, "owned partitions were lost while the job rolled back: rolling back again");
        } else if before.is_none() && committed.is_none() && writing && self.rollback.is_under_way()
        {
            tracing::warn!(
                job = J::NAME,
                "the first snapshot is being written: rolling back to it if it commits"
            );
        }
        self.rollback_commands(out, None);
    }

    /// Carries out what the rollback machine decided; `error` is why a read failed.
    fn rollback_commands(&mut self, out: Vec<RollbackCommand>, mut error: Option<Error>) {
        for cmd in out {
            match cmd {
                RollbackCommand::Halt => {
                    // A cut whose marker is out cannot complete: the chunks it waits for
                    // are dropped (step 1), and what a dropped chunk leaves is no state.
                    self.cut_gives_way();
                    self.drive_core(crate::schedule::Core::halt);
                }
                RollbackCommand::Started { lost, epoch } => {
                    metrics::counter!(crate::metrics::ROLLBACKS, "job" => J::NAME).increment(1);
                    match epoch {
                        Some(epoch) => {
                            tracing::warn!(
                                job = J::NAME,
                                ?lost,
                                epoch,
                                "rolling back to the latest committed snapshot"
                            );
                            self.watch_rollback(&lost, epoch);
                        }
                        None => {
                            tracing::warn!(
                                job = J::NAME,
                                ?lost,
                                "no snapshot to roll back to in the first phase: it starts again"
                            );
                        }
                    }
                }
                RollbackCommand::Rebuild { attempt } => self.rebuild_first_phase(attempt),
                RollbackCommand::ReadManifest { epoch, attempt } => {
                    self.read_manifest(epoch, attempt);
                }
                // Carried out by `rolled_back`, which asked.
                RollbackCommand::Reset => {}
                RollbackCommand::Restart(record) => self.restart_restored(record),
                RollbackCommand::NothingToRollBackTo { lost } => {
                    self.nothing_to_roll_back_to(lost);
                }
                RollbackCommand::Failed { lost, epoch } => {
                    let e = error
                        .take()
                        .unwrap_or_else(|| Error::Internal("a read failed without a cause".into()));
                    tracing::warn!(job = J::NAME, epoch, error = %e, "the snapshot to roll back to could not be read: the job ends");
                    self.fail(Error::RollbackFailed {
                        job: J::NAME,
                        epoch,
                        lost,
                        source: Box::new(e),
                    });
                }
            }
        }
    }

    /// Owned partitions were lost and no snapshot was committed (nor is one being written):
    /// the job ends with [`Error::PartitionsLost`].
    fn nothing_to_roll_back_to(&mut self, chunks: Vec<ChunkId>) {
        tracing::warn!(job = J::NAME, lost = ?chunks, "owned partitions were lost and no snapshot was committed: the job ends");
        self.fail(Error::PartitionsLost {
            job: J::NAME,
            chunks,
        });
    }

    /// Step 2: once the run is quiet, the machine decides what to read back (step 3).
    pub(crate) fn poll_rollback(&mut self) {
        if self.ended || !self.rolling_back() {
            return;
        }
        let quiet = self.core.running().next().is_none()
            && self.remote.fetches_empty()
            && !self.snap.cut.is_writing();
        let mut out = Vec::new();
        let now = self.now;
        self.rollback
            .poll(quiet, self.snap.last_epoch, now, &mut out);
        self.rollback_commands(out, None);
    }

    /// Step 3: reads the manifest of `epoch` back, for `attempt` (`read_back`).
    fn read_manifest(&mut self, epoch: u64, attempt: u64) {
        self.store_ops
            .push(StoreOp::ReadManifest { epoch, attempt });
    }

    /// Step 4's reset, shared by a rollback to a snapshot and a restart of the first phase:
    /// the ledger, the job value (unless `job` is `None`: the first phase's is the one
    /// running), the phase and the snapshot bookkeeping are replaced, the restored ledger is
    /// halted, worker processes forget the partitions they hold, every worker joins the
    /// restored ledger, and requests waiting for a snapshot (or a suspend) are asked again of
    /// it.
    fn reset_run(
        &mut self,
        core: crate::executor::JobCore<J>,
        job: Option<J>,
        phase: u64,
        iterations_before: u64,
        snap: Snapshots,
    ) {
        // Requests waiting for a snapshot are asked again of the restored run (below; no cut
        // starts while the rollback lasts).
        let (requests, suspend) = self.snap.cut.take_requests();
        let old = std::mem::replace(&mut self.snap, snap);
        self.snap.longest = old.longest;
        (self.snap.failures, self.snap.resumed) = (old.failures, old.resumed);
        // A part asked of a process before the rollback may still come back: it is taken
        // (and dropped) rather than counted as a broken peer.
        self.snap.held_outstanding = old.held_outstanding;
        self.snap.markers = old.markers;
        self.snap.captures_outstanding = old.captures_outstanding;
        self.core = core;
        if let Some(job) = job {
            self.job = Some(Arc::new(job));
        }
        self.phase = phase;
        self.iterations_before = iterations_before;
        self.exports.clear();
        self.exporting.clear();
        self.moved = 0;
        // Answers to the placements of an earlier attempt are dropped from now on: they quote
        // an older number, and nobody waits for them.
        self.placements += 1;
        self.remote.exports_asked.clear();
        // Partitions asked back after the run went quiet (a process retired while the
        // snapshot was read) are the old run's: their bytes, when they come, would replace
        // the restored ones. Nobody waits for them (a local runner that did is answered).
        for (chunk, fetch) in self.remote.drop_fetches() {
            if let Fetch::Local = fetch {
                let gone = Error::PartitionGone {
                    job: J::NAME,
                    chunk,
                };
                self.orders
                    .push(super::links::Order::Fetched(chunk, Err(gone)));
            }
        }
        self.remote.forget_partitions();
        self.end_drained_remotes();
        // Nothing runs until every state the coordinator hands out is read.
        self.drive_core(crate::schedule::Core::halt);
        // A suspend asked for halts the restored ledger before anyone joins it.
        if let Some(replies) = suspend {
            let mut out = std::mem::take(&mut self.snap.out);
            self.snap.cut.suspend(None, &mut out);
            for r in replies {
                self.snap.cut.suspend(Some(r), &mut out);
            }
            self.cut_commands(&mut out);
            self.snap.out = out;
        }
        for r in requests {
            self.snap.cut.request(r);
        }
        let members: Vec<WorkerId> = self.members.ids().collect();
        for worker in members {
            let _ = self.feed(Event::Joined { worker }, None);
            // A thread or a worker process retired during the rollback leaves the restored
            // ledger too.
            let retiring = match self.members.get(worker) {
                Some(Member::Local(l)) => l.retiring,
                Some(Member::Remote(slot)) => self.remote.is_retiring(slot.conn),
                None => false,
            };
            if retiring {
                let _ = self.feed(Event::Retire { worker }, None);
            }
        }
    }

    /// Step 3 without a snapshot, in the job's first phase (for `attempt`): the run starts
    /// that phase again, every partition made anew from the job value, which no phase has
    /// changed yet. Nothing is read: the restored run restarts at once.
    fn rebuild_first_phase(&mut self, attempt: u64) {
        let Some(job) = self.job.clone() else { return };
        let core = match super::first_phase(&*job, &self.config) {
            Ok((core, _)) => core,
            Err(e) => return self.fail(e),
        };
        let mut out = Vec::new();
        let now = self.now;
        self.rollback.manifest_read(attempt, true, now, &mut out);
        if !out.contains(&RollbackCommand::Reset) {
            return;
        }
        tracing::warn!(
            job = J::NAME,
            "no snapshot was committed: the first phase starts again, its partitions made anew"
        );
        self.reset_run(core, None, 0, 0, Snapshots::default());
        self.parts_read(attempt, Ok(Vec::new()));
    }

    /// Step 4: the snapshot's manifest is read (or could not be); the run is reset to it,
    /// halted, its workers join and its partitions are placed on the processes that read
    /// them from the store themselves (step 5); then the coordinator reads the parts it
    /// needs (step 6: those of local workers and of processes that do not read the store).
    pub(crate) fn rolled_back(&mut self, restored: crate::Result<Restored<J>>, attempt: u64) {
        if self.ended {
            return;
        }
        let mut out = Vec::new();
        let now = self.now;
        self.rollback
            .manifest_read(attempt, restored.is_ok(), now, &mut out);
        let Restored {
            job,
            core,
            manifest,
            ..
        } = match restored {
            Ok(r) if out.contains(&RollbackCommand::Reset) => r,
            Ok(_) => return,
            Err(e) => return self.rollback_commands(out, Some(e)),
        };
        // Each restored partition's part.
        let parts: IdMap<ChunkId, PartRef> =
            manifest.all_parts().map(|p| (p.chunk, p.clone())).collect();
        let snap = Snapshots::restored(&manifest);
        self.reset_run(
            core,
            Some(job),
            manifest.phase,
            manifest.iterations_before,
            snap,
        );
        self.place_restored(&parts, true);
        // Step 6: the parts still to read here.
        let need: Vec<PartRef> = self
            .core
            .states_mut()
            .filter(|(_, held)| matches!(held, Held::Bytes(_)))
            .filter_map(|(chunk, _)| parts.get(&chunk).cloned())
            .collect();
        tracing::debug!(
            job = J::NAME,
            need = ?need.iter().map(|p| p.chunk).collect::<Vec<_>>(),
            "parts the coordinator reads itself"
        );
        if need.is_empty() {
            return self.parts_read(attempt, Ok(Vec::new()));
        }
        self.settle();
        let id = SnapshotId::new(manifest.job_id.clone(), manifest.epoch);
        self.store_ops
            .push(StoreOp::ReadParts { id, need, attempt });
    }

    /// Step 6: the parts the coordinator reads itself, read for `attempt` (or why not): they
    /// go into the ledger, and the run restarts (an answer of an earlier attempt is dropped).
    pub(crate) fn parts_read(
        &mut self,
        attempt: u64,
        got: crate::Result<Vec<(ChunkId, bytes::Bytes)>>,
    ) {
        if self.ended {
            return;
        }
        let mut out = Vec::new();
        let now = self.now;
        self.rollback
            .parts_read(attempt, got.is_ok(), now, &mut out);
        match got {
            Ok(_) if out.is_empty() => {}
            Ok(got) => {
                let mut got: IdMap<ChunkId, bytes::Bytes> = got.into_iter().collect();
                for (chunk, held) in self.core.states_mut() {
                    if let (Held::Bytes(b), Some(bytes)) = (&mut *held, got.remove(&chunk)) {
                        *b = bytes;
                    }
                }
                self.rollback_commands(out, None);
            }
            Err(e) => self.rollback_commands(out, Some(e)),
        }
    }

    /// Step 6 done: the states the coordinator needed are in the ledger; the rest of the
    /// restored partitions is placed, and the run goes on.
    fn restart_restored(&mut self, record: RollbackRecord) {
        self.place_restored(&IdMap::default(), false);
        let RollbackRecord {
            lost,
            from_phase,
            epoch,
            quiesce,
            read,
            restart,
            started_over,
            since,
        } = record;
        tracing::info!(
            job = J::NAME,
            ?epoch,
            phase = self.phase,
            ?lost,
            quiesce_ms = quiesce.as_millis() as u64,
            read_ms = read.as_millis() as u64,
            "rolled back (to a committed snapshot, or to the first phase's start)"
        );
        self.rollbacks.push(Rollback {
            lost,
            from_phase,
            epoch: epoch.unwrap_or_default(),
            from_start: epoch.is_none(),
            to_phase: self.phase,
            quiesce,
            read,
            restart,
            recovered: None,
            started_over,
        });
        self.recovering = Some(since);
        if epoch.is_some() {
            self.watch_rolled_back();
        }
        // A suspend asked for keeps it halted until its snapshot is written.
        if !self.snap.cut.suspending() {
            self.drive_core(crate::schedule::Core::unhalt);
        }
        self.settle();
    }

    /// Step 5, *place*: every restored partition that is not running yet and that a worker
    /// process runs next goes to that process (`Place`), at once and in one go,
    /// instead of one `Run` at a time: a process's slot asks for its next chunk only when
    /// the last one is done, and a partition that travels with its `Run` leaves the thread
    /// waiting for its bytes. A
    /// pending partition goes to the process of the slot whose queue has it; those done in
    /// the snapshot's phase are dealt by the ledger as a first phase deals chunks
    /// (`Core::deal_unheld_kept`), held where they are dealt, and those dealt to a process go
    /// there. The ledger records them as held there, so a process lost with them rolls the
    /// job back again, as for any partition it holds.
    ///
    /// Those that local workers run next stay here as before: a local thread decodes one
    /// when it runs it, and one done in the snapshot's phase is decoded at the barrier.
    ///
    /// Called twice: with `by_part_only` before the coordinator read any part (only what
    /// goes to processes that read the store, as part references), then once the rest is
    /// read (the bytes for the other processes).
    fn place_restored(&mut self, parts: &IdMap<ChunkId, PartRef>, by_part_only: bool) {
        if !self.core.is_partitioned() || self.remote.conns.is_empty() {
            return;
        }
        // The job value goes first: a partition that ended the snapshot's phase exports its
        // halos with it. (It was decoded from the snapshot; one that does not encode again
        // stays here, and the first run that sends it fails the job.)
        let Ok(job) = self.job_bytes() else {
            return;
        };
        // Where each pending chunk queued on a process runs, and how soon (its place in its
        // slot's queue).
        let mut soon: IdMap<ChunkId, (ProcessId, usize)> = IdMap::default();
        for worker in self.members.ids() {
            if let Some(Member::Remote(slot)) = self.members.get(worker) {
                let conn = slot.conn;
                for (rank, c) in self.core.queued(worker).into_iter().enumerate() {
                    soon.insert(c, (conn, rank));
                }
            }
        }
        // A partition done in the snapshot's phase runs next in the phase after it: the
        // ledger deals those that no worker holds as a first phase deals chunks (a block per
        // process or worker, `schedule/owned.rs`) and holds each where it is dealt; those of
        // processes are placed there. (Placed where their nearest pending neighbour runs, a
        // snapshot cut near a phase's end, with one chunk pending, would send every partition
        // to that one slot's process, and the next phase would move them back.)
        if by_part_only {
            self.core.deal_unheld_kept();
        }
        let holders: IdMap<ChunkId, ProcessId> = self
            .core
            .kept()
            .filter_map(
                |(chunk, _)| match self.members.get(self.core.holder(chunk)?) {
                    Some(Member::Remote(slot)) => Some((chunk, slot.conn)),
                    _ => None,
                },
            )
            .collect();
        // (process, rank, chunk, state): each process gets the first chunk of each of its
        // slots' queues, then the second, and so on; the partitions done in the snapshot's
        // phase, which run in the next one, last.
        let mut places: Vec<(ProcessId, usize, ChunkId, bytes::Bytes)> = Vec::new();
        // On the first pass only what goes by part: the other states are not read yet.
        let by_part = |conn: ProcessId, chunk: ChunkId| {
            parts.contains_key(&chunk) && self.remote.conn_reads_store(conn)
        };
        for (chunk, held) in self.core.suspended_mut() {
            if let (Some(&(conn, rank)), Held::Bytes(b)) = (soon.get(&chunk), &*held) {
                if by_part_only && !by_part(conn, chunk) {
                    continue;
                }
                places.push((conn, rank, chunk, b.clone()));
                *held = Held::Elsewhere(conn);
            }
        }
        for (chunk, held) in self.core.kept_mut() {
            if let (Some(&conn), Held::Bytes(b)) = (holders.get(&chunk), &*held) {
                if by_part_only && !by_part(conn, chunk) {
                    continue;
                }
                places.push((conn, usize::MAX, chunk, b.clone()));
                self.exporting.insert(chunk);
                *held = Held::Elsewhere(conn);
            }
        }
        if places.is_empty() {
            return;
        }
        places.sort_unstable_by_key(|&(conn, rank, chunk, _)| (conn, rank, chunk));
        let count = places.len();
        let (mut bytes, mut by_part) = (0, 0);
        for (conn, rank, chunk, state) in places {
            let export = (rank == usize::MAX).then_some(self.placements);
            if export.is_some() {
                self.remote
                    .send_phase(conn, (self.phase, self.core.plan().len()), job.clone());
            }
            // A process that writes to the store reads its parts from there: the control
            // stream does not carry the grid, and a `Run` waits behind no partition's bytes.
            let msg = match parts.get(&chunk) {
                Some(part) if self.remote.conn_reads_store(conn) => {
                    by_part += 1;
                    ToWorker::PlacePart {
                        chunk,
                        part: part.clone(),
                        export,
                    }
                }
                _ => {
                    bytes += state.len() as u64;
                    ToWorker::Place {
                        chunk,
                        state,
                        export,
                    }
                }
            };
            if self.remote.send_to(conn, msg).is_some() && export.is_some() {
                self.remote.exports_asked.insert((conn, chunk));
            }
        }
        tracing::debug!(
            job = J::NAME,
            partitions = count,
            by_part,
            bytes,
            "restored partitions placed on the worker processes that run them next"
        );
    }

    /// A phase ended: the first one after a rollback says how long recovery took.
    pub(crate) fn phase_done_after_rollback(&mut self) {
        if let Some(since) = self.recovering.take() {
            if let Some(last) = self.rollbacks.last_mut() {
                last.recovered = Some(self.now.saturating_sub(since));
            }
        }
    }
}

impl super::remote::Remotes {
    /// Every worker process forgets the partitions it holds and will get the job value
    /// again before its next chunk.
    pub(crate) fn forget_partitions(&mut self) {
        self.clear_phases();
        // The processes drop their copies at `Forget`: they are of phases run again.
        self.buddies.reset();
        for id in self.conn_ids() {
            let _ = self.send_to(id, ToWorker::Forget);
        }
    }
}

/// Reads the manifest of snapshot `epoch` of the job (step 3).
pub(crate) async fn read_back_manifest<J: Job>(
    cfg: &SnapshotConfig,
    epoch: u64,
) -> crate::Result<crate::snapshot::Manifest> {
    let id = SnapshotId::new(cfg.job_id::<J>(), epoch);
    read_manifest::<J>(&cfg.store()?, &id).await
}

/// Decodes a manifest read back into the run's restored ledger. The states stay in the
/// store for now (empty bytes in the ledger): a process that reads the store reads its own,
/// and the coordinator reads the rest (step 6, [`read_back_parts`]) before anything runs.
pub(crate) fn restore_read<J: Job>(m: crate::snapshot::Manifest) -> crate::Result<Restored<J>> {
    let empty = vec![bytes::Bytes::new(); m.all_parts().count()];
    restore::<J>(m, empty)
}

/// Reads the parts `need` of snapshot `id`, by chunk.
pub(crate) async fn read_back_parts(
    cfg: &SnapshotConfig,
    id: &SnapshotId,
    need: Vec<PartRef>,
) -> crate::Result<Vec<(ChunkId, bytes::Bytes)>> {
    let bytes = cfg.store()?.read_parts(id, need.iter()).await?;
    Ok(need.into_iter().map(|p| p.chunk).zip(bytes).collect())
}
