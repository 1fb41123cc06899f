//! The sim's `@sim` scripts and answers (docs/contracts.md, “The sim's script language”).

mod common;

use std::time::Duration;

use common::*;
use forkd_core::fork::boilerplate_text;
use forkd_core::{Block, BlockKind, Message};
use forkd_provider::sim::{SimConfig, SimProvider};
use forkd_provider::tokens::count;
use forkd_provider::{Provider, ProviderError, StreamEvent};
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::time::Instant;

fn sim() -> SimProvider {
    SimProvider::new(SimConfig::default())
}

fn directive(prompt: &str) -> Body {
    Body::default()
        .system("You are a careful engineer.")
        .user(&[text(prompt)])
}

/// (name, input) of every tool_use in a message.
fn calls(m: &Message) -> Vec<(String, Value)> {
    m.blocks
        .iter()
        .filter_map(|b| match b.kind() {
            BlockKind::ToolUse { name, .. } => Some((name.clone(), b.tool_input()?)),
            _ => None,
        })
        .collect()
}

fn ids(m: &Message) -> Vec<String> {
    m.tool_uses().map(|(id, _, _)| id.to_owned()).collect()
}

#[tokio::test]
async fn tool_turns_then_a_report_of_the_files_touched() {
    let script = "Fix the flaky parser test.\n\
        @sim tool Read {\"file_path\": \"src/parse.rs\"}\n\
        @sim tool Grep {\"pattern\": \"unwrap\", \"path\": \"src\"}\n\
        @sim think The fix is in parse.rs.\n\
        @sim tool Edit {\"file_path\": \"src/parse.rs\", \"old_string\": \"a\", \"new_string\": \"b\"}\n\
        @sim tool Write {\"file_path\": \"tests/parse.rs\", \"content\": \"x\"}\n\
        @sim tool Edit {\"file_path\": \"src/parse.rs\", \"old_string\": \"b\", \"new_string\": \"c\"}\n\
        @sim say Fixed the off-by-one.\n\
        @sim say Added a regression test.";
    let turns = converse(&sim(), directive(script)).await;
    let stops: Vec<_> = turns.iter().map(|c| c.stop_reason.as_deref()).collect();
    assert_eq!(
        stops,
        [Some("tool_use"), Some("tool_use"), Some("end_turn")]
    );

    let names = |m: &Message| calls(m).into_iter().map(|(n, _)| n).collect::<Vec<_>>();
    assert_eq!(names(&turns[0].message), ["Read", "Grep"]);
    assert_eq!(names(&turns[1].message), ["Edit", "Write", "Edit"]);
    assert_eq!(
        calls(&turns[0].message)[0].1,
        json!({"file_path": "src/parse.rs"})
    );
    assert_eq!(
        turns[1].message.blocks.first().map(|b| b.raw().to_string()),
        Some(
            Block::thinking("The fix is in parse.rs.", "sim")
                .raw()
                .to_string()
        )
    );
    assert_eq!(
        turns[2].message.text(),
        "Scope: Fix the flaky parser test.\n\
         Result: Fixed the off-by-one.\nAdded a regression test.\n\
         Key files: src/parse.rs, src\n\
         Files changed: src/parse.rs, tests/parse.rs\n\
         Issues: none"
    );
    for c in &turns {
        assert_eq!(c.usage.output_tokens, output_of(&c.message));
    }
}

/// Output tokens as the sim defines them: text, thinking and tool input JSON.
fn output_of(m: &Message) -> u64 {
    m.blocks
        .iter()
        .map(|b| {
            let v = b.raw().value();
            match b.kind() {
                BlockKind::ToolUse { .. } => count(&v["input"].to_string()),
                BlockKind::Thinking => count(v["thinking"].as_str().unwrap_or_default()),
                _ => count(v["text"].as_str().unwrap_or_default()),
            }
        })
        .sum()
}

#[tokio::test]
async fn consecutive_agent_lines_are_one_fork_batch() {
    let prompts = ["audit core", "audit store", "audit server"];
    let lines: Vec<String> = prompts
        .iter()
        .map(|p| format!("@sim agent {}", json!({"description": p, "prompt": p})))
        .collect();
    let script = format!(
        "Audit the crates.\n{}\n@sim say all audited",
        lines.join("\n")
    );
    let turns = converse(&sim(), directive(&script)).await;
    assert_eq!(turns.len(), 2);
    let batch = calls(&turns[0].message);
    assert_eq!(batch.len(), 3);
    for ((name, input), p) in batch.iter().zip(prompts) {
        assert_eq!(name, "Agent");
        assert_eq!(input, &json!({"description": p, "prompt": p}));
    }
    assert!(turns[1].message.text().contains("Result: all audited"));
}

#[tokio::test]
async fn scripted_failures_then_success() {
    // (status, how many times, the retry-after the error carries)
    let cases = [
        (529, 2, None),
        (429, 1, Some(Duration::from_secs(1))),
        (500, 3, None),
    ];
    for (status, times, retry_after) in cases {
        let sim = sim();
        let body = directive(&format!(
            "Flaky.\n@sim fail {status} x{times}\n@sim say fine"
        ));
        for _ in 0..times {
            match run(&sim, body.request()).await {
                Err(e @ ProviderError::Status { .. }) => {
                    assert!(e.is_retryable());
                    assert_eq!(
                        e,
                        ProviderError::Status {
                            status,
                            message: e_message(&e),
                            retry_after
                        }
                    );
                }
                other => panic!("expected a {status}: {other:?}"),
            }
        }
        let done = run(&sim, body.request()).await;
        assert!(done.is_ok_and(|c| c.message.text().contains("Result: fine")));
    }
}

fn e_message(e: &ProviderError) -> String {
    match e {
        ProviderError::Status { message, .. } => message.clone(),
        _ => String::new(),
    }
}

