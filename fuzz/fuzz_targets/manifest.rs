//! `decode_manifest` on arbitrary bytes: never a panic; what decodes re-encodes to itself.
//!
//! Input: either a whole manifest file, or a 0 byte followed by a manifest *body*, which the
//! target frames with a correct header (magic, version, length, checksum) first. Random bytes
//! almost never carry a matching CRC-32C, so without the second form the fuzzer would rarely
//! get past the checksum to the body decoder and the consistency checks. (A real file never
//! starts with 0: the magic starts with `M`.)

#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    checks::manifest_target(data);
});
