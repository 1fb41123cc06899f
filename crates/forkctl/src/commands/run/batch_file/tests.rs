//! The batch file, parsed from YAML as a user writes it: requests, refusals and their messages.

use forkd_proto::v1::Limits;

use super::*;

const FULL: &str = r#"
key: nightly-42
session:
  system_file: system.md
  context_files: [notes/a.md]
  model: sim
  workspace: work
  permission_mode: dontAsk
  capacity_tool: true
  allow: ["Bash(cargo test:*)"]
  deny: ["Write(secrets/**)"]
directives:
  - description: Review the README
    prompt: |
      Review the README.
      Carefully.
  - "Summarize the README\nin three lines"
warmup_gating: false
budget_usd: 2.5
budget_tokens: 100000
"#;

fn dir_with_files() -> anyhow::Result<tempfile::TempDir> {
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("system.md"), "You review.")?;
    std::fs::create_dir_all(dir.path().join("notes"))?;
    std::fs::create_dir_all(dir.path().join("work"))?;
    std::fs::write(dir.path().join("notes/a.md"), "# A")?;
    Ok(dir)
}

fn parse_err(text: &str) -> String {
    match BatchFile::parse(Path::new("ci/batch.yaml"), text, Path::new("/nonexistent")) {
        Err(CliError::InvalidInput(msg)) => msg,
        other => panic!("expected an invalid input, got {other:?}"),
    }
}

#[test]
fn a_full_file_becomes_both_requests() -> anyhow::Result<()> {
    let dir = dir_with_files()?;
    let path = dir.path().join("batch.yaml");
    std::fs::write(&path, FULL)?;
    let file = BatchFile::load(&path)?;
    assert_eq!(file.key, "nightly-42");

    let SessionSource::Create(new) = &file.session else {
        panic!("the file creates its session")
    };
    let s = &new.request;
    assert_eq!(new.upload, None);
    assert_eq!(s.system_prompt, "You review.");
    assert_eq!(s.context_files.len(), 1);
    assert_eq!(s.context_files[0].path, "notes/a.md");
    assert_eq!(s.context_files[0].content, "# A");
    assert_eq!(s.model, "sim");
    let workspace = std::fs::canonicalize(dir.path().join("work"))?;
    assert_eq!(Path::new(&s.workspace), workspace);
    assert_eq!(s.permission_mode, "dontAsk");
    assert!(s.capacity_tool);
    assert_eq!(s.allow_rules, ["Bash(cargo test:*)"]);
    assert_eq!(s.deny_rules, ["Write(secrets/**)"]);
    assert_eq!(s.idempotency_key, "nightly-42/session");

    let f = &file.fork;
    assert_eq!(f.session_id, "");
    assert_eq!(f.directives.len(), 2);
    assert_eq!(f.directives[0].description, "Review the README");
    assert_eq!(f.directives[0].prompt, "Review the README.\nCarefully.\n");
    // A plain string is the prompt, described by its first line.
    assert_eq!(f.directives[1].description, "Summarize the README");
    assert_eq!(
        f.directives[1].prompt,
        "Summarize the README\nin three lines"
    );
    assert_eq!(f.warmup_gating, Some(false));
    assert_eq!(f.idempotency_key, "nightly-42/batch");
    assert_eq!(f.budget_usd, 2.5);
    assert_eq!(f.budget_tokens, 100_000);
    Ok(())
}

#[test]
fn a_minimal_file_leaves_the_rest_to_the_daemon() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let text = "key: k\nsession:\n  system: Be brief.\ndirectives: [one]\n";
    let file = BatchFile::parse(Path::new("b.yaml"), text, dir.path())?;
    let SessionSource::Create(new) = &file.session else {
        panic!("the file creates its session")
    };
    let session = &new.request;
    assert_eq!(session.system_prompt, "Be brief.");
    assert_eq!(session.model, "");
    assert_eq!(session.permission_mode, "");
    assert!(!session.capacity_tool);
    // The workspace defaults to the file's directory.
    assert_eq!(
        Path::new(&session.workspace),
        std::fs::canonicalize(dir.path())?
    );
    assert_eq!(file.fork.warmup_gating, None);
    assert_eq!((file.fork.budget_usd, file.fork.budget_tokens), (0.0, 0));
    Ok(())
}

