//! Model calls: the one pipeline every agent's request goes through — a fork child's, a typed
//! agent's and a parent turn's. It builds the body, sends it through the limiter of its
//! credential and model (`admission`: when it may go, and what happens after a refusal), and
//! records it: prefix parts and fingerprint, time to first token, cost, metrics.

use std::sync::Arc;
use std::time::Duration;

use forkd_core::pricing::{CacheTtl, Models};
use forkd_core::query::RequestRecord;
use forkd_core::request::{self, BlockPos, Conversation, SerializedRequest, fingerprint};
use forkd_core::session::CacheSafeParams;
use forkd_core::store::{PrefixPart, Store};
use forkd_core::{Agent, RequestId, Usage};
use forkd_provider::{
    Accumulator, Completion, Credential, ModelRequest, Provider, ProviderError, StreamEvent,
};
use futures::StreamExt;
use tracing::Instrument;
use tracing::field::Empty;

use tokio_util::sync::CancellationToken;

use crate::admission::{Admission, Class, Cost, LimitKey, Observer, Refused, Ticket};
use crate::clock::now_ms;
use crate::config::AdmissionConfig;
use crate::error::{EngineError, Result};
use crate::tenancy::Tenancy;
use crate::window::Window;

/// A completed model request and how long it took, retries and their waits included.
pub(crate) struct Timed {
    pub completion: Completion,
    /// To the end of the response.
    pub took: Duration,
    /// To the response's first content block (time to first token); `None` when it had none.
    pub first_token: Option<Duration>,
}

/// Where a request's recorded prefix ends: the bytes before it are what a request must share
/// with its siblings (a fork child) or with the agent's next request (a main loop).
#[derive(Debug, Clone, Copy)]
pub(crate) enum PrefixEnd {
    /// Before this block: the agent's own first block (a fork child's directive, a typed
    /// agent's prompt).
    Before(BlockPos),
    /// Before the conversation's last block: a main-loop request, whose last block is what the
    /// turn just added (the user's message, or tool results).
    LastBlock,
}

/// A request body and where its recorded prefix ends (`None` when the block it should end
/// before is not in the body).
pub(crate) struct Built {
    pub body: SerializedRequest,
    pub prefix_end: Option<usize>,
}

/// Builds a request body. Cache diagnostics rebuild recorded requests with this same function,
/// so what they compare is what was sent.
pub(crate) fn build(
    params: &CacheSafeParams,
    conversation: &Conversation,
    prefix: PrefixEnd,
) -> Built {
    let body = request::serialize(params, conversation, true);
    let prefix_end = match prefix {
        PrefixEnd::Before(pos) => body.span(pos).map(|s| s.start),
        PrefixEnd::LastBlock => Some(body.spans.last().map_or(body.body.len(), |s| s.start)),
    };
    Built { body, prefix_end }
}

/// Cuts `body[..end]` into its parts: the head (model, max_tokens, stream, thinking), the tools
/// array, the system prompt, and each message that starts before `end`. `tools_len` is the
/// length of the tools array's bytes (which sit right after `,"tools":`).
pub(crate) fn prefix_parts(
    body: &SerializedRequest,
    tools_len: usize,
    end: usize,
) -> Vec<PrefixPart> {
    let bytes = body.body.as_bytes();
    let end = end.min(bytes.len());
    let mut cuts: Vec<(String, usize)> = vec![("head".to_owned(), 0)];
    // The model name is a JSON string, so an unescaped `,"tools":` can only be the field itself.
    if let Some(at) = body.body.find(r#","tools":"#) {
        let tools = at + r#","tools":"#.len();
        cuts.push(("tools".to_owned(), tools));
        cuts.push(("system".to_owned(), tools + tools_len));
    }
    // One part per message, not per block: a fork message holds a block per sibling, and parts
    // per block would make every child's record grow with the batch (explain still finds the
    // byte by rebuilding the bodies).
    for span in body.spans.iter().filter(|s| s.pos.block == 0) {
        cuts.push((format!("message {}", span.pos.message), span.start));
    }
    cuts.retain(|(_, at)| *at < end || *at == 0);
    let mut parts = Vec::with_capacity(cuts.len());
    for (i, (label, start)) in cuts.iter().enumerate() {
        let stop = cuts.get(i + 1).map_or(end, |(_, next)| *next).min(end);
        let slice = bytes.get(*start..stop.max(*start)).unwrap_or_default();
        parts.push(PrefixPart {
            label: label.clone(),
            offset: *start as u64,
            digest: fingerprint(slice)[..16].to_owned(),
        });
    }
    parts
}

