//! Which chunk states are still the bytes of the snapshot the run was restored from: a
//! restored state that does not decode where it is decoded ends the job with an error that
//! names that snapshot ([`snapshot::Error::Undecodable`]), not only "a chunk state".
//!
//! A restored chunk state is decoded late, where it is needed: by the worker that runs the
//! chunk next (a local thread, or a worker process), by the worker process it is placed on
//! after a rollback, or by the coordinator (at a barrier, `job_run.rs`, or at the end of the
//! job, `finish.rs`). By then the snapshot is long read and checked (its layout included);
//! what fails is this program's `Deserialize` of the chunk type on bytes of the same layout
//! (a custom `Deserialize` that changed), and the user needs to know which snapshot holds
//! them.
//!
//! # What counts as the snapshot's bytes
//!
//! 1. *Restore.* At a resume or a rollback, every chunk with a part in the snapshot (a
//!    suspended chunk state or a kept partition) is *untouched*: the ledger holds the
//!    snapshot's bytes for it.
//! 2. *Hand-out.* When a chunk is handed to a worker (`Snapshots::on_run`, also at a barrier
//!    for every kept partition), it is untouched no more, and *handed* records whether this
//!    hand-out carried the snapshot's bytes (it did if the chunk was untouched).
//! 3. *Blame.* A chunk state of chunk `c` that does not decode (a local worker's lost chunk,
//!    a worker process's `Failed` or `FailedHeld`, the coordinator's own decode at the end)
//!    is the snapshot's if `c` is untouched or handed.
//!
//! Why a hand-out is the only event needed: a chunk gets a new state only from a worker it
//! was handed to (`Yielded`, `Done` with its partition, `Surrendered`), so the state of a
//! later hand-out is not the snapshot's, and that hand-out clears *handed*. Two
//! approximations, both towards the error the job had before: a chunk handed out again with
//! the same snapshot bytes (its worker process was lost before it reported, and the ledger
//! fell back to the state it sent) is no longer blamed on the snapshot; and bytes a worker
//! process re-encoded from a partition it decoded from the snapshot (moved to another worker
//! before its next run) count as the snapshot's, which matters only for a chunk whose
//! `Deserialize` does not read what its `Serialize` writes.
//!
//! Only decoding errors are blamed ([`decoding`]): a state that does not *encode* (a capture,
//! a yield) is this program's, whatever it was restored from.

use crate::error::Error;
use crate::schedule::ChunkId;
use crate::schedule::idhash::IdSet;
use crate::snapshot::{self, Manifest, SnapshotId};

/// The chunks whose state is still the bytes of the snapshot a run was restored from (see
/// the module's docs). Empty for a run that was not restored.
#[derive(Debug, Default)]
pub(crate) struct FromSnapshot {
    /// The snapshot restored from.
    snapshot: Option<SnapshotId>,
    /// Chunks not handed out since the restore: the ledger holds the snapshot's bytes.
    untouched: IdSet<ChunkId>,
    /// Chunks whose last hand-out carried the snapshot's bytes.
    handed: IdSet<ChunkId>,
}

impl FromSnapshot {
    /// The parts of `manifest` (its chunk states and kept partitions), restored from it.
    pub(crate) fn of(manifest: &Manifest) -> FromSnapshot {
        FromSnapshot::new(
            SnapshotId::new(manifest.job_id.clone(), manifest.epoch),
            manifest.all_parts().map(|p| p.chunk),
        )
    }

    /// The states of `chunks`, restored from `snapshot`.
    pub(crate) fn new(
        snapshot: SnapshotId,
        chunks: impl IntoIterator<Item = ChunkId>,
    ) -> FromSnapshot {
        FromSnapshot {
            snapshot: Some(snapshot),
            untouched: chunks.into_iter().collect(),
            handed: IdSet::default(),
        }
    }

    /// Step 2: `chunk` is handed to a worker (or, a kept partition, begins a phase).
    pub(crate) fn handed_out(&mut self, chunk: ChunkId) {
        if self.untouched.is_empty() && self.handed.is_empty() {
            return;
        }
        if self.untouched.remove(&chunk) {
            self.handed.insert(chunk);
        } else {
            self.handed.remove(&chunk);
        }
    }

    /// The snapshot whose bytes the state of `chunk` is, as it was last handed out or as
    /// the ledger holds it, if it is one's.
    pub(crate) fn snapshot_of(&self, chunk: ChunkId) -> Option<&SnapshotId> {
        let restored = self.untouched.contains(&chunk) || self.handed.contains(&chunk);
        self.snapshot.as_ref().filter(|_| restored)
    }

    /// Step 3: `error`, which lost `chunk`, as the snapshot's [`snapshot::Error::Undecodable`]
    /// if it is a chunk state that did not decode and that state was the snapshot's bytes;
    /// otherwise `error` itself. The codec's error stays the source.
    pub(crate) fn blame(&self, chunk: ChunkId, error: Error) -> Error {
        match error {
            Error::Codec { what: WHAT, source } if decoding(&source) => {
                match self.snapshot_of(chunk) {
                    Some(snapshot) => {
                        tracing::warn!(
                            chunk,
                            snapshot = %snapshot,
                            error = %source,
                            "a chunk state restored from a snapshot does not decode"
                        );
                        Error::Snapshot(snapshot::Error::Undecodable {
                            snapshot: snapshot.clone(),
                            what: WHAT,
                            source,
                        })
                    }
                    None => Error::Codec { what: WHAT, source },
                }
            }
            other => other,
        }
    }
}

