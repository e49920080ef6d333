//! The decoders of the links between worker processes (protocol 20, `cluster::peer`) on
//! arbitrary bytes: never a panic, only the typed errors each one documents; what decodes
//! re-encodes to itself.
//!
//! Every input goes to all six: as a first frame (`MAGIC ‖ version ‖ body`) to
//! `decode_peer_hello` and `decode_peer_reply`; as a plain postcard body to
//! `decode_peer_proof`, `decode_peer_welcome`, `decode_to_peer` and `decode_from_peer`; and as
//! a byte stream for the framing codec (maximum frame length `checks::LIMIT`), each frame then
//! going to the last two and through an assembler of pieced messages of each kind.

#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    checks::peer_target(data);
});
