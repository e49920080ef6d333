//! The rows shortcut: a grid partitioned by rows that lives across phases, updated one row at a
//! time from the neighbouring rows.
//!
//! Most simulations over a 2-D grid (a heat solver, SOR, Lattice-Boltzmann) are
//! `for phase { for i in rows { row[i] = f(row[i - 1], row[i], row[i + 1]) }; reduce }`.
//! Implement [`Rows`] with the update of one row and submit [`Banded`]`(your_rows)`: the grid
//! is cut into [`Rows::bands`] bands of rows, each an owned partition ([`Partition`]) made
//! once and updated in place phase after phase on the worker that holds it. At the end of a
//! phase a band exports its first and last rows; before the next one it receives its
//! neighbours' (the *halos*), so only two rows per boundary cross the barrier, never the grid.
//! [`Rows::end_phase`] sees the reduced value of the phase (a residual, an energy), not the
//! grid.
//!
//! # How a phase reads the rows next to the one it updates
//!
//! - [`Sweep::Jacobi`] (the default): every row is computed from the previous phase's rows.
//!   A band keeps two buffers and swaps them at the end of a phase, as a double-buffered
//!   sequential loop does.
//! - [`Sweep::InPlace`]: one buffer, rows updated in order, each reading its row above as this
//!   phase left it (inside the band) and its row below as the previous phase left it. At a
//!   band's first row the row above is the halo, the previous phase's. A red-black sweep,
//!   which updates only cells whose neighbours it does not update, gives the same bits as the
//!   sequential loop; a plain Gauss-Seidel sweep depends on where the bands start (fixed for
//!   the job, so still deterministic for any worker count).
//! - [`Sweep::ThreeLevel`]: a scheme that reads two earlier phases (a wave equation's
//!   `uⁿ⁺¹ = f(uⁿ, uⁿ⁻¹)`): as [`Sweep::Jacobi`], and the row written holds, on entry, the
//!   row two phases back. The two levels are the band's two buffers, so a cell is one level
//!   and a halo carries only the level its neighbours read.
//!
//! # The phase
//!
//! [`Window::phase`] is the phase an update belongs to (the executor's count, kept by
//! snapshots), and [`Window::last`] says whether [`Rows::phases`] announced it as the last:
//! a red-black colour, a different first step, or the row hashes of the final grid need no
//! phase counter in the job value.
//!
//! # Step length
//!
//! A step updates a batch of rows whose size adapts to about [`Rows::target_step`], as
//! [`Fold`](crate::Fold) does for iterations.
//!
//! # Snapshots
//!
//! A band is serialized as its cells' little-endian bytes in one block ([`Element`]), so a
//! snapshot of a grid costs about a copy of it, and restores on any architecture. A band
//! writes only what it still reads to finish its phase exactly (see `BandRef` in the source):
//! its rows, never the stale second buffer of [`Sweep::Jacobi`], and a halo only while a row
//! still to update reads it. A snapshot of the whole grid is then the grid's bytes and a few
//! rows more ([`Sweep::ThreeLevel`]: both levels, twice the grid's bytes).

use std::fmt;
use std::ops::Range;
use std::time::{Duration, Instant};

use serde::de::{DeserializeOwned, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::fold::{DEFAULT_STEP, adapt};
use crate::job::{BoxError, Chunk, Input, Job, Next, Ownership, Partition, Step};
use crate::reduce::Reducer;
use crate::schedule::Chunking;

/// A grid over rows updated phase after phase; run it as [`Banded`]`(self)`.
///
/// # Example
///
/// ```
/// use malleable::rows::{Rows, Window};
/// use malleable::{Banded, Executor, Next, reduce::Max};
/// use serde::{Deserialize, Serialize};
///
/// /// Jacobi relaxation of a 1-D bar per row, until the largest change is small.
/// #[derive(Serialize, Deserialize)]
/// struct Smooth { n: u64, w: usize, phases: u64 }
///
/// impl Rows for Smooth {
///     const NAME: &'static str = "smooth";
///     type Element = f64;
///     type Acc = f64;
///     type Reducer = Max<f64>;
///     type Input = ();
///     fn height(&self) -> u64 { self.n }
///     fn width(&self) -> usize { self.w }
///     fn reducer(&self) -> Max<f64> { Max::new() }
///     fn init(&self, _: &(), i: u64, row: &mut [f64]) { row.fill(i as f64); }
///     fn update(&self, _: &(), _i: u64, win: Window<'_, f64>, change: &mut f64) {
///         let (above, below) = match (win.above, win.below) {
///             (Some(a), Some(b)) => (a, b),
///             _ => return win.row.copy_from_slice(win.old), // fixed edges
///         };
///         for j in 0..win.row.len() {
///             win.row[j] = 0.5 * (above[j] + below[j]);
///             *change = change.max((win.row[j] - win.old[j]).abs());
///         }
///     }
///     fn end_phase(&mut self, _change: &f64) -> Next {
///         self.phases -= 1;
///         if self.phases == 0 { Next::Finish } else { Next::Continue }
///     }
/// }
///
/// let exec = Executor::builder().local_workers(2).build()?;
/// let done = exec.run(Banded(Smooth { n: 64, w: 8, phases: 10 }))?;
/// assert_eq!(done.value, 0.0); // a linear profile is already relaxed
/// # Ok::<(), malleable::Error>(())
/// ```
pub trait Rows: Serialize + DeserializeOwned + Send + Sync + Sized + 'static {
    /// Stable name, as [`Job::NAME`].
    const NAME: &'static str;
    /// The version of the serialized form of the job value, its elements and its
    /// accumulator, as [`Job::VERSION`] (default 1): bump it when one of them changes.
    const VERSION: u32 = 1;
    /// How a phase reads the rows next to the one it updates (default [`Sweep::Jacobi`]).
    const SWEEP: Sweep = Sweep::Jacobi;
    /// One cell of the grid.
    type Element: Element;
    /// The accumulator of one band in one phase; it starts as the reducer's identity.
    type Acc: Serialize + DeserializeOwned + Send + 'static;
    /// Combines the bands' accumulators, in band order.
    type Reducer: Reducer<Value = Self::Acc>;
    /// Read-only data built once per process, as [`Job::Input`] (use `()` when there is none).
    type Input: Input<Self>;

    /// Rows of the grid; the same for the whole job.
    fn height(&self) -> u64;
    /// Cells per row; the same for the whole job.
    fn width(&self) -> usize;
    /// Bands the grid is cut into, each an owned partition (default: 32, at most one per
    /// row). More bands balance unequal workers more finely; each costs two halo rows per
    /// phase. Fixed for the job: the value does not depend on the worker count.
    fn bands(&self) -> u64 {
        32
    }
    /// The reducer of the current phase.
    fn reducer(&self) -> Self::Reducer;
    /// The initial value of row `i` (called once per row, on the worker that holds its band,
    /// and for a band's neighbouring rows).
    fn init(&self, input: &Self::Input, i: u64, row: &mut [Self::Element]);
    /// Updates row `i` for this phase and folds what it measured into `acc` (see [`Window`]
    /// for what it reads and writes).
    fn update(
        &self,
        input: &Self::Input,
        i: u64,
        window: Window<'_, Self::Element>,
        acc: &mut Self::Acc,
    );
    /// As [`Job::end_phase`], with the phase's reduced value; the default finishes after one
    /// phase.
    fn end_phase(&mut self, value: &Self::Acc) -> Next {
        let _ = value;
        Next::Finish
    }
    /// As [`Job::phases`]: how many phases (sweeps) the job runs in all, when it knows. It
    /// also sets [`Window::last`].
    ///
    /// `Some(0)` is a job of no phase: nothing is initialized or updated, `end_phase` is not
    /// called, and the job finishes at once with the job value as submitted and, as its
    /// value, the reducer's identity (`reducer().identity()`, an empty accumulator). A job
    /// whose `end_phase` asks for another phase while `phases()` says `Some(0)` is refused
    /// at that barrier: that phase would have no rows
    /// ([`Error::PartitionsChanged`](crate::Error::PartitionsChanged)).
    fn phases(&self) -> Option<u64> {
        None
    }
    /// The step length the batch of rows adapts to (default [`DEFAULT_STEP`]).
    fn target_step(&self) -> Duration {
        DEFAULT_STEP
    }
    /// As [`Job::resumed_with`]: takes (`Ok`) or refuses a submitted grid whose bytes differ
    /// from those the snapshot's run was submitted with (more sweeps, say). The default
    /// refuses every change. The grid's shape (height, bands, width, element size) cannot
    /// change: it is checked after this call.
    ///
    /// # Errors
    ///
    /// Whatever refuses the change.
    fn resumed_with(&mut self, submitted: Self, started_with: &Self) -> Result<(), BoxError> {
        let _ = (submitted, started_with);
        Err(Box::new(crate::job::NoChange))
    }
    /// How often the grid is handed to [`Rows::output`]: `Some(k)` after every `k`-th
    /// phase and after the last; `Some(0)` after the last only; `None` (the default) never
    /// (as [`Partition::output_every`]).
    fn output_every(&self) -> Option<u64> {
        None
    }
    /// Writes out the rows `rows` of the grid as phase `phase` left them (`cells`, row
    /// after row: an image's strip, a VTK or HDF5 piece), when [`Rows::output_every`] asks.
    /// Called once per band, on the worker that holds the band (a thread of this process or
    /// of a worker process) right after the band's last row of the phase, or, after the
    /// last phase, when the job finished; `self` is the grid as it ran `phase`. A phase run
    /// again (a rollback, a resume) is output again. The default writes nothing. See
    /// [`Partition::output`].
    ///
    /// # Errors
    ///
    /// An error ends the job with [`Error::Output`](crate::Error::Output).
    fn output(
        &self,
        input: &Self::Input,
        phase: u64,
        rows: Range<u64>,
        cells: &[Self::Element],
    ) -> Result<(), BoxError> {
        let _ = (input, phase, rows, cells);
        Ok(())
    }
    /// Whether the finished job brings the whole grid back to the caller
    /// ([`Finished::field`](crate::Finished::field)); the default (`false`) does not.
    fn gather_at_end(&self) -> bool {
        false
    }
}

