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

    /// Include agents that have ended (completed, failed, killed).
    #[arg(short = 'a', long)]
    pub all: bool,
}

pub async fn run(args: PsArgs, client: &mut Client, out: &Printer) -> anyhow::Result<u8> {
    let mut agents: Vec<Agent> = Vec::new();
    let mut page_token = String::new();
    loop {
        let request = ListAgentsRequest {
            session_id: args.session.clone().unwrap_or_default(),
            batch_id: args.batch.clone().unwrap_or_default(),
            include_ended: args.all,
            page_size: 0,
            page_token: page_token.clone(),
        };
        let page = client.list_agents(request).await?.into_inner();
        if out.is_json() {
            // Printed page by page, so a long listing starts at once.
            for agent in &page.agents {
                out.value(&agent_json(agent))?;
            }
        } else {
            agents.extend(page.agents);
        }
        match super::next_token(&page_token, page.next_page_token)? {
            Some(next) => page_token = next,
            None => break,
        }
    }
    if !out.is_json() {
        out.line(human::agents_table(&agents))?;
    }
    Ok(exit::OK)
}
