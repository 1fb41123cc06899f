//! Which hooks run for a session (docs/contracts.md, "Hooks"): the operator's
//! (`$FORKD_HOME/hooks.json`, for every tenant and per tenant), then the session's own — the
//! `hooks` block of a `settings.json` its client sent at creation, sealed with the daemon's
//! secret key for the session (a command may hold a secret), inherited by its children (they
//! run in its session) and sealed again for each branch. Never from files in the workspace.
//! Running them is the runs' (`run/hooks.rs`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use forkd_core::SessionId;
use forkd_core::hooks::HookSet;
use forkd_core::session::{Session, SessionHooks};

use crate::config::HooksConfig;
use crate::error::{EngineError, Result};
use crate::sealed::SecretKey;

/// The most bytes of a session's own hooks (a `settings.json` text).
pub(crate) const MAX_OWN_HOOKS_BYTES: usize = 256 * 1024;

/// How many sessions' opened hooks are kept; past it the cache starts again (opening one is a
/// decryption and a parse).
const KEPT_SESSIONS: usize = 4_096;

/// Sessions' hooks: the operator's, merged once per tenant, and sessions' own, sealed.
pub(crate) struct Hooks {
    /// The operator's hooks for every tenant.
    every_tenant: Arc<HookSet>,
    /// The operator's hooks for a tenant that has its own: every tenant's, then its.
    tenants: HashMap<String, Arc<HookSet>>,
    key: Option<Arc<SecretKey>>,
    /// Sessions with hooks of their own: the operator's and theirs, opened and parsed.
    opened: Mutex<HashMap<SessionId, Arc<HookSet>>>,
}

impl Hooks {
    /// `key` seals sessions' own hooks; without one a session may not bring its own.
    pub(crate) fn new(config: &HooksConfig, key: Option<Arc<SecretKey>>) -> Self {
        let tenants = config
            .tenants
            .keys()
            .map(|t| (t.clone(), Arc::new(config.for_tenant(t))))
            .collect();
        Self {
            every_tenant: Arc::new(config.every_tenant.clone()),
            tenants,
            key,
            opened: Mutex::default(),
        }
    }

    fn of_tenant(&self, tenant: &str) -> &Arc<HookSet> {
        self.tenants.get(tenant).unwrap_or(&self.every_tenant)
    }

    /// Checks a session's own hooks (a `settings.json` text) as a client sent them: parsed as
    /// Claude Code reads them, sandboxed (only the operator's may run outside), within size.
    pub(crate) fn check_own(&self, text: &str) -> Result<HookSet> {
        if text.len() > MAX_OWN_HOOKS_BYTES {
            return Err(EngineError::InvalidRequest(format!(
                "the session's hooks are {} bytes; the limit is {MAX_OWN_HOOKS_BYTES}",
                text.len()
            )));
        }
        let set = HookSet::parse(text, false)
            .map_err(|e| EngineError::InvalidRequest(format!("the session's hooks: {e}")))?;
        if self.key.is_none() {
            return Err(EngineError::WrongState(
                "this daemon has no secret key (secret_key_file) to seal a session's own hooks \
                 with; the operator's hooks.json can hold them instead"
                    .into(),
            ));
        }
        Ok(set)
    }

    /// Seals a session's own hooks (checked by [`Hooks::check_own`]) for storing with it.
    pub(crate) fn seal_own(
        &self,
        session: SessionId,
        text: &str,
        set: &HookSet,
    ) -> Result<SessionHooks> {
        let key = self
            .key
            .as_ref()
            .ok_or_else(|| EngineError::Invariant("hooks checked without a key".into()))?;
        let sealed = key
            .seal(&owner(session), text.as_bytes())
            .map_err(|e| EngineError::Invariant(format!("cannot seal the session's hooks: {e}")))?;
        Ok(SessionHooks {
            events: set
                .events()
                .into_iter()
                .map(|e| e.as_str().to_owned())
                .collect(),
            sealed,
        })
    }

    /// A branch's copy of its origin's own hooks: opened with the origin's id and sealed again
    /// for the branch's (a sealed value is bound to its session).
    pub(crate) fn reseal_for_branch(
        &self,
        origin: &Session,
        branch: SessionId,
    ) -> Result<Option<SessionHooks>> {
        let Some(own) = &origin.hooks else {
            return Ok(None);
        };
        let text = self.open(origin, own)?;
        let key = self
            .key
            .as_ref()
            .ok_or_else(|| cannot_open(origin, "no key"))?;
        let sealed = key
            .seal(&owner(branch), text.as_bytes())
            .map_err(|e| cannot_open(origin, &e.to_string()))?;
        Ok(Some(SessionHooks {
            events: own.events.clone(),
            sealed,
        }))
    }

    /// The hooks that run for `session`: the operator's for every tenant, its tenant's, then its
    /// own. A session whose own hooks cannot be opened (another daemon's key) is `WrongState`:
    /// its agents do not run without the policies it asked for.
    pub(crate) fn for_session(&self, session: &Session) -> Result<Arc<HookSet>> {
        let tenant = self.of_tenant(&session.tenant);
        let Some(own) = &session.hooks else {
            return Ok(tenant.clone());
        };
        let kept = self.opened().get(&session.id).cloned();
        if let Some(set) = kept {
            return Ok(set);
        }
        let text = self.open(session, own)?;
        let own = HookSet::parse(&text, false)
            .map_err(|e| cannot_open(session, &format!("they no longer parse: {e}")))?;
        let set = Arc::new(tenant.as_ref().clone().merged(&own));
        let mut opened = self.opened();
        if opened.len() >= KEPT_SESSIONS {
            opened.clear();
        }
        opened.insert(session.id, set.clone());
        Ok(set)
    }

    fn open(&self, session: &Session, own: &SessionHooks) -> Result<String> {
        let key = self.key.as_ref().ok_or_else(|| {
            cannot_open(session, "this daemon has no secret key (secret_key_file)")
        })?;
        let plain = key
            .open(&owner(session.id), &own.sealed)
            .map_err(|e| cannot_open(session, &e.to_string()))?;
        String::from_utf8(plain).map_err(|e| cannot_open(session, &e.to_string()))
    }

    fn opened(&self) -> std::sync::MutexGuard<'_, HashMap<SessionId, Arc<HookSet>>> {
        self.opened.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What a session's hooks are sealed for: the session, and that they are its hooks (its MCP
/// definitions, sealed for the session too, cannot be passed off as them).
fn owner(session: SessionId) -> String {
    format!("hooks/{session}")
}

fn cannot_open(session: &Session, why: &str) -> EngineError {
    EngineError::WrongState(format!(
        "session {}'s own hooks cannot be opened ({why}); its agents do not run without them",
        session.id
    ))
}
