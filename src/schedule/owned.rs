//! Owned partitions: pending chunks queued on the worker that holds their partition, and the
//! reassignment that moves the fewest partitions when workers join or leave or their speeds
//! diverge.
//!
//! A job with owned partitions ([`Job::OWNERSHIP`](crate::Job::OWNERSHIP)) runs the same
//! chunks in every phase, and chunk `c`'s partition stays with its *holder*, the worker that
//! last ran it. At a phase start every chunk is queued on its holder (owner computes). The
//! reassignment is the seed's two steps over partitions:
//!
//! 1. *Orphans.* Chunks with no holder (the first phase, or a holder that left) are placed:
//!    on the first phase in contiguous blocks in worker order (so neighbours, whose halos are
//!    exchanged, share a worker); later each goes to the worker with the lowest load that
//!    holds one of its neighbours, or to the lowest load.
//! 2. *Balance.* While moving one pending chunk from the most to the least loaded group lowers
//!    the larger of the two loads, move it; keep the moves if together they lower the largest
//!    load by more than `slack` of it. A group is a worker process's slots (partitions move
//!    between them for free; balanced among themselves afterwards, whatever the gain) or a
//!    worker of its own. A load is queued iterations divided by measured throughput (the
//!    core's moving average), so a slower worker holds fewer rows. The chunk moved is one
//!    whose neighbour the receiver holds, if any, else the giver's chunk nearest to the
//!    receiver's: blocks stay contiguous.
//!
//! Within a phase a worker process's slots run only their own queues: a partition in a
//! process never moves to be stolen (its bytes would cross on the phase's critical path).
//! The coordinator's own workers are the exception: their partitions are all in its memory,
//! so one whose queue ran dry takes the last queued chunk of the one with the most
//! ([`Owners::steal`]), as a work-stealing pool would; on short phases a thread the machine
//! held back otherwise held the phase's end while the other waited. The slack keeps
//! measurement noise from moving a partition back and forth every phase.

use std::collections::{BTreeSet, VecDeque};

use super::idhash::IdMap;
use super::static_::len_of;
use super::{ChunkId, Plan, ProcessId, Shape, WorkerId};

/// The part of the largest load the moves of a phase start must save (15%): below it,
/// noise. A move between processes costs a partition's bytes on the phase's critical path,
/// and saves one partition's time out of a worker's share; with a smaller slack, two worker
/// processes whose measured speeds swung by a few percent traded partitions at every phase
/// (`BENCHMARKS.md`, partitions).
pub(super) const PHASE_SLACK: f64 = 0.15;

/// A group of workers balanced as one: the slots of a worker process, or a worker alone.
/// Ordered as the deal walks them: workers of their own first, then processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Group {
    Worker(WorkerId),
    Process(ProcessId),
}

/// Per-worker queues of pending chunks, each in index order, and who holds which partition.
#[derive(Debug, Default)]
pub(super) struct Owners {
    queues: IdMap<WorkerId, VecDeque<ChunkId>>,
    /// Pending chunks while no worker is present.
    orphans: BTreeSet<ChunkId>,
    /// The holder of each chunk's partition (the worker that last ran it).
    holder: Vec<Option<WorkerId>>,
    /// Pending chunks in all queues and orphans.
    len: usize,
    /// Partitions moved to a worker other than their holder, since the job started.
    moved: u64,
    /// The worker process of each worker that is a slot of one (`set_process`).
    processes: IdMap<WorkerId, ProcessId>,
    /// Chunks that stay with their holder's process until the next phase start
    /// ([`Owners::pin`]): the balance moves none of them.
    pinned: Vec<ChunkId>,
    /// The workers of the last reassignment that are not slots of a worker process: the
    /// only ones [`Owners::steal`] looks at (a scan of every queue, at every event of a
    /// phase, would cost a coordinator with thousands of processes beside one local thread
    /// a look at each of their slots).
    locals: Vec<WorkerId>,
}

impl Owners {
    /// No holder yet for `len` chunks.
    pub(super) fn new(len: ChunkId) -> Owners {
        Owners {
            holder: vec![None; len as usize],
            ..Owners::default()
        }
    }

    /// Records that `worker` ran `chunk`: it holds its partition now.
    pub(super) fn ran(&mut self, chunk: ChunkId, worker: WorkerId) {
        if let Some(h) = self.holder.get_mut(chunk as usize) {
            *h = Some(worker);
        }
    }

    /// `chunk` was granted and given back before it started anywhere: no worker holds its
    /// partition.
    pub(super) fn unhold(&mut self, chunk: ChunkId) {
        if let Some(h) = self.holder.get_mut(chunk as usize) {
            *h = None;
        }
    }

    /// Whether no chunk is pending (queued or orphaned).
    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The holder of `chunk`'s partition.
    pub(super) fn holder(&self, chunk: ChunkId) -> Option<WorkerId> {
        self.holder.get(chunk as usize).copied().flatten()
    }

    /// Partitions moved between workers so far.
    pub(super) fn moved(&self) -> u64 {
        self.moved
    }

