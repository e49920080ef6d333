//! Messages longer than the frame limit, in both directions, with real worker processes: a
//! job value and chunk states from the coordinator, outputs from the workers, all sent in
//! pieces and put together again; and a message over the receiver's message limit is refused
//! with a typed error, recorded where the user sees it.
//!
//! Worker processes are this test binary, re-executed to run [`worker_process`].

use std::ops::Range;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use malleable::cluster::{self, Registry, TOKEN_ENV, WorkerOptions};
use malleable::reduce::CollectBytes;
use malleable::{Chunk, Chunking, Executor, Job, Outcome, Step};
use serde::{Deserialize, Serialize};

const ADDR_ENV: &str = "MALLEABLE_TEST_PIECES_ADDR";
const FRAME_ENV: &str = "MALLEABLE_TEST_PIECES_FRAME";
/// The frame limit of both sides: 256 KiB, far below what the job sends.
const FRAME: usize = 256 << 10;

/// A job whose value (1 MiB of padding), chunk states and outputs (300 KiB each) are all
/// longer than one frame.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Heavy {
    #[serde(with = "serde_bytes")]
    pad: Vec<u8>,
    chunks: u64,
    /// Steps sleep this long, so that a chunk is handed around mid-way.
    pace_us: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct HeavyChunk {
    next: u64,
    end: u64,
    #[serde(with = "serde_bytes")]
    out: Vec<u8>,
}

const PER_CHUNK: u64 = 300 << 10;

fn byte(pad: &[u8], i: u64) -> u8 {
    pad[(i % pad.len() as u64) as usize] ^ (i >> 7) as u8
}

impl Job for Heavy {
    const NAME: &'static str = "pieces-heavy";
    type Chunk = HeavyChunk;
    type Reducer = CollectBytes;
    type Input = ();
    fn iterations(&self) -> u64 {
        self.chunks * PER_CHUNK
    }
    fn chunking(&self) -> Option<Chunking> {
        Some(Chunking::Size(PER_CHUNK))
    }
    fn chunk(&self, r: Range<u64>) -> HeavyChunk {
        HeavyChunk {
            next: r.start,
            end: r.end,
            out: Vec::new(),
        }
    }
    fn reducer(&self) -> CollectBytes {
        CollectBytes::new()
    }
}

impl Chunk for HeavyChunk {
    type Job = Heavy;
    type Output = BytesMut;
    fn step(&mut self, job: &Heavy, _: &()) -> Step<BytesMut> {
        let stop = self.end.min(self.next + (16 << 10));
        self.out
            .extend((self.next..stop).map(|i| byte(&job.pad, i)));
        self.next = stop;
        std::thread::sleep(Duration::from_micros(job.pace_us));
        if self.next == self.end {
            Step::Done(BytesMut::from(&std::mem::take(&mut self.out)[..]))
        } else {
            Step::Yield
        }
    }
}

fn heavy(chunks: u64, pace_us: u64) -> Heavy {
    Heavy {
        pad: (0..1 << 20)
            .map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect(),
        chunks,
        pace_us,
    }
}

fn sequential(job: &Heavy) -> Vec<u8> {
    (0..job.iterations()).map(|i| byte(&job.pad, i)).collect()
}

#[test]
#[ignore = "the body of the worker processes the other tests start"]
fn worker_process() {
    let Ok(addr) = std::env::var(ADDR_ENV) else {
        return;
    };
    let frame = std::env::var(FRAME_ENV).map_or(FRAME, |f| f.parse().unwrap());
    let options = WorkerOptions::from_env()
        .unwrap()
        .threads(2)
        .max_frame(frame);
    match cluster::serve(&addr, &Registry::new().register::<Heavy>(), options) {
        Ok(_) => std::process::exit(0),
        Err(e) => {
            println!("WORKER ERROR {e}");
            std::process::exit(3);
        }
    }
}

fn start(addr: &str, frame: usize) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            crate::common::exact(module_path!(), "worker_process").as_str(),
            "--ignored",
            "--nocapture",
        ])
        .args(["--test-threads", "1"])
        .env(ADDR_ENV, addr)
        .env(FRAME_ENV, frame.to_string())
        .env_remove(TOKEN_ENV)
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "timed out: {what}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Everything runs in worker processes, and every message of any size crosses in pieces:
/// the job value (1 MiB), states of chunks handed from one process to the other, outputs.
#[test]
fn messages_longer_than_a_frame_cross_in_pieces_both_ways() {
    let exec = Executor::builder()
        .local_workers(0)
        .listen("127.0.0.1:0")
        .max_frame(FRAME)
        .build()
        .unwrap();
    let addr = exec.local_addr().unwrap().to_string();
    let job = heavy(8, 2000);
    let h = exec.submit(job.clone()).unwrap();
    let mut a = start(&addr, FRAME);
    until("the first worker", || h.remote_workers() == 1);
    until("progress", || h.progress().done > 0);
    // A second process joins and the first one is retired: its chunks' states (over a
    // frame each) go back through the coordinator to the second.
    let mut b = start(&addr, FRAME);
    until("the second worker", || h.remote_workers() == 2);
    h.retire_remote(1);
    let value = match h.wait().unwrap() {
        Outcome::Finished(f) => f.into_value(),
        other => panic!("{other:?}"),
    };
    assert!(
        &value[..] == sequential(&job).as_slice(),
        "the bytes differ"
    );
    assert!(exec.peer_errors().is_empty(), "{:?}", exec.peer_errors());
    for w in [&mut a, &mut b] {
        let _ = w.kill();
        let _ = w.wait();
    }
}

/// A worker's output over the coordinator's message limit: the connection is dropped with
/// `MessageTooLarge`, recorded on the executor; the coordinator's memory for it never
/// passed the limit; a local worker finishes the job with the exact value.
#[test]
fn a_message_over_the_limit_is_refused_with_a_typed_error() {
    let exec = Executor::builder()
        .local_workers(0)
        .listen("127.0.0.1:0")
        .max_frame(FRAME)
        .max_message(200 << 10)
        .build()
        .unwrap();
    let addr = exec.local_addr().unwrap().to_string();
    let job = heavy(2, 0);
    let h = exec.submit(job.clone()).unwrap();
    let mut w = start(&addr, FRAME);
    until("the refusal", || !exec.peer_errors().is_empty());
    let errors = exec.peer_errors();
    assert!(
        matches!(
            &*errors[0],
            cluster::Error::MessageTooLarge { limit, .. } if *limit == 200 << 10
        ),
        "{errors:?}"
    );
    let _ = w.wait();
    h.set_local_workers(1);
    let value = match h.wait().unwrap() {
        Outcome::Finished(f) => f.into_value(),
        other => panic!("{other:?}"),
    };
    assert!(
        &value[..] == sequential(&job).as_slice(),
        "the bytes differ"
    );
}
