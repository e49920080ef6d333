//! The executor's side of coordinated snapshots: it drives the pure cut of
//! `schedule/cut.rs` (where the protocol and its correctness argument live) and carries out
//! its commands, writes complete cuts in the background, and resumes jobs.
//!
//! # What the executor adds to the cut's protocol
//!
//! 1. *Marker.* Under the job's lock, `poll_cut` lets the cut record the manifest (the job
//!    value, the merge: chunks `0..merged` folded, later outputs held) and the part of every
//!    suspended chunk: its bytes, or, if its state is unchanged since a committed snapshot,
//!    the part already in the store. A `Capture` command raises a local worker's `CAPTURE`
//!    bit, or sends `Capture` to the worker process of a remote slot.
//! 2. *Capture.* A local worker serializes its chunk at its next adjustment point, hands the
//!    bytes over under the lock and goes on with the same chunk: it pauses only to serialize.
//!    A worker process sends the state, or writes the part itself and sends its reference;
//!    so does one asked for a partition it holds (`CaptureHeld`, see `remote.rs`).
//!    A `Done` or `Yielded` of a waited chunk reaches the cut before the core
//!    (`State::feed_at`), and a lost remote slot's chunk is taken with the state the ledger
//!    falls back to (`remote.rs`).
//! 3. *Write.* A complete cut goes to a task on the executor's I/O runtime: new parts go up
//!    concurrently, then the numbered manifest is created (`PutMode::Create`: the commit),
//!    then retention runs. Workers never wait for storage.
//! 4. *Reply.* Requesters get the committed [`SnapshotId`], or [`Error::SnapshotFailed`] with
//!    the cause; a failed snapshot changes nothing in the running job, and the previous
//!    committed snapshot stays the latest. After a suspend's commit the job ends with
//!    `Outcome::Suspended`.
//!
//! # Failures are reported
//!
//! Every failed snapshot, whoever asked for it (a requester, the period, a suspend), is
//! logged (`tracing`, warning, with its cause), counted
//! ([`SNAPSHOT_FAILURES`](crate::metrics::SNAPSHOT_FAILURES)) and kept on the job's handle
//! ([`JobHandle::snapshot_failures`](crate::JobHandle::snapshot_failures),
//! [`JobHandle::last_snapshot_error`](crate::JobHandle::last_snapshot_error)). With
//! [`Builder::max_snapshot_failures`](crate::Builder::max_snapshot_failures) the job ends
//! with [`Error::SnapshotsFailing`] after that many failures in a row; a commit resets the
//! count.
//!
//! # Full snapshots
//!
//! An incremental snapshot references the parts of chunks unchanged since the last commit,
//! so snapshots share parts and one damaged part breaks each of them.
//! [`Builder::full_snapshot_every`](crate::Builder::full_snapshot_every)`(n)` makes every
//! `n`-th snapshot (counted since the last full one) write every part again: with `n = 1`,
//! the kept snapshots are independent restore points.

use crate::schedule::idhash::IdMap;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use super::job_run::State;
use super::members::Member;
use super::remote::Asked;
use crate::codec::{encode, encode_sized};
use crate::error::{Cause, Error, Result};
use crate::job::Job;
use crate::run::Held;
use crate::run::{CAPTURE, SuspendToken};
use crate::schedule::{ChunkId, Chunking, Core, Cut, CutCommand, ProcessId, Schedule, WorkerId};
use crate::snapshot::{FORMAT_VERSION, Manifest, PartRef, Skipped, SnapshotId, Store};
use crate::wire::frame::ToWorker;

/// What a running chunk left for a cut, as the executor hands it to [`Cut::captured`].
pub(crate) type Captured = crate::schedule::Captured<Part, bytes::Bytes>;

/// Who waits for a snapshot's outcome: a number the driver keeps the requester's channel
/// under (`links.rs`); the state answers it with an order (`Order::Reply`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Reply(pub(crate) u64);

/// A chunk's part in a cut: already in the store (unchanged since a committed snapshot, or
/// written by the remote worker that runs the chunk), or bytes to write.
#[derive(Debug)]
pub(crate) enum Part {
    Reuse(PartRef),
    New(bytes::Bytes),
}

