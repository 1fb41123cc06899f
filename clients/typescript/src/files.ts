// Trees to and from the daemon: an upload's listing (what git would list in a git work tree, else
// what the tree's own `.gitignore` and `.ignore` files keep; never `.git/`) and its contents by
// SHA-256; and isolated children's patches applied to a directory here with `git apply`.

import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { lstatSync, readFileSync, readdirSync, readlinkSync, realpathSync, statSync } from "node:fs";
import { dirname, isAbsolute, join, resolve, sep } from "node:path";

import ignore, { type Ignore } from "ignore";

import * as pb from "./gen/forkd/v1/forkd.js";

const CHUNK = 1024 * 1024;

/** A listed tree: its manifest, and where each content is on disk. */
export interface Tree {
  manifest: pb.UploadManifest;
  contents: Map<string, string>;
}

function git(dir: string, args: string[]): { ok: boolean; stdout: Buffer; stderr: string } {
  const env = { ...process.env };
  delete env.GIT_DIR;
  delete env.GIT_WORK_TREE;
  const out = spawnSync("git", ["-C", dir, ...args], { env, stdio: ["ignore", "pipe", "pipe"] });
  return { ok: out.status === 0, stdout: out.stdout ?? Buffer.alloc(0), stderr: String(out.stderr ?? "") };
}

/** Git's view of `dir` and HEAD's commit; `undefined` outside a git work tree. */
function gitListing(dir: string): { paths: string[]; commit: string } | undefined {
  if (!git(dir, ["rev-parse", "--show-toplevel"]).ok) return undefined;
  const listed = git(dir, ["ls-files", "-z", "--cached", "--others", "--exclude-standard"]);
  if (!listed.ok) throw new Error(`cannot list ${dir} with git ls-files: ${listed.stderr.trim()}`);
  // A nested repository git does not track comes as `name/`: git's view leaves it out.
  const paths = listed.stdout.toString().split("\0").filter((p) => p && !p.endsWith("/"));
  const head = git(dir, ["rev-parse", "--verify", "--quiet", "HEAD^{commit}"]);
  return { paths, commit: head.ok ? head.stdout.toString().trim() : "" };
}

/** The files the tree's own ignore files keep (those above it belong to another tree). */
function walk(root: string, rel = "", rules: [string, Ignore][] = []): string[] {
  const here = join(root, rel);
  const names = readdirSync(here).sort();
  const mine = [...rules];
  for (const file of [".gitignore", ".ignore"]) {
    if (names.includes(file)) mine.push([rel, ignore().add(readFileSync(join(here, file), "utf8"))]);
  }
  const ignored = (path: string, isDir: boolean): boolean => {
    let verdict = false;
    for (const [base, rule] of mine) {
      const inner = path.slice(base ? base.length + 1 : 0) + (isDir ? "/" : "");
      const result = rule.test(inner);
      if (result.ignored) verdict = true;
      else if (result.unignored) verdict = false;
    }
    return verdict;
  };
  const kept: string[] = [];
  for (const name of names) {
    const path = rel ? `${rel}/${name}` : name;
    const stat = lstatSync(join(root, path));
    if (stat.isDirectory()) {
      if (name !== ".git" && !ignored(path, true)) kept.push(...walk(root, path, mine));
    } else if (!ignored(path, false)) kept.push(path);
  }
  return kept;
}

function sha256(path: string): { sha: string; size: number } {
  const data = readFileSync(path);
  return { sha: createHash("sha256").update(data).digest("hex"), size: data.length };
}

/**
 * The tree under `dir`, hashed. A symbolic link that leads out of the tree, a FIFO, socket or
 * device is refused (a `TypeError` naming it), as the daemon would refuse it.
 */
