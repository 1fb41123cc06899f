//! The sandbox of `Bash` commands (docs/contracts.md, "Sandbox").
//!
//! A sandboxed command's process enters the sandbox itself, between fork and exec, so the shell
//! and everything it starts — background processes included — inherit it; nothing parses the
//! command. What it does there was all prepared in the daemon beforehand (the view's
//! namespaces, the Landlock ruleset, the filters), so the forked child only makes system calls:
//!
//! 1. **Namespaces.** The command enters its *view* ([`held`]): a user namespace (mapping the
//!    daemon's own uid and gid to themselves), a mount namespace and, unless the session allows
//!    the network, a network namespace — which has no interface but a loopback that is down, so
//!    no connection of any kind leaves it (TCP, UDP, 127.0.0.1 included). A view is made once,
//!    by a holder process, for every command that sees the same thing; each command then makes
//!    its own mount namespace (for its `/proc`) and PID namespace.
//! 2. **Hiding.** In the view's mount namespace, the daemon user's home is covered by one
//!    tmpfs with a read-only allow list bound back in ([`home`]). What else the command must
//!    not read is covered too: an empty read-only tmpfs over each hidden directory, `/dev/null`
//!    over each hidden file. Hidden are the daemon's home (`FORKD_HOME`: its database, socket,
//!    tokens), the other sessions' workspaces, other users' homes and the deny list (`~/.ssh`,
//!    `~/.aws`, …). A hidden directory that holds the command's own workspace or temporary
//!    directory is covered by one tmpfs into which what is kept is bound back ([`covers`]).
//!    Each cover is mounted on a descriptor opened without following symlinks and checked
//!    against the path's identity when the view was planned, never by path. Everything else
//!    reads as before (toolchains, system directories), so `cargo` and `python3` work where
//!    they are installed. Paths hidden through `/proc/self/root` stay hidden: it is the same
//!    mount namespace.
//! 3. **Processes.** The command runs under a small init of forkd's, pid 1 of its namespace, with
//!    a fresh `/proc` ([`init`]): it sees and signals only its own processes, and none outlives
//!    it.
//! 4. **Limits.** `setrlimit` (processes, open files, file size, CPU time, no core files) and
//!    `oom_score_adj = 1000` ([`limits`]).
//! 5. **Landlock.** `PR_SET_NO_NEW_PRIVS`, then the ruleset: writes (create, remove, rename,
//!    truncate, write) only beneath the workspace (`workspace-write`) and the private temporary
//!    directory, and to `/dev/null`-like devices. A path is judged where it resolves, so a
//!    symlink planted in the workspace does not lead a write out of it. Where the kernel's ABI
//!    has them (≥ 6), its scopes: no signal to a process outside the domain (the daemon
//!    included), no connection to an abstract Unix socket made outside it. A Landlock domain also
//!    cannot change the mount table (the covers stay on) nor trace or read the memory and
//!    environment of processes outside it (the daemon's API keys stay its own).
//! 6. **seccomp.** The system calls a command has no business making ([`seccomp`]): sockets of
//!    other families (Unix sockets included, so no listener of the daemon's user is reachable),
//!    `ptrace`, keyrings, `bpf`, new namespaces, mounts.
//!
//! `full-access` applies none of this. Where the kernel lacks something a mode needs, the command
//! fails to start with an error naming it, never runs unconfined; [`probe`] tells the daemon at
//! start what it found.
//!
//! This is the one module of forkd with `unsafe` code: the system calls made between fork and
//! exec, and the few made to prepare them. (The one other `unsafe` block registers a pidfd with
//! tokio: [`crate::process::Leader`].)

#![allow(unsafe_code)]

pub mod cgroup;
mod covers;
mod error;
mod held;
#[doc(hidden)]
pub use held::testing;
pub use held::{evict_idle as evict_idle_views, size_cache as size_view_cache};
pub mod home;
mod init;
pub mod layer;
pub mod limits;
mod seccomp;
mod setup;

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use landlock::{
    ABI, Access, AccessFs, BitFlags, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset,
    RulesetAttr, RulesetCreatedAttr, Scope,
};

