//! The cluster's message decoders and framing on arbitrary bytes: never a panic, only typed
//! errors; what decodes re-encodes to itself.
//!
//! Every input goes three ways:
//! - as the body of a message to a worker (`decode_to_worker`);
//! - as the body of a message to the coordinator (`decode_to_coordinator`);
//! - as a byte stream for the framing codec, built as the crate builds it (4-byte big-endian
//!   length, maximum frame length [`LIMIT`], small here so that both sides of it are in reach),
//!   decoded frame by frame until it wants more bytes or fails; each frame then goes to
//!   `decode_to_coordinator` and `decode_hello` (what the coordinator does with a worker's
//!   frames).

#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use malleable::cluster::Error;
use malleable::cluster::frame::{
    MAGIC, PROTOCOL_VERSION, decode_to_coordinator, decode_to_worker, encode,
};
use malleable::cluster::handshake::decode_hello;
use tokio_util::codec::{Decoder, LengthDelimitedCodec};

const PEER: &str = "198.51.100.7:7070";
/// The maximum frame length of the fuzzed codec.
const LIMIT: usize = 1024;

fn to_worker(body: &[u8]) {
    match decode_to_worker(PEER, body) {
        Ok(message) => {
            let again = decode_to_worker(PEER, &encode(&message));
            assert_eq!(
                again.ok().as_ref(),
                Some(&message),
                "a decoded message to a worker must round-trip"
            );
        }
        Err(e) => assert!(matches!(e, Error::Malformed { .. }), "{e:?}"),
    }
}

fn to_coordinator(body: &[u8]) {
    match decode_to_coordinator(PEER, body) {
        Ok(message) => {
            let again = decode_to_coordinator(PEER, &encode(&message));
            assert_eq!(
                again.ok().as_ref(),
                Some(&message),
                "a decoded message to the coordinator must round-trip"
            );
        }
        Err(e) => assert!(matches!(e, Error::Malformed { .. }), "{e:?}"),
    }
}

fn hello(frame: &[u8]) {
    match decode_hello(PEER, frame) {
        Ok(hello) => {
            let mut first = MAGIC.to_vec();
            first.extend_from_slice(&PROTOCOL_VERSION.to_be_bytes());
            first.extend_from_slice(&encode(&hello));
            let again = decode_hello(PEER, &first);
            assert_eq!(again.ok().as_ref(), Some(&hello), "a hello must round-trip");
        }
        Err(e) => assert!(
            matches!(
                e,
                Error::NotAPeer { .. } | Error::Version { .. } | Error::Malformed { .. }
            ),
            "{e:?}"
        ),
    }
}

fuzz_target!(|data: &[u8]| {
    to_worker(data);
    to_coordinator(data);

    let mut codec = LengthDelimitedCodec::builder()
        .length_field_type::<u32>()
        .max_frame_length(LIMIT)
        .new_codec();
    let mut stream = BytesMut::from(data);
    while let Ok(Some(frame)) = codec.decode(&mut stream) {
        assert!(frame.len() <= LIMIT, "a frame over the limit");
        to_coordinator(&frame);
        hello(&frame);
    }
});
