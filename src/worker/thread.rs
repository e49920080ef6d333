//! A compute thread of a worker process and its slots: a host of the chunk runner whose
//! requests come through a queue (the I/O task queues a message, then raises [`MAIL`]) and
//! whose results go to the I/O task as messages to the coordinator.
//!
//! A thread runs its slots' chunks one at a time, in the order they came. At each adjustment
//! point where the flag is raised it takes its queue: new chunks join the waiting ones; a
//! request for a waiting chunk is answered at once with the state that chunk came with; a
//! request for the running chunk is the runner's answer (stop, capture); a request for a
//! chunk that is no longer here is dropped (its `Done` crossed the request on the wire).

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;
use crossbeam_channel::{Receiver, Sender, TryRecvError};
use tokio::sync::mpsc::UnboundedSender;

use crate::codec;
use crate::error::{Error, Site, chain_texts};
use crate::job::Job;
use crate::metrics::StepStats;
use crate::run::{self, Assignment, Attend, Cell, Held, Host, Inputs, MAIL, Ran};
use crate::wire::frame::{Failure, Halo, SLOTS_PER_THREAD, ToCoordinator};

use super::live::Live;

/// A chunk to run in a slot.
pub(super) struct Run<J: Job> {
    pub(super) slot: u32,
    pub(super) chunk: u64,
    pub(super) range: std::ops::Range<u64>,
    pub(super) state: Option<Bytes>,
    /// Run the owned partition this process holds for `chunk` (in [`HeldParts`]).
    pub(super) held: bool,
    pub(super) job: Arc<J>,
    pub(super) phase: u64,
    /// The job's number of chunks.
    pub(super) chunks: u64,
    /// When the `Run` reached the thread's queue: the thread's time on a chunk starts then,
    /// or when the thread ended its previous chunk if that was later (see [`main`]).
    pub(super) queued: std::time::Instant,
}

/// What the threads and the I/O task of a process share: the owned partitions it holds
/// between their runs, and the halos they exported, live.
pub(super) type HeldParts<C> = Arc<HeldState<C>>;

/// See [`HeldParts`].
pub(super) struct HeldState<C> {
    /// By chunk: a partition stays here after its chunk's `Done`, gets its halos (`Begin`),
    /// and runs here again in the next phase unless the coordinator asks for it
    /// (`Surrender`).
    parts: std::sync::Mutex<std::collections::HashMap<u64, C>>,
    /// The pieces their runs exported, beside their bytes (`live.rs`).
    live: std::sync::Mutex<Live>,
}

impl<C> Default for HeldState<C> {
    fn default() -> Self {
        HeldState {
            parts: std::sync::Mutex::default(),
            live: std::sync::Mutex::default(),
        }
    }
}

impl<C> HeldState<C> {
    /// The halos exported here, live, locked (no user code runs under the lock).
    pub(super) fn live(&self) -> std::sync::MutexGuard<'_, Live> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The held partitions, locked (a poisoned lock still holds consistent partitions: no user
/// code runs under it but `begin_phase`, whose panic is caught).
pub(super) fn lock<C>(
    held: &HeldParts<C>,
) -> std::sync::MutexGuard<'_, std::collections::HashMap<u64, C>> {
    held.parts.lock().unwrap_or_else(|p| p.into_inner())
}

/// What the I/O task queues for a thread.
pub(super) enum SlotMsg<J: Job> {
    Run(Run<J>),
    Interrupt {
        slot: u32,
        chunk: u64,
    },
    Capture {
        slot: u32,
        chunk: u64,
    },
    /// `ToWorker::Abandon`: stop and drop, answer `Abandoned`.
    Abandon {
        slot: u32,
        chunk: u64,
    },
}

/// A compute thread, as the I/O task sees it.
pub(super) struct Thread<J: Job> {
    pub(super) tx: Option<Sender<SlotMsg<J>>>,
    pub(super) cell: Arc<Cell>,
    thread: Option<std::thread::JoinHandle<(u64, u64)>>,
}

impl<J: Job> Thread<J> {
    pub(super) fn new(
        tx: Sender<SlotMsg<J>>,
        cell: Arc<Cell>,
        thread: std::thread::JoinHandle<(u64, u64)>,
    ) -> Thread<J> {
        Thread {
            tx: Some(tx),
            cell,
            thread: Some(thread),
        }
    }

