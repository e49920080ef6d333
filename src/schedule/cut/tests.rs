//! Unit tests of the cut, driven with the core and no threads.
//!
//! [`Exec`] plays the executor as `cut.rs` describes it: a `Done` or `Yielded` of a chunk the
//! cut waits for reaches the cut before the core, a lost worker's chunk takes the state the
//! ledger falls back to, every `Run` is told to the cut, `Halt`/`Unhalt` go to the core. Its
//! workers run a toy chunk whose state is the iterations done so far with their partial sum,
//! and whose output is the sum of a hash of each index, so a wrong state or a chunk counted
//! twice or not at all changes the value's bits. Every cut that reaches `Write` is checked
//! against the ledger recorded at its marker (each chunk exactly once), then restored into a
//! fresh core and run to the end: the value must be the sequential fold, bit for bit.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Range;

use super::*;
use crate::reduce::Sum;
use crate::schedule::core::{Command, Event, Work};
use crate::schedule::{Chunking, Guided, Plan, Schedule};

// ----- the toy chunk -----

/// A chunk's state: iterations done so far, and the sum of their hashes.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Toy {
    done: u64,
    acc: f64,
}

/// What iteration `i` adds: a hash of `i` spread over several magnitudes, so the bits of a
/// sum depend on the order of its terms.
fn term(i: u64) -> f64 {
    let mut z = i.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64 * 10f64.powi((z % 7) as i32 - 3)
}

/// Runs up to `k` more iterations of the chunk `range`; whether it ended.
fn advance(range: &Range<u64>, st: &mut Toy, k: u64) -> bool {
    let from = range.start + st.done;
    let to = range.end.min(from.saturating_add(k));
    for i in from..to {
        st.acc += term(i);
    }
    st.done = to - range.start;
    to == range.end
}

/// The output of the chunk `range` run from scratch.
fn output_of(range: Range<u64>) -> f64 {
    let mut st = Toy::default();
    advance(&range, &mut st, u64::MAX);
    st.acc
}

/// The sequential fold of every chunk's output, in chunk order.
fn sequential(plan: &Plan) -> f64 {
    (0..plan.len())
        .map(|c| output_of(plan.range(c)))
        .fold(0.0, |a, x| a + x)
}

fn encode(st: &Toy) -> Vec<u8> {
    let mut b = st.done.to_le_bytes().to_vec();
    b.extend(st.acc.to_bits().to_le_bytes());
    b
}

fn decode(b: &[u8]) -> Toy {
    assert_eq!(b.len(), 16, "a toy state is 16 bytes");
    Toy {
        done: u64::from_le_bytes(b[..8].try_into().unwrap()),
        acc: f64::from_bits(u64::from_le_bytes(b[8..].try_into().unwrap())),
    }
}

fn encode_output(o: f64) -> Vec<u8> {
    o.to_bits().to_le_bytes().to_vec()
}

fn decode_output(b: &[u8]) -> f64 {
    f64::from_bits(u64::from_le_bytes(b.try_into().expect("8 bytes")))
}

// ----- what the cut collects -----

/// A chunk's part: its state's bytes, or a part already in the store under a key.
#[derive(Debug, Clone, PartialEq)]
enum Part {
    New(Vec<u8>),
    Stored(u64),
}

/// What the executor records at the marker: the merge.
#[derive(Debug, Clone, PartialEq)]
struct Header {
    merged: u64,
    value: f64,
    held: Vec<(ChunkId, f64)>,
}

type Req = u32;
type Output = Vec<u8>;
type Cmd = CutCommand<Header, Part, Output, Req, String>;
type TestWrite = Write<Header, Part, Output, Req>;

/// A cut command as carried out, comparable.
#[derive(Debug, Clone, PartialEq)]
enum Did {
    Capture(WorkerId, ChunkId),
    Withdraw(WorkerId),
    Halt,
    Unhalt,
    Write { suspend: bool, replies: Vec<Req> },
    Fail { replies: Vec<Req>, error: String },
}

/// How a requester was answered.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Answer {
    Committed,
    Failed,
    Ended,
}

/// How the chunk a cut waited for left `waiting`, as the executor told it.
#[derive(Debug, Clone, PartialEq)]
enum Resolved {
    Part(Part),
    Output(Output),
    Scratch,
}

/// The ledger at a marker.
#[derive(Debug, Default)]
struct Marker {
    merged: u64,
    held: Vec<ChunkId>,
    suspended: BTreeMap<ChunkId, Toy>,
    running: BTreeMap<ChunkId, WorkerId>,
    /// The first capture of each waiting chunk that reached the cut.
    resolved: BTreeMap<ChunkId, Resolved>,
}

#[derive(Debug)]
struct Running {
    chunk: ChunkId,
    range: Range<u64>,
    st: Toy,
}

/// A worker as the executor sees it: its chunk, and the flags raised on it.
#[derive(Debug, Default)]
struct Worker {
    run: Option<Running>,
    interrupted: bool,
    /// The chunk a `Capture` asked it for.
    capture: Option<ChunkId>,
}

/// The executor, with simulated workers and store.
#[derive(Debug)]
struct Exec {
    schedule: Schedule,
    plan: Plan,
    core: Core<Sum<f64>, Toy>,
    cut: Cut<Header, Part, Output, Req>,
    workers: BTreeMap<WorkerId, Worker>,
    next_worker: WorkerId,
    next_req: Req,
    /// Cut commands carried out since the last [`Exec::take`].
    did: Vec<Did>,
    /// Runs the core handed out since the last [`Exec::take_runs`].
    runs: Vec<(WorkerId, ChunkId, Option<Toy>)>,
    /// The write in flight.
    write: Option<TestWrite>,
    /// The snapshot store: parts by key.
    store: HashMap<u64, Vec<u8>>,
    next_key: u64,
    /// Parts of pending chunks unchanged since a committed snapshot (the executor's cache).
    cache: BTreeMap<ChunkId, u64>,
    marker: Option<Marker>,
    answered: BTreeMap<Req, Answer>,
    /// The next marker's header fails (a value that does not serialize).
    bad_marker: bool,
    /// Check that a core halted for a pending suspend hands out no chunk.
    check_halted: bool,
    /// Cuts that reached `Write` and were checked.
    writes: u32,
    ended: bool,
}

impl Exec {
    fn new(schedule: Schedule, n: u64, chunking: Chunking) -> Exec {
        let plan = Plan::new(n, schedule, chunking);
        Exec {
            schedule,
            core: Core::new(schedule, plan.clone(), Sum::new()),
            plan,
            cut: Cut::new(),
            workers: BTreeMap::new(),
            next_worker: 0,
            next_req: 0,
            did: Vec::new(),
            runs: Vec::new(),
            write: None,
            store: HashMap::new(),
            next_key: 0,
            cache: BTreeMap::new(),
            marker: None,
            answered: BTreeMap::new(),
            bad_marker: false,
            check_halted: false,
            writes: 0,
            ended: false,
        }
    }

    /// A dynamic phase of `chunks` chunks of `size` iterations.
    fn dynamic(chunks: u64, size: u64) -> Exec {
        Exec::new(Schedule::Dynamic, chunks * size, Chunking::Size(size))
    }

    fn take(&mut self) -> Vec<Did> {
        std::mem::take(&mut self.did)
    }

    fn take_runs(&mut self) -> Vec<(WorkerId, ChunkId, Option<Toy>)> {
        std::mem::take(&mut self.runs)
    }

    fn chunk_of(&self, w: WorkerId) -> Option<ChunkId> {
        self.workers.get(&w)?.run.as_ref().map(|r| r.chunk)
    }

    // ----- the core side -----

