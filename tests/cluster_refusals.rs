//! How each side of a connection names what it refuses, in its record, its metric
//! (`malleable_peer_errors_total` by `kind`) and its message:
//!
//! - the coordinator, facing an HTTP request (`not_a_peer`, not `frame_too_large`), a
//!   well-formed `Done` for a chunk the peer was not given (`rejected`, not `malformed`), a
//!   `CapturedHeldPart` for a partition it was not asked for (`rejected`), `Exported` halos
//!   of a partition it was not given to export them (`rejected`), kept halos handed up
//!   (`Released`) for a job without partitions (`rejected`), a `Done` with halos for a
//!   chunk its slot does not run (`rejected` before its halos replace that chunk's), and a
//!   `Done` whose output does not decode although the job versions match, or a worker's
//!   report that it could not decode the job value (`undecodable`, with the advice to bump
//!   `Job::VERSION`), and an `Abandoned` when no rollback asked for it (`rejected`); the job
//!   goes on to its exact value. It also drains processes that
//!   leave with any grace period the message can carry, from none to `u64::MAX` ms;
//! - a worker process, which drops a chunk a rollback abandons (running or waiting) with no
//!   state, and which faces a coordinator that sends a `Run` before the job value or for a
//!   slot it does not have (`rejected`), a job value that does not decode (`undecodable`,
//!   and the coordinator is told), or a welcome to the job in another version
//!   (`job_version`).
//!
//! The hostile peers are written by hand over plain sockets.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use malleable::cluster::{self, Registry, Token, WorkerOptions, frame, handshake};
use malleable::{Banded, Chunking, Executor, JobHandle, Outcome};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

mod common;

use common::grid::{self, Grid};
use common::raw::{self, mac, read_frame, send_frame, versioned};
use common::walk::{Total, Walk, pace};

const CHUNK: u64 = 500;
const TOKEN: &str = "the shared token";
const PATIENCE: Duration = Duration::from_secs(10);

/// The tests of this file count the process's metrics: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The metrics recorder of this test binary, installed once.
fn snapshotter() -> &'static Snapshotter {
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder.install().unwrap();
        snapshotter
    })
}

/// Refused peers counted by kind since the last call (a snapshot resets the counters).
#[derive(Default)]
struct PeerErrors(std::collections::HashMap<String, u64>);

impl PeerErrors {
    /// Counts what was recorded since the last call.
    fn take(&mut self) {
        for (key, _, _, value) in snapshotter().snapshot().into_vec() {
            let key = key.key();
            if key.name() != malleable::metrics::PEER_ERRORS {
                continue;
            }
            let DebugValue::Counter(c) = value else {
                continue;
            };
            if let Some(kind) = key.labels().find(|l| l.key() == "kind") {
                *self.0.entry(kind.value().to_owned()).or_default() += c;
            }
        }
    }

    fn get(&self, kind: &str) -> u64 {
        self.0.get(kind).copied().unwrap_or(0)
    }

