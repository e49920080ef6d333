//! The sans-IO core: the ledger of a phase and the assignment of its chunks to workers.
//!
//! The core is a deterministic state machine. The executor feeds it [`Event`]s and carries
//! out the [`Command`]s it appends to a caller-owned buffer; it has no threads, clocks,
//! channels or I/O, so local threads, remote workers and the tests drive it the same way.
//! It is generic over the chunk state `S` (a live chunk for local workers, bytes for remote
//! ones) and over the reducer, whose values are the chunk outputs.
//!
//! # The ledger
//!
//! Every chunk of the current phase is in exactly one of these states:
//!
//! | state | where |
//! | --- | --- |
//! | pending, never started | the schedule's pile or queues, no state |
//! | pending, suspended with state S | the schedule's pile or queues, and `suspended[c] = S` |
//! | running on worker W | `workers[W].running == Some(c)` (and maybe `known[c]`, a last state) |
//! | done with output O | the ordered merge (folded, or held until its predecessors arrive) |
//!
//! # Protocol (one worker, as the core sees it)
//!
//! 1. `Joined(W)`: W is idle; the core answers `Run(W, c, state)` if a chunk is pending for it.
//! 2. W runs steps of c back to back, talking to nobody, until the chunk ends or W is
//!    interrupted; then it reports `Done(W, c, output)` or `Yielded(W, c, state)` and the core
//!    answers with W's next command (another `Run`, or `Release` if W is retiring), or nothing
//!    (W is idle until a later event gives it work).
//! 3. `Retire(W)`: an idle W is released at once; a running W is marked retiring and
//!    `Interrupt(W)` is emitted; W hands its chunk back with `Yielded` at its next adjustment
//!    point (or finishes it with `Done`) and is released.
//! 4. `Lost(W)`: W is gone without a word; its chunk becomes pending again with the last
//!    state the core holds (`StateReport`), or from the start.
//!
//! # Why it is exactly once
//!
//! A chunk is handed to at most one worker at a time (it leaves the pile when `Run` is
//! emitted, and comes back only through `Yielded` or `Lost` of that same worker). `Done` is
//! accepted only from the worker the chunk runs on, and the ordered merge refuses a second
//! output of a chunk. A lost worker's late report is refused because the worker is no longer
//! in the table. So every chunk's output is merged once, and a handed-back chunk resumes from
//! the exact state it was handed back with.

use std::fmt;
use std::ops::Range;
use std::time::Duration;

use super::dynamic::Pile;
use super::idhash::{ChunkMap, IdMap, chunk_map};
use super::owned::Owners;
use super::static_::Deal;
use super::{Plan, Schedule};
use crate::reduce::{OrderedMerge, Reducer};

/// Identifies a worker for the lifetime of a job run; ids are never reused.
pub type WorkerId = u64;

/// The index of a chunk within its phase.
pub type ChunkId = u64;

/// Identifies a worker process (one connection of it) for the lifetime of an executor; ids
/// are never reused. Its slots are workers ([`WorkerId`]) of their own; a process id is never
/// a worker id, and the two never share a map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProcessId(pub u64);

impl fmt::Display for ProcessId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// What a worker measured while running a chunk, reported with `Done` and `Yielded`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Work {
    /// Iterations the worker did on this chunk during this run (0 if it cannot tell).
    pub iterations: u64,
    /// Time spent in `step` during this run.
    pub busy: Duration,
}

/// An input to the core. (Field names say what they hold; each variant's doc says when.)
#[derive(Debug)]
#[allow(missing_docs)]
pub enum Event<S, O> {
    /// A worker is ready for work.
    Joined { worker: WorkerId },
    /// `worker` finished `chunk` with `output`; for a job with owned partitions, `kept` is
    /// the partition as the chunk left it, which the next phase runs from.
    Done {
        worker: WorkerId,
        chunk: ChunkId,
        output: O,
        kept: Option<S>,
        work: Work,
    },
    /// `worker` handed `chunk` back at an adjustment point, with its live state.
    Yielded {
        worker: WorkerId,
        chunk: ChunkId,
        state: S,
        work: Work,
    },
    /// A copy of the state of `chunk`, running on `worker`, to restart from if it is lost.
    StateReport {
        worker: WorkerId,
        chunk: ChunkId,
        state: S,
    },
    /// `worker` gives back granted chunks it did not start (`Core::grant`), after an
    /// interrupt: the rest of what it was granted, or that and the chunk the ledger counts
    /// as its running one (the worker had not started it either). Their states are the ones
    /// they were granted with.
    Returned {
        worker: WorkerId,
        chunks: Vec<ChunkId>,
    },
    /// Retire `worker` at its next adjustment point.
    Retire { worker: WorkerId },
    /// `worker` is gone (its thread or connection died).
    Lost { worker: WorkerId },
}

