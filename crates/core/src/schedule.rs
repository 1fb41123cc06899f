//! Schedules: a tenant's batches on a clock (docs/operations.md, "Webhooks and schedules").
//!
//! A schedule is a cron expression in a time zone and a self-contained spec (the session and the
//! batch to fork, as the wire's requests, kept as bytes the server encodes); each firing creates
//! the batch under the idempotency key `schedule/NAME/<fire time>`, so a firing retried after a
//! crash, or raced by another daemon, forks once.
//!
//! What is here is the data, the store's part ([`ScheduleStore`]) and the clock ([`Cron`]): when a
//! schedule fires, across daylight-saving changes (a local time that does not exist is skipped;
//! one that repeats fires once).

use std::str::FromStr;

use async_trait::async_trait;
use chrono::{DateTime, LocalResult, TimeZone, Utc};
use chrono_tz::Tz;

use crate::store::Result;
use crate::{BatchId, DaemonId, SessionId};

/// Whether a firing waits for the previous one's batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Overlap {
    /// A firing while the previous firing's batch still runs is recorded as skipped.
    #[default]
    Skip,
    /// Every firing forks, whatever still runs.
    Allow,
}

/// What happens to the firings missed while no daemon ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CatchUp {
    /// The latest missed firing runs once.
    #[default]
    Once,
    /// Missed firings are recorded as missed; none runs.
    None,
}

macro_rules! names {
    ($ty:ty { $($variant:ident = $name:literal),+ $(,)? }) => {
        impl $ty {
            pub fn as_str(self) -> &'static str {
                match self { $(Self::$variant => $name),+ }
            }
        }
        impl FromStr for $ty {
            type Err = String;
            fn from_str(s: &str) -> std::result::Result<Self, String> {
                match s.trim() {
                    $($name => Ok(Self::$variant),)+
                    other => Err(format!(
                        "{other:?} is not one of: {}",
                        [$($name),+].join(", ")
                    )),
                }
            }
        }
    };
}

names!(Overlap { Skip = "skip", Allow = "allow" });
names!(CatchUp { Once = "once", None = "none" });
names!(FiringState {
    Firing = "firing",
    Fired = "fired",
    Skipped = "skipped",
    Failed = "failed",
});

/// A tenant's schedule.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    pub tenant: String,
    /// Unique within the tenant.
    pub name: String,
    /// As given: five fields, or six with seconds first.
    pub cron: String,
    /// An IANA time zone (`Europe/Berlin`); `UTC` by default.
    pub timezone: String,
    pub overlap: Overlap,
    pub catch_up: CatchUp,
    pub paused: bool,
    /// The session and batch each firing creates, encoded by the server.
    pub spec: Vec<u8>,
    pub created_at_ms: i64,
    /// The next firing due; `None` when the expression has no future time.
    pub next_fire_at_ms: Option<i64>,
    /// The upload the spec's session starts from: kept while the schedule names it.
    pub upload_id: Option<crate::UploadId>,
}

/// Where a firing stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FiringState {
    /// Claimed by a daemon that is creating its session and batch.
    Firing,
    /// Its batch was created.
    Fired,
    /// Not forked: the previous batch still ran (`overlap: skip`), or it was missed.
    Skipped,
    /// Its session or batch was refused (why is recorded).
    Failed,
}

/// One firing of a schedule.
#[derive(Debug, Clone, PartialEq)]
pub struct Firing {
    pub name: String,
    /// The time it was due (its key's time); a trigger's is when it was asked.
    pub fire_at_ms: i64,
    pub state: FiringState,
    /// `forkctl schedule trigger`, not the clock.
    pub manual: bool,
    pub session_id: Option<SessionId>,
    pub batch_id: Option<BatchId>,
    /// Why it was skipped or failed.
    pub reason: Option<String>,
    /// When its state last changed.
    pub at_ms: i64,
}

impl Firing {
    /// The idempotency key its batch is created under (its session's adds `/session`).
    pub fn key(name: &str, fire_at_ms: i64) -> String {
        let at = DateTime::<Utc>::from_timestamp_millis(fire_at_ms).unwrap_or_default();
        format!(
            "schedule/{name}/{}",
            at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
        )
    }
}

