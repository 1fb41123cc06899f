//! The sim's prompt-cache model (docs/contracts.md, “Prompt-cache rules”), observed through usage.

mod common;

use std::time::Duration;

use common::*;
use forkd_core::fork::{ForkBatch, client_fork_message};
use forkd_core::request::serialize;
use forkd_core::session::{CacheSafeParams, RenderedSystem, ToolsJson};
use forkd_core::{BatchId, Block, Directive, Message, SessionId, Usage};
use forkd_provider::sim::{SimConfig, SimProvider};
use forkd_provider::tokens::block_tokens;
use forkd_provider::{Provider, ProviderError};
use futures::StreamExt;
use serde_json::json;

fn sim() -> SimProvider {
    SimProvider::new(SimConfig::default())
}

/// A system prompt of ~1500 tokens (cacheable on sonnet) and one user message.
fn base() -> Body {
    Body::default()
        .tool(json!({"name": "Read", "description": "Read a file", "input_schema": {"type": "object"}}))
        .system(&prose(1500))
        .user(&[text("Summarise the repository.")])
}

async fn usage_of(sim: &SimProvider, body: &Body) -> Usage {
    match run(sim, body.request()).await {
        Ok(c) => input_side(&c),
        Err(e) => panic!("request failed: {e}"),
    }
}

#[tokio::test]
async fn sequential_identical_requests_read_the_whole_prefix() {
    let sim = sim();
    let body = base().cache_at(1).cache_at(-1);
    assert_eq!(usage_of(&sim, &body).await, usage(0, body.total(), 0));
    assert_eq!(sim.cache_entries(), 2, "system and last block");
    assert_eq!(usage_of(&sim, &body).await, usage(0, 0, body.total()));

    // A tail after the last breakpoint is plain input; the prefix up to it still hits.
    let longer = base().user(&[text("and more")]).cache_at(1).cache_at(2);
    let prefix = longer.prefix(3);
    assert_eq!(
        usage_of(&sim, &longer).await,
        usage(longer.total() - prefix, 0, prefix)
    );
}

#[tokio::test]
async fn siblings_sent_together_all_miss_until_one_starts() {
    let sim = sim();
    let body = base().cache_at(-1);
    let first = sim.stream(body.request());
    let second = sim.stream(body.request());
    for stream in [first, second] {
        let c = collect(stream).await;
        assert_eq!(c.map(|c| input_side(&c)), Ok(usage(0, body.total(), 0)));
    }

    // The gate: a sibling sent once the first response has started reads its prefix, even
    // though the first response is still streaming.
    let sim = self::sim();
    let mut leader = sim.stream(body.request());
    assert_eq!(
        sim.cache_entries(),
        0,
        "nothing is readable before message_start"
    );
    let start = leader.next().await;
    assert!(start.is_some_and(|ev| ev.is_ok_and(|ev| is_start(&ev))));
    assert_eq!(sim.cache_entries(), 1);
    assert_eq!(usage_of(&sim, &body).await, usage(0, 0, body.total()));
}

#[tokio::test]
async fn lookback_checks_twenty_positions() {
    // (blocks added after the cached block, whether the new breakpoint finds the old entry)
    let cases = [(1, true), (19, true), (20, false), (25, false)];
    for (extra, hit) in cases {
        let sim = sim();
        let first = base().cache_at(-1);
        usage_of(&sim, &first).await;
        let filler: Vec<String> = (0..extra).map(|i| text(&format!("note {i}"))).collect();
        let second = base().user(&filler).cache_at(-1);
        let read = usage_of(&sim, &second).await.cache_read_input_tokens;
        let expected = if hit { first.total() } else { 0 };
        assert_eq!(read, expected, "{extra} blocks later");
    }
}

#[tokio::test]
async fn a_run_of_tool_uses_is_one_position() {
    // (what the assistant turn holds, whether the breakpoint after it still finds the old entry)
    let uses: Vec<String> = (0..30)
        .map(|i| {
            tool_use(
                &format!("t{i}"),
                "Read",
                json!({"file_path": format!("f{i}")}),
            )
        })
        .collect();
    let texts: Vec<String> = (0..30).map(|i| text(&format!("step {i}"))).collect();
    let results: Vec<String> = (0..30)
        .map(|i| tool_result(&format!("t{i}"), "ok"))
        .collect();
    let cases = [
        (uses.clone(), results.clone(), true),
        (texts, Vec::new(), false),
    ];
    for (turn, answers, hit) in cases {
        let sim = sim();
        let first = base().cache_at(-1);
        usage_of(&sim, &first).await;
        let answers = [answers, vec![text("next")]].concat();
        let second = base().assistant(&turn).user(&answers).cache_at(-1);
        let read = usage_of(&sim, &second).await.cache_read_input_tokens;
        assert_eq!(read, if hit { first.total() } else { 0 }, "hit={hit}");
    }
}

#[tokio::test]
async fn prefixes_under_the_model_minimum_are_processed_uncached() {
    // (model, whether a ~1500-token prefix is cached)
    let cases = [
        ("claude-sonnet-4-5", true),
        ("claude-opus-4-1", true),
        ("claude-3-5-haiku", false),
        ("claude-haiku-4-5", false),
    ];
    for (model, cached) in cases {
        let sim = sim();
        let body = base().model(model).cache_at(-1);
        for _ in 0..2 {
            let got = usage_of(&sim, &body).await;
            if cached {
                assert_eq!(got.total_input(), body.total());
                assert_eq!(got.input_tokens, 0, "{model}");
            } else {
                assert_eq!(got, usage(body.total(), 0, 0), "{model}");
            }
        }
        assert_eq!(sim.cache_entries(), usize::from(cached), "{model}");
    }
}

