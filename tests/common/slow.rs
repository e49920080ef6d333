//! A loop whose throughput grows with every worker whatever the machine's load: each
//! iteration waits 50 µs, so an autoscaler's measured gain is real.

use std::time::Duration;

use malleable::Fold;
use malleable::reduce::Sum;
use serde::{Deserialize, Serialize};

/// Σ i over `0..n`, each iteration waiting 50 µs.
#[derive(Serialize, Deserialize)]
pub struct Slow {
    pub n: u64,
}

impl Fold for Slow {
    const NAME: &'static str = "slow";
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
        std::thread::sleep(Duration::from_micros(50));
        *acc += i;
    }
}
