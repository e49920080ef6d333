//! Snapshot, suspend and resume against a real S3 server (SeaweedFS on loopback, provisioned
//! by the test itself: see `tests/support/seaweed.rs`). Needs the feature `s3`; the README's
//! test command (`cargo test --all-features`) enables it.
#![cfg(feature = "s3")]

use crate::common;
use crate::support;

use std::time::Duration;

use common::{Kernel, sequential};
use malleable::{At, Chunking, Error, Executor, Outcome, snapshot};
use support::seaweed;

fn url(name: &str) -> String {
    format!(
        "s3://{}/restore-{name}-{}",
        seaweed::BUCKET,
        std::process::id()
    )
}

fn builder(server: &seaweed::Seaweed, url: &str, workers: usize) -> malleable::Builder {
    let mut b = Executor::builder()
        .local_workers(workers)
        .chunking(Chunking::Count(32))
        .snapshots(url);
    for (k, v) in server.options() {
        b = b.snapshot_option(k, v);
    }
    b
}

#[test]
fn suspend_to_s3_and_resume_with_other_worker_counts() {
    let server = seaweed::server();
    let url = url("suspend");
    let mut job = Kernel::new(6_000_000, 4);
    job.spin = 300;
    job.phases = 2;
    let handle = builder(server, &url, 2)
        .build()
        .unwrap()
        .submit(job.clone())
        .unwrap();
    std::thread::sleep(Duration::from_millis(40));
    let snap = handle.snapshot().wait().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let id = handle.suspend().wait().unwrap();
    assert!(id.epoch > snap.epoch);
    assert!(matches!(handle.wait().unwrap(), Outcome::Suspended(_)));
    let mut last = job.clone();
    last.phase = 1;
    let expected = sequential(&last, Chunking::Count(32));
    for (workers, at) in [(0, At::Latest), (3, At::Epoch(snap.epoch))] {
        let exec = builder(server, &url, workers).build().unwrap();
        let fin = exec
            .resume::<Kernel>(&url, at)
            .unwrap()
            .wait()
            .unwrap()
            .finished()
            .unwrap();
        assert_eq!(fin.value, expected, "{workers} workers from {at:?}");
    }
}

#[test]
fn wrong_credentials_fail_the_snapshot_not_the_job() {
    let server = seaweed::server();
    let url = url("creds");
    let mut b = Executor::builder()
        .local_workers(2)
        .chunking(Chunking::Count(16))
        .snapshots(&url);
    for (k, v) in server.options_with_keys(seaweed::ACCESS_KEY, "not-the-secret") {
        b = b.snapshot_option(k, v);
    }
    // Refused at build, with the store's answer as the cause.
    let refused = b.clone().build().unwrap_err();
    match &refused {
        Error::StoreUnusable {
            source: Some(cause),
            ..
        } if matches!(**cause, malleable::snapshot::Error::Denied { .. }) => {}
        other => panic!("expected a refused store at build, got {other:?}"),
    }
    assert!(
        refused.to_string().contains("check_store(false)"),
        "{refused}"
    );
    // Without the check: the snapshot fails, the job does not.
    let mut job = Kernel::new(20_000, 4);
    job.spin = 300;
    let handle = b
        .check_store(false)
        .build()
        .unwrap()
        .submit(job.clone())
        .unwrap();
    let err = handle.snapshot().wait().unwrap_err();
    assert!(
        matches!(&err, Error::SnapshotFailed(m) if m.contains("credentials")),
        "{err}"
    );
    let fin = handle.wait().unwrap().finished().unwrap();
    assert_eq!(fin.value, sequential(&job, Chunking::Count(16)));
}

#[test]
fn a_silent_endpoint_fails_the_build() {
    let server = seaweed::server();
    // An endpoint where nothing listens: given up after the check's time limit.
    let mut b = Executor::builder()
        .snapshots(url_for_silent())
        .store_check_timeout(Duration::from_secs(2));
    for (k, v) in server.options() {
        if k != "endpoint" {
            b = b.snapshot_option(k, v);
        }
    }
    let b = b.snapshot_option("endpoint", "http://127.0.0.1:1");
    let err = b.build().unwrap_err();
    assert!(
        matches!(&err, Error::StoreUnusable { within, .. } if *within == Duration::from_secs(2)),
        "{err:?}"
    );
}

fn url_for_silent() -> String {
    format!("s3://{}/silent", seaweed::BUCKET)
}

/// A bucket that does not exist: every snapshot fails with the server's `NoSuchBucket` in
/// its cause, on the handle too, the job goes on, and a resume says the store failed, never
/// "no snapshot".
#[test]
fn a_missing_bucket_reaches_the_handle_with_its_cause() {
    let server = seaweed::server();
    let url = format!("s3://no-such-bucket-{}/prefix", std::process::id());
    let mut job = Kernel::new(400_000, 4);
    job.spin = 300;
    // A missing bucket fails the build, with the server's answer as the cause.
    let refused = builder(server, &url, 2).build().unwrap_err();
    let Error::StoreUnusable {
        source: Some(answer),
        ..
    } = &refused
    else {
        panic!("expected a store that cannot be used, got {refused:?}");
    };
    assert!(format!("{answer:?}").contains("NoSuchBucket"), "{answer:?}");
    // Without the check, at every snapshot.
    let handle = builder(server, &url, 2)
        .check_store(false)
        .snapshot_every(Duration::from_millis(10))
        .build()
        .unwrap()
        .submit(job.clone())
        .unwrap();
    let err = handle.snapshot().wait().unwrap_err();
    let Error::SnapshotFailed(cause) = &err else {
        panic!("expected SnapshotFailed, got {err:?}");
    };
    assert!(
        matches!(
            cause.error(),
            Error::Snapshot(snapshot::Error::Store { op: "list", .. })
        ),
        "{:?}",
        cause.error()
    );
    assert!(cause.contains("NoSuchBucket"), "{}", &**cause);
    let started = std::time::Instant::now();
    while handle.snapshot_failures() < 2 {
        assert!(!handle.is_finished(), "the job ended first");
        assert!(started.elapsed() < Duration::from_secs(60), "no failure");
        std::thread::sleep(Duration::from_millis(5));
    }
    let last = handle.last_snapshot_error().expect("kept on the handle");
    assert!(last.contains("NoSuchBucket"), "{}", &*last);
    let watch = handle.clone();
    let fin = handle.wait().unwrap().finished().unwrap();
    assert_eq!(fin.value, sequential(&job, Chunking::Count(32)));
    assert!(watch.snapshot_failures() >= 2);

    let exec = builder(server, &url, 1).check_store(false).build().unwrap();
    for at in [At::Latest, At::Epoch(0)] {
        let err = exec.resume::<Kernel>(&url, at).unwrap_err();
        assert!(
            matches!(&err, Error::Snapshot(snapshot::Error::Store { .. })),
            "{at:?}: {err:?}"
        );
        let mut text = err.to_string();
        let mut next = std::error::Error::source(&err);
        while let Some(e) = next {
            text += &format!(": {e}");
            next = e.source();
        }
        assert!(text.contains("NoSuchBucket"), "{at:?}: {text}");
    }
}
