//! Resource limits of one sandboxed command (or MCP server): set with `setrlimit` by the
//! command's own process before it execs, so that everything it starts inherits them.
//!
//! `RLIMIT_NPROC` counts the processes (threads included) of the daemon's user in the command's
//! own user namespace (Linux ≥ 5.14), so a fork bomb meets its cap without touching the
//! daemon's. `oom_score_adj = 1000` makes the kernel's OOM killer pick the command first, never
//! the daemon.

use std::io;

/// The limits; `None` leaves a limit as the daemon has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResourceLimits {
    /// `RLIMIT_NPROC`: processes and threads at once.
    pub processes: Option<u64>,
    /// `RLIMIT_NOFILE`: open files per process.
    pub open_files: Option<u64>,
    /// `RLIMIT_FSIZE`: the largest file a process may write, in bytes.
    pub file_size: Option<u64>,
    /// `RLIMIT_CPU`: CPU seconds per process. Bash commands only: MCP servers live long.
    pub cpu_seconds: Option<u64>,
    /// `RLIMIT_AS`: address space per process, in bytes. Off by default: compilers and node
    /// reserve far more than they use.
    pub address_space: Option<u64>,
    /// A session's processes and threads at once, all its commands and MCP servers together
    /// (`pids.max` of its cgroup, where the daemon may make one: see [`super::cgroup`]).
    pub session_processes: Option<u64>,
    /// A session's memory, in bytes (`memory.max` of a cgroup v2 group; off by default).
    pub session_memory: Option<u64>,
    /// A session's CPU time, in percent of one CPU (`cpu.max` of a cgroup v2 group; off by
    /// default).
    pub session_cpu_percent: Option<u64>,
}

impl Default for ResourceLimits {
    /// The documented defaults (docs/contracts.md, "Sandbox").
    fn default() -> Self {
        Self {
            processes: Some(1024),
            open_files: Some(8192),
            file_size: Some(16 << 30),
            cpu_seconds: Some(3600),
            address_space: None,
            session_processes: Some(4096),
            session_memory: None,
            session_cpu_percent: None,
        }
    }
}

impl ResourceLimits {
    /// The same limits for a long-lived process: no CPU limit.
    pub fn for_server(self) -> Self {
        Self {
            cpu_seconds: None,
            ..self
        }
    }

    /// A line for the daemon's start message, such as `nproc 1024, nofile 8192, …`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        let mut add = |name: &str, value: Option<u64>| {
            if let Some(v) = value {
                parts.push(format!("{name} {v}"));
            }
        };
        add("nproc", self.processes);
        add("nofile", self.open_files);
        add("fsize", self.file_size);
        add("cpu", self.cpu_seconds);
        add("as", self.address_space);
        parts.push("core 0".to_owned());
        parts.join(", ")
    }

    /// Sets the limits on the calling process. Runs between fork and exec: system calls only.
    ///
    /// # Safety
    /// Only system calls; safe to call in a forked child.
    pub(crate) unsafe fn apply(&self) -> io::Result<()> {
        let set = |resource, value: u64| {
            let limit = libc::rlimit {
                rlim_cur: value,
                rlim_max: value,
            };
            // SAFETY: setrlimit reads the struct, which lives for the call.
            if unsafe { libc::setrlimit(resource, &limit) } == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        };
        set(libc::RLIMIT_CORE, 0)?;
        // A hard limit can only be lowered: one the daemon already has lower stays.
        let lower = |resource, value: u64| {
            let mut current = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: getrlimit writes the struct, which lives for the call.
            if unsafe { libc::getrlimit(resource, &mut current) } != 0 {
                return Err(io::Error::last_os_error());
            }
            set(resource, value.min(current.rlim_max))
        };
        for (resource, value) in [
            (libc::RLIMIT_NPROC, self.processes),
            (libc::RLIMIT_NOFILE, self.open_files),
            (libc::RLIMIT_FSIZE, self.file_size),
            (libc::RLIMIT_CPU, self.cpu_seconds),
            (libc::RLIMIT_AS, self.address_space),
        ] {
            if let Some(value) = value {
                lower(resource, value)?;
            }
        }
        Ok(())
    }
}