pub use forkd_core::session::{Sandbox, SandboxMode};
pub use home::{HomeView, default_read_allow};
pub use limits::ResourceLimits;

use error::Layer;
pub use error::{SandboxError, explain};
pub(crate) use setup::{Setup, hidden};

/// The deny list used when the daemon's configuration names none, relative to the home
/// directory: credentials a command has no business reading.
/// (The home is covered whole anyway; the list matters for what the allow list shows, such as
/// a `~/.cargo` allowed whole, and for a home the command's workspace lies in.)
pub const DEFAULT_DENY: [&str; 9] = [
    ".ssh",
    ".gnupg",
    ".aws",
    ".config/gcloud",
    ".docker",
    ".kube",
    ".netrc",
    ".cargo/credentials",
    ".cargo/credentials.toml",
];

/// Where sessions' private temporary directories go by default: one folder per user under the
/// system's temporary directory, so two users' daemons never share it.
pub fn default_tmp_root() -> PathBuf {
    std::env::temp_dir().join(format!("forkd-sandbox-{}", nix::unistd::getuid()))
}

/// Makes sure `root` (where sessions' private temporary directories and MCP servers' directories
/// go) is this user's alone, before anything is put there: made with mode 0700 when missing;
/// refused when it is a symbolic link, not a directory, or another user's (on a machine with
/// other users, one who made `/tmp/forkd-sandbox-UID` first would read commands' temporary
/// files, or point their write grant elsewhere). A directory of this user's that others may
/// enter is closed to them (0700). Checked at each use: one `lstat`.
pub fn private_root(root: &Path) -> Result<(), SandboxError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let refuse = |why: String| {
        SandboxError::Prepare(format!(
            "the sandbox's temporary root {} {why}, so no sandboxed command runs; once it is \
             removed, forkd makes it again, this user's alone",
            root.display()
        ))
    };
    let meta = match std::fs::symlink_metadata(root) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(root)
                .map_err(|e| refuse(format!("cannot be made: {e}")))?;
            std::fs::symlink_metadata(root).map_err(|e| refuse(e.to_string()))?
        }
        Err(e) => return Err(refuse(e.to_string())),
    };
    if meta.file_type().is_symlink() {
        return Err(refuse("is a symbolic link".into()));
    }
    if !meta.is_dir() {
        return Err(refuse("is not a directory".into()));
    }
    let uid = nix::unistd::geteuid().as_raw();
    if meta.uid() != uid {
        return Err(refuse(format!(
            "belongs to uid {}, not to this daemon's user (uid {uid})",
            meta.uid()
        )));
    }
    if meta.mode() & 0o077 != 0 {
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| refuse(format!("cannot be closed to other users: {e}")))?;
    }
    Ok(())
}

/// What a sandboxed command must not see, and where it may keep temporary files: set by the
/// daemon per call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxPaths {
    /// Hidden from the command: the daemon's home, the other sessions' workspaces, the deny
    /// list. Paths that do not exist are skipped.
    pub hidden: Vec<PathBuf>,
    /// The command's private temporary directory (`TMPDIR`), created if missing; writable in
    /// every mode.
    pub tmp: PathBuf,
    /// The daemon user's home, covered but for its allow list; `None` leaves it as it is.
    pub home: Option<HomeView>,
    /// Resource limits of the command.
    pub limits: ResourceLimits,
    /// The session whose cgroup the command joins (with its siblings' commands), where the
    /// daemon may make cgroups ([`cgroup`]); `None` joins none.
    pub group: Option<String>,
}

