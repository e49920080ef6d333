//! A spectral time-stepper on a 2-D complex grid (the pattern of NAS FT) whose partitions
//! transpose the grid between them with an all-to-all ([`Exchange`] with
//! [`Pattern::AllToAll`]), checked bit for bit against the sequential loop.
//!
//! The `ny × nx` grid (powers of two) is held by `--parts` partitions: partition `i` holds
//! the rows `band(ny, P, i)` of the grid in normal layout, and the rows `band(nx, P, i)` of
//! its spectrum, which is kept transposed (see `kernels/ft.rs`). A 2-D FFT is row FFTs, a
//! transpose, row FFTs; each transpose is the barrier between two phases: partition `i`
//! exports for each partition `j` the block of its rows restricted to `j`'s columns, and `j`
//! assembles the blocks from everyone, in sender order, into its rows of the transposed
//! grid. The phases:
//!
//! - phase 0: the initial rows, FFTs along x; all-to-all;
//! - phase 1: FFTs along y (the spectrum), then step 1: evolve the spectrum, a copy of it
//!   transformed back along y; all-to-all;
//! - phase `t` (2 ≤ t ≤ steps): inverse FFTs along x of the rows of step `t − 1`'s grid and
//!   their checksum terms (the phase's value), then step `t` as above; all-to-all;
//! - phase `steps + 1`: the last inverse FFTs along x, the checksum terms and each row's
//!   hash; nothing to exchange.
//!
//! The checksum terms come back tagged with their number and are added in that order at the
//! barrier, as the sequential loop adds them.
//!
//! Checks: every step's checksum and every row of the last step's grid are the sequential
//! loop's, bit for bit, for the malleable run (and for rayon); the exit status is non-zero
//! on a mismatch. Prints the time of each phase of the malleable run.
//!
//! With `--processes` the malleable run is done by worker processes of this program that
//! join, retire and are killed with SIGKILL while it runs (the job rolls back to its latest
//! snapshot by itself), and the coordinator computes nothing: see `kernels/processes.rs`.
//! It also prints what crossed between the processes.
//!
//! ```text
//! cargo run --release --example ft
//! cargo run --release --example ft -- --ny 512 --nx 256 --steps 20 --parts 8 --workers 2
//! cargo run --release --example ft -- --processes
//! cargo run --release --example ft -- --processes --ny 512 --steps 100 --parts 8
//! ```
//!
//! Options: `--ny N` (256), `--nx N` (256), `--steps K` (10; 60 with `--processes`, for the
//! scenario to fit in the run), `--parts P` (6), `--workers W` (2: the threads of the malleable and rayon runs; of the rayon run only with
//! `--processes`, where each worker process computes with one thread), `--processes`.

#[path = "kernels/mod.rs"]
pub(crate) mod kernels;

use std::ops::Range;
use std::process::ExitCode;
use std::time::Instant;

use malleable::reduce::CollectInOrder;
use malleable::{
    BoxError, Chunk, Chunking, Exchange, Finished, Input, Job, Next, Ownership, Pattern, Pieces,
    Step,
};
use rayon::ThreadPoolBuilder;
use serde::{Deserialize, Serialize};

use kernels::ft::{self, C, Plans};
use kernels::processes;
use kernels::stencil::{
    Checked, Digest, Report, Wording, check_all, hash_cells, phase_ended, trace, watch_phases,
};

pub(crate) type Error = Box<dyn std::error::Error + Send + Sync>;

/// The run as a malleable job.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Ft {
    spec: ft::Spec,
    parts: u64,
    steps: u64,
    /// Phases done, the last checksum and the trace of all of them.
    phase: u64,
    checksum: C,
    trace: u64,
}

impl Ft {
    fn phases(&self) -> u64 {
        self.steps + 2
    }

