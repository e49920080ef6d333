//! The geometry of a grid cut into blocks: which cells a block holds, where it sits and which
//! blocks touch it.
//!
//! A job whose partitions are blocks of a 2-D or 3-D grid (a 7-point heat stencil on pencils,
//! a 2-D stencil on tiles) holds a [`Blocks`] in its job value and asks it, for each chunk,
//! for the cells it owns ([`Blocks::extent`]), the chunks it exchanges halos with
//! ([`Blocks::neighbours`]: the answer to
//! [`Exchange::neighbours`](crate::Exchange::neighbours)), and, for a piece it exports to or
//! receives from a neighbour, which face it belongs to ([`Blocks::face`]).
//! `examples/heat3d.rs` runs a 3-D stencil on pencils this way.
//!
//! ```
//! use malleable::Blocks;
//! use malleable::blocks::Face;
//!
//! // A 64 × 48 × 32 grid (z, y, x) cut into 2 × 3 pencils, each spanning all of x.
//! let blocks = Blocks::pencils([64, 48, 32], [2, 3])?;
//! assert_eq!(blocks.len(), 6);
//! // Row-major numbering of the blocks: chunk 4 is block (z 1, y 1).
//! assert_eq!(blocks.coords(4), [1, 1, 0]);
//! assert_eq!(blocks.extent(4), [32..64, 16..32, 0..32]);
//! // Its face neighbours, ascending: the block below it in z, and both sides in y.
//! assert_eq!(blocks.neighbours(4), vec![1, 3, 5]);
//! assert_eq!(blocks.face(4, 1), Some(Face { dim: 0, low: true }));
//! assert_eq!(blocks.face(4, 5), Some(Face { dim: 1, low: false }));
//! assert_eq!(blocks.face(4, 2), None); // a corner: not a face neighbour
//! // The cells chunk 4 sends chunk 5 (its last y layer), and where they land in chunk 5
//! // (the layer just outside its first y layer: its halo on that face).
//! assert_eq!(blocks.boundary(4, Face { dim: 1, low: false }), [32..64, 31..32, 0..32]);
//! assert_eq!(blocks.halo(5, Face { dim: 1, low: true }), [32..64, 31..32, 0..32]);
//! # Ok::<(), malleable::blocks::Error>(())
//! ```
//!
//! # Conventions
//!
//! - **Dimensions** are always three, numbered `0` (z, the slowest), `1` (y), `2` (x, the
//!   fastest, contiguous in a row-major array). A 2-D grid ([`Blocks::tiles`]) is one layer
//!   of z: its z extent is `0..1` and it has no z neighbours.
//! - **Numbering**: the blocks are numbered in row-major order of their coordinates, so
//!   chunk `c` is block `(bz, by, bx)` with `c = (bz · by_count + by) · bx_count + bx`
//!   ([`Blocks::coords`], [`Blocks::chunk_at`]). Cut the job's iterations into one chunk
//!   per block (`iterations() = blocks.len()`, `Chunking::Size(1)`) and chunk `c` is the
//!   chunk whose range starts at `c`.
//! - **Sizes**: `n` cells cut into `p` blocks along a dimension give blocks of `⌊n/p⌋` or
//!   `⌈n/p⌉` cells, the larger ones first: block `i` starts at `i·⌊n/p⌋ + min(i, n mod p)`.
//! - **Neighbours** share a face (not an edge or a corner); the grid is not periodic. Two
//!   blocks are neighbours when their coordinates differ by one in exactly one dimension, a
//!   relation symmetric by construction, and since the blocks of a dimension all have the
//!   same cut in the other dimensions, the face two neighbours share is a whole face of each.
//!
//! # Validation
//!
//! A grid with no cells in a dimension, a dimension cut into no blocks or into more blocks
//! than it has cells, or more blocks in all than a `u64` counts, is refused with an
//! [`Error`]. A [`Blocks`] read back with serde is checked the same way, so a value in a
//! snapshot or on the wire is valid or refused, never a division by zero later.

use std::ops::Range;

