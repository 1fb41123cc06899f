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
//!   mcp: [github]                 # optional: the operator's MCP servers, by name
//!   allow: ["Bash(cargo test:*)"] # optional rule lists
//!   deny: ["Write(secrets/**)"]
//! directives:
//!   - description: Review the README
//!     prompt: Review the README for accuracy.
//!   - Summarize the README        # a plain string: the prompt, described by its first line
//! warmup_gating: true             # optional; the daemon's setting
//! budget_usd: 2.5                 # optional batch budgets
//! budget_tokens: 2000000
//! isolation: copy                 # optional: each child in its own copy of the workspace
//! output_schema: verdict.json     # optional: a JSON Schema file, or the schema inline (a map)
//! ```
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
    mcp: Vec<String>,
    #[serde(default)]
    allow: Vec<String>,
    #[serde(default)]
    deny: Vec<String>,
}

/// `{description, prompt}`, or a plain string that is the prompt.
#[derive(Debug)]
struct DirectiveSpec {
    description: Option<String>,
    prompt: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DirectiveMap {
    description: Option<String>,
    prompt: String,
}

impl<'de> Deserialize<'de> for DirectiveSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct DirectiveVisitor;

        impl<'de> Visitor<'de> for DirectiveVisitor {
            type Value = DirectiveSpec;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a prompt, or a map with `prompt` and an optional `description`")
            }

