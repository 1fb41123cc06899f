//! Typed agents (docs/contracts.md, “When not to fork”): the built-in `general-purpose`, `Explore`
//! and `Plan` types, and custom types read from Markdown files with a YAML frontmatter.
//!
//! A typed agent has its own system prompt and a filtered tool set, so it shares no prompt cache
//! with its session, by design. This module only reads files: no async, no engine state, so the
//! loading rules can be tested on plain text.
//!
//! The frontmatter is parsed with `serde-saphyr`: `serde_yaml` is archived, its forks
//! (`serde_yaml_ng`, `serde_norway`) still run on `unsafe-libyaml`, which is unmaintained
//! (RUSTSEC-2024-0449), and `serde_yml` is deprecated. `serde-saphyr` is maintained, written in
//! safe Rust, panic-free on malformed input, and deserializes straight into a serde struct.

use std::collections::HashMap;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use forkd_core::session::{PermissionMode, ToolDef};
use forkd_core::tools::{AGENT_TOOL, MCP_PREFIX, names_tool};
use serde::Deserialize;

/// One agent type: what a typed agent is told and what it may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentType {
    pub name: String,
    /// When to use this type; shown to models and clients that choose a `subagent_type`.
    pub description: String,
    /// The type's own prompt; [`AgentType::render_system`] adds the report format and the `<env>`.
    pub system_prompt: String,
    /// `None`: every tool of the pool. Naming `Agent` is allowed (files written for other runners
    /// do) but has no effect: see [`AgentType::tool_defs`].
    pub tools: Option<Vec<String>>,
    pub disallowed_tools: Vec<String>,
    /// `None`: the session's model.
    pub model: Option<String>,
    /// `None`: the session's mode.
    pub permission_mode: Option<PermissionMode>,
    pub source: AgentTypeSource,
}

/// Where a type was defined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentTypeSource {
    BuiltIn,
    File(PathBuf),
}

/// A definition that cannot be used. Every variant names the file (or directory) at fault.
#[derive(Debug, thiserror::Error)]
pub enum AgentTypeError {
    #[error("{dir}: cannot list agent definitions: {source}")]
    ReadDir {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: cannot read: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: no frontmatter: the file must start with a `---` line, then YAML, then `---`")]
    MissingFrontmatter { path: PathBuf },
    #[error("{path}: bad frontmatter: {message}")]
    Yaml { path: PathBuf, message: String },
    #[error("{path}: the frontmatter has no `{field}`")]
    MissingField { path: PathBuf, field: &'static str },
    #[error("{path}: bad name {name:?}: use only letters, digits, `-` and `_`")]
    BadName { path: PathBuf, name: String },
    #[error("{path}: `{name}` is a built-in agent type; a custom type cannot replace it")]
    ShadowsBuiltIn { path: PathBuf, name: String },
    #[error(
        "{path}: unknown permissionMode {mode:?} (expected {})",
        PermissionMode::choices()
    )]
    UnknownPermissionMode { path: PathBuf, mode: String },
    #[error("{path}: unknown tools in `{field}`: {} (known: {})", unknown.join(", "), known.join(", "))]
    UnknownTools {
        path: PathBuf,
        field: &'static str,
        unknown: Vec<String>,
        known: Vec<String>,
    },
    #[error("{path}: the system prompt (the text after the frontmatter) is empty")]
    EmptyBody { path: PathBuf },
    #[error("{path}: agent type `{name}` is already defined in {first} (same directory)")]
    DuplicateName {
        path: PathBuf,
        name: String,
        first: PathBuf,
    },
}

/// The read-only tools of `Explore` and `Plan`.
const READ_ONLY_TOOLS: [&str; 3] = ["Read", "Glob", "Grep"];

const GENERAL_PURPOSE_PROMPT: &str = "You are a general-purpose agent, started by another agent to \
carry out one task on its behalf. Do the whole task with the tools you have. Search and read \
before you change anything: understand the code around the change, its conventions and its tests. \
Make the changes the task calls for, prefer editing existing files to creating new ones, and write \
no documentation files unless the task asks for them. Check your work: when you have a shell and \
the project has a build or tests, run them. When something is ambiguous, make a reasonable choice \
and say so in your report instead of stopping. Stay within the task; do not widen its scope.";

const EXPLORE_PROMPT: &str = "You are an exploration agent, started by another agent to find \
things out in this workspace. You are read-only: you can list files with Glob, search contents \
with Grep and read files with Read, and you change nothing. Search broadly first, then read the \
files that matter. Answer the question you were asked: what you found, with workspace-relative \
file paths (and line numbers where they help), quoting only the few lines that matter. Say what \
you looked for and did not find. Be quick: stop as soon as you can answer.";

