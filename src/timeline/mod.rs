//! The timeline of a run: an opt-in log of what happened to each job, one JSON object per
//! line, and a self-contained HTML report made from it.
//!
//! [`Builder::timeline`](crate::Builder::timeline) names the file; the executor then writes a
//! [`Record`] for each of: a job run's start, every change of its workers (joins, leaves,
//! retiring ones), every worker process lost, every autoscaling decision, the end of every
//! phase (with its duration), every snapshot (its duration and bytes) or failed snapshot,
//! every rollback, and the job's end (finished, suspended or failed). Nothing is written
//! per step or per chunk.
//!
//! - `mod.rs` (this file): the format ([`Record`], [`Event`]) and its reader ([`read`],
//!   [`parse`]).
//! - `sink.rs`: the writer thread.
//! - [`report`]: the HTML report with its SVG chart.
//!
//! # Format
//!
//! Each line is one [`Record`]: `t` (seconds since the timeline was opened, when the executor
//! was built), `unix_ms`, `job`, the workers at that moment (`local`, `remote`), and the
//! fields of its [`Event`] with the event's kind under `event`:
//!
//! ```text
//! {"t":0.0012,"unix_ms":1795000000000,"job":"heat","local":1,"remote":0,"event":"start","phase":0,"iterations":512,"resumed_from":null}
//! {"t":0.0815,"unix_ms":1795000000080,"job":"heat","local":1,"remote":0,"event":"phase_end","phase":0,"seconds":0.0803,"iterations":512}
//! ```
//!
//! # Never in the way of the job
//!
//! Records go from the job (under its lock, at the rare moments above) through a bounded
//! channel ([`QUEUE`] records) to one writer thread, which wakes every 50 ms (a record never
//! wakes it), writes what is queued through a buffer and flushes it, so the file is at most
//! that far behind. A full queue drops the record; a failed write loses
//! it. Either is logged (`tracing`, warn: the first time and then at every power of two) and
//! counted ([`TIMELINE_ERRORS`](crate::metrics::TIMELINE_ERRORS), label `kind`: `dropped` or
//! `write`); the job never waits and never fails for its timeline.
//!
//! The log is complete once [`Executor::shutdown`](crate::Executor::shutdown) returned or
//! the last clone of the executor was dropped (both wait, up to the shutdown timeout, until
//! the writer has written what it was sent).

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub mod report;
mod sink;

pub(crate) use sink::Sink;

/// Records the writer's queue holds; more are dropped (and counted).
pub const QUEUE: usize = 8192;

/// One line of a timeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Record {
    /// Seconds since the timeline was opened (the executor was built).
    pub t: f64,
    /// Wall-clock time, milliseconds since the Unix epoch.
    pub unix_ms: u64,
    /// The job's name ([`Job::NAME`](crate::Job::NAME)).
    pub job: Cow<'static, str>,
    /// Local workers at that moment (threads, or 1 for the inline worker; retiring ones
    /// included).
    pub local: u64,
    /// Connected worker processes at that moment (retiring ones excluded).
    pub remote: u64,
    /// What happened.
    #[serde(flatten)]
    pub event: Event,
}

/// How a job run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Ending {
    /// Every phase ran.
    Finished,
    /// Suspended to a committed snapshot.
    Suspended,
    /// Failed or cancelled.
    Failed,
}

