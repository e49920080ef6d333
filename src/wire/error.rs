//! The cluster's typed errors.

use std::io;
use std::time::Duration;

/// What went wrong between a coordinator and a worker process.
///
/// Both sides report a refused handshake with the same variant: a worker with the wrong token
/// gets [`Error::Auth`], and so does the coordinator's record of it (each says what it saw:
/// [`AuthFailure`]).
///
/// `Debug` (`{:?}`) is the report, each cause once, in order (as
/// [`crate::Error`]'s); `{:#?}` is the structure.
#[derive(thiserror::Error)]
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
    /// The shared token did not check: the coordinator and the worker process hold different
    /// tokens, or one of them has none (or, between worker processes that exchange halos,
    /// the dialer and the listener do). What this side saw is in `failure`; the message says
    /// which side is which and how the token is set ([`TOKEN_ENV`](super::TOKEN_ENV),
    /// `Builder::cluster_token`, [`WorkerOptions::token`](crate::cluster::WorkerOptions::token)).
    #[error("{}", auth_text(.peer, *.failure))]
    Auth {
        /// The other side's address.
        peer: String,
        /// Whose proof failed, as this side saw it.
        failure: AuthFailure,
    },
    /// No job the coordinator runs is among those the worker knows (or it runs none yet: a
    /// worker process can wait for it, [`WorkerOptions::wait_for_job`](crate::cluster::WorkerOptions::wait_for_job)).
    #[error("{}", unknown_job_text(.peer, .known, .running))]
    UnknownJob {
        /// The other side's address.
        peer: String,
        /// The job names the worker registered.
        known: Vec<String>,
        /// The job names the coordinator runs and accepts workers for.
        running: Vec<String>,
    },
    /// The coordinator runs no job a worker could join, and a job this worker process has ran
    /// there and has ended: a worker started after its job ended has nothing to do. A worker
    /// that waits for its job ([`WorkerOptions::wait_for_job`](crate::cluster::WorkerOptions::wait_for_job))
    /// tries again until its time is up, for a later run of the job.
    #[error(
        "the coordinator at {peer} has ended job {job:?} and runs no job this worker process \
         could join; a worker started after its job ended has nothing to do"
    )]
    JobEnded {
        /// The other side's address.
        peer: String,
        /// The job that ended.
        job: String,
    },
    /// The coordinator runs a job of a name the worker process knows, but the two were built
    /// with different versions of it ([`Job::VERSION`](crate::Job::VERSION)): their
    /// serialized forms may differ, so the worker is refused. Both sides report it.
    #[error(
        "job {job:?}: the coordinator has version {coordinator} and the worker process version \
         {worker} (the other side is {peer}); run both with the same build of the job (and bump \
         Job::VERSION whenever its serialized form changes)"
    )]
    JobVersion {
        /// The other side's address.
        peer: String,
        /// The job's name.
        job: String,
        /// The coordinator's version of the job.
        coordinator: u32,
        /// The worker process's version of the job.
        worker: u32,
    },
    /// The coordinator runs a job of a name and version the worker process knows, but the
    /// job's types (the job, its chunk, output and halo) have another serialized
    /// [`Layout`](crate::Layout) in the two programs: a field added, removed, renamed,
    /// reordered or retyped without a new [`Job::VERSION`](crate::Job::VERSION). The worker
    /// is refused in the handshake, before any of the job's bytes cross (they would decode
    /// into the wrong fields, or not at all); both sides report it, with both fingerprints and
    /// the first entry of the layouts that differs.
    #[error(
        "job {job:?} (version {version} on both sides): the coordinator's types and the \
         worker process's have another serialized layout (fingerprint {coordinator} on the \
         coordinator, {worker} on the worker process; the other side is {peer}): {difference}; \
         run both with the same build of the job (and bump Job::VERSION whenever its \
         serialized form changes)"
    )]
    JobLayout {
        /// The other side's address.
        peer: String,
        /// The job's name.
        job: String,
        /// The version of the job both sides have.
        version: u32,
        /// The fingerprint of the coordinator's layout of the job's types.
        coordinator: crate::Fingerprint,
        /// The fingerprint of the worker process's layout of the job's types.
        worker: crate::Fingerprint,
        /// The first entry that differs, with both sides (`Type.field: type`).
        difference: String,
    },
    /// Bytes of the job's own types (the job value, a chunk output, a halo) do not decode,
    /// although both sides have the same version of the job: the two programs serialize the
    /// job differently, and its [`Job::VERSION`](crate::Job::VERSION) was not bumped when
    /// that changed. `here` says on which side: true when this side could not decode what
    /// the other sent, false when the other side (a worker process) reported that it could
    /// not decode what this side sent (and left).
    #[error("{}", undecodable_text(.peer, .job, *.version, .what, *.here))]
    Undecodable {
        /// The other side's address.
        peer: String,
        /// The job's name.
        job: String,
        /// The version of the job both sides announced.
        version: u32,
        /// What did not decode.
        what: &'static str,
        /// Whether it did not decode on this side (else on the other).
        here: bool,
        /// The codec's error.
        #[source]
        source: postcard::Error,
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
    /// A frame that does not decode as the message expected at that point, or frames that
    /// do not make a message (pieces out of order). A message that decodes but is not
    /// allowed there is [`Error::Rejected`].
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
    /// A message that decodes but that the protocol does not allow at that point: a `Done`
    /// or `Yielded` for a chunk the slot was not given, a message for a slot that is not
    /// live, a partition that was not asked for. The peer is faulty and its connection is
    /// dropped (counted with kind `rejected`, apart from bytes that do not decode,
    /// `malformed`).
    #[error("{peer} sent {what} that is refused here: {reason}")]
    Rejected {
        /// The other side's address.
        peer: String,
        /// The message.
        what: &'static str,
        /// Why it is refused.
        reason: String,
        /// The refusal of the part that refused it (the job's ledger), if any.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
    },
    /// The other side refused this one for a reason this side could not check itself.
    #[error("refused by {peer}: {reason}")]
    Refused {
        /// The other side's address.
        peer: String,
        /// The reason it gave.
        reason: String,
    },
    /// A worker process of another session (another run of the job: before or after a
    /// rollback or a new roster, or another job that shares the token) dialled this one for
    /// halos, or this one dialled such a process (protocol 20, `wire::peer`). The dialer is
    /// refused after both sides proved the token and before any halo crosses; both sides
    /// report it, each with its own session as `ours`.
    #[error(
        "the worker process at {peer} is in session {}, this worker process in session {}: \
         one of the two has not yet learned of the job's new run (a rollback, a new roster), \
         or they are of different jobs; no halo crosses between them",
        session_text(.theirs),
        session_text(.ours)
    )]
    PeerSession {
        /// The other side's address.
        peer: String,
        /// This side's session.
        ours: [u8; 16],
        /// The other side's session.
        theirs: [u8; 16],
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
    /// An environment variable of the worker's options holds a value that is not one.
    #[error("{var}={value:?} is not {expected}")]
    Environment {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What it should be.
        expected: &'static str,
    },
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

crate::error::debug_as_report!(Error {
    Io { peer, source },
    Closed { peer },
    HandshakeTimeout { peer, after },
    LeaseExpired { peer, after },
    NotAPeer { peer },
    Version { peer, ours, theirs },
    Auth { peer, failure },
    UnknownJob { peer, known, running },
    JobEnded { peer, job },
    JobVersion { peer, job, coordinator, worker },
    JobLayout { peer, job, version, coordinator, worker, difference },
    Undecodable { peer, job, version, what, here, source },
    FrameTooLarge { peer, limit },
    HandshakeTooLarge { what, len, limit },
    MessageTooLarge { peer, limit },
    Malformed { peer, what, reason, source },
    Rejected { peer, what, reason, source },
    Refused { peer, reason },
    PeerSession { peer, ours, theirs },
    NoToken { addr },
    Token(text),
    Environment { var, value, expected },
    Address { addr, source },
});

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
            Error::JobEnded { .. } => "job_ended",
            Error::JobVersion { .. } => "job_version",
            Error::JobLayout { .. } => "job_layout",
            Error::Undecodable { .. } => "undecodable",
            Error::FrameTooLarge { .. } => "frame_too_large",
            Error::HandshakeTooLarge { .. } => "handshake_too_large",
            Error::MessageTooLarge { .. } => "message_too_large",
            Error::Malformed { .. } => "malformed",
            Error::Rejected { .. } => "rejected",
            Error::Refused { .. } => "refused",
            Error::PeerSession { .. } => "peer_session",
            Error::NoToken { .. } => "no_token",
            Error::Token(_) => "token",
            Error::Environment { .. } => "environment",
            Error::Address { .. } => "address",
        }
    }
}