    /// Closes the thread's queue and raises its flag: it stops at its next adjustment point
    /// without reporting.
    pub(super) fn stop(&mut self) {
        self.tx = None;
        self.cell.raise(MAIL);
    }

    /// Waits for the thread; the chunks it finished and handed back.
    pub(super) fn join(&mut self) -> Option<(u64, u64)> {
        self.thread.take().and_then(|t| t.join().ok())
    }
}

/// A thread's queue and the chunks waiting in it.
struct Queue<J: Job> {
    rx: Receiver<SlotMsg<J>>,
    out: UnboundedSender<ToCoordinator>,
    held: HeldParts<J::Chunk>,
    waiting: VecDeque<Run<J>>,
    /// The queue closed: the job ended for this process.
    gone: bool,
    done: u64,
    yielded: u64,
    /// The running chunk was abandoned (a rollback): it stops, and nothing of it goes back.
    abandoned: bool,
}

/// What a thread was asked about the chunk it runs.
#[derive(Default)]
struct Asked {
    interrupt: bool,
    capture: bool,
}

impl<J: Job> Queue<J> {
    /// An `Abandon` of `chunk` in `slot`: the running chunk stops at its next adjustment
    /// point (`abandoned`), one that waits to run is dropped at once with its partition;
    /// either is answered by `Abandoned`. One that ended here already was answered by its
    /// `Done`.
    fn abandon(&mut self, running: Option<(u32, u64)>, slot: u32, chunk: u64) {
        if running == Some((slot, chunk)) {
            self.abandoned = true;
            return;
        }
        let Some(at) = self
            .waiting
            .iter()
            .position(|r| r.slot == slot && r.chunk == chunk)
        else {
            return;
        };
        if let Some(r) = self.waiting.remove(at) {
            if r.held {
                lock(&self.held).remove(&chunk);
            }
        }
        let _ = self.out.send(ToCoordinator::Abandoned { slot, chunk });
    }

    /// Takes the queued messages: runs join `waiting`; a request for a waiting chunk is
    /// answered at once (it has the state it came with); one for `running` (slot, chunk) is
    /// returned; others are for chunks that ended here and are dropped.
    fn take(&mut self, running: Option<(u32, u64)>) -> Asked {
        let mut asked = Asked::default();
        loop {
            let (slot, chunk, capture) = match self.rx.try_recv() {
                Ok(SlotMsg::Run(run)) => {
                    self.waiting.push_back(run);
                    continue;
                }
                Ok(SlotMsg::Interrupt { slot, chunk }) => (slot, chunk, false),
                Ok(SlotMsg::Capture { slot, chunk }) => (slot, chunk, true),
                Ok(SlotMsg::Abandon { slot, chunk }) => {
                    self.abandon(running, slot, chunk);
                    continue;
                }
                Err(TryRecvError::Empty) => return asked,
                Err(TryRecvError::Disconnected) => {
                    self.gone = true;
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
            let Some(at) = self
                .waiting
                .iter()
                .position(|r| r.slot == slot && r.chunk == chunk)
            else {
                continue;
            };
            let r = &self.waiting[at];
            let state = match (&r.state, r.held) {
                (Some(bytes), _) => Ok(bytes.clone()),
                // A held partition that waits to run: its state is the one held here.
                (None, true) => {
                    let held = lock(&self.held);
                    match held.get(&chunk) {
                        Some(part) => codec::encode("a chunk state", part).map(Bytes::from),
                        None => {
                            tracing::warn!(
                                chunk,
                                capture,
                                "a request for a held partition that waits to run, which this process does not hold"
                            );
                            let _ = self.out.send(ToCoordinator::Missing { chunk });
                            continue;
                        }
                    }
                }
                (None, false) => {
                    codec::encode("a chunk state", &r.job.chunk(r.range.clone())).map(Bytes::from)
                }
            };
            let msg = match state {
                Err(e) => ToCoordinator::Failed {
                    slot,
                    chunk,
                    failure: failure_of(e.into()),
                },
                Ok(state) if capture => ToCoordinator::Captured { slot, chunk, state },
                Ok(state) => {
                    if let Some(r) = self.waiting.remove(at) {
                        if r.held {
                            // Handed back: the coordinator holds it now.
                            lock(&self.held).remove(&chunk);
                        }
                    }
                    self.yielded += 1;
                    ToCoordinator::Yielded {
                        slot,
                        chunk,
                        state,
                        iterations: 0,
                        busy_ns: 0,
                    }
                }
            };
            let _ = self.out.send(msg);
        }
    }
}

/// The runner's host for one chunk of a slot.
struct SlotHost<'q, J: Job> {
    queue: &'q mut Queue<J>,
    slot: u32,
    chunk: u64,
}

impl<J: Job> Host for SlotHost<'_, J> {
    fn attend(&mut self, cell: &Cell) -> Attend {
        cell.take();
        let asked = self.queue.take(Some((self.slot, self.chunk)));
        if self.queue.gone || asked.interrupt || self.queue.abandoned {
            Attend::Stop
        } else if asked.capture {
            Attend::Capture
        } else {
            Attend::Continue
        }
    }

