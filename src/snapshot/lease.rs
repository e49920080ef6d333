//! Job id leases: one run at a time owns a job id in a store.
//!
//! Two runs given the same job id (a Slurm array with one id for every task, a job started
//! twice by hand) would interleave their snapshots in one folder. So a run that may write
//! snapshots first takes the job id's *lease*, keeps it renewed while it runs, and gives it
//! back when it ends; a second run finds it held and is refused before any work.
//!
//! # Keys and records
//!
//! ```text
//! {prefix}/{job_id}/lease/{seq:020}    one lease record (JSON, a few hundred bytes)
//! ```
//!
//! The record with the highest sequence number is *the* lease; lower ones are history,
//! deleted as the chain moves on. A record says who wrote it ([`LeaseHolder`]: host name,
//! process id, a random run id, when the run took the lease by its own clock) and the
//! lease's length. `object_store`'s local file system has no conditional replace
//! (`PutMode::Update`), only a conditional create (`PutMode::Create`, which every backend
//! has: the local file system, memory, S3 with `If-None-Match: *`), so a lease is never
//! updated in place: each renewal or takeover *creates* the next record.
//!
//! # Protocol
//!
//! 1. **Take.** List the records. With none, create the first one, numbered with the
//!    taker's clock in milliseconds since the Unix epoch (so that a new chain numbers above
//!    any earlier one). If there is one, `n`, judge its expiry (below): not expired, the run
//!    is refused with the holder's name and the time left; expired, create `n + 1` (a
//!    takeover, logged). Every create is `PutMode::Create`: if the key exists, another run
//!    got there first, and the taker starts over from a new listing.
//! 2. **Renew.** Every quarter of the lease, on the executor's I/O runtime, the holder of
//!    `n` creates `n + 1` and lists: if the create finds the key taken, or the listing shows
//!    a record above `n + 1` or no longer shows `n`, another run took the lease over (or
//!    released it after a takeover) and this run has lost it. A renewal that fails for the
//!    store's sake is retried every second; once the lease has run out (its length after the
//!    *start* of the last renewal that succeeded, on the holder's monotonic clock) without
//!    one, it is lost too.
//! 3. **Check before each commit.** Before a snapshot's retention and again before its
//!    manifest is created, the holder checks that its lease has not run out and that a
//!    listing shows its record as the newest. A run that lost its lease commits nothing and
//!    ends with [`Error::LeaseLost`](crate::Error::LeaseLost).
//! 4. **Release.** When the run ends (finished, suspended, failed, cancelled) and no
//!    snapshot write is in flight, the holder deletes its records, older ones first. The
//!    job id is free once its newest record is gone. A run that dies without releasing holds
//!    the job id until its lease expires.
//! 5. **Cleanup.** After a take or a renewal, the holder deletes the records below its own.
//!
//! Why one run at a time:
//!
//! - *One successor per record.* Each successor of record `n` (a renewal or a takeover)
//!   is created at `n + 1` with a conditional create, so a renewal and a takeover cannot
//!   both succeed: exactly one of them wins, and the loser learns it.
//! - *A holder's record is deleted only by itself or after it lost.* Others delete only
//!   records below their own (so below a successor of it), or their own. So while the
//!   holder of `n` sees `n` as the newest record, nobody took it over. A holder that lost and
//!   renews anyway (it woke from a freeze) may create `n + 1` where that record was already
//!   deleted, but its listing then shows a newer record, or `n` missing, and it deletes
//!   what it created. A new chain (after a release) starts at the taker's clock in
//!   milliseconds, far above the numbers an old chain reached with a few renewals a minute,
//!   so such a leftover is never above the new holder's record.
//! - *Takeover only after expiry.* See "Clocks".
//!
//! # Clocks
//!
//! Expiry is judged by the taker. Hosts' clocks may disagree, so two observations must
//! agree before a held lease is taken over:
//!
//! - *the store's date*: the newest record's last-modified time (dated by the store) is at
//!   least the lease's length (as the record states it) before the taker's clock; and
//! - *the taker's own watch*: the taker then watches the record for half the lease on its
//!   monotonic clock, and takes over only if no newer record appeared meanwhile.
//!
//! A live holder renews every quarter lease, so the watch sees its renewal even when the
//! taker's clock runs ahead of the store's by more than a lease; a taker whose clock runs
//! behind only waits longer. A holder frozen (stopped, swapped out) for longer than its
//! lease may be taken over; when it wakes, its next renewal or commit check sees the newer
//! record. The *remaining window*: a holder frozen after its check and before its manifest's
//! create, for longer than its lease, may commit that one snapshot after the takeover (in
//! an epoch of its own: commits never replace one another). Nothing in `object_store`
//! ties a create to the lease's state on every backend, so this window cannot be closed
//! without a conditional replace; it is as wide as the time between a check and a create,
//! milliseconds unless the process is frozen right there.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::{ObjectMeta, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};

