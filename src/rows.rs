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
//!
//! # Step length
//!
//! A step updates a batch of rows whose size adapts to about [`Rows::target_step`], as
//! [`Fold`](crate::Fold) does for iterations.
//!
//! # Snapshots
//!
//! A band is serialized as its cells' little-endian bytes in one block ([`Element`]), so a
//! snapshot of a grid costs about a copy of it, and restores on any architecture.

use std::fmt;
use std::marker::PhantomData;
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
    /// As [`Job::phases`]: how many phases (sweeps) the job runs in all, when it knows.
    fn phases(&self) -> Option<u64> {
        None
    }
    /// The step length the batch of rows adapts to (default [`DEFAULT_STEP`]).
    fn target_step(&self) -> Duration {
        DEFAULT_STEP
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
}

/// What [`Rows::update`] reads and writes for one row (see [`Sweep`]).
#[derive(Debug)]
pub struct Window<'a, E> {
    /// Row `i - 1`; `None` for the first row of the grid.
    pub above: Option<&'a [E]>,
    /// Row `i` as the previous phase left it ([`Sweep::Jacobi`]); empty for
    /// [`Sweep::InPlace`].
    pub old: &'a [E],
    /// Row `i`, to write.
    pub row: &'a mut [E],
    /// Row `i + 1`; `None` for the last row of the grid.
    pub below: Option<&'a [E]>,
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
    const OWNERSHIP: Ownership<Self> = Ownership::PARTITIONS;
    type Chunk = Band<R>;
    type Reducer = R::Reducer;
    type Input = BandedInput<R>;

    fn iterations(&self) -> u64 {
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
        }
    }

    fn reducer(&self) -> R::Reducer {
        self.0.reducer()
    }

    fn end_phase(&mut self, value: &R::Acc) -> Next {
        self.0.end_phase(value)
    }

    fn phases(&self) -> Option<u64> {
        self.0.phases()
    }
}

/// One band of a [`Banded`] grid: its rows, the halos of the rows next to it, and its
/// progress in the current phase.
#[derive(Deserialize)]
#[serde(bound = "")]
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
    new: Cells<R::Element>,
    /// Row `start - 1` as the previous phase left it (empty at the top of the grid).
    before: Cells<R::Element>,
    /// Row `end` as the previous phase left it (empty at the bottom of the grid).
    after: Cells<R::Element>,
    acc: R::Acc,
    /// The rows and halos have not been initialized yet (the first phase's first step does).
    fresh: bool,
    /// Rows per step; not serialized (0 = start from one row).
    #[serde(skip)]
    batch: u64,
}

/// How a [`Band`] is serialized: as its fields, except that only the rows of `new` this phase
/// has filled are written.
#[derive(Serialize)]
#[serde(bound = "")]
struct BandRef<'a, R: Rows> {
    start: u64,
    end: u64,
    width: u64,
    next: u64,
    cur: &'a Cells<R::Element>,
    new: CellSlice<'a, R::Element>,
    before: &'a Cells<R::Element>,
    after: &'a Cells<R::Element>,
    acc: &'a R::Acc,
    fresh: bool,
}

impl<R: Rows> Serialize for Band<R> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let filled = match R::SWEEP {
            Sweep::Jacobi if !self.new.0.is_empty() => (self.next - self.start) as usize * self.w(),
            _ => 0,
        };
        BandRef::<R> {
            start: self.start,
            end: self.end,
            width: self.width,
            next: self.next,
            cur: &self.cur,
            new: CellSlice(&self.new.0[..filled]),
            before: &self.before,
            after: &self.after,
            acc: &self.acc,
            fresh: self.fresh,
        }
        .serialize(s)
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
        self.fresh = false;
    }

    /// Updates rows `self.next..stop`.
    fn sweep(&mut self, grid: &R, input: &R::Input, stop: u64) {
        let w = self.w();
        let (first, last) = (self.start, self.end - 1);
        let height = grid.height();
        let edge_above = |i: u64| i == 0;
        let edge_below = |i: u64| i + 1 == height;
        match R::SWEEP {
            Sweep::Jacobi => {
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
                    };
                    grid.update(input, i, window, &mut self.acc);
                }
            }
        }
        self.next = stop;
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
        let batch = self.batch.max(1);
        let stop = self.end.min(self.next.saturating_add(batch));
        let t0 = Instant::now();
        self.sweep(grid, &input.0, stop);
        self.batch = adapt(batch, t0.elapsed(), grid.target_step());
        if self.next < self.end {
            return Step::Yield;
        }
        if R::SWEEP == Sweep::Jacobi {
            std::mem::swap(&mut self.cur, &mut self.new);
        }
        Step::Done(std::mem::replace(&mut self.acc, grid.reducer().identity()))
    }

    fn iterations_done(&self) -> Option<u64> {
        Some(self.next - self.start)
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
        let mut bytes = vec![0u8; self.0.len() * E::SIZE];
        E::to_le(self.0, &mut bytes);
        s.serialize_bytes(&bytes)
    }
}

impl<'de, E: Element> Deserialize<'de> for Cells<E> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_bytes(CellsVisitor(PhantomData))
    }
}

struct CellsVisitor<E>(PhantomData<E>);

impl<E: Element> Visitor<'_> for CellsVisitor<E> {
    type Value = Cells<E>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a multiple of {} bytes", E::SIZE)
    }

    fn visit_bytes<Er: serde::de::Error>(self, v: &[u8]) -> Result<Cells<E>, Er> {
        if E::SIZE == 0 || v.len() % E::SIZE != 0 {
            return Err(Er::invalid_length(v.len(), &self));
        }
        let mut cells = vec![E::default(); v.len() / E::SIZE];
        E::from_le(v, &mut cells);
        Ok(Cells(cells))
    }
}
