//! Real signals and deadlines: a job suspends itself to its store on SIGUSR1 or SIGTERM (as a
//! batch scheduler sends before a time limit) or before a deadline, and resumes elsewhere,
//! with another worker count, to the sequential value bit for bit.
//!
//! The signal tests run the job in a child process, the test binary itself re-executed with
//! `--exact child_suspendable --nocapture` and [`CHILD_ENV`] set to the store's URL (without
//! that variable `child_suspendable` does nothing); the parent sends the signal with
//! `kill -USR1 <pid>` / `kill -TERM <pid>`. The jobs' steps sleep where they must last (in
//! the child, and in the first run of the deadline tests): a slow machine, set per process
//! through the job's `Input`, never part of the job or its value, so every resume computes
//! at full speed.

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant, SystemTime};

use malleable::snapshot::{SnapshotId, Store};
use malleable::{At, Chunking, Executor, Finished, Job, Outcome};

mod common;

use common::walk::{PACE_ENV, Total, Walk, pace};

/// Set in the child only: the URL of the store it suspends to.
const CHILD_ENV: &str = "MALLEABLE_SIGNAL_CHILD";
/// In the child: the signals that suspend (`suspend_on`), as numbers separated by commas;
/// unset, `suspend_on_signals`.
const SET_ENV: &str = "MALLEABLE_SIGNAL_SET";
/// In the child: `finish` runs a short job to its end, prints so, then idles for a minute.
const MODE_ENV: &str = "MALLEABLE_SIGNAL_MODE";
/// Fixed chunk boundaries: the value depends on them, never on the workers.
const CHUNK: u64 = 2_000;
const CHUNKING: Chunking = Chunking::Size(CHUNK);

/// 20 phases of 200 000 iterations, 100 per step: paced on 2 workers, about 1 s a phase and
/// 20 s in all; at full speed, a fraction of a second.
fn long_job(tag: u64) -> Walk {
    Walk {
        tag,
        n: 200_000,
        per_step: 100,
        phases: 20,
        phase: 0,
        carry: 0.0,
        history: Vec::new(),
    }
}

/// The same computation as a plain loop, with this test's chunk size.
fn sequential(job: &Walk) -> (Total, Vec<f64>) {
    common::walk::sequential(job, CHUNK)
}

fn assert_sequential(got: &Finished<Walk>, job: &Walk, what: &str) {
    let (value, history) = sequential(job);
    assert_eq!(
        got.value.sum.to_bits(),
        value.sum.to_bits(),
        "{what}: {} vs the sequential {}",
        got.value.sum,
        value.sum
    );
    assert_eq!(got.value.iterations, value.iterations, "{what}");
    let bits = |h: &[f64]| h.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&got.job.history), bits(&history), "{what}: history");
}

fn folder(name: &str) -> (String, PathBuf) {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("signals-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    (format!("file://{}", dir.display()), dir)
}

fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(f)
}

fn resume(url: &str, job_id: &str, at: At, workers: usize) -> Finished<Walk> {
    Executor::builder()
        .local_workers(workers)
        .job_id(job_id)
        .build()
        .unwrap()
        .resume::<Walk>(url, at)
        .unwrap_or_else(|e| panic!("resume with {workers} workers: {e}"))
        .wait()
        .unwrap()
        .finished()
        .expect("the resumed run finishes")
}

/// The newest committed snapshot must be `id`, must decode, and must carry work over.
fn check_store(url: &str, id: &SnapshotId) {
    let store = Store::open(url).unwrap();
    let (latest, manifest) = block_on(async {
        let latest = store.latest(&id.job_id).await.unwrap();
        (latest, store.manifest(id).await.unwrap())
    });
    assert_eq!(
        latest.as_ref(),
        Some(id),
        "the suspend is the newest snapshot"
    );
    manifest.check_job(Walk::NAME).unwrap();
    assert!(
        manifest.phase > 0
            || manifest.merged > 0
            || !manifest.done.is_empty()
            || !manifest.parts.is_empty(),
        "{id} carries no work over: phase {}, merged {}",
        manifest.phase,
        manifest.merged
    );
    println!(
        "  {id}: phase {}, {} of {} iterations of the phase done, {} chunk states",
        manifest.phase,
        manifest.iterations_done,
        manifest.iterations_total,
        manifest.parts.len()
    );
}

// ---------------------------------------------------------------------------------------
// Signals, in a child process.
// ---------------------------------------------------------------------------------------

