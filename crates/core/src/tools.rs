//! The built-in tool definitions, as the model sees them (docs/contracts.md, “Tool inputs”).

use serde_json::json;

use crate::json::RawJson;
use crate::session::ToolDef;

/// The name of the tool that forks (without `subagent_type`) or starts a typed agent.
pub const AGENT_TOOL: &str = "Agent";

/// The read-only tool that tells a session's model how busy the daemon is (off by default; a
/// session created with `capacity_tool` has it).
pub const CAPACITY_TOOL: &str = "Capacity";

/// The prefix of every MCP tool's name in a session's pool: `mcp__SERVER__TOOL`.
pub const MCP_PREFIX: &str = "mcp__";

/// Whether `pattern` (an entry of a rule or of a type's `tools:`) names `tool`: the tool's own
/// name, or for MCP tools `mcp__SERVER__*` (a prefix) or `mcp__SERVER` (every tool of the
/// server: a server's name has no second `__`, a tool's does).
pub fn names_tool(pattern: &str, tool: &str) -> bool {
    if pattern == tool {
        return true;
    }
    if !pattern.starts_with(MCP_PREFIX) || !tool.starts_with(MCP_PREFIX) {
        return false;
    }
    match pattern.strip_suffix('*') {
        Some(prefix) => tool.starts_with(prefix),
        None => {
            !pattern[MCP_PREFIX.len()..].contains("__")
                && tool
                    .strip_prefix(pattern)
                    .is_some_and(|rest| rest.starts_with("__"))
        }
    }
}

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

/// An agent type as the `Agent` tool's description lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentTypeListing<'a> {
    pub name: &'a str,
    /// When to use it.
    pub description: &'a str,
}

/// The most types the `Agent` tool's description lists, and the most characters of each one's
/// description: the list is in every request of the session, children's included.
const LISTED_TYPES: usize = 50;
const TYPE_DESCRIPTION_CHARS: usize = 300;

const AGENT_DESCRIPTION: &str = "Start an agent. Without subagent_type the agent is a fork of \
     you: it inherits your whole context and works in the background. Call it several times in one \
     message to fork a batch. With subagent_type it is a typed agent with its own prompt and tools; \
     you get its report as the call's result.";

/// The `Agent` tool's description: what it does and, when there are any, the agent types a
/// `subagent_type` may name, with when to use each.
fn agent_description(types: &[AgentTypeListing<'_>]) -> String {
    if types.is_empty() {
        return AGENT_DESCRIPTION.to_owned();
    }
    let mut text = format!("{AGENT_DESCRIPTION}\n\nAvailable agent types (subagent_type):");
    for ty in types.iter().take(LISTED_TYPES) {
        let line = ty
            .description
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        let mut clipped: String = line.chars().take(TYPE_DESCRIPTION_CHARS).collect();
        if line.chars().count() > TYPE_DESCRIPTION_CHARS {
            clipped.push('…');
        }
        text.push_str(&format!("\n- {}: {clipped}", ty.name));
    }
    if types.len() > LISTED_TYPES {
        text.push_str(&format!("\n(and {} more)", types.len() - LISTED_TYPES));
    }
    text
}

/// forkd's built-in tools, unsorted (the pool sorts them), with an `Agent` tool that lists no
/// agent types.
pub fn builtin_definitions() -> Vec<ToolDef> {
    builtin_definitions_with_types(&[])
}

/// forkd's built-in tools, unsorted (the pool sorts them); the `Agent` tool's description lists
/// `types`. A session's tools are built once, when it is created, so a type defined later never
/// changes them (nor the cache of any request made with them).
pub fn builtin_definitions_with_types(types: &[AgentTypeListing<'_>]) -> Vec<ToolDef> {
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
            &agent_description(types),
            object(
                json!({
                    "description": {"type": "string", "description": "A short (3-5 word) description of the task."},
                    "prompt": {"type": "string", "description": "The task for the agent."},
                    "subagent_type": {"type": "string"},
                    "isolation": {"type": "string", "enum": ["copy", "none"], "description": "copy: the agent works in its own copy of the workspace, at the same path; its edits are kept apart until applied. Default none."},
                    "output_schema": {"type": "object", "description": "With subagent_type only: a JSON Schema (draft 2020-12) the agent's final reply must be an object valid against; its report then carries that object."},
                    "timeout": {"type": "integer", "description": "Seconds the agent may run; past them it ends timed_out with what it has so far. Default: the daemon's."}
                }),
                &["description", "prompt"],
            ),
        ),
    ]
}

/// The `Capacity` tool: what `GetCapacity` tells a client, for a coordinator sizing its
/// fan-out. Part of a session's tools only when it was created with `capacity_tool`.
pub fn capacity_definition() -> ToolDef {
    def(
        CAPACITY_TOOL,
        "See how busy forkd is before you fork: its running slots (used, free, total), your \
         agents waiting for a slot, your budget left, the provider limiter's state for your model \
         and how long the latest agents ran. Give children to also get when a fork of that many \
         would start and finish (an estimate). Read-only.",
        object(
            json!({
                "children": {"type": "integer", "minimum": 1, "description": "How many children you consider forking."}
            }),
            &[],
        ),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_pattern_names_a_tool_a_server_or_a_prefix_of_mcp_tools() {
        assert!(names_tool("Bash", "Bash"));
        assert!(!names_tool("Bash", "BashOutput"));
        assert!(names_tool("mcp__github", "mcp__github__create_issue"));
        assert!(!names_tool("mcp__git", "mcp__github__create_issue"));
        assert!(names_tool(
            "mcp__github__create_*",
            "mcp__github__create_issue"
        ));
        assert!(!names_tool(
            "mcp__github__create_issue",
            "mcp__github__create_pr"
        ));
        // A prefix pattern is for MCP tools only.
        assert!(!names_tool("Ba*", "Bash"));
    }

    fn agent_description_of(defs: &[ToolDef]) -> String {
        let agent = defs.iter().find(|d| d.name == AGENT_TOOL).unwrap();
        let value: serde_json::Value = serde_json::from_str(agent.raw.as_str()).unwrap();
        value["description"].as_str().unwrap().to_owned()
    }

    #[test]
    fn the_agent_tool_lists_the_types_with_when_to_use_them() {
        let long = "word ".repeat(200);
        let types = [
            AgentTypeListing {
                name: "Explore",
                description: "Fast read-only search of the codebase.",
            },
            AgentTypeListing {
                name: "reviewer",
                description: "Reviews a diff.\nUse after every change.",
            },
            AgentTypeListing {
                name: "verbose",
                description: &long,
            },
        ];
        let text = agent_description_of(&builtin_definitions_with_types(&types));
        assert!(
            text.contains("\n- Explore: Fast read-only search of the codebase."),
            "{text}"
        );
        assert!(
            text.contains("\n- reviewer: Reviews a diff. Use after every change."),
            "{text}"
        );
        let verbose = text.lines().find(|l| l.starts_with("- verbose")).unwrap();
        assert!(
            verbose.ends_with('…') && verbose.chars().count() < 330,
            "{verbose}"
        );
        // Without types, no list.
        let plain = agent_description_of(&builtin_definitions());
        assert!(!plain.contains("Available agent types"), "{plain}");
    }
}
