//! Remote workers with real processes and real sockets on loopback: workers join in the
//! middle of a phase, leave gracefully, are killed with SIGKILL, all get lost and new ones
//! join; a job suspended with remote workers resumes with local ones only. In every case the
//! value is bit-identical to the sequential computation.
//!
//! Worker processes are this test binary, re-executed to run [`worker_process`] (an ignored
//! test, so a normal run skips it) with the coordinator's address in [`ADDR_ENV`]. Their
//! steps sleep 1 ms ([`PACE_ENV`]), and so do the coordinator's own (see `pace`), so that
//! runs last long enough for workers to come and go in the middle of them.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use malleable::cluster::{self, NODE_ENV, Registry, TOKEN_ENV, WorkerOptions};
use malleable::{Chunking, Executor, Finished, JobHandle, Outcome};

use crate::common;
#[cfg(feature = "s3")]
use crate::support;

use common::walk::{PACE_ENV, Total, Walk, pace};

/// Set in a worker process: the coordinator's address.
const ADDR_ENV: &str = "MALLEABLE_TEST_WORKER_ADDR";
/// Set in a worker process: its thread count.
const THREADS_ENV: &str = "MALLEABLE_TEST_WORKER_THREADS";
const CHUNK: u64 = 500;
const CHUNKING: Chunking = Chunking::Size(CHUNK);

/// The entry point of worker processes: serves the walk job and prints what it did.
#[test]
#[ignore = "the body of the worker processes the other tests start"]
fn worker_process() {
    let Ok(addr) = std::env::var(ADDR_ENV) else {
        return;
    };
    let threads = std::env::var(THREADS_ENV).map_or(1, |t| t.parse().unwrap());
    let options = WorkerOptions::from_env()
        .unwrap()
        .threads(threads)
        .stop_on_signals();
    match cluster::serve(&addr, &Registry::new().register::<Walk>(), options) {
        Ok(served) => {
            println!(
                "SERVED done={} yielded={} left={} parts={}",
                served.chunks_done, served.chunks_yielded, served.left, served.parts_written
            );
            std::process::exit(0);
        }
        Err(e) => {
            println!("WORKER ERROR {e}");
            std::process::exit(3);
        }
    }
}

/// A worker process (this binary) dialling `addr`.
struct Worker {
    child: Child,
}

impl Worker {
    fn start(addr: &str, threads: usize, token: Option<&str>) -> Worker {
        Worker::start_with(addr, threads, token, &[])
    }

    /// A worker process with extra environment variables.
    fn start_with(addr: &str, threads: usize, token: Option<&str>, env: &[(&str, &str)]) -> Worker {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.envs(env.iter().copied());
        cmd.args([
            "--exact",
            crate::common::exact(module_path!(), "worker_process").as_str(),
            "--ignored",
            "--nocapture",
        ])
        .args(["--test-threads", "1"])
        .env(ADDR_ENV, addr)
        .env(THREADS_ENV, threads.to_string())
        .env(PACE_ENV, "1")
        .env_remove(TOKEN_ENV)
        .stdout(Stdio::piped());
        if let Some(t) = token {
            cmd.env(TOKEN_ENV, t);
        }
        Worker {
            child: cmd.spawn().unwrap(),
        }
    }

    /// Waits for the process to exit and returns its exit code and its report line.
    fn finish(mut self) -> (i32, String) {
        let out = self.child.stdout.take().unwrap();
        let line = BufReader::new(out)
            .lines()
            .map_while(Result::ok)
            .find_map(|l| {
                let at = l.find("SERVED").or_else(|| l.find("WORKER ERROR"))?;
                Some(l[at..].to_owned())
            })
            .unwrap_or_default();
        let status = self.child.wait().unwrap();
        (status.code().unwrap_or(-1), line)
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.pid().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{sig}");
    }
}

/// A count in a worker's report (`done`, `yielded`, `parts`).
fn count_of(line: &str, what: &str) -> u64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(what)?.strip_prefix('='))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no {what} in {line:?}"))
}

/// Chunks a worker's report says it finished.
fn done_of(line: &str) -> u64 {
    count_of(line, "done")
}

