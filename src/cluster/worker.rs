//! The worker process's side: dial the coordinator, shake hands, and run chunks on N threads
//! exactly as local workers do, until the job ends or the process is asked to stop.
//!
//! # Membership, as a worker process sees it
//!
//! 1. *Join.* After the handshake the coordinator counts each of the process's threads as
//!    [`SLOTS_PER_THREAD`] workers of the job (*slots*). It sends the job value of the current
//!    phase once (`Phase`), then `Run`s, each for a slot.
//! 2. *Run.* A thread runs its slots' chunks one at a time, in the order they came, step after
//!    step, reading one flag per step, and sends `Done` with the output when a chunk ends: one
//!    message per chunk, never per step. While it runs one chunk, the next waits in its queue,
//!    so it never idles for a round trip. Messages that arrive together are sent together (one
//!    flush for all that are queued).
//! 3. *Adjust.* `Interrupt` and `Capture` name the slot and chunk they are for; the I/O task
//!    queues them for the thread and sets its flag; the thread acts on them at its next
//!    adjustment point: for the chunk it runs, it hands the chunk back (`Yielded`) or sends
//!    its state (`Captured`); for a chunk still waiting, it does so at once with the state the
//!    chunk came with (from scratch: a new chunk's state); for a chunk it no longer holds it
//!    does nothing (the chunk ended first and its `Done` crossed the request on the wire; the
//!    coordinator takes the `Done`).
//! 4. *Heartbeats* go both ways every heartbeat period, with each slot's progress. A side that
//!    hears nothing for a lease gives the other up: the coordinator puts the slots' chunks back
//!    with the last state it holds; the worker stops computing and returns an error.
//! 5. *Leave.* A stop request (the stop token, or SIGTERM/SIGINT with
//!    [`WorkerOptions::stop_on_signals`]) sends `Leave`; the coordinator retires the slots,
//!    whose chunks come back as `Yielded` at their next adjustment point, then sends `End`.
//! 6. *End.* `End` (the job finished, was suspended, failed or cancelled, or this process was
//!    retired): the threads stop and [`serve`] returns.
//! 7. *Snapshot parts.* Once a snapshot is committed, the coordinator offers the store
//!    (`Store`: its URL without credentials, non-secret options, and that snapshot as a
//!    witness). The I/O task opens the URL with this process's own environment (credentials
//!    stay where they are) and reads the witness's manifest; if it is there with the same
//!    creation time, the store is the coordinator's, and from then on a state captured for a
//!    snapshot is written to the epoch folder the `Capture` names and reported as
//!    `CapturedPart` (its key, size and checksum) instead of crossing the wire. Until then, or
//!    if the store cannot be reached from here (another disk behind the same `file://` path,
//!    no credentials, a write that fails), states go to the coordinator as `Captured`, which
//!    writes them. Either way the coordinator's writer lists the part in the manifest and is
//!    the only one to commit.
//!
//! Why no chunk is lost or counted twice: a chunk leaves a slot only as `Done` or `Yielded`
//! (at most one per `Run`: a `Run` is in the thread's queue or running until exactly one of
//! them is sent, and a request for a chunk the thread no longer holds is ignored),
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
use super::frame::{self, SLOTS_PER_THREAD, ToCoordinator, ToWorker};
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
    /// Snapshot parts this process wrote to the job's store itself (the others went to the
    /// coordinator).
    pub parts_written: u64,
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

/// A chunk to run in a slot.
struct Run<J: Job> {
    slot: u32,
    chunk: u64,
    range: std::ops::Range<u64>,
    state: Option<Bytes>,
    job: Arc<J>,
    phase: u64,
}

/// What the I/O task queues for a thread.
enum SlotMsg<J: Job> {
    Run(Run<J>),
    Interrupt { slot: u32, chunk: u64 },
    Capture { slot: u32, chunk: u64 },
}