use super::error::{Error, Result};
use super::store::{Store, check_job_id};

/// The default length of a job id's lease: 30 seconds.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// The shortest lease a run may take: 100 ms (for tests; a lease that short is renewed
/// ten times a second).
pub const MIN_LEASE: Duration = Duration::from_millis(100);

/// The format of a lease record; a record of another format names no holder.
const RECORD_FORMAT: u32 = 1;

/// How many listings a take goes through before it gives up on a job id that keeps
/// changing hands (each one a race lost to another taker).
const TAKE_ROUNDS: u32 = 16;

/// The run that holds (or last held) a job id's lease, as its lease record names it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseHolder {
    /// The host name of the process that holds it.
    pub host: String,
    /// Its process id.
    pub pid: u32,
    /// A random id of the run (two runs of one process have different ones).
    pub run: String,
    /// When the run took the lease, by the holder's clock.
    pub since: SystemTime,
}

impl fmt::Display for LeaseHolder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "process {} on host {} (run {}), which took it at {} by its clock",
            self.pid,
            self.host,
            self.run,
            utc(self.since)
        )
    }
}

/// How a run lost its lease (see [`Error::LeaseLost`](crate::Error::LeaseLost)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseLoss {
    /// Another run took the lease over (it judged it expired: this run did not renew it in
    /// time, frozen or cut off from the store), or the record chain moved on without it.
    /// The new holder, when its record can be read.
    TakenOver(Option<Box<LeaseHolder>>),
    /// The lease ran out before a renewal succeeded (the store did not answer, or refused).
    Expired,
    /// The lease was already given back (the run had ended).
    Released,
    /// Never taken: the run started while the store could not be reached, and when it could,
    /// another run held the job id (the run ends with
    /// [`Error::JobIdHeld`](crate::Error::JobIdHeld)).
    Held {
        /// The run that holds it, when its record can be read.
        holder: Option<Box<LeaseHolder>>,
        /// How long until its lease expires unless renewed, as this run judged it.
        expires_in: Duration,
    },
}

impl fmt::Display for LeaseLoss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LeaseLoss::TakenOver(Some(h)) => write!(f, "another run took it over: {h}"),
            LeaseLoss::TakenOver(None) => {
                f.write_str("another run took it over (its lease record cannot be read)")
            }
            LeaseLoss::Expired => f.write_str("it ran out before it could be renewed"),
            LeaseLoss::Released => f.write_str("it was already released"),
            LeaseLoss::Held {
                holder: Some(h), ..
            } => write!(f, "another run holds it: {h}"),
            LeaseLoss::Held { holder: None, .. } => {
                f.write_str("another run holds it (its lease record cannot be read)")
            }
        }
    }
}

/// One lease record, as stored (JSON).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
struct Record {
    /// [`RECORD_FORMAT`].
    format: u32,
    host: String,
    pid: u32,
    run: String,
    /// When the run took the lease (its clock, ms since the Unix epoch).
    taken_unix_ms: u64,
    /// When this record was written (its clock), for people reading the store.
    written_unix_ms: u64,
    /// The lease's length: how long after this record a taker must wait (milliseconds).
    lease_ms: u64,
}

impl Record {
    fn decode(bytes: &[u8]) -> Option<Record> {
        serde_json::from_slice::<Record>(bytes)
            .ok()
            .filter(|r| r.format == RECORD_FORMAT)
    }

    fn holder(&self) -> Box<LeaseHolder> {
        Box::new(LeaseHolder {
            host: self.host.clone(),
            pid: self.pid,
            run: self.run.clone(),
            since: UNIX_EPOCH + Duration::from_millis(self.taken_unix_ms),
        })
    }
}

