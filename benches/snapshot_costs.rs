//! What snapshots cost, against the same work done alone, in one run:
//!
//! 1. a worker's snapshot pause (`malleable_snapshot_pause_seconds`) vs serializing the same
//!    chunk state alone with postcard (target ≤ 1.1×);
//! 2. writing a snapshot through the store (parts + conditional create of the manifest) vs raw
//!    `object_store` puts of the same bytes with the same durability (fsync), on a local
//!    folder (target ≤ 1.2×);
//! 3. restore (`Executor::resume` up to a running handle) vs reading the same objects raw
//!    (target ≤ 1.2×);
//! 4. with `-- --long`: a run of about 2.5 minutes with one snapshot per minute vs the same run
//!    without (target ≤ 1% slower);
//! 5. one snapshot per second on a 2-thread run of the 1000 × 1000 ray tracer vs the same run
//!    without, as the median of back-to-back pairs (target ≤ 1% slower).
//!
//! `cargo bench --bench snapshot_costs` (add `-- --long` for 4; `-- --per-second` runs 5
//! alone, `PER_SECOND_PAIRS=N` sets its pairs, default 5).

#[path = "../examples/kernels/mod.rs"]
mod kernels;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod support;

use malleable::reduce::Sum;
use malleable::snapshot::{Manifest, Store};
use malleable::{At, Chunk, Chunking, Executor, Folded, Job, Step};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, path::Path as ObjPath};
use serde::{Deserialize, Serialize};
use support::{Mix, percentile};

/// A job whose chunks carry `words` u64s of live state (a working buffer).
#[derive(Serialize, Deserialize)]
struct Heavy {
    words: usize,
}

#[derive(Serialize, Deserialize)]
struct HeavyChunk {
    buf: Vec<u64>,
    steps: u64,
}

impl Job for Heavy {
    const NAME: &'static str = "heavy";
    type Chunk = HeavyChunk;
    type Reducer = Sum<u64>;
    type Input = ();
    fn iterations(&self) -> u64 {
        2
    }
    fn chunk(&self, r: std::ops::Range<u64>) -> HeavyChunk {
        HeavyChunk {
            buf: words(self.words, r.start),
            steps: 0,
        }
    }
    fn reducer(&self) -> Sum<u64> {
        Sum::new()
    }
}

impl Chunk for HeavyChunk {
    type Job = Heavy;
    type Output = u64;
    fn step(&mut self, _: &Heavy, _: &()) -> Step<u64> {
        // About 100 µs of work on the buffer per step; never finishes by itself.
        let n = self.buf.len();
        for k in 0..2_000 {
            let i = (self.steps as usize * 2_000 + k) % n;
            self.buf[i] = self.buf[i]
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1);
        }
        self.steps += 1;
        Step::Yield
    }
}

/// `n` pseudo-random words (as the workers' buffers look once stepped).
fn words(n: usize, seed: u64) -> Vec<u64> {
    (0..n as u64)
        .map(|i| {
            (i ^ seed)
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407)
        })
        .collect()
}

/// Like [`Heavy`], with a byte buffer as the live state (serialized as one byte string).
#[derive(Serialize, Deserialize)]
struct Blob {
    bytes: usize,
}

#[derive(Serialize, Deserialize)]
struct BlobChunk {
    #[serde(with = "serde_bytes")]
    buf: Vec<u8>,
    steps: u64,
}

impl Job for Blob {
    const NAME: &'static str = "blob";
    type Chunk = BlobChunk;
    type Reducer = Sum<u64>;
    type Input = ();
    fn iterations(&self) -> u64 {
        2
    }
    fn chunk(&self, r: std::ops::Range<u64>) -> BlobChunk {
        let buf = words(self.bytes / 8, r.start)
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        BlobChunk { buf, steps: 0 }
    }
    fn reducer(&self) -> Sum<u64> {
        Sum::new()
    }
}

