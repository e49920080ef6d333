//! Migrate a running job between sites: suspend it before a deadline at site A, copy its
//! snapshot store to site B, and resume it there in another process with another worker
//! count. The value is bit-identical to an uninterrupted run.
//!
//! The job is a gravitational n-body simulation: each phase is one time step, a loop over
//! the bodies (a [`Fold`]) that computes each body's acceleration and the potential energy
//! as `f64` sums; at the barrier, `end_phase` moves the bodies (symplectic Euler) and asks
//! for the next step. The system is chaotic: one rounding difference anywhere would grow
//! into different final positions, so the bit-for-bit check at the end means something.
//!
//! 1. **Site A** runs the job with 2 worker threads, a snapshot store, a snapshot every
//!    second and a `deadline` a few seconds away (the end of a batch allocation, say). The
//!    executor suspends the job early enough for the final snapshot to commit before the
//!    deadline: the job ends with `Outcome::Suspended(id)`.
//! 2. The store's folder is **copied** to site B (a plain directory copy, as `rsync` would
//!    do; for `s3://` stores, the snapshots are copied object by object).
//! 3. **Site B** is a second process (this program re-executed with `--site-b URL`): it
//!    resumes the job from the copy with another worker count and prints the result.
//! 4. The first process runs the same job uninterrupted, and checks that site B's result
//!    is the same, bit for bit; it exits non-zero if not.
//!
//! ```text
//! cargo run --release --example migrate
//! cargo run --release --example migrate -- --site-b-workers 0     # site B computes inline
//! cargo run --release --example migrate -- --deadline 15 --steps 6000
//! cargo run --release --features s3 --example migrate -- --store s3://bucket/prefix
//! ```
//!
//! Options: `--store URL` (default: a fresh folder under the system's temporary directory;
//! `s3://` stores read the usual `AWS_*` variables), `--deadline SECS` (3), `--steps N`
//! (2400), `--bodies N` (1024), `--site-b-workers K` (3).
//!
//! Before any snapshot has been timed, the executor keeps a margin of 10 s before a deadline
//! (afterwards twice the longest snapshot plus 1 s), so with a deadline closer than that it
//! suspends at once; with `--deadline 15` the periodic snapshots are timed first and the job
//! runs until about a second before the deadline (give it enough `--steps` not to finish).

#[path = "kernels/mod.rs"]
mod kernels;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use malleable::reduce::Reducer;
use malleable::snapshot::{SnapshotId, Store};
use malleable::{At, Chunking, Executor, Finished, Fold, Folded, Next, Outcome};
use serde::{Deserialize, Serialize};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The job id the snapshots are stored under, at both sites.
const JOB_ID: &str = "nbody-migrate";
/// Bodies per chunk: fixed, so the value never depends on the workers.
const CHUNK: u64 = 64;
const SITE_A_WORKERS: usize = 2;

// ---------------------------------------------------------------------------------------
// The job.
// ---------------------------------------------------------------------------------------

/// An n-body system and where it is in its run. Small enough to travel in every snapshot.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct NBody {
    pos: Vec<[f64; 3]>,
    vel: Vec<[f64; 3]>,
    mass: Vec<f64>,
    dt: f64,
    /// Softening length squared (keeps close encounters finite).
    eps2: f64,
    /// Steps done, and steps to do.
    step: u64,
    steps: u64,
    /// Total energy before the first step and at the start of the last one.
    energy_first: f64,
    energy_last: f64,
}

/// What a chunk of bodies contributes: their accelerations (in body order) and their part of
/// the potential energy.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Forces {
    acc: Vec<[f64; 3]>,
    potential: f64,
}

/// Concatenates the accelerations and adds the potentials, in chunk order.
struct ForcesInOrder;

impl Reducer for ForcesInOrder {
    type Value = Forces;
    fn identity(&self) -> Forces {
        Forces::default()
    }
    fn combine(&self, acc: &mut Forces, mut next: Forces) {
        acc.acc.append(&mut next.acc);
        acc.potential += next.potential;
    }
}

