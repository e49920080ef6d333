//! The I/O task of a worker process: frames in and out, heartbeats and the lease, and the
//! snapshot parts this process writes itself (steps 2-7 of the protocol in `mod.rs`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio_util::codec::Framed;

use super::halos::Keeper;
use super::thread::{HeldParts, Run, SlotMsg, Thread, lock};
use crate::codec;
use crate::job::Job;
use crate::run::{MAIL, SuspendToken};
use crate::wire::Error;
use crate::wire::frame::{self, Failure, SLOTS_PER_THREAD, ToCoordinator, ToWorker};

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
    /// The partitions here and the halos kept for them (`halos.rs`).
    pub(super) keeper: std::cell::RefCell<Keeper>,
}

/// What background tasks of the I/O loop report.
enum Background {
    /// The store offered by the coordinator was checked: usable, or why not.
    Store(Result<(crate::snapshot::Store, String), Unusable>),
    /// A captured state went to the store (`CapturedPart`), or could not and goes to the
    /// coordinator instead (`Captured`).
    Part(ToCoordinator),
    /// A held partition's part went to the store (`CapturedHeldPart`), or could not and goes
    /// to the coordinator instead (`CapturedHeld`); what waits behind it about that chunk
    /// goes next.
    HeldPart(u64, ToCoordinator),
}

