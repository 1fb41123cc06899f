//! One module per subcommand: its clap arguments and an async `run` that returns the exit code.

pub mod apply_to;
pub mod attach;
pub mod cache;
pub mod calc;
pub mod capacity;
pub mod changes;
pub mod fork;
pub mod kill;
pub mod logs;
pub mod ps;
pub mod run;
pub mod schedule;
pub mod session;
pub mod stats;
pub mod top;
pub mod tree;
pub mod ui;
pub mod upload;
pub mod watch;
pub mod webhook;

use crate::client::Client;

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

/// Follows a list RPC's pages: `fetch` asks, on its own handle of `client`, for the page at a
/// token (empty for the first) and answers its items and the next token; `each_page` gets each
/// page as it arrives.
pub(crate) async fn paged<T, Page>(
    client: &Client,
    mut each_page: impl FnMut(Vec<T>) -> std::io::Result<()>,
    mut fetch: impl FnMut(Client, String) -> Page,
) -> anyhow::Result<()>
where
    Page: Future<Output = Result<(Vec<T>, String), tonic::Status>>,
{
    let mut page_token = String::new();
    loop {
        let (items, next) = fetch(client.clone(), page_token.clone()).await?;
        each_page(items)?;
        match next_token(&page_token, next)? {
            Some(next) => page_token = next,
            None => return Ok(()),
        }
    }
}
