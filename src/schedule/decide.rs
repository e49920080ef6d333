//! The autoscaling decider: measurements in, decisions out.
//!
//! [`Decider`] is a pure state machine, like the core: the executor's timer task hands it a
//! [`Measurement`] once per period (iterations done so far, work left, the workers' measured
//! throughputs, and the time, which is an input: the decider has no clock) and carries out the
//! [`Decision`] it returns, if any, with the job's own scaling paths. Every decision carries its
//! [`Reason`], whose `Display` is one line for the log.
//!
//! # Why it is shaped like this
//!
//! Autoscalers of the peers fail in known ways, and each rule below answers one of them:
//!
//! - *Bouncing.* Dask's `Adaptive` re-evaluates its target every interval from a snapshot of the
//!   load, and is known to add and remove the same workers over and over when the load sits near
//!   a threshold. Here a decision needs the mean of a full window of measurements taken after
//!   the last change had settled, outside a dead band that widens with the measured noise
//!   (`dead_band` plus `confidence` standard errors of the window mean), and a decision in the
//!   opposite direction of the previous one waits `reverse_after`.
//! - *Rescaling too often.* Flink's reactive mode and its autoscaler restart a job for every
//!   change of parallelism, and users report jobs rescaled twenty times a day for noise. Here
//!   nothing is decided during the `cooldown` after a change (the new workers warm up, owned
//!   partitions move), a change must be worth its cost (a worker process costs a launch and a
//!   join, a moved partition costs bytes over a link), and one decision goes all the way to the
//!   count the measurements ask for, instead of one worker per interval.
//! - *Slow to give back.* Kubernetes' horizontal autoscaler waits out a scale-down
//!   stabilization window, 300 s by default, whatever the load. Here the wait is the window of
//!   measurements and the cool-down, both short by default (5 s and 3 s: a job of a minute
//!   gets its first decision within about ten seconds of its start); flapping is kept away
//!   by the band and by the `reverse_after` rule, not by holding resources.
//! - *Adding workers that do nothing.* A third thread on two cores, or a worker behind a
//!   saturated link, adds cost and no throughput; threshold-based scalers keep adding them
//!   because the target is still not reached. Here the first full window after a grow measures
//!   its *marginal gain*: the aggregate after minus the aggregate before, against the speed one
//!   more worker was expected to add. Workers whose gain was not there (less than `min_gain` of
//!   the expected, beyond noise) are removed at once (reason [`Reason::NoGain`]) and that count
//!   becomes a ceiling the decider does not grow past until `relearn` has passed (capacity may
//!   come back, so the ceiling is tried again later, not forever).
//!
//! The moving averages follow Dynamite's load monitor (seed 004): a ring of the last
//! `window` samples, whose mean and spread are kept by the decider; the per-worker speeds are
//! the core's own exponentially weighted throughputs.
//!
//! # Protocol (one call of [`Decider::observe`])
//!
//! 1. The aggregate throughput of the last period is `done` minus the previous `done`, over the
//!    time between the two measurements.
//! 2. Counts changed by someone else (the user's `set_local_workers`, a lost worker process) are
//!    adopted as if decided, and restart the cool-down. A grow of worker processes is in effect
//!    when they have joined; until then the decider waits, and measures the delay of the join.
//! 3. Counts outside the bounds are brought inside at once ([`Reason::Bounds`]).
//! 4. During the cool-down after a change, measurements are dropped.
//! 5. After it, samples fill the window; while it is not full nothing is decided. If the newer
//!    half of a full window differs from the older half by more than the band, the load has
//!    just moved: the older half is dropped and the decider waits for the window to fill again,
//!    so that one decision is made on the new level rather than several on a moving mean.
//! 6. The first full window after a grow judges its marginal gain (see above).
//! 7. The goal: for a target throughput, grow if the mean is under the band around the target,
//!    shrink if fewer workers still reach it; for a deadline, the same around the rate the work
//!    left needs in the time left (less the decider's reaction time), plus `safety`. A grow
//!    takes local workers first (they start at once), then worker processes if the time left
//!    pays for their join; a shrink lets worker processes go first.
//!
//! # What it guarantees
//!
//! - Decisions stay within the bounds, and never go past a learned ceiling.
//! - No two decisions closer than the cool-down (a [`Reason::Bounds`] decision excepted).
//! - No decision in the direction opposite to the previous one within `reverse_after`, except
//!   the undoing of workers that were measured to gain nothing, and, with a deadline, a grow:
//!   missing the deadline costs more than a flap. Such a grow sets a floor: the count it
//!   reaches is not shrunk below for `relearn`, so that it does not flap again.
//! - One call is `O(workers + window)`, with no allocation.

use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

/// A kind of worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A thread of this process.
    Local,
    /// A worker process connected over TCP.
    Remote,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Local => "local",
            Kind::Remote => "remote",
        })
    }
}

/// What the decider aims at.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Goal {
    /// Finish the job within this time of its start (its submit, or its resume), with the
    /// fewest worker-seconds: the smallest count whose measured throughput finishes the work
    /// left in time, with `safety` in hand.
    FinishWithin(Duration),
    /// Reach this throughput, in iterations per second (all phases alike), with the fewest
    /// workers.
    Throughput(f64),
}

/// How many workers of each kind the decider may use. A count outside is brought inside at
/// once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Fewest local worker threads (0 runs the job inline on the waiting thread).
    pub min_local: usize,
    /// Most local worker threads; at least `min_local`.
    pub max_local: usize,
    /// Fewest worker processes.
    pub min_remote: usize,
    /// Most worker processes; at least `min_remote`. Above 0, the executor needs
    /// [`Builder::listen`](crate::Builder::listen) and
    /// [`Builder::launcher`](crate::Builder::launcher).
    pub max_remote: usize,
}

