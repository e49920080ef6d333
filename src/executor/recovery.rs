//! Local recovery (issue 22, third step): partitions lost with a worker process are replayed
//! from their buddy copies (`copies.rs`) while every other partition stays where it is, and
//! the job goes on from the phase it was in. Nothing rolls back; nothing is read from the
//! store.
//!
//! # When
//!
//! A worker process `A` is lost with partitions only it held (`drop_conn`). The job recovers
//! them locally if all of these hold, and otherwise rolls back to its latest snapshot as
//! before (`rollback.rs`):
//!
//! - every lost partition has a copy, all of the same phase `c` and in the same process
//!   `B` (one buddy per process makes that the rule), and `B` is connected;
//! - the halo log of every other partition whose exports reach a lost one (a neighbour, or
//!   any partition if a phase since `c` gathered or transposed) covers phases `c..=P` (`P`,
//!   the phase the job is in): every process that ran it since `c` is alive; a partition
//!   that moved has its log in pieces, one in each process it ran in, and every process
//!   sends its own. A partition the coordinator's own threads ran logs in the coordinator
//!   (`copies::HERE`): what it exported for partitions in processes, as the barrier sent it
//!   to them (an allgather's piece too); and a partition
//!   that left a process took the piece of its log that process kept along (`LogOf`, right
//!   before its `Surrendered` or `Yielded`), into the coordinator's log: losing that
//!   process later loses none of it. (Before protocol 26 the piece stayed behind, and a
//!   loss of that process before its next copies refused the recovery of its partitions:
//!   the largest cause of refusals the simulation counted.) A partition replayed from its
//!   copy logs what it exported in the phases it went through where it was replayed, and
//!   its log counts as that process's from the copy's phase on (`Buddies::replayed`); an
//!   export two logs hold is taken once.
//! - the job values of phases `c + 1..=P` are kept;
//! - nothing else is under way that this would have to wait for or undo: no rollback, no
//!   other recovery, no suspend's snapshot cut open, no partition on its way from `A`, the
//!   job not finishing. An open cut of snapshot requests gives way (its captures withdrawn,
//!   its requesters served by the next cut, after the recovery), as it gives way to a
//!   rollback or a suspend.
//!
//! # How
//!
//! 1. *At the loss.* Each lost partition is recorded as held by `B` and on its way from it
//!    (`Fetch::Ledger`, as a partition a retiring process hands back), and pinned to `B`'s
//!    slots for the rest of the phase (`Core::pin`): the ledger keeps it pending or done, and
//!    runs it in `B`, whose run waits for the replay. (Left to the balance, the lost
//!    partitions went to idle processes, and each crossed from `B` alone once replayed: the
//!    phase after the replay took 50 ms on the bench, for about 10 ms of running; pinned, 5
//!    ms. The next phase start balances again.) Halos other partitions had pushed to `A` for
//!    this phase are marked to be filled again. Every live process is asked for its halo
//!    log's records of phases `c..=P` for the lost partitions (`SendLog`).
//! 2. *The logs.* When every process answered (`Log`), the halos pushed to `A` are filled in
//!    from their senders' logs, and `B` is asked to replay (`Recover`): from the copies, the
//!    job values, and the logged pieces of phases `c..P`. A partition whose `Done` of `P` had
//!    come runs `P` too; the others only begin it.
//! 3. *The replay.* `B` holds each partition it replayed from then on and says so
//!    (`Replayed`), with the pieces it exported at the end of `P` if it ran it (what it had
//!    exported for a partition also lost is filled in with them), and the phase of the
//!    copies it replayed from: `c`, or a newer `c'` if `B` no longer keeps those of `c` but
//!    keeps copies of `c'` of every partition it replays (a copy round whose answer never
//!    came here: its owner was lost first, or an acknowledgement was lost with a link;
//!    the phases since `c'` need a subset of the logs and job values asked for), and the
//!    partition's log is `B`'s from that phase on. A partition the ledger
//!    handed to another worker meanwhile (pinned, only if `B` lost its slots) is asked of `B`
//!    (`Surrender`), as any partition on its way; the others run in `B` as partitions held
//!    there. (The first version sent
//!    every replayed state to the coordinator and on: 4 MB a band twice on the bench.)
//! 4. *The end.* When every partition is in, the recovery is recorded
//!    ([`JobHandle::recoveries`](crate::JobHandle::recoveries)), and the barrier, which
//!    waited, may come.
//!
//! A loss of any process while it is under way, a log that does not have what was recorded,
//! or a replay that fails, abandons it for the rollback (the states on their way are
//! dropped; the rollback resets everything anyway).
//!
//! # Why the value stays exact
//!
//! A replayed partition runs each phase from `c + 1` on exactly as it ran in `A`: the same
//! state (the copy is the partition as phase `c` left it, checked bit for bit in the
//! simulation), the same job value, the same pieces in the same sender order (those of the
//! partitions replayed with it come from the replay itself; the others' from their senders'
//! logs, which hold them as they were sent), and the thread runner's own path for each
//! phase. Its output of a phase already merged is not merged again (only a partition whose
//! `Done` of `P` never came runs `P` for the ledger). The partitions that went on are never
//! touched.

