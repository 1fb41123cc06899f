//! The wall around the file tools: what a session's sandbox hides from its commands, Read, Write,
//! Edit, Glob and Grep do not reach either — whatever the workspace holds, and however a path is
//! written (`..`, absolute, through symlinks a command planted).
//!
//! The world: a workspace `ws/` that holds a hidden directory `ws/.home` (a daemon home inside a
//! local user's workspace), another session's workspace `other/` beside it, and a daemon user's
//! home `user/` covered but for its allow list. Every hidden file holds [`SECRET`].
//!
//! These run real sandboxed commands: they need Landlock and unprivileged user namespaces, and
//! fail with the reason where the kernel lacks them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;

use common::Env;
use forkd_tools::sandbox::{HomeView, ResourceLimits, Sandbox, SandboxMode, SandboxPaths};
use forkd_tools::{SandboxSpec, ToolContext, ToolOutput, Wall, Workspace, run_tool};
use proptest::prelude::*;
use serde_json::json;

const SECRET: &str = "hidden-bytes-7f3a";

struct World {
    env: Env,
    ctx: ToolContext,
}

impl World {
    fn new() -> World {
        let env = Env::new();
        let base = env.base.clone();
        let ws = base.join("ws");
        for (rel, text) in [
            ("ws/.home/secret.key", SECRET),
            ("ws/.home/isolation/b/snapshot/notes.md", SECRET),
            ("ws/src/lib.rs", "pub fn public() {}\n"),
            ("other/notes.md", SECRET),
            ("user/.config/gh/hosts.yml", SECRET),
            ("user/.gitconfig", "[user]\n"),
        ] {
            let path = base.join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        let paths = SandboxPaths {
            hidden: vec![ws.join(".home"), base.join("other"), base.join("tmp")],
            tmp: base.join("tmp/session"),
            home: Some(HomeView {
                dir: base.join("user"),
                allow: vec![base.join("user/.gitconfig")],
            }),
            limits: ResourceLimits::default(),
            group: None,
        };
        let workspace = Workspace::pinned(&ws)
            .unwrap()
            .walled(Wall::new(&paths, &ws));
        let ctx = ToolContext::new(workspace, env.ctx.cancel.clone()).with_sandbox(SandboxSpec {
            sandbox: Sandbox {
                mode: SandboxMode::WorkspaceWrite,
                allow_network: false,
                unix_sockets: false,
            },
            paths,
        });
        World { env, ctx }
    }

    fn base(&self) -> &std::path::Path {
        &self.env.base
    }

    async fn call(&self, tool: &str, input: serde_json::Value) -> ToolOutput {
        run_tool(tool, &input, &self.ctx).await
    }

    async fn bash(&self, command: &str) -> ToolOutput {
        self.call("Bash", json!({ "command": command })).await
    }
}

fn leaked(out: &ToolOutput) -> bool {
    out.content.contains(SECRET)
}

#[tokio::test]
async fn a_hidden_directory_inside_the_workspace_is_out_of_every_file_tool_s_reach() {
    let w = World::new();
    let inside = w
        .bash("cat .home/secret.key; echo; ls -A .home | wc -l")
        .await;
    assert!(
        !inside.is_error,
        "the sandbox runs here: {}",
        inside.content
    );
    assert!(!leaked(&inside), "Bash: {}", inside.content);

    let read = w
        .call("Read", json!({ "file_path": ".home/secret.key" }))
        .await;
    assert!(
        read.is_error && read.content.contains("hidden"),
        "{}",
        read.content
    );
    for grep in [
        json!({ "pattern": "hidden-bytes", "output_mode": "content" }),
        json!({ "pattern": "hidden-bytes", "path": ".home" }),
        json!({ "pattern": "hidden-bytes", "path": ".home/isolation" }),
    ] {
        let out = w.call("Grep", grep.clone()).await;
        assert!(!leaked(&out), "Grep {grep}: {}", out.content);
    }
    let glob = w.call("Glob", json!({ "pattern": "**/*" })).await;
    assert!(glob.content.contains("src/lib.rs"), "{}", glob.content);
    assert!(!glob.content.contains("secret.key"), "{}", glob.content);
    assert!(!glob.content.contains("snapshot"), "{}", glob.content);

    let write = w
        .call(
            "Write",
            json!({ "file_path": ".home/tokens.json", "content": "{}" }),
        )
        .await;
    assert!(write.is_error, "{}", write.content);
    assert!(!w.base().join("ws/.home/tokens.json").exists());
    let edit = w
        .call(
            "Edit",
            json!({ "file_path": ".home/secret.key", "old_string": SECRET, "new_string": "x" }),
        )
        .await;
    assert!(edit.is_error, "{}", edit.content);
    assert_eq!(
        std::fs::read_to_string(w.base().join("ws/.home/secret.key")).unwrap(),
        SECRET
    );
}

#[tokio::test]
async fn a_symlink_a_command_planted_does_not_lead_a_file_tool_behind_the_wall() {
    let w = World::new();
    let planted = w
        .bash("ln -s .home/secret.key key && ln -s .home home && mkdir -p d && ln -s ../.home d/up")
        .await;
    assert!(!planted.is_error, "{}", planted.content);
    for path in [
        "key",
        "home/secret.key",
        "d/up/secret.key",
        "d/../.home/secret.key",
    ] {
        let out = w.call("Read", json!({ "file_path": path })).await;
        assert!(
            out.is_error && !leaked(&out),
            "Read {path}: {}",
            out.content
        );
    }
    let out = w
        .call(
            "Grep",
            json!({ "pattern": "hidden", "output_mode": "content" }),
        )
        .await;
    assert!(!leaked(&out), "{}", out.content);
}

#[tokio::test]
async fn a_workspace_replaced_by_a_symlink_is_refused_not_followed() {
    let env = Env::new();
    let ws = env.base.join("ws");
    let elsewhere = env.base.join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::write(elsewhere.join("theirs.txt"), SECRET).unwrap();
    assert!(Workspace::pinned(&ws).is_ok());
    std::fs::remove_dir(&ws).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &ws).unwrap();
    let err = Workspace::pinned(&ws).unwrap_err().to_string();
    assert!(
        err.contains("replaced") && err.contains("symbolic link"),
        "{err}"
    );
    // A component above the workspace counts too.
    let err = Workspace::pinned(ws.join(".")).map(|_| ()).unwrap_err();
    assert!(err.to_string().contains("replaced"), "{err}");
}