/// The newest lease record of a job id.
struct Newest {
    seq: u64,
    meta: ObjectMeta,
    /// `None` when it cannot be read or decoded (a holder nobody can name).
    record: Option<Record>,
}

/// A lease that another run holds: why a take was refused.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    /// The holder, when its record can be read.
    pub(crate) holder: Option<Box<LeaseHolder>>,
    /// How long until it expires unless renewed, as the taker judges it.
    pub(crate) expires_in: Duration,
}

/// The state of a lease this run took.
#[derive(Debug)]
struct State {
    /// The sequence number of this run's newest record (none while `pending`).
    seq: u64,
    /// Not taken yet (the store could not be reached when the run started).
    pending: bool,
    /// When the lease runs out unless renewed (this process's monotonic clock).
    valid_until: Instant,
    /// Why it is no longer held, once it is not.
    gone: Option<LeaseLoss>,
}

/// What a renewal did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Renewed {
    /// Renewed: the lease is good for another lease length.
    Yes,
    /// The store failed; try again soon (the lease still holds until it runs out).
    Retry,
    /// Lost, or released: no more renewals.
    Gone,
}

/// A job id's lease held by this run: taken with [`Lease::take`], renewed, checked before
/// each commit and released (see the [module docs](self)).
pub(crate) struct Lease {
    store: Store,
    job_id: String,
    length: Duration,
    me: Record,
    /// Serialises renewals, checks and the release (each a few store requests).
    state: tokio::sync::Mutex<State>,
    /// Why the lease was lost or released, readable without waiting for `state`.
    gone: Mutex<Option<LeaseLoss>>,
    /// The last store error of a renewal, for the loss's report.
    last_error: Mutex<Option<Arc<Error>>>,
    /// The runtime it was taken on, where a lease dropped while held is released.
    rt: Option<tokio::runtime::Handle>,
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("store", &self.store.url())
            .field("job_id", &self.job_id)
            .field("length", &self.length)
            .finish_non_exhaustive()
    }
}

impl Lease {
    /// Takes the lease of `job_id` in `store` for `length` (at least [`MIN_LEASE`]), or says
    /// who holds it. Waits half the holder's lease when the newest record looks expired,
    /// to see that nobody renews it (see "Clocks" in the [module docs](self)).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidJobId`], or the store's failure.
    pub(crate) async fn take(
        store: &Store,
        job_id: &str,
        length: Duration,
    ) -> Result<std::result::Result<Lease, Held>> {
        let lease = Lease::new(store, job_id, length)?;
        let taken = {
            let mut st = lease.state.lock().await;
            lease.acquire(&mut st).await?
        };
        Ok(match taken {
            None => Ok(lease),
            Some(held) => {
                // Never taken: nothing to release.
                lease.set_gone_quietly(LeaseLoss::Released);
                Err(held)
            }
        })
    }