use serde::{Deserialize, Serialize};

/// A `Result` with the blocks [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a grid cannot be cut as asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The grid has no cells along dimension `dim`.
    #[error("the grid has no cells along dimension {dim}")]
    NoCells {
        /// The dimension (0 = z, 1 = y, 2 = x).
        dim: usize,
    },
    /// Dimension `dim` is cut into no blocks.
    #[error("dimension {dim} is cut into no blocks")]
    NoBlocks {
        /// The dimension (0 = z, 1 = y, 2 = x).
        dim: usize,
    },
    /// Dimension `dim` has fewer cells than the blocks it is cut into: a block would be
    /// empty.
    #[error("dimension {dim} has {cells} cells, fewer than the {blocks} blocks it is cut into")]
    TooManyBlocks {
        /// The dimension (0 = z, 1 = y, 2 = x).
        dim: usize,
        /// Its cells.
        cells: u64,
        /// The blocks asked for along it.
        blocks: u64,
    },
    /// The number of blocks in all (the product of the blocks per dimension) does not fit
    /// in a `u64`.
    #[error("{blocks:?} blocks per dimension are more blocks than a u64 counts")]
    TooManyInAll {
        /// The blocks per dimension.
        blocks: [u64; 3],
    },
}

/// A face of a block: the side of dimension `dim` it is on (`low`: towards coordinate 0).
///
/// Dimensions are numbered 0 (z), 1 (y), 2 (x); see the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Face {
    /// The dimension the face is normal to: 0 (z), 1 (y) or 2 (x).
    pub dim: usize,
    /// Whether it is the face towards lower coordinates (`true`) or higher ones.
    pub low: bool,
}

impl Face {
    /// The face on the other side of the same dimension: the face a neighbour touches this
    /// one with.
    pub fn opposite(self) -> Face {
        Face {
            dim: self.dim,
            low: !self.low,
        }
    }
}

/// A grid of `cells` (z, y, x) cut into `blocks` (z, y, x) blocks: which cells each block
/// holds, its coordinates among the blocks, and its face neighbours.
///
/// See the [module docs](self) for the numbering, the sizes and an example. It is small
/// (six numbers) and serializable, so a job value can hold it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Shape")]
pub struct Blocks {
    /// Cells along z, y, x (each at least 1).
    cells: [u64; 3],
    /// Blocks along z, y, x (each at least 1 and at most the cells along it).
    blocks: [u64; 3],
}

/// A [`Blocks`] as read by serde, before it is checked.
#[derive(Deserialize)]
struct Shape {
    cells: [u64; 3],
    blocks: [u64; 3],
}

impl TryFrom<Shape> for Blocks {
    type Error = Error;

    fn try_from(s: Shape) -> Result<Blocks> {
        Blocks::cubes(s.cells, s.blocks)
    }
}

impl Blocks {
    /// A 2-D grid of `ny × nx` cells cut into `ty × tx` tiles. It is one layer of z: its
    /// blocks' z extent is `0..1` and their coordinates `[0, by, bx]`.
    ///
    /// # Errors
    ///
    /// See [`Blocks::cubes`].
    pub fn tiles([ny, nx]: [u64; 2], [ty, tx]: [u64; 2]) -> Result<Blocks> {
        Blocks::cubes([1, ny, nx], [1, ty, tx])
    }

    /// A 3-D grid of `nz × ny × nx` cells cut into `pz × py` pencils, each spanning all of
    /// x (the contiguous dimension, so a pencil's rows stay whole).
    ///
    /// # Errors
    ///
    /// See [`Blocks::cubes`].
    pub fn pencils([nz, ny, nx]: [u64; 3], [pz, py]: [u64; 2]) -> Result<Blocks> {
        Blocks::cubes([nz, ny, nx], [pz, py, 1])
    }

