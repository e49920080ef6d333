//! The I/O task of a worker process: the pump of its protocol machine (`machine.rs`).
//! Frames from the coordinator, the threads' messages, background store operations and
//! placements, stop requests and timers go into the machine as events; its orders come out
//! as frames for the coordinator, messages for the threads, store operations and placements
//! started here, and the job's own code run here (steps 2-7 of the protocol in `mod.rs`).
//!
//! The pump decides nothing about the protocol: it holds what needs the job's types or the
//! runtime (the job value, the held partitions and their spares, the placements under way,
//! the store's tasks) and reads the clock, which the machine is given as `now`. Orders are
//! carried out in the order polled; the frames of one turn go with one flush, after the
//! turn's other orders were carried out (the threads' queues, the tasks), which keeps the
//! frames in the machine's order.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio_util::codec::Framed;

use super::machine::{self, Check, Code, Machine, Out, Place, Put, Source, ToThread, Unusable};
use super::peers::{LinkId, PeerConfig, PeerEvent, Peers};
use super::thread::{HeldParts, Run, SlotMsg, Thread, lock};
use crate::codec;
use crate::job::Job;
use crate::run::{Inputs, MAIL, SuspendToken};
use crate::wire::Error;
use crate::wire::buffers::Buffers;
use crate::wire::frame::{self, Failure, Message, ToCoordinator, ToWorker};
use crate::wire::shared::Segments;

pub(super) struct Io {
    pub(super) peer: String,
    pub(super) heartbeat: Duration,
    pub(super) lease: Duration,
    pub(super) max_frame: usize,
    pub(super) max_message: usize,
    pub(super) stop: Option<SuspendToken>,
    pub(super) signals: bool,
    pub(super) grace: Option<Duration>,
    pub(super) dialled: std::time::Instant,
    pub(super) first_run: std::cell::Cell<Option<Duration>>,
    pub(super) parts_written: std::cell::Cell<u64>,
    pub(super) parts_sent: std::cell::Cell<u64>,
    /// The peer data plane: `None` if this process sends and takes no halo directly
    /// ([`WorkerOptions::direct_halos`](super::WorkerOptions::direct_halos)); else the job's
    /// token and the handshake's time limit, for its links.
    pub(super) direct: Option<(Option<crate::wire::Token>, Duration)>,
    /// What the peer data plane did, once the loop ended.
    pub(super) peer_counts: std::cell::Cell<machine::PeerCounts>,
    /// Bytes of the frames sent to the coordinator.
    pub(super) bytes_sent: std::cell::Cell<u64>,
    /// The most bytes of buddy copies kept for peers
    /// ([`WorkerOptions::copy_memory`](super::WorkerOptions::copy_memory)).
    pub(super) copy_memory: u64,
    /// The buddy copies kept for peers when the loop ended, and their bytes.
    pub(super) copies_held: std::cell::Cell<(usize, u64)>,
    /// The halo log's bytes when the loop ended.
    pub(super) log_bytes: std::cell::Cell<u64>,
    /// Large buffers kept for reuse
    /// ([`WorkerOptions::buffer_memory`](super::WorkerOptions::buffer_memory)).
    pub(super) buffers: Arc<Buffers>,
    /// Memory other processes of the node can map: buddy copies are encoded there and lent
    /// to buddies that map them; `None` if this process shares none
    /// ([`WorkerOptions::shared_copies`](super::WorkerOptions::shared_copies)).
    pub(super) segments: Option<Arc<Segments>>,
    /// Whether this process maps the copies its peers share with it (else it answers
    /// `Unshared`, and they send the bytes).
    pub(super) map_shared: bool,
}

/// The pump's side of the peer data plane: the links, once the coordinator said who this
/// process is (`Out::Roster`), and the link each peer's halos came on last (its answers go
/// back on it).
struct Plane {
    peers: Option<Peers>,
    events: tokio::sync::mpsc::UnboundedSender<PeerEvent>,
    /// The link each peer dialled last.
    accepted: std::collections::HashMap<u64, LinkId>,
}

/// What background tasks of the I/O loop report.
enum Background<C> {
    /// The store offered by the coordinator was checked: usable, or why not.
    Checked(Result<(crate::snapshot::Store, String), Unusable>),
    /// A part was written (its reference), or could not be.
    Stored(
        Put,
        Result<crate::snapshot::PartRef, crate::snapshot::Error>,
    ),
    /// A replay of lost partitions ended (its attempt).
    Replayed(u64, Result<super::replay::Replayed<C>, String>),
}

/// The job value with its phase and number of chunks, once one came.
pub(super) type PhaseValue<J> = Option<(u64, u64, Arc<J>)>;

/// The pieces of the phase's allgather as this process decoded them (`Code::Gathered`),
/// each once, shared by every partition here that begins the phase with them, and the
/// vectors [`Pieces::concat`](crate::Pieces::concat) built from them (one per process).
#[derive(Default)]
pub(super) struct GatheredHere {
    /// `(sender, piece)`, in chunk order; each piece shared.
    pieces: Vec<(u64, crate::exchange::Piece)>,
    built: crate::exchange::Gathered,
}

impl GatheredHere {
    /// Another handle on the piece from `from`.
    fn share(&self, from: u64) -> Option<crate::exchange::Piece> {
        let at = self.pieces.binary_search_by_key(&from, |(c, _)| *c).ok()?;
        self.pieces[at].1.share()
    }
}

/// What the pump holds for the machine: the values of the job's own types, and the tasks.
struct Pump<J: Job> {
    /// The job value with its phase and number of chunks, once one came.
    job: PhaseValue<J>,
    /// The phase's allgather pieces, decoded once.
    gathered: GatheredHere,
    /// Partitions placed here, being read and decoded on the blocking pool while the loop
    /// goes on, two at a time in the order they came (the coordinator sends first those
    /// that run first; all at once, they all ended late; one at a time, the process's
    /// threads waited for them). The machine holds a later message about one of them until
    /// it is placed.
    placing: Placements<J>,
    background: UnboundedSender<Background<J::Chunk>>,
    /// The job's input, shared with the threads (for `Partition::output`).
    inputs: Arc<Inputs<J>>,
    /// Large buffers kept for reuse: a buddy copy is encoded into one, or into one of
    /// `segments` (memory a buddy on this node can map) if sharing is on.
    buffers: Arc<Buffers>,
    segments: Option<Arc<Segments>>,
}