/// What a chunk state is called in codec errors.
const WHAT: &str = "a chunk state";

/// Whether `e` is an error of decoding (not of encoding).
pub(crate) fn decoding(e: &postcard::Error) -> bool {
    use postcard::Error as E;
    match e {
        E::DeserializeUnexpectedEnd
        | E::DeserializeBadVarint
        | E::DeserializeBadBool
        | E::DeserializeBadChar
        | E::DeserializeBadUtf8
        | E::DeserializeBadOption
        | E::DeserializeBadEnum
        | E::DeserializeBadEncoding
        | E::DeserializeBadCrc
        | E::SerdeDeCustom => true,
        E::WontImplement
        | E::NotYetImplemented
        | E::SerializeBufferFull
        | E::SerializeSeqLengthUnknown
        | E::SerdeSerCustom
        | E::CollectStrError => false,
        // A variant of a later postcard: not known to be a decoding error.
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> SnapshotId {
        SnapshotId::new("heat", 7)
    }

    fn undecodable() -> Error {
        Error::Codec {
            what: WHAT,
            source: postcard::Error::SerdeDeCustom,
        }
    }

    /// The snapshot a `blame` of chunk `c` names, if any (and the source kept).
    fn blamed(f: &FromSnapshot, c: ChunkId) -> Option<SnapshotId> {
        match f.blame(c, undecodable()) {
            Error::Snapshot(snapshot::Error::Undecodable {
                snapshot,
                what: WHAT,
                source: postcard::Error::SerdeDeCustom,
            }) => Some(snapshot),
            Error::Codec {
                what: WHAT,
                source: postcard::Error::SerdeDeCustom,
            } => None,
            e => panic!("{e:?}"),
        }
    }

    #[test]
    fn a_restored_state_is_the_snapshots_until_its_chunk_is_handed_out_again() {
        let mut f = FromSnapshot::new(id(), [1, 3]);
        // Untouched: held by the ledger (placed, decoded at the end).
        assert_eq!(blamed(&f, 1), Some(id()));
        assert_eq!(blamed(&f, 3), Some(id()));
        assert_eq!(blamed(&f, 2), None, "not in the snapshot");
        // Handed out with the snapshot's bytes: its worker decodes them.
        f.handed_out(1);
        f.handed_out(2);
        assert_eq!(blamed(&f, 1), Some(id()));
        assert_eq!(blamed(&f, 2), None, "a fresh chunk");
        // Handed out again: with the state its worker reported since.
        f.handed_out(1);
        assert_eq!(blamed(&f, 1), None);
        f.handed_out(1);
        assert_eq!(blamed(&f, 1), None);
        assert_eq!(blamed(&f, 3), Some(id()), "another chunk is unchanged");
        f.handed_out(3);
        f.handed_out(3);
        assert_eq!(blamed(&f, 3), None);
        assert!(f.untouched.is_empty() && f.handed.is_empty());
    }

    #[test]
    fn a_run_not_restored_blames_no_snapshot() {
        let mut f = FromSnapshot::default();
        f.handed_out(0);
        assert_eq!(blamed(&f, 0), None);
        let empty = FromSnapshot::new(id(), []);
        assert_eq!(blamed(&empty, 0), None);
    }

    #[test]
    fn only_decoding_a_chunk_state_is_blamed() {
        let f = FromSnapshot::new(id(), [0]);
        // Encoding a restored chunk's state (a capture, a yield) is this program's.
        let encoding = Error::Codec {
            what: WHAT,
            source: postcard::Error::SerdeSerCustom,
        };
        assert!(matches!(
            f.blame(0, encoding),
            Error::Codec {
                source: postcard::Error::SerdeSerCustom,
                ..
            }
        ));
        // Other values, other errors: as they were.
        let output = Error::Codec {
            what: "a chunk output",
            source: postcard::Error::DeserializeUnexpectedEnd,
        };
        assert!(matches!(
            f.blame(0, output),
            Error::Codec {
                what: "a chunk output",
                ..
            }
        ));
        let panicked = Error::Panicked {
            job: "heat",
            site: crate::Site::Chunk { phase: 0, chunk: 0 },
            message: "boom".into(),
        };
        assert!(matches!(f.blame(0, panicked), Error::Panicked { .. }));
        // Every way postcard fails to read counts.
        for e in [
            postcard::Error::DeserializeUnexpectedEnd,
            postcard::Error::DeserializeBadVarint,
            postcard::Error::DeserializeBadEnum,
            postcard::Error::SerdeDeCustom,
        ] {
            assert!(decoding(&e), "{e:?}");
        }
    }

    #[test]
    fn the_error_names_the_snapshot_and_keeps_the_codec_error_as_its_source() {
        let f = FromSnapshot::new(id(), [4]);
        let e = f.blame(4, undecodable());
        assert_eq!(
            e.to_string(),
            "cannot decode a chunk state of snapshot heat@7 as this program's type"
        );
        let source = std::error::Error::source(&e).expect("a source");
        assert_eq!(
            source.downcast_ref::<postcard::Error>(),
            Some(&postcard::Error::SerdeDeCustom)
        );
    }
}
