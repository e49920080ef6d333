//! A simulation's fields come out: heat diffusion on a plate whose field is written as a PNG
//! series every `k` phases by the output hook, where each band of the grid is (a thread of
//! this process, or a worker process), and whose final field is gathered at the end.
//!
//! The plate is `N × N` cells of `f64`, its top edge held at 1.0 and its other edges at 0.0;
//! each phase is one Jacobi sweep. Submitted as `Banded(Plate)`, the grid is cut into 16 bands
//! of rows that stay on the workers that hold them.
//!
//! 1. One local worker and one worker process (this program re-executed with `--worker
//!    ADDR`) run the job. Every `--every` phases, and after the last phase, each band writes
//!    its rows as a grayscale PNG strip, `frames/phase-PPPP/rows-SSSSS.png`, on the worker
//!    that holds it ([`Rows::output`]): no band crosses the network to be written.
//! 2. The program stitches each phase's strips into one image, `heat-PPPP.png`, in row
//!    order (a real simulation would write VTK or HDF5 pieces and a file that lists them).
//! 3. The job asked for its field at the end ([`Rows::gather_at_end`]): the bands held by
//!    the worker process come back, and [`Finished::field`] is the whole grid in row order.
//! 4. Checks: the last image decodes to `N × N` gray pixels equal to the gathered field's,
//!    and the gathered field equals a plain sequential loop bit for bit. The program exits
//!    non-zero if not.
//!
//! ```text
//! cargo run --release --example heat_png
//! cargo run --release --example heat_png -- --n 512 --phases 400 --every 100 --out /tmp/heat
//! ```
//!
//! Options: `--n N` (512), `--phases K` (250), `--every E` (100), `--processes P` (1),
//! `--out DIR` (default: a fresh folder under the system's temporary directory).
//!
//! [`Rows::output`]: malleable::Rows::output
//! [`Rows::gather_at_end`]: malleable::Rows::gather_at_end
//! [`Finished::field`]: malleable::Finished::field

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use malleable::cluster::{self, Registry, WorkerOptions};
use malleable::reduce::Max;
use malleable::rows::{Rows, Window};
use malleable::{Banded, BoxError, Executor, Next};
use serde::{Deserialize, Serialize};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The plate: `n × n` cells, `phases` sweeps, written into `out` every `every` phases.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Plate {
    n: u64,
    phases: u64,
    done: u64,
    every: u64,
    out: PathBuf,
}

/// The fixed edges: 1.0 along the top, 0.0 elsewhere; the inside starts at 0.0.
fn initial(i: u64, _j: usize) -> f64 {
    if i == 0 { 1.0 } else { 0.0 }
}

/// One cell's update from its four neighbours; the left and right edges stay.
fn sweep_row(above: &[f64], old: &[f64], below: &[f64], new: &mut [f64]) {
    let w = old.len();
    new[0] = old[0];
    new[w - 1] = old[w - 1];
    for j in 1..w - 1 {
        new[j] = 0.25 * (above[j] + below[j] + old[j - 1] + old[j + 1]);
    }
}

/// A cell as a gray level (its square root: the heat's front shows).
fn gray(x: f64) -> u8 {
    (x.clamp(0.0, 1.0).sqrt() * 255.0).round() as u8
}

/// The folder of phase `phase`'s strips.
fn frames(out: &Path, phase: u64) -> PathBuf {
    out.join("frames").join(format!("phase-{phase:04}"))
}

impl Rows for Plate {
    const NAME: &'static str = "heat-png";
    type Element = f64;
    type Acc = f64;
    type Reducer = Max<f64>;
    type Input = ();

    fn height(&self) -> u64 {
        self.n
    }
    fn width(&self) -> usize {
        self.n as usize
    }
    fn bands(&self) -> u64 {
        16
    }
    fn reducer(&self) -> Max<f64> {
        Max::new()
    }
    fn init(&self, _: &(), i: u64, row: &mut [f64]) {
        for (j, x) in row.iter_mut().enumerate() {
            *x = initial(i, j);
        }
    }
    fn update(&self, _: &(), _: u64, win: Window<'_, f64>, change: &mut f64) {
        match (win.above, win.below) {
            (Some(a), Some(b)) => sweep_row(a, win.old, b, win.row),
            _ => win.row.copy_from_slice(win.old),
        }
        for (new, old) in win.row.iter().zip(win.old) {
            *change = change.max((new - old).abs());
        }
    }
    fn end_phase(&mut self, _: &f64) -> Next {
        self.done += 1;
        if self.done < self.phases {
            Next::Continue
        } else {
            Next::Finish
        }
    }
    fn phases(&self) -> Option<u64> {
        Some(self.phases)
    }

