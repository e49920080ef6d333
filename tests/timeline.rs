//! The timeline of a real run (`Builder::timeline`): its records say what happened, in order,
//! and its HTML report renders in a real browser (headless Chromium) as a chart that is not
//! blank.
//!
//! The job waits at the start of a phase until the test opens it (a gate in the loop body), so
//! the scaling and the snapshot land in known phases whatever the machine's speed.
//!
//! The rendering test installs Debian's `chromium` itself when the machine has none
//! (`tests/support/chromium.rs`, as root); if it cannot, the test fails and says why.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use malleable::reduce::Sum;
use malleable::timeline::{Ending, Event, Record};
use malleable::{Chunking, Executor, Fold, Folded, JobHandle, Next};
use serde::{Deserialize, Serialize};

mod support;

const PHASES: u64 = 24;

/// The highest phase the job may run (the test raises it).
static GATE: AtomicU64 = AtomicU64::new(0);

/// Σ i over `0..n` per phase, each iteration waiting 10 µs; it waits at the gate.
#[derive(Serialize, Deserialize)]
struct Gated {
    n: u64,
    phase: u64,
}

impl Fold for Gated {
    const NAME: &'static str = "gated";
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
        while GATE.load(Ordering::Acquire) < self.phase {
            std::thread::sleep(Duration::from_micros(200));
        }
        std::thread::sleep(Duration::from_micros(10));
        *acc += i;
    }
    fn end_phase(&mut self, _: &u64) -> Next {
        self.phase += 1;
        if self.phase == PHASES {
            Next::Finish
        } else {
            Next::Continue
        }
    }
}

/// Σ i over `0..1000`, one phase, no gate.
#[derive(Serialize, Deserialize)]
struct Tiny;

impl Fold for Tiny {
    const NAME: &'static str = "tiny";
    type Acc = u64;
    type Reducer = Sum<u64>;
    type Input = ();
    fn iterations(&self) -> u64 {
        1000
    }
    fn reducer(&self) -> Sum<u64> {
        Sum::new()
    }
    fn body(&self, _: &(), acc: &mut u64, i: u64) {
        *acc += i;
    }
}