    /// A lease of `job_id` in `store` not taken yet: for a run that starts while the store
    /// cannot be reached. It is taken at its first renewal or commit check that reaches the
    /// store ([`Lease::renew`], [`Lease::check`]); until then no snapshot commits.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidJobId`].
    pub(crate) fn pending(
        store: &Store,
        job_id: &str,
        length: Duration,
        why: Error,
    ) -> Result<Lease> {
        let lease = Lease::new(store, job_id, length)?;
        *lease.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(why));
        Ok(lease)
    }

    fn new(store: &Store, job_id: &str, length: Duration) -> Result<Lease> {
        check_job_id(job_id)?;
        let length = length.max(MIN_LEASE);
        let now = unix_ms(SystemTime::now());
        let me = Record {
            format: RECORD_FORMAT,
            host: host_name(),
            pid: std::process::id(),
            run: format!("{:016x}", super::store::random_u64()),
            taken_unix_ms: now,
            written_unix_ms: now,
            lease_ms: u64::try_from(length.as_millis()).unwrap_or(u64::MAX),
        };
        Ok(Lease {
            store: store.clone(),
            job_id: job_id.to_owned(),
            length,
            me,
            state: tokio::sync::Mutex::new(State {
                seq: 0,
                pending: true,
                valid_until: Instant::now(),
                gone: None,
            }),
            gone: Mutex::new(None),
            last_error: Mutex::new(None),
            rt: tokio::runtime::Handle::try_current().ok(),
        })
    }

    /// Step 1 for a lease not taken yet: `Ok(None)` once taken (the state says which
    /// record), `Ok(Some(held))` if another run holds it.
    async fn acquire(&self, st: &mut State) -> Result<Option<Held>> {
        let (store, job_id, length) = (&self.store, self.job_id.as_str(), self.length);
        let now = unix_ms(SystemTime::now());
        let mut me = self.me.clone();
        me.written_unix_ms = now;
        // The record being watched, and since when (the taker's monotonic clock).
        let mut watched: Option<(u64, Instant)> = None;
        let mut last_held = None;
        for _ in 0..TAKE_ROUNDS {
            let newest = newest(store, job_id).await?;
            let seq = match &newest {
                None => now.max(1),
                Some(n) => {
                    let holder_length = n
                        .record
                        .as_ref()
                        .map_or(length, |r| Duration::from_millis(r.lease_ms));
                    let dated: SystemTime = n.meta.last_modified.into();
                    let age = SystemTime::now()
                        .duration_since(dated)
                        .unwrap_or(Duration::ZERO);
                    let holder = n.record.as_ref().map(Record::holder);
                    if age < holder_length {
                        return Ok(Some(Held {
                            holder,
                            expires_in: holder_length - age,
                        }));
                    }
                    let watch = holder_length / 2;
                    match watched {
                        Some((s, since)) if s == n.seq && since.elapsed() >= watch => {
                            tracing::warn!(
                                job_id,
                                store = store.url(),
                                holder = %holder.as_ref().map_or_else(|| "an unknown run".to_owned(), |h| h.to_string()),
                                "the lease of the job id expired (not renewed for {age:?}): taking it over"
                            );
                            n.seq + 1
                        }
                        _ => {
                            if watched.is_none_or(|(s, _)| s != n.seq) {
                                watched = Some((n.seq, Instant::now()));
                                tracing::info!(
                                    job_id,
                                    store = store.url(),
                                    "the lease of the job id looks expired (not renewed for \
                                     {age:?}): watching it for {watch:?} before taking it over"
                                );
                            }
                            let since = watched.map_or_else(Instant::now, |(_, t)| t);
                            tokio::time::sleep(watch.saturating_sub(since.elapsed())).await;
                            last_held = Some(Held {
                                holder,
                                expires_in: Duration::ZERO,
                            });
                            continue;
                        }
                    }
                }
            };
            let sent = Instant::now();
            if create(store, job_id, seq, &me).await? {
                st.seq = seq;
                st.pending = false;
                st.valid_until = sent + length;
                self.delete_below(seq).await;
                tracing::debug!(
                    job_id,
                    seq,
                    store = store.url(),
                    "the job id's lease is taken"
                );
                return Ok(None);
            }
            // Another run created that record first: look again.
        }
        // The job id kept changing hands: someone else has it.
        let newest = newest(store, job_id).await?;
        Ok(Some(Held {
            holder: newest
                .and_then(|n| n.record)
                .map(|r| r.holder())
                .or_else(|| last_held.and_then(|h| h.holder)),
            expires_in: length,
        }))
    }

    /// How often the holder renews: a quarter of the lease.
    pub(crate) fn renew_every(&self) -> Duration {
        self.length / 4
    }

    /// The job id.
    pub(crate) fn job_id(&self) -> &str {
        &self.job_id
    }

    /// The store's URL.
    pub(crate) fn url(&self) -> &str {
        self.store.url()
    }

    /// This run, as its records name it.
    #[cfg(test)]
    fn holder(&self) -> Box<LeaseHolder> {
        self.me.holder()
    }

    /// Why the lease is no longer held (lost or released), if it is not.
    pub(crate) fn gone(&self) -> Option<LeaseLoss> {
        self.gone.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether it was lost (not released).
    pub(crate) fn lost(&self) -> Option<LeaseLoss> {
        self.gone().filter(|g| *g != LeaseLoss::Released)
    }

    /// The last store error of a renewal, if any.
    pub(crate) fn last_error(&self) -> Option<Arc<Error>> {
        self.last_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Step 2: creates the next record and checks that it is the newest.
    pub(crate) async fn renew(&self) -> Renewed {
        let mut st = self.state.lock().await;
        if st.gone.is_some() {
            return Renewed::Gone;
        }
        if st.pending {
            return match self.acquire(&mut st).await {
                Ok(None) => Renewed::Yes,
                Ok(Some(held)) => {
                    self.set_gone(
                        &mut st,
                        LeaseLoss::Held {
                            holder: held.holder,
                            expires_in: held.expires_in,
                        },
                    );
                    Renewed::Gone
                }
                Err(e) => self.store_failed(e),
            };
        }
        if Instant::now() >= st.valid_until {
            let loss = self.ran_out(&st).await;
            self.set_gone(&mut st, loss);
            return Renewed::Gone;
        }
        let next = st.seq + 1;
        let mut record = self.me.clone();
        record.written_unix_ms = unix_ms(SystemTime::now());
        let sent = Instant::now();
        let created = match create(&self.store, &self.job_id, next, &record).await {
            Ok(created) => created,
            Err(e) => return self.store_failed(e),
        };
        if !created {
            let by = self.newest_holder().await;
            self.set_gone(&mut st, LeaseLoss::TakenOver(by));
            return Renewed::Gone;
        }
        let listed = match list(&self.store, &self.job_id).await {
            Ok(listed) => listed,
            Err(e) => {
                // Our record is there; whether it is the newest is checked next time.
                st.seq = next;
                return self.store_failed(e);
            }
        };
        let newest = listed.last().map(|(s, _)| *s);
        let previous = listed.iter().any(|(s, _)| *s == st.seq);
        if newest != Some(next) || !previous {
            // The chain had moved on (a record above ours), or our previous record was
            // deleted by a successor: ours reused a number, and is not the lease.
            self.delete(next).await;
            let by = self.newest_holder().await;
            self.set_gone(&mut st, LeaseLoss::TakenOver(by));
            return Renewed::Gone;
        }
        st.seq = next;
        st.valid_until = sent + self.length;
        drop(st);
        self.delete_below(next).await;
        Renewed::Yes
    }

    /// Step 3: whether this run still holds the lease, by its clock and by a listing of the
    /// store. `Ok(Some(loss))` when it does not (the loss is recorded).
    ///
    /// # Errors
    ///
    /// The store's failure to list or read (the lease is not lost for that).
    pub(crate) async fn check(&self) -> Result<Option<LeaseLoss>> {
        let mut st = self.state.lock().await;
        if let Some(g) = &st.gone {
            return Ok(Some(g.clone()));
        }
        if st.pending {
            // Taken now, or the store's error fails this commit as it would have anyway.
            return match self.acquire(&mut st).await? {
                None => Ok(None),
                Some(held) => {
                    let loss = LeaseLoss::Held {
                        holder: held.holder,
                        expires_in: held.expires_in,
                    };
                    self.set_gone(&mut st, loss.clone());
                    Ok(Some(loss))
                }
            };
        }
        if Instant::now() >= st.valid_until {
            let loss = self.ran_out(&st).await;
            self.set_gone(&mut st, loss.clone());
            return Ok(Some(loss));
        }
        let newest = newest(&self.store, &self.job_id).await?;
        match newest {
            Some(n) if n.seq == st.seq => Ok(None),
            n => {
                let loss = LeaseLoss::TakenOver(n.and_then(|n| n.record).map(|r| r.holder()));
                self.set_gone(&mut st, loss.clone());
                Ok(Some(loss))
            }
        }
    }

    /// Step 4: gives the lease back (once; later calls do nothing): deletes this run's
    /// records, the newest last. A failure is logged: the lease then expires by itself.
    pub(crate) async fn release(&self) {
        let mut st = self.state.lock().await;
        if st.gone.is_some() {
            return;
        }
        if st.pending {
            self.set_gone(&mut st, LeaseLoss::Released);
            return;
        }
        self.delete_below(st.seq).await;
        let key = record_key(&self.job_id, st.seq);
        let deleted = match self.store.path(&key) {
            Ok(path) => match self.store.backend().delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(Error::store("delete", &key, e)),
            },
            Err(e) => Err(e),
        };
        // Marked released once done: whoever saw it not released yet and called this waited
        // for the gate, so it returns only when the records are gone.
        self.set_gone(&mut st, LeaseLoss::Released);
        match deleted {
            Ok(()) => tracing::debug!(job_id = self.job_id, "the job id's lease is released"),
            Err(e) => tracing::warn!(
                job_id = self.job_id,
                store = self.store.url(),
                error = &e as &dyn std::error::Error,
                "the job id's lease could not be released: it expires in {:?}",
                self.length
            ),
        }
    }

    /// Whether the lease is still held and not yet released (for a release on drop).
    fn needs_release(&self) -> bool {
        self.gone().is_none()
    }

    /// Marks a lease that was never taken as gone (nothing to release, nothing to log).
    fn set_gone_quietly(&self, loss: LeaseLoss) {
        *self.gone.lock().unwrap_or_else(|p| p.into_inner()) = Some(loss);
    }

    fn set_gone(&self, st: &mut State, loss: LeaseLoss) {
        if loss != LeaseLoss::Released {
            tracing::warn!(
                job_id = self.job_id,
                store = self.store.url(),
                "this run lost the job id's lease: {loss}"
            );
        }
        st.gone = Some(loss.clone());
        *self.gone.lock().unwrap_or_else(|p| p.into_inner()) = Some(loss);
    }

    fn store_failed(&self, e: Error) -> Renewed {
        tracing::warn!(
            job_id = self.job_id,
            store = self.store.url(),
            error = &e as &dyn std::error::Error,
            "the job id's lease could not be renewed; trying again"
        );
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(e));
        Renewed::Retry
    }

    /// Why a lease that ran out is lost: taken over if a newer record is there (naming its
    /// holder), else expired (also when the store cannot be read).
    async fn ran_out(&self, st: &State) -> LeaseLoss {
        match newest(&self.store, &self.job_id).await {
            Ok(Some(n)) if n.seq > st.seq => LeaseLoss::TakenOver(n.record.map(|r| r.holder())),
            _ => LeaseLoss::Expired,
        }
    }

    /// The holder named by the newest record (for a loss's report), if it can be read.
    async fn newest_holder(&self) -> Option<Box<LeaseHolder>> {
        newest(&self.store, &self.job_id)
            .await
            .ok()
            .flatten()
            .and_then(|n| n.record)
            .map(|r| r.holder())
    }

    /// Step 5: deletes the records below `seq` (best effort: a leftover is deleted later).
    async fn delete_below(&self, seq: u64) {
        let listed = match list(&self.store, &self.job_id).await {
            Ok(l) => l,
            Err(e) => {
                tracing::debug!(
                    error = &e as &dyn std::error::Error,
                    "old lease records not listed"
                );
                return;
            }
        };
        for (s, _) in listed.into_iter().filter(|(s, _)| *s < seq) {
            self.delete(s).await;
        }
    }

    async fn delete(&self, seq: u64) {
        let key = record_key(&self.job_id, seq);
        let Ok(path) = self.store.path(&key) else {
            return;
        };
        match self.store.backend().delete(&path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => tracing::debug!(
                key,
                error = &e as &dyn std::error::Error,
                "an old lease record was not deleted"
            ),
        }
    }
}

