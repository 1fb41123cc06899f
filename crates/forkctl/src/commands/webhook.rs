//! `forkctl webhook`: the tenant's webhooks (docs/operations.md, "Webhooks and schedules").
//! `add` and `rotate` print the signing secret, once; `deliveries` lists the latest attempts;
//! `test` sends a ping and says how it went.

use clap::{Args, Subcommand};
use forkd_proto::v1::{
    CreateWebhookRequest, CreateWebhookResponse, DeleteWebhookRequest, GetWebhookRequest,
    ListWebhookAttemptsRequest, ListWebhooksRequest, RotateWebhookSecretRequest,
    TestWebhookRequest, Webhook, WebhookAttempt,
};
use serde_json::{Value, json};

use crate::client::Client;
use crate::exit;
use crate::output::Printer;

#[derive(Debug, Args)]
pub struct WebhookArgs {
    #[command(subcommand)]
    pub command: WebhookCommand,
}

#[derive(Debug, Subcommand)]
pub enum WebhookCommand {
    /// Register a URL that your notifications are posted to, signed (Standard Webhooks). Prints
    /// its signing secret, once.
    Add(AddArgs),
    /// Your webhooks.
    List,
    /// One webhook: its filter, and whether it is failing or disabled.
    Get(IdArgs),
    /// Remove a webhook and its pending deliveries.
    Delete(IdArgs),
    /// A new signing secret, printed once; the old one still signs for the daemon's overlap
    /// (24 hours by default), so receivers accept either while they switch.
    Rotate(IdArgs),
    /// Send a `ping` event now and print how it went (exit 1 when it was not taken).
    Test(IdArgs),
    /// The latest delivery attempts, newest first: status, latency, error.
    Deliveries(DeliveriesArgs),
}

#[derive(Debug, Args)]
pub struct AddArgs {
    /// `https://…` (or `http://`). Addresses on loopback, private, link-local and CGNAT networks
    /// are refused unless the daemon allows them; cloud metadata addresses always are.
    pub url: String,
    /// Only these notification kinds (comma-separated: fork, typed, turn); default all.
    #[arg(long, value_delimiter = ',', value_name = "KINDS")]
    pub kinds: Vec<String>,
    /// Only this session's notifications.
    #[arg(long, value_name = "ID")]
    pub session: Option<String>,
    /// Only the batches that name it (`forkctl fork --webhook ID`, `webhook:` in a run file).
    #[arg(long)]
    pub named_only: bool,
}

#[derive(Debug, Args)]
pub struct IdArgs {
    pub webhook_id: String,
}

#[derive(Debug, Args)]
pub struct DeliveriesArgs {
    pub webhook_id: String,
    /// How many attempts (default 50).
    #[arg(long, default_value_t = 50)]
    pub limit: u32,
}

pub async fn run(args: WebhookArgs, client: &mut Client, out: &Printer) -> anyhow::Result<u8> {
    match args.command {
        WebhookCommand::Add(args) => {
            let created = client
                .create_webhook(CreateWebhookRequest {
                    url: args.url,
                    kinds: args.kinds,
                    session_id: args.session.unwrap_or_default(),
                    named_only: args.named_only,
                })
                .await?
                .into_inner();
            print_secret(&created, out)?;
        }
        WebhookCommand::List => {
            let list = client
                .list_webhooks(ListWebhooksRequest {})
                .await?
                .into_inner();
            for webhook in &list.webhooks {
                if out.is_json() {
                    out.value(&webhook_json(webhook))?;
                } else {
                    out.line(webhook_line(webhook))?;
                }
            }
        }
        WebhookCommand::Get(args) => {
            let got = client
                .get_webhook(GetWebhookRequest {
                    webhook_id: args.webhook_id,
                })
                .await?
                .into_inner();
            let webhook = got.webhook.unwrap_or_default();
            if out.is_json() {
                out.value(&webhook_json(&webhook))?;
            } else {
                out.line(webhook_line(&webhook))?;
            }
        }
        WebhookCommand::Delete(args) => {
            client
                .delete_webhook(DeleteWebhookRequest {
                    webhook_id: args.webhook_id.clone(),
                })
                .await?;
            if out.is_json() {
                out.value(&json!({ "webhook_id": args.webhook_id, "deleted": true }))?;
            } else {
                out.line(format!("webhook {} deleted", args.webhook_id))?;
            }
        }
        WebhookCommand::Rotate(args) => {
            let rotated = client
                .rotate_webhook_secret(RotateWebhookSecretRequest {
                    webhook_id: args.webhook_id,
                })
                .await?
                .into_inner();
            print_secret(&rotated, out)?;
        }
        WebhookCommand::Test(args) => {
            let tested = client
                .test_webhook(TestWebhookRequest {
                    webhook_id: args.webhook_id,
                })
                .await?
                .into_inner();
            let attempt = tested.attempt.unwrap_or_default();
            if out.is_json() {
                out.value(&attempt_json(&attempt))?;
            } else {
                out.line(attempt_line(&attempt))?;
            }
            if !attempt.error.is_empty() {
                return Ok(exit::NOT_DELIVERED);
            }
        }
        WebhookCommand::Deliveries(args) => {
            let list = client
                .list_webhook_attempts(ListWebhookAttemptsRequest {
                    webhook_id: args.webhook_id,
                    limit: args.limit,
                })
                .await?
                .into_inner();
            for attempt in &list.attempts {
                if out.is_json() {
                    out.value(&attempt_json(attempt))?;
                } else {
                    out.line(attempt_line(attempt))?;
                }
            }
        }
    }
    Ok(exit::OK)
}