/// What keeps noise from flapping the decider.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hysteresis {
    /// After the start and after a change takes effect, measurements are ignored this long
    /// (they settle: new workers warm up, partitions move). Default 3 s.
    pub cooldown: Duration,
    /// Measurements averaged for one decision, at least 2. Default 10 (5 s at the default
    /// period of 500 ms): with the cool-down, the first decision can come about 8.5 s after
    /// the start.
    pub window: usize,
    /// Half-width of the band around the goal where nothing is done, as a fraction of the
    /// goal, in `[0, 1)`. Default 0.1.
    pub dead_band: f64,
    /// Standard errors of the window's mean added to the band (and required of a marginal gain
    /// before it is judged absent), at least 0. Default 2.
    pub confidence: f64,
    /// The least time between two decisions in opposite directions. Default 60 s.
    pub reverse_after: Duration,
}

impl Default for Hysteresis {
    fn default() -> Self {
        Hysteresis {
            cooldown: Duration::from_secs(3),
            window: 10,
            dead_band: 0.1,
            confidence: 2.0,
            reverse_after: Duration::from_secs(60),
        }
    }
}

/// What a change of workers costs. Each is a first guess: the decider measures all three
/// as the job runs ([`Decider::join_delay`], [`Decider::move_bytes`], [`Decider::bandwidth`])
/// and uses its measurements once it has them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Costs {
    /// From asking for a worker process to its first work: the launch and the join. The
    /// decider starts from this value and then measures it. Default 10 s.
    pub remote_join: Duration,
    /// Bytes of owned partitions that move when one worker is added or removed (0 for a job
    /// without owned partitions). Default 0. Measured per kind of worker from the bytes the
    /// executor reports ([`Decider::moved`]) during the cool-down after a change.
    pub move_bytes: u64,
    /// Bytes per second those partitions move at, above 0. Default 100 MB/s. Measured from
    /// the same reports.
    pub bandwidth: f64,
}

impl Default for Costs {
    fn default() -> Self {
        Costs {
            remote_join: Duration::from_secs(10),
            move_bytes: 0,
            bandwidth: 100e6,
        }
    }
}

/// An autoscaling policy: a goal, bounds, hysteresis and costs. Give it to
/// [`Builder::autoscale`](crate::Builder::autoscale), or drive a [`Decider`] with it yourself.
///
/// ```
/// use malleable::schedule::Autoscale;
/// use std::time::Duration;
///
/// let mut policy = Autoscale::throughput(5e6).local(1, 8);
/// policy.hysteresis.cooldown = Duration::from_secs(30);
/// assert!(policy.validate().is_ok());
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct Autoscale {
    /// What to aim at.
    pub goal: Goal,
    /// Worker counts allowed. Default: 1 to the available parallelism local, no remote.
    pub bounds: Bounds,
    /// Against noise.
    pub hysteresis: Hysteresis,
    /// What changes cost.
    pub costs: Costs,
    /// How often the executor measures and asks the decider, above 0. Default 500 ms.
    pub period: Duration,
    /// A grow whose measured gain per added worker is under this fraction of the expected
    /// speed of one worker (with `confidence` standard errors of the benefit of the doubt) is
    /// undone, in `[0, 1]`. Default 0.5.
    pub min_gain: f64,
    /// How long a ceiling learned from a grow without gain holds. Default 600 s.
    pub relearn: Duration,
    /// Deadline: throughput kept in hand above what the work left needs, as a fraction, at
    /// least 0. Default 0.1.
    pub safety: f64,
    /// Deadline: phases of the job in all, if it can say (every phase taken as large as the
    /// current one); without it, the work left is the current phase's. Default `None`.
    pub phases: Option<u64>,
}

impl Autoscale {
    /// A policy with the defaults around `goal`, for at most `max_local` local threads.
    /// (The public constructors, [`Autoscale::throughput`] and [`Autoscale::finish_within`],
    /// live with the executor: the default bound is the machine's parallelism, which this
    /// pure layer does not ask.)
    pub(crate) fn with_goal(goal: Goal, max_local: usize) -> Autoscale {
        Autoscale {
            goal,
            bounds: Bounds {
                min_local: 1,
                max_local: max_local.max(1),
                min_remote: 0,
                max_remote: 0,
            },
            hysteresis: Hysteresis::default(),
            costs: Costs::default(),
            period: Duration::from_millis(500),
            min_gain: 0.5,
            relearn: Duration::from_secs(600),
            safety: 0.1,
            phases: None,
        }
    }

    /// Between `min` and `max` local worker threads.
    pub fn local(mut self, min: usize, max: usize) -> Autoscale {
        self.bounds.min_local = min;
        self.bounds.max_local = max;
        self
    }

    /// Between `min` and `max` worker processes.
    pub fn remote(mut self, min: usize, max: usize) -> Autoscale {
        self.bounds.min_remote = min;
        self.bounds.max_remote = max;
        self
    }

    /// Measure and decide every `period`.
    pub fn period(mut self, period: Duration) -> Autoscale {
        self.period = period;
        self
    }

    /// The job has `n` phases in all (for a deadline: the work left counts the phases after
    /// the current one, each as large as it). Overrides [`Job::phases`](crate::Job::phases).
    pub fn phases(mut self, n: u64) -> Autoscale {
        self.phases = Some(n);
        self
    }

    /// With this hysteresis.
    pub fn hysteresis(mut self, hysteresis: Hysteresis) -> Autoscale {
        self.hysteresis = hysteresis;
        self
    }

    /// With these costs.
    pub fn costs(mut self, costs: Costs) -> Autoscale {
        self.costs = costs;
        self
    }

