//! The snapshot store, run as one shared suite over every backend: in memory, on the local
//! file system, and (with `--features s3`) on a real SeaweedFS S3 server that the test
//! provisions itself (see `tests/support/seaweed.rs`; if it cannot, the test fails).
//!
//! Corruption is simulated by writing raw bytes through the backend's own `ObjectStore`,
//! beside the `Store` under test.

#[cfg(feature = "s3")]
use crate::support;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use futures::stream::BoxStream;
use malleable::snapshot::{
    Error, FORMAT_VERSION, MULTIPART_THRESHOLD, Manifest, PartRef, SnapshotId, Store,
    encode_manifest,
};
use object_store::path::Path;
use object_store::{
    GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, ObjectStoreExt,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, memory::InMemory,
};

/// A store under test and a raw handle on the same objects.
struct Backend {
    store: Store,
    raw: Arc<dyn ObjectStore>,
    /// The store's prefix inside `raw`.
    prefix: String,
}

impl Backend {
    /// Writes raw bytes at `key` (relative to the store's prefix).
    async fn put_raw(&self, key: &str, bytes: Vec<u8>) {
        self.raw
            .put(&self.path(key), PutPayload::from(bytes))
            .await
            .unwrap();
    }

    async fn delete_raw(&self, key: &str) {
        self.raw.delete(&self.path(key)).await.unwrap();
    }

    async fn exists(&self, key: &str) -> bool {
        match self.raw.head(&self.path(key)).await {
            Ok(_) => true,
            Err(object_store::Error::NotFound { .. }) => false,
            Err(e) => panic!("head {key}: {e}"),
        }
    }

    fn path(&self, key: &str) -> Path {
        Path::parse(format!("{}/{key}", self.prefix)).unwrap()
    }
}

fn manifest(job_id: &str, epoch: u64, parts: Vec<PartRef>) -> Manifest {
    let chunks = 100;
    Manifest {
        format_version: FORMAT_VERSION,
        job_name: "test-job".to_owned(),
        job_id: job_id.to_owned(),
        epoch,
        created_unix_ms: 1_750_000_000_000 + epoch,
        job: vec![1, 2, 3, epoch as u8],
        phase: 0,
        iterations_before: 0,
        iterations_done: 10,
        iterations_total: 1000,
        chunks,
        config: vec![],
        merged: 1,
        reduced: 42f64.to_le_bytes().to_vec(),
        done: vec![(1, vec![5; 8])],
        parts,
        kept: Vec::new(),
        job_version: 1,
        layout: None,
        submitted: None,
        shape: Vec::new(),
    }
}

fn bytes_of(seed: u8, len: usize) -> Bytes {
    (0..len)
        .map(|i| seed.wrapping_add((i % 251) as u8))
        .collect::<Vec<u8>>()
        .into()
}

fn key(job: &str, epoch: u64, rest: &str) -> String {
    format!("{job}/{epoch:020}/{rest}")
}

/// The shared suite: every backend must pass it.
async fn store_suite(b: &Backend) {
    commit_and_read(b).await;
    cleanup(b).await;
    uncommitted(b).await;
    remove(b).await;
    corruption(b).await;
}

async fn commit_and_read(b: &Backend) {
    let s = &b.store;
    let job = "commit";
    assert_eq!(s.latest(job).await.unwrap(), None);
    assert!(s.epochs(job).await.unwrap().is_empty());

    // Parts first: one small, one big enough for a multipart upload, one empty.
    let small = bytes_of(1, 1000);
    let big = bytes_of(2, MULTIPART_THRESHOLD * 2 + 12345);
    let empty = Bytes::new();
    let p_small = s.put_part(job, 1, 0, 2, small.clone()).await.unwrap();
    let p_big = s.put_part(job, 1, 0, 3, big.clone()).await.unwrap();
    let p_empty = s.put_part(job, 1, 0, 4, empty.clone()).await.unwrap();
    assert!(p_small.key.starts_with(&key(job, 1, "parts/0-2-")));
    assert_eq!((p_big.chunk, p_big.size), (3, big.len() as u64));
    // Parts alone are not a snapshot.
    assert_eq!(s.latest(job).await.unwrap(), None);

    let m1 = manifest(
        job,
        1,
        vec![p_small.clone(), p_big.clone(), p_empty.clone()],
    );
    let id1 = s.commit(&m1).await.unwrap();
    assert_eq!(id1, SnapshotId::new(job, 1));
    assert_eq!(s.latest(job).await.unwrap(), Some(id1.clone()));
    assert_eq!(s.manifest(&id1).await.unwrap(), m1);
    assert_eq!(s.get_part(&p_small).await.unwrap(), small);
    assert_eq!(s.get_part(&p_big).await.unwrap(), big);
    assert_eq!(s.get_part(&p_empty).await.unwrap(), empty);

    // A second commit of the same epoch loses, and the first stays.
    let mut other = m1.clone();
    other.job = vec![9];
    match s.commit(&other).await {
        Err(Error::EpochTaken { job_id, epoch }) => assert_eq!((job_id.as_str(), epoch), (job, 1)),
        r => panic!("expected EpochTaken, got {r:?}"),
    }
    assert_eq!(s.manifest(&id1).await.unwrap(), m1);

    // Incremental epoch 2 reuses the small part of epoch 1.
    let p3 = s.put_part(job, 2, 0, 5, bytes_of(3, 10)).await.unwrap();
    s.commit(&manifest(job, 2, vec![p_small.clone(), p3]))
        .await
        .unwrap();
    let mut later = manifest(job, 10, vec![]);
    later.phase = 3;
    s.commit(&later).await.unwrap();
    assert_eq!(s.epochs(job).await.unwrap(), vec![1, 2, 10]);
    assert_eq!(s.latest(job).await.unwrap(), Some(SnapshotId::new(job, 10)));
    let infos = s.snapshots(job).await.unwrap();
    assert_eq!(infos.len(), 3);
    assert_eq!(infos[2].manifest_size, encode_manifest(&later).len() as u64);

    assert!(s.jobs().await.unwrap().contains(&job.to_owned()));
    // Job ids are validated.
    for bad in ["", "a/b", "../x", "sp ace"] {
        assert!(matches!(
            s.latest(bad).await,
            Err(Error::InvalidJobId { .. })
        ));
        assert!(matches!(
            s.put_part(bad, 1, 0, 0, Bytes::new()).await,
            Err(Error::InvalidJobId { .. })
        ));
    }
    // A manifest that would not decode is refused before anything is written.
    let mut bad = manifest(job, 11, vec![]);
    bad.merged = bad.chunks + 1;
    assert!(matches!(s.commit(&bad).await, Err(Error::Inconsistent(_))));
    assert_eq!(s.epochs(job).await.unwrap(), vec![1, 2, 10]);
    // A missing snapshot.
    assert!(matches!(
        s.manifest(&SnapshotId::new(job, 3)).await,
        Err(Error::NotFound { .. })
    ));
}

