//! A coordinator's program that returns right after [`JobHandle::wait`] does not cut its
//! worker processes off: each is sent `End` and exits normally. It used to be a race: the
//! executor's I/O runtime was shut down in the background as the program exited, the queued
//! `End` frames were dropped, and some worker processes reported `Closed` for a job that had
//! finished (12 of 60 in the report).
//!
//! The coordinator program is this test binary, re-executed to run [`coordinator_process`];
//! its worker processes are the binary again, running [`worker_process`] (both ignored
//! tests, so a normal run skips them).
//!
//! [`JobHandle::wait`]: malleable::JobHandle::wait

use std::io::{BufRead, BufReader, Read};
use std::ops::Range;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use malleable::cluster::{self, Registry, TOKEN_ENV, WorkerOptions};
use malleable::reduce::Sum;
use malleable::{Chunk, Chunking, Executor, Job, Next, Outcome, Step};
use serde::{Deserialize, Serialize};

/// Set in a coordinator process.
const COORDINATOR_ENV: &str = "MALLEABLE_TEST_SHUTDOWN_COORDINATOR";
/// Set in a worker process: the coordinator's address.
const ADDR_ENV: &str = "MALLEABLE_TEST_SHUTDOWN_ADDR";
/// Coordinator programs run one after the other.
const RUNS: usize = 20;
/// Worker processes of each.
const WORKERS: usize = 3;
/// How long any process of a run may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(20);

/// Set in the coordinator process once every worker process has joined: the job ends at the
/// next phase barrier.
static GO: AtomicBool = AtomicBool::new(false);

/// Short phases until [`GO`]: the job lasts until its worker processes have joined, then
/// ends at once.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Phases {
    phase: u64,
}

#[derive(Serialize, Deserialize)]
struct PhasesChunk {
    next: u64,
    end: u64,
}

impl Job for Phases {
    const NAME: &'static str = "cluster-shutdown-phases";
    type Chunk = PhasesChunk;
    type Reducer = Sum<u64>;
    type Input = ();
    fn iterations(&self) -> u64 {
        64
    }
    fn chunk(&self, range: Range<u64>) -> PhasesChunk {
        PhasesChunk {
            next: range.start,
            end: range.end,
        }
    }
    fn reducer(&self) -> Sum<u64> {
        Sum::new()
    }
    fn end_phase(&mut self, _value: &u64) -> Next {
        self.phase += 1;
        if GO.load(Ordering::Relaxed) {
            Next::Finish
        } else {
            Next::Continue
        }
    }
}

impl Chunk for PhasesChunk {
    type Job = Phases;
    type Output = u64;
    fn step(&mut self, _job: &Phases, _input: &()) -> Step<u64> {
        std::thread::sleep(Duration::from_micros(200));
        self.next += 1;
        if self.next >= self.end {
            Step::Done(1)
        } else {
            Step::Yield
        }
    }
}

/// The coordinator's program: a short job with worker processes; it returns right after
/// `wait`, and the process exits.
#[test]
#[ignore = "the body of the coordinator processes the other test starts"]
fn coordinator_process() {
    if std::env::var_os(COORDINATOR_ENV).is_none() {
        return;
    }
    let exec = Executor::builder()
        .local_workers(1)
        .chunking(Chunking::Size(8))
        .listen("127.0.0.1:0")
        .build()
        .unwrap();
    let handle = exec.submit(Phases { phase: 0 }).unwrap();
    println!("ADDR {}", exec.local_addr().unwrap());
    let start = Instant::now();
    while handle.progress().remote_workers < WORKERS {
        assert!(
            start.elapsed() < PATIENCE,
            "the worker processes did not join"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    GO.store(true, Ordering::Relaxed);
    match handle.wait().unwrap() {
        Outcome::Finished(f) => assert_eq!(f.value, 64 / 8),
        other => panic!("{other:?}"),
    }
}

/// A worker process: serves the job; exits with 0 if it served it to its end, else prints
/// the error and exits with 3.
#[test]
#[ignore = "the body of the worker processes the other test starts"]
fn worker_process() {
    let Ok(addr) = std::env::var(ADDR_ENV) else {
        return;
    };
    let registry = Registry::new().register::<Phases>();
    match cluster::serve(&addr, &registry, WorkerOptions::default().threads(1)) {
        Ok(_) => std::process::exit(0),
        Err(e) => {
            println!("WORKER ERROR {e:?}: {e}");
            std::process::exit(3);
        }
    }
}

/// This test binary, running one of its ignored tests.
fn child(test: &str, env: (&str, &str)) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            crate::common::exact(module_path!(), test).as_str(),
            "--ignored",
            "--nocapture",
        ])
        .args(["--test-threads", "1"])
        .env(env.0, env.1)
        .env_remove(TOKEN_ENV)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start a process")
}

/// Waits up to [`PATIENCE`] for `child` to exit; its status (killed if it did not exit) and
/// output.
fn finish(mut child: Child) -> (Option<std::process::ExitStatus>, String) {
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if start.elapsed() > PATIENCE {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let mut out = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut out);
    }
    (status, out)
}

#[test]
fn workers_of_a_program_that_returns_after_wait_end_normally() {
    let mut failures = Vec::new();
    for run in 0..RUNS {
        let mut coordinator = child("coordinator_process", (COORDINATOR_ENV, "1"));
        let mut lines = BufReader::new(coordinator.stdout.take().unwrap()).lines();
        let addr = lines
            .by_ref()
            .map_while(Result::ok)
            // The test harness may have started the line with the test's name.
            .find_map(|l| Some(l[l.find("ADDR ")? + 5..].trim().to_owned()))
            .expect("the coordinator's address");
        let workers: Vec<Child> = (0..WORKERS)
            .map(|_| child("worker_process", (ADDR_ENV, &addr)))
            .collect();
        let (status, _) = finish(coordinator);
        assert!(
            status.is_some_and(|s| s.success()),
            "run {run}: the coordinator program failed: {status:?}"
        );
        for (w, worker) in workers.into_iter().enumerate() {
            let (status, out) = finish(worker);
            if !status.is_some_and(|s| s.success()) {
                failures.push(format!("run {run}, worker {w}: {status:?} {}", out.trim()));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} worker processes did not end normally:\n{}",
        failures.len(),
        RUNS * WORKERS,
        failures.join("\n")
    );
}