    fn captured(&mut self, state: Result<Vec<u8>, codec::Error>) {
        let (slot, chunk) = (self.slot, self.chunk);
        let _ = self.queue.out.send(match state {
            Ok(b) => ToCoordinator::Captured {
                slot,
                chunk,
                state: b.into(),
            },
            Err(e) => ToCoordinator::Failed {
                slot,
                chunk,
                failure: failure_of(e.into()),
            },
        });
    }
}

/// A compute thread: runs its slots' chunks one at a time, in the order they came, until its
/// queue closes. Returns the chunks finished and handed back.
///
/// A slot reports as busy ([`ToCoordinator::Done`]'s `busy_ns`) the thread's time on its
/// chunk (from the chunk reaching the thread, or the thread ending its previous chunk if that
/// came later, to its end: state decoding and output encoding included) times
/// [`SLOTS_PER_THREAD`]: each slot measures a quarter of its thread's speed, and a process's
/// slots add up to its threads, however many of them hold a chunk.
pub(super) fn main<J: Job>(
    rx: &Receiver<SlotMsg<J>>,
    cell: &Cell,
    out: &UnboundedSender<ToCoordinator>,
    inputs: &Inputs<J>,
    held: &HeldParts<J::Chunk>,
) -> (u64, u64) {
    let mut compute = Compute::new(rx.clone(), out.clone(), Arc::clone(held));
    while compute.turn(cell, inputs, true) != Turn::Gone {}
    compute.counts()
}

/// What one turn of a compute thread did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Turn {
    /// It ran a chunk, or answered what was queued.
    Ran,
    /// Nothing waits to run (only when not blocking).
    Idle,
    /// Its queue closed: the job ended for this process.
    Gone,
}

/// A compute thread's queue and clock, turn by turn: [`main`] turns it until its queue
/// closes; the cluster simulation (`worker/sim.rs`) turns it when it schedules the thread.
pub(super) struct Compute<J: Job> {
    queue: Queue<J>,
    stats: StepStats,
    /// When the thread ended its last chunk.
    free: std::time::Instant,
}

impl<J: Job> Compute<J> {
    pub(super) fn new(
        rx: Receiver<SlotMsg<J>>,
        out: UnboundedSender<ToCoordinator>,
        held: HeldParts<J::Chunk>,
    ) -> Compute<J> {
        Compute {
            queue: Queue {
                rx,
                out,
                held,
                waiting: VecDeque::new(),
                gone: false,
                done: 0,
                yielded: 0,
                abandoned: false,
            },
            stats: StepStats::new(J::NAME),
            free: std::time::Instant::now(),
        }
    }

    /// Whether a chunk or a request waits for this thread.
    #[cfg(any(test, feature = "sim"))]
    pub(super) fn has_work(&self) -> bool {
        !self.queue.waiting.is_empty() || !self.queue.rx.is_empty()
    }

    /// The chunks finished and handed back.
    pub(super) fn counts(&self) -> (u64, u64) {
        (self.queue.done, self.queue.yielded)
    }