const PLAN_PROMPT: &str = "You are a planning agent, started by another agent to design how a \
task should be carried out. You are read-only: read and search the workspace to understand the \
code the task touches, its conventions and its tests, and change nothing. Produce a step-by-step \
implementation plan: numbered steps in the order to do them, each naming the files and functions \
to change or create and what to do there; the tests that prove each step; then risks, open \
questions, and the alternatives you rejected and why. The plan goes in the Result section of your \
report; the files it would touch go in Key files, and Files changed stays none.";

/// Appended to every typed agent's prompt, built-in or custom, so that every report parses with
/// `forkd_core::report::Report` (the same five headings as the fork boilerplate).
const REPORT_INSTRUCTIONS: &str = "You run unattended: nobody answers questions while you work, \
and your final message is your whole answer to the agent that started you. Work without \
commentary between tool calls. End with this report and nothing after it:
Scope: <what you were asked to do, one line>
Result: <what you found or did>
Key files: <comma-separated paths that matter, or none>
Files changed: <comma-separated paths you wrote or edited, or none>
Issues: <problems, risks or open questions, or none>";

fn builtin(name: &str, description: &str, prompt: &str, read_only: bool) -> AgentType {
    AgentType {
        name: name.to_owned(),
        description: description.to_owned(),
        system_prompt: prompt.to_owned(),
        tools: read_only.then(|| READ_ONLY_TOOLS.map(str::to_owned).to_vec()),
        disallowed_tools: Vec::new(),
        model: None,
        permission_mode: None,
        source: AgentTypeSource::BuiltIn,
    }
}

/// The types every session has.
pub fn builtin_types() -> Vec<AgentType> {
    let plan = AgentType {
        permission_mode: Some(PermissionMode::Plan),
        ..builtin(
            "Plan",
            "Designs an implementation plan: reads the workspace and returns numbered steps, \
             files and risks. Read-only.",
            PLAN_PROMPT,
            true,
        )
    };
    vec![
        builtin(
            "general-purpose",
            "Researches, edits and runs commands to carry out a multi-step task. All tools.",
            GENERAL_PURPOSE_PROMPT,
            false,
        ),
        builtin(
            "Explore",
            "Finds files, code and facts in the workspace and reports them with paths. Read-only.",
            EXPLORE_PROMPT,
            true,
        ),
        plan,
    ]
}

/// The type called `name`, if any (exact, case-sensitive match).
pub fn find_type<'a>(types: &'a [AgentType], name: &str) -> Option<&'a AgentType> {
    types.iter().find(|t| t.name == name)
}

impl AgentType {
    /// The type's tools from `pool`, in pool order, minus `disallowed_tools`. Never the `Agent`
    /// tool: a typed agent does its work itself (no recursion of agents), and as it shares no
    /// cache with its session there is no tools array to keep byte-identical by keeping it.
    pub fn tool_defs(&self, pool: &[ToolDef]) -> Vec<ToolDef> {
        let listed = |names: &[String], tool: &str| names.iter().any(|n| names_tool(n, tool));
        pool.iter()
            .filter(|t| t.name != AGENT_TOOL)
            .filter(|t| {
                self.tools
                    .as_ref()
                    .is_none_or(|names| listed(names, &t.name))
            })
            .filter(|t| !listed(&self.disallowed_tools, &t.name))
            .cloned()
            .collect()
    }

    /// The system prompt as sent: the type's prompt, the report format, and the environment.
    /// Rendered once, when the agent is created, and stored (never re-rendered).
    pub fn render_system(&self, workspace: &Path, model: &str, date: &str) -> String {
        format!(
            "{}\n\n{REPORT_INSTRUCTIONS}\n\n<env>\nWorking directory: {}\nModel: {model}\n\
             Today's date: {date}\n</env>\n",
            self.system_prompt.trim_end(),
            workspace.display(),
        )
    }
}

/// The frontmatter as written. Unknown keys are ignored, so that files written for other agent
/// runners (with `color:`, `hooks:`…) still load.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Frontmatter {
    name: Option<String>,
    description: Option<String>,
    tools: Option<ToolList>,
    disallowed_tools: Option<ToolList>,
    model: Option<String>,
    permission_mode: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(
    untagged,
    expecting = "a comma-separated string or a list of tool names"
)]
enum ToolList {
    Csv(String),
    List(Vec<String>),
}

impl ToolList {
    fn names(self) -> Vec<String> {
        let items = match self {
            ToolList::Csv(s) => s.split(',').map(str::to_owned).collect(),
            ToolList::List(items) => items,
        };
        items
            .into_iter()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect()
    }
}

/// Splits `---\n<yaml>---\n<body>` into the YAML and the body. Tolerates a BOM, CRLF line endings
/// and trailing blanks on the fences, as editors produce them.
fn split_frontmatter(text: &str) -> Option<(&str, &str)> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text.split_inclusive('\n');
    let first = lines.next()?;
    if first.trim_end() != "---" {
        return None;
    }
    let mut end = first.len();
    for line in lines {
        if line.trim_end() == "---" {
            return Some((&text[first.len()..end], &text[end + line.len()..]));
        }
        end += line.len();
    }
    None
}

