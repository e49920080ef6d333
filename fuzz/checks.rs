//! What each fuzz target does with one input, shared by the targets in `fuzz_targets/` and by
//! the corpus replay test (`tests/it/fuzz_corpus.rs`), so that the replay runs exactly the
//! targets' checks. Every function panics if a decoder misbehaves (a panic of its own, an
//! undocumented error, a value that does not round-trip) and returns whether the input
//! decoded.

#![allow(dead_code)]

use bytes::BytesMut;
use malleable::cluster::Error;
use malleable::cluster::frame::{
    self, PROTOCOL_VERSION, ToCoordinator, decode_to_coordinator, decode_to_worker, encode,
};
use malleable::cluster::handshake::{
    decode_hello, decode_proof, decode_reply, decode_welcome, decode_worker_layout,
};
use malleable::cluster::peer::{
    FromPeer, ToPeer, decode_from_peer, decode_peer_hello, decode_peer_proof, decode_peer_reply,
    decode_peer_welcome, decode_to_peer,
};
use malleable::snapshot::{
    FORMAT_VERSION, MAGIC, PartRef, check_part, decode_manifest, encode_manifest,
};
use serde::Serialize;
use tokio_util::codec::{Decoder, LengthDelimitedCodec};

/// The `manifest` target: a manifest file, or a 0 byte
/// and a body to frame with a correct header.
pub(crate) fn manifest_target(data: &[u8]) -> bool {
    let file = match data.split_first() {
        Some((0, body)) => framed(FORMAT_VERSION, body),
        _ => data.to_vec(),
    };
    match decode_manifest(&file) {
        Ok(manifest) => {
            let again = decode_manifest(&encode_manifest(&manifest)).unwrap();
            assert_eq!(again, manifest, "a decoded manifest must round-trip");
            true
        }
        Err(_) => false,
    }
}

/// The `part` target: recorded size (u64 LE), recorded
/// CRC-32C (u32 LE), then the part's bytes.
pub(crate) fn part_target(data: &[u8]) -> bool {
    let (size, crc, bytes) = match data.split_first_chunk::<12>() {
        Some((head, rest)) => {
            let (size, crc) = head.split_at(8);
            let size = u64::from_le_bytes(size.try_into().unwrap());
            let crc = u32::from_le_bytes(crc.try_into().unwrap());
            (size, crc, rest)
        }
        None => (0, 0, data),
    };
    let part = PartRef {
        chunk: 7,
        key: "job/00000000000000000001/parts/0-7-0000000000000000".to_owned(),
        size,
        crc32c: crc,
    };
    let matches = bytes.len() as u64 == size && crc32c::crc32c(bytes) == crc;
    let ok = check_part(bytes, &part).is_ok();
    assert_eq!(ok, matches);
    ok
}

/// The peer named in the cluster targets' errors.
pub(crate) const PEER: &str = "198.51.100.7:7070";
/// The maximum frame length of the `frame` target's codec: small, so that both sides of
/// it are in reach.
pub(crate) const LIMIT: usize = 1024;

/// A cluster decoder's result, checked as the targets check it: a decoded value re-encodes
/// (with `reencode`) to bytes that decode (with `decode`) to an equal value; an error is one
/// that `expected` accepts. True for a decoded value.
pub(crate) fn round_trip<T: PartialEq + std::fmt::Debug>(
    result: Result<T, Error>,
    reencode: impl Fn(&T) -> Vec<u8>,
    decode: impl Fn(&[u8]) -> Result<T, Error>,
    expected: fn(&Error) -> bool,
) -> bool {
    match result {
        Ok(value) => {
            let again = decode(&reencode(&value)).unwrap();
            assert_eq!(again, value, "a decoded message must round-trip");
            true
        }
        Err(e) => {
            assert!(expected(&e), "an unexpected error: {e:?}");
            false
        }
    }
}

pub(crate) fn malformed(e: &Error) -> bool {
    matches!(e, Error::Malformed { .. })
}

/// The errors of a first frame's decoder.
pub(crate) fn first_frame_error(e: &Error) -> bool {
    matches!(
        e,
        Error::NotAPeer { .. } | Error::Version { .. } | Error::Malformed { .. }
    )
}

/// A first frame: the magic and version, then the body.
pub(crate) fn versioned<T: Serialize>(body: &T) -> Vec<u8> {
    versioned_as(&frame::MAGIC, PROTOCOL_VERSION, body)
}

pub(crate) fn versioned_as<T: Serialize>(magic: &[u8], version: u32, body: &T) -> Vec<u8> {
    let mut out = magic.to_vec();
    out.extend_from_slice(&version.to_be_bytes());
    out.extend_from_slice(&encode(body));
    out
}

pub(crate) fn to_worker(body: &[u8]) -> bool {
    round_trip(
        decode_to_worker(PEER, body),
        |m| encode(m).to_vec(),
        |b| decode_to_worker(PEER, b),
        malformed,
    )
}

pub(crate) fn to_coordinator(body: &[u8]) -> bool {
    round_trip(
        decode_to_coordinator(PEER, body),
        |m| encode(m).to_vec(),
        |b| decode_to_coordinator(PEER, b),
        malformed,
    )
}

pub(crate) fn hello(frame: &[u8]) -> bool {
    round_trip(
        decode_hello(PEER, frame),
        versioned,
        |b| decode_hello(PEER, b),
        first_frame_error,
    )
}

