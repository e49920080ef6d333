//! The shared schedule suite: a simulated cluster drives the core through random joins,
//! retirements, losses, hand-backs and steps; every index must be covered exactly once and the
//! value must equal the sequential fold, for every schedule.

use std::collections::HashMap;

use proptest::prelude::*;

use super::*;
use crate::reduce::{CollectInOrder, Sum};
use crate::schedule::{Chunking, Guided};

/// A simulated chunk: the next index to cover and the indices covered so far.
#[derive(Debug, Clone, PartialEq)]
struct SimChunk {
    next: u64,
    end: u64,
    seen: Vec<u64>,
}

#[derive(Debug, Clone, Copy)]
enum Action {
    Join,
    Retire(usize),
    Lose(usize),
    Step(usize, u64),
    Report(usize),
    Interrupt(usize),
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        1 => Just(Action::Join),
        1 => any::<usize>().prop_map(Action::Retire),
        1 => any::<usize>().prop_map(Action::Lose),
        8 => (any::<usize>(), 1..50u64).prop_map(|(w, k)| Action::Step(w, k)),
        1 => any::<usize>().prop_map(Action::Report),
        1 => any::<usize>().prop_map(Action::Interrupt),
    ]
}

fn schedules() -> impl Strategy<Value = Schedule> {
    prop_oneof![
        Just(Schedule::Dynamic),
        Just(Schedule::Static),
        (1..8u32, 1..20u64)
            .prop_map(|(workers, min_chunk)| Schedule::Guided(Guided { workers, min_chunk })),
    ]
}

fn chunkings() -> impl Strategy<Value = Chunking> {
    prop_oneof![
        (1..300u64).prop_map(Chunking::Count),
        (1..300u64).prop_map(Chunking::Size)
    ]
}

struct Sim {
    core: Core<CollectInOrder<u64>, SimChunk>,
    running: HashMap<WorkerId, (ChunkId, SimChunk)>,
    workers: Vec<WorkerId>,
    next_id: WorkerId,
    out: Vec<Command<SimChunk>>,
}

impl Sim {
    fn apply(&mut self) {
        while !self.out.is_empty() {
            self.apply_once();
        }
    }

    fn apply_once(&mut self) {
        for cmd in std::mem::take(&mut self.out) {
            match cmd {
                Command::Run {
                    worker,
                    chunk,
                    range,
                    state,
                } => {
                    let st = state.unwrap_or(SimChunk {
                        next: range.start,
                        end: range.end,
                        seen: Vec::new(),
                    });
                    assert_eq!(st.end, range.end);
                    assert!(
                        self.running.insert(worker, (chunk, st)).is_none(),
                        "two chunks on one worker"
                    );
                }
                Command::Interrupt { worker } => {
                    // The worker answers at its next adjustment point.
                    if let Some((c, st)) = self.running.remove(&worker) {
                        self.event(Event::Yielded {
                            worker,
                            chunk: c,
                            state: st,
                            work: Work::default(),
                        });
                    }
                }
                Command::Release { worker } => {
                    assert!(
                        !self.running.contains_key(&worker),
                        "released while running"
                    );
                    self.workers.retain(|&w| w != worker);
                }
            }
        }
    }

    fn event(&mut self, e: Event<SimChunk, Vec<u64>>) {
        let mut out = Vec::new();
        self.core
            .handle(e, &mut out)
            .expect("a well-behaved worker's event is accepted");
        self.out.extend(out);
    }

    /// No idle worker is left waiting while a chunk is pending for it: nothing else would
    /// wake it.
    fn check_liveness(&self) {
        if self.core.halted {
            return;
        }
        for &w in &self.core.idle {
            let pending_for_w = match &self.core.pending {
                Pending::Pile(p) => !p.is_empty(),
                Pending::Deal(d) => !d.queue(w).is_empty(),
                Pending::Owned(o) => !o.queue(w).is_empty(),
            };
            assert!(
                !pending_for_w,
                "worker {w} idles with a chunk pending for it"
            );
        }
    }

    fn pick(&self, i: usize) -> Option<WorkerId> {
        (!self.workers.is_empty()).then(|| self.workers[i % self.workers.len()])
    }