/// What happened, with its kind in the field `event` of a line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Event {
    /// A job run started: submitted, or resumed from a snapshot.
    Start {
        /// The phase it starts in.
        phase: u64,
        /// Iterations of that phase.
        iterations: u64,
        /// The epoch it was resumed from, if it was.
        resumed_from: Option<u64>,
    },
    /// The job's workers changed (joined, retiring, left); the record's `local` and `remote`
    /// are the new counts.
    Workers {
        /// Workers retiring: local threads and worker processes that hand their chunks back
        /// at their next adjustment point.
        draining: u64,
        /// Worker processes started by the launcher that have not connected yet.
        joining: u64,
    },
    /// A worker process was lost: its connection closed, broke the protocol, or fell silent
    /// for a lease.
    Lost {
        /// The peer's address.
        peer: String,
    },
    /// The autoscaler's decision, carried out.
    Autoscale {
        /// Local threads before.
        from_local: u64,
        /// Worker processes before.
        from_remote: u64,
        /// Local threads wanted.
        to_local: u64,
        /// Worker processes wanted.
        to_remote: u64,
        /// The reason's short name ([`Reason::name`](crate::schedule::Reason::name)).
        reason: String,
        /// The decision as its log line says it.
        detail: String,
    },
    /// A phase ended at its barrier.
    PhaseEnd {
        /// The phase (0-based).
        phase: u64,
        /// From the phase's start (or the run's start, or a rollback's restart) to its
        /// barrier.
        seconds: f64,
        /// Iterations of the phase.
        iterations: u64,
    },
    /// A snapshot was committed.
    Snapshot {
        /// Its epoch.
        epoch: u64,
        /// From its marker to its commit.
        seconds: f64,
        /// Bytes written for it: its manifest and its new parts (parts reused from an earlier
        /// snapshot are not counted).
        bytes: u64,
        /// Whether it was a suspend's.
        suspend: bool,
    },
    /// A snapshot failed; the job went on.
    SnapshotFailed {
        /// From its marker to the failure, when it got as far as its write.
        seconds: Option<f64>,
        /// The error and its causes.
        error: String,
    },
    /// Owned partitions were lost with a worker process: the job rolls back.
    Rollback {
        /// The chunks whose partitions were lost.
        lost: Vec<u64>,
        /// The phase the job was in.
        from_phase: u64,
        /// The epoch it goes back to.
        epoch: u64,
    },
    /// Owned partitions lost with a worker process were replayed from their buddy copies
    /// while the others went on (no rollback).
    Recovered {
        /// The chunks whose partitions were lost and replayed.
        lost: Vec<u64>,
        /// The phase the job was in.
        phase: u64,
        /// The phase of the copies.
        copy_phase: u64,
        /// The worker process that kept the copies and replayed them.
        buddy: u64,
        /// From the loss until every partition was back.
        seconds: f64,
    },
    /// A rollback is done: the run restarts from the snapshot.
    RolledBack {
        /// The epoch it went back to.
        epoch: u64,
        /// The phase of that snapshot.
        to_phase: u64,
        /// From the loss to the restart.
        seconds: f64,
    },
    /// The job run ended.
    End {
        /// How.
        outcome: Ending,
        /// The phase it ended in.
        phase: u64,
        /// The suspend's snapshot epoch.
        epoch: Option<u64>,
        /// The error and its causes, if it failed.
        error: Option<String>,
    },
}

/// Errors reading a timeline.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The file could not be read.
    #[error("cannot read the timeline {path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A line is not a record.
    #[error("line {line} of the timeline is not a record")]
    Parse {
        /// The line (1-based).
        line: usize,
        /// Why.
        source: serde_json::Error,
    },
}

/// Reads the timeline at `path`.
///
/// # Errors
///
/// [`Error::Io`] if the file cannot be read, [`Error::Parse`] for a line that is not a
/// record.
pub fn read(path: impl AsRef<Path>) -> Result<Vec<Record>, Error> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_owned(),
        source,
    })?;
    parse(&text)
}

/// Parses a timeline's text; blank lines are skipped.
///
/// # Errors
///
/// [`Error::Parse`] for a line that is not a record.
pub fn parse(text: &str) -> Result<Vec<Record>, Error> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|source| Error::Parse {
                line: i + 1,
                source,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_as_one_json_line() {
        let r = Record {
            t: 1.5,
            unix_ms: 7,
            job: Cow::Borrowed("heat"),
            local: 2,
            remote: 1,
            event: Event::Snapshot {
                epoch: 3,
                seconds: 0.25,
                bytes: 4096,
                suspend: false,
            },
        };
        let line = serde_json::to_string(&r).unwrap();
        assert!(!line.contains('\n'));
        assert!(line.contains(r#""event":"snapshot""#), "{line}");
        assert_eq!(
            parse(&format!("{line}\n\n{line}\n")).unwrap(),
            vec![r.clone(), r]
        );
    }

    #[test]
    fn a_broken_line_is_named() {
        let err = parse("{\"t\":1}\n").unwrap_err();
        assert!(matches!(err, Error::Parse { line: 1, .. }), "{err:?}");
    }
}
