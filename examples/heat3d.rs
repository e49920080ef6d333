//! Heat in a box: a 7-point Jacobi stencil on an `nz × ny × nx` grid cut into pencils that
//! exchange their faces with their neighbours ([`Exchange`] with [`Pattern::Neighbours`]),
//! checked bit for bit against the sequential loop.
//!
//! The grid is cut into `pz × py` pencils ([`Blocks::pencils`]), each spanning all of x: one
//! partition per pencil, made once and swept in place phase after phase (a plane per step)
//! on the worker that holds it. At the end of a phase a pencil exports one layer of cells
//! per face neighbour ([`Blocks::neighbours`]; up to four of them), and before the next it
//! takes its neighbours' layers in as its halos ([`Blocks::face`] says which). The phase's
//! value is the largest change of a cell; in the last phase each pencil also reports the
//! hash of each of its x lines. See `kernels/heat3d.rs` for the stencil.
//!
//! Checks: the largest change of every phase and every line of the final grid are the
//! sequential loop's, bit for bit, for the malleable run (and for rayon); the exit status is
//! non-zero on a mismatch. Prints the time of each phase of the malleable run.
//!
//! With `--processes` the malleable run is done by worker processes of this program that
//! join, retire and are killed with SIGKILL while it runs (the job rolls back to its latest
//! snapshot by itself), and the coordinator computes nothing: see `kernels/processes.rs`.
//! It also prints what crossed between the processes. The pencils' faces go from process to
//! process directly.
//!
//! ```text
//! cargo run --release --example heat3d
//! cargo run --release --example heat3d -- --n 128 --cut 4x2 --phases 50 --workers 2
//! cargo run --release --example heat3d -- --processes
//! cargo run --release --example heat3d -- --processes --n 96 --phases 400
//! ```
//!
//! Options: `--n N` (64: an N³ grid), `--cut PZxPY` (3x2), `--phases K` (40; 200 with
//! `--processes`, for the scenario to fit in the run), `--workers W` (2: the threads of the malleable and rayon runs; of the rayon run only with
//! `--processes`, where each worker process computes with one thread), `--processes`.

#[path = "kernels/mod.rs"]
pub(crate) mod kernels;

use std::ops::Range;
use std::process::ExitCode;
use std::time::Instant;

use malleable::reduce::Reducer;
use malleable::{Blocks, Chunk, Chunking, Exchange, Finished, Job, Next, Ownership, Pieces, Step};
use rayon::ThreadPoolBuilder;
use serde::{Deserialize, Serialize};

use kernels::heat3d::{self, Brick, Dims};
use kernels::processes;
use kernels::stencil::{Digest, Wording, check_all, phase_ended, trace, watch_phases};

pub(crate) type Error = Box<dyn std::error::Error + Send + Sync>;

/// The box as a malleable job: one partition per pencil of `blocks`.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Heat3d {
    dims: Dims,
    blocks: Blocks,
    phases: u64,
    /// Phases done, the last one's largest change and the trace of all of them.
    phase: u64,
    change: f64,
    trace: u64,
}

/// A pencil: its chunk number, its cells with halos, and the largest change of its phase so
/// far.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Pencil {
    me: u64,
    brick: Brick,
    change: f64,
}

/// What a pencil reports for a phase: its largest change and, in the last phase, the hash
/// of each of its lines with the line's number (`z · ny + y`).
pub(crate) type Report = (f64, Vec<(u64, u64)>);

/// The largest of the changes; the lines concatenated (sorted at the end).
#[derive(Debug)]
pub(crate) struct MaxAndLines;

impl Reducer for MaxAndLines {
    type Value = Report;
    fn identity(&self) -> Report {
        (0.0, Vec::new())
    }
    fn combine(&self, acc: &mut Report, mut next: Report) {
        acc.0 = acc.0.max(next.0);
        acc.1.append(&mut next.1);
    }
}

impl Job for Heat3d {
    const NAME: &'static str = "heat3d";
    const OWNERSHIP: Ownership<Self> = Ownership::EXCHANGES;
    type Chunk = Pencil;
    type Reducer = MaxAndLines;
    type Input = ();

    fn iterations(&self) -> u64 {
        self.blocks.len()
    }
    fn chunking(&self) -> Option<Chunking> {
        Some(Chunking::Size(1)) // one chunk per pencil: chunk c is pencil c
    }
    fn chunk(&self, range: Range<u64>) -> Pencil {
        let [z, y, _] = self.blocks.extent(range.start);
        let us = |r: Range<u64>| r.start as usize..r.end as usize;
        Pencil {
            me: range.start,
            brick: Brick::new(self.dims, us(z), us(y)),
            change: 0.0,
        }
    }
    fn reducer(&self) -> MaxAndLines {
        MaxAndLines
    }
    fn phases(&self) -> Option<u64> {
        Some(self.phases)
    }
    fn end_phase(&mut self, value: &Report) -> Next {
        self.change = value.0;
        self.trace = trace(self.trace, value.0);
        phase_ended(Self::NAME, self.phase, value.0);
        self.phase += 1;
        if self.phase < self.phases {
            Next::Continue
        } else {
            Next::Finish
        }
    }
}

impl Chunk for Pencil {
    type Job = Heat3d;
    type Output = Report;

    fn step(&mut self, job: &Heat3d, _: &()) -> Step<Report> {
        if let Some(c) = self.brick.sweep_next() {
            self.change = self.change.max(c);
        }
        if !self.brick.swept_all() {
            return Step::Yield;
        }
        self.brick.swap();
        let lines = if job.phase + 1 == job.phases {
            self.brick.line_hashes()
        } else {
            Vec::new()
        };
        Step::Done((self.change, lines))
    }
}