    fn act(&mut self, a: Action) {
        match a {
            Action::Join => {
                let w = self.next_id;
                self.next_id += 1;
                self.workers.push(w);
                self.event(Event::Joined { worker: w });
            }
            Action::Retire(i) => {
                if self.workers.len() > 1 {
                    let w = self.pick(i).unwrap();
                    self.event(Event::Retire { worker: w });
                }
            }
            Action::Lose(i) => {
                if self.workers.len() > 1 {
                    let w = self.pick(i).unwrap();
                    self.workers.retain(|&x| x != w);
                    self.running.remove(&w);
                    self.event(Event::Lost { worker: w });
                }
            }
            Action::Step(i, k) => {
                let Some(w) = self.pick(i) else { return };
                let Some((c, st)) = self.running.get_mut(&w) else {
                    return;
                };
                let stop = st.end.min(st.next + k);
                st.seen.extend(st.next..stop);
                st.next = stop;
                if st.next == st.end {
                    let (c, st) = (*c, self.running.remove(&w).unwrap().1);
                    let work = Work {
                        iterations: k,
                        busy: Duration::from_micros(k),
                    };
                    self.event(Event::Done {
                        kept: None,
                        worker: w,
                        chunk: c,
                        output: st.seen,
                        work,
                    });
                }
            }
            Action::Report(i) => {
                let Some(w) = self.pick(i) else { return };
                if let Some((c, st)) = self.running.get(&w) {
                    let (c, st) = (*c, st.clone());
                    self.event(Event::StateReport {
                        worker: w,
                        chunk: c,
                        state: st,
                    });
                }
            }
            Action::Interrupt(i) => {
                let Some(w) = self.pick(i) else { return };
                if let Some((c, st)) = self.running.remove(&w) {
                    self.event(Event::Yielded {
                        worker: w,
                        chunk: c,
                        state: st,
                        work: Work::default(),
                    });
                }
            }
        }
        self.apply();
        self.check_liveness();
    }
}

/// Runs `actions`, then drains with one steady worker; returns the phase value.
fn simulate(schedule: Schedule, chunking: Chunking, n: u64, actions: &[Action]) -> Vec<u64> {
    let plan = Plan::new(n, schedule, chunking);
    let mut sim = Sim {
        core: Core::new(schedule, plan, CollectInOrder::new()),
        running: HashMap::new(),
        workers: Vec::new(),
        next_id: 0,
        out: Vec::new(),
    };
    sim.act(Action::Join);
    for &a in actions {
        sim.act(a);
    }
    // Drain: every worker steps until the phase completes. Static may leave a worker idle with
    // chunks queued elsewhere, so step all of them round-robin.
    let mut guard = 0;
    while !sim.core.phase_complete() {
        if sim.workers.is_empty() {
            sim.act(Action::Join); // everyone retired: a new worker joins
        }
        for i in 0..sim.workers.len() {
            sim.act(Action::Step(i, 1000));
        }
        guard += 1;
        assert!(guard < 100_000, "no progress: {:?}", sim.core);
    }
    assert!(sim.core.pending_is_empty());
    sim.core.finish_phase()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn every_index_exactly_once(schedule in schedules(), chunking in chunkings(), n in 0..2000u64, actions in prop::collection::vec(action(), 0..200)) {
        let value = simulate(schedule, chunking, n, &actions);
        prop_assert_eq!(value, (0..n).collect::<Vec<_>>());
    }
}

#[test]
fn f64_sum_is_the_chunked_sequential_fold() {
    // Outputs arrive in reverse order; the merge still folds in chunk order.
    let plan = Plan::new(1000, Schedule::Dynamic, Chunking::Size(7));
    let xs: Vec<f64> = (0..1000).map(|i| 1.0 / (1.0 + i as f64)).collect();
    let chunk_sum = |c: u64| {
        plan.range(c)
            .map(|i| xs[i as usize])
            .fold(0.0, |a, x| a + x)
    };
    let mut core: Core<Sum<f64>, ()> = Core::new(Schedule::Dynamic, plan.clone(), Sum::new());
    let mut out = Vec::new();
    for w in 0..plan.len() {
        core.handle(Event::Joined { worker: w }, &mut out).unwrap();
    }
    let runs: Vec<(WorkerId, ChunkId)> = out
        .drain(..)
        .map(|c| match c {
            Command::Run { worker, chunk, .. } => (worker, chunk),
            other => panic!("{other:?}"),
        })
        .collect();
    for &(w, c) in runs.iter().rev() {
        core.handle(
            Event::Done {
                kept: None,
                worker: w,
                chunk: c,
                output: chunk_sum(c),
                work: Work::default(),
            },
            &mut out,
        )
        .unwrap();
    }
    let expected = (0..plan.len()).map(chunk_sum).fold(0.0, |a, x| a + x);
    assert_eq!(core.finish_phase().to_bits(), expected.to_bits());
}

