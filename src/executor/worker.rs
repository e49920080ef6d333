//! The loop of a local worker: run steps back to back, read one flag per step, report to the
//! core when the chunk ends or the flag is set.
//!
//! # The per-step path
//!
//! One `Chunk::step` call, one clock read, one increment of a local histogram bucket, one
//! `Relaxed` load of the worker's own flag, and every 4096 steps (or when 8 ms have passed) one
//! `Relaxed` store of the chunk's progress to the worker's own cache line. No lock, no
//! allocation, no shared counter: everything else happens once per chunk.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use crossbeam_utils::CachePadded;

use super::{CAPTURE, Cell, Held, INTERRUPT, Msg, Shared, State, catch, snapshot};
use crate::error::{Error, Site};
use crate::job::{Chunk, Job, Step};
use crate::metrics::StepStats;
use crate::schedule::{Event, Work, WorkerId};

/// How often a worker publishes the progress of its chunk.
const PUBLISH_EVERY: Duration = Duration::from_millis(8);

/// The body of a local worker thread: serve messages until released.
pub(super) fn thread_main<J: Job>(shared: Arc<Shared<J>>, rx: Receiver<Msg<J>>) {
    let mut stats = StepStats::new(J::NAME);
    let mut next = None;
    loop {
        let msg = match next.take() {
            Some(m) => m,
            None => match rx.recv() {
                Ok(m) => m,
                Err(_) => return,
            },
        };
        match msg {
            Msg::Run { .. } => next = run(&shared, msg, &mut stats),
            Msg::Release => return,
            Msg::Wake => {}
        }
    }
}

/// Serves as the inline worker on the waiting thread until the job has a result.
pub(super) fn serve_inline<J: Job>(shared: &Arc<Shared<J>>, rx: &Receiver<Msg<J>>) {
    let mut stats = StepStats::new(J::NAME);
    let mut next = None;
    loop {
        if next.is_none() && shared.lock().ended {
            return;
        }
        let msg = match next.take() {
            Some(m) => m,
            None => match rx.recv() {
                Ok(m) => m,
                Err(_) => return,
            },
        };
        if let Msg::Run { .. } = msg {
            next = run(shared, msg, &mut stats);
        }
    }
}

/// Runs one chunk and reports it; returns the worker's next message if the core had one.
fn run<J: Job>(shared: &Arc<Shared<J>>, msg: Msg<J>, stats: &mut StepStats) -> Option<Msg<J>> {
    let Msg::Run {
        worker,
        chunk,
        range,
        state,
        job,
        phase,
        cell,
    } = msg
    else {
        return None;
    };
    let site = Site::Chunk { phase, chunk };
    let input = match shared.input(&job) {
        Ok(input) => input,
        Err(e) => {
            drop(job);
            return abandon(shared, &mut shared.lock(), worker, e);
        }
    };
    let fresh = state.is_none();
    // A state that arrived as bytes (a restore) is decoded here, on the worker that runs it.
    let state = match state.map(Held::into_live).transpose() {
        Ok(state) => state,
        Err(e) => {
            drop(job);
            return abandon(shared, &mut shared.lock(), worker, e);
        }
    };
    let ran = catch(site.clone(), J::NAME, || {
        let mut c = match state {
            Some(c) => c,
            None => job.chunk(range.clone()),
        };
        let before = c.iterations_done().unwrap_or(0);
        let output = loop {
            let output = steps(&mut c, &job, input, &cell, stats);
            let flag = cell.flag.load(Ordering::Relaxed);
            if output.is_some() || flag & INTERRUPT != 0 || flag & CAPTURE == 0 {
                break output;
            }
            // A snapshot's capture (protocol step 2 of `snapshot.rs`): serialize here, hand
            // the bytes over, and go on with the same chunk.
            capture(&c, stats, |bytes| {
                let mut st = shared.lock();
                cell.flag.fetch_and(!CAPTURE, Ordering::Relaxed);
                st.captured(
                    shared,
                    chunk,
                    bytes.map(|b| snapshot::Captured::State(b.into())),
                );
            });
        };
        let did = iterations_run(&c, before, fresh, output.is_some(), &range);
        (c, output, did)
    });
    // Drop our handle on the job before reporting: at a phase barrier the core's holder
    // must be the last one.
    drop(job);
    let mut st = shared.lock();
    cell.flag.store(0, Ordering::Relaxed);
    match ran {
        Err(e) => abandon(shared, &mut st, worker, e),
        Ok((c, output, iterations)) => {
            let work = Work {
                iterations,
                busy: stats.busy(),
            };
            stats.flush(output.is_some());
            let event = match output {
                Some(output) => Event::Done {
                    worker,
                    chunk,
                    output,
                    work,
                },
                None => Event::Yielded {
                    worker,
                    chunk,
                    state: Held::Live(c),
                    work,
                },
            };
            st.report(shared, event, Some(worker))
        }
    }
}

