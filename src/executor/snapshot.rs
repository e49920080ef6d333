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
//!    A worker process sends the state, or writes the part itself and sends its reference.
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

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::oneshot;

use super::job_run::{Shared, State};
use super::members::Member;
use crate::codec::{decode, encode};
use crate::error::{Cause, Error, Result};
use crate::job::Job;
use crate::run::Held;
use crate::run::{CAPTURE, SuspendToken};
use crate::schedule::{
    ChunkId, Chunking, Core, Cut, CutCommand, Schedule, WorkerId, Write, Written,
};
use crate::snapshot::{FORMAT_VERSION, Manifest, PartRef, SnapshotId, Store};

/// What a running chunk left for a cut, as the executor hands it to [`Cut::captured`].
pub(crate) type Captured = crate::schedule::Captured<Part, bytes::Bytes>;

/// Who waits for a snapshot's id.
pub(crate) type Reply = oneshot::Sender<Result<SnapshotId>>;

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
    manifest: Manifest,
    started: Instant,
}

type Commands = Vec<CutCommand<Header, Part, bytes::Bytes, Reply, Error>>;

/// Snapshot bookkeeping of one job run: the pure cut (`schedule/cut.rs`), and what only the
/// executor knows (parts in the store, epochs, timings).
#[derive(Default)]
pub(crate) struct Snapshots {
    pub(crate) cut: Cut<Header, Part, bytes::Bytes, Reply>,
    /// Parts of pending chunks whose state has not changed since a committed snapshot.
    cache: HashMap<ChunkId, PartRef>,
    /// The highest epoch this run committed or restored.
    pub(crate) last_epoch: Option<u64>,
    /// The latest snapshot committed in the configured store that this run knows of (epoch,
    /// manifest creation time): worker processes prove they reach the store by reading it.
    pub(crate) witness: Option<(u64, u64)>,
    /// The longest snapshot so far, for the deadline's margin.
    pub(crate) longest: Option<Duration>,
    /// The cut's command buffer, reused.
    out: Commands,
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

    /// The job ended: every requester still waiting (an open cut's, a suspend's, queued) is
    /// answered with [`Error::Ended`]. A write in flight still completes.
    pub(crate) fn end(&mut self, job: &'static str) {
        for r in self.cut.end() {
            let _ = r.send(Err(Error::Ended { job }));
        }
    }

    /// A chunk is handed to a worker: its state will change.
    pub(crate) fn on_run(&mut self, chunk: ChunkId) {
        if !self.cache.is_empty() {
            self.cache.remove(&chunk);
        }
        self.cut.ran(chunk);
    }
}

impl<J: Job> State<J> {
    /// Asks for a snapshot; `reply` gets its id. Joins a cut in progress, or the next one.
    pub(crate) fn request_snapshot(&mut self, shared: &Arc<Shared<J>>, reply: Reply) {
        if self.ended {
            let _ = reply.send(Err(Error::Ended { job: J::NAME }));
            return;
        }
        self.snap.cut.request(reply);
        self.poll_cut(shared);
    }

    /// Asks for a suspend: halt, snapshot once quiet, end with `Outcome::Suspended`.
    pub(crate) fn request_suspend(&mut self, shared: &Arc<Shared<J>>, reply: Option<Reply>) {
        if self.ended {
            if let Some(r) = reply {
                let _ = r.send(Err(Error::Ended { job: J::NAME }));
            }
            return;
        }
        let mut out = std::mem::take(&mut self.snap.out);
        self.snap.cut.suspend(reply, &mut out);
        self.cut_commands(shared, &mut out);
        self.snap.out = out;
        self.poll_cut(shared);
    }

    /// Starts a cut if one is due (protocol step 1 of `schedule/cut.rs`): queued requests,
    /// or a suspend once no chunk runs. Called after every change (`settle`).
    pub(crate) fn poll_cut(&mut self, shared: &Arc<Shared<J>>) {
        if self.ended || self.snap.cut.is_open() || self.snap.cut.is_writing() {
            return;
        }
        let mut out = std::mem::take(&mut self.snap.out);
        let (cfg, schedule, chunking) = (
            &shared.config.snapshots,
            shared.config.schedule,
            shared.config.chunking,
        );
        let State {
            snap,
            core,
            job,
            phase,
            iterations_before,
            ..
        } = self;
        let (cut, cache) = (&mut snap.cut, &snap.cache);
        let header = |core: &Core<J::Reducer, Held<J::Chunk>>| {
            let run = RunConfig { schedule, chunking };
            header::<J>(cfg, run, job.as_deref(), *phase, *iterations_before, core)
        };
        let part_of = |c: ChunkId, state: &Held<J::Chunk>| match cache.get(&c) {
            Some(p) => Ok(Part::Reuse(p.clone())),
            None => Ok(Part::New(state.to_bytes()?)),
        };
        cut.poll(core, header, part_of, &mut out);
        self.cut_commands(shared, &mut out);
        self.snap.out = out;
    }