/// A request's cost at the model's prices (0 for a model nobody priced).
pub(crate) fn cost(models: &Models, model: &str, usage: &Usage) -> f64 {
    models
        .get(model)
        .map(|m| usage.cost_usd(m, CacheTtl::FiveMinutes))
        .unwrap_or(0.0)
}

/// One model request of an agent.
pub(crate) struct ModelCall<'a> {
    pub agent: &'a Agent,
    /// The agent's request number: a child's turns so far, or the request within a parent turn.
    pub turn: u32,
    pub params: &'a CacheSafeParams,
    pub conversation: &'a Conversation,
    pub prefix: PrefixEnd,
    /// The request's input tokens when the caller knows them from the counts the engine keeps;
    /// `None`: the window check reads the body (counting it only when it is big).
    pub input_tokens: Option<u64>,
    /// For a fork child's first request: its batch's slot for the trace context of the
    /// batch's first request, the one that writes the shared prefix. The first to come fills
    /// it; the others link their span to it.
    pub prefix_writer: Option<&'a std::sync::Mutex<Option<String>>>,
}

/// A model's answer and the record stored for it.
pub(crate) struct Answer {
    pub completion: Completion,
    pub record: RequestRecord,
}

impl ModelCalls {
    /// What each provider key's limiter believes now.
    pub(crate) fn capacity(&self) -> Vec<crate::admission::KeyCapacity> {
        self.admission.capacity()
    }
}

/// The one model-call layer: every agent's requests are built, checked against their window,
/// admitted by their key's limiter, sent and recorded here.
pub(crate) struct ModelCalls {
    store: Arc<dyn Store>,
    provider: Arc<dyn Provider>,
    /// Whose limits the provider's requests count against.
    credential: Credential,
    /// When model requests may go, per credential and model, and what follows a refusal.
    admission: Admission,
    window: Arc<Window>,
    /// Tenants (the limiter's fair queue) and budgets (a wait ends once one is spent).
    tenancy: Arc<Tenancy>,
    /// Prices, for each request's cost.
    models: Models,
    /// Cancelled when shutdown begins: a request waiting for admission stops waiting.
    draining: CancellationToken,
    /// Messages and replies on the trace spans (`EngineConfig::trace_content`).
    trace_content: bool,
}

/// What the model-call layer is made of.
pub(crate) struct ModelCallParts {
    pub store: Arc<dyn Store>,
    pub provider: Arc<dyn Provider>,
    pub admission: AdmissionConfig,
    pub window: Arc<Window>,
    pub tenancy: Arc<Tenancy>,
    pub models: Models,
    pub draining: CancellationToken,
    pub trace_content: bool,
}

impl ModelCalls {
    pub(crate) fn new(parts: ModelCallParts) -> Self {
        Self {
            credential: parts.provider.credential(),
            admission: Admission::new(parts.admission),
            store: parts.store,
            provider: parts.provider,
            window: parts.window,
            tenancy: parts.tenancy,
            models: parts.models,
            draining: parts.draining,
            trace_content: parts.trace_content,
        }
    }

