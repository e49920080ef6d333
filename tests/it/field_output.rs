//! A simulation's fields come out: the output hook (`Rows::output`, every k phases and at the
//! end, on the worker that holds each band: a thread of this process or a worker process)
//! and the gather of the final field (`Rows::gather_at_end`, `Finished::field`), with local
//! workers and with worker processes (real processes on loopback). Every field is bit for
//! bit the sequential one.
//!
//! Each output is a file named after its phase and rows, holding the process id that wrote
//! it and the hash of each row: the test reads the folder back. Worker processes are this
//! test binary, re-executed to run [`worker_process`].

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use malleable::cluster::{Registry, WorkerOptions};
use malleable::reduce::Max;
use malleable::rows::{Rows, Window};
use malleable::{Banded, BoxError, Error, Executor, Finished, JobHandle, Next, Outcome, Site};
use serde::{Deserialize, Serialize};

use crate::common;
use common::procs::{coordinator, serve_and_exit, start_worker};

const ADDR_ENV: &str = "MALLEABLE_TEST_FIELD_OUTPUT_ADDR";

/// Jacobi relaxation of `n` rows of `w` cells in `bands` bands for `phases` phases, output
/// into `dir` every `every` phases.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Field {
    n: u64,
    w: usize,
    bands: u64,
    phases: u64,
    done: u64,
    every: Option<u64>,
    gather: bool,
    dir: PathBuf,
    /// While this file exists, the first phase's rows wait (so that worker processes join
    /// before the job goes on).
    gate: Option<PathBuf>,
    /// The output of this (phase, chunk's first row) panics.
    panic_at: Option<(u64, u64)>,
    /// The output of this (phase, chunk's first row) returns an error.
    fail_at: Option<(u64, u64)>,
}