impl Chunk for BlobChunk {
    type Job = Blob;
    type Output = u64;
    fn step(&mut self, _: &Blob, _: &()) -> Step<u64> {
        let n = self.buf.len();
        for k in 0..16_000 {
            let i = (self.steps as usize * 16_000 + k) % n;
            self.buf[i] = self.buf[i].wrapping_mul(31).wrapping_add(7);
        }
        self.steps += 1;
        Step::Yield
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    percentile(&mut v, 0.5)
}

fn folder(name: &str) -> (String, PathBuf) {
    let dir = std::env::temp_dir().join(format!("malleable-bench-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    (format!("file://{}", dir.display()), dir)
}

fn pause_vs_serialize(snapshotter: &metrics_util::debugging::Snapshotter, words: usize) {
    let (url, dir) = folder("pause");
    let exec = Executor::builder()
        .local_workers(2)
        .chunking(Chunking::Size(1))
        .snapshots(&url)
        .build()
        .unwrap();
    let handle = exec.submit(Heavy { words }).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let _ = snapshotter.snapshot(); // clear earlier samples
    for _ in 0..15 {
        handle.snapshot().wait().unwrap();
    }
    let mut pauses = Vec::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        // A worker's capture of its running chunk only: samples labelled `at` are the job's
        // lock held by the marker or at a partition's end, not what this line compares.
        let at = key.key().labels().any(|l| l.key() == "at");
        if key.key().name() == malleable::metrics::SNAPSHOT_PAUSE && !at {
            if let DebugValue::Histogram(h) = value {
                pauses.extend(
                    h.into_iter()
                        .map(|s| Duration::from_secs_f64(s.into_inner())),
                );
            }
        }
    }
    handle.cancel();
    let _ = handle.wait();
    // The same kind of content as the workers' states (large values: 9-10 byte varints).
    let state = HeavyChunk {
        buf: self::words(words, 0),
        steps: 3,
    };
    let serialize = || {
        median(
            (0..31)
                .map(|_| {
                    let t0 = Instant::now();
                    std::hint::black_box(postcard::to_allocvec(&state).unwrap());
                    t0.elapsed()
                })
                .collect(),
        )
    };
    let alone = serialize();
    // The same, while another core runs the job's steps, as the other worker does while a
    // worker captures: the cache and memory traffic of a busy neighbour are then in both.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let neighbour = {
        let stop = Arc::clone(&stop);
        let mut chunk = Heavy { words }.chunk(0..1);
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = chunk.step(&Heavy { words }, &());
            }
        })
    };
    std::thread::sleep(Duration::from_millis(5));
    let beside = serialize();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    neighbour.join().unwrap();
    let pause = median(pauses.clone());
    println!(
        "pause vs serialize, state {:>8} bytes: pause p50 {:>9.1?} ({} samples), serialize alone {:>9.1?}: {:.2}x; beside a busy core {:>9.1?}: {:.2}x",
        words * 8 + 8,
        pause,
        pauses.len(),
        alone,
        pause.as_secs_f64() / alone.as_secs_f64(),
        beside,
        pause.as_secs_f64() / beside.as_secs_f64()
    );
    let _ = std::fs::remove_dir_all(dir);
}

