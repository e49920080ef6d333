//! The one codec of the crate, for the wire and for snapshots: postcard (serde-based, a
//! stable documented format, little-endian varints, no `usize` on the wire). Kept behind this
//! module so it can be swapped; nothing else names postcard except the public
//! [`Error::Codec`](crate::Error::Codec), whose source it is.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// A value that could not be encoded or decoded, and what it was.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("could not encode or decode {what}")]
pub(crate) struct Error {
    /// What it was ("a chunk state", "the job", …).
    pub(crate) what: &'static str,
    /// The codec's error.
    #[source]
    pub(crate) source: postcard::Error,
}

/// Serializes `value`.
pub(crate) fn encode<T: Serialize + ?Sized>(
    what: &'static str,
    value: &T,
) -> Result<Vec<u8>, Error> {
    postcard::to_allocvec(value).map_err(|source| Error { what, source })
}

thread_local! {
    /// Whether the value being encoded on this thread goes to worker processes
    /// ([`encode_for_workers`]).
    static FOR_WORKERS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Serializes a job value for worker processes: as [`encode`], except that what only the
/// coordinator reads is left out ([`Series`](crate::Series) writes no values, see
/// [`for_workers`]).
pub(crate) fn encode_for_workers<T: Serialize + ?Sized>(
    what: &'static str,
    value: &T,
) -> Result<Vec<u8>, Error> {
    /// Ends the mode even if a `Serialize` panics.
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            FOR_WORKERS.with(|f| f.set(self.0));
        }
    }
    let _reset = Reset(FOR_WORKERS.with(|f| f.replace(true)));
    encode(what, value)
}

/// Whether this thread is encoding a value for worker processes ([`encode_for_workers`]):
/// a `Serialize` of coordinator-only data writes none then.
pub(crate) fn for_workers() -> bool {
    FOR_WORKERS.with(std::cell::Cell::get)
}

/// Serializes `value` into a buffer of `capacity` bytes to start with (the size of the
/// worker's previous capture): a worker's snapshot pause then does not regrow the buffer.
pub(crate) fn encode_sized<T: Serialize + ?Sized>(
    what: &'static str,
    value: &T,
    capacity: usize,
) -> Result<Vec<u8>, Error> {
    postcard::to_extend(value, Vec::with_capacity(capacity))
        .map_err(|source| Error { what, source })
}

/// Serializes `value` into memory kept from earlier encodings, of its exact size (a first
/// pass measures it), so that a buddy copy round writes into pages mapped already: a segment
/// of memory other processes of the node can map (`wire/shared.rs`) if `segments` are given
/// and it is long enough to be worth one (a buddy copy then reaches a buddy on the same node
/// without its bytes crossing a link), else a buffer taken from `buffers`.
pub(crate) fn encode_shared<T: Serialize + ?Sized>(
    what: &'static str,
    value: &T,
    segments: Option<&crate::wire::shared::Segments>,
    buffers: &crate::wire::buffers::Buffers,
) -> Result<bytes::Bytes, Error> {
    let len =
        postcard::experimental::serialized_size(value).map_err(|source| Error { what, source })?;
    if let Some(segments) = segments.filter(|_| len >= crate::wire::shared::AT_LEAST) {
        let written = segments.encode(len, |buf| {
            let n = postcard::to_slice(value, buf)?.len();
            // The size measured is the size written: a serializer that disagrees with
            // itself is refused, not cut short.
            if n == len {
                Ok(())
            } else {
                Err(postcard::Error::SerializeBufferFull)
            }
        });
        if let Some(written) = written {
            return written.map_err(|source| Error { what, source });
        }
    }
    postcard::to_extend(value, buffers.take(len))
        .map(bytes::Bytes::from)
        .map_err(|source| Error { what, source })
}

/// Deserializes a value of type `T` from `bytes`.
pub(crate) fn decode<T: DeserializeOwned>(what: &'static str, bytes: &[u8]) -> Result<T, Error> {
    postcard::from_bytes(bytes).map_err(|source| Error { what, source })
}

/// Decodes a value of type `T` from the start of `bytes`, whatever follows it.
pub(crate) fn decode_prefix<T: DeserializeOwned>(
    what: &'static str,
    bytes: &[u8],
) -> Result<T, Error> {
    postcard::take_from_bytes(bytes)
        .map(|(value, _)| value)
        .map_err(|source| Error { what, source })
}

/// Decodes `bytes` into `place`, reusing what it holds where its type can (serde's
/// `deserialize_in_place`: [`crate::rows::Band`] decodes into its own buffers; other types
/// are decoded anew and replace it).
pub(crate) fn decode_into<T: DeserializeOwned>(
    what: &'static str,
    bytes: &[u8],
    place: &mut T,
) -> Result<(), Error> {
    let mut de = postcard::Deserializer::from_bytes(bytes);
    T::deserialize_in_place(&mut de, place).map_err(|source| Error { what, source })
}

/// The static name of what a peer said it could not encode or decode (the wire carries it
/// as text); anything unknown is "a value".
pub(crate) fn what_of(text: &str) -> &'static str {
    const KNOWN: &[&str] = &[
        "a chunk state",
        "a chunk output",
        "the job",
        "the reduced value",
        "the run configuration",
    ];
    KNOWN
        .iter()
        .find(|k| **k == text)
        .copied()
        .unwrap_or("a value")
}