    /// Checks every field against the bounds its documentation states.
    ///
    /// # Errors
    ///
    /// [`InvalidPolicy`] naming the first field out of bounds.
    pub fn validate(&self) -> Result<(), InvalidPolicy> {
        let b = &self.bounds;
        let h = &self.hysteresis;
        let bad = |what: &'static str| Err(InvalidPolicy(what));
        match self.goal {
            Goal::Throughput(t) if !(t.is_finite() && t > 0.0) => {
                return bad("the target throughput must be a positive number");
            }
            Goal::FinishWithin(d) if d.is_zero() => {
                return bad("the deadline must be after the start");
            }
            _ => {}
        }
        if b.min_local > b.max_local || b.min_remote > b.max_remote {
            return bad("a minimum count is above its maximum");
        }
        if b.max_local + b.max_remote == 0 {
            return bad("the bounds allow no worker");
        }
        if h.window < 2 {
            return bad("the window needs at least 2 measurements");
        }
        if !(0.0..1.0).contains(&h.dead_band) || h.confidence.is_nan() || h.confidence < 0.0 {
            return bad("the dead band must be in [0, 1) and the confidence at least 0");
        }
        if self.period.is_zero() {
            return bad("the period must be above zero");
        }
        if !(0.0..=1.0).contains(&self.min_gain) || self.safety.is_nan() || self.safety < 0.0 {
            return bad("min_gain must be in [0, 1] and safety at least 0");
        }
        if self.costs.bandwidth.is_nan() || self.costs.bandwidth <= 0.0 {
            return bad("the bandwidth must be above zero");
        }
        Ok(())
    }
}

/// An [`Autoscale`] policy with a field out of its bounds: this layer's own refusal (the
/// crate's error type lives above it); the executor's `build` turns it into an invalid configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InvalidPolicy(&'static str);

impl std::fmt::Display for InvalidPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "autoscale: {}", self.0)
    }
}

impl std::error::Error for InvalidPolicy {}

/// What the executor measured, once per period.
#[derive(Debug, Clone, Copy)]
pub struct Measurement<'a> {
    /// Time since the job's start. Must not go back.
    pub now: Duration,
    /// Iterations done since the job's start, all phases.
    pub done: u64,
    /// Iterations left in the whole job, if known (needed by a deadline).
    pub left: Option<u64>,
    /// Local workers now (the requested count).
    pub local: usize,
    /// Worker processes connected now, retiring ones excluded.
    pub remote: usize,
    /// Measured throughput of each local worker, iterations per second (0: not yet measured).
    pub local_rates: &'a [f64],
    /// Measured throughput of each worker process (all its threads), iterations per second
    /// (0: not yet measured).
    pub remote_rates: &'a [f64],
}

/// Which way a decision goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// More workers in all.
    Grow,
    /// Fewer workers in all.
    Shrink,
    /// As many in all, of other kinds (only to come inside the bounds).
    Swap,
}

/// Why a decision was taken. `Display` gives one line for the log.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Reason {
    /// The counts were outside the bounds.
    Bounds,
    /// The measured throughput (mean of the window, iterations per second) is under the
    /// target.
    BelowTarget {
        /// Measured.
        measured: f64,
        /// Wanted.
        target: f64,
    },
    /// Fewer workers still reach the target.
    AboveTarget {
        /// Measured.
        measured: f64,
        /// Wanted.
        target: f64,
    },
    /// At the measured throughput the work left would not be done before the deadline
    /// (with `safety` in hand).
    BehindDeadline {
        /// Measured, iterations per second.
        measured: f64,
        /// Needed for the work left in the time left, iterations per second.
        needed: f64,
        /// Seconds left before the deadline.
        left_secs: f64,
    },
    /// Fewer workers still finish before the deadline.
    AheadOfDeadline {
        /// Measured, iterations per second.
        measured: f64,
        /// Needed for the work left in the time left, iterations per second.
        needed: f64,
        /// Seconds left before the deadline.
        left_secs: f64,
    },
    /// The last grow's workers did not raise the throughput: those that gained nothing are
    /// removed, and the count they were added to is a ceiling for a while.
    NoGain {
        /// The kind of the workers added.
        kind: Kind,
        /// Workers added by the grow.
        added: usize,
        /// Measured gain of the grow in all, iterations per second.
        gain: f64,
        /// Expected speed of one added worker, iterations per second.
        expected: f64,
    },
}

impl Reason {
    /// A short name, for a metric label.
    pub fn name(&self) -> &'static str {
        match self {
            Reason::Bounds => "bounds",
            Reason::BelowTarget { .. } => "below_target",
            Reason::AboveTarget { .. } => "above_target",
            Reason::BehindDeadline { .. } => "behind_deadline",
            Reason::AheadOfDeadline { .. } => "ahead_of_deadline",
            Reason::NoGain { .. } => "no_gain",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Reason::Bounds => f.write_str("the counts were outside the bounds"),
            Reason::BelowTarget { measured, target } => write!(
                f,
                "below the target: {measured:.1} iterations/s measured, {target:.1} wanted"
            ),
            Reason::AboveTarget { measured, target } => write!(
                f,
                "above the target: {measured:.1} iterations/s measured, {target:.1} wanted"
            ),
            Reason::BehindDeadline {
                measured,
                needed,
                left_secs,
            } => write!(
                f,
                "behind the deadline: {measured:.1} iterations/s measured, {needed:.1} needed \
                 in the {left_secs:.0} s left"
            ),
            Reason::AheadOfDeadline {
                measured,
                needed,
                left_secs,
            } => write!(
                f,
                "ahead of the deadline: {measured:.1} iterations/s measured, {needed:.1} needed \
                 in the {left_secs:.0} s left"
            ),
            Reason::NoGain {
                kind,
                added,
                gain,
                expected,
            } => write!(
                f,
                "no gain: {added} {kind} workers added {gain:.1} iterations/s in all, \
                 {expected:.1} expected of each"
            ),
        }
    }
}

