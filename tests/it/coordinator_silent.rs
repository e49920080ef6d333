//! A worker process gives up a coordinator that falls silent: the coordinator (a real
//! executor, in a process of its own) is stopped with SIGSTOP, so its connection stays open
//! but nothing comes from it any more. The worker process must end with
//! [`cluster::Error::LeaseExpired`] within its lease and one heartbeat, although its own
//! heartbeats keep waking its I/O loop (they used to re-arm the lease, and the worker ran on
//! forever). Also when the worker has more to send than the stopped coordinator's socket
//! takes, so that it waits in a write (it used to wait there forever).
//!
//! The coordinator is this test binary, re-executed to run [`coordinator_process`] (an
//! ignored test, so a normal run skips it); the worker is [`cluster::serve`] on a thread of
//! the test itself.

use crate::common;

use std::io::{BufRead, BufReader};
use std::ops::Range;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use malleable::cluster::{self, Registry, TOKEN_ENV, WorkerOptions};
use malleable::reduce::Reducer;
use malleable::reduce::Sum;
use malleable::{Chunk, Chunking, Executor, Job, Step};
use serde::{Deserialize, Serialize};

/// Set in the coordinator process: run [`coordinator_process`].
const COORDINATOR_ENV: &str = "MALLEABLE_TEST_SILENT_COORDINATOR";
/// The coordinator's heartbeat period and lease, which its welcome gives the worker.
const HEARTBEAT: Duration = Duration::from_millis(200);
const LEASE: Duration = Duration::from_secs(1);
/// Scheduling slack on a busy machine, on top of the lease and one heartbeat.
const SLACK: Duration = Duration::from_secs(1);
/// How long the test waits for anything before it fails.
const PATIENCE: Duration = Duration::from_secs(20);

/// A job that runs far longer than the test (the coordinator is killed at the end): each
/// step sleeps a millisecond.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Slow {
    n: u64,
}

#[derive(Serialize, Deserialize)]
struct SlowChunk {
    next: u64,
    end: u64,
}

impl Job for Slow {
    const NAME: &'static str = "coordinator-silent-slow";
    type Chunk = SlowChunk;
    type Reducer = Sum<u64>;
    type Input = ();
    fn iterations(&self) -> u64 {
        self.n
    }
    fn chunk(&self, range: Range<u64>) -> SlowChunk {
        SlowChunk {
            next: range.start,
            end: range.end,
        }
    }
    fn reducer(&self) -> Sum<u64> {
        Sum::new()
    }
}

impl Chunk for SlowChunk {
    type Job = Slow;
    type Output = u64;
    fn step(&mut self, _job: &Slow, _input: &()) -> Step<u64> {
        std::thread::sleep(Duration::from_millis(1));
        self.next += 1;
        if self.next >= self.end {
            Step::Done(1)
        } else {
            Step::Yield
        }
    }
}

/// A job whose chunks each output [`BIG`] bytes, every [`BIG_EVERY`]: a worker process
/// holds two chunks, so a stopped coordinator is owed more than its socket takes.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Big;

/// The output of a [`Big`] chunk.
const BIG: usize = 24 << 20;
/// How long a [`Big`] chunk takes.
const BIG_EVERY: Duration = Duration::from_millis(300);

#[derive(Serialize, Deserialize)]
struct BigChunk {
    steps: u32,
}

/// Keeps nothing: [`Big`]'s outputs only have to cross the wire.
struct Discard;

impl Reducer for Discard {
    type Value = serde_bytes::ByteBuf;
    fn identity(&self) -> serde_bytes::ByteBuf {
        serde_bytes::ByteBuf::new()
    }
    fn combine(&self, _acc: &mut serde_bytes::ByteBuf, _next: serde_bytes::ByteBuf) {}
}

impl Job for Big {
    const NAME: &'static str = "coordinator-silent-big";
    type Chunk = BigChunk;
    type Reducer = Discard;
    type Input = ();
    fn iterations(&self) -> u64 {
        1_000_000
    }
    fn chunk(&self, _range: Range<u64>) -> BigChunk {
        BigChunk { steps: 0 }
    }
    fn reducer(&self) -> Discard {
        Discard
    }
}

impl Chunk for BigChunk {
    type Job = Big;
    type Output = serde_bytes::ByteBuf;
    fn step(&mut self, _job: &Big, _input: &()) -> Step<serde_bytes::ByteBuf> {
        std::thread::sleep(BIG_EVERY / 10);
        self.steps += 1;
        if self.steps == 10 {
            Step::Done(serde_bytes::ByteBuf::from(vec![7; BIG]))
        } else {
            Step::Yield
        }
    }
}

