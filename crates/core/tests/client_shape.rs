//! Property tests of a client batch's per-child shape (docs/contracts.md, “Client-submitted
//! batches”): for any N up to 1000, any history (ending with a user or an assistant message) and
//! thinking on or off, siblings agree byte for byte up to their directive, a child's request is the
//! same whatever its batch's size, no assistant message is invented, roles keep alternating, and
//! the parent's last request is a prefix of every child's.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use forkd_core::agent::Directive;
use forkd_core::fork::{self, BOILERPLATE_TAG, ForkBatch, ForkShape};
use forkd_core::ids::{BatchId, SessionId};
use forkd_core::json::RawJson;
use forkd_core::message::{Block, Message, Role};
use forkd_core::request::{self, BlockPos, Conversation};
use forkd_core::session::{CacheSafeParams, RenderedSystem, ThinkingConfig, ToolsJson};
use forkd_core::tools;
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::select;
use serde_json::json;

fn params(thinking: bool) -> CacheSafeParams {
    CacheSafeParams {
        model: "claude-sonnet-4-5".into(),
        system: RenderedSystem::from_stored("You are careful.\n\"quoted\" \\ and ünïcode"),
        tools: ToolsJson::assemble(tools::builtin_definitions(), Vec::new()),
        thinking: thinking.then_some(ThinkingConfig {
            budget_tokens: 2048,
        }),
        max_tokens: 8192,
    }
}

/// A parent's history: the session's first message, then finished turns (a user text, perhaps a
/// tool round, an assistant reply that may open with thinking), then perhaps a trailing user
/// message (a notification that arrived after the last turn).
fn history(turns: &[(String, bool, bool)], trailing_user: bool) -> Vec<Message> {
    let mut messages = vec![Message::user(vec![Block::text("context: the project")])];
    for (i, (text, tool_round, thinking)) in turns.iter().enumerate() {
        if i > 0 || messages.last().is_some_and(|m| m.role == Role::Assistant) {
            messages.push(Message::user(vec![Block::text(text)]));
        } else {
            messages.last_mut().unwrap().blocks.push(Block::text(text));
        }
        if *tool_round {
            let id = format!("toolu_{i}");
            let input = RawJson::encode(&json!({"file_path": format!("f{i}.rs")}));
            messages.push(Message::assistant(vec![
                Block::tool_use(&id, "Read", &input).unwrap(),
            ]));
            messages.push(Message::user(vec![Block::tool_result(
                &id,
                "fn main() {}",
                false,
            )]));
        }
        let mut reply = Vec::new();
        if *thinking {
            reply.push(Block::thinking("let me think", "c2lnbmF0dXJl"));
        }
        reply.push(Block::text(&format!("done with {text}")));
        messages.push(Message::assistant(reply));
    }
    if trailing_user {
        messages.push(Message::user(vec![Block::text("<task-notification>…")]));
    }
    messages
}

fn directive(i: usize, words: &str) -> Directive {
    Directive {
        description: format!("part {i}"),
        prompt: format!("Review part {i}: {words} \"{i}\"\n"),
    }
}

fn body(batch: &ForkBatch, params: &CacheSafeParams, h: &[Message], d: &Directive) -> String {
    let conv = batch.child_conversation(h, &ForkBatch::directive_block(d), &[]);
    request::serialize(params, &conv, true).body
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn siblings_share_everything_but_their_directive_whatever_n(
        turns in vec(("[a-z \"\\\\]{1,40}", any::<bool>(), any::<bool>()), 0..6),
        trailing_user in any::<bool>(),
        thinking in any::<bool>(),
        n in select(vec![1usize, 2, 7, 100, 1000]),
        words in "[a-zA-Z0-9 ]{0,30}",
    ) {
        let params = params(thinking);
        let h = history(&turns, trailing_user);
        let batch = ForkBatch::client(BatchId::new(), SessionId::new(), h.len() as u64, 0);
        prop_assert_eq!(&batch.shape, &ForkShape::Client);
        let pos = batch.directive_pos(&h);
        // Sample the children of an N-wide batch: the first, the last and a middle one.
        let sampled = [0, n / 2, n - 1];
        let mut prefixes = Vec::new();
        for &i in &sampled {
            let d = directive(i, &words);
            let conv = batch.child_conversation(&h, &ForkBatch::directive_block(&d), &[]);
            let req = request::serialize(&params, &conv, true);
            // No assistant message is invented, and roles alternate.
            prop_assert_eq!(conv.messages.len(), h.len() + usize::from(h.last().is_some_and(|m| m.role == Role::Assistant)));
            // What forkd adds keeps roles alternating: blocks in the history's last user
            // message, or one user message after its last assistant message.
            prop_assert!(conv.messages.windows(2).skip(h.len().saturating_sub(1)).all(|w| w[0].role != w[1].role));
            prop_assert_eq!(conv.messages.last().map(|m| m.role), Some(Role::User));
            // The directive is the last block; the boilerplate, shared, just before it.
            let last = conv.messages.last().unwrap();
            prop_assert_eq!(BlockPos { message: conv.messages.len() - 1, block: last.blocks.len() - 1 }, pos);
            let boilerplate = last.blocks[pos.block - 1].as_text().unwrap_or_default();
            let open = format!("<{BOILERPLATE_TAG}>");
            prop_assert!(boilerplate.starts_with(&open));
            prop_assert!(!boilerplate.contains(fork::FORK_PLACEHOLDER_RESULT));
            let start = req.span(pos).unwrap().start;
            prefixes.push(req.body[..start].to_owned());
            // A child's request does not depend on its batch's size: the same child in a batch
            // of one sends the same bytes.
            let alone = ForkBatch::client(BatchId::new(), SessionId::new(), h.len() as u64, 0);
            prop_assert_eq!(body(&alone, &params, &h, &d), req.body.clone());
        }
        prop_assert!(prefixes.windows(2).all(|w| w[0] == w[1]), "siblings differ before their directive");
        // The parent's own last request is a byte prefix of every child's, up to its last block.
        let parent = request::serialize(&params, &Conversation::plain(h.clone()), true);
        let last_h = BlockPos { message: h.len() - 1, block: h[h.len() - 1].blocks.len() - 1 };
        let cut = parent.span(last_h).unwrap().start;
        prop_assert_eq!(&parent.body[..cut], &prefixes[0][..cut]);
    }
}

/// A batch stored in the model shape (every batch stored before client batches had their own
/// shape) still builds its children's requests exactly as before: `A`, placeholders, boilerplate.
#[test]
fn model_shaped_batches_keep_the_seeds_shape() {
    let id = BatchId::new();
    let directives = [directive(0, "a"), directive(1, "b")];
    let a = fork::client_fork_message(id, &directives);
    let batch = ForkBatch::new(id, SessionId::new(), 1, a.clone(), 0).unwrap();
    let h = vec![Message::user(vec![Block::text("context")])];
    let conv = batch.child_conversation(&h, &ForkBatch::directive_block(&directives[0]), &[]);
    assert_eq!(conv.messages.len(), 3);
    assert_eq!(conv.messages[1], a);
    assert_eq!(conv.messages[2].blocks.len(), 2 + 1 + 1);
    assert!(
        conv.messages[2].blocks[2]
            .as_text()
            .is_some_and(|t| t.contains(fork::FORK_PLACEHOLDER_RESULT))
    );
}