#[test]
fn hostile_events_are_rejected_without_change() {
    let plan = Plan::new(10, Schedule::Dynamic, Chunking::Size(5));
    let mut core: Core<Sum<u64>, ()> = Core::new(Schedule::Dynamic, plan, Sum::new());
    let mut out = Vec::new();
    core.handle(Event::Joined { worker: 1 }, &mut out).unwrap();
    assert_eq!(out.len(), 1);
    assert!(core.handle(Event::Joined { worker: 1 }, &mut out).is_err());
    assert!(
        core.handle(
            Event::Done {
                kept: None,
                worker: 1,
                chunk: 1,
                output: 5,
                work: Work::default()
            },
            &mut out
        )
        .is_err()
    );
    assert!(
        core.handle(
            Event::Done {
                kept: None,
                worker: 9,
                chunk: 0,
                output: 5,
                work: Work::default()
            },
            &mut out
        )
        .is_err()
    );
    core.handle(
        Event::Done {
            kept: None,
            worker: 1,
            chunk: 0,
            output: 5,
            work: Work::default(),
        },
        &mut out,
    )
    .unwrap();
    assert!(
        core.handle(
            Event::Done {
                kept: None,
                worker: 1,
                chunk: 0,
                output: 5,
                work: Work::default()
            },
            &mut out
        )
        .is_err(),
        "a second Done is refused"
    );
    assert_eq!(core.progress(), (5, 10));
}

#[test]
fn lost_worker_restarts_from_last_reported_state() {
    let plan = Plan::new(10, Schedule::Dynamic, Chunking::Size(10));
    let mut core: Core<Sum<u64>, u32> = Core::new(Schedule::Dynamic, plan, Sum::new());
    let mut out = Vec::new();
    core.handle(Event::Joined { worker: 1 }, &mut out).unwrap();
    core.handle(
        Event::StateReport {
            worker: 1,
            chunk: 0,
            state: 42,
        },
        &mut out,
    )
    .unwrap();
    out.clear();
    core.handle(Event::Lost { worker: 1 }, &mut out).unwrap();
    assert!(out.is_empty());
    core.handle(Event::Joined { worker: 2 }, &mut out).unwrap();
    assert_eq!(
        out,
        vec![Command::Run {
            worker: 2,
            chunk: 0,
            range: 0..10,
            state: Some(42)
        }]
    );
}

#[test]
fn retire_hands_back_then_releases() {
    let plan = Plan::new(4, Schedule::Dynamic, Chunking::Size(1));
    let mut core: Core<Sum<u64>, u32> = Core::new(Schedule::Dynamic, plan, Sum::new());
    let mut out = Vec::new();
    core.handle(Event::Joined { worker: 1 }, &mut out).unwrap();
    core.handle(Event::Joined { worker: 2 }, &mut out).unwrap();
    out.clear();
    core.handle(Event::Retire { worker: 1 }, &mut out).unwrap();
    assert_eq!(out, vec![Command::Interrupt { worker: 1 }]);
    out.clear();
    core.handle(
        Event::Yielded {
            worker: 1,
            chunk: 0,
            state: 7,
            work: Work::default(),
        },
        &mut out,
    )
    .unwrap();
    assert_eq!(out, vec![Command::Release { worker: 1 }]);
    out.clear();
    core.handle(
        Event::Done {
            kept: None,
            worker: 2,
            chunk: 1,
            output: 1,
            work: Work::default(),
        },
        &mut out,
    )
    .unwrap();
    assert_eq!(
        out,
        vec![Command::Run {
            worker: 2,
            chunk: 0,
            range: 0..1,
            state: Some(7)
        }]
    );
}

