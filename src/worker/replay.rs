//! Local recovery's replay (`ToWorker::Recover`): partitions lost with another process are
//! made again here from the buddy copies this process keeps of them, phase by phase, with the
//! job values of those phases and the pieces their other neighbours exported then (from the
//! senders' halo logs), exactly as they ran where they were lost.
//!
//! The partitions replayed together are all of one lost process's (those with a copy here):
//! a piece one of them exports for another in a phase is handed over here, as the barrier
//! would have. Each phase of each partition is what the thread runner does (`run::run`:
//! `running_in`, the steps, the export, an output phase's `Partition::output`) after the
//! barrier's `begin_phase` with its pieces in sender order; so the states are the ones the
//! lost process had, bit for bit, whatever the order here. It runs on a thread of its own:
//! a replay is phases of computing, and the process's I/O goes on meanwhile.

use std::collections::BTreeMap;
use std::ops::Range;

use bytes::Bytes;

use crate::codec;
use crate::exchange::Outbox;
use crate::job::Job;
use crate::metrics::StepStats;
use crate::run::{Assignment, Attend, Cell, Held, Host, Inputs, Ran, catch, run};

/// A replay to carry out, as the machine hands it to the pump.
#[derive(Debug, Clone)]
pub(crate) struct Replay {
    /// The `Recover`'s attempt.
    pub(crate) attempt: u64,
    /// The phase of the copies.
    pub(crate) copy_phase: u64,
    /// The phase the job is in.
    pub(crate) phase: u64,
    /// The job's number of chunks.
    pub(crate) chunks: u64,
    /// `(chunk, range, done, copy)`: each partition, whether it runs `phase` too (else it
    /// only begins it), and its copy's bytes.
    pub(crate) parts: Vec<(u64, Range<u64>, bool, Bytes)>,
    /// `(phase, job value)` for `copy_phase..=phase` (the copies export their pieces of
    /// `copy_phase` with the first).
    pub(crate) jobs: Vec<(u64, Bytes)>,
    /// `(phase, sender, receiver, piece)`: pieces exported at the end of `phase` by
    /// partitions not replayed here.
    pub(crate) halos: Vec<(u64, u64, u64, Bytes)>,
}

/// Each partition replayed: its chunk, its state, what it exported at the end of the
/// phase if it ran it, and its exports at the end of each phase it went through (the
/// copy's first, that one's last if it ran it), for the halo log of the process that
/// replayed it ([`Exports`]).
pub(crate) type Replayed<C> = Vec<(u64, C, Pieces, Exports)>;

/// A replayed partition's exports by phase, oldest first: its halo log from the copy's
/// phase on. Logged where it was replayed, they stand for the records lost with the
/// process it ran in, so that a neighbour lost later can be replayed from copies older than
/// this replay.
pub(crate) type Exports = Vec<(u64, Pieces)>;

/// Pieces a partition exported, each with the chunk it is for (`None`: every one).
pub(crate) type Pieces = Vec<(Option<u64>, Bytes)>;

/// `(chunk, range, done, partition)`; a partition is out while its phase runs.
type Part<C> = (u64, Range<u64>, bool, Option<C>);

/// One partition's phase: what it exported, if it ran it; or why it could not.
type Ran1 = Result<Option<(u64, Outbox<Bytes>)>, String>;

/// What every partition's phase of a replay shares.
struct Step<'a, J: Job> {
    hooks: &'a crate::job::Hooks<J>,
    /// The job value of the phase, and of the phase before (its pattern).
    job: &'a J,
    before: &'a J,
    phase: u64,
    /// The phase replayed last (a partition that did not end it only begins it).
    last: u64,
    chunks: u64,
    inputs: &'a Inputs<J>,
}