/// A walk of 3 phases whose steps sleep 1 ms in this process too; a distinct tag per test.
fn walk(n: u64) -> Walk {
    static TAGS: AtomicU64 = AtomicU64::new(1000);
    let tag = TAGS.fetch_add(1, Ordering::Relaxed);
    pace(tag, true);
    Walk {
        tag,
        n,
        per_step: 20,
        phases: 3,
        phase: 0,
        carry: 0.0,
        history: Vec::new(),
    }
}

fn sequential(job: &Walk) -> (Total, Vec<f64>) {
    common::walk::sequential(job, CHUNK)
}

fn assert_exact(fin: &Finished<Walk>, job: &Walk) {
    let (total, history) = sequential(job);
    assert_eq!(fin.value.sum.to_bits(), total.sum.to_bits());
    assert_eq!(fin.value.iterations, total.iterations);
    let got: Vec<u64> = fin.job.history.iter().map(|x| x.to_bits()).collect();
    let want: Vec<u64> = history.iter().map(|x| x.to_bits()).collect();
    assert_eq!(got, want);
}

/// A coordinator's builder with no local worker: every chunk runs in a worker process.
fn remote_only() -> malleable::Builder {
    Executor::builder()
        .local_workers(0)
        .chunking(CHUNKING)
        .listen("127.0.0.1:0")
}

fn coordinator(local: usize) -> Executor {
    Executor::builder()
        .local_workers(local)
        .chunking(CHUNKING)
        .listen("127.0.0.1:0")
        .heartbeat(Duration::from_millis(100), Duration::from_secs(2))
        .handshake_timeout(Duration::from_millis(500))
        .build()
        .unwrap()
}

fn addr(exec: &Executor) -> String {
    exec.local_addr().unwrap().to_string()
}

/// Polls `cond` every 5 ms for up to 20 s.
fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "timed out: {what}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn until_remote<J: malleable::Job>(h: &JobHandle<J>, n: usize) {
    until(&format!("{n} remote workers"), || h.remote_workers() == n);
}

fn finished(h: JobHandle<Walk>) -> Finished<Walk> {
    match h.wait().unwrap() {
        Outcome::Finished(f) => f,
        other => panic!("not finished: {other:?}"),
    }
}

#[test]
fn workers_join_in_the_middle_of_a_phase() {
    let exec = coordinator(1);
    let job = walk(60_000);
    let h = exec.submit(job.clone()).unwrap();
    // Join once the first phase is under way.
    until("progress", || h.progress().done > 0);
    // Two processes of one host that stand for two nodes (`MALLEABLE_NODE`).
    let a = Worker::start_with(&addr(&exec), 1, None, &[(NODE_ENV, "node-a")]);
    let b = Worker::start_with(&addr(&exec), 2, None, &[(NODE_ENV, "node-b")]);
    until_remote(&h, 2);
    let p = h.progress();
    assert_eq!(p.remote_workers, 2);
    // The roster: each process on the node it named, with its threads.
    let mut roster: Vec<(String, u32)> = h
        .remote_processes()
        .into_iter()
        .map(|p| (p.node, p.threads))
        .collect();
    roster.sort();
    assert_eq!(
        roster,
        vec![("node-a".to_owned(), 1), ("node-b".to_owned(), 2)]
    );
    let fin = finished(h);
    assert_exact(&fin, &job);
    let (code_a, line_a) = a.finish();
    let (code_b, line_b) = b.finish();
    assert_eq!((code_a, code_b), (0, 0), "{line_a} / {line_b}");
    assert!(
        done_of(&line_a) > 0 && done_of(&line_b) > 0,
        "{line_a} / {line_b}"
    );
}

#[test]
fn a_worker_leaves_gracefully_when_retired_or_asked_to_stop() {
    let exec = coordinator(1);
    let job = walk(60_000);
    let h = exec.submit(job.clone()).unwrap();
    let a = Worker::start(&addr(&exec), 1, None);
    until_remote(&h, 1);
    let b = Worker::start(&addr(&exec), 1, None);
    until_remote(&h, 2);
    until("remote chunks", || h.progress().done > 4 * CHUNK);
    // Retired by the coordinator: the newest connection, b, hands back and ends.
    h.retire_remote(1);
    let (code, line) = b.finish();
    assert_eq!(code, 0, "{line}");
    assert!(line.contains("left=false"), "{line}");
    assert_eq!(h.remote_workers(), 1);
    // Asked to stop (SIGTERM, as a batch scheduler would): a leaves.
    a.signal("TERM");
    let (code, line) = a.finish();
    assert_eq!(code, 0, "{line}");
    assert!(line.contains("left=true"), "{line}");
    until("the leaver is gone", || h.remote_workers() == 0);
    let fin = finished(h);
    assert_exact(&fin, &job);
}

