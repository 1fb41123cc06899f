//! `forkctl kill AGENT`: stop an agent at once; it ends `killed`.

use clap::Args;
use forkd_proto::v1::KillRequest;
use serde_json::json;

use crate::client::Client;
use crate::exit;
use crate::output::Printer;

#[derive(Debug, Args)]
pub struct KillArgs {
    /// The agent's id.
    pub agent_id: String,
}

pub async fn run(args: KillArgs, client: &mut Client, out: &Printer) -> anyhow::Result<u8> {
    let reply = client
        .kill(KillRequest {
            agent_id: args.agent_id,
        })
        .await?
        .into_inner();
    if out.is_json() {
        out.value(&json!({ "agent_id": reply.agent_id, "status": "killed" }))?;
    } else {
        out.line(format!("killed {}", reply.agent_id))?;
    }
    Ok(exit::OK)
}
