//! Randomized fault trials of local recovery (buddy copies every `k` phases, and the replay of
//! a lost process's partitions from them), with real worker processes: processes killed
//! (SIGKILL) alone, with their buddy, or during the replay of another's partitions, a process
//! drained while another is killed, one after the other as new ones join, snapshots asked
//! around the kill; worker processes in
//! network namespaces that cannot reach each other (buddy copies refused); and a process cut
//! off from the coordinator by a firewall while it stays alive (`iptables` DROP: lost by its
//! lease, its late pushes to its peers must change nothing).
//!
//! Every trial must end with the grid bit for bit the sequential one, or with
//! [`Error::PartitionsLost`] where nothing could restore the partitions (no snapshot committed,
//! and the copies gone or never taken); never stuck (no progress for 20 s), never with a
//! panic in a process, never with another error.
//!
//! Each trial prints its parameters and how it ended. The trials of a run follow from a seed:
//! `MALLEABLE_TRIAL_SEED` (default: the time), `MALLEABLE_TRIALS` (default: a few, so that
//! the suite stays short); `MALLEABLE_TRIAL_ONLY=i` runs trial `i` of the seed alone;
//! `MALLEABLE_TRIAL_FAULT` (`one`, `buddy`, `second`, `after`, `drain`, `churn`),
//! `MALLEABLE_TRIAL_K` and `MALLEABLE_TRIAL_CUT` (`in`, `out`, `both`) hold one parameter. A
//! loss the copies might have avoided (a limit of the recovery: a snapshot's cut open at the
//! loss, a partition on its way from the lost process, ...) is printed as questionable, and
//! fails the trial with `MALLEABLE_TRIAL_STRICT=1`. The
//! coordinator's warnings are kept for each trial (unless `MALLEABLE_TEST_LOG` asks for
//! logs on standard error), and the worker processes' output goes to files, both shown when
//! a trial fails.
//!
//! Worker processes are this test binary, re-executed to run [`worker_process`].

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use malleable::cluster::{Registry, TOKEN_ENV, WorkerOptions};
use malleable::{Banded, Error, Executor, JobHandle, Outcome};

use crate::common;
use common::grid::{Grid, sequential};

const ADDR_ENV: &str = "MALLEABLE_TEST_TRIALS_ADDR";

/// The time limit of a worker process's connections and handshakes (seconds).
const TIMEOUT_ENV: &str = "MALLEABLE_TEST_TRIALS_TIMEOUT";

/// No progress for this long: the trial is stuck.
const STUCK: Duration = Duration::from_secs(20);

#[test]
#[ignore = "the body of the worker processes the other tests start"]
fn worker_process() {
    let Ok(addr) = std::env::var(ADDR_ENV) else {
        return;
    };
    common::log::log_if_asked("MALLEABLE_TEST_LOG", "worker process");
    let mut options = WorkerOptions::from_env().unwrap().threads(1);
    if let Ok(t) = std::env::var(TIMEOUT_ENV) {
        options = options.timeout(Duration::from_secs_f64(t.parse().unwrap()));
    }
    let registry = Registry::new().register::<Banded<Grid>>();
    common::procs::serve_and_exit(&addr, &registry, options, STUCK);
}

/// splitmix64: the trials' choices, from their seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// In `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[(self.next() % xs.len() as u64) as usize]
    }
}

/// The seed and the number of trials of this run: from the environment, or the time and
/// `default`.
fn seed_and_count(default: u64) -> (u64, u64, Option<u64>) {
    let seed = std::env::var("MALLEABLE_TRIAL_SEED")
        .ok()
        .map(|s| s.parse().expect("MALLEABLE_TRIAL_SEED: a number"))
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                % 1_000_000_007
        });
    let count = std::env::var("MALLEABLE_TRIALS")
        .ok()
        .map(|s| s.parse().expect("MALLEABLE_TRIALS: a number"))
        .unwrap_or(default);
    let only = std::env::var("MALLEABLE_TRIAL_ONLY")
        .ok()
        .map(|s| s.parse().expect("MALLEABLE_TRIAL_ONLY: a number"));
    (seed, count, only)
}

/// The coordinator's warnings, kept in memory to be shown with a failed trial (this test's
/// process is the coordinator). Installed once, as the process's subscriber, unless logs go
/// to standard error (`MALLEABLE_TEST_LOG`) or another test installed one.
#[derive(Clone, Default)]
struct Tap(Arc<Mutex<Vec<u8>>>);

impl Write for Tap {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let mut b = self.0.lock().unwrap();
        if b.len() > 8 << 20 {
            let half = b.len() / 2;
            b.drain(..half);
        }
        b.extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Tap {
    fn get() -> Option<&'static Tap> {
        static TAP: OnceLock<Option<Tap>> = OnceLock::new();
        TAP.get_or_init(|| {
            if std::env::var_os("MALLEABLE_TEST_LOG").is_some() {
                common::log::log_if_asked("MALLEABLE_TEST_LOG", "coordinator");
                return None;
            }
            let tap = Tap::default();
            let writer = tap.clone();
            let subscriber = tracing_subscriber::fmt()
                .with_max_level(tracing::Level::WARN)
                .with_writer(move || writer.clone())
                .with_ansi(false)
                .with_target(false)
                .finish();
            tracing::subscriber::set_global_default(subscriber)
                .ok()
                .map(|()| {
                    tracing::callsite::rebuild_interest_cache();
                    tap
                })
        })
        .as_ref()
    }

    /// What was logged since the last call.
    fn take() -> String {
        match Tap::get() {
            Some(t) => {
                String::from_utf8_lossy(&std::mem::take(&mut *t.0.lock().unwrap())).into_owned()
            }
            None => String::new(),
        }
    }
}

/// A worker process, its output (standard output and error) in a file.
struct Proc {
    child: Child,
    out: PathBuf,
    killed: bool,
}

