//! What a waited-for batch came to: one row per child (notification and agent joined), the
//! summary table for people and the final `--json` object.

use forkd_proto::v1::{Agent, ForkBatchResponse, Notification, NotificationStatus, Report, Usage};
use prost_types::Timestamp;
use serde_json::{Value, json};

use crate::commands::fork::Tally;
use crate::output::{human, status_name, timed_out_reason, usage_json};

/// One child of the batch, as it ended.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Child {
    /// 1-based, in directive order.
    pub index: usize,
    pub agent_id: String,
    pub description: String,
    pub status: NotificationStatus,
    pub summary: String,
    pub report: Option<Report>,
    /// Why a failed child failed, as the daemon recorded it.
    pub error: String,
    pub usage: Usage,
    pub cost_usd: f64,
    pub created_at: Option<Timestamp>,
    pub ended_at: Option<Timestamp>,
    /// The `--junit-fail-when` rule its structured report matched: it completed, but its case
    /// fails.
    pub failed_when: Option<String>,
}

impl Child {
    /// The JUnit name and table label: the description, else `child N`.
    pub fn name(&self) -> String {
        if self.description.trim().is_empty() {
            format!("child {}", self.index)
        } else {
            self.description.clone()
        }
    }

    pub fn completed(&self) -> bool {
        self.status == NotificationStatus::Completed
    }

    /// Completed, and its report matched no `--junit-fail-when` rule.
    pub fn passed(&self) -> bool {
        self.completed() && self.failed_when.is_none()
    }

    /// The limit that stopped a timed-out child, as its report's issues or its error name it.
    pub fn timed_out_reason(&self) -> Option<&str> {
        if self.status != NotificationStatus::TimedOut {
            return None;
        }
        let issues = self.report.as_ref().map_or("", |r| r.issues.as_str());
        timed_out_reason(issues).or_else(|| timed_out_reason(&self.error))
    }

    /// The object its final reply held under an output schema, if any.
    pub fn structured(&self) -> Option<Value> {
        self.report.as_ref().and_then(crate::output::structured)
    }

    /// Seconds from creation to the end, when both are known and in order.
    pub fn seconds(&self) -> Option<f64> {
        let (start, end) = self.span()?;
        (end >= start).then_some(end - start)
    }

    /// Creation and end, in seconds since the epoch.
    fn span(&self) -> Option<(f64, f64)> {
        Some((
            epoch_seconds(&self.created_at?),
            epoch_seconds(&self.ended_at?),
        ))
    }