    /// Starts a phase: every chunk pending, queued on its holder, then reassigned over
    /// `workers` (sorted by id, with their throughputs).
    pub(super) fn start_phase(&mut self, workers: &[(WorkerId, f64, u64)], plan: &Plan) {
        // Each chunk goes home, in chunk order, as `reassign` takes orphans home: queued on
        // its holder if it is among `workers`, else an orphan. (Queued here rather than made
        // orphans first: a phase start of thousands of processes built a set of every chunk,
        // and every queue anew.)
        let present = |w: WorkerId| workers.binary_search_by_key(&w, |&(w, _, _)| w).is_ok();
        // Only present workers keep a queue, so that a chunk finds its holder's in one look.
        self.queues.retain(|&w, q| {
            q.clear();
            present(w)
        });
        self.orphans.clear();
        self.pinned.clear();
        for c in 0..plan.len() {
            match self.holder(c) {
                Some(h) => match self.queues.get_mut(&h) {
                    Some(q) => q.push_back(c),
                    None if present(h) => {
                        self.queues.insert(h, VecDeque::from([c]));
                    }
                    None => {
                        self.orphans.insert(c);
                    }
                },
                None => {
                    self.orphans.insert(c);
                }
            }
        }
        self.len = plan.len() as usize;
        self.reassign(workers, plan, PHASE_SLACK);
    }

    /// `pending` (a restore's) pending, queued on nobody yet.
    pub(super) fn with_pending(len: ChunkId, pending: impl IntoIterator<Item = ChunkId>) -> Owners {
        let mut o = Owners::new(len);
        o.orphans = pending.into_iter().collect();
        o.len = o.orphans.len();
        o
    }

    /// `chunks` are held by `worker` from now on and stay in its process until the next
    /// phase start: the balance moves none of them to another group (a local recovery
    /// replays them there, and a partition moved away would cross processes as soon as it
    /// is replayed, one at a time, on the phase's critical path). Their pending runs go to
    /// `worker`'s queue when its holder's slots leave, or at once if queued elsewhere.
    pub(super) fn pin(&mut self, chunks: &[ChunkId], worker: WorkerId) {
        for &c in chunks {
            if let Some(h) = self.holder.get_mut(c as usize) {
                *h = Some(worker);
            }
            if !self.pinned.contains(&c) {
                self.pinned.push(c);
            }
            // Pending elsewhere (queued on another worker, or an orphan): queued on `worker`.
            let mut moved = self.orphans.remove(&c);
            for (_, q) in self.queues.iter_mut().filter(|(w, _)| **w != worker) {
                if let Ok(at) = q.binary_search(&c) {
                    q.remove(at);
                    moved = true;
                    break;
                }
            }
            if moved {
                push_sorted(self.queues.entry(worker).or_default(), c);
            }
        }
    }

    /// The next chunk of `w`'s queue, left there.
    pub(super) fn peek(&self, w: WorkerId) -> Option<ChunkId> {
        self.queues.get(&w)?.front().copied()
    }

    /// The next chunk of `w`'s queue.
    pub(super) fn take(&mut self, w: WorkerId) -> Option<ChunkId> {
        let c = self.queues.get_mut(&w)?.pop_front()?;
        self.len -= 1;
        if self.holder(c).is_some_and(|h| h != w) {
            self.moved += 1;
        }
        Some(c)
    }

    /// A chunk for `w`, a worker of the coordinator's own (not a slot of a worker process),
    /// whose queue is empty: the last queued of the other such worker with the most queued
    /// (ties: the lower id), not pinned. The partitions of the coordinator's workers are all
    /// in its memory, so one taking another's costs no bytes, and a thread the machine held
    /// back (or that was given more rows) does not hold the phase's end while the other
    /// waits. Never from or for a worker process: its partitions are in its memory.
    pub(super) fn steal(&mut self, w: WorkerId) -> Option<ChunkId> {
        if self.processes.contains_key(&w) {
            return None;
        }
        let (_, victim) = self
            .locals
            .iter()
            .filter(|v| **v != w && !self.processes.contains_key(v))
            .filter_map(|v| Some((self.queues.get(v)?.len(), *v)))
            .filter(|(len, _)| *len > 0)
            .max_by_key(|&(len, v)| (len, std::cmp::Reverse(v)))?;
        let q = self.queues.get_mut(&victim)?;
        let c = *q.back()?;
        if self.pinned.contains(&c) {
            return None;
        }
        q.pop_back();
        self.len -= 1;
        self.moved += 1;
        Some(c)
    }

    /// Queues a handed-back chunk on its holder if it is among `workers`, else as an orphan
    /// (placed by the next [`Owners::reassign`]).
    pub(super) fn put_back(&mut self, c: ChunkId, workers: &[(WorkerId, f64, u64)]) {
        self.len += 1;
        match self.holder(c) {
            Some(h) if workers.iter().any(|&(w, _, _)| w == h) => {
                let q = self.queues.entry(h).or_default();
                let at = q.partition_point(|&x| x < c);
                q.insert(at, c);
            }
            _ => {
                self.orphans.insert(c);
            }
        }
    }

