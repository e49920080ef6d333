//! Worker processes (real processes, real sockets on loopback) and the job they are offered:
//!
//! - a worker process built with another version of the job ([`Job::VERSION`]) is refused
//!   in the handshake: it ends with [`cluster::Error::JobVersion`] naming the job and both
//!   versions, the coordinator records the same, and the job goes on to its exact value;
//! - a worker process built with the same name and version of a job whose fields were
//!   swapped or one added (its serialized [`Layout`]) is refused in the handshake too, with
//!   [`cluster::Error::JobLayout`] naming the job, both fingerprints and the first field that
//!   differs, on both sides;
//! - a worker process started before its coordinator listens, and before the job is
//!   submitted, waits for it ([`WorkerOptions::wait_for_job`], here from
//!   [`WAIT_FOR_JOB_ENV`]) and serves it; a wait that runs out ends with the typed error;
//! - a malformed [`WAIT_FOR_JOB_ENV`] is an error that names the variable.
//!
//! Worker processes are this test binary, re-executed to run [`worker_process`] (an ignored
//! test, so a normal run skips it) with the coordinator's address in [`ADDR_ENV`].
//!
//! [`Job::VERSION`]: malleable::Job::VERSION
//! [`Layout`]: malleable::Layout

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use malleable::cluster::{self, Registry, TOKEN_ENV, WAIT_FOR_JOB_ENV, WorkerOptions};
use malleable::reduce::Sum;
use malleable::{Chunking, Executor, Fold, Folded, Outcome};
use serde::{Deserialize, Serialize};

/// Set in a worker process: the coordinator's address.
const ADDR_ENV: &str = "MALLEABLE_TEST_WORKER_ADDR";
/// Set in a worker process to register a [`Scaled`] job instead of [`SumV1`]: `swapped` or
/// `appended`, the variant of its fields.
const SCALED_ENV: &str = "MALLEABLE_TEST_WORKER_SCALED";
/// The name of the [`Scaled`] jobs, the same (in the same version) in all three variants.
const SCALED: &str = "cluster-versions-scaled";
/// The jobs' name, the same in both versions.
const NAME: &str = "cluster-versions-sum";
/// How long any wait of these tests may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(20);

/// The sum of `0..n`, slowly (so that a job is still running when a worker process dials).
/// Version 1: what the worker processes register.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SumV1 {
    n: u64,
}

/// The same job under the same name, in version 2: what a newer coordinator runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SumV2 {
    n: u64,
}

fn slow_add(acc: &mut u64, i: u64) {
    std::thread::sleep(Duration::from_micros(100));
    *acc += i;
}

impl Fold for SumV1 {
    const NAME: &'static str = NAME;
    type Acc = u64;
    type Reducer = Sum<u64>;
    type Input = ();
    fn iterations(&self) -> u64 {
        self.n
    }
    fn reducer(&self) -> Sum<u64> {
        Sum::new()
    }
    fn body(&self, _: &(), acc: &mut u64, i: u64) {
        slow_add(acc, i);
    }
}

impl Fold for SumV2 {
    const NAME: &'static str = NAME;
    const VERSION: u32 = 2;
    type Acc = u64;
    type Reducer = Sum<u64>;
    type Input = ();
    fn iterations(&self) -> u64 {
        self.n
    }
    fn reducer(&self) -> Sum<u64> {
        Sum::new()
    }
    fn body(&self, _: &(), acc: &mut u64, i: u64) {
        slow_add(acc, i);
    }
}

/// `Σ (i·scale + offset)` over `0..n`, slowly, in three variants of its fields under one
/// name and version: what the coordinator runs ([`Scaled`]), and what a worker process built
/// from changed code registers, the two `f64` fields swapped ([`swapped::Scaled`]) or one
/// appended ([`appended::Scaled`]).
macro_rules! scaled {
    ($def:item) => {
        #[derive(Debug, Clone, Serialize, Deserialize)]
        $def

        impl Fold for Scaled {
            const NAME: &'static str = SCALED;
            type Acc = f64;
            type Reducer = Sum<f64>;
            type Input = ();
            fn iterations(&self) -> u64 {
                self.n
            }
            fn reducer(&self) -> Sum<f64> {
                Sum::new()
            }
            fn body(&self, _: &(), acc: &mut f64, i: u64) {
                std::thread::sleep(Duration::from_micros(100));
                *acc += i as f64 * self.scale + self.offset;
            }
        }
    };
}

