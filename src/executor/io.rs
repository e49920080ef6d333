//! The executor's I/O with the snapshot store: the background writer of complete cuts
//! (protocol step 3 of `schedule/cut.rs`) and resuming a job from a committed snapshot.

use crate::schedule::idhash::IdMap;
use std::sync::Arc;

use super::job_run::{Shared, State};
use super::lifecycle::Resubmit;
use super::links::StoreOp;
use super::snapshot::{At, Header, Part, Reply, Resumed, RunConfig, SnapshotConfig, Snapshots};
use crate::codec::{decode, encode};
use crate::error::{Cause, Error, Result, Site};
use crate::job::Job;
use crate::layout::Fingerprint;
use crate::schedule::{ChunkId, Plan, Write, Written};
use crate::snapshot::{Dimension, Manifest, PartRef, SnapshotId, Store};

/// What a job run was submitted with, and the job's shape: recorded in every snapshot of the
/// run ([`Manifest::submitted`], [`Manifest::shape`]) by [`State::write`].
#[derive(Debug, Clone, Default)]
pub(crate) struct Origin {
    /// The bytes of the job value the run was submitted with; `None` for a run resumed,
    /// without a job submitted, from a snapshot that did not record them.
    submitted: Option<Arc<Vec<u8>>>,
    /// The job's shape (for a [`Rows`](crate::Rows) grid; empty for other jobs).
    shape: Arc<Vec<Dimension>>,
}

impl Origin {
    /// The origin of a run of `job` (as it is at `phase`) submitted with `submitted`.
    pub(crate) fn new<J: Job>(submitted: Option<Vec<u8>>, job: &J, phase: u64) -> Result<Origin> {
        Ok(Origin {
            submitted: submitted.map(Arc::new),
            shape: Arc::new(shape_of(job, phase)?),
        })
    }
}

/// The shape of `job` as its code gives it (user code: a panic is [`Error::Panicked`]).
fn shape_of<J: Job>(job: &J, phase: u64) -> Result<Vec<Dimension>> {
    match J::OWNERSHIP.hooks.and_then(|h| h.shape) {
        Some(shape) => super::catch(Site::Job { phase }, J::NAME, || shape(job)),
        None => Ok(Vec::new()),
    }
}

/// A short digest of a job value's bytes, for messages: 64-bit FNV-1a (the values
/// themselves are compared byte for byte).
fn digest(bytes: &[u8]) -> Fingerprint {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    Fingerprint(hash)
}

impl<J: Job> State<J> {
    /// Protocol step 3: hands a complete cut to the background writer (`write`).
    pub(crate) fn write(&mut self, cut: Write<Header, Part, bytes::Bytes, Reply>) {
        let after = self.snap.last_epoch;
        let cut = Box::new(cut);
        self.store_ops.push(StoreOp::Write { cut, after });
    }

    /// Protocol step 3's outcome: the cut written as `written` (its manifest as written,
    /// `took` since its marker, `bytes` new bytes), or why not; `lease_lost` if the run
    /// lost its job id's lease meanwhile.
    pub(crate) fn snapshot_written(
        &mut self,
        written: Result<SnapshotId>,
        manifest: &Manifest,
        (took, bytes): (std::time::Duration, u64),
        (suspend, replies): (bool, Vec<Reply>),
        lease_lost: Option<Error>,
    ) {
        self.watch_snapshot(&written, took, bytes, suspend);
        let mut out = std::mem::take(&mut self.snap.out);
        let outcome = if written.is_ok() {
            Written::Committed
        } else {
            Written::Failed
        };
        let unchanged = self.snap.cut.written(outcome, &mut out);
        if let Ok(id) = &written {
            let full = is_full(manifest);
            self.snapshot_committed(full);
            self.snap.last_epoch = Some(id.epoch);
            self.snap.witness = Some((id.epoch, manifest.created_unix_ms));
            self.offer_store(None);
            self.snap.longest = Some(self.snap.longest.map_or(took, |l| l.max(took)));
            let by_chunk: IdMap<ChunkId, &PartRef> =
                manifest.all_parts().map(|p| (p.chunk, p)).collect();
            for c in unchanged {
                if let Some(p) = by_chunk.get(&c) {
                    self.snap.cache.insert(c, (*p).clone());
                }
            }
        }
        let written = written.map_err(Cause::new);
        for r in replies {
            let result = match &written {
                Ok(id) => Ok(id.clone()),
                Err(e) => Err(Error::SnapshotFailed(e.clone())),
            };
            self.answer(r, result);
        }
        if let Err(cause) = &written {
            self.snapshot_failed(cause.clone(), "to be written");
        }
        self.cut_commands(&mut out);
        self.snap.out = out;
        // A run that lost its job id's lease commits nothing more: it ends.
        if let Some(e) = lease_lost {
            self.fail(e);
        }
        if suspend && !self.ended {
            if let Ok(id) = written {
                self.complete(Ok(super::Outcome::Suspended(id)));
            }
        }
        self.poll_cut();
        // A rollback waits for a write in flight to end before it reads the store back.
        self.poll_rollback();
        // The outcome of a job that ended meanwhile waited for this write.
        if self.outcome_ready() {
            self.wake_waiters();
        }
    }
}

