//! The lifecycle every program writes around a job: resume it if it was suspended, else start
//! it; resume from the executor's own store; resume from async code; remove a finished job's
//! snapshots.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::job_run::Shared;
use super::{At, Executor, JobHandle};
use crate::error::{Error, Result};
use crate::job::Job;
use crate::snapshot::Cleanup;

/// Whether [`Executor::submit_or_resume`] may start a job afresh when the store holds no
/// committed snapshot of it; set with [`Builder::resume_policy`](crate::Builder::resume_policy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Resume {
    /// Resume the newest snapshot if there is one, else start the job from its first phase
    /// (the default): for a program that is started and restarted the same way.
    #[default]
    IfAny,
    /// Resume the newest snapshot; with none, fail with [`Error::NothingToResume`] (naming
    /// the store and the job id, and listing the job ids the store holds) instead of
    /// starting afresh: for a program that is being restarted to go on, where a misspelt
    /// store path or job id must not silently start from zero.
    Required,
}

/// What [`Executor::submit_or_resume`] does when the job it is given is not the one the run
/// of the snapshot it resumes was submitted with; set with
/// [`Builder::resubmit_policy`](crate::Builder::resubmit_policy).
///
/// The two are compared as their serialized bytes, against the value the run was first
/// submitted with (which every snapshot of the run records), not the job value the snapshot
/// stores (which [`Job::end_phase`] changes from phase to phase). A snapshot written before
/// snapshots recorded it (format 5 or older) is not checked (logged at info).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Resubmit {
    /// The job decides ([`Job::resumed_with`], called on the stored job value with the
    /// submitted one): it takes the change (the run then counts as submitted with the new
    /// value) or refuses it, and then `submit_or_resume` fails with
    /// [`Error::ResumedJobDiffers`] before anything runs. The default `resumed_with`
    /// refuses every change, so by default a changed job is an error, never silently the
    /// old one.
    #[default]
    AskJob,
    /// Resume the job as the snapshot stored it and ignore the submitted value (logged at
    /// info, with the digests of both): for a program whose job value may change between
    /// runs without changing the computation (a path, a label).
    UseStored,
}

impl Executor {
    /// Resumes `job`'s newest committed snapshot in this executor's store (under its job id,
    /// by default [`Job::NAME`]) if there is one, else submits `job` from its first phase:
    /// the one call a program that may have been suspended makes.
    /// [`JobHandle::resumed`] says which it did, and the log (`tracing`, info) says it too:
    /// the snapshot resumed, or that none was found under the store's URL and job id.
    ///
    /// It starts afresh only when the store holds no committed snapshot of the job at all,
    /// and only under [`Resume::IfAny`] (the default; see
    /// [`Builder::resume_policy`](crate::Builder::resume_policy)); a snapshot that exists
    /// but cannot be restored is an error, never a reason to start over (and later commit
    /// over it).
    ///
    /// When it resumes, `job` is compared with the job value the snapshot's run was
    /// submitted with: a different one (another grid, more steps) is not silently ignored
    /// but handed to [`Job::resumed_with`], which takes or refuses the change (by default it
    /// refuses), unless [`Builder::resubmit_policy`](crate::Builder::resubmit_policy) says
    /// [`Resubmit::UseStored`]. Then the job's shape in this program (the current phase's
    /// iterations and chunks, a grid's height, bands, width and element size) is checked
    /// against the snapshot's, before anything runs.
    ///
    /// # Errors
    ///
    /// [`Error::JobIdHeld`] if another run holds the job id (see
    /// [`Builder::job_lease`](crate::Builder::job_lease); the store is not read then); as
    /// [`Executor::resume`] when a snapshot exists (a damaged one, a store that cannot
    /// be read, a snapshot of another job, [`Error::ShapeChanged`]);
    /// [`Error::ResumedJobDiffers`] when `job` differs from the one the snapshot's run was
    /// submitted with and the job refuses the change; [`Error::NothingToResume`] when no
    /// snapshot exists under [`Resume::Required`]; else as [`Executor::submit`].
    pub fn submit_or_resume<J: Job>(&self, job: J) -> Result<JobHandle<J>> {
        let store = self.config.snapshots.store()?;
        if self.config.resume == Resume::Required {
            // Refused before the lease is taken: nothing is written under a misspelt job id.
            let job_id = self.config.snapshots.job_id::<J>();
            if self.latest(&store, &job_id)?.is_none() {
                return Err(self.nothing_to_resume::<J>(store, job_id));
            }
        }
        // The job id's lease first: the store is read by its holder only.
        let lease = self.take_lease::<J>(&store)?;
        self.leased(Some(lease), |lease| {
            self.submit_or_resume_leased(job, store, lease)
        })
    }