/// How a phase of a [`Rows`] grid reads the rows next to the one it updates (see the
/// [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sweep {
    /// From the previous phase's rows: `above`, `old` and `below` are rows `i - 1`, `i` and
    /// `i + 1` as the previous phase left them; `row` is written (its content on entry is
    /// unspecified).
    Jacobi,
    /// In place, in row order: `row` holds row `i` and is updated in place; `old` is empty;
    /// `above` is row `i - 1` as this phase left it (the previous phase's at a band's first
    /// row), `below` row `i + 1` as the previous phase left it.
    InPlace,
    /// A three-level scheme (a wave equation's leapfrog: `uⁿ⁺¹` from `uⁿ` and `uⁿ⁻¹`):
    /// `above`, `old` and `below` are rows `i - 1`, `i` and `i + 1` as the previous phase
    /// left them (`uⁿ`), as for [`Jacobi`](Sweep::Jacobi); `row` holds, on entry, row `i`
    /// as the phase before the previous one left it (`uⁿ⁻¹`; in phase 0 the initial row,
    /// the same as `old`) and is written with this phase's (`uⁿ⁺¹`). The band keeps the two
    /// levels in its two buffers and swaps them at the end of a phase, so a cell holds one
    /// level (`f64`, not `[f64; 2]`), a step reads and writes each cell of `row` once, and
    /// halos carry only the previous phase's rows, which is all a neighbour reads. A
    /// snapshot holds both levels.
    ThreeLevel,
}

/// What [`Rows::update`] reads and writes for one row (see [`Sweep`]), and the phase it
/// belongs to.
#[derive(Debug)]
pub struct Window<'a, E> {
    /// Row `i - 1`; `None` for the first row of the grid.
    pub above: Option<&'a [E]>,
    /// Row `i` as the previous phase left it ([`Sweep::Jacobi`], [`Sweep::ThreeLevel`]);
    /// empty for [`Sweep::InPlace`].
    pub old: &'a [E],
    /// Row `i`, to write (on entry: unspecified for [`Sweep::Jacobi`], row `i` as the phase
    /// before the previous one left it for [`Sweep::ThreeLevel`], as the previous phase left
    /// it for [`Sweep::InPlace`]).
    pub row: &'a mut [E],
    /// Row `i + 1`; `None` for the last row of the grid.
    pub below: Option<&'a [E]>,
    /// The phase this update belongs to, 0-based: the executor's count of the job's phases,
    /// which snapshots record, so it is the same on every worker and after a move, a
    /// rollback or a resume. A red-black sweep's colour is `phase % 2`; the job value need
    /// not count phases for `update`.
    pub phase: u64,
    /// Whether this is the job's last phase as [`Rows::phases`] announces it
    /// (`phases() == Some(phase + 1)`): the phase to hash or sum the final rows in. Always
    /// `false` when `phases()` is `None`, and in the last phase of a job whose
    /// [`end_phase`](Rows::end_phase) finishes before the announced count.
    pub last: bool,
}

/// A cell type a [`Rows`] grid can hold: stored as little-endian bytes, in bulk.
///
/// Implemented for the primitive numbers and for arrays of them (`[f64; 9]` for the nine
/// distributions of a D2Q9 Lattice-Boltzmann cell).
pub trait Element: Copy + Default + Send + Sync + 'static {
    /// Bytes of one element.
    const SIZE: usize;
    /// Writes `src` into `out` (`src.len() * SIZE` bytes), little-endian.
    fn to_le(src: &[Self], out: &mut [u8]);
    /// Reads `dst.len()` elements from `bytes` (`dst.len() * SIZE` bytes), little-endian.
    fn from_le(bytes: &[u8], dst: &mut [Self]);
    /// The cells' memory, when it already is their little-endian form (the primitives and
    /// arrays of them, on a little-endian machine): a band is then serialized from it
    /// directly, with no buffer in between. `None` (the default) goes through
    /// [`to_le`](Element::to_le).
    fn le_bytes(src: &[Self]) -> Option<&[u8]> {
        let _ = src;
        None
    }
    /// The same for writing: decoded cells are copied into this memory in one block.
    fn le_bytes_mut(dst: &mut [Self]) -> Option<&mut [u8]> {
        let _ = dst;
        None
    }
}

macro_rules! element {
    ($($t:ty),*) => {$(
        impl Element for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            fn to_le(src: &[Self], out: &mut [u8]) {
                for (o, x) in out.chunks_exact_mut(Self::SIZE).zip(src) {
                    o.copy_from_slice(&x.to_le_bytes());
                }
            }
            fn from_le(bytes: &[u8], dst: &mut [Self]) {
                for (d, b) in dst.iter_mut().zip(bytes.chunks_exact(Self::SIZE)) {
                    *d = <$t>::from_le_bytes(b.try_into().expect("chunks_exact gives SIZE bytes"));
                }
            }
            fn le_bytes(src: &[Self]) -> Option<&[u8]> {
                cfg!(target_endian = "little").then(|| bytemuck::cast_slice(src))
            }
            fn le_bytes_mut(dst: &mut [Self]) -> Option<&mut [u8]> {
                cfg!(target_endian = "little").then(|| bytemuck::cast_slice_mut(dst))
            }
        }
    )*};
}

