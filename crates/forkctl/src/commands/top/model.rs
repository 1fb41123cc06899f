//! What `forkctl top` shows, apart from how: the agents it knows of, updated from `ListAgents`
//! pages and task notifications, and the tree of rows built from them (sessions → their main
//! loop, typed agents and batches → each batch's children). Pure: no I/O, no terminal.

use std::collections::{BTreeMap, HashMap, HashSet};

use forkd_proto::v1::{Agent, AgentState, Notification, NotificationStatus, Session, Usage};
use prost_types::Timestamp;
use serde_json::{Value, json};

use crate::output::{
    agent_state_label, core_state, core_status, optional_id, usage_json, wire_state,
};

/// Agents by state: what a group row and the header count.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counts {
    pub(crate) running: usize,
    pub(crate) pending: usize,
    /// Main-loop agents between turns.
    pub(crate) idle: usize,
    pub(crate) ended: usize,
}

impl Counts {
    fn add(&mut self, state: AgentState) {
        use forkd_core::AgentState as State;
        match core_state(state) {
            Some(State::Running) => self.running += 1,
            Some(State::Idle) => self.idle += 1,
            Some(s) if s.is_terminal() => self.ended += 1,
            _ => self.pending += 1,
        }
    }

    pub(crate) fn total(&self) -> usize {
        self.running + self.pending + self.idle + self.ended
    }

    /// A group's state: `running` while any agent runs, else `pending` while any waits, else
    /// `ended`; `idle` for a session without agents.
    fn group_state(&self) -> &'static str {
        if self.running > 0 {
            "running"
        } else if self.pending > 0 {
            "pending"
        } else if self.ended > 0 {
            "ended"
        } else {
            "idle"
        }
    }
}

/// Token counts, cost and agents by state, summed over a group (or all agents: the header).
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub(crate) struct Totals {
    pub(crate) counts: Counts,
    pub(crate) usage: Usage,
    pub(crate) cost_usd: f64,
}

impl Totals {
    fn add(&mut self, agent: &Agent) {
        self.counts.add(agent.state());
        let (sum, u) = (&mut self.usage, agent.usage.unwrap_or_default());
        sum.input_tokens += u.input_tokens;
        sum.cache_creation_input_tokens += u.cache_creation_input_tokens;
        sum.cache_read_input_tokens += u.cache_read_input_tokens;
        sum.output_tokens += u.output_tokens;
        self.cost_usd += agent.cost_usd;
    }

    fn of<'a>(agents: impl IntoIterator<Item = &'a Agent>) -> Self {
        let mut totals = Self::default();
        for agent in agents {
            totals.add(agent);
        }
        totals
    }

    pub(crate) fn cache_read_share(&self) -> f64 {
        cache_read_share(&self.usage)
    }
}

/// The share of all input tokens (uncached, written, read) that was read from the cache; 0 when
/// there was no input. The daemon's definition, so agents' rows agree with `ps`.
pub(crate) fn cache_read_share(u: &Usage) -> f64 {
    let input = u.input_tokens + u.cache_creation_input_tokens + u.cache_read_input_tokens;
    match input {
        0 => 0.0,
        input => u.cache_read_input_tokens as f64 / input as f64,
    }
}

/// What a row stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Level {
    Session,
    Batch,
    Agent,
}

/// One line of the tree.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Row {
    pub(crate) level: Level,
    /// 0 for sessions, 1 for what a session holds, 2 for a batch's children.
    pub(crate) depth: usize,
    pub(crate) session_id: String,
    pub(crate) batch_id: Option<String>,
    pub(crate) agent_id: Option<String>,
    /// `session`, `batch`, or the agent's kind (`parent`, `fork`, `typed`).
    pub(crate) kind: String,
    /// An agent's state, or a group's (see [`Counts`]).
    pub(crate) state: String,
    /// An agent's description, a session's model; empty for batches.
    pub(crate) label: String,
    /// For an agent, itself alone.
    pub(crate) totals: Totals,
}

impl Row {
    pub(crate) fn cache_read_share(&self) -> f64 {
        self.totals.cache_read_share()
    }

