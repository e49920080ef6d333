//! Conjugate gradients on a sparse SPD matrix (the pattern of NAS CG) with the rows cut into
//! partitions that gather the search direction every iteration ([`Exchange`] with
//! [`Pattern::Allgather`]), checked bit for bit against the sequential solver.
//!
//! The matrix (`kernels/cg.rs`: a 3-D 7-point stencil plus random long-range couplings,
//! diagonally dominant) is read-only data built once per process from the job's seed (the
//! job's [`Input`]); the vectors are cut into `--blocks` blocks of rows, one partition per
//! block, which keeps its rows of `x`, `r`, `p` and `q`. An iteration is three phases:
//!
//! 1. `p = r + β p` on its rows (the first time, `p = r` and the partial `r·r`), then every
//!    partition exports its rows of `p` and receives everyone's: an allgather.
//! 2. `q = A p` on its rows, from the whole `p`; the partial `p·q` is the phase's value.
//! 3. `x += α p`, `r −= α q`; the partial `r·r`.
//!
//! The partial sums come back in chunk order and are added in that order at the barrier,
//! which computes `α` and `β` for the phases after: the same additions as the sequential
//! solver's over the same blocks, so the same bits for any number of workers.
//!
//! Checks: `r·r` after every iteration and `x` (a hash per block) are the sequential
//! solver's, bit for bit, for the malleable run (and for rayon); the exit status is non-zero
//! on a mismatch. Prints the time of each phase of the malleable run.
//!
//! With `--processes` the malleable run is done by worker processes of this program that
//! join, retire and are killed with SIGKILL while it runs (the job rolls back to its latest
//! snapshot by itself), and the coordinator computes nothing: see `kernels/processes.rs`.
//! It also prints what crossed between the processes. Each process builds the matrix
//! itself, from the job's seed.
//!
//! ```text
//! cargo run --release --example cg
//! cargo run --release --example cg -- --side 48 --iterations 100 --blocks 32 --workers 2
//! cargo run --release --example cg -- --processes
//! cargo run --release --example cg -- --processes --side 48 --iterations 200
//! ```
//!
//! Options: `--side S` (32: `S³` rows), `--iterations K` (40; 100 with `--processes`, for
//! the scenario to fit in the run), `--blocks B` (16), `--workers W` (2: the threads of the malleable and rayon runs; of the rayon run only with
//! `--processes`, where each worker process computes with one thread), `--processes`.

#[path = "kernels/mod.rs"]
pub(crate) mod kernels;

use std::ops::Range;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use malleable::reduce::CollectInOrder;
use malleable::{
    BoxError, Chunk, Chunking, Exchange, Finished, Input, Job, Next, Ownership, Pattern, Pieces,
    Step,
};
use rayon::ThreadPoolBuilder;
use serde::{Deserialize, Serialize};

use kernels::cg::{self, Csr};
use kernels::processes;
use kernels::stencil::{
    Checked, Digest, Report, Wording, check_all, hash_cells, phase_ended, trace, watch_phases,
};

pub(crate) type Error = Box<dyn std::error::Error + Send + Sync>;

/// The solve as a malleable job: the small, broadcast state of CG.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Cg {
    spec: cg::Spec,
    /// Rows of the matrix, and blocks of rows (partitions).
    n: u64,
    blocks: u64,
    /// CG iterations to run (three phases each).
    cg_iterations: u64,
    /// Phases done (three per iteration).
    phase: u64,
    rho: f64,
    alpha: f64,
    beta: f64,
    /// The trace of `ρ` after every iteration.
    trace: u64,
}

/// What a phase does, from its number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `p = r + β p`, then the allgather of `p`.
    Direction,
    /// `q = A p`, the partial `p·q`.
    Product,
    /// `x += α p; r −= α q`, the partial `r·r`.
    Update,
}

impl Cg {
    fn kind(phase: u64) -> Kind {
        match phase % 3 {
            0 => Kind::Direction,
            1 => Kind::Product,
            _ => Kind::Update,
        }
    }

    fn rows(&self, chunk: u64) -> Range<usize> {
        cg::block(self.n as usize, self.blocks as usize, chunk as usize)
    }
}

/// The matrix, built once per process from the job's spec (or taken from [`publish`], so
/// that every version is timed without building it).
#[derive(Debug)]
pub(crate) struct Matrix(Arc<Csr>);

/// The matrix this process built last, with its spec.
static BUILT: Mutex<Option<(cg::Spec, Arc<Csr>)>> = Mutex::new(None);

/// Keeps `a`, built from `spec`, for the runs of this process that read it.
pub(crate) fn publish(spec: cg::Spec, a: Csr) -> Arc<Csr> {
    let a = Arc::new(a);
    *BUILT.lock().unwrap_or_else(|p| p.into_inner()) = Some((spec, Arc::clone(&a)));
    a
}

