//! The wire of the cluster: what crosses a TCP connection between a coordinator and a
//! worker process, and how worker processes are started. It knows no [`Job`](crate::Job),
//! no executor and no worker process: bytes, frames, the handshake, and typed errors.
//!
//! - `transport.rs`: the byte stream under the frames (dial, bind, accept); TLS would land
//!   there and only there.
//! - `frame.rs`: the messages and their framing.
//! - `handshake.rs`: versions, the shared token (challenge and response), the job.
//! - `peer.rs`: the handshake and frames of links between worker processes of one job,
//!   which send halos to each other directly (protocol 20); the links are `worker/peers.rs`.
//! - `listener.rs`: the coordinator's listener, which hands accepted workers to their job
//!   through the `Attach` trait (the job's side of membership is `executor/remote.rs`).
//! - `launch.rs`: launchers that start worker processes for `JobHandle::scale_remote`.
//! - `buffers.rs`: large buffers kept for reuse (buddy copies, encoded and read).
//! - `shared.rs`: buddy copies through memory shared by two processes of one node.
//! - `error.rs`: the one error type of both sides of a connection.
//!
//! Inside the crate this module is `wire`; the public [`cluster`](crate::cluster) module
//! re-exports it together with the worker process (`src/worker/`), which combines the wire
//! with the chunk runner. Keeping the worker process out of this folder is what breaks the
//! cycle there was between the executor and the cluster.

pub(crate) mod buffers;
mod error;
pub mod frame;
pub mod handshake;
mod launch;
pub(crate) mod listener;
pub mod peer;
pub(crate) mod shared;
pub(crate) mod transport;

pub use error::{AuthFailure, Error};
pub use handshake::{TOKEN_ENV, Token};
pub use launch::{CommandLauncher, LaunchSpec, Launched, Launcher, LocalLauncher};
