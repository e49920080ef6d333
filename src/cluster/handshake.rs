//! The handshake: both sides check that they speak the same protocol, prove to each other that
//! they hold the same token, and agree on the job.
//!
//! # The protocol
//!
//! The worker dials the coordinator. `H(label, a, b)` is HMAC-SHA256 keyed with the shared
//! token over `label ‖ a ‖ b`; nonces are 32 bytes from the operating system's generator.
//!
//! 1. *Hello* (worker → coordinator): `MAGIC ‖ version` in fixed bytes, then the job names the
//!    worker has registered, its thread count and a fresh nonce `nw`.
//! 2. *Challenge* (coordinator → worker): `MAGIC ‖ version`, then a fresh nonce `nc` and
//!    `H("coordinator", nw, nc)`. Or, if the magic or version differ, a refusal (a wrong magic
//!    gets no answer at all: the peer is not one of ours).
//! 3. *Proof* (worker → coordinator): the worker checks the coordinator's MAC (else it stops
//!    with [`Error::Auth`]), then sends `H("worker", nc, nw)`.
//! 4. *Welcome* (coordinator → worker): the coordinator checks the worker's MAC (else it
//!    answers with a refusal and both sides report [`Error::Auth`]), then picks a running job
//!    whose name the worker knows (else a refusal: [`Error::UnknownJob`] on both sides) and
//!    names it, with the heartbeat period and lease.
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
use tokio_util::codec::{Framed, LengthDelimitedCodec};

use super::Error;
use super::frame::{MAGIC, PROTOCOL_VERSION, decode, encode};

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

    fn prove(&self, label: &[u8], a: &Nonce, b: &Nonce) -> Proof {
        self.mac(label, a, b).finalize().into_bytes().into()
    }

    /// Constant-time check of a MAC.
    fn check(&self, label: &[u8], a: &Nonce, b: &Nonce, proof: &Proof) -> bool {
        self.mac(label, a, b).verify_slice(proof).is_ok()
    }
}

/// The key used when no token is configured (loopback only): the handshake still runs, but
/// proves nothing.
fn no_token() -> Token {
    Token(Arc::from(&b"malleable: no token (loopback only)"[..]))
}

const COORDINATOR: &[u8] = b"malleable coordinator v1";
const WORKER: &[u8] = b"malleable worker v1";

/// Step 1.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    /// The job names the worker registered.
    pub jobs: Vec<String>,
    /// The worker's threads.
    pub threads: u32,
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
}

/// Step 3.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProofMsg {
    /// `H("worker", nc, nw)`.
    pub proof: Proof,
}

/// Prefixes a first frame with the magic and version.
fn versioned<T: Serialize>(body: &T) -> bytes::Bytes {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&PROTOCOL_VERSION.to_be_bytes());
    out.extend_from_slice(&encode(body));
    out.into()
}

/// Checks a first frame's magic and version and returns its body.
fn unversioned<'a>(peer: &str, frame: &'a [u8]) -> Result<&'a [u8], Error> {
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
    decode(peer, "a hello", unversioned(peer, frame)?)
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

fn nonce() -> Result<Nonce, Error> {
    let mut n = [0; 32];
    getrandom::fill(&mut n).map_err(|e| Error::Token(format!("no random nonce: {e}")))?;
    Ok(n)
}

/// The next frame of the handshake, from a peer not yet authenticated, or the error that
/// ended the connection: a frame over [`HANDSHAKE_MAX_FRAME`] means [`Error::NotAPeer`].
async fn next_frame<S: AsyncRead + AsyncWrite + Unpin>(
    framed: &mut Framed<S, LengthDelimitedCodec>,
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
fn set_limit<S>(framed: &mut Framed<S, LengthDelimitedCodec>, limit: usize) {
    framed.codec_mut().set_max_frame_length(limit);
}

pub(crate) async fn send<S: AsyncRead + AsyncWrite + Unpin>(
    framed: &mut Framed<S, LengthDelimitedCodec>,
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
    pub(crate) job: T,
}

/// The timing a coordinator announces in its welcome.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    pub(crate) heartbeat_ms: u64,
    pub(crate) lease_ms: u64,
}

