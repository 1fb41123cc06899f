//! Caps per session through cgroups, where the daemon may make them: every sandboxed command
//! of a session (and its MCP servers) joins the session's group, so the session's processes,
//! memory and CPU are capped together, whoever in it forks.
//!
//! Two kinds of hierarchy serve:
//!
//! - **cgroup v2, delegated**: the daemon's own cgroup has the `pids` controller in its
//!   `cgroup.subtree_control` (or takes it there): systemd's `Delegate=yes` with the daemon in a
//!   subgroup, a container's own cgroup. A session's group gets `pids.max`, and `memory.max` and
//!   `cpu.max` where those controllers are enabled and configured.
//! - **cgroup v1 `pids`**, where the daemon may make groups in it (a root daemon): `pids.max`
//!   only. This is what caps a root daemon's commands, which the kernel exempts from
//!   `RLIMIT_NPROC`.
//!
//! Elsewhere there is no cgroup layer, and `RLIMIT_NPROC` is the process cap ([`super::limits`]).
//! The hierarchy is found once per daemon. A group is `forkd-PID-SESSION` beneath the daemon's
//! own cgroup; it lives while a command of the session runs, and the groups of daemons that are
//! gone are removed when the next one finds the hierarchy.

use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use super::{ResourceLimits, SandboxError};

/// The period of `cpu.max`, in microseconds (the kernel's default).
const CPU_PERIOD_US: u64 = 100_000;

/// How often, and how long, an emptied group is tried again while its last processes are
/// reaped.
const RETRY_EVERY: std::time::Duration = std::time::Duration::from_millis(50);
const RETRIES: u32 = 40;

/// Which kind of hierarchy the groups are made in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// cgroup v2, delegated to the daemon.
    V2,
    /// cgroup v1's `pids` hierarchy.
    V1Pids,
}

/// Where this daemon makes its sessions' groups.
#[derive(Debug)]
pub struct Hierarchy {
    version: Version,
    /// The daemon's own cgroup: the groups are made beneath it.
    base: PathBuf,
    /// The v2 controllers enabled for the groups (`pids` always).
    memory: bool,
    cpu: bool,
    /// Sessions' groups with commands in them now, and how many.
    live: Mutex<HashMap<String, usize>>,
}

static HIERARCHY: OnceLock<Result<Arc<Hierarchy>, String>> = OnceLock::new();

/// The hierarchy this daemon makes groups in, or why there is none; found on the first call.
pub fn hierarchy() -> Result<Arc<Hierarchy>, &'static str> {
    HIERARCHY
        .get_or_init(|| {
            let found = find(
                &std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default(),
                &std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default(),
            );
            if let Ok(h) = &found {
                h.sweep();
            }
            found.map(Arc::new)
        })
        .as_ref()
        .map(Arc::clone)
        .map_err(String::as_str)
}

/// The layer's part of the daemon's start line: `cgroup v1 pids (pids.max 4096 per session)`,
/// or `no cgroup (why)`.
pub fn describe(limits: &ResourceLimits) -> String {
    match hierarchy() {
        Ok(h) => h.describe(limits),
        Err(why) => format!("no cgroup ({why})"),
    }
}

/// Finds the hierarchy from `/proc/self/cgroup` and `/proc/self/mountinfo`: a delegated cgroup
/// v2 first, then a writable v1 `pids` hierarchy.
fn find(cgroups: &str, mountinfo: &str) -> Result<Hierarchy, String> {
    let mounts: Vec<Mount> = mountinfo.lines().filter_map(Mount::parse).collect();
    let mut why = Vec::new();
    if let Some(dir) = own_dir(cgroups, &mounts, |c| c.is_empty(), "cgroup2") {
        match Hierarchy::delegated(dir) {
            Ok(h) => return Ok(h),
            Err(e) => why.push(format!("cgroup v2: {e}")),
        }
    } else {
        why.push("no cgroup v2 mounted".to_owned());
    }
    if let Some(dir) = own_dir(
        cgroups,
        &mounts,
        |c| c.split(',').any(|c| c == "pids"),
        "cgroup",
    ) {
        match Hierarchy::v1_pids(dir) {
            Ok(h) => return Ok(h),
            Err(e) => why.push(format!("cgroup v1 pids: {e}")),
        }
    }
    Err(why.join("; "))
}

/// One line of `/proc/self/mountinfo`, as far as a cgroup mount needs it.
struct Mount<'a> {
    /// The mount's root within its filesystem (a cgroup namespace's root shows as `/`).
    root: &'a str,
    point: &'a str,
    fstype: &'a str,
    /// The super options: a v1 cgroup mount's controllers.
    options: &'a str,
}

