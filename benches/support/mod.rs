//! Pieces shared by the benches (`mod support;`): a compute-bound fold and a percentile.
#![allow(dead_code)]

use std::time::Duration;

use malleable::Fold;
use malleable::reduce::Sum;
use serde::{Deserialize, Serialize};

/// A compute-bound fold over `0..n`: a few multiplies and shifts per iteration, no memory.
#[derive(Serialize, Deserialize)]
pub(crate) struct Mix(pub(crate) u64);

impl Fold for Mix {
    const NAME: &'static str = "mix";
    type Acc = u64;
    type Reducer = Sum<u64>;
    type Input = ();
    fn iterations(&self) -> u64 {
        self.0
    }
    fn reducer(&self) -> Sum<u64> {
        Sum::new()
    }
    fn body(&self, _: &(), acc: &mut u64, i: u64) {
        let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        x ^= x >> 31;
        *acc = acc.wrapping_add(x.wrapping_mul(0xBF58_476D_1CE4_E5B9));
    }
}

/// The `p` quantile (0..=1) of `v`, which it sorts.
pub(crate) fn percentile(v: &mut [Duration], p: f64) -> Duration {
    v.sort_unstable();
    v[((v.len() - 1) as f64 * p).round() as usize]
}