/// The coordinator process: listens on loopback, runs [`Slow`] (or [`Big`], if its variable
/// says `big`) with one local worker, says where it listens (`ADDR …`) and when a worker
/// process has joined (`JOINED`), and waits.
#[test]
#[ignore = "the body of the coordinator process the other test starts"]
fn coordinator_process() {
    let Some(job) = std::env::var_os(COORDINATOR_ENV) else {
        return;
    };
    let exec = Executor::builder()
        .local_workers(1)
        .chunking(Chunking::Size(100))
        .heartbeat(HEARTBEAT, LEASE)
        .listen("127.0.0.1:0")
        .build()
        .unwrap();
    let joined = |remote_workers: &dyn Fn() -> usize| {
        println!("ADDR {}", exec.local_addr().unwrap());
        let start = Instant::now();
        while remote_workers() == 0 {
            assert!(start.elapsed() < PATIENCE, "no worker process joined");
            std::thread::sleep(Duration::from_millis(5));
        }
        println!("JOINED");
    };
    if job == "big" {
        let handle = exec.submit(Big).unwrap();
        joined(&|| handle.progress().remote_workers);
        let _ = handle.wait();
    } else {
        let handle = exec.submit(Slow { n: 10_000_000 }).unwrap();
        joined(&|| handle.progress().remote_workers);
        let _ = handle.wait();
    }
}

/// The coordinator's process, killed when the test lets go of it (also when it fails: a
/// stopped process would otherwise stay behind).
struct Coordinator {
    child: Child,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

impl Coordinator {
    /// Runs the job `job` ("slow" or "big").
    fn start(job: &str) -> Coordinator {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                crate::common::exact(module_path!(), "coordinator_process").as_str(),
                "--ignored",
                "--nocapture",
            ])
            .args(["--test-threads", "1"])
            .env(COORDINATOR_ENV, job)
            .env_remove(TOKEN_ENV)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the coordinator process");
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Coordinator { child, lines }
    }

    /// What follows `tag` on the first line of the coordinator's output that has it.
    fn expect(&mut self, tag: &str) -> String {
        for line in self.lines.by_ref() {
            let line = line.expect("the coordinator's output");
            // The test harness may have started the line with the test's name.
            if let Some(at) = line.find(tag) {
                return line[at + tag.len()..].trim().to_owned();
            }
        }
        panic!("the coordinator process ended before it said {tag}");
    }

    fn signal(&self, signal: libc::c_int) {
        let pid = libc::pid_t::try_from(self.child.id()).unwrap();
        // SAFETY: `kill` only sends a signal to the process `pid`, our own child, which has
        // not been reaped yet (it is reaped in `drop`), so the pid is not reused.
        let sent = unsafe { libc::kill(pid, signal) };
        assert_eq!(sent, 0, "signal {signal} to the coordinator");
    }
}

impl Drop for Coordinator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the coordinator with `job` and a worker process (a thread of this process) for it,
/// stops the coordinator once the worker has joined, and returns how the worker ended and
/// how long after the stop.
fn silenced(job: &str) -> (Result<cluster::Served, cluster::Error>, Duration) {
    let mut coordinator = Coordinator::start(job);
    let addr = coordinator.expect("ADDR");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let registry = Registry::new().register::<Slow>().register::<Big>();
        let options = WorkerOptions::default().threads(1);
        let _ = tx.send((cluster::serve(&addr, &registry, options), Instant::now()));
    });
    coordinator.expect("JOINED");

    // The coordinator stops: its socket stays open, nothing comes from it any more. The
    // clock starts once every thread of it is stopped (one may still send a heartbeat
    // right after the signal).
    coordinator.signal(libc::SIGSTOP);
    let stopping = Instant::now();
    while !common::procs::stopped(coordinator.child.id()) {
        assert!(
            stopping.elapsed() < PATIENCE,
            "the coordinator did not stop in {PATIENCE:?}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let silent_since = Instant::now();
    let (served, at) = rx.recv_timeout(PATIENCE).unwrap_or_else(|_| {
        panic!(
            "the worker process still served a coordinator silent for {PATIENCE:?} \
             (lease {LEASE:?})"
        )
    });
    let gave_up_after = at - silent_since;
    println!("{job}: the worker gave the coordinator up {gave_up_after:?} after it fell silent");
    (served, gave_up_after)
}

/// The worker was given up with `LeaseExpired`, which says the coordinator fell silent.
fn assert_fell_silent(served: Result<cluster::Served, cluster::Error>) {
    let error = served.expect_err("a silent coordinator is an error");
    match &error {
        cluster::Error::LeaseExpired { after, .. } => assert_eq!(*after, LEASE),
        other => panic!("expected LeaseExpired, got {other:?}: {other}"),
    }
    let text = error.to_string();
    assert!(text.contains("fell silent"), "{text}");
}

#[test]
fn a_worker_gives_up_a_coordinator_that_falls_silent() {
    let (served, gave_up_after) = silenced("slow");
    assert_fell_silent(served);
    assert!(
        gave_up_after <= LEASE + HEARTBEAT + SLACK,
        "gave up {gave_up_after:?} after the coordinator fell silent (lease {LEASE:?}, \
         heartbeat {HEARTBEAT:?})"
    );
}

#[test]
fn a_worker_waiting_to_write_gives_up_a_coordinator_that_falls_silent() {
    // The worker's two chunks end within BIG_EVERY of the stop; their outputs fill the
    // socket and the worker waits in a write, which may not move for a lease.
    let (served, gave_up_after) = silenced("big");
    assert_fell_silent(served);
    assert!(
        gave_up_after <= 2 * BIG_EVERY + LEASE + HEARTBEAT + SLACK,
        "gave up {gave_up_after:?} after the coordinator fell silent (lease {LEASE:?})"
    );
}
