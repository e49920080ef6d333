//! The messages of the cluster protocol and their framing.
//!
//! Every message is one frame: a 4-byte big-endian length, then the body (tokio-util's
//! `LengthDelimitedCodec`, with a maximum length; a longer frame ends the connection with
//! [`Error::FrameTooLarge`] before its body is read). A message whose body is longer than the
//! sender's frame limit (a large job value, state or output) goes as consecutive `Piece`
//! frames ([`Frames`]), and the receiver puts it together ([`Assembler`]) up to its message
//! limit ([`DEFAULT_MAX_MESSAGE`]), growing its buffer only as pieces arrive, so memory stays
//! bounded whatever a peer claims; pieces are accepted only after the handshake. Bodies are postcard, except the first
//! frame of each side, which starts with the protocol's magic and version in fixed bytes so that
//! a peer of another version is told so instead of failing to decode (see `handshake.rs`).
//!
//! Every decoder here takes untrusted bytes and returns a typed error, never panics; the fuzz
//! targets `frame` and `handshake` exercise them.

use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use tokio_util::codec::{Decoder, Encoder, LengthDelimitedCodec};

use super::Error;
use super::buffers::Buffers;

/// The first bytes of a peer's first frame.
pub const MAGIC: [u8; 8] = *b"MALLEABL";
/// The version of the protocol (handshake and messages). Version 2: slots are lanes, several
/// per thread ([`SLOTS_PER_THREAD`]). Version 3: `Failed` says what failed ([`Failure`]), so
/// the coordinator reports the error a local worker would. Version 4: messages longer than a
/// frame travel in pieces (`Piece`); worker processes hold owned partitions (`Run::held`,
/// `Done::halos`, `Begin`, `Surrender`, `CaptureHeld` and their answers). Version 5: a job
/// that lost partitions rolls back, and the processes left `Forget` theirs. Version 6: the
/// hello names each job with its version ([`JobType`](super::handshake::JobType)), the
/// welcome names the job's version, and a worker with the job in another version is refused
/// (`Refusal::JobVersion`); a worker that cannot decode the job value or a halo says so
/// (`ToCoordinator::Undecodable`). Version 7: `Leave` may carry a grace period
/// ([`WorkerOptions::grace`](crate::cluster::WorkerOptions::grace)). Version 8: a worker
/// process that writes to the job's store writes the parts of the partitions it holds too:
/// `CaptureHeld` names the epoch folder, answered by `CapturedHeldPart` (or by
/// `CapturedHeld` with the bytes, as before, when the process cannot write them). Version 9:
/// four slots per thread instead of two, and a slot's `busy_ns` is the time since its chunk
/// reached the thread (see [`SLOTS_PER_THREAD`]). Version 10: after a rollback the
/// coordinator places restored partitions on the processes that run them next, ahead of
/// their runs (`Place`, or `PlacePart` for a process that reads them from the store), and
/// those that ended the restored phase export their halos there (`Exported`). Version 11: a
/// slot's `busy_ns` is its thread's time on its chunk times [`SLOTS_PER_THREAD`]. Version 12:
/// a halo whose neighbour is in the same process stays there ([`Halo::Kept`] in `Done`,
/// `Exported` and `Begin`), and goes up with `Released` before that neighbour leaves.
/// Version 13: a rollback stops the chunks a process runs or has queued with `Abandon`,
/// answered by `Abandoned`, with no state: they are dropped, not handed back. Version 15:
/// when the job finishes, a partition held by a process is output there (`Output`,
/// answered by `OutputDone`, or `FailedHeld` with [`Failure::Output`]). Version 16: the
/// hello names each job's layout fingerprint ([`JobType::layout`](super::handshake::JobType));
/// a worker with the job in its version but types of another layout is refused
/// (`Refusal::Layout`, carrying the coordinator's layout) and answers with its own
/// (`WorkerLayout`), so that both sides name the first field that differs. Version 17: a
/// placement that asks for halos carries the rollback's placement number (`export`), and
/// `Exported` quotes it back: a process forgets the placements under way when the job rolls
/// back again (`Forget`) and answers them never, so answers are matched by number, not by
/// order; the hello names the node the worker runs on (`Hello::node`). Version 18: halos
/// are pieces addressed to chunks, so that partitions exchange with any neighbour graph and
/// in collectives ([`Exchange`](crate::Exchange)): `Done` and `Exported` address each piece
/// (`None`: to every partition, an allgather's), `Begin` and `Released` name each piece's
/// sender, and `Phase` carries the job's number of chunks (an all-to-all addresses them all).
/// Version 19: a `Run` of a held partition grants the slot the held partitions queued after
/// it (`Run::then`; `Recall` and `Returned` give back those not started), and what goes to or
/// from one process at once goes in one `Batch`. Version 20: worker processes exchange halos
/// directly ([`peer`](super::peer)): `Peers` tells a process its number, the run's session and
/// generation and where the receivers of its halos are; a process says where it listens
/// (`Listening`) and which peer it cannot reach (`Unreachable`); a `Done` names a halo its
/// receiver's process kept after a push ([`Halo::KeptAt`]); `Released` names the phase of the
/// halos it carries. Version 21: buddy copies (local recovery's first step): `Copy` asks a
/// process to copy the partitions it holds to another process's memory
/// ([`ToPeer::Copy`](super::peer::ToPeer::Copy)), `Copied` says which the buddy kept, and
/// `DropCopies` tells a buddy which copies it no longer needs; `Logs` asks a process to keep
/// the halos its partitions export (a halo log), and `Copied` says how much it keeps.
/// Version 22: local recovery: `SendLog` and `Log` fetch the halo logs a replay needs,
/// `Recover` has a buddy replay lost partitions from its copies, answered by `Replayed` (or
/// `ReplayFailed`). Version 23: an allgather's pieces reach a process once per phase
/// (`Gathered`), and each `Begin` names them ([`Halo::Gathered`]) instead of carrying them
/// again for every partition the process holds. Version 24: a process says whether the
/// store a `Store` offered is usable from it (`StoreChecked`), so that a rollback places
/// restored partitions on it by reference even if it wrote no part of the snapshot.
/// Version 25: `Gathered` names the pieces a process exported itself instead of sending
/// them back to it. Version 26: a partition that leaves a process takes the records of the
/// halo log it exported there along (`LogOf`), into the coordinator's log. Version 27:
/// `Replayed` names the phase of the copy the buddy replayed from, which may be newer than
/// the `Recover`'s. Version 28: a buddy copy between processes of one node goes through
/// memory both map ([`ToPeer::SharedCopy`](super::peer::ToPeer::SharedCopy), answered by
/// `Unshared` if the buddy does not map it and followed by `Released` when it lets go of it;
/// `wire/shared.rs`).
pub const PROTOCOL_VERSION: u32 = 28;
/// Slots per thread of a worker process. Each slot is a worker in the coordinator's ledger and
/// holds at most one chunk, so a thread holds the chunk it runs and the next ones: when a
/// chunk ends, the next is already there, and the round trip of its `Done` and the following
/// `Run` overlaps computing instead of leaving the thread idle. A thread runs its slots'
/// chunks one at a time in the order they came; one still waiting is handed back or captured
/// at once when asked (its state is the one it came with).
///
/// Why four, not two: with two, the round trip had one chunk's time to complete, and with
/// short chunks and a coordinator whose I/O thread shares the cores with the workers'
/// threads it often did not: the coordinator is woken for every `Done`, and the wake-up
/// waits for a core (`BENCHMARKS.md`, partitions, has the figures).
///
/// Slots share their thread, and the coordinator shares work by each worker's measured
/// throughput (a static deal, owned partitions, the autoscaler). A slot therefore reports as
/// busy (`busy_ns` of `Done` and `Yielded`) its thread's time on its chunk times
/// `SLOTS_PER_THREAD`, so that the slots of a thread add up to the thread. The thread's time
/// on a chunk runs from the chunk reaching the thread, or the thread ending its previous
/// chunk if that came later, to the chunk's end.
///
/// Two measures came before. Measured over its own steps, every slot ran at its thread's
/// full speed, and a process's thread took as many local threads' shares of a grid as it had
/// slots. Measured from its chunk reaching the thread, its wait behind the thread's other
/// slots included (version 9), a slot measured its share only while the thread's slots were
/// all full: the first chunks of a phase waited behind fewer others and measured up to the
/// thread's full speed. One process of one thread beside one local thread, on rows paced
/// alike, ran 0.59 of the chunk runs, and up to 0.69 once the slots of a process were
/// balanced as one (`tests/it/partitions_remote.rs`).
pub const SLOTS_PER_THREAD: u32 = 4;
/// The default maximum frame length: 64 MiB. A longer message is sent in pieces.
pub const DEFAULT_MAX_FRAME: usize = 64 << 20;
/// The default maximum length of a message sent in pieces: 4 GiB (a job value, chunk state,
/// owned partition or output must fit).
pub const DEFAULT_MAX_MESSAGE: usize = 4 << 30;
/// The longest piece: 8 MiB, or less under a smaller frame limit.
const PIECE: usize = 8 << 20;
/// What a piece's frame adds to its bytes: the variant, the flag and the length.
const PIECE_OVERHEAD: usize = 16;

