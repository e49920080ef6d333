//! Owned partitions that exchange pieces with any partitions: any neighbour graph, and the
//! collectives of seed 002's runtime (allgather, all-to-all) at phase boundaries.
//!
//! [`Partition`](crate::Partition) is the chain: a band of rows exchanges halos with the band
//! before and the band after. [`Exchange`] is the general form, and the executor carries
//! both the same way: at the end of a phase every partition exports *pieces* addressed to
//! partitions (or, in an allgather, to all of them), and before its next phase every
//! partition receives the pieces addressed to it, ordered by the sender's chunk, so what a
//! partition computes never depends on which worker ran what, or when a piece arrived.
//!
//! # Choosing what crosses a barrier
//!
//! [`Exchange::pattern`] is asked after every phase (as seed 002's runtime chooses per
//! communication point, its section 3.3.3):
//!
//! | [`Pattern`] | a partition exports | a partition receives |
//! |---|---|---|
//! | [`Nothing`](Pattern::Nothing) | nothing | nothing |
//! | [`Neighbours`](Pattern::Neighbours) | one piece per neighbour | one from each neighbour |
//! | [`Allgather`](Pattern::Allgather) | one piece | every partition's, its own included |
//! | [`AllToAll`](Pattern::AllToAll) | one piece per partition | one from every partition |
//!
//! A 3-D stencil cut in pencils declares the face neighbours of each pencil
//! ([`Blocks`](crate::Blocks) computes them) and exchanges faces; conjugate gradient gathers
//! the search direction every iteration; an FFT on a distributed grid transposes it with an
//! all-to-all.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::job::{BoxError, Chunk, Job};

/// What crosses the barrier between two phases of a job whose partitions implement
/// [`Exchange`] (see [the module](crate::exchange)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Pattern {
    /// Nothing: the next phase begins with no pieces.
    Nothing,
    /// Each partition exports a piece for each of its neighbours ([`Exchange::neighbours`])
    /// and receives one from each: halos.
    Neighbours,
    /// Each partition exports one piece (`export(job, None)`) and every partition receives
    /// every partition's piece, its own included, in chunk order.
    Allgather,
    /// Each partition exports one piece for every partition, itself included (`export(job,
    /// Some(j))` for each chunk `j`), and partition `j` receives piece `j` of every
    /// partition, in chunk order: a transpose.
    AllToAll,
}

/// An owned partition that exchanges pieces with any partitions at phase boundaries: the
/// general form of [`Partition`](crate::Partition).
///
/// A job declares it with [`Job::OWNERSHIP`] = [`Ownership::EXCHANGES`](crate::Ownership)
/// and implements this trait for its chunk. Everything [`Partition`](crate::Partition) says
/// holds: the chunk is made once, lives for the whole job on the worker that holds it, its
/// boundaries are fixed, snapshots store it and moves carry it as bytes. What differs is
/// what crosses the barrier: [`Exchange::pattern`] chooses it per phase, and pieces are
/// addressed to chunks.
///
/// # Determinism
///
/// [`Exchange::begin_phase`] sees the pieces addressed to its partition ordered by the
/// sender's chunk, whatever the workers and whenever the pieces arrived; with the reductions'
/// fixed order the job's value is the same bits on any number of workers.
///
/// # Example
///
/// A ring of partitions that each pass their sum to both neighbours:
///
/// ```
/// use malleable::{Chunk, Exchange, Executor, Job, Ownership, Pieces, Step, reduce::Sum};
/// use serde::{Deserialize, Serialize};
/// use std::ops::Range;
///
/// #[derive(Serialize, Deserialize)]
/// struct Ring { parts: u64, phases: u64 }
///
/// #[derive(Serialize, Deserialize)]
/// struct Part { me: u64, value: u64, done: bool }
///
/// impl Job for Ring {
///     const NAME: &'static str = "ring";
///     const OWNERSHIP: Ownership<Self> = Ownership::EXCHANGES;
///     type Chunk = Part;
///     type Reducer = Sum<u64>;
///     type Input = ();
///     fn iterations(&self) -> u64 { self.parts }
///     fn chunking(&self) -> Option<malleable::Chunking> { Some(malleable::Chunking::Size(1)) }
///     fn chunk(&self, r: Range<u64>) -> Part { Part { me: r.start, value: r.start, done: false } }
///     fn reducer(&self) -> Sum<u64> { Sum::new() }
///     fn phases(&self) -> Option<u64> { Some(self.phases) }
///     fn end_phase(&mut self, _: &u64) -> malleable::Next {
///         self.phases -= 1;
///         if self.phases == 0 { malleable::Next::Finish } else { malleable::Next::Continue }
///     }
/// }
///
/// impl Chunk for Part {
///     type Job = Ring;
///     type Output = u64;
///     fn step(&mut self, _: &Ring, _: &()) -> Step<u64> {
///         self.done = true;
///         Step::Done(self.value)
///     }
/// }
///
/// impl Exchange for Part {
///     type Piece = u64;
///     fn neighbours(_: &Ring, chunk: u64, chunks: u64) -> Vec<u64> {
///         let mut n = vec![(chunk + chunks - 1) % chunks, (chunk + 1) % chunks];
///         n.sort();
///         n.dedup();
///         n.retain(|&c| c != chunk);
///         n
///     }
///     fn export(&self, _: &Ring, _to: Option<u64>) -> u64 { self.value }
///     fn begin_phase(&mut self, _: &Ring, pieces: Pieces<'_, u64>) {
///         self.value = pieces.iter().map(|(_, v)| *v).sum::<u64>() % 1_000_003;
///         self.done = false;
///     }
/// }
///
/// let exec = Executor::builder().local_workers(2).build()?;
/// let done = exec.run(Ring { parts: 5, phases: 3 })?;
/// // Each phase every value becomes the sum of its two neighbours' (the total doubles).
/// assert_eq!(done.value, 4 * (0 + 1 + 2 + 3 + 4));
/// # Ok::<(), malleable::Error>(())
/// ```
pub trait Exchange: Chunk {
    /// What a partition exports at the end of a phase for another (a face of a block, a
    /// slice of a vector, a block of a matrix to transpose). `Sync`: in an allgather one
    /// piece is read by every partition of a process, without copies.
    type Piece: Serialize + DeserializeOwned + Send + Sync + 'static;

