//! A worker process as the cluster simulation runs it (`executor/sim.rs`): the process's
//! protocol machine (`machine.rs`), its compute threads (`thread.rs`, turned one chunk at a
//! time) and the job's code (`io::run_code`), with no socket, task or thread. The simulation
//! decides when a message arrives, when a thread runs a chunk, when a placement ends and what
//! time it is; the same seed replays the same process.
//!
//! A process given the simulation's store takes it when it is offered (its witness is
//! checked there), writes its snapshot parts there and reads the parts placed on it; one
//! without sends its parts to the coordinator as bytes. Its background work (the store's
//! check, a part's write, a placement) ends when the simulation says, in any order.
//!
//! What differs from a real process, on purpose: a chunk runs whole in one turn (a request
//! that arrives meanwhile is seen at its first adjustment point, as when it arrives before the
//! chunk starts).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use super::io::{check_witness, decode_placed, read_placed, run_code};
use super::machine::{Check, Config, Machine, Out, Place, Put, Source, ToThread, Unusable};
use super::thread::{Compute, HeldParts, Run, SlotMsg, Turn, failure_of, lock};
use crate::job::Job;
use crate::run::{Cell, Inputs, MAIL};
use crate::wire::Error;
use crate::wire::buffers::Buffers;
use crate::wire::frame::{ToCoordinator, ToWorker};
use crate::wire::peer::{FromPeer, ToPeer};

/// A frame between two simulated processes (the peer data plane).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum PeerFrame {
    /// From the process that dialled.
    To(ToPeer),
    /// Back to it.
    From(FromPeer),
}

/// A compute thread of a simulated process.
struct SimThread<J: Job> {
    tx: Option<Sender<SlotMsg<J>>>,
    cell: Arc<Cell>,
    compute: Compute<J>,
}

/// Background work of a simulated process, ended by [`SimProcess::settle`].
enum Background {
    Place(Place),
    Check(Check),
    Put(Put),
    Replay(super::replay::Replay),
}

/// A simulated worker process (see the module's docs).
pub(crate) struct SimProcess<J: Job> {
    machine: Machine,
    job: super::io::PhaseValue<J>,
    gathered: super::io::GatheredHere,
    inputs: Arc<Inputs<J>>,
    held: HeldParts<J::Chunk>,
    /// Large buffers kept for reuse, shared with the machine (as a real process's are).
    buffers: Arc<Buffers>,
    threads: Vec<SimThread<J>>,
    reports: UnboundedReceiver<ToCoordinator>,
    /// Background work under way, ended by [`SimProcess::settle`].
    background: Vec<Background>,
    /// The simulation's store, if this process can open it, and the runtime its futures
    /// run on.
    store: Option<(crate::snapshot::Store, Arc<tokio::runtime::Runtime>)>,
    /// Messages for the coordinator, in the order they go on the wire.
    outbox: VecDeque<ToCoordinator>,
    /// Frames for peer processes (by their number), in the order they were decided.
    peer_out: VecDeque<(u64, PeerFrame)>,
    /// Whether it listens for its peers once it knows its number, and whether it does.
    listens: (bool, bool),
    /// Peers whose link this process ended (they broke the peer protocol).
    pub(crate) hung_up: Vec<u64>,
    ended: Option<Result<bool, Error>>,
}

impl<J: Job> SimProcess<J> {
    /// A process of `threads` compute threads, dialled at `now`.
    pub(crate) fn new(
        threads: usize,
        (heartbeat, lease): (Duration, Duration),
        store: Option<(crate::snapshot::Store, Arc<tokio::runtime::Runtime>)>,
        now: Instant,
    ) -> Self {
        let config = Config {
            peer: "the simulated coordinator".into(),
            heartbeat,
            lease,
            grace: None,
            partitioned: J::OWNERSHIP.hooks.is_some(),
            threads,
            direct: true,
            copy_memory: u64::MAX,
            buffers: Arc::new(Buffers::new(1 << 30)),
        };
        let buffers = Arc::clone(&config.buffers);
        let held = HeldParts::default();
        let (out, reports): (UnboundedSender<ToCoordinator>, _) = unbounded_channel();
        let threads = (0..threads)
            .map(|_| {
                let (tx, rx): (Sender<SlotMsg<J>>, Receiver<SlotMsg<J>>) =
                    crossbeam_channel::unbounded();
                SimThread {
                    tx: Some(tx),
                    cell: Arc::default(),
                    compute: Compute::new(rx, out.clone(), Arc::clone(&held)),
                }
            })
            .collect();
        let mut p = SimProcess {
            machine: Machine::new(config, now),
            job: None,
            gathered: Default::default(),
            inputs: Arc::default(),
            held,
            buffers,
            threads,
            reports,
            background: Vec::new(),
            store,
            outbox: VecDeque::new(),
            peer_out: VecDeque::new(),
            listens: (false, false),
            hung_up: Vec::new(),
            ended: None,
        };
        p.drive();
        p
    }

