//! Halos between partitions of one worker process stay in it (protocol 12, see
//! [`frame::Halo`]).
//!
//! The protocol machine (`machine.rs`) decides, for each halo a partition exports, whether its neighbour's partition
//! is in this process: run here (queued, running, or held after its `Done`) or placed here.
//! If so the halo is kept here and `Done` (or `Exported`) says [`Halo::Kept`]; the
//! coordinator names it back with `Kept` in the neighbour's `Begin`. If the neighbour leaves
//! first (`Surrendered`, `Yielded`, …), what was kept for it goes up in `Released` right
//! before the message that hands it back.
//!
//! Both decisions are taken as messages go out, in the order they reach the coordinator (the
//! snapshot writes of `machine.rs` hold some messages back): a halo is kept only while its
//! partition has not been handed back on the wire, so the coordinator can count on one rule,
//! "a kept halo is where its partition is, until `Released` says otherwise".

use crate::schedule::idhash::{IdMap, IdSet};

use bytes::Bytes;

use crate::schedule::{Shape, Side};
use crate::wire::frame::{Halo, ToCoordinator, ToWorker};

/// The neighbours of a partition, as the coordinator's: a process does not know how many
/// chunks the job has, and needs not: a neighbour past the last chunk is never here.
const SHAPE: Shape = Shape::chain(u64::MAX);

/// The partitions in this process and the halos kept for them.
#[derive(Debug, Default)]
pub(super) struct Keeper {
    /// Chunks whose partition is in this process.
    here: IdSet<u64>,
    /// Kept halos, by the chunk they are for and the neighbour that exported them.
    kept: IdMap<(u64, Side), Bytes>,
}

impl Keeper {
    /// A message from the coordinator: a `Run`, `Place` or `PlacePart` brings a partition
    /// here; `Forget` drops them all (the job rolled back).
    pub(super) fn arrived(&mut self, msg: &ToWorker) {
        match msg {
            ToWorker::Run { chunk, .. }
            | ToWorker::Place { chunk, .. }
            | ToWorker::PlacePart { chunk, .. } => {
                self.here.insert(*chunk);
            }
            ToWorker::Forget => {
                self.here.clear();
                self.kept.clear();
            }
            _ => {}
        }
    }

    /// A `Begin` with the halos this process kept in place of [`Halo::Kept`]; `None` if one
    /// of them is not here (the coordinator named a halo this process did not keep).
    pub(super) fn begin(&mut self, msg: ToWorker) -> Option<ToWorker> {
        let ToWorker::Begin {
            chunk,
            before,
            after,
        } = msg
        else {
            return Some(msg);
        };
        let mut take = |h: Option<Halo>, from| match h {
            Some(Halo::Kept) => self
                .kept
                .remove(&(chunk, from))
                .map(|b| Some(Halo::Sent(b))),
            h => Some(h),
        };
        let before = take(before, Side::Before)?;
        let after = take(after, Side::After)?;
        Some(ToWorker::Begin {
            chunk,
            before,
            after,
        })
    }

    /// A message on its way to the coordinator, pushed onto `out`: halos for partitions here
    /// are kept; a message that hands a partition back goes after a `Released` with what was
    /// kept for it.
    pub(super) fn outgoing(&mut self, mut msg: ToCoordinator, out: &mut Vec<ToCoordinator>) {
        match &mut msg {
            ToCoordinator::Done {
                chunk,
                halos: Some(halos),
                ..
            } => {
                self.here.insert(*chunk);
                self.keep(*chunk, halos);
                out.push(msg);
            }
            ToCoordinator::Exported { chunk, halos, .. } => {
                self.keep(*chunk, halos);
                out.push(msg);
            }
            ToCoordinator::Surrendered { chunk, .. }
            | ToCoordinator::Yielded { chunk, .. }
            | ToCoordinator::Abandoned { chunk, .. }
            | ToCoordinator::Failed { chunk, .. }
            | ToCoordinator::FailedHeld { chunk, .. }
            | ToCoordinator::Missing { chunk } => {
                let chunk = *chunk;
                self.here.remove(&chunk);
                let before = self.kept.remove(&(chunk, Side::Before));
                let after = self.kept.remove(&(chunk, Side::After));
                if before.is_some() || after.is_some() {
                    out.push(ToCoordinator::Released {
                        chunk,
                        before,
                        after,
                    });
                }
                out.push(msg);
            }
            _ => out.push(msg),
        }
    }

    /// The halos `chunk` exported (the one for the chunk before, the one for the chunk
    /// after), each kept, and replaced by [`Halo::Kept`], where that chunk's partition is
    /// here.
    fn keep(&mut self, chunk: u64, (up, down): &mut (Halo, Halo)) {
        for (h, side) in [(up, Side::Before), (down, Side::After)] {
            let to = SHAPE.neighbour(chunk, side);
            if let Some(to) = to.filter(|to| self.here.contains(to)) {
                if let Halo::Sent(b) = std::mem::replace(h, Halo::Kept) {
                    // For `to`, this halo came from its neighbour on the other side.
                    self.kept.insert((to, side.opposite()), b);
                }
            }
        }
    }