impl<J: Job> Pump<J> {
    /// Runs the job's code for the machine ([`Out::Code`]).
    fn code(
        &mut self,
        peer: &str,
        code: Code,
        held: &HeldParts<J::Chunk>,
    ) -> Result<Option<ToCoordinator>, Error> {
        if let Code::Begin { .. } = code {
            // The restored phase ended: every placement has started.
            self.placing.spares.clear();
            *lock_buffers(&self.placing.buffers) = None;
        }
        let state = (&mut self.job, &mut self.gathered);
        run_code(
            peer,
            code,
            state,
            &self.inputs,
            held,
            (&self.buffers, self.segments.as_deref()),
        )
    }

    /// Checks an offered store in the background ([`Out::Check`]).
    fn check(&self, check: Check) {
        let tx = self.background.clone();
        tokio::spawn(async move {
            let _ = tx.send(Background::Checked(check_store(check).await));
        });
    }

    /// Replays lost partitions on a thread of its own ([`Out::Replay`]): it computes
    /// phases, and the I/O goes on meanwhile.
    fn replay(&self, replay: super::replay::Replay) {
        let tx = self.background.clone();
        let inputs = Arc::clone(&self.inputs);
        let attempt = replay.attempt;
        let spawned = std::thread::Builder::new()
            .name("malleable-replay".into())
            .spawn(move || {
                // The job's code is caught inside; anything else that panics still answers,
                // or the coordinator's barrier would wait for this replay for ever.
                let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    super::replay::replay::<J>(replay, &inputs)
                }))
                .unwrap_or_else(|_| Err("the replay panicked".to_owned()));
                let _ = tx.send(Background::Replayed(attempt, outcome));
            });
        if let Err(e) = spawned {
            let _ = self.background.send(Background::Replayed(
                attempt,
                Err(format!("no thread for the replay: {e}")),
            ));
        }
    }

    /// Writes a part in the background ([`Out::Put`]).
    fn put(&self, put: Put) {
        let tx = self.background.clone();
        tokio::spawn(async move {
            let written = put
                .store
                .put_part(
                    &put.job_id,
                    put.folder,
                    put.phase,
                    put.chunk,
                    put.state.clone(),
                )
                .await;
            let _ = tx.send(Background::Stored(put, written));
        });
    }
}

/// Partitions replayed here (`Recover`) are held here from now on, unless the machine dropped
/// their replay (the job rolled back meanwhile); what each exported goes to the machine.
pub(super) fn hold_replayed<C>(
    machine: &Machine,
    attempt: u64,
    held: &HeldParts<C>,
    parts: super::replay::Replayed<C>,
) -> Vec<(u64, super::replay::Pieces, super::replay::Exports)> {
    if !machine.is_replaying(attempt) {
        return Vec::new();
    }
    let mut held = lock(held);
    parts
        .into_iter()
        .map(|(chunk, part, halos, exports)| {
            if held.insert(chunk, part).is_some() {
                tracing::warn!(chunk, "a replayed partition replaced one held here");
            }
            (chunk, halos, exports)
        })
        .collect()
}

/// Runs the job's code for the machine ([`Out::Code`]): `job` is the pump's job value and
/// its phase, `held` the partitions held here; a partition's copy is encoded into one of
/// `segments` (memory a buddy on this node can map), else into one of `buffers`.
pub(super) fn run_code<J: Job>(
    peer: &str,
    code: Code,
    (job, gathered): (&mut PhaseValue<J>, &mut GatheredHere),
    inputs: &Inputs<J>,
    held: &HeldParts<J::Chunk>,
    (buffers, segments): (&Buffers, Option<&Segments>),
) -> Result<Option<ToCoordinator>, Error> {
    // Bytes of the job's own types that do not decode although the versions matched.
    let undecodable = |what: &'static str, e: codec::Error| Error::Undecodable {
        peer: peer.to_owned(),
        job: J::NAME.to_owned(),
        version: J::VERSION,
        what,
        here: true,
        source: e.source,
    };
    match code {
        Code::Phase {
            phase,
            chunks,
            job: bytes,
        } => {
            let value: J =
                codec::decode("the job", &bytes).map_err(|e| undecodable("the job value", e))?;
            *job = Some((phase, chunks, Arc::new(value)));
            *gathered = GatheredHere::default();
            Ok(None)
        }
        Code::Gathered { pieces } => {
            let Some(decode) = J::OWNERSHIP.hooks.and_then(|h| h.decode_shared) else {
                // The machine asks only for a job with partitions; one whose partitions
                // exchange with neighbours only has no allgather.
                return Err(Error::Rejected {
                    peer: peer.to_owned(),
                    what: "a message to a worker",
                    reason: "an allgather's pieces for a job whose partitions exchange with \
                             their neighbours only"
                        .into(),
                    source: None,
                });
            };
            gathered.pieces = pieces
                .into_iter()
                .map(|(from, b)| {
                    decode(&b)
                        .map(|p| (from, p))
                        .map_err(|e| undecodable("a halo", e))
                })
                .collect::<Result<Vec<_>, _>>()?;
            gathered.built = crate::exchange::Gathered::default();
            Ok(None)
        }
        Code::Begin { chunk, halos } => {
            let (Some((phase, _, j)), Some(hooks)) = (job.as_ref(), J::OWNERSHIP.hooks) else {
                // The machine asks only for a job with partitions, after its value.
                return Err(Error::Rejected {
                    peer: peer.to_owned(),
                    what: "a message to a worker",
                    reason: "a partition's halos for a job without partitions".into(),
                    source: None,
                });
            };
            let mut live = held.live();
            let inbox = halos
                .into_iter()
                .map(|(from, b)| match b {
                    // A halo this process exported, kept here: the piece itself.
                    Some(b) => match live.take(&b) {
                        Some(p) => Ok((from, p)),
                        None => (hooks.decode_halo)(&b)
                            .map(|p| (from, p))
                            .map_err(|e| undecodable("a halo", e)),
                    },
                    // The machine checked that the phase's `Gathered` brought it.
                    None => {
                        gathered
                            .share(from)
                            .map(|p| (from, p))
                            .ok_or_else(|| Error::Rejected {
                                peer: peer.to_owned(),
                                what: "a message to a worker",
                                reason: format!("no gathered piece from chunk {from}"),
                                source: None,
                            })
                    }
                })
                .collect::<Result<Vec<_>, _>>()?;
            drop(live);
            let mut parts = lock(held);
            let Some(part) = parts.get_mut(&chunk) else {
                tracing::warn!(
                    chunk,
                    "halos came for a partition this process does not hold"
                );
                return Ok(Some(ToCoordinator::Missing { chunk }));
            };
            let site = crate::Site::Chunk {
                phase: *phase,
                chunk,
            };
            if let Err(e) = crate::run::catch(site, J::NAME, || {
                (hooks.begin)(part, j, chunk, &mut { inbox }, Some(&gathered.built))
            }) {
                return Ok(Some(ToCoordinator::FailedHeld {
                    chunk,
                    failure: super::thread::failure_of(e),
                }));
            }
            Ok(None)
        }
        Code::Held { chunk, surrender } => {
            let mut parts = lock(held);
            let encoded = if surrender {
                parts
                    .remove(&chunk)
                    .map(|p| codec::encode("a chunk state", &p).map(bytes::Bytes::from))
            } else {
                // A copy (or a capture) of a partition that stays here: encoded into memory
                // kept from an earlier copy, not into fresh pages.
                parts
                    .get(&chunk)
                    .map(|p| codec::encode_shared("a chunk state", p, segments, buffers))
            };
            Ok(Some(match encoded {
                None => {
                    tracing::warn!(
                        chunk,
                        surrender,
                        "asked for a partition this process does not hold"
                    );
                    ToCoordinator::Missing { chunk }
                }
                Some(Err(e)) => ToCoordinator::FailedHeld {
                    chunk,
                    failure: super::thread::failure_of(e.into()),
                },
                Some(Ok(b)) if surrender => ToCoordinator::Surrendered { chunk, state: b },
                Some(Ok(b)) => ToCoordinator::CapturedHeld { chunk, state: b },
            }))
        }
        Code::Output { chunk, phase } => {
            let (Some((held_phase, _, j)), Some(hooks)) = (job.as_ref(), J::OWNERSHIP.hooks) else {
                return Err(Error::Rejected {
                    peer: peer.to_owned(),
                    what: "a message to a worker",
                    reason: "an output before the job value".into(),
                    source: None,
                });
            };
            if *held_phase != phase {
                // The coordinator sends the phase's job value first.
                return Err(Error::Rejected {
                    peer: peer.to_owned(),
                    what: "a message to a worker",
                    reason: format!(
                        "an output of phase {phase} with the job value of phase {held_phase}"
                    ),
                    source: None,
                });
            }
            let failed = |e| {
                Ok(Some(ToCoordinator::FailedHeld {
                    chunk,
                    failure: super::thread::failure_of(e),
                }))
            };
            let input = match inputs.get(j) {
                Ok(input) => input,
                Err(e) => return failed(e),
            };
            let parts = lock(held);
            let Some(part) = parts.get(&chunk) else {
                tracing::warn!(chunk, "an output of a partition this process does not hold");
                return Ok(Some(ToCoordinator::Missing { chunk }));
            };
            match crate::run::output(&hooks, part, j, input, phase, chunk) {
                Ok(()) => Ok(Some(ToCoordinator::OutputDone { chunk })),
                Err(e) => failed(e),
            }
        }
    }
}

