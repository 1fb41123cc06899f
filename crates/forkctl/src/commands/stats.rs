//! `forkctl stats`: how well a batch or session used the prompt cache, and what it saved.

use clap::Args;
use forkd_proto::v1::GetCacheStatsRequest;
use forkd_proto::v1::get_cache_stats_request::Scope;

use crate::client::Client;
use crate::exit;
use crate::output::{Printer, human, stats_json};

#[derive(Debug, Args)]
pub struct StatsArgs {
    /// Figures for one fork batch.
    #[arg(long, value_name = "ID", conflicts_with = "session")]
    pub batch: Option<String>,

    /// Figures for every batch of one session.
    #[arg(long, value_name = "ID")]
    pub session: Option<String>,
}

pub async fn run(args: StatsArgs, client: &mut Client, out: &Printer) -> anyhow::Result<u8> {
    // No scope at all leaves the choice to the daemon (it may answer for everything it knows).
    let scope = match (args.batch, args.session) {
        (Some(batch), _) => Some(Scope::BatchId(batch)),
        (None, Some(session)) => Some(Scope::SessionId(session)),
        (None, None) => None,
    };
    let stats = client
        .get_cache_stats(GetCacheStatsRequest { scope })
        .await?
        .into_inner();
    if out.is_json() {
        out.value(&stats_json(&stats))?;
    } else {
        out.line(human::stats_table(&stats))?;
    }
    Ok(exit::OK)
}