    /// Step 1 of a first phase (or a restore), for `chunks` that no worker ever held: a
    /// contiguous block per group (a worker process's slots, or a worker of its own) in
    /// worker order, sized so that each group's load (what it runs now and its block) is its
    /// share by speed; within a group, its block dealt to its slots in turn, so that the
    /// process runs it in order and what it has taken when another joins is a prefix of its
    /// block (the rest is re-dealt by `reassign`, and stays contiguous). Returns each chunk
    /// with the index of its worker in `workers`.
    fn deal_blocks(
        &self,
        workers: &[(WorkerId, f64, u64)],
        chunks: Vec<ChunkId>,
        plan: &Plan,
    ) -> Vec<(ChunkId, usize)> {
        let k = workers.len();
        if k == 0 {
            return Vec::new();
        }
        let ids: Vec<WorkerId> = workers.iter().map(|&(w, _, _)| w).collect();
        let speed = |i: usize| workers[i].1.max(f64::MIN_POSITIVE);
        let speeds: f64 = (0..k).map(speed).sum();
        let mut order: Vec<usize> = (0..k).collect();
        order.sort_by_key(|&i| (self.group_of(ids[i]), ids[i]));
        let mut blocks: Vec<(Vec<usize>, f64)> = Vec::new();
        for &i in &order {
            match blocks.last_mut() {
                Some((members, s)) if self.group_of(ids[members[0]]) == self.group_of(ids[i]) => {
                    members.push(i);
                    *s += speed(i);
                }
                _ => blocks.push((vec![i], speed(i))),
            }
        }
        // What each group runs now: the loads count it.
        let taken: Vec<f64> = blocks
            .iter()
            .map(|(members, _)| members.iter().map(|&i| workers[i].2 as f64).sum())
            .collect();
        let total: f64 =
            chunks.iter().map(|&c| len_of(plan, c)).sum::<f64>() + taken.iter().sum::<f64>();
        let (mut b, mut turn, mut filled) = (0, 0, taken[0]);
        let mut dealt = Vec::with_capacity(chunks.len());
        for c in chunks {
            while filled >= total * blocks[b].1 / speeds && b + 1 < blocks.len() {
                (b, turn) = (b + 1, 0);
                filled = taken[b];
            }
            let members = &blocks[b].0;
            let i = members[turn % members.len()];
            turn += 1;
            filled += len_of(plan, c);
            dealt.push((c, i));
        }
        dealt
    }

    /// Partitions kept between phases that no worker holds (a rollback's restored ones,
    /// `chunks`, in order) are dealt over `workers` as a first phase deals them
    /// ([`Owners::deal_blocks`]), and each is held where it is dealt: the next phase runs
    /// it there.
    pub(super) fn deal_unheld(
        &mut self,
        workers: &[(WorkerId, f64, u64)],
        chunks: Vec<ChunkId>,
        plan: &Plan,
    ) {
        if workers.is_empty() {
            return;
        }
        for (c, i) in self.deal_blocks(workers, chunks, plan) {
            self.ran(c, workers[i].0);
        }
    }