fn print_secret(created: &CreateWebhookResponse, out: &Printer) -> anyhow::Result<()> {
    let webhook = created.webhook.clone().unwrap_or_default();
    if out.is_json() {
        out.value(&json!({ "webhook": webhook_json(&webhook), "secret": created.secret }))?;
    } else {
        out.line(webhook_line(&webhook))?;
        out.line(format!(
            "secret: {}  (shown once: give it to your receiver, which verifies each delivery's \
             signature with it)",
            created.secret
        ))?;
    }
    Ok(())
}

/// `{"webhook_id", "url", "kinds", "session_id", "named_only", "created_at", "failing_since",
/// "disabled": {"at", "reason"} | null, "previous_secret_until"}`.
pub fn webhook_json(w: &Webhook) -> Value {
    json!({
        "webhook_id": w.webhook_id,
        "url": w.url,
        "kinds": w.kinds,
        "session_id": (!w.session_id.is_empty()).then_some(&w.session_id),
        "named_only": w.named_only,
        "created_at": w.created_at.map(|t| t.to_string()),
        "failing_since": w.failing_since.map(|t| t.to_string()),
        "disabled": (!w.disabled_reason.is_empty()).then(|| json!({
            "at": w.disabled_at.map(|t| t.to_string()),
            "reason": w.disabled_reason,
        })),
        "previous_secret_until": w.previous_secret_until.map(|t| t.to_string()),
    })
}

/// `0193… https://example.com/hook  kinds: all · sessions: all · failing since …`.
fn webhook_line(w: &Webhook) -> String {
    let kinds = if w.kinds.is_empty() {
        "all".to_owned()
    } else {
        w.kinds.join(",")
    };
    let mut line = format!("{}  {}  kinds: {kinds}", w.webhook_id, w.url);
    if w.named_only {
        line.push_str(" · only batches that name it");
    } else if !w.session_id.is_empty() {
        line.push_str(&format!(" · session {}", w.session_id));
    }
    if let Some(since) = w.failing_since {
        line.push_str(&format!(" · failing since {since}"));
    }
    if !w.disabled_reason.is_empty() {
        line.push_str(&format!(" · DISABLED ({})", w.disabled_reason));
    }
    line
}

/// `{"delivery_id", "number", "at", "status" | null, "error" | null, "latency_ms", "event",
/// "notification_seq" | null, "state"}`.
pub fn attempt_json(a: &WebhookAttempt) -> Value {
    json!({
        "delivery_id": a.delivery_id,
        "number": a.number,
        "at": a.at.map(|t| t.to_string()),
        "status": (a.status != 0).then_some(a.status),
        "error": (!a.error.is_empty()).then_some(&a.error),
        "latency_ms": a.latency_ms,
        "event": a.event,
        "notification_seq": (a.event == "notification").then_some(a.notification_seq),
        "state": a.state,
    })
}

/// `2026-… notification #12  attempt 2  HTTP 503  41 ms  pending: HTTP 503: …`.
fn attempt_line(a: &WebhookAttempt) -> String {
    let at = a.at.map(|t| t.to_string()).unwrap_or_default();
    let what = if a.event == "notification" {
        format!("notification #{}", a.notification_seq)
    } else {
        a.event.clone()
    };
    let status = if a.status == 0 {
        "no answer".to_owned()
    } else {
        format!("HTTP {}", a.status)
    };
    let mut line = format!(
        "{at}  {what}  attempt {}  {status}  {} ms  {}",
        a.number, a.latency_ms, a.state
    );
    if !a.error.is_empty() {
        line.push_str(&format!(": {}", a.error));
    }
    line
}
