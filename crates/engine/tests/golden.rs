//! Golden request bodies: the exact bytes forkd sends the model in a few representative
//! situations, compared with files under `tests/golden/`. They were recorded before the engine
//! was reshaped into services (issue 27) and stay, so that moving code can never change what a
//! model sees (and with it the prompt cache) without a test saying so.
//!
//! The situations: the demo's children (its system prompt, context files and five directives on
//! a fresh session), a client batch on a thinking session, a model-driven fork (the parent's
//! requests and its children's), a client-asked compaction, and a child resumed by a new engine
//! after the first stopped mid-request. What differs from run to run — ids, the temporary
//! directory — is replaced by placeholders numbered in order of appearance; everything else is
//! compared byte for byte.
//!
//! To record them again after a change that is meant to change what the model sees, run with
//! `FORKD_BLESS=1` and review the diff.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::{Recorder, ended, eventually, new_session};
use forkd_core::{AgentState, Directive};
use forkd_engine::{Engine, EngineConfig};
use futures::StreamExt;

async fn engine(dir: &Path, recorder: Arc<Recorder>, config: EngineConfig) -> Engine {
    Engine::new(common::store(dir).await, recorder, config)
}

/// `body` with what differs between runs replaced: `dir` by `<DIR>`, each UUID by `<ID n>`
/// (numbered in order of first appearance across `bodies`), the session's date by `<DATE>`, and
/// the figures of a report's `<usage>` by `<USAGE>` (the sim counts the tokens of random ids, so
/// they vary by one or two).
fn normalized(bodies: &[String], dir: &Path) -> String {
    let dir = dir.display().to_string();
    let mut ids: HashMap<String, usize> = HashMap::new();
    let mut out = String::new();
    for (i, body) in bodies.iter().enumerate() {
        let body = without_usage(&without_date(&body.replace(&dir, "<DIR>")));
        out.push_str(&format!("--- request {}\n", i + 1));
        out.push_str(&replace_uuids(&body, &mut ids));
        out.push('\n');
    }
    out
}

/// `text` with each date of an environment block (`Today's date: YYYY-MM-DD`) as `<DATE>`.
fn without_date(text: &str) -> String {
    const LABEL: &str = "Today's date: ";
    const DATE: usize = "YYYY-MM-DD".len();
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(LABEL) {
        let end = at + LABEL.len();
        out.push_str(&rest[..end]);
        out.push_str("<DATE>");
        rest = rest.get(end + DATE..).unwrap_or_default();
    }
    out.push_str(rest);
    out
}

fn without_usage(text: &str) -> String {
    const OPEN: &str = "<usage>";
    const CLOSE: &str = "</usage>";
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find(OPEN) {
        let Some(len) = rest[start..].find(CLOSE) else {
            break;
        };
        out.push_str(&rest[..start]);
        out.push_str("<usage><USAGE></usage>");
        rest = &rest[start + len + CLOSE.len()..];
    }
    out.push_str(rest);
    out
}

fn replace_uuids(text: &str, ids: &mut HashMap<String, usize>) -> String {
    const LEN: usize = 36;
    let bytes = text.as_bytes();
    let is_uuid = |s: &[u8]| {
        s.len() == LEN
            && s.iter().enumerate().all(|(i, b)| match i {
                8 | 13 | 18 | 23 => *b == b'-',
                _ => b.is_ascii_hexdigit(),
            })
    };
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < bytes.len() {
        if i + LEN <= bytes.len() && is_uuid(&bytes[i..i + LEN]) {
            let id = &text[i..i + LEN];
            let next = ids.len() + 1;
            let n = *ids.entry(id.to_owned()).or_insert(next);
            out.push_str(&format!("<ID {n}>"));
            i += LEN;
        } else {
            let c = text[i..].chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// Compares `got` with the golden file `name` (or writes it, with `FORKD_BLESS` set).
fn check(name: &str, got: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("{name}.txt"));
    if std::env::var_os("FORKD_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; record it with FORKD_BLESS=1 cargo test -p forkd-engine --test golden",
            path.display()
        )
    });
    if want != got {
        let at = want
            .bytes()
            .zip(got.bytes())
            .position(|(a, b)| a != b)
            .unwrap_or(want.len().min(got.len()));
        let context = |s: &str| {
            let start = at.saturating_sub(120);
            let end = (at + 120).min(s.len());
            s.get(start..end).unwrap_or("").to_owned()
        };
        panic!(
            "{name}: what the model is sent changed at byte {at}\n  golden: …{}…\n  now:    …{}…\n\
             (if the change is meant, record it again with FORKD_BLESS=1 and review the diff)",
            context(&want),
            context(got)
        );
    }
}