    /// Takes the queue and runs the next chunk that waits, if any; if none does, waits for
    /// one if `block`, or returns [`Turn::Idle`].
    pub(super) fn turn(&mut self, cell: &Cell, inputs: &Inputs<J>, block: bool) -> Turn {
        let Compute { queue, stats, free } = self;
        // Between chunks (step 4 of the flag contract): take the bits, then the queue.
        cell.take();
        queue.take(None);
        if queue.gone {
            return Turn::Gone;
        }
        let next = match queue.waiting.pop_front() {
            Some(next) => next,
            None if !block => return Turn::Idle,
            None => match queue.rx.recv() {
                Ok(SlotMsg::Run(next)) => next,
                // A request for a chunk that already ended here: its `Done` crossed it.
                Ok(_) => return Turn::Ran,
                Err(_) => return Turn::Gone,
            },
        };
        let Run {
            slot,
            chunk,
            range,
            state,
            held: is_held,
            job,
            phase,
            chunks,
            queued,
        } = next;
        let state = if is_held {
            match lock(&queue.held).remove(&chunk) {
                Some(part) => Some(Held::Live(Box::new(part))),
                None => {
                    tracing::warn!(
                        chunk,
                        "a run of a held partition this process does not hold"
                    );
                    let _ = queue.out.send(ToCoordinator::Missing { chunk });
                    return Turn::Ran;
                }
            }
        } else {
            state.map(Held::Bytes)
        };
        let assignment = Assignment {
            chunk,
            phase,
            chunks,
            range,
            state,
        };
        cell.publish(0);
        let mut host = SlotHost { queue, slot, chunk };
        let ran = run::run(&*job, inputs, assignment, cell, stats, &mut host);
        cell.publish(0);
        let began = queued.max(*free);
        if queue.gone {
            // The job ended for this process: nobody waits for this chunk.
            return Turn::Gone;
        }
        if std::mem::take(&mut queue.abandoned) && matches!(ran, Ran::Yielded { .. }) {
            // Dropped with its state; one that ended before it stopped goes up as usual.
            let _ = queue.out.send(ToCoordinator::Abandoned { slot, chunk });
            *free = std::time::Instant::now();
            return Turn::Ran;
        }
        let mut halos = None;
        let encoded = match ran {
            Ran::Done { output, work, kept } => {
                // An owned partition stays here; its halos go to the coordinator.
                let exported = match (kept, J::OWNERSHIP.hooks) {
                    (Some(k), Some(hooks)) => {
                        let mut sent = Vec::with_capacity(k.halos.len());
                        let mut encoded = Ok(());
                        let mut live = queue.held.live();
                        for (to, p) in k.halos {
                            match (hooks.encode_halo)(&p) {
                                Ok(b) => {
                                    let b = Bytes::from(b);
                                    if to.is_some() {
                                        // Taken by a `Begin` of this process if the halo
                                        // stays here (`live.rs`).
                                        live.keep(phase, &b, p);
                                    }
                                    sent.push((to, Halo::Sent(b)));
                                }
                                Err(e) => {
                                    encoded = Err(Error::from(e));
                                    break;
                                }
                            }
                        }
                        drop(live);
                        lock(&queue.held).insert(chunk, k.state);
                        encoded.map(|()| halos = Some(sent))
                    }
                    _ => Ok(()),
                };
                exported.and_then(|()| {
                    codec::encode("a chunk output", &output)
                        .map(|b| (true, b, work))
                        .map_err(Error::from)
                })
            }
            Ran::Yielded { state, work } => codec::encode("a chunk state", &state)
                .map(|b| (false, b, work))
                .map_err(Error::from),
            Ran::Failed(e) => Err(e),
        };
        let msg = match encoded {
            Ok((done, bytes, work)) => {
                let busy = work.busy.max(began.elapsed()) * SLOTS_PER_THREAD;
                let (iterations, busy_ns) = (work.iterations, busy.as_nanos() as u64);
                if done {
                    queue.done += 1;
                    ToCoordinator::Done {
                        slot,
                        chunk,
                        output: bytes.into(),
                        halos: halos.take(),
                        iterations,
                        busy_ns,
                    }
                } else {
                    queue.yielded += 1;
                    ToCoordinator::Yielded {
                        slot,
                        chunk,
                        state: bytes.into(),
                        iterations,
                        busy_ns,
                    }
                }
            }
            Err(e) => ToCoordinator::Failed {
                slot,
                chunk,
                failure: failure_of(e),
            },
        };
        let _ = queue.out.send(msg);
        *free = std::time::Instant::now();
        Turn::Ran
    }
}