    /// How many halos are kept here.
    #[cfg(test)]
    fn kept(&self) -> usize {
        self.kept.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(chunk: u64) -> ToWorker {
        ToWorker::Run {
            slot: 0,
            chunk,
            start: chunk,
            end: chunk + 1,
            state: None,
            held: false,
        }
    }

    fn done(chunk: u64) -> ToCoordinator {
        ToCoordinator::Done {
            slot: 0,
            chunk,
            output: Bytes::new(),
            halos: Some((sent(chunk, "up"), sent(chunk, "down"))),
            iterations: 1,
            busy_ns: 1,
        }
    }

    fn sent(chunk: u64, side: &str) -> Halo {
        Halo::Sent(Bytes::from(format!("{chunk} {side}")))
    }

    fn out(k: &mut Keeper, msg: ToCoordinator) -> Vec<ToCoordinator> {
        let mut v = Vec::new();
        k.outgoing(msg, &mut v);
        v
    }

    fn halos(msg: &ToCoordinator) -> (Halo, Halo) {
        match msg {
            ToCoordinator::Done { halos: Some(h), .. } => h.clone(),
            m => panic!("not a done with halos: {m:?}"),
        }
    }

    /// Chunks 1-3 run here, 0 and 4 elsewhere: halos between 1, 2 and 3 stay, those for 0
    /// and 4 go up; each `Begin` gets the kept ones back, once.
    #[test]
    fn halos_between_partitions_here_stay_here() {
        let mut k = Keeper::default();
        for c in 1..=3 {
            k.arrived(&run(c));
        }
        let one = out(&mut k, done(1));
        assert_eq!(halos(&one[0]), (sent(1, "up"), Halo::Kept));
        let two = out(&mut k, done(2));
        assert_eq!(halos(&two[0]), (Halo::Kept, Halo::Kept));
        let three = out(&mut k, done(3));
        assert_eq!(halos(&three[0]), (Halo::Kept, sent(3, "down")));
        assert_eq!(k.kept(), 4);
        let begin = |chunk, before, after| ToWorker::Begin {
            chunk,
            before,
            after,
        };
        assert_eq!(
            k.begin(begin(2, Some(Halo::Kept), Some(Halo::Kept))),
            Some(begin(2, Some(sent(1, "down")), Some(sent(3, "up"))))
        );
        // Bytes from the coordinator pass as they are.
        assert_eq!(
            k.begin(begin(1, Some(sent(0, "down")), Some(Halo::Kept))),
            Some(begin(1, Some(sent(0, "down")), Some(sent(2, "up"))))
        );
        // A kept halo is given once: a second `Begin` naming it is refused.
        assert_eq!(k.begin(begin(2, Some(Halo::Kept), None)), None);
        assert_eq!(k.kept(), 1);
    }

    /// A partition handed back takes what was kept for it along, right before it; halos
    /// exported after it left go up.
    #[test]
    fn a_partition_that_leaves_takes_its_kept_halos_first() {
        let mut k = Keeper::default();
        for c in 0..4 {
            k.arrived(&run(c));
        }
        let _ = out(&mut k, done(0));
        let _ = out(&mut k, done(2));
        let surrendered = ToCoordinator::Surrendered {
            chunk: 1,
            state: Bytes::from_static(b"state"),
        };
        let sent_up = out(&mut k, surrendered.clone());
        assert_eq!(
            sent_up,
            vec![
                ToCoordinator::Released {
                    chunk: 1,
                    before: Some(Bytes::from("0 down")),
                    after: Some(Bytes::from("2 up")),
                },
                surrendered
            ]
        );
        // What 2 kept for 3 stays.
        assert_eq!(k.kept(), 1);
        // Chunk 1 is gone: what 0 and 2 export for it now goes up.
        let again = out(&mut k, done(2));
        assert_eq!(halos(&again[0]), (sent(2, "up"), Halo::Kept));
        // A partition with nothing kept goes alone.
        let yielded = ToCoordinator::Yielded {
            slot: 0,
            chunk: 1,
            state: Bytes::new(),
            iterations: 0,
            busy_ns: 0,
        };
        assert_eq!(out(&mut k, yielded.clone()), vec![yielded]);
        // A rollback forgets everything.
        k.arrived(&ToWorker::Forget);
        assert_eq!(k.kept(), 0);
        assert_eq!(
            halos(&out(&mut k, done(2))[0]),
            (sent(2, "up"), sent(2, "down"))
        );
    }
}