fn directives(n: usize) -> Vec<Directive> {
    (0..n)
        .map(|i| Directive {
            description: format!("part {i}"),
            prompt: format!("Review part {i}.\n@sim say part {i} is fine"),
        })
        .collect()
}

async fn turn(engine: &Engine, session: forkd_core::SessionId, text: &str) {
    let stream = engine.send_message(session, text.into()).await.unwrap();
    let events: Vec<_> = tokio::time::timeout(Duration::from_secs(60), stream.collect())
        .await
        .expect("the turn ends");
    assert!(events.iter().all(Result::is_ok), "{events:?}");
}

/// The recorded bodies, children's in the order of their directives (they run concurrently).
fn ordered(mut bodies: Vec<String>, markers: &[String]) -> Vec<String> {
    let rank = |b: &String| {
        markers
            .iter()
            .position(|m| b.contains(m.as_str()))
            .unwrap_or(usize::MAX)
    };
    bodies.sort_by_key(rank);
    bodies
}

/// `forkd demo`'s system prompt and directives, from the file the demo embeds; a fixed corpus
/// stands for its context files (the demo embeds forkd's own sources, which change with every
/// commit).
const DEMO_SCENARIO: &str = include_str!("../../forkd/src/demo/scenario.json");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demos_children() {
    let dir = tempfile::tempdir().unwrap();
    let recorder = Arc::new(Recorder::with_speed(0.0));
    let engine = engine(dir.path(), recorder.clone(), EngineConfig::default()).await;
    let scenario: serde_json::Value = serde_json::from_str(DEMO_SCENARIO).unwrap();
    let text = |v: &serde_json::Value| v.as_str().unwrap().to_owned();
    let mut new = new_session(dir.path(), &text(&scenario["system_prompt"]));
    new.context_files = vec![
        forkd_engine::ContextFile {
            path: "README.md".into(),
            content: "# forkd\n\nA daemon that forks agents. ".repeat(200),
        },
        forkd_engine::ContextFile {
            path: "crates/core/src/fork.rs".into(),
            content: "//! The fork.\n\npub fn fork() -> Batch { todo!() }\n".repeat(150),
        },
    ];
    let s = engine.create_session(new).await.unwrap();
    let directives: Vec<Directive> = scenario["directives"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| Directive {
            description: text(&d["description"]),
            prompt: text(&d["prompt"]),
        })
        .collect();
    let batch = engine
        .fork_batch(s.id, directives.clone(), Default::default())
        .await
        .unwrap();
    for id in &batch.agent_ids {
        ended(&engine, *id).await;
    }
    let markers: Vec<String> = directives
        .iter()
        .map(|d| d.prompt[..40].to_owned())
        .collect();
    let children = ordered(recorder.bodies(), &markers);
    assert_eq!(children.len(), directives.len());
    check("demo_children", &normalized(&children, dir.path()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_batch_on_a_thinking_session() {
    let dir = tempfile::tempdir().unwrap();
    let recorder = Arc::new(Recorder::with_speed(0.0));
    let engine = engine(dir.path(), recorder.clone(), EngineConfig::default()).await;
    let mut new = new_session(dir.path(), "You review code.");
    new.thinking_budget = Some(2048);
    let s = engine.create_session(new).await.unwrap();
    turn(&engine, s.id, "Get ready to review.\n@sim say ready").await;
    let parent = recorder.bodies();
    let batch = engine
        .fork_batch(s.id, directives(2), Default::default())
        .await
        .unwrap();
    for id in &batch.agent_ids {
        ended(&engine, *id).await;
    }
    let children: Vec<String> = recorder.bodies()[parent.len()..].to_vec();
    let markers: Vec<String> = (0..2).map(|i| format!("Review part {i}.")).collect();
    let mut all = parent;
    all.extend(ordered(children, &markers));
    check("client_batch_thinking", &normalized(&all, dir.path()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_driven_fork() {
    let dir = tempfile::tempdir().unwrap();
    // Real time, so that child b (which sleeps) reports after child a.
    let recorder = Arc::new(Recorder::with_speed(1.0));
    let config = EngineConfig {
        fork_always_async: false,
        ..EngineConfig::default()
    };
    let engine = engine(dir.path(), recorder.clone(), config).await;
    let s = engine
        .create_session(new_session(dir.path(), "You split work."))
        .await
        .unwrap();
    let script = concat!(
        "Split it.\n",
        r#"@sim agent {"description":"a","prompt":"Do a.\n@sim say a done"}"#,
        "\n",
        r#"@sim agent {"description":"b","prompt":"Do b.\n@sim sleep 3s\n@sim say b done"}"#,
        "\n@sim say summarized",
    );
    turn(&engine, s.id, script).await;
    let sent = recorder.bodies();
    // The parent's first request, the children's (in directive order), the parent's last.
    let markers = ["Do a.".to_owned(), "Do b.".to_owned()];
    let (children, parent): (Vec<String>, Vec<String>) = sent.into_iter().partition(|b| {
        markers
            .iter()
            .any(|m| b.contains(&format!("\"text\":\"{m}")))
    });
    let mut all = parent;
    all.extend(ordered(children, &markers));
    check("model_driven_fork", &normalized(&all, dir.path()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_asked_for_by_the_client() {
    let dir = tempfile::tempdir().unwrap();
    let recorder = Arc::new(Recorder::with_speed(0.0));
    let engine = engine(dir.path(), recorder.clone(), EngineConfig::default()).await;
    let s = engine
        .create_session(new_session(dir.path(), "You keep notes."))
        .await
        .unwrap();
    for i in 0..3 {
        turn(&engine, s.id, &format!("Note {i}.\n@sim say noted {i}")).await;
    }
    let before = recorder.bodies().len();
    engine
        .compact_session(s.id, Some("Keep every note.".into()))
        .await
        .unwrap();
    turn(&engine, s.id, "What did I note?\n@sim say three notes").await;
    let after = recorder.bodies()[before..].to_vec();
    check("compaction", &normalized(&after, dir.path()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_resumed_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    // Real time, so that the child's reply is still streaming when the engine stops.
    let first_recorder = Arc::new(Recorder::with_speed(1.0));
    let first = engine(dir.path(), first_recorder.clone(), EngineConfig::default()).await;
    let s = first
        .create_session(new_session(dir.path(), "You wait well."))
        .await
        .unwrap();
    let directive = Directive {
        description: "slow".into(),
        prompt: "Take your time.\n@sim sleep 3s\n@sim say resumed fine".into(),
    };
    let batch = first
        .fork_batch(s.id, vec![directive], Default::default())
        .await
        .unwrap();
    let child = batch.agent_ids[0];
    eventually(Duration::from_secs(30), "the child's request", || async {
        !first_recorder.bodies().is_empty()
    })
    .await;
    first.shutdown(Duration::ZERO).await;

    let recorder = Arc::new(Recorder::with_speed(0.0));
    let second = engine(dir.path(), recorder.clone(), EngineConfig::default()).await;
    assert_eq!(second.resume_interrupted().await.unwrap(), 1);
    let note = ended(&second, child).await;
    assert_eq!(
        second.get_agent(child).await.unwrap().state,
        AgentState::Completed,
        "{note:?}"
    );
    let mut all = first_recorder.bodies();
    all.extend(recorder.bodies());
    check("child_resumed", &normalized(&all, dir.path()));
}
