//! Autoscaling and draining with real worker processes (this test binary re-executed, real
//! sockets on loopback), both sides checked:
//!
//! - the decider asks for worker processes through the executor's launcher, they join, the
//!   measured join delay replaces the configured guess, and each process ends cleanly having
//!   done work; a job with no owned partitions is measured to move no bytes;
//! - with owned partitions, the bytes that move to a process the decider added are measured
//!   as the cost of that change;
//! - a process that announces its own grace period (`MALLEABLE_GRACE`) and then cannot hand
//!   its partitions back in time is let go when the grace period ends (not by its lease), the
//!   job rolls back to its latest snapshot, and the grid is exact.

use std::io;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use malleable::cluster::{
    self, LaunchSpec, Launched, Launcher, Registry, TOKEN_ENV, WorkerOptions,
};
use malleable::schedule::{Autoscale, Costs, Hysteresis, Reason};
use malleable::{Banded, Chunking, Executor, Folded, Outcome};

use crate::common;
use common::grid::{Grid, STALL_ENV, sequential};
use common::slow::Slow;

const ADDR_ENV: &str = "MALLEABLE_TEST_AUTOSCALE_ADDR";

#[test]
#[ignore = "the body of the worker processes the other tests start"]
fn worker_process() {
    let Ok(addr) = std::env::var(ADDR_ENV) else {
        return;
    };
    let mut options = WorkerOptions::from_env().unwrap().threads(1);
    if std::env::var_os(cluster::GRACE_ENV).is_some() {
        options = options.stop_on_signals();
    }
    let registry = Registry::new()
        .register::<Folded<Slow>>()
        .register::<Banded<Grid>>();
    match cluster::serve(&addr, &registry, options) {
        Ok(served) => {
            println!("SERVED done={}", served.chunks_done);
            std::process::exit(0);
        }
        Err(e) => {
            println!("WORKER ERROR {e}");
            std::process::exit(3);
        }
    }
}

/// A worker process started, and the file of its output.
type Process = (Arc<Mutex<Child>>, PathBuf);

/// Starts this test binary as a worker process; keeps each child and its output's file.
#[derive(Debug, Clone)]
struct Spawner {
    dir: PathBuf,
    started: Arc<Mutex<Vec<Process>>>,
}

#[derive(Debug)]
struct Started(Arc<Mutex<Child>>);

impl Launched for Started {
    fn describe(&self) -> String {
        format!("test worker process {}", self.0.lock().unwrap().id())
    }
    fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        self.0.lock().unwrap().try_wait()
    }
    fn kill(&mut self) -> io::Result<()> {
        let mut c = self.0.lock().unwrap();
        c.kill()?;
        c.wait().map(drop)
    }
}

impl Launcher for Spawner {
    fn launch(&self, spec: &LaunchSpec) -> io::Result<Box<dyn Launched>> {
        let out = self.dir.join(format!("worker-{}.out", spec.index));
        let child = Command::new(std::env::current_exe()?)
            .args([
                "--exact",
                crate::common::exact(module_path!(), "worker_process").as_str(),
                "--ignored",
                "--nocapture",
            ])
            .args(["--test-threads", "1"])
            .env(ADDR_ENV, spec.addr.to_string())
            .env_remove(TOKEN_ENV)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out)?)
            .spawn()?;
        let child = Arc::new(Mutex::new(child));
        self.started.lock().unwrap().push((Arc::clone(&child), out));
        Ok(Box::new(Started(child)))
    }
}