/// Protocol step 3 on the store writer: writes `cut` (after epoch `after`), then hands the
/// outcome to the state.
pub(crate) fn write<J: Job>(
    shared: Arc<Shared<J>>,
    cut: Write<Header, Part, bytes::Bytes, Reply>,
    after: Option<u64>,
) {
    let io = shared.io.writer().clone();
    io.spawn(async move {
        let w = write_cut(&shared.config, cut, after).await;
        let took = shared.started.elapsed().saturating_sub(w.started);
        let lease = shared.config.run_lease.as_deref();
        let lease_lost = lease.and_then(|l| Some(super::lease::lost(l, l.lost()?)));
        shared.lock().snapshot_written(
            w.written,
            &w.manifest,
            (took, w.bytes),
            (w.suspend, w.replies),
            lease_lost,
        );
    });
}

/// Step 3 on the I/O runtime: reads the manifest of `epoch` back (`read_back_manifest`),
/// then hands it to the state for `attempt`.
pub(crate) fn read_back<J: Job>(shared: Arc<Shared<J>>, epoch: u64, attempt: u64) {
    let io = shared.io.handle().clone();
    io.spawn(async move {
        let cfg = &shared.config.snapshots;
        let read = super::rollback::read_back_manifest::<J>(cfg, epoch).await;
        // Decoding runs user code (`iterations`, `reducer`): off the I/O thread.
        let restored =
            tokio::task::spawn_blocking(move || read.and_then(super::rollback::restore_read::<J>))
                .await
                .unwrap_or_else(|e| {
                    Err(Error::Internal(format!(
                        "reading a snapshot back stopped: {e}"
                    )))
                });
        shared.lock().rolled_back(restored, attempt);
    });
}

/// Step 6 on the I/O runtime: reads the parts `need` of snapshot `id` that the coordinator
/// reads itself, then hands them to the state for `attempt`.
pub(crate) fn read_parts<J: Job>(
    shared: Arc<Shared<J>>,
    id: SnapshotId,
    need: Vec<PartRef>,
    attempt: u64,
) {
    let io = shared.io.handle().clone();
    io.spawn(async move {
        let got = super::rollback::read_back_parts(&shared.config.snapshots, &id, need).await;
        shared.lock().parts_read(attempt, got);
    });
}

/// A cut as [`write_cut`] wrote it, for `State::snapshot_written`.
pub(crate) struct CutWritten {
    pub(crate) written: Result<SnapshotId>,
    /// Its manifest, as committed (or as far as it got).
    pub(crate) manifest: Manifest,
    /// New bytes written.
    pub(crate) bytes: u64,
    /// When its marker was, since the run started.
    pub(crate) started: std::time::Duration,
    pub(crate) suspend: bool,
    pub(crate) replies: Vec<Reply>,
}

/// Completes the manifest of `cut` (the writer's clock, what the run was submitted with, the
/// outputs) and stores it with its parts (see [`store`]).
pub(crate) async fn write_cut(
    config: &super::Config,
    cut: Write<Header, Part, bytes::Bytes, Reply>,
    after: Option<u64>,
) -> CutWritten {
    let Write {
        header,
        parts,
        done,
        kept,
        suspend,
        replies,
    } = cut;
    let Header {
        mut manifest,
        started,
    } = header;
    manifest.created_unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let origin = &config.origin;
    manifest.submitted = origin.submitted.as_deref().cloned();
    manifest.shape = origin.shape.to_vec();
    manifest
        .done
        .extend(done.into_iter().map(|(c, o)| (c, o.to_vec())));
    let bytes = super::watch::new_bytes(&parts, &kept);
    let lease = config.run_lease.as_deref();
    let written = store(&config.snapshots, lease, after, &mut manifest, parts, kept).await;
    let bytes = bytes + super::watch::manifest_bytes(&written, &manifest);
    CutWritten {
        written,
        manifest,
        bytes,
        started,
        suspend,
        replies,
    }
}