/// About the bytes `msg` takes on the wire: its byte fields, plus a little for the rest
/// (to bound what one batch carries, see `ToWorker::Batch`).
pub(crate) fn weight(msg: &ToWorker) -> usize {
    let halos = |h: &[(u64, Halo)]| {
        h.iter()
            .map(|(_, h)| match h {
                Halo::Sent(b) => b.len() + 8,
                Halo::Kept | Halo::KeptAt(_) | Halo::Gathered => 8,
            })
            .sum::<usize>()
    };
    64 + match msg {
        ToWorker::Phase { job, .. } => job.len(),
        ToWorker::Run { state, then, .. } => state.as_ref().map_or(0, Bytes::len) + 24 * then.len(),
        ToWorker::Begin { halos: h, .. } => halos(h),
        ToWorker::Gathered { pieces } => pieces
            .iter()
            .map(|(_, b)| b.as_ref().map_or(0, Bytes::len) + 8)
            .sum(),
        ToWorker::Piece { bytes, .. } => bytes.len(),
        ToWorker::Place { state, .. } => state.len(),
        ToWorker::Store { url, options, .. } => {
            url.len()
                + options
                    .iter()
                    .map(|(k, v)| k.len() + v.len())
                    .sum::<usize>()
        }
        ToWorker::Batch(b) => b.iter().map(weight).sum(),
        ToWorker::Peers { addrs, holders, .. } => {
            addrs.iter().map(|(_, a)| a.len() + 8).sum::<usize>() + 16 * holders.len()
        }
        ToWorker::Copy { addr, chunks, .. } => addr.len() + 8 * chunks.len(),
        ToWorker::DropCopies { chunks, .. } => 8 * chunks.len(),
        ToWorker::SendLog { to, .. } => 8 * to.len(),
        ToWorker::SendCopies { chunks, .. } => 8 * chunks.len(),
        ToWorker::Recover {
            chunks,
            jobs,
            halos,
            copies,
            ..
        } => {
            32 * chunks.len()
                + jobs.iter().map(|(_, b)| b.len() + 8).sum::<usize>()
                + halos.iter().map(|h| h.3.len() + 24).sum::<usize>()
                + copies.iter().map(|(_, b)| b.len() + 8).sum::<usize>()
        }
        _ => 0,
    }
}

/// The framing codec with a maximum frame length.
pub(crate) fn codec(max_frame: usize) -> Codec {
    Codec {
        inner: LengthDelimitedCodec::builder()
            .length_field_type::<u32>()
            .max_frame_length(max_frame)
            .new_codec(),
        buffers: None,
        at_head: true,
        pooled: false,
    }
}

/// The framing of every connection: tokio-util's `LengthDelimitedCodec` (a 4-byte
/// big-endian length, then the body) to read, and to write [`Frame`]s, whose tail goes
/// into the write buffer straight from where it is.
///
/// On a worker process's peer links, after the handshake, a long frame (one that may carry
/// a buddy copy) is read into a buffer of its own, taken from the process's buffers kept for
/// reuse (`wire/buffers.rs`), and only that frame: a buddy copy's memory goes back there
/// once the copy is done with (another long message's is freed as before).
#[derive(Debug)]
pub struct Codec {
    inner: LengthDelimitedCodec,
    buffers: Option<Arc<Buffers>>,
    /// The read buffer starts with a frame's length (the inner codec has not read it yet).
    at_head: bool,
    /// The frame being read is in a buffer of its own, from `buffers`.
    pooled: bool,
}

impl Codec {
    /// The longest frame read or written.
    pub fn max_frame_length(&self) -> usize {
        self.inner.max_frame_length()
    }

    /// Sets the longest frame read or written.
    pub fn set_max_frame_length(&mut self, limit: usize) {
        self.inner.set_max_frame_length(limit);
    }

    /// Long frames are read into buffers from `buffers` from now on (after a handshake: the
    /// frame limit before it is what bounds a stranger's memory).
    pub(crate) fn reuse(&mut self, buffers: Arc<Buffers>) {
        self.buffers = Some(buffers);
    }
}

impl Decoder for Codec {
    type Item = BytesMut;
    type Error = std::io::Error;

    fn decode(&mut self, src: &mut BytesMut) -> std::io::Result<Option<BytesMut>> {
        let before = src.len();
        if let (Some(buffers), true, Some(head)) = (&self.buffers, self.at_head, src.get(..4)) {
            let n = u32::from_be_bytes(head.try_into().expect("four bytes")) as usize;
            let whole = n.saturating_add(4);
            if n >= TAIL_AT_LEAST && n <= self.inner.max_frame_length() && before < whole {
                *src = buffers.read_buffer(whole, src);
                self.pooled = true;
            }
        }
        let frame = self.inner.decode(src)?;
        self.at_head = frame.is_some() || (self.at_head && before < 4);
        if frame.is_some() && std::mem::take(&mut self.pooled) {
            // What follows the frame is copied out: the frame is then its memory's only
            // owner, and can go back to `buffers` when its message is done with.
            *src = BytesMut::from(&src[..]);
        }
        Ok(frame)
    }
}

impl Encoder<Bytes> for Codec {
    type Error = std::io::Error;

    fn encode(&mut self, body: Bytes, dst: &mut BytesMut) -> std::io::Result<()> {
        self.inner.encode(body, dst)
    }
}

impl Encoder<Frame> for Codec {
    type Error = std::io::Error;

    fn encode(&mut self, frame: Frame, dst: &mut BytesMut) -> std::io::Result<()> {
        if frame.tail.is_empty() {
            return self.inner.encode(frame.head, dst);
        }
        let len = frame.len();
        let Some(n) = u32::try_from(len)
            .ok()
            .filter(|_| len <= self.inner.max_frame_length())
        else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "a frame of {len} bytes, over the limit of {}",
                    self.inner.max_frame_length()
                ),
            ));
        };
        dst.reserve(4 + len);
        dst.put_u32(n);
        dst.extend_from_slice(&frame.head);
        dst.extend_from_slice(&frame.tail);
        Ok(())
    }
}

/// One frame's body, as [`Codec`] writes it: a head, then a tail written after it. A
/// message whose last field is a long byte string (a partition's state, a buddy copy) has it
/// as its tail, so that its bytes are copied once, into the connection's write buffer, and
/// not first into a body of their own (`Message::tail`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Frame {
    head: Bytes,
    tail: Bytes,
}

impl Frame {
    /// The body's length.
    pub fn len(&self) -> usize {
        self.head.len() + self.tail.len()
    }

    /// Whether the body is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The body in one piece (a copy if it has a tail).
    pub fn to_bytes(&self) -> Bytes {
        if self.tail.is_empty() {
            return self.head.clone();
        }
        let mut b = BytesMut::with_capacity(self.len());
        b.extend_from_slice(&self.head);
        b.extend_from_slice(&self.tail);
        b.freeze()
    }
}

impl From<Bytes> for Frame {
    fn from(head: Bytes) -> Frame {
        Frame {
            head,
            tail: Bytes::new(),
        }
    }
}

/// The shortest byte field sent as a frame's tail: shorter ones are copied into the body as
/// the rest of the message is.
const TAIL_AT_LEAST: usize = 64 << 10;

