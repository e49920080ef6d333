//! Halos that stay in their worker process are handed over live, not decoded again.
//!
//! A partition's halos (and exchange pieces) leave its compute thread as bytes: the protocol
//! machine (`machine.rs`) decides where each goes, and it deals in bytes only (it keeps one
//! for a partition of this process, pushes one to a peer, sends one up, logs them for a
//! replay). A halo kept here came back as the same bytes in its receiver's `Begin`, and the
//! I/O thread decoded them into a new value: on the 1 000² grid of short phases, decoding
//! was the largest part of a worker process's I/O thread's own code (BENCHMARKS.md, "Where a
//! phase goes in a worker process"), and in an all-to-all between two processes half of the
//! pieces a process receives are its own partitions'.
//!
//! So the compute thread keeps each piece it encoded beside its bytes ([`Live::keep`]), and
//! a `Begin` whose halo is *those very bytes* takes the piece instead of decoding them
//! ([`Live::take`]). The bytes stay the truth: whatever the machine does with a halo is done
//! with them, as before, and a halo that left the process is decoded from them wherever it
//! goes. Local threads hand pieces over live already; a worker process now does within itself
//! what they do, and the value a receiver sees is the value its sender exported in both.
//!
//! # Why a piece is only ever taken for its own bytes
//!
//! An entry is found by the address of its bytes' first byte, and holds a handle on those
//! bytes: while it is here, their memory cannot be freed, so no other bytes can start at
//! that address; bytes that start there with the same length are the same bytes, views of
//! one immutable buffer (a halo the machine kept, the same halo logged). Empty bytes have
//! no address of their own and are never kept.
//!
//! # Memory
//!
//! A halo that left the process (pushed, sent up, handed back with its partition) is not
//! taken here: its entry is dropped once its sender's runs are two phases past it (a `Begin`
//! of phase `p` takes the halos of phase `p - 1`), and so are the entries of phases a
//! rollback went back from. The entries hold at most two phases of a process's exports.

use std::collections::HashMap;

use bytes::Bytes;

use crate::exchange::Piece;

/// The pieces the partitions of this process exported, beside their bytes (module docs).
#[derive(Default)]
pub(super) struct Live {
    /// By the address of the bytes' first byte.
    entries: HashMap<usize, Entry>,
    /// The phase of the last pieces kept.
    phase: Option<u64>,
    /// Pieces taken live so far.
    taken: u64,
}

struct Entry {
    /// The bytes, kept alive so that their address stays theirs.
    bytes: Bytes,
    phase: u64,
    piece: Piece,
}

impl Live {
    /// `piece`, exported by a partition at the end of `phase` and encoded as `bytes`: kept
    /// until a `Begin` takes it for those bytes. A phase other than the last drops the
    /// entries of phases two or more before it, and those after it (a rollback).
    pub(super) fn keep(&mut self, phase: u64, bytes: &Bytes, piece: Piece) {
        if self.phase != Some(phase) {
            self.entries
                .retain(|_, e| e.phase <= phase && e.phase + 1 >= phase);
            self.phase = Some(phase);
        }
        // Only an owned piece: a shared one is the allgather's, read through other paths.
        if bytes.is_empty() || !matches!(piece, Piece::Own(_)) {
            return;
        }
        self.entries.insert(
            bytes.as_ptr() as usize,
            Entry {
                bytes: bytes.clone(),
                phase,
                piece,
            },
        );
    }

    /// The piece `bytes` are the encoding of, if these very bytes were kept here: taken.
    pub(super) fn take(&mut self, bytes: &Bytes) -> Option<Piece> {
        let key = bytes.as_ptr() as usize;
        if bytes.is_empty() || self.entries.get(&key)?.bytes.len() != bytes.len() {
            return None;
        }
        self.taken += 1;
        self.entries.remove(&key).map(|e| e.piece)
    }

    /// How many pieces were taken live so far.
    pub(super) fn taken(&self) -> u64 {
        self.taken
    }

    /// How many entries are kept.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(x: u64) -> Piece {
        Piece::Own(Box::new(x))
    }

    fn value(p: Piece) -> u64 {
        *p.get::<u64>().expect("a u64")
    }

    /// A piece is taken for its own bytes (or a view of them of the same length) once; bytes
    /// equal to them but elsewhere in memory, a shorter view, and empty bytes are not theirs.
    #[test]
    fn a_piece_is_taken_for_its_own_bytes_only_and_once() {
        let mut live = Live::default();
        let bytes = Bytes::from(vec![1u8, 2, 3, 4]);
        live.keep(5, &bytes, piece(7));
        let equal_elsewhere = Bytes::from(vec![1u8, 2, 3, 4]);
        assert!(live.take(&equal_elsewhere).is_none());
        assert!(live.take(&bytes.slice(0..2)).is_none(), "a shorter view");
        assert_eq!(live.take(&bytes.slice(0..4)).map(value), Some(7));
        assert!(live.take(&bytes).is_none(), "taken once");
        assert_eq!(live.taken(), 1);
        live.keep(5, &Bytes::new(), piece(8));
        assert!(live.take(&Bytes::new()).is_none());
        let shared = Piece::Shared(std::sync::Arc::new(9u64));
        let b = Bytes::from(vec![9u8]);
        live.keep(5, &b, shared);
        assert!(live.take(&b).is_none(), "a shared piece is not kept");
    }

    /// The entries of a phase stay while the next runs and go after; a phase before them (a
    /// rollback) drops the later ones. Kept bytes keep their memory, so an address is never
    /// another buffer's while its entry is here.
    #[test]
    fn entries_last_two_phases_and_a_rollback_drops_the_later_ones() {
        let mut live = Live::default();
        let (a, b, c) = (
            Bytes::from(vec![1u8; 8]),
            Bytes::from(vec![2u8; 8]),
            Bytes::from(vec![3u8; 8]),
        );
        live.keep(3, &a, piece(1));
        live.keep(4, &b, piece(2));
        assert_eq!(live.len(), 2);
        live.keep(5, &c, piece(3));
        assert_eq!(live.len(), 2, "phase 3's entry went");
        assert!(live.take(&a).is_none());
        assert_eq!(live.take(&b).map(value), Some(2));
        live.keep(2, &a, piece(4));
        assert_eq!(live.len(), 1, "phase 5's entry went with the rollback");
        assert!(live.take(&c).is_none());
        assert_eq!(live.take(&a).map(value), Some(4));
    }
}
