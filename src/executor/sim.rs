//! Deterministic simulation of whole clusters: the coordinator's state (`State`, driven
//! through the same calls its drivers make), worker processes (`worker/sim.rs`: the pure
//! protocol machine, its compute threads turned chunk by chunk, the job's code), a network of
//! ordered links, an in-memory object store and a clock, all driven by one seeded scheduler
//! on one thread. A seed is a history: which message is delivered next, which thread runs,
//! when a placement or a store operation ends, when time passes, and the faults (a process
//! killed at any message, frozen past its lease, retired; a store operation that fails;
//! snapshots and suspends asked for; the job resumed by a new coordinator from the store with
//! another roster).
//!
//! Every history must end with the job's value bit for bit the sequential loop's, every
//! snapshot request answered, and every committed snapshot restorable. A failing history
//! prints the command that replays it:
//!
//! ```text
//! MALLEABLE_SIM_SEED=<seed> cargo test --all-features --lib executor::sim -- --nocapture
//! ```
//!
//! `MALLEABLE_SIM_SECONDS` sets the time the test spends on histories (default 20), and
//! `MALLEABLE_SIM_FIRST` the first seed (default 0).
//!
//! # What the drivers do that this does
//!
//! The drivers of a real run translate; this does the same, deterministically: the socket
//! task of a process hands each message to `State::on_remote` and drops the connection on an
//! error or at the lease's end (`drop_conn`); its writer sends heartbeats; the store driver
//! runs `write_cut`, `read_back_manifest` and `read_back_parts` and hands back their outcome.
//! Local threads are not simulated (the roster is worker processes only).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::io::{CutWritten, Origin, restore, write_cut};
use super::job_run::State;
use super::links::StoreOp;
use super::rollback::{read_back_manifest, read_back_parts, restore_read};
use super::snapshot::Snapshots;
use super::{Builder, Config, Outcome, first_phase};
use crate::Next;
use crate::error::Error;
use crate::reduce::CollectInOrder;
use crate::rows::{Banded, Rows, Window};
use crate::schedule::ProcessId;
use crate::snapshot::{SnapshotId, Store};
use crate::wire::frame::{ToCoordinator, ToWorker};
use crate::worker::sim::{PeerFrame, SimProcess};

mod mesh;
pub(crate) mod scale;

/// The coordinator's lease on a silent process, and the process's on the coordinator.
const LEASE: Duration = Duration::from_secs(1);
/// Heartbeats, both ways.
const HEARTBEAT: Duration = Duration::from_millis(100);
/// Phases without a fault after which a cut still open counts as stuck: one completes
/// within the phase it was asked in or the next, once its answers came and the snapshot
/// being written when it was asked is written.
const STUCK_CUT_PHASES: u64 = 3;
/// Simulated time without progress after which a history counts as stuck.
const STUCK: Duration = Duration::from_secs(60);
/// Steps after which a history counts as endless.
const MAX_STEPS: u64 = 200_000;
/// Faults after which a history calms down: no more are drawn, and the job must then end.
/// Without a budget, a seed whose faults come faster than a snapshot commits (every write
/// failed, every kill after the first phase submits the job again) never ends, which says
/// nothing about the coordinator; with it, such a history checks that the job ends once the
/// faults stop.
const FAULT_BUDGET: u64 = 1_000;

/// A small grid on owned partitions: `n` rows of `w` cells in `bands` bands, relaxed for
/// `phases` phases; the value is every row's hash after the last phase.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SimGrid {
    n: u64,
    w: usize,
    bands: u64,
    phases: u64,
    done: u64,
}

fn init(i: u64, j: usize) -> f64 {
    ((i * 31 + j as u64 * 17) % 101) as f64 / 7.0
}

