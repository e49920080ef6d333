//! Buddy copies of owned partitions (local recovery, first step): the coordinator's record
//! of which partition has a copy in which worker process's memory, and of which phase.
//!
//! With [`Builder::buddy_copies`](crate::Builder::buddy_copies)`(k)`, at the barrier after
//! every `k`-th phase (and at the next barrier after a partition moved into the process that
//! keeps its copy) each worker process holding partitions is asked (`ToWorker::Copy`, ahead
//! of the next phase's messages) to copy them, as the phase left them, into the memory of
//! another process, its *buddy*: the next process in the roster's order on another node if
//! there is one, else the next process; only processes that listen for their peers take
//! copies. The copies go process to process (`ToPeer::Copy`), never through the
//! coordinator; the owner says which its buddy kept (`Copied`). This record is then:
//!
//! - one copy per partition at most (a newer copy elsewhere makes the older buddy drop its
//!   own, `DropCopies`), so the memory the copies take over all processes is at most one
//!   grid, and each process's share is reported ([`Copies`]);
//! - a copy is forgotten with the process that kept it, and all are forgotten at a
//!   rollback (the processes drop theirs at `Forget`);
//! - an answer of another generation (from before a rollback) is dropped;
//! - a process has two rounds open (asked, not answered) at most: another is deferred to
//!   the first barrier after an answer ([`Copies::deferred`]), so copies slower than the
//!   phases between rounds do not pile up.
//!
//! What the copies are for: the replay of a lost process's partitions from them while the
//! survivors go on (`recovery.rs`, DESIGN §10). The job values of the phases since the oldest
//! copy are kept here too, for those replays; a copy a replay used up is not brought back by
//! a late answer of an older round (`floor`). What they cost is in `BENCHMARKS.md`
//! (`benches/partitions.rs`, parts `copies` and `local`).

use crate::schedule::idhash::IdMap;
use crate::schedule::{ChunkId, ProcessId};

/// The buddy copies of a job run, from [`JobHandle::copies`](crate::JobHandle::copies).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Copies {
    /// Partitions with a copy in a worker process's memory now.
    pub partitions: u64,
    /// The bytes of those copies.
    pub bytes: u64,
    /// The most bytes of copies one worker process keeps now.
    pub max_bytes_per_process: u64,
    /// The phase of the newest copy, if any.
    pub newest_phase: Option<u64>,
    /// The phase of the oldest copy kept, if any (replaying a lost partition would start
    /// there).
    pub oldest_phase: Option<u64>,
    /// Copy rounds asked of worker processes so far (one per process and barrier).
    pub rounds: u64,
    /// Copies kept by buddies so far.
    pub kept: u64,
    /// Copies not kept so far: the buddy refused them (its memory for copies was full) or
    /// could not be reached, or no buddy was there (one worker process alone).
    pub refused: u64,
    /// Copies lost with the process that kept them.
    pub lost: u64,
    /// Rounds not asked of a process because two of its rounds were not answered yet:
    /// asked at the first barrier after an answer instead (copies that take longer than
    /// the phases between rounds do not pile up).
    pub deferred: u64,
    /// The bytes of the halo logs worker processes keep (the halos each partition
    /// exported since the oldest copy, what a replay from it needs), as they last said,
    /// and the coordinator's own (what partitions its threads run exported for partitions
    /// in worker processes).
    pub log_bytes: u64,
    /// The most of those one worker process keeps.
    pub max_log_bytes_per_process: u64,
}

/// A partition's copy: the phase it ended, where it is, and its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Kept {
    phase: u64,
    buddy: ProcessId,
    bytes: u64,
}

/// The coordinator's record of buddy copies (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Buddies {
    /// Copies are taken at the barrier after every `every`-th phase; `None`: never.
    every: Option<u64>,
    copies: IdMap<ChunkId, Kept>,
    /// Bytes of copies each process keeps, and in all (kept as they change: the gauge reads
    /// it at every answer, and a job may have thousands of processes).
    held: IdMap<ProcessId, u64>,
    total: u64,
    /// Where each partition's halo log is: the processes that ran it, each since a phase
    /// (its exports from then on until the next are there), oldest first; and each
    /// process's log bytes as it last said.
    logs: IdMap<ChunkId, Vec<(ProcessId, u64)>>,
    log_bytes: IdMap<ProcessId, u64>,
    /// The job value of each phase since the oldest copy's, as sent to worker processes
    /// (a replay runs those phases again).
    jobs: std::collections::VecDeque<(u64, bytes::Bytes)>,
    /// Per chunk, the phase below which an answer is stale: a copy of a phase as new was
    /// recorded (an older one's buddy was told to drop it), or used up by a replay (a late
    /// answer of an older round must not bring one back).
    floor: IdMap<ChunkId, u64>,
    /// Partitions a replay is making again from their copies (from [`Buddies::used`] to
    /// [`Buddies::replayed`]): an answer of a round that copied one of them is neither
    /// recorded nor answered with a drop meanwhile. The buddy may replay from a newer copy
    /// than the one recorded, and drops what the replay used when the `Recover` comes: a
    /// copy recorded meanwhile was gone from it (the simulation's "records a copy of chunk 5
    /// of phase 2 in 6, which keeps none", mesh seed 325390), and a drop sent meanwhile
    /// could take the copy the replay was about to use.
    replaying: crate::schedule::idhash::IdSet<ChunkId>,
    /// Partitions a round asked to be copied (by the phase it ended) whose answer has not
    /// come, or whose copy was refused: not asked again before the next round of every
    /// partition (`Buddies::wants_round`).
    asked_for: IdMap<ChunkId, u64>,
    /// Rounds asked of a process and not answered yet: `(owner, phase)`. Their copies may
    /// still come, so the halo logs keep their phase's exports ([`Buddies::log_from`]);
    /// and a process with [`OPEN_ROUNDS`] of them is asked no other ([`Buddies::defers_round`]).
    awaiting: Vec<(ProcessId, u64)>,
    /// Processes whose round was deferred (`Buddies::defers_round`): they want one as soon
    /// as nothing is open.
    deferred: crate::schedule::idhash::IdSet<ProcessId>,
    /// Processes a partition moved out of since their last round: the log of what it
    /// exported while there is there, and a replay of that process's partitions from their
    /// copies would need it (`Buddies::wants_round`).
    left: crate::schedule::idhash::IdSet<ProcessId>,
    /// The coordinator's own halo log ([`HERE`]): what partitions it ran exported for
    /// partitions in worker processes, as sent to them, `(phase, sender, receiver,
    /// bytes)`, oldest first, and their bytes.
    /// `None` as the receiver: an allgather's piece, for every partition (one that came in
    /// a `LogOf`).
    here: std::collections::VecDeque<(u64, ChunkId, Option<ChunkId>, bytes::Bytes)>,
    here_bytes: u64,
    report: Copies,
}