use std::time::Duration;

use bytes::Bytes;

use super::copies::HERE;
use super::job_run::{HeldHalo, State};
use super::remote::Fetch;
use crate::job::Job;
use crate::run::Held;
use crate::schedule::idhash::{IdMap, IdSet};
use crate::schedule::{ChunkId, Event, ProcessId, WorkerId};
use crate::wire::frame::ToWorker;

/// A local recovery the job went through, from
/// [`JobHandle::recoveries`](crate::JobHandle::recoveries).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Recovered {
    /// The chunks whose partitions were lost and replayed.
    pub lost: Vec<ChunkId>,
    /// The phase the job was in.
    pub phase: u64,
    /// The phase of the copies they were replayed from (newer than the copies this
    /// coordinator knew of when the buddy kept newer ones of them all: a copy round whose
    /// answer never came).
    pub copy_phase: u64,
    /// The worker process that kept the copies and replayed them (its number).
    pub buddy: u64,
    /// From the loss until every replayed partition was back.
    pub took: Duration,
}

/// A local recovery under way (see the module docs).
#[derive(Debug)]
pub(crate) struct Recovery {
    attempt: u64,
    from: ProcessId,
    buddy: ProcessId,
    lost: Vec<ChunkId>,
    /// Those whose `Done` of `phase` had come.
    done: IdSet<ChunkId>,
    copy_phase: u64,
    phase: u64,
    /// Processes whose log has not come yet.
    waiting: IdSet<ProcessId>,
    /// Processes other than the buddy that keep copies of lost partitions (they moved
    /// between two copy rounds), by process, until they sent them; and those copies.
    strays: IdMap<ProcessId, Vec<ChunkId>>,
    copies: Vec<(ChunkId, Bytes)>,
    /// Logged pieces for the lost partitions: `(phase, sender, receiver, piece)`.
    halos: Vec<(u64, u64, u64, Bytes)>,
    /// Halos of `phase` pushed to the lost process, to fill in: `(sender, receiver)`.
    refill: Vec<(ChunkId, ChunkId)>,
    replayed: IdSet<ChunkId>,
    /// The phase of the copies the buddy replayed from (`copy_phase` or newer: see
    /// [`State::recovery_replayed`]).
    replayed_from: u64,
    /// Replayed partitions the ledger had handed to another process meanwhile, asked back
    /// of the buddy (`Surrender`).
    surrendering: IdSet<ChunkId>,
    since: Duration,
}

impl Recovery {
    /// Its number, which the processes' answers quote.
    pub(crate) fn attempt(&self) -> u64 {
        self.attempt
    }

    /// The process whose loss it recovers from.
    pub(crate) fn from(&self) -> ProcessId {
        self.from
    }

    /// Whether it waits for an answer of process `id`: its halo log, or copies it keeps.
    pub(crate) fn waits_for(&self, id: ProcessId) -> bool {
        self.waiting.contains(&id) || self.strays.contains_key(&id)
    }

    /// The phase being recovered, and whether `chunk` had ended it.
    #[cfg_attr(not(any(test, feature = "sim")), allow(dead_code))]
    pub(crate) fn of(&self, chunk: ChunkId) -> (u64, bool) {
        (self.phase, self.done.contains(&chunk))
    }