/// Path pieces the property test writes paths from: names of the world, `..`, `.`, links the
/// test plants in the workspace, and the absolute roots of the hidden places.
fn piece() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(".home".to_owned()),
        Just("secret.key".to_owned()),
        Just("isolation".to_owned()),
        Just("b".to_owned()),
        Just("snapshot".to_owned()),
        Just("notes.md".to_owned()),
        Just("src".to_owned()),
        Just("lib.rs".to_owned()),
        Just("..".to_owned()),
        Just(".".to_owned()),
        Just("other".to_owned()),
        Just("user".to_owned()),
        Just(".config/gh/hosts.yml".to_owned()),
        Just("link-home".to_owned()),
        Just("link-other".to_owned()),
        Just("link-up".to_owned()),
    ]
}

fn written_path() -> impl Strategy<Value = (bool, Vec<String>)> {
    (any::<bool>(), prop::collection::vec(piece(), 1..6))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Whatever path a model writes, Read and Grep return no byte that Bash in the same session
    /// cannot read: every file behind the wall holds the secret, and the sandbox hides them all.
    #[test]
    fn a_file_tool_never_returns_a_byte_bash_cannot_read((absolute, pieces) in written_path()) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let w = World::new();
        let base = w.base().to_path_buf();
        for (link, to) in [
            ("link-home", base.join("ws/.home")),
            ("link-other", base.join("other")),
            ("link-up", PathBuf::from("..")),
        ] {
            std::os::unix::fs::symlink(to, base.join("ws").join(link)).unwrap();
        }
        let rel = pieces.join("/");
        let path = if absolute { format!("{}/{rel}", base.display()) } else { rel };
        runtime.block_on(async {
            for out in [
                w.call("Read", json!({ "file_path": path })).await,
                w.call("Grep", json!({ "pattern": "hidden", "path": path, "output_mode": "content" })).await,
                w.call("Glob", json!({ "pattern": "**/*", "path": path })).await,
            ] {
                if leaked(&out) {
                    let shell = w.bash(&format!("cat -- '{path}'")).await;
                    prop_assert!(
                        leaked(&shell),
                        "a file tool read {path} behind the wall: {}",
                        out.content
                    );
                }
            }
            Ok(())
        })?;
    }
}