/// Copy rounds a process may have open (asked, not answered) at once: see
/// [`Buddies::defers_round`]. Two, measured with the simulation's copies at every barrier
/// (`BENCHMARKS.md`): with one, or with a partition's round held back while the process it
/// moved out of had one open, a round a phase late held the next back and partitions were
/// lost with no copy more often (local recoveries in 8.7-8.8% of the grid's histories,
/// against 9.1% before this rule and with it).
pub(crate) const OPEN_ROUNDS: usize = 2;

/// The coordinator as the keeper of a halo log (`Buddies::exported`): the partitions its
/// own threads run log their exports for partitions in worker processes here, so that a
/// process lost beside them can be replayed. It is never lost (a lost coordinator ends
/// the run) and is no process.
pub(crate) const HERE: ProcessId = ProcessId(u64::MAX);

/// The coordinator as the keeper of the pieces of halo logs that partitions took along when
/// they left a process (`LogOf`, [`Buddies::took_log`]): kept in its own log, like
/// [`HERE`]'s, and never lost; but unlike `HERE` it logs nothing those partitions export
/// afterwards (they run elsewhere: a barrier that logged their next exports here as well
/// gave a replay each of their pieces twice).
pub(crate) const TAKEN: ProcessId = ProcessId(u64::MAX - 1);

impl Buddies {
    /// A record for copies every `every` phases (`None` or 0: none).
    pub(crate) fn new(every: Option<u64>) -> Buddies {
        Buddies {
            every: every.filter(|&k| k > 0),
            ..Buddies::default()
        }
    }

    /// Whether process `holder`, which holds `chunks`, copies them all at a barrier that is
    /// not a round of every partition: one of them has no copy (none was taken yet in this
    /// run, or since the rollback; a replay used it up; its buddy was lost), or has its copy
    /// in `holder` itself (it moved there: losing `holder` would lose both), or their copies
    /// are of two phases (one moved in from another process), and no round asked for it
    /// since; or a partition moved out of `holder` since its last round (what it exported
    /// there is logged there, and lost with it: a replay from the older copies would miss
    /// it). A replay needs the lost process's copies all of one phase: a round of some of
    /// its partitions alone would leave them of two.
    pub(crate) fn wants_round(
        &self,
        holder: ProcessId,
        chunks: impl IntoIterator<Item = ChunkId>,
    ) -> bool {
        if !self.enabled() {
            return false;
        }
        if self.left.contains(&holder) || self.deferred.contains(&holder) {
            return true;
        }
        let mut phase = None;
        for c in chunks {
            if self.asked_for.contains_key(&c) {
                continue;
            }
            match self.copies.get(&c) {
                None => return true,
                Some(k) if k.buddy == holder || phase.is_some_and(|p| p != k.phase) => {
                    return true;
                }
                Some(k) => phase = Some(k.phase),
            }
        }
        false
    }

    /// A round of every partition begins: what earlier rounds asked for is asked again.
    pub(crate) fn full_round(&mut self) {
        self.asked_for.clear();
        self.left.clear();
    }

    /// A round of phase `phase` was sent to process `owner`.
    pub(crate) fn round_asked(&mut self, owner: ProcessId, phase: u64) {
        self.deferred.remove(&owner);
        self.awaiting.push((owner, phase));
    }

    /// Defers a round of process `owner` if [`OPEN_ROUNDS`] of its rounds are not answered
    /// yet, and says whether it did: a deferred round is counted, and `owner` wants one at
    /// the next barrier where it may have one ([`Buddies::wants_round`]).
    ///
    /// Why: rounds asked at every barrier whatever the answers pile up the copies' bytes
    /// in the owners' memory and on the links when copying takes longer than the phases
    /// between rounds; this bounds them. And a buddy keeps the newest copy of a partition
    /// and the one it replaced: with more rounds open it drops the copy the coordinator
    /// knows of, and a replay then starts from a newer copy the buddy keeps of every lost
    /// partition, if there is one (the worker's `replay_from`), else the job rolls back.
    pub(crate) fn defers_round(&mut self, owner: ProcessId) -> bool {
        let open = self.awaiting.iter().filter(|r| r.0 == owner).count() >= OPEN_ROUNDS;
        if open {
            self.deferred.insert(owner);
            self.report.deferred += 1;
        }
        open
    }

    /// Process `owner` answered its round of phase `phase`.
    pub(crate) fn round_answered(&mut self, owner: ProcessId, phase: u64) {
        if let Some(i) = self.awaiting.iter().position(|&r| r == (owner, phase)) {
            self.awaiting.swap_remove(i);
        }
    }

    /// A round asks process `holder` for a copy of `chunk` as phase `phase` left it.
    pub(crate) fn asking(&mut self, holder: ProcessId, chunk: ChunkId, phase: u64) {
        self.asked_for.insert(chunk, phase);
        self.left.remove(&holder);
    }

    /// Whether the job takes buddy copies (and its processes keep halo logs).
    pub(crate) fn enabled(&self) -> bool {
        self.every.is_some()
    }

