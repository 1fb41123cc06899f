//! The command line: global options and the subcommands, parsed with clap's derive API.

use clap::{Parser, Subcommand};

use crate::commands::{
    attach, cache, calc, capacity, changes, fork, kill, logs, ps, run, schedule, session, stats,
    top, ui, upload, watch, webhook,
};

/// forkctl: a thin client of the forkd daemon.
///
/// Data goes to stdout (with `--json`, one JSON object per line), messages to stderr.
/// Exit codes: 0 ok, 1 a child failed, was killed or timed out (`fork --wait`, `run --wait`),
/// 2 usage error, 3 not found, 4 invalid argument, 5 daemon unavailable, 6 any other error.
#[derive(Debug, Parser)]
#[command(name = "forkctl", version, propagate_version = true)]
pub struct Cli {
    /// The daemon's address: `unix:/path/forkd.sock`, `http://host:port` or `https://host:port`.
    /// Default: `unix:$FORKD_HOME/forkd.sock` (FORKD_HOME defaults to `~/.forkd`).
    /// The bearer token, if any, comes from FORKD_TOKEN.
    #[arg(long, global = true, env = "FORKD_ADDR", value_name = "ADDR")]
    pub addr: Option<String>,

    /// For `https://` addresses: trust this PEM CA certificate (a private CA) instead of the
    /// system's roots.
    #[arg(long, global = true, env = "FORKD_CA_CERT", value_name = "FILE")]
    pub ca_cert: Option<std::path::PathBuf>,