/// An offered store is the coordinator's if the witness snapshot is there with the same
/// creation time.
async fn check_store(check: Check) -> Result<(crate::snapshot::Store, String), Unusable> {
    let store = crate::snapshot::Store::open_with(&check.url, check.options.clone())
        .map_err(Unusable::Open)?;
    check_witness(store, check).await
}

/// Whether `store`, opened from an offered store's URL, is the coordinator's: its witness
/// snapshot is there, created at the same time.
pub(super) async fn check_witness(
    store: crate::snapshot::Store,
    check: Check,
) -> Result<(crate::snapshot::Store, String), Unusable> {
    let Check {
        url,
        job_id,
        epoch,
        created_unix_ms,
        ..
    } = check;
    let id = crate::snapshot::SnapshotId::new(job_id.clone(), epoch);
    let manifest = store.manifest(&id).await.map_err(Unusable::Read)?;
    if manifest.created_unix_ms != created_unix_ms {
        return Err(Unusable::Another { id, url });
    }
    Ok((store, job_id))
}

impl Io {
    /// Sends `msgs` to the coordinator (in pieces where they are long), then flushes.
    async fn send_all<S>(
        &self,
        sink: &mut S,
        msgs: impl IntoIterator<Item = ToCoordinator>,
    ) -> Result<(), Error>
    where
        S: futures::Sink<frame::Frame, Error = std::io::Error> + Unpin,
    {
        let mut written = Vec::new();
        for msg in msgs {
            for f in frame::Frames::new(&msg, self.max_frame) {
                self.bytes_sent
                    .set(self.bytes_sent.get() + f.len() as u64 + 4);
                self.write(sink.feed(f)).await?;
            }
            written.extend(msg.long_tail());
        }
        self.write(sink.flush()).await?;
        // A captured partition's bytes are written, and the sink let go of its last frame
        // (it holds one until the flush): their memory serves the next copy or capture.
        for tail in written {
            self.buffers.give(tail);
        }
        Ok(())
    }