export function listTree(dir: string): Tree {
  if (!statSync(dir).isDirectory()) throw new TypeError(`${dir} is not a directory`);
  const listed = gitListing(dir) ?? { paths: walk(dir), commit: "" };
  const realRoot = realpathSync(dir);
  const tree: Tree = { manifest: pb.UploadManifest.fromPartial({ gitCommit: listed.commit }), contents: new Map() };
  for (const rel of [...new Set(listed.paths)].sort()) {
    const disk = join(dir, rel);
    let stat;
    try {
      stat = lstatSync(disk);
    } catch {
      continue; // listed by git, removed from the work tree since
    }
    if (stat.isSymbolicLink()) {
      const target = readlinkSync(disk);
      const lands = resolve(dirname(resolve(realRoot, rel)), target);
      if (isAbsolute(target) || (lands !== realRoot && !lands.startsWith(realRoot + sep))) {
        throw new TypeError(`${rel}: a symbolic link leading out of the tree (${target})`);
      }
      tree.manifest.entries.push(pb.UploadEntry.fromPartial({ path: rel, kind: { $case: "symlink", value: target } }));
    } else if (stat.isFile()) {
      const { sha, size } = sha256(disk);
      const file = { sha256: sha, size, executable: (stat.mode & 0o111) !== 0 };
      tree.manifest.entries.push(pb.UploadEntry.fromPartial({ path: rel, kind: { $case: "file", value: file } }));
      if (!tree.contents.has(sha)) tree.contents.set(sha, disk);
    } else {
      throw new TypeError(`${rel}: not a regular file, directory or symbolic link`);
    }
  }
  return tree;
}

/** The manifest, then each missing content in pieces of 1 MiB. */
export function* uploadRequests(tree: Tree, missing: string[]): Generator<pb.UploadWorkspaceRequest> {
  yield pb.UploadWorkspaceRequest.fromPartial({ part: { $case: "manifest", value: tree.manifest } });
  for (const sha of missing) {
    const data = readFileSync(tree.contents.get(sha)!);
    if (createHash("sha256").update(data).digest("hex") !== sha) {
      throw new Error(`${tree.contents.get(sha)} changed while it was being uploaded`);
    }
    for (let at = 0; at === 0 || at < data.length; at += CHUNK) {
      const last = at + CHUNK >= data.length;
      const chunk = { sha256: sha, data: data.subarray(at, at + CHUNK), last };
      yield pb.UploadWorkspaceRequest.fromPartial({ part: { $case: "blob", value: chunk } });
      if (last) break;
    }
  }
}

/** What applying one child's changes did: the files written, or the conflicts that kept them out. */
export interface Applied {
  agentId: string;
  applied: string[];
  conflicts: { path: string; reason: string }[];
}

// `error: patch failed: README.md:3`, `error: new.txt: already exists in working directory`.
const NAMED = /^error: (?:patch failed: )?(?<path>[^:]+?)(?::\d+)?: ?(?<why>.*)$/;

/**
 * Applies one child's changes to `dir` with `git apply`: all of its files or none, a conflict
 * reported per file. `git apply` refuses paths leading out of `dir` and writes through no link.
 */
export function applyTo(dir: string, changes: pb.GetChangesResponse): Applied {
  const files = changes.files.map((f) => f.path);
  const special = changes.files
    .filter((f) => f.special && !f.special.startsWith("symbolic link"))
    .map((f) => ({ path: f.path, reason: `${f.special}, which no patch carries` }));
  if (special.length) return { agentId: changes.agentId, applied: [], conflicts: special };
  if (!changes.diff) return { agentId: changes.agentId, applied: [], conflicts: [] };
  for (const flags of [["--check"], []]) {
    const out = spawnSync("git", ["apply", "--whitespace=nowarn", "--binary", ...flags, "-"], {
      cwd: dir,
      input: changes.diff,
      encoding: "utf8",
    });
    if (out.error) throw new Error(`apply({ to }) needs git on this machine: ${out.error.message}`);
    if (out.status !== 0) return { agentId: changes.agentId, applied: [], conflicts: conflicts(out.stderr, files) };
  }
  return { agentId: changes.agentId, applied: files, conflicts: [] };
}

function conflicts(stderr: string, files: string[]): { path: string; reason: string }[] {
  const found = new Map<string, string>();
  for (const line of stderr.split("\n")) {
    const m = NAMED.exec(line.trim());
    const path = m?.groups?.path;
    if (path && files.includes(path) && !found.has(path)) found.set(path, m?.groups?.why || "the patch does not apply");
  }
  if (found.size === 0) {
    const reason = stderr.trim() || "git apply refused the patch";
    return files.length ? files.map((path) => ({ path, reason })) : [{ path: "", reason }];
  }
  return [...found].sort().map(([path, reason]) => ({ path, reason }));
}
