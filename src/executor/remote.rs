//! The job's side of remote workers: each connected worker process has
//! [`SLOTS_PER_THREAD`](crate::cluster::frame::SLOTS_PER_THREAD) *slots* per thread, each a
//! worker of the core driven by messages instead of a mailbox and a flag. Several slots per
//! thread keep chunks waiting next to the running one, so a thread does not wait for the
//! round trip between its `Done` and its next `Run`; the core's ledger is untouched (a slot
//! holds at most one chunk, like any worker). A slot reports as busy the time its chunk spent
//! on the thread, waiting included, so that the core sees its share of the thread.
//!
//! # Membership (coordinator side)
//!
//! 1. *Join.* An accepted connection (see `wire/listener.rs`) is attached to the job under
//!    its lock: each of its slots gets a worker id and joins the core (`Joined`), also in the
//!    middle of a phase; the core may hand them chunks at once.
//! 2. *Run.* A `Run` command for a slot becomes a `Run` message, preceded by the phase's job
//!    value (`Phase`) the first time the connection gets a chunk of that phase. A state held
//!    as bytes is sent as it is. With owned partitions the `Run` carries a *grant*
//!    (`Run::then`, `Core::grant`): the partitions queued after it on the slot that the
//!    process holds (or, in a first phase, the chunks not started yet), which the slot runs
//!    one after the other without a `Run` each; the ledger counts them as running on the
//!    slot until each is reported, and an interrupt gives back the unstarted ones
//!    (`Returned`). Everything the coordinator decides for one process at once goes in one
//!    message (`ToWorker::Batch`): a phase's start, for a process holding its partitions, is
//!    one message whatever their number, and the process answers with one batch of `Done`s
//!    when its granted runs have ended. (Before grants, a slot held one chunk and waited a
//!    round trip for the next: 49 messages per process per phase on the stencil of
//!    `benches/partitions.rs`, now 2.)
//! 3. *Report.* `Done` and `Yielded` messages become the core's events of the same names;
//!    `Captured` feeds a snapshot's cut (protocol step 2 of `schedule/cut.rs`); heartbeats carry
//!    progress. An event the core refuses (a chunk the slot does not hold) or bytes that do
//!    not decode drop the connection: a peer that breaks the protocol is lost, not trusted.
//! 4. *Retire / Leave.* Retiring a connection (the handle's `retire_remote` or
//!    `scale_remote`, or the worker's `Leave`) retires each of its slots in the core, which
//!    interrupts running chunks; they come back as `Yielded`; each slot is then released, and
//!    when the last one is, the connection gets `End`.
//! 5. *Loss.* A closed connection, a protocol error or a lease without a frame: each remaining
//!    slot leaves the core with `Lost`, which puts its chunk back with the last state the
//!    coordinator holds: the state it was sent with (reported to the core as the chunk's
//!    fallback when the `Run` goes out), or from scratch. A cut waiting for such a chunk takes
//!    that state too, read before the core may hand the chunk to another worker.
//! 6. *End.* When the job ends every connection gets `End`.
//!
//! # Snapshots
//!
//! The epoch marker reaches a running remote slot as `Capture`, naming the epoch folder of
//! the snapshot; its state comes back as `Captured` (or as the chunk's `Done` / `Yielded`,
//! whichever comes first, exactly as for a local worker) and the coordinator's background
//! writer stores it with the other parts. A worker process that has shown it reaches the
//! job's store (it read the latest committed snapshot there, see `ToWorker::Store` and step 7
//! of `worker/mod.rs`) writes the part itself and sends `CapturedPart`, its reference:
//! a large state then never crosses the coordinator's link. The coordinator checks that the
//! key is a part key of this job and lists it like a part of an earlier epoch; the commit
//! stays one writer's `PutMode::Create`, so a part written for a cut that is abandoned, or
//! overtaken by the chunk's output, is never referenced and retention deletes it. A suspend
//! halts the core: remote chunks are interrupted, come back as `Yielded` (the coordinator
//! needs those states anyway, to hand the chunks out again if the write fails), the cut is
//! written, and every connection gets `End`.
//!
//! # Owned partitions
//!
//! A partition that ran in a worker process stays there (`Done` carries only its halos, and
//! the ledger records it as `Held::Elsewhere`). At the barrier the process gets the next
//! phase's job value and, per partition, `Begin` with its neighbours' halos; the core then
//! queues the partition on a slot of that process again and `Run { held }` names it. When
//! the core gives it to another worker, or its process is retired, the coordinator asks for
//! it (`Surrender`) and sends it on (or keeps it, `Fetch`); a snapshot asks for the parts of
//! held partitions (`CaptureHeld`, naming the epoch folder). A process that writes to the
//! job's store writes such a part itself and sends its reference (`CapturedHeldPart`),
//! checked like a `CapturedPart` and also against the folder asked; otherwise it sends the
//! bytes (`CapturedHeld`). Either feeds the cut as a captured chunk's part does; parts
//! received both ways are counted
//! ([`REMOTE_PARTS`](crate::metrics::REMOTE_PARTS)). Answers are matched to requests per
//! chunk and process, oldest first (`Snapshots::held_outstanding`): an answer to an
//! abandoned cut's request, or from before a rollback, is dropped; one nobody asked for
//! drops the connection. A process lost with partitions only it had rolls the job
//! back to its latest committed snapshot (`rollback.rs`: the other processes `Forget` theirs),
//! or ends it with `Error::PartitionsLost` if none was committed.
//!
//! A halo between two partitions of one process stays in that process (protocol 12,
//! [`frame::Halo`]): `Done` says `Kept`, the coordinator records `HeldHalo::Kept(conn)` and
//! names it back in the partition's `Begin`; a process hands a kept halo up (`Released`)
//! before the partition it is for leaves it, so a kept halo is always where its partition
//! is (one needed elsewhere is a typed error naming the process). The first phase deals
//! each process one contiguous block (`schedule/owned.rs`), so only the halos of the
//! boundaries between processes cross: on 32 bands over two processes, 4 of 64 a phase
//! (the two between them and the outer two, which the process cannot tell apart), where
//! all 64 crossed; two processes went from 0.69-0.79x to 0.79-0.89x two local threads
//! (`benches/partitions.rs`).
//!
//! Those that cross go through the coordinator, not worker to worker: every process
//! already has one authenticated connection to it, halos are small (two rows per
//! boundary), and the coordinator needs them anyway when the neighbour is a local worker
//! or the partition moves at the barrier. A direct mesh would add a connection and a
//! handshake per pair of processes to save one hop for two rows per boundary and phase;
//! with the relay, what is left of the gap to local threads is not the halos (4 of them a
//! phase) but the round trips of each chunk's `Run` and `Done` on two shared cores.
//!
//! Why the value stays exact: the core sees a remote slot exactly as a local worker, with the
//! same events in the same per-worker order (one connection, one task, messages in order), so
//! its invariants (every chunk done once, merged in chunk order) hold whatever joins, leaves or
//! is lost.

use crate::schedule::idhash::{IdMap, IdSet};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::copies::Buddies;
use super::job_run::{HeldHalo, State};
use super::links::Order;
use super::members::RemoteSlot;
use super::snapshot::{Captured, Part};
use crate::codec;
use crate::error::{Error, Site};
use crate::exchange::{Inbox, Outbox};
use crate::job::Job;
use crate::run::Held;
use crate::schedule::{ChunkId, Event, ProcessId, Work, WorkerId};
use crate::wire::Error as PeerError;
use crate::wire::frame::{self, Failure, SLOTS_PER_THREAD, ToCoordinator, ToWorker};

/// About the most bytes (of states, halos and job values) one [`ToWorker::Batch`] carries:
/// more go in the next one.
const BATCH_BYTES: usize = 1 << 20;

/// What a snapshot part from a worker process is of, for [`REMOTE_PARTS`](crate::metrics::REMOTE_PARTS).
#[derive(Clone, Copy)]
enum RemotePart {
    /// A running chunk's state (`Captured`, `CapturedPart`).
    Running,
    /// A partition the process holds (`CapturedHeld`, `CapturedHeldPart`).
    Held,
}

/// Whether `part`, reported by a worker process as the part of `chunk` it wrote, is one:
/// a part key of job `job_id` for that chunk and, if the request named one, in epoch
/// folder `folder`. A part outside them could name another job's object or one that
/// retention deletes, so it is refused.
fn check_part(
    part: &crate::snapshot::PartRef,
    chunk: ChunkId,
    job_id: &str,
    folder: Option<u64>,
) -> Result<(), String> {
    let rest = part
        .key
        .strip_prefix(job_id)
        .and_then(|k| k.strip_prefix('/'));
    let in_folder = |rest: &str| {
        folder.is_none_or(|f| rest.split('/').next() == Some(format!("{f:020}").as_str()))
    };
    let ours = part.chunk == chunk
        && rest.is_some_and(in_folder)
        && crate::snapshot::store::check_part_key(&part.key).is_ok();
    if ours {
        return Ok(());
    }
    Err(match folder {
        Some(f) => format!(
            "{:?} is not a part of chunk {chunk} of job {job_id} in epoch folder {f}",
            part.key
        ),
        None => format!(
            "{:?} is not a part of chunk {chunk} of job {job_id}",
            part.key
        ),
    })
}

/// A connected worker process.
pub(crate) struct Conn {
    /// Shared with every message's error path (cloned per message, so not a `String`).
    peer: Arc<str>,
    /// The node it runs on (`Remotes::nodes`).
    node: NodeId,
    /// The phase whose job value it has.
    phase_sent: Option<u64>,
    /// Worker id per slot, `None` once released.
    slots: Vec<Option<WorkerId>>,
    /// Iterations done in each thread's running chunk, from heartbeats.
    pub(crate) progress: Vec<u64>,
    retiring: bool,
    /// Whether it said the job's store is usable from it (`StoreChecked`), or its last
    /// snapshot part came as a reference (it writes to, so reads from, the job's store): a
    /// restored partition placed on it goes as its part (`PlacePart`).
    pub(crate) reads_store: bool,
    /// The peer data plane (protocol 20): where it accepts halos from its peers, if it does.
    listen: Option<Arc<str>>,
    /// What it was told of the roster (`ToWorker::Peers`).
    told: Told,
}

/// What a worker process was told of the peer data plane's roster, so that each `Peers`
/// names only what changed.
#[derive(Default)]
struct Told {
    /// The generation of the roster it has, if any.
    generation: Option<u64>,
    /// The peers whose address it has.
    addrs: IdSet<ProcessId>,
    /// The holder it was told of each chunk (a hint).
    holders: IdMap<ChunkId, Option<ProcessId>>,
    /// Chunks its partitions sent halos for through the coordinator since the last barrier:
    /// at the barrier it is told where they are.
    relayed: IdSet<ChunkId>,
    /// Peers it said it could not reach (`Unreachable`): how many times so far, and the
    /// phase before which it is not told of them again (its halos for them go through the
    /// coordinator until then; each failure doubles the wait, up to 64 phases).
    unreachable: IdMap<ProcessId, (u32, u64)>,
}

impl Conn {
    /// The name of the node it runs on.
    fn node_name<'r>(&self, remotes: &'r Remotes) -> &'r str {
        remotes.nodes.get(self.node.0 as usize).map_or("", |n| n)
    }

    /// Its slots in the ledger, those not released.
    pub(crate) fn workers(&self) -> impl Iterator<Item = WorkerId> + '_ {
        self.slots.iter().flatten().copied()
    }

    /// A chunk of `slot` ended: its thread's published progress is in the ledger now.
    fn ended_in(&mut self, slot: u32) {
        if let Some(p) = self.progress.get_mut((slot / SLOTS_PER_THREAD) as usize) {
            *p = 0;
        }
    }
}

/// A node of the roster: the host a worker process says it runs on (`WorkerOptions::node`),
/// numbered in the order the coordinator first heard of it. Processes of one node share its
/// memory and its fate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct NodeId(pub(crate) u32);

/// What crossed between the coordinator and the job's worker processes since the run
/// started ([`JobHandle::traffic`](crate::JobHandle::traffic)): every message, and the bytes
/// of the halos (pieces of owned partitions) among them. Divided by the phases, it is what a
/// phase costs the coordinator.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Traffic {
    /// Messages from worker processes.
    pub messages_in: u64,
    /// Messages to worker processes.
    pub messages_out: u64,
    /// Bytes of halos worker processes sent up (relayed halos; those a process keeps for
    /// its own partitions never come).
    pub halo_bytes_in: u64,
    /// Bytes of halos sent down to worker processes.
    pub halo_bytes_out: u64,
    /// Halos worker processes pushed to each other directly (the peer data plane), each
    /// kept by the process that holds its partition, without crossing the coordinator.
    pub halos_direct: u64,
    /// Times a worker process could not reach a peer (or lost its link to it): its halos
    /// for that peer went through the coordinator for a while (2 phases, doubling with each
    /// failure up to 64), then the peer was offered again.
    pub peers_unreachable: u64,
    /// Owned partitions that moved from one worker to another: by the balance at a phase
    /// start, from a worker that left, or taken by a local thread whose queue ran dry. A
    /// move between worker processes crosses the network, and in the phases after it a
    /// lost process may not be recoverable from buddy copies (it rolls back instead).
    pub partitions_moved: u64,
}

/// A worker process as [`JobHandle::remote_processes`](crate::JobHandle::remote_processes)
/// shows it: the roster's node → process → slots, one process.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RemoteProcess {
    /// The coordinator's number for it, as its logs name it (`process 3`).
    pub id: u64,
    /// The node it runs on, as it named itself
    /// ([`WorkerOptions::node`](crate::cluster::WorkerOptions::node)).
    pub node: String,
    /// Its address.
    pub peer: String,
    /// Its compute threads.
    pub threads: u32,
    /// Chunks running or queued on its slots now.
    pub chunks: usize,
    /// Whether it is retiring (handing its chunks back before it leaves).
    pub retiring: bool,
}

