//! The handshake: both sides check that they speak the same protocol, prove to each other that
//! they hold the same token, and agree on the job.
//!
//! # The protocol
//!
//! The worker dials the coordinator. `H(label, a, b)` is HMAC-SHA256 keyed with the shared
//! token over `label ‖ a ‖ b`; nonces are 32 bytes from the operating system's generator.
//!
//! 1. *Hello* (worker → coordinator): `MAGIC ‖ version` in fixed bytes, then the jobs the
//!    worker has registered (each a name, its [`Job::VERSION`](crate::Job::VERSION) and the
//!    [fingerprint](crate::Fingerprint) of its types' serialized [`Layout`](crate::Layout)),
//!    its thread count and a fresh nonce `nw`.
//! 2. *Challenge* (coordinator → worker): `MAGIC ‖ version`, then a fresh nonce `nc` and
//!    `H("coordinator", nw, nc)`. Or, if the magic or version differ, a refusal (a wrong magic
//!    gets no answer at all: the peer is not one of ours).
//! 3. *Proof* (worker → coordinator): the worker checks the coordinator's MAC (else it sends
//!    an empty proof and stops with [`Error::Auth`], [`AuthFailure::CoordinatorProof`]), then
//!    sends `H("worker", nc, nw)`.
//! 4. *Welcome* (coordinator → worker): the coordinator checks the worker's MAC (else it
//!    answers with a refusal and both sides report [`Error::Auth`]), then picks a running job
//!    whose name, version and layout the worker has, and names it and its version, with the
//!    heartbeat period and lease. If the worker has no running job's name, the refusal names
//!    the running jobs ([`Error::UnknownJob`] on both sides); if it has one only in another
//!    version, the refusal names the coordinator's version ([`Error::JobVersion`] on both
//!    sides, with both versions). The worker checks the welcome's version against its own too.
//! 5. *Layouts* (only after a refusal for the layout): if the worker has a running job's name
//!    and version but its types have another layout (both traced, fingerprints that differ),
//!    the refusal carries the coordinator's layout entries ([`Refusal::Layout`]), and the
//!    worker answers with its own ([`WorkerLayout`]): each side then names the first entry
//!    that differs, and both report [`Error::JobLayout`] with both fingerprints. A layout that
//!    could not be traced on either side
//!    ([`Layout::untraceable`](crate::Layout::untraceable)) is not checked.
//!
//! The whole handshake has a time limit on the coordinator's side (a peer that says nothing or
//! stalls in the middle of a frame is dropped with [`Error::HandshakeTimeout`]).
//!
//! # Frame limits
//!
//! Until a side has checked the other's proof, the connection's frame limit is
//! [`HANDSHAKE_MAX_FRAME`] (a few KiB: the handshake's messages are small), not the
//! configured `max_frame` (64 MiB by default): the framing reserves room for a frame as soon
//! as it reads its 4-byte length, so an unauthenticated peer that claims a large frame would
//! otherwise make this side reserve that much memory per connection. A peer that claims a
//! frame over the handshake's limit is not one of ours ([`Error::NotAPeer`]: an HTTP request,
//! whose `GET ` reads as a length of about 1.2 GB, is reported so) and is dropped before
//! anything is reserved. The coordinator raises the limit to `max_frame` once the worker's
//! proof checks (step 4), the worker once the coordinator's does (step 3).
//!
//! # Why it is correct
//!
//! - *Versions.* The magic and version are fixed bytes ahead of any postcard, so each side
//!   reads them whatever the other side's version; a mismatch is named, not a decode error.
//! - *The token never crosses the wire*: only MACs do, over nonces, and a MAC does not reveal
//!   its key.
//! - *No replay.* Each side's MAC covers the other side's fresh nonce, so a recorded proof is
//!   useless in a later handshake.
//! - *No reflection.* The two MACs carry different labels and nonce orders, so a coordinator
//!   (which only ever computes "coordinator" MACs) cannot be made to compute a worker's proof.
//! - *Nothing before the proof.* Job names and job values go only to a peer whose proof was
//!   checked; an unauthenticated peer learns only the protocol version.
//! - *Job versions and layouts.* A job's serialized form is fixed by its types, which the two
//!   sides compile separately; the version and the layout fingerprint each announces are how
//!   they find out that the types differ before any job value, state or output crosses. A
//!   changed type whose version was not bumped is found by its layout (a field added,
//!   removed, renamed, reordered or retyped); only a change the layout does not see (a custom
//!   `Serialize`, see [`Layout`](crate::Layout)) is found when its bytes do not decode:
//!   [`Error::Undecodable`].
//!
//! This authenticates; it does not encrypt. On a network where an attacker can sit in the
//! middle of connections, run the cluster inside a VPN or SSH tunnel.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use futures::{SinkExt, StreamExt};
use hmac::{KeyInit, Mac};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::codec::Framed;

use super::Error;
use super::error::AuthFailure;
use super::frame::{MAGIC, PROTOCOL_VERSION, decode, encode};
use crate::layout::{Fingerprint, Layout};

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// The environment variable the token is read from by default.
pub const TOKEN_ENV: &str = "MALLEABLE_TOKEN";

/// A nonce.
pub type Nonce = [u8; 32];
/// A MAC.
pub type Proof = [u8; 32];

/// The frame limit of a connection until the other side is authenticated: 8 KiB, room for a
/// hello naming a hundred jobs. See "Frame limits" above.
pub const HANDSHAKE_MAX_FRAME: usize = 8 << 10;