/// Halts the core (every running chunk is handed back), copies what a snapshot keeps, and
/// builds a new core from it, as a restore in another process would.
fn snapshot_and_restore(sim: &mut Sim, schedule: Schedule) -> Core<CollectInOrder<u64>, SimChunk> {
    sim.core.halt(&mut sim.out);
    sim.apply();
    assert_eq!(sim.core.running().count(), 0);
    let (merged, value, held) = sim.core.merge_state();
    let (value, held): (Vec<u64>, Vec<(ChunkId, Vec<u64>)>) =
        (value.clone(), held.map(|(c, v)| (c, v.clone())).collect());
    let suspended: Vec<(ChunkId, SimChunk)> =
        sim.core.suspended().map(|(c, s)| (c, s.clone())).collect();
    Core::restore(
        schedule,
        sim.core.plan().clone(),
        CollectInOrder::new(),
        merged,
        value,
        held,
        suspended,
        Vec::new(),
    )
    .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn restore_midway_covers_each_index_once(
        schedule in schedules(),
        chunking in chunkings(),
        n in 0..2000u64,
        before in prop::collection::vec(action(), 0..150),
        after in prop::collection::vec(action(), 0..150),
    ) {
        let plan = Plan::new(n, schedule, chunking);
        let mut sim = Sim { core: Core::new(schedule, plan, CollectInOrder::new()), running: HashMap::new(), workers: Vec::new(), next_id: 0, out: Vec::new() };
        sim.act(Action::Join);
        for &a in &before {
            sim.act(a);
        }
        let core = snapshot_and_restore(&mut sim, schedule);
        let mut sim = Sim { core, running: HashMap::new(), workers: Vec::new(), next_id: 100, out: Vec::new() };
        sim.act(Action::Join);
        for &a in &after {
            sim.act(a);
        }
        let mut guard = 0;
        while !sim.core.phase_complete() {
            if sim.workers.is_empty() {
                sim.act(Action::Join);
            }
            for i in 0..sim.workers.len() {
                sim.act(Action::Step(i, 1000));
            }
            guard += 1;
            prop_assert!(guard < 100_000);
        }
        prop_assert_eq!(sim.core.finish_phase(), (0..n).collect::<Vec<_>>());
    }
}

#[test]
fn restore_refuses_a_ledger_that_does_not_fit() {
    let plan = Plan::new(10, Schedule::Dynamic, Chunking::Size(1));
    let r = |merged, done: Vec<(u64, u64)>, susp: Vec<(u64, ())>| {
        Core::<Sum<u64>, ()>::restore(
            Schedule::Dynamic,
            plan.clone(),
            Sum::new(),
            merged,
            0,
            done,
            susp,
            Vec::new(),
        )
        .err()
    };
    assert!(r(11, vec![], vec![]).is_some());
    assert!(r(2, vec![(1, 0)], vec![]).is_some(), "done below merged");
    assert!(r(2, vec![(10, 0)], vec![]).is_some(), "out of range");
    assert!(r(2, vec![(5, 0)], vec![(5, ())]).is_some(), "listed twice");
    assert!(r(2, vec![(5, 0)], vec![(3, ())]).is_none());
}

#[test]
fn static_retire_wakes_an_idle_worker_that_inherits_chunks() {
    // Two workers, chunks 0..4 dealt 0,2 → worker 0 and 1,3 → worker 1. Worker 1 finishes
    // its queue and idles; retiring worker 0 deals its pending chunk 2 to worker 1, which must
    // get it at once (nothing else would wake it).
    let plan = Plan::new(4, Schedule::Static, Chunking::Size(1));
    let mut core: Core<Sum<u64>, u32> = Core::new(Schedule::Static, plan, Sum::new());
    let mut out = Vec::new();
    core.handle(Event::Joined { worker: 0 }, &mut out).unwrap();
    core.handle(Event::Joined { worker: 1 }, &mut out).unwrap();
    let done = |c| Event::Done {
        kept: None,
        worker: 1,
        chunk: c,
        output: 1,
        work: Work::default(),
    };
    core.handle(done(1), &mut out).unwrap();
    assert!(out.contains(&Command::Run {
        worker: 1,
        chunk: 3,
        range: 3..4,
        state: None
    }));
    out.clear();
    core.handle(done(3), &mut out).unwrap();
    assert!(
        out.is_empty(),
        "worker 1's queue is empty: it idles: {out:?}"
    );
    out.clear();
    core.handle(Event::Retire { worker: 0 }, &mut out).unwrap();
    assert!(out.contains(&Command::Interrupt { worker: 0 }), "{out:?}");
    assert!(
        out.contains(&Command::Run {
            worker: 1,
            chunk: 2,
            range: 2..3,
            state: None
        }),
        "{out:?}"
    );
}