async fn cleanup(b: &Backend) {
    let s = &b.store;
    let job = "cleanup";
    // Epoch 1: parts a, b. Epoch 2: reuses a, adds c. Epoch 3: uncommitted leftovers (a
    // crashed writer). Epoch 4: newest committed, reuses a, adds d. Epoch 5: in progress.
    let a = s.put_part(job, 1, 0, 10, bytes_of(10, 100)).await.unwrap();
    let bb = s.put_part(job, 1, 0, 11, bytes_of(11, 100)).await.unwrap();
    s.commit(&manifest(job, 1, vec![a.clone(), bb.clone()]))
        .await
        .unwrap();
    let c = s.put_part(job, 2, 0, 12, bytes_of(12, 100)).await.unwrap();
    s.commit(&manifest(job, 2, vec![a.clone(), c.clone()]))
        .await
        .unwrap();
    // A writer that lost epoch 2 left a part there.
    let lost = s.put_part(job, 2, 0, 12, bytes_of(99, 100)).await.unwrap();
    let crashed = s.put_part(job, 3, 0, 13, bytes_of(13, 100)).await.unwrap();
    b.put_raw(&key(job, 3, "junk"), b"junk".to_vec()).await;
    let d = s.put_part(job, 4, 0, 14, bytes_of(14, 100)).await.unwrap();
    s.commit(&manifest(job, 4, vec![a.clone(), d.clone()]))
        .await
        .unwrap();
    let in_progress = s.put_part(job, 5, 0, 15, bytes_of(15, 100)).await.unwrap();
    // A job without any committed snapshot: cleanup touches nothing.
    let lonely = s
        .put_part("lonely", 1, 0, 1, bytes_of(1, 10))
        .await
        .unwrap();
    let none = s.gc("lonely").await.unwrap();
    assert!(none.deleted.is_empty());
    assert!(b.exists(&lonely.key).await);

    // gc: leftovers below the newest go, the epoch above stays, committed snapshots stay.
    let gc = s.gc(job).await.unwrap();
    let mut deleted = gc.deleted.clone();
    deleted.sort();
    let mut expected = vec![lost.key.clone(), crashed.key.clone(), key(job, 3, "junk")];
    expected.sort();
    assert_eq!(deleted, expected);
    assert_eq!(gc.kept_epochs, vec![1, 2, 4]);
    assert!(gc.removed_epochs.is_empty());
    assert_eq!(gc.freed_bytes, 204);
    assert!(b.exists(&in_progress.key).await);
    for part in [&a, &bb, &c, &d] {
        s.get_part(part).await.unwrap();
    }
    assert_eq!(s.epochs(job).await.unwrap(), vec![1, 2, 4]);

    // retain 2: epoch 1's manifest and its part b go; a stays (epochs 2 and 4 reuse it).
    let kept = s.retain(job, 2).await.unwrap();
    assert_eq!(kept.removed_epochs, vec![1]);
    assert_eq!(kept.kept_epochs, vec![2, 4]);
    assert_eq!(
        kept.deleted,
        vec![key(job, 1, "manifest"), bb.key.clone()],
        "manifest first, then parts"
    );
    assert_eq!(s.epochs(job).await.unwrap(), vec![2, 4]);
    for part in [&a, &c, &d] {
        s.get_part(part).await.unwrap();
    }
    assert!(!b.exists(&bb.key).await);
    assert!(b.exists(&in_progress.key).await);

    // retain 0 keeps the newest all the same; c goes, a stays (epoch 4 reuses it).
    let kept = s.retain(job, 0).await.unwrap();
    assert_eq!(kept.removed_epochs, vec![2]);
    assert_eq!(kept.kept_epochs, vec![4]);
    assert_eq!(s.epochs(job).await.unwrap(), vec![4]);
    assert!(!b.exists(&c.key).await);
    for part in [&a, &d] {
        s.get_part(part).await.unwrap();
    }
    assert!(b.exists(&in_progress.key).await);
    // Nothing more to do.
    assert!(s.retain(job, 1).await.unwrap().deleted.is_empty());

    // A kept manifest that cannot be read stops the cleanup before anything is deleted.
    let e = s.put_part(job, 6, 0, 16, bytes_of(16, 10)).await.unwrap();
    b.put_raw(&key(job, 6, "manifest"), b"garbage".to_vec())
        .await;
    assert!(matches!(
        s.retain(job, 1).await,
        Err(Error::BadMagic { .. })
    ));
    assert!(b.exists(&e.key).await);
    assert!(b.exists(&key(job, 4, "manifest")).await);
}

