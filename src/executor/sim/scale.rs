//! The coordinator at scale: the pure coordinator (`State`) driven with many simulated worker
//! processes that answer at once, and the time spent in the coordinator measured per phase
//! (`benches/coordinator_scale.rs` prints it for up to 10,000 processes).
//!
//! The job is the simulation's grid (`SimGrid`) with one row of three cells per band, so that
//! a partition is a few dozen bytes and a process's work is small. `processes` processes of
//! one thread (four slots) join one after another before any of them answers, as they dial
//! a fresh coordinator; the grid has `processes * partitions` bands, so each process holds
//! `partitions` of them once the first phase has placed them. Then each process, in turn,
//! takes every message on its way to it, runs every chunk it was given and sends every
//! answer; the coordinator takes each answer as it comes. No time passes (no heartbeat, no
//! lease), no fault is injected and no snapshot is asked for.
//!
//! # What is measured
//!
//! The coordinator's time only: an [`Instant`] is read around each call into `State`
//! (`join_remote`, `on_remote`) together with the routing of the orders it queued (its
//! outbox moved to the processes' inboxes); the simulated processes' work (decoding, running
//! chunks, encoding answers) runs between those readings and is not counted. A call is
//! counted in the phase that was running when it started: a phase's time includes its
//! barrier and the orders that start the next phase. Nothing here reads a clock inside
//! `State` (its layering stays as it is).

// Public for `malleable::__bench` (the `sim` feature); the crate's own tests build it without.
#![cfg_attr(not(feature = "sim"), allow(unreachable_pub))]

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::{SimGrid, SimProcess, fresh_state, sequential};
use crate::executor::{Builder, Outcome, first_phase};
use crate::rows::Banded;
use crate::schedule::ProcessId;
use crate::schedule::idhash::IdMap;
use crate::wire::frame::ToWorker;

/// Cells per row: the least the grid's relaxation needs (one inner cell).
const WIDTH: usize = 3;

/// What the coordinator spent on one run of
/// [`coordinator_phases`](crate::__bench::coordinator_phases).
#[derive(Debug, Clone, Default)]
pub struct Spent {
    /// The coordinator's time to take the processes in (`join_remote` for each, and the
    /// first phase's orders it queued meanwhile).
    pub joins: Duration,
    /// The coordinator's time in each phase, from the first answer of the phase to the
    /// barrier that ends it (the next phase's orders, or the job's end, included).
    pub phases: Vec<Duration>,
    /// Messages the coordinator took from the processes.
    pub received: u64,
    /// Messages the coordinator sent to the processes.
    pub sent: u64,
    /// The fewest and the most partitions a process ran in the last phase.
    pub held: (usize, usize),
    /// The whole run's wall time, the simulated processes' work included.
    pub wall: Duration,
}

/// A simulated worker process and the messages on their way to it.
struct Proc {
    id: ProcessId,
    sim: SimProcess<Banded<SimGrid>>,
    inbox: VecDeque<ToWorker>,
    /// Whether it is in the queue of processes with something to do.
    queued: bool,
    /// The last phase it was told to run a partition in, and how many it was told to run
    /// in that phase.
    runs: (u64, usize),
}

