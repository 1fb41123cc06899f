//! `forkctl session tree`: the tree a session belongs to, from its first session down — each
//! session's branches and fork batches, in the order they were made (ids are UUID v7).

use std::collections::{BTreeMap, HashMap};

use forkd_proto::v1::{Agent, GetSessionRequest, ListAgentsRequest, Session};
use serde_json::{Value, json};

use crate::client::Client;
use crate::exit::{self, CliError};
use crate::output::{Printer, state_name};

/// The deepest chain of branches followed up to the first session.
const MAX_DEPTH: usize = 1_000;

/// A fork batch of a session: its children's states, counted.
struct Batch {
    id: String,
    states: BTreeMap<&'static str, usize>,
}

/// Everything the tree shows, read once.
struct Tree {
    sessions: HashMap<String, Session>,
    batches: HashMap<String, Vec<Batch>>,
    /// The session asked for, marked.
    marked: String,
}

pub async fn run(id: &str, client: &mut Client, out: &Printer) -> anyhow::Result<u8> {
    let mut root = get(client, id).await?;
    for _ in 0..MAX_DEPTH {
        if root.branch_of.is_empty() {
            break;
        }
        root = get(client, &root.branch_of).await?;
    }
    if !root.branch_of.is_empty() {
        return Err(CliError::InvalidInput(format!(
            "session {id} is more than {MAX_DEPTH} branches deep"
        ))
        .into());
    }
    let mut tree = Tree {
        sessions: HashMap::new(),
        batches: HashMap::new(),
        marked: id.to_owned(),
    };
    let root_id = root.session_id.clone();
    let mut pending = vec![root];
    while let Some(session) = pending.pop() {
        for branch in &session.branches {
            pending.push(get(client, branch).await?);
        }
        let batches = batches(client, &session.session_id).await?;
        tree.batches.insert(session.session_id.clone(), batches);
        tree.sessions.insert(session.session_id.clone(), session);
    }
    if out.is_json() {
        out.value(&tree.json(&root_id))?;
    } else {
        let mut lines = Vec::new();
        tree.lines(&root_id, "", "", &mut lines);
        out.line(lines.join("\n"))?;
    }
    Ok(exit::OK)
}

async fn get(client: &mut Client, id: &str) -> anyhow::Result<Session> {
    Ok(client
        .get_session(GetSessionRequest {
            session_id: id.to_owned(),
        })
        .await?
        .into_inner()
        .session
        .unwrap_or_default())
}

/// The session's fork batches, in the order they were forked.
async fn batches(client: &mut Client, session: &str) -> anyhow::Result<Vec<Batch>> {
    let filter = ListAgentsRequest {
        session_id: session.to_owned(),
        include_ended: true,
        ..Default::default()
    };
    let mut children: Vec<Agent> = Vec::new();
    super::ps::list_agents(client, filter, |page| {
        children.extend(page.into_iter().filter(|a| !a.batch_id.is_empty()));
        Ok(())
    })
    .await?;
    let mut by_batch: BTreeMap<String, BTreeMap<&'static str, usize>> = BTreeMap::new();
    for child in &children {
        *by_batch
            .entry(child.batch_id.clone())
            .or_default()
            .entry(state_name(child.state()))
            .or_default() += 1;
    }
    Ok(by_batch
        .into_iter()
        .map(|(id, states)| Batch { id, states })
        .collect())
}

