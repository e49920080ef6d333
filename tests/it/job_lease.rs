//! One run at a time per job id: the job id's lease in the store (`snapshot/lease.rs`).
//!
//! - Two executors of one process: the second run of a held job id is refused at submit
//!   (and at `submit_or_resume` and `resume`) with `Error::JobIdHeld` naming the holder; it
//!   runs once the first has ended.
//! - A run whose lease another run took over commits no more snapshots and ends with
//!   `Error::LeaseLost`.
//! - Real processes on the folder store and on S3 (SeaweedFS, feature `s3`): the holder is
//!   this test binary re-executed to run the ignored test `lease_holder_process`; a second
//!   process is refused naming it; once it is killed (SIGKILL), its lease is taken over after
//!   it expires. A holder frozen (SIGSTOP) past its lease and taken over ends with
//!   `LeaseLost` when it wakes.

use crate::common;
#[cfg(feature = "s3")]
use crate::support;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::slow::Slow;
use malleable::snapshot::{BlockingStore, LeaseLoss};
use malleable::{At, Error, Executor, Folded, Outcome};

/// Environment of the holder process: its store, store options (`k=v` separated by `;`),
/// job id and lease in milliseconds.
const STORE_ENV: &str = "MALLEABLE_TEST_LEASE_STORE";
const OPTIONS_ENV: &str = "MALLEABLE_TEST_LEASE_OPTIONS";
const JOB_ENV: &str = "MALLEABLE_TEST_LEASE_JOB";
const LEASE_ENV: &str = "MALLEABLE_TEST_LEASE_MS";

/// Σ i for i < n.
fn sum(n: u64) -> u64 {
    n * (n - 1) / 2
}

fn folder(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("malleable-lease-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn builder(url: &str, options: &[(String, String)], job_id: &str) -> malleable::Builder {
    let mut b = Executor::builder()
        .local_workers(1)
        .snapshots(url)
        .job_id(job_id);
    for (k, v) in options {
        b = b.snapshot_option(k, v);
    }
    b
}

fn host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_owned()
}

#[test]
#[ignore = "the body of the holder processes the other tests start"]
fn lease_holder_process() {
    let Ok(url) = std::env::var(STORE_ENV) else {
        return;
    };
    let options: Vec<(String, String)> = std::env::var(OPTIONS_ENV)
        .unwrap_or_default()
        .split(';')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let job_id = std::env::var(JOB_ENV).unwrap();
    let lease = Duration::from_millis(std::env::var(LEASE_ENV).unwrap().parse().unwrap());
    let exec = builder(&url, &options, &job_id)
        .job_lease(lease)
        .snapshot_every(Duration::from_millis(100))
        .build()
        .unwrap();
    // About 100 s of work: it runs until it is killed, frozen or loses its lease.
    let handle = exec.submit(Folded(Slow { n: 2_000_000 })).unwrap();
    println!("HOLDING {}", std::process::id());
    match handle.wait() {
        Err(Error::LeaseLost { reason, .. }) => {
            println!("LEASE LOST {reason}");
            std::process::exit(5);
        }
        Ok(_) => std::process::exit(0),
        Err(e) => {
            println!("HOLDER ERROR {e}");
            std::process::exit(3);
        }
    }
}

