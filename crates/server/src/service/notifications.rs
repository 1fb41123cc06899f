//! The notification subscription RPC.

use std::pin::Pin;

use forkd_proto::v1 as pb;
use forkd_store::NotificationFilter;
use futures::{Stream, StreamExt};
use tonic::Status;

use super::ForkdService;
use super::agents::{parse_agent_id, parse_batch_id};
use super::sessions::parse_session_id;
use crate::convert;
use crate::status::to_status;

pub type NotificationStream = Pin<Box<dyn Stream<Item = Result<pb::Notification, Status>> + Send>>;

impl ForkdService {
    pub(super) async fn subscribe_rpc(
        &self,
        req: pb::SubscribeNotificationsRequest,
    ) -> Result<NotificationStream, Status> {
        let filter = NotificationFilter {
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
        let stream = self
            .engine
            .subscribe(req.since_seq, filter, req.follow)
            .await
            .map_err(to_status)?
            .map(|item| item.map(|n| convert::notification(&n)).map_err(to_status));
        Ok(Box::pin(stream))
    }
}