    /// Waits until `kind` was counted `n` times in all.
    fn until(&mut self, kind: &str, n: u64) {
        let start = Instant::now();
        loop {
            self.take();
            if self.get(kind) >= n {
                return;
            }
            assert!(
                start.elapsed() < PATIENCE,
                "{kind} counted {} times, not {n}: {:?}",
                self.get(kind),
                self.0
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

fn walk(tag: u64) -> Walk {
    pace(tag, true);
    Walk {
        tag,
        n: 20_000,
        per_step: 20,
        phases: 2,
        phase: 0,
        carry: 0.0,
        history: Vec::new(),
    }
}

fn finished_exactly(h: JobHandle<Walk>, job: &Walk) {
    let fin = match h.wait().unwrap() {
        Outcome::Finished(f) => f,
        other => panic!("not finished: {other:?}"),
    };
    let (total, history) = common::walk::sequential(job, CHUNK);
    assert_eq!(fin.value.sum.to_bits(), total.sum.to_bits());
    assert_eq!(fin.job.history, history);
}

/// A coordinator with one local worker, listening on loopback with the shared token.
fn coordinator() -> malleable::Builder {
    Executor::builder()
        .local_workers(1)
        .listen("127.0.0.1:0")
        .cluster_token(Token::new(TOKEN).unwrap())
}

/// Whether the other side closes the connection within [`PATIENCE`].
fn closed_by_other_side(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut buf = [0; 256];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

/// A connection that completed the handshake as a worker of `walk` (one thread), by hand.
fn authenticated(addr: &str) -> TcpStream {
    raw::authenticated(addr, TOKEN)
}

/// Sends `msg` from a fresh peer of `exec`, which closes the connection and counts it as the
/// `n`th `rejected`; returns the text of the record that contains `needle`.
fn refused(
    exec: &Executor,
    counted: &mut PeerErrors,
    n: u64,
    msg: frame::ToCoordinator,
    needle: &str,
) -> String {
    let addr = exec.local_addr().unwrap().to_string();
    let mut s = authenticated(&addr);
    send_frame(&mut s, &frame::encode(&msg));
    assert!(closed_by_other_side(&mut s));
    counted.until("rejected", n);
    exec.peer_errors()
        .iter()
        .filter(|e| matches!(***e, cluster::Error::Rejected { .. }))
        .map(|e| e.to_string())
        .find(|t| t.contains(needle))
        .unwrap_or_else(|| panic!("no record of a refusal with {needle:?}"))
}

fn done(chunk: u64, output: Bytes) -> Vec<u8> {
    frame::encode(&frame::ToCoordinator::Done {
        slot: 0,
        chunk,
        output,
        halos: None,
        iterations: 1,
        busy_ns: 1,
    })
    .to_vec()
}

#[test]
fn the_coordinator_names_what_it_refuses() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let mut counted = PeerErrors::default();
    counted.take();
    let exec = coordinator()
        .chunking(Chunking::Size(CHUNK))
        .build()
        .unwrap();
    let addr = exec.local_addr().unwrap().to_string();
    let job = walk(11);
    let h = exec.submit(job.clone()).unwrap();

    // An HTTP request: not a peer, counted so (its "GET " reads as a length of 1.2 GB,
    // which used to be reported as a frame over the limit).
    let mut http = TcpStream::connect(&addr).unwrap();
    http.write_all(b"GET / HTTP/1.1\r\nHost: malleable\r\n\r\n")
        .unwrap();
    assert!(closed_by_other_side(&mut http));
    counted.until("not_a_peer", 1);
    assert_eq!(counted.get("frame_too_large"), 0, "{:?}", counted.0);
    let errors = exec.peer_errors();
    let last = errors.last().unwrap();
    assert!(
        matches!(**last, cluster::Error::NotAPeer { .. }),
        "{errors:?}"
    );
    assert!(
        last.to_string()
            .ends_with("does not speak the malleable protocol"),
        "{last}"
    );

    // A well-formed `Done` for a chunk this peer was not given: refused by the job's
    // ledger, reported as `rejected` with the ledger's refusal as its source.
    let mut s = authenticated(&addr);
    let output = frame::encode(&Total {
        sum: 1.0,
        iterations: 1,
    });
    send_frame(&mut s, &done(1_000_000, output));
    assert!(closed_by_other_side(&mut s));
    counted.until("rejected", 1);
    assert_eq!(counted.get("malformed"), 0, "{:?}", counted.0);
    let errors = exec.peer_errors();
    let rejected = errors
        .iter()
        .find(|e| matches!(***e, cluster::Error::Rejected { .. }))
        .expect("a Rejected record");
    assert_eq!(rejected.kind(), "rejected");
    let text = rejected.to_string();
    assert!(
        text.ends_with(
            "sent a Done that is refused here: the job's ledger refuses chunk 1000000 from slot 0"
        ),
        "{text}"
    );
    let source = std::error::Error::source(&**rejected).expect("the ledger's refusal");
    assert!(
        source
            .to_string()
            .ends_with("rejected: chunk not running on this worker"),
        "{source}"
    );

    // A part of a held partition that this peer was never asked for (the reference names
    // this job's folder): refused as `rejected`, with what was wrong.
    let part = malleable::snapshot::PartRef {
        chunk: 5,
        key: "walk/00000000000000000000/parts/0-5-00000000000000ff".to_owned(),
        size: 8,
        crc32c: 0,
    };
    let text = refused(
        &exec,
        &mut counted,
        2,
        frame::ToCoordinator::CapturedHeldPart { chunk: 5, part },
        "chunk 5",
    );
    assert!(
        text.ends_with("that is refused here: chunk 5 was not asked of this process"),
        "{text}"
    );

    // Halos for a partition this peer was never given to export them (the answer to a
    // partition placed after a rollback): refused as `rejected`.
    let halos = vec![
        (Some(4), frame::Halo::Sent(Bytes::from_static(b"\x01"))),
        (Some(6), frame::Halo::Sent(Bytes::from_static(b"\x02"))),
    ];
    let text = refused(
        &exec,
        &mut counted,
        3,
        frame::ToCoordinator::Exported {
            chunk: 5,
            halos,
            placement: 0,
        },
        "halos for chunk 5",
    );
    assert!(
        text.ends_with(
            "halos for chunk 5, which was not placed there to export them (placement 0)"
        ),
        "{text}"
    );

    // Kept halos handed up (`Released`) for a job without partitions, for the last chunk
    // number there is: refused as `rejected`, nothing indexed past the end.
    let released = frame::ToCoordinator::Released {
        chunk: u64::MAX,
        phase: u64::MAX,
        halos: vec![
            (0, frame::Halo::Sent(Bytes::from_static(b"\x01"))),
            (1, frame::Halo::Sent(Bytes::from_static(b"\x02"))),
        ],
    };
    let text = refused(
        &exec,
        &mut counted,
        4,
        released,
        &format!("halos for chunk {}", u64::MAX),
    );
    assert!(text.ends_with("of a job without partitions"), "{text}");

    // An `Abandoned` while the job does not roll back: refused as `rejected`.
    let abandoned = frame::ToCoordinator::Abandoned { slot: 0, chunk: 0 };
    let text = refused(&exec, &mut counted, 5, abandoned, "abandoned");
    assert!(
        text.ends_with("chunk 0 was abandoned in slot 0, which was not asked to"),
        "{text}"
    );

    // A `Done` whose output does not decode although both sides have version 1 of the job:
    // the message says the serialized form differs and how to have such a worker refused.
    let mut s = authenticated(&addr);
    send_frame(&mut s, &done(0, Bytes::from_static(&[0xff; 3])));
    assert!(closed_by_other_side(&mut s));
    counted.until("undecodable", 1);
    let errors = exec.peer_errors();
    let undecodable = errors
        .iter()
        .find(|e| matches!(***e, cluster::Error::Undecodable { here: true, .. }))
        .expect("an Undecodable record");
    let text = undecodable.to_string();
    assert!(
        text.starts_with("a chunk output of job \"walk\" from 127.0.0.1:"),
        "{text}"
    );
    assert!(
        text.contains(
            "does not decode here, although both sides have version 1 of the job: its \
             serialized form differs between the two programs (bump Job::VERSION"
        ),
        "{text}"
    );
    assert!(std::error::Error::source(&**undecodable).is_some());
    assert_eq!(counted.get("malformed"), 0, "{:?}", counted.0);

    // A worker process that reports that it could not decode the job value (and leaves).
    let mut s = authenticated(&addr);
    send_frame(
        &mut s,
        &frame::encode(&frame::ToCoordinator::Undecodable {
            what: "the job value".to_owned(),
            error: postcard::Error::DeserializeUnexpectedEnd,
        }),
    );
    assert!(closed_by_other_side(&mut s));
    counted.until("undecodable", 2);
    let errors = exec.peer_errors();
    let theirs = errors
        .iter()
        .find(|e| matches!(***e, cluster::Error::Undecodable { here: false, .. }))
        .expect("a record of the worker's report");
    let text = theirs.to_string();
    assert!(
        text.starts_with("the worker process at 127.0.0.1:")
            && text.contains(
                "could not decode the job value of job \"walk\" sent by this coordinator, \
                 although both sides have version 1 of the job: its serialized form differs \
                 between the coordinator and the worker (bump Job::VERSION"
            ),
        "{text}"
    );

    // None of this disturbed the job.
    finished_exactly(h, &job);
}

/// A `Done` with halos for a chunk that its slot does not run, here one that the local
/// worker ended in this phase, is refused before its halos are kept: they would have
/// replaced that chunk's, which its neighbours take at the next phase. The job, a grid on
/// owned partitions, ends with the sequential loop's bits.
#[test]
fn a_done_with_halos_for_a_chunk_its_slot_does_not_run_replaces_no_halo() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let mut counted = PeerErrors::default();
    counted.take();
    let exec = coordinator().build().unwrap();
    let addr = exec.local_addr().unwrap().to_string();
    // 12 bands of 4 rows, 10 ms a row: the first phase takes about half a second on the
    // local worker, which runs the bands in order, and a partition lost in the first phase
    // is made again (the hand-written peer is dropped with the chunks it was given).
    let g = Grid {
        pace_us: 10_000,
        pace_every: 1,
        ..Grid::new(48, 16, 3)
    };
    let want = grid::sequential(&g);
    let h = exec.submit(Banded(g)).unwrap();
    let start = Instant::now();
    while h.progress().done < 8 {
        assert!(start.elapsed() < PATIENCE, "{:?}", h.progress());
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(
        h.progress().phase,
        0,
        "the first phase ended before the peer came"
    );

    let mut s = raw::authenticated_as(&addr, TOKEN, "test-grid");
    let garbage = || frame::Halo::Sent(Bytes::from_static(&[0xff; 9]));
    send_frame(
        &mut s,
        &frame::encode(&frame::ToCoordinator::Done {
            slot: 0,
            chunk: 0,
            output: frame::encode(&Vec::<u64>::new()),
            halos: Some(vec![(Some(1), garbage())]),
            iterations: 4,
            busy_ns: 1,
        }),
    );
    assert!(closed_by_other_side(&mut s));
    let fin = match h.wait().unwrap() {
        Outcome::Finished(f) => f,
        other => panic!("not finished: {other:?}"),
    };
    assert_eq!(fin.value, want);
    counted.until("rejected", 1);
    let text = exec
        .peer_errors()
        .iter()
        .filter(|e| matches!(***e, cluster::Error::Rejected { .. }))
        .map(|e| e.to_string())
        .next()
        .expect("a Rejected record");
    assert!(
        text.ends_with("chunk 0 ended in slot 0, which does not run it"),
        "{text}"
    );
}

/// Panics anywhere in this process (the coordinator's tasks too) since the first call.
fn panics() -> &'static std::sync::atomic::AtomicU64 {
    static PANICS: OnceLock<std::sync::atomic::AtomicU64> = OnceLock::new();
    PANICS.get_or_init(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            panics().fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            previous(info);
        }));
        0.into()
    })
}

