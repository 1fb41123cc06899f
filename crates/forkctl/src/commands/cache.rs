//! `forkctl cache`: cache diagnostics. `requests` lists recorded model requests (their ids are
//! what `explain` takes); `explain REQ [REQ2]` shows where two requests' bodies part.

use clap::{Args, Subcommand};
use forkd_proto::v1::list_requests_request::Scope;
use forkd_proto::v1::{ExplainCacheRequest, ExplainCacheResponse, ListRequestsRequest};
use serde_json::json;

use crate::client::Client;
use crate::exit;
use crate::output::{Printer, usage_json};

#[derive(Debug, Args)]
pub struct CacheArgs {
    #[command(subcommand)]
    pub command: CacheCommand,
}

#[derive(Debug, Subcommand)]
pub enum CacheCommand {
    /// Where two model requests part: the first part (tools, system, message N) and byte
    /// where their bodies differ, with a short excerpt of both. With one request, a fork child's
    /// request is compared with its first sibling's request of the same turn.
    Explain(ExplainArgs),
    /// The recorded model requests of an agent, a batch or a session, with their ids.
    Requests(RequestsArgs),
}

#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// The request to explain.
    pub request_id: String,
    /// The request to compare it with (default: its first sibling's request of the same turn).
    pub other_request_id: Option<String>,
}

#[derive(Debug, Args)]
pub struct RequestsArgs {
    /// The requests of one agent.
    #[arg(long, value_name = "ID", conflicts_with_all = ["batch", "session"])]
    pub agent: Option<String>,
    /// The requests of one fork batch's children.
    #[arg(long, value_name = "ID", conflicts_with = "session")]
    pub batch: Option<String>,
    /// The requests of one session (its main loop and its agents).
    #[arg(long, value_name = "ID")]
    pub session: Option<String>,
}

pub async fn run(args: CacheArgs, client: &mut Client, out: &Printer) -> anyhow::Result<u8> {
    match args.command {
        CacheCommand::Explain(args) => explain(args, client, out).await,
        CacheCommand::Requests(args) => requests(args, client, out).await,
    }
}

async fn explain(args: ExplainArgs, client: &mut Client, out: &Printer) -> anyhow::Result<u8> {
    let why = client
        .explain_cache(ExplainCacheRequest {
            request_id: args.request_id,
            other_request_id: args.other_request_id.unwrap_or_default(),
        })
        .await?
        .into_inner();
    if out.is_json() {
        out.value(&explain_json(&why))?;
    } else {
        out.line(explain_text(&why))?;
    }
    Ok(exit::OK)
}

fn explain_json(w: &ExplainCacheResponse) -> serde_json::Value {
    json!({
        "request_id": w.request_id,
        "other_request_id": w.other_request_id,
        "same_prefix": w.same_prefix,
        "part": w.part,
        "kind": w.kind,
        "byte": w.byte,
        "exact": w.exact,
        "excerpt": w.excerpt,
        "other_excerpt": w.other_excerpt,
        "note": w.note,
    })
}

fn explain_text(w: &ExplainCacheResponse) -> String {
    let mut text = format!("{} against {}\n", w.request_id, w.other_request_id);
    text.push_str(if w.same_prefix {
        "prefix: identical (the shared prefix can be read from the cache)\n"
    } else {
        "prefix: DIFFERS (neither can read the other's cache past the first difference)\n"
    });
    if w.part.is_empty() {
        text.push_str("the bodies are identical\n");
    } else {
        let at = if w.exact {
            "at byte"
        } else {
            "in the part starting at byte"
        };
        text.push_str(&format!(
            "first difference: {} ({}), {at} {}\n",
            w.part, w.kind, w.byte
        ));
        text.push_str(&format!("  this:  {:?}\n", w.excerpt));
        text.push_str(&format!("  other: {:?}\n", w.other_excerpt));
    }
    if !w.note.is_empty() {
        text.push_str(&format!("note: {}\n", w.note));
    }
    text.trim_end().to_owned()
}

async fn requests(args: RequestsArgs, client: &mut Client, out: &Printer) -> anyhow::Result<u8> {
    let scope = match (args.agent, args.batch, args.session) {
        (Some(a), _, _) => Scope::AgentId(a),
        (None, Some(b), _) => Scope::BatchId(b),
        (None, None, Some(s)) => Scope::SessionId(s),
        (None, None, None) => anyhow::bail!("give --agent, --batch or --session"),
    };
    let list = client
        .list_requests(ListRequestsRequest { scope: Some(scope) })
        .await?
        .into_inner();
    for r in &list.requests {
        if out.is_json() {
            out.value(&json!({
                "request_id": r.request_id,
                "agent_id": r.agent_id,
                "batch_id": r.batch_id,
                "turn": r.turn,
                "model": r.model,
                "usage": usage_json(r.usage.as_ref()),
                "cost_usd": r.cost_usd,
                "prefix_fingerprint": r.prefix_fingerprint,
                "body_bytes": r.body_bytes,
                "first_token_ms": r.first_token_ms,
            }))?;
        } else {
            let read = r.usage.as_ref().map_or(0, |u| u.cache_read_input_tokens);
            let first_token = r
                .first_token_ms
                .map_or_else(|| "-".to_owned(), |ms| format!("{ms} ms"));
            out.line(format!(
                "{}  agent {}  turn {}  cache read {}  first token {}  prefix {}",
                r.request_id, r.agent_id, r.turn, read, first_token, r.prefix_fingerprint
            ))?;
        }
    }
    Ok(exit::OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_explanation_names_the_part_and_byte() {
        let w = ExplainCacheResponse {
            request_id: "r2".into(),
            other_request_id: "r1".into(),
            part: "system".into(),
            kind: "system".into(),
            byte: 812,
            exact: true,
            excerpt: "Be brief!".into(),
            other_excerpt: "Be brief.".into(),
            ..ExplainCacheResponse::default()
        };
        let text = explain_text(&w);
        assert!(text.contains("DIFFERS"), "{text}");
        assert!(text.contains("system (system), at byte 812"), "{text}");
        assert!(text.contains("\"Be brief.\""), "{text}");
        assert_eq!(explain_json(&w)["byte"], 812);
    }
}
