//! The structured report a fork child ends with: Scope / Result / Key files / Files changed /
//! Issues. The parser is tolerant: sections may be missing, reordered, written as `Scope:`,
//! `**Scope:**` or `## Scope`, and lists may be bullets or comma-separated.

use serde::{Deserialize, Serialize};

/// A child's final report, parsed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    pub scope: String,
    pub result: String,
    pub key_files: Vec<String>,
    pub files_changed: Vec<String>,
    pub issues: String,
    /// The JSON object a child's final reply held under an output schema, valid against it.
    /// forkd's own facts (status, usage, files changed) stay beside it, never inside.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structured: Option<serde_json::Value>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Section {
    Scope,
    Result,
    KeyFiles,
    FilesChanged,
    Issues,
}

impl Section {
    fn from_heading(name: &str) -> Option<Self> {
        match name.trim().to_ascii_lowercase().as_str() {
            "scope" => Some(Section::Scope),
            "result" | "results" => Some(Section::Result),
            "key files" | "key_files" => Some(Section::KeyFiles),
            "files changed" | "files_changed" | "changed files" => Some(Section::FilesChanged),
            "issues" | "issue" => Some(Section::Issues),
            _ => None,
        }
    }
}

/// Recognises a heading line; returns the section and the text after the heading on that line.
fn heading(line: &str) -> Option<(Section, &str)> {
    let stripped = line.trim().trim_start_matches('#').trim_start();
    let stripped = stripped.strip_prefix("**").unwrap_or(stripped);
    let (name, rest) = match stripped.split_once(':') {
        Some((name, rest)) => (name, rest),
        // `## Scope` with nothing after it.
        None if line.trim_start().starts_with('#') => (stripped, ""),
        None => return None,
    };
    let name = name.trim_end_matches('*');
    let section = Section::from_heading(name)?;
    Some((section, rest.trim_start_matches('*').trim()))
}

fn list_items(text: &str) -> Vec<String> {
    let mut items = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        let line = line
            .strip_prefix("- ")
            .or_else(|| line.strip_prefix("* "))
            .unwrap_or(line)
            .trim();
        for part in line.split(',') {
            let item = part.trim().trim_matches('`').trim();
            let lower = item.to_ascii_lowercase();
            if item.is_empty() || matches!(lower.as_str(), "none" | "n/a" | "-" | "(none)") {
                continue;
            }
            items.push(item.to_owned());
        }
    }
    items
}

impl Report {
    /// Parses a report out of a child's final text. Text without any heading becomes the Result.
    pub fn parse(text: &str) -> Report {
        let mut sections: Vec<(Section, String)> = Vec::new();
        for line in text.lines() {
            if let Some((section, rest)) = heading(line) {
                sections.push((section, rest.to_owned()));
            } else if let Some((_, body)) = sections.last_mut() {
                body.push('\n');
                body.push_str(line);
            }
        }
        if sections.is_empty() {
            return Report {
                result: text.trim().to_owned(),
                ..Report::default()
            };
        }
        let mut report = Report::default();
        for (section, body) in sections {
            let body = body.trim();
            match section {
                Section::Scope => report.scope = body.to_owned(),
                Section::Result => report.result = body.to_owned(),
                Section::KeyFiles => report.key_files = list_items(body),
                Section::FilesChanged => report.files_changed = list_items(body),
                Section::Issues => report.issues = body.to_owned(),
            }
        }
        report
    }

    /// The canonical text form, as forkd's boilerplate asks children to write it.
    pub fn to_text(&self) -> String {
        let list = |items: &[String]| {
            if items.is_empty() {
                "none".to_owned()
            } else {
                items.join(", ")
            }
        };
        let or_none = |s: &str| {
            if s.is_empty() {
                "none".to_owned()
            } else {
                s.to_owned()
            }
        };
        format!(
            "Scope: {}\nResult: {}\nKey files: {}\nFiles changed: {}\nIssues: {}",
            or_none(&self.scope),
            or_none(&self.result),
            list(&self.key_files),
            list(&self.files_changed),
            or_none(&self.issues),
        )
    }

    /// A one-line summary: the first line of the Result.
    pub fn summary(&self) -> String {
        let line = self.result.lines().next().unwrap_or("").trim();
        let mut out: String = line.chars().take(200).collect();
        if line.chars().count() > 200 {
            out.push('…');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str, expect: Report) {
        assert_eq!(Report::parse(text), expect);
    }

    #[test]
    fn plain_sections() {
        check(
            "Scope: the parser\nResult: done\nit works\nKey files: a.rs, b.rs\nFiles changed:\n- c.rs\n- d.rs\nIssues: none",
            Report {
                scope: "the parser".into(),
                result: "done\nit works".into(),
                key_files: vec!["a.rs".into(), "b.rs".into()],
                files_changed: vec!["c.rs".into(), "d.rs".into()],
                issues: "none".into(),
                structured: None,
            },
        );
    }

    #[test]
    fn markdown_headings_missing_sections_and_noise_before() {
        check(
            "Here you go.\n## Result\nAll green.\n**Files changed:** `x.rs`\n",
            Report {
                result: "All green.".into(),
                files_changed: vec!["x.rs".into()],
                ..Report::default()
            },
        );
    }

    #[test]
    fn text_without_headings_is_the_result() {
        check(
            "  just prose  ",
            Report {
                result: "just prose".into(),
                ..Report::default()
            },
        );
    }

    #[test]
    fn canonical_text_parses_back() {
        let r = Report {
            scope: "s".into(),
            result: "r".into(),
            key_files: vec!["k".into()],
            files_changed: vec![],
            issues: "i".into(),
            structured: None,
        };
        assert_eq!(Report::parse(&r.to_text()), r);
    }
}