    /// The partitions chunk `chunk` of `chunks` exchanges pieces with in a
    /// [`Pattern::Neighbours`] phase: asked once for every chunk when a run starts (with the
    /// job as submitted or restored), on the coordinator and on each worker process. The
    /// relation must be symmetric (if `b` is a neighbour of `a`, `a` is one of `b`), name
    /// only chunks below `chunks`, not `chunk` itself, each once: a graph that is not is
    /// refused before anything runs ([`Error::Neighbours`](crate::Error::Neighbours)). The
    /// order does not matter: pieces are always delivered in chunk order. It must not depend
    /// on what [`Job::end_phase`] changes.
    fn neighbours(job: &Self::Job, chunk: u64, chunks: u64) -> Vec<u64>;

    /// What crosses the barrier after phase `phase` (default: [`Pattern::Neighbours`]),
    /// asked on the worker with the job as it ran `phase`. It must give the same answer
    /// wherever it is asked for the same job value and phase.
    fn pattern(job: &Self::Job, phase: u64) -> Pattern {
        let _ = (job, phase);
        Pattern::Neighbours
    }

    /// Called on the worker right after the step that returned [`Step::Done`]: the piece for
    /// partition `to` (`Some(chunk)`: a neighbour, or in an all-to-all every partition in
    /// turn, this one included), or in an allgather the one piece for all (`None`).
    ///
    /// [`Step::Done`]: crate::Step::Done
    fn export(&self, job: &Self::Job, to: Option<u64>) -> Self::Piece;

    /// Called before the chunk's first step of every phase after the first, with the job as
    /// [`Job::end_phase`] left it and the pieces addressed to this partition, in the
    /// senders' chunk order. It should take the pieces in and rewind the chunk's progress to
    /// the start of its range.
    fn begin_phase(&mut self, job: &Self::Job, pieces: Pieces<'_, Self::Piece>);

    /// As [`Partition::output_every`](crate::Partition::output_every).
    fn output_every(job: &Self::Job) -> Option<u64> {
        let _ = job;
        None
    }

    /// As [`Partition::output`](crate::Partition::output).
    ///
    /// # Errors
    ///
    /// An error ends the job with [`Error::Output`](crate::Error::Output).
    fn output(
        &self,
        job: &Self::Job,
        input: &<Self::Job as Job>::Input,
        phase: u64,
    ) -> Result<(), BoxError> {
        let _ = (job, input, phase);
        Ok(())
    }

    /// As [`Partition::gather_at_end`](crate::Partition::gather_at_end).
    fn gather_at_end(job: &Self::Job) -> bool {
        let _ = job;
        false
    }
}

/// The pieces addressed to one partition at a phase boundary, in the senders' chunk order
/// (see [`Exchange::begin_phase`]).
pub struct Pieces<'a, P> {
    list: Vec<(u64, &'a P)>,
    /// Each piece's shared handle, when every piece is shared (an allgather's, at the
    /// coordinator's barrier): [`Pieces::concat`] then builds one vector for all.
    shared: Option<Vec<&'a Arc<dyn Any + Send + Sync>>>,
    gathered: Option<&'a Gathered>,
}

/// The vectors [`Pieces::concat`] built at one barrier, shared by every partition that
/// gathers the same pieces there. Each holds the pieces it was built from, so that no
/// piece's address is reused (and mistaken for another's) while it lives.
#[derive(Default)]
pub(crate) struct Gathered(std::sync::Mutex<Vec<Concatenation>>);

/// One vector built by [`Pieces::concat`] and the pieces it was built from.
type Concatenation = (Vec<Arc<dyn Any + Send + Sync>>, Arc<dyn Any + Send + Sync>);

impl fmt::Debug for Gathered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Gathered")
    }
}

