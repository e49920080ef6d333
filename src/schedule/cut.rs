//! The snapshot cut as a state machine: requests and captures in, commands out.
//!
//! Like the core it has no threads, clocks, channels or I/O. It is generic over what it
//! collects: `H` the cut's header (whatever the executor records at the marker: the job
//! value, the merge state), `P` a chunk's part (its state's bytes, or a part already in the
//! store), `O` a chunk's output as it will be stored, `R` a requester to answer, `E` an error.
//! The executor feeds it and carries out its [`CutCommand`]s; the tests drive it together with
//! the core (`cut/tests.rs`).
//!
//! # The protocol (Chandy–Lamport, made simple because chunks do not talk to each other)
//!
//! 1. *Marker.* When a snapshot is due ([`Cut::poll`]) the cut records, from the ledger as it
//!    is at that moment: the header, the part of every pending chunk that was started
//!    (suspended with a state), and every running chunk with its worker in `waiting`; it
//!    emits [`CutCommand::Capture`] for each of them. Chunks folded or held in the merge are
//!    in the header; pending chunks never started need nothing (they restart from scratch).
//! 2. *Capture.* A waiting chunk leaves `waiting` with the first of these to reach the cut
//!    from the worker the marker saw it on ([`Cut::captured`]): its state at an adjustment
//!    point, its output if it ended first (the output wins: a restore must not run the rest of
//!    a finished chunk), its state handed back (retire, halt), or, if the worker was lost, the
//!    state the ledger falls back to (or nothing: from scratch). Anything later for that chunk,
//!    or from another worker, is not the cut's.
//! 3. *Write.* When `waiting` is empty the cut is complete: [`CutCommand::Write`] hands it to
//!    the writer. One write at a time: requests that come meanwhile are queued and start the
//!    next cut once [`Cut::written`] is told the outcome, so epochs commit in order.
//! 4. *Answer.* Requesters are answered by the executor with the write's result; a capture
//!    that fails abandons the cut ([`CutCommand::Fail`]) and withdraws the remaining captures.
//!
//! Why every chunk appears exactly once in a complete cut: at the marker each chunk is in
//! exactly one ledger state (the core's invariant). Folded and held chunks are in the header,
//! suspended ones in `parts`, running ones in `waiting`, never-started ones nowhere. A waiting
//! chunk is moved once from `waiting` to `parts` or `done` (or dropped, from scratch): the
//! first capture removes it, and any later one finds it gone. Work done after the marker on a
//! pending chunk is simply not in the snapshot: restoring redoes it.
//!
//! # Suspend
//!
//! [`Cut::suspend`] halts the core ([`CutCommand::Halt`]): running chunks are interrupted and
//! handed back. An open cut of snapshot requests is dropped and its requesters wait for the
//! suspend's snapshot instead, so no extra snapshot is committed while the job suspends. Once
//! no chunk runs (*quiescence*) and no write is in flight, [`Cut::poll`] starts the suspend's
//! cut, which then needs no capture: the whole ledger is pending, done or
//! suspended. After a commit the executor ends the job with the snapshot; if the write fails,
//! the cut un-halts the core ([`CutCommand::Unhalt`]) and the job goes on.
//!
//! # Incremental parts
//!
//! A pending chunk's state that did not change since a committed snapshot need not be written
//! again. [`Cut::written`] returns the chunks that were suspended at the marker and were not
//! handed to any worker from the marker until the write's outcome ([`Cut::ran`]); only their
//! parts may be reused by a later cut.

use std::collections::{BTreeMap, BTreeSet};

use super::core::{ChunkId, Core, WorkerId};
use crate::reduce::Reducer;

/// What a running chunk left for the cut (protocol step 2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Captured<P, O> {
    /// Its state at an adjustment point, or handed back.
    State(P),
    /// Its output: it ended before its capture.
    Output(O),
    /// Its output and its owned partition as it ended (a job with owned partitions).
    Kept(O, P),
    /// Its output; its owned partition stayed with the worker process that ran it, and is
    /// asked for with [`CutCommand::CaptureHeld`].
    KeptHeld(O),
    /// Nothing: its worker was lost and the ledger holds no state for it; it restarts from
    /// scratch.
    Scratch,
    /// Nothing yet: it was granted to the worker and given back unstarted; its owned
    /// partition is still with the worker process it was granted on, unchanged since the
    /// marker, and is asked for with [`CutCommand::CaptureHeld`].
    Held,
}

