//! `forkctl watch`: task notifications, the stored ones after `--since` and then live ones.

use anyhow::Context as _;
use clap::Args;
use forkd_proto::v1::SubscribeNotificationsRequest;

use crate::client::Client;
use crate::exit;
use crate::output::Printer;
use crate::reconnect::{self, ReconnectArgs};

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

    #[command(flatten)]
    pub reconnect: ReconnectArgs,
}

pub async fn run(args: WatchArgs, client: &mut Client, out: &Printer) -> anyhow::Result<u8> {
    let request = SubscribeNotificationsRequest {
        since_seq: args.since,
        session_id: args.session.unwrap_or_default(),
        batch_id: args.batch.unwrap_or_default(),
        agent_id: args.agent.unwrap_or_default(),
        follow: !args.no_follow,
    };
    let follow = request.follow;
    let mut reconnect = args.reconnect.reconnect();
    let mut seq = request.since_seq;
    let mut stream = client
        .subscribe_notifications(request.clone())
        .await?
        .into_inner();
    loop {
        let lost = match stream.message().await {
            Ok(Some(notification)) => {
                if notification.seq > seq {
                    seq = notification.seq;
                    reconnect.heard();
                }
                out.notification(&notification)?;
                continue;
            }
            Ok(None) if !follow => return Ok(exit::OK),
            // A daemon shutting down ends its streams: the next one is asked for.
            Ok(None) => "the daemon closed the notification stream".to_owned(),
            Err(status) if reconnect::is_lost(&status) => reconnect::why(&status),
            Err(status) => return Err(status.into()),
        };
        let again = SubscribeNotificationsRequest {
            since_seq: seq,
            ..request.clone()
        };
        let client = client.clone();
        let open = || {
            let (mut client, again) = (client.clone(), again.clone());
            async move { client.subscribe_notifications(again).await }
        };
        stream = reconnect
            .reopen(lost, &format!("after notification {seq}"), open)
            .await
            .with_context(|| format!("resume with `forkctl watch --since {seq}`"))?;
    }
}