    fn event(&mut self, e: Event<Toy, f64>) {
        let mut out = Vec::new();
        self.core
            .handle(e, &mut out)
            .expect("a well-behaved worker's event is accepted");
        self.apply(out);
    }

    fn apply(&mut self, out: Vec<Command<Toy>>) {
        for cmd in out {
            match cmd {
                Command::Run {
                    worker,
                    chunk,
                    range,
                    state,
                } => {
                    if self.check_halted {
                        assert!(
                            !self.cut.suspending(),
                            "chunk {chunk} runs, a suspend pending"
                        );
                    }
                    self.cut.ran(chunk);
                    self.cache.remove(&chunk);
                    self.runs.push((worker, chunk, state));
                    let w = self.workers.get_mut(&worker).expect("a known worker");
                    assert!(w.run.is_none(), "two chunks on one worker");
                    *w = Worker {
                        run: Some(Running {
                            chunk,
                            range,
                            st: state.unwrap_or_default(),
                        }),
                        interrupted: false,
                        capture: None,
                    };
                }
                Command::Interrupt { worker } => {
                    let w = self.workers.get_mut(&worker).expect("a known worker");
                    assert!(w.run.is_some(), "interrupted while idle");
                    w.interrupted = true;
                }
                Command::Release { worker } => {
                    let w = self.workers.remove(&worker).expect("a known worker");
                    assert!(w.run.is_none(), "released while running");
                }
            }
        }
    }

    fn join(&mut self) -> WorkerId {
        let w = self.next_worker;
        self.next_worker += 1;
        self.workers.insert(w, Worker::default());
        self.event(Event::Joined { worker: w });
        w
    }

    fn retire(&mut self, w: WorkerId) {
        self.event(Event::Retire { worker: w });
    }

    /// `w` runs `k` more iterations of its chunk, and reports `Done` if it ended.
    fn step(&mut self, w: WorkerId, k: u64) {
        let Some(r) = self.workers.get_mut(&w).and_then(|w| w.run.as_mut()) else {
            return;
        };
        if advance(&r.range, &mut r.st, k) {
            self.done(w);
        }
    }

    /// `w` runs its chunk to the end and reports `Done`.
    fn finish(&mut self, w: WorkerId) {
        self.step(w, u64::MAX);
    }

    fn done(&mut self, w: WorkerId) {
        let worker = self.workers.get_mut(&w).expect("a known worker");
        let r = worker.run.take().expect("running");
        worker.capture = None;
        worker.interrupted = false;
        assert_eq!(r.st.done, r.range.end - r.range.start);
        let output = r.st.acc;
        if self.cut.waits_for(w, r.chunk) {
            self.captured(w, r.chunk, Ok(Captured::Output(encode_output(output))));
        }
        self.event(Event::Done {
            kept: None,
            worker: w,
            chunk: r.chunk,
            output,
            work: Work::default(),
        });
    }

    /// `w` hands its chunk back.
    fn hand_back(&mut self, w: WorkerId) {
        let worker = self.workers.get_mut(&w).expect("a known worker");
        let r = worker.run.take().expect("running");
        worker.capture = None;
        worker.interrupted = false;
        if self.cut.waits_for(w, r.chunk) {
            self.captured(w, r.chunk, Ok(Captured::State(Part::New(encode(&r.st)))));
        }
        self.event(Event::Yielded {
            worker: w,
            chunk: r.chunk,
            state: r.st,
            work: Work::default(),
        });
    }

    /// `w` reaches an adjustment point: it hands its chunk back if interrupted, else reports
    /// its state if a capture was asked of it, and keeps running.
    fn adjust(&mut self, w: WorkerId) {
        let Some(worker) = self.workers.get_mut(&w) else {
            return;
        };
        let Some(r) = &worker.run else { return };
        if worker.interrupted {
            self.hand_back(w);
        } else if worker.capture.take() == Some(r.chunk) {
            let (chunk, bytes) = (r.chunk, encode(&r.st));
            self.captured(w, chunk, Ok(Captured::State(Part::New(bytes))));
        }
    }

    /// `w`, a remote worker asked to capture, stores its part itself and reports its key.
    fn capture_stored(&mut self, w: WorkerId) {
        let Some(worker) = self.workers.get_mut(&w) else {
            return;
        };
        let Some(r) = &worker.run else { return };
        if worker.capture.take() == Some(r.chunk) {
            let (chunk, bytes) = (r.chunk, encode(&r.st));
            let key = self.put(bytes);
            self.captured(w, chunk, Ok(Captured::State(Part::Stored(key))));
        }
    }

    /// `w`, asked to capture, fails to (its state does not serialize).
    fn capture_fails(&mut self, w: WorkerId) {
        let Some(worker) = self.workers.get_mut(&w) else {
            return;
        };
        let Some(r) = &worker.run else { return };
        if worker.capture.take() == Some(r.chunk) {
            let chunk = r.chunk;
            self.captured(w, chunk, Err("state does not serialize".to_owned()));
        }
    }

    fn report(&mut self, w: WorkerId) {
        let Some(r) = self.workers.get(&w).and_then(|w| w.run.as_ref()) else {
            return;
        };
        let (chunk, state) = (r.chunk, r.st);
        self.event(Event::StateReport {
            worker: w,
            chunk,
            state,
        });
    }

    /// `w` is gone; the chunk the cut waited for from it takes the state the ledger falls
    /// back to.
    fn lose(&mut self, w: WorkerId) {
        self.workers.remove(&w).expect("a known worker");
        let running = self.core.running_on(w);
        self.event(Event::Lost { worker: w });
        if let Some(c) = running {
            if self.cut.waits_for(w, c) {
                let held = self.core.suspended().find(|s| s.0 == c).map(|s| *s.1);
                let what = match held {
                    Some(st) => Captured::State(Part::New(encode(&st))),
                    None => Captured::Scratch,
                };
                self.captured(w, c, Ok(what));
            }
        }
    }

    // ----- the cut side -----

    /// Tells the cut what `w` left of `chunk`, noting it if the cut takes it.
    fn captured(
        &mut self,
        w: WorkerId,
        chunk: ChunkId,
        what: Result<Captured<Part, Output>, String>,
    ) {
        let waits = self.cut.waits_for(w, chunk);
        if waits {
            let m = self.marker.as_mut().expect("a cut waits after a marker");
            assert_eq!(m.running.get(&chunk), Some(&w), "waits as the marker saw");
            let r = match &what {
                Ok(Captured::State(p)) => Some(Resolved::Part(p.clone())),
                Ok(Captured::Output(o)) | Ok(Captured::Kept(o, _)) | Ok(Captured::KeptHeld(o)) => {
                    Some(Resolved::Output(o.clone()))
                }
                Ok(Captured::Scratch) => Some(Resolved::Scratch),
                Ok(Captured::Held) | Err(_) => None,
            };
            if let Some(r) = r {
                assert!(m.resolved.insert(chunk, r).is_none(), "resolved twice");
            }
        }
        let mut out = Vec::new();
        self.cut.captured(w, chunk, what, &mut out);
        if !waits {
            assert!(
                out.is_empty(),
                "a capture the cut does not wait for: {out:?}"
            );
        }
        self.carry_out(out);
    }

    fn request(&mut self) -> Req {
        let r = self.next_req;
        self.next_req += 1;
        self.cut.request(r);
        r
    }

    fn suspend(&mut self, reply: bool) -> Option<Req> {
        let r = reply.then(|| {
            self.next_req += 1;
            self.next_req - 1
        });
        let mut out = Vec::new();
        self.cut.suspend(r, &mut out);
        self.carry_out(out);
        r
    }