/// A decision: bring the job to `local` threads and `remote` worker processes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decision {
    /// Local worker threads before.
    pub from_local: usize,
    /// Worker processes before.
    pub from_remote: usize,
    /// Local worker threads wanted.
    pub local: usize,
    /// Worker processes wanted.
    pub remote: usize,
    /// Why.
    pub reason: Reason,
}

impl Decision {
    /// Which way it goes.
    pub fn direction(&self) -> Direction {
        let (before, after) = (self.from_local + self.from_remote, self.local + self.remote);
        match after.cmp(&before) {
            std::cmp::Ordering::Greater => Direction::Grow,
            std::cmp::Ordering::Less => Direction::Shrink,
            std::cmp::Ordering::Equal => Direction::Swap,
        }
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "local {} -> {}, remote {} -> {}: {}",
            self.from_local, self.local, self.from_remote, self.remote, self.reason
        )
    }
}

/// Why a measurement took no decision: what the decider waits for, from
/// [`Decider::waiting`] (and on the job's handle, `JobHandle::autoscale`). `Display` gives
/// one line for the log.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Waiting {
    /// A throughput is measured between two measurements: this was the first since the start
    /// or the last change.
    FirstMeasurement,
    /// Worker processes asked for have not all joined yet: nothing is measured until they
    /// have (or until three join delays have passed).
    Joining {
        /// Worker processes asked for.
        asked: usize,
        /// Joined so far.
        joined: usize,
    },
    /// The cool-down after the start or the last change: measurements are dropped while new
    /// workers warm up and partitions move ([`Hysteresis::cooldown`]).
    CoolingDown {
        /// Until it ends.
        left: Duration,
    },
    /// The window of measurements fills: a decision needs it full ([`Hysteresis::window`]).
    Measuring {
        /// Samples in the window.
        samples: usize,
        /// Samples a decision needs.
        window: usize,
    },
    /// The newer half of the window differs from the older half by more than the dead band:
    /// the throughput moved, so the window starts again on the new level.
    Moved {
        /// Mean of the older half, iterations per second.
        older: f64,
        /// Mean of the newer half, iterations per second.
        newer: f64,
    },
    /// Nothing was done over the window (a barrier, a suspend, the end): nothing to judge.
    Idle,
    /// The throughput is inside the band around the goal: nothing to do.
    OnTarget {
        /// Measured, iterations per second.
        measured: f64,
        /// The band's lower edge.
        low: f64,
        /// The band's upper edge.
        high: f64,
    },
    /// Under the goal, but no worker may be added: each kind is at its maximum or at a
    /// ceiling learned from a grow that gained nothing ([`Reason::NoGain`]), or a worker
    /// process would not pay for its join.
    AtMaximum {
        /// Measured, iterations per second.
        measured: f64,
        /// Wanted, iterations per second.
        wanted: f64,
    },
    /// Over the goal, but no worker can go without falling under it (or the counts are at
    /// their minimum).
    AtMinimum {
        /// Measured, iterations per second.
        measured: f64,
        /// Wanted, iterations per second.
        wanted: f64,
    },
    /// A decision in this direction would reverse the last one too soon
    /// ([`Hysteresis::reverse_after`]).
    Reversal {
        /// The direction it would take.
        direction: Direction,
        /// Until it may.
        left: Duration,
    },
    /// The job would end before a shrink paid for its cool-down and moves.
    NearTheEnd {
        /// Seconds to the end at the measured throughput.
        finish_secs: f64,
    },
    /// A deadline needs the work left, and the measurement did not say it.
    WorkLeftUnknown,
    /// No work is left.
    NoWorkLeft,
}

impl fmt::Display for Waiting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Waiting::FirstMeasurement => {
                f.write_str("measuring: a throughput needs a second measurement")
            }
            Waiting::Joining { asked, joined } => {
                write!(
                    f,
                    "waiting for worker processes to join: {joined} of {asked}"
                )
            }
            Waiting::CoolingDown { left } => write!(
                f,
                "cooling down after the start or the last change: {:.1} s left",
                left.as_secs_f64()
            ),
            Waiting::Measuring { samples, window } => {
                write!(f, "measuring: {samples} of {window} samples")
            }
            Waiting::Moved { older, newer } => write!(
                f,
                "the throughput moved from {older:.1} to {newer:.1} iterations/s within the \
                 window: measuring again"
            ),
            Waiting::Idle => f.write_str("idle: no iteration done over the window"),
            Waiting::OnTarget {
                measured,
                low,
                high,
            } => write!(
                f,
                "on target: {measured:.1} iterations/s measured, inside {low:.1} to {high:.1}"
            ),
            Waiting::AtMaximum { measured, wanted } => write!(
                f,
                "at the maximum: {measured:.1} iterations/s measured, {wanted:.1} wanted, and \
                 no worker may be added (bounds, a learned ceiling, or a join that would not \
                 pay)"
            ),
            Waiting::AtMinimum { measured, wanted } => write!(
                f,
                "at the minimum: {measured:.1} iterations/s measured, {wanted:.1} wanted, and \
                 no worker can go without falling under it"
            ),
            Waiting::Reversal { direction, left } => write!(
                f,
                "a {} would reverse the last decision: {:.1} s left before it may",
                match direction {
                    Direction::Grow => "grow",
                    Direction::Shrink => "shrink",
                    Direction::Swap => "swap",
                },
                left.as_secs_f64()
            ),
            Waiting::NearTheEnd { finish_secs } => write!(
                f,
                "near the end: {finish_secs:.1} s left at the measured throughput, a shrink \
                 would not pay"
            ),
            Waiting::WorkLeftUnknown => f.write_str("the work left is unknown"),
            Waiting::NoWorkLeft => f.write_str("no work left"),
        }
    }
}

