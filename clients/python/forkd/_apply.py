"""Isolated children's changes applied to a directory on this machine (forkctl's `apply --to`):
each child's patch, as the daemon keeps it (git's format, binary files included), applied with
`git apply` in order: all of a child's files or none, a conflict reported per file and nothing
of that child written. `git apply` refuses paths leading out of the directory and writes
through no symbolic link."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from forkd._proto.forkd.v1 import forkd_pb2 as pb


@dataclass(frozen=True)
class Applied:
    """What applying one child's changes did: the files written, or the conflicts that kept
    all of them out."""

    agent_id: str
    applied: list[str] = field(default_factory=list)
    conflicts: list[tuple[str, str]] = field(default_factory=list)

    @staticmethod
    def of(a: pb.AppliedChanges) -> Applied:
        return Applied(a.agent_id, list(a.applied), [(c.path, c.reason) for c in a.conflicts])


# `error: patch failed: README.md:3`, `error: new.txt: already exists in working directory`,
# `error: gone.txt: does not exist in index`: the file a line names.
_FILE = re.compile(r"^error: (?:patch failed: )?(?P<path>[^:]+?)(?::\d+)?: ?(?P<why>.*)$")


def apply_to(directory: Path, changes: pb.GetChangesResponse) -> Applied:
    """Applies one child's changes to `directory` (see the module's rules)."""
    agent_id = changes.agent_id
    files = [f.path for f in changes.files]
    special = [
        (f.path, f"{f.special}, which no patch carries")
        for f in changes.files
        if f.special and not f.special.startswith("symbolic link")
    ]
    if special:
        return Applied(agent_id, [], special)
    if not changes.diff:
        return Applied(agent_id, [])
    check = _git_apply(directory, changes.diff, "--check")
    if check.returncode != 0:
        return Applied(agent_id, [], _conflicts(check.stderr, files))
    done = _git_apply(directory, changes.diff)
    if done.returncode != 0:
        return Applied(agent_id, [], _conflicts(done.stderr, files))
    return Applied(agent_id, files)


def _git_apply(directory: Path, diff: str, *flags: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            ["git", "apply", "--whitespace=nowarn", "--binary", *flags, "-"],
            cwd=directory,
            input=diff,
            capture_output=True,
            text=True,
            check=False,
        )
    except FileNotFoundError:
        raise RuntimeError("apply(to=) needs git on this machine") from None


def _conflicts(stderr: str, files: list[str]) -> list[tuple[str, str]]:
    """Git's complaints, per file; one for the whole child when git names none."""
    found: dict[str, str] = {}
    for line in stderr.splitlines():
        m = _FILE.match(line.strip())
        if m and m["path"] in files:
            found.setdefault(m["path"], m["why"] or "the patch does not apply")
    if not found:
        why = stderr.strip() or "git apply refused the patch"
        return [(path, why) for path in files] or [("", why)]
    return sorted(found.items())