    /// The `--json` shape: one row per line, the agent fields of `ps` where they apply.
    pub(crate) fn to_json(&self) -> Value {
        let counts = self.totals.counts;
        let group = self.level != Level::Agent;
        json!({
            "session_id": self.session_id,
            "batch_id": optional_id(self.batch_id.as_deref().unwrap_or_default()),
            "agent_id": optional_id(self.agent_id.as_deref().unwrap_or_default()),
            "kind": self.kind,
            "state": self.state,
            "depth": self.depth,
            "description": (self.level == Level::Agent).then_some(&self.label),
            "model": (self.level == Level::Session).then_some(&self.label),
            "agents": group.then(|| json!({
                "running": counts.running,
                "pending": counts.pending,
                "ended": counts.ended,
            })),
            "usage": usage_json(Some(&self.totals.usage)),
            "cache_read_share": self.cache_read_share(),
            "cost_usd": self.totals.cost_usd,
        })
    }
}

/// The agents (and sessions) in view.
#[derive(Debug, Default)]
pub(crate) struct Model {
    sessions: HashMap<String, Session>,
    agents: HashMap<String, Agent>,
}

fn is_live(agent: &Agent) -> bool {
    matches!(agent.state(), AgentState::Pending | AgentState::Running)
}

/// The state an agent ends in with this status.
fn state_of(status: NotificationStatus) -> AgentState {
    core_status(status).map_or(AgentState::Unspecified, |s| wire_state(s.agent_state()))
}

/// Sorts by creation time, then id; a missing time sorts first.
fn time_key(t: Option<&Timestamp>) -> (i64, i32) {
    t.map_or((i64::MIN, 0), |t| (t.seconds, t.nanos))
}

impl Model {
    pub(crate) fn add_session(&mut self, session: Session) {
        self.sessions.insert(session.session_id.clone(), session);
    }

    /// Adds or replaces an agent. An agent that has ended stays ended: a list page answered
    /// before its notification cannot bring it back to life.
    pub(crate) fn upsert_agent(&mut self, agent: Agent) {
        if let Some(known) = self.agents.get(&agent.agent_id)
            && !is_live(known)
            && is_live(&agent)
        {
            return;
        }
        self.agents.insert(agent.agent_id.clone(), agent);
    }

    /// A live poll: `live` is every pending or running agent in view, as the daemon lists them.
    /// Returns the agents that were live here and are missing from `live`: they ended since, and
    /// their final figures are worth one `GetAgent` each.
    pub(crate) fn apply_poll(&mut self, live: Vec<Agent>) -> Vec<String> {
        let listed: HashSet<&str> = live.iter().map(|a| a.agent_id.as_str()).collect();
        let mut vanished: Vec<String> = self
            .agents
            .values()
            .filter(|a| is_live(a) && !listed.contains(a.agent_id.as_str()))
            .map(|a| a.agent_id.clone())
            .collect();
        vanished.sort();
        for agent in live {
            self.upsert_agent(agent);
        }
        vanished
    }

    /// An agent ended: its state, tokens and cost come with the notification. Returns `false`
    /// when the agent was not known yet; it is added from what the notification says, and its
    /// kind and description are worth a `GetAgent`.
    pub(crate) fn apply_notification(&mut self, n: &Notification) -> bool {
        let known = self.agents.contains_key(&n.agent_id);
        let agent = self
            .agents
            .entry(n.agent_id.clone())
            .or_insert_with(|| Agent {
                agent_id: n.agent_id.clone(),
                session_id: n.session_id.clone(),
                batch_id: n.batch_id.clone(),
                // Only fork children belong to a batch; other agents that report are typed.
                kind: if n.batch_id.is_empty() {
                    "typed"
                } else {
                    "fork"
                }
                .into(),
                created_at: n.created_at,
                ..Agent::default()
            });
        agent.set_state(state_of(n.status()));
        if let Some(usage) = n.usage {
            agent.usage = Some(usage);
        }
        agent.cost_usd = n.cost_usd;
        known
    }

    /// Sessions that agents belong to but whose details are not known yet.
    pub(crate) fn unknown_sessions(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .agents
            .values()
            .filter(|a| !self.sessions.contains_key(&a.session_id))
            .map(|a| a.session_id.clone())
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        ids.sort();
        ids
    }

    /// Every agent in view, summed: the header.
    pub(crate) fn totals(&self) -> Totals {
        Totals::of(self.agents.values())
    }

