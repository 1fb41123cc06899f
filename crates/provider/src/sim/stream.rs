//! Streaming a reply: the events in Messages API order, timed by the latency model.

use std::collections::VecDeque;
use std::time::Duration;

use forkd_core::Usage;
use futures::StreamExt;

use super::reply::{OutBlock, Reply, SIGNATURE};
use crate::{BlockStart, EventStream, StreamEvent, tokens};

/// Text and thinking stream in this many chunks at most; tool input in two.
const TEXT_CHUNKS: usize = 4;
const JSON_CHUNKS: usize = 2;

/// One event and how long to wait before yielding it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Timed {
    pub delay: Duration,
    pub event: StreamEvent,
}

/// The reply's output tokens: its text, thinking and tool input JSON.
pub(crate) fn output_tokens(blocks: &[OutBlock]) -> u64 {
    blocks
        .iter()
        .map(|b| match b {
            OutBlock::Text(t) | OutBlock::Thinking(t) => tokens::count(t),
            OutBlock::ToolUse { input, .. } => tokens::count(input),
        })
        .sum()
}

/// Splits `s` into at most `n` pieces of about equal length, on character boundaries.
fn pieces(s: &str, n: usize) -> Vec<&str> {
    let target = s.len().div_ceil(n.max(1)).max(1);
    let mut out = Vec::with_capacity(n);
    let mut rest = s;
    while !rest.is_empty() {
        let mut cut = target.min(rest.len());
        while !rest.is_char_boundary(cut) {
            cut += 1;
        }
        let (head, tail) = rest.split_at(cut);
        out.push(head);
        rest = tail;
    }
    out
}

fn seconds(s: f64) -> Duration {
    Duration::try_from_secs_f64(s).unwrap_or(Duration::ZERO)
}

/// The timed events of a reply. Time to first token grows with the uncached input; the output
/// then streams at 80 tokens a second, both scaled by `speed`, unless the script set a sleep,
/// which is spread over the deltas as given.
pub(crate) fn plan(reply: &Reply, message_id: String, usage: Usage, speed: f64) -> Vec<Timed> {
    let uncached = (usage.input_tokens + usage.cache_creation_input_tokens) as f64;
    let ttft = seconds(speed * (0.2 + 50e-6 * uncached));
    let output_tokens = output_tokens(&reply.blocks);
    let streaming = reply
        .mods
        .sleep
        .unwrap_or_else(|| seconds(speed * output_tokens as f64 / 80.0));

    let mut events = vec![StreamEvent::MessageStart {
        message_id,
        usage: Usage {
            output_tokens: 0,
            ..usage
        },
    }];
    for (index, block) in reply.blocks.iter().enumerate() {
        match block {
            OutBlock::Thinking(t) => {
                events.push(StreamEvent::BlockStart {
                    index,
                    block: BlockStart::Thinking,
                });
                events.extend(pieces(t, TEXT_CHUNKS).into_iter().map(|p| {
                    StreamEvent::ThinkingDelta {
                        index,
                        thinking: p.to_owned(),
                    }
                }));
                events.push(StreamEvent::SignatureDelta {
                    index,
                    signature: SIGNATURE.to_owned(),
                });
            }
            OutBlock::Text(t) => {
                events.push(StreamEvent::BlockStart {
                    index,
                    block: BlockStart::Text,
                });
                events.extend(
                    pieces(t, TEXT_CHUNKS)
                        .into_iter()
                        .map(|p| StreamEvent::TextDelta {
                            index,
                            text: p.to_owned(),
                        }),
                );
            }
            OutBlock::ToolUse { id, name, input } => {
                events.push(StreamEvent::BlockStart {
                    index,
                    block: BlockStart::ToolUse {
                        id: id.clone(),
                        name: name.clone(),
                    },
                });
                events.extend(pieces(input, JSON_CHUNKS).into_iter().map(|p| {
                    StreamEvent::InputJsonDelta {
                        index,
                        partial_json: p.to_owned(),
                    }
                }));
            }
        }
        events.push(StreamEvent::BlockStop { index });
    }
    // As the Messages API does now, `message_delta` repeats the whole usage.
    events.push(StreamEvent::MessageDelta {
        stop_reason: Some(reply.stop_reason.to_owned()),
        output_tokens,
        usage: Some(Usage {
            output_tokens,
            ..usage
        }),
    });
    events.push(StreamEvent::MessageStop);

    let is_delta = |e: &StreamEvent| {
        matches!(
            e,
            StreamEvent::TextDelta { .. }
                | StreamEvent::ThinkingDelta { .. }
                | StreamEvent::InputJsonDelta { .. }
        )
    };
    let deltas = events.iter().filter(|e| is_delta(e)).count().max(1) as u32;
    let per_delta = streaming / deltas;
    let mut timed: Vec<Timed> = events
        .into_iter()
        .map(|event| {
            let delay = match &event {
                StreamEvent::MessageStart { .. } => ttft,
                e if is_delta(e) => per_delta,
                _ => Duration::ZERO,
            };
            Timed { delay, event }
        })
        .collect();
    // A stalled response: what follows its first token never comes.
    if reply.mods.stall
        && let Some(first) = timed.iter().position(|t| is_delta(&t.event))
        && let Some(next) = timed.get_mut(first + 1)
    {
        next.delay = STALLED;
    }
    timed
}

/// How long a stalled response waits before its next event: longer than anything waits for it.
const STALLED: Duration = Duration::from_secs(365 * 24 * 3600);

/// Streams timed events lazily; `on_start` runs when `message_start` is yielded (not before: a
/// response's cache writes become readable exactly then). Zero delays never touch the timer.
pub(crate) fn stream<F>(events: Vec<Timed>, on_start: F) -> EventStream
where
    F: FnOnce() + Send + 'static,
{
    let state = (VecDeque::from(events), Some(on_start));
    futures::stream::unfold(state, |(mut queue, mut on_start)| async move {
        let Timed { delay, event } = queue.pop_front()?;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        if matches!(event, StreamEvent::MessageStart { .. })
            && let Some(f) = on_start.take()
        {
            f();
        }
        Some((Ok(event), (queue, on_start)))
    })
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stalled_reply_stops_after_its_first_token() {
        let reply = Reply {
            blocks: vec![OutBlock::Text("a long answer, in many pieces".repeat(4))],
            stop_reason: "end_turn",
            mods: crate::sim::script::Mods {
                stall: true,
                ..Default::default()
            },
            script_key: [0; 32],
        };
        let timed = plan(&reply, "m".into(), Usage::default(), 0.0);
        let Some(first) = timed
            .iter()
            .position(|t| matches!(t.event, StreamEvent::TextDelta { .. }))
        else {
            panic!("the reply streams text");
        };
        assert!(timed[..=first].iter().all(|t| t.delay < STALLED));
        assert_eq!(timed[first + 1].delay, STALLED);
    }

    #[test]
    fn pieces_split_on_char_boundaries() {
        assert_eq!(pieces("", 4), Vec::<&str>::new());
        assert_eq!(pieces("abcdefgh", 4), vec!["ab", "cd", "ef", "gh"]);
        assert_eq!(pieces("abc", 4), vec!["a", "b", "c"]);
        assert_eq!(pieces("ééé", 2).concat(), "ééé");
    }
}
