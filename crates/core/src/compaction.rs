//! Compaction: a long conversation's older messages replaced, in the requests, by a summary
//! (docs/contracts.md, "Compaction").
//!
//! A boundary sits right before an assistant message: the summary replaces everything before it,
//! and the requests after it are the system prompt, the summary (a user message) and the
//! transcript from that assistant message on. So a tool_use and its tool_result are never split
//! (both sit on the same side), roles still alternate, and a kept assistant message keeps its
//! signed thinking. The summary request is the request that produced that assistant message,
//! byte for byte, plus the compaction instruction in its last user message: it reads that
//! request's cache. Nothing is deleted: the transcript keeps every message; the boundary is
//! stored beside it.
//!
//! A fork child or a typed agent compacts only its own messages: its first message (a child's
//! fork message — the shared blocks, the boilerplate and its directive — or a typed agent's
//! prompt) is kept whole, and the summary's blocks follow its blocks in that same user message
//! ([`append_summary`]), so roles alternate, the siblings' shared prefix is still shared, and
//! the recursion guard still finds the boilerplate.

use crate::message::{Block, Message, Role};

/// The instruction appended to the summary request.
pub const INSTRUCTION: &str = "<compaction-request>\nThis conversation is about to pass its \
    context window. Write a summary that lets you carry on without the messages above: the goal \
    and the user's instructions, what has been done and decided, the files and facts that \
    matter, what is in progress and what is left to do. Reply with the summary only.\n\
    </compaction-request>";

/// The tag that opens a summary message, for people and tests that look for boundaries.
pub const SUMMARY_TAG: &str = "compaction-summary";

/// A compaction boundary of a transcript.
#[derive(Debug, Clone, PartialEq)]
pub struct Compaction {
    /// The first transcript message the summary newly replaces (the previous boundary's
    /// `to_seq`, or 0).
    pub from_seq: u64,
    /// The transcript message the requests continue from: an assistant message.
    pub to_seq: u64,
    /// The summary, as the user message that stands for messages `0..to_seq`.
    pub summary: Message,
    pub created_at_ms: i64,
}

/// The user message that stands for the compacted messages.
pub fn summary_message(summary: &str) -> Message {
    Message::user(vec![Block::text(&format!(
        "<{SUMMARY_TAG}>\nThe earlier part of this conversation was compacted into this \
         summary:\n\n{}\n</{SUMMARY_TAG}>",
        summary.trim()
    ))])
}

/// Where a boundary may go in `messages` (all of a transcript): before its last assistant
/// message that comes after `after` (the previous boundary), and follows a user message.
/// `None` when there is none: nothing can be compacted yet.
pub fn boundary(messages: &[Message], after: u64) -> Option<u64> {
    let after = usize::try_from(after).unwrap_or(usize::MAX);
    (after.saturating_add(1)..messages.len())
        .rev()
        .find(|&i| messages[i].role == Role::Assistant && messages[i - 1].role == Role::User)
        .map(|i| i as u64)
}

/// The summary request's conversation: `view` (what the requests saw: a summary and the
/// messages since the previous boundary, or the whole transcript) up to the boundary — the
/// request that produced the message at the boundary — with the instruction added to its last
/// user message.
pub fn summary_request(mut before_boundary: Vec<Message>) -> Vec<Message> {
    match before_boundary.last_mut() {
        Some(last) if last.role == Role::User => last.blocks.push(Block::text(INSTRUCTION)),
        _ => before_boundary.push(Message::user(vec![Block::text(INSTRUCTION)])),
    }
    before_boundary
}

/// An agent's first message after a compaction: its own blocks, byte for byte, then the
/// summary's.
pub fn append_summary(first: &mut Message, summary: &Message) {
    first.blocks.extend(summary.blocks.iter().cloned());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(role: Role, text: &str) -> Message {
        match role {
            Role::User => Message::user(vec![Block::text(text)]),
            Role::Assistant => Message::assistant(vec![Block::text(text)]),
        }
    }

    #[test]
    fn a_boundary_goes_before_the_last_assistant_reply_after_the_previous_one() {
        use Role::{Assistant as A, User as U};
        let t = [m(U, "a"), m(A, "b"), m(U, "c"), m(A, "d"), m(U, "e")];
        assert_eq!(boundary(&t, 0), Some(3));
        assert_eq!(boundary(&t, 3), None, "nothing new since the last boundary");
        assert_eq!(boundary(&t[..2], 0), Some(1));
        assert_eq!(boundary(&[m(U, "only")], 0), None);
        // Two user messages in a row (a notification) before the reply: still after a user.
        let t = [m(U, "a"), m(U, "note"), m(A, "b")];
        assert_eq!(boundary(&t, 0), Some(2));
    }

    #[test]
    fn the_summary_request_adds_the_instruction_to_the_last_user_message() {
        let convo = vec![m(Role::User, "do it")];
        let req = summary_request(convo);
        assert_eq!(req.len(), 1);
        assert_eq!(req[0].blocks.len(), 2);
        assert!(
            req[0].blocks[1]
                .as_text()
                .unwrap_or_default()
                .contains("compaction-request")
        );
        let req = summary_request(vec![m(Role::User, "q"), m(Role::Assistant, "a")]);
        assert_eq!(req.len(), 3);
        assert_eq!(req[2].role, Role::User);
    }

    #[test]
    fn an_agents_first_message_keeps_its_blocks_and_takes_the_summarys() {
        let mut first = Message::user(vec![Block::text("<forkd-fork-child>x"), Block::text("d")]);
        let before: Vec<String> = first.blocks.iter().map(|b| b.raw().to_string()).collect();
        append_summary(&mut first, &summary_message("done so far"));
        assert_eq!(first.role, Role::User);
        assert_eq!(first.blocks.len(), 3);
        for (kept, was) in first.blocks.iter().zip(&before) {
            assert_eq!(&kept.raw().to_string(), was);
        }
        assert!(
            first.blocks[2]
                .as_text()
                .unwrap_or_default()
                .starts_with(&format!("<{SUMMARY_TAG}>"))
        );
    }
}
