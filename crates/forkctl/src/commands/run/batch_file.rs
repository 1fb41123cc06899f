//! The batch file of `forkctl run`: YAML that describes a session, its directives and an
//! idempotency key, turned into the `CreateSession` and `ForkBatch` requests.
//!
//! ```yaml
//! key: nightly-review-42          # required: re-running the file attaches to the same batch
//! session:
//!   system_file: system.md        # or `system: "inline prompt"`
//!   context_files: [README.md]
//!   model: sim                    # optional; the daemon's default
//!   workspace: .                  # optional; the file's directory
//!   # upload: .                   # or: upload this tree first and work in the daemon's copy
//!                                 # (a daemon on another machine); not with `workspace`
//!   permission_mode: dontAsk      # optional
//!   sandbox: workspace-write      # optional: read-only, full-access; the daemon's default
//!   allow_network: false          # optional: let Bash use the network
//!   capacity_tool: true           # optional: the model may ask how busy the daemon is
//!   mcp: [github]                 # optional: the operator's MCP servers, by name
//!   allow: ["Bash(cargo test:*)"] # optional rule lists
//!   deny: ["Write(secrets/**)"]
//! directives:
//!   - description: Review the README
//!     prompt: Review the README for accuracy.
//!     timeout: 30m                # optional: this child's own limits (the keys below)
//!   - Summarize the README        # a plain string: the prompt, described by its first line
//! warmup_gating: true             # optional; the daemon's setting
//! budget_usd: 2.5                 # optional batch budgets
//! budget_tokens: 2000000
//! isolation: copy                 # optional: each child in its own copy of the workspace
//! output_schema: verdict.json     # optional: a JSON Schema file, or the schema inline (a map)
//! webhook: 0193…                  # optional: a webhook's id (`forkctl webhook add`) for its
//!                                 #   notifications
//! timeout: 10m                    # optional limits on each child; past one it ends `timed_out`
//! idle_timeout: 2m                #   no model output and no tool call for this long
//! max_turns: 30                   #   model requests
//! max_output_tokens: 50000        #   output tokens, counted between requests
//! timeout_excludes_throttle: true #   the timeout leaves out waits on the provider's limits
//! ```
//!
//! A limit left out is the next layer's: a directive's own, then the file's, then the tenant's
//! and the daemon's defaults. A limit of 0 is refused.
//!
//! `session` may also be an existing session's id: the batch then forks that session, and
//! `at_turn: K` forks it after its turn K instead of its last finished turn.
//!
//! Relative paths resolve against the file's directory, so the file means the same thing from
//! any working directory.

use std::fmt;
use std::path::{Path, PathBuf};

use forkd_core::session::{PermissionMode, SandboxMode};
use forkd_proto::v1::{ContextFile, CreateSessionRequest, Directive, ForkBatchRequest};
use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

use crate::commands::fork;
use crate::commands::session::{absolute_workspace, read_text};
use crate::exit::CliError;
use crate::limits::{FileDuration, LimitSpec};

/// The file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Spec {
    key: String,
    session: SessionField,
    directives: Vec<DirectiveSpec>,
    warmup_gating: Option<bool>,
    budget_usd: Option<f64>,
    budget_tokens: Option<u64>,
    isolation: Option<String>,
    at_turn: Option<u32>,
    /// A schema file's path (a string), or the schema itself (a map).
    output_schema: Option<serde_json::Value>,
    /// A registered webhook's id: the batch's notifications are posted to it.
    webhook: Option<String>,
    timeout: Option<FileDuration>,
    idle_timeout: Option<FileDuration>,
    max_turns: Option<u32>,
    max_output_tokens: Option<u64>,
    timeout_excludes_throttle: Option<bool>,
}

impl Spec {
    /// The batch's limits: every child's, but for those a directive sets itself.
    fn limits(&self) -> LimitSpec {
        LimitSpec {
            timeout: self.timeout.map(|d| d.0),
            idle_timeout: self.idle_timeout.map(|d| d.0),
            max_turns: self.max_turns,
            max_output_tokens: self.max_output_tokens,
            timeout_excludes_throttle: self.timeout_excludes_throttle,
        }
    }
}

