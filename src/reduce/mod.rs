//! Reductions: the [`Reducer`] trait, the built-in reducers and the ordered merge.
//!
//! - [`Sum`], [`Min`], [`Max`], [`Count`], [`CollectInOrder`] and [`CollectBytes`] (byte
//!   outputs, encoded in bulk) are the built-ins;
//!   [`FnReducer`] turns two closures into a reducer; any type can implement [`Reducer`].
//! - `merge.rs` holds the ordered merge the executor uses: chunk outputs are folded into the
//!   phase value strictly in chunk order, whatever order they arrive in.
//!
//! # Determinism
//!
//! Chunk boundaries are fixed when a phase starts and never depend on the number of workers,
//! and outputs are folded left to right in chunk order starting from the identity:
//! `((identity ⊕ o₀) ⊕ o₁) ⊕ …`. The value is therefore bit-for-bit the same for any worker
//! count, scaling history or restore, even when `⊕` is a floating-point sum that is only
//! approximately associative.

mod builtins;
mod merge;

pub use builtins::{Bounded, CollectBytes, CollectInOrder, Count, FnReducer, Max, Min, Sum};
/// The value of [`CollectBytes`] (from the `bytes` crate), so that outputs can name it.
pub use bytes::BytesMut;
pub(crate) use merge::OrderedMerge;

use serde::Serialize;
use serde::de::DeserializeOwned;

/// An associative combine with an identity (a monoid) over chunk outputs.
///
/// `combine` must be associative up to the precision the user accepts; the executor always
/// applies it in chunk order, so a non-associative combine still gives a deterministic value.
pub trait Reducer: Send + Sync + 'static {
    /// The type of chunk outputs and of the reduced value.
    type Value: Serialize + DeserializeOwned + Send + 'static;

    /// The identity: `combine(identity, x) == x`.
    fn identity(&self) -> Self::Value;

    /// Folds `next` (the output of the following chunk) into `acc`.
    fn combine(&self, acc: &mut Self::Value, next: Self::Value);
}
