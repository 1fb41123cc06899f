//! `forkctl apply --to DIR`: isolated children's changes applied to a directory on this machine
//! (a CI runner's checkout), from the patches the daemon keeps on record.
//!
//! The daemon-side apply's rules, read from the patch: children in order, each all of its files
//! or none; a file still as the snapshot had it takes the child's version exactly, one changed
//! here since takes the child's text hunks where their context still matches; anything else (a
//! binary file changed here, a file made by the child that exists here, a removal of a file
//! changed here) is a conflict, reported per file, and nothing of that child is written. Nothing
//! is written outside DIR: no path with `..`, no write through a symbolic link, no link that
//! leads out.

use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Component, Path, PathBuf};

use anyhow::Context as _;
use forkd_core::patch::{self, FilePatch};
use forkd_proto::v1::{AppliedChanges, ChangeConflict, GetChangesRequest, ListAgentsRequest};

use super::changes::TargetArgs;
use crate::client::Client;

/// Applies each named child's changes to `dir`, in order.
pub async fn run(
    target: TargetArgs,
    dir: &Path,
    client: &mut Client,
) -> anyhow::Result<Vec<AppliedChanges>> {
    let dir = std::fs::canonicalize(dir)
        .with_context(|| format!("cannot use {} as the directory to apply to", dir.display()))?;
    anyhow::ensure!(dir.is_dir(), "{} is not a directory", dir.display());
    let agents = match target.batch {
        Some(batch) => children(client, batch).await?,
        None => target.agent_ids,
    };
    let mut results = Vec::new();
    for agent_id in agents {
        let changes = client
            .get_changes(GetChangesRequest {
                agent_id: agent_id.clone(),
            })
            .await?
            .into_inner();
        let mut conflicts: Vec<ChangeConflict> = changes
            .files
            .iter()
            .filter(|f| !f.special.is_empty() && !f.special.starts_with("symbolic link"))
            .map(|f| conflict(&f.path, format!("{}, which no patch carries", f.special)))
            .collect();
        let files = patch::parse(&changes.diff)
            .with_context(|| format!("the patch of {agent_id} does not read"))?;
        let mut writes = Vec::new();
        for file in &files {
            match plan(&dir, file) {
                Ok(write) => writes.push(write),
                Err(reason) => conflicts.push(conflict(&file.path, reason)),
            }
        }
        let mut applied = Vec::new();
        if conflicts.is_empty() {
            for write in writes {
                write
                    .perform()
                    .with_context(|| format!("cannot write {}", write.path.display()))?;
                applied.push(write.name);
            }
        }
        results.push(AppliedChanges {
            agent_id,
            applied,
            conflicts,
        });
    }
    Ok(results)
}

/// A batch's children's ids, in their order.
pub(crate) async fn children(client: &mut Client, batch: String) -> anyhow::Result<Vec<String>> {
    let filter = ListAgentsRequest {
        batch_id: batch,
        include_ended: true,
        ..Default::default()
    };
    let mut agents = Vec::new();
    super::ps::list_agents(client, filter, |page| {
        agents.extend(page);
        Ok(())
    })
    .await?;
    agents.sort_by_key(|a| a.index);
    Ok(agents.into_iter().map(|a| a.agent_id).collect())
}

fn conflict(path: &str, reason: impl Into<String>) -> ChangeConflict {
    ChangeConflict {
        path: path.to_owned(),
        reason: reason.into(),
    }
}

/// One file's planned change.
struct Write {
    /// Its name in the patch.
    name: String,
    path: PathBuf,
    /// `None`: removed.
    content: Option<Vec<u8>>,
    mode: u32,
}