/// A session to create (a map), or an existing session's id (a string).
#[derive(Debug)]
enum SessionField {
    New(Box<SessionSpec>),
    Existing(String),
}

impl<'de> Deserialize<'de> for SessionField {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SessionVisitor;

        impl<'de> Visitor<'de> for SessionVisitor {
            type Value = SessionField;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a session to create (a map), or an existing session's id")
            }

            fn visit_str<E: de::Error>(self, id: &str) -> Result<SessionField, E> {
                Ok(SessionField::Existing(id.to_owned()))
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<SessionField, A::Error> {
                let spec = SessionSpec::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(SessionField::New(Box::new(spec)))
            }
        }

        deserializer.deserialize_any(SessionVisitor)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SessionSpec {
    system_file: Option<PathBuf>,
    system: Option<String>,
    #[serde(default)]
    context_files: Vec<PathBuf>,
    model: Option<String>,
    workspace: Option<PathBuf>,
    upload: Option<PathBuf>,
    permission_mode: Option<String>,
    sandbox: Option<String>,
    #[serde(default)]
    allow_network: bool,
    #[serde(default)]
    capacity_tool: bool,
    #[serde(default)]
    mcp: Vec<String>,
    #[serde(default)]
    allow: Vec<String>,
    #[serde(default)]
    deny: Vec<String>,
}

/// `{description, prompt}` and the child's own limits, or a plain string that is the prompt.
#[derive(Debug)]
struct DirectiveSpec {
    description: Option<String>,
    prompt: String,
    limits: LimitSpec,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DirectiveMap {
    description: Option<String>,
    prompt: String,
    timeout: Option<FileDuration>,
    idle_timeout: Option<FileDuration>,
    max_turns: Option<u32>,
    max_output_tokens: Option<u64>,
    timeout_excludes_throttle: Option<bool>,
}

impl<'de> Deserialize<'de> for DirectiveSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct DirectiveVisitor;

        impl<'de> Visitor<'de> for DirectiveVisitor {
            type Value = DirectiveSpec;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a prompt, or a map with `prompt`, an optional `description` and optional \
                     limits",
                )
            }

            fn visit_str<E: de::Error>(self, prompt: &str) -> Result<DirectiveSpec, E> {
                Ok(DirectiveSpec {
                    description: None,
                    prompt: prompt.to_owned(),
                    limits: LimitSpec::default(),
                })
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<DirectiveSpec, A::Error> {
                // Delegating keeps the derive's errors: unknown and missing fields by name.
                let map = DirectiveMap::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(DirectiveSpec {
                    description: map.description,
                    prompt: map.prompt,
                    limits: LimitSpec {
                        timeout: map.timeout.map(|d| d.0),
                        idle_timeout: map.idle_timeout.map(|d| d.0),
                        max_turns: map.max_turns,
                        max_output_tokens: map.max_output_tokens,
                        timeout_excludes_throttle: map.timeout_excludes_throttle,
                    },
                })
            }
        }

        deserializer.deserialize_any(DirectiveVisitor)
    }
}

/// Where a batch file's batch forks: a session it creates, or one that exists.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum SessionSource {
    Create(Box<NewSession>),
    Existing(String),
}

/// A session the file creates.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct NewSession {
    /// Complete but for `upload_id`, which the upload gives.
    pub request: CreateSessionRequest,
    /// The file's `upload`, resolved against its directory: a tree to upload first, whose id
    /// the request then names.
    pub upload: Option<PathBuf>,
}

/// A parsed batch file: the two requests `run` sends, idempotency keys included.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct BatchFile {
    /// The file's `key`.
    pub key: String,
    pub session: SessionSource,
    /// Everything but `session_id`, which the session's creation gives.
    pub fork: ForkBatchRequest,
}

/// The idempotency key of the file's session.
pub(crate) fn session_key(key: &str) -> String {
    format!("{key}/session")
}

/// The idempotency key of the file's batch.
pub(crate) fn batch_key(key: &str) -> String {
    format!("{key}/batch")
}

