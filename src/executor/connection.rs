//! The socket driver of a worker process's connection: one task per process that turns
//! frames into calls on the job's state (`State::on_remote`, `State::drop_conn`) and writes
//! what the state queued for it (`links.rs` hands the frames over), with the heartbeats and
//! the lease of the link. It decides nothing about the job: what a message means is the
//! state's (`remote.rs`). Also the start of worker processes by a launcher
//! (`scale_remote`), outside the job's lock.

use std::sync::Arc;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use super::job_run::Shared;
use crate::error::Error;
use crate::job::Job;
use crate::schedule::ProcessId;
use crate::wire::Error as PeerError;
use crate::wire::frame::{self, ToCoordinator, ToWorker};
use crate::wire::listener::{Attach, Connection};

impl<J: Job> Attach for Shared<J> {
    fn name(&self) -> &'static str {
        J::NAME
    }

    fn version(&self) -> u32 {
        J::VERSION
    }

    fn layout(&self) -> &'static crate::Layout {
        crate::Layout::of::<J>()
    }

    fn accepts(&self) -> bool {
        !self.lock().ended
    }

    fn attach(self: Arc<Self>, conn: Connection) {
        let (tx, rx) = unbounded_channel();
        // Until the task ends: a shutdown waits for it once the job lets go of `tx`.
        let tracked = self.io.track(super::shutdown::job_key(&self), &tx);
        let id = {
            let mut st = self.lock();
            if st.ended {
                let _ = tx.send(ToWorker::End);
                None
            } else {
                let id = st.join_remote(conn.peer.clone(), conn.threads, &conn.node);
                st.links().1.link_conn(id, tx);
                Some(id)
            }
        };
        let io = self.io.handle().clone();
        io.spawn(async move {
            connection(self, id, conn, rx).await;
            drop(tracked);
        });
    }
}

/// A connection's task: writes what the job sends, reads what the worker sends, and gives the
/// worker up after a lease of silence.
async fn connection<J: Job>(
    shared: Arc<Shared<J>>,
    id: Option<ProcessId>,
    conn: Connection,
    mut rx: UnboundedReceiver<ToWorker>,
) {
    let Connection { framed, peer, .. } = conn;
    let cfg = &shared.config.cluster;
    let (heartbeat, lease, limit) = (cfg.heartbeat, cfg.lease, cfg.max_frame);
    let mut pieces = frame::Assembler::new(cfg.max_message);
    let (mut sink, mut stream) = framed.split();
    let io_error = |source| PeerError::Io {
        peer: peer.clone(),
        source,
    };
    let writer = async {
        let mut beat = tokio::time::interval(heartbeat);
        loop {
            tokio::select! {
                msg = rx.recv() => {
                    let Some(msg) = msg else { return Ok(false) };
                    let mut end = msg.ends();
                    for f in frame::Frames::new(&msg, limit) {
                        sink.feed(f).await.map_err(io_error)?;
                    }
                    while !end {
                        let Ok(m) = rx.try_recv() else { break };
                        end = m.ends();
                        for f in frame::Frames::new(&m, limit) {
                            sink.feed(f).await.map_err(io_error)?;
                        }
                    }
                    sink.flush().await.map_err(io_error)?;
                    if end {
                        let _ = sink.close().await;
                        return Ok(true);
                    }
                }
                _ = beat.tick() => sink.send(frame::encode(&ToWorker::Heartbeat).into()).await.map_err(io_error)?,
            }
        }
    };
    let reader = async {
        loop {
            let bytes = match tokio::time::timeout(lease, stream.next()).await {
                Err(_) => {
                    return Err(PeerError::LeaseExpired {
                        peer: peer.clone(),
                        after: lease,
                    });
                }
                Ok(None) => return Err(PeerError::Closed { peer: peer.clone() }),
                Ok(Some(Err(e))) => return Err(PeerError::io(&peer, e, limit)),
                Ok(Some(Ok(b))) => b,
            };
            // A worker that came after the job's end is only sent `End`: what it says
            // meanwhile is read (its socket must not fill) and dropped.
            let Some(id) = id else { continue };
            let Some(msg) = pieces.frame::<ToCoordinator>(&peer, bytes.freeze())? else {
                continue;
            };
            shared.lock().on_remote(id, msg)?;
        }
    };
    // The writer ends after `End`; the reader ends with the connection or a protocol error.
    let ended: Result<bool, PeerError> = tokio::select! {
        r = writer => r,
        r = reader => r.map(|()| false),
    };
    let sent_end = matches!(ended, Ok(true));
    if let Some(id) = id {
        let mut st = shared.lock();
        // Recorded before the connection leaves the job: whoever sees it gone finds why.
        if let (true, Err(e)) = (st.remote.conns.contains_key(&id), ended) {
            if let Some(l) = &shared.listener {
                l.record(e);
            }
        }
        st.drop_conn(id);
    }
    if sent_end {
        // The worker may have written (a heartbeat, a slot's report) while `End` was on its
        // way. Closing the socket with those bytes unread would reset the connection, and
        // the worker's next write would fail although its job ended well. So what it sends
        // is read and dropped until it closes its side after `End`, for a bounded time.
        let _ = tokio::time::timeout(lease.min(LINGER), async {
            while let Some(Ok(_)) = stream.next().await {}
        })
        .await;
    }
}

