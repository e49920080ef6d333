//! Owned partitions that exchange pieces with any partitions (`Exchange`): a 2-D grid of
//! tiles whose phases end, in turn, with halos to the tiles that share a side, an allgather
//! and an all-to-all. Each piece and each partition's fold of what it received is order
//! sensitive, so a piece lost, applied twice, misaddressed or handed over in another order
//! changes the value: every run is checked bit for bit against a plain sequential loop, on
//! local threads (1 to 3), and with worker processes (real processes on loopback) that join
//! and are retired while it runs. A graph that is not one is refused before anything runs.

use std::ops::Range;
use std::process::Child;
use std::time::Duration;

use malleable::cluster::{Registry, WorkerOptions};
use malleable::exchange::GraphError;
use malleable::reduce::CollectInOrder;
use malleable::{
    Chunk, Chunking, Error, Exchange, Executor, Job, JobHandle, Next, Outcome, Ownership, Pattern,
    Pieces, Step,
};
use serde::{Deserialize, Serialize};

use crate::common;

const ADDR_ENV: &str = "MALLEABLE_TEST_EXCHANGE_ADDR";

/// FNV-1a, word by word: order sensitive.
fn fnv(h: u64, x: u64) -> u64 {
    (h ^ x).wrapping_mul(0x0100_0000_01B3)
}

/// One cell's update in a step.
fn mix(v: u64, i: u64) -> u64 {
    let z = v.wrapping_add(i).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z ^ (z >> 29)
}

/// A `rows` x `cols` grid of tiles of `cells` cells each, `phases` phases.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Mesh {
    rows: u64,
    cols: u64,
    cells: u64,
    phases: u64,
    /// A graph that is not one (for the refusal test): tile 0 names tile 2, which does not
    /// name it back.
    lopsided: bool,
}

impl Mesh {
    fn tiles(&self) -> u64 {
        self.rows * self.cols
    }

    /// What crosses the barrier after `phase`: halos, an allgather and an all-to-all in turn.
    fn pattern_of(phase: u64) -> Pattern {
        match phase % 3 {
            0 => Pattern::Neighbours,
            1 => Pattern::Allgather,
            _ => Pattern::AllToAll,
        }
    }

    /// The tiles that share a side with `tile`, in any order (the executor sorts them).
    fn sides(&self, tile: u64) -> Vec<u64> {
        let (r, c) = (tile / self.cols, tile % self.cols);
        let mut n = Vec::new();
        if c + 1 < self.cols {
            n.push(tile + 1);
        }
        if r + 1 < self.rows {
            n.push(tile + self.cols);
        }
        if c > 0 {
            n.push(tile - 1);
        }
        if r > 0 {
            n.push(tile - self.cols);
        }
        if self.lopsided && tile == 0 {
            n.push(2);
        }
        n
    }
}

/// One tile: its cells and how far its phase got.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Tile {
    me: u64,
    cells: Vec<u64>,
    next: u64,
}

impl Tile {
    fn new(me: u64, cells: u64) -> Tile {
        Tile {
            me,
            cells: (0..cells).map(|i| mix(me, i)).collect(),
            next: 0,
        }
    }

    /// At most 8 cells of the phase; the tile's hash when it is through.
    fn advance(&mut self) -> Option<u64> {
        let end = (self.next + 8).min(self.cells.len() as u64);
        for i in self.next..end {
            self.cells[i as usize] = mix(self.cells[i as usize], i);
        }
        self.next = end;
        (end == self.cells.len() as u64).then(|| self.cells.iter().fold(self.me, |h, &c| fnv(h, c)))
    }

    /// The piece for `to` (`None`: everyone).
    fn piece(&self, to: Option<u64>) -> Vec<u64> {
        let first = self.cells[0];
        let last = self.cells[self.cells.len() - 1];
        match to {
            Some(to) => vec![fnv(first, to), last, self.me],
            None => vec![self.cells.iter().fold(0, |a: u64, &c| a.wrapping_add(c))],
        }
    }

