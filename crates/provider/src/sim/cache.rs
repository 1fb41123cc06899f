//! The sim's prompt cache (docs/contracts.md, “Prompt-cache rules”): lookback lookups, writes at
//! breakpoints, entries that become readable only when their response starts, and TTLs that every
//! hit refreshes.

use std::collections::HashMap;
use std::time::Duration;

use forkd_core::Usage;
use forkd_core::pricing::CacheTtl;
use tokio::time::Instant;

use super::request::CacheBlock;

/// How many positions one breakpoint checks, itself included.
pub(crate) const LOOKBACK: usize = 20;

#[derive(Debug, Clone, Copy)]
struct Entry {
    ttl: Duration,
    expires_at: Instant,
}

/// An entry that a response will write once it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Write {
    key: [u8; 32],
    ttl: Duration,
}

/// What a lookup decided: the input side of usage, and the writes to commit at `message_start`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Lookup {
    pub usage: Usage,
    pub writes: Vec<Write>,
    /// The entry read, to refresh when the request is admitted.
    pub hit: Option<[u8; 32]>,
}

/// All readable entries of one sim, keyed by prefix hash (which already includes the model).
#[derive(Debug, Default)]
pub(crate) struct PromptCache {
    entries: HashMap<[u8; 32], Entry>,
}

fn ttl(t: CacheTtl) -> Duration {
    Duration::from_secs(t.seconds())
}

/// The positions a breakpoint at `bp` checks: itself, then earlier block boundaries, where a run
/// of tool_use (or tool_result) blocks has one boundary, at its end.
fn lookback(blocks: &[CacheBlock], bp: usize) -> impl Iterator<Item = usize> + '_ {
    let earlier = (0..bp)
        .rev()
        .filter(|&i| !blocks[i].run.joins(blocks[i + 1].run));
    std::iter::once(bp).chain(earlier).take(LOOKBACK)
}

impl PromptCache {
    fn readable(&self, key: &[u8; 32], now: Instant) -> bool {
        self.entries.get(key).is_some_and(|e| e.expires_at > now)
    }

    /// Looks a request's blocks up. The longest hit over all breakpoints is read (and its entry
    /// refreshed); everything from there to the last breakpoint is written.
    #[cfg(test)]
    pub(crate) fn lookup(
        &mut self,
        blocks: &[CacheBlock],
        min_tokens: u64,
        now: Instant,
    ) -> Lookup {
        let lookup = self.peek(blocks, min_tokens, now);
        self.touch(&lookup, now);
        lookup
    }

    /// Refreshes the entry a lookup read.
    pub(crate) fn touch(&mut self, lookup: &Lookup, now: Instant) {
        if let Some(entry) = lookup.hit.and_then(|key| self.entries.get_mut(&key)) {
            entry.expires_at = entry.expires_at.max(now + entry.ttl);
        }
    }

    /// What [`lookup`](Self::lookup) decides, without refreshing anything: a request that is
    /// then refused (over a rate limit) changes nothing.
    pub(crate) fn peek(&self, blocks: &[CacheBlock], min_tokens: u64, now: Instant) -> Lookup {
        let cumulative: Vec<u64> = blocks
            .iter()
            .scan(0u64, |sum, b| {
                *sum += b.tokens;
                Some(*sum)
            })
            .collect();
        let total = cumulative.last().copied().unwrap_or(0);
        let uncached = Lookup {
            usage: Usage {
                input_tokens: total,
                ..Usage::default()
            },
            writes: Vec::new(),
            hit: None,
        };
        let breakpoints: Vec<usize> = (0..blocks.len())
            .filter(|&i| blocks[i].breakpoint.is_some())
            .collect();
        let Some(&last) = breakpoints.last() else {
            return uncached;
        };
        let hit = breakpoints
            .iter()
            .flat_map(|&bp| lookback(blocks, bp))
            .filter(|&i| self.readable(&blocks[i].prefix, now))
            .max();
        let read = match hit {
            Some(h) => cumulative[h],
            // A prefix under the minimum is processed uncached, without any error.
            None if cumulative[last] < min_tokens => return uncached,
            None => 0,
        };
        let writes = breakpoints
            .iter()
            .filter(|&&bp| hit.is_none_or(|h| bp > h) && cumulative[bp] >= min_tokens)
            .filter_map(|&bp| {
                Some(Write {
                    key: blocks[bp].prefix,
                    ttl: ttl(blocks[bp].breakpoint?),
                })
            })
            .collect();
        Lookup {
            usage: Usage {
                input_tokens: total - cumulative[last],
                cache_creation_input_tokens: cumulative[last] - read,
                cache_read_input_tokens: read,
                output_tokens: 0,
            },
            writes,
            hit: hit.map(|h| blocks[h].prefix),
        }
    }

