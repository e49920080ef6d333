//! How a local worker thread waits for its next chunk: it polls its mailbox for a while
//! before it sleeps.
//!
//! A thread that ends its share of a phase first waits for the barrier, which another thread
//! ends and which sends it its next chunk. Asleep, it is
//! woken through the kernel, and on this machine (2 virtual CPUs) that wake-up was most of
//! the fixed cost of a phase: 10-35 µs a phase with 2 local threads against 4 µs with 1
//! (`benches/phase_cost.rs`, 4 partitions); polling first, 5 µs. Rayon's idle threads also
//! poll before they sleep. A thread that gets nothing within [`SPIN`] sleeps: an idle pool
//! costs at most that much of a core per wait.
//!
//! A worker process's compute thread does not poll: its next chunk comes from its own I/O
//! thread, which sleeps in the kernel until the coordinator's message arrives, and which a
//! polling thread would delay on a machine with fewer cores than threads. (Tried with 2
//! processes of 4 partitions on 2 cores: phases of 210-280 µs with it, 246-306 without.)

use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvError, TryRecvError};

/// How long a thread with nothing to run polls its mailbox before it sleeps.
pub(crate) const SPIN: Duration = Duration::from_micros(50);

/// The next message of `rx`: polled for [`SPIN`], then waited for asleep. An error once
/// every sender is gone and the mailbox is empty, as [`Receiver::recv`].
pub(crate) fn receive<T>(rx: &Receiver<T>) -> Result<T, RecvError> {
    let start = Instant::now();
    loop {
        // The clock is read once every 64 polls.
        for _ in 0..64 {
            match rx.try_recv() {
                Ok(m) => return Ok(m),
                Err(TryRecvError::Disconnected) => return Err(RecvError),
                Err(TryRecvError::Empty) => std::hint::spin_loop(),
            }
        }
        if start.elapsed() >= SPIN {
            return rx.recv();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_sent_while_polling_or_asleep_is_received_and_a_closed_mailbox_ends() {
        let (tx, rx) = crossbeam_channel::unbounded();
        tx.send(1).unwrap();
        assert_eq!(receive(&rx), Ok(1));
        // Sent after the poll gave up: received asleep.
        let late = std::thread::spawn({
            let tx = tx.clone();
            move || {
                std::thread::sleep(SPIN * 20);
                tx.send(2).unwrap();
            }
        });
        assert_eq!(receive(&rx), Ok(2));
        late.join().unwrap();
        // Every sender gone: what is left is received, then the end.
        tx.send(3).unwrap();
        drop(tx);
        assert_eq!(receive(&rx), Ok(3));
        assert_eq!(receive(&rx), Err(RecvError));
    }
}
