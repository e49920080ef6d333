//! Local worker threads, and the inline worker (the thread blocked in
//! [`JobHandle::wait`](crate::JobHandle::wait) when the job has zero threads): drivers of the
//! job's state. Both are hosts of the crate's one chunk runner (`crate::run`): their requests
//! are the [`INTERRUPT`] and [`CAPTURE`] bits the state raises through its orders under the
//! job's lock (`links.rs`), and their results go to the state under that lock.

use std::sync::Arc;

use crossbeam_channel::Receiver;

use super::job_run::{HeldHalo, Shared, State};
use super::members::Mail;
use super::snapshot::{Captured, Part};
use crate::codec;
use crate::error::Error;
use crate::job::Job;
use crate::metrics::StepStats;
use crate::run::{self, Attend, CAPTURE, Cell, Held, Host, INTERRUPT, Ran};
use crate::schedule::{ChunkId, Event, WorkerId};

/// The body of a local worker thread: serve messages until released.
pub(super) fn thread_main<J: Job>(shared: Arc<Shared<J>>, rx: Receiver<Mail<J>>) {
    let mut stats = StepStats::new(J::NAME);
    let mut next = None;
    loop {
        let msg = match next.take() {
            Some(m) => m,
            None => match run::receive(&rx) {
                Ok(m) => m,
                Err(_) => return,
            },
        };
        match msg {
            Mail::Run { .. } => next = run_one(&shared, msg, &mut stats),
            Mail::Release => return,
            Mail::Wake => {}
        }
    }
}

/// Serves as the inline worker on the waiting thread until the job has a result.
pub(super) fn serve_inline<J: Job>(shared: &Arc<Shared<J>>, rx: &Receiver<Mail<J>>) {
    let mut stats = StepStats::new(J::NAME);
    let mut next = None;
    loop {
        if next.is_none() && shared.lock().outcome_ready() {
            return;
        }
        let msg = match next.take() {
            Some(m) => m,
            None => match rx.recv() {
                Ok(m) => m,
                Err(_) => return,
            },
        };
        if let Mail::Run { .. } = msg {
            next = run_one(shared, msg, &mut stats);
        }
    }
}

/// The runner's host for a local worker's chunk.
struct Local<'a, J: Job> {
    shared: &'a Arc<Shared<J>>,
    worker: WorkerId,
    chunk: ChunkId,
}

impl<J: Job> Host for Local<'_, J> {
    fn attend(&mut self, cell: &Cell) -> Attend {
        let bits = cell.take();
        if bits & INTERRUPT != 0 {
            // A handed-back state also serves a capture asked for at the same time.
            Attend::Stop
        } else if bits & CAPTURE != 0 {
            Attend::Capture
        } else {
            Attend::Continue
        }
    }

    fn captured(&mut self, state: Result<Vec<u8>, codec::Error>) {
        let captured = state
            .map(|b| Captured::State(Part::New(b.into())))
            .map_err(Error::from);
        self.shared
            .lock()
            .captured(self.worker, self.chunk, captured);
    }
}

/// Runs one chunk and reports it; returns the worker's next message if the core had one.
fn run_one<J: Job>(
    shared: &Arc<Shared<J>>,
    msg: Mail<J>,
    stats: &mut StepStats,
) -> Option<Mail<J>> {
    let Mail::Run {
        worker,
        assignment,
        job,
        cell,
    } = msg
    else {
        return None;
    };
    let chunk = assignment.chunk;
    let mut host = Local {
        shared,
        worker,
        chunk,
    };
    let mut ran = run::run(&*job, &shared.inputs, assignment, &cell, stats, &mut host);
    // Drop our handle on the job before reporting: at a phase barrier the core's holder
    // must be the last one.
    drop(job);
    // An owned partition's pieces as the barrier keeps them, made before the lock is taken.
    let exported = match &mut ran {
        Ran::Done { kept: Some(k), .. } => Some(
            std::mem::take(&mut k.halos)
                .into_iter()
                .map(|(to, p)| (to, HeldHalo::Live(p)))
                .collect(),
        ),
        _ => None,
    };
    let mut st = shared.lock();
    // Step 4 of the flag contract: under the lock, before the core can ask anything about
    // this worker's next chunk.
    cell.clear();
    let event = match ran {
        Ran::Failed(e) => return abandon(shared, &mut st, worker, chunk, e),
        Ran::Done { output, kept, work } => Event::Done {
            worker,
            chunk,
            output,
            kept: kept.map(|k| {
                // Its exports for partitions in worker processes are logged here.
                let phase = st.phase;
                st.remote
                    .buddies
                    .exported(chunk, super::copies::HERE, phase);
                st.keep_halos(chunk, exported.unwrap_or_default());
                Held::Live(Box::new(k.state))
            }),
            work,
        },
        Ran::Yielded { state, work } => Event::Yielded {
            worker,
            chunk,
            state: Held::Live(Box::new(state)),
            work,
        },
    };
    let mine = st.report(event, Some(worker));
    // The next chunk, as its driver hands it over (`links.rs`).
    mine.map(|m| st.links().1.prepare(m))
}

/// Ends the job with `error` after this worker lost its chunk `chunk` (user code panicked,
/// the input did not load, a restored state did not decode: then the error names the
/// snapshot, `from_snapshot.rs`): the chunk's state is gone, so the worker leaves the core
/// as lost, and is released.
fn abandon<J: Job>(
    _shared: &Arc<Shared<J>>,
    st: &mut State<J>,
    worker: WorkerId,
    chunk: ChunkId,
    error: Error,
) -> Option<Mail<J>> {
    let error = st.snap.from_snapshot.blame(chunk, error);
    // A partition on its way from a process that was lost: the rollback under way replaces
    // it (and this worker).
    let replaced = st.rolling_back() && matches!(error, Error::PartitionGone { .. });
    if !replaced {
        st.fail(error);
    }
    st.report(Event::Lost { worker }, Some(worker));
    st.release(worker);
    if replaced {
        // Its replacement joins now, while the run is halted: the restored ledger, which
        // every member joins when the snapshot's manifest is read, then deals it partitions
        // too. (Spawned at the next event instead, it came after that deal once in a few
        // rollbacks, and the coordinator's own thread sat out the restored phase.)
        st.reconcile();
    }
    Some(Mail::Release)
}
