//! Property tests (docs/contracts.md, "Hooks"): hooks never change the bytes siblings share.
//! A batch's children run tool calls whose results carry whatever their PreToolUse and
//! PostToolUse hooks add (context, block reasons), with inputs an `updatedInput` replaced (what
//! ran, never the assistant message), after a history whose user message carries a
//! UserPromptSubmit hook's context: on every turn, every child's request is byte for byte its
//! siblings' up to its directive, and no tool hook's words come before it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use forkd_core::agent::Directive;
use forkd_core::fork::{self, ForkBatch};
use forkd_core::ids::{BatchId, SessionId};
use forkd_core::json::RawJson;
use forkd_core::message::{Block, Message};
use forkd_core::request::{self, BlockPos};
use forkd_core::session::{CacheSafeParams, RenderedSystem, ToolsJson};
use forkd_core::tools;
use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use serde_json::json;
use uuid::Uuid;

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(64)
}

/// Text with what breaks naive JSON: quotes, backslashes, newlines, tags, non-ASCII.
fn text(max: usize) -> impl Strategy<Value = String> {
    vec(
        prop_oneof![
            4 => proptest::char::range('a', 'z'),
            1 => Just('"'),
            1 => Just('\\'),
            1 => Just('\n'),
            1 => Just('<'),
            1 => Just('é'),
            1 => Just('🦀'),
        ],
        1..max,
    )
    .prop_map(|c| c.into_iter().collect())
}

/// One tool call of a child and what its hooks did.
#[derive(Debug, Clone)]
struct HookedCall {
    command: String,
    output: String,
    /// A PreToolUse hook's `updatedInput`: what ran instead (the model's call stays as it was).
    updated: Option<String>,
    /// What its hooks added after its result (additionalContext, a block reason).
    feedback: Option<String>,
}

fn hooked_call() -> impl Strategy<Value = HookedCall> {
    (
        text(30),
        text(60),
        option::of(text(30)),
        option::of(text(80)),
    )
        .prop_map(|(command, output, updated, feedback)| HookedCall {
            command,
            output,
            updated,
            feedback,
        })
}

/// A child: its directive and its turns of calls.
fn child() -> impl Strategy<Value = (String, Vec<Vec<HookedCall>>)> {
    (text(60), vec(vec(hooked_call(), 1..=2), 1..=3))
}

/// The child's own messages: each turn's calls as the model wrote them, and their results as
/// the hooks left them (the engine appends feedback after a blank line; a replaced input ran).
fn own_messages(turns: &[Vec<HookedCall>], marker: &str) -> Vec<Message> {
    let mut out = Vec::new();
    for (t, calls) in turns.iter().enumerate() {
        let mut uses = Vec::new();
        let mut results = Vec::new();
        for (i, c) in calls.iter().enumerate() {
            let id = format!("toolu_{t}_{i}");
            let input = RawJson::encode(&json!({ "command": c.command }));
            uses.push(Block::tool_use(&id, "Bash", &input).unwrap());
            let ran = c.updated.as_deref().unwrap_or(&c.command);
            let mut content = format!("{} ran: {}", ran, c.output);
            if let Some(feedback) = &c.feedback {
                content = format!("{content}\n\n{marker}{feedback}");
            }
            results.push(Block::tool_result(&id, &content, false));
        }
        out.push(Message::assistant(uses));
        out.push(Message::user(results));
    }
    out
}

fn params() -> CacheSafeParams {
    CacheSafeParams {
        model: "claude-sonnet-4-5".into(),
        system: RenderedSystem::from_stored("You are a careful engineer.\nToday: 2026-12-07"),
        tools: ToolsJson::assemble(tools::builtin_definitions(), Vec::new()),
        thinking: None,
        max_tokens: 8_192,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn hooks_never_change_the_bytes_before_a_childs_directive(
        prompt in text(80),
        prompt_context in text(80),
        children in vec(child(), 2..=4),
    ) {
        // A marker no generated text holds (they have no digits): what a tool hook added.
        let marker = "HOOK-7f3a:";
        let history = vec![Message::user(vec![
            Block::text(&prompt),
            Block::text(&format!(
                "<user-prompt-submit-hook>\n{prompt_context}\n</user-prompt-submit-hook>"
            )),
        ])];
        let directives: Vec<Directive> = children
            .iter()
            .enumerate()
            .map(|(i, (p, _))| Directive { description: format!("part {i}"), prompt: p.clone() })
            .collect();
        let batch_id = BatchId::from_uuid(Uuid::from_u128(7));
        let assistant = fork::client_fork_message(batch_id, &directives);
        let batch = ForkBatch::new(
            batch_id,
            SessionId::from_uuid(Uuid::from_u128(9)),
            history.len() as u64,
            assistant,
            0,
        )
        .unwrap();
        let params = params();
        let dir = BlockPos { message: history.len() + 1, block: batch.shared_user_blocks.len() };
        let mut prefix: Option<String> = None;
        for (d, (_, turns)) in directives.iter().zip(&children) {
            let own = own_messages(turns, marker);
            let block = ForkBatch::directive_block(d);
            // The first request, then one after each turn's results.
            for upto in (0..=own.len()).step_by(2) {
                let conv = batch.child_conversation(&history, &block, &own[..upto]);
                let req = request::serialize(&params, &conv, true);
                let span = req.span(dir).expect("the directive's span");
                let before = &req.body[..span.start];
                prop_assert!(!before.contains(marker), "a hook's words before the directive");
                match &prefix {
                    None => prefix = Some(before.to_owned()),
                    Some(p) => prop_assert_eq!(before, p.as_str(), "siblings' shared bytes"),
                }
                if upto > 0 {
                    prop_assert!(req.body[span.end..].contains(marker)
                        || turns.iter().take(upto / 2).flatten().all(|c| c.feedback.is_none()),
                        "the hooks' words follow the directive");
                }
            }
        }
    }
}
