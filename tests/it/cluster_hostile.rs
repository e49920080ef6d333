//! Hostile peers against a coordinator in the middle of a job: a wrong token, another protocol
//! version, an unknown job, garbage bytes, a frame over the limit, a peer that says nothing, a
//! peer that stalls in the middle of a frame. Each is refused with a typed error on the
//! coordinator's side (and on the peer's, where the peer is a worker of ours), while the job
//! goes on with its good workers and ends with the exact value.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use malleable::cluster::{self, Registry, Token, WorkerOptions, frame, handshake};
use malleable::{Chunking, Error, Executor, JobHandle, Outcome};

use crate::common;

use common::Kernel;
use common::raw::{authenticated, hello_frame, read_frame, send_frame};
use common::walk::{Walk, pace};

const CHUNK: u64 = 500;
const LIMIT: usize = 1 << 20;
const HANDSHAKE: Duration = Duration::from_millis(400);

fn walk(tag: u64) -> Walk {
    pace(tag, true);
    Walk {
        tag,
        n: 80_000,
        per_step: 20,
        phases: 3,
        phase: 0,
        carry: 0.0,
        history: Vec::new(),
    }
}

/// The coordinator's record of refused peers grows to hold an error matching `pred`.
fn until_error(exec: &Executor, what: &str, pred: impl Fn(&cluster::Error) -> bool) {
    let start = Instant::now();
    loop {
        if exec.peer_errors().iter().any(|e| pred(e)) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no {what} in {:?}",
            exec.peer_errors()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Whether the coordinator closes the connection (reads end) within a few seconds.
fn closed_by_coordinator(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
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

fn finished_exactly(h: JobHandle<Walk>, job: &Walk) {
    let fin = match h.wait().unwrap() {
        Outcome::Finished(f) => f,
        other => panic!("not finished: {other:?}"),
    };
    let (total, history) = common::walk::sequential(job, CHUNK);
    assert_eq!(fin.value.sum.to_bits(), total.sum.to_bits());
    assert_eq!(fin.value.iterations, total.iterations);
    assert_eq!(fin.job.history, history);
}

#[test]
fn hostile_peers_are_refused_while_the_job_goes_on() {
    let token = Token::new("the right token").unwrap();
    let exec = Executor::builder()
        .local_workers(1)
        .chunking(Chunking::Size(CHUNK))
        .listen("127.0.0.1:0")
        .cluster_token(token.clone())
        .handshake_timeout(HANDSHAKE)
        .max_frame(LIMIT)
        .build()
        .unwrap();
    let addr = exec.local_addr().unwrap().to_string();
    let job = walk(1);
    let h = exec.submit(job.clone()).unwrap();

    // A good worker, in a thread of this process, with the right token.
    let good = {
        let addr = addr.clone();
        let options = WorkerOptions::default().threads(1).token(token.clone());
        std::thread::spawn(move || {
            cluster::serve(&addr, &Registry::new().register::<Walk>(), options)
        })
    };

    // A wrong token: refused on both sides.
    let options = WorkerOptions::default()
        .threads(1)
        .token(Token::new("wrong").unwrap());
    let err = cluster::serve(&addr, &Registry::new().register::<Walk>(), options).unwrap_err();
    assert!(
        matches!(
            err,
            cluster::Error::Auth {
                failure: cluster::AuthFailure::CoordinatorProof { token: true },
                ..
            }
        ),
        "{err:?}"
    );
    // The worker learns that the two tokens differ and how a token is set, not that "the
    // coordinator did not prove the shared token".
    let text = err.to_string();
    assert!(
        text.starts_with(&format!(
            "the coordinator at {addr} does not hold this worker process's shared token: give \
             both the same token: MALLEABLE_TOKEN"
        )),
        "{text}"
    );
    assert!(text.contains("WorkerOptions::token"), "{text}");
    until_error(&exec, "Auth", |e| matches!(e, cluster::Error::Auth { .. }));
    // The coordinator's record says that the worker did not prove its token, and how a
    // token is set.
    let errors = exec.peer_errors();
    let auth = errors
        .iter()
        .find(|e| matches!(***e, cluster::Error::Auth { .. }))
        .unwrap();
    assert!(
        matches!(
            **auth,
            cluster::Error::Auth {
                failure: cluster::AuthFailure::WorkerProof { token: true },
                ..
            }
        ),
        "{auth:?}"
    );
    let text = auth.to_string();
    assert!(
        text.starts_with("the worker process at 127.0.0.1:")
            && text.contains("did not prove that it holds this coordinator's shared token")
            && text.contains("MALLEABLE_TOKEN")
            && text.contains("Builder::cluster_token"),
        "{text}"
    );

    // No token at all, against a coordinator that has one.
    let err = cluster::serve(
        &addr,
        &Registry::new().register::<Walk>(),
        WorkerOptions::default().threads(1),
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            cluster::Error::Auth {
                failure: cluster::AuthFailure::CoordinatorProof { token: false },
                ..
            }
        ),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains(
            "requires a shared token and this worker process has none: set MALLEABLE_TOKEN"
        ),
        "{text}"
    );

    // An unknown job: the worker knows only another job type.
    let options = WorkerOptions::default().threads(1).token(token.clone());
    let err = cluster::serve(&addr, &Registry::new().register::<Kernel>(), options).unwrap_err();
    match &err {
        cluster::Error::UnknownJob { known, running, .. } => {
            assert_eq!(known, &["test-kernel".to_owned()]);
            assert_eq!(running, &["walk".to_owned()]);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        err.to_string(),
        format!(
            "no job in common with {addr}: the worker process knows [\"test-kernel\"], the \
             coordinator runs [\"walk\"]; register the job with the worker's Registry"
        )
    );
    until_error(&exec, "UnknownJob", |e| {
        matches!(e, cluster::Error::UnknownJob { .. })
    });

    // Another protocol version: told so in our framing, and refused.
    let mut s = TcpStream::connect(&addr).unwrap();
    send_frame(&mut s, &hello_frame(99));
    let reply = read_frame(&mut s).expect("a refusal");
    assert_eq!(
        handshake::decode_reply("coordinator", &reply).unwrap(),
        handshake::Reply::Refused(handshake::Refusal::Version)
    );
    until_error(&exec, "Version", |e| {
        matches!(e, cluster::Error::Version { theirs: 99, .. })
    });

    // Garbage bytes in a well-formed frame: not one of ours.
    let mut s = TcpStream::connect(&addr).unwrap();
    send_frame(&mut s, b"\x16\x03\x01 hello, is this TLS?");
    assert!(closed_by_coordinator(&mut s));
    until_error(&exec, "NotAPeer", |e| {
        matches!(e, cluster::Error::NotAPeer { .. })
    });

    // Garbage that is not even framing (an HTTP request): its "length" is over the
    // handshake's frame limit. Not one of ours either.
    let not_a_peer = |exec: &Executor| {
        exec.peer_errors()
            .iter()
            .filter(|e| matches!(***e, cluster::Error::NotAPeer { .. }))
            .count()
    };
    let before = not_a_peer(&exec);
    let mut s = TcpStream::connect(&addr).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert!(closed_by_coordinator(&mut s));

    // A frame over the limit, announced by its length prefix before the handshake: the
    // same (a stranger's claim is checked against the handshake's limit).
    let mut s = TcpStream::connect(&addr).unwrap();
    s.write_all(&((LIMIT as u32) + 1).to_be_bytes()).unwrap();
    assert!(closed_by_coordinator(&mut s));
    until_error(&exec, "two more NotAPeer", |_| {
        not_a_peer(&exec) >= before + 2
    });
    assert!(
        !exec
            .peer_errors()
            .iter()
            .any(|e| matches!(**e, cluster::Error::FrameTooLarge { .. })),
        "{:?}",
        exec.peer_errors()
    );

    // A frame over the limit from a peer that proved the token: `FrameTooLarge`.
    let mut s = authenticated(&addr, "the right token");
    s.write_all(&((LIMIT as u32) + 1).to_be_bytes()).unwrap();
    assert!(closed_by_coordinator(&mut s));
    until_error(&exec, "FrameTooLarge", |e| {
        matches!(e, cluster::Error::FrameTooLarge { limit: LIMIT, .. })
    });

    // A peer that connects and says nothing.
    let mut silent = TcpStream::connect(&addr).unwrap();
    assert!(closed_by_coordinator(&mut silent));
    // A peer that stalls in the middle of its hello.
    let mut stalled = TcpStream::connect(&addr).unwrap();
    let hello = hello_frame(frame::PROTOCOL_VERSION);
    stalled
        .write_all(&(hello.len() as u32).to_be_bytes())
        .unwrap();
    stalled.write_all(&hello[..10]).unwrap();
    assert!(closed_by_coordinator(&mut stalled));
    let timeouts = exec
        .peer_errors()
        .iter()
        .filter(|e| matches!(***e, cluster::Error::HandshakeTimeout { .. }))
        .count();
    assert!(timeouts >= 2, "{:?}", exec.peer_errors());

    // All of this hit a running job, which went on undisturbed.
    assert!(
        !h.is_finished(),
        "the job ended before the hostile peers were done"
    );
    finished_exactly(h, &job);
    let served = good.join().unwrap().unwrap();
    assert!(served.chunks_done > 0, "{served:?}");
}

#[test]
fn listening_beyond_loopback_needs_a_token() {
    // This test binary never sets the token variable, so the builder finds none.
    assert!(std::env::var_os(cluster::TOKEN_ENV).is_none());
    let err = Executor::builder().listen("0.0.0.0:0").build().unwrap_err();
    assert!(
        matches!(err, Error::Cluster(cluster::Error::NoToken { .. })),
        "{err:?}"
    );
    // With a token it listens.
    let exec = Executor::builder()
        .listen("0.0.0.0:0")
        .cluster_token(Token::new("secret").unwrap())
        .build()
        .unwrap();
    assert!(exec.local_addr().is_some());
    // The token is never printed.
    assert!(!format!("{:?}", Token::new("secret").unwrap()).contains("secret"));
}
