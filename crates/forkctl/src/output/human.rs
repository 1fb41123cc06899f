//! Human-readable output: comfy-table tables and one-line summaries, with grouped token counts.

use comfy_table::presets::NOTHING;
use comfy_table::{Cell, CellAlignment, Table};
use forkd_proto::v1::{
    Agent, EstimateForkCostResponse, GetCacheStatsResponse, Notification, NotificationStatus,
    Session, Usage,
};

use super::{agent_state_label, status_name, timed_out_reason};

/// `48500` → `48,500`: token counts are read at a glance, not digit by digit.
pub fn tokens(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Four decimals: a single child often costs a fraction of a cent.
pub fn usd(x: f64) -> String {
    format!("${x:.4}")
}

/// A share in 0..=1 as a percentage.
pub fn percent(share: f64) -> String {
    format!("{:.1}%", share * 100.0)
}

/// `in 312 · write 0 · read 48,500 · out 210`
pub fn usage_line(usage: Option<&Usage>) -> String {
    let u = usage.copied().unwrap_or_default();
    format!(
        "in {} · write {} · read {} · out {}",
        tokens(u.input_tokens),
        tokens(u.cache_creation_input_tokens),
        tokens(u.cache_read_input_tokens),
        tokens(u.output_tokens),
    )
}

/// The first line of a possibly multi-line text, cut to `max` characters.
pub fn first_line(text: &str, max: usize) -> String {
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("");
    if line.chars().count() <= max {
        return line.to_owned();
    }
    let mut cut: String = line.chars().take(max.saturating_sub(1)).collect();
    cut.truncate(cut.trim_end().len());
    cut.push('…');
    cut
}

/// Where a timed-out child's issues name the tool calls its limit cut off.
const CUT_OFF: &str = "; tool calls cut off (killed): ";

/// One notification on one line: seq, agent, status, summary, tokens, cost; a timed-out
/// child's line also names the limit that stopped it.
pub fn notification_line(n: &Notification) -> String {
    let mut summary = first_line(&n.summary, 80);
    if n.status() == NotificationStatus::TimedOut
        && let Some(issues) = n.report.as_ref().map(|r| r.issues.as_str())
    {
        let mut notes = Vec::new();
        // The daemon's summary names the limit itself ("Timed out: …").
        if let Some(reason) = timed_out_reason(issues)
            && !summary.starts_with("Timed out")
        {
            notes.push(reason.split(CUT_OFF).next().unwrap_or(reason).to_owned());
        }
        if let Some((_, calls)) = issues.split_once(CUT_OFF) {
            notes.push(format!("killed: {}", first_line(calls, 80)));
        }
        for note in notes {
            summary = if summary.is_empty() {
                format!("[{note}]")
            } else {
                format!("{summary} [{note}]")
            };
        }
    }
    format!(
        "#{} {} {:<9} {}  ({}; {})",
        n.seq,
        n.agent_id,
        status_name(n.status()),
        summary,
        usage_line(n.usage.as_ref()),
        usd(n.cost_usd),
    )
}

pub(crate) fn table(header: Option<&[&str]>) -> Table {
    let mut table = Table::new();
    table.load_style(NOTHING);
    if let Some(header) = header {
        table.set_header(header.iter().copied());
    }
    table
}

/// Columns two spaces apart, no borders, no trailing blanks: output that reads like `ps`.
pub(crate) fn finish(mut table: Table) -> String {
    for column in table.column_iter_mut() {
        column.set_padding((0, 2));
    }
    table.trim_fmt()
}

pub(crate) fn right_align(table: &mut Table, columns: std::ops::Range<usize>) {
    for i in columns {
        if let Some(column) = table.column_mut(i) {
            column.set_cell_alignment(CellAlignment::Right);
        }
    }
}

/// `ps`: full ids (scripts copy them), then state, the daemon running the agent, the four
/// token counts, read share and cost.
pub fn agents_table(agents: &[Agent]) -> String {
    let mut header = vec![
        "AGENT",
        "KIND",
        "STATE",
        "DAEMON",
        "IN",
        "WRITE",
        "READ",
        "OUT",
        "READ %",
        "COST",
        "DESCRIPTION",
    ];
    // Isolated children's copies, when the listing has any.
    let copies = agents.iter().any(|a| !a.changes.is_empty());
    if copies {
        header.push("CHANGES");
    }
    let mut t = table(Some(&header));
    for a in agents {
        let u = a.usage.unwrap_or_default();
        let mut row = vec![
            a.agent_id.clone(),
            a.kind.clone(),
            agent_state_label(a).to_owned(),
            short_daemon(&a.daemon).to_owned(),
            tokens(u.input_tokens),
            tokens(u.cache_creation_input_tokens),
            tokens(u.cache_read_input_tokens),
            tokens(u.output_tokens),
            percent(a.cache_read_share),
            usd(a.cost_usd),
            first_line(&a.description, 40),
        ];
        if copies {
            row.push(a.changes.clone());
        }
        t.add_row(row);
    }
    right_align(&mut t, 4..10);
    finish(t)
}

/// A daemon id's last 12 hex digits: random, where its first ones are the time it started (two
/// daemons started together share them). `-` for none.
fn short_daemon(id: &str) -> &str {
    match id.len() {
        0 => "-",
        n => &id[n.saturating_sub(12)..],
    }
}

/// `session list`.
pub fn sessions_table(sessions: &[Session]) -> String {
    let header = ["SESSION", "MODEL", "MESSAGES", "CREATED", "WORKSPACE"];
    let mut t = table(Some(&header));
    for s in sessions {
        t.add_row(vec![
            s.session_id.clone(),
            s.model.clone(),
            s.message_count.to_string(),
            s.created_at.map(|c| c.to_string()).unwrap_or_default(),
            s.workspace.clone(),
        ]);
    }
    right_align(&mut t, 2..3);
    finish(t)
}

fn key_values(rows: Vec<(&str, String)>) -> String {
    let mut t = table(None);
    for (key, value) in rows {
        t.add_row(vec![Cell::new(key), Cell::new(value)]);
    }
    finish(t)
}

/// A session's sandbox mode and grants: `workspace-write, network allowed, Unix sockets allowed`.
fn sandbox_summary(s: &Session) -> String {
    let mut parts = vec![s.sandbox.clone()];
    if s.allow_network {
        parts.push("network allowed".to_owned());
    }
    if s.unix_sockets {
        parts.push("Unix sockets allowed".to_owned());
    }
    parts.join(", ")
}

/// `session get`.
pub fn session_table(s: &Session) -> String {
    key_values(
        vec![
            ("session", s.session_id.clone()),
            ("model", s.model.clone()),
            ("workspace", s.workspace.clone()),
            ("permission mode", s.permission_mode.clone()),
            ("sandbox", sandbox_summary(s)),
            (
                "sandbox layers",
                if s.sandbox_layers.is_empty() {
                    "unknown (an older daemon)".to_owned()
                } else {
                    s.sandbox_layers.clone()
                },
            ),
            (
                "mcp servers",
                if s.mcp_servers.is_empty() {
                    "none".to_owned()
                } else {
                    s.mcp_servers.join(", ")
                },
            ),
            (
                "own hooks",
                if s.hook_events.is_empty() {
                    "none".to_owned()
                } else {
                    s.hook_events.join(", ")
                },
            ),
            ("coordinator", s.coordinator.to_string()),
            ("interactive", s.interactive.to_string()),
            (
                "thinking budget",
                tokens(u64::from(s.thinking_budget_tokens)),
            ),
            ("tools", s.tool_names.join(", ")),
            ("system prompt bytes", tokens(s.system_prompt_bytes)),
            ("messages", s.message_count.to_string()),
            ("turns", turns_summary(s)),
            (
                "created",
                s.created_at.map(|c| c.to_string()).unwrap_or_default(),
            ),
        ]
        .into_iter()
        .chain((!s.branch_of.is_empty()).then(|| {
            (
                "branch of",
                format!(
                    "{} after turn {} (its first {} messages; files not rewound)",
                    s.branch_of, s.branch_turn, s.branch_point
                ),
            )
        }))
        .chain((!s.branches.is_empty()).then(|| ("branches", s.branches.join(", "))))
        .chain(s.upload_origin.as_ref().map(|o| {
            let commit = if o.git_commit.is_empty() {
                String::new()
            } else {
                format!(", commit {}", o.git_commit)
            };
            (
                "uploaded",
                format!(
                    "{} files, {} bytes{commit} (upload {})",
                    o.files, o.bytes, o.upload_id
                ),
            )
        }))
        .collect(),
    )
}

/// How many turns, and where each one's message sits (`forkctl session branch --before SEQ`).
fn turns_summary(s: &Session) -> String {
    const SHOWN: usize = 20;
    if s.turn_seqs.is_empty() {
        return "none".to_owned();
    }
    let mut where_: Vec<String> = s
        .turn_seqs
        .iter()
        .enumerate()
        .take(SHOWN)
        .map(|(i, seq)| format!("{}@{seq}", i + 1))
        .collect();
    if s.turn_seqs.len() > SHOWN {
        where_.push(format!("… {} more", s.turn_seqs.len() - SHOWN));
    }
    let running = s.turn_seqs.len() as u32 > s.finished_turns;
    format!(
        "{}{} (turn@message: {})",
        s.turn_seqs.len(),
        if running { ", the last running" } else { "" },
        where_.join(" ")
    )
}

/// `stats`.
pub fn stats_table(s: &GetCacheStatsResponse) -> String {
    let u = s.usage.unwrap_or_default();
    key_values(vec![
        ("children", s.children.to_string()),
        ("requests", s.requests.to_string()),
        ("shared prefix tokens", tokens(s.shared_prefix_tokens)),
        ("input tokens (uncached)", tokens(u.input_tokens)),
        ("cache write tokens", tokens(u.cache_creation_input_tokens)),
        ("cache read tokens", tokens(u.cache_read_input_tokens)),
        ("output tokens", tokens(u.output_tokens)),
        ("cache-read share", percent(s.cache_read_share)),
        ("cost", usd(s.cost_usd)),
        ("as independent agents", usd(s.independent_cost_usd)),
        ("saving", percent(s.saving)),
    ])
}

/// `calc`: both costs, the saving, break-even N and the seed document's simplified figure.
pub fn estimate_table(e: &EstimateForkCostResponse, one_hour: bool) -> String {
    let break_even = match e.break_even_children {
        0 => "never at these sizes".to_owned(),
        1 => "1 child".to_owned(),
        n => format!("{n} children"),
    };
    let premium = if one_hour { "2×" } else { "1.25×" };
    let seed = format!(
        "{}  for comparison (ignores the {premium} write premium)",
        percent(e.seed_simplified_saving)
    );
    key_values(vec![
        ("model", e.model.clone()),
        ("independent agents", usd(e.independent_cost_usd)),
        ("fork batch", usd(e.fork_cost_usd)),
        ("saving", percent(e.saving)),
        ("forking pays from", break_even),
        ("seed's simplified saving", seed),
    ])
}

#[cfg(test)]
mod tests;
