//! Cache diagnostics: each request's prefix cut into parts with short digests (recorded with the
//! request), the check that a fork child's first request shares its first sibling's prefix, and
//! `explain`, which finds the part and the byte where two requests' bodies part.
//!
//! Bodies are not stored: `explain` rebuilds them from the transcript with the same code a run
//! uses, and trusts a rebuilt body only when its prefix fingerprint matches the recorded one.

use forkd_core::request::{Conversation, SerializedRequest, fingerprint};
use forkd_core::store::{PrefixPart, RequestFilter, RequestRecord};
use forkd_core::{AgentId, AgentKind, RequestId, Role};

use crate::Engine;
use crate::divergence::{Divergence, first_differing_part};
use crate::error::{EngineError, Result};
use crate::model::{PrefixEnd, build, prefix_parts};

/// How many bytes of each side an explanation shows around the byte where they part.
const EXCERPT_BEFORE: usize = 40;
const EXCERPT_AFTER: usize = 80;

/// Where two requests' bodies part.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CacheExplanation {
    pub request_id: String,
    pub other_request_id: String,
    /// Whether the two recorded prefixes (everything before each agent's own first block) are
    /// byte-identical.
    pub same_prefix: bool,
    /// The part the first differing byte is in: `head`, `tools`, `system` or `message N`.
    pub part: String,
    /// What kind of part: `head`, `tools`, `system` or `message`.
    pub kind: String,
    /// The first differing byte, as an offset in the bodies (the part's start when the bodies
    /// could not be rebuilt: see `exact`).
    pub byte: u64,
    /// Whether `byte` is exact: both bodies were rebuilt and matched their records.
    pub exact: bool,
    /// The bodies around `byte`.
    pub excerpt: String,
    pub other_excerpt: String,
    /// Why the answer is less than exact, when it is.
    pub note: String,
}

/// The kind of a part, from its label.
fn kind_of(label: &str) -> &str {
    label.split(' ').next().unwrap_or(label)
}

/// The last part that starts at or before `byte`.
fn part_at(parts: &[PrefixPart], byte: u64) -> Option<&PrefixPart> {
    parts.iter().rev().find(|p| p.offset <= byte)
}

