//! The schedules' clock (docs/operations.md, "Webhooks and schedules"): a loop that finds the
//! schedules due, claims each firing in the store (the claim moves the schedule's next firing on
//! in the same transaction, so of several daemons one claims it), and fires it as the schedule's
//! tenant through the same conversions and engine calls as `CreateSession` and `ForkBatch`,
//! under the firing's idempotency keys: a firing fired twice (its daemon died mid-way, and the
//! claim lapsed) forks once.
//!
//! It lives here, beside the service, because a schedule's spec is the wire's requests.

use std::time::Duration;

use forkd_core::Tenant;
use forkd_core::query::AgentFilter;
use forkd_core::schedule::{
    CatchUp, Cron, Firing, FiringClaim, FiringOutcome, FiringState, Overlap, Schedule,
};
use forkd_engine::Engine;
use forkd_proto::v1 as pb;
use prost::Message as _;
use tokio_util::sync::CancellationToken;

use crate::TokenStore;
use crate::convert;
use crate::status::ApiError;

/// How often the clock looks for due schedules.
const TICK: Duration = Duration::from_millis(100);

/// A firing this late is missed (the daemon was down or stalled), not on time.
const ON_TIME: Duration = Duration::from_secs(2);

/// Every how many ticks firings whose claim lapsed are looked for (once a second): a daemon
/// dies rarely, and an idle one need not read the table ten times a second.
const STALE_EVERY: u32 = 10;

/// How long a daemon's claim on a firing lasts: its session and batch are created well within.
const CLAIM: Duration = Duration::from_secs(60);

/// Starts the clock; it stops when `stop` is cancelled (the daemon's drain). A token tenant's
/// schedules fire only while `tokens` holds a token of its name: one revoked or deleted has its
/// firings skipped, saying why, until it has a token again.
pub fn start_schedules(engine: Engine, tokens: TokenStore, stop: CancellationToken) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut ticks: u32 = 0;
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            ticks = ticks.wrapping_add(1);
            if let Err(e) = tick_once(&engine, &tokens, ticks % STALE_EVERY == 1).await {
                tracing::warn!(error = %e, "The schedules' clock could not read the store");
            }
        }
    });
}

/// Milliseconds since the epoch, as schedules' times are kept.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, millis)
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Claims and fires what is due; with `stale`, also fires again what a dead daemon left.
async fn tick_once(
    engine: &Engine,
    tokens: &TokenStore,
    stale: bool,
) -> Result<(), forkd_core::store::StoreError> {
    let store = engine.store();
    let daemon = store.holder().daemon;
    let now = now_ms();
    for schedule in store.due_schedules(now).await? {
        let Some(claim) = plan(&schedule, now) else {
            continue;
        };
        let tenant = schedule.tenant.clone();
        let (fire, missed) = claim;
        // The first claim moves the schedule on; whoever makes it fires.
        let (first, second) = match fire {
            Some(fire) => (fire, missed),
            None => match missed {
                Some(missed) => (missed, None),
                None => continue,
            },
        };
        if !store.claim_firing(&tenant, &first, daemon).await? {
            continue;
        }
        if let Some(missed) = second {
            store.claim_firing(&tenant, &missed, daemon).await?;
        }
        if first.decided.is_none() {
            spawn_firing(engine.clone(), tokens, schedule, first.fire_at_ms, false);
        }
    }
    if !stale {
        return Ok(());
    }
    for (tenant, firing) in store.stale_firings(now).await? {
        let until = now + millis(CLAIM);
        let name = firing.name.clone();
        if !store
            .reclaim_firing(&tenant, &name, firing.fire_at_ms, daemon, until)
            .await?
        {
            continue;
        }
        if let Some(schedule) = store.schedule(&tenant, &name).await? {
            spawn_firing(
                engine.clone(),
                tokens,
                schedule,
                firing.fire_at_ms,
                firing.manual,
            );
        }
    }
    Ok(())
}