#[tokio::test]
async fn caches_are_per_model() {
    let sim = sim();
    let sonnet = base().cache_at(-1);
    usage_of(&sim, &sonnet).await;
    let opus = base().model("claude-opus-4-1").cache_at(-1);
    assert_eq!(usage_of(&sim, &opus).await.cache_read_input_tokens, 0);
}

#[tokio::test]
async fn request_errors() {
    let sim = sim();
    let five = (0..5).fold(base().user(&[text("a"), text("b"), text("c")]), |b, i| {
        b.cache_at(i)
    });
    let four = (0..4).fold(base().user(&[text("a"), text("b")]), |b, i| b.cache_at(i));
    let thinking = base()
        .assistant(&[json!({"type": "thinking", "thinking": "t", "signature": "s"}).to_string()])
        .cache_at(-1);
    assert!(run(&sim, four.request()).await.is_ok());
    // (body, the error's status, or None for a request refused before sending)
    let cases = [
        (five.json(), Some(400)),
        (thinking.json(), Some(400)),
        (base().model("gpt-2").json(), None),
        ("{".into(), None),
        (
            r#"{"model":"claude-sonnet-4-5","max_tokens":1,"messages":[]}"#.into(),
            None,
        ),
    ];
    for (body, status) in cases {
        match (run(&sim, request(MODEL, &body)).await, status) {
            (Err(ProviderError::Status { status: got, .. }), Some(want)) => assert_eq!(got, want),
            (Err(ProviderError::InvalidRequest(_)), None) => {}
            (other, _) => panic!("{body}: {other:?}"),
        }
    }
}

#[tokio::test(start_paused = true)]
async fn entries_expire_after_five_minutes_unless_hit() {
    let sim = sim();
    let body = base().cache_at(-1);
    let hit = usage(0, 0, body.total());
    let miss = usage(0, body.total(), 0);
    // (seconds to wait before the next identical request, expected usage)
    let steps = [
        (0, miss),
        (299, hit),
        (299, hit),
        (299, hit),
        (301, miss),
        (1, hit),
    ];
    for (wait, expected) in steps {
        tokio::time::advance(Duration::from_secs(wait)).await;
        assert_eq!(usage_of(&sim, &body).await, expected, "after {wait}s");
    }
    tokio::time::advance(Duration::from_secs(301)).await;
    assert_eq!(sim.cache_entries(), 0);

    // A one-hour breakpoint outlives the five-minute window.
    let hour = base().cache_with(-1, r#","cache_control":{"type":"ephemeral","ttl":"1h"}"#);
    usage_of(&sim, &hour).await;
    tokio::time::advance(Duration::from_secs(3000)).await;
    assert_eq!(
        usage_of(&sim, &hour).await.cache_read_input_tokens,
        hour.total()
    );
}

#[tokio::test]
async fn a_failed_request_writes_nothing() {
    let sim = sim();
    let body = Body::default()
        .system(&prose(1500))
        .user(&[text("Try.\n@sim fail 529")])
        .cache_at(-1);
    assert!(matches!(
        run(&sim, body.request()).await,
        Err(ProviderError::Status { status: 529, .. })
    ));
    assert_eq!(sim.cache_entries(), 0);
    assert_eq!(usage_of(&sim, &body).await, usage(0, body.total(), 0));
}

#[tokio::test]
async fn fork_children_built_by_forkd_share_the_prefix() {
    let params = CacheSafeParams {
        model: MODEL.into(),
        system: RenderedSystem::from_stored(&prose(2000)),
        tools: ToolsJson::builtin(),
        thinking: None,
        max_tokens: 4096,
    };
    let history = vec![Message::user(vec![Block::text("Audit every module.")])];
    let directives: Vec<Directive> = (0..5)
        .map(|i| Directive {
            description: format!("module {i}"),
            prompt: format!("Audit module {i} for unsafe code."),
        })
        .collect();
    let id = BatchId::new();
    let batch = match ForkBatch::new(
        id,
        SessionId::new(),
        1,
        client_fork_message(id, &directives),
        0,
    ) {
        Ok(b) => b,
        Err(e) => panic!("{e}"),
    };
    let sim = sim();
    let mut usages = Vec::new();
    for d in &directives {
        let block = ForkBatch::directive_block(d);
        let conv = batch.child_conversation(&history, &block, &[]);
        let body = serialize(&params, &conv, true).body;
        match run(&sim, request(MODEL, &body)).await {
            Ok(c) => usages.push((input_side(&c), block_tokens(block.raw().as_str()))),
            Err(e) => panic!("{e}"),
        }
    }
    let (first, _) = usages[0];
    assert_eq!((first.cache_read_input_tokens, first.input_tokens), (0, 0));
    for (u, directive_tokens) in &usages[1..] {
        // Children 2..N read everything but their own directive, which they write.
        assert_eq!(u.cache_creation_input_tokens, *directive_tokens);
        assert_eq!(
            u.total_input(),
            first.total_input() - usages[0].1 + directive_tokens
        );
        assert!(u.cache_read_share() > 0.95, "{u:?}");
    }
}
