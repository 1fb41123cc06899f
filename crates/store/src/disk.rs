//! The space on the filesystem that holds a database file.

use std::path::Path;

use forkd_core::store::DiskSpace;

/// The space on the filesystem holding `path`, as an unprivileged process sees it (the blocks
/// reserved for root are not counted as available).
pub(crate) fn space(path: &Path) -> std::io::Result<DiskSpace> {
    let stat = rustix::fs::statvfs(path)?;
    Ok(DiskSpace {
        path: path.to_owned(),
        available: stat.f_bavail.saturating_mul(stat.f_frsize),
        total: stat.f_blocks.saturating_mul(stat.f_frsize),
    })
}
