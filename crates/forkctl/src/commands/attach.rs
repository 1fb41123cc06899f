//! `forkctl attach AGENT` (follow an agent: its messages, then its end) and `forkctl bg AGENT`
//! (hand the agent's attached clients to the background; the agent goes on).

use anyhow::Context as _;
use clap::Args;
use forkd_proto::v1::agent_event::Event;
use forkd_proto::v1::{AgentEvent, AttachRequest, BackgroundRequest, TranscriptMessage};
use serde_json::json;

use crate::client::Client;
use crate::commands::logs::render_message;
use crate::exit;
use crate::output::{Printer, human, message_json, notification_json};
use crate::reconnect::{self, Reconnect, ReconnectArgs};
use tonic::Streaming;

#[derive(Debug, Args)]
pub struct AttachArgs {
    /// The agent's id.
    pub agent_id: String,
    /// Start at this message of the agent's own transcript (0: from the start).
    #[arg(long, default_value_t = 0)]
    pub since: u64,

    #[command(flatten)]
    pub reconnect: ReconnectArgs,
}

#[derive(Debug, Args)]
pub struct BgArgs {
    /// The agent's id.
    pub agent_id: String,
}

/// Follows the agent until it ends (exit 0, or 1 when it failed, was killed or timed out) or is
/// handed to the background (exit 0).
pub async fn run(args: AttachArgs, client: &mut Client, out: &Printer) -> anyhow::Result<u8> {
    let mut request = AttachRequest {
        agent_id: args.agent_id,
        since_seq: args.since,
    };
    let mut reconnect = args.reconnect.reconnect();
    let mut stream = client.attach(request.clone()).await?.into_inner();
    loop {
        let event = match stream.message().await {
            Ok(Some(event)) => event,
            // The agent has not ended, so the daemon went away: the next stream is asked for.
            Ok(None) => {
                let lost = "the daemon closed the attach stream".to_owned();
                stream = reattach(client, &request, &mut reconnect, lost).await?;
                continue;
            }
            Err(status) if reconnect::is_lost(&status) => {
                let lost = reconnect::why(&status);
                stream = reattach(client, &request, &mut reconnect, lost).await?;
                continue;
            }
            Err(status) => return Err(status.into()),
        };
        match event.event {
            Some(Event::Message(m)) => {
                // A new stream starts at the next message.
                if m.seq >= request.since_seq {
                    request.since_seq = m.seq + 1;
                    reconnect.heard();
                }
                let message = TranscriptMessage {
                    role: m.role,
                    content_json: m.content_json,
                    shared: false,
                    compaction: false,
                    // An attach stream carries no note marks: its messages are drawn as text.
                    note: false,
                    seq: Some(m.seq),
                    turn: 0,
                };
                if out.is_json() {
                    out.value(&message_json(&message))?;
                } else {
                    out.line(render_message(&message))?;
                }
            }
            Some(Event::Ended(n)) => {
                if out.is_json() {
                    out.value(&notification_json(&n))?;
                } else {
                    out.line(human::notification_line(&n))?;
                }
                let completed = n.status == forkd_proto::v1::NotificationStatus::Completed as i32;
                return Ok(if completed {
                    exit::OK
                } else {
                    exit::CHILD_FAILED
                });
            }
            Some(Event::AsyncLaunched(a)) => {
                if out.is_json() {
                    out.value(&json!({"status": "async_launched", "agent_id": a.agent_id}))?;
                } else {
                    out.line(format!(
                        "async_launched: {} goes on in the background (forkctl attach {} to follow it again)",
                        a.agent_id, a.agent_id
                    ))?;
                }
                return Ok(exit::OK);
            }
            Some(Event::Interrupted(i)) => {
                if out.is_json() {
                    out.value(&json!({"status": "interrupted", "reason": i.reason}))?;
                } else {
                    out.line(format!(
                        "interrupted: {} (it resumes by itself once the database takes writes again)",
                        i.reason
                    ))?;
                }
            }
            Some(Event::Resumed(_)) => {
                if out.is_json() {
                    out.value(&json!({"status": "resumed"}))?;
                } else {
                    out.line("resumed: the database takes writes again")?;
                }
            }
            None => {}
        }
    }
}

/// Attaches again from `request.since_seq`, for as long as `reconnect` allows.
async fn reattach(
    client: &Client,
    request: &AttachRequest,
    reconnect: &mut Reconnect,
    lost: String,
) -> anyhow::Result<Streaming<AgentEvent>> {
    let open = || {
        let (mut client, request) = (client.clone(), request.clone());
        async move { client.attach(request).await }
    };
    let resume = format!("at message {}", request.since_seq);
    reconnect
        .reopen(lost, &resume, open)
        .await
        .with_context(|| {
            format!(
                "follow it again with `forkctl attach {} --since {}`",
                request.agent_id, request.since_seq
            )
        })
}

pub async fn run_bg(args: BgArgs, client: &mut Client, out: &Printer) -> anyhow::Result<u8> {
    let reply = client
        .background(BackgroundRequest {
            agent_id: args.agent_id,
        })
        .await?
        .into_inner();
    if out.is_json() {
        out.value(&json!({"status": reply.status, "agent_id": reply.agent_id}))?;
    } else {
        out.line(format!("{}: {}", reply.status, reply.agent_id))?;
    }
    Ok(exit::OK)
}
