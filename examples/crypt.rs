//! IDEA encryption and decryption of a large buffer (the Java Grande Forum `Crypt`
//! benchmark) as malleable jobs.
//!
//! 1. One job ([`Crypt`], in `kernels/jobs.rs`) references its buffer by name: the job value
//!    stays small (a name, a key, a direction) and its input resolves the name once per
//!    process in the registry that [`publish`] fills. Each chunk ciphers a range of 8-byte
//!    blocks into its own buffer, and `CollectBytes` concatenates the chunks in order into
//!    one `BytesMut`, checked against a sequential pass.
//! 2. The round trip ([`CryptRoundTrip`]) is one job of two phases with owned partitions:
//!    phase 0 encrypts each chunk's blocks into the chunk's own partition, phase 1 decrypts
//!    them there. The ciphertext stays where it was written: nothing is copied into the job
//!    or through the barrier. Each phase's value is a digest of what it wrote (the same for
//!    any chunking), checked against the sequential ciphertext and the plaintext.
//!
//! ```text
//! cargo run --release --example crypt [MEGABYTES]
//! ```

#[path = "kernels/mod.rs"]
mod kernels;

use std::time::{Duration, Instant};

use malleable::Executor;

use kernels::crypt;
use kernels::jobs::{Crypt, CryptRoundTrip, Digest, Direction, publish};

fn mb_per_s(bytes: usize, t: Duration) -> f64 {
    bytes as f64 / 1e6 / t.as_secs_f64()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mb: usize = match std::env::args().nth(1) {
        Some(s) => s.parse()?,
        None => 50,
    };
    let len = mb * 1024 * 1024;
    let key = crypt::user_key(7);
    crypt::self_test();

    let plain = publish("plaintext", crypt::plaintext(42, len));
    let blocks = (len / 8) as u64;
    let exec = Executor::builder().build()?;

    let t = Instant::now();
    let cipher = exec
        .run(Crypt {
            buffer: "plaintext".into(),
            blocks,
            key,
            direction: Direction::Encrypt,
        })?
        .into_value();
    let t_enc = t.elapsed();

    let t = Instant::now();
    let expected = crypt::sequential(&plain, &crypt::encrypt_key(key));
    let t_seq = t.elapsed();

    // The round trip with owned partitions; the digest of each phase is observed at its
    // barrier (`end_phase` sees it; here the job's last value is phase 1's).
    let t = Instant::now();
    let handle = exec.submit(CryptRoundTrip {
        buffer: "plaintext".into(),
        blocks,
        key,
        phase: 0,
        encrypted: None,
    })?;
    let done = handle.wait()?.finished().expect("the round trip finishes");
    let encrypted = done.job.encrypted;
    let round = done.into_value();
    let t_round = t.elapsed();
    let want_cipher = Digest::of(0, &expected, &plain);
    let want_plain = Digest::of(0, &plain, &plain);

    println!(
        "buffer       {mb} MiB ({blocks} blocks), key {}",
        hex(&key.map(u16::to_le_bytes).concat())
    );
    println!("plaintext    {}…", hex(&plain[..16]));
    println!("ciphertext   {}…", hex(&cipher[..16]));
    println!(
        "encrypt      {:>7.3} s  {:>7.1} MB/s  (malleable, {} workers)",
        t_enc.as_secs_f64(),
        mb_per_s(len, t_enc),
        std::thread::available_parallelism().map_or(1, usize::from)
    );
    println!(
        "round trip   {:>7.3} s  {:>7.1} MB/s  (encrypt then decrypt in place, owned partitions)",
        t_round.as_secs_f64(),
        mb_per_s(2 * len, t_round)
    );
    println!(
        "sequential   {:>7.3} s  {:>7.1} MB/s  (encrypt, speedup {:.2}x)",
        t_seq.as_secs_f64(),
        mb_per_s(len, t_seq),
        t_seq.as_secs_f64() / t_enc.as_secs_f64()
    );

    if cipher[..] != expected[..] {
        let at = cipher.iter().zip(&expected).position(|(a, b)| a != b);
        eprintln!(
            "FAILED: ciphertext differs from the sequential one (first difference at byte {at:?}, lengths {} and {})",
            cipher.len(),
            expected.len()
        );
        std::process::exit(1);
    }
    if round != want_plain {
        eprintln!(
            "FAILED: the round trip did not give the plaintext back ({} blocks differ, digest {:x} where {:x})",
            round.differ, round.hash, want_plain.hash
        );
        std::process::exit(1);
    }
    if encrypted != Some(want_cipher) {
        eprintln!(
            "FAILED: the round trip's ciphertext differs from the sequential one ({encrypted:?} where {want_cipher:?})"
        );
        std::process::exit(1);
    }
    if want_cipher.differ == 0 {
        eprintln!("FAILED: the ciphertext equals the plaintext block for block");
        std::process::exit(1);
    }
    if cipher[..] == plain[..] {
        eprintln!("FAILED: the ciphertext equals the plaintext");
        std::process::exit(1);
    }
    println!(
        "check        ok: ciphertext equals the sequential one, decryption gives the plaintext back"
    );
    Ok(())
}
