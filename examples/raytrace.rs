//! Ray tracing an image row by row as a malleable loop.
//!
//! The loop is [`Render`] (in `kernels/jobs.rs`): each iteration renders one row into the
//! chunk's accumulator, and `CollectInOrder` joins the chunks' rows in order into the image.
//! The scene is the job's input, built once per process from the job's small description
//! (size and samples). The image is checked byte for byte against a sequential render and
//! written as a binary PPM.
//!
//! ```text
//! cargo run --release --example raytrace [OUTPUT.ppm]
//! ```

#[path = "kernels/mod.rs"]
mod kernels;

use std::path::PathBuf;
use std::time::Instant;

use malleable::{Executor, Folded};

use kernels::jobs::Render;
use kernels::raytrace::{self, Scene};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .map_or_else(|| std::env::temp_dir().join("raytrace.ppm"), PathBuf::from);
    let job = Render {
        width: 800,
        height: 600,
        samples: 2,
    };
    let (w, h) = (job.width, job.height);

    let exec = Executor::builder().build()?;
    let t = Instant::now();
    let image = exec.run(Folded(job))?.into_value();
    let parallel = t.elapsed();

    let scene = Scene::new(w, h, 2);
    let t = Instant::now();
    let expected = raytrace::sequential(&scene);
    let sequential = t.elapsed();

    raytrace::write_ppm(&path, w, h, &image)?;
    println!("image        {w}x{h}, 4 rays per pixel");
    println!(
        "malleable    {:>7.3} s  ({:.0} rows/s, {} workers)",
        parallel.as_secs_f64(),
        f64::from(h) / parallel.as_secs_f64(),
        std::thread::available_parallelism().map_or(1, usize::from)
    );
    println!(
        "sequential   {:>7.3} s  (speedup {:.2}x)",
        sequential.as_secs_f64(),
        sequential.as_secs_f64() / parallel.as_secs_f64()
    );
    println!("wrote        {}", std::fs::canonicalize(&path)?.display());
    if image != expected {
        let at = image.iter().zip(&expected).position(|(a, b)| a != b);
        eprintln!(
            "FAILED: the image differs from the sequential render (first difference at byte {at:?}, lengths {} and {})",
            image.len(),
            expected.len()
        );
        std::process::exit(1);
    }
    println!("check        ok: identical to the sequential render, byte for byte");
    Ok(())
}
