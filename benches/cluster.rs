//! Remote workers against local threads, in one process's timing.
//!
//! 1. **Throughput**: each compute kernel (from `examples/kernels/`) runs with 2 local worker
//!    threads, and with 2 worker processes over loopback (this bench binary re-executed with
//!    `--worker ADDR`, one thread each; the coordinator has no local worker and only
//!    coordinates). The processes are started before the job is submitted and dial until it
//!    runs, so the clock covers what a running cluster does: joins, the job value's trip,
//!    every chunk's messages and outputs, and the merge. Runs alternate, local then remote;
//!    the table shows median times and `remote/local`, the median over pairs of local time ÷
//!    remote time (above 1: remote is faster), then the CPU time each side used: this
//!    process's for the local run; for the remote run, the coordinator's plus each worker
//!    process's from its last dial to its end (what the cluster costs, whatever the wall
//!    clock's noise), split into the coordinator, the worker processes' I/O threads and
//!    their compute threads.
//! 2. **Join latency**: from a worker process dialling the coordinator to its first chunk
//!    (measured in the worker: TCP connect, handshake, job value, first `Run`), over many
//!    joins in the middle of a running job; and from `retire_remote(1)` to the retired
//!    process's exit (its chunk handed back at its next adjustment point, the process told to
//!    end, and gone).
//! 3. **Coordinator CPU**: the coordinator process's CPU time (user + system, from
//!    `/proc/self/stat`) per 1000 chunk completions, for a job of many small chunks run by 2
//!    worker processes.
//!
//! ```text
//! cargo bench --bench cluster                 # the full run (about a minute)
//! CLUSTER_RUNS=7 cargo bench --bench cluster  # more timed runs per kernel (default 3)
//! CLUSTER_ONLY=crypt cargo bench --bench cluster  # one part: a kernel, latencies or cpu
//! CLUSTER_CHUNKS=4096 cargo bench --bench cluster # another chunk count (default 1024)
//! CLUSTER_ONE_PROCESS=1 cargo bench --bench cluster # 1 worker process of 2 threads
//! cargo test --bench cluster                  # a quick checked pass at small sizes
//! ```

#[path = "../examples/kernels/mod.rs"]
mod kernels;

use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use malleable::cluster::{self, Registry, WorkerOptions};
use malleable::{Chunking, Executor, Folded, Job, JobHandle, Outcome};

use kernels::crypt;
use kernels::jobs::{self, Crypt, Direction, Pi, Render};

mod support;

const PLAINTEXT: &str = "plaintext";

#[derive(Clone, Copy)]
struct Sizes {
    mc_samples: u64,
    crypt_bytes: usize,
    rt: (u32, u32, u32),
    small_chunks: u64,
}

const FULL: Sizes = Sizes {
    mc_samples: 600_000_000,
    crypt_bytes: 64 << 20,
    rt: (1280, 960, 3),
    small_chunks: 20_000,
};

const QUICK: Sizes = Sizes {
    mc_samples: 20_000_000,
    crypt_bytes: 2 << 20,
    rt: (320, 240, 2),
    small_chunks: 2_000,
};

static SIZES: OnceLock<Sizes> = OnceLock::new();

fn sizes() -> Sizes {
    *SIZES.get().expect("sizes chosen in main")
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--worker") {
        let quick = args.iter().any(|a| a == "--quick");
        let _ = SIZES.set(if quick { QUICK } else { FULL });
        return worker(&args[i + 1]);
    }
    let quick = !args.iter().any(|a| a == "--bench");
    let _ = SIZES.set(if quick { QUICK } else { FULL });
    let runs = if quick {
        1
    } else {
        std::env::var("CLUSTER_RUNS").map_or(3, |r| r.parse().expect("CLUSTER_RUNS"))
    };
    jobs::publish(PLAINTEXT, crypt::plaintext(42, sizes().crypt_bytes));

    println!(
        "== {} over loopback vs 2 local threads ({runs} runs, medians)",
        if threads_per_worker() == 2 {
            "1 worker process of 2 threads"
        } else {
            "2 worker processes"
        }
    );
    println!(
        "{:<12} {:>10} {:>10} {:>13} {:>11} {:>11}",
        "kernel", "local", "remote", "remote/local", "CPU local", "CPU remote"
    );
    // `CLUSTER_ONLY=crypt` (say) runs one part: a kernel, `latencies` or `cpu`.
    let only = std::env::var("CLUSTER_ONLY").ok();
    let part = |name: &str| only.as_deref().is_none_or(|o| o == name);
    if part("montecarlo") {
        throughput("montecarlo", runs, quick, pi);
    }
    if part("crypt") {
        throughput("crypt", runs, quick, crypt_job);
    }
    if part("raytrace") {
        throughput("raytrace", runs, quick, render);
    }
    if part("latencies") {
        latencies(quick);
    }
    if part("cpu") {
        coordinator_cpu(quick);
    }
}

