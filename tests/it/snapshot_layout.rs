//! The layout of a job's types, recorded in every snapshot and checked on resume: code whose
//! job has the same `NAME` and `VERSION` but fields swapped or appended is refused with
//! `LayoutChanged` before a byte of the job is decoded (it resumed silently wrong, or failed
//! with "hit the end of buffer"); an unchanged job resumes; a snapshot of the format before
//! layouts (without one) still resumes, unchecked.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use malleable::reduce::Sum;
use malleable::snapshot::{self, SnapshotId};
use malleable::{At, Chunk, Chunking, Error, Executor, Job, Layout, Outcome, Step};
use serde::{Deserialize, Serialize};

const CHUNKING: Chunking = Chunking::Count(4);

/// A job module: `Drift` (named "drift", version 1) with the fields given, the same chunk.
/// Every iteration adds `i * scale + offset`, slowly.
macro_rules! drift {
    ($module:ident { $($field:ident: $ty:ty),* }) => {
        mod $module {
            use super::*;

            #[derive(Debug, Clone, Serialize, Deserialize)]
            pub(crate) struct Drift {
                pub(crate) n: u64,
                $(pub(crate) $field: $ty),*
            }

            #[derive(Serialize, Deserialize)]
            pub(crate) struct DriftChunk {
                next: u64,
                end: u64,
                acc: f64,
            }

            impl Job for Drift {
                const NAME: &'static str = "drift";
                type Chunk = DriftChunk;
                type Reducer = Sum<f64>;
                type Input = ();
                fn iterations(&self) -> u64 {
                    self.n
                }
                fn chunk(&self, range: Range<u64>) -> DriftChunk {
                    DriftChunk { next: range.start, end: range.end, acc: 0.0 }
                }
                fn reducer(&self) -> Sum<f64> {
                    Sum::new()
                }
            }

            impl Chunk for DriftChunk {
                type Job = Drift;
                type Output = f64;
                fn step(&mut self, job: &Drift, _: &()) -> Step<f64> {
                    std::thread::sleep(Duration::from_micros(200));
                    self.acc += self.next as f64 * job.scale + job.offset;
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

drift!(first {
    scale: f64,
    offset: f64
});
drift!(swapped {
    offset: f64,
    scale: f64
});
drift!(appended {
    scale: f64,
    offset: f64,
    extra: f64
});

fn folder(name: &str) -> (String, PathBuf) {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("layout-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    (format!("file://{}", dir.display()), dir)
}

fn job() -> first::Drift {
    first::Drift {
        n: 2000,
        scale: 2.0,
        offset: 0.5,
    }
}

/// What `job()` sums to.
fn expected() -> f64 {
    let j = job();
    (0..j.n).map(|i| i as f64 * j.scale + j.offset).sum()
}

/// `job()` suspended to a snapshot in `url`.
fn suspended(url: &str) -> SnapshotId {
    let exec = Executor::builder()
        .local_workers(2)
        .chunking(CHUNKING)
        .snapshots(url)
        .build()
        .unwrap();
    let handle = exec.submit(job()).unwrap();
    std::thread::sleep(Duration::from_millis(40));
    let id = handle.suspend().wait().unwrap();
    assert!(matches!(handle.wait().unwrap(), Outcome::Suspended(_)));
    id
}

fn manifest_path(dir: &Path, id: &SnapshotId) -> PathBuf {
    dir.join(&id.job_id)
        .join(format!("{:020}", id.epoch))
        .join("manifest")
}

/// The `LayoutChanged` of resuming `url` as job `J`, checked to name `id`; its difference.
fn layout_changed<J: Job>(url: &str, id: &SnapshotId) -> String {
    let fresh = Executor::builder().local_workers(1).build().unwrap();
    let e = match fresh.resume::<J>(url, At::Latest) {
        Err(e) => e,
        Ok(_) => panic!("expected LayoutChanged, the job resumed"),
    };
    let text = e.to_string();
    match e {
        Error::Snapshot(snapshot::Error::LayoutChanged {
            snapshot,
            job,
            written,
            code,
            difference,
        }) => {
            assert_eq!(snapshot, *id);
            assert_eq!(job, "drift");
            assert_eq!(written, Layout::of::<first::Drift>().fingerprint());
            assert_eq!(code, Layout::of::<J>().fingerprint());
            assert_ne!(written, code);
            assert!(text.contains(&id.to_string()), "{text}");
            assert!(text.contains(&written.to_string()), "{text}");
            assert!(text.contains(&code.to_string()), "{text}");
            assert!(text.contains(&difference), "{text}");
            difference
        }
        e => panic!("expected LayoutChanged, got {e:?}"),
    }
}

#[test]
fn swapped_or_appended_fields_are_refused_before_decoding_and_the_same_types_resume() {
    let (url, _dir) = folder("changed");
    let id = suspended(&url);

    // Two f64 swapped: the bytes would decode, into the wrong fields.
    let difference = layout_changed::<swapped::Drift>(&url, &id);
    assert_eq!(
        difference,
        "the snapshot has `Drift.scale: f64` where this program has `Drift.offset: f64`"
    );
    // A field appended: the bytes would fail to decode, with no word of the cause.
    let difference = layout_changed::<appended::Drift>(&url, &id);
    assert_eq!(
        difference,
        "this program has `Drift.extra: f64`, which the snapshot does not"
    );

    // The same types resume, to the right value.
    let fresh = Executor::builder().local_workers(2).build().unwrap();
    let resumed = fresh.resume::<first::Drift>(&url, At::Latest).unwrap();
    assert_eq!(resumed.resumed().unwrap().from, id);
    let value = resumed.wait().unwrap().finished().unwrap().value;
    assert!((value - expected()).abs() < 1e-6, "{value}");
}

#[test]
fn a_snapshot_without_a_layout_still_resumes() {
    let (url, dir) = folder("none");
    let id = suspended(&url);
    let path = manifest_path(&dir, &id);
    let manifest = snapshot::decode_manifest(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(
        manifest.layout.as_ref(),
        Some(Layout::of::<first::Drift>()),
        "a snapshot records the layout of its job's types"
    );

    // The manifest as the builds before layouts wrote it: format 3, its body without the
    // layout, the submitted job and the shape (the last fields: `None`, `None` and an empty
    // list, a 0 byte each), the checksum over the body only.
    let mut body = postcard::to_allocvec(&snapshot::Manifest {
        format_version: 3,
        layout: None,
        submitted: None,
        shape: Vec::new(),
        ..manifest
    })
    .unwrap();
    assert_eq!(body.split_off(body.len() - 3), [0, 0, 0]);
    let mut file = snapshot::MAGIC.to_vec();
    file.extend_from_slice(&3u32.to_le_bytes());
    file.extend_from_slice(&(body.len() as u64).to_le_bytes());
    file.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
    file.extend_from_slice(&body);
    std::fs::write(&path, &file).unwrap();
    assert_eq!(
        snapshot::decode_manifest(&file).unwrap().layout,
        None,
        "read back without a layout"
    );

    // Not checked (logged at info): it resumes as before layouts were recorded.
    let fresh = Executor::builder().local_workers(2).build().unwrap();
    let resumed = fresh.resume::<first::Drift>(&url, At::Latest).unwrap();
    assert_eq!(resumed.resumed().unwrap().from, id);
    let value = resumed.wait().unwrap().finished().unwrap().value;
    assert!((value - expected()).abs() < 1e-6, "{value}");
}

/// A job value that does not decode (here: cut short, in a manifest that is otherwise
/// sound) is an error naming the snapshot and the value.
#[test]
fn a_job_value_that_does_not_decode_names_the_snapshot() {
    let (url, dir) = folder("undecodable");
    let id = suspended(&url);
    let path = manifest_path(&dir, &id);
    let mut manifest = snapshot::decode_manifest(&std::fs::read(&path).unwrap()).unwrap();
    manifest.job.truncate(3);
    std::fs::write(&path, snapshot::encode_manifest(&manifest)).unwrap();

    let fresh = Executor::builder().local_workers(1).build().unwrap();
    let e = match fresh.resume::<first::Drift>(&url, At::Latest) {
        Err(e) => e,
        Ok(_) => panic!("expected Undecodable, the job resumed"),
    };
    let text = e.to_string();
    match e {
        Error::Snapshot(snapshot::Error::Undecodable { snapshot, what, .. }) => {
            assert_eq!((snapshot, what), (id.clone(), "the job"));
            assert_eq!(
                text,
                format!("cannot decode the job of snapshot {id} as this program's type")
            );
        }
        e => panic!("expected Undecodable, got {e:?}"),
    }
}
