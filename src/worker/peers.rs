//! The links of the peer data plane (protocol 20): worker processes of one job send halos
//! directly to each other over TCP. [`Peers`] is one process's end of them: a listener that
//! accepts the processes that send it halos, and the links it dials to those it sends halos
//! to. Its tasks move frames and decide nothing: what goes where, and what an answer or a
//! lost link means, is the peer protocol's machine's, which is fed [`PeerEvent`]s and calls
//! [`Peers::send`] and [`Peers::answer`]. The handshake and the frames are `wire/peer.rs`.
//!
//! # A link
//!
//! 1. *Dial.* [`Peers::send`] to a process with no link up dials it (at most
//!    [`PeerConfig::handshake_timeout`] for the connection and the handshake together) and
//!    queues the message meanwhile; later messages queue behind it, in order. An accepted
//!    connection runs the listener's side of the handshake within the same limit, under the
//!    handshake's small frame limit until the dialer's proof checks: a stranger's claim of a
//!    long frame reserves nothing, an HTTP request is [`Error::NotAPeer`], and a refused
//!    handshake is recorded ([`Peers::refusals`]), logged and counted, but not an event (the
//!    stranger has no process number).
//! 2. *Up.* Each link has a number ([`LinkId`]), new for every connection, in either
//!    direction. The dialer's messages ([`ToPeer`]) come out of the listener's process as
//!    [`PeerEvent::Received`], the listener's answers ([`FromPeer`]) out of the dialer's as
//!    [`PeerEvent::Answered`], each naming its link. A message longer than `max_frame` goes
//!    in pieces; a reader puts at most `max_message` bytes together.
//! 3. *Heartbeats* go both ways every [`PeerConfig::heartbeat`] and are not events. A link
//!    on which nothing was read for a [`PeerConfig::lease`] is given up
//!    ([`Error::LeaseExpired`]), and so is one whose write waited a whole lease (a peer that
//!    stopped reading is as silent as one that stopped writing).
//! 4. *Down.* A link that ends by itself (closed by the other side, silent, a frame that
//!    does not decode or breaks the piece protocol, a failed dial or handshake) ends with
//!    [`PeerEvent::Down`], naming its link and the typed error. Only that link ends: a
//!    misbehaving peer never ends the process. A link this process closes itself
//!    ([`Peers::set_session`], [`Peers::close`], a dial to another address of the process)
//!    ends without an event, and so does one the machine gives up ([`Peers::hang_up`]).
//!
//! # Memory
//!
//! Before a handshake completes, a connection holds at most the handshake's frame limit. A
//! link's reader holds at most one frame (`max_frame`) and one message being put together
//! from pieces (`max_message`). A link's queue of messages to send, and the events, are
//! unbounded channels: what a dialer has in flight is bounded by the peer protocol (its
//! window of halos not yet answered), not here; the machine of a listener that receives
//! more than a dialer may have in flight gives it up with [`Peers::hang_up`].
//!
//! # What the events guarantee
//!
//! - *In order, per link.* The messages of one link come out in the order they were sent;
//!   each [`Peers::send`] returns the link its message went on.
//! - *Down comes last.* A link's queue is closed before its `Down` is sent: a message sent
//!   after the machine saw a link's `Down` goes on a new link, never on the dead one. The
//!   messages sent on a link that went down and not answered may or may not have arrived:
//!   the machine decides what to do with them (send them through the coordinator).
//! - *No `Received` or `Answered` after `Down`* for a link, and no `Down` for a link closed on
//!   purpose, unless it failed at the same moment: an event for a link number the machine
//!   has forgotten is to be ignored.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use tokio::sync::mpsc::{
    UnboundedReceiver, UnboundedSender, WeakUnboundedSender, unbounded_channel,
};
use tokio_util::codec::Framed;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::wire::Error;
use crate::wire::buffers::Buffers;
use crate::wire::frame::{self, Message};
use crate::wire::handshake::Token;
use crate::wire::peer::{self, FromPeer, Session, SharedAt, ToPeer};
use crate::wire::shared::{self, NotShared, Segments};
use crate::wire::transport::{self, Acceptor, Stream};

/// How many refused handshakes [`Peers::refusals`] remembers.
const KEEP_REFUSALS: usize = 256;

/// How a process's peer links are set up (from its coordinator).
#[derive(Debug, Clone)]
pub(super) struct PeerConfig {
    /// The job's shared token; `None` only on loopback ([`Peers::bind`] refuses another
    /// address without one).
    pub(super) token: Option<Token>,
    /// The session at the start ([`Peers::set_session`] changes it).
    pub(super) session: Session,
    /// This process's number, which it names to the processes it dials.
    pub(super) me: u64,
    /// The frame limit of a link after its handshake, in bytes: the same in every process
    /// of the job (a frame over the reader's limit ends the link). Longer messages go in
    /// pieces.
    pub(super) max_frame: usize,
    /// The longest message a link reads, in bytes (put together from pieces).
    pub(super) max_message: usize,
    /// How often each side of a link sends a heartbeat; shorter than `lease`.
    pub(super) heartbeat: Duration,
    /// How long a link may go without a frame read, or a write may wait, before the link is
    /// given up.
    pub(super) lease: Duration,
    /// The time limit of a handshake: on an accepted connection, the listener's; on a dial,
    /// the connection and the dialer's handshake together.
    pub(super) handshake_timeout: Duration,
    /// The process's buffers kept for reuse: a long frame is read into one (after the
    /// handshake), and a buddy copy's bytes go back there once written.
    pub(super) buffers: Arc<Buffers>,
    /// The memory this process shares with buddies of its node (`wire/shared.rs`): a buddy
    /// copy encoded there is lent (`ToPeer::SharedCopy`) instead of sent, until a buddy
    /// answers that it does not map it. `None`: copies cross the links as bytes.
    pub(super) segments: Option<Arc<Segments>>,
    /// Whether this process maps the copies its dialers share with it (else it answers
    /// `Unshared`).
    pub(super) map_shared: bool,
}

/// What the links did with buddy copies shared through memory (`wire/shared.rs`); the
/// lends and releases are the owner's memory's to count ([`Segments::sharing`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct SharedCounts {
    /// Copies lent to a buddy that it did not map (sent after all).
    pub(super) not_shared: u64,
    /// Copies dialers shared here, mapped, and those not mapped (answered `Unshared`).
    pub(super) mapped: u64,
    pub(super) not_mapped: u64,
}

/// [`SharedCounts`], counted by the links' tasks.
#[derive(Debug, Default)]
struct SharedCounters {
    not_shared: AtomicU64,
    mapped: AtomicU64,
    not_mapped: AtomicU64,
}

impl SharedCounters {
    fn add(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn get(&self) -> SharedCounts {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        SharedCounts {
            not_shared: n(&self.not_shared),
            mapped: n(&self.mapped),
            not_mapped: n(&self.not_mapped),
        }
    }
}

/// The number of one link (one connection, either way), unique within a [`Peers`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct LinkId(u64);

/// What the links tell the peer protocol's machine.
#[derive(Debug)]
pub(super) enum PeerEvent {
    /// A message from the dialer `from` on an accepted link (after its handshake).
    Received {
        /// The dialer's process number (as it named itself, proven to hold the token).
        from: u64,
        /// The link: answers go back on it ([`Peers::answer`]).
        link: LinkId,
        /// The message (never a heartbeat or a piece).
        msg: ToPeer,
    },
    /// An answer from the listener of process `to`, on a link this process dialled.
    Answered {
        /// The listener's process number.
        to: u64,
        /// The link, as [`Peers::send`] returned it.
        link: LinkId,
        /// The answer (never a heartbeat or a piece).
        msg: FromPeer,
    },
    /// The link to (`dialled`) or from (accepted) process `process` ended by itself, or could
    /// not be made (a dial that failed or was refused): `error` says why.
    Down {
        /// The other process's number.
        process: u64,
        /// The link.
        link: LinkId,
        /// Whether this process dialled it.
        dialled: bool,
        /// Why it ended, with its cause.
        error: Error,
    },
}

/// Which end of a link this process is, for logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    /// This process dialled the link (it sends halos on it).
    Dialled,
    /// This process accepted the link (it receives halos on it).
    Accepted,
}

