//! The notification subscription RPC.

use std::pin::Pin;

use forkd_proto::v1 as pb;
use forkd_store::NotificationFilter;
use futures::{Stream, StreamExt};
use tonic::Status;

use super::ForkdService;
use super::agents::{parse_agent_id, parse_batch_id};
use super::sessions::parse_session_id;
use crate::auth::Tenant;
use crate::convert;
use crate::status::to_status;

pub type NotificationStream = Pin<Box<dyn Stream<Item = Result<pb::Notification, Status>> + Send>>;

impl ForkdService {
    pub(super) async fn subscribe_rpc(
        &self,
        tenant: &Tenant,
        req: pb::SubscribeNotificationsRequest,
    ) -> Result<NotificationStream, Status> {
        let filter = NotificationFilter {
            tenant: Some(tenant.name().to_owned()),
            session_id: match req.session_id.as_str() {
                "" => None,
                s => Some(parse_session_id(s)?),
            },
            batch_id: match req.batch_id.as_str() {
                "" => None,
                b => Some(parse_batch_id(b)?),
            },
            agent_id: match req.agent_id.as_str() {
                "" => None,
                a => Some(parse_agent_id(a)?),
            },
        };
        check_filter(
            &self.engine,
            tenant,
            filter.session_id,
            filter.batch_id,
            filter.agent_id,
        )
        .await?;
        let stream = self
            .engine
            .subscribe(req.since_seq, filter, req.follow)
            .await
            .map_err(to_status)?
            .map(|item| item.map(|n| convert::notification(&n)).map_err(to_status));
        Ok(Box::pin(stream))
    }
}

/// Refuses filters that name another tenant's session, batch or agent (as `NOT_FOUND`).
pub(super) async fn check_filter(
    engine: &forkd_engine::Engine,
    tenant: &Tenant,
    session: Option<forkd_core::SessionId>,
    batch: Option<forkd_core::BatchId>,
    agent: Option<forkd_core::AgentId>,
) -> Result<(), Status> {
    let t = tenant.name();
    if let Some(id) = session {
        engine.check_session(t, id).await.map_err(to_status)?;
    }
    if let Some(id) = batch {
        engine.check_batch(t, id).await.map_err(to_status)?;
    }
    if let Some(id) = agent {
        engine.check_agent(t, id).await.map_err(to_status)?;
    }
    Ok(())
}