/// Whether a committed snapshot references no part of an earlier one (its parts are all in
/// its own epoch folder, `{job_id}/{epoch:020}/parts/…`).
fn is_full(manifest: &Manifest) -> bool {
    let folder = format!("{:020}", manifest.epoch);
    manifest
        .all_parts()
        .all(|p| p.key.split('/').nth(1) == Some(folder.as_str()))
}

/// Protocol step 3 on the I/O runtime: parts, then retention down to `keep - 1` older
/// snapshots, then the manifest (the commit). Before the retention and again before the
/// commit, a run holding its job id's `lease` checks that it still does (`snapshot/lease.rs`,
/// step 3): one that lost it deletes and commits nothing.
///
/// Retention runs *before* the commit, once every part is durable, so that the store never
/// holds more than `keep` committed snapshots, not even between a commit and its cleanup (a
/// crash between a commit and a cleanup after it would leave `keep + 1`). It deletes only
/// committed snapshots older than the newest one, and that one is kept (with `keep = 1` the
/// cleanup runs after the commit instead, as the newest is never deleted): if the commit then
/// fails, the store holds `keep - 1`, never zero. The folder being written is above every
/// committed epoch, which cleanup never touches, and the parts this snapshot reuses (the newest
/// snapshot's, or those of an older one the run was resumed from) are spared by name.
async fn store(
    cfg: &SnapshotConfig,
    lease: Option<&crate::snapshot::lease::Lease>,
    after: Option<u64>,
    manifest: &mut Manifest,
    parts: Vec<(ChunkId, Part)>,
    kept: Vec<(ChunkId, Part)>,
) -> Result<SnapshotId> {
    let store = &cfg.store()?;
    let latest = store.latest(&manifest.job_id).await?.map(|id| id.epoch);
    manifest.epoch = latest.max(after).map_or(0, |e| e + 1);
    let (job_id, epoch, phase) = (manifest.job_id.clone(), manifest.epoch, manifest.phase);
    // Parts go up concurrently (each its own task); the manifest waits for all of them. A
    // chunk is either pending (a state) or done (a kept partition), so its key is its own.
    let mut refs = (
        Vec::with_capacity(parts.len()),
        Vec::with_capacity(kept.len()),
    );
    let mut uploads = tokio::task::JoinSet::new();
    let roles = parts.into_iter().map(|p| (false, p));
    for (is_kept, (chunk, part)) in roles.chain(kept.into_iter().map(|p| (true, p))) {
        match part {
            Part::Reuse(p) if is_kept => refs.1.push(p),
            Part::Reuse(p) => refs.0.push(p),
            Part::New(bytes) => {
                let (store, job_id) = (store.clone(), job_id.clone());
                uploads.spawn(async move {
                    let put = store.put_part(&job_id, epoch, phase, chunk, bytes).await;
                    (is_kept, put)
                });
            }
        }
    }
    while let Some(done) = uploads.join_next().await {
        let (is_kept, put) =
            done.map_err(|e| Error::Internal(format!("a part upload task failed: {e}")))?;
        if is_kept { &mut refs.1 } else { &mut refs.0 }.push(put?);
    }
    refs.0.sort_by_key(|p| p.chunk);
    refs.1.sort_by_key(|p| p.chunk);
    (manifest.parts, manifest.kept) = refs;
    manifest.done.sort_by_key(|d| d.0);
    // Retention is housekeeping: the snapshot is committed whether or not it succeeds, and
    // a failure is logged (snapshots pile up until one succeeds).
    let keep = cfg.keep.max(1);
    let retain = async |keep: usize, next: &Manifest| {
        if let Err(e) = store.retain_before(&job_id, keep, next).await {
            tracing::warn!(
                job_id = %job_id,
                keep,
                error = &e as &dyn std::error::Error,
                "retention of old snapshots failed"
            );
        }
    };
    let still_held = async || -> Result<()> {
        match lease {
            Some(l) => match l.check().await? {
                None => Ok(()),
                Some(reason) => Err(super::lease::lost(l, reason)),
            },
            None => Ok(()),
        }
    };
    if keep > 1 {
        still_held().await?;
        retain(keep - 1, manifest).await;
    }
    still_held().await?;
    let id = store.commit(manifest).await?;
    if keep == 1 {
        retain(1, manifest).await;
    }
    Ok(id)
}