    // The hooks of this example.

    fn output_every(&self) -> Option<u64> {
        Some(self.every)
    }
    /// This band's rows of phase `phase` as a grayscale PNG strip.
    fn output(&self, _: &(), phase: u64, rows: Range<u64>, cells: &[f64]) -> Result<(), BoxError> {
        let dir = frames(&self.out, phase);
        std::fs::create_dir_all(&dir)?;
        let path = dir.join(format!("rows-{:05}.png", rows.start));
        let file = std::io::BufWriter::new(std::fs::File::create(&path)?);
        let height = (rows.end - rows.start) as u32;
        let mut encoder = png::Encoder::new(file, self.n as u32, height);
        encoder.set_color(png::ColorType::Grayscale);
        encoder.set_depth(png::BitDepth::Eight);
        let pixels: Vec<u8> = cells.iter().map(|&x| gray(x)).collect();
        encoder.write_header()?.write_image_data(&pixels)?;
        Ok(())
    }
    fn gather_at_end(&self) -> bool {
        true
    }
}

/// The plate computed by a plain double-buffered loop.
fn sequential(p: &Plate) -> Vec<f64> {
    let (n, w) = (p.n as usize, p.n as usize);
    let mut grid: Vec<f64> = (0..n)
        .flat_map(|i| (0..w).map(move |j| initial(i as u64, j)))
        .collect();
    let mut next = grid.clone();
    for _ in 0..p.phases {
        for i in 1..n - 1 {
            let (head, rest) = grid.split_at(i * w);
            sweep_row(
                &head[(i - 1) * w..],
                &rest[..w],
                &rest[w..2 * w],
                &mut next[i * w..(i + 1) * w],
            );
        }
        next[..w].copy_from_slice(&grid[..w]);
        next[(n - 1) * w..].copy_from_slice(&grid[(n - 1) * w..]);
        std::mem::swap(&mut grid, &mut next);
    }
    grid
}

/// A grayscale PNG: its width, height and pixels.
fn read_png(path: &Path) -> Result<(u32, u32, Vec<u8>), Error> {
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(path)?));
    let mut reader = decoder.read_info()?;
    let mut buf = vec![0; reader.output_buffer_size().ok_or("an image too large")?];
    let info = reader.next_frame(&mut buf)?;
    if info.color_type != png::ColorType::Grayscale || info.bit_depth != png::BitDepth::Eight {
        return Err(format!("{} is not 8-bit grayscale", path.display()).into());
    }
    buf.truncate(info.buffer_size());
    Ok((info.width, info.height, buf))
}

/// Stitches the strips of each phase written into `out` into `heat-PPPP.png`, in row order;
/// the phases and images written, in phase order.
fn stitch(out: &Path) -> Result<Vec<(u64, PathBuf)>, Error> {
    let mut phases: Vec<(u64, PathBuf)> = std::fs::read_dir(out.join("frames"))?
        .map(|e| {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            let phase = name.trim_start_matches("phase-").parse()?;
            Ok((phase, e.path()))
        })
        .collect::<Result<_, Error>>()?;
    phases.sort();
    let mut images = Vec::new();
    for (phase, dir) in phases {
        let mut strips: Vec<PathBuf> = std::fs::read_dir(&dir)?
            .map(|e| e.map(|e| e.path()))
            .collect::<Result<_, _>>()?;
        // `rows-SSSSS.png`: the names sort in row order.
        strips.sort();
        let (mut width, mut height, mut pixels) = (0, 0, Vec::new());
        for s in &strips {
            let (w, h, p) = read_png(s)?;
            if width != 0 && w != width {
                return Err(format!("{} is {w} pixels wide, not {width}", s.display()).into());
            }
            width = w;
            height += h;
            pixels.extend_from_slice(&p);
        }
        let path = out.join(format!("heat-{phase:04}.png"));
        let file = std::io::BufWriter::new(std::fs::File::create(&path)?);
        let mut encoder = png::Encoder::new(file, width, height);
        encoder.set_color(png::ColorType::Grayscale);
        encoder.set_depth(png::BitDepth::Eight);
        encoder.write_header()?.write_image_data(&pixels)?;
        images.push((phase, path));
    }
    Ok(images)
}

struct Args {
    n: u64,
    phases: u64,
    every: u64,
    processes: usize,
    out: Option<PathBuf>,
    /// Worker mode: serve the coordinator at this address.
    worker: Option<String>,
}

