//! How `forkctl top` looks, and what its keys do: the header with the totals, the tree as a
//! table, a footer with the keys and the connection's status. Renders into any ratatui backend,
//! so the tests draw into a `TestBackend`.

use ratatui::Frame;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style, Stylize as _};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Cell, Paragraph, Row as TableRow, Table};

use super::model::{Level, Row, Totals};
use crate::output::human::{first_line, percent, tokens, usage_line, usd};

/// What the keys changed, and what the connection last said.
#[derive(Debug, Default)]
pub(crate) struct ViewState {
    /// The first row shown.
    pub(crate) scroll: usize,
    /// How many rows the last frame had room for: a page for PgUp / PgDn.
    pub(crate) page: usize,
    /// A problem to show in the footer (the daemon went away, the stream closed).
    pub(crate) status: Option<String>,
}

/// What a key asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    Quit,
    Redraw,
    Nothing,
}

/// q, Esc and Ctrl-C quit; ↑/↓ and j/k scroll by a row, PgUp/PgDn by a page, Home/End (g/G) to
/// either end (the end is clamped when drawn).
pub(crate) fn on_key(key: KeyEvent, view: &mut ViewState) -> Action {
    if key.kind == KeyEventKind::Release {
        return Action::Nothing;
    }
    let page = view.page.max(1);
    let scroll = &mut view.scroll;
    match key.code {
        KeyCode::Char('c') if key.modifiers.contains(KeyModifiers::CONTROL) => Action::Quit,
        KeyCode::Char('q') | KeyCode::Esc => Action::Quit,
        KeyCode::Down | KeyCode::Char('j') => {
            *scroll = scroll.saturating_add(1);
            Action::Redraw
        }
        KeyCode::Up | KeyCode::Char('k') => {
            *scroll = scroll.saturating_sub(1);
            Action::Redraw
        }
        KeyCode::PageDown => {
            *scroll = scroll.saturating_add(page);
            Action::Redraw
        }
        KeyCode::PageUp => {
            *scroll = scroll.saturating_sub(page);
            Action::Redraw
        }
        KeyCode::Home | KeyCode::Char('g') => {
            *scroll = 0;
            Action::Redraw
        }
        KeyCode::End | KeyCode::Char('G') => {
            *scroll = usize::MAX;
            Action::Redraw
        }
        _ => Action::Nothing,
    }
}

const HEADER: [&str; 8] = [
    "NAME", "STATE", "IN", "WRITE", "READ", "OUT", "READ %", "COST",
];

/// Draws the whole screen; clamps the scroll to the rows there are.
pub(crate) fn render(frame: &mut Frame, rows: &[Row], totals: &Totals, view: &mut ViewState) {
    let [header, table, footer] = Layout::vertical([
        Constraint::Length(2),
        Constraint::Min(1),
        Constraint::Length(1),
    ])
    .areas(frame.area());
    frame.render_widget(Paragraph::new(header_lines(totals)), header);
    render_table(frame, table, rows, view);
    frame.render_widget(Paragraph::new(footer_line(rows.len(), view)), footer);
}

/// `forkctl top · 2 running · 1 pending · 5 ended · cost $0.0123 · cache read 91.2%`, then the
/// four token counts.
fn header_lines(totals: &Totals) -> Vec<Line<'static>> {
    let c = totals.counts;
    vec![
        Line::from(vec![
            "forkctl top".bold(),
            Span::raw(format!(
                " · {} running · {} pending · {} ended · cost {} · cache read {}",
                c.running,
                c.pending,
                c.ended,
                usd(totals.cost_usd),
                percent(totals.cache_read_share()),
            )),
        ]),
        Line::from(format!("tokens: {}", usage_line(Some(&totals.usage)))).dim(),
    ]
}

fn footer_line(rows: usize, view: &ViewState) -> Line<'static> {
    let shown = match rows {
        0 => "no agents yet".to_owned(),
        n => format!(
            "rows {}-{} of {n}",
            view.scroll + 1,
            (view.scroll + view.page).min(n)
        ),
    };
    let mut spans = vec![Span::raw(format!("q quit · ↑/↓ j/k scroll · PgUp/PgDn · {shown}")).dim()];
    if let Some(status) = &view.status {
        spans.push(Span::raw(format!(" · {status}")).fg(Color::Red));
    }
    Line::from(spans)
}

