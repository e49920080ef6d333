//! The executor's side of a job id's lease (the protocol is in `snapshot/lease.rs`): taken
//! before a run starts, renewed by one task per run on the I/O runtime (never on a worker
//! thread), checked by the snapshot writer before each commit (`io.rs`), released when the
//! run ends.
//!
//! 1. `submit`, `resume` and `submit_or_resume` take the lease ([`Executor::take_lease`])
//!    before they read the store or start any work; a lease held by another run is
//!    [`Error::JobIdHeld`].
//! 2. The renewal task renews it every quarter lease. It ends the run with
//!    [`Error::LeaseLost`] if the lease is lost, and releases it once the run's outcome is
//!    ready (it ended and no snapshot write is in flight) or the run is dropped; with
//!    `remove_snapshots_when_finished`, only once the run is dropped, so that the removal in
//!    [`JobHandle::wait`](super::JobHandle::wait) happens while the run still holds the id.
//! 3. [`JobHandle::wait`](super::JobHandle::wait) and awaiting the handle release it before
//!    they return the outcome, so a program that ends right after leaves the job id free.

use std::sync::Arc;
use std::time::Duration;

use super::job_run::Shared;
use super::{Config, Executor};
use crate::error::{Error, Result};
use crate::job::Job;
use crate::snapshot::LeaseLoss;
use crate::snapshot::Store;
use crate::snapshot::lease::{Lease, Renewed};

/// A run's lease, shared by its configuration, its renewal task and its writer.
pub(crate) type RunLease = Arc<Lease>;

/// Whether a plain `submit` takes a lease: when the run may write snapshots to a store,
/// which is when one was given, or a trigger will ask for snapshots (they then go to the
/// default folder). A run with neither writes no snapshot unless asked by hand.
pub(super) fn wanted(config: &Config) -> bool {
    let s = &config.snapshots;
    s.url.is_some()
        || s.every.is_some()
        || s.deadline.is_some()
        || !s.signals.is_empty()
        || s.token.is_some()
}

impl Executor {
    /// Takes the lease of job `J`'s id (this executor's, by default [`Job::NAME`]) in
    /// `store`, on the I/O runtime.
    ///
    /// # Errors
    ///
    /// [`Error::JobIdHeld`] if another run holds it; [`Error::Snapshot`] if the store
    /// cannot be read or written.
    pub(super) fn take_lease<J: Job>(&self, store: &Store) -> Result<RunLease> {
        let job_id = self.config.snapshots.job_id::<J>();
        let length = self.config.lease;
        let taken = super::io::block_on_io(self.io.handle(), {
            let (store, job_id) = (store.clone(), job_id.clone());
            async move { Ok(Lease::take(&store, &job_id, length).await) }
        })?;
        match taken {
            Ok(Ok(lease)) => Ok(Arc::new(lease)),
            Err(e @ crate::snapshot::Error::InvalidJobId { .. }) => Err(e.into()),
            Err(e) => {
                // The store cannot be reached now (one given with `check_store(false)` that
                // comes up later, refused credentials): the run starts, and takes the lease
                // at its first renewal or commit check that reaches the store. No snapshot
                // commits before; they would fail on that store anyway.
                tracing::warn!(
                    job = J::NAME,
                    job_id,
                    store = store.url(),
                    error = &e as &dyn std::error::Error,
                    "the job id's lease cannot be taken now: the job starts, and takes it \
                     before its first snapshot commits"
                );
                Ok(Arc::new(Lease::pending(store, &job_id, length, e)?))
            }
            Ok(Err(held)) => {
                let error = Error::JobIdHeld {
                    job_id,
                    store: store.url().to_owned(),
                    holder: held.holder,
                    expires_in: held.expires_in,
                };
                tracing::warn!(job = J::NAME, "{error}");
                Err(error)
            }
        }
    }
}

impl Executor {
    /// Runs `start` (which starts a run holding `lease`); if it fails, the lease is released
    /// before the error is returned, so that a retry finds the job id free.
    pub(super) fn leased<T>(
        &self,
        lease: Option<RunLease>,
        start: impl FnOnce(Option<RunLease>) -> Result<T>,
    ) -> Result<T> {
        let started = start(lease.clone());
        if let (Err(_), Some(lease)) = (&started, lease) {
            release_now(&self.io, lease);
        }
        started
    }
}

/// Releases `lease` on the I/O runtime and waits until it is released.
fn release_now(io: &super::IoRuntime, lease: RunLease) {
    if lease.gone().is_some() {
        return;
    }
    let job_id = lease.job_id().to_owned();
    let released = super::io::block_on_io(io.handle(), async move {
        lease.release().await;
        Ok(())
    });
    if let Err(e) = released {
        tracing::warn!(
            job_id,
            error = &e as &dyn std::error::Error,
            "the job id's lease was not released: it expires by itself"
        );
    }
}

/// The error a run that lost its lease ends with.
pub(crate) fn lost(lease: &Lease, reason: LeaseLoss) -> Error {
    if let LeaseLoss::Held { holder, expires_in } = reason {
        // Never taken: the run started while the store could not be reached.
        return Error::JobIdHeld {
            job_id: lease.job_id().to_owned(),
            store: lease.url().to_owned(),
            holder,
            expires_in,
        };
    }
    let source = match reason {
        LeaseLoss::Expired => lease.last_error(),
        _ => None,
    };
    Error::LeaseLost {
        job_id: lease.job_id().to_owned(),
        store: lease.url().to_owned(),
        reason,
        source,
    }
}

/// Step 2: starts the renewal task of the run's lease, if it holds one. The task holds the
/// run weakly.
pub(super) fn spawn_renewal<J: Job>(shared: &Arc<Shared<J>>) {
    let Some(lease) = shared.config.run_lease.clone() else {
        return;
    };
    let weak = Arc::downgrade(shared);
    let until_dropped = shared.config.remove_when_finished;
    shared.io.handle().spawn(async move {
        let every = lease.renew_every();
        let retry = every.min(Duration::from_secs(1));
        // How often the run's end is looked for.
        let look = every.min(Duration::from_millis(50));
        let mut next = tokio::time::Instant::now() + every;
        loop {
            let now = tokio::time::Instant::now();
            tokio::time::sleep(look.min(next.saturating_duration_since(now))).await;
            if lease.gone().is_some() {
                // Released by the handle, or lost (and reported by whoever found out).
                return;
            }
            let ended = match weak.upgrade() {
                None => true,
                Some(shared) => !until_dropped && shared.lock().outcome_ready(),
            };
            if ended {
                lease.release().await;
                return;
            }
            if tokio::time::Instant::now() < next {
                continue;
            }
            let started = tokio::time::Instant::now();
            match lease.renew().await {
                Renewed::Yes => next = started + every,
                Renewed::Retry => next = tokio::time::Instant::now() + retry,
                Renewed::Gone => {
                    if let (Some(reason), Some(shared)) = (lease.lost(), weak.upgrade()) {
                        let error = lost(&lease, reason);
                        tracing::warn!(job = J::NAME, "the job ends: {error}");
                        shared.lock().fail(error);
                    }
                    return;
                }
            }
        }
    });
}

/// Step 3, blocking: releases the run's lease (if it holds one) and waits until it is.
pub(super) fn release<J: Job>(shared: &Arc<Shared<J>>) {
    if let Some(lease) = shared.config.run_lease.clone() {
        release_now(&shared.io, lease);
    }
}
