//! The namespaces a view of the machine lives in, made once and entered by every command that
//! sees the same view.
//!
//! Making a user, a mount and a network namespace, and covering the home and the hidden paths
//! in it, is most of what a sandboxed command used to cost; two commands of one session need
//! the same result. So the daemon makes it once per *view* — the hidden paths as they are now,
//! the home and its allow list, the command's workspace and temporary directory, with or
//! without network — in a short-lived *holder* process, keeps the namespaces open by their
//! `/proc/PID/ns` descriptors, and each command `setns`es into them before it makes its own
//! mount and PID namespaces (its own `/proc`), forks its init, and confines itself (Landlock,
//! seccomp, limits) as before.
//!
//! A view is keyed by what decides its mounts, read from the file system on each command: the
//! identity (device and inode, or absence) of every hidden path, of the workspace and temporary
//! directory, and of each allowed home entry. A hidden directory that holds a kept path is
//! covered whole with the kept path bound back in, so what else appears in it (another
//! session's temporary directory, a fresh workspace) changes neither the view nor its key: a new
//! session leaves the other sessions' views as they are. Views idle for a minute are let go,
//! and at most a number sized from the descriptor limit are kept.
//!
//! A holder that does not answer within [`HOLDER_TIMEOUT`] (a mount hanging on a network file
//! system, say) is killed and the command fails, saying so; the thread that waited is the
//! caller's blocking one, never a runtime worker.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use super::{SandboxError, Setup, explain, init};

/// How long a view nobody used stays held.
const IDLE: Duration = Duration::from_secs(60);
/// The most views held at once by default (the least recently used goes first); the daemon
/// sizes it from its descriptor limit ([`size_cache`]).
const KEPT: usize = 256;

/// The most views held at once now.
static CAPACITY: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(KEPT);

/// Sizes the cache of views for `open_files` descriptors (the process's soft limit): each view
/// holds three, and at most a sixteenth of the limit goes to views (16 to [`KEPT`] views).
/// Returns the capacity set.
pub fn size_cache(open_files: u64) -> usize {
    let capacity = usize::try_from(open_files / 16 / 3)
        .unwrap_or(KEPT)
        .clamp(16, KEPT);
    CAPACITY.store(capacity, Ordering::Relaxed);
    capacity
}

/// Lets go the views idle for a minute, their descriptors closed with them; the daemon calls it
/// on a timer, so idle views do not wait for the next command to be let go.
pub fn evict_idle() {
    let now = Instant::now();
    let mut views = VIEWS.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(views) = views.as_mut() {
        views.retain(|_, e| now.duration_since(e.used) < IDLE);
    }
}
/// How long a holder may take to make a view.
pub(crate) const HOLDER_TIMEOUT: Duration = Duration::from_secs(30);

/// [`HOLDER_TIMEOUT`], or what a test set (milliseconds).
static TIMEOUT_MS: AtomicU64 = AtomicU64::new(HOLDER_TIMEOUT.as_millis() as u64);

/// Test hooks: holders that never answer, and a shorter wait for them.
#[doc(hidden)]
pub mod testing {
    use std::path::{Path, PathBuf};
    use std::sync::{Mutex, PoisonError};
    use std::time::Duration;

    pub(super) static HANGING: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

    /// Every holder making a view with the temporary directory `tmp` hangs, never answering.
    pub fn hang_holders_for(tmp: &Path) {
        HANGING
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(tmp.to_path_buf());
    }

    /// Holders are waited for `timeout`, not [`super::HOLDER_TIMEOUT`].
    pub fn set_holder_timeout(timeout: Duration) {
        super::TIMEOUT_MS.store(
            timeout.as_millis() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// Whether holders of views with `tmp` hang.
    pub(crate) fn hangs(tmp: &Path) -> bool {
        HANGING
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .any(|t| tmp.starts_with(t))
    }
}

/// A view's namespaces, open in the daemon.
#[derive(Debug)]
pub(crate) struct Held {
    user: OwnedFd,
    mnt: OwnedFd,
    /// `None` where the view has the daemon's network.
    net: Option<OwnedFd>,
    /// The session's cgroup, kept while its view is: so that one command after another finds
    /// it made rather than making and removing it each time.
    group: OnceLock<Option<super::cgroup::Membership>>,
    /// The session's layer the view entered, kept mounted while the view is held.
    _base: Option<Arc<super::layer::LayerView>>,
}

impl Held {
    pub(crate) fn user(&self) -> RawFd {
        self.user.as_raw_fd()
    }

    pub(crate) fn mnt(&self) -> RawFd {
        self.mnt.as_raw_fd()
    }

    pub(crate) fn net(&self) -> Option<RawFd> {
        self.net.as_ref().map(AsRawFd::as_raw_fd)
    }

    /// Keeps a place in the session's cgroup for as long as the view is held (the first one
    /// `join` gives; an error leaves the group to the commands alone).
    pub(crate) fn keep_group(
        &self,
        join: impl FnOnce() -> Result<super::cgroup::Membership, SandboxError>,
    ) {
        self.group.get_or_init(|| join().ok());
    }
}

/// What decides a view, as bytes; built by [`Key::push_path`].
#[derive(Debug, Default, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    bytes: Vec<u8>,
}

impl Key {
    pub(crate) fn new(net: bool) -> Key {
        Key {
            bytes: vec![u8::from(net)],
        }
    }

