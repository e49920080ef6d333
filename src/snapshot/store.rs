//! Snapshot stores: the [`object_store`] crate behind a URL.
//!
//! # Keys
//!
//! Under the URL's prefix, everything of a job lives below its job id, one folder per epoch:
//!
//! ```text
//! {prefix}/{job_id}/{epoch:020}/manifest                               the commit record
//! {prefix}/{job_id}/{epoch:020}/parts/{phase}-{chunk}-{random:016x}    one suspended chunk state
//! {prefix}/{job_id}/lease/{seq:020}                                     the job id's lease (see `lease.rs`)
//! ```
//!
//! Epochs are zero-padded to 20 digits so that they sort as numbers in any listing. A
//! [`PartRef::key`] is relative to the prefix, so a store can be moved under another prefix
//! or bucket as a whole.
//!
//! # Commit protocol
//!
//! Writing snapshot `E` of job `J` (DESIGN invariant 4, "never a torn snapshot"):
//!
//! 1. Each suspended chunk state is written with [`Store::put_part`] to a **fresh key** under
//!    `J/E/parts/` (random suffix), so no write ever replaces an object another snapshot may
//!    read. `put_part` returns only once the store has acknowledged the whole object (a
//!    `file://` store fsyncs it), with its size and CRC-32C in the returned [`PartRef`]. An
//!    incremental snapshot may instead reference a part that the newest committed manifest
//!    already references (or the one its run was resumed from); it must not reference any
//!    other old part.
//!    The executor's writer then runs retention for the snapshot it is about to commit
//!    (`keep - 1` kept, and every part its manifest references spared), so the store never
//!    holds more than `keep` committed snapshots.
//! 2. When every part of `E` is acknowledged, the manifest listing them is written with
//!    [`Store::commit`] to `J/E/manifest` with `PutMode::Create`: the store creates it only if
//!    no object exists at that key, atomically.
//! 3. If the create finds the key taken, another writer committed `E` first:
//!    [`Error::EpochTaken`], and the parts of step 1 are garbage for [`Store::gc`].
//! 4. Readers list manifests only: a snapshot exists, for [`Store::epochs`] and
//!    [`Store::latest`], exactly when its manifest does, and a reader checks every part it
//!    reads against the manifest's size and checksum ([`Store::get_part`]).
//! 5. Cleanup ([`Store::retain`], [`Store::gc`], [`Store::remove`]) deletes manifests
//!    **before** the parts they reference, deletes only parts that no kept manifest references,
//!    and touches an epoch folder above the newest committed epoch only when nothing was
//!    written there for [`ABANDONED_AFTER`] ([`Store::gc`]) or when told that no snapshot is
//!    being written ([`Uncommitted::Delete`]); [`Store::retain`] and the executor's retention
//!    never do.
//!
//! Why this is correct:
//!
//! - *No torn snapshot is ever listed.* A manifest is created only after all its parts are
//!   durable (1 → 2), and the create is atomic, so any listed manifest names complete parts.
//!   A crash before step 2 leaves parts without a manifest: not listed, not restorable, and
//!   the previous committed snapshot untouched, because step 1 never overwrites a key.
//! - *Two writers cannot both win an epoch.* The conditional create admits one (3).
//! - *Cleanup never breaks a committed snapshot.* A manifest goes first (5), so a crash in the
//!   middle of a cleanup leaves parts without a manifest (garbage), never a manifest without
//!   its parts. A part is deleted only when no kept manifest references it, and an in-progress
//!   snapshot writes to a folder above the newest committed epoch (epochs only grow), which
//!   cleanup does not touch, and reuses only parts that the newest committed manifest
//!   references (1), which cleanup always keeps. A cleanup that listed the store before a new
//!   commit still only deletes below the newest epoch it saw, so the same argument holds for
//!   its stale view.
//! - *An abandoned folder above the newest commit is garbage.* No manifest references a part
//!   above its own epoch, so only the snapshot being written in that folder could need its
//!   objects, and that writer adds an object at least every [`ABANDONED_AFTER`] until its
//!   commit. A folder whose newest listed object is older was given up; only the objects
//!   listed are deleted, each one older than that, so a writer that starts over in the same
//!   epoch (a job resumed from the snapshot below) keeps the parts it writes after the
//!   listing, and its manifest never references the old ones.
//!
//! Backends: `PutMode::Create` works on the local file system, in memory and on S3 (where
//! `object_store` sends `If-None-Match: *`; the server must honour it, as AWS S3, MinIO and
//! SeaweedFS do).

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt, stream};
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

use super::error::{Error, Result};
use super::format::{
    FORMAT_VERSION, Manifest, PartRef, check_part, decode_manifest, encode_manifest,
};

/// Parts larger than this are written with a multipart upload.
pub const MULTIPART_THRESHOLD: usize = 8 << 20;
/// Size of each piece of a multipart upload (the last one may be smaller). S3 wants at least
/// 5 MiB per piece but the last.
pub const MULTIPART_PIECE: usize = 8 << 20;
/// Pieces of one multipart upload in flight at once.
const MULTIPART_CONCURRENCY: usize = 4;
/// Manifests read at once by cleanup.
const READ_CONCURRENCY: usize = 8;
/// Longest job id, in bytes.
pub const MAX_JOB_ID_LEN: usize = 128;

/// Names a committed snapshot: a job id and an epoch. Displayed and parsed as
/// `job_id@epoch`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SnapshotId {
    /// The job id: the first key level under the store's prefix.
    pub job_id: String,
    /// The epoch.
    pub epoch: u64,
}

impl SnapshotId {
    /// A snapshot id.
    pub fn new(job_id: impl Into<String>, epoch: u64) -> SnapshotId {
        SnapshotId {
            job_id: job_id.into(),
            epoch,
        }
    }
}

impl fmt::Display for SnapshotId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.job_id, self.epoch)
    }
}

impl FromStr for SnapshotId {
    type Err = Error;

    /// Parses `job_id@epoch`.
    fn from_str(s: &str) -> Result<SnapshotId> {
        let invalid = |reason: String| Error::InvalidId {
            id: s.to_owned(),
            reason,
        };
        let (job_id, epoch) = s
            .rsplit_once('@')
            .ok_or_else(|| invalid("expected job-id@epoch".to_owned()))?;
        check_job_id(job_id).map_err(|e| invalid(e.to_string()))?;
        let epoch = epoch
            .parse()
            .map_err(|_| invalid(format!("the epoch {epoch:?} is not a number")))?;
        Ok(SnapshotId::new(job_id, epoch))
    }
}

/// Checks that `job_id` can be a key level: 1 to [`MAX_JOB_ID_LEN`] bytes of ASCII letters,
/// digits, `.`, `_` and `-`, and not `.` or `..`.
///
/// # Errors
///
/// [`Error::InvalidJobId`] saying what is wrong.
pub fn check_job_id(job_id: &str) -> Result<()> {
    let reason = if job_id.is_empty() {
        Some("it is empty")
    } else if job_id.len() > MAX_JOB_ID_LEN {
        Some("it is longer than 128 bytes")
    } else if !job_id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        Some("only ASCII letters, digits, '.', '_' and '-' are allowed")
    } else if job_id == "." || job_id == ".." {
        Some("'.' and '..' are not job ids")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(Error::InvalidJobId {
            job_id: job_id.to_owned(),
            reason,
        }),
        None => Ok(()),
    }
}

