//! `decode_manifest` on arbitrary bytes: never a panic; what decodes re-encodes to itself.
//!
//! Input: either a whole manifest file, or a 0 byte followed by a manifest *body*, which the
//! target frames with a correct header (magic, version, length, checksum) first. Random bytes
//! almost never carry a matching CRC-32C, so without the second form the fuzzer would rarely
//! get past the checksum to the body decoder and the consistency checks. (A real file never
//! starts with 0: the magic starts with `M`.)

#![no_main]

use libfuzzer_sys::fuzz_target;
use malleable::snapshot::{FORMAT_VERSION, MAGIC, decode_manifest, encode_manifest};

fuzz_target!(|data: &[u8]| {
    let file = match data.split_first() {
        Some((0, body)) => {
            let mut file = MAGIC.to_vec();
            file.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
            file.extend_from_slice(&(body.len() as u64).to_le_bytes());
            file.extend_from_slice(&crc32c::crc32c(body).to_le_bytes());
            file.extend_from_slice(body);
            file
        }
        _ => data.to_vec(),
    };
    if let Ok(manifest) = decode_manifest(&file) {
        let again = decode_manifest(&encode_manifest(&manifest));
        assert_eq!(
            again.ok().as_ref(),
            Some(&manifest),
            "a decoded manifest must round-trip"
        );
    }
});