/// A complete cut, for the writer (protocol step 3).
#[derive(Debug)]
pub struct Write<H, P, O, R> {
    /// What the executor recorded at the marker.
    pub header: H,
    /// Parts of suspended and captured chunks, in chunk order.
    pub parts: Vec<(ChunkId, P)>,
    /// Outputs of chunks that ended before their capture, in chunk order.
    pub done: Vec<(ChunkId, O)>,
    /// Owned partitions of done chunks, in chunk order.
    pub kept: Vec<(ChunkId, P)>,
    /// Whether this is a suspend's cut.
    pub suspend: bool,
    /// Who waits for this snapshot.
    pub replies: Vec<R>,
}

/// An output of the cut, for the executor to carry out.
#[derive(Debug)]
pub enum CutCommand<H, P, O, R, E> {
    /// Ask `worker` to capture `chunk` at its next adjustment point.
    Capture {
        /// The worker.
        worker: WorkerId,
        /// The chunk it runs.
        chunk: ChunkId,
    },
    /// Ask for the part of pending or kept `chunk`, whose state the ledger does not have (an
    /// owned partition held by a worker process): answered with [`Cut::captured_held`].
    CaptureHeld {
        /// The chunk.
        chunk: ChunkId,
    },
    /// The capture asked of `worker` is no longer wanted.
    Withdraw {
        /// The worker.
        worker: WorkerId,
    },
    /// Halt the core (interrupt every running chunk, hand out nothing).
    Halt,
    /// Resume the core after a suspend that did not happen.
    Unhalt,
    /// Write a complete cut.
    Write(Write<H, P, O, R>),
    /// The snapshot these requesters wait for failed before it was written.
    Fail {
        /// Who to answer.
        replies: Vec<R>,
        /// Why.
        error: E,
    },
}

/// The outcome of a write, as [`Cut::written`] is told it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// The snapshot is committed.
    Committed,
    /// It was not.
    Failed,
}

/// A cut in progress: marker issued, waiting for captures.
#[derive(Debug)]
struct Open<H, P, O, R> {
    header: H,
    parts: Vec<(ChunkId, P)>,
    done: Vec<(ChunkId, O)>,
    kept: Vec<(ChunkId, P)>,
    /// Chunks running at the marker, and the worker each ran on.
    waiting: BTreeMap<ChunkId, WorkerId>,
    /// Pending (`false`) or kept (`true`) chunks whose part is asked of their holder.
    held: BTreeMap<ChunkId, bool>,
    suspend: bool,
    replies: Vec<R>,
}

/// The snapshot protocol of one job run.
#[derive(Debug)]
pub struct Cut<H, P, O, R> {
    open: Option<Open<H, P, O, R>>,
    /// A complete cut is being written: `Some(true)` if it is a suspend's.
    writing: Option<bool>,
    /// Snapshot requests that wait for the next cut.
    queued: Vec<R>,
    /// A suspend was asked for (with these requesters); it starts at quiescence.
    suspend: Option<Vec<R>>,
    /// Chunks suspended at the last marker.
    suspended_at_marker: Vec<ChunkId>,
    /// Chunks handed to a worker since the last marker.
    ran: BTreeSet<ChunkId>,
}

impl<H, P, O, R> Default for Cut<H, P, O, R> {
    fn default() -> Self {
        Cut {
            open: None,
            writing: None,
            queued: Vec::new(),
            suspend: None,
            suspended_at_marker: Vec::new(),
            ran: BTreeSet::new(),
        }
    }
}

impl<H, P, O, R> Cut<H, P, O, R> {
    /// No snapshot under way.
    pub fn new() -> Self {
        Cut::default()
    }

    /// Asks for a snapshot; `reply` is answered with it. Joins a cut whose marker is out;
    /// otherwise waits for the next one, started by [`Cut::poll`].
    pub fn request(&mut self, reply: R) {
        match &mut self.open {
            Some(open) => open.replies.push(reply),
            None => self.queued.push(reply),
        }
    }