/// Epochs never committed above the newest commit (a writer that crashed between its parts
/// and its manifest): `gc` leaves recent ones (a snapshot may be under way there) and says
/// so; `Uncommitted::Delete` deletes them and says which; `Uncommitted::Keep` (retention)
/// never touches them. A job with nothing committed is the same.
async fn uncommitted(b: &Backend) {
    use malleable::snapshot::Uncommitted;
    let s = &b.store;
    let job = "crashed";
    let a = s.put_part(job, 1, 0, 7, bytes_of(1, 100)).await.unwrap();
    s.commit(&manifest(job, 1, vec![a.clone()])).await.unwrap();
    let left = s.put_part(job, 2, 0, 7, bytes_of(2, 100)).await.unwrap();
    let left_too = s.put_part(job, 3, 0, 7, bytes_of(3, 50)).await.unwrap();

    let gc = s.gc(job).await.unwrap();
    assert!(gc.deleted.is_empty(), "{gc:?}");
    assert_eq!(gc.left_uncommitted, vec![2, 3]);
    assert!(gc.removed_uncommitted.is_empty());
    let kept = s.gc_with(job, Some(1), Uncommitted::Keep).await.unwrap();
    assert!(kept.deleted.is_empty(), "{kept:?}");
    assert_eq!(kept.left_uncommitted, vec![2, 3]);
    // A day is far: still there.
    let idle = s
        .gc_with(
            job,
            None,
            Uncommitted::IdleFor(std::time::Duration::from_secs(3600)),
        )
        .await
        .unwrap();
    assert!(idle.deleted.is_empty(), "{idle:?}");
    assert!(b.exists(&left.key).await && b.exists(&left_too.key).await);

    let gc = s.gc_with(job, None, Uncommitted::Delete).await.unwrap();
    let mut deleted = gc.deleted.clone();
    deleted.sort();
    assert_eq!(deleted, vec![left.key.clone(), left_too.key.clone()]);
    assert_eq!(gc.removed_uncommitted, vec![2, 3]);
    assert!(gc.left_uncommitted.is_empty());
    assert_eq!(gc.kept_epochs, vec![1]);
    assert_eq!(gc.freed_bytes, 150);
    assert!(!b.exists(&left.key).await && !b.exists(&left_too.key).await);
    s.get_part(&a).await.unwrap();
    assert_eq!(s.epochs(job).await.unwrap(), vec![1]);

    // Nothing committed at all.
    let never = s.put_part("never", 0, 0, 7, bytes_of(4, 10)).await.unwrap();
    assert_eq!(s.gc("never").await.unwrap().left_uncommitted, vec![0]);
    assert!(b.exists(&never.key).await);
    let gc = s.gc_with("never", None, Uncommitted::Delete).await.unwrap();
    assert_eq!(gc.deleted, vec![never.key.clone()]);
    assert_eq!(gc.removed_uncommitted, vec![0]);
    assert!(!b.exists(&never.key).await);
}

async fn remove(b: &Backend) {
    let s = &b.store;
    let job = "remove";
    let shared = s.put_part(job, 1, 0, 2, bytes_of(1, 50)).await.unwrap();
    let own = s.put_part(job, 1, 0, 3, bytes_of(2, 50)).await.unwrap();
    s.commit(&manifest(job, 1, vec![shared.clone(), own.clone()]))
        .await
        .unwrap();
    s.commit(&manifest(job, 2, vec![shared.clone()]))
        .await
        .unwrap();
    let removed = s.remove(&SnapshotId::new(job, 1)).await.unwrap();
    assert_eq!(
        removed.deleted,
        vec![key(job, 1, "manifest"), own.key.clone()]
    );
    assert_eq!(removed.removed_epochs, vec![1]);
    assert_eq!(s.epochs(job).await.unwrap(), vec![2]);
    s.get_part(&shared).await.unwrap();
    assert!(matches!(
        s.remove(&SnapshotId::new(job, 1)).await,
        Err(Error::NotFound { .. })
    ));
    // Removing the last one deletes its parts too.
    s.remove(&SnapshotId::new(job, 2)).await.unwrap();
    assert_eq!(s.latest(job).await.unwrap(), None);
    assert!(!b.exists(&shared.key).await);
}