    /// Adds `path` and the identity of what it names now (nothing, when it does not exist).
    pub(crate) fn push_path(&mut self, path: &Path) {
        self.bytes.extend_from_slice(path.as_os_str().as_bytes());
        self.bytes.push(0);
        let (dev, ino) = std::fs::metadata(path).map_or((0, 0), |m| (m.dev(), m.ino()));
        self.push_u64(dev);
        self.push_u64(ino);
    }

    /// Adds the identity of a session's layer the view enters.
    pub(crate) fn push_id(&mut self, id: u64) {
        self.bytes.push(b'L');
        self.push_u64(id);
    }

    fn push_u64(&mut self, n: u64) {
        self.bytes.extend_from_slice(&n.to_le_bytes());
    }
}

struct Entry {
    held: Arc<Held>,
    used: Instant,
}

static VIEWS: Mutex<Option<HashMap<Vec<u8>, Entry>>> = Mutex::new(None);

/// The held namespaces of the view `key` names: those made earlier, or new ones from `make`'s
/// setup.
pub(crate) fn get_or_make(
    key: Key,
    make: impl FnOnce() -> Result<Setup, SandboxError>,
) -> Result<Arc<Held>, SandboxError> {
    let now = Instant::now();
    {
        let mut views = VIEWS.lock().unwrap_or_else(PoisonError::into_inner);
        let views = views.get_or_insert_with(HashMap::new);
        views.retain(|_, e| now.duration_since(e.used) < IDLE);
        if let Some(entry) = views.get_mut(&key.bytes) {
            entry.used = now;
            return Ok(Arc::clone(&entry.held));
        }
    }
    let held = Arc::new(hold(make()?, None)?.0);
    let mut views = VIEWS.lock().unwrap_or_else(PoisonError::into_inner);
    let views = views.get_or_insert_with(HashMap::new);
    if views.len() >= CAPACITY.load(Ordering::Relaxed)
        && let Some(oldest) = views
            .iter()
            .min_by_key(|(_, e)| e.used)
            .map(|(k, _)| k.clone())
    {
        views.remove(&oldest);
    }
    views.insert(
        key.bytes,
        Entry {
            held: Arc::clone(&held),
            used: now,
        },
    );
    Ok(held)
}

/// Makes `setup`'s namespaces in a holder process and opens them, and the directory at `open`
/// as the holder sees it (an isolated child's layer, mounted there).
pub(crate) fn hold(
    mut setup: Setup,
    open: Option<&Path>,
) -> Result<(Held, Option<OwnedFd>), SandboxError> {
    let net = setup.has_own_network();
    let base = setup.base.clone();
    let mut pair = [0; 2];
    // SAFETY: socketpair writes two descriptors into the array it is given.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            pair.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(prepare("a socket pair", io::Error::last_os_error()));
    }
    // SAFETY: both descriptors were just made and are owned here alone.
    let (ours, theirs) = unsafe { (OwnedFd::from_raw_fd(pair[0]), OwnedFd::from_raw_fd(pair[1])) };
    // SAFETY: the holder only makes system calls (`Setup::enter` is written for a forked child)
    // and exits without returning.
    let pid = unsafe { init::fork() }.map_err(|e| prepare("the holder process", e))?;
    if pid == 0 {
        // SAFETY: in the forked holder: system calls on memory it owns, then `_exit`.
        unsafe { holder(&mut setup, theirs.as_raw_fd()) }
    }
    drop(theirs);
    let opened = opened(pid, &ours, net, base).and_then(|held| {
        let dir = open.map(|dir| open_in(pid, dir)).transpose()?;
        Ok((held, dir))
    });
    // Closing our end lets the holder exit; the namespaces live on in the descriptors.
    drop(ours);
    if opened.is_err() {
        // One that has not answered is killed; one stuck in the kernel (a hung mount) may
        // not die at once, so it is reaped by a thread of its own, never waited for here.
        // SAFETY: kill and waitpid on the holder, our own child, which nothing else waits for.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        std::thread::spawn(move || {
            let mut status = 0;
            // SAFETY: as above.
            unsafe { libc::waitpid(pid, &mut status, 0) };
        });
        return opened;
    }
    let mut status = 0;
    // SAFETY: waitpid on the holder, our own child, which nothing else waits for. It answered
    // and reads its end, which is closed: it is exiting.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    opened
}