fn render_table(frame: &mut Frame, area: Rect, rows: &[Row], view: &mut ViewState) {
    // One line goes to the column titles.
    view.page = usize::from(area.height.saturating_sub(1));
    view.scroll = view.scroll.min(rows.len().saturating_sub(view.page));
    let prefixes = tree_prefixes(rows);
    let body = rows
        .iter()
        .zip(prefixes)
        .skip(view.scroll)
        .take(view.page)
        .map(|(row, prefix)| table_row(row, &prefix));
    let number = Constraint::Length(11);
    let widths = [
        Constraint::Fill(1),
        Constraint::Length(9),
        number,
        number,
        number,
        number,
        Constraint::Length(7),
        Constraint::Length(10),
    ];
    let titles = HEADER
        .iter()
        .enumerate()
        .map(|(i, title)| aligned(i, (*title).to_owned()));
    let table = Table::new(body, widths)
        .header(TableRow::new(titles).bold().underlined())
        .column_spacing(1);
    frame.render_widget(table, area);
}

/// Numbers are right-aligned, so their digits line up.
fn aligned(column: usize, text: String) -> Cell<'static> {
    if column >= 2 {
        Cell::from(Line::from(text).right_aligned())
    } else {
        Cell::from(text)
    }
}

fn table_row(row: &Row, prefix: &str) -> TableRow<'static> {
    let u = row.totals.usage;
    let cells = [
        format!("{prefix}{}", name(row)),
        row.state.clone(),
        tokens(u.input_tokens),
        tokens(u.cache_creation_input_tokens),
        tokens(u.cache_read_input_tokens),
        tokens(u.output_tokens),
        percent(row.cache_read_share()),
        usd(row.totals.cost_usd),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, text)| {
        let cell = aligned(i, text);
        if i == 1 {
            cell.style(state_style(&row.state))
        } else {
            cell
        }
    });
    let style = match row.level {
        Level::Session => Style::new().add_modifier(Modifier::BOLD),
        Level::Batch | Level::Agent => Style::new(),
    };
    TableRow::new(cells).style(style)
}

fn state_style(state: &str) -> Style {
    match state {
        "running" => Style::new().fg(Color::Green),
        "pending" => Style::new().fg(Color::Yellow),
        "failed" => Style::new().fg(Color::Red),
        "killed" => Style::new().fg(Color::Magenta),
        "timed_out" => Style::new().fg(Color::LightRed),
        _ => Style::new(),
    }
}

/// Ids are UUIDv7, whose first digits are a timestamp shared by siblings: their last eight
/// digits tell them apart (`ps` and `--json` have the whole ids).
pub(crate) fn short_id(id: &str) -> &str {
    let start = id.char_indices().rev().nth(7).map_or(0, |(i, _)| i);
    &id[start..]
}

/// `session 0d1e2f3a  claude-sonnet-4-5`, `batch 4b5c6d7e  2/5 ended`, `fork 8f9a0b1c  Review…`.
fn name(row: &Row) -> String {
    let id = match row.level {
        Level::Session => row.session_id.as_str(),
        Level::Batch => row.batch_id.as_deref().unwrap_or_default(),
        Level::Agent => row.agent_id.as_deref().unwrap_or_default(),
    };
    let kind = match row.kind.as_str() {
        "parent" => "main loop",
        kind => kind,
    };
    let detail = match row.level {
        Level::Batch => format!(
            "{}/{} ended",
            row.totals.counts.ended,
            row.totals.counts.total()
        ),
        Level::Session | Level::Agent => first_line(&row.label, 60),
    };
    format!("{kind} {}  {detail}", short_id(id))
        .trim_end()
        .to_owned()
}

/// The tree's branches in front of each row: `├─ ` or `└─ ` for the row itself, behind `│  ` or
/// blanks for each ancestor, as it has later siblings or not.
pub(crate) fn tree_prefixes(rows: &[Row]) -> Vec<String> {
    // Backwards: a row is the last of its siblings when no row of its depth follows before the
    // next shallower one.
    let depth_max = rows.iter().map(|r| r.depth).max().unwrap_or(0);
    let mut sibling_follows = vec![false; depth_max + 1];
    let mut last = vec![false; rows.len()];
    for (i, row) in rows.iter().enumerate().rev() {
        last[i] = !sibling_follows[row.depth];
        sibling_follows[row.depth] = true;
        for deeper in &mut sibling_follows[row.depth + 1..] {
            *deeper = false;
        }
    }
    let mut ancestor_last = vec![true; depth_max + 1];
    rows.iter()
        .zip(last)
        .map(|(row, last)| {
            let mut prefix = String::new();
            for &done in &ancestor_last[1..row.depth.max(1)] {
                prefix.push_str(if done { "   " } else { "│  " });
            }
            if row.depth > 0 {
                prefix.push_str(if last { "└─ " } else { "├─ " });
            }
            ancestor_last[row.depth] = last;
            prefix
        })
        .collect()
}

#[cfg(test)]
mod tests;
