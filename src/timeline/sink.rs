//! The timeline's writer: a bounded channel to one thread that writes records through a
//! buffer.
//!
//! 1. *Send.* A job hands a [`Record`] to [`Sink::send`] (under its lock): `try_send` on a
//!    bounded channel, so the job never waits. A full queue drops the record, logged and
//!    counted.
//! 2. *Write.* The writer thread wakes every [`FLUSH_EVERY`] (a send never wakes it: on a
//!    busy machine a wake-up per record would take a core from the workers), serializes what
//!    is queued, one line per record, into a 64 KiB `BufWriter`, and flushes it: the file is
//!    at most that far behind, and a job of very short phases costs no system call per phase.
//!    A failed write or flush is logged and counted, and the writer goes on with the next
//!    record.
//! 3. *Flush.* [`Sink::flush`] queues a marker and waits (up to a time limit) for the writer
//!    to reach it: every record sent before it has been written and flushed.
//! 4. *End.* When the last [`Sink`] is dropped the channel closes; the writer writes what is
//!    queued, flushes and exits.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use crossbeam_channel::{Receiver, Sender, TryRecvError, TrySendError, bounded};

use super::{Event, QUEUE, Record};

/// How often the writer wakes up to write what is queued.
pub(crate) const FLUSH_EVERY: Duration = Duration::from_millis(50);

enum Msg {
    Record(Box<Record>),
    Flush(Sender<()>),
}

/// The sending side of a timeline; shared by an executor and its jobs.
#[derive(Debug)]
pub(crate) struct Sink {
    tx: Sender<Msg>,
    opened: Instant,
    path: PathBuf,
    dropped: AtomicU64,
}

impl std::fmt::Debug for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Msg::Record(_) => "Record",
            Msg::Flush(_) => "Flush",
        })
    }
}

impl Sink {
    /// Creates (or truncates) the file at `path` and starts its writer thread.
    pub(crate) fn create(path: &Path) -> std::io::Result<Sink> {
        let file = File::create(path)?;
        let (tx, rx) = bounded(QUEUE);
        let shown = path.to_owned();
        std::thread::Builder::new()
            .name("malleable-timeline".into())
            .spawn(move || writer(rx, BufWriter::with_capacity(1 << 16, file), &shown))?;
        Ok(Sink {
            tx,
            opened: Instant::now(),
            path: path.to_owned(),
            dropped: AtomicU64::new(0),
        })
    }

    /// Step 1: queues a record of `job` with the workers at this moment. Never blocks.
    pub(crate) fn send(&self, job: &'static str, local: usize, remote: usize, event: Event) {
        let record = Record {
            t: self.opened.elapsed().as_secs_f64(),
            unix_ms: SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            job: job.into(),
            local: local as u64,
            remote: remote as u64,
            event,
        };
        match self.tx.try_send(Msg::Record(Box::new(record))) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                metrics::counter!(crate::metrics::TIMELINE_ERRORS, "kind" => "dropped")
                    .increment(1);
                if n.is_power_of_two() {
                    tracing::warn!(
                        path = %self.path.display(),
                        dropped = n,
                        "timeline records dropped: its writer is behind"
                    );
                }
            }
        }
    }

    /// Step 3: waits up to `timeout` until every record sent before has been written and
    /// flushed; whether it was.
    pub(crate) fn flush(&self, timeout: Duration) -> bool {
        let (ack, done) = bounded(1);
        if self.tx.send_timeout(Msg::Flush(ack), timeout).is_err() {
            return false;
        }
        done.recv_timeout(timeout).is_ok()
    }
}

/// Steps 2 and 4: the writer thread. It is never woken by a send: it wakes every
/// [`FLUSH_EVERY`], takes what is queued, writes it and flushes.
fn writer(rx: Receiver<Msg>, mut out: BufWriter<File>, path: &Path) {
    let mut failures = 0u64;
    let mut failed = |what: &str, e: &dyn std::error::Error| {
        failures += 1;
        metrics::counter!(crate::metrics::TIMELINE_ERRORS, "kind" => "write").increment(1);
        if failures.is_power_of_two() {
            tracing::warn!(path = %path.display(), error = %e, failures, "timeline: {what} failed");
        }
    };
    let mut line = Vec::with_capacity(256);
    loop {
        std::thread::sleep(FLUSH_EVERY);
        let mut dirty = false;
        let closed = loop {
            match rx.try_recv() {
                Ok(Msg::Record(r)) => {
                    line.clear();
                    match serde_json::to_writer(&mut line, &r) {
                        Ok(()) => {
                            line.push(b'\n');
                            if let Err(e) = out.write_all(&line) {
                                failed("a write", &e);
                            }
                            dirty = true;
                        }
                        Err(e) => failed("encoding a record", &e),
                    }
                }
                Ok(Msg::Flush(ack)) => {
                    if let Err(e) = out.flush() {
                        failed("a flush", &e);
                    }
                    dirty = false;
                    let _ = ack.send(());
                }
                Err(TryRecvError::Empty) => break false,
                Err(TryRecvError::Disconnected) => break true,
            }
        };
        if dirty || closed {
            if let Err(e) = out.flush() {
                failed("a flush", &e);
            }
        }
        if closed {
            return;
        }
    }
}
