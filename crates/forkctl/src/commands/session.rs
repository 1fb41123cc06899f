//! `forkctl session create|get|list|send`: parent sessions, whose context every fork child inherits.

use std::path::{Path, PathBuf};

use clap::builder::PossibleValuesParser;
use clap::{Args, Subcommand};
use forkd_core::session::{PermissionMode, SandboxMode};
use forkd_proto::v1::session_event::Event;
use forkd_proto::v1::{
    BranchSessionRequest, CompactSessionRequest, ContextFile, CreateSessionRequest,
    GetSessionRequest, ListSessionsRequest, MergeBranchRequest, SendMessageRequest, Session,
};
use serde_json::json;

use crate::client::Client;
use crate::exit::{self, CliError};
use crate::output::{Printer, human, session_json};

#[derive(Debug, Args)]
pub struct SessionArgs {
    #[command(subcommand)]
    pub command: SessionCommand,
}

#[derive(Debug, Subcommand)]
pub enum SessionCommand {
    /// Create a parent session; prints its id.
    Create(Box<CreateArgs>),
    /// Show one session.
    Get {
        /// The session's id.
        session_id: String,
    },
    /// List every session.
    List,
    /// Run one parent turn on a message, streaming it (text, tool calls, forks, the end).
    Send {
        /// The session's id.
        session_id: String,
        /// The message (`-` reads stdin).
        text: String,
        /// Store the message once per key: run the same command again with the same key (after
        /// an UNAVAILABLE error, say) and the message is not stored twice.
        #[arg(long)]
        idempotency_key: Option<String>,
    },
    /// Branch the session: a new session whose history is this one's up to a point between
    /// turns, read from the cache the session's own requests wrote; prints its id. Files are not
    /// rewound: the branch sees the workspace as it is now.
    Branch(BranchArgs),
    /// Bring a branch's conclusion back: append one <branch-report> note (its point, its turns,
    /// its last reply) to the session it was branched from.
    Merge {
        /// The branch.
        session_id: String,
        /// Have the branch's model summarize the branch first (one request, which reads the
        /// branch's cache); the note carries the summary instead of the last reply.
        #[arg(long)]
        summary: bool,
        /// Merge once per key: the same command again appends no second note.
        #[arg(long)]
        idempotency_key: Option<String>,
    },
    /// What an uploaded session's workspace changed since its upload (`--upload`), as
    /// `forkctl diff` shows an isolated child's: a diff, `--stat`, or `--format patch`.
    Diff {
        /// The session's id.
        session_id: String,
        /// List the changed files with their line counts instead of the diff.
        #[arg(long)]
        stat: bool,
        /// `diff` (binary patches' bodies left out) or `patch` (what `git apply` takes).
        #[arg(long, value_enum, default_value_t = super::changes::Format::Diff)]
        format: super::changes::Format,
    },
    /// Print a session's tree: its origin's, from the first session down, with each session's
    /// branches and fork batches.
    Tree {
        /// Any session of the tree (it is marked).
        session_id: String,
    },
    /// Compact the session's transcript now: the model summarizes it up to its last reply, and
    /// later requests start from the summary (refused while a turn runs).
    Compact {
        /// The session's id.
        session_id: String,
        /// What the summary must keep, added to forkd's instruction.
        #[arg(long, value_name = "TEXT")]
        instructions: Option<String>,
    },
}

#[derive(Debug, Args)]
pub struct BranchArgs {
    /// The session to branch from.
    pub session_id: String,
    /// Start after turn K ends (turn K is the K-th user message's; `forkctl session get` lists
    /// them). Default: after the last finished turn.
    #[arg(long, value_name = "K", conflicts_with = "before")]
    pub at_turn: Option<u32>,
    /// Start just before the user message at SEQ (it must begin a turn): the branch's first
    /// message takes its place.
    #[arg(long, value_name = "SEQ")]
    pub before: Option<u64>,
    /// Another workspace for the branch (its system prompt then names it, so the branch reads no
    /// cache from its origin). Default: the origin's.
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// Create the branch once per key: the same command again returns the same branch.
    #[arg(long)]
    pub idempotency_key: Option<String>,
}

/// The sandbox modes `--sandbox` takes (core's table).
pub(crate) fn sandbox_modes() -> PossibleValuesParser {
    PossibleValuesParser::new(SandboxMode::ALL.map(SandboxMode::as_str))
}

