//! The decisions of a rollback as a state machine: losses, the run's quiet, the store's
//! answers and the time in; what to do next out.
//!
//! Owned partitions lost with a worker process after the first phase cannot be made again,
//! and the other partitions are newer than any snapshot, so the job goes back to a whole
//! committed cut. The executor (`executor/rollback.rs`) carries the steps out: it halts the
//! ledger, waits, reads the store, resets and places the restored run. Which step comes
//! next, to which snapshot, whether a loss starts it over or ends the job, and which answer
//! of the store is stale, is decided here, with no thread, clock or store, so every ordering
//! of losses, commits and reads can be driven by a test.
//!
//! # The protocol
//!
//! 1. *Loss* ([`RollbackMachine::lost`]). With a committed snapshot, or the job's first one
//!    being written (its outcome decides, step 2), or in the job's first phase (whose
//!    partitions are made from the job value alone: the phase can be run again from its
//!    start), the rollback starts: [`RollbackCommand::Halt`] (stop handing out chunks, drop
//!    the running ones) and the snapshot cut whose marker is out gives way (what it waits
//!    for is dropped). With none of these, [`RollbackCommand::NothingToRollBackTo`]: the job
//!    ends. A loss during a rollback adds
//!    its chunks; one while the restored run is being filled (step 4) starts the rollback
//!    over from step 2 (the restored partitions placed on the lost process are gone too).
//! 2. *Quiet* ([`RollbackMachine::poll`]). Once no chunk runs, no partition is on its way
//!    and no snapshot is being written, the snapshot to go back to is the newest committed
//!    one (a write that committed meanwhile is newer than the one at the loss):
//!    [`RollbackCommand::ReadManifest`] with this attempt's number. None committed (the first
//!    write failed, or there was none) in the first phase: [`RollbackCommand::Rebuild`], the
//!    run starts its first phase again; in a later phase,
//!    [`RollbackCommand::NothingToRollBackTo`].
//! 3. *Read* ([`RollbackMachine::manifest_read`]). The manifest of that attempt, read: the
//!    run is reset to it and placed ([`RollbackCommand::Reset`]); could not be read:
//!    [`RollbackCommand::Failed`]. An answer of an earlier attempt is stale and ignored.
//! 4. *Fill* ([`RollbackMachine::parts_read`]). The parts the coordinator hands out itself,
//!    read: [`RollbackCommand::Restart`] with the record of the rollback; not read:
//!    [`RollbackCommand::Failed`].
//!
//! Why it is safe: nothing is read before the run is quiet, so no state of the lost run can
//! reach the restored one; the epoch is chosen at the quiet point, after every write that
//! started before it ended, so no newer commit is passed over; and every answer carries its
//! attempt, so a read that was under way when the rollback started over cannot reset the run
//! to the wrong placement.

use std::time::Duration;

use super::ChunkId;

/// What the executor does next for a rollback.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RollbackCommand {
    /// Step 1: halt the ledger (running chunks are dropped) and let an open cut give way.
    Halt,
    /// A rollback to `epoch` (`None`: to the start of the first phase) is decided: count it
    /// and put it on the timeline.
    Started {
        /// The chunks lost so far.
        lost: Vec<ChunkId>,
        /// The snapshot gone back to.
        epoch: Option<u64>,
    },
    /// Step 3: read the manifest of `epoch`; answer with [`RollbackMachine::manifest_read`]
    /// and this `attempt`.
    ReadManifest {
        /// The snapshot to read.
        epoch: u64,
        /// The attempt the answer belongs to.
        attempt: u64,
    },
    /// Step 3 without a snapshot, in the job's first phase: reset the run to the start of
    /// that phase (every partition made again from the job value), then answer with
    /// [`RollbackMachine::manifest_read`] and this `attempt`, as if a manifest was read.
    Rebuild {
        /// The attempt the answer belongs to.
        attempt: u64,
    },
    /// Step 4: reset the run to the manifest read and place it; then read the parts the
    /// coordinator hands out itself and answer with [`RollbackMachine::parts_read`].
    Reset,
    /// The rollback is done: restart the run.
    Restart(RollbackRecord),
    /// No snapshot was committed and none is being written: the job ends
    /// (`Error::PartitionsLost`).
    NothingToRollBackTo {
        /// The chunks lost.
        lost: Vec<ChunkId>,
    },
    /// The snapshot could not be read back: the job ends (`Error::RollbackFailed`).
    Failed {
        /// The chunks lost.
        lost: Vec<ChunkId>,
        /// The snapshot that could not be read.
        epoch: u64,
    },
}