    /// The tree, flattened in display order: each session (oldest first), then its main loop,
    /// then its batches and typed agents in the order they were created, each batch followed by
    /// its children in directive order.
    pub(crate) fn rows(&self) -> Vec<Row> {
        let mut by_session: BTreeMap<&str, Vec<&Agent>> = self
            .sessions
            .keys()
            .map(|id| (id.as_str(), Vec::new()))
            .collect();
        for agent in self.agents.values() {
            by_session
                .entry(agent.session_id.as_str())
                .or_default()
                .push(agent);
        }
        let mut sessions: Vec<(&str, Vec<&Agent>)> = by_session.into_iter().collect();
        let session_key = |(id, agents): &(&str, Vec<&Agent>)| {
            let created = match self.sessions.get(*id) {
                Some(session) => time_key(session.created_at.as_ref()),
                None => agents
                    .iter()
                    .map(|a| time_key(a.created_at.as_ref()))
                    .min()
                    .unwrap_or((i64::MIN, 0)),
            };
            (created, id.to_string())
        };
        sessions.sort_by_cached_key(session_key);
        let mut rows = Vec::new();
        for (session_id, agents) in sessions {
            let model = self
                .sessions
                .get(session_id)
                .map(|s| s.model.clone())
                .unwrap_or_default();
            let totals = Totals::of(agents.iter().copied());
            rows.push(Row {
                level: Level::Session,
                depth: 0,
                session_id: session_id.to_owned(),
                batch_id: None,
                agent_id: None,
                kind: "session".into(),
                state: totals.counts.group_state().into(),
                label: model,
                totals,
            });
            session_rows(&agents, &mut rows);
        }
        rows
    }
}

/// What a session holds: its main loop first, then batches and the other agents by creation.
fn session_rows(agents: &[&Agent], rows: &mut Vec<Row>) {
    enum Item<'a> {
        Agent(&'a Agent),
        Batch(&'a str, Vec<&'a Agent>),
    }
    let mut batches: BTreeMap<&str, Vec<&Agent>> = BTreeMap::new();
    let mut items: Vec<Item> = Vec::new();
    for agent in agents {
        if agent.batch_id.is_empty() {
            items.push(Item::Agent(agent));
        } else {
            batches.entry(&agent.batch_id).or_default().push(agent);
        }
    }
    items.extend(batches.into_iter().map(|(id, mut children)| {
        children.sort_by_key(|a| (a.index, time_key(a.created_at.as_ref()), &a.agent_id));
        Item::Batch(id, children)
    }));
    items.sort_by_cached_key(|item| match item {
        Item::Agent(a) => (
            a.kind != "parent",
            time_key(a.created_at.as_ref()),
            a.agent_id.clone(),
        ),
        Item::Batch(id, children) => (
            true,
            children
                .iter()
                .map(|a| time_key(a.created_at.as_ref()))
                .min()
                .unwrap_or((i64::MIN, 0)),
            id.to_string(),
        ),
    });
    for item in items {
        match item {
            Item::Agent(agent) => rows.push(agent_row(agent, 1)),
            Item::Batch(batch_id, children) => {
                let totals = Totals::of(children.iter().copied());
                rows.push(Row {
                    level: Level::Batch,
                    depth: 1,
                    session_id: children
                        .first()
                        .map(|a| a.session_id.clone())
                        .unwrap_or_default(),
                    batch_id: Some(batch_id.to_owned()),
                    agent_id: None,
                    kind: "batch".into(),
                    state: totals.counts.group_state().into(),
                    label: String::new(),
                    totals,
                });
                rows.extend(children.iter().map(|a| agent_row(a, 2)));
            }
        }
    }
}

fn agent_row(agent: &Agent, depth: usize) -> Row {
    Row {
        level: Level::Agent,
        depth,
        session_id: agent.session_id.clone(),
        batch_id: (!agent.batch_id.is_empty()).then(|| agent.batch_id.clone()),
        agent_id: Some(agent.agent_id.clone()),
        kind: agent.kind.clone(),
        state: agent_state_label(agent).into(),
        label: agent.description.clone(),
        totals: Totals::of([agent]),
    }
}

#[cfg(test)]
pub(crate) mod tests;
