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
use malleable::{BoxError, Chunk, Fold, Input, Job, Step};
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
