//! The processes around a sandboxed command in its own PID namespace.
//!
//! The process the daemon spawned (the *outer* process: the one it waits for, the leader of
//! the command's process group) unshares a PID namespace with the others, and forks. The fork
//! is the namespace's *init* (pid 1): it mounts a fresh `/proc`, forks the command, then reaps
//! whatever ends in the namespace, forwards signals to the command, and exits as soon as the
//! command does — which ends every process left in the namespace, `setsid` ones included. The
//! outer process forwards signals to the init and, once it has exited, ends the way the command
//! did (its exit code, or the same signal), which it learns through a pipe from the init.
//!
//! Both stay in the command's process group, so the daemon's `killpg` (a timeout, a kill, a
//! restart's clean-up) still reaches everything, and a `SIGKILL` from outside the namespace
//! ends its init and with it the namespace. Signals sent from inside (the lifeline's sentinel
//! killing its group) cannot end the init: it has no handler, and pid 1 of a namespace only
//! receives, from inside, the signals it handles. Nor can they reach the outer process, which is
//! outside the command's Landlock domain.
//!
//! Everything here runs between fork and exec: system calls on data prepared beforehand, no
//! allocation, no lock; the forks are raw `clone` calls, which run no `atfork` handler.

use std::io;

/// The signals the outer process and the init pass on (and `SIGCHLD`, which they wait for).
const FORWARDED: [libc::c_int; 7] = [
    libc::SIGHUP,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGTERM,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGWINCH,
];

/// The set of signals the outer process and the init wait for instead of handling.
pub(crate) fn waited() -> libc::sigset_t {
    // SAFETY: sigemptyset and sigaddset only write the set, which is a plain value.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        for sig in FORWARDED {
            libc::sigaddset(&mut set, sig);
        }
        set
    }
}

/// `fork()` without libc's `atfork` handlers: 0 in the child, its pid in the parent.
///
/// # Safety
/// The child may only make system calls until it execs or exits.
pub(crate) unsafe fn fork() -> io::Result<libc::pid_t> {
    // SAFETY: clone with SIGCHLD only and no new stack is fork; the caller's contract covers
    // the child.
    let pid = unsafe { libc::syscall(libc::SYS_clone, libc::SIGCHLD as libc::c_ulong, 0, 0, 0, 0) };
    match pid {
        -1 => Err(io::Error::last_os_error()),
        pid => libc::pid_t::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL)),
    }
}

/// Closes every descriptor but `keep`.
///
/// # Safety
/// Between fork and exec: nothing else may use the descriptors closed.
unsafe fn close_all_but(keep: libc::c_int) {
    // SAFETY: close_range takes plain integers. `keep` is above the standard descriptors,
    // which are open, so both ranges are well-formed.
    unsafe {
        libc::syscall(libc::SYS_close_range, 0u32, keep.unsigned_abs() - 1, 0u32);
        libc::syscall(
            libc::SYS_close_range,
            keep.unsigned_abs() + 1,
            u32::MAX,
            0u32,
        );
    }
}

/// Waits for the next of `set`'s signals (blocked by the caller).
unsafe fn next_signal(set: &libc::sigset_t) -> libc::c_int {
    // SAFETY: sigwaitinfo reads the set and may write no info (a null pointer).
    unsafe { libc::sigwaitinfo(set, std::ptr::null_mut()) }
}

/// The outer process, once the init is forked: passes signals on, waits for the init, and
/// ends as the command did.
///
/// # Safety
/// Between fork and exec only; `set` is blocked, `status` is the read end of the init's pipe.
pub(crate) unsafe fn outer(init: libc::pid_t, status: libc::c_int, set: &libc::sigset_t) -> ! {
    // SAFETY: system calls on values this function owns.
    unsafe {
        close_all_but(status);
        let init_status = loop {
            match next_signal(set) {
                libc::SIGCHLD => {
                    let mut st = 0;
                    if libc::waitpid(init, &mut st, libc::WNOHANG) == init {
                        break st;
                    }
                }
                sig if sig > 0 => {
                    libc::kill(init, sig);
                }
                _ => {}
            }
        };
        let mut buf = [0u8; 4];
        let read = libc::read(status, buf.as_mut_ptr().cast(), buf.len());
        // The command's status, as the init passed it on; the init's own where it could not
        // (it failed before the command started).
        let command = if read == 4 {
            i32::from_ne_bytes(buf)
        } else {
            init_status
        };
        end_like(command)
    }
}

/// The init (pid 1 of the namespace), once the command is forked: reaps, forwards, and exits
/// when the command has, passing its status to the outer process.
///
/// # Safety
/// Between fork and exec only; `set` is blocked, `status` is the write end of the pipe.
pub(crate) unsafe fn init(command: libc::pid_t, status: libc::c_int, set: &libc::sigset_t) -> ! {
    // SAFETY: system calls on values this function owns.
    unsafe {
        close_all_but(status);
        loop {
            match next_signal(set) {
                libc::SIGCHLD => loop {
                    let mut st = 0;
                    let pid = libc::waitpid(-1, &mut st, libc::WNOHANG);
                    if pid <= 0 {
                        break;
                    }
                    if pid == command {
                        let bytes = st.to_ne_bytes();
                        libc::write(status, bytes.as_ptr().cast(), bytes.len());
                        // The namespace's other processes end with it.
                        libc::_exit(0);
                    }
                },
                sig if sig > 0 => {
                    libc::kill(command, sig);
                }
                _ => {}
            }
        }
    }
}

/// Exits with `status`'s code, or dies of its signal.
unsafe fn end_like(status: libc::c_int) -> ! {
    // SAFETY: plain system calls; the process ends here.
    unsafe {
        if libc::WIFSIGNALED(status) {
            let sig = libc::WTERMSIG(status);
            // No core file of this process, whatever the signal.
            let none = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::setrlimit(libc::RLIMIT_CORE, &none);
            libc::signal(sig, libc::SIG_DFL);
            let mut only: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut only);
            libc::sigaddset(&mut only, sig);
            libc::sigprocmask(libc::SIG_UNBLOCK, &only, std::ptr::null_mut());
            libc::kill(libc::getpid(), sig);
            libc::_exit(128 + sig);
        }
        libc::_exit(if libc::WIFEXITED(status) {
            libc::WEXITSTATUS(status)
        } else {
            1
        })
    }
}
