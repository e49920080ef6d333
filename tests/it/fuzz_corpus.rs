//! Replays every file of `fuzz/corpus/*` through the decoders the fuzz targets exercise, as a
//! normal test: no input may panic, and the valid seeds (`valid-*`) must decode.
//!
//! Targets: `manifest` and `part` (snapshot files), `frame` (the cluster's messages in both
//! directions, and the length-delimited framing), `handshake` (the handshake's five
//! decoders) and `peer` (the handshake and messages of the links between worker processes,
//! protocol 20). The checks are `fuzz/checks.rs`, shared with the fuzz targets.
//!
//! The hand-made seeds (`seed-*` and `valid-*`) are written by [`seeds`]; regenerate them
//! after a format change with
//! `cargo test --all-features --test it fuzz_corpus::write_seeds -- --ignored`
//! ([`seeds_are_current`] fails until then). Other files are inputs the fuzzer found, e.g. with
//! `cd fuzz && cargo fuzz run -s none frame -- -max_total_time=300` (then
//! `cargo fuzz cmin -s none frame` if the corpus grows large).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use malleable::Layout;
use malleable::cluster::frame::{self, Failure, PROTOCOL_VERSION, ToCoordinator, ToWorker, encode};
use malleable::cluster::handshake::{Hello, JobType, ProofMsg, Refusal, Reply, WorkerLayout};
use malleable::cluster::peer::{
    FromPeer, PeerHello, PeerProof, PeerRefusal, PeerReply, SharedAt, ToPeer,
};
use malleable::snapshot::{Dimension, FORMAT_VERSION, MAGIC, Manifest, PartRef, encode_manifest};

#[path = "../../fuzz/checks.rs"]
mod checks;

use checks::{
    LIMIT, frame_target, framed, handshake_target, manifest_target, part_target, peer_target,
    versioned, versioned_as,
};

fn corpus(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target)
}

fn replay(target: &str, run: fn(&[u8]) -> bool) -> usize {
    let dir = corpus(target);
    let mut files = 0;
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let result = std::panic::catch_unwind(|| run(&data));
        match result {
            Ok(ok) => assert!(
                ok || !name.starts_with("valid-"),
                "{target}/{name} is a valid seed but does not decode"
            ),
            Err(_) => panic!("{target}/{name} panicked"),
        }
        files += 1;
    }
    files
}

#[test]
fn manifest_corpus_never_panics() {
    assert!(replay("manifest", manifest_target) >= 10);
}

#[test]
fn part_corpus_never_panics() {
    assert!(replay("part", part_target) >= 5);
}

#[test]
fn frame_corpus_never_panics() {
    assert!(replay("frame", frame_target) >= 10);
}

#[test]
fn handshake_corpus_never_panics() {
    assert!(replay("handshake", handshake_target) >= 10);
}

#[test]
fn peer_corpus_never_panics() {
    assert!(replay("peer", peer_target) >= 10);
}

fn manifest(chunks: u64, done: u64, parts: u64, blob: usize) -> Manifest {
    Manifest {
        format_version: FORMAT_VERSION,
        job_name: "kmeans".to_owned(),
        job_id: "run-2026-11-22".to_owned(),
        epoch: 7,
        created_unix_ms: 1_795_000_000_000,
        job: (0..blob).map(|i| i as u8).collect(),
        phase: 2,
        iterations_before: 2_000_000,
        iterations_done: 400_000,
        iterations_total: 1_000_000,
        chunks,
        config: vec![1, 0, 64],
        merged: 1.min(chunks),
        reduced: 3.25f64.to_le_bytes().to_vec(),
        done: (0..done).map(|i| (1 + i, vec![i as u8; 8])).collect(),
        parts: (0..parts)
            .map(|i| PartRef {
                chunk: 1 + done + i,
                key: format!(
                    "run-2026-11-22/00000000000000000007/parts/2-{}-{i:016x}",
                    1 + done + i
                ),
                size: 100 + i,
                crc32c: 0x1234_5678 ^ i as u32,
            })
            .collect(),
        // The owned partitions of the done chunks.
        kept: (0..done)
            .map(|i| PartRef {
                chunk: 1 + i,
                key: format!("run-2026-11-22/00000000000000000007/parts/2-{}-kept", 1 + i),
                size: 1000 + i,
                crc32c: 0x8765_4321 ^ i as u32,
            })
            .collect(),
        job_version: 1,
        layout: Some(Layout::from_entries(vec![
            "job: KMeans".to_owned(),
            "chunk: KMeansChunk".to_owned(),
            "output: Vec<f64>".to_owned(),
            "KMeans.k: u64".to_owned(),
            "KMeansChunk.next: u64".to_owned(),
        ])),
        submitted: Some((0..blob).map(|i| (i * 3) as u8).collect()),
        shape: vec![Dimension {
            what: "width (cells per row)".to_owned(),
            value: 64,
        }],
    }
}