impl<'a, P> Pieces<'a, P> {
    /// How many pieces came.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Whether none came (the first partition of a chain, or a [`Pattern::Nothing`] phase).
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The pieces with their sender's chunk, in chunk order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (u64, &'a P)> + '_ {
        self.list.iter().copied()
    }

    /// The piece partition `from` sent, if it sent one.
    pub fn get(&self, from: u64) -> Option<&'a P> {
        self.list
            .binary_search_by_key(&from, |&(c, _)| c)
            .ok()
            .map(|i| self.list[i].1)
    }

    /// Every piece's items end to end, in chunk order: the whole vector of an allgather.
    ///
    /// The partitions of one process that gather the same pieces at one barrier share one
    /// vector, built by the first that asks: an allgather costs a copy of the vector per
    /// process, as `MPI_Allgatherv` into one buffer does, not one per partition. (A worker
    /// process receives each piece once a phase, decodes it once, and shares it the same
    /// way.) Keep the `Arc` in the partition for the phase that reads it (a snapshot taken
    /// meanwhile stores its items). Pieces that are not every partition's (halos, an
    /// all-to-all's, or an allgather's that came with a partition moved at the barrier) are
    /// copied for this partition alone.
    pub fn concat<T>(&self) -> Arc<Vec<T>>
    where
        P: AsRef<[T]>,
        T: Clone + Send + Sync + 'static,
    {
        let build = || {
            let len = self.list.iter().map(|(_, p)| p.as_ref().len()).sum();
            let mut all = Vec::with_capacity(len);
            for (_, p) in &self.list {
                all.extend_from_slice(p.as_ref());
            }
            Arc::new(all)
        };
        let (Some(shared), Some(gathered)) = (&self.shared, self.gathered) else {
            return build();
        };
        let mut built = gathered.0.lock().unwrap_or_else(|p| p.into_inner());
        let same = |from: &Vec<Arc<dyn Any + Send + Sync>>| {
            from.len() == shared.len() && from.iter().zip(shared).all(|(a, b)| Arc::ptr_eq(a, b))
        };
        if let Some(v) = built
            .iter()
            .find(|(from, _)| same(from))
            .and_then(|(_, v)| Arc::clone(v).downcast::<Vec<T>>().ok())
        {
            return v;
        }
        let v = build();
        let from = shared.iter().map(|a| Arc::clone(a)).collect();
        built.push((from, Arc::clone(&v) as Arc<dyn Any + Send + Sync>));
        v
    }
}

impl<P> fmt::Debug for Pieces<'_, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.list.iter().map(|(c, _)| c))
            .finish()
    }
}

impl<'a, P> IntoIterator for Pieces<'a, P> {
    type Item = (u64, &'a P);
    type IntoIter = std::vec::IntoIter<(u64, &'a P)>;
    fn into_iter(self) -> Self::IntoIter {
        self.list.into_iter()
    }
}

/// A piece with its type erased, as the executor carries it: owned by its one receiver, or
/// shared by all (an allgather's).
pub(crate) enum Piece {
    Own(Box<dyn Any + Send>),
    Shared(Arc<dyn Any + Send + Sync>),
}

impl Piece {
    /// Another handle on a shared piece; `None` for one owned by a single receiver.
    pub(crate) fn share(&self) -> Option<Piece> {
        match self {
            Piece::Own(_) => None,
            Piece::Shared(a) => Some(Piece::Shared(Arc::clone(a))),
        }
    }

    /// The piece, if it is a `P`.
    pub(crate) fn get<P: 'static>(&self) -> Option<&P> {
        match self {
            Piece::Own(b) => b.downcast_ref(),
            Piece::Shared(a) => a.downcast_ref(),
        }
    }

    /// The piece, owned, if it is a `P` owned by its receiver.
    pub(crate) fn take<P: 'static>(self) -> Option<P> {
        match self {
            Piece::Own(b) => b.downcast().ok().map(|b| *b),
            Piece::Shared(_) => None,
        }
    }
}

impl fmt::Debug for Piece {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Piece::Own(_) => "Piece::Own",
            Piece::Shared(_) => "Piece::Shared",
        })
    }
}

/// Where a partition and its job stand when it exports: its chunk, the job's number of
/// chunks and the phase it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct At {
    pub(crate) chunk: u64,
    pub(crate) chunks: u64,
    pub(crate) phase: u64,
}