    /// [`Executor::submit_or_resume`] holding the job id's lease in `store`.
    fn submit_or_resume_leased<J: Job>(
        &self,
        job: J,
        store: crate::snapshot::Store,
        lease: Option<super::lease::RunLease>,
    ) -> Result<JobHandle<J>> {
        let job_id = self.config.snapshots.job_id::<J>();
        let url = store.url().to_owned();
        if self.latest(&store, &job_id)?.is_some() {
            let handle = self.resume_with(&url, At::Latest, Some(job), lease)?;
            if let Some(from) = handle.resumed().map(|r| r.from) {
                tracing::info!(
                    job = J::NAME,
                    store = url,
                    snapshot = %from,
                    "the job resumes from snapshot {from} in {url}"
                );
            }
            return Ok(handle);
        }
        let under = format!("{}/{job_id}", url.trim_end_matches('/'));
        if self.config.resume == Resume::Required {
            return Err(self.nothing_to_resume::<J>(store, job_id));
        }
        tracing::info!(
            job = J::NAME,
            store = url,
            job_id,
            "no committed snapshot under {under}: the job starts from its first phase"
        );
        self.submit_leased(job, lease)
    }

    /// The newest committed snapshot of `job_id` in `store`, read on the I/O runtime.
    fn latest(
        &self,
        store: &crate::snapshot::Store,
        job_id: &str,
    ) -> Result<Option<crate::snapshot::SnapshotId>> {
        super::io::block_on_io(self.io.handle(), {
            let (store, job_id) = (store.clone(), job_id.to_owned());
            async move { Ok(store.latest(&job_id).await?) }
        })
    }

    /// [`Error::NothingToResume`] for `job_id` in `store`, with the job ids it holds.
    fn nothing_to_resume<J: Job>(&self, store: crate::snapshot::Store, job_id: String) -> Error {
        let url = store.url().to_owned();
        let under = format!("{}/{job_id}", url.trim_end_matches('/'));
        let listed =
            super::io::block_on_io(self.io.handle(), async move { Ok(store.jobs().await?) });
        // The list only helps the message: without it, the error is the same.
        let others = listed.unwrap_or_else(|e| {
            tracing::debug!(
                error = &e as &dyn std::error::Error,
                "the store's job ids could not be listed"
            );
            Vec::new()
        });
        tracing::debug!(
            job = J::NAME,
            "no committed snapshot under {under}: not starting afresh"
        );
        Error::NothingToResume {
            others: alike(&job_id, others),
            store: url,
            job_id,
        }
    }

    /// Resumes a job from a committed snapshot in this executor's own store (the one given
    /// to [`Builder::snapshots`](crate::Builder::snapshots), or the default folder): as
    /// [`Executor::resume`] without repeating the store's URL.
    ///
    /// # Errors
    ///
    /// As [`Executor::resume`].
    pub fn resume_at<J: Job>(&self, at: At) -> Result<JobHandle<J>> {
        let url = self.config.snapshots.store()?.url().to_owned();
        self.resume(&url, at)
    }

    /// [`Executor::resume_at`] for async code: the snapshot is read without blocking the
    /// caller's runtime.
    ///
    /// # Errors
    ///
    /// As [`Executor::resume`].
    pub async fn resume_at_async<J: Job>(&self, at: At) -> Result<JobHandle<J>> {
        self.off_thread(move |exec| exec.resume_at(at)).await
    }

    /// [`Executor::submit_or_resume`] for async code: the store is read without blocking
    /// the caller's runtime.
    ///
    /// # Errors
    ///
    /// As [`Executor::submit_or_resume`].
    pub async fn submit_or_resume_async<J: Job>(&self, job: J) -> Result<JobHandle<J>> {
        self.off_thread(move |exec| exec.submit_or_resume(job))
            .await
    }