fn part_input(size: u64, crc: u32, bytes: &[u8]) -> Vec<u8> {
    let mut out = size.to_le_bytes().to_vec();
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(bytes);
    out
}

/// Frames for a stream: each with its 4-byte big-endian length.
fn stream(frames: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for f in frames {
        out.extend_from_slice(&(f.len() as u32).to_be_bytes());
        out.extend_from_slice(f);
    }
    out
}

fn nonce(seed: u8) -> [u8; 32] {
    std::array::from_fn(|i| seed.wrapping_mul(31).wrapping_add(i as u8))
}

/// Every message to a worker, one per variant (two for `Run`).
fn to_worker_messages() -> Vec<(&'static str, ToWorker)> {
    let mut all = to_worker_messages_alone();
    let batch = all.iter().take(3).map(|(_, m)| m.clone()).collect();
    all.push(("batch", ToWorker::Batch(batch)));
    all
}

/// Every message to a worker but a batch.
fn to_worker_messages_alone() -> Vec<(&'static str, ToWorker)> {
    vec![
        (
            "phase",
            ToWorker::Phase {
                phase: 3,
                chunks: 32,
                job: Bytes::from_static(b"\x02\x10job value"),
            },
        ),
        (
            "run-fresh",
            ToWorker::Run {
                slot: 1,
                chunk: 17,
                start: 1_000,
                end: 2_000,
                state: None,
                held: false,
                then: Vec::new(),
            },
        ),
        (
            "run-held",
            ToWorker::Run {
                slot: 1,
                chunk: 16,
                start: 0,
                end: 1_000,
                state: None,
                held: true,
                then: vec![(3, 6, 8), (4, 8, 10)],
            },
        ),
        ("recall", ToWorker::Recall { slot: 2 }),
        (
            "begin",
            ToWorker::Begin {
                chunk: 16,
                halos: vec![(15, frame::Halo::Sent(Bytes::from_static(b"\x03a halo")))],
            },
        ),
        (
            "begin-kept",
            ToWorker::Begin {
                chunk: 17,
                halos: vec![
                    (16, frame::Halo::Kept),
                    (18, frame::Halo::Sent(Bytes::from_static(b"\x01h"))),
                ],
            },
        ),
        ("surrender", ToWorker::Surrender { chunk: 16 }),
        ("abandon", ToWorker::Abandon { slot: 2, chunk: 18 }),
        (
            "output",
            ToWorker::Output {
                chunk: 16,
                phase: 9,
            },
        ),
        (
            "place",
            ToWorker::Place {
                chunk: 14,
                state: Bytes::from_static(b"\x05state"),
                export: None,
            },
        ),
        (
            "place-part",
            ToWorker::PlacePart {
                chunk: 14,
                part: malleable::snapshot::PartRef {
                    chunk: 14,
                    key: "job/00000000000000000003/parts/2-14-00000000000000ab".to_owned(),
                    size: 4096,
                    crc32c: 0x1234_5678,
                },
                export: Some(3),
            },
        ),
        (
            "capture-held",
            ToWorker::CaptureHeld {
                chunk: 15,
                folder: 13,
            },
        ),
        (
            "piece",
            ToWorker::Piece {
                more: true,
                bytes: Bytes::from_static(b"\x00\x01\x02"),
            },
        ),
        (
            "run-restored",
            ToWorker::Run {
                slot: 0,
                chunk: 18,
                start: 2_000,
                end: u64::MAX,
                state: Some(Bytes::from_static(b"\x05a chunk state")),
                held: false,
                then: Vec::new(),
            },
        ),
        ("interrupt", ToWorker::Interrupt { slot: 2, chunk: 19 }),
        (
            "capture",
            ToWorker::Capture {
                slot: u32::MAX,
                chunk: 300,
                folder: 7,
            },
        ),
        ("release", ToWorker::Release { slot: 3 }),
        (
            "store",
            ToWorker::Store {
                url: "s3://bucket/prefix".to_owned(),
                options: vec![("endpoint".to_owned(), "http://127.0.0.1:8333".to_owned())],
                job_id: "kmeans".to_owned(),
                epoch: 12,
                created_unix_ms: 1_790_000_000_000,
            },
        ),
        ("heartbeat", ToWorker::Heartbeat),
        ("end", ToWorker::End),
        (
            "peers",
            ToWorker::Peers {
                me: 3,
                session: [9; 16],
                generation: 2,
                addrs: vec![(1, "127.0.0.1:40001".into()), (4, "[::1]:40004".into())],
                holders: vec![(7, Some(1)), (8, None)],
            },
        ),
        (
            "copy",
            ToWorker::Copy {
                phase: 19,
                generation: 2,
                buddy: 4,
                addr: "10.0.0.4:40004".into(),
                chunks: vec![0, 1, 7],
            },
        ),
        ("logs", ToWorker::Logs { from: 18 }),
        (
            "drop-copies",
            ToWorker::DropCopies {
                chunks: vec![3, 9],
                before: 40,
            },
        ),
        (
            "gathered",
            ToWorker::Gathered {
                pieces: vec![
                    (0, Some(Bytes::from_static(b"\x02\x01\x02"))),
                    (3, None),
                    (5, Some(Bytes::from_static(b"\x01\x07"))),
                ],
            },
        ),
        (
            "begin-gathered",
            ToWorker::Begin {
                chunk: 5,
                halos: vec![
                    (0, frame::Halo::Gathered),
                    (4, frame::Halo::Sent(Bytes::from_static(b"\x01h"))),
                    (5, frame::Halo::Gathered),
                ],
            },
        ),
    ]
}