#[test]
fn a_worker_killed_in_the_middle_of_a_step_loses_nothing() {
    let exec = coordinator(1);
    let job = walk(60_000);
    let h = exec.submit(job.clone()).unwrap();
    let a = Worker::start(&addr(&exec), 2, None);
    let b = Worker::start(&addr(&exec), 1, None);
    until_remote(&h, 2);
    until("remote chunks", || h.progress().done > 4 * CHUNK);
    // Its steps sleep 1 ms and it has two threads: SIGKILL lands in the middle of steps.
    a.signal("KILL");
    until_remote(&h, 1);
    let errors = exec.peer_errors();
    assert!(
        errors.iter().any(|e| matches!(
            **e,
            cluster::Error::Closed { .. } | cluster::Error::Io { .. }
        )),
        "{errors:?}"
    );
    let fin = finished(h);
    assert_exact(&fin, &job);
    let (code, _) = a.finish();
    assert_ne!(code, 0);
    let (code, line) = b.finish();
    assert_eq!(code, 0, "{line}");
}

#[test]
fn all_remote_workers_lost_then_new_ones_join() {
    // No local worker: only remote workers compute (nobody waits until the end).
    let exec = coordinator(0);
    let job = walk(40_000);
    let h = exec.submit(job.clone()).unwrap();
    let a = Worker::start(&addr(&exec), 1, None);
    let b = Worker::start(&addr(&exec), 1, None);
    until_remote(&h, 2);
    until("remote chunks", || h.progress().done > 2 * CHUNK);
    a.signal("KILL");
    b.signal("KILL");
    until_remote(&h, 0);
    // Nothing computes now.
    let stalled = h.progress().done_all_phases;
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(h.progress().done_all_phases, stalled);
    assert!(!h.is_finished());
    let c = Worker::start(&addr(&exec), 2, None);
    until("the job ends", || h.is_finished());
    let fin = finished(h);
    assert_exact(&fin, &job);
    let (code, line) = c.finish();
    assert_eq!(code, 0, "{line}");
    assert!(done_of(&line) > 0, "{line}");
    let _ = (a.finish(), b.finish());
}

#[test]
fn a_stalled_worker_is_given_up_when_its_lease_expires() {
    let exec = coordinator(1);
    let job = walk(60_000);
    let h = exec.submit(job.clone()).unwrap();
    let a = Worker::start(&addr(&exec), 1, None);
    until_remote(&h, 1);
    until("remote chunks", || h.progress().done > 2 * CHUNK);
    // Frozen: its socket stays open, but nothing comes from it.
    a.signal("STOP");
    until("the process stopped", || {
        common::procs::stopped(a.pid() as u32)
    });
    until_remote(&h, 0);
    let errors = exec.peer_errors();
    assert!(
        errors
            .iter()
            .any(|e| matches!(**e, cluster::Error::LeaseExpired { .. })),
        "{errors:?}"
    );
    let fin = finished(h);
    assert_exact(&fin, &job);
    a.signal("KILL");
    let _ = a.finish();
}