/// The connections of worker processes of one job run (their slots are members of the job,
/// `members.rs`), and the nodes they run on: the roster, node → process → slot.
#[derive(Default)]
pub(crate) struct Remotes {
    pub(crate) conns: IdMap<ProcessId, Conn>,
    /// How many of them are retiring: counted as they start to, not recounted after each
    /// event (a job may have thousands of processes).
    retiring: usize,
    /// The nodes processes said they run on, by number (`NodeId`), and the numbers by name.
    nodes: Vec<Arc<str>>,
    node_ids: std::collections::HashMap<Arc<str>, NodeId>,
    /// Frames for worker processes, in order, sent when the job's lock is released
    /// (`links.rs`).
    pub(crate) outbox: Vec<(ProcessId, ToWorker)>,
    /// The placements of the current attempt (`State::placements`) that asked a process to
    /// export a partition's halos (`Exported`), not answered yet. A rollback that starts
    /// again places the partitions anew while the processes may still answer the placements
    /// before, or never (a process forgets the placements under way at `Forget`): an answer
    /// quotes its placement's number, one to an earlier placement is dropped, and one
    /// nobody asked for is refused.
    pub(crate) exports_asked: IdSet<(ProcessId, ChunkId)>,
    /// The number of the next process to connect.
    next: u64,
    /// The job value of a phase, encoded once for all connections.
    job_bytes: Option<(u64, Bytes)>,
    /// Worker processes started by `scale_remote` that were still running when it last
    /// looked (their handles are the driver's: `Links::launched`).
    pub(crate) launched: usize,
    /// Worker processes started so far (their `index`).
    pub(crate) launched_total: usize,
    /// Owned partitions asked of the worker process that holds them (`Surrender`), by chunk:
    /// the connection asked, where the bytes go, and when they were asked for (to time the
    /// move).
    pub(crate) fetches: IdMap<ChunkId, (ProcessId, Fetch, Duration)>,
    /// Halos of partitions on their way whose phase began meanwhile and that were then
    /// handed to a worker (their fetch's destination changed): applied when they arrive.
    begins: IdMap<ChunkId, Inbox<HeldHalo>>,
    /// Owned partitions that arrived from worker processes since the autoscaler last looked:
    /// their bytes, and their transfers' times summed (`autoscale.rs` reports them to the
    /// decider, which learns what a move costs).
    pub(crate) fetched: (u64, std::time::Duration),
    /// Bytes of owned partitions sent to worker processes since the autoscaler last looked
    /// (untimed: nothing answers their arrival).
    pub(crate) sent: u64,
    /// Halos from worker processes since the last barrier: kept there for a partition there,
    /// sent here, and pushed to the process of their partition (for
    /// [`HALOS`](crate::metrics::HALOS)).
    pub(crate) halos: (u64, u64, u64),
    /// What crossed to and from the processes ([`Traffic`]).
    pub(crate) traffic: Traffic,
    /// The peer data plane's session (random, one per run) and generation (bumped by each
    /// rollback: pushes of an earlier one are refused).
    session: Option<[u8; 16]>,
    generation: u64,
    /// Halos a process released (`Released`) for this phase before the `Done` of their
    /// sender came, by `(receiver, sender)`: pushed there, kept, and sent up when the
    /// receiver left, all before the sender's report that it was kept there (two
    /// connections, no order between them). The sender's `Done` takes them.
    pub(crate) early: IdMap<(ChunkId, ChunkId), (ProcessId, Bytes)>,
    /// Partitions whose report (`Done`, `Exported`) named a halo kept at a peer process
    /// that was lost before the report came (the peer acknowledged the push, then was
    /// lost): the halo is gone, and the sender, which goes on elsewhere, cannot export it
    /// again. The job rolls back once the report is taken (`State::halos_gone_with_a_peer`),
    /// as it does for such halos of a loss it saw first (`drop_conn`).
    pub(crate) halos_gone: Vec<ChunkId>,
    /// Connected processes that listen for their peers' halos.
    listeners: usize,
    /// Emptied outboxes of the last barrier (`route`), filled again by the next phase's
    /// exports (`count_halos`) instead of a new one for each.
    pub(crate) spare: Vec<Outbox<HeldHalo>>,
    /// [`REMOTE_MESSAGES`](crate::metrics::REMOTE_MESSAGES), in and out: registered at the
    /// first message (a run without worker processes registers none).
    messages: Option<MessageCounters>,
    /// Buddy copies of the partitions processes hold (`copies.rs`).
    pub(crate) buddies: Buddies,
    /// Who exported each allgather piece (a piece for every partition), by sender chunk: the
    /// process whose `Done` or `Exported` brought it, and the phase that ended. The barrier
    /// that sends the pieces (`Gathered`) names that process's own pieces instead of sending
    /// them back to it (it kept them, [`Keeper::outgoing`](crate::worker)). Emptied when the
    /// processes forget their partitions (a rollback), whose pieces they forget too.
    gathered_by: IdMap<ChunkId, (ProcessId, u64)>,
}

/// The handles of [`REMOTE_MESSAGES`](crate::metrics::REMOTE_MESSAGES), registered once per
/// run (as `JobMetrics` are): registering one hashes its name and labels, at every message
/// of thousands of processes.
struct MessageCounters {
    into: metrics::Counter,
    out: metrics::Counter,
}

impl MessageCounters {
    fn new() -> Self {
        MessageCounters {
            into: metrics::counter!(crate::metrics::REMOTE_MESSAGES, "direction" => "in"),
            out: metrics::counter!(crate::metrics::REMOTE_MESSAGES, "direction" => "out"),
        }
    }
}

impl Remotes {
    /// No process yet; buddy copies every `every` phases (`copies.rs`).
    pub(crate) fn with_copies(every: Option<u64>) -> Remotes {
        Remotes {
            buddies: Buddies::new(every),
            ..Remotes::default()
        }
    }

    /// The messages for the processes, in order, counted as they go: what one process
    /// gets at once goes in one [`ToWorker::Batch`] (a phase's start is then one message
    /// per process, whatever its partitions), up to about [`BATCH_BYTES`] of bytes each, so
    /// that a batch of partitions' states stays far below any message limit.
    pub(crate) fn take_outbox(&mut self) -> Vec<(ProcessId, ToWorker)> {
        // Nothing to gather for one message (the common case between barriers).
        let out = if self.outbox.len() <= 1 {
            std::mem::take(&mut self.outbox)
        } else {
            self.gather()
        };
        if !out.is_empty() {
            self.traffic.messages_out += out.len() as u64;
            self.messages
                .get_or_insert_with(MessageCounters::new)
                .out
                .increment(out.len() as u64);
        }
        out
    }

    /// The outbox, one batch per process (or more, past [`BATCH_BYTES`]), in order.
    fn gather(&mut self) -> Vec<(ProcessId, ToWorker)> {
        let mut by_conn: Vec<(ProcessId, Vec<ToWorker>, usize)> = Vec::new();
        // Each process's open batch in `by_conn` (found by a map: a phase's start queues
        // messages for every process, interleaved).
        let mut open: IdMap<ProcessId, usize> = IdMap::default();
        for (id, msg) in self.outbox.drain(..) {
            let weight = frame::weight(&msg);
            match open.get(&id).map(|&i| &mut by_conn[i]) {
                Some((_, batch, bytes)) if *bytes + weight <= BATCH_BYTES => {
                    *bytes += weight;
                    batch.push(msg);
                }
                _ => {
                    open.insert(id, by_conn.len());
                    by_conn.push((id, vec![msg], weight));
                }
            }
        }
        by_conn
            .into_iter()
            .map(|(id, mut batch, _)| {
                let msg = if batch.len() == 1 {
                    batch.pop().expect("one message")
                } else {
                    ToWorker::Batch(batch)
                };
                (id, msg)
            })
            .collect()
    }

    /// Connection `id` is gone: forgotten, and no longer counted.
    fn remove(&mut self, id: ProcessId) -> Option<Conn> {
        let c = self.conns.remove(&id)?;
        self.buddies.lost(id);
        if c.retiring {
            self.retiring -= 1;
        }
        if c.listen.is_some() {
            self.listeners -= 1;
        }
        debug_assert_eq!(
            self.retiring,
            self.conns.values().filter(|c| c.retiring).count()
        );
        Some(c)
    }

    /// The number of node `name`, numbered now if it is new.
    fn node_id(&mut self, name: &str) -> NodeId {
        if let Some(&id) = self.node_ids.get(name) {
            return id;
        }
        let id = NodeId(self.nodes.len() as u32);
        let name: Arc<str> = name.into();
        self.nodes.push(Arc::clone(&name));
        self.node_ids.insert(name, id);
        id
    }

    /// Worker processes retiring, and those started that have not connected yet (as
    /// [`scale_remote`] counts them), for the metrics (`watch.rs`).
    pub(crate) fn membership(&self) -> (usize, usize) {
        let retiring = self.retiring;
        (retiring, self.launched.saturating_sub(self.conns.len()))
    }

    /// Owned partitions at the barrier before `phase`: each worker process that holds some
    /// gets the phase's job value, then the pieces of an allgather that ended (`gathered`,
    /// by sender: once per process, without the pieces it exported itself, which it kept),
    /// then the halos of each of its partitions (`Begin`).
    pub(crate) fn begin_remote(
        &mut self,
        (phase, chunks): (u64, u64),
        job: Bytes,
        begins: Vec<(ProcessId, ChunkId, Inbox<frame::Halo>)>,
        gathered: Vec<(u64, Bytes)>,
    ) {
        self.job_bytes = Some((phase, job.clone()));
        self.outbox.reserve(begins.len() + self.conns.len());
        self.tell_peers(phase, &begins);
        // A round of every process every `k` phases; in between, a round of the processes
        // that need one at once (`Buddies::wants_round`: a partition without a copy, or
        // with one in its own process, copies of two phases, or a partition moved out), so
        // that the first barrier of a run, of a rollback's run, or after a recovery (which
        // used copies up) protects them, and a partition that moved has its processes
        // copied, not every process.
        if phase > 0 && self.buddies.enabled() {
            let full = self.buddies.due(phase - 1);
            if full {
                self.buddies.full_round();
            }
            let mut owned: Vec<(ProcessId, ChunkId)> =
                begins.iter().map(|(id, chunk, _)| (*id, *chunk)).collect();
            owned.sort_unstable();
            if !full {
                let mut wanted = Vec::new();
                for group in owned.chunk_by(|a, b| a.0 == b.0) {
                    if self
                        .buddies
                        .wants_round(group[0].0, group.iter().map(|&(_, c)| c))
                    {
                        wanted.extend_from_slice(group);
                    }
                }
                owned = wanted;
            }
            if !owned.is_empty() {
                self.ask_copies(phase - 1, owned);
            }
            // What partitions run here exported for these goes in the coordinator's own
            // halo log, as sent (a replay of them needs it).
            for (_, chunk, halos) in &begins {
                for (from, h) in halos {
                    if let frame::Halo::Sent(b) = h {
                        if self.buddies.logged_here(*from) {
                            self.buddies.log_here(phase - 1, *from, Some(*chunk), b);
                        }
                    }
                }
            }
            // And an allgather's pieces, which go to every process once, not in a `Begin`.
            // (Left out, the piece of a partition run here was in no log, and a replay of a
            // lost partition that took it was refused for a sender missing.)
            for (from, b) in &gathered {
                if self.buddies.logged_here(*from) {
                    self.buddies.log_here(phase - 1, *from, None, b);
                }
            }
        }
        let mut gathered_to = IdSet::default();
        // The phase whose pieces `gathered` are.
        let ended = phase.checked_sub(1);
        for (id, chunk, halos) in begins {
            if let Some(c) = self.conns.get_mut(&id) {
                if c.phase_sent != Some(phase) {
                    c.phase_sent = Some(phase);
                    let job = job.clone();
                    self.outbox
                        .push((id, ToWorker::Phase { phase, chunks, job }));
                }
                if !gathered.is_empty() && gathered_to.insert(id) {
                    // A piece this process exported in the phase that ended is its own
                    // already: named, not sent back.
                    let pieces: Vec<(u64, Option<Bytes>)> = gathered
                        .iter()
                        .map(|(from, b)| {
                            let own =
                                ended.is_some_and(|p| self.gathered_by.get(from) == Some(&(id, p)));
                            (*from, (!own).then(|| b.clone()))
                        })
                        .collect();
                    self.traffic.halo_bytes_out += pieces
                        .iter()
                        .filter_map(|(_, b)| b.as_ref())
                        .map(|b| b.len() as u64)
                        .sum::<u64>();
                    self.outbox.push((id, ToWorker::Gathered { pieces }));
                }
                tracing::debug!(conn = %id, chunk, phase, "begin");
                self.traffic.halo_bytes_out += halos
                    .iter()
                    .map(|(_, h)| match h {
                        frame::Halo::Sent(b) => b.len() as u64,
                        frame::Halo::Kept | frame::Halo::KeptAt(_) | frame::Halo::Gathered => 0,
                    })
                    .sum::<u64>();
                self.outbox.push((id, ToWorker::Begin { chunk, halos }));
            }
        }
    }

    /// The halos partition `chunk` in worker process `id` exported, counted. A halo kept at
    /// a peer (`KeptAt`) that the peer released already is these bytes; one kept at the
    /// process itself must say `Kept`.
    fn count_halos(
        &mut self,
        (id, phase): (ProcessId, u64),
        chunk: ChunkId,
        halos: Vec<(Option<u64>, frame::Halo)>,
    ) -> Result<Outbox<HeldHalo>, String> {
        let mut out = self.spare.pop().unwrap_or_default();
        out.reserve(halos.len());
        for (to, h) in halos {
            let early = to.and_then(|to| self.early.remove(&(to, chunk)));
            let held = match h {
                frame::Halo::Kept => {
                    self.halos.0 += 1;
                    HeldHalo::Kept(id)
                }
                frame::Halo::Sent(b) => {
                    self.halos.1 += 1;
                    self.traffic.halo_bytes_in += b.len() as u64;
                    match to {
                        Some(to) => {
                            if let Some(c) = self.conns.get_mut(&id) {
                                c.told.relayed.insert(to);
                            }
                        }
                        None => {
                            self.gathered_by.insert(chunk, (id, phase));
                        }
                    }
                    HeldHalo::Bytes(b)
                }
                frame::Halo::Gathered => {
                    return Err(format!(
                        "a halo of chunk {chunk} named as gathered, which only a `Begin` may"
                    ));
                }
                frame::Halo::KeptAt(p) => {
                    let p = ProcessId(p);
                    if p == id || to.is_none() {
                        return Err(format!(
                            "a halo of chunk {chunk} kept at {p}, which is not another process \
                             holding its receiver"
                        ));
                    }
                    self.halos.2 += 1;
                    self.traffic.halos_direct += 1;
                    match early {
                        Some((from, b)) if from == p => HeldHalo::Bytes(b),
                        _ => HeldHalo::Kept(p),
                    }
                }
            };
            out.push((to, held));
        }
        Ok(out)
    }