/// The longest node name a hello may carry, in bytes (a host name is at most 64 on Linux, a
/// fully qualified one at most 253).
pub const NODE_MAX: usize = 255;

/// The secret shared by a coordinator and its workers. Never printed, never sent.
#[derive(Clone)]
pub struct Token(Arc<[u8]>);

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl Token {
    /// A token from bytes.
    ///
    /// # Errors
    ///
    /// [`Error::Token`] for an empty token.
    pub fn new(secret: impl Into<Vec<u8>>) -> Result<Token, Error> {
        let secret = secret.into();
        if secret.is_empty() {
            return Err(Error::Token("the token is empty".into()));
        }
        Ok(Token(secret.into()))
    }

    /// The token in the environment variable [`TOKEN_ENV`], if it is set.
    ///
    /// # Errors
    ///
    /// [`Error::Token`] if it is set but empty.
    pub fn from_env() -> Result<Option<Token>, Error> {
        match std::env::var_os(TOKEN_ENV) {
            None => Ok(None),
            Some(v) => Token::new(v.into_encoded_bytes()).map(Some),
        }
    }

    /// The token in a file (trailing whitespace is ignored).
    ///
    /// # Errors
    ///
    /// [`Error::Token`] if the file cannot be read or holds no token.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Token, Error> {
        let path = path.as_ref();
        let mut bytes =
            std::fs::read(path).map_err(|e| Error::Token(format!("{}: {e}", path.display())))?;
        while bytes.last().is_some_and(u8::is_ascii_whitespace) {
            bytes.pop();
        }
        Token::new(bytes)
    }

    /// The secret, for the environment of a launched worker.
    pub(crate) fn secret(&self) -> &[u8] {
        &self.0
    }

    fn mac(&self, label: &[u8], a: &Nonce, b: &Nonce) -> HmacSha256 {
        let mut mac = <HmacSha256 as KeyInit>::new_from_slice(&self.0)
            .expect("HMAC takes keys of any length");
        mac.update(label);
        mac.update(a);
        mac.update(b);
        mac
    }

    /// `H(label, a, b)`.
    pub(super) fn prove(&self, label: &[u8], a: &Nonce, b: &Nonce) -> Proof {
        self.mac(label, a, b).finalize().into_bytes().into()
    }

    /// Constant-time check of a MAC.
    pub(super) fn check(&self, label: &[u8], a: &Nonce, b: &Nonce, proof: &Proof) -> bool {
        self.mac(label, a, b).verify_slice(proof).is_ok()
    }
}

/// The key used when no token is configured (loopback only): the handshake still runs, but
/// proves nothing.
pub(super) fn no_token() -> Token {
    Token(Arc::from(&b"malleable: no token (loopback only)"[..]))
}

/// The label of the coordinator's MACs.
pub(super) const COORDINATOR: &[u8] = b"malleable coordinator v1";
/// The label of the worker's MACs.
pub(super) const WORKER: &[u8] = b"malleable worker v1";

/// A job type a worker process can run: its name, version and layout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobType {
    /// Its [`Job::NAME`](crate::Job::NAME).
    pub name: String,
    /// Its [`Job::VERSION`](crate::Job::VERSION).
    pub version: u32,
    /// The fingerprint of its types' serialized [`Layout`], `None` if they cannot be traced
    /// (protocol 16).
    pub layout: Option<Fingerprint>,
}

impl JobType {
    /// A job type of name `name` and version `version` whose types have layout `layout`.
    pub fn new(name: impl Into<String>, version: u32, layout: &Layout) -> JobType {
        JobType {
            name: name.into(),
            version,
            layout: layout.is_traced().then(|| layout.fingerprint()),
        }
    }
}

/// Step 1.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    /// The jobs the worker registered.
    pub jobs: Vec<JobType>,
    /// The worker's threads.
    pub threads: u32,
    /// The node (host) the worker runs on, as it names itself (at most [`NODE_MAX`] bytes):
    /// processes of one node share its memory and its fate.
    pub node: String,
    /// The worker's nonce.
    pub nonce: Nonce,
}

/// Step 2 and the refusals.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Reply {
    /// Step 2: the coordinator's nonce and proof.
    Challenge {
        /// The coordinator's nonce.
        nonce: Nonce,
        /// `H("coordinator", nw, nc)`.
        proof: Proof,
    },
    /// Step 4: the job the worker serves.
    Welcome {
        /// Its name.
        job: String,
        /// Its version (the coordinator's, which is the worker's).
        version: u32,
        /// How often each side sends a heartbeat, in milliseconds.
        heartbeat_ms: u64,
        /// How long each side waits for a frame before it gives the other up, in milliseconds.
        lease_ms: u64,
    },
    /// The worker is refused.
    Refused(Refusal),
}

/// Why a coordinator refuses a worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Refusal {
    /// The proof was wrong.
    Auth,
    /// No running job is among the worker's.
    UnknownJob {
        /// The jobs that accept workers now.
        running: Vec<String>,
    },
    /// The protocol versions differ (the version is in the frame's fixed bytes).
    Version,
    /// The worker has the running job `job` only in another version.
    JobVersion {
        /// The job's name.
        job: String,
        /// The coordinator's version of it.
        version: u32,
    },
    /// No job accepts workers, and job `job`, which the worker has, ran here and has ended
    /// (protocol 14).
    JobEnded {
        /// The job's name.
        job: String,
    },
    /// The worker has the running job `job` in the same version, but its types have another
    /// serialized layout (protocol 16). The worker answers with [`WorkerLayout`].
    Layout {
        /// The job's name.
        job: String,
        /// Its version (both sides').
        version: u32,
        /// The entries of the coordinator's layout of the job's types
        /// ([`Layout::entries`]).
        entries: Vec<String>,
    },
}

