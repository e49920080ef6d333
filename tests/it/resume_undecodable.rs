//! A chunk state restored from a snapshot that does not decode where its chunk runs ends the
//! resumed job with an error that names the snapshot and what was decoded
//! (`snapshot::Error::Undecodable`, "a chunk state"), with the codec's error as its source:
//! on a local worker thread, and in a worker process. It ended with `Error::Codec`, which
//! named no snapshot.
//!
//! The chunk type's `Deserialize` is custom and refuses, behind a switch, the states of the
//! job that wrote the snapshot: what a changed `Deserialize` does to old bytes. Its serde
//! layout is the same either way, so the snapshot passes the layout check of the resume and
//! its states are decoded only where their chunks run. The switch is a tag: each test's job
//! carries its own, refused on its own, so the tests of this module can run side by side in
//! one process.
//!
//! A job with owned partitions also decodes, at its end, the partitions it gathers: one
//! that finished its phase before the snapshot was taken is still the snapshot's bytes there
//! ([`a_restored_partition_that_does_not_decode_when_gathered_names_the_snapshot`]).
//!
//! The worker process is this test binary, re-executed to run [`worker_process`], which
//! refuses the remote test's tag.

use crate::common;

use std::ops::Range;
use std::path::PathBuf;
use std::process::Child;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{chain, procs};
use malleable::cluster::{Registry, WorkerOptions};
use malleable::reduce::Sum;
use malleable::snapshot::{self, SnapshotId, Store};
use malleable::{
    At, Chunk, Chunking, Error, Executor, Job, JobHandle, Next, Outcome, Ownership, Partition, Step,
};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize};

/// Set in a worker process: the coordinator's address.
const ADDR_ENV: &str = "MALLEABLE_TEST_RESUME_UNDECODABLE_ADDR";
const CHUNKING: Chunking = Chunking::Count(4);
/// Iterations of the job.
const N: u64 = 4000;
/// Iterations per step (a step sleeps 1 ms: a chunk takes about 100 ms).
const PER_STEP: u64 = 10;
/// The tag of the local test's job.
const LOCAL_TAG: u64 = 7;
/// The tag of the remote test's job.
const REMOTE_TAG: u64 = 8;
/// The tag of the gathering test's job.
const GATHER_TAG: u64 = 9;
/// The tag of the barrier test's job.
const BARRIER_TAG: u64 = 10;
/// How long any wait of these tests may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(30);

/// The tags whose chunk states this process refuses to decode, one bit each. Layout
/// tracing decodes a tag of 1, which is never refused.
static REFUSED: AtomicU64 = AtomicU64::new(0);

/// Refuses (or reads again) the chunk states of `tag` in this process.
fn refuse(tag: u64, on: bool) {
    if on {
        REFUSED.fetch_or(1 << tag, Ordering::SeqCst);
    } else {
        REFUSED.fetch_and(!(1 << tag), Ordering::SeqCst);
    }
}

/// Whether the chunk states of `tag` are refused.
fn refused(tag: u64) -> bool {
    tag < 64 && REFUSED.load(Ordering::SeqCst) & (1 << tag) != 0
}

/// Sums `0..n`; `tag` goes into every chunk state.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Fickle {
    n: u64,
    tag: u64,
}

/// The state the chunks of both jobs keep: the sum of `start..next` so far, of a range that
/// ends at `end`; `tag` is the job's.
#[derive(Debug, Serialize, Deserialize)]
struct Span {
    tag: u64,
    next: u64,
    end: u64,
    acc: u64,
}

impl Span {
    fn new(tag: u64, range: Range<u64>) -> Span {
        Span {
            tag,
            next: range.start,
            end: range.end,
            acc: 0,
        }
    }

    /// Adds up to [`PER_STEP`] more iterations.
    fn step(&mut self) -> Step<u64> {
        let stop = self.end.min(self.next + PER_STEP);
        self.acc += (self.next..stop).sum::<u64>();
        self.next = stop;
        if self.next == self.end {
            Step::Done(self.acc)
        } else {
            Step::Yield
        }
    }

    /// Decodes a span with the derived code (the layout is unchanged), and refuses it,
    /// naming it `what`, if `refuse` says so.
    fn read<'de, D: Deserializer<'de>>(
        d: D,
        what: &str,
        refuse: impl FnOnce(&Span) -> bool,
    ) -> Result<Span, D::Error> {
        let span = Span::deserialize(d)?;
        if refuse(&span) {
            return Err(D::Error::custom(format!(
                "{what} of tag {} are no longer read",
                span.tag
            )));
        }
        Ok(span)
    }
}

/// A chunk state whose `Deserialize` refuses the tags in [`REFUSED`].
#[derive(Debug, Serialize)]
struct FickleChunk(Span);

impl<'de> Deserialize<'de> for FickleChunk {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Span::read(d, "chunk states", |s| refused(s.tag)).map(FickleChunk)
    }
}