fn parse_args() -> Result<Args, Error> {
    let mut args = Args {
        n: 512,
        phases: 250,
        every: 100,
        processes: 1,
        out: None,
        worker: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--n" => args.n = value()?.parse()?,
            "--phases" => args.phases = value()?.parse()?,
            "--every" => args.every = value()?.parse()?,
            "--processes" => args.processes = value()?.parse()?,
            "--out" => args.out = Some(value()?.into()),
            "--worker" => args.worker = Some(value()?),
            other => return Err(format!("unknown option {other}").into()),
        }
    }
    if args.n < 3 || args.phases == 0 {
        return Err("--n must be at least 3 and --phases at least 1".into());
    }
    Ok(args)
}

fn main() -> ExitCode {
    let run = || -> Result<bool, Error> {
        let args = parse_args()?;
        match &args.worker {
            Some(addr) => worker(addr),
            None => coordinator(&args),
        }
    };
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Worker mode: serve the coordinator at `addr` with one thread until the job ends.
fn worker(addr: &str) -> Result<bool, Error> {
    let options = WorkerOptions::from_env()?
        .threads(1)
        .wait_for_job(Duration::from_secs(20));
    let registry = Registry::new().register::<Banded<Plate>>();
    let served = cluster::serve(addr, &registry, options)?;
    println!(
        "  worker process {}: {} band runs",
        std::process::id(),
        served.chunks_done
    );
    Ok(true)
}

fn coordinator(args: &Args) -> Result<bool, Error> {
    let out = match &args.out {
        Some(out) => out.clone(),
        None => std::env::temp_dir().join(format!("malleable-heat-png-{}", std::process::id())),
    };
    // Only this run's images.
    let _ = std::fs::remove_dir_all(out.join("frames"));
    std::fs::create_dir_all(&out)?;
    let plate = Plate {
        n: args.n,
        phases: args.phases,
        done: 0,
        every: args.every,
        out: out.clone(),
    };
    println!(
        "heat on {n} × {n} cells, {} phases, written every {} phases into {}",
        args.phases,
        args.every,
        out.display(),
        n = args.n
    );

    let t = Instant::now();
    let reference = sequential(&plate);
    println!("sequential  {:>8.3} s", t.elapsed().as_secs_f64());

    let exec = Executor::builder()
        .local_workers(1)
        .listen("127.0.0.1:0")
        .build()?;
    let addr = exec.local_addr().ok_or("no listening address")?.to_string();
    let exe = std::env::current_exe()?;
    // Started first, they wait for the job (`wait_for_job`) and join as it starts.
    let mut workers = (0..args.processes)
        .map(|_| Command::new(&exe).args(["--worker", &addr]).spawn())
        .collect::<Result<Vec<_>, _>>()?;
    let t = Instant::now();
    let handle = exec.submit(Banded(plate.clone()))?;
    let done = handle.wait()?.finished().ok_or("the job did not finish")?;
    println!(
        "malleable   {:>8.3} s  (1 local worker, {} worker process{})",
        t.elapsed().as_secs_f64(),
        args.processes,
        if args.processes == 1 { "" } else { "es" }
    );
    for w in &mut workers {
        let _ = w.wait();
    }

    let images = stitch(&out)?;
    for (phase, path) in &images {
        println!("  phase {phase:>5}  {}", path.display());
    }
    let mut ok = true;
    // Output phases: every `every` phases, and the last.
    let mut want: Vec<u64> = (1..=args.phases / args.every.max(1))
        .map(|k| k * args.every - 1)
        .filter(|_| args.every > 0)
        .collect();
    if want.last() != Some(&(args.phases - 1)) {
        want.push(args.phases - 1);
    }
    let got: Vec<u64> = images.iter().map(|(p, _)| *p).collect();
    if got != want {
        println!("FAIL: images of phases {got:?}, expected {want:?}");
        ok = false;
    }

    let field = done.field().ok_or("the field was not gathered")?;
    let same = field.len() == reference.len()
        && field
            .iter()
            .zip(&reference)
            .all(|(a, b)| a.to_bits() == b.to_bits());
    if same {
        println!("gathered field = sequential loop, bit for bit");
    } else {
        println!("FAIL: the gathered field differs from the sequential loop");
        ok = false;
    }

    let (_, last) = images.last().ok_or("no image was written")?;
    let (w, h, pixels) = read_png(last)?;
    let expected: Vec<u8> = field.iter().map(|&x| gray(x)).collect();
    if (u64::from(w), u64::from(h)) != (args.n, args.n) || pixels != expected {
        println!(
            "FAIL: {} is {w} × {h} pixels, or not the gathered field's",
            last.display()
        );
        ok = false;
    } else {
        println!(
            "{} decodes to {w} × {h} pixels, the gathered field's",
            last.display()
        );
    }
    Ok(ok)
}
