//! Snapshots, suspend and resume through the public API, on a local folder store.

use crate::common;

use std::time::Duration;

use common::{Kernel, sequential};
use malleable::{At, Chunking, Error, Executor, Outcome, SuspendToken};

fn folder(name: &str) -> (String, std::path::PathBuf) {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("snap-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    (format!("file://{}", dir.display()), dir)
}

fn slow_kernel(n: u64) -> Kernel {
    let mut job = Kernel::new(n, 4);
    job.spin = 400;
    job.phases = 2;
    job
}

#[test]
fn snapshot_mid_run_then_resume_elsewhere_gives_the_same_bits() {
    let (url, _dir) = folder("mid");
    let chunking = Chunking::Size(500);
    let job = slow_kernel(200_000);
    let exec = Executor::builder()
        .local_workers(2)
        .chunking(chunking)
        .snapshots(&url)
        .build()
        .unwrap();
    let handle = exec.submit(job.clone()).unwrap();
    std::thread::sleep(Duration::from_millis(30));
    let id = handle.snapshot().wait().unwrap();
    std::thread::sleep(Duration::from_millis(10));
    let id2 = handle.snapshot().wait().unwrap();
    assert!(id2.epoch > id.epoch);
    let finished = handle.wait().unwrap().finished().unwrap();
    let mut last = job.clone();
    last.phase = 1;
    assert_eq!(finished.value, sequential(&last, chunking));

    for workers in [0, 1, 3] {
        let other = Executor::builder().local_workers(workers).build().unwrap();
        let resumed = other
            .resume::<Kernel>(&url, At::Epoch(id.epoch))
            .unwrap()
            .wait()
            .unwrap()
            .finished()
            .unwrap();
        assert_eq!(
            resumed.value, finished.value,
            "resumed with {workers} workers"
        );
        assert_eq!(resumed.job.history, finished.job.history);
    }
}

#[test]
fn suspend_then_resume_with_another_worker_count() {
    let (url, _dir) = folder("suspend");
    let chunking = Chunking::Count(64);
    let job = slow_kernel(300_000);
    let exec = Executor::builder()
        .local_workers(2)
        .chunking(chunking)
        .snapshots(&url)
        .build()
        .unwrap();
    let handle = exec.submit(job.clone()).unwrap();
    std::thread::sleep(Duration::from_millis(40));
    let id = handle.suspend().wait().unwrap();
    match handle.wait().unwrap() {
        Outcome::Suspended(s) => assert_eq!(s, id),
        other => panic!(
            "expected a suspension, got {:?}",
            other.finished().map(|f| f.value)
        ),
    }
    // Resume inline, suspend again at once, resume with 3 threads.
    let inline = Executor::builder()
        .local_workers(0)
        .snapshots(&url)
        .build()
        .unwrap();
    let h = inline.resume::<Kernel>(&url, At::Latest).unwrap();
    let h2 = h.clone();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        h2.suspend().wait()
    });
    let second = h.wait().unwrap();
    let second_id = t.join().unwrap().unwrap();
    assert!(
        matches!(second, Outcome::Suspended(ref s) if *s == second_id),
        "{second_id}"
    );
    assert!(second_id.epoch > id.epoch);
    let three = Executor::builder().local_workers(3).build().unwrap();
    let fin = three
        .resume::<Kernel>(&url, At::Latest)
        .unwrap()
        .wait()
        .unwrap()
        .finished()
        .unwrap();
    let mut last = job.clone();
    last.phase = 1;
    assert_eq!(fin.value, sequential(&last, Chunking::Count(64)));
    let mut first = job.clone();
    first.phase = 0;
    assert_eq!(
        fin.job.history[0].to_bits(),
        sequential(&first, chunking).sum.to_bits()
    );
}

#[test]
fn a_suspend_token_suspends() {
    let (url, _dir) = folder("token");
    let token = SuspendToken::new();
    let exec = Executor::builder()
        .local_workers(2)
        .snapshots(&url)
        .suspend_token(&token)
        .build()
        .unwrap();
    let handle = exec.submit(slow_kernel(250_000)).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    token.suspend();
    assert!(matches!(handle.wait().unwrap(), Outcome::Suspended(_)));
}

#[test]
fn resume_of_nothing_or_another_job_is_a_typed_error() {
    let (url, _dir) = folder("none");
    let exec = Executor::builder().local_workers(1).build().unwrap();
    let err = exec.resume::<Kernel>(&url, At::Latest).unwrap_err();
    assert!(matches!(err, Error::Snapshot(_)), "{err:?}");
}

#[test]
fn unchanged_chunks_are_referenced_not_written_again() {
    let (url, dir) = folder("incremental");
    let exec = Executor::builder()
        .local_workers(2)
        .chunking(Chunking::Count(8))
        .snapshots(&url)
        .keep_snapshots(10)
        .build()
        .unwrap();
    let handle = exec.submit(slow_kernel(400_000)).unwrap();
    std::thread::sleep(Duration::from_millis(30));
    let first = handle.suspend().wait().unwrap();
    assert!(matches!(handle.wait().unwrap(), Outcome::Suspended(_)));
    // Resumed with zero workers and nobody waiting: nothing runs, every chunk is unchanged.
    let idle = Executor::builder().local_workers(0).build().unwrap();
    let h = idle.resume::<Kernel>(&url, At::Latest).unwrap();
    let second = h.snapshot().wait().unwrap();
    assert_eq!(second.epoch, first.epoch + 1);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = malleable::snapshot::Store::open(&url).unwrap();
    let (m1, m2) = (
        rt.block_on(store.manifest(&first)).unwrap(),
        rt.block_on(store.manifest(&second)).unwrap(),
    );
    assert!(!m1.parts.is_empty());
    assert_eq!(
        m1.parts, m2.parts,
        "the second snapshot references the first one's parts"
    );
    let epoch_dir = dir
        .join("test-kernel")
        .join(format!("{:020}", second.epoch));
    assert!(
        !epoch_dir.join("parts").exists(),
        "no part was written for the second epoch"
    );
    // Now let it run: the chunks change, and the next snapshot writes them anew.
    h.set_local_workers(2);
    std::thread::sleep(Duration::from_millis(30));
    let third = h.snapshot().wait().unwrap();
    let m3 = rt.block_on(store.manifest(&third)).unwrap();
    assert!(
        m3.parts
            .iter()
            .any(|p| p.key.contains(&format!("{:020}", third.epoch)))
    );
    h.cancel();
}
