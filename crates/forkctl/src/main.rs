//! forkctl: parses the command line, connects to forkd, runs one command and turns its outcome
//! into an exit code (see [`exit`]).

mod cli;
mod client;
mod commands;
mod exit;
mod limits;
mod output;
mod reconnect;
mod tls_mismatch;

use std::process::ExitCode;

use clap::Parser as _;

use crate::cli::{Cli, Command};
use crate::client::{Addr, Auth};
use crate::output::Printer;

fn main() -> ExitCode {
    // Usage errors exit here with clap's code 2 (and `--help` with 0).
    let cli = Cli::parse();
    // One command on one connection: a single thread is all the concurrency forkctl needs.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => return fail(&anyhow::Error::from(err).context("cannot start the runtime")),
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(err) => fail(&err),
    }
}

async fn run(cli: Cli) -> anyhow::Result<u8> {
    let addr = Addr::resolve(cli.addr.as_deref())?;
    // An unset or non-UTF-8 token both mean "no token"; the daemon then says whether it needs one.
    let token = std::env::var("FORKD_TOKEN").ok();
    let auth =
        Auth::new(token.as_deref())?.with_traceparent(std::env::var("TRACEPARENT").ok().as_deref());
    // What can be checked without a daemon is checked before connecting: a broken run file is
    // reported as such, daemon or not.
    let run_file = match &cli.command {
        Command::Run(args) => Some(commands::run::BatchFile::load(&args.file)?),
        _ => None,
    };
    if let Command::Ui(_) = &cli.command {
        commands::ui::check_addr(&addr)?;
    }
    let ca_cert = cli.ca_cert.clone();
    let out = Printer::new(cli.json);
    let outcome = async {
        let mut client = client::connect(&addr, auth, ca_cert.as_deref()).await?;
        let over_socket = matches!(addr, Addr::Unix(_));
        dispatch(cli.command, run_file, over_socket, &mut client, &out).await
    }
    .await;
    match outcome {
        Ok(code) => Ok(code),
        // A mismatch may surface at the connection or at the first call (an `http://` address
        // on a TLS listener connects, and its first call fails).
        Err(err) => Err(tls_mismatch::explain(err, &addr, ca_cert.as_deref()).await),
    }
}

async fn dispatch(
    command: Command,
    run_file: Option<commands::run::BatchFile>,
    over_socket: bool,
    client: &mut client::Client,
    out: &Printer,
) -> anyhow::Result<u8> {
    match command {
        Command::Session(args) => commands::session::run(args, over_socket, client, out).await,
        Command::Fork(args) => commands::fork::run(args, client, out).await,
        Command::Upload(args) => commands::upload::run(args, client, out).await,
        Command::Run(args) => commands::run::run(args, run_file, client, out).await,
        Command::Watch(args) => commands::watch::run(args, client, out).await,
        Command::Ps(args) => commands::ps::run(args, client, out).await,
        Command::Top(args) => commands::top::run(args, client, out).await,
        Command::Logs(args) => commands::logs::run(args, client, out).await,
        Command::Attach(args) => commands::attach::run(args, client, out).await,
        Command::Bg(args) => commands::attach::run_bg(args, client, out).await,
        Command::Kill(args) => commands::kill::run(args, client, out).await,
        Command::Diff(args) => commands::changes::diff(args, client, out).await,
        Command::Apply(args) => commands::changes::apply(args, client, out).await,
        Command::Discard(args) => commands::changes::discard(args, client, out).await,
        Command::Stats(args) => commands::stats::run(args, client, out).await,
        Command::Cache(args) => commands::cache::run(args, client, out).await,
        Command::Calc(args) => commands::calc::run(args, client, out).await,
        Command::Capacity(args) => commands::capacity::run(args, client, out).await,
        Command::Ui(args) => commands::ui::run(args, client, out).await,
        Command::Webhook(args) => commands::webhook::run(args, client, out).await,
        Command::Schedule(args) => commands::schedule::run(args, client, out).await,
    }
}

/// Prints `forkctl: <message>` (and a hint on what to do next) to stderr; returns the exit code.
fn fail(err: &anyhow::Error) -> ExitCode {
    // Whoever read our stdout has gone (`forkctl watch | head`); there is nobody left to tell.
    if exit::is_broken_pipe(err) {
        return ExitCode::from(exit::OK);
    }
    let failure = exit::classify(err);
    eprintln!("forkctl: {}", failure.message);
    if let Some(hint) = failure.hint {
        eprintln!("forkctl: hint: {hint}");
    }
    ExitCode::from(failure.code)
}
