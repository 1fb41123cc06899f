//! Rows of `schedules` and `schedule_firings`, and their domain values.

use forkd_core::schedule::{Firing, FiringState, Schedule};

use super::convert::{corrupt, parse_id};
use crate::error::Result;

/// The columns [`ScheduleRow`] reads.
pub(crate) const SCHEDULE_COLUMNS: &str = "tenant, name, cron, timezone, overlap, catch_up, paused, spec, created_at_ms, \
     next_fire_at_ms, upload_id";

#[derive(sqlx::FromRow)]
pub(crate) struct ScheduleRow {
    tenant: String,
    name: String,
    cron: String,
    timezone: String,
    overlap: String,
    catch_up: String,
    paused: bool,
    spec: Vec<u8>,
    created_at_ms: i64,
    next_fire_at_ms: Option<i64>,
    upload_id: Option<String>,
}

impl ScheduleRow {
    pub(crate) fn into_schedule(self) -> Result<Schedule> {
        Ok(Schedule {
            tenant: self.tenant,
            name: self.name,
            cron: self.cron,
            timezone: self.timezone,
            overlap: self
                .overlap
                .parse()
                .map_err(|e| corrupt("schedule overlap", e))?,
            catch_up: self
                .catch_up
                .parse()
                .map_err(|e| corrupt("schedule catch_up", e))?,
            paused: self.paused,
            spec: self.spec,
            created_at_ms: self.created_at_ms,
            next_fire_at_ms: self.next_fire_at_ms,
            upload_id: self
                .upload_id
                .map(|u| parse_id(&u, "schedule upload"))
                .transpose()?,
        })
    }
}

/// The columns [`FiringRow`] reads.
pub(crate) const FIRING_COLUMNS: &str =
    "tenant, name, fire_at_ms, state, manual, session_id, batch_id, reason, at_ms";

#[derive(sqlx::FromRow)]
pub(crate) struct FiringRow {
    tenant: String,
    name: String,
    fire_at_ms: i64,
    state: String,
    manual: bool,
    session_id: Option<String>,
    batch_id: Option<String>,
    reason: Option<String>,
    at_ms: i64,
}

impl FiringRow {
    /// The firing and its tenant.
    pub(crate) fn into_firing(self) -> Result<(String, Firing)> {
        let state: FiringState = self.state.parse().map_err(|e| corrupt("firing state", e))?;
        Ok((
            self.tenant,
            Firing {
                name: self.name,
                fire_at_ms: self.fire_at_ms,
                state,
                manual: self.manual,
                session_id: self
                    .session_id
                    .map(|s| parse_id(&s, "firing session"))
                    .transpose()?,
                batch_id: self
                    .batch_id
                    .map(|b| parse_id(&b, "firing batch"))
                    .transpose()?,
                reason: self.reason,
                at_ms: self.at_ms,
            },
        ))
    }
}
