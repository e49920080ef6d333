//! The snapshot file format: the manifest and the checks of parts.
//!
//! A snapshot is one **manifest** object plus one **part** object per suspended chunk. Parts
//! are opaque here (the executor writes the postcard bytes of a chunk state); the manifest
//! lists them with their size and CRC-32C, so that a reader checks every byte it trusts.
//!
//! # Manifest file layout
//!
//! All integers are little-endian; nothing is a `usize` or a pointer, so a manifest written
//! on one architecture reads on any other.
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 8 | [`MAGIC`], `b"MLBLSNAP"` |
//! | 8 | 4 | format version, `u32` ([`FORMAT_VERSION`]) |
//! | 12 | 8 | body length in bytes, `u64` |
//! | 20 | 4 | CRC-32C (Castagnoli) of bytes `0..20` (magic, version, length) followed by the body, `u32` |
//! | 24 | body length | body: the [`Manifest`] in postcard |
//!
//! [`encode_manifest`] writes these fields in this order and [`decode_manifest`] reads them
//! in the same order; the two mirror each other, field for field — change one, change both,
//! and bump [`FORMAT_VERSION`]. The body's postcard encoding is the serde field order of
//! [`Manifest`] and [`PartRef`]: reordering their fields is a format change too. Every body
//! starts with its format version (the first field of [`Manifest`]), which must equal the
//! header's.
//!
//! # Damage or a later format
//!
//! The checksum covers every byte of the file but its own four, the version included, so a
//! reader tells a damaged file from one of a later format by the checksum, before it trusts
//! the version:
//!
//! 1. The fixed header (magic, version, length, checksum) is read, and the body must be
//!    exactly as long as announced.
//! 2. The checksum is checked, with the coverage of the version the header names. Every
//!    format from 4 on keeps this header and this coverage, so the check is the same for a
//!    version this build does not know.
//! 3. Only then is the version trusted: a version outside
//!    [`OLDEST_FORMAT_VERSION`]`..=`[`FORMAT_VERSION`] whose checksum verifies is a genuine
//!    file of another format, [`Error::UnsupportedVersion`]; one whose checksum fails is
//!    damage, [`Error::Checksum`], whatever the version says.
//!
//! Formats 1 to 3 (written before format 4) have the same header, but their checksum covers
//! the body alone. For those versions the body's checksum is checked, then the version the
//! body starts with must equal the header's: a flipped bit in the header's version of such a
//! file gives either a version whose coverage includes the header (4 or more, or 0: the
//! checksum fails) or another of 1 to 3 (the body disagrees, [`Error::Inconsistent`]). A
//! flipped bit in the length is [`Error::Truncated`] or [`Error::TrailingBytes`], in the
//! magic [`Error::BadMagic`]. So no single damaged field of a manifest of any format this
//! crate ever wrote reads as a later format: every one is damage
//! ([`Error::Damaged`] when read from a store, which [`At::Latest`](crate::At::Latest) passes
//! over).
//!
//! # What decoding guarantees
//!
//! [`decode_manifest`] returns `Ok` only for a manifest whose header, length and checksum are
//! right, whose body decodes exactly (no byte left over), and which is consistent: its body
//! carries the header's version, `merged <= chunks`, `iterations_done <= iterations_total`,
//! and every chunk in `done` and `parts` is in `merged..chunks` and listed once across both.
//! Any other input gives a typed [`Error`]; no input panics (the `fuzz/` targets check this).

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use super::error::{Error, Result};
use super::store::SnapshotId;
use crate::layout::Layout;

/// The version of the manifest format that this build writes and reads.
///
/// Version 2 added [`Manifest::kept`] (the owned partitions of done chunks); version 3
/// [`Manifest::job_version`]; version 4 extended the checksum over the fixed header (see
/// [damage or a later format](self#damage-or-a-later-format)); version 5
/// [`Manifest::layout`]; version 6 [`Manifest::submitted`] and [`Manifest::shape`]. A
/// manifest of version 2 is still read, as one of job version 1 (the version every job had
/// before there were versions), ones of versions 3 and 4 without a layout, and ones of
/// version 5 without a submitted job value or a shape; all are upgraded in memory to this
/// version.
pub const FORMAT_VERSION: u32 = 6;

/// The oldest manifest format this build reads.
pub const OLDEST_FORMAT_VERSION: u32 = 2;

/// The first 8 bytes of every manifest file.
pub const MAGIC: [u8; 8] = *b"MLBLSNAP";

/// Length of the fixed header before the body: magic, version, body length, checksum.
pub const HEADER_LEN: usize = 8 + 4 + 8 + 4;

/// The bytes of the fixed header that the checksum covers (from format 4 on): all of it but
/// the checksum itself.
const CHECKED_HEADER_LEN: usize = HEADER_LEN - 4;

/// The formats (written before format 4) whose checksum covers the body alone.
const BODY_CHECKSUM_ONLY: std::ops::RangeInclusive<u32> = 1..=3;

