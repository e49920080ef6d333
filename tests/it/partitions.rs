//! Owned partitions through the `Rows` shortcut: every grid, after any scaling history,
//! snapshot and restore, is bit for bit the grid of a plain sequential loop.

use std::time::Duration;

use malleable::reduce::CollectInOrder;
use malleable::rows::{Rows, Sweep, Window};
use malleable::{At, Banded, Error, Executor, Next, Series};
use serde::{Deserialize, Serialize};

/// FNV-1a over the bits of a row.
fn hash(row: &[f64]) -> u64 {
    row.iter().fold(0xcbf2_9ce4_8422_2325, |h, x| {
        (h ^ x.to_bits()).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn init(i: u64, j: usize) -> f64 {
    ((i * 31 + j as u64 * 17) % 101) as f64 / 7.0
}

/// Jacobi relaxation; the value of a phase is the hash of every row, in order.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Jacobi {
    n: u64,
    w: usize,
    bands: u64,
    phases: u64,
    done: u64,
}

impl Rows for Jacobi {
    const NAME: &'static str = "partitions-jacobi";
    type Element = f64;
    type Acc = Vec<u64>;
    type Reducer = CollectInOrder<u64>;
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
    fn reducer(&self) -> CollectInOrder<u64> {
        CollectInOrder::new()
    }
    fn init(&self, _: &(), i: u64, row: &mut [f64]) {
        for (j, x) in row.iter_mut().enumerate() {
            *x = init(i, j);
        }
    }
    fn update(&self, _: &(), _i: u64, win: Window<'_, f64>, acc: &mut Vec<u64>) {
        match (win.above, win.below) {
            (Some(a), Some(b)) => jacobi_row(a, win.old, b, win.row),
            _ => win.row.copy_from_slice(win.old),
        }
        acc.push(hash(win.row));
    }
    fn end_phase(&mut self, _: &Vec<u64>) -> Next {
        self.done += 1;
        if self.done < self.phases {
            Next::Continue
        } else {
            Next::Finish
        }
    }
    fn target_step(&self) -> Duration {
        Duration::from_micros(50)
    }
}

fn jacobi_row(above: &[f64], old: &[f64], below: &[f64], new: &mut [f64]) {
    let w = old.len();
    new[0] = old[0];
    new[w - 1] = old[w - 1];
    for j in 1..w - 1 {
        new[j] = 0.25 * (above[j] + below[j] + old[j - 1] + old[j + 1]);
    }
}

fn jacobi_sequential(n: u64, w: usize, phases: u64) -> Vec<u64> {
    let mut g: Vec<Vec<f64>> = (0..n)
        .map(|i| (0..w).map(|j| init(i, j)).collect())
        .collect();
    let mut hashes = Vec::new();
    for _ in 0..phases {
        let mut next = g.clone();
        hashes.clear();
        for i in 0..n as usize {
            if i > 0 && i + 1 < n as usize {
                jacobi_row(&g[i - 1], &g[i], &g[i + 1], &mut next[i]);
            }
            hashes.push(hash(&next[i]));
        }
        g = next;
    }
    hashes
}

/// Red-black relaxation in place: phase `p` updates the cells with `(i + j) % 2 == p % 2`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct RedBlack {
    n: u64,
    w: usize,
    bands: u64,
    phases: u64,
    done: u64,
}

impl Rows for RedBlack {
    const NAME: &'static str = "partitions-red-black";
    const SWEEP: Sweep = Sweep::InPlace;
    type Element = f64;
    type Acc = Vec<u64>;
    type Reducer = CollectInOrder<u64>;
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
    fn reducer(&self) -> CollectInOrder<u64> {
        CollectInOrder::new()
    }
    fn init(&self, _: &(), i: u64, row: &mut [f64]) {
        for (j, x) in row.iter_mut().enumerate() {
            *x = init(i, j);
        }
    }
    fn update(&self, _: &(), i: u64, win: Window<'_, f64>, acc: &mut Vec<u64>) {
        if let (Some(a), Some(b)) = (win.above, win.below) {
            red_black_row(self.done % 2, i, a, win.row, b);
        }
        acc.push(hash(win.row));
    }
    fn end_phase(&mut self, _: &Vec<u64>) -> Next {
        self.done += 1;
        if self.done < self.phases {
            Next::Continue
        } else {
            Next::Finish
        }
    }
    fn target_step(&self) -> Duration {
        Duration::from_micros(50)
    }
}

fn red_black_row(colour: u64, i: u64, above: &[f64], row: &mut [f64], below: &[f64]) {
    let w = row.len();
    let first = 1 + ((i + 1 + colour) % 2) as usize;
    for j in (first..w - 1).step_by(2) {
        row[j] = 1.25 * 0.25 * (above[j] + below[j] + row[j - 1] + row[j + 1]) - 0.25 * row[j];
    }
}

fn red_black_sequential(n: u64, w: usize, phases: u64) -> Vec<u64> {
    let mut g: Vec<Vec<f64>> = (0..n)
        .map(|i| (0..w).map(|j| init(i, j)).collect())
        .collect();
    let mut hashes = Vec::new();
    for p in 0..phases {
        hashes.clear();
        for i in 0..n as usize {
            if i > 0 && i + 1 < n as usize {
                let (head, tail) = g.split_at_mut(i);
                let (row, rest) = tail.split_at_mut(1);
                red_black_row(p % 2, i as u64, &head[i - 1], &mut row[0], &rest[0]);
            }
            hashes.push(hash(&g[i]));
        }
    }
    hashes
}

#[test]
fn jacobi_is_the_sequential_grid_for_any_worker_count() {
    let expected = jacobi_sequential(61, 23, 40);
    for workers in [0, 1, 2, 3] {
        let exec = Executor::builder().local_workers(workers).build().unwrap();
        for bands in [1, 4, 7, 61] {
            let job = Jacobi {
                n: 61,
                w: 23,
                bands,
                phases: 40,
                done: 0,
            };
            let got = exec.run(Banded(job)).unwrap().into_value();
            assert_eq!(got, expected, "{workers} workers, {bands} bands");
        }
    }
}

#[test]
fn red_black_in_place_is_the_sequential_grid_for_any_worker_count() {
    let expected = red_black_sequential(50, 31, 41);
    for workers in [0, 1, 2, 3] {
        let exec = Executor::builder().local_workers(workers).build().unwrap();
        for bands in [1, 5, 50] {
            let job = RedBlack {
                n: 50,
                w: 31,
                bands,
                phases: 41,
                done: 0,
            };
            let got = exec.run(Banded(job)).unwrap().into_value();
            assert_eq!(got, expected, "{workers} workers, {bands} bands");
        }
    }
}

/// Workers come and go every few hundred microseconds while partitions move between them.
#[test]
fn grids_survive_scaling_histories() {
    let expected = jacobi_sequential(300, 64, 300);
    let exec = Executor::builder().local_workers(1).build().unwrap();
    for seed in 0..4u64 {
        let job = Jacobi {
            n: 300,
            w: 64,
            bands: 16,
            phases: 300,
            done: 0,
        };
        let handle = exec.submit(Banded(job)).unwrap();
        let mut x = seed;
        while !handle.is_finished() {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            handle.set_local_workers(((x >> 33) % 4) as usize);
            std::thread::sleep(Duration::from_micros(200 + (x >> 40) % 800));
        }
        let got = handle.wait().unwrap().finished().unwrap().into_value();
        assert_eq!(got, expected, "history {seed}");
    }
}

/// Snapshots in the middle of phases, a suspend, and resumes with other worker counts.
#[test]
fn grids_suspend_and_resume_with_another_worker_count() {
    let dir = tempfile_dir("resume");
    let url = format!("file://{}", dir.display());
    let expected = red_black_sequential(1500, 256, 600);
    let job = RedBlack {
        n: 1500,
        w: 256,
        bands: 9,
        phases: 600,
        done: 0,
    };
    let exec = Executor::builder()
        .local_workers(2)
        .snapshots(&url)
        .build()
        .unwrap();
    let handle = exec.submit(Banded(job)).unwrap();
    let mut snapshots = 0;
    let mut workers = [1usize, 3, 0, 2].into_iter().cycle();
    let mut outcome = None;
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(1));
        if handle.is_finished() {
            break;
        }
        if handle.snapshot().wait().is_ok() {
            snapshots += 1;
        }
    }
    let suspended = handle.suspend().wait();
    match handle.wait().unwrap() {
        malleable::Outcome::Finished(f) => outcome = Some(f.into_value()),
        _ => assert!(suspended.is_ok()),
    }
    let mut resumes = 0;
    while outcome.is_none() {
        resumes += 1;
        let n = workers.next().unwrap();
        let exec = Executor::builder()
            .local_workers(n)
            .snapshots(&url)
            .build()
            .unwrap();
        let h = exec.resume::<Banded<RedBlack>>(&url, At::Latest).unwrap();
        std::thread::sleep(Duration::from_millis(2));
        let _ = h.suspend().wait();
        if let malleable::Outcome::Finished(f) = h.wait().unwrap() {
            outcome = Some(f.into_value());
        }
    }
    assert!(snapshots > 0);
    assert!(resumes > 1, "{resumes} resumes");
    assert_same(&outcome.unwrap(), &expected);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A job whose phases change size cannot keep its partitions: a typed error, not a wrong