/// Whose proof of the shared token failed, as one side of the handshake saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AuthFailure {
    /// Seen by a worker process: the coordinator's proof does not check with this worker's
    /// token (the coordinator proves first, so this is what a worker with the wrong token, or
    /// none, sees).
    CoordinatorProof {
        /// Whether this worker process has a token.
        token: bool,
    },
    /// Seen by a worker process: the coordinator refused this worker's proof.
    RefusedByCoordinator,
    /// Seen by a coordinator: the worker process's proof does not check with this
    /// coordinator's token.
    WorkerProof {
        /// Whether this coordinator has a token.
        token: bool,
    },
    /// Seen by a worker process that dialled another for halos (`wire::peer`): the listening
    /// process's proof does not check with this process's token (the listener proves first,
    /// so this is what a dialer with the wrong token, or none, sees).
    ListenerProof {
        /// Whether this worker process has a token.
        token: bool,
    },
    /// Seen by a worker process that dialled another for halos: the listening process
    /// refused this process's proof.
    RefusedByListener,
    /// Seen by a worker process that another dialled for halos: the dialer's proof does not
    /// check with this process's token.
    DialerProof {
        /// Whether this worker process has a token.
        token: bool,
    },
}

/// How worker processes get the same token, for the messages about peers.
const SAME_PEER_TOKEN: &str = "give every worker process of the job the coordinator's token: \
                               MALLEABLE_TOKEN in the environment of each (read by \
                               WorkerOptions::from_env), or WorkerOptions::token";

