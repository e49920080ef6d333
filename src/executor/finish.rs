//! The end of a job with owned partitions: the last output and the gather.
//!
//! A phase whose `end_phase` says [`Next::Finish`](crate::Next::Finish) usually completes the
//! job at once. A job with owned partitions may ask for two more things first, both once,
//! at the end, never per phase:
//!
//! 1. *The last output* ([`Partition::output`](crate::Partition::output)), when the last
//!    phase was not an output phase already (those are output on the worker at each chunk's
//!    end, `run/runner.rs`). It runs where each partition is: here for the partitions in
//!    the ledger (decoded first if they are still a snapshot's bytes), in the worker
//!    process that holds the others (`Output`, answered by `OutputDone`, after the last
//!    phase's job value if that process lacks it). The job value it sees is the one the
//!    last phase ran with, kept as its bytes at the barrier only when this output is due.
//! 2. *The gather* ([`Partition::gather_at_end`](crate::Partition::gather_at_end)): each
//!    partition held by a worker process is asked for (`Surrender`, after its `Output` on
//!    the same connection, so it is output there before it leaves), and comes back into the
//!    ledger as bytes; once every partition is here they are decoded in chunk order into
//!    [`Finished::partitions`](crate::Finished::partitions).
//!
//! Until both are done the job is *finishing*: no phase starts, no snapshot starts
//! (`poll_cut`), and every answer settles the job again ([`State::poll_finish`]). A worker
//! process lost meanwhile takes partitions only it had: the finishing is dropped and the
//! job rolls back like at any barrier (it then runs its last phases again and finishes
//! again), or ends with [`Error::PartitionsLost`] without a snapshot. A failing output
//! ends the job with its error ([`Error::Output`], [`Error::Panicked`]).

use crate::schedule::idhash::IdSet;

use bytes::Bytes;

use super::job_run::State;
use super::remote::Fetch;
use super::{Finished, Outcome};
use crate::error::{Error, Result, Site};
use crate::job::{Job, Value, output_due};
use crate::run::{Held, catch};
use crate::schedule::ChunkId;
use crate::wire::frame::ToWorker;

/// A job whose last phase ended, waiting for its last output and its gather.
pub(crate) struct Finishing<J: Job> {
    job: J,
    value: Value<J>,
    /// The last phase.
    phase: u64,
    /// The job as it ran the last phase, and its bytes, when the last output is due.
    ran: Option<(J, Bytes)>,
    /// The partitions gathered here at the end.
    gather: bool,
    /// Partitions whose `Output` went to the process that holds them.
    asked: IdSet<ChunkId>,
    /// Partitions output (here, or answered by their process).
    done: IdSet<ChunkId>,
}

/// The bytes of the job before the `end_phase` of `phase`, if its partitions are output
/// after the job's last phase and `phase` is not an output phase already: what the last
/// output sees if `phase` is the last. `None` (nothing encoded) without an output hook.
pub(crate) fn before_end_phase<J: Job>(job: &J, phase: u64) -> Result<Option<Bytes>> {
    let Some(hooks) = J::OWNERSHIP.hooks else {
        return Ok(None);
    };
    let every = catch(Site::Job { phase }, J::NAME, || (hooks.output_every)(job))?;
    if every.is_none() || output_due(every, phase) {
        return Ok(None);
    }
    Ok(Some(crate::codec::encode("the job", job)?.into()))
}

impl<J: Job> State<J> {
    /// The last phase ended with `job` and `value`; `ran` is what [`before_end_phase`]
    /// kept. Completes the job, at once or once its partitions are output and gathered.
    pub(crate) fn finish(&mut self, job: J, value: Value<J>, phase: u64, ran: Option<Bytes>) {
        let gather = match J::OWNERSHIP.hooks {
            Some(hooks) => match catch(Site::Job { phase }, J::NAME, || (hooks.gather)(&job)) {
                Ok(g) => g,
                Err(e) => return self.fail(e),
            },
            None => false,
        };
        if ran.is_none() && !gather {
            return self.complete(Ok(Outcome::Finished(Finished::new(job, value))));
        }
        let ran = match ran
            .map(|b| crate::codec::decode::<J>("the job", &b).map(|j| (j, b)))
            .transpose()
        {
            Ok(ran) => ran,
            Err(e) => return self.fail(e.into()),
        };
        self.finishing = Some(Finishing {
            job,
            value,
            phase,
            ran,
            gather,
            asked: IdSet::default(),
            done: IdSet::default(),
        });
        self.poll_finish();
    }

