//! The system calls a sandboxed command may not make, as seccomp filters (built with
//! `seccompiler`, installed by the command's own process just before it execs).
//!
//! Refused with `EPERM`, so that programs fail cleanly:
//! - `socket()` of any family but `AF_INET`, `AF_INET6` and `AF_NETLINK` with the route
//!   protocol (`AF_UNIX` too, unless the session has the `unix_sockets` grant: seccomp cannot
//!   see a `connect` address, so a Unix socket could reach any listener the daemon's user can);
//!   `socketpair()` of anything but `AF_UNIX`;
//! - tracing and reading other processes (`ptrace`, `process_vm_readv`/`writev`), the kernel
//!   keyring, `bpf`, `perf_event_open`, `userfaultfd`, `io_uring`;
//! - changing the mount table or namespaces: `mount`, `umount2`, `pivot_root`, the new mount
//!   API, `setns`, `unshare`, and `clone` with any `CLONE_NEW*` flag.
//!
//! `clone3` answers `ENOSYS`, its flags being out of a filter's reach (they sit in a struct):
//! libc then falls back to `clone`, whose flags the filter checks. A call made through another
//! architecture's entry (i386's `int 0x80`, whose `socketcall` would hide the socket family)
//! kills the process, as every `seccompiler` filter does; the x32 numbers of the refused calls
//! are refused as well, on a kernel that runs x32 calls at all.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// The filters, in the order they are installed: compiled once per daemon (they depend only on
/// the grant), not once per command.
pub(crate) fn filters(unix_sockets: bool) -> Result<Vec<BpfProgram>, String> {
    static COMPILED: [std::sync::OnceLock<Result<Vec<BpfProgram>, String>>; 2] =
        [std::sync::OnceLock::new(), std::sync::OnceLock::new()];
    COMPILED[usize::from(unix_sockets)]
        .get_or_init(|| compile(unix_sockets))
        .clone()
}

fn compile(unix_sockets: bool) -> Result<Vec<BpfProgram>, String> {
    let arch: TargetArch = std::env::consts::ARCH
        .try_into()
        .map_err(|e| format!("seccomp: {e}"))?;
    let refused = SeccompFilter::new(
        refusals(unix_sockets)?,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(|e| format!("seccomp: {e}"))?;
    let clone3 = SeccompFilter::new(
        BTreeMap::from([(libc::SYS_clone3, Vec::new())]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )
    .map_err(|e| format!("seccomp: {e}"))?;
    [refused, clone3]
        .into_iter()
        .map(|f| BpfProgram::try_from(f).map_err(|e| format!("seccomp: {e}")))
        .collect()
}

/// Calls refused whatever their arguments.
const ALWAYS: [libc::c_long; 25] = [
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_open_tree,
    libc::SYS_move_mount,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    libc::SYS_setns,
    libc::SYS_unshare,
    libc::SYS_open_by_handle_at,
];

/// The namespace flags `clone` may not carry.
const CLONE_NEW: [libc::c_int; 7] = [
    libc::CLONE_NEWNS,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWNET,
    libc::CLONE_NEWCGROUP,
];

/// The route protocol of `AF_NETLINK` (what `ip` and getaddrinfo's interface lookup use).
const NETLINK_ROUTE: u64 = 0;

fn refusals(unix_sockets: bool) -> Result<BTreeMap<i64, Vec<SeccompRule>>, String> {
    let arg = |index: u8, op: SeccompCmpOp, value: u64| {
        SeccompCondition::new(index, SeccompCmpArgLen::Dword, op, value)
            .map_err(|e| format!("seccomp: {e}"))
    };
    let rule = |conditions: Vec<SeccompCondition>| {
        SeccompRule::new(conditions).map_err(|e| format!("seccomp: {e}"))
    };
    let family = |f: libc::c_int| u64::from(f.unsigned_abs());
    let mut allowed = vec![
        family(libc::AF_INET),
        family(libc::AF_INET6),
        family(libc::AF_NETLINK),
    ];
    if unix_sockets {
        allowed.push(family(libc::AF_UNIX));
    }
    let other_family = allowed
        .iter()
        .map(|f| arg(0, SeccompCmpOp::Ne, *f))
        .collect::<Result<Vec<_>, _>>()?;
    let socket = vec![
        rule(other_family)?,
        rule(vec![
            arg(0, SeccompCmpOp::Eq, family(libc::AF_NETLINK))?,
            arg(2, SeccompCmpOp::Ne, NETLINK_ROUTE)?,
        ])?,
    ];
    let socketpair = vec![rule(vec![arg(
        0,
        SeccompCmpOp::Ne,
        family(libc::AF_UNIX),
    )?])?];
    let clone = CLONE_NEW
        .iter()
        .map(|flag| {
            let bit = u64::from(flag.unsigned_abs());
            rule(vec![arg(0, SeccompCmpOp::MaskedEq(bit), bit)?])
        })
        .collect::<Result<Vec<_>, _>>()?;

    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        ALWAYS.iter().map(|nr| (*nr, Vec::new())).collect();
    rules.insert(libc::SYS_socket, socket);
    rules.insert(libc::SYS_socketpair, socketpair);
    rules.insert(libc::SYS_clone, clone);
    x32(&mut rules);
    Ok(rules)
}

/// x32's system call numbers: the native ones with bit 30 set.
#[cfg(target_arch = "x86_64")]
const X32: i64 = 0x4000_0000;

/// Whether this kernel runs x32 system calls at all (most distributions' kernels are built
/// without, or boot with it off): a `getpid` through x32 answers `ENOSYS` where it does not.
#[cfg(target_arch = "x86_64")]
fn x32_runs() -> bool {
    // SAFETY: getpid takes no argument and changes nothing, through whichever ABI.
    let pid = unsafe { libc::syscall(libc::SYS_getpid | X32) };
    !(pid == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS))
}

/// On x86_64, the same calls through the x32 ABI (their numbers with bit 30 set, and the
/// x32-only numbers of a few), all refused outright — where the kernel runs x32 calls. Where it
/// does not, they would only lengthen the filter, which the kernel compiles and walks through
/// for every system call number each time a command installs it.
#[cfg(target_arch = "x86_64")]
fn x32(rules: &mut BTreeMap<i64, Vec<SeccompRule>>) {
    if !x32_runs() {
        return;
    }
    /// x32's own numbers for `ptrace`, `process_vm_readv` and `process_vm_writev`.
    const X32_ONLY: [i64; 3] = [521, 539, 540];
    let native: Vec<i64> = rules.keys().copied().collect();
    for nr in native.into_iter().chain([libc::SYS_clone3]) {
        rules.insert(nr | X32, Vec::new());
    }
    for nr in X32_ONLY {
        rules.insert(nr | X32, Vec::new());
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn x32(_: &mut BTreeMap<i64, Vec<SeccompRule>>) {}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn both_filters_compile_with_and_without_the_grant() {
        for grant in [false, true] {
            let filters = filters(grant).unwrap();
            assert_eq!(filters.len(), 2);
            assert!(filters.iter().all(|f| !f.is_empty()));
        }
    }
}
