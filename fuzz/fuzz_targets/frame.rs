//! The cluster's message decoders and framing on arbitrary bytes: never a panic, only typed
//! errors; what decodes re-encodes to itself.
//!
//! Every input goes three ways:
//! - as the body of a message to a worker (`decode_to_worker`);
//! - as the body of a message to the coordinator (`decode_to_coordinator`);
//! - as a byte stream for the framing codec, built as the crate builds it (4-byte big-endian
//!   length, maximum frame length `checks::LIMIT`, small here so that both sides of it are in reach),
//!   decoded frame by frame until it wants more bytes or fails; each frame then goes to
//!   `decode_to_coordinator` and `decode_hello` (what the coordinator does with a worker's
//!   frames).

#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    checks::frame_target(data);
});
