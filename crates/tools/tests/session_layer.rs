//! A session's own workspace over a tree kept read-only (docs/contracts.md, "Uploaded
//! workspaces"): one overlay mount, made once in namespaces of its own at a path only views have,
//! that every view of the session enters. Its commands and its file tools see one tree, at that
//! path; what they write lands in the session's upper directory, never in the shared tree; the
//! directory views mount it in stays empty here.
//!
//! These need Landlock, unprivileged user namespaces and overlayfs in them; where the kernel
//! lacks them, they fail with the reason (they do not skip).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::sync::Arc;

use forkd_tools::sandbox::layer::{LayerDirs, LayerView};
use forkd_tools::sandbox::{ResourceLimits, Sandbox, SandboxMode, SandboxPaths};
use forkd_tools::{SandboxSpec, ToolContext, ToolOutput, Workspace, run_tool};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// The daemon's home `home/` (hidden) holding the shared tree and the session's layer, and
/// `views/`, standing in for `/forkd/workspaces`: a directory that exists, empty.
struct Daemon {
    _dir: tempfile::TempDir,
    base: PathBuf,
    home: PathBuf,
    views: PathBuf,
    tree: PathBuf,
}

impl Daemon {
    fn new(files: &[(&str, &str)]) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        let (home, views) = (base.join("home"), base.join("views"));
        let tree = home.join("uploads/u1/tree");
        for (rel, content) in files {
            let path = tree.join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, content).unwrap();
        }
        std::fs::create_dir_all(&tree).unwrap();
        std::fs::create_dir_all(&views).unwrap();
        Daemon {
            _dir: dir,
            base,
            home,
            views,
            tree,
        }
    }

    fn dirs(&self, session: &str) -> LayerDirs {
        let at = self.home.join("workspaces").join(session);
        LayerDirs {
            lower: self.tree.clone(),
            upper: at.join("upper"),
            work: at.join("work"),
        }
    }

    fn layer(&self, session: &str) -> Arc<LayerView> {
        let layer = LayerView::session(&self.views.join(session), &self.dirs(session))
            .unwrap_or_else(|e| panic!("the session's layer could not be made here: {e}"));
        Arc::new(layer)
    }

    /// An agent of the session: its tools over `layer`, its own temporary directory `tmp`.
    fn agent(&self, layer: &Arc<LayerView>, tmp: &str) -> ToolContext {
        let spec = SandboxSpec {
            sandbox: Sandbox {
                mode: SandboxMode::WorkspaceWrite,
                allow_network: false,
                unix_sockets: false,
            },
            paths: SandboxPaths {
                hidden: vec![self.home.clone(), self.base.join("tmp")],
                tmp: self.base.join("tmp").join(tmp),
                home: None,
                limits: ResourceLimits::default(),
                group: None,
            },
        };
        ToolContext::new(
            Workspace::layered(Arc::clone(layer)),
            CancellationToken::new(),
        )
        .with_sandbox(spec)
    }
}

async fn call(ctx: &ToolContext, tool: &str, input: Value) -> String {
    let out: ToolOutput = run_tool(tool, &input, ctx).await;
    assert!(!out.is_error, "{tool} {input}: {}", out.content);
    out.content
}

async fn bash(ctx: &ToolContext, command: &str) -> String {
    call(ctx, "Bash", json!({ "command": command })).await
}