    /// Log records from a process (its `Log`, or a `LogOf` of a partition that left it):
    /// the pieces of phases `copy_phase..=phase` for lost partitions, from the others.
    fn add_records(&mut self, records: Vec<crate::wire::frame::LogRecord>) {
        for (phase, sender, pieces) in records {
            if phase < self.copy_phase || phase > self.phase || self.lost.contains(&sender) {
                continue;
            }
            for (to, b) in pieces {
                match to {
                    Some(to) if self.lost.contains(&to) => self.halos.push((phase, sender, to, b)),
                    Some(_) => {}
                    None => self
                        .halos
                        .extend(self.lost.iter().map(|&x| (phase, sender, x, b.clone()))),
                }
            }
        }
    }

    /// The same export may be in two logs: a partition replayed since logs what it exported
    /// in the phases it went through again where it was replayed, and the process it ran in
    /// before may still keep some of them. Each is kept once; two that differ say that a
    /// log is wrong: returned, `(phase, sender, receiver)`, for the job to roll back.
    fn take_each_halo_once(&mut self) -> Option<(u64, ChunkId, ChunkId)> {
        self.halos
            .sort_by_key(|&(phase, sender, to, _)| (phase, sender, to));
        let mut differ = None;
        self.halos.dedup_by(|later, kept| {
            let same = (later.0, later.1, later.2) == (kept.0, kept.1, kept.2);
            if same && later.3 != kept.3 {
                differ = Some((kept.0, kept.1, kept.2));
            }
            same
        });
        differ
    }

    /// Partition `sender` exported `halos`: those kept in the lost process are refilled.
    pub(crate) fn kept_at_lost(
        &mut self,
        sender: ChunkId,
        halos: &crate::exchange::Outbox<HeldHalo>,
    ) {
        for (to, h) in halos {
            if matches!(h, HeldHalo::Kept(p) if *p == self.from) {
                match to {
                    Some(to) => self.refill.push((sender, *to)),
                    None => self.refill.extend(self.lost.iter().map(|&x| (sender, x))),
                }
            }
        }
    }
}