    /// The ledger as a marker now would see it.
    fn ledger(&self) -> Marker {
        let (merged, _, held) = self.core.merge_state();
        Marker {
            merged,
            held: held.map(|h| h.0).collect(),
            suspended: self.core.suspended().map(|(c, s)| (c, *s)).collect(),
            running: self.core.running().map(|(w, c)| (c, w)).collect(),
            resolved: BTreeMap::new(),
        }
    }

    fn poll(&mut self) {
        let idle = !self.cut.is_open() && !self.cut.is_writing();
        let ledger = self.ledger();
        let bad = self.bad_marker;
        let (cache, store) = (&self.cache, &self.store);
        let mut out = Vec::new();
        self.cut.poll(
            &self.core,
            |core| {
                if bad {
                    return Err("the value does not serialize".to_owned());
                }
                let (merged, value, held) = core.merge_state();
                Ok(Header {
                    merged,
                    value: *value,
                    held: held.map(|(c, v)| (c, *v)).collect(),
                })
            },
            |c, st| {
                Ok(Some(match cache.get(&c) {
                    // Incremental parts: reuse the stored part, which must still be this state.
                    Some(&key) => {
                        assert_eq!(decode(&store[&key]), *st, "a reused part is stale");
                        Part::Stored(key)
                    }
                    None => Part::New(encode(st)),
                }))
            },
            &mut out,
        );
        if bad && out.iter().any(|c| matches!(c, CutCommand::Fail { .. })) {
            self.bad_marker = false;
        }
        if idle && (self.cut.is_open() || self.cut.is_writing()) {
            // A marker: it asks a capture of exactly the chunks running now.
            let mut captures: Vec<(ChunkId, WorkerId)> = out
                .iter()
                .filter_map(|c| match c {
                    CutCommand::Capture { worker, chunk } => Some((*chunk, *worker)),
                    _ => None,
                })
                .collect();
            captures.sort_unstable();
            let running: Vec<(ChunkId, WorkerId)> =
                ledger.running.iter().map(|(&c, &w)| (c, w)).collect();
            assert_eq!(captures, running, "captures asked at the marker");
            self.marker = Some(ledger);
        }
        self.carry_out(out);
    }

    /// The outcome of the write in flight; returns the chunks the cut says are unchanged.
    fn written(&mut self, outcome: Written) -> Vec<ChunkId> {
        let w = self.write.take().expect("a write in flight");
        // The writer: new parts go to the store.
        let mut keys = BTreeMap::new();
        if outcome == Written::Committed {
            for (c, p) in &w.parts {
                let key = match p {
                    Part::New(bytes) => self.put(bytes.clone()),
                    Part::Stored(key) => *key,
                };
                keys.insert(*c, key);
            }
        }
        let answer = match outcome {
            Written::Committed => Answer::Committed,
            Written::Failed => Answer::Failed,
        };
        self.answer(&w.replies, answer);
        let mut out = Vec::new();
        let unchanged = self.cut.written(outcome, &mut out);
        if outcome == Written::Failed {
            assert!(unchanged.is_empty(), "a failed write leaves no part valid");
        }
        let m = self.marker.as_ref().expect("a write follows a marker");
        for &c in &unchanged {
            let at_marker = m
                .suspended
                .get(&c)
                .expect("unchanged: suspended at the marker");
            let now = self.core.suspended().find(|s| s.0 == c).map(|s| *s.1);
            assert_eq!(
                now,
                Some(*at_marker),
                "chunk {c} is unchanged since the marker"
            );
            self.cache.insert(c, keys[&c]);
        }
        self.carry_out(out);
        if outcome == Written::Committed && w.suspend {
            // The job ends with the snapshot.
            self.end();
        }
        unchanged
    }

    /// The job ends: every requester not answered yet is told so.
    fn end(&mut self) {
        let rest = self.cut.end();
        self.answer(&rest, Answer::Ended);
        self.ended = true;
    }

    fn answer(&mut self, replies: &[Req], how: Answer) {
        for &r in replies {
            assert!(
                self.answered.insert(r, how).is_none(),
                "requester {r} answered twice"
            );
        }
    }

    fn put(&mut self, bytes: Vec<u8>) -> u64 {
        let key = self.next_key;
        self.next_key += 1;
        self.store.insert(key, bytes);
        key
    }

    fn carry_out(&mut self, out: Vec<Cmd>) {
        for cmd in out {
            match cmd {
                CutCommand::Capture { worker, chunk } => {
                    assert_eq!(self.core.running_on(worker), Some(chunk));
                    self.workers.get_mut(&worker).expect("running").capture = Some(chunk);
                    self.did.push(Did::Capture(worker, chunk));
                }
                CutCommand::CaptureHeld { chunk } => {
                    unreachable!("every state of the simulation is in the ledger: {chunk}")
                }
                CutCommand::Withdraw { worker } => {
                    if let Some(w) = self.workers.get_mut(&worker) {
                        w.capture = None;
                    }
                    self.did.push(Did::Withdraw(worker));
                }
                CutCommand::Halt => {
                    let mut out = Vec::new();
                    self.core.halt(&mut out);
                    self.apply(out);
                    self.did.push(Did::Halt);
                }
                CutCommand::Unhalt => {
                    let mut out = Vec::new();
                    self.core.unhalt(&mut out);
                    self.apply(out);
                    self.did.push(Did::Unhalt);
                }
                CutCommand::Write(w) => {
                    assert!(self.write.is_none(), "one write at a time");
                    self.check(&w);
                    self.did.push(Did::Write {
                        suspend: w.suspend,
                        replies: w.replies.clone(),
                    });
                    self.write = Some(w);
                }
                CutCommand::Fail { replies, error } => {
                    self.answer(&replies, Answer::Failed);
                    self.did.push(Did::Fail { replies, error });
                }
            }
        }
    }

    // ----- checks -----

    /// A complete cut holds every chunk of the phase exactly once, as the marker saw it, and
    /// restores to the sequential fold.
    fn check(&mut self, w: &TestWrite) {
        self.writes += 1;
        let m = self.marker.as_ref().expect("a write follows a marker");
        let len = self.plan.len();
        assert_eq!(w.header.merged, m.merged, "merged as at the marker");
        let held: Vec<ChunkId> = w.header.held.iter().map(|h| h.0).collect();
        assert_eq!(held, m.held, "held as at the marker");
        assert!(
            w.parts.windows(2).all(|p| p[0].0 < p[1].0),
            "parts in order"
        );
        assert!(w.done.windows(2).all(|d| d[0].0 < d[1].0), "done in order");
        if w.suspend {
            assert!(m.running.is_empty(), "a suspend's cut is quiet");
        }
        assert_eq!(
            m.resolved.keys().collect::<Vec<_>>(),
            m.running.keys().collect::<Vec<_>>(),
            "complete: every chunk running at the marker left `waiting`"
        );
        let mut seen: BTreeMap<ChunkId, &str> = BTreeMap::new();
        let mut place = |c: ChunkId, how: &'static str| {
            assert!(c < len, "chunk {c} of {len}");
            if let Some(before) = seen.insert(c, how) {
                panic!("chunk {c} twice in the cut: {before} and {how}");
            }
        };
        for c in 0..w.header.merged {
            place(c, "folded");
        }
        for &c in &held {
            place(c, "held");
        }
        for (c, o) in &w.done {
            place(*c, "done");
            assert_eq!(m.resolved.get(c), Some(&Resolved::Output(o.clone())));
        }
        for (c, p) in &w.parts {
            place(*c, "part");
            match m.suspended.get(c) {
                Some(st) => assert_eq!(self.resolve(p), *st, "chunk {c}'s part at the marker"),
                None => assert_eq!(m.resolved.get(c), Some(&Resolved::Part(p.clone()))),
            }
        }
        for c in 0..len {
            if !seen.contains_key(&c) {
                assert!(!m.suspended.contains_key(&c), "suspended chunk {c} lost");
                if m.running.contains_key(&c) {
                    assert_eq!(m.resolved[&c], Resolved::Scratch, "running chunk {c} lost");
                }
            }
        }
        let value = self.restore_and_run(w);
        assert_eq!(
            value.to_bits(),
            sequential(&self.plan).to_bits(),
            "the restored run gives the sequential fold"
        );
    }

    fn resolve(&self, p: &Part) -> Toy {
        match p {
            Part::New(bytes) => decode(bytes),
            Part::Stored(key) => decode(&self.store[key]),
        }
    }

    /// Restores a fresh core from `w`, as a resume in another process would, and runs it to
    /// the end with one worker.
    fn restore_and_run(&self, w: &TestWrite) -> f64 {
        let mut done: Vec<(ChunkId, f64)> = w.header.held.clone();
        done.extend(w.done.iter().map(|(c, o)| (*c, decode_output(o))));
        let suspended = w.parts.iter().map(|(c, p)| (*c, self.resolve(p))).collect();
        let mut core: Core<Sum<f64>, Toy> = Core::restore(
            self.schedule,
            self.plan.clone(),
            Sum::new(),
            w.header.merged,
            w.header.value,
            done,
            suspended,
            Vec::new(),
        )
        .expect("a complete cut fits the plan");
        run_alone(&mut core)
    }
}

