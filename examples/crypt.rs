//! IDEA encryption and decryption of a large buffer (the Java Grande Forum `Crypt`
//! benchmark) as malleable jobs.
//!
//! A job ([`Crypt`], in `kernels/jobs.rs`) references its buffer by name: the job value
//! stays small (a name, a key, a direction) and its input resolves the name once per process
//! in the registry that [`publish`] fills. Each chunk ciphers a range of 8-byte blocks into its
//! own buffer, and `CollectBytes` concatenates the chunks in order into one `BytesMut` (bytes
//! encode in bulk when they cross the wire). The example checks
//! the ciphertext against a sequential pass and that decryption gives the plaintext back.
//!
//! ```text
//! cargo run --release --example crypt [MEGABYTES]
//! ```

#[path = "kernels/mod.rs"]
mod kernels;

use std::time::{Duration, Instant};

use malleable::Executor;

use kernels::crypt;
use kernels::jobs::{Crypt, Direction, publish};

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

    // Zero-copy: the value owns its whole allocation.
    let cipher = publish("ciphertext", Vec::from(cipher));
    let t = Instant::now();
    let roundtrip = exec
        .run(Crypt {
            buffer: "ciphertext".into(),
            blocks,
            key,
            direction: Direction::Decrypt,
        })?
        .into_value();
    let t_dec = t.elapsed();

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
        "decrypt      {:>7.3} s  {:>7.1} MB/s  (malleable)",
        t_dec.as_secs_f64(),
        mb_per_s(len, t_dec)
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
    if roundtrip[..] != plain[..] {
        let at = roundtrip.iter().zip(plain.iter()).position(|(a, b)| a != b);
        eprintln!(
            "FAILED: decryption did not give the plaintext back (first difference at byte {at:?})"
        );
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
