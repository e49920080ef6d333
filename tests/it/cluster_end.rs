//! The end of a connection, from the worker's side of the wire: the coordinator sends `End`
//! and then reads what the worker still sends until the worker closes its side. A worker
//! writes heartbeats and reports at any time, so some are on their way when `End` leaves;
//! a coordinator that closed its socket at once left them unread, the connection was reset,
//! and the worker's next write failed with a broken pipe although its job had ended well
//! (a worker process then exited with an error). The worker here is written by hand, so it
//! can write after `End` on purpose. (The worker's own side, a write that fails after `End`
//! anyway, is a unit test of its I/O loop.)

use std::net::Shutdown;
use std::time::{Duration, Instant};

use malleable::cluster::{Token, frame};
use malleable::{Chunking, Executor, Outcome};

use crate::common;

use common::raw::{authenticated, read_frame, try_send_frame};
use common::walk::{Walk, pace};

const CHUNK: u64 = 500;
const TOKEN: &str = "the end's token";
const PATIENCE: Duration = Duration::from_secs(20);

#[test]
fn the_coordinator_reads_what_a_worker_sends_after_end_until_it_closes() {
    let (exec, addr) = listening(1);
    // One chunk, paced to last about half a second on the local worker.
    pace(1, true);
    let job = walk(1, CHUNK);
    let h = exec.submit(job).unwrap();
    let start = Instant::now();
    while h.progress().done == 0 {
        assert!(start.elapsed() < PATIENCE, "the chunk did not start");
        std::thread::sleep(Duration::from_millis(2));
    }
    // The only chunk runs on the local worker: this one is given nothing, and gets `End`
    // when the job finishes.
    let mut s = authenticated(&addr, TOKEN);
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    loop {
        let f = read_frame(&mut s).expect("End before the connection closes");
        // Alone, or in a batch with what else the coordinator decided at that moment.
        let msgs = match frame::decode_to_worker("coordinator", &f).unwrap() {
            frame::ToWorker::Batch(batch) => batch,
            msg => vec![msg],
        };
        let mut ended = false;
        for msg in msgs {
            match msg {
                frame::ToWorker::End => ended = true,
                frame::ToWorker::Heartbeat | frame::ToWorker::Store { .. } => {}
                other => panic!("this worker was given something: {other:?}"),
            }
        }
        if ended {
            break;
        }
    }
    // (The handle's `wait` waits for the connection's end too, a second at most, so it
    // comes last.)
    beats_after_end_then_closes(&mut s);
    assert!(matches!(h.wait().unwrap(), Outcome::Finished(_)));
}

/// Heartbeats after `End`, as a worker busy elsewhere would send them: the coordinator reads
/// them, so none resets the connection; and it closes its side after the worker's.
fn beats_after_end_then_closes(s: &mut std::net::TcpStream) {
    let beat = frame::encode(&frame::ToCoordinator::Heartbeat {
        progress: Vec::new(),
    });
    for i in 0..2 {
        std::thread::sleep(Duration::from_millis(100));
        if let Err(e) = try_send_frame(s, &beat) {
            panic!("heartbeat {i} after End: {e}");
        }
    }
    s.shutdown(Shutdown::Write).unwrap();
    let mut rest = [0; 64];
    match std::io::Read::read(s, &mut rest) {
        Ok(0) => {}
        other => panic!("the coordinator did not close after the worker: {other:?}"),
    }
}

/// A job that ends while chunks run on a worker process sends their interrupts and `End`
/// in one batch. The coordinator took only a lone `End` for the end: it wrote the batch,
/// went on waiting, dropped the connection when the job let go of it, and closed the socket
/// on what the worker still sent: a reset, and a worker that served its job to the end
/// exited with an error (a CI run's worker, whose chunk state did not decode, did).
#[test]
fn an_end_in_a_batch_closes_the_connection_as_a_lone_end_does() {
    let (exec, addr) = listening(0);
    let job = walk(3, 16 * CHUNK);
    let h = exec.submit(job).unwrap();
    // The worker is given chunks it never runs; then the job is cancelled under them.
    let mut s = authenticated(&addr, TOKEN);
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut cancelled = false;
    let end = loop {
        let f = read_frame(&mut s).expect("End before the connection closes");
        let msg = frame::decode_to_worker("coordinator", &f).unwrap();
        let msgs = match &msg {
            frame::ToWorker::Batch(batch) => batch.clone(),
            msg => vec![msg.clone()],
        };
        if msgs.contains(&frame::ToWorker::End) {
            break msg;
        }
        if !cancelled
            && msgs
                .iter()
                .any(|m| matches!(m, frame::ToWorker::Run { .. }))
        {
            h.cancel();
            cancelled = true;
        }
    };
    assert!(
        cancelled,
        "the job ended before it gave this worker a chunk"
    );
    match &end {
        frame::ToWorker::Batch(batch) => assert!(batch.len() > 1, "{batch:?}"),
        other => panic!("End came alone, not in a batch: {other:?}"),
    }
    // What a worker busy elsewhere sends after `End` is read, as after a lone `End`.
    beats_after_end_then_closes(&mut s);
    assert!(matches!(h.wait(), Err(malleable::Error::Cancelled { .. })));
}

/// A worker process that dials after its job ended is told that the job ended (protocol
/// 14), on its side and on the coordinator's; it was told "the coordinator runs no job yet;
/// submit the job first". The executor still listens for a later run.
#[test]
fn a_worker_that_dials_after_its_job_ended_is_told_so() {
    let (exec, addr) = listening(1);
    let job = walk(2, CHUNK);
    for keep_the_handle in [true, false] {
        let h = exec.submit(job.clone()).unwrap();
        assert!(matches!(h.clone().wait().unwrap(), Outcome::Finished(_)));
        if !keep_the_handle {
            drop(h);
        }
        let registry = malleable::cluster::Registry::new().register::<Walk>();
        let options = malleable::cluster::WorkerOptions::default()
            .threads(1)
            .token(Token::new(TOKEN).unwrap());
        match malleable::cluster::serve(&addr, &registry, options) {
            Err(e @ malleable::cluster::Error::JobEnded { .. }) => {
                let text = e.to_string();
                assert!(text.contains("has ended job"), "{text}");
                assert!(!text.contains("submit the job first"), "{text}");
            }
            other => panic!("{other:?}"),
        }
        let start = Instant::now();
        while !exec
            .peer_errors()
            .iter()
            .any(|e| matches!(**e, malleable::cluster::Error::JobEnded { .. }))
        {
            assert!(
                start.elapsed() < PATIENCE,
                "the coordinator did not record it"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// An executor with `local_workers` of its own, listening on loopback for worker processes
/// with this file's token, and its address.
fn listening(local_workers: usize) -> (Executor, String) {
    let exec = Executor::builder()
        .local_workers(local_workers)
        .chunking(Chunking::Size(CHUNK))
        .listen("127.0.0.1:0")
        .cluster_token(Token::new(TOKEN).unwrap())
        .build()
        .unwrap();
    let addr = exec.local_addr().unwrap().to_string();
    (exec, addr)
}

/// A walk of one phase over `n` iterations, named `tag` for its pace.
fn walk(tag: u64, n: u64) -> Walk {
    Walk {
        tag,
        n,
        per_step: 2,
        phases: 1,
        phase: 0,
        carry: 0.0,
        history: Vec::new(),
    }
}
