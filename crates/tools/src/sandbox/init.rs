//! The processes around a sandboxed command in its own PID namespace.
//!
//! The process the daemon spawned (the *outer* process: the one it waits for, the leader of
//! the command's process group) unshares a PID namespace with the others and starts the
//! namespace's *init* (pid 1), then forks the command (pid 2). The init shares the outer
//! process's memory (`clone(CLONE_VM)` on a stack of its own), so starting it copies none of the
//! daemon's address space; it mounts a fresh `/proc`, says so, and from then on reaps whatever
//! is left to it. The outer process forwards signals to the command, and once the command has
//! exited it kills the init — which ends every process left in the namespace, `setsid` ones
//! included — and ends the way the command did (its exit code, or the same signal).
//!
//! All three stay in the command's process group, so the daemon's `killpg` (a timeout, a kill, a
//! restart's clean-up) still reaches everything, and a `SIGKILL` from outside the namespace
//! ends its init and with it the namespace. Signals sent from inside (the lifeline's sentinel
//! killing its group) cannot end the init: it has no handler, and pid 1 of a namespace only
//! receives, from inside, the signals it handles. Nor can they reach the outer process, which is
//! outside the command's Landlock domain.
//!
//! Everything here runs between fork and exec: system calls on data prepared beforehand, no
//! allocation, no lock; the forks are raw `clone` calls, which run no `atfork` handler. The init
//! touches nothing of the memory it shares but its own stack and what [`Init`] holds.
//!
//! One more thing is shared: `errno`. The init has no thread pointer of its own (`CLONE_SETTLS`
//! would need a thread-local block laid out as libc lays it out), so a failed call in either
//! process writes the one `errno` both read. That is harmless because of when each writes and
//! reads it, and must stay so: the init can fail a call only while the outer is blocked reading
//! its ready word (mounting `/proc`), or after a `SIGCHLD`, which needs a child of the init — an
//! orphan of the command, so after the command was forked. The outer reads `errno` only in
//! between: when forking the command fails. Once the command runs, the outer reads no `errno`
//! ([`outer`] and [`end_like`] use no call's error), and the command, a plain fork, has its own.

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
pub(crate) unsafe fn close_all_but(keep: libc::c_int) {
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

/// What the init needs, prepared before the fork: it reads it from the memory it shares with
/// the outer process.
pub(crate) struct Init {
    /// The init's own stack (it shares the outer process's memory, not its stack).
    stack: Stack,
    proc_fs: std::ffi::CString,
    proc_dir: std::ffi::CString,
    /// Where the init says whether `/proc` is mounted: the write end of a pipe.
    ready: libc::c_int,
    /// The pipe's read end, which the init closes (its copy) before it writes.
    ready_read: libc::c_int,
    /// `SIGCHLD` alone: what the init waits for.
    reaped: libc::sigset_t,
}

/// The init's stack: it makes system calls only, in a loop.
const INIT_STACK: usize = 64 * 1024;

impl Init {
    pub(crate) fn new() -> io::Result<Init> {
        // SAFETY: sigemptyset and sigaddset only write the set, which is a plain value.
        let reaped = unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGCHLD);
            set
        };
        Ok(Init {
            stack: Stack::new(INIT_STACK)?,
            proc_fs: c"proc".to_owned(),
            proc_dir: c"/proc".to_owned(),
            ready: -1,
            ready_read: -1,
            reaped,
        })
    }

    /// Starts the namespace's init: a process that shares this one's memory (so starting it
    /// copies nothing), mounts the namespace's `/proc` and reaps what is left to it until it is
    /// killed. Returns its pid once `/proc` is mounted, or the error of mounting it (the init has
    /// then exited and been reaped).
    ///
    /// # Safety
    /// Between fork and exec, after `unshare(CLONE_NEWPID)` and a new mount namespace, with the
    /// signals of [`waited`] blocked: system calls only.
    pub(crate) unsafe fn start(&mut self) -> io::Result<libc::pid_t> {
        // SAFETY: system calls on memory this value owns; the init runs on its own stack, which
        // lives as long as this process (it is never freed between fork and exec).
        unsafe {
            let mut ready = [0; 2];
            if libc::pipe2(ready.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
                return Err(io::Error::last_os_error());
            }
            self.ready = ready[1];
            self.ready_read = ready[0];
            let top = self.stack.top();
            let init = libc::clone(
                run_init,
                top.cast(),
                libc::CLONE_VM | libc::SIGCHLD,
                std::ptr::from_mut(self).cast(),
            );
            libc::close(ready[1]);
            if init < 0 {
                let err = io::Error::last_os_error();
                libc::close(ready[0]);
                return Err(err);
            }
            let mut word = [0u8; 4];
            let read = libc::read(ready[0], word.as_mut_ptr().cast(), word.len());
            libc::close(ready[0]);
            if read == 4 && i32::from_ne_bytes(word) == 0 {
                return Ok(init);
            }
            let mut st = 0;
            libc::waitpid(init, &mut st, 0);
            Err(io::Error::from_raw_os_error(if read == 4 {
                i32::from_ne_bytes(word)
            } else {
                libc::ECHILD
            }))
        }
    }
}