/// Permission modes (core's table); checked here so a typo is a usage error, not a round trip.
pub(crate) fn permission_modes() -> PossibleValuesParser {
    PossibleValuesParser::new(PermissionMode::ALL.map(PermissionMode::as_str))
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    /// The system prompt, read from this file (`-` reads stdin).
    #[arg(long, value_name = "FILE")]
    pub system_file: PathBuf,

    /// A file placed in the session's first user message; repeat for more, in order.
    #[arg(long = "context-file", value_name = "FILE")]
    pub context_files: Vec<PathBuf>,

    /// A model from forkd's price table; the daemon's default when omitted.
    #[arg(long)]
    pub model: Option<String>,

    /// The directory the session's tools work in, on the daemon's machine. When omitted: the
    /// current directory over the Unix socket; over TCP none, and the daemon gives a token
    /// tenant a fresh empty workspace of its own.
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,

    /// Upload DIR, on this machine, and work in the daemon's copy of it (for a daemon on
    /// another machine): git's files when DIR is in a git work tree (tracked, and untracked ones
    /// it does not ignore), else every file its .gitignore and .ignore files keep; never .git.
    /// Only the contents the daemon lacks are sent.
    #[arg(long, value_name = "DIR", conflicts_with = "workspace")]
    pub upload: Option<PathBuf>,

    /// With --upload: also send the files the ignore rules leave out that match PATTERN
    /// (gitignore syntax, relative to DIR; a directory brings what is under it), e.g. `.env`
    /// or `vendor/`. Repeat for more.
    #[arg(long = "include", value_name = "PATTERN", requires = "upload")]
    pub include: Vec<String>,

    /// Coordinator mode: the session delegates to typed agents and never forks.
    #[arg(long)]
    pub coordinator: bool,

    /// Give the model the read-only `Capacity` tool: the daemon's free slots, the tenant's
    /// queue and budget, the limiter for its model, and when a fork of N children would start
    /// and finish — to size its fan-out.
    #[arg(long)]
    pub capacity_tool: bool,

    /// A client will answer permission prompts (SubscribePermissions / AnswerPermission); needed
    /// for `--permission-mode bubble`.
    #[arg(long)]
    pub interactive: bool,

    /// How tool calls are permitted.
    #[arg(long, value_name = "MODE", value_parser = permission_modes())]
    pub permission_mode: Option<String>,

    /// What its Bash commands may touch: `workspace-write` (writes only in the workspace and a
    /// private temporary directory; the daemon's home and other workspaces hidden),
    /// `read-only`, or `full-access` (unconfined). The daemon's default when omitted.
    #[arg(long, value_name = "MODE", value_parser = sandbox_modes())]
    pub sandbox: Option<String>,

    /// Let its Bash commands use the network (off in a sandbox by default).
    #[arg(long)]
    pub allow_network: bool,

    /// Let its Bash commands create Unix sockets, and so reach any listener of the daemon's
    /// user (PostgreSQL's, Docker's, an X server's): as strong as full-access. For the local
    /// user, and for tenants the operator allows (allow_unix_sockets).
    #[arg(long)]
    pub allow_unix_sockets: bool,

    /// An MCP server the daemon's operator defined ($FORKD_HOME/mcp.json), by name; its tools
    /// join the session's as mcp__NAME__TOOL. Repeat for more.
    #[arg(long = "mcp", value_name = "NAME")]
    pub mcp: Vec<String>,

    /// The session's own MCP servers, a .mcp.json file ({"mcpServers": {...}}). Accepted from the
    /// local user (the Unix socket) and from tenants the daemon's configuration allows.
    #[arg(long, value_name = "FILE")]
    pub mcp_config: Option<PathBuf>,

    /// The session's own hooks: a Claude Code settings.json whose "hooks" block runs after the
    /// operator's, each command in the session's sandbox (docs/contracts.md, "Hooks").
    #[arg(long, value_name = "FILE")]
    pub hooks: Option<PathBuf>,

    /// Extended-thinking budget in tokens; 0 disables thinking.
    #[arg(long, value_name = "TOKENS", default_value_t = 0)]
    pub thinking_budget: u32,

    /// The most tokens each model request may generate; the daemon's default when omitted.
    #[arg(long, value_name = "TOKENS", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_tokens: Option<u32>,

    /// Allow a tool call without asking, e.g. `Bash(cargo test:*)` or `Write(src/**)`; repeat.
    #[arg(long = "allow", value_name = "RULE")]
    pub allow_rules: Vec<String>,

    /// Refuse a tool call whatever the mode, e.g. `Bash(rm:*)`; repeat. Deny wins over allow.
    #[arg(long = "deny", value_name = "RULE")]
    pub deny_rules: Vec<String>,
}

