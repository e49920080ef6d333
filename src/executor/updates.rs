//! Progress as it is published ([`ProgressUpdates`]): the receiving end of the run's progress
//! channel, whose sender is the driver's (`links.rs`) and whose reports the state makes
//! (`progress.rs`).

use tokio::sync::watch;

use super::progress::Progress;

/// Progress as it is published, to wait for rather than poll: from
/// [`JobHandle::progress_updates`](super::JobHandle::progress_updates).
///
/// Each call to [`next`](Self::next) (or [`changed`](Self::changed) in async code) returns the
/// newest report once it differs from the one returned last: reports in between are skipped,
/// so a slow reader never holds the job back. After the job's last report (with
/// [`Progress::ended`] set) it returns `None`.
#[derive(Debug)]
pub struct ProgressUpdates {
    rx: watch::Receiver<Option<Progress>>,
    done: bool,
}

impl ProgressUpdates {
    pub(crate) fn new(mut rx: watch::Receiver<Option<Progress>>) -> ProgressUpdates {
        // Subscribed after the job ended: its last report is still to be returned.
        if rx.borrow().as_ref().is_some_and(|p| p.ended) {
            rx.mark_changed();
        }
        ProgressUpdates { rx, done: false }
    }

    /// Waits for the next report; `None` once the last one was returned.
    pub async fn changed(&mut self) -> Option<Progress> {
        if self.done {
            return None;
        }
        // The sender lives as long as the job's state, and publishes a last report (with
        // `ended` set) when the job ends; a sender gone without it is the end too.
        let p = match self.rx.changed().await {
            Ok(()) => self.rx.borrow_and_update().clone(),
            Err(_) => None,
        };
        self.done = p.as_ref().is_none_or(|p| p.ended);
        p
    }

    /// Blocks until the next report; `None` once the last one was returned. Not for async
    /// code: use [`changed`](Self::changed) there.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Option<Progress> {
        futures::executor::block_on(self.changed())
    }
}

impl Iterator for ProgressUpdates {
    type Item = Progress;

    fn next(&mut self) -> Option<Progress> {
        ProgressUpdates::next(self)
    }
}
