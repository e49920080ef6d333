//! The executor's side of coordinated snapshots: the cut, the capture of running chunks, the
//! background write, suspend and resume.
//!
//! # The snapshot protocol (local workers)
//!
//! 1. *Marker.* Under the job's lock the coordinator records the cut of epoch E: the job
//!    value, the merge (chunks `0..merged` folded, later done outputs held), and every
//!    pending chunk (from scratch, or suspended with a state it serializes now — or, if that
//!    state is unchanged since the last committed snapshot, the part already in the store).
//!    Every chunk running at the marker is put in `waiting`, and its worker's `CAPTURE` bit is
//!    set.
//! 2. *Capture.* At its next adjustment point such a worker serializes its chunk, hands the
//!    bytes over under the lock and goes on computing the same chunk; it pauses only to
//!    serialize. If the chunk ends first, its output is taken instead (the output wins: a
//!    restore must not run the rest of a finished chunk); if it is handed back (retire), the
//!    handed-back state is taken.
//! 3. *Write.* When `waiting` is empty the cut is complete: every chunk of the phase appears
//!    in it exactly once. A background task on the executor's I/O runtime writes the new
//!    parts, then creates the numbered manifest (`PutMode::Create`: the commit), then applies
//!    retention. Workers never wait for storage.
//! 4. *Reply.* The requesters get the committed [`SnapshotId`], or the error; a failed
//!    snapshot changes nothing in the running job, and the previous committed snapshot stays
//!    the latest.
//!
//! Why every chunk appears once: at the marker each chunk is in exactly one ledger state.
//! Folded, held and pending chunks are recorded then and there; work done on a pending chunk
//! after the marker is simply not in the snapshot (restoring redoes it). A running chunk is
//! recorded once, by whichever of capture, output or hand-back reaches the lock first; the
//! others find it no longer in `waiting`.
//!
//! # Suspend
//!
//! A suspend halts the core: running chunks are interrupted and handed back. Once no chunk
//! runs, the whole ledger is pending, done or suspended, and the cut needs no capture. After
//! the commit every worker is released and the job ends with `Outcome::Suspended`. If the write
//! fails, the core is un-halted and the job goes on.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::oneshot;

use super::{Shared, State};
use crate::codec::{decode, encode};
use crate::error::{Error, Result};
use crate::job::Job;
use crate::run::{CAPTURE, SuspendToken};
use crate::schedule::{ChunkId, Chunking, Schedule};
use crate::snapshot::{FORMAT_VERSION, Manifest, PartRef, SnapshotId, Store};

/// What a running chunk left for a cut in progress.
#[derive(Debug)]
pub(crate) enum Captured {
    /// Its state at an adjustment point.
    State(bytes::Bytes),
    /// Its state at an adjustment point, already in the store (written by the remote worker
    /// that runs the chunk).
    Stored(PartRef),
    /// Its output: it ended before its capture.
    Output(bytes::Bytes),
    /// Nothing: it went back to the pile from scratch (its remote worker was lost before
    /// it reported a state).
    Scratch,
}

/// Who waits for a snapshot's id.
pub(crate) type Reply = oneshot::Sender<Result<SnapshotId>>;

/// A part of a cut: already in the store, or bytes to write.
enum Part {
    Reuse(PartRef),
    New { chunk: ChunkId, bytes: bytes::Bytes },
}

/// The snapshot of one epoch while it is being put together (protocol steps 1–2).
pub(crate) struct Cut {
    started: Instant,
    manifest: Manifest,
    parts: Vec<Part>,
    /// Chunks running at the marker whose state or output has not arrived yet.
    waiting: HashSet<ChunkId>,
    /// Pending suspended chunks at the marker: their parts may be reused later.
    reusable: Vec<ChunkId>,
    suspend: bool,
    replies: Vec<Reply>,
}

