//! Process groups as a later daemon finds them again: a Bash call's group is recorded by its id,
//! its leader's start time and the machine's boot id, all read from `/proc` (Linux); a daemon
//! resuming an agent whose call was cut off stops that group if it still runs — and only that
//! group, never one that has reused its id since.
//!
//! Why these three: a group's id is its leader's pid, and pids are reused. While the leader
//! exists (even as a zombie) its pid, and so the group's id, cannot name anything else; the
//! leader's start time (ticks since boot) tells it from a later process with the same pid, and
//! the boot id tells this boot from an earlier one (or another machine sharing the store), where
//! start times and pids mean nothing. A group whose leader is gone is left alone: its id may
//! already lead another group (a daemonizing process's, say), and nothing left in `/proc` tells
//! the two apart. The Bash tool's sentinel (see [`crate::bash`]) is what stops a group when its
//! daemon dies; stopping a leftover group here is the second line, for a sentinel that was killed.

use std::os::fd::OwnedFd;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use rustix::process::{Pid as RustixPid, PidfdFlags, WaitId, WaitIdOptions, pidfd_open, waitid};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::time::{Instant, sleep};

pub use forkd_core::store::ProcessGroup;

/// How often [`stop_leftover`] looks whether the killed group is gone.
const POLL: Duration = Duration::from_millis(10);

/// What [`stop_leftover`] found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leftover {
    /// Recorded in another boot or on another machine: nothing of it runs here.
    OtherBoot,
    /// Its leader is gone: the group ended (or lost its leader, and its id may name another
    /// group now); nothing was killed.
    NotRunning,
    /// The group's id is a process started at another time: the id was reused, nothing killed.
    Reused,
    /// The group was still alive; it was killed, and every process of it is gone.
    Stopped,
    /// The group was killed, but some of its processes were still there when the wait ended.
    StillAlive,
}

/// One line of `/proc/PID/stat`, the fields after the command name (which may hold spaces and
/// parentheses, so the line is split after its last `)`).
struct Stat {
    state: char,
    pgrp: i32,
    start_ticks: u64,
}

impl Stat {
    fn parse(line: &str) -> Option<Stat> {
        let (_, rest) = line.rsplit_once(')')?;
        // Fields 3 (state) onwards; field N is at index N - 3.
        let fields: Vec<&str> = rest.split_whitespace().collect();
        Some(Stat {
            state: fields.first()?.chars().next()?,
            pgrp: fields.get(5 - 3)?.parse().ok()?,
            start_ticks: fields.get(22 - 3)?.parse().ok()?,
        })
    }

    fn read(pid: i32) -> std::io::Result<Stat> {
        let line = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
        Stat::parse(&line).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("/proc/{pid}/stat does not parse: {line:?}"),
            )
        })
    }

    /// Whether the process can still run: not a zombie waiting to be reaped, not dead.
    fn live(&self) -> bool {
        !matches!(self.state, 'Z' | 'X' | 'x')
    }
}

/// This boot's id (a random UUID the kernel picks at boot).
pub fn boot_id() -> std::io::Result<String> {
    Ok(std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?
        .trim()
        .to_owned())
}

/// The process group that `leader` leads (a process started with `process_group(0)`), as a
/// later daemon will need it. Read while `leader` is this process's unreaped child, so its pid
/// still names it.
pub fn group_of(leader: u32) -> std::io::Result<ProcessGroup> {
    let pid = i32::try_from(leader).map_err(std::io::Error::other)?;
    let stat = Stat::read(pid)?;
    Ok(ProcessGroup {
        pgid: pid,
        start_ticks: stat.start_ticks,
        boot_id: boot_id()?,
    })
}

/// The processes of group `pgid` that can still run (zombies are done), by pid.
pub fn live_members(pgid: i32) -> std::io::Result<Vec<i32>> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc")? {
        let Some(pid) = entry?
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<i32>().ok())
        else {
            continue;
        };
        // A process may end between the listing and the read: then it is not a member.
        if let Ok(stat) = Stat::read(pid)
            && stat.pgrp == pgid
            && stat.live()
        {
            pids.push(pid);
        }
    }
    Ok(pids)
}

/// Stops what is left of a recorded group: if its leader still exists on this machine (same
/// boot id, same start time), the whole group is killed (SIGKILL) and this waits, at most
/// `within`, until none of its processes can run any more. A group recorded in another boot,
/// whose leader is gone, or whose id now names another process is left alone.
///
/// An error is a failure to look (no `/proc`) or to kill (another user's processes).
pub async fn stop_leftover(group: &ProcessGroup, within: Duration) -> std::io::Result<Leftover> {
    if boot_id()? != group.boot_id {
        return Ok(Leftover::OtherBoot);
    }
    let leader = match Stat::read(group.pgid) {
        Ok(stat) => stat,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Leftover::NotRunning);
        }
        Err(err) => return Err(err),
    };
    if leader.start_ticks != group.start_ticks {
        return Ok(Leftover::Reused);
    }
    // The leader (alive, or a zombie not yet reaped) still holds the id: the group is ours.
    match killpg(Pid::from_raw(group.pgid), Signal::SIGKILL) {
        Ok(()) | Err(Errno::ESRCH) => {}
        Err(err) => return Err(err.into()),
    }
    let deadline = Instant::now() + within;
    loop {
        if live_members(group.pgid)?.is_empty() {
            return Ok(Leftover::Stopped);
        }
        if Instant::now() >= deadline {
            return Ok(Leftover::StillAlive);
        }
        sleep(POLL).await;
    }
}

