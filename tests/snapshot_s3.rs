//! Snapshot, suspend and resume against a real S3 server (SeaweedFS on loopback, provisioned
//! by the test itself: see `tests/support/seaweed.rs`). Needs the feature `s3`; the README's
//! test command (`cargo test --all-features`) enables it.
#![cfg(feature = "s3")]

mod common;
mod support;

use std::time::Duration;

use common::{Kernel, sequential};
use malleable::{At, Chunking, Error, Executor, Outcome};
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
    // (A missing bucket cannot be shown here: this server creates buckets on first use.)
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