/// What a cleanup ([`Store::retain`], [`Store::gc`], [`Store::remove`]) did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Cleanup {
    /// Keys deleted (relative to the store's prefix): manifests first, then parts and
    /// leftovers.
    pub deleted: Vec<String>,
    /// Committed epochs whose manifest was deleted.
    pub removed_epochs: Vec<u64>,
    /// Committed epochs kept.
    pub kept_epochs: Vec<u64>,
    /// Uncommitted epochs (folders without a manifest: a writer that crashed or lost the
    /// epoch before its commit) whose objects were deleted.
    pub removed_uncommitted: Vec<u64>,
    /// Uncommitted epochs above the newest committed one that were left alone: a snapshot
    /// may be being written there (see [`Uncommitted`]).
    pub left_uncommitted: Vec<u64>,
    /// Bytes freed (sizes as listed by the store).
    pub freed_bytes: u64,
}

/// How long nothing must have been written in an uncommitted epoch folder above a job's
/// newest committed epoch before [`Store::gc`] takes it for abandoned: 24 hours.
///
/// A snapshot being written adds objects to its folder until its commit, each one dated by
/// the store when it lands; one whose newest object is a day old is not being written (a
/// single part would have to take a day to upload), and a day also covers any skew between
/// the store's clock and this machine's.
pub const ABANDONED_AFTER: Duration = Duration::from_secs(24 * 60 * 60);

/// What a cleanup ([`Store::gc_with`]) does with a job's epoch folders above its newest
/// committed epoch (every folder, for a job with nothing committed). Such a folder holds
/// either a snapshot being written right now, whose parts must stay, or the leftovers of a
/// writer that crashed before its commit; the store cannot tell which, only how long ago
/// something was last written there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Uncommitted {
    /// Leave them all: [`Store::retain`], and the executor's own retention, which runs while
    /// the job writes its next snapshot.
    Keep,
    /// Delete those in which nothing was written for at least this long (every object in
    /// them, and in a `file://` store every temporary file of a put, is older): abandoned.
    /// [`Store::gc`] uses [`ABANDONED_AFTER`].
    IdleFor(Duration),
    /// Delete them all, whatever their age. Only when no program is writing a snapshot of
    /// the job: its snapshot in progress would lose parts and fail to commit (or, worse,
    /// commit with a part deleted after its upload).
    Delete,
}

/// A committed snapshot as listed by the store, without reading its manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SnapshotInfo {
    /// Its id.
    pub id: SnapshotId,
    /// Size of its manifest in bytes.
    pub manifest_size: u64,
    /// When the store last modified its manifest.
    pub modified: SystemTime,
}

/// A committed snapshot that [`Store::read_latest`] passed over because it is damaged (or
/// was deleted between the listing and the read), and why.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Skipped {
    /// The snapshot passed over.
    pub id: SnapshotId,
    /// Why: [`Error::Damaged`] (which object, which check), or [`Error::NotFound`] for a
    /// snapshot deleted meanwhile.
    pub error: Arc<Error>,
}