    /// Writes to the coordinator (one frame, or a flush), within a lease: a coordinator that
    /// stopped reading (its socket full) is as silent as one that stopped writing, and a
    /// write that waits for it must not keep this process from giving it up. The limit is
    /// per frame, as on the coordinator's side (a frame that stalls for a lease), so a long
    /// message in pieces may take as long as it needs while it moves.
    async fn write(
        &self,
        op: impl std::future::Future<Output = std::io::Result<()>>,
    ) -> Result<(), Error> {
        match tokio::time::timeout(self.lease, op).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(source)) => Err(Error::Io {
                peer: self.peer.clone(),
                source,
            }),
            Err(_) => Err(machine::silent(&self.peer, self.lease)),
        }
    }

    /// The I/O loop; returns whether the process left on a stop request.
    pub(super) async fn run<J: Job>(
        &self,
        framed: Framed<crate::wire::transport::Stream, crate::wire::frame::Codec>,
        threads: &mut [Thread<J>],
        held: &HeldParts<J::Chunk>,
        inputs: &Arc<Inputs<J>>,
        mut out_rx: UnboundedReceiver<ToCoordinator>,
    ) -> Result<bool, Error> {
        let peer = &self.peer;
        // The peers listener is bound on the address this process reaches the coordinator
        // from: the one its peers can reach it on too, as far as it knows.
        let local_ip = framed.get_ref().local_addr().map(|a| a.ip()).ok();
        let (mut sink, mut stream) = framed.split();
        let config = machine::Config {
            peer: peer.clone(),
            heartbeat: self.heartbeat,
            lease: self.lease,
            grace: self.grace,
            partitioned: J::OWNERSHIP.is_partitioned(),
            direct: self.direct.is_some(),
            threads: threads.len(),
            copy_memory: self.copy_memory,
            buffers: Arc::clone(&self.buffers),
        };
        let mut machine = Machine::new(config, std::time::Instant::now());
        let mut sigterm = self
            .signals
            .then(|| tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok())
            .flatten();
        let mut sigint = self
            .signals
            .then(|| tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).ok())
            .flatten();
        let stop = self.stop.clone();
        let mut pieces = frame::Assembler::new(self.max_message);
        let (peer_tx, mut peer_rx) = unbounded_channel();
        let mut plane = Plane {
            peers: None,
            events: peer_tx,
            accepted: std::collections::HashMap::new(),
        };
        let (bg_tx, mut bg_rx) = unbounded_channel();
        let mut pump = Pump::<J> {
            job: None,
            gathered: GatheredHere::default(),
            placing: Placements::new(),
            background: bg_tx,
            inputs: Arc::clone(inputs),
            buffers: Arc::clone(&self.buffers),
            segments: self.segments.clone(),
        };
        let ended: Result<bool, Error> = async {
            loop {
                let deadline = tokio::time::Instant::from_std(machine.deadline());
                let left = machine.left();
                tokio::select! {
                    () = tokio::time::sleep_until(deadline) => {
                        let progress = threads.iter().map(|s| s.cell.progress()).collect();
                        machine.tick(std::time::Instant::now(), progress);
                    }
                    next = stream.next() => {
                        let bytes = match next {
                            None => return Err(Error::Closed { peer: peer.clone() }),
                            Some(Err(e)) => return Err(Error::io(peer, e, self.max_frame)),
                            Some(Ok(b)) => b,
                        };
                        let now = std::time::Instant::now();
                        let msg = pieces.frame::<ToWorker>(peer, bytes.freeze())?;
                        machine.received(now, msg);
                    }
                    msg = out_rx.recv() => match msg {
                        None => machine.threads_gone(),
                        Some(msg) => {
                            machine.reported(msg);
                            while let Ok(msg) = out_rx.try_recv() {
                                machine.reported(msg);
                            }
                        }
                    },
                    Some(event) = peer_rx.recv() => match event {
                        PeerEvent::Received { from, link, msg } => {
                            plane.accepted.insert(from, link);
                            machine.peer_received(from, msg);
                        }
                        PeerEvent::Answered { to, link, msg } => {
                            tracing::trace!(peer = to, ?link, "an answer from a peer");
                            machine.peer_answered(to, msg);
                        }
                        // Whichever link it was: what went on it and is not answered may or
                        // may not have arrived, and goes through the coordinator.
                        PeerEvent::Down { process, link, dialled: true, error } => {
                            tracing::debug!(peer = process, ?link, "a link to a peer is down");
                            machine.peer_down(process, error.to_string());
                        }
                        // The dialer hears of it and sends what it had pushed up instead.
                        PeerEvent::Down { .. } => {}
                    },
                    Some(done) = bg_rx.recv() => match done {
                        Background::Checked(checked) => machine.checked(checked),
                        Background::Stored(put, written) => machine.stored(put, written),
                        Background::Replayed(attempt, outcome) => {
                            let outcome = outcome.map(|parts| hold_replayed(
                                &machine, attempt, held, parts,
                            ));
                            machine.replayed(attempt, outcome);
                        }
                    },
                    Some((chunk, r)) = pump.placing.next(), if !pump.placing.is_empty() => {
                        let r = r.map(|(part, halos)| {
                            if lock(held).insert(chunk, part).is_some() {
                                tracing::warn!(chunk, "a partition placed here replaced the one held");
                            }
                            halos
                        });
                        machine.placed(chunk, r);
                    }
                    _ = async { stop.as_ref().expect("guarded").fired().await }, if stop.is_some() && !left => machine.leave(),
                    _ = async { sigterm.as_mut().expect("guarded").recv().await }, if sigterm.is_some() && !left => machine.leave(),
                    _ = async { sigint.as_mut().expect("guarded").recv().await }, if sigint.is_some() && !left => machine.leave(),
                }
                if let Some(ended) = self
                    .drive(&mut machine, &mut pump, &mut sink, threads, held, (&mut plane, local_ip))
                    .await?
                {
                    return ended;
                }
            }
        }
        .await;
        let (written, sent) = machine.parts();
        self.parts_written.set(written);
        self.parts_sent.set(sent);
        let mut counts = machine.peer_counts();
        if let Some(peers) = plane.peers.take() {
            counts.refused_handshakes = peers.refusals().len() as u64;
            counts.shared = peers.shared_counts();
            peers.close();
        }
        self.peer_counts.set(counts);
        self.copies_held.set(machine.copies());
        self.log_bytes.set(machine.log().1);
        match ended {
            // The coordinator ends a job by sending `End` and closing its socket. What this
            // process wrote in between (a heartbeat, a slot's report) may reach a closed
            // socket, which resets the connection: the next write fails with a broken pipe
            // although `End` already waits to be read. The job ended as it should: that is
            // no error of this process.
            Err(e @ Error::Io { .. }) => {
                if self.end_waits(&mut stream, &mut pieces).await {
                    tracing::debug!(
                        peer = %self.peer,
                        error = &e as &dyn std::error::Error,
                        "a write failed after the coordinator ended the job"
                    );
                    Ok(machine.left())
                } else {
                    Err(e)
                }
            }
            ended => ended,
        }
    }

    /// Carries out the machine's orders, in order; the frames go with one flush at the end.
    /// `Some` once the machine decided the end.
    async fn drive<J: Job, S>(
        &self,
        machine: &mut Machine,
        pump: &mut Pump<J>,
        sink: &mut S,
        threads: &mut [Thread<J>],
        held: &HeldParts<J::Chunk>,
        (plane, local_ip): (&mut Plane, Option<std::net::IpAddr>),
    ) -> Result<Option<Result<bool, Error>>, Error>
    where
        S: futures::Sink<frame::Frame, Error = std::io::Error> + Unpin,
    {
        let mut frames = Vec::new();
        while let Some(out) = machine.poll() {
            match out {
                Out::Send(msg) => frames.push(msg),
                Out::Thread(t, msg) => self.to_thread(&threads[t], msg, &pump.job),
                Out::Close(t) => {
                    // Closing its queue ends the (idle) thread.
                    threads[t].tx = None;
                }
                Out::Code(code) => {
                    let answer = pump.code(&self.peer, code, held);
                    machine.answer(answer);
                }
                Out::Place(place) => pump.placing.start(place, pump.job.clone()),
                Out::Forget => {
                    // They are decoded into by the restored ones (`spares`).
                    let dropped = std::mem::take(&mut *lock(held));
                    tracing::info!(
                        partitions = dropped.len(),
                        "the job rolled back: held partitions dropped"
                    );
                    pump.placing = Placements::new();
                    pump.placing.spares = dropped;
                }
                Out::Peer { to, addr, msg } => {
                    match (plane.peers.as_mut(), addr.parse::<std::net::SocketAddr>()) {
                        (Some(peers), Ok(at)) => {
                            peers.send(to, at, msg);
                        }
                        (None, _) => machine.peer_down(to, "this process has no peer links".into()),
                        (_, Err(e)) => {
                            machine.peer_down(to, format!("its address {addr:?} is none: {e}"))
                        }
                    }
                }
                Out::HangUp { to } => {
                    if let (Some(peers), Some(link)) =
                        (plane.peers.as_mut(), plane.accepted.remove(&to))
                    {
                        peers.hang_up(to, link);
                    }
                }
                Out::Answer { to, msg } => {
                    if let (Some(peers), Some(&link)) =
                        (plane.peers.as_mut(), plane.accepted.get(&to))
                    {
                        // False if that link went down: the dialer hears of it, and sends
                        // what it pushed through the coordinator.
                        let _ = peers.answer(to, link, msg);
                    }
                }
                Out::Roster { me, session } => {
                    match (&mut plane.peers, self.direct.clone(), local_ip) {
                        (Some(peers), ..) => peers.set_session(session),
                        (None, Some((token, handshake_timeout)), Some(ip)) => {
                            let config = PeerConfig {
                                token,
                                session,
                                me,
                                max_frame: self.max_frame,
                                max_message: self.max_message,
                                heartbeat: self.heartbeat,
                                lease: self.lease,
                                handshake_timeout,
                                buffers: Arc::clone(&self.buffers),
                                segments: self.segments.clone(),
                                map_shared: self.map_shared,
                            };
                            match Peers::bind(ip, config, plane.events.clone()).await {
                                Ok((peers, addr)) => {
                                    plane.peers = Some(peers);
                                    machine.listening(addr.to_string());
                                }
                                Err(e) => tracing::warn!(
                                    error = &e as &dyn std::error::Error,
                                    "no listener for peers: this process's halos go through the coordinator"
                                ),
                            }
                        }
                        (None, ..) => {}
                    }
                }
                Out::Check(check) => pump.check(check),
                Out::Put(put) => pump.put(put),
                Out::Replay(replay) => pump.replay(replay),
                Out::End { tell, result } => {
                    // Best effort: the job ended, or this process gives up anyway.
                    frames.extend(tell);
                    if !frames.is_empty() {
                        let _ = self.send_all(sink, frames).await;
                    }
                    if result.is_ok() {
                        let _ = sink.close().await;
                    }
                    return Ok(Some(result));
                }
            }
        }
        if !frames.is_empty() {
            self.send_all(sink, frames).await?;
        }
        Ok(None)
    }

    /// Hands a message to a slot's thread ([`Out::Thread`]).
    fn to_thread<J: Job>(
        &self,
        thread: &Thread<J>,
        msg: ToThread,
        job: &Option<(u64, u64, Arc<J>)>,
    ) {
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
                // The machine runs nothing before the job value, which the pump then holds.
                let Some((_, chunks, job)) = job else {
                    tracing::warn!(chunk, "a run before the job value");
                    return;
                };
                if self.first_run.get().is_none() {
                    self.first_run.set(Some(self.dialled.elapsed()));
                }
                let _ = tx.send(SlotMsg::Run(Run {
                    slot,
                    chunk,
                    range,
                    state,
                    held,
                    job: Arc::clone(job),
                    phase,
                    chunks: *chunks,
                    queued: std::time::Instant::now(),
                }));
                return;
            }
            ToThread::Interrupt { slot, chunk } => SlotMsg::Interrupt { slot, chunk },
            ToThread::Capture { slot, chunk } => SlotMsg::Capture { slot, chunk },
            ToThread::Abandon { slot, chunk } => SlotMsg::Abandon { slot, chunk },
        };
        let _ = tx.send(m);
        // After the send (step 1 of the flag contract in `run/cell.rs`): the thread that
        // takes the bit finds the message.
        thread.cell.raise(MAIL);
    }

    /// Whether the coordinator's `End` is among the frames still readable after a write
    /// failed: reads what the connection still gives, for a heartbeat at most.
    async fn end_waits<S>(&self, stream: &mut S, pieces: &mut frame::Assembler) -> bool
    where
        S: futures::Stream<Item = std::io::Result<bytes::BytesMut>> + Unpin,
    {
        let until = tokio::time::Instant::now() + self.heartbeat.min(self.lease);
        loop {
            let Ok(Some(Ok(bytes))) = tokio::time::timeout_at(until, stream.next()).await else {
                return false;
            };
            match pieces.frame::<ToWorker>(&self.peer, bytes.freeze()) {
                Ok(Some(msg)) if msg.ends() => return true,
                Ok(_) => {}
                Err(_) => return false,
            }
        }
    }
}

