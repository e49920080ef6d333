//! Progress of a job run: what [`JobHandle::progress`] reports, the rate meter behind it, and
//! the updates a caller can wait for instead of polling ([`JobHandle::progress_updates`]).
//!
//! The rate is this run's own: a resumed job's iterations done before its snapshot count in
//! [`Progress::done_all_phases`] but not in the rate, whose clock starts with the run. It is
//! an exponentially weighted moving average of the rates between samples (time constant
//! [`RATE_WINDOW`]), so it follows a change of worker count within a few seconds without
//! jumping with every chunk. Samples are taken when progress is published (at most every
//! [`PUBLISH_EVERY`], on an event the job's mutex is already held for, never per step) and
//! when the handle is asked.
//!
//! [`JobHandle::progress`]: super::JobHandle::progress
//! [`JobHandle::progress_updates`]: super::JobHandle::progress_updates

use std::time::Duration;

use super::job_run::State;
use crate::job::Job;

/// The time constant of the rate's moving average.
pub(crate) const RATE_WINDOW: Duration = Duration::from_secs(3);

/// Progress is published to [`ProgressUpdates`] at most this often (and at every phase end,
/// and when the job ends).
pub(crate) const PUBLISH_EVERY: Duration = Duration::from_millis(100);

/// Samples closer together than this are not used for the rate (their quotient is noise).
const MIN_SAMPLE: Duration = Duration::from_millis(20);

/// Progress of a job, from [`JobHandle::progress`](super::JobHandle::progress) or
/// [`ProgressUpdates`](super::ProgressUpdates).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Progress {
    /// The current phase (0-based).
    pub phase: u64,
    /// Phases the job says it runs in all ([`Job::phases`]); `None` when it does not say.
    pub phases: Option<u64>,
    /// Iterations of the current phase done (whole chunks, plus the running chunks'
    /// published progress when they report it).
    pub done: u64,
    /// Iterations of the current phase.
    pub total: u64,
    /// Iterations done since the job started, all phases, including those done before the
    /// snapshot this run was resumed from.
    pub done_all_phases: u64,
    /// Iterations per second in this run (not counting work done before a resume), a moving
    /// average over the last few seconds; 0 before anything was measured.
    pub rate: f64,
    /// Time left in the current phase at `rate`; `None` before anything was measured.
    pub phase_eta: Option<Duration>,
    /// Time left for the whole job at `rate`, when the job says how many phases it runs
    /// ([`Job::phases`]) and later phases are as large as this one; `None` otherwise.
    pub eta: Option<Duration>,
    /// Local workers (threads, or 1 for the inline worker), retiring ones included.
    pub local_workers: usize,
    /// Connected worker processes, retiring ones excluded.
    pub remote_workers: usize,
    /// Whether the job has ended (this is its last report).
    pub ended: bool,
}

/// A moving average of the rate of one run.
#[derive(Debug)]
pub(crate) struct Meter {
    /// When the run started, and the iterations done then (all phases).
    start: (Duration, u64),
    /// The last sample.
    last: (Duration, u64),
    /// The moving average, once two samples were far enough apart.
    average: Option<f64>,
}

impl Meter {
    pub(crate) fn new(now: Duration, done: u64) -> Meter {
        Meter {
            start: (now, done),
            last: (now, done),
            average: None,
        }
    }

    /// Takes a sample and returns the rate.
    pub(crate) fn sample(&mut self, now: Duration, done: u64) -> f64 {
        let dt = now.saturating_sub(self.last.0);
        if dt >= MIN_SAMPLE {
            let dt = dt.as_secs_f64();
            // A rollback takes work back: the rate counts from there again.
            let moved = done.saturating_sub(self.last.1) as f64;
            let now_rate = moved / dt;
            self.average = Some(match self.average {
                None => {
                    let since = now.saturating_sub(self.start.0).as_secs_f64();
                    done.saturating_sub(self.start.1) as f64 / since
                }
                Some(avg) => {
                    avg + (1.0 - (-dt / RATE_WINDOW.as_secs_f64()).exp()) * (now_rate - avg)
                }
            });
            self.last = (now, done);
        }
        self.average.unwrap_or(0.0)
    }
}

/// What the state knows of publishing its progress: the channel's sender is the driver's
/// (`links.rs`), its receivers are [`ProgressUpdates`](super::ProgressUpdates).
#[derive(Debug)]
pub(crate) struct Publisher {
    /// Whether anyone listens (set by the driver when it takes the lock).
    pub(crate) listening: bool,
    last: Option<Duration>,
    pub(crate) meter: Meter,
    /// The job's phase count, asked once per phase (user code does not run under the lock
    /// from the handle).
    pub(crate) phases: Option<u64>,
}

impl Publisher {
    pub(crate) fn new(now: Duration, done: u64, phases: Option<u64>) -> Publisher {
        Publisher {
            listening: false,
            last: None,
            meter: Meter::new(now, done),
            phases,
        }
    }
}