/// A snapshot store: a prefix in an [`ObjectStore`], opened from a URL.
///
/// Cloning is cheap and clones share the store (an in-memory store too). See the
/// [module docs](self) for the keys and the commit protocol.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    /// The URL without credentials, for messages.
    url: String,
    /// The folder of a `file://` store: cleanup also removes the temporary files of writes
    /// that were killed before their rename, which the store does not list.
    local_root: Option<std::path::PathBuf>,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The URL is stored without user info or query; options (keys) are never kept here.
        f.debug_struct("Store")
            .field("url", &self.inner.url)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Opens the store at `url`:
    ///
    /// - `file:///abs/path`: a folder of the local file system (created if missing; writes are
    ///   fsynced, so the commit order survives a power cut);
    /// - a plain path (`snaps`, `./snaps`, `/tmp/snaps`): the same, a relative path resolved
    ///   against the current directory ([`Store::url`] then shows the absolute `file://`
    ///   URL);
    /// - `memory://` or `memory:///prefix`: a fresh in-memory store, shared by the clones of
    ///   the returned value (for tests);
    /// - `s3://bucket/prefix` (feature `s3`): an S3-compatible bucket, configured from the
    ///   usual `AWS_*` environment variables (see [`Store::open_with`] for explicit options).
    ///
    /// This is a writer's open: to read a store without creating a folder where a misspelt
    /// path points, use [`Store::open_existing`].
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] for a URL that does not parse, an unknown scheme or `s3://`
    /// without the `s3` feature; [`Error::Io`] if the folder cannot be created;
    /// [`Error::Store`] if the backend refuses its configuration.
    pub fn open(url: &str) -> Result<Store> {
        Store::open_with(url, std::iter::empty())
    }

    /// Opens the store at `url` (see [`Store::open`]) with backend options. For `s3://`, the
    /// options are `object_store`'s `AmazonS3ConfigKey`s, for example `endpoint`, `region`,
    /// `access_key_id`, `secret_access_key`, `allow_http`; they override the `AWS_*`
    /// environment variables. Two more set the client's retries: `max_retries` (default 10;
    /// `0` fails at the first error, say a connection refused) and `retry_timeout` (seconds,
    /// default 180): with the defaults, a request to an unreachable endpoint fails after
    /// about a minute. `file://` and `memory://` take no options.
    ///
    /// # Errors
    ///
    /// As [`Store::open`], and [`Error::InvalidOption`] for an option the backend does not
    /// know.
    pub fn open_with(
        url: &str,
        options: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Store> {
        Ok(Store::opened(super::open::open(
            url,
            options.into_iter().collect(),
            super::open::Create::IfMissing,
        )?))
    }

    /// Opens the store at `url` with backend options (see [`Store::open_with`]) to read or
    /// clean it up: a `file://` folder (or plain path) must exist, and is never created. This
    /// is how the `snapshots` command opens stores, so that listing a misspelt path says so
    /// instead of leaving an empty folder there. (An S3 bucket is never created by either
    /// open; a missing one is an [`Error::Store`] at the first request.)
    ///
    /// # Errors
    ///
    /// As [`Store::open_with`], and [`Error::NoSuchStore`] for a folder that does not exist
    /// or is a file.
    pub fn open_existing(
        url: &str,
        options: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Store> {
        Ok(Store::opened(super::open::open(
            url,
            options.into_iter().collect(),
            super::open::Create::Never,
        )?))
    }

    fn opened(opened: super::open::Opened) -> Store {
        Store {
            inner: Arc::new(Inner {
                store: opened.store,
                prefix: opened.prefix,
                url: opened.url,
                local_root: opened.local_root,
            }),
        }
    }

    /// Wraps any object store, with keys under `prefix` (`""` for none). For tests: a store
    /// that fails on purpose, a throttled one, …
    pub fn from_object_store(store: Arc<dyn ObjectStore>, prefix: &str) -> Store {
        let prefix = Path::from(prefix);
        let url = format!("{store}/{prefix}");
        Store {
            inner: Arc::new(Inner {
                store,
                prefix,
                url,
                local_root: None,
            }),
        }
    }

    /// The URL this store was opened with, without credentials.
    pub fn url(&self) -> &str {
        &self.inner.url
    }

    /// Writes the state of `chunk` (of `phase`) for snapshot `epoch` of `job_id` to a fresh
    /// key and returns the reference a manifest lists. Objects larger than
    /// [`MULTIPART_THRESHOLD`] go up as a multipart upload of [`MULTIPART_PIECE`] pieces.
    ///
    /// This is step 1 of the [commit protocol](self#commit-protocol): when it returns `Ok`,
    /// the part is durable.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidJobId`], or the store's failure ([`Error::Store`], [`Error::Denied`]).
    pub async fn put_part(
        &self,
        job_id: &str,
        epoch: u64,
        phase: u64,
        chunk: u64,
        bytes: Bytes,
    ) -> Result<PartRef> {
        check_job_id(job_id)?;
        let key = format!(
            "{job_id}/{epoch:020}/parts/{phase}-{chunk}-{:016x}",
            random_u64()
        );
        let part = PartRef {
            chunk,
            size: bytes.len() as u64,
            crc32c: crc32c::crc32c(&bytes),
            key,
        };
        let path = self.path(&part.key)?;
        let put_error = |e| Error::store("put", &part.key, e);
        if bytes.len() <= MULTIPART_THRESHOLD {
            self.inner
                .store
                .put(&path, PutPayload::from(bytes))
                .await
                .map_err(put_error)?;
        } else {
            let mut upload = self
                .inner
                .store
                .put_multipart(&path)
                .await
                .map_err(put_error)?;
            let pieces: Vec<_> = (0..bytes.len())
                .step_by(MULTIPART_PIECE)
                .map(|start| {
                    let end = (start + MULTIPART_PIECE).min(bytes.len());
                    upload.put_part(PutPayload::from(bytes.slice(start..end)))
                })
                .collect();
            let sent = stream::iter(pieces)
                .buffer_unordered(MULTIPART_CONCURRENCY)
                .try_collect::<Vec<()>>()
                .await;
            let done = match sent {
                Ok(_) => upload.complete().await.map(drop),
                Err(e) => Err(e),
            };
            if let Err(e) = done {
                // Best effort: the upload failed anyway, and unfinished uploads are invisible.
                let _ = upload.abort().await;
                return Err(put_error(e));
            }
        }
        Ok(part)
    }

    /// Reads a part and checks it against its reference (size, then CRC-32C).
    ///
    /// # Errors
    ///
    /// [`Error::Inconsistent`] for a key that is not a part key, [`Error::NotFound`],
    /// [`Error::Size`], [`Error::Checksum`], or the store's failure. (Reading a whole
    /// snapshot, [`Store::read`] reports the first four as [`Error::Damaged`].)
    pub async fn get_part(&self, part: &PartRef) -> Result<Bytes> {
        check_part_key(&part.key)?;
        let path = self.path(&part.key)?;
        let get_error = |e| Error::store("get", &part.key, e);
        let got = self.inner.store.get(&path).await.map_err(get_error)?;
        // Refuse a wrong size before downloading it.
        if got.meta.size != part.size {
            return Err(wrong_size(part, got.meta.size));
        }
        let bytes = got.bytes().await.map_err(get_error)?;
        check_part(&bytes, part)?;
        Ok(bytes)
    }

    /// As [`get_part`](Self::get_part), into `buf`, which is returned holding exactly the
    /// part's bytes. A folder store reads the file straight into it; other stores copy the
    /// object's stream into it.
    ///
    /// For a reader of many parts that keeps one buffer per read under way: its memory is
    /// faulted in once, not once per part (fresh memory made the reads of a restored grid
    /// several times slower: `BENCHMARKS.md`, recovery).
    pub(crate) async fn get_part_into(&self, part: &PartRef, mut buf: Vec<u8>) -> Result<Vec<u8>> {
        check_part_key(&part.key)?;
        let path = self.path(&part.key)?;
        let size = usize::try_from(part.size).map_err(|_| wrong_size(part, 0))?;
        buf.clear();
        if let Some(root) = &self.inner.local_root {
            // The key is checked above: relative, levels without `.` or `..`.
            let file = root.join(path.as_ref());
            let key = part.key.clone();
            let part = part.clone();
            let read = move || {
                use std::io::Read;
                let io = |source: std::io::Error| {
                    if source.kind() == std::io::ErrorKind::NotFound {
                        Error::NotFound {
                            what: format!("object {:?}", part.key),
                        }
                    } else {
                        Error::Io {
                            what: format!("reading part {:?} of a folder store", part.key),
                            source,
                        }
                    }
                };
                let f = std::fs::File::open(&file).map_err(io)?;
                let found = f.metadata().map_err(io)?.len();
                if found != part.size {
                    return Err(wrong_size(&part, found));
                }
                buf.reserve_exact(size);
                f.take(part.size).read_to_end(&mut buf).map_err(io)?;
                check_part(&buf, &part)?;
                Ok(buf)
            };
            // Off the runtime's threads when there is one, as `object_store` reads files.
            return match tokio::runtime::Handle::try_current() {
                Ok(rt) => rt.spawn_blocking(read).await.map_err(|e| Error::Io {
                    what: format!("reading part {key:?} stopped"),
                    source: std::io::Error::other(e.to_string()),
                })?,
                Err(_) => read(),
            };
        }
        let get_error = |e| Error::store("get", &part.key, e);
        let got = self.inner.store.get(&path).await.map_err(get_error)?;
        if got.meta.size != part.size {
            return Err(wrong_size(part, got.meta.size));
        }
        buf.reserve_exact(size);
        let mut stream = got.into_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(get_error)?;
            // A store that sends more than it said is refused before it takes memory.
            if buf.len() + chunk.len() > size {
                return Err(wrong_size(part, (buf.len() + chunk.len()) as u64));
            }
            buf.extend_from_slice(&chunk);
        }
        check_part(&buf, part)?;
        Ok(buf)
    }

    /// Commits a snapshot: creates its manifest at `{job_id}/{epoch:020}/manifest` if no
    /// manifest exists there. Step 2 of the [commit protocol](self#commit-protocol): every
    /// part the manifest lists must already be written.
    ///
    /// # Errors
    ///
    /// [`Error::EpochTaken`] when that epoch is already committed (another writer won),
    /// [`Error::InvalidJobId`], [`Error::UnsupportedVersion`] or [`Error::Inconsistent`] for a
    /// manifest that would not decode, or the store's failure.
    pub async fn commit(&self, manifest: &Manifest) -> Result<SnapshotId> {
        check_job_id(&manifest.job_id)?;
        if manifest.format_version != FORMAT_VERSION {
            return Err(Error::UnsupportedVersion {
                found: manifest.format_version,
                supported: FORMAT_VERSION,
            });
        }
        manifest.check_consistent()?;
        for part in manifest.all_parts() {
            check_part_key(&part.key)?;
        }
        let id = SnapshotId::new(manifest.job_id.clone(), manifest.epoch);
        let key = manifest_key(&id);
        let path = self.path(&key)?;
        let bytes = encode_manifest(manifest);
        let opts = PutOptions::from(PutMode::Create);
        match self
            .inner
            .store
            .put_opts(&path, PutPayload::from(bytes), opts)
            .await
        {
            Ok(_) => Ok(id),
            Err(object_store::Error::AlreadyExists { .. }) => Err(Error::EpochTaken {
                job_id: id.job_id,
                epoch: id.epoch,
            }),
            Err(e) => Err(Error::store("put", &key, e)),
        }
    }

    /// Reads and checks the manifest of snapshot `id` (see
    /// [`decode_manifest`]). The caller checks the job name with
    /// [`Manifest::check_job`].
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`] if it is not committed, any decoding error, [`Error::Inconsistent`]
    /// if it names another job id or epoch than its key or lists a key that is not a part
    /// key, or the store's failure.
    pub async fn manifest(&self, id: &SnapshotId) -> Result<Manifest> {
        check_job_id(&id.job_id)?;
        let key = manifest_key(id);
        let path = self.path(&key)?;
        let get_error = |e| match Error::store("get", &key, e) {
            Error::NotFound { .. } => Error::NotFound {
                what: format!("snapshot {id} in {}", self.inner.url),
            },
            e => e,
        };
        let got = self.inner.store.get(&path).await.map_err(get_error)?;
        let bytes = got.bytes().await.map_err(get_error)?;
        let manifest = decode_manifest(&bytes)?;
        if manifest.job_id != id.job_id || manifest.epoch != id.epoch {
            return Err(Error::Inconsistent(format!(
                "the manifest at {key:?} is of snapshot {}@{}",
                manifest.job_id, manifest.epoch
            )));
        }
        for part in manifest.all_parts() {
            check_part_key(&part.key)?;
        }
        Ok(manifest)
    }

    /// Reads committed snapshot `id` whole: its manifest and the bytes of every part it
    /// lists (in the order of [`Manifest::all_parts`]), each checked against its size and
    /// checksum. The caller checks the job name with [`Manifest::check_job`].
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`] if `id` is not committed (no snapshot); [`Error::Damaged`] if it
    /// is, but its manifest or one of its parts is missing, of another size, fails its
    /// checksum or does not decode (the error names the object and the check);
    /// [`Error::UnsupportedVersion`] for a snapshot of another format version; the store's
    /// failure ([`Error::Store`], [`Error::Denied`]) if it cannot be reached or refuses.
    pub async fn read(&self, id: &SnapshotId) -> Result<(Manifest, Vec<Bytes>)> {
        let manifest = self.read_manifest(id).await?;
        let parts = self.read_parts(id, manifest.all_parts()).await?;
        Ok((manifest, parts))
    }

    /// The manifest of committed snapshot `id`, as [`Store::read`] reads it: one that does
    /// not decode is [`Error::Damaged`].
    pub(crate) async fn read_manifest(&self, id: &SnapshotId) -> Result<Manifest> {
        match self.manifest(id).await {
            Ok(m) => Ok(m),
            Err(e @ Error::NotFound { .. }) => Err(e),
            Err(e) => Err(e.damage(id, &manifest_key(id))),
        }
    }

    /// Parts of snapshot `id`, read at once, each checked (a missing or corrupt one is
    /// [`Error::Damaged`]).
    pub(crate) async fn read_parts<'a>(
        &self,
        id: &SnapshotId,
        parts: impl Iterator<Item = &'a PartRef>,
    ) -> Result<Vec<Bytes>> {
        futures::future::try_join_all(
            parts.map(|p| async move { self.get_part(p).await.map_err(|e| e.damage(id, &p.key)) }),
        )
        .await
    }

    /// Reads the newest *restorable* committed snapshot of `job_id` (see [`Store::read`]):
    /// a damaged one is passed over for the one before it, and reported in the returned
    /// list, newest first.
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`] if `job_id` has no committed snapshot; the newest one's
    /// [`Error::Damaged`] if every committed snapshot is damaged; any other error of
    /// [`Store::read`] at once (a store that cannot be reached is not a reason to pass a
    /// snapshot over).
    pub async fn read_latest(
        &self,
        job_id: &str,
    ) -> Result<(SnapshotId, Manifest, Vec<Bytes>, Vec<Skipped>)> {
        let epochs = self.epochs(job_id).await?;
        let mut damaged: Vec<(SnapshotId, Error)> = Vec::new();
        for &epoch in epochs.iter().rev() {
            let id = SnapshotId::new(job_id, epoch);
            match self.read(&id).await {
                Ok((manifest, parts)) => {
                    let skipped = damaged
                        .into_iter()
                        .map(|(id, e)| Skipped {
                            id,
                            error: Arc::new(e),
                        })
                        .collect();
                    return Ok((id, manifest, parts, skipped));
                }
                Err(e @ (Error::Damaged { .. } | Error::NotFound { .. })) => damaged.push((id, e)),
                Err(e) => return Err(e),
            }
        }
        match damaged
            .into_iter()
            .map(|(_, e)| e)
            .find(|e| matches!(e, Error::Damaged { .. }))
        {
            Some(newest) => Err(newest),
            None => Err(Error::NotFound {
                what: format!("a committed snapshot of job {job_id} in {}", self.inner.url),
            }),
        }
    }

    /// Job ids that have objects in this store, sorted (committed or not).
    ///
    /// # Errors
    ///
    /// The store's failure.
    pub async fn jobs(&self) -> Result<Vec<String>> {
        let listed = self
            .inner
            .store
            .list_with_delimiter(Some(&self.inner.prefix))
            .await
            .map_err(|e| Error::store("list", "", e))?;
        let mut jobs: Vec<String> = listed
            .common_prefixes
            .iter()
            .filter_map(|p| p.filename().map(str::to_owned))
            .filter(|job| check_job_id(job).is_ok())
            .collect();
        jobs.sort();
        Ok(jobs)
    }

    /// The committed snapshots of `job_id` (those with a manifest), by ascending epoch.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidJobId`] or the store's failure.
    pub async fn snapshots(&self, job_id: &str) -> Result<Vec<SnapshotInfo>> {
        let scan = self.scan(job_id).await?;
        Ok(scan
            .epochs
            .iter()
            .filter_map(|(&epoch, folder)| {
                folder.manifest.as_ref().map(|meta| SnapshotInfo {
                    id: SnapshotId::new(job_id, epoch),
                    manifest_size: meta.size,
                    modified: meta.last_modified.into(),
                })
            })
            .collect())
    }

    /// The committed epochs of `job_id` (those with a manifest), ascending.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidJobId`] or the store's failure.
    pub async fn epochs(&self, job_id: &str) -> Result<Vec<u64>> {
        Ok(self.scan(job_id).await?.committed())
    }

    /// The newest committed snapshot of `job_id`, if any.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidJobId`] or the store's failure.
    pub async fn latest(&self, job_id: &str) -> Result<Option<SnapshotId>> {
        let epochs = self.epochs(job_id).await?;
        Ok(epochs.last().map(|&epoch| SnapshotId::new(job_id, epoch)))
    }

    /// Retention: keeps the newest `keep` committed snapshots of `job_id` (at least one: the
    /// newest is never deleted), deletes the manifests of older ones, then every object in an
    /// epoch folder up to the newest committed epoch that no kept manifest is or references:
    /// the parts of deleted snapshots (unless a kept incremental snapshot reuses them), the
    /// leftovers of uncommitted epochs, and unreferenced parts; in a `file://` store also the
    /// temporary files of puts killed before their rename, which the store does not list.
    /// Folders above the newest committed epoch are never touched: a snapshot may be in
    /// progress there.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidJobId`], a kept manifest that cannot be read (nothing is deleted then:
    /// its references are unknown), or the store's failure (what was deleted before it is
    /// not reported; run again).
    pub async fn retain(&self, job_id: &str, keep: usize) -> Result<Cleanup> {
        self.cleanup(job_id, Some(keep.max(1)), None, Uncommitted::Keep)
            .await
    }

    /// Retention ([`Store::retain`]) run by the writer of `next`, a snapshot of `job_id`
    /// whose parts are written but whose manifest is not committed yet: the parts `next`
    /// references are spared too, wherever they are (an incremental snapshot of a run
    /// resumed from an older snapshot reuses that snapshot's parts, which may be among
    /// those deleted).
    pub(crate) async fn retain_before(
        &self,
        job_id: &str,
        keep: usize,
        next: &Manifest,
    ) -> Result<Cleanup> {
        self.cleanup(job_id, Some(keep.max(1)), Some(next), Uncommitted::Keep)
            .await
    }

    /// Garbage collection: deletes, in epoch folders up to the newest committed epoch of
    /// `job_id`, every object that no committed manifest is or references (leftovers of
    /// uncommitted epochs, parts of a writer that lost an epoch, a `file://` store's
    /// temporary files of killed puts), and the uncommitted folders above it in which
    /// nothing was written for [`ABANDONED_AFTER`] (a crashed writer's, see
    /// [`Uncommitted::IdleFor`]). Keeps every committed snapshot. Uncommitted folders above
    /// the newest commit that were written to more recently are left, and listed in
    /// [`Cleanup::left_uncommitted`]: a snapshot may be being written there
    /// ([`Store::gc_with`] with [`Uncommitted::Delete`] deletes them when none is).
    ///
    /// # Errors
    ///
    /// As [`Store::retain`].
    pub async fn gc(&self, job_id: &str) -> Result<Cleanup> {
        self.gc_with(job_id, None, Uncommitted::IdleFor(ABANDONED_AFTER))
            .await
    }

    /// Cleanup with every choice explicit: with `keep` as [`Store::retain`] (`None`: every
    /// committed snapshot is kept, as [`Store::gc`]), and uncommitted folders above the
    /// newest committed epoch deleted as `uncommitted` says.
    ///
    /// # Errors
    ///
    /// As [`Store::retain`].
    pub async fn gc_with(
        &self,
        job_id: &str,
        keep: Option<usize>,
        uncommitted: Uncommitted,
    ) -> Result<Cleanup> {
        self.cleanup(job_id, keep.map(|k| k.max(1)), None, uncommitted)
            .await
    }

    /// Deletes snapshot `id`: its manifest first, then those of its parts that no other
    /// committed manifest references. Other leftovers in its folder are for [`Store::gc`].
    /// Removing the newest snapshot while the job runs breaks an incremental snapshot in
    /// progress: do it only for a job that is not running.
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`] if `id` is not committed, another committed manifest that cannot
    /// be read (nothing is deleted then), or the store's failure. A manifest of `id` that
    /// cannot be read is deleted all the same, and its parts left to [`Store::gc`].
    pub async fn remove(&self, id: &SnapshotId) -> Result<Cleanup> {
        let scan = self.scan(&id.job_id).await?;
        let committed = scan.committed();
        if !committed.contains(&id.epoch) {
            return Err(Error::NotFound {
                what: format!("snapshot {id} in {}", self.inner.url),
            });
        }
        let own = self.manifest(id).await.ok();
        let others: Vec<u64> = committed.into_iter().filter(|&e| e != id.epoch).collect();
        let referenced = self.references(&id.job_id, &others).await?;
        let key = manifest_key(id);
        let mut cleanup = Cleanup {
            kept_epochs: others,
            ..Cleanup::default()
        };
        let size = scan
            .epochs
            .get(&id.epoch)
            .and_then(|f| f.manifest.as_ref())
            .map_or(0, |m| m.size);
        self.delete(vec![(key, size)], &mut cleanup).await?;
        cleanup.removed_epochs.push(id.epoch);
        let sizes = scan.sizes();
        let parts = own
            .iter()
            .flat_map(|m| m.all_parts())
            .filter(|p| !referenced.contains(p.key.as_str()))
            .filter_map(|p| sizes.get(p.key.as_str()).map(|&size| (p.key.clone(), size)))
            .collect();
        self.delete(parts, &mut cleanup).await?;
        Ok(cleanup)
    }

    /// Checks that the store can be listed and written: lists the prefix, puts a small
    /// object under it (named `.malleable-check-…`, never a job id), reads it back and
    /// deletes it.
    ///
    /// # Errors
    ///
    /// The store's failure to put, read or delete it ([`Error::Denied`] for refused
    /// credentials, [`Error::Store`] for the rest); [`Error::Inconsistent`] if what is read
    /// back differs.
    pub async fn check_writable(&self) -> Result<()> {
        // A list first: some servers create a missing bucket on a put, but answer a list
        // with `NoSuchBucket`.
        self.inner
            .store
            .list_with_delimiter(Some(&self.inner.prefix))
            .await
            .map_err(|e| Error::store("list", "", e))?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let key = format!(".malleable-check-{}-{nanos}", std::process::id());
        let path = self.path(&key)?;
        let body = Bytes::from(key.clone().into_bytes());
        self.inner
            .store
            .put(&path, PutPayload::from(body.clone()))
            .await
            .map_err(|e| Error::store("put", &key, e))?;
        let read = async {
            let got = self.inner.store.get(&path).await?.bytes().await?;
            Ok::<_, object_store::Error>(got)
        }
        .await
        .map_err(|e| Error::store("get", &key, e));
        let deleted = self
            .inner
            .store
            .delete(&path)
            .await
            .map_err(|e| Error::store("delete", &key, e));
        if read? != body {
            return Err(Error::Inconsistent(format!(
                "the store returned other bytes for {key:?} than were put"
            )));
        }
        deleted
    }

    /// Deletes every snapshot of `job_id` and whatever else its epoch folders hold: the
    /// manifests first (newest first, so that what is left at any moment is a set of older
    /// committed snapshots or nothing committed), then every other object, then a `file://`
    /// store's staged leftovers. For a job that will not be resumed and is not running.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidJobId`], or the store's failure to list or delete (what was deleted
    /// stays deleted; calling it again finishes the work).
    pub async fn remove_job(&self, job_id: &str) -> Result<Cleanup> {
        let scan = self.scan(job_id).await?;
        let mut cleanup = Cleanup::default();
        let manifests = scan
            .epochs
            .iter()
            .rev()
            .filter_map(|(&epoch, f)| {
                let meta = f.manifest.as_ref()?;
                Some((
                    epoch,
                    manifest_key(&SnapshotId::new(job_id, epoch)),
                    meta.size,
                ))
            })
            .collect::<Vec<_>>();
        for (epoch, key, size) in manifests {
            self.delete(vec![(key, size)], &mut cleanup).await?;
            cleanup.removed_epochs.push(epoch);
        }
        cleanup.removed_epochs.reverse();
        cleanup.removed_uncommitted = scan
            .epochs
            .iter()
            .filter(|(_, f)| f.manifest.is_none())
            .map(|(&e, _)| e)
            .collect();
        let others = scan
            .epochs
            .values()
            .flat_map(|f| f.others.iter().cloned())
            .collect();
        self.delete(others, &mut cleanup).await?;
        self.sweep_staged(job_id, scan.epochs.keys().copied(), &mut cleanup)?;
        Ok(cleanup)
    }

    /// Retention (`Some(keep)`, `keep >= 1`) or garbage collection (`None`): see
    /// [`Store::retain`], [`Store::gc_with`].
    async fn cleanup(
        &self,
        job_id: &str,
        keep: Option<usize>,
        next: Option<&Manifest>,
        uncommitted: Uncommitted,
    ) -> Result<Cleanup> {
        let scan = self.scan(job_id).await?;
        let committed = scan.committed();
        let newest = committed.last().copied();
        // Folders above the newest commit (all of them, with nothing committed): a snapshot
        // may be in progress there, unless they were abandoned.
        let mut abandoned = Vec::new();
        let mut left = Vec::new();
        for (&epoch, folder) in scan.epochs.range(newest.map_or(0, |n| n + 1)..) {
            if self.abandoned(job_id, epoch, folder, uncommitted) {
                abandoned.push(epoch);
            } else {
                left.push(epoch);
            }
        }
        if !left.is_empty() {
            tracing::debug!(
                job_id,
                epochs = ?left,
                "uncommitted epochs above the newest commit left alone"
            );
        }
        let split = committed.len() - keep.unwrap_or(usize::MAX).min(committed.len());
        let (removed, kept) = committed.split_at(split);
        // Read every kept manifest before deleting anything.
        let mut referenced = self.references(job_id, kept).await?;
        referenced.extend(
            next.iter()
                .flat_map(|m| m.all_parts())
                .map(|p| p.key.clone()),
        );
        let mut cleanup = Cleanup {
            kept_epochs: kept.to_vec(),
            left_uncommitted: left,
            ..Cleanup::default()
        };
        // Manifests first, so that a crash never leaves a manifest without its parts.
        let manifests = removed
            .iter()
            .filter_map(|&epoch| {
                let meta = scan.epochs.get(&epoch)?.manifest.as_ref()?;
                Some((manifest_key(&SnapshotId::new(job_id, epoch)), meta.size))
            })
            .collect();
        self.delete(manifests, &mut cleanup).await?;
        cleanup.removed_epochs = removed.to_vec();
        // Then everything at or below the newest committed epoch, and in abandoned folders,
        // that no kept manifest is or references.
        // (The manifests of kept epochs are not among `others`.)
        let swept: Vec<u64> = scan
            .epochs
            .keys()
            .copied()
            .filter(|&e| newest.is_some_and(|n| e <= n) || abandoned.contains(&e))
            .collect();
        let garbage = swept
            .iter()
            .flat_map(|e| &scan.epochs[e].others)
            .filter(|(key, _)| !referenced.contains(key.as_str()))
            .cloned()
            .collect();
        self.delete(garbage, &mut cleanup).await?;
        cleanup.removed_uncommitted = swept
            .iter()
            .copied()
            .filter(|e| {
                let folder = &scan.epochs[e];
                folder.manifest.is_none() && !folder.others.is_empty()
            })
            .collect();
        self.sweep_staged(job_id, swept.into_iter(), &mut cleanup)?;
        Ok(cleanup)
    }

    /// Whether uncommitted epoch folder `epoch` of `job_id`, above the newest committed
    /// epoch, is to be deleted under `rule`: with [`Uncommitted::IdleFor`], when its newest
    /// object (listed in `folder`, or in a `file://` store any file under it, temporary
    /// files of puts in flight included) is at least that old.
    fn abandoned(&self, job_id: &str, epoch: u64, folder: &Folder, rule: Uncommitted) -> bool {
        let idle_for = match rule {
            Uncommitted::Keep => return false,
            Uncommitted::Delete => return true,
            Uncommitted::IdleFor(d) => d,
        };
        let mut newest = folder.newest;
        if let Some(root) = &self.inner.local_root {
            let dir = format!("{job_id}/{epoch:020}");
            for sub in [dir.clone(), format!("{dir}/parts")] {
                let Ok(entries) = std::fs::read_dir(root.join(&sub)) else {
                    continue;
                };
                for entry in entries.flatten() {
                    let Ok(modified) = entry.metadata().and_then(|m| m.modified()) else {
                        // Unknown: as if written now.
                        return false;
                    };
                    newest = newest.max(Some(modified));
                }
            }
        }
        // A time in the future (clock skew) is not idle.
        newest.is_none_or(|t| {
            SystemTime::now()
                .duration_since(t)
                .is_ok_and(|idle| idle >= idle_for)
        })
    }

    /// A `file://` store's temporary files (`NAME#DIGITS`, written before the rename that
    /// completes a put) left in epoch folders `epochs` by a writer that was killed in
    /// between. The store does not list them, so the folders are read directly. Only folders
    /// where no write is in flight are given: up to the newest committed epoch, or
    /// abandoned.
    fn sweep_staged(
        &self,
        job_id: &str,
        epochs: impl Iterator<Item = u64>,
        cleanup: &mut Cleanup,
    ) -> Result<()> {
        let Some(root) = &self.inner.local_root else {
            return Ok(());
        };
        let staged = |name: &str| {
            name.split_once('#')
                .is_some_and(|(_, n)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        };
        for epoch in epochs {
            let folder = format!("{job_id}/{epoch:020}");
            for sub in [folder.clone(), format!("{folder}/parts")] {
                let Ok(entries) = std::fs::read_dir(root.join(&sub)) else {
                    continue;
                };
                for entry in entries.flatten() {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    if !staged(&name) {
                        continue;
                    }
                    let size = entry.metadata().map_or(0, |m| m.len());
                    match std::fs::remove_file(entry.path()) {
                        Ok(()) => {
                            cleanup.deleted.push(format!("{sub}/{name}"));
                            cleanup.freed_bytes += size;
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(source) => {
                            return Err(Error::Io {
                                what: format!("cannot delete {}", entry.path().display()),
                                source,
                            });
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// The part keys that the manifests of `epochs` of `job_id` reference.
    async fn references(&self, job_id: &str, epochs: &[u64]) -> Result<HashSet<String>> {
        // Owned clones in each future: a closure borrowing `self` makes the future fail the
        // `Send` check of `tokio::spawn` (a higher-ranked lifetime the compiler cannot see
        // through), and the executor writes snapshots from spawned tasks.
        let manifests: Vec<Manifest> = stream::iter(epochs.to_vec())
            .map(|epoch| {
                let (store, id) = (self.clone(), SnapshotId::new(job_id, epoch));
                async move { store.manifest(&id).await }
            })
            .buffered(READ_CONCURRENCY)
            .try_collect()
            .await?;
        Ok(manifests
            .into_iter()
            .flat_map(|m| m.parts.into_iter().chain(m.kept))
            .map(|p| p.key)
            .collect())
    }

    /// Deletes `keys` (relative, with their sizes), recording them in `cleanup`. A key already
    /// gone counts as deleted (another cleanup may run at the same time).
    async fn delete(&self, keys: Vec<(String, u64)>, cleanup: &mut Cleanup) -> Result<()> {
        if keys.is_empty() {
            return Ok(());
        }
        let paths = keys
            .iter()
            .map(|(key, _)| self.path(key))
            .collect::<Result<Vec<Path>>>()?;
        let mut deleted = self
            .inner
            .store
            .delete_stream(stream::iter(paths.into_iter().map(Ok)).boxed());
        let mut failed = None;
        while let Some(result) = deleted.next().await {
            match result {
                Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        if let Some(e) = failed {
            return Err(Error::store("delete", &keys[0].0, e));
        }
        for (key, size) in keys {
            cleanup.freed_bytes = cleanup.freed_bytes.saturating_add(size);
            cleanup.deleted.push(key);
        }
        Ok(())
    }

    /// Lists every object of `job_id`, by epoch folder.
    async fn scan(&self, job_id: &str) -> Result<Scan> {
        check_job_id(job_id)?;
        let job_path = self.path(job_id)?;
        let objects: Vec<ObjectMeta> = self
            .inner
            .store
            .list(Some(&job_path))
            .try_collect()
            .await
            .map_err(|e| Error::store("list", job_id, e))?;
        let mut scan = Scan::default();
        for meta in objects {
            let Some(rest) = meta.location.prefix_match(&job_path) else {
                continue;
            };
            let rest: Vec<_> = rest.collect();
            // Only `{epoch:020}/…` is ours; anything else under the job is left alone.
            let Some(epoch) = rest.first().and_then(|p| parse_epoch(p.as_ref())) else {
                continue;
            };
            let folder = scan.epochs.entry(epoch).or_default();
            folder.newest = folder.newest.max(Some(meta.last_modified.into()));
            let relative = std::iter::once(job_id)
                .chain(rest.iter().map(|p| p.as_ref()))
                .collect::<Vec<_>>()
                .join("/");
            if rest.len() == 2 && rest[1].as_ref() == "manifest" {
                folder.manifest = Some(meta);
            } else {
                folder.others.push((relative, meta.size));
            }
        }
        Ok(scan)
    }

    /// The backend (for the lease records of `lease.rs`).
    pub(super) fn backend(&self) -> &Arc<dyn ObjectStore> {
        &self.inner.store
    }

    /// The full path of a key relative to the prefix.
    pub(super) fn path(&self, key: &str) -> Result<Path> {
        let relative =
            Path::parse(key).map_err(|e| Error::Inconsistent(format!("bad key {key:?}: {e}")))?;
        Ok(Path::from_iter(
            self.inner.prefix.parts().chain(relative.parts()),
        ))
    }
}

/// A part whose object has `found` bytes where its reference records another size.
fn wrong_size(part: &PartRef, found: u64) -> Error {
    Error::Size {
        what: format!("part {:?} (chunk {})", part.key, part.chunk),
        expected: part.size,
        found,
    }
}

/// The objects of one job, by epoch folder.
#[derive(Default)]
struct Scan {
    epochs: BTreeMap<u64, Folder>,
}

/// The objects of one epoch folder.
#[derive(Default)]
struct Folder {
    manifest: Option<ObjectMeta>,
    /// Every other object: relative key and size.
    others: Vec<(String, u64)>,
    /// When its newest object was written, as the store dates it.
    newest: Option<SystemTime>,
}

impl Scan {
    fn committed(&self) -> Vec<u64> {
        self.epochs
            .iter()
            .filter(|(_, f)| f.manifest.is_some())
            .map(|(&e, _)| e)
            .collect()
    }

    fn sizes(&self) -> std::collections::HashMap<&str, u64> {
        self.epochs
            .values()
            .flat_map(|f| &f.others)
            .map(|(k, s)| (k.as_str(), *s))
            .collect()
    }
}

fn manifest_key(id: &SnapshotId) -> String {
    format!("{}/{:020}/manifest", id.job_id, id.epoch)
}

fn parse_epoch(folder: &str) -> Option<u64> {
    if folder.len() == 20 && folder.bytes().all(|b| b.is_ascii_digit()) {
        folder.parse().ok()
    } else {
        None
    }
}

/// Checks that `key` has the shape of a part key, `{job_id}/{epoch:020}/parts/{name}` with a
/// name of `[A-Za-z0-9._-]`: a manifest from an untrusted store cannot make a reader fetch
/// (or a cleanup spare) anything else.
pub(crate) fn check_part_key(key: &str) -> Result<()> {
    let mut levels = key.split('/');
    let ok = matches!(
        (levels.next(), levels.next(), levels.next(), levels.next(), levels.next()),
        (Some(job), Some(epoch), Some("parts"), Some(name), None)
            if check_job_id(job).is_ok()
                && parse_epoch(epoch).is_some()
                && check_job_id(name).is_ok()
    );
    if ok {
        Ok(())
    } else {
        Err(Error::Inconsistent(format!(
            "{key:?} is not a part key (job-id/epoch/parts/name)"
        )))
    }
}

/// A random `u64` for part keys, from the standard library's randomly keyed hasher (seeded
/// from the OS), a process-wide counter, the process id and the time: unique enough that two
/// writers never pick the same key in one epoch folder.
pub(super) fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.write_u32(std::process::id());
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    hasher.write_u128(nanos);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_ids_parse_and_display() {
        let id: SnapshotId = "run-1.a_b@42".parse().unwrap();
        assert_eq!(id, SnapshotId::new("run-1.a_b", 42));
        assert_eq!(id.to_string(), "run-1.a_b@42");
        for bad in [
            "", "@1", "job", "job@", "job@x", "jo b@1", "job@-1", "..@1", "a/b@1",
        ] {
            assert!(
                matches!(bad.parse::<SnapshotId>(), Err(Error::InvalidId { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn job_ids_are_checked() {
        check_job_id("a").unwrap();
        check_job_id(&"x".repeat(128)).unwrap();
        for bad in ["", ".", "..", "a/b", "a b", "é", &"x".repeat(129)] {
            assert!(
                matches!(check_job_id(bad), Err(Error::InvalidJobId { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn part_keys_are_checked() {
        check_part_key("job/00000000000000000003/parts/0-1-00ff").unwrap();
        for bad in [
            "job/3/parts/x",
            "job/00000000000000000003/manifest",
            "job/00000000000000000003/parts/../x",
            "../00000000000000000003/parts/x",
            "job/00000000000000000003/parts/a/b",
            "job/00000000000000000003/parts/",
        ] {
            assert!(check_part_key(bad).is_err(), "{bad:?}");
        }
    }

    /// `get_part_into` answers as `get_part` does, from a folder (read straight into the
    /// buffer) and from another store (its stream copied): the bytes into a reused buffer,
    /// and for a missing, resized or altered part, the same errors.
    #[test]
    fn parts_read_into_a_buffer_are_checked_as_parts_read_whole() {
        let dir =
            std::env::temp_dir().join(format!("malleable-get-part-into-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let folder = Store::open(&format!("file://{}", dir.display())).unwrap();
        let memory = Store::open("memory://").unwrap();
        for (store, on_disk) in [(folder, true), (memory, false)] {
            rt.block_on(async {
                let bytes = Bytes::from((0..100_000u32).map(|i| i as u8).collect::<Vec<u8>>());
                let part = store.put_part("j", 1, 0, 7, bytes.clone()).await.unwrap();
                // A buffer with room and old bytes, as a reused one has.
                let buf = vec![9u8; 200_000];
                let capacity = buf.capacity();
                let got = store.get_part_into(&part, buf).await.unwrap();
                assert_eq!(got, bytes, "on disk: {on_disk}");
                assert_eq!(got.capacity(), capacity, "the buffer is reused");
                assert_eq!(&store.get_part(&part).await.unwrap()[..], &got[..]);

                let mut altered = bytes.to_vec();
                altered[50_000] ^= 1;
                let path = store.path(&part.key).unwrap();
                store.inner.store.put(&path, altered.into()).await.unwrap();
                let e = store.get_part_into(&part, Vec::new()).await.unwrap_err();
                assert!(matches!(e, Error::Checksum { .. }), "{e:?}");

                store
                    .inner
                    .store
                    .put(&path, bytes.slice(1..).into())
                    .await
                    .unwrap();
                let e = store.get_part_into(&part, Vec::new()).await.unwrap_err();
                assert!(
                    matches!(
                        e,
                        Error::Size {
                            expected: 100_000,
                            found: 99_999,
                            ..
                        }
                    ),
                    "{e:?}"
                );

                store.inner.store.delete(&path).await.unwrap();
                let e = store.get_part_into(&part, Vec::new()).await.unwrap_err();
                assert!(matches!(e, Error::NotFound { .. }), "{e:?}");
                let whole = store.get_part(&part).await.unwrap_err();
                assert!(matches!(whole, Error::NotFound { .. }), "{whole:?}");
            });
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A store that says a part has its size and then sends 64 MB, in 1 000 pieces of 64
    /// KiB: the first piece past the part's size ends the read with a size error; nothing
    /// more is asked of the store, and nothing past the size is copied.
    #[test]
    fn a_part_longer_than_its_store_says_is_refused_before_it_is_read_whole() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        #[derive(Debug)]
        struct Understates(object_store::memory::InMemory, Arc<AtomicUsize>);
        impl std::fmt::Display for Understates {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("Understates")
            }
        }
        #[async_trait::async_trait]
        impl ObjectStore for Understates {
            async fn put_opts(
                &self,
                location: &Path,
                payload: PutPayload,
                opts: PutOptions,
            ) -> object_store::Result<object_store::PutResult> {
                self.0.put_opts(location, payload, opts).await
            }
            async fn put_multipart_opts(
                &self,
                location: &Path,
                opts: object_store::PutMultipartOptions,
            ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
                self.0.put_multipart_opts(location, opts).await
            }
            async fn get_opts(
                &self,
                location: &Path,
                options: object_store::GetOptions,
            ) -> object_store::Result<object_store::GetResult> {
                let mut got = self.0.get_opts(location, options).await?;
                let pulled = Arc::clone(&self.1);
                got.payload = object_store::GetResultPayload::Stream(
                    futures::stream::iter(0..1000)
                        .map(move |_| {
                            pulled.fetch_add(1, Ordering::SeqCst);
                            Ok(Bytes::from(vec![3u8; 64 << 10]))
                        })
                        .boxed(),
                );
                Ok(got)
            }
            fn delete_stream(
                &self,
                locations: futures::stream::BoxStream<'static, object_store::Result<Path>>,
            ) -> futures::stream::BoxStream<'static, object_store::Result<Path>> {
                self.0.delete_stream(locations)
            }
            fn list(
                &self,
                prefix: Option<&Path>,
            ) -> futures::stream::BoxStream<'static, object_store::Result<ObjectMeta>> {
                self.0.list(prefix)
            }
            async fn list_with_delimiter(
                &self,
                prefix: Option<&Path>,
            ) -> object_store::Result<object_store::ListResult> {
                self.0.list_with_delimiter(prefix).await
            }
            async fn copy_opts(
                &self,
                from: &Path,
                to: &Path,
                options: object_store::CopyOptions,
            ) -> object_store::Result<()> {
                self.0.copy_opts(from, to, options).await
            }
        }
        let pulled = Arc::new(AtomicUsize::new(0));
        let store = Store::from_object_store(
            Arc::new(Understates(
                object_store::memory::InMemory::new(),
                Arc::clone(&pulled),
            )),
            "",
        );
        futures::executor::block_on(async {
            let part = store
                .put_part("j", 1, 0, 7, Bytes::from(vec![3u8; 100]))
                .await
                .unwrap();
            let e = store.get_part_into(&part, Vec::new()).await.unwrap_err();
            assert_eq!(pulled.load(Ordering::SeqCst), 1);
            match e {
                Error::Size {
                    expected: 100,
                    found,
                    ..
                } => assert!(found > 100, "{found}"),
                e => panic!("{e:?}"),
            }
        });
    }

    #[test]
    fn random_keys_differ() {
        let a: HashSet<u64> = (0..1000).map(|_| random_u64()).collect();
        assert_eq!(a.len(), 1000);
    }
}