/// Step 5: the worker's layout of a job the coordinator refused for its layout
/// ([`Refusal::Layout`]), so that the coordinator names the first entry that differs too.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerLayout {
    /// The entries of the worker's layout of the job's types ([`Layout::entries`]).
    pub entries: Vec<String>,
}

/// Decodes step 5.
///
/// # Errors
///
/// [`Error::Malformed`].
pub fn decode_worker_layout(peer: &str, frame: &[u8]) -> Result<WorkerLayout, Error> {
    decode(peer, "a worker's layout", frame)
}

/// The first entry where the coordinator's layout and the worker's differ, in the words of
/// [`Error::JobLayout`].
fn layout_difference(coordinator: &Layout, worker: &Layout) -> String {
    coordinator
        .first_difference_between(worker, "the coordinator", "the worker process")
        .unwrap_or_else(|| "the two layouts have the same entries".to_owned())
}

/// Step 3.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProofMsg {
    /// `H("worker", nc, nw)`.
    pub proof: Proof,
}

/// Prefixes a first frame with the magic and version.
pub(super) fn versioned<T: Serialize>(body: &T) -> bytes::Bytes {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&PROTOCOL_VERSION.to_be_bytes());
    out.extend_from_slice(&encode(body));
    out.into()
}

/// Checks a first frame's magic and version and returns its body.
pub(super) fn unversioned<'a>(peer: &str, frame: &'a [u8]) -> Result<&'a [u8], Error> {
    let not_a_peer = || Error::NotAPeer {
        peer: peer.to_owned(),
    };
    let (magic, rest) = frame.split_at_checked(MAGIC.len()).ok_or_else(not_a_peer)?;
    if magic != MAGIC {
        return Err(not_a_peer());
    }
    let (version, body) = rest.split_at_checked(4).ok_or_else(not_a_peer)?;
    let theirs = u32::from_be_bytes(version.try_into().expect("4 bytes"));
    if theirs != PROTOCOL_VERSION {
        return Err(Error::Version {
            peer: peer.to_owned(),
            ours: PROTOCOL_VERSION,
            theirs,
        });
    }
    Ok(body)
}

/// Decodes step 1 (the coordinator reads it from an unknown peer).
///
/// # Errors
///
/// [`Error::NotAPeer`], [`Error::Version`] or [`Error::Malformed`].
pub fn decode_hello(peer: &str, frame: &[u8]) -> Result<Hello, Error> {
    let hello: Hello = decode(peer, "a hello", unversioned(peer, frame)?)?;
    if hello.node.len() > NODE_MAX {
        return Err(Error::Malformed {
            peer: peer.to_owned(),
            what: "a hello",
            reason: format!(
                "a node name of {} bytes (at most {NODE_MAX})",
                hello.node.len()
            ),
            source: None,
        });
    }
    Ok(hello)
}

/// Decodes step 2 or a refusal (the worker reads it).
///
/// # Errors
///
/// [`Error::NotAPeer`], [`Error::Version`] or [`Error::Malformed`].
pub fn decode_reply(peer: &str, frame: &[u8]) -> Result<Reply, Error> {
    decode(peer, "a handshake reply", unversioned(peer, frame)?)
}

/// Decodes step 3.
///
/// # Errors
///
/// [`Error::Malformed`].
pub fn decode_proof(peer: &str, frame: &[u8]) -> Result<ProofMsg, Error> {
    decode(peer, "a proof", frame)
}

/// Decodes step 4 (or a refusal).
///
/// # Errors
///
/// [`Error::Malformed`].
pub fn decode_welcome(peer: &str, frame: &[u8]) -> Result<Reply, Error> {
    decode(peer, "a welcome", frame)
}

/// A fresh nonce from the operating system's generator.
pub(super) fn nonce() -> Result<Nonce, Error> {
    let mut n = [0; 32];
    getrandom::fill(&mut n).map_err(|e| Error::Token(format!("no random nonce: {e}")))?;
    Ok(n)
}

/// The next frame from a peer whose proof checked (its frames may be up to `limit`), or the
/// error that ended the connection.
pub(super) async fn next_authenticated<S: AsyncRead + AsyncWrite + Unpin>(
    framed: &mut Framed<S, crate::wire::frame::Codec>,
    peer: &str,
    limit: usize,
) -> Result<bytes::BytesMut, Error> {
    match framed.next().await {
        Some(Ok(frame)) => Ok(frame),
        Some(Err(e)) => Err(Error::io(peer, e, limit)),
        None => Err(Error::Closed {
            peer: peer.to_owned(),
        }),
    }
}

/// The next frame of the handshake, from a peer not yet authenticated, or the error that
/// ended the connection: a frame over [`HANDSHAKE_MAX_FRAME`] means [`Error::NotAPeer`].
pub(super) async fn next_frame<S: AsyncRead + AsyncWrite + Unpin>(
    framed: &mut Framed<S, crate::wire::frame::Codec>,
    peer: &str,
) -> Result<bytes::BytesMut, Error> {
    match framed.next().await {
        Some(Ok(frame)) => Ok(frame),
        Some(Err(e)) => match Error::io(peer, e, HANDSHAKE_MAX_FRAME) {
            Error::FrameTooLarge { .. } => {
                tracing::debug!(
                    peer,
                    limit = HANDSHAKE_MAX_FRAME,
                    "an unauthenticated peer claimed a frame over the handshake's limit"
                );
                Err(Error::NotAPeer {
                    peer: peer.to_owned(),
                })
            }
            other => Err(other),
        },
        None => Err(Error::Closed {
            peer: peer.to_owned(),
        }),
    }
}