async fn corruption(b: &Backend) {
    let s = &b.store;
    let job = "corrupt";
    let part = s.put_part(job, 1, 0, 7, bytes_of(7, 64)).await.unwrap();
    let good = manifest(job, 1, vec![part.clone()]);
    s.commit(&good).await.unwrap();
    let encoded = encode_manifest(&good);
    let id = |epoch| SnapshotId::new(job, epoch);
    let manifest_key = |epoch| key(job, epoch, "manifest");

    // Garbage, truncation, another version, a flipped bit, trailing bytes.
    b.put_raw(&manifest_key(2), b"hello, world".to_vec()).await;
    assert!(matches!(
        s.manifest(&id(2)).await,
        Err(Error::BadMagic { .. })
    ));
    b.put_raw(&manifest_key(2), encoded[..encoded.len() - 3].to_vec())
        .await;
    assert!(matches!(
        s.manifest(&id(2)).await,
        Err(Error::Truncated { .. })
    ));
    b.put_raw(&manifest_key(2), encoded[..10].to_vec()).await;
    assert!(matches!(
        s.manifest(&id(2)).await,
        Err(Error::Truncated { .. })
    ));
    // A later format (its checksum, over the header and the body, verifies).
    let later = FORMAT_VERSION + 1;
    let mut next = encoded.clone();
    next[8..12].copy_from_slice(&later.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&next[..20]), &next[24..]);
    next[20..24].copy_from_slice(&crc.to_le_bytes());
    b.put_raw(&manifest_key(2), next).await;
    match s.manifest(&id(2)).await {
        Err(e @ Error::UnsupportedVersion { found, supported }) => {
            assert_eq!((found, supported), (later, FORMAT_VERSION));
            assert!(e.to_string().contains(&format!("version {later}")), "{e}");
        }
        r => panic!("expected UnsupportedVersion, got {r:?}"),
    }
    // The same version by a flipped bit: damage.
    let mut damaged = encoded.clone();
    damaged[8] ^= (FORMAT_VERSION ^ later) as u8;
    b.put_raw(&manifest_key(2), damaged).await;
    assert!(matches!(
        s.manifest(&id(2)).await,
        Err(Error::Checksum { .. })
    ));
    let mut flipped = encoded.clone();
    let at = encoded.len() - 20;
    flipped[at] ^= 0x10;
    b.put_raw(&manifest_key(2), flipped).await;
    assert!(matches!(
        s.manifest(&id(2)).await,
        Err(Error::Checksum { .. })
    ));
    let mut long = encoded.clone();
    long.extend_from_slice(b"more");
    b.put_raw(&manifest_key(2), long).await;
    assert!(matches!(
        s.manifest(&id(2)).await,
        Err(Error::TrailingBytes { extra: 4, .. })
    ));
    // A valid manifest of epoch 1 stored as epoch 2.
    b.put_raw(&manifest_key(2), encoded.clone()).await;
    assert!(matches!(
        s.manifest(&id(2)).await,
        Err(Error::Inconsistent(_))
    ));
    // A manifest whose part key escapes the job's folders.
    let mut hostile = manifest(job, 3, vec![part.clone()]);
    hostile.parts[0].key = "../../etc/passwd".to_owned();
    b.put_raw(&manifest_key(3), encode_manifest(&hostile)).await;
    assert!(matches!(
        s.manifest(&id(3)).await,
        Err(Error::Inconsistent(_))
    ));
    assert!(matches!(
        s.get_part(&hostile.parts[0]).await,
        Err(Error::Inconsistent(_))
    ));
    // The newest epoch is listed (a manifest exists) but reading it is a typed error.
    assert_eq!(s.latest(job).await.unwrap(), Some(id(3)));

    // Another job's snapshot.
    let read = s.manifest(&id(1)).await.unwrap();
    read.check_job("test-job").unwrap();
    match read.check_job("another-job") {
        Err(e @ Error::WrongJob { .. }) => assert!(e.to_string().contains("another-job")),
        r => panic!("expected WrongJob, got {r:?}"),
    }

    // The newest manifest's version damaged: `read_latest` passes it over for the one
    // before it, and says so.
    let mut flipped = encode_manifest(&manifest(job, 3, vec![part.clone()]));
    flipped[9] ^= 0x04;
    b.put_raw(&manifest_key(3), flipped).await;
    match s.read_latest(job).await {
        Ok((from, read, _, skipped)) => {
            assert_eq!(from, id(1));
            assert_eq!(read, good);
            assert_eq!(skipped.len(), 2, "{skipped:?}");
            assert_eq!(skipped[0].id, id(3));
            assert!(
                matches!(
                    &*skipped[0].error,
                    Error::Damaged { check: malleable::snapshot::Check::Checksum, object, .. }
                        if *object == manifest_key(3)
                ),
                "{:?}",
                skipped[0].error
            );
        }
        r => panic!("expected the snapshot of epoch 1, got {r:?}"),
    }

    // Corrupted parts: same size other bytes, another size, gone.
    let mut bytes = bytes_of(7, 64).to_vec();
    bytes[5] ^= 1;
    b.put_raw(&part.key, bytes).await;
    assert!(matches!(
        s.get_part(&part).await,
        Err(Error::Checksum { .. })
    ));
    b.put_raw(&part.key, vec![0; 63]).await;
    assert!(matches!(
        s.get_part(&part).await,
        Err(Error::Size {
            expected: 64,
            found: 63,
            ..
        })
    ));
    b.delete_raw(&part.key).await;
    assert!(matches!(
        s.get_part(&part).await,
        Err(Error::NotFound { .. })
    ));
}

