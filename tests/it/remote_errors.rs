//! A chunk lost to the job's own code in a worker process reaches the user as the same
//! [`Error`] variant, with the same fields, as when a local worker loses it: a panic in
//! `Chunk::step`, an `Input::load` that returns an error or panics, a chunk state restored
//! from a snapshot that does not decode (named with its snapshot). Each job runs once with local workers only and once with one worker process
//! only (real processes and sockets on loopback), and the two errors are compared.
//!
//! Worker processes are this test binary, re-executed to run [`worker_process`] (an ignored
//! test, so a normal run skips it) with the coordinator's address in [`ADDR_ENV`].

use crate::common;

use std::io::Read;
use std::ops::Range;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::chain;
use malleable::cluster::{self, Registry, TOKEN_ENV, WorkerOptions};
use malleable::reduce::Sum;
use malleable::{
    At, BoxError, Chunk, Chunking, Error, Executor, Input, Job, JobHandle, Next, Outcome, Site,
    Step,
};
use serde::{Deserialize, Serialize};

/// Set in a worker process: the coordinator's address.
const ADDR_ENV: &str = "MALLEABLE_TEST_WORKER_ADDR";
const CHUNK: u64 = 500;
const CHUNKING: Chunking = Chunking::Size(CHUNK);
/// Iterations per step.
const PER_STEP: u64 = 50;
/// How long any wait of these tests may take before the test fails: every run here takes
/// well under a second.
const PATIENCE: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------
// The jobs.

/// A chunk's progress through its range: a sum of the iterations.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Counter {
    next: u64,
    end: u64,
    acc: u64,
}

impl Counter {
    fn new(range: Range<u64>) -> Counter {
        Counter {
            next: range.start,
            end: range.end,
            acc: 0,
        }
    }

    /// Runs up to [`PER_STEP`] iterations, calling `each` on each.
    fn step(&mut self, mut each: impl FnMut(u64)) -> Step<u64> {
        let stop = self.end.min(self.next + PER_STEP);
        for i in self.next..stop {
            each(i);
            self.acc += i;
        }
        self.next = stop;
        if self.next == self.end {
            Step::Done(self.acc)
        } else {
            Step::Yield
        }
    }
}

/// Case 1: two phases; `Chunk::step` panics at iteration [`PANIC_AT`] of phase
/// [`PANIC_PHASE`].
#[derive(Debug, Clone, Serialize, Deserialize)]
struct StepPanics {
    n: u64,
    phase: u64,
}

const PANIC_PHASE: u64 = 1;
const PANIC_AT: u64 = 1234;

#[derive(Serialize, Deserialize)]
struct StepPanicsChunk(Counter);

impl Job for StepPanics {
    const NAME: &'static str = "remote-errors-step-panics";
    type Chunk = StepPanicsChunk;
    type Reducer = Sum<u64>;
    type Input = ();
    fn iterations(&self) -> u64 {
        self.n
    }
    fn chunk(&self, range: Range<u64>) -> StepPanicsChunk {
        StepPanicsChunk(Counter::new(range))
    }
    fn reducer(&self) -> Sum<u64> {
        Sum::new()
    }
    fn end_phase(&mut self, _value: &u64) -> Next {
        self.phase += 1;
        if self.phase < 2 {
            Next::Continue
        } else {
            Next::Finish
        }
    }
}

impl Chunk for StepPanicsChunk {
    type Job = StepPanics;
    type Output = u64;
    fn step(&mut self, job: &StepPanics, _input: &()) -> Step<u64> {
        self.0.step(|i| {
            if job.phase == PANIC_PHASE && i == PANIC_AT {
                panic!("the step exploded at iteration {i} of phase {}", job.phase);
            }
        })
    }
}

/// Case 2: `Input::load` returns an error with a cause.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct InputFails {
    n: u64,
}

#[derive(Serialize, Deserialize)]
struct InputFailsChunk(Counter);

/// The loader's error: what it was doing, with the I/O error as its source.
#[derive(Debug)]
struct Loading {
    path: &'static str,
    source: std::io::Error,
}

impl std::fmt::Display for Loading {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cannot load the table {}", self.path)
    }
}

impl std::error::Error for Loading {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

const TABLE: &str = "/nonexistent/remote-errors/table.bin";

struct Table;

impl Input<InputFails> for Table {
    fn load(_job: &InputFails) -> Result<Table, BoxError> {
        Err(Box::new(Loading {
            path: TABLE,
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such table file"),
        }))
    }
}

impl Job for InputFails {
    const NAME: &'static str = "remote-errors-input-fails";
    type Chunk = InputFailsChunk;
    type Reducer = Sum<u64>;
    type Input = Table;
    fn iterations(&self) -> u64 {
        self.n
    }
    fn chunk(&self, range: Range<u64>) -> InputFailsChunk {
        InputFailsChunk(Counter::new(range))
    }
    fn reducer(&self) -> Sum<u64> {
        Sum::new()
    }
}

impl Chunk for InputFailsChunk {
    type Job = InputFails;
    type Output = u64;
    fn step(&mut self, _job: &InputFails, _input: &Table) -> Step<u64> {
        self.0.step(|_| {})
    }
}

/// Case 3: `Input::load` panics.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct InputPanics {
    n: u64,
}

