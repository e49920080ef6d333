//! Damaged snapshots and restore points, on a local folder store: "no snapshot" and "a
//! damaged snapshot" are different answers, `At::Latest` passes a damaged snapshot over for
//! the newest restorable one, retention keeps exactly `k`, full snapshots are independent
//! restore points, and a job whose snapshots keep failing can be told to end.

use crate::common;

use std::fmt;
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{Kernel, sequential};
use futures::TryStreamExt;
use futures::stream::BoxStream;
use malleable::snapshot::{self, Check, SnapshotId, Store};
use malleable::{At, Chunking, Error, Executor, Outcome};
use object_store::path::Path;
use object_store::{
    GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, memory::InMemory,
};

const JOB: &str = "test-kernel";
const CHUNKING: Chunking = Chunking::Count(8);

fn folder(name: &str) -> (String, PathBuf) {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("damage-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    (format!("file://{}", dir.display()), dir)
}

fn slow(n: u64) -> Kernel {
    let mut job = Kernel::new(n, 4);
    job.spin = 400;
    job.phases = 2;
    job
}

/// The value of `job` run to its end.
fn expected(job: &Kernel) -> malleable::Value<Kernel> {
    let mut last = job.clone();
    last.phase = job.phases - 1;
    sequential(&last, CHUNKING)
}

fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

fn epoch_dir(dir: &FsPath, epoch: u64) -> PathBuf {
    dir.join(JOB).join(format!("{epoch:020}"))
}

/// The keys (relative to the store) of the parts in `epoch`'s own folder.
fn own_parts(dir: &FsPath, epoch: u64) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(epoch_dir(dir, epoch).join("parts")) else {
        return Vec::new();
    };
    let mut keys: Vec<String> = entries
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .map(|name| format!("{JOB}/{epoch:020}/parts/{name}"))
        .collect();
    keys.sort();
    keys
}

/// A job suspended to a snapshot whose own folder holds parts (chunks were running).
fn suspended(url: &str, dir: &FsPath, job: &Kernel) -> SnapshotId {
    let exec = Executor::builder()
        .local_workers(2)
        .chunking(CHUNKING)
        .snapshots(url)
        .build()
        .unwrap();
    let handle = exec.submit(job.clone()).unwrap();
    std::thread::sleep(Duration::from_millis(30));
    let id = handle.suspend().wait().unwrap();
    assert!(matches!(handle.wait().unwrap(), Outcome::Suspended(_)));
    assert!(
        !own_parts(dir, id.epoch).is_empty(),
        "the suspend wrote parts"
    );
    id
}