impl Drop for Lease {
    /// A lease dropped still held (its run never started, or was dropped unwaited) is
    /// released in the background on the runtime it was taken on; if that runtime is gone,
    /// it expires by itself.
    fn drop(&mut self) {
        if !self.needs_release() {
            return;
        }
        let Some(rt) = self.rt.take() else {
            return;
        };
        let lease = Lease {
            store: self.store.clone(),
            job_id: self.job_id.clone(),
            length: self.length,
            me: self.me.clone(),
            state: tokio::sync::Mutex::new(State {
                seq: self.state.get_mut().seq,
                pending: self.state.get_mut().pending,
                valid_until: self.state.get_mut().valid_until,
                gone: None,
            }),
            gone: Mutex::new(None),
            last_error: Mutex::new(None),
            rt: None,
        };
        *self.gone.lock().unwrap_or_else(|p| p.into_inner()) = Some(LeaseLoss::Released);
        rt.spawn(async move { lease.release().await });
    }
}

/// The key of record `seq` of `job_id`, relative to the prefix.
fn record_key(job_id: &str, seq: u64) -> String {
    format!("{job_id}/lease/{seq:020}")
}

/// The lease records of `job_id`, by ascending sequence number.
async fn list(store: &Store, job_id: &str) -> Result<Vec<(u64, ObjectMeta)>> {
    let folder = format!("{job_id}/lease");
    let path = store.path(&folder)?;
    let objects: Vec<ObjectMeta> = store
        .backend()
        .list(Some(&path))
        .try_collect()
        .await
        .map_err(|e| Error::store("list", &folder, e))?;
    let mut records: Vec<(u64, ObjectMeta)> = objects
        .into_iter()
        .filter_map(|meta| {
            let name = meta.location.filename()?;
            let seq = (name.len() == 20 && name.bytes().all(|b| b.is_ascii_digit()))
                .then(|| name.parse().ok())??;
            Some((seq, meta))
        })
        .collect();
    records.sort_by_key(|(s, _)| *s);
    Ok(records)
}