/// Snapshot bookkeeping of one job run.
#[derive(Default)]
pub(crate) struct Snapshots {
    pub(crate) cut: Option<Cut>,
    /// Parts of pending chunks whose state has not changed since a committed snapshot.
    cache: HashMap<ChunkId, PartRef>,
    /// Chunks handed to a worker since the current cut's marker.
    ran_since_marker: HashSet<ChunkId>,
    /// The highest epoch this run committed or restored.
    pub(crate) last_epoch: Option<u64>,
    /// The latest snapshot committed in the configured store that this run knows of (epoch,
    /// manifest creation time): worker processes prove they reach the store by reading it.
    pub(crate) witness: Option<(u64, u64)>,
    /// The longest snapshot so far, for the deadline's margin.
    pub(crate) longest: Option<Duration>,
    /// A suspend was asked for; it starts once no chunk runs.
    pub(crate) suspend_replies: Option<Vec<Reply>>,
    /// A write is in flight: the next cut waits for it, so epochs commit in order.
    writing: bool,
    /// Requests that came while a write was in flight.
    queued: Vec<Reply>,
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
    pub(crate) deadline: Option<SystemTime>,
    pub(crate) signals: bool,
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
            deadline: None,
            signals: false,
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
    /// The highest committed epoch.
    Latest,
    /// This epoch.
    Epoch(u64),
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
            cache: manifest
                .parts
                .iter()
                .map(|p| (p.chunk, p.clone()))
                .collect(),
            last_epoch: Some(manifest.epoch),
            witness: Some((manifest.epoch, manifest.created_unix_ms)),
            ..Snapshots::default()
        }
    }

    /// The epoch folder the next snapshot's parts go to (the writer takes the next epoch
    /// after the store's latest; it is this one unless another writer committed meanwhile).
    pub(crate) fn next_folder(&self) -> u64 {
        self.last_epoch.map_or(0, |e| e + 1)
    }

    /// The job ended: a cut still waiting for captures, a suspend not yet started and queued
    /// requests are answered with [`Error::Ended`]. A write in flight still completes.
    pub(crate) fn end(&mut self, job: &'static str) {
        let cut = self.cut.take().map(|c| c.replies).unwrap_or_default();
        let suspend = self.suspend_replies.take().unwrap_or_default();
        for r in cut.into_iter().chain(suspend).chain(self.queued.drain(..)) {
            let _ = r.send(Err(Error::Ended { job }));
        }
    }

    /// A chunk is handed to a worker: its state will change.
    pub(crate) fn on_run(&mut self, chunk: ChunkId) {
        if !self.cache.is_empty() {
            self.cache.remove(&chunk);
        }
        if self.cut.is_some() {
            self.ran_since_marker.insert(chunk);
        }
    }
}

impl<J: Job> State<J> {
    /// Asks for a snapshot; `reply` gets its id. Joins a cut in progress.
    pub(crate) fn request_snapshot(&mut self, shared: &Arc<Shared<J>>, reply: Reply) {
        if self.ended {
            let _ = reply.send(Err(Error::Ended { job: J::NAME }));
            return;
        }
        if let Some(cut) = &mut self.snap.cut {
            cut.replies.push(reply);
            return;
        }
        if self.snap.writing {
            self.snap.queued.push(reply);
            return;
        }
        self.start_cut(shared, vec![reply], false);
    }

    /// Asks for a suspend: halt, snapshot once quiet, end with `Outcome::Suspended`.
    pub(crate) fn request_suspend(&mut self, shared: &Arc<Shared<J>>, reply: Option<Reply>) {
        if self.ended {
            if let Some(r) = reply {
                let _ = r.send(Err(Error::Ended { job: J::NAME }));
            }
            return;
        }
        let replies = self.snap.suspend_replies.get_or_insert_with(Vec::new);
        replies.extend(reply);
        let mut out = std::mem::take(&mut self.out);
        self.core.halt(&mut out);
        let mine = self.execute(&mut out, None);
        debug_assert!(mine.is_none());
        self.out = out;
        self.maybe_suspend(shared);
    }

    /// Starts the suspend's cut once no chunk runs and no write is in flight.
    pub(crate) fn maybe_suspend(&mut self, shared: &Arc<Shared<J>>) {
        if self.ended
            || self.snap.suspend_replies.is_none()
            || self.snap.cut.is_some()
            || self.snap.writing
        {
            return;
        }
        if self.core.running().next().is_some() {
            return;
        }
        let replies = self.snap.suspend_replies.take().unwrap_or_default();
        self.start_cut(shared, replies, true);
    }