/// Why an offered store is not used by this process (its states then go to the coordinator).
#[derive(Debug, thiserror::Error)]
enum Unusable {
    /// The URL does not open here (no credentials, an option this build does not know, …).
    #[error("the store does not open from this process")]
    Open(#[source] crate::snapshot::Error),
    /// The witness snapshot cannot be read here (another disk, wrong credentials, …).
    #[error("the coordinator's latest snapshot cannot be read from this process")]
    Read(#[source] crate::snapshot::Error),
    /// The witness is there but was written at another time: another store of the same name.
    #[error("snapshot {id} in {url} is not the coordinator's (created at another time)")]
    Another {
        id: crate::snapshot::SnapshotId,
        url: String,
    },
}

/// A message about a chunk waiting behind the write of that chunk's held partition: the
/// message, the epoch folder of the capture it answers (if it does), and the phase.
type Behind = (ToCoordinator, Option<u64>, Option<u64>);

/// Parts this process writes to the job's store itself (step 7 of the protocol in
/// `mod.rs`).
///
/// # Order of the answers about a held partition
///
/// The coordinator matches an answer to a `CaptureHeld` with the latest one it asked of
/// this process for that chunk, which is right only if the partition did not change in
/// between: it holds when the answers about one partition reach it in the order they were
/// asked, each before anything later about that partition (the `Done` of its next run, its
/// `Surrendered`), as when the answer was made at once. A write in the background would let
/// those overtake it, so while a held partition's part is written, every message about that
/// chunk waits behind it (`behind`) and goes, in order, once the write ends; other chunks'
/// messages go at once. The partition's bytes are taken when the capture is asked, so its
/// next run is not held up.
#[derive(Default)]
struct Parts {
    /// The store and job id, once the witness was read there.
    store: Option<(crate::snapshot::Store, String)>,
    /// A check of an offered store is under way.
    checking: bool,
    /// The epoch folder of each requested capture.
    folders: std::collections::HashMap<(u32, u64), u64>,
    /// Held partitions whose part is being written, by chunk, with the messages about that
    /// chunk that wait for the write, oldest first.
    behind: std::collections::HashMap<u64, std::collections::VecDeque<Behind>>,
}

/// The chunk a message to the coordinator is about, if any.
fn chunk_of(msg: &ToCoordinator) -> Option<u64> {
    match msg {
        ToCoordinator::Done { chunk, .. }
        | ToCoordinator::Surrendered { chunk, .. }
        | ToCoordinator::CapturedHeld { chunk, .. }
        | ToCoordinator::CapturedHeldPart { chunk, .. }
        | ToCoordinator::Missing { chunk }
        | ToCoordinator::FailedHeld { chunk, .. }
        | ToCoordinator::Exported { chunk, .. }
        | ToCoordinator::Released { chunk, .. }
        | ToCoordinator::Yielded { chunk, .. }
        | ToCoordinator::Abandoned { chunk, .. }
        | ToCoordinator::Captured { chunk, .. }
        | ToCoordinator::CapturedPart { chunk, .. }
        | ToCoordinator::Failed { chunk, .. } => Some(*chunk),
        ToCoordinator::Heartbeat { .. }
        | ToCoordinator::Leave { .. }
        | ToCoordinator::Piece { .. }
        | ToCoordinator::Undecodable { .. } => None,
    }
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
                    crate::snapshot::Store::open_with(&url, options).map_err(Unusable::Open)?;
                let id = crate::snapshot::SnapshotId::new(job_id.clone(), epoch);
                let manifest = store.manifest(&id).await.map_err(Unusable::Read)?;
                if manifest.created_unix_ms != created_unix_ms {
                    return Err(Unusable::Another { id, url });
                }
                Ok((store, job_id))
            };
            let _ = tx.send(Background::Store(checked.await));
        });
    }

    /// Routes a message for the coordinator: a captured state or held partition that this
    /// process can store goes up in the background; a message about a chunk whose held
    /// partition is being written waits behind it; anything else goes to the coordinator
    /// now. `held_folder` is the epoch folder of the `CaptureHeld` that `msg` answers.
    fn route(
        &mut self,
        msg: ToCoordinator,
        held_folder: Option<u64>,
        phase: Option<u64>,
        tx: &UnboundedSender<Background>,
    ) -> Option<ToCoordinator> {
        let folder = match &msg {
            ToCoordinator::Captured { slot, chunk, .. }
            | ToCoordinator::Done { slot, chunk, .. }
            | ToCoordinator::Yielded { slot, chunk, .. }
            | ToCoordinator::Failed { slot, chunk, .. } => self.folders.remove(&(*slot, *chunk)),
            ToCoordinator::CapturedHeld { .. } => held_folder,
            _ => None,
        };
        if let Some(queue) = chunk_of(&msg).and_then(|c| self.behind.get_mut(&c)) {
            queue.push_back((msg, folder, phase));
            return None;
        }
        self.go(msg, folder, phase, tx)
    }

    /// A message that waits for nothing: a state to store goes up in the background (and
    /// `None` is returned), anything else is returned, to send now.
    fn go(
        &mut self,
        msg: ToCoordinator,
        folder: Option<u64>,
        phase: Option<u64>,
        tx: &UnboundedSender<Background>,
    ) -> Option<ToCoordinator> {
        let (Some(folder), Some((store, job_id)), Some(phase)) = (folder, &self.store, phase)
        else {
            return Some(msg);
        };
        if !matches!(
            msg,
            ToCoordinator::Captured { .. } | ToCoordinator::CapturedHeld { .. }
        ) {
            return Some(msg);
        }
        let (store, job_id, tx) = (store.clone(), job_id.clone(), tx.clone());
        match msg {
            ToCoordinator::Captured { slot, chunk, state } => {
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
            }
            ToCoordinator::CapturedHeld { chunk, state } => {
                self.behind.insert(chunk, std::collections::VecDeque::new());
                tokio::spawn(async move {
                    let reply = match store
                        .put_part(&job_id, folder, phase, chunk, state.clone())
                        .await
                    {
                        Ok(part) => ToCoordinator::CapturedHeldPart { chunk, part },
                        Err(e) => {
                            tracing::warn!(error = %e, chunk, "a held partition's part could not be stored; it goes to the coordinator");
                            ToCoordinator::CapturedHeld { chunk, state }
                        }
                    };
                    let _ = tx.send(Background::HeldPart(chunk, reply));
                });
            }
            msg => return Some(msg),
        }
        None
    }

    /// The write of `chunk`'s held partition ended: the messages that waited behind it, to
    /// send now in order, up to the next held write of that chunk (the rest waits for it).
    fn written(&mut self, chunk: u64, tx: &UnboundedSender<Background>) -> Vec<ToCoordinator> {
        let mut queue = self.behind.remove(&chunk).unwrap_or_default();
        let mut now = Vec::new();
        while let Some((msg, folder, phase)) = queue.pop_front() {
            now.extend(self.go(msg, folder, phase, tx));
            if let Some(next) = self.behind.get_mut(&chunk) {
                next.extend(queue);
                break;
            }
        }
        now
    }
}

