//! The coordinator's listener: accepts worker connections, runs the handshake with a time
//! limit, and hands each accepted worker to a running job whose name it knows.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio_util::codec::Framed;

use super::handshake::{self, JobType, NoJob, Timing, Token};
use super::transport::{Acceptor, Stream};
use super::{Error, Launcher};
use crate::layout::Layout;

/// How the coordinator's side of a cluster is set up (from the executor's builder).
#[derive(Clone, Debug)]
pub(crate) struct ClusterConfig {
    pub(crate) listen: Option<String>,
    pub(crate) token: Option<Token>,
    pub(crate) heartbeat: Duration,
    pub(crate) lease: Duration,
    pub(crate) handshake_timeout: Duration,
    pub(crate) max_frame: usize,
    pub(crate) max_message: usize,
    pub(crate) launcher: Option<Arc<dyn Launcher>>,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            listen: None,
            token: None,
            heartbeat: Duration::from_millis(500),
            lease: Duration::from_secs(5),
            handshake_timeout: Duration::from_secs(5),
            max_frame: super::frame::DEFAULT_MAX_FRAME,
            max_message: super::frame::DEFAULT_MAX_MESSAGE,
            launcher: None,
        }
    }
}

/// An accepted worker connection, handed to its job.
#[derive(Debug)]
pub(crate) struct Connection {
    pub(crate) framed: Framed<Stream, crate::wire::frame::Codec>,
    pub(crate) peer: String,
    pub(crate) threads: u32,
    /// The node the process says it runs on.
    pub(crate) node: String,
}

/// A running job as the listener sees it (implemented by the executor's job state).
pub(crate) trait Attach: Send + Sync {
    fn name(&self) -> &'static str;
    /// The job's version (`Job::VERSION`).
    fn version(&self) -> u32;
    /// The serialized layout of the job's types (`Layout::of` the job).
    fn layout(&self) -> &'static Layout;
    /// Whether the job still takes workers.
    fn accepts(&self) -> bool;
    /// Takes an accepted worker into the job.
    fn attach(self: Arc<Self>, conn: Connection);
}

/// Jobs as the listener holds them while it chooses.
type Jobs = Vec<Arc<dyn Attach>>;

/// How many refused peers and lost connections are remembered for [`Listener::errors`].
const KEEP_ERRORS: usize = 256;