    /// Protocol step 1: the marker.
    fn start_cut(&mut self, shared: &Arc<Shared<J>>, replies: Vec<Reply>, suspend: bool) {
        match self.cut(shared, suspend) {
            Ok(mut cut) => {
                cut.replies = replies;
                self.snap.ran_since_marker.clear();
                self.snap.cut = Some(cut);
                self.try_finish_cut(shared);
            }
            Err(e) => {
                let msg = e.to_string();
                for r in replies {
                    let _ = r.send(Err(Error::SnapshotFailed(msg.clone())));
                }
                if suspend {
                    self.unhalt();
                }
            }
        }
    }

    fn cut(&mut self, shared: &Arc<Shared<J>>, suspend: bool) -> Result<Cut> {
        let cfg = &shared.config.snapshots;
        let job = self.job.as_ref().ok_or(Error::Ended { job: J::NAME })?;
        let (merged, value, held) = self.core.merge_state();
        let done = held
            .map(|(c, v)| Ok((c, encode("a chunk output", v)?)))
            .collect::<Result<Vec<_>>>()?;
        let reduced = encode("the reduced value", value)?;
        let mut parts = Vec::new();
        let mut reusable = Vec::new();
        for (c, state) in self.core.suspended() {
            reusable.push(c);
            parts.push(match self.snap.cache.get(&c) {
                Some(p) => Part::Reuse(p.clone()),
                None => Part::New {
                    chunk: c,
                    bytes: state.to_bytes()?,
                },
            });
        }
        let mut waiting = HashSet::new();
        let running: Vec<_> = self.core.running().collect();
        for (w, c) in running {
            waiting.insert(c);
            if let Some(local) = self.locals.get(&w) {
                local.cell.raise(CAPTURE);
            } else {
                self.signal_remote(w, true);
            }
        }
        let (done_iters, total) = self.core.progress();
        let config = RunConfig {
            schedule: shared.config.schedule,
            chunking: shared.config.chunking,
        };
        let manifest = Manifest {
            format_version: FORMAT_VERSION,
            job_name: J::NAME.to_owned(),
            job_id: cfg.job_id::<J>(),
            epoch: 0, // chosen by the writer
            created_unix_ms: SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            job: encode("the job", &**job)?,
            phase: self.phase,
            iterations_before: self.iterations_before,
            iterations_done: done_iters,
            iterations_total: total,
            chunks: self.core.plan().len(),
            config: encode("the run configuration", &config)?,
            merged,
            reduced,
            done,
            parts: Vec::new(),
        };
        Ok(Cut {
            started: Instant::now(),
            manifest,
            parts,
            waiting,
            reusable,
            suspend,
            replies: Vec::new(),
        })
    }

    /// Protocol step 2: what a running chunk left for the cut: its state at an adjustment
    /// point (as bytes, or as a part a remote worker stored), or its output when it ended
    /// before its capture (the output wins). Only the first of these per chunk counts; an
    /// error (a state that did not serialize) abandons the cut.
    pub(crate) fn captured(
        &mut self,
        shared: &Arc<Shared<J>>,
        chunk: ChunkId,
        what: Result<Captured>,
    ) {
        let Some(cut) = &mut self.snap.cut else {
            return;
        };
        if !cut.waiting.remove(&chunk) {
            return;
        }
        match what {
            Ok(Captured::State(bytes)) => cut.parts.push(Part::New { chunk, bytes }),
            Ok(Captured::Stored(part)) => cut.parts.push(Part::Reuse(part)),
            Ok(Captured::Output(bytes)) => cut.manifest.done.push((chunk, bytes.into())),
            Ok(Captured::Scratch) => {}
            Err(e) => return self.abort_cut(e),
        }
        self.try_finish_cut(shared);
    }