/// What the executor records at a cut's marker: the manifest without its parts and outputs
/// (the cut collects those), and when the marker was.
#[derive(Debug)]
pub(crate) struct Header {
    pub(crate) manifest: Manifest,
    /// When, since the run started.
    pub(crate) started: Duration,
}

type Commands = Vec<CutCommand<Header, Part, bytes::Bytes, Reply, Error>>;

/// A state serialized on a helper thread: its chunk, whether it is a kept partition, the state
/// (to put back) and its bytes.
type Encoded<C> = (ChunkId, bool, Box<C>, Result<bytes::Bytes>);

/// A state taken out of the ledger to serialize: its chunk, whether it is a kept partition,
/// the state, and the bytes to start its buffer with.
type Taken<C> = (ChunkId, bool, Box<C>, usize);

/// Snapshot bookkeeping of one job run: the pure cut (`schedule/cut.rs`), and what only the
/// executor knows (parts in the store, epochs, timings).
#[derive(Default)]
pub(crate) struct Snapshots {
    pub(crate) cut: Cut<Header, Part, bytes::Bytes, Reply>,
    /// Parts of pending chunks whose state has not changed since a committed snapshot.
    pub(crate) cache: IdMap<ChunkId, PartRef>,
    /// The highest epoch this run committed or restored.
    pub(crate) last_epoch: Option<u64>,
    /// The latest snapshot committed in the configured store that this run knows of (epoch,
    /// manifest creation time): worker processes prove they reach the store by reading it.
    pub(crate) witness: Option<(u64, u64)>,
    /// The longest snapshot so far, for the deadline's margin.
    pub(crate) longest: Option<Duration>,
    /// The cut's command buffer, reused.
    pub(crate) out: Commands,
    /// Worker processes that keep the partitions of chunks whose `Done` reached a cut before
    /// the ledger (their part is asked of them).
    pub(crate) kept_by: IdMap<ChunkId, ProcessId>,
    /// Snapshots committed since the last full one (one that referenced no part of an
    /// earlier snapshot); `u32::MAX` when unknown (a resumed run).
    pub(crate) since_full: u32,
    /// Failed snapshots, for the handle and `max_snapshot_failures`.
    pub(crate) failures: Failures,
    /// The snapshot this run was resumed from and those passed over for it.
    pub(crate) resumed: Option<Resumed>,
    /// The worker process each held partition's part was last asked of (`CaptureHeld`) for
    /// the open cut: only that process's answer is taken into it.
    pub(crate) held_asked: IdMap<ChunkId, ProcessId>,
    /// Every `CaptureHeld` not answered yet, by chunk and worker process: the epoch folder
    /// each named and the cut it was for (its marker, `markers`), oldest first (a process
    /// answers about one chunk in the order it was asked). An answer that none of them asked
    /// for breaks the protocol; an answer to an abandoned cut's request, or to one from
    /// before a rollback, is taken and dropped.
    pub(crate) held_outstanding: Asked<(ChunkId, ProcessId), (u64, u64)>,
    /// Every `Capture` of a running chunk not answered yet, by process, slot and chunk: the
    /// marker of the cut each was for, oldest first. A process writes a captured state to the
    /// store in the background and answers when the write ends, which may be after the
    /// chunk's `Done`, after the cut completed, after a rollback: only an answer to the open
    /// cut's request goes into it (the same slot often runs the same chunk in the next phase,
    /// and the next cut waits for it again).
    pub(crate) captures_outstanding: Asked<(ProcessId, u32, ChunkId), u64>,
    /// Markers so far in this run (rollbacks included): the open cut's is the last. An answer
    /// to a `CaptureHeld` goes into the open cut only if it was asked for this marker: a
    /// suspend abandons an open cut, and the next cut (after the barrier, say) asks the same
    /// process for the same partition again, in the same epoch folder, while the abandoned
    /// cut's answer, the partition before its new phase began, may still be on its way.
    pub(crate) markers: u64,
    /// Held partitions the open cut waits for that were already on their way back from their
    /// worker process (`Surrender`) when the cut wanted them: their bytes are the part, taken
    /// when they arrive (the process no longer has them to answer a `CaptureHeld`). With each,
    /// whether its phase had begun at the marker (the barrier came while it was on its way,
    /// and its halos wait for it, `Fetch::Begin`): then its part is the partition begun, as
    /// the ledger's other partitions are at that marker, not the bytes that left the process.
    pub(crate) held_on_arrival: IdMap<ChunkId, bool>,
    /// The size of each chunk's last part serialized by `encode_pending`: the next one's
    /// buffer starts that large, so that a large state is copied into it once.
    pub(crate) part_sizes: IdMap<ChunkId, usize>,
    /// The chunk states that are still the bytes of the snapshot this run was restored
    /// from (`from_snapshot.rs`).
    pub(crate) from_snapshot: super::from_snapshot::FromSnapshot,
}

