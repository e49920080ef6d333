//! A resume under code whose job has another shape than the snapshot's is refused with
//! `Error::ShapeChanged`, naming the code's value and the snapshot's, before anything runs:
//! a `Rows` grid of another height with another band count (it was "inconsistent snapshot
//! manifest", blaming the snapshot), of another height with the same band count (the
//! user's `update` got an empty neighbour row and panicked), 8 columns wider (it resumed on
//! the old width without a word), cut into other bands (it failed after a phase with
//! `PartitionsChanged`); a general owned-partition job with 16 more items (it resumed on the
//! old ranges); and, for a snapshot of format 5 (which recorded no shape), a grid of another
//! width is caught by the check of its stored bands. The same code resumes as before.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use malleable::reduce::Sum;
use malleable::rows::{Rows, Window};
use malleable::snapshot::{self, BlockingStore, SnapshotId};
use malleable::{Banded, Chunk, Chunking, Error, Executor, Job, Next, Outcome, Ownership};
use malleable::{Partition, Step};
use serde::{Deserialize, Serialize};

/// Rows updated and steps run in this process, by every job here.
static WORK: AtomicU64 = AtomicU64::new(0);
/// Phases ended.
static PHASES: AtomicU64 = AtomicU64::new(0);
/// The tests count work: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// How many phases every job runs: more than a test waits for.
const PHASE_COUNT: u64 = 40;

/// A grid module: `Grid` (named "shape-grid", the same job value in every module) whose
/// height, bands and width are the code's, as a program's constants are.
macro_rules! grid {
    ($module:ident, height: $h:expr, bands: $b:expr, width: $w:expr) => {
        mod $module {
            use super::*;

            #[derive(Debug, Clone, Serialize, Deserialize)]
            pub(crate) struct Grid {
                pub(crate) done: u64,
            }

            impl Rows for Grid {
                const NAME: &'static str = "shape-grid";
                type Element = f64;
                type Acc = f64;
                type Reducer = Sum<f64>;
                type Input = ();
                fn height(&self) -> u64 {
                    $h
                }
                fn width(&self) -> usize {
                    $w
                }
                fn bands(&self) -> u64 {
                    $b
                }
                fn reducer(&self) -> Sum<f64> {
                    Sum::new()
                }
                fn init(&self, _: &(), i: u64, row: &mut [f64]) {
                    for (j, x) in row.iter_mut().enumerate() {
                        *x = (i * 7 + j as u64 % 5) as f64;
                    }
                }
                fn update(&self, _: &(), _: u64, win: Window<'_, f64>, acc: &mut f64) {
                    WORK.fetch_add(1, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_micros(300));
                    // Reads its neighbours cell by cell, as a stencil does.
                    for j in 0..win.row.len() {
                        let up = win.above.map_or(0.0, |a| a[j]);
                        let down = win.below.map_or(0.0, |b| b[j]);
                        win.row[j] = 0.5 * win.old[j] + 0.25 * (up + down);
                        *acc += win.row[j];
                    }
                }
                fn end_phase(&mut self, _: &f64) -> Next {
                    PHASES.fetch_add(1, Ordering::SeqCst);
                    self.done += 1;
                    if self.done < PHASE_COUNT {
                        Next::Continue
                    } else {
                        Next::Finish
                    }
                }
                fn target_step(&self) -> Duration {
                    Duration::from_micros(500)
                }
            }
        }
    };
}

grid!(grid_a, height: 60, bands: 32, width: 16);
grid!(grid_taller, height: 62, bands: 32, width: 16);
grid!(grid_b, height: 120, bands: 4, width: 16);
grid!(grid_b_taller, height: 128, bands: 4, width: 16);
grid!(grid_b_wider, height: 120, bands: 4, width: 24);
grid!(grid_b_more_bands, height: 120, bands: 5, width: 16);

