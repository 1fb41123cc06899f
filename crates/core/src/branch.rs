//! Branches: a session whose history is another session's transcript up to an earlier point.
//!
//! A branch shares its origin's stored messages instead of copying them (transcripts are
//! append-only, so what a branch inherited never changes), and its requests carry the origin's
//! system prompt, tools and messages byte for byte up to the point — so its first request reads
//! the cache the origin's own requests wrote.
//!
//! Points are counted in messages: a branch at point `P` inherits the origin's messages
//! `0..P`, and its own messages start at seq `P`. Only points between turns are valid — where a
//! turn's user message begins, or the end of the last finished turn — so a branch never starts
//! inside a turn, nor between a tool call and its result. Turn `K` is the `K`-th user message's
//! turn; the session's first message (its context) belongs to no turn.

use std::fmt;

use crate::ids::SessionId;

/// Where a branch starts: its origin and how much of the origin's transcript it inherits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Branch {
    pub origin: SessionId,
    /// The number of the origin's messages the branch inherits (its own start at this seq).
    pub point: u64,
    /// The origin's compaction boundary in force at the point when the branch was made, if
    /// any: the branch's requests see what the origin's saw, whatever the origin compacts later.
    pub compacted_to: Option<u64>,
}

/// Where a client asks a branch (or a batch) to start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum At {
    /// After the last finished turn.
    Latest,
    /// After turn `K` ends (`0`: before the first turn).
    AfterTurn(u32),
    /// Just before the user message at this seq, which must begin a turn: the branch's first
    /// message takes its place.
    Before(u64),
}

/// A transcript's turns: where each one's user message sits, and whether one is running.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TurnIndex {
    /// The seq of each turn's user message, in order: turn `K` begins at `starts[K - 1]`.
    pub starts: Vec<u64>,
    /// The transcript's length.
    pub len: u64,
    /// Where the turn in flight began, if one is running.
    pub in_flight: Option<u64>,
}

/// A valid point, as a client names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Point {
    /// The messages inherited.
    pub seq: u64,
    /// The turns that ended before it.
    pub after_turn: u32,
    /// Whether a turn's user message sits at `seq` (so `--before seq` names it too).
    pub before_message: bool,
}

impl fmt::Display for Point {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "--at-turn {}", self.after_turn)?;
        if self.before_message {
            write!(f, " (= --before {})", self.seq)
        } else {
            write!(f, " (message {})", self.seq)
        }
    }
}

/// Why a point is not valid; names the nearest valid ones.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PointError {
    #[error("the session has {turns} turns{}", latest(*finished))]
    NoSuchTurn { turns: u32, finished: u32 },
    #[error("turn {turn} is still running{}", latest(*finished))]
    Running { turn: u32, finished: u32 },
    #[error("the session has {len} messages; message {seq} does not exist{}", nearest(*prev, None))]
    NoSuchMessage {
        seq: u64,
        len: u64,
        prev: Option<Point>,
    },
    #[error(
        "message {seq} does not begin a turn ({what}): a branch may start only between turns{}",
        nearest(*prev, *next)
    )]
    Inside {
        seq: u64,
        what: Inside,
        prev: Option<Point>,
        next: Option<Point>,
    },
}

/// Where an invalid `--before` points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inside {
    /// The session's first message, which every branch keeps.
    First,
    /// A message after turn `K`'s user message and before the next point: one of the turn's
    /// own, or a note (a batch's launch or digest, a notification) that arrived after it.
    Turn(u32),
    /// A note that arrived before the first turn.
    BeforeTurns,
}

impl fmt::Display for Inside {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Inside::First => f.write_str("it is the session's first message, which a branch keeps"),
            Inside::Turn(k) => write!(f, "it comes after turn {k}'s message"),
            Inside::BeforeTurns => f.write_str("it is a note before the first turn"),
        }
    }
}

fn latest(finished: u32) -> String {
    format!("; the latest finished turn is {finished} (--at-turn {finished})")
}

fn nearest(prev: Option<Point>, next: Option<Point>) -> String {
    match (prev, next) {
        (Some(p), Some(n)) => format!("; the nearest valid points are {p} and {n}"),
        (Some(p), None) | (None, Some(p)) => format!("; the nearest valid point is {p}"),
        (None, None) => String::new(),
    }
}

impl TurnIndex {
    /// Where finished turns end: the start of the turn in flight, or the transcript's end.
    pub fn finished_end(&self) -> u64 {
        self.in_flight.map_or(self.len, |s| s.min(self.len))
    }

    /// How many turns have ended.
    pub fn finished(&self) -> u32 {
        let end = self.finished_end();
        count(self.starts.iter().filter(|s| **s < end).count())
    }

    /// The turn whose user message is at `seq`, if one is.
    pub fn turn_at(&self, seq: u64) -> Option<u32> {
        self.starts
            .binary_search(&seq)
            .ok()
            .map(|i| count(i).saturating_add(1))
    }

