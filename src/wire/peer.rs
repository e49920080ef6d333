//! The peer data plane's wire (protocol 20): worker processes of one job send halos directly
//! to each other instead of through the coordinator. This file holds the peer handshake and
//! the frames that follow it; the links that carry them are `worker/peers.rs`, and what is
//! sent when is decided by the peer protocol's machine, not here.
//!
//! # The protocol
//!
//! The *dialer* is the process that sends halos, the *listener* the one that receives them:
//! every worker process listens, and dials those it sends halos to. `H(label, a, b)` is
//! HMAC-SHA256 keyed with the job's shared token over `label ‖ a ‖ b`, as in the coordinator's
//! handshake (`handshake.rs`); nonces are 32 bytes from the operating system's generator. The
//! *session* (16 bytes) names one run of the job: the coordinator gives it to every process,
//! and gives a new one after a rollback or a new roster.
//!
//! 1. *Hello* (dialer → listener): `MAGIC ‖ version` in fixed bytes, then the dialer's
//!    session, its process number `from` and a fresh nonce `nd` ([`PeerHello`]).
//! 2. *Challenge* (listener → dialer): `MAGIC ‖ version`, then a fresh nonce `nl` and
//!    `H("peer-listener", nd, nl)` ([`PeerReply::Challenge`]). If the versions differ, a
//!    refusal instead ([`PeerRefusal::Version`]), and both sides report [`Error::Version`]; a
//!    wrong magic gets no answer at all: [`Error::NotAPeer`].
//! 3. *Proof* (dialer → listener): the dialer checks the listener's MAC (else it sends an
//!    empty proof and stops with [`Error::Auth`], [`AuthFailure::ListenerProof`]), then sends
//!    `H("peer-dialer", nl, nd)` ([`PeerProof`]).
//! 4. *Welcome* (listener → dialer): the listener checks the dialer's MAC (else it refuses
//!    with [`PeerRefusal::Auth`]: [`AuthFailure::DialerProof`] here,
//!    [`AuthFailure::RefusedByListener`] at the dialer), then that the dialer's session is its
//!    own (else it refuses with [`PeerRefusal::Session`], naming its own: both sides report
//!    [`Error::PeerSession`] with both sessions), then welcomes it ([`PeerReply::Welcome`]).
//!
//! Then the dialer sends [`ToPeer`] frames and the listener answers with [`FromPeer`] frames,
//! each side a heartbeat every heartbeat period; a message longer than a frame goes in
//! pieces, as between the coordinator and its workers (`frame.rs`). The labels are
//! `"malleable peer listener v1"` and `"malleable peer dialer v1"` (`"peer-listener"` and
//! `"peer-dialer"` above).
//!
//! The listener's side has a time limit for the whole handshake, and so has the dialer's
//! (`worker/peers.rs` gives both): a peer that says nothing, or stalls in the middle of a
//! frame, is dropped with [`Error::HandshakeTimeout`].
//!
//! # Frame limits
//!
//! As in the coordinator's handshake: until a side has checked the other's proof, the
//! connection's frame limit is [`HANDSHAKE_MAX_FRAME`], not the configured `max_frame`, so
//! that a stranger who claims a long frame makes this side reserve nothing (the framing
//! reserves room for a frame as soon as it reads its length). A claim over the handshake's
//! limit is not one of ours ([`Error::NotAPeer`]; an HTTP request's `GET ` reads as a length of
//! about 1.2 GB). The listener raises the limit once the dialer's proof checks (step 4), the
//! dialer once the listener's does (step 3).
//!
//! # Why it is correct
//!
//! - *Versions.* The magic and version are fixed bytes ahead of any postcard, so each side
//!   reads them whatever the other's version; a mismatch is named, not a decode error.
//! - *The token never crosses the wire*: only MACs over nonces do.
//! - *No replay.* Each side's MAC covers the other side's fresh nonce: a proof recorded in
//!   one handshake does not check in another, whichever side replays it.
//! - *No reflection.* Each role computes MACs of one label only, and the four labels of the
//!   cluster (coordinator, worker, peer listener, peer dialer) all differ. Every MAC's input is
//!   a label followed by exactly 64 bytes of nonces, so two different labels never give the
//!   same input: a listener cannot be made to compute a dialer's proof, nor a worker process
//!   (which is a coordinator's dialer, a peer's dialer and a peer's listener at once) to
//!   compute, in one role, a proof of another.
//! - *Nothing before the proof.* The listener checks the session, and names its own in a
//!   refusal, only to a dialer whose proof checked: an unauthenticated peer learns only the
//!   protocol version. (A dialer's hello names its session and process to whoever it dials;
//!   it dials only the addresses its coordinator gave it.)
//! - *Sessions.* A dialer of another run of the job (one that has not learned of a rollback
//!   yet, or a process of an older roster) is refused before any halo crosses, and so is a
//!   process of another job that shares the token. The listener's session may change while
//!   a link is up: `worker/peers.rs` closes the links of the old session then.
//! - *What a welcome proves*: that the dialer holds the job's token. Every process of the job
//!   holds the same token, so `from` is the claim of a process the coordinator trusts, as it
//!   trusts the `Done` of any of its workers; it is not checked against the roster here.
//!
//! This authenticates; it does not encrypt. On a network where an attacker can sit in the
//! middle of connections, run the cluster inside a VPN or SSH tunnel.
//!
//! Every decoder here takes untrusted bytes and returns a typed error, never panics; the fuzz
//! target `peer` exercises them.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::codec::Framed;

