//! The handshake's decoders on arbitrary bytes: never a panic, only the typed errors each one
//! documents; what decodes re-encodes to itself.
//!
//! Every input goes to all five: as a first frame (`MAGIC ‖ version ‖ body`) to
//! `decode_hello` and `decode_reply`, and as a plain postcard body to `decode_proof`,
//! `decode_welcome` and `decode_worker_layout`.

#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    checks::handshake_target(data);
});
