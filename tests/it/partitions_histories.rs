//! Random histories of a grid on owned partitions, with real worker processes on loopback:
//! local threads come and go, processes join, are retired, are killed (SIGKILL), snapshots
//! are taken, and the job is suspended and resumed by a new coordinator with another mix of
//! local threads and processes. Each history is drawn from a seed; every one must end with
//! the grid bit for bit the sequential loop's, one rollback per kill that took partitions,
//! and no peer error other than the killed processes'.
//!
//! `MALLEABLE_HISTORIES=N` runs `N` histories (default 4) from seed `MALLEABLE_HISTORY_FIRST`
//! (default 0); `MALLEABLE_HISTORY_SEED=S` runs only history `S` (each prints its seed and its
//! events, to replay one that failed).
//!
//! `MALLEABLE_TEST_LOG=debug` (or `info`, `warn`) prints what the coordinator and the worker
//! processes log, to find out why a history failed.
//!
//! Worker processes are this test binary, re-executed to run [`worker_process`].

use std::process::Child;
use std::time::{Duration, Instant};

use malleable::cluster::{self, Registry, WorkerOptions};
use malleable::{At, Banded, Executor, JobHandle, Outcome};

use crate::common;
use common::grid::{Grid, sequential};
use common::procs::{serve_and_exit, start_worker};

const ADDR_ENV: &str = "MALLEABLE_TEST_HISTORIES_ADDR";

/// How long a history may go without a phase ending before it counts as stuck.
const STUCK: Duration = Duration::from_secs(30);

/// How long a worker process refused as a worker of no running job tries again.
const REFUSED: Duration = Duration::from_secs(3);

/// Logs to standard error at the level `MALLEABLE_TEST_LOG` names, if it is set.
fn log_if_asked(who: &'static str) {
    common::log::log_if_asked("MALLEABLE_TEST_LOG", who);
}

#[test]
#[ignore = "the body of the worker processes the other tests start"]
fn worker_process() {
    let Ok(addr) = std::env::var(ADDR_ENV) else {
        return;
    };
    log_if_asked("worker process");
    let options = WorkerOptions::from_env().unwrap().threads(1);
    let registry = Registry::new().register::<Banded<Grid>>();
    // Started before a resumed job runs: the coordinator refuses it until then; it tries
    // again. One started as the job ended is refused for good: it says so with status 4.
    serve_and_exit(&addr, &registry, options, REFUSED);
}

fn start(addr: &str) -> Child {
    start_worker(module_path!(), ADDR_ENV, addr)
}

/// A small generator (64-bit LCG, high bits) so that a seed replays its history.
struct Draw(u64);

impl Draw {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n.max(1)
    }
}

fn coordinator(local: usize, url: &str) -> Executor {
    Executor::builder()
        .local_workers(local)
        .listen("127.0.0.1:0")
        .heartbeat(Duration::from_millis(50), Duration::from_secs(2))
        .snapshots(url)
        .keep_snapshots(4)
        .build()
        .unwrap()
}

/// One coordinator's part of a history: its processes (alive or not) and what it did.
struct Run {
    exec: Executor,
    handle: JobHandle<Banded<Grid>>,
    procs: Vec<Child>,
    alive: Vec<usize>,
    kills: usize,
}

impl Run {
    fn addr(&self) -> String {
        self.exec.local_addr().unwrap().to_string()
    }
}