fn unique(name: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{name}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

#[tokio::test]
async fn memory_store() {
    let raw: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let prefix = "some/prefix";
    let backend = Backend {
        store: Store::from_object_store(raw.clone(), prefix),
        raw,
        prefix: prefix.to_owned(),
    };
    store_suite(&backend).await;
}

#[tokio::test]
async fn memory_url() {
    let store = Store::open("memory:///snaps").unwrap();
    assert_eq!(store.url(), "memory:///snaps");
    let clone = store.clone();
    let p = store
        .put_part("j", 0, 0, 5, Bytes::from_static(b"x"))
        .await
        .unwrap();
    store.commit(&manifest("j", 0, vec![p])).await.unwrap();
    // Clones share the store; a second open is another store.
    assert_eq!(clone.epochs("j").await.unwrap(), vec![0]);
    assert!(
        Store::open("memory://")
            .unwrap()
            .epochs("j")
            .await
            .unwrap()
            .is_empty()
    );
}

/// A folder under `target/tmp`, deleted when dropped (also when the test fails).
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[tokio::test]
async fn file_store() {
    let tmp =
        TempDir(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(unique("snapshot-store")));
    let dir = &tmp.0;
    let url = format!("file://{}", dir.display());
    let store = Store::open(&url).unwrap();
    assert!(dir.is_dir(), "open creates the folder");
    let raw: Arc<dyn ObjectStore> =
        Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir).unwrap());
    let backend = Backend {
        store,
        raw,
        prefix: String::new(),
    };
    store_suite(&backend).await;
    // A second handle on the same folder sees the same snapshots.
    let again = Store::open(&url).unwrap();
    assert_eq!(again.epochs("cleanup").await.unwrap(), vec![4, 6]);
    // Temporary files of puts killed before their rename (`NAME#DIGITS`, not listed by the
    // store): gc deletes those in committed folders, never above the newest epoch.
    for epoch in [0, 1] {
        let p = again
            .put_part("staged", epoch, 0, 3, Bytes::from_static(b"state"))
            .await
            .unwrap();
        again
            .commit(&manifest("staged", epoch, vec![p]))
            .await
            .unwrap();
    }
    let job = dir.join("staged");
    let low = job.join("00000000000000000000/parts/x#12");
    let manifest_tmp = job.join("00000000000000000001/manifest#3");
    let high = job.join("00000000000000000002/parts/y#5");
    for f in [&low, &manifest_tmp, &high] {
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(f, b"partial").unwrap();
    }
    let gc = again.gc("staged").await.unwrap();
    assert!(!low.exists() && !manifest_tmp.exists(), "{gc:?}");
    assert!(
        high.exists(),
        "a write may be in flight above the newest epoch"
    );
    assert!(
        gc.deleted
            .iter()
            .any(|k| k == "staged/00000000000000000000/parts/x#12"),
        "{gc:?}"
    );
    assert_eq!(again.epochs("staged").await.unwrap(), vec![0, 1]);
}

/// Sets the modification time of `path` (a file or a folder) to `ago` before now.
fn age(path: &std::path::Path, ago: std::time::Duration) {
    let when = std::time::SystemTime::now() - ago;
    std::fs::File::open(path)
        .unwrap()
        .set_modified(when)
        .unwrap();
}