    /// Partition `i`'s rows in normal layout (y) and in the transposed spectrum (kx).
    fn bands(&self, i: u64) -> (Range<usize>, Range<usize>) {
        let (p, i) = (self.parts as usize, i as usize);
        (ft::band(self.spec.ny, p, i), ft::band(self.spec.nx, p, i))
    }
}

/// The 1-D transforms, made once per process.
#[derive(Debug)]
pub(crate) struct Transforms(Plans);

impl Input<Ft> for Transforms {
    fn load(job: &Ft) -> Result<Self, BoxError> {
        Ok(Transforms(Plans::new(&job.spec)))
    }
}

/// A partition: its rows of the spectrum (transposed), and in passing its rows of a grid in
/// normal layout or of a transform on its way back.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Part {
    me: u64,
    normal: Range<usize>,
    spectral: Range<usize>,
    /// Its rows of the spectrum, `spectral.len()` rows of `ny` (empty before phase 1).
    spectrum: Vec<C>,
    /// Rows received at the last barrier (assembled), to be worked on in this phase.
    inbox: Vec<C>,
    /// Rows to export at the end of this phase: normal rows after the FFTs along x (phase
    /// 0), then the transposed rows of a step's copy after the inverse FFTs along y.
    outbox: Vec<C>,
    /// The evolution factors of its rows of the spectrum: a function of the spec alone, so
    /// not serialized (made again where the partition is read back).
    #[serde(skip)]
    factors: Vec<f64>,
}

impl Part {
    /// One step's evolution of its rows of the spectrum.
    fn evolve(&mut self, spec: &ft::Spec) {
        if self.factors.is_empty() {
            self.factors = self
                .spectral
                .clone()
                .flat_map(|kx| ft::factors_row(spec, kx))
                .collect();
        }
        for (row, f) in self
            .spectrum
            .chunks_exact_mut(spec.ny)
            .zip(self.factors.chunks_exact(spec.ny))
        {
            ft::evolve_row(row, f);
        }
    }
}

impl Job for Ft {
    const NAME: &'static str = "nas-ft";
    const OWNERSHIP: Ownership<Self> = Ownership::EXCHANGES;
    type Chunk = Part;
    /// The checksum terms `(j, value)` in this partition's rows; in the last phase, the hash
    /// of each of its rows.
    type Reducer = Checked<CollectInOrder<(u64, C)>>;
    type Input = Transforms;

    fn iterations(&self) -> u64 {
        self.parts
    }
    fn chunking(&self) -> Option<Chunking> {
        Some(Chunking::Size(1)) // chunk i is partition i
    }
    fn chunk(&self, range: Range<u64>) -> Part {
        let (normal, spectral) = self.bands(range.start);
        Part {
            me: range.start,
            normal,
            spectral,
            spectrum: Vec::new(),
            inbox: Vec::new(),
            outbox: Vec::new(),
            factors: Vec::new(),
        }
    }
    fn reducer(&self) -> Self::Reducer {
        Checked(CollectInOrder::new())
    }
    fn phases(&self) -> Option<u64> {
        Some(self.phases())
    }
    fn end_phase(&mut self, value: &Report<Vec<(u64, C)>>) -> Next {
        if self.phase >= 2 {
            let mut terms = value.value.clone();
            terms.sort_by_key(|&(j, _)| j);
            self.checksum = ft::sum_picks(terms.into_iter().map(|(_, v)| v));
            self.trace = trace(trace(self.trace, self.checksum.re), self.checksum.im);
        }
        phase_ended(Self::NAME, self.phase, self.checksum.re);
        self.phase += 1;
        if self.phase < self.phases() {
            Next::Continue
        } else {
            Next::Finish
        }
    }
}

impl Chunk for Part {
    type Job = Ft;
    type Output = Report<Vec<(u64, C)>>;