/// Mean and standard error of a window of samples.
#[derive(Debug, Clone, Copy)]
struct Stats {
    mean: f64,
    se: f64,
}

fn stats(samples: impl ExactSizeIterator<Item = f64> + Clone) -> Stats {
    let n = samples.len().max(1) as f64;
    let mean = samples.clone().sum::<f64>() / n;
    let var = samples.map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0).max(1.0);
    Stats {
        mean,
        se: (var / n).sqrt(),
    }
}

/// A grow waiting for its marginal gain to be judged.
#[derive(Debug, Clone, Copy)]
struct Check {
    kind: Kind,
    added: usize,
    /// Count of `kind` before the grow.
    before_count: usize,
    before: Stats,
    /// Expected speed of one added worker.
    expected: f64,
}

/// The autoscaling decider (see the module docs): feed it a [`Measurement`] once per period.
#[derive(Debug, Clone)]
pub struct Decider {
    cfg: Autoscale,
    /// Counts as decided or adopted.
    local: usize,
    remote: usize,
    /// Whether the counts are known (after the first measurement).
    started: bool,
    /// When the last change took effect (measurements before `changed + cooldown` are dropped).
    changed: Duration,
    /// Direction and time of the last decision.
    last: Option<(Direction, Duration)>,
    prev: Option<(Duration, u64)>,
    /// Mean time between measurements, seconds (for the reaction time).
    dt: f64,
    window: VecDeque<f64>,
    check: Option<Check>,
    /// Per kind: the most workers that paid off, and until when that holds.
    ceiling: [Option<(usize, Duration)>; 2],
    /// With a deadline: the fewest workers in all that proved needed (a shrink that a grow
    /// had to undo), and until when that holds.
    floor: Option<(usize, Duration)>,
    /// A grow of worker processes waiting for them to join: when it was decided.
    launching: Option<Duration>,
    /// Measured launch and join delay of a worker process, seconds, and how many joins
    /// were measured.
    join: f64,
    joins: u64,
    /// Variance of one sample relative to its window's mean (a moving average), and how many
    /// samples taught it.
    noise: f64,
    noise_samples: u64,
    decisions: u64,
    /// Per kind: bytes of owned partitions that move per worker added or removed, and how
    /// many changes taught it (0: the configured guess).
    move_bytes: [(f64, u64); 2],
    /// Bytes per second partitions moved at, and how many reports taught it.
    bandwidth: (f64, u64),
    /// The last decision's change, whose moves are being counted until its cool-down ends:
    /// the kind that changed, by how many workers, and the bytes reported so far.
    moving: Option<(Kind, usize, u64)>,
    /// Why the last measurement took no decision.
    waiting: Option<Waiting>,
}

impl Decider {
    /// A decider for this policy (check it with [`Autoscale::validate`] first).
    pub fn new(cfg: Autoscale) -> Decider {
        Decider {
            local: 0,
            remote: 0,
            started: false,
            changed: Duration::ZERO,
            last: None,
            prev: None,
            dt: cfg.period.as_secs_f64(),
            window: VecDeque::with_capacity(cfg.hysteresis.window + 1),
            check: None,
            ceiling: [None, None],
            floor: None,
            launching: None,
            join: cfg.costs.remote_join.as_secs_f64(),
            joins: 0,
            noise: 0.0,
            noise_samples: 0,
            decisions: 0,
            move_bytes: [(cfg.costs.move_bytes as f64, 0); 2],
            bandwidth: (cfg.costs.bandwidth, 0),
            moving: None,
            waiting: None,
            cfg,
        }
    }

    /// The policy.
    pub fn policy(&self) -> &Autoscale {
        &self.cfg
    }

    /// Decisions taken so far.
    pub fn decisions(&self) -> u64 {
        self.decisions
    }

    /// The measured launch and join delay of a worker process (the configured one until a
    /// join was seen).
    pub fn join_delay(&self) -> Duration {
        Duration::from_secs_f64(self.join)
    }

    /// Bytes of owned partitions that move per worker of `kind` added or removed: measured
    /// over the changes of that kind so far ([`Decider::moved`]), the configured guess
    /// ([`Costs::move_bytes`]) until one was measured.
    pub fn move_bytes(&self, kind: Kind) -> u64 {
        self.move_bytes[kind as usize].0 as u64
    }

    /// Bytes per second owned partitions moved at: measured, or the configured guess
    /// ([`Costs::bandwidth`]) until a move was reported.
    pub fn bandwidth(&self) -> f64 {
        self.bandwidth.0
    }

    /// Reports owned partitions moved between workers since the last report: `bytes` in all,
    /// and the time their transfers took, summed (from asking a worker for a partition to
    /// having its bytes). Bytes reported during the cool-down after a decision are the cost
    /// of that decision's change and teach [`Decider::move_bytes`]; every report with a time
    /// teaches [`Decider::bandwidth`]. The executor reports before each measurement.
    pub fn moved(&mut self, bytes: u64, took: Duration) {
        if bytes == 0 {
            return;
        }
        if let Some((_, _, sum)) = &mut self.moving {
            *sum += bytes;
        }
        let secs = took.as_secs_f64();
        if secs > 0.0 {
            let bw = bytes as f64 / secs;
            let (est, n) = &mut self.bandwidth;
            *est = if *n == 0 { bw } else { 0.5 * *est + 0.5 * bw };
            *n += 1;
        }
    }

    /// Seconds moving partitions takes when one worker of `kind` comes or goes.
    fn move_secs(&self, kind: Kind) -> f64 {
        self.move_bytes[kind as usize].0 / self.bandwidth.0
    }