    /// Whether `chunk` is awaited by the cut in progress.
    pub(crate) fn cut_waits_for(&self, chunk: ChunkId) -> bool {
        self.snap
            .cut
            .as_ref()
            .is_some_and(|c| c.waiting.contains(&chunk))
    }

    fn abort_cut(&mut self, e: Error) {
        if let Some(cut) = self.snap.cut.take() {
            let msg = e.to_string();
            for r in cut.replies {
                let _ = r.send(Err(Error::SnapshotFailed(msg.clone())));
            }
            for local in self.locals.values() {
                local.cell.lower(CAPTURE);
            }
            if cut.suspend {
                self.unhalt();
            }
        }
    }

    fn unhalt(&mut self) {
        let mut out = std::mem::take(&mut self.out);
        self.core.unhalt(&mut out);
        let mine = self.execute(&mut out, None);
        debug_assert!(mine.is_none());
        self.out = out;
    }

    /// Protocol step 3: hands a complete cut to the background writer.
    fn try_finish_cut(&mut self, shared: &Arc<Shared<J>>) {
        if !self.snap.cut.as_ref().is_some_and(|c| c.waiting.is_empty()) {
            return;
        }
        let Some(cut) = self.snap.cut.take() else {
            return;
        };
        let cfg = shared.config.snapshots.clone();
        self.snap.writing = true;
        let reusable: Vec<ChunkId> = cut
            .reusable
            .iter()
            .copied()
            .filter(|c| !self.snap.ran_since_marker.contains(c))
            .collect();
        let after = self.snap.last_epoch;
        let shared2 = Arc::clone(shared);
        shared.io.handle().spawn(async move {
            let Cut {
                started,
                mut manifest,
                parts,
                suspend,
                replies,
                ..
            } = cut;
            let written = write(&cfg, after, &mut manifest, parts).await;
            let took = started.elapsed();
            let mut st = shared2.lock();
            st.snap.writing = false;
            match &written {
                Ok(id) => {
                    st.snap.last_epoch = Some(id.epoch);
                    st.snap.witness = Some((id.epoch, manifest.created_unix_ms));
                    st.offer_store(&shared2, None);
                    st.snap.longest = Some(st.snap.longest.map_or(took, |l| l.max(took)));
                    let by_chunk: HashMap<ChunkId, &PartRef> =
                        manifest.parts.iter().map(|p| (p.chunk, p)).collect();
                    for c in reusable {
                        if let Some(p) = by_chunk.get(&c) {
                            st.snap.cache.insert(c, (*p).clone());
                        }
                    }
                }
                Err(_) if suspend => st.unhalt(),
                Err(_) => {}
            }
            for r in replies {
                let _ = r.send(match &written {
                    Ok(id) => Ok(id.clone()),
                    Err(e) => Err(Error::SnapshotFailed(e.to_string())),
                });
            }
            if suspend && !st.ended {
                if let Ok(id) = written {
                    st.complete(Ok(super::Outcome::Suspended(id)));
                }
            }
            let queued = std::mem::take(&mut st.snap.queued);
            if !queued.is_empty() && !st.ended {
                st.start_cut(&shared2, queued, false);
            }
            st.maybe_suspend(&shared2);
        });
    }
}

/// Protocol step 3 on the I/O runtime: parts, then the manifest (the commit), then retention.
async fn write(
    cfg: &SnapshotConfig,
    after: Option<u64>,
    manifest: &mut Manifest,
    parts: Vec<Part>,
) -> Result<SnapshotId> {
    let store = &cfg.store()?;
    let latest = store.latest(&manifest.job_id).await?.map(|id| id.epoch);
    manifest.epoch = latest.max(after).map_or(0, |e| e + 1);
    let (job_id, epoch, phase) = (manifest.job_id.clone(), manifest.epoch, manifest.phase);
    // Parts go up concurrently (each its own task); the manifest waits for all of them.
    let mut refs = Vec::with_capacity(parts.len());
    let mut uploads = tokio::task::JoinSet::new();
    for part in parts {
        match part {
            Part::Reuse(p) => refs.push(p),
            Part::New { chunk, bytes } => {
                let (store, job_id) = (store.clone(), job_id.clone());
                uploads.spawn(
                    async move { store.put_part(&job_id, epoch, phase, chunk, bytes).await },
                );
            }
        }
    }
    while let Some(done) = uploads.join_next().await {
        refs.push(done.map_err(|e| Error::Internal(format!("a part upload task failed: {e}")))??);
    }
    refs.sort_by_key(|p| p.chunk);
    manifest.parts = refs;
    manifest.done.sort_by_key(|d| d.0);
    let id = store.commit(manifest).await?;
    // Retention is housekeeping: the snapshot is committed whether or not it succeeds.
    let _ = store.retain(&job_id, cfg.keep.max(1)).await;
    Ok(id)
}