    /// Asks for a suspend: halts the core now (the first time) and snapshots at quiescence.
    ///
    /// A cut of snapshot requests whose marker is out gives way to the suspend: its captures
    /// are withdrawn and its requesters get the suspend's snapshot, so no other snapshot is
    /// committed on the way to the suspend (a periodic snapshot started just before a
    /// deadline would otherwise delay it by a whole write). A cut already being written
    /// still completes.
    pub fn suspend<E>(&mut self, reply: Option<R>, out: &mut Vec<CutCommand<H, P, O, R, E>>) {
        match &mut self.suspend {
            Some(replies) => replies.extend(reply),
            None => {
                let mut replies: Vec<R> = reply.into_iter().collect();
                if let Some(open) = self.open.take_if(|o| !o.suspend) {
                    for &worker in open.waiting.values() {
                        out.push(CutCommand::Withdraw { worker });
                    }
                    replies.extend(open.replies);
                }
                self.suspend = Some(replies);
                out.push(CutCommand::Halt);
            }
        }
    }

    /// Whether a suspend was asked for and has not been written yet.
    pub fn suspending(&self) -> bool {
        self.suspend.is_some() || self.open.as_ref().is_some_and(|o| o.suspend)
    }

    /// Whether a cut is open (marker out, captures awaited).
    pub fn is_open(&self) -> bool {
        self.open.is_some()
    }

    /// Whether a complete cut is being written.
    pub fn is_writing(&self) -> bool {
        self.writing.is_some()
    }

    /// Whether the open cut waits for `chunk` from `worker`.
    pub fn waits_for(&self, worker: WorkerId, chunk: ChunkId) -> bool {
        self.open
            .as_ref()
            .is_some_and(|o| o.waiting.get(&chunk) == Some(&worker))
    }

    /// Whether [`Cut::poll`] would start a cut now (so the executor can prepare the parts
    /// of pending chunks beforehand, off the path of the marker).
    pub fn is_due<Rd: Reducer, S>(&self, core: &Core<Rd, S>) -> bool {
        if self.open.is_some() || self.writing.is_some() {
            return false;
        }
        match self.suspend {
            Some(_) => core.running().next().is_none(),
            None => !self.queued.is_empty(),
        }
    }

    /// Starts a cut if one is due and none is open or being written (protocol step 1): the
    /// suspend's once the core is quiet, else one for queued requests. `header` records what
    /// the executor needs of the ledger; `part_of` gives a suspended or kept chunk's part, or
    /// `None` when only the chunk's holder has it (then [`CutCommand::CaptureHeld`] asks for
    /// it). An error of either fails the requests (and un-halts a suspend).
    pub fn poll<Rd: Reducer, S, E>(
        &mut self,
        core: &Core<Rd, S>,
        header: impl FnOnce(&Core<Rd, S>) -> Result<H, E>,
        mut part_of: impl FnMut(ChunkId, &S) -> Result<Option<P>, E>,
        out: &mut Vec<CutCommand<H, P, O, R, E>>,
    ) {
        if self.open.is_some() || self.writing.is_some() {
            return;
        }
        // (Asked only of a suspend: a scan of the workers, at every event.)
        let (replies, suspend) = match self.suspend.take() {
            Some(replies) if core.running().next().is_none() => (replies, true),
            Some(replies) => {
                self.suspend = Some(replies);
                return;
            }
            None if !self.queued.is_empty() => (std::mem::take(&mut self.queued), false),
            None => return,
        };
        // A suspend's snapshot also answers the requests queued behind the last write.
        let replies = if suspend {
            let mut r = replies;
            r.append(&mut self.queued);
            r
        } else {
            replies
        };
        let mut held = BTreeMap::new();
        let recorded = header(core).and_then(|header| {
            let mut parts = Vec::new();
            for (c, state) in core.suspended() {
                match part_of(c, state)? {
                    Some(p) => parts.push((c, p)),
                    None => {
                        held.insert(c, false);
                    }
                }
            }
            let mut kept = Vec::new();
            for (c, state) in core.kept() {
                match part_of(c, state)? {
                    Some(p) => kept.push((c, p)),
                    None => {
                        held.insert(c, true);
                    }
                }
            }
            Ok((header, parts, kept))
        });
        let (header, mut parts, kept) = match recorded {
            Ok(r) => r,
            Err(error) => {
                out.push(CutCommand::Fail { replies, error });
                if suspend {
                    out.push(CutCommand::Unhalt);
                }
                return;
            }
        };
        parts.sort_unstable_by_key(|p| p.0);
        // Kept partitions do not change until the next phase starts, which counts as a run.
        self.suspended_at_marker = parts.iter().chain(&kept).map(|p| p.0).collect();
        self.suspended_at_marker.extend(held.keys().copied());
        for &chunk in held.keys() {
            out.push(CutCommand::CaptureHeld { chunk });
        }
        self.ran.clear();
        let mut waiting = BTreeMap::new();
        for (worker, chunk) in core.running() {
            waiting.insert(chunk, worker);
            out.push(CutCommand::Capture { worker, chunk });
        }
        self.open = Some(Open {
            header,
            parts,
            done: Vec::new(),
            kept,
            waiting,
            held,
            suspend,
            replies,
        });
        self.try_complete(out);
    }