use super::Error;
use super::error::AuthFailure;
use super::frame::{Message, decode, encode, in_frame, with_frame};
use super::handshake::{
    HANDSHAKE_MAX_FRAME, Nonce, Proof, Token, next_authenticated, next_frame, no_token, nonce,
    send, set_limit, unversioned, versioned,
};

/// One run of a job, as the coordinator names it to every worker process: 16 bytes, a new
/// value after a rollback or a new roster.
pub type Session = [u8; 16];

/// The label of the listener's MACs (`"peer-listener"` in the module's docs).
const PEER_LISTENER: &[u8] = b"malleable peer listener v1";
/// The label of the dialer's MACs (`"peer-dialer"` in the module's docs).
const PEER_DIALER: &[u8] = b"malleable peer dialer v1";

/// Step 1 (dialer → listener), after `MAGIC ‖ version`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerHello {
    /// The dialer's session.
    pub session: Session,
    /// The dialer's process number.
    pub from: u64,
    /// The dialer's nonce `nd`.
    pub nonce: Nonce,
}

/// Steps 2 and 4 (listener → dialer), and the refusals.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PeerReply {
    /// Step 2 (after `MAGIC ‖ version`): the listener's nonce and proof.
    Challenge {
        /// The listener's nonce `nl`.
        nonce: Nonce,
        /// `H("peer-listener", nd, nl)`.
        proof: Proof,
    },
    /// Step 4: the dialer may send halos.
    Welcome,
    /// The dialer is refused.
    Refused(PeerRefusal),
}

/// Why a listener refuses a dialer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PeerRefusal {
    /// The protocol versions differ (step 2; the version is in the frame's fixed bytes).
    Version,
    /// The dialer's proof was wrong (step 4).
    Auth,
    /// The dialer is of another session (step 4, to an authenticated dialer only).
    Session {
        /// The listener's session.
        session: Session,
    },
}

/// Step 3 (dialer → listener).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerProof {
    /// `H("peer-dialer", nl, nd)`.
    pub proof: Proof,
}

/// A message from a dialer to the listener it dialled, after the handshake.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ToPeer {
    /// A halo partition `from` exported at the end of `phase` for partition `to`, which the
    /// receiver holds as far as the sender was told. Answered by [`FromPeer::Ack`] with the
    /// same `seq`.
    Halo {
        /// The sender's number for it, which the answer quotes.
        seq: u64,
        /// The job's generation (its rollbacks so far) the halo is of.
        generation: u64,
        /// The phase at whose end it was exported.
        phase: u64,
        /// The partition (chunk) that exported it.
        from: u64,
        /// The partition (chunk) it is for.
        to: u64,
        /// The halo (postcard of the job's `Partition::Halo`).
        #[serde(deserialize_with = "in_frame")]
        bytes: Bytes,
    },
    /// The dialer is alive.
    Heartbeat,
    /// A piece of a message too long for one frame; `more` is false on the last one.
    Piece {
        /// Whether more pieces follow.
        more: bool,
        /// The piece.
        #[serde(deserialize_with = "in_frame")]
        bytes: Bytes,
    },
    /// A buddy copy (protocol 21): partition `chunk` as it ended `phase`, for the receiver to
    /// keep in memory until a newer copy replaces it or the coordinator says it is not
    /// needed. Answered by [`FromPeer::Ack`] with the same `seq` (`kept`: the receiver keeps
    /// it; otherwise it refused it: another generation, a chunk the job does not have, one
    /// held there, or over its memory for copies).
    Copy {
        /// The sender's number for it, which the answer quotes.
        seq: u64,
        /// The job's generation the copy is of.
        generation: u64,
        /// The phase the partition ended.
        phase: u64,
        /// The partition (chunk).
        chunk: u64,
        /// The partition's state (postcard of the job's chunk).
        #[serde(deserialize_with = "in_frame")]
        bytes: Bytes,
    },
    /// A buddy copy in memory the sender shares (protocol 28): as [`ToPeer::Copy`], but the
    /// bytes are in a memory file of the sender's, which the receiver maps instead of
    /// reading them from the link (two processes of one node). Answered as a `Copy` is, or
    /// by [`FromPeer::Unshared`] if the receiver does not map it; a copy it mapped is
    /// followed by [`FromPeer::Released`] once it lets go of it.
    SharedCopy {
        /// The sender's number for it, which the answer quotes.
        seq: u64,
        /// The job's generation the copy is of.
        generation: u64,
        /// The phase the partition ended.
        phase: u64,
        /// The partition (chunk).
        chunk: u64,
        /// Where its bytes are.
        at: SharedAt,
    },
}