/// Sets the connection's frame limit (both ways: the codec checks what it writes too).
pub(super) fn set_limit<S>(framed: &mut Framed<S, crate::wire::frame::Codec>, limit: usize) {
    framed.codec_mut().set_max_frame_length(limit);
}

/// Sends one frame of the handshake.
pub(crate) async fn send<S: AsyncRead + AsyncWrite + Unpin>(
    framed: &mut Framed<S, crate::wire::frame::Codec>,
    peer: &str,
    frame: bytes::Bytes,
) -> Result<(), Error> {
    framed.send(frame).await.map_err(|source| Error::Io {
        peer: peer.to_owned(),
        source,
    })
}

/// What the coordinator learned from an accepted worker.
#[derive(Debug)]
pub(crate) struct Accepted<T> {
    pub(crate) threads: u32,
    pub(crate) node: String,
    pub(crate) job: T,
}

/// Why a coordinator has no job for a worker.
#[derive(Debug)]
pub(crate) enum NoJob {
    /// None of the running jobs (named) is among the worker's.
    Unknown(Vec<String>),
    /// The worker has running job `job` (at the coordinator's `version`) in another version.
    Version { job: String, version: u32 },
    /// No running job is among the worker's, and job `job`, which it has, has ended here.
    Ended { job: String },
    /// The worker has running job `job` in its version, but with types of another layout than
    /// the coordinator's `layout`.
    Layout {
        job: String,
        version: u32,
        layout: Layout,
    },
}

/// What a worker says of itself in its hello, besides its jobs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Me<'a> {
    /// Its compute threads.
    pub(crate) threads: u32,
    /// The node it runs on (at most [`NODE_MAX`] bytes).
    pub(crate) node: &'a str,
}

/// The timing a coordinator announces in its welcome.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    pub(crate) heartbeat_ms: u64,
    pub(crate) lease_ms: u64,
}

/// The coordinator's side of steps 1–4. `choose` picks a job among the worker's (its name,
/// its version and what it is), or says why there is none. The connection's frame limit is
/// [`HANDSHAKE_MAX_FRAME`] until the worker's proof checks, then `limit`.
pub(crate) async fn coordinator<S, T>(
    framed: &mut Framed<S, crate::wire::frame::Codec>,
    peer: &str,
    token: Option<&Token>,
    limit: usize,
    timing: Timing,
    choose: impl FnOnce(&[JobType]) -> Result<(String, u32, T), NoJob>,
) -> Result<Accepted<T>, Error>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let has_token = token.is_some();
    let token = token.cloned().unwrap_or_else(no_token);
    set_limit(framed, HANDSHAKE_MAX_FRAME);
    let first = next_frame(framed, peer).await?;
    let hello = match decode_hello(peer, &first) {
        Ok(h) => h,
        Err(e @ Error::Version { .. }) => {
            let _ = send(framed, peer, versioned(&Reply::Refused(Refusal::Version))).await;
            return Err(e);
        }
        Err(e) => return Err(e),
    };
    let nc = nonce()?;
    let proof = token.prove(COORDINATOR, &hello.nonce, &nc);
    send(
        framed,
        peer,
        versioned(&Reply::Challenge { nonce: nc, proof }),
    )
    .await?;
    let theirs = decode_proof(peer, &next_frame(framed, peer).await?)?;
    if !token.check(WORKER, &nc, &hello.nonce, &theirs.proof) {
        let _ = send(framed, peer, encode(&Reply::Refused(Refusal::Auth))).await;
        return Err(Error::Auth {
            peer: peer.to_owned(),
            failure: AuthFailure::WorkerProof { token: has_token },
        });
    }
    // The worker is authenticated: its frames may be as long as the configuration allows.
    set_limit(framed, limit);
    match choose(&hello.jobs) {
        Ok((name, version, job)) => {
            let welcome = Reply::Welcome {
                job: name,
                version,
                heartbeat_ms: timing.heartbeat_ms,
                lease_ms: timing.lease_ms,
            };
            send(framed, peer, encode(&welcome)).await?;
            Ok(Accepted {
                threads: hello.threads,
                node: hello.node,
                job,
            })
        }
        Err(NoJob::Unknown(running)) => {
            let refusal = Reply::Refused(Refusal::UnknownJob {
                running: running.clone(),
            });
            let _ = send(framed, peer, encode(&refusal)).await;
            Err(Error::UnknownJob {
                peer: peer.to_owned(),
                known: hello.jobs.into_iter().map(|j| j.name).collect(),
                running,
            })
        }
        Err(NoJob::Ended { job }) => {
            let refusal = Reply::Refused(Refusal::JobEnded { job: job.clone() });
            let _ = send(framed, peer, encode(&refusal)).await;
            Err(Error::JobEnded {
                peer: peer.to_owned(),
                job,
            })
        }
        Err(NoJob::Layout {
            job,
            version,
            layout,
        }) => {
            let theirs = hello
                .jobs
                .iter()
                .find(|j| j.name == job)
                .and_then(|j| j.layout);
            let refusal = Reply::Refused(Refusal::Layout {
                job: job.clone(),
                version,
                entries: layout.entries().to_vec(),
            });
            let _ = send(framed, peer, encode(&refusal)).await;
            // Step 5: the worker's entries, to name the first that differs. A worker that
            // does not send them is still refused for its layout.
            let difference = match framed.next().await {
                Some(Ok(frame)) => match decode_worker_layout(peer, &frame) {
                    Ok(w) => layout_difference(&layout, &Layout::from_entries(w.entries)),
                    Err(e) => format!("(its layout did not decode: {e})"),
                },
                Some(Err(e)) => {
                    format!("(its layout did not arrive: {})", Error::io(peer, e, limit))
                }
                None => "(it closed the connection before it sent its layout)".to_owned(),
            };
            Err(Error::JobLayout {
                peer: peer.to_owned(),
                job,
                version,
                coordinator: layout.fingerprint(),
                worker: theirs.unwrap_or(Fingerprint(0)),
                difference,
            })
        }
        Err(NoJob::Version { job, version }) => {
            let worker = hello
                .jobs
                .iter()
                .find(|j| j.name == job)
                .map_or(0, |j| j.version);
            let refusal = Reply::Refused(Refusal::JobVersion {
                job: job.clone(),
                version,
            });
            let _ = send(framed, peer, encode(&refusal)).await;
            Err(Error::JobVersion {
                peer: peer.to_owned(),
                job,
                coordinator: version,
                worker,
            })
        }
    }
}