/// A session's branches and batches, in the order they were made.
enum Item<'a> {
    Branch(&'a str),
    Batch(&'a Batch),
}

impl Tree {
    fn items(&self, id: &str) -> Vec<Item<'_>> {
        let mut items: Vec<(&str, Item<'_>)> = Vec::new();
        if let Some(session) = self.sessions.get(id) {
            items.extend(
                session
                    .branches
                    .iter()
                    .map(|b| (b.as_str(), Item::Branch(b))),
            );
        }
        if let Some(batches) = self.batches.get(id) {
            items.extend(batches.iter().map(|b| (b.id.as_str(), Item::Batch(b))));
        }
        items.sort_by(|a, b| a.0.cmp(b.0));
        items.into_iter().map(|(_, item)| item).collect()
    }

    fn session_line(&self, id: &str) -> String {
        let mark = if id == self.marked { " *" } else { "" };
        let Some(s) = self.sessions.get(id) else {
            return format!("{id}{mark}");
        };
        let turns = s.turn_seqs.len();
        let mut line = format!("{id}{mark}  {turns} turn{}", plural(turns));
        if !s.branch_of.is_empty() {
            let own = turns.saturating_sub(s.branch_turn as usize);
            line.push_str(&format!(
                " ({own} its own), branched after turn {} (message {})",
                s.branch_turn, s.branch_point
            ));
        }
        line
    }

    fn lines(&self, id: &str, first: &str, rest: &str, out: &mut Vec<String>) {
        out.push(format!("{first}{}", self.session_line(id)));
        let items = self.items(id);
        for (i, item) in items.iter().enumerate() {
            let last = i + 1 == items.len();
            let (branch, indent) = if last {
                ("└─ ", "   ")
            } else {
                ("├─ ", "│  ")
            };
            match item {
                Item::Branch(child) => {
                    self.lines(
                        child,
                        &format!("{rest}{branch}branch "),
                        &format!("{rest}{indent}"),
                        out,
                    );
                }
                Item::Batch(batch) => {
                    out.push(format!("{rest}{branch}batch {}", batch_summary(batch)));
                }
            }
        }
    }

    fn json(&self, id: &str) -> Value {
        let s = self.sessions.get(id);
        let items: Vec<Value> = self
            .items(id)
            .into_iter()
            .map(|item| match item {
                Item::Branch(child) => json!({ "branch": self.json(child) }),
                Item::Batch(batch) => json!({ "batch": {
                    "batch_id": batch.id,
                    "children": batch.states.values().sum::<usize>(),
                    "states": batch.states,
                }}),
            })
            .collect();
        json!({
            "session_id": id,
            "marked": id == self.marked,
            "turns": s.map_or(0, |s| s.turn_seqs.len()),
            "branch": s.filter(|s| !s.branch_of.is_empty()).map(|s| json!({
                "origin": s.branch_of,
                "point": s.branch_point,
                "turn": s.branch_turn,
            })),
            "items": items,
        })
    }
}

/// `ID: 3 children (2 completed, 1 failed)`.
fn batch_summary(batch: &Batch) -> String {
    let n: usize = batch.states.values().sum();
    let states: Vec<String> = batch
        .states
        .iter()
        .map(|(state, count)| format!("{count} {state}"))
        .collect();
    format!(
        "{}: {n} child{} ({})",
        batch.id,
        if n == 1 { "" } else { "ren" },
        states.join(", ")
    )
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(id: &str, turns: usize, branch: Option<(&str, u32)>, branches: &[&str]) -> Session {
        Session {
            session_id: id.into(),
            turn_seqs: (0..turns as u64).map(|t| 1 + 2 * t).collect(),
            branch_of: branch.map(|b| b.0.into()).unwrap_or_default(),
            branch_turn: branch.map_or(0, |b| b.1),
            branch_point: branch.map_or(0, |b| 1 + 2 * u64::from(b.1)),
            branches: branches.iter().map(|b| (*b).to_owned()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn branches_and_batches_are_drawn_in_the_order_they_were_made() {
        let mut tree = Tree {
            sessions: HashMap::new(),
            batches: HashMap::new(),
            marked: "s3".into(),
        };
        for s in [
            session("s1", 4, None, &["s2", "s4"]),
            session("s2", 5, Some(("s1", 3)), &["s3"]),
            session("s3", 5, Some(("s2", 4)), &[]),
            session("s4", 2, Some(("s1", 1)), &[]),
        ] {
            tree.sessions.insert(s.session_id.clone(), s);
        }
        tree.batches.insert(
            "s1".into(),
            vec![Batch {
                id: "s3b".into(),
                states: BTreeMap::from([("completed", 2), ("failed", 1)]),
            }],
        );
        let mut lines = Vec::new();
        tree.lines("s1", "", "", &mut lines);
        assert_eq!(
            lines.join("\n"),
            "s1  4 turns\n\
             ├─ branch s2  5 turns (2 its own), branched after turn 3 (message 7)\n\
             │  └─ branch s3 *  5 turns (1 its own), branched after turn 4 (message 9)\n\
             ├─ batch s3b: 3 children (2 completed, 1 failed)\n\
             └─ branch s4  2 turns (1 its own), branched after turn 1 (message 3)"
        );
        let json = tree.json("s1");
        assert_eq!(
            json["items"][0]["branch"]["items"][0]["branch"]["marked"],
            true
        );
        assert_eq!(json["items"][1]["batch"]["children"], 3);
    }
}