    /// Protocol step 2: what `worker` left of `chunk` (or why it could not leave it). Ignored
    /// unless the open cut waits for `chunk` from `worker`. An error abandons the cut.
    pub fn captured<E>(
        &mut self,
        worker: WorkerId,
        chunk: ChunkId,
        what: Result<Captured<P, O>, E>,
        out: &mut Vec<CutCommand<H, P, O, R, E>>,
    ) {
        let Some(open) = &mut self.open else { return };
        if open.waiting.get(&chunk) != Some(&worker) {
            return;
        }
        open.waiting.remove(&chunk);
        match what {
            Ok(Captured::State(p)) => open.parts.push((chunk, p)),
            Ok(Captured::Output(o)) => open.done.push((chunk, o)),
            Ok(Captured::Kept(o, p)) => {
                open.done.push((chunk, o));
                open.kept.push((chunk, p));
            }
            Ok(Captured::KeptHeld(o)) => {
                open.done.push((chunk, o));
                open.held.insert(chunk, true);
                out.push(CutCommand::CaptureHeld { chunk });
            }
            Ok(Captured::Held) => {
                open.held.insert(chunk, false);
                out.push(CutCommand::CaptureHeld { chunk });
            }
            Ok(Captured::Scratch) => {}
            Err(error) => return self.abandon(error, out),
        }
        self.try_complete(out);
    }

    /// The part of a chunk asked for with [`CutCommand::CaptureHeld`] (or why it could not be
    /// had). Ignored unless the open cut waits for it. An error abandons the cut.
    pub fn captured_held<E>(
        &mut self,
        chunk: ChunkId,
        part: Result<P, E>,
        out: &mut Vec<CutCommand<H, P, O, R, E>>,
    ) {
        let Some(open) = &mut self.open else { return };
        let Some(kept) = open.held.remove(&chunk) else {
            return;
        };
        match part {
            Ok(p) if kept => open.kept.push((chunk, p)),
            Ok(p) => open.parts.push((chunk, p)),
            Err(error) => return self.abandon(error, out),
        }
        self.try_complete(out);
    }

    /// Whether the open cut waits for the part of `chunk` from its holder.
    pub fn waits_for_held(&self, chunk: ChunkId) -> bool {
        self.open
            .as_ref()
            .is_some_and(|o| o.held.contains_key(&chunk))
    }

    /// A chunk was handed to a worker: its state will change (see "Incremental parts").
    pub fn ran(&mut self, chunk: ChunkId) {
        if self.open.is_some() || self.writing.is_some() {
            self.ran.insert(chunk);
        }
    }