/// Parses one definition file's text. `path` names the file in errors and in the type's source.
pub fn parse_type(
    path: &Path,
    text: &str,
    known_tools: &[String],
) -> Result<AgentType, AgentTypeError> {
    let err_path = || path.to_path_buf();
    let (yaml, body) = split_frontmatter(text)
        .ok_or_else(|| AgentTypeError::MissingFrontmatter { path: err_path() })?;
    // The leading newline stands for the opening `---`, so error line numbers are the file's.
    let fm: Frontmatter =
        serde_saphyr::from_str(&format!("\n{yaml}")).map_err(|e| AgentTypeError::Yaml {
            path: err_path(),
            message: e.without_snippet().to_string(),
        })?;
    let name = required(path, fm.name, "name")?;
    check_name(path, &name)?;
    let description = required(path, fm.description, "description")?;
    let tools = fm.tools.map(ToolList::names);
    let disallowed_tools = fm.disallowed_tools.map(ToolList::names).unwrap_or_default();
    check_tools(
        path,
        "tools",
        tools.as_deref().unwrap_or_default(),
        known_tools,
    )?;
    check_tools(path, "disallowedTools", &disallowed_tools, known_tools)?;
    let permission_mode = match fm.permission_mode.as_deref().map(str::trim) {
        None => None,
        Some(mode) => Some(PermissionMode::parse(mode).ok_or_else(|| {
            AgentTypeError::UnknownPermissionMode {
                path: err_path(),
                mode: mode.to_owned(),
            }
        })?),
    };
    let system_prompt = body.trim().to_owned();
    if system_prompt.is_empty() {
        return Err(AgentTypeError::EmptyBody { path: err_path() });
    }
    Ok(AgentType {
        name,
        description,
        system_prompt,
        tools,
        disallowed_tools,
        // `inherit` (Claude Code's spelling) and a blank value both mean the session's model.
        model: fm
            .model
            .map(|m| m.trim().to_owned())
            .filter(|m| !m.is_empty() && m != "inherit"),
        permission_mode,
        source: AgentTypeSource::File(err_path()),
    })
}

fn required(
    path: &Path,
    value: Option<String>,
    field: &'static str,
) -> Result<String, AgentTypeError> {
    match value.map(|v| v.trim().to_owned()) {
        Some(v) if !v.is_empty() => Ok(v),
        _ => Err(AgentTypeError::MissingField {
            path: path.to_path_buf(),
            field,
        }),
    }
}

fn check_name(path: &Path, name: &str) -> Result<(), AgentTypeError> {
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(AgentTypeError::BadName {
            path: path.to_path_buf(),
            name: name.to_owned(),
        });
    }
    // Case-insensitive: an `explore` next to `Explore` would only confuse the model choosing.
    if builtin_types()
        .iter()
        .any(|b| b.name.eq_ignore_ascii_case(name))
    {
        return Err(AgentTypeError::ShadowsBuiltIn {
            path: path.to_path_buf(),
            name: name.to_owned(),
        });
    }
    Ok(())
}

fn check_tools(
    path: &Path,
    field: &'static str,
    names: &[String],
    known: &[String],
) -> Result<(), AgentTypeError> {
    let unknown: Vec<String> = names
        .iter()
        // Which MCP tools a session has is known only when it is created, so a type may name
        // any (a session without them simply does not offer them).
        .filter(|n| !known.contains(n) && !n.starts_with(MCP_PREFIX))
        .cloned()
        .collect();
    if unknown.is_empty() {
        return Ok(());
    }
    Err(AgentTypeError::UnknownTools {
        path: path.to_path_buf(),
        field,
        unknown,
        known: known.to_vec(),
    })
}

/// The `*.md` files of `dir`, sorted by file name. A missing directory has none.
fn definition_files(dir: &Path) -> Result<Vec<PathBuf>, AgentTypeError> {
    let read_dir_err = |source| AgentTypeError::ReadDir {
        dir: dir.to_path_buf(),
        source,
    };
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(read_dir_err(e)),
    };
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(read_dir_err)?;
        let path = entry.path();
        // A regular file: a symlink is not followed (in a workspace it could lead anywhere).
        if path.extension().is_some_and(|e| e == "md")
            && entry.file_type().is_ok_and(|t| t.is_file())
        {
            files.push(path);
        }
    }
    files.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    Ok(files)
}

