//! What a sandboxed command's failure to start says: the daemon's errors, and the layer a
//! forked child could not enter, carried back in the one `i32` it has (see [`Layer`]).

use std::io;

/// Why a sandboxed command could not start.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error(
        "the {mode} sandbox needs Landlock, which this kernel does not offer{detail}; the command \
         did not run. A session whose commands may run unconfined is created with --sandbox \
         full-access"
    )]
    NoLandlock { mode: &'static str, detail: String },
    #[error("the sandbox could not be prepared: {0}")]
    Prepare(String),
    #[error(
        "the command could not enter its sandbox: {0}; the command did not run. A session whose \
         commands may run unconfined is created with --sandbox full-access"
    )]
    Enter(String),
}

/// The layers a command's process enters, in order: a failure to enter one is reported naming
/// it (see [`explain`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub(crate) enum Layer {
    Namespaces = 1,
    Mounts = 2,
    HomeCover = 3,
    PidNamespace = 4,
    Proc = 5,
    Limits = 6,
    Landlock = 7,
    Seccomp = 8,
    Cgroup = 9,
    Overlay = 10,
}

/// The step a failed `errno` came from travels in the error itself: the only thing a process
/// between fork and exec hands back to its spawner is one `i32`.
const LAYER_SHIFT: i32 = 1 << 16;

impl Layer {
    fn name(self) -> &'static str {
        match self {
            Layer::Namespaces => "user/mount/pid/network namespaces",
            Layer::Mounts => "the private mount table",
            Layer::HomeCover => "the cover of the home directory",
            Layer::PidNamespace => "the PID namespace's init",
            Layer::Proc => "the PID namespace's /proc",
            Layer::Limits => "the resource limits",
            Layer::Landlock => "Landlock",
            Layer::Seccomp => "the seccomp filter",
            Layer::Cgroup => "the session's cgroup",
            Layer::Overlay => "the child's copy-on-write layer (overlayfs)",
        }
    }

    fn from_code(code: i32) -> Option<Layer> {
        [
            Layer::Namespaces,
            Layer::Mounts,
            Layer::HomeCover,
            Layer::PidNamespace,
            Layer::Proc,
            Layer::Limits,
            Layer::Landlock,
            Layer::Seccomp,
            Layer::Cgroup,
            Layer::Overlay,
        ]
        .into_iter()
        .find(|l| *l as i32 == code)
    }

    /// Tags `result`'s error with this layer.
    pub(crate) fn tag<T>(self, result: io::Result<T>) -> io::Result<T> {
        result.map_err(|e| {
            io::Error::from_raw_os_error(self as i32 * LAYER_SHIFT + e.raw_os_error().unwrap_or(0))
        })
    }
}

/// What a spawn error of a sandboxed command means: the layer that could not be entered and
/// why, where the error came from entering one.
pub fn explain(err: &io::Error) -> String {
    let Some(code) = err.raw_os_error() else {
        return err.to_string();
    };
    match Layer::from_code(code / LAYER_SHIFT) {
        Some(layer) if code % LAYER_SHIFT == libc::ESTALE => format!(
            "{} could not be set up: a hidden path was replaced or moved while the view was \
             being made (nothing was mounted on what took its place); run it again",
            layer.name()
        ),
        Some(layer) => format!(
            "{} could not be set up: {}",
            layer.name(),
            io::Error::from_raw_os_error(code % LAYER_SHIFT)
        ),
        None => err.to_string(),
    }
}