/// Runs `core` to the end of its phase with one worker; the phase's value.
fn run_alone(core: &mut Core<Sum<f64>, Toy>) -> f64 {
    let mut out = Vec::new();
    core.handle(Event::Joined { worker: 0 }, &mut out).unwrap();
    while let Some(cmd) = out.pop() {
        let Command::Run {
            worker,
            chunk,
            range,
            state,
        } = cmd
        else {
            panic!("one steady worker gets only runs: {cmd:?}");
        };
        let mut st = state.unwrap_or_default();
        assert!(
            st.done < range.end - range.start,
            "a state of a finished chunk"
        );
        advance(&range, &mut st, u64::MAX);
        let done = Event::Done {
            kept: None,
            worker,
            chunk,
            output: st.acc,
            work: Work::default(),
        };
        core.handle(done, &mut out).unwrap();
    }
    assert!(
        core.phase_complete(),
        "one worker runs the phase to its end"
    );
    core.finish_phase()
}

fn part(st: Toy) -> Part {
    Part::New(encode(&st))
}

/// A toy state `done` iterations into the chunk `range`.
fn toy(range: Range<u64>, done: u64) -> Toy {
    let mut st = Toy::default();
    advance(&range, &mut st, done);
    st
}

// ----- the marker -----

/// Chunks 0 folded, 1 running, 2 held, 3 suspended, 4 running, 5 never started.
fn mixed_ledger() -> (Exec, WorkerId, WorkerId) {
    let mut x = Exec::dynamic(6, 10);
    let (a, b, c) = (x.join(), x.join(), x.join());
    assert_eq!(
        [x.chunk_of(a), x.chunk_of(b), x.chunk_of(c)],
        [Some(0), Some(1), Some(2)]
    );
    x.finish(a); // 0 folded; a takes 3
    x.finish(c); // 2 held behind 1; c takes 4
    assert_eq!([x.chunk_of(a), x.chunk_of(c)], [Some(3), Some(4)]);
    x.step(a, 4);
    x.retire(a);
    x.adjust(a); // hands 3 back after 4 iterations and leaves
    assert!(!x.workers.contains_key(&a));
    x.step(b, 2);
    x.step(c, 7);
    x.take_runs();
    (x, b, c)
}

#[test]
fn marker_records_each_ledger_state_and_captures_the_running_chunks() {
    let (mut x, b, c) = mixed_ledger();
    let r = x.request();
    assert!(x.take().is_empty(), "a request alone starts nothing");
    x.poll();
    let mut captures = x.take();
    captures.sort_by_key(|d| format!("{d:?}"));
    assert_eq!(captures, vec![Did::Capture(b, 1), Did::Capture(c, 4)]);
    assert!(x.cut.is_open() && !x.cut.is_writing());
    assert!(x.cut.waits_for(b, 1) && x.cut.waits_for(c, 4));
    assert!(!x.cut.waits_for(c, 1) && !x.cut.waits_for(b, 3) && !x.cut.waits_for(b, 5));

    x.adjust(b);
    assert!(x.take().is_empty(), "the cut still waits for chunk 4");
    x.adjust(c);
    assert_eq!(
        x.take(),
        vec![Did::Write {
            suspend: false,
            replies: vec![r]
        }]
    );
    let w = x.write.as_ref().unwrap();
    let p = x.plan.clone();
    assert_eq!(
        w.header,
        Header {
            merged: 1,
            value: 0.0 + output_of(p.range(0)),
            held: vec![(2, output_of(p.range(2)))],
        }
    );
    assert_eq!(
        w.parts,
        vec![
            (1, part(toy(p.range(1), 2))),
            (3, part(toy(p.range(3), 4))),
            (4, part(toy(p.range(4), 7))),
        ]
    );
    assert!(w.done.is_empty());
    assert!(w.parts.iter().all(|p| p.0 != 5), "never started: nowhere");
    x.written(Written::Committed);
    assert_eq!(x.answered[&r], Answer::Committed);
}

#[test]
fn a_cut_with_nothing_running_is_complete_at_its_marker() {
    let mut x = Exec::dynamic(3, 5);
    let a = x.join();
    x.finish(a);
    x.step(a, 2);
    x.retire(a);
    x.adjust(a);
    let r = x.request();
    x.poll();
    assert_eq!(
        x.take(),
        vec![Did::Write {
            suspend: false,
            replies: vec![r]
        }]
    );
    let w = x.write.as_ref().unwrap();
    assert_eq!(w.header.merged, 1);
    assert_eq!(w.parts, vec![(1, part(toy(x.plan.range(1), 2)))]);
}

// ----- captures -----

#[test]
fn a_chunk_captured_at_an_adjustment_point_completes_the_cut() {
    let mut x = Exec::dynamic(1, 10);
    let a = x.join();
    x.step(a, 4);
    let r = x.request();
    x.poll();
    assert_eq!(x.take(), vec![Did::Capture(a, 0)]);
    x.step(a, 1); // no adjustment point yet: nothing for the cut
    assert!(x.cut.is_open());
    x.adjust(a);
    assert_eq!(
        x.take(),
        vec![Did::Write {
            suspend: false,
            replies: vec![r]
        }]
    );
    let w = x.write.as_ref().unwrap();
    assert_eq!(w.parts, vec![(0, part(toy(0..10, 5)))]);
    assert!(w.done.is_empty());
    // The worker keeps running its chunk.
    assert_eq!(x.core.running_on(a), Some(0));
    x.finish(a);
    assert!(x.core.phase_complete());
    assert!(x.written(Written::Committed).is_empty());
}

#[test]
fn the_output_wins_when_it_reaches_the_cut_before_the_capture() {
    let mut x = Exec::dynamic(2, 10);
    let a = x.join();
    x.step(a, 3);
    let r = x.request();
    x.poll();
    assert_eq!(x.take(), vec![Did::Capture(a, 0)]);
    x.finish(a); // ends before its adjustment point: its output is the cut's
    assert_eq!(
        x.take(),
        vec![Did::Write {
            suspend: false,
            replies: vec![r]
        }]
    );
    let w = x.write.as_ref().unwrap();
    assert_eq!(w.done, vec![(0, encode_output(output_of(0..10)))]);
    assert!(w.parts.is_empty(), "chunk 1 never started at the marker");
    // The state the worker took before it ended arrives late: not the cut's.
    x.captured(a, 0, Ok(Captured::State(part(toy(0..10, 3)))));
    assert!(x.take().is_empty());
    assert_eq!(x.write.as_ref().unwrap().done.len(), 1);
}