/// Runs `fut` on the I/O runtime and blocks the calling thread until it is done (without
/// entering a runtime, so this works from any thread).
pub(crate) fn block_on_io<T: Send + 'static>(
    io: &tokio::runtime::Handle,
    fut: impl std::future::Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    crate::snapshot::block_on(io, fut)
        .unwrap_or_else(|| Err(Error::Internal("the I/O runtime stopped".into())))
}

impl super::Executor {
    /// Resumes a job from a committed snapshot in the store at `url` (a store URL or a
    /// folder's path, as [`Builder::snapshots`](crate::Builder::snapshots) takes; under the job id of
    /// this executor's builder, by default [`Job::NAME`]), with this executor's workers: any
    /// number, on any machine. The chunking and schedule are the snapshot's, so the value is
    /// bit-identical to an uninterrupted run. Later snapshots go to this executor's store if
    /// one was configured with [`Builder::snapshots`](crate::Builder::snapshots), else to `url`.
    ///
    /// Blocks while it reads the snapshot. Before that, it takes the job id's lease in the
    /// store later snapshots go to (see [`Builder::job_lease`](crate::Builder::job_lease)).
    ///
    /// With [`At::Latest`], a damaged snapshot (a part missing or corrupt) is passed over for
    /// the newest one that reads back whole; each one passed over is logged (`tracing`,
    /// warning) and named, with why, in [`JobHandle::resumed`](super::JobHandle::resumed).
    ///
    /// # Errors
    ///
    /// [`Error::JobIdHeld`] if another run holds the job id (the snapshot is not read).
    /// [`Error::Snapshot`] with, told apart:
    /// - [`NotFound`](crate::snapshot::Error::NotFound): no committed snapshot (of this job
    ///   id, or at this epoch): a program that resumes or starts afresh starts afresh on
    ///   this one only;
    /// - [`Damaged`](crate::snapshot::Error::Damaged): the snapshot (with [`At::Latest`],
    ///   the newest, when every one is damaged) is committed but an object it needs is
    ///   missing or wrong; the error names the object and the check that failed;
    /// - [`Store`](crate::snapshot::Error::Store), [`Denied`](crate::snapshot::Error::Denied):
    ///   the store cannot be reached or refuses (no snapshot is passed over for that);
    /// - [`WrongJob`](crate::snapshot::Error::WrongJob),
    ///   [`UnsupportedVersion`](crate::snapshot::Error::UnsupportedVersion): a snapshot of
    ///   another job or format version;
    /// - [`WrongJobVersion`](crate::snapshot::Error::WrongJobVersion),
    ///   [`LayoutChanged`](crate::snapshot::Error::LayoutChanged): a snapshot written by
    ///   another version of the job's code, or by code whose types have another serialized
    ///   [`Layout`](crate::Layout) (checked before any of the job's bytes are decoded);
    /// - [`Undecodable`](crate::snapshot::Error::Undecodable): the job value, the reduced
    ///   value or a chunk output does not decode as this job's type (the error names the
    ///   snapshot and the value).
    ///
    /// [`Error::ShapeChanged`] if the job's shape in this program is not the snapshot's:
    /// the iterations of the snapshot's phase, its chunks (for owned partitions), a
    /// [`Rows`](crate::Rows) grid's height, bands, rows per band, width or element size, or
    /// a stored partition's rows or width; checked before anything runs.
    ///
    /// [`Error::Panicked`] if the job's code panics. Chunk states are checked against their
    /// checksums here but decoded by the worker that runs them, so a state of another type
    /// (under the same layout) ends the job later with [`Error::Codec`].
    pub fn resume<J: Job>(&self, url: &str, at: At) -> Result<super::JobHandle<J>> {
        self.resume_with(url, at, None, None)
    }

