//! A worker's attention flag and progress, on their own cache line.
//!
//! # The flag contract
//!
//! One byte of request bits per worker, read once per step by the runner:
//!
//! | bit | set by | means |
//! | --- | --- | --- |
//! | [`INTERRUPT`] | the job's coordinator (local workers) | hand the chunk back at the next adjustment point |
//! | [`CAPTURE`] | the job's coordinator (local workers) | serialize the chunk for a snapshot and go on |
//! | [`MAIL`] | a worker process's I/O task | a request is in the thread's queue |
//!
//! 1. *Raise.* A requester first writes whatever the request carries (a message in the
//!    runner's queue; for the bits that are themselves the request, nothing), then sets its
//!    bit with [`Cell::raise`], a `fetch_or` with `Release` ordering.
//! 2. *Poll.* At each adjustment point the runner reads the byte with one `Relaxed` load
//!    ([`Cell::raised`]): no fence, no read-modify-write, on a cache line nobody else writes
//!    while the chunk runs, so the per-step cost is one L1 hit.
//! 3. *Take.* When the byte is not zero the runner's host takes the bits with
//!    [`Cell::take`], a `swap(0)` with `Acquire` ordering, and then reads the requests. It
//!    synchronises with every `raise` whose bit it took: whatever the requester wrote before
//!    raising (a queued message) is visible. A request raised after the `take` leaves its bit
//!    set and is seen at a later adjustment point, so none is lost.
//! 4. *Between chunks.* A host clears the byte before it takes the next chunk
//!    ([`Cell::clear`]): a local worker under the job's lock, before the coordinator can issue
//!    a request for the next chunk (requests are issued under that lock); a remote thread
//!    before it reads its queue. So a bit raised for a chunk that has since ended is never
//!    mistaken for a request about the next one: the local coordinator issues requests only
//!    for the chunk it knows running; remote requests name their (slot, chunk) and a request
//!    for a chunk the thread no longer holds is dropped.
//! 5. *Withdraw.* A snapshot cut that is abandoned lowers [`CAPTURE`] ([`Cell::lower`]); a
//!    runner that took the bit first captures anyway, and the capture is ignored (no cut waits
//!    for it).
//!
//! Why `Relaxed` suffices on the per-step load: it only decides whether to call the host;
//! the `Acquire` of step 3 is what orders the request's data. A stale zero delays a request
//! by one step; a stale one costs one `take` that finds nothing.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

/// Flag bit: stop at the next adjustment point and hand the chunk back.
pub(crate) const INTERRUPT: u8 = 1;
/// Flag bit: serialize the chunk at the next adjustment point for a snapshot.
pub(crate) const CAPTURE: u8 = 2;
/// Flag bit: a request waits in the runner's queue.
pub(crate) const MAIL: u8 = 4;

/// A worker's attention flag and the progress of its running chunk.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct Cell {
    flag: AtomicU8,
    /// Iterations done in the worker's current chunk, published at most every few ms.
    progress: AtomicU64,
}

impl Cell {
    /// Step 1: raises `bits`, after the request's data was written.
    pub(crate) fn raise(&self, bits: u8) {
        self.flag.fetch_or(bits, Ordering::Release);
    }

    /// Step 2: whether any bit is raised (one `Relaxed` load, once per step).
    #[inline]
    pub(crate) fn raised(&self) -> bool {
        self.flag.load(Ordering::Relaxed) != 0
    }

    /// Step 3: takes the raised bits; what was written before they were raised is visible.
    pub(crate) fn take(&self) -> u8 {
        self.flag.swap(0, Ordering::Acquire)
    }

    /// Step 4: clears every bit between two chunks.
    pub(crate) fn clear(&self) {
        self.flag.store(0, Ordering::Relaxed);
    }

    /// Step 5: withdraws `bits` not yet taken.
    pub(crate) fn lower(&self, bits: u8) {
        self.flag.fetch_and(!bits, Ordering::Relaxed);
    }

    /// Publishes the iterations done in the running chunk (0 between chunks).
    #[inline]
    pub(crate) fn publish(&self, done: u64) {
        self.progress.store(done, Ordering::Relaxed);
    }

    /// The last published progress.
    pub(crate) fn progress(&self) -> u64 {
        self.progress.load(Ordering::Relaxed)
    }
}
