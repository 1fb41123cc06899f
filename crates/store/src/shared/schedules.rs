//! Schedules and their firings ([`forkd_core::schedule::ScheduleStore`]).

use async_trait::async_trait;
use forkd_core::DaemonId;
use forkd_core::schedule::{
    Firing, FiringClaim, FiringOutcome, FiringState, Schedule, ScheduleStore,
};

use super::dialect::{Conn, DriverStore, FOR_UPDATE};
use super::tx::{StoreResult, db};
use crate::error::Result;
use crate::rows::convert::{now_ms, opt_id};
use crate::rows::schedules::{FIRING_COLUMNS, FiringRow, SCHEDULE_COLUMNS, ScheduleRow};
use crate::{DbError, StoreError};

async fn create(conn: &mut Conn, s: &Schedule) -> Result<()> {
    let inserted = sqlx::query(
        "INSERT INTO schedules (tenant, name, cron, timezone, overlap, catch_up, paused, spec, \
         created_at_ms, next_fire_at_ms, upload_id) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) \
         ON CONFLICT (tenant, name) DO NOTHING",
    )
    .bind(&s.tenant)
    .bind(&s.name)
    .bind(&s.cron)
    .bind(&s.timezone)
    .bind(s.overlap.as_str())
    .bind(s.catch_up.as_str())
    .bind(s.paused)
    .bind(&s.spec)
    .bind(s.created_at_ms)
    .bind(s.next_fire_at_ms)
    .bind(opt_id(s.upload_id))
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if inserted == 0 {
        return Err(DbError::Store(StoreError::Conflict(format!(
            "a schedule named {:?} exists; delete it first, or choose another name",
            s.name
        ))));
    }
    Ok(())
}

async fn claim(conn: &mut Conn, tenant: &str, c: &FiringClaim, daemon: DaemonId) -> Result<bool> {
    if let Some((expected, next)) = c.advance {
        let current: Option<Option<i64>> = sqlx::query_scalar(super::sql(format!(
            "SELECT next_fire_at_ms FROM schedules WHERE tenant = $1 AND name = $2{FOR_UPDATE}"
        )))
        .bind(tenant)
        .bind(&c.name)
        .fetch_optional(&mut *conn)
        .await?;
        // Deleted, or advanced by another daemon since it was read.
        if current != Some(expected) {
            return Ok(false);
        }
        sqlx::query("UPDATE schedules SET next_fire_at_ms = $3 WHERE tenant = $1 AND name = $2")
            .bind(tenant)
            .bind(&c.name)
            .bind(next)
            .execute(&mut *conn)
            .await?;
    }
    let (state, session, batch, reason, claimed_by, until) = match &c.decided {
        Some(o) => (
            o.state,
            opt_id(o.session_id),
            opt_id(o.batch_id),
            o.reason.clone(),
            None,
            None,
        ),
        None => (
            FiringState::Firing,
            None,
            None,
            None,
            Some(daemon.to_string()),
            Some(c.claim_until_ms),
        ),
    };
    let inserted = sqlx::query(
        "INSERT INTO schedule_firings (tenant, name, fire_at_ms, state, manual, session_id, \
         batch_id, reason, at_ms, claimed_by, claim_until_ms) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) \
         ON CONFLICT (tenant, name, fire_at_ms) DO NOTHING",
    )
    .bind(tenant)
    .bind(&c.name)
    .bind(c.fire_at_ms)
    .bind(state.as_str())
    .bind(c.manual)
    .bind(session)
    .bind(batch)
    .bind(reason)
    .bind(now_ms())
    .bind(claimed_by)
    .bind(until)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    Ok(inserted == 1)
}

#[async_trait]
impl ScheduleStore for DriverStore {
    async fn create_schedule(&self, schedule: &Schedule) -> StoreResult<()> {
        write_tx!(self, |tx| create(&mut tx, schedule).await?)
    }

    async fn schedules(&self, tenant: &str) -> StoreResult<Vec<Schedule>> {
        let rows: Result<Vec<ScheduleRow>> = sqlx::query_as(super::sql(format!(
            "SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE tenant = $1 ORDER BY name"
        )))
        .bind(tenant)
        .fetch_all(self.readers())
        .await
        .map_err(Into::into);
        db(rows.and_then(|rows| rows.into_iter().map(ScheduleRow::into_schedule).collect()))
    }

    async fn schedule(&self, tenant: &str, name: &str) -> StoreResult<Option<Schedule>> {
        let row: Result<Option<ScheduleRow>> = sqlx::query_as(super::sql(format!(
            "SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE tenant = $1 AND name = $2"
        )))
        .bind(tenant)
        .bind(name)
        .fetch_optional(self.readers())
        .await
        .map_err(Into::into);
        db(row.and_then(|row| row.map(ScheduleRow::into_schedule).transpose()))
    }