    /// The cool-down of the last change is over: what moved during it is its cost.
    fn moves_settled(&mut self) {
        if let Some((kind, changed, bytes)) = self.moving.take() {
            let per = bytes as f64 / changed as f64;
            let (est, n) = &mut self.move_bytes[kind as usize];
            *est = if *n == 0 { per } else { 0.5 * *est + 0.5 * per };
            *n += 1;
        }
    }

    /// The most workers of `kind` that paid off, while that lesson holds at `now`.
    pub fn ceiling(&self, kind: Kind, now: Duration) -> Option<usize> {
        self.ceiling[kind as usize].and_then(|(n, until)| (now < until).then_some(n))
    }

    /// Feeds one measurement; returns the decision to carry out, if any. When it returns
    /// none, [`Decider::waiting`] says why.
    pub fn observe(&mut self, m: &Measurement<'_>) -> Option<Decision> {
        match self.step(m) {
            Ok(d) => {
                self.waiting = None;
                Some(d)
            }
            Err(w) => {
                self.waiting = Some(w);
                None
            }
        }
    }

    /// Why the last measurement took no decision: what the decider waits for (`None` before
    /// the first measurement and after one that took a decision).
    pub fn waiting(&self) -> Option<Waiting> {
        self.waiting
    }

    /// [`Decider::observe`]: the decision, or why there is none.
    fn step(&mut self, m: &Measurement<'_>) -> Result<Decision, Waiting> {
        // Step 1: the aggregate throughput of the last period.
        let sample = match self.prev {
            Some((t, d)) if m.now > t => {
                let dt = (m.now - t).as_secs_f64();
                self.dt = 0.8 * self.dt + 0.2 * dt;
                Some(m.done.saturating_sub(d) as f64 / dt)
            }
            _ => None,
        };
        self.prev = Some((m.now, m.done));

        // Step 2: counts changed by someone else; worker processes joining.
        if !self.started {
            self.started = true;
            self.local = m.local;
            self.remote = m.remote;
        }
        if m.local != self.local {
            self.local = m.local;
            self.settle(m.now);
        }
        if let Some(asked) = self.launching {
            if m.remote >= self.remote {
                let took = (m.now - asked).as_secs_f64();
                // The first join measured replaces the configured guess.
                self.join = if self.joins == 0 {
                    took
                } else {
                    0.5 * self.join + 0.5 * took
                };
                self.joins += 1;
                self.launching = None;
                self.remote = m.remote;
                self.settle(m.now);
            } else if (m.now - asked).as_secs_f64() > 3.0 * self.join.max(self.dt) {
                // Some never came: count what is there.
                self.launching = None;
                self.remote = m.remote;
                self.settle(m.now);
            } else {
                return Err(Waiting::Joining {
                    asked: self.remote,
                    joined: m.remote,
                });
            }
        } else if m.remote != self.remote {
            self.remote = m.remote;
            self.settle(m.now);
        }

        // Step 3: the bounds.
        let b = self.cfg.bounds;
        let (l, r) = (
            self.local.clamp(b.min_local, b.max_local),
            self.remote.clamp(b.min_remote, b.max_remote),
        );
        if (l, r) != (self.local, self.remote) {
            return Ok(self.decide(m.now, l, r, Reason::Bounds));
        }

        // Step 4: the cool-down (and the moves of partitions it waits for).
        if m.now < self.changed + self.cfg.hysteresis.cooldown {
            return Err(Waiting::CoolingDown {
                left: self.changed + self.cfg.hysteresis.cooldown - m.now,
            });
        }
        self.moves_settled();
        // Step 5: the window.
        let Some(sample) = sample else {
            return Err(Waiting::FirstMeasurement);
        };
        let h = self.cfg.hysteresis;
        self.window.push_back(sample);
        if self.window.len() > h.window {
            self.window.pop_front();
        }
        if self.window.len() < h.window {
            return Err(Waiting::Measuring {
                samples: self.window.len(),
                window: h.window,
            });
        }
        // The halves' own spread is no measure of noise here: a half that straddles a step
        // has a large one. On a shift the whole window goes (keeping the newer half would
        // keep the halves that noise made extreme, and bias the next mean); a false alarm
        // costs one window of waiting.
        let half = h.window / 2;
        let older = stats(self.window.iter().take(half).copied());
        let newer = stats(self.window.iter().skip(h.window - half).copied());
        if (newer.mean - older.mean).abs() > h.dead_band * older.mean.abs().max(newer.mean.abs()) {
            self.window.clear();
            return Err(Waiting::Moved {
                older: older.mean,
                newer: newer.mean,
            });
        }
        let mut now = stats(self.window.iter().copied());
        // The noise of one sample, relative to the mean, learned over every full window: one
        // window's own spread is too noisy an estimate of it (a quiet window would narrow the
        // band just when a loud sample arrives).
        if now.mean > 0.0 {
            let dev = (sample - now.mean) / now.mean;
            self.noise = if self.noise_samples == 0 {
                dev * dev
            } else {
                0.98 * self.noise + 0.02 * dev * dev
            };
            self.noise_samples += 1;
            let learned = (self.noise / h.window as f64).sqrt() * now.mean;
            if self.noise_samples >= h.window as u64 {
                now.se = now.se.max(learned);
            }
        }
        if now.mean <= 0.0 {
            // Nothing moved (a barrier, a suspend, the end): nothing to learn from.
            return Err(Waiting::Idle);
        }

        // Step 6: the marginal gain of the last grow.
        if let Some(c) = self.check.take() {
            if let Some(d) = self.judge(m.now, c, now) {
                return Ok(d);
            }
        }

        // Step 7: the goal.
        self.pursue(m, now)
    }