/// Where snapshots go, how many to keep, and what triggers them.
#[derive(Clone, Debug)]
pub(crate) struct SnapshotConfig {
    pub(crate) url: Option<String>,
    pub(crate) options: Vec<(String, String)>,
    /// Opened at the first use (so the default folder is created only when needed).
    opened: Arc<OnceLock<Store>>,
    pub(crate) job_id: Option<String>,
    pub(crate) keep: usize,
    pub(crate) every: Option<Duration>,
    /// Every this many snapshots, one is written in full (no part reused).
    pub(crate) full_every: Option<u32>,
    /// End the job after this many snapshots in a row failed.
    pub(crate) max_failures: Option<u32>,
    pub(crate) deadline: Option<SystemTime>,
    /// Signal numbers that ask for a suspend (empty: none).
    pub(crate) signals: Vec<i32>,
    pub(crate) token: Option<SuspendToken>,
}

/// The store used when none is configured: the folder `snapshots` in the working directory.
pub(crate) const DEFAULT_FOLDER: &str = "snapshots";

impl Default for SnapshotConfig {
    fn default() -> Self {
        SnapshotConfig {
            url: None,
            options: Vec::new(),
            opened: Arc::default(),
            job_id: None,
            keep: 2,
            every: None,
            full_every: None,
            max_failures: None,
            deadline: None,
            signals: Vec::new(),
            token: None,
        }
    }
}

impl SnapshotConfig {
    /// The store, opened on first use.
    pub(crate) fn store(&self) -> Result<Store> {
        if let Some(s) = self.opened.get() {
            return Ok(s.clone());
        }
        let url = match &self.url {
            Some(u) => u.clone(),
            None => {
                let dir = std::env::current_dir().map_err(|e| {
                    Error::InvalidConfig(format!(
                        "no working directory for the default snapshot folder: {e}"
                    ))
                })?;
                format!("file://{}", dir.join(DEFAULT_FOLDER).display())
            }
        };
        let store = Store::open_with(&url, self.options.clone())?;
        Ok(self.opened.get_or_init(|| store).clone())
    }

    /// Uses `store` (already opened) for snapshots.
    pub(crate) fn set_store(&mut self, store: Store) {
        self.url = Some(store.url().to_owned());
        self.opened = Arc::new(OnceLock::from(store));
    }

    pub(crate) fn job_id<J: Job>(&self) -> String {
        self.job_id.clone().unwrap_or_else(|| J::NAME.to_owned())
    }
}

/// Which snapshot to resume from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum At {
    /// The newest committed snapshot that can be read back whole: a damaged one (a part
    /// missing or corrupt) is passed over for the one before it, with a warning, and named
    /// in [`JobHandle::resumed`](crate::JobHandle::resumed).
    Latest,
    /// This epoch (an error if it is damaged).
    Epoch(u64),
}

/// Where a resumed job came from, from [`JobHandle::resumed`](crate::JobHandle::resumed).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Resumed {
    /// The snapshot the job was resumed from.
    pub from: SnapshotId,
    /// Newer committed snapshots passed over by [`At::Latest`] because they are damaged,
    /// newest first, each with why.
    pub skipped: Vec<Skipped>,
}

/// Failed snapshots of a job run.
#[derive(Debug, Default)]
pub(crate) struct Failures {
    /// Every failure.
    pub(crate) total: u64,
    /// Failures since the last commit.
    pub(crate) in_a_row: u32,
    /// The cause of the last one.
    pub(crate) last: Option<Cause>,
}

/// The schedule and chunking of a run, stored in the manifest so a restore cuts the phase
/// the same way (and the value stays bit-identical).
#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) struct RunConfig {
    pub(crate) schedule: Schedule,
    pub(crate) chunking: Chunking,
}