impl Input<Cg> for Matrix {
    fn load(job: &Cg) -> Result<Self, BoxError> {
        let built = BUILT.lock().unwrap_or_else(|p| p.into_inner()).clone();
        Ok(Matrix(match built {
            Some((spec, a)) if spec == job.spec => a,
            _ => Arc::new(cg::matrix(job.spec)),
        }))
    }
}

/// A block of rows of the vectors (and, between the allgather and the product, the whole
/// search direction).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Rows {
    rows: Range<usize>,
    x: Vec<f64>,
    r: Vec<f64>,
    p: Vec<f64>,
    q: Vec<f64>,
    /// The whole `p`, from the allgather (empty outside the product phase): one vector
    /// shared by the blocks of this process ([`Pieces::concat`]), stored by a snapshot as
    /// its items.
    #[serde(with = "shared_vec")]
    p_all: Arc<Vec<f64>>,
}

/// An `Arc<Vec<f64>>` (de)serialized as its items.
mod shared_vec {
    use std::sync::Arc;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub(crate) fn serialize<S: Serializer>(v: &Arc<Vec<f64>>, s: S) -> Result<S::Ok, S::Error> {
        v.as_slice().serialize(s)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Arc<Vec<f64>>, D::Error> {
        Vec::deserialize(d).map(Arc::new)
    }
}

impl Job for Cg {
    const NAME: &'static str = "cg";
    const OWNERSHIP: Ownership<Self> = Ownership::EXCHANGES;
    type Chunk = Rows;
    /// Each block's partial sum (one value), in block order, and in the last phase each
    /// block's hash of `x`.
    type Reducer = Checked<CollectInOrder<f64>>;
    type Input = Matrix;

    fn iterations(&self) -> u64 {
        self.blocks
    }
    fn chunking(&self) -> Option<Chunking> {
        Some(Chunking::Size(1)) // chunk k is block k
    }
    fn chunk(&self, range: Range<u64>) -> Rows {
        let rows = self.rows(range.start);
        let len = rows.len();
        Rows {
            r: cg::rhs_rows(rows.clone(), self.spec.seed),
            rows,
            x: vec![0.0; len],
            p: vec![0.0; len],
            q: vec![0.0; len],
            p_all: Arc::default(),
        }
    }
    fn reducer(&self) -> Self::Reducer {
        Checked(CollectInOrder::new())
    }
    fn phases(&self) -> Option<u64> {
        Some(3 * self.cg_iterations)
    }
    fn end_phase(&mut self, value: &Report<Vec<f64>>) -> Next {
        let sum = cg::sum_in_order(value.value.iter().copied());
        match Cg::kind(self.phase) {
            Kind::Direction if self.phase == 0 => self.rho = sum,
            Kind::Direction => {}
            Kind::Product => self.alpha = self.rho / sum,
            Kind::Update => {
                self.beta = sum / self.rho;
                self.rho = sum;
                self.trace = trace(self.trace, sum);
            }
        }
        phase_ended(Self::NAME, self.phase, self.rho);
        self.phase += 1;
        if self.phase < 3 * self.cg_iterations {
            Next::Continue
        } else {
            Next::Finish
        }
    }
}

impl Chunk for Rows {
    type Job = Cg;
    type Output = Report<Vec<f64>>;

    fn step(&mut self, job: &Cg, a: &Matrix) -> Step<Report<Vec<f64>>> {
        let mut out = Report::<Vec<f64>>::default();
        match Cg::kind(job.phase) {
            Kind::Direction => {
                // The first time β is 0 and p is 0: p = r exactly.
                cg::update_p(job.beta, &mut self.p, &self.r);
                if job.phase == 0 {
                    out.value.push(cg::dot(&self.r, &self.r));
                }
            }
            Kind::Product => {
                cg::spmv_rows(&a.0, &self.p_all, self.rows.clone(), &mut self.q);
                out.value.push(cg::dot(&self.p, &self.q));
                // Not needed until the next gather (nor stored by a snapshot meanwhile).
                self.p_all = Arc::default();
            }
            Kind::Update => {
                let rr = cg::update_xr(job.alpha, &mut self.x, &mut self.r, &self.p, &self.q);
                out.value.push(rr);
                if job.phase + 1 == 3 * job.cg_iterations {
                    out.hashes.push(hash_cells(&self.x));
                }
            }
        }
        Step::Done(out)
    }
}

impl Exchange for Rows {
    /// A block's rows of `p`.
    type Piece = Vec<f64>;

    fn neighbours(_: &Cg, _chunk: u64, _chunks: u64) -> Vec<u64> {
        Vec::new() // no phase exchanges with neighbours
    }

    fn pattern(_: &Cg, phase: u64) -> Pattern {
        match Cg::kind(phase) {
            Kind::Direction => Pattern::Allgather,
            _ => Pattern::Nothing,
        }
    }

    fn export(&self, _: &Cg, _to: Option<u64>) -> Vec<f64> {
        self.p.clone()
    }

