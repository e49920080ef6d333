//! The worker process's side of the protocol as a pure machine: events in, orders out. No
//! sockets, no channels, no tasks, no clock; the I/O task (`io.rs`) is its pump.
//!
//! # Events and orders
//!
//! The pump hands the machine what happened ([`Machine::received`]: a frame from the
//! coordinator, whole messages decoded as [`ToWorker`]; [`Machine::reported`]: a slot's
//! thread reports a chunk `Done`, `Yielded`, `Captured`, `Abandoned`, …;
//! [`Machine::checked`], [`Machine::stored`], [`Machine::placed`]: a background store
//! operation or placement ended; [`Machine::answer`]: the job's code answered;
//! [`Machine::tick`]: the time, passed in as an [`Instant`]; [`Machine::leave`]: a stop
//! request), then polls
//! [`Machine::poll`] for what to do, in the order it was decided ([`Out`]): messages for the
//! coordinator, messages for the slots' threads, store operations and placements to start,
//! work for the job's own code, and the end.
//!
//! The machine works on bytes and never runs the job's code (decoding the job value or a
//! halo, `begin_phase`, encoding a held partition, decoding a placed one): that code may
//! panic or take long, and needs the job's types, which would make the machine generic and
//! its tests need a job. The pump runs it when the machine asks ([`Out::Code`], whose answer
//! the pump hands back through [`Machine::answer`] before it gives the machine anything else;
//! [`Out::Place`], in the background) and holds what it makes (the job value, the held
//! partitions, their spares). So every decision of the protocol is here and can be tested by
//! feeding events: which slots are live, which chunks' partitions are here and which halos are
//! kept for them (`halos.rs`), which answers wait behind which writes, when the coordinator is
//! given up, when this process leaves and ends.
//!
//! # The protocol it implements (steps of `mod.rs`)
//!
//! 1. *Messages from the coordinator are taken one at a time, in the order they came.* A
//!    message is finished before the next is taken: at once, or when the job's code answered
//!    it ([`Out::Code`]), or, for a message about a partition being placed here (`Run` of a
//!    held partition, `Begin`, `Surrender`, `CaptureHeld`, `Output`, `Place`, `PlacePart`),
//!    once that placement ended ([`Machine::placed`]). Until then later messages wait in
//!    `inbox`. (An `Output`, when the job finished, runs the job's `Partition::output` here
//!    in the pump: the coordinator waits for it anyway, and no chunk runs any more.)
//!    Messages from the threads and background outcomes are not held up meanwhile: they are
//!    about other chunks (a chunk whose message waits was not handed to a thread yet), so
//!    taking them earlier is one of the orders the process could have seen them in anyway.
//!    (Waiting for the placement with everything else stopped would stop the heartbeats,
//!    and the lease with them.)
//! 2. *Halos.* Before a message waits for a placement, the [`Keeper`] notes the partitions it
//!    brings and gives back the halos a `Begin` names as kept (as the I/O loop did on reading
//!    it); every message for the coordinator passes the keeper in the order it is polled,
//!    which is the order it reaches the wire, so "a kept halo is where its partition is, until
//!    `Released` says otherwise" (`halos.rs`) holds.
//! 3. *Slots.* A `Run`, `Interrupt`, `Capture` or `Abandon` goes to the thread of a live slot
//!    ([`Out::Thread`]); a slot that is not live, a run before the job value or of an empty
//!    range, ends the process ([`Error::Rejected`]). `Release` takes a slot out; a thread
//!    whose slots are all out is closed ([`Out::Close`]). A `Run` with a grant
//!    (`Run::then`) gives the slot's thread one granted partition at a time, the next when
//!    it reports the last, so that `Recall`, `Interrupt`, `Abandon` and a `Capture` of one
//!    not started are answered here at once, whatever the thread does; while granted
//!    runs, or runs of partitions held here, are out, the `Done`s wait and go in one
//!    `Batch` with the last, or ahead of any other message (a heartbeat at the latest), so
//!    the wire's order is the order they were decided in. A `Batch` from the coordinator is
//!    taken message by message.
//! 4. *Parts* (step 7 of `mod.rs`). Once the offered store checked out ([`Out::Check`],
//!    [`Machine::checked`]), a state captured for a snapshot is written by this process
//!    ([`Out::Put`]) and answered by its reference; a write that fails sends the bytes and
//!    stops the writes. See "Order of the answers about a held partition" below.
//! 5. *Lease and heartbeats.* Every frame received re-arms the lease (pieces included; this
//!    process's own heartbeats, its threads and its background work prove nothing about the
//!    coordinator). [`Machine::tick`] at or after the lease's end ends the process with
//!    [`Error::LeaseExpired`], never before; a heartbeat goes at once and then every period.
//! 6. *Leave and end.* A stop request sends `Leave` once; `End` ends with whether the process
//!    left; a message the protocol does not allow ends it with its error (and an
//!    undecodable job value or halo tells the coordinator first,
//!    [`ToCoordinator::Undecodable`]).
//!    After the end the machine takes nothing more.
//! 7. *Peers* (protocol 20, [`peer`](crate::wire::peer)). With a roster (`Peers`: this
//!    process's number, the run's session and generation, peers' addresses, and which
//!    process holds the partitions this one sends halos to), a `Done`'s halo for a partition
//!    held by another process is pushed there ([`Out::Peer`]) instead of going up. The `Done`
//!    waits until every push is answered ([`Machine::peer_answered`]): one the peer keeps is
//!    reported as [`Halo::KeptAt`] that peer, one it refuses goes up as bytes after all; so
//!    does every push to a peer whose link is down ([`Machine::peer_down`]), which the
//!    coordinator is told (`Unreachable`) and which gets no more pushes until the
//!    coordinator offers it again (its address, in a later roster). Every message behind a waiting `Done` waits too, so the
//!    wire's order is the order they were decided in (a heartbeat goes past: it is about no
//!    chunk). A halo a peer pushes here ([`Machine::peer_received`]) is kept if its
//!    partition is here, it is of this phase or the next, and its generation is this one
//!    ([`Keeper::accept`]); the answer says whether ([`Out::Answer`]).
//!
//! # Order of the answers about a held partition
//!
//! The coordinator matches an answer to a `CaptureHeld` with the latest one it asked of
//! this process for that chunk, which is right only if the partition did not change in
//! between: it holds when the answers about one partition reach it in the order they were
//! asked, each before anything later about that partition (the `Done` of its next run, its
//! `Surrendered`), as when the answer was made at once. A write in the background would let
//! those overtake it, so while a held partition's part is written, every message about that
//! chunk waits behind it (`behind`) and goes, in order, once the write ends; other chunks'
//! messages go at once. The partition's bytes are taken when the capture is asked, so its
//! next run is not held up (its `Done` is).
//!
//! The same holds for a running chunk's capture (`Capture`, answered by `CapturedPart`),
//! whose answers the coordinator matches to its requests of that slot and chunk first in
//! first out: a capture asked before a rollback and one asked after it, written in the
//! background and ending in the other order, gave the new cut the old run's state.
//!
//! # Why no answer is lost or doubled
//!
//! Each message from the coordinator gives at most one [`Out::Code`] and is finished by its
//! one answer; each [`Out::Put`] and [`Out::Place`] is ended by one outcome, which sends one
//! message (and releases what waited behind a held write), but for the placements a `Forget`
//! drops with the partitions they were for; each thread's message is routed once. Nothing
//! else is dropped but on the end, when nobody waits for it.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::schedule::idhash::{IdMap, IdSet};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::halos::Keeper;
use crate::snapshot::{PartRef, Store};
use crate::wire::Error;
use crate::wire::buffers::Buffers;
use crate::wire::frame::{Failure, Halo, SLOTS_PER_THREAD, ToCoordinator, ToWorker};
use crate::wire::peer::{FromPeer, ToPeer};

/// What the machine asks of its pump, in the order it decided it.
#[derive(Debug)]
pub(super) enum Out {
    /// A message for the coordinator. Messages go in the order polled; the pump may send
    /// several with one flush.
    Send(ToCoordinator),
    /// A message for the thread at this index (a `Run` is queued; the others also raise the
    /// thread's flag).
    Thread(usize, ToThread),
    /// Close the queue of the thread at this index: all its slots were released.
    Close(usize),
    /// Work for the job's own code, done by the pump at once: its answer goes back through
    /// [`Machine::answer`] before anything else goes to the machine.
    Code(Code),
    /// Place a partition here in the background (read it if it is a part, decode it, export
    /// its halos if asked); the outcome goes back through [`Machine::placed`].
    Place(Place),
    /// Drop the partitions held here (the job rolled back; they are the spares the restored
    /// ones are decoded into) and the placements under way.
    Forget,
    /// Check an offered store in the background; the outcome goes back through
    /// [`Machine::checked`].
    Check(Check),
    /// Write a snapshot part in the background; the outcome goes back through
    /// [`Machine::stored`].
    Put(Put),
    /// Replay lost partitions from their buddy copies in the background (local recovery);
    /// the outcome goes back through [`Machine::replayed`].
    Replay(super::replay::Replay),
    /// A frame for peer process `to`, listening at `addr` (dialled if no link is up).
    Peer {
        /// The peer's number.
        to: u64,
        /// Its listener.
        addr: String,
        /// The frame.
        msg: ToPeer,
    },
    /// An answer for peer process `to`, on the link it dialled.
    Answer {
        /// The peer's number.
        to: u64,
        /// The frame.
        msg: FromPeer,
    },
    /// End the link peer process `to` dialled: it broke the peer protocol (a halo for a
    /// chunk the job does not have).
    HangUp {
        /// The peer's number.
        to: u64,
    },
    /// This process's number and the run's session, from the roster (the pump's peer
    /// links use them; links of another session end).
    Roster {
        /// This process's number.
        me: u64,
        /// The run's session.
        session: [u8; 16],
    },
    /// The end: `tell` the coordinator if there is something to tell (its write may fail),
    /// and end with `result` (whether the process left on a stop request).
    End {
        /// A last message for the coordinator.
        tell: Option<ToCoordinator>,
        /// What the I/O loop returns.
        result: Result<bool, Error>,
    },
}

/// A message for a slot's thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum ToThread {
    /// Run `chunk` in `slot` (with the pump's job value of `phase`).
    Run {
        slot: u32,
        chunk: u64,
        range: std::ops::Range<u64>,
        state: Option<Bytes>,
        /// Run the partition held here for `chunk`.
        held: bool,
        phase: u64,
    },
    Interrupt {
        slot: u32,
        chunk: u64,
    },
    Capture {
        slot: u32,
        chunk: u64,
    },
    Abandon {
        slot: u32,
        chunk: u64,
    },
}

/// Work for the job's own code. Its answer: `Ok(None)` when there is nothing to tell the
/// coordinator, `Ok(Some(message))` for its answer, `Err` when the process must end (bytes of
/// the job's types that do not decode).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Code {
    /// Decode the job value of `phase` (of `chunks` chunks); it is the job value from now
    /// on.
    Phase { phase: u64, chunks: u64, job: Bytes },
    /// Decode the pieces of an allgather (each with its sender, in chunk order), once for
    /// every partition here that begins the phase with them; answered by nothing. Until the
    /// next `Phase`.
    Gathered { pieces: Vec<(u64, Bytes)> },
    /// Decode these halos (each with its sender, in chunk order; `None`: the sender's piece
    /// of the phase's `Gathered`) and begin the phase of the partition held for `chunk`;
    /// answered by nothing, `Missing` or `FailedHeld`. The restored phase ended: the spares
    /// go.
    Begin {
        chunk: u64,
        halos: Vec<(u64, Option<Bytes>)>,
    },
    /// Encode the partition held for `chunk` (and drop it if `surrender`); answered by
    /// `Surrendered`, `CapturedHeld`, `Missing` or `FailedHeld`.
    Held { chunk: u64, surrender: bool },
    /// Hand the partition held for `chunk` to the job's `Partition::output` for `phase`
    /// (the job finished); answered by `OutputDone`, `Missing` or `FailedHeld`.
    Output { chunk: u64, phase: u64 },
}

/// Where a placed partition's bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Source {
    /// In the `Place`.
    Sent(Bytes),
    /// A part in the job's store (`PlacePart`).
    Part(PartRef),
}

/// A partition to place here.
#[derive(Debug, Clone)]
pub(super) struct Place {
    pub(super) chunk: u64,
    pub(super) from: Source,
    /// Export its halos once decoded, answered by `Exported` with this placement number.
    pub(super) export: Option<u64>,
    /// The store this process writes to, if it is shown to be usable: a part is read there.
    pub(super) store: Option<Store>,
}

/// The halos a placed partition exported (asked by its placement's `export`), addressed as
/// in `Done`, with the placement number they answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Exported {
    pub(super) placement: u64,
    pub(super) halos: Vec<(Option<u64>, Bytes)>,
}

/// An offered store, to check: it is the coordinator's if snapshot `epoch` of `job_id` is
/// there with the same creation time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Check {
    pub(super) url: String,
    pub(super) options: Vec<(String, String)>,
    pub(super) job_id: String,
    pub(super) epoch: u64,
    pub(super) created_unix_ms: u64,
}

/// A snapshot part to write: `state` of `chunk` in epoch folder `folder`. Handed back with
/// its outcome ([`Machine::stored`]), so a failed write sends the bytes.
#[derive(Debug, Clone)]
pub(super) struct Put {
    pub(super) store: Store,
    pub(super) job_id: String,
    pub(super) folder: u64,
    pub(super) phase: u64,
    pub(super) chunk: u64,
    pub(super) state: Bytes,
    /// The slot of a running chunk's capture (`Capture`); `None` for a held partition's
    /// (`CaptureHeld`).
    pub(super) slot: Option<u32>,
}

/// Why an offered store is not used by this process (its states then go to the coordinator).
#[derive(Debug, thiserror::Error)]
pub(super) enum Unusable {
    /// The URL does not open here (no credentials, an option this build does not know, …).
    #[error("the store does not open from this process")]
    Open(#[source] crate::snapshot::Error),
    /// The witness snapshot cannot be read here (another disk, wrong credentials, …).
    #[error("the coordinator's latest snapshot cannot be read from this process")]
    Read(#[source] crate::snapshot::Error),
    /// The witness is there but was written at another time: another store of the same name.
    #[error("snapshot {id} in {url} is not the coordinator's (created at another time)")]
    Another {
        id: crate::snapshot::SnapshotId,
        url: String,
    },
}

/// What the machine is told at its start.
#[derive(Debug, Clone)]
pub(super) struct Config {
    /// The coordinator's address, for errors and logs.
    pub(super) peer: String,
    /// Heartbeats go this often.
    pub(super) heartbeat: Duration,
    /// The coordinator is given up after this long without a frame from it.
    pub(super) lease: Duration,
    /// The notice this process gives when it leaves (`Leave`'s `grace_ms`).
    pub(super) grace: Option<Duration>,
    /// The job has owned partitions.
    pub(super) partitioned: bool,
    /// Compute threads, each with [`SLOTS_PER_THREAD`] slots.
    pub(super) threads: usize,
    /// Whether this process pushes halos to its peers (and takes theirs): without, a
    /// roster is taken for nothing, and every halo goes through the coordinator.
    pub(super) direct: bool,
    /// The most bytes of buddy copies this process keeps for its peers (`ToPeer::Copy`): a
    /// copy past it is refused.
    pub(super) copy_memory: u64,
    /// The process's buffers kept for reuse: a buddy copy's memory goes back there when
    /// the copy is dropped (the next round's copies are read into it).
    pub(super) buffers: Arc<Buffers>,
}

/// A message about a chunk waiting behind the write of that chunk's part: the
/// message, the epoch folder of the capture it answers (if it does), and the phase.
type Behind = (ToCoordinator, Option<u64>, Option<u64>);

/// Why the machine takes no message from the coordinator for now.
#[derive(Debug)]
enum Blocked {
    /// The job's code works on a message ([`Out::Code`]); its answer, if it is a held
    /// partition's capture, is for this epoch folder, or, with `slot`, the capture of a
    /// chunk granted to that slot and not started (answered as `Captured`).
    Code {
        held_folder: Option<u64>,
        slot: Option<u32>,
    },
    /// This message (the keeper saw it) is about a partition being placed here.
    Placing(ToWorker),
    /// The job's code encodes a partition for buddy copy round `round`; the round's other
    /// partitions follow (`Machine::copying`).
    Copy { round: u64 },
}

/// The worker process's protocol state (see the module docs).
#[derive(Debug)]
pub(super) struct Machine {
    config: Config,
    /// Which slots of each thread are still workers of the job; a thread with none is
    /// closed.
    live: Vec<[bool; SLOTS_PER_THREAD as usize]>,
    /// The phase of the job value the pump holds, once one came, and the job's number of
    /// chunks then.
    phase: Option<u64>,
    chunks: Option<u64>,
    /// The senders of the pieces the phase's `Gathered` brought (an allgather's), in chunk
    /// order: a `Begin` may name only these ([`Halo::Gathered`]). Emptied by each `Phase`.
    gathered: Vec<u64>,
    /// This process asked to leave.
    left: bool,
    /// The end was decided: nothing more is taken.
    ended: bool,
    /// When the coordinator is given up, unless a frame comes first.
    lease_ends: Instant,
    /// When the next heartbeat goes.
    next_beat: Instant,
    /// The partitions here and the halos kept for them.
    keeper: Keeper,
    /// Granted runs (`Run::then`) handed to the threads and not reported yet, by chunk:
    /// while there are any, the `Done`s of this phase wait in `dones` and go together.
    granted: IdSet<u64>,
    /// Runs of partitions held here (`Run` with `held`, each slot's first) handed to the
    /// threads and not reported yet: the `Done`s wait for them too (and for the `Done`s
    /// behind them that wait for their pushes' answers), so that a process whose
    /// slots hold one partition each (4 partitions on a thread of 4 slots) still sends one
    /// message a phase, not one per partition. (A run of a partition made or sent here, in
    /// a first phase or after a move, is not waited for: the coordinator deals those one at
    /// a time and needs each `Done` to deal the next.)
    running: IdMap<u64, u32>,
    /// Each slot's grant (`Run::then`), by slot: its thread gets one chunk at a time, the
    /// next when it reports the last, so that a grant can be given back (`Returned`) at
    /// once, whatever the thread is doing.
    grants: IdMap<u32, Grant>,
    /// `Done`s held back while granted runs are out: they go in one `Batch` when the last
    /// granted run is reported, or before any other message (the order on the wire is the
    /// order they were decided in), or with the next heartbeat at the latest.
    dones: Vec<ToCoordinator>,
    /// The store this process writes parts to and the job's id there, once the witness was
    /// read there.
    store: Option<(Store, String)>,
    /// A check of an offered store is under way.
    checking: bool,
    /// The epoch folder of each requested capture of a running chunk, by slot and chunk.
    folders: IdMap<(u32, u64), u64>,
    /// Chunks whose part (a held partition's or a running chunk's capture) is being
    /// written, with the messages about that chunk that wait for the write, oldest first.
    behind: IdMap<u64, VecDeque<Behind>>,
    /// Placements under way, by chunk.
    placing: IdMap<u64, usize>,
    /// Messages from the coordinator not taken yet (step 1).
    inbox: VecDeque<ToWorker>,
    blocked: Option<Blocked>,
    out: VecDeque<Out>,
    parts_written: u64,
    parts_sent: u64,
    /// The peer data plane, once a roster came.
    peering: Option<Peering>,
    /// Messages for the coordinator that wait for the answers to a `Done`'s pushes, in
    /// order: the first waits for `pending` answers, the others for it.
    waiting: VecDeque<Waiting>,
    /// Numbers messages in `waiting`.
    next_waiting: u64,
    /// Halos pushed to peers and not answered yet, by their number.
    pushes: IdMap<u64, Push>,
    /// Numbers pushes.
    next_push: u64,
    /// What the peer data plane did, for the process's report.
    peer_counts: PeerCounts,
    /// Buddy copies this process keeps for its peers, by chunk: the phase each partition
    /// ended and its bytes; and their bytes in all.
    copies: IdMap<u64, (u64, Bytes)>,
    /// The copy each newer one replaced, until the coordinator says the newer one is
    /// recorded (`DropCopies`): a process lost in the middle of a round has the older one
    /// replayed, whose round the coordinator knows.
    previous: IdMap<u64, (u64, Bytes)>,
    copy_bytes: u64,
    /// Buddy copy rounds (`Copy`) not answered yet, by number.
    rounds: IdMap<u64, Round>,
    /// Numbers rounds.
    next_round: u64,
    /// The partitions of the round being encoded that the job's code has not encoded yet.
    copying: VecDeque<u64>,
    /// The halo log (`Logs`): from which phase on the exports of the partitions here are
    /// kept, if asked; each `Done`'s halos as it was sent, `(phase, chunk, halos)`, oldest
    /// first; and their bytes.
    logging: Option<u64>,
    log: VecDeque<Logged>,
    log_bytes: u64,
    /// Replays under way (`Recover`), by attempt, with the phase of the copies each
    /// replays from: a `Forget` drops them, and their outcome with them.
    replaying: IdMap<u64, u64>,
}

/// A record of the halo log: the phase, the partition (chunk) that exported, and its halos
/// as it sent them, each with the chunk it is for.
pub(super) type Logged = crate::wire::frame::LogRecord;

/// A buddy copy round (`ToWorker::Copy`): the partitions encoded are pushed to the buddy;
/// when every push is answered (and every partition encoded), `Copied` goes.
#[derive(Debug)]
struct Round {
    phase: u64,
    generation: u64,
    buddy: u64,
    addr: String,
    /// Pushes not answered yet.
    pending: usize,
    /// Partitions still to encode.
    encoding: bool,
    copied: Vec<(u64, u64)>,
    refused: Vec<u64>,
}

/// The roster of the peer data plane (`ToWorker::Peers`).
#[derive(Debug)]
struct Peering {
    me: u64,
    session: [u8; 16],
    /// `None` between a rollback (`Forget`) and the roster of the new generation: nothing
    /// is pushed or accepted then.
    generation: Option<u64>,
    addrs: IdMap<u64, String>,
    /// Which process holds the partition of each chunk, as far as this process was told.
    holders: IdMap<u64, u64>,
    /// Peers whose link went down, until the coordinator offers them again (their halos go
    /// up meanwhile).
    down: IdSet<u64>,
}

/// A message for the coordinator held back in `Machine::waiting`.
#[derive(Debug)]
struct Waiting {
    id: u64,
    msg: ToCoordinator,
    pending: usize,
}

/// A frame pushed to a peer, not answered yet.
#[derive(Debug)]
struct Push {
    peer: u64,
    what: Pushed,
}

/// What a [`Push`] carried.
#[derive(Debug)]
enum Pushed {
    /// A halo: the `Done` it belongs to (`Waiting::id`), its index among the `Done`'s
    /// halos, and its bytes (sent up if the push fails).
    Halo {
        waiting: u64,
        index: usize,
        bytes: Bytes,
    },
    /// A buddy copy of `chunk`, of `len` bytes, for round `round`.
    Copy { round: u64, chunk: u64, len: u64 },
}

/// What the peer data plane did in this process.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct PeerCounts {
    /// Halos pushed to peers, their bytes, and how many of them they kept.
    pub(super) pushed: u64,
    pub(super) bytes_pushed: u64,
    pub(super) kept: u64,
    /// Halos pushed here by peers, and how many were kept.
    pub(super) received: u64,
    pub(super) accepted: u64,
    /// Halos sent up after all because their peer's link was down.
    pub(super) unreachable: u64,
    /// Links of peers that broke the peer protocol, ended here.
    pub(super) refused_links: u64,
    /// Handshakes of strangers refused by this process's listener (filled by the pump, at
    /// most the 256 it remembers).
    pub(super) refused_handshakes: u64,
    /// Buddy copies of partitions held here pushed to peers, their bytes, and how many of
    /// them the buddy kept.
    pub(super) copies_pushed: u64,
    pub(super) copy_bytes_pushed: u64,
    pub(super) copies_kept: u64,
    /// Buddy copies peers pushed here, and how many were kept.
    pub(super) copies_received: u64,
    pub(super) copies_accepted: u64,
    /// What the links did with copies shared through memory (filled by the pump).
    pub(super) shared: super::peers::SharedCounts,
}

impl Machine {
    /// A machine started at `now` (the lease runs from then; the first heartbeat is due).
    pub(super) fn new(config: Config, now: Instant) -> Machine {
        Machine {
            live: vec![[true; SLOTS_PER_THREAD as usize]; config.threads],
            lease_ends: now + config.lease,
            next_beat: now,
            config,
            phase: None,
            chunks: None,
            gathered: Vec::new(),
            left: false,
            ended: false,
            keeper: Keeper::default(),
            granted: IdSet::default(),
            running: IdMap::default(),
            grants: IdMap::default(),
            dones: Vec::new(),
            store: None,
            checking: false,
            folders: IdMap::default(),
            behind: IdMap::default(),
            placing: IdMap::default(),
            inbox: VecDeque::new(),
            blocked: None,
            out: VecDeque::new(),
            parts_written: 0,
            parts_sent: 0,
            peering: None,
            waiting: VecDeque::new(),
            next_waiting: 0,
            pushes: IdMap::default(),
            next_push: 0,
            peer_counts: PeerCounts::default(),
            copies: IdMap::default(),
            previous: IdMap::default(),
            copy_bytes: 0,
            rounds: IdMap::default(),
            next_round: 0,
            copying: VecDeque::new(),
            logging: None,
            log: VecDeque::new(),
            log_bytes: 0,
            replaying: IdMap::default(),
        }
    }