element!(f32, f64, u8, u16, u32, u64, i8, i16, i32, i64);

impl<T: Element, const N: usize> Element for [T; N]
where
    [T; N]: Default,
{
    const SIZE: usize = T::SIZE * N;
    fn to_le(src: &[Self], out: &mut [u8]) {
        for (o, x) in out.chunks_exact_mut(Self::SIZE).zip(src) {
            T::to_le(x, o);
        }
    }
    fn from_le(bytes: &[u8], dst: &mut [Self]) {
        for (d, b) in dst.iter_mut().zip(bytes.chunks_exact(Self::SIZE)) {
            T::from_le(b, d);
        }
    }
    fn le_bytes(src: &[Self]) -> Option<&[u8]> {
        T::le_bytes(src.as_flattened())
    }
    fn le_bytes_mut(dst: &mut [Self]) -> Option<&mut [u8]> {
        T::le_bytes_mut(dst.as_flattened_mut())
    }
}

/// Runs a [`Rows`] grid as a [`Job`] with owned partitions: `exec.run(Banded(my_rows))`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Banded<R>(pub R);

/// The input of a [`Banded`] job: the grid's own input.
#[derive(Debug)]
pub struct BandedInput<R: Rows>(pub R::Input);

impl<R: Rows> Input<Banded<R>> for BandedInput<R> {
    fn load(job: &Banded<R>) -> Result<Self, BoxError> {
        R::Input::load(&job.0).map(BandedInput)
    }
}

impl<R: Rows> Job for Banded<R> {
    const NAME: &'static str = R::NAME;
    const VERSION: u32 = R::VERSION;
    const OWNERSHIP: Ownership<Self> = Ownership::PARTITIONS.checked(shape::<R>, fits::<R>);
    type Chunk = Band<R>;
    type Reducer = R::Reducer;
    type Input = BandedInput<R>;

    fn iterations(&self) -> u64 {
        // A job of no phase: the one phase the executor runs has no rows (see `Rows::phases`).
        if self.0.phases() == Some(0) {
            return 0;
        }
        self.0.height()
    }

    fn chunking(&self) -> Option<Chunking> {
        Some(Chunking::Count(self.0.bands().max(1)))
    }

    fn chunk(&self, range: Range<u64>) -> Band<R> {
        let w = self.0.width();
        let rows = (range.end - range.start) as usize;
        Band {
            start: range.start,
            end: range.end,
            width: w as u64,
            next: range.start,
            cur: Cells(vec![R::Element::default(); rows * w]),
            new: Cells(Vec::new()),
            before: Cells(Vec::new()),
            after: Cells(Vec::new()),
            acc: self.0.reducer().identity(),
            fresh: true,
            batch: 0,
            phase: 0,
        }
    }

    fn reducer(&self) -> R::Reducer {
        self.0.reducer()
    }

    fn end_phase(&mut self, value: &R::Acc) -> Next {
        if self.0.phases() == Some(0) {
            return Next::Finish;
        }
        self.0.end_phase(value)
    }

    fn phases(&self) -> Option<u64> {
        self.0.phases()
    }

    fn resumed_with(&mut self, submitted: Self, started_with: &Self) -> Result<(), BoxError> {
        self.0.resumed_with(submitted.0, &started_with.0)
    }
}

/// The names of a grid's dimensions in a snapshot's shape
/// ([`Manifest::shape`](crate::snapshot::Manifest::shape)) and in
/// [`Error::ShapeChanged`](crate::Error::ShapeChanged).
const HEIGHT: &str = "height (rows)";
const BANDS: &str = "bands";
const ROWS_PER_BAND: &str = "rows per band";
const WIDTH: &str = "width (cells per row)";
const ELEMENT_SIZE: &str = "element size (bytes)";

/// A grid's shape, recorded in every snapshot and checked on resume: its height, its bands
/// and rows per band as the chunking cuts them, its width and its element size.
fn shape<R: Rows>(job: &Banded<R>) -> Vec<crate::snapshot::Dimension> {
    let grid = &job.0;
    let height = grid.height();
    // As `Chunking::Count(bands)` cuts the rows.
    let per_band = height.div_ceil(grid.bands().max(1)).max(1);
    [
        (HEIGHT, height),
        (BANDS, height.div_ceil(per_band)),
        (ROWS_PER_BAND, per_band),
        (WIDTH, grid.width() as u64),
        (ELEMENT_SIZE, R::Element::SIZE as u64),
    ]
    .into_iter()
    .map(|(what, value)| crate::snapshot::Dimension {
        what: what.to_owned(),
        value,
    })
    .collect()
}

/// Whether a stored band fits the grid: its rows are those of its chunk in the plan, its
/// width the grid's. Only the band's first fields are decoded (its first row, end and
/// width: the order of [`BandRef`]), not its cells; bytes that do not decode are left to
/// the band's decoding, which reports them.
fn fits<R: Rows>(
    job: &Banded<R>,
    chunk: u64,
    range: Range<u64>,
    bytes: &[u8],
) -> Result<(), crate::job::Misfit> {
    let Ok((start, end, width)) =
        crate::codec::decode_prefix::<(u64, u64, u64)>("a chunk state", bytes)
    else {
        return Ok(());
    };
    let misfit = |what: String, written: u64, code: u64| {
        Err(crate::job::Misfit {
            what,
            written,
            code,
        })
    };
    let rows = end.saturating_sub(start);
    if rows != range.end - range.start {
        return misfit(
            format!("the rows of band {chunk}"),
            rows,
            range.end - range.start,
        );
    }
    if start != range.start {
        return misfit(format!("the first row of band {chunk}"), start, range.start);
    }
    let w = job.0.width() as u64;
    if width != w {
        return misfit(format!("the {WIDTH} of band {chunk}"), width, w);
    }
    Ok(())
}

/// One band of a [`Banded`] grid: its rows, the halos of the rows next to it, and its
/// progress in the current phase.
///
/// A snapshot holds only what the band still reads to finish its phase (see the
/// [module docs](self#snapshots)); decoding checks the lengths, and also reads the full form
/// that earlier builds wrote.
pub struct Band<R: Rows> {
    start: u64,
    end: u64,
    width: u64,
    /// The next row to update in this phase.
    next: u64,
    /// Rows `start..end`: the previous phase's values (rows below `next` hold this phase's
    /// for [`Sweep::InPlace`]).
    cur: Cells<R::Element>,
    /// [`Sweep::Jacobi`]: rows `start..next` as this phase computed them (the buffer is
    /// allocated at the first step of a phase and only its filled rows are serialized).
    /// [`Sweep::ThreeLevel`]: the same rows, then rows `next..end` as the phase before the
    /// previous one left them (the whole buffer is serialized).
    new: Cells<R::Element>,
    /// Row `start - 1` as the previous phase left it (empty at the top of the grid).
    before: Cells<R::Element>,
    /// Row `end` as the previous phase left it (empty at the bottom of the grid).
    after: Cells<R::Element>,
    acc: R::Acc,
    /// The rows and halos have not been initialized yet (the first phase's first step does).
    fresh: bool,
    /// Rows per step; not serialized (0 = start from one row).
    batch: u64,
    /// The phase the band's steps belong to ([`Window::phase`]); not serialized: the worker
    /// that steps the band says it ([`Chunk::running_in`]).
    phase: u64,
}