#[test]
fn workers_retired_together_are_handed_nothing_the_others_gave_up() {
    // Three workers, chunks 0..6 dealt 0,3 → worker 0; 1,4 → worker 1; 2,5 → worker 2.
    // Worker 2 finishes its queue and idles. Workers 1 and 2 (the slots of one process)
    // retire together: worker 1's pending chunk goes to worker 0, not to worker 2, which is
    // released.
    let plan = Plan::new(6, Schedule::Static, Chunking::Size(1));
    let retire = |together: bool| {
        let mut core: Core<Sum<u64>, u32> = Core::new(Schedule::Static, plan.clone(), Sum::new());
        let mut out = Vec::new();
        for worker in 0..3 {
            core.handle(Event::Joined { worker }, &mut out).unwrap();
        }
        for chunk in [2, 5] {
            let done = Event::Done {
                kept: None,
                worker: 2,
                chunk,
                output: 1,
                work: Work::default(),
            };
            core.handle(done, &mut out).unwrap();
        }
        out.clear();
        if together {
            core.retire_all(&[1, 2], &mut out).unwrap();
        } else {
            for worker in [1, 2] {
                core.handle(Event::Retire { worker }, &mut out).unwrap();
            }
        }
        out
    };
    let out = retire(true);
    assert!(out.contains(&Command::Interrupt { worker: 1 }), "{out:?}");
    assert!(out.contains(&Command::Release { worker: 2 }), "{out:?}");
    assert!(
        !out.iter()
            .any(|c| matches!(c, Command::Run { worker: 2, .. })),
        "{out:?}"
    );
    // One at a time, worker 2 was handed a chunk of the redeal before it retired in turn.
    let out = retire(false);
    assert!(
        out.iter()
            .any(|c| matches!(c, Command::Run { worker: 2, .. })),
        "{out:?}"
    );
    // An unknown worker among them: nothing changes.
    let mut core: Core<Sum<u64>, u32> = Core::new(Schedule::Static, plan.clone(), Sum::new());
    let mut out = Vec::new();
    core.handle(Event::Joined { worker: 0 }, &mut out).unwrap();
    out.clear();
    assert!(core.retire_all(&[0, 9], &mut out).is_err());
    assert!(out.is_empty(), "{out:?}");
}

/// An owned partition in the simulation: its range, its progress in the phase, the indices
/// of this phase it covered, and how many phases it finished.
#[derive(Debug, Clone, PartialEq)]
struct SimPart {
    start: u64,
    next: u64,
    end: u64,
    seen: Vec<u64>,
    phases: u64,
}

/// Owned partitions over several phases: workers join, retire, hand chunks back and report
/// states; every phase covers every index once, and every chunk runs in phase `p` from the
/// partition it ended phase `p - 1` with, never from scratch. A worker lost with a partition
/// it alone had after the first phase is reported as lost (never restarted from scratch).
fn simulate_owned(n: u64, chunks: u64, phases: u64, actions: &[Action]) -> Result<(), String> {
    simulate_owned_with(n, chunks, phases, actions, false)
}

