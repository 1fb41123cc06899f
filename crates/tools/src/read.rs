//! The Read tool: a workspace file as numbered lines (`cat -n` style), a window at a time.

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::context::{ToolContext, ToolOutput, finish};
use crate::error::ToolError;
use crate::fsutil::{SNIFF_BYTES, looks_binary, open_read, truncate_line};
use crate::input::{optional_positive, required_str};
use crate::workspace::Access;

/// Runs Read `{file_path, offset?, limit?}`.
pub async fn run(input: &Value, ctx: &ToolContext) -> ToolOutput {
    finish(read(input, ctx).await)
}

async fn read(input: &Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
    let file_path = required_str(input, "file_path")?;
    let offset = optional_positive(input, "offset")?.unwrap_or(1);
    let limit = optional_positive(input, "limit")?.map_or(ctx.limits.read_lines as u64, |n| n);
    let path = ctx.workspace.resolve(file_path, Access::Read)?;
    let meta = tokio::fs::metadata(&path)
        .await
        .map_err(|e| ToolError::io(file_path, e))?;
    if meta.is_dir() {
        return Err(ToolError::rejected(format!(
            "{file_path} is a directory, not a file; use Glob to list its files"
        )));
    }
    // A FIFO or device would block the open or never end; only regular files are read.
    if !meta.is_file() {
        return Err(ToolError::rejected(format!(
            "{file_path} is not a regular file"
        )));
    }
    let file = open_read(&ctx.workspace, &path, file_path).await?;
    let mut reader = BufReader::with_capacity(SNIFF_BYTES, file);
    let head = reader
        .fill_buf()
        .await
        .map_err(|e| ToolError::io(file_path, e))?;
    if looks_binary(head) {
        return Err(ToolError::rejected(format!(
            "{file_path} looks like a binary file; Read only shows text"
        )));
    }
    let window = Window {
        first: offset,
        count: limit,
        line_chars: ctx.limits.line_chars,
    };
    let text = window
        .collect(&mut reader)
        .await
        .map_err(|e| ToolError::io(file_path, e))?;
    Ok(ToolOutput::ok(text.render(file_path, offset)))
}

/// Which lines to show.
struct Window {
    /// 1-based number of the first line shown.
    first: u64,
    count: u64,
    line_chars: usize,
}

/// What a window collected.
struct Collected {
    body: String,
    shown: u64,
    /// Lines seen in total (all of them unless the window stopped early).
    seen: u64,
    more: bool,
}

impl Window {
    /// Streams lines so a huge file costs only the lines shown, not its whole size.
    async fn collect<R: AsyncBufReadExt + Unpin>(
        &self,
        reader: &mut R,
    ) -> std::io::Result<Collected> {
        let mut out = Collected {
            body: String::new(),
            shown: 0,
            seen: 0,
            more: false,
        };
        let mut buf = Vec::new();
        loop {
            buf.clear();
            if reader.read_until(b'\n', &mut buf).await? == 0 {
                return Ok(out);
            }
            out.seen += 1;
            if out.seen < self.first {
                continue;
            }
            if out.shown == self.count {
                out.more = true;
                return Ok(out);
            }
            let line = String::from_utf8_lossy(&buf);
            let line = line.trim_end_matches(['\n', '\r']);
            let line = truncate_line(line, self.line_chars);
            out.body.push_str(&format!("{:>6}\t{line}\n", out.seen));
            out.shown += 1;
        }
    }
}

impl Collected {
    fn render(mut self, file_path: &str, offset: u64) -> String {
        if self.seen == 0 {
            return format!("(file {file_path} is empty)");
        }
        if self.shown == 0 {
            return format!(
                "(file {file_path} has {} lines; offset {offset} is past the end)",
                self.seen
            );
        }
        if self.more {
            let next = offset + self.shown;
            self.body.push_str(&format!(
                "… (more lines follow; continue with offset {next})\n"
            ));
        }
        self.body
    }
}