scaled!(
    struct Scaled {
        n: u64,
        scale: f64,
        offset: f64,
    }
);

mod swapped {
    use super::*;
    scaled!(
        pub(crate) struct Scaled {
            pub(crate) n: u64,
            pub(crate) offset: f64,
            pub(crate) scale: f64,
        }
    );
}

mod appended {
    use super::*;
    scaled!(
        pub(crate) struct Scaled {
            pub(crate) n: u64,
            pub(crate) scale: f64,
            pub(crate) offset: f64,
            pub(crate) shift: f64,
        }
    );
}

/// The entry point of worker processes: serves [`SumV1`] (or a variant of [`Scaled`], as
/// [`SCALED_ENV`] says) on one thread, with the options of its environment; prints what
/// happened.
#[test]
#[ignore = "the body of the worker processes the other tests start"]
fn worker_process() {
    let Ok(addr) = std::env::var(ADDR_ENV) else {
        return;
    };
    let registry = match std::env::var(SCALED_ENV).as_deref() {
        Ok("swapped") => Registry::new().register::<Folded<swapped::Scaled>>(),
        Ok("appended") => Registry::new().register::<Folded<appended::Scaled>>(),
        _ => Registry::new().register::<Folded<SumV1>>(),
    };
    let options = match WorkerOptions::from_env() {
        Ok(o) => o.threads(1),
        Err(e) => {
            println!("WORKER ERROR kind={} {e}", e.kind());
            std::process::exit(3);
        }
    };
    println!("STARTED");
    match cluster::serve(&addr, &registry, options) {
        Ok(served) => {
            println!(
                "SERVED attempts={} done={}",
                served.attempts, served.chunks_done
            );
            std::process::exit(0);
        }
        Err(e) => {
            println!("WORKER ERROR kind={} {e}", e.kind());
            std::process::exit(3);
        }
    }
}

/// A worker process (this binary) dialling `addr`; killed if the test lets go of it before
/// it exits.
struct Worker {
    child: Child,
    out: BufReader<ChildStdout>,
}

impl Worker {
    fn start(addr: &str, env: &[(&str, &str)]) -> Worker {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                crate::common::exact(module_path!(), "worker_process").as_str(),
                "--ignored",
                "--nocapture",
            ])
            .args(["--test-threads", "1"])
            .env(ADDR_ENV, addr)
            .env_remove(TOKEN_ENV)
            .env_remove(WAIT_FOR_JOB_ENV)
            .env_remove(SCALED_ENV)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start a worker process");
        let out = BufReader::new(child.stdout.take().unwrap());
        Worker { child, out }
    }

    /// The next line the process prints that starts with one of `marks` (the test harness
    /// prints its own lines too).
    fn line(&mut self, marks: &[&str]) -> String {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.out.read_line(&mut line).unwrap();
            assert!(n > 0, "the worker process printed none of {marks:?}");
            if let Some(at) = marks.iter().find_map(|m| line.find(m)) {
                return line[at..].trim_end().to_owned();
            }
        }
    }

    /// Waits (up to [`PATIENCE`]) for the process to exit; its last report line.
    fn finish(mut self) -> (std::process::ExitStatus, String) {
        let line = self.line(&["SERVED", "WORKER ERROR"]);
        let start = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(
                start.elapsed() < PATIENCE,
                "the worker process did not exit"
            );
            std::thread::sleep(Duration::from_millis(5));
        };
        let mut rest = String::new();
        let _ = self.out.read_to_string(&mut rest);
        (status, line)
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

/// Polls `cond` every 5 ms; fails the test after [`PATIENCE`].
fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < PATIENCE, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn count(exec: &Executor, kind: &str) -> usize {
    exec.peer_errors()
        .iter()
        .filter(|e| e.kind() == kind)
        .count()
}