/// A crashed writer's epoch above the newest commit, untouched for more than
/// `ABANDONED_AFTER`, is deleted by a plain `gc`; one with a recent file, even a temporary
/// file of a put in flight that the store does not list, is not.
#[tokio::test]
async fn gc_deletes_abandoned_epochs_above_the_newest_commit() {
    use malleable::snapshot::ABANDONED_AFTER;
    let tmp = TempDir(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(unique("abandoned")));
    let store = Store::open(&tmp.0.display().to_string()).unwrap();
    let job = "old";
    let a = store.put_part(job, 1, 0, 7, bytes_of(1, 10)).await.unwrap();
    store.commit(&manifest(job, 1, vec![a])).await.unwrap();
    let crashed = store.put_part(job, 2, 0, 7, bytes_of(2, 10)).await.unwrap();
    let busy = store.put_part(job, 3, 0, 7, bytes_of(3, 10)).await.unwrap();
    let day = ABANDONED_AFTER + std::time::Duration::from_secs(60);
    for epoch in [2, 3] {
        let folder = tmp.0.join(job).join(format!("{epoch:020}"));
        for entry in std::fs::read_dir(folder.join("parts")).unwrap() {
            age(&entry.unwrap().path(), day);
        }
        age(&folder.join("parts"), day);
    }
    // Epoch 3: a put under way, its temporary file fresh.
    let staged = tmp.0.join(job).join(format!("{:020}/parts/x#7", 3));
    std::fs::write(&staged, b"partial").unwrap();
    let gc = store.gc(job).await.unwrap();
    assert_eq!(gc.removed_uncommitted, vec![2], "{gc:?}");
    assert_eq!(gc.left_uncommitted, vec![3], "{gc:?}");
    assert_eq!(gc.deleted, vec![crashed.key.clone()]);
    assert!(!tmp.0.join(&crashed.key).exists());
    assert!(tmp.0.join(&busy.key).exists() && staged.exists());
    assert_eq!(store.epochs(job).await.unwrap(), vec![1]);
}

#[test]
fn bad_urls_and_options() {
    for (url, what) in [
        ("", "empty"),
        ("ftp://host/x", "unsupported scheme"),
        ("file://otherhost/x", "host"),
    ] {
        match Store::open(url) {
            Err(e @ Error::InvalidUrl { .. }) => {
                assert!(e.to_string().contains(what), "{url}: {e}");
            }
            r => panic!("{url}: expected InvalidUrl, got {r:?}"),
        }
    }
    let option = [("endpoint".to_owned(), "x".to_owned())];
    assert!(matches!(
        Store::open_with("memory://", option.clone()),
        Err(Error::InvalidOption { .. })
    ));
    #[cfg(not(feature = "s3"))]
    assert!(matches!(
        Store::open("s3://bucket/prefix"),
        Err(Error::InvalidUrl { .. })
    ));
    #[cfg(feature = "s3")]
    assert!(matches!(
        Store::open_with(
            "s3://bucket/prefix",
            [("no_such_option".to_owned(), "1".to_owned())]
        ),
        Err(Error::InvalidOption { .. })
    ));
    // Credentials in a URL never show in messages or Debug.
    let e = Store::open("ftp://user:hunter2@host/x").unwrap_err();
    assert!(!e.to_string().contains("hunter2"), "{e}");
    let s = Store::open("memory://user:hunter2@x/y").unwrap();
    assert!(!format!("{s:?}").contains("hunter2"), "{s:?}");
    assert!(!s.url().contains("hunter2"), "{}", s.url());
}

/// An in-memory store whose writes fail, as a full disk or a read-only bucket would.
#[derive(Debug)]
struct Refusing {
    inner: InMemory,
    denied: bool,
}

impl fmt::Display for Refusing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Refusing")
    }
}

impl Refusing {
    fn error(&self, path: &Path) -> object_store::Error {
        if self.denied {
            object_store::Error::PermissionDenied {
                path: path.to_string(),
                source: "read-only bucket".into(),
            }
        } else {
            object_store::Error::Generic {
                store: "Refusing",
                source: "no space left on device".into(),
            }
        }
    }
}

#[async_trait::async_trait]
impl ObjectStore for Refusing {
    async fn put_opts(
        &self,
        location: &Path,
        _payload: PutPayload,
        _opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        Err(self.error(location))
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        _opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        Err(self.error(location))
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        _from: &Path,
        to: &Path,
        _options: object_store::CopyOptions,
    ) -> object_store::Result<()> {
        Err(self.error(to))
    }
}

#[tokio::test]
async fn refusing_store() {
    for denied in [true, false] {
        let store = Store::from_object_store(
            Arc::new(Refusing {
                inner: InMemory::new(),
                denied,
            }),
            "p",
        );
        let small = store
            .put_part("j", 1, 0, 0, Bytes::from_static(b"state"))
            .await;
        let big = store
            .put_part("j", 1, 0, 1, bytes_of(0, MULTIPART_THRESHOLD + 1))
            .await;
        let commit = store.commit(&manifest("j", 1, vec![])).await;
        for result in [small.map(drop), big.map(drop), commit.map(drop)] {
            match (denied, result) {
                (true, Err(e @ Error::Denied { .. })) => {
                    assert!(e.to_string().contains("credentials"), "{e}");
                    assert!(std::error::Error::source(&e).is_some());
                }
                (false, Err(e @ Error::Store { .. })) => {
                    let source = std::error::Error::source(&e).unwrap().to_string();
                    assert!(source.contains("no space left"), "{source}");
                }
                (_, r) => panic!("denied={denied}: unexpected {r:?}"),
            }
        }
        // Nothing was committed.
        assert_eq!(store.latest("j").await.unwrap(), None);
    }
}

#[cfg(feature = "s3")]
mod s3 {
    use super::*;
    use support::seaweed;