fn pi() -> Folded<Pi> {
    Folded(Pi {
        samples: sizes().mc_samples,
        seed: 2024,
    })
}

fn crypt_job() -> Crypt {
    Crypt {
        buffer: PLAINTEXT.into(),
        blocks: (sizes().crypt_bytes / 8) as u64,
        key: crypt::user_key(7),
        direction: Direction::Encrypt,
    }
}

fn render() -> Folded<Render> {
    let (width, height, samples) = sizes().rt;
    Folded(Render {
        width,
        height,
        samples,
    })
}

/// Worker mode: serve the coordinator with one thread, print the join latency.
fn worker(addr: &str) {
    jobs::publish(PLAINTEXT, crypt::plaintext(42, sizes().crypt_bytes));
    let registry = Registry::new()
        .register::<Folded<Pi>>()
        .register::<Crypt>()
        .register::<Folded<Render>>();
    let options = WorkerOptions::default().threads(threads_per_worker());
    // Started before its job is submitted (so its start-up is not timed): until the job
    // runs, the coordinator refuses it as a worker of no running job; try again.
    let (served, cpu, io) = loop {
        let (cpu, io) = (cpu_time(), main_thread_cpu());
        match cluster::serve(addr, &registry, options.clone()) {
            Err(cluster::Error::UnknownJob { .. }) => {
                std::thread::sleep(Duration::from_micros(500));
            }
            other => break (other, cpu, io),
        }
    };
    match served {
        Ok(served) => {
            if let Some(d) = served.first_run_after {
                println!("JOIN_US {}", d.as_micros());
            }
            // From the last dial: the whole process, and its main thread, which runs the
            // I/O (the compute threads are the rest).
            println!("CPU_US {}", (cpu_time() - cpu).as_micros());
            println!("IO_US {}", (main_thread_cpu() - io).as_micros());
        }
        Err(e) => {
            eprintln!("worker: {e}");
            std::process::exit(3);
        }
    }
}

/// Threads per worker process: 1 (two processes), or 2 with `CLUSTER_ONE_PROCESS=1` (one).
fn threads_per_worker() -> usize {
    if std::env::var_os("CLUSTER_ONE_PROCESS").is_some() {
        2
    } else {
        1
    }
}

fn spawn_worker(addr: &str, quick: bool) -> Child {
    let mut cmd = Command::new(std::env::current_exe().expect("the bench binary"));
    cmd.args(["--worker", addr]).stdout(Stdio::piped());
    if quick {
        cmd.arg("--quick");
    }
    cmd.spawn().expect("a worker process")
}

/// What a worker process printed at its end (`JOIN_US`: its join latency; `CPU_US` and
/// `IO_US`: the CPU time of the process and of its I/O thread from its last dial to its end).
#[derive(Default)]
struct Report {
    join: Option<Duration>,
    cpu: Duration,
    io: Duration,
}

/// Waits for a worker process to exit and reads its report.
fn report(child: Child) -> Report {
    let Ok(out) = child.wait_with_output() else {
        return Report::default();
    };
    let mut r = Report::default();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some((key, us)) = line.split_once(' ') else {
            continue;
        };
        let Ok(us) = us.trim().parse() else {
            continue;
        };
        let d = Duration::from_micros(us);
        match key {
            "JOIN_US" => r.join = Some(d),
            "CPU_US" => r.cpu = d,
            "IO_US" => r.io = d,
            _ => {}
        }
    }
    r
}

fn coordinator(quick: bool) -> Executor {
    let _ = quick;
    Executor::builder()
        .local_workers(0)
        .listen("127.0.0.1:0")
        .chunking(chunking())
        .build()
        .expect("a listening executor")
}

/// The chunking of both sides: the default, or `CLUSTER_CHUNKS` chunks.
fn chunking() -> Chunking {
    std::env::var("CLUSTER_CHUNKS").map_or(Chunking::default(), |n| {
        Chunking::Count(n.parse().expect("CLUSTER_CHUNKS"))
    })
}