/// Other users' homes, hidden from every command: the entries of `/home` but `own`, and `/root`
/// when the daemon is not root.
pub fn other_homes(own: Option<&Path>) -> Vec<PathBuf> {
    let own = own.and_then(|p| std::fs::canonicalize(p).ok());
    let mut homes: Vec<PathBuf> = std::fs::read_dir("/home")
        .map(|entries| entries.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    if !nix::unistd::getuid().is_root() {
        homes.push(PathBuf::from("/root"));
    }
    homes.retain(|h| std::fs::canonicalize(h).ok() != own);
    homes
}

/// The layers a sandboxed command gets on this kernel, for the daemon's start line and
/// `forkctl session get`: `landlock (ABI 7, scopes), namespaces (user, mount, pid, net), home
/// cover, seccomp, rlimits (…), cgroup v1 pids (…), oom_score_adj 1000`. A cgroup layer is listed
/// where the daemon may make cgroups ([`cgroup::hierarchy`] says why not elsewhere).
pub fn layers(sandbox: Sandbox, limits: &ResourceLimits) -> String {
    if sandbox.mode == SandboxMode::FullAccess {
        return "none (full-access)".to_owned();
    }
    let abi = landlock_abi();
    let scopes = if abi >= 6 { ", scopes" } else { "" };
    let net = if sandbox.allow_network { "" } else { ", net" };
    let unix = if sandbox.unix_sockets {
        " (Unix sockets granted)"
    } else {
        ""
    };
    let cgroup = match cgroup::hierarchy() {
        Ok(h) => format!("{}, ", h.describe(limits)),
        Err(_) => String::new(),
    };
    format!(
        "landlock (ABI {abi}{scopes}), namespaces (user, mount, pid{net}), home cover, \
         seccomp{unix}, rlimits ({}), {cgroup}oom_score_adj 1000",
        limits.describe()
    )
}

/// A sandbox prepared in the daemon, entered by the command's own process before exec.
pub(crate) struct Prepared {
    ruleset: OwnedFd,
    /// The view's namespaces, held open while the command may still enter them.
    held: Arc<held::Held>,
    /// Where the command starts: read before it enters the view's mount namespace (which moves
    /// it to the root), gone back to after.
    cwd: Vec<u8>,
    /// Where the command starts when its workspace exists only in its view (a session's own
    /// beneath [`layer::VIEW_ROOT`]): it is started at `/`, and goes there once in the view.
    cwd_in_view: Option<CString>,
    /// The PID namespace's init, ready to start.
    init: init::Init,
    oom_score_adj: CString,
    limits: ResourceLimits,
    seccomp: Vec<seccompiler::BpfProgram>,
    /// The signals the namespace's init and the outer process wait for.
    waited: libc::sigset_t,
    /// The session's cgroup: its `cgroup.procs`, and the place held there until the command
    /// ends.
    group: Option<(CString, cgroup::Membership)>,
    /// The private temporary directory, for the command's `TMPDIR`.
    pub(crate) tmp: PathBuf,
}

/// The Landlock ABI the kernel offers (0: none).
pub fn landlock_abi() -> i64 {
    // SAFETY: landlock_create_ruleset with a null attribute, size 0 and the VERSION flag only
    // returns the ABI version (or an error); it touches no memory.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            1u32, // LANDLOCK_CREATE_RULESET_VERSION
        )
    };
    abi.max(0)
}