#[derive(Serialize, Deserialize)]
struct InputPanicsChunk(Counter);

const LOADER_PANIC: &str = "the loader exploded";

struct Exploding;

impl Input<InputPanics> for Exploding {
    fn load(_job: &InputPanics) -> Result<Exploding, BoxError> {
        panic!("{LOADER_PANIC}");
    }
}

impl Job for InputPanics {
    const NAME: &'static str = "remote-errors-input-panics";
    type Chunk = InputPanicsChunk;
    type Reducer = Sum<u64>;
    type Input = Exploding;
    fn iterations(&self) -> u64 {
        self.n
    }
    fn chunk(&self, range: Range<u64>) -> InputPanicsChunk {
        InputPanicsChunk(Counter::new(range))
    }
    fn reducer(&self) -> Sum<u64> {
        Sum::new()
    }
}

impl Chunk for InputPanicsChunk {
    type Job = InputPanics;
    type Output = u64;
    fn step(&mut self, _job: &InputPanics, _input: &Exploding) -> Step<u64> {
        self.0.step(|_| {})
    }
}

/// Case 4, the job that writes the snapshot: its chunk states start with a `u64`, and its
/// steps sleep (50 ms a chunk) so that chunks are in the middle of their range when it is
/// suspended.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct StatesA {
    n: u64,
}

/// Case 4, the job that resumes it: the same name, job value, reducer and outputs, but its
/// chunk states start with a `String`. `A`'s first field, `u64::MAX`, reads as the length of
/// that string, far more than the bytes there are: an `A` state never decodes as a `B` one.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct StatesB {
    n: u64,
}

const STATES: &str = "remote-errors-states";

#[derive(Debug, Serialize, Deserialize)]
struct StatesAChunk {
    marker: u64,
    counter: Counter,
}

#[derive(Debug, Serialize, Deserialize)]
struct StatesBChunk {
    label: String,
    counter: Counter,
}

impl Job for StatesA {
    const NAME: &'static str = STATES;
    type Chunk = StatesAChunk;
    type Reducer = Sum<u64>;
    type Input = ();
    fn iterations(&self) -> u64 {
        self.n
    }
    fn chunk(&self, range: Range<u64>) -> StatesAChunk {
        StatesAChunk {
            marker: u64::MAX,
            counter: Counter::new(range),
        }
    }
    fn reducer(&self) -> Sum<u64> {
        Sum::new()
    }
}

impl Chunk for StatesAChunk {
    type Job = StatesA;
    type Output = u64;
    fn step(&mut self, _job: &StatesA, _input: &()) -> Step<u64> {
        std::thread::sleep(Duration::from_millis(5));
        self.counter.step(|_| {})
    }
}

impl Job for StatesB {
    const NAME: &'static str = STATES;
    type Chunk = StatesBChunk;
    type Reducer = Sum<u64>;
    type Input = ();
    fn iterations(&self) -> u64 {
        self.n
    }
    fn chunk(&self, range: Range<u64>) -> StatesBChunk {
        StatesBChunk {
            label: "b".to_owned(),
            counter: Counter::new(range),
        }
    }
    fn reducer(&self) -> Sum<u64> {
        Sum::new()
    }
}

impl Chunk for StatesBChunk {
    type Job = StatesB;
    type Output = u64;
    fn step(&mut self, _job: &StatesB, _input: &()) -> Step<u64> {
        self.counter.step(|_| {})
    }
}

// ---------------------------------------------------------------------------------------
// Worker processes.

/// The entry point of worker processes: serves the jobs of this file on one thread.
#[test]
#[ignore = "the body of the worker processes the other tests start"]
fn worker_process() {
    let Ok(addr) = std::env::var(ADDR_ENV) else {
        return;
    };
    let registry = Registry::new()
        .register::<StepPanics>()
        .register::<InputFails>()
        .register::<InputPanics>()
        .register::<StatesB>();
    let options = WorkerOptions::from_env().unwrap().threads(1);
    match cluster::serve(&addr, &registry, options) {
        Ok(served) => {
            println!(
                "SERVED job={} done={} yielded={}",
                served.job, served.chunks_done, served.chunks_yielded
            );
            std::process::exit(0);
        }
        Err(e) => {
            println!("WORKER ERROR {}", chain(&e).join(": "));
            std::process::exit(3);
        }
    }
}