impl Spawner {
    fn new(name: &str) -> Spawner {
        let dir = std::env::temp_dir().join(format!(
            "malleable-autoscale-remote-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Spawner {
            dir,
            started: Arc::default(),
        }
    }

    /// Waits for every process started to exit; returns each one's status and output.
    fn reports(&self) -> Vec<(ExitStatus, String)> {
        let started = self.started.lock().unwrap().clone();
        started
            .iter()
            .map(|(child, out)| {
                let status = child.lock().unwrap().wait().unwrap();
                (status, std::fs::read_to_string(out).unwrap_or_default())
            })
            .collect()
    }
}

impl Drop for Spawner {
    fn drop(&mut self) {
        if Arc::strong_count(&self.started) == 1 {
            for (child, _) in self.started.lock().unwrap().iter() {
                let mut c = child.lock().unwrap();
                let _ = c.kill();
                let _ = c.wait();
            }
            if !std::thread::panicking() {
                let _ = std::fs::remove_dir_all(&self.dir);
            }
        }
    }
}

/// A target no machine reaches, one local thread at most, up to `max_remote` processes;
/// short periods so that the test takes seconds; a configured join delay and move cost
/// that measurements must replace.
fn greedy(max_remote: usize) -> Autoscale {
    Autoscale::throughput(1e12)
        .local(1, 1)
        .remote(0, max_remote)
        .period(Duration::from_millis(50))
        .hysteresis(Hysteresis {
            cooldown: Duration::from_millis(300),
            window: 4,
            ..Hysteresis::default()
        })
        .costs(Costs {
            remote_join: Duration::from_millis(700),
            move_bytes: 123,
            ..Costs::default()
        })
}

fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "timed out: {what}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn the_decider_launches_worker_processes_and_measures_their_join() {
    let spawner = Spawner::new("launch");
    let exec = Executor::builder()
        .local_workers(1)
        .chunking(Chunking::Count(512))
        .listen("127.0.0.1:0")
        .heartbeat(Duration::from_millis(100), Duration::from_secs(3))
        .launcher(spawner.clone())
        .autoscale(greedy(2))
        .build()
        .unwrap();
    let n = 120_000;
    let h = exec.submit(Folded(Slow { n })).unwrap();
    let mut most = 0;
    while !h.is_finished() {
        most = most.max(h.remote_workers());
        std::thread::sleep(Duration::from_millis(2));
    }
    let status = h.autoscale().expect("the autoscaler measured the job");
    eprintln!("{status:?}");
    let value = h.wait().unwrap().finished().unwrap().into_value();
    assert_eq!(value, n * (n - 1) / 2);
    assert_eq!(most, 2, "the decider grew the job to its 2 processes");

    // The coordinator's side: the decision, with its reason, and what it measured.
    assert!(status.decisions >= 1, "{status:?}");
    let grow = status.last.expect("a last decision");
    assert!(
        matches!(
            grow.reason,
            Reason::BelowTarget { .. } | Reason::NoGain { .. }
        ),
        "{grow}"
    );
    assert_ne!(
        status.join_delay,
        Duration::from_millis(700),
        "the join delay was measured: {status:?}"
    );
    assert!(status.join_delay < Duration::from_secs(10), "{status:?}");
    assert_eq!(
        status.move_bytes, 0,
        "no partitions, nothing moved: {status:?}"
    );

    // The processes' side: each joined, did work and ended cleanly when the job did.
    let reports = spawner.reports();
    assert_eq!(reports.len(), 2, "{reports:?}");
    for (status, out) in &reports {
        assert!(status.success(), "{status:?}: {out}");
        let done: u64 = out
            .lines()
            .find_map(|l| l.split("SERVED done=").nth(1))
            .and_then(|d| d.trim().parse().ok())
            .unwrap_or_else(|| panic!("no report in {out:?}"));
        assert!(done > 0, "{out}");
    }
}