/// A rollback done, as the machine measured it (times since the run started).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RollbackRecord {
    /// The chunks lost.
    pub(crate) lost: Vec<ChunkId>,
    /// The phase the job was in at the first loss.
    pub(crate) from_phase: u64,
    /// The snapshot gone back to; `None`: the start of the first phase.
    pub(crate) epoch: Option<u64>,
    /// From the first loss until the run was quiet for the last attempt.
    pub(crate) quiesce: Duration,
    /// The last attempt's reads: the manifest's and the coordinator's parts'.
    pub(crate) read: Duration,
    /// From the first loss until the restart.
    pub(crate) restart: Duration,
    /// Times the rollback started over (a loss while the restored run was filled).
    pub(crate) started_over: u64,
    /// When the first loss was noticed.
    pub(crate) since: Duration,
}

/// Where a rollback is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Waiting for the run to be quiet.
    Quiescing,
    /// The manifest's read is under way since `at`.
    Reading { at: Duration },
    /// The run is reset and placed; the coordinator's parts are being read since `at`.
    Filling { at: Duration },
}

#[derive(Debug, Clone)]
struct Under {
    lost: Vec<ChunkId>,
    from_phase: u64,
    /// `None` while the first snapshot is being written, and when the run goes back to the
    /// start of its first phase.
    epoch: Option<u64>,
    /// The loss came while the first snapshot was written: its outcome decides.
    awaited_write: bool,
    since: Duration,
    /// When the last attempt's read started (the quiet point).
    quiet_at: Option<Duration>,
    step: Step,
    /// The attempt under way: its number, unique in the run (see [`RollbackMachine`]).
    attempt: u64,
    /// Times this rollback started over.
    started_over: u64,
    /// The last attempt's reads so far (its manifest, then its parts).
    read: Duration,
}

/// The rollbacks of one job run (see the module docs).
///
/// Attempts are numbered across the run, not from 0 in each rollback: a read asked for by
/// the last attempt of one rollback may be answered after that rollback restarted the run
/// through another of its answers, and then during the next rollback. Numbered from 0 in
/// each, an answer of the first rollback's attempt 0 was taken for the second rollback's
/// attempt 0 (a seeded simulation found it: a stale read of one part "filled" the next
/// rollback's restored run, whose other partitions were placed on the processes with empty
/// states).
#[derive(Debug, Clone, Default)]
pub(crate) struct RollbackMachine {
    under: Option<Under>,
    /// The number of the next attempt.
    attempts: u64,
}

impl RollbackMachine {
    /// Whether a rollback is under way (the ledger is halted and must stay so).
    pub(crate) fn is_under_way(&self) -> bool {
        self.under.is_some()
    }

    /// Step 1: partitions `lost` were lost in `phase`. `committed` is the newest committed
    /// snapshot of the run, `writing` whether a snapshot is being written.
    pub(crate) fn lost(
        &mut self,
        lost: &[ChunkId],
        phase: u64,
        committed: Option<u64>,
        writing: bool,
        now: Duration,
        out: &mut Vec<RollbackCommand>,
    ) {
        if let Some(u) = &mut self.under {
            u.lost.extend_from_slice(lost);
            u.lost.sort_unstable();
            u.lost.dedup();
            if matches!(u.step, Step::Filling { .. }) {
                // The restored run is still halted: back to step 2 with it.
                u.step = Step::Quiescing;
                u.attempt = self.attempts;
                u.started_over += 1;
                self.attempts += 1;
            }
            return;
        }
        let mut lost = lost.to_vec();
        lost.sort_unstable();
        lost.dedup();
        if committed.is_none() && !writing && phase > 0 {
            out.push(RollbackCommand::NothingToRollBackTo { lost });
            return;
        }
        if committed.is_some() || !writing {
            out.push(RollbackCommand::Started {
                lost: lost.clone(),
                epoch: committed,
            });
        }
        self.under = Some(Under {
            lost,
            from_phase: phase,
            epoch: committed,
            awaited_write: committed.is_none() && writing,
            since: now,
            quiet_at: None,
            step: Step::Quiescing,
            attempt: self.attempts,
            started_over: 0,
            read: Duration::ZERO,
        });
        self.attempts += 1;
        out.push(RollbackCommand::Halt);
    }