    /// Whether a replay (`Recover`) of this attempt is under way (not dropped by a `Forget`).
    pub(super) fn is_replaying(&self, attempt: u64) -> bool {
        self.replaying.contains_key(&attempt)
    }

    /// A replay (`Recover`) ended: its partitions are held here (the pump holds them) and
    /// each is reported (`Replayed`, with what it exported), or why it could not be replayed
    /// (`ReplayFailed`). One a `Forget` dropped is dropped.
    pub(super) fn replayed(
        &mut self,
        attempt: u64,
        outcome: Result<Vec<(u64, super::replay::Pieces, super::replay::Exports)>, String>,
    ) {
        let Some(copy_phase) = self.replaying.remove(&attempt).filter(|_| !self.ended) else {
            return;
        };
        match outcome {
            Ok(parts) => {
                for (chunk, halos, exports) in parts {
                    self.log_replayed(chunk, exports);
                    self.keeper.replayed(chunk);
                    self.send(ToCoordinator::Replayed {
                        attempt,
                        chunk,
                        copy_phase,
                        halos,
                    });
                }
            }
            Err(reason) => {
                tracing::warn!(attempt, %reason, "a replay of lost partitions failed");
                self.send(ToCoordinator::ReplayFailed { attempt, reason });
            }
        }
    }

    /// What partition `chunk` exported in the phases it was replayed through here goes into
    /// the halo log, in phase order, as if it had run them here: the coordinator counts its
    /// log as this process's from the copy's phase on (`Buddies::replayed`). The log's
    /// records of the phases it keeps only.
    fn log_replayed(&mut self, chunk: u64, exports: super::replay::Exports) {
        let Some(from) = self.logging else {
            return;
        };
        for (phase, pieces) in exports.into_iter().filter(|(p, _)| *p >= from) {
            self.log_bytes += pieces.iter().map(|(_, b)| b.len() as u64).sum::<u64>();
            let at = self.log.partition_point(|(p, ..)| *p <= phase);
            self.log.insert(at, (phase, chunk, pieces));
        }
    }

    /// The halo log: the exports kept, `(phase, chunk, halos)`, oldest first, their bytes,
    /// and the first phase it keeps.
    pub(super) fn log(&self) -> (&VecDeque<Logged>, u64, Option<u64>) {
        (&self.log, self.log_bytes, self.logging)
    }

    /// Partition `chunk` leaves this process: the records of the halo log it exported here
    /// go along (`LogOf`, right before the message that hands it back) and leave the log,
    /// so that a neighbour's replay finds them in the coordinator's log whatever becomes of
    /// this process. `None` if it exported none here.
    fn log_of_leaving(&mut self, chunk: u64) -> Option<ToCoordinator> {
        if !self.log.iter().any(|(_, c, _)| *c == chunk) {
            return None;
        }
        let (records, kept): (VecDeque<Logged>, VecDeque<Logged>) = std::mem::take(&mut self.log)
            .into_iter()
            .partition(|(_, c, _)| *c == chunk);
        self.log = kept;
        let bytes: u64 = records
            .iter()
            .flat_map(|(_, _, h)| h.iter().map(|(_, b)| b.len() as u64))
            .sum();
        self.log_bytes -= bytes;
        Some(ToCoordinator::LogOf {
            chunk,
            records: records.into(),
        })
    }

    /// The halo log keeps the exports of phase `from` and later.
    fn trim_log(&mut self, from: u64) {
        self.logging = Some(from);
        while self.log.front().is_some_and(|(p, ..)| *p < from) {
            let (_, _, halos) = self.log.pop_front().expect("checked");
            self.log_bytes -= halos.iter().map(|(_, b)| b.len() as u64).sum::<u64>();
        }
    }

    /// The buddy copy of `chunk` this process keeps for a peer: its phase and bytes.
    #[cfg_attr(not(any(test, feature = "sim")), allow(dead_code))]
    pub(super) fn copy_of(&self, chunk: u64) -> Option<(u64, Bytes)> {
        self.copies.get(&chunk).cloned()
    }

    /// The buddy copies this process keeps for its peers: how many, and their bytes.
    pub(super) fn copies(&self) -> (usize, u64) {
        (self.copies.len() + self.previous.len(), self.copy_bytes)
    }

    /// The copy of `chunk` of `phase` kept here, the newest or the one it replaced.
    fn copy_at(&self, chunk: u64, phase: u64) -> Option<&Bytes> {
        [self.copies.get(&chunk), self.previous.get(&chunk)]
            .into_iter()
            .flatten()
            .find(|(p, _)| *p == phase)
            .map(|(_, b)| b)
    }

    /// The phase a replay of `chunks` (a `Recover`'s) starts from: the copies' phase the
    /// coordinator named, if they are all here (or sent along); else the newest phase
    /// before `phase` of which this process keeps a copy of every one of them, if none was
    /// sent along (the replay runs all from one phase). Such a newer copy came in a round
    /// whose answer the coordinator never had (its owner was lost before it answered, or
    /// the buddy's acknowledgement was lost): the copy it knew of was dropped when the
    /// second newer one came, as a buddy keeps two. The replay from it runs the phases
    /// since, a subset of those whose job values and pieces the `Recover` carries, and
    /// says which phase it started from (`Replayed::copy_phase`).
    fn replay_from(
        &self,
        chunks: &[(u64, u64, u64, bool)],
        copy_phase: u64,
        phase: u64,
        sent: &IdMap<u64, Bytes>,
    ) -> u64 {
        let here = |p: u64| {
            chunks
                .iter()
                .all(|c| sent.contains_key(&c.0) || self.copy_at(c.0, p).is_some())
        };
        if here(copy_phase) || !sent.is_empty() {
            return copy_phase;
        }
        let Some(&(first, ..)) = chunks.first() else {
            return copy_phase;
        };
        let mut newer: Vec<u64> = [self.copies.get(&first), self.previous.get(&first)]
            .into_iter()
            .flatten()
            .map(|(p, _)| *p)
            .filter(|&p| p > copy_phase && p < phase)
            .collect();
        newer.sort_unstable_by(|a, b| b.cmp(a));
        newer.into_iter().find(|&p| here(p)).unwrap_or(copy_phase)
    }

    /// What the peer data plane did so far.
    pub(super) fn peer_counts(&self) -> PeerCounts {
        self.peer_counts
    }

    /// This process accepts halos from its peers at `addr`: the coordinator is told.
    pub(super) fn listening(&mut self, addr: String) {
        if !self.ended {
            self.send(ToCoordinator::Listening { addr });
        }
    }

    /// A frame from peer process `from`, on the link it dialled: a pushed halo is kept or
    /// refused, and answered.
    pub(super) fn peer_received(&mut self, from: u64, msg: ToPeer) {
        if self.ended {
            return;
        }
        let (seq, generation, phase, sender, to, bytes) = match msg {
            ToPeer::Halo {
                seq,
                generation,
                phase,
                from,
                to,
                bytes,
            } => (seq, generation, phase, from, to, bytes),
            ToPeer::Copy {
                seq,
                generation,
                phase,
                chunk,
                bytes,
            } => return self.copy_received(from, seq, generation, phase, chunk, bytes),
            // A shared copy is mapped, or answered, by its link (`worker/peers.rs`).
            ToPeer::Heartbeat | ToPeer::Piece { .. } | ToPeer::SharedCopy { .. } => return,
        };
        self.peer_counts.received += 1;
        if self.chunks.is_some_and(|n| sender >= n || to >= n) {
            tracing::warn!(
                peer = from,
                from = sender,
                to,
                "a peer pushed a halo between chunks the job does not have: its link ends"
            );
            self.peer_counts.refused_links += 1;
            return self.out.push_back(Out::HangUp { to: from });
        }
        let current = self.peering.as_ref().and_then(|p| p.generation);
        let kept = self.config.partitioned
            && current == Some(generation)
            && self
                .phase
                .is_some_and(|p| phase == p || Some(phase) == p.checked_add(1))
            && self.keeper.accept(to, phase, sender, bytes);
        if kept {
            self.peer_counts.accepted += 1;
        } else {
            tracing::debug!(
                peer = from,
                to,
                phase,
                generation,
                "a pushed halo is refused"
            );
        }
        self.out.push_back(Out::Answer {
            to: from,
            msg: FromPeer::Ack { seq, kept },
        });
    }

    /// A buddy copy peer process `from` pushed here: kept (replacing an older copy of its
    /// chunk) if it is of this generation, of a chunk the job has and that is not held here,
    /// and within the memory for copies; answered either way.
    fn copy_received(
        &mut self,
        from: u64,
        seq: u64,
        generation: u64,
        phase: u64,
        chunk: u64,
        bytes: Bytes,
    ) {
        self.peer_counts.copies_received += 1;
        if self.chunks.is_some_and(|n| chunk >= n) {
            tracing::warn!(
                peer = from,
                chunk,
                "a peer pushed a copy of a chunk the job does not have: its link ends"
            );
            self.peer_counts.refused_links += 1;
            return self.out.push_back(Out::HangUp { to: from });
        }
        let current = self.peering.as_ref().and_then(|p| p.generation);
        let len = |c: Option<&(u64, Bytes)>| c.map_or(0, |(_, b)| b.len() as u64);
        // A newer copy sends the current one to `previous` (and the one there goes); one of
        // the same phase replaces it.
        let same = self.copies.get(&chunk).is_some_and(|(p, _)| *p == phase);
        let freed = if same {
            len(self.copies.get(&chunk))
        } else {
            len(self.previous.get(&chunk))
        };
        let fits = self.copy_bytes - freed + bytes.len() as u64 <= self.config.copy_memory;
        let newer = self.copies.get(&chunk).is_none_or(|(p, _)| *p <= phase);
        let kept = self.config.partitioned
            && current == Some(generation)
            && !self.keeper.is_here(chunk)
            && newer
            && fits;
        if kept {
            self.copy_bytes = self.copy_bytes - freed + bytes.len() as u64;
            if let Some(old) = self.copies.insert(chunk, (phase, bytes)) {
                let gone = if same {
                    Some(old)
                } else {
                    self.previous.insert(chunk, old)
                };
                if let Some((_, b)) = gone {
                    self.config.buffers.give(b);
                }
            }
            self.peer_counts.copies_accepted += 1;
        } else {
            tracing::debug!(
                peer = from,
                chunk,
                phase,
                generation,
                fits,
                "a buddy copy is refused"
            );
        }
        self.out.push_back(Out::Answer {
            to: from,
            msg: FromPeer::Ack { seq, kept },
        });
    }

    /// Drops every buddy copy kept here; their memory goes back to the kept buffers.
    fn drop_copies_all(&mut self) {
        for (_, (_, b)) in self.copies.drain().chain(self.previous.drain()) {
            self.config.buffers.give(b);
        }
        self.copy_bytes = 0;
    }

    /// Drops the buddy copies of `chunks` kept here that are of a phase before `before`;
    /// their memory goes back to the kept buffers.
    fn drop_copies(&mut self, chunks: impl IntoIterator<Item = u64>, before: u64) {
        for c in chunks {
            for copies in [&mut self.copies, &mut self.previous] {
                if copies.get(&c).is_some_and(|(p, _)| *p < before) {
                    let (_, b) = copies.remove(&c).expect("checked");
                    self.copy_bytes -= b.len() as u64;
                    self.config.buffers.give(b);
                }
            }
        }
    }

    /// A frame from peer process `to`, on the link this process dialled: the answer to a
    /// push.
    pub(super) fn peer_answered(&mut self, to: u64, msg: FromPeer) {
        if self.ended {
            return;
        }
        let FromPeer::Ack { seq, kept } = msg else {
            return;
        };
        match self.pushes.get(&seq) {
            Some(p) if p.peer == to => {}
            _ => {
                tracing::warn!(peer = to, seq, "an answer to no push of this process to it");
                return;
            }
        }
        let push = self.pushes.remove(&seq).expect("checked above");
        if kept && matches!(push.what, Pushed::Halo { .. }) {
            self.peer_counts.kept += 1;
        }
        self.answered(push, kept);
        self.drain_waiting();
    }

    /// The link to or from peer process `process` is down (it could not be made, or
    /// ended): every push to it not answered goes up as bytes, the coordinator is told
    /// (once), and no more halos are pushed there until the coordinator offers it again.
    pub(super) fn peer_down(&mut self, process: u64, reason: String) {
        if self.ended {
            return;
        }
        let mut failed: Vec<u64> = self
            .pushes
            .iter()
            .filter(|(_, p)| p.peer == process)
            .map(|(s, _)| *s)
            .collect();
        failed.sort_unstable();
        let first = self
            .peering
            .as_mut()
            .is_some_and(|p| p.generation.is_some() && p.down.insert(process));
        if first {
            tracing::warn!(peer = process, %reason, "a peer is unreachable: its halos go through the coordinator");
            self.send(ToCoordinator::Unreachable { process, reason });
        }
        for seq in failed {
            let push = self.pushes.remove(&seq).expect("listed above");
            if matches!(push.what, Pushed::Halo { .. }) {
                self.peer_counts.unreachable += 1;
            }
            self.answered(push, false);
        }
        self.drain_waiting();
    }

    /// A push is answered: its halo is reported kept at its peer, or goes up as bytes; a
    /// copy counts for its round.
    fn answered(&mut self, push: Push, kept: bool) {
        let (waiting, index, bytes) = match push.what {
            Pushed::Halo {
                waiting,
                index,
                bytes,
            } => (waiting, index, bytes),
            Pushed::Copy { round, chunk, len } => {
                if kept {
                    self.peer_counts.copies_kept += 1;
                }
                if let Some(r) = self.rounds.get_mut(&round) {
                    r.pending -= 1;
                    if kept {
                        r.copied.push((chunk, len));
                    } else {
                        r.refused.push(chunk);
                    }
                }
                return self.round_ended(round);
            }
        };
        let Some(w) = self.waiting.iter_mut().find(|w| w.id == waiting) else {
            return;
        };
        w.pending -= 1;
        if let ToCoordinator::Done {
            halos: Some(halos), ..
        } = &mut w.msg
        {
            if let Some((_, h)) = halos.get_mut(index) {
                *h = if kept {
                    Halo::KeptAt(push.peer)
                } else {
                    Halo::Sent(bytes)
                };
            }
        }
    }

    /// A buddy copy round (`Copy`): its partitions are encoded one by one by the job's code,
    /// each pushed to the buddy as it comes ([`Machine::copy_encoded`]).
    fn copy_round(
        &mut self,
        phase: u64,
        generation: u64,
        buddy: u64,
        addr: String,
        chunks: Vec<u64>,
    ) {
        let round = self.next_round;
        self.next_round += 1;
        self.rounds.insert(
            round,
            Round {
                phase,
                generation,
                buddy,
                addr,
                pending: 0,
                encoding: true,
                copied: Vec::new(),
                refused: Vec::new(),
            },
        );
        self.copying = chunks.into();
        self.next_copy(round);
    }

    /// The next partition of round `round` goes to the job's code, or the round's encoding
    /// ended.
    fn next_copy(&mut self, round: u64) {
        match self.copying.pop_front() {
            Some(chunk) => {
                self.blocked = Some(Blocked::Copy { round });
                let code = Code::Held {
                    chunk,
                    surrender: false,
                };
                self.out.push_back(Out::Code(code));
            }
            None => {
                if let Some(r) = self.rounds.get_mut(&round) {
                    r.encoding = false;
                }
                self.round_ended(round);
            }
        }
    }