/// Runs a `session` command; `over_socket`: the daemon is reached over its Unix socket (the
/// same machine), so `create` may send the working directory as the workspace.
pub async fn run(
    args: SessionArgs,
    over_socket: bool,
    client: &mut Client,
    out: &Printer,
) -> anyhow::Result<u8> {
    match args.command {
        SessionCommand::Create(create) => run_create(*create, over_socket, client, out).await,
        SessionCommand::Get { session_id } => {
            let reply = client
                .get_session(GetSessionRequest { session_id })
                .await?
                .into_inner();
            let session = reply.session.unwrap_or_default();
            if out.is_json() {
                out.value(&session_json(&session))?;
            } else {
                out.line(human::session_table(&session))?;
            }
            Ok(exit::OK)
        }
        SessionCommand::List => run_list(client, out).await,
        SessionCommand::Branch(branch) => run_branch(branch, client, out).await,
        SessionCommand::Merge {
            session_id,
            summary,
            idempotency_key,
        } => {
            let merged = client
                .merge_branch(MergeBranchRequest {
                    session_id,
                    summary,
                    idempotency_key: idempotency_key.unwrap_or_default(),
                })
                .await?
                .into_inner();
            if out.is_json() {
                out.value(&json!({
                    "origin_session_id": merged.origin_session_id,
                    "seq": merged.seq,
                    "note": merged.note,
                }))?;
            } else {
                out.line(format!(
                    "merged into {} as message {}",
                    merged.origin_session_id, merged.seq
                ))?;
            }
            Ok(exit::OK)
        }
        SessionCommand::Tree { session_id } => super::tree::run(&session_id, client, out).await,
        SessionCommand::Diff {
            session_id,
            stat,
            format,
        } => super::changes::session_diff(&session_id, stat, format, client, out).await,
        SessionCommand::Send {
            session_id,
            text,
            idempotency_key,
        } => {
            let text = if text == "-" {
                read_text(Path::new("-"), "message")?
            } else {
                text
            };
            let request = SendMessageRequest {
                session_id,
                text,
                idempotency_key: idempotency_key.unwrap_or_default(),
            };
            run_send(request, client, out).await
        }
        SessionCommand::Compact {
            session_id,
            instructions,
        } => {
            let reply = client
                .compact_session(CompactSessionRequest {
                    session_id,
                    instructions: instructions.unwrap_or_default(),
                })
                .await?
                .into_inner();
            if out.is_json() {
                out.value(&serde_json::json!({
                    "from_seq": reply.from_seq,
                    "to_seq": reply.to_seq,
                    "summary_json": reply.summary_json,
                }))?;
            } else {
                out.line(format!(
                    "compacted: messages {}–{} summarized; requests go on from message {}",
                    reply.from_seq,
                    reply.to_seq.saturating_sub(1),
                    reply.to_seq
                ))?;
            }
            Ok(exit::OK)
        }
    }
}

/// Streams a parent turn: text as it arrives, one line per tool call, result and fork.
async fn run_send(
    request: SendMessageRequest,
    client: &mut Client,
    out: &Printer,
) -> anyhow::Result<u8> {
    let mut stream = client.send_message(request).await?.into_inner();
    let mut ended = false;
    while let Some(event) = stream.message().await? {
        let Some(event) = event.event else { continue };
        ended |= matches!(event, Event::TurnEnded(_) | Event::AsyncLaunched(_));
        if out.is_json() {
            out.value(&session_event_json(&event))?;
        } else {
            print_event(&event, out)?;
        }
    }
    if !ended {
        return Err(
            CliError::StreamEnded("the turn's stream ended before the turn did".into()).into(),
        );
    }
    Ok(exit::OK)
}