/// Starts the job's snapshot and suspend triggers (period, deadline, signals, token) on the
/// I/O runtime. The task holds the job weakly and ends with it.
pub(crate) fn spawn_triggers<J: Job>(shared: &Arc<Shared<J>>) {
    let cfg = &shared.config.snapshots;
    if cfg.every.is_none() && cfg.deadline.is_none() && !cfg.signals && cfg.token.is_none() {
        return;
    }
    let weak: Weak<Shared<J>> = Arc::downgrade(shared);
    let (every, deadline, signals, token) =
        (cfg.every, cfg.deadline, cfg.signals, cfg.token.clone());
    let io = shared.io.handle().clone();
    // Signal streams must be created inside the runtime.
    let _enter = io.enter();
    let mut sigterm = signals
        .then(|| tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok())
        .flatten();
    let mut sigusr1 = signals
        .then(|| tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1()).ok())
        .flatten();
    let submitted = SystemTime::now();
    io.spawn(async move {
        let start = tokio::time::Instant::now();
        let mut tick = every.map(|d| tokio::time::interval_at(start + d, d));
        // Once a suspend is wanted (deadline, signal, token), it is asked for again every
        // second until the job has ended: a suspend whose snapshot failed is retried.
        let mut want_suspend = false;
        let mut last_ask: Option<std::time::Instant> = None;
        loop {
            let longest = match weak.upgrade() {
                Some(shared) => {
                    let st = shared.lock();
                    if st.ended {
                        return;
                    }
                    st.snap.longest
                }
                None => return,
            };
            if want_suspend {
                if last_ask.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                    let Some(shared) = weak.upgrade() else { return };
                    shared.lock().request_suspend(&shared, None);
                    last_ask = Some(std::time::Instant::now());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            // Before any snapshot was timed: ten seconds, but at most half the time the job
            // was given, so a short deadline still leaves it time to work.
            let margin = longest.map_or_else(
                || {
                    let given = deadline.and_then(|d| d.duration_since(submitted).ok()).unwrap_or_default();
                    Duration::from_secs(10).min(given / 2)
                },
                |l| 2 * l + Duration::from_secs(1),
            );
            let until_deadline = deadline.map(|d| d.duration_since(SystemTime::now() + margin).unwrap_or(Duration::ZERO));
            let suspend = tokio::select! {
                _ = async { tick.as_mut().expect("guarded").tick().await }, if tick.is_some() => false,
                _ = tokio::time::sleep(until_deadline.unwrap_or(Duration::MAX)), if until_deadline.is_some() => true,
                _ = async { sigterm.as_mut().expect("guarded").recv().await }, if sigterm.is_some() => true,
                _ = async { sigusr1.as_mut().expect("guarded").recv().await }, if sigusr1.is_some() => true,
                _ = async { token.as_ref().expect("guarded").fired().await }, if token.is_some() => true,
                // Look again at the deadline's margin and whether the job ended.
                _ = tokio::time::sleep(Duration::from_millis(200)) => continue,
            };
            if suspend {
                want_suspend = true;
                continue;
            }
            let Some(shared) = weak.upgrade() else { return };
            let (reply, _ignored) = oneshot::channel();
            shared.lock().request_snapshot(&shared, reply);
        }
    });
}