fn load_file(path: &Path, known_tools: &[String]) -> Result<AgentType, AgentTypeError> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let read_err = |source| AgentTypeError::Read {
        path: path.to_path_buf(),
        source,
    };
    // A workspace's definitions are its commands' files: never through a link, never a FIFO
    // waited on (a blocking thread held for good), never more than a definition could need.
    const MOST: u64 = 1 << 20;
    let mut text = String::new();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(read_err)?;
    let meta = file.metadata().map_err(read_err)?;
    if !meta.is_file() {
        return Err(read_err(std::io::Error::other("not a regular file")));
    }
    if meta.len() > MOST {
        return Err(read_err(std::io::Error::other(format!(
            "{} bytes; an agent type's definition may have at most {MOST}",
            meta.len()
        ))));
    }
    file.take(MOST)
        .read_to_string(&mut text)
        .map_err(read_err)?;
    parse_type(path, &text, known_tools)
}

/// The built-ins, then the custom types of `dirs` in order. A later directory's definition of a
/// custom name replaces an earlier one's (the daemon passes `$FORKD_HOME/agents` first, then the
/// workspace's `.forkd/agents`, so the workspace wins); within one directory a name may be defined
/// once. Files that cannot be used are returned as errors; the rest still load.
pub fn load_types(dirs: &[&Path], known_tools: &[String]) -> (Vec<AgentType>, Vec<AgentTypeError>) {
    let mut types = builtin_types();
    let mut errors = Vec::new();
    for dir in dirs {
        let files = match definition_files(dir) {
            Ok(files) => files,
            Err(e) => {
                errors.push(e);
                continue;
            }
        };
        // Names defined so far in this directory, with the file that defined each.
        let mut here: HashMap<String, PathBuf> = HashMap::new();
        for path in files {
            let loaded = load_file(&path, known_tools).and_then(|t| match here.get(&t.name) {
                Some(first) => Err(AgentTypeError::DuplicateName {
                    path: path.clone(),
                    name: t.name,
                    first: first.clone(),
                }),
                None => Ok(t),
            });
            match loaded {
                Ok(t) => {
                    here.insert(t.name.clone(), path);
                    upsert(&mut types, t);
                }
                Err(e) => errors.push(e),
            }
        }
    }
    (types, errors)
}

/// Replaces the type of the same name in place, or appends.
fn upsert(types: &mut Vec<AgentType>, new: AgentType) {
    match types.iter_mut().find(|t| t.name == new.name) {
        Some(slot) => *slot = new,
        None => types.push(new),
    }
}

/// The agent types a session can use: built-ins, `$FORKD_HOME/agents`, then
/// `<workspace>/.forkd/agents` (later definitions of a custom name win). The workspace's folder
/// is opened beneath the pinned workspace (no symlink or `..` leads out of it), and read through
/// that descriptor.
pub fn for_workspace(agent_dirs: &[PathBuf], workspace: &Path) -> Vec<AgentType> {
    types_in(
        agent_dirs,
        forkd_tools::Workspace::pinned(workspace),
        workspace,
    )
}

/// [`for_workspace`] for a session working in a layer (made from an upload): its folder is
/// opened beneath the layer's root, and its definitions named at the path its agents see.
pub fn for_layer(
    agent_dirs: &[PathBuf],
    layer: std::sync::Arc<forkd_tools::sandbox::layer::LayerView>,
) -> Vec<AgentType> {
    let named = layer.workspace().to_path_buf();
    types_in(
        agent_dirs,
        Ok(forkd_tools::Workspace::layered(layer)),
        &named,
    )
}

fn types_in(
    agent_dirs: &[PathBuf],
    workspace: Result<forkd_tools::Workspace, forkd_tools::ToolError>,
    named_root: &Path,
) -> Vec<AgentType> {
    let opened = workspace.and_then(|ws| ws.open_dir(Path::new(".forkd/agents")));
    let held = match opened {
        Ok(held) => held,
        Err(e) => {
            tracing::warn!(error = %e, "Skipping the workspace's agent types");
            None
        }
    };
    let local = held.as_ref().map(|fd| {
        use std::os::fd::AsRawFd;
        PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
    });
    let mut dirs: Vec<&Path> = agent_dirs.iter().map(PathBuf::as_path).collect();
    dirs.extend(local.as_deref());
    // The session's whole pool (built-ins and external tools) is what a type may name.
    let known: Vec<String> = forkd_core::tools::builtin_definitions()
        .into_iter()
        .map(|t| t.name)
        .collect();
    let (mut types, errors) = load_types(&dirs, &known);
    for e in errors {
        tracing::warn!(error = %e, "Skipping an agent type definition");
    }
    // A workspace's definitions were read through the descriptor; they are named where they are.
    if let Some(through) = &local {
        let named = named_root.join(".forkd/agents");
        for t in &mut types {
            if let AgentTypeSource::File(path) = &mut t.source
                && let Ok(rel) = path.strip_prefix(through)
            {
                *path = named.join(rel);
            }
        }
    }
    types
}

#[cfg(test)]
mod tests;
