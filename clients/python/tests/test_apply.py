"""Isolated children's changes applied here (`batch.apply(to=DIR)`, with git) and on the
daemon's side (`batch.apply()`): all of a child's files or none, conflicts per file."""

from __future__ import annotations

import shutil

from conftest import Daemon

import forkd

WRITE = '@sim tool Write {"file_path":"new.txt","content":"made\\n"}'
EDIT = '@sim tool Edit {"file_path":"README.md","old_string":"line2","new_string":"LINE2"}'


def test_changes_are_applied_to_a_checkout_here(client: forkd.Client, daemon: Daemon) -> None:
    workspace = daemon.home.parent / "isolated"
    workspace.mkdir()
    (workspace / "README.md").write_text("line1\nline2\nline3\n")
    session = client.sessions.create(
        system="s", workspace=workspace, permission_mode="bypassPermissions"
    )
    batch = session.fork(
        [f"Add.\n{WRITE}\n@sim say added", f"Edit.\n{EDIT}\n@sim say edited"],
        isolation="copy",
    )
    assert all(n.status == "completed" for n in batch.wait(timeout=60))

    checkout = daemon.home.parent / "checkout"
    shutil.copytree(workspace, checkout)
    results = batch.apply(to=checkout)
    assert [r.applied for r in results] == [["new.txt"], ["README.md"]]
    assert (checkout / "new.txt").read_text() == "made\n"
    assert (checkout / "README.md").read_text() == "line1\nLINE2\nline3\n"

    # A checkout whose README changed where the child edited: that child conflicts, per file,
    # and writes nothing; the other applies.
    moved = daemon.home.parent / "moved"
    shutil.copytree(workspace, moved)
    (moved / "README.md").write_text("line1\nother\nline3\n")
    first, second = batch.apply(to=moved)
    assert first.applied == ["new.txt"] and not first.conflicts
    assert second.applied == [] and [p for p, _ in second.conflicts] == ["README.md"]
    assert (moved / "README.md").read_text() == "line1\nother\nline3\n"

    # The daemon's own apply, to the session's workspace.
    results = batch.apply()
    assert [r.applied for r in results] == [["new.txt"], ["README.md"]]
    assert (workspace / "README.md").read_text() == "line1\nLINE2\nline3\n"