fn hash(row: &[f64]) -> u64 {
    row.iter().fold(0xcbf2_9ce4_8422_2325, |h, x| {
        (h ^ x.to_bits()).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn relax(above: &[f64], old: &[f64], below: &[f64], new: &mut [f64]) {
    let w = old.len();
    new[0] = old[0];
    new[w - 1] = old[w - 1];
    for j in 1..w - 1 {
        new[j] = 0.25 * (above[j] + below[j] + old[j - 1] + old[j + 1]);
    }
}

impl Rows for SimGrid {
    const NAME: &'static str = "sim-grid";
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
    fn update(&self, _: &(), _: u64, win: Window<'_, f64>, acc: &mut Vec<u64>) {
        match (win.above, win.below) {
            (Some(a), Some(b)) => relax(a, win.old, b, win.row),
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
}

type SimJob = Banded<SimGrid>;

/// A job the simulation runs: drawn from a seed, with the value a plain loop gives.
trait Simulated: crate::Job<Reducer: crate::reduce::Reducer<Value = Vec<u64>>> + Clone {
    /// The job of a history, drawn from its generator.
    fn draw(rng: &mut Rng) -> Self;
    /// The job's value computed by a plain loop.
    fn expected(&self) -> Vec<u64>;
    /// Whether `bytes`, a buddy copy of `chunk`'s partition as `phase` left it, is that
    /// partition as a plain loop leaves it.
    fn check_copy(&self, chunk: u64, phase: u64, bytes: &[u8]) -> Result<(), String>;
    /// Whether `bytes` is `chunk`'s partition as it begins `phase` (after `begin_phase`)
    /// in a plain loop, as far as the check can tell.
    fn check_begun(&self, chunk: u64, phase: u64, bytes: &[u8]) -> Result<(), String>;
    /// Whether `halos`, the halo log's record of what `chunk` (of `rows`) exported at the
    /// end of `phase`, is what it exports in a plain loop.
    fn check_log(
        &self,
        chunk: u64,
        rows: std::ops::Range<u64>,
        phase: u64,
        halos: &[(Option<u64>, bytes::Bytes)],
    ) -> Result<(), String>;
    /// The job in a few words, for the log.
    fn describe(&self) -> String;
}

impl Simulated for SimJob {
    fn draw(rng: &mut Rng) -> Self {
        let bands = 2 + rng.below(7);
        Banded(SimGrid {
            n: bands * (2 + rng.below(4)),
            w: 6,
            bands,
            phases: 2 + rng.below(5),
            done: 0,
        })
    }
    fn expected(&self) -> Vec<u64> {
        sequential(&self.0)
    }
    fn check_copy(&self, chunk: u64, phase: u64, bytes: &[u8]) -> Result<(), String> {
        let band: crate::rows::Band<SimGrid> =
            crate::codec::decode("a copy", bytes).map_err(|e| e.to_string())?;
        let grid = grid_after(&self.0, phase + 1);
        let rows = band.rows();
        let w = self.0.w;
        let same = band.cells().len() == (rows.end - rows.start) as usize * w
            && rows.clone().zip(band.cells().chunks(w)).all(|(i, row)| {
                let want = &grid[i as usize];
                row.iter()
                    .zip(want)
                    .all(|(a, b)| a.to_bits() == b.to_bits())
            });
        if same {
            Ok(())
        } else {
            Err(format!(
                "the copy of band {chunk} (rows {rows:?}) of phase {phase} is not the grid's"
            ))
        }
    }
    fn check_begun(&self, chunk: u64, phase: u64, bytes: &[u8]) -> Result<(), String> {
        // Its rows are the phase before's (its halos are not checked).
        self.check_copy(chunk, phase - 1, bytes)
    }
    fn check_log(
        &self,
        chunk: u64,
        rows: std::ops::Range<u64>,
        phase: u64,
        halos: &[(Option<u64>, bytes::Bytes)],
    ) -> Result<(), String> {
        let grid = grid_after(&self.0, phase + 1);
        // A halo is a row's cells, postcard bytes: their little-endian form.
        let row = |i: u64| -> Vec<u8> {
            grid[i as usize]
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect()
        };
        let mut want = Vec::new();
        if chunk > 0 {
            want.push((Some(chunk - 1), row(rows.start)));
        }
        if chunk + 1 < self.0.bands {
            want.push((Some(chunk + 1), row(rows.end - 1)));
        }
        let got: Vec<(Option<u64>, Vec<u8>)> = halos
            .iter()
            .map(|(to, b)| Ok((*to, crate::codec::decode::<Vec<u8>>("a halo", b)?)))
            .collect::<Result<_, crate::codec::Error>>()
            .map_err(|e| e.to_string())?;
        if got == want {
            Ok(())
        } else {
            Err(format!(
                "the halo log of band {chunk} for phase {phase} is not the grid's rows"
            ))
        }
    }
    fn describe(&self) -> String {
        format!(
            "grid of {} rows in {} bands, {} phases",
            self.0.n, self.0.bands, self.0.phases
        )
    }
}

/// The grid's value computed by a plain loop.
fn sequential(g: &SimGrid) -> Vec<u64> {
    let mut hashes = Vec::new();
    relaxed(g, g.phases, &mut hashes);
    hashes
}

/// The grid after `phases` phases of a plain loop.
fn grid_after(g: &SimGrid, phases: u64) -> Vec<Vec<f64>> {
    relaxed(g, phases, &mut Vec::new())
}

/// The grid after `phases` phases of a plain loop, and the last phase's row hashes.
fn relaxed(g: &SimGrid, phases: u64, hashes: &mut Vec<u64>) -> Vec<Vec<f64>> {
    let (n, w) = (g.n as usize, g.w);
    let mut grid: Vec<Vec<f64>> = (0..n)
        .map(|i| (0..w).map(|j| init(i as u64, j)).collect())
        .collect();
    for _ in 0..phases {
        let mut next = grid.clone();
        hashes.clear();
        for i in 0..n {
            if i > 0 && i + 1 < n {
                relax(&grid[i - 1], &grid[i], &grid[i + 1], &mut next[i]);
            }
            hashes.push(hash(&next[i]));
        }
        grid = next;
    }
    grid
}

/// The simulation's object store: in memory, and able to tear a commit. Armed, the next
/// put of a manifest fails after every part of its snapshot is already written: the commit
/// never happened, and its parts are left in an uncommitted epoch folder.
#[derive(Debug, Default)]
struct Tearing {
    inner: object_store::memory::InMemory,
    tear: std::sync::atomic::AtomicBool,
}

impl std::fmt::Display for Tearing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a simulated store")
    }
}

#[async_trait::async_trait]
impl object_store::ObjectStore for Tearing {
    async fn put_opts(
        &self,
        location: &object_store::path::Path,
        payload: object_store::PutPayload,
        opts: object_store::PutOptions,
    ) -> object_store::Result<object_store::PutResult> {
        use std::sync::atomic::Ordering;
        let manifest = location.filename() == Some("manifest");
        if manifest && self.tear.swap(false, Ordering::SeqCst) {
            return Err(object_store::Error::Generic {
                store: "simulated",
                source: "the commit was torn".into(),
            });
        }
        self.inner.put_opts(location, payload, opts).await
    }
    async fn put_multipart_opts(
        &self,
        location: &object_store::path::Path,
        opts: object_store::PutMultipartOptions,
    ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }
    async fn get_opts(
        &self,
        location: &object_store::path::Path,
        options: object_store::GetOptions,
    ) -> object_store::Result<object_store::GetResult> {
        self.inner.get_opts(location, options).await
    }
    fn delete_stream(
        &self,
        locations: futures::stream::BoxStream<
            'static,
            object_store::Result<object_store::path::Path>,
        >,
    ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::path::Path>> {
        self.inner.delete_stream(locations)
    }
    fn list(
        &self,
        prefix: Option<&object_store::path::Path>,
    ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>> {
        self.inner.list(prefix)
    }
    async fn list_with_delimiter(
        &self,
        prefix: Option<&object_store::path::Path>,
    ) -> object_store::Result<object_store::ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }
    async fn copy_opts(
        &self,
        from: &object_store::path::Path,
        to: &object_store::path::Path,
        options: object_store::CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

/// The scheduler's randomness (SplitMix64): a seed replays its history.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A simulated worker process and its link to the coordinator.
struct Proc<J: Simulated> {
    id: ProcessId,
    sim: SimProcess<J>,
    /// Messages from the coordinator on their way, in order.
    inbox: VecDeque<ToWorker>,
    /// Frozen (stopped) until then: it neither runs nor answers.
    frozen_until: Option<Duration>,
    /// When the coordinator last heard from it.
    heard: Duration,
    /// When the coordinator last sent it a heartbeat.
    beat: Duration,
}

/// A link of the peer data plane between two simulated processes, one way: the frames on
/// their way from `from` to `to`, in order.
struct Link {
    from: ProcessId,
    to: ProcessId,
    frames: VecDeque<PeerFrame>,
}

/// What the scheduler can do next.
#[derive(Debug, Clone, Copy)]
enum Action {
    /// Deliver the next frame on peer link `0`.
    Peer(usize),
    /// Deliver the next message from the coordinator to process `0`.
    ToProc(usize),
    /// Deliver the next message from process `0` to the coordinator.
    ToCoord(usize),
    /// Process `0`'s thread `1` runs.
    Turn(usize, usize),
    /// Process `0`'s background work `1` ends (a placement, the store's check, a part's
    /// write).
    Settle(usize, usize),
    /// Store operation `0` ends.
    Store(usize),
    /// Time passes.
    Tick,
    /// Something the world does to the cluster (a fault, a request).
    Event,
}

/// What one history did, for the report.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Tally {
    pub(crate) steps: u64,
    pub(crate) faults: u64,
    pub(crate) kills: u64,
    pub(crate) freezes: u64,
    pub(crate) store_failures: u64,
    pub(crate) resumes: u64,
    pub(crate) crashes: u64,
    pub(crate) rollbacks: u64,
    pub(crate) snapshots: u64,
    /// `Run`s with a grant of held partitions after them, and grants given back unstarted
    /// (`Returned`).
    pub(crate) grants: u64,
    pub(crate) returned: u64,
    /// Halos pushed between processes (the peer data plane), those kept where they were
    /// pushed, and peer links broken.
    pub(crate) pushed: u64,
    pub(crate) kept_at_peers: u64,
    pub(crate) links_broken: u64,
    /// Buddy copies the coordinator recorded, and those checked against the plain loop's
    /// partitions in their buddy's memory.
    pub(crate) copies: u64,
    pub(crate) copies_checked: u64,
    /// Records of halo logs checked against the plain loop's exports.
    pub(crate) logs_checked: u64,
    /// Local recoveries: lost partitions replayed from their copies, no rollback; and
    /// those given up for a rollback.
    pub(crate) recoveries: u64,
    pub(crate) abandoned: u64,
    /// Allgather pieces a `Gathered` named as its receiver's own instead of carrying them
    /// (protocol 25).
    pub(crate) own_pieces: u64,
}

impl std::ops::AddAssign for Tally {
    fn add_assign(&mut self, t: Tally) {
        self.steps += t.steps;
        self.faults += t.faults;
        self.kills += t.kills;
        self.freezes += t.freezes;
        self.store_failures += t.store_failures;
        self.resumes += t.resumes;
        self.grants += t.grants;
        self.returned += t.returned;
        self.pushed += t.pushed;
        self.kept_at_peers += t.kept_at_peers;
        self.links_broken += t.links_broken;
        self.copies += t.copies;
        self.copies_checked += t.copies_checked;
        self.logs_checked += t.logs_checked;
        self.recoveries += t.recoveries;
        self.abandoned += t.abandoned;
        self.own_pieces += t.own_pieces;
        self.crashes += t.crashes;
        self.rollbacks += t.rollbacks;
        self.snapshots += t.snapshots;
    }
}

/// One history of one seed.
struct History<J: Simulated = SimJob> {
    rng: Rng,
    now: Duration,
    base: Instant,
    job: J,
    config: Arc<Config>,
    store: Store,
    /// The store's own handle, to tear a commit.
    tearing: Arc<Tearing>,
    rt: Arc<tokio::runtime::Runtime>,
    state: State<J>,
    procs: Vec<Proc<J>>,
    /// The peer data plane's links, in the order they were first used.
    links: Vec<Link>,
    next_proc: u64,
    ops: Vec<StoreOp>,
    /// Snapshot requests asked, and those answered.
    replies: (u64, crate::schedule::idhash::IdSet<u64>),
    /// Each request's phase and fault count when it was asked (a suspend's too), by number.
    asked: Vec<(u64, u64)>,
    /// A request answered "the job ended" although nothing went wrong for phases after it
    /// was asked: its cut never completed.
    stuck_cut: Option<String>,
    /// The coordinator's phase when the last snapshot write ended: no cut starts while one
    /// is written, so a request asked meanwhile waits for it, however many phases that
    /// takes (seed 1266886).
    written_in: u64,
    /// The first message of a process the coordinator refused.
    refused: Option<String>,
    /// Store operations to fail, from the next one on.
    fail_store: u32,
    log: Vec<String>,
    /// Whether the log records every message (`MALLEABLE_SIM_TRACE`).
    trace: bool,
    tally: Tally,
    /// The coordinator was killed: the next step starts a new one.
    crashed: bool,
    /// The step at which a fault is forced if none happened yet.
    forced_fault: u64,
    /// The last progress seen, and when.
    progress: ((u64, u64, u64), Duration),
}

impl<J: Simulated> History<J> {
    fn new(seed: u64, rt: Arc<tokio::runtime::Runtime>) -> History<J> {
        let mut rng = Rng(seed ^ 0x5bd1_e995_0000_0000);
        let job = J::draw(&mut rng);
        let keep = 1 + rng.below(3) as usize;
        let forced_fault = 1 + rng.below(8);
        // A third of the histories take no buddy copies, the others at every barrier or
        // every other one (drawn apart from `rng`, so that the draws stay as they were).
        let copies = [None, Some(1), Some(2)][(seed % 3) as usize];
        let mut h = History::build(job, keep, forced_fault, copies, rng, rt);
        let first = 1 + h.rng.below(3);
        for _ in 0..first {
            h.start_process();
        }
        h
    }

    /// A history of `job` keeping `keep` snapshots, with no process yet, drawing from `rng`.
    fn build(
        job: J,
        keep: usize,
        forced_fault: u64,
        copies: Option<u64>,
        rng: Rng,
        rt: Arc<tokio::runtime::Runtime>,
    ) -> History<J> {
        let tearing = Arc::new(Tearing::default());
        let store = Store::from_object_store(Arc::clone(&tearing) as _, "");
        let mut config = Builder::default().config;
        config.local_workers = 0;
        config.check_store = None;
        config.cluster.heartbeat = HEARTBEAT;
        config.cluster.lease = LEASE;
        config.snapshots.set_store(store.clone());
        config.snapshots.keep = keep;
        config.snapshots.max_failures = Some(1000);
        config.buddy_copies = copies;
        let wrapped = job.clone();
        config.origin = Origin::new(
            Some(crate::codec::encode("the job", &wrapped).expect("a grid encodes")),
            &wrapped,
            0,
        )
        .expect("the grid's shape");
        let (core, chunking) = first_phase(&wrapped, &config).expect("the first phase");
        config.chunking = chunking;
        let config = Arc::new(config);
        let state = fresh_state(&config, core, wrapped, 0, 0, Snapshots::default());
        let mut h = History {
            rng,
            now: Duration::ZERO,
            base: Instant::now(),
            job,
            config,
            store,
            tearing,
            rt,
            state,
            procs: Vec::new(),
            links: Vec::new(),
            next_proc: 0,
            ops: Vec::new(),
            replies: (0, Default::default()),
            asked: Vec::new(),
            written_in: 0,
            stuck_cut: None,
            refused: None,
            fail_store: 0,
            log: Vec::new(),
            trace: std::env::var_os("MALLEABLE_SIM_TRACE").is_some(),
            tally: Tally::default(),
            forced_fault,
            crashed: false,
            progress: ((0, 0, 0), Duration::ZERO),
        };
        let what = h.job.describe();
        h.note(what);
        h.start_run();
        h
    }

    fn note(&mut self, what: String) {
        self.log
            .push(format!("{:>9.3}s {what}", self.now.as_secs_f64()));
    }

    /// The coordinator's state, its time set (as the driver sets it at each lock).
    fn coord(&mut self) -> &mut State<J> {
        self.state.now = self.now;
        &mut self.state
    }

    /// Routes what the coordinator queued: frames to the processes' links, store operations
    /// to the store, and drops the orders for local workers (there are none).
    fn route(&mut self) {
        let st = &mut self.state;
        st.pause = None;
        for (id, msg) in st.remote.take_outbox() {
            if let Some(p) = self.procs.iter_mut().find(|p| p.id == id) {
                p.inbox.push_back(msg);
            }
        }
        for p in &mut self.procs {
            while let Some((to, frame)) = p.sim.next_peer_frame() {
                let (from, to) = (p.id, ProcessId(to));
                let link = match self
                    .links
                    .iter_mut()
                    .position(|l| l.from == from && l.to == to)
                {
                    Some(k) => &mut self.links[k],
                    None => {
                        self.links.push(Link {
                            from,
                            to,
                            frames: VecDeque::new(),
                        });
                        self.links.last_mut().expect("pushed")
                    }
                };
                link.frames.push_back(frame);
            }
        }
        let ops = std::mem::take(&mut st.store_ops);
        let (phase, faults) = (st.phase, self.tally.faults);
        for order in st.orders.drain(..) {
            if let super::links::Order::Reply(r, result) = order {
                self.replies.1.insert(r.0);
                // A cut asked while nothing went wrong that is still open phases later, and
                // is given up only because the job ended, never completed: a cut that
                // waits for an answer nobody will send.
                if let (Err(Error::Ended { .. }), Some(&(at, f))) =
                    (&result, self.asked.get(r.0 as usize))
                {
                    let from = at.max(self.written_in);
                    if f == faults && phase >= from + STUCK_CUT_PHASES && self.stuck_cut.is_none() {
                        self.stuck_cut = Some(format!(
                            "snapshot request {} asked in phase {at} was still open in phase \
                             {phase}, with no fault since, and was answered \"ended\"",
                            r.0
                        ));
                    }
                }
            }
        }
        for op in ops {
            if let (true, StoreOp::Write { cut, .. }) = (self.trace, &op) {
                let parts: Vec<String> = cut
                    .parts
                    .iter()
                    .chain(&cut.kept)
                    .map(|(c, p)| match p {
                        super::snapshot::Part::New(b) => {
                            format!("{c}:{:?}", &b[..b.len().min(4)])
                        }
                        super::snapshot::Part::Reuse(r) => format!("{c}:{}", r.key),
                    })
                    .collect();
                let phase = cut.header.manifest.phase;
                self.note(format!("a cut of phase {phase} is written: {parts:?}"));
            }
            self.ops.push(op);
        }
    }

    /// A new run starts (submitted, or resumed): as `launch` starts it.
    fn start_run(&mut self) {
        self.coord().watch_start();
        self.coord().settle();
        self.route();
    }

    fn start_process(&mut self) {
        let threads = 1 + self.rng.below(2) as u32;
        // Half the processes can open the store: they write their parts and read those placed
        // on them; the others send and get bytes.
        let name = format!("process {}", self.next_proc);
        self.next_proc += 1;
        let node = format!("node {}", self.next_proc % 2);
        let id = self.coord().join_remote(name.clone(), threads, &node);
        let opens = self.rng.below(2) == 0;
        let listens = self.rng.below(4) != 0;
        self.add_process(name, id, threads, opens, listens);
    }

    /// Process `name`, joined as `id`, with `threads` threads; it opens the store if `opens`,
    /// and takes halos from its peers if `listens`.
    fn add_process(
        &mut self,
        name: String,
        id: ProcessId,
        threads: u32,
        opens: bool,
        listens: bool,
    ) {
        let now = self.base + self.now;
        let store = opens.then(|| (self.store.clone(), Arc::clone(&self.rt)));
        let mut sim = SimProcess::new(threads as usize, (HEARTBEAT, LEASE), store, now);
        // Most processes take halos from their peers; the others get them relayed.
        if listens {
            sim.listen();
        }
        let reads = if opens { ", opens the store" } else { "" };
        self.note(format!(
            "{name} joins as {id} with {threads} threads{reads}"
        ));
        self.procs.push(Proc {
            id,
            sim,
            inbox: VecDeque::new(),
            frozen_until: None,
            heard: self.now,
            beat: self.now,
        });
        self.route();
    }

    /// Process `i`'s connection ends (killed, frozen past its lease, done, refused): the
    /// coordinator drops it, as its socket task does when the connection ends.
    fn close(&mut self, i: usize, why: &str) {
        let p = self.procs.remove(i);
        let phase = self.state.phase;
        self.note(format!("{} closes in phase {phase}: {why}", p.id));
        // Its peer links break: the other ends hear of it (a reset, or their lease on it).
        let gone = p.id;
        let ends: Vec<ProcessId> = self
            .links
            .iter()
            .filter_map(|l| {
                if l.from == gone {
                    Some(l.to)
                } else if l.to == gone {
                    Some(l.from)
                } else {
                    None
                }
            })
            .collect();
        self.links.retain(|l| l.from != gone && l.to != gone);
        for end in ends {
            if let Some(q) = self.procs.iter_mut().find(|q| q.id == end) {
                q.sim.peer_down(gone.0);
            }
        }
        self.coord().drop_conn(p.id);
        self.route();
    }

    fn live(&self, i: usize) -> bool {
        self.procs[i].frozen_until.is_none_or(|t| t <= self.now)
    }

    /// A history that a test writes step by step: `job`, no process, no fault unless the test
    /// makes one.
    fn scripted(job: J) -> History<J> {
        History::build(job, 2, u64::MAX, None, Rng(0), runtime())
    }

    /// A process of `threads` threads joins (scripted); its index.
    fn join(&mut self, threads: u32) -> usize {
        let name = format!("process {}", self.next_proc);
        self.next_proc += 1;
        let node = format!("node {}", self.next_proc % 2);
        let id = self.coord().join_remote(name.clone(), threads, &node);
        self.add_process(name, id, threads, false, true);
        self.procs.len() - 1
    }

    /// One round in a fixed order: every process takes what came to it and sends what it
    /// has, every busy thread runs, (if `settle`) its background work ends, and every peer
    /// frame arrives. Whether anything happened.
    fn round(&mut self, settle: bool) -> bool {
        let mut moved = false;
        for i in 0..self.procs.len() {
            if !self.procs[i].inbox.is_empty() || self.procs[i].sim.has_sent() {
                self.deliver_all(i);
                self.send_all(i);
                moved = true;
            }
            for t in self.procs[i].sim.busy_threads() {
                self.procs[i].sim.turn(t);
                moved = true;
            }
            while settle && self.procs[i].sim.background() > 0 {
                self.procs[i].sim.settle(0);
                moved = true;
            }
        }
        moved | self.deliver_peers()
    }

    /// Every frame on its way between processes arrives; whether there was one.
    fn deliver_peers(&mut self) -> bool {
        self.route();
        let mut moved = false;
        for k in 0..self.links.len() {
            while !self.links[k].frames.is_empty() {
                self.deliver_peer(k);
                self.route();
                moved = true;
            }
        }
        moved
    }

    /// Process `i` takes every message on its way to it.
    fn deliver_all(&mut self, i: usize) {
        while let Some(msg) = self.procs[i].inbox.pop_front() {
            let kind = |h: &crate::wire::frame::Halo| match h {
                crate::wire::frame::Halo::Kept => "kept",
                crate::wire::frame::Halo::KeptAt(_) => "kept at a peer",
                crate::wire::frame::Halo::Sent(_) => "sent",
                crate::wire::frame::Halo::Gathered => "gathered",
            };
            let what = match &msg {
                ToWorker::Begin { chunk, halos } => {
                    let from: Vec<String> = halos
                        .iter()
                        .map(|(f, h)| format!("{f}:{}", kind(h)))
                        .collect();
                    format!("Begin {chunk} [{}]", from.join(" "))
                }
                other => brief(other),
            };
            let line = format!("to {}: {what}", self.procs[i].id);
            self.note(line);
            let now = self.base + self.now;
            self.procs[i].sim.receive(now, msg);
        }
    }

    /// The coordinator takes every message process `i` sent.
    fn send_all(&mut self, i: usize) {
        while let Some(msg) = self.procs[i].sim.next_sent() {
            let id = self.procs[i].id;
            self.note(format!("from {id}: {}", brief(&msg)));
            if let Err(e) = self.coord().on_remote(id, msg) {
                panic!("{id} was refused: {e}");
            }
            self.route();
        }
    }

    /// Runs every action that is not a fault, in a fixed order, until none is left or the
    /// run's outcome is out.
    fn drain(&mut self) {
        loop {
            self.route();
            if self.state.outcome_ready() {
                return;
            }
            let mut moved = self.round(true);
            if let Some(op) = self.ops.pop() {
                self.store_op(op);
                moved = true;
            }
            if !moved {
                return;
            }
        }
    }

    /// What can happen next, with weights.
    fn actions(&mut self, out: &mut Vec<(Action, u64)>) {
        out.clear();
        for i in 0..self.procs.len() {
            if !self.live(i) {
                continue;
            }
            let p = &self.procs[i];
            if !p.inbox.is_empty() && p.sim.ended().is_none() {
                out.push((Action::ToProc(i), 10));
            }
            if p.sim.has_sent() {
                out.push((Action::ToCoord(i), 10));
            }
            for t in p.sim.busy_threads() {
                out.push((Action::Turn(i, t), 6));
            }
            for k in 0..p.sim.background() {
                out.push((Action::Settle(i, k), 4));
            }
        }
        for (k, l) in self.links.iter().enumerate() {
            let live = |id: ProcessId| {
                self.procs
                    .iter()
                    .position(|p| p.id == id)
                    .is_some_and(|i| self.live(i))
            };
            if !l.frames.is_empty() && live(l.to) {
                out.push((Action::Peer(k), 10));
            }
        }
        for k in 0..self.ops.len() {
            out.push((Action::Store(k), 4));
        }
        out.push((Action::Tick, 2));
        out.push((Action::Event, 1));
    }

    fn step(&mut self, buf: &mut Vec<(Action, u64)>) {
        self.tally.steps += 1;
        if self.tally.faults == 0 && self.tally.steps == self.forced_fault {
            self.fault();
        }
        self.actions(buf);
        let total: u64 = buf.iter().map(|(_, w)| w).sum();
        let mut pick = self.rng.below(total);
        let action = buf
            .iter()
            .find(|(_, w)| {
                if pick < *w {
                    true
                } else {
                    pick -= w;
                    false
                }
            })
            .map(|(a, _)| *a)
            .unwrap_or(Action::Tick);
        match action {
            Action::ToProc(i) => {
                let msg = self.procs[i].inbox.pop_front().expect("a message");
                let granted =
                    |m: &ToWorker| matches!(m, ToWorker::Run { then, .. } if !then.is_empty());
                let own = |m: &ToWorker| match m {
                    ToWorker::Gathered { pieces } => {
                        pieces.iter().filter(|(_, b)| b.is_none()).count() as u64
                    }
                    _ => 0,
                };
                let (grants, own_pieces) = match &msg {
                    ToWorker::Batch(b) => (
                        b.iter().filter(|m| granted(m)).count() as u64,
                        b.iter().map(own).sum(),
                    ),
                    m => (u64::from(granted(m)), own(m)),
                };
                self.tally.grants += grants;
                self.tally.own_pieces += own_pieces;
                if self.trace && !matches!(msg, ToWorker::Heartbeat) {
                    let line = format!("to {}: {}", self.procs[i].id, brief(&msg));
                    self.note(line);
                }
                let now = self.base + self.now;
                self.procs[i].sim.receive(now, msg);
            }
            Action::ToCoord(i) => {
                let msg = self.procs[i].sim.next_sent().expect("a message");
                let returned = |m: &ToCoordinator| matches!(m, ToCoordinator::Returned { .. });
                self.tally.returned += match &msg {
                    ToCoordinator::Batch(b) => b.iter().filter(|m| returned(m)).count() as u64,
                    m => u64::from(returned(m)),
                };
                let id = self.procs[i].id;
                if let (ToCoordinator::Replayed { chunk, .. }, Some(r)) =
                    (&msg, self.state.recovery.as_ref())
                {
                    // A replayed partition, held where it was replayed, is the plain loop's.
                    let (phase, done) = r.of(*chunk);
                    let state = self.procs[i].sim.held_state(*chunk).unwrap_or_default();
                    let checked = if done {
                        self.job.check_copy(*chunk, phase, &state)
                    } else {
                        self.job.check_begun(*chunk, phase, &state)
                    };
                    if let Err(e) = checked {
                        self.note(format!("a replay is wrong: {e}"));
                        self.refused
                            .get_or_insert_with(|| format!("a replay is wrong: {e}"));
                    }
                }
                if self.trace && !matches!(msg, ToCoordinator::Heartbeat { .. }) {
                    self.note(format!("from {id}: {}", brief(&msg)));
                }
                self.procs[i].heard = self.now;
                if let Err(e) = self.coord().on_remote(id, msg) {
                    let why = format!("the coordinator refused it: {e}");
                    // Every simulated process keeps the protocol: a refusal is the
                    // coordinator's mistake (or the process's machine's).
                    self.refused.get_or_insert_with(|| format!("{id}: {why}"));
                    self.close(i, &why);
                }
            }
            Action::Peer(k) => self.deliver_peer(k),
            Action::Turn(i, t) => self.procs[i].sim.turn(t),
            Action::Settle(i, k) => self.procs[i].sim.settle(k),
            Action::Store(k) => {
                let op = self.ops.swap_remove(k);
                self.store_op(op);
            }
            Action::Tick => self.tick(),
            Action::Event => self.event(),
        }
        self.route();
        // A process that ended and said all it had to say closes its connection.
        let mut i = 0;
        while i < self.procs.len() {
            let p = &self.procs[i];
            if p.sim.ended().is_some() && !p.sim.has_sent() {
                let why = format!("it ended with {:?}", p.sim.ended());
                self.close(i, &why);
            } else {
                i += 1;
            }
        }
    }

    /// The next frame on peer link `k` arrives: the first, or half the time, if the first
    /// are buddy copies, the first frame behind them (a real link's writer lets short
    /// messages pass the copies of 64 KiB or more it has not started writing,
    /// `worker/peers.rs`; here any copy, which covers those).
    fn deliver_peer(&mut self, k: usize) {
        let frames = &self.links[k].frames;
        let long =
            |f: &PeerFrame| matches!(f, PeerFrame::To(crate::wire::peer::ToPeer::Copy { .. }));
        let at = match frames.iter().position(|f| !long(f)) {
            Some(at) if at > 0 && self.rng.below(2) == 0 => at,
            _ => 0,
        };
        let Some(frame) = self.links[k].frames.remove(at) else {
            return;
        };
        let (from, to) = (self.links[k].from, self.links[k].to);
        match &frame {
            PeerFrame::To(crate::wire::peer::ToPeer::Halo { .. }) => self.tally.pushed += 1,
            PeerFrame::From(crate::wire::peer::FromPeer::Ack { kept: true, .. }) => {
                self.tally.kept_at_peers += 1;
            }
            _ => {}
        }
        if self.trace {
            self.note(format!("peer {from} -> {to}: {}", brief(&frame)));
        }
        if let Some(p) = self.procs.iter_mut().find(|p| p.id == to) {
            p.sim.peer_frame(from.0, frame);
        }
    }

    /// The peer link between two processes breaks, both ways: what was on its way is lost
    /// and both ends hear of it.
    fn break_link(&mut self) {
        if self.links.is_empty() {
            return;
        }
        let k = self.rng.below(self.links.len() as u64) as usize;
        let (a, b) = (self.links[k].from, self.links[k].to);
        self.note(format!("the peer link between {a} and {b} breaks"));
        self.tally.links_broken += 1;
        self.links
            .retain(|l| !((l.from == a && l.to == b) || (l.from == b && l.to == a)));
        for (end, other) in [(a, b), (b, a)] {
            if let Some(p) = self.procs.iter_mut().find(|p| p.id == end) {
                p.sim.peer_down(other.0);
            }
        }
    }

    /// Time passes: heartbeats both ways, leases.
    fn tick(&mut self) {
        self.now += Duration::from_millis(1 + self.rng.below(30));
        let now = self.base + self.now;
        let mut i = 0;
        while i < self.procs.len() {
            if self.live(i) {
                self.procs[i].frozen_until = None;
                self.procs[i].sim.tick(now);
            }
            let p = &mut self.procs[i];
            if self.now.saturating_sub(p.beat) >= HEARTBEAT {
                p.beat = self.now;
                p.inbox.push_back(ToWorker::Heartbeat);
            }
            if self.now.saturating_sub(p.heard) > LEASE {
                self.close(i, "its lease ran out");
                continue;
            }
            i += 1;
        }
        // What the coordinator does with time (a rollback's waits, progress).
        self.coord().settle();
    }

    /// A fault or a request, drawn.
    fn event(&mut self) {
        match self.rng.below(10) {
            0 | 1 if self.procs.len() < 4 => self.start_process(),
            2 if self.tally.resumes < 2 => {
                let r = self.reply_to();
                self.note("a suspend is asked for".into());
                self.coord().request_suspend(Some(r));
            }
            3 | 4 => {
                let r = self.reply_to();
                self.note("a snapshot is asked for".into());
                self.coord().request_snapshot(r);
                self.tally.snapshots += 1;
            }
            5 if !self.procs.is_empty() => {
                let i = self.rng.below(self.procs.len() as u64) as usize;
                let id = self.procs[i].id;
                self.note(format!("{id} is retired"));
                self.coord().retire_conn(id);
            }
            _ => self.fault(),
        }
    }

    /// A fault, drawn.
    fn fault(&mut self) {
        if self.tally.faults >= FAULT_BUDGET {
            return;
        }
        self.tally.faults += 1;
        match self.rng.below(6) {
            5 if !self.links.is_empty() => self.break_link(),
            // The coordinator's process dies: a new one resumes from the store's latest
            // committed snapshot, or submits the job again if there is none.
            4 if self.tally.crashes < 2 => {
                self.tally.crashes += 1;
                self.note("the coordinator is killed".into());
                self.crashed = true;
            }
            0 | 1 if !self.procs.is_empty() => {
                let i = self.rng.below(self.procs.len() as u64) as usize;
                self.tally.kills += 1;
                self.close(i, "killed");
            }
            2 if !self.procs.is_empty() => {
                let i = self.rng.below(self.procs.len() as u64) as usize;
                self.tally.freezes += 1;
                let until = self.now + LEASE * 2;
                self.note(format!("{} freezes", self.procs[i].id));
                self.procs[i].frozen_until = Some(until);
            }
            _ => {
                self.tally.store_failures += 1;
                self.note("the store's next operation fails".into());
                self.fail_store += 1;
            }
        }
    }

    /// Store operation `op` ends (or fails, if a failure was injected).
    fn store_op(&mut self, op: StoreOp) {
        let fail = self.fail_store > 0;
        if fail {
            self.fail_store -= 1;
        }
        let failure = || Error::Internal("a simulated store failure".into());
        let cfg = &self.config.snapshots;
        match op {
            StoreOp::Write { cut, after } => {
                // A failed write fails before its commit (nothing written), or is torn (its
                // parts written, its manifest not): which one, from the step's parity, so
                // that the choice draws nothing from the scheduler's randomness.
                let torn = fail && self.tally.steps % 2 == 0;
                let w = if fail && !torn {
                    let cut = *cut;
                    CutWritten {
                        written: Err(failure()),
                        manifest: cut.header.manifest,
                        bytes: 0,
                        started: cut.header.started,
                        suspend: cut.suspend,
                        replies: cut.replies,
                    }
                } else {
                    if torn {
                        self.note("the commit is torn".into());
                        self.tearing
                            .tear
                            .store(true, std::sync::atomic::Ordering::SeqCst);
                    }
                    self.rt.block_on(write_cut(&self.config, *cut, after))
                };
                self.note(format!("a snapshot write ends: {:?}", w.written));
                self.written_in = self.state.phase;
                let took = self.now.saturating_sub(w.started);
                let (written, manifest, bytes) = (w.written, w.manifest, w.bytes);
                self.coord().snapshot_written(
                    written,
                    &manifest,
                    (took, bytes),
                    (w.suspend, w.replies),
                    None,
                );
            }
            StoreOp::ReadManifest { epoch, attempt } => {
                let read = if fail {
                    Err(failure())
                } else {
                    self.rt
                        .block_on(read_back_manifest::<J>(cfg, epoch))
                        .and_then(restore_read::<J>)
                };
                self.note(format!(
                    "the manifest of epoch {epoch} is read back: {}",
                    if read.is_ok() { "ok" } else { "failed" }
                ));
                self.coord().rolled_back(read, attempt);
            }
            StoreOp::ReadParts { id, need, attempt } => {
                let read = if fail {
                    Err(failure())
                } else {
                    self.rt.block_on(read_back_parts(cfg, &id, need))
                };
                self.note(format!("parts of {id} are read back"));
                self.coord().parts_read(attempt, read);
            }
        }
    }

    /// A new snapshot request's number.
    fn reply_to(&mut self) -> super::snapshot::Reply {
        self.asked.push((self.state.phase, self.tally.faults));
        self.replies.0 += 1;
        super::snapshot::Reply(self.replies.0 - 1)
    }

    /// Progress, to tell a stuck history: (phase, iterations done, resumes).
    fn moved(&mut self) -> bool {
        let now = (
            self.state.phase,
            self.state.core.progress().0,
            self.tally.resumes,
        );
        if now != self.progress.0 {
            self.progress = (now, self.now);
        }
        self.now.saturating_sub(self.progress.1) < STUCK
    }

    /// A new coordinator resumes the job from the store's latest snapshot.
    fn resume(&mut self) -> Result<(), String> {
        self.tally.resumes += 1;
        let procs = std::mem::take(&mut self.procs);
        // Their links go with them (see `restart`).
        self.links.clear();
        let job_id = self.config.snapshots.job_id::<J>();
        let latest = self.rt.block_on(self.store.read_latest(&job_id));
        let (id, manifest, parts, _) = latest.map_err(|e| format!("no snapshot to resume: {e}"))?;
        let restored = restore::<J>(manifest, parts)
            .map_err(|e| format!("snapshot {id} does not restore: {e}"))?;
        let manifest = restored.manifest;
        self.ops.clear();
        self.state = fresh_state(
            &self.config,
            restored.core,
            restored.job,
            manifest.phase,
            manifest.iterations_before,
            Snapshots::restored(&manifest),
        );
        self.note(format!(
            "a new coordinator resumes from {id} (phase {}); {} processes of the old one are gone",
            manifest.phase,
            procs.len()
        ));
        self.start_run();
        for _ in 0..1 + self.rng.below(3) {
            self.start_process();
        }
        Ok(())
    }

    /// The store's committed epochs.
    fn committed(&self) -> Result<Vec<u64>, String> {
        let job_id = self.config.snapshots.job_id::<J>();
        self.rt
            .block_on(self.store.epochs(&job_id))
            .map_err(|e| format!("the store's epochs: {e}"))
    }

    /// A new coordinator runs the job from its start (the user submitted it again).
    fn restart(&mut self) -> Result<(), String> {
        self.tally.resumes += 1;
        self.procs.clear();
        // Their links go with them (a new run has another session: a real process of the
        // old one would be refused by the new one's peers).
        self.links.clear();
        self.ops.clear();
        let job = self.job.clone();
        let (core, _) = first_phase(&job, &self.config).map_err(|e| format!("{e}"))?;
        self.state = fresh_state(&self.config, core, job, 0, 0, Snapshots::default());
        self.start_run();
        for _ in 0..1 + self.rng.below(3) {
            self.start_process();
        }
        Ok(())
    }

    /// Runs the history to its end; the job's value, or what went wrong.
    fn run(&mut self) -> Result<Vec<u64>, String> {
        let mut buf = Vec::new();
        loop {
            if std::mem::take(&mut self.crashed) {
                self.tally.rollbacks += self.state.rollbacks.len() as u64;
                self.tally.recoveries += self.state.recoveries.len() as u64;
                self.tally.abandoned += self.state.recoveries_abandoned;
                // Its callers died with it: their requests go unanswered.
                self.replies.1.extend(0..self.replies.0);
                // A write it had started may still reach the store.
                for op in std::mem::take(&mut self.ops) {
                    if let (StoreOp::Write { cut, after }, true) = (op, self.rng.below(2) == 0) {
                        let w = self.rt.block_on(write_cut(&self.config, *cut, after));
                        self.note(format!("a dead coordinator's write ends: {:?}", w.written));
                    }
                }
                if self.committed()?.is_empty() {
                    self.restart()?;
                } else {
                    self.resume()?;
                }
            }
            if self.state.outcome_ready() {
                let result = self.state.result.take().expect("an ended run's result");
                self.tally.rollbacks += self.state.rollbacks.len() as u64;
                self.tally.recoveries += self.state.recoveries.len() as u64;
                self.tally.abandoned += self.state.recoveries_abandoned;
                match result {
                    Ok(Outcome::Finished(f)) => return Ok(f.into_value()),
                    Ok(Outcome::Suspended(id)) => {
                        self.note(format!("suspended to {id}"));
                        self.resume()?;
                    }
                    // Partitions lost before any snapshot committed: the documented typed
                    // end; the user submits the job again.
                    Err(Error::PartitionsLost { .. }) if self.committed()?.is_empty() => {
                        self.note("partitions lost with no snapshot: submitted again".into());
                        self.restart()?;
                    }
                    // A snapshot to roll back to could not be read (a store failure was
                    // injected): the user resumes from the store.
                    Err(Error::RollbackFailed { .. }) if self.tally.store_failures > 0 => {
                        self.note("the rollback's read failed: resumed by the user".into());
                        self.resume()?;
                    }
                    Err(e) => return Err(format!("the job ended with {e:?}")),
                }
            }
            if self.procs.iter().all(|p| p.sim.ended().is_some()) {
                self.start_process();
            }
            self.step(&mut buf);
            self.check_copies()?;
            if !self.moved() {
                return Err(format!("no progress for {STUCK:?}"));
            }
            if self.tally.steps > MAX_STEPS {
                return Err(format!("no end after {MAX_STEPS} steps"));
            }
        }
    }

    /// Every buddy copy the coordinator records is in its buddy's memory, of that phase or
    /// a newer one, and is the partition a plain loop has there; every process's halo log
    /// is what a plain loop's partitions export, of the phases asked. Checked when the
    /// coordinator recorded new copies, and at the end.
    fn check_copies(&mut self) -> Result<(), String> {
        let kept = self.state.remote.buddies.report().kept;
        if kept == self.tally.copies {
            return Ok(());
        }
        self.tally.copies = kept;
        let chunks = self.state.core.plan().len();
        for p in self.procs.iter().filter(|p| p.sim.ended().is_none()) {
            let (log, bytes, from) = p.sim.log();
            let sum: u64 = log
                .iter()
                .flat_map(|(_, _, h)| h.iter().map(|(_, b)| b.len() as u64))
                .sum();
            if sum != bytes || log.iter().any(|&(phase, ..)| Some(phase) < from) {
                return Err(format!(
                    "{}'s halo log counts {bytes} bytes (it has {sum}), or keeps phases before {from:?}",
                    p.id
                ));
            }
            for (phase, chunk, halos) in log {
                let rows = self.state.core.plan().range(*chunk);
                self.job.check_log(*chunk, rows, *phase, halos)?;
                self.tally.logs_checked += 1;
            }
        }
        for chunk in 0..chunks {
            let Some((phase, buddy)) = self.state.remote.buddies.copy_of(chunk) else {
                continue;
            };
            // A buddy killed, whose loss the coordinator has not noticed yet, has nothing.
            let Some(p) = self
                .procs
                .iter()
                .find(|p| p.id == buddy && p.sim.ended().is_none())
            else {
                continue;
            };
            let Some((had, bytes)) = p.sim.copy_of(chunk) else {
                return Err(format!(
                    "the coordinator records a copy of chunk {chunk} of phase {phase} in \
                     {buddy}, which keeps none"
                ));
            };
            if had < phase {
                return Err(format!(
                    "the coordinator records a copy of chunk {chunk} of phase {phase} in \
                     {buddy}, which keeps one of phase {had}"
                ));
            }
            self.job.check_copy(chunk, had, &bytes)?;
            self.tally.copies_checked += 1;
        }
        Ok(())
    }

    /// The checks after the end: every request answered, every committed snapshot
    /// restorable.
    fn check_end(&mut self) -> Result<(), String> {
        self.tally.copies = u64::MAX;
        self.check_copies()?;
        if let Some(k) = (0..self.replies.0).find(|k| !self.replies.1.contains(k)) {
            return Err(format!("snapshot request {k} was never answered"));
        }
        if let Some(stuck) = self.stuck_cut.take() {
            return Err(stuck);
        }
        if let Some(refused) = self.refused.take() {
            return Err(format!("an honest process was refused: {refused}"));
        }
        if let Some(p) = self.procs.iter().find(|p| !p.sim.hung_up.is_empty()) {
            return Err(format!(
                "{} ended the links of honest peers {:?}",
                p.id, p.sim.hung_up
            ));
        }
        let job_id = self.config.snapshots.job_id::<J>();
        for epoch in self.committed()? {
            let id = SnapshotId::new(job_id.clone(), epoch);
            let (manifest, parts) = self
                .rt
                .block_on(self.store.read(&id))
                .map_err(|e| format!("committed snapshot {id} does not read back: {e}"))?;
            restore::<J>(manifest, parts)
                .map_err(|e| format!("committed snapshot {id} does not restore: {e}"))?;
        }
        Ok(())
    }
}

/// A message, short: its `Debug` form cut at 100 characters.
fn brief(msg: &impl std::fmt::Debug) -> String {
    let mut s = format!("{msg:?}");
    if s.len() > 700 {
        let mut cut = 700;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
}

/// A coordinator's state for a run of `job` from `phase`, as `launch` makes it.
fn fresh_state<J: crate::Job>(
    config: &Arc<Config>,
    core: super::JobCore<J>,
    job: J,
    phase: u64,
    iterations_before: u64,
    snap: Snapshots,
) -> State<J> {
    let shape = super::job_run::shape_of(&job, core.plan().len(), phase)
        .expect("the simulated job's neighbours are a graph");
    State::new(
        (Arc::clone(config), Arc::default()),
        (core, shape),
        job,
        phase,
        iterations_before,
        snap,
        0,
    )
}

/// Runs the history of `seed`: its tally, or what went wrong with its log.
pub(crate) fn history(seed: u64, rt: &Arc<tokio::runtime::Runtime>) -> Result<Tally, String> {
    history_of::<SimJob>(seed, rt)
}

/// Runs the history of `seed` with a job of type `J`.
fn history_of<J: Simulated>(seed: u64, rt: &Arc<tokio::runtime::Runtime>) -> Result<Tally, String> {
    // Every line the coordinator logs in this history names its seed, so that a reason
    // counted over thousands of histories (`MALLEABLE_SIM_LOG`) leads to one to replay.
    let _history = tracing::info_span!("history", seed).entered();
    let mut h = History::<J>::new(seed, Arc::clone(rt));
    let expected = h.job.expected();
    let outcome = h.run().and_then(|got| {
        if got != expected {
            let row = (0..got.len().min(expected.len())).find(|&i| got[i] != expected[i]);
            return Err(format!(
                "the value differs from the sequential loop's at row {row:?}"
            ));
        }
        h.check_end()
    });
    if outcome.is_ok() && h.trace {
        // `MALLEABLE_SIM_TRACE`: a history that ended well is shown too.
        println!("history {seed} of {}:\n{}", J::NAME, h.log.join("\n"));
    }
    outcome.map(|()| h.tally).map_err(|e| {
        format!(
            "history {seed} of {} failed: {e}\n{}\nreplay: {}={seed} cargo test \
             --all-features --lib executor::sim -- --nocapture",
            J::NAME,
            h.log.join("\n"),
            if J::NAME == <SimJob as crate::Job>::NAME {
                "MALLEABLE_SIM_SEED"
            } else {
                "MALLEABLE_SIM_MESH_SEED"
            }
        )
    })
}

/// A current-thread runtime for the store's futures (an in-memory store: nothing waits).
pub(crate) fn runtime() -> Arc<tokio::runtime::Runtime> {
    Arc::new(
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a current-thread runtime"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn var(name: &str) -> Option<u64> {
        std::env::var(name).ok().and_then(|s| s.parse().ok())
    }

    /// Histories that found a bug, replayed: each ends wrong with its fix reverted, under
    /// this simulator. (A change to what the scheduler draws gives every seed another
    /// history: the seeds below are then found again, each by running the simulation with
    /// its fix reverted.)
    ///
    /// - 4008 (found as 707): a snapshot asked for, then a suspend, which abandoned the open
    ///   cut while a process still owed it held partitions; the next cut, after the barrier,
    ///   asked the process for them again and took the abandoned cut's answers (the
    ///   partitions before their new phase began) as its own: the suspend's snapshot held
    ///   bands a phase behind, and the resumed job's value was wrong (answers to
    ///   `CaptureHeld` are matched to the marker that asked now).
    /// - 654 (found as 177): a suspend's cut wanted a partition on its way back from a
    ///   retired process, whose phase had begun at the barrier while it travelled (its halos
    ///   waited for it); the cut took the bytes that left the process, the partition before
    ///   its phase began, and the resumed job's band did nothing in that phase.
    /// - (found as 1751, a history this simulator no longer draws; 15 934 histories with the
    ///   fix reverted did not meet it again): a process ran two partitions in the first
    ///   phase and kept their halos for its neighbours, was retired (both came back) and
    ///   killed before its neighbours ended; the neighbours ran again elsewhere, and the
    ///   barrier named the dead process's kept halos to them: the job ended with a refused
    ///   kept halo, though the partitions that exported them were in the coordinator's
    ///   hands (they are exported again from there now).
    /// - 2014778: a process retired while a rollback read its snapshot back was asked for
    ///   its partitions; the rollback reset the ledger, and the old run's partition, when it
    ///   came, replaced the restored one: the band ran a phase from its state two phases on.
    /// - 2011863: a process that writes its parts answered a running chunk's capture after
    ///   the chunk's end (the part is written in the background) and after a rollback; the
    ///   next cut, which waited for the same chunk on the same slot, took that part of the
    ///   old run, a phase ahead (answers to `Capture` are matched to the marker that asked
    ///   now).
    /// - 9012039: a rollback started again while a process still answered the placements
    ///   of the attempt before; its late `Exported` was refused as a protocol violation, the
    ///   process dropped, and the placements it was to read from the store came back as the
    ///   ledger's empty placeholders: the job ended with a chunk state that did not decode
    ///   (late answers to an earlier attempt's placements are dropped now).
    /// - 9029903: the same late `Exported`, for a partition the new attempt placed on the
    ///   same process again, was taken as the new placement's answer: it named a halo the
    ///   process had kept before it forgot its partitions, and the job ended with a refused
    ///   kept halo (answers are matched to the placement that asked them).
    /// - 11019589: a rollback started again after the first had placed a partition on a
    ///   process; the process forgot that placement at `Forget` and never answered it, and the
    ///   one answer it gave (to the second placement) was matched, first in first out, to the
    ///   first and dropped as late: the coordinator waited for halos nobody would send, and the
    ///   job made no progress (placements carry their number, and `Exported` quotes it).
    /// - 3525 and 494 (found while slots of worker processes were first granted the
    ///   partitions queued after their chunk): a slot was interrupted with a granted
    ///   partition unstarted, which it gave back, and the ledger at once gave that partition
    ///   to another process's slot. In 3525 an open cut waited for it from the first slot
    ///   and, finding no state for it any more, took it as never started: the snapshot
    ///   restored the partition from scratch in a later phase, and the resumed value was
    ///   wrong (the bytes on their way are its part now). In 494 the first slot was the
    ///   retiring process's last: it got `End` before the ledger asked it for the partition,
    ///   and the job waited for it forever (a released slot's process ends only once every
    ///   command of that moment is carried out).
    /// - 587 (found when halos were first pushed between processes, protocol 20): a
    ///   partition that ran from a state the coordinator also had accepted a pushed halo,
    ///   and its process was killed. The partition went on elsewhere; the coordinator
    ///   dropped the exports of the halo's sender to export them again, which only a
    ///   partition in its own hands can: the sender was in another process, and the phase
    ///   began without its halos (a wrong value). Pushes are accepted now only by a
    ///   partition whose only copy is in the process (so losing it rolls the job back), and
    ///   a lost export that cannot be made again rolls the job back.
    /// - 3466 (found when the simulation began to count a refused honest process as a
    ///   failure, as one of 39 seeds of 8 290; also seen with real processes in the
    ///   examples' processes mode): a retiring process that writes its parts handed its
    ///   chunk back while the part of the chunk's capture was still being written; the part's
    ///   reference came after the slot was released and was refused ("not a live slot"), and
    ///   the process was dropped with the partitions it still held, rolling the job back (a
    ///   late capture from a released slot is dropped now).
    /// - 989, 37 and 1819 (found when lost partitions were first replayed from buddy
    ///   copies): a process acked a pushed halo and was lost before its sender's `Done`
    ///   came, so the halo was reported kept where nothing is any more (refilled from the
    ///   sender's log now); the co-lost partitions' pieces of the copies' own phase were
    ///   missing from the replay (exported from the copies now); a late answer of an older
    ///   copy round recorded a copy its buddy had used up (stale below the replayed phase
    ///   now).
    /// - 108166: a replayed partition the ledger had handed to a slot of the buddy itself was
    ///   asked back of it (it runs there, held, now), and a recovery given up left that
    ///   answer unexpected: the buddy was dropped (such late answers are dropped now).
    /// - 529107 (found in 90 s of new seeds): a peer acknowledged a pushed halo, then was
    ///   lost holding no partition; the sender's `Done`, which came after, named the halo
    ///   kept there, and the barrier ended the job ("sent a kept halo that is refused
    ///   here"). The job rolls back now, as for such halos reported before the loss.
    /// - 1266886 (found in 600 s of new seeds, one of 479 118): a snapshot asked while the
    ///   one before it was being written, and the write took longer than three phases; the
    ///   job ended in the phase the write ended, before the request's cut could start, and
    ///   answered it "ended". No cut starts while one is written, so the simulation counts a
    ///   request's phases from the end of that write (it counted them from its asking and
    ///   took it for a stuck cut).
    #[test]
    fn replayed_histories_end_exact() {
        let rt = runtime();
        for seed in [
            654, 2011863, 2014778, 4008, 9012039, 9029903, 11019589, 3525, 494, 587, 3466, 989, 37,
            1819, 108166, 529107, 1266886,
        ] {
            if let Err(e) = history(seed, &rt) {
                panic!("{e}");
            }
        }
    }

    /// Histories of exchanging tiles that found a bug, replayed (same caveat as above).
    ///
    /// - 1013043: a rollback placed every restored partition on one process; a process that
    ///   joined was given two of them, which were asked back from the first (`Surrender`),
    ///   and its slot was lost before they arrived. The ledger had handed its record of
    ///   where they were to that run, so they went pending with no state and ran from the
    ///   phase's start on another slot; the copy on its way then replaced the done one, and
    ///   the job ended with a refused kept halo (a run waiting for a partition now reports
    ///   where the partition is, as a run with bytes reports its bytes).
    /// - 1006888: faults came faster than any snapshot committed and the job was submitted
    ///   again 960 times without end; it checks that the job ends once the fault budget is
    ///   spent (`FAULT_BUDGET`).
    /// - 2356 (found when the simulation began to count a refused honest process as a
    ///   failure): the coordinator was killed and a new one numbered its processes from 0
    ///   again; frames still on the simulated peer links of the old processes reached new
    ///   processes of the same numbers, and one kept a halo for a partition it never held
    ///   (the simulation's network now drops the old processes' links with them, as a real
    ///   new run's session would refuse them).
    /// - 980 and 1550 (found when lost partitions were first replayed from buddy copies):
    ///   the buddy did not know the job's number of chunks (it had run nothing yet), and an
    ///   all-to-all replayed there addressed no one; a process asked for a copy it had
    ///   replaced by a newer round's dropped that one too.
    /// - 392: a partition taken into the coordinator's hands had its copy dropped, and a late
    ///   answer of a round asked before brought the record back (such answers are stale
    ///   now).
    /// - 1022: a recovery given up for a rollback left its partitions recorded with the
    ///   buddy, which was then retired and asked for partitions it never held (they are
    ///   recorded as lost with their process now).
    /// - 4105 (found when a link's short messages began to pass its buddy copies): a
    ///   process's round answered after a newer round had copied a partition to another
    ///   buddy, which was then lost; the late answer recorded the older copy again, which
    ///   its buddy had been told to drop (an answer older than a copy once recorded is
    ///   stale now).
    /// - 22368 (found in 90 s of histories): three rollbacks in a row; the second asked for
    ///   a part, started over, and restarted the run; its first read was answered during
    ///   the third rollback, whose attempt had the same number (each rollback numbered its
    ///   attempts from 0), and restarted it before its own read: five restored partitions
    ///   were placed on the processes with empty states, and a process failed the job
    ///   decoding one (attempts are numbered across the run now).
    /// - 756221 (found in 420 s of new seeds, one of 141 956): a worker process wrote a
    ///   running chunk's captured part in the background; the job rolled back, and a new
    ///   cut asked the same slot to capture the same chunk again; the second write ended
    ///   first, and the coordinator, which matches the answers of one slot and chunk first
    ///   in first out, dropped it as the old cut's and took the old run's part (of phase 1)
    ///   for the new cut of phase 0: the job resumed from it with a wrong value. A running
    ///   capture's write now holds back the messages about its chunk, as a held one's does.
    #[test]
    fn replayed_exchange_histories_end_exact() {
        let rt = runtime();
        for seed in [
            1013043, 1006888, 2356, 980, 1550, 392, 1022, 4105, 22368, 756221,
        ] {
            if let Err(e) = history_of::<mesh::SimMesh>(seed, &rt) {
                panic!("{e}");
            }
        }
    }

    /// Each history of `seeds`, `(seed, recoveries, none abandoned)`, ends exact with at
    /// least `recoveries` local recoveries, and, where asked, none abandoned.
    fn recovers<J: Simulated>(seeds: &[(u64, u64, bool)]) {
        let rt = runtime();
        for &(seed, recoveries, whole) in seeds {
            match history_of::<J>(seed, &rt) {
                Ok(t) => assert!(
                    t.recoveries >= recoveries && (!whole || t.abandoned == 0),
                    "history {seed}: {t:?}"
                ),
                Err(e) => panic!("{e}"),
            }
        }
    }

    /// Histories in which a partition the coordinator held after a restore, having ended
    /// the restored phase, exported its pieces at the first barrier without a record in
    /// the halo logs: a neighbour lost with copies of that phase was refused ("a partition's
    /// halo log since the copies is not whole", its log beginning a phase later) and the job
    /// rolled back. Those exports are the coordinator's log now, and each of these
    /// histories recovers locally (none did before).
    #[test]
    fn exports_of_restored_partitions_held_here_are_logged() {
        recovers::<SimJob>(&[230, 1465, 2518, 3280, 5050].map(|s| (s, 1, false)));
    }

    /// Histories of exchanges in which a partition the coordinator ran exported an
    /// allgather's piece, which went to the processes once for all (not in a `Begin`) and
    /// into no log: the replay of a lost partition that took it was refused for a sender
    /// missing ("would begin phase 2 with the pieces of [1, 2], not of [0, 1, 2]") and the
    /// job rolled back. The coordinator logs those pieces now, and each of these histories
    /// recovers locally (none did before). (926 and 6299 were among them until a running
    /// chunk's captured part began to hold back the messages about its chunk: their
    /// histories took another course, in which a partition lost has no copy, or a second
    /// loss during the replay rolls the job back, and both end exact.)
    #[test]
    fn allgather_pieces_of_partitions_run_here_are_logged() {
        recovers::<mesh::SimMesh>(&[311, 4418, 7591, 16186].map(|s| (s, 1, false)));
    }

    /// Histories in which a buddy no longer kept the copies the coordinator had recorded
    /// and a recovery named: rounds were asked at every barrier whatever the answers, the
    /// buddy took two newer copies before the coordinator heard of either and dropped the
    /// recorded one, and the owner was lost ("no copy of chunk 6 of phase 1 here (it has
    /// Some(3))"; each of these rolled back). A process has two rounds open at most now,
    /// and a buddy replays from the newest copies it keeps of every lost partition, saying
    /// which (`Replayed::copy_phase`): each recovers locally, none abandoned.
    #[test]
    fn a_buddy_replays_from_newer_copies_than_the_coordinator_knew_of() {
        recovers::<SimJob>(&[
            (9445, 1, true),
            (10243, 1, true),
            (16837, 1, true),
            (24445, 1, true),
            (25120, 1, true),
            (29881, 1, true),
            (35416, 2, true),
            (51607, 1, true),
        ]);
    }

    /// Histories of exchanges in which a late answer of an older copy round, stale since
    /// a recovery began (which used the newer copy up), told the buddy to drop every copy
    /// before the newer one's phase and one: the buddy dropped the copy the recovery was
    /// about to replay ("no copy of chunk 5 of phase 1 here (it has None)") and the job
    /// rolled back. A stale answer drops its own phase's copy and older ones only.
    ///
    /// And 325390 (found in 90 s of new seeds): an answer of a round that had copied a
    /// lost partition, newer than its recorded copy, came while the replay ran; it was
    /// recorded, and the buddy, which replayed from that copy and dropped it, kept none.
    /// Answers for partitions a replay is making again are taken as neither now.
    #[test]
    fn a_stale_copy_answer_does_not_drop_the_copy_a_recovery_replays() {
        // (325390 has other losses that abandon their recoveries; what it checks is its
        // end, exact.)
        recovers::<mesh::SimMesh>(&[(16405, 1, true), (19120, 1, true), (325390, 1, false)]);
    }

    /// Histories whose losses recover locally more often than they did, each with the local
    /// recoveries it makes now (one fewer before). Three changes: a recovery asks for
    /// whole logs of the partitions that send to the lost ones only (their neighbours, unless
    /// a phase since the copies gathered or transposed), not of every partition; a partition
    /// replayed from its copy logs what it exported on the way where it was replayed, and
    /// the coordinator counts its log as that process's from the copy's phase on (its log
    /// named the process lost first, and a loss of a neighbour before the next copies was
    /// refused); and an export found in two logs (the replayed partition's and that of the
    /// process it ran in before) is taken once (the replay refused two pieces from one
    /// sender).
    #[test]
    fn replayed_and_distant_partitions_no_longer_refuse_a_local_recovery() {
        recovers::<SimJob>(
            &[
                (44, 2),
                (571, 3),
                (776, 3),
                (1205, 2),
                (1243, 2),
                (1447, 3),
                (1805, 2),
                (1817, 2),
                (2678, 2),
                (3587, 3),
                (4549, 2),
            ]
            .map(|(s, r)| (s, r, false)),
        );
    }

    /// Checks that a scripted history's job finished with `expected` (its log if not).
    fn finished_with(h: &mut History<SimJob>, expected: &[u64]) {
        let log = h.log.join("\n");
        match h.state.result.take() {
            Some(Ok(Outcome::Finished(f))) => assert_eq!(f.into_value(), expected, "{log}"),
            other => panic!("{other:?}\n{log}"),
        }
    }

    /// A scripted history of a grid of `bands` bands of 4 rows of 6 cells, `phases`
    /// phases, buddy copies at every barrier, three processes of one thread joined, and its
    /// phases before `phase` run with nothing else happening; and the sequential value.
    fn three_with_copies(bands: u64, phases: u64, phase: u64) -> (History<SimJob>, Vec<u64>) {
        let job = Banded(SimGrid {
            n: 4 * bands,
            w: 6,
            bands,
            phases,
            done: 0,
        });
        let expected = job.expected();
        let mut h = History::build(job, 2, u64::MAX, Some(1), Rng(0), runtime());
        for _ in 0..3 {
            h.join(1);
        }
        rounds_until(&mut h, |h| h.state.phase >= phase);
        (h, expected)
    }

    /// Rounds, with the store's operations carried out, until `done`; panics with the log
    /// if a round moves nothing.
    fn rounds_until(h: &mut History<SimJob>, done: impl Fn(&History<SimJob>) -> bool) {
        for _ in 0..10_000 {
            if done(h) {
                return;
            }
            let moved = h.round(true);
            for op in std::mem::take(&mut h.ops) {
                h.store_op(op);
            }
            assert!(
                moved,
                "stuck in phase {}:\n{}",
                h.state.phase,
                h.log.join("\n")
            );
        }
        panic!("not done after 10 000 rounds:\n{}", h.log.join("\n"));
    }

    /// The scripted histories' grid: 6 rows of 6 cells in 3 bands, 2 phases.
    fn three_bands() -> SimJob {
        Banded(SimGrid {
            n: 6,
            w: 6,
            bands: 3,
            phases: 2,
            done: 0,
        })
    }

    /// A scripted history: a process runs two bands of the first phase and keeps their halos
    /// for the band between them, which waits in its queue; it is retired (both bands come
    /// back) and killed before it runs that band, which then runs on another process. The
    /// value is exact. (Written after history 1751, which ended with a refused kept halo; this
    /// script does not meet that failure with the fix reverted: the halos reach the barrier
    /// as bytes here. It stays as a test of the scripted path and of this ordering.)
    #[test]
    fn a_process_retired_and_killed_in_the_first_phase_leaves_the_value_exact() {
        let job = three_bands();
        let expected = job.expected();
        let mut h = History::scripted(job);
        let a = h.join(1);
        h.deliver_all(a);
        // Its one thread runs bands 0 and 2 (the first it was given), not band 1.
        h.procs[a].sim.turn(0);
        h.procs[a].sim.turn(0);
        h.send_all(a);
        let id = h.procs[a].id;
        h.coord().retire_conn(id);
        h.route();
        h.deliver_all(a);
        h.send_all(a);
        h.close(a, "killed");
        h.join(1);
        h.drain();
        finished_with(&mut h, &expected);
    }

    /// A scripted history (found by randomized trials with real worker processes, where the
    /// job then waited at its barrier for ever): process `c` is drained as process `a` is
    /// lost, and the local recovery asks every process left for its halo log, `c` among
    /// them. `c` hands its last partition back before its log comes: it was ended at once
    /// (`End`), the log it sent next was dropped as a late message of a connection gone, and
    /// the recovery waited for it for ever. `c` now stays until it has answered; the value
    /// is exact.
    #[test]
    fn a_drained_process_a_recovery_waits_for_ends_once_it_has_answered() {
        // Copies at every barrier; phases 0 to 2 run with nothing else happening.
        let (mut h, expected) = three_with_copies(6, 8, 3);
        let (a, c) = (0, 2);
        let (a_id, c_id) = (h.procs[a].id, h.procs[c].id);
        // `c` is drained: its threads yield the partitions they run, and those answers are
        // on their way when `a` is lost.
        h.coord().retire_conn(c_id);
        h.route();
        h.deliver_all(c);
        while let Some(&t) = h.procs[c].sim.busy_threads().first() {
            h.procs[c].sim.turn(t);
        }
        h.close(a, "killed");
        assert!(
            h.state.recovery.as_ref().is_some_and(|r| r.waits_for(c_id)),
            "no recovery of {a_id}'s partitions waiting for {c_id}:\n{}",
            h.log.join("\n")
        );
        // `c` takes the `SendLog` and answers it after its partitions: the coordinator has
        // them all back before its log.
        let c = h.procs.iter().position(|p| p.id == c_id).expect("c");
        h.deliver_all(c);
        h.send_all(c);
        h.drain();
        // `c` ends once it has answered (told `End`): its links break as it exits.
        let c = h.procs.iter().position(|p| p.id == c_id).expect("c");
        assert!(h.procs[c].sim.ended().is_some(), "{}", h.log.join("\n"));
        h.close(c, "ended");
        h.drain();
        finished_with(&mut h, &expected);
        assert_eq!(h.state.recoveries.len(), 1, "{}", h.log.join("\n"));
    }

    /// A scripted history (found by the randomized trials with real worker processes, as a
    /// job that ended with `PartitionsLost`): copies at every barrier, and a process lost in
    /// the second phase, when the only copies are those taken at the end of the first. The
    /// job value of the first phase was never kept for replays (the barriers keep those of
    /// the phases after them), so the copies could not be replayed ("the job values since
    /// the copies are not kept") and, with no snapshot, the job ended. It is kept as the run
    /// begins: the partitions are replayed from the copies of phase 0, and the value is
    /// exact.
    #[test]
    fn copies_of_the_first_phase_can_be_replayed() {
        // Process 1's partitions stay with it (the first phase moves two of process 0's to
        // process 2: their halo logs of phase 0 are in process 0).
        let (mut h, expected) = three_with_copies(6, 6, 1);
        let a = 1;
        let a_id = h.procs[a].id;
        // Phase 1 begun: the copies of phase 0 go and are answered; no thread runs.
        for _ in 0..20 {
            for i in 0..h.procs.len() {
                h.deliver_all(i);
                while h.procs[i].sim.background() > 0 {
                    h.procs[i].sim.settle(0);
                }
                h.send_all(i);
            }
            h.deliver_peers();
        }
        assert_eq!(h.state.phase, 1, "{}", h.log.join("\n"));
        assert_eq!(
            h.state.remote.buddies.report().newest_phase,
            Some(0),
            "{}",
            h.log.join("\n")
        );
        h.close(a, "killed");
        assert!(
            h.state.recovery.is_some(),
            "{a_id}'s partitions are not replayed:\n{}",
            h.log.join("\n")
        );
        h.drain();
        finished_with(&mut h, &expected);
        let r = &h.state.recoveries;
        assert_eq!(r.len(), 1, "{}", h.log.join("\n"));
        assert_eq!((r[0].copy_phase, r[0].phase), (0, 1));
    }

    /// A scripted history (found by the randomized trials with real worker processes, a
    /// firewall dropping one process's packets to the coordinator): a process is lost by
    /// its lease while it stays alive and reachable by its peers, and its partitions are
    /// replayed from their copies. The others still pushed the halos of those partitions
    /// to it, as to their holder, and it kept them: their `Done`s said the halos were kept
    /// there, out of the job's reach, and the next barrier ended the job with an error. At
    /// the loss they are told it holds nothing any more; the value is exact.
    #[test]
    fn a_process_lost_alive_takes_no_halo_of_the_partitions_replayed_elsewhere() {
        let (mut h, expected) = three_with_copies(6, 8, 3);
        let a = 1;
        let a_id = h.procs[a].id;
        // Lost by its lease: the coordinator drops it (what it sends from now on is a late
        // message of a connection gone), but it runs on, and its peer links stay up.
        h.note(format!("{a_id} falls silent in phase {}", h.state.phase));
        h.coord().drop_conn(a_id);
        h.route();
        assert!(
            h.state.recovery.is_some(),
            "{a_id}'s partitions are not replayed:\n{}",
            h.log.join("\n")
        );
        h.drain();
        finished_with(&mut h, &expected);
        assert_eq!(h.state.recoveries.len(), 1, "{}", h.log.join("\n"));
    }

    /// A buddy's `Replayed` names the phase of the copy it replayed from: one before the
    /// recovery's copies, or at the phase the job is in or after, is refused (and counts
    /// the partition as replayed no more than before); the genuine one after it is taken.
    #[test]
    fn a_replay_from_a_copy_outside_the_recovery_is_refused() {
        let (mut h, expected) = three_with_copies(6, 8, 3);
        h.close(1, "killed");
        h.route();
        assert!(h.state.recovery.is_some(), "{}", h.log.join("\n"));
        let mut forged = 0;
        for _ in 0..1000 {
            for i in 0..h.procs.len() {
                if !h.live(i) {
                    continue;
                }
                h.deliver_all(i);
                for t in h.procs[i].sim.busy_threads() {
                    h.procs[i].sim.turn(t);
                }
                while h.procs[i].sim.background() > 0 {
                    h.procs[i].sim.settle(0);
                }
                let id = h.procs[i].id;
                while let Some(msg) = h.procs[i].sim.next_sent() {
                    let msgs = match msg {
                        ToCoordinator::Batch(b) => b,
                        m => vec![m],
                    };
                    for msg in msgs {
                        if let ToCoordinator::Replayed {
                            attempt,
                            chunk,
                            copy_phase,
                            halos,
                        } = &msg
                        {
                            let phase = h.state.phase;
                            let bad = [copy_phase.checked_sub(1), Some(phase), Some(phase + 1)];
                            for p in bad.into_iter().flatten() {
                                let forgery = ToCoordinator::Replayed {
                                    attempt: *attempt,
                                    chunk: *chunk,
                                    copy_phase: p,
                                    halos: halos.clone(),
                                };
                                let refused = h.coord().on_remote(id, forgery);
                                assert!(
                                    matches!(&refused, Err(e) if e.to_string().contains("replayed from a copy of phase")),
                                    "{refused:?}"
                                );
                                forged += 1;
                            }
                        }
                        if let Err(e) = h.coord().on_remote(id, msg) {
                            panic!("{id} was refused: {e}");
                        }
                        h.route();
                    }
                }
            }
            h.deliver_peers();
            if h.state.recovery.is_none() {
                break;
            }
        }
        assert!(forged > 0, "no replay came:\n{}", h.log.join("\n"));
        h.drain();
        finished_with(&mut h, &expected);
        assert_eq!(h.state.recoveries.len(), 1, "{}", h.log.join("\n"));
    }

    /// A slot that waits for a partition its process must fetch from another process is
    /// left out of the ledger when that other process is lost (it never got its `Run`); its
    /// own process's loss later is news from a worker the ledger no longer has: dropped and
    /// counted, never an error that ends the job another way than the loss does. (The
    /// test with real processes reached it by letting a process join in the middle of a
    /// phase; now that a process runs the partitions it holds without a `Run` each, a
    /// partition moves between processes at a phase's start, as here.)
    #[test]
    fn a_loss_of_a_slot_the_ledger_already_dropped_is_news_not_an_error() {
        let job = three_bands();
        let expected = job.expected();
        let mut h = History::scripted(job);
        let a = h.join(1);
        // A snapshot of the first phase, to roll back to.
        let r = h.reply_to();
        h.coord().request_snapshot(r);
        h.route();
        h.deliver_all(a);
        for _ in 0..3 {
            h.procs[a].sim.turn(0);
        }
        // `b` joins before `a` reports: the next phase's start moves a partition to it.
        let b = h.join(1);
        h.send_all(a);
        while let Some(op) = h.ops.pop() {
            h.store_op(op);
            h.route();
        }
        assert!(!h.committed().unwrap().is_empty(), "{}", h.log.join("\n"));
        h.deliver_all(b);
        let fetching = (0..3).any(|c| h.state.remote.fetching_from(c).is_some());
        assert!(
            fetching,
            "no partition on its way to b:\n{}",
            h.log.join("\n")
        );
        // `a` dies before it hands the partition over: b's slot leaves the ledger, and the
        // job rolls back. Then `b` dies too.
        h.close(a, "killed");
        let stale = h.state.stale_events;
        h.close(0, "killed");
        h.route();
        assert!(h.state.stale_events > stale, "{}", h.log.join("\n"));
        h.join(2);
        h.drain();
        finished_with(&mut h, &expected);
    }

    /// A phase costs the coordinator one message to each process and one from it, however
    /// many partitions the process holds: the phase's start (job value, halos, every slot's
    /// run with its grant) in one batch, and the phase's `Done`s in another. Two processes
    /// of one and two threads, 24 bands, 6 phases, nothing else happening (no heartbeat, no
    /// snapshot, no fault).
    #[test]
    fn a_phase_costs_one_message_each_way_per_process() {
        let job = Banded(SimGrid {
            n: 48,
            w: 6,
            bands: 24,
            phases: 6,
            done: 0,
        });
        let expected = job.expected();
        let mut h = History::scripted(job);
        h.join(1);
        h.join(2);
        let mut phase = h.state.phase;
        let count = |h: &History<SimJob>| {
            let t = &h.state.remote.traffic;
            (t.messages_in, t.messages_out)
        };
        let mut at = count(&h);
        let mut moved_at = h.state.core.partitions_moved();
        let mut per_phase = Vec::new();
        let mut relayed_at = Vec::new();
        while !h.state.outcome_ready() {
            let moved = h.round(false);
            if h.state.phase != phase {
                let (now, moved_now) = (count(&h), h.state.core.partitions_moved());
                per_phase.push((now.0 - at.0, now.1 - at.1, moved_now - moved_at));
                (phase, at, moved_at) = (h.state.phase, now, moved_now);
                relayed_at.push(h.state.remote.traffic.halo_bytes_in);
            }
            assert!(moved, "stuck:\n{}", h.log.join("\n"));
        }
        finished_with(&mut h, &expected);
        // Every phase but the first (no partition exists yet, and its chunks go one `Run`
        // at a time, see `run_remote`), in and out, but those whose start moved partitions
        // (each moved partition is a `Surrender` and its answer).
        assert_eq!(per_phase.len(), 5, "{per_phase:?}");
        let steady: Vec<_> = per_phase[1..].iter().filter(|p| p.2 == 0).collect();
        assert!(steady.len() >= 3, "{per_phase:?}");
        for &&(got, sent, _) in &steady {
            assert!(got <= 2 && sent <= 2, "{per_phase:?}");
        }
        // The halos between the two processes go from one to the other directly once each
        // was told where the other's partitions are (after the second phase): no halo
        // crosses the coordinator after that.
        let t = h.state.remote.traffic;
        assert!(t.halos_direct >= 2 * 3, "{t:?}");
        assert_eq!(
            relayed_at[2..].windows(2).filter(|w| w[1] != w[0]).count(),
            0,
            "{relayed_at:?} {t:?}"
        );
        assert_eq!(t.peers_unreachable, 0);
    }

    /// Tiles replayed from their copies of phase `c` with the others' pieces of phases
    /// `c..P` are the plain loop's, whatever the patterns in between; and so is what each
    /// exported at the end of each phase on the way, which its process logs.
    #[test]
    fn a_replay_from_copies_gives_the_plain_loop_s_tiles() {
        let mesh = mesh::SimMesh {
            rows: 2,
            cols: 4,
            cells: 3,
            phases: 8,
            done: 0,
        };
        let n = mesh.tiles();
        let (c, p) = (5, 7);
        let lost = [3u64, 4];
        let mut copies = Vec::new();
        let mut halos = Vec::new();
        mesh.run(p, |phase, tiles| {
            if phase == c {
                copies = lost
                    .iter()
                    .map(|&x| crate::codec::encode("t", &tiles[x as usize]).unwrap())
                    .collect();
            }
            if phase >= c {
                for (from, t) in (0..).zip(tiles) {
                    if lost.contains(&from) {
                        continue;
                    }
                    let to: Vec<Option<u64>> = match mesh::SimMesh::pattern_of(phase) {
                        crate::Pattern::Neighbours => {
                            mesh.sides(from).into_iter().map(Some).collect()
                        }
                        crate::Pattern::AllToAll => (0..n).map(Some).collect(),
                        crate::Pattern::Allgather => vec![None],
                        _ => Vec::new(),
                    };
                    for to in to {
                        let b: bytes::Bytes =
                            crate::codec::encode("p", &t.piece(to)).unwrap().into();
                        for &x in &lost {
                            if to.is_none_or(|t| t == x) {
                                halos.push((phase, from, x, b.clone()));
                            }
                        }
                    }
                }
            }
        });
        let jobs = (c..=p)
            .map(|k| {
                let j = mesh::SimMesh {
                    done: k,
                    ..mesh.clone()
                };
                (
                    k,
                    bytes::Bytes::from(crate::codec::encode("j", &j).unwrap()),
                )
            })
            .collect();
        let r = crate::worker::replay::Replay {
            attempt: 0,
            copy_phase: c,
            phase: p,
            chunks: n,
            parts: lost
                .iter()
                .zip(copies)
                .map(|(&x, b)| (x, x * 3..x * 3 + 3, false, b.into()))
                .collect(),
            jobs,
            halos,
        };
        // A piece missing from the logs is an error, not a wrong tile.
        let mut short = r.clone();
        short.halos.remove(3);
        let refused = crate::worker::replay::replay::<mesh::SimMesh>(short, &Default::default());
        assert!(
            refused
                .as_ref()
                .is_err_and(|e| e.contains("would begin phase")),
            "{refused:?}"
        );
        let out = crate::worker::replay::replay::<mesh::SimMesh>(r, &Default::default()).unwrap();
        for (x, state, _, exports) in out {
            let state = crate::codec::encode("a tile", &state).unwrap();
            mesh.check_begun(x, p, &state).unwrap();
            // What it exported at the end of each phase from the copy's to the last before
            // `p` (its halo log where it was replayed), as the plain loop exports it.
            let phases: Vec<u64> = exports.iter().map(|(phase, _)| *phase).collect();
            assert_eq!(phases, (c..p).collect::<Vec<_>>(), "chunk {x}");
            for (phase, pieces) in &exports {
                mesh.check_log(x, 0..0, *phase, pieces).unwrap();
            }
        }
    }

    /// With copies every other phase and no fault, every partition has a copy after each
    /// copy barrier, of that barrier's phase, in another process than its holder's, and the
    /// copies are the plain loop's partitions.
    #[test]
    fn every_partition_has_a_copy_in_another_process_after_a_copy_barrier() {
        let job = Banded(SimGrid {
            n: 48,
            w: 6,
            bands: 12,
            phases: 8,
            done: 0,
        });
        let expected = job.expected();
        let mut h = History::scripted(job);
        h.state.remote.buddies = super::super::copies::Buddies::new(Some(2));
        h.join(1);
        h.join(2);
        h.join(1);
        let mut phase = h.state.phase;
        let mut covered = Vec::new();
        while !h.state.outcome_ready() {
            let moved = h.round(false);
            h.check_copies()
                .unwrap_or_else(|e| panic!("{e}\n{}", h.log.join("\n")));
            if h.state.phase != phase {
                phase = h.state.phase;
                // The copies of the barrier before the last one are in (their answers came
                // during the phase after it).
                let c = h.state.remote.buddies.report();
                covered.push((phase, c.partitions, c.oldest_phase, c.newest_phase));
                for chunk in 0..12 {
                    let Some((_, buddy)) = h.state.remote.buddies.copy_of(chunk) else {
                        continue;
                    };
                    let holder =
                        h.state
                            .core
                            .holder(chunk)
                            .and_then(|w| match h.state.members.get(w)? {
                                super::super::members::Member::Remote(r) => Some(r.conn),
                                _ => None,
                            });
                    assert_ne!(holder, Some(buddy), "chunk {chunk}'s copy is with it");
                }
            }
            assert!(moved, "stuck:\n{}", h.log.join("\n"));
        }
        finished_with(&mut h, &expected);
        // Copies at the barriers after phases 1, 3 and 5; by phase 7 all of phase 5.
        assert!(
            covered.contains(&(7, 12, Some(5), Some(5))),
            "{covered:?}\n{}",
            h.log.join("\n")
        );
        assert!(h.tally.copies_checked >= 24, "{:?}", h.tally);
    }

    /// A process is lost and its partitions are replayed by their buddy, which then runs
    /// them (they are pinned to it for the phase); the buddy is lost before their `Done`:
    /// they are lost with it, and the job ends with `PartitionsLost` (no snapshot), not
    /// stuck in its phase. (A fault trial with real processes was stuck so once: a run
    /// whose ledger record said only "in the lost process" went back pending with that
    /// record. This script does not meet that record, and passes without the fix; it keeps
    /// the sequence.)
    #[test]
    fn the_buddy_lost_while_it_runs_what_it_replayed_loses_those_partitions() {
        let (mut h, _) = three_with_copies(12, 12, 4);
        h.close(0, "killed");
        assert!(h.state.recovery.is_some(), "{}", h.log.join("\n"));
        rounds_until(&mut h, |h| h.state.recovery.is_none());
        assert_eq!(h.state.recoveries.len(), 1, "{}", h.log.join("\n"));
        let buddy = ProcessId(h.state.recoveries[0].buddy);
        let i = h
            .procs
            .iter()
            .position(|p| p.id == buddy)
            .expect("the buddy");
        // The buddy takes its runs of them, and is lost before it ends one.
        h.deliver_all(i);
        let running: Vec<u64> = h
            .state
            .remote
            .conns
            .get(&buddy)
            .map(|c| {
                c.workers()
                    .filter_map(|w| h.state.core.running_on(w))
                    .collect()
            })
            .unwrap_or_default();
        assert!(
            running
                .iter()
                .any(|r| h.state.recoveries[0].lost.contains(r)),
            "the buddy runs none of them: {running:?}\n{}",
            h.log.join("\n")
        );
        h.close(i, "killed");
        rounds_until(&mut h, |h| h.state.outcome_ready());
        let log = h.log.join("\n");
        match h.state.result.take() {
            Some(Err(Error::PartitionsLost { .. })) => {}
            other => panic!("{other:?}\n{log}"),
        }
    }

    /// A process lost while a snapshot's cut is open (its marker out, the processes' parts
    /// asked): the cut gives way, the lost partitions are replayed from their copies with
    /// no rollback, the request is answered by a cut taken after the recovery, and the
    /// value is exact.
    #[test]
    fn a_loss_while_a_cut_is_open_is_recovered_and_the_snapshot_taken_after() {
        let (mut h, expected) = three_with_copies(12, 12, 4);
        let r = h.reply_to();
        h.coord().request_snapshot(r);
        rounds_until(&mut h, |h| h.state.snap.cut.is_open());
        let victim = h.procs[0].id;
        h.close(0, "killed");
        assert!(
            h.state.recovery.is_some() && !h.state.snap.cut.is_open(),
            "{}",
            h.log.join("\n")
        );
        rounds_until(&mut h, |h| h.state.outcome_ready());
        h.check_copies()
            .unwrap_or_else(|e| panic!("{e}\n{}", h.log.join("\n")));
        finished_with(&mut h, &expected);
        assert_eq!(h.state.recoveries.len(), 1, "{}", h.log.join("\n"));
        assert!(h.state.rollbacks.is_empty());
        assert!(!h.state.recoveries[0].lost.is_empty());
        assert!(
            h.replies.1.contains(&r.0),
            "the snapshot asked was not answered"
        );
        assert!(
            h.state.snap.last_epoch.is_some(),
            "no snapshot committed after the recovery of {victim}'s partitions"
        );
    }

    /// A batch inside a batch from a process is refused, and so is a `Returned` of chunks
    /// its slot was not granted; a batch's messages are taken in order.
    #[test]
    fn a_nested_batch_and_a_return_of_chunks_never_granted_are_refused() {
        let mut h = History::scripted(three_bands());
        let a = h.join(1);
        h.deliver_all(a);
        let id = h.procs[a].id;
        let nested = ToCoordinator::Batch(vec![ToCoordinator::Batch(Vec::new())]);
        let refused = h.coord().on_remote(id, nested);
        assert!(
            matches!(&refused, Err(e) if e.to_string().contains("a batch inside a batch")),
            "{refused:?}"
        );
        let returned = ToCoordinator::Batch(vec![ToCoordinator::Returned {
            slot: 0,
            chunks: vec![2],
        }]);
        let refused = h.coord().on_remote(id, returned);
        assert!(
            matches!(&refused, Err(e) if e.to_string().contains("chunk 2 was not granted")),
            "{refused:?}"
        );
    }

    /// A `LogOf` whose records are of another partition, or of a chunk past the last, is
    /// refused (a process could otherwise put another partition's exports in the
    /// coordinator's log); one of the partition it names is taken.
    #[test]
    fn a_log_of_another_partition_is_refused() {
        let mut h = History::scripted(three_bands());
        let a = h.join(1);
        h.deliver_all(a);
        let id = h.procs[a].id;
        let record = |chunk: u64| (1, chunk, vec![(Some(0), bytes::Bytes::from_static(b"h"))]);
        let mixed = ToCoordinator::LogOf {
            chunk: 1,
            records: vec![record(1), record(2)],
        };
        let refused = h.coord().on_remote(id, mixed);
        assert!(
            matches!(&refused, Err(e) if e.to_string().contains("a record of chunk 2 in the halo log of chunk 1")),
            "{refused:?}"
        );
        let past = ToCoordinator::LogOf {
            chunk: 3,
            records: vec![record(3)],
        };
        let refused = h.coord().on_remote(id, past);
        assert!(
            matches!(&refused, Err(e) if e.to_string().contains("past the last")),
            "{refused:?}"
        );
        let b = h.join(1);
        h.deliver_all(b);
        let id = h.procs[b].id;
        let own = ToCoordinator::LogOf {
            chunk: 1,
            records: vec![record(1)],
        };
        assert!(h.coord().on_remote(id, own).is_ok());
    }

    /// Late answers to an earlier placement are dropped (histories 9012039, 9029903); a
    /// process that sends halos nobody asked it to export is still refused.
    #[test]
    fn halos_exported_unasked_are_refused() {
        let job = three_bands();
        let mut h = History::scripted(job);
        let a = h.join(1);
        h.deliver_all(a);
        let id = h.procs[a].id;
        let none = || crate::wire::frame::Halo::Sent(bytes::Bytes::new());
        // Quoting this attempt's placement number, or a later one.
        for placement in [0, 1] {
            let forged = ToCoordinator::Exported {
                chunk: 1,
                halos: vec![(Some(0), none()), (Some(2), none())],
                placement,
            };
            let refused = h.coord().on_remote(id, forged);
            assert!(
                matches!(&refused, Err(e) if e.to_string().contains("not placed there")),
                "{refused:?}"
            );
        }
    }

    /// A process's `Done` must address its halos as the job's shape and the phase's pattern
    /// say: to each neighbour once, in chunk order, none past the last chunk, none to
    /// everyone outside an allgather. Each forgery is refused before its halos are kept; the
    /// real `Done` is taken.
    #[test]
    fn halos_addressed_astray_are_refused() {
        let job = three_bands();
        let mut h = History::scripted(job);
        let a = h.join(1);
        h.deliver_all(a);
        h.procs[a].sim.turn(0);
        let id = h.procs[a].id;
        let done = loop {
            match h.procs[a].sim.next_sent().expect("a Done") {
                ToCoordinator::Listening { .. } => {}
                m => break m,
            }
        };
        let ToCoordinator::Done {
            chunk: 0,
            halos: Some(halos),
            ..
        } = &done
        else {
            panic!("not the first band's Done: {done:?}");
        };
        assert_eq!(
            halos.iter().map(|(to, _)| *to).collect::<Vec<_>>(),
            [Some(1)]
        );
        let piece = || crate::wire::frame::Halo::Sent(bytes::Bytes::from_static(b"\x01"));
        let forged = |halos: Vec<(Option<u64>, crate::wire::frame::Halo)>| {
            let mut d = done.clone();
            if let ToCoordinator::Done { halos: h, .. } = &mut d {
                *h = Some(halos);
            }
            d
        };
        for (halos, why) in [
            (vec![(Some(2), piece())], "not its neighbour"),
            (vec![(Some(3), piece())], "past the last"),
            (vec![(None, piece())], "to every chunk outside an allgather"),
            (vec![], "owes 1"),
            (vec![(Some(1), piece()), (Some(1), piece())], "twice"),
        ] {
            let refused = h.coord().on_remote(id, forged(halos));
            assert!(
                matches!(&refused, Err(e) if e.to_string().contains(why)),
                "{why}: {refused:?}"
            );
        }
        // A halo kept "at a peer" that is the sender itself, or with no receiver, is refused.
        let halos = vec![(Some(1), crate::wire::frame::Halo::KeptAt(id.0))];
        let refused = h.coord().on_remote(id, forged(halos));
        assert!(
            matches!(&refused, Err(e) if e.to_string().contains("not another process")),
            "{refused:?}"
        );
        // A halo named as one of a phase's gathered pieces is for a `Begin` only.
        let halos = vec![(Some(1), crate::wire::frame::Halo::Gathered)];
        let refused = h.coord().on_remote(id, forged(halos));
        assert!(
            matches!(&refused, Err(e) if e.to_string().contains("only a `Begin` may")),
            "{refused:?}"
        );
        // A peer listener that is not an address is refused.
        let refused = h.coord().on_remote(
            id,
            ToCoordinator::Listening {
                addr: "my laptop".into(),
            },
        );
        assert!(
            matches!(&refused, Err(e) if e.to_string().contains("not an address")),
            "{refused:?}"
        );
        assert_eq!(h.coord().exports.iter().flatten().count(), 0);
        // A halo handed up before its partition leaves must carry its bytes.
        for kept in [
            crate::wire::frame::Halo::Kept,
            crate::wire::frame::Halo::Gathered,
        ] {
            let released = ToCoordinator::Released {
                chunk: 1,
                phase: 0,
                halos: vec![(0, kept)],
            };
            let refused = h.coord().on_remote(id, released);
            assert!(
                matches!(&refused, Err(e) if e.to_string().contains("without its bytes")),
                "{refused:?}"
            );
        }
        assert!(h.coord().on_remote(id, done).is_ok());
        assert_eq!(h.coord().exports.iter().flatten().count(), 1);
    }

    #[test]
    fn histories_of_whole_clusters_end_exact() {
        histories::<SimJob>("MALLEABLE_SIM_SEED", 20);
    }

    /// The same faults on tiles that exchange halos on a 2-D graph, allgather and
    /// all-to-all pieces (`sim/mesh.rs`); replay one with `MALLEABLE_SIM_MESH_SEED`.
    #[test]
    fn histories_of_exchanges_end_exact() {
        let t = histories::<mesh::SimMesh>("MALLEABLE_SIM_MESH_SEED", 15);
        // The allgathers between processes named their own pieces to them (protocol 25),
        // and the histories checked every value they made. (One seed replayed may have none.)
        if var("MALLEABLE_SIM_MESH_SEED").is_none() {
            assert!(t.own_pieces > 0, "no piece named to its own process: {t:?}");
        }
    }

    /// Runs histories of `J`: the one seed in variable `seed_var`, or as many as
    /// `MALLEABLE_SIM_SECONDS` (default `seconds`) allow from `MALLEABLE_SIM_FIRST`.
    fn histories<J: Simulated>(seed_var: &str, seconds: u64) -> Tally {
        let rt = runtime();
        // `MALLEABLE_SIM_LOG=debug` prints what the coordinator and processes log (`warn`,
        // over many histories, what went wrong and why: a loss that rolled back rather
        // than recover, and its reason).
        if let Some(level) = std::env::var("MALLEABLE_SIM_LOG")
            .ok()
            .and_then(|l| l.parse::<tracing::Level>().ok())
        {
            let _ = tracing_subscriber::fmt()
                .with_max_level(level)
                .with_test_writer()
                .try_init();
        }
        if let Some(seed) = var(seed_var) {
            match history_of::<J>(seed, &rt) {
                Ok(t) => {
                    println!("history {seed}: {t:?}");
                    return t;
                }
                Err(e) => panic!("{e}"),
            }
        }
        let budget = Duration::from_secs(var("MALLEABLE_SIM_SECONDS").unwrap_or(seconds));
        let first = var("MALLEABLE_SIM_FIRST").unwrap_or(0);
        let started = Instant::now();
        let mut total = Tally::default();
        let mut n = 0;
        // Failures, by the length of their log: the shortest is the one to read first.
        let mut failed: Vec<(usize, u64, String)> = Vec::new();
        while started.elapsed() < budget {
            let seed = first + n;
            n += 1;
            let t = match history_of::<J>(seed, &rt) {
                Ok(t) => t,
                Err(e) => {
                    failed.push((e.lines().count(), seed, e));
                    continue;
                }
            };
            assert!(t.faults > 0, "history {seed} injected no fault");
            total += t;
        }
        if let Some((_, _, shortest)) = failed.iter().min() {
            let seeds: Vec<u64> = failed.iter().map(|f| f.1).collect();
            panic!(
                "{} of {n} histories failed (seeds {seeds:?}); the shortest:\n{shortest}",
                failed.len()
            );
        }
        let minutes = started.elapsed().as_secs_f64() / 60.0;
        println!(
            "{n} histories of {} from seed {first} ({:.0} a minute): {total:?}",
            J::NAME,
            n as f64 / minutes
        );
        total
    }
}
