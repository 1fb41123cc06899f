//! The notification subscription RPC.

use std::pin::Pin;

use forkd_core::query::NotificationFilter;
use forkd_proto::v1 as pb;
use futures::{Stream, StreamExt};
use tonic::Status;

use super::ForkdService;
use super::agents::{optional, parse_agent_id, parse_batch_id};
use super::sessions::parse_session_id;
use crate::auth::Tenant;
use crate::convert;
use crate::status::{ApiError, status};

pub type NotificationStream = Pin<Box<dyn Stream<Item = Result<pb::Notification, Status>> + Send>>;

impl ForkdService {
    pub(super) async fn subscribe_rpc(
        &self,
        tenant: Tenant,
        req: pb::SubscribeNotificationsRequest,
    ) -> Result<NotificationStream, ApiError> {
        let filter = NotificationFilter {
            tenant: None,
            session_id: optional(&req.session_id, parse_session_id)?,
            batch_id: optional(&req.batch_id, parse_batch_id)?,
            agent_id: optional(&req.agent_id, parse_agent_id)?,
        };
        let stream = self
            .engine
            .for_tenant(tenant)
            .subscribe(req.since_seq, filter, req.follow)
            .await?
            .map(|item| item.map(|n| convert::notification(&n)).map_err(status));
        Ok(Box::pin(stream))
    }
}
