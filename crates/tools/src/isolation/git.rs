//! git, as forkd runs it on a session's repository: for a batch's snapshot commit, its ref, and
//! the files a snapshot tracks.
//!
//! The repository is the tenant's: its agents can write `.git/` (the configuration, the object
//! store, symlinks in it). So git runs **inside the session's view** ([`Repo::view`]): what it
//! can read is what the session's Bash can read (a configuration's `include.path`,
//! `core.excludesFile` or a symlinked `logs/` naming another tenant's files finds a cover
//! there), and it writes only beneath the workspace and the private directory the view lends
//! it. Within that, nothing in the repository's configuration makes it run a program (hooks,
//! the fsmonitor, signing, automatic gc and filter drivers are off), neither the system's nor
//! the daemon user's configuration is read, and its environment is built, never inherited: the
//! daemon's secrets stay its own. A repository whose objects or refs live elsewhere is refused
//! before git runs ([`own_repository`]).

use std::ffi::OsString;
use std::path::Path;
use std::process::Command;

use super::IsolationError;
use crate::context::SandboxSpec;
use crate::sandbox::Prepared;

/// A workspace's repository, and where forkd's git runs on it.
#[derive(Debug, Clone, Copy)]
pub struct Repo<'a> {
    pub workspace: &'a Path,
    /// The session's view git runs in; its mode must let it write the workspace (git adds
    /// objects and refs there) and its temporary directory must hold every other path git is
    /// given (a snapshot's copy, a temporary index). `None` runs git in the daemon's own view:
    /// for tests and tools that have no session.
    pub view: Option<&'a SandboxSpec>,
}

impl<'a> Repo<'a> {
    /// git in the daemon's own view (see [`Repo::view`]).
    pub fn unconfined(workspace: &'a Path) -> Repo<'a> {
        Repo {
            workspace,
            view: None,
        }
    }

    /// git inside `view`.
    pub fn in_view(workspace: &'a Path, view: &'a SandboxSpec) -> Repo<'a> {
        Repo {
            workspace,
            view: Some(view),
        }
    }
}

/// Refuses a repository whose objects or refs live elsewhere: a symlinked `objects/` or `refs/`,
/// an `objects/info/alternates` or a `commondir` would make git read or write another
/// repository (another session's, another tenant's). The view would stop it reaching a hidden
/// one; this says why, before git fails on a cover.
pub(crate) fn own_repository(workspace: &Path) -> Result<(), IsolationError> {
    let git = workspace.join(".git");
    let borrowed = |what: &str| {
        Err(IsolationError::Git(format!(
            "the repository in {} has {what}, which could make forkd's git read or write another \
             repository; isolation does not snapshot it (remove it, or fork without isolation)",
            workspace.display()
        )))
    };
    for dir in ["objects", "refs", "refs/forkd", "refs/forkd/snapshots"] {
        match std::fs::symlink_metadata(git.join(dir)) {
            Ok(m) if !m.is_dir() => {
                return borrowed(&format!(".git/{dir} that is not a directory"));
            }
            _ => {}
        }
    }
    for file in ["objects/info/alternates", "commondir"] {
        if std::fs::symlink_metadata(git.join(file)).is_ok() {
            return borrowed(&format!(".git/{file}"));
        }
    }
    Ok(())
}

/// One git command line on a [`Repo`], with its index and working tree.
pub(crate) struct Git<'a> {
    repo: Repo<'a>,
    index: &'a Path,
    work_tree: Option<&'a Path>,
    overrides: Vec<String>,
}

impl<'a> Git<'a> {
    pub(crate) fn new(repo: Repo<'a>, index: &'a Path) -> Git<'a> {
        Git {
            repo,
            index,
            work_tree: None,
            overrides: [
                "core.hooksPath=/dev/null",
                "core.fsmonitor=false",
                "commit.gpgSign=false",
                "gc.auto=0",
                "maintenance.auto=false",
            ]
            .map(String::from)
            .to_vec(),
        }
    }

    /// With `dir` as the working tree (the repository stays the workspace's).
    pub(crate) fn work_tree(mut self, dir: &'a Path) -> Git<'a> {
        self.work_tree = Some(dir);
        self
    }

    /// With every filter driver of the repository's configuration replaced by `cat`.
    pub(crate) fn without_filters(mut self) -> Git<'a> {
        // `--get-regexp` exits 1 when nothing matches: no filters.
        let names = self
            .run(&["config", "--name-only", "--get-regexp", r"^filter\."])
            .unwrap_or_default();
        let mut drivers: Vec<String> = names
            .lines()
            .filter_map(|key| key.strip_prefix("filter."))
            .filter_map(|rest| rest.rsplit_once('.').map(|(driver, _)| driver.to_owned()))
            .collect();
        drivers.sort();
        drivers.dedup();
        for driver in drivers {
            self.overrides.extend([
                format!("filter.{driver}.clean=cat"),
                format!("filter.{driver}.smudge=cat"),
                format!("filter.{driver}.process="),
            ]);
        }
        self
    }

    /// Runs git with `args`; its output, trimmed.
    pub(crate) fn run(&self, args: &[&str]) -> Result<String, IsolationError> {
        let workspace = self.repo.workspace;
        let tree = self.work_tree.unwrap_or(workspace);
        let mut cmd = Command::new("git");
        for o in &self.overrides {
            cmd.arg("-c").arg(o);
        }
        cmd.arg("--git-dir")
            .arg(workspace.join(".git"))
            .arg("--work-tree")
            .arg(tree)
            .args(args)
            .current_dir(tree)
            .stdin(std::process::Stdio::null())
            .env_clear()
            .envs(environment(std::env::var_os("PATH")))
            .env("GIT_INDEX_FILE", self.index);
        let prepared = match self.repo.view {
            Some(view) => {
                Prepared::new(view.sandbox, &view.paths, workspace, None).map_err(|e| {
                    IsolationError::Git(format!(
                        "cannot prepare the session's view for git in {}: {e}",
                        workspace.display()
                    ))
                })?
            }
            None => None,
        };
        // Held until git has ended: its place in the session's cgroup.
        let _group = prepared.and_then(|prepared| prepared.apply(&mut cmd));
        let out = cmd
            .output()
            .map_err(|e| IsolationError::io("cannot run git", e))?;
        if !out.status.success() {
            return Err(IsolationError::Git(format!(
                "git {} failed in {}: {}",
                args.join(" "),
                workspace.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }
}

/// git's whole environment: `PATH` (the daemon's), no configuration but the repository's, no
/// prompt, forkd as the author.
pub(crate) fn environment(path: Option<OsString>) -> Vec<(&'static str, OsString)> {
    vec![
        (
            "PATH",
            path.unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into()),
        ),
        ("LC_ALL", "C".into()),
        ("GIT_CONFIG_NOSYSTEM", "1".into()),
        ("GIT_CONFIG_GLOBAL", "/dev/null".into()),
        ("GIT_TERMINAL_PROMPT", "0".into()),
        ("GIT_AUTHOR_NAME", "forkd".into()),
        ("GIT_AUTHOR_EMAIL", "forkd@localhost".into()),
        ("GIT_COMMITTER_NAME", "forkd".into()),
        ("GIT_COMMITTER_EMAIL", "forkd@localhost".into()),
    ]
}