/// What a due schedule's claim is: the firing to fire, and the row recording the firings missed
/// (while no daemon ran), per its catch-up rule.
fn plan(schedule: &Schedule, now: i64) -> Option<(Option<FiringClaim>, Option<FiringClaim>)> {
    let due = schedule.next_fire_at_ms?;
    let cron = match Cron::parse(&schedule.cron, &schedule.timezone) {
        Ok(cron) => cron,
        Err(e) => {
            // Said once, in a failed firing, and the schedule has no next firing (it was due at
            // every tick otherwise, and said so ten times a second); made again with a good
            // expression, it starts anew.
            tracing::warn!(schedule = %schedule.name, error = %e, "A stored schedule does not parse; it stops");
            let failed = FiringClaim {
                name: schedule.name.clone(),
                fire_at_ms: due,
                manual: false,
                claim_until_ms: now,
                advance: Some((Some(due), None)),
                decided: Some(FiringOutcome {
                    state: FiringState::Failed,
                    session_id: None,
                    batch_id: None,
                    reason: Some(format!(
                        "the schedule's cron {:?} ({}) does not parse: {e}; it fires no more",
                        schedule.cron, schedule.timezone
                    )),
                }),
            };
            return Some((None, Some(failed)));
        }
    };
    let (later, more) = cron.between(due, now, 1);
    let latest = later.last().copied().unwrap_or(due);
    let count = 1 + more;
    let next = cron.next_after(now.max(latest));
    let advance = Some((Some(due), next));
    let on_time = now - latest <= millis(ON_TIME);
    let fire_at = (on_time || schedule.catch_up == CatchUp::Once).then_some(latest);
    let missed = count - usize::from(fire_at.is_some());
    let fire = fire_at.map(|at| FiringClaim {
        name: schedule.name.clone(),
        fire_at_ms: at,
        manual: false,
        claim_until_ms: now + millis(CLAIM),
        advance,
        decided: None,
    });
    // Past one firing, `latest` differs from `due`: the missed row has a time of its own.
    let missed = (missed > 0).then(|| {
        let rule = match schedule.catch_up {
            CatchUp::Once => "caught up by one firing",
            CatchUp::None => "catch-up: none",
        };
        FiringClaim {
            name: schedule.name.clone(),
            fire_at_ms: due,
            manual: false,
            claim_until_ms: now,
            advance: if fire.is_some() { None } else { advance },
            decided: Some(FiringOutcome {
                state: FiringState::Skipped,
                session_id: None,
                batch_id: None,
                reason: Some(format!(
                    "{}{missed} firing{} missed while no daemon ran ({rule})",
                    if count >= forkd_core::schedule::MAX_COUNTED {
                        "at least "
                    } else {
                        ""
                    },
                    if missed == 1 { "" } else { "s" }
                )),
            }),
        }
    });
    Some((fire, missed))
}

fn spawn_firing(
    engine: Engine,
    tokens: &TokenStore,
    schedule: Schedule,
    fire_at_ms: i64,
    manual: bool,
) {
    let revoked = revoked(tokens, &schedule.tenant);
    tokio::spawn(async move {
        let outcome = match revoked {
            Some(reason) => {
                tracing::info!(schedule = %schedule.name, tenant = %schedule.tenant, "A schedule's firing skipped: its tenant has no token");
                FiringOutcome {
                    state: FiringState::Skipped,
                    session_id: None,
                    batch_id: None,
                    reason: Some(reason),
                }
            }
            None => fire(&engine, &schedule, fire_at_ms, manual).await,
        };
        if let Err(e) = engine
            .store()
            .finish_firing(&schedule.tenant, &schedule.name, fire_at_ms, &outcome)
            .await
        {
            // Its claim lapses and it is fired again, under the same keys.
            tracing::warn!(schedule = %schedule.name, error = %e, "A firing's outcome was not recorded");
        }
    });
}

/// Why `tenant`'s schedules may not fire now (its token was revoked or deleted), or `None`. The
/// local user needs no token; a token file that cannot be read is not a revocation (logged).
fn revoked(tokens: &TokenStore, tenant: &str) -> Option<String> {
    if tenant == forkd_core::session::LOCAL_TENANT {
        return None;
    }
    match tokens.list() {
        Ok(list) if list.iter().any(|t| t.name == tenant) => None,
        Ok(_) => Some(format!(
            "tenant {tenant} has no token (it was revoked or deleted): its schedules do not fire \
             until it has one again (forkd token create {tenant})"
        )),
        Err(error) => {
            tracing::warn!(%error, "Cannot read the tokens; the schedule fires as before");
            None
        }
    }
}

