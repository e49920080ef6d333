//! The kernels as malleable jobs, shared by the examples and the `loop_vs_rayon` benchmark.
//!
//! - [`Pi`]: Monte Carlo π, one iteration per sample, the accumulator counts hits.
//! - [`Crypt`]: IDEA encryption or decryption of a named buffer (see [`publish`]), one
//!   iteration per 8-byte block, each chunk ciphering its blocks into its own buffer.
//! - [`Render`]: ray tracing, one iteration per image row, with the [`Scene`] as the input.
//!
//! The last two concatenate the chunks' bytes in order: [`CollectBytes`] for `Crypt`, whose
//! outputs (and value) encode in bulk, [`CollectInOrder`] for `Render`. Each job has one
//! [`Job::NAME`], distinct from the others' and from the other examples' jobs.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex, OnceLock};

use bytes::BytesMut;
use malleable::reduce::{CollectBytes, CollectInOrder, Count};
use malleable::{BoxError, Chunk, Fold, Input, Job, Next, Ownership, Partition, Step};
use serde::{Deserialize, Serialize};

use super::crypt::{self, Subkeys};
use super::montecarlo;
use super::raytrace::Scene;

// ---------------------------------------------------------------------------------------
// Monte Carlo π

/// Count the samples of stream `seed` inside the quarter circle: one iteration per sample.
#[derive(Serialize, Deserialize)]
pub(crate) struct Pi {
    pub(crate) samples: u64,
    pub(crate) seed: u64,
}

impl Fold for Pi {
    const NAME: &'static str = "montecarlo-pi";
    type Acc = u64;
    type Reducer = Count;
    type Input = ();

    fn iterations(&self) -> u64 {
        self.samples
    }

    fn reducer(&self) -> Count {
        Count
    }

    #[inline]
    fn body(&self, _: &(), hits: &mut u64, i: u64) {
        *hits += u64::from(montecarlo::in_circle(self.seed, i));
    }
}

// ---------------------------------------------------------------------------------------
// IDEA encryption

/// Blocks ciphered per step (64 KiB, well under a millisecond).
const BLOCKS_PER_STEP: u64 = 8192;

/// Named read-only buffers of this process, which jobs reference by name.
fn buffers() -> &'static Mutex<HashMap<String, Arc<Vec<u8>>>> {
    static BUFFERS: OnceLock<Mutex<HashMap<String, Arc<Vec<u8>>>>> = OnceLock::new();
    BUFFERS.get_or_init(Mutex::default)
}

/// The buffer published as `name`, which must be `blocks` 8-byte blocks long.
fn buffer(name: &str, blocks: u64) -> Result<Arc<Vec<u8>>, BoxError> {
    let data = buffers()
        .lock()
        .map_err(|_| "buffer registry poisoned")?
        .get(name)
        .cloned()
        .ok_or_else(|| format!("no buffer named {name:?}"))?;
    if data.len() as u64 != blocks * 8 {
        return Err(format!("buffer {name:?} is not {blocks} blocks").into());
    }
    Ok(data)
}

/// Makes `data` available to jobs as `name` (replacing any buffer of that name).
pub(crate) fn publish(name: &str, data: Vec<u8>) -> Arc<Vec<u8>> {
    let data = Arc::new(data);
    buffers()
        .lock()
        .expect("buffer registry")
        .insert(name.to_owned(), Arc::clone(&data));
    data
}

/// Encrypt or decrypt.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub(crate) enum Direction {
    Encrypt,
    Decrypt,
}

/// Cipher the buffer published as `buffer` with a 128-bit key: one iteration per 8-byte
/// block. The job value stays small (a name, a key, a direction); [`Input::load`] resolves
/// the name once per process.
#[derive(Serialize, Deserialize)]
pub(crate) struct Crypt {
    pub(crate) buffer: String,
    pub(crate) blocks: u64,
    pub(crate) key: [u16; 8],
    pub(crate) direction: Direction,
}

/// What every worker of a process shares: the buffer and the subkeys of the direction.
pub(crate) struct CryptInput {
    data: Arc<Vec<u8>>,
    subkeys: Subkeys,
}

