//! Real Slurm: a one-node cluster on this machine (Slurm 22.05 from Debian's `slurm-wlm`),
//! set up by `tests/slurm/provision.sh`, which installs the packages if they are missing and
//! starts the daemons (as root). A test never skips: without Slurm and without the means to
//! install it, it fails with the script's output.
//!
//! The batch jobs run `examples/slurm/job.sbatch`, the very script the README tells users to
//! copy, which runs `examples/slurm_job.rs` (built here with the profile and features of
//! this test). Each first part is slowed down per process ([`PACE_ENV`]) so that it is still
//! running when its signal comes; the part that resumes it runs at full speed, with another
//! worker count, and must give the sequential loop's bits (the program compares them and
//! prints both; the test compares the printed lines too).
//!
//! The node has few CPUs, so the tests take turns ([`serial`]). Every job a test submits is
//! cancelled when the test ends, passed or failed ([`Batch`]'s `Drop`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use malleable::slurm;

/// Read by `examples/slurm_job.rs`: milliseconds of sleep per phase in a process.
const PACE_ENV: &str = "HEAT_SLURM_PACE_MS";
/// Set in this test binary's own child (`child_deadline`): print the allocation's end.
const CHILD_ENV: &str = "MALLEABLE_SLURM_CHILD";

fn manifest_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The name of every batch job these tests submit.
const JOB_NAME: &str = "malleable-test";

/// Runs `tests/slurm/provision.sh` once per test process, then cancels the jobs an earlier
/// run of these tests left behind (killed before it could cancel them); panics with the
/// script's output if it fails.
fn slurm() {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    let done = DONE.get_or_init(|| {
        let script = manifest_dir().join("tests/slurm/provision.sh");
        let out = Command::new("bash")
            .arg(&script)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        print!("{text}");
        if !out.status.success() {
            return Err(format!(
                "{} failed ({}):\n{text}",
                script.display(),
                out.status
            ));
        }
        let left = Command::new("scancel")
            .args(["--name", JOB_NAME])
            .stdin(Stdio::null())
            .status()
            .map_err(|e| format!("cannot run scancel: {e}"))?;
        if left.success() {
            Ok(())
        } else {
            Err(format!("scancel --name {JOB_NAME}: {left}"))
        }
    });
    if let Err(e) = done {
        panic!("no Slurm: {e}");
    }
}

