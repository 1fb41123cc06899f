//! `run --junit FILE`: one test case per child, so CI systems show a batch like a test run.
//! quick-junit writes (and escapes) the XML.

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use forkd_proto::v1::NotificationStatus;
use quick_junit::{NonSuccessKind, Property, Report, TestCase, TestCaseStatus, TestSuite};

use super::summary::{Child, wall_seconds};
use crate::output::status_name;

/// The report: one suite named after the file's key, one case per child (name: its description
/// or index; classname: the batch id). A failed or killed child is a `<failure>` carrying its
/// report; a timed-out one is a `<failure type="timeout">` whose message names the limit that
/// stopped it; a completed one carries its report as `system-out`.
pub(crate) fn report(key: &str, session_id: &str, batch_id: &str, children: &[Child]) -> Report {
    let mut suite = TestSuite::new(key);
    suite.add_properties([
        Property::new("session_id", session_id),
        Property::new("batch_id", batch_id),
    ]);
    for child in children {
        let status = if child.passed() {
            TestCaseStatus::success()
        } else if let Some(rule) = &child.failed_when {
            let mut status = TestCaseStatus::non_success(NonSuccessKind::Failure);
            status
                .set_type("fail-when")
                .set_message(format!("its report matches --junit-fail-when {rule}"))
                .set_description(system_out(child));
            status
        } else if child.status == NotificationStatus::TimedOut {
            let mut status = TestCaseStatus::non_success(NonSuccessKind::Failure);
            let message = match child.timed_out_reason() {
                Some(reason) => reason.to_owned(),
                None if child.summary.trim().is_empty() => "child timed_out".to_owned(),
                None => format!("timed out: {}", child.summary),
            };
            status
                .set_type("timeout")
                .set_message(message)
                .set_description(child.report_text());
            status
        } else {
            let mut status = TestCaseStatus::non_success(NonSuccessKind::Failure);
            let message = if child.summary.trim().is_empty() {
                format!("child {}", status_name(child.status))
            } else {
                child.summary.clone()
            };
            status
                .set_type(status_name(child.status))
                .set_message(message)
                .set_description(child.report_text());
            status
        };
        let mut case = TestCase::new(child.name(), status);
        case.set_classname(batch_id);
        case.add_property(Property::new("agent_id", child.agent_id.as_str()));
        if let Some(time) = child
            .seconds()
            .and_then(|s| Duration::try_from_secs_f64(s).ok())
        {
            case.set_time(time);
        }
        if child.completed() {
            case.set_system_out(system_out(child));
        }
        suite.add_test_case(case);
    }
    if let Some(wall) = wall_seconds(children).and_then(|s| Duration::try_from_secs_f64(s).ok()) {
        suite.set_time(wall);
    }
    let mut report = Report::new("forkctl run");
    report.add_test_suite(suite);
    report
}

/// What a completed child's case carries: its structured report as JSON when an output schema
/// shaped it, else its report as text.
fn system_out(child: &Child) -> String {
    child
        .structured()
        .and_then(|object| serde_json::to_string_pretty(&object).ok())
        .unwrap_or_else(|| child.report_text())
}

