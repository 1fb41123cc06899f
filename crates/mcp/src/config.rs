//! MCP server definitions in the format users already have: `.mcp.json`'s `mcpServers` object,
//! plus forkd's own keys for what only the operator decides (a tool's read-only standing, a
//! server's sandbox, its call timeout).
//!
//! Who wrote a definition matters: the operator's (`$FORKD_HOME/mcp.json`) may name variables of
//! the daemon's environment (`${VAR}`, `${VAR:-default}`) in env values, headers and URLs, and
//! may mark tools read-only; a session's own definitions get no expansion (the daemon's
//! environment is not theirs to read) and no read-only marks (`readOnlyHint` and anything else a
//! client says about a tool is advice, not trust).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use forkd_core::session::{Sandbox, SandboxMode};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// A call's time limit when the definition sets none.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// A `.mcp.json` file: `{"mcpServers": {NAME: definition, …}}`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpFile {
    #[serde(rename = "mcpServers", default)]
    pub servers: BTreeMap<String, ServerDef>,
}

/// One server as written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServerDef {
    /// `stdio`, `http` (streamable HTTP; `streamable-http` is accepted too), or inferred:
    /// `command` means stdio, `url` means HTTP.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// forkd: the tools (by their names on the server) that only look. Operator only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read_only_tools: Vec<String>,
    /// forkd: a stdio server's sandbox mode (`workspace-write` by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
    /// forkd: whether a sandboxed stdio server may use the network (no by default: a server
    /// that calls an API says so).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_network: Option<bool>,
    /// forkd: one call's time limit, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<u64>,
}

/// Who defined a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    /// The daemon's operator, in `$FORKD_HOME/mcp.json`.
    Operator,
    /// The session that created it (`--mcp-config`).
    Session,
}

/// How forkd reaches a server.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Transport {
    Stdio {
        command: String,
        args: Vec<String>,
        env: BTreeMap<String, String>,
        sandbox: Sandbox,
    },
    Http {
        url: String,
        headers: BTreeMap<String, String>,
    },
}

/// A server ready to start: resolved, expanded and checked.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServerSpec {
    pub name: String,
    pub origin: Origin,
    pub transport: Transport,
    pub read_only_tools: BTreeSet<String>,
    pub call_timeout: Duration,
}

/// A definition that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("MCP configuration is not valid JSON in the mcpServers format: {0}")]
    Json(String),
    #[error("MCP server {server:?}: {message}")]
    Server { server: String, message: String },
}

fn server_err(server: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::Server {
        server: server.to_owned(),
        message: message.into(),
    }
}

impl McpFile {
    pub fn parse(text: &str) -> Result<McpFile, ConfigError> {
        serde_json::from_str(text).map_err(|e| ConfigError::Json(e.to_string()))
    }
}