/// Worker processes that leave with a grace period of their own, one that claims the
/// longest one the message can say (`u64::MAX` ms) and goes as soon as it is told to hand
/// its chunks back, one that claims none (0 ms) and stays: the second is let go at once
/// (its lease would have taken seconds), nothing panics, and the job ends with its exact
/// value.
#[test]
fn a_leave_with_any_grace_period_is_drained() {
    use std::sync::atomic::Ordering::SeqCst;
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let before = panics().load(SeqCst);
    let mut counted = PeerErrors::default();
    counted.take();
    let exec = coordinator()
        .chunking(Chunking::Size(CHUNK))
        .heartbeat(Duration::from_millis(100), PATIENCE)
        .snapshots("memory://")
        .build()
        .unwrap();
    let addr = exec.local_addr().unwrap().to_string();
    let job = walk(12);
    let h = exec.submit(job.clone()).unwrap();
    let leave = |grace_ms| frame::encode(&frame::ToCoordinator::Leave { grace_ms });

    let mut longest = authenticated(&addr);
    send_frame(&mut longest, &leave(Some(u64::MAX)));
    longest.set_read_timeout(Some(PATIENCE)).unwrap();
    loop {
        let f = read_frame(&mut longest).expect("an Interrupt or an End");
        // Alone, or in a batch with what else the coordinator decided at that moment.
        let msgs = match frame::decode_to_worker("coordinator", &f).unwrap() {
            frame::ToWorker::Batch(batch) => batch,
            msg => vec![msg],
        };
        if msgs
            .iter()
            .any(|m| matches!(m, frame::ToWorker::Interrupt { .. } | frame::ToWorker::End))
        {
            break;
        }
    }
    drop(longest);

    let mut none = authenticated(&addr);
    send_frame(&mut none, &leave(Some(0)));
    let start = Instant::now();
    assert!(closed_by_other_side(&mut none));
    let took = start.elapsed();
    finished_exactly(h, &job);
    counted.take();
    assert_eq!(
        counted.get("lease_expired"),
        0,
        "{:?} after {took:?}",
        counted.0
    );
    assert_eq!(panics().load(SeqCst), before);
}