impl Exchange for Pencil {
    /// One layer of cells of a face, lines in order.
    type Piece = Vec<f64>;

    fn neighbours(job: &Heat3d, chunk: u64, _chunks: u64) -> Vec<u64> {
        job.blocks.neighbours(chunk)
    }

    fn export(&self, job: &Heat3d, to: Option<u64>) -> Vec<f64> {
        let face = to
            .and_then(|to| job.blocks.face(self.me, to))
            .expect("pieces go to face neighbours only");
        self.brick.boundary(face.dim, face.low)
    }

    fn begin_phase(&mut self, job: &Heat3d, pieces: Pieces<'_, Vec<f64>>) {
        for (from, cells) in pieces.iter() {
            let face = job
                .blocks
                .face(self.me, from)
                .expect("pieces come from face neighbours only");
            self.brick.set_halo(face.dim, face.low, cells);
        }
        self.change = 0.0;
    }
}

/// The command line (see the file's docs).
pub(crate) struct Args {
    pub(crate) n: usize,
    pub(crate) cut: [u64; 2],
    pub(crate) phases: u64,
    pub(crate) workers: usize,
    pub(crate) processes: bool,
}

/// The job of `args`.
pub(crate) fn job(args: &Args) -> Result<Heat3d, Error> {
    let n = args.n as u64;
    Ok(Heat3d {
        dims: Dims::cube(args.n),
        blocks: Blocks::pencils([n, n, n], args.cut)?,
        phases: args.phases,
        phase: 0,
        change: f64::NAN,
        trace: Digest::EMPTY_TRACE,
    })
}

/// The digest of a finished run, to compare with [`heat3d::sequential`]'s.
pub(crate) fn digest(done: &Finished<Heat3d>) -> Digest {
    let mut lines = done.value.1.clone();
    lines.sort_unstable();
    Digest {
        trace: done.job.trace,
        hashes: lines.into_iter().map(|(_, h)| h).collect(),
    }
}

fn parse_args() -> Result<Args, Error> {
    let mut args = Args {
        n: 64,
        cut: [3, 2],
        phases: 40,
        workers: 2,
        processes: false,
    };
    let mut phases = None;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--n" => args.n = value()?.parse()?,
            "--phases" => phases = Some(value()?.parse()?),
            "--workers" => args.workers = value()?.parse()?,
            processes::FLAG => args.processes = true,
            "--cut" => {
                let v = value()?;
                let (z, y) = v.split_once('x').ok_or("--cut takes PZxPY, as 3x2")?;
                args.cut = [z.parse()?, y.parse()?];
            }
            other => return Err(format!("unknown argument {other:?} (see the file's docs)").into()),
        }
    }
    args.phases = phases.unwrap_or(if args.processes { 200 } else { 40 });
    if args.n < 3 || args.phases == 0 {
        return Err("need --n >= 3 and --phases >= 1".into());
    }
    Ok(args)
}

fn main() -> ExitCode {
    if let Some(worker) = processes::serve_if_worker::<Heat3d>() {
        return worker;
    }
    kernels::exit_code(parse_args().and_then(|args| run(&args)))
}

/// Runs the three versions and checks them; `Ok(false)` on a mismatch.
pub(crate) fn run(args: &Args) -> Result<bool, Error> {
    let d = Dims::cube(args.n);
    let job = job(args)?;
    let blocks = job.blocks.clone();
    println!(
        "heat3d: {0} × {0} × {0} cells, {1} phases, {2} pencils ({3} × {4}), {5} workers",
        args.n,
        args.phases,
        blocks.len(),
        args.cut[0],
        args.cut[1],
        args.workers
    );

    let t = Instant::now();
    let reference = heat3d::sequential(d, args.phases);
    let t_seq = t.elapsed();

    let pool = ThreadPoolBuilder::new().num_threads(args.workers).build()?;
    let t = Instant::now();
    let by_rayon = pool.install(|| heat3d::rayon(d, args.phases));
    let t_rayon = t.elapsed();

    let phase_ends = watch_phases();
    let runner = processes::Runner::new(args.workers, args.processes)?;
    let start = Instant::now();
    let (done, processes) = runner.run(job)?;
    let t_mall = start.elapsed();
    let by_malleable = digest(&done);

    let ends = processes::timed(phase_ends.try_iter(), start);
    for (end, took, again) in &ends {
        println!(
            "phase {:>4}  {:>8.3} ms  largest change {:.3e}{again}",
            end.phase,
            took.as_secs_f64() * 1e3,
            end.value
        );
    }
    if let Some(summary) = processes {
        summary.print(ends.len() as u64);
    }
    let updates = (d.cells() as u64 * args.phases) as f64;
    for (what, t) in [
        ("sequential", t_seq),
        ("rayon", t_rayon),
        ("malleable", t_mall),
    ] {
        println!(
            "{what:<10} {:>8.3} s  {:>7.1} M cell updates/s",
            t.as_secs_f64(),
            updates / t.as_secs_f64() / 1e6
        );
    }

    let wording = Wording {
        item: ("line", "of the final grid"),
        trace: "the grid is the same but a phase's largest change differs",
        ok: "every line of the final grid and every phase's change, bit for bit",
    };
    let runs = [("rayon", &by_rayon.digest), ("malleable", &by_malleable)];
    Ok(check_all(&reference.digest, &runs, &wording))
}
