//! The processes mode of the examples whose partitions exchange pieces (`heat3d`, `cg`, `ft`
//! with `--processes`), run as the programs they are, on small sizes: each starts two worker
//! processes (itself, re-executed with `--worker ADDR`) over TCP on loopback, grows to three,
//! retires one, has one killed with SIGKILL and rolls back to its latest snapshot, and still
//! gets the sequential kernel's bits. Each test checks the exit status and the lines that say
//! so (see `examples/kernels/processes.rs`).
//!
//! The examples are built with this test's profile and features (`cargo build --example`,
//! once for the three; nothing to do after a whole `cargo test`, which builds them).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// The three examples, built once; their folder (`target/<profile>/examples`).
fn examples() -> &'static Path {
    static FOLDER: OnceLock<PathBuf> = OnceLock::new();
    FOLDER.get_or_init(|| {
        let mut cargo = Command::new(env!("CARGO"));
        cargo.current_dir(env!("CARGO_MANIFEST_DIR")).args([
            "build",
            "--example",
            "heat3d",
            "--example",
            "cg",
            "--example",
            "ft",
        ]);
        let mut features = Vec::new();
        if cfg!(feature = "s3") {
            features.push("s3");
        }
        if cfg!(feature = "cli") {
            features.push("cli");
        }
        if cfg!(feature = "sim") {
            features.push("sim");
        }
        if !features.is_empty() {
            cargo.args(["--features", &features.join(",")]);
        }
        if !cfg!(debug_assertions) {
            cargo.arg("--release");
        }
        let status = cargo.status().expect("run cargo");
        assert!(status.success(), "cargo build --example …: {status}");
        // This test is target/<profile>/deps/kernels_processes-<hash>; the examples are
        // next to deps/.
        let exe = std::env::current_exe().unwrap();
        exe.parent()
            .and_then(Path::parent)
            .expect("target/<profile>")
            .join("examples")
    })
}

/// Runs example `name` with `args`; its standard output, once it has exited with success.
fn run(name: &str, args: &[&str]) -> String {
    let program = examples().join(name);
    assert!(program.is_file(), "{} is missing", program.display());
    let out = Command::new(&program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", program.display()));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{name} {args:?}: {}\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Checks the lines of one run in the processes mode: every step of the scenario, one
/// rollback with phases run again, the coordinator's traffic, a line per worker process,
/// and the bit-for-bit check.
fn assert_scenario(name: &str, out: &str) {
    let has = |what: &str| out.lines().any(|l| l.contains(what));
    let count = |what: &str| out.lines().filter(|l| l.starts_with(what)).count();
    for step in [
        "processes: the coordinator listens on 127.0.0.1:",
        "scale_remote(2): two worker processes joined",
        "scale_remote(3): a third worker process joined",
        "retire_remote(1): the third worker process retires",
        "killed with SIGKILL",
        "rolled back from phase",
        "check  malleable: ok",
        "all checks passed",
    ] {
        assert!(has(step), "{name}: no line with {step:?} in\n{out}");
    }
    assert_eq!(count("rollback "), 1, "{name}: one rollback, in\n{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("phase ") && l.ends_with("(again)")),
        "{name}: no phase ran again after the rollback, in\n{out}"
    );

    // The coordinator's traffic: messages both ways.
    let traffic = out
        .lines()
        .find(|l| l.starts_with("coordinator  "))
        .unwrap_or_else(|| panic!("{name}: no traffic line in\n{out}"));
    let messages_in: u64 = traffic["coordinator  ".len()..]
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{name}: {traffic:?}"));
    assert!(messages_in > 0, "{name}: {traffic:?}");

    // A line per launched process: the killed one, one that stayed to the end, and the
    // retired one.
    let worker = |i: usize| {
        out.lines()
            .find(|l| l.starts_with(&format!("worker process {i} (pid ")))
            .unwrap_or_else(|| panic!("{name}: no line for worker process {i} in\n{out}"))
    };
    assert!(
        worker(0).ends_with("killed with SIGKILL, no report"),
        "{name}: {}",
        worker(0)
    );
    for (i, role) in [(1, ", to the end): "), (2, ", retired): ")] {
        let line = worker(i);
        assert!(
            line.contains(role) && line.contains(" to the coordinator; to its peers "),
            "{name}: {line}"
        );
    }
}

// Each run is given four times the phases its example takes by default with `--processes`:
// the scenario's steps are paced by phases (a tenth of the run apart), but its kill waits
// for a snapshot to commit, which takes what the machine gives it. In a CI run on a busy
// machine heat3d's timeline printed the retire at 0.118 s (phase 42) and the kill, once a
// snapshot had committed, at 0.572 s (phase 199 of 200): the run ended before the rollback,
// and the example said so. Four times the phases give the same steps four times the time.

#[test]
fn heat3d_with_worker_processes_that_come_go_and_die_gives_the_sequential_bits() {
    let out = run(
        "heat3d",
        &[
            "--processes",
            "--n",
            "16",
            "--cut",
            "3x2",
            "--phases",
            "800",
        ],
    );
    assert_scenario("heat3d", &out);
}

#[test]
fn cg_with_worker_processes_that_come_go_and_die_gives_the_sequential_bits() {
    let out = run(
        "cg",
        &[
            "--processes",
            "--side",
            "10",
            "--blocks",
            "8",
            "--iterations",
            "400",
        ],
    );
    assert_scenario("cg", &out);
}

#[test]
fn ft_with_worker_processes_that_come_go_and_die_gives_the_sequential_bits() {
    let out = run(
        "ft",
        &[
            "--processes",
            "--ny",
            "32",
            "--nx",
            "32",
            "--parts",
            "4",
            "--steps",
            "240",
        ],
    );
    assert_scenario("ft", &out);
}