/// How long a connection is read after `End`, waiting for the worker to close its side (at
/// most a lease). A worker reads `End` and closes at once; one starved of CPU for a moment
/// (two cores, a test suite's processes) may take longer, and closing on it with its bytes
/// unread resets the connection: its next write fails, and it ends with an error a job that
/// had finished. (The resets CI runs saw, with 1 s here and with 5 s, had another cause: an
/// `End` batched with a job's last interrupts was not taken for an end, so the connection
/// was dropped without a linger; see [`ToWorker::ends`].)
const LINGER: Duration = Duration::from_secs(5);

/// [`JobHandle::scale_remote`](super::JobHandle::scale_remote): processes are started outside
/// the job's lock (starting one can take milliseconds).
pub(crate) fn scale_remote<J: Job>(shared: &Arc<Shared<J>>, n: usize) -> crate::Result<()> {
    let (Some(listener), Some(launcher)) = (&shared.listener, &shared.config.cluster.launcher)
    else {
        return Err(Error::InvalidConfig(
            "scale_remote needs Builder::listen and Builder::launcher".into(),
        ));
    };
    let (start, first_index) = {
        let mut guard = shared.lock();
        let (st, links) = guard.links();
        if st.ended {
            return Ok(());
        }
        links
            .launched
            .retain_mut(|p| matches!(p.try_wait(), Ok(None)));
        st.remote.launched = links.launched.len();
        let connected = st.remote.conns.len();
        let starting = st.remote.launched.saturating_sub(connected);
        let present = st.remote_count() + starting;
        if n < st.remote_count() {
            let extra = st.remote_count() - n;
            st.retire_remote(extra);
        }
        (n.saturating_sub(present), st.remote.launched_total)
    };
    let mut started = Vec::with_capacity(start);
    let mut error = None;
    for i in 0..start {
        let spec = crate::wire::LaunchSpec {
            addr: listener.addr(),
            index: first_index + i,
            token: shared.config.cluster.token.clone(),
        };
        match launcher.launch(&spec) {
            Ok(p) => {
                tracing::info!(worker = %p.describe(), "started a worker process");
                started.push(p);
            }
            Err(e) => {
                error = Some(Error::Spawn(e));
                break;
            }
        }
    }
    let mut guard = shared.lock();
    let (st, links) = guard.links();
    st.remote.launched_total += started.len();
    links.launched.extend(started);
    st.remote.launched = links.launched.len();
    error.map_or(Ok(()), Err)
}
