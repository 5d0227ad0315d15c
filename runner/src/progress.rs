//! The runner's progress page (see `protocol::PROGRESS_FD`): it counts the `Run` requests
//! begun, with a plain store into memory the agent shares. The agent reads it once the
//! runner has died, so a runner that held replies back and then died is charged the
//! mini-batch it died in, not the oldest whose reply it held.

use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use fleetrun_common::protocol::{PROGRESS_FD, PROGRESS_LEN};

pub struct Progress {
    count: NonNull<AtomicU64>,
    begun: u64,
}

impl Progress {
    /// Maps the page the agent handed over on [`PROGRESS_FD`], then closes that descriptor
    /// (the mapping stays), so the script's subprocesses never hold it.
    pub fn open() -> io::Result<Progress> {
        // SAFETY: each call is checked; `fstat` writes into `stat`; the mapping is of a file
        // at least PROGRESS_LEN long, aligned to a page, so it holds an `AtomicU64`.
        unsafe {
            let mut stat: libc::stat = std::mem::zeroed();
            if libc::fstat(PROGRESS_FD, &mut stat) != 0 {
                return Err(io::Error::last_os_error());
            }
            if stat.st_mode & libc::S_IFMT != libc::S_IFREG
                || (stat.st_size as usize) < PROGRESS_LEN
            {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "file descriptor 4 is not a progress page",
                ));
            }
            let map = libc::mmap(
                std::ptr::null_mut(),
                PROGRESS_LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                PROGRESS_FD,
                0,
            );
            let mapped = if map == libc::MAP_FAILED {
                Err(io::Error::last_os_error())
            } else {
                Ok(map)
            };
            libc::close(PROGRESS_FD);
            let count = NonNull::new(mapped?.cast::<AtomicU64>()).expect("mmap gave a mapping");
            Ok(Progress { count, begun: 0 })
        }
    }

    /// Notes that the runner begins its next `Run` request.
    pub fn begin(&mut self) {
        self.begun += 1;
        // SAFETY: mapped for the process's life (never unmapped: the agent reads it after the
        // runner has gone).
        unsafe { self.count.as_ref() }.store(self.begun, Ordering::Release);
    }
}