/// What `file`'s part of the patch makes of `dir`'s file, read now; why not, as a conflict.
fn plan(dir: &Path, file: &FilePatch) -> Result<Write, String> {
    let path = inside(dir, &file.path)?;
    let current = match std::fs::symlink_metadata(&path) {
        Ok(meta) if meta.file_type().is_symlink() => Some(
            std::fs::read_link(&path)
                .map_err(|e| e.to_string())?
                .as_os_str()
                .as_bytes()
                .to_vec(),
        ),
        Ok(meta) if meta.is_file() => Some(std::fs::read(&path).map_err(|e| e.to_string())?),
        Ok(_) => return Err("not a regular file here".into()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e.to_string()),
    };
    let content = file.apply(current.as_deref())?;
    let mode = file.new.as_ref().map_or(0o100_644, |n| n.mode);
    if mode == 0o120_000
        && let Some(target) = &content
    {
        let target = Path::new(std::ffi::OsStr::from_bytes(target));
        let parent = path.parent().unwrap_or(dir);
        if target.is_absolute() || !lexically_inside(dir, &parent.join(target)) {
            return Err(format!(
                "a symbolic link to {} leads outside the directory",
                target.display()
            ));
        }
    }
    Ok(Write {
        name: file.path.clone(),
        path,
        content,
        mode,
    })
}

/// `dir`'s path for `name`: refused when it would leave `dir` or pass through a symbolic link.
fn inside(dir: &Path, name: &str) -> Result<PathBuf, String> {
    let relative = Path::new(name);
    if relative.as_os_str().is_empty()
        || !relative
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
    {
        return Err("a path that is not plainly inside the directory".into());
    }
    let mut path = dir.to_path_buf();
    let mut parts = relative.components().peekable();
    while let Some(part) = parts.next() {
        path.push(part);
        if parts.peek().is_some()
            && std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink())
        {
            return Err(format!(
                "{} is a symbolic link here; not writing through it",
                path.strip_prefix(dir).unwrap_or(&path).display()
            ));
        }
    }
    Ok(path)
}

/// Whether `path`, `..` resolved without following links, stays beneath `dir`.
fn lexically_inside(dir: &Path, path: &Path) -> bool {
    let mut resolved = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                if !resolved.pop() {
                    return false;
                }
            }
            Component::CurDir => {}
            other => resolved.push(other),
        }
    }
    resolved.starts_with(dir)
}

impl Write {
    fn perform(&self) -> std::io::Result<()> {
        let Some(content) = &self.content else {
            return match std::fs::remove_file(&self.path) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                other => other,
            };
        };
        let parent = self.path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(parent)?;
        if self.mode == 0o120_000 {
            match std::fs::remove_file(&self.path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
            return std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(content), &self.path);
        }
        // Written beside it and renamed over it: a reader never sees half a file, and a link
        // at the path is replaced, never written through.
        let mut temp = tempfile::NamedTempFile::new_in(parent)?;
        std::io::Write::write_all(&mut temp, content)?;
        let mode = if self.mode & 0o111 == 0 { 0o644 } else { 0o755 };
        temp.as_file()
            .set_permissions(std::fs::Permissions::from_mode(mode))?;
        temp.persist(&self.path).map_err(|e| e.error)?;
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use forkd_core::patch::{Blob, Body};

    fn new_file(path: &str, content: &[u8], mode: u32) -> FilePatch {
        FilePatch {
            path: path.into(),
            old: None,
            new: Some(Blob {
                id: patch::blob_id(content),
                mode,
            }),
            body: Body::Binary(content.to_vec()),
        }
    }

    #[test]
    fn nothing_is_planned_outside_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let dir = std::fs::canonicalize(dir.path()).unwrap();
        std::os::unix::fs::symlink("/tmp", dir.join("out")).unwrap();
        for name in ["../x", "/etc/x", "a/../../x", "out/x", ""] {
            assert!(
                plan(&dir, &new_file(name, b"x", 0o100_644)).is_err(),
                "{name}"
            );
        }
        for target in ["/etc/passwd", "../../x", "d/../../x"] {
            let link = new_file("link", target.as_bytes(), 0o120_000);
            let err = plan(&dir, &link).err().unwrap();
            assert!(err.contains("leads outside"), "{target}: {err}");
        }
        let inside = new_file("d/link", b"../a.txt", 0o120_000);
        let write = plan(&dir, &inside).unwrap();
        write.perform().unwrap();
        assert_eq!(
            std::fs::read_link(dir.join("d/link")).unwrap(),
            Path::new("../a.txt")
        );
    }
}