/// The child: runs the long job with `suspend_on_signals` until a signal suspends it, then
/// prints the outcome and exits 0. Does nothing unless [`CHILD_ENV`] is set.
#[test]
fn child_suspendable() {
    let Ok(url) = std::env::var(CHILD_ENV) else {
        return;
    };
    let builder = Executor::builder()
        .local_workers(2)
        .chunking(CHUNKING)
        .snapshots(&url)
        .job_id("signal-walk");
    let builder = match std::env::var(SET_ENV) {
        Ok(set) => builder.suspend_on(set.split(',').map(|s| s.parse::<i32>().unwrap())),
        Err(_) => builder.suspend_on_signals(),
    };
    let exec = builder.build().expect("child: build");
    if std::env::var(MODE_ENV).as_deref() == Ok("finish") {
        let mut short = long_job(0);
        short.phases = 1;
        short.n = 1_000;
        exec.run(short).expect("child: run");
        println!("signal-child: finished pid {}", std::process::id());
        std::thread::sleep(Duration::from_secs(60));
        println!("signal-child: still alive a minute later");
        return;
    }
    let handle = exec.submit(long_job(0)).expect("child: submit");
    let t0 = Instant::now();
    println!("signal-child: started pid {}", std::process::id());
    match handle.wait().expect("child: wait") {
        Outcome::Suspended(id) => println!(
            "signal-child: outcome Suspended({id}) after {} ms",
            t0.elapsed().as_millis()
        ),
        Outcome::Finished(_) => panic!("child: the job finished: no signal suspended it"),
        _ => panic!("child: an unknown outcome"),
    }
}

/// Reads a pipe line by line on a thread.
fn lines(pipe: impl Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// Waits for a line containing `marker` (libtest may print its own text before ours on the
/// same line) and returns what follows the marker; every line read is kept in `seen`.
fn expect_line(
    rx: &Receiver<String>,
    marker: &str,
    timeout: Duration,
    seen: &mut Vec<String>,
) -> Option<String> {
    let end = Instant::now() + timeout;
    loop {
        match rx.recv_timeout(end.saturating_duration_since(Instant::now())) {
            Ok(line) => {
                let rest = line.split_once(marker).map(|(_, rest)| rest.to_owned());
                seen.push(line);
                if rest.is_some() {
                    return rest;
                }
            }
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return None,
        }
    }
}

fn wait_timeout(child: &mut std::process::Child, timeout: Duration) -> Option<ExitStatus> {
    let end = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if Instant::now() >= end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Starts the child with the store at `url` and `env` set.
fn spawn_child(url: &str, env: &[(&str, String)]) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_suspendable",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, url)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the child")
}

fn send(signal: &str, child: &std::process::Child) {
    let kill = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(child.id().to_string())
        .status()
        .expect("run kill");
    assert!(kill.success(), "kill -{signal} failed: {kill}");
}

fn signal_suspends_then_resumes(signal: &str, resume_workers: usize, set: Option<i32>) {
    let (url, dir) = folder(&signal.to_lowercase());
    let mut env = vec![(PACE_ENV, "1".to_owned())];
    if let Some(s) = set {
        env.push((SET_ENV, s.to_string()));
    }
    let mut child = spawn_child(&url, &env);
    let out = lines(child.stdout.take().unwrap());
    let err = lines(child.stderr.take().unwrap());
    let mut seen = Vec::new();
    let fail = |child: &mut std::process::Child, seen: &[String], what: &str| -> ! {
        let _ = child.kill();
        let _ = child.wait();
        let stderr: Vec<String> = err.try_iter().collect();
        panic!(
            "SIG{signal}: {what}\nchild stdout:\n{}\nchild stderr:\n{}",
            seen.join("\n"),
            stderr.join("\n")
        );
    };

    if expect_line(
        &out,
        "signal-child: started",
        Duration::from_secs(60),
        &mut seen,
    )
    .is_none()
    {
        fail(&mut child, &seen, "the child did not start");
    }
    // Let it work a little, so that the snapshot carries work over.
    std::thread::sleep(Duration::from_millis(300));
    let sent = Instant::now();
    send(signal, &child);

    let Some(status) = wait_timeout(&mut child, Duration::from_secs(30)) else {
        fail(
            &mut child,
            &seen,
            "the child did not exit within 30 s of the signal",
        );
    };
    let exited = sent.elapsed();
    let outcome = expect_line(
        &out,
        "signal-child: outcome Suspended(",
        Duration::from_secs(5),
        &mut seen,
    );
    if !status.success() {
        fail(
            &mut child,
            &seen,
            &format!("the child exited with {status}"),
        );
    }
    let Some(outcome) = outcome else {
        fail(&mut child, &seen, "the child did not print its outcome");
    };
    let id: SnapshotId = outcome
        .split(')')
        .next()
        .unwrap()
        .parse()
        .expect("a snapshot id");
    println!(
        "SIG{signal}: the child suspended to {id} and exited 0, {} ms after the signal",
        exited.as_millis()
    );
    check_store(&url, &id);

    let resumed = resume(&url, &id.job_id, At::Latest, resume_workers);
    assert_sequential(
        &resumed,
        &long_job(0),
        &format!("resumed after SIG{signal} with {resume_workers} workers"),
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn sigusr1_suspends_the_job_in_a_child_process() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    signal_suspends_then_resumes("USR1", 3, None);
}

#[test]
fn sigint_suspends_the_job_in_a_child_process() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    signal_suspends_then_resumes("INT", 1, None);
}

