//! Snapshots to an S3 endpoint nobody listens on (`http://127.0.0.1:1`): every failure is
//! visible, on the handle, in the metric and as a typed cause, and the job goes on (or ends,
//! when asked to, after `n` failures in a row). Needs the feature `s3` (no server: nothing
//! is reachable, on purpose).
#![cfg(feature = "s3")]

mod common;

use std::error::Error as StdError;
use std::time::{Duration, Instant};

use common::{Kernel, sequential};
use malleable::{Builder, Chunking, Error, Executor, snapshot};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

const CHUNKING: Chunking = Chunking::Count(16);

fn unreachable() -> Builder {
    [
        ("endpoint", "http://127.0.0.1:1"),
        ("allow_http", "true"),
        ("region", "us-east-1"),
        ("access_key_id", "key"),
        ("secret_access_key", "secret"),
        // Fail at the first refused connection, not after a minute of retries.
        ("max_retries", "0"),
    ]
    .into_iter()
    .fold(
        Executor::builder()
            .local_workers(2)
            .chunking(CHUNKING)
            // Unreachable from the start: without this, `build` refuses it (tested in
            // `snapshot_s3.rs`); here the failures are the snapshots'.
            .check_store(false)
            .snapshots("s3://bucket/prefix"),
        |b, (k, v)| b.snapshot_option(k, v),
    )
}

fn slow(n: u64) -> Kernel {
    let mut job = Kernel::new(n, 4);
    job.spin = 400;
    job
}

/// The one recorder of this test binary.
fn recorder() -> &'static Snapshotter {
    static SNAPSHOTTER: std::sync::OnceLock<Snapshotter> = std::sync::OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder.install().unwrap();
        snapshotter
    })
}

/// The failure counter of job `test-kernel`.
fn failures_counted(snapshotter: &Snapshotter) -> u64 {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| {
            let key = key.key();
            key.name() == malleable::metrics::SNAPSHOT_FAILURES
                && key
                    .labels()
                    .any(|l| l.key() == "job" && l.value() == "test-kernel")
        })
        .map(|(.., value)| match value {
            DebugValue::Counter(c) => c,
            other => panic!("not a counter: {other:?}"),
        })
        .sum()
}

/// Whether the chain of `e` holds the refused connection, as an `io::Error`.
fn refused(e: &(dyn StdError + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(e) = next {
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
        {
            return true;
        }
        next = e.source();
    }
    false
}

/// The cause of a failed snapshot: the store's error, with the refused connection under it.
fn assert_unreachable(cause: &malleable::Cause) {
    assert!(
        matches!(
            cause.error(),
            Error::Snapshot(snapshot::Error::Store { .. })
        ),
        "{:?}",
        cause.error()
    );
    assert!(refused(cause), "the refused connection is lost: {cause:?}");
}

#[test]
fn periodic_snapshots_to_an_unreachable_store_are_reported() {
    let snapshotter = recorder();
    let job = slow(1_000_000);
    let handle = unreachable()
        .snapshot_every(Duration::from_millis(10))
        .build()
        .unwrap()
        .submit(job.clone())
        .unwrap();

    // An explicit snapshot fails with the typed cause.
    let err = handle.snapshot().wait().unwrap_err();
    match &err {
        Error::SnapshotFailed(cause) => assert_unreachable(cause),
        other => panic!("expected SnapshotFailed, got {other:?}"),
    }
    assert_eq!(err.to_string(), "snapshot failed");

    // The periodic ones fail too, and say so.
    let started = Instant::now();
    while handle.snapshot_failures() < 4 {
        assert!(
            !handle.is_finished(),
            "the job ended after {} failures",
            handle.snapshot_failures()
        );
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no failure seen"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let watch = handle.clone();
    let fin = handle.wait().unwrap().finished().unwrap();
    assert_eq!(fin.value, sequential(&job, CHUNKING), "the job went on");
    let failed = watch.snapshot_failures();
    assert!(failed >= 4, "{failed}");
    assert_unreachable(&watch.last_snapshot_error().expect("the last error is kept"));
    // Counted: read after the handle, so a write that failed in between only adds.
    assert!(
        failures_counted(snapshotter) >= failed,
        "{} counted, {failed} failed",
        failures_counted(snapshotter)
    );
}

#[test]
fn an_unreachable_store_ends_the_job_when_asked_to() {
    recorder();
    let handle = unreachable()
        .snapshot_every(Duration::from_millis(10))
        .max_snapshot_failures(2)
        .build()
        .unwrap()
        .submit(slow(3_000_000))
        .unwrap();
    let err = handle.wait().map(|_| ()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "job test-kernel ended after 2 snapshots in a row failed"
    );
    match &err {
        Error::SnapshotsFailing {
            failures: 2,
            last_committed: None,
            last,
            ..
        } => assert_unreachable(last),
        other => panic!("expected SnapshotsFailing, got {other:?}"),
    }
}

/// The store options of an endpoint nobody listens on, failing at the first refusal.
const UNREACHABLE: [(&str, &str); 6] = [
    ("endpoint", "http://127.0.0.1:1"),
    ("allow_http", "true"),
    ("region", "us-east-1"),
    ("access_key_id", "key"),
    ("secret_access_key", "secret"),
    ("max_retries", "0"),
];

/// How often `needle` occurs in `text`.
fn count(text: &str, needle: &str) -> usize {
    text.matches(needle).count()
}

/// An endpoint that refuses connections: the error keeps every cause (the refused
/// connection is in its chain), and printed as a chain it says each thing once. (Each level
/// of `object_store`'s error printed the level below, so the refusal read three times.)
#[tokio::test]
async fn an_unreachable_endpoint_is_reported_once() {
    let options = UNREACHABLE.map(|(k, v)| (k.to_owned(), v.to_owned()));
    let store = snapshot::Store::open_with("s3://bucket/prefix", options).unwrap();
    let e = store.jobs().await.unwrap_err();
    assert!(matches!(e, snapshot::Error::Store { .. }), "{e:?}");
    assert!(refused(&e), "the refused connection is lost: {e:?}");
    for text in [
        malleable::error_chain(&e),
        malleable::error_chain(&Error::Snapshot(e)),
    ] {
        assert_eq!(count(&text, "error sending request"), 1, "{text}");
        assert_eq!(count(&text, "127.0.0.1:1"), 1, "{text}");
        assert!(
            text.starts_with("object store list of \"\" failed: "),
            "{text}"
        );
    }
}

/// The same through the `snapshots` command: one line, each thing once.
#[cfg(feature = "cli")]
#[test]
fn the_cli_reports_an_unreachable_endpoint_once() {
    let mut args = vec!["ls".to_owned(), "s3://bucket/prefix".to_owned()];
    for (k, v) in UNREACHABLE {
        args.extend(["-o".to_owned(), format!("{k}={v}")]);
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_snapshots"))
        .args(&args)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert_eq!(count(&err, "error sending request"), 1, "{err}");
    assert_eq!(count(&err, "127.0.0.1:1"), 1, "{err}");
}