#[tokio::test]
async fn commands_and_file_tools_share_one_layer_at_the_session_s_path() {
    let daemon = Daemon::new(&[("a.txt", "tree\n"), ("src/lib.rs", "fn x() {}\n")]);
    let layer = daemon.layer("s1");
    let ws = daemon.views.join("s1");
    let parent = daemon.agent(&layer, "parent");

    // Commands start at the session's path, and see the tree there.
    let pwd = bash(&parent, "pwd; cat a.txt; ls src").await;
    assert_eq!(pwd, format!("{}\ntree\nlib.rs\n", ws.display()));
    // What a command writes the file tools read, and the reverse.
    bash(&parent, "echo changed > a.txt; echo new > c.txt").await;
    let read = call(&parent, "Read", json!({"file_path": "c.txt"})).await;
    assert!(read.contains("new"), "{read}");
    call(
        &parent,
        "Write",
        json!({"file_path": ws.join("d.txt"), "content": "by the tool\n"}),
    )
    .await;
    assert_eq!(bash(&parent, "cat d.txt").await, "by the tool\n");

    // Another agent of the session (a sibling working in the same workspace, its own view)
    // sees the same files: one overlay, not one per view.
    let child = daemon.agent(&layer, "child");
    assert_eq!(
        bash(&child, "cat a.txt c.txt d.txt").await,
        "changed\nnew\nby the tool\n"
    );

    // The writes are the session's: in its upper directory, never in the shared tree; the
    // path views mount the layer at exists in none but them.
    assert_eq!(
        std::fs::read_to_string(daemon.tree.join("a.txt")).unwrap(),
        "tree\n"
    );
    assert!(!daemon.tree.join("c.txt").exists());
    let upper = &daemon.dirs("s1").upper;
    assert_eq!(
        std::fs::read_to_string(upper.join("a.txt")).unwrap(),
        "changed\n"
    );
    assert!(upper.join("d.txt").exists());
    assert!(!ws.exists());
    assert_eq!(std::fs::read_dir(&daemon.views).unwrap().count(), 0);

    // Beside its workspace a view shows nothing: no other session's, nothing to write to.
    assert_eq!(bash(&parent, "ls -A ..").await, "s1\n");
    let out = run_tool(
        "Bash",
        &json!({"command": "touch ../planted && echo planted"}),
        &parent,
    )
    .await;
    assert!(!out.content.contains("planted\n"), "{}", out.content);
}

#[tokio::test]
async fn two_sessions_over_one_tree_keep_their_edits_apart() {
    let daemon = Daemon::new(&[("a.txt", "tree\n")]);
    let (one, two) = (daemon.layer("s1"), daemon.layer("s2"));
    let (one, two) = (daemon.agent(&one, "one"), daemon.agent(&two, "two"));
    bash(&one, "echo one > a.txt").await;
    assert_eq!(bash(&two, "cat a.txt; ls -A ..").await, "tree\ns2\n");
    assert_eq!(bash(&one, "cat a.txt").await, "one\n");
    // The home (where the tree and both layers are) stays hidden from both.
    let out = run_tool(
        "Bash",
        &json!({"command": format!("cat {}/a.txt", daemon.tree.display())}),
        &two,
    )
    .await;
    assert!(out.content.contains("No such file"), "{}", out.content);
}

#[tokio::test]
async fn a_link_planted_at_the_session_s_path_here_leads_nowhere() {
    let daemon = Daemon::new(&[("a.txt", "tree\n")]);
    std::fs::write(daemon.home.join("secret.key"), "the daemon's").unwrap();
    // Someone who may write the views' directory here points the session's path at the home.
    let ws = daemon.views.join("s1");
    std::os::unix::fs::symlink(&daemon.home, &ws).unwrap();
    let layer = daemon.layer("s1");
    let agent = daemon.agent(&layer, "agent");
    // The layer is where the session's path is in its views; the link is never followed.
    assert_eq!(
        bash(&agent, "pwd; cat a.txt; ls -A").await,
        format!("{}\ntree\na.txt\n", ws.display())
    );
    let out = run_tool(
        "Bash",
        &json!({"command": format!("cat {}/secret.key", daemon.home.display())}),
        &agent,
    )
    .await;
    assert!(!out.content.contains("the daemon's"), "{}", out.content);
    let read = run_tool("Read", &json!({"file_path": "secret.key"}), &agent).await;
    assert!(read.is_error, "{}", read.content);
}