/// Partitions placed on this process (`Place`, `PlacePart`) on their way to the held ones:
/// read from the store if they came as parts ([`PLACE_READS`] at a time), then decoded on
/// the blocking pool, two at a time in the order they came (the coordinator sends first
/// those that run first; all at once, they all ended late; one at a time, the process's
/// threads waited for them).
struct Placements<J: Job> {
    tasks: tokio::task::JoinSet<Settled<J::Chunk>>,
    chunks: HashMap<tokio::task::Id, u64>,
    turns: Arc<tokio::sync::Semaphore>,
    /// Reads from the store under way at once (see [`PLACE_READS`]).
    reads: Arc<tokio::sync::Semaphore>,
    /// The partitions this process held before a rollback (`Forget`), by chunk: a restored
    /// one is decoded into one of them, the same chunk's if there, so that its buffers are
    /// reused ([`codec::decode_into`]). Dropped once the restored phase ended.
    spares: HashMap<u64, J::Chunk>,
    /// Buffers that parts are read into, reused from part to part (see
    /// `Store::get_part_into`): as many as reads and decodes under way at once, until the
    /// restored phase ends (`None`: a buffer is dropped after its decode).
    buffers: Arc<std::sync::Mutex<Option<Vec<Vec<u8>>>>>,
}

/// Parts of placed partitions read from the store at once. Decoding goes two at a time, in
/// order, on the cores the threads share; reading waits on the store, so more reads than
/// decodes are under way: read two at a time, the one process left after a loss took more
/// than twice as long to read and run a grid's restored phase as reading the snapshot whole
/// (`BENCHMARKS.md`, owned partitions, has the figures).
const PLACE_READS: usize = 8;

/// A placed partition, decoded, and the halos it exported if it was asked to.
type Placed<C> = (C, Option<super::machine::Exported>);