/// Where a shared buddy copy's bytes are ([`ToPeer::SharedCopy`]): in the memory file that
/// process `pid`'s descriptor `fd` names, bytes `offset..offset + len`, under a header that
/// repeats the nonce (so that a process of another node with the same numbers is not
/// mistaken for the sender).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedAt {
    /// The sender's process id.
    pub pid: u32,
    /// The memory file's descriptor number in that process.
    pub fd: u32,
    /// Where the copy starts in the file.
    pub offset: u64,
    /// Its length.
    pub len: u64,
    /// The lend's nonce, in the file's header too.
    pub nonce: [u8; 16],
}

/// A message from a listener to a dialer, after the handshake.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum FromPeer {
    /// The answer to [`ToPeer::Halo`] or [`ToPeer::Copy`] number `seq`.
    Ack {
        /// The halo's number.
        seq: u64,
        /// `kept`: the receiver keeps the halo for its partition; otherwise it refused it (the
        /// partition is not there, or not ready) and the sender must send it through the
        /// coordinator.
        kept: bool,
    },
    /// The listener is alive.
    Heartbeat,
    /// A piece of a message too long for one frame; `more` is false on the last one.
    Piece {
        /// Whether more pieces follow.
        more: bool,
        /// The piece.
        #[serde(deserialize_with = "in_frame")]
        bytes: Bytes,
    },
    /// The answer to [`ToPeer::SharedCopy`] number `seq` that the listener did not map
    /// (protocol 28): the dialer sends the copy's bytes instead, and every later copy too.
    Unshared {
        /// The copy's number.
        seq: u64,
    },
    /// The listener no longer maps the shared copy of this nonce (protocol 28): its memory
    /// may serve the dialer again.
    Released {
        /// The nonce of the [`SharedAt`] it was lent with.
        nonce: [u8; 16],
    },
}

impl Message for ToPeer {
    const WHAT: &'static str = "a message to a peer";
    fn piece(more: bool, bytes: Bytes) -> Self {
        ToPeer::Piece { more, bytes }
    }
    fn into_piece(self) -> Result<(bool, Bytes), Self> {
        match self {
            ToPeer::Piece { more, bytes } => Ok((more, bytes)),
            m => Err(m),
        }
    }
    fn decode_frame(peer: &str, frame: Bytes) -> Result<Self, Error> {
        with_frame(frame, |body| decode_to_peer(peer, body))
    }
    fn tail(&self) -> Option<(Self, Bytes)> {
        match self {
            ToPeer::Copy {
                seq,
                generation,
                phase,
                chunk,
                bytes,
            } => Some((
                ToPeer::Copy {
                    seq: *seq,
                    generation: *generation,
                    phase: *phase,
                    chunk: *chunk,
                    bytes: Bytes::new(),
                },
                bytes.clone(),
            )),
            _ => None,
        }
    }
}

impl Message for FromPeer {
    const WHAT: &'static str = "a peer's answer";
    fn piece(more: bool, bytes: Bytes) -> Self {
        FromPeer::Piece { more, bytes }
    }
    fn into_piece(self) -> Result<(bool, Bytes), Self> {
        match self {
            FromPeer::Piece { more, bytes } => Ok((more, bytes)),
            m => Err(m),
        }
    }
    fn decode_frame(peer: &str, frame: Bytes) -> Result<Self, Error> {
        with_frame(frame, |body| decode_from_peer(peer, body))
    }
}

/// About the bytes `msg` takes on the wire: its bytes, plus a little for the rest (for a
/// sender that bounds what it has in flight).
// For the peer protocol's machine, which comes next.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn weight(msg: &ToPeer) -> usize {
    64 + match msg {
        ToPeer::Halo { bytes, .. } | ToPeer::Piece { bytes, .. } | ToPeer::Copy { bytes, .. } => {
            bytes.len()
        }
        ToPeer::Heartbeat | ToPeer::SharedCopy { .. } => 0,
    }
}

/// Decodes a message to a peer (a listener reads it).
///
/// # Errors
///
/// [`Error::Malformed`] for bytes that are not one.
pub fn decode_to_peer(peer: &str, body: &[u8]) -> Result<ToPeer, Error> {
    decode(peer, ToPeer::WHAT, body)
}

/// Decodes a peer's answer (a dialer reads it).
///
/// # Errors
///
/// [`Error::Malformed`] for bytes that are not one.
pub fn decode_from_peer(peer: &str, body: &[u8]) -> Result<FromPeer, Error> {
    decode(peer, FromPeer::WHAT, body)
}

/// Decodes step 1 (a listener reads it from an unknown peer).
///
/// # Errors
///
/// [`Error::NotAPeer`], [`Error::Version`] or [`Error::Malformed`].
pub fn decode_peer_hello(peer: &str, frame: &[u8]) -> Result<PeerHello, Error> {
    decode(peer, "a peer's hello", unversioned(peer, frame)?)
}

/// Decodes step 2 or a refusal of the version (a dialer reads it).
///
/// # Errors
///
/// [`Error::NotAPeer`], [`Error::Version`] or [`Error::Malformed`].
pub fn decode_peer_reply(peer: &str, frame: &[u8]) -> Result<PeerReply, Error> {
    decode(peer, "a peer's challenge", unversioned(peer, frame)?)
}