/// Expands `${VAR}` and `${VAR:-default}` from `env`; an unset variable without a default is an
/// error (a server started with an empty token fails later, and less clearly).
pub fn expand(
    server: &str,
    value: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, ConfigError> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| server_err(server, format!("unclosed ${{ in {value:?}")))?;
        let expr = &after[..end];
        let (name, default) = match expr.split_once(":-") {
            Some((name, default)) => (name, Some(default)),
            None => (expr, None),
        };
        match (env(name), default) {
            (Some(v), _) => out.push_str(&v),
            (None, Some(d)) => out.push_str(d),
            (None, None) => {
                return Err(server_err(
                    server,
                    format!("environment variable {name} is not set (named in {value:?})"),
                ));
            }
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

impl ServerDef {
    /// Resolves the definition into what starts the server. `env` is the daemon's environment,
    /// read only for the operator's definitions.
    pub fn resolve(
        &self,
        name: &str,
        origin: Origin,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<ServerSpec, ConfigError> {
        let none = |_: &str| None;
        let env: &dyn Fn(&str) -> Option<String> = match origin {
            Origin::Operator => env,
            Origin::Session => &none,
        };
        let expand_map = |map: &BTreeMap<String, String>| {
            map.iter()
                .map(|(k, v)| Ok((k.clone(), expand(name, v, env)?)))
                .collect::<Result<BTreeMap<_, _>, ConfigError>>()
        };
        if origin == Origin::Session && !self.read_only_tools.is_empty() {
            return Err(server_err(
                name,
                "readOnlyTools is for the daemon's operator ($FORKD_HOME/mcp.json): a session \
                 cannot mark its own tools read-only",
            ));
        }
        let kind = self.kind.as_deref().unwrap_or(match self.url {
            Some(_) if self.command.is_none() => "http",
            _ => "stdio",
        });
        let transport = match kind {
            "stdio" => {
                let command = self
                    .command
                    .clone()
                    .filter(|c| !c.is_empty())
                    .ok_or_else(|| server_err(name, "a stdio server needs a \"command\""))?;
                if self.url.is_some() || !self.headers.is_empty() {
                    return Err(server_err(name, "a stdio server takes no url or headers"));
                }
                let mode = match self.sandbox.as_deref() {
                    None => SandboxMode::WorkspaceWrite,
                    Some(mode) => SandboxMode::parse(mode).ok_or_else(|| {
                        server_err(
                            name,
                            format!(
                                "unknown sandbox {mode:?} (workspace-write, read-only, \
                                 full-access)"
                            ),
                        )
                    })?,
                };
                Transport::Stdio {
                    command,
                    args: self.args.clone(),
                    env: expand_map(&self.env)?,
                    sandbox: Sandbox {
                        mode,
                        allow_network: self.allow_network.unwrap_or(false),
                        unix_sockets: false,
                    },
                }
            }
            "http" | "streamable-http" | "streamableHttp" => {
                let url = self
                    .url
                    .as_deref()
                    .ok_or_else(|| server_err(name, "an http server needs a \"url\""))?;
                let url = expand(name, url, env)?;
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(server_err(name, format!("url {url:?} is not http(s)")));
                }
                if self.command.is_some() || !self.args.is_empty() || !self.env.is_empty() {
                    return Err(server_err(
                        name,
                        "an http server takes no command, args or env",
                    ));
                }
                Transport::Http {
                    url,
                    headers: expand_map(&self.headers)?,
                }
            }
            "sse" => {
                return Err(server_err(
                    name,
                    "the deprecated SSE transport is not supported; use streamable HTTP (\"type\": \"http\")",
                ));
            }
            other => return Err(server_err(name, format!("unknown type {other:?}"))),
        };
        Ok(ServerSpec {
            name: name.to_owned(),
            origin,
            transport,
            read_only_tools: self.read_only_tools.iter().cloned().collect(),
            call_timeout: self
                .timeout_secs
                .filter(|s| *s > 0)
                .map_or(DEFAULT_CALL_TIMEOUT, Duration::from_secs),
        })
    }
}

impl ServerSpec {
    pub fn is_stdio(&self) -> bool {
        matches!(self.transport, Transport::Stdio { .. })
    }

    /// A digest of everything that makes the server what it is: two specs with the same digest
    /// may share one process (within one tenant).
    pub fn digest(&self) -> String {
        let mut hasher = Sha256::new();
        hasher.update(format!("{:?}", (&self.name, &self.transport)).as_bytes());
        hex::encode(&hasher.finalize()[..12])
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        (name == "TOKEN").then(|| "s3cret".to_owned())
    }

    #[test]
    fn the_mcp_json_format_parses_both_transports() {
        let file = McpFile::parse(
            r#"{"mcpServers": {
                "files": {"command": "npx", "args": ["-y", "srv"], "env": {"K": "${TOKEN}"},
                          "readOnlyTools": ["read"], "sandbox": "read-only", "timeoutSecs": 5},
                "remote": {"type": "http", "url": "https://x.test/mcp",
                           "headers": {"Authorization": "Bearer ${TOKEN}"}}
            }}"#,
        )
        .unwrap();
        let files = file.servers["files"]
            .resolve("files", Origin::Operator, &env)
            .unwrap();
        match &files.transport {
            Transport::Stdio { env, sandbox, .. } => {
                assert_eq!(env["K"], "s3cret");
                assert_eq!(sandbox.mode, SandboxMode::ReadOnly);
                // Off unless the definition says otherwise.
                assert!(!sandbox.allow_network);
            }
            other => panic!("{other:?}"),
        }
        assert!(files.read_only_tools.contains("read"));
        assert_eq!(files.call_timeout, Duration::from_secs(5));
        let remote = file.servers["remote"]
            .resolve("remote", Origin::Operator, &env)
            .unwrap();
        assert_eq!(
            remote.transport,
            Transport::Http {
                url: "https://x.test/mcp".into(),
                headers: BTreeMap::from([("Authorization".into(), "Bearer s3cret".into())]),
            }
        );
    }

    #[test]
    fn a_session_definition_reads_nothing_from_the_daemon_environment() {
        let def = ServerDef {
            command: Some("srv".into()),
            env: BTreeMap::from([("K".into(), "${TOKEN}".into())]),
            ..ServerDef::default()
        };
        let err = def.resolve("s", Origin::Session, &env).unwrap_err();
        assert!(err.to_string().contains("TOKEN is not set"), "{err}");
        let def = ServerDef {
            command: Some("srv".into()),
            read_only_tools: vec!["x".into()],
            ..ServerDef::default()
        };
        let err = def.resolve("s", Origin::Session, &env).unwrap_err();
        assert!(err.to_string().contains("operator"), "{err}");
    }

    #[test]
    fn expansion_takes_defaults_and_refuses_unset_variables() {
        assert_eq!(expand("s", "a${NOPE:-b}c", &env).unwrap(), "abc");
        assert_eq!(
            expand("s", "${TOKEN}${TOKEN}", &env).unwrap(),
            "s3crets3cret"
        );
        assert!(expand("s", "${NOPE}", &env).is_err());
        assert!(expand("s", "${TOKEN", &env).is_err());
    }
}