    /// Builds, sends and records one model request; `on_event` sees the response's events as
    /// they arrive (a gate opens on `MessageStart`, a parent streams text to its client).
    pub(crate) async fn call(
        &self,
        call: ModelCall<'_>,
        on_event: &mut (dyn FnMut(&StreamEvent) + Send),
    ) -> Result<Answer> {
        let Built { body, prefix_end } = build(call.params, call.conversation, call.prefix);
        self.window
            .check_request(call.params, &body.body, call.input_tokens)
            .await?;
        let prefix_fingerprint = prefix_end
            .map(|end| fingerprint(&body.body.as_bytes()[..end]))
            .unwrap_or_default();
        let prefix_parts = prefix_parts(
            &body,
            call.params.tools.raw().len(),
            prefix_end.unwrap_or(0),
        );
        let body_bytes = body.body.len() as u64;
        let id = RequestId::new();
        let model = &call.params.model;
        // The OpenTelemetry GenAI conventions' names; forkd's own under `forkd.`. No prompt or
        // completion text: it may hold secrets.
        let span = tracing::info_span!(
            "model_request",
            otel.name = %format!("chat {model}"),
            otel.kind = "client",
            otel.status_code = Empty,
            otel.status_description = Empty,
            request.id = %id,
            turn = call.turn,
            body_bytes = crate::trace::int(body_bytes),
            gen_ai.operation.name = "chat",
            gen_ai.provider.name = self.provider.name(),
            gen_ai.request.model = %model,
            gen_ai.request.max_tokens = i64::from(call.params.max_tokens),
            gen_ai.usage.input_tokens = Empty,
            gen_ai.usage.output_tokens = Empty,
            gen_ai.usage.cache_read.input_tokens = Empty,
            gen_ai.usage.cache_creation.input_tokens = Empty,
            gen_ai.response.finish_reasons = Empty,
            forkd.agent.id = %call.agent.id,
            forkd.agent.kind = call.agent.kind.as_str(),
            forkd.batch.id = Empty,
            forkd.prefix_fingerprint = %prefix_fingerprint,
            forkd.admission_wait_ms = Empty,
            gen_ai.input.messages = Empty,
            gen_ai.output.messages = Empty,
        );
        if let Some(batch) = call.agent.batch_id {
            span.record("forkd.batch.id", tracing::field::display(batch));
        }
        if let Some(slot) = call.prefix_writer {
            let mut writer = slot.lock().unwrap_or_else(|p| p.into_inner());
            match writer.as_deref() {
                Some(first) => crate::trace::link(&span, first),
                None => *writer = crate::trace::traceparent(&span),
            }
        }
        let req = ModelRequest {
            model: model.clone(),
            body: body.body.into(),
        };
        if self.trace_content
            && let Ok(body) = serde_json::from_str::<serde_json::Value>(&req.body)
        {
            span.record("gen_ai.input.messages", body["messages"].to_string());
        }
        let sent_at_ms = now_ms();
        let sent = async {
            let admitted = std::time::Instant::now();
            let ticket = self
                .ticket(&call, &req, &prefix_fingerprint, prefix_end)
                .await?;
            tracing::Span::current().record(
                "forkd.admission_wait_ms",
                crate::trace::int(crate::clock::millis(admitted.elapsed())),
            );
            self.send(req, ticket, call.agent, &prefix_fingerprint, on_event)
                .await
        }
        .instrument(span.clone())
        .await;
        let timed = match sent {
            Ok(timed) => timed,
            Err(e) => {
                span.record("otel.status_code", "ERROR");
                span.record("otel.status_description", tracing::field::display(&e));
                return Err(e);
            }
        };
        let completion = timed.completion;
        let usage = &completion.usage;
        // As i64: the OpenTelemetry layer records unsigned values as text.
        let int = crate::trace::int;
        span.record("gen_ai.usage.input_tokens", int(usage.total_input()));
        span.record("gen_ai.usage.output_tokens", int(usage.output_tokens));
        span.record(
            "gen_ai.usage.cache_read.input_tokens",
            int(usage.cache_read_input_tokens),
        );
        span.record(
            "gen_ai.usage.cache_creation.input_tokens",
            int(usage.cache_creation_input_tokens),
        );
        if let Some(reason) = &completion.stop_reason {
            span.record("gen_ai.response.finish_reasons", reason.as_str());
        }
        if self.trace_content {
            let output = serde_json::json!([{
                "role": "assistant",
                "content": serde_json::from_str::<serde_json::Value>(&completion.message.content_json())
                    .unwrap_or_default(),
            }]);
            span.record("gen_ai.output.messages", output.to_string());
        }
        let record = RequestRecord {
            id,
            agent_id: call.agent.id,
            session_id: call.agent.session_id,
            batch_id: call.agent.batch_id,
            turn: call.turn,
            model: model.clone(),
            usage: completion.usage,
            cost_usd: cost(&self.models, model, &completion.usage),
            prefix_fingerprint,
            prefix_parts,
            message_count: u32::try_from(call.conversation.messages.len()).ok(),
            body_bytes,
            first_token_ms: timed.first_token.map(crate::clock::millis),
            stop_reason: completion.stop_reason.clone(),
            sent_at_ms: Some(sent_at_ms),
            created_at_ms: now_ms(),
        };
        self.store.record_request(&record).instrument(span).await?;
        crate::metrics::request(
            model,
            call.agent.kind.as_str(),
            &record.usage,
            record.cost_usd,
            timed.took,
            timed.first_token,
        );
        Ok(Answer { completion, record })
    }

