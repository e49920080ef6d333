//! The worker process's side: dial the coordinator, shake hands, and run chunks on N threads
//! exactly as local workers do, until the job ends or the process is asked to stop.
//!
//! # Membership, as a worker process sees it
//!
//! 1. *Join.* After the handshake the coordinator counts each of the process's threads as a
//!    worker of the job (a *slot*). It sends the job value of the current phase once
//!    (`Phase`), then `Run`s.
//! 2. *Run.* A slot's thread runs its chunk step after step, reading one flag per step, and
//!    sends `Done` with the output when the chunk ends: one message per chunk, never per step.
//!    Messages that arrive together are sent together (one flush for all that are queued).
//! 3. *Adjust.* `Interrupt` and `Capture` name the chunk they are for; the I/O task queues them
//!    for the slot's thread and sets its flag; the thread acts on them at its next adjustment
//!    point if it still runs that chunk, and ignores them otherwise (the chunk ended first and
//!    its `Done` crossed the request on the wire; the coordinator takes the `Done`).
//! 4. *Heartbeats* go both ways every heartbeat period, with each slot's progress. A side that
//!    hears nothing for a lease gives the other up: the coordinator puts the slots' chunks back
//!    with the last state it holds; the worker stops computing and returns an error.
//! 5. *Leave.* A stop request (the stop token, or SIGTERM/SIGINT with
//!    [`WorkerOptions::stop_on_signals`]) sends `Leave`; the coordinator retires the slots,
//!    whose chunks come back as `Yielded` at their next adjustment point, then sends `End`.
//! 6. *End.* `End` (the job finished, was suspended, failed or cancelled, or this process was
//!    retired): the threads stop and [`serve`] returns.
//!
//! Why no chunk is lost or counted twice: a chunk leaves a slot only as `Done` or `Yielded`
//! (at most one per `Run`, since the thread runs one chunk at a time and stops after either),
//! or with the slot's loss, which the coordinator handles as `Lost` in its ledger (the
//! ledger's invariant: a chunk is with exactly one worker or pending). A message of a lost
//! slot that arrives late is refused by the ledger, not merged.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use crossbeam_channel::{Receiver, Sender, TryRecvError};
use crossbeam_utils::CachePadded;
use futures::{SinkExt, StreamExt};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio_util::codec::Framed;

use super::Error;
use super::frame::{self, ToCoordinator, ToWorker};
use super::handshake::{self, Token};
use crate::executor::{Cell, SuspendToken, capture, iterations_run, load_input, steps};
use crate::job::{Chunk, Job};
use crate::metrics::StepStats;

type Runner = fn(&tokio::runtime::Runtime, Session) -> Result<Served, Error>;

/// The job types a worker process can run.
#[derive(Clone, Default)]
pub struct Registry {
    jobs: Vec<(&'static str, Runner)>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.jobs.iter().map(|(n, _)| n))
            .finish()
    }
}

impl Registry {
    /// No job types.
    pub fn new() -> Registry {
        Registry::default()
    }

    /// Adds job type `J` (known by its [`Job::NAME`]).
    pub fn register<J: Job>(mut self) -> Registry {
        if !self.jobs.iter().any(|(n, _)| *n == J::NAME) {
            self.jobs.push((J::NAME, run_job::<J>));
        }
        self
    }

    /// The registered job names.
    pub fn names(&self) -> Vec<String> {
        self.jobs.iter().map(|(n, _)| (*n).to_owned()).collect()
    }
}

/// How a worker process serves.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    threads: usize,
    token: Option<Token>,
    max_frame: usize,
    timeout: Duration,
    stop: Option<SuspendToken>,
    signals: bool,
}

impl Default for WorkerOptions {
    fn default() -> Self {
        WorkerOptions {
            threads: std::thread::available_parallelism().map_or(1, usize::from),
            token: None,
            max_frame: frame::DEFAULT_MAX_FRAME,
            timeout: Duration::from_secs(10),
            stop: None,
            signals: false,
        }
    }
}

