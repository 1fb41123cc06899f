//! The Write tool: create or overwrite a workspace file, creating its parent directories.

use serde_json::Value;

use crate::context::{ToolContext, ToolOutput, finish};
use crate::error::ToolError;
use crate::fsutil::write_file;
use crate::input::required_str;
use crate::workspace::Access;

/// Runs Write `{file_path, content}`.
pub async fn run(input: &Value, ctx: &ToolContext) -> ToolOutput {
    finish(write(input, ctx).await)
}

async fn write(input: &Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
    let file_path = required_str(input, "file_path")?;
    let content = required_str(input, "content")?;
    let path = ctx.workspace.resolve(file_path, Access::Write)?;
    let existed = match tokio::fs::symlink_metadata(&path).await {
        Ok(meta) if meta.is_dir() => {
            return Err(ToolError::rejected(format!(
                "{file_path} is a directory; Write needs a file path"
            )));
        }
        // Opening a FIFO for writing blocks until someone reads it.
        Ok(meta) if !meta.is_file() => {
            return Err(ToolError::rejected(format!(
                "{file_path} exists and is not a regular file"
            )));
        }
        Ok(_) => true,
        Err(_) => false,
    };
    if let Some(parent) = path.parent() {
        create_parents(&ctx.workspace, parent, file_path).await?;
    }
    write_file(&ctx.workspace, &path, file_path, content.as_bytes()).await?;
    let rel = ctx.workspace.relative(&path);
    let verb = if existed { "Overwrote" } else { "Created" };
    let unit = if content.len() == 1 { "byte" } else { "bytes" };
    Ok(ToolOutput {
        content: format!("{verb} {rel} ({} {unit})", content.len()),
        is_error: false,
        files_changed: vec![rel],
    })
}

/// Creates the missing parents beneath the workspace's root, one at a time and following no
/// link ([`crate::Workspace::create_dirs_beneath`]): a directory swapped for a link meanwhile
/// stops it instead of leading it elsewhere.
async fn create_parents(
    workspace: &crate::Workspace,
    parent: &std::path::Path,
    file_path: &str,
) -> Result<(), ToolError> {
    let (ws, dir) = (workspace.clone(), parent.to_path_buf());
    let made = tokio::task::spawn_blocking(move || ws.create_dirs_beneath(&dir))
        .await
        .map_err(|e| ToolError::io(file_path, std::io::Error::other(e.to_string())))?;
    match made {
        Ok(()) => Ok(()),
        Err(nix::errno::Errno::ELOOP | nix::errno::Errno::ENOTDIR | nix::errno::Errno::EXDEV) => {
            Err(ToolError::rejected(format!(
                "the directory of {file_path} changed while it was being created; refusing to \
                 write"
            )))
        }
        Err(errno) => Err(ToolError::io(file_path, std::io::Error::from(errno))),
    }
}