    /// Buddy copies at the barrier after `ended`: each process holding partitions of
    /// `owned` (`(holder, chunk)`, sorted) is asked to copy those to its buddy, ahead of the
    /// next phase's messages.
    fn ask_copies(&mut self, ended: u64, owned: Vec<(ProcessId, ChunkId)>) {
        let mut roster: Vec<(ProcessId, NodeId)> = self
            .conns
            .iter()
            .filter(|(_, c)| c.listen.is_some() && !c.retiring)
            .map(|(id, c)| (*id, c.node))
            .collect();
        roster.sort_unstable();
        let generation = self.generation;
        // Every process trims its halo log to what a replay from the oldest copy needs.
        let from = self.buddies.log_from(ended);
        let mut ids: Vec<ProcessId> = self.conns.keys().copied().collect();
        ids.sort_unstable();
        self.outbox
            .extend(ids.into_iter().map(|id| (id, ToWorker::Logs { from })));
        let mut deferred = 0;
        for group in owned.chunk_by(|a, b| a.0 == b.0) {
            let owner = group[0].0;
            let Some(node) = self.conns.get(&owner).map(|c| c.node) else {
                continue;
            };
            let chunks: Vec<u64> = group.iter().map(|&(_, c)| c).collect();
            if self.buddies.defers_round(owner) {
                tracing::debug!(conn = %owner, phase = ended, "buddy copies deferred: two rounds are not answered yet");
                deferred += 1;
                continue;
            }
            self.buddies.asked();
            for &c in &chunks {
                self.buddies.asking(owner, c, ended);
            }
            let buddy = Buddies::buddy_of(owner, node, &roster);
            let addr = buddy.and_then(|b| self.conns.get(&b)?.listen.clone());
            let (Some(buddy), Some(addr)) = (buddy, addr) else {
                tracing::debug!(conn = %owner, "no buddy for the partitions of a worker process");
                self.buddies.no_buddy(chunks.len());
                continue;
            };
            tracing::debug!(conn = %owner, %buddy, phase = ended, partitions = chunks.len(), "buddy copies");
            self.buddies.round_asked(owner, ended);
            self.outbox.push((
                owner,
                ToWorker::Copy {
                    phase: ended,
                    generation,
                    buddy: buddy.0,
                    addr: addr.to_string(),
                    chunks,
                },
            ));
        }
        if deferred > 0 {
            // Once per barrier, not per process: the sign that copies take longer than the
            // phases between rounds (`Copies::deferred` counts them too).
            tracing::info!(
                phase = ended,
                processes = deferred,
                "buddy copy rounds deferred: two earlier rounds of each of these processes are not answered yet"
            );
        }
    }

    /// The partitions of `chunks` are in the coordinator's own hands after phase `ended`
    /// (its threads run them): they are lost only with it, so their copies are not needed
    /// any more, nor those of a round up to `ended` whose answers come later.
    pub(crate) fn drop_copies_of(&mut self, chunks: &[ChunkId], ended: u64) {
        for (p, chunks) in self.buddies.in_hand(chunks, ended) {
            if self.conns.contains_key(&p) {
                let msg = ToWorker::DropCopies {
                    chunks,
                    before: u64::MAX,
                };
                self.outbox.push((p, msg));
            }
        }
    }

    /// The peer data plane's session: random, drawn once per run.
    fn session(&mut self) -> [u8; 16] {
        *self.session.get_or_insert_with(|| {
            let mut s = [0; 16];
            if let Err(e) = getrandom::fill(&mut s) {
                tracing::warn!(error = %e, "no random session for the peer data plane: a fixed one is used");
            }
            s
        })
    }

    /// A process of a job with owned partitions joined: it learns its number and the run's
    /// session (`Peers`, with nobody in it yet), which it needs to listen for its peers and
    /// to dial them.
    fn welcome_peer(&mut self, id: ProcessId) {
        let (session, generation) = (self.session(), self.generation);
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        conn.told.generation = Some(generation);
        self.outbox.push((
            id,
            ToWorker::Peers {
                me: id.0,
                session,
                generation,
                addrs: Vec::new(),
                holders: Vec::new(),
            },
        ));
    }

    /// Process `gone` is lost: every other process told it held a partition is told that
    /// it holds it no more, so that it relays that partition's halos through the
    /// coordinator until told where it is again. A lost process may be alive (cut off from
    /// the coordinator, or frozen past its lease) and take pushes still: a halo kept there
    /// is out of the job's reach, and a barrier that needs it fails. Queued ahead of what
    /// the loss sends next (a recovery's `SendLog`): a `Done` whose push went there before
    /// the process knew reaches the coordinator before its log, while the recovery can
    /// still fill it in.
    fn forget_holder(&mut self, gone: ProcessId) {
        let session = self.session();
        let mut msgs = Vec::new();
        for (&id, conn) in &mut self.conns {
            let told = &mut conn.told;
            told.addrs.remove(&gone);
            let Some(generation) = told.generation else {
                continue;
            };
            let mut hints: Vec<(u64, Option<u64>)> = told
                .holders
                .iter()
                .filter(|(_, h)| **h == Some(gone))
                .map(|(&c, _)| (c, None))
                .collect();
            if hints.is_empty() {
                continue;
            }
            hints.sort_unstable();
            for &(c, _) in &hints {
                told.holders.insert(c, None);
            }
            msgs.push((
                id,
                ToWorker::Peers {
                    me: id.0,
                    session,
                    generation,
                    addrs: Vec::new(),
                    holders: hints,
                },
            ));
        }
        msgs.sort_unstable_by_key(|(id, _)| *id);
        self.outbox.extend(msgs);
    }

    /// The roster of the peer data plane for each worker process that sent halos through
    /// this coordinator in the phase that ended (`Told::relayed`): where their receivers
    /// are now (from the phase's `Begin`s, `begins`), with the addresses it lacks. Only
    /// what changed goes; a process gets a whole roster again after a rollback (a new
    /// generation). Queued ahead of the phase's other messages, so the phase's `Done`s
    /// can use it. Nothing is done, nor any map built, while no process listens; in a
    /// steady state only the few chunks whose halos were relayed are looked up.
    fn tell_peers(&mut self, phase: u64, begins: &[(ProcessId, ChunkId, Inbox<frame::Halo>)]) {
        if self.listeners == 0 {
            // No process takes halos from its peers: everything is relayed.
            self.conns.values_mut().for_each(|c| c.told.relayed.clear());
            return;
        }
        let generation = self.generation;
        let wanted: IdSet<ChunkId> = self
            .conns
            .values()
            .flat_map(|c| c.told.relayed.iter().copied())
            .collect();
        let fresh_any = self
            .conns
            .values()
            .any(|c| c.told.generation != Some(generation));
        if wanted.is_empty() && !fresh_any {
            return;
        }
        let holders: IdMap<ChunkId, ProcessId> = begins
            .iter()
            .filter(|(_, chunk, _)| wanted.contains(chunk))
            .map(|(id, chunk, _)| (*chunk, *id))
            .collect();
        let session = self.session();
        let listening: IdMap<ProcessId, Arc<str>> = holders
            .values()
            .filter_map(|h| Some((*h, self.conns.get(h)?.listen.clone()?)))
            .collect();
        let mut msgs = Vec::new();
        for (&id, conn) in &mut self.conns {
            let told = &mut conn.told;
            let fresh = told.generation != Some(generation);
            if fresh {
                told.holders.clear();
            }
            if told.relayed.is_empty() && !fresh {
                continue;
            }
            let (mut addrs, mut hints) = (Vec::new(), Vec::new());
            let mut relayed: Vec<ChunkId> = told.relayed.drain().collect();
            relayed.sort_unstable();
            for to in relayed {
                let holder = holders.get(&to).copied().filter(|h| {
                    *h != id
                        && listening.contains_key(h)
                        && told
                            .unreachable
                            .get(h)
                            .is_none_or(|&(_, until)| phase >= until)
                });
                if told.holders.get(&to) == Some(&holder) {
                    continue;
                }
                told.holders.insert(to, holder);
                if let Some(h) = holder {
                    if told.addrs.insert(h) {
                        addrs.push((h.0, listening[&h].to_string()));
                    }
                }
                hints.push((to, holder.map(|h| h.0)));
            }
            if !fresh && hints.is_empty() {
                continue;
            }
            told.generation = Some(generation);
            msgs.push((
                id,
                ToWorker::Peers {
                    me: id.0,
                    session,
                    generation,
                    addrs,
                    holders: hints,
                },
            ));
        }
        msgs.sort_unstable_by_key(|(id, _)| *id);
        self.outbox.extend(msgs);
    }

    /// Whether no partition is on its way from a worker process.
    pub(crate) fn fetches_empty(&self) -> bool {
        self.fetches.is_empty()
    }

    /// The connections, by id.
    pub(crate) fn conn_ids(&self) -> Vec<ProcessId> {
        self.conns.keys().copied().collect()
    }

    /// No connection has a phase's job value any more (the job rolled back): each gets it
    /// again before its next chunk.
    pub(crate) fn clear_phases(&mut self) {
        self.job_bytes = None;
        self.begins.clear();
        // Pushes of the attempt rolled back from are refused from now on; every process
        // gets the new generation's roster with its next phase.
        self.generation += 1;
        self.early.clear();
        self.gathered_by.clear();
        for c in self.conns.values_mut() {
            c.phase_sent = None;
            c.progress.iter_mut().for_each(|p| *p = 0);
        }
    }

    /// Whether a fetch under way asked worker process `from`.
    pub(crate) fn fetching_from_any(&self, from: ProcessId) -> bool {
        self.fetches.values().any(|(p, ..)| *p == from)
    }

    /// The worker process a fetch of `chunk` under way asked, if any.
    pub(crate) fn fetching_from(&self, chunk: ChunkId) -> Option<ProcessId> {
        self.fetches.get(&chunk).map(|(from, ..)| *from)
    }

    /// Drops every fetch under way (a rollback resets the ledger they were to go into): the
    /// answers, when they come, find none and are dropped. Their destinations, to answer.
    pub(crate) fn drop_fetches(&mut self) -> Vec<(ChunkId, Fetch)> {
        self.begins.clear();
        self.fetches.drain().map(|(c, (_, f, _))| (c, f)).collect()
    }

    /// Whether a local runner waits for `chunk`, on its way here.
    pub(crate) fn fetching_for_local(&self, chunk: ChunkId) -> bool {
        matches!(self.fetches.get(&chunk), Some((_, Fetch::Local, _)))
    }

    /// Whether `chunk` is on its way here with its phase begun meanwhile: its halos wait
    /// for it (`Fetch::Begin`, or `begins` once it was handed on).
    pub(crate) fn begin_pending(&self, chunk: ChunkId) -> bool {
        matches!(self.fetches.get(&chunk), Some((_, Fetch::Begin(..), _)))
            || self.begins.contains_key(&chunk)
    }

    /// The fetch of `chunk` under way, if any.
    pub(crate) fn fetching(&mut self, chunk: ChunkId) -> Option<&mut Fetch> {
        self.fetches.get_mut(&chunk).map(|(_, f, _)| f)
    }

    /// Sends connection `id` the job value of `phase` (`job`) and its number of chunks,
    /// unless it has it.
    pub(crate) fn send_phase(&mut self, id: ProcessId, (phase, chunks): (u64, u64), job: Bytes) {
        if let Some(c) = self.conns.get_mut(&id) {
            if c.phase_sent != Some(phase) {
                c.phase_sent = Some(phase);
                self.outbox
                    .push((id, ToWorker::Phase { phase, chunks, job }));
            }
        }
    }

    /// Whether connection `id` is retiring (its slots leave at their next adjustment point).
    pub(crate) fn is_retiring(&self, id: ProcessId) -> bool {
        self.conns.get(&id).is_some_and(|c| c.retiring)
    }

    pub(crate) fn conn_reads_store(&self, id: ProcessId) -> bool {
        self.conns.get(&id).is_some_and(|c| c.reads_store)
    }

    /// Sends `msg` to connection `id`; `None` if it is gone.
    pub(crate) fn send_to(&mut self, id: ProcessId, msg: ToWorker) -> Option<()> {
        self.conns
            .contains_key(&id)
            .then(|| self.outbox.push((id, msg)))
    }
}

/// Requests to worker processes not answered yet, by `K` (a process and what it was asked
/// about), each with what the answer is matched to (`T`: the cut's marker, the placement, the
/// epoch folder), oldest first: a process answers about one thing in the order it was asked.
pub(crate) struct Asked<K, T>(IdMap<K, std::collections::VecDeque<T>>);

impl<K, T> Default for Asked<K, T> {
    fn default() -> Self {
        Asked(IdMap::default())
    }
}

impl<K: std::hash::Hash + Eq, T> Asked<K, T> {
    /// `key` was asked, for `tag`.
    pub(crate) fn ask(&mut self, key: K, tag: T) {
        self.0.entry(key).or_default().push_back(tag);
    }

    /// `key` was answered: the tag of its oldest request, `None` if none was asked.
    pub(crate) fn answered(&mut self, key: K) -> Option<T> {
        let asked = self.0.get_mut(&key)?;
        let tag = asked.pop_front();
        if asked.is_empty() {
            self.0.remove(&key);
        }
        tag
    }

    /// Whether `key` was asked and not answered yet.
    pub(crate) fn waits(&self, key: &K) -> bool {
        self.0.contains_key(key)
    }

    /// Keeps the requests whose key `keep` accepts (those of a process gone are dropped).
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        self.0.retain(|k, _| keep(k));
    }
}