#[test]
fn the_state_wins_when_it_reaches_the_cut_before_the_output() {
    let mut x = Exec::dynamic(2, 10);
    let a = x.join();
    x.step(a, 3);
    x.request();
    x.poll();
    x.take();
    x.adjust(a);
    assert!(x.cut.is_writing());
    x.finish(a); // the core folds the output; the cut keeps the state
    assert!(x.core.is_done(0));
    let w = x.write.as_ref().unwrap();
    assert_eq!(w.parts, vec![(0, part(toy(0..10, 3)))]);
    assert!(w.done.is_empty());
}

#[test]
fn a_handed_back_chunk_leaves_its_state_to_the_cut() {
    let mut x = Exec::dynamic(2, 10);
    let (a, b) = (x.join(), x.join());
    x.step(a, 6);
    x.request();
    x.poll();
    x.take();
    x.retire(a);
    x.adjust(a); // hands chunk 0 back (interrupted), not a capture
    assert!(x.cut.is_open(), "still waits for b");
    x.finish(b);
    let w = x.write.as_ref().unwrap();
    assert_eq!(w.parts, vec![(0, part(toy(0..10, 6)))]);
    assert_eq!(w.done, vec![(1, encode_output(output_of(10..20)))]);
}

#[test]
fn captures_from_another_worker_or_chunk_are_not_the_cuts() {
    let mut x = Exec::dynamic(2, 10);
    let (a, b) = (x.join(), x.join());
    x.request();
    x.poll();
    x.take();
    // b runs chunk 1, the cut waits for chunk 0 from a; a stray report of chunk 0 from b, of
    // chunk 1 from a, or from a worker that never was, is ignored.
    let junk = || Ok(Captured::State(Part::New(vec![0xFF; 16])));
    x.captured(b, 0, junk());
    x.captured(a, 1, junk());
    x.captured(99, 0, junk());
    x.captured(b, 0, Ok(Captured::Scratch));
    assert!(x.take().is_empty());
    assert!(x.cut.waits_for(a, 0) && x.cut.waits_for(b, 1));
    x.adjust(a);
    x.adjust(b);
    assert!(x.cut.is_writing());
}

// ----- lost workers -----

#[test]
fn a_lost_workers_chunk_takes_the_state_it_reported() {
    let mut x = Exec::dynamic(2, 10);
    let (a, b) = (x.join(), x.join());
    x.step(a, 5);
    x.report(a);
    x.step(a, 2); // work after the report is lost with the worker
    x.request();
    x.poll();
    x.take();
    x.lose(a);
    assert!(x.cut.is_open(), "still waits for b");
    x.finish(b); // b then takes chunk 0 from the reported state
    assert_eq!(x.take_runs().last(), Some(&(b, 0, Some(toy(0..10, 5)))));
    let w = x.write.as_ref().unwrap();
    assert_eq!(w.parts, vec![(0, part(toy(0..10, 5)))]);
}

#[test]
fn a_lost_workers_chunk_without_a_state_restarts_from_scratch() {
    let mut x = Exec::dynamic(2, 10);
    let (a, b) = (x.join(), x.join());
    x.step(a, 5);
    x.request();
    x.poll();
    x.take();
    x.lose(a);
    assert_eq!(x.marker.as_ref().unwrap().resolved[&0], Resolved::Scratch);
    x.adjust(b);
    let w = x.write.as_ref().unwrap();
    assert_eq!(w.parts, vec![(1, part(toy(10..20, 0)))]);
    assert!(
        w.done.is_empty(),
        "chunk 0 is nowhere: it restarts from scratch"
    );
}

/// A chunk handed back, then run again from that state: the core keeps no copy of the state
/// it handed out (`known` holds only `StateReport`s), so if that worker is lost the ledger
/// falls back to scratch, and the cut records the chunk nowhere. Exact, but the work of the
/// earlier run is redone.
#[test]
fn a_lost_workers_chunk_run_from_a_handed_back_state_restarts_from_scratch() {
    let mut x = Exec::dynamic(2, 10);
    let (a, b) = (x.join(), x.join());
    x.step(a, 4);
    x.retire(a);
    x.adjust(a); // chunk 0 suspended after 4 iterations
    x.finish(b); // b takes chunk 0 from that state
    assert_eq!(x.take_runs().last(), Some(&(b, 0, Some(toy(0..10, 4)))));
    let c = x.join();
    assert_eq!(x.chunk_of(c), None, "nothing left to hand out");
    x.request();
    x.poll();
    assert_eq!(x.take(), vec![Did::Capture(b, 0)]);
    x.lose(b); // c takes chunk 0 again, from scratch
    assert_eq!(x.take_runs(), vec![(c, 0, None)]);
    let w = x.write.as_ref().unwrap();
    assert!(w.parts.is_empty() && w.done.is_empty());
    assert_eq!(x.marker.as_ref().unwrap().resolved[&0], Resolved::Scratch);
}

/// With an idle worker the core hands a lost worker's chunk on at once, with the state it
/// fell back to: that state is in the `Run`, no longer in `core.suspended()`, so the executor
/// as specified tells the cut `Scratch`. Exact (the restore runs the chunk from the start),
/// but the reported state is not in the snapshot.
#[test]
fn a_lost_workers_chunk_handed_on_at_once_is_captured_from_scratch() {
    let mut x = Exec::dynamic(1, 10);
    let (a, b) = (x.join(), x.join());
    assert_eq!(x.chunk_of(b), None);
    x.step(a, 5);
    x.report(a);
    x.request();
    x.poll();
    x.take();
    x.take_runs();
    x.lose(a);
    assert_eq!(x.take_runs(), vec![(b, 0, Some(toy(0..10, 5)))]);
    assert_eq!(x.marker.as_ref().unwrap().resolved[&0], Resolved::Scratch);
    assert!(x.write.as_ref().unwrap().parts.is_empty());
}

// ----- suspend -----

#[test]
fn suspend_halts_waits_for_quiescence_and_needs_no_capture() {
    let mut x = Exec::dynamic(4, 10);
    let (a, b) = (x.join(), x.join());
    x.step(a, 3);
    x.step(b, 8);
    x.take_runs();
    let r = x.suspend(true).unwrap();
    assert_eq!(x.take(), vec![Did::Halt]);
    assert!(x.workers[&a].interrupted && x.workers[&b].interrupted);
    assert!(x.cut.suspending());
    x.poll();
    assert!(!x.cut.is_open() && x.take().is_empty(), "chunks still run");
    x.adjust(a);
    assert!(x.take_runs().is_empty(), "a halted core hands out nothing");
    x.poll();
    assert!(!x.cut.is_open() && x.take().is_empty(), "b still runs");
    x.adjust(b);
    x.poll();
    assert_eq!(
        x.take(),
        vec![Did::Write {
            suspend: true,
            replies: vec![r]
        }]
    );
    let w = x.write.as_ref().unwrap();
    assert_eq!(
        w.parts,
        vec![(0, part(toy(0..10, 3))), (1, part(toy(10..20, 8)))]
    );
    x.written(Written::Committed);
    assert!(x.ended);
    assert_eq!(x.answered[&r], Answer::Committed);
}

