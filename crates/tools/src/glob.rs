//! The Glob tool: workspace files whose path (relative to `path`, default the workspace root)
//! matches a glob, newest first.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use globset::GlobBuilder;
use serde_json::Value;

use crate::context::{ToolContext, ToolOutput, finish};
use crate::error::ToolError;
use crate::input::{optional_str, required_str};
use crate::walk::{CANCELLED, blocking, walk};
use crate::workspace::Access;

/// Runs Glob `{pattern, path?}`.
pub async fn run(input: &Value, ctx: &ToolContext) -> ToolOutput {
    finish(glob(input, ctx).await)
}

async fn glob(input: &Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
    let pattern = required_str(input, "pattern")?;
    let dir = optional_str(input, "path")?.unwrap_or(".");
    if Path::new(pattern).is_absolute() {
        return Err(ToolError::rejected(format!(
            "pattern `{pattern}` is absolute; give a pattern relative to `path` (the workspace \
             root by default), e.g. `**/*.rs`"
        )));
    }
    let matcher = GlobBuilder::new(pattern.trim_start_matches("./"))
        .literal_separator(true)
        .build()
        .map_err(|e| ToolError::rejected(format!("invalid glob pattern `{pattern}`: {e}")))?
        .compile_matcher();
    let base = base_dir(ctx, dir).await?;
    let cancel = ctx.cancel.clone();
    let search_base = base.clone();
    let workspace = ctx.workspace.clone();
    let (mut found, complete) = blocking(move || {
        let mut found: Vec<(Option<SystemTime>, PathBuf)> = Vec::new();
        let complete = walk(&search_base, &workspace, &cancel, |entry| {
            let rel = entry
                .path()
                .strip_prefix(&search_base)
                .unwrap_or(entry.path());
            if matcher.is_match(rel) {
                let modified = entry.metadata().ok().and_then(|m| m.modified().ok());
                found.push((modified, entry.path().to_path_buf()));
            }
        });
        (found, complete)
    })
    .await?;
    if !complete {
        return Err(ToolError::rejected(CANCELLED));
    }
    // Newest first, so what the agent (or its siblings) just touched comes first; then by path
    // so equal times still give a stable order.
    found.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    let paths: Vec<String> = found
        .iter()
        .map(|(_, path)| ctx.workspace.relative(path))
        .collect();
    Ok(ToolOutput::ok(render(&paths, ctx.limits.max_results)))
}

/// Resolves Glob's and Grep's `path`, which must be an existing directory for Glob.
async fn base_dir(ctx: &ToolContext, dir: &str) -> Result<PathBuf, ToolError> {
    let base = ctx.workspace.resolve(dir, Access::Read)?;
    if !tokio::fs::metadata(&base).await.is_ok_and(|m| m.is_dir()) {
        return Err(ToolError::rejected(format!("{dir} is not a directory")));
    }
    Ok(base)
}

/// One path a line, capped with a note saying how many were left out.
pub(crate) fn render(lines: &[String], max: usize) -> String {
    if lines.is_empty() {
        return "No files found".to_owned();
    }
    let mut out = lines[..lines.len().min(max)].join("\n");
    if lines.len() > max {
        out.push_str(&format!(
            "\n… ({} more results not shown: {} in total; narrow the pattern or the path)",
            lines.len() - max,
            lines.len()
        ));
    }
    out
}
