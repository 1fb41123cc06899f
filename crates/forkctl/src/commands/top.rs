//! `forkctl top`: a live view of the agents, as a tree of sessions → batches → children (and
//! each session's main loop and typed agents), with their state, tokens, cache-read share and
//! cost under a header of totals.
//!
//! It loads everything once (`ListSessions`, `ListAgents`), then follows the notification
//! stream (an agent that ends is updated from its notification) and polls the live agents every
//! second for their running token counts. Off a terminal, and with `--json`, it prints that
//! first load as one JSON object per row and exits. [`model`] builds the rows, [`view`] draws
//! them.

mod model;
mod view;

use std::io::IsTerminal as _;
use std::time::Duration;

use clap::Args;
use forkd_proto::v1::{
    GetAgentRequest, GetSessionRequest, ListAgentsRequest, Notification,
    SubscribeNotificationsRequest,
};
use ratatui::DefaultTerminal;
use ratatui::crossterm::event::{self, Event};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tokio::time::MissedTickBehavior;
use tonic::Streaming;

use crate::client::Client;
use crate::commands::{ps, session};
use crate::exit;
use crate::output::Printer;
use model::Model;
use view::{Action, ViewState};

#[derive(Debug, Args)]
pub struct TopArgs {
    /// Only this session's agents.
    #[arg(long, value_name = "ID")]
    pub session: Option<String>,
}

/// How often the live agents' token counts are refreshed.
const POLL_EVERY: Duration = Duration::from_secs(1);

/// A call that takes longer is given up until the next poll: the view must stay responsive.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// Redraws are coalesced to at most one per frame (a replayed stream brings many at once).
const FRAME: Duration = Duration::from_millis(50);

pub async fn run(args: TopArgs, client: &mut Client, out: &Printer) -> anyhow::Result<u8> {
    let scope = args.session.unwrap_or_default();
    let mut model = Model::default();
    load(client, &scope, &mut model).await?;
    if out.is_json() || !std::io::stdout().is_terminal() {
        for row in model.rows() {
            out.value(&row.to_json())?;
        }
        return Ok(exit::OK);
    }
    let mut live = Live {
        model,
        client: client.clone(),
        scope,
        stream: None,
        last_seq: 0,
        status: None,
    };
    // Restores the terminal however the loop ends: `q`, an error (`?`), or a panic (ratatui's
    // panic hook restores it first, and this guard again on unwinding; twice is harmless).
    let _restore = RestoreOnDrop;
    let terminal = ratatui::try_init()?;
    live.run(terminal).await
}

/// Sessions and agents in view: every one, or `scope`'s (an unknown session is `not found`).
async fn load(client: &mut Client, scope: &str, model: &mut Model) -> anyhow::Result<()> {
    if scope.is_empty() {
        session::list_sessions(client, |page| {
            page.into_iter().for_each(|s| model.add_session(s));
            Ok(())
        })
        .await?;
    } else {
        let request = GetSessionRequest {
            session_id: scope.to_owned(),
        };
        let reply = client.get_session(request).await?.into_inner();
        model.add_session(reply.session.unwrap_or_default());
    }
    let filter = ListAgentsRequest {
        session_id: scope.to_owned(),
        include_ended: true,
        ..Default::default()
    };
    ps::list_agents(client, filter, |page| {
        page.into_iter().for_each(|a| model.upsert_agent(a));
        Ok(())
    })
    .await
}

struct RestoreOnDrop;

impl Drop for RestoreOnDrop {
    fn drop(&mut self) {
        ratatui::restore();
    }
}

/// The live view's state: the model, the connection, and what went wrong with it last.
struct Live {
    model: Model,
    client: Client,
    /// Sessions filter (empty: all).
    scope: String,
    /// The notifications; `None` until subscribed, and again once broken until the next poll.
    stream: Option<Streaming<Notification>>,
    /// The last notification seen: a stream that breaks is picked up after it.
    last_seq: u64,
    /// For the footer: why the figures may be stale.
    status: Option<String>,
}

impl Live {
    /// Until a key asks to quit. Calls to the daemon are made while still answering the keys, so
    /// a daemon slow to answer never holds `q` up.
    async fn run(&mut self, mut terminal: DefaultTerminal) -> anyhow::Result<u8> {
        let mut keys = spawn_key_reader();
        let mut view = ViewState::default();
        // The first tick is at once: it subscribes.
        let mut poll = tokio::time::interval(POLL_EVERY);
        poll.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut frame = tokio::time::interval(FRAME);
        frame.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut dirty = true;
        // `kill` and a closed terminal end the view the way `q` does, so the terminal is restored.
        let mut terminate = signal(SignalKind::terminate())?;
        let mut hangup = signal(SignalKind::hangup())?;
        let mut interrupt = signal(SignalKind::interrupt())?;
        // A key that quits exits 0; a signal exits as the shell reports a process it killed
        // (128 + the signal's number), so a script can tell the two apart.
        let quit = |asked: bool| asked.then_some(exit::OK);
        loop {
            let code = tokio::select! {
                _ = terminate.recv() => Some(exit::signalled(SignalKind::terminate())),
                _ = hangup.recv() => Some(exit::signalled(SignalKind::hangup())),
                _ = interrupt.recv() => Some(exit::signalled(SignalKind::interrupt())),
                key = keys.recv() => {
                    dirty = true;
                    quit(on_event(key, &mut view)?)
                }
                next = next_notification(&mut self.stream) => {
                    dirty = true;
                    quit(answering_keys(self.on_stream(next), &mut keys, &mut view).await?)
                }
                _ = poll.tick() => {
                    dirty = true;
                    quit(answering_keys(self.refresh(), &mut keys, &mut view).await?)
                }
                _ = frame.tick(), if dirty => {
                    view.status.clone_from(&self.status);
                    draw(&mut terminal, &self.model, &mut view)?;
                    dirty = false;
                    None
                }
            };
            if let Some(code) = code {
                return Ok(code);
            }
        }
    }