    /// [`Executor::resume`], with the job value the caller submitted (from
    /// [`Executor::submit_or_resume`]), compared with the one the snapshot's run was
    /// submitted with ([`resubmitted`]), holding the job id's lease already, or taking it
    /// first (in the store later snapshots go to) when `lease` is `None`.
    pub(super) fn resume_with<J: Job>(
        &self,
        url: &str,
        at: At,
        submitted: Option<J>,
        lease: Option<super::lease::RunLease>,
    ) -> Result<super::JobHandle<J>> {
        let store = Store::open_with(url, self.config.snapshots.options.clone())?;
        let lease = match lease {
            Some(l) => l,
            None => {
                let writes_to = match &self.config.snapshots.url {
                    Some(_) => self.config.snapshots.store()?,
                    None => store.clone(),
                };
                self.take_lease::<J>(&writes_to)?
            }
        };
        self.leased(Some(lease), |lease| {
            self.resume_from(store, url, at, submitted, lease)
        })
    }

    /// Reads the snapshot `at` of `store` (opened from `url`) and starts a run from it,
    /// holding `lease`.
    fn resume_from<J: Job>(
        &self,
        store: Store,
        url: &str,
        at: At,
        submitted: Option<J>,
        lease: Option<super::lease::RunLease>,
    ) -> Result<super::JobHandle<J>> {
        let job_id = self.config.snapshots.job_id::<J>();
        let reader = store.clone();
        let (manifest, parts, skipped) = block_on_io(self.io.handle(), async move {
            let (manifest, parts, skipped) = match at {
                At::Latest => {
                    let (_, manifest, parts, skipped) = reader.read_latest(&job_id).await?;
                    (manifest, parts, skipped)
                }
                At::Epoch(e) => {
                    let (manifest, parts) = reader.read(&SnapshotId::new(job_id, e)).await?;
                    (manifest, parts, Vec::new())
                }
            };
            manifest.check_job(J::NAME)?;
            manifest.check_job_version(J::VERSION)?;
            manifest.check_layout(crate::Layout::of::<J>())?;
            Ok((manifest, parts, skipped))
        })?;
        let from = SnapshotId::new(manifest.job_id.clone(), manifest.epoch);
        for s in &skipped {
            tracing::warn!(
                job = J::NAME,
                skipped = %s.id,
                resumed = %from,
                error = &*s.error as &dyn std::error::Error,
                "a damaged snapshot was passed over"
            );
        }
        let (job, submitted) = resubmitted::<J>(&manifest, submitted, self.config.resubmit)?;
        let Restored {
            job,
            core,
            run,
            manifest,
        } = restore_job::<J>(job, manifest, parts)?;
        let phase = manifest.phase;
        let origin = Origin::new(submitted, &job, phase)?;
        let same_store = self.config.snapshots.url.is_none()
            || self.config.snapshots.url.as_deref() == Some(url);
        let mut snap = if same_store {
            Snapshots::restored(&manifest)
        } else {
            Snapshots {
                last_epoch: Some(manifest.epoch),
                from_snapshot: super::from_snapshot::FromSnapshot::of(&manifest),
                ..Snapshots::default()
            }
        };
        snap.resumed = Some(Resumed { from, skipped });
        let mut exec = self.clone();
        if self.config.snapshots.url.is_none() {
            exec.config.snapshots.set_store(store);
        }
        let handle = exec.launch(
            job,
            core,
            phase,
            manifest.iterations_before,
            snap,
            (run.schedule, run.chunking),
            origin,
            lease,
        )?;
        Ok(handle)
    }
}