/// A message from the coordinator to a worker process. `slot` numbers the worker process's
/// slots (`0..threads × SLOTS_PER_THREAD`), each a worker of its own in the coordinator's
/// ledger; slot `s` is on thread `s / SLOTS_PER_THREAD`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ToWorker {
    /// The job value of `phase`: sent once per phase, before the phase's first `Run`.
    Phase {
        /// The phase number.
        phase: u64,
        /// The job's number of chunks.
        chunks: u64,
        /// The job value (postcard).
        #[serde(deserialize_with = "in_frame")]
        job: Bytes,
    },
    /// Run a chunk of the current phase in `slot` (after the thread's earlier chunks).
    Run {
        /// The slot.
        slot: u32,
        /// The chunk's number in the phase.
        chunk: u64,
        /// First iteration.
        start: u64,
        /// One past the last iteration.
        end: u64,
        /// The chunk's state to continue from (postcard), or none to start it (or to run the
        /// partition this process holds, with `held`).
        #[serde(deserialize_with = "in_frame_opt")]
        state: Option<Bytes>,
        /// Owned partitions: run the partition of `chunk` that this process holds (it ended
        /// the last phase here and was given its halos with `Begin`).
        held: bool,
        /// Owned partitions, after a `held` one: `(chunk, start, end)` of the partitions
        /// this process holds that this slot runs after `chunk`, in this order, each as if
        /// its own `Run { held: true }` came when the one before it ended (a *grant*: no
        /// round trip per partition). An `Interrupt`, an `Abandon` or a `Recall` of the slot
        /// stops the grant: the ones not started yet stay held here and are named in
        /// `Returned`.
        then: Vec<(u64, u64, u64)>,
    },
    /// Owned partitions, at a phase barrier (after the new phase's `Phase`): the halos (the
    /// pieces) other partitions exported for the partition of `chunk` this process holds,
    /// each with its sender's chunk, in chunk order. [`Halo::Kept`] names one this process
    /// kept when the sender's `Done` (or `Exported`) said so.
    Begin {
        /// The chunk.
        chunk: u64,
        /// `(sender, halo)`, by sender.
        halos: Vec<(u64, Halo)>,
    },
    /// Owned partitions: send the partition of `chunk` this process holds and forget it (it
    /// moves to another worker, or this process leaves). Answered by `Surrendered`.
    Surrender {
        /// The chunk.
        chunk: u64,
    },
    /// Owned partitions: serialize the partition of `chunk` this process holds (not running)
    /// for a snapshot and keep it. A worker process that writes to the job's store (see
    /// `Store`) puts it in epoch folder `folder` itself and answers `CapturedHeldPart`;
    /// otherwise it answers `CapturedHeld`.
    CaptureHeld {
        /// The chunk.
        chunk: u64,
        /// The epoch folder of the snapshot being taken.
        folder: u64,
    },
    /// Give back the partitions granted to `slot` (`Run::then`) that it has not started:
    /// they stay held here and are named in `Returned`. The chunk the slot runs goes on. The coordinator asks it when a worker joins in the middle of a phase, so that
    /// the newcomer can take a share of what is not started.
    Recall {
        /// The slot.
        slot: u32,
    },
    /// Hand `chunk` back at the next adjustment point. With a grant (`Run::then`), the
    /// slot hands back whichever of its granted chunks it runs (`Yielded`, or its `Done` if
    /// it ended first) and gives back those it did not start (`Returned`), whichever chunk
    /// this names.
    Interrupt {
        /// The slot.
        slot: u32,
        /// The chunk it runs.
        chunk: u64,
    },
    /// Serialize `chunk` at the next adjustment point for a snapshot, and go on. A worker
    /// process that writes to the job's store (see `Store`) puts the state in epoch folder
    /// `folder` itself and answers `CapturedPart`; otherwise it answers `Captured`.
    Capture {
        /// The slot.
        slot: u32,
        /// The chunk it runs.
        chunk: u64,
        /// The epoch folder of the snapshot being taken.
        folder: u64,
    },
    /// Slot `slot` is no longer a worker of the job.
    Release {
        /// The slot.
        slot: u32,
    },
    /// The job's snapshot store, so that the worker process can write its own parts: the URL
    /// without credentials (the worker uses its own environment's), the options that are not
    /// secrets, and the latest committed snapshot there as a witness. The worker writes parts
    /// only once it has read that snapshot's manifest, with this creation time, through the
    /// URL: a URL that leads elsewhere from the worker's machine (another disk, another
    /// store) does not have it.
    Store {
        /// The store's URL (credentials removed).
        url: String,
        /// Backend options that are not secrets (endpoint, region, ...).
        options: Vec<(String, String)>,
        /// The job id snapshots are stored under.
        job_id: String,
        /// The latest committed epoch.
        epoch: u64,
        /// Its manifest's creation time (Unix milliseconds).
        created_unix_ms: u64,
    },
    /// The coordinator is alive.
    Heartbeat,
    /// The job ended (finished, suspended, failed or cancelled) or this process was retired:
    /// stop and disconnect.
    End,
    /// A piece of a message too long for one frame; `more` is false on the last one.
    Piece {
        /// Whether more pieces follow.
        more: bool,
        /// The piece.
        #[serde(deserialize_with = "in_frame")]
        bytes: Bytes,
    },
    /// Owned partitions: the job rolled back to a snapshot; drop every partition this process
    /// holds (the next phase's job value and the restored states come with later messages).
    Forget,
    /// Owned partitions, after a rollback: hold `state` as the partition of `chunk` from now
    /// on, as if it had ended its last run here. It runs here with `Run { held }`, takes its
    /// halos with `Begin`, and answers `Surrender` and `CaptureHeld` like any partition this
    /// process holds. One that does not decode is answered by `FailedHeld`.
    Place {
        /// The chunk.
        chunk: u64,
        /// The partition's state (postcard), as the snapshot had it.
        #[serde(deserialize_with = "in_frame")]
        state: Bytes,
        /// `Some(placement)`: the partition ended the restored phase; answer `Exported` with
        /// its halos and this number (the rollback's placement, which a later rollback
        /// replaces: answers to an earlier one are recognised and dropped).
        export: Option<u64>,
    },
    /// As `Place`, for a process that writes to the job's store (see `Store`): it reads the
    /// partition's state from the snapshot's part itself, size and checksum checked, instead
    /// of receiving its bytes. One it cannot read is answered by `FailedHeld`.
    PlacePart {
        /// The chunk.
        chunk: u64,
        /// The part of the snapshot rolled back to.
        part: crate::snapshot::PartRef,
        /// As in `Place`.
        export: Option<u64>,
    },
    /// The job rolls back: stop `chunk` in `slot` at its next adjustment point (at once if it
    /// waits to run) and drop it, with the partition it runs; answer `Abandoned`, with no
    /// state. Unlike `Interrupt`, nothing comes back: a partition's state is megabytes that
    /// the rollback would throw away, and the rollback waits until no chunk runs. One that
    /// ended meanwhile is answered by its `Done` as usual.
    Abandon {
        /// The slot.
        slot: u32,
        /// The chunk.
        chunk: u64,
    },
    /// Several messages in one frame, taken in this order as if each came alone: what the
    /// coordinator decided for this process at once (a phase's start: its job value, every
    /// held partition's halos and every slot's `Run`). Never nested.
    Batch(Vec<ToWorker>),
    /// Owned partitions, when the job finished: hand the partition of `chunk` this process
    /// holds to the job's `Partition::output` for `phase` (the last phase; the process has
    /// its job value), and keep it. Answered by `OutputDone`, or `FailedHeld`.
    Output {
        /// The chunk.
        chunk: u64,
        /// The phase whose end the partition holds.
        phase: u64,
    },
    /// Owned partitions, the peer data plane ([`peer`](super::peer)): where this process
    /// sends halos directly. Sent before the messages of a phase that need it, and again
    /// after a rollback (with a new `generation`); each names only what changed since the
    /// last. The holders are hints: a halo pushed to a process that no longer holds its
    /// partition is refused there and goes through the coordinator.
    Peers {
        /// This process's number among the job's processes (what its peers call it).
        me: u64,
        /// The job run's session: a peer of another run is refused.
        session: [u8; 16],
        /// Bumped by each rollback: a halo pushed under another generation is refused.
        generation: u64,
        /// `(process, address)` of the peer listeners this process may need.
        addrs: Vec<(u64, String)>,
        /// `(chunk, process)`: the process that holds the partition of `chunk` now, `None`
        /// for one not held by a worker process (its halos go through the coordinator).
        holders: Vec<(u64, Option<u64>)>,
    },
    /// Owned partitions, buddy copies (protocol 21): copy the partitions of `chunks` this
    /// process holds, which ended `phase`, into the memory of process `buddy` (listening at
    /// `addr`), each as a [`ToPeer::Copy`](super::peer::ToPeer::Copy), and say which it kept
    /// (`Copied`). Sent at a barrier, before the next phase's messages: the copies are of the
    /// partitions as the phase left them.
    Copy {
        /// The phase the partitions ended.
        phase: u64,
        /// The roster's generation (a copy of another generation is refused).
        generation: u64,
        /// The process that keeps the copies.
        buddy: u64,
        /// Its peer listener.
        addr: String,
        /// The partitions to copy, each held here, in chunk order.
        chunks: Vec<u64>,
    },
    /// Owned partitions, buddy copies: keep the halos (the pieces) each partition here
    /// exports at the end of phase `from` and later (a *halo log*: what replays a lost
    /// neighbour from its buddy copy), and drop those of earlier phases. Sent at the join and
    /// at each copy barrier, when the job takes buddy copies.
    Logs {
        /// The first phase whose exports are kept.
        from: u64,
    },
    /// Owned partitions, local recovery: send the records of the halo log (see `Logs`) of
    /// phases `from..=through`, keeping only the pieces for the chunks of `to` (and those
    /// for every partition), in a `Log` that quotes `attempt`.
    SendLog {
        /// The recovery this is for.
        attempt: u64,
        /// The first phase.
        from: u64,
        /// The last phase.
        through: u64,
        /// The chunks whose pieces are wanted, in chunk order.
        to: Vec<u64>,
    },
    /// Owned partitions, local recovery: send the buddy copies of phase `phase` this
    /// process keeps of `chunks` (the replay is in another process, which has the others),
    /// in a `CopiesOf` that quotes `attempt`; they are used up (a newer copy stays).
    SendCopies {
        /// The recovery this is for.
        attempt: u64,
        /// The phase of the copies.
        phase: u64,
        /// The chunks.
        chunks: Vec<u64>,
    },
    /// Owned partitions, local recovery: replay the partitions of `chunks` from the buddy
    /// copies this process keeps of them (all of phase `copy_phase`) to phase `phase`, with
    /// the job values of phases `copy_phase..=phase` (`jobs`; the first exports the copies'
    /// pieces) and the pieces their other
    /// neighbours sent them (`halos`: `(phase, sender, receiver, piece)`, a piece exported
    /// at the end of `phase`). A partition whose `done` is true runs phase `phase` too (it
    /// had ended it where it was lost); the others only begin it. In the background; each
    /// partition is answered by `Replayed` (or the whole by `ReplayFailed`), and its copy
    /// here is used up.
    Recover {
        /// The recovery this is for.
        attempt: u64,
        /// The phase of the copies.
        copy_phase: u64,
        /// The phase the job is in.
        phase: u64,
        /// The job's number of chunks (a piece may be addressed to any).
        total: u64,
        /// `(chunk, start, end, done)`, in chunk order.
        chunks: Vec<(u64, u64, u64, bool)>,
        /// `(phase, job value)` for each phase replayed, in order.
        jobs: Vec<(u64, Bytes)>,
        /// `(phase, sender, receiver, piece)`.
        halos: Vec<(u64, u64, u64, Bytes)>,
        /// `(chunk, copy)`: copies of phase `copy_phase` that other processes kept.
        copies: Vec<(u64, Bytes)>,
    },
    /// Owned partitions, buddy copies: the copies of `chunks` this process keeps for others
    /// that are of a phase before `before` are no longer needed (a newer one is elsewhere):
    /// drop them. (A newer copy that reached this process meanwhile, over another link, is
    /// kept.)
    DropCopies {
        /// The chunks.
        chunks: Vec<u64>,
        /// Copies of this phase or later are kept.
        before: u64,
    },
    /// Owned partitions, at a phase barrier that ends an allgather (after the new phase's
    /// `Phase`, before its `Begin`s): the pieces every partition exported for every other,
    /// each with its sender's chunk, in chunk order. Each `Begin` of the phase names them
    /// ([`Halo::Gathered`]): they cross once per process, not once per partition, and the
    /// process decodes each once. Until the next `Phase`.
    ///
    /// A piece this process exported itself (in its `Done` or `Exported` of the phase that
    /// ended) is named, not sent back (`None`): the process kept it (protocol 25).
    Gathered {
        /// `(sender, piece)`, by sender; `None`: the piece this process exported.
        pieces: Vec<(u64, Option<Bytes>)>,
    },
}

