//! Halos between partitions of one worker process stay in it (protocol 12, see
//! [`frame::Halo`]), and so do halos other processes push here directly (protocol 20, see
//! [`peer`](crate::wire::peer)).
//!
//! The protocol machine (`machine.rs`) decides, for each halo a partition exports, whether its neighbour's partition
//! is in this process: run here (queued, running, or held after its `Done`) or placed here.
//! If so the halo is kept here and `Done` (or `Exported`) says [`Halo::Kept`]; the
//! coordinator names it back with `Kept` in the neighbour's `Begin`. If the neighbour leaves
//! first (`Surrendered`, `Yielded`, …), what was kept for it goes up in `Released` right
//! before the message that hands it back.
//!
//! A halo pushed here by another process ([`Keeper::accept`]) is kept by the same rule, once
//! accepted: its sender reports it as [`Halo::KeptAt`] this process only after this process
//! said it keeps it, and only a partition here (not handed back on the wire) accepts one.
//!
//! Both decisions are taken as messages go out, in the order they reach the coordinator (the
//! snapshot writes of `machine.rs` hold some messages back): a halo is kept only while its
//! partition has not been handed back on the wire, so the coordinator can count on one rule,
//! "a kept halo is where its partition is, until `Released` says otherwise".
//!
//! Kept halos are kept by the phase that exported them. With pushes, a partition here may
//! hold the halos of two phases at once: a neighbour in another process may end its next
//! phase and push its next halo before this process has taken the `Begin` that consumes the
//! last one (the two come on different connections). `Begin` in phase `p` takes those of
//! phase `p - 1`, and `Released` names its phase.

use std::collections::BTreeMap;

use crate::schedule::idhash::IdSet;

use bytes::Bytes;

use crate::wire::frame::{Halo, ToCoordinator, ToWorker};

/// The partitions in this process and the halos kept for them.
#[derive(Debug, Default)]
pub(super) struct Keeper {
    /// Chunks whose partition is in this process.
    here: IdSet<u64>,
    /// Those of them whose only copy is here (held after their `Done`, run where they are
    /// held, placed): the coordinator keeps no state of theirs to fall back to, so losing
    /// this process rolls the job back. Only those accept halos pushed by peers: a halo
    /// pushed to a partition that runs here from a state the coordinator also has would be
    /// lost with this process while its partition goes on elsewhere.
    only: IdSet<u64>,
    /// Kept halos, by the chunk they are for, the phase that exported them and the chunk that
    /// exported them (so that a partition's are one range, by phase, in sender order).
    kept: BTreeMap<(u64, u64, u64), Bytes>,
    /// The allgather pieces (for every partition) partitions here exported, by sender, with
    /// the phase that exported them: they go up, and the coordinator names them in the next
    /// phase's `Gathered` instead of sending them back (protocol 25). The last two phases'
    /// are kept ([`Keeper::phase`]); a partition that leaves leaves its piece here, since
    /// the `Gathered` that names it comes after.
    own: BTreeMap<u64, (u64, Bytes)>,
}

impl Keeper {
    /// A message from the coordinator: a `Run`, `Place` or `PlacePart` brings a partition
    /// here; `Forget` drops them all (the job rolled back).
    pub(super) fn arrived(&mut self, msg: &ToWorker) {
        match msg {
            ToWorker::Run {
                chunk, held, then, ..
            } => {
                self.here.insert(*chunk);
                if *held {
                    self.only.insert(*chunk);
                }
                for &(c, _, _) in then {
                    self.here.insert(c);
                    self.only.insert(c);
                }
            }
            ToWorker::Place { chunk, .. } | ToWorker::PlacePart { chunk, .. } => {
                self.here.insert(*chunk);
                self.only.insert(*chunk);
            }
            ToWorker::Forget => {
                self.here.clear();
                self.only.clear();
                self.kept.clear();
                self.own.clear();
            }
            _ => {}
        }
    }

    /// A partition replayed here (local recovery) is held here from now on, its only copy.
    pub(super) fn replayed(&mut self, chunk: u64) {
        self.here.insert(chunk);
        self.only.insert(chunk);
    }

    /// A `Begin` of `phase` with the halos this process kept (those of the phase before) in
    /// place of [`Halo::Kept`]; `None` if one of them is not here (the coordinator named a
    /// halo this process did not keep). A halo the `Begin` brings as bytes replaces a copy
    /// kept here of the same phase: a push this process accepted but whose sender never
    /// heard it was, and which it sent through the coordinator instead.
    pub(super) fn begin(&mut self, msg: ToWorker, phase: u64) -> Option<ToWorker> {
        let ToWorker::Begin { chunk, mut halos } = msg else {
            return Some(msg);
        };
        let before = phase.checked_sub(1);
        for (from, h) in &mut halos {
            match h {
                Halo::Kept => {
                    *h = Halo::Sent(self.kept.remove(&(chunk, before?, *from))?);
                }
                _ => {
                    if let Some(before) = before {
                        if self.kept.remove(&(chunk, before, *from)).is_some() {
                            tracing::debug!(chunk, from, "a pushed halo also came as bytes");
                        }
                    }
                }
            }
        }
        Some(ToWorker::Begin { chunk, halos })
    }