    /// Steps 1 and 2 over `workers` (sorted by id, with their throughputs and the iterations
    /// of the chunk each runs): queues of workers that left become orphans, orphans are
    /// placed, then loads are balanced. The moves between groups must save more than `slack`
    /// of the largest load.
    pub(super) fn reassign(&mut self, workers: &[(WorkerId, f64, u64)], plan: &Plan, slack: f64) {
        let k = workers.len();
        let ids: Vec<WorkerId> = workers.iter().map(|&(w, _, _)| w).collect();
        // Each worker's index in `workers`: membership and positions in O(1), not O(k).
        let index: IdMap<WorkerId, usize> = ids.iter().enumerate().map(|(i, &w)| (w, i)).collect();
        // Queues of workers that left.
        let gone: Vec<WorkerId> = self
            .queues
            .keys()
            .copied()
            .filter(|w| !index.contains_key(w))
            .collect();
        for w in gone {
            if let Some(q) = self.queues.remove(&w) {
                self.orphans.extend(q);
            }
        }
        self.locals.clear();
        let locals = ids.iter().filter(|w| !self.processes.contains_key(w));
        self.locals.extend(locals);
        if k == 0 {
            return;
        }
        // While no pending chunk was ever given to a worker (the first phase, or a
        // restore), none has a partition anywhere: they are dealt again with every
        // membership change, so that workers joining one at a time (a worker process's
        // slots join one by one, processes join when they dial) still get contiguous
        // blocks. Dealt once, at the first join, and then balanced by moving ends, two
        // processes held interleaved blocks and 24 of the 64 halos of each phase crossed
        // between them instead of 2.
        let fresh = self
            .queues
            .values()
            .flatten()
            .chain(&self.orphans)
            .all(|&c| self.holder(c).is_none());
        // (Gathered in chunk order by marking them, not by sorting or a set: with thousands
        // of processes joining one by one, each join deals every partition again.)
        let mut homeless = Vec::new();
        if fresh {
            let mut pending = vec![false; self.holder.len()];
            let mut mark = |c: ChunkId| {
                let c = c as usize;
                if c >= pending.len() {
                    pending.resize(c + 1, false);
                }
                pending[c] = true;
            };
            for (_, q) in self.queues.iter_mut() {
                q.drain(..).for_each(&mut mark);
            }
            std::mem::take(&mut self.orphans)
                .into_iter()
                .for_each(&mut mark);
            homeless.extend(
                pending
                    .iter()
                    .enumerate()
                    .filter(|&(_, &p)| p)
                    .map(|(c, _)| c as ChunkId),
            );
        }
        // Orphans whose holder is present go home.
        let orphans = std::mem::take(&mut self.orphans);
        for c in orphans {
            match self.holder(c) {
                Some(h) if index.contains_key(&h) => {
                    push_sorted(self.queues.entry(h).or_default(), c);
                }
                _ => homeless.push(c),
            }
        }
        let speed = |i: usize| workers[i].1.max(f64::MIN_POSITIVE);
        // A worker's load counts the chunk it runs (`workers[i].2` iterations).
        let mut load: Vec<f64> = (0..k)
            .map(|i| {
                let queued = self
                    .queues
                    .get(&ids[i])
                    .map_or(0.0, |q| q.iter().map(|&c| len_of(plan, c)).sum::<f64>());
                (queued + workers[i].2 as f64) / speed(i)
            })
            .collect();
        // Step 1. (Most phase starts have nothing to place: no deal of nothing, which sorts
        // every worker.)
        let never_held = homeless.iter().all(|&c| self.holder(c).is_none());
        if never_held && !homeless.is_empty() {
            // Gathered by worker first, then queued with one look-up per worker, not one
            // per chunk: while the first phase is fresh this runs at every join, over every
            // chunk. (The deal is in chunk order: each worker's share comes sorted, and an
            // empty queue, as every queue is then, takes it as it is.)
            let mut dealt: Vec<Vec<ChunkId>> = vec![Vec::new(); k];
            for (c, i) in self.deal_blocks(workers, homeless, plan) {
                load[i] += len_of(plan, c) / speed(i);
                dealt[i].push(c);
            }
            for (i, chunks) in dealt.into_iter().enumerate() {
                if chunks.is_empty() {
                    continue;
                }
                let q = self.queues.entry(ids[i]).or_default();
                if q.back().is_none_or(|&b| b < chunks[0]) {
                    q.extend(chunks);
                } else {
                    chunks.into_iter().for_each(|c| push_sorted(q, c));
                }
            }
        } else {
            let shape = Shape::chain(plan.len());
            for c in homeless {
                let near = |i: usize| shape.neighbours(c).any(|n| self.holds(ids[i], n));
                let best = (0..k)
                    .min_by(|&a, &b| {
                        let key = |i: usize| (!near(i), load[i] + len_of(plan, c) / speed(i));
                        key(a)
                            .partial_cmp(&key(b))
                            .unwrap_or(std::cmp::Ordering::Equal)
                    })
                    .expect("k > 0");
                load[best] += len_of(plan, c) / speed(best);
                push_sorted(self.queues.entry(ids[best]).or_default(), c);
            }
        }
        // Step 2, between groups (the slots of one worker process are a group; every other
        // worker is a group of its own): each move takes an end of the giver's queue
        // (sorted), the one next to the receiver's chunks if any, else the one nearer to
        // them: O(log n) per move. Moves go on while each lowers the larger of the two
        // groups' loads; they are kept if together they lower the largest load by more than
        // `slack` of it, else undone (noise). (Asked of each move, the slack would keep a
        // worker with more than 1/slack chunks from ever giving one away: three slots idle
        // beside one that holds all 32 partitions. Asked only of the spread, it would move a
        // partition back and forth at every phase. And the slots of one process are not
        // balanced each on its own: their speeds, measured behind each other on one thread,
        // differ by more than the slack, and partitions would cross between processes at
        // every phase.)
        let mut groups: Vec<(Group, Vec<usize>)> = Vec::new();
        let mut group_at: IdMap<Group, usize> = IdMap::default();
        for (i, w) in ids.iter().enumerate() {
            let g = self.group_of(*w);
            let at = *group_at.entry(g).or_insert_with(|| {
                groups.push((g, Vec::new()));
                groups.len() - 1
            });
            groups[at].1.push(i);
        }
        let gspeed: Vec<f64> = groups
            .iter()
            .map(|(_, m)| m.iter().map(|&i| speed(i)).sum())
            .collect();
        let gload_of = |load: &[f64], g: usize| -> f64 {
            groups[g].1.iter().map(|&i| load[i] * speed(i)).sum::<f64>() / gspeed[g]
        };
        let mut gload: Vec<f64> = (0..groups.len()).map(|g| gload_of(&load, g)).collect();
        // The moves, to undo them if together they save too little (a log, not a copy of
        // every queue: this runs at each join of thousands).
        let mut moves: Vec<(WorkerId, WorkerId, ChunkId)> = Vec::new();
        let (loads, largest) = (load.clone(), gload.iter().copied().fold(0.0, f64::max));
        let member_ids: Vec<Vec<WorkerId>> = groups
            .iter()
            .map(|(_, m)| m.iter().map(|&i| ids[i]).collect())
            .collect();
        // The groups by load, to find the most and least loaded in O(log groups) at each move
        // (a scan of every group per move made a join of thousands cubic): the least loaded
        // and, among the most loaded, the first, as a scan in group order would pick them.
        let mut by_load: BTreeSet<(u64, usize)> = gload
            .iter()
            .enumerate()
            .map(|(g, &l)| (order_key(l), g))
            .collect();
        while let (Some(&(_, glo)), Some(&(top, _))) = (by_load.first(), by_load.last()) {
            let Some(&(_, ghi)) = by_load.range((top, 0)..).next() else {
                break;
            };
            if ghi == glo {
                break;
            }
            // The chunk: an end of the giving group's chunks (all its members' queues), next
            // to the receiving group's if it can be, so that each group's chunks stay one
            // block (a process's slots hold its block in turn, so the ends of one slot's
            // queue are not the ends of its process's block); the receiver: the least
            // loaded member of the other group.
            let Some((giver, c)) = self.end_for(&member_ids[ghi], &member_ids[glo], plan) else {
                break;
            };
            if self.pinned.contains(&c) {
                break;
            }
            let hi = index[&giver];
            let lo = groups[glo]
                .1
                .iter()
                .copied()
                .min_by(|&a, &b| load[a].total_cmp(&load[b]))
                .expect("a group has members");
            let len = len_of(plan, c);
            let (new_hi, new_lo) = (
                gload[ghi] - len / gspeed[ghi],
                gload[glo] + len / gspeed[glo],
            );
            if new_hi.max(new_lo) >= gload[ghi] {
                break;
            }
            self.shift(ids[hi], ids[lo], c);
            moves.push((ids[hi], ids[lo], c));
            load[hi] -= len / speed(hi);
            load[lo] += len / speed(lo);
            by_load.remove(&(order_key(gload[ghi]), ghi));
            by_load.remove(&(order_key(gload[glo]), glo));
            gload[ghi] = new_hi;
            gload[glo] = new_lo;
            by_load.insert((order_key(new_hi), ghi));
            by_load.insert((order_key(new_lo), glo));
        }
        let now = gload.iter().copied().fold(0.0, f64::max);
        if now >= largest * (1.0 - slack) {
            for (from, to, c) in moves.into_iter().rev() {
                self.unshift(from, to, c);
            }
            load = loads;
        }
        // Within a group: a partition moves between slots of one process for free, so the
        // loads are evened whatever the gain.
        for (_, members) in groups.iter().filter(|(_, m)| m.len() > 1) {
            loop {
                let by_load = |a: &usize, b: &usize| load[*a].total_cmp(&load[*b]);
                let hi = members.iter().copied().max_by(by_load).expect("members");
                let lo = members.iter().copied().min_by(by_load).expect("members");
                if hi == lo {
                    break;
                }
                let Some((_, c)) = self.end_for(&[ids[hi]], &[ids[lo]], plan) else {
                    break;
                };
                let len = len_of(plan, c);
                let (new_hi, new_lo) = (load[hi] - len / speed(hi), load[lo] + len / speed(lo));
                if new_hi.max(new_lo) >= load[hi] {
                    break;
                }
                self.shift(ids[hi], ids[lo], c);
                load[hi] = new_hi;
                load[lo] = new_lo;
            }
        }
    }