    /// Restarts the cool-down and the window: a change took effect at `now`.
    fn settle(&mut self, now: Duration) {
        self.changed = now;
        self.window.clear();
        self.prev = None;
        // A change made elsewhere breaks the comparison of a pending check.
        self.check = None;
    }

    fn decide(&mut self, now: Duration, local: usize, remote: usize, reason: Reason) -> Decision {
        let d = Decision {
            from_local: self.local,
            from_remote: self.remote,
            local,
            remote,
            reason,
        };
        if remote > self.remote {
            self.launching = Some(now);
        }
        // A decision taken before the last one's moves were counted (bounds, no gain)
        // leaves that one unmeasured.
        self.moving = if remote != self.remote {
            Some((Kind::Remote, remote.abs_diff(self.remote), 0))
        } else if local != self.local {
            Some((Kind::Local, local.abs_diff(self.local), 0))
        } else {
            None
        };
        self.local = local;
        self.remote = remote;
        self.last = Some((d.direction(), now));
        self.decisions += 1;
        self.settle(now);
        d
    }

    /// Step 6: undoes the workers of a grow that gained nothing.
    fn judge(&mut self, now: Duration, c: Check, after: Stats) -> Option<Decision> {
        let gain = after.mean - c.before.mean;
        let se = (after.se * after.se + c.before.se * c.before.se).sqrt();
        let z = self.cfg.hysteresis.confidence;
        // The grow as a whole: judged absent only if, even with the benefit of the doubt of
        // the noise, it gained less than `min_gain` of the expected speed per added worker
        // (a grow that scales a little less than linearly is kept). Then the gain, in workers
        // of the expected speed, says how many of them to keep.
        let doubt = gain + z * se;
        // (A NaN, from an expected speed of 0, keeps the workers.)
        let enough = self.cfg.min_gain * c.expected * c.added as f64;
        if doubt.partial_cmp(&enough) != Some(std::cmp::Ordering::Less) {
            return None;
        }
        let useful = ((doubt / c.expected).round().max(0.0) as usize).min(c.added);
        if useful == c.added {
            return None;
        }
        let keep = c.before_count + useful;
        self.ceiling[c.kind as usize] = Some((keep, now + self.cfg.relearn));
        let b = self.cfg.bounds;
        let reason = Reason::NoGain {
            kind: c.kind,
            added: c.added,
            gain,
            expected: c.expected,
        };
        let (l, r) = match c.kind {
            Kind::Local => (keep.max(b.min_local).min(self.local), self.remote),
            Kind::Remote => (self.local, keep.max(b.min_remote).min(self.remote)),
        };
        ((l, r) != (self.local, self.remote)).then(|| self.decide(now, l, r, reason))
    }

    /// The largest count of `kind` a grow may reach at `now`.
    fn cap(&self, kind: Kind, now: Duration) -> usize {
        let max = match kind {
            Kind::Local => self.cfg.bounds.max_local,
            Kind::Remote => self.cfg.bounds.max_remote,
        };
        self.ceiling(kind, now).map_or(max, |c| c.min(max))
    }

