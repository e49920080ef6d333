//! The error type of the snapshot area: decoding, checking and storing snapshots.
//!
//! Three answers a reader must tell apart: *no snapshot* ([`Error::NotFound`]: nothing was
//! committed there), *a damaged snapshot* ([`Error::Damaged`]: committed, but an object it
//! needs is missing or wrong, named with the check that failed), and *a store that cannot be
//! reached or refuses* ([`Error::Store`], [`Error::Denied`], [`Error::Io`]). A store that is
//! not there at all, for a reader, is [`Error::NoSuchStore`].

use super::store::SnapshotId;

/// A `Result` with the snapshot [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Errors of snapshot encoding, decoding and storage.
///
/// Every way bytes from a file or the network can be wrong has its own variant: decoding a
/// snapshot never panics.
///
/// `Debug` (`{:?}`) is the report, each cause once, in order (as
/// [`crate::Error`]'s); `{:#?}` is the structure.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The bytes do not start with [`MAGIC`](super::MAGIC): not a snapshot manifest.
    #[error(
        "not a snapshot manifest: the file starts with {found:02x?}, not the magic \"MLBLSNAP\""
    )]
    BadMagic {
        /// The first bytes found (up to 8).
        found: Vec<u8>,
    },
    /// The manifest was written in a format version this build does not read. Its checksum
    /// verifies, so the version is the one its writer wrote: a manifest whose version was
    /// damaged is [`Error::Checksum`] (see
    /// [damage or a later format](super::format#damage-or-a-later-format)).
    #[error(
        "snapshot format version {found} is not supported (this build reads version {supported})"
    )]
    UnsupportedVersion {
        /// The version in the file.
        found: u32,
        /// The version this build reads and writes.
        supported: u32,
    },
    /// The input ends before the data it announces.
    #[error("{what} is truncated: needs {needed} bytes, got {got}")]
    Truncated {
        /// What was being read.
        what: &'static str,
        /// Bytes needed.
        needed: u64,
        /// Bytes present.
        got: u64,
    },
    /// The input goes on after the data it announces.
    #[error("{what} has {extra} trailing bytes after its end")]
    TrailingBytes {
        /// What was being read.
        what: &'static str,
        /// Bytes past the announced end.
        extra: u64,
    },
    /// A stored object has another size than its reference says.
    #[error("{what} has {found} bytes, expected {expected}")]
    Size {
        /// What was checked (a part key, a manifest).
        what: String,
        /// The size recorded in the reference.
        expected: u64,
        /// The size found.
        found: u64,
    },
    /// A CRC-32C checksum does not match: the bytes were corrupted.
    #[error("checksum mismatch in {what}: expected crc32c {expected:#010x}, found {found:#010x}")]
    Checksum {
        /// What was checked.
        what: String,
        /// The checksum recorded.
        expected: u32,
        /// The checksum of the bytes found.
        found: u32,
    },
    /// Bytes that passed the checksum do not decode (written by a buggy or foreign writer).
    #[error("cannot decode {what}")]
    Decode {
        /// What was being decoded.
        what: String,
        /// The codec's error.
        #[source]
        source: postcard::Error,
    },
    /// The snapshot was written by another version of the job's code
    /// ([`Job::VERSION`](crate::Job::VERSION)).
    #[error(
        "the snapshot of job {job:?} was written by version {snapshot} of its code, this program \
         has version {code} (Job::VERSION): its values may not read back; resume it with the \
         program of version {snapshot}, or start the job afresh"
    )]
    WrongJobVersion {
        /// The job's name.
        job: String,
        /// The version in the snapshot.
        snapshot: u32,
        /// This program's version.
        code: u32,
    },
    /// The snapshot was written by code whose job types have another serialized layout
    /// (see [`Layout`](crate::Layout)): a field added, removed, renamed, reordered or
    /// retyped. Found before any of the job's bytes were decoded: they would have failed to
    /// decode, or decoded into the wrong fields.
    #[error(
        "snapshot {snapshot} of job {job:?} was written by code whose types have another \
         layout (fingerprint {written}, this program's {code}): {difference}; resume it with \
         the program that wrote it, or start the job afresh (and bump Job::VERSION when the \
         serialized form of a job changes)"
    )]
    LayoutChanged {
        /// The snapshot.
        snapshot: SnapshotId,
        /// The job's name.
        job: String,
        /// The fingerprint of the layout recorded in the snapshot.
        written: crate::Fingerprint,
        /// The fingerprint of this program's layout.
        code: crate::Fingerprint,
        /// The first entry that differs, with both sides (`Type.field: type`).
        difference: String,
    },
    /// A value of a snapshot, whose bytes passed their checks and whose layout matches, does
    /// not decode as this program's type (a custom `Deserialize` that changed, or a value
    /// written by other code under the same layout).
    #[error("cannot decode {what} of snapshot {snapshot} as this program's type")]
    Undecodable {
        /// The snapshot.
        snapshot: SnapshotId,
        /// What was being decoded ("the job", "the reduced value", "a chunk output", …).
        what: &'static str,
        /// The codec's error.
        #[source]
        source: postcard::Error,
    },
    /// The snapshot belongs to another job (another [`Job::NAME`](crate::Job::NAME)).
    #[error("the snapshot is of job {found:?}, not {expected:?}")]
    WrongJob {
        /// The job name asked for.
        expected: String,
        /// The job name in the snapshot.
        found: String,
    },
    /// A manifest that decodes but breaks an invariant of the format (a chunk listed twice,
    /// an index out of range, …).
    #[error("inconsistent snapshot manifest: {0}")]
    Inconsistent(String),
    /// Nothing is stored where something was expected: for a snapshot, it was never
    /// committed (or was deleted). A snapshot that is committed but misses one of its
    /// parts is [`Error::Damaged`], never this.
    #[error("not found: {what}")]
    NotFound {
        /// What was looked for.
        what: String,
    },
    /// A committed snapshot that cannot be read back as it was written: one of its objects
    /// (its manifest or a part) is missing, has another size than recorded, fails its
    /// checksum or does not decode. The source is the failed check with its details. Other
    /// committed snapshots may still be restorable ([`At::Latest`](crate::At::Latest) tries
    /// them, newest first).
    #[error("snapshot {snapshot} is damaged: {object:?} {check}")]
    Damaged {
        /// The snapshot.
        snapshot: SnapshotId,
        /// The key of the object that failed its check, relative to the store's prefix.
        object: String,
        /// Which check failed.
        check: Check,
        /// The failed check's error.
        #[source]
        source: Box<Error>,
    },
    /// Another writer already committed this epoch of this job: the conditional create of the
    /// manifest lost. The snapshot being written is not committed.
    #[error("epoch {epoch} of job {job_id} is already committed by another writer")]
    EpochTaken {
        /// The job id.
        job_id: String,
        /// The epoch.
        epoch: u64,
    },
    /// A job id that cannot be used in a key.
    #[error("invalid job id {job_id:?}: {reason}")]
    InvalidJobId {
        /// The id given.
        job_id: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A snapshot id that does not parse as `job-id@epoch`.
    #[error("invalid snapshot id {id:?}: {reason}")]
    InvalidId {
        /// The text given.
        id: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A store URL that cannot be opened.
    #[error("invalid store URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL given (without credentials).
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A store that is only read (by the `snapshots` command, or
    /// [`Store::open_existing`](super::Store::open_existing)) does not exist: a `file://`
    /// folder that is missing or is a file. Nothing was created.
    #[error("no such store {url}: {reason}")]
    NoSuchStore {
        /// The URL given (without credentials).
        url: String,
        /// What is there instead.
        reason: String,
    },
    /// A store option that the store does not know or accept.
    #[error("invalid store option {key:?}: {reason}")]
    InvalidOption {
        /// The option's key.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The store refused the request for lack of valid credentials or permissions.
    #[error(
        "the store denied {op} of {key:?}: the credentials are missing, wrong or lack permission \
         (check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or the access_key_id / \
         secret_access_key options)"
    )]
    Denied {
        /// The operation (`put`, `get`, `list`, `delete`).
        op: &'static str,
        /// The key, relative to the store's prefix.
        key: String,
        /// The store's error.
        #[source]
        source: object_store::Error,
    },
    /// Any other failure of the object store (network, disk full, …).
    #[error("object store {op} of {key:?} failed")]
    Store {
        /// The operation (`put`, `get`, `list`, `delete`, …).
        op: &'static str,
        /// The key, relative to the store's prefix.
        key: String,
        /// The store's error.
        #[source]
        source: object_store::Error,
    },
    /// A local I/O failure (creating the folder of a `file://` store).
    #[error("{what}")]
    Io {
        /// What was being done.
        what: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

crate::error::debug_as_report!(Error {
    BadMagic { found },
    UnsupportedVersion { found, supported },
    Truncated { what, needed, got },
    TrailingBytes { what, extra },
    Size { what, expected, found },
    Checksum { what, expected, found },
    Decode { what, source },
    WrongJobVersion { job, snapshot, code },
    LayoutChanged { snapshot, job, written, code, difference },
    Undecodable { snapshot, what, source },
    WrongJob { expected, found },
    Inconsistent(text),
    NotFound { what },
    Damaged { snapshot, object, check, source },
    EpochTaken { job_id, epoch },
    InvalidJobId { job_id, reason },
    InvalidId { id, reason },
    InvalidUrl { url, reason },
    NoSuchStore { url, reason },
    InvalidOption { key, reason },
    Denied { op, key, source },
    Store { op, key, source },
    Io { what, source },
});

/// Which check of a stored object failed, in [`Error::Damaged`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Check {
    /// The object is not in the store.
    Missing,
    /// It has another size than its reference records.
    Size,
    /// Its CRC-32C checksum does not match.
    Checksum,
    /// Its bytes do not form what they should (magic, length, encoding, or a manifest that
    /// contradicts its key or the format's rules).
    Format,
}

impl std::fmt::Display for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Check::Missing => "is missing",
            Check::Size => "has the wrong size",
            Check::Checksum => "fails its checksum",
            Check::Format => "does not decode",
        })
    }
}