/// The coordinator's side of steps 1–4. `choose` picks a job among the worker's names, or
/// returns the names of the jobs that accept workers. The connection's frame limit is
/// [`HANDSHAKE_MAX_FRAME`] until the worker's proof checks, then `limit`.
pub(crate) async fn coordinator<S, T>(
    framed: &mut Framed<S, LengthDelimitedCodec>,
    peer: &str,
    token: Option<&Token>,
    limit: usize,
    timing: Timing,
    choose: impl FnOnce(&[String]) -> Result<(String, T), Vec<String>>,
) -> Result<Accepted<T>, Error>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
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
        });
    }
    // The worker is authenticated: its frames may be as long as the configuration allows.
    set_limit(framed, limit);
    match choose(&hello.jobs) {
        Ok((name, job)) => {
            let welcome = Reply::Welcome {
                job: name,
                heartbeat_ms: timing.heartbeat_ms,
                lease_ms: timing.lease_ms,
            };
            send(framed, peer, encode(&welcome)).await?;
            Ok(Accepted {
                threads: hello.threads,
                job,
            })
        }
        Err(running) => {
            let refusal = Reply::Refused(Refusal::UnknownJob {
                running: running.clone(),
            });
            let _ = send(framed, peer, encode(&refusal)).await;
            Err(Error::UnknownJob {
                peer: peer.to_owned(),
                known: hello.jobs,
                running,
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

/// The worker's side of steps 1–4. The connection's frame limit is [`HANDSHAKE_MAX_FRAME`]
/// until the coordinator's proof checks, then `limit`.
///
/// # Errors
///
/// Those of the protocol's steps, and [`Error::HandshakeTooLarge`] if the hello (with the
/// job names in `jobs`) is over [`HANDSHAKE_MAX_FRAME`], which a coordinator would take for
/// a stranger's.
pub(crate) async fn worker<S>(
    framed: &mut Framed<S, LengthDelimitedCodec>,
    peer: &str,
    token: Option<&Token>,
    limit: usize,
    jobs: Vec<String>,
    threads: u32,
) -> Result<Welcomed, Error>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let token = token.cloned().unwrap_or_else(no_token);
    set_limit(framed, HANDSHAKE_MAX_FRAME);
    let nw = nonce()?;
    let known = jobs.clone();
    let hello = versioned(&Hello {
        jobs,
        threads,
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
    let refused = |r: Refusal, known: Vec<String>| match r {
        Refusal::Auth => Error::Auth {
            peer: peer.to_owned(),
        },
        Refusal::UnknownJob { running } => Error::UnknownJob {
            peer: peer.to_owned(),
            known,
            running,
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
            return Err(Error::Malformed {
                peer: peer.to_owned(),
                what: "a challenge",
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
        });
    }
    // The coordinator is authenticated: its frames may be as long as the configuration
    // allows (its refusal of an unknown job lists every running job's name).
    set_limit(framed, limit);
    let proof = token.prove(WORKER, &nc, &nw);
    send(framed, peer, encode(&ProofMsg { proof })).await?;
    let welcome = match framed.next().await {
        Some(Ok(frame)) => frame,
        Some(Err(e)) => return Err(Error::io(peer, e, limit)),
        None => {
            return Err(Error::Closed {
                peer: peer.to_owned(),
            });
        }
    };
    match decode_welcome(peer, &welcome)? {
        Reply::Welcome {
            job,
            heartbeat_ms,
            lease_ms,
        } => Ok(Welcomed {
            job,
            heartbeat_ms,
            lease_ms,
        }),
        Reply::Refused(r) => Err(refused(r, known)),
        Reply::Challenge { .. } => Err(Error::Malformed {
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
                super::coordinator(&mut coordinator, "w", None, limit, timing, |names| {
                    Ok::<_, Vec<String>>((names[0].clone(), ()))
                }),
                super::worker(&mut worker, "c", None, limit, vec!["job".into()], 1),
            );
            c.unwrap();
            assert_eq!(w.unwrap().job, "job");
            assert_eq!(coordinator.codec().max_frame_length(), limit);
            assert_eq!(worker.codec().max_frame_length(), limit);
        });
    }

    /// A worker whose hello would be over the handshake's limit says so before it sends
    /// anything (a coordinator would drop it as a stranger).
    #[test]
    fn a_hello_over_the_handshake_limit_is_an_error_of_its_own() {
        runtime().block_on(async {
            let (a, _b) = tokio::io::duplex(1 << 16);
            let mut worker = Framed::new(a, super::super::frame::codec(1 << 20));
            let jobs = (0..200).map(|i| format!("job-{i:0>60}")).collect();
            let err = super::worker(&mut worker, "c", None, 1 << 20, jobs, 1)
                .await
                .unwrap_err();
            assert!(
                matches!(err, Error::HandshakeTooLarge { len, limit: HANDSHAKE_MAX_FRAME, .. } if len > HANDSHAKE_MAX_FRAME),
                "{err:?}"
            );
        });
    }
}
