//! The built-in reducers.

use std::fmt;
use std::marker::PhantomData;
use std::ops::Add;

use bytes::BytesMut;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::Reducer;

/// Sums the outputs: identity `T::default()` (zero for numbers), combine `acc = acc + next`.
pub struct Sum<T>(PhantomData<fn() -> T>);

impl<T> Sum<T> {
    /// A sum reducer.
    pub const fn new() -> Self {
        Sum(PhantomData)
    }
}

impl<T> Default for Sum<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> fmt::Debug for Sum<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Sum")
    }
}

impl<T> Reducer for Sum<T>
where
    T: Add<Output = T> + Default + Copy + Serialize + DeserializeOwned + Send + 'static,
{
    type Value = T;

    fn identity(&self) -> T {
        T::default()
    }

    fn combine(&self, acc: &mut T, next: T) {
        *acc = *acc + next;
    }
}

/// Counts: the outputs are counts (`u64`) and are added.
#[derive(Debug, Default, Clone, Copy)]
pub struct Count;

impl Reducer for Count {
    type Value = u64;

    fn identity(&self) -> u64 {
        0
    }

    fn combine(&self, acc: &mut u64, next: u64) {
        *acc += next;
    }
}

/// Types with a least and a greatest value, the identities of [`Max`] and [`Min`].
pub trait Bounded: Copy + PartialOrd {
    /// The least value (`-inf` for floats).
    const LEAST: Self;
    /// The greatest value (`+inf` for floats).
    const GREATEST: Self;
}

macro_rules! bounded_int {
    ($($t:ty)*) => {$(
        impl Bounded for $t {
            const LEAST: Self = <$t>::MIN;
            const GREATEST: Self = <$t>::MAX;
        }
    )*};
}
bounded_int!(u8 u16 u32 u64 u128 i8 i16 i32 i64 i128);

impl Bounded for f32 {
    const LEAST: Self = f32::NEG_INFINITY;
    const GREATEST: Self = f32::INFINITY;
}

impl Bounded for f64 {
    const LEAST: Self = f64::NEG_INFINITY;
    const GREATEST: Self = f64::INFINITY;
}

/// The least output: identity [`Bounded::GREATEST`]; on ties (and NaN) the earlier chunk wins.
pub struct Min<T>(PhantomData<fn() -> T>);

/// The greatest output: identity [`Bounded::LEAST`]; on ties (and NaN) the earlier chunk wins.
pub struct Max<T>(PhantomData<fn() -> T>);

macro_rules! extremum {
    ($name:ident, $identity:ident, $op:tt) => {
        impl<T> $name<T> {
            /// The reducer.
            pub const fn new() -> Self {
                $name(PhantomData)
            }
        }

        impl<T> Default for $name<T> {
            fn default() -> Self {
                Self::new()
            }
        }

        impl<T> fmt::Debug for $name<T> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(stringify!($name))
            }
        }

        impl<T> Reducer for $name<T>
        where
            T: Bounded + Serialize + DeserializeOwned + Send + 'static,
        {
            type Value = T;

            fn identity(&self) -> T {
                T::$identity
            }

            fn combine(&self, acc: &mut T, next: T) {
                if next $op *acc {
                    *acc = next;
                }
            }
        }
    };
}
extremum!(Min, GREATEST, <);
extremum!(Max, LEAST, >);

/// Concatenates `Vec` outputs in chunk order: the value lists every item in iteration order.
pub struct CollectInOrder<T>(PhantomData<fn() -> T>);

impl<T> CollectInOrder<T> {
    /// The reducer.
    pub const fn new() -> Self {
        CollectInOrder(PhantomData)
    }
}

impl<T> Default for CollectInOrder<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> fmt::Debug for CollectInOrder<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CollectInOrder")
    }
}

impl<T> Reducer for CollectInOrder<T>
where
    T: Serialize + DeserializeOwned + Send + 'static,
{
    type Value = Vec<T>;

    fn identity(&self) -> Vec<T> {
        Vec::new()
    }

    fn combine(&self, acc: &mut Vec<T>, mut next: Vec<T>) {
        if acc.is_empty() {
            *acc = next;
        } else {
            acc.append(&mut next);
        }
    }
}