/// The checksum of a manifest file of format `version`, given its fixed header's first
/// [`CHECKED_HEADER_LEN`] bytes and its body (see the [layout](self#manifest-file-layout)).
fn checksum(version: u32, header: &[u8; CHECKED_HEADER_LEN], body: &[u8]) -> u32 {
    if BODY_CHECKSUM_ONLY.contains(&version) {
        crc32c::crc32c(body)
    } else {
        crc32c::crc32c_append(crc32c::crc32c(header), body)
    }
}

/// A manifest file of format `version` around `body`: the fixed header, then the body.
fn frame(version: u32, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    // Order must match `decode_manifest`.
    out.extend_from_slice(&MAGIC); // magic
    out.extend_from_slice(&version.to_le_bytes()); // format version
    out.extend_from_slice(&(body.len() as u64).to_le_bytes()); // body length
    let mut header = [0; CHECKED_HEADER_LEN];
    header.copy_from_slice(&out);
    out.extend_from_slice(&checksum(version, &header, body).to_le_bytes()); // checksum
    out.extend_from_slice(body); // body
    out
}

/// The description of one snapshot: everything needed to restore a job at one epoch, except
/// the suspended chunk states, which live in parts that [`Manifest::parts`] lists.
///
/// Every chunk of the current phase appears exactly once: folded into `reduced` (below
/// `merged`), done with an output (in `done`), suspended with a state (in `parts`), or pending
/// from scratch (everything else).
///
/// Values the snapshot layer does not interpret (`job`, `config`, `reduced`, the outputs) are
/// opaque postcard bytes written by the executor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// The format version of this manifest; [`FORMAT_VERSION`] when written by this build.
    pub format_version: u32,
    /// The job's [`Job::NAME`](crate::Job::NAME): which code this snapshot is for.
    pub job_name: String,
    /// The id of this run of the job: the first level of the store's keys.
    pub job_id: String,
    /// The number of this snapshot within the job.
    pub epoch: u64,
    /// When the snapshot was started, in milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
    /// The job value in postcard (opaque here).
    pub job: Vec<u8>,
    /// The current phase (0-based).
    pub phase: u64,
    /// Iterations of the phases finished before this one.
    pub iterations_before: u64,
    /// Iterations of the current phase finished at the snapshot (for progress reports).
    pub iterations_done: u64,
    /// Iterations of the current phase.
    pub iterations_total: u64,
    /// Number of chunks of the current phase.
    pub chunks: u64,
    /// The schedule and chunking of the current phase in postcard (opaque here; the executor
    /// fills it).
    pub config: Vec<u8>,
    /// Chunks `0..merged` are folded into `reduced`.
    pub merged: u64,
    /// The reduction of chunks `0..merged` in postcard (opaque here).
    pub reduced: Vec<u8>,
    /// Outputs of done chunks at or above `merged`: `(chunk, postcard bytes of the output)`.
    pub done: Vec<(u64, Vec<u8>)>,
    /// Suspended chunk states, stored as parts. Every chunk in `merged..chunks` listed neither
    /// here nor in `done` is pending from scratch.
    pub parts: Vec<PartRef>,
    /// For a job with owned partitions: the partitions of done chunks (folded below
    /// `merged` or in `done`), which the next phase runs from, stored as parts.
    pub kept: Vec<PartRef>,
    /// The job's [`Job::VERSION`](crate::Job::VERSION): the serialized form of its values.
    pub job_version: u32,
    /// The [`Layout`] of the job's types that wrote this snapshot
    /// ([`Layout::of`]); `None` in a manifest of a format before 5, which did not record it.
    /// Checked on resume before any of the job's bytes are decoded
    /// ([`Manifest::check_layout`]).
    pub layout: Option<Layout>,
    /// The job value (postcard, opaque here) this run of the job was submitted with, as
    /// given to [`Executor::submit`](crate::Executor::submit) or
    /// [`Executor::submit_or_resume`](crate::Executor::submit_or_resume): not `job`, which
    /// [`Job::end_phase`](crate::Job::end_phase) changes. Carried from snapshot to snapshot
    /// and across resumes (a change the job accepted on resume,
    /// [`Job::resumed_with`](crate::Job::resumed_with), replaces it);
    /// `submit_or_resume` compares the job it is given with it. `None` in a manifest of a
    /// format before 6, and in a run resumed from one with
    /// [`Executor::resume`](crate::Executor::resume).
    pub submitted: Option<Vec<u8>>,
    /// The job's dimensions that its chunk plan does not show, fixed for the job (for a
    /// [`Rows`](crate::Rows) grid: its height, bands, rows per band, width and element
    /// size), checked on resume against the resuming program's; empty for a job that has
    /// none and in a manifest of a format before 6.
    pub shape: Vec<Dimension>,
}

/// One dimension of a job's shape ([`Manifest::shape`]): a name and a size.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Dimension {
    /// What it measures, with its unit: `"width (cells per row)"`.
    pub what: String,
    /// Its size.
    pub value: u64,
}