/// What a firing came to.
#[derive(Debug, Clone, PartialEq)]
pub struct FiringOutcome {
    pub state: FiringState,
    pub session_id: Option<SessionId>,
    pub batch_id: Option<BatchId>,
    pub reason: Option<String>,
}

/// A schedule's clock: its cron expression in its time zone.
#[derive(Debug, Clone)]
pub struct Cron {
    cron: croner::Cron,
    tz: Tz,
}

/// How many firings [`Cron::between`] counts at most.
pub const MAX_COUNTED: usize = 10_000;

/// How far ahead a search for the next firing looks before it gives up (an expression such as
/// `0 0 30 2 *` never fires).
const SEARCH_STEPS: usize = 10_000;

impl Cron {
    /// Parses a standard 5-field expression, or a 6-field one with seconds first, in `timezone`
    /// (empty: UTC).
    pub fn parse(expression: &str, timezone: &str) -> std::result::Result<Self, String> {
        let fields = expression.split_whitespace().count();
        if !(5..=6).contains(&fields) {
            return Err(format!(
                "{expression:?}: a cron expression has 5 fields (minute hour day month weekday), \
                 or 6 with seconds first"
            ));
        }
        let cron = croner::parser::CronParser::builder()
            .seconds(croner::parser::Seconds::Optional)
            .build()
            .parse(expression)
            .map_err(|e| format!("{expression:?}: {e}"))?;
        let tz = match timezone.trim() {
            "" => Tz::UTC,
            name => name
                .parse::<Tz>()
                .map_err(|_| format!("{name:?} is not an IANA time zone (e.g. Europe/Berlin)"))?,
        };
        Ok(Self { cron, tz })
    }

    /// The first firing after `after_ms` (milliseconds since the epoch), if any.
    ///
    /// Across a daylight-saving change a local time that does not exist (the hour skipped in
    /// spring) is skipped, not moved to the next valid time, and one that repeats (the hour
    /// lived twice in autumn) fires once, at its first occurrence.
    pub fn next_after(&self, after_ms: i64) -> Option<i64> {
        let mut cursor = self
            .tz
            .from_utc_datetime(&DateTime::<Utc>::from_timestamp_millis(after_ms)?.naive_utc());
        for _ in 0..SEARCH_STEPS {
            let next = self.cron.find_next_occurrence(&cursor, false).ok()?;
            if self.is_real(&next) {
                return Some(next.timestamp_millis());
            }
            cursor = next;
        }
        None
    }

    /// The firings in `(after_ms, until_ms]`, at most `limit` (the latest kept when there are
    /// more), and how many there were, counted up to [`MAX_COUNTED`] (past it the count stops
    /// there and the latest is found directly: a schedule every second after a day down would
    /// be 86,400 steps).
    pub fn between(&self, after_ms: i64, until_ms: i64, limit: usize) -> (Vec<i64>, usize) {
        let mut times = std::collections::VecDeque::new();
        let mut count = 0;
        let mut at = after_ms;
        while let Some(next) = self.next_after(at).filter(|n| *n <= until_ms) {
            count += 1;
            times.push_back(next);
            if times.len() > limit {
                times.pop_front();
            }
            if count == MAX_COUNTED {
                if let Some(last) = self.last_until(until_ms).filter(|l| *l > next) {
                    times.push_back(last);
                    if times.len() > limit {
                        times.pop_front();
                    }
                }
                break;
            }
            at = next;
        }
        (times.into(), count)
    }

    /// The latest firing at or before `until_ms`, if any.
    fn last_until(&self, until_ms: i64) -> Option<i64> {
        let mut cursor = self
            .tz
            .from_utc_datetime(&DateTime::<Utc>::from_timestamp_millis(until_ms)?.naive_utc());
        let mut inclusive = true;
        for _ in 0..SEARCH_STEPS {
            let previous = self
                .cron
                .find_previous_occurrence(&cursor, inclusive)
                .ok()?;
            if self.is_real(&previous) {
                return Some(previous.timestamp_millis());
            }
            cursor = previous;
            inclusive = false;
        }
        None
    }