    /// Every valid point, in order: each finished turn's start (and the running one's), then
    /// the end of the last finished turn.
    pub fn points(&self) -> Vec<Point> {
        let end = self.finished_end();
        let mut points: Vec<Point> = self
            .starts
            .iter()
            .enumerate()
            .filter(|(_, s)| **s <= end)
            .map(|(i, s)| Point {
                seq: *s,
                after_turn: count(i),
                before_message: true,
            })
            .collect();
        if points.last().is_none_or(|p| p.seq < end) {
            points.push(Point {
                seq: end,
                after_turn: self.finished(),
                before_message: false,
            });
        }
        points
    }

    /// The point `at` names, or why it is not valid.
    pub fn point(&self, at: At) -> Result<u64, PointError> {
        let finished = self.finished();
        match at {
            At::Latest => Ok(self.finished_end()),
            At::AfterTurn(k) if k == finished => Ok(self.finished_end()),
            At::AfterTurn(k) if k < finished => Ok(self.starts[k as usize]),
            At::AfterTurn(k) if (k as usize) <= self.starts.len() => {
                Err(PointError::Running { turn: k, finished })
            }
            At::AfterTurn(_) => Err(PointError::NoSuchTurn {
                turns: count(self.starts.len()),
                finished,
            }),
            At::Before(seq) => self.before(seq),
        }
    }

    fn before(&self, seq: u64) -> Result<u64, PointError> {
        let points = self.points();
        if let Some(p) = points.iter().find(|p| p.seq == seq && p.before_message) {
            return Ok(p.seq);
        }
        let prev = points.iter().rev().find(|p| p.seq < seq).copied();
        if seq >= self.len {
            return Err(PointError::NoSuchMessage {
                seq,
                len: self.len,
                prev,
            });
        }
        let next = points.iter().find(|p| p.seq > seq).copied();
        let what = match self.starts.iter().rposition(|s| *s < seq) {
            _ if seq == 0 => Inside::First,
            None => Inside::BeforeTurns,
            Some(i) => Inside::Turn(count(i).saturating_add(1)),
        };
        Err(PointError::Inside {
            seq,
            what,
            prev,
            next,
        })
    }
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Turns begin at 1, 5 and 9 of 12 messages.
    fn three() -> TurnIndex {
        TurnIndex {
            starts: vec![1, 5, 9],
            len: 12,
            in_flight: None,
        }
    }

    #[test]
    fn at_turn_k_is_the_next_turns_message_or_the_end() {
        let t = three();
        assert_eq!(t.point(At::AfterTurn(0)), Ok(1));
        assert_eq!(t.point(At::AfterTurn(1)), Ok(5));
        assert_eq!(t.point(At::AfterTurn(2)), Ok(9));
        assert_eq!(t.point(At::AfterTurn(3)), Ok(12));
        assert_eq!(t.point(At::Latest), Ok(12));
        assert_eq!(
            t.point(At::AfterTurn(4)),
            Err(PointError::NoSuchTurn {
                turns: 3,
                finished: 3
            })
        );
    }

    #[test]
    fn before_a_turns_message_is_where_it_sits() {
        let t = three();
        assert_eq!(t.point(At::Before(5)), Ok(5));
        assert_eq!(t.point(At::Before(1)), Ok(1));
    }

    #[test]
    fn a_running_turn_is_not_a_point_but_its_start_is() {
        let t = TurnIndex {
            in_flight: Some(9),
            ..three()
        };
        assert_eq!(t.point(At::Latest), Ok(9));
        assert_eq!(t.point(At::AfterTurn(2)), Ok(9));
        assert_eq!(t.point(At::Before(9)), Ok(9));
        assert_eq!(
            t.point(At::AfterTurn(3)),
            Err(PointError::Running {
                turn: 3,
                finished: 2
            })
        );
        let err = t.point(At::Before(10)).unwrap_err().to_string();
        assert!(err.contains("--at-turn 2 (= --before 9)"), "{err}");
    }

    #[test]
    fn a_point_inside_a_turn_names_its_neighbours() {
        let err = three().point(At::Before(6)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "message 6 does not begin a turn (it comes after turn 2's message): a branch may start only \
             between turns; the nearest valid points are --at-turn 1 (= --before 5) and \
             --at-turn 2 (= --before 9)"
        );
        let err = three().point(At::Before(11)).unwrap_err().to_string();
        assert!(
            err.ends_with("--at-turn 2 (= --before 9) and --at-turn 3 (message 12)"),
            "{err}"
        );
        let err = three().point(At::Before(0)).unwrap_err().to_string();
        assert!(err.contains("first message"), "{err}");
        let err = three().point(At::Before(12)).unwrap_err().to_string();
        assert!(err.contains("has 12 messages"), "{err}");
    }

    #[test]
    fn a_session_without_turns_branches_after_its_first_message() {
        let t = TurnIndex {
            starts: vec![],
            len: 1,
            in_flight: None,
        };
        assert_eq!(t.point(At::Latest), Ok(1));
        assert_eq!(t.point(At::AfterTurn(0)), Ok(1));
        assert_eq!(
            t.points(),
            vec![Point {
                seq: 1,
                after_turn: 0,
                before_message: false
            }]
        );
        assert_eq!(t.turn_at(1), None);
        assert_eq!(three().turn_at(5), Some(2));
    }
}