/// The job value a resume of `manifest`'s snapshot runs, and the bytes of the value the run
/// counts as submitted with from now on, given the job value the caller `submitted` (`None`
/// for [`Executor::resume`](super::Executor::resume): the snapshot's as they are).
///
/// The submitted value is compared with the one the snapshot's run was submitted with, as
/// bytes. The same: nothing to do. Another: [`Resubmit::UseStored`] keeps the snapshot's
/// job and origin (logged at info); [`Resubmit::AskJob`] asks the stored job
/// ([`Job::resumed_with`]), which takes the change (the run's origin is then the submitted
/// value) or refuses it ([`Error::ResumedJobDiffers`]). A snapshot that did not record the
/// value (format 5 or older) is not checked (logged at info), and the run counts as
/// submitted with `submitted` from now on.
fn resubmitted<J: Job>(
    manifest: &Manifest,
    submitted: Option<J>,
    policy: Resubmit,
) -> Result<(J, Option<Vec<u8>>)> {
    let id = SnapshotId::new(manifest.job_id.clone(), manifest.epoch);
    let undecodable = |e: crate::codec::Error| {
        Error::Snapshot(crate::snapshot::Error::Undecodable {
            snapshot: id.clone(),
            what: e.what,
            source: e.source,
        })
    };
    let mut job: J = decode("the job", &manifest.job).map_err(undecodable)?;
    let Some(submitted) = submitted else {
        return Ok((job, manifest.submitted.clone()));
    };
    let bytes = encode("the job", &submitted)?;
    let Some(started) = &manifest.submitted else {
        tracing::info!(
            job = J::NAME,
            snapshot = %id,
            "snapshot {id} was written before snapshots recorded the job value their run was \
             submitted with: the job submitted is not compared with it (the run counts as \
             submitted with it from now on)"
        );
        return Ok((job, Some(bytes)));
    };
    if *started == bytes {
        return Ok((job, Some(bytes)));
    }
    let (new, old) = (digest(&bytes), digest(started));
    match policy {
        Resubmit::UseStored => {
            tracing::info!(
                job = J::NAME,
                snapshot = %id,
                submitted = %new,
                started_with = %old,
                "the job submitted (digest {new}) is not the one the run of snapshot {id} was \
                 submitted with (digest {old}): resuming the job as stored \
                 (Resubmit::UseStored), the job submitted is ignored"
            );
            Ok((job, Some(started.clone())))
        }
        Resubmit::AskJob => {
            let started_with: J =
                decode("the job the run was submitted with", started).map_err(undecodable)?;
            let field = crate::layout::first_differing_field(&started_with, &submitted);
            let phase = manifest.phase;
            let answer = super::catch(Site::Job { phase }, J::NAME, || {
                job.resumed_with(submitted, &started_with)
            })?;
            match answer {
                Ok(()) => {
                    tracing::info!(
                        job = J::NAME,
                        snapshot = %id,
                        submitted = %new,
                        started_with = %old,
                        "the job took the change of the job submitted (digest {new}, the run of \
                         snapshot {id} was submitted with digest {old}; Job::resumed_with)"
                    );
                    Ok((job, Some(bytes)))
                }
                Err(refusal) => Err(Error::ResumedJobDiffers {
                    job: J::NAME,
                    snapshot: id,
                    submitted: new,
                    started_with: old,
                    field,
                    refusal,
                }),
            }
        }
    }
}

/// Reads the manifest of committed snapshot `id` of job `J`, not its parts (a rollback reads
/// the parts it needs itself, `rollback.rs`).
pub(crate) async fn read_manifest<J: Job>(store: &Store, id: &SnapshotId) -> Result<Manifest> {
    let m = store.read_manifest(id).await?;
    m.check_job(J::NAME)?;
    m.check_job_version(J::VERSION)?;
    m.check_layout(crate::Layout::of::<J>())?;
    Ok(m)
}

/// A job run restored from a snapshot: the job value, its ledger, how it was cut.
pub(crate) struct Restored<J: Job> {
    pub(crate) job: J,
    pub(crate) core: super::JobCore<J>,
    pub(crate) run: RunConfig,
    pub(crate) manifest: Manifest,
}

/// Decodes a snapshot read by [`read_snapshot`] into a job run's starting point. Chunk states
/// stay bytes until the worker that runs them decodes them (see `Held`). Parts given as
/// empty bytes (a rollback reads them later) are not checked.
pub(crate) fn restore<J: Job>(manifest: Manifest, parts: Vec<bytes::Bytes>) -> Result<Restored<J>> {
    let (job, _) = resubmitted::<J>(&manifest, None, Resubmit::AskJob)?;
    restore_job(job, manifest, parts)
}

/// [`restore`] with the job value to run (the snapshot's, or the snapshot's as
/// [`Job::resumed_with`] changed it): checks its shape against the snapshot's
/// ([`check_shape`]), then decodes the rest.
fn restore_job<J: Job>(
    job: J,
    manifest: Manifest,
    parts: Vec<bytes::Bytes>,
) -> Result<Restored<J>> {
    // A value that does not decode names the snapshot and what it was.
    let id = SnapshotId::new(manifest.job_id.clone(), manifest.epoch);
    let undecodable = |e: crate::codec::Error| {
        Error::Snapshot(crate::snapshot::Error::Undecodable {
            snapshot: id.clone(),
            what: e.what,
            source: e.source,
        })
    };
    let run: RunConfig = decode("the run configuration", &manifest.config).map_err(undecodable)?;
    let reduced = decode("the reduced value", &manifest.reduced).map_err(undecodable)?;
    let done = manifest
        .done
        .iter()
        .map(|(c, b)| Ok((*c, decode("a chunk output", b).map_err(undecodable)?)))
        .collect::<Result<Vec<_>>>()?;
    check_shape(&job, &manifest, &run, &parts)?;
    let mut states: Vec<(ChunkId, super::Held<J::Chunk>)> = manifest
        .all_parts()
        .zip(parts)
        .map(|(p, b)| (p.chunk, super::Held::Bytes(b)))
        .collect();
    let kept = states.split_off(manifest.parts.len());
    let suspended = states;
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
            kept,
        )
        .map(|core| {
            if J::OWNERSHIP.is_partitioned() {
                core.with_partitions(phase)
            } else {
                core
            }
        })
    })?
    .map_err(|e| Error::Snapshot(crate::snapshot::Error::Inconsistent(e)))?;
    Ok(Restored {
        job,
        core,
        run,
        manifest,
    })
}

