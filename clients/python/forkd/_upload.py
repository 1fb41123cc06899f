"""Sending a tree to the daemon (`forkctl upload`, `session create --upload`): what git would
list in a git work tree (`ls-files --cached --others --exclude-standard`), else what the tree's
own `.gitignore` and `.ignore` files keep; nothing under `.git/`. Contents go by SHA-256, and
only those the tenant lacks (`FindMissingBlobs`) travel, in pieces of 1 MiB."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pathspec

from forkd._proto.forkd.v1 import forkd_pb2 as pb

_CHUNK = 1024 * 1024
# Hashes asked about per FindMissingBlobs call.
_ASK = 10_000
_IGNORE_FILES = (".gitignore", ".ignore")


@dataclass
class Tree:
    """A listed tree: its manifest, and where each content is on disk."""

    root: Path
    manifest: pb.UploadManifest
    contents: dict[str, Path] = field(default_factory=dict)


@dataclass(frozen=True)
class Upload:
    """An upload the daemon stored: sessions name it (`upload_id=`)."""

    upload_id: str
    files: int
    bytes: int
    git_commit: str
    # What this upload carried: the rest the tenant had already.
    blobs_received: int
    bytes_received: int

    @staticmethod
    def of(r: pb.UploadWorkspaceResponse) -> Upload:
        return Upload(
            r.upload_id, r.files, r.bytes, r.git_commit, r.blobs_received, r.bytes_received
        )


def _git(directory: Path, *args: str) -> subprocess.CompletedProcess[bytes] | None:
    env = {k: v for k, v in os.environ.items() if k not in ("GIT_DIR", "GIT_WORK_TREE")}
    try:
        return subprocess.run(
            ["git", "-C", str(directory), *args],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            check=False,
        )
    except FileNotFoundError:
        return None


def _git_listing(directory: Path) -> tuple[list[str], str] | None:
    """Git's view of `directory` and HEAD's commit; `None` outside a git work tree."""
    top = _git(directory, "rev-parse", "--show-toplevel")
    if top is None or top.returncode != 0:
        return None
    out = _git(directory, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    if out is None or out.returncode != 0:
        why = out.stderr.decode(errors="replace").strip() if out else "git is missing"
        raise ValueError(f"cannot list {directory} with git ls-files: {why}")
    # A nested repository git does not track comes as `name/`: git's view leaves it out.
    paths = [p for p in out.stdout.decode().split("\0") if p and not p.endswith("/")]
    head = _git(directory, "rev-parse", "--verify", "--quiet", "HEAD^{commit}")
    commit = head.stdout.decode().strip() if head and head.returncode == 0 else ""
    return paths, commit


def _walk(directory: Path) -> list[str]:
    """The files the tree's own ignore files keep (those above it belong to another tree)."""
    kept: list[str] = []
    # Each directory's rules, with the directory they were read in.
    rules: list[tuple[str, pathspec.GitIgnoreSpec]] = []
    for here, dirs, files in os.walk(directory):
        rel_here = os.path.relpath(here, directory)
        rel_here = "" if rel_here == "." else rel_here + "/"
        rules = [(base, spec) for base, spec in rules if rel_here.startswith(base)]
        for name in _IGNORE_FILES:
            if name in files:
                lines = (Path(here) / name).read_text(errors="replace").splitlines()
                rules.append((rel_here, pathspec.GitIgnoreSpec.from_lines(lines)))

        # A symbolic link to a directory is an entry of its own, as git lists it: not walked.
        links = [d for d in dirs if os.path.islink(os.path.join(here, d))]
        files = [*files, *links]
        dirs[:] = sorted(
            d
            for d in dirs
            if d != ".git" and d not in links and not _ignored(rules, rel_here + d, is_dir=True)
        )
        kept.extend(rel_here + f for f in sorted(files) if not _ignored(rules, rel_here + f, False))
    return kept


def _ignored(rules: list[tuple[str, pathspec.GitIgnoreSpec]], rel: str, is_dir: bool) -> bool:
    """Whether the rules of the directories above `rel` ignore it: the deepest directory's
    rules come last and win, as git's do."""
    verdict = False
    for base, spec in rules:
        inner = rel[len(base) :] + ("/" if is_dir else "")
        result = spec.check_file(inner)
        if result.include is not None:
            verdict = result.include
    return verdict


def _hash(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def list_tree(directory: str | Path) -> Tree:
    """The tree under `directory`, hashed. A symbolic link that leads out of the tree, a FIFO,
    socket or device is refused (`ValueError` naming it), as the daemon would refuse it."""
    root = Path(directory)
    if not root.is_dir():
        raise ValueError(f"{root} is not a directory")
    listed = _git_listing(root)
    paths, commit = listed if listed is not None else (_walk(root), "")
    real_root = root.resolve()
    tree = Tree(root, pb.UploadManifest(git_commit=commit))
    for rel in sorted(set(paths)):
        disk = root / rel
        try:
            mode = disk.lstat().st_mode
        except FileNotFoundError:
            # Listed by git, removed from the work tree since: not in the tree.
            continue
        if stat.S_ISLNK(mode):
            target = os.readlink(disk)
            if os.path.isabs(target) or not (disk.parent / target).resolve().is_relative_to(
                real_root
            ):
                raise ValueError(f"{rel}: a symbolic link leading out of the tree ({target})")
            tree.manifest.entries.append(pb.UploadEntry(path=rel, symlink=target))
        elif stat.S_ISREG(mode):
            sha, size = _hash(disk)
            executable = bool(mode & 0o111)
            upload_file = pb.UploadFile(sha256=sha, size=size, executable=executable)
            tree.manifest.entries.append(pb.UploadEntry(path=rel, file=upload_file))
            tree.contents.setdefault(sha, disk)
        else:
            raise ValueError(f"{rel}: not a regular file, directory or symbolic link")
    return tree


def batches(hashes: list[str]) -> Iterator[list[str]]:
    """The hashes in the groups FindMissingBlobs is asked about."""
    for start in range(0, len(hashes), _ASK):
        yield hashes[start : start + _ASK]


def requests(tree: Tree, missing: list[str]) -> Iterator[pb.UploadWorkspaceRequest]:
    """The manifest, then each missing content in pieces of 1 MiB. A file that changed since it
    was listed is an error: what was announced is not what would be sent."""
    yield pb.UploadWorkspaceRequest(manifest=tree.manifest)
    for sha in missing:
        disk = tree.contents[sha]
        digest = hashlib.sha256()
        with disk.open("rb") as f:
            chunk = f.read(_CHUNK)
            while True:
                following = f.read(_CHUNK) if chunk else b""
                digest.update(chunk)
                last = not following
                if last and digest.hexdigest() != sha:
                    raise ValueError(f"{disk} changed while it was being uploaded")
                yield pb.UploadWorkspaceRequest(
                    blob=pb.BlobChunk(sha256=sha, data=chunk, last=last)
                )
                if last:
                    break
                chunk = following
