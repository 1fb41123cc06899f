//! Read, Write, Edit, Glob and Grep on a temporary workspace: the happy paths, the limits, and
//! error messages that tell the model what to do next.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs::File;
use std::time::{Duration, SystemTime};

use common::{Env, err, ok};
use serde_json::json;

fn numbered(range: std::ops::RangeInclusive<usize>) -> String {
    range.map(|n| format!("{n:>6}\tline {n}\n")).collect()
}

fn lines(n: usize) -> String {
    (1..=n).map(|i| format!("line {i}\n")).collect()
}

#[tokio::test]
async fn read_numbers_lines_like_cat_n() {
    let env = Env::new();
    env.file("a.txt", &lines(3));
    let out = ok(env.call("Read", json!({"file_path": "a.txt"})).await);
    assert_eq!(out, numbered(1..=3));
    let out = ok(env
        .call(
            "Read",
            json!({"file_path": "a.txt", "offset": 2, "limit": 1}),
        )
        .await);
    assert_eq!(
        out,
        format!(
            "{}… (more lines follow; continue with offset 3)\n",
            numbered(2..=2)
        )
    );
}

#[tokio::test]
async fn read_applies_the_default_line_limit_and_truncates_long_lines() {
    let mut env = Env::new();
    env.ctx.limits.read_lines = 2;
    env.ctx.limits.line_chars = 4;
    env.file("a.txt", "abcdefgh\nshort\nthird\n");
    let out = ok(env.call("Read", json!({"file_path": "a.txt"})).await);
    assert_eq!(
        out,
        "     1\tabcd… [line truncated]\n     2\tshor… [line truncated]\n\
         … (more lines follow; continue with offset 3)\n"
    );
}

#[tokio::test]
async fn read_explains_what_it_cannot_show() {
    let env = Env::new();
    env.file("empty.txt", "");
    env.file("two.txt", "a\nb");
    std::fs::write(env.root().join("bin.dat"), b"\x7fELF\0\0\x01").unwrap();
    std::fs::create_dir(env.root().join("dir")).unwrap();
    let read = |path: &str| env.call("Read", json!({"file_path": path}));
    assert_eq!(ok(read("empty.txt").await), "(file empty.txt is empty)");
    assert_eq!(ok(read("two.txt").await), "     1\ta\n     2\tb\n");
    err(read("bin.dat").await, "bin.dat looks like a binary file");
    err(read("dir").await, "dir is a directory, not a file");
    err(read("missing.txt").await, "file missing.txt does not exist");
    let past = env
        .call("Read", json!({"file_path": "two.txt", "offset": 9}))
        .await;
    assert_eq!(
        ok(past),
        "(file two.txt has 2 lines; offset 9 is past the end)"
    );
    err(
        env.call("Read", json!({})).await,
        "missing required field `file_path`",
    );
    err(
        env.call("Read", json!({"file_path": "two.txt", "limit": -1}))
            .await,
        "field `limit` must be a positive integer",
    );
}

#[tokio::test]
async fn write_creates_parents_and_overwrites() {
    let env = Env::new();
    let out = env
        .call(
            "Write",
            json!({"file_path": "src/deep/new.rs", "content": "fn main() {}\n"}),
        )
        .await;
    assert_eq!(out.files_changed, ["src/deep/new.rs"]);
    assert_eq!(ok(out), "Created src/deep/new.rs (13 bytes)");
    let abs = env.root().join("src/deep/new.rs");
    let out = env
        .call(
            "Write",
            json!({"file_path": abs.to_str().unwrap(), "content": "x"}),
        )
        .await;
    assert_eq!(ok(out), "Overwrote src/deep/new.rs (1 byte)");
    assert_eq!(env.read("src/deep/new.rs"), "x");
    err(
        env.call("Write", json!({"file_path": "a.txt"})).await,
        "missing required field `content`",
    );
    err(
        env.call("Write", json!({"file_path": "src", "content": ""}))
            .await,
        "src is a directory",
    );
}