    /// The end of group `giver`'s queued chunks (all its members' queues) to give group
    /// `taker`, and the member whose queue has it: the one next to the taker's chunks if
    /// any, else the one nearer to them; `None` if the giver has nothing queued. A worker
    /// alone is a group of one.
    fn end_for(
        &self,
        giver: &[WorkerId],
        taker: &[WorkerId],
        plan: &Plan,
    ) -> Option<(WorkerId, ChunkId)> {
        let ends = |ws: &[WorkerId]| {
            let mut first: Option<(WorkerId, ChunkId)> = None;
            let mut last: Option<(WorkerId, ChunkId)> = None;
            for &w in ws {
                let Some(q) = self.queues.get(&w).filter(|q| !q.is_empty()) else {
                    continue;
                };
                if first.is_none_or(|(_, c)| q[0] < c) {
                    first = Some((w, q[0]));
                }
                if last.is_none_or(|(_, c)| q[q.len() - 1] > c) {
                    last = Some((w, q[q.len() - 1]));
                }
            }
            first.zip(last)
        };
        let (first, last) = ends(giver)?;
        let taker_holds = |x: ChunkId| taker.iter().any(|&w| self.holds(w, x));
        if last.1 + 1 < plan.len() && taker_holds(last.1 + 1) {
            Some(last)
        } else if first.1 > 0 && taker_holds(first.1 - 1) {
            Some(first)
        } else {
            match ends(taker) {
                Some(((_, t), _)) if t < first.1 => Some(first),
                _ => Some(last),
            }
        }
    }

    /// Moves `c`, an end of `from`'s queue, to `to`'s.
    fn shift(&mut self, from: WorkerId, to: WorkerId, c: ChunkId) {
        if let Some(q) = self.queues.get_mut(&from) {
            if q.front() == Some(&c) {
                q.pop_front();
            } else {
                q.pop_back();
            }
        }
        push_sorted(self.queues.entry(to).or_default(), c);
    }

    /// Undoes [`shift`](Self::shift)`(from, to, c)`: each queue is a sorted set, so the
    /// queues are as they were.
    fn unshift(&mut self, from: WorkerId, to: WorkerId, c: ChunkId) {
        if let Some(q) = self.queues.get_mut(&to) {
            if let Ok(at) = q.binary_search(&c) {
                q.remove(at);
            }
        }
        push_sorted(self.queues.entry(from).or_default(), c);
    }

    /// The group of `w`: the worker process whose slot it is, or itself.
    fn group_of(&self, w: WorkerId) -> Group {
        match self.processes.get(&w) {
            Some(&p) => Group::Process(p),
            None => Group::Worker(w),
        }
    }

    /// Worker `w` is one of the slots of worker process `process`: partitions move between
    /// them for free, and the balance evens groups' loads, not slots'.
    pub(super) fn set_process(&mut self, w: WorkerId, process: ProcessId) {
        self.processes.insert(w, process);
    }

    /// Whether `w` has `x` queued, or holds its partition.
    fn holds(&self, w: WorkerId, x: ChunkId) -> bool {
        self.holder(x) == Some(w)
            || self
                .queues
                .get(&w)
                .is_some_and(|q| q.binary_search(&x).is_ok())
    }