/// A session in hexadecimal, for the messages.
fn session_text(session: &[u8; 16]) -> String {
    session.iter().map(|b| format!("{b:02x}")).collect()
}

/// How the two sides get the same token, for the messages.
const SAME_TOKEN: &str = "give both the same token: MALLEABLE_TOKEN in the environment of each \
                          (read by Token::from_env and WorkerOptions::from_env), or \
                          Builder::cluster_token and WorkerOptions::token";

fn auth_text(peer: &str, failure: AuthFailure) -> String {
    match failure {
        AuthFailure::CoordinatorProof { token: true } => format!(
            "the coordinator at {peer} does not hold this worker process's shared token: \
             {SAME_TOKEN}"
        ),
        AuthFailure::CoordinatorProof { token: false } => format!(
            "the coordinator at {peer} requires a shared token and this worker process has \
             none: set MALLEABLE_TOKEN in its environment (read by WorkerOptions::from_env) or \
             give it with WorkerOptions::token"
        ),
        AuthFailure::RefusedByCoordinator => format!(
            "the coordinator at {peer} refused this worker process's proof of the shared \
             token: {SAME_TOKEN}"
        ),
        AuthFailure::WorkerProof { token: true } => format!(
            "the worker process at {peer} did not prove that it holds this coordinator's \
             shared token (it has another one, or none): {SAME_TOKEN}"
        ),
        AuthFailure::WorkerProof { token: false } => format!(
            "the worker process at {peer} has a shared token and this coordinator none: \
             give the coordinator the same token (MALLEABLE_TOKEN in its environment, or \
             Builder::cluster_token), or start the worker without one"
        ),
        AuthFailure::ListenerProof { token: true } => format!(
            "the worker process at {peer}, dialled for halos, does not hold this worker \
             process's shared token: {SAME_PEER_TOKEN}"
        ),
        AuthFailure::ListenerProof { token: false } => format!(
            "the worker process at {peer}, dialled for halos, requires a shared token and \
             this worker process has none: {SAME_PEER_TOKEN}"
        ),
        AuthFailure::RefusedByListener => format!(
            "the worker process at {peer}, dialled for halos, refused this worker process's \
             proof of the shared token: {SAME_PEER_TOKEN}"
        ),
        AuthFailure::DialerProof { token: true } => format!(
            "the worker process at {peer}, which dialled this one for halos, did not prove \
             that it holds this worker process's shared token (it has another one, or none): \
             {SAME_PEER_TOKEN}"
        ),
        AuthFailure::DialerProof { token: false } => format!(
            "the worker process at {peer}, which dialled this one for halos, has a shared \
             token and this worker process none: {SAME_PEER_TOKEN}"
        ),
    }
}

fn unknown_job_text(peer: &str, known: &[String], running: &[String]) -> String {
    if running.is_empty() {
        format!(
            "no job in common with {peer}: the worker process knows {known:?} and the \
             coordinator runs no job yet; submit the job first, or let the worker wait for it \
             (WorkerOptions::wait_for_job, or MALLEABLE_WAIT_FOR_JOB in its environment)"
        )
    } else {
        format!(
            "no job in common with {peer}: the worker process knows {known:?}, the coordinator \
             runs {running:?}; register the job with the worker's Registry"
        )
    }
}

fn undecodable_text(peer: &str, job: &str, version: u32, what: &str, here: bool) -> String {
    let (did, whose) = if here {
        (
            format!("{what} of job {job:?} from {peer} does not decode here"),
            "two programs",
        )
    } else {
        (
            format!(
                "the worker process at {peer} could not decode {what} of job {job:?} sent by this coordinator"
            ),
            "coordinator and the worker",
        )
    };
    format!(
        "{did}, although both sides have version {version} of the job: its serialized form \
         differs between the {whose} (bump Job::VERSION whenever the serialized form of the \
         job, its chunk, output or partition changes, so that such a worker is refused in \
         the handshake)"
    )
}