impl Proc {
    /// Starts one for the coordinator at `addr`, in namespace `ns` if one is given.
    fn start(ns: Option<&str>, addr: &str, out: PathBuf, env: &[(&str, &str)]) -> Proc {
        let exe = std::env::current_exe().unwrap();
        let mut cmd = match ns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(exe);
                c
            }
            None => Command::new(exe),
        };
        let file = std::fs::File::create(&out).unwrap();
        let level = std::env::var("MALLEABLE_TEST_LOG").unwrap_or_else(|_| "warn".into());
        let child = cmd
            .args([
                "--exact",
                common::exact(module_path!(), "worker_process").as_str(),
                "--ignored",
                "--nocapture",
            ])
            .args(["--test-threads", "1"])
            .env(ADDR_ENV, addr)
            .env("MALLEABLE_TEST_LOG", level)
            .env_remove(TOKEN_ENV)
            .envs(env.iter().copied())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap();
        Proc {
            child,
            out,
            killed: false,
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.killed = true;
    }

    fn output(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    /// Waits for it to end (`patience`): its exit code, or `None` if it did not end (it is
    /// killed then) or ended by a signal.
    fn end(&mut self, patience: Duration) -> Result<Option<i32>, String> {
        let t = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return Ok(s.code());
            }
            if t.elapsed() > patience {
                self.kill();
                return Err(format!("did not end within {patience:?}"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// What a trial's job shows, to tell progress from a stuck run.
fn signature(h: &JobHandle<Banded<Grid>>) -> (u64, u64, usize, usize, usize) {
    let p = h.progress();
    (
        p.phase,
        p.done,
        h.rollbacks().len(),
        h.recoveries().len(),
        h.remote_workers(),
    )
}

/// Waits for `cond`, failing (`Err`) when the job made no progress for [`STUCK`]; `Ok(false)`
/// if the job ended first.
fn until(
    what: &str,
    h: &JobHandle<Banded<Grid>>,
    mut cond: impl FnMut() -> bool,
) -> Result<bool, String> {
    let mut seen = signature(h);
    let mut since = Instant::now();
    loop {
        if cond() {
            return Ok(true);
        }
        if h.is_finished() {
            return Ok(false);
        }
        let now = signature(h);
        if now != seen {
            seen = now;
            since = Instant::now();
        } else if since.elapsed() > STUCK {
            return Err(format!(
                "stuck waiting for {what}: no progress for {STUCK:?}; {:?}",
                h.progress()
            ));
        }
        std::thread::sleep(Duration::from_micros(500));
    }
}

/// Which fault a trial injects.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    /// One process killed.
    One,
    /// A process and its buddy (the next one in the roster) killed together.
    WithBuddy,
    /// One process killed, then a second `after_ms` after the loss is seen: the first one's
    /// buddy (which replays its partitions), or another.
    Second { buddy: bool, after_ms: u64 },
    /// One process killed, then another once the recovery is recorded.
    AfterRecovery,
    /// The newest process drained (`grace_ms`), and at once another one killed.
    Drain { grace_ms: u64 },
    /// `rounds` times: a process killed, and once the loss is seen and a few phases went
    /// by, a new one joins (the roster, and so the buddies, change between losses).
    Churn { rounds: u64 },
}

/// A snapshot asked of the job around the kill.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Ask {
    No,
    Before,
    After,
}

/// One trial's parameters (all from its seed).
#[derive(Debug, Clone)]
struct Params {
    seed: u64,
    procs: usize,
    local: usize,
    k: u64,
    every_ms: Option<u64>,
    phases: u64,
    bands: u64,
    pace_us: u64,
    fault: Fault,
    victim: usize,
    /// Phases after every process joined.
    at: u64,
    delay_us: u64,
    ask: Ask,
}

impl Params {
    fn draw(seed: u64) -> Params {
        let mut r = Rng(seed);
        let procs = r.range(3, 4) as usize;
        let phases = r.range(60, 150);
        let fault = match r.range(0, 10) {
            0..=2 => Fault::One,
            3..=4 => Fault::WithBuddy,
            5..=6 => Fault::Second {
                buddy: r.chance(60),
                after_ms: r.pick(&[0, 0, 1, 5, 20, 100]),
            },
            7 => Fault::AfterRecovery,
            8 => Fault::Drain {
                grace_ms: r.pick(&[300, 2000]),
            },
            _ => Fault::Churn {
                rounds: r.range(2, 3),
            },
        };
        // A family of faults alone, to look at it (`MALLEABLE_TRIAL_FAULT`).
        let fault = match std::env::var("MALLEABLE_TRIAL_FAULT").as_deref() {
            Ok("one") => Fault::One,
            Ok("buddy") => Fault::WithBuddy,
            Ok("second") => Fault::Second {
                buddy: r.chance(60),
                after_ms: r.pick(&[0, 0, 1, 5, 20, 100]),
            },
            Ok("after") => Fault::AfterRecovery,
            Ok("drain") => Fault::Drain {
                grace_ms: r.pick(&[300, 2000]),
            },
            Ok("churn") => Fault::Churn {
                rounds: r.range(2, 3),
            },
            _ => fault,
        };
        let victim = match fault {
            // Not the newest: that one is drained.
            Fault::Drain { .. } => r.range(0, procs as u64 - 2) as usize,
            _ => r.range(0, procs as u64 - 1) as usize,
        };
        Params {
            seed,
            procs,
            local: r.range(0, 1) as usize,
            k: k_or(r.pick(&[1, 2, 3, 5])),
            every_ms: r.chance(50).then(|| r.range(20, 200)),
            phases,
            bands: r.pick(&[6, 12, 12, 16, 24]),
            pace_us: r.pick(&[0, 100, 100, 300]),
            fault,
            victim,
            at: r.range(1, phases * 6 / 10),
            delay_us: r.pick(&[0, 0, 200, 1500, 4000]),
            ask: r.pick(&[Ask::No, Ask::No, Ask::Before, Ask::After]),
        }
    }

    fn grid(&self) -> Grid {
        Grid {
            bands: self.bands,
            pace_us: self.pace_us,
            pace_every: 16,
            ..Grid::new(240, 64, self.phases)
        }
    }
}

/// How a trial's job ended, after its drive `result`: the drive's note, the job's result
/// and what to show with a failure (`took` follows the note's text). A drive that failed
/// cancels the job and kills the processes.
#[allow(clippy::type_complexity)]
fn job_end(
    h: &JobHandle<Banded<Grid>>,
    result: Result<Note, String>,
    procs: &mut [Proc],
    coordinator: &str,
    took: &str,
) -> Result<(Note, malleable::Result<Outcome<Banded<Grid>>>, String), Failure> {
    let note = match result {
        Ok(n) => n,
        Err(what) => {
            h.cancel();
            for w in procs.iter_mut() {
                w.kill();
            }
            return Err(Failure {
                what,
                logs: logs(procs, coordinator),
            });
        }
    };
    let ended = h.clone().wait();
    let diag = format!(
        "{}{took}; {:?}; recoveries {:?}; rollbacks {:?}; copies {:?}; refusals {:?}",
        note.text,
        h.progress(),
        h.recoveries(),
        h.rollbacks(),
        h.copies(),
        refusals(coordinator)
    );
    Ok((note, ended, diag))
}

/// A trial that ended with `PartitionsLost` of `chunks`, as `loss` judges it: lost as it
/// may be, questionable (printed, and an error with `MALLEABLE_TRIAL_STRICT=1`), or wrong.
fn judged(loss: Loss, chunks: &[u64]) -> Result<Ended, String> {
    match loss {
        Loss::Legitimate => Ok(Ended::Lost),
        Loss::Questionable(why) if !strict() => {
            println!("    questionable: PartitionsLost {chunks:?} where {why}");
            Ok(Ended::LostQuestionably)
        }
        Loss::Questionable(why) | Loss::Wrong(why) => {
            Err(format!("PartitionsLost {chunks:?} where {why}"))
        }
    }
}

/// The processes not killed end by themselves: with 0, with 4 (refused as a worker of a
/// job that ended: it dialled again as it ended), or with 3 (an error) after a job that
/// ended with one or where `error_ok` allows it; and no process panicked.
fn ended_cleanly(
    procs: &mut [Proc],
    how: Ended,
    error_ok: impl Fn(usize) -> bool,
    diag: &str,
) -> Result<(), String> {
    let lost = matches!(how, Ended::Lost | Ended::LostQuestionably);
    for (i, w) in procs.iter_mut().enumerate() {
        if w.killed {
            continue;
        }
        match w.end(STUCK) {
            Ok(Some(0 | 4)) => {}
            Ok(Some(3)) if lost || error_ok(i) => {}
            Ok(code) => return Err(format!("process {i} ended with {code:?} ({how:?}): {diag}")),
            Err(e) => return Err(format!("process {i} {e} ({how:?}): {diag}")),
        }
    }
    match procs.iter().position(|w| w.output().contains("panicked")) {
        Some(i) => Err(format!("process {i} panicked ({how:?}): {diag}")),
        None => Ok(()),
    }
}

/// A finished trial: its grid must be the sequential one, bit for bit; how it went (the
/// fault `injected` or not, rolled back, recovered).
fn finished_as(
    got: Vec<u64>,
    job: &Grid,
    injected: bool,
    h: &JobHandle<Banded<Grid>>,
) -> Result<Ended, String> {
    let want = sequential(job);
    if got != want {
        let row = (0..got.len().min(want.len())).find(|&i| got[i] != want[i]);
        return Err(format!(
            "the grid differs (row {row:?}; {} rows, {} wanted)",
            got.len(),
            want.len()
        ));
    }
    Ok(if !injected {
        Ended::BeforeTheFault
    } else if !h.rollbacks().is_empty() {
        Ended::RolledBack
    } else if !h.recoveries().is_empty() {
        Ended::Recovered
    } else {
        Ended::NothingLost
    })
}

/// How a trial ended, when it ended as it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ended {
    /// The job finished before the fault was injected.
    BeforeTheFault,
    /// Finished exact; the lost partitions (if any) were replayed, and nothing rolled back.
    Recovered,
    /// Finished exact after a rollback (maybe after recoveries too).
    RolledBack,
    /// Finished exact, no recovery nor rollback (the processes killed held nothing).
    NothingLost,
    /// `PartitionsLost`, where nothing could restore them.
    Lost,
    /// `PartitionsLost` where the copies might have (see [`Loss::Questionable`]).
    LostQuestionably,
}

/// A trial that failed: what was seen, and the logs.
struct Failure {
    what: String,
    logs: String,
}

/// The ids of the coordinator's "cannot be replayed" and "abandoned" warnings, in `log`.
fn refusals(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| {
            l.contains("cannot be replayed from buddy copies")
                || l.contains("a local recovery is abandoned")
        })
        .map(|l| {
            let why = l
                .split("why=")
                .nth(1)
                .or_else(|| l.split("why=").nth(1))
                .map(|w| w.trim_matches('"'))
                .unwrap_or(l);
            why.chars().take(120).collect()
        })
        .collect()
}