/// In the daemon: waits for the holder's word (for the holder timeout at most), then opens its
/// namespaces.
fn opened(
    pid: libc::pid_t,
    ours: &OwnedFd,
    net: bool,
    base: Option<Arc<super::layer::LayerView>>,
) -> Result<Held, SandboxError> {
    let timeout = Duration::from_millis(TIMEOUT_MS.load(Ordering::Relaxed));
    let deadline = Instant::now() + timeout;
    let mut word = [0u8; 4];
    let mut got = 0;
    while got < word.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut poll = libc::pollfd {
            fd: ours.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll on one pollfd this function owns.
        let ready =
            unsafe { libc::poll(&mut poll, 1, left.as_millis().min(i32::MAX as u128) as i32) };
        if ready == 0 {
            return Err(SandboxError::Enter(format!(
                "the process making the command's view did not finish within {} s and was \
                 killed (a mount in the view may hang: a network file system that stopped \
                 answering?)",
                timeout.as_secs_f64()
            )));
        }
        if ready < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(prepare("waiting for the holder", err));
        }
        // SAFETY: read into the unread rest of a buffer this function owns.
        let n = unsafe {
            libc::read(
                ours.as_raw_fd(),
                word[got..].as_mut_ptr().cast(),
                word.len() - got,
            )
        };
        match n {
            n if n > 0 => got += n.unsigned_abs(),
            0 => {
                return Err(SandboxError::Enter(
                    "the process setting up its namespaces ended before it was done".into(),
                ));
            }
            _ => {
                let err = io::Error::last_os_error();
                if err.kind() != io::ErrorKind::Interrupted {
                    return Err(prepare("the holder's word", err));
                }
            }
        }
    }
    let code = i32::from_ne_bytes(word);
    if code != 0 {
        return Err(SandboxError::Enter(explain(&io::Error::from_raw_os_error(
            code,
        ))));
    }
    let ns = |name: &str| -> Result<OwnedFd, SandboxError> {
        let path = format!("/proc/{pid}/ns/{name}");
        File::open(&path)
            .map(OwnedFd::from)
            .map_err(|e| prepare(&path, e))
    };
    Ok(Held {
        user: ns("user")?,
        mnt: ns("mnt")?,
        net: if net { Some(ns("net")?) } else { None },
        group: OnceLock::new(),
        _base: base,
    })
}

/// Opens `dir` as the holder `pid` sees it, through its root: the descriptor keeps reaching the
/// holder's mounts after it is gone.
fn open_in(pid: libc::pid_t, dir: &Path) -> Result<OwnedFd, SandboxError> {
    let mut path = PathBuf::from(format!("/proc/{pid}/root"));
    path.push(dir.strip_prefix("/").unwrap_or(dir));
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(&path)
        .map(OwnedFd::from)
        .map_err(|e| prepare(&format!("the layer at {}", dir.display()), e))
}

/// The holder: sets the view up in new namespaces, says how it went, and waits for the daemon
/// to close its end.
///
/// # Safety
/// In a process forked from the daemon: system calls only.
unsafe fn holder(setup: &mut Setup, fd: RawFd) -> ! {
    // SAFETY: system calls on memory this process owns.
    unsafe {
        // A view over a session's layer enters its namespaces while their descriptors are open.
        let entered = setup.enter_base();
        init::close_all_but(fd);
        if setup.hang {
            // A test's hung holder: it never answers.
            loop {
                libc::pause();
            }
        }
        let code = match entered.and_then(|()| setup.enter()) {
            Ok(()) => 0,
            Err(e) => e.raw_os_error().unwrap_or(libc::EINVAL),
        };
        let word = code.to_ne_bytes();
        libc::write(fd, word.as_ptr().cast(), word.len());
        // Held until the daemon closes its end (EOF), or the read fails otherwise.
        let mut byte = 0u8;
        while libc::read(fd, (&raw mut byte).cast(), 1) < 0
            && *libc::__errno_location() == libc::EINTR
        {}
        libc::_exit(0)
    }
}

fn prepare(what: &str, err: io::Error) -> SandboxError {
    SandboxError::Prepare(format!("{what}: {err}"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_path_that_appears_changes_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        let key = |p: &Path| {
            let mut k = Key::new(false);
            k.push_path(p);
            k
        };
        let before = key(&secret);
        assert_eq!(before, key(&secret));
        std::fs::write(&secret, "x").unwrap();
        assert_ne!(before, key(&secret));
        assert_ne!(Key::new(false), Key::new(true));
    }

    #[test]
    fn the_view_cache_is_sized_from_the_descriptor_limit() {
        assert_eq!(size_cache(1024), 21);
        assert_eq!(size_cache(64), 16);
        assert_eq!(size_cache(1 << 20), KEPT);
        size_cache(1 << 20);
    }
}