/// Where the bytes of a surrendered partition go.
pub(crate) enum Fetch {
    /// To a local worker's runner, which waits for them (`Held::Asked`: its driver holds the
    /// channel, `links.rs`).
    Local,
    /// To a slot of another worker process, in a `Run` sent when they arrive; an
    /// `Interrupt` or `Capture` asked meanwhile follows it.
    Forward {
        worker: WorkerId,
        slot: RemoteSlot,
        range: std::ops::Range<u64>,
        interrupt: bool,
        capture: bool,
    },
    /// Back into the ledger: the holder leaves.
    Ledger,
    /// Back into the ledger, where it begins the phase that started while it was on its way
    /// with these halos (see `Partition::begin_phase`).
    Begin(Inbox<HeldHalo>),
}

impl<J: Job> State<J> {
    /// The phase's job value as sent to worker processes, encoded once per phase.
    pub(crate) fn job_bytes(&mut self) -> crate::Result<Bytes> {
        let phase = self.phase;
        if let Some((p, b)) = &self.remote.job_bytes {
            if *p == phase {
                // Kept already, unless a rollback to this phase dropped it.
                let b = b.clone();
                self.remote.buddies.first_job_value(phase, b.clone());
                return Ok(b);
            }
        }
        let job = self
            .job
            .as_deref()
            .ok_or_else(|| Error::Internal("no job value to send".into()))?;
        let b = Bytes::from(codec::encode_for_workers("the job", job)?);
        self.remote.job_bytes = Some((phase, b.clone()));
        // The barriers keep the values of the phases after them for replays; a run's first
        // phase (the job's first, or a restored one) has none before it.
        self.remote.buddies.first_job_value(phase, b.clone());
        Ok(b)
    }

    /// Protocol step 1: each slot of the connection joins the core.
    pub(crate) fn join_remote(&mut self, peer: String, threads: u32, node: &str) -> ProcessId {
        let id = ProcessId(self.remote.next);
        self.remote.next += 1;
        let node = self.remote.node_id(node);
        let threads = threads.clamp(1, 4096);
        let mut slots = Vec::with_capacity((threads * SLOTS_PER_THREAD) as usize);
        for slot in 0..threads * SLOTS_PER_THREAD {
            slots.push(Some(self.members.join_slot(id, slot)));
        }
        self.remote.conns.insert(
            id,
            Conn {
                peer: peer.into(),
                node,
                phase_sent: None,
                slots: slots.clone(),
                progress: vec![0; threads as usize],
                retiring: false,
                reads_store: false,
                listen: None,
                told: Told::default(),
            },
        );
        self.offer_store(Some(id));
        if self.core.is_partitioned() {
            self.remote.welcome_peer(id);
            if self.remote.buddies.enabled() {
                let from = self.phase;
                self.remote.outbox.push((id, ToWorker::Logs { from }));
            }
        }
        // The slots join together: the ledger reassigns and dispatches once, at the last.
        let slots: Vec<WorkerId> = slots.into_iter().flatten().collect();
        if let Some((&last, rest)) = slots.split_last() {
            for &w in rest {
                self.core.set_process(w, id);
                if let Err(rejected) = self.core.join_quietly(w) {
                    // Fresh ids: as `feed` does with a refused event of its own.
                    self.fail(Error::Internal(rejected.to_string()));
                    return id;
                }
            }
            let _ = self.feed(Event::Joined { worker: last }, None);
        }
        self.settle();
        self.remote_gauge();
        id
    }

    /// Tells connection `to` (or every connection) where the job's snapshots are, once one is
    /// committed there (see `ToWorker::Store`). Secrets are not sent: the URL is the store's
    /// shown form (credentials removed) and only options on a list of non-secret keys go.
    pub(crate) fn offer_store(&mut self, to: Option<ProcessId>) {
        let Some((epoch, created_unix_ms)) = self.snap.witness else {
            return;
        };
        let cfg = &self.config.snapshots;
        let Ok(store) = cfg.store() else {
            return;
        };
        let msg = ToWorker::Store {
            url: store.url().to_owned(),
            options: crate::snapshot::shareable_options(&cfg.options),
            job_id: cfg.job_id::<J>(),
            epoch,
            created_unix_ms,
        };
        for id in self.remote.conns.keys() {
            if to.is_none_or(|t| t == *id) {
                self.remote.outbox.push((*id, msg.clone()));
            }
        }
    }

    fn remote_gauge(&self) {
        metrics::gauge!(crate::metrics::REMOTE_WORKERS, "job" => J::NAME)
            .set(self.remote.conns.len() as f64);
    }

    /// Protocol step 2: a `Run` command for a remote slot.
    pub(crate) fn run_remote(
        &mut self,
        shared_fail: &mut Option<Error>,
        worker: WorkerId,
        RemoteSlot {
            conn: conn_id,
            slot,
        }: RemoteSlot,
        chunk: ChunkId,
        range: std::ops::Range<u64>,
        state: Option<Held<J::Chunk>>,
    ) {
        let phase = self.phase;
        let job_bytes = self.job_bytes();
        // An owned partition: run where it is held, or fetch it from there first. One that
        // its process was already asked to hand back (it is retired, and the core gives the
        // partition to another of its slots before that slot retires too) is not there any
        // more: it comes back first, as from any other process.
        let mut held = false;
        if let Some(from) = state.as_ref().and_then(Held::elsewhere) {
            if from == conn_id && self.remote.fetching_from(chunk).is_none() {
                held = true;
            } else {
                let forward = Fetch::Forward {
                    worker,
                    slot: RemoteSlot {
                        conn: conn_id,
                        slot,
                    },
                    range,
                    interrupt: false,
                    capture: false,
                };
                self.snap.on_run(chunk);
                // The ledger handed its record of the partition to this run: it must still
                // know where the partition is if this slot is lost before the bytes arrive.
                // Otherwise the chunk would go pending with no state, run from scratch
                // elsewhere, and the copy on its way would later be restated over the new
                // one: two copies of one partition.
                let report = Event::StateReport {
                    worker,
                    chunk,
                    state: Held::Elsewhere(from),
                };
                let _ = self.core.handle(report, &mut Vec::new());
                return self.fetch(chunk, from, forward);
            }
        }
        let state = match state.filter(|_| !held).map(|s| s.to_bytes()) {
            None => Ok(None),
            Some(Some(b)) => b.map(Some).map_err(Error::from),
            Some(None) => Err(Error::Internal("a partition on its way was sent on".into())),
        };
        let (job_bytes, state) = match (job_bytes, state) {
            (Ok(j), Ok(s)) => (j, s),
            (Err(e), _) | (_, Err(e)) => {
                *shared_fail = Some(e);
                return;
            }
        };
        self.snap.on_run(chunk);
        if let (true, Some(b)) = (self.core.is_partitioned(), &state) {
            // A partition moving into this process.
            self.remote.sent += b.len() as u64;
        }
        let chunks = self.core.plan().len();
        self.remote.send_phase(conn_id, (phase, chunks), job_bytes);
        // The partitions this process holds that the slot runs after this one go with it.
        // (Not the chunks of a first phase, which the protocol allows: while no partition
        // exists, every join deals the pending chunks again in contiguous blocks, and a
        // grant given back chunk by chunk was dealt in pieces. Measured on the stencil of
        // `benches/partitions.rs`: 8 to 10 halos a phase crossed between the two processes
        // for the rest of the run instead of 2, and 0.87x local threads instead of 1.03x.)
        let then = if held {
            self.grant(worker, conn_id)
        } else {
            Vec::new()
        };
        tracing::debug!(conn = %conn_id, slot, chunk, held, phase, then = then.len(), "run");
        let run = ToWorker::Run {
            slot,
            chunk,
            start: range.start,
            end: range.end,
            state: state.clone(),
            held,
            then,
        };
        let _ = self.remote.send_to(conn_id, run);
        // The state the chunk was sent with is the one it falls back to if this worker is
        // lost (the ledger keeps no copy of what it hands out). The core accepts it: the
        // slot runs `chunk` since the `Run` command.
        if let Some(bytes) = state {
            let report = Event::StateReport {
                worker,
                chunk,
                state: Held::Bytes(bytes),
            };
            let _ = self.core.handle(report, &mut Vec::new());
        }
    }

    /// A grant for `worker`, a slot of process `conn` that runs a partition held there: the
    /// partitions queued after it on the slot that the process holds too, up to the first
    /// that is elsewhere or on its way (`Core::grant`). The slot runs them without a `Run`
    /// each, so a phase costs no round trip per partition.
    fn grant(&mut self, worker: WorkerId, conn: ProcessId) -> Vec<(u64, u64, u64)> {
        let fetches = &self.remote.fetches;
        let granted = self.core.grant(worker, |c, state| {
            state.is_some_and(|s| s.elsewhere() == Some(conn)) && !fetches.contains_key(&c)
        });
        granted
            .into_iter()
            .map(|(c, range)| {
                self.snap.on_run(c);
                (c, range.start, range.end)
            })
            .collect()
    }

    /// A worker joined in the middle of a phase: every slot of a worker process that was
    /// granted chunks it has not started is asked to give them back (`Recall`), so that the
    /// ledger can deal the newcomer a share of them (grants would otherwise keep a phase's
    /// partitions where the phase's start put them).
    pub(crate) fn recall_grants(&mut self) {
        if !self.core.is_partitioned() {
            return;
        }
        let mut recalls = Vec::new();
        for (&id, conn) in &self.remote.conns {
            for (slot, w) in conn.slots.iter().enumerate() {
                if w.is_some_and(|w| self.core.granted(w).next().is_some()) {
                    recalls.push((id, ToWorker::Recall { slot: slot as u32 }));
                }
            }
        }
        self.remote.outbox.extend(recalls);
    }

    /// An `Interrupt` for remote slot `r` (worker `worker`); nothing if it runs nothing.
    pub(crate) fn interrupt_remote(&mut self, worker: WorkerId, r: RemoteSlot) {
        if let Some(chunk) = self.core.running_on(worker) {
            if let Some((_, Fetch::Forward { interrupt, .. }, _)) =
                self.remote.fetches.get_mut(&chunk)
            {
                // Its `Run` has not gone yet: the interrupt follows it.
                *interrupt = true;
                return;
            }
        }
        if let (Some(chunk), true) = (
            self.core.running_on(worker),
            self.remote.conns.contains_key(&r.conn),
        ) {
            // A rollback throws the chunk away: it is dropped there, not handed back.
            let msg = if self.rolling_back() {
                ToWorker::Abandon {
                    slot: r.slot,
                    chunk,
                }
            } else {
                ToWorker::Interrupt {
                    slot: r.slot,
                    chunk,
                }
            };
            self.remote.outbox.push((r.conn, msg));
        }
    }

    /// A snapshot's `Capture` of `chunk` for remote slot `r`.
    pub(crate) fn capture_remote(&mut self, r: RemoteSlot, chunk: ChunkId) {
        if let Some((_, Fetch::Forward { capture, .. }, _)) = self.remote.fetches.get_mut(&chunk) {
            *capture = true;
            return;
        }
        let capture = ToWorker::Capture {
            slot: r.slot,
            chunk,
            folder: self.snap.next_folder(),
        };
        if self.remote.send_to(r.conn, capture).is_some() {
            let marker = self.snap.markers;
            self.snap
                .captures_outstanding
                .ask((r.conn, r.slot, chunk), marker);
        }
    }

    /// A `Release` for remote slot `r` (no longer a member). The connection gets `End` with
    /// its last slot, once the commands released with it are carried out
    /// ([`State::end_if_drained`]): a partition the slot gave back may be on its way to
    /// another worker by then, asked of this process.
    pub(crate) fn release_remote(&mut self, r: RemoteSlot) {
        if let Some(c) = self.remote.conns.get_mut(&r.conn) {
            if let Some(s) = c.slots.get_mut(r.slot as usize) {
                *s = None;
            }
            self.remote
                .outbox
                .push((r.conn, ToWorker::Release { slot: r.slot }));
        }
    }

    /// Ends connection `id` once it has no slot and holds no partition.
    pub(crate) fn end_if_drained(&mut self, id: ProcessId) {
        let Some(c) = self.remote.conns.get(&id) else {
            return;
        };
        if c.slots.iter().any(Option::is_some) || self.holds_partitions(id) {
            return;
        }
        // A local recovery waits for its answer (its halo log, or copies it keeps): ended
        // now, the answer would be dropped with it and the recovery wait for ever. It ends
        // once it has answered (`State::recovery_answered`).
        if self.recovery.as_ref().is_some_and(|r| r.waits_for(id)) {
            return;
        }
        self.remote.outbox.push((id, ToWorker::End));
        self.remote.remove(id);
        self.snap.held_outstanding.retain(|(_, from)| *from != id);
        self.remote_gauge();
    }

    /// Ends the retiring connections that hold nothing any more (after a rollback, the
    /// partitions they held are no longer the job's).
    pub(crate) fn end_drained_remotes(&mut self) {
        let retiring: Vec<ProcessId> = self
            .remote
            .conns
            .iter()
            .filter(|(_, c)| c.retiring)
            .map(|(&id, _)| id)
            .collect();
        for id in retiring {
            self.end_if_drained(id);
        }
    }

    /// Chunks whose partition only worker process `id` has (in the ledger, or asked for).
    fn held_by(&self, id: ProcessId) -> Vec<ChunkId> {
        let mut v: Vec<ChunkId> = self
            .core
            .suspended()
            .chain(self.core.kept())
            .filter(|(_, h)| h.elsewhere() == Some(id))
            .map(|(c, _)| c)
            .collect();
        v.extend(
            self.remote
                .fetches
                .iter()
                .filter(|(_, (from, ..))| *from == id)
                .map(|(&c, _)| c),
        );
        v
    }

    /// Whether worker process `id` was given, or asked about, the partition of `chunk` (so
    /// that its `Missing` or `FailedHeld` about it may end the job).
    fn asked_of(&self, id: ProcessId, chunk: ChunkId) -> bool {
        let runs_it = self
            .remote
            .conns
            .get(&id)
            .is_some_and(|c| c.slots.iter().flatten().any(|&w| self.core.runs(w, chunk)));
        runs_it
            || self.snap.held_outstanding.waits(&(chunk, id))
            || self.held_by(id).contains(&chunk)
    }