    /// Every pending chunk.
    #[cfg(test)]
    pub(super) fn pending(&self) -> impl Iterator<Item = ChunkId> + '_ {
        self.queues
            .values()
            .flatten()
            .copied()
            .chain(self.orphans.iter().copied())
    }

    /// The queue of `w`.
    pub(super) fn queue(&self, w: WorkerId) -> Vec<ChunkId> {
        self.queues
            .get(&w)
            .map(|q| q.iter().copied().collect())
            .unwrap_or_default()
    }
}

/// A key whose order is `f64::total_cmp`'s: the same as `<` for the loads here, which are
/// never NaN.
fn order_key(x: f64) -> u64 {
    let b = x.to_bits();
    if b >> 63 == 1 { !b } else { b | 1 << 63 }
}

fn push_sorted(q: &mut VecDeque<ChunkId>, c: ChunkId) {
    let at = q.partition_point(|&x| x < c);
    q.insert(at, c);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(n: u64) -> Plan {
        Plan::Uniform { n, size: 1 }
    }

    #[test]
    fn first_phase_deals_contiguous_blocks() {
        let mut o = Owners::new(8);
        o.start_phase(&[(3, 1.0, 0), (7, 1.0, 0)], &plan(8));
        assert_eq!(o.queue(3), vec![0, 1, 2, 3]);
        assert_eq!(o.queue(7), vec![4, 5, 6, 7]);
    }

    /// Two worker processes whose slots join one at a time, their ids interleaved, before
    /// any chunk has run: each process gets one contiguous block, so only one boundary's
    /// halos cross between them. (Dealt at the first join and balanced by moving ends, the
    /// blocks interleaved: 0-3, 8, 11-13, … on one process.)
    #[test]
    fn slots_joining_one_by_one_get_one_block_per_process() {
        let mut o = Owners::new(32);
        o.start_phase(&[], &plan(32));
        let mut workers = Vec::new();
        // Each slot takes a chunk as it joins, as the core's dispatch does (`take`, then
        // `ran`).
        let mut taken = Vec::new();
        for w in 0..8 {
            o.set_process(w, ProcessId(100 + w % 2));
            workers.push((w, 1.0, 0));
            o.reassign(&workers, &plan(32), 0.0);
            let c = o.take(w).expect("a chunk for each slot");
            o.ran(c, w);
            workers[w as usize].2 = 1;
            taken.push((w, c));
        }
        let of = |g: u64| {
            let mut v: Vec<ChunkId> = (0..8)
                .filter(|w| w % 2 == g)
                .flat_map(|w| o.queue(w))
                .chain(taken.iter().filter(|(w, _)| w % 2 == g).map(|&(_, c)| c))
                .collect();
            v.sort_unstable();
            v
        };
        assert_eq!(of(0), (0..16).collect::<Vec<_>>());
        assert_eq!(of(1), (16..32).collect::<Vec<_>>());
        // A process that ran chunks before the other joined keeps them, and its block is
        // the rest of its share of what is left: chunks 0-5 done and 6-9 running on
        // process 100, 22 left for both.
        let mut o = Owners::new(32);
        o.start_phase(&[], &plan(32));
        let mut workers: Vec<_> = (0..4).map(|w| (w, 1.0, 1)).collect();
        for w in 0..4 {
            o.set_process(w, ProcessId(100));
        }
        o.reassign(&workers, &plan(32), 0.0);
        let mut took = Vec::new();
        for _ in 0..10 {
            let w = took.len() as u64 % 4;
            let c = o.take(w).expect("a chunk");
            o.ran(c, w);
            took.push(c);
        }
        assert_eq!(
            took,
            (0..10).collect::<Vec<_>>(),
            "a process runs its block in order"
        );
        for w in 4..8 {
            o.set_process(w, ProcessId(101));
            workers.push((w, 1.0, 0));
        }
        o.reassign(&workers, &plan(32), 0.0);
        let mut first: Vec<ChunkId> = (0..4).flat_map(|w| o.queue(w)).collect();
        first.sort_unstable();
        assert_eq!(first, (10..19).collect::<Vec<_>>());
        let mut second: Vec<ChunkId> = (4..8).flat_map(|w| o.queue(w)).collect();
        second.sort_unstable();
        assert_eq!(second, (19..32).collect::<Vec<_>>());
    }

    /// A process that ran the whole first phase alone holds its block in turn over its
    /// slots; a process that joins later takes one contiguous half at the next phase start
    /// (taking the ends of the giving slots' queues, it took every fourth chunk).
    #[test]
    fn a_process_joining_late_takes_one_block() {
        let mut o = Owners::new(32);
        for w in 0..8 {
            o.set_process(w, ProcessId(100 + w / 4));
        }
        for c in 0..32 {
            o.ran(c, c % 4);
        }
        // Slots measured behind each other on one thread differ in speed.
        let speeds = [1.0, 1.3, 0.8, 1.1, 0.9, 1.2, 1.0, 0.95];
        let eight: Vec<_> = (0..8).map(|w| (w, speeds[w as usize], 0)).collect();
        o.start_phase(&eight, &plan(32));
        let of = |ws: std::ops::Range<u64>| {
            let mut v: Vec<ChunkId> = ws.flat_map(|w| o.queue(w)).collect();
            v.sort_unstable();
            v
        };
        assert_eq!(of(0..4), (0..16).collect::<Vec<_>>());
        assert_eq!(of(4..8), (16..32).collect::<Vec<_>>());
    }

    /// A rollback's restored partitions that ended the snapshot's phase, which no worker
    /// holds, are dealt as a first phase deals chunks, speeds unknown: a contiguous block for
    /// the local worker, then one for the process's four slots together (a share per slot),
    /// each partition held where it is dealt.
    #[test]
    fn restored_partitions_are_dealt_in_blocks_and_held_there() {
        let mut o = Owners::new(12);
        for w in 1..5 {
            o.set_process(w, ProcessId(100));
        }
        let workers: Vec<_> = (0..5).map(|w| (w, 0.0, 0)).collect();
        o.deal_unheld(&workers, (0..12).collect(), &plan(12));
        let held: Vec<WorkerId> = (0..12).map(|c| o.holder(c).unwrap()).collect();
        assert_eq!(&held[..3], &[0, 0, 0], "{held:?}");
        assert!(held[3..].iter().all(|w| (1..5).contains(w)), "{held:?}");
        // Each slot of the process got its turn.
        for w in 1..5 {
            assert!(held.contains(&w), "{held:?}");
        }
    }

    /// One worker holds every partition and three others hold none (after a rollback, or
    /// when they join at a phase start): each move saves less than the slack of the
    /// holder's load, yet together they even the loads.
    #[test]
    fn many_partitions_on_one_worker_are_spread_at_a_phase_start() {
        let mut o = Owners::new(32);
        for c in 0..32 {
            o.ran(c, 0);
        }
        let four = [(0, 1.0, 0), (1, 1.0, 0), (2, 1.0, 0), (3, 1.0, 0)];
        o.start_phase(&four, &plan(32));
        for w in 0..4 {
            assert_eq!(o.queue(w).len(), 8, "worker {w}: {:?}", o.queue(w));
        }
        assert_eq!(o.queue(0), (0..8).collect::<Vec<_>>());
        assert_eq!(o.moved(), 0, "counted when they run elsewhere");
    }

    /// Two workers a few percent apart in speed, 16 partitions each: one move would lower
    /// the larger load by less than the slack, so nothing moves (it moved a partition back
    /// and forth at every phase while the slack was asked only of the spread).
    #[test]
    fn a_few_percent_of_speed_moves_nothing_among_many_partitions() {
        let mut o = Owners::new(32);
        for c in 0..32 {
            o.ran(c, u64::from(c >= 16));
        }
        o.start_phase(&[(0, 1.0, 0), (1, 1.08, 0)], &plan(32));
        assert_eq!(o.queue(0), (0..16).collect::<Vec<_>>());
        assert_eq!(o.queue(1), (16..32).collect::<Vec<_>>());
    }

    /// Two worker processes of four slots each, whose slots' measured speeds differ by more
    /// than the slack (they run behind each other on one thread): no partition crosses
    /// between the processes, whose speeds are within it, and each process evens its own
    /// slots. A third process that holds nothing yet takes a third of the partitions.
    #[test]
    fn the_slots_of_a_process_are_balanced_as_one() {
        let mut o = Owners::new(32);
        for w in 0..8 {
            o.set_process(w, ProcessId(100 + w / 4));
        }
        for c in 0..32 {
            o.ran(c, c / 4);
        }
        let speeds = [1.0, 1.3, 0.8, 1.1, 0.9, 1.2, 1.0, 0.95];
        let eight: Vec<_> = (0..8).map(|w| (w, speeds[w as usize], 0)).collect();
        o.start_phase(&eight, &plan(32));
        let of = |o: &Owners, ws: std::ops::Range<u64>| {
            let mut v: Vec<ChunkId> = ws.flat_map(|w| o.queue(w)).collect();
            v.sort_unstable();
            v
        };
        assert_eq!(of(&o, 0..4), (0..16).collect::<Vec<_>>());
        assert_eq!(of(&o, 4..8), (16..32).collect::<Vec<_>>());
        // Within a process, the fastest slot has the most.
        assert!(
            o.queue(1).len() > o.queue(2).len(),
            "{:?}",
            (0..4).map(|w| o.queue(w)).collect::<Vec<_>>()
        );
        for w in 8..12 {
            o.set_process(w, ProcessId(102));
        }
        let twelve: Vec<_> = (0..12).map(|w| (w, 1.0, 0)).collect();
        o.start_phase(&twelve, &plan(32));
        let third = of(&o, 8..12).len();
        assert!((10..=11).contains(&third), "{third}");
    }

    #[test]
    fn partitions_stay_with_their_holder() {
        let mut o = Owners::new(8);
        let two = [(0, 1.0, 0), (1, 1.0, 0)];
        o.start_phase(&two, &plan(8));
        for w in [0, 1] {
            while let Some(c) = o.take(w) {
                o.ran(c, w);
            }
        }
        o.start_phase(&two, &plan(8));
        assert_eq!(o.queue(0), vec![0, 1, 2, 3]);
        assert_eq!(o.queue(1), vec![4, 5, 6, 7]);
        assert_eq!(o.moved(), 0);
    }

    /// A worker of the coordinator's own whose queue ran dry takes the last queued chunk of
    /// the other such worker with the most (a move, counted); never one of a worker
    /// process's slots, nor for one, nor a pinned chunk.
    #[test]
    fn a_local_worker_with_nothing_left_takes_from_another_local_one() {
        let mut o = Owners::new(12);
        let three = [(0, 1.0, 0), (1, 1.0, 0), (2, 1.0, 0)];
        o.start_phase(&three, &plan(12));
        o.set_process(2, ProcessId(7));
        assert_eq!(
            (o.queue(0), o.queue(1), o.queue(2)),
            (vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9, 10, 11])
        );
        // Worker 1 runs its queue and takes worker 0's tail, one chunk at a time.
        while let Some(c) = o.take(1) {
            o.ran(c, 1);
        }
        assert_eq!(o.steal(1), Some(3));
        assert_eq!(o.steal(1), Some(2));
        assert_eq!(o.queue(0), vec![0, 1]);
        assert_eq!(o.moved(), 2);
        // A slot of a worker process neither takes nor is taken from.
        while o.take(2).is_some() {}
        assert_eq!(o.steal(2), None);
        o.pin(&[1], 0);
        assert_eq!(o.steal(1), None, "a pinned chunk stays");
        while o.take(0).is_some() {}
        assert_eq!(o.steal(0), None);
        assert!(o.is_empty());
    }

    /// From one worker to two: half the partitions move, the back half of the block.
    #[test]
    fn a_joining_worker_takes_a_contiguous_half() {
        let mut o = Owners::new(8);
        o.start_phase(&[(0, 1.0, 0)], &plan(8));
        while let Some(c) = o.take(0) {
            o.ran(c, 0);
        }
        o.start_phase(&[(0, 1.0, 0), (1, 1.0, 0)], &plan(8));
        assert_eq!(o.queue(0), vec![0, 1, 2, 3]);
        assert_eq!(o.queue(1), vec![4, 5, 6, 7]);
    }

    /// A worker three times as fast ends up with three quarters of the rows; a worker that
    /// leaves hands its partitions to the one next to them.
    #[test]
    fn speed_decides_and_leavers_hand_over() {
        let mut o = Owners::new(16);
        o.start_phase(&[(0, 1.0, 0), (1, 1.0, 0)], &plan(16));
        for w in [0, 1] {
            while let Some(c) = o.take(w) {
                o.ran(c, w);
            }
        }
        o.start_phase(&[(0, 3.0, 0), (1, 1.0, 0)], &plan(16));
        assert_eq!(o.queue(0).len(), 12, "{:?}", o.queue(0));
        assert_eq!(o.queue(1).len(), 4);
        let mut all: Vec<ChunkId> = o.pending().collect();
        all.sort_unstable();
        assert_eq!(all, (0..16).collect::<Vec<_>>());
        // Worker 1 leaves before running anything: its chunks go to worker 0.
        o.reassign(&[(0, 3.0, 0)], &plan(16), 0.0);
        assert_eq!(o.queue(0).len(), 16);
    }

    /// A worker lost with its queue: the chunks pinned to another worker (a local
    /// recovery's) all go to it, and the balance leaves them there even with an idle worker
    /// beside it, until the next phase start, which balances again.
    #[test]
    fn pinned_partitions_stay_with_their_new_holder_until_the_next_phase() {
        let three = [(0, 1.0, 0), (1, 1.0, 0), (2, 1.0, 0)];
        // Three workers each ran their third; in the next phase worker 2 ran its own, and
        // worker 0 is lost with 0..4, which worker 1 replays.
        let lost_one = || {
            let mut o = Owners::new(12);
            o.start_phase(&three, &plan(12));
            for w in [0, 1, 2] {
                while let Some(c) = o.take(w) {
                    o.ran(c, w);
                }
            }
            o.start_phase(&three, &plan(12));
            while let Some(c) = o.take(2) {
                o.ran(c, 2);
            }
            o
        };
        let mut o = lost_one();
        o.pin(&[0, 1, 2, 3], 1);
        let two = [(1, 1.0, 0), (2, 1.0, 0)];
        o.reassign(&two, &plan(12), 0.0);
        // (Worker 1's own partitions are the balance's to move.)
        let kept = o.queue(1);
        assert!((0..4).all(|c| kept.contains(&c)), "{kept:?}");
        assert!(o.queue(2).iter().all(|&c| c >= 4), "{:?}", o.queue(2));
        // Without the pin, the idle worker takes some of them.
        let mut free = lost_one();
        free.reassign(&two, &plan(12), 0.0);
        assert!(free.queue(2).iter().any(|&c| c < 4), "{:?}", free.queue(2));
        // The next phase balances again.
        for w in [1, 2] {
            while let Some(c) = o.take(w) {
                o.ran(c, w);
            }
        }
        o.start_phase(&two, &plan(12));
        assert_eq!(o.queue(1).len(), 6, "{:?}", o.queue(1));
    }

    /// Noise below the slack moves nothing.
    #[test]
    fn small_differences_move_nothing() {
        let mut o = Owners::new(8);
        o.start_phase(&[(0, 1.0, 0), (1, 1.0, 0)], &plan(8));
        for w in [0, 1] {
            while let Some(c) = o.take(w) {
                o.ran(c, w);
            }
        }
        o.start_phase(&[(0, 1.0, 0), (1, 1.04, 0)], &plan(8));
        assert_eq!(o.queue(0), vec![0, 1, 2, 3]);
    }

    /// The balance's order of loads is `<`'s: keys of loads in increasing order increase.
    #[test]
    fn load_keys_keep_the_order_of_loads() {
        let loads = [-2.5, -1e-300, 0.0, 1e-300, 0.5, 1.0, 3.0, 1e300];
        let keys: Vec<u64> = loads.iter().map(|&l| order_key(l)).collect();
        assert!(keys.windows(2).all(|k| k[0] < k[1]), "{keys:?}");
    }
}