impl Io {
    /// Counts a snapshot part about to be sent: written here (its reference) or sent as
    /// bytes for the coordinator to write.
    fn tally(&self, msg: &ToCoordinator) {
        let counter = match msg {
            ToCoordinator::CapturedPart { .. } | ToCoordinator::CapturedHeldPart { .. } => {
                &self.parts_written
            }
            ToCoordinator::Captured { .. } | ToCoordinator::CapturedHeld { .. } => &self.parts_sent,
            _ => return,
        };
        counter.set(counter.get() + 1);
    }

    /// Sends `msgs` to the coordinator (in pieces where they are long), then flushes. Halos
    /// for partitions here are kept on the way ([`Keeper::outgoing`]).
    async fn send_all<S>(
        &self,
        sink: &mut S,
        msgs: impl IntoIterator<Item = ToCoordinator>,
    ) -> Result<(), Error>
    where
        S: futures::Sink<bytes::Bytes, Error = std::io::Error> + Unpin,
    {
        let msgs = {
            let mut keeper = self.keeper.borrow_mut();
            let mut out = Vec::new();
            for msg in msgs {
                keeper.outgoing(msg, &mut out);
            }
            out
        };
        for msg in msgs {
            self.tally(&msg);
            for f in frame::Frames::new(&msg, self.max_frame) {
                self.write(sink.feed(f)).await?;
            }
        }
        self.write(sink.flush()).await
    }

    /// A partition placed here is read and decoded: held from now on, or the coordinator
    /// learns why not.
    async fn placed<S, C>(
        &self,
        sink: &mut S,
        held: &HeldParts<C>,
        chunk: u64,
        placed: Result<Placed<C>, Failure>,
    ) -> Result<(), Error>
    where
        S: futures::Sink<bytes::Bytes, Error = std::io::Error> + Unpin,
    {
        match placed {
            Ok((part, halos)) => {
                if lock(held).insert(chunk, part).is_some() {
                    tracing::warn!(chunk, "a partition placed here replaced the one held");
                }
                match halos {
                    Some((up, down)) => {
                        let halos = (frame::Halo::Sent(up), frame::Halo::Sent(down));
                        self.send_all(sink, [ToCoordinator::Exported { chunk, halos }])
                            .await
                    }
                    None => Ok(()),
                }
            }
            Err(failure) => {
                tracing::warn!(chunk, ?failure, "a partition placed here could not be held");
                self.send_all(sink, [ToCoordinator::FailedHeld { chunk, failure }])
                    .await
            }
        }
    }