/// A message from a worker process to the coordinator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ToCoordinator {
    /// Slot `slot` finished `chunk`.
    Done {
        /// The slot.
        slot: u32,
        /// The chunk.
        chunk: u64,
        /// The chunk's output (postcard).
        #[serde(deserialize_with = "in_frame")]
        output: Bytes,
        /// Owned partitions: the halos (pieces) the partition exported, each with the chunk
        /// it is for (`None`: every partition, in an allgather), in the order the job
        /// exports them; the partition stays in this process. A halo for a partition that
        /// is in this process too is [`Halo::Kept`].
        halos: Option<Vec<(Option<u64>, Halo)>>,
        /// Iterations done in this run of the chunk.
        iterations: u64,
        /// The time from the chunk's `Run` reaching its thread to this message, in
        /// nanoseconds: its steps, and its wait behind the thread's other slots (see
        /// [`SLOTS_PER_THREAD`]).
        busy_ns: u64,
    },
    /// The partition of `chunk`, after a `Surrender`; this process no longer holds it.
    Surrendered {
        /// The chunk.
        chunk: u64,
        /// The partition's state (postcard).
        #[serde(deserialize_with = "in_frame")]
        state: Bytes,
    },
    /// The partition of `chunk` serialized after a `CaptureHeld`; the process keeps it.
    CapturedHeld {
        /// The chunk.
        chunk: u64,
        /// The partition's state (postcard).
        #[serde(deserialize_with = "in_frame")]
        state: Bytes,
    },
    /// This process does not hold the partition of `chunk` that a `Run`, `Begin`,
    /// `Surrender` or `CaptureHeld` named.
    Missing {
        /// The chunk.
        chunk: u64,
    },
    /// The job's code failed on the partition of `chunk` this process holds (in `Begin`, or
    /// serializing it): the job cannot go on.
    FailedHeld {
        /// The chunk.
        chunk: u64,
        /// What failed.
        failure: Failure,
    },
    /// Slot `slot` handed `chunk` back after an `Interrupt`.
    Yielded {
        /// The slot.
        slot: u32,
        /// The chunk.
        chunk: u64,
        /// The chunk's state (postcard).
        #[serde(deserialize_with = "in_frame")]
        state: Bytes,
        /// Iterations done in this run of the chunk.
        iterations: u64,
        /// The time from the chunk's `Run` reaching its thread to this message, in
        /// nanoseconds: its steps, and its wait behind the thread's other slots (see
        /// [`SLOTS_PER_THREAD`]).
        busy_ns: u64,
    },
    /// The state of `chunk` at an adjustment point after a `Capture`; the thread goes on.
    Captured {
        /// The slot.
        slot: u32,
        /// The chunk.
        chunk: u64,
        /// The chunk's state (postcard).
        #[serde(deserialize_with = "in_frame")]
        state: Bytes,
    },
    /// The state of `chunk` after a `Capture`, written to the store by the worker process;
    /// the thread goes on.
    CapturedPart {
        /// The slot.
        slot: u32,
        /// The chunk.
        chunk: u64,
        /// The part, as a manifest lists it.
        part: crate::snapshot::PartRef,
    },
    /// The job's code failed in slot `slot` (a panic, an input that did not load, a state
    /// that did not decode): the chunk's state is lost and the job cannot go on.
    Failed {
        /// The slot.
        slot: u32,
        /// The chunk.
        chunk: u64,
        /// What failed.
        failure: Failure,
    },
    /// The worker is alive; iterations done so far in each thread's current chunk.
    Heartbeat {
        /// Per thread.
        progress: Vec<u64>,
    },
    /// The worker process is asked to stop: retire all its slots (their chunks come back
    /// as `Yielded`), then send `End`; with a grace period (milliseconds), as a drain
    /// ([`JobHandle::drain_remote`](crate::JobHandle::drain_remote)): a snapshot near its end
    /// if the process is still there, and let go at its end.
    Leave {
        /// The grace period in milliseconds, if the process has one.
        grace_ms: Option<u64>,
    },
    /// A piece of a message too long for one frame; `more` is false on the last one.
    Piece {
        /// Whether more pieces follow.
        more: bool,
        /// The piece.
        #[serde(deserialize_with = "in_frame")]
        bytes: Bytes,
    },
    /// This process could not decode `what` (the job value, a halo) although the job's
    /// versions match: the job's serialized form differs between the two programs. The
    /// process leaves after it.
    Undecodable {
        /// What did not decode ("the job value", "a halo").
        what: String,
        /// The codec's error.
        error: postcard::Error,
    },
    /// Owned partitions: the partition of `chunk` after a `CaptureHeld`, written to the
    /// store by this process, which keeps it. Answers about one partition go in the order
    /// they were asked, and before anything later about that partition (its `Done`,
    /// `Surrendered`, …).
    CapturedHeldPart {
        /// The chunk.
        chunk: u64,
        /// The part, as a manifest lists it.
        part: crate::snapshot::PartRef,
    },
    /// Owned partitions: the halos the partition of `chunk`, placed here with `export`,
    /// exported, addressed as in `Done`.
    Exported {
        /// The chunk.
        chunk: u64,
        /// The halos.
        halos: Vec<(Option<u64>, Halo)>,
        /// The placement number its `Place` or `PlacePart` carried.
        placement: u64,
    },
    /// Owned partitions: the halos this process kept ([`Halo::Kept`]) for the partition of
    /// `chunk`, which leaves it: sent right before the message that hands the partition
    /// back (`Surrendered`, `Yielded`, `Failed`, `FailedHeld`, `Missing`), so that a kept
    /// halo is always where its partition is.
    Released {
        /// The chunk the halos are for.
        chunk: u64,
        /// The phase that exported them (a partition may have a phase's halos kept for its
        /// next `Begin` and, pushed by a faster neighbour, the next phase's).
        phase: u64,
        /// `(sender, halo)` for each halo this process kept for it, by sender: always
        /// [`Halo::Sent`].
        halos: Vec<(u64, Halo)>,
    },
    /// Owned partitions: after an `Interrupt` or an `Abandon` of `slot`, the granted chunks
    /// (`Run::then`) it had not started, in grant order. Their partitions stay held here.
    Returned {
        /// The slot.
        slot: u32,
        /// The chunks.
        chunks: Vec<u64>,
    },
    /// Slot `slot` stopped and dropped `chunk` after an `Abandon`.
    Abandoned {
        /// The slot.
        slot: u32,
        /// The chunk.
        chunk: u64,
    },
    /// Owned partitions: the partition of `chunk` was output after an `Output`; the
    /// process keeps it.
    OutputDone {
        /// The chunk.
        chunk: u64,
    },
    /// Owned partitions, the peer data plane: this process accepts halos from its peers at
    /// this address (sent once, right after the handshake, by a process that listens).
    Listening {
        /// `ip:port`.
        addr: String,
    },
    /// Owned partitions, the peer data plane: this process could not reach process
    /// `process` (or lost its link to it); its halos for it go through the coordinator
    /// until the coordinator offers that peer again in a `Peers` (after a wait that doubles
    /// with each failure, from 2 phases up to 64, or at the next rollback).
    Unreachable {
        /// The peer.
        process: u64,
        /// Why (the link's error, as text: it happened in this process).
        reason: String,
    },
    /// Owned partitions, buddy copies: the answer to a `Copy`. Process `buddy` keeps in its
    /// memory a copy of each partition of `copied` (with its size in bytes) as it ended
    /// `phase`; those of `refused` have no copy there (the buddy refused it or could not be
    /// reached, or the partition was not here).
    Copied {
        /// The `Copy`'s phase.
        phase: u64,
        /// The `Copy`'s generation.
        generation: u64,
        /// The `Copy`'s buddy.
        buddy: u64,
        /// `(chunk, bytes)` of each copy kept, in chunk order.
        copied: Vec<(u64, u64)>,
        /// The chunks with no copy, in chunk order.
        refused: Vec<u64>,
        /// The bytes of this process's halo log (see `Logs`) now.
        log_bytes: u64,
    },
    /// Owned partitions, local recovery: the halo log's records a `SendLog` asked for,
    /// `(phase, sender, pieces)` with the pieces as the sender exported them (only those
    /// asked).
    Log {
        /// The `SendLog`'s attempt.
        attempt: u64,
        /// The records, oldest first.
        records: Vec<LogRecord>,
    },
    /// Owned partitions, local recovery: the copies a `SendCopies` asked for, `(chunk,
    /// phase, copy)`, those this process had.
    CopiesOf {
        /// The `SendCopies`'s attempt.
        attempt: u64,
        /// The copies.
        copies: Vec<(u64, u64, Bytes)>,
    },
    /// Owned partitions, local recovery: partition `chunk` replayed after a `Recover`, and
    /// held here from now on (it ended, or began, the `Recover`'s phase); if it ended that
    /// phase, the pieces it exported then.
    Replayed {
        /// The `Recover`'s attempt.
        attempt: u64,
        /// The chunk.
        chunk: u64,
        /// The phase of the copy it was replayed from: the `Recover`'s, or a newer one the
        /// buddy kept of every partition of the `Recover` (a round whose answer never
        /// came).
        copy_phase: u64,
        /// What it exported at the end of the phase, if it ended it.
        halos: Vec<(Option<u64>, Bytes)>,
    },
    /// Owned partitions, local recovery: a `Recover` could not be carried out (a copy is
    /// not here, or the job's code failed in the replay): why.
    ReplayFailed {
        /// The `Recover`'s attempt.
        attempt: u64,
        /// Why.
        reason: String,
    },
    /// Several messages in one frame, taken in this order as if each came alone: the
    /// `Done`s of the partitions a process ran in a phase, sent together when the last of
    /// its granted runs ended (see `Run::then`). Never nested.
    Batch(Vec<ToCoordinator>),
    /// Snapshots: the check of the store a `Store` offered ended. With `usable`, this
    /// process writes its snapshot parts there itself and reads the parts placed on it
    /// from there (`PlacePart`); without, its parts go to the coordinator as bytes. Sent
    /// once per offer checked.
    StoreChecked {
        /// Whether the store is usable from here.
        usable: bool,
    },
    /// Owned partitions, buddy copies (protocol 26): the records of this process's halo log
    /// that partition `chunk` exported here (`records`, oldest first, each of sender
    /// `chunk`), sent right before the message that hands the partition back (`Surrendered`,
    /// `Yielded`), and dropped here. The coordinator keeps them in its own log: a neighbour
    /// lost later can still be replayed from its copy if this process is lost too, or
    /// leaves, before the next copies.
    LogOf {
        /// The partition that leaves.
        chunk: u64,
        /// Its records.
        records: Vec<LogRecord>,
    },
}