    fn holds_partitions(&self, id: ProcessId) -> bool {
        self.core.is_partitioned() && !self.held_by(id).is_empty()
    }

    /// Asks worker process `from` for the partition of `chunk` (`Surrender`), to go where
    /// `to` says. A fetch already under way keeps its request and takes the new destination.
    ///
    /// A partition whose phase began while it was on its way (`Fetch::Begin`) and that is
    /// then handed to a worker keeps its halos: it begins its phase when it arrives, before
    /// it goes on (`begins`).
    pub(crate) fn fetch(&mut self, chunk: ChunkId, from: ProcessId, to: Fetch) {
        match self.remote.fetches.get_mut(&chunk) {
            Some((_, prev, _)) => {
                if let Fetch::Begin(inbox) = std::mem::replace(prev, to) {
                    self.remote.begins.insert(chunk, inbox);
                }
            }
            None => {
                self.remote.fetches.insert(chunk, (from, to, self.now));
                tracing::debug!(conn = %from, chunk, "surrender");
                let _ = self.remote.send_to(from, ToWorker::Surrender { chunk });
            }
        }
    }

    /// A local worker's `Run` of a partition held by worker process `from`: the runner waits
    /// for its bytes.
    pub(crate) fn fetch_local(&mut self, chunk: ChunkId, from: ProcessId) -> Held<J::Chunk> {
        self.fetch(chunk, from, Fetch::Local);
        Held::Asked(chunk)
    }

    /// A surrendered partition arrived: it goes where its fetch said.
    pub(crate) fn surrendered(&mut self, id: ProcessId, chunk: ChunkId, state: Bytes) {
        let Some((_, to, asked)) = self.remote.fetches.remove(&chunk) else {
            return;
        };
        self.remote.fetched.0 += state.len() as u64;
        self.remote.fetched.1 += self.now.saturating_sub(asked);
        let raw = state.clone();
        let mut state = state;
        if let Some(inbox) = self.remote.begins.remove(&chunk) {
            // Its phase began while it was on its way: it takes its halos before it goes on.
            let begun = self
                .begin_here(chunk, state, inbox)
                .and_then(|part| Ok(Bytes::from(codec::encode("a chunk state", &part)?)));
            match begun {
                Ok(b) => state = b,
                Err(e) => return self.fail(e),
            }
        }
        if let Fetch::Begin(inbox) = to {
            // Back into the ledger, where its phase began while it was on its way.
            match self.begin_here(chunk, state, inbox) {
                Ok(part) => {
                    let encode = || Ok(Bytes::from(codec::encode("a chunk state", &part)?));
                    self.held_arrived(chunk, &raw, encode);
                    self.restate(chunk, Held::Live(Box::new(part)));
                }
                Err(e) => self.fail(e),
            }
            self.end_if_drained(id);
            return;
        }
        let begun = state.clone();
        self.held_arrived(chunk, &raw, || Ok(begun));
        match to {
            Fetch::Local => self.orders.push(Order::Fetched(chunk, Ok(state))),
            forward @ Fetch::Forward { .. } => {
                if !self.forward(chunk, forward, Held::Bytes(state.clone())) {
                    // The slot it was for is gone; the core has the chunk pending again.
                    self.restate(chunk, Held::Bytes(state));
                }
            }
            Fetch::Ledger => self.restate(chunk, Held::Bytes(state)),
            // Begun and restated above.
            Fetch::Begin(..) => {}
        }
        self.end_if_drained(id);
    }

    /// A partition on its way (`state`) reached the slot a `Fetch::Forward` says: it runs
    /// there, with the interrupt or capture asked meanwhile. False if that slot no longer
    /// runs it.
    pub(crate) fn forward(&mut self, chunk: ChunkId, to: Fetch, state: Held<J::Chunk>) -> bool {
        let Fetch::Forward {
            worker,
            slot,
            range,
            interrupt,
            capture,
        } = to
        else {
            return false;
        };
        if self.core.running_on(worker) != Some(chunk) || self.members.get(worker).is_none() {
            return false;
        }
        let mut failed = None;
        self.run_remote(&mut failed, worker, slot, chunk, range, Some(state));
        if interrupt {
            self.interrupt_remote(worker, slot);
        }
        if capture {
            self.capture_remote(slot, chunk);
        }
        if let Some(e) = failed {
            self.fail(e);
        }
        true
    }

    /// Halos worker process `id` kept for the partition of `chunk`, which leaves it
    /// (`Released`), exported at the end of `phase`: wherever they are still recorded as kept
    /// there, they are these bytes now. Those of the phase that ended last are in the
    /// halos of a phase that began while the partition was on its way; those of this phase
    /// are among its exports, or, pushed there by a sender whose `Done` has not come yet,
    /// wait for it (`early`). One nobody waits for (the job rolled back meanwhile) is
    /// dropped.
    fn released(
        &mut self,
        id: ProcessId,
        chunk: ChunkId,
        phase: u64,
        halos: Vec<(ChunkId, Bytes)>,
    ) {
        let mut left = 0;
        for (from, b) in halos {
            let mut b = Some(b);
            let mut fill = |h: &mut HeldHalo| {
                if matches!(h, HeldHalo::Kept(c) if *c == id) {
                    if let Some(b) = b.take() {
                        *h = HeldHalo::Bytes(b);
                    }
                }
            };
            if phase == self.phase {
                // Halos the sender exported towards it at the barrier, not handed over yet.
                match self.exports.get_mut(from as usize) {
                    Some(Some(out)) => out
                        .iter_mut()
                        .filter(|(to, _)| *to == Some(chunk))
                        .for_each(|(_, h)| fill(h)),
                    _ => {
                        if let Some(b) = b.take() {
                            self.remote.early.insert((chunk, from), (id, b));
                        }
                    }
                }
            } else if phase.checked_add(1) == Some(self.phase) {
                let inboxes = [
                    match self.remote.fetches.get_mut(&chunk) {
                        Some((_, Fetch::Begin(inbox), _)) => Some(inbox),
                        _ => None,
                    },
                    self.remote.begins.get_mut(&chunk),
                ];
                for inbox in inboxes.into_iter().flatten() {
                    inbox
                        .iter_mut()
                        .filter(|(f, _)| *f == from)
                        .for_each(|(_, h)| fill(h));
                }
            }
            left += usize::from(b.is_some());
        }
        if left > 0 {
            tracing::debug!(
                conn = %id,
                chunk,
                phase,
                left,
                "released halos nobody waits for are dropped"
            );
        }
    }

    /// A partition that came back after its phase began: decoded, and given its halos here.
    fn begin_here(
        &self,
        chunk: ChunkId,
        state: Bytes,
        inbox: Inbox<HeldHalo>,
    ) -> crate::Result<J::Chunk> {
        let (Some(hooks), Some(job)) = (J::OWNERSHIP.hooks, self.job.as_deref()) else {
            return Err(Error::Internal("halos for a job without partitions".into()));
        };
        let mut part: J::Chunk = codec::decode("a chunk state", &state)?;
        let inbox = HeldHalo::live(inbox, &hooks, chunk)?;
        let site = Site::Chunk {
            phase: self.phase,
            chunk,
        };
        crate::run::catch(site, J::NAME, || {
            (hooks.begin)(&mut part, job, chunk, &mut { inbox }, None)
        })?;
        Ok(part)
    }

    /// The halos a worker process says partition `chunk` exported at the end of this phase,
    /// checked against the phase's pattern and the job's neighbours: as many as it owes,
    /// each to a chunk it may send to, in chunk order, each once. `Err` says what is wrong;
    /// `Ok(None)`: the job's `pattern` panicked and the job ended.
    fn check_addresses(
        &mut self,
        chunk: ChunkId,
        halos: &[(Option<u64>, frame::Halo)],
    ) -> Result<Option<()>, String> {
        let (Some(hooks), Some(job)) = (J::OWNERSHIP.hooks, self.job.as_deref()) else {
            return Err(format!(
                "halos for chunk {chunk} of a job without partitions"
            ));
        };
        let phase = self.phase;
        let pattern =
            match crate::run::catch(Site::Job { phase }, J::NAME, || (hooks.pattern)(job, phase)) {
                Ok(p) => p,
                Err(e) => {
                    self.fail(e);
                    return Ok(None);
                }
            };
        let mut last: Option<u64> = None;
        for (to, _) in halos {
            if !self.shape.may_send(pattern, chunk, *to) {
                return Err(match to {
                    Some(to) if *to >= self.shape.len() => format!(
                        "chunk {chunk} addressed a halo to chunk {to}, past the last ({pattern:?})"
                    ),
                    Some(to) => format!(
                        "chunk {chunk} addressed a halo to chunk {to}, which is not its neighbour ({pattern:?})"
                    ),
                    None => format!(
                        "chunk {chunk} addressed a halo to every chunk outside an allgather ({pattern:?})"
                    ),
                });
            }
            if let Some(to) = to {
                if last.is_some_and(|l| l >= *to) {
                    return Err(format!(
                        "chunk {chunk} addressed its halos out of chunk order or twice (to {to})"
                    ));
                }
                last = Some(*to);
            }
        }
        let owed = self.shape.sends(pattern, chunk);
        if halos.len() != owed {
            return Err(format!(
                "chunk {chunk} exported {} halos where it owes {owed} ({pattern:?})",
                halos.len()
            ));
        }
        Ok(Some(()))
    }

    /// Replaces the ledger's `Elsewhere` state of `chunk` (pending or kept) with `state`.
    fn restate(&mut self, chunk: ChunkId, state: Held<J::Chunk>) {
        let mut state = Some(state);
        for (c, h) in self.core.suspended_mut() {
            if c == chunk && h.elsewhere().is_some() {
                *h = state.take().expect("one chunk, one state");
                return;
            }
        }
        for (c, h) in self.core.kept_mut() {
            if c == chunk && h.elsewhere().is_some() {
                *h = state.take().expect("one chunk, one state");
                return;
            }
        }
    }

    /// Protocol step 6: every connection ends (the core has already let go of the job).
    pub(crate) fn end_remotes(&mut self) {
        for (id, _) in self.remote.conns.drain() {
            self.remote.outbox.push((id, ToWorker::End));
        }
        self.remote.retiring = 0;
        // A local runner waiting for a partition on its way is let go (it reports to an ended
        // job); nothing holds its answer any more.
        self.remote.fetches.clear();
        self.remote.begins.clear();
        self.members.drop_slots();
        self.remote_gauge();
    }

    /// Protocol step 4: retires every slot of connection `id`.
    pub(crate) fn retire_conn(&mut self, id: ProcessId) {
        let Some(c) = self.remote.conns.get_mut(&id) else {
            return;
        };
        if c.retiring {
            return;
        }
        c.retiring = true;
        self.remote.retiring += 1;
        // A slot the ledger no longer has (stranded by a loss, see `drop_conn`) is retired
        // when it joins the restored ledger (`rolled_back`).
        let slots: Vec<WorkerId> = c
            .slots
            .iter()
            .flatten()
            .copied()
            .filter(|&w| self.core.knows(w))
            .collect();
        tracing::debug!(conn = %id, ?slots, "retiring a worker process");
        // Its partitions come back into the ledger before it ends.
        if self.core.is_partitioned() {
            for chunk in self.held_by(id) {
                if !self.remote.fetches.contains_key(&chunk) {
                    self.fetch(chunk, id, Fetch::Ledger);
                }
            }
        }
        // All at once: retired one by one, its later slots were handed its earlier ones'
        // chunks.
        let mut refused = None;
        self.drive_core(|core, out| refused = core.retire_all(&slots, out).err());
        if let Some(rejected) = refused {
            self.fail(Error::Internal(rejected.to_string()));
        }
        self.settle();
    }

    /// Retires the `n` most recent connections that are not already retiring.
    pub(crate) fn retire_remote(&mut self, n: usize) {
        for id in self.newest_conns(n) {
            self.retire_conn(id);
        }
    }

    /// The `n` most recent connections that are not retiring, newest first.
    pub(crate) fn newest_conns(&self, n: usize) -> Vec<ProcessId> {
        let mut ids: Vec<ProcessId> = self
            .remote
            .conns
            .iter()
            .filter(|(_, c)| !c.retiring)
            .map(|(&id, _)| id)
            .collect();
        ids.sort_unstable();
        ids.into_iter().rev().take(n).collect()
    }

    /// Whether connection `id` is still there.
    pub(crate) fn is_connected(&self, id: ProcessId) -> bool {
        self.remote.conns.contains_key(&id)
    }

    /// Lets connection `id` go as if it were lost (a drain's grace period is over).
    pub(crate) fn let_go(&mut self, id: ProcessId) {
        self.drop_conn(id);
        self.settle();
    }

    /// Iterations done in remote threads' running chunks (from heartbeats; a thread reports
    /// zero between chunks).
    pub(crate) fn remote_progress(&self) -> u64 {
        self.remote
            .conns
            .values()
            .flat_map(|c| c.progress.iter())
            .sum()
    }

    /// Connected worker processes that are not retiring.
    pub(crate) fn remote_count(&self) -> usize {
        self.remote.conns.len() - self.remote.retiring
    }

    /// The roster: each connected worker process, its node and its slots' chunks, by number.
    pub(crate) fn roster(&self) -> Vec<RemoteProcess> {
        let mut all: Vec<RemoteProcess> = self
            .remote
            .conns
            .iter()
            .map(|(id, c)| RemoteProcess {
                id: id.0,
                node: c.node_name(&self.remote).to_owned(),
                peer: c.peer.to_string(),
                threads: c.progress.len() as u32,
                chunks: c
                    .slots
                    .iter()
                    .flatten()
                    .filter(|w| self.core.running_on(**w).is_some())
                    .count(),
                retiring: c.retiring,
            })
            .collect();
        all.sort_unstable_by_key(|p| p.id);
        all
    }