#[test]
fn a_job_suspended_with_remote_workers_resumes_with_local_ones() {
    let dir =
        std::env::temp_dir().join(format!("malleable-cluster-suspend-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let url = format!("file://{}", dir.display());
    let exec = remote_only().snapshots(&url).build().unwrap();
    let job = walk(40_000);
    let h = exec.submit(job.clone()).unwrap();
    let a = Worker::start(&addr(&exec), 2, None);
    let b = Worker::start(&addr(&exec), 1, None);
    until_remote(&h, 2);
    until("remote chunks", || h.progress().done > 3 * CHUNK);
    // Snapshots with remote captures first: the first one is written by the coordinator
    // alone; once the workers have read it in the store, they write their parts themselves.
    let first = h.snapshot().wait().unwrap();
    let mut id = first.clone();
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(30));
        id = h.snapshot().wait().unwrap();
    }
    let suspended = h.suspend().wait().unwrap();
    assert!(suspended.epoch > id.epoch && id.epoch > first.epoch);
    match h.wait().unwrap() {
        Outcome::Suspended(s) => assert_eq!(s, suspended),
        other => panic!("not suspended: {other:?}"),
    }
    // The workers were stopped cleanly, and wrote parts to the store.
    let mut parts = 0;
    for w in [a, b] {
        let (code, line) = w.finish();
        assert_eq!(code, 0, "{line}");
        parts += count_of(&line, "parts");
    }
    assert!(parts > 0, "no worker process wrote a part");
    // Resume with local workers only, unpaced.
    pace(job.tag, false);
    let local = Executor::builder().local_workers(2).build().unwrap();
    let fin = finished(local.resume::<Walk>(&url, malleable::At::Latest).unwrap());
    assert_exact(&fin, &job);
    // And from the last snapshot before the suspend (parts written by workers), inline.
    let inline = Executor::builder().local_workers(0).build().unwrap();
    let fin = finished(
        inline
            .resume::<Walk>(&url, malleable::At::Epoch(id.epoch))
            .unwrap(),
    );
    assert_exact(&fin, &job);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn snapshot_parts_go_to_the_coordinator_when_a_worker_cannot_reach_the_store() {
    // A memory store is the coordinator's alone: under the same URL a worker process finds
    // another, empty store, without the snapshot it is shown as a witness.
    let store = malleable::snapshot::Store::open("memory://cluster").unwrap();
    let exec = remote_only().snapshot_store(store.clone()).build().unwrap();
    let job = walk(40_000);
    let h = exec.submit(job.clone()).unwrap();
    let a = Worker::start(&addr(&exec), 2, None);
    until_remote(&h, 1);
    until("remote chunks", || h.progress().done > 3 * CHUNK);
    let mut last = None;
    for _ in 0..4 {
        last = Some(h.snapshot().wait().unwrap());
        std::thread::sleep(Duration::from_millis(30));
    }
    let fin = finished(h);
    assert_exact(&fin, &job);
    let (code, line) = a.finish();
    assert_eq!(code, 0, "{line}");
    assert_eq!(count_of(&line, "parts"), 0, "{line}");
    // The last snapshot lists the running chunks' states, which the coordinator wrote.
    let manifest =
        futures::executor::block_on(store.manifest(&last.unwrap())).expect("the manifest");
    assert!(!manifest.parts.is_empty());
    for part in &manifest.parts {
        futures::executor::block_on(store.get_part(part)).expect("an intact part");
    }
}

/// Remote workers and an S3 store (a real SeaweedFS server): a worker process with the keys
/// in its environment writes its parts itself; one with wrong keys cannot read the witness
/// and sends its states to the coordinator. Resuming from a snapshot holding parts written by
/// a worker gives the exact value. (The coordinator tells workers the endpoint, region and
/// `allow_http`, never the keys.)
#[cfg(feature = "s3")]
#[test]
fn remote_workers_write_their_parts_to_s3_when_they_can() {
    use support::seaweed;
    let server = seaweed::server();
    let url = format!("s3://{}/cluster-{}", seaweed::BUCKET, std::process::id());
    let with_options = |mut b: malleable::Builder| {
        for (k, v) in server.options() {
            b = b.snapshot_option(k, v);
        }
        b
    };
    let exec = with_options(remote_only()).snapshots(&url).build().unwrap();
    let job = walk(40_000);
    let h = exec.submit(job.clone()).unwrap();
    let keys = [
        ("AWS_ACCESS_KEY_ID", seaweed::ACCESS_KEY),
        ("AWS_SECRET_ACCESS_KEY", seaweed::SECRET_KEY),
    ];
    let wrong = [
        ("AWS_ACCESS_KEY_ID", seaweed::ACCESS_KEY),
        ("AWS_SECRET_ACCESS_KEY", "not-the-secret"),
    ];
    let a = Worker::start_with(&addr(&exec), 2, None, &keys);
    let b = Worker::start_with(&addr(&exec), 2, None, &wrong);
    until_remote(&h, 2);
    until("remote chunks", || h.progress().done > 3 * CHUNK);
    let first = h.snapshot().wait().unwrap();
    let mut id = first.clone();
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(50));
        id = h.snapshot().wait().unwrap();
    }
    assert!(id.epoch > first.epoch);
    let fin = finished(h);
    assert_exact(&fin, &job);
    let (code, line) = a.finish();
    assert_eq!(code, 0, "{line}");
    assert!(count_of(&line, "parts") > 0, "{line}");
    let (code, line) = b.finish();
    assert_eq!(code, 0, "{line}");
    assert_eq!(count_of(&line, "parts"), 0, "{line}");
    // Resume the last snapshot inline: parts from both kinds of workers read back intact.
    pace(job.tag, false);
    let inline = with_options(Executor::builder().local_workers(0))
        .build()
        .unwrap();
    let fin = finished(
        inline
            .resume::<Walk>(&url, malleable::At::Epoch(id.epoch))
            .unwrap(),
    );
    assert_exact(&fin, &job);
}