    /// The coordinator sent nothing for a whole lease: it is given up.
    fn silent(&self) -> Error {
        tracing::warn!(
            peer = %self.peer,
            lease = ?self.lease,
            "the coordinator fell silent: nothing from it for a whole lease; giving it up"
        );
        Error::LeaseExpired {
            peer: self.peer.clone(),
            after: self.lease,
        }
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
            Err(_) => Err(self.silent()),
        }
    }

    /// The I/O loop; returns whether the process left on a stop request.
    pub(super) async fn run<J: Job>(
        &self,
        framed: Framed<crate::wire::transport::Stream, tokio_util::codec::LengthDelimitedCodec>,
        threads: &mut [Thread<J>],
        held: &HeldParts<J::Chunk>,
        mut out_rx: UnboundedReceiver<ToCoordinator>,
    ) -> Result<bool, Error> {
        let peer = &self.peer;
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
        let mut pieces = frame::Assembler::new(self.max_message);
        let (bg_tx, mut bg_rx) = unbounded_channel();
        // The lease runs from the last frame received from the coordinator, and only frames
        // received re-arm it: this process's own heartbeats, threads' messages and background
        // work wake the loop but prove nothing about the coordinator. (It was re-armed at
        // every turn of the loop, so a coordinator that fell silent was never given up: the
        // heartbeat tick alone kept it alive.) A write that does not move for a lease gives
        // it up too (`write`).
        let mut lease_ends = tokio::time::Instant::now() + self.lease;
        // Partitions placed here, being read and decoded on the blocking pool while this
        // loop goes on, two at a time in the order they came (the coordinator sends first
        // those that run first; all at once, they all ended late; one at a time, the
        // process's threads waited for them). A later message about one of them waits for
        // it (`held_chunk`).
        let mut placing: Placements<J> = Placements::new();
        let ended: Result<bool, Error> = async { loop {
            let phase = job.as_ref().map(|(p, _)| *p);
            let stop_now = tokio::select! {
                () = tokio::time::sleep_until(lease_ends) => {
                    return Err(self.silent());
                }
                next = stream.next() => {
                    let bytes = match next {
                        None => return Err(Error::Closed { peer: peer.clone() }),
                        Some(Err(e)) => return Err(Error::io(peer, e, self.max_frame)),
                        Some(Ok(b)) => b,
                    };
                    lease_ends = tokio::time::Instant::now() + self.lease;
                    let Some(msg) = pieces.frame::<ToWorker>(peer, bytes.freeze())? else {
                        continue;
                    };
                    match msg {
                        ToWorker::End => {
                            let _ = sink.close().await;
                            return Ok(left);
                        }
                        msg @ ToWorker::Store { .. } => parts.offered(msg, &bg_tx),
                        msg => {
                            if J::OWNERSHIP.is_partitioned() {
                                self.keeper.borrow_mut().arrived(&msg);
                            }
                            let Some(msg) = self.keeper.borrow_mut().begin(msg) else {
                                return Err(Error::Rejected {
                                    peer: peer.clone(),
                                    what: "a message to a worker",
                                    reason: "a partition's halo kept here that this process did not keep".into(),
                                    source: None,
                                });
                            };
                            if let Some(chunk) = held_chunk(&msg) {
                                while placing.places(chunk) {
                                    let Some((c, r)) = placing.next().await else { break };
                                    self.placed(&mut sink, held, c, r).await?;
                                }
                            }
                            if J::OWNERSHIP.is_partitioned() {
                                let store = parts.store.as_ref().map(|(s, _)| s.clone());
                                if placing.start(&msg, job.clone(), store) {
                                    continue;
                                }
                            }
                            if matches!(msg, ToWorker::Forget) {
                                // No thread runs one of them: the coordinator waited for
                                // every chunk to come back before it rolled the job back.
                                // They are decoded into by the restored ones (`spares`).
                                let dropped = std::mem::take(&mut *lock(held));
                                tracing::info!(
                                    partitions = dropped.len(),
                                    "the job rolled back: held partitions dropped"
                                );
                                placing = Placements::new();
                                placing.spares = dropped;
                            } else if matches!(msg, ToWorker::Begin { .. }) {
                                // The restored phase ended: every placement has started.
                                placing.spares.clear();
                                *lock_buffers(&placing.buffers) = None;
                            }
                            if self.first_run.get().is_none() && matches!(msg, ToWorker::Run { .. }) {
                                self.first_run.set(Some(self.dialled.elapsed()));
                            }
                            if let ToWorker::Capture { slot, chunk, folder } = msg {
                                parts.folders.insert((slot, chunk), folder);
                            }
                            let held_folder = match msg {
                                ToWorker::CaptureHeld { folder, .. } => Some(folder),
                                _ => None,
                            };
                            let reply = match dispatch(peer, msg, threads, &mut job, held) {
                                Ok(reply) => reply,
                                Err(e) => {
                                    if let Error::Undecodable { what, source, .. } = &e {
                                        // The coordinator learns why this process leaves.
                                        let msg = ToCoordinator::Undecodable {
                                            what: (*what).to_owned(),
                                            error: source.clone(),
                                        };
                                        let _ = self.write(sink.send(frame::encode(&msg))).await;
                                    }
                                    return Err(e);
                                }
                            };
                            let phase = job.as_ref().map(|(p, _)| *p);
                            if let Some(reply) = reply.and_then(|r| parts.route(r, held_folder, phase, &bg_tx)) {
                                self.send_all(&mut sink, [reply]).await?;
                            }
                        }
                    }
                    false
                }
                msg = out_rx.recv() => {
                    let Some(msg) = msg else { return Ok(left) };
                    let mut next = Some(msg);
                    let mut now = Vec::new();
                    while let Some(msg) = next {
                        now.extend(parts.route(msg, None, phase, &bg_tx));
                        next = out_rx.try_recv().ok();
                    }
                    self.send_all(&mut sink, now).await?;
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
                            tracing::info!(why = &why as &dyn std::error::Error, "snapshot parts go to the coordinator");
                            parts.checking = false;
                        }
                        Background::Part(msg) => {
                            if !matches!(msg, ToCoordinator::CapturedPart { .. }) {
                                parts.store = None;
                            }
                            self.send_all(&mut sink, [msg]).await?;
                        }
                        Background::HeldPart(chunk, msg) => {
                            if !matches!(msg, ToCoordinator::CapturedHeldPart { .. }) {
                                parts.store = None;
                            }
                            let next = parts.written(chunk, &bg_tx);
                            self.send_all(&mut sink, std::iter::once(msg).chain(next)).await?;
                        }
                    }
                    false
                }
                Some((chunk, r)) = placing.next(), if !placing.is_empty() => {
                    self.placed(&mut sink, held, chunk, r).await?;
                    false
                }
                _ = beat.tick() => {
                    let progress = threads.iter().map(|s| s.cell.progress()).collect();
                    self.write(sink.send(frame::encode(&ToCoordinator::Heartbeat { progress }))).await?;
                    false
                }
                _ = async { stop.as_ref().expect("guarded").fired().await }, if stop.is_some() && !left => true,
                _ = async { sigterm.as_mut().expect("guarded").recv().await }, if sigterm.is_some() && !left => true,
                _ = async { sigint.as_mut().expect("guarded").recv().await }, if sigint.is_some() && !left => true,
            };
            if stop_now {
                left = true;
                let grace_ms = self
                    .grace
                    .map(|g| g.as_millis().min(u64::MAX as u128) as u64);
                self.write(sink.send(frame::encode(&ToCoordinator::Leave { grace_ms })))
                    .await?;
            }
        } }
        .await;
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
                    Ok(left)
                } else {
                    Err(e)
                }
            }
            ended => ended,
        }
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
                Ok(Some(ToWorker::End)) => return true,
                Ok(_) => {}
                Err(_) => return false,
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
    held: &HeldParts<J::Chunk>,
) -> Result<Option<ToCoordinator>, Error> {
    // A message that decoded but that the protocol does not allow here.
    let bad = |reason: String| Error::Rejected {
        peer: peer.to_owned(),
        what: "a message to a worker",
        reason,
        source: None,
    };
    // Bytes of the job's own types that do not decode although the versions matched.
    let undecodable = |what: &'static str, e: codec::Error| Error::Undecodable {
        peer: peer.to_owned(),
        job: J::NAME.to_owned(),
        version: J::VERSION,
        what,
        here: true,
        source: e.source,
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
        ToWorker::Piece { .. } => {
            return Err(Error::Malformed {
                peer: peer.to_owned(),
                what: "a message to a worker",
                reason: "a piece outside a pieced message".to_owned(),
                source: None,
            });
        }
        ToWorker::Phase { phase, job: bytes } => {
            let value: J =
                codec::decode("the job", &bytes).map_err(|e| undecodable("the job value", e))?;
            *job = Some((phase, Arc::new(value)));
        }
        ToWorker::Run {
            slot,
            chunk,
            start,
            end,
            state,
            held: is_held,
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
                    held: is_held,
                    job: Arc::clone(j),
                    phase: *phase,
                    queued: std::time::Instant::now(),
                }));
        }
        ToWorker::Interrupt { slot, chunk }
        | ToWorker::Capture { slot, chunk, .. }
        | ToWorker::Abandon { slot, chunk } => {
            let (t, _) = thread_of(threads, slot)?;
            let th = &threads[t];
            let m = match msg {
                ToWorker::Capture { .. } => SlotMsg::Capture { slot, chunk },
                ToWorker::Abandon { .. } => SlotMsg::Abandon { slot, chunk },
                _ => SlotMsg::Interrupt { slot, chunk },
            };
            let _ = th.tx.as_ref().expect("live").send(m);
            // After the send (step 1 of the flag contract in `run/cell.rs`): the thread that
            // takes the bit finds the message.
            th.cell.raise(MAIL);
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
        ToWorker::Begin {
            chunk,
            before,
            after,
        } => {
            let (Some((phase, j)), Some(hooks)) = (job.as_ref(), J::OWNERSHIP.hooks) else {
                return Err(bad(
                    "a partition's halos for a job without partitions".into()
                ));
            };
            let halo = |h: Option<frame::Halo>| match h {
                None => Ok(None),
                Some(frame::Halo::Sent(b)) => (hooks.decode_halo)(&b)
                    .map(Some)
                    .map_err(|e| undecodable("a halo", e)),
                // `run` gave the kept ones back (`Keeper::begin`).
                Some(frame::Halo::Kept) => Err(bad("a kept halo that was not given back".into())),
            };
            let (before, after) = (halo(before)?, halo(after)?);
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
            if let Err(e) =
                crate::run::catch(site, J::NAME, || (hooks.begin)(part, j, before, after))
            {
                return Ok(Some(ToCoordinator::FailedHeld {
                    chunk,
                    failure: super::thread::failure_of(e),
                }));
            }
        }
        ToWorker::Surrender { chunk } | ToWorker::CaptureHeld { chunk, .. } => {
            let surrender = matches!(msg, ToWorker::Surrender { .. });
            let mut parts = lock(held);
            let encoded = if surrender {
                parts
                    .remove(&chunk)
                    .map(|p| codec::encode("a chunk state", &p))
            } else {
                parts.get(&chunk).map(|p| codec::encode("a chunk state", p))
            };
            return Ok(Some(match encoded {
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
                Some(Ok(b)) if surrender => ToCoordinator::Surrendered {
                    chunk,
                    state: b.into(),
                },
                Some(Ok(b)) => ToCoordinator::CapturedHeld {
                    chunk,
                    state: b.into(),
                },
            }));
        }
        // `run` drops the held partitions (they are the spares of the restored ones).
        ToWorker::Forget => {}
        // `run` places the partitions of a job with partitions, off this loop.
        ToWorker::Place { .. } | ToWorker::PlacePart { .. } => {
            return Err(bad("a partition placed for a job without partitions".into()));
        }
        ToWorker::Heartbeat | ToWorker::End | ToWorker::Store { .. } => {}
    }
    Ok(None)
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
/// order, on the cores the threads share; reading waits on the store: from a SeaweedFS S3
/// server a 4 MB part took 5-10 ms to come, and read two at a time (with the decode) the
/// one process left after a loss took 450-630 ms to read and run a 128 MB grid's restored
/// phase, where reading the snapshot whole takes 175-205 ms.
const PLACE_READS: usize = 8;

