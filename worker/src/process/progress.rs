//! A runner's progress page, from the agent's side (see `protocol::PROGRESS_FD`): a shared
//! page in which the runner counts the `Run` requests it has begun. The runner writes it
//! with a plain store, no system call and no wake of the agent; the agent reads it only
//! once the runner has died, to tell the mini-batch it died in from those before it whose
//! replies it held back.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use fleetrun_common::protocol::PROGRESS_LEN;

/// The agent's read-only view of one runner's page.
#[derive(Debug)]
pub(super) struct Progress {
    count: NonNull<AtomicU64>,
}

// SAFETY: the mapping is only read, atomically, and lives until the value is dropped.
unsafe impl Send for Progress {}
unsafe impl Sync for Progress {}

impl Progress {
    /// A new page and the descriptor to hand the runner (closed on exec; the runner gets it
    /// as `PROGRESS_FD` only by a `dup2`).
    pub(super) fn new() -> io::Result<(Progress, OwnedFd)> {
        // SAFETY: each call is checked; the mapping is of a file of PROGRESS_LEN bytes,
        // aligned to a page, so its first 8 bytes hold a `u64` an `AtomicU64` may read.
        unsafe {
            let fd = libc::memfd_create(c"fleetrun-progress".as_ptr(), libc::MFD_CLOEXEC);
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            let fd = OwnedFd::from_raw_fd(fd);
            if libc::ftruncate(fd.as_raw_fd(), PROGRESS_LEN as i64) != 0 {
                return Err(io::Error::last_os_error());
            }
            let map = libc::mmap(
                std::ptr::null_mut(),
                PROGRESS_LEN,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            );
            if map == libc::MAP_FAILED {
                return Err(io::Error::last_os_error());
            }
            let count = NonNull::new(map.cast::<AtomicU64>()).expect("mmap gave a mapping");
            Ok((Progress { count }, fd))
        }
    }

    /// The `Run` requests the runner has begun.
    pub(super) fn begun(&self) -> u64 {
        // SAFETY: mapped while `self` lives.
        unsafe { self.count.as_ref() }.load(Ordering::Acquire)
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe {
            libc::munmap(self.count.as_ptr().cast(), PROGRESS_LEN);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a process writes through its own mapping of the page's descriptor is what the
    /// agent reads (the runner maps it the same way).
    #[test]
    fn a_count_written_through_the_descriptor_is_read() {
        let (progress, fd) = Progress::new().unwrap();
        assert_eq!(progress.begun(), 0);
        // SAFETY: a writable shared mapping of the same file, unmapped below.
        unsafe {
            let map = libc::mmap(
                std::ptr::null_mut(),
                PROGRESS_LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            );
            assert_ne!(map, libc::MAP_FAILED);
            (*map.cast::<AtomicU64>()).store(3, Ordering::Release);
            libc::munmap(map, PROGRESS_LEN);
        }
        assert_eq!(progress.begun(), 3);
    }
}