    /// Every second: the stream again if it broke, and the live agents' figures.
    async fn refresh(&mut self) {
        self.status = None;
        if self.stream.is_none() {
            self.subscribe().await;
        }
        self.poll().await;
    }

    /// Follows the notifications after the last one seen (the first time, all of them: each
    /// brings an ended agent's final figures, which the load may have missed).
    async fn subscribe(&mut self) {
        let request = SubscribeNotificationsRequest {
            since_seq: self.last_seq,
            session_id: self.scope.clone(),
            follow: true,
            ..Default::default()
        };
        match within(self.client.subscribe_notifications(request)).await {
            Ok(reply) => self.stream = Some(reply.into_inner()),
            Err(message) => self.status = Some(format!("notifications: {message}; retrying")),
        }
    }

    async fn on_stream(&mut self, next: Result<Option<Notification>, tonic::Status>) {
        let why = match next {
            Ok(Some(n)) => return self.on_notification(&n).await,
            Ok(None) => "the daemon closed the stream".to_owned(),
            Err(status) => say(status),
        };
        self.stream = None;
        self.status = Some(format!("notifications: {why}; reconnecting"));
    }

    /// An agent ended: its row is updated from the notification, and an agent not seen before
    /// (one that began and ended between two polls) is fetched for its kind and description.
    async fn on_notification(&mut self, n: &Notification) {
        self.last_seq = self.last_seq.max(n.seq);
        if !self.model.apply_notification(n) {
            self.refresh_agents(vec![n.agent_id.clone()]).await;
        }
    }

    /// The live agents' counts; agents that ended since the last poll are fetched whole, and
    /// sessions seen for the first time too.
    async fn poll(&mut self) {
        let request = ListAgentsRequest {
            session_id: self.scope.clone(),
            include_ended: false,
            ..Default::default()
        };
        let mut live = Vec::new();
        let listing = ps::list_agents(&mut self.client, request, |page| {
            live.extend(page);
            Ok(())
        });
        match tokio::time::timeout(CALL_TIMEOUT, listing).await {
            Ok(Ok(())) => {
                let ended = self.model.apply_poll(live);
                self.refresh_agents(ended).await;
            }
            Ok(Err(err)) => self.status = Some(format!("cannot list agents: {}", say(err))),
            Err(_) => self.status = Some("the daemon is slow to answer".into()),
        }
        for session_id in self.model.unknown_sessions() {
            let request = GetSessionRequest { session_id };
            if let Ok(reply) = within(self.client.get_session(request)).await
                && let Some(session) = reply.into_inner().session
            {
                self.model.add_session(session);
            }
        }
    }

    async fn refresh_agents(&mut self, ids: Vec<String>) {
        for agent_id in ids {
            let request = GetAgentRequest { agent_id };
            if let Ok(reply) = within(self.client.get_agent(request)).await
                && let Some(agent) = reply.into_inner().agent
            {
                self.model.upsert_agent(agent);
            }
        }
    }
}

/// A call under [`CALL_TIMEOUT`]; its error as a line for the footer.
async fn within<T>(call: impl Future<Output = Result<T, tonic::Status>>) -> Result<T, String> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(Ok(reply)) => Ok(reply),
        Ok(Err(status)) => Err(say(status)),
        Err(_) => Err("no answer in time".to_owned()),
    }
}

/// An error as one line for people (`UNAVAILABLE: …`), as `main` would print it.
fn say(err: impl Into<anyhow::Error>) -> String {
    exit::classify(&err.into()).message
}

/// The next notification, or never while there is no stream (the poll reconnects it).
async fn next_notification(
    stream: &mut Option<Streaming<Notification>>,
) -> Result<Option<Notification>, tonic::Status> {
    match stream {
        Some(stream) => stream.message().await,
        None => std::future::pending().await,
    }
}

fn draw(terminal: &mut DefaultTerminal, model: &Model, view: &mut ViewState) -> anyhow::Result<()> {
    let (rows, totals) = (model.rows(), model.totals());
    terminal.draw(|frame| view::render(frame, &rows, &totals, view))?;
    Ok(())
}

/// A terminal event: keys act on the view; `true` when one asks to quit.
fn on_event(event: Option<Event>, view: &mut ViewState) -> anyhow::Result<bool> {
    match event {
        Some(Event::Key(key)) => Ok(view::on_key(key, view) == Action::Quit),
        // A resize, a focus change: the next frame redraws.
        Some(_) => Ok(false),
        None => anyhow::bail!("cannot read the terminal's keys"),
    }
}

/// Runs `work` while answering the keys; `true` when one asked to quit (the work is dropped).
async fn answering_keys(
    work: impl Future<Output = ()>,
    keys: &mut mpsc::UnboundedReceiver<Event>,
    view: &mut ViewState,
) -> anyhow::Result<bool> {
    let mut work = std::pin::pin!(work);
    loop {
        tokio::select! {
            () = &mut work => return Ok(false),
            key = keys.recv() => if on_event(key, view)? {
                return Ok(true);
            },
        }
    }
}

/// Reads the terminal's events on a thread of its own (crossterm's reads block) and hands them
/// over; the thread ends when the receiver is dropped or reading fails.
fn spawn_key_reader() -> mpsc::UnboundedReceiver<Event> {
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        while !tx.is_closed() {
            match event::poll(Duration::from_millis(100)) {
                Ok(false) => continue,
                Ok(true) => {}
                Err(_) => return,
            }
            let Ok(event) = event::read() else { return };
            if tx.send(event).is_err() {
                return;
            }
        }
    });
    rx
}