impl Job for Fickle {
    const NAME: &'static str = "resume-undecodable";
    type Chunk = FickleChunk;
    type Reducer = Sum<u64>;
    type Input = ();
    fn iterations(&self) -> u64 {
        self.n
    }
    fn chunk(&self, range: Range<u64>) -> FickleChunk {
        FickleChunk(Span::new(self.tag, range))
    }
    fn reducer(&self) -> Sum<u64> {
        Sum::new()
    }
}

impl Chunk for FickleChunk {
    type Job = Fickle;
    type Output = u64;
    fn step(&mut self, _job: &Fickle, _input: &()) -> Step<u64> {
        std::thread::sleep(Duration::from_millis(1));
        self.0.step()
    }
}

/// Sums `0..n` over owned partitions in one phase, and gathers them at its end; `tag` goes
/// into every partition.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Gathered {
    n: u64,
    tag: u64,
    /// Phases to run (the partitions begin each phase after the first as they ended it).
    phases: u64,
    done: u64,
}

/// A partition whose `Deserialize` refuses, of the tags in [`REFUSED`], those that finished
/// their phase (the others decode). The first one is quick, the others take about 100 ms.
#[derive(Debug, Serialize)]
struct Band(Span);

impl<'de> Deserialize<'de> for Band {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Span::read(d, "finished partitions", |s| {
            refused(s.tag) && s.next == s.end
        })
        .map(Band)
    }
}

impl Job for Gathered {
    const NAME: &'static str = "resume-undecodable-gathered";
    const OWNERSHIP: Ownership<Self> = Ownership::PARTITIONS;
    type Chunk = Band;
    type Reducer = Sum<u64>;
    type Input = ();
    fn iterations(&self) -> u64 {
        self.n
    }
    fn chunk(&self, range: Range<u64>) -> Band {
        Band(Span::new(self.tag, range))
    }
    fn reducer(&self) -> Sum<u64> {
        Sum::new()
    }
    fn end_phase(&mut self, _: &u64) -> Next {
        self.done += 1;
        if self.done < self.phases {
            Next::Continue
        } else {
            Next::Finish
        }
    }
}

impl Chunk for Band {
    type Job = Gathered;
    type Output = u64;
    fn step(&mut self, _job: &Gathered, _input: &()) -> Step<u64> {
        if self.0.end > N / 4 {
            std::thread::sleep(Duration::from_millis(1));
        }
        self.0.step()
    }
}

impl Partition for Band {
    type Halo = ();
    fn export(&self, _job: &Gathered) -> ((), ()) {
        ((), ())
    }
    fn begin_phase(&mut self, _job: &Gathered, _before: Option<()>, _after: Option<()>) {}
    fn gather_at_end(_job: &Gathered) -> bool {
        true
    }
}

/// The entry point of worker processes: refuses the remote test's states, serves one job.
#[test]
#[ignore = "the body of the worker processes the other tests start"]
fn worker_process() {
    let Ok(addr) = std::env::var(ADDR_ENV) else {
        return;
    };
    refuse(REMOTE_TAG, true);
    let registry = Registry::new().register::<Fickle>();
    let options = WorkerOptions::from_env().unwrap().threads(1);
    procs::serve_and_exit(&addr, &registry, options, PATIENCE);
}

/// A worker process, killed if it is still running when the test lets go of it.
struct Worker(Child);