/// grid.
#[test]
fn a_phase_of_another_size_is_an_error() {
    #[derive(Debug, Clone, Serialize, Deserialize)]
    struct Shrinks(Jacobi);
    impl Rows for Shrinks {
        const NAME: &'static str = "partitions-shrinks";
        type Element = f64;
        type Acc = Vec<u64>;
        type Reducer = CollectInOrder<u64>;
        type Input = ();
        fn height(&self) -> u64 {
            self.0.n - self.0.done
        }
        fn width(&self) -> usize {
            self.0.w
        }
        fn reducer(&self) -> CollectInOrder<u64> {
            CollectInOrder::new()
        }
        fn init(&self, _: &(), i: u64, row: &mut [f64]) {
            self.0.init(&(), i, row)
        }
        fn update(&self, _: &(), i: u64, win: Window<'_, f64>, acc: &mut Vec<u64>) {
            self.0.update(&(), i, win, acc)
        }
        fn end_phase(&mut self, v: &Vec<u64>) -> Next {
            self.0.end_phase(v)
        }
    }
    let exec = Executor::builder().local_workers(2).build().unwrap();
    let job = Shrinks(Jacobi {
        n: 100,
        w: 8,
        bands: 4,
        phases: 3,
        done: 0,
    });
    match exec.run(Banded(job)) {
        Err(Error::PartitionsChanged {
            phase: 1,
            expected: 100,
            found: 99,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
}

/// A wave equation, leapfrog in time ([`Sweep::ThreeLevel`]): `uⁿ⁺¹` from `uⁿ` (the rows
/// next to it) and `uⁿ⁻¹` (the row written, on entry). Its first phase is the half step of a
/// start from rest, told by `Window::phase`; the last phase hashes the rows, told by
/// `Window::last`; every phase's sum of squares goes into a `Series`, which also counts the
/// phases: the job value holds no phase counter.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Leapfrog {
    n: u64,
    w: usize,
    bands: u64,
    phases: u64,
    /// Each phase's `[Σ u², phase]`, the sum taken row by row in row order.
    series: Series,
}

impl Leapfrog {
    fn new(n: u64, w: usize, bands: u64, phases: u64) -> Leapfrog {
        Leapfrog {
            n,
            w,
            bands,
            phases,
            series: Series::new(2),
        }
    }
}

/// Courant number squared.
const C2: f64 = 0.2;

/// What a [`Leapfrog`] band reports: each row's sum of squares in row order, and the
/// rows' hashes in the last phase.
type LeapAcc = Vec<(f64, Option<u64>)>;

impl Rows for Leapfrog {
    const NAME: &'static str = "partitions-leapfrog";
    const SWEEP: Sweep = Sweep::ThreeLevel;
    type Element = f64;
    type Acc = LeapAcc;
    type Reducer = CollectInOrder<(f64, Option<u64>)>;
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
    fn reducer(&self) -> Self::Reducer {
        CollectInOrder::new()
    }
    fn init(&self, _: &(), i: u64, row: &mut [f64]) {
        for (j, x) in row.iter_mut().enumerate() {
            *x = init(i, j) - 7.0;
        }
    }
    fn update(&self, _: &(), _i: u64, win: Window<'_, f64>, acc: &mut LeapAcc) {
        match (win.above, win.below) {
            (Some(a), Some(b)) => leapfrog_row(win.phase, a, win.old, b, win.row),
            _ => win.row.copy_from_slice(win.old),
        }
        let squares = win.row.iter().map(|x| x * x).sum();
        acc.push((squares, win.last.then(|| hash(win.row))));
    }
    fn end_phase(&mut self, rows: &LeapAcc) -> Next {
        let total = rows.iter().map(|r| r.0).sum::<f64>();
        self.series.push(&[total, self.series.len() as f64]);
        if (self.series.len() as u64) < self.phases {
            Next::Continue
        } else {
            Next::Finish
        }
    }
    fn phases(&self) -> Option<u64> {
        Some(self.phases)
    }
    fn target_step(&self) -> Duration {
        Duration::from_micros(50)
    }
}

/// Row `i` of phase `phase + 1` into `row`, which holds it as of phase `phase - 1` (as of
/// phase 0 in phase 0: a start from rest takes half a step).
fn leapfrog_row(phase: u64, above: &[f64], old: &[f64], below: &[f64], row: &mut [f64]) {
    let w = old.len();
    row[0] = old[0];
    row[w - 1] = old[w - 1];
    for j in 1..w - 1 {
        let lap = above[j] + below[j] + old[j - 1] + old[j + 1] - 4.0 * old[j];
        row[j] = if phase == 0 {
            old[j] + 0.5 * C2 * lap
        } else {
            2.0 * old[j] - row[j] + C2 * lap
        };
    }
}

/// The leapfrog as a plain loop: its last rows' hashes and every phase's `[Σ u², phase]`.
fn leapfrog_sequential(n: u64, w: usize, phases: u64) -> (Vec<u64>, Vec<[u64; 2]>) {
    let mut cur: Vec<Vec<f64>> = (0..n)
        .map(|i| (0..w).map(|j| init(i, j) - 7.0).collect())
        .collect();
    let mut older = cur.clone();
    let mut series = Vec::new();
    for p in 0..phases {
        let mut total = 0.0;
        for i in 0..n as usize {
            if i > 0 && i + 1 < n as usize {
                leapfrog_row(p, &cur[i - 1], &cur[i], &cur[i + 1], &mut older[i]);
            } else {
                older[i].copy_from_slice(&cur[i]);
            }
            total += older[i].iter().map(|x| x * x).sum::<f64>();
        }
        series.push([total.to_bits(), (p as f64).to_bits()]);
        std::mem::swap(&mut cur, &mut older);
    }
    (cur.iter().map(|r| hash(r)).collect(), series)
}

/// A finished leapfrog's last rows' hashes and its series, in bits.
fn leapfrog_result(done: &malleable::Finished<Banded<Leapfrog>>) -> (Vec<u64>, Vec<[u64; 2]>) {
    let hashes = done.value.iter().map(|r| r.1.expect("hashed")).collect();
    let series = done
        .job
        .0
        .series
        .iter()
        .map(|r| [r[0].to_bits(), r[1].to_bits()]);
    (hashes, series.collect())
}

#[test]
fn three_level_with_the_phase_in_the_window_is_the_sequential_grid_for_any_worker_count() {
    let expected = leapfrog_sequential(61, 23, 40);
    for workers in [0, 1, 2, 3] {
        let exec = Executor::builder().local_workers(workers).build().unwrap();
        for bands in [1, 4, 7, 61] {
            let done = exec.run(Banded(Leapfrog::new(61, 23, bands, 40))).unwrap();
            assert_eq!(
                leapfrog_result(&done),
                expected,
                "{workers} workers, {bands} bands"
            );
        }
    }
}

/// The phase, both levels of a three-level scheme and the series survive snapshots in the
/// middle of phases, a suspend and resumes with other worker counts.
#[test]
fn three_level_grids_and_their_series_suspend_and_resume() {
    let dir = tempfile_dir("leapfrog");
    let url = format!("file://{}", dir.display());
    let (n, w, phases) = (1200, 256, 400);
    let expected = leapfrog_sequential(n, w, phases);
    let exec = Executor::builder()
        .local_workers(2)
        .snapshots(&url)
        .build()
        .unwrap();
    let handle = exec.submit(Banded(Leapfrog::new(n, w, 9, phases))).unwrap();
    let mut snapshots = 0;
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(1));
        if handle.is_finished() {
            break;
        }
        if handle.snapshot().wait().is_ok() {
            snapshots += 1;
        }
    }
    let suspended = handle.suspend().wait();
    let mut outcome = match handle.wait().unwrap() {
        malleable::Outcome::Finished(f) => Some(leapfrog_result(&f)),
        _ => {
            assert!(suspended.is_ok());
            None
        }
    };
    let mut workers = [1usize, 3, 0, 2].into_iter().cycle();
    let mut resumes = 0;
    while outcome.is_none() {
        resumes += 1;
        let exec = Executor::builder()
            .local_workers(workers.next().unwrap())
            .snapshots(&url)
            .build()
            .unwrap();
        let h = exec.resume::<Banded<Leapfrog>>(&url, At::Latest).unwrap();
        std::thread::sleep(Duration::from_millis(2));
        let _ = h.suspend().wait();
        if let malleable::Outcome::Finished(f) = h.wait().unwrap() {
            outcome = Some(leapfrog_result(&f));
        }
    }
    assert!(snapshots > 0);
    assert!(resumes > 1, "{resumes} resumes");
    let (hashes, series) = outcome.unwrap();
    assert_same(&hashes, &expected.0);
    assert_eq!(series.len(), phases as usize);
    assert_eq!(series, expected.1, "every phase's record, once, in order");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A grid of no phase finishes at once with the reducer's identity: nothing is initialized
/// or updated, and `end_phase` is not called.
#[test]
fn a_grid_of_no_phase_finishes_with_an_empty_value() {
    #[derive(Debug, Clone, Serialize, Deserialize)]
    struct Never(Leapfrog);
    impl Rows for Never {
        const NAME: &'static str = "partitions-never";
        type Element = f64;
        type Acc = LeapAcc;
        type Reducer = CollectInOrder<(f64, Option<u64>)>;
        type Input = ();
        fn height(&self) -> u64 {
            self.0.n
        }
        fn width(&self) -> usize {
            self.0.w
        }
        fn reducer(&self) -> Self::Reducer {
            CollectInOrder::new()
        }
        fn init(&self, _: &(), i: u64, _: &mut [f64]) {
            panic!("row {i} initialized in a job of no phase");
        }
        fn update(&self, _: &(), i: u64, _: Window<'_, f64>, _: &mut LeapAcc) {
            panic!("row {i} updated in a job of no phase");
        }
        fn end_phase(&mut self, _: &LeapAcc) -> Next {
            panic!("end_phase called in a job of no phase");
        }
        fn phases(&self) -> Option<u64> {
            Some(0)
        }
    }
    for workers in [0, 2] {
        let exec = Executor::builder().local_workers(workers).build().unwrap();
        let done = exec.run(Banded(Never(Leapfrog::new(40, 8, 4, 0)))).unwrap();
        assert_eq!(done.value, Vec::new());
        assert!(done.job.0.0.series.is_empty());
        assert_eq!(done.job.0.0.n, 40);
    }
}

/// Row hashes compared, naming the first row that differs.
fn assert_same(got: &[u64], expected: &[u64]) {
    assert_eq!(got.len(), expected.len(), "rows");
    if let Some(i) = (0..got.len()).find(|&i| got[i] != expected[i]) {
        panic!("row {i} differs (and maybe later ones)");
    }
}

fn tempfile_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!(
        "malleable-partitions-{name}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}