#[test]
fn an_upload_replaces_the_workspace_and_is_checked_before_connecting() -> anyhow::Result<()> {
    let dir = dir_with_files()?;
    let text = "key: k\nsession: {system: s, upload: work}\ndirectives: [a]\n";
    let file = BatchFile::parse(Path::new("b.yaml"), text, dir.path())?;
    let SessionSource::Create(new) = &file.session else {
        panic!("the file creates its session")
    };
    assert_eq!(new.request.workspace, "");
    assert_eq!(new.request.upload_id, "");
    assert_eq!(
        new.upload.as_deref(),
        Some(std::fs::canonicalize(dir.path().join("work"))?.as_path())
    );

    let both = "key: k\nsession: {system: s, upload: ., workspace: .}\ndirectives: [a]\n";
    let msg = parse_err(both);
    assert!(msg.contains("give `workspace`"), "{msg}");
    assert!(msg.contains("or `upload`"), "{msg}");
    let msg = parse_err("key: k\nsession: {system: s, upload: nope}\ndirectives: [a]\n");
    assert!(
        msg.starts_with("ci/batch.yaml: `session.upload`: cannot upload /nonexistent/nope"),
        "{msg}"
    );
    Ok(())
}

#[test]
fn a_file_may_fork_an_existing_session_after_a_turn() -> anyhow::Result<()> {
    let text = "key: k\nsession: 0193-s\nat_turn: 5\ndirectives: [one, two]\n";
    let file = BatchFile::parse(Path::new("b.yaml"), text, Path::new("/nonexistent"))?;
    assert_eq!(file.session, SessionSource::Existing("0193-s".into()));
    assert_eq!(file.fork.at_turn, Some(5));
    assert_eq!(file.fork.directives.len(), 2);
    assert!(parse_err("key: k\nsession: ''\ndirectives: [one]\n").contains("must not be empty"));
    Ok(())
}

#[test]
fn an_output_schema_is_a_file_or_inline_and_is_checked_here() -> anyhow::Result<()> {
    let dir = dir_with_files()?;
    std::fs::write(
        dir.path().join("verdict.json"),
        r#"{"type": "object", "required": ["verdict"]}"#,
    )?;
    let text = "key: k\nsession: s1\ndirectives: [a]\noutput_schema: verdict.json\n";
    let file = BatchFile::parse(Path::new("b.yaml"), text, dir.path())?;
    assert_eq!(
        file.fork.output_schema,
        r#"{"type":"object","required":["verdict"]}"#
    );
    let text = "key: k\nsession: s1\ndirectives: [a]\noutput_schema:\n  type: object\n  \
                    properties: {verdict: {enum: [pass, fail]}}\n";
    let file = BatchFile::parse(Path::new("b.yaml"), text, dir.path())?;
    assert_eq!(
        file.fork.output_schema,
        r#"{"type":"object","properties":{"verdict":{"enum":["pass","fail"]}}}"#
    );
    let msg = parse_err("key: k\nsession: s1\ndirectives: [a]\noutput_schema: {type: objet}\n");
    assert!(
        msg.contains("`output_schema`: the output schema is not a valid JSON Schema"),
        "{msg}"
    );
    let msg = parse_err("key: k\nsession: s1\ndirectives: [a]\noutput_schema: none.json\n");
    assert!(msg.contains("cannot read output schema"), "{msg}");
    Ok(())
}

#[test]
fn the_same_file_makes_the_same_requests_from_any_directory() -> anyhow::Result<()> {
    let dir = dir_with_files()?;
    let path = dir.path().join("batch.yaml");
    std::fs::write(&path, FULL)?;
    let roundabout = dir.path().join("notes/../batch.yaml");
    assert_eq!(BatchFile::load(&path)?, BatchFile::load(&roundabout)?);
    Ok(())
}