/// A record of a halo log (`ToCoordinator::Log`): the phase at whose end a partition
/// exported its pieces, the partition (chunk), and the pieces as it sent them, each with the
/// chunk it is for (`None`: every partition).
pub type LogRecord = (u64, u64, Vec<(Option<u64>, Bytes)>);

/// One halo of an owned partition on the wire.
///
/// Halos between two partitions of one worker process stay in that process: it answers
/// `Kept` in `Done` (or `Exported`) for a halo whose partition is there (held, placed, or
/// queued on one of its threads), and the coordinator names it back with `Kept` in that
/// partition's `Begin`. The process keeps the bytes until then; if the partition leaves it
/// first, the bytes go up in `Released` before the partition does. Only halos between
/// processes, or to and from the coordinator's own workers, cross the connection: on the
/// stencil of `benches/partitions.rs` (32 bands on two processes), 2 of 64 per phase.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Halo {
    /// The halo's bytes (postcard of the job's `Partition::Halo`).
    Sent(#[serde(deserialize_with = "in_frame")] Bytes),
    /// Kept by the worker process, for its partition's next `Begin`.
    Kept,
    /// In `Done` and `Exported` only: pushed to worker process `n` directly, which said it
    /// keeps it for its partition's next `Begin` (protocol 20, [`peer`](super::peer)). From
    /// then on it is as a halo process `n` kept itself.
    KeptAt(u64),
    /// In `Begin` only: the piece its sender exported for every partition (an allgather's),
    /// as the phase's `Gathered` carried it (protocol 23).
    Gathered,
}