/// A process group's leader (a child of this process), whose exit is awaited without reaping
/// it. Until it is reaped, its pid, and so the group's id, names nothing else: a group killed by
/// id after [`Leader::exited`] and before [`Leader::reap`] is this group, never a later one that
/// reused the id (which a group killed after its leader was reaped could be).
pub struct Leader {
    child: tokio::process::Child,
    /// Readable once the leader has exited (Linux 5.3 and later), opened when first awaited;
    /// without one, exits are polled.
    pidfd: Option<AsyncFd<OwnedFd>>,
    /// Whether the pidfd was tried (so a kernel without pidfds is asked once).
    tried: bool,
}

impl Leader {
    pub fn new(child: tokio::process::Child) -> Leader {
        Leader {
            child,
            pidfd: None,
            tried: false,
        }
    }

    /// The leader's pid (the group's id), while it is unreaped.
    pub fn id(&self) -> Option<u32> {
        self.child.id()
    }

    fn pid(&self) -> std::io::Result<RustixPid> {
        self.child
            .id()
            .and_then(|pid| RustixPid::from_raw(i32::try_from(pid).ok()?))
            .ok_or_else(|| std::io::Error::other("the leader was already reaped"))
    }

    /// Returns once the leader has exited, leaving it a zombie: its group can still be killed
    /// by id. Within a tokio runtime.
    pub async fn exited(&mut self) -> std::io::Result<()> {
        let pid = self.pid()?;
        if !self.tried {
            self.tried = true;
            self.pidfd = watch(pid);
        }
        if let Some(pidfd) = &self.pidfd {
            // A pidfd is readable once its process has exited, and stays so.
            let _ready = pidfd.readable().await?;
            return Ok(());
        }
        loop {
            let options = WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT;
            if waitid(WaitId::Pid(pid), options)?.is_some() {
                return Ok(());
            }
            sleep(POLL).await;
        }
    }

    /// Reaps the leader (once its group has been killed) and returns how it ended.
    pub async fn reap(&mut self) -> std::io::Result<std::process::ExitStatus> {
        self.child.wait().await
    }
}