/// A holder process, once it holds the lease, and the rest of its standard output.
struct Holder {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Holder {
    fn start(url: &str, options: &[(String, String)], job_id: &str, lease: Duration) -> Holder {
        let options = options
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(";");
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                crate::common::exact(module_path!(), "lease_holder_process").as_str(),
                "--ignored",
                "--nocapture",
            ])
            .args(["--test-threads", "1"])
            .env(STORE_ENV, url)
            .env(OPTIONS_ENV, options)
            .env(JOB_ENV, job_id)
            .env(LEASE_ENV, lease.as_millis().to_string())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let holder = Holder { child, lines };
        let line = holder.line("HOLDING", Duration::from_secs(60));
        assert_eq!(line, format!("HOLDING {}", holder.child.id()));
        holder
    }

    /// The first line of its output with `prefix`, from `prefix` on, within `within`.
    fn line(&self, prefix: &str, within: Duration) -> String {
        let end = Instant::now() + within;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                // libtest prints `test NAME ... ` before the test's first line.
                Ok(l) if l.contains(prefix) => {
                    return l[l.find(prefix).expect("contained")..].to_owned();
                }
                Ok(_) => {}
                Err(e) => panic!("no line {prefix:?} from the holder process: {e}"),
            }
        }
    }

    fn signal(&self, signal: i32) {
        // SAFETY: `kill` sends a signal to our own child process; no memory is involved.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, signal) }, 0);
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Asserts that `e` is `JobIdHeld` naming a holder of this host with process id `pid`.
fn assert_held_by(e: Error, job_id: &str, pid: u32, lease: Duration) {
    match e {
        Error::JobIdHeld {
            job_id: id,
            holder: Some(holder),
            expires_in,
            ..
        } => {
            assert_eq!(id, job_id);
            assert_eq!(holder.pid, pid);
            assert_eq!(holder.host, host());
            assert!(expires_in <= lease, "{expires_in:?}");
            let since = holder.since.elapsed().unwrap_or_default();
            assert!(since < Duration::from_secs(120), "taken {since:?} ago");
        }
        other => panic!("expected JobIdHeld by {pid}, got {other:?}"),
    }
}

#[test]
fn a_second_run_of_a_held_job_id_is_refused_naming_the_holder_and_runs_after_the_first() {
    let dir = folder("two-runs");
    let url = dir.display().to_string();
    let first = builder(&url, &[], "array").build().unwrap();
    let second = builder(&url, &[], "array").build().unwrap();
    let running = first.submit(Folded(Slow { n: 2_000_000 })).unwrap();

    let lease = malleable::snapshot::DEFAULT_LEASE;
    let me = std::process::id();
    let refused = second.submit(Folded(Slow { n: 1_000 })).unwrap_err();
    let text = refused.to_string();
    assert!(
        text.contains(&format!("process {me} on host {}", host())),
        "{text}"
    );
    assert_held_by(refused, "array", me, lease);
    let refused = second
        .submit_or_resume(Folded(Slow { n: 1_000 }))
        .unwrap_err();
    assert_held_by(refused, "array", me, lease);
    let refused = second.resume::<Folded<Slow>>(&url, At::Latest).unwrap_err();
    assert_held_by(refused, "array", me, lease);
    // The first run went on, alone.
    assert!(!running.is_finished());

    running.cancel();
    assert!(matches!(running.wait(), Err(Error::Cancelled { .. })));
    // Its lease was released when `wait` returned: the second run runs now.
    let n = 2_000;
    let fin = second.run(Folded(Slow { n })).unwrap();
    assert_eq!(fin.value, sum(n));
    // And so does a third, after it, through `submit_or_resume` (nothing to resume).
    let fin = first
        .submit_or_resume(Folded(Slow { n }))
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(fin.finished().unwrap().value, sum(n));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_suspended_run_releases_its_job_id_for_the_run_that_resumes_it() {
    let dir = folder("suspend");
    let url = dir.display().to_string();
    let exec = builder(&url, &[], "job").build().unwrap();
    let n = 40_000;
    let handle = exec.submit(Folded(Slow { n })).unwrap();
    let other = builder(&url, &[], "job").local_workers(2).build().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let snapshot = handle.snapshot().wait().unwrap();
    // A committed snapshot does not make the job id free while its run goes on.
    let refused = other.submit_or_resume(Folded(Slow { n })).unwrap_err();
    assert_held_by(
        refused,
        "job",
        std::process::id(),
        malleable::snapshot::DEFAULT_LEASE,
    );
    let refused = other
        .resume::<Folded<Slow>>(&url, At::Epoch(snapshot.epoch))
        .unwrap_err();
    assert!(matches!(refused, Error::JobIdHeld { .. }), "{refused:?}");
    handle.suspend().wait().unwrap();
    assert!(matches!(handle.wait().unwrap(), Outcome::Suspended(_)));
    // Nothing of the lease is left in the store.
    let lease = dir.join("job").join("lease");
    assert_eq!(std::fs::read_dir(&lease).map_or(0, |d| d.count()), 0);
    let resumed = other.submit_or_resume(Folded(Slow { n })).unwrap();
    assert!(resumed.resumed().is_some());
    assert_eq!(resumed.wait().unwrap().finished().unwrap().value, sum(n));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_run_whose_lease_was_taken_over_commits_no_more_and_ends_with_lease_lost() {
    let dir = folder("taken");
    let url = dir.display().to_string();
    let exec = builder(&url, &[], "job")
        .job_lease(Duration::from_secs(1))
        .snapshot_every(Duration::from_millis(30))
        .build()
        .unwrap();
    let handle = exec.submit(Folded(Slow { n: 2_000_000 })).unwrap();
    let store = BlockingStore::open(&url).unwrap();
    let end = Instant::now() + Duration::from_secs(60);
    while store.latest("job").unwrap().is_none() {
        assert!(Instant::now() < end, "no snapshot committed");
        std::thread::sleep(Duration::from_millis(10));
    }
    // Another run's record above the newest: as a takeover leaves it.
    let lease = dir.join("job").join("lease");
    let newest = std::fs::read_dir(&lease)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .max()
        .unwrap();
    let next = format!("{:020}", newest.parse::<u64>().unwrap() + 1_000);
    let record = serde_json::json!({
        "format": 1, "released": false, "host": "elsewhere", "pid": 4242, "run": "other",
        "taken_unix_ms": 0, "written_unix_ms": 0, "lease_ms": 1000,
    });
    std::fs::write(lease.join(next), record.to_string()).unwrap();
    let planted = store.latest("job").unwrap().unwrap().epoch;

    let started = Instant::now();
    match handle.wait() {
        Err(Error::LeaseLost {
            job_id,
            reason: LeaseLoss::TakenOver(Some(by)),
            ..
        }) => {
            assert_eq!(job_id, "job");
            assert_eq!((by.host.as_str(), by.pid), ("elsewhere", 4242));
        }
        other => panic!("expected LeaseLost, got {other:?}"),
    }
    // Found out at the next renewal (a quarter lease) or the next commit's check.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // At most the snapshot whose check came before the record was planted committed.
    let after = store.latest("job").unwrap().unwrap().epoch;
    assert!(after <= planted + 1, "committed {planted} then {after}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A second process is refused while the holder runs; the holder is killed; its lease is
/// taken over once expired, and the job resumes from the holder's snapshots.
fn refused_then_taken_over_after_a_kill(url: &str, options: &[(String, String)]) {
    let lease = Duration::from_millis(1_500);
    let mut holder = Holder::start(url, options, "killed", lease);
    let pid = holder.child.id();
    let exec = builder(url, options, "killed")
        .job_lease(lease)
        .build()
        .unwrap();
    let n = 2_000_000;
    let refused = exec.submit_or_resume(Folded(Slow { n })).unwrap_err();
    assert_held_by(refused, "killed", pid, lease);
    // Let the holder commit a snapshot or two, then kill it.
    std::thread::sleep(Duration::from_millis(400));
    holder.signal(libc::SIGKILL);
    let _ = holder.child.wait();
    let killed = Instant::now();
    let handle = loop {
        match exec.submit_or_resume(Folded(Slow { n })) {
            Ok(h) => break h,
            Err(e @ Error::JobIdHeld { .. }) => {
                assert!(killed.elapsed() < 4 * lease, "still refused: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("{e:?}"),
        }
    };
    // Not before it expired: a lease after its last renewal (which may have been a quarter
    // lease before the kill), then half a lease of watching.
    assert!(
        killed.elapsed() >= lease / 2,
        "taken over {:?} after the kill",
        killed.elapsed()
    );
    assert!(
        handle.resumed().is_some(),
        "resumed from the holder's snapshot"
    );
    handle.cancel();
    assert!(matches!(handle.wait(), Err(Error::Cancelled { .. })));
}

#[test]
fn a_killed_holder_process_is_taken_over_after_its_lease_on_the_folder_store() {
    let dir = folder("killed");
    refused_then_taken_over_after_a_kill(&format!("file://{}", dir.display()), &[]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_frozen_holder_process_taken_over_ends_with_lease_lost_when_it_wakes() {
    let dir = folder("frozen");
    let url = format!("file://{}", dir.display());
    let lease = Duration::from_millis(1_000);
    let mut holder = Holder::start(&url, &[], "frozen", lease);
    std::thread::sleep(Duration::from_millis(300));
    holder.signal(libc::SIGSTOP);
    let end = Instant::now() + Duration::from_secs(10);
    while !common::procs::stopped(holder.child.id()) {
        assert!(Instant::now() < end, "the holder did not stop");
        std::thread::sleep(Duration::from_millis(5));
    }
    let exec = builder(&url, &[], "frozen")
        .job_lease(lease)
        .build()
        .unwrap();
    let handle = loop {
        match exec.submit(Folded(Slow { n: 2_000_000 })) {
            Ok(h) => break h,
            Err(Error::JobIdHeld { .. }) => std::thread::sleep(Duration::from_millis(100)),
            Err(e) => panic!("{e:?}"),
        }
    };
    holder.signal(libc::SIGCONT);
    let line = holder.line("LEASE LOST", Duration::from_secs(30));
    assert!(
        line.contains(&format!("process {} on host", std::process::id())),
        "{line}"
    );
    assert_eq!(holder.child.wait().unwrap().code(), Some(5));
    // The run that took over is unaffected.
    assert!(!handle.is_finished());
    handle.cancel();
    let _ = handle.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

#[cfg(feature = "s3")]
#[test]
fn a_held_job_id_on_s3_is_refused_and_a_killed_holder_taken_over() {
    let server = support::seaweed::server();
    let url = format!(
        "s3://{}/lease-{}",
        support::seaweed::BUCKET,
        std::process::id()
    );
    refused_then_taken_over_after_a_kill(&url, &server.options());
}