#[test]
fn a_missing_part_is_damage_and_latest_resumes_the_snapshot_before_it() {
    let (url, dir) = folder("missing");
    let job = slow(300_000);
    let exec = Executor::builder()
        .local_workers(2)
        .chunking(CHUNKING)
        .snapshots(&url)
        .keep_snapshots(5)
        .build()
        .unwrap();
    let handle = exec.submit(job.clone()).unwrap();
    std::thread::sleep(Duration::from_millis(30));
    let older = handle.snapshot().wait().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let newest = handle.suspend().wait().unwrap();
    assert!(matches!(handle.wait().unwrap(), Outcome::Suspended(_)));
    assert!(newest.epoch > older.epoch);

    // A part only the newest snapshot has (written in its own folder) goes missing.
    let key = own_parts(&dir, newest.epoch)
        .into_iter()
        .next()
        .expect("the suspend wrote parts");
    std::fs::remove_file(dir.join(&key)).unwrap();

    // That snapshot is damaged, not absent: the error names it, the object and the check.
    let fresh = Executor::builder().local_workers(1).build().unwrap();
    let err = fresh
        .resume::<Kernel>(&url, At::Epoch(newest.epoch))
        .unwrap_err();
    match &err {
        Error::Snapshot(snapshot::Error::Damaged {
            snapshot,
            object,
            check,
            source,
        }) => {
            assert_eq!(*snapshot, newest);
            assert_eq!(*object, key);
            assert_eq!(*check, Check::Missing);
            assert!(
                matches!(**source, snapshot::Error::NotFound { .. }),
                "{source:?}"
            );
        }
        other => panic!("expected Damaged, got {other:?}"),
    }
    assert_eq!(
        err.to_string(),
        format!("snapshot {newest} is damaged: {key:?} is missing")
    );

    // A job that never committed anything is another answer.
    let none = Executor::builder().job_id("never-ran").build().unwrap();
    let err = none.resume::<Kernel>(&url, At::Latest).unwrap_err();
    assert!(
        matches!(err, Error::Snapshot(snapshot::Error::NotFound { .. })),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .starts_with("not found: a committed snapshot of job never-ran"),
        "{err}"
    );

    // `At::Latest` resumes the newest restorable snapshot and says what it passed over.
    let resumed = fresh.resume::<Kernel>(&url, At::Latest).unwrap();
    let report = resumed.resumed().expect("a resumed job says where from");
    assert_eq!(report.from, older);
    assert_eq!(report.skipped.len(), 1, "{:?}", report.skipped);
    assert_eq!(report.skipped[0].id, newest);
    assert!(
        matches!(
            &*report.skipped[0].error,
            snapshot::Error::Damaged { object, check: Check::Missing, .. } if *object == key
        ),
        "{:?}",
        report.skipped[0].error
    );
    let fin = resumed.wait().unwrap().finished().unwrap();
    assert_eq!(fin.value, expected(&job));

    // With every snapshot damaged, the answer is the newest one's damage, never "none".
    let manifest = epoch_dir(&dir, older.epoch).join("manifest");
    let mut bytes = std::fs::read(&manifest).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x55;
    std::fs::write(&manifest, &bytes).unwrap();
    let err = fresh.resume::<Kernel>(&url, At::Latest).unwrap_err();
    assert!(
        matches!(&err, Error::Snapshot(snapshot::Error::Damaged { snapshot, .. }) if *snapshot == newest),
        "{err:?}"
    );
    let err = fresh
        .resume::<Kernel>(&url, At::Epoch(older.epoch))
        .unwrap_err();
    let manifest_key = format!("{JOB}/{:020}/manifest", older.epoch);
    assert!(
        matches!(
            &err,
            Error::Snapshot(snapshot::Error::Damaged { object, check: Check::Checksum, .. })
                if *object == manifest_key
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        format!("snapshot {older} is damaged: {manifest_key:?} fails its checksum")
    );
}

/// A flipped bit in the format version of the newest manifest is damage, not "a later
/// format": `At::Latest` passes that snapshot over and resumes the one before it.
#[test]
fn a_damaged_manifest_version_is_passed_over_by_latest() {
    let (url, dir) = folder("version");
    let job = slow(300_000);
    let exec = Executor::builder()
        .local_workers(2)
        .chunking(CHUNKING)
        .snapshots(&url)
        .keep_snapshots(5)
        .build()
        .unwrap();
    let handle = exec.submit(job.clone()).unwrap();
    std::thread::sleep(Duration::from_millis(30));
    let older = handle.snapshot().wait().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let newest = handle.suspend().wait().unwrap();
    assert!(matches!(handle.wait().unwrap(), Outcome::Suspended(_)));
    assert!(newest.epoch > older.epoch);

    // Bit 2 of the version's second byte: the version reads as 1024 more than written.
    let manifest = epoch_dir(&dir, newest.epoch).join("manifest");
    let mut bytes = std::fs::read(&manifest).unwrap();
    bytes[9] ^= 0x04;
    std::fs::write(&manifest, &bytes).unwrap();
    let manifest_key = format!("{JOB}/{:020}/manifest", newest.epoch);

    let fresh = Executor::builder().local_workers(1).build().unwrap();
    let err = fresh
        .resume::<Kernel>(&url, At::Epoch(newest.epoch))
        .unwrap_err();
    assert!(
        matches!(
            &err,
            Error::Snapshot(snapshot::Error::Damaged { snapshot, object, check: Check::Checksum, .. })
                if *snapshot == newest && *object == manifest_key
        ),
        "{err:?}"
    );
    let resumed = fresh.resume::<Kernel>(&url, At::Latest).unwrap();
    let report = resumed.resumed().expect("a resumed job says where from");
    assert_eq!(report.from, older);
    assert_eq!(report.skipped.len(), 1, "{:?}", report.skipped);
    assert_eq!(report.skipped[0].id, newest);
    let fin = resumed.wait().unwrap().finished().unwrap();
    assert_eq!(fin.value, expected(&job));
}

/// An in-memory store that remembers the most committed manifests it ever held at once.
#[derive(Debug, Default)]
struct Counting {
    inner: InMemory,
    most: AtomicUsize,
}

impl fmt::Display for Counting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Counting")
    }
}