fn print_event(event: &Event, out: &Printer) -> std::io::Result<()> {
    use std::io::Write;
    match event {
        Event::TextDelta(text) => {
            let mut stdout = std::io::stdout().lock();
            stdout.write_all(text.as_bytes())?;
            stdout.flush()
        }
        Event::ToolCall(c) => out.line(format!("\n→ {} {}", c.name, c.input_json)),
        Event::ToolResult(r) => {
            let first = r.content.lines().next().unwrap_or("");
            let mark = if r.is_error { "✗" } else { "←" };
            out.line(format!("{mark} {first}"))
        }
        Event::ForkLaunched(f) => out.line(format!(
            "⑂ forked batch {} with {} children: {}",
            f.batch_id,
            f.agent_ids.len(),
            f.agent_ids.join(" ")
        )),
        Event::AsyncLaunched(a) => out.line(format!(
            "\nasync_launched: the turn of {} goes on in the background; its results land in \
             the session's transcript, and its end in a `turn` notification (forkctl watch)",
            a.agent_id
        )),
        Event::TurnEnded(end) => {
            let u = end.usage.unwrap_or_default();
            out.line(format!(
                "\n— turn ended ({}): in {} write {} read {} out {}, ${:.4}",
                if end.stop_reason.is_empty() {
                    "unknown"
                } else {
                    &end.stop_reason
                },
                u.input_tokens,
                u.cache_creation_input_tokens,
                u.cache_read_input_tokens,
                u.output_tokens,
                end.cost_usd
            ))
        }
    }
}

/// One JSON object per event: `{"event": "text_delta" | "tool_call" | …, …}`.
fn session_event_json(event: &Event) -> serde_json::Value {
    match event {
        Event::TextDelta(text) => json!({"event": "text_delta", "text": text}),
        Event::ToolCall(c) => json!({
            "event": "tool_call", "tool_use_id": c.tool_use_id, "name": c.name,
            "input": serde_json::from_str::<serde_json::Value>(&c.input_json).unwrap_or_default(),
        }),
        Event::ToolResult(r) => json!({
            "event": "tool_result", "tool_use_id": r.tool_use_id, "content": r.content,
            "is_error": r.is_error,
        }),
        Event::ForkLaunched(f) => json!({
            "event": "fork_launched", "batch_id": f.batch_id, "agent_ids": f.agent_ids,
        }),
        Event::AsyncLaunched(a) => json!({
            "event": "async_launched", "status": "async_launched", "agent_id": a.agent_id,
        }),
        Event::TurnEnded(end) => json!({
            "event": "turn_ended", "stop_reason": end.stop_reason, "text": end.text,
            "usage": crate::output::usage_json(end.usage.as_ref()), "cost_usd": end.cost_usd,
        }),
    }
}

async fn run_create(
    args: CreateArgs,
    over_socket: bool,
    client: &mut Client,
    out: &Printer,
) -> anyhow::Result<u8> {
    let upload = args.upload.clone().map(|dir| (dir, args.include.clone()));
    // The request first: a missing system file is reported before a long upload.
    let mut request = create_request(args, over_socket)?;
    let uploaded = match &upload {
        Some((dir, include)) => {
            let uploaded = super::upload::upload(client, dir, include).await?;
            if !out.is_json() {
                eprintln!("{}", uploaded.summary(dir));
            }
            request.upload_id.clone_from(&uploaded.upload_id);
            Some(uploaded)
        }
        None => None,
    };
    let reply = client.create_session(request).await?.into_inner();
    let session_id = reply.session.map(|s| s.session_id).unwrap_or_default();
    if out.is_json() {
        let mut value = json!({ "session_id": session_id });
        if let (Some(uploaded), Some(map)) = (&uploaded, value.as_object_mut()) {
            map.insert("upload".into(), uploaded.to_json());
        }
        out.value(&value)?;
    } else {
        out.line(session_id)?;
    }
    Ok(exit::OK)
}

