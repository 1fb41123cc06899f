//! `forkctl run BATCH.yaml`: against the real daemon (idempotent re-runs, a failing child, a key
//! reused with other directives, YAML errors) and against the fake (what reaches the wire, and
//! the shapes of the output).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use forkd_proto::v1::NotificationStatus;
use forkd_test_support::{TestDaemon, spawn_daemon};
use serde_json::{Value, json};
use support::{FakeDaemon, Script, TOKEN, notification};

async fn forkctl(daemon: &TestDaemon, args: &[&str]) -> Output {
    let command = tokio::process::Command::new(env!("CARGO_BIN_EXE_forkctl"))
        .arg("--addr")
        .arg(daemon.addr())
        .args(args)
        .env_remove("FORKD_ADDR")
        .env_remove("FORKD_TOKEN")
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(Duration::from_secs(60), command)
        .await
        .expect("forkctl hung")
        .unwrap()
}

/// `forkctl run BATCH --junit JUNIT`.
async fn run_with_junit(daemon: &TestDaemon, batch: &Path, junit: &Path) -> Output {
    let args = [
        "run",
        batch.to_str().unwrap(),
        "--junit",
        junit.to_str().unwrap(),
    ];
    forkctl(daemon, &args).await
}

fn json_lines(stdout: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A directory with a system prompt, a context file and `batch.yaml` listing `directives`.
fn batch_dir(key: &str, directives: &[&str]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("system.md"), "You are a careful reviewer.").unwrap();
    std::fs::write(
        dir.path().join("context.md"),
        "forkd forks agents. ".repeat(300),
    )
    .unwrap();
    let path = write_batch(dir.path(), key, directives);
    (dir, path)
}

fn write_batch(dir: &Path, key: &str, directives: &[&str]) -> PathBuf {
    let mut yaml = format!(
        "key: {key}\nsession:\n  system_file: system.md\n  context_files: [context.md]\n  \
         permission_mode: dontAsk\ndirectives:\n"
    );
    for (i, prompt) in directives.iter().enumerate() {
        let prompt = serde_json::to_string(prompt).unwrap();
        yaml.push_str(&format!(
            "  - description: part {}\n    prompt: {prompt}\n",
            i + 1
        ));
    }
    let path = dir.join("batch.yaml");
    std::fs::write(&path, yaml).unwrap();
    path
}

/// The `<testcase>` elements of a JUnit file, parsed (so the file must be well-formed XML) as
/// (name, classname, failure text, failure type).
fn junit_cases(path: &Path) -> Vec<(String, String, Option<String>, Option<String>)> {
    let xml = std::fs::read_to_string(path).unwrap();
    let doc = roxmltree::Document::parse(&xml).unwrap_or_else(|e| panic!("{e}: {xml}"));
    assert_eq!(doc.root_element().tag_name().name(), "testsuites");
    doc.descendants()
        .filter(|n| n.has_tag_name("testcase"))
        .map(|case| {
            let failure = case.children().find(|n| n.has_tag_name("failure"));
            (
                case.attribute("name").unwrap().to_owned(),
                case.attribute("classname").unwrap().to_owned(),
                failure.map(|f| f.text().unwrap_or_default().to_owned()),
                failure.and_then(|f| f.attribute("type").map(str::to_owned)),
            )
        })
        .collect()
}

/// Each case's name and failure type, in order.
fn junit_failure_types(path: &Path) -> Vec<(String, Option<String>)> {
    junit_cases(path)
        .into_iter()
        .map(|(name, _, _, failure)| (name, failure))
        .collect()
}