    /// Protocol step 5: connection `id` is gone; its remaining slots are lost.
    /// The chunk slot `w` of process `id` runs, if only that process has its partition: the
    /// ledger keeps no state for it, or only that the partition was in `id` (a partition
    /// that was on its way from `id` to its own slot, as a replayed one handed to the
    /// buddy that replayed it: put back with that record, it would wait for a process that
    /// is gone, and the phase with it).
    fn runs_only_there(&self, w: WorkerId, id: ProcessId) -> Option<ChunkId> {
        self.core.running_on(w).filter(|&r| {
            self.core
                .fallback(r)
                .is_none_or(|h| h.elsewhere() == Some(id))
        })
    }

    pub(crate) fn drop_conn(&mut self, id: ProcessId) {
        let Some(c) = self.remote.remove(id) else {
            return;
        };
        self.remote.forget_holder(id);
        self.snap.held_outstanding.retain(|(_, from)| *from != id);
        self.snap
            .captures_outstanding
            .retain(|(from, ..)| *from != id);
        self.remote.exports_asked.retain(|(from, _)| *from != id);
        self.snap.kept_by.retain(|_, from| *from != id);
        self.remote_gauge();
        if self.ended {
            return;
        }
        // Parts the open cut asked of it (or waits for on their way from it) will not come.
        let unanswered: Vec<ChunkId> = self
            .snap
            .held_asked
            .iter()
            .filter(|&(_, &from)| from == id)
            .map(|(&c, _)| c)
            .chain(
                self.snap
                    .held_on_arrival
                    .keys()
                    .copied()
                    .filter(|&c| self.remote.fetching_from(c) == Some(id)),
            )
            .collect();
        for chunk in unanswered {
            self.held_capture_lost(chunk);
        }
        self.watch_lost(&c.peer);
        let recovered = self.core.is_partitioned() && {
            // A recovery under way waits for every process: it gives way to a rollback.
            self.recovery_lost(id);
            // The partitions only it held: between runs, granted to its slots, or running
            // there from the state it held (a run from bytes the ledger keeps is not lost).
            let slots: Vec<WorkerId> = c.slots.iter().flatten().copied().collect();
            let mut held: Vec<ChunkId> = self
                .core
                .suspended()
                .chain(self.core.kept())
                .filter(|(_, h)| h.elsewhere() == Some(id))
                .map(|(c, _)| c)
                .collect();
            for &w in &slots {
                held.extend(self.core.granted(w));
                held.extend(self.runs_only_there(w, id));
            }
            held.sort_unstable();
            held.dedup();
            self.recover_locally(id, &held, &slots)
        };
        if self.core.is_partitioned() && !recovered {
            // Halos it kept for a neighbour it ran are gone with it. Each is an export of a
            // partition that is elsewhere now (one lost with it rolls the job back below):
            // it is exported again from that partition at the barrier (`begin_partitions`).
            // A partition held by another worker process cannot export again here: if one
            // of those lost halos (pushed there by a peer, protocol 20) is for a partition
            // that goes on, the job rolls back rather than begin a phase without it.
            let mut unexportable = Vec::new();
            for (chunk, e) in self.exports.iter_mut().enumerate() {
                let kept_here = |h: &HeldHalo| matches!(h, HeldHalo::Kept(p) if *p == id);
                if e.as_ref()
                    .is_some_and(|out| out.iter().any(|(_, h)| kept_here(h)))
                {
                    *e = None;
                    unexportable.push(chunk as ChunkId);
                }
            }
            unexportable.retain(|&c| {
                self.core
                    .kept()
                    .any(|(k, h)| k == c && h.elsewhere().is_some_and(|p| p != id))
            });
            if !unexportable.is_empty() {
                tracing::warn!(
                    job = J::NAME,
                    peer = %c.peer,
                    exporters = ?unexportable,
                    "halos kept by a lost worker process cannot be exported again where their senders are"
                );
            }
            // Partitions only it had are lost: the job cannot go on from this run's state.
            let mut lost: Vec<ChunkId> = self
                .core
                .suspended()
                .chain(self.core.kept())
                .filter(|(_, h)| h.elsewhere() == Some(id))
                .map(|(c, _)| c)
                .collect();
            // And those granted to its slots and not started (the ledger's copy of their
            // state says only that they were there), or running there from the state it
            // held, if the ledger's copy says only that it was there.
            for w in c.slots.iter().flatten() {
                lost.extend(self.core.granted(*w));
                lost.extend(
                    self.runs_only_there(*w, id)
                        .filter(|&r| self.core.fallback(r).is_some()),
                );
            }
            lost.extend(unexportable);
            let fetched: Vec<ChunkId> = self
                .remote
                .fetches
                .iter()
                .filter(|(_, (from, ..))| *from == id)
                .map(|(&c, _)| c)
                .collect();
            // Slots of other processes that were to run a partition still on its way: they
            // never got the `Run`, so they leave the ledger as lost (their chunk with them)
            // and join again after the rollback.
            let mut stranded = Vec::new();
            for chunk in fetched {
                self.remote.begins.remove(&chunk);
                match self.remote.fetches.remove(&chunk) {
                    Some((_, Fetch::Local, _)) => {
                        let gone = Error::PartitionGone {
                            job: J::NAME,
                            chunk,
                        };
                        self.orders.push(Order::Fetched(chunk, Err(gone)));
                    }
                    // A slot of this process (retired, it was given a partition the
                    // process was already handing back) is lost with the others below.
                    Some((_, Fetch::Forward { worker, slot, .. }, _)) if slot.conn != id => {
                        stranded.push(worker);
                    }
                    _ => {}
                }
                lost.push(chunk);
            }
            if !lost.is_empty() {
                lost.sort_unstable();
                lost.dedup();
                tracing::warn!(job = J::NAME, peer = %c.peer, ?lost, "a worker process was lost with the only copy of owned partitions");
                self.core.lose(&lost);
                // Halted before its slots leave, so that no chunk goes to a worker meanwhile.
                self.partitions_lost(&[]);
            }
            for worker in stranded {
                let _ = self.feed(Event::Lost { worker }, None);
            }
        }
        for w in c.slots.into_iter().flatten() {
            self.members.remove(w);
            // The chunk it runs and those it was granted.
            let running = self.core.runs_and_granted(w);
            // Taken before the core handles the loss: it may hand the chunk, with this
            // state, straight to an idle worker. A chunk never started falls back to nothing
            // (from scratch); an owned partition that only this process had (the cut cannot
            // take it from scratch: that would be a partition made anew in a later phase) is
            // lost, and the cut that waits for it fails rather than commit it wrong.
            let fallbacks: Vec<_> = running
                .iter()
                .map(|&c| {
                    self.core.fallback(c).map(|s| match s.to_bytes() {
                        Some(b) => b.map_err(Error::from),
                        None => Err(Error::PartitionGone {
                            job: J::NAME,
                            chunk: c,
                        }),
                    })
                })
                .collect();
            let _ = self.feed(Event::Lost { worker: w }, None);
            for (chunk, fallback) in running.into_iter().zip(fallbacks) {
                self.recapture(w, chunk, fallback);
            }
        }
        self.settle();
    }

    /// A cut waited for `chunk`, which was lost with its worker: it takes the state the
    /// chunk falls back to (`fallback`, the state it was last sent with), or records it from
    /// scratch.
    fn recapture(
        &mut self,
        worker: WorkerId,
        chunk: ChunkId,
        fallback: Option<crate::Result<Bytes>>,
    ) {
        if !self.snap.cut.waits_for(worker, chunk) {
            return;
        }
        let captured = match fallback {
            Some(bytes) => bytes.map(|b| Captured::State(Part::New(b))),
            // A partition whose only state was on the lost worker (the core counts it lost):
            // from scratch would be a partition made anew in a later phase, a wrong part.
            None if self.core.lost_partitions().contains(&chunk) => Err(Error::PartitionGone {
                job: J::NAME,
                chunk,
            }),
            None => Ok(Captured::Scratch),
        };
        self.captured(worker, chunk, captured);
    }

    /// The answer of connection `id` to its oldest `CaptureHeld` about `chunk` not answered
    /// yet: the epoch folder that request named, or why no answer was due.
    fn held_answer(&mut self, id: ProcessId, chunk: ChunkId) -> Result<(u64, u64), String> {
        self.snap
            .held_outstanding
            .answered((chunk, id))
            .ok_or_else(|| format!("chunk {chunk} was not asked of this process"))
    }

    /// The part of held `chunk` from connection `id`, for the open cut if it waits for it
    /// from that process (an answer to an earlier request is as good: the partition did not
    /// change since, see `worker/machine.rs`); else dropped.
    fn captured_held(&mut self, id: ProcessId, chunk: ChunkId, part: Part, marker: u64) {
        if self.snap.held_asked.get(&chunk) == Some(&id) && marker == self.snap.markers {
            self.snap.held_asked.remove(&chunk);
            if self.snap.cut.waits_for_held(chunk) {
                let mut out = std::mem::take(&mut self.snap.out);
                self.snap.cut.captured_held(chunk, Ok(part), &mut out);
                self.cut_commands(&mut out);
                self.snap.out = out;
            }
        }
        self.settle();
    }

    /// Counts a snapshot part received from worker process `id`
    /// ([`REMOTE_PARTS`](crate::metrics::REMOTE_PARTS)), and records whether it came as a
    /// reference (see `Conn::reads_store`).
    fn remote_parts(&mut self, id: ProcessId, of: RemotePart, by_reference: bool) {
        if let Some(c) = self.remote.conns.get_mut(&id) {
            c.reads_store = by_reference;
        }
        let of = match of {
            RemotePart::Running => "running",
            RemotePart::Held => "held",
        };
        let written_by = if by_reference {
            "worker"
        } else {
            "coordinator"
        };
        metrics::counter!(crate::metrics::REMOTE_PARTS, "job" => J::NAME, "part" => of, "written_by" => written_by)
            .increment(1);
    }

    /// The exports of `chunk`'s partition, which worker process `id` holds, for the phase
    /// under way (its `Done`, or the `Exported` of a partition a rollback placed there):
    /// in that process's halo log (with buddy copies), counted, and kept for the barrier.
    fn keep_exports(
        &mut self,
        id: ProcessId,
        chunk: ChunkId,
        halos: Vec<(Option<u64>, frame::Halo)>,
    ) -> Result<(), String> {
        self.remote.buddies.exported(chunk, id, self.phase);
        let halos = self.remote.count_halos((id, self.phase), chunk, halos)?;
        // A halo kept at a peer that is gone, unless a recovery of that peer's partitions
        // refills what was pushed to it (`Recovery::kept_at_lost`).
        let recovering = self.recovery.as_ref().map(|r| r.from());
        let gone = halos.iter().any(|(_, h)| {
            matches!(h, HeldHalo::Kept(p) if *p != id
                && !self.remote.conns.contains_key(p)
                && recovering != Some(*p))
        });
        if gone {
            self.remote.halos_gone.push(chunk);
        }
        self.keep_halos(chunk, halos);
        Ok(())
    }

    /// Partitions whose report named a halo kept at a peer lost before it came
    /// (`Remotes::halos_gone`): the job rolls back, as for a loss that found such halos
    /// already reported (`drop_conn`). (The barrier ended the job instead, with "sent a
    /// kept halo that is refused here": grid seed 529107 of the simulation.)
    fn halos_gone_with_a_peer(&mut self) {
        if self.remote.halos_gone.is_empty() {
            return;
        }
        let mut lost = std::mem::take(&mut self.remote.halos_gone);
        if self.rollback.is_under_way() {
            // The rollback drops this phase's exports anyway (the report came late).
            return;
        }
        lost.sort_unstable();
        lost.dedup();
        tracing::warn!(
            job = J::NAME,
            exporters = ?lost,
            "halos kept by a worker process lost before their senders' reports came cannot be exported again: the job rolls back"
        );
        self.core.lose(&lost);
        self.partitions_lost(&[]);
    }

    /// Protocol step 3: a message from connection `id`. An error drops the connection.
    pub(crate) fn on_remote(&mut self, id: ProcessId, msg: ToCoordinator) -> Result<(), PeerError> {
        self.remote.traffic.messages_in += 1;
        self.remote
            .messages
            .get_or_insert_with(MessageCounters::new)
            .into
            .increment(1);
        let ToCoordinator::Batch(batch) = msg else {
            return self.on_remote_taken(id, msg);
        };
        for msg in batch {
            if matches!(msg, ToCoordinator::Batch(_)) {
                let peer = self.remote.conns.get(&id).map(|c| c.peer.to_string());
                return Err(PeerError::Rejected {
                    peer: peer.unwrap_or_default(),
                    what: "a Batch",
                    reason: "a batch inside a batch".to_owned(),
                    source: None,
                });
            }
            self.on_remote_taken(id, msg)?;
        }
        Ok(())
    }

    /// [`State::on_remote_one`], and on an error, nothing left of the message: a report
    /// refused after its halos were looked at (its output does not decode, the ledger
    /// refuses it) leaves no halo gone with a peer for the next message to roll back for
    /// (`Remotes::halos_gone`).
    fn on_remote_taken(&mut self, id: ProcessId, msg: ToCoordinator) -> Result<(), PeerError> {
        let taken = self.on_remote_one(id, msg);
        if taken.is_err() {
            self.remote.halos_gone.clear();
        }
        taken
    }

