//! The handshake's decoders on arbitrary bytes: never a panic, only the typed errors each one
//! documents; what decodes re-encodes to itself.
//!
//! Every input goes to all four: as a first frame (`MAGIC ‖ version ‖ body`) to
//! `decode_hello` and `decode_reply`, and as a plain postcard body to `decode_proof` and
//! `decode_welcome`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use malleable::cluster::Error;
use malleable::cluster::frame::{MAGIC, PROTOCOL_VERSION, encode};
use malleable::cluster::handshake::{decode_hello, decode_proof, decode_reply, decode_welcome};
use serde::Serialize;

const PEER: &str = "198.51.100.7:7070";

/// A first frame: the magic and version, then the body.
fn versioned<T: Serialize>(body: &T) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&PROTOCOL_VERSION.to_be_bytes());
    out.extend_from_slice(&encode(body));
    out
}

/// The errors of a first frame's decoder.
fn first_frame_error(e: &Error) -> bool {
    matches!(
        e,
        Error::NotAPeer { .. } | Error::Version { .. } | Error::Malformed { .. }
    )
}

fuzz_target!(|data: &[u8]| {
    match decode_hello(PEER, data) {
        Ok(hello) => {
            let again = decode_hello(PEER, &versioned(&hello));
            assert_eq!(again.ok().as_ref(), Some(&hello), "a hello must round-trip");
        }
        Err(e) => assert!(first_frame_error(&e), "{e:?}"),
    }
    match decode_reply(PEER, data) {
        Ok(reply) => {
            let again = decode_reply(PEER, &versioned(&reply));
            assert_eq!(again.ok().as_ref(), Some(&reply), "a reply must round-trip");
        }
        Err(e) => assert!(first_frame_error(&e), "{e:?}"),
    }
    match decode_proof(PEER, data) {
        Ok(proof) => {
            let again = decode_proof(PEER, &encode(&proof));
            assert_eq!(again.ok().as_ref(), Some(&proof), "a proof must round-trip");
        }
        Err(e) => assert!(matches!(e, Error::Malformed { .. }), "{e:?}"),
    }
    match decode_welcome(PEER, data) {
        Ok(welcome) => {
            let again = decode_welcome(PEER, &encode(&welcome));
            assert_eq!(
                again.ok().as_ref(),
                Some(&welcome),
                "a welcome must round-trip"
            );
        }
        Err(e) => assert!(matches!(e, Error::Malformed { .. }), "{e:?}"),
    }
});