#[tokio::test]
async fn running_a_file_twice_attaches_to_the_same_batch() {
    let daemon = spawn_daemon().await.unwrap();
    let (dir, batch) = batch_dir("twice", &["one", "two", "three"]);
    let junit = dir.path().join("out.xml");
    let args = [
        "--json",
        "run",
        batch.to_str().unwrap(),
        "--wait",
        "--junit",
        junit.to_str().unwrap(),
    ];

    let mut seen = Vec::new();
    for _ in 0..2 {
        let out = forkctl(&daemon, &args).await;
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let lines = json_lines(&out.stdout);
        let ids = &lines[0];
        assert_eq!(ids["agent_ids"].as_array().unwrap().len(), 3, "{ids}");
        let notifications = &lines[1..lines.len() - 1];
        assert_eq!(notifications.len(), 3);
        assert!(notifications.iter().all(|n| n["status"] == "completed"));
        let summary = lines.last().unwrap();
        assert_eq!(summary["batch_id"], ids["batch_id"]);
        assert_eq!(
            (
                &summary["children"],
                &summary["completed"],
                &summary["failed"]
            ),
            (&json!(3), &json!(3), &json!(0))
        );

        let cases = junit_cases(&junit);
        assert_eq!(cases.len(), 3);
        for (i, (name, classname, failure, _)) in cases.iter().enumerate() {
            assert_eq!(name, &format!("part {}", i + 1));
            assert_eq!(classname, ids["batch_id"].as_str().unwrap());
            assert_eq!(failure, &None);
        }
        seen.push(ids.clone());
        std::fs::remove_file(&junit).unwrap();
    }
    assert_eq!(seen[0], seen[1]);

    // One session, one batch: three children, not six.
    let sid = seen[0]["session_id"].as_str().unwrap();
    let out = forkctl(&daemon, &["--json", "ps", "-a", "--session", sid]).await;
    assert_eq!(json_lines(&out.stdout).len(), 3);
}

#[tokio::test]
async fn a_failing_child_fails_the_run_and_its_case() {
    let daemon = spawn_daemon().await.unwrap();
    let (dir, batch) = batch_dir("one-fails", &["fine", "Break it.\n@sim fail 400"]);
    let junit = dir.path().join("out.xml");
    let out = run_with_junit(&daemon, &batch, &junit).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    // Not a terminal: no progress bar, but the notifications and the summary table.
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("#  CHILD"), "{stdout}");
    assert!(
        stdout.contains("2 children, 1 completed, 1 failed, 0 killed"),
        "{stdout}"
    );

    let cases = junit_cases(&junit);
    assert_eq!(cases.len(), 2);
    assert_eq!((cases[0].0.as_str(), &cases[0].2), ("part 1", &None));
    assert_eq!(cases[1].0, "part 2");
    let failure = cases[1]
        .2
        .as_deref()
        .expect("the failed child's case fails");
    assert!(failure.contains("status: failed"), "{failure}");
}

