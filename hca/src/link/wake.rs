//! Waking a progress thread that sleeps in [`RoceSocket::wait`](super::udp::RoceSocket::wait).
//!
//! A device's progress thread blocks in poll(2) on its socket while nothing is to be done. When
//! the application posts a work request (or closes the device) the thread must wake up at once,
//! not at its next timeout: the poster calls [`Waker::wake`], which makes an eventfd(2) readable;
//! `wait` polls that eventfd together with the socket and reports `woken`.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use super::error::LinkError;
use super::sys;

/// An eventfd(2) that one thread waits on and any thread can make ready. Share it with an
/// `Arc<Waker>`; it is `Send + Sync`.
#[derive(Debug)]
pub struct Waker {
    fd: OwnedFd,
}

impl Waker {
    /// A new waker, not woken.
    ///
    /// Errors: [`LinkError::Waker`] (`"eventfd"`) when the process is out of descriptors.
    pub fn new() -> Result<Waker, LinkError> {
        let fd = sys::eventfd().map_err(|source| LinkError::Waker {
            op: "eventfd",
            source,
        })?;
        Ok(Waker { fd })
    }

    /// Wakes the waiter (now, or its next wait if it is not waiting). Several wakes before the
    /// waiter looks count as one.
    ///
    /// Errors: [`LinkError::Waker`] (`"write"`), which eventfd(2) only returns for a closed or
    /// invalid descriptor.
    pub fn wake(&self) -> Result<(), LinkError> {
        sys::eventfd_add(self.fd.as_fd(), 1).map_err(|source| LinkError::Waker {
            op: "write",
            source,
        })
    }

    /// Whether [`wake`](Self::wake) was called since the last call; resets the waker.
    ///
    /// Errors: [`LinkError::Waker`] (`"read"`).
    pub fn take(&self) -> Result<bool, LinkError> {
        sys::eventfd_take(self.fd.as_fd())
            .map(|n| n > 0)
            .map_err(|source| LinkError::Waker { op: "read", source })
    }
}

impl Waker {
    /// Sleeps in poll(2) until the waker is woken or `timeout` passes, then resets it; returns
    /// whether it was woken. A wake that came before the call returns at once.
    ///
    /// Errors: [`LinkError::Waker`] (`"poll"`, `"read"`).
    pub fn wait(&self, timeout: Duration) -> Result<bool, LinkError> {
        sys::poll([(self.fd.as_fd(), libc::POLLIN)], timeout)
            .map_err(|source| LinkError::Waker { op: "poll", source })?;
        self.take()
    }
}

impl AsFd for Waker {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wake_then_take() {
        let w = Waker::new().unwrap();
        assert!(!w.take().unwrap());
        w.wake().unwrap();
        w.wake().unwrap();
        assert!(w.take().unwrap());
        assert!(!w.take().unwrap());
    }

    #[test]
    fn wait_returns_on_a_wake_or_the_timeout() {
        let w = Waker::new().unwrap();
        assert!(!w.wait(Duration::from_millis(1)).unwrap());
        w.wake().unwrap();
        assert!(w.wait(Duration::from_secs(60)).unwrap());
        assert!(!w.take().unwrap());
    }
}
