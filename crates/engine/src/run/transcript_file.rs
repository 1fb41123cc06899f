//! An agent's transcript as hooks read it (`transcript_path`, docs/contracts.md "Hooks"): a
//! JSONL file in Claude Code's line format, in the hook's view (its sandbox's private
//! `TMPDIR`), written only for events that have hooks and appended to — each event adds the
//! messages stored since the last one — never rewritten.

use std::io::Write as _;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use forkd_core::{AgentId, AgentKind, Block, Message, SessionId};
use forkd_tools::ToolContext;
use serde_json::{Value, json};

use super::Runs;
use crate::error::{EngineError, Result};

/// Whose transcript it is.
pub(super) struct Owner<'a> {
    pub agent: AgentId,
    pub kind: AgentKind,
    pub session: SessionId,
    pub workspace: &'a str,
}

impl Runs {
    /// Brings `owner`'s transcript file up to date in `ctx`'s view; its path. Only the messages
    /// past the lines it holds are read from the store.
    pub(super) async fn transcript_file(
        &self,
        owner: &Owner<'_>,
        ctx: &ToolContext,
    ) -> Result<PathBuf> {
        let tmp = match &ctx.sandbox {
            Some(spec) => spec.paths.tmp.clone(),
            // A session whose commands run unconfined: its place under the sandboxes' root.
            None => crate::workspaces::session_tmp(&self.config, owner.session),
        };
        let name = format!("{}.jsonl", owner.agent);
        let path = tmp.join(DIR).join(&name);
        let (file, held) = blocking(move || {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&tmp)?;
            open_counted(&tmp, &name)
        })
        .await?;
        let lines: Vec<String> = self
            .transcript_messages(owner, held)
            .await?
            .iter()
            .enumerate()
            .map(|(i, (message, at_ms))| line(owner, held + i, message, *at_ms).to_string())
            .collect();
        if !lines.is_empty() {
            blocking(move || append(file, &lines)).await?;
        }
        Ok(path)
    }

    /// The agent's messages from the `from`th on, with when each was stored: a main loop's
    /// session transcript; a fork child's directive, then its own messages; a typed agent's own
    /// messages.
    async fn transcript_messages(
        &self,
        owner: &Owner<'_>,
        from: usize,
    ) -> Result<Vec<(Message, i64)>> {
        if owner.kind == AgentKind::Parent {
            let rest = self
                .store
                .session_messages_from(owner.session, from as u64, None)
                .await?;
            return Ok(rest
                .into_iter()
                .map(|m| (m.message, m.created_at_ms))
                .collect());
        }
        let own = self.store.agent_messages(owner.agent).await?;
        let mut out = Vec::with_capacity(own.len() + 1);
        if owner.kind == AgentKind::Fork
            && let Some(directive) = self.store.agent_directive_block(owner.agent).await?
        {
            let at = own.first().map_or(0, |m| m.created_at_ms);
            out.push((Message::user(vec![directive]), at));
        }
        out.extend(own.into_iter().map(|m| (m.message, m.created_at_ms)));
        Ok(out.into_iter().skip(from).collect())
    }
}

/// Runs file work on the blocking pool; its failure is the sandbox's (the hooks' view).
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| EngineError::Invariant(format!("the transcript's writer: {e}")))?
        .map_err(|e| EngineError::Sandbox(format!("cannot write the hook's transcript: {e}")))
}

/// One message as Claude Code's transcript writes it.
fn line(owner: &Owner<'_>, i: usize, message: &Message, at_ms: i64) -> Value {
    let uuid = |i: usize| format!("{}-{i}", owner.agent);
    let content: Vec<Value> = message
        .blocks
        .iter()
        .map(|b: &Block| serde_json::from_str(b.raw().as_str()).unwrap_or(Value::Null))
        .collect();
    let role = message.role.as_str();
    json!({
        "type": role,
        "uuid": uuid(i),
        "parentUuid": i.checked_sub(1).map(uuid),
        "sessionId": owner.session.to_string(),
        "agentId": owner.agent.to_string(),
        "isSidechain": owner.kind != AgentKind::Parent,
        "cwd": owner.workspace,
        "timestamp": chrono::DateTime::from_timestamp_millis(at_ms)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
        "message": { "role": role, "content": content },
    })
}

/// The most a transcript file may hold: a longer one is not forkd's (a sparse file can be of any
/// size) and is not read.
const MAX_FILE_BYTES: u64 = 1 << 30;

