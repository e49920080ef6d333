//! Buddy copies through memory shared by two processes of one node (protocol 28).
//!
//! Why: a buddy copy pushed over loopback costs the two processes of a node most of what a
//! copy round costs. Measured on the copies bench (2 processes, 64 MB each a round): the
//! encoding into kept memory is 1-5% of the run and a 5 ms pause, the transmission the other
//! 23-30% (the kernel copies each byte twice, on the cores that compute). Between processes
//! of one node the bytes need not move at all.
//!
//! # How
//!
//! - The *owner* (the process that holds a partition) encodes a copy into a [`Segments`]
//!   segment: a memory file (`memfd`) mapped into its address space, kept from round to round
//!   like [`Buffers`](super::buffers::Buffers) keeps heap memory, so that its pages are mapped
//!   already. The copy's bytes are a [`Bytes`] view of it.
//! - The link that pushes the copy to its buddy *lends* the segment ([`Segments::lend`]):
//!   it writes a header with a fresh nonce into the segment and sends, instead of the bytes,
//!   where they are ([`SharedAt`]: the owner's process id, the memory file's descriptor
//!   number, the offset, the length and the nonce) in a `ToPeer::SharedCopy`.
//! - The *buddy* opens the file through `/proc/<pid>/fd/<fd>` and maps it read-only
//!   ([`map`]); its copy is a [`Bytes`] view of that mapping, kept as any other copy. The
//!   pages are the owner's: nothing is copied, and they outlive the owner (an open file
//!   keeps a memory file's pages), which is what a buddy copy is for.
//! - When the buddy drops its copy (a newer copy replaced it, the coordinator dropped it,
//!   a replay used it up), it unmaps it and says so (`FromPeer::Released`); only then may
//!   the owner write into that segment again. A segment lent on a link that ended is never
//!   written again: the owner forgets it ([`Segments::forget_link`]), and its pages go when
//!   the buddy lets go of them too.
//! - A buddy that cannot map the file (another node, another process namespace, `/proc` out
//!   of reach, sharing turned off) answers `FromPeer::Unshared`; the link sends the copy's
//!   bytes instead, and sends every later copy so (counted and logged on both sides).
//!
//! # What a buddy checks before it maps
//!
//! A `SharedCopy` comes from a process that proved it holds the job's token, but its
//! numbers are checked as untrusted bytes: the descriptor must name one of this crate's
//! memory files (its link, before it is opened: a FIFO or a device is never opened), the file
//! must be sealed against shrinking (so no page of the mapping can go away under a reader,
//! which would end the process with `SIGBUS`), long enough for the range, and its header
//! must carry the nonce and range of the message (a process of another node with the same
//! process id and descriptor number fails here). Every failure is a typed [`NotShared`],
//! answered with `Unshared`: the copy then crosses the link as bytes.
//!
//! # Why a copy cannot change under its buddy
//!
//! The owner writes a segment's payload only while no view of it is alive in its own
//! process and no buddy may map it: [`Segments`] takes for an encoding only a segment it
//! alone refers to and that is not lent; it is lent from the push until the buddy's
//! `Released` for that lend's nonce (or its `Unshared`, which says it did not map it), and
//! forgotten, never written again, if the link ends first. A buddy releases only after it
//! unmapped. (A process of the job that writes into memory it lent, or releases memory it
//! still maps, corrupts only its own copies; the processes of a job trust each other's
//! proofs of the token as the coordinator trusts their reports.)

use bytes::Bytes;

use super::peer::SharedAt;

/// The shortest encoding worth a segment: shorter ones cost the allocator little, and their
/// bytes cross a link quickly.
pub(crate) const AT_LEAST: usize = super::buffers::AT_LEAST;

/// The bytes a segment starts with, before the payload: `MAGIC`, the nonce of the latest
/// lend, the payload's offset and length.
const HEADER: usize = 64;

/// The first bytes of a lent segment's header.
const MAGIC: &[u8; 8] = b"mllbcopy";