/// One test at a time: the node's CPUs are few, and a job waiting for CPUs held by another
/// test's job would make the timings meaningless.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// The example program, built once with this test's profile and features.
fn program() -> &'static Path {
    static PROGRAM: OnceLock<PathBuf> = OnceLock::new();
    PROGRAM.get_or_init(|| {
        let mut cargo = Command::new(env!("CARGO"));
        cargo
            .current_dir(manifest_dir())
            .args(["build", "--example", "slurm_job"]);
        let mut features = Vec::new();
        if cfg!(feature = "s3") {
            features.push("s3");
        }
        if cfg!(feature = "cli") {
            features.push("cli");
        }
        if !features.is_empty() {
            cargo.args(["--features", &features.join(",")]);
        }
        if !cfg!(debug_assertions) {
            cargo.arg("--release");
        }
        let status = cargo.status().expect("run cargo");
        assert!(
            status.success(),
            "cargo build --example slurm_job: {status}"
        );
        // This test is target/<profile>/deps/slurm-<hash>; the example is next to deps/.
        let exe = std::env::current_exe().unwrap();
        let path = exe
            .parent()
            .and_then(Path::parent)
            .expect("target/<profile>")
            .join("examples/slurm_job");
        assert!(path.is_file(), "{} is missing", path.display());
        path
    })
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A folder for one test's store and job outputs, emptied first.
fn folder(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("slurm-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A submitted batch job; cancelled when dropped (a no-op once it has ended).
struct Batch {
    id: String,
    output: PathBuf,
}

impl Batch {
    /// Submits `examples/slurm/job.sbatch` with `options` for sbatch, `env` for the job and
    /// `args` for the program.
    fn submit(options: &[&str], env: &[(&str, &str)], args: &[&str], output: PathBuf) -> Batch {
        let mut cmd = Command::new("sbatch");
        cmd.current_dir(manifest_dir())
            .arg("--parsable")
            .arg(format!("--job-name={JOB_NAME}"))
            .arg(format!("--output={}", output.display()))
            .args(options)
            .arg("examples/slurm/job.sbatch")
            .args(args)
            .env("HEAT_SLURM_PROGRAM", program())
            .env_remove(PACE_ENV);
        for (k, v) in env {
            cmd.env(k, v);
        }
        Batch::from_sbatch(&mut cmd, output)
    }

    fn from_sbatch(cmd: &mut Command, output: PathBuf) -> Batch {
        let out = run(cmd);
        // `--parsable` prints `id` or `id;cluster`.
        let printed = String::from_utf8_lossy(&out.stdout);
        let id = printed.trim().split(';').next().unwrap_or("").to_owned();
        assert!(
            !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()),
            "sbatch printed {printed:?}"
        );
        println!("submitted batch job {id} ({})", output.display());
        Batch { id, output }
    }

    /// The job's output so far.
    fn output(&self) -> String {
        std::fs::read_to_string(&self.output).unwrap_or_default()
    }

    /// `JobState` and `ExitCode` from `scontrol show job`.
    fn state(&self) -> (String, String) {
        let out = run(Command::new("scontrol").args(["show", "job", "-o", &self.id]));
        let text = String::from_utf8_lossy(&out.stdout);
        let field = |name: &str| {
            text.split_whitespace()
                .find_map(|w| w.strip_prefix(name))
                .unwrap_or("?")
                .to_owned()
        };
        (field("JobState="), field("ExitCode="))
    }

    /// Waits until the output holds `marker`; panics after `timeout` or if the job ended.
    fn wait_for(&self, marker: &str, timeout: Duration) {
        let end = Instant::now() + timeout;
        loop {
            if self.output().contains(marker) {
                return;
            }
            let (state, _) = self.state();
            assert!(
                matches!(state.as_str(), "PENDING" | "RUNNING" | "CONFIGURING"),
                "job {} is {state} and never printed {marker:?}:\n{}",
                self.id,
                self.output()
            );
            assert!(
                Instant::now() < end,
                "job {} did not print {marker:?} within {timeout:?}:\n{}",
                self.id,
                self.output()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until the job has ended and returns how long that took; panics after `timeout`
    /// or unless it ended `COMPLETED` with exit code 0.
    fn wait_completed(&self, timeout: Duration) -> Duration {
        let t = Instant::now();
        loop {
            let (state, exit) = self.state();
            match state.as_str() {
                // SIGNALING: Slurm is delivering a signal to the job (its time limit's, or the
                // batch script's): it has not ended yet.
                "PENDING" | "RUNNING" | "CONFIGURING" | "COMPLETING" | "SIGNALING" => {}
                "COMPLETED" if exit == "0:0" => return t.elapsed(),
                _ => panic!(
                    "job {} ended {state}, exit code {exit}:\n{}",
                    self.id,
                    self.output()
                ),
            }
            assert!(
                t.elapsed() < timeout,
                "job {} still {state} after {timeout:?}:\n{}",
                self.id,
                self.output()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The rest of the output line that starts with `slurm_job: {what}`.
    fn line(&self, what: &str) -> String {
        let marker = format!("slurm_job: {what}");
        let output = self.output();
        output
            .lines()
            .find_map(|l| l.strip_prefix(&marker).map(str::to_owned))
            .unwrap_or_else(|| panic!("job {}: no line {marker:?}:\n{output}", self.id))
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        let _ = Command::new("scancel")
            .arg(&self.id)
            .stdin(Stdio::null())
            .status();
    }
}

/// The job's result and the sequential loop's, as the program printed them, must be the
/// same, and the program's own check must have passed.
fn assert_exact(batch: &Batch) {
    let got = batch.line("finished after ");
    let got = got.split_once(": ").map_or("", |(_, digest)| digest);
    let reference = batch.line("sequential loop: ");
    assert_eq!(got, reference, "job {}", batch.id);
    assert_eq!(
        batch.line("check "),
        "ok: bit-identical to the sequential loop"
    );
}

fn store_url(dir: &Path) -> String {
    format!("file://{}", dir.join("store").display())
}

// ---------------------------------------------------------------------------------------

/// The child: prints what `allocation_deadline` gives, as seconds since the epoch or as the
/// error's variant. Does nothing unless [`CHILD_ENV`] is set.
#[test]
fn child_deadline() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    match slurm::allocation_deadline() {
        Ok(end) => println!(
            "deadline-child: end {}",
            end.duration_since(UNIX_EPOCH).unwrap().as_secs()
        ),
        Err(e) => println!("deadline-child: error {e:?} / {e}"),
    }
}

/// Runs [`child_deadline`] through `launcher` (say, `srun --time=3`) and returns what it printed.
fn deadline_child(launcher: &[&str]) -> String {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new(launcher[0]);
    cmd.args(&launcher[1..])
        .arg(&exe)
        .args([
            "--exact",
            "child_deadline",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "1")
        .env_remove("SLURM_JOB_ID");
    let out = run(&mut cmd);
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.split_once("deadline-child: ").map(|(_, r)| r.to_owned()))
        .unwrap_or_else(|| panic!("the child printed no result:\n{text}"))
}

#[test]
fn allocation_deadline_is_the_end_of_the_time_limit() {
    slurm();
    let _turn = serial();
    let now = || {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
    };

    // In an allocation of 3 minutes (srun makes one for its step).
    let before = now();
    let printed = deadline_child(&[
        "srun",
        "--job-name=malleable-test",
        "--ntasks=1",
        "--time=3",
    ]);
    let after = now();
    let end: u64 = printed
        .strip_prefix("end ")
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("the child printed {printed:?}"));
    println!(
        "in srun --time=3: the allocation ends {} s after the call",
        end as i64 - before as i64
    );
    assert!(
        (before + 180 - 2..=after + 180 + 2).contains(&end),
        "end {end} is not 3 minutes after the start ({before}..{after})"
    );

    // Without a time limit (the partition has none): no end time.
    let printed = deadline_child(&["srun", "--job-name=malleable-test", "--ntasks=1"]);
    assert!(printed.starts_with("error NoEndTime"), "{printed}");

    // Outside an allocation, and with a job id the controller does not know.
    let printed = deadline_child(&["env"]);
    assert!(printed.starts_with("error NotInAllocation"), "{printed}");
    let printed = deadline_child(&["env", "SLURM_JOB_ID=999999999"]);
    assert!(printed.starts_with("error SqueueFailed"), "{printed}");
    assert!(printed.contains("999999999"), "{printed}");

    // Where squeue cannot be started: SLURM_JOB_END_TIME if it is set (newer Slurm sets it;
    // 22.05 does not), else an error that says squeue could not run.
    let printed = deadline_child(&[
        "env",
        "PATH=/nonexistent",
        "SLURM_JOB_ID=7",
        "SLURM_JOB_END_TIME=1795455836",
    ]);
    assert_eq!(printed, "end 1795455836");
    let printed = deadline_child(&["env", "PATH=/nonexistent", "SLURM_JOB_ID=7"]);
    assert!(printed.starts_with("error Squeue {"), "{printed}");
}

/// The fast variant of a time limit: `scancel -b -s USR1` signals the batch script at once.
/// The first part runs with 1 local worker and 2 worker processes, each a job step started
/// by `srun` ([`slurm::SRUN_LAUNCH`]) in an allocation of 2 CPUs: both steps must run at
/// once (without `--exact` the second waits for the first to end). The second part resumes
/// with 2 local workers and no process.
#[test]
fn usr1_suspends_a_batch_job_and_another_count_resumes_it_exactly() {
    slurm();
    let _turn = serial();
    let dir = folder("usr1");
    let store = store_url(&dir);
    let args = [
        "--store", &store, "--job-id", "usr1", "--n", "128", "--phases", "3000",
    ];

    let mut first_args = args.to_vec();
    first_args.extend(["--processes", "2"]);
    let first = Batch::submit(
        &["--ntasks=2", "--time=10"],
        &[(PACE_ENV, "20")],
        &first_args,
        dir.join("first.out"),
    );
    first.wait_for("slurm_job: running", Duration::from_secs(60));
    first.wait_for(
        &format!("(job {}, step 1,", first.id),
        Duration::from_secs(60),
    );
    // Let the worker processes join and hold bands, and the job do some phases.
    std::thread::sleep(Duration::from_secs(3));
    run(Command::new("scancel").args(["--batch", "--signal=USR1", &first.id]));
    let took = first.wait_completed(Duration::from_secs(60));
    println!(
        "first part: ended {:.1} s after scancel -b -s USR1:\n{}",
        took.as_secs_f64(),
        first.output()
    );
    // The allocation's end time was read: 10 minutes from the start, give or take.
    let left: u64 = first
        .line("deadline: the allocation ends in ")
        .trim_end_matches(" s")
        .parse()
        .unwrap();
    assert!(
        (570..=600).contains(&left),
        "{left} s left of a 10 minute job"
    );
    assert!(first.line("suspended to ").contains("usr1"));
    assert_eq!(first.line("worker processes joined: "), "2");
    // The worker processes were steps 0 and 1 of this job.
    for step in 0..2 {
        let step = format!("(job {}, step {step},", first.id);
        assert!(first.output().contains(&step), "no {step}");
    }

    let second = Batch::submit(
        &["--ntasks=1", "--cpus-per-task=2", "--time=10"],
        &[],
        &[&args[..], &["--check"]].concat(),
        dir.join("second.out"),
    );
    let took = second.wait_completed(Duration::from_secs(120));
    println!(
        "second part: {:.1} s:\n{}",
        took.as_secs_f64(),
        second.output()
    );
    let resumed = second.line("resuming ");
    assert!(resumed.contains("with 2 local workers"), "{resumed}");
    let phase: u64 = resumed
        .split_once(" in phase ")
        .and_then(|(_, r)| r.split(' ').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("{resumed}"));
    assert!(phase > 0, "the first part did no phase: {resumed}");
    assert!(second.line("finished after ").starts_with("3000 phases"));
    assert_exact(&second);
}

/// The real time limit, in one test since Slurm's shortest useful limit is minutes: two
/// batch jobs of 2 minutes each, at the same time, on one CPU each.
///
/// - One asks for `--signal=B:USR1@45` and does not read its deadline (`--no-deadline`):
///   only Slurm's signal can suspend it before the limit. Slurm looks at its jobs about once
///   a minute, so the signal comes 45 to about 105 s before the limit: 15 to 75 s after the
///   start, never before the program has installed its handler (a signal that early would
///   kill it: SIGUSR1's default action).
/// - One asks for no signal (submitted with `--wrap`, without the script's directive) and
///   reads its deadline from the allocation: only the deadline can suspend it.
///
/// Each must end `COMPLETED` (a job that the limit ends is `TIMEOUT`) with a snapshot, and
/// a second batch job must resume it with another worker count to the sequential bits.
#[test]
fn the_time_limit_suspends_by_signal_or_by_deadline_and_both_resume_exactly() {
    slurm();
    let _turn = serial();
    let dir = folder("limit");
    let store = store_url(&dir);
    let job = ["--n", "128", "--phases", "3000"];
    // 50 ms a phase: 150 s for 3000 phases, longer than the 2 minute limit.
    let pace = [(PACE_ENV, "50")];

    let by_signal = Batch::submit(
        &["--ntasks=1", "--time=2", "--signal=B:USR1@45"],
        &pace,
        &[
            &job[..],
            &["--store", &store, "--job-id", "signal", "--no-deadline"],
        ]
        .concat(),
        dir.join("signal.out"),
    );
    let wrap = format!(
        "exec {} --store {store} --job-id deadline {}",
        program().display(),
        job.join(" ")
    );
    let by_deadline = Batch::from_sbatch(
        Command::new("sbatch")
            .current_dir(manifest_dir())
            .arg("--parsable")
            .arg(format!("--job-name={JOB_NAME}"))
            .arg(format!("--output={}", dir.join("deadline.out").display()))
            .args(["--ntasks=1", "--time=2", "--wrap", &wrap])
            .envs(pace),
        dir.join("deadline.out"),
    );
    for (batch, what) in [(&by_signal, "signal"), (&by_deadline, "deadline")] {
        let took = batch.wait_completed(Duration::from_secs(180));
        println!(
            "{what}: ended after {:.1} s:\n{}",
            took.as_secs_f64(),
            batch.output()
        );
        assert!(batch.line("suspended to ").contains(what));
    }
    // The one that was not to read its deadline did not; the other read about 2 minutes.
    assert!(
        !by_signal.output().contains("slurm_job: deadline:"),
        "{}",
        by_signal.output()
    );
    let left: u64 = by_deadline
        .line("deadline: the allocation ends in ")
        .trim_end_matches(" s")
        .parse()
        .unwrap();
    assert!(
        (100..=120).contains(&left),
        "{left} s left of a 2 minute job"
    );

    for (what, options, args) in [
        ("signal", &["--ntasks=1", "--cpus-per-task=2"][..], &[][..]),
        ("deadline", &["--ntasks=2"][..], &["--processes", "1"][..]),
    ] {
        let resume = Batch::submit(
            &[options, &["--time=10"]].concat(),
            &[],
            &[
                &job[..],
                &["--store", &store, "--job-id", what, "--check"],
                args,
            ]
            .concat(),
            dir.join(format!("{what}-resume.out")),
        );
        let took = resume.wait_completed(Duration::from_secs(120));
        println!(
            "{what}, resumed: {:.1} s:\n{}",
            took.as_secs_f64(),
            resume.output()
        );
        assert!(resume.line("resuming ").contains(what));
        assert_exact(&resume);
    }
}
