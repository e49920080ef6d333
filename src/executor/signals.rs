//! The signals that ask a job to suspend ([`Builder::suspend_on`](crate::Builder::suspend_on)),
//! and what SIGINT means around them.
//!
//! Each job's timer task (`triggers.rs`) holds a stream per signal of its set. A handler, once
//! installed, stays for the life of the process (the signal registry under tokio never
//! uninstalls one), so SIGINT, which a person sends with Ctrl-C to stop a program, would no
//! longer stop it once a job had watched it. One process-wide listener thread keeps Ctrl-C
//! working: a SIGINT while no job watches SIGINT, or a second one while jobs watch it (their
//! suspend is under way and the person wants the program gone now), ends the process as the
//! default action would (the default is restored and the signal raised again).

use std::future::poll_fn;
use std::sync::Once;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::Poll;

use tokio::signal::unix::{Signal, SignalKind, signal};

/// Jobs watching SIGINT now.
static WATCHERS: AtomicUsize = AtomicUsize::new(0);
/// Set when the last watcher of SIGINT went: the listener forgets the SIGINTs it counted.
static FORGET: AtomicBool = AtomicBool::new(false);
static LISTENER: Once = Once::new();

/// Signals the kernel does not let a program handle, or that tokio refuses to.
pub(crate) fn check(signals: &[i32]) -> Result<(), String> {
    for &s in signals {
        let forbidden = [
            libc::SIGKILL,
            libc::SIGSTOP,
            libc::SIGILL,
            libc::SIGFPE,
            libc::SIGSEGV,
        ];
        if s <= 0 || s > libc::SIGRTMAX() || forbidden.contains(&s) {
            return Err(format!(
                "signal {s} cannot ask for a suspend (not a signal a program can handle)"
            ));
        }
    }
    Ok(())
}

/// The signal streams of one job's timer task.
#[derive(Debug)]
pub(crate) struct Signals {
    streams: Vec<(i32, Signal)>,
    _interrupt: Option<Watch>,
}

impl Signals {
    /// Installs (or joins) the handlers of `set`; call inside the runtime. A handler that
    /// cannot be installed is logged and left out.
    pub(crate) fn new(set: &[i32], job: &'static str) -> Signals {
        let interrupt = set.contains(&libc::SIGINT).then(Watch::new);
        let streams = set
            .iter()
            .filter_map(|&s| match signal(SignalKind::from_raw(s)) {
                Ok(stream) => Some((s, stream)),
                Err(error) => {
                    tracing::error!(job, signal = s, %error, "cannot watch a signal for suspends");
                    None
                }
            })
            .collect();
        Signals {
            streams,
            _interrupt: interrupt,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.streams.is_empty()
    }

    /// The next signal of the set that arrived.
    pub(crate) async fn recv(&mut self) -> i32 {
        poll_fn(|cx| {
            for (s, stream) in &mut self.streams {
                if let Poll::Ready(Some(())) = stream.poll_recv(cx) {
                    return Poll::Ready(*s);
                }
            }
            Poll::Pending
        })
        .await
    }
}

/// One job watching SIGINT, while it lives.
#[derive(Debug)]
struct Watch;

impl Watch {
    fn new() -> Watch {
        LISTENER.call_once(start_listener);
        WATCHERS.fetch_add(1, Ordering::SeqCst);
        Watch
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if WATCHERS.fetch_sub(1, Ordering::SeqCst) == 1 {
            FORGET.store(true, Ordering::SeqCst);
        }
    }
}

/// The process-wide listener of SIGINT (see the module's docs).
fn start_listener() {
    let (ready, installed) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("malleable-sigint".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(error) => {
                    tracing::error!(%error, "no runtime for the SIGINT listener: a second Ctrl-C will not end the process");
                    let _ = ready.send(());
                    return;
                }
            };
            rt.block_on(async move {
                let mut stream = match signal(SignalKind::interrupt()) {
                    Ok(s) => s,
                    Err(error) => {
                        tracing::error!(%error, "cannot listen to SIGINT: a second Ctrl-C will not end the process");
                        let _ = ready.send(());
                        return;
                    }
                };
                let _ = ready.send(());
                let mut seen = 0u32;
                while stream.recv().await.is_some() {
                    if FORGET.swap(false, Ordering::SeqCst) {
                        seen = 0;
                    }
                    if WATCHERS.load(Ordering::SeqCst) == 0 {
                        terminate_on_interrupt();
                    }
                    seen += 1;
                    if seen >= 2 {
                        tracing::warn!("a second SIGINT during a suspend: the process ends now");
                        terminate_on_interrupt();
                    }
                }
            });
        });
    match spawned {
        // Installed before the first job's handler, so both see the first SIGINT.
        Ok(_) => {
            let _ = installed.recv();
        }
        Err(error) => {
            tracing::error!(%error, "cannot start the SIGINT listener: a second Ctrl-C will not end the process");
        }
    }
}

/// Ends the process as SIGINT's default action does.
fn terminate_on_interrupt() -> ! {
    // SAFETY: `signal` and `raise` are async-signal-safe and called from an ordinary
    // thread; restoring the default action is what the process asked for by Ctrl-C.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_DFL);
        libc::raise(libc::SIGINT);
    }
    // SIGINT blocked in this thread's mask: the conventional exit status of a program
    // ended by it.
    std::process::exit(128 + libc::SIGINT)
}