/// The name of this crate's memory files (as `/proc/<pid>/fd/<fd>` shows it:
/// `/memfd:malleable-copy (deleted)`).
#[cfg(target_os = "linux")]
const NAME: &std::ffi::CStr = c"malleable-copy";

/// Why a buddy did not map a shared copy (it answers `Unshared`, and the copy's bytes come
/// over the link instead).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum NotShared {
    /// This process does not map copies (turned off, or not Linux).
    #[error("this process does not map shared copies")]
    Off,
    /// No such process or descriptor here: the owner runs on another node or in another
    /// process namespace, or ended, or closed it.
    #[error("process {pid}'s descriptor {fd} is not there (another node, or gone)")]
    Gone {
        /// The owner's process id, as it named it.
        pid: u32,
        /// The descriptor number.
        fd: u32,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
    /// The descriptor is not one of this crate's memory files.
    #[error("process {pid}'s descriptor {fd} is {link:?}, not a copy's memory file")]
    NotAMemoryFile {
        /// The owner's process id.
        pid: u32,
        /// The descriptor number.
        fd: u32,
        /// What it is.
        link: String,
    },
    /// The file could not be opened, looked at or mapped.
    #[error("process {pid}'s memory file {fd} could not be {what}")]
    Io {
        /// The owner's process id.
        pid: u32,
        /// The descriptor number.
        fd: u32,
        /// Opened, looked at, mapped.
        what: &'static str,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
    /// The file may shrink (it is not sealed against it): a page could go under a reader.
    #[error("process {pid}'s memory file {fd} is not sealed against shrinking")]
    NotSealed {
        /// The owner's process id.
        pid: u32,
        /// The descriptor number.
        fd: u32,
    },
    /// The range is not in the file, or longer than a message may be.
    #[error(
        "bytes {offset}..+{len} are not in process {pid}'s memory file {fd} of {size} bytes (at most {max} a message)"
    )]
    OutOfRange {
        /// The owner's process id.
        pid: u32,
        /// The descriptor number.
        fd: u32,
        /// The range's start.
        offset: u64,
        /// Its length.
        len: u64,
        /// The file's length.
        size: u64,
        /// The longest message this process reads.
        max: u64,
    },
    /// The header does not name this lend: another process's file with the same numbers, or
    /// a lend that ended.
    #[error("process {pid}'s memory file {fd} does not hold the copy named (its header differs)")]
    Header {
        /// The owner's process id.
        pid: u32,
        /// The descriptor number.
        fd: u32,
    },
}

/// What the owner's side of sharing did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Sharing {
    /// Segments made, and encodings into a segment kept from an earlier one.
    pub(crate) made: u64,
    pub(crate) reused: u64,
    /// Lends, and those released by their buddy.
    pub(crate) lent: u64,
    pub(crate) released: u64,
    /// Segments forgotten while lent (their link ended, or past the limit).
    pub(crate) forgotten: u64,
    /// Bytes of the segments kept (free, lent, or in use).
    pub(crate) bytes: u64,
}

#[cfg(target_os = "linux")]
pub(crate) use linux::Segments;

/// Segments of shared memory (not on this system: none).
#[cfg(not(target_os = "linux"))]
#[derive(Debug)]
pub(crate) struct Segments(());

#[cfg(not(target_os = "linux"))]
impl Segments {
    /// None: this system has no memory files.
    pub(crate) fn new(_limit: usize) -> Option<Segments> {
        None
    }
    pub(crate) fn encode<E>(
        &self,
        _len: usize,
        _write: impl FnOnce(&mut [u8]) -> Result<(), E>,
    ) -> Option<Result<Bytes, E>> {
        None
    }
    pub(crate) fn lend(&self, _bytes: &Bytes, _link: u64) -> Option<SharedAt> {
        None
    }
    pub(crate) fn unlend(&self, _link: u64, _nonce: [u8; 16]) {}
    pub(crate) fn release(&self, _link: u64, _nonce: [u8; 16]) -> bool {
        false
    }
    pub(crate) fn forget_link(&self, _link: u64) {}
    pub(crate) fn sharing(&self) -> Sharing {
        Sharing::default()
    }
}