impl WorkerOptions {
    /// The defaults: as many threads as the machine's parallelism, the token from
    /// [`TOKEN_ENV`](super::TOKEN_ENV) if set.
    ///
    /// # Errors
    ///
    /// [`Error::Token`] if the variable is set but empty.
    pub fn from_env() -> Result<WorkerOptions, Error> {
        Ok(WorkerOptions {
            token: Token::from_env()?,
            ..WorkerOptions::default()
        })
    }

    /// Compute threads (at least 1).
    pub fn threads(mut self, n: usize) -> Self {
        self.threads = n.max(1);
        self
    }

    /// The shared token.
    pub fn token(mut self, token: Token) -> Self {
        self.token = Some(token);
        self
    }

    /// The maximum frame length (default 64 MiB).
    pub fn max_frame(mut self, bytes: usize) -> Self {
        self.max_frame = bytes;
        self
    }

    /// Time limit for connecting and for the handshake (default 10 s).
    pub fn timeout(mut self, d: Duration) -> Self {
        self.timeout = d;
        self
    }

    /// Leave the job gracefully when `token` fires.
    pub fn stop_on(mut self, token: &SuspendToken) -> Self {
        self.stop = Some(token.clone());
        self
    }

    /// Leave the job gracefully on SIGTERM or SIGINT.
    pub fn stop_on_signals(mut self) -> Self {
        self.signals = true;
        self
    }
}

/// What a worker process did, from [`serve`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Served {
    /// The job's name.
    pub job: String,
    /// Chunks finished here.
    pub chunks_done: u64,
    /// Chunks handed back (retire, leave, suspend).
    pub chunks_yielded: u64,
    /// Whether this process left because it was asked to stop.
    pub left: bool,
    /// From dialling the coordinator to the first chunk received (the join latency), if one
    /// was.
    pub first_run_after: Option<Duration>,
}

/// An established connection, before the job type is known.
pub(crate) struct Session {
    framed: Framed<tokio::net::TcpStream, tokio_util::codec::LengthDelimitedCodec>,
    peer: String,
    job: String,
    heartbeat: Duration,
    lease: Duration,
    options: WorkerOptions,
    dialled: std::time::Instant,
}

/// Serves one job of the coordinator at `addr` as a worker process: connects, shakes hands,
/// runs chunks on `options`' threads, and returns when the job ends, this process is retired,
/// or it leaves after a stop request. Blocks the calling thread.
///
/// # Errors
///
/// [`Error`] for a coordinator that cannot be reached or refuses this worker (wrong token,
/// another protocol version, no job in common), or a connection lost before the end.
pub fn serve(addr: &str, registry: &Registry, options: WorkerOptions) -> Result<Served, Error> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| Error::Address {
            addr: addr.to_owned(),
            source,
        })?;
    let session = rt.block_on(connect(addr, registry, options))?;
    let runner = registry
        .jobs
        .iter()
        .find(|(n, _)| *n == session.job)
        .map(|(_, r)| *r)
        .ok_or_else(|| Error::Malformed {
            peer: session.peer.clone(),
            what: "a welcome",
            reason: format!("job {} was not offered", session.job),
        })?;
    runner(&rt, session)
}

async fn connect(
    addr: &str,
    registry: &Registry,
    options: WorkerOptions,
) -> Result<Session, Error> {
    let timeout = options.timeout;
    let dialled = std::time::Instant::now();
    let address = |source| Error::Address {
        addr: addr.to_owned(),
        source,
    };
    let stream = tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| address(std::io::ErrorKind::TimedOut.into()))?
        .map_err(address)?;
    let _ = stream.set_nodelay(true);
    let peer = stream
        .peer_addr()
        .map_or_else(|_| addr.to_owned(), |a: SocketAddr| a.to_string());
    let mut framed = Framed::new(stream, frame::codec(options.max_frame));
    let threads = u32::try_from(options.threads).unwrap_or(u32::MAX);
    let shake = handshake::worker(
        &mut framed,
        &peer,
        options.token.as_ref(),
        options.max_frame,
        registry.names(),
        threads,
    );
    let welcomed =
        tokio::time::timeout(timeout, shake)
            .await
            .map_err(|_| Error::HandshakeTimeout {
                peer: peer.clone(),
                after: timeout,
            })??;
    Ok(Session {
        framed,
        peer,
        job: welcomed.job,
        heartbeat: Duration::from_millis(welcomed.heartbeat_ms.max(1)),
        lease: Duration::from_millis(welcomed.lease_ms.max(1)),
        options,
        dialled,
    })
}