impl Input<Crypt> for CryptInput {
    fn load(job: &Crypt) -> Result<Self, BoxError> {
        let data = buffer(&job.buffer, job.blocks)?;
        let ek = crypt::encrypt_key(job.key);
        let subkeys = match job.direction {
            Direction::Encrypt => ek,
            Direction::Decrypt => crypt::decrypt_key(&ek),
        };
        Ok(CryptInput { data, subkeys })
    }
}

/// A range of blocks and the bytes ciphered so far.
///
/// `out` stays a `Vec<u8>` for [`crypt::cipher_append`] and is encoded as one byte string
/// (in snapshots and migrations); at the end it becomes the output without a copy.
#[derive(Serialize, Deserialize)]
pub(crate) struct CryptChunk {
    next: u64,
    end: u64,
    #[serde(with = "serde_bytes")]
    out: Vec<u8>,
}

impl Job for Crypt {
    const NAME: &'static str = "crypt";
    type Chunk = CryptChunk;
    type Reducer = CollectBytes;
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

    fn reducer(&self) -> CollectBytes {
        CollectBytes::new()
    }
}

impl Chunk for CryptChunk {
    type Job = Crypt;
    type Output = BytesMut;

    fn step(&mut self, _job: &Crypt, input: &CryptInput) -> Step<BytesMut> {
        let stop = self.end.min(self.next + BLOCKS_PER_STEP);
        let (a, b) = (8 * self.next as usize, 8 * stop as usize);
        crypt::cipher_append(&input.data[a..b], &mut self.out, &input.subkeys);
        self.next = stop;
        if self.next == self.end {
            // `Bytes::from(Vec)` and `BytesMut::from(Bytes)` take over the allocation of a
            // uniquely owned buffer: no copy (there is no `BytesMut: From<Vec<u8>>`).
            let out = std::mem::take(&mut self.out);
            Step::Done(BytesMut::from(bytes::Bytes::from(out)))
        } else {
            Step::Yield
        }
    }

    fn iterations_done(&self) -> Option<u64> {
        Some((self.out.len() / 8) as u64)
    }
}

// ---------------------------------------------------------------------------------------
// Ray tracing

/// Render a `width × height` image with `samples²` rays per pixel: one iteration per row.
#[derive(Serialize, Deserialize)]
pub(crate) struct Render {
    pub(crate) width: u32,
    pub(crate) height: u32,
    pub(crate) samples: u32,
}

/// The scene is built once per process from the job's small description.
impl Input<Render> for Scene {
    fn load(job: &Render) -> Result<Self, BoxError> {
        Ok(Scene::new(job.width, job.height, job.samples))
    }
}

impl Fold for Render {
    const NAME: &'static str = "raytrace";
    type Acc = Vec<u8>;
    type Reducer = CollectInOrder<u8>;
    type Input = Scene;

    fn iterations(&self) -> u64 {
        u64::from(self.height)
    }

    fn reducer(&self) -> CollectInOrder<u8> {
        CollectInOrder::new()
    }

    fn body(&self, scene: &Scene, rows: &mut Vec<u8>, y: u64) {
        let at = rows.len();
        rows.resize(at + scene.row_bytes(), 0);
        scene.render_row(y as u32, &mut rows[at..]);
    }
}

// ---------------------------------------------------------------------------------------
// IDEA round trip with owned partitions

/// Encrypt the buffer published as `buffer` in phase 0, then decrypt the ciphertext in phase
/// 1, with owned partitions ([`Partition`]): each chunk writes its ciphertext into its own
/// partition and decrypts it there in the next phase, so the ciphertext is never copied into
/// the job or through the barrier. The value of a phase is a [`Digest`] of the bytes it
/// wrote, which does not depend on the chunking.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct CryptRoundTrip {
    pub(crate) buffer: String,
    pub(crate) blocks: u64,
    pub(crate) key: [u16; 8],
    pub(crate) phase: u64,
    /// The digest of the ciphertext, as phase 0 ended.
    pub(crate) encrypted: Option<Digest>,
}

/// XOR of a hash of every block with its index, and how many blocks differ from the
/// plaintext: the same for any chunking.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Digest {
    pub(crate) hash: u64,
    pub(crate) differ: u64,
}

