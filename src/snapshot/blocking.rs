//! A snapshot store for code that is not async: [`BlockingStore`].

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use super::error::{Error, Result};
use super::format::Manifest;
use super::store::{Cleanup, SnapshotId, SnapshotInfo, Store};

/// [`Store`] with blocking methods, usable from any thread, inside an async runtime or not.
///
/// [`Store`]'s methods are futures, and an `s3://` store's must run inside a tokio runtime
/// (its HTTP client needs one). This wrapper owns a small runtime (one thread) and runs each
/// call there, blocking the caller until it is done: a program that only wants to list,
/// inspect or clean up snapshots needs no runtime of its own. Clones share the runtime.
///
/// ```
/// # fn main() -> Result<(), malleable::snapshot::Error> {
/// # let dir = std::env::temp_dir().join(format!("malleable-doc-blocking-{}", std::process::id()));
/// let store = malleable::snapshot::BlockingStore::open(&format!("file://{}", dir.display()))?;
/// assert_eq!(store.latest("my-job")?, None);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct BlockingStore {
    store: Store,
    rt: Arc<Runtime>,
}

/// The runtime, shut down in the background when the last clone goes: dropping a runtime
/// the ordinary way inside an async context would panic.
struct Runtime(Option<tokio::runtime::Runtime>);

impl Drop for Runtime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

impl fmt::Debug for BlockingStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockingStore")
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

/// Runs `fut` on the runtime of `handle` and blocks the calling thread until it is done,
/// without entering a runtime, so this works from any thread, inside an async context too.
/// `None` if the runtime dropped the task (it was shutting down).
pub(crate) fn block_on<T: Send + 'static>(
    handle: &tokio::runtime::Handle,
    fut: impl Future<Output = T> + Send + 'static,
) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    handle.spawn(async move {
        let _ = tx.send(fut.await);
    });
    rx.recv().ok()
}

impl BlockingStore {
    /// Opens the store at `url`; see [`Store::open`].
    ///
    /// # Errors
    ///
    /// As [`Store::open`], and [`Error::Io`] if the runtime's thread cannot be started.
    pub fn open(url: &str) -> Result<BlockingStore> {
        BlockingStore::new(Store::open(url)?)
    }

    /// Opens the store at `url` with backend options; see [`Store::open_with`].
    ///
    /// # Errors
    ///
    /// As [`Store::open_with`], and [`Error::Io`] if the runtime's thread cannot be started.
    pub fn open_with(
        url: &str,
        options: impl IntoIterator<Item = (String, String)>,
    ) -> Result<BlockingStore> {
        BlockingStore::new(Store::open_with(url, options)?)
    }

    /// Wraps an opened store.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] if the runtime's thread cannot be started.
    pub fn new(store: Store) -> Result<BlockingStore> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("malleable-store")
            .enable_all()
            .build()
            .map_err(|source| Error::Io {
                what: "cannot start the blocking store's runtime".into(),
                source,
            })?;
        Ok(BlockingStore {
            store,
            rt: Arc::new(Runtime(Some(rt))),
        })
    }

    /// The async store underneath.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The store's URL.
    pub fn url(&self) -> &str {
        self.store.url()
    }

    /// Runs `fut` on the runtime and waits for it.
    fn run<T: Send + 'static>(
        &self,
        fut: impl Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        let rt = self.rt.0.as_ref().expect("taken only on drop");
        block_on(rt.handle(), fut).unwrap_or_else(|| {
            Err(Error::Inconsistent(
                "the blocking store's runtime dropped a call".into(),
            ))
        })
    }

    /// See [`Store::jobs`].
    ///
    /// # Errors
    ///
    /// As [`Store::jobs`].
    pub fn jobs(&self) -> Result<Vec<String>> {
        let s = self.store.clone();
        self.run(async move { s.jobs().await })
    }

    /// See [`Store::snapshots`].
    ///
    /// # Errors
    ///
    /// As [`Store::snapshots`].
    pub fn snapshots(&self, job_id: &str) -> Result<Vec<SnapshotInfo>> {
        let (s, j) = (self.store.clone(), job_id.to_owned());
        self.run(async move { s.snapshots(&j).await })
    }

    /// See [`Store::latest`].
    ///
    /// # Errors
    ///
    /// As [`Store::latest`].
    pub fn latest(&self, job_id: &str) -> Result<Option<SnapshotId>> {
        let (s, j) = (self.store.clone(), job_id.to_owned());
        self.run(async move { s.latest(&j).await })
    }

    /// See [`Store::manifest`].
    ///
    /// # Errors
    ///
    /// As [`Store::manifest`].
    pub fn manifest(&self, id: &SnapshotId) -> Result<Manifest> {
        let (s, id) = (self.store.clone(), id.clone());
        self.run(async move { s.manifest(&id).await })
    }

    /// See [`Store::retain`].
    ///
    /// # Errors
    ///
    /// As [`Store::retain`].
    pub fn retain(&self, job_id: &str, keep: usize) -> Result<Cleanup> {
        let (s, j) = (self.store.clone(), job_id.to_owned());
        self.run(async move { s.retain(&j, keep).await })
    }

    /// See [`Store::gc`].
    ///
    /// # Errors
    ///
    /// As [`Store::gc`].
    pub fn gc(&self, job_id: &str) -> Result<Cleanup> {
        let (s, j) = (self.store.clone(), job_id.to_owned());
        self.run(async move { s.gc(&j).await })
    }

    /// See [`Store::remove`].
    ///
    /// # Errors
    ///
    /// As [`Store::remove`].
    pub fn remove(&self, id: &SnapshotId) -> Result<Cleanup> {
        let (s, id) = (self.store.clone(), id.clone());
        self.run(async move { s.remove(&id).await })
    }

    /// See [`Store::remove_job`].
    ///
    /// # Errors
    ///
    /// As [`Store::remove_job`].
    pub fn remove_job(&self, job_id: &str) -> Result<Cleanup> {
        let (s, j) = (self.store.clone(), job_id.to_owned());
        self.run(async move { s.remove_job(&j).await })
    }
}