/// Makes `cmd`'s process keep `fd` open, under its own number, across its exec (its
/// close-on-exec flag cleared between fork and exec, first: closures registered after it, the
/// sandbox's, run after, so a process they fork inherits it too). No other descriptor is
/// touched: the sandbox's set-up still holds its own.
#[allow(
    unsafe_code,
    reason = "passing a descriptor to a child takes fcntl between fork and exec"
)]
pub(crate) fn keep_descriptor(cmd: &mut std::process::Command, fd: std::os::fd::RawFd) {
    use std::os::unix::process::CommandExt;
    // SAFETY: fcntl is async-signal-safe and allocates nothing; `fd` is held by the caller
    // until the spawn returns, so it names the same open file in the child.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(fd, libc::F_SETFD, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// A pidfd for `pid`, registered with the runtime; `None` where the kernel has none.
#[allow(
    unsafe_code,
    reason = "tokio's only undeprecated way to watch a descriptor"
)]
fn watch(pid: RustixPid) -> Option<AsyncFd<OwnedFd>> {
    let fd = pidfd_open(pid, PidfdFlags::empty()).ok()?;
    // SAFETY: an `OwnedFd` stays open until dropped, which only the `AsyncFd` does, and
    // always names the same descriptor.
    unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }.ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;
    use std::process::{Child, Command, Stdio};

    #[test]
    fn stat_lines_parse_past_odd_command_names() {
        let line = "4242 (a) b (c)) S 1 4240 4240 0 -1 4194560 90 0 0 0 0 0 0 0 20 0 1 0 \
                    987654 1000 100 18446744073709551615";
        let stat = Stat::parse(line).unwrap();
        assert_eq!(stat.state, 'S');
        assert_eq!(stat.pgrp, 4240);
        assert_eq!(stat.start_ticks, 987_654);
        assert!(stat.live());
        assert!(Stat::parse("4242 (sh) Z 1").is_none());
    }

    #[test]
    fn this_process_reads_as_itself() {
        let me = group_of(std::process::id()).unwrap();
        assert_eq!(me.pgid, i32::try_from(std::process::id()).unwrap());
        assert_eq!(me.boot_id, boot_id().unwrap());
        assert_eq!(me.boot_id.len(), 36, "{}", me.boot_id);
        assert_eq!(group_of(std::process::id()).unwrap(), me);
    }

    /// A group led by `sh`, with a background sleeper: `(leader, sleeper)`.
    fn group() -> (Child, i32) {
        let mut leader = Command::new("sh")
            .args(["-c", "sleep 100 & echo $!; exec sleep 100"])
            .stdout(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(leader.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        (leader, line.trim().parse().unwrap())
    }

    fn pid(child: &Child) -> i32 {
        i32::try_from(child.id()).unwrap()
    }

    #[tokio::test]
    async fn a_live_group_whose_leader_matches_is_killed_whole() {
        let (mut leader, sleeper) = group();
        let recorded = group_of(leader.id()).unwrap();
        let mut members = live_members(recorded.pgid).unwrap();
        members.sort_unstable();
        let mut expected = vec![pid(&leader), sleeper];
        expected.sort_unstable();
        assert_eq!(members, expected);

        let stopped = stop_leftover(&recorded, Duration::from_secs(10)).await;
        assert_eq!(stopped.unwrap(), Leftover::Stopped);
        assert!(live_members(recorded.pgid).unwrap().is_empty());
        // The leader is this test's child: a zombie until reaped, killed by SIGKILL.
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(leader.wait().unwrap().signal(), Some(9));
        // Once the group is gone, asking again finds nothing to do.
        let again = stop_leftover(&recorded, Duration::from_secs(1)).await;
        assert_eq!(again.unwrap(), Leftover::NotRunning);
    }

    #[tokio::test]
    async fn a_reused_id_or_another_boot_is_left_alone() {
        let (mut leader, sleeper) = group();
        let actual = group_of(leader.id()).unwrap();
        // The same pid, started at another time: the recorded leader's pid was reused.
        let reused = ProcessGroup {
            start_ticks: actual.start_ticks - 1,
            ..actual.clone()
        };
        let found = stop_leftover(&reused, Duration::from_secs(1)).await;
        assert_eq!(found.unwrap(), Leftover::Reused);
        // The same pid and start time, recorded in another boot.
        let other_boot = ProcessGroup {
            boot_id: "00000000-0000-0000-0000-000000000000".into(),
            ..actual.clone()
        };
        let found = stop_leftover(&other_boot, Duration::from_secs(1)).await;
        assert_eq!(found.unwrap(), Leftover::OtherBoot);
        // Both left every process running.
        let mut members = live_members(actual.pgid).unwrap();
        members.sort_unstable();
        let mut expected = vec![pid(&leader), sleeper];
        expected.sort_unstable();
        assert_eq!(members, expected);

        let stopped = stop_leftover(&actual, Duration::from_secs(10)).await;
        assert_eq!(stopped.unwrap(), Leftover::Stopped);
        leader.wait().unwrap();
    }

    /// A group whose leader exits and leaves a sleeper behind: `(leader, sleeper)`.
    async fn exiting_group() -> (tokio::process::Child, i32) {
        use tokio::io::AsyncBufReadExt;
        let mut leader = tokio::process::Command::new("sh")
            .args(["-c", "sleep 100 & echo $!; read -r _; exit 3"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut line = String::new();
        tokio::io::BufReader::new(leader.stdout.take().unwrap())
            .read_line(&mut line)
            .await
            .unwrap();
        (leader, line.trim().parse().unwrap())
    }

    /// `exited` returns with the leader still holding the group's id (a zombie), so killing the
    /// group by id then reaches what it left behind and nothing else; `reap` gives its status.
    async fn the_exit_is_seen_before_the_leader_is_reaped(pidfd: bool) {
        let (mut child, sleeper) = exiting_group().await;
        let pgid = i32::try_from(child.id().unwrap()).unwrap();
        drop(child.stdin.take());
        let mut leader = Leader::new(child);
        // Without a pidfd, as on a kernel before 5.3.
        leader.tried = !pidfd;
        tokio::time::timeout(Duration::from_secs(10), leader.exited())
            .await
            .expect("the exit was never seen")
            .unwrap();
        assert_eq!(
            leader.pidfd.is_some(),
            pidfd,
            "a pidfd on Linux 5.3 or later"
        );
        assert_eq!(Stat::read(pgid).unwrap().state, 'Z', "reaped too early");
        assert_eq!(live_members(pgid).unwrap(), vec![sleeper]);

        killpg(Pid::from_raw(pgid), Signal::SIGKILL).unwrap();
        assert_eq!(leader.reap().await.unwrap().code(), Some(3));
        let deadline = Instant::now() + Duration::from_secs(10);
        while !live_members(pgid).unwrap().is_empty() {
            assert!(Instant::now() < deadline, "the sleeper survived");
            sleep(POLL).await;
        }
    }

    #[tokio::test]
    async fn a_leader_s_exit_is_seen_on_its_pidfd_without_reaping_it() {
        the_exit_is_seen_before_the_leader_is_reaped(true).await;
    }

    #[tokio::test]
    async fn a_leader_s_exit_is_polled_without_reaping_it_where_pidfds_are_missing() {
        the_exit_is_seen_before_the_leader_is_reaped(false).await;
    }
}