    async fn set_schedule_paused(
        &self,
        tenant: &str,
        name: &str,
        paused: bool,
        next_fire_at_ms: Option<i64>,
    ) -> StoreResult<bool> {
        write_tx!(self, |tx| {
            sqlx::query(
                "UPDATE schedules SET paused = $3, next_fire_at_ms = $4 \
                 WHERE tenant = $1 AND name = $2",
            )
            .bind(tenant)
            .bind(name)
            .bind(paused)
            .bind(next_fire_at_ms)
            .execute(&mut *tx)
            .await?
            .rows_affected()
                == 1
        })
    }

    async fn delete_schedule(&self, tenant: &str, name: &str) -> StoreResult<bool> {
        write_tx!(self, |tx| {
            sqlx::query("DELETE FROM schedule_firings WHERE tenant = $1 AND name = $2")
                .bind(tenant)
                .bind(name)
                .execute(&mut *tx)
                .await?;
            sqlx::query("DELETE FROM schedules WHERE tenant = $1 AND name = $2")
                .bind(tenant)
                .bind(name)
                .execute(&mut *tx)
                .await?
                .rows_affected()
                == 1
        })
    }

    async fn due_schedules(&self, now_ms: i64) -> StoreResult<Vec<Schedule>> {
        let rows: Result<Vec<ScheduleRow>> = sqlx::query_as(super::sql(format!(
            "SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE NOT paused \
             AND next_fire_at_ms IS NOT NULL AND next_fire_at_ms <= $1 ORDER BY next_fire_at_ms"
        )))
        .bind(now_ms)
        .fetch_all(self.readers())
        .await
        .map_err(Into::into);
        db(rows.and_then(|rows| rows.into_iter().map(ScheduleRow::into_schedule).collect()))
    }

    async fn claim_firing(
        &self,
        tenant: &str,
        claim_: &FiringClaim,
        daemon: DaemonId,
    ) -> StoreResult<bool> {
        write_tx!(self, |tx| claim(&mut tx, tenant, claim_, daemon).await?)
    }

    async fn finish_firing(
        &self,
        tenant: &str,
        name: &str,
        fire_at_ms: i64,
        outcome: &FiringOutcome,
    ) -> StoreResult<()> {
        write_tx!(self, |tx| {
            sqlx::query(
                "UPDATE schedule_firings SET state = $4, session_id = $5, batch_id = $6, \
                 reason = $7, at_ms = $8, claimed_by = NULL, claim_until_ms = NULL \
                 WHERE tenant = $1 AND name = $2 AND fire_at_ms = $3",
            )
            .bind(tenant)
            .bind(name)
            .bind(fire_at_ms)
            .bind(outcome.state.as_str())
            .bind(opt_id(outcome.session_id))
            .bind(opt_id(outcome.batch_id))
            .bind(outcome.reason.as_deref())
            .bind(now_ms())
            .execute(&mut *tx)
            .await?;
        })
    }

    async fn stale_firings(&self, now_ms: i64) -> StoreResult<Vec<(String, Firing)>> {
        let rows: Result<Vec<FiringRow>> = sqlx::query_as(super::sql(format!(
            "SELECT {FIRING_COLUMNS} FROM schedule_firings \
             WHERE state = 'firing' AND claim_until_ms < $1"
        )))
        .bind(now_ms)
        .fetch_all(self.readers())
        .await
        .map_err(Into::into);
        db(rows.and_then(|rows| rows.into_iter().map(FiringRow::into_firing).collect()))
    }

    async fn reclaim_firing(
        &self,
        tenant: &str,
        name: &str,
        fire_at_ms: i64,
        daemon: DaemonId,
        claim_until_ms: i64,
    ) -> StoreResult<bool> {
        let now = now_ms();
        write_tx!(self, |tx| {
            sqlx::query(
                "UPDATE schedule_firings SET claimed_by = $4, claim_until_ms = $5 \
                 WHERE tenant = $1 AND name = $2 AND fire_at_ms = $3 AND state = 'firing' \
                 AND claim_until_ms < $6",
            )
            .bind(tenant)
            .bind(name)
            .bind(fire_at_ms)
            .bind(daemon.to_string())
            .bind(claim_until_ms)
            .bind(now)
            .execute(&mut *tx)
            .await?
            .rows_affected()
                == 1
        })
    }

    async fn firings(&self, tenant: &str, name: &str, limit: u32) -> StoreResult<Vec<Firing>> {
        let rows: Result<Vec<FiringRow>> = sqlx::query_as(super::sql(format!(
            "SELECT {FIRING_COLUMNS} FROM schedule_firings WHERE tenant = $1 AND name = $2 \
             ORDER BY fire_at_ms DESC LIMIT $3"
        )))
        .bind(tenant)
        .bind(name)
        .bind(super::limit_param(limit))
        .fetch_all(self.readers())
        .await
        .map_err(Into::into);
        db(rows.and_then(|rows| {
            rows.into_iter()
                .map(|r| r.into_firing().map(|(_, f)| f))
                .collect()
        }))
    }
}