#[test]
fn an_unknown_key_is_named_with_the_file_and_line() {
    let msg = parse_err("key: k\nsession:\n  system: s\n  modle: x\ndirectives: [a]\n");
    assert!(
        msg.starts_with("ci/batch.yaml:4:3: unknown field `modle`, expected one of"),
        "{msg}"
    );
    assert!(msg.ends_with(" (near `modle: x`)"), "{msg}");
    let msg = parse_err("key: k\nsession: {system: s}\ndirectives: [a]\nbudget: 3\n");
    assert!(
        msg.starts_with("ci/batch.yaml:4:1: unknown field `budget`"),
        "{msg}"
    );
    let msg = parse_err("key: k\nsession: {system: s}\ndirectives:\n  - {prompt: p, desc: d}\n");
    assert!(
        msg.starts_with(
            "ci/batch.yaml:4:17: unknown field `desc`, expected one of description, prompt"
        ),
        "{msg}"
    );
}

#[test]
fn missing_and_malformed_keys_are_named() {
    let msg = parse_err("session: {system: s}\ndirectives: [a]\n");
    assert!(msg.contains(": missing field `key`"), "{msg}");
    let msg = parse_err("key: k\nsession: {system: s}\ndirectives:\n  - description: d\n");
    assert_eq!(
        msg,
        "ci/batch.yaml:4:5: missing field `prompt` (near `- description: d`)"
    );
    let msg = parse_err("key: k\nsession: {system: s}\ndirectives: [a]\nbudget_tokens: many\n");
    assert_eq!(
        msg,
        "ci/batch.yaml:4:16: invalid u64 (near `budget_tokens: many`)"
    );
    let msg = parse_err("key: k\nsession: {system: s}\ndirectives: [3]\n");
    assert!(
        msg.contains("expected a prompt, or a map with `prompt`"),
        "{msg}"
    );
    let msg = parse_err("key: [\n");
    assert!(msg.starts_with("ci/batch.yaml:1:"), "{msg}");
}

#[test]
fn what_the_types_allow_but_forkd_does_not_is_refused_by_key() {
    let cases = [
        ("key: ' '\nsession: {system: s}\ndirectives: [a]\n", "`key`"),
        (
            "key: k\nsession: {system: s, system_file: f}\ndirectives: [a]\n",
            "not both",
        ),
        ("key: k\nsession: {model: m}\ndirectives: [a]\n", "`system`"),
        (
            "key: k\nsession: {system: s, permission_mode: yolo}\ndirectives: [a]\n",
            "`session.permission_mode`: unknown mode `yolo`",
        ),
        (
            "key: k\nsession: {system: s}\ndirectives: []\n",
            "`directives`",
        ),
        (
            "key: k\nsession: {system: s}\ndirectives: [a, '  ']\n",
            "`directives[1].prompt` is empty",
        ),
        (
            "key: k\nsession: {system: s}\ndirectives: [a]\nbudget_usd: -1\n",
            "`budget_usd`",
        ),
        (
            "key: k\nsession: {system: s}\ndirectives: [a]\nbudget_tokens: 0\n",
            "`budget_tokens`",
        ),
    ];
    for (text, expected) in cases {
        let msg = parse_err(text);
        assert!(msg.starts_with("ci/batch.yaml: "), "{msg}");
        assert!(msg.contains(expected), "{text:?}: {msg}");
    }
}

#[test]
fn unreadable_files_are_named_by_key() {
    let msg = parse_err("key: k\nsession: {system_file: nope.md}\ndirectives: [a]\n");
    assert!(
        msg.starts_with("ci/batch.yaml: `session.system_file`: cannot read system file"),
        "{msg}"
    );
    let msg = parse_err("key: k\nsession: {system: s, context_files: [x.md]}\ndirectives: [a]\n");
    assert!(msg.contains("`session.context_files[0]`"), "{msg}");
    let err = BatchFile::load(Path::new("/nonexistent/batch.yaml")).map(|_| ());
    assert!(
        matches!(&err, Err(CliError::InvalidInput(m)) if m.starts_with("cannot read batch file /nonexistent/batch.yaml")),
        "{err:?}"
    );
}