/// A "coordinator" written by hand: shakes hands with one worker as the coordinator of job
/// `walk` in `version`, then sends `then` and waits for the worker to hang up; returns what
/// the worker sent after the handshake.
fn fake_coordinator(
    version: u32,
    then: Vec<frame::ToWorker>,
) -> (String, std::thread::JoinHandle<Vec<frame::ToCoordinator>>) {
    fake_coordinator_until(version, then, |_| false)
}

/// As [`fake_coordinator`], hanging up as soon as what the worker sent satisfies `enough`.
fn fake_coordinator_until(
    version: u32,
    then: Vec<frame::ToWorker>,
    enough: fn(&[frame::ToCoordinator]) -> bool,
) -> (String, std::thread::JoinHandle<Vec<frame::ToCoordinator>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let thread = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let hello = read_frame(&mut s).expect("a hello");
        let hello = handshake::decode_hello("worker", &hello).unwrap();
        let nc = [9; 32];
        let proof = mac(TOKEN, b"malleable coordinator v1", &hello.nonce, &nc);
        send_frame(
            &mut s,
            &versioned(
                frame::PROTOCOL_VERSION,
                &handshake::Reply::Challenge { nonce: nc, proof },
            ),
        );
        let _proof = read_frame(&mut s).expect("a proof");
        let welcome = handshake::Reply::Welcome {
            job: "walk".into(),
            version,
            heartbeat_ms: 100,
            lease_ms: 5_000,
        };
        send_frame(&mut s, &frame::encode(&welcome));
        for msg in then {
            send_frame(&mut s, &frame::encode(&msg));
        }
        s.set_read_timeout(Some(PATIENCE)).unwrap();
        let mut got = Vec::new();
        while let Some(f) = read_frame(&mut s) {
            got.push(frame::decode_to_coordinator("worker", &f).unwrap());
            if enough(&got) {
                break;
            }
        }
        got
    });
    (addr, thread)
}