/// A general owned-partition module: `Items` (named "shape-items") over the code's number of
/// items, each chunk owning its items' values.
macro_rules! items {
    ($module:ident, items: $n:expr) => {
        mod $module {
            use super::*;

            #[derive(Debug, Clone, Serialize, Deserialize)]
            pub(crate) struct Items {
                pub(crate) done: u64,
            }

            #[derive(Serialize, Deserialize)]
            pub(crate) struct Part {
                start: u64,
                next: u64,
                end: u64,
                values: Vec<u64>,
            }

            impl Job for Items {
                const NAME: &'static str = "shape-items";
                const OWNERSHIP: Ownership<Self> = Ownership::PARTITIONS;
                type Chunk = Part;
                type Reducer = Sum<u64>;
                type Input = ();
                fn iterations(&self) -> u64 {
                    $n
                }
                fn chunking(&self) -> Option<Chunking> {
                    Some(Chunking::Count(4))
                }
                fn chunk(&self, range: Range<u64>) -> Part {
                    Part {
                        start: range.start,
                        next: range.start,
                        end: range.end,
                        values: range.collect(),
                    }
                }
                fn reducer(&self) -> Sum<u64> {
                    Sum::new()
                }
                fn end_phase(&mut self, _: &u64) -> Next {
                    PHASES.fetch_add(1, Ordering::SeqCst);
                    self.done += 1;
                    if self.done < PHASE_COUNT {
                        Next::Continue
                    } else {
                        Next::Finish
                    }
                }
            }

            impl Chunk for Part {
                type Job = Items;
                type Output = u64;
                fn step(&mut self, _: &Items, _: &()) -> Step<u64> {
                    WORK.fetch_add(1, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_micros(300));
                    let k = (self.next - self.start) as usize;
                    self.values[k] += 1;
                    self.next += 1;
                    if self.next == self.end {
                        Step::Done(self.values.iter().sum())
                    } else {
                        Step::Yield
                    }
                }
            }

            impl Partition for Part {
                type Halo = ();
                fn export(&self, _: &Items) -> ((), ()) {
                    ((), ())
                }
                fn begin_phase(&mut self, _: &Items, _: Option<()>, _: Option<()>) {
                    self.next = self.start;
                }
            }
        }
    };
}

items!(items_a, items: 64);
items!(items_more, items: 80);

fn folder(name: &str) -> (String, PathBuf) {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("shape-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    (format!("file://{}", dir.display()), dir)
}

fn exec(url: &str) -> Executor {
    Executor::builder()
        .local_workers(2)
        .snapshots(url)
        .build()
        .unwrap()
}

fn serial() -> std::sync::MutexGuard<'static, ()> {
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    PHASES.store(0, Ordering::SeqCst);
    guard
}

/// `job` started with `submit_or_resume` and suspended after its second phase ended.
fn suspended<J: Job>(url: &str, job: J) -> SnapshotId {
    let h = exec(url).submit_or_resume(job).unwrap();
    while PHASES.load(Ordering::SeqCst) < 2 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let id = h.suspend().wait().unwrap();
    assert!(matches!(h.wait().unwrap(), Outcome::Suspended(_)));
    id
}

/// The `ShapeChanged` of resuming `url` with `job` (the same job value, another code),
/// checked to come before anything ran and to name `id`: `(what, written, code)`.
fn shape_changed<J: Job>(url: &str, id: &SnapshotId, job: J) -> (String, u64, u64) {
    let work = WORK.load(Ordering::SeqCst);
    let e = match exec(url).submit_or_resume(job) {
        Err(e) => e,
        Ok(h) => {
            let outcome = h.wait().map(|o| matches!(o, Outcome::Finished(_)));
            panic!("expected ShapeChanged, the job resumed and ended with {outcome:?} (finished?)")
        }
    };
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(WORK.load(Ordering::SeqCst), work, "nothing ran");
    let store = BlockingStore::open(url).unwrap();
    assert_eq!(store.latest(&id.job_id).unwrap(), Some(id.clone()));
    let text = e.to_string();
    match e {
        Error::ShapeChanged {
            job,
            snapshot,
            what,
            written,
            code,
        } => {
            assert_eq!(job, J::NAME);
            assert_eq!(snapshot, *id);
            assert_eq!(
                text,
                format!(
                    "job {job} cannot resume snapshot {id}: {what} is {code} in this \
                     program's code but {written} in the snapshot"
                )
            );
            (what, written, code)
        }
        e => panic!("expected ShapeChanged, got {e:?}"),
    }
}

