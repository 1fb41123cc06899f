//! `forkctl ps`: agents with their state, tokens, cache-read share and cost.

use clap::Args;
use forkd_proto::v1::{Agent, ListAgentsRequest};

use crate::client::Client;
use crate::exit;
use crate::output::{Printer, agent_json, human};

#[derive(Debug, Args)]
pub struct PsArgs {
    /// Only this session's agents.
    #[arg(long, value_name = "ID")]
    pub session: Option<String>,

    /// Only this batch's agents.
    #[arg(long, value_name = "ID")]
    pub batch: Option<String>,

    /// Include agents that have ended (completed, failed, killed, timed_out).
    #[arg(short = 'a', long)]
    pub all: bool,
}

pub async fn run(args: PsArgs, client: &mut Client, out: &Printer) -> anyhow::Result<u8> {
    let filter = ListAgentsRequest {
        session_id: args.session.unwrap_or_default(),
        batch_id: args.batch.unwrap_or_default(),
        include_ended: args.all,
        ..Default::default()
    };
    let mut agents: Vec<Agent> = Vec::new();
    list_agents(client, filter, |page| {
        if out.is_json() {
            // Printed page by page, so a long listing starts at once.
            for agent in &page {
                out.value(&agent_json(agent))?;
            }
        } else {
            agents.extend(page);
        }
        Ok(())
    })
    .await?;
    if !out.is_json() {
        out.line(human::agents_table(&agents))?;
    }
    Ok(exit::OK)
}

/// Every agent `filter` matches, following the pages; `each_page` gets each page as it arrives.
pub(crate) async fn list_agents(
    client: &mut Client,
    filter: ListAgentsRequest,
    each_page: impl FnMut(Vec<Agent>) -> std::io::Result<()>,
) -> anyhow::Result<()> {
    super::paged(client, each_page, |mut client, page_token| {
        let request = ListAgentsRequest {
            page_token,
            ..filter.clone()
        };
        async move {
            let page = client.list_agents(request).await?.into_inner();
            Ok((page.agents, page.next_page_token))
        }
    })
    .await
}
