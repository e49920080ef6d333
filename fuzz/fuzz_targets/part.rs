//! `check_part` on arbitrary bytes: never a panic, and `Ok` exactly when size and checksum
//! match.
//!
//! Input layout: recorded size (u64 LE), recorded CRC-32C (u32 LE), then the part's bytes.
//! An input shorter than 12 bytes is checked against a reference of zeros.

#![no_main]

use libfuzzer_sys::fuzz_target;
use malleable::snapshot::{PartRef, check_part};

fuzz_target!(|data: &[u8]| {
    let (size, crc, bytes) = match data.split_first_chunk::<12>() {
        Some((head, rest)) => {
            let (size, crc) = head.split_at(8);
            let size = u64::from_le_bytes(size.try_into().unwrap_or_default());
            let crc = u32::from_le_bytes(crc.try_into().unwrap_or_default());
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
    assert_eq!(check_part(bytes, &part).is_ok(), matches);
});