    /// How the process ended, once it did.
    pub(crate) fn ended(&self) -> Option<&Result<bool, Error>> {
        self.ended.as_ref()
    }

    /// Whether a message for the coordinator waits to go.
    pub(crate) fn has_sent(&self) -> bool {
        !self.outbox.is_empty()
    }

    /// The next message for the coordinator, if any.
    pub(crate) fn next_sent(&mut self) -> Option<ToCoordinator> {
        self.outbox.pop_front()
    }

    /// The halo log: `(phase, chunk, halos)` oldest first, its bytes, and the first phase
    /// it keeps.
    pub(crate) fn log(&self) -> (&VecDeque<super::machine::Logged>, u64, Option<u64>) {
        self.machine.log()
    }

    /// The partition of `chunk` held here, encoded, if it is.
    pub(crate) fn held_state(&self, chunk: u64) -> Option<Vec<u8>> {
        let held = lock(&self.held);
        held.get(&chunk)
            .and_then(|p| crate::codec::encode("a chunk state", p).ok())
    }

    /// The buddy copy of `chunk` this process keeps for a peer: its phase and bytes.
    pub(crate) fn copy_of(&self, chunk: u64) -> Option<(u64, bytes::Bytes)> {
        self.machine.copy_of(chunk)
    }

    /// This process accepts halos from its peers once it knows its number (at a made-up
    /// address).
    pub(crate) fn listen(&mut self) {
        self.listens.0 = true;
    }

    /// The next frame for a peer process, with its number, if any.
    pub(crate) fn next_peer_frame(&mut self) -> Option<(u64, PeerFrame)> {
        self.peer_out.pop_front()
    }

    /// A frame from peer process `from` arrives.
    pub(crate) fn peer_frame(&mut self, from: u64, frame: PeerFrame) {
        match frame {
            PeerFrame::To(msg) => self.machine.peer_received(from, msg),
            PeerFrame::From(msg) => self.machine.peer_answered(from, msg),
        }
        self.drive();
    }

    /// The link with peer process `process` broke.
    pub(crate) fn peer_down(&mut self, process: u64) {
        self.machine
            .peer_down(process, "the simulated link broke".into());
        self.drive();
    }

    /// Whether a thread has a chunk or a request waiting.
    pub(crate) fn busy_threads(&self) -> Vec<usize> {
        (0..self.threads.len())
            .filter(|&t| self.threads[t].compute.has_work())
            .collect()
    }

    /// Background work under way (placements, the store's check, parts' writes).
    pub(crate) fn background(&self) -> usize {
        self.background.len()
    }

    /// A message from the coordinator arrives at `now`.
    pub(crate) fn receive(&mut self, now: Instant, msg: ToWorker) {
        self.machine.received(now, Some(msg));
        self.drive();
    }

    /// The time is `now`: heartbeats, and the coordinator's lease.
    pub(crate) fn tick(&mut self, now: Instant) {
        let progress = vec![0; self.threads.len()];
        self.machine.tick(now, progress);
        self.drive();
    }

    /// Thread `t` takes its queue and runs its next chunk.
    pub(crate) fn turn(&mut self, t: usize) {
        let thread = &mut self.threads[t];
        if thread.compute.turn(&thread.cell, &self.inputs, false) == Turn::Gone {
            thread.tx = None;
        }
        while let Ok(msg) = self.reports.try_recv() {
            self.machine.reported(simulated_time(msg));
        }
        self.drive();
    }

    /// Background work `k` ends: a placement is read if it is a part, decoded (with its
    /// halos if asked) and held here; the store is checked; a part is written.
    pub(crate) fn settle(&mut self, k: usize) {
        match self.background.swap_remove(k) {
            Background::Place(place) => self.place(place),
            Background::Replay(replay) => {
                let attempt = replay.attempt;
                let outcome = super::replay::replay::<J>(replay, &self.inputs).map(|parts| {
                    super::io::hold_replayed(&self.machine, attempt, &self.held, parts)
                });
                self.machine.replayed(attempt, outcome);
            }
            Background::Check(check) => {
                let checked = match &self.store {
                    Some((store, rt)) => rt.block_on(check_witness(store.clone(), check)),
                    None => Err(Unusable::Read(crate::snapshot::Error::NotFound {
                        what: format!("store {} (this simulated process opens none)", check.url),
                    })),
                };
                self.machine.checked(checked);
            }
            Background::Put(put) => {
                let written = match &self.store {
                    Some((store, rt)) => rt.block_on(store.put_part(
                        &put.job_id,
                        put.folder,
                        put.phase,
                        put.chunk,
                        put.state.clone(),
                    )),
                    None => Err(crate::snapshot::Error::NotFound {
                        what: "a store (this simulated process opens none)".into(),
                    }),
                };
                self.machine.stored(put, written);
            }
        }
        self.drive();
    }