    fn raw_store(server: &seaweed::Seaweed) -> Arc<dyn ObjectStore> {
        let store = object_store::aws::AmazonS3Builder::new()
            .with_bucket_name(seaweed::BUCKET)
            .with_endpoint(&server.endpoint)
            .with_allow_http(true)
            .with_region("us-east-1")
            .with_access_key_id(seaweed::ACCESS_KEY)
            .with_secret_access_key(seaweed::SECRET_KEY)
            .build()
            .unwrap();
        Arc::new(store)
    }

    #[tokio::test]
    async fn s3_store() {
        let server = seaweed::server();
        let prefix = unique("suite");
        let url = format!("s3://{}/{prefix}", seaweed::BUCKET);
        let store = Store::open_with(&url, server.options()).unwrap();
        assert_eq!(store.url(), url);
        let backend = Backend {
            store,
            raw: raw_store(server),
            prefix,
        };
        store_suite(&backend).await;
    }

    #[tokio::test]
    async fn s3_wrong_credentials() {
        let server = seaweed::server();
        let url = format!("s3://{}/{}", seaweed::BUCKET, unique("creds"));
        let good = Store::open_with(&url, server.options()).unwrap();
        good.commit(&manifest("j", 1, vec![])).await.unwrap();
        for (key, secret) in [
            (seaweed::ACCESS_KEY, "not-the-secret"),
            ("no-such-key", seaweed::SECRET_KEY),
        ] {
            let bad = Store::open_with(&url, server.options_with_keys(key, secret)).unwrap();
            let put = bad.put_part("j", 2, 0, 0, Bytes::from_static(b"x")).await;
            let list = bad.latest("j").await;
            let read = bad.manifest(&SnapshotId::new("j", 1)).await;
            for result in [put.map(drop), list.map(drop), read.map(drop)] {
                match result {
                    Err(e @ Error::Denied { .. }) => {
                        let text = e.to_string();
                        assert!(text.contains("credentials"), "{text}");
                        assert!(std::error::Error::source(&e).is_some());
                    }
                    r => panic!("key {key}: expected Denied, got {r:?}"),
                }
            }
        }
        // The committed snapshot is untouched.
        assert_eq!(good.epochs("j").await.unwrap(), vec![1]);
    }
}

