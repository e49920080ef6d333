//! The layering rules of `src/lib.rs`, checked on the source: the pure layer (`schedule`)
//! uses no tokio, crossbeam, atomics, clock or crate-wide error; the wire (`src/wire/`)
//! knows no job, runner, worker process or executor; the executor and the worker process
//! never import each other, and no leaf layer imports the executor.

use std::path::{Path, PathBuf};

fn sources(dir: &str) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&Path::new(env!("CARGO_MANIFEST_DIR")).join(dir), &mut out);
    assert!(!out.is_empty(), "no source under {dir}");
    out
}

/// Lines of code (comments left out) under `dir` that mention any of `forbidden`.
fn offenders(dir: &str, forbidden: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for file in sources(dir) {
        let text = std::fs::read_to_string(&file).unwrap();
        offending_lines(&file, &text, forbidden, &mut found);
    }
    found
}

/// Lines of `text` (the code of `file`, comments left out) that mention any of `forbidden`,
/// added to `found`.
fn offending_lines(file: &Path, text: &str, forbidden: &[&str], found: &mut Vec<String>) {
    for (i, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        for f in forbidden {
            if code.contains(f) {
                found.push(format!("{}:{}: {}", file.display(), i + 1, line.trim()));
            }
        }
    }
}

/// The code of `file` (under the crate's root) before its unit tests, which may use what
/// the code may not (a clock to make the times they hand it, what they hand it).
fn code_before_tests(file: &Path) -> String {
    let text = std::fs::read_to_string(file).unwrap();
    text.split("#[cfg(test)]").next().unwrap_or("").to_owned()
}

#[test]
fn the_schedule_layer_is_pure() {
    let found = offenders(
        "src/schedule",
        &[
            "tokio",
            "crossbeam",
            "atomic",
            "Atomic",
            "Instant",
            "SystemTime",
            "crate::Error",
            "crate::Result",
            "crate::error",
            "std::thread",
            "Mutex",
        ],
    );
    assert!(found.is_empty(), "{found:#?}");
}

#[test]
fn the_wire_knows_no_job_and_no_executor() {
    let found = offenders(
        "src/wire",
        &[
            "crate::job",
            "crate::Job",
            "crate::run",
            "crate::worker",
            "crate::executor",
            "crate::schedule",
        ],
    );
    assert!(found.is_empty(), "{found:#?}");
}

/// The cluster simulation (`src/executor/sim.rs`, compiled for the crate's tests and, with the
/// hidden `sim` feature, for its benches) runs the coordinator's state and simulated worker
/// processes side by side: it is the one place that names both, by design. (Its driver for
/// the bench at scale, `src/executor/sim/scale.rs`, reaches the worker process through it.)
const SIMULATION: &str = "src/executor/sim.rs";

#[test]
fn the_executor_and_the_worker_process_never_import_each_other() {
    let found: Vec<String> = offenders("src/executor", &["crate::worker"])
        .into_iter()
        .filter(|line| !line.contains(SIMULATION))
        .collect();
    assert!(found.is_empty(), "{found:#?}");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for module in ["src/executor/mod.rs", "src/worker/mod.rs"] {
        let text = std::fs::read_to_string(root.join(module)).unwrap();
        assert!(
            text.contains("#[cfg(test)]\nmod sim;")
                || text.contains("#[cfg(test)]\npub(crate) mod sim;")
                || text.contains(
                    "#[cfg(any(test, feature = \"sim\"))]\n\
                     #[cfg_attr(not(test), allow(dead_code))]\n\
                     pub(crate) mod sim;"
                ),
            "{module}: the simulation is compiled for tests (and the hidden `sim` feature) only"
        );
    }
    for leaf in [
        "src/worker",
        "src/run",
        "src/snapshot",
        "src/wire",
        "src/schedule",
    ] {
        let found = offenders(leaf, &["crate::executor"]);
        assert!(found.is_empty(), "{found:#?}");
    }
}

/// The worker process's protocol is a pure machine (`src/worker/machine.rs`): it is handed
/// the time and the frames, and its orders are carried out by the I/O loop (`io.rs`). It
/// reads no clock, spawns nothing, and knows no socket, channel, lock or atomic.
#[test]
fn the_worker_machine_is_pure() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/worker/machine.rs");
    let mut found = Vec::new();
    offending_lines(
        &file,
        &code_before_tests(&file),
        &[
            "tokio",
            "crossbeam",
            "atomic",
            "Atomic",
            "Instant::now",
            "SystemTime",
            "std::thread",
            "Mutex",
            "spawn",
            "TcpStream",
            "std::net",
            "std::sync::mpsc",
        ],
        &mut found,
    );
    assert!(found.is_empty(), "{found:#?}");
}

/// The coordinator's state (`State` in `src/executor/job_run.rs` and the files that hold its
/// other parts) decides; its drivers carry out (`links.rs`: mailboxes, connections, store
/// operations; `connection.rs`: a process's socket task; `threads.rs`: local threads;
/// `io.rs`: the store; `updates.rs`: the progress channel). The state's files start no task
/// or thread, hold no channel or atomic, read no clock, send no timeline record, hold no
/// started process and never name the run's shared handle (`Shared`), through which a
/// driver reaches sockets, runtimes and threads.
#[test]
fn the_coordinator_s_state_only_decides() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    for file in [
        "job_run.rs",
        "remote.rs",
        "snapshot.rs",
        "rollback.rs",
        "finish.rs",
        "members.rs",
        "local.rs",
        "progress.rs",
        "watch.rs",
    ] {
        let path = root.join("src/executor").join(file);
        offending_lines(
            &path,
            &code_before_tests(&path),
            &[
                "tokio",
                "crossbeam",
                "atomic",
                "Atomic",
                "Instant::now",
                "SystemTime::now",
                ".elapsed()",
                "thread::spawn",
                "thread::Builder",
                "Shared<",
                // Reports go out as orders; started processes are the driver's.
                "sink.send",
                "try_send",
                "Launched",
                "try_wait",
            ],
            &mut found,
        );
    }
    assert!(found.is_empty(), "{found:#?}");
}