/// A placement's end: its chunk, and its partition or why not.
type Settled<C> = (u64, Result<Placed<C>, Failure>);

impl<J: Job> Placements<J> {
    fn new() -> Self {
        Placements {
            tasks: tokio::task::JoinSet::new(),
            chunks: HashMap::new(),
            turns: Arc::new(tokio::sync::Semaphore::new(2)),
            reads: Arc::new(tokio::sync::Semaphore::new(PLACE_READS)),
            spares: HashMap::new(),
            buffers: Arc::new(std::sync::Mutex::new(Some(Vec::new()))),
        }
    }

    fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// Starts placing a partition ([`Out::Place`]); `job` is the phase's job value, to
    /// export its halos with.
    fn start(&mut self, place: Place, job: PhaseValue<J>) {
        let Place {
            chunk,
            from,
            export,
            store,
        } = place;
        let from = match from {
            Source::Sent(state) => Ok(state),
            Source::Part(part) => Err(part),
        };
        let spare = self.spares.remove(&chunk).or_else(|| {
            let any = *self.spares.keys().next()?;
            self.spares.remove(&any)
        });
        let read_turn = Arc::clone(&self.reads).acquire_owned();
        let turn = Arc::clone(&self.turns).acquire_owned();
        let buffers = Arc::clone(&self.buffers);
        let task = self.tasks.spawn(async move {
            let state = match from {
                Ok(state) => Placing::Sent(state),
                Err(part) => {
                    let _read = read_turn.await;
                    let started = std::time::Instant::now();
                    let buf = lock_buffers(&buffers)
                        .as_mut()
                        .and_then(Vec::pop)
                        .unwrap_or_default();
                    match read_placed(store, &part, buf).await {
                        Ok(state) => {
                            tracing::debug!(chunk, took = ?started.elapsed(), "a placed partition's part read");
                            Placing::Read(state)
                        }
                        Err(failure) => return (chunk, Err(failure)),
                    }
                }
            };
            let _turn = turn.await;
            let placed = tokio::task::spawn_blocking(move || {
                let started = std::time::Instant::now();
                let spared = spare.is_some();
                let bytes: &[u8] = match &state {
                    Placing::Sent(b) => b,
                    Placing::Read(b) => b,
                };
                let placed = decode_placed(chunk, bytes, export, job, spare);
                if let (Placing::Read(buf), Some(pool)) = (state, &mut *lock_buffers(&buffers)) {
                    pool.push(buf);
                }
                tracing::debug!(chunk, spared, took = ?started.elapsed(), "a placed partition decoded");
                placed
            })
            .await;
            let r = match placed {
                Ok(r) => r.map_err(super::thread::failure_of),
                Err(e) => Err(stopped(&e)),
            };
            (chunk, r)
        });
        self.chunks.insert(task.id(), chunk);
    }

    /// The next partition read and decoded (or that could not be).
    async fn next(&mut self) -> Option<Settled<J::Chunk>> {
        match self.tasks.join_next_with_id().await? {
            Ok((id, done)) => {
                self.chunks.remove(&id);
                Some(done)
            }
            Err(e) => {
                let chunk = self.chunks.remove(&e.id())?;
                Some((chunk, Err(stopped(&e))))
            }
        }
    }
}

/// A placed partition's state: sent with its `Place`, or read from the store into a buffer
/// of [`Placements::buffers`].
enum Placing {
    Sent(bytes::Bytes),
    Read(Vec<u8>),
}

/// The read buffers of placements, locked (a poisoned lock still holds whole buffers).
fn lock_buffers(
    buffers: &std::sync::Mutex<Option<Vec<Vec<u8>>>>,
) -> std::sync::MutexGuard<'_, Option<Vec<Vec<u8>>>> {
    buffers.lock().unwrap_or_else(|p| p.into_inner())
}

/// A placed partition's state decoded (into `spare` if there is one), and its halos
/// exported with the phase's job value if `export`.
pub(super) fn decode_placed<J: Job>(
    chunk: u64,
    state: &[u8],
    export: Option<u64>,
    job: PhaseValue<J>,
    spare: Option<J::Chunk>,
) -> Result<Placed<J::Chunk>, crate::Error> {
    let phase = job.as_ref().map_or(0, |(p, ..)| *p);
    let site = crate::Site::Chunk { phase, chunk };
    let part = crate::run::catch(site.clone(), J::NAME, || match spare {
        Some(mut part) => codec::decode_into("a chunk state", state, &mut part).map(|()| part),
        None => codec::decode::<J::Chunk>("a chunk state", state),
    })??;
    let (Some(placement), Some(hooks)) = (export, J::OWNERSHIP.hooks) else {
        return Ok((part, None));
    };
    let Some((_, chunks, job)) = job else {
        return Err(crate::Error::Internal(
            "a partition to export its halos came before the job value".into(),
        ));
    };
    let at = crate::exchange::At {
        chunk,
        chunks,
        phase,
    };
    let out = crate::run::catch(site, J::NAME, || (hooks.export)(&part, &job, at))?;
    let halos = out
        .iter()
        .map(|(to, p)| Ok((*to, (hooks.encode_halo)(p)?.into())))
        .collect::<Result<Vec<_>, crate::codec::Error>>()?;
    let exported = super::machine::Exported { placement, halos };
    Ok((part, Some(exported)))
}

/// A placement's task that stopped before its end.
fn stopped(e: &tokio::task::JoinError) -> Failure {
    Failure::Panicked {
        input: false,
        message: format!("placing a partition stopped: {e}"),
    }
}

