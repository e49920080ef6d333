//! Progress: the rate of this run only (not the work done before a resume), a job-level ETA
//! when the job says how many phases it has, and updates to wait for instead of polling.

use std::time::{Duration, Instant};

use malleable::reduce::Sum;
use malleable::{At, Executor, Fold, Next, Outcome, Progress};
use serde::{Deserialize, Serialize};

/// A loop of `n` iterations per phase, `phases` phases, each iteration spinning `spin_ns`.
#[derive(Serialize, Deserialize)]
struct Paced {
    n: u64,
    phases: u64,
    phase: u64,
    spin_ns: u64,
    hint: bool,
}

impl Fold for Paced {
    const NAME: &'static str = "progress-paced";
    type Acc = u64;
    type Reducer = Sum<u64>;
    type Input = ();

    fn iterations(&self) -> u64 {
        self.n
    }

    fn reducer(&self) -> Sum<u64> {
        Sum::new()
    }

    fn body(&self, _: &(), acc: &mut u64, i: u64) {
        let t = Instant::now();
        while t.elapsed() < Duration::from_nanos(self.spin_ns) {
            std::hint::spin_loop();
        }
        *acc += i;
    }

    fn end_phase(&mut self, _: &u64) -> Next {
        self.phase += 1;
        if self.phase < self.phases {
            Next::Continue
        } else {
            Next::Finish
        }
    }

    fn phases(&self) -> Option<u64> {
        self.hint.then_some(self.phases)
    }
}

fn paced(n: u64, phases: u64, spin_ns: u64, hint: bool) -> malleable::Folded<Paced> {
    malleable::Folded(Paced {
        n,
        phases,
        phase: 0,
        spin_ns,
        hint,
    })
}

#[test]
fn the_rate_after_a_resume_counts_this_run_only() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("progress-resume-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let url = format!("file://{}", dir.display());
    let exec = Executor::builder()
        .local_workers(1)
        .snapshots(&url)
        .job_id("progress-resume")
        .build()
        .unwrap();
    // 20 phases of 20,000 iterations at 10 µs: 4 s on one worker.
    let h = exec.submit(paced(20_000, 20, 10_000, true)).unwrap();
    while h.progress().phase < 8 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let id = h.suspend().wait().unwrap();
    assert!(matches!(h.wait().unwrap(), Outcome::Suspended(_)));
    drop(exec);

    let exec = Executor::builder()
        .local_workers(1)
        .snapshots(&url)
        .job_id("progress-resume")
        .build()
        .unwrap();
    let t0 = Instant::now();
    let h = exec
        .resume::<malleable::Folded<Paced>>(&url, At::Epoch(id.epoch))
        .unwrap();
    let before = h.progress().done_all_phases;
    assert!(before >= 8 * 20_000, "resumed with {before} done");
    std::thread::sleep(Duration::from_millis(400));
    let p = h.progress();
    let mine = p.done_all_phases - before;
    let elapsed = t0.elapsed().as_secs_f64();
    // This run did `mine` iterations in at most `elapsed`. The rate is a moving average, so
    // it lags the run's own average a little (the start is slower), but it is of that
    // order; counting the work before the resume (more than twice this run's), it would be
    // more than 3 times it.
    assert!(mine > 0);
    let average = mine as f64 / elapsed;
    assert!(
        p.rate >= average * 0.5 && p.rate <= average * 2.0,
        "rate {} for {mine} iterations in {elapsed:.3} s ({before} done before)",
        p.rate,
    );
    assert!(before > 2 * mine, "{before} done before, {mine} after");
    h.cancel();
    let _ = h.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_eta_covers_the_whole_job_when_it_says_how_many_phases() {
    let exec = Executor::builder().local_workers(1).build().unwrap();
    let h = exec.submit(paced(4_000, 10, 5_000, true)).unwrap();
    let mut p: Progress;
    loop {
        p = h.progress();
        if p.phase >= 2 && p.rate > 0.0 && p.done < p.total {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(p.phases, Some(10));
    let phase = p.phase_eta.unwrap().as_secs_f64();
    let job = p.eta.unwrap().as_secs_f64();
    let later = (10 - p.phase - 1) as f64 * p.total as f64 / p.rate;
    assert!(
        (job - (phase + later)).abs() < 1e-6,
        "job eta {job}, phase eta {phase}, later phases {later}"
    );
    assert!(job > phase);
    let _ = h.wait();

    // Without the hint there is no job-level ETA, only the phase's.
    let h = exec.submit(paced(10_000, 3, 5_000, false)).unwrap();
    loop {
        p = h.progress();
        if p.rate > 0.0 && p.done < p.total {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(p.phases, None);
    assert!(p.phase_eta.is_some());
    assert_eq!(p.eta, None);
    let _ = h.wait();
}

#[test]
fn updates_arrive_without_polling_and_end_with_the_job() {
    let exec = Executor::builder().local_workers(2).build().unwrap();
    // 5 phases of 0.4 s on 2 workers.
    let h = exec.submit(paced(80_000, 5, 10_000, true)).unwrap();
    let mut seen = Vec::new();
    for p in h.progress_updates() {
        seen.push(p);
    }
    let last = seen.last().expect("no update at all");
    assert!(last.ended, "the last update says the job ended: {last:?}");
    assert_eq!(seen.iter().filter(|p| p.ended).count(), 1);
    assert_eq!(last.phase, 4);
    // Published while the job ran, every phase included (phase ends are always published,
    // and a reader this quick does not skip them all), in order.
    assert!(seen.len() >= 6, "{} updates", seen.len());
    assert!(seen.windows(2).all(|w| w[0].phase <= w[1].phase));
    for phase in 0..5 {
        assert!(
            seen.iter().any(|p| p.phase == phase),
            "phase {phase} not seen"
        );
    }
    assert!(h.wait().unwrap().finished().is_some());

    // Subscribed after the end: the last report, then the end.
    let h = exec.submit(paced(100, 1, 0, false)).unwrap();
    let h2 = h.clone();
    assert!(h.wait().unwrap().finished().is_some());
    let mut late = h2.progress_updates();
    let p = late.next().expect("the last report");
    assert!(p.ended && p.done == p.total);
    assert_eq!(late.next(), None);
}

#[test]
fn updates_can_be_awaited() {
    let exec = Executor::builder().local_workers(1).build().unwrap();
    let h = exec.submit(paced(5_000, 3, 10_000, false)).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let phases = rt.block_on(async {
        let mut updates = h.progress_updates();
        let mut phases = Vec::new();
        while let Some(p) = updates.changed().await {
            phases.push(p.phase);
        }
        phases
    });
    assert_eq!(phases.last(), Some(&2));
    assert!(phases.len() >= 3);
    assert!(h.wait().unwrap().finished().is_some());
}