/// Waits for a job that nobody computes inline (zero local workers) without joining it.
fn finish<J: Job>(h: JobHandle<J>) -> malleable::Value<J> {
    while !h.is_finished() {
        std::thread::sleep(Duration::from_millis(1));
    }
    match h.wait().expect("the job") {
        Outcome::Finished(f) => f.value,
        Outcome::Suspended(id) => panic!("suspended at {id}"),
        _ => panic!("not finished"),
    }
}

/// A remote run's time and CPU times.
struct RemoteRun {
    took: Duration,
    /// All processes.
    cpu: Duration,
    /// The coordinator process.
    coordinator: Duration,
    /// The worker processes' I/O threads.
    io: Duration,
}

/// A remote run and its value.
fn remote_run<J: Job>(job: J, quick: bool) -> (RemoteRun, malleable::Value<J>) {
    let exec = coordinator(quick);
    let addr = exec.local_addr().expect("listening").to_string();
    let workers: Vec<Child> = (0..2 / threads_per_worker())
        .map(|_| spawn_worker(&addr, quick))
        .collect();
    // Let them start (and build their inputs) before the clock starts.
    std::thread::sleep(Duration::from_millis(if quick { 100 } else { 700 }));
    let t = Instant::now();
    let cpu = cpu_time();
    let h = exec.submit(job).expect("submit");
    let value = finish(h);
    let took = t.elapsed();
    let coordinator = cpu_time() - cpu;
    let mut run = RemoteRun {
        took,
        cpu: coordinator,
        coordinator,
        io: Duration::ZERO,
    };
    for w in workers {
        let r = report(w);
        run.cpu += r.cpu;
        run.io += r.io;
    }
    (run, value)
}