#[test]
fn a_failed_suspend_write_unhalts_the_core() {
    let mut x = Exec::dynamic(2, 10);
    let a = x.join();
    x.step(a, 3);
    let r = x.suspend(true).unwrap();
    x.adjust(a);
    x.poll();
    assert!(x.cut.is_writing());
    x.take();
    x.take_runs();
    x.written(Written::Failed);
    assert_eq!(x.take(), vec![Did::Unhalt]);
    assert_eq!(x.take_runs(), vec![(a, 0, Some(toy(0..10, 3)))]);
    assert!(!x.cut.suspending());
    assert_eq!(x.answered[&r], Answer::Failed);
    // Whoever asked may ask again.
    x.suspend(false);
    assert_eq!(x.take(), vec![Did::Halt]);
}

/// A suspend asked while a cut of requests (a periodic snapshot, say) waits for captures:
/// that cut gives way, and one snapshot, the suspend's, answers everyone. Before, the open
/// cut was written first and the suspend's snapshot after it: two commits while suspending.
#[test]
fn a_suspend_during_an_open_cut_takes_its_requesters() {
    let mut x = Exec::dynamic(2, 10);
    let (a, b) = (x.join(), x.join());
    x.step(a, 2);
    let r1 = x.request();
    x.poll();
    assert!(x.cut.is_open());
    x.take();
    let r2 = x.suspend(true).unwrap();
    assert_eq!(
        x.take(),
        vec![Did::Withdraw(a), Did::Withdraw(b), Did::Halt]
    );
    assert!(!x.cut.is_open() && x.cut.suspending());
    x.adjust(a); // interrupted: hands back
    x.adjust(b);
    assert!(x.take().is_empty(), "no cut of requests is written");
    x.poll();
    assert_eq!(
        x.take(),
        vec![Did::Write {
            suspend: true,
            replies: vec![r2, r1]
        }]
    );
    x.written(Written::Committed);
    assert!(x.ended);
    assert_eq!(x.answered[&r1], Answer::Committed);
    assert_eq!(x.answered[&r2], Answer::Committed);
}

/// A cut already being written when the suspend is asked still completes; the suspend's
/// snapshot follows it, and requests made meanwhile join the suspend's.
#[test]
fn a_suspend_during_a_write_waits_for_it() {
    let mut x = Exec::dynamic(2, 10);
    let (a, b) = (x.join(), x.join());
    let r1 = x.request();
    x.poll();
    x.adjust(a);
    x.adjust(b);
    assert!(x.cut.is_writing());
    x.take();
    let r2 = x.suspend(true).unwrap();
    assert_eq!(x.take(), vec![Did::Halt]);
    let r3 = x.request();
    x.adjust(a); // interrupted: hands back
    x.adjust(b);
    x.poll();
    assert!(x.take().is_empty(), "one write at a time");
    x.written(Written::Committed);
    assert_eq!(x.answered[&r1], Answer::Committed);
    x.poll();
    assert_eq!(
        x.take(),
        vec![Did::Write {
            suspend: true,
            replies: vec![r2, r3]
        }]
    );
}

#[test]
fn a_failed_suspend_marker_fails_its_requesters_and_unhalts() {
    let mut x = Exec::dynamic(2, 10);
    let a = x.join();
    let r = x.suspend(true).unwrap();
    x.adjust(a);
    x.bad_marker = true;
    x.take();
    x.take_runs();
    x.poll();
    assert_eq!(
        x.take(),
        vec![
            Did::Fail {
                replies: vec![r],
                error: "the value does not serialize".to_owned()
            },
            Did::Unhalt
        ]
    );
    assert_eq!(x.take_runs().len(), 1, "the core hands out chunks again");
    assert!(!x.cut.suspending() && !x.cut.is_open());
}

/// A second suspend asked while the first suspend's write is in flight: `suspend` emits
/// `Halt` for it (the core already is), then the first write fails and `written` un-halts the
/// core although that second suspend is still pending. The core hands out chunks again, so
/// the suspend's quiescence may never come (workers never go quiet on a long phase): the
/// second suspend is not carried out until the phase ends. Same in `abandon`, for a suspend
/// asked while a suspend's cut is open (not reachable today, as a suspend's cut is complete
/// at its marker).
#[test]
fn a_suspend_asked_during_a_failing_suspend_write_keeps_the_core_halted() {
    let mut x = Exec::dynamic(2, 10);
    let a = x.join();
    x.suspend(true);
    x.adjust(a);
    x.poll();
    assert!(x.cut.is_writing());
    x.suspend(true);
    x.take();
    x.take_runs();
    x.written(Written::Failed);
    assert!(x.cut.suspending(), "the second suspend is pending");
    assert!(
        x.take_runs().is_empty(),
        "a core halted for a pending suspend hands out no chunk"
    );
    x.poll();
    assert!(
        x.cut.is_writing(),
        "the second suspend's cut starts at once"
    );
}

// ----- remote parts -----

#[test]
fn a_part_stored_by_its_remote_worker_is_taken_as_is() {
    let mut x = Exec::dynamic(2, 10);
    let (a, b) = (x.join(), x.join());
    x.step(a, 7);
    x.request();
    x.poll();
    x.take();
    x.capture_stored(a);
    x.finish(b);
    let w = x.write.as_ref().unwrap();
    assert_eq!(w.parts, vec![(0, Part::Stored(0))]);
    assert_eq!(decode(&x.store[&0]), toy(0..10, 7));
    // Committed: the writer adds no copy of a stored part.
    x.written(Written::Committed);
    assert_eq!(x.store.len(), 1);
}

// ----- requests, failures, end -----

#[test]
fn a_request_joins_the_open_cut() {
    let mut x = Exec::dynamic(1, 10);
    let a = x.join();
    let r1 = x.request();
    x.poll();
    let r2 = x.request();
    x.poll();
    assert_eq!(x.take(), vec![Did::Capture(a, 0)], "one marker");
    x.adjust(a);
    assert_eq!(
        x.take(),
        vec![Did::Write {
            suspend: false,
            replies: vec![r1, r2]
        }]
    );
}

#[test]
fn requests_during_a_write_start_the_next_cut_after_its_outcome() {
    let mut x = Exec::dynamic(3, 10);
    let a = x.join();
    let r1 = x.request();
    x.poll();
    x.adjust(a);
    assert!(x.cut.is_writing());
    let (r2, r3) = (x.request(), x.request());
    x.poll();
    x.step(a, 4);
    x.poll();
    assert_eq!(
        x.take(),
        vec![
            Did::Capture(a, 0),
            Did::Write {
                suspend: false,
                replies: vec![r1]
            }
        ],
        "no second marker while writing"
    );
    x.written(Written::Committed);
    assert_eq!(x.answered[&r1], Answer::Committed);
    assert!(!x.answered.contains_key(&r2));
    x.poll();
    assert_eq!(x.take(), vec![Did::Capture(a, 0)]);
    x.adjust(a);
    assert_eq!(
        x.take(),
        vec![Did::Write {
            suspend: false,
            replies: vec![r2, r3]
        }]
    );
    // A failed write is answered too, and the next cut still comes.
    let r4 = x.request();
    x.written(Written::Failed);
    assert_eq!(x.answered[&r2], Answer::Failed);
    assert_eq!(x.answered[&r3], Answer::Failed);
    x.poll();
    assert!(x.cut.is_open());
    assert_eq!(x.take(), vec![Did::Capture(a, 0)]);
    x.adjust(a);
    assert_eq!(
        x.take(),
        vec![Did::Write {
            suspend: false,
            replies: vec![r4]
        }]
    );
}

