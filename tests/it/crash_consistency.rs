//! Crash consistency with real processes: a child process takes a snapshot every 20 ms to a
//! `file://` store and is killed with SIGKILL at a random moment; whatever the moment, every
//! snapshot the store lists as committed must decode (no torn snapshot is ever listed), and
//! resuming any of them with another worker count must give the value of an uninterrupted
//! run, bit for bit.
//!
//! The test binary is its own child: the parent re-executes it with
//! `--exact child_writer --nocapture` and [`CHILD_ENV`] set to the store's URL; without that
//! variable `child_writer` does nothing. The child's steps sleep (a slow machine, set per
//! process through the job's `Input`, never part of the job or its value), so that a kill
//! lands in the middle of a run whatever the load, while the parent computes at full speed.
//!
//! `MALLEABLE_CRASH_SEED=<u64>` replays another sequence of kill delays.
//!
//! ```text
//! cargo test --release --all-features --test it crash_consistency::                          # 80 kills
//! cargo test --release --all-features --test it crash_consistency:: -- --ignored --nocapture  # 500 kills
//! ```

use std::ops::Range;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use malleable::snapshot::{SnapshotId, Store};
use malleable::{At, Chunking, Executor, Finished, Job};

use crate::common;

use common::walk::{PACE_ENV, Total, Walk};

/// Set in the child only: the URL of the store it writes to.
const CHILD_ENV: &str = "MALLEABLE_CRASH_CHILD";
/// Overrides the seed of the kill delays.
const SEED_ENV: &str = "MALLEABLE_CRASH_SEED";
const DEFAULT_SEED: u64 = 0x5EED_C4A5_0001;
/// The job id the child's snapshots are stored under.
const JOB_ID: &str = "crash-walk";
/// Fixed chunk boundaries: the value depends on them, never on the workers.
const CHUNK: u64 = 2_000;
const CHUNKING: Chunking = Chunking::Size(CHUNK);
/// Worker threads of the child; every resume uses another count.
const CHILD_WORKERS: usize = 2;
/// Resumes use these worker counts in turn (0 = inline on the waiting thread).
const RESUME_WORKERS: [usize; 3] = [0, 1, 3];
/// Snapshots the child keeps (retention runs before each commit).
const KEEP: usize = 2;
/// Kill delays after the child is spawned.
const KILL_MS: Range<u64> = 30..400;

/// The child's job: 8 phases of 20 000 iterations, 100 per step, 10 or 11 chunks a phase.
/// Paced at 1 ms a step on 2 workers, a phase lasts about 110 ms and the run about 0.9 s,
/// so the kills (30–400 ms) land in phases 0 to 3: mid-chunk, mid-snapshot, at barriers.
fn child_job() -> Walk {
    Walk {
        tag: 0,
        n: 20_000,
        per_step: 100,
        phases: 8,
        phase: 0,
        carry: 0.0,
        history: Vec::new(),
    }
}

/// The same computation as a plain loop, with this test's chunk size.
fn sequential(job: &Walk) -> (Total, Vec<f64>) {
    common::walk::sequential(job, CHUNK)
}

// ---------------------------------------------------------------------------------------
// The child.
// ---------------------------------------------------------------------------------------

/// The child: runs the job with a snapshot every 20 ms until it is killed. Does nothing
/// unless [`CHILD_ENV`] is set (so it passes at once in a normal test run).
#[test]
fn child_writer() {
    let Ok(url) = std::env::var(CHILD_ENV) else {
        return;
    };
    let exec = Executor::builder()
        .local_workers(CHILD_WORKERS)
        .chunking(CHUNKING)
        .snapshots(&url)
        .job_id(JOB_ID)
        .keep_snapshots(KEEP)
        .snapshot_every(Duration::from_millis(20))
        .build()
        .expect("child: build");
    let handle = exec.submit(child_job()).expect("child: submit");
    println!("crash-child: started");
    let outcome = handle.wait().expect("child: wait");
    // Reaching this line means the parent did not kill the child in time: it fails then.
    println!(
        "crash-child: ended by itself ({})",
        if outcome.finished().is_some() {
            "finished"
        } else {
            "suspended"
        }
    );
}

// ---------------------------------------------------------------------------------------
// The parent.
// ---------------------------------------------------------------------------------------