fn throughput<J: Job>(name: &str, runs: usize, quick: bool, job: fn() -> J)
where
    malleable::Value<J>: PartialEq,
{
    let local = Executor::builder()
        .local_workers(2)
        .chunking(chunking())
        .build()
        .expect("local");
    let (mut tl, mut tr, mut cl, mut cr) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut coordinator, mut io) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let (t, cpu) = (Instant::now(), cpu_time());
        let expected = local.run(job()).expect("local run").value;
        tl.push(t.elapsed());
        cl.push(cpu_time() - cpu);
        let (run, value) = remote_run(job(), quick);
        assert!(value == expected, "{name}: the remote value differs");
        tr.push(run.took);
        cr.push(run.cpu);
        coordinator.push(run.coordinator);
        io.push(run.io);
    }
    // The ratio of each pair (run back to back), then their median: this machine's speed
    // drifts by more than the difference measured, and a pair shares the drift.
    let mut ratios: Vec<f64> = tl
        .iter()
        .zip(&tr)
        .map(|(l, r)| l.as_secs_f64() / r.as_secs_f64())
        .collect();
    ratios.sort_by(f64::total_cmp);
    let ratio = ratios[ratios.len() / 2];
    let (ml, mr) = (
        support::percentile(&mut tl, 0.5),
        support::percentile(&mut tr, 0.5),
    );
    let (cl, cr) = (
        support::percentile(&mut cl, 0.5),
        support::percentile(&mut cr, 0.5),
    );
    let (coordinator, io) = (
        support::percentile(&mut coordinator, 0.5),
        support::percentile(&mut io, 0.5),
    );
    println!(
        "{name:<12} {:>8.3} s {:>8.3} s {:>12.2}x {:>9.3} s {:>9.3} s   (coordinator {:.3} s, worker I/O {:.3} s, worker compute {:.3} s; pairs: {})",
        ml.as_secs_f64(),
        mr.as_secs_f64(),
        ratio,
        cl.as_secs_f64(),
        cr.as_secs_f64(),
        coordinator.as_secs_f64(),
        io.as_secs_f64(),
        cr.saturating_sub(coordinator + io).as_secs_f64(),
        ratios
            .iter()
            .map(|r| format!("{r:.2}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
}

/// Join latency over many joins into a running job, and retire latency.
fn latencies(quick: bool) {
    let joins = if quick { 3 } else { 20 };
    let exec = coordinator(quick);
    let addr = exec.local_addr().expect("listening").to_string();
    // A long job of small steps: Pi with many samples, chunks of 64 K samples.
    let h = exec
        .submit(Folded(Pi {
            samples: u64::MAX / 4,
            seed: 1,
        }))
        .expect("submit");
    let anchor = spawn_worker(&addr, quick);
    while h.remote_workers() == 0 {
        std::thread::sleep(Duration::from_micros(200));
    }
    let mut join = Vec::new();
    let mut retire = Vec::new();
    for _ in 0..joins {
        let before = h.remote_workers();
        let child = spawn_worker(&addr, quick);
        while h.remote_workers() == before {
            assert!(!h.is_finished(), "the job ended");
            std::thread::sleep(Duration::from_micros(200));
        }
        std::thread::sleep(Duration::from_millis(20));
        let t = Instant::now();
        h.retire_remote(1);
        let latency = report(child).join;
        retire.push(t.elapsed());
        join.extend(latency);
    }
    h.cancel();
    let _ = h.wait();
    let _ = anchor.wait_with_output();
    let p = |v: &mut Vec<Duration>, q: f64| support::percentile(v, q);
    println!("\n== latencies ({joins} joins and retires into a running job)");
    println!(
        "join to first chunk:  p50 {:>7.2} ms  p99 {:>7.2} ms  (dial, handshake, job value, first Run)",
        p(&mut join, 0.5).as_secs_f64() * 1e3,
        p(&mut join, 0.99).as_secs_f64() * 1e3
    );
    println!(
        "retire to exit:       p50 {:>7.2} ms  p99 {:>7.2} ms  (chunk handed back, End, process gone)",
        p(&mut retire, 0.5).as_secs_f64() * 1e3,
        p(&mut retire, 0.99).as_secs_f64() * 1e3
    );
}

/// This process's CPU time (user + system).
fn cpu_time() -> Duration {
    stat_cpu("/proc/self/stat")
}

/// The CPU time of this process's main thread.
fn main_thread_cpu() -> Duration {
    stat_cpu(&format!("/proc/self/task/{}/stat", std::process::id()))
}

/// User + system time from a `/proc/…/stat` file.
fn stat_cpu(path: &str) -> Duration {
    let stat = std::fs::read_to_string(path).expect("a /proc stat file");
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = &stat[stat.rfind(')').expect("stat format") + 2..];
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 after the name.
    let ticks = f[11] + f[12];
    Duration::from_secs_f64(ticks as f64 / 100.0)
}

fn coordinator_cpu(quick: bool) {
    let chunks = sizes().small_chunks;
    let exec = Executor::builder()
        .local_workers(0)
        .listen("127.0.0.1:0")
        .chunking(Chunking::Count(chunks))
        .build()
        .expect("executor");
    let addr = exec.local_addr().expect("listening").to_string();
    // About 0.5 ms of work per chunk.
    let job = || {
        Folded(Pi {
            samples: chunks * 20_000,
            seed: 3,
        })
    };
    let cpu = cpu_time();
    let t = Instant::now();
    let h = exec.submit(job()).expect("submit");
    let workers = [spawn_worker(&addr, quick), spawn_worker(&addr, quick)];
    let remote = finish(h);
    let (cpu, wall) = (cpu_time() - cpu, t.elapsed());
    let mut total = cpu;
    for w in workers {
        total += report(w).cpu;
    }
    // The same job on 2 local threads: the work itself.
    let local = Executor::builder()
        .local_workers(2)
        .chunking(Chunking::Count(chunks))
        .build()
        .expect("local");
    let alone = cpu_time();
    let expected = local.run(job()).expect("local run").value;
    let alone = cpu_time() - alone;
    assert!(remote == expected, "the remote value differs");
    let per_chunk = |d: Duration| d.as_secs_f64() * 1e6 / chunks as f64;
    println!("\n== coordinator CPU ({chunks} chunks, 2 worker processes)");
    println!(
        "{:.1} ms CPU per 1000 chunk completions ({:.2} s CPU over {:.2} s; includes this bench's 1 ms polling)",
        cpu.as_secs_f64() * 1e3 / (chunks as f64 / 1000.0),
        cpu.as_secs_f64(),
        wall.as_secs_f64()
    );
    println!(
        "all processes: {:.2} s CPU, the same job on 2 local threads {:.2} s: {:.0} µs more per chunk",
        total.as_secs_f64(),
        alone.as_secs_f64(),
        per_chunk(total.saturating_sub(alone))
    );
}