/// Whether a breakpoint is spliced into `body` at byte `at`.
fn at_breakpoint(body: &[u8], at: usize) -> bool {
    body.get(at..)
        .is_some_and(|rest| rest.starts_with(br#","cache_control":"#))
}

/// A piece of `s` around byte `at`, cut on character boundaries.
fn excerpt(s: &str, at: usize) -> String {
    let mut from = at.saturating_sub(EXCERPT_BEFORE).min(s.len());
    while !s.is_char_boundary(from) {
        from -= 1;
    }
    let mut to = at.saturating_add(EXCERPT_AFTER).min(s.len());
    while !s.is_char_boundary(to) {
        to += 1;
    }
    s.get(from..to).unwrap_or_default().to_owned()
}

impl Engine {
    /// Compares a fork child's request with its first sibling's request of the same turn (from
    /// the store); a different prefix is warned about and counted.
    pub async fn check_prefix(&self, record: &RequestRecord) -> Result<Option<Divergence>> {
        self.inner.divergences.check(record).await
    }

    /// How many sibling prefix divergences this engine has seen.
    pub fn prefix_divergences(&self) -> u64 {
        self.inner.divergences.seen()
    }

    /// Request records by agent, batch or session.
    pub async fn list_requests(&self, filter: &RequestFilter) -> Result<Vec<RequestRecord>> {
        Ok(self.inner.store.list_requests(filter).await?)
    }

    pub async fn get_request(&self, id: RequestId) -> Result<RequestRecord> {
        self.inner
            .store
            .get_request(id)
            .await?
            .ok_or_else(|| EngineError::NotFound {
                kind: "request",
                id: id.to_string(),
            })
    }

    /// Rebuilds a request's body from the store as its run built it. `None` when it cannot be
    /// rebuilt (a session's main-loop request recorded without its message count, made before
    /// counts were kept) or when the rebuilt prefix does not match the recorded fingerprint.
    async fn rebuild(&self, record: &RequestRecord) -> Option<(SerializedRequest, usize)> {
        let agent = self.get_agent(record.agent_id).await.ok()?;
        if agent.kind == AgentKind::Parent {
            return self.rebuild_main_loop(record).await;
        }
        let run = self.inner.runs.load_run(agent.id, None).await.ok()?;
        // The request of turn t saw the agent's own messages before its t-th reply, from the
        // boundary stored before it (one before its last reply, not at it).
        let mut replies = 0u32;
        let cut = run
            .own
            .iter()
            .position(|m| {
                if m.role == Role::Assistant {
                    replies += 1;
                    replies > record.turn
                } else {
                    false
                }
            })
            .unwrap_or(run.own.len());
        let compaction = run.compactions.iter().rfind(|c| (c.to_seq as usize) < cut);
        let conversation = run.view(compaction, cut);
        let built = build(
            &run.params,
            &conversation,
            PrefixEnd::Before(run.directive_pos()),
        );
        let (body, prefix_end) = (built.body, built.prefix_end?);
        if fingerprint(&body.body.as_bytes()[..prefix_end]) != record.prefix_fingerprint {
            return None;
        }
        let tools_len = run.params.tools.raw().len();
        Some((body, tools_len))
    }

    /// Whether `agent` is a session's main loop.
    async fn is_main_loop(&self, agent: AgentId) -> bool {
        self.get_agent(agent)
            .await
            .is_ok_and(|a| a.kind == AgentKind::Parent)
    }

    /// A main-loop request carried the session's whole transcript as it stood: its first
    /// `message_count` messages, which are append-only, so they are still there.
    async fn rebuild_main_loop(
        &self,
        record: &RequestRecord,
    ) -> Option<(SerializedRequest, usize)> {
        let count = record.message_count?;
        let session = self.get_session(record.session_id).await.ok()?;
        let history: Vec<_> = self
            .inner
            .store
            .session_messages(session.id, Some(u64::from(count)))
            .await
            .ok()?
            .into_iter()
            .map(|m| m.message)
            .collect();
        if history.len() != count as usize {
            return None;
        }
        let conversation = Conversation::main_loop(history, session.reply_breakpoint);
        let built = build(&session.params, &conversation, PrefixEnd::LastBlock);
        let (body, prefix_end) = (built.body, built.prefix_end?);
        if fingerprint(&body.body.as_bytes()[..prefix_end]) != record.prefix_fingerprint {
            return None;
        }
        let tools_len = session.params.tools.raw().len();
        Some((body, tools_len))
    }

    /// Where two requests' bodies part. Without `other`, `request` is compared with the first
    /// sibling's request of the same turn.
    pub async fn explain_cache(
        &self,
        request: RequestId,
        other: Option<RequestId>,
    ) -> Result<CacheExplanation> {
        let a = self.get_request(request).await?;
        let b = match other {
            Some(id) => self.get_request(id).await?,
            None => {
                let batch = a.batch_id.ok_or_else(|| {
                    EngineError::InvalidRequest(format!(
                        "request {} is not a fork child's: give a second request to compare with",
                        a.id
                    ))
                })?;
                self.inner
                    .divergences
                    .first_sibling_request(batch, a.turn, a.agent_id)
                    .await?
                    .ok_or_else(|| {
                        EngineError::WrongState(format!(
                            "request {} has no sibling request of turn {} to compare with",
                            a.id, a.turn
                        ))
                    })?
            }
        };
        let same_prefix = a.prefix_fingerprint == b.prefix_fingerprint;
        let mut out = CacheExplanation {
            request_id: a.id.to_string(),
            other_request_id: b.id.to_string(),
            same_prefix,
            ..CacheExplanation::default()
        };
        let recorded = first_differing_part(&a.prefix_parts, &b.prefix_parts).cloned();
        match (self.rebuild(&a).await, self.rebuild(&b).await) {
            (Some((body_a, tools_a)), Some((body_b, tools_b))) => {
                let (x, y) = (body_a.body.as_bytes(), body_b.body.as_bytes());
                let at = x.iter().zip(y).position(|(p, q)| p != q);
                let Some(at) = at.or((x.len() != y.len()).then(|| x.len().min(y.len()))) else {
                    out.note = "the two bodies are identical".into();
                    out.exact = true;
                    return Ok(out);
                };
                let parts = prefix_parts(&body_a, tools_a, body_a.body.len());
                let _ = tools_b;
                let part = part_at(&parts, at as u64).map(|p| p.label.clone());
                out.part = part.unwrap_or_default();
                out.kind = kind_of(&out.part).to_owned();
                out.byte = at as u64;
                out.exact = true;
                out.excerpt = excerpt(&body_a.body, at);
                out.other_excerpt = excerpt(&body_b.body, at);
                let mut notes: Vec<&str> = Vec::new();
                if same_prefix && a.batch_id.is_some() && a.batch_id == b.batch_id {
                    notes.push(
                        "the prefixes are identical; the bodies part in the agents' own blocks, \
                         as siblings should",
                    );
                } else if same_prefix {
                    notes.push("the prefixes are identical; the bodies part after them");
                } else if a.agent_id == b.agent_id && self.is_main_loop(a.agent_id).await {
                    notes.push(
                        "two requests of one session's main loop: the later one carries more of \
                         the transcript, so their recorded prefixes (everything before each \
                         one's last block) differ by design",
                    );
                }
                if at_breakpoint(x, at) || at_breakpoint(y, at) {
                    notes.push(
                        "the bodies part at a cache breakpoint (`cache_control`) that only one of \
                         them carries: every byte before it is the same, and a breakpoint is not \
                         part of what the cache compares",
                    );
                }
                out.note = notes.join("; ");
            }
            _ => {
                out.note = "a body could not be rebuilt from the store (a session's main-loop \
                            request recorded before message counts were kept, or a transcript \
                            that no longer matches its record): the part is from the recorded \
                            digests and the byte is where that part starts"
                    .into();
                if let Some(p) = recorded {
                    out.kind = kind_of(&p.label).to_owned();
                    out.part = p.label;
                    out.byte = p.offset;
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(label: &str, offset: u64, digest: &str) -> PrefixPart {
        PrefixPart {
            label: label.into(),
            offset,
            digest: digest.into(),
        }
    }

    #[test]
    fn the_first_differing_part_is_found() {
        let a = [
            part("head", 0, "a"),
            part("tools", 10, "b"),
            part("system", 50, "c"),
        ];
        let mut b = a.clone();
        assert_eq!(first_differing_part(&a, &b), None);
        b[2].digest = "x".into();
        assert_eq!(
            first_differing_part(&a, &b).map(|p| p.label.as_str()),
            Some("system")
        );
        assert_eq!(
            first_differing_part(&a, &a[..2]).map(|p| p.label.as_str()),
            Some("system")
        );
    }

    #[test]
    fn excerpts_cut_on_char_boundaries() {
        let s = "é".repeat(100);
        let e = excerpt(&s, 51);
        assert!(!e.is_empty());
        assert_eq!(kind_of("message 3 block 1"), "message");
        assert_eq!(kind_of("system"), "system");
    }
}
