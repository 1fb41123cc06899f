//! The Edit tool: replace an exact string in a workspace file.

use serde_json::Value;
use tokio::io::AsyncReadExt;

use crate::context::{ToolContext, ToolOutput, finish};
use crate::error::ToolError;
use crate::fsutil::{looks_binary, open_read, write_file};
use crate::input::{optional_bool, required_str};
use crate::workspace::Access;

/// Runs Edit `{file_path, old_string, new_string, replace_all?}`.
pub async fn run(input: &Value, ctx: &ToolContext) -> ToolOutput {
    finish(edit(input, ctx).await)
}

async fn edit(input: &Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
    let file_path = required_str(input, "file_path")?;
    let old = required_str(input, "old_string")?;
    let new = required_str(input, "new_string")?;
    let replace_all = optional_bool(input, "replace_all")?;
    if old.is_empty() {
        return Err(ToolError::rejected(
            "old_string is empty; use Write to create or overwrite a whole file",
        ));
    }
    if old == new {
        return Err(ToolError::rejected(
            "old_string and new_string are identical; there is nothing to change",
        ));
    }
    let path = ctx.workspace.resolve(file_path, Access::Read)?;
    let text = read_text(&ctx.workspace, &path, file_path).await?;
    let found = text.matches(old).count();
    if found == 0 {
        return Err(ToolError::rejected(format!(
            "old_string was not found in {file_path}; Read the file and copy the text exactly, \
             including whitespace"
        )));
    }
    if found > 1 && !replace_all {
        return Err(ToolError::rejected(format!(
            "old_string occurs {found} times in {file_path}; add surrounding context to make it \
             unique, or set replace_all to change every occurrence"
        )));
    }
    let updated = if replace_all {
        text.replace(old, new)
    } else {
        text.replacen(old, new, 1)
    };
    write_file(&ctx.workspace, &path, file_path, updated.as_bytes()).await?;
    let rel = ctx.workspace.relative(&path);
    let noun = if found == 1 {
        "occurrence"
    } else {
        "occurrences"
    };
    Ok(ToolOutput {
        content: format!("Replaced {found} {noun} in {rel}"),
        is_error: false,
        files_changed: vec![rel],
    })
}

/// The whole file as UTF-8; Edit refuses anything else rather than corrupt it.
async fn read_text(
    ws: &crate::Workspace,
    path: &std::path::Path,
    file_path: &str,
) -> Result<String, ToolError> {
    match tokio::fs::metadata(path).await {
        Ok(meta) if meta.is_dir() => {
            return Err(ToolError::rejected(format!(
                "{file_path} is a directory, not a file"
            )));
        }
        // A FIFO or device would block or never end; only regular files are edited.
        Ok(meta) if !meta.is_file() => {
            return Err(ToolError::rejected(format!(
                "{file_path} is not a regular file"
            )));
        }
        _ => {}
    }
    let mut file = open_read(ws, path, file_path).await?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)
        .await
        .map_err(|e| ToolError::io(file_path, e))?;
    if looks_binary(&bytes) {
        return Err(ToolError::rejected(format!(
            "{file_path} looks like a binary file; Edit only changes text"
        )));
    }
    String::from_utf8(bytes).map_err(|_| {
        ToolError::rejected(format!(
            "{file_path} is not valid UTF-8; Edit only changes UTF-8 text"
        ))
    })
}