/// What the I/O task queues for a slot's thread.
enum SlotMsg<J: Job> {
    Run {
        chunk: u64,
        range: std::ops::Range<u64>,
        state: Option<Bytes>,
        job: Arc<J>,
        phase: u64,
    },
    Interrupt(u64),
    Capture(u64),
}

struct Slot<J: Job> {
    tx: Option<Sender<SlotMsg<J>>>,
    cell: Arc<CachePadded<Cell>>,
    thread: Option<std::thread::JoinHandle<(u64, u64)>>,
}

/// The flag bit of a slot: look at the queue.
const ATTENTION: u8 = 1;

fn run_job<J: Job>(rt: &tokio::runtime::Runtime, session: Session) -> Result<Served, Error> {
    let Session {
        framed,
        peer,
        job: name,
        heartbeat,
        lease,
        options,
        dialled,
    } = session;
    let (out_tx, out_rx) = unbounded_channel();
    let input: Arc<OnceLock<Result<J::Input, String>>> = Arc::default();
    let mut slots: Vec<Slot<J>> = Vec::with_capacity(options.threads);
    for slot in 0..options.threads {
        let (tx, rx) = crossbeam_channel::unbounded();
        let cell: Arc<CachePadded<Cell>> = Arc::default();
        let (cell2, out, input) = (Arc::clone(&cell), out_tx.clone(), Arc::clone(&input));
        let thread = std::thread::Builder::new()
            .name(format!("malleable-remote-{slot}"))
            .spawn(move || slot_main::<J>(slot as u32, &rx, &cell2, &out, &input))
            .map_err(|source| Error::Io {
                peer: peer.clone(),
                source,
            })?;
        slots.push(Slot {
            tx: Some(tx),
            cell,
            thread: Some(thread),
        });
    }
    drop(out_tx);
    let io = Io {
        peer: peer.clone(),
        heartbeat,
        lease,
        max_frame: options.max_frame,
        stop: options.stop.clone(),
        signals: options.signals,
        dialled,
        first_run: std::cell::Cell::new(None),
    };
    let ended = rt.block_on(io.run(framed, &mut slots, out_rx));
    // Whatever happened, the threads stop: their queues close and their flags are raised.
    let mut done = (0, 0);
    for s in &mut slots {
        s.tx = None;
        s.cell.flag.fetch_or(ATTENTION, Ordering::Relaxed);
    }
    for s in &mut slots {
        if let Some(t) = s.thread.take() {
            if let Ok((d, y)) = t.join() {
                done.0 += d;
                done.1 += y;
            }
        }
    }
    let left = ended?;
    Ok(Served {
        job: name,
        chunks_done: done.0,
        chunks_yielded: done.1,
        left,
        first_run_after: io.first_run.get(),
    })
}

struct Io {
    peer: String,
    heartbeat: Duration,
    lease: Duration,
    max_frame: usize,
    stop: Option<SuspendToken>,
    signals: bool,
    dialled: std::time::Instant,
    first_run: std::cell::Cell<Option<Duration>>,
}