    /// Makes a response's writes readable (called when its `message_start` is emitted).
    pub(crate) fn commit(&mut self, writes: &[Write], now: Instant) {
        self.entries.retain(|_, e| e.expires_at > now);
        for w in writes {
            let expires_at = now + w.ttl;
            self.entries
                .entry(w.key)
                .and_modify(|e| {
                    e.ttl = e.ttl.max(w.ttl);
                    e.expires_at = e.expires_at.max(expires_at);
                })
                .or_insert(Entry {
                    ttl: w.ttl,
                    expires_at,
                });
        }
    }

    /// How many entries are alive at `now`.
    pub(crate) fn live(&self, now: Instant) -> usize {
        self.entries.values().filter(|e| e.expires_at > now).count()
    }
}

#[cfg(test)]
mod tests {
    use super::super::request::Run;
    use super::*;

    /// Blocks from a compact description: one char per block (`u` tool_use, `r` tool_result,
    /// anything else a plain block), a `*` after a block marks a breakpoint. Every block is 100
    /// tokens; the prefix hash is the block's index within `id`'s sequence.
    fn blocks(spec: &str) -> Vec<CacheBlock> {
        let mut out: Vec<CacheBlock> = Vec::new();
        for c in spec.chars() {
            if c == '*' {
                if let Some(b) = out.last_mut() {
                    b.breakpoint = Some(CacheTtl::FiveMinutes);
                }
                continue;
            }
            let mut prefix = [0u8; 32];
            prefix[..8].copy_from_slice(&(out.len() as u64).to_le_bytes());
            out.push(CacheBlock {
                prefix,
                tokens: 100,
                run: match c {
                    'u' => Run::ToolUse,
                    'r' => Run::ToolResult,
                    _ => Run::Other,
                },
                breakpoint: None,
            });
        }
        out
    }

    fn usage(input: u64, write: u64, read: u64) -> Usage {
        Usage {
            input_tokens: input,
            cache_creation_input_tokens: write,
            cache_read_input_tokens: read,
            output_tokens: 0,
        }
    }

    #[test]
    fn lookback_counts_runs_as_one_position() {
        let b = blocks("ttuuurrrt");
        let seen: Vec<usize> = lookback(&b, 8).collect();
        assert_eq!(seen, vec![8, 7, 4, 1, 0]);
        let b = blocks(&"t".repeat(30));
        assert_eq!(lookback(&b, 29).count(), LOOKBACK);
        assert_eq!(lookback(&b, 29).last(), Some(10));
    }

    #[test]
    fn scenarios() {
        let now = Instant::now();
        // (first request, second request, min tokens, expected usage of the second)
        let cases = [
            ("tt*t", "tt*t", 100, usage(100, 0, 200)),
            ("tt*t", "tt*tt*t", 100, usage(100, 200, 200)),
            ("tt*", "tttt*", 100, usage(0, 200, 200)),
            // The first request's prefix was under the minimum: nothing written, all uncached.
            ("t*", "t*t", 200, usage(200, 0, 0)),
            ("tt*", "tt*", 300, usage(200, 0, 0)),
            // An earlier breakpoint under the minimum is not written but still counted as written
            // up to the last breakpoint.
            ("t", "t*tt*", 200, usage(0, 300, 0)),
        ];
        for (first, second, min, expected) in cases {
            let mut cache = PromptCache::default();
            let w = cache.lookup(&blocks(first), min, now);
            cache.commit(&w.writes, now);
            let got = cache.lookup(&blocks(second), min, now).usage;
            assert_eq!(got, expected, "{first} then {second} (min {min})");
        }
    }

    #[test]
    fn writes_are_invisible_until_committed() {
        let now = Instant::now();
        let mut cache = PromptCache::default();
        let b = blocks("tt*");
        let first = cache.lookup(&b, 1, now);
        let second = cache.lookup(&b, 1, now);
        assert_eq!(first.usage, usage(0, 200, 0));
        assert_eq!(second.usage, usage(0, 200, 0));
        cache.commit(&first.writes, now);
        assert_eq!(cache.live(now), 1);
        assert_eq!(cache.lookup(&b, 1, now).usage, usage(0, 0, 200));
    }
}
