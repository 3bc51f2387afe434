//! Pipe I/O that cannot hang the executor: a reader or writer over a
//! non-blocking pipe of the child that waits in short polls, and gives up
//! at the call's deadline, or once the role's stop signal has been triggered for
//! the grace. The conversation wraps its stdin and stdout in one per call;
//! the error kind says which (`TimedOut`, `ConnectionAborted`), so the
//! child's ending can be named.

use std::io::{Read, Write};
use std::time::{Duration, Instant};
use trainyard_confined::shm;
use trainyard_shutdown::Shutdown;

/// A reader/writer over a non-blocking pipe that gives up at a deadline
/// or once stop has been set for [`STOP_GRACE`](super::STOP_GRACE).
pub(super) struct Timed<'a, F> {
    pub(super) fd: std::os::fd::RawFd,
    pub(super) io: F,
    pub(super) deadline: Instant,
    pub(super) stop: &'a Shutdown,
    pub(super) grace: Duration,
    pub(super) stopped_at: Option<Instant>,
}

impl<F> Timed<'_, F> {
    fn wait(&mut self, write: bool) -> std::io::Result<()> {
        loop {
            if Instant::now() >= self.deadline {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "deadline",
                ));
            }
            if self.stop.is_triggered() {
                let at = *self.stopped_at.get_or_insert_with(Instant::now);
                if at.elapsed() >= self.grace {
                    // Not `Interrupted`: read_exact and write_all retry that.
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::ConnectionAborted,
                        "stopped",
                    ));
                }
            }
            if shm::ready(self.fd, write, Duration::from_millis(100))? {
                return Ok(());
            }
        }
    }
}

impl<R: Read> Read for Timed<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            self.wait(false)?;
            match self.io.read(buf) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                other => return other,
            }
        }
    }
}

impl<W: Write> Write for Timed<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        loop {
            self.wait(true)?;
            match self.io.write(buf) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                other => return other,
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.io.flush()
    }
}