/// The wire's form of an error that lost a chunk here; the coordinator turns it back into
/// the same [`Error`] variant (see `executor/remote.rs`).
pub(super) fn failure_of(e: Error) -> Failure {
    match e {
        Error::Panicked { site, message, .. } => Failure::Panicked {
            input: site == Site::Input,
            message,
        },
        Error::Input { source, .. } => Failure::Input {
            chain: chain_texts(&*source),
        },
        Error::Codec { what, source } => Failure::Codec {
            what: what.to_owned(),
            error: source,
        },
        Error::Output { phase, source, .. } => Failure::Output {
            phase,
            chain: chain_texts(&*source),
        },
        // The runner loses a chunk only for the reasons above.
        other => Failure::Panicked {
            input: false,
            message: other.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::{Chunk, Step};

    /// A job whose chunks each sleep `NAP` in their one step.
    #[derive(serde::Serialize, serde::Deserialize)]
    struct Nap;

    #[derive(serde::Serialize, serde::Deserialize)]
    struct NapChunk;

    const NAP: Duration = Duration::from_millis(20);

    impl Job for Nap {
        const NAME: &'static str = "nap";
        type Chunk = NapChunk;
        type Reducer = crate::reduce::Sum<u64>;
        type Input = ();
        fn iterations(&self) -> u64 {
            SLOTS_PER_THREAD as u64
        }
        fn chunk(&self, _: std::ops::Range<u64>) -> NapChunk {
            NapChunk
        }
        fn reducer(&self) -> Self::Reducer {
            crate::reduce::Sum::new()
        }
    }

    impl Chunk for NapChunk {
        type Job = Nap;
        type Output = u64;
        fn step(&mut self, _: &Nap, _: &()) -> Step<u64> {
            std::thread::sleep(NAP);
            Step::Done(1)
        }
    }

    /// Every slot of a thread gets a chunk at once: the busy times they report add up to
    /// the thread's time (times `SLOTS_PER_THREAD`), however long each waited behind the
    /// others. Measured from each chunk's arrival (protocol 9), they added up to 2.5 naps
    /// of the thread's 4, and the slot that waited least measured the thread's full speed.
    #[test]
    fn the_slots_of_a_thread_add_up_to_the_thread() {
        let (tx, rx) = crossbeam_channel::unbounded();
        let (out, mut reports) = tokio::sync::mpsc::unbounded_channel();
        let (cell, inputs) = (Cell::default(), Inputs::<Nap>::default());
        let held = HeldParts::<NapChunk>::default();
        let job = Arc::new(Nap);
        let start = Instant::now();
        for slot in 0..SLOTS_PER_THREAD {
            let chunk = u64::from(slot);
            let run = Run {
                slot,
                chunk,
                range: chunk..chunk + 1,
                state: None,
                held: false,
                job: Arc::clone(&job),
                phase: 0,
                chunks: u64::from(SLOTS_PER_THREAD),
                queued: Instant::now(),
            };
            tx.send(SlotMsg::Run(run)).unwrap();
        }
        let thread = std::thread::spawn(move || main::<Nap>(&rx, &cell, &out, &inputs, &held));
        let mut busy = Vec::new();
        while busy.len() < SLOTS_PER_THREAD as usize {
            match reports.blocking_recv() {
                Some(ToCoordinator::Done { busy_ns, .. }) => {
                    busy.push(Duration::from_nanos(busy_ns));
                }
                other => panic!("{other:?}"),
            }
        }
        let wall = start.elapsed();
        drop(tx);
        assert_eq!(thread.join().unwrap(), (u64::from(SLOTS_PER_THREAD), 0));
        for b in &busy {
            assert!(*b >= NAP * SLOTS_PER_THREAD, "{busy:?}");
        }
        let thread: Duration = busy.iter().sum::<Duration>() / SLOTS_PER_THREAD;
        assert!(
            thread <= wall,
            "{busy:?} add up to {thread:?}, more than {wall:?}"
        );
    }
}
