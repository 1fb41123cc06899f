//! What a client's batch tells its parent model: one note when it is launched, and one digest when
//! its last child ends — instead of one `<task-notification>` per child, which for a 1000-child
//! batch would add ~150k tokens to the parent's context. Both stay within a fixed size whatever
//! the batch's size; every child's full notification still reaches the subscribers' stream.

use std::fmt::Write as _;

use crate::agent::{Directive, Notification, NotificationStatus};
use crate::ids::{BatchId, SessionId};
use crate::message::{Block, Message};

/// The most children a launch note or a digest names one by one; the rest are counted.
pub const LISTED_CHILDREN: usize = 40;

/// The longest line a digest or note gives one child, in characters.
const LINE_CHARS: usize = 160;

/// The user message a client's batch appends to its parent's transcript when it is launched.
pub fn launch_note(batch: BatchId, directives: &[Directive]) -> Message {
    let mut text = format!(
        "<batch-launched>\nA client forked batch {batch} from this conversation: {} children \
         work in the background, each on one directive. One batch notification with their \
         results arrives here when all have ended.\n",
        directives.len()
    );
    for (i, d) in directives.iter().enumerate().take(LISTED_CHILDREN) {
        let what = if d.description.trim().is_empty() {
            &d.prompt
        } else {
            &d.description
        };
        let _ = writeln!(text, "{}. {}", i + 1, one_line(what));
    }
    if directives.len() > LISTED_CHILDREN {
        let _ = writeln!(text, "… and {} more.", directives.len() - LISTED_CHILDREN);
    }
    text.push_str("</batch-launched>");
    Message::user(vec![Block::text(&text)])
}

/// The digest a client's batch appends to its parent's transcript when its last child ends:
/// counts, then one line per child (failures first), at most [`LISTED_CHILDREN`] of them, and how
/// to read the full reports. `notifications` are the batch's, one per child.
pub fn batch_digest(batch: BatchId, notifications: &[Notification]) -> Message {
    let count = |status| notifications.iter().filter(|n| n.status == status).count();
    let cost: f64 = notifications.iter().map(|n| n.cost_usd).sum();
    let mut text = format!(
        "<batch-notification>\n<batch-id>{batch}</batch-id>\n<status>{} children: {} completed, \
         {} failed, {} killed, {} timed out; ${cost:.4}</status>\n",
        notifications.len(),
        count(NotificationStatus::Completed),
        count(NotificationStatus::Failed),
        count(NotificationStatus::Killed),
        count(NotificationStatus::TimedOut),
    );
    // Failures first: they are what the parent most needs to see.
    let mut ordered: Vec<&Notification> = notifications.iter().collect();
    ordered.sort_by_key(|n| (n.status == NotificationStatus::Completed, n.seq));
    text.push_str("<results>\n");
    for n in ordered.iter().take(LISTED_CHILDREN) {
        let result = if n.report.result.trim().is_empty() {
            &n.summary
        } else {
            &n.report.result
        };
        let _ = writeln!(
            text,
            "- {} {}: {}{}",
            n.agent_id,
            n.status.as_str(),
            one_line(result),
            files_changed(&n.report.files_changed)
        );
    }
    if ordered.len() > LISTED_CHILDREN {
        let _ = writeln!(
            text,
            "- … and {} more, all listed by their batch id",
            ordered.len() - LISTED_CHILDREN
        );
    }
    text.push_str(
        "</results>\nEach child's full report is in its transcript, by its agent id.\n\
         </batch-notification>",
    );
    Message::user(vec![Block::text(&text)])
}

/// The longest branch's reply or summary a `<branch-report>` carries, in characters.
pub const BRANCH_REPLY_CHARS: usize = 8_000;

/// What a branch brings back to its origin ([`branch_report`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BranchReport<'a> {
    pub branch: SessionId,
    /// Where the branch starts: after this turn of the origin's, at this message.
    pub after_turn: u32,
    pub point: u64,
    /// The user's message of each of the branch's own turns, in order.
    pub turns: Vec<&'a str>,
    /// The branch's conclusion: the model's summary of it since the point, or its last reply.
    pub conclusion: Conclusion<'a>,
}