    /// The limit a request counts against.
    fn limit_key(&self, model: &str) -> LimitKey {
        LimitKey {
            credential: self.credential.clone(),
            model: model.to_owned(),
        }
    }

    /// What a request asks of its limiter: who sends it, how urgent it is, and what it costs —
    /// its input tokens the cache will not serve, and its `max_tokens`.
    async fn ticket(
        &self,
        call: &ModelCall<'_>,
        req: &ModelRequest,
        fingerprint: &str,
        prefix_end: Option<usize>,
    ) -> Result<Ticket> {
        let tenant = self.tenancy.session_owner(call.agent.session_id).await?;
        let bytes = req.body.len().max(1) as u64;
        // The counts the engine keeps, or about four bytes a token.
        let total = call.input_tokens.unwrap_or(bytes / 4);
        let prefix = prefix_end.map_or(0, |end| total.saturating_mul(end as u64) / bytes);
        let uncached = self.admission.uncached_estimate(
            &self.limit_key(&req.model),
            call.agent.id.as_uuid().as_u128(),
            fingerprint,
            total,
            prefix,
        );
        Ok(Ticket {
            tenant,
            class: match call.agent.kind {
                forkd_core::AgentKind::Parent => Class::Interactive,
                forkd_core::AgentKind::Fork | forkd_core::AgentKind::Typed => Class::Batch,
            },
            cost: Cost {
                input_tokens: uncached as f64,
                output_tokens: f64::from(call.params.max_tokens),
            },
            prefix: (!fingerprint.is_empty()).then(|| Arc::from(fingerprint)),
        })
    }

    /// Sends a request through its limiter — waiting for admission, and again after a refusal
    /// while patience lasts — and times it.
    async fn send(
        &self,
        req: ModelRequest,
        ticket: Ticket,
        agent: &Agent,
        fingerprint: &str,
        on_event: &mut (dyn FnMut(&StreamEvent) + Send),
    ) -> Result<Timed> {
        let started = std::time::Instant::now();
        let mut first_token = None;
        let mut timing = |event: &StreamEvent| {
            if first_token.is_none() && event.starts_output() {
                let took = started.elapsed();
                first_token = Some(took);
                // A span event at the moment it came (docs/operations.md, "Tracing").
                // Debug: not a log line at the default level, but the trace's layer takes it.
                tracing::event!(
                    name: "gen_ai.first_token",
                    tracing::Level::DEBUG,
                    first_token_ms = crate::trace::int(crate::clock::millis(took)),
                    "gen_ai.first_token"
                );
            }
            // The provider's limits are not output; everything else the response sends is
            // progress for the agent's idle timeout.
            if !matches!(event, StreamEvent::RateLimits(_)) {
                crate::progress::touch();
            }
            on_event(event);
        };
        let key = self.limit_key(&req.model);
        let agent_key = agent.id.as_uuid().as_u128();
        let mut attempts = self.admission.request(&key, ticket);
        let stop = &self.draining;
        let mut mark = ThrottleMark {
            store: &self.store,
            agent: agent.id,
            set: false,
        };
        let completion = loop {
            // Once refused, a request's waits also end when its budget is spent meanwhile (by
            // its siblings, or the tenant's other work): it would be refused for that next.
            let observer = {
                // Queued by the limiter: waiting on the provider's limits, not idle.
                let _waiting = crate::progress::waiting();
                tokio::select! {
                    admitted = attempts.admit(stop) => admitted.map_err(refused)?,
                    spent = self.budget_spent(agent), if mark.set => return Err(spent),
                }
            };
            let sent = Sent {
                observer: &observer,
                agent: agent_key,
                fingerprint,
            };
            match self.request_once(req.clone(), &sent, &mut timing).await {
                Ok(completion) => {
                    attempts.succeeded();
                    break completion;
                }
                Err(e) => {
                    if e.is_retryable() {
                        mark.set(now_ms()).await;
                    }
                    let _waiting = crate::progress::waiting();
                    tokio::select! {
                        waited = attempts.failed(e, stop) => waited.map_err(refused)?,
                        spent = self.budget_spent(agent), if mark.set => return Err(spent),
                    }
                }
            }
        };
        mark.clear().await;
        Ok(Timed {
            completion,
            took: started.elapsed(),
            first_token,
        })
    }