/// A message of the protocol, which may travel in pieces.
pub trait Message: Serialize + Sized {
    /// What the receiver expects, for errors.
    const WHAT: &'static str;
    /// A piece of a longer message.
    fn piece(more: bool, bytes: Bytes) -> Self;
    /// The piece this message is, or the message itself.
    fn into_piece(self) -> Result<(bool, Bytes), Self>;
    /// Decodes a message held in `frame` (its byte fields share the frame's memory).
    ///
    /// # Errors
    ///
    /// [`Error::Malformed`] for bytes that are not one.
    fn decode_frame(peer: &str, frame: Bytes) -> Result<Self, Error>;
    /// If the message's last serialized field is a byte string: the message with that field
    /// empty, and the field ([`Frames`] then sends the field as the frame's tail, without
    /// copying it into the body).
    fn tail(&self) -> Option<(Self, Bytes)> {
        None
    }

    /// The bytes of this message's long field, if it is a long message: a byte field of at
    /// least 64 KiB last (a buddy copy, a captured partition), which goes as a frame's tail.
    fn long_tail(&self) -> Option<Bytes> {
        self.tail()
            .map(|(_, t)| t)
            .filter(|t| t.len() >= TAIL_AT_LEAST)
    }
}

impl ToWorker {
    /// Whether this ends the process's job: `End`, alone or in a batch (the coordinator
    /// batches what it decided for a process at once, and a job that ends with slots still
    /// running sends their interrupts and `End` together). Whoever waits for `End` (the
    /// coordinator's writer, which then closes the socket gracefully; a worker whose write
    /// failed) must find it in either form.
    pub(crate) fn ends(&self) -> bool {
        match self {
            ToWorker::End => true,
            ToWorker::Batch(batch) => batch.iter().any(|m| matches!(m, ToWorker::End)),
            _ => false,
        }
    }
}

impl Message for ToWorker {
    const WHAT: &'static str = "a message to a worker";
    fn piece(more: bool, bytes: Bytes) -> Self {
        ToWorker::Piece { more, bytes }
    }
    fn into_piece(self) -> Result<(bool, Bytes), Self> {
        match self {
            ToWorker::Piece { more, bytes } => Ok((more, bytes)),
            m => Err(m),
        }
    }
    fn decode_frame(peer: &str, frame: Bytes) -> Result<Self, Error> {
        decode_frame_to_worker(peer, frame)
    }
}

impl Message for ToCoordinator {
    const WHAT: &'static str = "a message to the coordinator";
    fn piece(more: bool, bytes: Bytes) -> Self {
        ToCoordinator::Piece { more, bytes }
    }
    fn into_piece(self) -> Result<(bool, Bytes), Self> {
        match self {
            ToCoordinator::Piece { more, bytes } => Ok((more, bytes)),
            m => Err(m),
        }
    }
    fn decode_frame(peer: &str, frame: Bytes) -> Result<Self, Error> {
        decode_frame_to_coordinator(peer, frame)
    }
    fn tail(&self) -> Option<(Self, Bytes)> {
        let empty = Bytes::new();
        match self {
            ToCoordinator::Surrendered { chunk, state } => Some((
                ToCoordinator::Surrendered {
                    chunk: *chunk,
                    state: empty,
                },
                state.clone(),
            )),
            ToCoordinator::CapturedHeld { chunk, state } => Some((
                ToCoordinator::CapturedHeld {
                    chunk: *chunk,
                    state: empty,
                },
                state.clone(),
            )),
            ToCoordinator::Captured { slot, chunk, state } => Some((
                ToCoordinator::Captured {
                    slot: *slot,
                    chunk: *chunk,
                    state: empty,
                },
                state.clone(),
            )),
            _ => None,
        }
    }
}

/// The frames of one message: the message itself when it fits in `max_frame`, else its
/// pieces, in order.
#[derive(Debug)]
pub struct Frames<T> {
    whole: Bytes,
    /// The tail of a single frame (`whole` is then its head).
    tail: Bytes,
    at: usize,
    piece: usize,
    single: bool,
    kind: std::marker::PhantomData<fn() -> T>,
}

impl<T: Message> Frames<T> {
    /// The frames of `message` under a frame limit of `max_frame` bytes.
    pub fn new(message: &T, max_frame: usize) -> Frames<T> {
        if let Some((head, tail)) = Frames::split(message, max_frame) {
            return Frames {
                whole: head,
                tail,
                at: 0,
                piece: 1,
                single: true,
                kind: std::marker::PhantomData,
            };
        }
        let whole = encode(message);
        let single = whole.len() <= max_frame;
        Frames {
            whole,
            tail: Bytes::new(),
            at: 0,
            piece: PIECE.min(max_frame.saturating_sub(PIECE_OVERHEAD)).max(1),
            single,
            kind: std::marker::PhantomData,
        }
    }
}

impl<T: Message> Frames<T> {
    /// A message of one frame with a long byte field last: the body before that field's
    /// bytes (its length at the end), and the bytes.
    fn split(message: &T, max_frame: usize) -> Option<(Bytes, Bytes)> {
        let (stripped, tail) = message.tail().filter(|(_, t)| t.len() >= TAIL_AT_LEAST)?;
        let mut head = postcard::to_allocvec(&stripped).ok()?;
        // The empty field is its length, a varint 0, and comes last: it becomes the tail's.
        if head.pop() != Some(0) {
            return None;
        }
        let mut len = tail.len();
        while len >= 0x80 {
            head.push((len as u8) | 0x80);
            len >>= 7;
        }
        head.push(len as u8);
        (head.len() + tail.len() <= max_frame).then(|| (Bytes::from(head), tail))
    }
}

impl<T: Message> Iterator for Frames<T> {
    type Item = Frame;
    fn next(&mut self) -> Option<Frame> {
        if self.single {
            return (self.at == 0).then(|| {
                self.at = self.whole.len().max(1);
                Frame {
                    head: self.whole.clone(),
                    tail: self.tail.clone(),
                }
            });
        }
        if self.at >= self.whole.len() {
            return None;
        }
        let end = (self.at + self.piece).min(self.whole.len());
        let piece = T::piece(end < self.whole.len(), self.whole.slice(self.at..end));
        self.at = end;
        Some(encode(&piece).into())
    }
}

/// Puts messages sent in pieces together again, up to a limit.
#[derive(Debug)]
pub struct Assembler {
    buf: bytes::BytesMut,
    limit: usize,
    assembling: bool,
}

impl Assembler {
    /// An assembler of messages of at most `limit` bytes.
    pub fn new(limit: usize) -> Assembler {
        Assembler {
            buf: bytes::BytesMut::new(),
            limit,
            assembling: false,
        }
    }