/// Fires one firing: its session and batch, from the spec, under the firing's keys; or why not.
pub(crate) async fn fire(
    engine: &Engine,
    schedule: &Schedule,
    fire_at_ms: i64,
    manual: bool,
) -> FiringOutcome {
    let outcome = fire_spec(engine, schedule, fire_at_ms, manual).await;
    let outcome = outcome.unwrap_or_else(|e| FiringOutcome {
        state: FiringState::Failed,
        session_id: None,
        batch_id: None,
        reason: Some(tonic::Status::from(e).message().to_owned()),
    });
    tracing::info!(
        schedule = %schedule.name,
        tenant = %schedule.tenant,
        state = outcome.state.as_str(),
        batch.id = outcome.batch_id.map(|b| b.to_string()).unwrap_or_default(),
        "Schedule fired"
    );
    outcome
}

async fn fire_spec(
    engine: &Engine,
    schedule: &Schedule,
    fire_at_ms: i64,
    manual: bool,
) -> Result<FiringOutcome, ApiError> {
    let spec = pb::ScheduleSpec::decode(schedule.spec.as_slice())
        .map_err(|e| ApiError::BadRequest(format!("the stored spec does not decode: {e}")))?;
    let tenant = Tenant::new(&schedule.tenant)
        .map_err(|e| ApiError::BadRequest(format!("the schedule's tenant: {e}")))?;
    let scoped = engine.for_tenant(tenant);
    if !manual && schedule.overlap == Overlap::Skip {
        let earlier = engine
            .store()
            .firings(&schedule.tenant, &schedule.name, 16)
            .await
            .map_err(forkd_engine::EngineError::from)?;
        let previous = earlier
            .iter()
            .filter(|f| f.fire_at_ms != fire_at_ms)
            .find_map(|f| f.batch_id);
        if let Some(batch) = previous {
            let live = scoped
                .list_agents(AgentFilter {
                    batch_id: Some(batch),
                    ..AgentFilter::default()
                })
                .await?;
            if !live.is_empty() {
                return Ok(FiringOutcome {
                    state: FiringState::Skipped,
                    session_id: None,
                    batch_id: None,
                    reason: Some(format!(
                        "the previous firing's batch {batch} still runs (overlap: skip)"
                    )),
                });
            }
        }
    }
    let key = Firing::key(&schedule.name, fire_at_ms);
    let mut session = spec.session.unwrap_or_default();
    session.idempotency_key = format!("{key}/session");
    let view = scoped
        .create_session(convert::new_session(session)?)
        .await?;
    let mut batch = spec.batch.unwrap_or_default();
    batch.session_id = view.session.id.to_string();
    batch.idempotency_key = key;
    let mut options = convert::batch_options(&batch).map_err(ApiError::BadRequest)?;
    options.schedule = Some(schedule.name.clone());
    let directives = batch
        .directives
        .into_iter()
        .map(convert::directive)
        .collect();
    let submitted = scoped
        .fork_batch(view.session.id, directives, options)
        .await?;
    Ok(FiringOutcome {
        state: FiringState::Fired,
        session_id: Some(view.session.id),
        batch_id: Some(submitted.batch_id),
        reason: None,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn schedule(cron: &str) -> Schedule {
        Schedule {
            tenant: "local".into(),
            name: "nightly".into(),
            cron: cron.into(),
            timezone: "UTC".into(),
            overlap: Overlap::Skip,
            catch_up: CatchUp::Once,
            paused: false,
            spec: Vec::new(),
            created_at_ms: 0,
            next_fire_at_ms: Some(60_000),
            upload_id: None,
        }
    }

    #[test]
    fn a_stored_cron_that_does_not_parse_fails_once_and_stops() {
        let (fire, failed) = plan(&schedule("not a cron"), 61_000).unwrap();
        assert!(fire.is_none());
        let failed = failed.unwrap();
        assert_eq!(failed.advance, Some((Some(60_000), None)));
        let outcome = failed.decided.unwrap();
        assert_eq!(outcome.state, FiringState::Failed);
        assert!(outcome.reason.unwrap().contains("does not parse"));
        // A good one fires on time and moves on.
        let (fire, missed) = plan(&schedule("* * * * *"), 61_000).unwrap();
        assert_eq!(fire.unwrap().fire_at_ms, 60_000);
        assert!(missed.is_none());
    }
}