    /// The job's code answered a partition of copy round `round`: its bytes are pushed to
    /// the buddy (or counted refused, if the buddy is down or not known, or the partition
    /// is not here); a failure of the job's code goes to the coordinator.
    fn copy_encoded(&mut self, round: u64, answer: Option<ToCoordinator>) {
        let Some(r) = self.rounds.get_mut(&round) else {
            return;
        };
        match answer {
            Some(ToCoordinator::CapturedHeld { chunk, state }) => {
                let reachable = self.peering.as_ref().is_some_and(|p| {
                    p.generation == Some(r.generation)
                        && !p.down.contains(&r.buddy)
                        && p.me != r.buddy
                });
                if !reachable {
                    r.refused.push(chunk);
                    return;
                }
                let seq = self.next_push;
                self.next_push += 1;
                let len = state.len() as u64;
                r.pending += 1;
                let (to, addr, generation, phase) =
                    (r.buddy, r.addr.clone(), r.generation, r.phase);
                self.pushes.insert(
                    seq,
                    Push {
                        peer: to,
                        what: Pushed::Copy { round, chunk, len },
                    },
                );
                self.peer_counts.copies_pushed += 1;
                self.peer_counts.copy_bytes_pushed += len;
                self.out.push_back(Out::Peer {
                    to,
                    addr,
                    msg: ToPeer::Copy {
                        seq,
                        generation,
                        phase,
                        chunk,
                        bytes: state,
                    },
                });
            }
            Some(ToCoordinator::Missing { chunk }) => {
                tracing::warn!(
                    chunk,
                    "a buddy copy of a partition this process does not hold"
                );
                r.refused.push(chunk);
            }
            Some(other) => {
                if let Some(c) = chunk_of(&other) {
                    r.refused.push(c);
                }
                self.route(other, None);
            }
            None => {}
        }
    }

    /// Round `round` is answered if its encoding ended and every push was answered:
    /// `Copied` goes.
    fn round_ended(&mut self, round: u64) {
        if !self
            .rounds
            .get(&round)
            .is_some_and(|r| !r.encoding && r.pending == 0)
        {
            return;
        }
        let mut r = self.rounds.remove(&round).expect("checked");
        r.copied.sort_unstable();
        r.refused.sort_unstable();
        if !r.refused.is_empty() {
            tracing::warn!(
                buddy = r.buddy,
                phase = r.phase,
                refused = r.refused.len(),
                "buddy copies were not kept"
            );
        }
        self.send(ToCoordinator::Copied {
            phase: r.phase,
            generation: r.generation,
            buddy: r.buddy,
            copied: r.copied,
            refused: r.refused,
            log_bytes: self.log_bytes,
        });
    }

    /// The messages at the head of `waiting` that wait for nothing any more go.
    fn drain_waiting(&mut self) {
        while self.waiting.front().is_some_and(|w| w.pending == 0) {
            let w = self.waiting.pop_front().expect("checked");
            self.deliver(w.msg);
        }
    }

    /// A roster (`Peers`): a new generation starts afresh (no peer is down, no holder
    /// known); addresses and holders are updated.
    fn roster(
        &mut self,
        me: u64,
        session: [u8; 16],
        generation: u64,
        addrs: Vec<(u64, String)>,
        holders: Vec<(u64, Option<u64>)>,
    ) {
        let peering = self.peering.get_or_insert_with(|| Peering {
            me,
            session,
            generation: None,
            addrs: IdMap::default(),
            holders: IdMap::default(),
            down: IdSet::default(),
        });
        let tell = peering.me != me || peering.session != session || peering.generation.is_none();
        if peering.generation != Some(generation) {
            peering.generation = Some(generation);
            peering.down.clear();
            peering.holders.clear();
        }
        peering.me = me;
        peering.session = session;
        for (p, addr) in addrs {
            // Offered again after it was unreachable: tried again.
            peering.down.remove(&p);
            peering.addrs.insert(p, addr);
        }
        for (chunk, holder) in holders {
            match holder {
                Some(h) => peering.holders.insert(chunk, h),
                None => peering.holders.remove(&chunk),
            };
        }
        if tell {
            self.out.push_back(Out::Roster { me, session });
        }
    }

    /// Pushes the halos of `msg` (a `Done`) that are for partitions held by peers; how
    /// many. Each is replaced by [`Halo::Kept`] until its answer comes.
    fn push(&mut self, waiting: u64, msg: &mut ToCoordinator) -> usize {
        let ToCoordinator::Done {
            chunk,
            halos: Some(halos),
            ..
        } = msg
        else {
            return 0;
        };
        let (Some(p), Some(phase)) = (self.peering.as_ref(), self.phase) else {
            return 0;
        };
        let Some(generation) = p.generation else {
            return 0;
        };
        let mut n = 0;
        for (index, (to, h)) in halos.iter_mut().enumerate() {
            let Some(to) = *to else { continue };
            let Some(&peer) = p.holders.get(&to) else {
                continue;
            };
            if peer == p.me || p.down.contains(&peer) || self.keeper.is_here(to) {
                continue;
            }
            let Some(addr) = p.addrs.get(&peer) else {
                continue;
            };
            let Halo::Sent(bytes) = std::mem::replace(h, Halo::Kept) else {
                continue;
            };
            let len = bytes.len();
            let seq = self.next_push;
            self.next_push += 1;
            self.pushes.insert(
                seq,
                Push {
                    peer,
                    what: Pushed::Halo {
                        waiting,
                        index,
                        bytes: bytes.clone(),
                    },
                },
            );
            self.out.push_back(Out::Peer {
                to: peer,
                addr: addr.clone(),
                msg: ToPeer::Halo {
                    seq,
                    generation,
                    phase,
                    from: *chunk,
                    to,
                    bytes,
                },
            });
            self.peer_counts.pushed += 1;
            self.peer_counts.bytes_pushed += len as u64;
            n += 1;
        }
        n
    }

    /// The next thing to do, in the order decided.
    pub(super) fn poll(&mut self) -> Option<Out> {
        self.out.pop_front()
    }

    /// When [`tick`](Self::tick) has something to do: the next heartbeat or the lease's end.
    pub(super) fn deadline(&self) -> Instant {
        self.lease_ends.min(self.next_beat)
    }

    /// Whether this process asked to leave.
    pub(super) fn left(&self) -> bool {
        self.left
    }

    /// Snapshot parts written here, and sent to the coordinator as bytes.
    pub(super) fn parts(&self) -> (u64, u64) {
        (self.parts_written, self.parts_sent)
    }

    /// The error of a coordinator that fell silent (see [`silent`]).
    pub(super) fn silent(&self) -> Error {
        silent(&self.config.peer, self.config.lease)
    }

    /// A frame came from the coordinator at `now`: `msg` if it completes a message (a piece
    /// of a longer one does not).
    pub(super) fn received(&mut self, now: Instant, msg: Option<ToWorker>) {
        if self.ended {
            return;
        }
        self.lease_ends = now + self.config.lease;
        match msg {
            Some(ToWorker::Batch(batch)) => {
                // Taken one by one, in order; a batch inside it ends the process there.
                self.inbox.extend(batch);
                self.take();
            }
            Some(msg) => {
                self.inbox.push_back(msg);
                self.take();
            }
            None => {}
        }
    }

    /// The time is `now` (and the threads' progress, for a heartbeat): the coordinator is
    /// given up at the lease's end; a heartbeat goes when due.
    pub(super) fn tick(&mut self, now: Instant, progress: Vec<u64>) {
        if self.ended {
            return;
        }
        if now >= self.lease_ends {
            let e = self.silent();
            self.end(None, Err(e));
            return;
        }
        if now >= self.next_beat {
            // Late heartbeats go one per tick until the schedule is caught up, as a tokio
            // interval's do.
            self.next_beat += self.config.heartbeat;
            self.send(ToCoordinator::Heartbeat { progress });
        }
    }

    /// A stop request: `Leave`, once.
    pub(super) fn leave(&mut self) {
        if self.ended || self.left {
            return;
        }
        self.left = true;
        let grace_ms = self
            .config
            .grace
            .map(|g| g.as_millis().min(u64::MAX as u128) as u64);
        self.send(ToCoordinator::Leave { grace_ms });
    }

    /// A message from a slot's thread for the coordinator.
    pub(super) fn reported(&mut self, msg: ToCoordinator) {
        if self.ended {
            return;
        }
        // A run's end: the slot's grant goes on with its next chunk, or, if the run did not
        // end (handed back, dropped, failed), is given back.
        let ended = match &msg {
            ToCoordinator::Done { slot, chunk, .. } => Some((*slot, *chunk, true)),
            ToCoordinator::Yielded { slot, chunk, .. }
            | ToCoordinator::Abandoned { slot, chunk }
            | ToCoordinator::Failed { slot, chunk, .. } => Some((*slot, *chunk, false)),
            ToCoordinator::Missing { chunk } => {
                self.granted.remove(chunk);
                self.running.remove(chunk);
                None
            }
            _ => None,
        };
        if let Some((_, chunk, _)) = ended {
            self.granted.remove(&chunk);
            self.running.remove(&chunk);
        }
        self.route(msg, None);
        let Some((slot, chunk, done)) = ended else {
            return;
        };
        if self.grants.get(&slot).is_none_or(|g| g.current != chunk) {
            return;
        }
        if !done {
            self.give_back(slot);
            self.grants.remove(&slot);
            return;
        }
        let grant = self.grants.get_mut(&slot).expect("checked above");
        let Some((next, range)) = grant.pending.pop_front() else {
            self.grants.remove(&slot);
            return;
        };
        grant.current = next;
        let phase = grant.phase;
        if grant.pending.is_empty() {
            self.grants.remove(&slot);
        }
        let t = (slot / SLOTS_PER_THREAD) as usize;
        let run = ToThread::Run {
            slot,
            chunk: next,
            range,
            state: None,
            held: true,
            phase,
        };
        self.out.push_back(Out::Thread(t, run));
    }

    /// The chunks granted to `slot` that its thread was not given yet go back
    /// (`Returned`); the one it has goes on.
    fn give_back(&mut self, slot: u32) {
        let Some(grant) = self.grants.get_mut(&slot) else {
            return;
        };
        let chunks: Vec<u64> = grant.pending.drain(..).map(|(c, _)| c).collect();
        if chunks.is_empty() {
            return;
        }
        for c in &chunks {
            self.granted.remove(c);
        }
        self.route(ToCoordinator::Returned { slot, chunks }, None);
    }

    /// The threads' messages can no longer come (every thread is gone): the loop ends.
    pub(super) fn threads_gone(&mut self) {
        if !self.ended {
            self.end(None, Ok(self.left));
        }
    }

    /// The job's code answered the last [`Out::Code`].
    pub(super) fn answer(&mut self, answer: Result<Option<ToCoordinator>, Error>) {
        if self.ended {
            return;
        }
        let (held_folder, slot) = match self.blocked.take() {
            Some(Blocked::Code { held_folder, slot }) => (held_folder, slot),
            Some(Blocked::Copy { round }) => {
                match answer {
                    Ok(reply) => self.copy_encoded(round, reply),
                    Err(e) => return self.fail(e),
                }
                self.next_copy(round);
                return self.take();
            }
            other => {
                self.blocked = other;
                tracing::warn!("an answer of the job's code that nothing asked for");
                (None, None)
            }
        };
        match answer {
            // A granted chunk's capture: its state is its part, as a running chunk's is.
            Ok(Some(ToCoordinator::CapturedHeld { chunk, state })) if slot.is_some() => {
                let slot = slot.expect("matched");
                self.route(ToCoordinator::Captured { slot, chunk, state }, None);
            }
            Ok(Some(reply)) => self.route(reply, held_folder),
            Ok(None) => {}
            Err(e) => return self.fail(e),
        }
        self.take();
    }

    /// The check of an offered store ended.
    pub(super) fn checked(&mut self, checked: Result<(Store, String), Unusable>) {
        self.checking = false;
        match checked {
            Ok(store) => {
                tracing::info!(
                    store = store.0.url(),
                    "this worker process writes its own snapshot parts"
                );
                self.store = Some(store);
            }
            Err(why) => {
                tracing::info!(
                    why = &why as &dyn std::error::Error,
                    "snapshot parts go to the coordinator"
                );
            }
        }
        if !self.ended {
            let usable = self.store.is_some();
            self.send(ToCoordinator::StoreChecked { usable });
        }
    }

    /// A part's write ended: its reference goes to the coordinator, or its bytes if it
    /// failed (and no part is written here from now on); what waited behind the write goes
    /// next.
    pub(super) fn stored(&mut self, put: Put, written: Result<PartRef, crate::snapshot::Error>) {
        if self.ended {
            return;
        }
        let Put {
            chunk, state, slot, ..
        } = put;
        let reply = match (slot, written) {
            (Some(slot), Ok(part)) => ToCoordinator::CapturedPart { slot, chunk, part },
            (None, Ok(part)) => ToCoordinator::CapturedHeldPart { chunk, part },
            (slot, Err(e)) => {
                self.store = None;
                match slot {
                    Some(slot) => {
                        tracing::warn!(error = %e, "a part could not be stored; it goes to the coordinator");
                        ToCoordinator::Captured { slot, chunk, state }
                    }
                    None => {
                        tracing::warn!(error = %e, chunk, "a held partition's part could not be stored; it goes to the coordinator");
                        ToCoordinator::CapturedHeld { chunk, state }
                    }
                }
            }
        };
        self.send(reply);
        self.written(chunk);
    }

    /// A placement ended: the partition is held here (the pump holds it) and its halos go
    /// up if they were asked for, or the coordinator learns why not. A message that waited
    /// for it is taken.
    pub(super) fn placed(&mut self, chunk: u64, placed: Result<Option<Exported>, Failure>) {
        if self.ended {
            return;
        }
        if let Some(n) = self.placing.get_mut(&chunk) {
            *n -= 1;
            if *n == 0 {
                self.placing.remove(&chunk);
            }
        }
        match placed {
            Ok(Some(Exported { placement, halos })) => self.send(ToCoordinator::Exported {
                chunk,
                halos: halos
                    .into_iter()
                    .map(|(to, b)| (to, Halo::Sent(b)))
                    .collect(),
                placement,
            }),
            Ok(None) => {}
            Err(failure) => {
                tracing::warn!(chunk, ?failure, "a partition placed here could not be held");
                self.send(ToCoordinator::FailedHeld { chunk, failure });
            }
        }
        if let Some(Blocked::Placing(msg)) = &self.blocked {
            if !held_chunks(msg).any(|c| self.placing.contains_key(&c)) {
                let Some(Blocked::Placing(msg)) = self.blocked.take() else {
                    unreachable!("matched above");
                };
                self.dispatch(msg);
                self.take();
            }
        }
    }

    /// Takes the coordinator's messages in order while nothing blocks (step 1).
    fn take(&mut self) {
        while self.blocked.is_none() && !self.ended {
            let Some(msg) = self.inbox.pop_front() else {
                return;
            };
            self.start(msg);
        }
    }

    /// A message from the coordinator, up to the wait for a placement of its partition.
    fn start(&mut self, msg: ToWorker) {
        match msg {
            ToWorker::End => return self.end(None, Ok(self.left)),
            ToWorker::Store {
                url,
                options,
                job_id,
                epoch,
                created_unix_ms,
            } => {
                if self.store.is_none() && !self.checking {
                    self.checking = true;
                    self.out.push_back(Out::Check(Check {
                        url,
                        options,
                        job_id,
                        epoch,
                        created_unix_ms,
                    }));
                }
                return;
            }
            _ => {}
        }
        if self.config.partitioned {
            self.keeper.arrived(&msg);
        }
        let Some(msg) = self.keeper.begin(msg, self.phase.unwrap_or(0)) else {
            return self.fail(
                self.bad("a partition's halo kept here that this process did not keep".into()),
            );
        };
        if held_chunks(&msg).any(|c| self.placing.contains_key(&c)) {
            self.blocked = Some(Blocked::Placing(msg));
            return;
        }
        self.dispatch(msg);
    }