impl NBody {
    /// `n` bodies of equal mass in the unit ball with small random velocities, from a seed.
    fn new(n: usize, steps: u64, seed: u64) -> NBody {
        let mut rng = SplitMix(seed);
        let mut pos = Vec::with_capacity(n);
        while pos.len() < n {
            let p = [rng.signed(), rng.signed(), rng.signed()];
            if p.iter().map(|x| x * x).sum::<f64>() <= 1.0 {
                pos.push(p);
            }
        }
        let mut vel: Vec<[f64; 3]> = (0..n)
            .map(|_| [rng.signed() * 0.3, rng.signed() * 0.3, rng.signed() * 0.3])
            .collect();
        // No drift of the centre of mass.
        for k in 0..3 {
            let mean = vel.iter().map(|v| v[k]).sum::<f64>() / n as f64;
            vel.iter_mut().for_each(|v| v[k] -= mean);
        }
        NBody {
            pos,
            vel,
            mass: vec![1.0 / n as f64; n],
            dt: 1e-3,
            eps2: 0.05 * 0.05,
            step: 0,
            steps,
            energy_first: f64::NAN,
            energy_last: f64::NAN,
        }
    }

    fn kinetic(&self) -> f64 {
        self.vel
            .iter()
            .zip(&self.mass)
            .map(|(v, m)| 0.5 * m * (v[0] * v[0] + v[1] * v[1] + v[2] * v[2]))
            .sum()
    }

    /// A hash of every bit of the final state.
    fn fingerprint(&self) -> u64 {
        let mut h: u64 = 0xCBF2_9CE4_8422_2325;
        let bits = self.pos.iter().chain(&self.vel).flatten().copied();
        for x in bits.chain([self.energy_last]) {
            for b in x.to_bits().to_le_bytes() {
                h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3);
            }
        }
        h
    }
}

impl Fold for NBody {
    const NAME: &'static str = "nbody";
    type Acc = Forces;
    type Reducer = ForcesInOrder;
    type Input = ();

    fn iterations(&self) -> u64 {
        self.pos.len() as u64
    }

    fn reducer(&self) -> ForcesInOrder {
        ForcesInOrder
    }

    /// Body `i`: its acceleration from every other body, and the potential energy of its
    /// pairs with the bodies after it (each pair counted once).
    fn body(&self, _: &(), acc: &mut Forces, i: u64) {
        let i = i as usize;
        let pi = self.pos[i];
        let mut a = [0.0; 3];
        let mut potential = 0.0;
        for (j, (pj, &mj)) in self.pos.iter().zip(&self.mass).enumerate() {
            if j == i {
                continue;
            }
            let d = [pj[0] - pi[0], pj[1] - pi[1], pj[2] - pi[2]];
            let r2 = d[0] * d[0] + d[1] * d[1] + d[2] * d[2] + self.eps2;
            let inv = 1.0 / r2.sqrt();
            let inv3 = mj * inv * inv * inv;
            a[0] += d[0] * inv3;
            a[1] += d[1] * inv3;
            a[2] += d[2] * inv3;
            if j > i {
                potential -= self.mass[i] * mj * inv;
            }
        }
        acc.acc.push(a);
        acc.potential += potential;
    }

    /// The barrier after a step's forces: record the energy, then kick and drift.
    fn end_phase(&mut self, forces: &Forces) -> Next {
        assert_eq!(forces.acc.len(), self.pos.len(), "every body exactly once");
        self.energy_last = self.kinetic() + forces.potential;
        if self.step == 0 {
            self.energy_first = self.energy_last;
        }
        let dt = self.dt;
        for ((p, v), a) in self.pos.iter_mut().zip(&mut self.vel).zip(&forces.acc) {
            for k in 0..3 {
                v[k] += a[k] * dt;
                p[k] += v[k] * dt;
            }
        }
        self.step += 1;
        if self.step < self.steps {
            Next::Continue
        } else {
            Next::Finish
        }
    }
}