impl<J: Job> State<J> {
    /// The progress report, sampling the rate.
    pub(crate) fn progress(&mut self) -> Progress {
        let (done_chunks, total) = self.core.progress();
        let running: u64 = self
            .members
            .locals()
            .filter(|(w, _)| self.core.running_on(*w).is_some())
            .map(|(_, l)| l.progress)
            .sum::<u64>()
            + self.remote_progress();
        let done = (done_chunks + running).min(total);
        let done_all_phases = self.iterations_before + done;
        let rate = self.published.meter.sample(self.now, done_all_phases);
        let left = |iterations: u64| eta(iterations, rate);
        let phases = self.published.phases;
        let later = phases.map(|n| n.saturating_sub(self.phase + 1).saturating_mul(total));
        Progress {
            phase: self.phase,
            phases,
            done,
            total,
            done_all_phases,
            rate,
            phase_eta: left(total - done),
            eta: later.and_then(|l| left((total - done).saturating_add(l))),
            local_workers: self.members.local_count(),
            remote_workers: self.remote_count(),
            ended: self.ended,
        }
    }

    /// Publishes progress to the receivers if the last publication is older than
    /// [`PUBLISH_EVERY`], or `now` is set (a phase end, the job's end). Costs one clock read
    /// when nobody listens or nothing is due.
    pub(crate) fn publish_progress(&mut self, now: bool) {
        if !now && !self.published.listening {
            return;
        }
        let t = self.now;
        if !now && self.published.last.is_some_and(|l| t - l < PUBLISH_EVERY) {
            return;
        }
        self.published.last = Some(t);
        let p = self.progress();
        self.orders.push(super::links::Order::Progress(p));
    }
}

/// The time `iterations` take at `rate` a second; `None` when that is unknown: no rate, or
/// one so small that the time is past what a `Duration` holds. (A job stalled for a
/// minute or two decays its moving average towards zero, and `JobHandle::progress`
/// panicked converting the quotient.)
fn eta(iterations: u64, rate: f64) -> Option<Duration> {
    if rate > 0.0 {
        Duration::try_from_secs_f64(iterations as f64 / rate).ok()
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_eta_past_what_a_duration_holds_is_unknown() {
        assert_eq!(eta(100, 10.0), Some(Duration::from_secs(10)));
        assert_eq!(eta(0, 10.0), Some(Duration::ZERO));
        assert_eq!(eta(100, 0.0), None);
        assert_eq!(eta(100, f64::NAN), None);
        assert_eq!(eta(100, 1e-300), None);
        assert_eq!(eta(u64::MAX, f64::MIN_POSITIVE), None);
    }

    /// A run that stops making progress (every worker stalled): its rate decays towards
    /// zero, and the time left is unknown once it is too long to say, never a panic.
    #[test]
    fn a_stalled_run_s_rate_decays_and_its_eta_becomes_unknown() {
        let t0 = Duration::from_secs(7);
        let mut m = Meter::new(t0, 0);
        let mut t = t0 + Duration::from_secs(1);
        assert!(m.sample(t, 1_000) > 0.0);
        for _ in 0..100_000 {
            t += Duration::from_millis(100);
            let rate = m.sample(t, 1_000);
            assert!(rate >= 0.0 && rate.is_finite(), "{rate}");
            let _ = eta(1_000_000, rate);
        }
        assert_eq!(eta(1_000_000, m.sample(t, 1_000)), None);
    }

    #[test]
    fn the_rate_counts_this_run_only() {
        let t0 = Duration::from_secs(7);
        // Resumed with a million iterations done before.
        let mut m = Meter::new(t0, 1_000_000);
        let r = m.sample(t0 + Duration::from_secs(1), 1_000_100);
        assert!((r - 100.0).abs() < 1e-9, "{r}");
    }

    #[test]
    fn the_rate_follows_a_change_within_a_few_windows() {
        let t0 = Duration::from_secs(7);
        let mut m = Meter::new(t0, 0);
        let mut done = 0;
        let mut t = t0;
        for _ in 0..100 {
            t += Duration::from_millis(100);
            done += 100; // 1000/s
            m.sample(t, done);
        }
        let before = m.sample(t, done);
        assert!((before - 1000.0).abs() < 1.0, "{before}");
        for _ in 0..(3 * 10 * RATE_WINDOW.as_secs()) {
            t += Duration::from_millis(100);
            done += 200; // 2000/s
            m.sample(t, done);
        }
        let after = m.sample(t, done);
        assert!((after - 2000.0).abs() < 2000.0 * 0.06, "{after}");
    }

    #[test]
    fn close_samples_do_not_move_the_rate() {
        let t0 = Duration::from_secs(7);
        let mut m = Meter::new(t0, 0);
        let r = m.sample(t0 + Duration::from_secs(1), 1000);
        let r2 = m.sample(
            t0 + Duration::from_secs(1) + Duration::from_millis(1),
            1_000_000,
        );
        assert_eq!(r, r2);
    }
}
