//! `check_part` on arbitrary bytes: never a panic, and `Ok` exactly when size and checksum
//! match.
//!
//! Input layout: recorded size (u64 LE), recorded CRC-32C (u32 LE), then the part's bytes.
//! An input shorter than 12 bytes is checked against a reference of zeros.

#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    checks::part_target(data);
});
