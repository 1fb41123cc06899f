//! The built-in tool definitions, as the model sees them (docs/contracts.md, “Tool inputs”).

use serde_json::json;

use crate::json::RawJson;
use crate::session::ToolDef;

/// The name of the tool that forks (without `subagent_type`) or starts a typed agent.
pub const AGENT_TOOL: &str = "Agent";

fn def(name: &str, description: &str, schema: serde_json::Value) -> ToolDef {
    ToolDef {
        name: name.to_owned(),
        raw: RawJson::encode(&json!({
            "name": name,
            "description": description,
            "input_schema": schema,
        })),
    }
}

fn object(properties: serde_json::Value, required: &[&str]) -> serde_json::Value {
    json!({"type": "object", "properties": properties, "required": required})
}

/// forkd's built-in tools, unsorted (the pool sorts them).
pub fn builtin_definitions() -> Vec<ToolDef> {
    vec![
        def(
            "Read",
            "Read a file in the workspace. Lines are numbered; use offset and limit for large files.",
            object(
                json!({
                    "file_path": {"type": "string", "description": "Path relative to the workspace, or absolute inside it."},
                    "offset": {"type": "integer", "description": "First line to read (1-based)."},
                    "limit": {"type": "integer", "description": "Number of lines to read."}
                }),
                &["file_path"],
            ),
        ),
        def(
            "Write",
            "Create or overwrite a file in the workspace.",
            object(
                json!({
                    "file_path": {"type": "string"},
                    "content": {"type": "string"}
                }),
                &["file_path", "content"],
            ),
        ),
        def(
            "Edit",
            "Replace an exact string in a file. old_string must be unique unless replace_all is set.",
            object(
                json!({
                    "file_path": {"type": "string"},
                    "old_string": {"type": "string"},
                    "new_string": {"type": "string"},
                    "replace_all": {"type": "boolean"}
                }),
                &["file_path", "old_string", "new_string"],
            ),
        ),
        def(
            "Glob",
            "Find files in the workspace by glob pattern.",
            object(
                json!({
                    "pattern": {"type": "string"},
                    "path": {"type": "string"}
                }),
                &["pattern"],
            ),
        ),
        def(
            "Grep",
            "Search file contents with a regular expression.",
            object(
                json!({
                    "pattern": {"type": "string"},
                    "path": {"type": "string"},
                    "glob": {"type": "string"},
                    "output_mode": {"type": "string", "enum": ["content", "files_with_matches", "count"]}
                }),
                &["pattern"],
            ),
        ),
        def(
            "Bash",
            "Run a shell command in the workspace, with a timeout (seconds).",
            object(
                json!({
                    "command": {"type": "string"},
                    "timeout": {"type": "integer"}
                }),
                &["command"],
            ),
        ),
        def(
            AGENT_TOOL,
            "Start an agent. Without subagent_type the agent is a fork of you: it inherits your whole \
             context and works in the background. Call it several times in one message to fork a batch. \
             With subagent_type it is a typed agent with its own prompt and tools.",
            object(
                json!({
                    "description": {"type": "string", "description": "A short (3-5 word) description of the task."},
                    "prompt": {"type": "string", "description": "The task for the agent."},
                    "subagent_type": {"type": "string"}
                }),
                &["description", "prompt"],
            ),
        ),
    ]
}