impl Default for Manifest {
    /// An empty manifest of this build's format, for building one field by field.
    fn default() -> Manifest {
        Manifest {
            format_version: FORMAT_VERSION,
            job_name: String::new(),
            job_id: String::new(),
            epoch: 0,
            created_unix_ms: 0,
            job: Vec::new(),
            phase: 0,
            iterations_before: 0,
            iterations_done: 0,
            iterations_total: 0,
            chunks: 0,
            config: Vec::new(),
            merged: 0,
            reduced: Vec::new(),
            done: Vec::new(),
            parts: Vec::new(),
            kept: Vec::new(),
            job_version: 1,
            layout: None,
            submitted: None,
            shape: Vec::new(),
        }
    }
}

/// [`Manifest`] as formats 3 and 4 wrote it (without `layout`), and the start of a body of
/// format 5 (which is this, then `layout`).
#[derive(Deserialize)]
struct ManifestV3 {
    // Checked against the header's version before the body is decoded.
    _format_version: u32,
    job_name: String,
    job_id: String,
    epoch: u64,
    created_unix_ms: u64,
    job: Vec<u8>,
    phase: u64,
    iterations_before: u64,
    iterations_done: u64,
    iterations_total: u64,
    chunks: u64,
    config: Vec<u8>,
    merged: u64,
    reduced: Vec<u8>,
    done: Vec<(u64, Vec<u8>)>,
    parts: Vec<PartRef>,
    kept: Vec<PartRef>,
    job_version: u32,
}

impl ManifestV3 {
    /// This manifest of format 3, 4 or 5 (`layout` is 5's last field) as this build's.
    fn upgrade(self, layout: Option<Layout>) -> Manifest {
        let ManifestV3 {
            _format_version: _,
            job_name,
            job_id,
            epoch,
            created_unix_ms,
            job,
            phase,
            iterations_before,
            iterations_done,
            iterations_total,
            chunks,
            config,
            merged,
            reduced,
            done,
            parts,
            kept,
            job_version,
        } = self;
        Manifest {
            format_version: FORMAT_VERSION,
            job_name,
            job_id,
            epoch,
            created_unix_ms,
            job,
            phase,
            iterations_before,
            iterations_done,
            iterations_total,
            chunks,
            config,
            merged,
            reduced,
            done,
            parts,
            kept,
            job_version,
            layout,
            submitted: None,
            shape: Vec::new(),
        }
    }
}

/// [`Manifest`] as format version 2 wrote it (without `job_version`).
#[derive(Deserialize)]
struct ManifestV2 {
    // Checked against the header's version before the body is decoded (every body starts
    // with its format version).
    _format_version: u32,
    job_name: String,
    job_id: String,
    epoch: u64,
    created_unix_ms: u64,
    job: Vec<u8>,
    phase: u64,
    iterations_before: u64,
    iterations_done: u64,
    iterations_total: u64,
    chunks: u64,
    config: Vec<u8>,
    merged: u64,
    reduced: Vec<u8>,
    done: Vec<(u64, Vec<u8>)>,
    parts: Vec<PartRef>,
    kept: Vec<PartRef>,
}

impl ManifestV2 {
    fn upgrade(self) -> Manifest {
        let ManifestV2 {
            _format_version: _,
            job_name,
            job_id,
            epoch,
            created_unix_ms,
            job,
            phase,
            iterations_before,
            iterations_done,
            iterations_total,
            chunks,
            config,
            merged,
            reduced,
            done,
            parts,
            kept,
        } = self;
        Manifest {
            format_version: FORMAT_VERSION,
            job_name,
            job_id,
            epoch,
            created_unix_ms,
            job,
            phase,
            iterations_before,
            iterations_done,
            iterations_total,
            chunks,
            config,
            merged,
            reduced,
            done,
            parts,
            kept,
            job_version: 1,
            layout: None,
            submitted: None,
            shape: Vec::new(),
        }
    }
}

/// A reference from a manifest to one part: a suspended chunk's state stored as its own
/// object.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PartRef {
    /// The chunk whose state this is.
    pub chunk: u64,
    /// The object's key, relative to the store's prefix (`{job_id}/{epoch:020}/parts/…`; an
    /// incremental snapshot may reference a part that an earlier epoch wrote).
    pub key: String,
    /// The object's size in bytes.
    pub size: u64,
    /// CRC-32C (Castagnoli) of the object's bytes.
    pub crc32c: u32,
}

impl Manifest {
    /// Checks that this snapshot is of the job named `name` ([`Job::NAME`](crate::Job::NAME)).
    ///
    /// # Errors
    ///
    /// [`Error::WrongJob`] when it is of another job.
    pub fn check_job(&self, name: &str) -> Result<()> {
        if self.job_name == name {
            Ok(())
        } else {
            Err(Error::WrongJob {
                expected: name.to_owned(),
                found: self.job_name.clone(),
            })
        }
    }

    /// Checks that this snapshot was written by the same version of the job's code
    /// ([`Job::VERSION`](crate::Job::VERSION)) as `version`: another version's values may
    /// not decode, or decode into something else.
    ///
    /// # Errors
    ///
    /// [`Error::WrongJobVersion`] when the versions differ.
    pub fn check_job_version(&self, version: u32) -> Result<()> {
        if self.job_version == version {
            Ok(())
        } else {
            Err(Error::WrongJobVersion {
                job: self.job_name.clone(),
                snapshot: self.job_version,
                code: version,
            })
        }
    }