    fn begin_phase(&mut self, job: &Cg, pieces: Pieces<'_, Vec<f64>>) {
        if !pieces.is_empty() {
            self.p_all = pieces.concat();
            assert_eq!(self.p_all.len() as u64, job.n, "every block's p");
        }
    }
}

/// The command line (see the file's docs).
pub(crate) struct Args {
    pub(crate) side: usize,
    pub(crate) iterations: u64,
    pub(crate) blocks: usize,
    pub(crate) workers: usize,
    pub(crate) processes: bool,
}

/// The problem of `args`.
pub(crate) fn spec(args: &Args) -> cg::Spec {
    cg::Spec {
        side: args.side,
        extra: 4,
        shift: 0.5,
        seed: 42,
    }
}

/// The job of `args`.
pub(crate) fn job(args: &Args) -> Cg {
    Cg {
        spec: spec(args),
        n: args.side.pow(3) as u64,
        blocks: args.blocks as u64,
        cg_iterations: args.iterations,
        phase: 0,
        rho: f64::NAN,
        alpha: f64::NAN,
        beta: 0.0,
        trace: Digest::EMPTY_TRACE,
    }
}

/// The digest of a finished run, to compare with [`cg::sequential`]'s.
pub(crate) fn digest(done: &Finished<Cg>) -> Digest {
    Digest {
        trace: done.job.trace,
        hashes: done.value.hashes.clone(),
    }
}

fn parse_args() -> Result<Args, Error> {
    let mut args = Args {
        side: 32,
        iterations: 40,
        blocks: 16,
        workers: 2,
        processes: false,
    };
    let mut iterations = None;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--side" => args.side = value()?.parse()?,
            "--iterations" => iterations = Some(value()?.parse()?),
            "--blocks" => args.blocks = value()?.parse()?,
            "--workers" => args.workers = value()?.parse()?,
            processes::FLAG => args.processes = true,
            other => return Err(format!("unknown argument {other:?} (see the file's docs)").into()),
        }
    }
    args.iterations = iterations.unwrap_or(if args.processes { 100 } else { 40 });
    if args.side < 1 || args.iterations == 0 || args.blocks == 0 {
        return Err("need --side >= 1, --iterations >= 1 and --blocks >= 1".into());
    }
    if args.blocks > args.side.pow(3) {
        return Err("more blocks than rows".into());
    }
    Ok(args)
}

fn main() -> ExitCode {
    if let Some(worker) = processes::serve_if_worker::<Cg>() {
        return worker;
    }
    kernels::exit_code(parse_args().and_then(|args| run(&args)))
}

/// Runs the three versions and checks them; `Ok(false)` on a mismatch.
pub(crate) fn run(args: &Args) -> Result<bool, Error> {
    let spec = spec(args);
    let a = publish(spec, cg::matrix(spec));
    let b = cg::rhs(a.n, spec.seed);
    println!(
        "cg: {} rows, {} entries, {} iterations, {} blocks of rows, {} workers",
        a.n,
        a.entries(),
        args.iterations,
        args.blocks,
        args.workers
    );

    let t = Instant::now();
    let reference = cg::sequential(&a, &b, args.iterations, args.blocks);
    let t_seq = t.elapsed();

    let pool = ThreadPoolBuilder::new().num_threads(args.workers).build()?;
    let t = Instant::now();
    let by_rayon = pool.install(|| cg::rayon(&a, &b, args.iterations, args.blocks));
    let t_rayon = t.elapsed();

    let phase_ends = watch_phases();
    let runner = processes::Runner::new(args.workers, args.processes)?;
    let start = Instant::now();
    let (done, processes) = runner.run(job(args))?;
    let t_mall = start.elapsed();
    let by_malleable = digest(&done);

    let names = [
        "p = r + βp, allgather p",
        "q = Ap, p·q",
        "x += αp, r −= αq, r·r",
    ];
    let ends = processes::timed(phase_ends.try_iter(), start);
    for (end, took, again) in &ends {
        println!(
            "phase {:>4}  {:>8.3} ms  {:<24} ρ = {:.6e}{again}",
            end.phase,
            took.as_secs_f64() * 1e3,
            names[(end.phase % 3) as usize],
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
            "{what:<10} {:>8.3} s  {:>7.3} ms per iteration",
            t.as_secs_f64(),
            t.as_secs_f64() * 1e3 / args.iterations as f64
        );
    }
    let residual = cg::relative_residual(&a, &reference.x, &b);
    println!(
        "solve  ‖b − Ax‖ / ‖b‖ = {residual:.3e} after {} iterations",
        args.iterations
    );

    let wording = Wording {
        item: ("block", "of x"),
        trace: "x is the same but an iteration's r·r differs",
        ok: "x and every iteration's r·r, bit for bit",
    };
    let runs = [("rayon", &by_rayon.digest), ("malleable", &by_malleable)];
    Ok(check_all(&reference.digest, &runs, &wording))
}