    /// The report as plain text: status, summary, the report's fields and the error, one per
    /// line, empty ones left out.
    pub fn report_text(&self) -> String {
        let report = self.report.clone().unwrap_or_default();
        let fields = [
            ("status", status_name(self.status).to_owned()),
            ("summary", self.summary.clone()),
            ("scope", report.scope),
            ("result", report.result),
            ("key files", report.key_files.join(", ")),
            ("files changed", report.files_changed.join(", ")),
            ("issues", report.issues),
            ("error", self.error.clone()),
            ("failed when", self.failed_when.clone().unwrap_or_default()),
        ];
        fields
            .iter()
            .filter(|(_, value)| !value.trim().is_empty())
            .map(|(name, value)| format!("{name}: {}", value.trim_end()))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

fn epoch_seconds(t: &Timestamp) -> f64 {
    t.seconds as f64 + f64::from(t.nanos) / 1e9
}

/// Seconds from the first child's creation to the last one's end: the batch's wall time
/// (children run side by side, so their own times do not add up to it).
pub(crate) fn wall_seconds(children: &[Child]) -> Option<f64> {
    let spans = children.iter().filter_map(Child::span);
    let (start, end) = spans.reduce(|(s1, e1), (s2, e2)| (s1.min(s2), e1.max(e2)))?;
    (end >= start).then_some(end - start)
}

/// Reads over total input, as the daemon computes it (0 with no input).
pub(crate) fn cache_read_share(u: &Usage) -> f64 {
    let total = u.input_tokens + u.cache_creation_input_tokens + u.cache_read_input_tokens;
    if total == 0 {
        0.0
    } else {
        u.cache_read_input_tokens as f64 / total as f64
    }
}

/// Joins each child's notification with its agent record (for the description and the creation
/// time); `descriptions` (the file's, in order) stand in for agents the daemon did not list.
pub(crate) fn children(
    batch: &ForkBatchResponse,
    notifications: &[Notification],
    agents: &[Agent],
    descriptions: &[String],
) -> Vec<Child> {
    batch
        .agent_ids
        .iter()
        .enumerate()
        .map(|(i, agent_id)| {
            let note = notifications.iter().find(|n| &n.agent_id == agent_id);
            let agent = agents.iter().find(|a| &a.agent_id == agent_id);
            let description = agent
                .map(|a| a.description.clone())
                .filter(|d| !d.is_empty())
                .or_else(|| descriptions.get(i).cloned())
                .unwrap_or_default();
            Child {
                index: i + 1,
                agent_id: agent_id.clone(),
                description,
                status: note.map_or(NotificationStatus::Unspecified, Notification::status),
                summary: note.map(|n| n.summary.clone()).unwrap_or_default(),
                report: note.and_then(|n| n.report.clone()),
                error: agent.map(|a| a.error.clone()).unwrap_or_default(),
                usage: note.and_then(|n| n.usage).unwrap_or_default(),
                cost_usd: note.map(|n| n.cost_usd).unwrap_or_default(),
                created_at: agent.and_then(|a| a.created_at),
                ended_at: note
                    .and_then(|n| n.created_at)
                    .or_else(|| agent.and_then(|a| a.updated_at)),
                failed_when: None,
            }
        })
        .collect()
}

/// One row per child: index, description, status, tokens, cache-read share, cost, summary.
pub(crate) fn table(children: &[Child]) -> String {
    let header = [
        "#", "CHILD", "STATUS", "INPUT", "OUTPUT", "READ %", "COST", "SUMMARY",
    ];
    let mut t = human::table(Some(&header));
    for c in children {
        let u = &c.usage;
        let input = u.input_tokens + u.cache_creation_input_tokens + u.cache_read_input_tokens;
        t.add_row(vec![
            c.index.to_string(),
            human::first_line(&c.name(), 40),
            match &c.failed_when {
                Some(_) => "fail-when".to_owned(),
                None => status_name(c.status).to_owned(),
            },
            human::tokens(input),
            human::tokens(u.output_tokens),
            human::percent(cache_read_share(u)),
            human::usd(c.cost_usd),
            human::first_line(&c.summary, 60),
        ]);
    }
    human::right_align(&mut t, 0..1);
    human::right_align(&mut t, 3..7);
    human::finish(t)
}

/// The last `--json` line of `run --wait`.
pub(crate) fn summary_json(batch_id: &str, tally: &Tally) -> Value {
    json!({
        "batch_id": batch_id,
        "children": tally.children,
        "completed": tally.completed,
        "failed": tally.failed,
        "killed": tally.killed,
        "timed_out": tally.timed_out,
        "cost_usd": tally.cost_usd,
        "cache_read_share": cache_read_share(&tally.usage),
        "usage": usage_json(Some(&tally.usage)),
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn child(index: usize, status: NotificationStatus) -> Child {
        Child {
            index,
            agent_id: format!("A{index}"),
            description: format!("part {index}"),
            status,
            summary: format!("part {index} done"),
            report: Some(Report {
                result: "Done: it works".into(),
                issues: if status == NotificationStatus::Completed {
                    String::new()
                } else {
                    "provider error 400".into()
                },
                ..Default::default()
            }),
            error: String::new(),
            usage: Usage {
                input_tokens: 100,
                cache_creation_input_tokens: 0,
                cache_read_input_tokens: 900,
                output_tokens: 50,
            },
            cost_usd: 0.0125,
            created_at: Some(Timestamp {
                seconds: 10,
                nanos: 500_000_000,
            }),
            ended_at: Some(Timestamp {
                seconds: 12,
                nanos: 0,
            }),
            failed_when: None,
        }
    }

    #[test]
    fn notifications_and_agents_are_joined_in_directive_order() {
        let batch = ForkBatchResponse {
            batch_id: "B".into(),
            agent_ids: vec!["a".into(), "b".into()],
            ..Default::default()
        };
        let notes = [Notification {
            agent_id: "b".into(),
            status: NotificationStatus::Failed as i32,
            summary: "broke".into(),
            created_at: Some(Timestamp {
                seconds: 5,
                nanos: 0,
            }),
            ..Default::default()
        }];
        let agents = [Agent {
            agent_id: "b".into(),
            description: "second".into(),
            error: "provider said 400".into(),
            created_at: Some(Timestamp {
                seconds: 3,
                nanos: 0,
            }),
            ..Default::default()
        }];
        let rows = children(&batch, &notes, &agents, &["one".into(), "two".into()]);
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].index, rows[0].name()), (1, "one".to_owned()));
        assert_eq!(rows[0].status, NotificationStatus::Unspecified);
        assert_eq!((rows[1].index, rows[1].name()), (2, "second".to_owned()));
        assert_eq!(rows[1].status, NotificationStatus::Failed);
        assert_eq!(rows[1].seconds(), Some(2.0));
        assert_eq!(
            rows[1].report_text(),
            "status: failed\nsummary: broke\nerror: provider said 400"
        );
    }

    #[test]
    fn times_need_both_ends_in_order() {
        let mut c = child(1, NotificationStatus::Completed);
        assert_eq!(c.seconds(), Some(1.5));
        c.ended_at = None;
        assert_eq!(c.seconds(), None);
        c.ended_at = Some(Timestamp {
            seconds: 1,
            nanos: 0,
        });
        assert_eq!(c.seconds(), None);
    }

    #[test]
    fn the_wall_time_spans_the_children() {
        let first = child(1, NotificationStatus::Completed);
        let mut second = child(2, NotificationStatus::Completed);
        second.created_at = Some(Timestamp {
            seconds: 11,
            nanos: 0,
        });
        second.ended_at = Some(Timestamp {
            seconds: 13,
            nanos: 250_000_000,
        });
        let mut unknown = child(3, NotificationStatus::Failed);
        unknown.created_at = None;
        assert_eq!(wall_seconds(&[first, second, unknown]), Some(2.75));
        assert_eq!(wall_seconds(&[]), None);
    }

    #[test]
    fn the_table_has_a_row_per_child() {
        let mut second = child(2, NotificationStatus::Failed);
        second.description = String::new();
        let text = table(&[child(1, NotificationStatus::Completed), second]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[0].starts_with("#  CHILD"), "{text}");
        for cell in ["part 1", "completed", "1,000", "50", "90.0%", "$0.0125"] {
            assert!(lines[1].contains(cell), "{cell}: {text}");
        }
        assert!(
            lines[2].contains("child 2") && lines[2].contains("failed"),
            "{text}"
        );
    }

    #[test]
    fn the_summary_object_has_the_fixed_names() {
        let mut tally = Tally::new(&["a".to_owned(), "b".to_owned()]);
        for (agent, status) in [
            ("a", NotificationStatus::Completed),
            ("b", NotificationStatus::Killed),
        ] {
            tally.record(&Notification {
                agent_id: agent.into(),
                status: status as i32,
                usage: Some(Usage {
                    input_tokens: 25,
                    cache_read_input_tokens: 75,
                    ..Default::default()
                }),
                cost_usd: 0.5,
                ..Default::default()
            });
        }
        let value = summary_json("B", &tally);
        assert_eq!(value["batch_id"], "B");
        assert_eq!(value["children"], 2);
        assert_eq!(
            (&value["completed"], &value["failed"], &value["killed"]),
            (&json!(1), &json!(0), &json!(1))
        );
        assert_eq!(value["timed_out"], 0);
        assert_eq!(value["cost_usd"], 1.0);
        assert_eq!(value["cache_read_share"], 0.75);
        assert_eq!(value["usage"]["cache_read_input_tokens"], 150);
    }
}