    /// The first phase whose exports the processes' halo logs must keep: the oldest copy's
    /// (a replay from it takes that phase's exports first), or the oldest round's whose
    /// answers have not come (they may still bring copies of that phase), or `ended` if
    /// there is neither.
    ///
    /// (The rounds not answered were left out at first: when the round of phase `c` was
    /// not answered by the next barrier, which trimmed the logs to `c + 1`, its copies,
    /// recorded just after, could not be replayed, the exports of phase `c` being gone.)
    pub(crate) fn log_from(&mut self, ended: u64) -> u64 {
        let from = self
            .copies
            .values()
            .map(|c| c.phase)
            .chain(self.awaiting.iter().map(|&(_, phase)| phase))
            .min()
            .unwrap_or(ended)
            .min(ended);
        self.trim_logs(from);
        from
    }

    /// Partition `chunk` exported its halos for `phase` in process `by`, which logs them: if
    /// it ran elsewhere before, its log there starts at `phase`. Nothing without buddy
    /// copies (nobody logs).
    pub(crate) fn exported(&mut self, chunk: ChunkId, by: ProcessId, phase: u64) {
        if !self.enabled() {
            return;
        }
        let segments = self.logs.entry(chunk).or_default();
        match segments.last() {
            Some(&(p, _)) if p == by => {}
            last => {
                if let Some(&(from, _)) = last {
                    if from != HERE && from != TAKEN {
                        self.left.insert(from);
                    }
                }
                segments.push((by, phase));
            }
        }
    }

    /// Partition `chunk` was replayed in process `by` from its copy of phase `copy_phase`:
    /// its exports from that phase on are in `by`'s log (the replay logs them there), no
    /// longer only in the lost process's. (Without this, a neighbour of a replayed partition
    /// lost before the next copies was refused for a log "not whole", the replayed one's
    /// log still naming the process lost first.)
    pub(crate) fn replayed(&mut self, chunk: ChunkId, by: ProcessId, copy_phase: u64) {
        if !self.enabled() {
            return;
        }
        self.replaying.remove(&chunk);
        let segments = self.logs.entry(chunk).or_default();
        segments.retain(|&(_, since)| since < copy_phase);
        segments.push((by, copy_phase));
        // The copy the buddy replayed from is used up, even one newer than this record's:
        // a late answer of its round must not bring it back, and one that came since the
        // recovery began (recorded, as newer than the copy it named) is gone from `by`.
        let f = self.floor.entry(chunk).or_default();
        *f = (*f).max(copy_phase + 1);
        if let Some(k) = self.copies.get(&chunk).copied() {
            if k.buddy == by && k.phase <= copy_phase {
                self.copies.remove(&chunk);
                self.unhold(k.buddy, k.bytes);
            }
        }
    }

    /// Whether the halo log of `chunk` holds its exports of phase `from` and later in
    /// processes that are `alive`: its log began at `from` or before, and every process
    /// that ran it since is alive, or gave the coordinator its piece of the log ([`TAKEN`]).
    pub(crate) fn log_covers(
        &self,
        chunk: ChunkId,
        from: u64,
        alive: impl Fn(ProcessId) -> bool,
    ) -> bool {
        let Some(segments) = self.logs.get(&chunk) else {
            return false;
        };
        let Some(start) = segments.iter().rposition(|&(_, since)| since <= from) else {
            return false;
        };
        segments[start..]
            .iter()
            .all(|&(p, _)| p == TAKEN || alive(p))
    }

    /// Partition `sender`, run here, exported `bytes` at the end of `phase` for `receiver`
    /// (`None`: every partition, an allgather's piece), held by a worker process: kept in
    /// the coordinator's own log while a copy may need it.
    pub(crate) fn log_here(
        &mut self,
        phase: u64,
        sender: ChunkId,
        receiver: Option<ChunkId>,
        bytes: &bytes::Bytes,
    ) {
        self.here_bytes += bytes.len() as u64;
        self.here
            .push_back((phase, sender, receiver, bytes.clone()));
    }

    /// Partition `chunk` left process `from`, with the records of the halo log it exported
    /// there (`LogOf`): they are kept here from now on, and its log's segments that were
    /// in `from` are here. (Otherwise they were lost with `from`, and a neighbour lost
    /// later could not be replayed from copies older than the move.)
    pub(crate) fn took_log(
        &mut self,
        from: ProcessId,
        chunk: ChunkId,
        records: Vec<crate::wire::frame::LogRecord>,
    ) {
        for (phase, sender, pieces) in records {
            for (to, b) in pieces {
                self.here_bytes += b.len() as u64;
                self.here.push_back((phase, sender, to, b));
            }
        }
        if let Some(segments) = self.logs.get_mut(&chunk) {
            for s in segments.iter_mut().filter(|s| s.0 == from) {
                s.0 = TAKEN;
            }
        }
    }

    /// Whether the newest segment of `chunk`'s log is here: its exports of this phase are
    /// logged by the coordinator ([`Buddies::log_here`]).
    pub(crate) fn logged_here(&self, chunk: ChunkId) -> bool {
        self.log_of(chunk).is_some_and(|(p, _)| p == HERE)
    }