impl Snapshots {
    /// Starts with the parts of a restored snapshot: all of them are pending and unchanged.
    pub(crate) fn restored(manifest: &Manifest) -> Snapshots {
        Snapshots {
            cache: manifest.all_parts().map(|p| (p.chunk, p.clone())).collect(),
            last_epoch: Some(manifest.epoch),
            witness: Some((manifest.epoch, manifest.created_unix_ms)),
            since_full: u32::MAX,
            from_snapshot: super::from_snapshot::FromSnapshot::of(manifest),
            ..Snapshots::default()
        }
    }

    /// Whether the next snapshot must be written in full (`full_every`).
    fn full_due(&self, cfg: &SnapshotConfig) -> bool {
        cfg.full_every
            .is_some_and(|n| self.since_full.saturating_add(1) >= n.max(1))
    }

    /// The epoch folder the next snapshot's parts go to (the writer takes the next epoch
    /// after the store's latest; it is this one unless another writer committed meanwhile).
    pub(crate) fn next_folder(&self) -> u64 {
        self.last_epoch.map_or(0, |e| e + 1)
    }

    /// The job ended: every requester still waiting (an open cut's, a suspend's, queued),
    /// to answer with [`Error::Ended`]. A write in flight still completes.
    pub(crate) fn end(&mut self) -> Vec<Reply> {
        self.cut.end()
    }

    /// A chunk is handed to a worker: its state will change.
    pub(crate) fn on_run(&mut self, chunk: ChunkId) {
        if !self.cache.is_empty() {
            self.cache.remove(&chunk);
        }
        self.from_snapshot.handed_out(chunk);
        self.cut.ran(chunk);
    }
}

impl<J: Job> State<J> {
    /// Answers whoever waits on `reply` (the driver holds the channel).
    pub(crate) fn answer(&mut self, reply: Reply, result: Result<SnapshotId>) {
        self.orders.push(super::links::Order::Reply(reply, result));
    }

    /// Asks for a snapshot; `reply` gets its id. Joins a cut in progress, or the next one.
    pub(crate) fn request_snapshot(&mut self, reply: Reply) {
        if self.ended {
            self.answer(reply, Err(Error::Ended { job: J::NAME }));
            return;
        }
        self.snap.cut.request(reply);
        self.poll_cut();
    }

    /// Asks for a suspend: halt, snapshot once quiet, end with `Outcome::Suspended`.
    pub(crate) fn request_suspend(&mut self, reply: Option<Reply>) {
        if self.ended {
            if let Some(r) = reply {
                self.answer(r, Err(Error::Ended { job: J::NAME }));
            }
            return;
        }
        let mut out = std::mem::take(&mut self.snap.out);
        self.snap.cut.suspend(reply, &mut out);
        self.cut_commands(&mut out);
        self.snap.out = out;
        self.poll_cut();
    }

    /// Starts a cut if one is due (protocol step 1 of `schedule/cut.rs`): queued requests,
    /// or a suspend once no chunk runs. Called after every change (`settle`).
    pub(crate) fn poll_cut(&mut self) {
        if self.ended
            || self.snap.cut.is_open()
            || self.snap.cut.is_writing()
            || self.rolling_back()
            // A local recovery first: the partitions it replays are on their way.
            || self.recovery.is_some()
            // The last phase ended: the job is being output and gathered (`finish.rs`).
            || self.finishing.is_some()
        {
            return;
        }
        // A full snapshot reuses no part: every state is written again.
        let full = self.snap.full_due(&self.config.snapshots);
        // From here to the marker's end the job's lock is held: every worker that needs it
        // waits (at a barrier, all of them), which is the pause a snapshot costs them.
        let due = self.snap.cut.is_due(&self.core);
        let mut encoded = if due {
            self.encode_pending(full)
        } else {
            IdMap::default()
        };
        let mut out = std::mem::take(&mut self.snap.out);
        let (cfg, schedule, chunking) = (
            &self.config.snapshots,
            self.config.schedule,
            self.config.chunking,
        );
        let State {
            snap,
            core,
            job,
            phase,
            iterations_before,
            now,
            ..
        } = self;
        let (cut, cache) = (&mut snap.cut, &snap.cache);
        let reuse = |c: &ChunkId| if full { None } else { cache.get(c) };
        let header = |core: &Core<J::Reducer, Held<J::Chunk>>| {
            let run = RunConfig { schedule, chunking };
            header::<J>(
                cfg,
                run,
                job.as_deref(),
                *phase,
                *iterations_before,
                core,
                *now,
            )
        };
        let part_of = |c: ChunkId, state: &Held<J::Chunk>| match reuse(&c) {
            Some(p) => Ok(Some(Part::Reuse(p.clone()))),
            None => match encoded.remove(&c) {
                Some(bytes) => Ok(Some(Part::New(bytes?))),
                // `None`: a partition held by a worker process, asked for (`CaptureHeld`).
                None => state.to_bytes().map(|b| Ok(Part::New(b?))).transpose(),
            },
        };
        let was_open = cut.is_open();
        cut.poll(core, header, part_of, &mut out);
        if !was_open && cut.is_open() {
            snap.markers += 1;
        }
        if due {
            self.pause = Some(super::job_run::Pause::Marker);
        }
        self.cut_commands(&mut out);
        self.snap.out = out;
    }