    /// A 3-D grid of `cells` (z, y, x) cut into `blocks` (z, y, x) blocks along every
    /// dimension.
    ///
    /// # Errors
    ///
    /// [`Error::NoCells`] for a dimension of no cells, [`Error::NoBlocks`] for one cut into
    /// no blocks, [`Error::TooManyBlocks`] for one cut into more blocks than it has cells,
    /// [`Error::TooManyInAll`] when the blocks in all do not fit in a `u64`.
    pub fn cubes(cells: [u64; 3], blocks: [u64; 3]) -> Result<Blocks> {
        for dim in 0..3 {
            let (n, p) = (cells[dim], blocks[dim]);
            if n == 0 {
                return Err(Error::NoCells { dim });
            }
            if p == 0 {
                return Err(Error::NoBlocks { dim });
            }
            if p > n {
                return Err(Error::TooManyBlocks {
                    dim,
                    cells: n,
                    blocks: p,
                });
            }
        }
        blocks
            .iter()
            .try_fold(1u64, |all, &p| all.checked_mul(p))
            .ok_or(Error::TooManyInAll { blocks })?;
        Ok(Blocks { cells, blocks })
    }

    /// The number of blocks: the chunks of a job with one chunk per block, numbered
    /// `0..len()` in row-major order of their coordinates.
    pub fn len(&self) -> u64 {
        self.blocks.iter().product()
    }

    /// Never: a grid is cut into one block at least.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The grid's cells along z, y, x.
    pub fn cells(&self) -> [u64; 3] {
        self.cells
    }

    /// The blocks along z, y, x.
    pub fn blocks(&self) -> [u64; 3] {
        self.blocks
    }

    /// The coordinates (z, y, x) of block `chunk` among the blocks: row-major,
    /// `chunk = (bz · by_count + by) · bx_count + bx`.
    ///
    /// # Panics
    ///
    /// If `chunk >= self.len()`.
    pub fn coords(&self, chunk: u64) -> [u64; 3] {
        self.check(chunk);
        let [_, py, px] = self.blocks;
        [chunk / (py * px), chunk / px % py, chunk % px]
    }

    /// The block at coordinates `at` (z, y, x), `None` outside the blocks.
    pub fn chunk_at(&self, at: [u64; 3]) -> Option<u64> {
        if (0..3).any(|d| at[d] >= self.blocks[d]) {
            return None;
        }
        let [_, py, px] = self.blocks;
        Some((at[0] * py + at[1]) * px + at[2])
    }

    /// The cells (z, y, x) of block `chunk`: the ranges of indices it holds along each
    /// dimension, the larger blocks of a dimension first (see the [module docs](self)).
    ///
    /// # Panics
    ///
    /// If `chunk >= self.len()`.
    pub fn extent(&self, chunk: u64) -> [Range<u64>; 3] {
        let at = self.coords(chunk);
        std::array::from_fn(|d| split(self.cells[d], self.blocks[d], at[d]))
    }

    /// The block that holds the cell at `cell` (z, y, x), `None` outside the grid.
    pub fn chunk_of(&self, cell: [u64; 3]) -> Option<u64> {
        if (0..3).any(|d| cell[d] >= self.cells[d]) {
            return None;
        }
        self.chunk_at(std::array::from_fn(|d| {
            part_of(self.cells[d], self.blocks[d], cell[d])
        }))
    }

    /// The face neighbours of block `chunk`, ascending: the blocks whose coordinates differ
    /// from its own by one in exactly one dimension. `b` is a neighbour of `a` exactly when
    /// `a` is one of `b`.
    ///
    /// # Panics
    ///
    /// If `chunk >= self.len()`.
    pub fn neighbours(&self, chunk: u64) -> Vec<u64> {
        let mut out: Vec<u64> = FACES
            .iter()
            .filter_map(|&f| self.neighbour(chunk, f))
            .collect();
        out.sort_unstable();
        out
    }

    /// The block across face `face` of block `chunk`, `None` at the edge of the grid.
    ///
    /// # Panics
    ///
    /// If `chunk >= self.len()` or `face.dim > 2`.
    pub fn neighbour(&self, chunk: u64, face: Face) -> Option<u64> {
        let mut at = self.coords(chunk);
        let d = face.dim;
        at[d] = if face.low {
            at[d].checked_sub(1)?
        } else {
            at[d] + 1
        };
        self.chunk_at(at)
    }

