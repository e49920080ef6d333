//! Replays every file of `fuzz/corpus/*` through the decoders the fuzz targets exercise, as a
//! normal test: no input may panic, and the valid seeds (`valid-*`) must decode.
//!
//! The hand-made seeds (`seed-*` and `valid-*`) are written by [`seeds`]; regenerate them
//! after a format change with
//! `cargo test --test fuzz_corpus -- --ignored write_seeds`
//! ([`seeds_are_current`] fails until then). Other files are inputs the fuzzer found.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use malleable::snapshot::{
    FORMAT_VERSION, MAGIC, Manifest, PartRef, check_part, decode_manifest, encode_manifest,
};

fn corpus(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target)
}

/// What `fuzz/fuzz_targets/manifest.rs` does with one input: a manifest file, or a 0 byte
/// and a body to frame with a correct header.
fn manifest_target(data: &[u8]) -> bool {
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

/// What `fuzz/fuzz_targets/part.rs` does with one input: recorded size (u64 LE), recorded
/// CRC-32C (u32 LE), then the part's bytes.
fn part_target(data: &[u8]) -> bool {
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

fn replay(target: &str, run: fn(&[u8]) -> bool) -> usize {
    let dir = corpus(target);
    let mut files = 0;
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let result = std::panic::catch_unwind(|| run(&data));
        match result {
            Ok(ok) => assert!(
                ok || !name.starts_with("valid-"),
                "{target}/{name} is a valid seed but does not decode"
            ),
            Err(_) => panic!("{target}/{name} panicked"),
        }
        files += 1;
    }
    files
}

#[test]
fn manifest_corpus_never_panics() {
    assert!(replay("manifest", manifest_target) >= 10);
}

#[test]
fn part_corpus_never_panics() {
    assert!(replay("part", part_target) >= 5);
}

fn manifest(chunks: u64, done: u64, parts: u64, blob: usize) -> Manifest {
    Manifest {
        format_version: FORMAT_VERSION,
        job_name: "kmeans".to_owned(),
        job_id: "run-2026-11-22".to_owned(),
        epoch: 7,
        created_unix_ms: 1_795_000_000_000,
        job: (0..blob).map(|i| i as u8).collect(),
        phase: 2,
        iterations_before: 2_000_000,
        iterations_done: 400_000,
        iterations_total: 1_000_000,
        chunks,
        config: vec![1, 0, 64],
        merged: 1.min(chunks),
        reduced: 3.25f64.to_le_bytes().to_vec(),
        done: (0..done).map(|i| (1 + i, vec![i as u8; 8])).collect(),
        parts: (0..parts)
            .map(|i| PartRef {
                chunk: 1 + done + i,
                key: format!(
                    "run-2026-11-22/00000000000000000007/parts/2-{}-{i:016x}",
                    1 + done + i
                ),
                size: 100 + i,
                crc32c: 0x1234_5678 ^ i as u32,
            })
            .collect(),
    }
}

/// A header and body with a correct checksum around an arbitrary body.
fn framed(version: u32, body: &[u8]) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(body).to_le_bytes());
    out.extend_from_slice(body);
    out
}

fn part_input(size: u64, crc: u32, bytes: &[u8]) -> Vec<u8> {
    let mut out = size.to_le_bytes().to_vec();
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(bytes);
    out
}

/// The hand-made seeds: `(target, file name, bytes)`.
fn seeds() -> BTreeMap<(&'static str, &'static str), Vec<u8>> {
    let mut seeds = BTreeMap::new();
    let typical = encode_manifest(&manifest(10, 2, 3, 16));
    let mut m = |name, bytes| seeds.insert(("manifest", name), bytes);
    m("valid-empty", encode_manifest(&manifest(0, 0, 0, 0)));
    m("valid-typical", typical.clone());
    m("valid-large", encode_manifest(&manifest(200, 40, 60, 1024)));
    m("seed-empty-input", vec![]);
    m("seed-magic-only", MAGIC.to_vec());
    m("seed-bad-magic", b"MLBLSNAQ\x01\x00\x00\x00".to_vec());
    m("seed-truncated-header", typical[..16].to_vec());
    m("seed-truncated-body", typical[..typical.len() - 5].to_vec());
    let mut v = typical.clone();
    v[8..12].copy_from_slice(&2u32.to_le_bytes());
    m("seed-version-2", v);
    let mut v = typical.clone();
    let last = v.len() - 1;
    v[last] ^= 0x55;
    m("seed-bad-checksum", v);
    let mut v = typical.clone();
    v.push(0);
    m("seed-trailing-byte", v);
    let mut v = typical.clone();
    v[12..20].copy_from_slice(&u64::MAX.to_le_bytes());
    m("seed-huge-length", v);
    m("seed-undecodable-body", framed(FORMAT_VERSION, &[0xff; 12]));
    let body = postcard::to_allocvec(&manifest(10, 2, 3, 16)).unwrap();
    let mut extra = body.clone();
    extra.push(0);
    m("seed-body-trailing", framed(FORMAT_VERSION, &extra));
    let mut bad = manifest(10, 2, 3, 16);
    bad.merged = 11;
    m("seed-merged-past-end", encode_manifest(&bad));
    let mut bad = manifest(10, 2, 3, 16);
    bad.parts[0].chunk = 1;
    m("seed-chunk-twice", encode_manifest(&bad));
    let mut bad = manifest(10, 2, 3, 16);
    bad.done[0].0 = 0;
    m("seed-merged-chunk-done", encode_manifest(&bad));
    let mut bad = manifest(10, 2, 3, 16);
    bad.format_version = 9;
    m("seed-body-version", encode_manifest(&bad));
    // Bodies for the target to frame (a leading 0 byte).
    let body_of = |m: &Manifest| [&[0u8][..], &postcard::to_allocvec(m).unwrap()].concat();
    m("valid-body-typical", body_of(&manifest(10, 2, 3, 16)));
    m("valid-body-empty", body_of(&manifest(0, 0, 0, 0)));
    let mut bad = manifest(10, 2, 3, 16);
    bad.iterations_done = bad.iterations_total + 1;
    m("seed-body-progress", body_of(&bad));

    let data = b"a suspended chunk state, in postcard";
    let crc = crc32c::crc32c(data);
    let mut p = |name, bytes| seeds.insert(("part", name), bytes);
    p("valid-empty", part_input(0, 0, &[]));
    p("valid-state", part_input(data.len() as u64, crc, data));
    p("seed-short", vec![1, 2, 3]);
    p(
        "seed-wrong-size",
        part_input(data.len() as u64 + 1, crc, data),
    );
    p(
        "seed-wrong-crc",
        part_input(data.len() as u64, crc ^ 1, data),
    );
    p("seed-huge-size", part_input(u64::MAX, crc, data));
    seeds
}

#[test]
fn seeds_are_current() {
    for ((target, name), bytes) in seeds() {
        let path = corpus(target).join(name);
        let found = std::fs::read(&path).unwrap_or_default();
        assert!(
            found == bytes,
            "{} is missing or stale: run `cargo test --test fuzz_corpus -- --ignored write_seeds`",
            path.display()
        );
    }
}

#[test]
#[ignore = "writes the seed corpus into fuzz/corpus"]
fn write_seeds() {
    for ((target, name), bytes) in seeds() {
        let dir = corpus(target);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}
