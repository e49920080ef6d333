//! The cluster's typed errors.

use std::io;
use std::time::Duration;

/// What went wrong between a coordinator and a worker process.
///
/// Both sides report a refused handshake with the same variant: a worker with the wrong token
/// gets [`Error::Auth`], and so does the coordinator's record of it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Reading from or writing to the connection failed.
    #[error("connection with {peer}")]
    Io {
        /// The other side's address.
        peer: String,
        /// The socket error.
        #[source]
        source: io::Error,
    },
    /// The other side closed the connection.
    #[error("{peer} closed the connection")]
    Closed {
        /// The other side's address.
        peer: String,
    },
    /// The handshake did not complete in time (a peer that connects and says nothing, or
    /// stalls in the middle of a frame).
    #[error("{peer} did not complete the handshake within {after:?}")]
    HandshakeTimeout {
        /// The other side's address.
        peer: String,
        /// The handshake's time limit.
        after: Duration,
    },
    /// Nothing arrived from an established peer for a whole lease (no heartbeat, or a frame
    /// that stalls half-way): the peer fell silent (stopped, hung, or cut off without the
    /// connection closing) and is given up. Only frames received count; a side's own
    /// heartbeats never extend the other's lease.
    #[error("{peer} fell silent: nothing from it for {after:?}, its lease expired")]
    LeaseExpired {
        /// The other side's address.
        peer: String,
        /// The lease.
        after: Duration,
    },
    /// The first bytes were not this protocol's magic, or claimed a frame over the
    /// handshake's limit (an HTTP request, a port scanner): not a malleable peer.
    #[error("{peer} does not speak the malleable protocol")]
    NotAPeer {
        /// The other side's address.
        peer: String,
    },
    /// The two sides speak different protocol versions.
    #[error("{peer} speaks protocol version {theirs}, this side {ours}")]
    Version {
        /// The other side's address.
        peer: String,
        /// This side's version.
        ours: u32,
        /// The other side's version.
        theirs: u32,
    },
    /// The other side could not prove that it holds the shared token.
    #[error("{peer} did not prove the shared token")]
    Auth {
        /// The other side's address.
        peer: String,
    },
    /// No job the coordinator runs is among those the worker knows.
    #[error(
        "no job in common with {peer}: the worker knows {known:?}, the coordinator runs {running:?}"
    )]
    UnknownJob {
        /// The other side's address.
        peer: String,
        /// The job names the worker registered.
        known: Vec<String>,
        /// The job names the coordinator runs and accepts workers for.
        running: Vec<String>,
    },
    /// A frame's length exceeds the limit (from an authenticated peer: before that, a frame
    /// over the handshake's limit makes the peer [`Error::NotAPeer`]).
    #[error("{peer} sent a frame over the limit of {limit} bytes")]
    FrameTooLarge {
        /// The other side's address.
        peer: String,
        /// The maximum frame length.
        limit: usize,
    },
    /// This side's own handshake message is over the handshake's frame limit
    /// ([`HANDSHAKE_MAX_FRAME`](super::handshake::HANDSHAKE_MAX_FRAME)); the other side
    /// would take it for a stranger's. A worker process that registers too many job names.
    #[error("this side's {what} is {len} bytes, over the handshake's frame limit of {limit}")]
    HandshakeTooLarge {
        /// The message.
        what: &'static str,
        /// Its length.
        len: usize,
        /// The handshake's frame limit.
        limit: usize,
    },
    /// A message sent in pieces is longer than the limit.
    #[error("{peer} sent a message over the limit of {limit} bytes")]
    MessageTooLarge {
        /// The other side's address.
        peer: String,
        /// The maximum message length.
        limit: usize,
    },
    /// A frame that does not decode as the message expected at that point, or a message
    /// that breaks the protocol there.
    #[error("{peer} sent bytes that are not {what}: {reason}")]
    Malformed {
        /// The other side's address.
        peer: String,
        /// The message expected.
        what: &'static str,
        /// What is wrong with it.
        reason: String,
        /// The codec's error, when the bytes did not decode (`reason` then says only that).
        #[source]
        source: Option<postcard::Error>,
    },
    /// The other side refused this one for a reason this side could not check itself.
    #[error("refused by {peer}: {reason}")]
    Refused {
        /// The other side's address.
        peer: String,
        /// The reason it gave.
        reason: String,
    },
    /// Listening on an address other than loopback needs a token.
    #[error(
        "refusing to listen on {addr} without a token: set MALLEABLE_TOKEN (or a token file) \
         or listen on loopback"
    )]
    NoToken {
        /// The address asked for.
        addr: String,
    },
    /// The token could not be read.
    #[error("cannot read the cluster token: {0}")]
    Token(String),
    /// The address to listen on or dial could not be used.
    #[error("address {addr}")]
    Address {
        /// The address.
        addr: String,
        /// Why.
        #[source]
        source: io::Error,
    },
}

impl Error {
    /// Maps an I/O error from a framed connection: an over-long frame and a stalled one get
    /// their own variants.
    pub(crate) fn io(peer: &str, e: io::Error, limit: usize) -> Error {
        let too_big = e
            .get_ref()
            .is_some_and(|inner| inner.is::<tokio_util::codec::LengthDelimitedCodecError>());
        if too_big {
            return Error::FrameTooLarge {
                peer: peer.to_owned(),
                limit,
            };
        }
        Error::Io {
            peer: peer.to_owned(),
            source: e,
        }
    }

    /// A short name of the variant, for metrics labels.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Io { .. } => "io",
            Error::Closed { .. } => "closed",
            Error::HandshakeTimeout { .. } => "handshake_timeout",
            Error::LeaseExpired { .. } => "lease_expired",
            Error::NotAPeer { .. } => "not_a_peer",
            Error::Version { .. } => "version",
            Error::Auth { .. } => "auth",
            Error::UnknownJob { .. } => "unknown_job",
            Error::FrameTooLarge { .. } => "frame_too_large",
            Error::HandshakeTooLarge { .. } => "handshake_too_large",
            Error::MessageTooLarge { .. } => "message_too_large",
            Error::Malformed { .. } => "malformed",
            Error::Refused { .. } => "refused",
            Error::NoToken { .. } => "no_token",
            Error::Token(_) => "token",
            Error::Address { .. } => "address",
        }
    }
}