    /// A message from the coordinator whose partition is not being placed.
    fn dispatch(&mut self, msg: ToWorker) {
        match msg {
            ToWorker::Batch(_) => self.fail(self.bad("a batch inside a batch".into())),
            ToWorker::Piece { .. } => self.fail(Error::Malformed {
                peer: self.config.peer.clone(),
                what: "a message to a worker",
                reason: "a piece outside a pieced message".to_owned(),
                source: None,
            }),
            ToWorker::Phase { phase, chunks, job } => {
                self.phase = Some(phase);
                self.chunks = Some(chunks);
                self.gathered.clear();
                self.keeper.phase(phase);
                self.code(Code::Phase { phase, chunks, job }, None);
            }
            ToWorker::Gathered { pieces } => {
                let (Some(chunks), true) = (self.chunks, self.config.partitioned) else {
                    let why = "an allgather's pieces before the job value, or without partitions";
                    return self.fail(self.bad(why.into()));
                };
                let mut senders = Vec::with_capacity(pieces.len());
                let mut resolved = Vec::with_capacity(pieces.len());
                let ended = self.phase.and_then(|p| p.checked_sub(1));
                for (from, piece) in pieces {
                    if senders.last().is_some_and(|&last| last >= from) || from >= chunks {
                        return self.fail(self.bad(format!(
                            "an allgather's pieces out of sender order, twice or past the \
                             last of {chunks} chunks (from {from})"
                        )));
                    }
                    senders.push(from);
                    let piece = match piece {
                        Some(b) => b,
                        None => match ended.and_then(|p| self.keeper.own_piece(from, p)) {
                            Some(b) => b,
                            None => {
                                return self.fail(self.bad(format!(
                                    "an allgather's piece from {from} named as exported here \
                                     at the end of phase {ended:?}, which this process did not \
                                     export"
                                )));
                            }
                        },
                    };
                    resolved.push((from, piece));
                }
                self.gathered = senders;
                self.code(Code::Gathered { pieces: resolved }, None);
            }
            ToWorker::Run {
                slot,
                chunk,
                start,
                end,
                state,
                held,
                then,
            } => {
                let Some(phase) = self.phase else {
                    return self.fail(self.bad("a run before the job value".into()));
                };
                if let Some((_, s, e)) = std::iter::once((chunk, start, end))
                    .chain(then.iter().copied())
                    .find(|(_, s, e)| s > e)
                {
                    return self.fail(self.bad(format!("an empty range {s}..{e}")));
                }
                if !then.is_empty() && !held {
                    return self.fail(self.bad("a grant after a partition not held here".into()));
                }
                let Some((t, _)) = self.slot(slot) else {
                    return;
                };
                if held && self.config.partitioned {
                    self.running.insert(chunk, slot);
                }
                self.out.push_back(Out::Thread(
                    t,
                    ToThread::Run {
                        slot,
                        chunk,
                        range: start..end,
                        state,
                        held,
                        phase,
                    },
                ));
                if !then.is_empty() {
                    self.granted.extend(then.iter().map(|&(c, _, _)| c));
                    let grant = Grant {
                        current: chunk,
                        pending: then.into_iter().map(|(c, s, e)| (c, s..e)).collect(),
                        phase,
                    };
                    if let Some(old) = self.grants.insert(slot, grant) {
                        tracing::warn!(slot, ?old, "a grant replaced one not ended");
                    }
                }
            }
            ToWorker::Recall { slot } => {
                if self.slot(slot).is_some() {
                    self.give_back(slot);
                }
            }
            ToWorker::Interrupt { slot, chunk } => {
                if let Some((t, _)) = self.slot(slot) {
                    // With a grant, the slot's thread has its current chunk: that one stops.
                    self.give_back(slot);
                    let chunk = self.grants.get(&slot).map_or(chunk, |g| g.current);
                    let m = ToThread::Interrupt { slot, chunk };
                    self.out.push_back(Out::Thread(t, m));
                }
            }
            ToWorker::Capture {
                slot,
                chunk,
                folder,
            } => {
                self.folders.insert((slot, chunk), folder);
                let waits = self
                    .grants
                    .get(&slot)
                    .is_some_and(|g| g.pending.iter().any(|p| p.0 == chunk));
                if waits {
                    // A held partition granted and not started: the job's code encodes it
                    // here, and the answer is its capture (the grant goes on).
                    self.blocked = Some(Blocked::Code {
                        held_folder: None,
                        slot: Some(slot),
                    });
                    let code = Code::Held {
                        chunk,
                        surrender: false,
                    };
                    return self.out.push_back(Out::Code(code));
                }
                if let Some((t, _)) = self.slot(slot) {
                    let m = ToThread::Capture { slot, chunk };
                    self.out.push_back(Out::Thread(t, m));
                }
            }
            ToWorker::Abandon { slot, chunk } => {
                if let Some((t, _)) = self.slot(slot) {
                    self.give_back(slot);
                    let chunk = self.grants.get(&slot).map_or(chunk, |g| g.current);
                    let m = ToThread::Abandon { slot, chunk };
                    self.out.push_back(Out::Thread(t, m));
                }
            }
            ToWorker::Release { slot } => {
                self.grants.remove(&slot);
                self.running.retain(|_, s| *s != slot);
                let Some((t, i)) = self.slot(slot) else {
                    return;
                };
                self.live[t][i] = false;
                if self.live[t].iter().all(|l| !l) {
                    self.out.push_back(Out::Close(t));
                }
            }
            ToWorker::Begin { chunk, halos } => {
                if !self.config.partitioned || self.phase.is_none() {
                    return self
                        .fail(self.bad("a partition's halos for a job without partitions".into()));
                }
                let mut sent = Vec::with_capacity(halos.len());
                for (from, h) in halos {
                    if sent.last().is_some_and(|&(last, _)| last >= from) {
                        return self.fail(self.bad(format!(
                            "the halos for chunk {chunk} are out of sender order or twice \
                             (from {from})"
                        )));
                    }
                    match h {
                        Halo::Sent(b) => sent.push((from, Some(b))),
                        Halo::Gathered if self.gathered.binary_search(&from).is_ok() => {
                            sent.push((from, None));
                        }
                        Halo::Gathered => {
                            return self.fail(self.bad(format!(
                                "the halos for chunk {chunk} name a gathered piece from \
                                 {from} that the phase's `Gathered` did not bring"
                            )));
                        }
                        // `start` gave the kept ones back (`Keeper::begin`).
                        Halo::Kept => {
                            return self
                                .fail(self.bad("a kept halo that was not given back".into()));
                        }
                        Halo::KeptAt(_) => {
                            return self.fail(
                                self.bad("a halo kept at another process in a begin".into()),
                            );
                        }
                    }
                }
                self.code(Code::Begin { chunk, halos: sent }, None);
            }
            ToWorker::Surrender { chunk } => {
                let code = Code::Held {
                    chunk,
                    surrender: true,
                };
                self.code(code, None);
            }
            ToWorker::CaptureHeld { chunk, folder } => {
                let code = Code::Held {
                    chunk,
                    surrender: false,
                };
                self.code(code, Some(folder));
            }
            ToWorker::Place {
                chunk,
                state: bytes,
                export,
            } => self.place(chunk, Source::Sent(bytes), export),
            ToWorker::PlacePart {
                chunk,
                part,
                export,
            } => self.place(chunk, Source::Part(part), export),
            ToWorker::Output { chunk, phase } => {
                if !self.config.partitioned {
                    return self.fail(self.bad("an output for a job without partitions".into()));
                }
                self.code(Code::Output { chunk, phase }, None);
            }
            ToWorker::Forget => {
                // No thread runs one of the partitions: the coordinator waited for every
                // chunk to come back before it rolled the job back. Placements under way
                // are for the phase rolled back from.
                self.placing.clear();
                self.granted.clear();
                self.running.clear();
                self.grants.clear();
                self.flush_dones();
                if let Some(p) = &mut self.peering {
                    // Pushes of the generation rolled back from are refused from now on.
                    p.generation = None;
                }
                // Copies and logs of the run rolled back from are of phases it will compute
                // again. The log keeps every phase from now on, until the next `Logs` trims
                // it: the restored run may be at a phase before the one it was trimmed to,
                // and its first copies are of that phase.
                self.drop_copies_all();
                self.log.clear();
                self.log_bytes = 0;
                if self.logging.is_some() {
                    self.logging = Some(0);
                }
                self.replaying.clear();
                self.out.push_back(Out::Forget);
            }
            ToWorker::Peers {
                me,
                session,
                generation,
                addrs,
                holders,
            } => {
                if !self.config.partitioned {
                    return self
                        .fail(self.bad("a roster of peers for a job without partitions".into()));
                }
                if self.config.direct {
                    self.roster(me, session, generation, addrs, holders);
                }
            }
            ToWorker::Copy {
                phase,
                generation,
                buddy,
                addr,
                chunks,
            } => {
                if !self.config.partitioned {
                    return self.fail(self.bad("a buddy copy for a job without partitions".into()));
                }
                if chunks.windows(2).any(|w| w[0] >= w[1]) {
                    return self.fail(self.bad("buddy copies out of chunk order or twice".into()));
                }
                self.copy_round(phase, generation, buddy, addr, chunks);
            }
            ToWorker::DropCopies { chunks, before } => self.drop_copies(chunks, before),
            ToWorker::SendLog {
                attempt,
                from,
                through,
                to,
            } => {
                if !self.config.partitioned {
                    return self
                        .fail(self.bad("a halo log asked of a job without partitions".into()));
                }
                let wanted: IdSet<u64> = to.iter().copied().collect();
                let records: Vec<Logged> = self
                    .log
                    .iter()
                    .filter(|(p, ..)| (from..=through).contains(p))
                    .filter_map(|(p, c, halos)| {
                        let kept: Vec<(Option<u64>, Bytes)> = halos
                            .iter()
                            .filter(|(t, _)| t.is_none_or(|t| wanted.contains(&t)))
                            .cloned()
                            .collect();
                        (!kept.is_empty()).then_some((*p, *c, kept))
                    })
                    .collect();
                self.send(ToCoordinator::Log { attempt, records });
            }
            ToWorker::Recover {
                attempt,
                copy_phase,
                phase,
                total,
                chunks,
                jobs,
                halos,
                copies: sent,
            } => {
                if !self.config.partitioned {
                    return self.fail(self.bad("a recovery for a job without partitions".into()));
                }
                let sent: IdMap<u64, Bytes> = sent.into_iter().collect();
                if let Some(&(c, ..)) = chunks.iter().find(|c| c.0 >= total) {
                    return self.fail(self.bad(format!("a recovery of chunk {c} of {total}")));
                }
                let from = self.replay_from(&chunks, copy_phase, phase, &sent);
                let mut parts = Vec::with_capacity(chunks.len());
                for &(chunk, start, end, done) in &chunks {
                    if let Some(b) = sent.get(&chunk).filter(|_| start <= end) {
                        parts.push((chunk, start..end, done, b.clone()));
                        continue;
                    }
                    match self.copy_at(chunk, from) {
                        Some(b) if start <= end => {
                            parts.push((chunk, start..end, done, b.clone()));
                        }
                        _ => {
                            let reason = format!(
                                "no copy of chunk {chunk} of phase {copy_phase} here (it has {:?})",
                                self.copies.get(&chunk).map(|h| h.0)
                            );
                            return self.send(ToCoordinator::ReplayFailed { attempt, reason });
                        }
                    }
                }
                // The copies are used up: the replayed partitions go to the coordinator. (A
                // newer copy, of a round under way at the loss, stays.)
                self.drop_copies(chunks.iter().map(|c| c.0), from + 1);
                self.replaying.insert(attempt, from);
                // From a newer copy, the phases before it are not replayed: their job values
                // and pieces are left out.
                let jobs = jobs.into_iter().filter(|(p, _)| *p >= from).collect();
                let halos = halos.into_iter().filter(|h| h.0 >= from).collect();
                self.out.push_back(Out::Replay(super::replay::Replay {
                    attempt,
                    copy_phase: from,
                    phase,
                    chunks: total,
                    parts,
                    jobs,
                    halos,
                }));
            }
            ToWorker::SendCopies {
                attempt,
                phase,
                chunks,
            } => {
                if !self.config.partitioned {
                    return self.fail(self.bad("copies asked of a job without partitions".into()));
                }
                let copies: Vec<(u64, u64, Bytes)> = chunks
                    .iter()
                    .filter_map(|c| self.copy_at(*c, phase).map(|b| (*c, phase, b.clone())))
                    .collect();
                self.drop_copies(copies.iter().map(|c| c.0).collect::<Vec<_>>(), phase + 1);
                self.send(ToCoordinator::CopiesOf { attempt, copies });
            }
            ToWorker::Logs { from } => {
                if !self.config.partitioned {
                    return self.fail(self.bad("a halo log for a job without partitions".into()));
                }
                self.trim_log(from);
            }
            ToWorker::Heartbeat | ToWorker::End | ToWorker::Store { .. } => {}
        }
    }

    /// A partition placed here: placed in the background, for a job with partitions.
    fn place(&mut self, chunk: u64, from: Source, export: Option<u64>) {
        if !self.config.partitioned {
            return self.fail(self.bad("a partition placed for a job without partitions".into()));
        }
        *self.placing.entry(chunk).or_default() += 1;
        let store = self.store.as_ref().map(|(s, _)| s.clone());
        self.out.push_back(Out::Place(Place {
            chunk,
            from,
            export,
            store,
        }));
    }

    /// Asks the job's code; no message is taken until it answered.
    fn code(&mut self, code: Code, held_folder: Option<u64>) {
        self.blocked = Some(Blocked::Code {
            held_folder,
            slot: None,
        });
        self.out.push_back(Out::Code(code));
    }

    /// The thread of a live slot, and the slot's index in it; else the process ends.
    fn slot(&mut self, slot: u32) -> Option<(usize, usize)> {
        let (t, i) = (
            (slot / SLOTS_PER_THREAD) as usize,
            (slot % SLOTS_PER_THREAD) as usize,
        );
        if self.live.get(t).is_some_and(|l| l[i]) {
            Some((t, i))
        } else {
            self.fail(self.bad(format!("slot {slot} is not a live slot")));
            None
        }
    }

    /// A message that decoded but that the protocol does not allow here.
    fn bad(&self, reason: String) -> Error {
        Error::Rejected {
            peer: self.config.peer.clone(),
            what: "a message to a worker",
            reason,
            source: None,
        }
    }

    /// The process ends with `e`; the coordinator learns why if the job's bytes did not
    /// decode here.
    fn fail(&mut self, e: Error) {
        let tell = match &e {
            Error::Undecodable { what, source, .. } => Some(ToCoordinator::Undecodable {
                what: (*what).to_owned(),
                error: source.clone(),
            }),
            _ => None,
        };
        self.end(tell, Err(e));
    }

    fn end(&mut self, tell: Option<ToCoordinator>, result: Result<bool, Error>) {
        self.ended = true;
        self.inbox.clear();
        self.out.push_back(Out::End { tell, result });
    }

    /// Routes a message for the coordinator: a captured state or held partition that this
    /// process can store is written in the background; a message about a chunk whose part
    /// is being written waits behind it; anything else goes now. `held_folder` is
    /// the epoch folder of the `CaptureHeld` that `msg` answers.
    fn route(&mut self, msg: ToCoordinator, held_folder: Option<u64>) {
        let folder = match &msg {
            ToCoordinator::Captured { slot, chunk, .. }
            | ToCoordinator::Done { slot, chunk, .. }
            | ToCoordinator::Yielded { slot, chunk, .. }
            | ToCoordinator::Failed { slot, chunk, .. } => self.folders.remove(&(*slot, *chunk)),
            ToCoordinator::CapturedHeld { .. } => held_folder,
            _ => None,
        };
        let phase = self.phase;
        if let Some(queue) = chunk_of(&msg).and_then(|c| self.behind.get_mut(&c)) {
            queue.push_back((msg, folder, phase));
            return;
        }
        self.go(msg, folder, phase);
    }

    /// A message that waits for nothing: a state to store is written in the background,
    /// anything else is sent.
    fn go(&mut self, msg: ToCoordinator, folder: Option<u64>, phase: Option<u64>) {
        let (Some(folder), Some((store, job_id)), Some(phase)) = (folder, &self.store, phase)
        else {
            return self.send(msg);
        };
        let (store, job_id) = (store.clone(), job_id.clone());
        let put = |chunk, state, slot| Put {
            store,
            job_id,
            folder,
            phase,
            chunk,
            state,
            slot,
        };
        match msg {
            ToCoordinator::Captured { slot, chunk, state } => {
                // Messages about the chunk wait behind its write, as behind a held one's: a
                // second capture's answer written sooner would be matched to this one
                // (simulation seed 756221).
                self.behind.insert(chunk, VecDeque::new());
                self.out.push_back(Out::Put(put(chunk, state, Some(slot))));
            }
            ToCoordinator::CapturedHeld { chunk, state } => {
                self.behind.insert(chunk, VecDeque::new());
                self.out.push_back(Out::Put(put(chunk, state, None)));
            }
            msg => self.send(msg),
        }
    }

    /// The write of `chunk`'s part ended: the messages that waited behind it go now in
    /// order, up to the next write of that chunk (the rest waits for it).
    fn written(&mut self, chunk: u64) {
        let mut queue = self.behind.remove(&chunk).unwrap_or_default();
        while let Some((msg, folder, phase)) = queue.pop_front() {
            self.go(msg, folder, phase);
            if let Some(next) = self.behind.get_mut(&chunk) {
                next.extend(queue);
                break;
            }
        }
    }

    /// A message for the coordinator, now: halos for partitions here are kept on the way
    /// ([`Keeper::outgoing`]); snapshot parts are counted.
    fn send(&mut self, msg: ToCoordinator) {
        if let ToCoordinator::Surrendered { chunk, .. } | ToCoordinator::Yielded { chunk, .. } =
            &msg
        {
            if let Some(log) = self.log_of_leaving(*chunk) {
                self.send(log);
            }
        }
        let exported = match &msg {
            ToCoordinator::Done {
                chunk,
                halos: Some(halos),
                ..
            }
            | ToCoordinator::Exported { chunk, halos, .. } => Some((chunk, halos)),
            _ => None,
        };
        if let (Some(from), Some(phase), Some((chunk, halos))) =
            (self.logging, self.phase, exported)
        {
            // The halo log: the exports as they leave the partition (all bytes here, before
            // the keeper keeps some and pushes send others), sharing their memory. Those of
            // a partition placed by a rollback that had ended the restored phase
            // (`Exported`) are that phase's, as its `Done` would have been.
            if phase >= from {
                let logged: Vec<(Option<u64>, Bytes)> = halos
                    .iter()
                    .filter_map(|(to, h)| match h {
                        Halo::Sent(b) => Some((*to, b.clone())),
                        Halo::Kept | Halo::KeptAt(_) | Halo::Gathered => None,
                    })
                    .collect();
                self.log_bytes += logged.iter().map(|(_, b)| b.len() as u64).sum::<u64>();
                self.log.push_back((phase, *chunk, logged));
            }
        }
        let mut now = Vec::new();
        self.keeper.outgoing(msg, self.phase.unwrap_or(0), &mut now);
        for mut msg in now {
            if let ToCoordinator::Heartbeat { .. } = msg {
                // About no chunk: it goes past messages that wait for peers.
                self.deliver(msg);
                continue;
            }
            let id = self.next_waiting;
            let pending = self.push(id, &mut msg);
            if pending > 0 || !self.waiting.is_empty() {
                self.next_waiting += 1;
                self.waiting.push_back(Waiting { id, msg, pending });
                continue;
            }
            self.deliver(msg);
        }
    }

    /// A message for the coordinator that waits for nothing: `Done`s are held while
    /// granted runs, runs of held partitions, or `Done`s waiting for their pushes' answers
    /// are out; snapshot parts are counted.
    fn deliver(&mut self, msg: ToCoordinator) {
        {
            if let ToCoordinator::Done { .. } = msg {
                self.dones.push(msg);
                let behind = self
                    .waiting
                    .iter()
                    .any(|w| matches!(w.msg, ToCoordinator::Done { .. }));
                if self.granted.is_empty() && self.running.is_empty() && !behind {
                    self.flush_dones();
                }
                return;
            }
            self.flush_dones();
            match msg {
                ToCoordinator::CapturedPart { .. } | ToCoordinator::CapturedHeldPart { .. } => {
                    self.parts_written += 1;
                }
                ToCoordinator::Captured { .. } | ToCoordinator::CapturedHeld { .. } => {
                    self.parts_sent += 1;
                }
                _ => {}
            }
            self.out.push_back(Out::Send(msg));
        }
    }
}

impl Machine {
    /// The `Done`s held back go, in one message if several.
    fn flush_dones(&mut self) {
        let msg = match self.dones.len() {
            0 => return,
            1 => self.dones.pop().expect("one"),
            _ => ToCoordinator::Batch(std::mem::take(&mut self.dones)),
        };
        self.out.push_back(Out::Send(msg));
    }
}

/// The chunks granted to a slot (`Run::then`), handed to its thread one at a time.
#[derive(Debug)]
struct Grant {
    /// The chunk the thread has (the `Run`'s, then each granted one in turn).
    current: u64,
    /// Granted partitions not handed to the thread yet, in order, with their ranges.
    pending: VecDeque<(u64, std::ops::Range<u64>)>,
    /// The phase they run in.
    phase: u64,
}

/// The error of a coordinator that fell silent: nothing from it for a whole lease, or a
/// write to it that did not move for as long (the pump's).
pub(super) fn silent(peer: &str, lease: Duration) -> Error {
    tracing::warn!(
        peer,
        ?lease,
        "the coordinator fell silent: nothing from it for a whole lease; giving it up"
    );
    Error::LeaseExpired {
        peer: peer.to_owned(),
        after: lease,
    }
}

/// The chunk a message to the coordinator is about, if any.
pub(super) fn chunk_of(msg: &ToCoordinator) -> Option<u64> {
    match msg {
        ToCoordinator::Done { chunk, .. }
        | ToCoordinator::Surrendered { chunk, .. }
        | ToCoordinator::CapturedHeld { chunk, .. }
        | ToCoordinator::CapturedHeldPart { chunk, .. }
        | ToCoordinator::Missing { chunk }
        | ToCoordinator::FailedHeld { chunk, .. }
        | ToCoordinator::Exported { chunk, .. }
        | ToCoordinator::Released { chunk, .. }
        | ToCoordinator::Yielded { chunk, .. }
        | ToCoordinator::Abandoned { chunk, .. }
        | ToCoordinator::Captured { chunk, .. }
        | ToCoordinator::CapturedPart { chunk, .. }
        | ToCoordinator::Failed { chunk, .. }
        | ToCoordinator::LogOf { chunk, .. }
        | ToCoordinator::OutputDone { chunk } => Some(*chunk),
        ToCoordinator::Returned { .. }
        | ToCoordinator::Batch(_)
        | ToCoordinator::Heartbeat { .. }
        | ToCoordinator::Leave { .. }
        | ToCoordinator::Piece { .. }
        | ToCoordinator::Listening { .. }
        | ToCoordinator::Unreachable { .. }
        | ToCoordinator::Copied { .. }
        | ToCoordinator::Log { .. }
        | ToCoordinator::CopiesOf { .. }
        | ToCoordinator::Replayed { .. }
        | ToCoordinator::ReplayFailed { .. }
        | ToCoordinator::StoreChecked { .. }
        | ToCoordinator::Undecodable { .. } => None,
    }
}

/// The held partitions a message from the coordinator is about (a `Run` with a grant names
/// several).
fn held_chunks(msg: &ToWorker) -> impl Iterator<Item = u64> + '_ {
    let (granted, copied): (&[(u64, u64, u64)], &[u64]) = match msg {
        ToWorker::Run { then, .. } => (&then[..], &[]),
        ToWorker::Copy { chunks, .. } => (&[], &chunks[..]),
        _ => (&[], &[]),
    };
    held_chunk(msg)
        .into_iter()
        .chain(granted.iter().map(|&(c, _, _)| c))
        .chain(copied.iter().copied())
}