    /// The face of block `chunk` that block `neighbour` touches, `None` if it is not a face
    /// neighbour (itself, a block across an edge or a corner, a block farther away, or no
    /// block at all). Then `face(neighbour, chunk)` is its [`Face::opposite`].
    ///
    /// # Panics
    ///
    /// If `chunk >= self.len()`.
    pub fn face(&self, chunk: u64, neighbour: u64) -> Option<Face> {
        let a = self.coords(chunk);
        if neighbour >= self.len() {
            return None;
        }
        let b = self.coords(neighbour);
        let mut differ = (0..3).filter(|&d| a[d] != b[d]);
        let (dim, None) = (differ.next()?, differ.next()) else {
            return None;
        };
        if a[dim] + 1 == b[dim] {
            Some(Face { dim, low: false })
        } else if b[dim] + 1 == a[dim] {
            Some(Face { dim, low: true })
        } else {
            None
        }
    }

    /// The layer of cells of block `chunk` on its face `face`, one cell thick: what it sends
    /// the neighbour across that face for a one-cell halo.
    ///
    /// # Panics
    ///
    /// If `chunk >= self.len()` or `face.dim > 2`.
    pub fn boundary(&self, chunk: u64, face: Face) -> [Range<u64>; 3] {
        let mut ext = self.extent(chunk);
        let r = &mut ext[face.dim];
        *r = if face.low {
            r.start..r.start + 1
        } else {
            r.end - 1..r.end
        };
        ext
    }

    /// The layer of cells just outside block `chunk` across its face `face`, one cell thick:
    /// its halo on that face, the [`Blocks::boundary`] of the neighbour there on the
    /// opposite face. Past the edge of the grid it lies outside the grid (a range starting
    /// at `u64::MAX` on a low face, at the grid's size on a high one).
    ///
    /// # Panics
    ///
    /// If `chunk >= self.len()` or `face.dim > 2`.
    pub fn halo(&self, chunk: u64, face: Face) -> [Range<u64>; 3] {
        let mut ext = self.extent(chunk);
        let r = &mut ext[face.dim];
        *r = if face.low {
            let at = r.start.wrapping_sub(1);
            at..at.wrapping_add(1)
        } else {
            r.end..r.end.saturating_add(1)
        };
        ext
    }

    fn check(&self, chunk: u64) {
        assert!(
            chunk < self.len(),
            "block {chunk} of a grid cut into {} blocks",
            self.len()
        );
    }
}

/// The six faces, in the order low z, high z, low y, high y, low x, high x.
const FACES: [Face; 6] = [
    Face { dim: 0, low: true },
    Face { dim: 0, low: false },
    Face { dim: 1, low: true },
    Face { dim: 1, low: false },
    Face { dim: 2, low: true },
    Face { dim: 2, low: false },
];

/// Part `i` of `n` cells cut into `p` parts (`1 <= p <= n`, `i < p`): `⌊n/p⌋` or `⌈n/p⌉`
/// cells, the larger parts first.
fn split(n: u64, p: u64, i: u64) -> Range<u64> {
    let (q, r) = (n / p, n % p);
    let start = i * q + i.min(r);
    start..start + q + u64::from(i < r)
}

