//! The Grep tool: search workspace files with a regular expression.

use std::io::Read;
use std::path::{Path, PathBuf};

use regex::Regex;
use serde_json::Value;

use crate::cap::cap_text;
use crate::context::{ToolContext, ToolOutput, finish};
use crate::error::ToolError;
use crate::fsutil::{looks_binary, truncate_line};
use crate::input::{optional_str, required_str};
use crate::pattern::PathPattern;
use crate::walk::{CANCELLED, blocking, walk};
use crate::workspace::Access;

/// What Grep prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Paths of matching files (the default).
    Files,
    /// `path:line:text` for every matching line.
    Content,
    /// `path:count` for every matching file.
    Count,
}

impl Mode {
    fn parse(input: &Value) -> Result<Mode, ToolError> {
        match optional_str(input, "output_mode")? {
            None | Some("files_with_matches") => Ok(Mode::Files),
            Some("content") => Ok(Mode::Content),
            Some("count") => Ok(Mode::Count),
            Some(_) => Err(ToolError::WrongType {
                field: "output_mode",
                expected: "one of \"files_with_matches\", \"content\", \"count\"",
            }),
        }
    }
}

/// One output line with its sort key: (workspace-relative path, line number, text).
type Hit = (String, usize, String);

/// Everything one search needs, owned so it can move to a blocking thread.
struct Search {
    regex: Regex,
    filter: Option<PathPattern>,
    mode: Mode,
    base: PathBuf,
    workspace: crate::Workspace,
    line_chars: usize,
}

/// Runs Grep `{pattern, path?, glob?, output_mode?}`.
pub async fn run(input: &Value, ctx: &ToolContext) -> ToolOutput {
    finish(grep(input, ctx).await)
}

async fn grep(input: &Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
    let pattern = required_str(input, "pattern")?;
    let dir = optional_str(input, "path")?.unwrap_or(".");
    let mode = Mode::parse(input)?;
    let regex = Regex::new(pattern)
        .map_err(|e| ToolError::rejected(format!("invalid regular expression `{pattern}`: {e}")))?;
    let filter = match optional_str(input, "glob")? {
        None => None,
        Some(glob) => Some(
            PathPattern::new(glob)
                .map_err(|e| ToolError::rejected(format!("invalid glob `{glob}`: {e}")))?,
        ),
    };
    let search = Search {
        regex,
        filter,
        mode,
        base: ctx.workspace.resolve(dir, Access::Read)?,
        workspace: ctx.workspace.clone(),
        line_chars: ctx.limits.line_chars,
    };
    let cancel = ctx.cancel.clone();
    let (mut lines, complete) = blocking(move || {
        let mut lines = Vec::new();
        let complete = walk(&search.base, &search.workspace, &cancel, |entry| {
            // Regular files only: a symlink could lead out, a FIFO would block the read.
            if entry.file_type().is_some_and(|t| t.is_file()) {
                search.file(entry.path(), &mut lines);
            }
        });
        (lines, complete)
    })
    .await?;
    if !complete {
        return Err(ToolError::rejected(CANCELLED));
    }
    if lines.is_empty() {
        return Ok(ToolOutput::ok("No matches found"));
    }
    // By path, then by line number within a file, so the output is stable across runs.
    lines.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
    let lines: Vec<String> = lines.into_iter().map(|(_, _, line)| line).collect();
    let text = crate::glob::render(&lines, ctx.limits.max_results);
    Ok(ToolOutput::ok(cap_text(&text, ctx.limits.output_cap)))
}

impl Search {
    /// Searches one file, appending its output lines keyed by path and line number. Unreadable
    /// and binary files are skipped silently, as grep does: they are noise in a tree search.
    fn file(&self, path: &Path, out: &mut Vec<Hit>) {
        if !self.selected(path) {
            return;
        }
        let Some(text) = read_text(&self.workspace, path) else {
            return;
        };
        let rel = self.workspace.relative(path);
        match self.mode {
            Mode::Files => {
                if self.regex.is_match(&text) {
                    out.push((rel.clone(), 0, rel));
                }
            }
            Mode::Count => {
                let count = text.lines().filter(|l| self.regex.is_match(l)).count();
                if count > 0 {
                    out.push((rel.clone(), 0, format!("{rel}:{count}")));
                }
            }
            Mode::Content => {
                for (i, line) in text.lines().enumerate() {
                    if self.regex.is_match(line) {
                        let line = truncate_line(line, self.line_chars);
                        out.push((rel.clone(), i + 1, format!("{rel}:{}:{line}", i + 1)));
                    }
                }
            }
        }
    }

    /// Applies the `glob` filter to the path relative to the search base (its file name when
    /// the base is the file itself).
    fn selected(&self, path: &Path) -> bool {
        let Some(filter) = &self.filter else {
            return true;
        };
        match path.strip_prefix(&self.base) {
            Ok(rel) if !rel.as_os_str().is_empty() => filter.is_match(rel),
            _ => path
                .file_name()
                .is_some_and(|n| filter.is_match(Path::new(n))),
        }
    }
}

/// A file's text, or `None` for unreadable or binary files. Opened beneath the workspace's
/// root following no link ([`crate::Workspace::open_beneath`]): the walk saw a regular file
/// there, and a directory or the file swapped for a link since must not lead the read out.
fn read_text(workspace: &crate::Workspace, path: &Path) -> Option<String> {
    let fd = workspace
        .open_beneath(path, nix::fcntl::OFlag::O_RDONLY)
        .ok()?;
    let mut file = std::fs::File::from(fd);
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).ok()?;
    if looks_binary(&bytes) {
        return None;
    }
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A file the walk listed whose directory is swapped for a link out of the workspace before
    /// it is read: nothing is read through the link.
    #[test]
    fn a_directory_swapped_for_a_link_after_the_walk_is_not_read_through() {
        let dir = tempfile::tempdir().unwrap();
        let (ws_dir, outside) = (dir.path().join("ws"), dir.path().join("outside"));
        std::fs::create_dir_all(ws_dir.join("sub")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(ws_dir.join("sub/a.txt"), "mine").unwrap();
        let ws = crate::Workspace::new(&ws_dir).unwrap();
        let listed = ws.resolve("sub/a.txt", Access::Read).unwrap();
        assert_eq!(read_text(&ws, &listed).as_deref(), Some("mine"));
        std::fs::rename(ws_dir.join("sub"), ws_dir.join("moved")).unwrap();
        std::os::unix::fs::symlink(&outside, ws_dir.join("sub")).unwrap();
        std::fs::write(outside.join("a.txt"), "secret").unwrap();
        assert_eq!(read_text(&ws, &listed), None);
    }
}