#[async_trait::async_trait]
impl ObjectStore for Counting {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let put = self.inner.put_opts(location, payload, opts).await?;
        if location.filename() == Some("manifest") {
            let all: Vec<ObjectMeta> = self.inner.list(None).try_collect().await?;
            let manifests = all
                .iter()
                .filter(|m| m.location.filename() == Some("manifest"))
                .count();
            self.most.fetch_max(manifests, Ordering::SeqCst);
        }
        Ok(put)
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
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
        from: &Path,
        to: &Path,
        options: object_store::CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

/// `keep_snapshots(k)` keeps `k`: not `k + 1` between a commit and its cleanup (where a crash
/// used to leave one too many), and exactly `k` once the snapshots are done.
#[test]
fn retention_keeps_exactly_k() {
    for keep in [2, 3] {
        let counting = Arc::new(Counting::default());
        let store = Store::from_object_store(counting.clone(), "");
        let exec = Executor::builder()
            .local_workers(2)
            .chunking(CHUNKING)
            .snapshot_store(store.clone())
            .keep_snapshots(keep)
            .build()
            .unwrap();
        // Long enough to outlast the snapshots: it is cancelled after them.
        let handle = exec.submit(slow(5_000_000)).unwrap();
        let mut ids = Vec::new();
        for _ in 0..keep + 3 {
            std::thread::sleep(Duration::from_millis(5));
            ids.push(handle.snapshot().wait().unwrap());
        }
        handle.cancel();
        let epochs = block_on(store.epochs(JOB)).unwrap();
        let newest: Vec<u64> = ids[ids.len() - keep..].iter().map(|i| i.epoch).collect();
        assert_eq!(epochs, newest, "keep {keep}");
        assert_eq!(
            counting.most.load(Ordering::SeqCst),
            keep,
            "keep {keep}: the store held more committed snapshots than kept"
        );
    }
}

/// Copies the folder `from` to `to`, recursively.
fn copy_dir(from: &FsPath, to: &FsPath) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// Resumes the suspended job in `url` with no worker (nothing runs, no chunk changes) and
/// takes `n` snapshots; the kept epochs.
fn idle_snapshots(url: &str, n: usize, keep: usize, full: bool) -> Vec<u64> {
    let mut b = Executor::builder()
        .local_workers(0)
        .chunking(CHUNKING)
        .keep_snapshots(keep);
    if full {
        b = b.full_snapshot_every(1);
    }
    let handle = b
        .build()
        .unwrap()
        .resume::<Kernel>(url, At::Latest)
        .unwrap();
    for _ in 0..n {
        handle.snapshot().wait().unwrap();
    }
    handle.cancel();
    // The run ends (and frees its job id) before the next one starts.
    let _ = handle.wait();
    block_on(Store::open(url).unwrap().epochs(JOB)).unwrap()
}

/// How many of `epochs` read back whole.
fn restorable(url: &str, epochs: &[u64]) -> usize {
    let store = Store::open(url).unwrap();
    epochs
        .iter()
        .filter(|&&e| block_on(store.read(&SnapshotId::new(JOB, e))).is_ok())
        .count()
}

fn epoch_folders(dir: &FsPath) -> usize {
    std::fs::read_dir(dir.join(JOB)).unwrap().count()
}

/// With `full_snapshot_every(1)` the `k` kept snapshots are `k` independent restore points:
/// each restores with the others deleted, a damaged part breaks only its own snapshot, and
/// no older folder is left behind. Incremental snapshots (the default) share the parts of
/// chunks that did not change, so one damaged part breaks every one of them.
#[test]
fn full_snapshots_are_independent_restore_points() {
    const KEEP: usize = 3;
    let job = slow(200_000);
    let (full_url, full_dir) = folder("full");
    suspended(&full_url, &full_dir, &job);
    let (incr_url, incr_dir) = folder("incremental");
    std::fs::remove_dir_all(&incr_dir).unwrap();
    copy_dir(&full_dir, &incr_dir);

    let full = idle_snapshots(&full_url, KEEP, KEEP, true);
    let incremental = idle_snapshots(&incr_url, KEEP, KEEP, false);
    assert_eq!(full.len(), KEEP);
    assert_eq!(incremental.len(), KEEP);
    assert_eq!(
        epoch_folders(&full_dir),
        KEEP,
        "only the kept epochs' folders"
    );
    assert!(
        epoch_folders(&incr_dir) > KEEP,
        "incremental snapshots keep the folder of the parts they share"
    );
    for &e in &full {
        assert!(!own_parts(&full_dir, e).is_empty(), "epoch {e} is full");
    }

    // One damaged part of the newest snapshot.
    for (url, dir, epochs, left) in [
        (&full_url, &full_dir, &full, KEEP - 1),
        (&incr_url, &incr_dir, &incremental, 0),
    ] {
        let scratch = dir.with_extension("damaged");
        let _ = std::fs::remove_dir_all(&scratch);
        copy_dir(dir, &scratch);
        let store = Store::open(url).unwrap();
        let newest = SnapshotId::new(JOB, *epochs.last().unwrap());
        let manifest = block_on(store.manifest(&newest)).unwrap();
        let part = &manifest.parts[0].key;
        std::fs::write(scratch.join(part), b"damaged").unwrap();
        let scratch_url = format!("file://{}", scratch.display());
        assert_eq!(restorable(&scratch_url, epochs), left, "{url}");
    }

    // Each full snapshot restores alone, to the exact value.
    for &keep in &full {
        let alone = full_dir.with_extension(format!("alone-{keep}"));
        let _ = std::fs::remove_dir_all(&alone);
        copy_dir(&full_dir, &alone);
        for &other in full.iter().filter(|&&e| e != keep) {
            std::fs::remove_dir_all(epoch_dir(&alone, other)).unwrap();
        }
        let url = format!("file://{}", alone.display());
        let fin = Executor::builder()
            .local_workers(2)
            .build()
            .unwrap()
            .resume::<Kernel>(&url, At::Latest)
            .unwrap()
            .wait()
            .unwrap()
            .finished()
            .unwrap();
        assert_eq!(fin.value, expected(&job), "epoch {keep} alone");
    }
}

/// `max_snapshot_failures(3)`: three failed snapshots in a row end the job with a typed
/// error that counts them, keeps the last cause and names the last committed snapshot, from
/// which the job resumes to the exact value.
#[test]
fn a_job_ends_after_n_snapshots_in_a_row_failed() {
    let (url, dir) = folder("give-up");
    let job = slow(2_000_000);
    let exec = Executor::builder()
        .local_workers(2)
        .chunking(CHUNKING)
        .snapshots(&url)
        .snapshot_every(Duration::from_millis(10))
        .max_snapshot_failures(3)
        .build()
        .unwrap();
    let handle = exec.submit(job.clone()).unwrap();
    let store = Store::open(&url).unwrap();
    let started = Instant::now();
    let latest = loop {
        if let Some(id) = block_on(store.latest(JOB)).unwrap() {
            break id;
        }
        assert!(!handle.is_finished(), "the job ended before a snapshot");
        assert!(started.elapsed() < Duration::from_secs(60), "no snapshot");
        std::thread::sleep(Duration::from_millis(2));
    };
    assert_eq!(handle.snapshot_failures(), 0);
    // Plain files where the next epochs' folders go: their parts cannot be written. (A
    // folder committed meanwhile is already there: the write fails, the next one is blocked.)
    for e in latest.epoch + 1..latest.epoch + 64 {
        let _ = std::fs::write(epoch_dir(&dir, e), b"in the way");
    }
    let watch = handle.clone();
    let err = match handle.wait() {
        Err(e) => e,
        Ok(o) => panic!(
            "the job ended without the error: {:?}",
            o.finished().map(|f| f.value)
        ),
    };
    assert_eq!(
        err.to_string(),
        "job test-kernel ended after 3 snapshots in a row failed"
    );
    let Error::SnapshotsFailing {
        failures,
        last_committed,
        last,
        ..
    } = &err
    else {
        panic!("expected SnapshotsFailing, got {err:?}");
    };
    assert_eq!(*failures, 3);
    assert!(
        matches!(
            last.error(),
            Error::Snapshot(snapshot::Error::Store { op: "put", .. })
        ),
        "{:?}",
        last.error()
    );
    assert!(std::error::Error::source(&err).is_some());
    assert!(watch.snapshot_failures() >= 3);
    assert!(watch.last_snapshot_error().is_some());

    // Nothing is lost that was committed: the job resumes from the named snapshot.
    let from = last_committed.clone().expect("a snapshot was committed");
    assert!(from.epoch >= latest.epoch);
    let fin = Executor::builder()
        .local_workers(2)
        .build()
        .unwrap()
        .resume::<Kernel>(&url, At::Epoch(from.epoch))
        .unwrap()
        .wait()
        .unwrap()
        .finished()
        .unwrap();
    assert_eq!(fin.value, expected(&job));
}

/// A run resumed from an older snapshot than the newest reuses that snapshot's parts in its
/// own: the cleanup before its commit deletes the older snapshot but spares those parts, so
/// the new snapshot reads back whole and restores.
#[test]
fn retention_spares_the_parts_a_resumed_run_reuses() {
    let (url, dir) = folder("resumed-older");
    let job = slow(300_000);
    let older = suspended(&url, &dir, &job);
    // Run on a little and suspend again: the chunks that ran get new parts.
    let exec = Executor::builder()
        .local_workers(2)
        .chunking(CHUNKING)
        .keep_snapshots(2)
        .build()
        .unwrap();
    let handle = exec.resume::<Kernel>(&url, At::Latest).unwrap();
    std::thread::sleep(Duration::from_millis(30));
    let newer = handle.suspend().wait().unwrap();
    assert!(matches!(handle.wait().unwrap(), Outcome::Suspended(_)));
    assert!(newer.epoch > older.epoch);

    // Back to the older one, with nothing running: its parts are reused as they are.
    let idle = Executor::builder()
        .local_workers(0)
        .chunking(CHUNKING)
        .keep_snapshots(2)
        .build()
        .unwrap();
    let handle = idle.resume::<Kernel>(&url, At::Epoch(older.epoch)).unwrap();
    let first = handle.snapshot().wait().unwrap();
    let second = handle.snapshot().wait().unwrap();
    handle.cancel();
    let store = Store::open(&url).unwrap();
    assert_eq!(
        block_on(store.epochs(JOB)).unwrap(),
        vec![first.epoch, second.epoch]
    );
    let (manifest, _) = block_on(store.read(&first)).unwrap();
    let folder = format!("{JOB}/{:020}/", older.epoch);
    assert!(
        manifest.parts.iter().any(|p| p.key.starts_with(&folder)),
        "the resumed run reuses the older snapshot's parts"
    );
    block_on(store.read(&second)).unwrap();
    // The run ends (and frees its job id) before the next one starts.
    let _ = handle.wait();
    let fin = Executor::builder()
        .local_workers(2)
        .build()
        .unwrap()
        .resume::<Kernel>(&url, At::Epoch(first.epoch))
        .unwrap()
        .wait()
        .unwrap()
        .finished()
        .unwrap();
    assert_eq!(fin.value, expected(&job));
}