/// The listener of one executor.
pub(crate) struct Listener {
    addr: SocketAddr,
    config: ClusterConfig,
    jobs: Mutex<Vec<(&'static str, Weak<dyn Attach>)>>,
    /// Names of jobs that ran here and ended (their state is gone), for a worker that dials
    /// after its job: it is told so.
    ended: Mutex<std::collections::BTreeSet<&'static str>>,
    errors: Mutex<Vec<Arc<Error>>>,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

fn is_loopback(addr: &SocketAddr) -> bool {
    addr.ip().is_loopback()
}

impl Listener {
    /// Binds `config.listen` and starts accepting on `io`.
    pub(crate) fn start(
        io: &tokio::runtime::Handle,
        config: ClusterConfig,
    ) -> Result<Arc<Listener>, Error> {
        let asked = config.listen.clone().unwrap_or_default();
        let (listener, addr) = Acceptor::bind(&asked, io)?;
        if config.token.is_none() && !is_loopback(&addr) {
            return Err(Error::NoToken { addr: asked });
        }
        let me = Arc::new(Listener {
            addr,
            config,
            jobs: Mutex::new(Vec::new()),
            ended: Mutex::new(std::collections::BTreeSet::new()),
            errors: Mutex::new(Vec::new()),
        });
        let weak = Arc::downgrade(&me);
        io.spawn(async move {
            loop {
                let Ok((stream, peer)) = listener.accept().await else {
                    // Out of file descriptors and the like: wait, and accept again.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let Some(me) = weak.upgrade() else { return };
                tokio::spawn(async move { me.accept(stream, peer).await });
            }
        });
        Ok(me)
    }

    /// The address workers dial.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Offers accepted workers to `job` while it runs.
    pub(crate) fn register(&self, job: Weak<dyn Attach>) {
        let Some(name) = job.upgrade().map(|j| j.name()) else {
            return;
        };
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        let mut ended = self.ended.lock().unwrap_or_else(|p| p.into_inner());
        jobs.retain(|(name, j)| {
            let alive = j.strong_count() > 0;
            if !alive {
                ended.insert(name);
            }
            alive
        });
        jobs.push((name, job));
    }

    /// Records a refused peer or a lost connection.
    pub(crate) fn record(&self, error: Error) {
        tracing::warn!(error = %error, "cluster peer");
        metrics::counter!(crate::metrics::PEER_ERRORS, "kind" => error.kind()).increment(1);
        let mut errors = self.errors.lock().unwrap_or_else(|p| p.into_inner());
        if errors.len() == KEEP_ERRORS {
            errors.remove(0);
        }
        errors.push(Arc::new(error));
    }

    /// The most recent refused peers and lost connections, oldest first.
    pub(crate) fn errors(&self) -> Vec<Arc<Error>> {
        self.errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    async fn accept(self: Arc<Self>, stream: Stream, peer: SocketAddr) {
        let _ = stream.set_nodelay(true);
        let peer = peer.to_string();
        let cfg = &self.config;
        let mut framed = Framed::new(stream, super::frame::codec(cfg.max_frame));
        let timing = Timing {
            heartbeat_ms: cfg.heartbeat.as_millis() as u64,
            lease_ms: cfg.lease.as_millis() as u64,
        };
        let shake = handshake::coordinator(
            &mut framed,
            &peer,
            cfg.token.as_ref(),
            cfg.max_frame,
            timing,
            |names| self.choose(names),
        );
        match tokio::time::timeout(cfg.handshake_timeout, shake).await {
            Ok(Ok(accepted)) => accepted.job.attach(Connection {
                framed,
                peer,
                threads: accepted.threads,
                node: accepted.node,
            }),
            Ok(Err(e)) => self.record(e),
            Err(_) => self.record(Error::HandshakeTimeout {
                peer,
                after: cfg.handshake_timeout,
            }),
        }
    }

    /// The first running job whose name, version and layout the worker has; else the first
    /// it has in its version with types of another layout; else the first it has in another
    /// version; else a job it has that ran here and ended; or the names of the running ones.
    ///
    /// A layout is compared only where both sides could trace it (a worker's `None`, a
    /// job's [`Layout::untraceable`]): one that could not be traced is not checked, as in a
    /// snapshot.
    fn choose(&self, offered: &[JobType]) -> Result<(String, u32, Arc<dyn Attach>), NoJob> {
        let (jobs, mut ended): (Jobs, Vec<&'static str>) = {
            let jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
            let ended = self.ended.lock().unwrap_or_else(|p| p.into_inner());
            let dead = jobs
                .iter()
                .filter(|(_, j)| j.strong_count() == 0)
                .map(|(name, _)| *name);
            (
                jobs.iter().filter_map(|(_, j)| j.upgrade()).collect(),
                ended.iter().copied().chain(dead).collect(),
            )
        };
        let (running, stopped): (Jobs, Jobs) = jobs.into_iter().partition(|j| j.accepts());
        let has = |j: &Arc<dyn Attach>, same_version: bool| {
            offered
                .iter()
                .any(|o| o.name == j.name() && (!same_version || o.version == j.version()))
        };
        let fits = |j: &Arc<dyn Attach>| {
            let layout = j.layout();
            offered.iter().any(|o| {
                o.name == j.name()
                    && o.version == j.version()
                    && match o.layout {
                        Some(theirs) if layout.is_traced() => theirs == layout.fingerprint(),
                        _ => true,
                    }
            })
        };
        if let Some(j) = running.iter().find(|j| fits(j)) {
            return Ok((j.name().to_owned(), j.version(), Arc::clone(j)));
        }
        if let Some(j) = running.iter().find(|j| has(j, true)) {
            return Err(NoJob::Layout {
                job: j.name().to_owned(),
                version: j.version(),
                layout: j.layout().clone(),
            });
        }
        if let Some(j) = running.iter().find(|j| has(j, false)) {
            return Err(NoJob::Version {
                job: j.name().to_owned(),
                version: j.version(),
            });
        }
        ended.extend(stopped.iter().map(|j| j.name()));
        if running.is_empty() {
            if let Some(job) = ended
                .iter()
                .find(|name| offered.iter().any(|o| o.name == **name))
            {
                return Err(NoJob::Ended {
                    job: (*job).to_owned(),
                });
            }
        }
        Err(NoJob::Unknown(
            running.iter().map(|j| j.name().to_owned()).collect(),
        ))
    }
}