#[test]
fn a_worker_process_with_the_job_in_another_version_is_refused() {
    // No local worker until the refusal: the job is still running when the worker dials.
    let exec = Executor::builder()
        .local_workers(0)
        .chunking(Chunking::Count(16))
        .listen("127.0.0.1:0")
        .build()
        .unwrap();
    let addr = exec.local_addr().unwrap().to_string();
    let n = 2_000;
    let h = exec.submit(Folded(SumV2 { n })).unwrap();

    // The worker's side: it ends with the typed error, naming the job and both versions.
    let (status, line) = Worker::start(&addr, &[]).finish();
    assert_eq!(status.code(), Some(3), "{line}");
    assert!(line.starts_with("WORKER ERROR kind=job_version "), "{line}");
    for part in [
        &format!("job {NAME:?}"),
        "the coordinator has version 2",
        "the worker process version 1",
        "Job::VERSION",
    ] {
        assert!(line.contains(part), "{line:?} lacks {part:?}");
    }

    // The coordinator's side: recorded with both versions, and the job went on.
    until("the coordinator's record of the refusal", || {
        count(&exec, "job_version") == 1
    });
    let refused = exec.peer_errors();
    assert!(
        refused.iter().any(|e| matches!(
            &**e,
            cluster::Error::JobVersion { job, coordinator: 2, worker: 1, .. } if job == NAME
        )),
        "{refused:?}"
    );
    assert!(!h.is_finished());
    h.set_local_workers(1);
    match h.wait().unwrap() {
        Outcome::Finished(f) => assert_eq!(f.value, n * (n - 1) / 2),
        other => panic!("the job did not finish: {other:?}"),
    }
}

#[test]
fn a_worker_process_with_the_job_s_fields_changed_is_refused() {
    let exec = Executor::builder()
        .local_workers(0)
        .chunking(Chunking::Count(16))
        .listen("127.0.0.1:0")
        .build()
        .unwrap();
    let addr = exec.local_addr().unwrap().to_string();
    let n = 2_000;
    let h = exec
        .submit(Folded(Scaled {
            n,
            scale: 2.0,
            offset: 1.0,
        }))
        .unwrap();
    let ours = malleable::Layout::of::<Folded<Scaled>>();
    assert!(ours.is_traced(), "{ours:?}");
    let cases = [
        (
            "swapped",
            malleable::Layout::of::<Folded<swapped::Scaled>>(),
            "the coordinator has `Scaled.scale: f64` where the worker process has \
             `Scaled.offset: f64`",
        ),
        (
            "appended",
            malleable::Layout::of::<Folded<appended::Scaled>>(),
            "the worker process has `Scaled.shift: f64`, which the coordinator does not",
        ),
    ];
    for (i, (variant, theirs, difference)) in cases.into_iter().enumerate() {
        // The worker's side: it ends with the typed error, naming the job, both
        // fingerprints and the first field that differs.
        let (status, line) = Worker::start(&addr, &[(SCALED_ENV, variant)]).finish();
        assert_eq!(status.code(), Some(3), "{variant}: {line}");
        assert!(
            line.starts_with("WORKER ERROR kind=job_layout "),
            "{variant}: {line}"
        );
        for part in [
            &format!("job {SCALED:?}"),
            &format!("fingerprint {} on the coordinator", ours.fingerprint()),
            &format!("{} on the worker process", theirs.fingerprint()),
            difference,
            "Job::VERSION",
        ] {
            assert!(line.contains(part), "{variant}: {line:?} lacks {part:?}");
        }

        // The coordinator's side: the same, recorded as a peer error.
        until("the coordinator's record of the refusal", || {
            count(&exec, "job_layout") == i + 1
        });
        let refused = exec.peer_errors();
        let recorded = refused
            .iter()
            .filter_map(|e| match &**e {
                cluster::Error::JobLayout {
                    job,
                    version: 1,
                    coordinator,
                    worker,
                    difference,
                    ..
                } if job == SCALED => Some((*coordinator, *worker, difference.clone())),
                _ => None,
            })
            .nth(i);
        assert_eq!(
            recorded,
            Some((
                ours.fingerprint(),
                theirs.fingerprint(),
                difference.to_owned()
            )),
            "{variant}: {refused:?}"
        );
        // Nothing of the job reached the worker: no decode failure anywhere.
        assert_eq!(count(&exec, "undecodable"), 0, "{refused:?}");
    }
    assert!(!h.is_finished());
    h.set_local_workers(1);
    match h.wait().unwrap() {
        Outcome::Finished(f) => {
            let exact: f64 = (0..n).map(|i| i as f64 * 2.0 + 1.0).sum();
            assert_eq!(f.value, exact);
        }
        other => panic!("the job did not finish: {other:?}"),
    }
}

