//! A snapshot being written when its job ends is committed before `wait` returns and before
//! the executor goes:
//! dropping the executor, or [`Executor::shutdown`], waits for snapshot writes in flight (up
//! to [`Builder::shutdown_timeout`](malleable::Builder::shutdown_timeout)); past the limit,
//! `shutdown` says what it abandoned. The store here takes [`DELAY`] for every write, so a
//! snapshot taken early in a short job is still being written when the job ends.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::BoxStream;
use malleable::reduce::Sum;
use malleable::snapshot::Store;
use malleable::{Chunk, Chunking, Error, Executor, Job, JobHandle, Outcome, Step};
use object_store::path::Path;
use object_store::{
    GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, memory::InMemory,
};
use serde::{Deserialize, Serialize};

/// How long the store takes for each write.
const DELAY: Duration = Duration::from_millis(800);

/// An in-memory store whose writes each take [`DELAY`].
#[derive(Debug)]
struct SlowWrites(InMemory);

impl fmt::Display for SlowWrites {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SlowWrites")
    }
}

#[async_trait::async_trait]
impl ObjectStore for SlowWrites {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        tokio::time::sleep(DELAY).await;
        self.0.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        tokio::time::sleep(DELAY).await;
        self.0.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.0.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.0.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.0.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
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

/// Eight chunks of 200 ms: with two workers the job takes about 800 ms, about as long as
/// one write to the store.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Short;

#[derive(Serialize, Deserialize)]
struct ShortChunk {
    next: u64,
    end: u64,
}

impl Job for Short {
    const NAME: &'static str = "snapshot-shutdown-short";
    type Chunk = ShortChunk;
    type Reducer = Sum<u64>;
    type Input = ();
    fn iterations(&self) -> u64 {
        80
    }
    fn chunk(&self, range: Range<u64>) -> ShortChunk {
        ShortChunk {
            next: range.start,
            end: range.end,
        }
    }
    fn reducer(&self) -> Sum<u64> {
        Sum::new()
    }
}

impl Chunk for ShortChunk {
    type Job = Short;
    type Output = u64;
    fn step(&mut self, _job: &Short, _input: &()) -> Step<u64> {
        std::thread::sleep(Duration::from_millis(20));
        self.next += 1;
        if self.next == self.end {
            Step::Done(10)
        } else {
            Step::Yield
        }
    }
}

/// Runs [`Short`], asking for a snapshot once it runs, and returns the executor and its
/// store once the job has ended (the snapshot is then still being written), with the job's
/// handle, not waited for.
fn ended_with_a_write_in_flight(timeout: Duration) -> (Executor, Store, JobHandle<Short>) {
    let store = Store::from_object_store(Arc::new(SlowWrites(InMemory::new())), "p");
    let exec = Executor::builder()
        .local_workers(2)
        .chunking(Chunking::Size(10))
        .snapshot_store(store.clone())
        .shutdown_timeout(timeout)
        .build()
        .unwrap();
    let handle = exec.submit(Short).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let _request = handle.snapshot();
    while !handle.progress().ended {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(latest(&store).is_none(), "the write is still in flight");
    (exec, store, handle)
}

/// The latest committed snapshot of [`Short`] in `store`.
fn latest(store: &Store) -> Option<malleable::snapshot::SnapshotId> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(store.latest(Short::NAME)).unwrap()
}

#[test]
fn dropping_the_executor_lets_a_snapshot_write_finish() {
    let (exec, store, _handle) = ended_with_a_write_in_flight(Duration::from_secs(30));
    drop(exec);
    assert!(
        latest(&store).is_some(),
        "the snapshot being written when the executor was dropped was not committed"
    );
}

#[test]
fn shutdown_lets_a_snapshot_write_finish() {
    let (exec, store, _handle) = ended_with_a_write_in_flight(Duration::from_secs(30));
    exec.shutdown().unwrap();
    assert!(
        latest(&store).is_some(),
        "the snapshot being written at shutdown was not committed"
    );
}

#[test]
fn shutdown_says_what_it_abandoned_at_its_limit() {
    let (exec, _store, _handle) = ended_with_a_write_in_flight(Duration::from_millis(50));
    match exec.shutdown() {
        Err(e @ Error::ShutdownTimedOut { writes: 1.., .. }) => {
            assert!(e.to_string().contains("snapshot write"), "{e}");
        }
        other => panic!("expected ShutdownTimedOut with a write, got {other:?}"),
    }
}

/// `wait` hands out the outcome of a job that ended while a snapshot was being written only
/// once that write has committed (or failed): a program that removes its snapshots after
/// `wait` leaves none behind. `is_finished` says so until then.
#[test]
fn wait_returns_after_the_snapshot_write_in_flight() {
    let (_exec, store, handle) = ended_with_a_write_in_flight(Duration::from_secs(30));
    assert!(!handle.is_finished(), "the write is still in flight");
    match handle.clone().wait().unwrap() {
        Outcome::Finished(f) => assert_eq!(f.value, 80),
        other => panic!("{other:?}"),
    }
    assert!(latest(&store).is_some(), "wait returned before the commit");
    assert!(handle.is_finished());
}
