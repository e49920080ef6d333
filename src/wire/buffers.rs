//! Large buffers kept for reuse: the memory of a message with a long byte field (a buddy
//! copy, above all) goes back here when the message is done with, and the next such message
//! is encoded, or read from its connection, into memory whose pages are mapped already.
//!
//! Why: a buddy copy round moves each process's partitions, megabytes each, twice through
//! memory (encoded by the sender, read by the receiver). Into fresh memory every page is
//! faulted in and zeroed by the kernel first: measured on the copies bench, a plain copy of a
//! process's 64 MB took 24-35 ms into fresh memory and 3-7 ms into memory already mapped,
//! and the encoding of a copy round was most of the pause it put on the running phase. The
//! allocator gives freed megabytes back to the system, so memory freed by one round is not
//! what the next round gets.
//!
//! What is kept is bounded: at most `limit` bytes, and a buffer not taken again within
//! [`KEEP_FOR`] is let go (a job that copies every few minutes gets its memory back in
//! between). A buffer still referred to elsewhere is never kept: [`Buffers::give`] takes
//! only what it is the last owner of.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

/// The shortest buffer worth keeping: shorter ones cost the allocator little.
pub(crate) const AT_LEAST: usize = 64 << 10;

/// How long a buffer given back is kept without being taken again.
pub(crate) const KEEP_FOR: Duration = Duration::from_secs(60);

/// Large buffers kept for reuse, at most `limit` bytes of them (see the module's docs).
#[derive(Debug)]
pub(crate) struct Buffers {
    limit: usize,
    kept: Mutex<Kept>,
}

#[derive(Debug, Default)]
struct Kept {
    /// The buffers, oldest given first, each empty, with when it was given.
    buffers: Vec<(Vec<u8>, Instant)>,
    /// Their capacities' sum.
    bytes: usize,
    /// Buffers taken from here, and made new.
    reused: u64,
    made: u64,
}

/// What [`Buffers`] did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Reuse {
    /// Buffers of at least [`AT_LEAST`] bytes taken from those kept.
    pub(crate) reused: u64,
    /// Buffers of at least [`AT_LEAST`] bytes allocated, none kept fitting.
    pub(crate) made: u64,
    /// Bytes kept now.
    pub(crate) kept: usize,
}

