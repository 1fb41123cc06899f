//! The wall around a session's file tools: what its sandbox view hides from its commands is
//! hidden from Read, Write, Edit, Glob and Grep too (docs/contracts.md, "Sandbox").
//!
//! A command's view covers `FORKD_HOME`, the other sessions' workspaces and temporary
//! directories, the isolated batches' copies, `workspaces_dir` but for the session's own, other
//! users' homes, the deny list, and the daemon user's home but for its allow list; a hidden
//! directory that holds what the command keeps (its workspace, its temporary directory) is
//! covered around it ([`crate::sandbox`]). The file tools run in the daemon, which sees the
//! machine whole, so they ask the wall about every canonical path they are about to open, and
//! prune what it hides from their walks. Which paths are hidden is decided by the same inputs
//! ([`SandboxPaths`]) as the view's covers, so that a file tool never reads a byte that `cat`
//! in the same session could not.
//!
//! Paths are compared component by component on canonical forms: the workspace resolves a path
//! (its `..` and symlinks) before it asks.

use std::path::{Path, PathBuf};

use crate::sandbox::SandboxPaths;

/// What a session's file tools may not reach, beside its workspace's own bounds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Wall {
    /// Hidden paths, canonical (those that exist).
    hidden: Vec<PathBuf>,
    /// What stays reachable inside a hidden path: the workspace, the temporary directory.
    kept: Vec<PathBuf>,
    /// The daemon user's home, covered but for `shown` (and what is kept); `None` where the
    /// view leaves it as it is (none configured, or a workspace that holds it).
    home: Option<(PathBuf, Vec<PathBuf>)>,
}

impl Wall {
    /// The wall of a session whose commands see the view `paths` describes, working in the
    /// canonical `workspace`.
    pub fn new(paths: &SandboxPaths, workspace: &Path) -> Wall {
        let tmp = std::fs::canonicalize(&paths.tmp).unwrap_or_else(|_| paths.tmp.clone());
        let kept = vec![workspace.to_path_buf(), tmp];
        let home = paths.home.as_ref().and_then(|view| {
            let dir = std::fs::canonicalize(&view.dir).ok()?;
            if kept.iter().any(|k| dir.starts_with(k)) {
                // Kept whole by the view too (`home::Cover::new`).
                return None;
            }
            let mut shown = Vec::new();
            for entry in &view.allow {
                // Bound back at its place under the home; what it leads to is shown there.
                if let Ok(rel) = entry
                    .strip_prefix(&view.dir)
                    .or_else(|_| entry.strip_prefix(&dir))
                {
                    shown.push(dir.join(rel));
                    if let Ok(target) = std::fs::canonicalize(entry) {
                        shown.push(target);
                    }
                }
            }
            Some((dir, shown))
        });
        Wall {
            hidden: crate::sandbox::hidden(paths),
            kept,
            home,
        }
    }

    /// Whether the canonical `path` is hidden from the session's commands, and so from its
    /// file tools.
    pub fn hides(&self, path: &Path) -> bool {
        let kept_inside = |outer: &Path| {
            self.kept
                .iter()
                .any(|k| k.starts_with(outer) && path.starts_with(k))
        };
        if self
            .hidden
            .iter()
            .any(|h| path.starts_with(h) && !kept_inside(h))
        {
            return true;
        }
        match &self.home {
            Some((dir, shown)) => {
                path.starts_with(dir)
                    && !shown.iter().any(|s| path.starts_with(s))
                    && !self.kept.iter().any(|k| path.starts_with(k))
            }
            None => false,
        }
    }

    /// Whether a walk should go into the directory `dir`: it is not hidden, or it holds
    /// something kept (whose own entries are then asked about one by one).
    pub fn enters(&self, dir: &Path) -> bool {
        !self.hides(dir) || self.kept.iter().any(|k| k.starts_with(dir))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::sandbox::HomeView;

    struct Tree {
        _dir: tempfile::TempDir,
        root: PathBuf,
    }

    impl Tree {
        fn new(dirs: &[&str]) -> Tree {
            let dir = tempfile::tempdir().unwrap();
            let root = std::fs::canonicalize(dir.path()).unwrap();
            for d in dirs {
                std::fs::create_dir_all(root.join(d)).unwrap();
            }
            Tree { _dir: dir, root }
        }

        fn at(&self, rel: &str) -> PathBuf {
            self.root.join(rel)
        }
    }

    #[test]
    fn a_hidden_directory_inside_the_workspace_is_hidden() {
        let t = Tree::new(&["ws/.forkd", "ws/src", "tmp"]);
        let paths = SandboxPaths {
            hidden: vec![t.at("ws/.forkd")],
            tmp: t.at("tmp"),
            ..SandboxPaths::default()
        };
        let wall = Wall::new(&paths, &t.at("ws"));
        assert!(wall.hides(&t.at("ws/.forkd")));
        assert!(wall.hides(&t.at("ws/.forkd/secret.key")));
        assert!(!wall.hides(&t.at("ws/src/main.rs")));
        assert!(
            !wall.hides(&t.at("ws/.forkd-other")),
            "components, not bytes"
        );
        assert!(!wall.enters(&t.at("ws/.forkd")));
    }

    #[test]
    fn a_hidden_directory_holding_the_workspace_is_hidden_around_it() {
        let t = Tree::new(&["workspaces/mine", "workspaces/theirs", "tmp"]);
        let paths = SandboxPaths {
            hidden: vec![t.at("workspaces")],
            tmp: t.at("tmp"),
            ..SandboxPaths::default()
        };
        let wall = Wall::new(&paths, &t.at("workspaces/mine"));
        assert!(!wall.hides(&t.at("workspaces/mine/a.txt")));
        assert!(wall.hides(&t.at("workspaces/theirs/a.txt")));
        assert!(wall.hides(&t.at("workspaces/loose.txt")));
        assert!(
            wall.enters(&t.at("workspaces")),
            "on the way to what is kept"
        );
        assert!(!wall.enters(&t.at("workspaces/theirs")));
    }

    #[test]
    fn the_home_is_hidden_but_for_its_allow_list() {
        let t = Tree::new(&["home/.cargo/bin", "home/.config/gh", "ws", "tmp"]);
        let paths = SandboxPaths {
            tmp: t.at("tmp"),
            home: Some(HomeView {
                dir: t.at("home"),
                allow: vec![t.at("home/.cargo/bin")],
            }),
            ..SandboxPaths::default()
        };
        let wall = Wall::new(&paths, &t.at("ws"));
        assert!(wall.hides(&t.at("home/.config/gh/hosts.yml")));
        assert!(!wall.hides(&t.at("home/.cargo/bin/cargo")));
        assert!(!wall.hides(&t.at("ws/x")));
        // A workspace in the home keeps itself reachable.
        let inside = Wall::new(&paths, &t.at("home/.config"));
        assert!(!inside.hides(&t.at("home/.config/gh/hosts.yml")));
        assert!(inside.hides(&t.at("home/other")));
        // A workspace that holds the home leaves it as it is, as the view does.
        let holding = Wall::new(&paths, &t.root);
        assert!(!holding.hides(&t.at("home/.config/gh/hosts.yml")));
    }
}