/// Events of one history, until the job finishes: returns the grid's value and a log line.
fn history(seed: u64, job: &Grid, dir: &std::path::Path) -> (Vec<u64>, String) {
    let url = format!("file://{}", dir.display());
    let mut draw = Draw(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5bd1_e995);
    let mut log = format!("history {seed}:");
    let local = draw.below(3) as usize;
    let exec = coordinator(local, &url);
    let handle = exec.submit(Banded(job.clone())).unwrap();
    let mut run = Run {
        exec,
        handle,
        procs: Vec::new(),
        alive: Vec::new(),
        kills: 0,
    };
    log += &format!(" local {local};");
    let mut committed = false;
    let mut resumes = 0;
    let mut last_phase = (0, Instant::now());
    loop {
        if run.handle.is_finished() {
            let value = match run.handle.clone().wait() {
                Ok(Outcome::Finished(f)) => f.into_value(),
                Ok(Outcome::Suspended(_)) => {
                    // A suspend asked for below ended this coordinator: a new one resumes.
                    resumes += 1;
                    run = resume(run, &url, &mut draw, &mut log);
                    continue;
                }
                other => panic!("{log}\n{seed}: the job ended with {other:?}"),
            };
            finish(run, &log);
            return (value, log);
        }
        let phase = run.handle.progress().phase;
        if phase != last_phase.0 {
            last_phase = (phase, Instant::now());
        }
        assert!(
            last_phase.1.elapsed() < STUCK,
            "{log}\nno phase ended for {STUCK:?}: {:?}, {} processes, {} local, rollbacks {:?}",
            run.handle.progress(),
            run.handle.remote_workers(),
            run.handle.local_workers(),
            run.handle.rollbacks()
        );
        std::thread::sleep(Duration::from_millis(2 + draw.below(25)));
        // The first snapshot comes early, so that any kill has something to roll back to.
        if !committed {
            if phase >= 2 {
                match run.handle.snapshot().wait() {
                    Ok(id) => {
                        committed = true;
                        log += &format!(" snapshot {};", id.epoch);
                    }
                    Err(e) => log += &format!(" snapshot failed ({e});"),
                }
            }
            // A worker in any case, so that the job moves.
            if run.handle.local_workers() == 0 && run.alive.is_empty() {
                let addr = run.addr();
                run.procs.push(start(&addr));
                run.alive.push(run.procs.len() - 1);
                log += " start;";
            }
            continue;
        }
        match draw.below(12) {
            0 | 1 => {
                let n = draw.below(3) as usize;
                run.handle.set_local_workers(n);
                log += &format!(" local {n};");
            }
            2 | 3 if run.alive.len() < 3 => {
                let addr = run.addr();
                run.procs.push(start(&addr));
                run.alive.push(run.procs.len() - 1);
                log += " start;";
            }
            4 if run.handle.remote_workers() > 0 => {
                run.handle.retire_remote(1);
                log += " retire;";
            }
            5 if !run.alive.is_empty() && run.handle.remote_workers() > 0 => {
                let i = run
                    .alive
                    .remove(draw.below(run.alive.len() as u64) as usize);
                run.procs[i].kill().unwrap();
                let _ = run.procs[i].wait();
                run.kills += 1;
                log += &format!(" kill (phase {phase});");
            }
            6 | 7 => {
                let r = run.handle.snapshot().wait();
                log += &match r {
                    Ok(id) => format!(" snapshot {};", id.epoch),
                    Err(e) => format!(" snapshot failed ({e});"),
                };
            }
            8 if resumes < 2 => {
                let r = run.handle.suspend().wait();
                log += &match r {
                    Ok(id) => format!(" suspend {};", id.epoch),
                    Err(e) => format!(" suspend failed ({e});"),
                };
            }
            _ => {}
        }
        // Never all workers gone for long: the job would wait for one.
        if run.handle.local_workers() == 0 && run.handle.remote_workers() == 0 {
            run.handle.set_local_workers(1);
            log += " local 1;";
        }
    }
}

/// The suspended coordinator's processes end; a new coordinator with another mix resumes.
fn resume(mut run: Run, url: &str, draw: &mut Draw, log: &mut String) -> Run {
    for p in &mut run.procs {
        let _ = p.wait();
    }
    let local = draw.below(3) as usize;
    let procs = draw.below(3) as usize;
    let local = if local + procs == 0 { 1 } else { local };
    let exec = coordinator(local, url);
    let addr = exec.local_addr().unwrap().to_string();
    let started: Vec<Child> = (0..procs).map(|_| start(&addr)).collect();
    let handle = exec.resume::<Banded<Grid>>(url, At::Latest).unwrap();
    *log += &format!(" resumed with {local} local and {procs} processes;");
    Run {
        exec,
        handle,
        alive: (0..started.len()).collect(),
        procs: started,
        kills: 0,
    }
}

/// Checks what the finished coordinator saw, and lets its processes end.
fn finish(mut run: Run, log: &str) {
    let rollbacks = run.handle.rollbacks();
    assert!(
        rollbacks.len() <= run.kills,
        "{log}\nmore rollbacks than kills: {rollbacks:?}"
    );
    for r in &rollbacks {
        assert!(!r.lost.is_empty(), "{log}\n{r:?}");
        assert!(r.to_phase <= r.from_phase, "{log}\n{r:?}");
    }
    for &i in &run.alive {
        let status = run.procs[i].wait().unwrap();
        // 4: started as the job ended, it never joined.
        assert!(
            status.success() || status.code() == Some(4),
            "{log}\na process left with {status}"
        );
    }
    if run.kills == 0 {
        // Processes started before a resumed job ran were refused until it did.
        let errors: Vec<_> = run
            .exec
            .peer_errors()
            .into_iter()
            .filter(|e| {
                !matches!(
                    &**e,
                    cluster::Error::UnknownJob { .. } | cluster::Error::JobEnded { .. }
                )
            })
            .collect();
        assert!(errors.is_empty(), "{log}\n{errors:?}");
    }
}

#[test]
fn grids_are_exact_under_random_histories_of_threads_processes_kills_and_resumes() {
    let job = Grid::new(240, 64, 220);
    let expected = sequential(&job);
    let seeds: Vec<u64> = match std::env::var("MALLEABLE_HISTORY_SEED") {
        Ok(s) => vec![s.parse().unwrap()],
        Err(_) => {
            let var = |name: &str, default: u64| {
                std::env::var(name)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(default)
            };
            let first = var("MALLEABLE_HISTORY_FIRST", 0);
            (first..first + var("MALLEABLE_HISTORIES", 4)).collect()
        }
    };
    log_if_asked("coordinator");
    for seed in seeds {
        let dir =
            std::env::temp_dir().join(format!("malleable-histories-{seed}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let started = Instant::now();
        let (got, log) = history(seed, &job, &dir);
        println!("{log} ({:.1} s)", started.elapsed().as_secs_f64());
        assert_eq!(got.len(), expected.len(), "{log}");
        if let Some(i) = (0..got.len()).find(|&i| got[i] != expected[i]) {
            panic!("{log}\nrow {i} differs");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