    /// Moves the finishing job on (see the module docs): outputs what is here, asks the
    /// worker processes for the rest, and completes the job once nothing is awaited.
    pub(crate) fn poll_finish(&mut self) {
        let Some(mut f) = self.finishing.take() else {
            return;
        };
        if self.ended {
            return;
        }
        match self.advance(&mut f) {
            Ok(false) => self.finishing = Some(f),
            Ok(true) => {
                let partitions = if f.gather {
                    match self.gathered() {
                        Ok(p) => Some(p),
                        Err(e) => return self.fail(e),
                    }
                } else {
                    None
                };
                let Finishing { job, value, .. } = f;
                let mut done = Finished::new(job, value);
                done.partitions = partitions;
                self.complete(Ok(Outcome::Finished(done)));
            }
            Err(e) => self.fail(e),
        }
    }

    /// `OutputDone` for `chunk` from a worker process: whether it was asked for (and not
    /// answered yet).
    pub(crate) fn output_done(&mut self, chunk: ChunkId) -> bool {
        match &mut self.finishing {
            Some(f) if f.asked.contains(&chunk) => f.done.insert(chunk),
            _ => false,
        }
    }

    /// One round of the finishing; `true` once nothing is awaited.
    fn advance(&mut self, f: &mut Finishing<J>) -> Result<bool> {
        let Some(hooks) = J::OWNERSHIP.hooks else {
            return Ok(true);
        };
        let mut waiting = false;
        let mut here = Vec::new();
        let mut ask = Vec::new();
        let mut fetch = Vec::new();
        for (chunk, held) in self.core.kept() {
            let output = f.ran.is_some() && !f.done.contains(&chunk);
            match held {
                Held::Live(_) | Held::Bytes(_) => {
                    if output {
                        here.push(chunk);
                    }
                }
                // On its way here (its process leaves): output here when it arrives.
                Held::Elsewhere(_) | Held::Fetch(_) | Held::Asked(_)
                    if self.remote.fetching_from(chunk).is_some() =>
                {
                    waiting = true;
                }
                Held::Elsewhere(conn) => {
                    if output {
                        waiting = true;
                        if f.asked.insert(chunk) {
                            ask.push((*conn, chunk));
                        }
                    }
                    if f.gather {
                        waiting = true;
                        fetch.push((*conn, chunk));
                    }
                }
                Held::Fetch(_) | Held::Asked(_) => waiting = true,
            }
        }
        if let Some((ran, bytes)) = &f.ran {
            for (conn, chunk) in ask {
                self.remote
                    .send_phase(conn, (f.phase, self.core.plan().len()), bytes.clone());
                let msg = ToWorker::Output {
                    chunk,
                    phase: f.phase,
                };
                if self.remote.send_to(conn, msg).is_none() {
                    tracing::debug!(conn = %conn, chunk, "an output for a connection that is gone");
                }
            }
            if !here.is_empty() {
                let input = self.inputs.get(ran)?;
                for (chunk, held) in self.core.kept_mut() {
                    if !here.contains(&chunk) {
                        continue;
                    }
                    if let Held::Bytes(b) = held {
                        let site = Site::Chunk {
                            phase: f.phase,
                            chunk,
                        };
                        let part = catch(site, J::NAME, || {
                            crate::codec::decode::<J::Chunk>("a chunk state", b)
                        })?
                        .map_err(|e| self.snap.from_snapshot.blame(chunk, e.into()))?;
                        *held = Held::Live(Box::new(part));
                    }
                    if let Held::Live(part) = held {
                        crate::run::output(&hooks, part, ran, input, f.phase, chunk)?;
                        f.done.insert(chunk);
                    }
                }
            }
        }
        for (conn, chunk) in fetch {
            self.fetch(chunk, conn, Fetch::Ledger);
        }
        Ok(!waiting)
    }

    /// Every partition, in chunk order, decoded where it is still bytes.
    fn gathered(&mut self) -> Result<Vec<J::Chunk>> {
        let mut kept: Vec<(ChunkId, Held<J::Chunk>)> = self
            .core
            .kept_mut()
            .map(|(c, h)| (c, std::mem::replace(h, Held::Bytes(Bytes::new()))))
            .collect();
        kept.sort_by_key(|(c, _)| *c);
        let chunks = self.core.plan().len();
        if kept.len() as u64 != chunks || kept.iter().enumerate().any(|(i, (c, _))| *c != i as u64)
        {
            return Err(Error::Internal(format!(
                "{} of {chunks} partitions are in the ledger at the end",
                kept.len()
            )));
        }
        let from = &self.snap.from_snapshot;
        kept.into_iter()
            .map(|(chunk, held)| {
                let site = Site::Chunk {
                    phase: self.phase,
                    chunk,
                };
                catch(site, J::NAME, || held.into_live())?.map_err(|e| from.blame(chunk, e))
            })
            .collect()
    }
}