    /// Removes every snapshot of job `J` (under this executor's job id) from this executor's
    /// store: for a job that has finished and will not be resumed. Blocks while it deletes.
    /// It first waits (up to [`Builder::shutdown_timeout`](crate::Builder::shutdown_timeout))
    /// for this executor's snapshot writes in flight, so that none commits a manifest after
    /// its parts were removed. Do not call it while a job of that id runs: its next snapshot
    /// would be incremental over parts that are gone.
    ///
    /// # Errors
    ///
    /// [`Error::Snapshot`] if the store cannot be listed or an object cannot be deleted (what
    /// was deleted stays deleted; calling it again finishes the work).
    pub fn remove_snapshots<J: Job>(&self) -> Result<Cleanup> {
        let store = self.config.snapshots.store()?;
        let job_id = self.config.snapshots.job_id::<J>();
        let timeout = self.config.shutdown_timeout;
        let left = self.io.drain_writes(timeout);
        if left.writes > 0 {
            tracing::warn!(
                job_id,
                writes = left.writes,
                ?timeout,
                "removing snapshots while snapshot writes are still running (a job of this \
                 executor still runs?): one may commit after its parts are removed"
            );
        }
        super::io::block_on_io(self.io.handle(), async move {
            Ok(store.remove_job(&job_id).await?)
        })
    }

    /// Runs the blocking `f` on a thread of its own and awaits it.
    async fn off_thread<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Executor) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let exec = self.clone();
        std::thread::Builder::new()
            .name("malleable-resume".into())
            .spawn(move || {
                let _ = tx.send(f(&exec));
            })
            .map_err(Error::Spawn)?;
        rx.await
            .map_err(|_| Error::Internal("the resume thread ended without an answer".into()))?
    }
}

/// At most 5 of `ids`, other than `id`, the most alike first (fewest edits, then by name).
fn alike(id: &str, mut ids: Vec<String>) -> Vec<String> {
    ids.retain(|other| other != id);
    ids.sort_by_cached_key(|other| (edits(id, other), other.clone()));
    ids.truncate(5);
    ids
}

/// The edit distance between `a` and `b` (insertions, deletions and substitutions of bytes).
fn edits(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, &x) in a.iter().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &y) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(x != y));
            diagonal = above;
        }
    }
    row[b.len()]
}

/// [`Builder::remove_snapshots_when_finished`](crate::Builder::remove_snapshots_when_finished):
/// once the job has finished, waits (up to `timeout`) for a snapshot write still in flight,
/// then removes every snapshot of the job. A failure is logged and counted; the job's value
/// is not touched.
pub(super) fn remove_finished<J: Job>(shared: &Arc<Shared<J>>, timeout: Duration) {
    let job_id = shared.config.snapshots.job_id::<J>();
    let fail = |what: &str, error: &Error| {
        tracing::warn!(
            job = J::NAME,
            job_id,
            error = error as &dyn std::error::Error,
            "{what}"
        );
        metrics::counter!(crate::metrics::SNAPSHOT_REMOVAL_FAILURES, "job" => J::NAME).increment(1);
    };
    let end = Instant::now() + timeout;
    while shared.lock().snap.cut.is_writing() {
        if Instant::now() >= end {
            let e = Error::ShutdownTimedOut {
                connections: 0,
                writes: 1,
                after: timeout,
            };
            return fail("the finished job's snapshots were not removed", &e);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let removed = shared.config.snapshots.store().and_then(|store| {
        let job_id = job_id.clone();
        super::io::block_on_io(shared.io.handle(), async move {
            Ok(store.remove_job(&job_id).await?)
        })
    });
    match removed {
        Ok(c) => tracing::info!(
            job = J::NAME,
            job_id,
            snapshots = c.removed_epochs.len(),
            objects = c.deleted.len(),
            "the finished job's snapshots were removed"
        ),
        Err(e) => fail("the finished job's snapshots could not be removed", &e),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn edit_distances() {
        assert_eq!(super::edits("", ""), 0);
        assert_eq!(super::edits("heat", "heat"), 0);
        assert_eq!(super::edits("heat", "heta"), 2);
        assert_eq!(super::edits("heat", "heat-2"), 2);
        assert_eq!(super::edits("", "abc"), 3);
        assert_eq!(super::edits("kitten", "sitting"), 3);
    }

    #[test]
    fn alike_ids_come_first_without_the_id_itself() {
        let ids = ["zeta", "heat", "heta", "heat-2", "a", "b", "c", "hat"]
            .map(String::from)
            .to_vec();
        assert_eq!(
            super::alike("heat", ids),
            ["hat", "heat-2", "heta", "a", "zeta"]
        );
    }
}