impl Io {
    /// The I/O loop; returns whether the process left on a stop request.
    async fn run<J: Job>(
        &self,
        framed: Framed<tokio::net::TcpStream, tokio_util::codec::LengthDelimitedCodec>,
        slots: &mut [Slot<J>],
        mut out_rx: UnboundedReceiver<ToCoordinator>,
    ) -> Result<bool, Error> {
        let peer = &self.peer;
        let io_error = |source| Error::Io {
            peer: peer.clone(),
            source,
        };
        let (mut sink, mut stream) = framed.split();
        let mut beat = tokio::time::interval(self.heartbeat);
        let mut job: Option<(u64, Arc<J>)> = None;
        let mut left = false;
        let mut sigterm = self
            .signals
            .then(|| tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok())
            .flatten();
        let mut sigint = self
            .signals
            .then(|| tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).ok())
            .flatten();
        let stop = self.stop.clone();
        loop {
            let stop_now = tokio::select! {
                next = tokio::time::timeout(self.lease, stream.next()) => {
                    let bytes = match next {
                        Err(_) => return Err(Error::LeaseExpired { peer: peer.clone(), after: self.lease }),
                        Ok(None) => return Err(Error::Closed { peer: peer.clone() }),
                        Ok(Some(Err(e))) => return Err(Error::io(peer, e, self.max_frame)),
                        Ok(Some(Ok(b))) => b,
                    };
                    match frame::decode_to_worker(peer, &bytes)? {
                        ToWorker::End => {
                            let _ = sink.close().await;
                            return Ok(left);
                        }
                        msg => {
                            if self.first_run.get().is_none() && matches!(msg, ToWorker::Run { .. }) {
                                self.first_run.set(Some(self.dialled.elapsed()));
                            }
                            dispatch(peer, msg, slots, &mut job)?;
                        }
                    }
                    false
                }
                msg = out_rx.recv() => {
                    let Some(msg) = msg else { return Ok(left) };
                    sink.feed(frame::encode(&msg)).await.map_err(io_error)?;
                    while let Ok(m) = out_rx.try_recv() {
                        sink.feed(frame::encode(&m)).await.map_err(io_error)?;
                    }
                    sink.flush().await.map_err(io_error)?;
                    false
                }
                _ = beat.tick() => {
                    let progress = slots.iter().map(|s| s.cell.progress.load(Ordering::Relaxed)).collect();
                    sink.send(frame::encode(&ToCoordinator::Heartbeat { progress })).await.map_err(io_error)?;
                    false
                }
                _ = async { stop.as_ref().expect("guarded").fired().await }, if stop.is_some() && !left => true,
                _ = async { sigterm.as_mut().expect("guarded").recv().await }, if sigterm.is_some() && !left => true,
                _ = async { sigint.as_mut().expect("guarded").recv().await }, if sigint.is_some() && !left => true,
            };
            if stop_now {
                left = true;
                sink.send(frame::encode(&ToCoordinator::Leave))
                    .await
                    .map_err(io_error)?;
            }
        }
    }
}

/// Hands a coordinator's message to the slot it is for.
fn dispatch<J: Job>(
    peer: &str,
    msg: ToWorker,
    slots: &mut [Slot<J>],
    job: &mut Option<(u64, Arc<J>)>,
) -> Result<(), Error> {
    let bad = |reason: String| Error::Malformed {
        peer: peer.to_owned(),
        what: "a message to a worker",
        reason,
    };
    let slot_of = |slot: u32| {
        slots
            .get(slot as usize)
            .filter(|s| s.tx.is_some())
            .ok_or_else(|| bad(format!("slot {slot} is not a live slot")))
    };
    match msg {
        ToWorker::Phase { phase, job: bytes } => {
            let value: J =
                crate::executor::decode("the job", &bytes).map_err(|e| bad(e.to_string()))?;
            *job = Some((phase, Arc::new(value)));
        }
        ToWorker::Run {
            slot,
            chunk,
            start,
            end,
            state,
        } => {
            let Some((phase, j)) = job.as_ref() else {
                return Err(bad("a run before the job value".into()));
            };
            if start > end {
                return Err(bad(format!("an empty range {start}..{end}")));
            }
            let s = slot_of(slot)?;
            let _ = s.tx.as_ref().expect("live").send(SlotMsg::Run {
                chunk,
                range: start..end,
                state,
                job: Arc::clone(j),
                phase: *phase,
            });
        }
        ToWorker::Interrupt { slot, chunk } | ToWorker::Capture { slot, chunk } => {
            let capture = matches!(msg, ToWorker::Capture { .. });
            let s = slot_of(slot)?;
            let m = if capture {
                SlotMsg::Capture(chunk)
            } else {
                SlotMsg::Interrupt(chunk)
            };
            let _ = s.tx.as_ref().expect("live").send(m);
            // After the send: the thread that sees the flag finds the message.
            s.cell.flag.fetch_or(ATTENTION, Ordering::Relaxed);
        }
        ToWorker::Release { slot } => {
            slot_of(slot)?;
            // Closing its queue ends the (idle) thread.
            slots[slot as usize].tx = None;
        }
        ToWorker::Heartbeat => {}
        ToWorker::End => {}
    }
    Ok(())
}