/// An output of the core, for the executor to carry out.
#[derive(Debug, PartialEq)]
#[allow(missing_docs)]
pub enum Command<S> {
    /// Run `chunk` (iterations `range`) on `worker`, from `state` or from the start.
    Run {
        worker: WorkerId,
        chunk: ChunkId,
        range: Range<u64>,
        state: Option<S>,
    },
    /// Ask `worker` to stop at its next adjustment point and report.
    Interrupt { worker: WorkerId },
    /// `worker` has no chunk and leaves: it may exit.
    Release { worker: WorkerId },
}

impl<S, O> Event<S, O> {
    /// The worker the event is about.
    pub fn worker(&self) -> WorkerId {
        match self {
            Event::Joined { worker }
            | Event::Done { worker, .. }
            | Event::Yielded { worker, .. }
            | Event::StateReport { worker, .. }
            | Event::Returned { worker, .. }
            | Event::Retire { worker }
            | Event::Lost { worker } => *worker,
        }
    }
}

/// An event that does not fit the ledger (a report of a chunk the worker does not run, an
/// unknown worker). The core's state is unchanged; a remote peer that sends it is faulty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    /// The worker the event came from.
    pub worker: WorkerId,
    /// Why it was rejected.
    pub reason: &'static str,
}

impl fmt::Display for Rejected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "event from worker {} rejected: {}",
            self.worker, self.reason
        )
    }
}

impl std::error::Error for Rejected {}

/// Weight of the newest sample in the throughput moving average.
const EWMA_ALPHA: f64 = 0.3;

#[derive(Debug)]
struct WorkerSlot {
    running: Option<ChunkId>,
    /// Owned partitions granted to run after `running`, in order ([`Core::grant`]): the
    /// worker runs them without asking again, so they count as running on it.
    granted: std::collections::VecDeque<ChunkId>,
    retiring: bool,
    /// Iterations per second, exponentially weighted; 0 until measured.
    throughput: f64,
}

#[derive(Debug)]
enum Pending {
    Pile(Pile),
    Deal(Deal),
    /// Owned partitions (`owned.rs`): queued on their holders.
    Owned(Owners),
}

/// The core for one job run: current phase's ledger and the worker table.
pub struct Core<R: Reducer, S> {
    schedule: Schedule,
    reducer: R,
    plan: Plan,
    pending: Pending,
    /// States of pending chunks that were started and handed back.
    suspended: ChunkMap<S>,
    /// Last reported states of running chunks, for when their worker is lost.
    known: ChunkMap<S>,
    /// Owned partitions: the partitions of the phase's done chunks, which the next phase
    /// runs from. (The chunks' tables are walked in chunk order: `ChunkMap`.)
    kept: ChunkMap<S>,
    /// Owned partitions: the phase is not the job's first, so every partition has a state
    /// that only its holder had: one lost with its worker cannot be made again.
    later_phase: bool,
    /// Owned partitions lost with their worker (see `later_phase`); they do not run again.
    lost: Vec<ChunkId>,
    merge: OrderedMerge<R::Value>,
    done_chunks: u64,
    done_iterations: u64,
    workers: IdMap<WorkerId, WorkerSlot>,
    /// Idle workers, in the order they became idle.
    idle: Vec<WorkerId>,
    halted: bool,
}

impl<R: Reducer, S> fmt::Debug for Core<R, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Core")
            .field("schedule", &self.schedule)
            .field("chunks", &self.plan.len())
            .field("done_chunks", &self.done_chunks)
            .field("workers", &self.workers.len())
            .field("halted", &self.halted)
            .finish_non_exhaustive()
    }
}

impl<R: Reducer, S> Core<R, S> {
    /// A core for a phase with this plan; no workers yet.
    pub fn new(schedule: Schedule, plan: Plan, reducer: R) -> Self {
        let merge = OrderedMerge::new(reducer.identity());
        let pending = Pending::Pile(Pile::new(0));
        let mut core = Core {
            schedule,
            reducer,
            plan: Plan::Uniform { n: 0, size: 1 },
            pending,
            suspended: ChunkMap::default(),
            known: ChunkMap::default(),
            kept: ChunkMap::default(),
            later_phase: false,
            lost: Vec::new(),
            merge,
            done_chunks: 0,
            done_iterations: 0,
            workers: IdMap::default(),
            idle: Vec::new(),
            halted: false,
        };
        core.reset(plan);
        core
    }