impl<'a> Mount<'a> {
    fn parse(line: &'a str) -> Option<Mount<'a>> {
        let (head, tail) = line.split_once(" - ")?;
        let head: Vec<&str> = head.split(' ').collect();
        let mut tail = tail.split(' ');
        let fstype = tail.next()?;
        let _source = tail.next()?;
        Some(Mount {
            root: head.get(3)?,
            point: head.get(4)?,
            fstype,
            options: tail.next().unwrap_or(""),
        })
    }
}

/// The daemon's own cgroup directory in the hierarchy whose `/proc/self/cgroup` line has
/// controllers matching `controllers`, mounted with `fstype`.
fn own_dir(
    cgroups: &str,
    mounts: &[Mount<'_>],
    controllers: impl Fn(&str) -> bool,
    fstype: &str,
) -> Option<PathBuf> {
    let path = cgroups.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_id, list, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers(list).then_some(path)
    })?;
    let mount = mounts.iter().find(|m| {
        m.fstype == fstype
            && (fstype == "cgroup2" || m.options.split(',').any(|o| o == "pids"))
            && Path::new(path).starts_with(m.root)
    })?;
    let below = Path::new(path).strip_prefix(mount.root).ok()?;
    Some(Path::new(&unescape(mount.point)).join(below))
}

