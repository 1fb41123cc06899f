//! What a figure reports: Markdown tables for people, one JSON object for scripts, and checks
//! against the targets in docs/contracts.md (“Performance targets”).

use serde::Serialize;
use serde_json::Value;

/// One Markdown table.
#[derive(Debug, Clone, Serialize)]
pub struct Table {
    pub caption: String,
    pub headers: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(caption: impl Into<String>, headers: &[&str]) -> Self {
        Self {
            caption: caption.into(),
            headers: headers.iter().map(|h| (*h).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    fn markdown(&self) -> String {
        let mut out = String::new();
        if !self.caption.is_empty() {
            out.push_str(&format!("{}\n\n", self.caption));
        }
        out.push_str(&format!("| {} |\n", self.headers.join(" | ")));
        out.push_str(&format!(
            "|{}|\n",
            self.headers
                .iter()
                .map(|_| "---")
                .collect::<Vec<_>>()
                .join("|")
        ));
        for row in &self.rows {
            out.push_str(&format!("| {} |\n", row.join(" | ")));
        }
        out
    }
}

/// Whether a target is met.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Met,
    /// Missed, and by how much.
    Missed(String),
    /// The target cannot be judged under these conditions, and why.
    NotApplicable(String),
}

/// One measured figure against its target.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub figure: String,
    pub target: String,
    pub measured: String,
    pub verdict: Verdict,
}

impl Check {
    pub fn new(
        figure: impl Into<String>,
        target: impl Into<String>,
        measured: impl Into<String>,
        verdict: Verdict,
    ) -> Self {
        Self {
            figure: figure.into(),
            target: target.into(),
            measured: measured.into(),
            verdict,
        }
    }

    /// Met when `ok`, else missed by `by`.
    pub fn judge(
        figure: impl Into<String>,
        target: impl Into<String>,
        measured: impl Into<String>,
        ok: bool,
        by: impl FnOnce() -> String,
    ) -> Self {
        let verdict = if ok {
            Verdict::Met
        } else {
            Verdict::Missed(by())
        };
        Self::new(figure, target, measured, verdict)
    }
}

/// One figure's results.
#[derive(Debug, Clone, Serialize)]
pub struct Section {
    pub id: &'static str,
    pub title: String,
    /// What the figures are compared with.
    pub compared_with: String,
    pub tables: Vec<Table>,
    pub notes: Vec<String>,
    pub checks: Vec<Check>,
    /// The raw measurements.
    pub data: Value,
    pub seconds: f64,
}

impl Section {
    pub fn markdown(&self) -> String {
        let mut out = format!("### {}\n\n", self.title);
        out.push_str(&format!("Compared with: {}\n\n", self.compared_with));
        for t in &self.tables {
            out.push_str(&t.markdown());
            out.push('\n');
        }
        for n in &self.notes {
            out.push_str(&format!("- {n}\n"));
        }
        if !self.notes.is_empty() {
            out.push('\n');
        }
        out
    }
}

/// The checks of every figure as one table.
pub fn checks_markdown(sections: &[Section]) -> String {
    let mut t = Table::new(
        "",
        &[
            "figure",
            "target (docs/contracts.md)",
            "measured",
            "verdict",
        ],
    );
    for c in sections.iter().flat_map(|s| &s.checks) {
        t.row(vec![
            c.figure.clone(),
            c.target.clone(),
            c.measured.clone(),
            match &c.verdict {
                Verdict::Met => "met".into(),
                Verdict::Missed(by) => format!("**MISSED** by {by}"),
                Verdict::NotApplicable(why) => format!("n/a: {why}"),
            },
        ]);
    }
    t.markdown()
}