/// Runs `fut` on the I/O runtime and blocks the calling thread until it is done (without
/// entering a runtime, so this works from any thread).
fn block_on_io<T: Send + 'static>(
    io: &tokio::runtime::Handle,
    fut: impl std::future::Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    io.spawn(async move {
        let _ = tx.send(fut.await);
    });
    rx.recv()
        .map_err(|_| Error::Internal("the I/O runtime stopped".into()))?
}

impl super::Executor {
    /// Resumes a job from a committed snapshot in the store at `url` (under the job id of
    /// this executor's builder, by default [`Job::NAME`]), with this executor's workers: any
    /// number, on any machine. The chunking and schedule are the snapshot's, so the value is
    /// bit-identical to an uninterrupted run. Later snapshots go to this executor's store if
    /// one was configured with [`Builder::snapshots`](crate::Builder::snapshots), else to `url`.
    ///
    /// Blocks while it reads the snapshot.
    ///
    /// # Errors
    ///
    /// [`Error::Snapshot`] for a store that cannot be read, no committed snapshot, a snapshot
    /// of another job or format version, or a corrupt one; [`Error::Codec`] for values that do
    /// not decode as this job's types; [`Error::Panicked`] if the job's code panics. Chunk
    /// states are checked against their checksums here but decoded by the worker that runs
    /// them, so a state of another type ends the job later with [`Error::Codec`].
    pub fn resume<J: Job>(&self, url: &str, at: At) -> Result<super::JobHandle<J>> {
        let store = Store::open_with(url, self.config.snapshots.options.clone())?;
        let job_id = self.config.snapshots.job_id::<J>();
        let reader = store.clone();
        let (manifest, parts) = block_on_io(self.io.handle(), async move {
            let id = match at {
                At::Latest => reader.latest(&job_id).await?.ok_or_else(|| {
                    crate::snapshot::Error::NotFound {
                        what: format!("a committed snapshot of job {job_id}"),
                    }
                })?,
                At::Epoch(e) => SnapshotId::new(job_id, e),
            };
            let m = reader.manifest(&id).await?;
            m.check_job(J::NAME)?;
            let parts =
                futures::future::try_join_all(m.parts.iter().map(|p| reader.get_part(p))).await?;
            Ok((m, parts))
        })?;
        let job: J = decode("the job", &manifest.job)?;
        let run: RunConfig = decode("the run configuration", &manifest.config)?;
        let reduced = decode("the reduced value", &manifest.reduced)?;
        let done = manifest
            .done
            .iter()
            .map(|(c, b)| Ok((*c, decode("a chunk output", b)?)))
            .collect::<Result<Vec<_>>>()?;
        // States stay bytes until the worker that runs them decodes them (see `Held`).
        let suspended = manifest
            .parts
            .iter()
            .zip(parts)
            .map(|(p, b)| (p.chunk, super::Held::Bytes(b)))
            .collect();
        let phase = manifest.phase;
        let core = super::catch(crate::Site::Job { phase }, J::NAME, || {
            let plan = crate::schedule::Plan::new(job.iterations(), run.schedule, run.chunking);
            if plan.len() != manifest.chunks {
                return Err(format!(
                    "the job's phase {phase} has {} chunks, the snapshot {}",
                    plan.len(),
                    manifest.chunks
                ));
            }
            crate::schedule::Core::restore(
                run.schedule,
                plan,
                job.reducer(),
                manifest.merged,
                reduced,
                done,
                suspended,
            )
        })?
        .map_err(|e| Error::Snapshot(crate::snapshot::Error::Inconsistent(e)))?;
        let same_store = self.config.snapshots.url.is_none()
            || self.config.snapshots.url.as_deref() == Some(url);
        let snap = if same_store {
            Snapshots::restored(&manifest)
        } else {
            Snapshots {
                last_epoch: Some(manifest.epoch),
                ..Snapshots::default()
            }
        };
        let mut exec = self.clone();
        if self.config.snapshots.url.is_none() {
            exec.config.snapshots.set_store(store);
        }
        exec.launch(
            job,
            core,
            phase,
            manifest.iterations_before,
            snap,
            run.schedule,
            run.chunking,
        )
    }
}
