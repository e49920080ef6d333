//! `submit_or_resume` with a job value other than the one the snapshot's run was submitted
//! with: refused by default with `Error::ResumedJobDiffers` before anything runs (it ran the
//! old job silently); taken by a job whose `Job::resumed_with` accepts the change (more
//! steps: the extra phases run and the value is that of the longer job); ignored under
//! `Resubmit::UseStored` (the stored job runs); not checked for a snapshot of format 5.

use std::ops::Range;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use malleable::reduce::Sum;
use malleable::snapshot::{self, BlockingStore, SnapshotId};
use malleable::{BoxError, Chunk, Chunking, Error, Executor, Job, Next, Outcome, Resubmit, Step};
use serde::{Deserialize, Serialize};

/// Steps run and phases ended in this process, by every walk job.
static STEPS: AtomicU64 = AtomicU64::new(0);
static PHASES: AtomicU64 = AtomicU64::new(0);
/// The tests count steps and phases: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

const N: u64 = 2000;

/// A job module: `Walk` (named "walk") that sums `i * (done + 1)` over `0..n`, slowly, once
/// per step of `steps`; `$accepts` says whether its `resumed_with` takes more steps.
macro_rules! walk {
    ($module:ident, accepts: $accepts:expr) => {
        mod $module {
            use super::*;

            #[derive(Debug, Clone, Serialize, Deserialize)]
            pub(crate) struct Walk {
                pub(crate) n: u64,
                pub(crate) steps: u64,
                pub(crate) done: u64,
            }

            #[derive(Serialize, Deserialize)]
            pub(crate) struct WalkChunk {
                next: u64,
                end: u64,
                acc: u64,
            }

            impl Job for Walk {
                const NAME: &'static str = "walk";
                type Chunk = WalkChunk;
                type Reducer = Sum<u64>;
                type Input = ();
                fn iterations(&self) -> u64 {
                    self.n
                }
                fn chunk(&self, range: Range<u64>) -> WalkChunk {
                    WalkChunk {
                        next: range.start,
                        end: range.end,
                        acc: 0,
                    }
                }
                fn reducer(&self) -> Sum<u64> {
                    Sum::new()
                }
                fn end_phase(&mut self, _: &u64) -> Next {
                    PHASES.fetch_add(1, Ordering::SeqCst);
                    self.done += 1;
                    if self.done < self.steps {
                        Next::Continue
                    } else {
                        Next::Finish
                    }
                }
                fn resumed_with(
                    &mut self,
                    submitted: Walk,
                    started_with: &Walk,
                ) -> Result<(), BoxError> {
                    if !$accepts {
                        return Err("this walk takes no change".into());
                    }
                    if submitted.n != started_with.n {
                        return Err(format!(
                            "n cannot change: {} was submitted, the run has {}",
                            submitted.n, started_with.n
                        )
                        .into());
                    }
                    self.steps = submitted.steps;
                    Ok(())
                }
            }

            impl Chunk for WalkChunk {
                type Job = Walk;
                type Output = u64;
                fn step(&mut self, job: &Walk, _: &()) -> Step<u64> {
                    STEPS.fetch_add(1, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_micros(100));
                    self.acc += self.next * (job.done + 1);
                    self.next += 1;
                    if self.next == self.end {
                        Step::Done(self.acc)
                    } else {
                        Step::Yield
                    }
                }
            }
        }
    };
}

walk!(refusing, accepts: false);
walk!(accepting, accepts: true);

/// A job that does not override `resumed_with`: the default refuses.
mod plain {
    use super::*;

    #[derive(Debug, Clone, Serialize, Deserialize)]
    pub(crate) struct Walk {
        pub(crate) n: u64,
        pub(crate) steps: u64,
        pub(crate) done: u64,
    }

    impl Job for Walk {
        const NAME: &'static str = "walk";
        type Chunk = WalkChunk;
        type Reducer = Sum<u64>;
        type Input = ();
        fn iterations(&self) -> u64 {
            self.n
        }
        fn chunk(&self, _: Range<u64>) -> WalkChunk {
            unreachable!("never run")
        }
        fn reducer(&self) -> Sum<u64> {
            Sum::new()
        }
    }

    #[derive(Serialize, Deserialize)]
    pub(crate) struct WalkChunk {
        next: u64,
        end: u64,
        acc: u64,
    }

    impl Chunk for WalkChunk {
        type Job = Walk;
        type Output = u64;
        fn step(&mut self, _: &Walk, _: &()) -> Step<u64> {
            STEPS.fetch_add(1, Ordering::SeqCst);
            Step::Done(0)
        }
    }
}

