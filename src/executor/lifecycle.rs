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

impl Executor {
    /// Resumes `job`'s newest committed snapshot in this executor's store (under its job id,
    /// by default [`Job::NAME`]) if there is one, else submits `job` from its first phase:
    /// the one call a program that may have been suspended makes.
    /// [`JobHandle::resumed`] says which it did.
    ///
    /// It starts afresh only when the store holds no committed snapshot of the job at all;
    /// a snapshot that exists but cannot be restored is an error, never a reason to start
    /// over (and later commit over it).
    ///
    /// # Errors
    ///
    /// As [`Executor::resume`] when a snapshot exists (a damaged one, a store that cannot
    /// be read, a snapshot of another job), else as [`Executor::submit`].
    pub fn submit_or_resume<J: Job>(&self, job: J) -> Result<JobHandle<J>> {
        let store = self.config.snapshots.store()?;
        let job_id = self.config.snapshots.job_id::<J>();
        let latest = super::io::block_on_io(self.io.handle(), {
            let store = store.clone();
            async move { Ok(store.latest(&job_id).await?) }
        })?;
        match latest {
            None => {
                tracing::info!(
                    job = J::NAME,
                    store = store.url(),
                    "no snapshot: the job starts from its first phase"
                );
                self.submit(job)
            }
            Some(id) => {
                tracing::info!(job = J::NAME, snapshot = %id, "the job resumes from its newest snapshot");
                self.resume_at(At::Latest)
            }
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
    /// Do not call it while a job of that id runs: its next snapshot would be incremental
    /// over parts that are gone.
    ///
    /// # Errors
    ///
    /// [`Error::Snapshot`] if the store cannot be listed or an object cannot be deleted (what
    /// was deleted stays deleted; calling it again finishes the work).
    pub fn remove_snapshots<J: Job>(&self) -> Result<Cleanup> {
        let store = self.config.snapshots.store()?;
        let job_id = self.config.snapshots.job_id::<J>();
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