    /// Checks that this snapshot was written by code whose types have the serialized layout
    /// `code` ([`Layout::of`] the resuming job): bytes of other types could decode into the
    /// wrong fields without an error. Call it before decoding any of the job's bytes.
    ///
    /// A manifest without a layout (written before format 5) and a layout that is not traced
    /// on either side ([`Layout::untraceable`]) are not checked; that is logged (`tracing`,
    /// info).
    ///
    /// # Errors
    ///
    /// [`Error::LayoutChanged`] when the layouts differ, naming the snapshot, both
    /// fingerprints and the first entry that differs.
    pub fn check_layout(&self, code: &Layout) -> Result<()> {
        let id = SnapshotId::new(self.job_id.clone(), self.epoch);
        let Some(written) = &self.layout else {
            tracing::info!(
                snapshot = %id,
                "the snapshot was written before snapshots recorded the layout of the job's \
                 types: the layout is not checked"
            );
            return Ok(());
        };
        if !written.is_traced() || !code.is_traced() {
            tracing::info!(
                snapshot = %id,
                snapshot_traced = written.is_traced(),
                program_traced = code.is_traced(),
                "the layout of the job's types could not be traced: it is not checked"
            );
            return Ok(());
        }
        match written.first_difference(code) {
            None => Ok(()),
            Some(difference) => Err(Error::LayoutChanged {
                snapshot: id,
                job: self.job_name.clone(),
                written: written.fingerprint(),
                code: code.fingerprint(),
                difference,
            }),
        }
    }

    /// Checks the invariants of the format that the types alone do not hold (see the
    /// [module docs](self)).
    ///
    /// # Errors
    ///
    /// [`Error::UnsupportedVersion`] for a `format_version` other than [`FORMAT_VERSION`],
    /// [`Error::Inconsistent`] for the rest.
    pub fn check_consistent(&self) -> Result<()> {
        if self.format_version != FORMAT_VERSION {
            return Err(Error::UnsupportedVersion {
                found: self.format_version,
                supported: FORMAT_VERSION,
            });
        }
        let inconsistent = |what: String| Err(Error::Inconsistent(what));
        if self.merged > self.chunks {
            return inconsistent(format!(
                "{} chunks merged but the phase has {} chunks",
                self.merged, self.chunks
            ));
        }
        if self.iterations_done > self.iterations_total {
            return inconsistent(format!(
                "{} iterations done of a phase of {}",
                self.iterations_done, self.iterations_total
            ));
        }
        let chunks = self.done.iter().map(|(chunk, _)| ("done", *chunk));
        let chunks = chunks.chain(self.parts.iter().map(|part| ("parts", part.chunk)));
        let mut seen = HashSet::with_capacity(self.done.len() + self.parts.len());
        for (list, chunk) in chunks {
            if chunk >= self.chunks {
                return inconsistent(format!(
                    "chunk {chunk} in {list} is out of range (the phase has {} chunks)",
                    self.chunks
                ));
            }
            if chunk < self.merged {
                return inconsistent(format!(
                    "chunk {chunk} in {list} is already merged (merged: {})",
                    self.merged
                ));
            }
            if !seen.insert(chunk) {
                return inconsistent(format!("chunk {chunk} is listed twice in done and parts"));
            }
        }
        let mut kept = HashSet::with_capacity(self.kept.len());
        for part in &self.kept {
            let chunk = part.chunk;
            let done = chunk < self.merged || self.done.iter().any(|(c, _)| *c == chunk);
            if chunk >= self.chunks || !done {
                return inconsistent(format!(
                    "the partition of chunk {chunk} is kept, but the chunk is not done"
                ));
            }
            if !kept.insert(chunk) {
                return inconsistent(format!("the partition of chunk {chunk} is kept twice"));
            }
        }
        let mut keys = HashSet::with_capacity(self.parts.len() + self.kept.len());
        for part in self.all_parts() {
            if !keys.insert(part.key.as_str()) {
                return inconsistent(format!("part key {:?} is listed twice", part.key));
            }
        }
        Ok(())
    }

    /// Total size in bytes of the parts this manifest references.
    pub fn parts_size(&self) -> u64 {
        self.all_parts()
            .fold(0u64, |sum, part| sum.saturating_add(part.size))
    }

    /// Every part this manifest references: chunk states, then kept partitions.
    pub fn all_parts(&self) -> impl Iterator<Item = &PartRef> {
        self.parts.iter().chain(&self.kept)
    }
}

/// Encodes a manifest file: header, then body (see the [layout](self#manifest-file-layout)).
///
/// The header carries [`FORMAT_VERSION`] (this build's), whatever `manifest.format_version`
/// says; [`decode_manifest`] refuses a file where the two disagree.
///
/// # Panics
///
/// Never: postcard fails only for types that [`Manifest`] does not contain (sequences of
/// unknown length, a full fixed buffer).
pub fn encode_manifest(manifest: &Manifest) -> Vec<u8> {
    let body = postcard::to_allocvec(manifest)
        .expect("postcard encodes strings, integers and vectors into a Vec infallibly");
    frame(FORMAT_VERSION, &body)
}