fn serve_walk(addr: &str) -> cluster::Error {
    cluster::serve(
        addr,
        &Registry::new().register::<Walk>(),
        WorkerOptions::default()
            .threads(1)
            .token(Token::new(TOKEN).unwrap()),
    )
    .unwrap_err()
}

fn run(slot: u32) -> frame::ToWorker {
    frame::ToWorker::Run {
        slot,
        chunk: 0,
        start: 0,
        end: 10,
        state: None,
        held: false,
        then: Vec::new(),
    }
}

/// A rollback's `Abandon`, for the chunk a worker's thread runs and for one that waits behind
/// it: both are dropped and answered by `Abandoned`, with no state, and neither runs to its
/// end.
#[test]
fn a_worker_drops_what_a_rollback_abandons() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let job = walk(13);
    let phase = frame::ToWorker::Phase {
        phase: 0,
        chunks: 13,
        job: Bytes::from(frame::encode(&job).to_vec()),
    };
    let run = |slot: u32, chunk: u64| frame::ToWorker::Run {
        slot,
        chunk,
        start: chunk * 10_000,
        end: (chunk + 1) * 10_000,
        state: None,
        held: false,
        then: Vec::new(),
    };
    let abandon = |slot, chunk| frame::ToWorker::Abandon { slot, chunk };
    let two_abandoned = |got: &[frame::ToCoordinator]| {
        got.iter()
            .filter(|m| matches!(m, frame::ToCoordinator::Abandoned { .. }))
            .count()
            == 2
    };
    let (addr, fake) = fake_coordinator_until(
        1,
        vec![phase, run(0, 0), run(1, 1), abandon(1, 1), abandon(0, 0)],
        two_abandoned,
    );
    let _ = serve_walk(&addr);
    let got = fake.join().unwrap();
    let ended: Vec<_> = got
        .iter()
        .filter(|m| !matches!(m, frame::ToCoordinator::Heartbeat { .. }))
        .collect();
    assert_eq!(
        ended,
        [
            &frame::ToCoordinator::Abandoned { slot: 1, chunk: 1 },
            &frame::ToCoordinator::Abandoned { slot: 0, chunk: 0 },
        ],
        "{got:?}"
    );
}