impl<J: Job> Step<'_, J> {
    /// Partition `part` begins the phase with `pieces` and, unless it only begins it, runs
    /// it: what it exported then.
    fn run(
        &self,
        part: &mut Part<J::Chunk>,
        mut pieces: Vec<(u64, Bytes)>,
        cell: &Cell,
        stats: &mut StepStats,
    ) -> Ran1 {
        let (chunk, range, done, slot) = part;
        let (chunk, phase, hooks) = (*chunk, self.phase, self.hooks);
        let Some(state) = slot.as_mut() else {
            return Err(format!("chunk {chunk} was lost in phase {phase}"));
        };
        pieces.sort_by_key(|(from, _)| *from);
        // Exactly the senders the phase before's pattern has for it: a piece missing from
        // the logs would give a wrong partition, not an error.
        let senders: Vec<u64> = pieces.iter().map(|(from, _)| *from).collect();
        let expected = senders_of::<J>(hooks, self.before, phase - 1, chunk, self.chunks);
        if senders != expected {
            return Err(format!(
                "chunk {chunk} would begin phase {phase} with the pieces of {senders:?}, \
                 not of {expected:?}"
            ));
        }
        let mut inbox = pieces
            .into_iter()
            .map(|(from, b)| {
                (hooks.decode_halo)(&b)
                    .map(|p| (from, p))
                    .map_err(|e| format!("a piece for chunk {chunk} does not decode: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        catch(crate::Site::Chunk { phase, chunk }, J::NAME, || {
            (hooks.begin)(state, self.job, chunk, &mut inbox, None)
        })
        .map_err(|e| format!("{e}"))?;
        if phase == self.last && !*done {
            return Ok(None);
        }
        let a = Assignment {
            chunk,
            phase,
            chunks: self.chunks,
            range: range.clone(),
            state: slot.take().map(|s| Held::Live(Box::new(s))),
        };
        match run(self.job, self.inputs, a, cell, stats, &mut Alone) {
            Ran::Done {
                kept: Some(kept), ..
            } => {
                *slot = Some(kept.state);
                let out = kept
                    .halos
                    .iter()
                    .map(|(to, p)| {
                        (hooks.encode_halo)(p)
                            .map(|b| (*to, Bytes::from(b)))
                            .map_err(|e| format!("a piece of chunk {chunk} does not encode: {e}"))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Some((chunk, out)))
            }
            Ran::Failed(e) => Err(format!("chunk {chunk}, phase {phase}: {e}")),
            Ran::Done { kept: None, .. } | Ran::Yielded { .. } => {
                Err(format!("chunk {chunk} kept no partition in phase {phase}"))
            }
        }
    }
}

/// A runner's host that never stops nor captures: a replay has nobody to answer.
struct Alone;

impl Host for Alone {
    fn attend(&mut self, cell: &Cell) -> Attend {
        cell.take();
        Attend::Continue
    }
    fn captured(&mut self, _: Result<Vec<u8>, codec::Error>) {}
}

/// Carries out `r` (see the module docs): the partitions' states, or why not.
pub(crate) fn replay<J: Job>(r: Replay, inputs: &Inputs<J>) -> Result<Replayed<J::Chunk>, String> {
    let Some(hooks) = J::OWNERSHIP.hooks else {
        return Err("a replay of a job without partitions".into());
    };
    let jobs: BTreeMap<u64, J> = r
        .jobs
        .iter()
        .map(|(p, b)| {
            codec::decode::<J>("the job", b)
                .map(|j| (*p, j))
                .map_err(|e| format!("the job value of phase {p} does not decode: {e}"))
        })
        .collect::<Result<_, _>>()?;
    let mut parts: Vec<Part<J::Chunk>> = r
        .parts
        .iter()
        .map(|(c, range, done, b)| {
            codec::decode::<J::Chunk>("a chunk state", b)
                .map(|s| (*c, range.clone(), *done, Some(s)))
                .map_err(|e| format!("the copy of chunk {c} does not decode: {e}"))
        })
        .collect::<Result<_, _>>()?;
    // The pieces of the phase before, by receiver: `(sender, bytes)`.
    let mut inbound: BTreeMap<u64, Vec<(u64, Bytes)>> = BTreeMap::new();
    let logged = |phase: u64, to: u64| {
        r.halos
            .iter()
            .filter(move |h| h.0 == phase && h.2 == to)
            .map(|h| (h.1, h.3.clone()))
    };
    for (c, ..) in &parts {
        inbound.insert(*c, logged(r.copy_phase, *c).collect());
    }
    // The copies' own pieces of their phase, for each other's next one.
    let mut exports: BTreeMap<u64, Exports> = BTreeMap::new();
    let first = jobs
        .get(&r.copy_phase)
        .ok_or_else(|| format!("no job value of phase {}", r.copy_phase))?;
    for (chunk, _, _, part) in &parts {
        let Some(part) = part else { continue };
        let at = crate::exchange::At {
            chunk: *chunk,
            chunks: r.chunks,
            phase: r.copy_phase,
        };
        let out = catch(
            crate::Site::Chunk {
                phase: r.copy_phase,
                chunk: *chunk,
            },
            J::NAME,
            || (hooks.export)(part, first, at),
        )
        .map_err(|e| format!("{e}"))?;
        let mut pieces = Pieces::with_capacity(out.len());
        for (to, p) in &out {
            let b = Bytes::from(
                (hooks.encode_halo)(p)
                    .map_err(|e| format!("a piece of chunk {chunk} does not encode: {e}"))?,
            );
            route(&mut inbound, *chunk, *to, b.clone());
            pieces.push((*to, b));
        }
        exports.insert(*chunk, vec![(r.copy_phase, pieces)]);
    }
    // The partitions of a phase are independent of each other: they run on as many threads
    // as the machine has (the other processes wait at the barrier for them).
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(parts.len())
        .max(1);
    for phase in r.copy_phase + 1..=r.phase {
        let job = jobs
            .get(&phase)
            .ok_or_else(|| format!("no job value of phase {phase}"))?;
        let before = jobs
            .get(&(phase - 1))
            .ok_or_else(|| format!("no job value of phase {}", phase - 1))?;
        // Each partition with the pieces it begins the phase with.
        let mut work: Vec<_> = parts
            .iter_mut()
            .map(|p| {
                let pieces = inbound.remove(&p.0).unwrap_or_default();
                (p, pieces)
            })
            .collect();
        let per = work.len().div_ceil(threads);
        let step = Step {
            hooks: &hooks,
            job,
            before,
            phase,
            last: r.phase,
            chunks: r.chunks,
            inputs,
        };
        let ran: Vec<Ran1> = std::thread::scope(|s| {
            let handles: Vec<_> = work
                .chunks_mut(per.max(1))
                .map(|group| {
                    let step = &step;
                    s.spawn(move || {
                        let cell = Cell::default();
                        let mut stats = StepStats::new(J::NAME);
                        group
                            .iter_mut()
                            .map(|(part, pieces)| {
                                step.run(part, std::mem::take(pieces), &cell, &mut stats)
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| {
                    h.join()
                        .unwrap_or_else(|_| vec![Err("a replay thread panicked".to_owned())])
                })
                .collect()
        });
        for r in ran {
            if let Some((chunk, out)) = r? {
                exports.entry(chunk).or_default().push((phase, out));
            }
        }
        // What the partitions replayed here exported feeds each other's next phase; the
        // others' pieces come from their logs.
        if phase < r.phase {
            for (c, ..) in &parts {
                inbound.insert(*c, logged(phase, *c).collect());
            }
            for (from, log) in &exports {
                for (to, b) in log
                    .last()
                    .filter(|(p, _)| *p == phase)
                    .into_iter()
                    .flat_map(|(_, out)| out)
                {
                    route(&mut inbound, *from, *to, b.clone());
                }
            }
        }
    }
    parts
        .into_iter()
        .map(|(chunk, _, _, part)| {
            let part = part.ok_or_else(|| format!("chunk {chunk} was lost"))?;
            let log = exports.remove(&chunk).unwrap_or_default();
            // What it exported at the end of the phase, if it ran it (`Replayed`).
            let halos = log
                .last()
                .filter(|(p, _)| *p == r.phase)
                .map(|(_, out)| out.clone())
                .unwrap_or_default();
            Ok((chunk, part, halos, log))
        })
        .collect()
}

/// A piece one replayed partition exported, for the others replayed (`to`, or all of them).
fn route(inbound: &mut BTreeMap<u64, Vec<(u64, Bytes)>>, from: u64, to: Option<u64>, b: Bytes) {
    match to {
        Some(to) => {
            if let Some(v) = inbound.get_mut(&to) {
                v.push((from, b));
            }
        }
        None => inbound.values_mut().for_each(|v| v.push((from, b.clone()))),
    }
}

/// The chunks whose pieces partition `chunk` (of `chunks`) takes at the barrier after
/// `phase`, in order: its neighbours (the graph is symmetric), every chunk (an allgather, an
/// all-to-all), or none.
fn senders_of<J: Job>(
    hooks: &crate::job::Hooks<J>,
    job: &J,
    phase: u64,
    chunk: u64,
    chunks: u64,
) -> Vec<u64> {
    match (hooks.pattern)(job, phase) {
        crate::Pattern::Nothing => Vec::new(),
        crate::Pattern::Allgather | crate::Pattern::AllToAll => (0..chunks).collect(),
        crate::Pattern::Neighbours => {
            let mut n = match hooks.neighbours {
                Some(f) => f(job, chunk, chunks),
                None => chunk
                    .checked_sub(1)
                    .into_iter()
                    .chain((chunk + 1 < chunks).then_some(chunk + 1))
                    .collect(),
            };
            n.sort_unstable();
            n
        }
    }
}