impl Direction {
    /// The label of the metrics.
    fn name(self) -> &'static str {
        match self {
            Direction::Dialled => "dialled",
            Direction::Accepted => "accepted",
        }
    }
}

/// How a link's task ended.
#[derive(Debug)]
enum Ended {
    /// Closed by this process (or nobody listens to the events any more).
    Closed,
    /// The dial or the handshake failed.
    Refused(Error),
    /// The link ended by itself.
    Down(Error),
}

/// This process's handle of one link: its queue, and its closing (dropping the handle closes
/// the link at once, without sending what is queued).
#[derive(Debug)]
struct Link<T> {
    id: LinkId,
    tx: UnboundedSender<T>,
    _close: DropGuard,
}

/// A link this process dialled.
#[derive(Debug)]
struct Dialled {
    addr: SocketAddr,
    link: Link<ToPeer>,
}

/// What the tasks share with [`Peers`].
#[derive(Debug)]
struct Shared {
    config: PeerConfig,
    events: UnboundedSender<PeerEvent>,
    state: Mutex<State>,
    refusals: Mutex<VecDeque<Arc<Error>>>,
    next_link: AtomicU64,
    /// Cancelled when the [`Peers`] is closed or dropped: every task ends.
    shutdown: CancellationToken,
    /// What the links did with shared copies.
    sharing: SharedCounters,
}

/// The session and the accepted links, under one lock so that a link accepted in an old
/// session is never kept (see `accept`).
#[derive(Debug)]
struct State {
    session: Session,
    /// The link of each dialer, by process number (the latest one).
    accepted: HashMap<u64, Link<FromPeer>>,
}

impl Shared {
    /// The session and the accepted links (a poisoned lock is taken as it is: nothing
    /// under it is left half-done by a panic).
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new link number.
    fn link(&self) -> LinkId {
        LinkId(self.next_link.fetch_add(1, Ordering::Relaxed))
    }

    /// A link is up: logged and counted.
    fn up(&self, process: u64, link: LinkId, direction: Direction, addr: SocketAddr) {
        let direction = direction.name();
        tracing::info!(process, link = link.0, direction, %addr, "peer link up");
        let labels = [("event", "up"), ("direction", direction)];
        metrics::counter!(crate::metrics::PEER_LINKS, &labels).increment(1);
    }

    /// A connection whose listener's handshake failed: recorded, logged, counted.
    fn refused(&self, error: Error) {
        tracing::warn!(
            error = &error as &dyn std::error::Error,
            "refused a peer's link"
        );
        let labels = [("event", "refused"), ("direction", "accepted")];
        metrics::counter!(crate::metrics::PEER_LINKS, &labels).increment(1);
        let mut refusals = self.refusals.lock().unwrap_or_else(|p| p.into_inner());
        if refusals.len() == KEEP_REFUSALS {
            refusals.pop_front();
        }
        refusals.push_back(Arc::new(error));
    }

    /// The end of an established or dialled link: a `Down` unless this process closed it.
    fn ended(&self, process: u64, link: LinkId, direction: Direction, ended: Ended) {
        let (error, event) = match ended {
            Ended::Closed => {
                tracing::debug!(
                    process,
                    link = link.0,
                    direction = direction.name(),
                    "peer link closed here"
                );
                return;
            }
            Ended::Refused(e) => (e, "refused"),
            Ended::Down(e) => (e, "down"),
        };
        tracing::warn!(
            process,
            link = link.0,
            direction = direction.name(),
            error = &error as &dyn std::error::Error,
            "peer link {event}"
        );
        let labels = [("event", event), ("direction", direction.name())];
        metrics::counter!(crate::metrics::PEER_LINKS, &labels).increment(1);
        let _ = self.events.send(PeerEvent::Down {
            process,
            link,
            dialled: direction == Direction::Dialled,
            error,
        });
    }
}

/// One worker process's peer links: its listener and the links it dialled. Dropping it (or
/// [`Peers::close`]) ends every link and the listener.
pub(super) struct Peers {
    shared: Arc<Shared>,
    dialled: HashMap<u64, Dialled>,
    runtime: tokio::runtime::Handle,
}

impl std::fmt::Debug for Peers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peers")
            .field("me", &self.shared.config.me)
            .field("dialled", &self.dialled.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Drop for Peers {
    fn drop(&mut self) {
        self.shared.shutdown.cancel();
        self.shared.lock().accepted.clear();
    }
}

impl Peers {
    /// Binds a listener on `ip` (any free port) and starts accepting on the current
    /// runtime; events go to `events`. The listener's address, for the coordinator to give
    /// to the processes that will dial this one.
    ///
    /// # Errors
    ///
    /// [`Error::NoToken`] for an address other than loopback without a token,
    /// [`Error::Address`] if it cannot be bound.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub(super) async fn bind(
        ip: IpAddr,
        config: PeerConfig,
        events: UnboundedSender<PeerEvent>,
    ) -> Result<(Peers, SocketAddr), Error> {
        let asked = SocketAddr::new(ip, 0).to_string();
        if config.token.is_none() && !ip.is_loopback() {
            return Err(Error::NoToken { addr: asked });
        }
        let runtime = tokio::runtime::Handle::current();
        let (acceptor, addr) = Acceptor::bind(&asked, &runtime)?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                session: config.session,
                accepted: HashMap::new(),
            }),
            config,
            events,
            refusals: Mutex::new(VecDeque::new()),
            next_link: AtomicU64::new(0),
            shutdown: CancellationToken::new(),
            sharing: SharedCounters::default(),
        });
        runtime.spawn(accept_loop(Arc::clone(&shared), acceptor));
        tracing::info!(%addr, me = shared.config.me, "listening for peers");
        Ok((
            Peers {
                shared,
                dialled: HashMap::new(),
                runtime,
            },
            addr,
        ))
    }

    /// Sends `msg` to process `to`, whose listener is at `addr`, on the link up to it, or on
    /// a new one (dialled now; the message waits in its queue meanwhile, and so do later
    /// ones, in order). A link up to another address of `to` is closed first. The link the
    /// message went on: its answer, or its `Down`, names it.
    pub(super) fn send(&mut self, to: u64, addr: SocketAddr, msg: ToPeer) -> LinkId {
        let msg = match self.dialled.get(&to) {
            Some(d) if d.addr == addr => match d.link.tx.send(msg) {
                Ok(()) => return d.link.id,
                // The link ended (its `Down` is sent, or on its way): dial again.
                Err(unsent) => unsent.0,
            },
            _ => msg,
        };
        let id = self.shared.link();
        let (tx, rx) = unbounded_channel();
        // The receiver is here: this cannot fail.
        let _ = tx.send(msg);
        let close = self.shared.shutdown.child_token();
        let session = self.shared.lock().session;
        self.runtime.spawn(dial(
            Arc::clone(&self.shared),
            (to, addr, id),
            (rx, tx.downgrade()),
            close.clone(),
            session,
        ));
        // Replaces (so closes) a link to another address of `to`, if any.
        self.dialled.insert(
            to,
            Dialled {
                addr,
                link: Link {
                    id,
                    tx,
                    _close: close.drop_guard(),
                },
            },
        );
        id
    }

    /// Answers dialer `to` on link `link` (that of the message answered). False if that link
    /// is no longer up (its `Down` is sent or on its way, or it was replaced by a newer link
    /// from `to`): the answer is dropped.
    pub(super) fn answer(&mut self, to: u64, link: LinkId, msg: FromPeer) -> bool {
        let state = self.shared.lock();
        match state.accepted.get(&to) {
            Some(l) if l.id == link => l.tx.send(msg).is_ok(),
            _ => false,
        }
    }

    /// Changes the session (a rollback, a new roster): every link up is closed, without an
    /// event (those accepted were of the old session, those dialled said the old one in
    /// their hello), with what it had queued. The next [`Peers::send`] to a process dials it
    /// again, in the new session.
    pub(super) fn set_session(&mut self, session: Session) {
        let closed = {
            let mut state = self.shared.lock();
            if state.session == session {
                return;
            }
            state.session = session;
            std::mem::take(&mut state.accepted)
        };
        tracing::info!(
            accepted = closed.len(),
            dialled = self.dialled.len(),
            "a new session: the peer links of the old one are closed"
        );
        drop(closed);
        self.dialled.clear();
    }

    /// Closes link `link` with process `process`, dialled or accepted, at once and without
    /// an event: a peer the machine gives up (one that broke the protocol, or sent more than
    /// it may have in flight). False if this process has no such link.
    pub(super) fn hang_up(&mut self, process: u64, link: LinkId) -> bool {
        if self
            .dialled
            .get(&process)
            .is_some_and(|d| d.link.id == link)
        {
            self.dialled.remove(&process);
            return true;
        }
        let mut state = self.shared.lock();
        if state.accepted.get(&process).is_some_and(|l| l.id == link) {
            state.accepted.remove(&process);
            return true;
        }
        false
    }

    /// The latest handshakes refused on accepted connections (at most 256), oldest first.
    pub(super) fn refusals(&self) -> Vec<Arc<Error>> {
        let refusals = self
            .shared
            .refusals
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        refusals.iter().cloned().collect()
    }

    /// What the links did with buddy copies shared through memory so far.
    pub(super) fn shared_counts(&self) -> SharedCounts {
        self.shared.sharing.get()
    }

    /// Ends every link and the listener (the job ended), without events.
    pub(super) fn close(self) {
        tracing::info!(me = self.shared.config.me, "peer links closed");
        drop(self);
    }
}