#[tokio::test]
async fn the_same_key_with_other_directives_is_refused() {
    let daemon = spawn_daemon().await.unwrap();
    let (dir, batch) = batch_dir("reused", &["one", "two"]);
    let out = forkctl(&daemon, &["run", batch.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    write_batch(dir.path(), "reused", &["one", "something else"]);
    let out = forkctl(&daemon, &["run", batch.to_str().unwrap()]).await;
    assert_ne!(out.status.code(), Some(0));
    let err = stderr(&out);
    assert!(err.contains("FAILED_PRECONDITION"), "{err}");
    assert!(err.contains("batch.yaml: cannot fork the batch"), "{err}");
    assert!(err.contains("`reused/batch`"), "{err}");
    assert!(err.contains("change `key`"), "{err}");
}

#[tokio::test]
async fn yaml_errors_name_the_file_and_the_key() {
    let daemon = spawn_daemon().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broken.yaml");
    std::fs::write(
        &path,
        "key: k\nsession:\n  system: Be brief.\n  modle: sim\ndirectives: [one]\n",
    )
    .unwrap();
    let out = forkctl(&daemon, &["run", path.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let err = stderr(&out);
    let expected = format!("forkctl: {}:4:3: unknown field `modle`", path.display());
    assert!(err.starts_with(&expected), "{err}");
    assert!(out.stdout.is_empty());
    // The file is read before forkctl connects: without a daemon the error is the same.
    let nowhere = dir.path().join("no-daemon.sock");
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_forkctl"))
        .arg("--addr")
        .arg(format!("unix://{}", nowhere.display()))
        .args(["run", path.to_str().unwrap()])
        .env_remove("FORKD_TOKEN")
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(stderr(&out).starts_with(&expected), "{}", stderr(&out));

    std::fs::write(&path, "key: k\nsession: {system: s}\ndirectives: []\n").unwrap();
    let out = forkctl(&daemon, &["run", path.to_str().unwrap(), "--wait"]).await;
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("broken.yaml: `directives`"),
        "{}",
        stderr(&out)
    );

    // Nothing reached the daemon.
    let out = forkctl(&daemon, &["--json", "session", "list"]).await;
    assert!(json_lines(&out.stdout).is_empty());
}

#[test]
fn the_keys_budgets_and_files_reach_the_wire() -> anyhow::Result<()> {
    let daemon = FakeDaemon::start(Script::default())?;
    // The fake's own temporary directory holds the batch file too.
    let dir = &daemon.dir;
    std::fs::create_dir(dir.path().join("ci"))?;
    std::fs::write(dir.path().join("ci/system.md"), "Be brief.")?;
    let yaml = "key: nightly\nsession:\n  system_file: system.md\n  model: sim\n  \
                allow: ['Bash(cargo test:*)']\ndirectives:\n  - Check the build\n  \
                - {description: docs, prompt: Check the docs}\nwarmup_gating: false\n\
                budget_usd: 1.5\nbudget_tokens: 5000\n";
    std::fs::write(dir.path().join("ci/batch.yaml"), yaml)?;
    let path = dir.path().join("ci/batch.yaml").display().to_string();
    let run = support::forkctl(&daemon.addr(), Some(TOKEN), &["--json", "run", &path])?;
    assert_eq!(run.code, Some(0), "{run:?}");
    let lines: Vec<Value> = run
        .stdout
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    assert_eq!(
        lines,
        [json!({"session_id": "S1", "batch_id": "B1", "agent_ids": ["A1", "A2"]})]
    );

    let recorded = daemon.recorded()?;
    let create = &recorded.create[0];
    assert_eq!(create.idempotency_key, "nightly/session");
    assert_eq!(create.system_prompt, "Be brief.");
    assert_eq!(create.model, "sim");
    assert_eq!(create.allow_rules, ["Bash(cargo test:*)"]);
    assert_eq!(
        Path::new(&create.workspace),
        std::fs::canonicalize(dir.path().join("ci"))?
    );
    let fork = &recorded.fork[0];
    assert_eq!(fork.session_id, "S1");
    assert_eq!(fork.idempotency_key, "nightly/batch");
    assert_eq!(
        (fork.budget_usd, fork.budget_tokens, fork.warmup_gating),
        (1.5, 5000, Some(false))
    );
    let descriptions: Vec<&str> = fork
        .directives
        .iter()
        .map(|d| d.description.as_str())
        .collect();
    assert_eq!(descriptions, ["Check the build", "docs"]);
    // Without --wait nothing is followed.
    assert!(recorded.subscribe.is_empty());
    Ok(())
}

#[test]
fn wait_json_prints_notifications_then_the_summary() -> anyhow::Result<()> {
    let notifications = vec![
        notification(1, "A2", NotificationStatus::Killed),
        notification(2, "OTHER", NotificationStatus::Completed),
        notification(3, "A1", NotificationStatus::Completed),
    ];
    let daemon = FakeDaemon::start(Script {
        notifications,
        ..Default::default()
    })?;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("batch.yaml");
    std::fs::write(
        &path,
        "key: k\nsession: {system: s}\ndirectives: [one, two]\n",
    )?;
    let junit = dir.path().join("out.xml");
    let run = support::forkctl(
        &daemon.addr(),
        Some(TOKEN),
        &[
            "--json",
            "run",
            path.to_str().unwrap(),
            "--wait",
            "--junit",
            junit.to_str().unwrap(),
        ],
    )?;
    assert_eq!(run.code, Some(1), "{run:?}");
    // `--json` keeps stderr for errors: no "waiting" line, no progress bar.
    assert_eq!(run.stderr, "");
    let lines: Vec<Value> = run
        .stdout
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    assert_eq!(lines.len(), 4, "{lines:?}");
    assert_eq!(lines[1]["agent_id"], "A2");
    assert_eq!(lines[1]["status"], "killed");
    assert_eq!(lines[2]["agent_id"], "A1");
    assert_eq!(
        lines[3],
        json!({
            "batch_id": "B1", "children": 2, "completed": 1, "failed": 0, "killed": 1, "timed_out": 0,
            "cost_usd": 0.02, "cache_read_share": 1.0,
            "usage": {"input_tokens": 0, "cache_creation_input_tokens": 0,
                      "cache_read_input_tokens": 2000, "output_tokens": 0},
        })
    );
    // The fake lists no agents: the file's descriptions name the cases.
    let cases = junit_cases(&junit);
    assert_eq!(cases.len(), 2);
    assert_eq!((cases[0].0.as_str(), &cases[0].2), ("one", &None));
    assert_eq!(cases[1].0, "two");
    assert!(cases[1].2.as_deref().unwrap().contains("status: killed"));
    let subscribe = &daemon.recorded()?.subscribe[0];
    assert_eq!(
        (subscribe.since_seq, subscribe.batch_id.as_str()),
        (0, "B1")
    );
    Ok(())
}

#[test]
fn a_file_s_limits_reach_the_wire_and_a_timed_out_child_fails_the_run() -> anyhow::Result<()> {
    let limit = "timed out: no model output and no tool call started or finished for 2m \
                 (its idle_timeout)";
    let mut timed_out = notification(1, "A2", NotificationStatus::TimedOut);
    timed_out.report = Some(forkd_proto::v1::Report {
        result: "half done".into(),
        issues: limit.into(),
        ..Default::default()
    });
    let notifications = vec![
        timed_out,
        notification(2, "A1", NotificationStatus::Completed),
    ];
    let daemon = FakeDaemon::start(Script {
        notifications,
        ..Default::default()
    })?;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("batch.yaml");
    std::fs::write(
        &path,
        "key: k\nsession: {system: s}\ndirectives:\n  - one\n  - {prompt: two, max_turns: 5}\n\
         idle_timeout: 2m\ntimeout: 1h\n",
    )?;
    let junit = dir.path().join("out.xml");
    let args = [
        "--json",
        "run",
        path.to_str().unwrap(),
        "--junit",
        junit.to_str().unwrap(),
    ];
    let run = support::forkctl(&daemon.addr(), Some(TOKEN), &args)?;
    assert_eq!(run.code, Some(1), "{run:?}");
    let lines = json_lines(run.stdout.as_bytes());
    assert_eq!(lines[1]["status"], "timed_out");
    let summary = &lines[3];
    assert_eq!(
        (
            &summary["completed"],
            &summary["timed_out"],
            &summary["failed"]
        ),
        (&json!(1), &json!(1), &json!(0))
    );
    assert_eq!(
        junit_failure_types(&junit),
        [
            ("one".to_owned(), None),
            ("two".to_owned(), Some("timeout".to_owned()))
        ]
    );
    let xml = std::fs::read_to_string(&junit)?;
    assert!(xml.contains(&format!("message=\"{limit}\"")), "{xml}");

    let fork = &daemon.recorded()?.fork[0];
    let limits = fork.limits.unwrap_or_default();
    assert_eq!(
        (limits.timeout_ms, limits.idle_timeout_ms),
        (3_600_000, 120_000)
    );
    assert_eq!(fork.directives[0].limits, None);
    assert_eq!(fork.directives[1].limits.map(|l| l.max_turns), Some(5));
    Ok(())
}

/// A thousand children, as a CI job submits them: the summary lists only the child that did not
/// complete and the totals (`--all` would list every child), and the JUnit file has a case for
/// every child.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_children_get_a_compact_summary_and_a_full_junit_file() {
    let daemon = spawn_daemon().await.unwrap();
    let prompts: Vec<String> = (0..1000)
        .map(|i| match i {
            500 => "Break it.\n@sim fail 400".to_owned(),
            i => format!("Check item {i}."),
        })
        .collect();
    let refs: Vec<&str> = prompts.iter().map(String::as_str).collect();
    let (dir, batch) = batch_dir("thousand", &refs);
    let junit = dir.path().join("out.xml");
    let out = run_with_junit(&daemon, &batch, &junit).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("1000 children, 999 completed, 1 failed, 0 killed"),
        "{stdout}"
    );
    assert!(
        stdout.contains("999 completed children not listed"),
        "{stdout}"
    );
    assert!(
        stdout.lines().count() < 40,
        "{} lines",
        stdout.lines().count()
    );
    let cases = junit_cases(&junit);
    assert_eq!(cases.len(), 1000);
    assert_eq!(cases.iter().filter(|c| c.2.is_some()).count(), 1);
}

#[tokio::test]
async fn rerun_failed_reruns_exactly_the_failures_once_and_merges_the_junit() {
    let daemon = spawn_daemon().await.unwrap();
    // A scripted 400 fails a request once: the rerun of the same directive succeeds.
    let (dir, batch) = batch_dir(
        "flaky",
        &[
            "fine one",
            "Flaky A.\n@sim fail 400",
            "fine two",
            "Flaky B.\n@sim fail 400",
            "Flaky C.\n@sim fail 400",
        ],
    );
    let junit = dir.path().join("first.xml");
    let out = run_with_junit(&daemon, &batch, &junit).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let failed: Vec<String> = junit_failure_types(&junit)
        .into_iter()
        .filter(|(_, failure)| failure.is_some())
        .map(|(name, _)| name)
        .collect();
    assert_eq!(failed, ["part 2", "part 4", "part 5"]);

    let merged = dir.path().join("merged.xml");
    let rerun = |junit: &Path| {
        let args = [
            "--json",
            "run",
            batch.to_str().unwrap(),
            "--rerun-failed",
            "--junit",
            junit.to_str().unwrap(),
        ]
        .map(str::to_owned);
        let daemon = &daemon;
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            forkctl(daemon, &args).await
        }
    };
    let out = rerun(&merged).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let lines = json_lines(&out.stdout);
    let submitted = &lines[0];
    assert_eq!(submitted["agent_ids"].as_array().unwrap().len(), 3);
    let summary = lines.last().unwrap();
    assert_eq!(
        (&summary["children"], &summary["completed"]),
        (&json!(5), &json!(5))
    );
    assert_eq!(summary["batches"].as_array().unwrap().len(), 2);
    // The whole file: the earlier successes and the rerun's, in the file's order.
    let cases = junit_failure_types(&merged);
    let names: Vec<&str> = cases.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["part 1", "part 2", "part 3", "part 4", "part 5"]);
    assert!(cases.iter().all(|(_, f)| f.is_none()), "{cases:?}");

    // Again: the same rerun batch, nothing forked.
    let again = dir.path().join("again.xml");
    let out = rerun(&again).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        json_lines(&out.stdout)[0]["batch_id"],
        submitted["batch_id"]
    );
    assert_eq!(junit_failure_types(&again), cases);
    let human = forkctl(&daemon, &["run", batch.to_str().unwrap(), "--rerun-failed"]).await;
    assert!(
        stderr(&human).contains("nothing to rerun"),
        "{}",
        stderr(&human)
    );
}