/// A mount point as `mountinfo` writes it: space, tab, newline and backslash as octal escapes.
fn unescape(field: &str) -> String {
    field
        .replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

impl Hierarchy {
    /// A cgroup v2 directory the daemon may make groups in with `pids` (and `memory`, `cpu`
    /// where offered) enabled for them.
    fn delegated(base: PathBuf) -> Result<Hierarchy, String> {
        let offered = std::fs::read_to_string(base.join("cgroup.controllers"))
            .map_err(|e| format!("{}: {e}", base.display()))?;
        let offered: Vec<&str> = offered.split_whitespace().collect();
        if !offered.contains(&"pids") {
            return Err(format!(
                "{} is not delegated to the daemon (its controllers: {})",
                base.display(),
                if offered.is_empty() {
                    "none".to_owned()
                } else {
                    offered.join(" ")
                }
            ));
        }
        let control = base.join("cgroup.subtree_control");
        let enabled = |name: &str| {
            std::fs::read_to_string(&control).is_ok_and(|s| s.split_whitespace().any(|c| c == name))
        };
        for name in ["pids", "memory", "cpu"] {
            if offered.contains(&name) && !enabled(name) {
                // Refused while the daemon's cgroup holds processes itself (the daemon): the
                // operator delegates a cgroup whose subtree the daemon may use.
                let _ = std::fs::write(&control, format!("+{name}"));
            }
        }
        if !enabled("pids") {
            return Err(format!(
                "the pids controller is not enabled in {} (start forkd in a subgroup of a \
                 delegated cgroup)",
                control.display()
            ));
        }
        let hierarchy = Hierarchy {
            version: Version::V2,
            memory: enabled("memory"),
            cpu: enabled("cpu"),
            base,
            live: Mutex::default(),
        };
        hierarchy.writable()?;
        Ok(hierarchy)
    }

    /// The daemon's own cgroup in v1's `pids` hierarchy, where it may make groups.
    fn v1_pids(base: PathBuf) -> Result<Hierarchy, String> {
        let hierarchy = Hierarchy {
            version: Version::V1Pids,
            base,
            memory: false,
            cpu: false,
            live: Mutex::default(),
        };
        hierarchy.writable()?;
        Ok(hierarchy)
    }

    /// Checks that groups can be made here.
    fn writable(&self) -> Result<(), String> {
        let probe = self
            .base
            .join(format!("forkd-{}-probe", std::process::id()));
        std::fs::create_dir(&probe)
            .and_then(|()| std::fs::remove_dir(&probe))
            .map_err(|e| format!("cannot make a group in {}: {e}", self.base.display()))
    }

    /// Removes the groups of daemons that are gone (a crash leaves them behind).
    fn sweep(&self) {
        let Ok(entries) = std::fs::read_dir(&self.base) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(pid) = name
                .to_str()
                .and_then(|n| n.strip_prefix("forkd-"))
                .and_then(|rest| rest.split('-').next())
                .and_then(|pid| pid.parse::<i32>().ok())
            else {
                continue;
            };
            let alive = pid == std::process::id() as i32
                || nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok();
            if !alive {
                // One still holding processes stays: rmdir refuses it.
                let _ = std::fs::remove_dir(entry.path());
            }
        }
    }

    /// This layer's part of the start line.
    pub fn describe(&self, limits: &ResourceLimits) -> String {
        let mut caps = vec![format!(
            "pids.max {}",
            limits
                .session_processes
                .map_or("max".to_owned(), |n| n.to_string())
        )];
        if self.memory
            && let Some(bytes) = limits.session_memory
        {
            caps.push(format!("memory.max {bytes}"));
        }
        if self.cpu
            && let Some(percent) = limits.session_cpu_percent
        {
            caps.push(format!("cpu.max {percent}%"));
        }
        let version = match self.version {
            Version::V2 => "cgroup v2",
            Version::V1Pids => "cgroup v1 pids",
        };
        format!("{version} ({} per session)", caps.join(", "))
    }

    /// Makes (or finds) the group of `session` with `limits`, and counts one more command in
    /// it until the returned membership drops.
    pub(crate) fn join(
        self: &Arc<Self>,
        session: &str,
        limits: &ResourceLimits,
    ) -> Result<Membership, SandboxError> {
        let fail = |what: &str, path: &Path, e: io::Error| {
            SandboxError::Prepare(format!(
                "the session's cgroup: cannot {what} {}: {e}",
                path.display()
            ))
        };
        let name = format!("forkd-{}-{session}", std::process::id());
        let dir = self.base.join(&name);
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        let count = live.entry(name.clone()).or_insert(0);
        if *count == 0 {
            match std::fs::create_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(fail("make", &dir, e)),
            }
            for (file, value) in self.settings(limits) {
                let path = dir.join(file);
                if let Err(e) = std::fs::write(&path, value) {
                    // Not left half set up: the next command makes it again.
                    let _ = std::fs::remove_dir(&dir);
                    live.remove(&name);
                    return Err(fail("write", &path, e));
                }
            }
        }
        *count += 1;
        let procs = dir.join("cgroup.procs");
        Ok(Membership {
            procs: CString::new(procs.as_os_str().as_bytes())
                .map_err(|_| SandboxError::Prepare("a cgroup path holds a NUL byte".into()))?,
            hierarchy: Arc::clone(self),
            name,
        })
    }

    /// Where this daemon's group of `session` is (while a command of it runs).
    pub fn group_dir(&self, session: &str) -> PathBuf {
        self.base
            .join(format!("forkd-{}-{session}", std::process::id()))
    }

    /// The files a session's group is set up with, and their contents.
    fn settings(&self, limits: &ResourceLimits) -> Vec<(&'static str, String)> {
        let max = |v: Option<u64>| v.map_or("max".to_owned(), |n| n.to_string());
        let mut files = vec![("pids.max", max(limits.session_processes))];
        if self.memory {
            files.push(("memory.max", max(limits.session_memory)));
            if limits.session_memory.is_some() {
                // Capped memory is not to be paged out instead: the cap ends the hog.
                files.push(("memory.swap.max", "0".to_owned()));
            }
        }
        if self.cpu {
            let quota = limits
                .session_cpu_percent
                .map_or("max".to_owned(), |p| (p * CPU_PERIOD_US / 100).to_string());
            files.push(("cpu.max", format!("{quota} {CPU_PERIOD_US}")));
        }
        files
    }

    fn leave(self: &Arc<Self>, name: &str) {
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        let Some(count) = live.get_mut(name) else {
            return;
        };
        *count -= 1;
        if *count > 0 {
            return;
        }
        live.remove(name);
        // Its commands are gone: their namespaces ended with their init. A process the kernel
        // is still reaping keeps the group a moment; it is removed once empty, unless another
        // command of the session has come in meanwhile.
        if self.remove(&live, name) {
            return;
        }
        drop(live);
        let hierarchy = Arc::clone(self);
        let name = name.to_owned();
        std::thread::spawn(move || {
            for _ in 0..RETRIES {
                std::thread::sleep(RETRY_EVERY);
                let live = hierarchy.live.lock().unwrap_or_else(|p| p.into_inner());
                if hierarchy.remove(&live, &name) {
                    return;
                }
            }
            tracing::debug!(
                group = name,
                "A session's cgroup stays; the next daemon removes it"
            );
        });
    }

    /// Removes the group `name` unless a command is in it; true when it is gone (or came back
    /// into use).
    fn remove(&self, live: &HashMap<String, usize>, name: &str) -> bool {
        if live.contains_key(name) {
            return true;
        }
        match std::fs::remove_dir(self.base.join(name)) {
            Ok(()) => true,
            Err(e) => e.kind() == io::ErrorKind::NotFound,
        }
    }
}

