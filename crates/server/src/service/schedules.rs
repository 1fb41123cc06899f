//! Schedule RPCs: a tenant's schedules, their next firing times and latest firings, pausing and
//! triggering (the clock itself is `crate::schedules`). Free functions on the engine, so this
//! file reaches nothing of the service's own.

use std::collections::BTreeMap;

use forkd_core::AgentState;
use forkd_core::query::AgentFilter;
use forkd_core::schedule::{Cron, Firing, FiringClaim, Schedule};
use forkd_core::store::StoreError;
use forkd_engine::{Engine, EngineError};
use forkd_proto::v1 as pb;
use prost::Message as _;

use crate::auth::Tenant;
use crate::convert::{self, timestamp};
use crate::schedules::now_ms;
use crate::status::ApiError;

/// Next firing times `GetSchedule` shows, and latest firings.
const NEXT_SHOWN: usize = 5;
const FIRINGS_SHOWN: u32 = 10;

/// The longest name.
const MAX_NAME: usize = 64;

fn check_name(name: &str) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(ApiError::BadRequest(format!(
            "{:?} is not a schedule name: 1 to {MAX_NAME} letters, digits, `.`, `_` or `-`",
            name.chars().take(MAX_NAME + 1).collect::<String>()
        )))
    }
}

fn not_found(name: &str) -> ApiError {
    ApiError::Engine(EngineError::NotFound {
        kind: "schedule",
        id: name.to_owned(),
    })
}

fn store_error(e: StoreError) -> ApiError {
    match e {
        StoreError::Conflict(why) => ApiError::Engine(EngineError::WrongState(why)),
        other => ApiError::Engine(other.into()),
    }
}

/// The most schedules one tenant may have: each fires a session and a batch on its own clock.
const MAX_SCHEDULES: usize = 256;

pub(super) async fn create(
    engine: &Engine,
    tenant: Tenant,
    req: pb::CreateScheduleRequest,
) -> Result<pb::ScheduleResponse, ApiError> {
    let name = req.name.trim().to_owned();
    check_name(&name)?;
    let cron = Cron::parse(&req.cron, &req.timezone).map_err(ApiError::BadRequest)?;
    let overlap = match req.overlap.trim() {
        "" => Default::default(),
        o => o
            .parse()
            .map_err(|e| ApiError::BadRequest(format!("overlap: {e}")))?,
    };
    let catch_up = match req.catch_up.trim() {
        "" => Default::default(),
        c => c
            .parse()
            .map_err(|e| ApiError::BadRequest(format!("catch_up: {e}")))?,
    };
    let spec = req
        .spec
        .ok_or_else(|| ApiError::BadRequest("spec is required: the session and batch".into()))?;
    // Checked now as each firing will read it, so that a broken spec is refused here.
    let session = spec
        .session
        .clone()
        .ok_or_else(|| ApiError::BadRequest("spec.session is required".into()))?;
    if !session.mcp_config_json.trim().is_empty() {
        // They may hold secrets, which a session keeps sealed and a stored spec would not.
        return Err(ApiError::BadRequest(
            "a schedule's session cannot define its own MCP servers (mcp_config_json); name \
             the operator's (mcp_servers) instead"
                .into(),
        ));
    }
    if !session.hooks_json.trim().is_empty() {
        // The same: a session's own hooks are stored only sealed.
        return Err(ApiError::BadRequest(
            "a schedule's session cannot bring its own hooks (hooks_json); the operator's \
             hooks.json runs for every session of the tenant"
                .into(),
        ));
    }
    let upload_id = convert::new_session(session)?.upload;
    if let Some(upload) = upload_id {
        // Kept while the schedule names it: the tenant's own, and there now.
        let found = engine
            .store()
            .get_upload(tenant.name(), upload)
            .await
            .map_err(store_error)?;
        if found.is_none() {
            return Err(ApiError::Engine(EngineError::NotFound {
                kind: "upload",
                id: upload.to_string(),
            }));
        }
    }
    let batch = spec
        .batch
        .as_ref()
        .ok_or_else(|| ApiError::BadRequest("spec.batch is required".into()))?;
    if batch.directives.is_empty() {
        return Err(ApiError::BadRequest(
            "spec.batch has no directives: each firing forks one child per directive".into(),
        ));
    }
    convert::batch_options(batch).map_err(ApiError::BadRequest)?;
    if let Some(webhook) = convert::batch_options(batch).ok().and_then(|o| o.webhook) {
        engine.for_tenant(tenant.clone()).webhook(webhook).await?;
    }
    let held = engine
        .store()
        .schedules(tenant.name())
        .await
        .map_err(store_error)?
        .len();
    if held >= MAX_SCHEDULES {
        return Err(ApiError::Engine(EngineError::OverLimit(format!(
            "tenant {} has {held} schedules, the most a tenant may have ({MAX_SCHEDULES}); \
             delete one first",
            tenant.name()
        ))));
    }
    let now = now_ms();
    let schedule = Schedule {
        tenant: tenant.name().to_owned(),
        name,
        cron: req.cron.trim().to_owned(),
        timezone: match req.timezone.trim() {
            "" => "UTC".to_owned(),
            tz => tz.to_owned(),
        },
        overlap,
        catch_up,
        paused: false,
        spec: spec.encode_to_vec(),
        created_at_ms: now,
        next_fire_at_ms: cron.next_after(now),
        upload_id,
    };
    engine
        .store()
        .create_schedule(&schedule)
        .await
        .map_err(store_error)?;
    Ok(pb::ScheduleResponse {
        schedule: Some(detailed(engine, &tenant, &schedule).await?),
    })
}