/// Serializes a running chunk for a snapshot into a buffer of the size of the worker's last
/// capture, hands the bytes over (`hand_over`: to the cut, or over the wire), and records the
/// pause. Local workers and remote slots both capture with it.
pub(crate) fn capture<C: serde::Serialize>(
    c: &C,
    stats: &mut StepStats,
    hand_over: impl FnOnce(crate::Result<Vec<u8>>),
) {
    let paused = Instant::now();
    let bytes = snapshot::encode_sized("a chunk state", c, stats.capture_hint);
    if let Ok(b) = &bytes {
        stats.capture_hint = b.len();
    }
    hand_over(bytes);
    stats.record_pause(paused.elapsed());
}

/// Iterations done in this run of a chunk: what `iterations_done` says moved since `before`,
/// or, for a chunk that cannot tell, its whole range if it ran from scratch to the end.
pub(crate) fn iterations_run<C: Chunk>(
    c: &C,
    before: u64,
    fresh: bool,
    finished: bool,
    range: &std::ops::Range<u64>,
) -> u64 {
    match c.iterations_done() {
        Some(now) => now.saturating_sub(before),
        None if fresh && finished => range.end - range.start,
        None => 0,
    }
}

/// Loads a job's input, with an error or a panic turned into its message. Called once per
/// process and job run (local workers share it through `Shared::input`).
pub(crate) fn load_input<J: Job>(job: &J) -> std::result::Result<J::Input, String> {
    match catch(Site::Input, J::NAME, || {
        <J::Input as crate::Input<J>>::load(job)
    }) {
        Ok(Ok(input)) => Ok(input),
        Ok(Err(e)) => Err(e.to_string()),
        Err(panic) => Err(panic.to_string()),
    }
}

/// Ends the job with `error` after this worker lost its chunk (user code panicked, or the
/// input failed to load): the chunk's state is gone, so the worker leaves the core as lost,
/// and is released.
fn abandon<J: Job>(
    shared: &Arc<Shared<J>>,
    st: &mut State<J>,
    worker: WorkerId,
    error: Error,
) -> Option<Msg<J>> {
    st.fail(shared, error);
    st.report(shared, Event::Lost { worker }, Some(worker));
    st.release(worker);
    Some(Msg::Release)
}

/// Steps `c` until it is done (`Some(output)`) or the flag asks it to stop (`None`).
#[inline]
pub(crate) fn steps<C: Chunk>(
    c: &mut C,
    job: &C::Job,
    input: &<C::Job as Job>::Input,
    cell: &CachePadded<Cell>,
    stats: &mut StepStats,
) -> Option<C::Output> {
    let mut last = Instant::now();
    let mut since_publish = Duration::ZERO;
    loop {
        let step = c.step(job, input);
        let now = Instant::now();
        let took = now - last;
        last = now;
        stats.record(took);
        if let Step::Done(output) = step {
            return Some(output);
        }
        if cell.flag.load(Ordering::Relaxed) != 0 {
            return None;
        }
        since_publish += took;
        if since_publish >= PUBLISH_EVERY {
            since_publish = Duration::ZERO;
            if let Some(done) = c.iterations_done() {
                cell.progress.store(done, Ordering::Relaxed);
            }
        }
    }
}