/// One command's place in its session's group: the command's process joins it before it
/// enters the rest of the sandbox. Held until the command has ended.
#[derive(Debug)]
pub struct Membership {
    procs: CString,
    hierarchy: Arc<Hierarchy>,
    name: String,
}

impl Membership {
    /// The group's `cgroup.procs`: the process writes `0` there to join.
    pub(crate) fn procs(&self) -> &CString {
        &self.procs
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        self.hierarchy.leave(&self.name);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const MOUNTINFO: &str = "\
24 30 0:22 / /sys/fs/cgroup rw,nosuid - tmpfs tmpfs rw,mode=755
31 24 0:27 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
32 24 0:28 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
33 24 0:29 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn the_daemon_s_own_groups_are_found_in_mountinfo() {
        let mounts: Vec<Mount<'_>> = MOUNTINFO.lines().filter_map(Mount::parse).collect();
        let cgroups = "8:pids:/ci/job\n4:memory:/other\n0::/system.slice/forkd.service/daemon\n";
        assert_eq!(
            own_dir(cgroups, &mounts, |c| c.is_empty(), "cgroup2"),
            Some(PathBuf::from(
                "/sys/fs/cgroup/unified/system.slice/forkd.service/daemon"
            ))
        );
        assert_eq!(
            own_dir(
                cgroups,
                &mounts,
                |c| c.split(',').any(|c| c == "pids"),
                "cgroup"
            ),
            Some(PathBuf::from("/sys/fs/cgroup/pids/ci/job"))
        );
        // A cgroup namespace's mount shows its root as `/`; a bind of a subtree, as its path.
        let bound = "40 24 0:29 /system.slice /mnt/cg rw - cgroup2 cgroup2 rw\n";
        let mounts: Vec<Mount<'_>> = bound.lines().filter_map(Mount::parse).collect();
        assert_eq!(
            own_dir("0::/system.slice/x\n", &mounts, |c| c.is_empty(), "cgroup2"),
            Some(PathBuf::from("/mnt/cg/x"))
        );
        assert_eq!(
            own_dir("0::/elsewhere\n", &mounts, |c| c.is_empty(), "cgroup2"),
            None
        );
    }

    /// The v2 branch, on a directory laid out as a delegated cgroup: these machines mount only
    /// cgroup v1's controllers, so the kernel's side is not exercised here.
    #[test]
    fn a_delegated_v2_group_gets_pids_memory_and_cpu_caps() {
        let base = tempfile::tempdir().unwrap();
        std::fs::write(base.path().join("cgroup.controllers"), "cpu memory pids\n").unwrap();
        std::fs::write(
            base.path().join("cgroup.subtree_control"),
            "cpu memory pids\n",
        )
        .unwrap();
        let hierarchy = Arc::new(Hierarchy::delegated(base.path().to_owned()).unwrap());
        let limits = ResourceLimits {
            session_processes: Some(512),
            session_memory: Some(1 << 30),
            session_cpu_percent: Some(150),
            ..ResourceLimits::default()
        };
        assert_eq!(
            hierarchy.describe(&limits),
            "cgroup v2 (pids.max 512, memory.max 1073741824, cpu.max 150% per session)"
        );
        let first = hierarchy.join("s1", &limits).unwrap();
        let dir = base.path().join(format!("forkd-{}-s1", std::process::id()));
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap();
        assert_eq!(read("pids.max"), "512");
        assert_eq!(read("memory.max"), "1073741824");
        assert_eq!(read("memory.swap.max"), "0");
        assert_eq!(read("cpu.max"), "150000 100000");
        assert_eq!(
            first.procs().to_str().unwrap(),
            dir.join("cgroup.procs").to_str().unwrap()
        );
        // A second command shares the group; it goes when the last one leaves (here the
        // settings files keep the stand-in directory from going, as processes would).
        let second = hierarchy.join("s1", &limits).unwrap();
        drop(first);
        assert_eq!(hierarchy.live.lock().unwrap().len(), 1);
        drop(second);
        assert!(hierarchy.live.lock().unwrap().is_empty());
    }

    #[test]
    fn an_undelegated_v2_cgroup_says_why() {
        let base = tempfile::tempdir().unwrap();
        std::fs::write(base.path().join("cgroup.controllers"), "").unwrap();
        let err = Hierarchy::delegated(base.path().to_owned()).unwrap_err();
        assert!(err.contains("not delegated"), "{err}");
        assert!(err.contains("none"), "{err}");
    }
}