/// How a [`Band`] is serialized: its fields in this order, each holding only what the band
/// still reads to finish its phase exactly, so that a part is about the band's rows and no
/// more:
///
/// - `cur`: the rows from `max(next - 1, start)` to the end ([`Sweep::Jacobi`] in the middle
///   of a phase: the rows above `next - 1` were read for the last time, and are the buffer
///   the next phase writes into, whose content is unspecified), else all of them. A band that
///   finished its phase (`next == end`) holds its new rows in `cur`.
/// - `new`: [`Sweep::Jacobi`], rows `start..next` as this phase computed them (empty
///   once the phase is finished: the buffer then holds stale rows the next phase overwrites);
///   [`Sweep::ThreeLevel`], all of it (the older level is state); else empty.
/// - `before`: only while `next == start` (the first row still reads it); `after`: only
///   while `next < end`. A finished band's halos are replaced at the barrier by the ones its
///   neighbours export ([`Partition::begin_phase`]).
///
/// # Compatibility
///
/// The field order and types are those of earlier builds, which wrote `cur` whole, `new` up
/// to `next` even when finished, and both halos. [`BandData`] reads either: a `cur` shorter
/// than the band is its tail. So the snapshots of earlier builds still resume and
/// [`Rows::VERSION`] (the user's version of their grid, checked on resume and in the
/// handshake) and the manifest's format version do not change. An earlier build cannot read
/// a compact band, but it cannot join this build's cluster either (the handshake's protocol
/// version) and is not expected to resume a later build's snapshots.
#[derive(Serialize)]
#[serde(bound = "")]
struct BandRef<'a, R: Rows> {
    start: u64,
    end: u64,
    width: u64,
    next: u64,
    cur: CellSlice<'a, R::Element>,
    new: CellSlice<'a, R::Element>,
    before: CellSlice<'a, R::Element>,
    after: CellSlice<'a, R::Element>,
    acc: &'a R::Acc,
    fresh: bool,
}

impl<R: Rows> Serialize for Band<R> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let w = self.w();
        let finished = self.next >= self.end;
        let done = (self.next - self.start) as usize;
        let (cur_from, filled) = match R::SWEEP {
            Sweep::Jacobi if !finished && !self.fresh => {
                (done.saturating_sub(1) * w, (done * w).min(self.new.0.len()))
            }
            // Both levels are state: `cur` is the next phase's older level.
            Sweep::ThreeLevel => (0, self.new.0.len()),
            _ => (0, 0),
        };
        let none: &[R::Element] = &[];
        BandRef::<R> {
            start: self.start,
            end: self.end,
            width: self.width,
            next: self.next,
            cur: CellSlice(&self.cur.0[cur_from.min(self.cur.0.len())..]),
            new: CellSlice(&self.new.0[..filled]),
            before: CellSlice(if self.next == self.start {
                &self.before.0
            } else {
                none
            }),
            after: CellSlice(if finished { none } else { &self.after.0 }),
            acc: &self.acc,
            fresh: self.fresh,
        }
        .serialize(s)
    }
}

/// A [`Band`] as decoded, before its lengths are checked and its rows put back in place.
#[derive(Deserialize)]
#[serde(bound = "")]
struct BandData<R: Rows> {
    start: u64,
    end: u64,
    width: u64,
    next: u64,
    cur: Cells<R::Element>,
    new: Cells<R::Element>,
    before: Cells<R::Element>,
    after: Cells<R::Element>,
    acc: R::Acc,
    fresh: bool,
}

impl<'de, R: Rows> Deserialize<'de> for Band<R> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let b = BandData::<R>::deserialize(d)?;
        b.into_band().map_err(serde::de::Error::custom)
    }

    /// Decodes a band into `place`, reusing its buffers (a worker process decodes a
    /// restored band into the one it held before the rollback: the grid's pages are
    /// already mapped, where fresh ones fault in one by one, several times slower:
    /// `BENCHMARKS.md`, owned partitions). On an error `place` is left with
    /// buffers of unspecified content.
    fn deserialize_in_place<D: Deserializer<'de>>(d: D, place: &mut Self) -> Result<(), D::Error> {
        let take = |c: &mut Cells<R::Element>| std::mem::take(&mut c.0);
        let bufs = [
            take(&mut place.cur),
            take(&mut place.new),
            take(&mut place.before),
            take(&mut place.after),
        ];
        let b = d.deserialize_struct("BandData", BAND_FIELDS, BandInto::<R> { bufs })?;
        *place = b.into_band().map_err(serde::de::Error::custom)?;
        Ok(())
    }
}

/// The fields of [`BandData`], in order.
const BAND_FIELDS: &[&str] = &[
    "start", "end", "width", "next", "cur", "new", "before", "after", "acc", "fresh",
];

/// Decodes a [`BandData`] whose cells go into these buffers (`cur`, `new`, `before`,
/// `after`), as [`Band::deserialize_in_place`] does.
struct BandInto<R: Rows> {
    bufs: [Vec<R::Element>; 4],
}

impl<'de, R: Rows> Visitor<'de> for BandInto<R> {
    type Value = BandData<R>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a band")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<BandData<R>, A::Error> {
        use serde::de::Error as _;
        let [cur, new, before, after] = self.bufs;
        let short = |at: usize| A::Error::invalid_length(at, &"a band's 10 fields");
        Ok(BandData {
            start: seq.next_element()?.ok_or_else(|| short(0))?,
            end: seq.next_element()?.ok_or_else(|| short(1))?,
            width: seq.next_element()?.ok_or_else(|| short(2))?,
            next: seq.next_element()?.ok_or_else(|| short(3))?,
            cur: seq
                .next_element_seed(CellsVisitor(cur))?
                .ok_or_else(|| short(4))?,
            new: seq
                .next_element_seed(CellsVisitor(new))?
                .ok_or_else(|| short(5))?,
            before: seq
                .next_element_seed(CellsVisitor(before))?
                .ok_or_else(|| short(6))?,
            after: seq
                .next_element_seed(CellsVisitor(after))?
                .ok_or_else(|| short(7))?,
            acc: seq.next_element()?.ok_or_else(|| short(8))?,
            fresh: seq.next_element()?.ok_or_else(|| short(9))?,
        })
    }
}

impl<R: Rows> BandData<R> {
    /// The band, with `cur` grown back to the whole band if only its tail was written.
    fn into_band(self) -> Result<Band<R>, String> {
        let BandData {
            start,
            end,
            width,
            next,
            mut cur,
            new,
            before,
            after,
            acc,
            fresh,
        } = self;
        if start > end || !(start..=end).contains(&next) {
            return Err(format!("a band of rows {start}..{end} at row {next}"));
        }
        let rows = usize::try_from(end - start).map_err(|e| e.to_string())?;
        let w = usize::try_from(width).map_err(|e| e.to_string())?;
        let full = rows
            .checked_mul(w)
            .ok_or_else(|| format!("a band of {rows} rows of {w} cells"))?;
        let done = (next - start) as usize;
        // The first row the band still reads; the compact form starts there at the latest.
        let needed = if R::SWEEP == Sweep::Jacobi && next < end {
            done.saturating_sub(1) * w
        } else {
            0
        };
        let short = full.checked_sub(cur.0.len());
        let halo_ok = |h: &Cells<R::Element>| h.0.is_empty() || h.0.len() == w;
        // A three-level band holds its older level whole once it has been initialized.
        let levels_ok =
            R::SWEEP != Sweep::ThreeLevel || new.0.len() == if fresh { 0 } else { full };
        if short.is_none_or(|s| s > needed)
            || !levels_ok
            || new.0.len() > full
            || !halo_ok(&before)
            || !halo_ok(&after)
        {
            return Err(format!(
                "a band of {rows} rows of {w} cells at row {next} with {} + {} cells and halos \
                 of {} and {}",
                cur.0.len(),
                new.0.len(),
                before.0.len(),
                after.0.len()
            ));
        }
        if let Some(s @ 1..) = short {
            // The tail moves to the end of the band, in its own buffer when that holds it.
            let tail = cur.0.len();
            cur.0.resize(full, R::Element::default());
            cur.0.copy_within(0..tail, s);
            cur.0[..s].fill(R::Element::default());
        }
        Ok(Band {
            start,
            end,
            width,
            next,
            cur,
            new,
            before,
            after,
            acc,
            fresh,
            batch: 0,
            phase: 0,
        })
    }
}