/// A worker process (this binary) dialling a coordinator; killed if the test lets go of it
/// before it exits.
struct Worker {
    child: Child,
}

impl Worker {
    fn start(exec: &Executor) -> Worker {
        let addr = exec
            .local_addr()
            .expect("the coordinator listens")
            .to_string();
        let child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                crate::common::exact(module_path!(), "worker_process").as_str(),
                "--ignored",
                "--nocapture",
            ])
            .args(["--test-threads", "1"])
            .env(ADDR_ENV, addr)
            .env_remove(TOKEN_ENV)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start a worker process");
        Worker { child }
    }

    /// Waits (up to [`PATIENCE`]) for the process to exit, and checks that it served the job
    /// to its end.
    fn assert_served(mut self, what: &str) {
        let start = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(
                start.elapsed() < PATIENCE,
                "{what}: the worker process did not exit within {PATIENCE:?} of the job's end"
            );
            std::thread::sleep(Duration::from_millis(5));
        };
        let mut out = String::new();
        let _ = self.child.stdout.take().unwrap().read_to_string(&mut out);
        let line = out
            .lines()
            .find_map(|l| {
                let at = l.find("SERVED").or_else(|| l.find("WORKER ERROR"))?;
                Some(&l[at..])
            })
            .unwrap_or_default();
        assert!(
            status.success() && line.starts_with("SERVED"),
            "{what}: the worker process ended with {status}: {line:?}"
        );
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

// ---------------------------------------------------------------------------------------
// Running a job both ways.

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

/// The error the job ended with. The handle must report the end first: with no local
/// worker, `wait` would make this thread an inline worker, so it is called only once the
/// job has ended (and the poll guards local runs against a hang too).
fn failure<J: Job>(h: JobHandle<J>, what: &str) -> Error {
    until(&format!("the end of the {what} run"), || h.is_finished());
    match h.wait() {
        Err(e) => e,
        Ok(Outcome::Finished(_)) => panic!("the {what} run finished without an error"),
        Ok(Outcome::Suspended(id)) => panic!("the {what} run was suspended to {id}"),
        Ok(_) => panic!("the {what} run ended without an error"),
    }
}

/// A coordinator with local workers only.
fn local() -> malleable::Builder {
    Executor::builder().local_workers(2).chunking(CHUNKING)
}

/// A coordinator with no local worker, listening on loopback.
fn remote() -> malleable::Builder {
    Executor::builder()
        .local_workers(0)
        .chunking(CHUNKING)
        .listen("127.0.0.1:0")
}

/// The error of `job` run by local workers.
fn run_local<J: Job>(job: J) -> Error {
    let exec = local().build().unwrap();
    failure(exec.submit(job).unwrap(), "local")
}

/// The error of `job` run by one worker process.
fn run_remote<J: Job>(job: J) -> Error {
    let exec = remote().build().unwrap();
    let h = exec.submit(job).unwrap();
    let worker = Worker::start(&exec);
    let e = failure(h, "remote");
    worker.assert_served("remote");
    e
}

/// What a test compares of an error: its variant and fields (a source as its chain of texts,
/// or the codec's error itself).
#[derive(Debug, PartialEq)]
enum Seen {
    Panicked {
        job: &'static str,
        site: Site,
        message: String,
    },
    Input {
        job: &'static str,
        source: Vec<String>,
    },
    Codec {
        what: &'static str,
        source: postcard::Error,
    },
    /// A value of a snapshot that does not decode, named with the snapshot.
    Undecodable {
        snapshot: malleable::snapshot::SnapshotId,
        what: &'static str,
        source: postcard::Error,
    },
}

fn seen(e: &Error) -> Seen {
    match e {
        Error::Panicked { job, site, message } => Seen::Panicked {
            job,
            site: site.clone(),
            message: message.clone(),
        },
        Error::Input { job, source } => Seen::Input {
            job,
            source: chain(&**source),
        },
        Error::Codec { what, source } => Seen::Codec {
            what,
            source: source.clone(),
        },
        Error::Snapshot(malleable::snapshot::Error::Undecodable {
            snapshot,
            what,
            source,
        }) => Seen::Undecodable {
            snapshot: snapshot.clone(),
            what,
            source: source.clone(),
        },
        other => panic!(
            "not an error of the job's code: {other:?} ({})",
            chain(other).join(": ")
        ),
    }
}

/// The two errors are the same variant with the same fields, and read the same.
fn assert_same(local: &Error, remote: &Error) -> Seen {
    let (l, r) = (seen(local), seen(remote));
    assert_eq!(l, r, "local: {local:?}\nremote: {remote:?}");
    assert_eq!(chain(local), chain(remote));
    l
}