#[tokio::test]
async fn final_answers() {
    // (directive, expected report)
    let cases = [
        (
            "  Summarise the design.  \nin detail",
            "Scope: Summarise the design.\nResult: Done: Summarise the design.\nKey files: none\nFiles changed: none\nIssues: none",
        ),
        (
            "@sim say only this",
            "Scope: the directive\nResult: only this\nKey files: none\nFiles changed: none\nIssues: none",
        ),
        (
            "Do it.\n@sim tool Read {}\n@sim frob now",
            "Scope: Do it.\nResult: sim script error: line 3: unknown verb \"frob\"\nKey files: none\nFiles changed: none\nIssues: the @sim script could not run (line 3: unknown verb \"frob\")",
        ),
        (
            "Think first.\n@sim think hmm",
            "Scope: Think first.\nResult: Done: Think first.\nKey files: none\nFiles changed: none\nIssues: none",
        ),
    ];
    for (prompt, report) in cases {
        let turns = converse(&sim(), directive(prompt)).await;
        assert_eq!(turns.len(), 1, "{prompt}");
        assert_eq!(turns[0].message.text(), report, "{prompt}");
    }
    let long = "x".repeat(300);
    let turns = converse(&sim(), directive(&long)).await;
    assert!(
        turns[0]
            .message
            .text()
            .starts_with(&format!("Scope: {}\n", "x".repeat(120)))
    );
    let thought = converse(&sim(), directive("Think first.\n@sim think hmm")).await;
    assert_eq!(thought[0].message.blocks[0], Block::thinking("hmm", "sim"));
}

#[tokio::test]
async fn replays_produce_the_same_tool_ids() {
    let body = directive(
        "Look.\n@sim tool Read {\"file_path\":\"a\"}\n@sim tool Read {\"file_path\":\"b\"}",
    );
    let (a, b) = (sim(), sim());
    let first = run(&a, body.request()).await;
    let again = run(&a, body.request()).await;
    let elsewhere = run(&b, body.request()).await;
    let ids_of = |c: Result<forkd_provider::Completion, ProviderError>| c.map(|c| ids(&c.message));
    let first = ids_of(first);
    assert_eq!(first, ids_of(again));
    assert_eq!(first, ids_of(elsewhere));
    let first = first.unwrap_or_default();
    assert_eq!(first.len(), 2);
    assert_ne!(first[0], first[1]);
    for id in &first {
        let hex = id.strip_prefix("toolu_sim_").unwrap_or_default();
        assert!(
            hex.len() == 24 && hex.bytes().all(|c| c.is_ascii_hexdigit()),
            "{id}"
        );
    }
}

#[tokio::test]
async fn the_script_is_the_latest_user_text_with_sim_lines() {
    // A parent's script continues past tool results and later plain user text.
    let body = directive("Go.\n@sim tool Glob {\"path\": \"src\"}\n@sim say globbed")
        .assistant(&[tool_use("toolu_1", "Glob", json!({"path": "src"}))])
        .user(&[
            tool_result("toolu_1", "a.rs"),
            text("<task-notification>done</task-notification>"),
        ]);
    let done = run(&sim(), body.request()).await;
    assert_eq!(
        done.map(|c| c.message.text()),
        Ok("Scope: Go.\nResult: globbed\nKey files: src\nFiles changed: none\nIssues: none".into())
    );

    // A fork child reads its own directive, never its parent's script.
    let child = directive("Fan out.\n@sim agent {\"prompt\": \"part a\"}\n@sim tool Read {}")
        .assistant(&[tool_use("toolu_1", "Agent", json!({"prompt": "part a"}))])
        .user(&[
            tool_result("toolu_1", "Fork started -- processing in background"),
            text(&boilerplate_text()),
            text("part a"),
        ]);
    let done = run(&sim(), child.request()).await;
    assert!(done.is_ok_and(|c| {
        c.message
            .text()
            .starts_with("Scope: part a\nResult: Done: part a")
    }));
}

#[tokio::test(start_paused = true)]
async fn sleep_spreads_the_response_and_starts_promptly() {
    let body = directive("Slow.\n@sim sleep 3s\n@sim say late");
    let sim = sim();
    let start = Instant::now();
    let mut stream = sim.stream(body.request());
    let mut started = None;
    while let Some(ev) = stream.next().await {
        if ev.is_ok_and(|ev| is_start(&ev)) {
            started = Some(start.elapsed());
        }
    }
    assert_eq!(started, Some(Duration::ZERO));
    let total = start.elapsed();
    assert!(
        total > Duration::from_millis(2990) && total <= Duration::from_secs(3),
        "{total:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn latency_grows_with_uncached_input() {
    let sim = SimProvider::new(SimConfig {
        speed: 1.0,
        ..SimConfig::default()
    });
    let body = Body::default()
        .system(&prose(3000))
        .user(&[text("Hi.")])
        .cache_at(-1);
    let mut ttfts = Vec::new();
    for _ in 0..2 {
        let start = Instant::now();
        let mut stream = sim.stream(body.request());
        let first = stream.next().await;
        let uncached = match first {
            Some(Ok(StreamEvent::MessageStart { usage, .. })) => {
                usage.input_tokens + usage.cache_creation_input_tokens
            }
            other => panic!("{other:?}"),
        };
        let ttft = start.elapsed();
        let expected = Duration::from_secs_f64(0.2 + 50e-6 * uncached as f64);
        assert!(
            ttft.abs_diff(expected) < Duration::from_millis(1),
            "{ttft:?} vs {expected:?}"
        );
        ttfts.push(ttft);
        while stream.next().await.is_some() {}
    }
    assert!(ttfts[1] < ttfts[0], "a cache hit starts sooner: {ttfts:?}");
}
