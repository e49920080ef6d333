//! The lifecycle around a job: resume-or-start in one call (never starting afresh past a
//! damaged snapshot), resuming from the executor's own store, from async code, removing a
//! finished job's snapshots, and a blocking store usable with or without a runtime (also on
//! a real S3 server: SeaweedFS on loopback, provisioned by `tests/support/seaweed.rs`).

use crate::common;
#[cfg(feature = "s3")]
use crate::support;

use std::path::PathBuf;
use std::time::Duration;

use common::{Kernel, sequential};
use malleable::snapshot::BlockingStore;
use malleable::{Chunking, Executor, Outcome};

const CHUNKING: Chunking = Chunking::Count(16);

fn folder(name: &str) -> (String, PathBuf) {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("lifecycle-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    (format!("file://{}", dir.display()), dir)
}

fn exec(url: &str, workers: usize) -> malleable::Builder {
    Executor::builder()
        .local_workers(workers)
        .chunking(CHUNKING)
        .snapshots(url)
        .job_id("lifecycle")
}

/// Two phases, long enough to be suspended in the first.
fn job() -> Kernel {
    let mut job = Kernel::new(300_000, 4);
    job.spin = 300;
    job.phases = 2;
    job
}

fn expected() -> f64 {
    let mut last = job();
    last.phase = 1;
    sequential(&last, CHUNKING).sum
}

/// Submits the job and suspends it a moment later; returns the suspend's snapshot.
fn suspended(url: &str) -> malleable::snapshot::SnapshotId {
    let e = exec(url, 2).build().unwrap();
    let h = e.submit_or_resume(job()).unwrap();
    assert_eq!(
        h.resumed().map(|r| r.from),
        None,
        "nothing to resume from yet"
    );
    std::thread::sleep(Duration::from_millis(50));
    let id = h.suspend().wait().unwrap();
    assert!(matches!(h.wait().unwrap(), Outcome::Suspended(_)));
    id
}

#[test]
fn submit_or_resume_starts_then_resumes_exactly() {
    let (url, dir) = folder("start-resume");
    let id = suspended(&url);
    let e = exec(&url, 3).build().unwrap();
    let h = e.submit_or_resume(job()).unwrap();
    assert_eq!(h.resumed().map(|r| r.from), Some(id));
    let fin = h.wait().unwrap().finished().unwrap();
    assert_eq!(fin.value.sum.to_bits(), expected().to_bits());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn submit_or_resume_refuses_to_start_over_a_damaged_snapshot() {
    let (url, dir) = folder("damaged");
    let id = suspended(&url);
    // Delete one part of the snapshot.
    let parts = dir
        .join("lifecycle")
        .join(format!("{:020}", id.epoch))
        .join("parts");
    let victim = std::fs::read_dir(&parts)
        .unwrap()
        .flatten()
        .next()
        .expect("the suspend wrote parts")
        .path();
    std::fs::remove_file(&victim).unwrap();
    let e = exec(&url, 2).build().unwrap();
    let err = e
        .submit_or_resume(job())
        .expect_err("a damaged snapshot is no reason to start afresh");
    let text = format!("{err}");
    assert!(text.contains("lifecycle"), "{text}");
    // Nothing was committed over it.
    let store = BlockingStore::open(&url).unwrap();
    assert_eq!(store.latest("lifecycle").unwrap(), Some(id));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn resume_at_reads_the_executors_own_store() {
    let (url, dir) = folder("resume-at");
    let id = suspended(&url);
    let e = exec(&url, 1).build().unwrap();
    let h = e
        .resume_at::<Kernel>(malleable::At::Epoch(id.epoch))
        .unwrap();
    assert_eq!(h.resumed().map(|r| r.from), Some(id));
    let fin = h.wait().unwrap().finished().unwrap();
    assert_eq!(fin.value.sum.to_bits(), expected().to_bits());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn resume_from_async_code_does_not_block_the_runtime() {
    let (url, dir) = folder("async");
    let id = suspended(&url);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let sum = rt.block_on(async {
        let e = exec(&url, 2).build().unwrap();
        // A timer on the same (single) thread keeps ticking while the snapshot is read.
        let ticker = tokio::spawn(async {
            let mut n = 0u32;
            loop {
                tokio::time::sleep(Duration::from_millis(1)).await;
                n += 1;
                if n > 1_000_000 {
                    return;
                }
            }
        });
        let h = e.submit_or_resume_async(job()).await.unwrap();
        assert_eq!(h.resumed().map(|r| r.from), Some(id));
        let fin = h.await.unwrap().finished().unwrap();
        ticker.abort();
        // A blocking store inside the runtime works, and is dropped here without a panic.
        let store = BlockingStore::open(&url).unwrap();
        assert!(store.latest("lifecycle").unwrap().is_some());
        drop(store);
        fin.value.sum
    });
    assert_eq!(sum.to_bits(), expected().to_bits());
    let _ = std::fs::remove_dir_all(dir);
}

/// Files under `dir`, recursively.
fn files(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn a_finished_jobs_snapshots_are_removed_when_asked() {
    let (url, dir) = folder("remove");
    let id = suspended(&url);
    let e = exec(&url, 2)
        .remove_snapshots_when_finished()
        .build()
        .unwrap();
    let h = e.submit_or_resume(job()).unwrap();
    assert_eq!(h.resumed().map(|r| r.from), Some(id.clone()));
    // Another snapshot while it runs: it is removed too.
    let more = h.snapshot().wait().unwrap();
    assert!(more.epoch > id.epoch);
    let fin = h.wait().unwrap().finished().unwrap();
    assert_eq!(fin.value.sum.to_bits(), expected().to_bits());
    let store = BlockingStore::open(&url).unwrap();
    assert_eq!(store.latest("lifecycle").unwrap(), None);
    assert_eq!(files(&dir.join("lifecycle")), Vec::<PathBuf>::new());

    // Without the option they stay, and `remove_snapshots` removes them.
    let _ = suspended(&url);
    let e = exec(&url, 2).build().unwrap();
    let h = e.submit_or_resume(job()).unwrap();
    assert!(h.wait().unwrap().finished().is_some());
    assert!(store.latest("lifecycle").unwrap().is_some());
    let cleanup = e.remove_snapshots::<Kernel>().unwrap();
    assert!(!cleanup.removed_epochs.is_empty());
    assert_eq!(store.latest("lifecycle").unwrap(), None);
    assert_eq!(files(&dir.join("lifecycle")), Vec::<PathBuf>::new());
    let _ = std::fs::remove_dir_all(dir);
}

#[cfg(feature = "s3")]
#[test]
fn a_blocking_store_on_s3_needs_no_runtime() {
    use support::seaweed;
    let server = seaweed::server();
    let url = format!(
        "s3://{}/lifecycle-blocking-{}",
        seaweed::BUCKET,
        std::process::id()
    );
    let mut b = Executor::builder()
        .local_workers(2)
        .chunking(CHUNKING)
        .snapshots(&url)
        .job_id("lifecycle");
    for (k, v) in server.options() {
        b = b.snapshot_option(k, v);
    }
    let h = b.build().unwrap().submit(job()).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let id = h.suspend().wait().unwrap();
    assert!(matches!(h.wait().unwrap(), Outcome::Suspended(_)));
    // No runtime on this thread.
    assert!(tokio::runtime::Handle::try_current().is_err());
    let store = BlockingStore::open_with(&url, server.options()).unwrap();
    assert_eq!(store.latest("lifecycle").unwrap(), Some(id.clone()));
    assert_eq!(store.jobs().unwrap(), vec!["lifecycle".to_owned()]);
    let m = store.manifest(&id).unwrap();
    assert_eq!(m.epoch, id.epoch);
    let cleanup = store.remove_job("lifecycle").unwrap();
    assert_eq!(cleanup.removed_epochs, vec![id.epoch]);
    assert_eq!(store.latest("lifecycle").unwrap(), None);
}

#[test]
fn build_refuses_an_invalid_job_id() {
    let (url, _dir) = folder("job-id");
    let err = Executor::builder()
        .snapshots(&url)
        .job_id("a/b")
        .build()
        .unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(
            &err,
            malleable::Error::Snapshot(malleable::snapshot::Error::InvalidJobId { .. })
        ),
        "{err:?}"
    );
    assert!(text.contains("\"a/b\""), "{text}");
}

/// A loop whose snapshots are resumed by a program with another version of its code.
macro_rules! versioned {
    ($name:ident, $version:expr) => {
        #[derive(serde::Serialize, serde::Deserialize)]
        struct $name {
            n: u64,
        }
        impl malleable::Fold for $name {
            const NAME: &'static str = "lifecycle-versioned";
            const VERSION: u32 = $version;
            type Acc = u64;
            type Reducer = malleable::reduce::Sum<u64>;
            type Input = ();
            fn iterations(&self) -> u64 {
                self.n
            }
            fn reducer(&self) -> malleable::reduce::Sum<u64> {
                malleable::reduce::Sum::new()
            }
            fn body(&self, _: &(), acc: &mut u64, i: u64) {
                std::hint::black_box(&acc);
                *acc += i;
            }
        }
    };
}
versioned!(Old, 1);
versioned!(New, 2);

#[test]
fn a_snapshot_of_another_job_version_is_refused_naming_both() {
    let (url, dir) = folder("versions");
    let e = exec(&url, 1).build().unwrap();
    let h = e.submit(malleable::Folded(Old { n: 200_000_000 })).unwrap();
    let id = h.suspend().wait().unwrap();
    assert!(matches!(h.wait().unwrap(), Outcome::Suspended(_)));
    let err = e
        .resume_at::<malleable::Folded<New>>(malleable::At::Epoch(id.epoch))
        .unwrap_err();
    assert!(
        matches!(
            &err,
            malleable::Error::Snapshot(malleable::snapshot::Error::WrongJobVersion {
                snapshot: 1,
                code: 2,
                ..
            })
        ),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("version 1") && text.contains("version 2"),
        "{text}"
    );
    // The same version resumes it.
    let h = e
        .resume_at::<malleable::Folded<Old>>(malleable::At::Epoch(id.epoch))
        .unwrap();
    let sum = h.wait().unwrap().finished().unwrap().into_value();
    assert_eq!(sum, (0..200_000_000u64).sum::<u64>());
    let _ = std::fs::remove_dir_all(dir);
}

/// A log that tests can read: what the calling thread logs at info and above while `f` runs.
fn logged<T>(f: impl FnOnce() -> T) -> (T, String) {
    #[derive(Clone, Default)]
    struct Buf(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Buf {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buf = Buf::default();
    let writer = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let out = tracing::subscriber::with_default(subscriber, || {
        // Other tests of this binary run on other threads with no subscriber: a callsite
        // they reached first may have cached "never" as its interest, and this thread's
        // events would be dropped (seen once in a full run under load).
        tracing::callsite::rebuild_interest_cache();
        f()
    });
    let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
    (out, text)
}

/// `submit_or_resume` says what it did: no snapshot under the store and job id, so the job
/// starts afresh; then which snapshot it resumed, and from which store.
#[test]
fn submit_or_resume_says_what_it_resumed_or_that_it_starts_afresh() {
    let (url, dir) = folder("logged");
    let e = exec(&url, 2).build().unwrap();
    let (h, log) = logged(|| e.submit_or_resume(job()).unwrap());
    assert!(
        log.contains(&format!("no committed snapshot under {url}/lifecycle"))
            && log.contains("starts from its first phase"),
        "{log}"
    );
    std::thread::sleep(Duration::from_millis(50));
    let id = h.suspend().wait().unwrap();
    assert!(matches!(h.wait().unwrap(), Outcome::Suspended(_)));
    let (h, log) = logged(|| e.submit_or_resume(job()).unwrap());
    assert!(
        log.contains(&format!("resumes from snapshot {id} in {url}")),
        "{log}"
    );
    h.wait().unwrap().finished().unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

/// `Resume::Required`: a misspelt job id or store path is an error naming both, with the
/// job ids the store holds; the job does not start, and nothing is written under the id.
#[test]
fn resume_required_refuses_to_start_afresh() {
    use malleable::{Error, Resume};
    let (url, dir) = folder("required");
    let id = suspended(&url);

    // A misspelt job id: the store's ids are listed.
    let e = exec(&url, 2)
        .job_id("lifecylce")
        .resume_policy(Resume::Required)
        .build()
        .unwrap();
    match e.submit_or_resume(job()) {
        Err(err @ Error::NothingToResume { .. }) => {
            let text = err.to_string();
            assert!(text.contains(&url), "{text}");
            assert!(text.contains("\"lifecylce\""), "{text}");
            assert!(text.contains("job ids in it: lifecycle"), "{text}");
            let Error::NothingToResume {
                store,
                job_id,
                others,
            } = err
            else {
                unreachable!()
            };
            assert_eq!((store, job_id), (url.clone(), "lifecylce".to_owned()));
            assert_eq!(others, ["lifecycle"]);
        }
        other => panic!("expected NothingToResume, got {:?}", other.map(|_| ())),
    }
    assert!(!dir.join("lifecylce").exists(), "nothing written");

    // A misspelt store path: an empty store, which says so.
    let (typo, typo_dir) = folder("requierd");
    let e = exec(&typo, 2)
        .resume_policy(Resume::Required)
        .build()
        .unwrap();
    let err = e.submit_or_resume(job()).map(|_| ()).unwrap_err();
    assert!(
        matches!(&err, Error::NothingToResume { others, .. } if others.is_empty()),
        "{err:?}"
    );
    assert!(err.to_string().contains("no job at all"), "{err}");
    assert!(err.to_string().contains(&typo), "{err}");

    // A store URL's credentials stay out of the message.
    let e = Executor::builder()
        .local_workers(1)
        .snapshots("memory://user:secret@x/y?token=abc")
        .resume_policy(Resume::Required)
        .build()
        .unwrap();
    let err = e.submit_or_resume(job()).map(|_| ()).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("memory://x/y"), "{text}");
    assert!(!text.contains("secret") && !text.contains("abc"), "{text}");

    // With a snapshot there, Required resumes it.
    let e = exec(&url, 2)
        .resume_policy(Resume::Required)
        .build()
        .unwrap();
    let h = e.submit_or_resume(job()).unwrap();
    assert_eq!(h.resumed().map(|r| r.from), Some(id));
    let fin = h.wait().unwrap().finished().unwrap();
    assert_eq!(fin.value.sum.to_bits(), expected().to_bits());
    let _ = std::fs::remove_dir_all(dir);
    let _ = std::fs::remove_dir_all(typo_dir);
}

/// A plain path is a folder store, for the builder and for `resume`: relative ones under the
/// current directory.
#[test]
fn plain_paths_are_folder_stores() {
    let (url, dir) = folder("plain");
    // Relative to the current directory (tests run in the crate's folder).
    let cwd = std::env::current_dir().unwrap();
    let relative = pathdiff(&dir, &cwd);
    let e = exec(&relative, 2).build().unwrap();
    let h = e.submit_or_resume(job()).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let id = h.suspend().wait().unwrap();
    assert!(matches!(h.wait().unwrap(), Outcome::Suspended(_)));
    assert!(
        dir.join("lifecycle").is_dir(),
        "written under {}",
        dir.display()
    );
    // Resumed through the file:// URL, the absolute path and the relative one.
    for store in [url.clone(), dir.display().to_string(), relative.clone()] {
        let e = Executor::builder()
            .local_workers(1)
            .chunking(CHUNKING)
            .job_id("lifecycle")
            .build()
            .unwrap();
        let h = e
            .resume::<Kernel>(&store, malleable::At::Epoch(id.epoch))
            .unwrap();
        assert_eq!(h.resumed().map(|r| r.from), Some(id.clone()), "{store}");
        h.cancel();
        let _ = h.wait();
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// `to` as a path relative to `from` (both absolute): `../../target/…`.
fn pathdiff(to: &std::path::Path, from: &std::path::Path) -> String {
    let to: Vec<_> = to.components().collect();
    let from: Vec<_> = from.components().collect();
    let common = to.iter().zip(&from).take_while(|(a, b)| a == b).count();
    let mut parts: Vec<String> = vec!["..".to_owned(); from.len() - common];
    parts.extend(
        to[common..]
            .iter()
            .map(|c| c.as_os_str().to_string_lossy().into_owned()),
    );
    parts.join("/")
}

/// A program that finishes its job, removes its snapshots and starts again, ten times, with
/// snapshots taken every millisecond: `wait` returns only after the snapshot write in flight
/// at the end has committed (or failed), so that the removal leaves nothing behind (a
/// manifest committed after its parts were removed made every later `submit_or_resume` fail
/// with a missing part), and every round starts afresh with the exact value.
#[test]
fn finish_remove_and_start_again_leaves_no_snapshot_behind() {
    let (url, dir) = folder("finish-remove-loop");
    let mut short = Kernel::new(40_000, 4);
    short.spin = 100;
    let want = sequential(&short, CHUNKING).sum;
    for round in 0..10 {
        let e = exec(&url, 2)
            .snapshot_every(Duration::from_millis(1))
            .build()
            .unwrap();
        let h = e.submit_or_resume(short.clone()).unwrap();
        assert_eq!(h.resumed().map(|r| r.from), None, "round {round}");
        let fin = h.wait().unwrap().finished().unwrap();
        assert_eq!(fin.value.sum.to_bits(), want.to_bits(), "round {round}");
        e.remove_snapshots::<Kernel>().unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let store = BlockingStore::open(&url).unwrap();
        assert_eq!(store.latest("lifecycle").unwrap(), None, "round {round}");
    }
    let _ = std::fs::remove_dir_all(dir);
}