/// A worker process lost while a snapshot waits for its chunks: each chunk falls back to the
/// state it was sent with, and the snapshot records that state (not "from scratch").
#[test]
fn a_lost_workers_chunks_fall_back_to_the_states_they_were_sent_with() {
    let dir =
        std::env::temp_dir().join(format!("malleable-cluster-fallback-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let url = format!("file://{}", dir.display());
    let store = malleable::snapshot::Store::open(&url).unwrap();
    let read = |id| futures::executor::block_on(store.manifest(id)).expect("the manifest");
    // Two chunks of 500 paced steps (about 0.5 s each); two local threads run them, and a
    // suspend hands them back with their states.
    const SIZE: u64 = 10_000;
    let chunking = Chunking::Size(SIZE);
    let mut job = walk(20_000);
    job.phases = 1;
    let local = Executor::builder()
        .local_workers(2)
        .chunking(chunking)
        .snapshots(&url)
        .build()
        .unwrap();
    let h = local.submit(job.clone()).unwrap();
    until("local chunks", || h.progress().done > 1_000);
    let s0 = h.suspend().wait().unwrap();
    assert!(matches!(h.wait().unwrap(), Outcome::Suspended(_)));
    let before = read(&s0);
    assert!(!before.parts.is_empty(), "the suspend left no chunk state");
    // Resumed with one worker process of one thread: its two slots take the two handed-back
    // chunks with their states. Heartbeats every 20 ms show its progress soon after it starts.
    let remote = remote_only()
        .heartbeat(Duration::from_millis(20), Duration::from_secs(2))
        .snapshots(&url)
        .build()
        .unwrap();
    let h = remote.resume::<Walk>(&url, malleable::At::Latest).unwrap();
    let w = Worker::start(&addr(&remote), 1, None);
    until_remote(&h, 1);
    let at_resume = h.progress().done;
    until("remote progress", || h.progress().done > at_resume);
    // Frozen, it cannot answer the snapshot's capture; killed, its slots are lost. (Every
    // thread of it is stopped before the snapshot is asked: one still running could answer.)
    w.signal("STOP");
    until("the process stopped", || {
        common::procs::stopped(w.pid() as u32)
    });
    let request = h.snapshot();
    w.signal("KILL");
    let s1 = request.wait().unwrap();
    let after = read(&s1);
    for part in &before.parts {
        let now = after.parts.iter().find(|p| p.chunk == part.chunk);
        assert_eq!(
            now.map(|p| p.crc32c),
            Some(part.crc32c),
            "chunk {} is not recorded with the state it was sent with",
            part.chunk
        );
    }
    // A new worker process finishes the job from those states, exactly.
    let w2 = Worker::start(&addr(&remote), 1, None);
    let fin = finished(h);
    let (total, history) = common::walk::sequential(&job, SIZE);
    assert_eq!(fin.value.sum.to_bits(), total.sum.to_bits());
    assert_eq!(fin.value.iterations, total.iterations);
    assert_eq!(fin.job.history.len(), history.len());
    let _ = w.finish();
    let (code, line) = w2.finish();
    assert_eq!(code, 0, "{line}");
    let _ = std::fs::remove_dir_all(&dir);
}