pub(super) async fn list(
    engine: &Engine,
    tenant: Tenant,
) -> Result<pb::ListSchedulesResponse, ApiError> {
    let all = engine
        .store()
        .schedules(tenant.name())
        .await
        .map_err(store_error)?;
    Ok(pb::ListSchedulesResponse {
        schedules: all.iter().map(|s| summary(s, None)).collect(),
    })
}

async fn own(engine: &Engine, tenant: &Tenant, name: &str) -> Result<Schedule, ApiError> {
    engine
        .store()
        .schedule(tenant.name(), name.trim())
        .await
        .map_err(store_error)?
        .ok_or_else(|| not_found(name))
}

pub(super) async fn get(
    engine: &Engine,
    tenant: Tenant,
    req: pb::ScheduleNameRequest,
) -> Result<pb::ScheduleResponse, ApiError> {
    let schedule = own(engine, &tenant, &req.name).await?;
    Ok(pb::ScheduleResponse {
        schedule: Some(detailed(engine, &tenant, &schedule).await?),
    })
}

/// Pauses or resumes; a resumed schedule fires next at its first time from now.
pub(super) async fn set_paused(
    engine: &Engine,
    tenant: Tenant,
    req: pb::ScheduleNameRequest,
    paused: bool,
) -> Result<pb::ScheduleResponse, ApiError> {
    let schedule = own(engine, &tenant, &req.name).await?;
    let next = if paused {
        schedule.next_fire_at_ms
    } else {
        Cron::parse(&schedule.cron, &schedule.timezone)
            .map_err(ApiError::BadRequest)?
            .next_after(now_ms())
    };
    engine
        .store()
        .set_schedule_paused(tenant.name(), &schedule.name, paused, next)
        .await
        .map_err(store_error)?;
    get(engine, tenant, req).await
}

pub(super) async fn delete(
    engine: &Engine,
    tenant: Tenant,
    req: pb::ScheduleNameRequest,
) -> Result<pb::DeleteScheduleResponse, ApiError> {
    let deleted = engine
        .store()
        .delete_schedule(tenant.name(), req.name.trim())
        .await
        .map_err(store_error)?;
    if !deleted {
        return Err(not_found(&req.name));
    }
    Ok(pb::DeleteScheduleResponse {})
}

/// Fires now: claimed as any firing is (so a crash mid-way fires it again, once), then fired.
pub(super) async fn trigger(
    engine: &Engine,
    tenant: Tenant,
    req: pb::ScheduleNameRequest,
) -> Result<pb::TriggerScheduleResponse, ApiError> {
    let schedule = own(engine, &tenant, &req.name).await?;
    let store = engine.store();
    let mut at = now_ms();
    let claim = |fire_at_ms| FiringClaim {
        name: schedule.name.clone(),
        fire_at_ms,
        manual: true,
        claim_until_ms: fire_at_ms + 60_000,
        advance: None,
        decided: None,
    };
    // Two triggers in one millisecond are two firings.
    while !store
        .claim_firing(tenant.name(), &claim(at), store.holder().daemon)
        .await
        .map_err(store_error)?
    {
        at += 1;
    }
    let outcome = crate::schedules::fire(engine, &schedule, at, true).await;
    store
        .finish_firing(tenant.name(), &schedule.name, at, &outcome)
        .await
        .map_err(store_error)?;
    let firing = Firing {
        name: schedule.name.clone(),
        fire_at_ms: at,
        state: outcome.state,
        manual: true,
        session_id: outcome.session_id,
        batch_id: outcome.batch_id,
        reason: outcome.reason,
        at_ms: now_ms(),
    };
    Ok(pb::TriggerScheduleResponse {
        firing: Some(firing_to_pb(&firing, None)),
    })
}