    /// Protocol step 2: what `worker` left of `chunk` for the cut (ignored unless the cut
    /// waits for it from that worker); an error abandons the cut.
    pub(crate) fn captured(
        &mut self,
        shared: &Arc<Shared<J>>,
        worker: WorkerId,
        chunk: ChunkId,
        what: Result<Captured>,
    ) {
        let mut out = std::mem::take(&mut self.snap.out);
        self.snap.cut.captured(worker, chunk, what, &mut out);
        self.cut_commands(shared, &mut out);
        self.snap.out = out;
    }

    /// Carries out the cut's commands.
    fn cut_commands(&mut self, shared: &Arc<Shared<J>>, out: &mut Commands) {
        for cmd in out.drain(..) {
            match cmd {
                CutCommand::Capture { worker, chunk } => match self.members.get(worker) {
                    Some(Member::Local(local)) => local.cell.raise(CAPTURE),
                    Some(Member::Remote(slot)) => self.capture_remote(*slot, chunk),
                    None => {}
                },
                CutCommand::Withdraw { worker } => {
                    if let Some(local) = self.members.local(worker) {
                        local.cell.lower(CAPTURE);
                    }
                }
                CutCommand::Halt => self.drive_core(Core::halt),
                CutCommand::Unhalt => self.drive_core(Core::unhalt),
                CutCommand::Fail { replies, error } => {
                    tracing::warn!(job = J::NAME, %error, "a snapshot failed before its write");
                    let cause = Cause::new(error);
                    for r in replies {
                        let _ = r.send(Err(Error::SnapshotFailed(cause.clone())));
                    }
                }
                CutCommand::Write(write) => self.write(shared, write),
            }
        }
    }

    /// Runs `f` on the core (halt, unhalt) and carries out its commands; none is for the
    /// caller.
    fn drive_core(
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

    /// Protocol step 3: hands a complete cut to the background writer.
    fn write(&mut self, shared: &Arc<Shared<J>>, cut: Write<Header, Part, bytes::Bytes, Reply>) {
        let after = self.snap.last_epoch;
        let shared2 = Arc::clone(shared);
        shared.io.writer().spawn(async move {
            let Write {
                header,
                parts,
                done,
                suspend,
                replies,
            } = cut;
            let Header {
                mut manifest,
                started,
            } = header;
            manifest
                .done
                .extend(done.into_iter().map(|(c, o)| (c, o.to_vec())));
            let written = store(&shared2.config.snapshots, after, &mut manifest, parts).await;
            let took = started.elapsed();
            let mut st = shared2.lock();
            let mut out = std::mem::take(&mut st.snap.out);
            let outcome = if written.is_ok() {
                Written::Committed
            } else {
                Written::Failed
            };
            let unchanged = st.snap.cut.written(outcome, suspend, &mut out);
            match &written {
                Ok(id) => {
                    st.snap.last_epoch = Some(id.epoch);
                    st.snap.witness = Some((id.epoch, manifest.created_unix_ms));
                    st.offer_store(&shared2, None);
                    st.snap.longest = Some(st.snap.longest.map_or(took, |l| l.max(took)));
                    let by_chunk: HashMap<ChunkId, &PartRef> =
                        manifest.parts.iter().map(|p| (p.chunk, p)).collect();
                    for c in unchanged {
                        if let Some(p) = by_chunk.get(&c) {
                            st.snap.cache.insert(c, (*p).clone());
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(job = J::NAME, error = %e, "a snapshot could not be written")
                }
            }
            let written = written.map_err(Cause::new);
            for r in replies {
                let _ = r.send(match &written {
                    Ok(id) => Ok(id.clone()),
                    Err(e) => Err(Error::SnapshotFailed(e.clone())),
                });
            }
            st.cut_commands(&shared2, &mut out);
            st.snap.out = out;
            if suspend && !st.ended {
                if let Ok(id) = written {
                    st.complete(Ok(super::Outcome::Suspended(id)));
                }
            }
            st.poll_cut(&shared2);
        });
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
        epoch: 0, // chosen by the writer
        created_unix_ms: SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
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
    };
    Ok(Header {
        manifest,
        started: Instant::now(),
    })
}

/// Protocol step 3 on the I/O runtime: parts, then the manifest (the commit), then retention.
async fn store(
    cfg: &SnapshotConfig,
    after: Option<u64>,
    manifest: &mut Manifest,
    parts: Vec<(ChunkId, Part)>,
) -> Result<SnapshotId> {
    let store = &cfg.store()?;
    let latest = store.latest(&manifest.job_id).await?.map(|id| id.epoch);
    manifest.epoch = latest.max(after).map_or(0, |e| e + 1);
    let (job_id, epoch, phase) = (manifest.job_id.clone(), manifest.epoch, manifest.phase);
    // Parts go up concurrently (each its own task); the manifest waits for all of them.
    let mut refs = Vec::with_capacity(parts.len());
    let mut uploads = tokio::task::JoinSet::new();
    for (chunk, part) in parts {
        match part {
            Part::Reuse(p) => refs.push(p),
            Part::New(bytes) => {
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
