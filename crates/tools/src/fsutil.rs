//! File helpers shared by the tools: opening beneath the workspace's root without following a
//! link, binary sniffing and line truncation.

use std::io;
use std::path::Path;

use nix::fcntl::OFlag;
use tokio::fs::File;
use tokio::io::AsyncWriteExt;

use crate::Workspace;
use crate::error::ToolError;

/// How many leading bytes decide whether a file is binary (the same heuristic as git and grep).
pub(crate) const SNIFF_BYTES: usize = 8192;

/// A NUL byte near the start means binary: text encodings the model can use never contain one.
pub(crate) fn looks_binary(bytes: &[u8]) -> bool {
    bytes[..bytes.len().min(SNIFF_BYTES)].contains(&0)
}

/// Opens `path` (as [`Workspace::resolve`] returned it) for reading beneath the workspace's
/// root, following no link on the way ([`Workspace::open_beneath`]): a directory swapped for a
/// link since it was checked fails the open instead of leading elsewhere.
pub(crate) async fn open_read(ws: &Workspace, path: &Path, shown: &str) -> Result<File, ToolError> {
    let (ws, path) = (ws.clone(), path.to_path_buf());
    let opened = tokio::task::spawn_blocking(move || ws.open_beneath(&path, OFlag::O_RDONLY))
        .await
        .map_err(|e| ToolError::io(shown, io::Error::other(e.to_string())))?;
    match opened {
        Ok(fd) => Ok(File::from_std(std::fs::File::from(fd))),
        Err(errno) => Err(open_error(shown, io::Error::from(errno))),
    }
}

/// Creates or truncates `path` (as [`Workspace::resolve`] returned it) beneath the workspace's
/// root and writes `bytes`, following no link on the way.
pub(crate) async fn write_file(
    ws: &Workspace,
    path: &Path,
    shown: &str,
    bytes: &[u8],
) -> Result<(), ToolError> {
    let (ws, path) = (ws.clone(), path.to_path_buf());
    let opened = tokio::task::spawn_blocking(move || {
        ws.open_beneath(&path, OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_TRUNC)
    })
    .await
    .map_err(|e| ToolError::io(shown, io::Error::other(e.to_string())))?;
    let mut file = match opened {
        Ok(fd) => File::from_std(std::fs::File::from(fd)),
        Err(errno) => return Err(open_error(shown, io::Error::from(errno))),
    };
    file.write_all(bytes)
        .await
        .map_err(|e| ToolError::io(shown, e))?;
    // Flush to the kernel before reporting success, so a following Read or Bash sees the bytes.
    file.flush().await.map_err(|e| ToolError::io(shown, e))
}

fn open_error(shown: &str, err: io::Error) -> ToolError {
    if err.raw_os_error() == Some(libc::EXDEV) {
        return ToolError::rejected(format!(
            "{shown} is no longer inside the workspace; refusing to open it"
        ));
    }
    if err.raw_os_error() == Some(libc::ENXIO) {
        return ToolError::rejected(format!(
            "{shown} is not a regular file (a FIFO, socket or device); refusing to open it"
        ));
    }
    if err.raw_os_error() == Some(libc::ELOOP) {
        return ToolError::rejected(format!(
            "{shown} became a symbolic link after it was checked; refusing to follow it"
        ));
    }
    if err.kind() == io::ErrorKind::NotFound {
        return ToolError::NotFound {
            path: shown.to_owned(),
        };
    }
    ToolError::io(shown, err)
}

/// Cuts `line` to at most `max` characters, marking the cut.
pub(crate) fn truncate_line(line: &str, max: usize) -> String {
    match line.char_indices().nth(max) {
        None => line.to_owned(),
        Some((cut, _)) => format!("{}… [line truncated]", &line[..cut]),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::workspace::Access;

    /// A directory swapped for a link between the check and the write (a command racing the
    /// tool): the write fails, and nothing lands where the link points.
    #[tokio::test]
    async fn a_directory_swapped_for_a_link_after_the_check_leads_nowhere() {
        let dir = tempfile::tempdir().unwrap();
        let (ws_dir, outside) = (dir.path().join("ws"), dir.path().join("outside"));
        std::fs::create_dir_all(ws_dir.join("sub")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(ws_dir.join("sub/a.txt"), "in").unwrap();
        let ws = Workspace::new(&ws_dir).unwrap();
        let target = ws.resolve("sub/new.txt", Access::Write).unwrap();
        let read = ws.resolve("sub/a.txt", Access::Read).unwrap();
        // The race: `sub` becomes a link out of the workspace.
        std::fs::rename(ws_dir.join("sub"), ws_dir.join("moved")).unwrap();
        std::os::unix::fs::symlink(&outside, ws_dir.join("sub")).unwrap();
        std::fs::write(outside.join("a.txt"), "secret").unwrap();
        let err = write_file(&ws, &target, "sub/new.txt", b"x")
            .await
            .unwrap_err();
        assert!(err.to_string().contains("symbolic link"), "{err}");
        assert!(!outside.join("new.txt").exists());
        assert!(open_read(&ws, &read, "sub/a.txt").await.is_err());
    }

    #[test]
    fn truncation_counts_characters_not_bytes() {
        assert_eq!(truncate_line("héllo", 10), "héllo");
        assert_eq!(truncate_line("héllo", 2), "hé… [line truncated]");
        assert_eq!(truncate_line("ab", 2), "ab");
    }

    #[test]
    fn nul_means_binary() {
        assert!(looks_binary(b"ab\0cd"));
        assert!(!looks_binary("plain text, ünïcode".as_bytes()));
        let mut late = vec![b'a'; SNIFF_BYTES];
        late.push(0);
        assert!(!looks_binary(&late));
    }
}