#[tokio::test]
async fn edit_replaces_one_unique_occurrence() {
    let env = Env::new();
    env.file("a.rs", "let x = 1;\nlet y = 2;\n");
    let out = env
        .call(
            "Edit",
            json!({"file_path": "a.rs", "old_string": "x = 1", "new_string": "x = 10"}),
        )
        .await;
    assert_eq!(out.files_changed, ["a.rs"]);
    assert_eq!(ok(out), "Replaced 1 occurrence in a.rs");
    assert_eq!(env.read("a.rs"), "let x = 10;\nlet y = 2;\n");
}

#[tokio::test]
async fn edit_refuses_missing_ambiguous_and_no_op_changes() {
    let env = Env::new();
    env.file("a.txt", "foo foo\n");
    let edit = |old: &str, new: &str| {
        env.call(
            "Edit",
            json!({"file_path": "a.txt", "old_string": old, "new_string": new}),
        )
    };
    err(
        edit("bar", "baz").await,
        "old_string was not found in a.txt",
    );
    err(
        edit("foo", "baz").await,
        "old_string occurs 2 times in a.txt",
    );
    err(edit("foo", "foo").await, "identical");
    err(edit("", "x").await, "old_string is empty");
    err(
        env.call(
            "Edit",
            json!({"file_path": "nope.txt", "old_string": "a", "new_string": "b"}),
        )
        .await,
        "file nope.txt does not exist",
    );
    err(
        env.call("Edit", json!({"file_path": "a.txt", "old_string": "a"}))
            .await,
        "missing required field `new_string`",
    );
    assert_eq!(env.read("a.txt"), "foo foo\n");
    let all = env
        .call("Edit", json!({"file_path": "a.txt", "old_string": "foo", "new_string": "bar", "replace_all": true}))
        .await;
    assert_eq!(ok(all), "Replaced 2 occurrences in a.txt");
    assert_eq!(env.read("a.txt"), "bar bar\n");
}

fn touch(env: &Env, rel: &str, age_secs: u64) {
    let path = env.file(rel, "x\n");
    let when = SystemTime::now() - Duration::from_secs(age_secs);
    File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(when)
        .unwrap();
}

#[tokio::test]
async fn glob_lists_newest_first_relative_to_the_workspace() {
    let env = Env::new();
    touch(&env, "src/old.rs", 300);
    touch(&env, "src/new.rs", 10);
    touch(&env, "src/mid.rs", 100);
    touch(&env, "src/b/same.rs", 50);
    touch(&env, "src/a/same.rs", 50);
    touch(&env, "README.md", 1);
    let out = ok(env.call("Glob", json!({"pattern": "**/*.rs"})).await);
    assert_eq!(
        out,
        "src/new.rs\nsrc/a/same.rs\nsrc/b/same.rs\nsrc/mid.rs\nsrc/old.rs"
    );
    let out = ok(env
        .call("Glob", json!({"pattern": "*.rs", "path": "src"}))
        .await);
    assert_eq!(out, "src/new.rs\nsrc/mid.rs\nsrc/old.rs");
    assert_eq!(
        ok(env.call("Glob", json!({"pattern": "*.py"})).await),
        "No files found"
    );
}

