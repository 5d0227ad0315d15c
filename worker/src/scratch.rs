//! The folders a node writes into on its own account (staged inputs, the parts' segments),
//! and the system error of one that cannot take what the node writes there.
//!
//! Such a failure is the node's, never the item's: another attempt would meet it again, so
//! it fails the job with a cause that names the folder instead of spending attempts and
//! blaming items.

use std::io;
use std::path::{Path, PathBuf};

/// A folder of the node's own that cannot take what the node writes there: full, over its
/// quota, read-only, not writable, or not a folder at all.
#[derive(Debug, thiserror::Error)]
#[error("the folder {} {}: {source}", folder.display(), self.state())]
pub struct FolderError {
    pub folder: PathBuf,
    pub source: io::Error,
}

impl FolderError {
    /// Creating `folder` itself failed: whatever the cause, it is the folder's.
    pub fn new(folder: &Path, source: io::Error) -> FolderError {
        FolderError {
            folder: folder.to_path_buf(),
            source,
        }
    }

    /// Writing a file (or a folder) under `folder` failed: the folder's failure when the file
    /// system refuses to take more there, else (`Err`) the file's own, such as a name that
    /// cannot be a path there.
    pub fn of_write(folder: &Path, source: io::Error) -> Result<FolderError, io::Error> {
        match source.raw_os_error() {
            Some(
                libc::ENOSPC
                | libc::EDQUOT
                | libc::EFBIG
                | libc::EROFS
                | libc::EIO
                | libc::EACCES
                | libc::EPERM
                | libc::ENOENT,
            ) => Ok(FolderError::new(folder, source)),
            _ => Err(source),
        }
    }

    /// The folder is out of room (full, over its quota, or past a file size limit): freeing
    /// space helps.
    pub fn is_out_of_space(&self) -> bool {
        matches!(
            self.source.raw_os_error(),
            Some(libc::ENOSPC | libc::EDQUOT | libc::EFBIG)
        )
    }

    /// What is wrong with the folder, in a few words.
    pub fn state(&self) -> &'static str {
        match self.source.raw_os_error() {
            Some(libc::ENOSPC) => "is full",
            Some(libc::EDQUOT) => "is over its disk quota",
            Some(libc::EFBIG) => "cannot hold a file that large",
            Some(libc::EROFS) => "is read-only",
            Some(libc::EIO) => "cannot be written",
            Some(libc::EACCES | libc::EPERM) => "is not writable",
            _ => "cannot be made or used",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_or_unwritable_is_the_folders_and_a_name_clash_is_the_files() {
        let folder = Path::new("/scratch");
        for errno in [libc::ENOSPC, libc::EDQUOT, libc::EFBIG, libc::EROFS] {
            let e = FolderError::of_write(folder, io::Error::from_raw_os_error(errno));
            assert!(e.is_ok(), "{errno}");
        }
        for errno in [
            libc::ENOTDIR,
            libc::EEXIST,
            libc::EISDIR,
            libc::ENAMETOOLONG,
        ] {
            let e = FolderError::of_write(folder, io::Error::from_raw_os_error(errno));
            assert!(e.is_err(), "{errno}");
        }
        let full = FolderError::new(folder, io::Error::from_raw_os_error(libc::ENOSPC));
        assert!(
            full.to_string()
                .starts_with("the folder /scratch is full: "),
            "{full}"
        );
    }
}