    /// Decodes one frame: a whole message, or a piece (`None` until the last one, which
    /// gives the message the pieces make).
    ///
    /// # Errors
    ///
    /// [`Error::Malformed`] for a frame that does not decode, a whole message in the middle
    /// of a pieced one, or pieces that do not make a message; [`Error::MessageTooLarge`] for
    /// pieces over the limit (the buffer never grows past it).
    pub fn frame<T: Message>(&mut self, peer: &str, frame: Bytes) -> Result<Option<T>, Error> {
        let malformed = |reason: &str| Error::Malformed {
            peer: peer.to_owned(),
            what: T::WHAT,
            reason: reason.to_owned(),
            source: None,
        };
        let (more, bytes) = match T::decode_frame(peer, frame)?.into_piece() {
            Ok(piece) => piece,
            Err(_) if self.assembling => {
                return Err(malformed("a whole message in the middle of a pieced one"));
            }
            Err(message) => return Ok(Some(message)),
        };
        if self.buf.len() + bytes.len() > self.limit {
            self.buf = bytes::BytesMut::new();
            return Err(Error::MessageTooLarge {
                peer: peer.to_owned(),
                limit: self.limit,
            });
        }
        self.assembling = more;
        self.buf.extend_from_slice(&bytes);
        if more {
            return Ok(None);
        }
        let whole = std::mem::take(&mut self.buf).freeze();
        match T::decode_frame(peer, whole)?.into_piece() {
            Ok(_) => Err(malformed("a piece inside a pieced message")),
            Err(message) => Ok(Some(message)),
        }
    }
}

/// What failed on a worker process, in the terms the coordinator reports it to the user with:
/// the same error a local worker would give.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Failure {
    /// User code panicked: `Job::chunk` or `Chunk::step` (`input` false), or `Input::load`
    /// (`input` true).
    Panicked {
        /// Whether it was the input's loader.
        input: bool,
        /// The panic message.
        message: String,
    },
    /// The job's input did not load.
    Input {
        /// The loader's error and its causes, each on its own (outermost first).
        chain: Vec<String>,
    },
    /// The part of a partition placed on the process (`PlacePart`) could not be read from
    /// the store.
    Store {
        /// The store's error and its causes, each on its own (outermost first).
        chain: Vec<String>,
    },
    /// A value did not encode or decode.
    Codec {
        /// What it was ("a chunk state", "a chunk output", …).
        what: String,
        /// The codec's error.
        error: postcard::Error,
    },
    /// The job's `Partition::output` returned an error.
    Output {
        /// The phase whose end was being written.
        phase: u64,
        /// The hook's error and its causes, each on its own (outermost first).
        chain: Vec<String>,
    },
}

/// Encodes a message body.
pub fn encode<T: Serialize>(message: &T) -> Bytes {
    // Serializing these types into a growable buffer cannot fail.
    Bytes::from(postcard::to_allocvec(message).unwrap_or_default())
}

/// Decodes a message to a worker.
///
/// # Errors
///
/// [`Error::Malformed`] for bytes that are not one.
pub fn decode_to_worker(peer: &str, body: &[u8]) -> Result<ToWorker, Error> {
    decode(peer, "a message to a worker", body)
}

/// Decodes a message to the coordinator.
///
/// # Errors
///
/// [`Error::Malformed`] for bytes that are not one.
pub fn decode_to_coordinator(peer: &str, body: &[u8]) -> Result<ToCoordinator, Error> {
    decode(peer, "a message to the coordinator", body)
}

/// Decodes a message to a worker held in `frame`; its byte fields share `frame`'s memory.
pub(crate) fn decode_frame_to_worker(peer: &str, frame: Bytes) -> Result<ToWorker, Error> {
    with_frame(frame, |body| decode_to_worker(peer, body))
}

/// Decodes a message to the coordinator held in `frame`; its byte fields share `frame`'s
/// memory (a chunk's output or state is not copied out of the frame it came in).
pub(crate) fn decode_frame_to_coordinator(
    peer: &str,
    frame: Bytes,
) -> Result<ToCoordinator, Error> {
    with_frame(frame, |body| decode_to_coordinator(peer, body))
}

thread_local! {
    /// The frame being decoded on this thread, for [`in_frame`].
    static FRAME: std::cell::RefCell<Option<Bytes>> = const { std::cell::RefCell::new(None) };
}

/// Decodes with `decode` the body `frame` holds, with the frame at hand for [`in_frame`].
pub(super) fn with_frame<T>(frame: Bytes, decode: impl FnOnce(&[u8]) -> T) -> T {
    let body = frame.clone();
    FRAME.with_borrow_mut(|f| *f = Some(frame));
    let decoded = decode(&body);
    FRAME.with_borrow_mut(|f| *f = None);
    decoded
}

/// A byte field: a view of the frame being decoded when it lies in it (see `with_frame`),
/// else a copy.
pub(super) fn in_frame<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Bytes, D::Error> {
    struct InFrame;
    impl<'de> serde::de::Visitor<'de> for InFrame {
        type Value = Bytes;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("bytes")
        }
        fn visit_borrowed_bytes<E>(self, v: &'de [u8]) -> Result<Bytes, E> {
            Ok(FRAME.with_borrow(|frame| match frame {
                Some(f) if contains(f, v) => f.slice_ref(v),
                _ => Bytes::copy_from_slice(v),
            }))
        }
        fn visit_bytes<E>(self, v: &[u8]) -> Result<Bytes, E> {
            Ok(Bytes::copy_from_slice(v))
        }
        fn visit_byte_buf<E>(self, v: Vec<u8>) -> Result<Bytes, E> {
            Ok(Bytes::from(v))
        }
    }
    d.deserialize_bytes(InFrame)
}

fn in_frame_opt<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Bytes>, D::Error> {
    struct Field(Bytes);
    impl<'de> Deserialize<'de> for Field {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Field, D::Error> {
            in_frame(d).map(Field)
        }
    }
    Ok(Option::<Field>::deserialize(d)?.map(|f| f.0))
}

/// Whether `part` lies within `whole`'s memory (what `Bytes::slice_ref` requires).
fn contains(whole: &Bytes, part: &[u8]) -> bool {
    let (w, p) = (whole.as_ptr() as usize, part.as_ptr() as usize);
    p >= w && p + part.len() <= w + whole.len()
}