/// [`simulate_owned`], where each `Run` also takes a grant of every partition queued after
/// it (as a worker process holding them all): the worker runs them in order without a `Run`
/// each, gives back the unstarted ones with `Returned` when interrupted, and loses them all
/// when lost.
fn simulate_owned_with(
    n: u64,
    chunks: u64,
    phases: u64,
    actions: &[Action],
    grants: bool,
) -> Result<(), String> {
    let plan = Plan::new(n, Schedule::Static, Chunking::Count(chunks));
    let mut core: Core<CollectInOrder<u64>, SimPart> =
        Core::new(Schedule::Static, plan.clone(), CollectInOrder::new()).with_partitions(0);
    let mut running: HashMap<WorkerId, (ChunkId, SimPart)> = HashMap::new();
    // Granted chunks not started yet, in order.
    let mut granted: HashMap<WorkerId, std::collections::VecDeque<(ChunkId, SimPart)>> =
        HashMap::new();
    let mut workers: Vec<WorkerId> = Vec::new();
    let mut next_id = 0;
    let mut out = Vec::new();
    let mut actions = actions.iter().copied();
    for phase in 0..phases {
        let mut guard = 0;
        loop {
            // Carry out commands.
            while !out.is_empty() {
                for cmd in std::mem::take(&mut out) {
                    match cmd {
                        Command::Run {
                            worker,
                            chunk,
                            range,
                            state,
                        } => {
                            let part = part_to_run(chunk, state, &range, phase)?;
                            if part.phases != phase || part.start != range.start {
                                return Err(format!(
                                    "chunk {chunk} ran from {part:?} in phase {phase}"
                                ));
                            }
                            assert!(running.insert(worker, (chunk, part)).is_none());
                            if grants {
                                let mut got = Vec::new();
                                let g = core.grant(worker, |c, s| {
                                    got.push((c, s.cloned()));
                                    true
                                });
                                let named: Vec<ChunkId> = g.iter().map(|(c, _)| *c).collect();
                                let took: Vec<ChunkId> = got.iter().map(|(c, _)| *c).collect();
                                assert_eq!(named, took);
                                for ((c, state), (_, range)) in got.into_iter().zip(g) {
                                    let part = part_to_run(c, state, &range, phase)?;
                                    granted.entry(worker).or_default().push_back((c, part));
                                }
                            }
                        }
                        Command::Interrupt { worker } => {
                            give_back(&mut core, &mut granted, worker, &mut out);
                            if let Some((c, p)) = running.remove(&worker) {
                                let e = Event::Yielded {
                                    worker,
                                    chunk: c,
                                    state: p,
                                    work: Work::default(),
                                };
                                core.handle(e, &mut out).unwrap();
                            }
                        }
                        Command::Release { worker } => {
                            assert!(!running.contains_key(&worker));
                            assert!(granted.get(&worker).is_none_or(|q| q.is_empty()));
                            workers.retain(|&w| w != worker);
                        }
                    }
                }
            }
            if !core.lost_partitions().is_empty() {
                // Reported, and nothing ran from scratch: the executor ends or rolls back.
                return Ok(());
            }
            if core.phase_complete() {
                break;
            }
            let pick = |i: usize, workers: &Vec<WorkerId>| {
                (!workers.is_empty()).then(|| workers[i % workers.len()])
            };
            match actions.next() {
                Some(Action::Join) | None if workers.is_empty() => {
                    workers.push(next_id);
                    core.handle(Event::Joined { worker: next_id }, &mut out)
                        .unwrap();
                    next_id += 1;
                }
                Some(Action::Join) => {
                    workers.push(next_id);
                    core.handle(Event::Joined { worker: next_id }, &mut out)
                        .unwrap();
                    next_id += 1;
                }
                Some(Action::Retire(i)) if workers.len() > 1 => {
                    let w = pick(i, &workers).unwrap();
                    core.handle(Event::Retire { worker: w }, &mut out).unwrap();
                }
                Some(Action::Lose(i)) if workers.len() > 1 => {
                    let w = pick(i, &workers).unwrap();
                    workers.retain(|&x| x != w);
                    running.remove(&w);
                    granted.remove(&w);
                    core.handle(Event::Lost { worker: w }, &mut out).unwrap();
                }
                Some(Action::Report(i)) => {
                    let report = pick(i, &workers)
                        .and_then(|w| running.get(&w).map(|(c, p)| (w, *c, p.clone())));
                    if let Some((w, c, p)) = report {
                        let e = Event::StateReport {
                            worker: w,
                            chunk: c,
                            state: p,
                        };
                        core.handle(e, &mut out).unwrap();
                    }
                }
                Some(Action::Interrupt(i)) => {
                    if let Some(w) = pick(i, &workers) {
                        give_back(&mut core, &mut granted, w, &mut out);
                        if let Some((c, p)) = running.remove(&w) {
                            let e = Event::Yielded {
                                worker: w,
                                chunk: c,
                                state: p,
                                work: Work::default(),
                            };
                            core.handle(e, &mut out).unwrap();
                        }
                    }
                }
                other => {
                    // Steps: every worker, or the one picked, moves on.
                    let (which, k) = match other {
                        Some(Action::Step(i, k)) => (pick(i, &workers), k),
                        _ => (None, 1000),
                    };
                    let ws: Vec<WorkerId> = match which {
                        Some(w) => vec![w],
                        None => workers.clone(),
                    };
                    for w in ws {
                        let Some((c, p)) = running.get_mut(&w) else {
                            continue;
                        };
                        let stop = p.end.min(p.next + k);
                        p.seen.extend(p.next..stop);
                        p.next = stop;
                        if p.next == p.end {
                            let (c, mut p) = (*c, running.remove(&w).unwrap().1);
                            let output = std::mem::take(&mut p.seen);
                            p.phases += 1;
                            let work = Work {
                                iterations: k,
                                busy: Duration::from_micros(k),
                            };
                            let e = Event::Done {
                                worker: w,
                                chunk: c,
                                output,
                                kept: Some(p),
                                work,
                            };
                            core.handle(e, &mut out).unwrap();
                            // The next granted chunk starts at once.
                            if let Some(next) = granted.get_mut(&w).and_then(|q| q.pop_front()) {
                                running.insert(w, next);
                            }
                        }
                    }
                }
            }
            guard += 1;
            assert!(guard < 100_000, "no progress: {core:?}");
        }
        let value = core.finish_phase();
        if value != (0..n).collect::<Vec<_>>() {
            return Err(format!("phase {phase} covered {value:?}"));
        }
        // The barrier: every partition is kept, and begins the next phase.
        let kept: Vec<ChunkId> = {
            let mut k: Vec<ChunkId> = core.kept().map(|(c, _)| c).collect();
            k.sort_unstable();
            k
        };
        if kept != (0..plan.len()).collect::<Vec<_>>() {
            return Err(format!("phase {phase} kept {kept:?}"));
        }
        for (_, p) in core.kept_mut() {
            p.next = p.start;
        }
        core.start_phase(plan.clone(), CollectInOrder::new(), &mut out);
    }
    Ok(())
}