/// Decodes and checks a manifest file (see the [layout](self#manifest-file-layout)).
///
/// Reads manifests of formats [`OLDEST_FORMAT_VERSION`] to [`FORMAT_VERSION`], and returns
/// them upgraded to [`FORMAT_VERSION`].
///
/// # Errors
///
/// In the order the checks run: [`Error::BadMagic`], [`Error::Truncated`] (the input ends
/// inside the header or the body), [`Error::TrailingBytes`], [`Error::Checksum`] (the bytes
/// were damaged, whichever field the damage hit, the version included),
/// [`Error::UnsupportedVersion`] (a file of another format, whose checksum verifies),
/// [`Error::Decode`] (the body does not decode, or not exactly), and [`Error::Inconsistent`]
/// (the body's version is not the header's, or see [`Manifest::check_consistent`]).
pub fn decode_manifest(bytes: &[u8]) -> Result<Manifest> {
    const WHAT: &str = "snapshot manifest";
    let mut reader = Reader { bytes, at: 0 };

    // Order must match `frame`.
    // Magic: a short input that is a prefix of the magic is truncated, anything else is bad.
    let magic = &bytes[..bytes.len().min(MAGIC.len())];
    if magic != &MAGIC[..magic.len()] {
        return Err(Error::BadMagic {
            found: magic.to_vec(),
        });
    }
    reader.take::<8>(WHAT)?;
    // Format version: not trusted before the checksum verifies (a damaged version is
    // damage, not a later format).
    let version = u32::from_le_bytes(reader.take::<4>(WHAT)?);
    // Body length and checksum.
    let body_len = u64::from_le_bytes(reader.take::<8>(WHAT)?);
    let expected_crc = u32::from_le_bytes(reader.take::<4>(WHAT)?);
    // Body: exactly `body_len` bytes, then the end of the file.
    let rest = reader.rest();
    let got = rest.len() as u64;
    if got < body_len {
        return Err(Error::Truncated {
            what: WHAT,
            needed: (HEADER_LEN as u64).saturating_add(body_len),
            got: bytes.len() as u64,
        });
    }
    if got > body_len {
        return Err(Error::TrailingBytes {
            what: WHAT,
            extra: got - body_len,
        });
    }
    let body = rest;
    let mut header = [0; CHECKED_HEADER_LEN];
    header.copy_from_slice(&bytes[..CHECKED_HEADER_LEN]);
    let found_crc = checksum(version, &header, body);
    if found_crc != expected_crc {
        let what = if BODY_CHECKSUM_ONLY.contains(&version) {
            "snapshot manifest body"
        } else {
            "snapshot manifest (header and body)"
        };
        return Err(Error::Checksum {
            what: what.to_owned(),
            expected: expected_crc,
            found: found_crc,
        });
    }
    let decode_error = |source| Error::Decode {
        what: "snapshot manifest body".to_owned(),
        source,
    };
    // The bytes are as their writer wrote them. A format this crate wrote starts its body
    // with the format version: the header's must be the same (for formats 1 to 3 the header
    // is not under the checksum).
    if (1..=FORMAT_VERSION).contains(&version) {
        let (in_body, _): (u32, _) = postcard::take_from_bytes(body).map_err(decode_error)?;
        if in_body != version {
            return Err(Error::Inconsistent(format!(
                "the header says format version {version}, the body {in_body}"
            )));
        }
    }
    if !(OLDEST_FORMAT_VERSION..=FORMAT_VERSION).contains(&version) {
        return Err(Error::UnsupportedVersion {
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    let (manifest, left) = match version {
        2 => {
            let (old, left): (ManifestV2, _) =
                postcard::take_from_bytes(body).map_err(decode_error)?;
            (old.upgrade(), left)
        }
        // Format 4 changed the checksum's coverage only.
        3 | 4 => {
            let (old, left): (ManifestV3, _) =
                postcard::take_from_bytes(body).map_err(decode_error)?;
            (old.upgrade(None), left)
        }
        // Format 5 is format 4's body, then the layout.
        5 => {
            let (old, left): (ManifestV3, _) =
                postcard::take_from_bytes(body).map_err(decode_error)?;
            let (layout, left) = postcard::take_from_bytes(left).map_err(decode_error)?;
            (old.upgrade(layout), left)
        }
        _ => postcard::take_from_bytes(body).map_err(decode_error)?,
    };
    if !left.is_empty() {
        return Err(Error::TrailingBytes {
            what: "snapshot manifest body",
            extra: left.len() as u64,
        });
    }
    manifest.check_consistent()?;
    Ok(manifest)
}

/// Checks a part's bytes against the manifest's reference to it: size first, then CRC-32C.
///
/// # Errors
///
/// [`Error::Size`] when the size differs, [`Error::Checksum`] when the checksum does.
pub fn check_part(bytes: &[u8], part: &PartRef) -> Result<()> {
    let size = bytes.len() as u64;
    if size != part.size {
        return Err(Error::Size {
            what: format!("part {:?} (chunk {})", part.key, part.chunk),
            expected: part.size,
            found: size,
        });
    }
    let found = crc32c::crc32c(bytes);
    if found != part.crc32c {
        return Err(Error::Checksum {
            what: format!("part {:?} (chunk {})", part.key, part.chunk),
            expected: part.crc32c,
            found,
        });
    }
    Ok(())
}

/// Reads fixed-size fields from the front of a byte slice, with a typed error at its end.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N]> {
        let end = self.at.saturating_add(N);
        match self.bytes.get(self.at..end) {
            Some(field) => {
                self.at = end;
                let mut out = [0; N];
                out.copy_from_slice(field);
                Ok(out)
            }
            None => Err(Error::Truncated {
                what,
                needed: HEADER_LEN as u64,
                got: self.bytes.len() as u64,
            }),
        }
    }

    fn rest(&self) -> &'a [u8] {
        self.bytes.get(self.at..).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        Manifest {
            format_version: FORMAT_VERSION,
            job_name: "basel".to_owned(),
            job_id: "run-1".to_owned(),
            epoch: 3,
            created_unix_ms: 1_700_000_000_000,
            job: vec![1, 2, 3],
            phase: 1,
            iterations_before: 1000,
            iterations_done: 40,
            iterations_total: 100,
            chunks: 10,
            config: vec![9],
            merged: 2,
            reduced: vec![0; 8],
            done: vec![(2, vec![7; 8]), (5, vec![])],
            parts: vec![PartRef {
                chunk: 3,
                key: "run-1/00000000000000000003/parts/1-3-00ff".to_owned(),
                size: 4,
                crc32c: crc32c::crc32c(b"abcd"),
            }],
            kept: vec![PartRef {
                chunk: 2,
                key: "run-1/00000000000000000003/parts/1-2-00ff".to_owned(),
                size: 2,
                crc32c: crc32c::crc32c(b"ef"),
            }],
            job_version: 1,
            layout: Some(Layout::from_entries(vec![
                "job: Basel".to_owned(),
                "Basel.n: u64".to_owned(),
            ])),
            submitted: Some(vec![4, 5, 6]),
            shape: vec![Dimension {
                what: "width (cells per row)".to_owned(),
                value: 40,
            }],
        }
    }

    #[test]
    fn a_manifest_of_format_version_2_reads_as_job_version_1() {
        // Version 2's body: the same fields without `job_version`, written field for field.
        #[derive(Serialize)]
        struct V2<'a>(
            u32,
            &'a str,
            &'a str,
            u64,
            u64,
            &'a [u8],
            u64,
            u64,
            u64,
            u64,
            u64,
            &'a [u8],
            u64,
            &'a [u8],
            &'a [(u64, Vec<u8>)],
            &'a [PartRef],
            &'a [PartRef],
        );
        let m = sample();
        let body = postcard::to_allocvec(&V2(
            2,
            &m.job_name,
            &m.job_id,
            m.epoch,
            m.created_unix_ms,
            &m.job,
            m.phase,
            m.iterations_before,
            m.iterations_done,
            m.iterations_total,
            m.chunks,
            &m.config,
            m.merged,
            &m.reduced,
            &m.done,
            &m.parts,
            &m.kept,
        ))
        .unwrap();
        let file = frame(2, &body);
        // The header of format 2 is that of format 4, but its checksum covers the body only.
        assert_eq!(file[20..24], crc32c::crc32c(&body).to_le_bytes());
        let read = decode_manifest(&file).unwrap();
        assert_eq!(
            read,
            Manifest {
                job_version: 1,
                layout: None,
                submitted: None,
                shape: Vec::new(),
                ..m.clone()
            }
        );
        // The header's version is checked against the body's.
        let mut relabeled = file.clone();
        relabeled[8..12].copy_from_slice(&1u32.to_le_bytes());
        assert!(matches!(
            decode_manifest(&relabeled),
            Err(Error::Inconsistent(_))
        ));
        // A file of format 1 (its body starts with its version too) is still refused.
        let mut body1 = body.clone();
        body1[0] = 1;
        assert!(matches!(
            decode_manifest(&frame(1, &body1)),
            Err(Error::UnsupportedVersion { found: 1, .. })
        ));
    }

    /// A manifest as format 3 (or 4) wrote it: the body of this format without the layout,
    /// the submitted job and the shape, the checksum over the body only (for 3) or the header
    /// and the body (for 4).
    fn format_3(m: &Manifest, version: u32) -> Vec<u8> {
        let mut body = postcard::to_allocvec(&Manifest {
            format_version: version,
            layout: None,
            submitted: None,
            shape: Vec::new(),
            ..m.clone()
        })
        .unwrap();
        // The last fields, `layout`, `submitted` (both `None`) and `shape` (empty): a 0 byte
        // each, which formats 3 and 4 did not have.
        assert_eq!(body.split_off(body.len() - 3), [0, 0, 0]);
        frame(version, &body)
    }

    /// A manifest as format 5 wrote it: the body of this format without the submitted job
    /// and the shape.
    fn format_5(m: &Manifest) -> Vec<u8> {
        let mut body = postcard::to_allocvec(&Manifest {
            format_version: 5,
            submitted: None,
            shape: Vec::new(),
            ..m.clone()
        })
        .unwrap();
        assert_eq!(body.split_off(body.len() - 2), [0, 0]);
        frame(5, &body)
    }

    #[test]
    fn a_manifest_of_format_version_5_reads_without_a_submitted_job_or_a_shape() {
        let m = sample();
        let file = format_5(&m);
        let old = Manifest {
            submitted: None,
            shape: Vec::new(),
            ..m.clone()
        };
        assert!(old.layout.is_some());
        assert_eq!(decode_manifest(&file).unwrap(), old);
        every_mutation_is_damage(&file);
    }

    #[test]
    fn a_manifest_of_format_version_3_or_4_still_reads_without_a_layout() {
        let m = sample();
        let file = format_3(&m, 3);
        assert_eq!(file[8..12], 3u32.to_le_bytes());
        assert_eq!(file[20..24], crc32c::crc32c(&file[24..]).to_le_bytes());
        let old = Manifest {
            layout: None,
            submitted: None,
            shape: Vec::new(),
            ..m.clone()
        };
        assert_eq!(decode_manifest(&file).unwrap(), old);
        assert_eq!(decode_manifest(&format_3(&m, 4)).unwrap(), old);
    }

    #[test]
    fn the_checksum_covers_the_header() {
        let bytes = encode_manifest(&sample());
        let whole = crc32c::crc32c(&[&bytes[..20], &bytes[24..]].concat());
        assert_eq!(bytes[20..24], whole.to_le_bytes());
    }

    /// Every mutation of one byte of `file` (each of its bits flipped alone, and all of them)
    /// is damage: never `Ok`, never a later format, never a panic.
    fn every_mutation_is_damage(file: &[u8]) {
        for i in 0..file.len() {
            let masks = (0..8).map(|bit| 1u8 << bit).chain([0xff]);
            for mask in masks {
                let mut b = file.to_vec();
                b[i] ^= mask;
                match decode_manifest(&b) {
                    Err(e) => assert!(
                        e.damage_check().is_some(),
                        "byte {i} ^ {mask:#04x}: {e:?} is not damage"
                    ),
                    Ok(m) => panic!("byte {i} ^ {mask:#04x} decodes: {m:?}"),
                }
            }
        }
    }

    #[test]
    fn every_mutation_of_a_byte_is_damage() {
        every_mutation_is_damage(&encode_manifest(&sample()));
        // And of a manifest of the previous format, whose header is not under the checksum.
        every_mutation_is_damage(&format_3(&sample(), 3));
    }

    #[test]
    fn a_flipped_version_is_damage_a_later_version_is_not() {
        let bytes = encode_manifest(&sample());
        // The flip that made format 3's "version 1027": damage, named as a checksum failure.
        let mut b = bytes.clone();
        b[9] ^= 0x04;
        assert_eq!(
            u32::from_le_bytes(b[8..12].try_into().unwrap()),
            FORMAT_VERSION + 1024
        );
        let e = decode_manifest(&b).unwrap_err();
        assert!(matches!(e, Error::Checksum { .. }), "{e:?}");
        assert_eq!(e.damage_check(), Some(super::super::Check::Checksum));
        // A later format whose checksum verifies is a later format.
        let body = &bytes[HEADER_LEN..];
        let later = frame(FORMAT_VERSION + 1, body);
        assert!(matches!(
            decode_manifest(&later),
            Err(Error::UnsupportedVersion { found, supported: FORMAT_VERSION })
                if found == FORMAT_VERSION + 1
        ));
        // Version 0 was never written; with a checksum that verifies it is another format,
        // with one that does not, damage.
        assert!(matches!(
            decode_manifest(&frame(0, body)),
            Err(Error::UnsupportedVersion { found: 0, .. })
        ));
        let mut b = bytes.clone();
        b[8..12].copy_from_slice(&0u32.to_le_bytes());
        assert!(matches!(decode_manifest(&b), Err(Error::Checksum { .. })));
    }

    #[test]
    fn another_job_version_is_refused_naming_both() {
        let m = Manifest {
            job_version: 3,
            ..sample()
        };
        m.check_job_version(3).unwrap();
        let e = m.check_job_version(4).unwrap_err();
        assert!(matches!(
            e,
            Error::WrongJobVersion {
                snapshot: 3,
                code: 4,
                ..
            }
        ));
        let text = e.to_string();
        assert!(
            text.contains("version 3") && text.contains("version 4"),
            "{text}"
        );
        assert!(text.contains("Job::VERSION"), "{text}");
    }

    #[test]
    fn round_trip() {
        let m = sample();
        let bytes = encode_manifest(&m);
        assert_eq!(&bytes[..8], b"MLBLSNAP");
        assert_eq!(decode_manifest(&bytes).unwrap(), m);
    }

    #[test]
    fn header_is_little_endian() {
        let bytes = encode_manifest(&sample());
        assert_eq!(bytes[8..12], FORMAT_VERSION.to_le_bytes());
        let len = u64::from_le_bytes(bytes[12..20].try_into().unwrap());
        assert_eq!(len as usize, bytes.len() - HEADER_LEN);
    }

    #[test]
    fn every_truncation_is_an_error() {
        let bytes = encode_manifest(&sample());
        for n in 0..bytes.len() {
            match decode_manifest(&bytes[..n]) {
                Err(Error::Truncated { got, .. }) => assert_eq!(got, n as u64),
                other => panic!("prefix of {n} bytes: {other:?}"),
            }
        }
    }

    #[test]
    fn typed_errors() {
        let bytes = encode_manifest(&sample());
        let mut b = bytes.clone();
        b[0] = b'X';
        assert!(matches!(decode_manifest(&b), Err(Error::BadMagic { .. })));
        assert!(matches!(
            decode_manifest(b"nope"),
            Err(Error::BadMagic { .. })
        ));
        let later = frame(FORMAT_VERSION + 1, &bytes[HEADER_LEN..]);
        assert!(matches!(
            decode_manifest(&later),
            Err(Error::UnsupportedVersion {
                found: 7,
                supported: 6
            })
        ));
        let mut b = bytes.clone();
        b[8..12].copy_from_slice(&7u32.to_le_bytes());
        assert!(matches!(decode_manifest(&b), Err(Error::Checksum { .. })));
        let mut b = bytes.clone();
        b.push(0);
        assert!(matches!(
            decode_manifest(&b),
            Err(Error::TrailingBytes { extra: 1, .. })
        ));
        let mut b = bytes.clone();
        let last = b.len() - 1;
        b[last] ^= 0x40;
        assert!(matches!(decode_manifest(&b), Err(Error::Checksum { .. })));
        // A body that passes the checksum but does not decode.
        let b = frame(FORMAT_VERSION, &[0xff; 3]);
        assert!(matches!(decode_manifest(&b), Err(Error::Decode { .. })));
        // A huge announced body length is truncation, not an allocation.
        let mut b = bytes[..HEADER_LEN].to_vec();
        b[12..20].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            decode_manifest(&b),
            Err(Error::Truncated {
                needed: u64::MAX,
                ..
            })
        ));
    }

    #[test]
    fn inconsistent_manifests_are_refused() {
        let cases: Vec<fn(&mut Manifest)> = vec![
            |m| m.merged = 11,
            |m| m.iterations_done = 101,
            |m| m.done.push((10, vec![])),
            |m| m.done.push((1, vec![])),
            |m| m.done.push((3, vec![])),
            |m| m.done.push((2, vec![])),
            |m| {
                let mut p = m.parts[0].clone();
                p.chunk = 4;
                m.parts.push(p);
            },
        ];
        for (i, case) in cases.into_iter().enumerate() {
            let mut m = sample();
            case(&mut m);
            let bytes = encode_manifest(&m);
            assert!(
                matches!(decode_manifest(&bytes), Err(Error::Inconsistent(_))),
                "case {i}"
            );
        }
        let mut m = sample();
        m.format_version = 8;
        let bytes = encode_manifest(&m);
        assert!(matches!(
            decode_manifest(&bytes),
            Err(Error::Inconsistent(_))
        ));
    }

    #[test]
    fn the_layout_is_checked_when_both_sides_have_one() {
        let m = sample();
        let same = m.layout.clone().unwrap();
        m.check_layout(&same).unwrap();
        let other = Layout::from_entries(vec!["job: Basel".to_owned(), "Basel.m: u64".to_owned()]);
        match m.check_layout(&other) {
            Err(Error::LayoutChanged {
                snapshot,
                written,
                code,
                difference,
                ..
            }) => {
                assert_eq!(snapshot, SnapshotId::new("run-1", 3));
                assert_eq!((written, code), (same.fingerprint(), other.fingerprint()));
                assert!(difference.contains("`Basel.n: u64`"), "{difference}");
                assert!(difference.contains("`Basel.m: u64`"), "{difference}");
            }
            r => panic!("expected LayoutChanged, got {r:?}"),
        }
        // Not recorded (an older format), or not traced on either side: not checked.
        let old = Manifest {
            layout: None,
            ..sample()
        };
        old.check_layout(&other).unwrap();
        m.check_layout(&Layout::untraceable()).unwrap();
        let untraced = Manifest {
            layout: Some(Layout::untraceable()),
            ..sample()
        };
        untraced.check_layout(&other).unwrap();
    }

    #[test]
    fn job_name_is_checked() {
        let m = sample();
        m.check_job("basel").unwrap();
        match m.check_job("other") {
            Err(Error::WrongJob { expected, found }) => {
                assert_eq!((expected.as_str(), found.as_str()), ("other", "basel"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn parts_are_checked() {
        let part = sample().parts[0].clone();
        check_part(b"abcd", &part).unwrap();
        assert!(matches!(
            check_part(b"abc", &part),
            Err(Error::Size {
                expected: 4,
                found: 3,
                ..
            })
        ));
        assert!(matches!(
            check_part(b"abce", &part),
            Err(Error::Checksum { .. })
        ));
    }
}