    /// Step 2: the run is `quiet` (no chunk runs, no partition on its way, no write in
    /// flight); `committed` is the newest committed snapshot now.
    pub(crate) fn poll(
        &mut self,
        quiet: bool,
        committed: Option<u64>,
        now: Duration,
        out: &mut Vec<RollbackCommand>,
    ) {
        let Some(u) = &mut self.under else { return };
        if !quiet || u.step != Step::Quiescing {
            return;
        }
        let epoch = committed.max(u.epoch);
        if epoch.is_none() && u.from_phase > 0 {
            let lost = std::mem::take(&mut u.lost);
            self.under = None;
            out.push(RollbackCommand::NothingToRollBackTo { lost });
            return;
        }
        if epoch.is_some() && u.epoch.is_none() {
            // The first snapshot, being written at the loss, committed.
            out.push(RollbackCommand::Started {
                lost: u.lost.clone(),
                epoch,
            });
        } else if epoch.is_none() && u.awaited_write {
            // It did not: the first phase starts again.
            u.awaited_write = false;
            out.push(RollbackCommand::Started {
                lost: u.lost.clone(),
                epoch: None,
            });
        }
        u.epoch = epoch;
        u.quiet_at = Some(now);
        u.read = Duration::ZERO;
        u.step = Step::Reading { at: now };
        out.push(match epoch {
            Some(epoch) => RollbackCommand::ReadManifest {
                epoch,
                attempt: u.attempt,
            },
            None => RollbackCommand::Rebuild { attempt: u.attempt },
        });
    }

    /// Step 3: the manifest asked for by `attempt` was read (`ok`) or could not be.
    pub(crate) fn manifest_read(
        &mut self,
        attempt: u64,
        ok: bool,
        now: Duration,
        out: &mut Vec<RollbackCommand>,
    ) {
        let Some(u) = &mut self.under else { return };
        let Step::Reading { at } = u.step else { return };
        if u.attempt != attempt {
            return;
        }
        u.read += now.saturating_sub(at);
        if !ok {
            return self.fail(out);
        }
        u.step = Step::Filling { at: now };
        out.push(RollbackCommand::Reset);
    }

    /// Step 4: the parts the coordinator needed, asked for by `attempt`, were read (`ok`)
    /// or could not be. A restored run that needed none answers at once.
    pub(crate) fn parts_read(
        &mut self,
        attempt: u64,
        ok: bool,
        now: Duration,
        out: &mut Vec<RollbackCommand>,
    ) {
        let Some(u) = &mut self.under else { return };
        let Step::Filling { at } = u.step else { return };
        if u.attempt != attempt {
            return;
        }
        u.read += now.saturating_sub(at);
        if !ok {
            return self.fail(out);
        }
        let Some(u) = self.under.take() else { return };
        out.push(RollbackCommand::Restart(RollbackRecord {
            epoch: u.epoch,
            quiesce: u.quiet_at.unwrap_or(now).saturating_sub(u.since),
            restart: now.saturating_sub(u.since),
            lost: u.lost,
            from_phase: u.from_phase,
            read: u.read,
            started_over: u.started_over,
            since: u.since,
        }));
    }

    /// The attempt under way (answers carry it).
    pub(crate) fn attempt(&self) -> Option<u64> {
        self.under.as_ref().map(|u| u.attempt)
    }