impl Buffers {
    /// Keeps at most `limit` bytes of buffers.
    pub(crate) fn new(limit: usize) -> Buffers {
        Buffers {
            limit,
            kept: Mutex::new(Kept::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        // A buffer list is consistent after any panic: the poison is of no concern.
        self.kept
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// An empty buffer of at least `len` bytes of capacity: the smallest kept one that fits
    /// (if not over twice as large), else a new one.
    pub(crate) fn take(&self, len: usize) -> Vec<u8> {
        if len < AT_LEAST {
            return Vec::with_capacity(len);
        }
        let mut kept = self.lock();
        let now = Instant::now();
        kept.expire(now);
        let best = kept
            .buffers
            .iter()
            .enumerate()
            .filter(|(_, (b, _))| b.capacity() >= len && b.capacity() / 2 <= len)
            .min_by_key(|(_, (b, _))| b.capacity())
            .map(|(i, _)| i);
        match best {
            Some(i) => {
                let (b, _) = kept.buffers.remove(i);
                kept.bytes -= b.capacity();
                kept.reused += 1;
                b
            }
            None => {
                kept.made += 1;
                drop(kept);
                Vec::with_capacity(len)
            }
        }
    }

    /// Keeps the memory of `bytes` for reuse, if nothing else refers to it and it is worth
    /// keeping; older buffers go first to stay within the limit.
    pub(crate) fn give(&self, bytes: Bytes) {
        let Ok(mut whole) = bytes.try_into_mut() else {
            return;
        };
        // Emptied first: the conversion would move what is left to the front.
        whole.clear();
        self.keep(Vec::from(whole));
    }

    /// Keeps `buffer` for reuse (as [`Buffers::give`]).
    pub(crate) fn keep(&self, mut buffer: Vec<u8>) {
        let cap = buffer.capacity();
        if cap < AT_LEAST || cap > self.limit {
            return;
        }
        buffer.clear();
        let mut kept = self.lock();
        let now = Instant::now();
        kept.expire(now);
        while kept.bytes + cap > self.limit && !kept.buffers.is_empty() {
            let (old, _) = kept.buffers.remove(0);
            kept.bytes -= old.capacity();
        }
        kept.bytes += cap;
        kept.buffers.push((buffer, now));
    }

    /// A read buffer for a frame of `len` bytes (its header included) whose first bytes
    /// are `start`.
    pub(crate) fn read_buffer(&self, len: usize, start: &[u8]) -> BytesMut {
        let mut b = self.take(len.max(start.len()));
        b.extend_from_slice(start);
        // Both conversions keep the memory (its capacity too): neither copies.
        BytesMut::from(Bytes::from(b))
    }

    /// What was reused and kept so far.
    pub(crate) fn reuse(&self) -> Reuse {
        let kept = self.lock();
        Reuse {
            reused: kept.reused,
            made: kept.made,
            kept: kept.bytes,
        }
    }
}

impl Kept {
    /// Lets go of the buffers given more than [`KEEP_FOR`] before `now`.
    fn expire(&mut self, now: Instant) {
        let old = self
            .buffers
            .iter()
            .take_while(|(_, at)| now.duration_since(*at) > KEEP_FOR)
            .count();
        for (b, _) in self.buffers.drain(..old) {
            self.bytes -= b.capacity();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A buffer given back is the one the next take of its size gets: the same memory.
    #[test]
    fn a_buffer_given_back_is_taken_again() {
        let pool = Buffers::new(1 << 30);
        let mut b = pool.take(1 << 20);
        b.extend_from_slice(&vec![7u8; 1 << 20]);
        let at = b.as_ptr();
        // A slice of it, the whole dropped: the memory's last owner.
        let bytes = Bytes::from(b).slice(100..);
        pool.give(bytes);
        assert_eq!(pool.reuse().kept, 1 << 20);
        let again = pool.take(1 << 20);
        assert_eq!((again.as_ptr(), again.len()), (at, 0));
        assert_eq!(pool.reuse().reused, 1);
        // Nothing kept fits now: a new one.
        let other = pool.take(1 << 20);
        assert_ne!(other.as_ptr(), at);
        assert_eq!(pool.reuse().made, 2);
    }

    /// Memory read into from a connection comes back too: a frame split off the read
    /// buffer is given back once the buffer's rest is gone.
    #[test]
    fn a_frame_split_off_its_read_buffer_comes_back_alone() {
        let pool = Buffers::new(1 << 30);
        let mut read = pool.read_buffer(1 << 20, &[1, 2, 3]);
        let at = read.as_ptr();
        read.extend_from_slice(&vec![9u8; (1 << 20) - 3]);
        let frame = read.split_to(1 << 20).freeze();
        // The read buffer still shares the memory: not kept.
        pool.give(frame.slice(10..));
        assert_eq!(pool.reuse().kept, 0);
        let frame = {
            let mut read = pool.read_buffer(1 << 20, &[]);
            read.extend_from_slice(&vec![9u8; 1 << 20]);
            let f = read.split_to(1 << 20).freeze();
            drop(read);
            f
        };
        let second = frame.as_ptr();
        let field = frame.slice(10..);
        drop(frame);
        pool.give(field);
        assert_eq!(pool.reuse().kept, 1 << 20);
        let again = pool.take(1 << 20);
        assert_eq!(again.as_ptr(), second);
        assert_ne!(second, at);
    }

    /// Shared memory, small buffers and buffers over the limit are not kept; older ones go
    /// first to make room.
    #[test]
    fn what_is_kept_is_bounded() {
        let pool = Buffers::new(3 << 20);
        let shared = Bytes::from(vec![0u8; 1 << 20]);
        let other = shared.clone();
        pool.give(shared);
        pool.give(Bytes::from(vec![0u8; 1000]));
        pool.keep(Vec::with_capacity(4 << 20));
        assert_eq!(pool.reuse().kept, 0);
        drop(other);
        for _ in 0..4 {
            pool.keep(Vec::with_capacity(1 << 20));
        }
        assert_eq!(pool.reuse().kept, 3 << 20);
        // A buffer far larger than asked for is not given out.
        pool.keep(Vec::with_capacity(3 << 20));
        assert_eq!(pool.reuse().kept, 3 << 20);
        assert!(pool.take(1 << 20).capacity() < 2 << 20);
    }
}