/// The value of a walk of `steps` steps: its last phase's sum.
fn value_of(steps: u64) -> u64 {
    (0..N).sum::<u64>() * steps
}

fn folder(name: &str) -> (String, PathBuf) {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("resubmit-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    (format!("file://{}", dir.display()), dir)
}

fn exec(url: &str) -> malleable::Builder {
    Executor::builder()
        .local_workers(2)
        .chunking(Chunking::Count(4))
        .snapshots(url)
}

/// A walk of 6 steps started with `submit_or_resume` and suspended in its second phase.
fn suspended(url: &str) -> SnapshotId {
    let e = exec(url).build().unwrap();
    let h = e
        .submit_or_resume(accepting::Walk {
            n: N,
            steps: 6,
            done: 0,
        })
        .unwrap();
    while PHASES.load(Ordering::SeqCst) < 1 {
        std::thread::sleep(Duration::from_millis(2));
    }
    let id = h.suspend().wait().unwrap();
    assert!(matches!(h.wait().unwrap(), Outcome::Suspended(_)));
    let ended = PHASES.load(Ordering::SeqCst);
    assert!((1..6).contains(&ended), "suspended after {ended} phases");
    id
}

fn reset() -> std::sync::MutexGuard<'static, ()> {
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    STEPS.store(0, Ordering::SeqCst);
    PHASES.store(0, Ordering::SeqCst);
    guard
}

/// The `ResumedJobDiffers` of `result`, checked to name `id`.
fn differs<T>(result: malleable::Result<T>, id: &SnapshotId) -> (Option<String>, String) {
    let e = match result {
        Err(e) => e,
        Ok(_) => panic!("expected ResumedJobDiffers, the job resumed"),
    };
    let report = format!("{e:?}");
    match e {
        Error::ResumedJobDiffers {
            job,
            snapshot,
            submitted,
            started_with,
            field,
            refusal,
        } => {
            assert_eq!(job, "walk");
            assert_eq!(snapshot, *id);
            assert_ne!(submitted, started_with);
            assert!(report.contains(&id.to_string()), "{report}");
            assert!(report.contains(&submitted.to_string()), "{report}");
            assert!(report.contains(&started_with.to_string()), "{report}");
            assert!(report.contains(&refusal.to_string()), "{report}");
            (field, report)
        }
        e => panic!("expected ResumedJobDiffers, got {e:?}"),
    }
}

