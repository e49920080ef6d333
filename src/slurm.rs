//! Slurm: when the allocation this process runs in ends, and how to start worker processes
//! in it ([`SRUN_LAUNCH`]).
//!
//! A batch job asks for a time limit; at that limit Slurm kills it. Give the end of the
//! allocation to [`Builder::deadline`](crate::Builder::deadline) and the executor suspends
//! the job to its snapshot store in time to commit before it, even when the job script did
//! not ask for a signal (`#SBATCH --signal=B:USR1@120`, which
//! [`Builder::suspend_on_signals`](crate::Builder::suspend_on_signals) turns into a suspend):
//!
//! ```no_run
//! use malleable::{Executor, slurm};
//!
//! let mut builder = Executor::builder()
//!     .snapshots("file:///scratch/snapshots")
//!     .suspend_on_signals();
//! match slurm::allocation_deadline() {
//!     Ok(end) => builder = builder.deadline(end),
//!     Err(e) => eprintln!("no deadline: {e}"),
//! }
//! let exec = builder.build()?;
//! # drop(exec);
//! # Ok::<(), malleable::Error>(())
//! ```
//!
//! # Where the end time comes from
//!
//! 1. The job id is `SLURM_JOB_ID`, which Slurm sets in a batch script, in the tasks of
//!    `srun`, and in the shell of `salloc`. Without it this process is not in an allocation:
//!    [`Error::NotInAllocation`].
//! 2. `squeue -h -j ID -o %e` prints the job's end time, in seconds since the Unix epoch
//!    with `SLURM_TIME_FORMAT=%s` (no time zone to guess). Asked at the time of the call, so
//!    a time limit changed since the job started (`scontrol update JobId=ID TimeLimit=...`)
//!    is seen. A job without a time limit prints `NONE`: [`Error::NoEndTime`].
//! 3. If `squeue` cannot be started (not installed on the compute nodes, say), the
//!    variable `SLURM_JOB_END_TIME` is used if it is set (Slurm 23.02 and later set it to the
//!    end time known when the job started); Slurm 22.05 does not set it.

/// A [`CommandLauncher`](crate::cluster::CommandLauncher) template that starts each worker
/// process as a job step of one task inside the current allocation:
/// `srun --ntasks=1 --exact {bin} --worker {addr}` (the worker is this program, started with
/// `--worker ADDR`; write your own template for other arguments).
///
/// - `--exact` gives the step only the CPUs it asks for (one per task; add
///   `--cpus-per-task=N` for more). Without it a step takes every CPU of the allocation, so
///   the second worker waits until the first ends (srun prints "step creation temporarily
///   disabled, retrying (Requested nodes are busy)").
/// - srun passes the environment to the task (`--export=ALL`), so the worker gets the
///   token from [`TOKEN_ENV`](crate::cluster::TOKEN_ENV) without it appearing on a command
///   line.
/// - The workers dial `{addr}`, the address the executor listens on: listen on the node's
///   name (`SLURMD_NODENAME`), not `0.0.0.0`, when the allocation spans several nodes.
pub const SRUN_LAUNCH: &str = "srun --ntasks=1 --exact {bin} --worker {addr}";

use std::ffi::OsString;
use std::io;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The variable that holds the job id inside an allocation.
pub const JOB_ID_ENV: &str = "SLURM_JOB_ID";
/// The variable that newer Slurm versions (23.02 and later) set to the job's end time, in
/// seconds since the Unix epoch.
pub const END_TIME_ENV: &str = "SLURM_JOB_END_TIME";