impl<J: Job> State<J> {
    /// Whether the partitions of `lost`, lost with process `from`, can be replayed from their
    /// buddy copies (module docs, "When"): the buddy and the copies' phase, or why not.
    #[allow(clippy::type_complexity)]
    fn recoverable(
        &self,
        from: ProcessId,
        lost: &[ChunkId],
    ) -> Result<(ProcessId, u64, IdMap<ProcessId, Vec<ChunkId>>), &'static str> {
        let phase = self.phase;
        if self.rolling_back() {
            return Err("a rollback is under way");
        }
        if self.recovery.is_some() {
            return Err("another recovery is under way");
        }
        if self.finishing.is_some() {
            return Err("the job is finishing");
        }
        if self.snap.cut.is_open() && self.snap.cut.suspending() {
            return Err("a suspend's snapshot is being taken");
        }
        if phase == 0 {
            return Err("the first phase runs again from the job value");
        }
        let mut copy_phase = None;
        let mut held: IdMap<ProcessId, Vec<ChunkId>> = IdMap::default();
        for &x in lost {
            if self.remote.fetching_from(x).is_some() {
                return Err("a lost partition was on its way");
            }
            match self.remote.buddies.copy_of(x) {
                None => return Err("a lost partition has no copy"),
                Some((c, _)) if copy_phase.is_some_and(|p| p != c) => {
                    return Err("the lost partitions' copies are of two phases");
                }
                Some((c, b)) => {
                    if b == from || !self.remote.conns.contains_key(&b) {
                        return Err("a copy was lost too");
                    }
                    copy_phase = Some(c);
                    held.entry(b).or_default().push(x);
                }
            }
        }
        let Some(copy_phase) = copy_phase else {
            return Err("nothing was lost");
        };
        // The replay runs where most copies are; the others send theirs.
        let buddy = held
            .iter()
            .max_by_key(|(p, c)| (c.len(), std::cmp::Reverse(**p)))
            .map(|(p, _)| *p)
            .expect("a copy");
        held.remove(&buddy);
        if copy_phase >= phase {
            return Err("the copies are of the phase under way");
        }
        if self.remote.fetching_from_any(from) {
            return Err("a partition was on its way from the lost process");
        }
        if self.remote.buddies.job_values(copy_phase, phase).is_none() {
            return Err("the job values since the copies are not kept");
        }
        let short = self.senders_to(lost, copy_phase).into_iter().find(|&y| {
            !self.remote.buddies.log_covers(y, copy_phase, |q| {
                q == HERE || (q != from && self.remote.conns.contains_key(&q))
            })
        });
        if let Some(y) = short {
            // What the log has, for the reader of the warning that follows.
            tracing::info!(
                job = J::NAME,
                chunk = y,
                copy_phase,
                segments = ?self.remote.buddies.segments(y),
                "the halo log that is not whole: (process, since phase) of each piece"
            );
            return Err("a partition's halo log since the copies is not whole");
        }
        Ok((buddy, copy_phase, held))
    }

    /// The partitions, the lost ones aside, whose exports since phase `copy_phase` may reach
    /// one of `lost`: the halo logs a replay of them reads. Their neighbours while every
    /// phase since exchanged with neighbours or nothing (`Pattern`); every partition if one
    /// gathered or transposed, or if a kept job value does not decode or its `pattern`
    /// panics. (Every partition's log was asked to be whole: a partition far from the lost
    /// ones that had itself been replayed elsewhere since the copies, its own older exports
    /// lost with the process it ran in, refused a recovery that never reads them.) A piece
    /// still missing ends the recovery as before (the buddy's replay checks each phase's
    /// senders, `replay_lost` the halos of the phase under way), and the job rolls back.
    fn senders_to(&self, lost: &[ChunkId], copy_phase: u64) -> Vec<ChunkId> {
        let chunks = self.core.plan().len();
        let everyone = || (0..chunks).filter(|c| !lost.contains(c)).collect();
        let Some(hooks) = J::OWNERSHIP.hooks else {
            return everyone();
        };
        let Some(values) = self.remote.buddies.job_values(copy_phase, self.phase) else {
            return everyone();
        };
        for (phase, bytes) in values {
            let Ok(job) = crate::codec::decode::<J>("the job", &bytes) else {
                return everyone();
            };
            match crate::run::catch(crate::Site::Job { phase }, J::NAME, || {
                (hooks.pattern)(&job, phase)
            }) {
                Ok(crate::exchange::Pattern::Neighbours | crate::exchange::Pattern::Nothing) => {}
                _ => return everyone(),
            }
        }
        let mut near: Vec<ChunkId> = lost
            .iter()
            .flat_map(|&x| self.shape.neighbours(x))
            .filter(|c| !lost.contains(c))
            .collect();
        near.sort_unstable();
        near.dedup();
        near
    }

    /// Worker process `from` is lost (its connection is gone) with partitions only it held,
    /// `lost`; `slots` were its workers, still in the ledger. Starts a local recovery if it
    /// can (module docs, "When") and says whether it did.
    pub(crate) fn recover_locally(
        &mut self,
        from: ProcessId,
        lost: &[ChunkId],
        slots: &[WorkerId],
    ) -> bool {
        if lost.is_empty() || !self.remote.buddies.enabled() || self.ended {
            return false;
        }
        let (buddy, copy_phase, strays) = match self.recoverable(from, lost) {
            Ok(found) => found,
            Err(why) => {
                tracing::warn!(
                    job = J::NAME,
                    %from,
                    ?lost,
                    phase = self.phase,
                    why,
                    "lost partitions cannot be replayed from buddy copies"
                );
                return false;
            }
        };
        let phase = self.phase;
        let lost_set: IdSet<ChunkId> = lost.iter().copied().collect();
        // Decided. A snapshot cut whose marker is out cannot complete: the lost process's
        // parts are gone with it, and the replayed partitions' would be of another phase. It
        // gives way as it does to a rollback (its captures withdrawn), and its requesters
        // wait for the next cut, which starts once the recovery ends. (A cut being written
        // completes: every part of it was taken before the loss.)
        if self.snap.cut.is_open() {
            tracing::warn!(
                job = J::NAME,
                "a snapshot under way gives way to a local recovery"
            );
            self.cut_gives_way();
        }
        // The lost partitions are held by the buddy, on their way from it.
        let attempt = self.next_recovery;
        self.next_recovery += 1;
        let mut done = IdSet::default();
        for (c, h) in self.core.kept_mut() {
            if lost_set.contains(&c) {
                *h = Held::Elsewhere(buddy);
                done.insert(c);
            }
        }
        for (c, h) in self.core.suspended_mut() {
            if lost_set.contains(&c) {
                *h = Held::Elsewhere(buddy);
            }
        }
        // Running or granted on the lost slots: they go back pending with this state when
        // the slots leave.
        for &w in slots {
            for c in self
                .core
                .runs_and_granted(w)
                .into_iter()
                .filter(|c| lost_set.contains(c))
            {
                let report = Event::StateReport {
                    worker: w,
                    chunk: c,
                    state: Held::Elsewhere(buddy),
                };
                let _ = self.core.handle(report, &mut Vec::new());
            }
        }
        for &x in lost {
            self.remote
                .fetches
                .insert(x, (buddy, Fetch::Ledger, self.now));
        }
        // They run this phase in the buddy, which replays them, in contiguous blocks over
        // its slots: handed to another process, each would wait for the replay and then
        // cross to it alone (the first version let the balance spread them over idle
        // processes: the phase after the replay took 50 ms on the bench, 7 of 10
        // partitions surrendered one after another, for about 10 ms of running).
        let holders: Vec<WorkerId> = self
            .remote
            .conns
            .get(&buddy)
            .map(|c| c.workers().collect())
            .unwrap_or_default();
        if !holders.is_empty() {
            let per = lost.len().div_ceil(holders.len());
            for (block, &w) in lost.chunks(per).zip(&holders) {
                self.core.pin(block, w);
            }
        }
        // Halos of this phase pushed to (or kept in) the lost process for the lost
        // partitions: refilled from their senders' logs, or from the replay.
        let mut refill = Vec::new();
        for (y, out) in self.exports.iter().enumerate() {
            for (to, h) in out.iter().flatten() {
                if matches!(h, HeldHalo::Kept(p) if *p == from) {
                    match to {
                        Some(to) => refill.push((y as ChunkId, *to)),
                        None => refill.extend(lost.iter().map(|&x| (y as ChunkId, x))),
                    }
                }
            }
        }
        let waiting: IdSet<ProcessId> = self
            .remote
            .conns
            .keys()
            .copied()
            .filter(|&q| q != from)
            .collect();
        let mut to_ask: Vec<ProcessId> = waiting.iter().copied().collect();
        to_ask.sort_unstable();
        for q in to_ask {
            let ask = ToWorker::SendLog {
                attempt,
                from: copy_phase,
                through: phase,
                to: lost.to_vec(),
            };
            let _ = self.remote.send_to(q, ask);
        }
        // The copies are used up (their processes drop them when asked).
        self.remote.buddies.used(lost);
        let mut stray_ids: Vec<ProcessId> = strays.keys().copied().collect();
        stray_ids.sort_unstable();
        for q in stray_ids {
            let chunks = strays[&q].clone();
            let ask = ToWorker::SendCopies {
                attempt,
                phase: copy_phase,
                chunks,
            };
            let _ = self.remote.send_to(q, ask);
        }
        tracing::warn!(
            job = J::NAME,
            %from,
            %buddy,
            ?lost,
            phase,
            copy_phase,
            "a worker process was lost with owned partitions: they are replayed from their buddy copies"
        );
        self.recovery = Some(Recovery {
            attempt,
            from,
            buddy,
            lost: lost.to_vec(),
            done,
            copy_phase,
            phase,
            waiting,
            strays,
            copies: Vec::new(),
            // The coordinator's own log first; the processes' come with their answers.
            // (Not the pieces of partitions lost too: a partition that took its log here
            // when it left a process may have been lost since, and the replay exports
            // those pieces itself.)
            halos: self
                .remote
                .buddies
                .here_for(lost, copy_phase, phase)
                .filter(|(_, sender, ..)| !lost.contains(sender))
                .collect(),
            refill,
            replayed: IdSet::default(),
            replayed_from: copy_phase,
            surrendering: IdSet::default(),
            since: self.now,
        });
        true
    }

    /// Process `id` sent the log records a recovery asked for.
    pub(crate) fn recovery_log(
        &mut self,
        id: ProcessId,
        attempt: u64,
        records: Vec<crate::wire::frame::LogRecord>,
    ) {
        let Some(r) = self.recovery.as_mut().filter(|r| r.attempt == attempt) else {
            // For a recovery abandoned since: nobody waits for it.
            return;
        };
        if !r.waiting.remove(&id) {
            return;
        }
        r.add_records(records);
        if r.waiting.is_empty() && r.strays.is_empty() {
            self.replay_lost();
        }
        self.recovery_answered(id);
    }

    /// Partition `chunk` left process `id` with the records of the halo log it exported
    /// there (`LogOf`): the coordinator keeps them from now on. A recovery that waits for
    /// `id`'s log takes them now (that log will not have them); one that has it had them.
    pub(crate) fn took_log(
        &mut self,
        id: ProcessId,
        chunk: ChunkId,
        records: Vec<crate::wire::frame::LogRecord>,
    ) {
        if let Some(r) = self.recovery.as_mut().filter(|r| r.waiting.contains(&id)) {
            r.add_records(records.clone());
        }
        self.remote.buddies.took_log(id, chunk, records);
    }

    /// Process `id` answered the recovery: a drained process that waited only for that
    /// ends now (`State::end_if_drained`).
    fn recovery_answered(&mut self, id: ProcessId) {
        if self.remote.is_retiring(id) {
            self.end_if_drained(id);
        }
    }

    /// Process `id` sent the copies a recovery asked of it.
    pub(crate) fn recovery_copies(
        &mut self,
        id: ProcessId,
        attempt: u64,
        copies: Vec<(u64, u64, Bytes)>,
    ) {
        let Some(r) = self.recovery.as_mut().filter(|r| r.attempt == attempt) else {
            return;
        };
        let Some(asked) = r.strays.remove(&id) else {
            return;
        };
        let phase = r.copy_phase;
        let mut missing = None;
        for x in asked {
            match copies.iter().find(|c| c.0 == x) {
                Some((_, p, b)) if *p == phase => r.copies.push((x, b.clone())),
                _ => missing = Some(x),
            }
        }
        if let Some(x) = missing {
            return self.abandon_recovery(format!(
                "process {id} did not have the copy of chunk {x} of phase {phase}"
            ));
        }
        if r.waiting.is_empty() && r.strays.is_empty() {
            self.replay_lost();
        }
        self.recovery_answered(id);
    }

    /// Every log came: the halos pushed to the lost process are filled in, and the buddy
    /// replays.
    fn replay_lost(&mut self) {
        let Some(r) = self.recovery.as_mut() else {
            return;
        };
        if let Some((phase, y, x)) = r.take_each_halo_once() {
            return self.abandon_recovery(format!(
                "two logs differ on the halo of chunk {y} for chunk {x} in phase {phase}"
            ));
        }
        let mut by: IdMap<(ChunkId, ChunkId), Bytes> = IdMap::default();
        for (phase, sender, to, b) in &r.halos {
            if *phase == r.phase {
                by.insert((*sender, *to), b.clone());
            }
        }
        let lost = r.lost.clone();
        let from = r.from;
        let mut missing = None;
        for &(y, x) in &r.refill {
            if lost.contains(&y) {
                continue;
            }
            match by.get(&(y, x)) {
                Some(b) => fill(&mut self.exports, y, x, from, b),
                None => missing = Some((y, x)),
            }
        }
        if let Some((y, x)) = missing {
            return self.abandon_recovery(format!(
                "the halo of chunk {y} for chunk {x} in phase {} is in no log",
                self.phase
            ));
        }
        let Some(r) = self.recovery.as_ref() else {
            return;
        };
        let Some(jobs) = self.remote.buddies.job_values(r.copy_phase, r.phase) else {
            return self.abandon_recovery("the job values to replay are gone".into());
        };
        let plan = self.core.plan();
        let chunks = r
            .lost
            .iter()
            .map(|&x| {
                let range = plan.range(x);
                (x, range.start, range.end, r.done.contains(&x))
            })
            .collect();
        let halos = r.halos.iter().filter(|h| h.0 < r.phase).cloned().collect();
        let msg = ToWorker::Recover {
            attempt: r.attempt,
            copy_phase: r.copy_phase,
            phase: r.phase,
            total: plan.len(),
            copies: r.copies.clone(),
            chunks,
            jobs,
            halos,
        };
        let buddy = r.buddy;
        let _ = self.remote.send_to(buddy, msg);
    }

    /// The buddy replayed `chunk` and holds it: if the ledger handed it to a worker
    /// meanwhile, it is asked for it (its fetch goes on, as for a partition handed back);
    /// what it exported at the end of the phase fills in what the lost process kept for the
    /// others lost.
    ///
    /// `copy_phase` is the phase of the copy the buddy replayed it from: the `Recover`'s,
    /// or a newer one it kept of every partition it replayed (from a round whose answer
    /// never came here); the halo log of the partition is the buddy's from that phase on.
    pub(crate) fn recovery_replayed(
        &mut self,
        id: ProcessId,
        attempt: u64,
        chunk: ChunkId,
        copy_phase: u64,
        halos: Vec<(Option<u64>, Bytes)>,
    ) -> Result<(), String> {
        let Some(r) = self.recovery.as_mut().filter(|r| r.attempt == attempt) else {
            return Ok(());
        };
        if copy_phase < r.copy_phase || copy_phase >= r.phase {
            return Err(format!(
                "chunk {chunk} replayed from a copy of phase {copy_phase}, not between the \
                 recovery's copies ({}) and its phase ({})",
                r.copy_phase, r.phase
            ));
        }
        if id != r.buddy || !r.lost.contains(&chunk) || !r.replayed.insert(chunk) {
            return Err(format!("a replay of chunk {chunk} nobody asked of it"));
        }
        r.replayed_from = r.replayed_from.max(copy_phase);
        let from = r.from;
        self.remote.buddies.replayed(chunk, id, copy_phase);
        let refill: Vec<ChunkId> = r
            .refill
            .iter()
            .filter(|(y, _)| *y == chunk)
            .map(|(_, x)| *x)
            .collect();
        for x in refill {
            let piece = halos
                .iter()
                .find(|(to, _)| *to == Some(x))
                .or_else(|| halos.iter().find(|(to, _)| to.is_none()));
            match piece {
                Some((_, b)) => fill(&mut self.exports, chunk, x, from, b),
                None => {
                    self.abandon_recovery(format!(
                        "the replay of chunk {chunk} exported nothing for chunk {x}"
                    ));
                    return Ok(());
                }
            }
        }
        match self.remote.fetches.get(&chunk) {
            // Still in the ledger's record of the buddy: held there, as if it had run there.
            Some((_, Fetch::Ledger, _)) => {
                self.remote.fetches.remove(&chunk);
            }
            // Handed to a slot of the buddy itself meanwhile: it runs there, held.
            Some((_, Fetch::Forward { slot, .. }, _)) if slot.conn == id => {
                if let Some((_, to, _)) = self.remote.fetches.remove(&chunk) {
                    self.forward(chunk, to, Held::Elsewhere(id));
                }
            }
            // Handed to another worker meanwhile: the buddy hands it over.
            Some(_) => {
                if let Some(r) = self.recovery.as_mut() {
                    r.surrendering.insert(chunk);
                }
                let _ = self.remote.send_to(id, ToWorker::Surrender { chunk });
            }
            None => {}
        }
        let Some(r) = self.recovery.as_ref() else {
            return Ok(());
        };
        if r.replayed.len() == r.lost.len() {
            let r = self.recovery.take().expect("checked");
            let took = self.now.saturating_sub(r.since);
            tracing::info!(
                job = J::NAME,
                lost = ?r.lost,
                phase = r.phase,
                copy_phase = r.replayed_from,
                ?took,
                "lost partitions replayed from their buddy copies"
            );
            metrics::counter!(crate::metrics::RECOVERIES, "job" => J::NAME).increment(1);
            self.recoveries.push(Recovered {
                lost: r.lost,
                phase: r.phase,
                copy_phase: r.replayed_from,
                buddy: r.buddy.0,
                took,
            });
            self.watch_recovered();
        }
        self.settle();
        Ok(())
    }

    /// The recovery under way cannot be carried out: the job rolls back instead.
    pub(crate) fn abandon_recovery(&mut self, why: String) {
        let Some(r) = self.recovery.take() else {
            return;
        };
        self.recoveries_abandoned += 1;
        self.late_surrenders
            .extend(r.surrendering.iter().map(|&c| (r.buddy, c)));
        tracing::warn!(job = J::NAME, lost = ?r.lost, %why, "a local recovery is abandoned: the job rolls back");
        let mut stranded = Vec::new();
        for x in &r.lost {
            match self.remote.fetches.remove(x) {
                Some((_, Fetch::Forward { worker, .. }, _)) => stranded.push(worker),
                Some((_, Fetch::Local, _)) => {
                    let gone = crate::error::Error::PartitionGone {
                        job: J::NAME,
                        chunk: *x,
                    };
                    self.orders
                        .push(super::links::Order::Fetched(*x, Err(gone)));
                }
                _ => {}
            }
        }
        self.core.lose(&r.lost);
        self.partitions_lost(&[]);
        for worker in stranded {
            let _ = self.feed(Event::Lost { worker }, None);
        }
        // Those not replayed yet are as lost with the process they were in (the buddy does
        // not hold them: nothing may ask it for them).
        let unheld = |c: ChunkId, h: &Held<J::Chunk>| {
            r.lost.contains(&c) && !r.replayed.contains(&c) && h.elsewhere() == Some(r.buddy)
        };
        for (c, h) in self.core.kept_mut() {
            if unheld(c, h) {
                *h = Held::Elsewhere(r.from);
            }
        }
        for (c, h) in self.core.suspended_mut() {
            if unheld(c, h) {
                *h = Held::Elsewhere(r.from);
            }
        }
    }

    /// A recovery is under way and waits for process `id`: it is abandoned.
    pub(crate) fn recovery_lost(&mut self, id: ProcessId) {
        if self.recovery.is_some() {
            self.abandon_recovery(format!("worker process {id} was lost meanwhile"));
        }
    }
}