/// Accepts connections until the [`Peers`] is closed.
async fn accept_loop(shared: Arc<Shared>, acceptor: Acceptor) {
    loop {
        let accepted = tokio::select! {
            () = shared.shutdown.cancelled() => return,
            accepted = acceptor.accept() => accepted,
        };
        match accepted {
            Ok((stream, addr)) => {
                tokio::spawn(accept(Arc::clone(&shared), stream, addr));
            }
            Err(e) => {
                // Out of file descriptors and the like: wait, and accept again.
                tracing::debug!(error = &e as &dyn std::error::Error, "accepting a peer");
                tokio::select! {
                    () = shared.shutdown.cancelled() => return,
                    () = tokio::time::sleep(Duration::from_millis(50)) => {}
                }
            }
        }
    }
}

/// An accepted connection: the listener's handshake, then the link until it ends.
async fn accept(shared: Arc<Shared>, stream: Stream, addr: SocketAddr) {
    let _ = stream.set_nodelay(true);
    let config = &shared.config;
    let peer = addr.to_string();
    let mut framed = Framed::new(stream, frame::codec(config.max_frame));
    let session = shared.lock().session;
    let shake = peer::listener(
        &mut framed,
        &peer,
        config.token.as_ref(),
        session,
        config.max_frame,
    );
    let shaken = tokio::select! {
        () = shared.shutdown.cancelled() => return,
        shaken = tokio::time::timeout(config.handshake_timeout, shake) => shaken,
    };
    let from = match shaken {
        Ok(Ok(from)) => from,
        Ok(Err(e)) => return shared.refused(e),
        Err(_) => {
            return shared.refused(Error::HandshakeTimeout {
                peer,
                after: config.handshake_timeout,
            });
        }
    };
    let id = shared.link();
    let (tx, rx) = unbounded_channel();
    // For the link's own answers to shared copies (`Unshared`, `Released`): weak, so that
    // the link still ends when `State::accepted` lets go of it.
    let answers = tx.downgrade();
    let close = shared.shutdown.child_token();
    {
        let mut state = shared.lock();
        // Checked under the lock `set_session` takes: a link of a session that changed
        // during the handshake is never kept.
        if state.session != session || shared.shutdown.is_cancelled() {
            tracing::debug!(from, %addr, "a peer's link of an old session, dropped");
            return;
        }
        let link = Link {
            id,
            tx,
            _close: close.clone().drop_guard(),
        };
        if let Some(old) = state.accepted.insert(from, link) {
            tracing::debug!(
                from,
                old = old.id.0,
                new = id.0,
                "a newer link from a peer replaces its older one"
            );
        }
    }
    shared.up(from, id, Direction::Accepted, addr);
    let name = format!("worker process {from} at {addr}");
    let events = shared.events.clone();
    let mut warned = false;
    let deliver = |msg: ToPeer| match msg {
        ToPeer::Heartbeat => true,
        ToPeer::SharedCopy {
            seq,
            generation,
            phase,
            chunk,
            at,
        } => match map_shared(config, &at, &answers) {
            Ok(bytes) => {
                SharedCounters::add(&shared.sharing.mapped);
                let msg = ToPeer::Copy {
                    seq,
                    generation,
                    phase,
                    chunk,
                    bytes,
                };
                events
                    .send(PeerEvent::Received {
                        from,
                        link: id,
                        msg,
                    })
                    .is_ok()
            }
            Err(e) => {
                SharedCounters::add(&shared.sharing.not_mapped);
                if std::mem::replace(&mut warned, true) {
                    tracing::debug!(
                        peer = from,
                        error = &e as &dyn std::error::Error,
                        "a shared copy not mapped"
                    );
                } else {
                    tracing::warn!(
                        peer = from,
                        error = &e as &dyn std::error::Error,
                        "a shared copy is not mapped here: its bytes are asked for instead"
                    );
                }
                if let Some(tx) = answers.upgrade() {
                    let _ = tx.send(FromPeer::Unshared { seq });
                }
                true
            }
        },
        msg => events
            .send(PeerEvent::Received {
                from,
                link: id,
                msg,
            })
            .is_ok(),
    };
    let ended = tokio::select! {
        () = close.cancelled() => Ended::Closed,
        ended = run(framed, &name, rx, config, || FromPeer::Heartbeat, (|m| m, deliver)) => ended,
    };
    // `rx` went with `run`'s future: answers on this link fail from here on.
    {
        let mut state = shared.lock();
        if state.accepted.get(&from).is_some_and(|l| l.id == id) {
            state.accepted.remove(&from);
        }
    }
    shared.ended(from, id, Direction::Accepted, ended);
}

/// Maps a copy a dialer shares (`wire/shared.rs`), if this process maps them: its last
/// drop says so on the link (`Released`) if the link is still up.
fn map_shared(
    config: &PeerConfig,
    at: &SharedAt,
    answers: &WeakUnboundedSender<FromPeer>,
) -> Result<bytes::Bytes, NotShared> {
    if !config.map_shared {
        return Err(NotShared::Off);
    }
    let answers = answers.clone();
    let nonce = at.nonce;
    let released = Box::new(move || {
        if let Some(tx) = answers.upgrade() {
            let _ = tx.send(FromPeer::Released { nonce });
        }
    });
    shared::map(at, config.max_message, released)
}

/// A dialled link: the connection, the dialer's handshake, then the link until it ends or
/// `close` is cancelled. `again` is the link's own queue, for a shared copy its buddy did
/// not map (sent again as bytes).
async fn dial(
    shared: Arc<Shared>,
    (to, addr, id): (u64, SocketAddr, LinkId),
    (rx, again): (UnboundedReceiver<ToPeer>, WeakUnboundedSender<ToPeer>),
    close: CancellationToken,
    session: Session,
) {
    let ended = tokio::select! {
        () = close.cancelled() => Ended::Closed,
        ended = dial_and_run(&shared, (to, addr, id), (rx, again), session) => ended,
    };
    // No release can come for what was lent on this link any more: never written again.
    if let Some(segments) = &shared.config.segments {
        segments.forget_link(id.0);
    }
    // `rx` went with `dial_and_run`'s future: `Peers::send` dials again from here on, before
    // the `Down` is sent.
    shared.ended(to, id, Direction::Dialled, ended);
}