    /// Takes the pieces in, in the order given, and rewinds.
    fn absorb<'a>(&mut self, pieces: impl Iterator<Item = (u64, &'a Vec<u64>)>) {
        let mut acc = self.me;
        let n = self.cells.len();
        for (k, (from, piece)) in pieces.enumerate() {
            acc = fnv(acc, from);
            for &x in piece {
                acc = fnv(acc, x);
            }
            self.cells[k % n] ^= acc;
        }
        self.next = 0;
    }
}

impl Job for Mesh {
    const NAME: &'static str = "exchange-mesh";
    const OWNERSHIP: Ownership<Self> = Ownership::EXCHANGES;
    type Chunk = Tile;
    type Reducer = CollectInOrder<u64>;
    type Input = ();

    fn iterations(&self) -> u64 {
        self.tiles() * self.cells
    }

    fn chunking(&self) -> Option<Chunking> {
        Some(Chunking::Size(self.cells))
    }

    fn chunk(&self, range: Range<u64>) -> Tile {
        Tile::new(range.start / self.cells, self.cells)
    }

    fn reducer(&self) -> CollectInOrder<u64> {
        CollectInOrder::new()
    }

    fn phases(&self) -> Option<u64> {
        Some(self.phases)
    }

    fn end_phase(&mut self, _: &Vec<u64>) -> Next {
        self.phases -= 1;
        if self.phases == 0 {
            Next::Finish
        } else {
            Next::Continue
        }
    }
}

impl Chunk for Tile {
    type Job = Mesh;
    type Output = Vec<u64>;

    fn step(&mut self, _: &Mesh, _: &()) -> Step<Vec<u64>> {
        match self.advance() {
            Some(h) => Step::Done(vec![h]),
            None => Step::Yield,
        }
    }
}

impl Exchange for Tile {
    type Piece = Vec<u64>;

    fn neighbours(job: &Mesh, chunk: u64, _chunks: u64) -> Vec<u64> {
        job.sides(chunk)
    }

    fn pattern(_: &Mesh, phase: u64) -> Pattern {
        Mesh::pattern_of(phase)
    }

    fn export(&self, _: &Mesh, to: Option<u64>) -> Vec<u64> {
        self.piece(to)
    }

    fn begin_phase(&mut self, _: &Mesh, pieces: Pieces<'_, Vec<u64>>) {
        self.absorb(pieces.iter());
    }
}

/// The plain loop: every tile's phase, then the pieces delivered by sender.
fn sequential(job: &Mesh) -> Vec<u64> {
    let n = job.tiles();
    let mut tiles: Vec<Tile> = (0..n).map(|t| Tile::new(t, job.cells)).collect();
    let mut value = Vec::new();
    for phase in 0..job.phases {
        value = tiles
            .iter_mut()
            .map(|t| {
                loop {
                    if let Some(h) = t.advance() {
                        break h;
                    }
                }
            })
            .collect();
        if phase + 1 == job.phases {
            break;
        }
        // inbox[to] = (from, piece), by sender.
        let mut inbox: Vec<Vec<(u64, Vec<u64>)>> = vec![Vec::new(); n as usize];
        for (from, t) in tiles.iter().enumerate() {
            let from = from as u64;
            match Mesh::pattern_of(phase) {
                Pattern::Neighbours => {
                    for to in job.sides(from) {
                        inbox[to as usize].push((from, t.piece(Some(to))));
                    }
                }
                Pattern::Allgather => {
                    let p = t.piece(None);
                    for b in &mut inbox {
                        b.push((from, p.clone()));
                    }
                }
                Pattern::AllToAll => {
                    for to in 0..n {
                        inbox[to as usize].push((from, t.piece(Some(to))));
                    }
                }
                _ => {}
            }
        }
        for (t, mut b) in tiles.iter_mut().zip(inbox) {
            b.sort_by_key(|(from, _)| *from);
            t.absorb(b.iter().map(|(f, p)| (*f, p)));
        }
    }
    value
}

fn mesh(phases: u64) -> Mesh {
    Mesh {
        rows: 3,
        cols: 4,
        cells: 40,
        phases,
        lopsided: false,
    }
}

fn finished(h: JobHandle<Mesh>) -> Vec<u64> {
    match h.wait().unwrap() {
        Outcome::Finished(f) => f.into_value(),
        other => panic!("not finished: {other:?}"),
    }
}