impl Drop for Worker {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

/// Polls `cond` every 5 ms; fails the test after [`PATIENCE`].
fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < PATIENCE,
            "timed out after {PATIENCE:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A fresh store folder for test `name`: its URL and its path.
fn folder(name: &str) -> (String, PathBuf) {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("resume-undecodable-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    (format!("file://{}", dir.display()), dir)
}

/// The job of `tag` run by local workers and suspended while its chunks are in the middle
/// of their ranges: the snapshot, checked to hold chunk states.
fn suspended(url: &str, job_id: &str, tag: u64) -> SnapshotId {
    let exec = Executor::builder()
        .local_workers(2)
        .chunking(CHUNKING)
        .snapshots(url)
        .job_id(job_id)
        .build()
        .unwrap();
    let h = exec.submit(Fickle { n: N, tag }).unwrap();
    until("the job's progress", || h.progress().done > 0);
    let id = h.suspend().wait().unwrap();
    until("the job's suspension", || h.is_finished());
    match h.wait() {
        Ok(Outcome::Suspended(s)) => assert_eq!(s, id),
        Ok(_) => panic!("the job ended before it was suspended"),
        Err(e) => panic!("the job failed: {}", chain(&e).join(": ")),
    }
    let store = Store::open(url).unwrap();
    let manifest = futures::executor::block_on(store.manifest(&id)).unwrap();
    assert!(
        !manifest.parts.is_empty(),
        "the snapshot holds no chunk state"
    );
    id
}

/// The error a run ended with: polled until the handle reports the end (with no local
/// worker, `wait` would make this thread an inline worker).
fn failure(h: JobHandle<Fickle>, what: &str) -> Error {
    until(&format!("the end of the {what} run"), || h.is_finished());
    match h.wait() {
        Err(e) => e,
        Ok(Outcome::Finished(f)) => panic!("the {what} run finished with {}", f.value),
        Ok(_) => panic!("the {what} run ended without an error"),
    }
}

/// `e` is the `Undecodable` of a chunk state of snapshot `id`, with the codec's error as its
/// source.
fn assert_names_the_snapshot(e: &Error, id: &SnapshotId) {
    let texts = chain(e);
    match e {
        Error::Snapshot(snapshot::Error::Undecodable {
            snapshot,
            what,
            source,
        }) => {
            assert_eq!((snapshot, *what), (id, "a chunk state"), "{texts:?}");
            assert_eq!(*source, postcard::Error::SerdeDeCustom, "{texts:?}");
        }
        other => panic!("expected the snapshot's Undecodable, got {other:?} ({texts:?})"),
    }
    assert_eq!(
        texts[0],
        format!("cannot decode a chunk state of snapshot {id} as this program's type")
    );
    let source = std::error::Error::source(e).expect("the codec's error is the source");
    assert_eq!(
        source.downcast_ref::<postcard::Error>(),
        Some(&postcard::Error::SerdeDeCustom)
    );
}

#[test]
fn a_restored_state_that_does_not_decode_on_a_local_worker_names_the_snapshot() {
    let (url, dir) = folder("local");
    let job_id = format!("local-{}", std::process::id());
    let id = suspended(&url, &job_id, LOCAL_TAG);

    // The chunk's `Deserialize` no longer reads those states: the resume starts (the
    // layout is the same) and the first worker that decodes one ends the job.
    refuse(LOCAL_TAG, true);
    let exec = Executor::builder()
        .local_workers(2)
        .job_id(&job_id)
        .build()
        .unwrap();
    let h = exec.resume::<Fickle>(&url, At::Latest).unwrap();
    assert_eq!(h.resumed().unwrap().from, id);
    let e = failure(h, "local");
    assert_names_the_snapshot(&e, &id);

    // Nothing was damaged: read again, the same snapshot resumes to the right sum.
    refuse(LOCAL_TAG, false);
    let h = exec.resume::<Fickle>(&url, At::Latest).unwrap();
    assert_eq!(h.resumed().unwrap().from, id);
    let value = h.wait().unwrap().finished().unwrap().value;
    assert_eq!(value, (0..N).sum::<u64>());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_restored_state_that_does_not_decode_in_a_worker_process_names_the_snapshot() {
    let (url, dir) = folder("remote");
    let job_id = format!("remote-{}", std::process::id());
    let id = suspended(&url, &job_id, REMOTE_TAG);

    // Resumed with no local worker: the worker process runs every restored chunk, and
    // refuses their states.
    let exec = Executor::builder()
        .local_workers(0)
        .job_id(&job_id)
        .listen("127.0.0.1:0")
        .build()
        .unwrap();
    let h = exec.resume::<Fickle>(&url, At::Latest).unwrap();
    let addr = exec
        .local_addr()
        .expect("the coordinator listens")
        .to_string();
    let _worker = Worker(procs::start_worker(module_path!(), ADDR_ENV, &addr));
    let e = failure(h, "remote");
    assert_names_the_snapshot(&e, &id);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_restored_partition_that_does_not_decode_when_gathered_names_the_snapshot() {
    restored_partition_names_the_snapshot("gathered", GATHER_TAG, 1);
}

/// The same partition in a job of two phases is decoded by the coordinator at the first
/// barrier, to begin the second phase: the same error.
#[test]
fn a_restored_partition_that_does_not_decode_at_a_barrier_names_the_snapshot() {
    restored_partition_names_the_snapshot("barrier", BARRIER_TAG, 2);
}

fn restored_partition_names_the_snapshot(name: &str, tag: u64, phases: u64) {
    let (url, dir) = folder(name);
    let job_id = format!("{name}-{}", std::process::id());
    let exec = Executor::builder()
        .local_workers(2)
        .chunking(CHUNKING)
        .snapshots(&url)
        .job_id(&job_id)
        .build()
        .unwrap();

    // Suspended once the quick first partition finished its phase, the others not.
    let h = exec
        .submit(Gathered {
            n: N,
            tag,
            phases,
            done: 0,
        })
        .unwrap();
    until("the first partition's end", || h.progress().done >= N / 4);
    let id = h.suspend().wait().unwrap();
    until("the job's suspension", || h.is_finished());
    assert!(matches!(h.wait(), Ok(Outcome::Suspended(_))));
    let store = Store::open(&url).unwrap();
    let manifest = futures::executor::block_on(store.manifest(&id)).unwrap();
    assert!(
        manifest.kept.iter().any(|p| p.chunk == 0),
        "the snapshot holds the finished first partition"
    );
    assert!(
        manifest.kept.len() < 4,
        "the snapshot was taken before every partition finished"
    );

    // The partitions that had not finished decode and run; the finished one is still the
    // snapshot's bytes when the job gathers it, and does not decode.
    refuse(tag, true);
    let h = exec.resume::<Gathered>(&url, At::Latest).unwrap();
    let e = match h.wait() {
        Err(e) => e,
        Ok(_) => panic!("the resumed job ended without an error"),
    };
    assert_names_the_snapshot(&e, &id);
    refuse(tag, false);
    let _ = std::fs::remove_dir_all(&dir);
}