#[test]
fn limits_come_from_the_batch_and_from_each_directive() -> anyhow::Result<()> {
    let text = "key: k
session: s1
directives:
  - description: slow one
    prompt: Read everything.
    timeout: 1h30m
    max_turns: 80
    timeout_excludes_throttle: false
  - Quick look
timeout: 10m
idle_timeout: 2m
max_turns: 30
max_output_tokens: 50000
timeout_excludes_throttle: true
";
    let file = BatchFile::parse(Path::new("b.yaml"), text, Path::new("/nonexistent"))?;
    assert_eq!(
        file.fork.limits,
        Some(Limits {
            timeout_ms: 600_000,
            idle_timeout_ms: 120_000,
            max_turns: 30,
            max_output_tokens: 50_000,
            timeout_excludes_throttle: Some(true),
        })
    );
    // A directive's own limits, the rest 0: the batch's.
    assert_eq!(
        file.fork.directives[0].limits,
        Some(Limits {
            timeout_ms: 5_400_000,
            max_turns: 80,
            timeout_excludes_throttle: Some(false),
            ..Limits::default()
        })
    );
    assert_eq!(file.fork.directives[0].description, "slow one");
    // A plain string has none of its own.
    assert_eq!(file.fork.directives[1].limits, None);

    // No limit anywhere: none is sent.
    let file = BatchFile::parse(
        Path::new("b.yaml"),
        "key: k\nsession: s1\ndirectives: [a, {prompt: b}]\n",
        Path::new("/nonexistent"),
    )?;
    assert_eq!(file.fork.limits, None);
    assert!(file.fork.directives.iter().all(|d| d.limits.is_none()));
    Ok(())
}

#[test]
fn a_zero_limit_is_refused_by_key() {
    let cases = [
        (
            "timeout: 0s\n",
            "ci/batch.yaml: `timeout` must be more than 0",
        ),
        (
            "idle_timeout: 0s\n",
            "ci/batch.yaml: `idle_timeout` must be more than 0",
        ),
        (
            "max_turns: 0\n",
            "ci/batch.yaml: `max_turns` must be more than 0",
        ),
        (
            "max_output_tokens: 0\n",
            "ci/batch.yaml: `max_output_tokens` must be more than 0",
        ),
        (
            "directives: [a, {prompt: b, timeout: 0s}]\n",
            "ci/batch.yaml: `directives[1].timeout` must be more than 0",
        ),
        (
            "directives: [{prompt: b, max_turns: 0}]\n",
            "ci/batch.yaml: `directives[0].max_turns` must be more than 0",
        ),
    ];
    for (tail, expected) in cases {
        let text = if tail.starts_with("directives") {
            format!("key: k\nsession: s1\n{tail}")
        } else {
            format!("key: k\nsession: s1\ndirectives: [a]\n{tail}")
        };
        let msg = parse_err(&text);
        assert!(msg.starts_with(expected), "{text:?}: {msg}");
        assert!(msg.ends_with("(leave it out for no limit)"), "{msg}");
    }
}

#[test]
fn a_malformed_limit_is_named_with_its_line() {
    let msg = parse_err("key: k\nsession: s1\ndirectives: [a]\ntimeout: ten minutes\n");
    assert!(msg.starts_with("ci/batch.yaml:4:"), "{msg}");
    assert!(
        msg.contains("`ten minutes` is not a duration such as 90s, 10m or 1h30m"),
        "{msg}"
    );
    assert!(msg.ends_with("(near `timeout: ten minutes`)"), "{msg}");
    let msg =
        parse_err("key: k\nsession: s1\ndirectives:\n  - prompt: p\n    idle_timeout: soon\n");
    assert!(msg.starts_with("ci/batch.yaml:5:"), "{msg}");
    assert!(msg.contains("`soon` is not a duration"), "{msg}");
    let msg = parse_err("key: k\nsession: s1\ndirectives: [a]\nmax_turns: many\n");
    assert!(msg.starts_with("ci/batch.yaml:4:"), "{msg}");
    // Unknown keys are still refused, beside the limits.
    let msg = parse_err("key: k\nsession: s1\ndirectives: [a]\ntimeout_ms: 5\n");
    assert!(msg.contains("unknown field `timeout_ms`"), "{msg}");
    let msg = parse_err("key: k\nsession: s1\ndirectives:\n  - {prompt: p, max_turn: 3}\n");
    assert!(msg.contains("unknown field `max_turn`"), "{msg}");
}