    fn reset(&mut self, plan: Plan) {
        let len = plan.len();
        if matches!(self.pending, Pending::Owned(_)) {
            // Every chunk is pending with the partition its last phase left, on its holder;
            // the phase's partitions fill a table of the right size rather than grow one.
            self.suspended = std::mem::replace(&mut self.kept, chunk_map(len as usize));
            self.later_phase = true;
            let speeds = self.owner_view();
            if let Pending::Owned(o) = &mut self.pending {
                o.start_phase(&speeds, &plan);
            }
        } else {
            self.pending = match self.schedule {
                Schedule::Static => Pending::Deal(Deal::new(len, &self.member_speeds(), &plan)),
                Schedule::Dynamic | Schedule::Guided(_) => Pending::Pile(Pile::new(len)),
            };
            self.suspended.clear();
        }
        self.plan = plan;
        self.known = chunk_map(self.known.capacity());
        self.done_chunks = 0;
        self.done_iterations = 0;
    }

    /// Makes a fresh core (no worker, nothing run) one of owned partitions: chunk `c` runs
    /// from the partition chunk `c` of the previous phase left (`Event::Done::kept`), on the
    /// worker that holds it (`owned.rs`); the schedule is not used. Every phase must have the
    /// plan of the first. `phase` is the job's phase number (a restore's may be later than
    /// 0): after the first, a partition lost with its worker cannot be made again
    /// ([`Core::lost_partitions`]).
    pub fn with_partitions(mut self, phase: u64) -> Self {
        self.later_phase = phase > 0;
        let len = self.plan.len();
        let pending: Vec<ChunkId> = match &self.pending {
            Pending::Owned(_) => return self,
            Pending::Pile(p) => p.pending().collect(),
            Pending::Deal(d) => d.pending().collect(),
        };
        self.pending = Pending::Owned(Owners::with_pending(len, pending));
        self
    }

    /// A core for a phase restored from a snapshot: chunks `0..merged` are folded into
    /// `reduced`, `done` holds outputs of later chunks, `suspended` the states of started
    /// chunks; every other chunk is pending from the start. No workers yet.
    ///
    /// # Errors
    ///
    /// A chunk index out of range or listed twice (a snapshot that does not fit the plan).
    #[allow(clippy::too_many_arguments)]
    pub fn restore(
        schedule: Schedule,
        plan: Plan,
        reducer: R,
        merged: u64,
        reduced: R::Value,
        done: Vec<(ChunkId, R::Value)>,
        suspended: Vec<(ChunkId, S)>,
        kept: Vec<(ChunkId, S)>,
    ) -> Result<Self, String> {
        let len = plan.len();
        if merged > len {
            return Err(format!("{merged} chunks merged, but the phase has {len}"));
        }
        let mut seen = std::collections::BTreeSet::new();
        for c in done
            .iter()
            .map(|d| d.0)
            .chain(suspended.iter().map(|s| s.0))
        {
            if c < merged || c >= len || !seen.insert(c) {
                return Err(format!(
                    "chunk {c} is out of place in a phase of {len} chunks with {merged} merged"
                ));
            }
        }
        let done_set: std::collections::BTreeSet<ChunkId> = done.iter().map(|d| d.0).collect();
        let last_done = done_set.last().map_or(merged, |&c| c + 1);
        let pending: Vec<ChunkId> = (merged..last_done)
            .filter(|c| !done_set.contains(c))
            .collect();
        let mut core = Core::new(schedule, Plan::Uniform { n: 0, size: 1 }, reducer);
        core.done_chunks = merged + done.len() as u64;
        core.done_iterations = (0..merged)
            .chain(done_set.iter().copied())
            .map(|c| {
                let r = plan.range(c);
                r.end - r.start
            })
            .sum();
        core.pending = match schedule {
            Schedule::Static => {
                let all: Vec<ChunkId> = pending.into_iter().chain(last_done..len).collect();
                Pending::Deal(Deal::with_pending(all, &[], &plan))
            }
            Schedule::Dynamic | Schedule::Guided(_) => {
                Pending::Pile(Pile::with_pending(len, &pending, last_done))
            }
        };
        let mut kept_seen = std::collections::BTreeSet::new();
        for &(c, _) in &kept {
            if c >= len || !kept_seen.insert(c) || !(c < merged || done_set.contains(&c)) {
                return Err(format!(
                    "the partition of chunk {c} is kept, but the chunk is not done"
                ));
            }
        }
        core.merge = OrderedMerge::restore(&core.reducer, merged, reduced, done);
        core.suspended = suspended.into_iter().collect();
        core.kept = kept.into_iter().collect();
        core.plan = plan;
        Ok(core)
    }

    /// Starts the next phase with `plan` and `reducer`; idle workers get chunks. Call it only
    /// after [`Core::finish_phase`].
    pub fn start_phase(&mut self, plan: Plan, reducer: R, out: &mut Vec<Command<S>>) {
        debug_assert!(self.workers.values().all(|s| s.running.is_none()));
        self.merge = OrderedMerge::new(reducer.identity());
        self.reducer = reducer;
        self.reset(plan);
        self.dispatch(out);
    }

