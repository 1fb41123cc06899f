//! File helpers shared by the tools: opening without following a final symlink, binary
//! sniffing and line truncation.

use std::io;
use std::path::Path;

use tokio::fs::{File, OpenOptions};
use tokio::io::AsyncWriteExt;

use crate::error::ToolError;

/// How many leading bytes decide whether a file is binary (the same heuristic as git and grep).
pub(crate) const SNIFF_BYTES: usize = 8192;

/// A NUL byte near the start means binary: text encodings the model can use never contain one.
pub(crate) fn looks_binary(bytes: &[u8]) -> bool {
    bytes[..bytes.len().min(SNIFF_BYTES)].contains(&0)
}

/// Opens a path that `Workspace::resolve` already made canonical, refusing to follow the final
/// component if it has become a symlink since (the cheap half of the TOCTOU mitigation).
pub(crate) async fn open_read(path: &Path, shown: &str) -> Result<File, ToolError> {
    let mut options = OpenOptions::new();
    options.read(true).custom_flags(libc::O_NOFOLLOW);
    options.open(path).await.map_err(|e| open_error(shown, e))
}

/// Creates or truncates `path` and writes `bytes`, never through a final symlink.
pub(crate) async fn write_file(path: &Path, shown: &str, bytes: &[u8]) -> Result<(), ToolError> {
    let mut options = OpenOptions::new();
    options
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_NOFOLLOW);
    let mut file = options.open(path).await.map_err(|e| open_error(shown, e))?;
    file.write_all(bytes)
        .await
        .map_err(|e| ToolError::io(shown, e))?;
    // Flush to the kernel before reporting success, so a following Read or Bash sees the bytes.
    file.flush().await.map_err(|e| ToolError::io(shown, e))
}

fn open_error(shown: &str, err: io::Error) -> ToolError {
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
mod tests {
    use super::*;

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