/// A stack mapped for the init, with a guard page below it: an overflow faults instead of
/// writing over the outer process's memory.
struct Stack {
    base: *mut libc::c_void,
    len: usize,
}

// SAFETY: the mapping is owned by this value alone; nothing else points into it, and only
// `top` (through `&mut self`) hands out a pointer.
unsafe impl Send for Stack {}
// SAFETY: as above; a shared `&Stack` gives no access to the memory.
unsafe impl Sync for Stack {}

impl Stack {
    fn new(size: usize) -> io::Result<Stack> {
        // SAFETY: sysconf takes a plain integer.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let len = size.div_ceil(page) * page + page;
        // SAFETY: a fresh anonymous private mapping, owned by the value returned; the guard page
        // is its lowest page.
        unsafe {
            let base = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            );
            if base == libc::MAP_FAILED {
                return Err(io::Error::last_os_error());
            }
            let stack = Stack { base, len };
            if libc::mprotect(base, page, libc::PROT_NONE) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(stack)
        }
    }

    /// The top of the stack (it grows down), 16-byte aligned.
    fn top(&mut self) -> *mut u8 {
        // SAFETY: one past the end of the mapping, which is page-aligned (so 16-byte aligned).
        unsafe { self.base.cast::<u8>().add(self.len) }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.base, self.len) };
    }
}

/// The init's body (pid 1 of the namespace).
extern "C" fn run_init(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `Init` that `Init::start` passed, alive in the shared memory; only
    // system calls follow.
    unsafe {
        let init = &*arg.cast::<Init>();
        // Should the outer process die (killed alone), the init dies with it rather than wait
        // forever holding the namespace and a place in the session's group. Set before the
        // word below: an outer already gone by then cannot read it, and the write fails.
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        );
        libc::close(init.ready_read);
        let mounted = libc::mount(
            init.proc_fs.as_ptr(),
            init.proc_dir.as_ptr(),
            init.proc_fs.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            std::ptr::null(),
        );
        let code: i32 = if mounted == 0 {
            0
        } else {
            *libc::__errno_location()
        };
        let word = code.to_ne_bytes();
        let told = libc::write(init.ready, word.as_ptr().cast(), word.len());
        if code != 0 || told != word.len() as isize {
            libc::_exit(1);
        }
        // The init holds nothing open: the command's pipes close when the command does.
        libc::syscall(libc::SYS_close_range, 0u32, u32::MAX, 0u32);
        loop {
            if libc::sigwaitinfo(&init.reaped, std::ptr::null_mut()) == libc::SIGCHLD {
                let mut st = 0;
                while libc::waitpid(-1, &mut st, libc::WNOHANG) > 0 {}
            }
        }
    }
}

/// The outer process, once the command is forked: passes signals on to it, waits for it, ends
/// the namespace (its init, and with it every process left there, `setsid` ones included), and
/// ends as the command did.
///
/// # Safety
/// Between fork and exec only; `set` is blocked.
pub(crate) unsafe fn outer(init: libc::pid_t, command: libc::pid_t, set: &libc::sigset_t) -> ! {
    // SAFETY: system calls on values this function owns.
    unsafe {
        // The daemon's spawn waits for every copy of its pipes to close.
        libc::syscall(libc::SYS_close_range, 0u32, u32::MAX, 0u32);
        let status = loop {
            match next_signal(set) {
                libc::SIGCHLD => {
                    let mut st = 0;
                    if libc::waitpid(command, &mut st, libc::WNOHANG) == command {
                        break st;
                    }
                }
                sig if sig > 0 => {
                    libc::kill(command, sig);
                }
                _ => {}
            }
        };
        libc::kill(init, libc::SIGKILL);
        let mut st = 0;
        libc::waitpid(init, &mut st, 0);
        end_like(status)
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