impl Field {
    fn new(name: &str, phases: u64, every: Option<u64>) -> Field {
        let dir = std::env::temp_dir().join(format!(
            "malleable-field-output-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Field {
            n: 60,
            w: 16,
            bands: 5,
            phases,
            done: 0,
            every,
            gather: false,
            dir,
            gate: None,
            panic_at: None,
            fail_at: None,
        }
    }
}

fn init(i: u64, j: usize) -> f64 {
    ((i * 37 + j as u64 * 11) % 97) as f64 / 3.0
}

fn row_update(above: &[f64], old: &[f64], below: &[f64], new: &mut [f64]) {
    let w = old.len();
    new[0] = old[0];
    new[w - 1] = old[w - 1];
    for j in 1..w - 1 {
        new[j] = 0.25 * (above[j] + below[j] + old[j - 1] + old[j + 1]);
    }
}

/// FNV-1a over the cells' bits.
fn hash(cells: &[f64]) -> u64 {
    cells.iter().fold(0xcbf2_9ce4_8422_2325, |h, x| {
        (h ^ x.to_bits()).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

impl Rows for Field {
    const NAME: &'static str = "test-field-output";
    type Element = f64;
    type Acc = f64;
    type Reducer = Max<f64>;
    type Input = ();

    fn height(&self) -> u64 {
        self.n
    }
    fn width(&self) -> usize {
        self.w
    }
    fn bands(&self) -> u64 {
        self.bands
    }
    fn reducer(&self) -> Max<f64> {
        Max::new()
    }
    fn init(&self, _: &(), i: u64, row: &mut [f64]) {
        for (j, x) in row.iter_mut().enumerate() {
            *x = init(i, j);
        }
    }
    fn update(&self, _: &(), _: u64, win: Window<'_, f64>, change: &mut f64) {
        if let (Some(gate), 0) = (&self.gate, self.done) {
            while gate.exists() {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        match (win.above, win.below) {
            (Some(a), Some(b)) => row_update(a, win.old, b, win.row),
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
    fn output_every(&self) -> Option<u64> {
        self.every
    }
    fn output(&self, _: &(), phase: u64, rows: Range<u64>, cells: &[f64]) -> Result<(), BoxError> {
        assert!(self.panic_at != Some((phase, rows.start)), "output panics");
        if self.fail_at == Some((phase, rows.start)) {
            return Err(std::io::Error::other("the disk is full").into());
        }
        assert_eq!(cells.len(), (rows.end - rows.start) as usize * self.w);
        // The job as it ran the phase.
        assert_eq!(
            self.done, phase,
            "output of phase {phase} with a job at {}",
            self.done
        );
        let mut text = format!("{}\n", std::process::id());
        for row in cells.chunks(self.w) {
            text.push_str(&format!("{}\n", hash(row)));
        }
        let name = format!("p{phase}-r{}-{}", rows.start, rows.end);
        // Written once: a second output of the same rows and phase is seen.
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(name))?;
        std::io::Write::write_all(&mut f, text.as_bytes())?;
        Ok(())
    }
    fn gather_at_end(&self) -> bool {
        self.gather
    }
}

/// The fields after each phase, computed by a plain loop.
fn sequential(f: &Field) -> Vec<Vec<f64>> {
    let (n, w) = (f.n as usize, f.w);
    let mut grid: Vec<f64> = (0..n)
        .flat_map(|i| (0..w).map(move |j| init(i as u64, j)))
        .collect();
    let mut all = Vec::new();
    for _ in 0..f.phases {
        let mut next = grid.clone();
        for i in 1..n - 1 {
            let (above, old, below) = (
                &grid[(i - 1) * w..i * w],
                &grid[i * w..(i + 1) * w],
                &grid[(i + 1) * w..(i + 2) * w],
            );
            row_update(above, old, below, &mut next[i * w..(i + 1) * w]);
        }
        grid = next;
        all.push(grid.clone());
    }
    all
}

/// The bands' rows, as the executor cuts them.
fn bands(f: &Field) -> Vec<Range<u64>> {
    let per = f.n.div_ceil(f.bands);
    (0..f.n.div_ceil(per))
        .map(|b| b * per..((b + 1) * per).min(f.n))
        .collect()
}

/// An output's phase, first row and end row.
type Key = (u64, u64, u64);

/// What was output: per (phase, rows), the process ids that wrote it (one per call) and
/// the rows' hashes of the last call.
fn outputs(dir: &Path) -> BTreeMap<Key, (Vec<u32>, Vec<u64>)> {
    let mut all = BTreeMap::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().into_string().unwrap();
        let (p, r) = name.split_once("-r").unwrap();
        let (start, end) = r.split_once('-').unwrap();
        let key = (
            p[1..].parse().unwrap(),
            start.parse().unwrap(),
            end.parse().unwrap(),
        );
        let text = std::fs::read_to_string(e.path()).unwrap();
        let rows = (key.2 - key.1) as usize;
        let lines: Vec<u64> = text.lines().map(|l| l.parse().unwrap()).collect();
        let calls = lines.len() / (rows + 1);
        let pids = (0..calls).map(|c| lines[c * (rows + 1)] as u32).collect();
        let hashes = lines[lines.len() - rows..].to_vec();
        all.insert(key, (pids, hashes));
    }
    all
}

/// Checks that `f` was output after exactly `phases`, each band once, with the sequential
/// rows; returns the process ids that wrote each phase's bands.
fn check_outputs(f: &Field, phases: &[u64]) -> BTreeMap<u64, Vec<u32>> {
    let got = outputs(&f.dir);
    let want: Vec<Key> = phases
        .iter()
        .flat_map(|&p| bands(f).into_iter().map(move |r| (p, r.start, r.end)))
        .collect();
    assert_eq!(got.keys().copied().collect::<Vec<_>>(), want);
    let fields = sequential(f);
    let w = f.w;
    let mut pids: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
    for ((p, start, end), (who, hashes)) in got {
        assert_eq!(
            who.len(),
            1,
            "phase {p} rows {start}..{end} output {} times",
            who.len()
        );
        let rows = &fields[p as usize][start as usize * w..end as usize * w];
        let want: Vec<u64> = rows.chunks(w).map(hash).collect();
        assert_eq!(hashes, want, "phase {p} rows {start}..{end}");
        pids.entry(p).or_default().extend(who);
    }
    pids
}

fn assert_same_field(got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len());
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        panic!("cell {i} differs: {} != {}", got[i], want[i]);
    }
}

fn finished(h: JobHandle<Banded<Field>>) -> Finished<Banded<Field>> {
    match h.wait().unwrap() {
        Outcome::Finished(f) => f,
        other => panic!("not finished: {other:?}"),
    }
}

fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "timed out: {what}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
#[ignore = "the body of the worker processes the other tests start"]
fn worker_process() {
    let Ok(addr) = std::env::var(ADDR_ENV) else {
        return;
    };
    common::log::log_if_asked("MALLEABLE_TEST_LOG", "worker process");
    let options = WorkerOptions::from_env().unwrap().threads(1);
    let registry = Registry::new().register::<Banded<Field>>();
    serve_and_exit(&addr, &registry, options, Duration::from_secs(20));
}

/// Runs `f` with `local` local workers and `processes` worker processes that all join
/// during its first phase (held at a gate until then).
fn run_with_processes(mut f: Field, local: usize, processes: usize) -> Finished<Banded<Field>> {
    let gate = f.dir.with_extension("gate");
    std::fs::write(&gate, b"").unwrap();
    f.gate = Some(gate.clone());
    let exec = coordinator(local);
    let addr = exec.local_addr().unwrap().to_string();
    let h = exec.submit(Banded(f)).unwrap();
    let mut children: Vec<Child> = (0..processes)
        .map(|_| start_worker(module_path!(), ADDR_ENV, &addr))
        .collect();
    until("the worker processes", || h.remote_workers() == processes);
    std::fs::remove_file(&gate).unwrap();
    let done = finished(h);
    assert!(exec.peer_errors().is_empty(), "{:?}", exec.peer_errors());
    for c in &mut children {
        assert!(c.wait().unwrap().success());
    }
    done
}

/// With local workers, every band is output every 3 phases on the worker that ran it and
/// after the last phase (phase 6 of 7) when the job finished, once each, with the job as
/// it ran the phase and the rows as the sequential loop has them; with every 2 of 6, the
/// last phase is an output phase and is not output twice; a grid that does not ask is
/// never output.
#[test]
fn bands_are_output_every_k_phases_and_at_the_end_with_local_workers() {
    let exec = Executor::builder().local_workers(2).build().unwrap();
    let f = Field::new("local-3", 7, Some(3));
    let done = exec.run(Banded(f.clone())).unwrap();
    assert!(done.field().is_none(), "not gathered unless asked");
    let pids = check_outputs(&f, &[2, 5, 6]);
    let me = std::process::id();
    assert!(pids.values().flatten().all(|&p| p == me));

    let f = Field::new("local-2", 6, Some(2));
    exec.run(Banded(f.clone())).unwrap();
    check_outputs(&f, &[1, 3, 5]);

    let f = Field::new("local-end", 4, Some(0));
    exec.run(Banded(f.clone())).unwrap();
    check_outputs(&f, &[3]);

    let f = Field::new("local-none", 4, None);
    exec.run(Banded(f.clone())).unwrap();
    check_outputs(&f, &[]);
    for d in ["local-3", "local-2", "local-end", "local-none"] {
        let _ = std::fs::remove_dir_all(Field::new(d, 1, None).dir);
    }
}

/// Worker processes only: every band is output in the process that holds it, at its
/// chunk's end and, for the last phase, when the job finished (`Output`), each once.
#[test]
fn bands_held_by_worker_processes_are_output_there() {
    let f = Field::new("remote", 7, Some(3));
    let done = run_with_processes(f.clone(), 0, 2);
    assert!(done.field().is_none());
    let pids = check_outputs(&f, &[2, 5, 6]);
    let me = std::process::id();
    for (phase, who) in &pids {
        assert!(
            who.iter().all(|&p| p != me),
            "phase {phase} output here: {who:?}"
        );
    }
    let _ = std::fs::remove_dir_all(&f.dir);
}

/// The gathered field is the sequential one, bit for bit: local workers only, and a local
/// worker with one and with two worker processes (which output their bands, then hand
/// them back).
#[test]
fn the_gathered_field_is_the_sequential_one_for_any_workers() {
    for (name, local, processes) in [("g-local", 2, 0), ("g-one", 1, 1), ("g-two", 1, 2)] {
        let mut f = Field::new(name, 9, Some(4));
        f.gather = true;
        let done = if processes == 0 {
            let exec = Executor::builder().local_workers(local).build().unwrap();
            exec.run(Banded(f.clone())).unwrap()
        } else {
            run_with_processes(f.clone(), local, processes)
        };
        let want = sequential(&f);
        let field = done.field().expect("gathered");
        assert_same_field(&field, &want[8]);
        let parts = done.partitions().unwrap();
        assert_eq!(
            parts.iter().map(|b| b.rows()).collect::<Vec<_>>(),
            bands(&f)
        );
        let pids = check_outputs(&f, &[3, 7, 8]);
        if processes > 0 {
            let me = std::process::id();
            assert!(
                pids[&8].iter().any(|&p| p != me),
                "{name}: some band was held by a worker process at the end: {pids:?}"
            );
        }
        let _ = std::fs::remove_dir_all(&f.dir);
    }
}

/// A panic in the output hook ends the job with `Panicked` at the chunk and phase, and an
/// error with `Output` carrying it: at a chunk's end and at the job's end, with local workers
/// and in a worker process.
#[test]
fn a_failing_output_ends_the_job_with_its_error() {
    let exec = Executor::builder().local_workers(2).build().unwrap();
    // Band 2 starts at row 24.
    let mut f = Field::new("panic-local", 7, Some(3));
    f.panic_at = Some((5, 24));
    match exec.run(Banded(f.clone())) {
        Err(Error::Panicked {
            site: Site::Chunk { phase: 5, chunk: 2 },
            message,
            ..
        }) => assert!(message.contains("output panics"), "{message}"),
        other => panic!("{other:?}"),
    }
    let mut f = Field::new("fail-local-end", 7, Some(3));
    f.fail_at = Some((6, 24));
    match exec.run(Banded(f.clone())) {
        Err(
            e @ Error::Output {
                phase: 6, chunk: 2, ..
            },
        ) => {
            let chain = common::chain(&e);
            assert!(
                chain.iter().any(|t| t.contains("the disk is full")),
                "{chain:?}"
            );
        }
        other => panic!("{other:?}"),
    }

    // In worker processes: the end's output (`Output`) and a chunk's end.
    for (name, at) in [("fail-remote-end", 6), ("fail-remote-chunk", 5)] {
        let mut f = Field::new(name, 7, Some(3));
        f.fail_at = Some((at, 24));
        let gate = f.dir.with_extension("gate");
        std::fs::write(&gate, b"").unwrap();
        f.gate = Some(gate.clone());
        let exec = coordinator(0);
        let addr = exec.local_addr().unwrap().to_string();
        let h = exec.submit(Banded(f.clone())).unwrap();
        let mut child = start_worker(module_path!(), ADDR_ENV, &addr);
        until("the worker process", || h.remote_workers() == 1);
        std::fs::remove_file(&gate).unwrap();
        match h.wait() {
            Err(
                e @ Error::Output {
                    phase, chunk: 2, ..
                },
            ) if phase == at => {
                let chain = common::chain(&e);
                assert!(
                    chain.iter().any(|t| t.contains("the disk is full")),
                    "{name}: {chain:?}"
                );
            }
            other => panic!("{name}: {other:?}"),
        }
        let _ = child.wait();
    }
    for d in [
        "panic-local",
        "fail-local-end",
        "fail-remote-end",
        "fail-remote-chunk",
    ] {
        let _ = std::fs::remove_dir_all(Field::new(d, 1, None).dir);
    }
}