    /// Whether `t` is a time the expression names as the local clock shows it: not a time the
    /// search moved out of a spring-forward gap, nor the second pass of a repeated hour.
    fn is_real(&self, t: &DateTime<Tz>) -> bool {
        if !self.cron.is_time_matching(t).unwrap_or(false) {
            return false;
        }
        match self.tz.from_local_datetime(&t.naive_local()) {
            LocalResult::Single(_) => true,
            LocalResult::Ambiguous(first, _) => first == *t,
            LocalResult::None => false,
        }
    }
}

/// The store's part of schedules.
#[async_trait]
pub trait ScheduleStore: Send + Sync {
    /// Stores a new schedule (`Conflict` when its tenant has one of that name).
    async fn create_schedule(&self, schedule: &Schedule) -> Result<()>;
    /// A tenant's schedules by name.
    async fn schedules(&self, tenant: &str) -> Result<Vec<Schedule>>;
    async fn schedule(&self, tenant: &str, name: &str) -> Result<Option<Schedule>>;
    /// Pauses or resumes a schedule, setting its next firing; whether it was there.
    async fn set_schedule_paused(
        &self,
        tenant: &str,
        name: &str,
        paused: bool,
        next_fire_at_ms: Option<i64>,
    ) -> Result<bool>;
    /// Removes a schedule and its firings; whether it was there.
    async fn delete_schedule(&self, tenant: &str, name: &str) -> Result<bool>;
    /// Every tenant's schedules not paused whose next firing is due at `now_ms`.
    async fn due_schedules(&self, now_ms: i64) -> Result<Vec<Schedule>>;
    /// Claims the firing at `fire_at_ms` for `daemon` until `claim_until_ms`: records it
    /// (`Firing`, or `outcome` when it is already decided, as a skipped one), and, when
    /// `advance` is given, moves the schedule's next firing from `advance.0` to `advance.1` (a
    /// schedule whose next firing is no longer `advance.0` was advanced by another daemon: nothing
    /// is claimed). Whether this daemon claimed it (`false`: already recorded).
    async fn claim_firing(
        &self,
        tenant: &str,
        claim: &FiringClaim,
        daemon: DaemonId,
    ) -> Result<bool>;
    /// Records what a claimed firing came to.
    async fn finish_firing(
        &self,
        tenant: &str,
        name: &str,
        fire_at_ms: i64,
        outcome: &FiringOutcome,
    ) -> Result<()>;
    /// Firings still `Firing` whose claim lapsed (their daemon died mid-way), with their
    /// tenants: to be fired again under the same key.
    async fn stale_firings(&self, now_ms: i64) -> Result<Vec<(String, Firing)>>;
    /// Takes over a stale firing's claim; whether this daemon got it.
    async fn reclaim_firing(
        &self,
        tenant: &str,
        name: &str,
        fire_at_ms: i64,
        daemon: DaemonId,
        claim_until_ms: i64,
    ) -> Result<bool>;
    /// A schedule's latest firings, newest first.
    async fn firings(&self, tenant: &str, name: &str, limit: u32) -> Result<Vec<Firing>>;
}