/// A placed partition, decoded, and the halos it exported if it was asked to.
type Placed<C> = (C, Option<(bytes::Bytes, bytes::Bytes)>);

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

    /// Whether the partition of `chunk` is on its way.
    fn places(&self, chunk: u64) -> bool {
        self.chunks.values().any(|&c| c == chunk)
    }

    /// Starts placing the partition `msg` brings, if it is a `Place` or a `PlacePart`;
    /// `job` is the phase's job value, to export its halos with.
    fn start(
        &mut self,
        msg: &ToWorker,
        job: Option<(u64, Arc<J>)>,
        store: Option<crate::snapshot::Store>,
    ) -> bool {
        let (chunk, from, export) = match msg {
            ToWorker::Place {
                chunk,
                state,
                export,
            } => (*chunk, Ok(state.clone()), *export),
            ToWorker::PlacePart {
                chunk,
                part,
                export,
            } => (*chunk, Err(part.clone()), *export),
            _ => return false,
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
        true
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
fn decode_placed<J: Job>(
    chunk: u64,
    state: &[u8],
    export: bool,
    job: Option<(u64, Arc<J>)>,
    spare: Option<J::Chunk>,
) -> Result<Placed<J::Chunk>, crate::Error> {
    let phase = job.as_ref().map_or(0, |(p, _)| *p);
    let site = crate::Site::Chunk { phase, chunk };
    let part = crate::run::catch(site.clone(), J::NAME, || match spare {
        Some(mut part) => codec::decode_into("a chunk state", state, &mut part).map(|()| part),
        None => codec::decode::<J::Chunk>("a chunk state", state),
    })??;
    let (true, Some(hooks)) = (export, J::OWNERSHIP.hooks) else {
        return Ok((part, None));
    };
    let Some((_, job)) = job else {
        return Err(crate::Error::Internal(
            "a partition to export its halos came before the job value".into(),
        ));
    };
    let (up, down) = crate::run::catch(site, J::NAME, || (hooks.export)(&part, &job))?;
    let halos = (
        (hooks.encode_halo)(&up)?.into(),
        (hooks.encode_halo)(&down)?.into(),
    );
    Ok((part, Some(halos)))
}

/// A placement's task that stopped before its end.
fn stopped(e: &tokio::task::JoinError) -> Failure {
    Failure::Panicked {
        input: false,
        message: format!("placing a partition stopped: {e}"),
    }
}

/// The bytes of a placed partition's part, from the job's store.
async fn read_placed(
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

/// The held partition a message from the coordinator is about, if it is about one.
fn held_chunk(msg: &ToWorker) -> Option<u64> {
    match msg {
        ToWorker::Run {
            chunk, held: true, ..
        }
        | ToWorker::Begin { chunk, .. }
        | ToWorker::Surrender { chunk }
        | ToWorker::CaptureHeld { chunk, .. }
        | ToWorker::Place { chunk, .. }
        | ToWorker::PlacePart { chunk, .. } => Some(*chunk),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::fixtures::{Idle, IdleChunk};
    use bytes::Bytes;

    fn done(chunk: u64) -> ToCoordinator {
        ToCoordinator::Done {
            slot: 0,
            chunk,
            output: Bytes::from_static(b"out"),
            halos: None,
            iterations: 1,
            busy_ns: 1,
        }
    }

    fn held(chunk: u64, state: &'static [u8]) -> ToCoordinator {
        ToCoordinator::CapturedHeld {
            chunk,
            state: Bytes::from_static(state),
        }
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// A held partition's part goes to the store in the background and is answered by its
    /// reference, in the folder asked; the messages about that chunk wait behind the answer
    /// (in order, a second capture of it included), and other chunks' go at once.
    #[test]
    fn held_parts_are_written_in_the_background_and_answered_in_order() {
        runtime().block_on(async {
            let store = crate::snapshot::Store::open("memory://").unwrap();
            let mut parts = Parts {
                store: Some((store.clone(), "job".to_owned())),
                ..Parts::default()
            };
            let (tx, mut rx) = unbounded_channel();
            assert!(
                parts
                    .route(held(3, b"first"), Some(7), Some(2), &tx)
                    .is_none()
            );
            assert!(parts.route(done(3), None, Some(2), &tx).is_none());
            assert!(
                parts
                    .route(held(3, b"second"), Some(8), Some(3), &tx)
                    .is_none()
            );
            assert_eq!(parts.route(done(4), None, Some(3), &tx), Some(done(4)));
            // Nothing about chunk 3 goes before its first part is written.
            let Some(Background::HeldPart(3, first)) = rx.recv().await else {
                panic!("not the first part");
            };
            let ToCoordinator::CapturedHeldPart { chunk: 3, part } = first else {
                panic!("{first:?}");
            };
            assert!(part.key.starts_with("job/00000000000000000007/parts/2-3-"));
            assert_eq!(store.get_part(&part).await.unwrap(), &b"first"[..]);
            // Then its `Done`; the second capture waits for its own write.
            assert_eq!(parts.written(3, &tx), vec![done(3)]);
            let Some(Background::HeldPart(3, second)) = rx.recv().await else {
                panic!("not the second part");
            };
            let ToCoordinator::CapturedHeldPart { part, .. } = second else {
                panic!("{second:?}");
            };
            assert!(part.key.starts_with("job/00000000000000000008/parts/3-3-"));
            assert_eq!(store.get_part(&part).await.unwrap(), &b"second"[..]);
            assert!(parts.written(3, &tx).is_empty());
            // Nothing waits any more: chunk 3's messages go at once.
            assert_eq!(parts.route(done(3), None, Some(3), &tx), Some(done(3)));
        });
    }

    /// Without a store that this process showed it reaches, a held partition's bytes go to
    /// the coordinator at once; a write that fails sends them too.
    #[test]
    fn held_parts_go_as_bytes_without_a_usable_store() {
        runtime().block_on(async {
            let mut parts = Parts::default();
            let (tx, mut rx) = unbounded_channel();
            assert_eq!(
                parts.route(held(3, b"state"), Some(7), Some(2), &tx),
                Some(held(3, b"state"))
            );
            // An invalid job id: the write fails and the bytes go instead.
            let store = crate::snapshot::Store::open("memory://").unwrap();
            parts.store = Some((store, "no/such id".to_owned()));
            assert!(
                parts
                    .route(held(3, b"state"), Some(7), Some(2), &tx)
                    .is_none()
            );
            let Some(Background::HeldPart(3, reply)) = rx.recv().await else {
                panic!("no answer");
            };
            assert_eq!(reply, held(3, b"state"));
            assert!(parts.written(3, &tx).is_empty());
        });
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
            keeper: std::cell::RefCell::default(),
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
                    chunk: 3,
                    key: "strips/00000000000000000001/parts/0-3-0000000000000001".to_owned(),
                    size: 8,
                    crc32c: 0,
                };
                let job = crate::codec::encode("the job", &Strips).unwrap();
                for msg in [
                    ToWorker::Phase {
                        phase: 5,
                        job: job.into(),
                    },
                    ToWorker::Place {
                        chunk: 1,
                        state: sent,
                        export: true,
                    },
                    ToWorker::Place {
                        chunk: 2,
                        state: Bytes::from_static(&[0xff; 3]),
                        export: false,
                    },
                    ToWorker::PlacePart {
                        chunk: 3,
                        part,
                        export: false,
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
            let ended = io.run::<Strips>(framed, &mut [], &held, out_rx).await;
            assert!(matches!(ended, Ok(false)), "{ended:?}");
            let mut got = coordinator.await.unwrap();
            // Chunk 1's answers in the order sent, before the others'.
            got.sort_by_key(|m| chunk_of(m).unwrap_or(u64::MAX));
            let [exported, captured, undecodable, unread] = &got[..] else {
                panic!("{got:?}");
            };
            let halo = |h: u64| Bytes::from(crate::codec::encode("a halo", &h).unwrap());
            assert_eq!(
                exported,
                &ToCoordinator::Exported {
                    chunk: 1,
                    halos: (frame::Halo::Sent(halo(0)), frame::Halo::Sent(halo(99_999))),
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
                        chunk: 2,
                        failure: Failure::Codec { .. }
                    }
                ),
                "{undecodable:?}"
            );
            assert!(
                matches!(
                    unread,
                    ToCoordinator::FailedHeld {
                        chunk: 3,
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
    /// comes.
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
                    SinkExt::<Bytes>::send(&mut framed, frame::encode(&ToWorker::End))
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
                let ended = io.run::<Idle>(framed, &mut [], &held, out_rx).await;
                assert!(
                    matches!(ended, Ok(false)),
                    "round {round}: the loop ended with {ended:?}"
                );
                coordinator.await.unwrap();
            }
        });
    }
}