#[tokio::test]
async fn a_schema_batch_reports_objects_and_fail_when_turns_a_verdict_red() {
    let daemon = spawn_daemon().await.unwrap();
    let (dir, batch) = batch_dir(
        "verdicts",
        &[
            "Review A.\n@sim json {\"verdict\":\"pass\",\"findings\":[]}",
            "Review B.\n@sim json {\"verdict\":\"fail\",\"findings\":[\"x.rs:3\"]}",
        ],
    );
    let mut yaml = std::fs::read_to_string(&batch).unwrap();
    yaml.push_str(
        "output_schema:\n  type: object\n  required: [verdict, findings]\n  properties:\n    \
         verdict: {enum: [pass, fail]}\n    findings: {type: array, items: {type: string}}\n",
    );
    std::fs::write(&batch, yaml).unwrap();
    let junit = dir.path().join("out.xml");
    let args = [
        "--json",
        "run",
        batch.to_str().unwrap(),
        "--junit",
        junit.to_str().unwrap(),
        "--junit-fail-when",
        "$.verdict=fail",
    ];
    let out = forkctl(&daemon, &args).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let lines = json_lines(&out.stdout);
    let structured: Vec<&Value> = lines
        .iter()
        .filter(|l| l.get("seq").is_some())
        .map(|n| &n["report"]["structured"])
        .collect();
    assert_eq!(structured.len(), 2);
    assert!(
        structured.contains(&&json!({"verdict": "fail", "findings": ["x.rs:3"]})),
        "{lines:?}"
    );
    let summary = lines.last().unwrap();
    assert_eq!(
        (&summary["completed"], &summary["failed_when"]),
        (&json!(2), &json!(1))
    );
    assert_eq!(
        junit_failure_types(&junit),
        [
            ("part 1".to_owned(), None),
            ("part 2".to_owned(), Some("fail-when".to_owned()))
        ]
    );
}