#[test]
fn end_returns_every_unanswered_requester() {
    // A write in flight (its requesters wait for its outcome), one queued behind it, a
    // pending suspend.
    let mut x = Exec::dynamic(2, 10);
    let (a, b) = (x.join(), x.join());
    x.request();
    x.poll();
    x.adjust(a);
    x.adjust(b);
    assert!(x.cut.is_writing());
    let r2 = x.request();
    let r3 = x.suspend(true).unwrap();
    let mut rest = x.cut.end();
    rest.sort_unstable();
    assert_eq!(rest, vec![r2, r3]);
    assert!(x.cut.end().is_empty(), "each once");
    // An open cut's requesters.
    let mut x = Exec::dynamic(2, 10);
    x.join();
    let r1 = x.request();
    x.poll();
    let r2 = x.request();
    assert!(x.cut.is_open());
    assert_eq!(x.cut.end(), vec![r1, r2]);
    assert!(!x.cut.is_open() && !x.cut.suspending());
}

#[test]
fn a_failed_capture_abandons_the_cut_and_withdraws_the_rest() {
    let mut x = Exec::dynamic(3, 10);
    let (a, b, c) = (x.join(), x.join(), x.join());
    let r = x.request();
    x.poll();
    x.take();
    x.adjust(a);
    x.capture_fails(b);
    assert_eq!(
        x.take(),
        vec![
            Did::Withdraw(c),
            Did::Fail {
                replies: vec![r],
                error: "state does not serialize".to_owned()
            }
        ]
    );
    assert!(!x.cut.is_open() && !x.cut.is_writing());
    assert_eq!(x.workers[&c].capture, None, "withdrawn");
    assert!(!x.cut.waits_for(c, 2));
    // The job goes on, and the next request gets a new cut.
    let r2 = x.request();
    x.poll();
    assert_eq!(x.take().len(), 3, "three captures");
    for w in [a, b, c] {
        x.adjust(w);
    }
    assert_eq!(
        x.take(),
        vec![Did::Write {
            suspend: false,
            replies: vec![r2]
        }]
    );
}

// ----- incremental parts -----

/// Chunks 1, 2, 3 suspended and chunk 0 running on the returned worker.
fn three_suspended() -> (Exec, WorkerId) {
    let mut x = Exec::dynamic(4, 10);
    let a = x.join();
    let rest: Vec<WorkerId> = (0..3).map(|_| x.join()).collect();
    for (i, &w) in rest.iter().enumerate() {
        x.step(w, i as u64 + 1);
        x.retire(w);
        x.adjust(w);
    }
    let suspended: Vec<ChunkId> = x.core.suspended().map(|s| s.0).collect();
    assert_eq!(
        suspended.into_iter().collect::<BTreeSet<_>>(),
        [1, 2, 3].into()
    );
    x.take_runs();
    (x, a)
}

#[test]
fn unchanged_parts_are_those_suspended_at_the_marker_and_not_run_until_the_outcome() {
    let (mut x, a) = three_suspended();
    x.request();
    x.poll();
    assert!(x.cut.is_open());
    x.join(); // takes chunk 1 while the cut is open
    x.adjust(a);
    assert!(x.cut.is_writing());
    x.join(); // takes chunk 2 after the cut is complete, before the write's outcome
    assert_eq!(
        x.take_runs().iter().map(|r| r.1).collect::<Vec<_>>(),
        [1, 2]
    );
    assert_eq!(x.written(Written::Committed), vec![3]);
    // The next cut reuses chunk 3's stored part (checked against its state in `poll`).
    x.request();
    x.poll();
    for w in x.workers.keys().copied().collect::<Vec<_>>() {
        x.adjust(w);
    }
    let w = x.write.as_ref().unwrap();
    let three = w.parts.iter().find(|p| p.0 == 3).unwrap();
    assert!(matches!(three.1, Part::Stored(_)), "{three:?}");
}

#[test]
fn a_failed_write_leaves_no_part_unchanged() {
    let (mut x, a) = three_suspended();
    x.request();
    x.poll();
    x.adjust(a);
    assert!(x.written(Written::Failed).is_empty());
}

#[test]
fn a_chunk_run_between_cuts_loses_its_reused_part() {
    let (mut x, a) = three_suspended();
    x.request();
    x.poll();
    x.adjust(a);
    assert_eq!(x.written(Written::Committed), vec![1, 2, 3]);
    // No cut under way: chunk 1 runs and is handed back with a new state. The cut does not
    // track this run (`ran` only counts from a marker); the executor's cache drops the part.
    let b = x.join();
    assert_eq!(x.chunk_of(b), Some(1));
    x.step(b, 5);
    x.retire(b);
    x.adjust(b);
    x.request();
    x.poll();
    x.adjust(a);
    let w = x.write.as_ref().unwrap();
    assert_eq!(w.parts[1], (1, part(toy(10..20, 6))));
    assert!(matches!(w.parts[2].1, Part::Stored(_)));
}

mod proptests {
    //! Random histories of the core and the cut together. `Exec` checks every cut that
    //! reaches `Write` (each chunk exactly once, restored value bit for bit), every
    //! `written` outcome (unchanged parts still match the ledger), every reused part, and at
    //! the end that every requester was answered exactly once.

    use proptest::prelude::*;

    use super::*;

    #[derive(Debug, Clone, Copy)]
    enum Action {
        Join,
        Retire(usize),
        Lose(usize),
        Step(usize, u64),
        /// An adjustment point: hand back if interrupted, capture if asked.
        Adjust(usize),
        /// A remote worker asked to capture stores its part.
        CaptureStored(usize),
        CaptureFails(usize),
        Report(usize),
        /// A hand-back nobody asked for (the core takes it).
        HandBack(usize),
        /// A capture the cut does not wait for (a late one, a lost worker's, junk).
        Stray(u64, u64),
        Request,
        Suspend(bool),
        Written(bool),
        BadMarker,
    }

    fn schedules() -> impl Strategy<Value = Schedule> {
        prop_oneof![
            Just(Schedule::Dynamic),
            Just(Schedule::Static),
            (1..6u32, 1..20u64)
                .prop_map(|(workers, min_chunk)| Schedule::Guided(Guided { workers, min_chunk })),
        ]
    }

    fn chunkings() -> impl Strategy<Value = Chunking> {
        prop_oneof![
            (1..40u64).prop_map(Chunking::Count),
            (1..100u64).prop_map(Chunking::Size)
        ]
    }

    fn phase_sizes() -> impl Strategy<Value = u64> {
        prop_oneof![1 => Just(0u64), 9 => 1..800u64]
    }

    fn actions() -> impl Strategy<Value = Action> {
        prop_oneof![
            2 => Just(Action::Join),
            1 => any::<usize>().prop_map(Action::Retire),
            1 => any::<usize>().prop_map(Action::Lose),
            8 => (any::<usize>(), 1..60u64).prop_map(|(w, k)| Action::Step(w, k)),
            4 => any::<usize>().prop_map(Action::Adjust),
            1 => any::<usize>().prop_map(Action::CaptureStored),
            1 => any::<usize>().prop_map(Action::CaptureFails),
            1 => any::<usize>().prop_map(Action::Report),
            1 => any::<usize>().prop_map(Action::HandBack),
            1 => (0..20u64, 0..50u64).prop_map(|(w, c)| Action::Stray(w, c)),
            3 => Just(Action::Request),
            1 => any::<bool>().prop_map(Action::Suspend),
            3 => any::<bool>().prop_map(Action::Written),
            1 => Just(Action::BadMarker),
        ]
    }

    fn histories() -> impl Strategy<Value = Vec<Action>> {
        prop::collection::vec(actions(), 0..150)
    }

    impl Exec {
        fn pick(&self, i: usize) -> Option<WorkerId> {
            let n = self.workers.len();
            (n > 0).then(|| *self.workers.keys().nth(i % n).unwrap())
        }