impl Prepared {
    /// Prepares the sandbox of a command working in `workspace`, or in a `layer` mounted there
    /// (an isolated child's, which is its view, or its session's, which its view enters);
    /// `None` for `full-access`.
    pub(crate) fn new(
        sandbox: Sandbox,
        paths: &SandboxPaths,
        workspace: &Path,
        layer: Option<&Arc<layer::LayerView>>,
    ) -> Result<Option<Prepared>, SandboxError> {
        if sandbox.mode == SandboxMode::FullAccess {
            return Ok(None);
        }
        let abi = landlock_abi();
        if abi < 1 {
            return Err(SandboxError::NoLandlock {
                mode: sandbox.mode.as_str(),
                detail: String::new(),
            });
        }
        make_private(&paths.tmp)?;
        let tmp = canonical(&paths.tmp)?;
        // A session's layer, or a copy at a path only views have: its path as the layer has
        // it, never looked up here.
        let (workspace, in_view) = match layer {
            Some(l) if l.is_shared() || layer::in_view_root(l.workspace()) => {
                (l.workspace().to_path_buf(), true)
            }
            _ => (canonical(workspace)?, false),
        };
        // Landlock judges a write by the inode it reaches: in a layer, the layer's root, which
        // the daemon reaches through its descriptor.
        let writable_workspace = layer.map_or(workspace.as_path(), |l| l.through());
        let writable: Vec<&Path> = match sandbox.mode {
            SandboxMode::WorkspaceWrite => vec![writable_workspace, &tmp],
            _ => vec![&tmp],
        };
        let ruleset = ruleset(&writable)?;
        let held = match layer {
            Some(layer) if !layer.is_shared() => Arc::clone(&layer.held),
            base => {
                let key = Setup::key(sandbox, paths, &workspace, &tmp, base.map(|b| &**b));
                held::get_or_make(key, || {
                    Setup::new(sandbox, paths, &workspace, &tmp, base.cloned())
                })?
            }
        };
        let group = match (&paths.group, cgroup::hierarchy()) {
            (Some(session), Ok(hierarchy)) => {
                let membership = hierarchy.join(session, &paths.limits)?;
                held.keep_group(|| hierarchy.join(session, &paths.limits));
                Some((membership.procs().clone(), membership))
            }
            _ => None,
        };
        Ok(Some(Prepared {
            ruleset,
            held,
            cwd: vec![0; libc::PATH_MAX as usize + 1],
            cwd_in_view: if in_view {
                Some(c_path(&workspace)?)
            } else {
                None
            },
            init: init::Init::new().map_err(|e| SandboxError::Prepare(e.to_string()))?,
            oom_score_adj: c_str("/proc/self/oom_score_adj")?,
            limits: paths.limits,
            seccomp: seccomp::filters(sandbox.unix_sockets).map_err(SandboxError::Prepare)?,
            waited: init::waited(),
            group,
            tmp,
        }))
    }

    /// Makes `cmd`'s process enter this sandbox before it execs, with its `TMPDIR` set to the
    /// private temporary directory. The caller holds what it returns (the command's place in
    /// its session's cgroup) until the command has ended. (A `tokio::process::Command` is
    /// passed as its `as_std_mut()`.)
    #[must_use = "the session's cgroup goes when the last command in it lets go"]
    pub(crate) fn apply(mut self, cmd: &mut std::process::Command) -> Option<cgroup::Membership> {
        use std::os::unix::process::CommandExt;
        cmd.env("TMPDIR", &self.tmp);
        if self.cwd_in_view.is_some() {
            // Its directory is not here: it goes there in the view.
            cmd.current_dir("/");
        }
        // The process keeps the path; the place stays with the caller.
        let (procs, membership) = self.group.take().unzip();
        // SAFETY: `enter` only makes system calls on data prepared before the fork.
        unsafe {
            cmd.pre_exec(move || self.enter(procs.as_ref()));
        }
        membership
    }