/// The partition chunk `chunk` runs from: its state, or a new one in the first phase (from
/// scratch later is an error).
fn part_to_run(
    chunk: ChunkId,
    state: Option<SimPart>,
    range: &std::ops::Range<u64>,
    phase: u64,
) -> Result<SimPart, String> {
    match state {
        Some(p) => Ok(p),
        None if phase == 0 => Ok(SimPart {
            start: range.start,
            next: range.start,
            end: range.end,
            seen: Vec::new(),
            phases: 0,
        }),
        None => Err(format!("chunk {chunk} from scratch in phase {phase}")),
    }
}

/// The granted chunks `worker` has not started go back (`Returned`), as a worker process's
/// slot gives them back when interrupted.
fn give_back(
    core: &mut Core<CollectInOrder<u64>, SimPart>,
    granted: &mut HashMap<WorkerId, std::collections::VecDeque<(ChunkId, SimPart)>>,
    worker: WorkerId,
    out: &mut Vec<Command<SimPart>>,
) {
    let back: Vec<ChunkId> = granted
        .remove(&worker)
        .unwrap_or_default()
        .into_iter()
        .map(|(c, _)| c)
        .collect();
    if !back.is_empty() {
        let e = Event::Returned {
            worker,
            chunks: back,
        };
        core.handle(e, out).unwrap();
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn granted_partitions_run_from_their_last_phase(n in 0..600u64, chunks in 1..40u64, phases in 1..5u64, actions in prop::collection::vec(action(), 0..300)) {
        let r = simulate_owned_with(n, chunks, phases, &actions, true);
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
    }

    #[test]
    fn owned_partitions_run_from_their_last_phase(n in 0..600u64, chunks in 1..40u64, phases in 1..5u64, actions in prop::collection::vec(action(), 0..300)) {
        let r = simulate_owned(n, chunks, phases, &actions);
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
    }
}

/// A worker lost after the first phase with the only state of its partition: the core says
/// so instead of running the chunk from scratch.
#[test]
fn a_partition_lost_after_the_first_phase_is_reported() {
    let plan = Plan::new(10, Schedule::Static, Chunking::Count(2));
    let mut core: Core<CollectInOrder<u64>, u64> =
        Core::new(Schedule::Static, plan.clone(), CollectInOrder::new()).with_partitions(1);
    let mut out = Vec::new();
    core.handle(Event::Joined { worker: 0 }, &mut out).unwrap();
    core.handle(Event::Joined { worker: 1 }, &mut out).unwrap();
    assert_eq!(core.running().count(), 2);
    core.handle(Event::Lost { worker: 1 }, &mut out).unwrap();
    assert_eq!(core.lost_partitions().len(), 1);
    // Without its state the chunk is not handed out again.
    let running: Vec<_> = core.running().collect();
    assert_eq!(running.len(), 1);
}

/// The slots of one worker process join together: quietly, then the last one's `Joined`
/// deals the owned partitions once and hands a chunk to every one of them. A slot that
/// joins twice is refused, quietly or not.
#[test]
fn slots_that_join_quietly_are_dealt_with_the_last_one() {
    let plan = Plan::new(16, Schedule::Static, Chunking::Count(8));
    let mut core: Core<Sum<u64>, u32> =
        Core::new(Schedule::Static, plan, Sum::new()).with_partitions(0);
    let mut out = Vec::new();
    for w in 0..3 {
        core.set_process(w, ProcessId(7));
        core.join_quietly(w).unwrap();
    }
    // Nothing was dealt yet: no quiet slot runs a chunk.
    assert!((0..3).all(|w| core.running_on(w).is_none()));
    assert_eq!(core.join_quietly(1).unwrap_err().reason, "joined twice");
    core.set_process(3, ProcessId(7));
    core.handle(Event::Joined { worker: 3 }, &mut out).unwrap();
    let mut runs: Vec<(WorkerId, ChunkId)> = out
        .iter()
        .filter_map(|c| match c {
            Command::Run { worker, chunk, .. } => Some((*worker, *chunk)),
            _ => None,
        })
        .collect();
    runs.sort_unstable();
    // Every slot runs one chunk: the process's block is dealt to its slots in turn.
    assert_eq!(runs, vec![(0, 0), (1, 1), (2, 2), (3, 3)]);
    assert!(core.handle(Event::Joined { worker: 3 }, &mut out).is_err());
}

/// A worker granted the partitions queued after its chunk runs them without a `Run` each:
/// they count as running on it, each report (in any order) takes one off, and an interrupt
/// gives the unstarted ones back with their states; a `Returned` that names a chunk it was
/// not granted, or one twice, is refused and changes nothing.
#[test]
fn granted_partitions_count_as_running_until_reported_or_returned() {
    let plan = Plan::new(8, Schedule::Static, Chunking::Count(4));
    let mut core: Core<Sum<u64>, u64> =
        Core::new(Schedule::Static, plan.clone(), Sum::new()).with_partitions(0);
    let mut out = Vec::new();
    let done = |core: &mut Core<Sum<u64>, u64>, out: &mut Vec<_>, chunk| {
        let e = Event::Done {
            worker: 0,
            chunk,
            output: chunk,
            kept: Some(chunk * 10),
            work: Work::default(),
        };
        core.handle(e, out)
    };
    core.handle(Event::Joined { worker: 0 }, &mut out).unwrap();
    // The first phase: nothing held yet, so nothing held to grant.
    assert!(core.grant(0, |_, s| s.is_some()).is_empty());
    for c in 0..4 {
        done(&mut core, &mut out, c).unwrap();
    }
    assert!(core.phase_complete());
    core.finish_phase();
    out.clear();
    core.start_phase(plan, Sum::new(), &mut out);
    assert!(matches!(out[..], [Command::Run { chunk: 0, .. }]));
    let granted: Vec<ChunkId> = core
        .grant(0, |_, _| true)
        .into_iter()
        .map(|g| g.0)
        .collect();
    assert_eq!(granted, [1, 2, 3]);
    assert_eq!(core.running().count(), 4);
    // Chunk 2 reports before 0 and 1; the worker runs 0 still.
    out.clear();
    done(&mut core, &mut out, 2).unwrap();
    assert_eq!(core.running_on(0), Some(0));
    done(&mut core, &mut out, 0).unwrap();
    assert_eq!(core.running_on(0), Some(1));
    assert!(out.is_empty(), "no Run for a granted chunk: {out:?}");
    // Refused: a chunk not granted, one twice, nothing.
    for bad in [vec![0], vec![3, 3], vec![]] {
        let e = Event::Returned {
            worker: 0,
            chunks: bad,
        };
        assert!(core.handle(e, &mut out).is_err());
    }
    assert_eq!(core.running().count(), 2);
    // Interrupted while it runs 1: 3 comes back with its state and runs next.
    let e = Event::Returned {
        worker: 0,
        chunks: vec![3],
    };
    core.handle(e, &mut out).unwrap();
    assert_eq!(core.suspended().collect::<Vec<_>>(), [(3, &30)]);
    done(&mut core, &mut out, 1).unwrap();
    assert!(
        matches!(
            out[..],
            [Command::Run {
                chunk: 3,
                state: Some(30),
                ..
            }]
        ),
        "{out:?}"
    );
    done(&mut core, &mut out, 3).unwrap();
    assert!(core.phase_complete());
}