/// What a worker learned from the coordinator's welcome.
#[derive(Debug)]
pub(crate) struct Welcomed {
    pub(crate) job: String,
    pub(crate) heartbeat_ms: u64,
    pub(crate) lease_ms: u64,
}

/// The worker's side of steps 1–5, for a worker that registered `jobs`, whose layouts
/// `layout_of` gives by name (for step 5). The connection's frame limit is
/// [`HANDSHAKE_MAX_FRAME`] until the coordinator's proof checks, then `limit`.
///
/// # Errors
///
/// Those of the protocol's steps, and [`Error::HandshakeTooLarge`] if the hello (with the
/// job names in `jobs`) is over [`HANDSHAKE_MAX_FRAME`], which a coordinator would take for
/// a stranger's.
pub(crate) async fn worker<S>(
    framed: &mut Framed<S, crate::wire::frame::Codec>,
    peer: &str,
    token: Option<&Token>,
    limit: usize,
    jobs: Vec<JobType>,
    layout_of: impl Fn(&str) -> Layout,
    Me { threads, node }: Me<'_>,
) -> Result<Welcomed, Error>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let has_token = token.is_some();
    let token = token.cloned().unwrap_or_else(no_token);
    set_limit(framed, HANDSHAKE_MAX_FRAME);
    let nw = nonce()?;
    let known = jobs.clone();
    if node.len() > NODE_MAX {
        return Err(Error::HandshakeTooLarge {
            what: "hello (the node's name)",
            len: node.len(),
            limit: NODE_MAX,
        });
    }
    let hello = versioned(&Hello {
        jobs,
        threads,
        node: node.to_owned(),
        nonce: nw,
    });
    if hello.len() > HANDSHAKE_MAX_FRAME {
        return Err(Error::HandshakeTooLarge {
            what: "hello (the registered job names)",
            len: hello.len(),
            limit: HANDSHAKE_MAX_FRAME,
        });
    }
    send(framed, peer, hello).await?;
    let refused = |r: Refusal, known: Vec<JobType>| match r {
        Refusal::Auth => Error::Auth {
            peer: peer.to_owned(),
            failure: AuthFailure::RefusedByCoordinator,
        },
        Refusal::UnknownJob { running } => Error::UnknownJob {
            peer: peer.to_owned(),
            known: known.into_iter().map(|j| j.name).collect(),
            running,
        },
        Refusal::JobVersion { job, version } => Error::JobVersion {
            peer: peer.to_owned(),
            worker: known
                .iter()
                .find(|j| j.name == job)
                .map_or(0, |j| j.version),
            job,
            coordinator: version,
        },
        Refusal::JobEnded { job } => Error::JobEnded {
            peer: peer.to_owned(),
            job,
        },
        Refusal::Layout { .. } => Error::Rejected {
            peer: peer.to_owned(),
            what: "a handshake reply",
            reason: "a refusal for the job's layout before the proof".into(),
            source: None,
        },
        Refusal::Version => Error::Refused {
            peer: peer.to_owned(),
            reason: "protocol version mismatch".into(),
        },
    };
    let (nc, proof) = match decode_reply(peer, &next_frame(framed, peer).await?)? {
        Reply::Challenge { nonce, proof } => (nonce, proof),
        Reply::Refused(r) => return Err(refused(r, known)),
        Reply::Welcome { .. } => {
            return Err(Error::Rejected {
                peer: peer.to_owned(),
                what: "a handshake reply",
                reason: "a welcome before the proof".into(),
                source: None,
            });
        }
    };
    if !token.check(COORDINATOR, &nw, &nc, &proof) {
        // An empty proof, which the coordinator refuses: both sides then report the failure
        // as `Auth` (instead of a connection that closed in the middle of the handshake).
        let _ = send(framed, peer, encode(&ProofMsg { proof: [0; 32] })).await;
        return Err(Error::Auth {
            peer: peer.to_owned(),
            failure: AuthFailure::CoordinatorProof { token: has_token },
        });
    }
    // The coordinator is authenticated: its frames may be as long as the configuration
    // allows (its refusal of an unknown job lists every running job's name).
    set_limit(framed, limit);
    let proof = token.prove(WORKER, &nc, &nw);
    send(framed, peer, encode(&ProofMsg { proof })).await?;
    let welcome = next_authenticated(framed, peer, limit).await?;
    match decode_welcome(peer, &welcome)? {
        Reply::Welcome {
            job,
            version,
            heartbeat_ms,
            lease_ms,
        } => match known.iter().find(|j| j.name == job) {
            None => Err(Error::Rejected {
                peer: peer.to_owned(),
                what: "a welcome",
                reason: format!("job {job:?} is not one of this worker's"),
                source: None,
            }),
            Some(mine) if mine.version != version => Err(Error::JobVersion {
                peer: peer.to_owned(),
                job,
                coordinator: version,
                worker: mine.version,
            }),
            Some(_) => Ok(Welcomed {
                job,
                heartbeat_ms,
                lease_ms,
            }),
        },
        Reply::Refused(Refusal::Layout {
            job,
            version,
            entries,
        }) => {
            // Step 5: this side's entries, so that the coordinator names the difference too.
            let mine = layout_of(&job);
            let _ = send(
                framed,
                peer,
                encode(&WorkerLayout {
                    entries: mine.entries().to_vec(),
                }),
            )
            .await;
            let theirs = Layout::from_entries(entries);
            Err(Error::JobLayout {
                peer: peer.to_owned(),
                difference: layout_difference(&theirs, &mine),
                job,
                version,
                coordinator: theirs.fingerprint(),
                worker: mine.fingerprint(),
            })
        }
        Reply::Refused(r) => Err(refused(r, known)),
        Reply::Challenge { .. } => Err(Error::Rejected {
            peer: peer.to_owned(),
            what: "a welcome",
            reason: "a second challenge".into(),
            source: None,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(name: &str, version: u32) -> JobType {
        JobType {
            name: name.to_owned(),
            version,
            layout: None,
        }
    }

    /// No layout: not checked.
    fn untraced(_: &str) -> Layout {
        Layout::untraceable()
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// After the handshake both sides take frames up to the configured limit; during it,
    /// only up to the handshake's.
    #[test]
    fn the_frame_limit_is_raised_once_the_other_side_is_authenticated() {
        runtime().block_on(async {
            let (a, b) = tokio::io::duplex(1 << 16);
            let limit = 1 << 20;
            let mut coordinator = Framed::new(a, super::super::frame::codec(limit));
            let mut worker = Framed::new(b, super::super::frame::codec(limit));
            let timing = Timing {
                heartbeat_ms: 1,
                lease_ms: 2,
            };
            let (c, w) = tokio::join!(
                super::coordinator(&mut coordinator, "w", None, limit, timing, |jobs| {
                    Ok((jobs[0].name.clone(), jobs[0].version, ()))
                }),
                super::worker(
                    &mut worker,
                    "c",
                    None,
                    limit,
                    vec![job("job", 1)],
                    untraced,
                    Me {
                        threads: 1,
                        node: "node a"
                    }
                ),
            );
            // The coordinator learns the node the worker named.
            assert_eq!(c.unwrap().node, "node a");
            assert_eq!(w.unwrap().job, "job");
            assert_eq!(coordinator.codec().max_frame_length(), limit);
            assert_eq!(worker.codec().max_frame_length(), limit);
        });
    }

    /// Runs both sides of a handshake over a pipe: the coordinator with `coordinator_token`
    /// running `running` (name, version), the worker with `worker_token` knowing `known`.
    fn shake(
        coordinator_token: Option<&str>,
        running: &[(&str, u32)],
        worker_token: Option<&str>,
        known: Vec<JobType>,
    ) -> (Result<String, Error>, Result<Welcomed, Error>) {
        let running: Vec<(String, u32)> =
            running.iter().map(|(n, v)| ((*n).to_owned(), *v)).collect();
        let ct = coordinator_token.map(|t| Token::new(t).unwrap());
        let wt = worker_token.map(|t| Token::new(t).unwrap());
        runtime().block_on(async {
            let (a, b) = tokio::io::duplex(1 << 16);
            let limit = 1 << 20;
            let mut coordinator = Framed::new(a, super::super::frame::codec(limit));
            let mut worker = Framed::new(b, super::super::frame::codec(limit));
            let timing = Timing {
                heartbeat_ms: 1,
                lease_ms: 2,
            };
            let choose = |offered: &[JobType]| {
                let same = running
                    .iter()
                    .find(|(n, v)| offered.iter().any(|o| &o.name == n && o.version == *v));
                if let Some((n, v)) = same {
                    return Ok((n.clone(), *v, n.clone()));
                }
                match running
                    .iter()
                    .find(|(n, _)| offered.iter().any(|o| &o.name == n))
                {
                    Some((n, v)) => Err(NoJob::Version {
                        job: n.clone(),
                        version: *v,
                    }),
                    None => Err(NoJob::Unknown(
                        running.iter().map(|(n, _)| n.clone()).collect(),
                    )),
                }
            };
            let (c, w) = tokio::join!(
                super::coordinator(
                    &mut coordinator,
                    "worker:1",
                    ct.as_ref(),
                    limit,
                    timing,
                    choose
                ),
                super::worker(
                    &mut worker,
                    "coordinator:2",
                    wt.as_ref(),
                    limit,
                    known,
                    untraced,
                    Me {
                        threads: 1,
                        node: "node a"
                    }
                ),
            );
            (c.map(|a| a.job), w)
        })
    }

    /// A worker with a job of the coordinator's name but another version is refused, and
    /// both sides say so with both versions; one with the same version is welcomed.
    #[test]
    fn a_job_in_another_version_is_refused_on_both_sides() {
        let (c, w) = shake(None, &[("walk", 2)], None, vec![job("walk", 1)]);
        for (side, e) in [("coordinator", c.unwrap_err()), ("worker", w.unwrap_err())] {
            match &e {
                Error::JobVersion {
                    job,
                    coordinator: 2,
                    worker: 1,
                    ..
                } if job == "walk" => {}
                other => panic!("{side}: {other:?}"),
            }
            assert_eq!(e.kind(), "job_version");
            let text = e.to_string();
            for part in [
                "job \"walk\"",
                "the coordinator has version 2",
                "the worker process version 1",
                "Job::VERSION",
            ] {
                assert!(text.contains(part), "{side}: {text:?} lacks {part:?}");
            }
        }
        // Another job of the same process matches in its version: that one is chosen.
        let (c, w) = shake(
            None,
            &[("walk", 2), ("kmeans", 1)],
            None,
            vec![job("walk", 1), job("kmeans", 1)],
        );
        assert_eq!(c.unwrap(), "kmeans");
        assert_eq!(w.unwrap().job, "kmeans");
        let (c, w) = shake(None, &[("walk", 2)], None, vec![job("walk", 2)]);
        assert_eq!(c.unwrap(), "walk");
        assert_eq!(w.unwrap().job, "walk");
    }

    /// A worker with the coordinator's job in its version but types of another layout is
    /// refused, and both sides name the job, both fingerprints and the first entry that
    /// differs (each side names the coordinator's and the worker's in the same order).
    #[test]
    fn a_job_with_another_layout_is_refused_on_both_sides() {
        let entries = |e: &[&str]| Layout::from_entries(e.iter().map(|e| e.to_string()).collect());
        let ours = entries(&["job: Walk", "Walk.scale: f64", "Walk.offset: f64"]);
        let theirs = entries(&["job: Walk", "Walk.offset: f64", "Walk.scale: f64"]);
        let offered = JobType::new("walk", 2, &theirs);
        assert_eq!(offered.layout, Some(theirs.fingerprint()));
        let (c, w) = runtime().block_on(async {
            let (a, b) = tokio::io::duplex(1 << 16);
            let mut coordinator = Framed::new(a, super::super::frame::codec(1 << 20));
            let mut worker = Framed::new(b, super::super::frame::codec(1 << 20));
            let timing = Timing {
                heartbeat_ms: 1,
                lease_ms: 2,
            };
            let layout = ours.clone();
            let choose = |_: &[JobType]| -> Result<(String, u32, ()), NoJob> {
                Err(NoJob::Layout {
                    job: "walk".to_owned(),
                    version: 2,
                    layout,
                })
            };
            let mine = theirs.clone();
            tokio::join!(
                super::coordinator(&mut coordinator, "worker:1", None, 1 << 20, timing, choose),
                super::worker(
                    &mut worker,
                    "coordinator:2",
                    None,
                    1 << 20,
                    vec![offered],
                    move |_| mine.clone(),
                    Me {
                        threads: 1,
                        node: "node a"
                    }
                ),
            )
        });
        for (side, e) in [("coordinator", c.unwrap_err()), ("worker", w.unwrap_err())] {
            match &e {
                Error::JobLayout {
                    job,
                    version: 2,
                    coordinator,
                    worker,
                    difference,
                    ..
                } if job == "walk" => {
                    assert_eq!(*coordinator, ours.fingerprint(), "{side}");
                    assert_eq!(*worker, theirs.fingerprint(), "{side}");
                    assert_eq!(
                        difference,
                        "the coordinator has `Walk.scale: f64` where the worker process has \
                         `Walk.offset: f64`",
                        "{side}"
                    );
                }
                other => panic!("{side}: {other:?}"),
            }
            assert_eq!(e.kind(), "job_layout");
            let text = e.to_string();
            for part in [
                "job \"walk\"",
                &ours.fingerprint().to_string(),
                &theirs.fingerprint().to_string(),
                "Walk.scale",
                "Job::VERSION",
            ] {
                assert!(text.contains(part), "{side}: {text:?} lacks {part:?}");
            }
        }
    }

    /// A wrong token: the worker learns that the coordinator does not hold its token (not
    /// that "the coordinator did not prove" something), the coordinator that the worker did
    /// not prove its token; both name MALLEABLE_TOKEN and the options that set a token.
    #[test]
    fn a_wrong_token_is_worded_for_each_side() {
        let known = || vec![job("walk", 1)];
        let (c, w) = shake(Some("right"), &[("walk", 1)], Some("wrong"), known());
        let (c, w) = (c.unwrap_err(), w.unwrap_err());
        assert!(
            matches!(
                w,
                Error::Auth {
                    failure: AuthFailure::CoordinatorProof { token: true },
                    ..
                }
            ),
            "{w:?}"
        );
        assert_eq!(
            w.to_string(),
            "the coordinator at coordinator:2 does not hold this worker process's shared \
             token: give both the same token: MALLEABLE_TOKEN in the environment of each (read \
             by Token::from_env and WorkerOptions::from_env), or Builder::cluster_token and \
             WorkerOptions::token"
        );
        assert!(
            matches!(
                c,
                Error::Auth {
                    failure: AuthFailure::WorkerProof { token: true },
                    ..
                }
            ),
            "{c:?}"
        );
        assert_eq!(
            c.to_string(),
            "the worker process at worker:1 did not prove that it holds this coordinator's \
             shared token (it has another one, or none): give both the same token: \
             MALLEABLE_TOKEN in the environment of each (read by Token::from_env and \
             WorkerOptions::from_env), or Builder::cluster_token and WorkerOptions::token"
        );
        // No token on the worker's side.
        let (c, w) = shake(Some("right"), &[("walk", 1)], None, known());
        let w = w.unwrap_err();
        assert_eq!(
            w.to_string(),
            "the coordinator at coordinator:2 requires a shared token and this worker process \
             has none: set MALLEABLE_TOKEN in its environment (read by WorkerOptions::from_env) \
             or give it with WorkerOptions::token"
        );
        assert!(matches!(c.unwrap_err(), Error::Auth { .. }));
        // No token on the coordinator's side (loopback), one on the worker's.
        let (c, w) = shake(None, &[("walk", 1)], Some("mine"), known());
        let w = w.unwrap_err();
        assert!(matches!(w, Error::Auth { .. }));
        let c = c.unwrap_err();
        assert_eq!(
            c.to_string(),
            "the worker process at worker:1 has a shared token and this coordinator none: give \
             the coordinator the same token (MALLEABLE_TOKEN in its environment, or \
             Builder::cluster_token), or start the worker without one"
        );
        for e in [&c, &w] {
            assert!(!e.to_string().contains("did not prove the shared token"));
        }
    }

    /// A coordinator that runs no job yet says so, and how to wait for it.
    #[test]
    fn no_job_yet_is_worded_for_each_side() {
        let (c, w) = shake(None, &[], None, vec![job("walk", 1)]);
        for e in [c.unwrap_err(), w.unwrap_err()] {
            assert!(matches!(&e, Error::UnknownJob { running, .. } if running.is_empty()));
            let text = e.to_string();
            assert!(text.contains("runs no job yet"), "{text}");
            assert!(text.contains("WorkerOptions::wait_for_job"), "{text}");
            assert!(text.contains("MALLEABLE_WAIT_FOR_JOB"), "{text}");
        }
    }

    /// A welcome before the proof decodes but breaks the protocol: `Rejected`, not
    /// `Malformed`.
    #[test]
    fn a_welcome_before_the_proof_is_rejected() {
        runtime().block_on(async {
            let (a, b) = tokio::io::duplex(1 << 16);
            let mut coordinator = Framed::new(a, super::super::frame::codec(1 << 20));
            let mut worker = Framed::new(b, super::super::frame::codec(1 << 20));
            let early = Reply::Welcome {
                job: "walk".into(),
                version: 1,
                heartbeat_ms: 1,
                lease_ms: 2,
            };
            let hostile = async {
                let _hello = coordinator.next().await;
                send(&mut coordinator, "w", versioned(&early))
                    .await
                    .unwrap();
            };
            let (_, w) = tokio::join!(
                hostile,
                super::worker(
                    &mut worker,
                    "c",
                    None,
                    1 << 20,
                    vec![job("walk", 1)],
                    untraced,
                    Me {
                        threads: 1,
                        node: "node a"
                    }
                ),
            );
            let e = w.unwrap_err();
            assert_eq!(e.kind(), "rejected", "{e:?}");
            assert_eq!(
                e.to_string(),
                "c sent a handshake reply that is refused here: a welcome before the proof"
            );
        });
    }

    /// A worker whose hello would be over the handshake's limit says so before it sends
    /// anything (a coordinator would drop it as a stranger).
    #[test]
    fn a_hello_over_the_handshake_limit_is_an_error_of_its_own() {
        runtime().block_on(async {
            let (a, _b) = tokio::io::duplex(1 << 16);
            let mut worker = Framed::new(a, super::super::frame::codec(1 << 20));
            let jobs = (0..200).map(|i| job(&format!("job-{i:0>60}"), 1)).collect();
            let err = super::worker(&mut worker, "c", None, 1 << 20, jobs, untraced, Me { threads: 1, node: "n" })
                .await
                .unwrap_err();
            assert!(
                matches!(err, Error::HandshakeTooLarge { len, limit: HANDSHAKE_MAX_FRAME, .. } if len > HANDSHAKE_MAX_FRAME),
                "{err:?}"
            );
        });
    }

    /// A node name longer than [`NODE_MAX`] is refused by the worker before it sends
    /// anything, and a hello that carries one anyway is malformed at the coordinator.
    #[test]
    fn a_node_name_past_its_limit_is_refused_on_both_sides() {
        let long = "n".repeat(NODE_MAX + 1);
        runtime().block_on(async {
            let (a, _b) = tokio::io::duplex(1 << 16);
            let mut worker = Framed::new(a, super::super::frame::codec(1 << 20));
            let jobs = vec![job("walk", 1)];
            let err = super::worker(&mut worker, "c", None, 1 << 20, jobs, untraced, Me { threads: 1, node: &long })
                .await
                .unwrap_err();
            assert!(
                matches!(err, Error::HandshakeTooLarge { len, limit: NODE_MAX, .. } if len == NODE_MAX + 1),
                "{err:?}"
            );
        });
        let hello = versioned(&Hello {
            jobs: vec![job("walk", 1)],
            threads: 1,
            node: long,
            nonce: [0; 32],
        });
        let err = decode_hello("w", &hello).unwrap_err();
        assert!(
            matches!(&err, Error::Malformed { reason, source: None, .. } if reason.contains("node name of 256 bytes")),
            "{err:?}"
        );
        // At the limit, it decodes.
        let hello = versioned(&Hello {
            jobs: Vec::new(),
            threads: 1,
            node: "n".repeat(NODE_MAX),
            nonce: [0; 32],
        });
        assert_eq!(decode_hello("w", &hello).unwrap().node.len(), NODE_MAX);
    }
}