async fn run_branch(args: BranchArgs, client: &mut Client, out: &Printer) -> anyhow::Result<u8> {
    use forkd_proto::v1::branch_session_request::Point;
    let point = match (args.at_turn, args.before) {
        (Some(k), _) => Some(Point::AtTurn(k)),
        (None, Some(seq)) => Some(Point::BeforeSeq(seq)),
        (None, None) => None,
    };
    let workspace = match &args.workspace {
        Some(dir) => absolute_workspace(dir)?,
        None => String::new(),
    };
    let reply = client
        .branch_session(BranchSessionRequest {
            session_id: args.session_id,
            point,
            workspace,
            idempotency_key: args.idempotency_key.unwrap_or_default(),
        })
        .await?
        .into_inner();
    let session = reply.session.unwrap_or_default();
    if out.is_json() {
        out.value(&session_json(&session))?;
    } else {
        out.line(&session.session_id)?;
        // On stderr: stdout stays the id alone, for `B=$(forkctl session branch …)`.
        eprintln!(
            "branched from {} after turn {} (its first {} messages); the workspace is as it is \
             now: files are not rewound",
            session.branch_of, session.branch_turn, session.branch_point
        );
    }
    Ok(exit::OK)
}

/// Reads the files on this side: the daemon may run elsewhere, and the paths are the user's.
fn create_request(args: CreateArgs, over_socket: bool) -> Result<CreateSessionRequest, CliError> {
    let system_prompt = read_text(&args.system_file, "system file")?;
    let context_files = args
        .context_files
        .iter()
        .map(|path| {
            Ok(ContextFile {
                path: path.display().to_string(),
                content: read_text(path, "context file")?,
            })
        })
        .collect::<Result<_, CliError>>()?;
    // Relative to the user's shell, not to the daemon's working directory. The working
    // directory is sent only to a daemon on this machine (its Unix socket): over TCP, where
    // this directory means nothing to the daemon, none is sent unless given, and a token
    // tenant gets a fresh empty workspace of its own. An upload is the workspace: none is sent.
    let workspace = match args.workspace {
        Some(dir) => absolute_workspace(&dir)?,
        None if args.upload.is_some() => String::new(),
        None if over_socket => absolute_workspace(Path::new("."))?,
        None => String::new(),
    };
    Ok(CreateSessionRequest {
        system_prompt,
        context_files,
        model: args.model.unwrap_or_default(),
        workspace,
        coordinator: args.coordinator,
        capacity_tool: args.capacity_tool,
        interactive: args.interactive,
        permission_mode: args.permission_mode.unwrap_or_default(),
        sandbox: args.sandbox.unwrap_or_default(),
        allow_network: args.allow_network,
        unix_sockets: args.allow_unix_sockets,
        mcp_servers: args.mcp,
        mcp_config_json: match &args.mcp_config {
            Some(path) => read_text(path, "MCP configuration")?,
            None => String::new(),
        },
        hooks_json: match &args.hooks {
            Some(path) => read_text(path, "hooks settings")?,
            None => String::new(),
        },
        thinking_budget_tokens: args.thinking_budget,
        max_tokens: args.max_tokens.unwrap_or_default(),
        allow_rules: args.allow_rules,
        deny_rules: args.deny_rules,
        ..Default::default()
    })
}

/// The workspace the daemon gets: an absolute UTF-8 path, since the daemon's working directory
/// is not the user's.
pub(crate) fn absolute_workspace(dir: &Path) -> Result<String, CliError> {
    std::path::absolute(dir)
        .ok()
        .and_then(|abs| abs.to_str().map(str::to_owned))
        .ok_or_else(|| {
            CliError::InvalidInput(format!(
                "cannot use workspace {}: it has no absolute UTF-8 form",
                dir.display()
            ))
        })
}

/// Reads a text file (`-`: stdin); `what` names it in the error.
pub(crate) fn read_text(path: &Path, what: &str) -> Result<String, CliError> {
    let result = if path == Path::new("-") {
        std::io::read_to_string(std::io::stdin())
    } else {
        std::fs::read_to_string(path)
    };
    result
        .map_err(|e| CliError::InvalidInput(format!("cannot read {what} {}: {e}", path.display())))
}

async fn run_list(client: &mut Client, out: &Printer) -> anyhow::Result<u8> {
    let mut sessions: Vec<Session> = Vec::new();
    list_sessions(client, |page| {
        if out.is_json() {
            // Printed page by page, so a long listing starts at once.
            for session in &page {
                out.value(&session_json(session))?;
            }
        } else {
            sessions.extend(page);
        }
        Ok(())
    })
    .await?;
    if !out.is_json() {
        out.line(human::sessions_table(&sessions))?;
    }
    Ok(exit::OK)
}

