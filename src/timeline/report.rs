//! A timeline as a self-contained HTML page: per job, a summary, an inline SVG chart of the
//! time of each phase and the worker count over the run, with marks for scaling decisions,
//! losses, rollbacks, snapshots and the end, and a table of the events. No script, no style
//! sheet or font from elsewhere: the page opens from a file, offline.
//!
//! The chart follows the per-time-step plots of the malleable OpenMP literature: each phase is
//! a bar as wide as it lasted and as high as its duration (left axis), so a doubling of the
//! workers shows as bars half as high and half as wide; the worker count is a step line
//! (right axis), and the phase numbers run along the top (at the end of each numbered
//! phase: after a rollback they go back).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::{Ending, Event, Record};

const W: f64 = 1120.0;
const H: f64 = 452.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 60.0;
const TOP: f64 = 52.0;
const BOTTOM: f64 = 60.0;

/// Renders `records` (one or more jobs) as an HTML page.
pub fn html(records: &[Record]) -> String {
    let mut jobs: Vec<(&str, Vec<&Record>)> = Vec::new();
    for r in records {
        match jobs.iter_mut().find(|(j, _)| *j == r.job) {
            Some((_, v)) => v.push(r),
            None => jobs.push((&r.job, vec![r])),
        }
    }
    let mut out = String::with_capacity(64 * 1024);
    out.push_str(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>malleable: timeline</title>\n<style>\
         body{font-family:sans-serif;margin:24px;color:#222;background:#fff}\
         h1{font-size:22px}h2{font-size:18px;margin-top:28px}\
         table{border-collapse:collapse;font-size:13px}\
         td,th{border-bottom:1px solid #ddd;padding:3px 10px;text-align:left}\
         .num{text-align:right;font-variant-numeric:tabular-nums}\
         .sum td{border:none;padding:2px 14px 2px 0}\
         svg text{font-family:sans-serif}\
         </style></head><body>\n<h1>Timeline</h1>\n",
    );
    if jobs.is_empty() {
        out.push_str("<p>The timeline holds no record.</p>\n");
    }
    for (job, recs) in &jobs {
        job_section(&mut out, job, recs);
    }
    out.push_str("</body></html>\n");
    out
}

/// What a job's records add up to.
#[derive(Default)]
struct Summary {
    phases: u64,
    phase_time: f64,
    longest_phase: f64,
    snapshots: u64,
    snapshot_bytes: u64,
    snapshot_time: f64,
    snapshot_failures: u64,
    decisions: u64,
    lost: u64,
    rollbacks: u64,
    max_workers: u64,
    ending: Option<(Ending, Option<String>)>,
}

fn summarize(recs: &[&Record]) -> Summary {
    let mut s = Summary::default();
    for r in recs {
        s.max_workers = s.max_workers.max(r.local + r.remote);
        match &r.event {
            Event::PhaseEnd { seconds, .. } => {
                s.phases += 1;
                s.phase_time += seconds;
                s.longest_phase = s.longest_phase.max(*seconds);
            }
            Event::Snapshot { seconds, bytes, .. } => {
                s.snapshots += 1;
                s.snapshot_bytes += bytes;
                s.snapshot_time += seconds;
            }
            Event::SnapshotFailed { .. } => s.snapshot_failures += 1,
            Event::Autoscale { .. } => s.decisions += 1,
            Event::Lost { .. } => s.lost += 1,
            Event::Rollback { .. } => s.rollbacks += 1,
            Event::End { outcome, error, .. } => s.ending = Some((*outcome, error.clone())),
            _ => {}
        }
    }
    s
}

fn job_section(out: &mut String, job: &str, recs: &[&Record]) {
    let s = summarize(recs);
    let t0 = recs.first().map_or(0.0, |r| r.t);
    let t1 = recs.last().map_or(0.0, |r| r.t);
    let _ = write!(
        out,
        "<h2>Job <code>{}</code></h2>\n<table class=\"sum\">",
        esc(job)
    );
    let ending = match &s.ending {
        Some((Ending::Finished, _)) => "finished".to_owned(),
        Some((Ending::Suspended, _)) => "suspended".to_owned(),
        Some((Ending::Failed, e)) => format!("failed: {}", esc(e.as_deref().unwrap_or("?"))),
        None => "still running when the log ends".to_owned(),
    };
    let rows = [
        ("run", format!("{} ({ending})", secs(t1 - t0))),
        (
            "phases",
            format!(
                "{} (mean {}, longest {})",
                s.phases,
                secs(if s.phases > 0 {
                    s.phase_time / s.phases as f64
                } else {
                    0.0
                }),
                secs(s.longest_phase)
            ),
        ),
        (
            "snapshots",
            format!(
                "{} committed ({}, mean {}), {} failed",
                s.snapshots,
                bytes(s.snapshot_bytes),
                secs(if s.snapshots > 0 {
                    s.snapshot_time / s.snapshots as f64
                } else {
                    0.0
                }),
                s.snapshot_failures
            ),
        ),
        (
            "workers",
            format!(
                "at most {}; {} autoscaling decisions, {} processes lost, {} rollbacks",
                s.max_workers, s.decisions, s.lost, s.rollbacks
            ),
        ),
    ];
    for (k, v) in rows {
        let _ = write!(out, "<tr><td><b>{k}</b></td><td>{v}</td></tr>");
    }
    out.push_str("</table>\n");
    chart(out, recs, t0, t1.max(t0 + 1e-9), &s);
    events_table(out, recs, t0);
}

/// The SVG chart: phase bars, worker step line, marks.
fn chart(out: &mut String, recs: &[&Record], t0: f64, t1: f64, s: &Summary) {
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let x = |t: f64| LEFT + (t - t0) / (t1 - t0) * pw;
    let ymax = nice_max(s.longest_phase.max(1e-9) * 1.1);
    let ms = ymax < 2.0;
    let y = |v: f64| TOP + ph - v / ymax * ph;
    let wmax = nice_max((s.max_workers.max(1) as f64) * 1.25).max(2.0);
    let yw = |n: f64| TOP + ph - n / wmax * ph;
    let _ = write!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" \
         viewBox=\"0 0 {W} {H}\" role=\"img\">\
         <rect x=\"0\" y=\"0\" width=\"{W}\" height=\"{H}\" fill=\"#fff\"/>"
    );
    // Axes, grid and ticks.
    for i in 0..=5 {
        let v = ymax * f64::from(i) / 5.0;
        let yy = y(v);
        let label = if ms {
            format!("{:.0}", v * 1000.0)
        } else {
            format!("{v:.1}")
        };
        let _ = write!(
            out,
            "<line x1=\"{LEFT}\" y1=\"{yy:.1}\" x2=\"{:.1}\" y2=\"{yy:.1}\" stroke=\"#e6e6e6\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\" text-anchor=\"end\">{label}</text>",
            LEFT + pw,
            LEFT - 6.0,
            yy + 4.0
        );
    }
    let wstep = if wmax <= 10.0 {
        1.0
    } else {
        (wmax / 5.0).ceil()
    };
    let mut n = 0.0;
    while n <= wmax + 1e-9 {
        let _ = write!(
            out,
            "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\" fill=\"#c25400\">{n:.0}</text>",
            LEFT + pw + 6.0,
            yw(n) + 4.0
        );
        n += wstep;
    }
    let span = t1 - t0;
    let tstep = nice_max(span / 8.0);
    let mut t = 0.0;
    while t <= span + 1e-9 {
        let xx = x(t0 + t);
        let _ = write!(
            out,
            "<line x1=\"{xx:.1}\" y1=\"{:.1}\" x2=\"{xx:.1}\" y2=\"{:.1}\" stroke=\"#999\"/>\
             <text x=\"{xx:.1}\" y=\"{:.1}\" font-size=\"12\" text-anchor=\"middle\">{}</text>",
            TOP + ph,
            TOP + ph + 5.0,
            TOP + ph + 18.0,
            trim(t)
        );
        t += tstep;
    }
    // Phase numbers along the top, at the end of every `step`-th phase.
    let ends: Vec<(f64, u64)> = recs
        .iter()
        .filter_map(|r| match r.event {
            Event::PhaseEnd { phase, .. } => Some((r.t, phase)),
            _ => None,
        })
        .collect();
    if !ends.is_empty() {
        let step = (nice_max(ends.len() as f64 / 12.0) as u64).max(1);
        let _ = write!(
            out,
            "<line x1=\"{LEFT}\" y1=\"{TOP}\" x2=\"{:.1}\" y2=\"{TOP}\" stroke=\"#bbb\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" fill=\"#555\" text-anchor=\"end\">phase</text>",
            LEFT + pw,
            LEFT - 6.0,
            TOP - 10.0
        );
        let mut last_x = f64::NEG_INFINITY;
        for &(t, phase) in &ends {
            let xx = x(t);
            if phase % step != 0 || xx - last_x < 24.0 {
                continue;
            }
            last_x = xx;
            let _ = write!(
                out,
                "<line x1=\"{xx:.1}\" y1=\"{TOP}\" x2=\"{xx:.1}\" y2=\"{:.1}\" stroke=\"#888\"/>\
                 <text x=\"{xx:.1}\" y=\"{:.1}\" font-size=\"11\" fill=\"#555\" text-anchor=\"middle\">{phase}</text>",
                TOP - 4.0,
                TOP - 10.0
            );
        }
    }
    let _ = write!(
        out,
        "<line x1=\"{LEFT}\" y1=\"{TOP}\" x2=\"{LEFT}\" y2=\"{b:.1}\" stroke=\"#444\"/>\
         <line x1=\"{LEFT}\" y1=\"{b:.1}\" x2=\"{r:.1}\" y2=\"{b:.1}\" stroke=\"#444\"/>\
         <line x1=\"{r:.1}\" y1=\"{TOP}\" x2=\"{r:.1}\" y2=\"{b:.1}\" stroke=\"#c25400\"/>\
         <text x=\"{cx:.1}\" y=\"{:.1}\" font-size=\"13\" text-anchor=\"middle\">time since the start (s)</text>\
         <text x=\"16\" y=\"{cy:.1}\" font-size=\"13\" text-anchor=\"middle\" transform=\"rotate(-90 16 {cy:.1})\">time per phase ({})</text>\
         <text x=\"{:.1}\" y=\"{cy:.1}\" font-size=\"13\" fill=\"#c25400\" text-anchor=\"middle\" transform=\"rotate(90 {:.1} {cy:.1})\">workers</text>",
        TOP + ph + 38.0,
        if ms { "ms" } else { "s" },
        W - 14.0,
        W - 14.0,
        b = TOP + ph,
        r = LEFT + pw,
        cx = LEFT + pw / 2.0,
        cy = TOP + ph / 2.0,
    );
    // Snapshots: a green band from marker to commit along the bottom.
    for r in recs {
        if let Event::Snapshot {
            seconds, suspend, ..
        } = &r.event
        {
            let (a, b) = (x((r.t - seconds).max(t0)), x(r.t));
            let _ = write!(
                out,
                "<rect x=\"{a:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"8\" fill=\"#2e9d4a\" opacity=\"0.8\"><title>snapshot {} ({})</title></rect>\
                 <path d=\"M{b:.1} {:.1} l-5 -9 h10 z\" fill=\"{}\"/>",
                TOP + ph - 8.0,
                (b - a).max(1.5),
                secs(*seconds),
                if *suspend { "suspend" } else { "committed" },
                TOP + ph - 9.0,
                if *suspend { "#0b5d1e" } else { "#2e9d4a" },
            );
        }
    }
    // Phases: bars from start to end, as high as they lasted.
    for r in recs {
        if let Event::PhaseEnd { phase, seconds, .. } = &r.event {
            let (a, b) = (x((r.t - seconds).max(t0)), x(r.t));
            let top = y(*seconds);
            let _ = write!(
                out,
                "<rect x=\"{a:.1}\" y=\"{top:.1}\" width=\"{:.2}\" height=\"{:.1}\" fill=\"#4a7fc1\" fill-opacity=\"0.35\" stroke=\"#2b5c9e\" stroke-width=\"0.6\"><title>phase {phase}: {}</title></rect>",
                (b - a).max(0.8),
                (TOP + ph - top).max(0.5),
                secs(*seconds)
            );
        }
    }
    // Workers: a step line (all workers, and worker processes when there are any).
    let step_line = |f: &dyn Fn(&Record) -> u64| {
        let mut d = String::new();
        let mut last: Option<f64> = None;
        for r in recs {
            let yy = yw(f(r) as f64);
            match last {
                None => {
                    let _ = write!(d, "M{:.1} {yy:.1}", x(r.t));
                }
                Some(prev) if (prev - yy).abs() > 0.01 => {
                    let _ = write!(d, " H{:.1} V{yy:.1}", x(r.t));
                }
                _ => {}
            }
            last = Some(yy);
        }
        let _ = write!(d, " H{:.1}", x(t1));
        d
    };
    let total = step_line(&|r| r.local + r.remote);
    let _ = write!(
        out,
        "<path d=\"{total}\" fill=\"none\" stroke=\"#e06c00\" stroke-width=\"2.4\"/>"
    );
    let any_remote = recs.iter().any(|r| r.remote > 0);
    if any_remote {
        let remote = step_line(&|r| r.remote);
        let _ = write!(
            out,
            "<path d=\"{remote}\" fill=\"none\" stroke=\"#e06c00\" stroke-width=\"1.6\" stroke-dasharray=\"5 3\"/>"
        );
    }
    // Marks: decisions, losses, rollbacks, the end. A label that would overlap the one before
    // moves right.
    let mut last_label = f64::NEG_INFINITY;
    for r in recs {
        let (color, label, dash) = match &r.event {
            Event::Autoscale {
                from_local,
                from_remote,
                to_local,
                to_remote,
                reason,
                ..
            } => (
                "#7b3fb3",
                format!(
                    "{}→{} ({reason})",
                    from_local + from_remote,
                    to_local + to_remote
                ),
                "4 3",
            ),
            Event::Lost { .. } => ("#d11a1a", "lost".to_owned(), "2 2"),
            Event::Rollback { epoch, .. } => ("#d11a1a", format!("rollback to {epoch}"), ""),
            Event::Recovered { copy_phase, .. } => {
                ("#1a7f37", format!("replayed from {copy_phase}"), "")
            }
            Event::SnapshotFailed { .. } => ("#d11a1a", "snapshot failed".to_owned(), "2 2"),
            Event::End { outcome, .. } => (
                "#222",
                match outcome {
                    Ending::Finished => "finished",
                    Ending::Suspended => "suspended",
                    Ending::Failed => "failed",
                }
                .to_owned(),
                "",
            ),
            _ => continue,
        };
        let xx = x(r.t);
        let lx = (xx - 3.0).max(last_label + 13.0);
        last_label = lx;
        let _ = write!(
            out,
            "<line x1=\"{xx:.1}\" y1=\"{TOP}\" x2=\"{xx:.1}\" y2=\"{:.1}\" stroke=\"{color}\" stroke-width=\"1.4\" stroke-dasharray=\"{dash}\"/>\
             <text x=\"{lx:.1}\" y=\"{:.1}\" font-size=\"11\" fill=\"{color}\" text-anchor=\"end\" transform=\"rotate(-90 {lx:.1} {:.1})\">{}</text>",
            TOP + ph,
            TOP + 4.0,
            TOP + 4.0,
            esc(&label)
        );
    }
    // Legend.
    let items: &[(&str, &str)] = &[
        ("#4a7fc1", "phase (width: when, height: how long)"),
        (
            "#e06c00",
            if any_remote {
                "workers (dashed: processes)"
            } else {
                "workers"
            },
        ),
        ("#2e9d4a", "snapshot (marker to commit)"),
        ("#7b3fb3", "autoscaling decision"),
        ("#d11a1a", "loss, rollback, failure"),
    ];
    let mut lx = LEFT;
    for (color, text) in items {
        let _ = write!(
            out,
            "<rect x=\"{lx:.1}\" y=\"12\" width=\"12\" height=\"12\" fill=\"{color}\"/>\
             <text x=\"{:.1}\" y=\"22\" font-size=\"12\">{text}</text>",
            lx + 16.0
        );
        lx += 30.0 + text.len() as f64 * 6.3;
    }
    out.push_str("</svg>\n");
}

/// Every event but phase ends and worker changes (those are in the chart), at most 500.
fn events_table(out: &mut String, recs: &[&Record], t0: f64) {
    let mut counts: BTreeMap<&str, u64> = BTreeMap::new();
    out.push_str(
        "<h3>Events</h3>\n<table><tr><th class=\"num\">time (s)</th><th>event</th>\
         <th class=\"num\">workers</th><th>details</th></tr>\n",
    );
    let mut shown = 0;
    for r in recs {
        let (kind, detail) = match &r.event {
            Event::Start {
                phase,
                iterations,
                resumed_from,
            } => (
                "start",
                match resumed_from {
                    Some(e) => {
                        format!("phase {phase} ({iterations} iterations), resumed from epoch {e}")
                    }
                    None => format!("phase {phase} ({iterations} iterations)"),
                },
            ),
            Event::PhaseEnd { .. } | Event::Workers { .. } => {
                *counts
                    .entry(if matches!(r.event, Event::Workers { .. }) {
                        "worker changes"
                    } else {
                        "phase ends"
                    })
                    .or_default() += 1;
                continue;
            }
            Event::Lost { peer } => ("lost", format!("worker process {}", esc(peer))),
            Event::Autoscale { detail, .. } => ("autoscale", esc(detail)),
            Event::Snapshot {
                epoch,
                seconds,
                bytes: b,
                suspend,
            } => (
                if *suspend { "suspend" } else { "snapshot" },
                format!("epoch {epoch}, {}, {}", secs(*seconds), bytes(*b)),
            ),
            Event::SnapshotFailed { error, .. } => ("snapshot failed", esc(error)),
            Event::Rollback {
                lost,
                from_phase,
                epoch,
            } => (
                "rollback",
                format!(
                    "{} partitions lost in phase {from_phase}; back to epoch {epoch}",
                    lost.len()
                ),
            ),
            Event::Recovered {
                lost,
                phase,
                copy_phase,
                buddy,
                seconds,
            } => (
                "recovered",
                format!(
                    "{} partitions lost in phase {phase}, replayed from their copies of phase \
                     {copy_phase} in process {buddy} in {}",
                    lost.len(),
                    secs(*seconds)
                ),
            ),
            Event::RolledBack {
                epoch,
                to_phase,
                seconds,
            } => (
                "rolled back",
                format!(
                    "epoch {epoch}, phase {to_phase}, restarted after {}",
                    secs(*seconds)
                ),
            ),
            Event::End {
                outcome,
                phase,
                epoch,
                error,
            } => (
                "end",
                format!(
                    "{} in phase {phase}{}{}",
                    match outcome {
                        Ending::Finished => "finished",
                        Ending::Suspended => "suspended",
                        Ending::Failed => "failed",
                    },
                    epoch.map_or(String::new(), |e| format!(", epoch {e}")),
                    error
                        .as_deref()
                        .map_or(String::new(), |e| format!(": {}", esc(e)))
                ),
            ),
        };
        shown += 1;
        if shown > 500 {
            continue;
        }
        let _ = writeln!(
            out,
            "<tr><td class=\"num\">{:.3}</td><td>{kind}</td><td class=\"num\">{}+{}</td><td>{detail}</td></tr>",
            r.t - t0,
            r.local,
            r.remote
        );
    }
    out.push_str("</table>\n");
    if shown > 500 {
        let _ = writeln!(out, "<p>{} more events not shown.</p>", shown - 500);
    }
    if !counts.is_empty() {
        let list: Vec<String> = counts.iter().map(|(k, n)| format!("{n} {k}")).collect();
        let _ = writeln!(out, "<p>In the chart only: {}.</p>", list.join(", "));
    }
}

/// The smallest 1, 2 or 5 times a power of ten at or above `v`.
fn nice_max(v: f64) -> f64 {
    if v.is_nan() || v <= 0.0 || v.is_infinite() {
        return 1.0;
    }
    let p = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 5.0, 10.0] {
        if m * p >= v {
            return m * p;
        }
    }
    10.0 * p
}