    /// The outcome of the write in flight. Returns the chunks whose parts in that snapshot
    /// stay valid for later cuts (empty unless it was committed). After a failed suspend's
    /// write the core is un-halted and the suspend is dropped (whoever asked may ask again).
    pub fn written<E>(
        &mut self,
        outcome: Written,
        out: &mut Vec<CutCommand<H, P, O, R, E>>,
    ) -> Vec<ChunkId> {
        let suspend = self.writing.take().unwrap_or(false);
        match outcome {
            Written::Committed => {
                let ran = std::mem::take(&mut self.ran);
                std::mem::take(&mut self.suspended_at_marker)
                    .into_iter()
                    .filter(|c| !ran.contains(c))
                    .collect()
            }
            Written::Failed => {
                // A suspend asked for while this one was written still wants the core halted.
                if suspend && self.suspend.is_none() {
                    out.push(CutCommand::Unhalt);
                }
                Vec::new()
            }
        }
    }

    /// The job ended: every requester not yet answered (an open cut's, a suspend's, queued),
    /// to be told so. A write in flight still completes.
    pub fn end(&mut self) -> Vec<R> {
        let mut replies = self.open.take().map(|o| o.replies).unwrap_or_default();
        replies.extend(self.suspend.take().unwrap_or_default());
        replies.append(&mut self.queued);
        replies
    }

    /// The job rolls back, or recovers locally (owned partitions were lost with their
    /// worker): a cut whose marker is out cannot complete any more, because the rollback
    /// drops the chunks it waits for (a recovery replays them to a later phase)
    /// (a worker process answers `Abandon` with no state) and a state that is not a chunk's
    /// must never become a part. Its captures are withdrawn and its requesters wait with the
    /// queued ones for the restored run's cut ([`Cut::take_requests`]). A cut already being
    /// written completes: everything in it was taken before the loss.
    pub fn give_way<E>(&mut self, out: &mut Vec<CutCommand<H, P, O, R, E>>) {
        let Some(open) = self.open.take() else { return };
        for &worker in open.waiting.values() {
            out.push(CutCommand::Withdraw { worker });
        }
        if open.suspend {
            self.suspend
                .get_or_insert_with(Vec::new)
                .extend(open.replies);
        } else {
            self.queued.extend(open.replies);
        }
        self.suspended_at_marker.clear();
        self.ran.clear();
    }

    /// The job rolls back to a snapshot: every requester not yet answered is taken out, to
    /// ask again of the restored run's cut: `(snapshot requesters, a suspend's requesters if
    /// one was asked for)`. An open cut is dropped (what it waited for is discarded with the
    /// run). Call it only when no write is in flight.
    pub fn take_requests(&mut self) -> (Vec<R>, Option<Vec<R>>) {
        debug_assert!(self.writing.is_none());
        let mut snapshots = std::mem::take(&mut self.queued);
        let mut suspend = self.suspend.take();
        if let Some(open) = self.open.take() {
            if open.suspend {
                suspend.get_or_insert_with(Vec::new).extend(open.replies);
            } else {
                snapshots.extend(open.replies);
            }
        }
        self.suspended_at_marker.clear();
        self.ran.clear();
        (snapshots, suspend)
    }

    fn abandon<E>(&mut self, error: E, out: &mut Vec<CutCommand<H, P, O, R, E>>) {
        let Some(open) = self.open.take() else { return };
        for (_, &worker) in open.waiting.iter() {
            out.push(CutCommand::Withdraw { worker });
        }
        out.push(CutCommand::Fail {
            replies: open.replies,
            error,
        });
        if open.suspend && self.suspend.is_none() {
            out.push(CutCommand::Unhalt);
        }
    }

    fn try_complete<E>(&mut self, out: &mut Vec<CutCommand<H, P, O, R, E>>) {
        if !self
            .open
            .as_ref()
            .is_some_and(|o| o.waiting.is_empty() && o.held.is_empty())
        {
            return;
        }
        let Some(open) = self.open.take() else { return };
        let Open {
            header,
            mut parts,
            mut done,
            mut kept,
            suspend,
            replies,
            ..
        } = open;
        parts.sort_unstable_by_key(|p| p.0);
        done.sort_unstable_by_key(|d| d.0);
        kept.sort_unstable_by_key(|k| k.0);
        self.writing = Some(suspend);
        out.push(CutCommand::Write(Write {
            header,
            parts,
            done,
            kept,
            suspend,
            replies,
        }));
    }
}

#[cfg(test)]
mod tests;
