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
    write_file(&path, file_path, content.as_bytes()).await?;
    let rel = ctx.workspace.relative(&path);
    let verb = if existed { "Overwrote" } else { "Created" };
    let unit = if content.len() == 1 { "byte" } else { "bytes" };
    Ok(ToolOutput {
        content: format!("{verb} {rel} ({} {unit})", content.len()),
        is_error: false,
        files_changed: vec![rel],
    })
}

/// Creates the missing parents, then checks that the directory we are about to write into is
/// still the one that was checked: a concurrent process swapping a component for a symlink in
/// the meantime would make it resolve elsewhere.
async fn create_parents(
    workspace: &crate::Workspace,
    parent: &std::path::Path,
    file_path: &str,
) -> Result<(), ToolError> {
    tokio::fs::create_dir_all(parent)
        .await
        .map_err(|e| ToolError::io(file_path, e))?;
    let now = workspace.resolve(&workspace.relative(parent), Access::Read);
    if now.ok().as_deref() != Some(parent) {
        return Err(ToolError::rejected(format!(
            "the directory of {file_path} changed while it was being created; refusing to write"
        )));
    }
    Ok(())
}