    /// One message of connection `id`, alone or from a batch.
    fn on_remote_one(&mut self, id: ProcessId, msg: ToCoordinator) -> Result<(), PeerError> {
        if tracing::enabled!(tracing::Level::DEBUG) {
            let (what, chunk) = match &msg {
                ToCoordinator::Done { chunk, .. } => ("done", Some(*chunk)),
                ToCoordinator::Surrendered { chunk, .. } => ("surrendered", Some(*chunk)),
                ToCoordinator::Exported { chunk, .. } => ("exported", Some(*chunk)),
                ToCoordinator::Released { chunk, .. } => ("released", Some(*chunk)),
                ToCoordinator::CapturedHeld { chunk, .. } => ("captured held", Some(*chunk)),
                ToCoordinator::CapturedHeldPart { chunk, .. } => {
                    ("captured held part", Some(*chunk))
                }
                ToCoordinator::Missing { chunk } => ("missing", Some(*chunk)),
                ToCoordinator::FailedHeld { chunk, .. } => ("failed held", Some(*chunk)),
                ToCoordinator::Yielded { chunk, .. } => ("yielded", Some(*chunk)),
                ToCoordinator::Abandoned { chunk, .. } => ("abandoned", Some(*chunk)),
                ToCoordinator::Returned { chunks, .. } => ("returned", chunks.first().copied()),
                ToCoordinator::OutputDone { chunk } => ("output done", Some(*chunk)),
                ToCoordinator::Captured { chunk, .. } => ("captured", Some(*chunk)),
                ToCoordinator::CapturedPart { chunk, .. } => ("captured part", Some(*chunk)),
                ToCoordinator::Failed { chunk, .. } => ("failed", Some(*chunk)),
                ToCoordinator::Heartbeat { .. } => ("heartbeat", None),
                ToCoordinator::Leave { .. } => ("leave", None),
                ToCoordinator::Piece { .. } => ("piece", None),
                ToCoordinator::Batch(_) => ("batch", None),
                ToCoordinator::Undecodable { .. } => ("undecodable", None),
                ToCoordinator::Listening { .. } => ("listening", None),
                ToCoordinator::Unreachable { .. } => ("unreachable", None),
                ToCoordinator::Copied { .. } => ("copied", None),
                ToCoordinator::Log { .. } => ("log", None),
                ToCoordinator::LogOf { chunk, .. } => ("log of", Some(*chunk)),
                ToCoordinator::CopiesOf { .. } => ("copies of", None),
                ToCoordinator::Replayed { chunk, .. } => ("replayed", Some(*chunk)),
                ToCoordinator::ReplayFailed { .. } => ("replay failed", None),
                ToCoordinator::StoreChecked { .. } => ("store checked", None),
            };
            tracing::debug!(conn = %id, what, chunk, "from a worker process");
        }
        // A worker process may end the job about a partition only if it was given or asked
        // about it.
        let foreign = match &msg {
            ToCoordinator::Missing { chunk } | ToCoordinator::FailedHeld { chunk, .. } => {
                !self.asked_of(id, *chunk)
            }
            _ => false,
        };
        let Some(conn) = self.remote.conns.get_mut(&id) else {
            // Released or the job ended: late messages are dropped.
            return Ok(());
        };
        let peer = Arc::clone(&conn.peer);
        // A message that decoded but that the protocol does not allow here (a peer that
        // breaks it is dropped, recorded as `rejected`).
        let bad = |reason: String| PeerError::Rejected {
            peer: peer.to_string(),
            what: "a message to the coordinator",
            reason,
            source: None,
        };
        let work = |iterations, busy_ns| Work {
            iterations,
            busy: Duration::from_nanos(busy_ns),
        };
        // A slot this process had that was released since (it retired): a capture it
        // wrote in the background after it handed its chunk back answers a cut that took
        // the chunk from that hand-back. Late, not wrong: the process, which may still
        // hold partitions, is not dropped for it.
        let released =
            |conn: &Conn, slot: u32| conn.slots.get(slot as usize).is_some_and(Option::is_none);
        let slot_of = |conn: &Conn, slot: u32| {
            conn.slots
                .get(slot as usize)
                .copied()
                .flatten()
                .ok_or_else(|| bad(format!("slot {slot} is not a live slot")))
        };
        let event = match msg {
            ToCoordinator::Released {
                chunk,
                phase,
                halos,
            } => {
                if !J::OWNERSHIP.is_partitioned() {
                    return Err(bad(format!(
                        "halos for chunk {chunk} of a job without partitions"
                    )));
                }
                let mut sent = Vec::with_capacity(halos.len());
                for (from, h) in halos {
                    match h {
                        frame::Halo::Sent(b) => {
                            self.remote.traffic.halo_bytes_in += b.len() as u64;
                            sent.push((from, b));
                        }
                        frame::Halo::Kept | frame::Halo::KeptAt(_) | frame::Halo::Gathered => {
                            return Err(bad(format!(
                                "a released halo for chunk {chunk} from chunk {from} without its bytes"
                            )));
                        }
                    }
                }
                self.released(id, chunk, phase, sent);
                return Ok(());
            }
            ToCoordinator::Exported {
                chunk,
                halos,
                placement,
            } => {
                if placement < self.placements {
                    // Placed there by a rollback that started again since: the process forgot
                    // that partition (and the halos it kept with it) after this answer.
                    tracing::debug!(conn = %id, chunk, placement, "halos of an earlier placement dropped");
                    return Ok(());
                }
                // Only for a partition placed there to export them, once.
                if placement > self.placements || !self.remote.exports_asked.remove(&(id, chunk)) {
                    return Err(bad(format!(
                        "halos for chunk {chunk}, which was not placed there to export them \
                         (placement {placement})"
                    )));
                }
                let placed_here = self.remote.fetching_from(chunk) == Some(id)
                    || self
                        .core
                        .kept()
                        .any(|(c, h)| c == chunk && h.elsewhere() == Some(id));
                if !placed_here || !self.exporting.remove(&chunk) {
                    // Placed there by a rollback that started again since (or whose
                    // partitions the process forgot): late, not wrong.
                    tracing::debug!(conn = %id, chunk, "halos of an earlier placement dropped");
                    return Ok(());
                }
                if self.check_addresses(chunk, &halos).map_err(bad)?.is_none() {
                    return Ok(());
                }
                // The restored phase's exports, as a `Done`'s.
                self.keep_exports(id, chunk, halos).map_err(bad)?;
                self.halos_gone_with_a_peer();
                self.settle();
                return Ok(());
            }
            ToCoordinator::Piece { .. } => {
                return Err(PeerError::Malformed {
                    peer: peer.to_string(),
                    what: "a message to the coordinator",
                    reason: "a piece outside a pieced message".to_owned(),
                    source: None,
                });
            }
            ToCoordinator::Batch(_) => {
                return Err(bad("a batch inside a batch".to_owned()));
            }
            ToCoordinator::Undecodable { what, error } => {
                // The process could not decode what this coordinator sent, and leaves.
                return Err(PeerError::Undecodable {
                    peer: peer.to_string(),
                    job: J::NAME.to_owned(),
                    version: J::VERSION,
                    what: match what.as_str() {
                        "the job value" => "the job value",
                        "a halo" => "a halo",
                        _ => "a value",
                    },
                    here: false,
                    source: error,
                });
            }
            ToCoordinator::StoreChecked { usable } => {
                // Known before it writes a part: a process that joined after the latest
                // snapshot, or held nothing at its cut, reads its restored partitions from
                // the store too (`rollback.rs`, step 5). A part it sends later says again.
                tracing::debug!(conn = %id, usable, "a worker process checked the job's store");
                conn.reads_store = usable;
                return Ok(());
            }
            ToCoordinator::Listening { addr } => {
                if addr.parse::<std::net::SocketAddr>().is_err() {
                    return Err(bad(format!("a peer listener at {addr:?}, not an address")));
                }
                tracing::debug!(conn = %id, %addr, "a worker process accepts halos from its peers");
                if conn.listen.replace(addr.into()).is_none() {
                    self.remote.listeners += 1;
                }
                return Ok(());
            }
            ToCoordinator::Unreachable { process, reason } => {
                tracing::warn!(
                    conn = %id,
                    peer = process,
                    %reason,
                    "a worker process cannot reach a peer: their halos go through the coordinator"
                );
                metrics::counter!(crate::metrics::PEERS_UNREACHABLE, "job" => J::NAME).increment(1);
                self.remote.traffic.peers_unreachable += 1;
                // Relayed for a while, then offered again (its address too): a peer that
                // restarts, or a link that was cut for a moment, is used again.
                let peer = ProcessId(process);
                let told = &mut conn.told;
                let failures = told.unreachable.get(&peer).map_or(0, |f| f.0) + 1;
                let wait = 1u64 << failures.min(6);
                told.unreachable.insert(peer, (failures, self.phase + wait));
                told.addrs.remove(&peer);
                told.holders.retain(|_, h| *h != Some(peer));
                return Ok(());
            }
            ToCoordinator::Copied {
                phase,
                generation,
                buddy,
                copied,
                refused,
                log_bytes,
            } => {
                if !J::OWNERSHIP.is_partitioned() {
                    return Err(bad("buddy copies of a job without partitions".into()));
                }
                self.remote.buddies.logged(id, log_bytes);
                let chunks = self.core.plan().len();
                let ordered = |c: &[u64]| {
                    c.last().is_none_or(|&l| l < chunks) && c.windows(2).all(|w| w[0] < w[1])
                };
                let kept: Vec<u64> = copied.iter().map(|c| c.0).collect();
                if generation != self.remote.generation {
                    // An answer from before a rollback (which may have gone back to an
                    // earlier phase): its buddy dropped the copies.
                    return Ok(());
                }
                self.remote.buddies.round_answered(id, phase);
                if phase > self.phase || !ordered(&kept) || !ordered(&refused) {
                    return Err(bad(format!(
                        "buddy copies of phase {phase} (now {}), or of chunks out of order or \
                         past the last",
                        self.phase
                    )));
                }
                let buddy = ProcessId(buddy);
                metrics::counter!(crate::metrics::BUDDY_COPIES, "job" => J::NAME, "outcome" => "kept")
                    .increment(copied.len() as u64);
                metrics::counter!(crate::metrics::BUDDY_COPIES, "job" => J::NAME, "outcome" => "refused")
                    .increment(refused.len() as u64);
                if !self.remote.conns.contains_key(&buddy) {
                    // Gone with its copies already.
                    self.remote.buddies.no_buddy(copied.len() + refused.len());
                    return Ok(());
                }
                let drops = self
                    .remote
                    .buddies
                    .copied(phase, buddy, &copied, refused.len());
                for (p, before, chunks) in drops {
                    if self.remote.conns.contains_key(&p) {
                        let msg = ToWorker::DropCopies { chunks, before };
                        self.remote.outbox.push((p, msg));
                    }
                }
                metrics::gauge!(crate::metrics::BUDDY_COPY_BYTES, "job" => J::NAME)
                    .set(self.remote.buddies.bytes() as f64);
                return Ok(());
            }
            ToCoordinator::LogOf { chunk, records } => {
                if !J::OWNERSHIP.is_partitioned() {
                    return Err(bad("a halo log of a job without partitions".into()));
                }
                if chunk >= self.core.plan().len() {
                    return Err(bad(format!("the halo log of chunk {chunk}, past the last")));
                }
                if let Some((_, other, _)) = records.iter().find(|(_, c, _)| *c != chunk) {
                    return Err(bad(format!(
                        "a record of chunk {other} in the halo log of chunk {chunk}"
                    )));
                }
                self.took_log(id, chunk, records);
                return Ok(());
            }
            ToCoordinator::Log { attempt, records } => {
                if !J::OWNERSHIP.is_partitioned() {
                    return Err(bad("a halo log of a job without partitions".into()));
                }
                self.recovery_log(id, attempt, records);
                self.settle();
                return Ok(());
            }
            ToCoordinator::CopiesOf { attempt, copies } => {
                if !J::OWNERSHIP.is_partitioned() {
                    return Err(bad("copies of a job without partitions".into()));
                }
                self.recovery_copies(id, attempt, copies);
                self.settle();
                return Ok(());
            }
            ToCoordinator::Replayed {
                attempt,
                chunk,
                copy_phase,
                halos,
            } => {
                if !J::OWNERSHIP.is_partitioned() {
                    return Err(bad("a replay of a job without partitions".into()));
                }
                return self
                    .recovery_replayed(id, attempt, chunk, copy_phase, halos)
                    .map_err(bad);
            }
            ToCoordinator::ReplayFailed { attempt, reason } => {
                if self
                    .recovery
                    .as_ref()
                    .is_some_and(|r| r.attempt() == attempt)
                {
                    self.abandon_recovery(format!("the replay failed in {peer}: {reason}"));
                    self.settle();
                }
                return Ok(());
            }
            ToCoordinator::Heartbeat { progress } => {
                for (p, v) in conn.progress.iter_mut().zip(progress) {
                    *p = v;
                }
                return Ok(());
            }
            ToCoordinator::Leave { grace_ms } => {
                self.retire_conn(id);
                if let Some(ms) = grace_ms {
                    self.orders
                        .push(Order::Drain(vec![id], Duration::from_millis(ms)));
                }
                return Ok(());
            }
            ToCoordinator::Captured { slot, chunk, state } => {
                if released(conn, slot) {
                    self.snap.captures_outstanding.answered((id, slot, chunk));
                    tracing::debug!(conn = %id, slot, chunk, "a capture from a slot released since is dropped");
                    return Ok(());
                }
                let w = slot_of(conn, slot)?;
                self.remote_parts(id, RemotePart::Running, false);
                if self.snap.captures_outstanding.answered((id, slot, chunk))
                    == Some(self.snap.markers)
                {
                    self.captured(w, chunk, Ok(Captured::State(Part::New(state))));
                }
                self.settle();
                return Ok(());
            }
            ToCoordinator::CapturedPart { slot, chunk, part } => {
                if released(conn, slot) {
                    self.snap.captures_outstanding.answered((id, slot, chunk));
                    tracing::debug!(conn = %id, slot, chunk, "a captured part from a slot released since is dropped");
                    return Ok(());
                }
                let w = slot_of(conn, slot)?;
                let job_id = self.config.snapshots.job_id::<J>();
                check_part(&part, chunk, &job_id, None).map_err(bad)?;
                self.remote_parts(id, RemotePart::Running, true);
                if self.snap.captures_outstanding.answered((id, slot, chunk))
                    == Some(self.snap.markers)
                {
                    self.captured(w, chunk, Ok(Captured::State(Part::Reuse(part))));
                }
                self.settle();
                return Ok(());
            }
            ToCoordinator::Failed {
                slot,
                chunk,
                failure,
            } => {
                slot_of(conn, slot)?;
                let error = error_of::<J>(failure, self.phase, chunk, &peer);
                let error = self.snap.from_snapshot.blame(chunk, error);
                tracing::warn!(peer = %peer, chunk, error = %error, "a worker process lost a chunk: the job ends");
                self.fail(error);
                return Ok(());
            }
            ToCoordinator::Surrendered { chunk, state } => {
                if self
                    .remote
                    .fetches
                    .get(&chunk)
                    .is_none_or(|(from, ..)| *from != id)
                {
                    // Asked by a recovery given up since: late, not wrong.
                    if self.late_surrenders.remove(&(id, chunk)) {
                        return Ok(());
                    }
                    return Err(bad(format!("chunk {chunk} was not asked for")));
                }
                self.surrendered(id, chunk, state);
                self.settle();
                return Ok(());
            }
            ToCoordinator::CapturedHeld { chunk, state } => {
                let (_, marker) = self.held_answer(id, chunk).map_err(bad)?;
                self.remote_parts(id, RemotePart::Held, false);
                self.captured_held(id, chunk, Part::New(state), marker);
                return Ok(());
            }
            ToCoordinator::CapturedHeldPart { chunk, part } => {
                let (folder, marker) = self.held_answer(id, chunk).map_err(bad)?;
                let job_id = self.config.snapshots.job_id::<J>();
                check_part(&part, chunk, &job_id, Some(folder)).map_err(bad)?;
                self.remote_parts(id, RemotePart::Held, true);
                self.captured_held(id, chunk, Part::Reuse(part), marker);
                return Ok(());
            }
            ToCoordinator::OutputDone { chunk } => {
                // Only for an `Output` the finishing job asked of it (`finish.rs`).
                if !self.held_by(id).contains(&chunk) || !self.output_done(chunk) {
                    return Err(bad(format!("chunk {chunk} was not asked to be output")));
                }
                self.settle();
                return Ok(());
            }
            ToCoordinator::Missing { chunk } | ToCoordinator::FailedHeld { chunk, .. }
                if foreign =>
            {
                return Err(bad(format!("chunk {chunk} is not this process's")));
            }
            ToCoordinator::Missing { chunk } => {
                let error = Error::PartitionsLost {
                    job: J::NAME,
                    chunks: vec![chunk],
                };
                tracing::warn!(peer = %peer, chunk, "a worker process does not hold a partition it was given");
                self.fail(error);
                return Ok(());
            }
            ToCoordinator::FailedHeld { chunk, failure } => {
                let error = error_of::<J>(failure, self.phase, chunk, &peer);
                let error = self.snap.from_snapshot.blame(chunk, error);
                tracing::warn!(peer = %peer, chunk, error = %error, "a worker process failed on a partition it holds: the job ends");
                self.fail(error);
                return Ok(());
            }
            ToCoordinator::Done {
                slot,
                chunk,
                output,
                halos,
                iterations,
                busy_ns,
            } => {
                let w = slot_of(conn, slot)?;
                conn.ended_in(slot);
                let kept = match (J::OWNERSHIP.is_partitioned(), halos) {
                    (true, Some(halos)) => {
                        // The ledger takes a `Done` only for the chunk the slot runs: one for
                        // another chunk must not replace that chunk's halos first.
                        if !self.core.runs(w, chunk) {
                            return Err(bad(format!(
                                "chunk {chunk} ended in slot {slot}, which does not run it"
                            )));
                        }
                        if self.check_addresses(chunk, &halos).map_err(bad)?.is_none() {
                            return Ok(());
                        }
                        // Kept by that process, with its halos here for the barrier.
                        self.keep_exports(id, chunk, halos).map_err(bad)?;
                        Some(Held::Elsewhere(id))
                    }
                    (false, None) => None,
                    (true, None) => {
                        return Err(bad(format!("chunk {chunk} ended without its halos")));
                    }
                    (false, Some(_)) => {
                        return Err(bad(format!(
                            "halos for chunk {chunk} of a job without partitions"
                        )));
                    }
                };
                let decoded = codec::decode("a chunk output", &output).map_err(|e| {
                    PeerError::Undecodable {
                        peer: peer.to_string(),
                        job: J::NAME.to_owned(),
                        version: J::VERSION,
                        what: "a chunk output",
                        here: true,
                        source: e.source,
                    }
                })?;
                let event = Event::Done {
                    worker: w,
                    chunk,
                    output: decoded,
                    kept,
                    work: work(iterations, busy_ns),
                };
                (event, Some(output), "a Done", slot, chunk)
            }
            ToCoordinator::Yielded {
                slot,
                chunk,
                state,
                iterations,
                busy_ns,
            } => {
                let w = slot_of(conn, slot)?;
                conn.ended_in(slot);
                let event = Event::Yielded {
                    worker: w,
                    chunk,
                    state: Held::Bytes(state),
                    work: work(iterations, busy_ns),
                };
                (event, None, "a Yielded", slot, chunk)
            }
            ToCoordinator::Returned { slot, chunks } => {
                let w = slot_of(conn, slot)?;
                let chunk = chunks.first().copied().unwrap_or_default();
                // (From a slot the ledger no longer has: late news, dropped below.)
                let known = self.core.knows(w);
                if let Some(&c) = chunks.iter().find(|&&c| known && !self.core.runs(w, c)) {
                    return Err(bad(format!("chunk {c} was not granted to slot {slot}")));
                }
                // A cut that waited for them from the slot asks their holder first, before
                // the ledger may hand them to another worker: they are held there,
                // unstarted since the marker. One never started anywhere has no part.
                for &c in &chunks {
                    if self.snap.cut.waits_for(w, c) {
                        let held = self.core.fallback(c).is_some();
                        let what = if held {
                            Captured::Held
                        } else {
                            Captured::Scratch
                        };
                        self.captured(w, c, Ok(what));
                    }
                }
                let event = Event::Returned { worker: w, chunks };
                if let Err(rejected) = self.feed_checked(event, None) {
                    return Err(PeerError::Rejected {
                        peer: peer.to_string(),
                        what: "a Returned",
                        reason: format!("the job's ledger refuses chunk {chunk} from slot {slot}"),
                        source: Some(Box::new(rejected)),
                    });
                }
                self.settle();
                return Ok(());
            }
            ToCoordinator::Abandoned { slot, chunk } => {
                let w = slot_of(conn, slot)?;
                // Only a rollback abandons chunks, those its slots run.
                if !self.rollback.is_under_way() || !self.core.runs(w, chunk) {
                    return Err(bad(format!(
                        "chunk {chunk} was abandoned in slot {slot}, which was not asked to"
                    )));
                }
                conn.ended_in(slot);
                // The ledger is replaced by the snapshot's before anything runs again: this
                // one only learns that the slot is free (no cut starts during a rollback,
                // so the empty state is never read).
                let event = Event::Yielded {
                    worker: w,
                    chunk,
                    state: Held::Bytes(Bytes::new()),
                    work: work(0, 0),
                };
                (event, None, "an Abandoned", slot, chunk)
            }
        };
        let (event, output_bytes, kind, slot, chunk) = event;
        match self.feed_checked(event, output_bytes) {
            Ok(()) => {
                self.halos_gone_with_a_peer();
                self.settle();
                Ok(())
            }
            Err(rejected) => Err(PeerError::Rejected {
                peer: peer.to_string(),
                what: kind,
                reason: format!("the job's ledger refuses chunk {chunk} from slot {slot}"),
                source: Some(Box::new(rejected)),
            }),
        }
    }
}

