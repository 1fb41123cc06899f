//! One test per way out of the workspace, each tried with every file tool (Read, Write, Edit,
//! and the `path` argument of Glob and Grep). A refused call must also leave the outside alone.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::symlink;

use common::{Env, err, ok};
use serde_json::json;

const SECRET: &str = "secret\n";

/// A workspace with two neighbours outside it: `outside/` and the prefix twin `ws-secret/`.
fn setup() -> Env {
    let env = Env::new();
    for dir in ["outside", "ws-secret"] {
        std::fs::create_dir(env.base.join(dir)).unwrap();
        std::fs::write(env.base.join(dir).join("secret.txt"), SECRET).unwrap();
    }
    env
}

/// Every tool refuses `file` (Read/Write/Edit) and `dir` (Glob/Grep) with `needle` in the
/// message, and nothing outside the workspace changed.
async fn refused_everywhere(env: &Env, file: &str, dir: &str, needle: &str) {
    let calls = [
        ("Read", json!({"file_path": file})),
        ("Write", json!({"file_path": file, "content": "pwned"})),
        (
            "Edit",
            json!({"file_path": file, "old_string": "secret", "new_string": "pwned"}),
        ),
        ("Glob", json!({"pattern": "**/*", "path": dir})),
        ("Grep", json!({"pattern": "secret", "path": dir})),
    ];
    for (tool, input) in calls {
        let out = env.call(tool, input).await;
        assert!(out.files_changed.is_empty(), "{tool}");
        assert!(!out.content.contains("pwned"), "{tool}: {}", out.content);
        err(out, needle);
    }
    assert_outside_untouched(env);
}

fn assert_outside_untouched(env: &Env) {
    for dir in ["outside", "ws-secret"] {
        let entries: Vec<_> = std::fs::read_dir(env.base.join(dir))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(entries, ["secret.txt"], "{dir} gained files");
        let text = std::fs::read_to_string(env.base.join(dir).join("secret.txt")).unwrap();
        assert_eq!(text, SECRET, "{dir}/secret.txt changed");
    }
}

#[tokio::test]
async fn dot_dot_escape() {
    let env = setup();
    std::fs::create_dir(env.root().join("sub")).unwrap();
    refused_everywhere(
        &env,
        "../outside/secret.txt",
        "../outside",
        "outside the workspace",
    )
    .await;
    refused_everywhere(
        &env,
        "sub/../../outside/secret.txt",
        "sub/../..",
        "outside the workspace",
    )
    .await;
}

#[tokio::test]
async fn absolute_path_outside() {
    let env = setup();
    let file = env.base.join("outside/secret.txt");
    let dir = env.base.join("outside");
    refused_everywhere(
        &env,
        file.to_str().unwrap(),
        dir.to_str().unwrap(),
        "outside the workspace",
    )
    .await;
    let out = env
        .call("Read", json!({"file_path": file.to_str().unwrap()}))
        .await;
    let expected = format!(
        "path {} is outside the workspace {}",
        file.display(),
        env.root().display()
    );
    assert_eq!(out.content, expected);
}

#[tokio::test]
async fn sibling_with_the_workspace_as_string_prefix() {
    let env = setup();
    let file = env.base.join("ws-secret/secret.txt");
    let dir = env.base.join("ws-secret");
    assert!(
        file.to_str()
            .unwrap()
            .starts_with(env.root().to_str().unwrap())
    );
    refused_everywhere(
        &env,
        file.to_str().unwrap(),
        dir.to_str().unwrap(),
        "outside the workspace",
    )
    .await;
    refused_everywhere(
        &env,
        "../ws-secret/secret.txt",
        "../ws-secret",
        "outside the workspace",
    )
    .await;
}

#[tokio::test]
async fn symlinked_file_pointing_out() {
    let env = setup();
    symlink(
        env.base.join("outside/secret.txt"),
        env.root().join("link.txt"),
    )
    .unwrap();
    refused_everywhere(&env, "link.txt", "link.txt", "outside the workspace").await;
}

#[tokio::test]
async fn symlinked_directory_pointing_out() {
    let env = setup();
    symlink(env.base.join("outside"), env.root().join("linkdir")).unwrap();
    refused_everywhere(
        &env,
        "linkdir/secret.txt",
        "linkdir",
        "outside the workspace",
    )
    .await;
}

#[tokio::test]
async fn write_through_a_missing_path_under_a_symlinked_directory() {
    let env = setup();
    symlink(env.base.join("outside"), env.root().join("linkdir")).unwrap();
    refused_everywhere(
        &env,
        "linkdir/new/file.txt",
        "linkdir/new",
        "outside the workspace",
    )
    .await;
    assert!(!env.base.join("outside/new").exists());
}

#[tokio::test]
async fn dangling_symlink_pointing_out() {
    let env = setup();
    symlink(env.base.join("outside/new.txt"), env.root().join("dangle")).unwrap();
    refused_everywhere(&env, "dangle", "dangle", "cannot be resolved").await;
    assert!(!env.base.join("outside/new.txt").exists());
}

#[tokio::test]
async fn nul_byte() {
    let env = setup();
    refused_everywhere(&env, "a\0b.txt", "a\0b", "NUL byte").await;
}

#[tokio::test]
async fn empty_path() {
    let env = setup();
    refused_everywhere(&env, "", "", "the path is empty").await;
}

#[tokio::test]
async fn symlink_inside_pointing_inside_is_allowed() {
    let env = setup();
    env.file("real.txt", SECRET);
    env.file("realdir/inner.txt", SECRET);
    symlink(env.root().join("real.txt"), env.root().join("alias.txt")).unwrap();
    symlink(env.root().join("realdir"), env.root().join("aliasdir")).unwrap();

    assert!(ok(env.call("Read", json!({"file_path": "alias.txt"})).await).contains("secret"));
    let edit = env
        .call(
            "Edit",
            json!({"file_path": "alias.txt", "old_string": "secret", "new_string": "edited"}),
        )
        .await;
    assert_eq!(edit.files_changed, ["real.txt"]);
    ok(edit);
    let write = env
        .call(
            "Write",
            json!({"file_path": "aliasdir/new.txt", "content": "x"}),
        )
        .await;
    assert_eq!(write.files_changed, ["realdir/new.txt"]);
    ok(write);
    assert_eq!(env.read("real.txt"), "edited\n");
    assert!(
        std::fs::symlink_metadata(env.root().join("alias.txt"))
            .unwrap()
            .is_symlink()
    );

    let glob = ok(env
        .call("Glob", json!({"pattern": "*.txt", "path": "aliasdir"}))
        .await);
    assert!(glob.contains("realdir/inner.txt"), "{glob}");
    let grep = ok(env
        .call("Grep", json!({"pattern": "secret", "path": "aliasdir"}))
        .await);
    assert_eq!(grep, "realdir/inner.txt");
    assert_outside_untouched(&env);
}

#[tokio::test]
async fn walks_from_the_root_do_not_follow_symlinks_out() {
    let env = setup();
    env.file("own.txt", "mine\n");
    symlink(env.base.join("outside"), env.root().join("linkdir")).unwrap();
    symlink(
        env.base.join("outside/secret.txt"),
        env.root().join("link.txt"),
    )
    .unwrap();
    let glob = ok(env.call("Glob", json!({"pattern": "**/*"})).await);
    assert!(!glob.contains("linkdir/"), "{glob}");
    let grep = ok(env
        .call(
            "Grep",
            json!({"pattern": "secret", "output_mode": "content"}),
        )
        .await);
    assert_eq!(grep, "No matches found");
}
