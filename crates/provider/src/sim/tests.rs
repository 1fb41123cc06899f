//! How the sim reads request bodies: block identities, tokens and breakpoints.

use super::request::{self, BlockMemo, CacheBlock, Run, SimRequest};
use crate::ProviderError;
use crate::tokens::{block_tokens, count};
use forkd_core::pricing::CacheTtl;

fn parse(body: &str) -> SimRequest {
    match request::parse(body) {
        Ok(r) => r,
        Err(e) => panic!("{e}: {body}"),
    }
}

fn prefixes(blocks: &[CacheBlock]) -> Vec<[u8; 32]> {
    blocks.iter().map(|b| b.prefix).collect()
}

const COMPACT: &str = r#"{"model":"claude-sonnet-4-5","max_tokens":10,"tools":[{"name":"Read","input_schema":{"type":"object"},"cache_control":{"type":"ephemeral"}}],"system":[{"type":"text","text":"sys","cache_control":{"type":"ephemeral","ttl":"1h"}}],"messages":[{"role":"user","content":[{"type":"text","text":"hi","cache_control":{"type":"ephemeral"}}]},{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"Read","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"ok"}]}]}"#;

const PRETTY: &str = r#"{
  "model": "claude-sonnet-4-5", "max_tokens": 99, "stream": false,
  "tools": [ { "name": "Read", "input_schema": { "type": "object" } } ],
  "system": "sys",
  "messages": [
    { "role": "user", "content": "hi" },
    { "role": "assistant", "content": [ { "type": "tool_use", "id": "t", "name": "Read", "input": { } } ] },
    { "role": "user", "content": [ { "type": "tool_result", "tool_use_id": "t", "content": "ok" } ] }
  ]
}"#;

#[test]
fn identity_ignores_whitespace_breakpoints_and_string_shorthand() {
    let compact = parse(COMPACT);
    let pretty = parse(PRETTY);
    assert_eq!(prefixes(&compact.blocks), prefixes(&pretty.blocks));
    let bps: Vec<_> = compact.blocks.iter().map(|b| b.breakpoint).collect();
    let five = Some(CacheTtl::FiveMinutes);
    assert_eq!(bps, [five, Some(CacheTtl::OneHour), five, None, None]);
    assert!(pretty.blocks.iter().all(|b| b.breakpoint.is_none()));
    let runs: Vec<_> = compact.blocks.iter().map(|b| b.run).collect();
    assert_eq!(
        runs,
        [
            Run::Other,
            Run::Other,
            Run::Other,
            Run::ToolUse,
            Run::ToolResult
        ]
    );
}