#[test]
fn a_worker_names_what_it_refuses() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let job = Bytes::from(frame::encode(&walk(12)).to_vec());

    // A `Run` before the job value: well-formed, refused.
    let (addr, fake) = fake_coordinator(1, vec![run(0)]);
    let err = serve_walk(&addr);
    fake.join().unwrap();
    assert_eq!(err.kind(), "rejected", "{err:?}");
    assert!(
        err.to_string().ends_with(
            "sent a message to a worker that is refused here: a run before the job value"
        ),
        "{err}"
    );

    // A `Run` for a slot this worker does not have (one thread: slots 0 and 1).
    let phase = frame::ToWorker::Phase {
        phase: 0,
        chunks: 13,
        job: job.clone(),
    };
    let (addr, fake) = fake_coordinator(1, vec![phase, run(7)]);
    let err = serve_walk(&addr);
    fake.join().unwrap();
    assert_eq!(err.kind(), "rejected", "{err:?}");
    assert!(
        err.to_string().ends_with("slot 7 is not a live slot"),
        "{err}"
    );

    // A job value that does not decode although the versions match.
    let phase = frame::ToWorker::Phase {
        phase: 0,
        chunks: 13,
        job: Bytes::from_static(&[0xff, 0xff, 0xff]),
    };
    let (addr, fake) = fake_coordinator(1, vec![phase]);
    let err = serve_walk(&addr);
    // The coordinator was told why the worker left.
    let told = fake.join().unwrap();
    assert!(
        told.iter().any(|m| matches!(m, frame::ToCoordinator::Undecodable { what, .. } if what == "the job value")),
        "{told:?}"
    );
    assert!(
        matches!(&err, cluster::Error::Undecodable { job, version: 1, what: "the job value", here: true, .. } if job == "walk"),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.starts_with("the job value of job \"walk\" from 127.0.0.1:"),
        "{text}"
    );
    assert!(text.contains("bump Job::VERSION"), "{text}");

    // A welcome to the job in another version than this worker's (a coordinator that did
    // not check it): the worker checks it too.
    let (addr, fake) = fake_coordinator(5, vec![]);
    let err = serve_walk(&addr);
    fake.join().unwrap();
    assert!(
        matches!(&err, cluster::Error::JobVersion { job, coordinator: 5, worker: 1, .. } if job == "walk"),
        "{err:?}"
    );
}