    /// Serializes the live states of pending chunks and kept partitions that the store does
    /// not already have, on as many threads as the machine has (for a grid of owned
    /// partitions, nearly the whole grid waits in the ledger at a barrier). Each state is
    /// taken out of the ledger, serialized on a scoped thread and put back, all under the
    /// job's lock: the workers waiting for the lock lend their cores. Few states are left to
    /// the marker itself.
    ///
    /// # Why here, under the lock
    ///
    /// A state in the ledger must not change until it is serialized: the next phase's
    /// `begin_phase` and steps would mutate a band the cut has not recorded yet. So whoever
    /// serializes it, the worker that would run it next waits that long. Serializing it
    /// outside the lock would need a new ledger state (taken by a cut, not runnable) for no
    /// gain in wall time; serializing it on the worker that holds it would serialize one
    /// worker's half of the grid on that worker's core, which the helper threads here also
    /// take (every core, the grid's bytes split evenly) without a round trip to the
    /// workers. The pause a worker sees is thus about its share of the grid serialized
    /// alone; it is recorded as [`SNAPSHOT_PAUSE`](crate::metrics::SNAPSHOT_PAUSE) by
    /// `poll_cut`. The cut stays consistent because nothing else can reach a taken state:
    /// the states go back before the lock is released, and the next phase's start
    /// (`begin_partitions`, which mutates every kept band) runs under the same lock, after
    /// the marker; a running band the cut waits for reaches the cut (its `Done` and its
    /// partition, serialized under the lock) before the core sees it end the phase.
    /// What made the pause longer than that was the size of the states: a buffer
    /// sized from the chunk's previous part ([`Snapshots::part_sizes`]) is filled once, not
    /// regrown, and a band's part holds its rows only (`rows.rs`).
    fn encode_pending(&mut self, full: bool) -> IdMap<ChunkId, Result<bytes::Bytes>> {
        let threads = std::thread::available_parallelism().map_or(1, usize::from);
        let sizes = &self.snap.part_sizes;
        let cache = &self.snap.cache;
        let stored = |c: &ChunkId| !full && cache.contains_key(c);
        let live = |c: &ChunkId, h: &&mut Held<J::Chunk>| !stored(c) && matches!(h, Held::Live(_));
        let unwritten =
            |(c, h): &(ChunkId, &Held<J::Chunk>)| !stored(c) && matches!(h, Held::Live(_));
        let count = self.core.suspended().filter(unwritten).count()
            + self.core.kept().filter(unwritten).count();
        if threads < 2 || count < 2 {
            return IdMap::default();
        }
        let phase = self.phase;
        let placeholder = || Held::Bytes(bytes::Bytes::new());
        // The previous part's size and a little more (an accumulator may grow).
        let hint = |c: &ChunkId| sizes.get(c).map_or(0, |&n| n + 256);
        let mut taken: Vec<Taken<J::Chunk>> = Vec::with_capacity(count);
        for (c, h) in self.core.suspended_mut().filter(|(c, h)| live(c, h)) {
            if let Held::Live(state) = std::mem::replace(h, placeholder()) {
                taken.push((c, false, state, hint(&c)));
            }
        }
        for (c, h) in self.core.kept_mut().filter(|(c, h)| live(c, h)) {
            if let Held::Live(state) = std::mem::replace(h, placeholder()) {
                taken.push((c, true, state, hint(&c)));
            }
        }
        let mut groups: Vec<Vec<Taken<J::Chunk>>> =
            (0..threads.min(taken.len())).map(|_| Vec::new()).collect();
        let n = groups.len();
        for (i, t) in taken.into_iter().enumerate() {
            groups[i % n].push(t);
        }
        let done: Vec<Vec<Encoded<J::Chunk>>> = std::thread::scope(|scope| {
            let handles: Vec<_> = groups
                .into_iter()
                .map(|group| {
                    scope.spawn(move || {
                        group
                            .into_iter()
                            .map(|(chunk, kept, state, hint)| {
                                // A panicking `Serialize` fails the snapshot, and the
                                // state still goes back.
                                let site = crate::Site::Chunk { phase, chunk };
                                let bytes = crate::run::catch(site, J::NAME, || {
                                    encode_sized("a chunk state", &state, hint)
                                })
                                .and_then(|r| r.map_err(Error::from))
                                .map(bytes::Bytes::from);
                                (chunk, kept, state, bytes)
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_default())
                .collect()
        });
        let mut encoded = IdMap::with_capacity_and_hasher(count, Default::default());
        let mut back: IdMap<(bool, ChunkId), Box<J::Chunk>> =
            IdMap::with_capacity_and_hasher(count, Default::default());
        for (c, kept, state, bytes) in done.into_iter().flatten() {
            back.insert((kept, c), state);
            if let Ok(b) = &bytes {
                self.snap.part_sizes.insert(c, b.len());
            }
            encoded.insert(c, bytes);
        }
        for (c, h) in self.core.suspended_mut() {
            if let Some(state) = back.remove(&(false, c)) {
                *h = Held::Live(state);
            }
        }
        for (c, h) in self.core.kept_mut() {
            if let Some(state) = back.remove(&(true, c)) {
                *h = Held::Live(state);
            }
        }
        encoded
    }

    /// Protocol step 2: what `worker` left of `chunk` for the cut (ignored unless the cut
    /// waits for it from that worker); an error abandons the cut.
    pub(crate) fn captured(&mut self, worker: WorkerId, chunk: ChunkId, what: Result<Captured>) {
        let mut out = std::mem::take(&mut self.snap.out);
        self.snap.cut.captured(worker, chunk, what, &mut out);
        self.cut_commands(&mut out);
        self.snap.out = out;
    }

    /// Asks the worker process that holds the partition of `chunk` for its part (protocol
    /// step 2 for a partition the ledger has no state of), naming the epoch folder the part
    /// goes to if the process writes it itself.
    fn capture_held(&mut self, chunk: ChunkId) {
        let in_ledger = self
            .core
            .suspended()
            .chain(self.core.kept())
            .find(|(c, _)| *c == chunk)
            .map(|(_, h)| (h.elsewhere(), h.to_bytes()));
        let kept_by = self.snap.kept_by.remove(&chunk);
        if let Some((None, Some(bytes))) = in_ledger {
            // The cut counted it as held by a worker process when its `Done` came, but it
            // has come back since (a retire, a leave): the ledger's copy is the part, and the
            // process, which no longer has it, is not asked.
            let mut out = std::mem::take(&mut self.snap.out);
            let part = bytes.map(Part::New).map_err(Error::from);
            self.snap.cut.captured_held(chunk, part, &mut out);
            self.cut_commands(&mut out);
            self.snap.out = out;
            return;
        }
        // Not in the ledger and not kept: a partition granted to a slot of its holder
        // (the ledger keeps where it is as its fallback), or on its way from its holder.
        let holder = in_ledger
            .and_then(|(elsewhere, _)| elsewhere)
            .or(kept_by)
            .or_else(|| self.core.fallback(chunk).and_then(Held::elsewhere))
            .or_else(|| self.remote.fetching_from(chunk));
        if holder.is_some_and(|id| self.remote.fetching_from(chunk) == Some(id)) {
            // Surrendered already: its bytes, on their way, are the part.
            let begun = self.remote.begin_pending(chunk);
            self.snap.held_on_arrival.insert(chunk, begun);
            return;
        }
        let folder = self.snap.next_folder();
        let sent = holder.and_then(|id| {
            self.remote
                .send_to(id, ToWorker::CaptureHeld { chunk, folder })?;
            self.snap.held_asked.insert(chunk, id);
            let marker = self.snap.markers;
            self.snap
                .held_outstanding
                .ask((chunk, id), (folder, marker));
            Some(())
        });
        match sent {
            Some(()) => {}
            None => {
                let mut out = Vec::new();
                let error = Error::PartitionGone {
                    job: J::NAME,
                    chunk,
                };
                self.snap.cut.captured_held(chunk, Err(error), &mut out);
                self.cut_commands(&mut out);
            }
        }
    }

    /// A held partition the open cut waited for arrived from its worker process after a
    /// `Surrender` (see [`Snapshots::held_on_arrival`]): `raw` as it left the process, and
    /// `begun`, the same partition once its phase began, if a begin waited for it. The one
    /// the cut's marker saw is its part.
    pub(crate) fn held_arrived(
        &mut self,
        chunk: ChunkId,
        raw: &bytes::Bytes,
        begun: impl FnOnce() -> Result<bytes::Bytes>,
    ) {
        let Some(at_marker_begun) = self.snap.held_on_arrival.remove(&chunk) else {
            return;
        };
        if self.snap.cut.waits_for_held(chunk) {
            let part = if at_marker_begun {
                begun()
            } else {
                Ok(raw.clone())
            };
            let mut out = std::mem::take(&mut self.snap.out);
            self.snap
                .cut
                .captured_held(chunk, part.map(Part::New), &mut out);
            self.cut_commands(&mut out);
            self.snap.out = out;
        }
    }

    /// The worker process that held `chunk` for the open cut is gone before it answered (a
    /// `CaptureHeld`, or a `Surrender` whose bytes the cut waited for): the cut cannot have
    /// that part, and says so instead of waiting for it.
    pub(crate) fn held_capture_lost(&mut self, chunk: ChunkId) {
        self.snap.held_asked.remove(&chunk);
        self.snap.held_on_arrival.remove(&chunk);
        if self.snap.cut.waits_for_held(chunk) {
            let mut out = std::mem::take(&mut self.snap.out);
            let error = Error::PartitionGone {
                job: J::NAME,
                chunk,
            };
            self.snap.cut.captured_held(chunk, Err(error), &mut out);
            self.cut_commands(&mut out);
            self.snap.out = out;
        }
    }

    /// A cut whose marker is out gives way to a rollback or a local recovery
    /// (`Cut::give_way`): its captures are withdrawn.
    pub(crate) fn cut_gives_way(&mut self) {
        let mut out = std::mem::take(&mut self.snap.out);
        self.snap.cut.give_way(&mut out);
        self.cut_commands(&mut out);
        self.snap.out = out;
    }

    /// Carries out the cut's commands.
    pub(crate) fn cut_commands(&mut self, out: &mut Commands) {
        for cmd in out.drain(..) {
            match cmd {
                CutCommand::Capture { worker, chunk } => match self.members.get(worker) {
                    Some(Member::Local(_)) => {
                        self.orders
                            .push(super::links::Order::Raise(worker, CAPTURE));
                    }
                    Some(Member::Remote(slot)) => self.capture_remote(*slot, chunk),
                    None => {}
                },
                CutCommand::CaptureHeld { chunk } => self.capture_held(chunk),
                CutCommand::Withdraw { worker } => {
                    if self.members.local(worker).is_some() {
                        self.orders
                            .push(super::links::Order::Lower(worker, CAPTURE));
                    }
                }
                CutCommand::Halt => self.drive_core(Core::halt),
                // A rollback keeps the core halted until the restored one replaces it.
                CutCommand::Unhalt if self.rolling_back() => {}
                CutCommand::Unhalt => self.drive_core(Core::unhalt),
                CutCommand::Fail { replies, error } => {
                    self.watch_snapshot_failed(&error);
                    let cause = Cause::new(error);
                    for r in replies {
                        self.answer(r, Err(Error::SnapshotFailed(cause.clone())));
                    }
                    self.snapshot_failed(cause, "before its write");
                }
                CutCommand::Write(write) => self.write(write),
            }
        }
        self.end_if_failing();
    }

    /// A snapshot failed (its requesters have their answer): logged, counted and kept for
    /// the handle. Whether the job must end is seen by `end_if_failing`, once the commands
    /// at hand are carried out.
    pub(crate) fn snapshot_failed(&mut self, cause: Cause, when: &str) {
        let failures = &mut self.snap.failures;
        failures.total += 1;
        failures.in_a_row = failures.in_a_row.saturating_add(1);
        let in_a_row = failures.in_a_row;
        tracing::warn!(
            job = J::NAME,
            in_a_row,
            error = &cause as &dyn std::error::Error,
            "a snapshot failed {when}: {}",
            &*cause
        );
        failures.last = Some(cause);
        self.watch.metrics.snapshot_failures.increment(1);
    }

    /// Ends the job with [`Error::SnapshotsFailing`] if `max_snapshot_failures` snapshots
    /// failed in a row. Nothing computed since is lost that a restore could have had: the
    /// error names the last committed snapshot, which stays in the store.
    fn end_if_failing(&mut self) {
        let failures = &self.snap.failures;
        let limit = self.config.snapshots.max_failures;
        if self.ended || limit.is_none_or(|n| failures.in_a_row < n) {
            return;
        }
        let Some(last) = failures.last.clone() else {
            return;
        };
        let error = Error::SnapshotsFailing {
            job: J::NAME,
            failures: failures.in_a_row,
            last_committed: self
                .snap
                .last_epoch
                .map(|e| SnapshotId::new(self.config.snapshots.job_id::<J>(), e)),
            last,
        };
        tracing::warn!(job = J::NAME, error = %error, "the job ends");
        self.fail(error);
    }

    /// A snapshot was committed: the failures in a row start again from zero, and a full
    /// one restarts the count towards the next full one.
    pub(crate) fn snapshot_committed(&mut self, full: bool) {
        self.snap.failures.in_a_row = 0;
        self.snap.since_full = if full {
            0
        } else {
            self.snap.since_full.saturating_add(1)
        };
    }

    /// Runs `f` on the core (halt, unhalt) and carries out its commands; none is for the
    /// caller.
    pub(crate) fn drive_core(
        &mut self,
        f: impl FnOnce(
            &mut Core<J::Reducer, Held<J::Chunk>>,
            &mut Vec<crate::schedule::Command<Held<J::Chunk>>>,
        ),
    ) {
        let mut cmds = std::mem::take(&mut self.out);
        f(&mut self.core, &mut cmds);
        let mine = self.execute(&mut cmds, None);
        debug_assert!(mine.is_none());
        self.out = cmds;
    }
}

/// Protocol step 1: the manifest of a cut, without its parts and outputs.
fn header<J: Job>(
    cfg: &SnapshotConfig,
    config: RunConfig,
    job: Option<&J>,
    phase: u64,
    iterations_before: u64,
    core: &Core<J::Reducer, Held<J::Chunk>>,
    now: Duration,
) -> Result<Header> {
    let job = job.ok_or(Error::Ended { job: J::NAME })?;
    let (merged, value, held) = core.merge_state();
    let done = held
        .map(|(c, v)| Ok((c, encode("a chunk output", v)?)))
        .collect::<Result<Vec<_>>>()?;
    let reduced = encode("the reduced value", value)?;
    let (done_iters, total) = core.progress();
    let manifest = Manifest {
        format_version: FORMAT_VERSION,
        job_name: J::NAME.to_owned(),
        job_id: cfg.job_id::<J>(),
        epoch: 0,           // chosen by the writer
        created_unix_ms: 0, // the writer's clock (io.rs)
        job: encode("the job", job)?,
        phase,
        iterations_before,
        iterations_done: done_iters,
        iterations_total: total,
        chunks: core.plan().len(),
        config: encode("the run configuration", &config)?,
        merged,
        reduced,
        done,
        parts: Vec::new(),
        kept: Vec::new(),
        job_version: J::VERSION,
        layout: Some(crate::Layout::of::<J>().clone()),
        ..Manifest::default() // `submitted` and `shape`: filled by the writer (io.rs)
    };
    Ok(Header {
        manifest,
        started: now,
    })
}