    /// Whether every chunk of the phase is done.
    pub fn phase_complete(&self) -> bool {
        self.done_chunks == self.plan.len()
    }

    /// Takes the phase's value once it is complete (the merge restarts from the identity).
    pub fn finish_phase(&mut self) -> R::Value {
        debug_assert!(self.phase_complete());
        let fresh = OrderedMerge::new(self.reducer.identity());
        std::mem::replace(&mut self.merge, fresh).into_value()
    }

    /// Stops handing out chunks (for cancel and suspend); running chunks are interrupted and
    /// handed back, keeping the ledger complete.
    pub fn halt(&mut self, out: &mut Vec<Command<S>>) {
        self.halted = true;
        for (&w, slot) in &self.workers {
            if slot.running.is_some() {
                out.push(Command::Interrupt { worker: w });
            }
        }
    }

    /// Hands out chunks again after [`Core::halt`] (a suspend whose snapshot failed).
    pub fn unhalt(&mut self, out: &mut Vec<Command<S>>) {
        self.halted = false;
        self.dispatch(out);
    }

    /// Worker `worker` joins without a reassignment or a dispatch: for the slots of one worker
    /// process, which join together. The next event (the last slot's `Joined`) reassigns and
    /// dispatches once for all of them, where a `Joined` each would deal the owned partitions
    /// once per slot.
    ///
    /// # Errors
    ///
    /// A worker that joined before is rejected and changes nothing.
    pub fn join_quietly(&mut self, worker: WorkerId) -> Result<(), Rejected> {
        if self.workers.contains_key(&worker) {
            return Err(Rejected {
                worker,
                reason: "joined twice",
            });
        }
        self.workers.insert(
            worker,
            WorkerSlot {
                running: None,
                granted: std::collections::VecDeque::new(),
                retiring: false,
                throughput: 0.0,
            },
        );
        self.idle.push(worker);
        Ok(())
    }

    /// Feeds one event; commands go to `out`.
    ///
    /// # Errors
    ///
    /// An event that does not fit the ledger is rejected and changes nothing.
    pub fn handle(
        &mut self,
        event: Event<S, R::Value>,
        out: &mut Vec<Command<S>>,
    ) -> Result<(), Rejected> {
        match event {
            Event::Joined { worker } => {
                self.join_quietly(worker)?;
                self.membership_changed();
                self.dispatch(out);
            }
            Event::Done {
                worker,
                chunk,
                output,
                kept,
                work,
            } => {
                let owned = matches!(self.pending, Pending::Owned(_));
                if owned && kept.is_none() {
                    self.check_running(worker, chunk)?;
                    return Err(Rejected {
                        worker,
                        reason: "a done chunk without its partition",
                    });
                }
                self.finish_run(worker, chunk, work)?;
                if !self.merge.add(&self.reducer, chunk, output) {
                    // Unreachable through `finish_run`, which admits one report per run.
                    return Err(Rejected {
                        worker,
                        reason: "second output for a chunk",
                    });
                }
                self.known.remove(&chunk);
                if let (true, Some(state)) = (owned, kept) {
                    self.kept.insert(chunk, state);
                }
                let r = self.plan.range(chunk);
                self.done_chunks += 1;
                self.done_iterations += r.end - r.start;
                self.next_for(worker, out);
            }
            Event::Yielded {
                worker,
                chunk,
                state,
                work,
            } => {
                self.finish_run(worker, chunk, work)?;
                self.known.remove(&chunk);
                self.suspended.insert(chunk, state);
                self.put_back(chunk);
                self.next_for(worker, out);
                self.dispatch(out);
            }
            Event::StateReport {
                worker,
                chunk,
                state,
            } => {
                self.check_running(worker, chunk)?;
                self.known.insert(chunk, state);
            }
            Event::Retire { worker } => self.retire_all(&[worker], out)?,
            Event::Lost { worker } => {
                let slot = self.remove(worker).ok_or(Rejected {
                    worker,
                    reason: "unknown worker",
                })?;
                // Its running chunk, then what it was granted: each goes back with the
                // state it was handed out with.
                for c in slot.running.into_iter().chain(slot.granted) {
                    match self.known.remove(&c) {
                        Some(state) => {
                            self.suspended.insert(c, state);
                        }
                        // A partition's state after the first phase existed only on the
                        // lost worker: running it from scratch would give a wrong value.
                        None if self.later_phase && self.is_partitioned() => {
                            self.lost.push(c);
                            continue;
                        }
                        None => {}
                    }
                    self.put_back(c);
                }
                self.membership_changed();
                self.dispatch(out);
            }
            Event::Returned { worker, chunks } => {
                let slot = self.workers.get_mut(&worker).ok_or(Rejected {
                    worker,
                    reason: "unknown worker",
                })?;
                let mine = |c: &ChunkId| slot.running == Some(*c) || slot.granted.contains(c);
                let twice = chunks
                    .iter()
                    .enumerate()
                    .any(|(i, c)| chunks[..i].contains(c));
                if chunks.is_empty() || twice || !chunks.iter().all(mine) {
                    return Err(Rejected {
                        worker,
                        reason: "returned chunks that were not granted to it",
                    });
                }
                slot.granted.retain(|c| !chunks.contains(c));
                if slot.running.is_some_and(|c| chunks.contains(&c)) {
                    slot.running = slot.granted.pop_front();
                }
                let idle = slot.running.is_none();
                for c in chunks {
                    match self.known.remove(&c) {
                        Some(state) => {
                            self.suspended.insert(c, state);
                        }
                        // Never started: its partition is nowhere, and a first phase deals
                        // such chunks again in contiguous blocks (`Owners::reassign`).
                        None => {
                            if let Pending::Owned(o) = &mut self.pending {
                                o.unhold(c);
                            }
                        }
                    }
                    self.put_back(c);
                }
                if idle {
                    self.next_for(worker, out);
                }
                self.dispatch(out);
            }
        }
        Ok(())
    }