/// Writes the report to `path` through a temporary file beside it, so a reader never sees half
/// of one.
pub(crate) fn write(path: &Path, report: &Report) -> anyhow::Result<()> {
    let xml = report
        .to_string()
        .context("cannot serialize the JUnit report")?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}.tmp", std::process::id()));
    let tmp = std::path::PathBuf::from(tmp);
    let written = std::fs::write(&tmp, xml).and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.with_context(|| format!("cannot write the JUnit report {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::run::summary::tests::child;

    #[test]
    fn one_case_per_child_and_failures_carry_the_report() -> anyhow::Result<()> {
        let mut killed = child(3, NotificationStatus::Killed);
        killed.description = String::new();
        killed.summary = String::new();
        killed.ended_at = None;
        let mut tricky = child(1, NotificationStatus::Completed);
        tricky.description = "quotes \" & <tags> and \u{1b}[31mansi".into();
        let children = [tricky, child(2, NotificationStatus::Failed), killed];
        let xml = report("nightly", "S", "B", &children).to_string()?;

        let doc = roxmltree::Document::parse(&xml)?;
        let suites = doc.root_element();
        assert_eq!(suites.tag_name().name(), "testsuites");
        assert_eq!(suites.attribute("tests"), Some("3"));
        assert_eq!(suites.attribute("failures"), Some("2"));
        let cases: Vec<_> = doc
            .descendants()
            .filter(|n| n.has_tag_name("testcase"))
            .collect();
        assert_eq!(cases.len(), 3);
        assert!(cases.iter().all(|c| c.attribute("classname") == Some("B")));
        assert!(
            cases[0]
                .attribute("name")
                .is_some_and(|n| n.starts_with("quotes \" & <tags>")),
            "{xml}"
        );
        assert_eq!(cases[0].attribute("time"), Some("1.500"));
        assert!(!cases[0].children().any(|n| n.has_tag_name("failure")));

        let failure = cases[1]
            .children()
            .find(|n| n.has_tag_name("failure"))
            .ok_or_else(|| anyhow::anyhow!("no failure in {xml}"))?;
        assert_eq!(failure.attribute("type"), Some("failed"));
        assert_eq!(failure.attribute("message"), Some("part 2 done"));
        let text = failure.text().unwrap_or_default();
        assert!(text.contains("issues: provider error 400"), "{xml}");

        assert_eq!(cases[2].attribute("name"), Some("child 3"));
        assert_eq!(cases[2].attribute("time"), None);
        let failure = cases[2].children().find(|n| n.has_tag_name("failure"));
        assert_eq!(
            failure.and_then(|f| f.attribute("message")),
            Some("child killed")
        );
        Ok(())
    }

    #[test]
    fn structured_reports_are_the_output_and_fail_when_rules_fail_cases() -> anyhow::Result<()> {
        let shaped = |index, verdict: &str| {
            let mut c = child(index, NotificationStatus::Completed);
            c.report = Some(forkd_proto::v1::Report {
                structured_json: format!(r#"{{"verdict":"{verdict}"}}"#),
                ..Default::default()
            });
            c
        };
        let mut failing = shaped(2, "fail");
        failing.failed_when = Some("$.verdict=fail".into());
        let xml = report("k", "S", "B", &[shaped(1, "pass"), failing]).to_string()?;
        let doc = roxmltree::Document::parse(&xml)?;
        assert_eq!(doc.root_element().attribute("failures"), Some("1"));
        let cases: Vec<_> = doc
            .descendants()
            .filter(|n| n.has_tag_name("testcase"))
            .collect();
        let out = cases[0]
            .children()
            .find(|n| n.has_tag_name("system-out"))
            .and_then(|n| n.text())
            .unwrap_or_default();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(out)?,
            serde_json::json!({"verdict": "pass"})
        );
        let failure = cases[1]
            .children()
            .find(|n| n.has_tag_name("failure"))
            .ok_or_else(|| anyhow::anyhow!("no failure in {xml}"))?;
        assert_eq!(failure.attribute("type"), Some("fail-when"));
        assert_eq!(
            failure.attribute("message"),
            Some("its report matches --junit-fail-when $.verdict=fail")
        );
        assert!(
            failure.text().unwrap_or_default().contains("\"fail\""),
            "{xml}"
        );
        Ok(())
    }

    #[test]
    fn a_timed_out_child_is_a_timeout_failure_naming_its_limit() -> anyhow::Result<()> {
        let limit = "timed out: its timeout of 2s (wall time since it started) ran out";
        let mut timed_out = child(2, NotificationStatus::TimedOut);
        timed_out.summary = "Read 3 of 5 files".into();
        timed_out.report = Some(forkd_proto::v1::Report {
            result: "partial".into(),
            issues: format!("{limit}\nThe fifth file was not read."),
            ..Default::default()
        });
        // The fake daemon lists no agents: the error is unknown, the report says it all.
        let mut from_error = child(3, NotificationStatus::TimedOut);
        from_error.report = None;
        from_error.error =
            "timed out: it wrote 100 output tokens or more (its max_output_tokens)".into();
        let mut silent = child(4, NotificationStatus::TimedOut);
        silent.report = None;
        silent.summary = String::new();
        let children = [
            child(1, NotificationStatus::Completed),
            timed_out,
            from_error,
            silent,
        ];
        let xml = report("k", "S", "B", &children).to_string()?;
        let doc = roxmltree::Document::parse(&xml)?;
        assert_eq!(doc.root_element().attribute("failures"), Some("3"));
        let failures: Vec<_> = doc
            .descendants()
            .filter(|n| n.has_tag_name("failure"))
            .collect();
        assert_eq!(failures.len(), 3, "{xml}");
        assert!(
            failures
                .iter()
                .all(|f| f.attribute("type") == Some("timeout")),
            "{xml}"
        );
        assert_eq!(failures[0].attribute("message"), Some(limit));
        let text = failures[0].text().unwrap_or_default();
        assert!(text.starts_with("status: timed_out\n"), "{xml}");
        assert!(text.contains("summary: Read 3 of 5 files"), "{xml}");
        assert!(text.contains("The fifth file was not read."), "{xml}");
        assert_eq!(
            failures[1].attribute("message"),
            Some("timed out: it wrote 100 output tokens or more (its max_output_tokens)")
        );
        assert_eq!(failures[2].attribute("message"), Some("child timed_out"));
        // No system-out: only a completed child's report is its output.
        let cases: Vec<_> = doc
            .descendants()
            .filter(|n| n.has_tag_name("testcase"))
            .collect();
        assert!(!cases[1].children().any(|n| n.has_tag_name("system-out")));
        Ok(())
    }

    #[test]
    fn the_file_is_written_whole() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("out.xml");
        std::fs::write(&path, "old")?;
        let report = report("k", "S", "B", &[child(1, NotificationStatus::Completed)]);
        write(&path, &report)?;
        let xml = std::fs::read_to_string(&path)?;
        roxmltree::Document::parse(&xml)?;
        assert!(xml.contains("<testcase name=\"part 1\""), "{xml}");
        let err = write(&dir.path().join("missing/out.xml"), &report).map_err(|e| e.to_string());
        assert!(
            err.as_ref()
                .is_err_and(|e| e.starts_with("cannot write the JUnit report")),
            "{err:?}"
        );
        Ok(())
    }
}
