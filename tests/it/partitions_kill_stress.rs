//! A worker process killed (SIGKILL) at many moments while snapshots are taken every 20 ms
//! of a grid whose partitions the processes hold: a kill often lands while a cut is open
//! (parts asked of the process, partitions on their way, a write in flight). Every run must
//! end: with the grid bit for bit the sequential one and a recorded rollback, or, when no
//! snapshot was committed yet, with [`Error::PartitionsLost`]. A snapshot read back that was
//! not a consistent cut would show in the grid.
//!
//! A regression test: a rollback that began while a snapshot was being written waited for
//! that write, and nothing went on with it once the write ended; the job stayed halted with
//! one process left, no rollback recorded and no phase ending (the first run, a kill in
//! phase 8, hit it every time).
//!
//! Worker processes are this test binary, re-executed to run [`worker_process`].

use std::process::Child;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use malleable::cluster::{Registry, WorkerOptions};
use malleable::{Banded, Error, Executor, JobHandle, Outcome};

use crate::common;
use common::grid::{Grid, sequential};
use common::procs::{serve_and_exit, start_worker};

const ADDR_ENV: &str = "MALLEABLE_TEST_KILL_STRESS_ADDR";

/// How long a run may take before it counts as stuck.
const STUCK: Duration = Duration::from_secs(20);

#[test]
#[ignore = "the body of the worker processes the other tests start"]
fn worker_process() {
    let Ok(addr) = std::env::var(ADDR_ENV) else {
        return;
    };
    let options = WorkerOptions::from_env().unwrap().threads(1);
    let registry = Registry::new().register::<Banded<Grid>>();
    // Started before its job is submitted: until the job runs, the coordinator refuses it
    // as a worker of no running job; it tries again.
    serve_and_exit(&addr, &registry, options, STUCK);
}

fn start(addr: &str) -> Child {
    start_worker(module_path!(), ADDR_ENV, addr)
}

fn until(what: &str, h: &JobHandle<Banded<Grid>>, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < STUCK,
            "timed out: {what}; {:?}",
            h.progress()
        );
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// One run: `local` local workers and two worker processes; the first process is killed
/// `delay` after phase `phase` has started. Returns how the run ended.
fn run(name: &str, local: usize, phase: u64, delay: Duration) -> &'static str {
    let dir = std::env::temp_dir().join(format!(
        "malleable-kill-stress-{name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let url = format!("file://{}", dir.display());
    let exec = Executor::builder()
        .local_workers(local)
        .listen("127.0.0.1:0")
        // A kill closes the process's connection: the loss is seen at once, whatever the
        // lease. The lease is for a process that falls silent, which this test does not
        // make: long enough that a process starved by a loaded machine (CI runs other
        // tests beside this one) is not given up.
        .heartbeat(Duration::from_millis(100), Duration::from_secs(10))
        .snapshots(&url)
        .snapshot_every(Duration::from_millis(20))
        .build()
        .unwrap();
    let addr = exec.local_addr().unwrap().to_string();
    let mut a = start(&addr);
    let mut b = start(&addr);
    // Both processes are up when the job starts, so that both hold partitions.
    std::thread::sleep(Duration::from_millis(300));
    // 24 bands whose rows pause 60 µs every 8 rows: a phase takes a few milliseconds, and a
    // 20 ms snapshot period cuts through phases.
    let job = Grid {
        bands: 24,
        pace_us: 60,
        pace_every: 8,
        ..Grid::new(200, 48, 120)
    };
    let h = exec.submit(Banded(job.clone())).unwrap();
    let (tx, rx) = mpsc::channel();
    let h2 = h.clone();
    std::thread::spawn(move || {
        let _ = tx.send(h2.wait());
    });
    until("two processes", &h, || h.remote_workers() == 2);
    until("the phase of the kill", &h, || h.progress().phase >= phase);
    std::thread::sleep(delay);
    a.kill().unwrap();
    let _ = a.wait();
    let ended = rx.recv_timeout(STUCK);
    // The coordinator's side of the last connections lost or refused (the killed process's
    // among them), newest first.
    let lost: Vec<_> = exec.peer_errors().into_iter().rev().take(4).collect();
    let diagnosis = format!(
        "{name}: {:?}; rollbacks {:?}; snapshot failures {} (last {:?}); connections lost {lost:?}",
        h.progress(),
        h.rollbacks(),
        h.snapshot_failures(),
        h.last_snapshot_error(),
    );
    let Ok(ended) = ended else {
        let _ = b.kill();
        let _ = b.wait();
        panic!("stuck after a kill: {diagnosis}");
    };
    let how = match ended {
        Ok(Outcome::Finished(f)) => {
            let got = f.into_value();
            let want = sequential(&job);
            assert_eq!(got.len(), want.len(), "{diagnosis}");
            if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
                panic!("row {i} differs: {diagnosis}");
            }
            let rollbacks = h.rollbacks();
            // None when the killed process held no partition any more: with a local worker,
            // a process slowed by a loaded machine can see every partition balanced away.
            assert!(rollbacks.len() <= 1, "{diagnosis}");
            if rollbacks.is_empty() {
                assert!(
                    local > 0,
                    "a process alone with others lost nothing: {diagnosis}"
                );
                "finished, nothing lost"
            } else {
                assert!(!rollbacks[0].lost.is_empty(), "{diagnosis}");
                assert!(rollbacks[0].recovered.is_some(), "{diagnosis}");
                "rolled back"
            }
        }
        Err(Error::PartitionsLost { chunks, .. }) => {
            // Only before any commit: the job had nothing to go back to.
            assert!(!chunks.is_empty(), "{diagnosis}");
            assert!(h.rollbacks().is_empty(), "{diagnosis}");
            "lost before a snapshot"
        }
        other => panic!("{diagnosis}: ended with {other:?}"),
    };
    let status = b.wait().unwrap();
    assert!(
        status.success(),
        "the process not killed ended with {status}: {diagnosis}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    how
}

/// Kills at different phases and moments within a phase, with and without a local worker.
#[test]
fn a_process_killed_while_snapshots_come_every_20_ms_never_leaves_the_job_stuck() {
    let started = Instant::now();
    let moments = [
        (0, 8, 0),
        (0, 20, 700),
        (1, 30, 1500),
        (0, 45, 300),
        (1, 55, 2300),
        (0, 65, 1100),
    ];
    let mut rolled_back = 0;
    for (i, &(local, phase, delay_us)) in moments.iter().enumerate() {
        let how = run(
            &format!("run{i}"),
            local,
            phase,
            Duration::from_micros(delay_us),
        );
        println!("run {i}: {local} local, killed in phase {phase} + {delay_us} us: {how}");
        rolled_back += usize::from(how == "rolled back");
    }
    assert!(
        rolled_back > 0,
        "no run rolled back: the kills came too early"
    );
    println!("{} runs in {:?}", moments.len(), started.elapsed());
}