    /// A halo another process pushed here (`from` exported it at the end of `phase` for
    /// `to`): kept if `to`'s partition is here, its only copy, and no halo of that phase from
    /// `from` is kept for it already. Whether it was kept.
    pub(super) fn accept(&mut self, to: u64, phase: u64, from: u64, bytes: Bytes) -> bool {
        if !self.only.contains(&to) {
            return false;
        }
        match self.kept.entry((to, phase, from)) {
            std::collections::btree_map::Entry::Occupied(_) => false,
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert(bytes);
                true
            }
        }
    }

    /// Phase `phase` begins: the allgather pieces exported before the phase that just
    /// ended are dropped (a `Gathered` names only those of the phase that ended).
    pub(super) fn phase(&mut self, phase: u64) {
        self.own.retain(|_, (p, _)| p.saturating_add(1) >= phase);
    }

    /// The allgather piece partition `from` exported here at the end of `phase`, if it did.
    pub(super) fn own_piece(&self, from: u64, phase: u64) -> Option<Bytes> {
        match self.own.get(&from) {
            Some((p, b)) if *p == phase => Some(b.clone()),
            _ => None,
        }
    }

    /// Whether `chunk`'s partition is in this process.
    pub(super) fn is_here(&self, chunk: u64) -> bool {
        self.here.contains(&chunk)
    }

    /// A message on its way to the coordinator in `phase`, pushed onto `out`: halos for
    /// partitions here are kept; a message that hands a partition back goes after a
    /// `Released` (one per phase) with what was kept for it.
    pub(super) fn outgoing(
        &mut self,
        mut msg: ToCoordinator,
        phase: u64,
        out: &mut Vec<ToCoordinator>,
    ) {
        match &mut msg {
            ToCoordinator::Done {
                chunk,
                halos: Some(halos),
                ..
            } => {
                self.here.insert(*chunk);
                self.only.insert(*chunk);
                self.keep(*chunk, phase, halos);
                out.push(msg);
            }
            ToCoordinator::Exported { chunk, halos, .. } => {
                self.keep(*chunk, phase, halos);
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
                self.only.remove(&chunk);
                let mine: Vec<(u64, u64, u64)> = self
                    .kept
                    .range((chunk, 0, 0)..=(chunk, u64::MAX, u64::MAX))
                    .map(|(k, _)| *k)
                    .collect();
                let mut released: Option<ToCoordinator> = None;
                for k in mine {
                    let Some(b) = self.kept.remove(&k) else {
                        continue;
                    };
                    match &mut released {
                        Some(ToCoordinator::Released { phase, halos, .. }) if *phase == k.1 => {
                            halos.push((k.2, Halo::Sent(b)));
                        }
                        _ => {
                            out.extend(released.take());
                            released = Some(ToCoordinator::Released {
                                chunk,
                                phase: k.1,
                                halos: vec![(k.2, Halo::Sent(b))],
                            });
                        }
                    }
                }
                out.extend(released);
                out.push(msg);
            }
            _ => out.push(msg),
        }
    }

    /// The halos `chunk` exported, each kept, and replaced by [`Halo::Kept`], where the
    /// partition it is for is here. One for every partition (an allgather's) goes up: the
    /// others need it too; a handle on it stays here for the next `Gathered`.
    fn keep(&mut self, chunk: u64, phase: u64, halos: &mut [(Option<u64>, Halo)]) {
        for (to, h) in halos {
            match to {
                Some(to) if self.here.contains(to) => {
                    if let Halo::Sent(b) = std::mem::replace(h, Halo::Kept) {
                        self.kept.insert((*to, phase, chunk), b);
                    }
                }
                Some(_) => {}
                None => {
                    if let Halo::Sent(b) = h {
                        self.own.insert(chunk, (phase, b.clone()));
                    }
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
            then: Vec::new(),
        }
    }

    /// Chunk `chunk` of a chain done, with a halo for the chunk before and the one after.
    fn done(chunk: u64) -> ToCoordinator {
        let mut halos = Vec::new();
        if let Some(b) = chunk.checked_sub(1) {
            halos.push((Some(b), sent(chunk, "up")));
        }
        halos.push((Some(chunk + 1), sent(chunk, "down")));
        ToCoordinator::Done {
            slot: 0,
            chunk,
            output: Bytes::new(),
            halos: Some(halos),
            iterations: 1,
            busy_ns: 1,
        }
    }

    fn sent(chunk: u64, side: &str) -> Halo {
        Halo::Sent(Bytes::from(format!("{chunk} {side}")))
    }

    fn out(k: &mut Keeper, msg: ToCoordinator) -> Vec<ToCoordinator> {
        let mut v = Vec::new();
        k.outgoing(msg, PHASE, &mut v);
        v
    }

    /// The halos of a `Done`, without their addresses.
    fn halos(msg: &ToCoordinator) -> Vec<Halo> {
        match msg {
            ToCoordinator::Done { halos: Some(h), .. } => {
                h.iter().map(|(_, h)| h.clone()).collect()
            }
            m => panic!("not a done with halos: {m:?}"),
        }
    }

    /// The phase the tests' partitions end; their `Begin`s are of the next.
    const PHASE: u64 = 3;

    fn begin(chunk: u64, halos: Vec<(u64, Halo)>) -> ToWorker {
        ToWorker::Begin { chunk, halos }
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
        assert_eq!(halos(&one[0]), vec![sent(1, "up"), Halo::Kept]);
        let two = out(&mut k, done(2));
        assert_eq!(halos(&two[0]), vec![Halo::Kept, Halo::Kept]);
        let three = out(&mut k, done(3));
        assert_eq!(halos(&three[0]), vec![Halo::Kept, sent(3, "down")]);
        assert_eq!(k.kept(), 4);
        assert_eq!(
            k.begin(begin(2, vec![(1, Halo::Kept), (3, Halo::Kept)]), PHASE + 1),
            Some(begin(2, vec![(1, sent(1, "down")), (3, sent(3, "up"))]))
        );
        // Bytes from the coordinator pass as they are.
        assert_eq!(
            k.begin(
                begin(1, vec![(0, sent(0, "down")), (2, Halo::Kept)]),
                PHASE + 1
            ),
            Some(begin(1, vec![(0, sent(0, "down")), (2, sent(2, "up"))]))
        );
        // A kept halo is given once: a second `Begin` naming it is refused.
        assert_eq!(k.begin(begin(2, vec![(1, Halo::Kept)]), PHASE + 1), None);
        // One from a sender that exported nothing for it is refused too.
        assert_eq!(k.begin(begin(3, vec![(1, Halo::Kept)]), PHASE + 1), None);
        assert_eq!(k.kept(), 1);
    }

    /// Any graph: pieces addressed to partitions here stay, whatever their distance; one
    /// for every partition (an allgather's) always goes up, the others need it too.
    #[test]
    fn addressed_pieces_stay_where_their_partition_is() {
        let mut k = Keeper::default();
        for c in [0, 5, 9] {
            k.arrived(&run(c));
        }
        let piece = |s: &str| Halo::Sent(Bytes::from(s.to_owned()));
        let msg = ToCoordinator::Done {
            slot: 0,
            chunk: 5,
            output: Bytes::new(),
            halos: Some(vec![
                (Some(0), piece("to 0")),
                (Some(4), piece("to 4")),
                (Some(9), piece("to 9")),
            ]),
            iterations: 1,
            busy_ns: 1,
        };
        let sent_up = out(&mut k, msg);
        assert_eq!(
            halos(&sent_up[0]),
            vec![Halo::Kept, piece("to 4"), Halo::Kept]
        );
        let all = ToCoordinator::Done {
            slot: 0,
            chunk: 9,
            output: Bytes::new(),
            halos: Some(vec![(None, piece("to all"))]),
            iterations: 1,
            busy_ns: 1,
        };
        assert_eq!(halos(&out(&mut k, all)[0]), vec![piece("to all")]);
        assert_eq!(
            k.begin(
                begin(9, vec![(5, Halo::Kept), (9, piece("to all"))]),
                PHASE + 1
            ),
            Some(begin(9, vec![(5, piece("to 9")), (9, piece("to all"))]))
        );
    }

    /// A partition handed back takes what was kept for it along, right before it, in
    /// sender order; halos exported after it left go up.
    #[test]
    fn a_partition_that_leaves_takes_its_kept_halos_first() {
        let mut k = Keeper::default();
        for c in 0..4 {
            k.arrived(&run(c));
        }
        let _ = out(&mut k, done(2));
        let _ = out(&mut k, done(0));
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
                    phase: PHASE,
                    halos: vec![(0, sent(0, "down")), (2, sent(2, "up"))],
                },
                surrendered
            ]
        );
        // What 2 kept for 3 stays.
        assert_eq!(k.kept(), 1);
        // Chunk 1 is gone: what 0 and 2 export for it now goes up.
        let again = out(&mut k, done(2));
        assert_eq!(halos(&again[0]), vec![sent(2, "up"), Halo::Kept]);
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
            vec![sent(2, "up"), sent(2, "down")]
        );
    }
}