pub(crate) fn decode<'a, T: Deserialize<'a>>(
    peer: &str,
    what: &'static str,
    body: &'a [u8],
) -> Result<T, Error> {
    match postcard::take_from_bytes(body) {
        Ok((value, [])) => Ok(value),
        Ok((_, rest)) => Err(Error::Malformed {
            peer: peer.to_owned(),
            what,
            reason: format!("{} bytes after the message", rest.len()),
            source: None,
        }),
        Err(e) => Err(Error::Malformed {
            peer: peer.to_owned(),
            what,
            reason: "they do not decode".to_owned(),
            source: Some(e),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn big_done(len: usize) -> ToCoordinator {
        ToCoordinator::Done {
            slot: 3,
            chunk: 7,
            output: (0..len).map(|i| i as u8).collect::<Vec<u8>>().into(),
            halos: None,
            iterations: 1,
            busy_ns: 2,
        }
    }

    /// Both sides of a connection whose codec reuses buffers: long frames written in odd
    /// pieces (and the short ones between them) are read whole and in order, each long one
    /// into a buffer of its own, whose memory serves a later long frame once given back.
    #[test]
    fn long_frames_are_read_into_buffers_that_serve_again() {
        use futures::StreamExt;
        use tokio::io::AsyncWriteExt;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let bodies: Vec<Vec<u8>> = [200_000usize, 3, 150_000, 70_000, 0, 180_000]
                .iter()
                .enumerate()
                .map(|(k, &n)| (0..n).map(|i| (i * 7 + k) as u8).collect())
                .collect();
            let mut wire = BytesMut::new();
            for b in &bodies {
                codec(1 << 20)
                    .encode(Bytes::from(b.clone()), &mut wire)
                    .unwrap();
            }
            let (mut a, b) = tokio::io::duplex(5_003);
            let writer = tokio::spawn(async move {
                for piece in wire.chunks(9_001) {
                    a.write_all(piece).await.unwrap();
                }
            });
            let buffers = Arc::new(Buffers::new(1 << 30));
            let mut read = codec(1 << 20);
            read.reuse(Arc::clone(&buffers));
            let mut frames = tokio_util::codec::FramedRead::new(b, read);
            let mut at = Vec::new();
            for body in &bodies {
                let f = frames.next().await.unwrap().unwrap().freeze();
                assert_eq!(&f[..], &body[..]);
                at.push(f.as_ptr());
                // The first long frame goes back once read: the third one is read into it.
                if body.len() == 200_000 {
                    buffers.give(f);
                }
            }
            writer.await.unwrap();
            assert!(frames.next().await.is_none());
            let reuse = buffers.reuse();
            assert_eq!((reuse.reused, reuse.made), (1, 3), "{reuse:?}");
            // The header is in the buffer too: the frame starts 4 bytes into it.
            assert_eq!(at[2], at[0]);
            // Without `reuse`, nothing is taken from there.
            let mut plain = codec(1 << 20);
            let mut src = BytesMut::new();
            plain
                .encode(Bytes::from(vec![1u8; 100_000]), &mut src)
                .unwrap();
            assert_eq!(plain.decode(&mut src).unwrap().unwrap().len(), 100_000);
            assert_eq!(buffers.reuse().made, 3);
        });
    }

    /// Both sides: what `Frames` sends, `Assembler` gives back, whatever the frame limit.
    #[test]
    fn long_messages_cross_in_pieces() {
        for (len, max_frame) in [(10, 1024), (5000, 1024), (5000, 17), (1 << 20, 64 << 10)] {
            let msg = big_done(len);
            let frames: Vec<Bytes> = Frames::new(&msg, max_frame).map(|f| f.to_bytes()).collect();
            assert!(
                frames.iter().all(|f| f.len() <= max_frame),
                "{len}/{max_frame}"
            );
            assert_eq!(frames.len() > 1, encode(&msg).len() > max_frame);
            let mut a = Assembler::new(usize::MAX);
            let mut got = None;
            for (i, f) in frames.iter().enumerate() {
                let r = a.frame::<ToCoordinator>("peer", f.clone()).unwrap();
                assert_eq!(r.is_some(), i + 1 == frames.len());
                got = r;
            }
            assert_eq!(got.unwrap(), msg);
        }
    }

    /// A long byte field last goes as the frame's tail: the frame is the message's encoding
    /// byte for byte (the length of the tail is the varint of its length, however long),
    /// the codec writes it as one frame of that length, and the receiver decodes the
    /// message. Over the frame limit it goes in pieces, as any message.
    #[test]
    fn a_long_byte_field_last_goes_as_the_frame_s_tail() {
        use tokio_util::codec::{Decoder, Encoder};
        let state = |len: usize| Bytes::from((0..len).map(|i| (i * 7) as u8).collect::<Vec<u8>>());
        for len in [
            TAIL_AT_LEAST - 1,
            TAIL_AT_LEAST,
            200_000,
            1 << 21,
            (1 << 21) + 3,
        ] {
            for msg in [
                ToCoordinator::Surrendered {
                    chunk: 1 << 40,
                    state: state(len),
                },
                ToCoordinator::Captured {
                    slot: 7,
                    chunk: 3,
                    state: state(len),
                },
                ToCoordinator::CapturedHeld {
                    chunk: 300,
                    state: state(len),
                },
            ] {
                let frames: Vec<Frame> = Frames::new(&msg, 4 << 20).collect();
                assert_eq!(frames.len(), 1);
                let f = &frames[0];
                assert_eq!(f.tail.is_empty(), len < TAIL_AT_LEAST, "{len}");
                assert_eq!(f.to_bytes(), encode(&msg), "{len}");
                let mut c = codec(4 << 20);
                let mut buf = BytesMut::new();
                c.encode(f.clone(), &mut buf).unwrap();
                assert_eq!(buf.len(), 4 + f.len());
                let body = c.decode(&mut buf).unwrap().unwrap().freeze();
                assert!(buf.is_empty());
                assert_eq!(decode_frame_to_coordinator("peer", body).unwrap(), msg);
                // Too long for the frame limit: pieces, put together again.
                let pieces: Vec<Frame> = Frames::new(&msg, 64 << 10).collect();
                let mut a = Assembler::new(usize::MAX);
                let mut got = None;
                for p in pieces {
                    assert!(p.tail.is_empty() && p.len() <= 64 << 10);
                    got = a.frame::<ToCoordinator>("peer", p.to_bytes()).unwrap();
                }
                assert_eq!(got.unwrap(), msg);
            }
        }
        // A codec under a lower limit refuses a frame with a tail over it.
        let msg = ToCoordinator::CapturedHeld {
            chunk: 1,
            state: state(1 << 20),
        };
        let f = Frames::new(&msg, 4 << 20).next().unwrap();
        let err = codec(1 << 19).encode(f, &mut BytesMut::new()).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    }

    /// The receiver's buffer never passes its limit, whatever the pieces claim.
    #[test]
    fn pieces_over_the_limit_are_refused_before_they_are_kept() {
        let frames: Vec<Bytes> = Frames::new(&big_done(10_000), 1024)
            .map(|f| f.to_bytes())
            .collect();
        let mut a = Assembler::new(4096);
        let mut refused = None;
        for f in frames {
            match a.frame::<ToCoordinator>("peer", f) {
                Ok(_) => assert!(a.buf.len() <= 4096),
                Err(e) => {
                    refused = Some(e);
                    break;
                }
            }
        }
        assert!(matches!(
            refused,
            Some(Error::MessageTooLarge { limit: 4096, .. })
        ));
        assert!(a.buf.capacity() <= 8192, "{}", a.buf.capacity());
    }

    /// A peer that breaks the piece protocol gets `Malformed`: a whole message in the middle
    /// of a pieced one, pieces that make another piece, pieces that make nothing.
    #[test]
    fn broken_pieces_are_malformed() {
        let malformed = |r: Result<Option<ToWorker>, Error>| matches!(r, Err(Error::Malformed { what, .. }) if what == ToWorker::WHAT);
        let mut a = Assembler::new(1 << 20);
        let piece = |more, b: &[u8]| {
            encode(&ToWorker::Piece {
                more,
                bytes: Bytes::copy_from_slice(b),
            })
        };
        assert!(
            a.frame::<ToWorker>("p", piece(true, b"ab"))
                .unwrap()
                .is_none()
        );
        assert!(malformed(a.frame("p", encode(&ToWorker::Heartbeat))));
        let mut a = Assembler::new(1 << 20);
        let inner = piece(false, b"x");
        assert!(malformed(a.frame("p", piece(false, &inner))));
        let mut a = Assembler::new(1 << 20);
        assert!(malformed(a.frame("p", piece(false, &[0xff, 0xff]))));
        // After a message, an assembler starts afresh.
        let mut a = Assembler::new(1 << 20);
        let end = encode(&ToWorker::End);
        assert!(
            a.frame::<ToWorker>("p", piece(true, &end[..0]))
                .unwrap()
                .is_none()
        );
        assert_eq!(
            a.frame::<ToWorker>("p", piece(false, &end)).unwrap(),
            Some(ToWorker::End)
        );
        assert_eq!(a.frame::<ToWorker>("p", end).unwrap(), Some(ToWorker::End));
    }

    #[test]
    fn byte_fields_share_the_frame_they_came_in() {
        let output = Bytes::from(vec![7u8; 4096]);
        let done = ToCoordinator::Done {
            slot: 1,
            chunk: 2,
            output: output.clone(),
            halos: None,
            iterations: 3,
            busy_ns: 4,
        };
        let frame = encode(&done);
        let decoded = decode_frame_to_coordinator("peer", frame.clone()).unwrap();
        assert_eq!(decoded, done);
        let ToCoordinator::Done { output: shared, .. } = decoded else {
            unreachable!()
        };
        assert!(contains(&frame, &shared), "the output was copied");
        // From a plain slice (no frame): a copy, equal.
        assert_eq!(decode_to_coordinator("peer", &frame).unwrap(), done);

        let run = ToWorker::Run {
            slot: 0,
            chunk: 9,
            start: 0,
            end: 10,
            state: Some(output),
            held: false,
            then: Vec::new(),
        };
        let frame = encode(&run);
        let decoded = decode_frame_to_worker("peer", frame.clone()).unwrap();
        assert_eq!(decoded, run);
        let ToWorker::Run {
            state: Some(shared),
            ..
        } = decoded
        else {
            unreachable!()
        };
        assert!(contains(&frame, &shared), "the state was copied");
        let none = ToWorker::Run {
            slot: 0,
            chunk: 9,
            start: 0,
            end: 10,
            state: None,
            held: false,
            then: Vec::new(),
        };
        assert_eq!(decode_frame_to_worker("peer", encode(&none)).unwrap(), none);
    }
}