/// SplitMix64: a small seeded generator for the kill delays.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn in_range(&mut self, r: Range<u64>) -> u64 {
        r.start + self.next() % (r.end - r.start)
    }
}

/// What one kill left behind, and what the parent made of it.
#[derive(Debug, Default, Clone)]
struct TrialReport {
    delay_ms: u64,
    /// Committed epochs listed after the kill.
    epochs: Vec<u64>,
    /// Resumes that finished with the expected value (one per listed epoch, plus two through
    /// a snapshot the resumed run wrote itself, plus one after `gc`).
    resumes: usize,
    /// Objects of an epoch above the newest committed one: a snapshot in flight at the kill.
    in_flight_objects: usize,
    /// Files that the local store's atomic puts stage (`…#n`) and had not renamed yet.
    staged_files: usize,
    /// Objects `gc` deleted (left over by an interrupted retention).
    gc_deleted: usize,
    /// Staged files still there after `gc` (only in folders above the newest epoch: `gc`
    /// reads the folders up to it for the staged files the store's listing does not show).
    staged_after_gc: usize,
}

/// Everything the trials share.
struct Setup {
    root: PathBuf,
    exe: PathBuf,
    expected: Finished<Walk>,
}

fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(f)
}

/// Every committed epoch of the store must decode and every part it lists must be there
/// with the right size and checksum.
fn check_committed(store: &Store, trial: usize) -> Vec<u64> {
    block_on(async {
        let epochs = store
            .epochs(JOB_ID)
            .await
            .unwrap_or_else(|e| panic!("trial {trial}: listing failed: {e}"));
        for &epoch in &epochs {
            let id = SnapshotId::new(JOB_ID, epoch);
            let manifest = store
                .manifest(&id)
                .await
                .unwrap_or_else(|e| panic!("trial {trial}: {id} is listed but torn: {e}"));
            manifest
                .check_job(Walk::NAME)
                .unwrap_or_else(|e| panic!("trial {trial}: {id}: {e}"));
            for part in &manifest.parts {
                store.get_part(part).await.unwrap_or_else(|e| {
                    panic!("trial {trial}: {id} lists a part that is missing or torn: {e}")
                });
            }
        }
        epochs
    })
}

fn assert_same(got: &Finished<Walk>, expected: &Finished<Walk>, what: &str) {
    assert_eq!(
        got.value.sum.to_bits(),
        expected.value.sum.to_bits(),
        "{what}: the value differs ({} vs {})",
        got.value.sum,
        expected.value.sum
    );
    assert_eq!(got.value.iterations, expected.value.iterations, "{what}");
    let bits = |h: &[f64]| h.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(
        bits(&got.job.history),
        bits(&expected.job.history),
        "{what}: the phase history differs"
    );
}

fn resume(url: &str, at: At, workers: usize, what: &str) -> Finished<Walk> {
    let exec = Executor::builder()
        .local_workers(workers)
        .job_id(JOB_ID)
        .build()
        .unwrap();
    exec.resume::<Walk>(url, at)
        .unwrap_or_else(|e| panic!("{what}: resume failed: {e}"))
        .wait()
        .unwrap_or_else(|e| panic!("{what}: the resumed run failed: {e}"))
        .finished()
        .unwrap_or_else(|| panic!("{what}: the resumed run did not finish"))
}

/// Counts the objects above the newest committed epoch and the staged files, straight from
/// the folder (the store API rightly shows neither).
/// Objects above the newest epoch, staged files anywhere, and staged files in folders up to
/// the newest epoch (which `gc` deletes).
fn leftovers(dir: &Path, newest: Option<u64>) -> (usize, usize, usize) {
    fn walk(p: &Path, files: &mut Vec<PathBuf>) {
        if let Ok(rd) = std::fs::read_dir(p) {
            for e in rd.flatten() {
                let path = e.path();
                if path.is_dir() {
                    walk(&path, files);
                } else {
                    files.push(path);
                }
            }
        }
    }
    let mut files = Vec::new();
    walk(&dir.join(JOB_ID), &mut files);
    let mut in_flight = 0;
    let mut staged = 0;
    let mut staged_committed = 0;
    for f in &files {
        let rel = f.strip_prefix(dir.join(JOB_ID)).unwrap();
        let epoch: Option<u64> = rel
            .components()
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .and_then(|s| s.parse().ok());
        if f.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.contains('#'))
        {
            staged += 1;
            if epoch.is_some_and(|e| newest.is_some_and(|n| e <= n)) {
                staged_committed += 1;
            }
        } else if epoch.is_some_and(|e| newest.is_none_or(|n| e > n)) {
            in_flight += 1;
        }
    }
    (in_flight, staged, staged_committed)
}

