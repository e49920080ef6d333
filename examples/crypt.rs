//! IDEA encryption and decryption of a large buffer (the Java Grande Forum `Crypt`
//! benchmark) as malleable jobs.
//!
//! A job references its buffer by name: the job value stays small (a name, a key, a
//! direction) and [`Input::load`] resolves the name once per process. Each chunk ciphers a
//! range of 8-byte blocks into its own `Vec<u8>`, and [`CollectInOrder`] concatenates the
//! chunks in order. The example checks the ciphertext against a sequential pass and that
//! decryption gives the plaintext back.
//!
//! ```text
//! cargo run --release --example crypt [MEGABYTES]
//! ```

#[path = "kernels/mod.rs"]
mod kernels;

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use malleable::reduce::CollectInOrder;
use malleable::{BoxError, Chunk, Executor, Input, Job, Step};
use serde::{Deserialize, Serialize};

use kernels::crypt::{self, Subkeys};

/// Blocks ciphered per step (64 KiB, well under a millisecond).
const BLOCKS_PER_STEP: u64 = 8192;

/// Named read-only buffers of this process, which jobs reference by name.
fn buffers() -> &'static Mutex<HashMap<String, Arc<Vec<u8>>>> {
    static BUFFERS: OnceLock<Mutex<HashMap<String, Arc<Vec<u8>>>>> = OnceLock::new();
    BUFFERS.get_or_init(Mutex::default)
}

/// Makes `data` available to jobs as `name`.
fn publish(name: &str, data: Vec<u8>) -> Arc<Vec<u8>> {
    let data = Arc::new(data);
    buffers()
        .lock()
        .expect("buffer registry")
        .insert(name.to_owned(), Arc::clone(&data));
    data
}

/// Encrypt or decrypt.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
enum Direction {
    Encrypt,
    Decrypt,
}

/// Cipher the named buffer with a 128-bit key: one iteration per 8-byte block.
#[derive(Serialize, Deserialize)]
struct Crypt {
    buffer: String,
    blocks: u64,
    key: [u16; 8],
    direction: Direction,
}

/// What every worker of a process shares: the buffer and the subkeys of the direction.
struct CryptInput {
    data: Arc<Vec<u8>>,
    subkeys: Subkeys,
}

impl Input<Crypt> for CryptInput {
    fn load(job: &Crypt) -> Result<Self, BoxError> {
        let data = buffers()
            .lock()
            .map_err(|_| "buffer registry poisoned")?
            .get(&job.buffer)
            .cloned()
            .ok_or_else(|| format!("no buffer named {:?}", job.buffer))?;
        if data.len() as u64 != job.blocks * 8 {
            return Err(format!("buffer {:?} is not {} blocks", job.buffer, job.blocks).into());
        }
        let ek = crypt::encrypt_key(job.key);
        let subkeys = match job.direction {
            Direction::Encrypt => ek,
            Direction::Decrypt => crypt::decrypt_key(&ek),
        };
        Ok(CryptInput { data, subkeys })
    }
}

/// A range of blocks and the bytes ciphered so far.
#[derive(Serialize, Deserialize)]
struct CryptChunk {
    next: u64,
    end: u64,
    out: Vec<u8>,
}

impl Job for Crypt {
    const NAME: &'static str = "crypt";
    type Chunk = CryptChunk;
    type Reducer = CollectInOrder<u8>;
    type Input = CryptInput;

    fn iterations(&self) -> u64 {
        self.blocks
    }

    fn chunk(&self, range: Range<u64>) -> CryptChunk {
        CryptChunk {
            next: range.start,
            end: range.end,
            out: Vec::with_capacity(8 * (range.end - range.start) as usize),
        }
    }

    fn reducer(&self) -> CollectInOrder<u8> {
        CollectInOrder::new()
    }
}

impl Chunk for CryptChunk {
    type Job = Crypt;
    type Output = Vec<u8>;

    fn step(&mut self, _job: &Crypt, input: &CryptInput) -> Step<Vec<u8>> {
        let stop = self.end.min(self.next + BLOCKS_PER_STEP);
        let (a, b) = (8 * self.next as usize, 8 * stop as usize);
        crypt::cipher_append(&input.data[a..b], &mut self.out, &input.subkeys);
        self.next = stop;
        if self.next == self.end {
            Step::Done(std::mem::take(&mut self.out))
        } else {
            Step::Yield
        }
    }

    fn iterations_done(&self) -> Option<u64> {
        Some((self.out.len() / 8) as u64)
    }
}

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

    let cipher = publish("ciphertext", cipher);
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

    if *cipher != expected {
        let at = cipher.iter().zip(&expected).position(|(a, b)| a != b);
        eprintln!(
            "FAILED: ciphertext differs from the sequential one (first difference at byte {at:?}, lengths {} and {})",
            cipher.len(),
            expected.len()
        );
        std::process::exit(1);
    }
    if roundtrip != *plain {
        let at = roundtrip.iter().zip(plain.iter()).position(|(a, b)| a != b);
        eprintln!(
            "FAILED: decryption did not give the plaintext back (first difference at byte {at:?})"
        );
        std::process::exit(1);
    }
    if cipher == plain {
        eprintln!("FAILED: the ciphertext equals the plaintext");
        std::process::exit(1);
    }
    println!(
        "check        ok: ciphertext equals the sequential one, decryption gives the plaintext back"
    );
    Ok(())
}