/// The part of [`split`] that holds cell `x` (`x < n`).
fn part_of(n: u64, p: u64, x: u64) -> u64 {
    let (q, r) = (n / p, n % p);
    // The first `r` parts have `q + 1` cells, the others `q` (at least 1, as p <= n).
    let big = r * (q + 1);
    if x < big {
        x / (q + 1)
    } else {
        r + (x - big) / q
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_are_numbered_row_major_and_the_first_are_larger() {
        let b = Blocks::tiles([10, 7], [3, 2]).unwrap();
        assert_eq!(b.len(), 6);
        assert_eq!(b.cells(), [1, 10, 7]);
        assert_eq!(b.blocks(), [1, 3, 2]);
        let extents: Vec<_> = (0..6).map(|c| b.extent(c)).collect();
        assert_eq!(
            extents,
            vec![
                [0..1, 0..4, 0..4],
                [0..1, 0..4, 4..7],
                [0..1, 4..7, 0..4],
                [0..1, 4..7, 4..7],
                [0..1, 7..10, 0..4],
                [0..1, 7..10, 4..7],
            ]
        );
        assert_eq!(b.coords(3), [0, 1, 1]);
        assert_eq!(b.chunk_at([0, 2, 1]), Some(5));
        assert_eq!(b.chunk_at([0, 3, 0]), None);
        assert_eq!(b.chunk_at([1, 0, 0]), None);
        // The middle tile of the left column: up, its right, down; no z neighbours.
        assert_eq!(b.neighbours(2), vec![0, 3, 4]);
        assert_eq!(b.neighbours(0), vec![1, 2]);
        assert_eq!(b.face(2, 0), Some(Face { dim: 1, low: true }));
        assert_eq!(b.face(2, 3), Some(Face { dim: 2, low: false }));
        assert_eq!(b.face(2, 5), None); // a corner
        assert_eq!(b.face(0, 4), None); // two tiles down
        assert_eq!(b.face(2, 2), None); // itself
        assert_eq!(b.face(2, 6), None); // no such tile
        assert_eq!(b.chunk_of([0, 6, 4]), Some(3));
        assert_eq!(b.chunk_of([0, 7, 3]), Some(4));
        assert_eq!(b.chunk_of([0, 10, 0]), None);
    }

    #[test]
    fn pencils_span_x_and_cubes_cut_it() {
        let p = Blocks::pencils([8, 6, 5], [2, 3]).unwrap();
        assert_eq!(p.len(), 6);
        assert!((0..6).all(|c| p.extent(c)[2] == (0..5)));
        assert!((0..6).all(|c| p.coords(c)[2] == 0));
        let c = Blocks::cubes([4, 4, 4], [2, 2, 2]).unwrap();
        assert_eq!(c.len(), 8);
        // Block 0 touches one block across each of its three high faces.
        assert_eq!(c.neighbours(0), vec![1, 2, 4]);
        assert_eq!(c.neighbours(7), vec![3, 5, 6]);
        assert_eq!(c.neighbour(0, Face { dim: 0, low: true }), None);
        assert_eq!(c.neighbour(0, Face { dim: 0, low: false }), Some(4));
    }

    #[test]
    fn a_single_block_has_no_neighbours_and_its_halos_lie_outside() {
        let b = Blocks::cubes([3, 3, 3], [1, 1, 1]).unwrap();
        assert_eq!(b.len(), 1);
        assert!(b.neighbours(0).is_empty());
        let low = b.halo(0, Face { dim: 2, low: true });
        assert_eq!(low[2].start, u64::MAX);
        assert_eq!(b.halo(0, Face { dim: 1, low: false })[1], 3..4);
    }

    #[test]
    fn bad_cuts_are_refused_with_what_is_wrong() {
        assert_eq!(
            Blocks::tiles([0, 4], [1, 1]),
            Err(Error::NoCells { dim: 1 })
        );
        assert_eq!(
            Blocks::pencils([4, 4, 4], [2, 0]),
            Err(Error::NoBlocks { dim: 1 })
        );
        assert_eq!(
            Blocks::cubes([4, 3, 4], [1, 4, 1]),
            Err(Error::TooManyBlocks {
                dim: 1,
                cells: 3,
                blocks: 4
            })
        );
        let huge = 1 << 32;
        assert_eq!(
            Blocks::cubes([huge; 3], [huge; 3]),
            Err(Error::TooManyInAll { blocks: [huge; 3] })
        );
        // A count just under 2⁶⁴ is fine.
        let most = Blocks::cubes([huge; 3], [huge, huge - 1, 1]).unwrap();
        assert_eq!(u128::from(most.len()), (1u128 << 64) - (1u128 << 32));
    }

    #[test]
    #[should_panic(expected = "block 6 of a grid cut into 6 blocks")]
    fn a_block_past_the_last_is_a_panic() {
        Blocks::tiles([10, 7], [3, 2]).unwrap().extent(6);
    }

    #[test]
    fn serde_round_trips_and_refuses_a_bad_cut() {
        let b = Blocks::pencils([9, 8, 7], [3, 2]).unwrap();
        let json = serde_json::to_string(&b).unwrap();
        assert_eq!(json, r#"{"cells":[9,8,7],"blocks":[3,2,1]}"#);
        assert_eq!(serde_json::from_str::<Blocks>(&json).unwrap(), b);
        let bytes = postcard::to_allocvec(&b).unwrap();
        assert_eq!(postcard::from_bytes::<Blocks>(&bytes).unwrap(), b);
        let zero = r#"{"cells":[9,8,7],"blocks":[3,0,1]}"#;
        let err = serde_json::from_str::<Blocks>(zero).unwrap_err();
        assert!(
            err.to_string()
                .contains("dimension 1 is cut into no blocks"),
            "{err}"
        );
    }

    mod proptests {
        use super::super::*;
        use proptest::prelude::*;

        /// A grid of up to 9 cells a side and a valid cut of it.
        fn cut() -> impl Strategy<Value = Blocks> {
            prop::array::uniform3(1u64..=9)
                .prop_flat_map(|cells| {
                    let blocks = [
                        1..=cells[0], //
                        1..=cells[1],
                        1..=cells[2],
                    ];
                    (Just(cells), blocks)
                })
                .prop_map(|(cells, [z, y, x])| Blocks::cubes(cells, [z, y, x]).unwrap())
        }

        proptest! {
            #[test]
            fn extents_tile_the_grid_exactly(b in cut()) {
                // Every cell is in the extent of exactly one block, the one chunk_of names.
                let cells = b.cells();
                let extents: Vec<_> = (0..b.len()).map(|c| b.extent(c)).collect();
                for z in 0..cells[0] {
                    for y in 0..cells[1] {
                        for x in 0..cells[2] {
                            let holders: Vec<u64> = (0..b.len())
                                .filter(|&c| {
                                    let e = &extents[c as usize];
                                    e[0].contains(&z) && e[1].contains(&y) && e[2].contains(&x)
                                })
                                .collect();
                            prop_assert_eq!(holders.len(), 1);
                            prop_assert_eq!(b.chunk_of([z, y, x]), Some(holders[0]));
                        }
                    }
                }
                // Along each dimension the sizes differ by one at most, the larger first.
                for c in 0..b.len() {
                    let at = b.coords(c);
                    prop_assert_eq!(b.chunk_at(at), Some(c));
                    for d in 0..3 {
                        let len = extents[c as usize][d].end - extents[c as usize][d].start;
                        let (q, r) = (cells[d] / b.blocks()[d], cells[d] % b.blocks()[d]);
                        prop_assert_eq!(len, q + u64::from(at[d] < r));
                    }
                }
            }

            #[test]
            fn neighbours_are_symmetric_and_share_a_whole_face(b in cut()) {
                for a in 0..b.len() {
                    let ns = b.neighbours(a);
                    prop_assert!(ns.windows(2).all(|w| w[0] < w[1]), "{:?}", ns);
                    prop_assert!(!ns.contains(&a));
                    for other in 0..b.len() {
                        let face = b.face(a, other);
                        prop_assert_eq!(face.is_some(), ns.contains(&other));
                        prop_assert_eq!(b.neighbours(other).contains(&a), ns.contains(&other));
                        if let Some(f) = face {
                            prop_assert_eq!(b.face(other, a), Some(f.opposite()));
                            prop_assert_eq!(b.neighbour(a, f), Some(other));
                            // What `a` reads across the face is what `other` sends it.
                            prop_assert_eq!(b.halo(a, f), b.boundary(other, f.opposite()));
                        }
                    }
                }
            }
        }
    }
}