#[test]
fn tokens_follow_the_block_definitions() {
    let r = parse(COMPACT);
    let tokens: Vec<u64> = r.blocks.iter().map(|b| b.tokens).collect();
    assert_eq!(
        tokens,
        [
            block_tokens(r#"{"name":"Read","input_schema":{"type":"object"}}"#),
            count("sys"),
            block_tokens(r#"{"type":"text","text":"hi"}"#),
            block_tokens(r#"{"type":"tool_use","id":"t","name":"Read","input":{}}"#),
            block_tokens(r#"{"type":"tool_result","tool_use_id":"t","content":"ok"}"#),
        ]
    );
}

#[test]
fn thinking_config_and_roles_change_only_the_message_prefix() {
    let base = parse(PRETTY);
    let enable = |body: &str| {
        body.replacen(
            r#""stream": false,"#,
            r#""stream": false, "thinking": {"type":"enabled","budget_tokens":2048},"#,
            1,
        )
    };
    // With thinking on, the assistant message whose tool calls the last user message answers
    // must open with thinking: the API refuses the request otherwise, and so does the sim.
    let refused = request::parse(&enable(PRETTY)).err().map(|e| e.to_string());
    assert!(
        refused
            .as_deref()
            .is_some_and(|e| e.contains("400") && e.contains("must start with a thinking block")),
        "{refused:?}"
    );
    let thought = PRETTY.replacen(
        r#""content": [ { "type": "tool_use""#,
        r#""content": [ { "type": "thinking", "thinking": "hm", "signature": "s" }, { "type": "tool_use""#,
        1,
    );
    let thinking = parse(&enable(&thought));
    assert_eq!(prefixes(&base.blocks)[..2], prefixes(&thinking.blocks)[..2]);
    assert_ne!(base.blocks[2].prefix, thinking.blocks[2].prefix);
    assert!(thinking.thinking && !base.thinking);

    let swapped = PRETTY.replacen(r#""role": "user""#, r#""role": "assistant""#, 1);
    let swapped = parse(&swapped);
    assert_eq!(base.blocks[1].prefix, swapped.blocks[1].prefix);
    assert_ne!(base.blocks[2].prefix, swapped.blocks[2].prefix);

    let other_model = parse(&PRETTY.replacen("claude-sonnet-4-5", "claude-opus-4-1", 1));
    assert_ne!(base.blocks[0].prefix, other_model.blocks[0].prefix);
}

#[test]
fn malformed_bodies_are_invalid_requests() {
    let cases = [
        r#"{"max_tokens":1,"messages":[{"role":"user","content":"x"}]}"#,
        r#"{"model":"claude-sonnet-4-5","messages":[{"role":"user","content":"x"}]}"#,
        r#"{"model":"claude-sonnet-4-5","max_tokens":1,"messages":[{"role":"robot","content":"x"}]}"#,
        r#"{"model":"claude-sonnet-4-5","max_tokens":1,"messages":[{"role":"user","content":[1]}]}"#,
        r#"{"model":"claude-sonnet-4-5","max_tokens":1,"system":[{"type":"image"}],"messages":[{"role":"user","content":"x"}]}"#,
        r#"{"model":"claude-sonnet-4-5","max_tokens":1,"tools":{},"messages":[{"role":"user","content":"x"}]}"#,
    ];
    for body in cases {
        assert!(
            matches!(request::parse(body), Err(ProviderError::InvalidRequest(_))),
            "{body}"
        );
    }
}

/// The bodies of a fork batch of `n` as the sim sees them: the same tools, system and context,
/// then the fork message (one tool_use per child) and the user message with one placeholder
/// result per child, the boilerplate (a breakpoint at the end of what siblings share) and each
/// child's own directive (a breakpoint of its own).
fn sibling_bodies(n: usize) -> Vec<String> {
    let tool = r#"{"name":"Read","description":"Read a file","input_schema":{"type":"object"},"cache_control":{"type":"ephemeral"}}"#;
    let context = "A design document line, with its section and a number 42.\n".repeat(200);
    let context = serde_json::json!({"type":"text","text":context}).to_string();
    let uses: Vec<String> = (0..n)
        .map(|i| {
            format!(
                r#"{{"type":"tool_use","id":"toolu_{i:03}","name":"Agent","input":{{"description":"Part {i:03}","prompt":"Review part {i:03}."}}}}"#
            )
        })
        .collect();
    let results: Vec<String> = (0..n)
        .map(|i| {
            format!(
                r#"{{"type":"tool_result","tool_use_id":"toolu_{i:03}","content":"Fork started, processing in background"}}"#
            )
        })
        .collect();
    (0..n)
        .map(|i| {
            format!(
                r#"{{"model":"claude-sonnet-4-5","max_tokens":100,"stream":true,"tools":[{tool}],"system":[{{"type":"text","text":"You review.","cache_control":{{"type":"ephemeral"}}}}],"messages":[{{"role":"user","content":[{context}]}},{{"role":"assistant","content":[{uses}]}},{{"role":"user","content":[{results},{{"type":"text","text":"<fork-boilerplate>Work alone.</fork-boilerplate>","cache_control":{{"type":"ephemeral"}}}},{{"type":"text","text":"Review part {i:03} of the document.","cache_control":{{"type":"ephemeral"}}}}]}}]}}"#,
                uses = uses.join(","),
                results = results.join(","),
            )
        })
        .collect()
}

fn summary(r: &SimRequest) -> Vec<([u8; 32], u64, Run, Option<CacheTtl>)> {
    r.blocks
        .iter()
        .map(|b| (b.prefix, b.tokens, b.run, b.breakpoint))
        .collect()
}

#[test]
fn the_memo_reads_every_block_as_the_plain_parse_does() {
    let memo = BlockMemo::default();
    let mut bodies = sibling_bodies(12);
    bodies.extend([COMPACT.to_owned(), PRETTY.to_owned()]);
    // Twice: first filling the memo, then from it.
    for round in 0..2 {
        for body in &bodies {
            let plain = parse(body);
            let memoized = match request::parse_with(body, Some(&memo)) {
                Ok(r) => r,
                Err(e) => panic!("{e}: {body}"),
            };
            assert_eq!(summary(&plain), summary(&memoized), "round {round}: {body}");
            assert_eq!(plain.model.name, memoized.model.name);
            let messages = |r: &SimRequest| -> Vec<_> {
                r.messages
                    .iter()
                    .map(|m| (m.role, m.blocks.clone()))
                    .collect()
            };
            assert_eq!(messages(&plain), messages(&memoized));
            let total: u64 = memoized.blocks.iter().map(|b| b.tokens).sum();
            assert_eq!(crate::tokens::request_input_tokens(body), Ok(total));
        }
    }
    // Each distinct block is held once: tool, context, 12 tool_uses, 12 placeholders, the
    // boilerplate and 12 directives, then COMPACT's and PRETTY's own blocks.
    let fork_blocks = 1 + 1 + 12 + 12 + 1 + 12;
    assert!(memo.len() >= fork_blocks, "{}", memo.len());
    assert!(memo.len() <= fork_blocks + 10, "{}", memo.len());
}

#[test]
fn memoized_siblings_get_the_same_cache_usage() {
    use super::cache::PromptCache;
    let now = tokio::time::Instant::now();
    let memo = BlockMemo::default();
    let (mut plain_cache, mut memo_cache) = (PromptCache::default(), PromptCache::default());
    for (i, body) in sibling_bodies(8).into_iter().enumerate() {
        let plain = parse(&body);
        let Ok(memoized) = request::parse_with(&body, Some(&memo)) else {
            panic!("does not parse: {body}");
        };
        let min = plain.model.min_cache_tokens;
        let a = plain_cache.lookup(&plain.blocks, min, now);
        let b = memo_cache.lookup(&memoized.blocks, min, now);
        assert_eq!(a.usage, b.usage);
        assert_eq!(a.usage.cache_read_input_tokens > 0, i > 0, "sibling {i}");
        plain_cache.commit(&a.writes, now);
        memo_cache.commit(&b.writes, now);
    }
}

#[test]
fn the_memo_refuses_what_the_plain_parse_refuses() {
    let memo = BlockMemo::default();
    let thinking_bp = r#"{"model":"claude-sonnet-4-5","max_tokens":1,"messages":[{"role":"user","content":"x"},{"role":"assistant","content":[{"type":"thinking","thinking":"t","signature":"s","cache_control":{"type":"ephemeral"}}]}]}"#;
    let bad = [
        r#"{"model":"claude-sonnet-4-5","max_tokens":1,"messages":[{"role":"user","content":[1]}]}"#,
        r#"{"model":"claude-sonnet-4-5","max_tokens":1,"tools":[[]],"messages":[{"role":"user","content":"x"}]}"#,
        thinking_bp,
    ];
    for round in 0..2 {
        for body in bad {
            let plain = request::parse(body).map(|_| ());
            let memoized = request::parse_with(body, Some(&memo)).map(|_| ());
            assert!(plain.is_err(), "{body}");
            assert_eq!(plain, memoized, "round {round}: {body}");
        }
    }
    assert!(matches!(
        request::parse(thinking_bp),
        Err(ProviderError::Status { status: 400, .. })
    ));
}

#[test]
fn requests_over_the_context_window_are_refused_as_the_api_does() {
    let big = "word ".repeat(210_000);
    let over = format!(
        r#"{{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{{"role":"user","content":"{big}"}}]}}"#
    );
    let e = request::parse(&over)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        e.contains("prompt is too long:") && e.contains("> 200000 maximum"),
        "{e}"
    );

    let near = "word ".repeat(190_000);
    let with_room = |max_tokens: u32| {
        format!(
            r#"{{"model":"claude-sonnet-4-5","max_tokens":{max_tokens},"messages":[{{"role":"user","content":"{near}"}}]}}"#
        )
    };
    let e = request::parse(&with_room(20_000))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        e.contains("input length and `max_tokens` exceed context limit"),
        "{e}"
    );
    assert!(request::parse(&with_room(1_000)).is_ok());
}