/// The body of [`dial`]: how the link ended, unless it was closed first.
async fn dial_and_run(
    shared: &Shared,
    (to, addr, id): (u64, SocketAddr, LinkId),
    (rx, again): (UnboundedReceiver<ToPeer>, WeakUnboundedSender<ToPeer>),
    session: Session,
) -> Ended {
    let config = &shared.config;
    let peer = addr.to_string();
    let connect = async {
        let (stream, _) = transport::dial(&peer, config.handshake_timeout).await?;
        let mut framed = Framed::new(stream, frame::codec(config.max_frame));
        peer::dialer(
            &mut framed,
            &peer,
            config.token.as_ref(),
            session,
            config.me,
            config.max_frame,
        )
        .await?;
        Ok::<_, Error>(framed)
    };
    let framed = match tokio::time::timeout(config.handshake_timeout, connect).await {
        Ok(Ok(framed)) => framed,
        Ok(Err(e)) => return Ended::Refused(e),
        Err(_) => {
            return Ended::Refused(Error::HandshakeTimeout {
                peer,
                after: config.handshake_timeout,
            });
        }
    };
    shared.up(to, id, Direction::Dialled, addr);
    let name = format!("worker process {to} at {addr}");
    let events = shared.events.clone();
    // Copies lent on this link and not answered yet, by number: the message (sent as bytes
    // if the buddy does not map it) and the lend's nonce. Lent while the buddy maps them.
    let lent: Mutex<HashMap<u64, (ToPeer, [u8; 16])>> = Mutex::new(HashMap::new());
    let lent = &lent;
    let lock = || lent.lock().unwrap_or_else(|p| p.into_inner());
    let sharing = std::sync::atomic::AtomicBool::new(config.segments.is_some());
    let sharing = &sharing;
    let share = |msg: ToPeer| -> ToPeer {
        let (
            Some(segments),
            ToPeer::Copy {
                seq,
                generation,
                phase,
                chunk,
                bytes,
            },
        ) = (&config.segments, &msg)
        else {
            return msg;
        };
        if !sharing.load(Ordering::Relaxed) {
            return msg;
        }
        let Some(at) = segments.lend(bytes, id.0) else {
            return msg;
        };
        let lend = ToPeer::SharedCopy {
            seq: *seq,
            generation: *generation,
            phase: *phase,
            chunk: *chunk,
            at,
        };
        lock().insert(*seq, (msg, at.nonce));
        lend
    };
    let deliver = |msg: FromPeer| match msg {
        FromPeer::Heartbeat => true,
        FromPeer::Unshared { seq } => {
            let Some((copy, nonce)) = lock().remove(&seq) else {
                tracing::debug!(peer = to, seq, "`Unshared` for no copy lent");
                return true;
            };
            if let Some(segments) = &config.segments {
                segments.unlend(id.0, nonce);
            }
            SharedCounters::add(&shared.sharing.not_shared);
            if sharing.swap(false, Ordering::Relaxed) {
                tracing::warn!(
                    peer = to,
                    "a buddy does not map the copies shared with it (another node?): they \
                     cross the link as bytes"
                );
            }
            // Into the link's own queue again, as bytes this time. (A link closing drops
            // it: the push fails with the link, as any other.)
            if let Some(tx) = again.upgrade() {
                let _ = tx.send(copy);
            }
            true
        }
        FromPeer::Released { nonce } => {
            if !config
                .segments
                .as_ref()
                .is_some_and(|s| s.release(id.0, nonce))
            {
                tracing::debug!(peer = to, "`Released` for no copy lent on this link");
            }
            true
        }
        msg => {
            if let FromPeer::Ack { seq, .. } = &msg {
                // The buddy maps it, or refused it: this process's view goes.
                lock().remove(seq);
            }
            events
                .send(PeerEvent::Answered { to, link: id, msg })
                .is_ok()
        }
    };
    run(
        framed,
        &name,
        rx,
        config,
        || ToPeer::Heartbeat,
        (share, deliver),
    )
    .await
}

/// Moves a link's frames until it ends: what `rx` brings goes out, as `outgoing` turns it
/// (with a heartbeat every heartbeat period; short messages before the long ones queued,
/// which keep their order), what comes in goes to `deliver` (false: nobody listens any
/// more, the link is closed).
/// Reading and writing go on together, so that a long write never delays the reading of
/// the other side's heartbeats.
async fn run<In: Message, Out: Message>(
    mut framed: Framed<Stream, crate::wire::frame::Codec>,
    peer: &str,
    mut rx: UnboundedReceiver<Out>,
    config: &PeerConfig,
    heartbeat: fn() -> Out,
    (mut outgoing, mut deliver): (impl FnMut(Out) -> Out, impl FnMut(In) -> bool),
) -> Ended {
    framed.codec_mut().reuse(config.buffers.clone());
    let (mut sink, mut stream) = framed.split();
    let lease = config.lease;
    let reading = async {
        let mut pieces = frame::Assembler::new(config.max_message);
        loop {
            let Ok(next) = tokio::time::timeout(lease, stream.next()).await else {
                return Ended::Down(Error::LeaseExpired {
                    peer: peer.to_owned(),
                    after: lease,
                });
            };
            let bytes = match next {
                None => {
                    return Ended::Down(Error::Closed {
                        peer: peer.to_owned(),
                    });
                }
                Some(Err(e)) => return Ended::Down(Error::io(peer, e, config.max_frame)),
                Some(Ok(bytes)) => bytes,
            };
            match pieces.frame::<In>(peer, bytes.freeze()) {
                Err(e) => return Ended::Down(e),
                Ok(None) => {}
                Ok(Some(msg)) => {
                    if !deliver(msg) {
                        return Ended::Closed;
                    }
                }
            }
        }
    };
    let writing = async {
        // An interval of zero would panic: a millisecond at least.
        let period = config.heartbeat.max(Duration::from_millis(1));
        let mut beat = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Long messages (buddy copies) wait here while shorter ones (halos, answers) pass
        // them: a halo queued behind a round of copies would hold its partition's next
        // phase for the time the whole round takes to cross.
        let mut long: VecDeque<Out> = VecDeque::new();
        loop {
            let mut next = if long.is_empty() {
                Some(tokio::select! {
                    msg = rx.recv() => match msg {
                        Some(msg) => msg,
                        None => return Ended::Closed,
                    },
                    _ = beat.tick() => heartbeat(),
                })
            } else {
                rx.try_recv().ok()
            };
            // The short messages queued go first, then one long one, with one flush.
            while let Some(msg) = next.map(&mut outgoing) {
                if msg.long_tail().is_some() {
                    long.push_back(msg);
                } else if let Err(e) = write_frames(peer, lease, config, &mut sink, msg).await {
                    return Ended::Down(e);
                }
                next = rx.try_recv().ok();
            }
            let mut written = None;
            if let Some(msg) = long.pop_front() {
                written = msg.long_tail();
                if let Err(e) = write_frames(peer, lease, config, &mut sink, msg).await {
                    return Ended::Down(e);
                }
            }
            if let Err(e) = write(peer, lease, sink.flush()).await {
                return Ended::Down(e);
            }
            // Its bytes are written, and the sink let go of its last frame (it holds one until
            // the next flush): the long field's memory serves again.
            if let Some(tail) = written {
                config.buffers.give(tail);
            }
        }
    };
    tokio::select! {
        ended = reading => ended,
        ended = writing => ended,
    }
}

/// Writes the frames of `msg`, without flushing.
async fn write_frames<Out: Message, S>(
    peer: &str,
    lease: Duration,
    config: &PeerConfig,
    sink: &mut S,
    msg: Out,
) -> Result<(), Error>
where
    S: futures::Sink<frame::Frame, Error = std::io::Error> + Unpin,
{
    for f in frame::Frames::new(&msg, config.max_frame) {
        write(peer, lease, sink.feed(f)).await?;
    }
    Ok(())
}

/// One write (a frame, or a flush) within a lease, as `worker/io.rs` writes to the
/// coordinator: a peer that stopped reading is given up like one that fell silent.
async fn write(
    peer: &str,
    lease: Duration,
    op: impl std::future::Future<Output = std::io::Result<()>>,
) -> Result<(), Error> {
    match tokio::time::timeout(lease, op).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(source)) => Err(Error::Io {
            peer: peer.to_owned(),
            source,
        }),
        Err(_) => Err(Error::LeaseExpired {
            peer: peer.to_owned(),
            after: lease,
        }),
    }
}

