//! The simulation's second job: tiles that exchange pieces ([`Exchange`]) on a 2-D graph,
//! with halos, an allgather, an all-to-all and nothing in turn at the phase boundaries, so
//! that every pattern meets the faults the simulation injects (moves, kills, rollbacks,
//! suspends and resumes). Every piece and every fold of the pieces a tile receives is order
//! sensitive: a piece lost, applied twice or handed over in another order changes the value.

use std::ops::Range;

use serde::{Deserialize, Serialize};

use super::{Rng, Simulated};
use crate::reduce::CollectInOrder;
use crate::{Chunk, Chunking, Exchange, Job, Next, Ownership, Pattern, Pieces, Step};

/// `rows` x `cols` tiles of `cells` cells, `phases` phases.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct SimMesh {
    pub(super) rows: u64,
    pub(super) cols: u64,
    pub(super) cells: u64,
    pub(super) phases: u64,
    pub(super) done: u64,
}

/// FNV-1a, word by word.
fn fnv(h: u64, x: u64) -> u64 {
    (h ^ x).wrapping_mul(0x0100_0000_01B3)
}

impl SimMesh {
    pub(super) fn tiles(&self) -> u64 {
        self.rows * self.cols
    }

    /// What crosses the barrier after `phase`.
    pub(super) fn pattern_of(phase: u64) -> Pattern {
        match phase % 4 {
            0 => Pattern::Neighbours,
            1 => Pattern::Allgather,
            2 => Pattern::AllToAll,
            _ => Pattern::Nothing,
        }
    }

    /// The tiles that share a side with `t`.
    pub(super) fn sides(&self, t: u64) -> Vec<u64> {
        let (r, c) = (t / self.cols, t % self.cols);
        let mut n = Vec::new();
        if r > 0 {
            n.push(t - self.cols);
        }
        if c > 0 {
            n.push(t - 1);
        }
        if c + 1 < self.cols {
            n.push(t + 1);
        }
        if r + 1 < self.rows {
            n.push(t + self.cols);
        }
        n
    }
}

/// One tile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct SimTile {
    me: u64,
    cells: Vec<u64>,
}

impl SimTile {
    fn new(me: u64, cells: u64) -> SimTile {
        SimTile {
            me,
            cells: (0..cells).map(|i| fnv(me + 1, i)).collect(),
        }
    }

    /// A phase's work: every cell updated; the tile's hash.
    fn phase(&mut self) -> u64 {
        for (i, c) in self.cells.iter_mut().enumerate() {
            *c = fnv(*c, i as u64).rotate_left(7);
        }
        self.cells.iter().fold(self.me, |h, &c| fnv(h, c))
    }

    pub(super) fn piece(&self, to: Option<u64>) -> Vec<u64> {
        match to {
            Some(to) => vec![fnv(self.cells[0], to), self.me],
            None => vec![self.cells.iter().fold(7, |h, &c| fnv(h, c))],
        }
    }

    fn absorb<'a>(&mut self, pieces: impl Iterator<Item = (u64, &'a Vec<u64>)>) {
        let n = self.cells.len();
        let mut acc = self.me;
        for (k, (from, piece)) in pieces.enumerate() {
            acc = piece.iter().fold(fnv(acc, from), |h, &x| fnv(h, x));
            self.cells[k % n] ^= acc;
        }
    }
}

impl Job for SimMesh {
    const NAME: &'static str = "sim-mesh";
    const OWNERSHIP: Ownership<Self> = Ownership::EXCHANGES;
    type Chunk = SimTile;
    type Reducer = CollectInOrder<u64>;
    type Input = ();

    fn iterations(&self) -> u64 {
        self.tiles() * self.cells
    }

    fn chunking(&self) -> Option<Chunking> {
        Some(Chunking::Size(self.cells))
    }

    fn chunk(&self, range: Range<u64>) -> SimTile {
        SimTile::new(range.start / self.cells, self.cells)
    }

    fn reducer(&self) -> CollectInOrder<u64> {
        CollectInOrder::new()
    }

    fn phases(&self) -> Option<u64> {
        Some(self.phases)
    }

    fn end_phase(&mut self, _: &Vec<u64>) -> Next {
        self.done += 1;
        if self.done < self.phases {
            Next::Continue
        } else {
            Next::Finish
        }
    }
}

impl Chunk for SimTile {
    type Job = SimMesh;
    type Output = Vec<u64>;

    fn step(&mut self, _: &SimMesh, _: &()) -> Step<Vec<u64>> {
        Step::Done(vec![self.phase()])
    }
}

impl Exchange for SimTile {
    type Piece = Vec<u64>;

    fn neighbours(job: &SimMesh, chunk: u64, _: u64) -> Vec<u64> {
        job.sides(chunk)
    }

    fn pattern(_: &SimMesh, phase: u64) -> Pattern {
        SimMesh::pattern_of(phase)
    }

    fn export(&self, _: &SimMesh, to: Option<u64>) -> Vec<u64> {
        self.piece(to)
    }