fn commit_vs_raw_put(rt: &tokio::runtime::Runtime, parts: usize, part_bytes: usize) {
    let (url, dir) = folder("commit");
    let store = Store::open(&url).unwrap();
    let raw_dir = dir.join("raw");
    std::fs::create_dir_all(&raw_dir).unwrap();
    // The same durability as the snapshot store, which fsyncs parts and manifests (so the
    // commit order survives a power cut): the comparison is put for put.
    let raw: Arc<dyn ObjectStore> = Arc::new(
        object_store::local::LocalFileSystem::new_with_prefix(&raw_dir)
            .unwrap()
            .with_fsync(true),
    );
    let payload = bytes::Bytes::from(vec![7u8; part_bytes]);
    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    for epoch in 0..15u64 {
        let t0 = Instant::now();
        let refs = rt.block_on(async {
            let mut refs = Vec::new();
            for c in 0..parts as u64 {
                refs.push(
                    store
                        .put_part("job", epoch, 0, c, payload.clone())
                        .await
                        .unwrap(),
                );
            }
            refs
        });
        let manifest = Manifest {
            format_version: malleable::snapshot::FORMAT_VERSION,
            job_name: "heavy".into(),
            job_id: "job".into(),
            epoch,
            created_unix_ms: 0,
            job: vec![1, 2, 3],
            phase: 0,
            iterations_before: 0,
            iterations_done: 0,
            iterations_total: parts as u64,
            chunks: parts as u64,
            config: vec![0, 0],
            merged: 0,
            reduced: vec![0],
            done: Vec::new(),
            parts: refs,
            kept: Vec::new(),
            job_version: 1,
            layout: None,
            submitted: None,
            shape: Vec::new(),
        };
        let manifest_len = malleable::snapshot::encode_manifest(&manifest).len();
        rt.block_on(store.commit(&manifest)).unwrap();
        ours.push(t0.elapsed());
        let t0 = Instant::now();
        rt.block_on(async {
            for c in 0..parts {
                raw.put(
                    &ObjPath::from(format!("{epoch}/p{c}")),
                    PutPayload::from(payload.clone()),
                )
                .await
                .unwrap();
            }
            raw.put(
                &ObjPath::from(format!("{epoch}/m")),
                PutPayload::from(vec![0u8; manifest_len]),
            )
            .await
            .unwrap();
        });
        theirs.push(t0.elapsed());
    }
    let (a, b) = (median(ours), median(theirs));
    println!(
        "snapshot write vs raw puts, {parts} parts of {part_bytes} bytes (file): {a:>9.1?} vs {b:>9.1?}: {:.2}x",
        a.as_secs_f64() / b.as_secs_f64()
    );
    let _ = std::fs::remove_dir_all(dir);
}

fn restore_vs_read<J: Job>(rt: &tokio::runtime::Runtime, job: J, what: &str) {
    let (url, dir) = folder("restore");
    let exec = Executor::builder()
        .local_workers(2)
        .chunking(Chunking::Size(1))
        .snapshots(&url)
        .build()
        .unwrap();
    let handle = exec.submit(job).unwrap();
    std::thread::sleep(Duration::from_millis(30));
    let id = handle.suspend().wait().unwrap();
    let _ = handle.wait();
    let inline = Executor::builder().local_workers(0).build().unwrap();
    let store = Store::open(&url).unwrap();
    let manifest = rt.block_on(store.manifest(&id)).unwrap();
    let root = object_store::local::LocalFileSystem::new_with_prefix(&dir).unwrap();
    let mut keys = vec![format!("{}/{:020}/manifest", J::NAME, id.epoch)];
    keys.extend(manifest.parts.iter().map(|p| p.key.clone()));
    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    for _ in 0..15 {
        let t0 = Instant::now();
        let h = inline.resume::<J>(&url, At::Epoch(id.epoch)).unwrap();
        ours.push(t0.elapsed());
        // Cancelled and waited for: its run holds the job id's lease until it ends, and the
        // next resume would be refused (`Error::JobIdHeld`).
        h.cancel();
        let _ = h.wait();
        let t0 = Instant::now();
        rt.block_on(async {
            for k in &keys {
                std::hint::black_box(
                    root.get(&ObjPath::from(k.as_str()))
                        .await
                        .unwrap()
                        .bytes()
                        .await
                        .unwrap(),
                );
            }
        });
        theirs.push(t0.elapsed());
    }
    let (a, b) = (median(ours), median(theirs));
    println!(
        "restore vs raw reads, {} parts of {} bytes ({what}): {a:>9.1?} vs {b:>9.1?}: {:.2}x",
        manifest.parts.len(),
        manifest.parts.first().map_or(0, |p| p.size),
        a.as_secs_f64() / b.as_secs_f64()
    );
    let _ = std::fs::remove_dir_all(dir);
}