    /// The coordinator's log records for `receivers`, of phases `from..=through`:
    /// `(phase, sender, receiver, bytes)`.
    pub(crate) fn here_for<'a>(
        &'a self,
        receivers: &'a [ChunkId],
        from: u64,
        through: u64,
    ) -> impl Iterator<Item = (u64, ChunkId, ChunkId, bytes::Bytes)> + 'a {
        self.here
            .iter()
            .filter(move |(p, ..)| (from..=through).contains(p))
            .flat_map(move |(p, s, r, b)| {
                let to: &[ChunkId] = match r {
                    Some(r) if receivers.contains(r) => std::slice::from_ref(r),
                    Some(_) => &[],
                    None => receivers,
                };
                to.iter().map(move |&r| (*p, *s, r, b.clone()))
            })
    }

    /// The logs' segments that end before `from` are no longer needed.
    fn trim_logs(&mut self, from: u64) {
        // (Records a `LogOf` brought are older than those behind them: not a queue.)
        let mut dropped = 0;
        self.here.retain(|h| {
            let keep = h.0 >= from;
            if !keep {
                dropped += h.3.len() as u64;
            }
            keep
        });
        self.here_bytes -= dropped;

        for segments in self.logs.values_mut() {
            if let Some(start) = segments.iter().rposition(|&(_, since)| since <= from) {
                segments.drain(..start);
            }
        }
    }

    /// The job value of `phase` (as sent to worker processes) is kept for replays; those of
    /// phases no copy needs go.
    pub(crate) fn job_value(&mut self, phase: u64, job: bytes::Bytes) {
        // The oldest copy's phase, or the last round's whose answers may not have come, or
        // that of any round not answered yet (a round between the every-`k` ones too), or
        // the phase that just ended: this barrier may ask a round of it after this call.
        // (Without the last, the first barrier's round, of phase 0, found the value of phase
        // 0 dropped when `k` > 1: in 20 s of seeded histories, 38 local recoveries refused
        // for "the job values since the copies are not kept" were all of it.)
        let round = self.every.and_then(|k| (phase / k * k).checked_sub(1));
        let keep = self
            .copies
            .values()
            .map(|c| c.phase)
            .chain(round)
            .chain(self.awaiting.iter().map(|&(_, p)| p))
            .chain(phase.checked_sub(1))
            .min()
            .unwrap_or(phase);
        // A replay from a copy of phase `c` exports the copy's pieces with `c`'s value too.
        while self.jobs.front().is_some_and(|(p, _)| *p < keep) {
            self.jobs.pop_front();
        }
        if self.jobs.back().is_some_and(|(p, _)| *p == phase) {
            // Recorded already (as the run began it): the same value.
            self.jobs.pop_back();
        } else if self.jobs.back().is_some_and(|(p, _)| *p > phase) {
            // Again after a rollback: the run goes on from an earlier phase.
            self.jobs.clear();
        }
        self.jobs.push_back((phase, job));
    }

    /// The job value of `phase`, the phase a run begins with (the job's first, or the one
    /// a rollback restored), as sent to its worker processes: kept as `job_value` keeps
    /// those of the phases after a barrier, unless it is kept already. Without it, copies
    /// taken at the end of that phase could not be replayed.
    pub(crate) fn first_job_value(&mut self, phase: u64, job: bytes::Bytes) {
        if self.enabled() && !self.jobs.iter().any(|(p, _)| *p == phase) {
            self.job_value(phase, job);
        }
    }

    /// The job values of phases `from..=to`, if all are kept.
    pub(crate) fn job_values(&self, from: u64, to: u64) -> Option<Vec<(u64, bytes::Bytes)>> {
        let v: Vec<(u64, bytes::Bytes)> = self
            .jobs
            .iter()
            .filter(|(p, _)| (from..=to).contains(p))
            .cloned()
            .collect();
        (v.len() as u64 == to + 1 - from.min(to + 1)).then_some(v)
    }

    /// The pieces of `chunk`'s halo log: the process of each and the phase it begins at.
    pub(crate) fn segments(&self, chunk: ChunkId) -> &[(ProcessId, u64)] {
        self.logs.get(&chunk).map_or(&[], Vec::as_slice)
    }

    /// Where the halo log of `chunk` is now, and since which phase.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn log_of(&self, chunk: ChunkId) -> Option<(ProcessId, u64)> {
        self.logs.get(&chunk).and_then(|s| s.last().copied())
    }

    /// Whether copies are taken at the barrier after phase `ended`.
    pub(crate) fn due(&self, ended: u64) -> bool {
        self.every.is_some_and(|k| (ended + 1) % k == 0)
    }

    /// The buddy of process `owner` among `processes` (`(process, node)`, each listening for
    /// its peers, in the roster's order): the next one after `owner` on another node, else
    /// the next one; `None` if `owner` is alone.
    pub(crate) fn buddy_of<N: PartialEq + Copy>(
        owner: ProcessId,
        node: N,
        processes: &[(ProcessId, N)],
    ) -> Option<ProcessId> {
        let after = processes.partition_point(|&(p, _)| p <= owner);
        let ring = || {
            processes[after..]
                .iter()
                .chain(&processes[..after])
                .filter(|&&(p, _)| p != owner)
        };
        ring()
            .find(|&&(_, n)| n != node)
            .or_else(|| ring().next())
            .map(|&(p, _)| p)
    }

    /// A round was asked of a process.
    pub(crate) fn asked(&mut self) {
        self.report.rounds += 1;
    }

    /// Partitions asked to be copied found no buddy.
    pub(crate) fn no_buddy(&mut self, n: usize) {
        self.report.refused += n as u64;
    }

    /// Process `buddy` keeps the copies `copied` (`(chunk, bytes)`) of `phase`; those of
    /// `refused` were not kept. Returns the copies no longer needed: `(process, before,
    /// chunks)`, the chunks whose copies of a phase before `before` that process keeps.
    pub(crate) fn copied(
        &mut self,
        phase: u64,
        buddy: ProcessId,
        copied: &[(ChunkId, u64)],
        refused: usize,
    ) -> Vec<(ProcessId, u64, Vec<ChunkId>)> {
        self.report.refused += refused as u64;
        let mut stale: Vec<(ProcessId, u64, ChunkId)> = Vec::new();
        for &(chunk, bytes) in copied {
            self.report.kept += 1;
            if self.asked_for.get(&chunk).is_some_and(|&p| p <= phase) {
                self.asked_for.remove(&chunk);
            }
            if self.replaying.contains(&chunk) {
                continue;
            }
            if self.floor.get(&chunk).is_some_and(|&f| phase < f) {
                // Older than a copy a replay used up: its buddy does not need it. Only it
                // and older ones are dropped: a newer copy there may be the one a recovery
                // under way replays (its start raised the floor past it; told to drop
                // everything before the floor, the buddy dropped it before the `Recover`
                // came, and the recovery was abandoned).
                stale.push((buddy, phase + 1, chunk));
                continue;
            }
            let new = Kept {
                phase,
                buddy,
                bytes,
            };
            if let Some(old) = self.copies.get(&chunk).copied() {
                if old.phase > phase {
                    // An answer overtaken by a newer round's: the buddy keeps the newer
                    // one if it is the same process; else its copy is not needed.
                    if old.buddy != buddy {
                        stale.push((buddy, old.phase, chunk));
                    }
                    continue;
                }
                self.unhold(old.buddy, old.bytes);
                if old.phase < phase {
                    // The buddy of the older copy drops it (the same buddy kept it until
                    // now, in case its owner was lost before this answer came).
                    stale.push((old.buddy, phase, chunk));
                }
            }
            *self.held.entry(buddy).or_default() += bytes;
            self.total += bytes;
            self.copies.insert(chunk, new);
            // An older round's answer that comes after this copy is gone (its buddy lost)
            // must not bring back a copy its buddy was told to drop: stale from now on.
            let f = self.floor.entry(chunk).or_default();
            *f = (*f).max(phase);
        }
        by_process(stale)
    }

    fn unhold(&mut self, process: ProcessId, bytes: u64) {
        if let Some(h) = self.held.get_mut(&process) {
            self.total -= bytes.min(*h);
            *h = h.saturating_sub(bytes);
            if *h == 0 {
                self.held.remove(&process);
            }
        }
    }

    /// The copies of `chunks` are not needed any more: forgotten. Returns, per process, the
    /// chunks whose copies it keeps.
    pub(crate) fn forget(&mut self, chunks: &[ChunkId]) -> Vec<(ProcessId, Vec<ChunkId>)> {
        let mut gone: Vec<(ProcessId, ChunkId)> = Vec::new();
        for &chunk in chunks {
            if let Some(old) = self.copies.remove(&chunk) {
                self.unhold(old.buddy, old.bytes);
                gone.push((old.buddy, chunk));
            }
        }
        by_process(gone.into_iter().map(|(p, c)| (p, 0, c)))
            .into_iter()
            .map(|(p, _, c)| (p, c))
            .collect()
    }

    /// The bytes of the copies kept now, in all.
    pub(crate) fn bytes(&self) -> u64 {
        self.total
    }

    /// Process `owner` keeps a halo log of `bytes` now.
    pub(crate) fn logged(&mut self, owner: ProcessId, bytes: u64) {
        self.log_bytes.insert(owner, bytes);
    }

    /// Process `process` is gone, with the copies and the logs it kept.
    pub(crate) fn lost(&mut self, process: ProcessId) {
        // Its log segments stay: a log that needs them is not whole any more.
        self.log_bytes.remove(&process);
        // Its rounds will not be answered.
        self.awaiting.retain(|&(owner, _)| owner != process);
        self.deferred.remove(&process);
        // What rounds asked for may never be answered now: asked again where needed.
        self.asked_for.clear();
        let Some(held) = self.held.remove(&process) else {
            return;
        };
        self.total -= held;
        let before = self.copies.len();
        self.copies.retain(|_, c| c.buddy != process);
        self.report.lost += (before - self.copies.len()) as u64;
    }

    /// The job rolled back: every copy is of a phase it computes again, and the processes
    /// dropped theirs.
    pub(crate) fn reset(&mut self) {
        self.copies.clear();
        self.held.clear();
        self.total = 0;
        self.logs.clear();
        self.log_bytes.clear();
        self.jobs.clear();
        self.floor.clear();
        self.here.clear();
        self.here_bytes = 0;
        self.asked_for.clear();
        self.awaiting.clear();
        self.deferred.clear();
        self.replaying.clear();
        self.left.clear();
    }

    /// The partitions of `chunks` are in the coordinator's own hands after phase `ended`:
    /// their copies are forgotten, and so is any answer of a round up to `ended` that comes
    /// later. Returns, per process, the chunks whose copies it keeps.
    pub(crate) fn in_hand(
        &mut self,
        chunks: &[ChunkId],
        ended: u64,
    ) -> Vec<(ProcessId, Vec<ChunkId>)> {
        for c in chunks {
            let f = self.floor.entry(*c).or_default();
            *f = (*f).max(ended + 1);
        }
        self.forget(chunks)
    }

    /// The copies of `chunks` were used up by a replay (their buddy dropped them): an answer
    /// of a round as old as theirs is stale from now on.
    pub(crate) fn used(&mut self, chunks: &[ChunkId]) {
        for c in chunks {
            if let Some(k) = self.copies.get(c) {
                self.floor.insert(*c, k.phase + 1);
            }
        }
        self.replaying.extend(chunks.iter().copied());
        let _ = self.forget(chunks);
    }

    /// The copy of `chunk`, if any: the phase it ended and the process that keeps it.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn copy_of(&self, chunk: ChunkId) -> Option<(u64, ProcessId)> {
        self.copies.get(&chunk).map(|c| (c.phase, c.buddy))
    }

    /// What the handle shows.
    pub(crate) fn report(&self) -> Copies {
        let mut r = self.report.clone();
        r.partitions = self.copies.len() as u64;
        r.bytes = self.total;
        r.max_bytes_per_process = self.held.values().copied().max().unwrap_or(0);
        r.newest_phase = self.copies.values().map(|c| c.phase).max();
        r.oldest_phase = self.copies.values().map(|c| c.phase).min();
        r.log_bytes = self.log_bytes.values().sum::<u64>() + self.here_bytes;
        r.max_log_bytes_per_process = self.log_bytes.values().copied().max().unwrap_or(0);
        r
    }
}