/// The `frame` target: the input as a message to a worker,
/// as a message to the coordinator, and as a stream of length-delimited frames, each a message
/// to the coordinator or a hello. True if anything decoded.
pub(crate) fn frame_target(data: &[u8]) -> bool {
    let mut ok = to_worker(data);
    ok |= to_coordinator(data);
    let mut codec = LengthDelimitedCodec::builder()
        .length_field_type::<u32>()
        .max_frame_length(LIMIT)
        .new_codec();
    let mut stream = BytesMut::from(data);
    // Frames also go through the coordinator's assembler of pieced messages, whose buffer
    // never passes its limit.
    let mut pieces = frame::Assembler::new(4 * LIMIT);
    while let Ok(Some(frame)) = codec.decode(&mut stream) {
        assert!(frame.len() <= LIMIT, "a frame over the limit");
        ok |= to_coordinator(&frame);
        ok |= hello(&frame);
        match pieces.frame::<ToCoordinator>(PEER, frame.clone().freeze()) {
            Ok(_) => {}
            Err(Error::Malformed { .. } | Error::MessageTooLarge { .. }) => {
                pieces = frame::Assembler::new(4 * LIMIT);
            }
            Err(e) => panic!("an assembler error of another kind: {e:?}"),
        }
    }
    ok
}

/// The `handshake` target: the input as a first frame to
/// `decode_hello` and `decode_reply`, and as a body to `decode_proof`, `decode_welcome` and
/// `decode_worker_layout`. True if anything decoded.
pub(crate) fn handshake_target(data: &[u8]) -> bool {
    let mut ok = hello(data);
    ok |= round_trip(
        decode_reply(PEER, data),
        versioned,
        |b| decode_reply(PEER, b),
        first_frame_error,
    );
    ok |= round_trip(
        decode_proof(PEER, data),
        |m| encode(m).to_vec(),
        |b| decode_proof(PEER, b),
        malformed,
    );
    ok |= round_trip(
        decode_welcome(PEER, data),
        |m| encode(m).to_vec(),
        |b| decode_welcome(PEER, b),
        malformed,
    );
    ok |= round_trip(
        decode_worker_layout(PEER, data),
        |m| encode(m).to_vec(),
        |b| decode_worker_layout(PEER, b),
        malformed,
    );
    ok
}

/// The `peer` target (the links between worker processes, protocol 20): the input as a
/// first frame to `decode_peer_hello` and `decode_peer_reply`; as a body to
/// `decode_peer_proof`, `decode_peer_welcome`, `decode_to_peer` and `decode_from_peer`; and
/// as a stream of length-delimited frames (maximum [`LIMIT`]), each a message to a peer or
/// a peer's answer, through an assembler of each. True if anything decoded.
pub(crate) fn peer_target(data: &[u8]) -> bool {
    let mut ok = round_trip(
        decode_peer_hello(PEER, data),
        versioned,
        |b| decode_peer_hello(PEER, b),
        first_frame_error,
    );
    ok |= round_trip(
        decode_peer_reply(PEER, data),
        versioned,
        |b| decode_peer_reply(PEER, b),
        first_frame_error,
    );
    ok |= round_trip(
        decode_peer_proof(PEER, data),
        |m| encode(m).to_vec(),
        |b| decode_peer_proof(PEER, b),
        malformed,
    );
    ok |= round_trip(
        decode_peer_welcome(PEER, data),
        |m| encode(m).to_vec(),
        |b| decode_peer_welcome(PEER, b),
        malformed,
    );
    ok |= to_peer(data);
    ok |= from_peer(data);
    let mut codec = LengthDelimitedCodec::builder()
        .length_field_type::<u32>()
        .max_frame_length(LIMIT)
        .new_codec();
    let mut stream = BytesMut::from(data);
    let mut to = frame::Assembler::new(4 * LIMIT);
    let mut from = frame::Assembler::new(4 * LIMIT);
    while let Ok(Some(frame)) = codec.decode(&mut stream) {
        assert!(frame.len() <= LIMIT, "a frame over the limit");
        ok |= to_peer(&frame);
        ok |= from_peer(&frame);
        let frame = frame.freeze();
        match to.frame::<ToPeer>(PEER, frame.clone()) {
            Ok(_) => {}
            Err(Error::Malformed { .. } | Error::MessageTooLarge { .. }) => {
                to = frame::Assembler::new(4 * LIMIT);
            }
            Err(e) => panic!("an assembler error of another kind: {e:?}"),
        }
        match from.frame::<FromPeer>(PEER, frame) {
            Ok(_) => {}
            Err(Error::Malformed { .. } | Error::MessageTooLarge { .. }) => {
                from = frame::Assembler::new(4 * LIMIT);
            }
            Err(e) => panic!("an assembler error of another kind: {e:?}"),
        }
    }
    ok
}

pub(crate) fn to_peer(body: &[u8]) -> bool {
    round_trip(
        decode_to_peer(PEER, body),
        |m| encode(m).to_vec(),
        |b| decode_to_peer(PEER, b),
        malformed,
    )
}

pub(crate) fn from_peer(body: &[u8]) -> bool {
    round_trip(
        decode_from_peer(PEER, body),
        |m| encode(m).to_vec(),
        |b| decode_from_peer(PEER, b),
        malformed,
    )
}

/// A header and body with a correct checksum around an arbitrary body: from format 4 on
/// the checksum covers the header's first 20 bytes and the body, before it (formats 1 to 3)
/// the body only.
pub(crate) fn framed(version: u32, body: &[u8]) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    let crc = if (1..=3).contains(&version) {
        crc32c::crc32c(body)
    } else {
        crc32c::crc32c_append(crc32c::crc32c(&out), body)
    };
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(body);
    out
}
