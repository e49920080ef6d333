//! A coordinator and worker processes of the same binary on this machine: workers are added
//! and removed while the loop runs, and one is killed with SIGKILL; the image is checked byte
//! for byte against a sequential render.
//!
//! The loop is the ray tracer of the `raytrace` example ([`Render`]: one iteration per image
//! row, the scene built once per process from the job's small description). The coordinator
//! computes with one local thread and listens on loopback; then, as the image progresses:
//!
//! 1. two worker processes are started through a [`LocalLauncher`] (`scale_remote(2)`): this
//!    program re-executed with `--worker ADDR`;
//! 2. a third is started "by hand", as a user's own tooling would (a batch script, `ssh`);
//! 3. that one is killed with SIGKILL in the middle of its steps: its chunk goes back to the
//!    pile and is computed again elsewhere;
//! 4. `scale_remote(1)` retires one gracefully (it hands its chunk back at the next step);
//! 5. `scale_remote(2)` starts a new one, which joins in the middle of the loop.
//!
//! ```text
//! cargo run --release --example cluster
//! cargo run --release --example cluster -- --size 800x600 --samples 3
//! cargo run --release --example cluster -- --worker 127.0.0.1:7070   # a worker, by hand
//! ```
//!
//! On a real cluster the coordinator listens on a routable address with a token (set
//! `MALLEABLE_TOKEN` on both sides) and the launcher is a [`CommandLauncher`] such as
//! `srun --ntasks=1 {bin} --worker {addr}` or `ssh {host} {bin} --worker {addr}`.
//!
//! [`CommandLauncher`]: malleable::cluster::CommandLauncher

#[path = "kernels/mod.rs"]
mod kernels;

use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use malleable::cluster::{self, LocalLauncher, Registry, WorkerOptions};
use malleable::{Chunking, Executor, Folded, JobHandle, Outcome};

use kernels::jobs::Render;
use kernels::raytrace::{self, Scene};

type Error = Box<dyn std::error::Error + Send + Sync>;

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<ExitCode, Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opt = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    if let Some(addr) = opt("--worker") {
        return worker(&addr);
    }
    let (width, height) = match opt("--size") {
        Some(s) => {
            let (w, h) = s.split_once('x').ok_or("--size WxH")?;
            (w.parse()?, h.parse()?)
        }
        None => (1600, 1200),
    };
    let samples: u32 = opt("--samples").map_or(Ok(4), |s| s.parse())?;
    coordinator(Render {
        width,
        height,
        samples,
    })
}

/// Worker mode: serve the coordinator at `addr` with one thread until the job ends.
fn worker(addr: &str) -> Result<ExitCode, Error> {
    let options = WorkerOptions::from_env()?.threads(1).stop_on_signals();
    let registry = Registry::new().register::<Folded<Render>>();
    let served = cluster::serve(addr, &registry, options)?;
    println!(
        "  worker {}: {} chunks done, {} handed back{}",
        std::process::id(),
        served.chunks_done,
        served.chunks_yielded,
        if served.left { ", left on request" } else { "" }
    );
    Ok(ExitCode::SUCCESS)
}

fn coordinator(job: Render) -> Result<ExitCode, Error> {
    let (w, h, samples) = (job.width, job.height, job.samples);
    let exe = std::env::current_exe()?;
    let exec = Executor::builder()
        .local_workers(1)
        .chunking(Chunking::Size(8))
        .listen("127.0.0.1:0")
        .heartbeat(Duration::from_millis(200), Duration::from_secs(2))
        .launcher(LocalLauncher::new(&exe).args(["--worker", "{addr}"]))
        .build()?;
    let addr = exec.local_addr().ok_or("not listening")?.to_string();
    println!("coordinator  listening on {addr}; image {w}x{h}, {samples}x{samples} rays per pixel");

    let started = Instant::now();
    let handle = exec.submit(Folded(job))?;
    let say = |what: &str, h: &JobHandle<Folded<Render>>| {
        let p = h.progress();
        println!(
            "{:>7.2} s  {:>5.1}%  {} remote  {what}",
            started.elapsed().as_secs_f64(),
            100.0 * p.done as f64 / p.total.max(1) as f64,
            p.remote_workers
        );
    };

    // 1. Two workers through the launcher.
    handle.scale_remote(2)?;
    if !until(&handle, |h| h.remote_workers() == 2) {
        return check(handle, w, h, samples, started);
    }
    say("two launched workers joined", &handle);

    // 2. A third, started by hand.
    at(&handle, 0.15);
    let mut by_hand = Command::new(&exe).args(["--worker", &addr]).spawn()?;
    if !until(&handle, |h| h.remote_workers() == 3) {
        return check(handle, w, h, samples, started);
    }
    say(
        &format!("worker {} (started by hand) joined", by_hand.id()),
        &handle,
    );

    // 3. SIGKILL in the middle of its steps.
    at(&handle, 0.35);
    by_hand.kill()?;
    let _ = by_hand.wait();
    say(
        &format!("worker {} killed with SIGKILL", by_hand.id()),
        &handle,
    );
    if !until(&handle, |h| h.remote_workers() == 2) {
        return check(handle, w, h, samples, started);
    }
    say("its chunk went back to the pile", &handle);

    // 4. Retire one gracefully.
    at(&handle, 0.5);
    handle.scale_remote(1)?;
    say("scale_remote(1): one worker retired", &handle);

    // 5. And add one in the middle of the loop.
    at(&handle, 0.65);
    handle.scale_remote(2)?;
    if until(&handle, |h| h.remote_workers() == 2) {
        say("scale_remote(2): a new worker joined", &handle);
    }
    for e in exec.peer_errors() {
        println!("           peer error recorded: {e}");
    }
    check(handle, w, h, samples, started)
}

/// Waits for the job to reach `fraction` of its rows (or to end).
fn at(h: &JobHandle<Folded<Render>>, fraction: f64) {
    while !h.is_finished() {
        let p = h.progress();
        if p.done as f64 >= fraction * p.total as f64 {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits up to 20 s for `cond`; false if the job ended first.
fn until(h: &JobHandle<Folded<Render>>, cond: impl Fn(&JobHandle<Folded<Render>>) -> bool) -> bool {
    let start = Instant::now();
    while !cond(h) {
        if h.is_finished() || start.elapsed() > Duration::from_secs(20) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    true
}

/// Waits for the image and checks it against a sequential render.
fn check(
    handle: JobHandle<Folded<Render>>,
    w: u32,
    h: u32,
    samples: u32,
    started: Instant,
) -> Result<ExitCode, Error> {
    let image = match handle.wait()? {
        Outcome::Finished(f) => f.value,
        other => return Err(format!("the job did not finish: {other:?}").into()),
    };
    let took = started.elapsed();
    let t = Instant::now();
    let expected = raytrace::sequential(&Scene::new(w, h, samples));
    println!(
        "done         {:.2} s with the cluster; sequential render {:.2} s",
        took.as_secs_f64(),
        t.elapsed().as_secs_f64()
    );
    if image != expected {
        eprintln!("FAILED: the image differs from the sequential render");
        return Ok(ExitCode::FAILURE);
    }
    println!("check        ok: identical to the sequential render, byte for byte");
    Ok(ExitCode::SUCCESS)
}