    fn step(&mut self, job: &Ft, t: &Transforms) -> Step<Self::Output> {
        let (spec, Plans { fx, fy }) = (&job.spec, &t.0);
        let mut out = Report::<Vec<(u64, C)>>::default();
        if job.phase == 0 {
            let mut rows = vec![C::ZERO; self.normal.len() * spec.nx];
            for (r, y) in rows.chunks_exact_mut(spec.nx).zip(self.normal.clone()) {
                ft::init_row(spec, y, r);
                fx.forward(r);
            }
            self.outbox = rows;
            return Step::Done(out);
        }
        if job.phase == 1 {
            self.spectrum = std::mem::take(&mut self.inbox);
            self.spectrum
                .chunks_exact_mut(spec.ny)
                .for_each(|r| fy.forward(r));
        } else {
            // The grid of the step before, back in normal layout: its checksum terms.
            let mut grid = std::mem::take(&mut self.inbox);
            grid.chunks_exact_mut(spec.nx).for_each(|r| fx.inverse(r));
            out.value = ft::picks_in(spec, self.normal.clone(), &grid);
            if job.phase + 1 == job.phases() {
                let flat = |r: &[C]| r.iter().flat_map(|c| [c.re, c.im]).collect::<Vec<_>>();
                out.hashes = grid
                    .chunks_exact(spec.nx)
                    .map(|r| hash_cells(&flat(r)))
                    .collect();
                return Step::Done(out);
            }
        }
        self.evolve(spec);
        let mut copy = self.spectrum.clone();
        copy.chunks_exact_mut(spec.ny).for_each(|r| fy.inverse(r));
        self.outbox = copy;
        Step::Done(out)
    }
}

impl Exchange for Part {
    /// A block of rows restricted to the receiver's columns.
    type Piece = Vec<C>;

    fn neighbours(_: &Ft, _chunk: u64, _chunks: u64) -> Vec<u64> {
        Vec::new() // every exchange is an all-to-all
    }

    fn pattern(job: &Ft, phase: u64) -> Pattern {
        if phase + 1 < job.phases() {
            Pattern::AllToAll
        } else {
            Pattern::Nothing
        }
    }

    fn export(&self, job: &Ft, to: Option<u64>) -> Vec<C> {
        let to = to.expect("an all-to-all addresses every piece");
        let (normal, spectral) = job.bands(to);
        if job.phase == 0 {
            // Normal rows (nx wide) to the spectral rows of `to`.
            ft::block_for(&self.outbox, job.spec.nx, spectral)
        } else {
            // Transposed rows (ny wide) to the normal rows of `to`.
            ft::block_for(&self.outbox, job.spec.ny, normal)
        }
    }

    fn begin_phase(&mut self, job: &Ft, pieces: Pieces<'_, Vec<C>>) {
        self.outbox = Vec::new();
        if pieces.is_empty() {
            return;
        }
        let spec = &job.spec;
        // After phase 0 the pieces are rows along x, giving spectral rows (ny long); after
        // the others they are transposed rows, giving normal rows (nx long).
        let (rows, width) = if job.phase == 1 {
            (self.spectral.len(), spec.ny)
        } else {
            (self.normal.len(), spec.nx)
        };
        self.inbox = ft::assemble(pieces.iter().map(|(_, p)| p.as_slice()), rows, width);
    }
}

/// The command line (see the file's docs).
pub(crate) struct Args {
    pub(crate) ny: usize,
    pub(crate) nx: usize,
    pub(crate) steps: u64,
    pub(crate) parts: u64,
    pub(crate) workers: usize,
    pub(crate) processes: bool,
}

/// The problem of `args`.
pub(crate) fn spec(args: &Args) -> ft::Spec {
    ft::Spec::new(args.ny, args.nx, 314_159_265)
}

/// The job of `args`.
pub(crate) fn job(args: &Args) -> Ft {
    Ft {
        spec: spec(args),
        parts: args.parts,
        steps: args.steps,
        phase: 0,
        checksum: C::ZERO,
        trace: Digest::EMPTY_TRACE,
    }
}