fn trial(setup: &Setup, k: usize, delay_ms: u64) -> TrialReport {
    let dir = setup.root.join(format!("trial-{k}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("file://{}", dir.display());

    let spawned = Instant::now();
    let mut child = Command::new(&setup.exe)
        .args([
            "--exact",
            crate::common::exact(module_path!(), "child_writer").as_str(),
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, &url)
        .env(PACE_ENV, "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the child");
    std::thread::sleep(Duration::from_millis(delay_ms).saturating_sub(spawned.elapsed()));
    let early = child.try_wait().expect("try_wait");
    child.kill().expect("SIGKILL the child");
    let out = child.wait_with_output().expect("reap the child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        early.is_none() && out.status.signal() == Some(9),
        "trial {k}: the child was not killed mid-run (status {:?}, delay {delay_ms} ms)\n\
         stdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );

    // The killed child's job id lease would hold the job id for its 30 s: it is dead, so
    // its lease is deleted, as a person who knows the holder is gone may do.
    let _ = std::fs::remove_dir_all(dir.join(JOB_ID).join("lease"));
    let store = Store::open(&url).unwrap();
    let epochs = check_committed(&store, k);
    let (in_flight, staged, _) = leftovers(&dir, epochs.last().copied());
    let mut report = TrialReport {
        delay_ms,
        epochs: epochs.clone(),
        in_flight_objects: in_flight,
        staged_files: staged,
        ..TrialReport::default()
    };
    let Some(&newest) = epochs.last() else {
        let _ = std::fs::remove_dir_all(&dir);
        return report;
    };
    // Retention runs before each commit (once the parts are written), so a kill never
    // leaves more than KEEP.
    assert!(
        epochs.len() <= KEEP,
        "trial {k}: {epochs:?} listed, keep {KEEP}"
    );

    // Each committed epoch resumes to the uninterrupted value; the newest via At::Latest.
    for (j, &epoch) in epochs.iter().enumerate() {
        let workers = RESUME_WORKERS[(k + j) % RESUME_WORKERS.len()];
        let at = if epoch == newest {
            At::Latest
        } else {
            At::Epoch(epoch)
        };
        let what = format!("trial {k}: {at:?} (epoch {epoch}) with {workers} workers");
        assert_same(&resume(&url, at, workers, &what), &setup.expected, &what);
        report.resumes += 1;
    }

    // A new writer in the crashed store: resumed inline (nothing runs before `wait`), it
    // commits the next epoch next to whatever the killed writer left half-written there.
    let exec = Executor::builder()
        .local_workers(0)
        .job_id(JOB_ID)
        .snapshots(&url)
        .build()
        .unwrap();
    let handle = exec.resume::<Walk>(&url, At::Latest).unwrap();
    let id = handle
        .snapshot()
        .wait()
        .unwrap_or_else(|e| panic!("trial {k}: a snapshot after the crash failed: {e}"));
    assert!(id.epoch > newest, "trial {k}: {id} after epoch {newest}");
    let what = format!("trial {k}: the writer after the crash");
    let finished = handle.wait().unwrap().finished().unwrap();
    assert_same(&finished, &setup.expected, &what);
    let what = format!("trial {k}: {id}, written after the crash, with 3 workers");
    assert_same(
        &resume(&url, At::Epoch(id.epoch), 3, &what),
        &setup.expected,
        &what,
    );
    report.resumes += 2;

    // Garbage collection removes what the kill left, and breaks no committed snapshot.
    let cleanup = block_on(store.gc(JOB_ID)).unwrap();
    report.gc_deleted = cleanup.deleted.len();
    let after = check_committed(&store, k);
    assert_eq!(after.last(), Some(&id.epoch), "trial {k}: after gc");
    let (_, staged, staged_committed) = leftovers(&dir, after.last().copied());
    assert_eq!(
        staged_committed, 0,
        "trial {k}: gc left staged files in committed folders"
    );
    report.staged_after_gc = staged;
    let what = format!("trial {k}: latest after gc, with 1 worker");
    assert_same(&resume(&url, At::Latest, 1, &what), &setup.expected, &what);
    report.resumes += 1;

    let _ = std::fs::remove_dir_all(&dir);
    report
}

fn crash_trials(trials: usize) {
    let seed = std::env::var(SEED_ENV)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_SEED);
    let mut rng = Rng(seed);
    let delays: Vec<u64> = (0..trials).map(|_| rng.in_range(KILL_MS)).collect();

    // The value of an uninterrupted run, computed once, and checked against a plain loop.
    let job = child_job();
    let expected = Executor::builder()
        .local_workers(CHILD_WORKERS)
        .chunking(CHUNKING)
        .build()
        .unwrap()
        .run(job.clone())
        .unwrap();
    let (seq, seq_history) = sequential(&job);
    assert_eq!(expected.value.sum.to_bits(), seq.sum.to_bits());
    assert_eq!(expected.job.history, seq_history);

    let root = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("crash-{}-{trials}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let setup = Arc::new(Setup {
        root: root.clone(),
        exe: std::env::current_exe().unwrap(),
        expected,
    });

    // Two trials at a time: two threads take the trials in turn.
    let t0 = Instant::now();
    let reports = Arc::new(Mutex::new(Vec::new()));
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let (setup, reports, next, delays) = (
                Arc::clone(&setup),
                Arc::clone(&reports),
                Arc::clone(&next),
                delays.clone(),
            );
            std::thread::spawn(move || {
                loop {
                    let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if k >= delays.len() {
                        return;
                    }
                    let r = trial(&setup, k, delays[k]);
                    reports.lock().unwrap().push(r);
                }
            })
        })
        .collect();
    for t in threads {
        if let Err(panic) = t.join() {
            std::panic::resume_unwind(panic);
        }
    }
    let reports = reports.lock().unwrap().clone();
    assert_eq!(reports.len(), trials);
    let _ = std::fs::remove_dir_all(&root);

    let restored = reports.iter().filter(|r| !r.epochs.is_empty()).count();
    let too_early: Vec<u64> = reports
        .iter()
        .filter(|r| r.epochs.is_empty())
        .map(|r| r.delay_ms)
        .collect();
    let resumes: usize = reports.iter().map(|r| r.resumes).sum();
    let mid_write = reports.iter().filter(|r| r.in_flight_objects > 0).count();
    let staged = reports.iter().filter(|r| r.staged_files > 0).count();
    let gc = reports.iter().filter(|r| r.gc_deleted > 0).count();
    let staged_files: usize = reports.iter().map(|r| r.staged_files).sum();
    let staged_kept: usize = reports.iter().map(|r| r.staged_after_gc).sum();
    let max_epoch = reports
        .iter()
        .filter_map(|r| r.epochs.last())
        .max()
        .copied();
    println!(
        "crash consistency (seed {seed:#x}): {trials} SIGKILLs in {:.1} s\n\
         \x20 {restored} left a committed snapshot and were restored ({resumes} resumes, every \
         one bit-identical; newest epoch seen {max_epoch:?})\n\
         \x20 {} killed before the first commit (delays {too_early:?} ms)\n\
         \x20 {mid_write} killed with a snapshot in flight (objects above the newest epoch), \
         {staged} with a staged file, {gc} with leftovers for gc\n\
         \x20 staged files ({staged_files} in all) are invisible to the store's listing; gc \
         deletes those up to the newest epoch: {staged_kept} were left (above it)",
        t0.elapsed().as_secs_f64(),
        too_early.len(),
    );
    assert!(
        restored * 10 >= trials * 6,
        "only {restored} of {trials} trials had a snapshot to restore: the test says little"
    );
}

/// 80 kills at random moments, two children at a time.
#[test]
fn sigkill_at_random_moments_never_leaves_a_torn_snapshot() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    crash_trials(80);
}

/// The long version: 500 kills.
#[test]
#[ignore = "long: 500 kills, about a minute in release"]
fn sigkill_500_times() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    crash_trials(500);
}