#[test]
fn a_chosen_signal_suspends_the_job_in_a_child_process() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    signal_suspends_then_resumes("USR2", 2, Some(libc::SIGUSR2));
}

/// Runs the child with `env`, waits for `ready` on its output, sends SIGINT `times` times
/// 300 ms apart, and checks that SIGINT ended it (not a normal exit).
fn sigint_ends_the_child(name: &str, env: &[(&str, String)], ready: &str, times: usize) {
    use std::os::unix::process::ExitStatusExt;
    let (url, dir) = folder(name);
    let mut child = spawn_child(&url, env);
    let out = lines(child.stdout.take().unwrap());
    let mut seen = Vec::new();
    let started = expect_line(&out, ready, Duration::from_secs(60), &mut seen);
    if started.is_none() {
        let _ = child.kill();
        panic!("{name}: the child did not print {ready:?}: {seen:?}");
    }
    for _ in 0..times {
        std::thread::sleep(Duration::from_millis(300));
        send("INT", &child);
    }
    let Some(status) = wait_timeout(&mut child, Duration::from_secs(20)) else {
        let _ = child.kill();
        panic!("{name}: the child is still running 20 s after SIGINT");
    };
    seen.extend(out.try_iter());
    assert_eq!(
        status.signal(),
        Some(libc::SIGINT),
        "{name}: the child ended with {status}, not by SIGINT: {seen:?}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_second_sigint_during_a_suspend_ends_the_process() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    // Steps of 3 s: the suspend waits for the running steps, the second SIGINT does not.
    sigint_ends_the_child(
        "second-sigint",
        &[(PACE_ENV, "3000".to_owned())],
        "signal-child: started",
        2,
    );
}

#[test]
fn sigint_ends_the_process_once_its_jobs_have_ended() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    sigint_ends_the_child(
        "sigint-after-end",
        &[(MODE_ENV, "finish".to_owned())],
        "signal-child: finished",
        1,
    );
}

#[test]
fn sigterm_suspends_the_job_in_a_child_process() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    signal_suspends_then_resumes("TERM", 0, None);
}

// ---------------------------------------------------------------------------------------
// Deadlines, in process.
// ---------------------------------------------------------------------------------------

/// Runs the long, paced job with `deadline` and checks that it suspends before it; returns
/// when it suspended and the snapshot, after resuming it unpaced to the sequential value.
fn run_until_deadline(
    name: &str,
    tag: u64,
    deadline: SystemTime,
    every: Option<Duration>,
) -> (SystemTime, SnapshotId) {
    let (url, dir) = folder(name);
    let job_id = format!("deadline-{name}");
    let mut builder = Executor::builder()
        .local_workers(2)
        .chunking(CHUNKING)
        .snapshots(&url)
        .job_id(&job_id)
        .deadline(deadline);
    if let Some(every) = every {
        builder = builder.snapshot_every(every);
    }
    let exec = builder.build().unwrap();
    pace(tag, true);
    let start = SystemTime::now();
    let outcome = exec.submit(long_job(tag)).unwrap().wait().unwrap();
    let at = SystemTime::now();
    pace(tag, false);
    let Outcome::Suspended(id) = outcome else {
        panic!("{name}: the job did not suspend before its deadline");
    };
    let left = deadline.duration_since(at).unwrap_or_else(|late| {
        panic!("{name}: suspended {:?} after the deadline", late.duration())
    });
    println!(
        "{name}: suspended to {id} {:.2} s after the start, {:.2} s before the deadline",
        at.duration_since(start).unwrap().as_secs_f64(),
        left.as_secs_f64()
    );
    check_store(&url, &id);
    let resumed = resume(&url, &job_id, At::Epoch(id.epoch), 1);
    assert_sequential(&resumed, &long_job(tag), &format!("{name}: resumed"));
    let _ = std::fs::remove_dir_all(dir);
    (at, id)
}

/// A deadline 2 s away, for a job of about 20 s: it ends suspended before the deadline.
#[test]
fn a_near_deadline_suspends_before_it_passes() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    let deadline = SystemTime::now() + Duration::from_secs(2);
    run_until_deadline("near", 1, deadline, None);
}

/// A deadline 12 s away, with a snapshot every 200 ms: once a snapshot has been timed the
/// margin is twice the longest one plus a second, so the job works until about a second
/// before the deadline instead of suspending at once.
#[test]
fn a_far_deadline_uses_the_measured_margin() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    let deadline = SystemTime::now() + Duration::from_secs(12);
    let (at, _) = run_until_deadline("far", 2, deadline, Some(Duration::from_millis(200)));
    let left = deadline.duration_since(at).unwrap();
    // About 1 s is expected; 6 s leaves room for slow snapshot writes on a busy machine
    // (the margin doubles the longest one) and still tells a suspend at once (12 s) apart.
    assert!(
        left < Duration::from_secs(6),
        "suspended {left:?} before the deadline: the measured margin was not used"
    );
}
