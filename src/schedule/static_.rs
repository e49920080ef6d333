//! The static schedule: a round-robin deal, and the two-step reassignment when the worker
//! count changes (seed 000, Fig. 5).
//!
//! 1. *Deal again*: every pending chunk `c` goes to `workers[c % k]` of the new, sorted worker
//!    list. Finished and running chunks are skipped. With an unchanged membership this is the
//!    phase-start deal, which gives affinity from phase to phase.
//! 2. *Balance*: while moving the last unstarted chunk of the most loaded worker to the least
//!    loaded one lowers the larger of their two loads, move it. A worker's load is its pending
//!    iterations divided by its measured throughput, so slower workers get less.
//!
//! A worker only runs chunks from its own queue; static never steals. A chunk handed back goes
//! to the queue of `workers[c % k]`.

use std::collections::{BTreeSet, VecDeque};

use super::idhash::IdMap;
use super::{ChunkId, Plan, WorkerId};

/// Per-worker queues of pending chunks, each in index order.
#[derive(Debug, Default)]
pub(super) struct Deal {
    queues: IdMap<WorkerId, VecDeque<ChunkId>>,
    /// Pending chunks while no worker is present.
    orphans: BTreeSet<ChunkId>,
    /// The workers of the last deal, sorted.
    workers: Vec<WorkerId>,
    /// Pending chunks in all queues and orphans.
    len: usize,
    /// The membership changed while nothing was pending: deal again before the next put-back.
    stale: bool,
}

impl Deal {
    /// All chunks of a fresh phase, dealt over `workers` (sorted).
    pub(super) fn new(len: ChunkId, workers: &[(WorkerId, f64)], plan: &Plan) -> Deal {
        let mut deal = Deal {
            orphans: (0..len).collect(),
            ..Deal::default()
        };
        deal.redeal(workers, plan, |_| true);
        deal
    }

    /// `pending` (increasing) dealt over `workers` (sorted).
    pub(super) fn with_pending(
        pending: Vec<ChunkId>,
        workers: &[(WorkerId, f64)],
        plan: &Plan,
    ) -> Deal {
        let mut deal = Deal::default();
        deal.deal(pending, workers, plan, |_| true);
        deal
    }

    /// The next chunk of `w`'s queue.
    pub(super) fn take(&mut self, w: WorkerId) -> Option<ChunkId> {
        let c = self.queues.get_mut(&w)?.pop_front()?;
        self.len -= 1;
        Some(c)
    }

    /// Puts a handed-back chunk into the queue of its round-robin owner.
    /// Call [`Deal::is_stale`] first: a stale deal must be dealt again after the put-back.
    pub(super) fn put_back(&mut self, c: ChunkId) -> Option<WorkerId> {
        self.len += 1;
        if self.workers.is_empty() {
            self.orphans.insert(c);
            return None;
        }
        let w = self.workers[(c % self.workers.len() as u64) as usize];
        let q = self.queues.entry(w).or_default();
        let at = q.partition_point(|&x| x < c);
        q.insert(at, c);
        Some(w)
    }

    /// The two-step reassignment over `workers` (sorted by id, with their throughput in
    /// iterations per second). `unstarted(c)` tells whether chunk `c` may move in step 2.
    pub(super) fn redeal(
        &mut self,
        workers: &[(WorkerId, f64)],
        plan: &Plan,
        unstarted: impl Fn(ChunkId) -> bool,
    ) {
        let mut pending: Vec<ChunkId> = std::mem::take(&mut self.orphans).into_iter().collect();
        for (_, q) in self.queues.drain() {
            pending.extend(q);
        }
        pending.sort_unstable();
        self.deal(pending, workers, plan, unstarted);
    }

    /// Records a membership change. With chunks pending it returns `true`: deal again now.
    /// With none, dealing (O(workers) per change, so O(workers²) for a burst of joins) is
    /// put off until a chunk is handed back.
    pub(super) fn membership_changed(&mut self) -> bool {
        self.stale = self.len == 0;
        !self.stale
    }

    /// Whether the membership changed since the last deal.
    pub(super) fn is_stale(&self) -> bool {
        self.stale
    }