/// A compute thread and its slots.
struct Thread<J: Job> {
    tx: Option<Sender<SlotMsg<J>>>,
    cell: Arc<CachePadded<Cell>>,
    thread: Option<std::thread::JoinHandle<(u64, u64)>>,
    /// Which of its slots are still workers of the job.
    live: [bool; SLOTS_PER_THREAD as usize],
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
    let mut threads: Vec<Thread<J>> = Vec::with_capacity(options.threads);
    for index in 0..options.threads {
        let (tx, rx) = crossbeam_channel::unbounded();
        let cell: Arc<CachePadded<Cell>> = Arc::default();
        let (cell2, out, input) = (Arc::clone(&cell), out_tx.clone(), Arc::clone(&input));
        let thread = std::thread::Builder::new()
            .name(format!("malleable-remote-{index}"))
            .spawn(move || thread_main::<J>(&rx, &cell2, &out, &input))
            .map_err(|source| Error::Io {
                peer: peer.clone(),
                source,
            })?;
        threads.push(Thread {
            tx: Some(tx),
            cell,
            thread: Some(thread),
            live: [true; SLOTS_PER_THREAD as usize],
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
        parts_written: std::cell::Cell::new(0),
    };
    let ended = rt.block_on(io.run(framed, &mut threads, out_rx));
    // Whatever happened, the threads stop: their queues close and their flags are raised.
    let mut done = (0, 0);
    for s in &mut threads {
        s.tx = None;
        s.cell.flag.fetch_or(ATTENTION, Ordering::Relaxed);
    }
    for s in &mut threads {
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
        parts_written: io.parts_written.get(),
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
    parts_written: std::cell::Cell<u64>,
}

/// What background tasks of the I/O loop report.
enum Background {
    /// The store offered by the coordinator was checked: usable, or why not.
    Store(Result<(crate::snapshot::Store, String), String>),
    /// A captured state went to the store (`CapturedPart`), or could not and goes to the
    /// coordinator instead (`Captured`).
    Part(ToCoordinator),
}

/// Parts this process writes to the job's store itself (step 7 above).
#[derive(Default)]
struct Parts {
    /// The store and job id, once the witness was read there.
    store: Option<(crate::snapshot::Store, String)>,
    /// A check of an offered store is under way.
    checking: bool,
    /// The epoch folder of each requested capture.
    folders: std::collections::HashMap<(u32, u64), u64>,
}

impl Parts {
    /// Checks an offered store in the background: it is the coordinator's if the witness
    /// snapshot is there with the same creation time.
    fn offered(&mut self, msg: ToWorker, tx: &UnboundedSender<Background>) {
        let ToWorker::Store {
            url,
            options,
            job_id,
            epoch,
            created_unix_ms,
        } = msg
        else {
            return;
        };
        if self.store.is_some() || self.checking {
            return;
        }
        self.checking = true;
        let tx = tx.clone();
        tokio::spawn(async move {
            let checked = async {
                let store =
                    crate::snapshot::Store::open_with(&url, options).map_err(|e| e.to_string())?;
                let id = crate::snapshot::SnapshotId::new(job_id.clone(), epoch);
                let manifest = store.manifest(&id).await.map_err(|e| e.to_string())?;
                if manifest.created_unix_ms != created_unix_ms {
                    return Err(format!(
                        "snapshot {id} in {url} is not the coordinator's (created at another time)"
                    ));
                }
                Ok((store, job_id))
            };
            let _ = tx.send(Background::Store(checked.await));
        });
    }

    /// Routes a message of a thread: a captured state that this process can store goes up
    /// in the background; anything else goes to the coordinator now.
    fn route(
        &mut self,
        msg: ToCoordinator,
        phase: Option<u64>,
        tx: &UnboundedSender<Background>,
    ) -> Option<ToCoordinator> {
        let (slot, chunk) = match &msg {
            ToCoordinator::Captured { slot, chunk, .. }
            | ToCoordinator::Done { slot, chunk, .. }
            | ToCoordinator::Yielded { slot, chunk, .. }
            | ToCoordinator::Failed { slot, chunk, .. } => (*slot, *chunk),
            _ => return Some(msg),
        };
        let folder = self.folders.remove(&(slot, chunk));
        let (
            ToCoordinator::Captured { state, .. },
            Some(folder),
            Some((store, job_id)),
            Some(phase),
        ) = (&msg, folder, &self.store, phase)
        else {
            return Some(msg);
        };
        let (store, job_id, state, tx) = (store.clone(), job_id.clone(), state.clone(), tx.clone());
        tokio::spawn(async move {
            let reply = match store
                .put_part(&job_id, folder, phase, chunk, state.clone())
                .await
            {
                Ok(part) => ToCoordinator::CapturedPart { slot, chunk, part },
                Err(e) => {
                    tracing::warn!(error = %e, "a part could not be stored; it goes to the coordinator");
                    ToCoordinator::Captured { slot, chunk, state }
                }
            };
            let _ = tx.send(Background::Part(reply));
        });
        None
    }
}

impl Io {
    /// The I/O loop; returns whether the process left on a stop request.
    async fn run<J: Job>(
        &self,
        framed: Framed<tokio::net::TcpStream, tokio_util::codec::LengthDelimitedCodec>,
        threads: &mut [Thread<J>],
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
        let mut parts = Parts::default();
        let (bg_tx, mut bg_rx) = unbounded_channel();
        loop {
            let phase = job.as_ref().map(|(p, _)| *p);
            let stop_now = tokio::select! {
                next = tokio::time::timeout(self.lease, stream.next()) => {
                    let bytes = match next {
                        Err(_) => return Err(Error::LeaseExpired { peer: peer.clone(), after: self.lease }),
                        Ok(None) => return Err(Error::Closed { peer: peer.clone() }),
                        Ok(Some(Err(e))) => return Err(Error::io(peer, e, self.max_frame)),
                        Ok(Some(Ok(b))) => b,
                    };
                    match frame::decode_frame_to_worker(peer, bytes.freeze())? {
                        ToWorker::End => {
                            let _ = sink.close().await;
                            return Ok(left);
                        }
                        msg @ ToWorker::Store { .. } => parts.offered(msg, &bg_tx),
                        msg => {
                            if self.first_run.get().is_none() && matches!(msg, ToWorker::Run { .. }) {
                                self.first_run.set(Some(self.dialled.elapsed()));
                            }
                            if let ToWorker::Capture { slot, chunk, folder } = msg {
                                parts.folders.insert((slot, chunk), folder);
                            }
                            dispatch(peer, msg, threads, &mut job)?;
                        }
                    }
                    false
                }
                msg = out_rx.recv() => {
                    let Some(msg) = msg else { return Ok(left) };
                    let mut next = Some(msg);
                    while let Some(msg) = next {
                        if let Some(m) = parts.route(msg, phase, &bg_tx) {
                            sink.feed(frame::encode(&m)).await.map_err(io_error)?;
                        }
                        next = out_rx.try_recv().ok();
                    }
                    sink.flush().await.map_err(io_error)?;
                    false
                }
                Some(done) = bg_rx.recv() => {
                    match done {
                        Background::Store(Ok(store)) => {
                            tracing::info!(store = store.0.url(), "this worker process writes its own snapshot parts");
                            parts.store = Some(store);
                            parts.checking = false;
                        }
                        Background::Store(Err(why)) => {
                            tracing::info!(why, "snapshot parts go to the coordinator");
                            parts.checking = false;
                        }
                        Background::Part(msg) => {
                            if matches!(msg, ToCoordinator::CapturedPart { .. }) {
                                self.parts_written.set(self.parts_written.get() + 1);
                            } else {
                                parts.store = None;
                            }
                            sink.send(frame::encode(&msg)).await.map_err(io_error)?;
                        }
                    }
                    false
                }
                _ = beat.tick() => {
                    let progress = threads.iter().map(|s| s.cell.progress.load(Ordering::Relaxed)).collect();
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

/// Hands a coordinator's message to the thread of the slot it is for.
fn dispatch<J: Job>(
    peer: &str,
    msg: ToWorker,
    threads: &mut [Thread<J>],
    job: &mut Option<(u64, Arc<J>)>,
) -> Result<(), Error> {
    let bad = |reason: String| Error::Malformed {
        peer: peer.to_owned(),
        what: "a message to a worker",
        reason,
    };
    // The thread of a live slot, and the slot's index in it.
    let thread_of = |threads: &[Thread<J>], slot: u32| {
        let (t, i) = (
            (slot / SLOTS_PER_THREAD) as usize,
            (slot % SLOTS_PER_THREAD) as usize,
        );
        threads
            .get(t)
            .filter(|th| th.tx.is_some() && th.live[i])
            .map(|_| (t, i))
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
            let (t, _) = thread_of(threads, slot)?;
            let _ = threads[t]
                .tx
                .as_ref()
                .expect("live")
                .send(SlotMsg::Run(Run {
                    slot,
                    chunk,
                    range: start..end,
                    state,
                    job: Arc::clone(j),
                    phase: *phase,
                }));
        }
        ToWorker::Interrupt { slot, chunk } | ToWorker::Capture { slot, chunk, .. } => {
            let capture = matches!(msg, ToWorker::Capture { .. });
            let (t, _) = thread_of(threads, slot)?;
            let th = &threads[t];
            let m = if capture {
                SlotMsg::Capture { slot, chunk }
            } else {
                SlotMsg::Interrupt { slot, chunk }
            };
            let _ = th.tx.as_ref().expect("live").send(m);
            // After the send, with `Release`: the thread that sees the flag (and fences with
            // `Acquire`) finds the message.
            th.cell.flag.fetch_or(ATTENTION, Ordering::Release);
        }
        ToWorker::Release { slot } => {
            let (t, i) = thread_of(threads, slot)?;
            let th = &mut threads[t];
            th.live[i] = false;
            if th.live.iter().all(|l| !l) {
                // Closing its queue ends the (idle) thread.
                th.tx = None;
            }
        }
        ToWorker::Heartbeat | ToWorker::End | ToWorker::Store { .. } => {}
    }
    Ok(())
}

/// What a thread was asked about the chunk it runs, at an adjustment point.
#[derive(Default)]
struct Asked {
    interrupt: bool,
    capture: bool,
    /// The queue closed: the job ended for this process.
    gone: bool,
}

/// A compute thread: runs its slots' chunks one at a time, in the order they came. Returns
/// the chunks finished and handed back.
fn thread_main<J: Job>(
    rx: &Receiver<SlotMsg<J>>,
    cell: &CachePadded<Cell>,
    out: &UnboundedSender<ToCoordinator>,
    input: &OnceLock<Result<J::Input, String>>,
) -> (u64, u64) {
    let mut stats = StepStats::new(J::NAME);
    let mut waiting: std::collections::VecDeque<Run<J>> = std::collections::VecDeque::new();
    let mut counts = (0, 0);
    loop {
        cell.flag.store(0, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Acquire);
        if take_messages(rx, &mut waiting, None, out, &mut counts.1).gone {
            return counts;
        }
        let run = match waiting.pop_front() {
            Some(run) => run,
            None => match rx.recv() {
                Ok(SlotMsg::Run(run)) => run,
                // A request for a chunk that already ended here: its `Done` crossed it.
                Ok(_) => continue,
                Err(_) => return counts,
            },
        };
        if run_chunk(
            run,
            rx,
            &mut waiting,
            cell,
            out,
            input,
            &mut stats,
            &mut counts,
        ) {
            return counts;
        }
    }
}

/// Takes the messages queued for a thread: runs join `waiting`; a request for a waiting chunk
/// is answered at once (it has the state it came with); one for `running` (slot, chunk) is
/// returned; others are for chunks that ended here and are ignored.
fn take_messages<J: Job>(
    rx: &Receiver<SlotMsg<J>>,
    waiting: &mut std::collections::VecDeque<Run<J>>,
    running: Option<(u32, u64)>,
    out: &UnboundedSender<ToCoordinator>,
    yielded: &mut u64,
) -> Asked {
    let mut asked = Asked::default();
    loop {
        let (slot, chunk, capture) = match rx.try_recv() {
            Ok(SlotMsg::Run(run)) => {
                waiting.push_back(run);
                continue;
            }
            Ok(SlotMsg::Interrupt { slot, chunk }) => (slot, chunk, false),
            Ok(SlotMsg::Capture { slot, chunk }) => (slot, chunk, true),
            Err(TryRecvError::Empty) => return asked,
            Err(TryRecvError::Disconnected) => {
                asked.gone = true;
                return asked;
            }
        };
        if running == Some((slot, chunk)) {
            if capture {
                asked.capture = true;
            } else {
                asked.interrupt = true;
            }
            continue;
        }
        let Some(at) = waiting
            .iter()
            .position(|r| r.slot == slot && r.chunk == chunk)
        else {
            continue;
        };
        let state = match waiting[at].state.clone() {
            Some(bytes) => Ok(bytes),
            None => {
                let r = &waiting[at];
                crate::executor::encode("a chunk state", &r.job.chunk(r.range.clone()))
                    .map(Bytes::from)
            }
        };
        let msg = match state {
            Err(e) => ToCoordinator::Failed {
                slot,
                chunk,
                message: e.to_string(),
            },
            Ok(state) if capture => ToCoordinator::Captured { slot, chunk, state },
            Ok(state) => {
                waiting.remove(at);
                *yielded += 1;
                ToCoordinator::Yielded {
                    slot,
                    chunk,
                    state,
                    iterations: 0,
                    busy_ns: 0,
                }
            }
        };
        let _ = out.send(msg);
    }
}

/// Runs one chunk until it ends, is handed back, or the job ends for this process (then
/// returns true).
#[allow(clippy::too_many_arguments)]
fn run_chunk<J: Job>(
    run: Run<J>,
    rx: &Receiver<SlotMsg<J>>,
    waiting: &mut std::collections::VecDeque<Run<J>>,
    cell: &CachePadded<Cell>,
    out: &UnboundedSender<ToCoordinator>,
    input: &OnceLock<Result<J::Input, String>>,
    stats: &mut StepStats,
    (done, yielded): &mut (u64, u64),
) -> bool {
    let Run {
        slot,
        chunk,
        range,
        state,
        job,
        phase,
    } = run;
    let failed = |message: String| ToCoordinator::Failed {
        slot,
        chunk,
        message,
    };
    let input = match input.get_or_init(|| load_input(&*job)) {
        Ok(i) => i,
        Err(e) => {
            let _ = out.send(failed(format!("the input did not load: {e}")));
            return false;
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
            return false;
        }
    };
    cell.progress.store(0, Ordering::Relaxed);
    let site = crate::Site::Chunk { phase, chunk };
    let ran = crate::executor::catch(site, J::NAME, || {
        let mut c = state.unwrap_or_else(|| job.chunk(range.clone()));
        let before = c.iterations_done().unwrap_or(0);
        let mut gone = false;
        let output = loop {
            let output = steps(&mut c, &job, input, cell, stats);
            if output.is_some() {
                break output;
            }
            cell.flag.store(0, Ordering::Relaxed);
            std::sync::atomic::fence(Ordering::Acquire);
            let asked = take_messages(rx, waiting, Some((slot, chunk)), out, yielded);
            if asked.gone || asked.interrupt {
                gone = asked.gone;
                break None;
            }
            if asked.capture {
                capture(&c, stats, |bytes| {
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
    cell.progress.store(0, Ordering::Relaxed);
    let busy_ns = stats.busy().as_nanos() as u64;
    let (c, output, iterations) = match ran {
        Err(e) => {
            let _ = out.send(failed(e.to_string()));
            return false;
        }
        Ok((_, _, _, true)) => return true,
        Ok((c, output, iterations, false)) => (c, output, iterations),
    };
    stats.flush(output.is_some());
    let msg = match output {
        Some(output) => match crate::executor::encode("a chunk output", &output) {
            Ok(b) => {
                *done += 1;
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
                *yielded += 1;
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
    false
}