#[tokio::test]
async fn glob_respects_gitignore_skips_git_and_caps() {
    let mut env = Env::new();
    env.file(".gitignore", "target/\n");
    env.file("target/debug/out.rs", "");
    env.file(".git/config.rs", "");
    env.file(".github/ci.rs", "");
    for name in ["a", "b", "c"] {
        env.file(&format!("{name}.rs"), "");
    }
    let out = ok(env.call("Glob", json!({"pattern": "**/*.rs"})).await);
    assert!(!out.contains("target/") && !out.contains(".git/"), "{out}");
    assert!(out.contains(".github/ci.rs"), "{out}");
    env.ctx.limits.max_results = 2;
    let out = ok(env.call("Glob", json!({"pattern": "**/*.rs"})).await);
    assert_eq!(out.lines().count(), 3, "{out}");
    assert!(
        out.ends_with("(2 more results not shown: 4 in total; narrow the pattern or the path)"),
        "{out}"
    );
    err(
        env.call("Glob", json!({"pattern": "a/[", "path": "."}))
            .await,
        "invalid glob pattern",
    );
    err(
        env.call("Glob", json!({"pattern": "/etc/*"})).await,
        "is absolute",
    );
    err(
        env.call("Glob", json!({"pattern": "*", "path": "a.rs"}))
            .await,
        "a.rs is not a directory",
    );
}

#[tokio::test]
async fn grep_output_modes() {
    let env = Env::new();
    env.file("src/a.rs", "fn alpha() {}\nfn beta() {}\nfn alpha2() {}\n");
    env.file("src/b.rs", "fn gamma() {}\n");
    env.file("notes.md", "alpha notes\n");
    let grep = |input| env.call("Grep", input);
    assert_eq!(
        ok(grep(json!({"pattern": "alpha"})).await),
        "notes.md\nsrc/a.rs"
    );
    assert_eq!(
        ok(grep(json!({"pattern": "fn al", "output_mode": "content"})).await),
        "src/a.rs:1:fn alpha() {}\nsrc/a.rs:3:fn alpha2() {}"
    );
    assert_eq!(
        ok(grep(json!({"pattern": "alpha", "output_mode": "count"})).await),
        "notes.md:1\nsrc/a.rs:2"
    );
    assert_eq!(
        ok(grep(json!({"pattern": "alpha", "glob": "*.rs"})).await),
        "src/a.rs"
    );
    assert_eq!(
        ok(grep(json!({"pattern": "gamma", "path": "src/b.rs"})).await),
        "src/b.rs"
    );
    assert_eq!(
        ok(grep(json!({"pattern": "zeta"})).await),
        "No matches found"
    );
    err(
        grep(json!({"pattern": "("})).await,
        "invalid regular expression `(`",
    );
    err(
        grep(json!({"pattern": "a", "output_mode": "lines"})).await,
        "field `output_mode` must be one of",
    );
    err(
        grep(json!({"pattern": "a", "path": "missing"})).await,
        "file missing does not exist",
    );
}

#[tokio::test]
async fn grep_skips_ignored_and_binary_files_and_caps() {
    let mut env = Env::new();
    env.file(".gitignore", "*.log\n");
    env.file("build.log", "needle\n");
    std::fs::write(env.root().join("blob.bin"), b"needle\0\x01").unwrap();
    env.file("many.txt", &"needle\n".repeat(50));
    let out = ok(env.call("Grep", json!({"pattern": "needle"})).await);
    assert_eq!(out, "many.txt");
    env.ctx.limits.max_results = 10;
    let out = ok(env
        .call(
            "Grep",
            json!({"pattern": "needle", "output_mode": "content"}),
        )
        .await);
    assert_eq!(out.lines().count(), 11, "{out}");
    assert!(out.contains("(40 more results not shown"), "{out}");
}

#[tokio::test]
async fn special_files_are_refused_not_waited_on() {
    let env = Env::new();
    let fifo = env.root().join("pipe");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    env.file("a.txt", "needle\n");
    err(
        env.call("Read", json!({"file_path": "pipe"})).await,
        "pipe is not a regular file",
    );
    err(
        env.call(
            "Edit",
            json!({"file_path": "pipe", "old_string": "a", "new_string": "b"}),
        )
        .await,
        "pipe is not a regular file",
    );
    err(
        env.call("Write", json!({"file_path": "pipe", "content": "x"}))
            .await,
        "not a regular file",
    );
    assert_eq!(
        ok(env.call("Grep", json!({"pattern": "needle"})).await),
        "a.txt"
    );
}
