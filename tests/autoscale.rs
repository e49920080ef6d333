//! Autoscaling on a real job: the executor's timer task measures the job, the decider grows
//! it within its bounds, each decision is counted, and the value is exact.

use std::time::Duration;

use malleable::schedule::{Autoscale, Hysteresis};
use malleable::{Chunking, Error, Executor, Folded};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

mod common;
use common::slow::Slow;

#[test]
fn a_job_under_a_target_grows_within_its_bounds_and_its_value_is_exact() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().unwrap();

    // A target no machine reaches: the decider grows to its maximum, 2, and stays.
    let policy = Autoscale::throughput(1e12)
        .local(1, 2)
        .period(Duration::from_millis(50))
        .hysteresis(Hysteresis {
            cooldown: Duration::from_millis(200),
            window: 4,
            ..Hysteresis::default()
        });
    let exec = Executor::builder()
        .local_workers(1)
        .chunking(Chunking::Count(256))
        .autoscale(policy)
        .build()
        .unwrap();
    let n = 30_000;
    let handle = exec.submit(Folded(Slow { n })).unwrap();
    let mut most = 0;
    while !handle.is_finished() {
        most = most.max(handle.local_workers());
        std::thread::sleep(Duration::from_millis(10));
    }
    let value = handle.wait().unwrap().finished().unwrap().into_value();
    assert_eq!(value, n * (n - 1) / 2);
    assert_eq!(most, 2, "the decider grew the job to its maximum");

    let mut decisions = Vec::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        if key.name() == malleable::metrics::AUTOSCALE_DECISIONS {
            let reason = key
                .labels()
                .find(|l| l.key() == "reason")
                .map(|l| l.value().to_owned());
            if let DebugValue::Counter(c) = value {
                decisions.push((reason, c));
            }
        }
    }
    // 1 -> 2 local workers (and, on a machine loaded enough that the second worker seemed
    // to gain nothing, maybe back).
    let grown = decisions
        .iter()
        .find(|(r, _)| r.as_deref() == Some("below_target"))
        .map_or(0, |d| d.1);
    assert!(grown >= 1, "{decisions:?}");
}

#[test]
fn a_policy_out_of_bounds_is_refused() {
    let bad = Executor::builder()
        .autoscale(Autoscale::throughput(100.0).local(3, 2))
        .build();
    assert!(matches!(bad, Err(Error::InvalidConfig(_))), "{bad:?}");
    let no_launcher = Executor::builder()
        .autoscale(Autoscale::throughput(100.0).remote(0, 2))
        .build();
    assert!(
        matches!(no_launcher, Err(Error::InvalidConfig(_))),
        "{no_launcher:?}"
    );
}

/// With the default policy (only the target and the bounds set), a job of a minute gets a
/// decision within seconds, and until then the handle says why there is none, the reason
/// changing as the autoscaler measures: cooling down after the start, then the window
/// filling ("measuring: k of n samples").
#[test]
fn the_defaults_decide_early_and_say_why_not_before() {
    use std::time::Instant;
    let exec = Executor::builder()
        .local_workers(1)
        .chunking(Chunking::Count(256))
        // A target no machine reaches: the first full window asks for the maximum.
        .autoscale(Autoscale::throughput(1e12).local(1, 2))
        .build()
        .unwrap();
    // About a minute on one worker.
    let handle = exec.submit(Folded(Slow { n: 1_000_000 })).unwrap();
    let t0 = Instant::now();
    let mut reasons: Vec<String> = Vec::new();
    let mut decided = None;
    while t0.elapsed() < Duration::from_secs(30) && !handle.is_finished() {
        if let Some(status) = handle.autoscale() {
            if status.decisions > 0 {
                decided = Some((t0.elapsed(), status.last.expect("the decision")));
                break;
            }
            let why = status.waiting.expect("no decision says why").to_string();
            assert!(!why.is_empty());
            if reasons.last() != Some(&why) {
                reasons.push(why);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    handle.cancel();
    let _ = handle.wait();
    let (at, decision) = decided.unwrap_or_else(|| panic!("no decision in 30 s: {reasons:#?}"));
    // About 8.5 s by the defaults; the slack is for a loaded machine (the old defaults took
    // 20 s at the least).
    assert!(
        at < Duration::from_secs(15),
        "first decision after {at:?}: {reasons:#?}"
    );
    assert_eq!(decision.local, 2, "{decision}");
    assert!(
        reasons[0].starts_with("cooling down after the start"),
        "{reasons:#?}"
    );
    let measuring: Vec<&String> = reasons
        .iter()
        .filter(|r| r.starts_with("measuring: ") && r.ends_with(" of 10 samples"))
        .collect();
    assert!(measuring.len() >= 3, "the window fills: {reasons:#?}");
}