fn trim(t: f64) -> String {
    let s = format!("{t:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s.is_empty() {
        "0".to_owned()
    } else {
        s.to_owned()
    }
}

fn secs(s: f64) -> String {
    if s < 1.0 {
        format!("{:.1} ms", s * 1000.0)
    } else {
        format!("{s:.2} s")
    }
}

fn bytes(b: u64) -> String {
    match b {
        0..1024 => format!("{b} B"),
        1024..1_048_576 => format!("{:.1} KiB", b as f64 / 1024.0),
        _ => format!("{:.1} MiB", b as f64 / 1_048_576.0),
    }
}

/// Escapes text for HTML and SVG.
fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(t: f64, local: u64, event: Event) -> Record {
        Record {
            t,
            unix_ms: 0,
            job: "j<b>".into(),
            local,
            remote: 0,
            event,
        }
    }

    #[test]
    fn a_page_has_a_chart_per_job_and_escapes_text() {
        let recs = vec![
            rec(
                0.0,
                1,
                Event::Start {
                    phase: 0,
                    iterations: 10,
                    resumed_from: None,
                },
            ),
            rec(
                0.5,
                1,
                Event::PhaseEnd {
                    phase: 0,
                    seconds: 0.5,
                    iterations: 10,
                },
            ),
            rec(
                0.6,
                2,
                Event::Workers {
                    draining: 0,
                    joining: 0,
                },
            ),
            rec(
                0.8,
                2,
                Event::Snapshot {
                    epoch: 0,
                    seconds: 0.1,
                    bytes: 2048,
                    suspend: false,
                },
            ),
            rec(
                0.9,
                2,
                Event::PhaseEnd {
                    phase: 1,
                    seconds: 0.4,
                    iterations: 10,
                },
            ),
            rec(
                0.9,
                2,
                Event::End {
                    outcome: Ending::Failed,
                    phase: 1,
                    epoch: None,
                    error: Some("<boom>".into()),
                },
            ),
        ];
        let page = html(&recs);
        assert_eq!(page.matches("<svg").count(), 1);
        assert!(
            page.contains("j&lt;b&gt;") && !page.contains("j<b>"),
            "job name escaped"
        );
        assert!(page.contains("&lt;boom&gt;"));
        assert_eq!(page.matches("<title>phase ").count(), 2);
        assert!(page.contains("snapshot 100.0 ms"));
        assert!(page.contains("2.0 KiB"));
    }

    #[test]
    fn nice_maxima() {
        assert_eq!(nice_max(0.7), 1.0);
        assert_eq!(nice_max(1.2), 2.0);
        assert_eq!(nice_max(3.0), 5.0);
        assert_eq!(nice_max(0.011), 0.02);
    }
}