#[test]
fn a_worker_process_started_first_waits_for_its_job() {
    // An address nobody listens on yet: the worker process's first dials are refused.
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let mut worker = Worker::start(&addr, &[(WAIT_FOR_JOB_ENV, "15")]);
    assert_eq!(worker.line(&["STARTED", "WORKER ERROR"]), "STARTED");
    std::thread::sleep(Duration::from_millis(300));

    // The coordinator listens, with no job yet: it refuses the worker as one of no running
    // job (and records it) until the job is submitted.
    let exec = Executor::builder()
        .local_workers(0)
        .chunking(Chunking::Count(8))
        .listen(&addr)
        .build()
        .unwrap();
    until("a refusal for want of a job", || {
        count(&exec, "unknown_job") >= 1
    });
    let n = 2_000;
    let h = exec.submit(Folded(SumV1 { n })).unwrap();
    until("the end of the job", || h.is_finished());
    match h.wait().unwrap() {
        Outcome::Finished(f) => assert_eq!(f.value, n * (n - 1) / 2),
        other => panic!("the job did not finish: {other:?}"),
    }
    let (status, line) = worker.finish();
    assert!(status.success(), "{status}: {line}");
    let attempts: usize = line
        .strip_prefix("SERVED attempts=")
        .and_then(|r| r.split_whitespace().next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    let unknown = count(&exec, "unknown_job");
    // Its attempts: refused connections before the coordinator listened, refusals for want
    // of a job (each recorded by the coordinator), and the one that joined.
    assert!(
        attempts > unknown + 1,
        "{attempts} attempts, {unknown} refused for want of a job: none before the \
         coordinator listened"
    );
    assert!(line.contains("done=8"), "{line}");
}

#[test]
fn a_wait_for_a_job_that_does_not_come_ends_with_the_typed_error() {
    let exec = Executor::builder()
        .local_workers(0)
        .listen("127.0.0.1:0")
        .build()
        .unwrap();
    let addr = exec.local_addr().unwrap().to_string();
    let wait = Duration::from_millis(400);
    let started = Instant::now();
    let err = cluster::serve(
        &addr,
        &Registry::new().register::<Folded<SumV1>>(),
        WorkerOptions::default().threads(1).wait_for_job(wait),
    )
    .unwrap_err();
    assert!(
        started.elapsed() >= wait,
        "gave up after {:?}",
        started.elapsed()
    );
    match &err {
        cluster::Error::UnknownJob { known, running, .. } => {
            assert_eq!(known, &[NAME.to_owned()]);
            assert!(running.is_empty());
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("runs no job yet"), "{err}");
    // It tried more than once, and the coordinator saw each try.
    assert!(count(&exec, "unknown_job") >= 2, "{:?}", exec.peer_errors());
    // A stop request ends the wait (with the last refusal), however long it was to be.
    let stop = malleable::SuspendToken::new();
    let (tx, rx) = std::sync::mpsc::channel();
    {
        let (addr, stop) = (addr.clone(), stop.clone());
        std::thread::spawn(move || {
            let served = cluster::serve(
                &addr,
                &Registry::new().register::<Folded<SumV1>>(),
                WorkerOptions::default()
                    .threads(1)
                    .wait_for_job(Duration::from_secs(3600))
                    .stop_on(&stop),
            );
            let _ = tx.send(served);
        });
    }
    let refused = count(&exec, "unknown_job");
    until("a refusal of the waiting worker", || {
        count(&exec, "unknown_job") > refused
    });
    stop.suspend();
    let err = rx
        .recv_timeout(PATIENCE)
        .expect("the stop request did not end the wait")
        .unwrap_err();
    assert!(matches!(err, cluster::Error::UnknownJob { .. }), "{err:?}");
    // Without the option, it gives up at the first refusal.
    let err = cluster::serve(
        &addr,
        &Registry::new().register::<Folded<SumV1>>(),
        WorkerOptions::default().threads(1),
    )
    .unwrap_err();
    assert!(matches!(err, cluster::Error::UnknownJob { .. }), "{err:?}");
}

#[test]
fn a_malformed_wait_in_the_environment_is_an_error_naming_it() {
    let (status, line) = Worker::start("127.0.0.1:9", &[(WAIT_FOR_JOB_ENV, "soon")]).finish();
    assert_eq!(status.code(), Some(3), "{line}");
    assert_eq!(
        line,
        "WORKER ERROR kind=environment MALLEABLE_WAIT_FOR_JOB=\"soon\" is not a number of \
         seconds (such as 30 or 2.5)"
    );
}
