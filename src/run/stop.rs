//! The suspend (or stop) token: a trigger a program fires when it wants its jobs suspended,
//! or a worker process wants to leave. A thin wrapper over tokio-util's `CancellationToken`.

use tokio_util::sync::CancellationToken;

/// A trigger for suspending jobs, for programs that decide themselves when to stop
/// (see [`Builder::suspend_token`](crate::Builder::suspend_token)), and for worker processes
/// that should leave their job ([`WorkerOptions::stop_on`](crate::cluster::WorkerOptions::stop_on)).
/// Clones share the trigger; once fired it stays fired.
#[derive(Debug, Clone, Default)]
pub struct SuspendToken(CancellationToken);

impl SuspendToken {
    /// A token that has not fired.
    pub fn new() -> SuspendToken {
        SuspendToken::default()
    }

    /// Suspends every job watching this token (now, and any started later).
    pub fn suspend(&self) {
        self.0.cancel();
    }

    /// Whether [`SuspendToken::suspend`] was called.
    pub fn is_suspended(&self) -> bool {
        self.0.is_cancelled()
    }

    /// Completes once the token has fired (at once if it already has).
    pub(crate) async fn fired(&self) {
        self.0.cancelled().await;
    }
}