/// Opens (creating, private) `tmp`'s `forkd-transcripts/NAME` and counts the lines it holds.
/// The session's sandboxed commands can write in `tmp`, so nothing there is followed: the
/// folder and the file are opened beneath `tmp`'s descriptor without following a link, and a
/// file with other links, or larger than forkd writes, is refused — a command cannot point the
/// daemon's write elsewhere, nor make it read without end.
fn open_counted(tmp: &Path, name: &str) -> std::io::Result<(std::fs::File, usize)> {
    use rustix::fs::{CWD, Mode, OFlags, mkdirat, openat};
    use std::io::Read;
    let dir_flags = OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::RDONLY;
    let tmp = openat(CWD, tmp, dir_flags, Mode::empty())?;
    match mkdirat(&tmp, DIR, Mode::from_raw_mode(0o700)) {
        Ok(()) | Err(rustix::io::Errno::EXIST) => {}
        Err(e) => return Err(e.into()),
    }
    let dir = openat(&tmp, DIR, dir_flags, Mode::empty())?;
    let flags = OFlags::RDWR | OFlags::APPEND | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut file = std::fs::File::from(openat(&dir, name, flags, Mode::from_raw_mode(0o600))?);
    let meta = file.metadata()?;
    if !meta.is_file() || std::os::unix::fs::MetadataExt::nlink(&meta) != 1 {
        return Err(std::io::Error::other(
            "the transcript file is not a plain file of its own",
        ));
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(std::io::Error::other(
            "the transcript file is larger than forkd writes",
        ));
    }
    let mut held = 0;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = (&mut file).take(MAX_FILE_BYTES).read(&mut buf)?;
        if n == 0 {
            break;
        }
        held += buf[..n].iter().filter(|b| **b == b'\n').count();
    }
    Ok((file, held))
}

/// Appends `lines` (the file is opened to append).
fn append(mut file: std::fs::File, lines: &[String]) -> std::io::Result<()> {
    let mut text = String::new();
    for line in lines {
        text.push_str(line);
        text.push('\n');
    }
    file.write_all(text.as_bytes())
}

/// The folder of transcripts in a sandbox's `TMPDIR`.
const DIR: &str = "forkd-transcripts";

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// What the file holds after appending what it lacks of `lines`, as `transcript_file` does.
    fn bring_up_to_date(tmp: &Path, lines: &[String]) -> std::io::Result<()> {
        let (file, held) = open_counted(tmp, "a.jsonl")?;
        append(file, &lines[held.min(lines.len())..])
    }

    #[test]
    fn lines_are_appended_never_rewritten() {
        let tmp = tempfile::tempdir().unwrap();
        let lines: Vec<String> = (0..3).map(|i| format!("{{\"n\":{i}}}")).collect();
        bring_up_to_date(tmp.path(), &lines[..2]).unwrap();
        bring_up_to_date(tmp.path(), &lines).unwrap();
        bring_up_to_date(tmp.path(), &lines).unwrap();
        let text = std::fs::read_to_string(tmp.path().join(DIR).join("a.jsonl")).unwrap();
        assert_eq!(text, "{\"n\":0}\n{\"n\":1}\n{\"n\":2}\n");
    }

    #[test]
    fn links_a_command_left_are_not_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        // The folder a link elsewhere: refused, nothing written there.
        std::os::unix::fs::symlink(elsewhere.path(), tmp.path().join(DIR)).unwrap();
        assert!(open_counted(tmp.path(), "a.jsonl").is_err());
        assert!(!elsewhere.path().join("a.jsonl").exists());
        // The file a link, or a hard link, to a file elsewhere: refused, the file unchanged.
        std::fs::remove_file(tmp.path().join(DIR)).unwrap();
        std::fs::create_dir(tmp.path().join(DIR)).unwrap();
        let target = elsewhere.path().join("secret");
        std::fs::write(&target, "keep").unwrap();
        let file = tmp.path().join(DIR).join("a.jsonl");
        std::os::unix::fs::symlink(&target, &file).unwrap();
        assert!(open_counted(tmp.path(), "a.jsonl").is_err());
        std::fs::remove_file(&file).unwrap();
        std::fs::hard_link(&target, &file).unwrap();
        assert!(open_counted(tmp.path(), "a.jsonl").is_err());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
        // A file grown past what forkd writes (a sparse one, say) is not read.
        std::fs::remove_file(&file).unwrap();
        let big = std::fs::File::create(&file).unwrap();
        big.set_len(1 << 40).unwrap();
        assert!(open_counted(tmp.path(), "a.jsonl").is_err());
    }

    #[test]
    fn a_line_is_claude_codes_shape() {
        let owner = Owner {
            agent: AgentId::new(),
            kind: AgentKind::Fork,
            session: SessionId::new(),
            workspace: "/w",
        };
        let message = Message::user(vec![Block::text("hi")]);
        let first = line(&owner, 0, &message, 1_700_000_000_000);
        assert_eq!(first["type"], "user");
        assert_eq!(first["parentUuid"], Value::Null);
        assert_eq!(first["isSidechain"], true);
        assert_eq!(first["message"]["content"][0]["text"], "hi");
        assert_eq!(first["timestamp"], "2023-11-14T22:13:20.000Z");
        let second = line(&owner, 1, &message, 0);
        assert_eq!(second["parentUuid"], first["uuid"]);
    }
}