/// The newest record of `job_id`, read.
async fn newest(store: &Store, job_id: &str) -> Result<Option<Newest>> {
    let Some((seq, meta)) = list(store, job_id).await?.pop() else {
        return Ok(None);
    };
    let key = record_key(job_id, seq);
    let read = async {
        let got = store.backend().get(&meta.location).await?;
        got.bytes().await
    }
    .await;
    let record = match read {
        Ok(bytes) => {
            let r = Record::decode(&bytes);
            if r.is_none() {
                tracing::warn!(key, "a lease record does not decode: its holder is unknown");
            }
            r
        }
        // Deleted since the listing: the chain moved on (the caller looks again later).
        Err(object_store::Error::NotFound { .. }) => None,
        Err(e) => return Err(Error::store("get", &key, e)),
    };
    Ok(Some(Newest { seq, meta, record }))
}

/// Creates record `seq` of `job_id` if no object is there: `Ok(false)` if one is.
async fn create(store: &Store, job_id: &str, seq: u64, record: &Record) -> Result<bool> {
    let key = record_key(job_id, seq);
    let path = store.path(&key)?;
    let body = serde_json::to_vec(record)
        .map_err(|e| Error::Inconsistent(format!("a lease record does not encode: {e}")))?;
    let opts = PutOptions::from(PutMode::Create);
    match store
        .backend()
        .put_opts(&path, PutPayload::from(Bytes::from(body)), opts)
        .await
    {
        Ok(_) => Ok(true),
        Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
        Err(e) => Err(Error::store("put", &key, e)),
    }
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// This host's name (`?` if it has none): a lease's holder, a worker process's node.
pub(crate) fn host_name() -> String {
    #[cfg(unix)]
    {
        let mut buf = [0u8; 256];
        // SAFETY: `gethostname` writes at most `buf.len()` bytes into `buf`, a valid writable
        // array that outlives the call.
        let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
        if rc == 0 {
            let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
            let name = String::from_utf8_lossy(&buf[..end]).into_owned();
            if !name.is_empty() {
                return name;
            }
        }
    }
    std::env::var("HOSTNAME")
        .or_else(|_| std::env::var("COMPUTERNAME"))
        .unwrap_or_else(|_| "?".to_owned())
}

/// `t` as `YYYY-MM-DD HH:MM:SS UTC`.
fn utc(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_print_in_utc() {
        assert_eq!(utc(UNIX_EPOCH), "1970-01-01 00:00:00 UTC");
        let t = UNIX_EPOCH + Duration::from_secs(1_798_761_599);
        assert_eq!(utc(t), "2026-12-31 23:59:59 UTC");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(utc(leap), "2000-02-29 00:00:00 UTC");
    }

    #[test]
    fn records_round_trip_and_garbage_names_no_holder() {
        let r = Record {
            format: RECORD_FORMAT,
            host: "node17".into(),
            pid: 42,
            run: "00ff".into(),
            taken_unix_ms: 1_000,
            written_unix_ms: 2_000,
            lease_ms: 30_000,
        };
        let bytes = serde_json::to_vec(&r).unwrap();
        assert_eq!(Record::decode(&bytes), Some(r.clone()));
        assert_eq!(Record::decode(b"\xff\x00garbage"), None);
        let other = Record { format: 2, ..r };
        assert_eq!(Record::decode(&serde_json::to_vec(&other).unwrap()), None);
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn a_held_lease_refuses_a_second_taker_until_released() {
        rt().block_on(async {
            let store = Store::open("memory://").unwrap();
            let a = Lease::take(&store, "job", Duration::from_secs(30))
                .await
                .unwrap()
                .unwrap();
            let held = Lease::take(&store, "job", Duration::from_secs(30))
                .await
                .unwrap()
                .unwrap_err();
            assert_eq!(held.holder, Some(a.holder()));
            assert!(held.expires_in > Duration::from_secs(25), "{held:?}");
            assert_eq!(a.renew().await, Renewed::Yes);
            assert_eq!(a.check().await.unwrap(), None);
            a.release().await;
            let b = Lease::take(&store, "job", Duration::from_secs(30))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(a.check().await.unwrap(), Some(LeaseLoss::Released));
            assert_eq!(b.check().await.unwrap(), None);
            // Only the newest record is left; none once it is released.
            assert_eq!(list(&store, "job").await.unwrap().len(), 1);
            b.release().await;
            assert_eq!(list(&store, "job").await.unwrap().len(), 0);
        });
    }

    #[test]
    fn an_expired_lease_is_taken_over_after_a_watch_and_its_holder_learns_it() {
        rt().block_on(async {
            let store = Store::open("memory://").unwrap();
            let length = Duration::from_millis(300);
            let a = Lease::take(&store, "job", length).await.unwrap().unwrap();
            tokio::time::sleep(length).await;
            let t = Instant::now();
            let b = Lease::take(&store, "job", length).await.unwrap().unwrap();
            assert!(t.elapsed() >= length / 2, "watched before the takeover");
            assert_eq!(a.renew().await, Renewed::Gone);
            assert_eq!(a.lost(), Some(LeaseLoss::TakenOver(Some(b.holder()))));
            assert_eq!(b.check().await.unwrap(), None);
            // Ran out with nobody after it: expired.
            let c = Lease::take(&store, "alone", length).await.unwrap().unwrap();
            tokio::time::sleep(length).await;
            assert_eq!(c.check().await.unwrap(), Some(LeaseLoss::Expired));
        });
    }

    #[test]
    fn a_renewal_racing_a_takeover_loses_to_it() {
        rt().block_on(async {
            let store = Store::open("memory://").unwrap();
            let a = Lease::take(&store, "job", Duration::from_secs(30))
                .await
                .unwrap()
                .unwrap();
            // Another run created the successor of a's record first.
            let mut other = a.me.clone();
            other.run = "other".into();
            other.pid = 7;
            let n = a.state.lock().await.seq;
            assert!(create(&store, "job", n + 1, &other).await.unwrap());
            assert_eq!(a.renew().await, Renewed::Gone);
            match a.lost() {
                Some(LeaseLoss::TakenOver(Some(h))) => assert_eq!(h.run, "other"),
                other => panic!("{other:?}"),
            }
            // A number reused below the newest: the renewal sees the higher record.
            let b = Lease::take(&store, "job2", Duration::from_secs(30))
                .await
                .unwrap()
                .unwrap();
            let n = b.state.lock().await.seq;
            assert!(create(&store, "job2", n + 5, &other).await.unwrap());
            assert_eq!(b.renew().await, Renewed::Gone);
            assert!(matches!(b.lost(), Some(LeaseLoss::TakenOver(Some(_)))));
            // Its stray record is gone again.
            let left: Vec<u64> = list(&store, "job2")
                .await
                .unwrap()
                .iter()
                .map(|r| r.0)
                .collect();
            assert_eq!(left, [n, n + 5]);
            // Its record deleted under it (released by a run that took it over): lost too.
            let c = Lease::take(&store, "job3", Duration::from_secs(30))
                .await
                .unwrap()
                .unwrap();
            let n = c.state.lock().await.seq;
            c.delete(n).await;
            assert_eq!(c.renew().await, Renewed::Gone);
            assert!(list(&store, "job3").await.unwrap().is_empty());
            assert_eq!(b.check().await.unwrap(), b.lost());
        });
    }
}