/// Checks, before anything runs, that the job's shape in this program's code (for the job
/// value `job` will run) is the one the snapshot was written with, most telling first:
///
/// 1. the shape the job records ([`Manifest::shape`]: a [`Rows`](crate::Rows) grid's
///    height, bands, rows per band, width and element size), dimension by dimension (a
///    snapshot of a format before 6 has none: logged at info);
/// 2. the iterations of the snapshot's phase ([`Job::iterations`]);
/// 3. for owned partitions, the chunks the job's own chunking cuts the phase into (the
///    partitions are those chunks, for the whole job);
/// 4. every stored partition that is given (not empty) against its chunk's range and the
///    job, for a job whose partitions can tell (a grid's bands: their rows and width).
///
/// # Errors
///
/// [`Error::ShapeChanged`] at the first difference, naming the code's value and the
/// snapshot's; [`Error::Panicked`] if the job's code panics.
fn check_shape<J: Job>(
    job: &J,
    manifest: &Manifest,
    run: &RunConfig,
    parts: &[bytes::Bytes],
) -> Result<()> {
    let id = SnapshotId::new(manifest.job_id.clone(), manifest.epoch);
    let phase = manifest.phase;
    let changed = |what: String, written: u64, code: u64| {
        Err(Error::ShapeChanged {
            job: J::NAME,
            snapshot: id.clone(),
            what,
            written,
            code,
        })
    };

    let shape = shape_of(job, phase)?;
    if manifest.shape.is_empty() && !shape.is_empty() {
        tracing::info!(
            job = J::NAME,
            snapshot = %id,
            "snapshot {id} was written before snapshots recorded the job's shape: only its \
             iterations, chunks and stored partitions are checked"
        );
    }
    for code in &shape {
        let written = manifest.shape.iter().find(|d| d.what == code.what);
        if let Some(written) = written.filter(|w| w.value != code.value) {
            return changed(code.what.clone(), written.value, code.value);
        }
    }

    let iterations = super::catch(Site::Job { phase }, J::NAME, || job.iterations())?;
    if iterations != manifest.iterations_total {
        return changed(
            format!("the iterations of phase {phase}"),
            manifest.iterations_total,
            iterations,
        );
    }

    let hooks = J::OWNERSHIP.hooks;
    if hooks.is_none() {
        return Ok(());
    }
    let chunking = super::catch(Site::Job { phase }, J::NAME, || job.chunking())?;
    let written = Plan::new(manifest.iterations_total, run.schedule, run.chunking);
    let code = Plan::new(iterations, run.schedule, chunking.unwrap_or(run.chunking));
    if written.len() != code.len() {
        return changed(
            "the owned partitions (chunks)".to_owned(),
            written.len(),
            code.len(),
        );
    }
    for c in 0..code.len() {
        let (w, p) = (written.range(c), code.range(c));
        if w != p {
            return changed(
                format!("the iterations of chunk {c} (from {})", w.start),
                w.end - w.start,
                p.end - p.start,
            );
        }
    }

    let Some(fits) = hooks.and_then(|h| h.fits) else {
        return Ok(());
    };
    for (part, bytes) in manifest.all_parts().zip(parts) {
        if bytes.is_empty() || part.chunk >= code.len() {
            continue;
        }
        let range = code.range(part.chunk);
        let fit = super::catch(Site::Job { phase }, J::NAME, || {
            fits(job, part.chunk, range, bytes)
        })?;
        if let Err(m) = fit {
            return changed(m.what, m.written, m.code);
        }
    }
    Ok(())
}