/// The `snapshots` tool against a `file://` store.
#[cfg(feature = "cli")]
#[tokio::test]
async fn cli() {
    use std::process::Command;

    let tmp = TempDir(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(unique("cli")));
    let url = format!("file://{}", tmp.0.display());
    let store = Store::open(&url).unwrap();
    let part = store
        .put_part("job-a", 1, 0, 5, bytes_of(5, 3000))
        .await
        .unwrap();
    store
        .commit(&manifest("job-a", 1, vec![part.clone()]))
        .await
        .unwrap();
    store
        .commit(&manifest("job-a", 2, vec![part.clone()]))
        .await
        .unwrap();
    let other = store
        .put_part("job-b", 1, 0, 2, bytes_of(6, 10))
        .await
        .unwrap();
    store
        .commit(&manifest("job-b", 1, vec![other.clone()]))
        .await
        .unwrap();

    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_snapshots"))
            .args(args)
            .output()
            .unwrap();
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    };

    let (code, out, _) = run(&["ls", &url]);
    assert_eq!(code, Some(0));
    assert!(out.contains("job-a") && out.contains("job-b"), "{out}");
    assert_eq!(
        out.lines().filter(|l| l.starts_with("job-a")).count(),
        2,
        "{out}"
    );

    let (code, out, _) = run(&["show", &url, "job-a"]);
    assert_eq!(code, Some(0));
    assert!(out.contains("job-a@2"), "latest: {out}");
    assert!(out.contains("test-job") && out.contains("1.0%"), "{out}");
    assert!(out.contains("parts      1, 2.9 KiB"), "{out}");

    let (code, out, _) = run(&["verify", &url, "job-a@1"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("verified"), "{out}");

    // A corrupted part: verify fails with a clear message and status 1.
    let path = tmp.0.join(&other.key);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[0] ^= 1;
    std::fs::write(&path, bytes).unwrap();
    let (code, out, err) = run(&["verify", &url, "job-b@1"]);
    assert_eq!(code, Some(1));
    assert!(
        out.contains("FAILED") && out.contains("checksum mismatch"),
        "{out}"
    );
    assert!(err.contains("1 of 1 parts failed"), "{err}");

    // A corrupt manifest: show fails with one clear line.
    let manifest_path = tmp.0.join(key("job-b", 1, "manifest"));
    std::fs::write(&manifest_path, b"MLBLSNAP\x07\x00\x00\x00").unwrap();
    let (code, _, err) = run(&["show", &url, "job-b"]);
    assert_eq!(code, Some(1));
    // (The version of a manifest cut short is not trusted: it is not under a checksum.)
    assert!(
        err.contains("snapshot manifest is truncated: needs 24 bytes, got 12"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");

    // Bad input: errors, never a panic.
    for args in [
        &["show", &url, "job-a@x"][..],
        &["show", &url, "no/such"],
        &["show", &url, "job-c"],
        &["show", "ftp://x/y", "job-a"],
        &["rm", &url, "job-a@9"],
        &["nonsense"],
        &["gc", &url, "job-a", "--keep", "-1"],
        &["ls", &url, "-o", "endpoint"],
    ] {
        let (code, _, err) = run(args);
        assert_eq!(code, Some(1), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(!err.is_empty(), "{args:?}");
    }

    // Retention and removal.
    let (code, out, _) = run(&["gc", &url, "job-a", "--keep", "1"]);
    assert_eq!(code, Some(0));
    assert!(out.contains("removed epochs 1"), "{out}");
    assert_eq!(store.epochs("job-a").await.unwrap(), vec![2]);
    store.get_part(&part).await.unwrap();
    let (code, out, _) = run(&["rm", &url, "job-a@2"]);
    assert_eq!(code, Some(0));
    assert!(out.contains("removed job-a@2"), "{out}");
    assert_eq!(store.latest("job-a").await.unwrap(), None);
    // gc refuses to guess what an unreadable manifest references.
    let (code, _, err) = run(&["gc", &url, "job-b"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("snapshot manifest is truncated"), "{err}");
}

/// Runs the `snapshots` command: exit code, standard output, standard error.
#[cfg(feature = "cli")]
fn snapshots_cli(args: &[&str]) -> (Option<i32>, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_snapshots"))
        .args(args)
        .output()
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code(), text(&out.stdout), text(&out.stderr))
}

/// The command reads stores, it never creates one: every subcommand given a folder that does
/// not exist (as a `file://` URL or a path) fails with "no such store" and leaves no folder.
#[cfg(feature = "cli")]
#[test]
fn cli_never_creates_a_store() {
    let tmp = TempDir(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(unique("cli-typo")));
    let missing = tmp.0.join("typo");
    let url = format!("file://{}", missing.display());
    let path = missing.display().to_string();
    for store in [&url, &path] {
        for args in [
            &["ls", store][..],
            &["show", store, "job"],
            &["verify", store, "job@1"],
            &["rm", store, "job@1"],
            &["gc", store, "job"],
            &["gc", store, "job", "--keep", "1", "--uncommitted"],
        ] {
            let (code, _, err) = snapshots_cli(args);
            assert_eq!(code, Some(1), "{args:?}: {err}");
            assert!(err.contains("no such store"), "{args:?}: {err}");
            assert!(err.contains("does not exist"), "{args:?}: {err}");
            assert!(!missing.exists(), "{args:?} created {}", missing.display());
            assert!(!tmp.0.exists(), "{args:?} created {}", tmp.0.display());
        }
    }
}

/// A plain path names a folder store, relative to the current directory.
#[cfg(feature = "cli")]
#[tokio::test]
async fn cli_takes_plain_paths() {
    let tmp = TempDir(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(unique("cli-path")));
    let store = Store::open(&tmp.0.display().to_string()).unwrap();
    assert_eq!(
        store.url(),
        url::Url::from_file_path(&tmp.0).unwrap().as_str()
    );
    let part = store
        .put_part("job-p", 1, 0, 5, bytes_of(5, 30))
        .await
        .unwrap();
    store
        .commit(&manifest("job-p", 1, vec![part]))
        .await
        .unwrap();
    let (code, out, err) = snapshots_cli(&["ls", &tmp.0.display().to_string()]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("job-p"), "{out}");
    // Relative: run from the folder's parent.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_snapshots"))
        .args([
            "show",
            tmp.0.file_name().unwrap().to_str().unwrap(),
            "job-p",
        ])
        .current_dir(tmp.0.parent().unwrap())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(text.contains("job-p@1"), "{text}");
}

/// `gc` of a crash's leftovers above the newest commit: recent ones are listed as left (a
/// snapshot may be under way), `--uncommitted` deletes them and says so.
#[cfg(feature = "cli")]
#[tokio::test]
async fn cli_gc_of_uncommitted_epochs() {
    let tmp = TempDir(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(unique("cli-gc")));
    let url = format!("file://{}", tmp.0.display());
    let store = Store::open(&url).unwrap();
    let a = store
        .put_part("job", 1, 0, 5, bytes_of(5, 30))
        .await
        .unwrap();
    store
        .commit(&manifest("job", 1, vec![a.clone()]))
        .await
        .unwrap();
    let crashed = store
        .put_part("job", 2, 0, 5, bytes_of(6, 2000))
        .await
        .unwrap();

    let (code, out, err) = snapshots_cli(&["gc", &url, "job"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("left uncommitted epochs 2"), "{out}");
    assert!(out.contains("--uncommitted"), "{out}");
    assert!(out.contains("0 objects deleted"), "{out}");
    assert!(tmp.0.join(&crashed.key).exists());

    let (code, out, err) = snapshots_cli(&["gc", &url, "job", "--uncommitted"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("removed uncommitted epochs 2"), "{out}");
    assert!(out.contains("1 objects deleted, 2.0 KiB freed"), "{out}");
    assert!(!out.contains("left uncommitted"), "{out}");
    assert!(!tmp.0.join(&crashed.key).exists());
    store.get_part(&a).await.unwrap();
    assert_eq!(store.epochs("job").await.unwrap(), vec![1]);
}