impl<R: Rows> fmt::Debug for Band<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Band")
            .field("rows", &(self.start..self.end))
            .field("next", &self.next)
            .finish_non_exhaustive()
    }
}

impl<R: Rows> Band<R> {
    fn w(&self) -> usize {
        self.width as usize
    }

    /// Fills the rows and the neighbouring rows from [`Rows::init`].
    fn initialize(&mut self, grid: &R, input: &R::Input) {
        let w = self.w();
        for (k, row) in self.cur.0.chunks_exact_mut(w.max(1)).enumerate() {
            grid.init(input, self.start + k as u64, row);
        }
        if self.start > 0 {
            self.before.0 = vec![R::Element::default(); w];
            grid.init(input, self.start - 1, &mut self.before.0);
        }
        if self.end < grid.height() {
            self.after.0 = vec![R::Element::default(); w];
            grid.init(input, self.end, &mut self.after.0);
        }
        if R::SWEEP == Sweep::ThreeLevel {
            // Phase 0's older level is the initial grid.
            self.new.0.clone_from(&self.cur.0);
        }
        self.fresh = false;
    }

    /// Updates rows `self.next..stop`.
    fn sweep(&mut self, grid: &R, input: &R::Input, stop: u64) {
        let w = self.w();
        let (first, last) = (self.start, self.end - 1);
        let height = grid.height();
        let edge_above = |i: u64| i == 0;
        let edge_below = |i: u64| i + 1 == height;
        let phase = self.phase;
        let last_phase = grid.phases() == Some(phase.saturating_add(1));
        match R::SWEEP {
            Sweep::Jacobi | Sweep::ThreeLevel => {
                // Allocated once, or grown after a restore that stored only the filled rows.
                if self.new.0.len() != self.cur.0.len() {
                    self.new.0.resize(self.cur.0.len(), R::Element::default());
                }
                let cur = &self.cur.0;
                for i in self.next..stop {
                    let k = (i - first) as usize;
                    let above = if edge_above(i) {
                        None
                    } else if i == first {
                        Some(&self.before.0[..])
                    } else {
                        Some(&cur[(k - 1) * w..k * w])
                    };
                    let below = if edge_below(i) {
                        None
                    } else if i == last {
                        Some(&self.after.0[..])
                    } else {
                        Some(&cur[(k + 1) * w..(k + 2) * w])
                    };
                    let window = Window {
                        above,
                        old: &cur[k * w..(k + 1) * w],
                        row: &mut self.new.0[k * w..(k + 1) * w],
                        below,
                        phase,
                        last: last_phase,
                    };
                    grid.update(input, i, window, &mut self.acc);
                }
            }
            Sweep::InPlace => {
                for i in self.next..stop {
                    let k = (i - first) as usize;
                    let (head, tail) = self.cur.0.split_at_mut(k * w);
                    let (row, rest) = tail.split_at_mut(w);
                    let above = if edge_above(i) {
                        None
                    } else if i == first {
                        Some(&self.before.0[..])
                    } else {
                        Some(&head[(k - 1) * w..])
                    };
                    let below = if edge_below(i) {
                        None
                    } else if i == last {
                        Some(&self.after.0[..])
                    } else {
                        Some(&rest[..w])
                    };
                    let window = Window {
                        above,
                        old: &[],
                        row,
                        below,
                        phase,
                        last: last_phase,
                    };
                    grid.update(input, i, window, &mut self.acc);
                }
            }
        }
        self.next = stop;
    }

    /// Whether the band fits `grid`: its width is the grid's, it lies in the grid, and the
    /// neighbouring rows it still reads are rows of that width. A band that does not fit
    /// (restored under code with another grid shape) would hand `update` rows of the wrong
    /// length, or an empty neighbour.
    fn fits(&self, grid: &R) -> Result<(), String> {
        let (w, height) = (grid.width(), grid.height());
        // Named only in an error: this runs at every step, which allocates nothing.
        let rows = || format!("the band of rows {}..{}", self.start, self.end);
        if self.w() != w {
            return Err(format!(
                "{} holds rows of {} cells, the grid's width() is {w}: it was written \
                 with another grid shape",
                rows(),
                self.width
            ));
        }
        if self.end > height {
            return Err(format!(
                "{} lies outside the grid of height() {height}: it was written with \
                 another grid shape",
                rows()
            ));
        }
        let reads_before = self.start > 0 && self.next == self.start;
        let reads_after = self.end < height && self.next < self.end;
        for (reads, halo, which) in [
            (reads_before, &self.before, "above"),
            (reads_after, &self.after, "below"),
        ] {
            if reads && halo.0.len() != w {
                return Err(format!(
                    "{} of a grid of height() {height} has a row {which} it of {} cells \
                     where the width() is {w}: it was written with another grid shape",
                    rows(),
                    halo.0.len()
                ));
            }
        }
        Ok(())
    }

    /// Row `k` of the band (0-based) as this band's current values.
    fn row(&self, k: usize) -> Vec<R::Element> {
        let w = self.w();
        self.cur.0[k * w..(k + 1) * w].to_vec()
    }
}

impl<R: Rows> Chunk for Band<R> {
    type Job = Banded<R>;
    type Output = R::Acc;

    fn step(&mut self, job: &Banded<R>, input: &BandedInput<R>) -> Step<R::Acc> {
        let grid = &job.0;
        if self.fresh {
            self.initialize(grid, &input.0);
        }
        // A resume checks the grid's shape before anything runs (`Error::ShapeChanged`); this
        // is the last line: `update` is never handed a row of the wrong length.
        if let Err(e) = self.fits(grid) {
            panic!("{e}");
        }
        let batch = self.batch.max(1);
        let stop = self.end.min(self.next.saturating_add(batch));
        let t0 = Instant::now();
        self.sweep(grid, &input.0, stop);
        self.batch = adapt(batch, t0.elapsed(), grid.target_step());
        if self.next < self.end {
            return Step::Yield;
        }
        if R::SWEEP != Sweep::InPlace {
            std::mem::swap(&mut self.cur, &mut self.new);
        }
        Step::Done(std::mem::replace(&mut self.acc, grid.reducer().identity()))
    }

    fn iterations_done(&self) -> Option<u64> {
        Some(self.next - self.start)
    }

    fn running_in(&mut self, phase: u64) {
        self.phase = phase;
    }
}

/// A row a band exports for a neighbour: its first row for the band before, its last for the
/// band after.
#[derive(Serialize, Deserialize)]
#[serde(bound = "")]
pub struct Halo<E: Element>(Cells<E>);

impl<E: Element> fmt::Debug for Halo<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Halo({} elements)", self.0.0.len())
    }
}

impl<R: Rows> Partition for Band<R> {
    type Halo = Halo<R::Element>;

    fn export(&self, _job: &Banded<R>) -> (Self::Halo, Self::Halo) {
        let rows = (self.end - self.start) as usize;
        (
            Halo(Cells(self.row(0))),
            Halo(Cells(self.row(rows.saturating_sub(1)))),
        )
    }

