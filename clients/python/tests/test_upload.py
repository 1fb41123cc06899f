"""Uploads: a tree sent from here (what git lists, else what its ignore files keep), only the
contents the tenant lacks sent again, and a session started from it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import forkd
from forkd._upload import list_tree


def make_tree(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("alpha\n")
    (root / "sub" / "b.txt").write_text("beta\n")
    (root / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (root / "run.sh").chmod(0o755)
    (root / ".gitignore").write_text("*.log\n")
    (root / "debug.log").write_text("noise\n")
    (root / "sub" / ".gitignore").write_text("!keep.log\n")
    (root / "sub" / "keep.log").write_text("kept\n")
    (root / "link").symlink_to("a.txt")
    return root


def test_a_tree_is_listed_as_its_ignore_files_say(tmp_path: Path) -> None:
    tree = list_tree(make_tree(tmp_path / "t"))
    paths = sorted(e.path for e in tree.manifest.entries)
    assert paths == [
        ".gitignore",
        "a.txt",
        "link",
        "run.sh",
        "sub/.gitignore",
        "sub/b.txt",
        "sub/keep.log",
    ]
    by_path = {e.path: e for e in tree.manifest.entries}
    assert by_path["run.sh"].file.executable
    assert not by_path["a.txt"].file.executable
    assert by_path["link"].symlink == "a.txt"
    (tmp_path / "t" / "out").symlink_to("../..")
    with pytest.raises(ValueError, match="leading out of the tree"):
        list_tree(tmp_path / "t")


def test_a_session_starts_from_an_upload(client: forkd.Client, tmp_path: Path) -> None:
    root = make_tree(tmp_path / "repo")
    first = client.upload(root)
    assert first.blobs_received > 0
    assert first.git_commit == ""
    again = client.upload(root)
    assert again.blobs_received == 0, "the tenant had every content already"
    (root / "a.txt").write_text("alpha, changed\n")
    third = client.upload(root)
    assert third.blobs_received == 1

    session = client.sessions.create(system="s", upload=root)
    assert session.info.upload_origin.upload_id
    batch = session.fork(['Read it.\n@sim tool Read {"file_path":"a.txt"}\n@sim say read'])
    (n,) = batch.wait(timeout=30)
    assert n.status == "completed"
    transcript = client.agents.get(batch.agent_ids[0]).transcript()
    assert "alpha, changed" in str([m.content for m in transcript])


def test_a_git_work_tree_is_sent_as_git_lists_it(client: forkd.Client, tmp_path: Path) -> None:
    root = make_tree(tmp_path / "git")
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "first"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    upload = client.upload(root)
    assert upload.git_commit == head.stdout.strip()
    assert ".git/HEAD" not in {e.path for e in list_tree(root).manifest.entries}