impl Digest {
    /// The digest of `bytes`, starting at block `first`, against `plain` (the same blocks).
    pub(crate) fn of(first: u64, bytes: &[u8], plain: &[u8]) -> Digest {
        let mut d = Digest::default();
        for (k, (b, p)) in bytes.chunks_exact(8).zip(plain.chunks_exact(8)).enumerate() {
            let word = u64::from_le_bytes(b.try_into().expect("8 bytes"));
            let i = first + k as u64;
            d.hash ^=
                (word ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15)).wrapping_mul(0xff51_afd7_ed55_8ccd);
            d.differ += u64::from(b != p);
        }
        d
    }

    fn combine(acc: &mut Digest, next: Digest) {
        acc.hash ^= next.hash;
        acc.differ += next.differ;
    }
}

/// The buffer and the subkeys of both directions.
pub(crate) struct RoundTripInput {
    data: Arc<Vec<u8>>,
    encrypt: Subkeys,
    decrypt: Subkeys,
}

impl Input<CryptRoundTrip> for RoundTripInput {
    fn load(job: &CryptRoundTrip) -> Result<Self, BoxError> {
        let data = buffer(&job.buffer, job.blocks)?;
        let encrypt = crypt::encrypt_key(job.key);
        let decrypt = crypt::decrypt_key(&encrypt);
        Ok(RoundTripInput {
            data,
            encrypt,
            decrypt,
        })
    }
}

/// A range of blocks: in phase 0 the ciphertext written so far, in phase 1 the ciphertext
/// being decrypted in place.
#[derive(Serialize, Deserialize)]
pub(crate) struct CryptPart {
    start: u64,
    next: u64,
    end: u64,
    #[serde(with = "serde_bytes")]
    bytes: Vec<u8>,
    digest: Digest,
}

type DigestReducer = malleable::reduce::FnReducer<Digest, fn() -> Digest, fn(&mut Digest, Digest)>;

impl Job for CryptRoundTrip {
    const NAME: &'static str = "crypt-round-trip";
    const OWNERSHIP: Ownership<Self> = Ownership::PARTITIONS;
    type Chunk = CryptPart;
    type Reducer = DigestReducer;
    type Input = RoundTripInput;

    fn iterations(&self) -> u64 {
        self.blocks
    }

    fn chunk(&self, range: Range<u64>) -> CryptPart {
        CryptPart {
            start: range.start,
            next: range.start,
            end: range.end,
            bytes: Vec::with_capacity(8 * (range.end - range.start) as usize),
            digest: Digest::default(),
        }
    }

    fn reducer(&self) -> DigestReducer {
        malleable::reduce::FnReducer::new(Digest::default, Digest::combine)
    }

    fn end_phase(&mut self, digest: &Digest) -> Next {
        if self.phase == 0 {
            self.encrypted = Some(*digest);
        }
        self.phase += 1;
        if self.phase < 2 {
            Next::Continue
        } else {
            Next::Finish
        }
    }
}

impl Chunk for CryptPart {
    type Job = CryptRoundTrip;
    type Output = Digest;

    fn step(&mut self, job: &CryptRoundTrip, input: &RoundTripInput) -> Step<Digest> {
        let stop = self.end.min(self.next + BLOCKS_PER_STEP);
        let (a, b) = (8 * self.next as usize, 8 * stop as usize);
        let plain = &input.data[a..b];
        let (from, to) = (
            8 * (self.next - self.start) as usize,
            8 * (stop - self.start) as usize,
        );
        if job.phase == 0 {
            crypt::cipher_append(plain, &mut self.bytes, &input.encrypt);
        } else {
            for block in self.bytes[from..to].chunks_exact_mut(8) {
                let c: [u8; 8] = (&*block).try_into().expect("8 bytes");
                block.copy_from_slice(&crypt::cipher_block(&c, &input.decrypt));
            }
        }
        Digest::combine(
            &mut self.digest,
            Digest::of(self.next, &self.bytes[from..to], plain),
        );
        self.next = stop;
        if self.next == self.end {
            Step::Done(std::mem::take(&mut self.digest))
        } else {
            Step::Yield
        }
    }

    fn iterations_done(&self) -> Option<u64> {
        Some(self.next - self.start)
    }
}

impl Partition for CryptPart {
    /// Blocks are independent: nothing crosses to a neighbour.
    type Halo = ();

    fn export(&self, _job: &CryptRoundTrip) -> ((), ()) {
        ((), ())
    }

    fn begin_phase(&mut self, _job: &CryptRoundTrip, _: Option<()>, _: Option<()>) {
        self.next = self.start;
    }
}
