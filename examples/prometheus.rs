//! Watching a run with Prometheus: the crate's metrics (`malleable::metrics`) served over HTTP
//! by `metrics-exporter-prometheus` while a real job runs, and scraped by this program itself.
//!
//! 1. The exporter is installed as the process's `metrics` recorder, with an HTTP listener
//!    (`--listen`, default a free port on 127.0.0.1); durations (`*_seconds`) are rendered as
//!    histograms with buckets from 1 ms to 100 s.
//! 2. A job of 40 phases runs with 1 local worker and an autoscaler that may grow it to 2;
//!    at phase 5 it takes a snapshot.
//! 3. While it runs, this program scrapes its own endpoint (a plain HTTP GET) and prints a line
//!    of what Prometheus would see: phase, iterations done, workers, snapshots, decisions.
//! 4. At the end it scrapes once more and checks the families against what the job did (40
//!    phases, every iteration, a snapshot with bytes); it exits non-zero if one is wrong.
//!    With `--hold SECONDS` it keeps serving that long afterwards, for a real Prometheus or
//!    `curl http://ADDR/metrics`. With `--timeline FILE` the run's timeline goes to `FILE`
//!    (see `malleable-report`).
//!
//! ```text
//! cargo run --release --example prometheus
//! cargo run --release --example prometheus -- --listen 127.0.0.1:9184 --hold 60
//! ```

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use malleable::reduce::Sum;
use malleable::schedule::{Autoscale, Hysteresis};
use malleable::{Chunking, Executor, Fold, Folded, Next};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use serde::{Deserialize, Serialize};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// Installs the Prometheus exporter as the process's recorder, serving on `addr`.
pub(crate) fn install(addr: SocketAddr) -> Result<(), Error> {
    let buckets = [
        0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 100.0,
    ];
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &buckets)?
        .install()?;
    Ok(())
}

/// A free port on loopback (the exporter needs a port number before it binds).
pub(crate) fn free_port() -> Result<SocketAddr, Error> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// One HTTP GET of `/metrics` on `addr` (HTTP/1.0: the body is the rest of the stream).
pub(crate) fn scrape(addr: SocketAddr) -> Result<String, Error> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut response = String::new();
    s.read_to_string(&mut response)?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or("an HTTP response without a body")?;
    let status = head.lines().next().unwrap_or_default();
    if !status.contains(" 200") {
        return Err(format!("the exporter answered {status:?}").into());
    }
    Ok(body.to_owned())
}

/// One sample of the text exposition format: `name{label="value",…} value`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Sample {
    pub(crate) name: String,
    pub(crate) labels: Vec<(String, String)>,
    pub(crate) value: f64,
}

impl Sample {
    pub(crate) fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Parses the text exposition format (comments and `# TYPE` lines skipped).
pub(crate) fn parse(text: &str) -> Result<Vec<Sample>, Error> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .ok_or_else(|| format!("not a sample: {line:?}"))?;
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().map_err(|e| format!("{line:?}: {e}"))?,
        };
        let (name, labels) = match series.split_once('{') {
            None => (series.to_owned(), Vec::new()),
            Some((name, rest)) => {
                let inner = rest
                    .strip_suffix('}')
                    .ok_or_else(|| format!("unclosed labels: {line:?}"))?;
                let mut labels = Vec::new();
                for pair in inner.split(',').filter(|p| !p.is_empty()) {
                    let (k, v) = pair
                        .split_once('=')
                        .ok_or_else(|| format!("a label without a value: {line:?}"))?;
                    labels.push((k.to_owned(), v.trim_matches('"').to_owned()));
                }
                (name.to_owned(), labels)
            }
        };
        out.push(Sample {
            name,
            labels,
            value,
        });
    }
    Ok(out)
}

/// The sum of the samples named `name` of job `job` (over their other labels), if any.
pub(crate) fn value(samples: &[Sample], name: &str, job: &str) -> Option<f64> {
    let mut found = None;
    for s in samples
        .iter()
        .filter(|s| s.name == name && s.label("job") == Some(job))
    {
        *found.get_or_insert(0.0) += s.value;
    }
    found
}

/// A loop of `phases` phases over `n` iterations, each iteration waiting `micros` µs (so the
/// run lasts long enough to watch, and a second worker really doubles its speed).
#[derive(Serialize, Deserialize)]
struct Paced {
    n: u64,
    phases: u64,
    phase: u64,
    micros: u64,
}

impl Fold for Paced {
    const NAME: &'static str = "paced";
    type Acc = u64;
    type Reducer = Sum<u64>;
    type Input = ();
    fn iterations(&self) -> u64 {
        self.n
    }
    fn reducer(&self) -> Sum<u64> {
        Sum::new()
    }
    fn body(&self, _: &(), acc: &mut u64, i: u64) {
        std::thread::sleep(Duration::from_micros(self.micros));
        *acc += i;
    }
    fn end_phase(&mut self, _: &u64) -> Next {
        self.phase += 1;
        if self.phase == self.phases {
            Next::Finish
        } else {
            Next::Continue
        }
    }
}