/// Maps the copy `at` names, read-only: its bytes, whose last drop unmaps them and then calls
/// `released`. At most `max` bytes.
///
/// # Errors
///
/// [`NotShared`], for whatever does not check (see the module's docs).
#[cfg(target_os = "linux")]
pub(crate) fn map(
    at: &SharedAt,
    max: usize,
    released: Box<dyn FnOnce() + Send>,
) -> Result<Bytes, NotShared> {
    linux::map(at, max, released)
}

/// Maps nothing: this system has no memory files.
#[cfg(not(target_os = "linux"))]
pub(crate) fn map(
    _at: &SharedAt,
    _max: usize,
    _released: Box<dyn FnOnce() + Send>,
) -> Result<Bytes, NotShared> {
    Err(NotShared::Off)
}

#[cfg(target_os = "linux")]
mod linux {
    use std::fs::File;
    use std::os::fd::{AsRawFd, FromRawFd};
    use std::os::unix::fs::OpenOptionsExt;
    use std::sync::{Arc, Mutex, MutexGuard};
    use std::time::Instant;

    use bytes::Bytes;

    use super::{HEADER, MAGIC, NAME, NotShared, SharedAt, Sharing};
    use crate::wire::buffers::KEEP_FOR;

    /// Segments are made in multiples of this (a reused one fits a copy that grew a little).
    const ROUND: usize = 64 << 10;

    /// A memory file and its mapping (read and write), as long as anything refers to it.
    #[derive(Debug)]
    struct Region {
        file: File,
        map: memmap2::MmapRaw,
    }

    impl Region {
        /// A new memory file of `cap` bytes, sealed against shrinking, mapped.
        fn new(cap: usize) -> std::io::Result<Region> {
            // SAFETY: a valid, NUL-terminated name and flags; the result is checked.
            let fd = unsafe {
                libc::memfd_create(NAME.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
            };
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // SAFETY: `fd` was just made and is owned by nothing else.
            let file = unsafe { File::from_raw_fd(fd) };
            file.set_len(cap as u64)?;
            // SAFETY: a valid descriptor; the result is checked.
            if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) } < 0
            {
                return Err(std::io::Error::last_os_error());
            }
            let map = memmap2::MmapOptions::new().len(cap).map_raw(&file)?;
            Ok(Region { file, map })
        }

        fn cap(&self) -> usize {
            self.map.len()
        }