/// Decodes step 3.
///
/// # Errors
///
/// [`Error::Malformed`].
pub fn decode_peer_proof(peer: &str, frame: &[u8]) -> Result<PeerProof, Error> {
    decode(peer, "a peer's proof", frame)
}

/// Decodes step 4 (or a refusal).
///
/// # Errors
///
/// [`Error::Malformed`].
pub fn decode_peer_welcome(peer: &str, frame: &[u8]) -> Result<PeerReply, Error> {
    decode(peer, "a peer's welcome", frame)
}

/// A protocol message that decodes but is not allowed where it came.
fn rejected(peer: &str, what: &'static str, reason: &str) -> Error {
    Error::Rejected {
        peer: peer.to_owned(),
        what,
        reason: reason.to_owned(),
        source: None,
    }
}

/// The listener's side of steps 1–4 for the process of session `session`; the process
/// number the dialer gave. The connection's frame limit is [`HANDSHAKE_MAX_FRAME`] until the
/// dialer's proof checks, then `limit`. The caller bounds its time.
///
/// # Errors
///
/// [`Error::NotAPeer`], [`Error::Version`], [`Error::Auth`], [`Error::PeerSession`],
/// [`Error::Malformed`], and those of the connection.
pub(crate) async fn listener<S>(
    framed: &mut Framed<S, crate::wire::frame::Codec>,
    peer: &str,
    token: Option<&Token>,
    session: Session,
    limit: usize,
) -> Result<u64, Error>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let has_token = token.is_some();
    let token = token.cloned().unwrap_or_else(no_token);
    set_limit(framed, HANDSHAKE_MAX_FRAME);
    let first = next_frame(framed, peer).await?;
    let hello = match decode_peer_hello(peer, &first) {
        Ok(h) => h,
        Err(e @ Error::Version { .. }) => {
            let refusal = versioned(&PeerReply::Refused(PeerRefusal::Version));
            let _ = send(framed, peer, refusal).await;
            return Err(e);
        }
        Err(e) => return Err(e),
    };
    let nl = nonce()?;
    let proof = token.prove(PEER_LISTENER, &hello.nonce, &nl);
    let challenge = PeerReply::Challenge { nonce: nl, proof };
    send(framed, peer, versioned(&challenge)).await?;
    let theirs = decode_peer_proof(peer, &next_frame(framed, peer).await?)?;
    if !token.check(PEER_DIALER, &nl, &hello.nonce, &theirs.proof) {
        let _ = send(framed, peer, encode(&PeerReply::Refused(PeerRefusal::Auth))).await;
        return Err(Error::Auth {
            peer: peer.to_owned(),
            failure: AuthFailure::DialerProof { token: has_token },
        });
    }
    // The dialer is authenticated: its frames may be as long as the configuration allows.
    set_limit(framed, limit);
    if hello.session != session {
        let refusal = PeerReply::Refused(PeerRefusal::Session { session });
        let _ = send(framed, peer, encode(&refusal)).await;
        return Err(Error::PeerSession {
            peer: peer.to_owned(),
            ours: session,
            theirs: hello.session,
        });
    }
    send(framed, peer, encode(&PeerReply::Welcome)).await?;
    Ok(hello.from)
}

