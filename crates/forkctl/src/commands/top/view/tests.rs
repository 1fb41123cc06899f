//! The screen, drawn into ratatui's `TestBackend` from a known model, and the keys.

use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use super::*;
use crate::commands::top::model::tests::sample;

/// The screen as text, one string per line, trailing blanks trimmed.
fn screen(width: u16, height: u16, view: &mut ViewState) -> anyhow::Result<Vec<String>> {
    let model = sample();
    let (rows, totals) = (model.rows(), model.totals());
    let mut terminal = Terminal::new(TestBackend::new(width, height))?;
    terminal.draw(|frame| render(frame, &rows, &totals, view))?;
    let buffer = terminal.backend().buffer();
    Ok((0..height)
        .map(|y| {
            let line: String = (0..width)
                .filter_map(|x| buffer.cell((x, y)).map(|c| c.symbol().to_owned()))
                .collect();
            line.trim_end().to_owned()
        })
        .collect())
}

#[test]
fn the_header_sums_every_agent() -> anyhow::Result<()> {
    let lines = screen(110, 14, &mut ViewState::default())?;
    assert_eq!(
        lines[0],
        "forkctl top · 1 running · 2 pending · 2 ended · cost $0.0150 · cache read 9.3%"
    );
    assert_eq!(lines[1], "tokens: in 630 · write 2,000 · read 270 · out 85");
    assert!(lines[2].starts_with("NAME"), "{lines:#?}");
    assert!(lines[2].ends_with("READ %       COST"), "{lines:#?}");
    Ok(())
}

#[test]
fn the_tree_shows_each_row_with_its_figures() -> anyhow::Result<()> {
    let lines = screen(110, 14, &mut ViewState::default())?;
    let row = |needle: &str| {
        lines
            .iter()
            .find(|l| l.contains(needle))
            .cloned()
            .unwrap_or_default()
    };
    assert!(
        row("session S1").contains("claude-sonnet-4-5"),
        "{lines:#?}"
    );
    assert!(row("session S1").contains("running"));
    assert!(
        row("├─ main loop P1  P1 work").contains("pending"),
        "{lines:#?}"
    );
    let batch = row("├─ batch B1  1/3 ended");
    assert!(batch.contains("running"), "{lines:#?}");
    assert!(batch.ends_with("30           0         270          15   90.0%    $0.0030"));
    assert!(
        row("│  ├─ fork C1  C1 work").contains("completed"),
        "{lines:#?}"
    );
    assert!(
        row("│  └─ fork C3  C3 work").contains("pending"),
        "{lines:#?}"
    );
    assert!(
        row("└─ typed T1  T1 work").ends_with("$0.0020"),
        "{lines:#?}"
    );
    assert!(row("session S2").contains("idle"));
    assert!(
        lines[13].starts_with("q quit · ↑/↓ j/k scroll · PgUp/PgDn · rows 1-8 of 8"),
        "{lines:#?}"
    );
    Ok(())
}

#[test]
fn scrolling_moves_the_rows_and_stops_at_the_end() -> anyhow::Result<()> {
    // 6 lines: header (2), titles (1), 2 rows, footer.
    let mut view = ViewState::default();
    let lines = screen(110, 6, &mut view)?;
    assert!(lines[3].contains("session S1"), "{lines:#?}");
    assert_eq!(view.page, 2);
    assert_eq!(on_key(key(KeyCode::Char('j')), &mut view), Action::Redraw);
    assert_eq!(on_key(key(KeyCode::Down), &mut view), Action::Redraw);
    let lines = screen(110, 6, &mut view)?;
    assert!(lines[3].contains("batch B1"), "{lines:#?}");
    assert!(lines[5].contains("rows 3-4 of 8"), "{lines:#?}");
    on_key(key(KeyCode::End), &mut view);
    let lines = screen(110, 6, &mut view)?;
    assert_eq!(view.scroll, 6, "clamped to the last page");
    assert!(lines[4].contains("session S2"), "{lines:#?}");
    on_key(key(KeyCode::PageUp), &mut view);
    assert_eq!(view.scroll, 4);
    on_key(key(KeyCode::Char('k')), &mut view);
    on_key(key(KeyCode::Up), &mut view);
    on_key(key(KeyCode::Up), &mut view);
    assert_eq!(view.scroll, 1);
    on_key(key(KeyCode::Home), &mut view);
    assert_eq!(view.scroll, 0);
    on_key(key(KeyCode::Up), &mut view);
    assert_eq!(view.scroll, 0, "no further than the top");
    Ok(())
}

#[test]
fn a_status_shows_in_the_footer() -> anyhow::Result<()> {
    let mut view = ViewState {
        status: Some("notifications: broken pipe; reconnecting".into()),
        ..ViewState::default()
    };
    let lines = screen(120, 14, &mut view)?;
    assert!(
        lines[13].ends_with("rows 1-8 of 8 · notifications: broken pipe; reconnecting"),
        "{lines:#?}"
    );
    Ok(())
}

fn key(code: KeyCode) -> KeyEvent {
    KeyEvent::new(code, KeyModifiers::NONE)
}

#[test]
fn q_esc_and_ctrl_c_quit_other_keys_do_nothing() {
    let mut view = ViewState::default();
    assert_eq!(on_key(key(KeyCode::Char('q')), &mut view), Action::Quit);
    assert_eq!(on_key(key(KeyCode::Esc), &mut view), Action::Quit);
    let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
    assert_eq!(on_key(ctrl_c, &mut view), Action::Quit);
    assert_eq!(on_key(key(KeyCode::Char('c')), &mut view), Action::Nothing);
    assert_eq!(on_key(key(KeyCode::Char('x')), &mut view), Action::Nothing);
    let mut release = key(KeyCode::Char('q'));
    release.kind = KeyEventKind::Release;
    assert_eq!(on_key(release, &mut view), Action::Nothing);
}

#[test]
fn ids_are_cut_to_their_last_eight_digits() {
    assert_eq!(short_id("019a2b3c-4d5e-7f60-8a1b-2c3d4e5f6a7b"), "4e5f6a7b");
    assert_eq!(short_id("S1"), "S1");
    assert_eq!(short_id(""), "");
}

#[test]
fn the_branches_follow_the_depths() {
    let rows = sample().rows();
    let prefixes = tree_prefixes(&rows);
    assert_eq!(
        prefixes,
        ["", "├─ ", "├─ ", "│  ├─ ", "│  ├─ ", "│  └─ ", "└─ ", ""]
    );
}