/// Every pattern, on 1 to 3 local threads, gives the sequential loop's bits.
#[test]
fn tiles_exchange_halos_allgather_and_all_to_all_exactly() {
    let job = mesh(31);
    let want = sequential(&job);
    assert_eq!(want.len(), 12);
    for threads in 1..=3 {
        let exec = Executor::builder().local_workers(threads).build().unwrap();
        let got = exec.run(job.clone()).unwrap().into_value();
        assert_eq!(got, want, "{threads} threads");
    }
}

/// Threads join and leave while the tiles exchange: the bits do not change.
#[test]
fn tiles_exchange_exactly_while_threads_come_and_go() {
    let job = Mesh {
        cells: 4000,
        ..mesh(40)
    };
    let want = sequential(&job);
    let exec = Executor::builder().local_workers(1).build().unwrap();
    let h = exec.submit(job).unwrap();
    let mut grow = true;
    while !h.is_finished() {
        h.set_local_workers(if grow { 3 } else { 1 });
        grow = !grow;
        std::thread::sleep(Duration::from_millis(7));
    }
    assert_eq!(finished(h), want);
}

/// A graph whose neighbours do not name each other back is refused before anything runs,
/// naming the first chunk at fault.
#[test]
fn a_lopsided_graph_is_refused_before_anything_runs() {
    let job = Mesh {
        lopsided: true,
        ..mesh(3)
    };
    let exec = Executor::builder().local_workers(2).build().unwrap();
    match exec.run(job) {
        Err(Error::Neighbours {
            job,
            chunk: 0,
            problem: GraphError::NotSymmetric { neighbour: 2 },
        }) => assert_eq!(job, "exchange-mesh"),
        other => panic!("not refused: {other:?}"),
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
    common::procs::serve_and_exit(
        &addr,
        &Registry::new().register::<Mesh>().register::<Wide>(),
        options,
        Duration::from_secs(20),
    );
}

fn until(what: &str, cond: impl FnMut() -> bool) {
    common::until(what, Duration::from_secs(60), cond);
}

/// Worker processes join while the tiles exchange, hold tiles, and one is retired (its
/// tiles come back): every pattern crosses processes, and the bits are the sequential
/// loop's.
#[test]
fn worker_processes_exchange_exactly_as_they_join_and_leave() {
    let job = Mesh {
        cells: 20_000,
        ..mesh(150)
    };
    let want = sequential(&job);
    let exec = common::procs::coordinator(1);
    let addr = exec.local_addr().unwrap().to_string();
    let h = exec.submit(job).unwrap();
    until("phase 3", || h.progress().phase >= 3);
    let mut procs: Vec<Child> = (0..2)
        .map(|_| common::procs::start_worker(module_path!(), ADDR_ENV, &addr))
        .collect();
    until("two processes", || h.remote_workers() == 2);
    until("tiles held by both processes", || {
        let p = h.remote_processes();
        p.len() == 2 && p.iter().all(|p| p.chunks > 0)
    });
    let joined = h.progress().phase;
    assert!(joined < 100, "the processes joined late: phase {joined}");
    until("ten phases more", || h.progress().phase >= joined + 10);
    h.retire_remote(1);
    until("one process", || h.remote_workers() == 1);
    // Pieces crossed processes both ways, through the coordinator.
    let t = h.traffic();
    assert!(t.messages_in > 0 && t.messages_out > 0, "{t:?}");
    assert!(t.halo_bytes_in > 0 && t.halo_bytes_out > 0, "{t:?}");
    assert_eq!(finished(h), want);
    assert!(exec.peer_errors().is_empty(), "{:?}", exec.peer_errors());
    for p in &mut procs {
        let _ = p.wait();
    }
}

/// Pointers to the vectors `Pieces::concat` gave the partitions of [`Gather`], per phase.
static CONCATS: std::sync::Mutex<Vec<(u64, usize)>> = std::sync::Mutex::new(Vec::new());

/// Partitions that allgather their chunk numbers every phase and read the whole vector.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Gather {
    parts: u64,
    phases: u64,
    done: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct Gathering {
    me: u64,
    sum: u64,
    /// The vector read last, kept so that a vector built for this partition alone could
    /// not share an address with another's (the runs here take no snapshot).
    #[serde(skip)]
    all: Option<std::sync::Arc<Vec<u64>>>,
}

impl Job for Gather {
    const NAME: &'static str = "exchange-gather";
    const OWNERSHIP: Ownership<Self> = Ownership::EXCHANGES;
    type Chunk = Gathering;
    type Reducer = CollectInOrder<u64>;
    type Input = ();
    fn iterations(&self) -> u64 {
        self.parts
    }
    fn chunking(&self) -> Option<Chunking> {
        Some(Chunking::Size(1))
    }
    fn chunk(&self, range: Range<u64>) -> Gathering {
        Gathering {
            me: range.start,
            sum: 0,
            all: None,
        }
    }
    fn reducer(&self) -> CollectInOrder<u64> {
        CollectInOrder::new()
    }
    fn end_phase(&mut self, _: &Vec<u64>) -> Next {
        self.done += 1;
        if self.done < self.phases {
            Next::Continue
        } else {
            Next::Finish
        }
    }
}

impl Chunk for Gathering {
    type Job = Gather;
    type Output = Vec<u64>;
    fn step(&mut self, _: &Gather, _: &()) -> Step<Vec<u64>> {
        Step::Done(vec![self.sum + self.me])
    }
}

impl Exchange for Gathering {
    type Piece = Vec<u64>;
    fn neighbours(_: &Gather, _: u64, _: u64) -> Vec<u64> {
        Vec::new()
    }
    fn pattern(_: &Gather, _: u64) -> Pattern {
        Pattern::Allgather
    }
    fn export(&self, _: &Gather, to: Option<u64>) -> Vec<u64> {
        assert_eq!(to, None, "an allgather's one piece");
        vec![self.me, self.me * 10]
    }
    fn begin_phase(&mut self, job: &Gather, pieces: Pieces<'_, Vec<u64>>) {
        let all = pieces.concat::<u64>();
        CONCATS
            .lock()
            .unwrap()
            .push((job.done, std::sync::Arc::as_ptr(&all) as usize));
        self.sum = all.iter().sum();
        self.all = Some(all);
    }
}

/// An allgather's whole vector is built once per barrier and shared by every partition of
/// the process, in chunk order.
#[test]
fn an_allgather_builds_one_vector_for_every_partition() {
    let job = Gather {
        parts: 6,
        phases: 4,
        done: 0,
    };
    let exec = Executor::builder().local_workers(2).build().unwrap();
    let done = exec.run(job).unwrap();
    // Each partition read 0, 0, 1, 10, …, 5, 50: their sum is 165, plus its own number.
    assert_eq!(done.value, (0..6).map(|me| 165 + me).collect::<Vec<u64>>());
    let concats = std::mem::take(&mut *CONCATS.lock().unwrap());
    assert_eq!(concats.len(), 6 * 3, "six partitions, three barriers");
    for phase in 1..=3 {
        let at: Vec<usize> = concats
            .iter()
            .filter(|(p, _)| *p == phase)
            .map(|(_, a)| *a)
            .collect();
        assert_eq!(at.len(), 6);
        assert!(at.iter().all(|a| *a == at[0]), "phase {phase}: {at:?}");
    }
}

/// The vector `Pieces::concat` gave the first partition of this process that began each
/// phase of [`Wide`] (by phase): the others compare theirs with it.
static FIRST_CONCAT: std::sync::Mutex<Vec<(u64, usize)>> = std::sync::Mutex::new(Vec::new());

/// Partitions that allgather `width` numbers each every phase, made from what they gathered
/// the phase before, and fold the whole vector in chunk order.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Wide {
    parts: u64,
    width: u64,
    phases: u64,
    done: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct WidePart {
    me: u64,
    sum: u64,
    /// Whether the last vector this partition read was the one of the first partition of
    /// its process to begin that phase (one vector per process).
    shared: bool,
    #[serde(skip)]
    all: Option<std::sync::Arc<Vec<u64>>>,
}

impl Wide {
    /// The piece a partition with `me` and `sum` exports.
    fn piece(&self, me: u64, sum: u64) -> Vec<u64> {
        (0..self.width).map(|i| mix(fnv(sum, me), i)).collect()
    }

    /// The partitions' `sum`s after `self.phases` phases, by a plain loop.
    fn sequential(&self) -> Vec<u64> {
        let mut sums = vec![0; self.parts as usize];
        for _ in 1..self.phases {
            let all: Vec<u64> = (0..self.parts)
                .flat_map(|me| self.piece(me, sums[me as usize]))
                .collect();
            let folded = all.iter().fold(0xcbf2_9ce4_8422_2325, |h, x| fnv(h, *x));
            for (me, s) in sums.iter_mut().enumerate() {
                *s = fnv(folded, me as u64);
            }
        }
        sums
    }
}

impl Job for Wide {
    const NAME: &'static str = "exchange-wide";
    const OWNERSHIP: Ownership<Self> = Ownership::EXCHANGES;
    type Chunk = WidePart;
    type Reducer = CollectInOrder<(u64, bool)>;
    type Input = ();
    fn iterations(&self) -> u64 {
        self.parts
    }
    fn chunking(&self) -> Option<Chunking> {
        Some(Chunking::Size(1))
    }
    fn chunk(&self, range: Range<u64>) -> WidePart {
        WidePart {
            me: range.start,
            sum: 0,
            shared: true,
            all: None,
        }
    }
    fn reducer(&self) -> CollectInOrder<(u64, bool)> {
        CollectInOrder::new()
    }
    fn end_phase(&mut self, _: &Vec<(u64, bool)>) -> Next {
        self.done += 1;
        if self.done < self.phases {
            Next::Continue
        } else {
            Next::Finish
        }
    }
}

impl Chunk for WidePart {
    type Job = Wide;
    type Output = Vec<(u64, bool)>;
    fn step(&mut self, _: &Wide, _: &()) -> Step<Vec<(u64, bool)>> {
        Step::Done(vec![(self.sum, self.shared)])
    }
}

impl Exchange for WidePart {
    type Piece = Vec<u64>;
    fn neighbours(_: &Wide, _: u64, _: u64) -> Vec<u64> {
        Vec::new()
    }
    fn pattern(_: &Wide, _: u64) -> Pattern {
        Pattern::Allgather
    }
    fn export(&self, job: &Wide, _: Option<u64>) -> Vec<u64> {
        job.piece(self.me, self.sum)
    }
    fn begin_phase(&mut self, job: &Wide, pieces: Pieces<'_, Vec<u64>>) {
        let all = pieces.concat::<u64>();
        let at = std::sync::Arc::as_ptr(&all) as usize;
        let mut first = FIRST_CONCAT.lock().unwrap();
        let first = match first.iter().find(|(p, _)| *p == job.done) {
            Some((_, a)) => *a,
            None => {
                first.push((job.done, at));
                at
            }
        };
        self.shared = first == at;
        let folded = all.iter().fold(0xcbf2_9ce4_8422_2325, |h, x| fnv(h, *x));
        self.sum = fnv(folded, self.me);
        self.all = Some(all);
    }
}

/// An allgather between worker processes: each process gets every piece once a phase, not
/// once for each of its partitions, and not the pieces it exported itself (the
/// coordinator's halo bytes out per phase are about the pieces once), decodes each once,
/// and its partitions read one vector (`Pieces::concat`); the value is the plain loop's.
#[test]
fn an_allgather_reaches_each_process_once() {
    let job = Wide {
        parts: 8,
        width: 1000,
        phases: 30,
        done: 0,
    };
    let want = job.sequential();
    let exec = common::procs::coordinator(0);
    let addr = exec.local_addr().unwrap().to_string();
    let mut procs: Vec<Child> = (0..2)
        .map(|_| common::procs::start_worker(module_path!(), ADDR_ENV, &addr))
        .collect();
    let h = exec.submit(job.clone()).unwrap();
    // Nobody waits on the job until it ends: a waiting thread would run partitions too.
    until("the end", || h.is_finished());
    let t = h.traffic();
    let got = match h.wait().unwrap() {
        Outcome::Finished(f) => f.into_value(),
        other => panic!("not finished: {other:?}"),
    };
    assert_eq!(got.iter().map(|(s, _)| *s).collect::<Vec<_>>(), want);
    // Most partitions read their process's one vector (one that moved between processes
    // at a barrier got its pieces with it and built its own).
    let shared = got.iter().filter(|(_, s)| *s).count();
    assert!(shared >= 6, "{got:?}");
    // A phase's pieces: 8 of 1 000 numbers, 8 to 10 bytes each, at most 80 KB. Each
    // process gets the pieces it did not export itself, once a phase: 80 KB a phase in all
    // (and a moved partition's own, rarely). Every piece to every process: 2 × 64 KB at
    // least; once per partition: 8 × 64 KB.
    let pieces = job.parts * job.width * 10;
    eprintln!(
        "halo bytes out {} ({} a phase; the pieces at most {pieces})",
        t.halo_bytes_out,
        t.halo_bytes_out / job.phases
    );
    assert!(
        2 * t.halo_bytes_out <= 3 * pieces * job.phases,
        "{} bytes out, {} a phase: {t:?}",
        t.halo_bytes_out,
        t.halo_bytes_out / job.phases
    );
    assert!(t.halo_bytes_out > 0, "{t:?}");
    for p in &mut procs {
        let _ = p.wait();
    }
}

/// A snapshot folder of its own for one test.
fn folder(name: &str) -> (std::path::PathBuf, String) {
    common::folder("exchange", name)
}

/// One of two worker processes is killed while the tiles exchange: the job rolls back to
/// its latest snapshot by itself and ends with the sequential loop's bits; then a job
/// suspended with tiles in a process resumes on local threads only, exactly.
#[test]
fn tiles_roll_back_and_resume_elsewhere_exactly() {
    let job = Mesh {
        cells: 20_000,
        ..mesh(200)
    };
    let want = sequential(&job);
    let (dir, url) = folder("rollback");
    let coordinator = || {
        Executor::builder()
            .local_workers(1)
            .listen("127.0.0.1:0")
            .heartbeat(Duration::from_millis(100), Duration::from_secs(3))
            .snapshots(&url)
            .build()
            .unwrap()
    };
    let exec = coordinator();
    let addr = exec.local_addr().unwrap().to_string();
    let h = exec.submit(job.clone()).unwrap();
    let mut a = common::procs::start_worker(module_path!(), ADDR_ENV, &addr);
    let mut b = common::procs::start_worker(module_path!(), ADDR_ENV, &addr);
    until("tiles on both processes", || {
        let p = h.remote_processes();
        p.len() == 2 && p.iter().all(|p| p.chunks > 0)
    });
    let at = h.progress().phase;
    h.snapshot().wait().unwrap();
    until("ten phases more", || h.progress().phase >= at + 10);
    a.kill().unwrap();
    let _ = a.wait();
    until("the rollback", || !h.rollbacks().is_empty());
    assert_eq!(finished(h.clone()), want);
    assert_eq!(h.rollbacks().len(), 1, "{:?}", h.rollbacks());
    assert!(b.wait().unwrap().success());

    // Suspended with tiles in a process, resumed with two local threads.
    let exec = coordinator();
    let addr = exec.local_addr().unwrap().to_string();
    let h = exec.submit(job).unwrap();
    let mut c = common::procs::start_worker(module_path!(), ADDR_ENV, &addr);
    until("tiles on the process", || {
        h.remote_processes().iter().any(|p| p.chunks > 0)
    });
    let at = h.progress().phase;
    until("five phases more", || h.progress().phase >= at + 5);
    h.suspend().wait().unwrap();
    assert!(matches!(h.wait().unwrap(), Outcome::Suspended(_)));
    let _ = c.wait();
    let local = Executor::builder().local_workers(2).build().unwrap();
    let r = local.resume::<Mesh>(&url, malleable::At::Latest).unwrap();
    assert_eq!(finished(r), want);
    let _ = std::fs::remove_dir_all(&dir);
}