/// The pieces a partition exported, each addressed: `Some(chunk)`, or `None` for every
/// partition (an allgather's).
pub(crate) type Outbox<H> = Vec<(Option<u64>, H)>;

/// The pieces for a partition with their sender's chunk, in chunk order.
pub(crate) type Inbox<H> = Vec<(u64, H)>;

/// The addresses a partition of `at` exports to, in `pattern`, on a neighbour graph given
/// by `neighbours` (sorted).
pub(crate) fn addresses(pattern: Pattern, at: At, neighbours: &[u64]) -> Vec<Option<u64>> {
    match pattern {
        Pattern::Nothing => Vec::new(),
        Pattern::Neighbours => neighbours.iter().map(|&n| Some(n)).collect(),
        Pattern::Allgather => vec![None],
        Pattern::AllToAll => (0..at.chunks).map(Some).collect(),
    }
}

/// [`Exchange::export`] of every piece a partition owes in the pattern of `at.phase`.
pub(crate) fn export_erased<J: Job>(c: &J::Chunk, job: &J, at: At) -> Outbox<Piece>
where
    J::Chunk: Exchange,
{
    let pattern = <J::Chunk as Exchange>::pattern(job, at.phase);
    let mut neighbours = Vec::new();
    if pattern == Pattern::Neighbours {
        neighbours = <J::Chunk as Exchange>::neighbours(job, at.chunk, at.chunks);
        neighbours.sort_unstable();
    }
    addresses(pattern, at, &neighbours)
        .into_iter()
        .map(|to| {
            let p = c.export(job, to);
            let piece = match to {
                None => Piece::Shared(Arc::new(p)),
                Some(_) => Piece::Own(Box::new(p)),
            };
            (to, piece)
        })
        .collect()
}

/// [`Exchange::begin_phase`] with the pieces of an [`Inbox`]; `gathered` is the barrier's,
/// where partitions share what [`Pieces::concat`] builds.
pub(crate) fn begin_erased<J: Job>(
    c: &mut J::Chunk,
    job: &J,
    inbox: &mut Inbox<Piece>,
    gathered: Option<&Gathered>,
) where
    J::Chunk: Exchange,
{
    // The executor only ever hands a partition the pieces its own type exported.
    let list = inbox
        .iter()
        .filter_map(|(from, p)| p.get::<<J::Chunk as Exchange>::Piece>().map(|p| (*from, p)))
        .collect();
    let shared = inbox
        .iter()
        .map(|(_, p)| match p {
            Piece::Shared(a) => Some(a),
            Piece::Own(_) => None,
        })
        .collect();
    c.begin_phase(
        job,
        Pieces {
            list,
            shared,
            gathered,
        },
    );
    inbox.clear();
}

/// A piece's bytes.
pub(crate) fn encode_erased<P: Serialize + 'static>(
    p: &Piece,
) -> Result<Vec<u8>, crate::codec::Error> {
    match p.get::<P>() {
        Some(p) => crate::codec::encode("a halo", p),
        // Only pieces of this job's type are ever erased with these hooks.
        None => crate::codec::encode("a halo", &()),
    }
}

/// A piece from its bytes, its receiver's own.
pub(crate) fn decode_erased<P: DeserializeOwned + Send + 'static>(
    b: &[u8],
) -> Result<Piece, crate::codec::Error> {
    crate::codec::decode::<P>("a halo", b).map(|p| Piece::Own(Box::new(p)))
}

/// An allgather's piece from its bytes, shared by the receivers it is handed to.
pub(crate) fn decode_shared_erased<P: DeserializeOwned + Send + Sync + 'static>(
    b: &[u8],
) -> Result<Piece, crate::codec::Error> {
    crate::codec::decode::<P>("a halo", b).map(|p| Piece::Shared(Arc::new(p)))
}

/// How the neighbours a job declared ([`Exchange::neighbours`]) are not a graph the executor
/// can route pieces on ([`Error::Neighbours`](crate::Error::Neighbours)).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GraphError {
    /// A neighbour past the last chunk.
    #[error("it names chunk {neighbour}, past the last of {chunks} chunks")]
    OutOfRange {
        /// The neighbour named.
        neighbour: u64,
        /// The job's chunks.
        chunks: u64,
    },
    /// The chunk names itself.
    #[error("it names itself")]
    Itself,
    /// A neighbour named twice.
    #[error("it names chunk {neighbour} twice")]
    Twice {
        /// The neighbour named twice.
        neighbour: u64,
    },
    /// A neighbour that does not name the chunk back.
    #[error("it names chunk {neighbour}, which does not name it back")]
    NotSymmetric {
        /// The neighbour.
        neighbour: u64,
    },
}