fn long_run() {
    let (url, dir) = folder("long");
    let n = 340_000_000_000; // about 150 s on 2 workers of this machine
    let run = |every: Option<Duration>| {
        let mut b = Executor::builder().local_workers(2).snapshots(&url);
        if let Some(d) = every {
            b = b.snapshot_every(d);
        }
        let t0 = Instant::now();
        let v = b.build().unwrap().run(Folded(Mix(n))).unwrap().into_value();
        (t0.elapsed(), v)
    };
    let (plain, v1) = run(None);
    let (snapping, v2) = run(Some(Duration::from_secs(60)));
    assert_eq!(v1, v2);
    println!(
        "long run: {plain:.1?} without snapshots, {snapping:.1?} with one per minute: {:+.2}%",
        (snapping.as_secs_f64() / plain.as_secs_f64() - 1.0) * 100.0
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Section 5: one snapshot per second on a 2-thread ray tracer, against the same run without.
fn per_second() {
    let (url, dir) = folder("per-second");
    let pairs: usize = std::env::var("PER_SECOND_PAIRS")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(5);
    let render = || {
        Folded(kernels::jobs::Render {
            width: 1000,
            height: 1000,
            samples: 12,
        })
    };
    let run = |every: Option<Duration>| {
        let mut b = Executor::builder().local_workers(2).snapshots(&url);
        if let Some(d) = every {
            b = b.snapshot_every(d);
        }
        let exec = b.build().unwrap();
        let t0 = Instant::now();
        let image = exec.run(render()).unwrap().into_value();
        (t0.elapsed(), image)
    };
    let mut ratios = Vec::with_capacity(pairs);
    let mut times = Vec::with_capacity(pairs);
    for i in 0..pairs {
        // Alternate which goes first, so a drift of the machine does not favour one side.
        let ((plain, a), (snapping, b)) = if i % 2 == 0 {
            let p = run(None);
            (p, run(Some(Duration::from_secs(1))))
        } else {
            let s = run(Some(Duration::from_secs(1)));
            (run(None), s)
        };
        assert!(a == b, "the image differs with snapshots");
        ratios.push(snapping.as_secs_f64() / plain.as_secs_f64());
        times.push((plain, snapping));
    }
    let mut sorted = ratios.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    println!(
        "one snapshot per second, 1000x1000 ray tracer on 2 threads: {:+.2}% (median of {} pairs; pairs {})",
        (median - 1.0) * 100.0,
        pairs,
        times
            .iter()
            .map(|(p, s)| format!("{:.2}/{:.2} s", p.as_secs_f64(), s.as_secs_f64()))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let _ = std::fs::remove_dir_all(dir);
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    println!("snapshot_costs");
    if std::env::args().any(|a| a == "--per-second") {
        per_second();
        return;
    }
    if std::env::args().any(|a| a == "--write-only") {
        // For profiling the write path alone (e.g. under `strace -c`).
        commit_vs_raw_put(&rt, 2, 64 * 1024);
        return;
    }
    for words in [8 * 1024, 1024 * 1024] {
        pause_vs_serialize(&snapshotter, words);
    }
    for (parts, size) in [(2, 64 * 1024), (2, 8 * 1024 * 1024)] {
        commit_vs_raw_put(&rt, parts, size);
    }
    for words in [8 * 1024, 1024 * 1024] {
        restore_vs_read(&rt, Heavy { words }, "u64 words");
        restore_vs_read(&rt, Blob { bytes: words * 8 }, "a byte buffer");
    }
    per_second();
    if std::env::args().any(|a| a == "--long") {
        long_run();
    }
}