/// `(process, phase, chunk)` grouped by process and phase, sorted: `(process, phase, chunks)`.
fn by_process(
    items: impl IntoIterator<Item = (ProcessId, u64, ChunkId)>,
) -> Vec<(ProcessId, u64, Vec<ChunkId>)> {
    let mut items: Vec<_> = items.into_iter().collect();
    items.sort_unstable();
    let mut by: Vec<(ProcessId, u64, Vec<ChunkId>)> = Vec::new();
    for (p, phase, c) in items {
        match by.last_mut() {
            Some((last, b, chunks)) if (*last, *b) == (p, phase) => chunks.push(c),
            _ => by.push((p, phase, vec![c])),
        }
    }
    by
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buddy_is_the_next_process_on_another_node_if_there_is_one() {
        let p = |n| ProcessId(n);
        let roster = [(p(1), 'a'), (p(2), 'a'), (p(4), 'b'), (p(7), 'b')];
        assert_eq!(Buddies::buddy_of(p(1), 'a', &roster), Some(p(4)));
        assert_eq!(Buddies::buddy_of(p(4), 'b', &roster), Some(p(1)));
        assert_eq!(Buddies::buddy_of(p(7), 'b', &roster), Some(p(1)));
        let one_node = [(p(1), 'a'), (p(2), 'a'), (p(4), 'a')];
        assert_eq!(Buddies::buddy_of(p(2), 'a', &one_node), Some(p(4)));
        assert_eq!(Buddies::buddy_of(p(4), 'a', &one_node), Some(p(1)));
        assert_eq!(Buddies::buddy_of(p(1), 'a', &[(p(1), 'a')]), None);
        // An owner that does not listen itself still gets one.
        assert_eq!(Buddies::buddy_of(p(3), 'a', &one_node), Some(p(4)));
    }

    #[test]
    fn a_newer_copy_elsewhere_drops_the_older_and_a_lost_buddy_takes_its_copies() {
        let p = |n| ProcessId(n);
        let mut b = Buddies::new(Some(2));
        assert!(!b.due(0) && b.due(1) && !b.due(2) && b.due(3));
        assert!(b.copied(1, p(2), &[(0, 10), (1, 20)], 1).is_empty());
        assert_eq!(b.report().max_bytes_per_process, 30);
        // Chunk 1 is copied to process 3 two phases later: process 2 drops its copy.
        assert_eq!(b.copied(3, p(3), &[(1, 25)], 0), vec![(p(2), 3, vec![1])]);
        assert_eq!(b.copy_of(1), Some((3, p(3))));
        let r = b.report();
        assert_eq!(
            (r.partitions, r.bytes, r.max_bytes_per_process),
            (2, 35, 25)
        );
        assert_eq!((r.oldest_phase, r.newest_phase), (Some(1), Some(3)));
        assert_eq!((r.kept, r.refused), (3, 1));
        // An answer overtaken by a newer one changes nothing, and its copy goes (that
        // phase's and older: a newer one may be a recovery's, see below).
        assert_eq!(b.copied(1, p(2), &[(1, 20)], 0), vec![(p(2), 2, vec![1])]);
        assert_eq!(b.copy_of(1), Some((3, p(3))));
        b.lost(p(3));
        assert_eq!(b.copy_of(1), None);
        b.copied(1, p(4), &[(5, 7), (6, 7)], 0);
        assert_eq!(b.forget(&[6, 5, 9]), vec![(p(4), vec![5, 6])]);
        assert_eq!(b.copy_of(5), None);
        assert_eq!(b.copy_of(0), Some((1, p(2))));
        assert_eq!(b.report().lost, 1);
        // Logs: where each partition ran since when; gone with their process.
        assert_eq!(b.log_from(9), 1);
        b.exported(0, p(2), 4);
        b.exported(0, p(2), 5);
        assert_eq!(b.log_of(0), Some((p(2), 4)));
        b.exported(0, p(4), 6);
        assert_eq!(b.log_of(0), Some((p(4), 6)));
        assert!(b.log_covers(0, 4, |_| true) && b.log_covers(0, 7, |_| true));
        assert!(!b.log_covers(0, 3, |_| true), "it began at 4");
        assert!(b.log_covers(0, 6, |q| q == p(4)), "6 on is in process 4");
        assert!(!b.log_covers(0, 5, |q| q == p(4)), "5 is in process 2");
        b.logged(p(4), 100);
        assert_eq!(b.report().log_bytes, 100);
        b.lost(p(4));
        assert_eq!(b.report().log_bytes, 0);
        assert!(!b.log_covers(0, 6, |q| q != p(4)));
        // A copy used up by a replay: while it runs, an answer of a round that copied the
        // partition is neither recorded nor answered with a drop (the buddy may be about
        // to replay from that very copy); after it, a late answer of an older round does
        // not bring one back, and its buddy drops that round's copy and older ones only.
        b.copied(8, p(5), &[(7, 9)], 0);
        b.used(&[7]);
        assert!(b.copied(9, p(5), &[(7, 9)], 0).is_empty());
        assert!(b.copied(7, p(5), &[(7, 9)], 0).is_empty());
        assert_eq!(b.copy_of(7), None);
        b.replayed(7, p(5), 9);
        assert_eq!(b.copied(7, p(5), &[(7, 9)], 0), vec![(p(5), 8, vec![7])]);
        assert_eq!(b.copy_of(7), None);
        // A newer copy elsewhere, lost before an older round's answer came: that answer is
        // stale (its buddy was told to drop the copy when the newer one was recorded).
        b.copied(1, p(7), &[(10, 5)], 0);
        assert_eq!(b.copied(3, p(8), &[(10, 5)], 0), vec![(p(7), 3, vec![10])]);
        b.lost(p(8));
        assert_eq!(b.copied(2, p(7), &[(10, 5)], 0), vec![(p(7), 3, vec![10])]);
        assert_eq!(b.copy_of(10), None);
        b.reset();
        assert_eq!(b.report().partitions, 0);
    }

    /// Between rounds of every partition, a process copies all its partitions if one has
    /// no copy, or has it in the process itself, or their copies are of two phases; once
    /// until the answers come (a refused one waits for the next full round); a lost
    /// buddy's partitions are asked for again.
    #[test]
    fn a_process_with_a_partition_not_copied_elsewhere_copies_them_all_once() {
        let p = |n| ProcessId(n);
        let mut b = Buddies::new(Some(20));
        assert!(b.wants_round(p(1), [0, 1]));
        b.asking(p(1), 0, 0);
        b.asking(p(1), 1, 0);
        assert!(!b.wants_round(p(1), [0, 1]), "asked, not answered yet");
        b.copied(0, p(2), &[(0, 8)], 1);
        assert!(!b.wants_round(p(1), [0, 1]), "kept, and refused");
        assert!(
            b.wants_round(p(2), [0]),
            "moved into the process keeping its copy"
        );
        // Chunk 5 moves in with a copy of another phase.
        b.copied(4, p(3), &[(5, 8)], 0);
        assert!(b.wants_round(p(1), [0, 1, 5]));
        b.full_round();
        assert!(b.wants_round(p(1), [1]));
        b.asking(p(1), 1, 20);
        b.lost(p(2));
        assert!(b.wants_round(p(1), [0]) && b.wants_round(p(1), [1]));
        // A partition that leaves process 6 for process 7: process 6 copies its own again.
        b.full_round();
        b.copied(20, p(8), &[(8, 1), (9, 1)], 0);
        b.exported(8, p(6), 21);
        b.exported(9, p(6), 21);
        assert!(!b.wants_round(p(6), [8, 9]));
        b.exported(9, p(7), 22);
        assert!(b.wants_round(p(6), [8]));
        b.asking(p(6), 8, 22);
        assert!(!b.wants_round(p(6), [8]));
    }

    /// A round not answered yet keeps the logs from its phase: its copies may still come,
    /// and a replay from them needs that phase's exports.
    #[test]
    fn the_logs_keep_the_phase_of_a_round_not_answered_yet() {
        let p = |n| ProcessId(n);
        let mut b = Buddies::new(Some(1));
        b.exported(0, p(1), 0);
        b.exported(1, p(2), 0);
        // The round after phase 0 is asked of processes 1 and 2; the next barrier (a round
        // of every partition: what was asked is forgotten) comes before their answers.
        assert_eq!(b.log_from(0), 0);
        b.round_asked(p(1), 0);
        b.round_asked(p(2), 0);
        b.exported(1, p(3), 1);
        b.full_round();
        assert_eq!(b.log_from(1), 0, "the round of phase 0 is not answered");
        assert!(
            b.log_covers(1, 0, |_| true),
            "chunk 1's phase 0 is in process 2"
        );
        b.round_asked(p(1), 1);
        b.round_asked(p(3), 1);
        // Phase 0's answers come: its copies can be replayed.
        b.round_answered(p(1), 0);
        b.copied(0, p(2), &[(0, 8)], 0);
        b.round_answered(p(2), 0);
        b.copied(0, p(1), &[(1, 8)], 0);
        assert_eq!(b.copy_of(1), Some((0, p(1))));
        assert!(b.log_covers(1, 0, |_| true));
        // Phase 1's come, one of them from a process lost first: phase 0 may go.
        b.round_answered(p(1), 1);
        b.copied(1, p(2), &[(0, 8)], 0);
        assert_eq!(b.log_from(2), 0, "chunk 1's copy is still of phase 0");
        b.lost(p(3));
        b.copied(1, p(2), &[(1, 8)], 0);
        assert_eq!(b.log_from(2), 1);
    }

    /// Two rounds open per process at most; a deferred round is asked at the first barrier
    /// after an answer, even between rounds of every partition.
    #[test]
    fn rounds_wait_for_the_answers_to_the_last_two() {
        let p = |n| ProcessId(n);
        let mut b = Buddies::new(Some(1));
        b.full_round();
        assert!(!b.defers_round(p(1)));
        b.round_asked(p(1), 0);
        b.full_round();
        assert!(!b.defers_round(p(1)), "one round open");
        b.round_asked(p(1), 1);
        b.full_round();
        assert!(b.defers_round(p(1)), "two rounds open");
        assert!(!b.defers_round(p(2)));
        b.round_asked(p(2), 2);
        assert_eq!(b.report().deferred, 1);
        // An answer comes: the deferred one wants a round at once (its copies are of one
        // phase, and no round of every partition is due).
        b.round_answered(p(1), 0);
        b.copied(0, p(3), &[(0, 8), (1, 8)], 0);
        assert!(b.wants_round(p(1), [0, 1]) && !b.wants_round(p(2), [0]));
        assert!(!b.defers_round(p(1)));
        b.round_asked(p(1), 3);
        assert!(!b.wants_round(p(1), [0, 1]), "asked: not deferred any more");
        assert!(b.defers_round(p(1)));
        // A lost owner's rounds will not be answered: it is not held back by them.
        b.lost(p(1));
        assert!(!b.defers_round(p(1)));
        assert_eq!(b.report().deferred, 2);
    }

    /// The first barrier records the next phase's job value before it asks the round of
    /// the phase that ended: that phase's value stays for the round's copies.
    #[test]
    fn the_job_value_of_the_phase_a_barrier_copies_is_kept() {
        let mut b = Buddies::new(Some(2));
        let v = |n: u8| bytes::Bytes::from(vec![n]);
        b.first_job_value(0, v(0));
        b.job_value(1, v(1));
        b.round_asked(ProcessId(1), 0);
        assert_eq!(b.job_values(0, 1).map(|v| v.len()), Some(2));
        // Answered with copies of phase 0: kept while they are the oldest.
        b.round_answered(ProcessId(1), 0);
        b.copied(0, ProcessId(2), &[(0, 8)], 0);
        b.job_value(2, v(2));
        b.job_value(3, v(3));
        assert_eq!(b.job_values(0, 3).map(|v| v.len()), Some(4));
        // A newer copy: the values before it go, and the phase just ended stays.
        b.copied(2, ProcessId(2), &[(0, 8)], 0);
        b.job_value(4, v(4));
        assert!(b.job_values(1, 4).is_none());
        assert_eq!(b.job_values(2, 4).map(|v| v.len()), Some(3));
    }

    /// The coordinator's own log: what a partition run here sent to partitions in
    /// processes, by phase and receiver, trimmed with the processes' logs, counted with
    /// them, and gone at a rollback.
    #[test]
    fn the_coordinator_logs_what_its_own_partitions_sent() {
        let mut b = Buddies::new(Some(2));
        let bytes = |n: usize| bytes::Bytes::from(vec![7u8; n]);
        b.exported(3, HERE, 4);
        assert!(b.logged_here(3) && !b.logged_here(4));
        for phase in 4..7 {
            b.log_here(phase, 3, Some(2), &bytes(10));
            b.log_here(phase, 3, Some(4), &bytes(20));
        }
        assert_eq!(b.report().log_bytes, 90);
        assert_eq!(
            b.report().max_log_bytes_per_process,
            0,
            "no process keeps it"
        );
        let to_4: Vec<_> = b
            .here_for(&[4], 5, 6)
            .map(|(p, s, r, _)| (p, s, r))
            .collect();
        assert_eq!(to_4, vec![(5, 3, 4), (6, 3, 4)]);
        assert!(b.log_covers(3, 4, |q| q == HERE));
        // No copy older than 6: the records before it go.
        assert_eq!(b.log_from(6), 6);
        assert_eq!(b.here_for(&[2, 4], 0, 9).count(), 2);
        assert_eq!(b.report().log_bytes, 30);
        b.reset();
        assert_eq!(
            (b.here_for(&[2, 4], 0, 9).count(), b.report().log_bytes),
            (0, 0)
        );
    }

    /// A partition that left a process brought the records of the log it exported there
    /// (`LogOf`): they are the coordinator's from then on, so its log covers the phases it
    /// ran there even once that process is lost; an allgather's piece among them is for
    /// every receiver asked; older records that came late are trimmed all the same.
    #[test]
    fn the_log_a_leaving_partition_brought_is_kept_here() {
        let mut b = Buddies::new(Some(2));
        let bytes = |n: usize| bytes::Bytes::from(vec![7u8; n]);
        let (p, q) = (ProcessId(1), ProcessId(2));
        b.exported(3, p, 4);
        b.exported(3, q, 6);
        b.exported(5, q, 4);
        let alive = |x: ProcessId| x != p;
        assert!(!b.log_covers(3, 4, alive), "ran in a lost process since 4");
        b.log_here(7, 9, Some(2), &bytes(5));
        let records = vec![
            (4, 3, vec![(Some(2), bytes(10)), (None, bytes(20))]),
            (5, 3, vec![(Some(4), bytes(10))]),
        ];
        b.took_log(p, 3, records);
        assert!(b.log_covers(3, 4, alive));
        assert_eq!(b.segments(3), &[(TAKEN, 4), (q, 6)]);
        // One whose last stint was there: what it exports next is logged where it runs
        // next, not here (a barrier would log it twice).
        b.exported(6, p, 5);
        b.took_log(p, 6, vec![(5, 6, vec![(Some(5), bytes(1))])]);
        assert_eq!(b.segments(6), &[(TAKEN, 5)]);
        assert!(!b.logged_here(6) && b.log_covers(6, 5, alive));
        assert_eq!(b.segments(5), &[(q, 4)], "another partition's log stays");
        let mut to: Vec<_> = b
            .here_for(&[2, 4], 4, 5)
            .map(|(p, s, r, b)| (p, s, r, b.len()))
            .collect();
        to.sort_unstable();
        assert_eq!(
            to,
            vec![(4, 3, 2, 10), (4, 3, 2, 20), (4, 3, 4, 20), (5, 3, 4, 10)]
        );
        assert_eq!(b.report().log_bytes, 46);
        // The records of phase 4 go with the first trim past them, behind newer ones or not.
        assert_eq!(b.log_from(5), 5);
        assert_eq!(b.report().log_bytes, 16);
        assert_eq!(b.here_for(&[2, 4], 0, 9).count(), 2);
    }

    /// A partition replayed in process `r` from its copy of phase 3 has its log there from
    /// phase 3 on: whole while `r` lives though the process it ran in since is lost, not
    /// whole from before the copy; without copies, nothing is recorded.
    #[test]
    fn a_replayed_partition_s_log_is_where_it_was_replayed_from_the_copy_s_phase() {
        let mut b = Buddies::new(Some(1));
        let (p, q, r) = (ProcessId(1), ProcessId(2), ProcessId(3));
        b.exported(4, p, 1);
        b.exported(4, q, 4);
        let alive = |x: ProcessId| x != q;
        assert!(!b.log_covers(4, 3, alive), "ran in a lost process since 4");
        b.replayed(4, r, 3);
        assert_eq!(b.segments(4), &[(p, 1), (r, 3)]);
        assert!(b.log_covers(4, 3, alive));
        assert!(!b.log_covers(4, 3, |x| x != r), "its replayer lost");
        assert!(
            !b.log_covers(4, 2, |x| x != p),
            "before the copy, where it ran"
        );
        // It runs on there: one piece of log.
        b.exported(4, r, 5);
        assert_eq!(b.segments(4), &[(p, 1), (r, 3)]);
        let mut off = Buddies::new(None);
        off.replayed(4, r, 3);
        assert!(off.segments(4).is_empty());
        // Replayed from a copy newer than the one recorded (a round answered after the
        // recovery began, then used up by the replay): the record goes, and a late answer
        // of that round does not bring it back; a newer round's copy is kept.
        b.copied(2, r, &[(6, 8)], 0);
        b.copied(3, ProcessId(9), &[(7, 8)], 0);
        b.replayed(6, r, 5);
        b.replayed(7, r, 5);
        assert_eq!(b.copy_of(6), None);
        assert_eq!(b.copy_of(7), Some((3, ProcessId(9))), "kept elsewhere");
        b.copied(4, r, &[(6, 8)], 0);
        assert_eq!(b.copy_of(6), None, "stale");
        b.copied(6, r, &[(6, 8)], 0);
        assert_eq!(b.copy_of(6), Some((6, r)));
    }
}
