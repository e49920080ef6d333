//! The integration tests that can share a process, one module per scenario (each module's
//! docs say what it checks), linked into one test binary instead of one binary each: linking
//! the crate and its dependencies into every binary was most of the time of a test build.
//!
//! Run one module with `cargo test --all-features --test it MODULE::` (for example
//! `cargo test --all-features --test it cluster_versions::`).
//!
//! Tests that re-execute this binary as a worker or child process name the test they run
//! with its module ([`common::exact`]: `cluster_versions::worker_process`), so each module's
//! process body stays its own.
//!
//! Kept in binaries of their own, because they hold process-wide state another module's
//! tests would share or disturb: `no_alloc_per_step` (a counting global allocator),
//! `autoscale`, `cluster_refusals`, `metrics`, `scenarios`, `snapshot_unreachable`,
//! `timeline` and `prometheus` (each installs the process's one metrics recorder),
//! `signals` (signal handlers, and signals sent to its own processes) and `slurm` (its batch
//! scripts run the binary by its path).

#[path = "../common/mod.rs"]
mod common;
#[path = "../support/mod.rs"]
mod support;

mod autoscale_remote;
mod cluster;
mod cluster_end;
mod cluster_hostile;
mod cluster_pieces;
mod cluster_shutdown;
mod cluster_unauthenticated;
mod cluster_versions;
mod coordinator_silent;
mod crash_consistency;
mod exchange;
mod executor;
mod field_output;
mod fuzz_corpus;
mod job_lease;
mod layering;
mod lifecycle;
mod partitions;
mod partitions_histories;
mod partitions_kill_stress;
mod partitions_remote;
mod progress;
mod recovery_trials;
mod remote_errors;
mod resume_shape;
mod resume_submitted;
mod resume_undecodable;
mod scaling_histories;
mod snapshot_damage;
mod snapshot_faults;
mod snapshot_layout;
mod snapshot_proptest;
mod snapshot_resume;
#[cfg(feature = "s3")]
mod snapshot_s3;
mod snapshot_shutdown;
mod snapshot_store;
