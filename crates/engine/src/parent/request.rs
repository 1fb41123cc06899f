//! A parent's model request: its transcript from the latest compaction boundary, compacted first
//! when the request would pass the threshold (`Compactor::request_compacting`), its text
//! streamed to the client.

use std::sync::Arc;

use forkd_core::request::Conversation;
use forkd_core::session::Session;
use forkd_core::store::Lease;
use forkd_core::{Agent, Message};
use forkd_provider::{Completion, StreamEvent};

use super::{Events, ParentEvent, Turns};
use crate::compact::{Compacting, ParentView};
use crate::error::Result;
use crate::model::{ModelCall, PrefixEnd};

impl Turns {
    /// One model request of the parent on its transcript (from its latest compaction boundary),
    /// streaming text to the client; compacting the transcript first when the request would
    /// pass the compaction threshold.
    pub(super) async fn parent_request(
        self: &Arc<Self>,
        session: &Session,
        parent: &Agent,
        lease: &Lease,
        turn: u32,
        events: &Events,
    ) -> Result<Completion> {
        let mut main_loop = MainLoop {
            turns: self,
            session,
            parent,
            lease,
            turn,
            events,
            view: None,
        };
        self.compaction.request_compacting(&mut main_loop).await
    }

    /// Sends one parent request on `messages`, streaming its text to the client.
    async fn parent_call(
        self: &Arc<Self>,
        session: &Session,
        parent: &Agent,
        turn: u32,
        messages: Vec<Message>,
        input_tokens: u64,
        events: &Events,
    ) -> Result<Completion> {
        let call = ModelCall {
            agent: parent,
            turn,
            params: &session.params,
            conversation: &Conversation::main_loop(messages, session.reply_breakpoint),
            prefix: PrefixEnd::LastBlock,
            input_tokens: Some(input_tokens),
            prefix_writer: None,
        };
        let tx = events.clone();
        let answer = self
            .calls
            .call(call, &mut |event| {
                if let StreamEvent::TextDelta { text, .. } = event {
                    // A full queue means a slow reader: it misses a delta, never the turn.
                    let _ = tx.try_send(Ok(ParentEvent::TextDelta(text.clone())));
                }
            })
            .await?;
        Ok(answer.completion)
    }
}

/// A parent request, as [`crate::compact::Compactor::request_compacting`] makes it: the transcript is read once
/// per attempt — by the count, whose view the request then sends, or again after a compaction.
struct MainLoop<'a> {
    turns: &'a Arc<Turns>,
    session: &'a Session,
    parent: &'a Agent,
    lease: &'a Lease,
    turn: u32,
    events: &'a Events,
    /// The transcript as the last count read it: the next request's, unless a compaction came
    /// in between.
    view: Option<ParentView>,
}

impl Compacting for MainLoop<'_> {
    type Answer = Completion;
    const WHAT: &'static str = "the transcript";

    fn params(&self) -> &forkd_core::session::CacheSafeParams {
        &self.session.params
    }

    async fn tokens(&mut self) -> Result<u64> {
        let compaction = &self.turns.compaction;
        let view = compaction.parent_view(self.session).await?;
        // The main loop's request is the session's transcript: its counts are kept.
        let tokens = compaction.view_tokens(self.session, &view).await?;
        self.view = Some(view);
        Ok(tokens)
    }

    async fn compact(&mut self) -> Result<()> {
        self.view = None;
        let (session, parent, lease) = (self.session, self.parent, self.lease);
        let cancel = self.turns.shutdown.child_token();
        self.turns
            .runs
            .pre_compact_hooks(parent, session, "auto", None, &cancel)
            .await;
        self.turns
            .compaction
            .compact(session, parent, lease, self.turn, None)
            .await
            .map(drop)
    }

    async fn request(&mut self, counted: u64) -> Result<Completion> {
        let turns = self.turns;
        let (view, input_tokens) = match self.view.take() {
            Some(view) => (view, counted),
            None => {
                let view = turns.compaction.parent_view(self.session).await?;
                let tokens = turns.compaction.view_tokens(self.session, &view).await?;
                (view, tokens)
            }
        };
        turns
            .parent_call(
                self.session,
                self.parent,
                self.turn,
                view.messages,
                input_tokens,
                self.events,
            )
            .await
    }
}
