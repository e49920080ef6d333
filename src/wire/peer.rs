//! Frames between worker processes of one job (stub until the peer transport lands).

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// A frame from the process that dialled (which sends halos) to the one it dialled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ToPeer {
    /// A halo partition `from` exported at the end of `phase` for partition `to`, which
    /// the receiver holds as far as the sender was told. Answered by `FromPeer::Ack`.
    Halo {
        /// The sender's number for it, quoted by the answer.
        seq: u64,
        /// The roster's generation the sender had.
        generation: u64,
        /// The phase that ended.
        phase: u64,
        /// The chunk that exported it.
        from: u64,
        /// The chunk it is for.
        to: u64,
        /// The halo's bytes.
        bytes: Bytes,
    },
    /// The sender is alive.
    Heartbeat,
    /// A piece of a message too long for one frame.
    Piece {
        /// Whether more pieces follow.
        more: bool,
        /// The piece.
        bytes: Bytes,
    },
}

/// A frame from the dialled process back to the one that dialled it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum FromPeer {
    /// `kept`: the receiver keeps the halo for its partition; otherwise it refused it.
    Ack {
        /// The `Halo`'s number.
        seq: u64,
        /// Whether it is kept.
        kept: bool,
    },
    /// The receiver is alive.
    Heartbeat,
    /// A piece of a message too long for one frame.
    Piece {
        /// Whether more pieces follow.
        more: bool,
        /// The piece.
        bytes: Bytes,
    },
}