    /// Print one JSON object per line instead of human-readable text.
    #[arg(long, global = true)]
    pub json: bool,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create, inspect and list parent sessions.
    Session(session::SessionArgs),
    /// Submit a fork batch: one child per directive, all sharing the session's context.
    Fork(fork::ForkArgs),
    /// Send a tree to the daemon (only the contents its store lacks) and print the upload's id,
    /// which sessions name; `session create --upload DIR` does this and creates the session.
    Upload(upload::UploadArgs),
    /// The CI form: create a session and fork a batch from one YAML file, idempotent by its key.
    Run(run::RunArgs),
    /// Follow task notifications.
    Watch(watch::WatchArgs),
    /// List agents with their state, tokens, cache-read share and cost.
    Ps(ps::PsArgs),
    /// A live view of the agents: sessions → batches → children, with state, tokens, cache-read
    /// share and cost. Off a terminal, or with `--json`, prints one snapshot and exits.
    Top(top::TopArgs),
    /// Print an agent's transcript.
    Logs(logs::LogsArgs),
    /// Follow an agent: its messages as they come, until it ends or is handed to the background.
    Attach(attach::AttachArgs),
    /// Hand an agent's attached clients to the background; the agent goes on.
    Bg(attach::BgArgs),
    /// Stop an agent at once; it ends `killed` with its partial result.
    Kill(kill::KillArgs),
    /// Isolated children's changes (a batch forked with `--isolation copy`): a diff, or with
    /// `--format patch` a patch `git apply` takes as is (binary files included).
    Diff(changes::DiffArgs),
    /// Apply isolated children's changes to their session's workspace (or with `--to DIR` to a
    /// directory here), in order; a child with a conflict stays unapplied (exit 1), per file.
    Apply(changes::ApplyArgs),
    /// Throw isolated children's copies away (their changes stay on record).
    Discard(changes::TargetArgs),
    /// Cache efficiency of a batch or session: tokens, reads, writes, cost vs independent agents.
    Stats(stats::StatsArgs),
    /// Cache diagnostics: where two requests' bodies part (`explain`), recorded requests.
    Cache(cache::CacheArgs),
    /// The fork cost calculator: a batch of forks against as many independent agents.
    Calc(calc::CalcArgs),
    /// What the daemon's provider limiter believes now, per provider and model: the limits it
    /// paces by (learned from the provider's headers or its refusals), requests in flight,
    /// waiting and throttled, refusals in the last minute.
    Capacity(capacity::CapacityArgs),
    /// Print a one-time link that signs your browser in to the daemon's web view as its own
    /// user (tenant `local`). Over the Unix socket only; valid for 60 seconds, once.
    Ui(ui::UiArgs),
    /// Your webhooks: URLs your notifications are posted to, signed (Standard Webhooks), retried
    /// until taken.
    Webhook(webhook::WebhookArgs),
    /// Your schedules: a run file's batch forked on a clock (cron, in a time zone), each firing
    /// in a session of its own.
    Schedule(schedule::ScheduleArgs),
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::error::ErrorKind;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("forkctl").chain(args.iter().copied()))
    }

    #[test]
    fn global_flags_go_before_or_after_the_subcommand() -> anyhow::Result<()> {
        let cli = parse(&["--json", "ps", "--addr", "unix:/tmp/s.sock", "-a"])?;
        assert!(cli.json);
        assert_eq!(cli.addr.as_deref(), Some("unix:/tmp/s.sock"));
        let Command::Ps(ps) = cli.command else {
            panic!("expected ps, got {:?}", cli.command);
        };
        assert!(ps.all);
        assert_eq!(cli.ca_cert, None);
        let cli = parse(&["ps", "--ca-cert", "ca.pem"])?;
        assert_eq!(cli.ca_cert.as_deref(), Some(std::path::Path::new("ca.pem")));
        Ok(())
    }

    #[test]
    fn session_create_takes_repeated_context_files() -> anyhow::Result<()> {
        let cli = parse(&[
            "session",
            "create",
            "--system-file",
            "sys.md",
            "--context-file",
            "a.rs",
            "--context-file",
            "b.rs",
            "--permission-mode",
            "acceptEdits",
            "--thinking-budget",
            "2048",
            "--coordinator",
            "--capacity-tool",
        ])?;
        let Command::Session(session::SessionArgs {
            command: session::SessionCommand::Create(create),
        }) = cli.command
        else {
            panic!("expected session create, got {:?}", cli.command);
        };
        assert_eq!(create.system_file.to_str(), Some("sys.md"));
        assert_eq!(create.context_files.len(), 2);
        assert_eq!(create.permission_mode.as_deref(), Some("acceptEdits"));
        assert_eq!(create.thinking_budget, 2048);
        assert!(create.coordinator);
        assert!(create.capacity_tool);
        Ok(())
    }

    #[test]
    fn session_create_rejects_an_unknown_permission_mode() {
        let err = parse(&[
            "session",
            "create",
            "--system-file",
            "s",
            "--permission-mode",
            "yolo",
        ]);
        assert!(matches!(err, Err(e) if e.kind() == ErrorKind::InvalidValue));
    }

    #[test]
    fn fork_collects_directives_in_order() -> anyhow::Result<()> {
        let cli = parse(&["fork", "S1", "-d", "one", "--directive", "two", "--wait"])?;
        let Command::Fork(fork) = cli.command else {
            panic!("expected fork, got {:?}", cli.command);
        };
        assert_eq!(fork.session_id, "S1");
        assert_eq!(fork.directives, ["one", "two"]);
        assert!(fork.wait);
        assert!(!fork.no_gating);
        Ok(())
    }

    #[test]
    fn fork_takes_limits_for_its_children() -> anyhow::Result<()> {
        let cli = parse(&[
            "fork",
            "S1",
            "-d",
            "one",
            "--timeout",
            "10m",
            "--max-turns",
            "30",
        ])?;
        let Command::Fork(fork) = cli.command else {
            panic!("expected fork, got {:?}", cli.command);
        };
        let limits = fork.limits.limits().unwrap_or_default();
        assert_eq!((limits.timeout_ms, limits.max_turns), (600_000, 30));
        assert_eq!(limits.timeout_excludes_throttle, None);
        let err = parse(&["fork", "S1", "-d", "one", "--idle-timeout", "0s"]);
        assert!(matches!(err, Err(e) if e.kind() == ErrorKind::ValueValidation));
        let cli = parse(&["fork", "S1", "-d", "one"])?;
        let Command::Fork(fork) = cli.command else {
            panic!("expected fork, got {:?}", cli.command);
        };
        assert_eq!(fork.limits.limits(), None);
        Ok(())
    }

    #[test]
    fn fork_needs_at_least_one_directive() {
        let err = parse(&["fork", "S1"]);
        assert!(matches!(err, Err(e) if e.kind() == ErrorKind::MissingRequiredArgument));
    }

    #[test]
    fn watch_defaults_to_following_from_the_start() -> anyhow::Result<()> {
        let cli = parse(&["watch", "--batch", "B"])?;
        let Command::Watch(watch) = cli.command else {
            panic!("expected watch, got {:?}", cli.command);
        };
        assert_eq!(watch.batch.as_deref(), Some("B"));
        assert_eq!(watch.since, 0);
        assert!(!watch.no_follow);
        Ok(())
    }

    #[test]
    fn stats_takes_a_batch_or_a_session_not_both() {
        let err = parse(&["stats", "--batch", "B", "--session", "S"]);
        assert!(matches!(err, Err(e) if e.kind() == ErrorKind::ArgumentConflict));
    }

    #[test]
    fn calc_needs_at_least_one_child() -> anyhow::Result<()> {
        let err = parse(&[
            "calc",
            "--prefix",
            "1",
            "--directive",
            "1",
            "--children",
            "0",
        ]);
        assert!(matches!(err, Err(e) if e.kind() == ErrorKind::ValueValidation));
        let cli = parse(&[
            "calc",
            "--prefix",
            "48500",
            "--directive",
            "200",
            "--children",
            "5",
            "--one-hour",
        ])?;
        let Command::Calc(calc) = cli.command else {
            panic!("expected calc, got {:?}", cli.command);
        };
        assert_eq!(
            (calc.prefix, calc.directive, calc.children),
            (48500, 200, 5)
        );
        assert!(calc.one_hour);
        Ok(())
    }

    #[test]
    fn logs_takes_an_agent_and_the_shared_flag() -> anyhow::Result<()> {
        let cli = parse(&["logs", "A1", "--shared"])?;
        let Command::Logs(logs) = cli.command else {
            panic!("expected logs, got {:?}", cli.command);
        };
        assert_eq!(logs.agent_id, "A1");
        assert!(logs.shared);
        Ok(())
    }

    #[test]
    fn the_command_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