    /// Enters the sandbox. Runs in the command's process between fork and exec, so it only makes
    /// system calls on what [`Prepared::new`] made ready: no allocation, no lock. The process
    /// that returns (and execs) is the command, two forks down (see [`init`]).
    fn enter(&mut self, group: Option<&CString>) -> io::Result<()> {
        // SAFETY: each call below is a plain system call on pointers to memory this value owns
        // (NUL-terminated strings, byte buffers, open descriptors) that outlives the call.
        unsafe {
            // First, while the process is still the daemon's user in the daemon's namespaces:
            // everything it starts is counted in the session's group.
            if let Some(procs) = group {
                Layer::Cgroup.tag(write_file(procs, b"0"))?;
            }
            if self.cwd_in_view.is_none()
                && libc::getcwd(self.cwd.as_mut_ptr().cast(), self.cwd.len()).is_null()
            {
                return Layer::Namespaces.tag(Err(io::Error::last_os_error()));
            }
            // The view: its user namespace first (which grants what entering the others takes).
            Layer::Namespaces.tag(check(libc::setns(self.held.user(), libc::CLONE_NEWUSER)))?;
            Layer::Namespaces.tag(check(libc::setns(self.held.mnt(), libc::CLONE_NEWNS)))?;
            if let Some(net) = self.held.net() {
                Layer::Namespaces.tag(check(libc::setns(net, libc::CLONE_NEWNET)))?;
            }
            // A mount namespace of its own, for its own /proc, and the PID namespace that
            // /proc shows.
            Layer::Namespaces.tag(check(libc::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWPID)))?;
            let cwd = match &self.cwd_in_view {
                Some(cwd) => cwd.as_ptr(),
                None => self.cwd.as_ptr().cast(),
            };
            Layer::Mounts.tag(check(libc::chdir(cwd)))?;

            // The PID namespace's init first (pid 1), then the command, which the outer process
            // forks and waits for (see [`init`]).
            libc::sigprocmask(libc::SIG_BLOCK, &self.waited, std::ptr::null_mut());
            let init = Layer::Proc.tag(self.init.start())?;
            let command = match init::fork() {
                Ok(command) => command,
                Err(e) => {
                    // No command to wait for (the session at its process cap: EAGAIN): the init
                    // goes now, and with it the namespace and its place in the session's group.
                    libc::kill(init, libc::SIGKILL);
                    let mut st = 0;
                    libc::waitpid(init, &mut st, 0);
                    return Layer::PidNamespace.tag(Err(e));
                }
            };
            if command > 0 {
                init::outer(init, command, &self.waited);
            }
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());

            Layer::Limits.tag(self.limits.apply())?;
            Layer::Limits.tag(write_file(&self.oom_score_adj, b"1000"))?;
            Layer::Landlock.tag(check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)))?;
            let restricted = libc::syscall(
                libc::SYS_landlock_restrict_self,
                self.ruleset.as_raw_fd(),
                0u32,
            );
            if restricted != 0 {
                return Layer::Landlock.tag(Err(io::Error::last_os_error()));
            }
            for filter in &self.seccomp {
                Layer::Seccomp.tag(
                    seccompiler::apply_filter(filter).map_err(|_| io::Error::last_os_error()),
                )?;
            }
        }
        Ok(())
    }
}

/// The Landlock ruleset: every write-like access handled, granted beneath `writable` and on the
/// devices a shell writes to.
fn ruleset(writable: &[&Path]) -> Result<OwnedFd, SandboxError> {
    let prepare = |e: &dyn std::fmt::Display| SandboxError::Prepare(format!("Landlock: {e}"));
    // Best effort above V1: an older kernel still confines writes, without the newer rights
    // (truncate, device ioctls) that it cannot handle.
    let write: BitFlags<AccessFs> = AccessFs::from_write(ABI::V5);
    // Scopes (ABI 6): no signal to, and no abstract Unix socket of, anything outside the domain.
    let mut created = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(write)
        .map_err(|e| prepare(&e))?
        .scope(Scope::from_all(ABI::V6))
        .map_err(|e| prepare(&e))?
        .create()
        .map_err(|e| prepare(&e))?;
    for dir in writable {
        let fd = PathFd::new(dir).map_err(|e| prepare(&e))?;
        created = created
            .add_rule(PathBeneath::new(fd, write))
            .map_err(|e| prepare(&e))?;
    }
    for device in ["/dev/null", "/dev/zero", "/dev/full"] {
        if let Ok(fd) = PathFd::new(device) {
            created = created
                .add_rule(PathBeneath::new(fd, AccessFs::WriteFile))
                .map_err(|e| prepare(&e))?;
        }
    }
    let fd: Option<OwnedFd> = created.into();
    fd.ok_or_else(|| SandboxError::NoLandlock {
        mode: "workspace-write",
        detail: " (no ruleset could be created)".into(),
    })
}