/// The halo `sender` exported for `receiver`, recorded as kept by lost process `from`, is
/// these bytes.
fn fill(
    exports: &mut [Option<crate::exchange::Outbox<HeldHalo>>],
    sender: ChunkId,
    receiver: ChunkId,
    from: ProcessId,
    bytes: &Bytes,
) {
    let Some(Some(out)) = exports.get_mut(sender as usize) else {
        return;
    };
    for (to, h) in out.iter_mut() {
        let for_it = to.is_none_or(|t| t == receiver);
        if for_it && matches!(h, HeldHalo::Kept(p) if *p == from) {
            *h = HeldHalo::Bytes(bytes.clone());
            if to.is_some() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An export two logs hold is taken once, whichever log it came from first; two records
    /// of one export that differ are named, and nothing is taken for them silently.
    #[test]
    fn an_export_two_logs_hold_is_taken_once_and_two_that_differ_are_named() {
        let b = |s: &'static str| Bytes::from_static(s.as_bytes());
        let mut r = Recovery {
            attempt: 0,
            from: ProcessId(1),
            buddy: ProcessId(2),
            lost: vec![4],
            done: IdSet::default(),
            copy_phase: 2,
            phase: 4,
            waiting: IdSet::default(),
            strays: IdMap::default(),
            copies: Vec::new(),
            halos: vec![
                (3, 5, 4, b("five, 3")),
                (2, 3, 4, b("three, 2")),
                (3, 3, 4, b("three, 3")),
                (2, 3, 4, b("three, 2")),
                (2, 5, 4, b("five, 2")),
            ],
            refill: Vec::new(),
            replayed: IdSet::default(),
            replayed_from: 2,
            surrendering: IdSet::default(),
            since: Duration::ZERO,
        };
        assert_eq!(r.take_each_halo_once(), None);
        let kept: Vec<(u64, u64, &[u8])> = r.halos.iter().map(|h| (h.0, h.1, &h.3[..])).collect();
        assert_eq!(
            kept,
            vec![
                (2, 3, &b"three, 2"[..]),
                (2, 5, &b"five, 2"[..]),
                (3, 3, &b"three, 3"[..]),
                (3, 5, &b"five, 3"[..]),
            ]
        );
        r.halos.push((3, 5, 4, b("five, 3, otherwise")));
        assert_eq!(r.take_each_halo_once(), Some((3, 5, 4)));
    }
}
