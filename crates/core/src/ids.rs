//! Identifier newtypes. All ids are UUID v7 (time-ordered), strings on the wire.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// An id string that is not a valid UUID.
#[derive(Debug, Clone, thiserror::Error)]
#[error("invalid {kind} id {value:?}: expected a UUID")]
pub struct InvalidId {
    pub kind: &'static str,
    pub value: String,
}

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $kind:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(Uuid);

        impl $name {
            /// A fresh, time-ordered id.
            pub fn new() -> Self {
                Self(Uuid::now_v7())
            }

            pub fn from_uuid(uuid: Uuid) -> Self {
                Self(uuid)
            }

            pub fn as_uuid(&self) -> Uuid {
                self.0
            }

            /// Parses a wire id, naming the kind of id in the error.
            pub fn parse(s: &str) -> Result<Self, InvalidId> {
                s.parse()
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.hyphenated().fmt(f)
            }
        }

        impl FromStr for $name {
            type Err = InvalidId;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Uuid::parse_str(s.trim()).map(Self).map_err(|_| InvalidId {
                    kind: $kind,
                    // Clipped: the value is echoed in errors, and a client may send megabytes.
                    value: s.chars().take(64).collect(),
                })
            }
        }
    };
}

id_type!(
    /// A parent session.
    SessionId,
    "session"
);
id_type!(
    /// An agent: a fork child, a typed sub-agent or a session's own main loop.
    AgentId,
    "agent"
);

/// The namespace of the agent ids [`AgentId::for_call`] derives.
const CALLED_AGENTS: Uuid = Uuid::from_u128(0x6b2f_1a3e_9c4d_4e8a_b5f0_2d7c_8e91_a4f3);

impl AgentId {
    /// The id of the agent that `caller`'s tool call `tool_use_id` starts (a typed agent): the
    /// same call always names the same agent, so a call answered again after a restart finds
    /// the agent it started instead of starting a second one. (UUID v5 of the two.)
    pub fn for_call(caller: AgentId, tool_use_id: &str) -> AgentId {
        let mut name = caller.0.as_bytes().to_vec();
        name.extend_from_slice(tool_use_id.as_bytes());
        AgentId(Uuid::new_v5(&CALLED_AGENTS, &name))
    }
}
id_type!(
    /// A fork batch: one parent assistant message and the children forked from it.
    BatchId,
    "batch"
);
id_type!(
    /// One model request.
    RequestId,
    "request"
);
id_type!(
    /// An uploaded workspace: a tree a client sent, its tenant's.
    UploadId,
    "upload"
);
id_type!(
    /// A registered webhook: a tenant's endpoint that notifications are delivered to.
    WebhookId,
    "webhook"
);
id_type!(
    /// One delivery of one event to one webhook: its id is the `webhook-id` header every
    /// attempt carries, so that a receiver drops repeats.
    DeliveryId,
    "delivery"
);
id_type!(
    /// A permission prompt: a tool call waiting for a person's answer.
    PromptId,
    "permission prompt"
);
id_type!(
    /// One running daemon: a fresh id each time `forkd serve` starts. Agents' leases name the
    /// daemon that holds them.
    DaemonId,
    "daemon"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_name_their_kind_on_error() {
        let id = AgentId::new();
        assert_eq!(id.to_string().parse::<AgentId>().ok(), Some(id));
        let err = "nope".parse::<SessionId>().err().map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("invalid session id \"nope\": expected a UUID")
        );
        let long = "x"
            .repeat(10_000)
            .parse::<AgentId>()
            .err()
            .map(|e| e.to_string());
        assert!(long.is_some_and(|e| e.len() < 120));
    }

    #[test]
    fn ids_are_time_ordered() {
        let a = BatchId::new();
        let b = BatchId::new();
        assert!(a < b);
    }

    #[test]
    fn a_call_always_names_the_same_agent() {
        let (a, b) = (AgentId::new(), AgentId::new());
        assert_eq!(
            AgentId::for_call(a, "toolu_1"),
            AgentId::for_call(a, "toolu_1")
        );
        assert_ne!(
            AgentId::for_call(a, "toolu_1"),
            AgentId::for_call(a, "toolu_2")
        );
        assert_ne!(
            AgentId::for_call(a, "toolu_1"),
            AgentId::for_call(b, "toolu_1")
        );
    }
}