    fn fail(&mut self, out: &mut Vec<RollbackCommand>) {
        if let Some(u) = self.under.take() {
            out.push(RollbackCommand::Failed {
                lost: u.lost,
                epoch: u.epoch.unwrap_or_default(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::RollbackCommand as C;
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn run(f: impl FnOnce(&mut Vec<C>)) -> Vec<C> {
        let mut out = Vec::new();
        f(&mut out);
        out
    }

    #[test]
    fn a_loss_with_nothing_committed_or_written_ends_the_job() {
        let mut m = RollbackMachine::default();
        let out = run(|o| m.lost(&[3, 1, 3], 5, None, false, ms(0), o));
        assert_eq!(out, vec![C::NothingToRollBackTo { lost: vec![1, 3] }]);
        assert!(!m.is_under_way());
    }

    #[test]
    fn a_rollback_reads_the_newest_commit_once_the_run_is_quiet_and_restarts() {
        let mut m = RollbackMachine::default();
        let out = run(|o| m.lost(&[2], 9, Some(4), true, ms(10), o));
        assert_eq!(
            out,
            vec![
                C::Started {
                    lost: vec![2],
                    epoch: Some(4)
                },
                C::Halt
            ]
        );
        assert!(run(|o| m.poll(false, Some(4), ms(12), o)).is_empty());
        // A write in flight at the loss committed epoch 5 before the quiet point.
        let out = run(|o| m.poll(true, Some(5), ms(15), o));
        assert_eq!(
            out,
            vec![C::ReadManifest {
                epoch: 5,
                attempt: 0
            }]
        );
        assert!(run(|o| m.poll(true, Some(5), ms(16), o)).is_empty(), "once");
        assert_eq!(run(|o| m.manifest_read(0, true, ms(20), o)), vec![C::Reset]);
        let out = run(|o| m.parts_read(0, true, ms(30), o));
        assert_eq!(
            out,
            vec![C::Restart(RollbackRecord {
                lost: vec![2],
                from_phase: 9,
                epoch: Some(5),
                quiesce: ms(5),
                read: ms(15),
                restart: ms(20),
                started_over: 0,
                since: ms(10),
            })]
        );
        assert!(!m.is_under_way());
    }

    /// The job's first snapshot is being written at the loss: its outcome decides.
    #[test]
    fn a_loss_during_the_first_write_waits_for_its_outcome() {
        let mut m = RollbackMachine::default();
        assert_eq!(
            run(|o| m.lost(&[7], 3, None, true, ms(0), o)),
            vec![C::Halt]
        );
        // It commits: the rollback goes to it.
        assert_eq!(
            run(|o| m.poll(true, Some(0), ms(5), o)),
            vec![
                C::Started {
                    lost: vec![7],
                    epoch: Some(0)
                },
                C::ReadManifest {
                    epoch: 0,
                    attempt: 0
                }
            ]
        );
        // It fails: nothing to go back to.
        let mut m = RollbackMachine::default();
        run(|o| m.lost(&[7], 3, None, true, ms(0), o));
        assert_eq!(
            run(|o| m.poll(true, None, ms(5), o)),
            vec![C::NothingToRollBackTo { lost: vec![7] }]
        );
        assert!(!m.is_under_way());
    }

    /// A read of one rollback's attempt answered after that rollback restarted the run
    /// (through the answer of its later attempt) is stale in the next rollback too: attempts
    /// are numbered across the run. (Numbered from 0 in each rollback, the first rollback's
    /// attempt 0 answered during the second's attempt 0 restarted the second with the
    /// restored states it had not read: mesh seed 22368 of the simulation.)
    #[test]
    fn a_read_of_an_earlier_rollback_is_stale_in_the_next() {
        let mut m = RollbackMachine::default();
        run(|o| m.lost(&[1], 4, Some(2), false, ms(0), o));
        run(|o| m.poll(true, Some(2), ms(1), o));
        run(|o| m.manifest_read(0, true, ms(2), o));
        // Attempt 0 reads its parts; a loss starts attempt 1, which restarts the run.
        run(|o| m.lost(&[5], 4, Some(2), false, ms(3), o));
        run(|o| m.poll(true, Some(2), ms(4), o));
        run(|o| m.manifest_read(1, true, ms(5), o));
        let out = run(|o| m.parts_read(1, true, ms(6), o));
        assert!(matches!(out.as_slice(), [C::Restart(_)]), "{out:?}");
        // The next rollback, filling.
        run(|o| m.lost(&[3], 5, Some(2), false, ms(7), o));
        let attempt = m.attempt().expect("under way");
        assert!(attempt > 1, "attempt {attempt}");
        assert_eq!(
            run(|o| m.poll(true, Some(2), ms(8), o)),
            vec![C::ReadManifest { epoch: 2, attempt }]
        );
        assert_eq!(
            run(|o| m.manifest_read(attempt, true, ms(9), o)),
            vec![C::Reset]
        );
        // The first rollback's attempt 0 answers only now: not this rollback's.
        assert!(
            run(|o| m.parts_read(0, true, ms(10), o)).is_empty(),
            "stale"
        );
        assert!(m.is_under_way());
        let out = run(|o| m.parts_read(attempt, true, ms(11), o));
        let [C::Restart(r)] = out.as_slice() else {
            panic!("{out:?}")
        };
        assert_eq!((r.lost.clone(), r.started_over), (vec![3], 0));
    }

    /// A loss while the restored run is filled starts over; the read of the attempt before
    /// is stale when it ends.
    #[test]
    fn a_loss_while_filling_starts_over_and_stale_reads_are_ignored() {
        let mut m = RollbackMachine::default();
        run(|o| m.lost(&[1], 4, Some(2), false, ms(0), o));
        run(|o| m.poll(true, Some(2), ms(1), o));
        run(|o| m.manifest_read(0, true, ms(2), o));
        // A loss before the run is filled: back to step 2 (the restored run is halted).
        assert!(run(|o| m.lost(&[5], 4, Some(2), false, ms(3), o)).is_empty());
        assert_eq!(m.attempt(), Some(1));
        assert!(run(|o| m.parts_read(0, true, ms(4), o)).is_empty(), "stale");
        assert_eq!(
            run(|o| m.poll(true, Some(2), ms(6), o)),
            vec![C::ReadManifest {
                epoch: 2,
                attempt: 1
            }]
        );
        assert!(
            run(|o| m.manifest_read(0, true, ms(7), o)).is_empty(),
            "stale"
        );
        assert_eq!(run(|o| m.manifest_read(1, true, ms(8), o)), vec![C::Reset]);
        let out = run(|o| m.parts_read(1, true, ms(9), o));
        let [C::Restart(r)] = out.as_slice() else {
            panic!("{out:?}")
        };
        assert_eq!(
            (r.lost.clone(), r.started_over, r.epoch),
            (vec![1, 5], 1, Some(2))
        );
        assert_eq!(
            r.quiesce,
            ms(6),
            "from the loss to the last attempt's quiet point"
        );
        assert_eq!(r.read, ms(3), "the last attempt's reads");
    }

    /// A loss while the manifest is read (step 3) only adds its chunks: the read is of the
    /// snapshot every partition goes back to, and placement has not happened yet.
    #[test]
    fn a_loss_while_reading_adds_its_chunks() {
        let mut m = RollbackMachine::default();
        run(|o| m.lost(&[1], 4, Some(2), false, ms(0), o));
        run(|o| m.poll(true, Some(2), ms(1), o));
        assert!(run(|o| m.lost(&[0], 4, Some(2), false, ms(2), o)).is_empty());
        assert_eq!(run(|o| m.manifest_read(0, true, ms(3), o)), vec![C::Reset]);
        let out = run(|o| m.parts_read(0, true, ms(4), o));
        let [C::Restart(r)] = out.as_slice() else {
            panic!("{out:?}")
        };
        assert_eq!(r.lost, vec![0, 1]);
    }

    /// In the job's first phase, with no snapshot, the run starts that phase again: every
    /// partition is made anew from the job value (a partition done there and lost with its
    /// worker ended the job with `PartitionsLost`). The same when the first snapshot, being
    /// written at the loss, fails; in a later phase it is the end.
    #[test]
    fn a_loss_in_the_first_phase_without_a_snapshot_starts_it_again() {
        let mut m = RollbackMachine::default();
        assert_eq!(
            run(|o| m.lost(&[3], 0, None, false, ms(0), o)),
            vec![
                C::Started {
                    lost: vec![3],
                    epoch: None
                },
                C::Halt
            ]
        );
        assert_eq!(
            run(|o| m.poll(true, None, ms(4), o)),
            vec![C::Rebuild { attempt: 0 }]
        );
        assert_eq!(run(|o| m.manifest_read(0, true, ms(5), o)), vec![C::Reset]);
        let out = run(|o| m.parts_read(0, true, ms(6), o));
        let [C::Restart(r)] = out.as_slice() else {
            panic!("{out:?}")
        };
        assert_eq!((r.epoch, r.from_phase, r.lost.clone()), (None, 0, vec![3]));

        // The first snapshot was being written and failed: the first phase starts again.
        let mut m = RollbackMachine::default();
        assert_eq!(
            run(|o| m.lost(&[3], 0, None, true, ms(0), o)),
            vec![C::Halt]
        );
        assert_eq!(
            run(|o| m.poll(true, None, ms(4), o)),
            vec![
                C::Started {
                    lost: vec![3],
                    epoch: None
                },
                C::Rebuild { attempt: 0 }
            ]
        );
        // In a later phase, the same failed write ends the job.
        let mut m = RollbackMachine::default();
        run(|o| m.lost(&[3], 1, None, true, ms(0), o));
        assert_eq!(
            run(|o| m.poll(true, None, ms(4), o)),
            vec![C::NothingToRollBackTo { lost: vec![3] }]
        );
    }

    #[test]
    fn a_read_that_fails_ends_the_job_naming_the_snapshot() {
        for manifest_fails in [true, false] {
            let mut m = RollbackMachine::default();
            run(|o| m.lost(&[1], 4, Some(8), false, ms(0), o));
            run(|o| m.poll(true, Some(8), ms(1), o));
            let out = run(|o| {
                m.manifest_read(0, !manifest_fails, ms(2), o);
                if !manifest_fails {
                    o.clear();
                    m.parts_read(0, false, ms(3), o);
                }
            });
            assert_eq!(
                out,
                vec![C::Failed {
                    lost: vec![1],
                    epoch: 8
                }]
            );
            assert!(!m.is_under_way());
        }
    }
}