/// Concatenates byte-buffer outputs in chunk order, like [`CollectInOrder<u8>`] but for
/// [`BytesMut`] values.
///
/// Use it for outputs that are bytes (ciphertext, pixels, serialized records): a `BytesMut`
/// encodes as one length followed by the bytes, copied in bulk, where a `Vec<u8>` (the value of
/// `CollectInOrder<u8>`) encodes and decodes as a sequence, one element at a time. That matters
/// whenever outputs cross the wire to remote workers or go into a snapshot.
///
/// ```
/// use bytes::BytesMut;
/// use malleable::reduce::{CollectBytes, Reducer};
/// let r = CollectBytes::new();
/// let mut v = r.identity();
/// r.combine(&mut v, BytesMut::from(&b"mall"[..]));
/// r.combine(&mut v, BytesMut::from(&b"eable"[..]));
/// assert_eq!(&v[..], b"malleable");
/// ```
#[derive(Debug, Default, Clone, Copy)]
pub struct CollectBytes;

impl CollectBytes {
    /// The reducer.
    pub const fn new() -> Self {
        CollectBytes
    }
}

impl Reducer for CollectBytes {
    type Value = BytesMut;

    fn identity(&self) -> BytesMut {
        BytesMut::new()
    }

    fn combine(&self, acc: &mut BytesMut, next: BytesMut) {
        if acc.is_empty() {
            *acc = next;
        } else {
            acc.extend_from_slice(&next);
        }
    }
}

/// A reducer made of two closures: `identity()` and `combine(&mut acc, next)`.
///
/// ```
/// use malleable::reduce::{FnReducer, Reducer};
/// let product = FnReducer::new(|| 1u64, |acc: &mut u64, x| *acc *= x);
/// let mut v = product.identity();
/// product.combine(&mut v, 6);
/// product.combine(&mut v, 7);
/// assert_eq!(v, 42);
/// ```
pub struct FnReducer<V, I, C> {
    identity: I,
    combine: C,
    _value: PhantomData<fn() -> V>,
}

impl<V, I, C> FnReducer<V, I, C>
where
    I: Fn() -> V,
    C: Fn(&mut V, V),
{
    /// A reducer with this identity and combine.
    pub fn new(identity: I, combine: C) -> Self {
        FnReducer {
            identity,
            combine,
            _value: PhantomData,
        }
    }
}

impl<V, I, C> fmt::Debug for FnReducer<V, I, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FnReducer")
    }
}

impl<V, I, C> Reducer for FnReducer<V, I, C>
where
    V: Serialize + DeserializeOwned + Send + 'static,
    I: Fn() -> V + Send + Sync + 'static,
    C: Fn(&mut V, V) + Send + Sync + 'static,
{
    type Value = V;

    fn identity(&self) -> V {
        (self.identity)()
    }

    fn combine(&self, acc: &mut V, next: V) {
        (self.combine)(acc, next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fold<R: Reducer>(r: &R, xs: Vec<R::Value>) -> R::Value {
        let mut acc = r.identity();
        for x in xs {
            r.combine(&mut acc, x);
        }
        acc
    }

    #[test]
    fn builtins_fold() {
        assert_eq!(fold(&Sum::<i64>::new(), vec![1, -2, 3]), 2);
        assert_eq!(fold(&Count, vec![1, 2, 3]), 6);
        assert_eq!(fold(&Min::<f64>::new(), vec![2.0, -1.5, 3.0]), -1.5);
        assert_eq!(fold(&Max::<u8>::new(), vec![2, 9, 3]), 9);
        assert_eq!(fold(&Min::<u32>::new(), vec![]), u32::MAX);
        assert_eq!(
            fold(&CollectInOrder::new(), vec![vec![1], vec![], vec![2, 3]]),
            vec![1, 2, 3]
        );
    }

    #[test]
    fn collect_bytes_concatenates_in_order() {
        let parts = [&b"ab"[..], b"", b"c", b"defg"]
            .map(BytesMut::from)
            .to_vec();
        assert_eq!(&fold(&CollectBytes::new(), parts)[..], b"abcdefg");
        assert!(fold(&CollectBytes::new(), vec![]).is_empty());
    }

    #[test]
    fn collect_bytes_encodes_in_bulk() {
        // One length, then the bytes as they are: no per-element encoding.
        let v = BytesMut::from(&b"abc"[..]);
        let wire = postcard::to_allocvec(&v).expect("encode");
        assert_eq!(wire, [3, b'a', b'b', b'c']);
        let back: BytesMut = postcard::from_bytes(&wire).expect("decode");
        assert_eq!(back, v);
        // A large value: the length is a varint, the payload is not expanded.
        let big = BytesMut::from(&[0xffu8; 300][..]);
        let wire = postcard::to_allocvec(&big).expect("encode");
        assert_eq!(wire.len(), 2 + 300);
        assert_eq!(
            postcard::from_bytes::<BytesMut>(&wire).expect("decode"),
            big
        );
    }
}