struct Args {
    listen: Option<SocketAddr>,
    hold: Duration,
    timeline: Option<std::path::PathBuf>,
}

fn parse_args() -> Result<Args, Error> {
    let mut args = Args {
        listen: None,
        hold: Duration::ZERO,
        timeline: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--listen" => args.listen = Some(value()?.parse()?),
            "--hold" => args.hold = Duration::from_secs_f64(value()?.parse()?),
            "--timeline" => args.timeline = Some(value()?.into()),
            other => return Err(format!("unknown argument {other:?} (see the file's docs)").into()),
        }
    }
    Ok(args)
}

fn main() -> ExitCode {
    match parse_args().and_then(|a| run(&a)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<bool, Error> {
    let addr = match args.listen {
        Some(a) => a,
        None => free_port()?,
    };
    install(addr)?;
    println!("serving metrics on http://{addr}/metrics");

    let store = std::env::temp_dir().join(format!("malleable-prometheus-{}", std::process::id()));
    let policy = Autoscale::throughput(1e12) // out of reach: grow to the maximum, 2
        .local(1, 2)
        .period(Duration::from_millis(50))
        .hysteresis(Hysteresis {
            cooldown: Duration::from_millis(200),
            window: 4,
            ..Hysteresis::default()
        });
    let mut builder = Executor::builder()
        .local_workers(1)
        .chunking(Chunking::Count(16))
        .snapshots(format!("file://{}", store.display()))
        .autoscale(policy);
    if let Some(path) = &args.timeline {
        builder = builder.timeline(path);
    }
    let exec = builder.build()?;
    let (n, phases) = (1000, 40);
    let job = Paced {
        n,
        phases,
        phase: 0,
        micros: 40,
    };
    let started = Instant::now();
    let handle = exec.submit(Folded(job))?;
    let mut snapshot = None;
    while !handle.is_finished() {
        std::thread::sleep(Duration::from_millis(250));
        if snapshot.is_none() && handle.progress().phase >= 5 {
            snapshot = Some(handle.snapshot().wait()?);
        }
        let m = parse(&scrape(addr)?)?;
        let get = |name| value(&m, name, "paced").unwrap_or(0.0);
        println!(
            "  {:>5.2} s  phase {:>2}  {:>6} iterations done  {} workers  {} snapshots ({} bytes)  {} decisions",
            started.elapsed().as_secs_f64(),
            get(malleable::metrics::PHASE),
            get(malleable::metrics::ITERATIONS_DONE),
            get(malleable::metrics::WORKERS),
            get(malleable::metrics::SNAPSHOTS),
            get(malleable::metrics::SNAPSHOT_BYTES),
            get(malleable::metrics::AUTOSCALE_DECISIONS),
        );
    }
    let total = handle
        .wait()?
        .finished()
        .ok_or("not finished")?
        .into_value();
    let _ = std::fs::remove_dir_all(&store);
    exec.shutdown()?; // the timeline, if any, is written when this returns

    // What Prometheus sees at the end, against what the job did.
    let m = parse(&scrape(addr)?)?;
    let get = |name| value(&m, name, "paced");
    let phase_count = format!("{}_count", malleable::metrics::PHASE_SECONDS);
    let checks = [
        (
            "phases",
            get(malleable::metrics::PHASES),
            Some(phases as f64),
        ),
        ("phase durations", get(&phase_count), Some(phases as f64)),
        (
            "current phase",
            get(malleable::metrics::PHASE),
            Some((phases - 1) as f64),
        ),
        (
            "iterations done",
            get(malleable::metrics::ITERATIONS_DONE),
            Some((phases * n) as f64),
        ),
        (
            "iterations of the phase",
            get(malleable::metrics::PHASE_ITERATIONS),
            Some(n as f64),
        ),
        (
            "workers draining",
            get(malleable::metrics::WORKERS_DRAINING),
            Some(0.0),
        ),
    ];
    // The value is the last phase's sum.
    let mut ok = total == n * (n - 1) / 2;
    println!("value {total}: {}", if ok { "ok" } else { "FAILED" });
    for (what, got, want) in checks {
        let good = got == want;
        ok &= good;
        println!(
            "check {what}: {got:?} (want {want:?}) {}",
            if good { "ok" } else { "FAILED" }
        );
    }
    let snapshots = get(malleable::metrics::SNAPSHOTS).unwrap_or(0.0);
    let bytes = get(malleable::metrics::SNAPSHOT_BYTES).unwrap_or(0.0);
    let good = snapshot.is_some() && snapshots >= 1.0 && bytes > 0.0;
    ok &= good;
    println!(
        "check snapshots: {snapshots} committed, {bytes} bytes {}",
        if good { "ok" } else { "FAILED" }
    );
    println!(
        "autoscaling decisions: {}",
        get(malleable::metrics::AUTOSCALE_DECISIONS).unwrap_or(0.0)
    );
    if !args.hold.is_zero() {
        println!("serving for {:?} more", args.hold);
        std::thread::sleep(args.hold);
    }
    Ok(ok)
}