/// A run of the grid on `processes` processes of `partitions` partitions each, for `phases`
/// phases, with the coordinator's time measured (see the module's docs). The value is
/// checked against the sequential loop's: an error says how it differs or how the run
/// ended instead.
pub fn coordinator_phases(
    processes: usize,
    partitions: usize,
    phases: u64,
) -> Result<Spent, String> {
    let wall = Instant::now();
    let bands = (processes * partitions).max(1) as u64;
    let grid = SimGrid {
        n: bands,
        w: WIDTH,
        bands,
        phases: phases.max(1),
        done: 0,
    };
    let expected = sequential(&grid);
    let mut config = Builder::default().config;
    config.local_workers = 0;
    config.check_store = None;
    let job = Banded(grid);
    let (core, chunking) = first_phase(&job, &config).map_err(|e| e.to_string())?;
    config.chunking = chunking;
    let config = std::sync::Arc::new(config);
    let mut state = fresh_state(&config, core, job, 0, 0, Default::default());

    let mut spent = Spent::default();
    let mut procs: Vec<Proc> = Vec::with_capacity(processes);
    let mut index: IdMap<ProcessId, usize> = IdMap::default();
    let mut ready: VecDeque<usize> = VecDeque::new();

    // Moves what the coordinator queued to the processes' inboxes; drops orders for local
    // workers (there are none) and store operations (no store is set).
    let route = |state: &mut super::State<Banded<SimGrid>>,
                 procs: &mut Vec<Proc>,
                 index: &IdMap<ProcessId, usize>,
                 ready: &mut VecDeque<usize>,
                 sent: &mut u64| {
        state.pause = None;
        for (id, msg) in state.remote.take_outbox() {
            if let Some(&i) = index.get(&id) {
                let p = &mut procs[i];
                // Partitions run: each `Run` and what it grants, alone or in a batch.
                let runs = |m: &ToWorker| match m {
                    ToWorker::Run { then, .. } => 1 + then.len(),
                    _ => 0,
                };
                let ran = match &msg {
                    ToWorker::Batch(b) => b.iter().map(runs).sum(),
                    m => runs(m),
                };
                if ran > 0 {
                    if p.runs.0 != state.phase {
                        p.runs = (state.phase, 0);
                    }
                    p.runs.1 += ran;
                }
                p.inbox.push_back(msg);
                *sent += 1;
                if !p.queued {
                    p.queued = true;
                    ready.push_back(i);
                }
            }
        }
        state.orders.clear();
        state.store_ops.clear();
    };

    let t = Instant::now();
    state.watch_start();
    state.settle();
    route(&mut state, &mut procs, &index, &mut ready, &mut spent.sent);
    spent.joins += t.elapsed();
    for k in 0..processes {
        let name = format!("process {k}");
        let now = Instant::now();
        let sim = SimProcess::new(1, (super::HEARTBEAT, super::LEASE), None, now);
        let t = Instant::now();
        let id = state.join_remote(name, 1, "node");
        index.insert(id, procs.len());
        procs.push(Proc {
            id,
            sim,
            inbox: VecDeque::new(),
            queued: false,
            runs: (0, 0),
        });
        route(&mut state, &mut procs, &index, &mut ready, &mut spent.sent);
        spent.joins += t.elapsed();
    }

    while let Some(i) = ready.pop_front() {
        if state.outcome_ready() {
            break;
        }
        procs[i].queued = false;
        // The process takes what is on its way, runs all it was given, and answers.
        let now = Instant::now();
        let p = &mut procs[i];
        while let Some(msg) = p.inbox.pop_front() {
            p.sim.receive(now, msg);
        }
        loop {
            let busy = p.sim.busy_threads();
            if busy.is_empty() && p.sim.background() == 0 {
                break;
            }
            for t in busy {
                p.sim.turn(t);
            }
            while p.sim.background() > 0 {
                p.sim.settle(0);
            }
        }
        let id = procs[i].id;
        while let Some(msg) = procs[i].sim.next_sent() {
            let phase = state.phase;
            let t = Instant::now();
            let taken = state.on_remote(id, msg);
            route(&mut state, &mut procs, &index, &mut ready, &mut spent.sent);
            let took = t.elapsed();
            spent.received += 1;
            let k = phase as usize;
            if spent.phases.len() <= k {
                spent.phases.resize(k + 1, Duration::ZERO);
            }
            spent.phases[k] += took;
            if let Err(e) = taken {
                return Err(format!("{id} was refused: {e}"));
            }
        }
        if let Some(e) = procs[i].sim.ended() {
            return Err(format!("{id} ended: {e:?}"));
        }
    }
    let last = procs.iter().map(|p| p.runs.0).max().unwrap_or(0);
    spent.held = procs.iter().fold((usize::MAX, 0), |(lo, hi), p| {
        let n = if p.runs.0 == last { p.runs.1 } else { 0 };
        (lo.min(n), hi.max(n))
    });
    spent.wall = wall.elapsed();
    match state.result.take() {
        Some(Ok(Outcome::Finished(f))) => {
            let got = f.into_value();
            if got != expected {
                let row = (0..got.len().min(expected.len())).find(|&i| got[i] != expected[i]);
                return Err(format!(
                    "the value differs from the sequential loop's at row {row:?}"
                ));
            }
            Ok(spent)
        }
        Some(other) => Err(format!("the job ended with {other:?}")),
        None => Err(format!(
            "the run stopped in phase {} with nothing left to deliver",
            state.phase
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bench's driver at a small size: 20 processes of 4 partitions, 3 phases, end with
    /// the sequential loop's value, every process holding its share.
    #[test]
    fn the_scale_driver_ends_with_the_sequential_value() {
        let spent = coordinator_phases(20, 4, 3).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(spent.phases.len(), 3, "{spent:?}");
        assert!(spent.received > 0 && spent.sent > 0, "{spent:?}");
        assert_eq!(spent.held, (4, 4), "{spent:?}");
    }
}