/// Every message to the coordinator, one per variant (two for `Heartbeat`).
fn to_coordinator_messages() -> Vec<(&'static str, ToCoordinator)> {
    let mut all = to_coordinator_messages_alone();
    let batch = all.iter().take(2).map(|(_, m)| m.clone()).collect();
    all.push(("batch", ToCoordinator::Batch(batch)));
    all
}

/// Every message to the coordinator but a batch.
fn to_coordinator_messages_alone() -> Vec<(&'static str, ToCoordinator)> {
    vec![
        (
            "done",
            ToCoordinator::Done {
                slot: 1,
                chunk: 17,
                output: Bytes::from_static(b"\x08an output"),
                halos: None,
                iterations: 1_000,
                busy_ns: 12_345_678,
            },
        ),
        (
            "done-kept",
            ToCoordinator::Done {
                slot: 0,
                chunk: 16,
                output: Bytes::from_static(b"\x08an output"),
                halos: Some(vec![
                    (Some(15), frame::Halo::Sent(Bytes::from_static(b"\x01u"))),
                    (Some(17), frame::Halo::Kept),
                ]),
                iterations: 1_000,
                busy_ns: 5,
            },
        ),
        (
            "surrendered",
            ToCoordinator::Surrendered {
                chunk: 16,
                state: Bytes::from_static(b"\x09a partition"),
            },
        ),
        (
            "captured-held",
            ToCoordinator::CapturedHeld {
                chunk: 15,
                state: Bytes::from_static(b"\x09a partition"),
            },
        ),
        (
            "captured-held-part",
            ToCoordinator::CapturedHeldPart {
                chunk: 15,
                part: malleable::snapshot::PartRef {
                    chunk: 15,
                    key: "kmeans/00000000000000000013/parts/2-15-00000000cafef00d".to_owned(),
                    size: 1 << 20,
                    crc32c: 0x9abc_def0,
                },
            },
        ),
        ("missing", ToCoordinator::Missing { chunk: 14 }),
        (
            "failed-held",
            ToCoordinator::FailedHeld {
                chunk: 14,
                failure: Failure::Panicked {
                    input: false,
                    message: "begin_phase panicked".to_owned(),
                },
            },
        ),
        (
            "piece",
            ToCoordinator::Piece {
                more: false,
                bytes: Bytes::from_static(b"\x00"),
            },
        ),
        (
            "yielded",
            ToCoordinator::Yielded {
                slot: 0,
                chunk: 18,
                state: Bytes::from_static(b"\x05a chunk state"),
                iterations: 250,
                busy_ns: 999,
            },
        ),
        (
            "captured",
            ToCoordinator::Captured {
                slot: 2,
                chunk: 19,
                state: Bytes::new(),
            },
        ),
        (
            "captured-part",
            ToCoordinator::CapturedPart {
                slot: 1,
                chunk: 19,
                part: malleable::snapshot::PartRef {
                    chunk: 19,
                    key: "kmeans/00000000000000000013/parts/0-19-00000000deadbeef".to_owned(),
                    size: 4096,
                    crc32c: 0x1234_5678,
                },
            },
        ),
        (
            "failed",
            ToCoordinator::Failed {
                slot: 3,
                chunk: 20,
                failure: Failure::Panicked {
                    input: false,
                    message: "index out of bounds (é)".to_owned(),
                },
            },
        ),
        (
            "failed-input",
            ToCoordinator::Failed {
                slot: 0,
                chunk: 0,
                failure: Failure::Input {
                    chain: vec!["no such file".to_owned(), "os error 2".to_owned()],
                },
            },
        ),
        (
            "failed-codec",
            ToCoordinator::Failed {
                slot: 1,
                chunk: 7,
                failure: Failure::Codec {
                    what: "a chunk state".to_owned(),
                    error: postcard::Error::DeserializeUnexpectedEnd,
                },
            },
        ),
        (
            "exported",
            ToCoordinator::Exported {
                chunk: 14,
                halos: vec![
                    (Some(13), frame::Halo::Sent(Bytes::from_static(b"\x02up"))),
                    (Some(15), frame::Halo::Sent(Bytes::from_static(b"\x04down"))),
                ],
                placement: 3,
            },
        ),
        ("abandoned", ToCoordinator::Abandoned { slot: 2, chunk: 18 }),
        (
            "returned",
            ToCoordinator::Returned {
                slot: 2,
                chunks: vec![19, 20],
            },
        ),
        ("output-done", ToCoordinator::OutputDone { chunk: 16 }),
        (
            "failed-held-output",
            ToCoordinator::FailedHeld {
                chunk: 16,
                failure: Failure::Output {
                    phase: 9,
                    chain: vec!["cannot write heat-9.png".to_owned(), "disk full".to_owned()],
                },
            },
        ),
        (
            "released",
            ToCoordinator::Released {
                chunk: 15,
                phase: 7,
                halos: vec![(14, frame::Halo::Sent(Bytes::from_static(b"\x02up")))],
            },
        ),
        (
            "failed-held-store",
            ToCoordinator::FailedHeld {
                chunk: 14,
                failure: Failure::Store {
                    chain: vec!["get of part x failed".to_owned(), "not found".to_owned()],
                },
            },
        ),
        (
            "heartbeat",
            ToCoordinator::Heartbeat {
                progress: vec![0, 1, 127, 128, 16_384, u64::MAX],
            },
        ),
        (
            "heartbeat-idle",
            ToCoordinator::Heartbeat { progress: vec![] },
        ),
        ("leave", ToCoordinator::Leave { grace_ms: None }),
        (
            "listening",
            ToCoordinator::Listening {
                addr: "10.0.0.7:40007".into(),
            },
        ),
        (
            "unreachable",
            ToCoordinator::Unreachable {
                process: 4,
                reason: "connection refused".into(),
            },
        ),
        (
            "copied",
            ToCoordinator::Copied {
                phase: 19,
                generation: 2,
                buddy: 4,
                copied: vec![(0, 4096), (7, 1 << 33)],
                refused: vec![1],
                log_bytes: 1 << 20,
            },
        ),
        (
            "done-kept-at",
            ToCoordinator::Done {
                slot: 1,
                chunk: 15,
                output: Bytes::from_static(b"\x01"),
                halos: Some(vec![
                    (Some(14), frame::Halo::Kept),
                    (Some(16), frame::Halo::KeptAt(4)),
                ]),
                iterations: 8,
                busy_ns: 1000,
            },
        ),
        (
            "log-of",
            ToCoordinator::LogOf {
                chunk: 9,
                records: vec![
                    (
                        3,
                        9,
                        vec![(Some(8), Bytes::from_static(b"up")), (None, Bytes::new())],
                    ),
                    (4, 9, vec![]),
                ],
            },
        ),
        (
            "replayed",
            ToCoordinator::Replayed {
                attempt: 2,
                chunk: 9,
                copy_phase: 6,
                halos: vec![(Some(8), Bytes::from_static(b"up")), (None, Bytes::new())],
            },
        ),
        (
            "leave-grace",
            ToCoordinator::Leave {
                grace_ms: Some(5_000),
            },
        ),
        (
            "undecodable",
            ToCoordinator::Undecodable {
                what: "the job value".to_owned(),
                error: postcard::Error::DeserializeUnexpectedEnd,
            },
        ),
    ]
}