    /// Resolves when `agent`'s batch or tenant budget is spent: checked once a second, for as
    /// long as the agent waits on the provider's limits. A store error is logged and checked
    /// again: a wait is never cut short by the database.
    async fn budget_spent(&self, agent: &Agent) -> EngineError {
        loop {
            tokio::time::sleep(BUDGET_CHECK).await;
            match self
                .tenancy
                .check_budgets(agent.session_id, agent.batch_id)
                .await
            {
                Ok(()) => {}
                Err(spent @ EngineError::BudgetSpent { .. }) => return spent,
                Err(e) => tracing::warn!(error = %e, "Cannot check the budgets during a wait"),
            }
        }
    }

    /// One attempt: the response's events to `on_event`, and what they say of the limits and
    /// the usage to the limiter.
    async fn request_once(
        &self,
        req: ModelRequest,
        sent: &Sent<'_>,
        on_event: &mut (dyn FnMut(&StreamEvent) + Send),
    ) -> Result<Completion, ProviderError> {
        let mut stream = self.provider.stream(req);
        let mut acc = Accumulator::default();
        while let Some(event) = stream.next().await {
            let event = event?;
            match &event {
                StreamEvent::RateLimits(limits) => sent.observer.limits(limits),
                StreamEvent::MessageStart { usage, .. }
                | StreamEvent::MessageDelta {
                    usage: Some(usage), ..
                } => sent.observer.started(sent.agent, sent.fingerprint, usage),
                _ => {}
            }
            on_event(&event);
            acc.push(&event)?;
        }
        let completion = acc.finish()?;
        sent.observer.finished(completion.usage.output_tokens);
        Ok(completion)
    }
}

/// How often a request waiting on the provider's limits checks its budgets.
const BUDGET_CHECK: Duration = Duration::from_secs(1);

/// An agent's stored `throttled` mark ([`forkd_core::Agent::throttled_since_ms`]): set at its
/// request's first refusal, cleared when the request goes through, fails, or is dropped (a kill).
/// A write that fails only leaves `ps` behind; it is logged.
struct ThrottleMark<'a> {
    store: &'a Arc<dyn Store>,
    agent: forkd_core::AgentId,
    set: bool,
}

impl ThrottleMark<'_> {
    async fn set(&mut self, since_ms: i64) {
        if self.set {
            return;
        }
        self.set = true;
        crate::progress::throttled(true);
        if let Err(e) = self.store.set_throttled(self.agent, Some(since_ms)).await {
            tracing::warn!(error = %e, "Cannot record that the agent is throttled");
        }
    }

    async fn clear(mut self) {
        if self.set {
            crate::progress::throttled(false);
        }
        if std::mem::take(&mut self.set)
            && let Err(e) = self.store.set_throttled(self.agent, None).await
        {
            tracing::warn!(error = %e, "Cannot record that the agent is no longer throttled");
        }
    }
}

impl Drop for ThrottleMark<'_> {
    fn drop(&mut self) {
        if !self.set {
            return;
        }
        crate::progress::throttled(false);
        let store = Arc::clone(self.store);
        let agent = self.agent;
        tokio::spawn(async move {
            if let Err(e) = store.set_throttled(agent, None).await {
                tracing::warn!(error = %e, "Cannot record that the agent is no longer throttled");
            }
        });
    }
}

/// What an attempt reports to the limiter with.
struct Sent<'a> {
    observer: &'a Observer,
    agent: u128,
    fingerprint: &'a str,
}

/// A request that did not go: the provider's error, or the drain of a shutdown.
fn refused(r: Refused) -> EngineError {
    match r {
        Refused::Provider(e) => EngineError::Provider(e),
        Refused::Stopped => EngineError::Draining,
    }
}
