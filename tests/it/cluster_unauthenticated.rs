//! Peers that have not proven the token get no memory for their claims: a length prefix read
//! before the handshake is checked against the handshake's small frame limit
//! ([`handshake::HANDSHAKE_MAX_FRAME`]), not the configured `max_frame` (64 MiB by default),
//! so claiming a huge frame costs the claimant a connection, not the other side 64 MiB. It
//! used to: the framing reserved the claimed length as soon as it read the prefix (8 such
//! connections took 358 MB of resident memory, 500 took 32 GB of address space). Such a
//! peer, like an HTTP request sent to the port, is dropped as [`cluster::Error::NotAPeer`].
//! Both sides: the coordinator facing strangers that dial it, and a worker process facing a
//! "coordinator" that is not one.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use malleable::cluster::{self, Registry, WorkerOptions, frame, handshake};
use malleable::{Executor, reduce::Sum};
use serde::{Deserialize, Serialize};

/// Connections that each claim a frame of the default maximum.
const CLAIMS: usize = 500;
/// What each claims: the default frame limit, which the configured coordinator accepts once
/// the peer is authenticated.
const CLAIM: u32 = frame::DEFAULT_MAX_FRAME as u32;
/// How long the test waits for the other side to drop a connection before it fails.
const PATIENCE: Duration = Duration::from_secs(10);

/// The tests of this file measure this process's memory: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// A job the worker side can register (it never runs: the handshake fails first).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Never;

#[derive(Serialize, Deserialize)]
struct NeverChunk;

impl malleable::Job for Never {
    const NAME: &'static str = "cluster-unauthenticated-never";
    type Chunk = NeverChunk;
    type Reducer = Sum<u64>;
    type Input = ();
    fn iterations(&self) -> u64 {
        0
    }
    fn chunk(&self, _range: std::ops::Range<u64>) -> NeverChunk {
        NeverChunk
    }
    fn reducer(&self) -> Sum<u64> {
        Sum::new()
    }
}

impl malleable::Chunk for NeverChunk {
    type Job = Never;
    type Output = u64;
    fn step(&mut self, _job: &Never, _input: &()) -> malleable::Step<u64> {
        malleable::Step::Done(0)
    }
}

/// A line of `/proc/self/status` in KiB (`VmRSS`, `VmSize`).
fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"))
}

/// Raises this process's soft limit of open files to `want` if the hard limit allows;
/// returns the soft limit in force.
fn raise_open_files(want: u64) -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `getrlimit` writes one `rlimit` into the valid, exclusively borrowed `limit`.
    let got = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    assert_eq!(got, 0, "getrlimit");
    if limit.rlim_cur < want {
        let raised = libc::rlimit {
            rlim_cur: want.min(limit.rlim_max),
            rlim_max: limit.rlim_max,
        };
        // SAFETY: `setrlimit` reads one valid `rlimit`, which outlives the call.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            return raised.rlim_cur;
        }
    }
    limit.rlim_cur
}

/// Whether the other side has closed `s` (a read ends or is reset), without blocking.
fn closed(s: &mut TcpStream) -> bool {
    let mut buf = [0; 64];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(_) => return true,
        }
    }
}

/// Waits until the coordinator has closed every one of `conns`, up to [`PATIENCE`]; how
/// many it has not closed by then.
fn wait_closed(conns: &mut [TcpStream]) -> usize {
    for c in conns.iter() {
        c.set_nonblocking(true).unwrap();
    }
    let mut open: Vec<&mut TcpStream> = conns.iter_mut().collect();
    let start = Instant::now();
    while !open.is_empty() && start.elapsed() < PATIENCE {
        open.retain_mut(|c| !closed(c));
        std::thread::sleep(Duration::from_millis(10));
    }
    open.len()
}

