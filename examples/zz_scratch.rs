use malleable::reduce::Sum;
use malleable::rows::{Rows, Window};
use malleable::{Banded, Executor, Next};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::time::Instant;

#[derive(Serialize, Deserialize)]
struct Heat {
    n: u64,
    phases: u64,
    done: u64,
}
impl Rows for Heat {
    const NAME: &'static str = "heat-scratch";
    type Element = f64;
    type Acc = f64;
    type Reducer = Sum<f64>;
    type Input = ();
    fn height(&self) -> u64 {
        self.n
    }
    fn width(&self) -> usize {
        self.n as usize
    }
    fn reducer(&self) -> Sum<f64> {
        Sum::new()
    }
    fn init(&self, _: &(), i: u64, row: &mut [f64]) {
        row.fill(if i == 0 { 1.0 } else { 0.0 });
    }
    fn update(&self, _: &(), _i: u64, w: Window<'_, f64>, acc: &mut f64) {
        match (w.above, w.below) {
            (Some(a), Some(b)) => {
                let s = step(a, w.old, b, w.row);
                *acc += s;
            }
            _ => w.row.copy_from_slice(w.old),
        }
    }
    fn end_phase(&mut self, _: &f64) -> Next {
        self.done += 1;
        if self.done < self.phases {
            Next::Continue
        } else {
            Next::Finish
        }
    }
}
#[inline]
fn step(a: &[f64], o: &[f64], b: &[f64], r: &mut [f64]) -> f64 {
    let w = o.len();
    let mut s = 0.0;
    r[0] = o[0];
    r[w - 1] = o[w - 1];
    for j in 1..w - 1 {
        let v = 0.25 * (a[j] + b[j] + o[j - 1] + o[j + 1]);
        s += (v - o[j]).abs();
        r[j] = v;
    }
    s
}
fn rayon_run(n: usize, phases: u64, threads: usize) -> f64 {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    let mut g = vec![0.0; n * n];
    g[..n].fill(1.0);
    let mut h = g.clone();
    let mut total = 0.0;
    pool.install(|| {
        for _ in 0..phases {
            total = h
                .par_chunks_mut(n)
                .enumerate()
                .map(|(i, r)| {
                    if i == 0 || i == n - 1 {
                        r.copy_from_slice(&g[i * n..(i + 1) * n]);
                        0.0
                    } else {
                        step(
                            &g[(i - 1) * n..i * n],
                            &g[i * n..(i + 1) * n],
                            &g[(i + 1) * n..(i + 2) * n],
                            r,
                        )
                    }
                })
                .sum();
            std::mem::swap(&mut g, &mut h);
        }
    });
    total
}
fn main() {
    let n: u64 = std::env::var("N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4000);
    let phases = 30;
    for threads in [1usize, 2] {
        for _ in 0..2 {
            let t = Instant::now();
            let r = rayon_run(n as usize, phases, threads);
            let tr = t.elapsed();
            let exec = Executor::builder().local_workers(threads).build().unwrap();
            let t = Instant::now();
            let m = exec
                .run(Banded(Heat { n, phases, done: 0 }))
                .unwrap()
                .into_value();
            let tm = t.elapsed();
            println!(
                "{threads} threads: rayon {:?} malleable {:?} ratio {:.3} ({} vs {})",
                tr,
                tm,
                tr.as_secs_f64() / tm.as_secs_f64(),
                r,
                m
            );
        }
    }
}