    fn place(&mut self, place: Place) {
        let Place {
            chunk,
            from,
            export,
            store,
        } = place;
        let bytes = match from {
            Source::Sent(bytes) => Ok(bytes.to_vec()),
            Source::Part(part) => match &self.store {
                Some((_, rt)) => rt.block_on(read_placed(store, &part, Vec::new())),
                None => Err(failure_of(crate::Error::Internal(format!(
                    "part {:?} placed on a simulated process that opens no store",
                    part.key
                )))),
            },
        };
        let placed = bytes.and_then(|b| {
            decode_placed::<J>(chunk, &b, export, self.job.clone(), None)
                .map(|(part, halos)| {
                    lock(&self.held).insert(chunk, part);
                    halos
                })
                .map_err(failure_of)
        });
        self.machine.placed(chunk, placed);
    }

    /// Carries out what the machine decided.
    fn drive(&mut self) {
        while let Some(out) = self.machine.poll() {
            match out {
                Out::Send(msg) => self.outbox.push_back(msg),
                Out::Thread(t, msg) => self.hand_to_thread(t, msg),
                Out::Close(t) => self.threads[t].tx = None,
                Out::Code(code) => {
                    let answer = run_code(
                        "the simulated coordinator",
                        code,
                        (&mut self.job, &mut self.gathered),
                        &self.inputs,
                        &self.held,
                        (&self.buffers, None),
                    );
                    self.machine.answer(answer);
                }
                Out::Place(place) => self.background.push(Background::Place(place)),
                Out::Forget => {
                    lock(&self.held).clear();
                    self.background
                        .retain(|b| !matches!(b, Background::Place(_)));
                }
                Out::Peer { to, msg, .. } => self.peer_out.push_back((to, PeerFrame::To(msg))),
                Out::Answer { to, msg } => self.peer_out.push_back((to, PeerFrame::From(msg))),
                Out::HangUp { to } => self.hung_up.push(to),
                Out::Roster { me, .. } => {
                    if self.listens == (true, false) {
                        self.listens.1 = true;
                        self.machine.listening(format!("127.0.0.1:{}", 7000 + me));
                    }
                }
                Out::Check(check) => self.background.push(Background::Check(check)),
                Out::Put(put) => self.background.push(Background::Put(put)),
                Out::Replay(replay) => self.background.push(Background::Replay(replay)),
                Out::End { tell, result } => {
                    self.outbox.extend(tell);
                    for t in &mut self.threads {
                        t.tx = None;
                    }
                    self.ended = Some(result);
                }
            }
        }
    }

    /// A message for thread `t`'s queue (as the I/O loop hands it over).
    fn hand_to_thread(&mut self, t: usize, msg: ToThread) {
        let thread = &self.threads[t];
        let Some(tx) = thread.tx.as_ref() else {
            return;
        };
        let m = match msg {
            ToThread::Run {
                slot,
                chunk,
                range,
                state,
                held,
                phase,
            } => {
                let Some((_, chunks, job)) = &self.job else {
                    return;
                };
                SlotMsg::Run(Run {
                    slot,
                    chunk,
                    range,
                    state,
                    held,
                    job: Arc::clone(job),
                    phase,
                    chunks: *chunks,
                    queued: Instant::now(),
                })
            }
            ToThread::Interrupt { slot, chunk } => SlotMsg::Interrupt { slot, chunk },
            ToThread::Capture { slot, chunk } => SlotMsg::Capture { slot, chunk },
            ToThread::Abandon { slot, chunk } => SlotMsg::Abandon { slot, chunk },
        };
        let _ = tx.send(m);
        thread.cell.raise(MAIL);
    }
}

/// A thread's report with its time measures made deterministic: a slot's busy time is its
/// iterations (in microseconds), so that what the coordinator learns from it replays.
fn simulated_time(msg: ToCoordinator) -> ToCoordinator {
    match msg {
        ToCoordinator::Done {
            slot,
            chunk,
            output,
            halos,
            iterations,
            ..
        } => ToCoordinator::Done {
            slot,
            chunk,
            output,
            halos,
            iterations,
            busy_ns: iterations * 1_000,
        },
        ToCoordinator::Yielded {
            slot,
            chunk,
            state,
            iterations,
            ..
        } => ToCoordinator::Yielded {
            slot,
            chunk,
            state,
            iterations,
            busy_ns: iterations * 1_000,
        },
        other => other,
    }
}