        fn act(&mut self, a: Action) {
            if self.ended {
                return;
            }
            match a {
                Action::Join => {
                    self.join();
                }
                Action::Retire(i) => {
                    if self.workers.len() > 1 {
                        let w = self.pick(i).unwrap();
                        self.retire(w);
                    }
                }
                Action::Lose(i) => {
                    if let Some(w) = self.pick(i) {
                        self.lose(w);
                    }
                }
                Action::Step(i, k) => {
                    if let Some(w) = self.pick(i) {
                        self.step(w, k);
                    }
                }
                Action::Adjust(i) => {
                    if let Some(w) = self.pick(i) {
                        self.adjust(w);
                    }
                }
                Action::CaptureStored(i) => {
                    if let Some(w) = self.pick(i) {
                        self.capture_stored(w);
                    }
                }
                Action::CaptureFails(i) => {
                    if let Some(w) = self.pick(i) {
                        self.capture_fails(w);
                    }
                }
                Action::Report(i) => {
                    if let Some(w) = self.pick(i) {
                        self.report(w);
                    }
                }
                Action::HandBack(i) => {
                    if let Some(w) = self.pick(i).filter(|&w| self.chunk_of(w).is_some()) {
                        self.hand_back(w);
                    }
                }
                Action::Stray(w, c) => {
                    if !self.cut.waits_for(w, c) {
                        // Junk: accepted, it would break the restore.
                        let junk = Toy {
                            done: 1 << 40,
                            acc: f64::NAN,
                        };
                        self.captured(w, c, Ok(Captured::State(part(junk))));
                        self.captured(w, c, Ok(Captured::Output(encode_output(f64::NAN))));
                    }
                }
                Action::Request => {
                    self.request();
                }
                Action::Suspend(reply) => {
                    self.suspend(reply);
                }
                Action::Written(commit) => {
                    if self.write.is_some() {
                        self.written(if commit {
                            Written::Committed
                        } else {
                            Written::Failed
                        });
                    }
                }
                Action::BadMarker => self.bad_marker = true,
            }
            self.settle();
        }

        /// What the executor does after every event: poll the cut; the job ends with its
        /// phase (a write in flight still completes).
        fn settle(&mut self) {
            if self.ended {
                return;
            }
            self.poll();
            if self.core.phase_complete() {
                assert!(
                    !self.cut.is_open(),
                    "a complete phase leaves no chunk waiting"
                );
                if self.write.is_some() {
                    self.written(Written::Committed);
                }
                if !self.ended {
                    self.end();
                }
            }
        }

        /// Runs the job to its end: writes commit, workers step and answer at their
        /// adjustment points.
        fn drain(&mut self) {
            let mut guard = 0;
            while !self.ended {
                guard += 1;
                assert!(guard < 100_000, "no progress: {self:?}");
                if self.write.is_some() {
                    self.act(Action::Written(true));
                    continue;
                }
                if self.workers.is_empty() {
                    self.act(Action::Join);
                }
                for w in self.workers.keys().copied().collect::<Vec<_>>() {
                    if self
                        .workers
                        .get(&w)
                        .is_some_and(|w| w.interrupted || w.capture.is_some())
                    {
                        self.adjust(w);
                    } else {
                        self.step(w, 1000);
                    }
                    self.settle();
                }
            }
        }
    }

    proptest! {
        #[test]
        fn every_cut_holds_each_chunk_once_and_restores_to_the_sequential_fold(
            schedule in schedules(),
            chunking in chunkings(),
            n in phase_sizes(),
            history in histories(),
        ) {
            let mut x = Exec::new(schedule, n, chunking);
            x.act(Action::Join);
            for &a in &history {
                x.act(a);
            }
            x.drain();
            for r in 0..x.next_req {
                prop_assert!(x.answered.contains_key(&r), "requester {} never answered", r);
            }
        }

        /// The same histories, also checking that no chunk is handed out while a suspend is
        /// pending (its quiescence needs a halted core). Shrinks to the history of
        /// `a_suspend_asked_during_a_failing_suspend_write_keeps_the_core_halted`, e.g.
        /// `[Suspend(false), Adjust(0), Suspend(false), Join, Written(false)]`.
        #[test]
        fn a_pending_suspend_keeps_the_core_halted(
            schedule in schedules(),
            chunking in chunkings(),
            n in phase_sizes(),
            history in histories(),
        ) {
            let mut x = Exec::new(schedule, n, chunking);
            x.check_halted = true;
            x.act(Action::Join);
            for &a in &history {
                x.act(a);
            }
            x.drain();
        }
    }
}

// ----- rollback -----

#[test]
fn a_rollback_takes_every_unanswered_request_out_of_the_cut() {
    // Queued requests and a suspend's requesters.
    let mut x = Exec::dynamic(2, 10);
    let r1 = x.request();
    let s = x.suspend(true).unwrap();
    let (snapshots, suspend) = x.cut.take_requests();
    assert_eq!(snapshots, vec![r1]);
    assert_eq!(suspend, Some(vec![s]));
    assert!(!x.cut.suspending());
    assert_eq!(x.cut.take_requests(), (Vec::new(), None));

    // An open cut's requesters: it is dropped, and they are asked again.
    let mut x = Exec::dynamic(1, 10);
    let a = x.join();
    x.step(a, 4);
    let r = x.request();
    x.poll();
    assert_eq!(x.take(), vec![Did::Capture(a, 0)]);
    assert!(x.cut.is_open());
    let late = x.request();
    let (snapshots, suspend) = x.cut.take_requests();
    assert_eq!(snapshots, vec![r, late]);
    assert_eq!(suspend, None);
    assert!(!x.cut.is_open());
    assert!(!x.cut.waits_for(a, 0));
}

/// A rollback drops the chunks an open cut waits for, and what a dropped chunk leaves is no
/// state: the cut gives way at the loss, so that nothing a rollback abandons ever becomes a
/// part (a snapshot that committed empty states did not restore). Its requesters wait for
/// the restored run's cut; a cut already written completes.
#[test]
fn a_rollback_withdraws_an_open_cut_before_anything_is_abandoned() {
    let mut x = Exec::dynamic(2, 10);
    let (a, b) = (x.join(), x.join());
    x.step(a, 4);
    x.step(b, 3);
    let r = x.request();
    x.poll();
    assert_eq!(x.take().len(), 2, "captures of chunks 0 and 1");
    x.adjust(a); // chunk 0 captured before the loss
    assert!(x.cut.is_open(), "still waits for chunk 1");
    let mut out = Vec::new();
    x.cut.give_way::<String>(&mut out);
    x.carry_out(out);
    assert_eq!(x.take(), vec![Did::Withdraw(b)]);
    assert!(!x.cut.is_open() && !x.cut.is_writing());
    // The abandoned chunk's empty answer reaches a cut that no longer waits for it.
    x.captured(b, 1, Ok(Captured::State(Part::New(Vec::new()))));
    assert!(x.take().is_empty());
    assert!(x.write.is_none(), "nothing is written");
    let (snapshots, suspend) = x.cut.take_requests();
    assert_eq!((snapshots, suspend), (vec![r], None));

    // A cut being written is not touched.
    let mut x = Exec::dynamic(1, 10);
    let a = x.join();
    x.step(a, 2);
    let r = x.request();
    x.poll();
    x.take();
    x.adjust(a);
    assert!(x.cut.is_writing());
    let mut out = Vec::new();
    x.cut.give_way::<String>(&mut out);
    assert!(out.is_empty());
    assert!(x.cut.is_writing());
    x.written(Written::Committed);
    assert_eq!(x.answered[&r], Answer::Committed);
}