/// The error a worker process's [`Failure`] stands for: the same variant the same failure
/// gives on a local worker.
fn error_of<J: Job>(failure: Failure, phase: u64, chunk: ChunkId, peer: &str) -> Error {
    match failure {
        Failure::Panicked { input, message } => Error::Panicked {
            job: J::NAME,
            site: if input {
                Site::Input
            } else {
                Site::Chunk { phase, chunk }
            },
            message,
        },
        Failure::Input { chain } => Error::Input {
            job: J::NAME,
            source: Box::new(RemoteCause::chain(peer, chain)),
        },
        Failure::Store { chain } => Error::PartUnreadable {
            job: J::NAME,
            chunk,
            peer: peer.to_owned(),
            source: Box::new(RemoteCause::chain(peer, chain)),
        },
        Failure::Codec { what, error } => Error::Codec {
            what: codec::what_of(&what),
            source: error,
        },
        Failure::Output { phase, chain } => Error::Output {
            job: J::NAME,
            phase,
            chunk,
            source: Box::new(RemoteCause::chain(peer, chain)),
        },
    }
}

/// An error that happened in a worker process, as its text (and its causes' texts): the
/// source of an [`Error::Input`] that came over the wire.
#[derive(Debug)]
struct RemoteCause {
    message: String,
    peer: Arc<str>,
    source: Option<Box<RemoteCause>>,
}

impl RemoteCause {
    /// The chain `messages` (outermost first); `peer` is the worker process.
    fn chain(peer: &str, messages: Vec<String>) -> RemoteCause {
        let peer: Arc<str> = peer.into();
        let mut cause = None;
        for message in messages.into_iter().rev() {
            cause = Some(RemoteCause {
                message,
                peer: Arc::clone(&peer),
                source: cause.map(Box::new),
            });
        }
        cause.unwrap_or(RemoteCause {
            message: "an error without a message".to_owned(),
            peer,
            source: None,
        })
    }

    /// The worker process where it happened.
    #[allow(dead_code)]
    fn peer(&self) -> &str {
        &self.peer
    }
}

impl std::fmt::Display for RemoteCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for RemoteCause {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn std::error::Error + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::{Failure, check_part, error_of};
    use crate::snapshot::PartRef;

    /// The coordinator's side of an allgather's own pieces (protocol 25): a piece whose
    /// `Done` came from a process is named (`None`) in that process's `Gathered` at the
    /// barrier right after, and sent as bytes to every other process; a record of an older
    /// phase names nothing, nor one from before the processes forgot their partitions.
    #[test]
    fn an_allgather_piece_is_named_only_to_the_process_that_exported_it() {
        use super::{Conn, ProcessId, Remotes, frame};
        use bytes::Bytes;
        let mut r = Remotes::default();
        let (a, b) = (ProcessId(0), ProcessId(1));
        for id in [a, b] {
            r.conns.insert(
                id,
                Conn {
                    peer: format!("p{}", id.0).into(),
                    node: super::NodeId(0),
                    phase_sent: None,
                    slots: Vec::new(),
                    progress: Vec::new(),
                    retiring: false,
                    reads_store: false,
                    listen: None,
                    told: super::Told::default(),
                },
            );
        }
        let piece = |c: u64| Bytes::from(format!("piece of {c}"));
        // Chunk 0 ran in `a` and chunk 1 in `b` in phase 4; chunk 2 in `a` in phase 3.
        for (id, chunk, phase) in [(a, 0, 4), (b, 1, 4), (a, 2, 3)] {
            let halos = vec![(None, frame::Halo::Sent(piece(chunk)))];
            r.count_halos((id, phase), chunk, halos).unwrap();
        }
        let gathered: Vec<(u64, Bytes)> = (0..3).map(|c| (c, piece(c))).collect();
        let begins = vec![(a, 0, Vec::new()), (b, 1, Vec::new())];
        r.begin_remote(
            (5, 3),
            Bytes::from_static(b"job"),
            begins.clone(),
            gathered.clone(),
        );
        type Pieces = Vec<(u64, Option<Bytes>)>;
        let sent = |r: &mut Remotes| -> Vec<(ProcessId, Pieces)> {
            let mut all = Vec::new();
            for (id, msg) in std::mem::take(&mut r.outbox) {
                if let frame::ToWorker::Gathered { pieces } = msg {
                    all.push((id, pieces));
                }
            }
            all.sort_by_key(|(id, _)| *id);
            all
        };
        assert_eq!(
            sent(&mut r),
            vec![
                (a, vec![(0, None), (1, Some(piece(1))), (2, Some(piece(2)))]),
                (b, vec![(0, Some(piece(0))), (1, None), (2, Some(piece(2)))]),
            ]
        );
        // A rollback: the processes forget what they exported, and are sent every piece.
        r.forget_partitions();
        r.outbox.clear();
        r.begin_remote((5, 3), Bytes::from_static(b"job"), begins, gathered);
        let every: Pieces = (0..3).map(|c| (c, Some(piece(c)))).collect();
        assert_eq!(sent(&mut r), vec![(a, every.clone()), (b, every)]);
    }

    /// A process that could not read a placed partition's part: the job's error names the
    /// chunk and the process, and keeps the process's error chain as its sources.
    #[test]
    fn a_placed_part_a_process_cannot_read_is_a_typed_error_with_its_causes() {
        let failure = Failure::Store {
            chain: vec!["get of part x failed".to_owned(), "no such file".to_owned()],
        };
        let e = error_of::<crate::job::fixtures::Idle>(failure, 4, 3, "127.0.0.1:9");
        let crate::Error::PartUnreadable { chunk: 3, peer, .. } = &e else {
            panic!("{e:?}");
        };
        assert_eq!(peer, "127.0.0.1:9");
        let mut texts = Vec::new();
        let mut next = std::error::Error::source(&e);
        while let Some(s) = next {
            texts.push(s.to_string());
            next = s.source();
        }
        assert_eq!(texts.len(), 2, "{texts:?}");
        assert!(texts[0].contains("get of part x failed"), "{texts:?}");
        assert!(texts[1].contains("no such file"), "{texts:?}");
    }

    fn part(chunk: crate::schedule::ChunkId, key: &str) -> PartRef {
        PartRef {
            chunk,
            key: key.to_owned(),
            size: 1,
            crc32c: 0,
        }
    }

    /// A part a worker process reports must be this job's, this chunk's and, for a held
    /// partition, in the epoch folder asked.
    #[test]
    fn parts_reported_by_workers_are_checked() {
        let good = "grid/00000000000000000007/parts/2-3-00ff";
        check_part(&part(3, good), 3, "grid", Some(7)).unwrap();
        check_part(&part(3, good), 3, "grid", None).unwrap();
        for (chunk, key, folder) in [
            (3, good, Some(8)),                                     // another folder
            (4, good, Some(7)),                                     // another chunk
            (3, "grids/00000000000000000007/parts/2-3-00ff", None), // another job
            (3, "other/00000000000000000007/parts/2-3-00ff", Some(7)),
            (3, "grid/00000000000000000007/manifest", Some(7)), // not a part
            (3, "grid/00000000000000000007/parts/../x", Some(7)),
            (3, "grid/7/parts/2-3-00ff", Some(7)),
        ] {
            let refused = check_part(&part(3, key), chunk, "grid", folder).unwrap_err();
            assert!(refused.contains("is not a part of chunk"), "{refused}");
        }
    }
}