            fn visit_str<E: de::Error>(self, prompt: &str) -> Result<DirectiveSpec, E> {
                Ok(DirectiveSpec {
                    description: None,
                    prompt: prompt.to_owned(),
                })
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<DirectiveSpec, A::Error> {
                // Delegating keeps the derive's errors: unknown and missing fields by name.
                let map = DirectiveMap::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(DirectiveSpec {
                    description: map.description,
                    prompt: map.prompt,
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
        }
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
        let session = match self.session {
            SessionField::New(s) => {
                SessionSource::Create(Box::new(new_session(*s, &self.key, base)?))
            }
            SessionField::Existing(id) => SessionSource::Existing(id.trim().to_owned()),
        };
        let directives = self
            .directives
            .into_iter()
            .map(|d| match d.description {
                Some(description) => Directive {
                    description,
                    prompt: d.prompt,
                },
                None => fork::directive(d.prompt),
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
mod tests {
    use super::*;

    const FULL: &str = r#"
key: nightly-42
session:
  system_file: system.md
  context_files: [notes/a.md]
  model: sim
  workspace: work
  permission_mode: dontAsk
  allow: ["Bash(cargo test:*)"]
  deny: ["Write(secrets/**)"]
directives:
  - description: Review the README
    prompt: |
      Review the README.
      Carefully.
  - "Summarize the README\nin three lines"
warmup_gating: false
budget_usd: 2.5
budget_tokens: 100000
"#;

    fn dir_with_files() -> anyhow::Result<tempfile::TempDir> {
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("system.md"), "You review.")?;
        std::fs::create_dir_all(dir.path().join("notes"))?;
        std::fs::create_dir_all(dir.path().join("work"))?;
        std::fs::write(dir.path().join("notes/a.md"), "# A")?;
        Ok(dir)
    }

    fn parse_err(text: &str) -> String {
        match BatchFile::parse(Path::new("ci/batch.yaml"), text, Path::new("/nonexistent")) {
            Err(CliError::InvalidInput(msg)) => msg,
            other => panic!("expected an invalid input, got {other:?}"),
        }
    }

    #[test]
    fn a_full_file_becomes_both_requests() -> anyhow::Result<()> {
        let dir = dir_with_files()?;
        let path = dir.path().join("batch.yaml");
        std::fs::write(&path, FULL)?;
        let file = BatchFile::load(&path)?;
        assert_eq!(file.key, "nightly-42");

        let SessionSource::Create(new) = &file.session else {
            panic!("the file creates its session")
        };
        let s = &new.request;
        assert_eq!(new.upload, None);
        assert_eq!(s.system_prompt, "You review.");
        assert_eq!(s.context_files.len(), 1);
        assert_eq!(s.context_files[0].path, "notes/a.md");
        assert_eq!(s.context_files[0].content, "# A");
        assert_eq!(s.model, "sim");
        let workspace = std::fs::canonicalize(dir.path().join("work"))?;
        assert_eq!(Path::new(&s.workspace), workspace);
        assert_eq!(s.permission_mode, "dontAsk");
        assert_eq!(s.allow_rules, ["Bash(cargo test:*)"]);
        assert_eq!(s.deny_rules, ["Write(secrets/**)"]);
        assert_eq!(s.idempotency_key, "nightly-42/session");

        let f = &file.fork;
        assert_eq!(f.session_id, "");
        assert_eq!(f.directives.len(), 2);
        assert_eq!(f.directives[0].description, "Review the README");
        assert_eq!(f.directives[0].prompt, "Review the README.\nCarefully.\n");
        // A plain string is the prompt, described by its first line.
        assert_eq!(f.directives[1].description, "Summarize the README");
        assert_eq!(
            f.directives[1].prompt,
            "Summarize the README\nin three lines"
        );
        assert_eq!(f.warmup_gating, Some(false));
        assert_eq!(f.idempotency_key, "nightly-42/batch");
        assert_eq!(f.budget_usd, 2.5);
        assert_eq!(f.budget_tokens, 100_000);
        Ok(())
    }

    #[test]
    fn a_minimal_file_leaves_the_rest_to_the_daemon() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let text = "key: k\nsession:\n  system: Be brief.\ndirectives: [one]\n";
        let file = BatchFile::parse(Path::new("b.yaml"), text, dir.path())?;
        let SessionSource::Create(new) = &file.session else {
            panic!("the file creates its session")
        };
        let session = &new.request;
        assert_eq!(session.system_prompt, "Be brief.");
        assert_eq!(session.model, "");
        assert_eq!(session.permission_mode, "");
        // The workspace defaults to the file's directory.
        assert_eq!(
            Path::new(&session.workspace),
            std::fs::canonicalize(dir.path())?
        );
        assert_eq!(file.fork.warmup_gating, None);
        assert_eq!((file.fork.budget_usd, file.fork.budget_tokens), (0.0, 0));
        Ok(())
    }

    #[test]
    fn an_upload_replaces_the_workspace_and_is_checked_before_connecting() -> anyhow::Result<()> {
        let dir = dir_with_files()?;
        let text = "key: k\nsession: {system: s, upload: work}\ndirectives: [a]\n";
        let file = BatchFile::parse(Path::new("b.yaml"), text, dir.path())?;
        let SessionSource::Create(new) = &file.session else {
            panic!("the file creates its session")
        };
        assert_eq!(new.request.workspace, "");
        assert_eq!(new.request.upload_id, "");
        assert_eq!(
            new.upload.as_deref(),
            Some(std::fs::canonicalize(dir.path().join("work"))?.as_path())
        );

        let both = "key: k\nsession: {system: s, upload: ., workspace: .}\ndirectives: [a]\n";
        let msg = parse_err(both);
        assert!(msg.contains("give `workspace`"), "{msg}");
        assert!(msg.contains("or `upload`"), "{msg}");
        let msg = parse_err("key: k\nsession: {system: s, upload: nope}\ndirectives: [a]\n");
        assert!(
            msg.starts_with("ci/batch.yaml: `session.upload`: cannot upload /nonexistent/nope"),
            "{msg}"
        );
        Ok(())
    }

    #[test]
    fn a_file_may_fork_an_existing_session_after_a_turn() -> anyhow::Result<()> {
        let text = "key: k\nsession: 0193-s\nat_turn: 5\ndirectives: [one, two]\n";
        let file = BatchFile::parse(Path::new("b.yaml"), text, Path::new("/nonexistent"))?;
        assert_eq!(file.session, SessionSource::Existing("0193-s".into()));
        assert_eq!(file.fork.at_turn, Some(5));
        assert_eq!(file.fork.directives.len(), 2);
        assert!(
            parse_err("key: k\nsession: ''\ndirectives: [one]\n").contains("must not be empty")
        );
        Ok(())
    }

    #[test]
    fn an_output_schema_is_a_file_or_inline_and_is_checked_here() -> anyhow::Result<()> {
        let dir = dir_with_files()?;
        std::fs::write(
            dir.path().join("verdict.json"),
            r#"{"type": "object", "required": ["verdict"]}"#,
        )?;
        let text = "key: k\nsession: s1\ndirectives: [a]\noutput_schema: verdict.json\n";
        let file = BatchFile::parse(Path::new("b.yaml"), text, dir.path())?;
        assert_eq!(
            file.fork.output_schema,
            r#"{"type":"object","required":["verdict"]}"#
        );
        let text = "key: k\nsession: s1\ndirectives: [a]\noutput_schema:\n  type: object\n  \
                    properties: {verdict: {enum: [pass, fail]}}\n";
        let file = BatchFile::parse(Path::new("b.yaml"), text, dir.path())?;
        assert_eq!(
            file.fork.output_schema,
            r#"{"type":"object","properties":{"verdict":{"enum":["pass","fail"]}}}"#
        );
        let msg = parse_err("key: k\nsession: s1\ndirectives: [a]\noutput_schema: {type: objet}\n");
        assert!(
            msg.contains("`output_schema`: the output schema is not a valid JSON Schema"),
            "{msg}"
        );
        let msg = parse_err("key: k\nsession: s1\ndirectives: [a]\noutput_schema: none.json\n");
        assert!(msg.contains("cannot read output schema"), "{msg}");
        Ok(())
    }

    #[test]
    fn the_same_file_makes_the_same_requests_from_any_directory() -> anyhow::Result<()> {
        let dir = dir_with_files()?;
        let path = dir.path().join("batch.yaml");
        std::fs::write(&path, FULL)?;
        let roundabout = dir.path().join("notes/../batch.yaml");
        assert_eq!(BatchFile::load(&path)?, BatchFile::load(&roundabout)?);
        Ok(())
    }

    #[test]
    fn an_unknown_key_is_named_with_the_file_and_line() {
        let msg = parse_err("key: k\nsession:\n  system: s\n  modle: x\ndirectives: [a]\n");
        assert!(
            msg.starts_with("ci/batch.yaml:4:3: unknown field `modle`, expected one of"),
            "{msg}"
        );
        assert!(msg.ends_with(" (near `modle: x`)"), "{msg}");
        let msg = parse_err("key: k\nsession: {system: s}\ndirectives: [a]\nbudget: 3\n");
        assert!(
            msg.starts_with("ci/batch.yaml:4:1: unknown field `budget`"),
            "{msg}"
        );
        let msg =
            parse_err("key: k\nsession: {system: s}\ndirectives:\n  - {prompt: p, desc: d}\n");
        assert!(
            msg.starts_with(
                "ci/batch.yaml:4:17: unknown field `desc`, expected one of description, prompt"
            ),
            "{msg}"
        );
    }

    #[test]
    fn missing_and_malformed_keys_are_named() {
        let msg = parse_err("session: {system: s}\ndirectives: [a]\n");
        assert!(msg.contains(": missing field `key`"), "{msg}");
        let msg = parse_err("key: k\nsession: {system: s}\ndirectives:\n  - description: d\n");
        assert_eq!(
            msg,
            "ci/batch.yaml:4:5: missing field `prompt` (near `- description: d`)"
        );
        let msg = parse_err("key: k\nsession: {system: s}\ndirectives: [a]\nbudget_tokens: many\n");
        assert_eq!(
            msg,
            "ci/batch.yaml:4:16: invalid u64 (near `budget_tokens: many`)"
        );
        let msg = parse_err("key: k\nsession: {system: s}\ndirectives: [3]\n");
        assert!(
            msg.contains("expected a prompt, or a map with `prompt`"),
            "{msg}"
        );
        let msg = parse_err("key: [\n");
        assert!(msg.starts_with("ci/batch.yaml:1:"), "{msg}");
    }

    #[test]
    fn what_the_types_allow_but_forkd_does_not_is_refused_by_key() {
        let cases = [
            ("key: ' '\nsession: {system: s}\ndirectives: [a]\n", "`key`"),
            (
                "key: k\nsession: {system: s, system_file: f}\ndirectives: [a]\n",
                "not both",
            ),
            ("key: k\nsession: {model: m}\ndirectives: [a]\n", "`system`"),
            (
                "key: k\nsession: {system: s, permission_mode: yolo}\ndirectives: [a]\n",
                "`session.permission_mode`: unknown mode `yolo`",
            ),
            (
                "key: k\nsession: {system: s}\ndirectives: []\n",
                "`directives`",
            ),
            (
                "key: k\nsession: {system: s}\ndirectives: [a, '  ']\n",
                "`directives[1].prompt` is empty",
            ),
            (
                "key: k\nsession: {system: s}\ndirectives: [a]\nbudget_usd: -1\n",
                "`budget_usd`",
            ),
            (
                "key: k\nsession: {system: s}\ndirectives: [a]\nbudget_tokens: 0\n",
                "`budget_tokens`",
            ),
        ];
        for (text, expected) in cases {
            let msg = parse_err(text);
            assert!(msg.starts_with("ci/batch.yaml: "), "{msg}");
            assert!(msg.contains(expected), "{text:?}: {msg}");
        }
    }

    #[test]
    fn unreadable_files_are_named_by_key() {
        let msg = parse_err("key: k\nsession: {system_file: nope.md}\ndirectives: [a]\n");
        assert!(
            msg.starts_with("ci/batch.yaml: `session.system_file`: cannot read system file"),
            "{msg}"
        );
        let msg =
            parse_err("key: k\nsession: {system: s, context_files: [x.md]}\ndirectives: [a]\n");
        assert!(msg.contains("`session.context_files[0]`"), "{msg}");
        let err = BatchFile::load(Path::new("/nonexistent/batch.yaml")).map(|_| ());
        assert!(
            matches!(&err, Err(CliError::InvalidInput(m)) if m.starts_with("cannot read batch file /nonexistent/batch.yaml")),
            "{err:?}"
        );
    }
}
