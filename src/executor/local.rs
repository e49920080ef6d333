//! Local workers as the state sees them: how many threads there are to be, which retire, and
//! the inline worker (the thread blocked in [`JobHandle::wait`](crate::JobHandle::wait) when
//! the job has zero threads). The threads themselves are the driver's (`threads.rs`).

use super::job_run::State;
use super::links::Order;
use crate::job::Job;
use crate::schedule::{Event, WorkerId};

impl<J: Job> State<J> {
    /// Brings the local workers to the target: spawn or retire threads, start or stop the
    /// inline worker.
    pub(crate) fn reconcile(&mut self) {
        if self.ended {
            return;
        }
        let threads: Vec<WorkerId> = {
            let mut v: Vec<WorkerId> = self
                .members
                .locals()
                .filter(|(_, l)| !l.inline && !l.retiring)
                .map(|(w, _)| w)
                .collect();
            v.sort_unstable();
            v
        };
        let inline: Option<WorkerId> = self
            .members
            .locals()
            .find(|(_, l)| l.inline && !l.retiring)
            .map(|(w, _)| w);
        for &w in threads.iter().skip(self.members.target).rev() {
            self.retire(w);
        }
        for _ in threads.len()..self.members.target {
            self.spawn();
        }
        match (self.members.target, inline) {
            (0, None) if self.members.waiting => {
                let w = self.members.join_local(true);
                self.orders.push(Order::Inline(w));
                let _ = self.feed(Event::Joined { worker: w }, None);
            }
            (1.., Some(w)) => self.retire(w),
            _ => {}
        }
    }

    /// A new local thread joins (the driver spawns it; if it cannot, the job ends with
    /// [`Error::Spawn`]).
    fn spawn(&mut self) {
        let w = self.members.join_local(false);
        self.orders.push(Order::Spawn(w));
        let _ = self.feed(Event::Joined { worker: w }, None);
    }

    pub(crate) fn retire(&mut self, w: WorkerId) {
        if let Some(l) = self.members.local_mut(w) {
            l.retiring = true;
            let _ = self.feed(Event::Retire { worker: w }, None);
        }
    }

    /// Forgets a local worker that left the core without a `Release` command.
    pub(crate) fn release(&mut self, worker: WorkerId) {
        self.members.remove(worker);
    }

    /// The caller's new target for local threads.
    pub(crate) fn set_target(&mut self, n: usize) {
        self.members.target = n;
        self.settle();
    }
}