    fn begin_phase(
        &mut self,
        _job: &Banded<R>,
        before: Option<Self::Halo>,
        after: Option<Self::Halo>,
    ) {
        if let Some(Halo(h)) = before {
            self.before = h;
        }
        if let Some(Halo(h)) = after {
            self.after = h;
        }
        self.next = self.start;
        // The worker that steps the band says its phase too (`running_in`); this keeps a band
        // stepped by hand, as the tests do, in step.
        self.phase += 1;
    }

    fn output_every(job: &Banded<R>) -> Option<u64> {
        job.0.output_every()
    }

    fn output(&self, job: &Banded<R>, input: &BandedInput<R>, phase: u64) -> Result<(), BoxError> {
        job.0.output(&input.0, phase, self.rows(), self.cells())
    }

    fn gather_at_end(job: &Banded<R>) -> bool {
        job.0.gather_at_end()
    }
}

impl<R: Rows> Band<R> {
    /// The rows of the grid this band holds.
    pub fn rows(&self) -> Range<u64> {
        self.start..self.end
    }

    /// The band's cells, row after row, as its last finished phase left them (what
    /// [`Rows::output`] is given; in the middle of a phase, a mix of two phases).
    pub fn cells(&self) -> &[R::Element] {
        &self.cur.0
    }
}

impl<R: Rows> crate::Finished<Banded<R>> {
    /// The whole grid as the last phase left it, row after row (`height() * width()`
    /// cells), when the grid asked for it ([`Rows::gather_at_end`]); `None` otherwise. The
    /// same bits for any worker count.
    pub fn field(&self) -> Option<Vec<R::Element>> {
        let bands = self.partitions()?;
        let mut field = Vec::with_capacity(bands.iter().map(|b| b.cells().len()).sum());
        for b in bands {
            field.extend_from_slice(b.cells());
        }
        Some(field)
    }
}

/// Cells stored as one block of little-endian bytes.
struct Cells<E>(Vec<E>);

impl<E: Element> Serialize for Cells<E> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        CellSlice(&self.0).serialize(s)
    }
}

/// Borrowed cells, serialized as [`Cells`].
struct CellSlice<'a, E>(&'a [E]);

impl<E: Element> Serialize for CellSlice<'_, E> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // The cells' own memory when it is the form written: a band's part is then one copy
        // of its rows into the part (a buffer in between made it two, and twice the fresh
        // pages a snapshot touches).
        if let Some(bytes) = E::le_bytes(self.0) {
            return s.serialize_bytes(bytes);
        }
        let mut bytes = vec![0u8; self.0.len() * E::SIZE];
        E::to_le(self.0, &mut bytes);
        s.serialize_bytes(&bytes)
    }
}

impl<'de, E: Element> Deserialize<'de> for Cells<E> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_bytes(CellsVisitor(Vec::new()))
    }
}

/// Decodes cells into a buffer: one whose capacity holds them is reused (its memory is
/// already mapped: a restored band decoded into the one it replaces touches no fresh page),
/// else a new one is made.
struct CellsVisitor<E>(Vec<E>);

impl<'de, E: Element> serde::de::DeserializeSeed<'de> for CellsVisitor<E> {
    type Value = Cells<E>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Cells<E>, D::Error> {
        d.deserialize_bytes(self)
    }
}