/// The held partition a message from the coordinator is about first, if it is about one.
fn held_chunk(msg: &ToWorker) -> Option<u64> {
    match msg {
        ToWorker::Run {
            chunk, held: true, ..
        }
        | ToWorker::Begin { chunk, .. }
        | ToWorker::Surrender { chunk }
        | ToWorker::CaptureHeld { chunk, .. }
        | ToWorker::Output { chunk, .. }
        | ToWorker::Place { chunk, .. }
        | ToWorker::PlacePart { chunk, .. } => Some(*chunk),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(10);
    const BEAT: Duration = Duration::from_secs(1);

    /// A machine with `threads` threads started at the returned time, which has had its
    /// first heartbeat and its job value (phase 2) if `phase`.
    fn machine(partitioned: bool, threads: usize) -> (Machine, Instant) {
        let t0 = Instant::now();
        let config = Config {
            peer: "coordinator".to_owned(),
            heartbeat: BEAT,
            lease: LEASE,
            grace: Some(Duration::from_millis(1500)),
            partitioned,
            threads,
            direct: true,
            copy_memory: 1 << 20,
            buffers: Arc::new(Buffers::new(1 << 30)),
        };
        let mut m = Machine::new(config, t0);
        m.tick(t0, vec![0; threads]);
        assert!(matches!(
            &polled(&mut m)[..],
            [Out::Send(ToCoordinator::Heartbeat { .. })]
        ));
        (m, t0)
    }

    /// `m` with the job value of phase 2, answered.
    fn with_job(m: &mut Machine, t0: Instant) {
        to_phase(m, t0, 2);
    }

    /// `m` with the job value of `phase`, answered.
    fn to_phase(m: &mut Machine, t0: Instant, phase: u64) {
        let job = Bytes::from_static(b"job");
        let msg = ToWorker::Phase {
            phase,
            chunks: 8,
            job: job.clone(),
        };
        m.received(t0, Some(msg));
        assert!(matches!(
            &polled(m)[..],
            [Out::Code(Code::Phase { phase: p, chunks: 8, job: j })] if *j == job && *p == phase
        ));
        m.answer(Ok(None));
        assert!(polled(m).is_empty());
    }

    /// `msg`, after the job value of a partitioned job, ends the process with a refusal
    /// that says `why`.
    fn refused(msg: ToWorker, why: &str) {
        let (mut m, t0) = machine(true, 1);
        with_job(&mut m, t0);
        m.received(t0, Some(msg));
        ends_refused(&mut m, why);
    }

    /// `m` ends the process, with a refusal that says `why`, and nothing else.
    fn ends_refused(m: &mut Machine, why: &str) {
        let outs = polled(m);
        assert!(
            matches!(
                &outs[..],
                [Out::End {
                    tell: None,
                    result: Err(Error::Rejected { reason, .. })
                }] if reason.contains(why)
            ),
            "{outs:?}"
        );
    }

    fn polled(m: &mut Machine) -> Vec<Out> {
        std::iter::from_fn(|| m.poll()).collect()
    }

    /// The messages for the coordinator among `outs`, and whether there was anything else.
    fn sent(outs: Vec<Out>) -> Vec<ToCoordinator> {
        outs.into_iter()
            .map(|o| match o {
                Out::Send(msg) => msg,
                o => panic!("not a message for the coordinator: {o:?}"),
            })
            .collect()
    }

    /// The machine's next outputs are one question to the job's code: encode the partition
    /// held for `chunk` (and drop it if `surrender`).
    fn asks_held(m: &mut Machine, chunk: u64, surrender: bool) {
        let outs = polled(m);
        assert!(
            matches!(&outs[..], [Out::Code(Code::Held { chunk: c, surrender: s })] if *c == chunk && *s == surrender),
            "{outs:?}"
        );
    }

    /// The halo log kept from phase 2 on; partitions 3 and 2, held here, run phase 2 and
    /// export two halos each.
    fn log_two_of_phase_2(m: &mut Machine, t0: Instant) {
        m.received(t0, Some(ToWorker::Logs { from: 2 }));
        m.received(t0, Some(roster(4)));
        m.received(t0, Some(run(0, 3, true)));
        m.received(t0, Some(run(1, 2, true)));
        let _ = polled(m);
        m.reported(done(0, 3, true));
        m.reported(done(1, 2, true));
        let _ = polled(m);
    }

    fn run(slot: u32, chunk: u64, held: bool) -> ToWorker {
        ToWorker::Run {
            slot,
            chunk,
            start: chunk * 10,
            end: chunk * 10 + 10,
            state: None,
            held,
            then: Vec::new(),
        }
    }

    fn halo(chunk: u64, side: &str) -> Bytes {
        Bytes::from(format!("{chunk} {side}"))
    }

    /// Chunk `chunk` of a chain done in `slot`, with halos for the chunk before and after
    /// (if `halos`).
    fn done(slot: u32, chunk: u64, halos: bool) -> ToCoordinator {
        let msg = ToCoordinator::Done {
            slot,
            chunk,
            output: Bytes::from_static(b"out"),
            halos: None,
            iterations: 1,
            busy_ns: 1,
        };
        if !halos {
            return msg;
        }
        let (up, down) = (halo(chunk, "up"), halo(chunk, "down"));
        with_halos(msg, Halo::Sent(up), Halo::Sent(down))
    }

    /// A chain's `Done` with these halos for the chunk before and the chunk after.
    fn with_halos(mut msg: ToCoordinator, up: Halo, down: Halo) -> ToCoordinator {
        if let ToCoordinator::Done { halos, chunk, .. } = &mut msg {
            *halos = Some(chain(*chunk, up, down));
        }
        msg
    }

    /// The halos of chunk `chunk` of a chain addressed: none for a chunk before chunk 0.
    fn chain(chunk: u64, up: Halo, down: Halo) -> Vec<(Option<u64>, Halo)> {
        let mut v = Vec::new();
        if let Some(b) = chunk.checked_sub(1) {
            v.push((Some(b), up));
        }
        v.push((Some(chunk + 1), down));
        v
    }

    fn captured_held(chunk: u64, state: &'static [u8]) -> ToCoordinator {
        ToCoordinator::CapturedHeld {
            chunk,
            state: Bytes::from_static(state),
        }
    }

    fn part(chunk: u64, folder: u64) -> PartRef {
        PartRef {
            chunk,
            key: format!("job/{folder:020}/parts/{chunk}"),
            size: 5,
            crc32c: 0,
        }
    }

    /// The coordinator's offer of an in-memory store, whose witness is epoch 1.
    fn store_offer() -> ToWorker {
        ToWorker::Store {
            url: "memory://".to_owned(),
            options: Vec::new(),
            job_id: "job".to_owned(),
            epoch: 1,
            created_unix_ms: 42,
        }
    }

    /// `m` with a store this process writes its parts to.
    fn with_store(m: &mut Machine, t0: Instant) -> Store {
        let offer = store_offer();
        m.received(t0, Some(offer.clone()));
        let outs = polled(m);
        let [Out::Check(check)] = &outs[..] else {
            panic!("{outs:?}");
        };
        assert_eq!((check.epoch, check.created_unix_ms), (1, 42));
        // Offered again while it is checked: one check.
        m.received(t0, Some(offer));
        assert!(polled(m).is_empty());
        let store = Store::open("memory://").unwrap();
        m.checked(Ok((store.clone(), "job".to_owned())));
        // The coordinator is told: a rollback places partitions here as parts.
        assert_eq!(
            sent(polled(m)),
            vec![ToCoordinator::StoreChecked { usable: true }]
        );
        store
    }

    /// A store that does not serve this process: the coordinator is told, and the parts go
    /// as bytes; offered again, it is checked again.
    #[test]
    fn a_store_unusable_here_is_said_so_and_checked_again_when_offered_again() {
        let (mut m, t0) = machine(true, 1);
        with_job(&mut m, t0);
        m.received(t0, Some(store_offer()));
        assert!(matches!(&polled(&mut m)[..], [Out::Check(_)]));
        let why = crate::snapshot::Store::open("nowhere://at-all").unwrap_err();
        m.checked(Err(Unusable::Open(why)));
        assert_eq!(
            sent(polled(&mut m)),
            vec![ToCoordinator::StoreChecked { usable: false }]
        );
        m.received(
            t0,
            Some(ToWorker::CaptureHeld {
                chunk: 3,
                folder: 7,
            }),
        );
        let _ = polled(&mut m);
        m.answer(Ok(Some(captured_held(3, b"state"))));
        assert_eq!(sent(polled(&mut m)), vec![captured_held(3, b"state")]);
        m.received(t0, Some(store_offer()));
        assert!(matches!(&polled(&mut m)[..], [Out::Check(_)]));
    }

    /// A `Run` goes to its slot's thread; its `Done` keeps the partition here: the halos
    /// for a neighbour whose partition is here (queued, running or held) are kept and the
    /// `Done` says `Kept`, those for a neighbour elsewhere go up; the next phase's `Begin`
    /// gets the kept ones back, and a capture of the held partition asks the job's code.
    #[test]
    fn a_done_partition_stays_here_with_the_halos_for_its_neighbours_here() {
        let (mut m, t0) = machine(true, 1);
        with_job(&mut m, t0);
        m.received(t0, Some(run(0, 1, false)));
        m.received(t0, Some(run(1, 2, false)));
        let outs = polled(&mut m);
        let [
            Out::Thread(
                0,
                ToThread::Run {
                    slot: 0,
                    chunk: 1,
                    range: r1,
                    phase: 2,
                    held: false,
                    ..
                },
            ),
            Out::Thread(
                0,
                ToThread::Run {
                    slot: 1,
                    chunk: 2,
                    range: r2,
                    phase: 2,
                    held: false,
                    ..
                },
            ),
        ] = &outs[..]
        else {
            panic!("{outs:?}");
        };
        assert_eq!((r1.clone(), r2.clone()), (10..20, 20..30));
        m.reported(done(0, 1, true));
        let one = with_halos(done(0, 1, true), Halo::Sent(halo(1, "up")), Halo::Kept);
        assert_eq!(sent(polled(&mut m)), vec![one]);
        m.reported(done(1, 2, true));
        let two = with_halos(done(1, 2, true), Halo::Kept, Halo::Sent(halo(2, "down")));
        assert_eq!(sent(polled(&mut m)), vec![two]);
        // The next phase: chunk 2's halo from chunk 1 is here; chunk 3's comes as bytes.
        to_phase(&mut m, t0, 3);
        m.received(
            t0,
            Some(ToWorker::Begin {
                chunk: 2,
                halos: vec![(1, Halo::Kept), (3, Halo::Sent(halo(3, "up")))],
            }),
        );
        let outs = polled(&mut m);
        let [Out::Code(begin)] = &outs[..] else {
            panic!("{outs:?}");
        };
        assert_eq!(
            begin,
            &Code::Begin {
                chunk: 2,
                halos: vec![(1, Some(halo(1, "down"))), (3, Some(halo(3, "up")))],
            }
        );
        m.answer(Ok(None));
        // A capture of the partition held here is asked of the job's code, and without a
        // store its bytes go up.
        m.received(
            t0,
            Some(ToWorker::CaptureHeld {
                chunk: 1,
                folder: 3,
            }),
        );
        asks_held(&mut m, 1, false);
        m.answer(Ok(Some(captured_held(1, b"one"))));
        assert_eq!(sent(polled(&mut m)), vec![captured_held(1, b"one")]);
        assert_eq!(m.parts(), (0, 1));
        // A kept halo named twice is refused: the process ends.
        m.received(
            t0,
            Some(ToWorker::Begin {
                chunk: 2,
                halos: vec![(1, Halo::Kept)],
            }),
        );
        let outs = polled(&mut m);
        assert!(
            matches!(
                &outs[..],
                [Out::End {
                    tell: None,
                    result: Err(Error::Rejected { .. })
                }]
            ),
            "{outs:?}"
        );
    }

    /// An allgather's pieces come once a phase (`Gathered`) and go to the job's code once;
    /// each `Begin` that names them is handed on with them by sender, beside the halos it
    /// carries. A new `Phase` forgets them: a `Begin` that names them then is refused.
    #[test]
    fn gathered_pieces_come_once_and_each_begin_names_them() {
        let (mut m, t0) = machine(true, 1);
        with_job(&mut m, t0);
        let pieces = vec![(0, halo(0, "all")), (3, halo(3, "all"))];
        m.received(
            t0,
            Some(ToWorker::Gathered {
                pieces: pieces.iter().map(|(c, b)| (*c, Some(b.clone()))).collect(),
            }),
        );
        let outs = polled(&mut m);
        assert!(
            matches!(&outs[..], [Out::Code(Code::Gathered { pieces: p })] if *p == pieces),
            "{outs:?}"
        );
        m.answer(Ok(None));
        for chunk in [1, 2] {
            m.received(
                t0,
                Some(ToWorker::Begin {
                    chunk,
                    halos: vec![
                        (0, Halo::Gathered),
                        (1, Halo::Sent(halo(1, "own"))),
                        (3, Halo::Gathered),
                    ],
                }),
            );
            let outs = polled(&mut m);
            let [Out::Code(Code::Begin { chunk: c, halos })] = &outs[..] else {
                panic!("{outs:?}");
            };
            assert_eq!(*c, chunk);
            assert_eq!(
                halos,
                &vec![(0, None), (1, Some(halo(1, "own"))), (3, None)]
            );
            m.answer(Ok(None));
        }
        to_phase(&mut m, t0, 3);
        m.received(
            t0,
            Some(ToWorker::Begin {
                chunk: 1,
                halos: vec![(0, Halo::Gathered)],
            }),
        );
        ends_refused(&mut m, "did not bring");
    }

    /// A piece a partition here exported for every partition (an allgather's) goes up, and
    /// the next phase's `Gathered` may name it instead of sending it back (`None`): the job's
    /// code gets the bytes exported here. A `Gathered` that names as this process's own a
    /// piece it did not export, or one of a phase before, is refused.
    #[test]
    fn a_gathered_piece_exported_here_is_named_not_sent_back() {
        let (mut m, t0) = machine(true, 1);
        with_job(&mut m, t0);
        m.received(t0, Some(run(0, 1, false)));
        assert!(matches!(&polled(&mut m)[..], [Out::Thread(0, _)]));
        let mine = halo(1, "all");
        let done = ToCoordinator::Done {
            slot: 0,
            chunk: 1,
            output: Bytes::from_static(b"out"),
            halos: Some(vec![(None, Halo::Sent(mine.clone()))]),
            iterations: 1,
            busy_ns: 1,
        };
        m.reported(done.clone());
        // It goes up whole: the other processes need it.
        assert_eq!(sent(polled(&mut m)), vec![done]);
        to_phase(&mut m, t0, 3);
        let other = halo(0, "all");
        m.received(
            t0,
            Some(ToWorker::Gathered {
                pieces: vec![(0, Some(other.clone())), (1, None)],
            }),
        );
        let outs = polled(&mut m);
        let [Out::Code(Code::Gathered { pieces })] = &outs[..] else {
            panic!("{outs:?}");
        };
        assert_eq!(pieces, &vec![(0, other), (1, mine.clone())]);
        m.answer(Ok(None));
        // Of phase 2, not 3: a `Gathered` of phase 4 cannot name it.
        to_phase(&mut m, t0, 4);
        m.received(
            t0,
            Some(ToWorker::Gathered {
                pieces: vec![(1, None)],
            }),
        );
        ends_refused(&mut m, "which this process did not export");
        // Nor a piece no partition here exported.
        refused(
            ToWorker::Gathered {
                pieces: vec![(5, None)],
            },
            "which this process did not export",
        );
    }

    /// Gathered pieces out of sender order, twice, past the last chunk, or naming a sender
    /// the `Gathered` did not bring, are refused before the job's code sees them; so are
    /// gathered pieces before any job value.
    #[test]
    fn bad_gathered_pieces_are_refused() {
        let piece = |from| (from, Some(halo(from, "all")));
        for pieces in [
            vec![piece(2), piece(1)],
            vec![piece(1), piece(1)],
            vec![piece(8)],
        ] {
            refused(
                ToWorker::Gathered { pieces },
                "out of sender order, twice or past",
            );
        }
        refused(
            ToWorker::Begin {
                chunk: 1,
                halos: vec![(0, Halo::Gathered)],
            },
            "did not bring",
        );
        let (mut m, t0) = machine(true, 1);
        m.received(
            t0,
            Some(ToWorker::Gathered {
                pieces: vec![piece(0)],
            }),
        );
        ends_refused(&mut m, "before the job value");
    }

    /// A `Begin` whose halos are not in sender order, or name a sender twice, is refused
    /// before the job's code sees it: the process ends (a partition would otherwise take
    /// its pieces in an order the value depends on).
    #[test]
    fn halos_out_of_sender_order_are_refused() {
        for halos in [
            vec![
                (3, Halo::Sent(halo(3, "up"))),
                (1, Halo::Sent(halo(1, "down"))),
            ],
            vec![
                (1, Halo::Sent(halo(1, "down"))),
                (1, Halo::Sent(halo(1, "down"))),
            ],
        ] {
            refused(
                ToWorker::Begin { chunk: 2, halos },
                "out of sender order or twice",
            );
        }
    }

    /// The `Done`s of partitions held here wait while runs of other partitions held here
    /// are out, and go in one `Batch` with the last: four partitions on the four slots of
    /// one thread cost one message, not four. A run of a partition not held here (made or
    /// sent here) is not waited for, and its `Done` goes at once; a slot released with its
    /// run out is not waited for either. A `Done` whose pushes were answered waits for the
    /// `Done`s behind it that wait for answers.
    #[test]
    fn the_dones_of_held_partitions_on_several_slots_go_together() {
        let (mut m, t0) = machine(true, 1);
        with_job(&mut m, t0);
        let runs = (0..4).map(|s| run(s, u64::from(s) + 1, true)).collect();
        m.received(t0, Some(ToWorker::Batch(runs)));
        polled(&mut m);
        for s in 0..3 {
            m.reported(done(s, u64::from(s) + 1, false));
            assert!(sent(polled(&mut m)).is_empty(), "slot {s}'s done waits");
        }
        m.reported(done(3, 4, false));
        match &sent(polled(&mut m))[..] {
            [ToCoordinator::Batch(dones)] => {
                let chunks: Vec<u64> = dones.iter().filter_map(chunk_of).collect();
                assert_eq!(chunks, [1, 2, 3, 4]);
            }
            other => panic!("{other:?}"),
        }
        // Not held here: not waited for.
        m.received(t0, Some(run(0, 5, false)));
        polled(&mut m);
        m.received(t0, Some(run(1, 6, true)));
        polled(&mut m);
        m.reported(done(0, 5, false));
        assert!(
            sent(polled(&mut m)).is_empty(),
            "the run of 6, held, is out"
        );
        m.reported(done(1, 6, false));
        assert_eq!(sent(polled(&mut m)).len(), 1);
        m.received(t0, Some(run(0, 5, false)));
        polled(&mut m);
        m.reported(done(0, 5, false));
        assert!(matches!(
            &sent(polled(&mut m))[..],
            [ToCoordinator::Done { chunk: 5, .. }]
        ));
        // A slot released with its run out.
        m.received(t0, Some(run(2, 7, true)));
        m.received(t0, Some(run(3, 8, true)));
        polled(&mut m);
        m.received(t0, Some(ToWorker::Release { slot: 3 }));
        polled(&mut m);
        m.reported(done(2, 7, false));
        assert!(matches!(
            &sent(polled(&mut m))[..],
            [ToCoordinator::Done { chunk: 7, .. }]
        ));

        // Two `Done`s waiting for their pushes' answers (chunks 2 and 4 each push a halo to
        // chunk 3, in process 2): the first answered does not go alone.
        let (mut m, t0) = machine(true, 1);
        with_job(&mut m, t0);
        m.received(t0, Some(roster(4)));
        m.received(
            t0,
            Some(ToWorker::Batch(vec![run(0, 2, true), run(1, 4, true)])),
        );
        polled(&mut m);
        m.reported(done(0, 2, true));
        m.reported(done(1, 4, true));
        let (pushed, _, up) = peer_outs(polled(&mut m));
        assert_eq!(pushed.len(), 2);
        assert!(up.is_empty(), "{up:?}");
        m.peer_answered(2, FromPeer::Ack { seq: 0, kept: true });
        let (_, _, up) = peer_outs(polled(&mut m));
        assert!(
            up.is_empty(),
            "the done of 2 waits for the one of 4: {up:?}"
        );
        m.peer_answered(2, FromPeer::Ack { seq: 1, kept: true });
        match &sent(polled(&mut m))[..] {
            [ToCoordinator::Batch(dones)] => {
                let chunks: Vec<u64> = dones.iter().filter_map(chunk_of).collect();
                assert_eq!(chunks, [2, 4]);
            }
            other => panic!("{other:?}"),
        }
    }

    /// A `Run` with a grant gives the slot's thread its chunk, and each granted one when it
    /// reports the one before; the `Done`s wait while granted runs are out and go in one
    /// `Batch` with the last one. A message of another kind (a heartbeat here) takes the
    /// waiting ones with it, first. A capture of a granted partition not given to the thread
    /// yet is answered here (the job's code encodes it); a `Recall` and an `Interrupt` give
    /// back what the thread was not given (`Returned`), at once; the interrupt goes to the
    /// chunk the thread has.
    #[test]
    fn a_grant_goes_to_the_thread_one_chunk_at_a_time_and_its_dones_together() {
        let (mut m, t0) = machine(true, 1);
        with_job(&mut m, t0);
        let run = |chunk: u64, then: Vec<u64>| ToWorker::Run {
            slot: 0,
            chunk,
            start: chunk * 10,
            end: chunk * 10 + 10,
            state: None,
            held: true,
            then: then.into_iter().map(|c| (c, c * 10, c * 10 + 10)).collect(),
        };
        let handed = |outs: &[Out]| -> Vec<u64> {
            outs.iter()
                .filter_map(|o| match o {
                    Out::Thread(0, ToThread::Run { chunk, .. }) => Some(*chunk),
                    _ => None,
                })
                .collect()
        };
        m.received(t0, Some(ToWorker::Batch(vec![run(1, vec![3, 5])])));
        assert_eq!(handed(&polled(&mut m)), [1]);
        m.reported(done(0, 1, false));
        assert_eq!(handed(&polled(&mut m)), [3], "the next, and nothing sent");
        m.reported(done(0, 3, false));
        assert_eq!(handed(&polled(&mut m)), [5]);
        m.reported(done(0, 5, false));
        match &sent(polled(&mut m))[..] {
            [ToCoordinator::Batch(dones)] => {
                let chunks: Vec<u64> = dones.iter().filter_map(chunk_of).collect();
                assert_eq!(chunks, [1, 3, 5]);
            }
            other => panic!("{other:?}"),
        }
        // Held back again; a heartbeat takes it along, ahead of it.
        m.received(t0, Some(run(7, vec![9])));
        polled(&mut m);
        m.reported(done(0, 7, false));
        assert_eq!(handed(&polled(&mut m)), [9]);
        m.tick(t0 + BEAT, vec![0]);
        let got = sent(polled(&mut m));
        assert!(
            matches!(
                &got[..],
                [
                    ToCoordinator::Done { chunk: 7, .. },
                    ToCoordinator::Heartbeat { .. }
                ]
            ),
            "{got:?}"
        );
        m.reported(done(0, 9, false));
        polled(&mut m);
        // A granted partition not started is captured here (the grant goes on); a recall
        // gives back the rest; the interrupt goes to 11.
        m.received(t0, Some(run(11, vec![13, 15, 17])));
        polled(&mut m);
        let capture = ToWorker::Capture {
            slot: 0,
            chunk: 15,
            folder: 0,
        };
        m.received(t0, Some(capture));
        asks_held(&mut m, 15, false);
        let state = Bytes::from_static(b"15");
        m.answer(Ok(Some(ToCoordinator::CapturedHeld { chunk: 15, state })));
        let got = sent(polled(&mut m));
        assert!(
            matches!(
                &got[..],
                [ToCoordinator::Captured { slot: 0, chunk: 15, state }] if state == "15"
            ),
            "{got:?}"
        );
        m.received(t0, Some(ToWorker::Recall { slot: 0 }));
        m.received(t0, Some(ToWorker::Interrupt { slot: 0, chunk: 11 }));
        let outs = polled(&mut m);
        let returned: Vec<Vec<u64>> = outs
            .iter()
            .filter_map(|o| match o {
                Out::Send(ToCoordinator::Returned { slot: 0, chunks }) => Some(chunks.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(returned, [vec![13, 15, 17]], "{outs:?}");
        assert!(
            matches!(
                outs.last(),
                Some(Out::Thread(0, ToThread::Interrupt { slot: 0, chunk: 11 }))
            ),
            "{outs:?}"
        );
        // Its end hands nothing more.
        m.reported(done(0, 11, false));
        assert!(handed(&polled(&mut m)).is_empty());
    }

    /// A batch inside a batch, and a grant after a chunk that is not a partition held
    /// here, end the process with a typed refusal.
    #[test]
    fn a_nested_batch_or_a_grant_after_a_fresh_run_is_refused() {
        let fresh = ToWorker::Run {
            slot: 0,
            chunk: 1,
            start: 10,
            end: 20,
            state: None,
            held: false,
            then: vec![(3, 30, 40)],
        };
        for (msg, why) in [
            (
                ToWorker::Batch(vec![ToWorker::Batch(Vec::new())]),
                "a batch inside a batch",
            ),
            (fresh, "a grant after a partition not held here"),
        ] {
            refused(msg, why);
        }
    }

    /// A held partition's part is written in the background and answered by its
    /// reference, in the folder and phase asked; the messages about that chunk wait behind
    /// the answer (in order, a second capture of it included), other chunks' go at once
    /// ("Order of the answers about a held partition").
    #[test]
    fn a_held_capture_is_answered_before_a_later_done_of_its_chunk() {
        let (mut m, t0) = machine(true, 1);
        with_job(&mut m, t0);
        with_store(&mut m, t0);
        m.received(
            t0,
            Some(ToWorker::CaptureHeld {
                chunk: 3,
                folder: 7,
            }),
        );
        let _ = polled(&mut m);
        m.answer(Ok(Some(captured_held(3, b"first"))));
        let outs = polled(&mut m);
        let [Out::Put(first)] = &outs[..] else {
            panic!("{outs:?}");
        };
        let first = first.clone();
        assert_eq!(
            (first.chunk, first.folder, first.phase, first.slot),
            (3, 7, 2, None)
        );
        assert_eq!(first.state, &b"first"[..]);
        // Chunk 3 runs again and ends while its part is written: its `Done` waits; chunk
        // 4's goes.
        m.received(t0, Some(run(0, 3, true)));
        assert!(matches!(
            &polled(&mut m)[..],
            [Out::Thread(
                0,
                ToThread::Run {
                    chunk: 3,
                    held: true,
                    ..
                }
            )]
        ));
        m.reported(done(0, 3, false));
        assert!(polled(&mut m).is_empty());
        m.reported(done(1, 4, false));
        assert_eq!(sent(polled(&mut m)), vec![done(1, 4, false)]);
        // A second capture of chunk 3 waits too.
        m.received(
            t0,
            Some(ToWorker::CaptureHeld {
                chunk: 3,
                folder: 8,
            }),
        );
        let _ = polled(&mut m);
        m.answer(Ok(Some(captured_held(3, b"second"))));
        assert!(polled(&mut m).is_empty());
        // The first write ends: its answer, then the `Done`, then the second write starts.
        m.stored(first, Ok(part(3, 7)));
        let outs = polled(&mut m);
        let [Out::Send(a), Out::Send(b), Out::Put(second)] = &outs[..] else {
            panic!("{outs:?}");
        };
        assert_eq!(
            a,
            &ToCoordinator::CapturedHeldPart {
                chunk: 3,
                part: part(3, 7)
            }
        );
        assert_eq!(b, &done(0, 3, false));
        assert_eq!(
            (second.folder, second.state.clone()),
            (8, Bytes::from_static(b"second"))
        );
        let second = second.clone();
        m.stored(second, Ok(part(3, 8)));
        assert_eq!(
            sent(polled(&mut m)),
            vec![ToCoordinator::CapturedHeldPart {
                chunk: 3,
                part: part(3, 8)
            }]
        );
        // Nothing waits any more: chunk 3's messages go at once.
        m.reported(done(0, 3, false));
        assert_eq!(sent(polled(&mut m)), vec![done(0, 3, false)]);
        assert_eq!(m.parts(), (2, 0));
    }

    /// A running chunk's captures are answered in the order they were asked, whatever
    /// order their writes end in, and its `Done` waits behind them (simulation seed 756221:
    /// a capture asked before a rollback, written after the one asked after it, was taken
    /// for the second).
    #[test]
    fn a_running_capture_is_answered_before_what_comes_after_it() {
        let (mut m, t0) = machine(true, 1);
        with_job(&mut m, t0);
        with_store(&mut m, t0);
        m.received(t0, Some(run(1, 5, false)));
        let capture = |folder| ToWorker::Capture {
            slot: 1,
            chunk: 5,
            folder,
        };
        let captured = |state: &'static [u8]| ToCoordinator::Captured {
            slot: 1,
            chunk: 5,
            state: Bytes::from_static(state),
        };
        m.received(t0, Some(capture(9)));
        let _ = polled(&mut m);
        m.reported(captured(b"old"));
        let outs = polled(&mut m);
        let [Out::Put(first)] = &outs[..] else {
            panic!("{outs:?}");
        };
        let first = first.clone();
        // A second capture of the same run of slot 1: its write waits for the first's.
        m.received(t0, Some(capture(9)));
        let _ = polled(&mut m);
        m.reported(captured(b"new"));
        assert!(polled(&mut m).is_empty());
        m.reported(done(1, 5, false));
        assert!(polled(&mut m).is_empty());
        m.stored(first, Ok(part(5, 9)));
        let outs = polled(&mut m);
        let [Out::Send(a), Out::Put(second)] = &outs[..] else {
            panic!("{outs:?}");
        };
        assert_eq!(
            a,
            &ToCoordinator::CapturedPart {
                slot: 1,
                chunk: 5,
                part: part(5, 9)
            }
        );
        assert_eq!(second.state, &b"new"[..]);
        let second = second.clone();
        let mut later = part(5, 9);
        later.key.push('x');
        m.stored(second, Ok(later.clone()));
        assert_eq!(
            sent(polled(&mut m)),
            vec![
                ToCoordinator::CapturedPart {
                    slot: 1,
                    chunk: 5,
                    part: later
                },
                done(1, 5, false)
            ]
        );
    }

    /// Without a store that this process showed it reaches, a held partition's bytes go to
    /// the coordinator at once; a write that fails sends them too, and so do all later
    /// ones; a running chunk's capture is written in its `Capture`'s folder.
    #[test]
    fn parts_go_as_bytes_without_a_usable_store() {
        let (mut m, t0) = machine(true, 1);
        with_job(&mut m, t0);
        m.received(
            t0,
            Some(ToWorker::CaptureHeld {
                chunk: 3,
                folder: 7,
            }),
        );
        let _ = polled(&mut m);
        m.answer(Ok(Some(captured_held(3, b"state"))));
        assert_eq!(sent(polled(&mut m)), vec![captured_held(3, b"state")]);
        with_store(&mut m, t0);
        m.received(t0, Some(run(1, 5, false)));
        m.received(
            t0,
            Some(ToWorker::Capture {
                slot: 1,
                chunk: 5,
                folder: 9,
            }),
        );
        let outs = polled(&mut m);
        assert!(matches!(
            &outs[..],
            [
                Out::Thread(0, ToThread::Run { chunk: 5, .. }),
                Out::Thread(0, ToThread::Capture { slot: 1, chunk: 5 })
            ]
        ));
        let captured = ToCoordinator::Captured {
            slot: 1,
            chunk: 5,
            state: Bytes::from_static(b"running"),
        };
        m.reported(captured.clone());
        let outs = polled(&mut m);
        let [Out::Put(put)] = &outs[..] else {
            panic!("{outs:?}");
        };
        assert_eq!((put.folder, put.slot, put.phase), (9, Some(1), 2));
        // The write fails: the bytes go, and from now on all of them.
        let failed = crate::snapshot::Error::NotFound {
            what: "the bucket".to_owned(),
        };
        m.stored(put.clone(), Err(failed));
        assert_eq!(sent(polled(&mut m)), vec![captured]);
        m.received(
            t0,
            Some(ToWorker::CaptureHeld {
                chunk: 3,
                folder: 9,
            }),
        );
        let _ = polled(&mut m);
        m.answer(Ok(Some(captured_held(3, b"again"))));
        assert_eq!(sent(polled(&mut m)), vec![captured_held(3, b"again")]);
        assert_eq!(m.parts(), (0, 3));
    }

    /// `Abandon` of a running chunk and of one waiting behind it go to the thread, in order,
    /// and nothing goes up until the thread answers; its `Abandoned`s go up in the order it
    /// sent them, alone.
    #[test]
    fn abandons_go_to_the_thread_and_only_its_answers_go_up() {
        let (mut m, t0) = machine(true, 2);
        with_job(&mut m, t0);
        m.received(t0, Some(run(4, 1, false)));
        m.received(t0, Some(run(5, 2, false)));
        let _ = polled(&mut m);
        m.received(t0, Some(ToWorker::Abandon { slot: 4, chunk: 1 }));
        m.received(t0, Some(ToWorker::Abandon { slot: 5, chunk: 2 }));
        let outs = polled(&mut m);
        assert!(
            matches!(
                &outs[..],
                [
                    Out::Thread(1, ToThread::Abandon { slot: 4, chunk: 1 }),
                    Out::Thread(1, ToThread::Abandon { slot: 5, chunk: 2 }),
                ]
            ),
            "{outs:?}"
        );
        // The waiting one is answered at once, the running one at its next adjustment point.
        let abandoned = |slot, chunk| ToCoordinator::Abandoned { slot, chunk };
        m.reported(abandoned(5, 2));
        m.reported(abandoned(4, 1));
        assert_eq!(sent(polled(&mut m)), vec![abandoned(5, 2), abandoned(4, 1)]);
        // Their partitions are gone from here: a neighbour's halos for them go up.
        m.received(t0, Some(run(4, 0, false)));
        let _ = polled(&mut m);
        m.reported(done(4, 0, true));
        assert_eq!(sent(polled(&mut m)), vec![done(4, 0, true)]);
    }

    /// Partitions placed here: a message about one being placed waits for it, and so does
    /// everything after it; one that could not be read or decoded is refused at once
    /// (`FailedHeld`) though nothing asks about it; one placed with `export` sends its
    /// halos. A job without partitions refuses a placement: the process ends.
    #[test]
    fn placed_partitions_are_held_or_refused_and_messages_about_them_wait() {
        let (mut m, t0) = machine(true, 1);
        with_job(&mut m, t0);
        let state = Bytes::from_static(b"partition");
        m.received(
            t0,
            Some(ToWorker::Place {
                chunk: 1,
                state: state.clone(),
                export: Some(7),
            }),
        );
        m.received(
            t0,
            Some(ToWorker::PlacePart {
                chunk: 3,
                part: part(3, 1),
                export: None,
            }),
        );
        let outs = polled(&mut m);
        let [Out::Place(one), Out::Place(three)] = &outs[..] else {
            panic!("{outs:?}");
        };
        assert_eq!(
            (one.chunk, &one.from, one.export),
            (1, &Source::Sent(state), Some(7))
        );
        assert_eq!((three.chunk, &three.from), (3, &Source::Part(part(3, 1))));
        assert!(three.store.is_none());
        // A capture of chunk 1 waits for its placement, and a run of another chunk after it.
        m.received(
            t0,
            Some(ToWorker::CaptureHeld {
                chunk: 1,
                folder: 4,
            }),
        );
        m.received(t0, Some(run(0, 5, false)));
        assert!(polled(&mut m).is_empty());
        // Meanwhile the threads' reports and the heartbeats go.
        m.reported(done(1, 6, false));
        m.tick(t0 + BEAT, vec![1]);
        assert_eq!(
            sent(polled(&mut m)),
            vec![
                done(1, 6, false),
                ToCoordinator::Heartbeat { progress: vec![1] }
            ]
        );
        // Chunk 3's part cannot be read: refused at once; chunk 1 still waits.
        let unread = Failure::Store {
            chain: vec!["no store".to_owned()],
        };
        m.placed(3, Err(unread.clone()));
        assert_eq!(
            sent(polled(&mut m)),
            vec![ToCoordinator::FailedHeld {
                chunk: 3,
                failure: unread
            }]
        );
        // Chunk 1 is placed: its halos (no neighbour here), then the capture, then the run.
        m.placed(
            1,
            Ok(Some(Exported {
                placement: 7,
                halos: vec![(Some(0), halo(1, "up")), (Some(2), halo(1, "down"))],
            })),
        );
        let outs = polled(&mut m);
        let [
            Out::Send(exported),
            Out::Code(Code::Held {
                chunk: 1,
                surrender: false,
            }),
        ] = &outs[..]
        else {
            panic!("{outs:?}");
        };
        assert_eq!(
            exported,
            &ToCoordinator::Exported {
                chunk: 1,
                halos: chain(1, Halo::Sent(halo(1, "up")), Halo::Sent(halo(1, "down"))),
                placement: 7,
            }
        );
        m.answer(Ok(Some(captured_held(1, b"partition"))));
        let outs = polled(&mut m);
        assert!(
            matches!(
                &outs[..],
                [
                    Out::Send(ToCoordinator::CapturedHeld { chunk: 1, .. }),
                    Out::Thread(0, ToThread::Run { chunk: 5, .. })
                ]
            ),
            "{outs:?}"
        );
        // A job without partitions.
        let (mut m, t0) = machine(false, 1);
        with_job(&mut m, t0);
        m.received(
            t0,
            Some(ToWorker::Place {
                chunk: 1,
                state: Bytes::new(),
                export: None,
            }),
        );
        let outs = polled(&mut m);
        assert!(
            matches!(
                &outs[..],
                [Out::End {
                    result: Err(Error::Rejected { .. }),
                    ..
                }]
            ),
            "{outs:?}"
        );
    }

    /// `Output` (the job finished) asks the job's code, after a placement of its partition
    /// ended, and takes nothing else until answered; its answer goes before the
    /// `Surrendered` asked after it. A job without partitions is refused.
    #[test]
    fn an_output_asks_the_job_s_code_in_order_with_the_partition_s_other_answers() {
        let (mut m, t0) = machine(true, 1);
        with_job(&mut m, t0);
        m.received(
            t0,
            Some(ToWorker::Place {
                chunk: 2,
                state: Bytes::from_static(b"partition"),
                export: None,
            }),
        );
        assert!(matches!(&polled(&mut m)[..], [Out::Place(_)]));
        m.received(t0, Some(ToWorker::Output { chunk: 2, phase: 2 }));
        m.received(t0, Some(ToWorker::Surrender { chunk: 2 }));
        assert!(polled(&mut m).is_empty(), "waits for the placement");
        m.placed(2, Ok(None));
        let outs = polled(&mut m);
        assert!(
            matches!(&outs[..], [Out::Code(Code::Output { chunk: 2, phase: 2 })]),
            "{outs:?}"
        );
        m.answer(Ok(Some(ToCoordinator::OutputDone { chunk: 2 })));
        let outs = polled(&mut m);
        let [
            Out::Send(ToCoordinator::OutputDone { chunk: 2 }),
            Out::Code(Code::Held {
                chunk: 2,
                surrender: true,
            }),
        ] = &outs[..]
        else {
            panic!("{outs:?}");
        };
        m.answer(Ok(Some(ToCoordinator::Surrendered {
            chunk: 2,
            state: Bytes::from_static(b"partition"),
        })));
        assert!(matches!(
            &sent(polled(&mut m))[..],
            [ToCoordinator::Surrendered { chunk: 2, .. }]
        ));
        assert_eq!(chunk_of(&ToCoordinator::OutputDone { chunk: 7 }), Some(7));
        // A job without partitions.
        let (mut m, t0) = machine(false, 1);
        with_job(&mut m, t0);
        m.received(t0, Some(ToWorker::Output { chunk: 1, phase: 2 }));
        let outs = polled(&mut m);
        assert!(
            matches!(
                &outs[..],
                [Out::End {
                    result: Err(Error::Rejected { .. }),
                    ..
                }]
            ),
            "{outs:?}"
        );
    }

    /// `Forget` drops the partitions here and the placements under way: halos are no
    /// longer kept for them, and a message about a partition that was being placed no
    /// longer waits.
    #[test]
    fn forget_drops_the_partitions_here() {
        let (mut m, t0) = machine(true, 1);
        with_job(&mut m, t0);
        m.received(t0, Some(run(0, 2, false)));
        m.received(
            t0,
            Some(ToWorker::Place {
                chunk: 3,
                state: Bytes::new(),
                export: None,
            }),
        );
        let _ = polled(&mut m);
        m.received(t0, Some(ToWorker::Forget));
        assert!(matches!(&polled(&mut m)[..], [Out::Forget]));
        // Chunk 1's halos for 0 and 2 go up: 2 is not here any more.
        m.received(t0, Some(run(1, 1, false)));
        let _ = polled(&mut m);
        m.reported(done(1, 1, true));
        assert_eq!(sent(polled(&mut m)), vec![done(1, 1, true)]);
        // Chunk 3's placement was dropped: a capture of it is asked at once.
        m.received(
            t0,
            Some(ToWorker::CaptureHeld {
                chunk: 3,
                folder: 2,
            }),
        );
        assert!(matches!(
            &polled(&mut m)[..],
            [Out::Code(Code::Held { chunk: 3, .. })]
        ));
    }

    /// The lease runs from the last frame received (a piece of a message too), and only
    /// frames re-arm it: the coordinator is given up at the tick that reaches its end, not
    /// before, with a typed error. Heartbeats go every period meanwhile.
    #[test]
    fn the_coordinator_is_given_up_at_the_tick_that_reaches_the_lease_s_end() {
        let (mut m, t0) = machine(false, 1);
        assert_eq!(m.deadline(), t0 + BEAT);
        let heartbeats = |m: &mut Machine, at: Instant| {
            m.tick(at, vec![7]);
            let outs = polled(m);
            outs.iter()
                .map(|o| match o {
                    Out::Send(ToCoordinator::Heartbeat { progress }) => {
                        assert_eq!(progress, &vec![7]);
                    }
                    o => panic!("{o:?}"),
                })
                .count()
        };
        assert_eq!(heartbeats(&mut m, t0 + BEAT / 2), 0);
        assert_eq!(heartbeats(&mut m, t0 + BEAT), 1);
        assert_eq!(heartbeats(&mut m, t0 + BEAT), 0);
        // A piece of a message re-arms the lease.
        m.received(t0 + Duration::from_secs(5), None);
        assert_eq!(heartbeats(&mut m, t0 + LEASE), 1);
        assert_eq!(
            heartbeats(&mut m, t0 + Duration::from_secs(15) - BEAT / 10),
            1
        );
        assert_eq!(m.deadline(), t0 + Duration::from_secs(4));
        let ends = t0 + Duration::from_secs(15);
        // Late heartbeats go one per tick; none prove anything about the coordinator.
        while m.deadline() < ends {
            assert_eq!(heartbeats(&mut m, ends - BEAT / 10), 1);
        }
        assert_eq!(m.deadline(), ends);
        m.tick(ends, vec![7]);
        let outs = polled(&mut m);
        let [
            Out::End {
                tell: None,
                result: Err(Error::LeaseExpired { peer, after }),
            },
        ] = &outs[..]
        else {
            panic!("{outs:?}");
        };
        assert_eq!((peer.as_str(), *after), ("coordinator", LEASE));
        // After the end nothing is taken.
        m.received(ends, Some(ToWorker::End));
        m.tick(ends + LEASE, vec![7]);
        assert!(polled(&mut m).is_empty());
    }

    /// Slots: a released slot is no longer a worker (a message for it ends the process);
    /// a thread whose slots are all released is closed. `Leave` goes once, with the grace;
    /// `End` ends with whether this process left. An undecodable job value tells the
    /// coordinator before the process ends.
    /// A roster for process 1 of a job whose chunk 3 is held by process 2 (at
    /// `127.0.0.1:9002`), generation `generation`.
    fn roster(generation: u64) -> ToWorker {
        ToWorker::Peers {
            me: 1,
            session: [7; 16],
            generation,
            addrs: vec![(2, "127.0.0.1:9002".into())],
            holders: vec![(3, Some(2))],
        }
    }

    /// The pushes and answers among some orders, and the messages for the coordinator.
    type PeerOuts = (Vec<(u64, ToPeer)>, Vec<(u64, FromPeer)>, Vec<ToCoordinator>);

    /// The pushes and answers among `outs`, and the messages for the coordinator.
    fn peer_outs(outs: Vec<Out>) -> PeerOuts {
        let (mut pushed, mut answers, mut sent) = (Vec::new(), Vec::new(), Vec::new());
        for o in outs {
            match o {
                Out::Peer { to, msg, .. } => pushed.push((to, msg)),
                Out::Answer { to, msg } => answers.push((to, msg)),
                Out::Send(m) => sent.push(m),
                Out::Roster { .. } | Out::Thread(..) => {}
                o => panic!("unexpected {o:?}"),
            }
        }
        (pushed, answers, sent)
    }

    /// A halo for a partition a peer holds goes there; the `Done` waits for the answer and
    /// says where it was kept, or carries the bytes if the peer refused it or its link went
    /// down; what the process decided after the `Done` waits behind it, but a heartbeat.
    #[test]
    fn a_halo_for_a_peer_s_partition_is_pushed_and_the_done_waits_for_its_answer() {
        let (mut m, t0) = machine(true, 1);
        with_job(&mut m, t0);
        m.received(t0, Some(roster(4)));
        assert!(matches!(
            &polled(&mut m)[..],
            [Out::Roster {
                me: 1,
                session: [7, ..]
            }]
        ));
        m.received(t0, Some(run(0, 2, true)));
        let _ = polled(&mut m);
        // Chunk 2 ends: its halo for chunk 1 goes up, the one for chunk 3 to process 2.
        m.reported(done(0, 2, true));
        let (pushed, _, up) = peer_outs(polled(&mut m));
        assert!(up.is_empty(), "{up:?}");
        let [
            (
                2,
                ToPeer::Halo {
                    seq,
                    generation: 4,
                    phase: 2,
                    from: 2,
                    to: 3,
                    bytes,
                },
            ),
        ] = &pushed[..]
        else {
            panic!("{pushed:?}");
        };
        assert_eq!(bytes, &halo(2, "down"));
        // Meanwhile the process leaves: `Leave` waits behind the `Done`; a heartbeat does not.
        m.leave();
        m.tick(t0 + Duration::from_secs(1), vec![0]);
        let (_, _, up) = peer_outs(polled(&mut m));
        assert!(
            matches!(&up[..], [ToCoordinator::Heartbeat { .. }]),
            "{up:?}"
        );
        // An answer from another peer, or to no push, changes nothing.
        m.peer_answered(
            5,
            FromPeer::Ack {
                seq: *seq,
                kept: true,
            },
        );
        m.peer_answered(
            2,
            FromPeer::Ack {
                seq: seq + 1,
                kept: true,
            },
        );
        assert!(polled(&mut m).is_empty());
        m.peer_answered(
            2,
            FromPeer::Ack {
                seq: *seq,
                kept: true,
            },
        );
        let kept = with_halos(done(0, 2, true), Halo::Sent(halo(2, "up")), Halo::KeptAt(2));
        let (_, _, up) = peer_outs(polled(&mut m));
        assert!(
            matches!(&up[..], [k, ToCoordinator::Leave { .. }] if *k == kept),
            "{up:?}"
        );
        assert_eq!(m.peer_counts().kept, 1);

        // Refused: the bytes go up after all.
        let (mut m, t0) = machine(true, 1);
        with_job(&mut m, t0);
        m.received(t0, Some(roster(4)));
        m.received(t0, Some(run(0, 2, true)));
        let _ = polled(&mut m);
        m.reported(done(0, 2, true));
        let _ = polled(&mut m);
        m.peer_answered(
            2,
            FromPeer::Ack {
                seq: 0,
                kept: false,
            },
        );
        assert_eq!(sent(polled(&mut m)), vec![done(0, 2, true)]);

        // The link goes down: the bytes go up, the coordinator hears of it once, and the next
        // halo for that peer goes up at once.
        let (mut m, t0) = machine(true, 1);
        with_job(&mut m, t0);
        m.received(t0, Some(roster(4)));
        m.received(t0, Some(run(0, 2, true)));
        let _ = polled(&mut m);
        m.reported(done(0, 2, true));
        let _ = polled(&mut m);
        m.peer_down(2, "reset".into());
        m.peer_down(2, "reset again".into());
        let unreachable = ToCoordinator::Unreachable {
            process: 2,
            reason: "reset".into(),
        };
        assert_eq!(sent(polled(&mut m)), vec![done(0, 2, true), unreachable]);
        m.received(t0, Some(run(0, 2, true)));
        let _ = polled(&mut m);
        m.reported(done(0, 2, true));
        assert_eq!(sent(polled(&mut m)), vec![done(0, 2, true)]);
        assert_eq!(m.peer_counts().unreachable, 1);
        // Offered again by the coordinator (its address in a roster): tried again.
        m.received(t0, Some(roster(4)));
        m.received(t0, Some(run(0, 2, true)));
        let _ = polled(&mut m);
        m.reported(done(0, 2, true));
        let (pushed, _, up) = peer_outs(polled(&mut m));
        assert!(up.is_empty(), "{up:?}");
        assert!(
            matches!(&pushed[..], [(2, ToPeer::Halo { .. })]),
            "{pushed:?}"
        );
        m.peer_answered(2, FromPeer::Ack { seq: 1, kept: true });
        let _ = polled(&mut m);
        // A new generation (after a rollback) tries that peer again.
        m.received(t0, Some(ToWorker::Forget));
        let _ = polled(&mut m);
        m.received(t0, Some(roster(5)));
        m.received(t0, Some(run(0, 2, true)));
        let _ = polled(&mut m);
        m.reported(done(0, 2, true));
        let (pushed, _, up) = peer_outs(polled(&mut m));
        assert!(up.is_empty());
        assert!(matches!(
            &pushed[..],
            [(2, ToPeer::Halo { generation: 5, .. })]
        ));
    }

    /// A copy round: each listed partition is encoded by the job's code in turn (later
    /// messages wait), pushed to the buddy as it comes, and `Copied` says which the buddy
    /// kept once every push is answered; a buddy whose link goes down keeps none.
    #[test]
    fn a_copy_round_pushes_each_partition_to_the_buddy_and_says_which_it_kept() {
        let (mut m, t0) = machine(true, 1);
        with_job(&mut m, t0);
        m.received(t0, Some(roster(4)));
        let _ = polled(&mut m);
        let copy = |chunks: Vec<u64>| ToWorker::Copy {
            phase: 2,
            generation: 4,
            buddy: 2,
            addr: "127.0.0.1:9002".into(),
            chunks,
        };
        let begin = ToWorker::Begin {
            chunk: 5,
            halos: vec![(4, Halo::Sent(halo(4, "down")))],
        };
        m.received(t0, Some(ToWorker::Batch(vec![copy(vec![3, 5]), begin])));
        asks_held(&mut m, 3, false);
        m.answer(Ok(Some(captured_held(3, b"three"))));
        let outs = polled(&mut m);
        let [
            Out::Peer {
                to: 2,
                msg:
                    ToPeer::Copy {
                        seq: first,
                        generation: 4,
                        phase: 2,
                        chunk: 3,
                        bytes,
                    },
                ..
            },
            Out::Code(Code::Held { chunk: 5, .. }),
        ] = &outs[..]
        else {
            panic!("{outs:?}");
        };
        assert_eq!(&bytes[..], b"three");
        let first = *first;
        m.answer(Ok(Some(captured_held(5, b"five"))));
        // The partition's `Begin` waited for its copy.
        let outs = polled(&mut m);
        assert!(
            matches!(
                &outs[..],
                [
                    Out::Peer {
                        msg: ToPeer::Copy { chunk: 5, .. },
                        ..
                    },
                    Out::Code(Code::Begin { chunk: 5, .. })
                ]
            ),
            "{outs:?}"
        );
        m.answer(Ok(None));
        m.peer_answered(
            2,
            FromPeer::Ack {
                seq: first + 1,
                kept: false,
            },
        );
        assert!(polled(&mut m).is_empty(), "one push is not answered");
        m.peer_answered(
            2,
            FromPeer::Ack {
                seq: first,
                kept: true,
            },
        );
        let copied = ToCoordinator::Copied {
            phase: 2,
            generation: 4,
            buddy: 2,
            copied: vec![(3, 5)],
            refused: vec![5],
            log_bytes: 0,
        };
        assert_eq!(sent(polled(&mut m)), vec![copied]);
        let c = m.peer_counts();
        assert_eq!(
            (c.copies_pushed, c.copy_bytes_pushed, c.copies_kept),
            (2, 9, 1)
        );

        // The buddy's link goes down: nothing kept; a buddy down is not pushed to.
        m.received(t0, Some(copy(vec![3])));
        let _ = polled(&mut m);
        m.answer(Ok(Some(captured_held(3, b"three"))));
        let _ = polled(&mut m);
        m.peer_down(2, "reset".into());
        let up = sent(polled(&mut m));
        assert!(
            matches!(&up[..], [ToCoordinator::Unreachable { process: 2, .. }, ToCoordinator::Copied { copied, refused, .. }] if copied.is_empty() && refused == &[3]),
            "{up:?}"
        );
        m.received(t0, Some(copy(vec![3, 5])));
        let _ = polled(&mut m);
        m.answer(Ok(Some(captured_held(3, b"three"))));
        let _ = polled(&mut m);
        m.answer(Ok(Some(ToCoordinator::Missing { chunk: 5 })));
        let up = sent(polled(&mut m));
        assert!(
            matches!(&up[..], [ToCoordinator::Copied { copied, refused, .. }] if copied.is_empty() && refused == &[3, 5]),
            "{up:?}"
        );
        // A round out of chunk order ends the process.
        refused(copy(vec![5, 3]), "out of chunk order");
    }

    /// The halo log keeps each `Done`'s halos as they leave the partition (those kept here
    /// and those pushed to peers too), from the phase `Logs` names; a later `Logs` drops the
    /// older phases, and `Forget` all. Without `Logs`, nothing is kept.
    #[test]
    fn the_halo_log_keeps_the_exports_of_the_phases_asked() {
        let (mut m, t0) = machine(true, 1);
        with_job(&mut m, t0);
        m.received(t0, Some(run(0, 2, true)));
        m.reported(done(0, 2, true));
        let _ = polled(&mut m);
        assert_eq!(m.log().0.len(), 0, "not asked");
        // Chunk 2's halo for chunk 3 is kept here, the other goes up: both are logged.
        log_two_of_phase_2(&mut m, t0);
        let (log, bytes, from) = m.log();
        let logged: Vec<(u64, u64, usize)> =
            log.iter().map(|(p, c, h)| (*p, *c, h.len())).collect();
        assert_eq!(logged, vec![(2, 3, 2), (2, 2, 2)]);
        assert_eq!(log[1].2[1], (Some(3), halo(2, "down")));
        assert_eq!(from, Some(2));
        let one = bytes;
        to_phase(&mut m, t0, 3);
        m.received(t0, Some(run(0, 2, true)));
        let _ = polled(&mut m);
        m.reported(done(0, 2, true));
        let _ = polled(&mut m);
        assert_eq!(m.log().0.len(), 3);
        m.received(t0, Some(ToWorker::Logs { from: 3 }));
        let (log, bytes, _) = m.log();
        assert_eq!((log.len(), log[0].0, bytes), (1, 3, one / 2));
        m.received(t0, Some(ToWorker::Forget));
        let _ = polled(&mut m);
        assert_eq!((m.log().0.len(), m.log().1), (0, 0));
        // The rollback went back to phase 1, before the log's trim (3): that phase is logged
        // (the restored run's first copies are of it), and so are the exports of a
        // partition placed by the rollback that had ended it (`Exported`).
        to_phase(&mut m, t0, 1);
        m.received(
            t0,
            Some(ToWorker::Place {
                chunk: 5,
                state: Bytes::from_static(b"partition"),
                export: Some(1),
            }),
        );
        let _ = polled(&mut m);
        m.placed(
            5,
            Ok(Some(Exported {
                placement: 1,
                halos: vec![(Some(4), halo(5, "up")), (Some(6), halo(5, "down"))],
            })),
        );
        let _ = polled(&mut m);
        m.received(t0, Some(run(0, 2, true)));
        let _ = polled(&mut m);
        m.reported(done(0, 2, true));
        let _ = polled(&mut m);
        let logged: Vec<(u64, u64, usize)> = m
            .log()
            .0
            .iter()
            .map(|(p, c, h)| (*p, *c, h.len()))
            .collect();
        assert_eq!(logged, vec![(1, 5, 2), (1, 2, 2)]);
    }

    /// A partition replayed here logs what it exported in the phases it went through, those
    /// the log keeps, in phase order among the others' records; and takes them along when
    /// it leaves.
    #[test]
    fn a_replayed_partition_s_exports_join_the_halo_log_in_phase_order() {
        let (mut m, t0) = machine(true, 1);
        with_job(&mut m, t0);
        log_two_of_phase_2(&mut m, t0);
        let (_, before, _) = m.log();
        let pieces = |phase: u64| vec![(Some(4), halo(5, &format!("phase {phase}")))];
        m.log_replayed(5, (1..=3).map(|p| (p, pieces(p))).collect());
        let (log, bytes, _) = m.log();
        let order: Vec<(u64, u64)> = log.iter().map(|(p, c, _)| (*p, *c)).collect();
        assert_eq!(order, vec![(2, 3), (2, 2), (2, 5), (3, 5)]);
        let added: u64 = [2, 3].iter().map(|&p| pieces(p)[0].1.len() as u64).sum();
        assert_eq!(bytes, before + added);
        let leaving = m.log_of_leaving(5);
        let Some(ToCoordinator::LogOf { chunk: 5, records }) = &leaving else {
            panic!("{leaving:?}");
        };
        let phases: Vec<u64> = records.iter().map(|(p, ..)| *p).collect();
        assert_eq!(phases, vec![2, 3]);
        assert_eq!(m.log().1, before);
    }

    /// A partition that leaves this process (`Surrendered`, `Yielded`) takes the records of
    /// the halo log it exported here along, in a `LogOf` right before the message that
    /// hands it back, and they leave the log (protocol 26); the other partitions' records
    /// stay. A partition that exported nothing here sends none.
    #[test]
    fn a_partition_that_leaves_takes_its_halo_log_along() {
        let (mut m, t0) = machine(true, 1);
        with_job(&mut m, t0);
        log_two_of_phase_2(&mut m, t0);
        let (_, all, _) = m.log();
        to_phase(&mut m, t0, 3);
        m.received(t0, Some(ToWorker::Surrender { chunk: 3 }));
        asks_held(&mut m, 3, true);
        let state = Bytes::from_static(b"partition");
        m.answer(Ok(Some(ToCoordinator::Surrendered {
            chunk: 3,
            state: state.clone(),
        })));
        // (The halos kept here for it go up in `Released`, between the two.)
        let up = sent(polled(&mut m));
        let [
            ToCoordinator::LogOf { chunk: 3, records },
            ToCoordinator::Released { chunk: 3, .. },
            ToCoordinator::Surrendered { chunk: 3, .. },
        ] = &up[..]
        else {
            panic!("{up:?}");
        };
        let of: Vec<(u64, u64, usize)> =
            records.iter().map(|(p, c, h)| (*p, *c, h.len())).collect();
        assert_eq!(of, vec![(2, 3, 2)]);
        let (log, bytes, _) = m.log();
        let left: Vec<(u64, u64)> = log.iter().map(|(p, c, _)| (*p, *c)).collect();
        assert_eq!(left, vec![(2, 2)]);
        assert_eq!(bytes, all / 2);
        // Chunk 2 leaves too, handed back after an interrupt; chunk 7 exported nothing here.
        m.received(t0, Some(run(0, 2, true)));
        m.received(t0, Some(run(1, 7, false)));
        let _ = polled(&mut m);
        for (slot, chunk) in [(0, 2), (1, 7)] {
            m.reported(ToCoordinator::Yielded {
                slot,
                chunk,
                state: state.clone(),
                iterations: 0,
                busy_ns: 0,
            });
        }
        let up: Vec<_> = sent(polled(&mut m))
            .into_iter()
            .filter(|m| !matches!(m, ToCoordinator::Released { .. }))
            .collect();
        let [
            ToCoordinator::LogOf { chunk: 2, records },
            ToCoordinator::Yielded { chunk: 2, .. },
            ToCoordinator::Yielded { chunk: 7, .. },
        ] = &up[..]
        else {
            panic!("{up:?}");
        };
        assert_eq!(records.len(), 1);
        assert_eq!((m.log().0.len(), m.log().1), (0, 0));
    }

    /// The replay of attempt `attempt` ended with chunk 5 replayed: `m` says so, alone,
    /// and names the phase of the copy it replayed from (returned).
    fn replayed_5(m: &mut Machine, attempt: u64) -> u64 {
        m.replayed(attempt, Ok(vec![(5, Vec::new(), Vec::new())]));
        let up = sent(polled(m));
        match &up[..] {
            [
                ToCoordinator::Replayed {
                    attempt: a,
                    chunk: 5,
                    copy_phase,
                    ..
                },
            ] if *a == attempt => *copy_phase,
            _ => panic!("{up:?}"),
        }
    }

    /// A buddy that no longer keeps the copies a `Recover` names (two newer rounds came, whose
    /// answers the coordinator never had) replays from the newest phase of which it keeps a
    /// copy of every partition asked, with the job values and pieces of the phases since,
    /// and says so; copies of no common phase, or copies sent along of the named phase, and
    /// it refuses as before.
    #[test]
    fn a_replay_starts_from_newer_copies_when_the_named_ones_are_gone() {
        let (mut m, t0) = machine(true, 1);
        with_job(&mut m, t0);
        m.received(t0, Some(roster(4)));
        let _ = polled(&mut m);
        let copy = |seq, phase, chunk| ToPeer::Copy {
            seq,
            generation: 4,
            phase,
            chunk,
            bytes: Bytes::from(vec![(10 * phase + chunk) as u8; 4]),
        };
        // Chunk 5: phases 1, 2, 3 (1 dropped); chunk 6: 2, 3; chunk 7: 2 only.
        for (seq, (phase, chunk)) in [(1, 5), (1, 6), (2, 5), (2, 6), (3, 5), (3, 6), (2, 7)]
            .into_iter()
            .enumerate()
        {
            m.peer_received(9, copy(seq as u64, phase, chunk));
        }
        let _ = polled(&mut m);
        let recover = |attempt, chunks: Vec<u64>, copies| ToWorker::Recover {
            attempt,
            copy_phase: 1,
            phase: 5,
            total: 8,
            chunks: chunks
                .into_iter()
                .map(|c| (c, 10 * c, 10 * c + 10, false))
                .collect(),
            jobs: (1..=5).map(|p| (p, Bytes::from(vec![p as u8]))).collect(),
            halos: (1..5)
                .map(|p| (p, 4, 5, Bytes::from(vec![p as u8])))
                .collect(),
            copies,
        };
        // 5 and 6 share phases 2 and 3: the newest.
        m.received(t0, Some(recover(7, vec![5, 6], Vec::new())));
        let outs = polled(&mut m);
        let [Out::Replay(r)] = &outs[..] else {
            panic!("{outs:?}");
        };
        assert_eq!(r.copy_phase, 3);
        let parts: Vec<(u64, u8)> = r.parts.iter().map(|p| (p.0, p.3[0])).collect();
        assert_eq!(parts, vec![(5, 35), (6, 36)]);
        assert_eq!(
            r.jobs.iter().map(|j| j.0).collect::<Vec<_>>(),
            vec![3, 4, 5]
        );
        assert_eq!(r.halos.iter().map(|h| h.0).collect::<Vec<_>>(), vec![3, 4]);
        assert_eq!(replayed_5(&mut m, 7), 3);
        // Used up: phase 3 and older gone.
        assert!(m.copy_at(5, 2).is_none() && m.copy_at(6, 3).is_none());
        for (seq, (phase, chunk)) in [(2, 1), (3, 1)].into_iter().enumerate() {
            m.peer_received(9, copy(10 + seq as u64, phase, chunk));
        }
        let _ = polled(&mut m);
        // 1 (2 and 3) and 7 (2 only): phase 2.
        m.received(t0, Some(recover(8, vec![1, 7], Vec::new())));
        let outs = polled(&mut m);
        assert!(
            matches!(&outs[..], [Out::Replay(r)] if r.copy_phase == 2),
            "{outs:?}"
        );
        // A copy sent along is of the named phase: no other phase for the rest.
        m.peer_received(9, copy(20, 4, 6));
        m.peer_received(9, copy(21, 4, 7));
        let _ = polled(&mut m);
        let sent_along = vec![(6, Bytes::from_static(b"six"))];
        m.received(t0, Some(recover(9, vec![6, 7], sent_along)));
        assert!(matches!(
            &sent(polled(&mut m))[..],
            [ToCoordinator::ReplayFailed { attempt: 9, .. }]
        ));
    }

    /// Local recovery, the process's side: a `SendLog` gets the log's records of the phases
    /// asked with only the pieces for the chunks asked (and those for everyone); a
    /// `SendCopies` gets the copies of the phase asked, which are used up (a newer one
    /// stays); a `Recover` goes to the background with the copies it names (its own or
    /// sent), and its outcome goes up, unless a `Forget` came first; one without its copy
    /// is answered `ReplayFailed` at once, and one of a chunk past the last ends the process.
    #[test]
    fn recovery_messages_are_answered_from_the_log_and_the_copies() {
        let (mut m, t0) = machine(true, 1);
        with_job(&mut m, t0);
        m.received(t0, Some(ToWorker::Logs { from: 2 }));
        m.received(t0, Some(roster(4)));
        m.received(t0, Some(run(0, 2, true)));
        let _ = polled(&mut m);
        m.reported(done(0, 2, true));
        let _ = polled(&mut m);
        // Its halo for chunk 3 was pushed to process 2, which keeps it.
        m.peer_answered(2, FromPeer::Ack { seq: 0, kept: true });
        let _ = polled(&mut m);
        m.received(
            t0,
            Some(ToWorker::SendLog {
                attempt: 7,
                from: 2,
                through: 2,
                to: vec![3],
            }),
        );
        let up = sent(polled(&mut m));
        let [
            ToCoordinator::Log {
                attempt: 7,
                records,
            },
        ] = &up[..]
        else {
            panic!("{up:?}");
        };
        assert_eq!(records, &vec![(2, 2, vec![(Some(3), halo(2, "down"))])]);
        m.received(
            t0,
            Some(ToWorker::SendLog {
                attempt: 7,
                from: 3,
                through: 5,
                to: vec![3],
            }),
        );
        assert!(
            matches!(&sent(polled(&mut m))[..], [ToCoordinator::Log { records, .. }] if records.is_empty())
        );
        // Copies kept for a peer: 5 of phase 1, 6 of phase 1 then 2.
        let copy = |seq, phase, chunk| ToPeer::Copy {
            seq,
            generation: 4,
            phase,
            chunk,
            bytes: Bytes::from(vec![chunk as u8; 4]),
        };
        for (seq, phase, chunk) in [(0, 1, 5), (1, 1, 6), (2, 1, 7)] {
            m.peer_received(9, copy(seq, phase, chunk));
        }
        let _ = polled(&mut m);
        m.received(
            t0,
            Some(ToWorker::SendCopies {
                attempt: 7,
                phase: 1,
                chunks: vec![6, 4],
            }),
        );
        let up = sent(polled(&mut m));
        assert!(
            matches!(&up[..], [ToCoordinator::CopiesOf { attempt: 7, copies }] if copies.len() == 1 && copies[0].0 == 6),
            "{up:?}"
        );
        assert!(m.copy_of(6).is_none() && m.copy_of(5).is_some());
        // A replay of 5 (its copy here) and 6 (sent): to the background.
        let recover = |attempt, chunks: Vec<(u64, u64, u64, bool)>| ToWorker::Recover {
            attempt,
            copy_phase: 1,
            phase: 2,
            total: 8,
            chunks,
            jobs: vec![
                (1, Bytes::from_static(b"j1")),
                (2, Bytes::from_static(b"j2")),
            ],
            halos: Vec::new(),
            copies: vec![(6, Bytes::from_static(b"six"))],
        };
        m.received(
            t0,
            Some(recover(7, vec![(5, 50, 60, false), (6, 60, 70, true)])),
        );
        let outs = polled(&mut m);
        let [Out::Replay(r)] = &outs[..] else {
            panic!("{outs:?}");
        };
        let parts: Vec<(u64, bool, &[u8])> = r.parts.iter().map(|p| (p.0, p.2, &p.3[..])).collect();
        assert_eq!(
            parts,
            vec![(5, false, &[5u8; 4][..]), (6, true, &b"six"[..])]
        );
        assert!(m.copy_of(5).is_none(), "used up");
        assert!(m.is_replaying(7));
        assert_eq!(replayed_5(&mut m, 7), 1, "from the copies named");
        // No copy of 7 of phase 2 here: refused at once.
        m.received(
            t0,
            Some(ToWorker::Recover {
                attempt: 8,
                copy_phase: 2,
                phase: 3,
                total: 8,
                chunks: vec![(7, 70, 80, false)],
                jobs: Vec::new(),
                halos: Vec::new(),
                copies: Vec::new(),
            }),
        );
        assert!(matches!(
            &sent(polled(&mut m))[..],
            [ToCoordinator::ReplayFailed { attempt: 8, .. }]
        ));
        // A replay under way when the job rolls back: its outcome is dropped.
        m.received(t0, Some(recover(9, vec![(7, 70, 80, false)])));
        let _ = polled(&mut m);
        m.received(t0, Some(ToWorker::Forget));
        let _ = polled(&mut m);
        assert!(!m.is_replaying(9));
        m.replayed(9, Err("late".into()));
        assert!(polled(&mut m).is_empty());
        refused(
            recover(10, vec![(8, 80, 90, false)]),
            "a recovery of chunk 8 of 8",
        );
    }

    /// A buddy copy of `len` bytes pushed by a peer.
    fn copy_push(seq: u64, generation: u64, phase: u64, chunk: u64, len: usize) -> ToPeer {
        ToPeer::Copy {
            seq,
            generation,
            phase,
            chunk,
            bytes: vec![7u8; len].into(),
        }
    }

    /// Whether the machine kept the copy peer 9 pushed last (its one answer).
    fn copy_kept(m: &mut Machine) -> bool {
        let (_, answers, _) = peer_outs(polled(m));
        match &answers[..] {
            [(9, FromPeer::Ack { kept, .. })] => *kept,
            a => panic!("{a:?}"),
        }
    }

    /// The memory of every copy the buddy drops (replaced by a newer round's, dropped when
    /// told, forgotten by a rollback) goes back to the process's kept buffers, where the
    /// next round's copies are read into it.
    #[test]
    fn a_buddy_gives_back_the_memory_of_the_copies_it_drops() {
        let (mut m, t0) = machine(true, 1);
        with_job(&mut m, t0);
        m.received(t0, Some(roster(4)));
        let _ = polled(&mut m);
        let big = 1 << 17;
        let kept = |m: &Machine| m.config.buffers.reuse().kept;
        for (seq, phase) in [(0, 5), (1, 6)] {
            m.peer_received(9, copy_push(seq, 4, phase, 1, big));
            assert!(copy_kept(&mut m));
        }
        assert_eq!(kept(&m), 0, "the copy of phase 5 is kept until told");
        m.peer_received(9, copy_push(2, 4, 7, 1, big));
        assert!(copy_kept(&mut m));
        assert_eq!(kept(&m), big, "phase 5's, replaced");
        m.received(
            t0,
            Some(ToWorker::DropCopies {
                chunks: vec![1],
                before: 7,
            }),
        );
        assert_eq!(kept(&m), 2 * big, "phase 6's, dropped when told");
        m.received(t0, Some(ToWorker::Forget));
        let _ = polled(&mut m);
        assert_eq!(
            (kept(&m), m.copies()),
            (3 * big, (0, 0)),
            "phase 7's, forgotten"
        );
    }

    /// A buddy keeps a copy of this generation, of a chunk the job has and that is not held
    /// here, newer than the one it has, within its memory for copies; `DropCopies` and
    /// `Forget` drop them.
    #[test]
    fn a_buddy_keeps_copies_within_its_memory_and_drops_them_when_told() {
        let (mut m, t0) = machine(true, 1);
        with_job(&mut m, t0);
        let (push, answer) = (copy_push, copy_kept);
        m.peer_received(9, push(0, 4, 2, 1, 10));
        assert!(!answer(&mut m), "no roster yet");
        m.received(t0, Some(roster(4)));
        let _ = polled(&mut m);
        m.peer_received(9, push(1, 3, 2, 1, 10));
        assert!(!answer(&mut m), "another generation");
        m.peer_received(9, push(2, 4, 2, 1, 10));
        assert!(answer(&mut m));
        m.peer_received(9, push(3, 4, 2, 6, 100));
        assert!(answer(&mut m));
        assert_eq!(m.copies(), (2, 110));
        // A newer copy replaces the older, which is kept until the coordinator says the
        // newer one is recorded (its owner may be lost before); an older one is refused.
        m.peer_received(9, push(4, 4, 4, 1, 20));
        assert!(answer(&mut m));
        m.peer_received(9, push(5, 4, 3, 1, 30));
        assert!(!answer(&mut m), "older than the one kept");
        assert_eq!(m.copies(), (3, 130));
        assert_eq!(m.copy_at(1, 2).map(Bytes::len), Some(10));
        assert_eq!(m.copy_at(1, 4).map(Bytes::len), Some(20));
        // Past the memory for copies (1 MiB here): refused.
        m.peer_received(9, push(6, 4, 4, 2, 1 << 20));
        assert!(!answer(&mut m), "too large");
        // A partition held here has no copy here.
        m.received(t0, Some(run(0, 4, true)));
        m.reported(done(0, 4, false));
        let _ = polled(&mut m);
        m.peer_received(9, push(7, 4, 2, 4, 10));
        assert!(!answer(&mut m), "held here");
        // Dropped if older than the phase named: a newer copy stays.
        m.received(
            t0,
            Some(ToWorker::DropCopies {
                chunks: vec![1, 6],
                before: 3,
            }),
        );
        assert_eq!(m.copies(), (1, 20));
        m.received(
            t0,
            Some(ToWorker::DropCopies {
                chunks: vec![1],
                before: 5,
            }),
        );
        assert_eq!(m.copies(), (0, 0));
        m.peer_received(9, push(8, 4, 2, 6, 100));
        assert!(answer(&mut m));
        m.received(t0, Some(ToWorker::Forget));
        let _ = polled(&mut m);
        assert_eq!(m.copies(), (0, 0));
        let c = m.peer_counts();
        assert_eq!((c.copies_received, c.copies_accepted), (9, 4));
        // A copy of a chunk past the job's last ends that peer's link.
        m.peer_received(9, push(9, 4, 2, 8, 10));
        assert!(matches!(&polled(&mut m)[..], [Out::HangUp { to: 9 }]));
    }

    /// A pushed halo is kept only for a partition whose only copy is here, of this phase
    /// or the next, under this generation, once; the next `Begin` takes it, and a partition
    /// that leaves takes it along in `Released`, by phase.
    #[test]
    fn a_pushed_halo_is_kept_only_for_a_partition_held_here() {
        let (mut m, t0) = machine(true, 1);
        with_job(&mut m, t0);
        let push = |seq, generation, phase, to| ToPeer::Halo {
            seq,
            generation,
            phase,
            from: 4,
            to,
            bytes: halo(4, "up"),
        };
        let answer = |m: &mut Machine| -> bool {
            let (_, answers, _) = peer_outs(polled(m));
            match &answers[..] {
                [(9, FromPeer::Ack { kept, .. })] => *kept,
                a => panic!("{a:?}"),
            }
        };
        // No roster yet: refused.
        m.peer_received(9, push(0, 4, 2, 3));
        assert!(!answer(&mut m));
        m.received(t0, Some(roster(4)));
        // Chunk 3 runs here from a state the coordinator has: refused.
        m.received(
            t0,
            Some(ToWorker::Run {
                slot: 0,
                chunk: 3,
                start: 30,
                end: 40,
                state: Some(Bytes::from_static(b"s")),
                held: false,
                then: Vec::new(),
            }),
        );
        let _ = polled(&mut m);
        m.peer_received(9, push(1, 4, 2, 3));
        assert!(!answer(&mut m));
        // Once it ended here, its only copy is here: kept, once.
        m.reported(done(0, 3, true));
        let _ = polled(&mut m);
        m.peer_received(9, push(2, 3, 2, 3));
        assert!(!answer(&mut m), "another generation");
        m.peer_received(9, push(3, 4, 4, 3));
        assert!(!answer(&mut m), "a phase two on");
        m.peer_received(9, push(4, 4, 2, 3));
        assert!(answer(&mut m));
        m.peer_received(9, push(5, 4, 2, 3));
        assert!(!answer(&mut m), "twice");
        // The next phase's, pushed before this process took the phase's `Begin`: kept apart.
        m.peer_received(9, push(6, 4, 3, 3));
        assert!(answer(&mut m));
        to_phase(&mut m, t0, 3);
        m.received(
            t0,
            Some(ToWorker::Begin {
                chunk: 3,
                halos: vec![(2, Halo::Sent(halo(2, "down"))), (4, Halo::Kept)],
            }),
        );
        let outs = polled(&mut m);
        let [Out::Code(Code::Begin { chunk: 3, halos })] = &outs[..] else {
            panic!("{outs:?}");
        };
        assert_eq!(
            halos,
            &vec![(2, Some(halo(2, "down"))), (4, Some(halo(4, "up")))]
        );
        m.answer(Ok(None));
        // The partition leaves with the next phase's, which go up named by their phase.
        m.received(t0, Some(ToWorker::Surrender { chunk: 3 }));
        let _ = polled(&mut m);
        let surrendered = ToCoordinator::Surrendered {
            chunk: 3,
            state: Bytes::from_static(b"3"),
        };
        m.answer(Ok(Some(surrendered.clone())));
        let released = ToCoordinator::Released {
            chunk: 3,
            phase: 3,
            halos: vec![(4, Halo::Sent(halo(4, "up")))],
        };
        assert_eq!(sent(polled(&mut m)), vec![released, surrendered]);
        // Gone: refused.
        m.peer_received(9, push(7, 4, 3, 3));
        assert!(!answer(&mut m));
        assert_eq!(m.peer_counts().accepted, 2);
        // A halo for a chunk past the job's last (8 of them) ends that peer's link.
        m.peer_received(9, push(8, 4, 3, 8));
        assert!(matches!(&polled(&mut m)[..], [Out::HangUp { to: 9 }]));
        assert_eq!(m.peer_counts().refused_links, 1);
    }

    #[test]
    fn slots_leave_and_end() {
        let (mut m, t0) = machine(false, 2);
        // A run before the job value ends the process.
        m.received(t0, Some(run(0, 0, false)));
        assert!(matches!(
            &polled(&mut m)[..],
            [Out::End {
                result: Err(Error::Rejected { .. }),
                ..
            }]
        ));
        let (mut m, t0) = machine(false, 2);
        with_job(&mut m, t0);
        for slot in 4..8 {
            m.received(t0, Some(ToWorker::Release { slot }));
        }
        assert!(matches!(&polled(&mut m)[..], [Out::Close(1)]));
        m.leave();
        m.leave();
        assert_eq!(
            sent(polled(&mut m)),
            vec![ToCoordinator::Leave {
                grace_ms: Some(1500)
            }]
        );
        m.received(t0, Some(ToWorker::End));
        assert!(matches!(
            &polled(&mut m)[..],
            [Out::End {
                tell: None,
                result: Ok(true)
            }]
        ));
        let (mut m, _) = machine(false, 2);
        with_job(&mut m, Instant::now());
        m.received(
            Instant::now(),
            Some(ToWorker::Interrupt { slot: 9, chunk: 0 }),
        );
        assert!(matches!(
            &polled(&mut m)[..],
            [Out::End {
                result: Err(Error::Rejected { .. }),
                ..
            }]
        ));
        // The job value does not decode here.
        let (mut m, t0) = machine(false, 1);
        m.received(
            t0,
            Some(ToWorker::Phase {
                phase: 0,
                chunks: 1,
                job: Bytes::new(),
            }),
        );
        m.received(t0, Some(run(0, 0, false)));
        assert!(matches!(
            &polled(&mut m)[..],
            [Out::Code(Code::Phase { .. })]
        ));
        let source = postcard::Error::DeserializeUnexpectedEnd;
        m.answer(Err(Error::Undecodable {
            peer: "coordinator".to_owned(),
            job: "job".to_owned(),
            version: 1,
            what: "the job value",
            here: true,
            source: source.clone(),
        }));
        let outs = polled(&mut m);
        let [
            Out::End {
                tell: Some(ToCoordinator::Undecodable { what, error }),
                result: Err(Error::Undecodable { .. }),
            },
        ] = &outs[..]
        else {
            panic!("{outs:?}");
        };
        assert_eq!((what.as_str(), error), ("the job value", &source));
    }
}