    fn begin_phase(&mut self, _: &SimMesh, pieces: Pieces<'_, Vec<u64>>) {
        self.absorb(pieces.iter());
    }
}

impl Simulated for SimMesh {
    fn draw(rng: &mut Rng) -> Self {
        SimMesh {
            rows: 1 + rng.below(3),
            cols: 2 + rng.below(3),
            cells: 1 + rng.below(4),
            phases: 2 + rng.below(7),
            done: 0,
        }
    }

    fn expected(&self) -> Vec<u64> {
        self.run(self.phases, |_, _| {}).0
    }

    fn check_begun(&self, chunk: u64, phase: u64, bytes: &[u8]) -> Result<(), String> {
        let got: SimTile = crate::codec::decode("a state", bytes).map_err(|e| e.to_string())?;
        let (_, tiles) = self.run(phase, |_, _| {});
        let want = tiles.get(chunk as usize);
        if want == Some(&got) {
            Ok(())
        } else {
            Err(format!(
                "tile {chunk} as it begins phase {phase} is {got:?}, not {want:?}"
            ))
        }
    }

    fn check_copy(&self, chunk: u64, phase: u64, bytes: &[u8]) -> Result<(), String> {
        let copy: SimTile = crate::codec::decode("a copy", bytes).map_err(|e| e.to_string())?;
        let mut reference = None;
        self.run(phase + 1, |p, tiles| {
            if p == phase {
                reference = tiles.get(chunk as usize).cloned();
            }
        });
        if reference.as_ref() == Some(&copy) {
            Ok(())
        } else {
            Err(format!(
                "the copy of tile {chunk} of phase {phase} is {copy:?}, not {reference:?}"
            ))
        }
    }

    fn check_log(
        &self,
        chunk: u64,
        _: Range<u64>,
        phase: u64,
        halos: &[(Option<u64>, bytes::Bytes)],
    ) -> Result<(), String> {
        let mut tile = None;
        self.run(phase + 1, |p, tiles| {
            if p == phase {
                tile = tiles.get(chunk as usize).cloned();
            }
        });
        let tile = tile.ok_or_else(|| format!("no tile {chunk}"))?;
        let n = self.tiles();
        let mut want: Vec<(Option<u64>, Vec<u64>)> = match SimMesh::pattern_of(phase) {
            Pattern::Neighbours => self.sides(chunk).into_iter().map(Some).collect(),
            Pattern::AllToAll => (0..n).map(Some).collect(),
            Pattern::Allgather => vec![None],
            _ => Vec::new(),
        }
        .into_iter()
        .map(|to| (to, tile.piece(to)))
        .collect();
        let mut got: Vec<(Option<u64>, Vec<u64>)> = halos
            .iter()
            .map(|(to, b)| Ok((*to, crate::codec::decode::<Vec<u64>>("a piece", b)?)))
            .collect::<Result<_, crate::codec::Error>>()
            .map_err(|e| e.to_string())?;
        want.sort();
        got.sort();
        if got == want {
            Ok(())
        } else {
            Err(format!(
                "the halo log of tile {chunk} for phase {phase} is {got:?}, not {want:?}"
            ))
        }
    }

    fn describe(&self) -> String {
        format!(
            "mesh of {} x {} tiles of {} cells, {} phases",
            self.rows, self.cols, self.cells, self.phases
        )
    }
}

impl SimMesh {
    /// The value of the first `phases` phases computed by a plain loop; `ended` sees the
    /// tiles as each phase left them (before the pieces it sends are taken).
    pub(super) fn run(
        &self,
        phases: u64,
        mut ended: impl FnMut(u64, &[SimTile]),
    ) -> (Vec<u64>, Vec<SimTile>) {
        let n = self.tiles();
        let mut tiles: Vec<SimTile> = (0..n).map(|t| SimTile::new(t, self.cells)).collect();
        let mut value = Vec::new();
        for phase in 0..phases {
            value = tiles.iter_mut().map(SimTile::phase).collect();
            ended(phase, &tiles);
            let mut inbox: Vec<Vec<(u64, Vec<u64>)>> = vec![Vec::new(); n as usize];
            for (from, t) in (0..).zip(&tiles) {
                let to: Vec<Option<u64>> = match SimMesh::pattern_of(phase) {
                    Pattern::Neighbours => self.sides(from).into_iter().map(Some).collect(),
                    Pattern::AllToAll => (0..n).map(Some).collect(),
                    Pattern::Allgather => vec![None],
                    _ => Vec::new(),
                };
                for to in to {
                    let p = t.piece(to);
                    match to {
                        Some(to) => inbox[to as usize].push((from, p)),
                        None => inbox.iter_mut().for_each(|b| b.push((from, p.clone()))),
                    }
                }
            }
            for (t, b) in tiles.iter_mut().zip(inbox) {
                t.absorb(b.iter().map(|(f, p)| (*f, p)));
            }
        }
        (value, tiles)
    }
}
