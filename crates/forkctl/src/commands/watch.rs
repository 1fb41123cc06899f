//! `forkctl watch`: task notifications, the stored ones after `--since` and then live ones.

use clap::Args;
use forkd_proto::v1::SubscribeNotificationsRequest;

use crate::client::Client;
use crate::exit;
use crate::output::Printer;

#[derive(Debug, Args)]
pub struct WatchArgs {
    /// Only this session's notifications.
    #[arg(long, value_name = "ID")]
    pub session: Option<String>,

    /// Only this batch's notifications.
    #[arg(long, value_name = "ID")]
    pub batch: Option<String>,

    /// Only this agent's notifications.
    #[arg(long, value_name = "ID")]
    pub agent: Option<String>,

    /// Replay stored notifications after this sequence number; 0 replays them all. To resume
    /// after a disconnect, pass the last `seq` seen.
    #[arg(long, value_name = "SEQ", default_value_t = 0)]
    pub since: u64,

    /// Stop after the stored notifications instead of waiting for new ones.
    #[arg(long)]
    pub no_follow: bool,
}

pub async fn run(args: WatchArgs, client: &mut Client, out: &Printer) -> anyhow::Result<u8> {
    let request = SubscribeNotificationsRequest {
        since_seq: args.since,
        session_id: args.session.unwrap_or_default(),
        batch_id: args.batch.unwrap_or_default(),
        agent_id: args.agent.unwrap_or_default(),
        follow: !args.no_follow,
    };
    let mut stream = client.subscribe_notifications(request).await?.into_inner();
    while let Some(notification) = stream.message().await? {
        out.notification(&notification)?;
    }
    Ok(exit::OK)
}