/// A firing to claim.
#[derive(Debug, Clone, PartialEq)]
pub struct FiringClaim {
    pub name: String,
    pub fire_at_ms: i64,
    pub manual: bool,
    pub claim_until_ms: i64,
    /// The schedule's next firing as read, and what it becomes.
    pub advance: Option<(Option<i64>, Option<i64>)>,
    /// Recorded at once instead of `Firing` (a missed or skipped firing).
    pub decided: Option<FiringOutcome>,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn ms(tz: Tz, y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> i64 {
        tz.with_ymd_and_hms(y, mo, d, h, mi, s)
            .earliest()
            .unwrap()
            .timestamp_millis()
    }

    #[test]
    fn five_and_six_fields_parse_and_others_say_why() {
        assert!(Cron::parse("0 3 * * 1-5", "Europe/Berlin").is_ok());
        assert!(Cron::parse("*/2 * * * * *", "").is_ok());
        let err = Cron::parse("* * *", "").unwrap_err();
        assert!(err.contains("5 fields"), "{err}");
        assert!(Cron::parse("61 * * * *", "").is_err());
        let err = Cron::parse("* * * * *", "Mars/Olympus").unwrap_err();
        assert!(err.contains("IANA"), "{err}");
    }

    #[test]
    fn weekday_mornings_in_berlin() {
        let cron = Cron::parse("0 3 * * 1-5", "Europe/Berlin").unwrap();
        let berlin = chrono_tz::Europe::Berlin;
        // Friday 2026-12-04 12:00 → Monday 03:00 Berlin (02:00 UTC).
        let next = cron.next_after(ms(berlin, 2026, 12, 4, 12, 0, 0)).unwrap();
        assert_eq!(next, ms(berlin, 2026, 12, 7, 3, 0, 0));
        let seconds = Cron::parse("*/2 * * * * *", "").unwrap();
        assert_eq!(seconds.next_after(1_000), Some(2_000));
        assert_eq!(seconds.next_after(2_000), Some(4_000));
    }

    #[test]
    fn a_local_time_that_does_not_exist_is_skipped() {
        // 2026-03-29: Berlin's clocks go from 02:00 to 03:00; 02:30 does not exist that day.
        let cron = Cron::parse("30 2 * * *", "Europe/Berlin").unwrap();
        let berlin = chrono_tz::Europe::Berlin;
        let next = cron.next_after(ms(berlin, 2026, 3, 28, 12, 0, 0)).unwrap();
        assert_eq!(
            next,
            ms(berlin, 2026, 3, 30, 2, 30, 0),
            "the 29th is skipped"
        );
    }

    #[test]
    fn a_local_time_that_repeats_fires_once() {
        // 2026-10-25: Berlin's clocks go from 03:00 back to 02:00; 02:30 happens twice.
        let cron = Cron::parse("30 2 * * *", "Europe/Berlin").unwrap();
        let berlin = chrono_tz::Europe::Berlin;
        let from = ms(berlin, 2026, 10, 24, 12, 0, 0);
        let (times, count) = cron.between(from, ms(berlin, 2026, 10, 26, 12, 0, 0), 10);
        assert_eq!(count, 2, "the 25th once, the 26th once: {times:?}");
        let first_pass = berlin
            .with_ymd_and_hms(2026, 10, 25, 2, 30, 0)
            .earliest()
            .unwrap()
            .timestamp_millis();
        assert_eq!(times[0], first_pass);
        // Every 30 minutes through the repeated hour: each local time once.
        let half_hours = Cron::parse("*/30 * * * *", "Europe/Berlin").unwrap();
        let (_, n) = half_hours.between(
            ms(berlin, 2026, 10, 25, 0, 0, 0),
            ms(berlin, 2026, 10, 25, 4, 0, 0),
            100,
        );
        assert_eq!(n, 8, "00:30 … 04:00 local, 02:00 and 02:30 once each");
    }

    #[test]
    fn keys_name_the_schedule_and_the_time() {
        assert_eq!(
            Firing::key("nightly", 1_765_000_000_000),
            "schedule/nightly/2025-12-06T05:46:40.000Z"
        );
    }

    #[test]
    fn a_long_backlog_is_counted_up_to_a_cap_and_its_latest_found() {
        let cron = Cron::parse("* * * * * *", "").unwrap();
        let day = 86_400_000;
        let (times, count) = cron.between(0, day, 1);
        assert_eq!(count, MAX_COUNTED);
        assert_eq!(times, vec![day], "the latest, found directly");
    }

    #[test]
    fn between_keeps_the_latest_and_counts_all() {
        let cron = Cron::parse("*/2 * * * * *", "").unwrap();
        let (times, count) = cron.between(0, 20_000, 3);
        assert_eq!(count, 10);
        assert_eq!(times, vec![16_000, 18_000, 20_000]);
    }
}
