//! Remote workers: worker processes that dial the coordinator over TCP, join a running job,
//! leave it, or fail, at any time.
//!
//! - `frame.rs`: the messages and their framing.
//! - `handshake.rs`: versions, the shared token (challenge and response), the job.
//! - `listener.rs`: the coordinator's listener, which hands accepted workers to their job (the
//!   job's side of membership lives with the executor, in `executor/remote.rs`).
//! - `worker.rs`: [`serve`], the worker process's side.
//! - `launch.rs`: [`Launcher`]s that start worker processes for
//!   [`JobHandle::scale_remote`](crate::JobHandle::scale_remote).

mod error;
pub mod frame;
pub mod handshake;
mod launch;
pub(crate) mod listener;
mod worker;

pub use error::Error;
pub use handshake::{TOKEN_ENV, Token};
pub use launch::{CommandLauncher, LaunchSpec, Launched, Launcher, LocalLauncher};
pub use worker::{Registry, Served, WorkerOptions, serve};