#[test]
fn a_changed_job_is_refused_by_default_before_anything_runs() {
    let _serial = reset();
    let (url, dir) = folder("refused");
    let id = suspended(&url);
    let (steps, phases) = (STEPS.load(Ordering::SeqCst), PHASES.load(Ordering::SeqCst));

    // Another size and step count, to a job with the default `resumed_with`.
    let e = exec(&url).build().unwrap();
    let (field, report) = differs(
        e.submit_or_resume(plain::Walk {
            n: N + 500,
            steps: 9,
            done: 0,
        }),
        &id,
    );
    assert_eq!(field.as_deref(), Some("Walk.n"), "{report}");
    assert!(report.contains("Job::resumed_with"), "{report}");
    assert!(report.contains("Resubmit::UseStored"), "{report}");
    // A job that refuses in its own words.
    let (field, report) = differs(
        e.submit_or_resume(refusing::Walk {
            n: N,
            steps: 9,
            done: 0,
        }),
        &id,
    );
    assert_eq!(field.as_deref(), Some("Walk.steps"), "{report}");
    assert!(report.contains("this walk takes no change"), "{report}");
    // And one whose `resumed_with` refuses this change (another size) but not more steps.
    let (field, report) = differs(
        e.submit_or_resume(accepting::Walk {
            n: N + 1,
            steps: 6,
            done: 0,
        }),
        &id,
    );
    assert_eq!(field.as_deref(), Some("Walk.n"), "{report}");
    assert!(report.contains("n cannot change"), "{report}");

    // Nothing ran, nothing was written.
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(STEPS.load(Ordering::SeqCst), steps);
    assert_eq!(PHASES.load(Ordering::SeqCst), phases);
    let store = BlockingStore::open(&url).unwrap();
    assert_eq!(store.latest("walk").unwrap(), Some(id.clone()));

    // The job as submitted resumes, to its value.
    let h = e
        .submit_or_resume(accepting::Walk {
            n: N,
            steps: 6,
            done: 0,
        })
        .unwrap();
    assert_eq!(h.resumed().map(|r| r.from), Some(id));
    assert_eq!(h.wait().unwrap().finished().unwrap().value, value_of(6));
    assert_eq!(PHASES.load(Ordering::SeqCst), 6);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_job_that_takes_more_steps_runs_them() {
    let _serial = reset();
    let (url, dir) = folder("accepted");
    let id = suspended(&url);

    let e = exec(&url).build().unwrap();
    let h = e
        .submit_or_resume(accepting::Walk {
            n: N,
            steps: 9,
            done: 0,
        })
        .unwrap();
    assert_eq!(h.resumed().map(|r| r.from), Some(id));
    // Suspended again: the run now counts as submitted with 9 steps.
    while PHASES.load(Ordering::SeqCst) < 7 {
        std::thread::sleep(Duration::from_millis(2));
    }
    let again = h.suspend().wait().unwrap();
    assert!(matches!(h.wait().unwrap(), Outcome::Suspended(_)));
    let (field, _) = differs(
        e.submit_or_resume(refusing::Walk {
            n: N,
            steps: 6,
            done: 0,
        }),
        &again,
    );
    assert_eq!(field.as_deref(), Some("Walk.steps"));
    let h = e
        .submit_or_resume(refusing::Walk {
            n: N,
            steps: 9,
            done: 0,
        })
        .unwrap();
    assert_eq!(h.resumed().map(|r| r.from), Some(again));
    let fin = h.wait().unwrap().finished().unwrap();
    assert_eq!(fin.job.done, 9, "the extra phases ran");
    assert_eq!(fin.value, value_of(9));
    assert_eq!(PHASES.load(Ordering::SeqCst), 9);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn use_stored_resumes_the_job_as_stored_and_ignores_the_submitted_one() {
    let _serial = reset();
    let (url, dir) = folder("stored");
    let id = suspended(&url);

    let e = exec(&url)
        .resubmit_policy(Resubmit::UseStored)
        .build()
        .unwrap();
    let h = e
        .submit_or_resume(refusing::Walk {
            n: N + 500,
            steps: 9,
            done: 0,
        })
        .unwrap();
    assert_eq!(h.resumed().map(|r| r.from), Some(id));
    let fin = h.wait().unwrap().finished().unwrap();
    assert_eq!((fin.job.n, fin.job.steps, fin.job.done), (N, 6, 6));
    assert_eq!(fin.value, value_of(6));
    assert_eq!(PHASES.load(Ordering::SeqCst), 6);
    let _ = std::fs::remove_dir_all(dir);
}

/// A snapshot written before snapshots recorded the submitted job value (format 5): not
/// checked, as before.
#[test]
fn a_snapshot_of_format_5_is_not_checked() {
    let _serial = reset();
    let (url, dir) = folder("format-5");
    let id = suspended(&url);
    let path = dir
        .join(&id.job_id)
        .join(format!("{:020}", id.epoch))
        .join("manifest");
    let manifest = snapshot::decode_manifest(&std::fs::read(&path).unwrap()).unwrap();
    assert!(manifest.submitted.is_some(), "the snapshot records it");
    // Format 5: the body without `submitted` and `shape` (`None` and an empty list, a 0
    // byte each), the checksum over the header and the body.
    let mut body = postcard::to_allocvec(&snapshot::Manifest {
        format_version: 5,
        submitted: None,
        shape: Vec::new(),
        ..manifest
    })
    .unwrap();
    assert_eq!(body.split_off(body.len() - 2), [0, 0]);
    let mut file = snapshot::MAGIC.to_vec();
    file.extend_from_slice(&5u32.to_le_bytes());
    file.extend_from_slice(&(body.len() as u64).to_le_bytes());
    file.extend_from_slice(&crc32c::crc32c_append(crc32c::crc32c(&file), &body).to_le_bytes());
    file.extend_from_slice(&body);
    std::fs::write(&path, &file).unwrap();
    assert_eq!(snapshot::decode_manifest(&file).unwrap().submitted, None);

    let e = exec(&url).build().unwrap();
    let h = e
        .submit_or_resume(refusing::Walk {
            n: N,
            steps: 9,
            done: 0,
        })
        .unwrap();
    assert_eq!(h.resumed().map(|r| r.from), Some(id));
    assert_eq!(h.wait().unwrap().finished().unwrap().value, value_of(6));
    let _ = std::fs::remove_dir_all(dir);
}
