//! Where a session's workspace may be (docs/contracts.md, "Workspaces"): a token tenant's lies
//! inside one of the roots its operator gave it, or is a fresh empty directory of its own under
//! `workspaces_dir`; the daemon's own user (`local`) may name any directory it can read. Never a
//! workspace, for anyone: `FORKD_HOME` or anything inside it, `workspaces_dir` itself, and `/`.
//! Sessions of two tenants never share a workspace, nor does one's hold the other's.
//!
//! A token tenant's path is checked against its roots *as written* before forkd touches it, so
//! a refusal is the same for a path that exists and one that does not, and says nothing about
//! the machine outside the roots; only then is it resolved (its symlinks followed), and the
//! result checked again. The canonical path is what the session stores: every later use opens
//! it without following a symlink ([`forkd_tools::Workspace::pinned`]).

use std::path::{Component, Path, PathBuf};

use forkd_core::SessionId;
use forkd_core::session::{LOCAL_TENANT, SandboxMode};
use forkd_core::store::Store;
use forkd_tools::SandboxSpec;
use forkd_tools::sandbox::SandboxPaths;
use forkd_tools::sandbox::layer::VIEW_ROOT;

use crate::config::WorkspacesConfig;
use crate::error::{EngineError, Result, clip};

/// What a session asks for as its workspace.
pub(crate) struct Asked<'a> {
    pub tenant: &'a str,
    pub dir: Option<&'a Path>,
    /// The session being made: a fresh workspace is named after it.
    pub session: SessionId,
}

/// A workspace the policy allowed: its canonical path, and whether forkd made it (and so
/// removes it again if the session is not stored).
#[derive(Debug)]
pub(crate) struct Allowed {
    pub path: PathBuf,
    pub fresh: bool,
}

impl Allowed {
    /// Removes a fresh workspace whose session was not stored (nothing of the session's was
    /// written in it yet: at most an upload's tree).
    pub(crate) fn discard(&self) {
        if self.fresh
            && let Err(e) = std::fs::remove_dir_all(&self.path)
        {
            tracing::warn!(path = %self.path.display(), error = %e, "Cannot remove a fresh workspace left unused");
        }
    }
}

/// Checks (and, for a token tenant naming none, makes) the workspace `asked` names.
pub(crate) async fn allow(
    config: &WorkspacesConfig,
    store: &dyn Store,
    asked: Asked<'_>,
) -> Result<Allowed> {
    let local = asked.tenant == LOCAL_TENANT || asked.tenant.is_empty();
    let allowed = match asked.dir {
        None if local => {
            return Err(EngineError::InvalidRequest(
                "a workspace directory is required (forkctl sends its current directory)".into(),
            ));
        }
        None => fresh(config, asked.session)?,
        Some(dir) => {
            let path = if local {
                resolve_local(config, dir)?
            } else {
                resolve_tenant(config, asked.tenant, dir)?
            };
            Allowed { path, fresh: false }
        }
    };
    if let Err(e) = apart_from_others(store, asked.tenant, &allowed.path).await {
        allowed.discard();
        return Err(e);
    }
    Ok(allowed)
}

/// A workspace path a client gave: absolute, without `..` (what it would climb out of is not
/// checked before forkd touches the path).
fn written(dir: &Path) -> Result<PathBuf> {
    let shown = clip(&dir.display().to_string(), 200);
    if !dir.is_absolute() {
        return Err(EngineError::InvalidRequest(format!(
            "workspace {shown} is relative; give an absolute path (the daemon's working \
             directory is no one's workspace)"
        )));
    }
    if dir.components().any(|c| c == Component::ParentDir) {
        return Err(EngineError::InvalidRequest(format!(
            "workspace {shown} holds `..`; give the directory's own path"
        )));
    }
    Ok(dir.components().collect())
}

/// The local user's workspace: any directory, but for the places that are never one.
fn resolve_local(config: &WorkspacesConfig, dir: &Path) -> Result<PathBuf> {
    let dir = written(dir)?;
    let shown = clip(&dir.display().to_string(), 200);
    let canonical = std::fs::canonicalize(&dir).map_err(|e| {
        EngineError::InvalidRequest(format!("workspace {shown} is not usable: {e}"))
    })?;
    if !canonical.is_dir() {
        return Err(EngineError::InvalidRequest(format!(
            "workspace {shown} is not a directory"
        )));
    }
    never(config, &canonical, &shown, false)?;
    Ok(canonical)
}