/// A branch's conclusion, as [`BranchReport`] carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conclusion<'a> {
    LastReply(&'a str),
    Summary(&'a str),
}

/// The note `forkctl session merge` appends to a branch's origin: where the branch started, the
/// turns it ran (one line each, at most [`LISTED_CHILDREN`]) and its conclusion (at most
/// [`BRANCH_REPLY_CHARS`]).
pub fn branch_report(report: &BranchReport<'_>) -> Message {
    let mut text = format!(
        "<branch-report>\n<branch-id>{}</branch-id>\n<point>after turn {} of this \
         conversation (message {})</point>\n<turns>\n",
        report.branch, report.after_turn, report.point
    );
    for (i, turn) in report.turns.iter().enumerate().take(LISTED_CHILDREN) {
        let _ = writeln!(text, "{}. {}", i + 1, one_line(turn));
    }
    if report.turns.len() > LISTED_CHILDREN {
        let _ = writeln!(text, "… and {} more.", report.turns.len() - LISTED_CHILDREN);
    }
    text.push_str("</turns>\n");
    let (tag, body) = match report.conclusion {
        Conclusion::LastReply(reply) => ("last-reply", reply),
        Conclusion::Summary(summary) => ("summary", summary),
    };
    let body = body.trim();
    let shown: String = body.chars().take(BRANCH_REPLY_CHARS).collect();
    let _ = write!(text, "<{tag}>\n{shown}");
    let more = body.chars().count().saturating_sub(BRANCH_REPLY_CHARS);
    if more > 0 {
        let _ = write!(
            text,
            "… ({more} more characters, in the branch's transcript)"
        );
    }
    let _ = write!(text, "\n</{tag}>\n</branch-report>");
    Message::user(vec![Block::text(&text)])
}

/// How many changed files a child's line names before it counts the rest.
const LISTED_FILES: usize = 3;

/// ` (files changed: a.rs, b.rs)`, or nothing when the report names none: an isolated child's
/// are read from its copy, and wait to be applied.
fn files_changed(files: &[String]) -> String {
    if files.is_empty() {
        return String::new();
    }
    let mut names = files[..files.len().min(LISTED_FILES)].join(", ");
    if files.len() > LISTED_FILES {
        names.push_str(&format!(" and {} more", files.len() - LISTED_FILES));
    }
    format!(" (files changed: {names})")
}

/// The first line of `text`, at most [`LINE_CHARS`] characters.
fn one_line(text: &str) -> String {
    let line = text.trim().lines().next().unwrap_or("").trim();
    if line.chars().count() <= LINE_CHARS {
        line.to_owned()
    } else {
        let cut: String = line.chars().take(LINE_CHARS - 1).collect();
        format!("{cut}…")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Report;
    use crate::{AgentId, SessionId, Usage};

    fn note(seq: u64, status: NotificationStatus, result: &str) -> Notification {
        Notification {
            seq,
            tenant_seq: seq,
            session_id: SessionId::new(),
            batch_id: None,
            agent_id: AgentId::new(),
            kind: crate::NotificationKind::Fork,
            status,
            summary: String::new(),
            report: Report {
                result: result.to_owned(),
                ..Report::default()
            },
            usage: Usage::default(),
            cost_usd: 0.01,
            created_at_ms: 0,
            schedule: None,
        }
    }

    #[test]
    fn a_branch_report_holds_the_point_the_turns_and_the_conclusion() {
        let branch = SessionId::new();
        let long = "x".repeat(BRANCH_REPLY_CHARS + 5);
        let report = BranchReport {
            branch,
            after_turn: 3,
            point: 7,
            turns: vec!["Try the other parser.\nIt may be faster.", "Measure it."],
            conclusion: Conclusion::LastReply(&long),
        };
        let text = branch_report(&report).text();
        assert!(text.starts_with("<branch-report>\n"), "{text}");
        assert!(text.contains(&format!("<branch-id>{branch}</branch-id>")));
        assert!(text.contains("after turn 3 of this conversation (message 7)"));
        assert!(text.contains("1. Try the other parser.\n2. Measure it.\n"));
        assert!(text.contains("… (5 more characters, in the branch's transcript)"));
        assert!(text.ends_with("</last-reply>\n</branch-report>"));
        let summary = BranchReport {
            conclusion: Conclusion::Summary("It is faster."),
            ..report
        };
        assert!(
            branch_report(&summary)
                .text()
                .contains("<summary>\nIt is faster.\n</summary>")
        );
    }

    #[test]
    fn a_digest_stays_small_whatever_the_batch_and_puts_failures_first() {
        let small: Vec<_> = (0..3)
            .map(|i| note(i, NotificationStatus::Completed, "fine"))
            .collect();
        let mut big: Vec<_> = (0..1000)
            .map(|i| {
                note(
                    i,
                    NotificationStatus::Completed,
                    &"long result ".repeat(100),
                )
            })
            .collect();
        big.push(note(1000, NotificationStatus::Failed, "broke"));
        let small_text = batch_digest(BatchId::new(), &small).text();
        let big_text = batch_digest(BatchId::new(), &big).text();
        assert!(small_text.contains("3 children: 3 completed, 0 failed, 0 killed, 0 timed out;"));
        assert!(big_text.contains("1001 children: 1000 completed, 1 failed"));
        assert!(big_text.contains("and 961 more"), "{big_text}");
        // The failure is listed although it ended last.
        let first = big_text.lines().find(|l| l.starts_with("- ")).unwrap_or("");
        assert!(first.contains("failed: broke"), "{first}");
        // Bounded: about 40 lines of at most 160 characters plus the frame.
        assert!(big_text.len() < 12_000, "{}", big_text.len());
    }

    #[test]
    fn a_launch_note_names_the_first_children_and_counts_the_rest() {
        let directives: Vec<Directive> = (0..100)
            .map(|i| Directive {
                description: format!("part {i}"),
                prompt: format!("do part {i}"),
            })
            .collect();
        let text = launch_note(BatchId::new(), &directives).text();
        assert!(text.contains("100 children"));
        assert!(text.contains("40. part 39"));
        assert!(!text.contains("part 40\n"));
        assert!(text.contains("and 60 more"));
    }

    #[test]
    fn a_childs_line_names_the_files_it_changed() {
        assert_eq!(files_changed(&[]), "");
        let few: Vec<String> = ["a.rs", "b.rs"].map(String::from).to_vec();
        assert_eq!(files_changed(&few), " (files changed: a.rs, b.rs)");
        let many: Vec<String> = (0..5).map(|i| format!("f{i}")).collect();
        assert_eq!(
            files_changed(&many),
            " (files changed: f0, f1, f2 and 2 more)"
        );
    }
}
