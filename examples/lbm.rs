//! A D2Q9 Lattice-Boltzmann channel (plane Poiseuille flow) as a malleable job whose grid
//! stays on the workers, checked bit for bit against the sequential loop and a rayon run.
//!
//! The channel is `--width` cells long (periodic) and `--height` rows high, with walls above
//! and below (half-way bounce-back), driven by a body force; each time step is one phase: a
//! row gathers its distributions from the rows next to it as the previous step left them,
//! then collides (BGK). See `kernels/stencil.rs`, module `lbm`. A cell is `[f64; 9]`.
//!
//! Checks: the final grid (a hash of each row's cells) and the mass and kinetic energy of
//! every step are the sequential loop's, bit for bit, for rayon (2 threads) and for the
//! malleable run (2 workers); and, as a check of the physics all three share, when the run is
//! long enough for the flow to have settled, the speed profile across the channel is within
//! 3 % (of the centre speed `F·H² / (8ν)`) of the analytic Poiseuille parabola.
//!
//! ```text
//! cargo run --release --example lbm
//! cargo run --release --example lbm -- --width 1024 --height 128 --steps 20000
//! ```
//!
//! Options: `--width X` (256), `--height Y` (32), `--steps N` (4000), `--tau T` (1.0),
//! `--force F` (1e-5).

#[path = "kernels/mod.rs"]
mod kernels;

use std::process::ExitCode;
use std::time::Instant;

use malleable::{Banded, Executor};
use rayon::ThreadPoolBuilder;

use kernels::stencil::lbm::{self, Fluid, Lbm, Solution};

type Error = Box<dyn std::error::Error + Send + Sync>;

struct Args {
    width: usize,
    height: usize,
    steps: u64,
    fluid: Fluid,
}

fn parse_args() -> Result<Args, Error> {
    let mut args = Args {
        width: 256,
        height: 32,
        steps: 4000,
        fluid: Fluid {
            tau: 1.0,
            force: 1e-5,
        },
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--width" => args.width = value()?.parse()?,
            "--height" => args.height = value()?.parse()?,
            "--steps" => args.steps = value()?.replace('_', "").parse()?,
            "--tau" => args.fluid.tau = value()?.parse()?,
            "--force" => args.fluid.force = value()?.parse()?,
            other => return Err(format!("unknown argument {other:?} (see the file's docs)").into()),
        }
    }
    if args.width < 1 || args.height < 2 || args.steps == 0 || args.fluid.tau <= 0.5 {
        return Err("need --width >= 1, --height >= 2, --steps >= 1 and --tau > 0.5".into());
    }
    Ok(args)
}

/// Whether a run is the sequential loop's, bit for bit; prints the verdict.
fn check(what: &str, got: &Solution, reference: &Solution) -> bool {
    let same_scalars = got.mass.to_bits() == reference.mass.to_bits()
        && got.energy.to_bits() == reference.energy.to_bits();
    let verdict = match got.digest.first_difference(&reference.digest) {
        Some(row) => format!("FAILED: row {row} of the final grid differs"),
        None if got.digest.trace != reference.digest.trace || !same_scalars => {
            "FAILED: the grid is the same but the steps' mass or energy differ".to_owned()
        }
        None => "ok: the final grid and every step's mass and energy, bit for bit".to_owned(),
    };
    println!("check  {what}: {verdict}");
    verdict.starts_with("ok")
}

fn main() -> ExitCode {
    kernels::exit_code(parse_args().and_then(|args| run(&args)))
}

fn run(args: &Args) -> Result<bool, Error> {
    let (w, h, steps, fluid) = (args.width, args.height, args.steps, args.fluid);
    let cells = (w * h) as f64;
    println!(
        "LBM D2Q9 channel: {w} × {h} cells, {steps} time steps, τ = {} (ν = {:.4}), force {:e}",
        fluid.tau,
        fluid.viscosity(),
        fluid.force
    );

    let t = Instant::now();
    let reference = lbm::sequential(w, h, fluid, steps);
    let t_seq = t.elapsed();

    let pool = ThreadPoolBuilder::new().num_threads(2).build()?;
    let t = Instant::now();
    let by_rayon = pool.install(|| lbm::rayon(w, h, fluid, steps));
    let t_rayon = t.elapsed();

    let exec = Executor::builder().local_workers(2).build()?;
    let t = Instant::now();
    let done = exec.run(Banded(Lbm::new(w as u64, h as u64, fluid, steps)))?;
    let t_mall = t.elapsed();
    let by_malleable = Lbm::solution(&done);

    let mlups = |t: std::time::Duration| cells * steps as f64 / t.as_secs_f64() / 1e6;
    println!(
        "sequential    {:>7.3} s  {:>6.1} M cell updates/s",
        t_seq.as_secs_f64(),
        mlups(t_seq)
    );
    println!(
        "rayon (2)     {:>7.3} s  {:>6.1} M cell updates/s",
        t_rayon.as_secs_f64(),
        mlups(t_rayon)
    );
    println!(
        "malleable (2) {:>7.3} s  {:>6.1} M cell updates/s  ({} bands of rows)",
        t_mall.as_secs_f64(),
        mlups(t_mall),
        done.job.0.bands
    );

    // The physics: the speed profile across the channel against the steady parabola
    // u(y) = F / (2ν) · (y + ½)(H − ½ − y): half-way bounce-back puts the walls half a cell
    // outside the first and last rows.
    let grid = reference
        .grid
        .as_deref()
        .expect("the sequential run keeps its grid");
    let (hf, nu) = (h as f64, fluid.viscosity());
    let steady = fluid.poiseuille_max(h as u64);
    let deviation = (0..h)
        .map(|y| {
            let yf = y as f64;
            let parabola = fluid.force / (2.0 * nu) * (yf + 0.5) * (hf - 0.5 - yf);
            (lbm::speed(&grid[y * w]) - parabola).abs() / steady
        })
        .fold(0.0, f64::max);
    // The slowest mode of the start-up decays as exp(−ν π² t / H²).
    let settle = hf * hf / (nu * std::f64::consts::PI.powi(2));
    let settled = steps as f64 >= 5.0 * settle;
    println!(
        "flow   mass {:.12}, kinetic energy {:.6e}; centre speed {:.6e} (steady {steady:.6e}); \
         largest deviation from the parabola {:.2} % of it",
        reference.mass,
        reference.energy,
        lbm::speed(&grid[(h / 2) * w]),
        deviation * 100.0
    );

    let mut ok = check("rayon", &by_rayon, &reference);
    ok &= check("malleable", &by_malleable, &reference);
    if settled {
        let physics = deviation <= 0.03;
        println!(
            "check  physics: the speed profile is {} of the Poiseuille parabola{}",
            if physics {
                "within 3 %"
            } else {
                "not within 3 %"
            },
            if physics { "" } else { "  FAILED" }
        );
        ok &= physics;
    } else {
        println!(
            "check  physics: skipped (the flow settles in about {:.0} steps)",
            5.0 * settle
        );
    }
    println!("\n{}", if ok { "all checks passed" } else { "FAILED" });
    Ok(ok)
}
