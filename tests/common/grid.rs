//! A grid on owned partitions for the tests whose worker processes hold them: Jacobi
//! relaxation of `n` rows of `w` cells in `bands` bands, whose rows pause `pace_us` every
//! `pace_every` rows (so that phases take long enough for processes to come and go), and whose
//! last phase's value is the hash of every row; and the same computation written plainly, to
//! check a run bit for bit.

use std::path::PathBuf;
use std::time::Duration;

use malleable::Next;
use malleable::reduce::CollectInOrder;
use malleable::rows::{Rows, Window};
use serde::{Deserialize, Serialize};

/// A file named by this variable, in a worker process's environment, makes that process's
/// steps wait while the file exists (it cannot hand back the partition it runs).
pub const STALL_ENV: &str = "MALLEABLE_TEST_GRID_STALL";

/// The grid job (see the module's docs).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Grid {
    pub n: u64,
    pub w: usize,
    pub bands: u64,
    pub phases: u64,
    pub done: u64,
    pub pace_us: u64,
    pub pace_every: u64,
}

impl Grid {
    /// `n` rows of `w` cells in 12 bands for `phases` phases, pausing 100 µs every 16 rows.
    pub fn new(n: u64, w: usize, phases: u64) -> Grid {
        Grid {
            n,
            w,
            bands: 12,
            phases,
            done: 0,
            pace_us: 100,
            pace_every: 16,
        }
    }
}

/// A row's hash (FNV-1a over the cells' bits).
pub fn hash(row: &[f64]) -> u64 {
    row.iter().fold(0xcbf2_9ce4_8422_2325, |h, x| {
        (h ^ x.to_bits()).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn init(i: u64, j: usize) -> f64 {
    ((i * 31 + j as u64 * 17) % 101) as f64 / 7.0
}

impl Rows for Grid {
    const NAME: &'static str = "test-grid";
    type Element = f64;
    type Acc = Vec<u64>;
    type Reducer = CollectInOrder<u64>;
    type Input = ();

    fn height(&self) -> u64 {
        self.n
    }
    fn width(&self) -> usize {
        self.w
    }
    fn bands(&self) -> u64 {
        self.bands
    }
    fn reducer(&self) -> CollectInOrder<u64> {
        CollectInOrder::new()
    }
    fn init(&self, _: &(), i: u64, row: &mut [f64]) {
        for (j, x) in row.iter_mut().enumerate() {
            *x = init(i, j);
        }
    }
    fn update(&self, _: &(), i: u64, win: Window<'_, f64>, acc: &mut Vec<u64>) {
        match (win.above, win.below) {
            (Some(a), Some(b)) => row_update(a, win.old, b, win.row),
            _ => win.row.copy_from_slice(win.old),
        }
        if self.pace_us > 0 && i % self.pace_every.max(1) == 0 {
            std::thread::sleep(Duration::from_micros(self.pace_us));
        }
        if let Some(stall) = std::env::var_os(STALL_ENV) {
            while PathBuf::from(&stall).exists() {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        acc.push(hash(win.row));
    }
    fn end_phase(&mut self, _: &Vec<u64>) -> Next {
        self.done += 1;
        if self.done < self.phases {
            Next::Continue
        } else {
            Next::Finish
        }
    }
    fn target_step(&self) -> Duration {
        Duration::from_micros(200)
    }
}

fn row_update(above: &[f64], old: &[f64], below: &[f64], new: &mut [f64]) {
    let w = old.len();
    new[0] = old[0];
    new[w - 1] = old[w - 1];
    for j in 1..w - 1 {
        new[j] = 0.25 * (above[j] + below[j] + old[j - 1] + old[j + 1]);
    }
}

/// The value of `g` computed by a plain loop.
pub fn sequential(g: &Grid) -> Vec<u64> {
    let (n, w) = (g.n as usize, g.w);
    let mut grid: Vec<Vec<f64>> = (0..n)
        .map(|i| (0..w).map(|j| init(i as u64, j)).collect())
        .collect();
    let mut hashes = Vec::new();
    for _ in 0..g.phases {
        let mut next = grid.clone();
        hashes.clear();
        for i in 0..n {
            if i > 0 && i + 1 < n {
                row_update(&grid[i - 1], &grid[i], &grid[i + 1], &mut next[i]);
            }
            hashes.push(hash(&next[i]));
        }
        grid = next;
    }
    hashes
}