    /// Steps 1 and 2 over `pending` (sorted).
    fn deal(
        &mut self,
        pending: Vec<ChunkId>,
        workers: &[(WorkerId, f64)],
        plan: &Plan,
        unstarted: impl Fn(ChunkId) -> bool,
    ) {
        self.workers = workers.iter().map(|&(w, _)| w).collect();
        self.len = pending.len();
        self.stale = false;
        let k = workers.len();
        if k == 0 {
            self.orphans.extend(pending);
            return;
        }
        // Step 1: round-robin over the new list; finished and running chunks are not pending.
        let mut queues: Vec<VecDeque<ChunkId>> = vec![VecDeque::new(); k];
        for c in pending {
            queues[(c % k as u64) as usize].push_back(c);
        }
        // Step 2: move unstarted chunks from the most to the least loaded worker.
        let speed = |i: usize| workers[i].1.max(f64::MIN_POSITIVE);
        let mut load: Vec<f64> = (0..k)
            .map(|i| queues[i].iter().map(|&c| len_of(plan, c)).sum::<f64>() / speed(i))
            .collect();
        loop {
            let (hi, lo) = extremes(&load);
            if hi == lo {
                break;
            }
            let Some(pos) = queues[hi].iter().rposition(|&c| unstarted(c)) else {
                break;
            };
            let c = queues[hi][pos];
            let len = len_of(plan, c);
            let (new_hi, new_lo) = (load[hi] - len / speed(hi), load[lo] + len / speed(lo));
            if new_hi.max(new_lo) >= load[hi] {
                break;
            }
            queues[hi].remove(pos);
            let at = queues[lo].partition_point(|&x| x < c);
            queues[lo].insert(at, c);
            load[hi] = new_hi;
            load[lo] = new_lo;
        }
        self.queues = self.workers.iter().copied().zip(queues).collect();
    }

    /// Every pending chunk.
    pub(super) fn pending(&self) -> impl Iterator<Item = ChunkId> + '_ {
        self.queues
            .values()
            .flatten()
            .copied()
            .chain(self.orphans.iter().copied())
    }

    /// Whether no chunk is pending.
    #[cfg(test)]
    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The queue of `w`, for tests.
    #[cfg(test)]
    pub(super) fn queue(&self, w: WorkerId) -> Vec<ChunkId> {
        self.queues
            .get(&w)
            .map(|q| q.iter().copied().collect())
            .unwrap_or_default()
    }
}

pub(super) fn len_of(plan: &Plan, c: ChunkId) -> f64 {
    let r = plan.range(c);
    (r.end - r.start) as f64
}

/// Indices of the largest and the smallest load.
pub(super) fn extremes(load: &[f64]) -> (usize, usize) {
    let (mut hi, mut lo) = (0, 0);
    for (i, &l) in load.iter().enumerate() {
        if l > load[hi] {
            hi = i;
        }
        if l < load[lo] {
            lo = i;
        }
    }
    (hi, lo)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of seed 000, Fig. 5: 16 chunks on two threads; thread 1 finished four of its
    /// chunks; the count doubles to four.
    #[test]
    fn figure_5_two_step_reassignment() {
        let plan = Plan::Uniform { n: 16, size: 1 };
        let two = [(0, 1.0), (1, 1.0)];
        let mut deal = Deal::new(16, &two, &plan);
        assert_eq!(deal.queue(0), vec![0, 2, 4, 6, 8, 10, 12, 14]);
        for _ in 0..4 {
            deal.take(1); // chunks 1, 3, 5, 7 finished
        }
        let four = [(0, 1.0), (1, 1.0), (2, 1.0), (3, 1.0)];
        deal.redeal(&four, &plan, |_| true);
        let loads: Vec<usize> = (0..4).map(|w| deal.queue(w).len()).collect();
        // Step 1 alone gives 4, 2, 4, 2 (with 0..16 and 1, 3, 5, 7 skipped); step 2 evens it.
        assert_eq!(loads.iter().sum::<usize>(), 12);
        assert!(loads.iter().all(|&l| l == 3), "{loads:?}");
        let mut all: Vec<ChunkId> = deal.pending().collect();
        all.sort_unstable();
        assert_eq!(all, vec![0, 2, 4, 6, 8, 9, 10, 11, 12, 13, 14, 15]);
    }

    #[test]
    fn slower_workers_get_less() {
        let plan = Plan::Uniform { n: 100, size: 1 };
        let deal = Deal::new(100, &[(0, 3.0), (1, 1.0)], &plan);
        assert_eq!(deal.queue(0).len(), 75);
        assert_eq!(deal.queue(1).len(), 25);
    }
}
