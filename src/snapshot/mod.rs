//! Snapshots: the file format and the stores that hold them.
//!
//! A snapshot is a committed, self-contained image of a job at one epoch. It is one
//! [`Manifest`] (the job value, phase, ledger, reduction so far, and a list of parts) plus one
//! part per suspended chunk state, in a [`Store`] opened from a URL (`file://`, `memory://`,
//! `s3://`).
//!
//! - [`format`](mod@format): the manifest file layout, its encoder and decoder, and the checks of parts.
//! - [`store`]: keys, the commit protocol, listing and retention ([`Store`]).
//! - `lease.rs`: the lease that lets one run at a time own a job id ([`LeaseHolder`]).
//! - [`Error`]: every way a snapshot can be missing, corrupt, foreign or refused.
//!
//! The items of both modules are re-exported here.
//!
//! # Guarantees
//!
//! - **Never a torn snapshot.** Parts are written first, to fresh keys; the manifest last, with
//!   a conditional create: a snapshot is committed exactly when its manifest exists, two
//!   writers cannot both commit one epoch, and a crash at any moment leaves the earlier
//!   committed snapshots intact (see the [commit protocol](store#commit-protocol)).
//! - **Portable.** Versioned, checksummed (CRC-32C), little-endian, postcard-encoded; no
//!   `usize`, no pointers.
//! - **Bad bytes are errors.** Decoding a corrupt, truncated, foreign or hostile manifest or
//!   part returns a typed [`Error`] and never panics.

mod blocking;
mod error;
pub mod format;
pub(crate) mod lease;
mod open;
pub mod store;

pub use blocking::BlockingStore;
pub(crate) use blocking::block_on;
pub use error::{Check, Error, Result};
pub use format::{
    Dimension, FORMAT_VERSION, HEADER_LEN, MAGIC, Manifest, PartRef, check_part, decode_manifest,
    encode_manifest,
};
pub use lease::{DEFAULT_LEASE, LeaseHolder, LeaseLoss, MIN_LEASE};
pub(crate) use open::shareable_options;
pub use store::{
    ABANDONED_AFTER, Cleanup, MAX_JOB_ID_LEN, MULTIPART_PIECE, MULTIPART_THRESHOLD, Skipped,
    SnapshotId, SnapshotInfo, Store, Uncommitted, check_job_id,
};
