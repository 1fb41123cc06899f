//! How the sim reads request bodies: block identities, tokens and breakpoints.

use super::request::{self, CacheBlock, Run, SimRequest};
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
    let thinking = PRETTY.replacen(
        r#""stream": false,"#,
        r#""stream": false, "thinking": {"type":"enabled","budget_tokens":2048},"#,
        1,
    );
    let thinking = parse(&thinking);
    assert_eq!(prefixes(&base.blocks)[..2], prefixes(&thinking.blocks)[..2]);
    assert_ne!(base.blocks[2].prefix, thinking.blocks[2].prefix);

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