        /// Whether `bytes` lies in this region's payload.
        fn holds(&self, bytes: &Bytes) -> Option<usize> {
            let base = self.map.as_ptr() as usize;
            let at = bytes.as_ptr() as usize;
            (at >= base + HEADER && at + bytes.len() <= base + self.cap()).then(|| at - base)
        }
    }

    /// A view of a region's payload: what a [`Bytes`] of an encoded copy owns.
    struct View {
        region: Arc<Region>,
        len: usize,
    }

    impl AsRef<[u8]> for View {
        fn as_ref(&self) -> &[u8] {
            // SAFETY: the payload was written before the view was made, and the region is
            // not written while a view of it is alive (`Segments::encode` takes only a
            // region nothing else refers to); `HEADER + len <= cap` was checked there, and
            // the mapping lives as long as `region`.
            unsafe { std::slice::from_raw_parts(self.region.map.as_ptr().add(HEADER), self.len) }
        }
    }

    /// A segment kept by [`Segments`].
    #[derive(Debug)]
    struct Seg {
        region: Arc<Region>,
        /// The lend under way: the link, its nonce, and when.
        lent: Option<(u64, [u8; 16])>,
        /// When it was last taken or given back (a free one unused for [`KEEP_FOR`] goes).
        used: Instant,
    }

    impl Seg {
        /// Free: not lent, and nothing but the pool refers to it (a view is made only under
        /// the pool's lock, so the count cannot rise meanwhile).
        fn free(&self) -> bool {
            self.lent.is_none() && Arc::strong_count(&self.region) == 1
        }
    }

    /// The owner's memory files for copies (see the module's docs): free ones are kept for
    /// reuse, at most `limit` bytes of them, and so are lent ones; a free one not used for
    /// [`KEEP_FOR`] goes.
    #[derive(Debug)]
    pub(crate) struct Segments {
        limit: usize,
        inner: Mutex<Inner>,
    }

    #[derive(Debug, Default)]
    struct Inner {
        segs: Vec<Seg>,
        stats: Sharing,
    }

    impl Segments {
        /// Segments, if this system makes memory files (tried once here).
        pub(crate) fn new(limit: usize) -> Option<Segments> {
            match Region::new(ROUND) {
                Ok(_) => Some(Segments {
                    limit,
                    inner: Mutex::new(Inner::default()),
                }),
                Err(e) => {
                    tracing::warn!(
                        error = &e as &dyn std::error::Error,
                        "no memory files here: buddy copies cross their links as bytes"
                    );
                    None
                }
            }
        }

        fn lock(&self) -> MutexGuard<'_, Inner> {
            // The segment list is consistent after any panic.
            self.inner
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        }

        /// Encodes `len` bytes with `write` into a free segment (one kept, else a new one):
        /// their bytes. `None` if no segment can be made (out of descriptors or memory): the
        /// caller encodes into the heap.
        pub(crate) fn encode<E>(
            &self,
            len: usize,
            write: impl FnOnce(&mut [u8]) -> Result<(), E>,
        ) -> Option<Result<Bytes, E>> {
            let need = HEADER.checked_add(len)?;
            let region = {
                let mut inner = self.lock();
                let now = Instant::now();
                inner.expire(now);
                let best = inner
                    .segs
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| {
                        s.free() && s.region.cap() >= need && s.region.cap() / 2 <= need
                    })
                    .min_by_key(|(_, s)| s.region.cap())
                    .map(|(i, _)| i);
                match best {
                    Some(i) => {
                        inner.stats.reused += 1;
                        inner.segs[i].used = now;
                        Arc::clone(&inner.segs[i].region)
                    }
                    None => {
                        let cap = need.div_ceil(ROUND).checked_mul(ROUND)?;
                        inner.make_room(cap, self.limit);
                        let region = match Region::new(cap) {
                            Ok(r) => Arc::new(r),
                            Err(e) => {
                                tracing::warn!(
                                    error = &e as &dyn std::error::Error,
                                    bytes = cap,
                                    "no memory file for a copy: encoded into the heap"
                                );
                                return None;
                            }
                        };
                        inner.stats.made += 1;
                        inner.stats.bytes += cap as u64;
                        inner.segs.push(Seg {
                            region: Arc::clone(&region),
                            lent: None,
                            used: now,
                        });
                        region
                    }
                }
            };
            // The pool's lock is not held while the payload is written: the region is
            // referred to here, so no other encoding takes it, and it is not lent.
            // SAFETY: the mapping is `cap >= HEADER + len` bytes and lives while `region`
            // does; no view of it is alive (it was free) and none is made before this
            // slice is gone.
            let payload =
                unsafe { std::slice::from_raw_parts_mut(region.map.as_mut_ptr().add(HEADER), len) };
            Some(write(payload).map(|()| Bytes::from_owner(View { region, len })))
        }

        /// Lends the segment `bytes` lies in on link `link`: its header names a fresh nonce,
        /// and the answer says where it is. `None` if `bytes` is not in a segment, or its
        /// segment is lent already (the bytes then cross the link).
        pub(crate) fn lend(&self, bytes: &Bytes, link: u64) -> Option<SharedAt> {
            let mut nonce = [0u8; 16];
            getrandom::fill(&mut nonce).ok()?;
            let mut inner = self.lock();
            let i = inner
                .segs
                .iter()
                .position(|s| s.region.holds(bytes).is_some())?;
            if inner.segs[i].lent.is_some() {
                return None;
            }
            let seg = &mut inner.segs[i];
            let offset = seg.region.holds(bytes)? as u64;
            let len = bytes.len() as u64;
            let mut header = [0u8; HEADER];
            header[..8].copy_from_slice(MAGIC);
            header[8..24].copy_from_slice(&nonce);
            header[24..32].copy_from_slice(&offset.to_le_bytes());
            header[32..40].copy_from_slice(&len.to_le_bytes());
            // SAFETY: the header's bytes are in the mapping and in no view (views start at
            // `HEADER`), and no buddy maps the region (it is not lent).
            unsafe {
                std::ptr::copy_nonoverlapping(header.as_ptr(), seg.region.map.as_mut_ptr(), HEADER);
            }
            seg.lent = Some((link, nonce));
            let fd = seg.region.file.as_raw_fd() as u32;
            inner.stats.lent += 1;
            let lent_bytes: usize = inner
                .segs
                .iter()
                .filter(|s| s.lent.is_some())
                .map(|s| s.region.cap())
                .sum();
            if lent_bytes > self.limit {
                inner.forget_oldest_lent(lent_bytes - self.limit, i);
            }
            Some(SharedAt {
                pid: std::process::id(),
                fd,
                offset,
                len,
                nonce,
            })
        }

        /// The buddy did not map the lend of `nonce` on `link` (`Unshared`): the segment is
        /// not lent any more.
        pub(crate) fn unlend(&self, link: u64, nonce: [u8; 16]) {
            let mut inner = self.lock();
            if let Some(s) = inner
                .segs
                .iter_mut()
                .find(|s| s.lent == Some((link, nonce)))
            {
                s.lent = None;
            }
        }

        /// The buddy unmapped the lend of `nonce` on `link` (`Released`): the segment may be
        /// written again once this process lets go of its views. False for a lend this
        /// pool does not know (of a forgotten segment, or forged).
        pub(crate) fn release(&self, link: u64, nonce: [u8; 16]) -> bool {
            let mut inner = self.lock();
            let Some(s) = inner
                .segs
                .iter_mut()
                .find(|s| s.lent == Some((link, nonce)))
            else {
                return false;
            };
            s.lent = None;
            s.used = Instant::now();
            inner.stats.released += 1;
            true
        }

        /// Link `link` ended: the segments lent on it are forgotten (a release can no longer
        /// come), never written again; their pages go when their buddy lets go of them.
        pub(crate) fn forget_link(&self, link: u64) {
            let mut inner = self.lock();
            let before = inner.segs.len();
            let mut gone = 0u64;
            inner.segs.retain(|s| {
                let keep = s.lent.is_none_or(|(l, _)| l != link);
                if !keep {
                    gone += s.region.cap() as u64;
                }
                keep
            });
            let n = (before - inner.segs.len()) as u64;
            inner.stats.forgotten += n;
            inner.stats.bytes -= gone;
        }

        /// What was done so far.
        pub(crate) fn sharing(&self) -> Sharing {
            self.lock().stats
        }
    }

    impl Inner {
        /// Lets go of the free segments unused for [`KEEP_FOR`].
        fn expire(&mut self, now: Instant) {
            let mut gone = 0u64;
            self.segs.retain(|s| {
                let keep = !s.free() || now.duration_since(s.used) <= KEEP_FOR;
                if !keep {
                    gone += s.region.cap() as u64;
                }
                keep
            });
            self.stats.bytes -= gone;
        }

        /// Lets go of free segments, oldest first, until `cap` more fits in `limit`.
        fn make_room(&mut self, cap: usize, limit: usize) {
            let free = |segs: &[Seg]| -> usize {
                segs.iter()
                    .filter(|s| s.free())
                    .map(|s| s.region.cap())
                    .sum()
            };
            while free(&self.segs) + cap > limit {
                let Some(i) = self
                    .segs
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| s.free())
                    .min_by_key(|(_, s)| s.used)
                    .map(|(i, _)| i)
                else {
                    return;
                };
                let s = self.segs.remove(i);
                self.stats.bytes -= s.region.cap() as u64;
            }
        }

        /// Forgets lent segments, oldest first but for `keep`, until `over` bytes went: a
        /// buddy that never releases costs this process no more than the limit.
        fn forget_oldest_lent(&mut self, mut over: usize, keep: usize) {
            let keep = Arc::clone(&self.segs[keep].region);
            while over > 0 {
                let Some(i) = self
                    .segs
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| s.lent.is_some() && !Arc::ptr_eq(&s.region, &keep))
                    .min_by_key(|(_, s)| s.used)
                    .map(|(i, _)| i)
                else {
                    return;
                };
                let s = self.segs.remove(i);
                over = over.saturating_sub(s.region.cap());
                self.stats.bytes -= s.region.cap() as u64;
                self.stats.forgotten += 1;
            }
        }
    }

    /// A buddy's mapping of a copy: its bytes, until the last drop, which unmaps them and
    /// then says so.
    struct Mapped {
        map: Option<memmap2::Mmap>,
        offset: usize,
        len: usize,
        released: Option<Box<dyn FnOnce() + Send>>,
    }

    impl AsRef<[u8]> for Mapped {
        fn as_ref(&self) -> &[u8] {
            match &self.map {
                Some(m) => &m[self.offset..self.offset + self.len],
                None => &[],
            }
        }
    }

    impl Drop for Mapped {
        fn drop(&mut self) {
            // Unmapped first: the owner may write into it once told.
            drop(self.map.take());
            if let Some(released) = self.released.take() {
                released();
            }
        }
    }

    pub(super) fn map(
        at: &SharedAt,
        max: usize,
        released: Box<dyn FnOnce() + Send>,
    ) -> Result<Bytes, NotShared> {
        let (pid, fd) = (at.pid, at.fd);
        let path = format!("/proc/{pid}/fd/{fd}");
        // What the descriptor is, before opening it: only a memory file of this crate.
        // Not there (another node, or gone) and out of reach (another user's process) are
        // told apart.
        let link = std::fs::read_link(&path).map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => NotShared::Gone { pid, fd, source },
            _ => NotShared::Io {
                pid,
                fd,
                what: "looked at",
                source,
            },
        })?;
        let link = link.to_string_lossy().into_owned();
        if !link.starts_with("/memfd:malleable-copy") {
            return Err(NotShared::NotAMemoryFile { pid, fd, link });
        }
        let io = |what| {
            move |source| NotShared::Io {
                pid,
                fd,
                what,
                source,
            }
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path)
            .map_err(io("opened"))?;
        let meta = file.metadata().map_err(io("looked at"))?;
        if !meta.file_type().is_file() {
            return Err(NotShared::NotAMemoryFile { pid, fd, link });
        }
        // SAFETY: a valid descriptor; the result is checked. Only memory files have seals.
        let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
            return Err(NotShared::NotSealed { pid, fd });
        }
        let size = meta.len();
        let end = at
            .offset
            .checked_add(at.len)
            .filter(|&e| at.offset >= HEADER as u64 && e <= size && at.len <= max as u64)
            .and_then(|e| usize::try_from(e).ok());
        let Some(end) = end else {
            return Err(NotShared::OutOfRange {
                pid,
                fd,
                offset: at.offset,
                len: at.len,
                size,
                max: max as u64,
            });
        };
        // SAFETY: the file is sealed against shrinking and `end` bytes long at least, so
        // every page of the mapping stays backed (no SIGBUS). Its owner writes the range
        // only after this process released it (the module's docs).
        let map =
            unsafe { memmap2::MmapOptions::new().len(end).map(&file) }.map_err(io("mapped"))?;
        let header = &map[..HEADER];
        let same = &header[..8] == MAGIC
            && header[8..24] == at.nonce
            && header[24..32] == at.offset.to_le_bytes()
            && header[32..40] == at.len.to_le_bytes();
        if !same {
            return Err(NotShared::Header { pid, fd });
        }
        Ok(Bytes::from_owner(Mapped {
            map: Some(map),
            offset: at.offset as usize,
            len: at.len as usize,
            released: Some(released),
        }))
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use std::os::fd::AsRawFd;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect()
    }

    fn encode(segments: &Segments, bytes: &[u8]) -> Bytes {
        segments
            .encode(bytes.len(), |buf| {
                buf.copy_from_slice(bytes);
                Ok::<_, ()>(())
            })
            .expect("a segment")
            .expect("written")
    }

    /// A release that raises a flag when called.
    fn flag() -> (Arc<AtomicBool>, Box<dyn FnOnce() + Send>) {
        let f = Arc::new(AtomicBool::new(false));
        let g = Arc::clone(&f);
        (f, Box::new(move || g.store(true, Ordering::SeqCst)))
    }

    /// Both sides of a lend in one process: the buddy maps the owner's bytes; while lent the
    /// segment is never taken for another encoding, nor lent twice; the buddy's last drop
    /// unmaps and releases it, and then (and only then) it serves again.
    #[test]
    fn a_lent_copy_is_mapped_and_its_memory_waits_for_the_release() {
        let segments = Segments::new(1 << 30).unwrap();
        let one = pattern(200_000, 1);
        let bytes = encode(&segments, &one);
        let at = segments.lend(&bytes, 1).expect("lent");
        assert_eq!(
            (at.pid, at.offset, at.len),
            (std::process::id(), HEADER as u64, 200_000)
        );
        assert!(segments.lend(&bytes, 1).is_none(), "lent twice");
        let (released, release) = flag();
        let mapped = map(&at, 1 << 20, release).unwrap();
        assert_eq!(&mapped[..], &one[..]);
        assert_ne!(mapped.as_ptr(), bytes.as_ptr(), "a mapping of its own");
        let shared_clone = mapped.slice(10..20);
        // The owner lets go of its view: still lent, so another encoding gets new memory.
        drop(bytes);
        let two = encode(&segments, &pattern(200_000, 2));
        assert_eq!(segments.sharing().made, 2);
        drop(two);
        drop(mapped);
        assert!(!released.load(Ordering::SeqCst), "a slice of it is alive");
        assert_eq!(&shared_clone[..], &one[10..20]);
        drop(shared_clone);
        assert!(released.load(Ordering::SeqCst));
        assert!(!segments.release(2, at.nonce), "another link's release");
        assert!(!segments.release(1, [0; 16]), "another nonce");
        assert!(segments.release(1, at.nonce));
        assert!(!segments.release(1, at.nonce), "released twice");
        // Both segments are free: the next two encodings take them, none is made.
        let (a, b) = (encode(&segments, &one), encode(&segments, &one));
        let s = segments.sharing();
        assert_eq!(
            (s.made, s.reused, s.lent, s.released),
            (2, 2, 1, 1),
            "{s:?}"
        );
        assert_eq!(&a[..], &one[..]);
        drop((a, b));
        // A short encoding is not worth a segment: it goes to the heap, and is never lent.
        let buffers = crate::wire::buffers::Buffers::new(1 << 20);
        let short =
            crate::codec::encode_shared("short", &[7u8; 100][..], Some(&segments), &buffers);
        let short = short.unwrap();
        assert!(segments.lend(&short, 1).is_none());
        let long = vec![7u8; AT_LEAST];
        let long = crate::codec::encode_shared("long", &long, Some(&segments), &buffers).unwrap();
        assert!(segments.lend(&long, 1).is_some());
        assert_eq!(
            crate::codec::decode::<Vec<u8>>("long", &long).unwrap(),
            vec![7u8; AT_LEAST]
        );
    }

    /// What is not a lent copy of this crate is never mapped, and never blocks or crashes
    /// the buddy: a descriptor of no process, a regular file, a FIFO (not even opened), a
    /// memory file that may shrink, a range past its end or over the limit, another lend's
    /// nonce.
    #[test]
    fn what_is_not_a_lent_copy_is_not_mapped() {
        let segments = Segments::new(1 << 30).unwrap();
        let bytes = encode(&segments, &pattern(100_000, 3));
        let at = segments.lend(&bytes, 1).unwrap();
        let never = || -> Box<dyn FnOnce() + Send> { Box::new(|| panic!("released")) };
        let try_map = |at: SharedAt| map(&at, 1 << 20, never());

        let gone = SharedAt {
            pid: u32::MAX,
            ..at
        };
        assert!(
            matches!(try_map(gone), Err(NotShared::Gone { .. })),
            "no such process"
        );
        let gone = SharedAt { fd: 999_999, ..at };
        assert!(
            matches!(try_map(gone), Err(NotShared::Gone { .. })),
            "no such descriptor"
        );

        let dir = std::env::temp_dir().join(format!("malleable-shared-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let file = std::fs::File::create(dir.join("plain")).unwrap();
        file.set_len(1 << 20).unwrap();
        let fifo = dir.join("fifo");
        let path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid path; the result is checked.
        assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
        let fifo = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&fifo)
            .unwrap();
        for fd in [file.as_raw_fd(), fifo.as_raw_fd()] {
            let other = SharedAt {
                fd: fd as u32,
                ..at
            };
            assert!(matches!(
                try_map(other),
                Err(NotShared::NotAMemoryFile { .. })
            ));
        }

        // A memory file of the same name, not sealed.
        // SAFETY: a valid name and flags; checked.
        let fd = unsafe { libc::memfd_create(NAME.as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: just made, owned here.
        let unsealed = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        unsealed.set_len(1 << 20).unwrap();
        let unsealed = SharedAt {
            fd: fd as u32,
            ..at
        };
        assert!(matches!(
            try_map(unsealed),
            Err(NotShared::NotSealed { .. })
        ));

        for bad in [
            SharedAt { len: 1 << 30, ..at },
            SharedAt {
                offset: u64::MAX - 10,
                ..at
            },
            SharedAt { offset: 0, ..at },
        ] {
            assert!(
                matches!(try_map(bad), Err(NotShared::OutOfRange { .. })),
                "{bad:?}"
            );
        }
        assert!(matches!(
            map(&at, 1000, never()),
            Err(NotShared::OutOfRange { max: 1000, .. })
        ));
        let mut nonce = at.nonce;
        nonce[0] ^= 1;
        let other = SharedAt { nonce, ..at };
        assert!(matches!(try_map(other), Err(NotShared::Header { .. })));
        let shifted = SharedAt {
            offset: at.offset + 8,
            len: at.len - 8,
            ..at
        };
        assert!(matches!(try_map(shifted), Err(NotShared::Header { .. })));
        // And the lend itself maps.
        let (released, release) = flag();
        drop(map(&at, 1 << 20, release).unwrap());
        assert!(released.load(Ordering::SeqCst));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A lend whose link ended is forgotten: its release is not taken, its memory never
    /// serves another copy, and the buddy's mapping keeps its bytes. Lends past the limit
    /// are forgotten the same way, oldest first.
    #[test]
    fn forgotten_lends_are_never_written_again() {
        let len = 100_000;
        let cap = (HEADER + len).div_ceil(64 << 10) * (64 << 10);
        let segments = Segments::new(2 * cap).unwrap();
        let one = pattern(len, 4);
        let bytes = encode(&segments, &one);
        let at = segments.lend(&bytes, 7).unwrap();
        let (_, release) = flag();
        let mapped = map(&at, 1 << 20, release).unwrap();
        drop(bytes);
        segments.forget_link(7);
        assert!(!segments.release(7, at.nonce));
        let s = segments.sharing();
        assert_eq!((s.forgotten, s.bytes), (1, 0), "{s:?}");
        let other = encode(&segments, &pattern(len, 5));
        assert_eq!(&mapped[..], &one[..], "written again");
        drop(other);

        // Three lends on a limit of two segments: the oldest is forgotten.
        let lent: Vec<_> = (0..3)
            .map(|k| {
                let b = encode(&segments, &pattern(len, k));
                let at = segments.lend(&b, 8).unwrap();
                (b, at)
            })
            .collect();
        assert_eq!(segments.sharing().forgotten, 2, "{:?}", segments.sharing());
        assert!(!segments.release(8, lent[0].1.nonce));
        assert!(segments.release(8, lent[2].1.nonce));
    }
}