    /// Step 7: the goal.
    fn pursue(&mut self, m: &Measurement<'_>, now: Stats) -> Result<Decision, Waiting> {
        let h = self.cfg.hysteresis;
        let measured = now.mean;
        let band = h.dead_band + h.confidence * now.se / measured;
        let units = (self.local + self.remote).max(1) as f64;
        let mean_of = |rates: &[f64]| {
            let (sum, n) = rates
                .iter()
                .filter(|&&x| x > 0.0 && x.is_finite())
                .fold((0.0, 0usize), |(s, n), &x| (s + x, n + 1));
            (n > 0).then(|| sum / n as f64)
        };
        // Per-worker rates tell the kinds' relative speeds; the window's mean, smoothed and
        // counting idle time, sets the scale: so that `local × s_local + remote × s_remote`
        // is the measured throughput.
        let (ml, mr) = (mean_of(m.local_rates), mean_of(m.remote_rates));
        let (rl, rr) = match (ml, mr) {
            (Some(l), Some(r)) => (l, r),
            (Some(l), None) => (l, l),
            (None, Some(r)) => (r, r),
            (None, None) => (1.0, 1.0),
        };
        let scale =
            measured / (self.local as f64 * rl + self.remote as f64 * rr).max(f64::MIN_POSITIVE);
        let (s_local, s_remote) = if self.local + self.remote == 0 {
            (measured / units, measured / units)
        } else {
            (rl * scale, rr * scale)
        };
        let move_remote = self.move_secs(Kind::Remote);
        let move_any = move_remote.max(self.move_secs(Kind::Local));
        // Seconds to finish at the measured rate, if the work left is known.
        let finish = m.left.map(|left| left as f64 / measured);

        let (wanted, deadline) = match self.cfg.goal {
            Goal::Throughput(t) => (t, None),
            Goal::FinishWithin(within) => {
                let Some(left) = m.left else {
                    return Err(Waiting::WorkLeftUnknown);
                };
                let left = left as f64;
                if left == 0.0 {
                    return Err(Waiting::NoWorkLeft);
                }
                let left_secs = within.as_secs_f64() - m.now.as_secs_f64();
                // The decider's reaction time: a change is seen after a cool-down and a window.
                let reaction = h.cooldown.as_secs_f64() + h.window as f64 * self.dt;
                let tau = (left_secs - reaction).max(self.dt);
                let needed = left / tau;
                (needed * (1.0 + self.cfg.safety), Some((needed, left_secs)))
            }
        };
        let grow_reason = |measured| match deadline {
            None => Reason::BelowTarget {
                measured,
                target: wanted,
            },
            Some((needed, left_secs)) => Reason::BehindDeadline {
                measured,
                needed,
                left_secs,
            },
        };
        let t = m.now;
        if measured < wanted * (1.0 - band) {
            // A grow back after a shrink waits, unless a deadline is at stake.
            if deadline.is_none() && self.reversing(Direction::Grow, t) {
                return Err(self.reversal(Direction::Grow, t));
            }
            // Aim at the lower half of the band: the fewest workers that are inside it,
            // counted from the upper edge of the noise, so that noise does not add a worker
            // that is not needed (an undershoot is inside the band, or one more decision).
            let upper = measured + h.confidence * now.se;
            let (s_local, s_remote) = (s_local * upper / measured, s_remote * upper / measured);
            let mut deficit = wanted * (1.0 - h.dead_band / 2.0) - upper;
            let add_local = (self.cap(Kind::Local, t).saturating_sub(self.local))
                .min((deficit / s_local).ceil() as usize);
            deficit -= add_local as f64 * s_local;
            let mut add_remote = 0;
            if deficit > 0.0 {
                let delay = self.join + move_remote;
                // The share of the time left a worker process works, once it has joined.
                let share = match deadline {
                    Some((_, left_secs)) => ((left_secs - delay) / left_secs).max(0.0),
                    None => 1.0,
                };
                let pays = finish.is_none_or(|f| f > 2.0 * delay);
                if share > 0.5 && pays {
                    add_remote = (self.cap(Kind::Remote, t).saturating_sub(self.remote))
                        .min((deficit / (s_remote * share)).ceil() as usize);
                }
            }
            if add_local + add_remote == 0 {
                return Err(Waiting::AtMaximum { measured, wanted });
            }
            let kind = if add_remote > 0 && add_local == 0 {
                Kind::Remote
            } else {
                Kind::Local
            };
            let (added, before_count, expected) = match kind {
                Kind::Local => (add_local, self.local, s_local),
                Kind::Remote => (add_remote, self.remote, s_remote),
            };
            // A grow of both kinds is judged as one: its gain against its local workers'
            // expected speed, which is all of it when no process was added.
            let check = (add_local == 0 || add_remote == 0).then_some(Check {
                kind,
                added,
                before_count,
                before: now,
                expected,
            });
            if deadline.is_some() && self.reversing(Direction::Grow, t) {
                // The last shrink went too far: the count this grow reaches is needed, and a
                // shrink below it would be undone again (a flap that costs moves).
                let total = self.local + add_local + self.remote + add_remote;
                self.floor = Some((total, t + self.cfg.relearn));
            }
            let d = self.decide(
                t,
                self.local + add_local,
                self.remote + add_remote,
                grow_reason(measured),
            );
            self.check = check;
            return Ok(d);
        }
        if measured > wanted * (1.0 + band) {
            if self.reversing(Direction::Shrink, t) {
                return Err(self.reversal(Direction::Shrink, t));
            }
            // Not worth it for the last stretch: moving partitions and a cool-down cost more.
            if let Some(f) = finish.filter(|f| *f < 2.0 * (h.cooldown.as_secs_f64() + move_any)) {
                return Err(Waiting::NearTheEnd { finish_secs: f });
            }
            // Land where a grow aims: the fewest workers inside the lower half of the band,
            // so that a grow and a shrink agree on the count and cannot undo each other.
            let keep = wanted * (1.0 - h.dead_band / 2.0);
            let b = self.cfg.bounds;
            // Counted from the lower edge of the noise, so that noise does not remove a
            // worker that is needed.
            let lower = measured - h.confidence * now.se;
            let (mut l, mut r, mut rate) = (self.local, self.remote, lower);
            let floor = self
                .floor
                .and_then(|(n, until)| (t < until).then_some(n))
                .unwrap_or(0);
            // Which worker leaves is not this layer's choice: each one is counted as the
            // fastest of its kind, so that a shrink never leaves less than it meant to (with
            // workers of unequal speeds, the mean would let a fast one go and the next
            // window would have to grow again).
            let fastest = |rates: &[f64], mean: f64| {
                let max = rates
                    .iter()
                    .copied()
                    .filter(|x| x.is_finite())
                    .fold(0.0, f64::max);
                if max > 0.0 { max * scale } else { mean }
            };
            let (x_local, x_remote) = (
                fastest(m.local_rates, s_local),
                fastest(m.remote_rates, s_remote),
            );
            while r > b.min_remote && l + r > floor && rate - x_remote >= keep {
                r -= 1;
                rate -= x_remote;
            }
            while l > b.min_local && l + r > floor && rate - x_local >= keep {
                l -= 1;
                rate -= x_local;
            }
            if (l, r) == (self.local, self.remote) {
                return Err(Waiting::AtMinimum { measured, wanted });
            }
            let reason = match deadline {
                None => Reason::AboveTarget {
                    measured,
                    target: wanted,
                },
                Some((needed, left_secs)) => Reason::AheadOfDeadline {
                    measured,
                    needed,
                    left_secs,
                },
            };
            return Ok(self.decide(t, l, r, reason));
        }
        Err(Waiting::OnTarget {
            measured,
            low: wanted * (1.0 - band),
            high: wanted * (1.0 + band),
        })
    }

    /// What a decision in `direction`, which would reverse the last one, waits for.
    fn reversal(&self, direction: Direction, now: Duration) -> Waiting {
        let until = self
            .last
            .map_or(now, |(_, at)| at + self.cfg.hysteresis.reverse_after);
        Waiting::Reversal {
            direction,
            left: until.saturating_sub(now),
        }
    }

    /// Whether a decision in `direction` would reverse the last one within `reverse_after`.
    fn reversing(&self, direction: Direction, now: Duration) -> bool {
        self.last.is_some_and(|(d, at)| {
            d != direction && d != Direction::Swap && now < at + self.cfg.hysteresis.reverse_after
        })
    }
}

#[cfg(test)]
mod tests;