/// A splitmix64 stream (the kernels' generator), for the initial conditions.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        let r = kernels::splitmix64(self.0);
        self.0 = self.0.wrapping_add(kernels::GOLDEN);
        r
    }

    /// Uniform in [-1, 1).
    fn signed(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }
}

// ---------------------------------------------------------------------------------------
// Helpers.
// ---------------------------------------------------------------------------------------

struct Args {
    /// `--site-b URL`: this process is site B.
    site_b: Option<String>,
    workers: usize,
    store: Option<String>,
    deadline: f64,
    steps: u64,
    bodies: usize,
}

fn parse_args() -> Result<Args, Error> {
    let mut args = Args {
        site_b: None,
        workers: 3,
        store: None,
        deadline: 3.0,
        steps: 2400,
        bodies: 1024,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--site-b" => args.site_b = Some(value()?),
            "--workers" | "--site-b-workers" => args.workers = value()?.parse()?,
            "--store" => args.store = Some(value()?.trim_end_matches('/').to_owned()),
            "--deadline" => args.deadline = value()?.parse()?,
            "--steps" => args.steps = value()?.replace('_', "").parse()?,
            "--bodies" => args.bodies = value()?.parse()?,
            other => return Err(format!("unknown argument {other:?} (see the file's docs)").into()),
        }
    }
    if args.bodies < 2 || args.steps == 0 {
        return Err("need at least 2 bodies and 1 step".into());
    }
    Ok(args)
}

fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(f)
}

/// Wall-clock time of day, UTC, `HH:MM:SS.mmm`.
fn clock(t: SystemTime) -> String {
    let ms = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis());
    let (h, m, s) = (ms / 3_600_000 % 24, ms / 60_000 % 60, ms / 1000 % 60);
    format!("{h:02}:{m:02}:{s:02}.{:03} UTC", ms % 1000)
}

fn file_path(url: &str) -> Option<PathBuf> {
    url::Url::parse(url).ok()?.to_file_path().ok()
}

/// Copies a directory tree; returns the files and bytes copied.
fn copy_tree(from: &Path, to: &Path) -> std::io::Result<(u64, u64)> {
    std::fs::create_dir_all(to)?;
    let (mut files, mut bytes) = (0, 0);
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            let (f, b) = copy_tree(&entry.path(), &target)?;
            files += f;
            bytes += b;
        } else {
            bytes += std::fs::copy(entry.path(), &target)?;
            files += 1;
        }
    }
    Ok((files, bytes))
}

/// Copies every committed snapshot of the job between two stores of any kind, through the
/// store API: parts first, then the manifest (the commit). Returns the objects and bytes.
async fn copy_snapshots(from: &Store, to: &Store) -> Result<(u64, u64), Error> {
    let (mut objects, mut bytes) = (0, 0);
    for epoch in from.epochs(JOB_ID).await? {
        let mut manifest = from.manifest(&SnapshotId::new(JOB_ID, epoch)).await?;
        for part in &mut manifest.parts {
            let data = from.get_part(part).await?;
            bytes += data.len() as u64;
            *part = to
                .put_part(JOB_ID, epoch, manifest.phase, part.chunk, data)
                .await?;
            objects += 1;
        }
        to.commit(&manifest).await?;
        objects += 1;
    }
    Ok((objects, bytes))
}

// ---------------------------------------------------------------------------------------
// Site B: the second process.
// ---------------------------------------------------------------------------------------