/// The dialer's side of steps 1–4 for process `from` of session `session`. The
/// connection's frame limit is [`HANDSHAKE_MAX_FRAME`] until the listener's proof checks,
/// then `limit`. The caller bounds its time.
///
/// # Errors
///
/// [`Error::NotAPeer`], [`Error::Version`], [`Error::Auth`], [`Error::PeerSession`],
/// [`Error::Malformed`], [`Error::Rejected`] (a reply out of place), and those of the
/// connection.
pub(crate) async fn dialer<S>(
    framed: &mut Framed<S, crate::wire::frame::Codec>,
    peer: &str,
    token: Option<&Token>,
    session: Session,
    from: u64,
    limit: usize,
) -> Result<(), Error>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let has_token = token.is_some();
    let token = token.cloned().unwrap_or_else(no_token);
    set_limit(framed, HANDSHAKE_MAX_FRAME);
    let nd = nonce()?;
    let hello = PeerHello {
        session,
        from,
        nonce: nd,
    };
    // 12 + 16 + at most 10 + 32 bytes: far under the handshake's limit.
    send(framed, peer, versioned(&hello)).await?;
    let (nl, proof) = match decode_peer_reply(peer, &next_frame(framed, peer).await?)? {
        PeerReply::Challenge { nonce, proof } => (nonce, proof),
        // A listener of another version says so with its own version in the fixed bytes,
        // which `decode_peer_reply` reports as `Error::Version`; one of this version has
        // no reason to.
        PeerReply::Refused(PeerRefusal::Version) => {
            return Err(Error::Refused {
                peer: peer.to_owned(),
                reason: "protocol version mismatch".into(),
            });
        }
        PeerReply::Refused(_) => {
            return Err(rejected(
                peer,
                "a peer's challenge",
                "a refusal before the proof",
            ));
        }
        PeerReply::Welcome => {
            return Err(rejected(
                peer,
                "a peer's challenge",
                "a welcome before the proof",
            ));
        }
    };
    if !token.check(PEER_LISTENER, &nd, &nl, &proof) {
        // An empty proof, which the listener refuses: both sides then report the failure as
        // `Auth` (instead of a connection that closed in the middle of the handshake).
        let _ = send(framed, peer, encode(&PeerProof { proof: [0; 32] })).await;
        return Err(Error::Auth {
            peer: peer.to_owned(),
            failure: AuthFailure::ListenerProof { token: has_token },
        });
    }
    // The listener is authenticated: its frames may be as long as the configuration allows.
    set_limit(framed, limit);
    let proof = token.prove(PEER_DIALER, &nl, &nd);
    send(framed, peer, encode(&PeerProof { proof })).await?;
    let welcome = next_authenticated(framed, peer, limit).await?;
    match decode_peer_welcome(peer, &welcome)? {
        PeerReply::Welcome => Ok(()),
        PeerReply::Refused(PeerRefusal::Auth) => Err(Error::Auth {
            peer: peer.to_owned(),
            failure: AuthFailure::RefusedByListener,
        }),
        PeerReply::Refused(PeerRefusal::Session { session: theirs }) => Err(Error::PeerSession {
            peer: peer.to_owned(),
            ours: session,
            theirs,
        }),
        PeerReply::Refused(PeerRefusal::Version) => Err(rejected(
            peer,
            "a peer's welcome",
            "a refusal of the version after the proof",
        )),
        PeerReply::Challenge { .. } => {
            Err(rejected(peer, "a peer's welcome", "a second challenge"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::frame::{Assembler, Frames, PROTOCOL_VERSION, codec};
    use super::super::handshake::{COORDINATOR, WORKER};
    use super::*;
    use futures::{SinkExt, StreamExt};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const LIMIT: usize = 1 << 20;
    const SESSION: Session = [7; 16];

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    fn token(t: Option<&str>) -> Option<Token> {
        t.map(|t| Token::new(t).unwrap())
    }

    type Pipe = Framed<tokio::io::DuplexStream, crate::wire::frame::Codec>;

    fn pipe() -> (Pipe, Pipe) {
        let (a, b) = tokio::io::duplex(1 << 16);
        (Framed::new(a, codec(LIMIT)), Framed::new(b, codec(LIMIT)))
    }

    /// Both sides of a handshake over a pipe: the listener with `listener_token` in session
    /// `ls`, the dialer (process 3) with `dialer_token` in session `ds`.
    fn shake(
        listener_token: Option<&str>,
        ls: Session,
        dialer_token: Option<&str>,
        ds: Session,
    ) -> (Result<u64, Error>, Result<(), Error>) {
        let (lt, dt) = (token(listener_token), token(dialer_token));
        runtime().block_on(async {
            let (mut l, mut d) = pipe();
            let (a, b) = tokio::join!(
                listener(&mut l, "dialer:1", lt.as_ref(), ls, LIMIT),
                dialer(&mut d, "listener:2", dt.as_ref(), ds, 3, LIMIT),
            );
            if a.is_ok() && b.is_ok() {
                // The limits were raised on both sides.
                assert_eq!(l.codec().max_frame_length(), LIMIT);
                assert_eq!(d.codec().max_frame_length(), LIMIT);
            }
            (a, b)
        })
    }

    #[test]
    fn the_right_token_and_session_welcome_the_dialer() {
        let (l, d) = shake(Some("t"), SESSION, Some("t"), SESSION);
        assert_eq!(l.unwrap(), 3);
        d.unwrap();
        // No token on either side (loopback): the handshake runs and welcomes.
        let (l, d) = shake(None, SESSION, None, SESSION);
        assert_eq!(l.unwrap(), 3);
        d.unwrap();
    }

    /// Each side words a wrong token for what it saw, for peers (not for a coordinator).
    #[test]
    fn a_wrong_token_is_worded_for_each_side() {
        let (l, d) = shake(Some("right"), SESSION, Some("wrong"), SESSION);
        let (l, d) = (l.unwrap_err(), d.unwrap_err());
        assert!(
            matches!(
                d,
                Error::Auth {
                    failure: AuthFailure::ListenerProof { token: true },
                    ..
                }
            ),
            "{d:?}"
        );
        assert_eq!(
            d.to_string(),
            "the worker process at listener:2, dialled for halos, does not hold this worker \
             process's shared token: give every worker process of the job the coordinator's \
             token: MALLEABLE_TOKEN in the environment of each (read by \
             WorkerOptions::from_env), or WorkerOptions::token"
        );
        assert!(
            matches!(
                l,
                Error::Auth {
                    failure: AuthFailure::DialerProof { token: true },
                    ..
                }
            ),
            "{l:?}"
        );
        assert_eq!(
            l.to_string(),
            "the worker process at dialer:1, which dialled this one for halos, did not prove \
             that it holds this worker process's shared token (it has another one, or none): \
             give every worker process of the job the coordinator's token: MALLEABLE_TOKEN in \
             the environment of each (read by WorkerOptions::from_env), or WorkerOptions::token"
        );
        for e in [&l, &d] {
            assert_eq!(e.kind(), "auth");
            assert!(!e.to_string().contains("coordinator at"), "{e}");
        }
        // No token on the dialer's side.
        let (l, d) = shake(Some("right"), SESSION, None, SESSION);
        let d = d.unwrap_err();
        assert!(
            d.to_string()
                .contains("requires a shared token and this worker process has none"),
            "{d}"
        );
        assert!(matches!(l.unwrap_err(), Error::Auth { .. }));
        // No token on the listener's side, one on the dialer's.
        let (l, d) = shake(None, SESSION, Some("mine"), SESSION);
        assert!(matches!(d.unwrap_err(), Error::Auth { .. }));
        let l = l.unwrap_err();
        assert!(
            l.to_string()
                .contains("has a shared token and this worker process none"),
            "{l}"
        );
    }

    /// A dialer whose proof checks but which the listener refuses anyway (a listener that
    /// insists) is told so: `RefusedByListener`.
    #[test]
    fn a_refused_proof_is_named_by_the_dialer() {
        runtime().block_on(async {
            let (mut l, mut d) = pipe();
            let hostile = async {
                let hello = decode_peer_hello("d", &l.next().await.unwrap().unwrap()).unwrap();
                let nl = [5; 32];
                let proof = no_token().prove(PEER_LISTENER, &hello.nonce, &nl);
                send(
                    &mut l,
                    "d",
                    versioned(&PeerReply::Challenge { nonce: nl, proof }),
                )
                .await
                .unwrap();
                let _proof = l.next().await;
                send(&mut l, "d", encode(&PeerReply::Refused(PeerRefusal::Auth)))
                    .await
                    .unwrap();
            };
            let (_, d) = tokio::join!(hostile, dialer(&mut d, "l", None, SESSION, 1, LIMIT));
            let d = d.unwrap_err();
            assert!(
                matches!(
                    d,
                    Error::Auth {
                        failure: AuthFailure::RefusedByListener,
                        ..
                    }
                ),
                "{d:?}"
            );
            assert!(
                d.to_string()
                    .contains("refused this worker process's proof")
            );
        });
    }

    /// A dialer of another session is refused after the proofs, and both sides name both
    /// sessions, each its own as `ours`.
    #[test]
    fn another_session_is_refused_on_both_sides() {
        let (ls, ds) = ([1; 16], [2; 16]);
        let (l, d) = shake(Some("t"), ls, Some("t"), ds);
        match l.unwrap_err() {
            Error::PeerSession { ours, theirs, .. } => assert_eq!((ours, theirs), (ls, ds)),
            other => panic!("{other:?}"),
        }
        let d = d.unwrap_err();
        match &d {
            Error::PeerSession { ours, theirs, .. } => assert_eq!((*ours, *theirs), (ds, ls)),
            other => panic!("{other:?}"),
        }
        assert_eq!(d.kind(), "peer_session");
        assert_eq!(
            d.to_string(),
            "the worker process at listener:2 is in session 01010101010101010101010101010101, \
             this worker process in session 02020202020202020202020202020202: one of the two \
             has not yet learned of the job's new run (a rollback, a new roster), or they are \
             of different jobs; no halo crosses between them"
        );
    }

    /// A hello of another version is refused with a refusal in this side's version, which
    /// the dialer reads as `Version`; a challenge of another version is `Version` too.
    #[test]
    fn another_version_is_named_on_both_sides() {
        runtime().block_on(async {
            let (mut l, mut d) = pipe();
            let mut old = frame_of_version(PROTOCOL_VERSION - 1);
            old.extend_from_slice(&encode(&PeerHello {
                session: SESSION,
                from: 1,
                nonce: [0; 32],
            }));
            let old_dialer = async {
                d.send(Bytes::from(old)).await.unwrap();
                d.next().await.unwrap().unwrap()
            };
            let (l, answer) = tokio::join!(listener(&mut l, "d", None, SESSION, LIMIT), old_dialer);
            let Err(Error::Version { ours, theirs, .. }) = l else {
                panic!("{l:?}");
            };
            assert_eq!((ours, theirs), (PROTOCOL_VERSION, PROTOCOL_VERSION - 1));
            // What the listener answered, read by a dialer of the old version: a refusal of
            // the version, in the listener's version.
            assert_eq!(
                &answer[..],
                &versioned(&PeerReply::Refused(PeerRefusal::Version))[..]
            );
            assert!(matches!(
                decode_peer_reply("l", &answer),
                Ok(PeerReply::Refused(PeerRefusal::Version))
            ));
        });
        runtime().block_on(async {
            let (mut l, mut d) = pipe();
            let newer = async {
                let _hello = l.next().await;
                let mut reply = frame_of_version(PROTOCOL_VERSION + 1);
                reply.extend_from_slice(&encode(&PeerReply::Refused(PeerRefusal::Version)));
                l.send(Bytes::from(reply)).await.unwrap();
            };
            let (_, d) = tokio::join!(newer, dialer(&mut d, "l", None, SESSION, 1, LIMIT));
            assert!(
                matches!(d, Err(Error::Version { theirs, .. }) if theirs == PROTOCOL_VERSION + 1),
                "{d:?}"
            );
        });
    }

    fn frame_of_version(version: u32) -> Vec<u8> {
        let mut out = super::super::frame::MAGIC.to_vec();
        out.extend_from_slice(&version.to_be_bytes());
        out
    }

    /// A stranger's bytes on the listener: `NotAPeer`, no answer, and no memory reserved for
    /// what it claims.
    fn stranger(bytes: &'static [u8]) {
        runtime().block_on(async {
            let (a, mut b) = tokio::io::duplex(1 << 16);
            let mut l = Framed::new(a, codec(LIMIT));
            b.write_all(bytes).await.unwrap();
            // A listener that took the claim would wait for the rest of the frame.
            let shake = listener(&mut l, "stranger", None, SESSION, LIMIT);
            let e = tokio::time::timeout(std::time::Duration::from_secs(5), shake)
                .await
                .expect("the listener waits for the rest of a stranger's frame")
                .unwrap_err();
            assert!(matches!(e, Error::NotAPeer { .. }), "{e:?}");
            assert!(
                l.read_buffer().capacity() <= 2 * HANDSHAKE_MAX_FRAME,
                "{} bytes reserved",
                l.read_buffer().capacity()
            );
            drop(l);
            let mut answer = Vec::new();
            b.read_to_end(&mut answer).await.unwrap();
            assert!(answer.is_empty(), "a stranger got {answer:?}");
        });
    }

    #[test]
    fn an_http_request_is_not_a_peer() {
        stranger(b"GET / HTTP/1.1\r\nHost: malleable\r\n\r\n");
    }

    #[test]
    fn a_long_frame_before_the_proof_reserves_nothing() {
        // A claim of 1 GiB, then the magic; one of 512 KiB, under the configured limit
        // (which the framing would reserve if the handshake's limit were not in force).
        stranger(b"\x40\x00\x00\x00MALLEABL");
        stranger(b"\x00\x08\x00\x00MALLEABL");
        // A frame of the right length with the wrong magic.
        stranger(b"\x00\x00\x00\x0cMALLEABX\x00\x00\x00\x14");
    }

    /// A listener facing a hand-played dialer that says hello with nonce `nd` and answers
    /// the challenge with `forge(nl)`; the listener's result.
    async fn forged_dialer(
        t: &Token,
        hello: Bytes,
        forge: impl FnOnce(Nonce) -> Proof,
    ) -> Result<u64, Error> {
        let (mut l, mut d) = pipe();
        let hostile = async {
            d.send(hello).await.unwrap();
            let challenge = d.next().await.unwrap().unwrap();
            let Ok(PeerReply::Challenge { nonce: nl, .. }) = decode_peer_reply("l", &challenge)
            else {
                panic!("no challenge");
            };
            let proof = PeerProof { proof: forge(nl) };
            d.send(encode(&proof)).await.unwrap();
            // The refusal, if any.
            let _ = d.next().await;
        };
        let (r, ()) = tokio::join!(listener(&mut l, "d", Some(t), SESSION, LIMIT), hostile);
        r
    }

    /// A proof recorded in one handshake does not check in another, whichever side replays
    /// it; and no side takes a MAC of another role (a listener's, a coordinator's, a
    /// worker's) for the one it expects.
    #[test]
    fn recorded_and_reflected_proofs_fail() {
        let t = Token::new("t").unwrap();
        runtime().block_on(async {
            // A recorder between a dialer and a listener copies each frame of a handshake
            // that succeeds.
            let (mut l, mut tap_l) = pipe();
            let (mut tap_d, mut d) = pipe();
            let relay = async {
                let mut seen = Vec::new();
                for toward_listener in [true, false, true, false] {
                    let (from, to) = if toward_listener {
                        (&mut tap_d, &mut tap_l)
                    } else {
                        (&mut tap_l, &mut tap_d)
                    };
                    let f = from.next().await.unwrap().unwrap().freeze();
                    to.send(f.clone()).await.unwrap();
                    seen.push(f);
                }
                seen
            };
            let (lr, dr, seen) = tokio::join!(
                listener(&mut l, "d", Some(&t), SESSION, LIMIT),
                dialer(&mut d, "l", Some(&t), SESSION, 4, LIMIT),
                relay,
            );
            assert_eq!(lr.unwrap(), 4);
            dr.unwrap();
            let [hello, challenge, proof, _welcome] = <[Bytes; 4]>::try_from(seen).unwrap();
            let proof = decode_peer_proof("d", &proof).unwrap().proof;
            let nd = decode_peer_hello("d", &hello).unwrap().nonce;

            // Replayed to a listener: the hello again, then the recorded proof.
            let e = forged_dialer(&t, hello.clone(), |_| proof)
                .await
                .unwrap_err();
            assert!(
                matches!(
                    e,
                    Error::Auth {
                        failure: AuthFailure::DialerProof { token: true },
                        ..
                    }
                ),
                "{e:?}"
            );
            // Replayed to a dialer: the recorded challenge, whatever its hello.
            let (mut l2, mut d2) = pipe();
            let hostile = async {
                let _hello = l2.next().await;
                l2.send(challenge.clone()).await.unwrap();
                let _proof = l2.next().await;
            };
            let (_, e) = tokio::join!(hostile, dialer(&mut d2, "l", Some(&t), SESSION, 4, LIMIT));
            assert!(
                matches!(
                    e,
                    Err(Error::Auth {
                        failure: AuthFailure::ListenerProof { token: true },
                        ..
                    })
                ),
                "{e:?}"
            );

            // MACs of the other roles over the same nonces, as an oracle would give them:
            // none passes for a dialer's proof.
            type Forge = fn(&Token, &Nonce, &Nonce) -> Proof;
            let others: [(&str, Forge); 5] = [
                ("listener's", |t, nd, nl| t.prove(PEER_LISTENER, nd, nl)),
                ("listener's, reversed", |t, nd, nl| {
                    t.prove(PEER_LISTENER, nl, nd)
                }),
                ("coordinator's", |t, nd, nl| t.prove(COORDINATOR, nd, nl)),
                ("worker's", |t, nd, nl| t.prove(WORKER, nl, nd)),
                ("dialer's, reversed", |t, nd, nl| {
                    t.prove(PEER_DIALER, nd, nl)
                }),
            ];
            for (what, forge) in others {
                let e = forged_dialer(&t, hello.clone(), |nl| forge(&t, &nd, &nl))
                    .await
                    .unwrap_err();
                assert!(matches!(e, Error::Auth { .. }), "a {what} MAC: {e:?}");
            }
            // And the right one checks (the hand-played dialer is faithful).
            let from = forged_dialer(&t, hello, |nl| t.prove(PEER_DIALER, &nl, &nd))
                .await
                .unwrap();
            assert_eq!(from, 4);
        });
    }

    /// A welcome or a refusal before the proof decodes but breaks the protocol: `Rejected`.
    #[test]
    fn a_welcome_before_the_proof_is_rejected() {
        for early in [PeerReply::Welcome, PeerReply::Refused(PeerRefusal::Auth)] {
            runtime().block_on(async {
                let (mut l, mut d) = pipe();
                let hostile = async {
                    let _hello = l.next().await;
                    send(&mut l, "d", versioned(&early)).await.unwrap();
                };
                let (_, e) = tokio::join!(hostile, dialer(&mut d, "l", None, SESSION, 1, LIMIT));
                let e = e.unwrap_err();
                assert_eq!(e.kind(), "rejected", "{e:?}");
            });
        }
    }

    /// Both frames round-trip, in pieces too, and their bytes share the frame they came in.
    #[test]
    fn frames_cross_whole_and_in_pieces() {
        let halo = ToPeer::Halo {
            seq: 1,
            generation: 2,
            phase: 3,
            from: 4,
            to: 5,
            bytes: (0..5000u32).map(|i| i as u8).collect::<Vec<u8>>().into(),
        };
        // A buddy copy long enough goes with its bytes as the frame's tail.
        let copy = ToPeer::Copy {
            seq: 9,
            generation: 2,
            phase: 20,
            chunk: 31,
            bytes: (0..300_000u32).map(|i| i as u8).collect::<Vec<u8>>().into(),
        };
        for msg in [&halo, &copy] {
            for max_frame in [64, 1024, 1 << 20] {
                let frames: Vec<Bytes> =
                    Frames::new(msg, max_frame).map(|f| f.to_bytes()).collect();
                assert!(frames.iter().all(|f| f.len() <= max_frame));
                let mut a = Assembler::new(1 << 20);
                let mut got = None;
                for f in frames {
                    got = a.frame::<ToPeer>("d", f).unwrap();
                }
                assert_eq!(got.as_ref(), Some(msg));
            }
        }
        let whole: Vec<_> = Frames::new(&copy, 1 << 20).collect();
        assert_eq!(whole.len(), 1);
        assert_eq!(whole[0].to_bytes(), encode(&copy));
        let frame = encode(&halo);
        let Ok(ToPeer::Halo { bytes, .. }) = ToPeer::decode_frame("d", frame.clone()) else {
            panic!("a halo");
        };
        let (start, end) = (
            frame.as_ptr() as usize,
            frame.as_ptr() as usize + frame.len(),
        );
        assert!(
            (start..end).contains(&(bytes.as_ptr() as usize)),
            "the halo was copied"
        );
        assert!(weight(&halo) >= 5000);
        for answer in [
            FromPeer::Ack { seq: 9, kept: true },
            FromPeer::Ack {
                seq: u64::MAX,
                kept: false,
            },
            FromPeer::Heartbeat,
        ] {
            assert_eq!(
                FromPeer::decode_frame("l", encode(&answer)).unwrap(),
                answer
            );
        }
        // Bytes that are not a message: `Malformed`, naming what was expected.
        let e = decode_to_peer("d", &[0x7f]).unwrap_err();
        assert!(
            matches!(&e, Error::Malformed { what, .. } if *what == ToPeer::WHAT),
            "{e:?}"
        );
        let e = decode_from_peer("l", &[0, 1]).unwrap_err();
        assert!(
            matches!(&e, Error::Malformed { what, .. } if *what == FromPeer::WHAT),
            "{e:?}"
        );
    }
}