#[test]
fn another_height_with_another_band_count_is_refused_naming_the_height() {
    let _serial = serial();
    let (url, dir) = folder("height-bands");
    // 60 rows in 32 bands are 30 bands of 2 rows; 62 rows are 31.
    let id = suspended(&url, Banded(grid_a::Grid { done: 0 }));
    let got = shape_changed(&url, &id, Banded(grid_taller::Grid { done: 0 }));
    assert_eq!(got, ("height (rows)".to_owned(), 60, 62));
    // The same code resumes, and finishes.
    let h = exec(&url)
        .submit_or_resume(Banded(grid_a::Grid { done: 0 }))
        .unwrap();
    assert_eq!(h.resumed().map(|r| r.from), Some(id));
    assert_eq!(
        h.wait().unwrap().finished().unwrap().job.0.done,
        PHASE_COUNT
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn another_height_with_the_same_band_count_is_refused_before_update_sees_an_empty_row() {
    let _serial = serial();
    let (url, dir) = folder("height");
    let id = suspended(&url, Banded(grid_b::Grid { done: 0 }));
    let got = shape_changed(&url, &id, Banded(grid_b_taller::Grid { done: 0 }));
    assert_eq!(got, ("height (rows)".to_owned(), 120, 128));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_wider_grid_is_refused_naming_the_width() {
    let _serial = serial();
    let (url, dir) = folder("width");
    let id = suspended(&url, Banded(grid_b::Grid { done: 0 }));
    let got = shape_changed(&url, &id, Banded(grid_b_wider::Grid { done: 0 }));
    assert_eq!(got, ("width (cells per row)".to_owned(), 16, 24));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn other_bands_are_refused_before_a_phase_runs() {
    let _serial = serial();
    let (url, dir) = folder("bands");
    let id = suspended(&url, Banded(grid_b::Grid { done: 0 }));
    let got = shape_changed(&url, &id, Banded(grid_b_more_bands::Grid { done: 0 }));
    assert_eq!(got, ("bands".to_owned(), 4, 5));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_general_owned_partition_job_with_more_items_is_refused() {
    let _serial = serial();
    let (url, dir) = folder("items");
    let id = suspended(&url, items_a::Items { done: 0 });
    let (what, written, code) = shape_changed(&url, &id, items_more::Items { done: 0 });
    assert!(what.starts_with("the iterations of phase "), "{what}");
    assert_eq!((written, code), (64, 80));
    // The same code resumes, and finishes.
    let h = exec(&url)
        .submit_or_resume(items_a::Items { done: 0 })
        .unwrap();
    assert_eq!(h.resumed().map(|r| r.from), Some(id));
    assert_eq!(h.wait().unwrap().finished().unwrap().job.done, PHASE_COUNT);
    let _ = std::fs::remove_dir_all(dir);
}

/// The manifest of `id` rewritten as format 5 wrote it: without the submitted job and the
/// shape (`None` and an empty list, a 0 byte each).
fn as_format_5(dir: &Path, id: &SnapshotId) {
    let path = dir
        .join(&id.job_id)
        .join(format!("{:020}", id.epoch))
        .join("manifest");
    let manifest = snapshot::decode_manifest(&std::fs::read(&path).unwrap()).unwrap();
    assert!(
        !manifest.shape.is_empty(),
        "a grid's snapshot records its shape"
    );
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
    assert!(snapshot::decode_manifest(&file).unwrap().shape.is_empty());
}

/// A snapshot of format 5 recorded no shape: the stored bands are checked instead (their
/// width), and the plan (the height).
#[test]
fn without_a_recorded_shape_the_stored_bands_and_the_plan_are_checked() {
    let _serial = serial();
    let (url, dir) = folder("format-5");
    let id = suspended(&url, Banded(grid_b::Grid { done: 0 }));
    as_format_5(&dir, &id);
    let (what, written, code) = shape_changed(&url, &id, Banded(grid_b_wider::Grid { done: 0 }));
    assert!(
        what.starts_with("the width (cells per row) of band "),
        "{what}"
    );
    assert_eq!((written, code), (16, 24));
    let (what, written, code) = shape_changed(&url, &id, Banded(grid_b_taller::Grid { done: 0 }));
    assert!(what.starts_with("the iterations of phase "), "{what}");
    assert_eq!((written, code), (120, 128));
    // The same code resumes, and finishes.
    let h = exec(&url)
        .submit_or_resume(Banded(grid_b::Grid { done: 0 }))
        .unwrap();
    assert_eq!(h.resumed().map(|r| r.from), Some(id));
    assert_eq!(
        h.wait().unwrap().finished().unwrap().job.0.done,
        PHASE_COUNT
    );
    let _ = std::fs::remove_dir_all(dir);
}