fn site_b(url: &str, workers: usize) -> Result<(), Error> {
    let store = Store::open(url)?;
    let id = block_on(store.latest(JOB_ID))?.ok_or("no snapshot at site B")?;
    let manifest = block_on(store.manifest(&id))?;
    println!(
        "pid {}: resuming {id} (step {}) from {url} with {workers} worker{}{}",
        std::process::id(),
        manifest.phase,
        if workers == 1 { "" } else { "s" },
        if workers == 0 {
            " (inline: this thread computes)"
        } else {
            ""
        },
    );
    let t = Instant::now();
    let exec = Executor::builder()
        .local_workers(workers)
        .job_id(JOB_ID)
        .build()?;
    let finished = exec
        .resume::<Folded<NBody>>(url, At::Latest)?
        .wait()?
        .finished()
        .ok_or("the job did not finish at site B")?;
    let job = &finished.job.0;
    println!(
        "finished step {} of {} in {:.2} s; energy {:.12} (drift {:+.2e})",
        job.step,
        job.steps,
        t.elapsed().as_secs_f64(),
        job.energy_last,
        (job.energy_last - job.energy_first) / job.energy_first.abs()
    );
    // The line the first process reads.
    println!(
        "RESULT {:016x} {:016x}",
        job.fingerprint(),
        finished.value.potential.to_bits()
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Site A, the move, and the check: the first process.
// ---------------------------------------------------------------------------------------

fn main() -> ExitCode {
    let result = parse_args().and_then(|args| match &args.site_b {
        Some(url) => site_b(url, args.workers).map(|()| true),
        None => migrate(&args),
    });
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The whole story; `Ok(false)` when the check fails.
fn migrate(args: &Args) -> Result<bool, Error> {
    let (url_a, url_b) = match &args.store {
        Some(base) => (format!("{base}/site-a"), format!("{base}/site-b")),
        None => {
            let root =
                std::env::temp_dir().join(format!("malleable-migrate-{}", std::process::id()));
            let url = |site: &str| format!("file://{}", root.join(site).display());
            (url("site-a"), url("site-b"))
        }
    };
    let job = NBody::new(args.bodies, args.steps, 2024);
    println!(
        "n-body: {} bodies, {} time steps (one phase each), chunks of {CHUNK} bodies",
        args.bodies, args.steps
    );

    // Site A: two workers until the deadline.
    let t0 = Instant::now();
    let start = SystemTime::now();
    let deadline = start + Duration::from_secs_f64(args.deadline);
    println!(
        "\nsite A: {SITE_A_WORKERS} workers, store {url_a}\n\
         site A: deadline {} ({:.1} s from now), a snapshot every second",
        clock(deadline),
        args.deadline
    );
    let exec_a = Executor::builder()
        .local_workers(SITE_A_WORKERS)
        .chunking(Chunking::Size(CHUNK))
        .snapshots(&url_a)
        .job_id(JOB_ID)
        .keep_snapshots(2)
        .snapshot_every(Duration::from_secs(1))
        .deadline(deadline)
        .build()?;
    let handle = exec_a.submit(Folded(job.clone()))?;
    let waiter = std::thread::spawn({
        let handle = handle.clone();
        move || (handle.wait(), SystemTime::now())
    });
    let mut last_print = Instant::now();
    while !handle.is_finished() {
        std::thread::sleep(Duration::from_millis(20));
        if last_print.elapsed() >= Duration::from_secs(1) && !handle.is_finished() {
            last_print = Instant::now();
            let p = handle.progress();
            println!(
                "site A: {:5.1} s  step {:>5} of {}",
                t0.elapsed().as_secs_f64(),
                p.phase,
                args.steps
            );
        }
    }
    let (outcome, suspended_at) = waiter.join().expect("the waiting thread panicked");
    let elapsed_a = suspended_at.duration_since(start).unwrap_or_default();
    let id = match outcome? {
        Outcome::Suspended(id) => id,
        Outcome::Finished(_) => {
            eprintln!(
                "site A: the job finished before the deadline; nothing to migrate (more --steps?)"
            );
            return Ok(false);
        }
        _ => return Err("site A: an unknown outcome".into()),
    };
    let store_a = Store::open(&url_a)?;
    let manifest = block_on(store_a.manifest(&id))?;
    let before = deadline
        .duration_since(suspended_at)
        .map_err(|_| "site A: suspended after the deadline")?;
    println!(
        "site A: suspended at {} ({:.2} s after the start, {:.2} s before the deadline)\n\
         site A: snapshot {id}: epoch {}, at step {} of {} ({} of {} bodies of that step done, \
         {} chunk states in parts)",
        clock(suspended_at),
        elapsed_a.as_secs_f64(),
        before.as_secs_f64(),
        id.epoch,
        manifest.phase,
        args.steps,
        manifest.iterations_done,
        manifest.iterations_total,
        manifest.parts.len(),
    );
    if args.deadline < 10.0 && elapsed_a < Duration::from_secs(1) {
        println!(
            "site A: (no snapshot had been timed yet, so the executor kept its initial 10 s \
             margin and suspended at once; try --deadline 15 --steps 6000)"
        );
    }

    // The move: copy the store to site B.
    match (file_path(&url_a), file_path(&url_b)) {
        (Some(a), Some(b)) => {
            let copied = copy_tree(&a, &b)?;
            println!(
                "\ncopy:   {} -> {} (directory tree: {} files, {} bytes)",
                a.display(),
                b.display(),
                copied.0,
                copied.1
            );
        }
        _ => {
            let copied = block_on(copy_snapshots(&store_a, &Store::open(&url_b)?))?;
            println!(
                "\ncopy:   {url_a} -> {url_b} ({} objects, {} bytes of parts)",
                copied.0, copied.1
            );
        }
    }

    // Site B: a second process, another worker count.
    println!(
        "\nsite B: a second process resumes with {} worker{}",
        args.workers,
        if args.workers == 1 { "" } else { "s" }
    );
    let t_b = Instant::now();
    let mut child = Command::new(std::env::current_exe()?)
        .args(["--site-b", &url_b, "--workers", &args.workers.to_string()])
        .stdout(Stdio::piped())
        .spawn()?;
    let mut result = None;
    for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
        let line = line?;
        match line.strip_prefix("RESULT ") {
            Some(r) => result = Some(r.to_owned()),
            None => println!("site B | {line}"),
        }
    }
    let status = child.wait()?;
    if !status.success() {
        return Err(format!("site B exited with {status}").into());
    }
    let result = result.ok_or("site B printed no result")?;
    let elapsed_b = t_b.elapsed();

    // The check: the same job, uninterrupted, in this process.
    let t = Instant::now();
    let reference: Finished<Folded<NBody>> = Executor::builder()
        .local_workers(SITE_A_WORKERS)
        .chunking(Chunking::Size(CHUNK))
        .build()?
        .run(Folded(job))?;
    let expected = format!(
        "{:016x} {:016x}",
        reference.job.0.fingerprint(),
        reference.value.potential.to_bits()
    );
    println!(
        "\nreference: the same job uninterrupted in this process ({SITE_A_WORKERS} workers, \
         {:.2} s): state fingerprint {}, energy {:.12}",
        t.elapsed().as_secs_f64(),
        &expected[..16],
        reference.job.0.energy_last
    );

    let ok = result == expected;
    println!(
        "\nsummary\n\
         \x20 site A: {SITE_A_WORKERS} workers, deadline {:.1} s away; suspended after {:.2} s \
         to {id} (epoch {}, step {} of {})\n\
         \x20 copy:   site A's store copied to site B\n\
         \x20 site B: resumed in a second process with {} worker{}; finished in {:.2} s\n\
         \x20 value:  state fingerprint {}, last potential bits {}\n\
         \x20 check:  {}",
        args.deadline,
        elapsed_a.as_secs_f64(),
        id.epoch,
        manifest.phase,
        args.steps,
        args.workers,
        if args.workers == 1 { "" } else { "s" },
        elapsed_b.as_secs_f64(),
        &result[..16],
        &result[17..],
        if ok {
            "ok, bit-identical to the uninterrupted run".to_owned()
        } else {
            format!("FAILED: the uninterrupted run gives {expected}")
        }
    );
    let features = if url_b.starts_with("s3://") {
        "cli,s3"
    } else {
        "cli"
    };
    println!(
        "\nsite B store: {url_b}\n\
         inspect it:   cargo run --features {features} --bin snapshots -- ls {url_b}"
    );
    Ok(ok)
}