#[test]
fn the_bytes_of_partitions_moved_to_an_added_process_are_measured() {
    let spawner = Spawner::new("move");
    let exec = Executor::builder()
        .local_workers(1)
        .listen("127.0.0.1:0")
        .heartbeat(Duration::from_millis(100), Duration::from_secs(3))
        .launcher(spawner.clone())
        // Phases of about 20 ms: a measurement spans several of them.
        .autoscale(greedy(1).period(Duration::from_millis(250)))
        .build()
        .unwrap();
    // 8 bands of 30 rows of 1024 cells: 245 KiB each.
    let job = Grid {
        bands: 8,
        pace_us: 20,
        pace_every: 1,
        ..Grid::new(240, 1024, 400)
    };
    let h = exec.submit(Banded(job.clone())).unwrap();
    until("the process and a measured move", || {
        h.is_finished() || h.autoscale().is_some_and(|s| s.move_bytes != 123)
    });
    let status = h.autoscale().unwrap();
    eprintln!("{status:?}");
    let got = match h.wait().unwrap() {
        Outcome::Finished(f) => f.into_value(),
        other => panic!("not finished: {other:?}"),
    };
    assert_eq!(got, sequential(&job));
    // At least one band of 30 × 1024 cells (8 bytes each) went to the process, and at most
    // all 8 bands, twice (there and back).
    let band = 30 * 1024 * 8;
    assert!(
        (band..=2 * 8 * band + 8 * 4096).contains(&status.move_bytes),
        "{status:?}"
    );
    for (status, out) in spawner.reports() {
        assert!(status.success(), "{status:?}: {out}");
    }
}
/// A process with a grace period of its own gets SIGTERM while its running partition cannot
/// be handed back (its steps stall): the coordinator lets it go when the grace period ends,
/// well before its lease would, and the job rolls back to its snapshot, exactly.
#[test]
fn a_process_that_cannot_leave_within_its_own_grace_period_is_let_go() {
    let dir = std::env::temp_dir().join(format!(
        "malleable-autoscale-remote-grace-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let stall = dir.join("stall");
    let exec = Executor::builder()
        .local_workers(1)
        .listen("127.0.0.1:0")
        .heartbeat(Duration::from_millis(100), Duration::from_secs(5))
        .snapshots(format!("file://{}", dir.join("store").display()))
        .build()
        .unwrap();
    let addr = exec.local_addr().unwrap().to_string();
    let job = Grid {
        bands: 8,
        pace_us: 30,
        pace_every: 1,
        ..Grid::new(240, 64, 300)
    };
    let h = exec.submit(Banded(job.clone())).unwrap();
    until("phase 5", || h.progress().phase >= 5);
    let snap = h.snapshot().wait().unwrap();
    let mut a = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            crate::common::exact(module_path!(), "worker_process").as_str(),
            "--ignored",
            "--nocapture",
        ])
        .args(["--test-threads", "1"])
        .env(ADDR_ENV, &addr)
        .env(cluster::GRACE_ENV, "1")
        .env(STALL_ENV, &stall)
        .env_remove(TOKEN_ENV)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    until("one process", || h.remote_workers() == 1);
    let at = h.progress().phase;
    until("the process running phases", || {
        h.progress().phase >= at + 3
    });
    // Its steps stall from now on, then it is told to stop: it sends its grace period.
    std::fs::write(&stall, b"").unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let t = Instant::now();
    let s = Command::new("kill")
        .arg("-TERM")
        .arg(a.id().to_string())
        .status()
        .unwrap();
    assert!(s.success());
    until("the rollback", || {
        !h.rollbacks().is_empty() || h.is_finished()
    });
    let let_go_after = t.elapsed();
    std::fs::remove_file(&stall).unwrap();
    if h.rollbacks().is_empty() {
        let _ = a.kill();
        panic!("ended without a rollback: {:?}", h.wait().map(|_| ()));
    }
    let r = h.rollbacks()[0].clone();
    let got = match h.wait().unwrap() {
        Outcome::Finished(f) => f.into_value(),
        other => panic!("not finished: {other:?}"),
    };
    assert_eq!(got, sequential(&job));
    assert!(
        let_go_after >= Duration::from_millis(900) && let_go_after < Duration::from_secs(4),
        "let go after {let_go_after:?}: at the end of its 1 s grace period, before its 5 s lease"
    );
    assert!(r.epoch >= snap.epoch, "{r:?}");
    let _ = a.kill();
    let _ = a.wait();
    let _ = std::fs::remove_dir_all(&dir);
}