impl<E: Element> Visitor<'_> for CellsVisitor<E> {
    type Value = Cells<E>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a multiple of {} bytes", E::SIZE)
    }

    fn visit_bytes<Er: serde::de::Error>(self, v: &[u8]) -> Result<Cells<E>, Er> {
        if E::SIZE == 0 || v.len() % E::SIZE != 0 {
            return Err(Er::invalid_length(v.len(), &self));
        }
        let n = v.len() / E::SIZE;
        let mut cells = self.0;
        if cells.capacity() >= n {
            cells.clear();
            cells.resize(n, E::default());
        } else {
            // A fresh buffer of zero pages (`calloc`): the copy below is its first touch.
            cells = vec![E::default(); n];
        }
        match E::le_bytes_mut(&mut cells) {
            Some(bytes) => bytes.copy_from_slice(v),
            None => E::from_le(v, &mut cells),
        }
        Ok(Cells(cells))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reduce::Max;

    /// A small Jacobi or in-place heat grid with a hot top edge.
    #[derive(Serialize, Deserialize)]
    struct Bar<const IN_PLACE: bool> {
        n: u64,
        w: usize,
    }

    impl<const IN_PLACE: bool> Rows for Bar<IN_PLACE> {
        const NAME: &'static str = "bar";
        const SWEEP: Sweep = if IN_PLACE {
            Sweep::InPlace
        } else {
            Sweep::Jacobi
        };
        type Element = f64;
        type Acc = f64;
        type Reducer = Max<f64>;
        type Input = ();
        fn height(&self) -> u64 {
            self.n
        }
        fn width(&self) -> usize {
            self.w
        }
        fn bands(&self) -> u64 {
            4
        }
        fn reducer(&self) -> Max<f64> {
            Max::new()
        }
        fn init(&self, _: &(), i: u64, row: &mut [f64]) {
            for (j, x) in row.iter_mut().enumerate() {
                *x = if i == 0 {
                    100.0
                } else {
                    (i * 7 + j as u64 % 5) as f64
                };
            }
        }
        fn update(&self, _: &(), _: u64, win: Window<'_, f64>, change: &mut f64) {
            let old: Vec<f64> = if IN_PLACE {
                win.row.to_vec()
            } else {
                win.old.to_vec()
            };
            match (win.above, win.below) {
                (Some(a), Some(b)) => {
                    for j in 0..old.len() {
                        win.row[j] = 0.25 * (a[j] + b[j]) + 0.5 * old[j];
                        *change = change.max((win.row[j] - old[j]).abs());
                    }
                }
                _ => win.row.copy_from_slice(&old),
            }
        }
    }

    /// A band's encoding, then the band decoded from it into the buffers of another
    /// (`Band::deserialize_in_place`, as a worker process decodes a restored band into the
    /// one it held): the same band as decoded anew, whatever the other held.
    fn round_trip<R: Rows>(band: &Band<R>) -> (usize, Band<R>) {
        let bytes = crate::codec::encode("a chunk state", band).expect("encodes");
        let back: Band<R> = crate::codec::decode("a chunk state", &bytes).expect("decodes");
        // Another band's buffers: longer, shorter, stale.
        let mut into: Band<R> = crate::codec::decode("a chunk state", &bytes).expect("decodes");
        into.cur
            .0
            .resize(into.cur.0.len() + 17, R::Element::default());
        into.new.0 = vec![R::Element::default(); 5];
        into.before.0.clear();
        into.after.0.resize(3, R::Element::default());
        into.next = into.end;
        crate::codec::decode_into("a chunk state", &bytes, &mut into).expect("decodes");
        let again = crate::codec::encode("a chunk state", &into).expect("encodes");
        assert_eq!(again, bytes, "decoded in place, the band encodes the same");
        assert_eq!(into.cur.0.len(), back.cur.0.len());
        assert_eq!(into.new.0.len(), back.new.0.len());
        assert_eq!(into.before.0.len(), back.before.0.len());
        assert_eq!(into.after.0.len(), back.after.0.len());
        (bytes.len(), into)
    }

    /// Steps `band` to the end of its phase; its output.
    fn finish<R: Rows>(band: &mut Band<R>, job: &Banded<R>, input: &BandedInput<R>) -> R::Acc {
        loop {
            if let Step::Done(acc) = band.step(job, input) {
                return acc;
            }
        }
    }

    /// In every state (fresh, in the middle of a phase, finished, at the barrier), a band's
    /// part is its rows' bytes, the halos it still reads and a few bytes more, and the band
    /// decoded from it finishes its phase with the same bits as the band itself.
    fn states<const IN_PLACE: bool>() {
        let (n, w) = (64u64, 40usize);
        let job = Banded(Bar::<IN_PLACE> { n, w });
        let input = BandedInput(());
        let row = w * 8;
        // An interior band: both halos exist.
        let range = 16..32;
        let rows = (range.end - range.start) as usize;
        let band_bytes = rows * row;
        let overhead = 64;

        let band = job.chunk(range.clone());
        let (size, _) = round_trip(&band);
        assert!(size <= band_bytes + overhead, "fresh: {size}");

        for phase in 0..3 {
            // Mid-phase, at every row: rows + the row above `next` + the halo below.
            for stop in 1..rows as u64 {
                let mut a = job.chunk(range.clone());
                for _ in 0..phase {
                    finish(&mut a, &job, &input);
                    let (up, down) = halos(&job, &a);
                    a.begin_phase(&job, Some(up), Some(down));
                }
                if a.fresh {
                    a.initialize(&job.0, &());
                }
                a.sweep(&job.0, &(), range.start + stop);
                let (size, mut back) = round_trip(&a);
                let extra = if IN_PLACE { 1 } else { 2 };
                assert!(
                    size <= band_bytes + extra * row + overhead,
                    "phase {phase}, row {stop}: {size} bytes for {band_bytes}"
                );
                let want = finish(&mut a, &job, &input);
                let got = finish(&mut back, &job, &input);
                assert_eq!(want.to_bits(), got.to_bits());
                assert_eq!(
                    bits(&a.cur.0),
                    bits(&back.cur.0),
                    "phase {phase}, row {stop}"
                );
            }
        }

        // Finished, waiting for the barrier: the new rows only, no stale buffer, no halo.
        let mut band = job.chunk(range.clone());
        finish(&mut band, &job, &input);
        let (size, mut back) = round_trip(&band);
        assert!(
            size <= band_bytes + overhead,
            "finished: {size} for {band_bytes}"
        );
        // At the barrier: the halos come from the neighbours; the next phase is the same.
        for b in [&mut band, &mut back] {
            let (up, down) = halos(&job, b);
            b.begin_phase(&job, Some(up), Some(down));
        }
        let (size, mut again) = round_trip(&band);
        assert!(
            size <= band_bytes + 2 * row + overhead,
            "at the barrier: {size}"
        );
        let want = finish(&mut band, &job, &input);
        assert_eq!(want.to_bits(), finish(&mut back, &job, &input).to_bits());
        assert_eq!(want.to_bits(), finish(&mut again, &job, &input).to_bits());
        assert_eq!(bits(&band.cur.0), bits(&back.cur.0));
        assert_eq!(bits(&band.cur.0), bits(&again.cur.0));
    }

    /// Halos for a band as if its neighbours had exported its own edge rows: enough to give
    /// two copies of a band the same next phase.
    fn halos<R: Rows>(job: &Banded<R>, band: &Band<R>) -> (Halo<R::Element>, Halo<R::Element>) {
        band.export(job)
    }

    fn bits(v: &[f64]) -> Vec<u64> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// The full form earlier builds wrote: `cur` whole, `new` up to `next` (all of it once
    /// finished), both halos.
    fn full_form<R: Rows>(band: &Band<R>) -> Vec<u8> {
        let filled = match R::SWEEP {
            Sweep::Jacobi if !band.new.0.is_empty() => (band.next - band.start) as usize * band.w(),
            _ => 0,
        };
        let full = BandRef::<R> {
            start: band.start,
            end: band.end,
            width: band.width,
            next: band.next,
            cur: CellSlice(&band.cur.0),
            new: CellSlice(&band.new.0[..filled]),
            before: CellSlice(&band.before.0),
            after: CellSlice(&band.after.0),
            acc: &band.acc,
            fresh: band.fresh,
        };
        crate::codec::encode("a chunk state", &full).expect("encodes")
    }

    /// A band in the full form of earlier builds, in the middle of a phase and finished,
    /// still decodes and goes on with the same bits.
    #[test]
    fn the_full_form_of_earlier_builds_still_resumes() {
        let job = Banded(Bar::<false> { n: 64, w: 40 });
        let input = BandedInput(());
        let mut band = job.chunk(16..32);
        band.initialize(&job.0, &());
        band.sweep(&job.0, &(), 23);
        let mut back: Band<Bar<false>> =
            crate::codec::decode("a chunk state", &full_form(&band)).expect("decodes");
        let want = finish(&mut band, &job, &input);
        assert_eq!(want.to_bits(), finish(&mut back, &job, &input).to_bits());
        assert_eq!(bits(&band.cur.0), bits(&back.cur.0));
        // Finished: the stale second buffer was written too.
        let bytes = full_form(&band);
        assert!(bytes.len() > 2 * 16 * 40 * 8);
        let mut back: Band<Bar<false>> =
            crate::codec::decode("a chunk state", &bytes).expect("decodes");
        for b in [&mut band, &mut back] {
            let (up, down) = halos(&job, b);
            b.begin_phase(&job, Some(up), Some(down));
        }
        let want = finish(&mut band, &job, &input);
        assert_eq!(want.to_bits(), finish(&mut back, &job, &input).to_bits());
        assert_eq!(bits(&band.cur.0), bits(&back.cur.0));
    }

    /// A part whose lengths do not fit its band is an error, not a panic later.
    #[test]
    fn a_band_with_wrong_lengths_does_not_decode() {
        let job = Banded(Bar::<false> { n: 64, w: 40 });
        let mut band = job.chunk(16..32);
        band.initialize(&job.0, &());
        band.sweep(&job.0, &(), 23);
        band.cur.0.truncate(40 * 3); // fewer rows than the band still reads
        let bytes = full_form(&band);
        assert!(crate::codec::decode::<Band<Bar<false>>>("a chunk state", &bytes).is_err());
    }

    /// `Bar` with another height or width in its code, as a program changed since the
    /// snapshot: the same job value, the same `NAME`.
    #[derive(Serialize, Deserialize)]
    struct Changed {
        n: u64,
        w: usize,
    }

    impl Rows for Changed {
        const NAME: &'static str = "bar";
        type Element = f64;
        type Acc = f64;
        type Reducer = Max<f64>;
        type Input = ();
        fn height(&self) -> u64 {
            self.n
        }
        fn width(&self) -> usize {
            self.w
        }
        fn bands(&self) -> u64 {
            4
        }
        fn reducer(&self) -> Max<f64> {
            Max::new()
        }
        fn init(&self, _: &(), _: u64, row: &mut [f64]) {
            row.fill(1.0);
        }
        fn update(&self, _: &(), i: u64, win: Window<'_, f64>, _: &mut f64) {
            panic!("update of row {i} called with a band of another shape: {win:?}");
        }
    }

    /// A band of `Bar` (64 rows of 40 cells) decoded under `Changed` code.
    fn decoded_as_changed(range: Range<u64>, stop: u64) -> (Vec<u8>, Band<Changed>) {
        let job = Banded(Bar::<false> { n: 64, w: 40 });
        let mut band = job.chunk(range);
        band.initialize(&job.0, &());
        band.sweep(&job.0, &(), stop);
        let bytes = crate::codec::encode("a chunk state", &band).unwrap();
        let back = crate::codec::decode("a chunk state", &bytes).unwrap();
        (bytes, back)
    }

    /// The step's message when a band does not fit the grid, which it says instead of
    /// calling `update` with rows of the wrong length.
    fn refused(band: &mut Band<Changed>, job: &Banded<Changed>) -> String {
        let input = BandedInput(());
        let caught =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| band.step(job, &input)));
        let payload = caught.expect_err("a band that does not fit is never stepped");
        crate::error::panic_message(payload.as_ref())
    }

    #[test]
    fn a_band_of_another_shape_never_reaches_update() {
        // 8 columns more: `update` would read rows of 40 cells as rows of 48.
        let (_, mut band) = decoded_as_changed(16..32, 20);
        let text = refused(&mut band, &Banded(Changed { n: 64, w: 48 }));
        assert!(
            text.contains("rows of 40 cells") && text.contains("width() is 48"),
            "{text}"
        );
        // 8 rows more: the last band's row below would be empty.
        let (_, mut band) = decoded_as_changed(48..64, 50);
        let text = refused(&mut band, &Banded(Changed { n: 72, w: 40 }));
        assert!(text.contains("row below it of 0 cells"), "{text}");
        // 8 rows fewer: the band lies outside the grid.
        let (_, mut band) = decoded_as_changed(48..64, 50);
        let text = refused(&mut band, &Banded(Changed { n: 56, w: 40 }));
        assert!(text.contains("outside the grid of height() 56"), "{text}");
    }

    /// The check a resume makes of a stored band before anything runs: its rows are its
    /// chunk's and its width the grid's, read from its first fields only.
    #[test]
    fn a_stored_band_is_checked_against_its_chunk_and_the_grid() {
        use crate::job::Misfit;
        let (bytes, _) = decoded_as_changed(16..32, 20);
        let job = Banded(Changed { n: 64, w: 40 });
        assert_eq!(fits(&job, 1, 16..32, &bytes), Ok(()));
        let misfit = |what: &str, written, code| {
            Err(Misfit {
                what: what.to_owned(),
                written,
                code,
            })
        };
        assert_eq!(
            fits(&Banded(Changed { n: 64, w: 48 }), 1, 16..32, &bytes),
            misfit("the width (cells per row) of band 1", 40, 48)
        );
        assert_eq!(
            fits(&job, 1, 18..36, &bytes),
            misfit("the rows of band 1", 16, 18)
        );
        assert_eq!(
            fits(&job, 1, 17..33, &bytes),
            misfit("the first row of band 1", 16, 17)
        );
        // Bytes that do not decode are left to the band's decoding, which reports them.
        assert_eq!(fits(&job, 1, 16..32, &[0xff]), Ok(()));
        // The shape a snapshot records.
        let shape: Vec<(String, u64)> = shape(&Banded(Changed { n: 62, w: 40 }))
            .into_iter()
            .map(|d| (d.what, d.value))
            .collect();
        let want = [
            (HEIGHT, 62),
            (BANDS, 4),
            (ROWS_PER_BAND, 16),
            (WIDTH, 40),
            (ELEMENT_SIZE, 8),
        ]
        .map(|(w, v)| (w.to_owned(), v));
        assert_eq!(shape, want);
    }

    /// A three-level [`Bar`]: the older level on entry of `row` is part of the update.
    #[derive(Serialize, Deserialize)]
    struct Leap(Bar<false>);

    impl Rows for Leap {
        const NAME: &'static str = "leap";
        const SWEEP: Sweep = Sweep::ThreeLevel;
        type Element = f64;
        type Acc = f64;
        type Reducer = Max<f64>;
        type Input = ();
        fn height(&self) -> u64 {
            self.0.n
        }
        fn width(&self) -> usize {
            self.0.w
        }
        fn reducer(&self) -> Max<f64> {
            Max::new()
        }
        fn init(&self, _: &(), i: u64, row: &mut [f64]) {
            self.0.init(&(), i, row);
        }
        fn update(&self, _: &(), _: u64, win: Window<'_, f64>, acc: &mut f64) {
            if let (Some(a), Some(b)) = (win.above, win.below) {
                for j in 0..win.row.len() {
                    let older = win.row[j];
                    win.row[j] = 0.5 * (a[j] + b[j]) - 0.25 * older + win.phase as f64;
                    *acc = acc.max(win.row[j]);
                }
            } else {
                win.row.copy_from_slice(win.old);
            }
        }
    }

    /// A three-level band in the middle of a phase, at every row, and at the barrier: its
    /// part holds both levels, and the band decoded from it goes on with the same bits; the
    /// phase counts on with `begin_phase` and comes from `running_in`.
    #[test]
    fn three_level_band_parts_hold_both_levels() {
        let (n, w) = (64u64, 40usize);
        let job = Banded(Leap(Bar { n, w }));
        let input = BandedInput(());
        let range = 16..32;
        let rows = (range.end - range.start) as usize;
        for phase in 0..3u64 {
            for stop in 1..rows as u64 {
                let mut a = job.chunk(range.clone());
                for _ in 0..phase {
                    finish(&mut a, &job, &input);
                    let (up, down) = halos(&job, &a);
                    a.begin_phase(&job, Some(up), Some(down));
                }
                assert_eq!(a.phase, phase);
                a.initialize(&job.0, &());
                a.sweep(&job.0, &(), range.start + stop);
                let (size, mut back) = round_trip(&a);
                assert!(size >= 2 * rows * w * 8, "both levels: {size} bytes");
                back.running_in(phase);
                let want = finish(&mut a, &job, &input);
                assert_eq!(want.to_bits(), finish(&mut back, &job, &input).to_bits());
                assert_eq!(
                    bits(&a.cur.0),
                    bits(&back.cur.0),
                    "phase {phase}, row {stop}"
                );
                // The next phase reads the older level the part carried.
                for b in [&mut a, &mut back] {
                    let (up, down) = halos(&job, b);
                    b.begin_phase(&job, Some(up), Some(down));
                }
                let want = finish(&mut a, &job, &input);
                assert_eq!(want.to_bits(), finish(&mut back, &job, &input).to_bits());
                assert_eq!(
                    bits(&a.cur.0),
                    bits(&back.cur.0),
                    "phase {phase}, row {stop}"
                );
            }
        }
    }

    #[test]
    fn jacobi_band_parts_hold_only_what_matters() {
        states::<false>();
    }

    #[test]
    fn in_place_band_parts_hold_only_what_matters() {
        states::<true>();
    }

    /// Cells written from their own memory are the bytes `to_le` writes, and read back
    /// through `le_bytes_mut` they are the same cells, for primitives and arrays of them.
    #[test]
    fn cells_in_their_own_memory_are_their_little_endian_form() {
        fn both<E: Element + PartialEq + fmt::Debug>(cells: Vec<E>) {
            let direct = postcard::to_allocvec(&CellSlice(&cells)).unwrap();
            let mut through = vec![0u8; cells.len() * E::SIZE];
            E::to_le(&cells, &mut through);
            let through = postcard::to_allocvec(serde_bytes::Bytes::new(&through)).unwrap();
            assert_eq!(direct, through);
            let back: Cells<E> = postcard::from_bytes(&direct).unwrap();
            assert_eq!(back.0, cells);
            let mut slow = vec![E::default(); cells.len()];
            E::from_le(&direct[direct.len() - cells.len() * E::SIZE..], &mut slow);
            assert_eq!(slow, cells);
        }
        both(
            (0..1000)
                .map(|i| f64::from(i) * -0.37)
                .collect::<Vec<f64>>(),
        );
        both(
            (0..333)
                .map(|i| [i as f32 * 0.5; 9])
                .collect::<Vec<[f32; 9]>>(),
        );
        both(
            (0..77u16)
                .map(|i| i.wrapping_mul(997))
                .collect::<Vec<u16>>(),
        );
        assert!(f64::le_bytes(&[1.0]).is_some() == cfg!(target_endian = "little"));
    }
}