/// The digest of a finished run, to compare with [`ft::sequential`]'s.
pub(crate) fn digest(done: &Finished<Ft>) -> Digest {
    Digest {
        trace: done.job.trace,
        hashes: done.value.hashes.clone(),
    }
}

fn parse_args() -> Result<Args, Error> {
    let mut args = Args {
        ny: 256,
        nx: 256,
        steps: 10,
        parts: 6,
        workers: 2,
        processes: false,
    };
    let mut steps = None;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--ny" => args.ny = value()?.parse()?,
            "--nx" => args.nx = value()?.parse()?,
            "--steps" => steps = Some(value()?.parse()?),
            "--parts" => args.parts = value()?.parse()?,
            "--workers" => args.workers = value()?.parse()?,
            processes::FLAG => args.processes = true,
            other => return Err(format!("unknown argument {other:?} (see the file's docs)").into()),
        }
    }
    args.steps = steps.unwrap_or(if args.processes { 60 } else { 10 });
    if !args.ny.is_power_of_two() || !args.nx.is_power_of_two() || args.steps == 0 {
        return Err("need --ny and --nx powers of two and --steps >= 1".into());
    }
    if args.parts == 0 || args.parts as usize > args.ny.min(args.nx) {
        return Err("need 1 <= --parts <= min(ny, nx)".into());
    }
    Ok(args)
}

fn main() -> ExitCode {
    if let Some(worker) = processes::serve_if_worker::<Ft>() {
        return worker;
    }
    kernels::exit_code(parse_args().and_then(|args| run(&args)))
}

/// Runs the three versions and checks them; `Ok(false)` on a mismatch.
pub(crate) fn run(args: &Args) -> Result<bool, Error> {
    let spec = spec(args);
    println!(
        "ft: {} × {} complex cells, {} steps, {} partitions, {} workers",
        spec.ny, spec.nx, args.steps, args.parts, args.workers
    );

    let t = Instant::now();
    let reference = ft::sequential(&spec, args.steps);
    let t_seq = t.elapsed();

    let pool = ThreadPoolBuilder::new().num_threads(args.workers).build()?;
    let t = Instant::now();
    let by_rayon = pool.install(|| ft::rayon(&spec, args.steps));
    let t_rayon = t.elapsed();

    let phase_ends = watch_phases();
    let runner = processes::Runner::new(args.workers, args.processes)?;
    let start = Instant::now();
    let (done, processes) = runner.run(job(args))?;
    let t_mall = start.elapsed();
    let by_malleable = digest(&done);

    let ends = processes::timed(phase_ends.try_iter(), start);
    for (end, took, again) in &ends {
        let what = match end.phase {
            0 => "FFTs along x".to_owned(),
            1 => "FFTs along y, step 1".to_owned(),
            p if p == args.steps + 1 => format!("checksum {}", p - 1),
            p => format!("checksum {}, step {p}", p - 1),
        };
        println!(
            "phase {:>4}  {:>8.3} ms  {what:<22} checksum.re {:.12e}{again}",
            end.phase,
            took.as_secs_f64() * 1e3,
            end.value
        );
    }
    if let Some(summary) = processes {
        summary.print(ends.len() as u64);
    }
    for (what, t) in [
        ("sequential", t_seq),
        ("rayon", t_rayon),
        ("malleable", t_mall),
    ] {
        println!(
            "{what:<10} {:>8.3} s  {:>7.3} ms per step",
            t.as_secs_f64(),
            t.as_secs_f64() * 1e3 / args.steps as f64
        );
    }
    if let Some(c) = reference.checksums.last() {
        println!("last checksum {:.15e} {:+.15e} i", c.re, c.im);
    }

    let wording = Wording {
        item: ("row", "of the last grid"),
        trace: "the last grid is the same but a step's checksum differs",
        ok: "every step's checksum and the last grid, bit for bit",
    };
    let runs = [("rayon", &by_rayon.digest), ("malleable", &by_malleable)];
    Ok(check_all(&reference.digest, &runs, &wording))
}