fn a_hello(jobs: &[&str]) -> Hello {
    Hello {
        jobs: jobs
            .iter()
            .enumerate()
            .map(|(i, &j)| JobType {
                name: j.to_owned(),
                version: 1,
                // One traced layout, one not.
                layout: (i % 2 == 0).then_some(malleable::Fingerprint(0x0123_4567_89ab_cdef)),
            })
            .collect(),
        threads: 8,
        node: "node-7".to_owned(),
        nonce: nonce(1),
    }
}

/// Every reply, one per variant and refusal.
fn replies() -> Vec<(&'static str, Reply)> {
    vec![
        (
            "challenge",
            Reply::Challenge {
                nonce: nonce(2),
                proof: nonce(3),
            },
        ),
        (
            "welcome",
            Reply::Welcome {
                job: "kmeans".to_owned(),
                version: 3,
                heartbeat_ms: 500,
                lease_ms: 5_000,
            },
        ),
        ("refused-auth", Reply::Refused(Refusal::Auth)),
        (
            "refused-unknown-job",
            Reply::Refused(Refusal::UnknownJob {
                running: vec!["kmeans".to_owned(), "pagerank".to_owned()],
            }),
        ),
        ("refused-version", Reply::Refused(Refusal::Version)),
        (
            "refused-job-ended",
            Reply::Refused(Refusal::JobEnded {
                job: "kmeans".to_owned(),
            }),
        ),
        (
            "refused-job-version",
            Reply::Refused(Refusal::JobVersion {
                job: "kmeans".to_owned(),
                version: 2,
            }),
        ),
        (
            "refused-job-layout",
            Reply::Refused(Refusal::Layout {
                job: "kmeans".to_owned(),
                version: 2,
                entries: vec!["job: Kmeans".to_owned(), "Kmeans.k: u64".to_owned()],
            }),
        ),
    ]
}