    /// Retires `workers` together ([`Event::Retire`] for each, with one reassignment and one
    /// dispatch after the last): the slots of a worker process leave at once, and none of
    /// them is handed a chunk that another of them gave up. (Retired one at a time, the
    /// process's later slots were given the chunks of its earlier ones, a partition the
    /// process had just been asked to hand back among them.)
    ///
    /// # Errors
    ///
    /// A worker the ledger does not know is rejected, and nothing changes.
    pub fn retire_all(
        &mut self,
        workers: &[WorkerId],
        out: &mut Vec<Command<S>>,
    ) -> Result<(), Rejected> {
        if let Some(&worker) = workers.iter().find(|w| !self.workers.contains_key(w)) {
            return Err(Rejected {
                worker,
                reason: "unknown worker",
            });
        }
        let mut changed = false;
        for &worker in workers {
            let slot = self.workers.get_mut(&worker).expect("checked above");
            if slot.retiring {
                continue;
            }
            slot.retiring = true;
            changed = true;
            if slot.running.is_some() {
                out.push(Command::Interrupt { worker });
            } else {
                self.remove(worker);
                out.push(Command::Release { worker });
            }
        }
        if changed {
            self.membership_changed();
            // The static deal may have given the leavers' queues to an idle worker.
            self.dispatch(out);
        }
        Ok(())
    }

    fn check_running(&self, worker: WorkerId, chunk: ChunkId) -> Result<(), Rejected> {
        match self.workers.get(&worker) {
            None => Err(Rejected {
                worker,
                reason: "unknown worker",
            }),
            Some(s) if s.running != Some(chunk) && !s.granted.contains(&chunk) => Err(Rejected {
                worker,
                reason: "chunk not running on this worker",
            }),
            Some(_) => Ok(()),
        }
    }

    /// Ends `worker`'s run of `chunk` and updates its throughput.
    fn finish_run(&mut self, worker: WorkerId, chunk: ChunkId, work: Work) -> Result<(), Rejected> {
        self.check_running(worker, chunk)?;
        let slot = self.workers.get_mut(&worker).expect("checked above");
        if slot.running == Some(chunk) {
            slot.running = None;
        } else {
            slot.granted.retain(|&c| c != chunk);
        }
        let secs = work.busy.as_secs_f64();
        if work.iterations > 0 && secs > 0.0 {
            let rate = work.iterations as f64 / secs;
            slot.throughput = if slot.throughput == 0.0 {
                rate
            } else {
                EWMA_ALPHA * rate + (1.0 - EWMA_ALPHA) * slot.throughput
            };
        }
        Ok(())
    }

    /// The next command for a worker that just reported: release it if retiring, else give
    /// it a chunk or make it idle.
    fn next_for(&mut self, worker: WorkerId, out: &mut Vec<Command<S>>) {
        let slot = self.workers.get_mut(&worker).expect("a member");
        if slot.running.is_some() {
            // A granted chunk reported before the one it was granted after (the worker
            // process sends each report when it is ready): the slot goes on.
            return;
        }
        if let Some(next) = slot.granted.pop_front() {
            // Granted already: the worker goes on with it by itself.
            slot.running = Some(next);
            return;
        }
        if self.workers[&worker].retiring {
            self.remove(worker);
            out.push(Command::Release { worker });
        } else if !self.assign(worker, out) {
            self.idle.push(worker);
        }
    }