/// A token tenant's workspace: inside one of its roots, checked as written and once resolved.
fn resolve_tenant(config: &WorkspacesConfig, tenant: &str, dir: &Path) -> Result<PathBuf> {
    let dir = written(dir)?;
    let shown = clip(&dir.display().to_string(), 200);
    let roots = config.roots.get(tenant).map(Vec::as_slice).unwrap_or(&[]);
    let outside = || {
        let listed = if roots.is_empty() {
            "none".to_owned()
        } else {
            roots
                .iter()
                .map(|r| r.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        EngineError::Forbidden(format!(
            "tenant {tenant:?} may use workspaces only inside its roots ({listed}): \
             workspace_roots under [tenants.{tenant}] in the daemon's config.toml; or name no \
             workspace to get a fresh empty one"
        ))
    };
    if !roots.iter().any(|r| dir.starts_with(r)) {
        return Err(outside());
    }
    let canonical = std::fs::canonicalize(&dir).map_err(|e| {
        EngineError::InvalidRequest(format!("workspace {shown} is not usable: {e}"))
    })?;
    // A symlink inside a root may lead out of it.
    if !roots.iter().any(|r| canonical.starts_with(r)) {
        return Err(outside());
    }
    if !canonical.is_dir() {
        return Err(EngineError::InvalidRequest(format!(
            "workspace {shown} is not a directory"
        )));
    }
    never(config, &canonical, &shown, true)?;
    Ok(canonical)
}

/// Refuses the places that are never a workspace: `/`, `FORKD_HOME` and what it holds,
/// `workspaces_dir` itself; for a token tenant also a directory that holds either.
fn never(config: &WorkspacesConfig, canonical: &Path, shown: &str, tenant: bool) -> Result<()> {
    let refuse = |what: &str| {
        Err(EngineError::Forbidden(format!(
            "workspace {shown} is {what}, which is never a workspace"
        )))
    };
    if canonical.parent().is_none() {
        return refuse("the root directory");
    }
    if canonical.starts_with(VIEW_ROOT) {
        return refuse("where sessions made from uploads are seen (/forkd/workspaces)");
    }
    if let Some(home) = &config.home {
        if canonical.starts_with(home) {
            return refuse("forkd's home (FORKD_HOME) or inside it");
        }
        if tenant && home.starts_with(canonical) {
            return refuse("a directory holding forkd's home (FORKD_HOME)");
        }
    }
    if let Some(dir) = &config.dir {
        if canonical == dir {
            return refuse("the directory of tenants' fresh workspaces (workspaces_dir)");
        }
        if tenant && dir.starts_with(canonical) {
            return refuse("a directory holding the tenants' fresh workspaces (workspaces_dir)");
        }
    }
    Ok(())
}

/// A fresh empty workspace for `session`, only its daemon's user may enter.
pub(crate) fn fresh(config: &WorkspacesConfig, session: SessionId) -> Result<Allowed> {
    use std::os::unix::fs::DirBuilderExt;
    let Some(dir) = &config.dir else {
        return Err(EngineError::InvalidRequest(
            "name a workspace: this daemon makes no fresh ones (it has no workspaces_dir)".into(),
        ));
    };
    let make = |path: &Path, recursive: bool| {
        std::fs::DirBuilder::new()
            .recursive(recursive)
            .mode(0o700)
            .create(path)
            .map_err(|e| {
                EngineError::Invariant(format!(
                    "cannot make a fresh workspace at {}: {e}",
                    path.display()
                ))
            })
    };
    make(dir, true)?;
    let path = dir.join(session.to_string());
    make(&path, false)?;
    let path = std::fs::canonicalize(&path)
        .map_err(|e| EngineError::Invariant(format!("cannot resolve the fresh workspace: {e}")))?;
    Ok(Allowed { path, fresh: true })
}

/// Whether `session`'s workspace is on this daemon's machine, where its agents can work in it.
/// A session made from an upload has its tree in the `workspaces_dir` of the daemon that made it
/// (or of every daemon that shares that directory), and its edits are there too: another daemon
/// leaves its agents to that one even where it could reach the path. Any other workspace is here
/// when it is a directory here.
pub(crate) async fn here(
    config: &WorkspacesConfig,
    store: &dyn Store,
    session: &forkd_core::session::Session,
) -> Result<bool> {
    if session.workspace.starts_with(VIEW_ROOT) {
        // A layer over a kept tree: its edits are in the directory of the session that made
        // it (a branch works in its origin's), in this daemon's workspaces_dir, and the tree
        // in this daemon's home (a daemon sharing the directory but not the home has none).
        let (Some(dir), Some(home), Some(maker)) =
            (&config.dir, &config.home, session.workspace.file_name())
        else {
            return Ok(false);
        };
        let made = dir.join(maker);
        let tree = std::fs::read_to_string(made.join("tree")).unwrap_or_default();
        return Ok(made.join("upper").is_dir()
            && !tree.trim().is_empty()
            && home.join("trees").join(tree.trim()).is_dir());
    }
    if !session.workspace.is_dir() {
        return Ok(false);
    }
    if store.session_origin(session.id).await?.is_none() {
        return Ok(true);
    }
    Ok(config
        .dir
        .as_ref()
        .is_some_and(|dir| session.workspace.parent() == Some(dir.as_path())))
}

/// Why something that works in `session`'s files is refused on a daemon that does not hold them.
pub(crate) fn elsewhere(session: &forkd_core::session::Session, what: &str) -> EngineError {
    EngineError::WrongState(format!(
        "session {}'s workspace is on another daemon's machine (the one that made it from its \
         upload, or that holds its directory), so {what} runs there: send it through that \
         daemon; a batch without isolation may be forked through any daemon",
        session.id
    ))
}

/// Where under the sandboxes' temporary root the isolated children's directories are, one
/// folder per session.
const CHILDREN_TMP: &str = "children";

/// `session`'s commands' private temporary directory (their `TMPDIR`).
pub(crate) fn session_tmp(config: &crate::config::EngineConfig, session: SessionId) -> PathBuf {
    config.sandbox.tmp_root.join(session.to_string())
}

/// An isolated child's private temporary directory: beside its session's, never inside it. The
/// session's commands write in theirs, and could plant a link where a child's would be, which
/// the child's sandbox would then make writable and keep in its view wherever it pointed.
pub(crate) fn child_tmp(
    config: &crate::config::EngineConfig,
    session: SessionId,
    child: forkd_core::AgentId,
) -> PathBuf {
    config
        .sandbox
        .tmp_root
        .join(CHILDREN_TMP)
        .join(session.to_string())
        .join(child.to_string())
}

/// The sandbox of `session`'s commands (`None` for `full-access`), with `tmp` as their private
/// temporary directory: hidden is what [`hidden_from`] lists.
pub(crate) async fn sandbox_spec(
    config: &crate::config::EngineConfig,
    store: &dyn Store,
    session: &forkd_core::session::Session,
    tmp: PathBuf,
) -> Result<Option<SandboxSpec>> {
    if session.sandbox.mode == SandboxMode::FullAccess {
        return Ok(None);
    }
    let cfg = &config.sandbox;
    forkd_tools::sandbox::private_root(&cfg.tmp_root)
        .map_err(|e| EngineError::Sandbox(e.to_string()))?;
    Ok(Some(SandboxSpec {
        sandbox: session.sandbox,
        paths: SandboxPaths {
            hidden: hidden_from(config, store, session).await?,
            tmp,
            home: cfg.home.clone(),
            limits: cfg.limits,
            group: Some(session.id.to_string()),
        },
    }))
}

/// What `session`'s sandbox view hides (its commands', its file tools', its snapshots'): the
/// daemon's home and `workspaces_dir` (in `config.sandbox.hidden`, with the deny list), the
/// sessions' temporary directories, the isolated batches' copies, other users' homes, and every
/// other session's workspace. A hidden directory that holds the session's own workspace is
/// covered around it by the view.
pub(crate) async fn hidden_from(
    config: &crate::config::EngineConfig,
    store: &dyn Store,
    session: &forkd_core::session::Session,
) -> Result<Vec<PathBuf>> {
    let cfg = &config.sandbox;
    let mut hidden = cfg.hidden.clone();
    hidden.push(cfg.tmp_root.clone());
    hidden.push(config.isolation.root.clone());
    hidden.extend(forkd_tools::sandbox::other_homes(
        cfg.home.as_ref().map(|h| h.dir.as_path()),
    ));
    let own = std::fs::canonicalize(&session.workspace).unwrap_or(session.workspace.clone());
    // Stored canonical (pinned when their sessions were made): not resolved again here, once
    // per session on every tool turn. The view resolves what it covers.
    for (_, theirs) in store.workspaces().await? {
        // A workspace that holds this one (or is it) stays readable where it is kept.
        if theirs != own && theirs != session.workspace {
            hidden.push(theirs);
        }
    }
    Ok(hidden)
}

/// Refuses a workspace that is, holds, or lies inside another tenant's: checked as a session's
/// workspace is allowed, and again just before it is stored (its MCP servers' start and its
/// SessionStart hooks, in between, may take minutes, in which another tenant may take it).
pub(crate) async fn apart_from_others(store: &dyn Store, tenant: &str, path: &Path) -> Result<()> {
    let tenant = if tenant.is_empty() {
        LOCAL_TENANT
    } else {
        tenant
    };
    for (owner, theirs) in store.workspaces().await? {
        if owner != tenant && (theirs.starts_with(path) || path.starts_with(&theirs)) {
            return Err(EngineError::Forbidden(format!(
                "workspace {} is, holds or lies inside another tenant's workspace; tenants \
                 never share files",
                clip(&path.display().to_string(), 200)
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn config(base: &Path) -> WorkspacesConfig {
        WorkspacesConfig {
            home: Some(base.join("home")),
            dir: Some(base.join("workspaces")),
            roots: [("ci".to_owned(), vec![base.join("srv/ci")])].into(),
            view_root: None,
        }
    }

    fn base() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        for d in ["home/isolation", "workspaces", "srv/ci/a", "srv/other"] {
            std::fs::create_dir_all(base.join(d)).unwrap();
        }
        (dir, base)
    }

    fn denied(r: Result<PathBuf>) -> String {
        match r {
            Err(EngineError::Forbidden(m)) => m,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn a_tenant_s_workspace_lies_in_its_roots() {
        let (_d, base) = base();
        let cfg = config(&base);
        assert_eq!(
            resolve_tenant(&cfg, "ci", &base.join("srv/ci/a")).unwrap(),
            base.join("srv/ci/a")
        );
        let outside = denied(resolve_tenant(&cfg, "ci", &base.join("srv/other")));
        let missing = denied(resolve_tenant(&cfg, "ci", &base.join("srv/missing")));
        assert_eq!(outside, missing, "a refusal tells nothing of what exists");
        assert!(outside.contains("workspace_roots"), "{outside}");
        denied(resolve_tenant(&cfg, "web", &base.join("srv/ci/a")));
    }

    #[test]
    fn a_symlink_in_a_root_does_not_lead_out_of_it() {
        let (_d, base) = base();
        std::os::unix::fs::symlink(base.join("srv/other"), base.join("srv/ci/link")).unwrap();
        denied(resolve_tenant(
            &config(&base),
            "ci",
            &base.join("srv/ci/link"),
        ));
    }

    #[test]
    fn relative_paths_and_dot_dot_are_refused_before_anything_is_read() {
        let (_d, base) = base();
        let cfg = config(&base);
        for dir in ["relative/dir", "."] {
            assert!(matches!(
                resolve_local(&cfg, Path::new(dir)),
                Err(EngineError::InvalidRequest(_))
            ));
        }
        assert!(matches!(
            resolve_tenant(&cfg, "ci", &base.join("srv/ci/a/../../other")),
            Err(EngineError::InvalidRequest(_))
        ));
    }

    #[test]
    fn the_home_the_root_and_workspaces_dir_are_never_workspaces() {
        let (_d, base) = base();
        let cfg = config(&base);
        denied(resolve_local(&cfg, Path::new("/")));
        denied(resolve_local(&cfg, &base.join("home")));
        denied(resolve_local(&cfg, &base.join("home/isolation")));
        denied(resolve_local(&cfg, &base.join("workspaces")));
        // The local user may hold the home in its workspace (hidden from its tools there).
        assert_eq!(resolve_local(&cfg, &base).unwrap(), base);
        // A token tenant may not.
        let cfg = WorkspacesConfig {
            roots: [("ci".to_owned(), vec![base.clone()])].into(),
            ..cfg
        };
        denied(resolve_tenant(&cfg, "ci", &base));
    }
}