#[cfg(test)]
mod tests {
    //! Real TCP on loopback: two `Peers`, or one and a hand-played peer.

    use std::io::{Read, Write};
    use std::time::Instant;

    use tokio::sync::mpsc::error::TryRecvError;

    use super::*;
    use crate::wire::AuthFailure;

    const SESSION: Session = [1; 16];
    const LOOPBACK: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
    /// How long a test waits for an event before it fails.
    const PATIENCE: Duration = Duration::from_secs(10);

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
            .block_on(f)
    }

    fn config(me: u64) -> PeerConfig {
        PeerConfig {
            token: Some(Token::new("the job's token").unwrap()),
            session: SESSION,
            me,
            max_frame: 1 << 20,
            max_message: 16 << 20,
            heartbeat: Duration::from_millis(50),
            lease: Duration::from_secs(5),
            handshake_timeout: Duration::from_secs(2),
            buffers: Arc::new(Buffers::new(1 << 30)),
            segments: None,
            map_shared: false,
        }
    }

    type Events = UnboundedReceiver<PeerEvent>;

    async fn peers(config: PeerConfig) -> (Peers, SocketAddr, Events) {
        let (tx, rx) = unbounded_channel();
        let (peers, addr) = Peers::bind(LOOPBACK, config, tx).await.unwrap();
        (peers, addr, rx)
    }

    async fn next(events: &mut Events) -> PeerEvent {
        tokio::time::timeout(PATIENCE, events.recv())
            .await
            .expect("no event in time")
            .expect("the events' sender is gone")
    }

    fn halo(seq: u64, len: usize) -> ToPeer {
        ToPeer::Halo {
            seq,
            generation: 1,
            phase: 7,
            from: 3,
            to: 4,
            bytes: (0..len).map(|i| (i * 7) as u8).collect::<Vec<u8>>().into(),
        }
    }

    /// The link `Received` came on, after checking it came from `from` with `msg`.
    fn received(event: PeerEvent, from: u64, msg: &ToPeer) -> LinkId {
        match event {
            PeerEvent::Received {
                from: f,
                link,
                msg: m,
            } if f == from && &m == msg => link,
            other => panic!("expected {msg:?} from {from}, got {other:?}"),
        }
    }

    /// The link and error of a `Down` of process `process`, dialled or not.
    fn down(event: PeerEvent, process: u64, dialled: bool) -> (LinkId, Error) {
        match event {
            PeerEvent::Down {
                process: p,
                link,
                dialled: d,
                error,
            } if p == process && d == dialled => (link, error),
            other => panic!("expected the Down of {process} (dialled: {dialled}), got {other:?}"),
        }
    }

    /// Waits until `peers` has recorded `n` refusals.
    async fn refusals(peers: &Peers, n: usize) -> Vec<Arc<Error>> {
        let start = Instant::now();
        loop {
            let r = peers.refusals();
            if r.len() >= n {
                return r;
            }
            assert!(start.elapsed() < PATIENCE, "refusals: {r:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Both sides of a link carrying long copies: they cross whole, short messages queued
    /// behind them pass them, and the sender's memory of each copy comes back to its
    /// buffers once written (it did not, before the give waited for the flush: the sink
    /// held the last frame until then).
    #[test]
    fn long_copies_cross_whole_and_their_memory_serves_again() {
        // One thread: every message is queued before the link's writer first runs, so the
        // halo's place does not depend on how fast this test makes copies (on a runtime of
        // two threads, the writer sent the copies as they were made, under load, and the
        // halo came last).
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let (mut a, _, _a_events) = peers(config(1)).await;
                let (_b, b_addr, mut b_events) = peers(config(2)).await;
                let sent = Arc::clone(&a.shared.config.buffers);
                let copy = |seq: u64, len: usize| ToPeer::Copy {
                    seq,
                    generation: 1,
                    phase: 7,
                    chunk: seq,
                    bytes: (0..len)
                        .map(|i| (i * 13 + seq as usize) as u8)
                        .collect::<Vec<u8>>()
                        .into(),
                };
                let copies = || (0..6).map(|k| copy(k, 300_000 + 1_000 * k as usize));
                // Handed over, not cloned (a clone kept here would keep their memory from coming
                // back).
                for c in copies().chain([halo(100, 10)]) {
                    a.send(2, b_addr, c);
                }
                let mut got = Vec::new();
                while got.len() < 7 {
                    match next(&mut b_events).await {
                        PeerEvent::Received { from: 1, msg, .. } => got.push(msg),
                        other => panic!("{other:?}"),
                    }
                }
                // The halo passed the copies queued before it; the copies kept their order.
                let at = got.iter().position(|m| matches!(m, ToPeer::Halo { .. }));
                assert_eq!(at, Some(0), "where the halo came");
                got.remove(0);
                assert_eq!(got, copies().collect::<Vec<_>>());
                let deadline = Instant::now() + PATIENCE;
                while sent.reuse().kept < 6 * 300_000 {
                    assert!(Instant::now() < deadline, "{:?}", sent.reuse());
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            });
    }

    /// A halo from one process arrives at the other as `Received` from the sender, its ack
    /// comes back as `Answered` on the link `send` named; heartbeats are not events.
    #[test]
    fn a_halo_crosses_and_its_ack_comes_back() {
        block_on(async {
            let (mut a, _, mut a_events) = peers(config(1)).await;
            let (mut b, b_addr, mut b_events) = peers(config(2)).await;
            let la = a.send(2, b_addr, halo(10, 100));
            assert_eq!(a.send(2, b_addr, halo(11, 0)), la, "one link per process");
            let lb = received(next(&mut b_events).await, 1, &halo(10, 100));
            assert_eq!(received(next(&mut b_events).await, 1, &halo(11, 0)), lb);
            assert!(b.answer(
                1,
                lb,
                FromPeer::Ack {
                    seq: 10,
                    kept: true
                }
            ));
            assert!(b.answer(
                1,
                lb,
                FromPeer::Ack {
                    seq: 11,
                    kept: false
                }
            ));
            for (seq, kept) in [(10, true), (11, false)] {
                match next(&mut a_events).await {
                    PeerEvent::Answered {
                        to: 2,
                        link,
                        msg: FromPeer::Ack { seq: s, kept: k },
                    } => assert_eq!((link, s, k), (la, seq, kept)),
                    other => panic!("{other:?}"),
                }
            }
            // No answer on a link that is not one.
            assert!(!b.answer(1, LinkId(999), FromPeer::Heartbeat));
            assert!(!b.answer(5, lb, FromPeer::Heartbeat));
            assert!(!b.hang_up(1, LinkId(999)));
            // Several heartbeat periods: heartbeats cross, and are no events.
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert!(matches!(a_events.try_recv(), Err(TryRecvError::Empty)));
            assert!(matches!(b_events.try_recv(), Err(TryRecvError::Empty)));
            a.close();
            // The dialer closed the link: the listener's end is down, by itself.
            let (link, e) = down(next(&mut b_events).await, 1, false);
            assert_eq!(link, lb);
            assert!(
                matches!(e, Error::Closed { .. } | Error::Io { .. }),
                "{e:?}"
            );
            // A closed `Peers` sends no event of its own, and its tasks end (they hold the
            // events' sender).
            let last = tokio::time::timeout(PATIENCE, a_events.recv()).await;
            assert!(matches!(last, Ok(None)), "{last:?}");
        });
    }

    /// Messages longer than a frame go in pieces and come out whole; one longer than the
    /// reader's message limit ends only its link, and the next halo goes on a new one.
    #[test]
    fn long_halos_go_in_pieces_within_the_message_limit() {
        block_on(async {
            let small = |me| PeerConfig {
                max_frame: 1024,
                max_message: 200_000,
                ..config(me)
            };
            let (mut a, _, mut a_events) = peers(small(1)).await;
            let (_b, b_addr, mut b_events) = peers(small(2)).await;
            let long = halo(1, 100_000);
            let la = a.send(2, b_addr, long.clone());
            let lb = received(next(&mut b_events).await, 1, &long);
            a.send(2, b_addr, halo(2, 300_000));
            let (link, e) = down(next(&mut b_events).await, 1, false);
            assert_eq!(link, lb);
            assert!(
                matches!(e, Error::MessageTooLarge { limit: 200_000, .. }),
                "{e:?}"
            );
            let (link, _) = down(next(&mut a_events).await, 2, true);
            assert_eq!(link, la);
            // The listener goes on: a new link.
            let again = a.send(2, b_addr, halo(3, 10));
            assert_ne!(again, la);
            assert_ne!(received(next(&mut b_events).await, 1, &halo(3, 10)), lb);
        });
    }

    /// A listener that goes away is `Down` for its dialer, and dialling it again fails with
    /// the address's error, as a `Down` too.
    #[test]
    fn a_killed_listener_is_down_for_its_dialer() {
        block_on(async {
            let (mut a, _, mut a_events) = peers(config(1)).await;
            let (b, b_addr, mut b_events) = peers(config(2)).await;
            let la = a.send(2, b_addr, halo(1, 10));
            received(next(&mut b_events).await, 1, &halo(1, 10));
            drop(b);
            let (link, e) = down(next(&mut a_events).await, 2, true);
            assert_eq!(link, la);
            assert!(
                matches!(e, Error::Closed { .. } | Error::Io { .. }),
                "{e:?}"
            );
            let again = a.send(2, b_addr, halo(2, 10));
            assert_ne!(again, la);
            let (link, e) = down(next(&mut a_events).await, 2, true);
            assert_eq!(link, again);
            assert!(matches!(e, Error::Address { .. }), "{e:?}");
        });
    }

    /// A hand-played listener: accepts one connection, shakes hands with `token` in
    /// `session`, then says nothing and reads nothing while it holds the connection.
    async fn silent_listener(
        token: Option<Token>,
        session: Session,
    ) -> (SocketAddr, tokio::task::JoinHandle<Result<u64, Error>>) {
        let listener = tokio::net::TcpListener::bind((LOOPBACK, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let mut framed = Framed::new(stream, frame::codec(1 << 20));
            let from = peer::listener(&mut framed, "d", token.as_ref(), session, 1 << 20).await?;
            tokio::time::sleep(PATIENCE).await;
            drop(framed);
            Ok(from)
        });
        (addr, task)
    }

    /// A hand-played dialer of process `from`, after its handshake.
    async fn dialer(
        addr: SocketAddr,
        token: Option<&Token>,
        session: Session,
        from: u64,
    ) -> Result<Framed<Stream, crate::wire::frame::Codec>, Error> {
        let stream = Stream::connect(addr).await.unwrap();
        let mut framed = Framed::new(stream, frame::codec(1 << 20));
        peer::dialer(&mut framed, "l", token, session, from, 1 << 20).await?;
        Ok(framed)
    }

    /// A peer that shakes hands and then falls silent is given up after the lease, on
    /// either end.
    #[test]
    fn a_silent_peer_is_given_up_after_the_lease() {
        block_on(async {
            let lease = Duration::from_millis(600);
            let leased = |me| PeerConfig {
                lease,
                ..config(me)
            };
            let (mut a, _, mut a_events) = peers(leased(1)).await;
            let (addr, _silent) = silent_listener(config(0).token, SESSION).await;
            let start = Instant::now();
            let la = a.send(2, addr, halo(1, 10));
            let (link, e) = down(next(&mut a_events).await, 2, true);
            let took = start.elapsed();
            assert_eq!(link, la);
            assert!(
                matches!(e, Error::LeaseExpired { after, .. } if after == lease),
                "{e:?}"
            );
            assert!(took >= lease && took < lease + PATIENCE / 2, "{took:?}");

            let (_b, b_addr, mut b_events) = peers(leased(2)).await;
            let start = Instant::now();
            let _silent = dialer(b_addr, config(0).token.as_ref(), SESSION, 9)
                .await
                .unwrap();
            let (_, e) = down(next(&mut b_events).await, 9, false);
            assert!(matches!(e, Error::LeaseExpired { .. }), "{e:?}");
            assert!(start.elapsed() >= lease, "{:?}", start.elapsed());
        });
    }

    /// Connects to `addr` as a stranger, writes `bytes`, and reads until the listener closes
    /// the connection: what it answered, and how long it took to close.
    fn stranger(addr: SocketAddr, bytes: &[u8]) -> (Vec<u8>, Duration) {
        let start = Instant::now();
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(bytes).unwrap();
        s.set_read_timeout(Some(PATIENCE)).unwrap();
        let mut got = Vec::new();
        let mut buf = [0; 256];
        loop {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
                Err(e) => panic!("the listener kept a stranger's connection: {e}"),
            }
        }
        (got, start.elapsed())
    }

    /// Strangers on the listener, as the coordinator's listener gets them
    /// (`tests/it/cluster_unauthenticated.rs`, `cluster_hostile.rs`): an HTTP request and
    /// claims of long frames are not peers, and get no answer; one that says nothing, or
    /// stalls in the middle of a frame, is dropped at the handshake's limit; a peer of
    /// another version is told so; one with the wrong token is refused, each side naming
    /// its own. None is an event, and the listener goes on.
    #[test]
    fn strangers_are_refused_and_the_listener_goes_on() {
        block_on(async {
            let limit = Duration::from_millis(300);
            let quick = PeerConfig {
                handshake_timeout: limit,
                ..config(2)
            };
            let (b, b_addr, mut b_events) = peers(quick).await;
            let strangers = |inputs: Vec<Vec<u8>>| {
                tokio::task::spawn_blocking(move || {
                    let threads: Vec<_> = inputs
                        .into_iter()
                        .map(|bytes| std::thread::spawn(move || stranger(b_addr, &bytes)))
                        .collect();
                    threads
                        .into_iter()
                        .map(|t| t.join().unwrap())
                        .collect::<Vec<_>>()
                })
            };
            // Not peers: an HTTP request, a claim of 1 GiB, and 50 claims of the default
            // frame limit at once.
            let mut not_peers = vec![
                b"GET / HTTP/1.1\r\nHost: malleable\r\n\r\n".to_vec(),
                b"\x40\x00\x00\x00MALLEABL".to_vec(),
            ];
            let claim = (frame::DEFAULT_MAX_FRAME as u32).to_be_bytes();
            not_peers.extend((0..50).map(|_| [&claim[..], &frame::MAGIC].concat()));
            for (answer, took) in strangers(not_peers).await.unwrap() {
                assert!(answer.is_empty(), "{answer:?}");
                assert!(took < PATIENCE / 2, "{took:?}");
            }
            // Silent, or stalled in the middle of a frame: dropped at the limit.
            let stalled = [&[0, 0, 0, 100][..], &frame::MAGIC].concat();
            for (answer, took) in strangers(vec![Vec::new(), stalled]).await.unwrap() {
                assert!(answer.is_empty(), "{answer:?}");
                assert!(took >= limit, "{took:?}");
            }
            // Another version: a refusal in this side's version.
            let mut old = frame::MAGIC.to_vec();
            old.extend_from_slice(&(frame::PROTOCOL_VERSION - 1).to_be_bytes());
            old.extend_from_slice(&frame::encode(&peer::PeerHello {
                session: SESSION,
                from: 1,
                nonce: [0; 32],
            }));
            let old = [&(old.len() as u32).to_be_bytes()[..], &old].concat();
            let (answer, _) = strangers(vec![old]).await.unwrap().remove(0);
            let reply = answer.get(4..).expect("an answer");
            assert!(matches!(
                peer::decode_peer_reply("l", reply),
                Ok(peer::PeerReply::Refused(peer::PeerRefusal::Version))
            ));
            // The wrong token.
            let wrong = Token::new("another token").unwrap();
            let e = dialer(b_addr, Some(&wrong), SESSION, 1).await.unwrap_err();
            assert!(
                matches!(
                    e,
                    Error::Auth {
                        failure: AuthFailure::ListenerProof { token: true },
                        ..
                    }
                ),
                "{e:?}"
            );
            let r = refusals(&b, 56).await;
            let count = |kind| r.iter().filter(|e| e.kind() == kind).count();
            assert_eq!(count("not_a_peer"), 52, "{r:?}");
            assert_eq!(count("handshake_timeout"), 2, "{r:?}");
            assert_eq!(count("version"), 1, "{r:?}");
            assert!(
                r.iter().any(|e| matches!(
                    **e,
                    Error::Auth {
                        failure: AuthFailure::DialerProof { token: true },
                        ..
                    }
                )),
                "{r:?}"
            );
            assert!(matches!(b_events.try_recv(), Err(TryRecvError::Empty)));
            // A peer still links.
            let (mut a, _, _a_events) = peers(config(1)).await;
            a.send(2, b_addr, halo(1, 1));
            received(next(&mut b_events).await, 1, &halo(1, 1));
        });
    }

    /// A dialer of another session is `Down` with both sessions, and the listener records
    /// its refusal; a listener whose handshake stalls is `Down` after the handshake's limit.
    #[test]
    fn a_dial_into_another_session_or_a_stalled_handshake_is_down() {
        block_on(async {
            let (mut a, _, mut a_events) = peers(config(1)).await;
            let other = PeerConfig {
                session: [2; 16],
                ..config(2)
            };
            let (b, b_addr, _b_events) = peers(other).await;
            a.send(2, b_addr, halo(1, 1));
            let (_, e) = down(next(&mut a_events).await, 2, true);
            let Error::PeerSession { ours, theirs, .. } = e else {
                panic!("{e:?}");
            };
            assert_eq!((ours, theirs), (SESSION, [2; 16]));
            let r = refusals(&b, 1).await;
            let Error::PeerSession { ours, theirs, .. } = *r[0] else {
                panic!("{r:?}");
            };
            assert_eq!((ours, theirs), ([2; 16], SESSION));
            // A "listener" that accepts and says nothing.
            let mute = tokio::net::TcpListener::bind((LOOPBACK, 0)).await.unwrap();
            let mute_addr = mute.local_addr().unwrap();
            let start = Instant::now();
            a.send(3, mute_addr, halo(1, 1));
            let (_, e) = down(next(&mut a_events).await, 3, true);
            assert!(matches!(e, Error::HandshakeTimeout { .. }), "{e:?}");
            assert!(start.elapsed() >= config(1).handshake_timeout);
            drop(mute);
        });
    }

    /// A new session closes the links up without events; the next halo dials again in it.
    #[test]
    fn a_new_session_closes_the_links_of_the_old_one() {
        block_on(async {
            let (mut a, _, mut a_events) = peers(config(1)).await;
            let (mut b, b_addr, mut b_events) = peers(config(2)).await;
            let la = a.send(2, b_addr, halo(1, 1));
            let lb = received(next(&mut b_events).await, 1, &halo(1, 1));
            b.set_session([3; 16]);
            // The dialer sees its link closed by the other side.
            let (link, _) = down(next(&mut a_events).await, 2, true);
            assert_eq!(link, la);
            assert!(!b.answer(1, lb, FromPeer::Ack { seq: 1, kept: true }));
            a.set_session([3; 16]);
            let again = a.send(2, b_addr, halo(2, 1));
            assert_ne!(again, la);
            // The listener's next event is the halo of the new link: no `Down` for the one
            // it closed.
            let new = received(next(&mut b_events).await, 1, &halo(2, 1));
            assert_ne!(new, lb);
            assert!(b.answer(1, new, FromPeer::Ack { seq: 2, kept: true }));
            assert!(matches!(
                next(&mut a_events).await,
                PeerEvent::Answered { to: 2, link, .. } if link == again
            ));
            // The dialer's own new session closes its link, without an event either.
            a.set_session([4; 16]);
            let (link, _) = down(next(&mut b_events).await, 1, false);
            assert_eq!(link, new);
            assert!(matches!(a_events.try_recv(), Err(TryRecvError::Empty)));
        });
    }

    /// An authenticated peer whose frame does not decode ends its own link with a typed
    /// error, and the listener goes on.
    #[test]
    fn a_misbehaving_peer_ends_only_its_link() {
        block_on(async {
            let (_b, b_addr, mut b_events) = peers(config(2)).await;
            let mut bad = dialer(b_addr, config(0).token.as_ref(), SESSION, 7)
                .await
                .unwrap();
            bad.send(bytes::Bytes::from_static(&[0x7f, 1, 2]))
                .await
                .unwrap();
            let (_, e) = down(next(&mut b_events).await, 7, false);
            assert!(
                matches!(&e, Error::Malformed { what, .. } if *what == ToPeer::WHAT),
                "{e:?}"
            );
            // A piece, then a whole message in its middle.
            let mut bad = dialer(b_addr, config(0).token.as_ref(), SESSION, 8)
                .await
                .unwrap();
            let piece = frame::encode(&ToPeer::Piece {
                more: true,
                bytes: bytes::Bytes::from_static(b"ab"),
            });
            bad.send(piece).await.unwrap();
            bad.send(frame::encode(&halo(1, 1))).await.unwrap();
            let (_, e) = down(next(&mut b_events).await, 8, false);
            assert!(matches!(e, Error::Malformed { .. }), "{e:?}");
            // A frame over the limit (written by hand: the codec would not).
            let mut bad = dialer(b_addr, config(0).token.as_ref(), SESSION, 9)
                .await
                .unwrap();
            let over = (config(2).max_frame as u32 + 1).to_be_bytes();
            tokio::io::AsyncWriteExt::write_all(bad.get_mut(), &over)
                .await
                .unwrap();
            let (_, e) = down(next(&mut b_events).await, 9, false);
            assert!(
                matches!(e, Error::FrameTooLarge { limit, .. } if limit == config(2).max_frame),
                "{e:?}"
            );
            let (mut a, _, _a_events) = peers(config(1)).await;
            a.send(2, b_addr, halo(1, 1));
            received(next(&mut b_events).await, 1, &halo(1, 1));
        });
    }

    /// A link the machine gives up closes at once, on its side without an event, and is
    /// `Down` on the other's; either end may hang up.
    #[test]
    fn a_link_given_up_is_closed_without_an_event() {
        block_on(async {
            let (mut a, _, mut a_events) = peers(config(1)).await;
            let (mut b, b_addr, mut b_events) = peers(config(2)).await;
            let la = a.send(2, b_addr, halo(1, 1));
            let lb = received(next(&mut b_events).await, 1, &halo(1, 1));
            assert!(b.hang_up(1, lb));
            assert!(!b.answer(1, lb, FromPeer::Heartbeat));
            let (link, _) = down(next(&mut a_events).await, 2, true);
            assert_eq!(link, la);
            let again = a.send(2, b_addr, halo(2, 1));
            let lb = received(next(&mut b_events).await, 1, &halo(2, 1));
            assert!(a.hang_up(2, again));
            assert!(!a.hang_up(2, again));
            let (link, _) = down(next(&mut b_events).await, 1, false);
            assert_eq!(link, lb);
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert!(matches!(a_events.try_recv(), Err(TryRecvError::Empty)));
            assert!(matches!(b_events.try_recv(), Err(TryRecvError::Empty)));
        });
    }

    /// Without a token, only loopback.
    #[test]
    fn no_token_listens_on_loopback_only() {
        block_on(async {
            let open = PeerConfig {
                token: None,
                ..config(1)
            };
            let (tx, _rx) = unbounded_channel();
            let any = IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED);
            let e = Peers::bind(any, open.clone(), tx.clone())
                .await
                .unwrap_err();
            assert!(matches!(e, Error::NoToken { .. }), "{e:?}");
            // On loopback, two processes without a token link.
            let (mut a, _, _a_events) = peers(PeerConfig {
                me: 1,
                ..open.clone()
            })
            .await;
            let (_b, b_addr, mut b_events) = peers(PeerConfig { me: 2, ..open }).await;
            a.send(2, b_addr, halo(1, 1));
            received(next(&mut b_events).await, 1, &halo(1, 1));
        });
    }

    /// Waits until `done` holds.
    async fn until(what: &str, mut done: impl FnMut() -> bool) {
        let start = Instant::now();
        while !done() {
            assert!(start.elapsed() < PATIENCE, "{what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// A copy `seq` of `payload` encoded into `segments` (memory a buddy can map).
    fn shared_copy(segments: &Segments, seq: u64, payload: &[u8]) -> ToPeer {
        let bytes = segments
            .encode(payload.len(), |buf| {
                buf.copy_from_slice(payload);
                Ok::<_, ()>(())
            })
            .unwrap()
            .unwrap();
        ToPeer::Copy {
            seq,
            generation: 1,
            phase: 7,
            chunk: 3,
            bytes,
        }
    }

    /// Both sides of a shared copy (protocol 28): the dialer lends the memory its copy was
    /// encoded into, the listener's machine gets a `Copy` of the same bytes, mapped; the
    /// answer goes back as for any copy; the memory is not taken again until the buddy's
    /// last drop releases it, and then it is.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_shared_copy_is_mapped_by_its_buddy_and_its_memory_comes_back_when_released() {
        block_on(async {
            let segments = Arc::new(Segments::new(1 << 30).unwrap());
            let (mut a, _, mut a_events) = peers(PeerConfig {
                segments: Some(Arc::clone(&segments)),
                ..config(1)
            })
            .await;
            let (mut b, b_addr, mut b_events) = peers(PeerConfig {
                map_shared: true,
                ..config(2)
            })
            .await;
            let payload: Vec<u8> = (0..300_000).map(|i| (i * 13) as u8).collect();
            let copy = shared_copy(&segments, 1, &payload);
            let ToPeer::Copy { bytes, .. } = &copy else {
                unreachable!()
            };
            let at = bytes.as_ptr();
            a.send(2, b_addr, copy);
            let (link, got) = match next(&mut b_events).await {
                PeerEvent::Received {
                    from: 1,
                    link,
                    msg:
                        ToPeer::Copy {
                            seq: 1,
                            chunk: 3,
                            bytes,
                            ..
                        },
                } => (link, bytes),
                other => panic!("{other:?}"),
            };
            assert_eq!(&got[..], &payload[..]);
            assert_eq!(segments.sharing().lent, 1);
            assert_eq!(b.shared_counts().mapped, 1);
            assert!(b.answer(1, link, FromPeer::Ack { seq: 1, kept: true }));
            match next(&mut a_events).await {
                PeerEvent::Answered {
                    to: 2,
                    msg: FromPeer::Ack { seq: 1, kept: true },
                    ..
                } => {}
                other => panic!("{other:?}"),
            }
            // Answered, but still mapped: another encoding gets other memory.
            let other = shared_copy(&segments, 2, &payload);
            let ToPeer::Copy { bytes, .. } = &other else {
                unreachable!()
            };
            assert_ne!(bytes.as_ptr(), at);
            drop(other);
            drop(got);
            until("the release", || segments.sharing().released == 1).await;
            assert_eq!(
                b.shared_counts(),
                SharedCounts {
                    mapped: 1,
                    ..Default::default()
                }
            );
            let again = shared_copy(&segments, 3, &payload);
            assert_eq!(segments.sharing().made, 2, "{:?}", segments.sharing());
            drop(again);
        });
    }

    /// A buddy that does not map shared copies (sharing off there, another node) answers
    /// `Unshared`: the dialer sends the copy's bytes instead, and sends every later copy so
    /// without trying again; both sides count it. The machine above sees a plain copy and
    /// its answer either way.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_buddy_that_does_not_map_gets_the_bytes_of_that_copy_and_of_every_later_one() {
        let segments = Arc::new(Segments::new(1 << 30).unwrap());
        block_on(async {
            let (mut a, _, mut a_events) = peers(PeerConfig {
                segments: Some(Arc::clone(&segments)),
                ..config(1)
            })
            .await;
            let (mut b, b_addr, mut b_events) = peers(config(2)).await;
            let payload: Vec<u8> = (0..200_000).map(|i| (i * 7) as u8).collect();
            for seq in [1, 2] {
                a.send(2, b_addr, shared_copy(&segments, seq, &payload));
                let link = match next(&mut b_events).await {
                    PeerEvent::Received {
                        from: 1,
                        link,
                        msg: ToPeer::Copy { seq: s, bytes, .. },
                    } if s == seq && bytes[..] == payload[..] => link,
                    other => panic!("{other:?}"),
                };
                assert!(b.answer(1, link, FromPeer::Ack { seq, kept: true }));
                match next(&mut a_events).await {
                    PeerEvent::Answered {
                        msg: FromPeer::Ack { seq: s, kept: true },
                        ..
                    } if s == seq => {}
                    other => panic!("{other:?}"),
                }
            }
            // One lend, refused; the second copy was not lent at all.
            let (sa, sb) = (a.shared_counts(), b.shared_counts());
            assert_eq!(sa.not_shared, 1, "{sa:?}");
            assert_eq!((sb.mapped, sb.not_mapped), (0, 1), "{sb:?}");
            // Nothing is lent any more: both segments serve again.
            let s = segments.sharing();
            assert_eq!((s.lent, s.released), (1, 0), "{s:?}");
        });
    }

    /// A dialer that names memory it did not lend (a descriptor of no process, another
    /// nonce) gets `Unshared`, and its link goes on: a halo after it still arrives.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_shared_copy_that_does_not_check_is_answered_and_the_link_goes_on() {
        block_on(async {
            let (mut a, _, _a_events) = peers(config(1)).await;
            let (b, b_addr, mut b_events) = peers(PeerConfig {
                map_shared: true,
                ..config(2)
            })
            .await;
            let forged = |seq, pid, fd| ToPeer::SharedCopy {
                seq,
                generation: 1,
                phase: 7,
                chunk: 3,
                at: SharedAt {
                    pid,
                    fd,
                    offset: 64,
                    len: 1000,
                    nonce: [9; 16],
                },
            };
            a.send(2, b_addr, forged(1, u32::MAX, 3));
            // This process's standard input: not a memory file.
            a.send(2, b_addr, forged(2, std::process::id(), 0));
            a.send(2, b_addr, halo(3, 10));
            received(next(&mut b_events).await, 1, &halo(3, 10));
            assert_eq!(b.shared_counts().not_mapped, 2);
            assert!(matches!(b_events.try_recv(), Err(TryRecvError::Empty)));
        });
    }

    /// The failure nobody waits for: the buddy's link ends while it maps a lent copy (its
    /// `Released` can no longer come). The owner forgets that memory when its link goes
    /// down, never to write it again, and the buddy's mapping keeps the copy's bytes.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_lend_whose_link_ended_is_forgotten_and_the_buddy_keeps_its_bytes() {
        block_on(async {
            let segments = Arc::new(Segments::new(1 << 30).unwrap());
            let (mut a, _, mut a_events) = peers(PeerConfig {
                segments: Some(Arc::clone(&segments)),
                ..config(1)
            })
            .await;
            let (b, b_addr, mut b_events) = peers(PeerConfig {
                map_shared: true,
                ..config(2)
            })
            .await;
            let payload: Vec<u8> = (0..150_000).map(|i| (i * 3) as u8).collect();
            a.send(2, b_addr, shared_copy(&segments, 1, &payload));
            let got = match next(&mut b_events).await {
                PeerEvent::Received {
                    msg: ToPeer::Copy { bytes, .. },
                    ..
                } => bytes,
                other => panic!("{other:?}"),
            };
            drop(b);
            down(next(&mut a_events).await, 2, true);
            let s = segments.sharing();
            assert_eq!((s.lent, s.released, s.forgotten), (1, 0, 1), "{s:?}");
            // New encodings take new memory; the buddy's copy is intact.
            for k in 0..3 {
                drop(shared_copy(&segments, 10 + k, &[k as u8; 150_000]));
            }
            assert_eq!(&got[..], &payload[..]);
            drop(got);
        });
    }
}