/// A slot's thread: run the chunks the coordinator sends, one at a time. Returns the chunks
/// finished and handed back.
fn slot_main<J: Job>(
    slot: u32,
    rx: &Receiver<SlotMsg<J>>,
    cell: &CachePadded<Cell>,
    out: &UnboundedSender<ToCoordinator>,
    input: &OnceLock<Result<J::Input, String>>,
) -> (u64, u64) {
    let mut stats = StepStats::new(J::NAME);
    let (mut done, mut yielded) = (0, 0);
    while let Ok(msg) = rx.recv() {
        let SlotMsg::Run {
            chunk,
            range,
            state,
            job,
            phase,
        } = msg
        else {
            // A request for a chunk that already ended here: its `Done` crossed it.
            continue;
        };
        let failed = |message: String| ToCoordinator::Failed {
            slot,
            chunk,
            message,
        };
        let input = input.get_or_init(|| load_input(&*job));
        let input = match input {
            Ok(i) => i,
            Err(e) => {
                let _ = out.send(failed(format!("the input did not load: {e}")));
                continue;
            }
        };
        let fresh = state.is_none();
        let state: Option<J::Chunk> = match state
            .map(|b| crate::executor::decode("a chunk state", &b))
            .transpose()
        {
            Ok(s) => s,
            Err(e) => {
                let _ = out.send(failed(e.to_string()));
                continue;
            }
        };
        cell.progress.store(0, Ordering::Relaxed);
        let site = crate::Site::Chunk { phase, chunk };
        let ran = crate::executor::catch(site, J::NAME, || {
            let mut c = state.unwrap_or_else(|| job.chunk(range.clone()));
            let before = c.iterations_done().unwrap_or(0);
            let mut gone = false;
            let output = loop {
                let output = steps(&mut c, &job, input, cell, &mut stats);
                if output.is_some() {
                    break output;
                }
                cell.flag.store(0, Ordering::Relaxed);
                let (mut interrupt, mut capture_now) = (false, false);
                loop {
                    match rx.try_recv() {
                        Ok(SlotMsg::Interrupt(c)) if c == chunk => interrupt = true,
                        Ok(SlotMsg::Capture(c)) if c == chunk => capture_now = true,
                        Ok(_) => {}
                        Err(TryRecvError::Empty) => break,
                        Err(TryRecvError::Disconnected) => {
                            gone = true;
                            break;
                        }
                    }
                }
                if gone || interrupt {
                    break None;
                }
                if capture_now {
                    capture(&c, &mut stats, |bytes| {
                        let _ = out.send(match bytes {
                            Ok(b) => ToCoordinator::Captured {
                                slot,
                                chunk,
                                state: b.into(),
                            },
                            Err(e) => failed(e.to_string()),
                        });
                    });
                }
            };
            let iterations = iterations_run(&c, before, fresh, output.is_some(), &range);
            (c, output, iterations, gone)
        });
        let busy_ns = stats.busy().as_nanos() as u64;
        match ran {
            Err(e) => {
                let _ = out.send(failed(e.to_string()));
            }
            Ok((_, _, _, true)) => return (done, yielded),
            Ok((c, output, iterations, false)) => {
                stats.flush(output.is_some());
                let msg = match output {
                    Some(output) => match crate::executor::encode("a chunk output", &output) {
                        Ok(b) => {
                            done += 1;
                            ToCoordinator::Done {
                                slot,
                                chunk,
                                output: b.into(),
                                iterations,
                                busy_ns,
                            }
                        }
                        Err(e) => failed(e.to_string()),
                    },
                    None => match crate::executor::encode("a chunk state", &c) {
                        Ok(b) => {
                            yielded += 1;
                            ToCoordinator::Yielded {
                                slot,
                                chunk,
                                state: b.into(),
                                iterations,
                                busy_ns,
                            }
                        }
                        Err(e) => failed(e.to_string()),
                    },
                };
                let _ = out.send(msg);
            }
        }
    }
    (done, yielded)
}