/// Every session, following the pages; `each_page` gets each page as it arrives.
pub(crate) async fn list_sessions(
    client: &mut Client,
    each_page: impl FnMut(Vec<Session>) -> std::io::Result<()>,
) -> anyhow::Result<()> {
    super::paged(client, each_page, |mut client, page_token| async move {
        let request = ListSessionsRequest {
            page_size: 0,
            page_token,
        };
        let page = client.list_sessions(request).await?.into_inner();
        Ok((page.sessions, page.next_page_token))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(system_file: PathBuf) -> CreateArgs {
        CreateArgs {
            system_file,
            context_files: Vec::new(),
            model: None,
            workspace: None,
            upload: None,
            include: Vec::new(),
            coordinator: false,
            capacity_tool: false,
            interactive: false,
            permission_mode: None,
            sandbox: None,
            allow_network: false,
            allow_unix_sockets: false,
            mcp: Vec::new(),
            mcp_config: None,
            hooks: None,
            thinking_budget: 0,
            max_tokens: None,
            allow_rules: Vec::new(),
            deny_rules: Vec::new(),
        }
    }

    #[test]
    fn files_are_read_here_and_the_workspace_made_absolute() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let system = dir.path().join("system.md");
        let context = dir.path().join("notes.md");
        std::fs::write(&system, "You are terse.")?;
        std::fs::write(&context, "# Notes")?;
        let mut create = args(system);
        create.context_files = vec![context.clone()];
        create.workspace = Some(PathBuf::from("some/dir"));
        create.model = Some("sim-large".into());
        create.max_tokens = Some(48);

        let request = create_request(create, true)?;
        assert_eq!(request.max_tokens, 48);
        assert_eq!(request.system_prompt, "You are terse.");
        assert_eq!(request.context_files.len(), 1);
        assert_eq!(request.context_files[0].path, context.display().to_string());
        assert_eq!(request.context_files[0].content, "# Notes");
        assert!(Path::new(&request.workspace).is_absolute());
        assert!(request.workspace.ends_with("some/dir"));
        assert_eq!(request.model, "sim-large");
        Ok(())
    }

    /// `session create` parsed from `args` (after `--system-file s.md`).
    fn parse_create(args: &[&str]) -> Result<CreateArgs, clap::Error> {
        use clap::Parser as _;
        let line = ["forkctl", "session", "create", "--system-file", "s.md"];
        let cli = crate::cli::Cli::try_parse_from(line.iter().chain(args))?;
        match cli.command {
            crate::cli::Command::Session(SessionArgs {
                command: SessionCommand::Create(create),
            }) => Ok(*create),
            other => panic!("expected session create, got {other:?}"),
        }
    }

    #[test]
    fn an_upload_sends_no_workspace_and_excludes_one() -> anyhow::Result<()> {
        let create = parse_create(&["--upload", "repo", "--include", ".env", "--include", "v/"])?;
        assert_eq!(create.upload.as_deref(), Some(Path::new("repo")));
        assert_eq!(create.include, [".env", "v/"]);

        let dir = tempfile::tempdir()?;
        let system = dir.path().join("system.md");
        std::fs::write(&system, "s")?;
        let mut create = args(system);
        create.upload = Some(PathBuf::from("repo"));
        // Not even the working directory over the Unix socket.
        assert_eq!(create_request(create, true)?.workspace, "");

        let both = parse_create(&["--upload", "repo", "--workspace", "w"]).map(|_| ());
        let Err(err) = both else {
            panic!("--upload with --workspace was accepted")
        };
        assert_eq!(err.kind(), clap::error::ErrorKind::ArgumentConflict);
        let alone = parse_create(&["--include", ".env"]).map(|_| ());
        let Err(err) = alone else {
            panic!("--include without --upload was accepted")
        };
        assert_eq!(err.kind(), clap::error::ErrorKind::MissingRequiredArgument);
        Ok(())
    }

    #[test]
    fn a_missing_file_is_an_invalid_input() {
        let result = create_request(args(PathBuf::from("/nonexistent/system.md")), true);
        let Err(CliError::InvalidInput(msg)) = result else {
            panic!("expected InvalidInput, got {result:?}");
        };
        assert!(
            msg.starts_with("cannot read system file /nonexistent/system.md"),
            "{msg}"
        );
    }
}
