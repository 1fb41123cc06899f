//! Permission prompts: a tool call that needs a person's approval, put to the clients of an
//! interactive session. Stored, so that a client of any daemon sharing the database sees the
//! prompt and may answer it, and so that "allow always" outlives the daemon that heard it.

use crate::{AgentId, PromptId, SessionId};

/// A question put to a session's interactive clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PermissionPrompt {
    pub id: PromptId,
    pub session_id: SessionId,
    pub agent_id: AgentId,
    pub tool: String,
    pub input_json: String,
    /// What is asked, in words.
    pub question: String,
}

/// A client's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PermissionAnswer {
    AllowOnce,
    /// Allow this call, and this tool for the rest of the session without asking.
    AllowAlways,
    /// Refuse the call, with the person's reason if they gave one.
    Deny(Option<String>),
}

impl PermissionAnswer {
    /// The answer's name as stored.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::AllowOnce => "allow_once",
            Self::AllowAlways => "allow_always",
            Self::Deny(_) => "deny",
        }
    }

    /// The reason a denial gave, if any.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Self::Deny(reason) => reason.as_deref(),
            Self::AllowOnce | Self::AllowAlways => None,
        }
    }

    /// The answer stored as `name` (see [`PermissionAnswer::as_str`]) with `reason`; `None` for
    /// a name this version does not know.
    pub fn from_stored(name: &str, reason: Option<String>) -> Option<Self> {
        match name {
            "allow_once" => Some(Self::AllowOnce),
            "allow_always" => Some(Self::AllowAlways),
            "deny" => Some(Self::Deny(reason)),
            _ => None,
        }
    }

    /// Whether the call may run.
    pub fn allows(&self) -> bool {
        matches!(self, Self::AllowOnce | Self::AllowAlways)
    }
}

#[cfg(test)]
mod tests {
    use super::PermissionAnswer;

    #[test]
    fn answers_round_trip_through_their_stored_names() {
        for answer in [
            PermissionAnswer::AllowOnce,
            PermissionAnswer::AllowAlways,
            PermissionAnswer::Deny(None),
            PermissionAnswer::Deny(Some("not on main".to_owned())),
        ] {
            let stored =
                PermissionAnswer::from_stored(answer.as_str(), answer.reason().map(str::to_owned));
            assert_eq!(stored, Some(answer));
        }
        assert_eq!(PermissionAnswer::from_stored("maybe", None), None);
    }
}