/// A schedule as listed: no next times nor firings.
fn summary(s: &Schedule, spec: Option<&pb::ScheduleSpec>) -> pb::Schedule {
    let decoded;
    let spec = match spec {
        Some(spec) => Some(spec),
        None => {
            decoded = pb::ScheduleSpec::decode(s.spec.as_slice()).ok();
            decoded.as_ref()
        }
    };
    let batch = spec.and_then(|s| s.batch.as_ref());
    pb::Schedule {
        name: s.name.clone(),
        cron: s.cron.clone(),
        timezone: s.timezone.clone(),
        overlap: s.overlap.as_str().to_owned(),
        catch_up: s.catch_up.as_str().to_owned(),
        paused: s.paused,
        created_at: Some(timestamp(s.created_at_ms)),
        next_fires: Vec::new(),
        firings: Vec::new(),
        directives: batch.map_or(0, |b| u32::try_from(b.directives.len()).unwrap_or(u32::MAX)),
        webhook_id: batch.map(|b| b.webhook_id.clone()).unwrap_or_default(),
    }
}

/// A schedule with its next firing times and its latest firings with their batches' results.
async fn detailed(
    engine: &Engine,
    tenant: &Tenant,
    s: &Schedule,
) -> Result<pb::Schedule, ApiError> {
    let mut out = summary(s, None);
    if !s.paused
        && let (Ok(cron), Some(first)) = (Cron::parse(&s.cron, &s.timezone), s.next_fire_at_ms)
    {
        let mut at = first;
        out.next_fires.push(timestamp(at));
        while out.next_fires.len() < NEXT_SHOWN {
            match cron.next_after(at) {
                Some(next) => {
                    out.next_fires.push(timestamp(next));
                    at = next;
                }
                None => break,
            }
        }
    }
    let firings = engine
        .store()
        .firings(tenant.name(), &s.name, FIRINGS_SHOWN)
        .await
        .map_err(store_error)?;
    let scoped = engine.for_tenant(tenant.clone());
    for firing in &firings {
        let results = match firing.batch_id {
            Some(batch) => {
                let agents = scoped
                    .list_agents(AgentFilter {
                        batch_id: Some(batch),
                        include_ended: true,
                        ..AgentFilter::default()
                    })
                    .await?;
                let mut by_state: BTreeMap<&str, u32> = BTreeMap::new();
                for a in &agents {
                    *by_state.entry(a.state.as_str()).or_default() += 1;
                }
                let cost = agents.iter().map(|a| a.cost_usd).sum();
                let count = |state: AgentState| by_state.get(state.as_str()).copied().unwrap_or(0);
                Some(Results {
                    children: u32::try_from(agents.len()).unwrap_or(u32::MAX),
                    completed: count(AgentState::Completed),
                    failed: count(AgentState::Failed)
                        + count(AgentState::Killed)
                        + count(AgentState::TimedOut),
                    cost_usd: cost,
                })
            }
            None => None,
        };
        out.firings.push(firing_to_pb(firing, results));
    }
    Ok(out)
}

/// A fired batch's children and how they ended.
struct Results {
    children: u32,
    completed: u32,
    failed: u32,
    cost_usd: f64,
}

fn firing_to_pb(f: &Firing, results: Option<Results>) -> pb::ScheduleFiring {
    let r = results.unwrap_or(Results {
        children: 0,
        completed: 0,
        failed: 0,
        cost_usd: 0.0,
    });
    pb::ScheduleFiring {
        fire_time: Some(timestamp(f.fire_at_ms)),
        state: f.state.as_str().to_owned(),
        manual: f.manual,
        session_id: f.session_id.map(|s| s.to_string()).unwrap_or_default(),
        batch_id: f.batch_id.map(|b| b.to_string()).unwrap_or_default(),
        reason: f.reason.clone().unwrap_or_default(),
        children: r.children,
        completed: r.completed,
        failed: r.failed,
        cost_usd: r.cost_usd,
    }
}