/// A `Result` with the Slurm [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why the end of the allocation could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `SLURM_JOB_ID` is not set (or not Unicode): this process is not in a Slurm
    /// allocation.
    #[error("not in a Slurm allocation: {JOB_ID_ENV} is not set")]
    NotInAllocation,
    /// `squeue` could not be started, and `SLURM_JOB_END_TIME` is not set.
    #[error("cannot run squeue to read the end time of Slurm job {job}")]
    Squeue {
        /// The job id.
        job: String,
        /// The error from starting it.
        #[source]
        source: io::Error,
    },
    /// `squeue` ran but failed (say, the job id is unknown to the controller).
    #[error("squeue failed for Slurm job {job} ({status}): {stderr}")]
    SqueueFailed {
        /// The job id.
        job: String,
        /// Its exit status.
        status: ExitStatus,
        /// What it wrote on its standard error, trimmed.
        stderr: String,
    },
    /// `squeue` did not list the job: it has ended, or belongs to another cluster.
    #[error("squeue does not list Slurm job {job}: it has ended or is not on this cluster")]
    NotListed {
        /// The job id.
        job: String,
    },
    /// The job has no end time: it runs without a time limit.
    #[error("Slurm job {job} has no end time (no time limit): squeue printed {printed:?}")]
    NoEndTime {
        /// The job id.
        job: String,
        /// What was read.
        printed: String,
    },
    /// The end time read is not a number of seconds since the Unix epoch.
    #[error("the end time of Slurm job {job} does not parse: {printed:?} (from {from})")]
    Unparsable {
        /// The job id.
        job: String,
        /// What was read.
        printed: String,
        /// Where it was read: `squeue` or `SLURM_JOB_END_TIME`.
        from: &'static str,
        /// The parse error.
        #[source]
        source: std::num::ParseIntError,
    },
}

/// The end of the Slurm allocation this process runs in: the time at which Slurm ends the
/// job for its time limit (see the [module docs](self) for how it is read). Blocks while
/// `squeue` runs (tens of milliseconds: it asks the controller).
///
/// # Errors
///
/// [`Error::NotInAllocation`] outside an allocation; [`Error::NoEndTime`] for a job without a
/// time limit; [`Error::Squeue`], [`Error::SqueueFailed`], [`Error::NotListed`] or
/// [`Error::Unparsable`] when the end time cannot be read.
pub fn allocation_deadline() -> Result<SystemTime> {
    let job = std::env::var(JOB_ID_ENV).map_err(|_| Error::NotInAllocation)?;
    let output = Command::new("squeue")
        .args(["--noheader", "--jobs", &job, "--format", "%e"])
        .env("SLURM_TIME_FORMAT", "%s")
        .stdin(Stdio::null())
        .output();
    let output = match output {
        Ok(output) => output,
        Err(source) => {
            return match std::env::var_os(END_TIME_ENV) {
                Some(value) => parse_end_time(&job, &lossy(value), END_TIME_ENV),
                None => Err(Error::Squeue { job, source }),
            };
        }
    };
    if !output.status.success() {
        return Err(Error::SqueueFailed {
            job,
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        });
    }
    let printed = String::from_utf8_lossy(&output.stdout);
    // One line per job; a heterogeneous job's components all end together.
    match printed.lines().map(str::trim).find(|l| !l.is_empty()) {
        Some(line) => parse_end_time(&job, line, "squeue"),
        None => Err(Error::NotListed { job }),
    }
}

fn lossy(value: OsString) -> String {
    value.to_string_lossy().into_owned()
}

/// The end time `printed` (seconds since the Unix epoch, or `NONE` and the like for a job
/// without a time limit) of job `job`, read from `from`.
fn parse_end_time(job: &str, printed: &str, from: &'static str) -> Result<SystemTime> {
    let printed = printed.trim();
    if matches!(printed, "NONE" | "Unknown" | "UNLIMITED" | "N/A" | "") {
        return Err(Error::NoEndTime {
            job: job.to_owned(),
            printed: printed.to_owned(),
        });
    }
    let secs: u64 = printed.parse().map_err(|source| Error::Unparsable {
        job: job.to_owned(),
        printed: printed.to_owned(),
        from,
        source,
    })?;
    Ok(UNIX_EPOCH + Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_since_the_epoch_parse() {
        let t = parse_end_time("7", " 1795455836\n", "squeue").unwrap();
        assert_eq!(t, UNIX_EPOCH + Duration::from_secs(1_795_455_836));
    }

    #[test]
    fn no_time_limit_is_its_own_error() {
        for printed in ["NONE", "UNLIMITED", "Unknown"] {
            match parse_end_time("7", printed, "squeue") {
                Err(Error::NoEndTime { job, printed: p }) => {
                    assert_eq!((job.as_str(), p.as_str()), ("7", printed));
                }
                other => panic!("{printed}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_local_time_is_refused_with_its_text() {
        // What squeue prints without SLURM_TIME_FORMAT=%s: a local time, zone unknown.
        let err = parse_end_time("7", "2026-11-23T17:45:12", END_TIME_ENV).unwrap_err();
        let shown = err.to_string();
        assert!(
            shown.contains("2026-11-23T17:45:12") && shown.contains(END_TIME_ENV),
            "{shown}"
        );
        assert!(std::error::Error::source(&err).is_some());
    }
}