/// The hand-made seeds: `(target, file name, bytes)`.
fn seeds() -> BTreeMap<(&'static str, String), Vec<u8>> {
    let mut seeds = BTreeMap::new();
    let typical = encode_manifest(&manifest(10, 2, 3, 16));
    let mut m = |name: &str, bytes| seeds.insert(("manifest", name.to_owned()), bytes);
    m("valid-empty", encode_manifest(&manifest(0, 0, 0, 0)));
    m("valid-typical", typical.clone());
    m("valid-large", encode_manifest(&manifest(200, 40, 60, 1024)));
    m("seed-empty-input", vec![]);
    m("seed-magic-only", MAGIC.to_vec());
    m("seed-bad-magic", b"MLBLSNAQ\x01\x00\x00\x00".to_vec());
    m("seed-truncated-header", typical[..16].to_vec());
    m("seed-truncated-body", typical[..typical.len() - 5].to_vec());
    let mut v = typical.clone();
    v[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
    m("seed-version-next", v);
    // A later format: its version damaged (the checksum fails), or genuine (it verifies).
    let typical_body = postcard::to_allocvec(&manifest(10, 2, 3, 16)).unwrap();
    m(
        "seed-version-next-verified",
        framed(FORMAT_VERSION + 1, &typical_body),
    );
    let mut v = typical.clone();
    v[8..12].copy_from_slice(&1u32.to_le_bytes());
    m("seed-version-1", v);
    // A manifest of format 3, as the builds before format 4 wrote it (the checksum covers
    // the body only): still read.
    let v3 = Manifest {
        format_version: 3,
        layout: None,
        submitted: None,
        shape: Vec::new(),
        ..manifest(10, 2, 3, 16)
    };
    let mut v3_body = postcard::to_allocvec(&v3).unwrap();
    // Format 3 had no `layout`, `submitted` or `shape` (the last fields): drop their `None`,
    // `None` and empty list, a 0 byte each.
    assert_eq!(v3_body.split_off(v3_body.len() - 3), [0, 0, 0]);
    m("valid-format-3-typical", framed(3, &v3_body));
    // One of format 5: with a layout, without `submitted` and `shape`.
    let v5 = Manifest {
        format_version: 5,
        submitted: None,
        shape: Vec::new(),
        ..manifest(10, 2, 3, 16)
    };
    let mut v5_body = postcard::to_allocvec(&v5).unwrap();
    assert_eq!(v5_body.split_off(v5_body.len() - 2), [0, 0]);
    m("valid-format-5-typical", framed(5, &v5_body));
    // And one without the layout, the submitted job or the shape, as this format writes for
    // a manifest made by hand.
    m(
        "valid-no-layout",
        encode_manifest(&Manifest {
            layout: None,
            submitted: None,
            shape: Vec::new(),
            ..manifest(10, 2, 3, 16)
        }),
    );
    let mut v = typical.clone();
    let last = v.len() - 1;
    v[last] ^= 0x55;
    m("seed-bad-checksum", v);
    let mut v = typical.clone();
    v.push(0);
    m("seed-trailing-byte", v);
    let mut v = typical.clone();
    v[12..20].copy_from_slice(&u64::MAX.to_le_bytes());
    m("seed-huge-length", v);
    m("seed-undecodable-body", framed(FORMAT_VERSION, &[0xff; 12]));
    let body = postcard::to_allocvec(&manifest(10, 2, 3, 16)).unwrap();
    let mut extra = body.clone();
    extra.push(0);
    m("seed-body-trailing", framed(FORMAT_VERSION, &extra));
    let mut bad = manifest(10, 2, 3, 16);
    bad.merged = 11;
    m("seed-merged-past-end", encode_manifest(&bad));
    let mut bad = manifest(10, 2, 3, 16);
    bad.parts[0].chunk = 1;
    m("seed-chunk-twice", encode_manifest(&bad));
    let mut bad = manifest(10, 2, 3, 16);
    bad.done[0].0 = 0;
    m("seed-merged-chunk-done", encode_manifest(&bad));
    let mut bad = manifest(10, 2, 3, 16);
    bad.format_version = 9;
    m("seed-body-version", encode_manifest(&bad));
    // A kept partition of a chunk that is not done, and one kept twice.
    let mut bad = manifest(10, 2, 3, 16);
    bad.kept[0].chunk = 9;
    m("seed-kept-not-done", encode_manifest(&bad));
    let mut bad = manifest(10, 2, 3, 16);
    bad.kept[1].chunk = bad.kept[0].chunk;
    m("seed-kept-twice", encode_manifest(&bad));
    // Bodies for the target to frame (a leading 0 byte).
    let body_of = |m: &Manifest| [&[0u8][..], &postcard::to_allocvec(m).unwrap()].concat();
    m("valid-body-typical", body_of(&manifest(10, 2, 3, 16)));
    m("valid-body-empty", body_of(&manifest(0, 0, 0, 0)));
    let mut bad = manifest(10, 2, 3, 16);
    bad.iterations_done = bad.iterations_total + 1;
    m("seed-body-progress", body_of(&bad));

    let data = b"a suspended chunk state, in postcard";
    let crc = crc32c::crc32c(data);
    let mut p = |name: &str, bytes| seeds.insert(("part", name.to_owned()), bytes);
    p("valid-empty", part_input(0, 0, &[]));
    p("valid-state", part_input(data.len() as u64, crc, data));
    p("seed-short", vec![1, 2, 3]);
    p(
        "seed-wrong-size",
        part_input(data.len() as u64 + 1, crc, data),
    );
    p(
        "seed-wrong-crc",
        part_input(data.len() as u64, crc ^ 1, data),
    );
    p("seed-huge-size", part_input(u64::MAX, crc, data));
    // Messages, both directions; streams of frames as a worker sends them to the coordinator.
    let mut f = |name: &str, bytes| seeds.insert(("frame", name.to_owned()), bytes);
    for (name, message) in to_worker_messages() {
        f(&format!("valid-worker-{name}"), encode(&message).to_vec());
    }
    for (name, message) in to_coordinator_messages() {
        f(
            &format!("valid-coordinator-{name}"),
            encode(&message).to_vec(),
        );
    }
    let hello = versioned(&a_hello(&["kmeans"]));
    let heartbeat = encode(&ToCoordinator::Heartbeat { progress: vec![5] });
    let done = encode(&to_coordinator_messages()[0].1);
    let leave = encode(&ToCoordinator::Leave { grace_ms: None });
    f(
        "valid-stream-session",
        stream(&[&hello, &heartbeat, &done, &leave]),
    );
    f(
        "valid-stream-empty-frame-then-leave",
        stream(&[&[], &leave]),
    );
    let at_limit = encode(&ToCoordinator::Captured {
        slot: 0,
        chunk: 1,
        state: Bytes::from(vec![7; LIMIT - 5]),
    });
    assert_eq!(at_limit.len(), LIMIT);
    f("valid-stream-at-limit", stream(&[&at_limit]));
    f("seed-empty-input", vec![]);
    f("seed-unknown-variant", vec![0x7f]);
    f("seed-varint-overflow", [&[1u8][..], &[0x80; 11]].concat());
    let run = encode(&to_worker_messages()[2].1);
    f("seed-truncated-run", run[..run.len() - 3].to_vec());
    f("seed-trailing-byte", [&leave[..], &[0]].concat());
    // `Failed` (variant 4) of a panic (variant 0) whose message is not UTF-8.
    f("seed-not-utf8", vec![4, 0, 5, 0, 0, 2, 0xff, 0xfe]);
    // `Heartbeat` (variant 5) announcing u64::MAX entries; `Phase` (variant 0) announcing a
    // job of u64::MAX bytes.
    let huge = [&[0xffu8; 9][..], &[0x01]].concat();
    f("seed-huge-progress", [&[5u8][..], &huge].concat());
    f("seed-huge-job", [&[0u8, 1][..], &huge, b"xy"].concat());
    // Frames: one byte over the limit, a length of u32::MAX, a frame cut short, a length cut
    // short, and first frames of another protocol or version.
    let mut over = stream(&[&vec![0; LIMIT + 1]]);
    over.truncate(64);
    f("seed-stream-over-limit", over);
    f(
        "seed-stream-length-max",
        [&u32::MAX.to_be_bytes()[..], &leave].concat(),
    );
    let cut = stream(&[&hello]);
    f("seed-stream-truncated-frame", cut[..cut.len() - 2].to_vec());
    f("seed-stream-truncated-length", vec![0, 0]);
    f(
        "seed-stream-wrong-magic",
        // A frame of 256 bytes or more: a shorter one, read whole as a message to a worker,
        // is a valid `Phase` (variant 0, phase 0, 0 chunks, the job value's length the
        // frame's last length byte, which counts exactly the bytes that follow).
        stream(&[&versioned_as(
            b"MALLEABX",
            PROTOCOL_VERSION,
            &a_hello(&["kmeans"; 24]),
        )]),
    );
    f(
        "seed-stream-wrong-version",
        // 256 bytes or more, as above.
        stream(&[&versioned_as(
            &frame::MAGIC,
            PROTOCOL_VERSION + 1,
            &a_hello(&["kmeans"; 24]),
        )]),
    );

    let mut h = |name: &str, bytes| seeds.insert(("handshake", name.to_owned()), bytes);
    h("valid-hello", versioned(&a_hello(&["kmeans", "pagerank"])));
    h("valid-hello-no-jobs", versioned(&a_hello(&[])));
    for (name, reply) in replies() {
        h(&format!("valid-reply-{name}"), versioned(&reply));
        h(&format!("valid-welcome-{name}"), encode(&reply).to_vec());
    }
    h(
        "valid-proof",
        encode(&ProofMsg { proof: nonce(4) }).to_vec(),
    );
    h(
        "valid-worker-layout",
        encode(&WorkerLayout {
            entries: vec!["job: Kmeans".to_owned(), "Kmeans.k: u32".to_owned()],
        })
        .to_vec(),
    );
    h("seed-empty-input", vec![]);
    h("seed-magic-only", frame::MAGIC.to_vec());
    h(
        "seed-truncated-version",
        [&frame::MAGIC[..], &[0, 0]].concat(),
    );
    h(
        "seed-wrong-magic",
        versioned_as(b"MALLEABX", PROTOCOL_VERSION, &a_hello(&["kmeans"])),
    );
    h(
        "seed-wrong-version",
        versioned_as(&frame::MAGIC, PROTOCOL_VERSION + 1, &a_hello(&["kmeans"])),
    );
    h(
        "seed-version-0",
        versioned_as(&frame::MAGIC, 0, &Reply::Refused(Refusal::Version)),
    );
    let full = versioned(&a_hello(&["kmeans"]));
    h("seed-truncated-hello", full[..full.len() - 4].to_vec());
    h("seed-hello-trailing-byte", [&full[..], &[0]].concat());
    h(
        "seed-huge-job-count",
        [&full[..12], &[0xff; 9], &[0x01]].concat(),
    );
    h("seed-proof-short", vec![9; 31]);
    h("seed-proof-long", vec![9; 33]);
    // `Welcome` (variant 1) whose job name is not UTF-8; an unknown refusal (variant 6).
    h("seed-welcome-not-utf8", vec![1, 2, 0xc3, 0x28, 1, 1, 1]);
    h("seed-unknown-refusal", vec![2, 6]);
    h(
        "seed-http-request",
        b"GET / HTTP/1.1\r\nHost: 198.51.100.7\r\n\r\n".to_vec(),
    );

    peer_seeds(&mut seeds);
    seeds
}

/// A halo of `len` bytes.
fn a_halo(seq: u64, len: usize) -> ToPeer {
    ToPeer::Halo {
        seq,
        generation: 2,
        phase: 41,
        from: 17,
        to: 18,
        bytes: (0..len).map(|i| (i * 13) as u8).collect::<Vec<u8>>().into(),
    }
}

/// The seeds of the `peer` target: every message of the handshake between worker processes
/// and of the links after it, a link's frames as a stream, and hostile inputs.
fn peer_seeds(seeds: &mut BTreeMap<(&'static str, String), Vec<u8>>) {
    let mut p = |name: &str, bytes| seeds.insert(("peer", name.to_owned()), bytes);
    let hello = PeerHello {
        session: [0xa5; 16],
        from: 300,
        nonce: nonce(5),
    };
    p("valid-hello", versioned(&hello));
    let replies = [
        (
            "challenge",
            PeerReply::Challenge {
                nonce: nonce(6),
                proof: nonce(7),
            },
        ),
        ("welcome", PeerReply::Welcome),
        ("refused-version", PeerReply::Refused(PeerRefusal::Version)),
        ("refused-auth", PeerReply::Refused(PeerRefusal::Auth)),
        (
            "refused-session",
            PeerReply::Refused(PeerRefusal::Session {
                session: [0x5a; 16],
            }),
        ),
    ];
    for (name, reply) in &replies {
        p(&format!("valid-reply-{name}"), versioned(reply));
        p(&format!("valid-welcome-{name}"), encode(reply).to_vec());
    }
    let proof = encode(&PeerProof { proof: nonce(8) });
    p("valid-proof", proof.to_vec());
    let to_peer = [
        ("halo", a_halo(1, 24)),
        ("halo-empty", a_halo(u64::MAX, 0)),
        ("heartbeat", ToPeer::Heartbeat),
        (
            "copy",
            ToPeer::Copy {
                seq: 3,
                generation: 2,
                phase: 19,
                chunk: 7,
                bytes: (0..64).map(|i| (i * 5) as u8).collect::<Vec<u8>>().into(),
            },
        ),
        (
            "piece",
            ToPeer::Piece {
                more: true,
                bytes: Bytes::from_static(b"\x00\x01\x02"),
            },
        ),
        (
            "shared-copy",
            ToPeer::SharedCopy {
                seq: 4,
                generation: 2,
                phase: 19,
                chunk: 7,
                at: SharedAt {
                    pid: 4242,
                    fd: 17,
                    offset: 64,
                    len: 1 << 20,
                    nonce: [0xA5; 16],
                },
            },
        ),
    ];
    for (name, msg) in &to_peer {
        p(&format!("valid-to-peer-{name}"), encode(msg).to_vec());
    }
    let from_peer = [
        ("ack-kept", FromPeer::Ack { seq: 1, kept: true }),
        (
            "ack-refused",
            FromPeer::Ack {
                seq: 1 << 40,
                kept: false,
            },
        ),
        ("heartbeat", FromPeer::Heartbeat),
        (
            "piece",
            FromPeer::Piece {
                more: false,
                bytes: Bytes::from_static(b"\x01"),
            },
        ),
        ("unshared", FromPeer::Unshared { seq: 4 }),
        ("released", FromPeer::Released { nonce: [0x5A; 16] }),
    ];
    for (name, msg) in &from_peer {
        p(&format!("valid-from-peer-{name}"), encode(msg).to_vec());
    }
    // What a listener reads on a link: the hello, the proof, a heartbeat, a halo in pieces
    // under the target's frame limit, and a short halo.
    let hello_frame = versioned(&hello);
    let heartbeat = encode(&ToPeer::Heartbeat);
    let pieces: Vec<Bytes> = frame::Frames::new(&a_halo(2, 3 * LIMIT), LIMIT)
        .map(|f| f.to_bytes())
        .collect();
    assert!(pieces.len() > 3);
    let short = encode(&a_halo(3, 5));
    let mut link: Vec<&[u8]> = vec![&hello_frame, &proof, &heartbeat];
    link.extend(pieces.iter().map(|p| &p[..]));
    link.push(&short);
    p("valid-stream-link", stream(&link));
    // Frames that decode, of a message that does not: a whole halo in the middle of a pieced
    // one.
    p(
        "valid-stream-interrupted-pieces",
        stream(&[&pieces[0], &short, &pieces[1]]),
    );
    // Hostile: nothing, an HTTP request, another protocol or version, cut or padded hellos,
    // a short proof, unknown variants, a halo claiming u64::MAX bytes, a bool that is not one.
    p("seed-empty-input", vec![]);
    p(
        "seed-http-request",
        b"GET / HTTP/1.1\r\nHost: 198.51.100.7\r\n\r\n".to_vec(),
    );
    p(
        "seed-wrong-magic",
        versioned_as(b"MALLEABX", PROTOCOL_VERSION, &hello),
    );
    p(
        "seed-wrong-version",
        versioned_as(&frame::MAGIC, PROTOCOL_VERSION + 1, &hello),
    );
    p(
        "seed-version-previous",
        versioned_as(&frame::MAGIC, PROTOCOL_VERSION - 1, &hello),
    );
    let full = versioned(&hello);
    p("seed-truncated-hello", full[..full.len() - 4].to_vec());
    p("seed-hello-trailing-byte", [&full[..], &[0]].concat());
    p("seed-proof-short", vec![9; 31]);
    p("seed-unknown-variant", vec![3]);
    p("seed-unknown-refusal", vec![2, 3]);
    p(
        "seed-halo-huge-length",
        [&[0u8, 1, 1, 1, 1, 1][..], &[0xff; 9], &[0x01]].concat(),
    );
    p("seed-ack-not-a-bool", vec![0, 5, 2]);
}

/// The hostile seeds of the cluster targets are refused by every decoder (so that each one
/// reaches the error path it was written for, not a valid message by accident).
#[test]
fn cluster_hostile_seeds_decode_nothing() {
    for ((target, name), bytes) in seeds() {
        let run = match target {
            "frame" => frame_target,
            "handshake" => handshake_target,
            "peer" => peer_target,
            _ => continue,
        };
        assert_eq!(
            run(&bytes),
            name.starts_with("valid-"),
            "{target}/{name} decodes as its name does not say"
        );
    }
}

#[test]
fn seeds_are_current() {
    for ((target, name), bytes) in seeds() {
        let path = corpus(target).join(name);
        let found = std::fs::read(&path).unwrap_or_default();
        assert!(
            found == bytes,
            "{} is missing or stale: run `cargo test --all-features --test it fuzz_corpus::write_seeds -- --ignored`",
            path.display()
        );
    }
}

#[test]
#[ignore = "writes the seed corpus into fuzz/corpus"]
fn write_seeds() {
    for ((target, name), bytes) in seeds() {
        let dir = corpus(target);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}