fn scratch(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("malleable-timeline-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Opens the gate up to phase `upto` and waits until the job is in it (it then waits at
/// the next gate, or runs on).
fn open_to(h: &JobHandle<Folded<Gated>>, upto: u64) {
    GATE.store(upto, Ordering::Release);
    let t = Instant::now();
    while h.progress().phase < upto && !h.is_finished() {
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "stuck before phase {upto}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A run of `PHASES` phases: 1 worker, 2 from phase 6, a snapshot in phase 12, 1 worker
/// from phase 18; its timeline.
fn real_run(dir: &Path) -> Vec<Record> {
    let log = dir.join("run.jsonl");
    let exec = Executor::builder()
        .local_workers(1)
        .chunking(Chunking::Count(8))
        .snapshots(format!("file://{}", dir.join("store").display()))
        .timeline(&log)
        .build()
        .unwrap();
    let n = 400;
    let h = exec.submit(Folded(Gated { n, phase: 0 })).unwrap();
    open_to(&h, 6);
    h.set_local_workers(2);
    open_to(&h, 12);
    let snap = h.snapshot();
    open_to(&h, 18);
    let id = snap.wait().unwrap();
    h.set_local_workers(1);
    GATE.store(u64::MAX, Ordering::Release);
    let value = h.wait().unwrap().finished().unwrap().into_value();
    assert_eq!(value, n * (n - 1) / 2);
    exec.shutdown().unwrap();
    let records = malleable::timeline::read(&log).unwrap();
    assert!(
        records
            .iter()
            .any(|r| matches!(r.event, Event::Snapshot { epoch, .. } if epoch == id.epoch)),
        "snapshot {id} in the timeline"
    );
    records
}

fn check_records(records: &[Record]) {
    assert!(records.iter().all(|r| r.job == "gated"));
    assert!(
        records.windows(2).all(|w| w[0].t <= w[1].t),
        "records in time order"
    );
    assert!(
        matches!(
            records.first().map(|r| &r.event),
            Some(Event::Start {
                phase: 0,
                iterations: 400,
                resumed_from: None
            })
        ),
        "{:?}",
        records.first()
    );
    assert!(
        matches!(
            records.last().map(|r| &r.event),
            Some(Event::End {
                outcome: Ending::Finished,
                phase,
                ..
            }) if *phase == PHASES - 1
        ),
        "{:?}",
        records.last()
    );
    // One phase end per phase, in order, each with its duration.
    let phases: Vec<(u64, f64, u64)> = records
        .iter()
        .filter_map(|r| match r.event {
            Event::PhaseEnd {
                phase,
                seconds,
                iterations,
            } => Some((phase, seconds, iterations)),
            _ => None,
        })
        .collect();
    assert_eq!(
        phases.iter().map(|p| p.0).collect::<Vec<_>>(),
        (0..PHASES).collect::<Vec<_>>()
    );
    assert!(phases.iter().all(|p| p.1 > 0.0 && p.2 == 400), "{phases:?}");
    // The workers: 1, then 2 (joined during phase 6), then 1 again.
    let local_at_phase_end = |k: u64| {
        records
            .iter()
            .find(|r| matches!(r.event, Event::PhaseEnd { phase, .. } if phase == k))
            .map(|r| r.local)
            .unwrap()
    };
    assert_eq!(local_at_phase_end(3), 1);
    assert_eq!(local_at_phase_end(8), 2);
    assert_eq!(local_at_phase_end(PHASES - 1), 1);
    let changes = records
        .iter()
        .filter(|r| matches!(r.event, Event::Workers { .. }))
        .count();
    assert!(changes >= 3, "joined, grew, retired: {changes} changes");
    // The snapshot, taken in phase 12, with its duration and bytes.
    let snap = records
        .iter()
        .find(|r| matches!(r.event, Event::Snapshot { .. }))
        .expect("a snapshot record");
    let Event::Snapshot {
        seconds,
        bytes,
        suspend,
        ..
    } = snap.event
    else {
        unreachable!()
    };
    assert!(seconds > 0.0 && bytes > 0 && !suspend, "{snap:?}");
    let end_of = |k: u64| {
        records
            .iter()
            .find(|r| matches!(r.event, Event::PhaseEnd { phase, .. } if phase == k))
            .unwrap()
            .t
    };
    assert!(snap.t > end_of(11), "committed after phase 12 began");
}

/// Runs headless Chromium on `page`, screenshotting it into `png` (installing it first if
/// the machine has none).
fn screenshot(page: &Path, png: &Path, dir: &Path) {
    let chromium = support::chromium::chromium();
    let profile = dir.join("profile");
    let mut child = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--screenshot={}", png.display()))
        .arg("--window-size=1200,800")
        .arg(format!("file://{}", page.display()))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start chromium");
    // A safety limit, not a timing assertion: a browser that hangs fails the test.
    let t = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t.elapsed() > Duration::from_secs(180) {
            let _ = child.kill();
            panic!("chromium did not finish its screenshot in 3 minutes");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        use std::io::Read;
        let _ = e.read_to_string(&mut err);
    }
    assert!(status.success(), "chromium failed ({status}): {err}");
    assert!(png.exists(), "chromium wrote no screenshot: {err}");
}

/// Pixels of the screenshot: (not the white background, the phase bars' blue, the worker
/// line's orange).
fn count_pixels(png: &Path) -> (usize, usize, usize, usize) {
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(png).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    let channels = match info.color_type {
        png::ColorType::Rgb => 3,
        png::ColorType::Rgba => 4,
        other => panic!("unexpected colour type {other:?}"),
    };
    assert_eq!(info.bit_depth, png::BitDepth::Eight);
    let (mut ink, mut blue, mut orange) = (0, 0, 0);
    let pixels = buf[..info.buffer_size()].chunks_exact(channels);
    let total = pixels.len();
    for p in pixels {
        let (r, g, b) = (i32::from(p[0]), i32::from(p[1]), i32::from(p[2]));
        if r < 245 || g < 245 || b < 245 {
            ink += 1;
        }
        if b > r + 40 && b > g + 10 {
            blue += 1;
        }
        if r > 200 && (80..170).contains(&g) && b < 60 {
            orange += 1;
        }
    }
    (total, ink, blue, orange)
}

#[test]
fn a_real_run_gives_a_timeline_and_a_report_that_renders() {
    let dir = scratch("run");
    let records = real_run(&dir);
    check_records(&records);

    let page = dir.join("report.html");
    let html = malleable::timeline::report::html(&records);
    assert_eq!(html.matches("<title>phase ").count(), PHASES as usize);
    assert!(html.contains("<svg") && html.contains("snapshot"));
    std::fs::write(&page, &html).unwrap();
    let png = dir.join("report.png");
    screenshot(&page, &png, &dir);
    let (total, ink, blue, orange) = count_pixels(&png);
    assert_eq!(total, 1200 * 800, "the window's size");
    assert!(
        ink > total / 50,
        "the page is nearly blank: {ink} of {total} pixels"
    );
    assert!(blue > 2000, "phase bars: {blue} blue pixels");
    assert!(orange > 300, "worker line: {orange} orange pixels");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The command: a timeline in, a page out (and a clear error for a broken line).
#[cfg(feature = "cli")]
#[test]
fn the_report_command_turns_a_log_into_a_page() {
    let dir = scratch("cli");
    let log = dir.join("tiny.jsonl");
    let exec = Executor::builder()
        .local_workers(1)
        .timeline(&log)
        .build()
        .unwrap();
    exec.run(Folded(Tiny)).unwrap();
    exec.shutdown().unwrap();
    let bin = env!("CARGO_BIN_EXE_malleable-report");
    let out = dir.join("page.html");
    let run = Command::new(bin)
        .arg(&log)
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    assert!(run.status.success(), "{run:?}");
    let page = std::fs::read_to_string(&out).unwrap();
    assert!(page.contains("<code>tiny</code>") && page.contains("<svg"));

    std::fs::write(&log, "{\"t\": 1}\n").unwrap();
    let run = Command::new(bin).arg(&log).output().unwrap();
    assert!(!run.status.success());
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(
        err.contains("line 1 of the timeline is not a record"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A timeline that cannot be written (a full disk: `/dev/full`) costs the job nothing: the
/// job ends with its value, and the failed writes are counted.
#[test]
fn a_timeline_that_cannot_be_written_is_counted_and_the_job_goes_on() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().unwrap();
    let exec = Executor::builder()
        .local_workers(1)
        .chunking(Chunking::Count(4))
        .timeline("/dev/full")
        .build()
        .unwrap();
    let value = exec.run(Folded(Tiny)).unwrap().into_value();
    assert_eq!(value, 1000 * 999 / 2);
    exec.shutdown().unwrap();
    let failed: u64 = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(k, ..)| {
            k.key().name() == malleable::metrics::TIMELINE_ERRORS
                && k.key()
                    .labels()
                    .any(|l| l.key() == "kind" && l.value() == "write")
        })
        .map(|(.., v)| match v {
            DebugValue::Counter(c) => c,
            _ => 0,
        })
        .sum();
    assert!(failed >= 1, "the failed writes are counted");
}

#[test]
fn a_timeline_that_cannot_be_created_is_an_error_of_the_build() {
    let err = Executor::builder()
        .timeline("/nonexistent-folder/run.jsonl")
        .build()
        .unwrap_err();
    match &err {
        malleable::Error::Timeline { path, source } => {
            assert_eq!(path, Path::new("/nonexistent-folder/run.jsonl"));
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
        }
        other => panic!("{other:?}"),
    }
}

/// Held in its loop body while set (the suspend test's own gate).
static HOLD: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Σ i over `0..n`, one phase, held while `HOLD` is set.
#[derive(Serialize, Deserialize)]
struct Held {
    n: u64,
}

impl Fold for Held {
    const NAME: &'static str = "held";
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
        while HOLD.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_micros(200));
        }
        *acc += i;
    }
}

/// A suspend ends a run's timeline with its snapshot; the resumed run's timeline starts from
/// that epoch.
#[test]
fn a_suspend_and_a_resume_are_in_the_timelines() {
    let dir = scratch("suspend");
    let url = format!("file://{}", dir.join("store").display());
    let (first, second) = (dir.join("first.jsonl"), dir.join("second.jsonl"));
    let exec = Executor::builder()
        .local_workers(1)
        .chunking(Chunking::Count(8))
        .snapshots(&url)
        .timeline(&first)
        .build()
        .unwrap();
    let h = exec.submit(Folded(Held { n: 800 })).unwrap();
    let request = h.suspend(); // the worker is held in its first chunk
    HOLD.store(false, Ordering::Release);
    let id = request.wait().unwrap();
    assert!(matches!(
        h.wait().unwrap(),
        malleable::Outcome::Suspended(_)
    ));
    exec.shutdown().unwrap();

    let exec = Executor::builder()
        .local_workers(2)
        .timeline(&second)
        .build()
        .unwrap();
    let value = exec
        .resume::<Folded<Held>>(&url, malleable::At::Latest)
        .unwrap()
        .wait()
        .unwrap()
        .finished()
        .unwrap()
        .into_value();
    assert_eq!(value, 800 * 799 / 2);
    exec.shutdown().unwrap();

    let first = malleable::timeline::read(&first).unwrap();
    let snapshot = first
        .iter()
        .find_map(|r| match r.event {
            Event::Snapshot { epoch, suspend, .. } => Some((epoch, suspend)),
            _ => None,
        })
        .expect("the suspend's snapshot");
    assert_eq!(snapshot, (id.epoch, true));
    assert!(
        matches!(
            &first.last().unwrap().event,
            Event::End { outcome: Ending::Suspended, epoch: Some(e), .. } if *e == id.epoch
        ),
        "{:?}",
        first.last()
    );
    let second = malleable::timeline::read(&second).unwrap();
    assert!(
        matches!(&second[0].event, Event::Start { resumed_from: Some(e), .. } if *e == id.epoch),
        "{:?}",
        second.first()
    );
    assert!(matches!(
        &second.last().unwrap().event,
        Event::End {
            outcome: Ending::Finished,
            ..
        }
    ));
    assert!(
        second.iter().any(|r| r.local == 2),
        "resumed with two workers"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