/// Makes a command's private temporary directory (and what is missing above it) with mode 0700.
pub(crate) fn make_private(dir: &Path) -> Result<(), SandboxError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| SandboxError::Prepare(format!("cannot create {}: {e}", dir.display())))?;
    // Made writable and kept in the view where it resolves: a link in its place (planted by
    // whoever can write its parent) would move both elsewhere.
    match std::fs::symlink_metadata(dir) {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(_) => Err(SandboxError::Prepare(format!(
            "{} is not a directory (a link?): refused as a temporary directory",
            dir.display()
        ))),
        Err(e) => Err(SandboxError::Prepare(format!(
            "cannot read {}: {e}",
            dir.display()
        ))),
    }
}

/// The workspace's path as commands see it: canonical, but beneath [`layer::VIEW_ROOT`], where
/// a path is only views' (and never looked up here): as it is, absolute and plain.
fn seen_path(path: &Path) -> Result<PathBuf, SandboxError> {
    if !layer::in_view_root(path) {
        return canonical(path);
    }
    let plain = path.components().all(|c| {
        matches!(
            c,
            std::path::Component::RootDir | std::path::Component::Normal(_)
        )
    });
    if plain {
        Ok(path.to_path_buf())
    } else {
        Err(SandboxError::Prepare(format!(
            "{} is not a plain path",
            path.display()
        )))
    }
}

fn canonical(path: &Path) -> Result<PathBuf, SandboxError> {
    std::fs::canonicalize(path)
        .map_err(|e| SandboxError::Prepare(format!("{}: {e}", path.display())))
}

fn c_path(path: &Path) -> Result<CString, SandboxError> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| SandboxError::Prepare(format!("{} holds a NUL byte", path.display())))
}

fn c_str(s: &str) -> Result<CString, SandboxError> {
    CString::new(s).map_err(|_| SandboxError::Prepare(format!("{s:?} holds a NUL byte")))
}

/// Makes the mount at `path` read-only (and nosuid, nodev), as a bind remount.
///
/// # Safety
/// In a forked process's own mount namespace: a plain system call on a string that lives for it.
unsafe fn remount_read_only(path: &CString) -> io::Result<()> {
    // SAFETY: the caller's contract.
    unsafe {
        check(libc::mount(
            std::ptr::null(),
            path.as_ptr(),
            std::ptr::null(),
            libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV,
            std::ptr::null(),
        ))
    }
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Writes `bytes` to the file at `path` with bare system calls (safe between fork and exec).
///
/// # Safety
/// `path` must be NUL-terminated and live for the call.
unsafe fn write_file(path: &CString, bytes: &[u8]) -> io::Result<()> {
    // SAFETY: the caller's contract; open, write and close take no locks.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let written = libc::write(fd, bytes.as_ptr().cast(), bytes.len());
        libc::close(fd);
        if written < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// What the sandbox found on this machine: the daemon logs it at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// The Landlock ABI (0: none).
    pub landlock_abi: i64,
    /// `None` when a sandboxed `true` ran; otherwise why it could not.
    pub failure: Option<String>,
}

/// Runs `true` in a `workspace-write` sandbox without network in `scratch`, to learn whether
/// sandboxed commands can run here.
pub async fn probe(scratch: &Path) -> Probe {
    let landlock_abi = landlock_abi();
    let paths = SandboxPaths {
        hidden: Vec::new(),
        tmp: scratch.join("tmp"),
        home: None,
        limits: ResourceLimits::default(),
        group: Some("probe".to_owned()),
    };
    let sandbox = Sandbox {
        mode: SandboxMode::WorkspaceWrite,
        allow_network: false,
        unix_sockets: false,
    };
    let failure = match Prepared::new(sandbox, &paths, scratch, None) {
        Err(e) => Some(e.to_string()),
        Ok(None) => None,
        Ok(Some(prepared)) => {
            let mut cmd = tokio::process::Command::new("true");
            cmd.stdin(std::process::Stdio::null());
            let _group = prepared.apply(cmd.as_std_mut());
            match cmd.status().await {
                Ok(status) if status.success() => None,
                Ok(status) => Some(format!("a sandboxed `true` ended with {status}")),
                Err(e) => Some(format!("a sandboxed command cannot start: {e}")),
            }
        }
    };
    Probe {
        landlock_abi,
        failure,
    }
}

#[cfg(test)]
mod tests;