/// The bytes of a placed partition's part, from the job's store.
pub(super) async fn read_placed(
    store: Option<crate::snapshot::Store>,
    part: &crate::snapshot::PartRef,
    buf: Vec<u8>,
) -> Result<Vec<u8>, Failure> {
    let Some(store) = store else {
        tracing::warn!(chunk = part.chunk, key = %part.key, "a partition was placed as a part, but this process has no usable store");
        return Err(Failure::Store {
            chain: vec!["this worker process has no usable snapshot store".to_owned()],
        });
    };
    store.get_part_into(part, buf).await.map_err(|e| {
        tracing::warn!(chunk = part.chunk, key = %part.key, error = &e as &dyn std::error::Error, "the part of a placed partition could not be read");
        Failure::Store {
            chain: crate::error::chain_texts(&e),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::fixtures::{Idle, IdleChunk};
    use bytes::Bytes;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// The I/O loop of a process connected to `addr`, with a long lease.
    fn io_of(addr: std::net::SocketAddr, heartbeat: Duration) -> Io {
        Io {
            peer: addr.to_string(),
            heartbeat,
            lease: Duration::from_secs(10),
            max_frame: 1 << 20,
            max_message: 1 << 20,
            stop: None,
            signals: false,
            grace: None,
            dialled: std::time::Instant::now(),
            first_run: std::cell::Cell::new(None),
            parts_written: std::cell::Cell::new(0),
            parts_sent: std::cell::Cell::new(0),
            direct: None,
            peer_counts: std::cell::Cell::new(Default::default()),
            bytes_sent: std::cell::Cell::new(0),
            copy_memory: u64::MAX,
            copies_held: std::cell::Cell::new((0, 0)),
            log_bytes: std::cell::Cell::new(0),
            buffers: Arc::new(Buffers::new(1 << 30)),
            segments: None,
            map_shared: false,
        }
    }

    /// A job with owned partitions for the I/O loop's tests; no chunk of it runs.
    #[derive(serde::Serialize, serde::Deserialize)]
    struct Strips;

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Strip(Vec<u64>);

    impl Job for Strips {
        const NAME: &'static str = "strips";
        const OWNERSHIP: crate::Ownership<Self> = crate::Ownership::PARTITIONS;
        type Chunk = Strip;
        type Reducer = crate::reduce::Sum<u64>;
        type Input = ();
        fn iterations(&self) -> u64 {
            4
        }
        fn chunk(&self, _: std::ops::Range<u64>) -> Strip {
            Strip(Vec::new())
        }
        fn reducer(&self) -> Self::Reducer {
            crate::reduce::Sum::new()
        }
    }

    impl crate::Chunk for Strip {
        type Job = Strips;
        type Output = u64;
        fn step(&mut self, _: &Strips, _: &()) -> crate::Step<u64> {
            crate::Step::Done(0)
        }
    }

    impl crate::Partition for Strip {
        type Halo = u64;
        fn export(&self, _: &Strips) -> (u64, u64) {
            (self.0[0], self.0[self.0.len() - 1])
        }
        fn begin_phase(&mut self, _: &Strips, _: Option<u64>, _: Option<u64>) {}
    }

    /// A job whose partitions exchange pieces (an allgather's are decoded to be shared);
    /// no chunk of it runs.
    #[derive(serde::Serialize, serde::Deserialize)]
    struct Gathers;

    #[derive(serde::Serialize, serde::Deserialize)]
    struct Gatherer;

    impl Job for Gathers {
        const NAME: &'static str = "gathers";
        const OWNERSHIP: crate::Ownership<Self> = crate::Ownership::EXCHANGES;
        type Chunk = Gatherer;
        type Reducer = crate::reduce::Sum<u64>;
        type Input = ();
        fn iterations(&self) -> u64 {
            4
        }
        fn chunk(&self, _: std::ops::Range<u64>) -> Gatherer {
            Gatherer
        }
        fn reducer(&self) -> Self::Reducer {
            crate::reduce::Sum::new()
        }
    }

    impl crate::Chunk for Gatherer {
        type Job = Gathers;
        type Output = u64;
        fn step(&mut self, _: &Gathers, _: &()) -> crate::Step<u64> {
            crate::Step::Done(0)
        }
    }

    impl crate::Exchange for Gatherer {
        type Piece = Vec<u64>;
        fn neighbours(_: &Gathers, _: u64, _: u64) -> Vec<u64> {
            Vec::new()
        }
        fn export(&self, _: &Gathers, _: Option<u64>) -> Vec<u64> {
            Vec::new()
        }
        fn begin_phase(&mut self, _: &Gathers, _: crate::Pieces<'_, Vec<u64>>) {}
    }

    /// The pieces of a phase's `Gathered` are decoded once into pieces every `Begin` of the
    /// process shares (the same allocation handed to each); bytes that do not decode end
    /// the process with a typed error naming a halo, and keep nothing of them.
    #[test]
    fn gathered_pieces_are_decoded_once_and_shared_or_refused_typed() {
        let held = HeldParts::<Gatherer>::default();
        let buffers = Buffers::new(1 << 20);
        let (mut job, mut gathered) = (None, GatheredHere::default());
        let bytes = |v: &Vec<u64>| bytes::Bytes::from(codec::encode("a piece", v).unwrap());
        let code = Code::Gathered {
            pieces: vec![(0, bytes(&vec![7, 8])), (2, bytes(&vec![9]))],
        };
        let state = (&mut job, &mut gathered);
        let got = run_code::<Gathers>(
            "the coordinator",
            code,
            state,
            &Inputs::default(),
            &held,
            (&buffers, None),
        );
        assert!(matches!(got, Ok(None)), "{got:?}");
        let (a, b) = (gathered.share(2).unwrap(), gathered.share(2).unwrap());
        let (a, b) = (a.get::<Vec<u64>>().unwrap(), b.get::<Vec<u64>>().unwrap());
        assert_eq!(a, &vec![9]);
        assert!(std::ptr::eq(a, b), "one decoded piece, shared");
        assert!(gathered.share(1).is_none(), "no piece from chunk 1");
        let code = Code::Gathered {
            pieces: vec![(0, bytes::Bytes::from_static(&[0xff]))],
        };
        let mut gathered = GatheredHere::default();
        let state = (&mut job, &mut gathered);
        let got = run_code::<Gathers>(
            "the coordinator",
            code,
            state,
            &Inputs::default(),
            &held,
            (&buffers, None),
        );
        assert!(
            matches!(&got, Err(Error::Undecodable { what, .. }) if what.contains("halo")),
            "{got:?}"
        );
        assert!(gathered.pieces.is_empty());
    }

    /// An allgather's pieces for a job whose partitions exchange with their neighbours only
    /// (a `Partition`'s halos need not be shared) are refused with a typed error, not
    /// decoded; nothing is kept for a `Begin` to name.
    #[test]
    fn gathered_pieces_for_a_job_of_neighbours_only_are_refused() {
        let held = HeldParts::<Strip>::default();
        let buffers = Buffers::new(1 << 20);
        let (mut job, mut gathered) = (None, GatheredHere::default());
        let code = Code::Gathered {
            pieces: vec![(0, bytes::Bytes::from_static(&[1]))],
        };
        let got = run_code::<Strips>(
            "the coordinator",
            code,
            (&mut job, &mut gathered),
            &Inputs::default(),
            &held,
            (&buffers, None),
        );
        assert!(
            matches!(&got, Err(Error::Rejected { reason, .. }) if reason.contains("neighbours only")),
            "{got:?}"
        );
        assert!(gathered.pieces.is_empty());
    }

    /// Partitions placed on a process, as a coordinator after a rollback places them: one as
    /// bytes is held and exports its halos as asked (a `CaptureHeld` about it then gets the
    /// same bytes back, so it waited for it); one whose bytes do not decode, and one sent as
    /// a part to a process without a store, are answered by `FailedHeld` at once, although
    /// nothing else asks about them; and `End` still ends the loop well.
    #[test]
    fn placed_partitions_are_held_or_refused_at_once() {
        runtime().block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let good = bytes::Bytes::from(
                crate::codec::encode("a chunk state", &Strip((0..100_000).collect())).unwrap(),
            );
            let sent = good.clone();
            let coordinator = tokio::spawn(async move {
                let (socket, _) = listener.accept().await.unwrap();
                let mut framed = Framed::new(socket, frame::codec(1 << 20));
                let part = crate::snapshot::PartRef {
                    chunk: 6,
                    key: "strips/00000000000000000001/parts/0-6-0000000000000001".to_owned(),
                    size: 8,
                    crc32c: 0,
                };
                let job = crate::codec::encode("the job", &Strips).unwrap();
                for msg in [
                    ToWorker::Phase {
                        phase: 5,
                        chunks: 8,
                        job: job.into(),
                    },
                    ToWorker::Place {
                        chunk: 1,
                        state: sent,
                        export: Some(7),
                    },
                    // Not next to chunk 1: whether its halo for chunk 2 is kept here would
                    // depend on which placement ends first.
                    ToWorker::Place {
                        chunk: 5,
                        state: Bytes::from_static(&[0xff; 3]),
                        export: None,
                    },
                    ToWorker::PlacePart {
                        chunk: 6,
                        part,
                        export: None,
                    },
                    ToWorker::CaptureHeld {
                        chunk: 1,
                        folder: 1,
                    },
                ] {
                    SinkExt::<Bytes>::send(&mut framed, frame::encode(&msg))
                        .await
                        .unwrap();
                }
                let mut got = Vec::new();
                while got.len() < 4 {
                    let f = framed.next().await.unwrap().unwrap();
                    match frame::decode_to_coordinator("worker", &f).unwrap() {
                        ToCoordinator::Heartbeat { .. } => {}
                        msg => got.push(msg),
                    }
                }
                SinkExt::<Bytes>::send(&mut framed, frame::encode(&ToWorker::End))
                    .await
                    .unwrap();
                while framed.next().await.is_some() {}
                got
            });
            let socket = tokio::net::TcpStream::connect(addr).await.unwrap();
            let io = io_of(addr, Duration::from_millis(50));
            let (_out_tx, out_rx) = unbounded_channel();
            let held = HeldParts::<Strip>::default();
            let framed = Framed::new(socket, frame::codec(1 << 20));
            let ended = io
                .run::<Strips>(framed, &mut [], &held, &Arc::default(), out_rx)
                .await;
            assert!(matches!(ended, Ok(false)), "{ended:?}");
            let mut got = coordinator.await.unwrap();
            // Chunk 1's answers in the order sent, before the others'.
            got.sort_by_key(|m| machine::chunk_of(m).unwrap_or(u64::MAX));
            let [exported, captured, undecodable, unread] = &got[..] else {
                panic!("{got:?}");
            };
            let halo = |h: u64| Bytes::from(crate::codec::encode("a halo", &h).unwrap());
            assert_eq!(
                exported,
                &ToCoordinator::Exported {
                    chunk: 1,
                    halos: vec![
                        (Some(0), frame::Halo::Sent(halo(0))),
                        (Some(2), frame::Halo::Sent(halo(99_999))),
                    ],
                    placement: 7,
                }
            );
            assert_eq!(
                captured,
                &ToCoordinator::CapturedHeld {
                    chunk: 1,
                    state: good
                }
            );
            assert!(
                matches!(
                    undecodable,
                    ToCoordinator::FailedHeld {
                        chunk: 5,
                        failure: Failure::Codec { .. }
                    }
                ),
                "{undecodable:?}"
            );
            assert!(
                matches!(
                    unread,
                    ToCoordinator::FailedHeld {
                        chunk: 6,
                        failure: Failure::Store { .. }
                    }
                ),
                "{unread:?}"
            );
            assert_eq!(lock(&held).keys().copied().collect::<Vec<_>>(), vec![1]);
        });
    }

    /// The coordinator sends `End` and closes its socket with this process's heartbeats
    /// unread, which resets the connection: a write of this process then fails with a broken
    /// pipe or a reset, although `End` waits to be read. The job still ended as it should,
    /// and the loop says so (it ended with the write's error, and a worker process that
    /// served its job to the end exited with an error). Small socket buffers and a
    /// heartbeat at every turn make it certain: the process waits in a write when the reset
    /// comes. Every other round, `End` comes in a batch: it was taken for an end only alone.
    #[test]
    fn a_write_that_fails_after_the_coordinator_s_end_is_no_error() {
        runtime().block_on(async {
            for round in 0..10 {
                let listening = tokio::net::TcpSocket::new_v4().unwrap();
                listening.set_recv_buffer_size(4096).unwrap();
                listening.bind("127.0.0.1:0".parse().unwrap()).unwrap();
                let addr = listening.local_addr().unwrap();
                let listener = listening.listen(1).unwrap();
                let coordinator = tokio::spawn(async move {
                    let (socket, _) = listener.accept().await.unwrap();
                    let mut framed = Framed::new(socket, frame::codec(1 << 20));
                    // The worker's heartbeats pile up unread until it waits in a write.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    // `End` alone, or in a batch with what else was decided at once.
                    let end = if round % 2 == 0 {
                        ToWorker::End
                    } else {
                        ToWorker::Batch(vec![ToWorker::Heartbeat, ToWorker::End])
                    };
                    SinkExt::<Bytes>::send(&mut framed, frame::encode(&end))
                        .await
                        .unwrap();
                    let _ = SinkExt::<Bytes>::close(&mut framed).await;
                });
                let dialling = tokio::net::TcpSocket::new_v4().unwrap();
                dialling.set_send_buffer_size(4096).unwrap();
                let socket = dialling.connect(addr).await.unwrap();
                let io = io_of(addr, Duration::from_micros(1));
                let (_out_tx, out_rx) = unbounded_channel();
                let held = HeldParts::<IdleChunk>::default();
                let framed = Framed::new(socket, frame::codec(1 << 20));
                let ended = io
                    .run::<Idle>(framed, &mut [], &held, &Arc::default(), out_rx)
                    .await;
                assert!(
                    matches!(ended, Ok(false)),
                    "round {round}: the loop ended with {ended:?}"
                );
                coordinator.await.unwrap();
            }
        });
    }
}
