//! Worker processes of the tests: the test binary started again to run its ignored test
//! `worker_process`, which serves the coordinator whose address it finds in the environment.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use malleable::Executor;
use malleable::cluster::{self, Registry, TOKEN_ENV, WorkerOptions};

/// A coordinator with `local` local workers, listening on loopback for worker processes,
/// heartbeats every 100 ms and a lease of 3 s.
pub fn coordinator(local: usize) -> Executor {
    Executor::builder()
        .local_workers(local)
        .listen("127.0.0.1:0")
        .heartbeat(Duration::from_millis(100), Duration::from_secs(3))
        .build()
        .unwrap()
}

/// Starts this test binary again as a worker process running `worker_process` of the
/// module whose `module_path!()` is `module` (see [`super::exact`]), with `addr` in the
/// environment variable `env`, no token, and its standard output discarded.
pub fn start_worker(module: &str, env: &str, addr: &str) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            super::exact(module, "worker_process").as_str(),
            "--ignored",
            "--nocapture",
        ])
        .args(["--test-threads", "1"])
        .env(env, addr)
        .env_remove(TOKEN_ENV)
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

/// The body of a worker process: serves the coordinator at `addr` and exits with status 0
/// once its job is over, 3 on an error (printed), and 4 if it was refused as a worker of no
/// running job for `refused` (it tries again until then: a process started before its job,
/// or a resumed one, runs; one started as the job ended is refused for good).
pub fn serve_and_exit(
    addr: &str,
    registry: &Registry,
    options: WorkerOptions,
    refused: Duration,
) -> ! {
    let start = Instant::now();
    loop {
        match cluster::serve(addr, registry, options.clone()) {
            Err(cluster::Error::UnknownJob { .. }) if start.elapsed() < refused => {
                std::thread::sleep(Duration::from_micros(500));
            }
            // Refused for good: no job it runs started in time, or the job had ended.
            Err(cluster::Error::UnknownJob { .. } | cluster::Error::JobEnded { .. }) => {
                std::process::exit(4)
            }
            Ok(_) => std::process::exit(0),
            Err(e) => {
                // `Debug` is the report: each cause, in order.
                eprintln!("WORKER ERROR {e:?}");
                std::process::exit(3);
            }
        }
    }
}

/// Whether every thread of process `pid` is stopped (by a signal: state `T`). `kill -STOP`
/// returns before the process's threads have all stopped: each stops when it is next
/// scheduled, and on busy cores one may still answer a message first. A test that relies on
/// the stop waits for this.
pub fn stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|t| {
        std::fs::read_to_string(t.path().join("stat")).is_ok_and(|stat| {
            // The state follows the command's closing parenthesis.
            stat.rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('T'))
        })
    })
}