impl BatchFile {
    /// Reads and checks `path`, and the files it names. Every error names the file, and the key
    /// at fault when there is one.
    pub(crate) fn load(path: &Path) -> Result<Self, CliError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            CliError::InvalidInput(format!("cannot read batch file {}: {e}", path.display()))
        })?;
        let base = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        Self::parse(path, &text, base)
    }

    /// Parses `text` (the contents of `path`); relative paths resolve against `base`.
    fn parse(path: &Path, text: &str, base: &Path) -> Result<Self, CliError> {
        let invalid = |msg: String| CliError::InvalidInput(format!("{}: {msg}", path.display()));
        let spec: Spec = serde_saphyr::from_str(text)
            .map_err(|e| CliError::InvalidInput(yaml_error(path, text, &e)))?;
        spec.check().map_err(invalid)?;
        spec.into_requests(base).map_err(invalid)
    }
}

/// `ci/batch.yaml:4:3: unknown field `modle`, expected one of … (near `modle: x`)`: the place
/// as editors take it, the parser's message, and the line itself, which holds the key at fault.
fn yaml_error(path: &Path, text: &str, err: &serde_saphyr::Error) -> String {
    let message = err.without_snippet().to_string();
    let Some(at) = err.location() else {
        return format!("{}: {message}", path.display());
    };
    let (line, column) = (at.line(), at.column());
    let message = message
        .strip_suffix(&format!(" at line {line}, column {column}"))
        .unwrap_or(&message);
    let near = usize::try_from(line)
        .ok()
        .and_then(|l| text.lines().nth(l.checked_sub(1)?))
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| format!(" (near `{l}`)"))
        .unwrap_or_default();
    format!("{}:{line}:{column}: {message}{near}", path.display())
}

impl Spec {
    /// What the types alone do not say.
    fn check(&self) -> Result<(), String> {
        if self.key.trim().is_empty() {
            return Err("`key` must not be empty".into());
        }
        let session = match &self.session {
            SessionField::New(session) => session,
            SessionField::Existing(id) if id.trim().is_empty() => {
                return Err("`session`: an existing session's id must not be empty".into());
            }
            SessionField::Existing(_) => return self.check_batch(),
        };
        match (&session.system_file, &session.system) {
            (Some(_), Some(_)) => {
                return Err("`session`: give `system_file` or `system`, not both".into());
            }
            (None, None) => {
                return Err(
                    "`session`: the system prompt is missing: give `system_file` or `system`"
                        .into(),
                );
            }
            _ => {}
        }
        if session.workspace.is_some() && session.upload.is_some() {
            return Err(
                "`session`: give `workspace` (a directory on the daemon's machine) or `upload` \
                 (a tree sent from this one), not both"
                    .into(),
            );
        }
        if let Some(mode) = &session.permission_mode
            && PermissionMode::parse(mode).is_none()
        {
            return Err(format!(
                "`session.permission_mode`: unknown mode `{mode}` (expected {})",
                PermissionMode::choices()
            ));
        }
        if let Some(mode) = &session.sandbox
            && SandboxMode::parse(mode).is_none()
        {
            return Err(format!(
                "`session.sandbox`: unknown mode `{mode}` (expected {})",
                SandboxMode::choices()
            ));
        }
        self.check_batch()
    }

    /// What the types alone do not say of the batch's own keys.
    fn check_batch(&self) -> Result<(), String> {
        if self.directives.is_empty() {
            return Err("`directives` must list at least one directive".into());
        }
        for (i, d) in self.directives.iter().enumerate() {
            if d.prompt.trim().is_empty() {
                return Err(format!("`directives[{i}].prompt` is empty"));
            }
            d.limits.check(&format!("directives[{i}]."))?;
        }
        self.limits().check("")?;
        if let Some(usd) = self.budget_usd
            && !(usd.is_finite() && usd > 0.0)
        {
            return Err(format!("`budget_usd` must be a positive amount, not {usd}"));
        }
        if self.budget_tokens == Some(0) {
            return Err("`budget_tokens` must be positive (leave it out for no budget)".into());
        }
        if let Some(isolation) = &self.isolation {
            isolation
                .parse::<forkd_core::isolation::Isolation>()
                .map_err(|e| format!("`isolation`: {e}"))?;
        }
        Ok(())
    }