    /// Gives `worker` its next pending chunk, if any.
    fn assign(&mut self, worker: WorkerId, out: &mut Vec<Command<S>>) -> bool {
        if self.halted {
            return false;
        }
        let chunk = match &mut self.pending {
            Pending::Pile(p) => p.take(),
            Pending::Deal(d) => d.take(worker),
            Pending::Owned(o) => {
                let c = o.take(worker).or_else(|| o.steal(worker));
                if let Some(c) = c {
                    o.ran(c, worker);
                }
                c
            }
        };
        let Some(chunk) = chunk else { return false };
        let state = if self.suspended.is_empty() {
            None
        } else {
            self.suspended.remove(&chunk)
        };
        if let Some(slot) = self.workers.get_mut(&worker) {
            slot.running = Some(chunk);
        }
        out.push(Command::Run {
            worker,
            chunk,
            range: self.plan.range(chunk),
            state,
        });
        true
    }

    /// Gives pending chunks to idle workers.
    fn dispatch(&mut self, out: &mut Vec<Command<S>>) {
        // Nothing pending: nothing to look for in every idle worker's queue (at the end of a
        // phase, most workers are idle and every event would ask each of them).
        if let Pending::Owned(o) = &self.pending {
            if o.is_empty() {
                return;
            }
        }
        // Serve idle workers first come, first served; keep the ones that got nothing in order.
        let mut idle = std::mem::take(&mut self.idle);
        let mut pile_empty = false;
        idle.retain(|&w| {
            if pile_empty {
                return true;
            }
            let assigned = self.assign(w, out);
            // With a shared pile, one refusal means it is empty for everyone.
            pile_empty = !assigned && matches!(self.pending, Pending::Pile(_));
            !assigned
        });
        self.idle = idle;
    }

    fn put_back(&mut self, chunk: ChunkId) {
        if matches!(self.pending, Pending::Owned(_)) {
            let speeds = self.owner_view();
            if let Pending::Owned(o) = &mut self.pending {
                o.put_back(chunk, &speeds);
                o.reassign(&speeds, &self.plan, 0.0);
            }
            return;
        }
        match &mut self.pending {
            Pending::Owned(_) => {}
            Pending::Pile(p) => p.put_back(chunk),
            Pending::Deal(d) => {
                d.put_back(chunk);
                if d.is_stale() {
                    self.redeal();
                }
            }
        }
    }

    fn remove(&mut self, worker: WorkerId) -> Option<WorkerSlot> {
        self.idle.retain(|&w| w != worker);
        self.workers.remove(&worker)
    }

    /// Workers that take chunks (not retiring), sorted by id, with their throughput (the mean
    /// of the measured ones for a worker not yet measured).
    fn member_speeds(&self) -> Vec<(WorkerId, f64)> {
        let mut v: Vec<(WorkerId, f64)> = self
            .workers
            .iter()
            .filter(|(_, s)| !s.retiring)
            .map(|(&w, s)| (w, s.throughput))
            .collect();
        v.sort_unstable_by_key(|&(w, _)| w);
        let measured: Vec<f64> = v.iter().map(|&(_, t)| t).filter(|&t| t > 0.0).collect();
        let mean = if measured.is_empty() {
            1.0
        } else {
            measured.iter().sum::<f64>() / measured.len() as f64
        };
        for (_, t) in &mut v {
            if *t <= 0.0 {
                *t = mean;
            }
        }
        v
    }

    /// The members for owned partitions: as [`Core::member_speeds`], with the iterations of
    /// the chunk each runs.
    fn owner_view(&self) -> Vec<(WorkerId, f64, u64)> {
        self.member_speeds()
            .into_iter()
            .map(|(w, speed)| {
                let busy = self.workers[&w].running.map_or(0, |c| {
                    let r = self.plan.range(c);
                    r.end - r.start
                });
                (w, speed, busy)
            })
            .collect()
    }

    fn membership_changed(&mut self) {
        if matches!(self.pending, Pending::Owned(_)) {
            let speeds = self.owner_view();
            if let Pending::Owned(o) = &mut self.pending {
                o.reassign(&speeds, &self.plan, 0.0);
            }
            return;
        }
        if let Pending::Deal(d) = &mut self.pending {
            if d.membership_changed() {
                self.redeal();
            }
        }
    }

    fn redeal(&mut self) {
        if matches!(self.pending, Pending::Deal(_)) {
            let speeds = self.member_speeds();
            let suspended = &self.suspended;
            if let Pending::Deal(d) = &mut self.pending {
                d.redeal(&speeds, &self.plan, |c| !suspended.contains_key(&c));
            }
        }
    }

    // ----- read-only views -----