#[test]
fn strangers_get_no_memory_from_the_coordinator() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let exec = Executor::builder()
        .local_workers(1)
        .listen("127.0.0.1:0")
        // Longer than the test: a connection the coordinator does not drop at once stays.
        .handshake_timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let addr = exec.local_addr().unwrap();

    // An HTTP request: its "GET " reads as a length of 1.2 GB. Not one of ours.
    let mut http = TcpStream::connect(addr).unwrap();
    http.write_all(b"GET / HTTP/1.1\r\nHost: malleable\r\n\r\n")
        .unwrap();
    assert_eq!(wait_closed(std::slice::from_mut(&mut http)), 0);
    let errors = exec.peer_errors();
    assert!(
        matches!(errors.as_slice(), [e] if matches!(**e, cluster::Error::NotAPeer { .. })),
        "an HTTP request must be reported as not a peer: {errors:?}"
    );
    assert_eq!(errors[0].kind(), "not_a_peer");

    // Many strangers, each claiming a frame of the default limit and sending a few bytes of
    // it. A socket for each end of each connection lives in this process.
    let fds = raise_open_files(4 * CLAIMS as u64);
    let claims = CLAIMS.min((fds as usize).saturating_sub(200) / 2);
    if claims < CLAIMS {
        println!("open files limited to {fds}: {claims} connections instead of {CLAIMS}");
    }
    let (rss, size) = (status_kib("VmRSS"), status_kib("VmSize"));
    let mut conns: Vec<TcpStream> = (0..claims)
        .map(|_| {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(&CLAIM.to_be_bytes()).unwrap();
            s.write_all(&frame::MAGIC).unwrap();
            s
        })
        .collect();
    let still_open = wait_closed(&mut conns);
    let (rss_grew, size_grew) = (
        status_kib("VmRSS").saturating_sub(rss),
        status_kib("VmSize").saturating_sub(size),
    );
    println!(
        "{claims} claims of {CLAIM} bytes: resident memory grew by {rss_grew} KiB, \
         address space by {size_grew} KiB; {still_open} connections left open"
    );
    // Each claim used to reserve 64 MiB: far under one claim for all of them together.
    assert!(
        rss_grew < 16 << 10,
        "resident memory grew by {rss_grew} KiB"
    );
    assert!(
        size_grew < 1 << 20,
        "address space grew by {size_grew} KiB for {claims} claims of {CLAIM} bytes"
    );
    assert_eq!(
        still_open, 0,
        "the coordinator kept connections that claimed {CLAIM} bytes before authenticating"
    );
    let errors = exec.peer_errors();
    assert!(
        errors
            .iter()
            .all(|e| matches!(**e, cluster::Error::NotAPeer { .. })),
        "{:?}",
        errors
            .iter()
            .find(|e| !matches!(***e, cluster::Error::NotAPeer { .. }))
    );
    assert_eq!(errors.len(), (claims + 1).min(256));
}

#[test]
fn a_worker_gets_no_memory_from_a_stranger_it_dials() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    // A "coordinator" that reads the worker's hello and answers with a claim of 64 MiB.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let stranger = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut len = [0; 4];
        s.read_exact(&mut len).unwrap();
        let mut hello = vec![0; u32::from_be_bytes(len) as usize];
        s.read_exact(&mut hello).unwrap();
        assert!(handshake::decode_hello("worker", &hello).is_ok());
        s.write_all(&CLAIM.to_be_bytes()).unwrap();
        s.write_all(&frame::MAGIC).unwrap();
        // Until the worker hangs up.
        s.set_read_timeout(Some(PATIENCE)).unwrap();
        let _ = s.read(&mut [0; 16]);
    });
    let timeout = Duration::from_secs(5);
    let rss = status_kib("VmRSS");
    let started = Instant::now();
    let err = cluster::serve(
        &addr,
        &Registry::new().register::<Never>(),
        WorkerOptions::default().threads(1).timeout(timeout),
    )
    .unwrap_err();
    let took = started.elapsed();
    let rss_grew = status_kib("VmRSS").saturating_sub(rss);
    println!("the worker gave up after {took:?}: {err}; resident memory grew by {rss_grew} KiB");
    assert!(
        matches!(err, cluster::Error::NotAPeer { .. }),
        "expected NotAPeer, got {err:?}"
    );
    assert!(
        rss_grew < 16 << 10,
        "resident memory grew by {rss_grew} KiB"
    );
    stranger.join().unwrap();
}