impl Error {
    /// This error of reading `object` of committed snapshot `snapshot`, as
    /// [`Error::Damaged`] when it says the object is missing or wrong; an error of the store
    /// itself (unreachable, refused) or of a foreign snapshot (another version or job) is
    /// returned unchanged.
    pub(crate) fn damage(self, snapshot: &SnapshotId, object: &str) -> Error {
        let Some(check) = self.damage_check() else {
            return self;
        };
        Error::Damaged {
            snapshot: snapshot.clone(),
            object: object.to_owned(),
            check,
            source: Box::new(self),
        }
    }

    /// The check that failed, when this error of reading an object says the object is
    /// missing or wrong (what [`Error::damage`] turns into [`Error::Damaged`]); `None` for
    /// the rest.
    pub(crate) fn damage_check(&self) -> Option<Check> {
        match self {
            Error::NotFound { .. } => Some(Check::Missing),
            Error::Size { .. } => Some(Check::Size),
            Error::Checksum { .. } => Some(Check::Checksum),
            Error::BadMagic { .. }
            | Error::Truncated { .. }
            | Error::TrailingBytes { .. }
            | Error::Decode { .. }
            | Error::Inconsistent(_) => Some(Check::Format),
            _ => None,
        }
    }

    /// Maps an object-store failure of `op` on `key` to the matching variant: missing objects
    /// become [`Error::NotFound`], refused credentials [`Error::Denied`], the rest
    /// [`Error::Store`] (the source is kept in both).
    ///
    /// Some S3-compatible servers answer a bad signature with a status that `object_store`
    /// reports as a generic error; the S3 error codes in its message still say what happened,
    /// so those are recognised too.
    pub(crate) fn store(op: &'static str, key: &str, source: object_store::Error) -> Error {
        use object_store::Error as E;
        let denied = match &source {
            E::Unauthenticated { .. } | E::PermissionDenied { .. } => true,
            E::Generic { source, .. } => {
                let text = source.to_string();
                DENIED_CODES.iter().any(|code| text.contains(code))
            }
            _ => false,
        };
        // S3 answers a request into a missing bucket with 404, which `object_store` reports
        // as a missing object: it is the store that is missing, not a snapshot, and the
        // server's `NoSuchBucket` must reach the user.
        let no_bucket = matches!(&source, E::NotFound { source, .. }
            if source.to_string().contains("NoSuchBucket"));
        match source {
            E::NotFound { .. } if !no_bucket => Error::NotFound {
                what: format!("object {key:?}"),
            },
            source if denied => Error::Denied {
                op,
                key: key.to_owned(),
                source,
            },
            source => Error::Store {
                op,
                key: key.to_owned(),
                source,
            },
        }
    }
}

/// S3 error codes that mean "your credentials were refused".
const DENIED_CODES: [&str; 6] = [
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "AccessDenied",
    "ExpiredToken",
    "InvalidToken",
    "InvalidSecurity",
];