    /// Reads the files it names (here: the daemon may run elsewhere, and the paths are the
    /// user's) and builds the requests.
    fn into_requests(self, base: &Path) -> Result<BatchFile, String> {
        let limits = self.limits().limits();
        let session = match self.session {
            SessionField::New(s) => {
                SessionSource::Create(Box::new(new_session(*s, &self.key, base)?))
            }
            SessionField::Existing(id) => SessionSource::Existing(id.trim().to_owned()),
        };
        let directives = self
            .directives
            .into_iter()
            .map(|d| {
                let mut directive = match d.description {
                    Some(description) => Directive {
                        description,
                        prompt: d.prompt,
                        limits: None,
                    },
                    None => fork::directive(d.prompt),
                };
                directive.limits = d.limits.limits();
                directive
            })
            .collect();
        let output_schema = match self.output_schema {
            None => String::new(),
            Some(serde_json::Value::String(file)) => {
                fork::read_schema(&base.join(&file)).map_err(|e| format!("`output_schema`: {e}"))?
            }
            Some(inline) => forkd_core::output::OutputSchema::from_value(&inline)
                .map(|s| s.as_str().to_owned())
                .map_err(|e| format!("`output_schema`: {e}"))?,
        };
        let fork = ForkBatchRequest {
            session_id: String::new(),
            directives,
            warmup_gating: self.warmup_gating,
            idempotency_key: batch_key(&self.key),
            budget_usd: self.budget_usd.unwrap_or_default(),
            budget_tokens: self.budget_tokens.unwrap_or_default(),
            isolation: self.isolation.unwrap_or_default(),
            at_turn: self.at_turn,
            output_schema,
            fork_point_of: String::new(),
            limits,
            dry_run: false,
            webhook_id: self.webhook.unwrap_or_default(),
        };
        Ok(BatchFile {
            key: self.key,
            session,
            fork,
        })
    }
}

/// The `CreateSession` request of a file's `session` map; paths resolve against `base`.
fn new_session(s: SessionSpec, key: &str, base: &Path) -> Result<NewSession, String> {
    let system_prompt = match (s.system_file, s.system) {
        (Some(file), _) => read_text(&base.join(&file), "system file")
            .map_err(|e| format!("`session.system_file`: {e}"))?,
        (None, Some(inline)) => inline,
        (None, None) => String::new(),
    };
    let context_files = s
        .context_files
        .iter()
        .enumerate()
        .map(|(i, file)| {
            Ok(ContextFile {
                // As written: the same file means the same request from any directory.
                path: file.display().to_string(),
                content: read_text(&base.join(file), "context file")
                    .map_err(|e| format!("`session.context_files[{i}]`: {e}"))?,
            })
        })
        .collect::<Result<_, String>>()?;
    // An upload is the workspace: none is sent.
    let (workspace, upload) = match s.upload {
        Some(upload) => (String::new(), Some(upload_dir(&base.join(upload))?)),
        None => {
            let dir = base.join(s.workspace.unwrap_or_else(|| PathBuf::from(".")));
            // Canonical when it exists, so `..` and symlinks do not make the same file a
            // different request (which the daemon would refuse under the same key).
            let dir = std::fs::canonicalize(&dir).unwrap_or(dir);
            let workspace =
                absolute_workspace(&dir).map_err(|e| format!("`session.workspace`: {e}"))?;
            (workspace, None)
        }
    };
    let request = CreateSessionRequest {
        system_prompt,
        context_files,
        model: s.model.unwrap_or_default(),
        workspace,
        permission_mode: s.permission_mode.unwrap_or_default(),
        sandbox: s.sandbox.unwrap_or_default(),
        allow_network: s.allow_network,
        capacity_tool: s.capacity_tool,
        mcp_servers: s.mcp,
        allow_rules: s.allow,
        deny_rules: s.deny,
        idempotency_key: session_key(key),
        ..Default::default()
    };
    Ok(NewSession { request, upload })
}

/// The file's `upload` directory, checked now so that a wrong path is reported before
/// connecting; canonical, as the workspace is.
fn upload_dir(dir: &Path) -> Result<PathBuf, String> {
    let dir = std::fs::canonicalize(dir)
        .map_err(|e| format!("`session.upload`: cannot upload {}: {e}", dir.display()))?;
    if !dir.is_dir() {
        return Err(format!(
            "`session.upload`: cannot upload {}: not a directory",
            dir.display()
        ));
    }
    Ok(dir)
}

#[cfg(test)]
mod tests;