/// Everything the processes and the coordinator said, for a failed trial.
fn logs(procs: &[Proc], coordinator: &str) -> String {
    let mut s = String::new();
    for (i, p) in procs.iter().enumerate() {
        let out = p.output();
        let tail: Vec<&str> = out.lines().rev().take(40).collect();
        s.push_str(&format!(
            "--- process {i} (killed: {}), {} lines, last:\n",
            p.killed,
            out.lines().count()
        ));
        for l in tail.into_iter().rev() {
            s.push_str(l);
            s.push('\n');
        }
    }
    let lines: Vec<&str> = coordinator.lines().collect();
    s.push_str(&format!(
        "--- coordinator, {} warnings, last:\n",
        lines.len()
    ));
    for l in &lines[lines.len().saturating_sub(60)..] {
        s.push_str(l);
        s.push('\n');
    }
    s
}

/// Whether the store at `url` has a committed snapshot of the grid.
fn committed(url: &str) -> bool {
    malleable::snapshot::BlockingStore::open(url)
        .and_then(|s| s.snapshots(<Banded<Grid> as malleable::Job>::NAME))
        .is_ok_and(|v| !v.is_empty())
}

/// Runs one trial of [`Params`]: how it ended, or why it failed.
fn kill_trial(p: &Params) -> Result<(Ended, String), Failure> {
    let _ = Tap::take();
    let dir = std::env::temp_dir().join(format!(
        "malleable-trials-{}-{}",
        p.seed,
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("file://{}/store", dir.display());
    let mut b = Executor::builder()
        .local_workers(p.local)
        .listen("127.0.0.1:0")
        .heartbeat(Duration::from_millis(100), Duration::from_secs(3))
        .buddy_copies(p.k)
        // Always a folder of the trial's own: a snapshot asked of the job (or taken by a
        // drain) goes there, not to the default `./snapshots`.
        .snapshots(&url);
    if let Some(ms) = p.every_ms {
        b = b.snapshot_every(Duration::from_millis(ms));
    }
    let exec = b.build().unwrap();
    let addr = exec.local_addr().unwrap().to_string();
    let job = p.grid();
    let h = exec.submit(Banded(job.clone())).unwrap();
    let mut procs: Vec<Proc> = Vec::new();
    let result = drive(p, &h, &addr, &dir, &url, &mut procs);
    let coordinator = Tap::take();
    let fail = |what: String, procs: &[Proc]| Failure {
        what,
        logs: logs(procs, &coordinator),
    };
    let (note, ended, diag) = job_end(&h, result, &mut procs, &coordinator, "")?;
    let how = match ended {
        Ok(Outcome::Finished(f)) => finished_as(f.into_value(), &job, note.injected, &h)
            .map_err(|e| fail(format!("{e}: {diag}"), &procs))?,
        Err(Error::PartitionsLost { chunks, .. }) => {
            judged(legitimate_loss(p, &note, &coordinator), &chunks)
                .map_err(|e| fail(format!("{e}: {diag}"), &procs))?
        }
        other => return Err(fail(format!("ended with {other:?}: {diag}"), &procs)),
    };
    // The processes left end by themselves, cleanly; none panicked.
    // An error after a job that ended with one, or for a drained process let go at the end
    // of its grace period (its connection closed).
    let drained = |i: usize| matches!(p.fault, Fault::Drain { .. }) && i + 1 == p.procs;
    ended_cleanly(&mut procs, how, drained, &diag).map_err(|e| fail(e, &procs))?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok((how, diag))
}

/// What [`drive`] did.
#[derive(Debug, Default)]
struct Note {
    text: String,
    /// The fault was injected (the job had not ended).
    injected: bool,
    /// The phase of the (first) loss.
    phase: u64,
    /// A snapshot was committed before the loss.
    committed: bool,
    /// A second process was killed (the first loss had not ended the job).
    second: bool,
}

/// Whether a trial may end with `PartitionsLost`.
enum Loss {
    /// Nothing could restore the partitions: no snapshot committed, and their copies (or
    /// the process replaying them) lost too, or never taken.
    Legitimate,
    /// One process was lost alone, its partitions had copies, and the job gave up for a
    /// reason of its own (a snapshot's cut open, a drained process's logs gone, ...): a
    /// limit of the recovery rather than a wrong result. A failure with
    /// `MALLEABLE_TRIAL_STRICT=1`.
    Questionable(String),
    /// A snapshot was committed before the loss, or the loss came in the first phase.
    Wrong(String),
}

/// Whether questionable losses fail the trials.
fn strict() -> bool {
    std::env::var_os("MALLEABLE_TRIAL_STRICT").is_some_and(|v| v != "0")
}

/// Whether `PartitionsLost` may end trial `p` (see [`Loss`]).
fn legitimate_loss(p: &Params, note: &Note, coordinator: &str) -> Loss {
    if note.committed {
        return Loss::Wrong("a snapshot was committed before the loss".into());
    }
    if note.phase == 0 {
        return Loss::Wrong("the loss came in the first phase (it runs again)".into());
    }
    let lone = match p.fault {
        // One process at a time.
        Fault::One | Fault::Drain { .. } | Fault::Churn { .. } => true,
        Fault::Second { .. } | Fault::AfterRecovery => !note.second,
        Fault::WithBuddy => false,
    };
    if !lone {
        // The copies' holder, or the replay, lost too.
        return Loss::Legitimate;
    }
    let why = refusals(coordinator);
    // Documented limits: a partition that moved into the lost process since the last copy
    // round has no copy; one that ran in the coordinator's hands (a local worker), in the
    // lost process, or in a process that left since the copies has no whole halo log.
    let fine = |w: &String| {
        w.contains("has no copy")
            || w.contains("a copy was lost too")
            || w.contains("halo log since the copies is not whole")
    };
    if !why.is_empty() && why.iter().all(fine) {
        return Loss::Legitimate;
    }
    Loss::Questionable(format!("one process was lost alone (refusals {why:?})"))
}

/// Starts the processes and injects the fault: a note on what was done, and whether the
/// fault was injected before the job ended; `Err` if the job was stuck meanwhile.
fn drive(
    p: &Params,
    h: &JobHandle<Banded<Grid>>,
    addr: &str,
    dir: &Path,
    url: &str,
    procs: &mut Vec<Proc>,
) -> Result<Note, String> {
    // One at a time: the roster's order (the buddies') is the order they joined.
    for i in 0..p.procs {
        procs.push(Proc::start(None, addr, dir.join(format!("p{i}.out")), &[]));
        if !until("the process to join", h, || h.remote_workers() == i + 1)? {
            return Ok(Note {
                text: "ended as the processes joined".into(),
                ..Note::default()
            });
        }
    }
    let roster: Vec<u64> = h.remote_processes().iter().map(|r| r.id).collect();
    if roster.len() != p.procs || roster.windows(2).any(|w| w[0] >= w[1]) {
        return Err(format!("the roster is not as they joined: {roster:?}"));
    }
    let at = h.progress().phase + p.at;
    if !until("the phase of the fault", h, || h.progress().phase >= at)? {
        return Ok(Note {
            text: "ended before the fault".into(),
            ..Note::default()
        });
    }
    std::thread::sleep(Duration::from_micros(p.delay_us));
    let phase = h.progress().phase;
    let mut note = Note {
        text: format!("fault in phase {phase}, copies {:?}", h.copies()),
        injected: true,
        phase,
        committed: committed(url),
        ..Note::default()
    };
    let asked = (p.ask == Ask::Before).then(|| h.snapshot());
    let n = p.procs;
    let buddy = (p.victim + 1) % n;
    let survivors = |procs: &[Proc], but: usize| -> Vec<usize> {
        (0..procs.len())
            .filter(|&i| !procs[i].killed && i != but)
            .collect()
    };
    match p.fault {
        Fault::One => procs[p.victim].kill(),
        Fault::WithBuddy => {
            let _ = procs[p.victim].child.kill();
            let _ = procs[buddy].child.kill();
            procs[p.victim].kill();
            procs[buddy].kill();
        }
        Fault::Second {
            buddy: to_buddy,
            after_ms,
        } => {
            procs[p.victim].kill();
            until("the loss", h, || h.remote_workers() < n)?;
            std::thread::sleep(Duration::from_millis(after_ms));
            let second = if to_buddy { buddy } else { (p.victim + 2) % n };
            note.text.push_str(&format!(
                ", second kill {second} in phase {}, recoveries {}",
                h.progress().phase,
                h.recoveries().len()
            ));
            // Whether the first loss had ended the job: seen before the kill.
            note.second = !h.is_finished();
            procs[second].kill();
        }
        Fault::AfterRecovery => {
            procs[p.victim].kill();
            let done = until("the recovery", h, || {
                !h.recoveries().is_empty() || !h.rollbacks().is_empty()
            })?;
            if done {
                let left = survivors(procs, usize::MAX);
                let second = left[(p.seed % left.len() as u64) as usize];
                note.text.push_str(&format!(
                    ", second kill {second} in phase {}",
                    h.progress().phase
                ));
                note.second = !h.is_finished();
                procs[second].kill();
            }
        }
        Fault::Drain { grace_ms } => {
            h.drain_remote(1, Duration::from_millis(grace_ms));
            procs[p.victim].kill();
        }
        Fault::Churn { rounds } => {
            let mut victim = p.victim;
            for round in 0..rounds {
                let left = procs.iter().filter(|w| !w.killed).count();
                procs[victim].kill();
                if !until("the loss", h, || h.remote_workers() < left)? {
                    break;
                }
                let at = h.progress().phase + 2 + round;
                if !until("a few phases", h, || h.progress().phase >= at)? {
                    break;
                }
                if round + 1 == rounds {
                    break;
                }
                let n = procs.len();
                procs.push(Proc::start(None, addr, dir.join(format!("p{n}.out")), &[]));
                if !until("the new process", h, || h.remote_workers() == left)? {
                    break;
                }
                let at = h.progress().phase + 3 + (p.seed >> (8 * round)) % 10;
                if !until("the next loss", h, || h.progress().phase >= at)? {
                    break;
                }
                let alive: Vec<usize> = (0..procs.len()).filter(|&i| !procs[i].killed).collect();
                victim = alive[((p.seed >> (4 * round)) % alive.len() as u64) as usize];
                note.text
                    .push_str(&format!(", kill {victim} in phase {}", h.progress().phase));
            }
        }
    }
    // Nobody waits for the requests' answers: they are dropped with the job's end.
    let after = (p.ask == Ask::After).then(|| h.snapshot());
    until("the end", h, || h.is_finished())?;
    drop((asked, after));
    Ok(note)
}

/// Runs `trials` of `draw`, printing each; panics at the end with every failure.
fn run_trials<P: std::fmt::Debug>(
    kind: &str,
    default: u64,
    draw: impl Fn(u64) -> P,
    trial: impl Fn(&P) -> Result<(Ended, String), Failure>,
) {
    let (seed, count, only) = seed_and_count(default);
    println!("{kind}: seed {seed}, {count} trials (MALLEABLE_TRIAL_SEED={seed})");
    let started = Instant::now();
    let mut failures = Vec::new();
    let mut tally = std::collections::BTreeMap::new();
    for i in 0..count {
        if only.is_some_and(|o| o != i) {
            continue;
        }
        let s = seed.wrapping_mul(1_000_003).wrapping_add(i);
        let p = draw(s);
        let t = Instant::now();
        match trial(&p) {
            Ok((how, diag)) => {
                println!(
                    "{kind} {i} ({:.1?}): {how:?} {p:?}\n    {diag}",
                    t.elapsed()
                );
                *tally.entry(how).or_insert(0) += 1;
            }
            Err(f) => {
                println!(
                    "{kind} {i} ({:.1?}): FAILED {p:?}\n    {}\n{}",
                    t.elapsed(),
                    f.what,
                    f.logs
                );
                failures.push(format!(
                    "trial {i} (MALLEABLE_TRIAL_SEED={seed} MALLEABLE_TRIAL_ONLY={i}): {}",
                    f.what
                ));
            }
        }
    }
    println!(
        "{kind}: {tally:?}, {} failed, in {:.1?}",
        failures.len(),
        started.elapsed()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Randomized kills (see the module's docs): each trial ends exact, or lost where nothing
/// could restore the partitions.
#[test]
fn randomized_kills_end_exact_or_lost_where_nothing_could_restore() {
    Tap::get();
    run_trials("kill trial", 30, Params::draw, kill_trial);
}

/// `k`, or the period of buddy copies `MALLEABLE_TRIAL_K` asks for (0: none).
fn k_or(k: u64) -> u64 {
    std::env::var("MALLEABLE_TRIAL_K").map_or(k, |v| v.parse().expect("MALLEABLE_TRIAL_K"))
}

/// A network namespace trial's parameters: processes on hosts (namespaces), some sharing one.
#[derive(Debug, Clone)]
struct NsParams {
    seed: u64,
    /// The host of each process, in the order they join.
    hosts: Vec<usize>,
    k: u64,
    every_ms: Option<u64>,
    phases: u64,
    victim: usize,
    at: u64,
}

impl NsParams {
    fn draw(seed: u64) -> NsParams {
        let mut r = Rng(seed);
        // Apart (each its own host), or two on host 0 and one on host 1.
        let hosts = match r.range(0, 2) {
            0 => vec![0, 1],
            1 => vec![0, 1, 2],
            _ => vec![0, 0, 1],
        };
        let victim = r.range(0, hosts.len() as u64 - 1) as usize;
        NsParams {
            seed,
            k: k_or(r.pick(&[1, 2, 3])),
            every_ms: r.chance(60).then(|| r.range(20, 200)),
            phases: r.range(60, 120),
            victim,
            at: r.range(5, 30),
            hosts,
        }
    }

    /// Whether the buddy of process `i` (the next one) can take its copies.
    fn reaches_buddy(&self, i: usize) -> bool {
        let n = self.hosts.len();
        self.hosts[i] == self.hosts[(i + 1) % n]
    }
}

/// Three hosts for the namespace trials, made once (`ip netns`), removed at the end of the
/// test; and the token their processes show (the coordinator listens beyond loopback).
const NS_TOKEN: &str = "a token for the recovery trials";

/// The coordinator of a trial on hosts apart: a store in a folder of its own (the folder
/// and the store's URL are returned),
/// listening beyond loopback with the trials' token, a lease of `lease_s` seconds, copies
/// every `k` phases and snapshots every `every_ms` if given; and the port it listens on.
fn hosts_coordinator(
    kind: &str,
    seed: u64,
    k: u64,
    every_ms: Option<u64>,
    lease_s: u64,
) -> (PathBuf, String, Executor, u16) {
    let _ = Tap::take();
    let dir = std::env::temp_dir().join(format!(
        "malleable-trials-{kind}-{seed}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("file://{}/store", dir.display());
    let mut b = Executor::builder()
        .local_workers(0)
        .listen("0.0.0.0:0")
        .cluster_token(malleable::cluster::Token::new(NS_TOKEN).unwrap())
        .heartbeat(Duration::from_millis(100), Duration::from_secs(lease_s))
        .buddy_copies(k)
        .snapshots(&url);
    if let Some(ms) = every_ms {
        b = b.snapshot_every(Duration::from_millis(ms));
    }
    let exec = b.build().unwrap();
    let port = exec.local_addr().unwrap().port();
    (dir, url, exec, port)
}

/// One more worker process, in namespace `ns`, dials the coordinator at `addr` with the
/// trials' token (its output in `dir`); whether it joined before the job ended (`Err` if the
/// job was stuck meanwhile).
fn joined_from(
    ns: &str,
    addr: &str,
    dir: &Path,
    h: &JobHandle<Banded<Grid>>,
    procs: &mut Vec<Proc>,
) -> Result<bool, String> {
    let i = procs.len();
    let env = [(TOKEN_ENV, NS_TOKEN), (TIMEOUT_ENV, "1")];
    procs.push(Proc::start(
        Some(ns),
        addr,
        dir.join(format!("p{i}.out")),
        &env,
    ));
    until("the process to join", h, || h.remote_workers() == i + 1)
}

/// A trial on [`common::netns::Hosts`]: processes that cannot reach their buddy have their
/// copies refused (counted, the job going on), and one process is killed: the job recovers
/// from copies where its buddy could take them, else rolls back to a snapshot, or ends
/// with `PartitionsLost` if none was committed. Always exact, never stuck.
fn ns_trial(p: &NsParams, hosts: &common::netns::Hosts) -> Result<(Ended, String), Failure> {
    let (dir, url, exec, port) = hosts_coordinator("ns", p.seed, p.k, p.every_ms, 3);
    let job = Grid::new(240, 64, p.phases);
    let h = exec.submit(Banded(job.clone())).unwrap();
    let mut procs: Vec<Proc> = Vec::new();
    let started = Instant::now();
    let result = (|| -> Result<Note, String> {
        for &host in &p.hosts {
            let addr = format!("{}:{port}", hosts.gateway(host));
            if !joined_from(hosts.name(host), &addr, &dir, &h, &mut procs)? {
                return Ok(Note::default());
            }
        }
        let at = h.progress().phase + p.at;
        if !until("the phase of the kill", &h, || h.progress().phase >= at)? {
            return Ok(Note::default());
        }
        let phase = h.progress().phase;
        let note = Note {
            text: format!("kill in phase {phase}, copies {:?}", h.copies()),
            injected: true,
            phase,
            committed: committed(&url),
            ..Note::default()
        };
        procs[p.victim].kill();
        until("the end", &h, || h.is_finished())?;
        Ok(note)
    })();
    let coordinator = Tap::take();
    let fail = |what: String, procs: &[Proc]| Failure {
        what,
        logs: logs(procs, &coordinator),
    };
    let took = format!(" (job {:.1?})", started.elapsed());
    let (note, ended, diag) = job_end(&h, result, &mut procs, &coordinator, &took)?;
    let c = h.copies();
    let n = p.hosts.len();
    // Copies to a buddy on another host are refused; none is kept there.
    if (0..n).all(|i| !p.reaches_buddy(i)) && c.kept > 0 {
        return Err(fail(
            format!("copies kept by unreachable buddies: {diag}"),
            &procs,
        ));
    }
    if p.k > 0 && (0..n).any(|i| !p.reaches_buddy(i)) && c.refused == 0 && note.injected {
        return Err(fail(
            format!("no copy refused though a buddy is unreachable: {diag}"),
            &procs,
        ));
    }
    let how = match ended {
        // A recovery although the victim's buddy could take no copy is no error: a
        // partition that moved to the victim keeps the copy its former holder's buddy took
        // (an older one), and the logs since then are kept for it.
        Ok(Outcome::Finished(f)) => finished_as(f.into_value(), &job, note.injected, &h)
            .map_err(|e| fail(format!("{e}: {diag}"), &procs))?,
        Err(Error::PartitionsLost { chunks, .. }) => {
            if note.committed {
                return Err(fail(
                    format!("PartitionsLost {chunks:?} with a snapshot committed: {diag}"),
                    &procs,
                ));
            }
            if p.reaches_buddy(p.victim) {
                println!("    questionable: PartitionsLost {chunks:?} with a reachable buddy");
                if strict() {
                    return Err(fail(
                        format!("PartitionsLost {chunks:?} with a reachable buddy: {diag}"),
                        &procs,
                    ));
                }
                Ended::LostQuestionably
            } else {
                Ended::Lost
            }
        }
        other => return Err(fail(format!("ended with {other:?}: {diag}"), &procs)),
    };
    ended_cleanly(&mut procs, how, |_| false, &diag).map_err(|e| fail(e, &procs))?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok((how, diag))
}

/// Processes in network namespaces that cannot reach each other (needs root and `ip`).
#[test]
fn processes_that_cannot_reach_their_buddy_end_exact_after_a_kill() {
    Tap::get();
    // Networks of their own: another test of this binary takes the first ones.
    let hosts =
        common::netns::Hosts::numbered(&format!("mrt{}", std::process::id() % 10_000), 3, 11);
    run_trials("ns trial", 3, NsParams::draw, |p| ns_trial(p, &hosts));
    drop(hosts);
}

/// Runs `cmd` with `args`; panics with its output if it fails.
fn run(cmd: &str, args: &[&str]) {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd} {args:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Installs `iptables` if it is missing (Debian's package).
fn ensure_iptables() {
    if Command::new("iptables").arg("-V").output().is_ok() {
        return;
    }
    let ok = Command::new("sh")
        .args([
            "-c",
            "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q iptables",
        ])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "`iptables` is missing and did not install");
}

/// Hosts on one link: network namespaces whose links are ports of a bridge in the root
/// namespace, where the coordinator listens (`10.218.0.1`); host `i` is `10.218.0.{i + 2}`.
/// Unlike [`common::netns::Hosts`], the hosts reach each other (the bridge forwards at the
/// link layer), so a process cut off from the coordinator still reaches its peers. Removed
/// when dropped (the firewall rules with their namespaces).
struct Lan {
    bridge: String,
    names: Vec<String>,
    links: Vec<String>,
}

impl Lan {
    const COORDINATOR: &str = "10.218.0.1";

    fn new(tag: &str, n: usize) -> Lan {
        let bridge = format!("{tag}b");
        let _ = Command::new("ip").args(["link", "del", &bridge]).output();
        let mut lan = Lan {
            bridge: bridge.clone(),
            names: Vec::new(),
            links: Vec::new(),
        };
        run("ip", &["link", "add", &bridge, "type", "bridge"]);
        run(
            "ip",
            &[
                "addr",
                "add",
                &format!("{}/24", Lan::COORDINATOR),
                "dev",
                &bridge,
            ],
        );
        run("ip", &["link", "set", &bridge, "up"]);
        for i in 0..n {
            let ns = format!("{tag}{i}");
            let (outside, inside) = (format!("{tag}{i}o"), format!("{tag}{i}i"));
            let _ = Command::new("ip").args(["netns", "del", &ns]).output();
            let _ = Command::new("ip").args(["link", "del", &outside]).output();
            run("ip", &["netns", "add", &ns]);
            lan.names.push(ns.clone());
            run(
                "ip",
                &[
                    "link", "add", &outside, "type", "veth", "peer", "name", &inside,
                ],
            );
            lan.links.push(outside.clone());
            run("ip", &["link", "set", &outside, "master", &bridge]);
            run("ip", &["link", "set", &outside, "up"]);
            run("ip", &["link", "set", &inside, "netns", &ns]);
            let addr = format!("10.218.0.{}/24", i + 2);
            run("ip", &["-n", &ns, "addr", "add", &addr, "dev", &inside]);
            run("ip", &["-n", &ns, "link", "set", &inside, "up"]);
            run("ip", &["-n", &ns, "link", "set", "lo", "up"]);
        }
        lan
    }

    fn name(&self, i: usize) -> &str {
        &self.names[i]
    }

    /// The firewall rules of host `i` that cut it off from the coordinator: packets from
    /// it (`inbound`), to it (`outbound`), or both, dropped.
    fn rules(inbound: bool, outbound: bool) -> Vec<[&'static str; 5]> {
        let mut rules = Vec::new();
        if inbound {
            rules.push(["INPUT", "-s", Lan::COORDINATOR, "-j", "DROP"]);
        }
        if outbound {
            rules.push(["OUTPUT", "-d", Lan::COORDINATOR, "-j", "DROP"]);
        }
        rules
    }

    /// Cuts host `i` off from the coordinator (see [`Lan::rules`]).
    fn cut(&self, i: usize, inbound: bool, outbound: bool) {
        for r in Lan::rules(inbound, outbound) {
            let mut args = vec!["netns", "exec", self.name(i), "iptables", "-I"];
            args.extend(r);
            run("ip", &args);
        }
    }

    /// Removes the rules of [`Lan::cut`].
    fn mend(&self, i: usize, inbound: bool, outbound: bool) {
        for r in Lan::rules(inbound, outbound) {
            let mut args = vec!["netns", "exec", self.name(i), "iptables", "-D"];
            args.extend(r);
            run("ip", &args);
        }
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        for ns in &self.names {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
        for link in &self.links {
            let _ = Command::new("ip").args(["link", "del", link]).output();
        }
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .output();
    }
}

/// A firewall trial's parameters.
#[derive(Debug, Clone)]
struct CutParams {
    seed: u64,
    procs: usize,
    k: u64,
    every_ms: Option<u64>,
    phases: u64,
    victim: usize,
    at: u64,
    /// Which packets are dropped: from the coordinator, to it.
    inbound: bool,
    outbound: bool,
    /// The rules are removed this long after the loss is seen (while the job goes on: the
    /// process's stale connection and pushes come back to life), or after the job's end.
    mend_after_ms: Option<u64>,
}

impl CutParams {
    fn draw(seed: u64) -> CutParams {
        let mut r = Rng(seed);
        let procs = r.range(3, 4) as usize;
        let (inbound, outbound) =
            r.pick(&[(true, true), (true, true), (true, false), (false, true)]);
        // One direction alone, to look at it (`MALLEABLE_TRIAL_CUT`).
        let (inbound, outbound) = match std::env::var("MALLEABLE_TRIAL_CUT").as_deref() {
            Ok("in") => (true, false),
            Ok("out") => (false, true),
            Ok("both") => (true, true),
            _ => (inbound, outbound),
        };
        CutParams {
            seed,
            procs,
            k: r.pick(&[1, 2, 3]),
            every_ms: r.chance(50).then(|| r.range(50, 200)),
            // Phases of about 10 ms: the job goes on well after the lease (2 s) let the
            // process go.
            phases: r.range(600, 900),
            victim: r.range(0, procs as u64 - 1) as usize,
            at: r.range(5, 40),
            inbound,
            outbound,
            mend_after_ms: r.chance(70).then(|| r.pick(&[0, 50, 300, 1000])),
        }
    }
}

/// One process cut off from the coordinator by the firewall of its host, alive: the lease
/// lets it go, the job recovers its partitions from their copies or rolls back, and the grid
/// is exact, whatever the process sends once the rules are gone.
fn cut_trial(p: &CutParams, lan: &Lan) -> Result<(Ended, String), Failure> {
    let (dir, url, exec, port) = hosts_coordinator("cut", p.seed, p.k, p.every_ms, 2);
    let job = Grid {
        pace_us: 300,
        pace_every: 8,
        ..Grid::new(240, 64, p.phases)
    };
    let h = exec.submit(Banded(job.clone())).unwrap();
    let mut procs: Vec<Proc> = Vec::new();
    let mut cut = false;
    let result = (|| -> Result<Note, String> {
        for i in 0..p.procs {
            let addr = format!("{}:{port}", Lan::COORDINATOR);
            if !joined_from(lan.name(i), &addr, &dir, &h, &mut procs)? {
                return Ok(Note::default());
            }
        }
        let at = h.progress().phase + p.at;
        if !until("the phase of the cut", &h, || h.progress().phase >= at)? {
            return Ok(Note::default());
        }
        let phase = h.progress().phase;
        let mut note = Note {
            text: format!("cut in phase {phase}, copies {:?}", h.copies()),
            injected: true,
            phase,
            committed: committed(&url),
            ..Note::default()
        };
        lan.cut(p.victim, p.inbound, p.outbound);
        cut = true;
        let t = Instant::now();
        until("the loss", &h, || h.remote_workers() < p.procs)?;
        note.text.push_str(&format!(
            ", lost after {:.1?} in phase {}",
            t.elapsed(),
            h.progress().phase
        ));
        if let Some(ms) = p.mend_after_ms {
            std::thread::sleep(Duration::from_millis(ms));
            lan.mend(p.victim, p.inbound, p.outbound);
            cut = false;
            note.text
                .push_str(&format!(", mended in phase {}", h.progress().phase));
        }
        until("the end", &h, || h.is_finished())?;
        Ok(note)
    })();
    if cut {
        lan.mend(p.victim, p.inbound, p.outbound);
    }
    let coordinator = Tap::take();
    let fail = |what: String, procs: &[Proc]| Failure {
        what,
        logs: logs(procs, &coordinator),
    };
    let (note, ended, diag) = job_end(&h, result, &mut procs, &coordinator, "")?;
    let how = match ended {
        Ok(Outcome::Finished(f)) => finished_as(f.into_value(), &job, note.injected, &h)
            .map_err(|e| fail(format!("{e}: {diag}"), &procs))?,
        Err(Error::PartitionsLost { chunks, .. }) => {
            let params = Params {
                seed: p.seed,
                procs: p.procs,
                local: 0,
                k: p.k,
                every_ms: p.every_ms,
                phases: p.phases,
                bands: 12,
                pace_us: 300,
                fault: Fault::One,
                victim: p.victim,
                at: p.at,
                delay_us: 0,
                ask: Ask::No,
            };
            judged(legitimate_loss(&params, &note, &coordinator), &chunks)
                .map_err(|e| fail(format!("{e}: {diag}"), &procs))?
        }
        other => return Err(fail(format!("ended with {other:?}: {diag}"), &procs)),
    };
    // The process cut off ends by itself too (its coordinator is silent, or tells it it is
    // no longer a worker of the job): how, it may choose, but not by a panic.
    ended_cleanly(&mut procs, how, |i| i == p.victim, &diag).map_err(|e| fail(e, &procs))?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok((how, diag))
}

/// A process cut off from the coordinator by a firewall while it stays alive (needs root,
/// `ip` and `iptables`).
#[test]
fn a_process_cut_off_from_the_coordinator_is_let_go_and_changes_nothing() {
    Tap::get();
    ensure_iptables();
    let lan = Lan::new(&format!("mrc{}", std::process::id() % 10_000), 4);
    run_trials("cut trial", 2, CutParams::draw, |p| cut_trial(p, &lan));
    drop(lan);
}