// ---------------------------------------------------------------------------------------
// The cases.

#[test]
fn a_panic_in_a_step() {
    let job = StepPanics {
        n: 4 * CHUNK,
        phase: 0,
    };
    let local = run_local(job.clone());
    let remote = run_remote(job);
    let message = format!("the step exploded at iteration {PANIC_AT} of phase {PANIC_PHASE}");
    assert_eq!(
        assert_same(&local, &remote),
        Seen::Panicked {
            job: StepPanics::NAME,
            site: Site::Chunk {
                phase: PANIC_PHASE,
                chunk: PANIC_AT / CHUNK,
            },
            message,
        }
    );
}

#[test]
fn an_input_that_does_not_load() {
    let job = InputFails { n: 4 * CHUNK };
    let local = run_local(job.clone());
    let remote = run_remote(job);
    assert_eq!(
        assert_same(&local, &remote),
        Seen::Input {
            job: InputFails::NAME,
            source: vec![
                format!("cannot load the table {TABLE}"),
                "no such table file".to_owned()
            ],
        }
    );
    assert_eq!(
        chain(&remote)[0],
        format!("job {}: loading its input failed", InputFails::NAME)
    );
}

#[test]
fn an_input_loader_that_panics() {
    let job = InputPanics { n: 4 * CHUNK };
    let local = run_local(job.clone());
    let remote = run_remote(job);
    assert_eq!(
        assert_same(&local, &remote),
        Seen::Panicked {
            job: InputPanics::NAME,
            site: Site::Input,
            message: LOADER_PANIC.to_owned(),
        }
    );
}

#[test]
fn a_chunk_state_that_does_not_decode() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("remote-errors-states-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("file://{}", dir.display());
    let job_id = format!("states-{}", std::process::id());

    // Job A, suspended while its chunks are in the middle of their ranges.
    let exec = local().snapshots(&url).job_id(&job_id).build().unwrap();
    let h = exec.submit(StatesA { n: 16 * CHUNK }).unwrap();
    until("job A's progress", || h.progress().done > 0);
    let id = h.suspend().wait().unwrap();
    until("job A's suspension", || h.is_finished());
    match h.wait() {
        Ok(Outcome::Suspended(s)) => assert_eq!(s, id),
        Ok(_) => panic!("job A ended before it was suspended"),
        Err(e) => panic!("job A failed: {}", chain(&e).join(": ")),
    }

    // Its chunk states are A's and do not decode as B's.
    let store = malleable::snapshot::Store::open(&url).unwrap();
    let manifest = futures::executor::block_on(store.manifest(&id)).unwrap();
    assert!(
        !manifest.parts.is_empty(),
        "the snapshot holds no chunk state"
    );
    let mut undecodable = None;
    for part in &manifest.parts {
        let bytes = futures::executor::block_on(store.get_part(part)).unwrap();
        let a: StatesAChunk = postcard::from_bytes(&bytes).expect("an A state");
        assert_eq!(a.marker, u64::MAX);
        let e = postcard::from_bytes::<StatesBChunk>(&bytes)
            .expect_err("an A state must not decode as a B state");
        undecodable = Some(e);
    }

    // Its layout would refuse B before a byte is decoded (`LayoutChanged`): written without
    // one, as by a build before layouts, or by types that cannot be traced, the states
    // reach the workers, which must fail alike when they decode them.
    let path = dir
        .join(&job_id)
        .join(format!("{:020}", id.epoch))
        .join("manifest");
    let mut rewritten = malleable::snapshot::decode_manifest(&std::fs::read(&path).unwrap())
        .expect("the manifest decodes");
    assert!(rewritten.layout.is_some());
    rewritten.layout = None;
    std::fs::write(&path, malleable::snapshot::encode_manifest(&rewritten)).unwrap();

    // Resumed as B: the restored states end the job when a worker decodes them, with an
    // error that names the snapshot they came from.
    let local_exec = local().job_id(&job_id).build().unwrap();
    let local = failure(
        local_exec
            .resume::<StatesB>(&url, At::Epoch(id.epoch))
            .unwrap(),
        "local",
    );
    let remote_exec = remote().job_id(&job_id).build().unwrap();
    let h = remote_exec
        .resume::<StatesB>(&url, At::Epoch(id.epoch))
        .unwrap();
    let worker = Worker::start(&remote_exec);
    let remote = failure(h, "remote");
    worker.assert_served("remote");
    assert_eq!(
        assert_same(&local, &remote),
        Seen::Undecodable {
            snapshot: id,
            what: "a chunk state",
            source: undecodable.unwrap(),
        }
    );
    let _ = std::fs::remove_dir_all(&dir);
}
