//! One module per subcommand: its clap arguments and an async `run` that returns the exit code.

pub mod attach;
pub mod calc;
pub mod fork;
pub mod kill;
pub mod logs;
pub mod ps;
pub mod session;
pub mod stats;
pub mod watch;

/// Follows a list RPC's `next_page_token` until the last page. A daemon that hands back the same
/// token twice would otherwise keep forkctl looping forever.
pub(crate) fn next_token(previous: &str, next: String) -> anyhow::Result<Option<String>> {
    if next.is_empty() {
        return Ok(None);
    }
    if next == previous {
        anyhow::bail!("the daemon returned the same page token twice ({next}); stopping");
    }
    Ok(Some(next))
}