    /// Iterations of the phase's done chunks, and the phase's total.
    pub fn progress(&self) -> (u64, u64) {
        (self.done_iterations, self.plan.iterations())
    }

    /// Each worker's measured throughput (iterations per second while it runs steps, a
    /// moving average over its runs; 0 until its first run ended), retiring ones excluded.
    pub fn throughputs(&self) -> impl Iterator<Item = (WorkerId, f64)> + '_ {
        self.workers
            .iter()
            .filter(|(_, s)| !s.retiring)
            .map(|(&w, s)| (w, s.throughput))
    }

    /// Owned partitions: the pending chunks queued on `worker`, in the order it runs them
    /// (none without owned partitions).
    pub(crate) fn queued(&self, worker: WorkerId) -> Vec<ChunkId> {
        match &self.pending {
            Pending::Owned(o) => o.queue(worker),
            _ => Vec::new(),
        }
    }

    /// Owned partitions: `worker` is one of the slots of worker process `process`, so
    /// partitions are balanced between processes and move between its slots for free. Set
    /// it before the worker joins.
    pub(crate) fn set_process(&mut self, worker: WorkerId, process: ProcessId) {
        if let Pending::Owned(o) = &mut self.pending {
            o.set_process(worker, process);
        }
    }

    /// Owned partitions: the partitions kept between phases that no worker holds (a
    /// rollback's restored ones) are dealt over the workers as a first phase deals chunks, in
    /// a contiguous block per worker process or worker, and held where they are dealt: the
    /// next phase runs each there ([`Core::holder`]).
    pub(crate) fn deal_unheld_kept(&mut self) {
        let workers = self.owner_view();
        tracing::debug!(
            ?workers,
            "restored partitions dealt over these workers (id, speed, iterations running)"
        );
        let mut chunks: Vec<ChunkId> = self.kept.keys().copied().collect();
        chunks.sort_unstable();
        if let Pending::Owned(o) = &mut self.pending {
            chunks.retain(|&c| o.holder(c).is_none());
            o.deal_unheld(&workers, chunks, &self.plan);
        }
    }

    /// Owned partitions: the worker that holds the partition of `chunk`, if one does.
    pub(crate) fn holder(&self, chunk: ChunkId) -> Option<WorkerId> {
        match &self.pending {
            Pending::Owned(o) => o.holder(chunk),
            _ => None,
        }
    }

    /// The chunk `worker` runs, if any.
    pub(crate) fn running_on(&self, worker: WorkerId) -> Option<ChunkId> {
        self.workers.get(&worker).and_then(|s| s.running)
    }

    /// The snapshot view of the merge: chunks `0..merged` folded into the value, and the
    /// outputs of later done chunks.
    pub fn merge_state(&self) -> (u64, &R::Value, impl Iterator<Item = (ChunkId, &R::Value)>) {
        (self.merge.merged(), self.merge.value(), self.merge.held())
    }

    /// Owned partitions of the phase's done chunks, which the next phase runs from.
    pub fn kept(&self) -> impl Iterator<Item = (ChunkId, &S)> {
        self.kept.iter().map(|(&c, s)| (c, s))
    }

    /// The same, to change them at a phase barrier (halos in).
    pub(crate) fn kept_mut(&mut self) -> impl Iterator<Item = (ChunkId, &mut S)> {
        self.kept.iter_mut().map(|(&c, s)| (c, s))
    }

    /// The states of pending chunks, then the partitions kept between phases, to change them
    /// in place (a rollback fills in the ones it read itself).
    pub(crate) fn states_mut(&mut self) -> impl Iterator<Item = (ChunkId, &mut S)> {
        let Core {
            suspended, kept, ..
        } = self;
        suspended
            .iter_mut()
            .chain(kept.iter_mut())
            .map(|(&c, s)| (c, s))
    }

    /// The states of pending chunks, to change them in place (the snapshot writer takes them
    /// out to serialize them on several threads, and puts them back).
    pub(crate) fn suspended_mut(&mut self) -> impl Iterator<Item = (ChunkId, &mut S)> {
        self.suspended.iter_mut().map(|(&c, s)| (c, s))
    }

    /// Owned partitions `chunks` are held by `worker` from now on, and none of them moves to
    /// another worker process before the next phase start (a local recovery replays them in
    /// `worker`'s process; see `Owners::pin`).
    pub(crate) fn pin(&mut self, chunks: &[ChunkId], worker: WorkerId) {
        if let Pending::Owned(o) = &mut self.pending {
            o.pin(chunks, worker);
        }
    }

    /// Records owned partitions lost with a worker process that held them between runs (the
    /// ledger has no state for them): see [`Core::lost_partitions`].
    pub(crate) fn lose(&mut self, chunks: &[ChunkId]) {
        for &c in chunks {
            if !self.lost.contains(&c) {
                self.lost.push(c);
            }
        }
    }

    /// Whether `worker` is a member of this ledger (joined, and neither lost nor released).
    pub fn knows(&self, worker: WorkerId) -> bool {
        self.workers.contains_key(&worker)
    }

    /// Owned partitions lost with their worker after the first phase: the phase cannot
    /// complete (the job must roll back to a snapshot or end).
    pub fn lost_partitions(&self) -> &[ChunkId] {
        &self.lost
    }

    /// Whether chunks are owned partitions ([`Core::with_partitions`]).
    pub fn is_partitioned(&self) -> bool {
        matches!(self.pending, Pending::Owned(_))
    }

    /// Owned partitions handed to a worker other than the one that held them, since the job
    /// run started (0 without owned partitions).
    pub fn partitions_moved(&self) -> u64 {
        match &self.pending {
            Pending::Owned(o) => o.moved(),
            _ => 0,
        }
    }

    /// Pending chunks that were started, with their states.
    pub fn suspended(&self) -> impl Iterator<Item = (ChunkId, &S)> {
        self.suspended.iter().map(|(&c, s)| (c, s))
    }

    /// Running chunks and their workers.
    pub fn running(&self) -> impl Iterator<Item = (WorkerId, ChunkId)> + '_ {
        self.workers.iter().flat_map(|(&w, s)| {
            s.running
                .into_iter()
                .chain(s.granted.iter().copied())
                .map(move |c| (w, c))
        })
    }

    /// Owned partitions: grants `worker`, which runs a chunk, the chunks queued after it
    /// whose states `held` accepts (the partitions its worker process holds, or chunks not
    /// started yet: `None`), in queue order, stopping at the first it does not. The worker runs them one after the other
    /// without a `Run` each: a worker process then needs no round trip per partition in a
    /// phase. They count as running on it ([`Core::running`]) until each is reported
    /// (`Done`, `Yielded`), given back unstarted ([`Event::Returned`]) or lost with it;
    /// their states are its fallbacks, as a `StateReport` makes them. None for a worker that
    /// retires, or while the core is halted.
    pub(crate) fn grant(
        &mut self,
        worker: WorkerId,
        mut held: impl FnMut(ChunkId, Option<&S>) -> bool,
    ) -> Vec<(ChunkId, Range<u64>)> {
        let mut granted = Vec::new();
        let Some(slot) = self.workers.get(&worker) else {
            return granted;
        };
        if self.halted || slot.retiring || slot.running.is_none() {
            return granted;
        }
        let Pending::Owned(o) = &mut self.pending else {
            return granted;
        };
        while let Some(c) = o.peek(worker) {
            if !held(c, self.suspended.get(&c)) {
                break;
            }
            o.take(worker);
            o.ran(c, worker);
            if let Some(state) = self.suspended.remove(&c) {
                self.known.insert(c, state);
            }
            granted.push((c, self.plan.range(c)));
        }
        if let Some(slot) = self.workers.get_mut(&worker) {
            slot.granted.extend(granted.iter().map(|(c, _)| *c));
        }
        granted
    }

    /// Whether `worker` runs `chunk`, or was granted it ([`Core::grant`]).
    pub(crate) fn runs(&self, worker: WorkerId, chunk: ChunkId) -> bool {
        self.check_running(worker, chunk).is_ok()
    }

    /// Owned partitions granted to `worker` after the chunk it runs ([`Core::grant`]).
    pub(crate) fn granted(&self, worker: WorkerId) -> impl Iterator<Item = ChunkId> + '_ {
        self.workers
            .get(&worker)
            .into_iter()
            .flat_map(|s| s.granted.iter().copied())
    }

    /// The chunk `worker` runs and those it was granted after it, in order.
    pub(crate) fn runs_and_granted(&self, worker: WorkerId) -> Vec<ChunkId> {
        self.running_on(worker)
            .into_iter()
            .chain(self.granted(worker))
            .collect()
    }

    /// The state `chunk` falls back to if the worker running it is lost (its last
    /// `StateReport`), if any.
    pub(crate) fn fallback(&self, chunk: ChunkId) -> Option<&S> {
        self.known.get(&chunk)
    }

    /// Whether the output of `chunk` is in the merge.
    pub fn is_done(&self, chunk: ChunkId) -> bool {
        self.merge.contains(chunk)
    }

    /// The plan of the current phase.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Whether no chunk is pending (never started or suspended).
    #[cfg(test)]
    pub(crate) fn pending_is_empty(&self) -> bool {
        match &self.pending {
            Pending::Pile(p) => p.is_empty(),
            Pending::Deal(d) => d.is_empty(),
            Pending::Owned(o) => o.is_empty(),
        }
    }
}

#[cfg(test)]
mod tests;
