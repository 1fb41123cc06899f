//! The sandbox's own checks that need its private parts (the integration tests drive it
//! through the Bash tool).

#![allow(clippy::unwrap_used)]

use super::covers::covers;
use super::*;

#[test]
fn a_failed_layer_is_named_with_its_errno() {
    let err = Layer::Proc
        .tag::<()>(Err(io::Error::from_raw_os_error(libc::EPERM)))
        .unwrap_err();
    let text = explain(&err);
    assert!(
        text.starts_with("the PID namespace's /proc could not be set up: "),
        "{text}"
    );
    assert!(text.contains("os error 1"), "{text}");
    // An error from elsewhere reads as itself.
    let plain = io::Error::from_raw_os_error(libc::ENOENT);
    assert_eq!(explain(&plain), plain.to_string());
}

#[test]
fn a_hidden_directory_holding_a_kept_one_is_split_not_covered_entry_by_entry() {
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let home = root.join("home");
    for d in ["home/ws/src", "home/tmp/s1", "home/tmp/s2", "home/agents"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::fs::write(home.join("forkd.db"), "x").unwrap();
    let (ws, tmp) = (home.join("ws"), home.join("tmp/s1"));
    let other = root.join("other-ws");
    std::fs::create_dir_all(&other).unwrap();
    let (split, whole) = covers(&[home.clone(), other.clone()], &[&ws, &tmp]);
    assert_eq!(split, vec![home.clone()]);
    assert_eq!(whole, vec![(other.clone(), true)]);
    // Nothing new beside the kept paths changes the plan.
    std::fs::create_dir_all(home.join("tmp/s3")).unwrap();
    assert_eq!(
        covers(&[home.clone(), other.clone()], &[&ws, &tmp]),
        (split, whole)
    );
    // A hidden path inside another one covered whole (a workspace in another workspace) is
    // covered with it, not on its own.
    std::fs::create_dir_all(other.join("sub")).unwrap();
    let (_, nested) = covers(&[other.join("sub"), other.clone()], &[&tmp]);
    assert_eq!(nested, vec![(other.clone(), true)]);
    // A kept path itself is never covered; a missing one is skipped.
    assert_eq!(covers(std::slice::from_ref(&ws), &[&ws]), (vec![], vec![]));
    assert_eq!(covers(&[root.join("missing")], &[&ws]), (vec![], vec![]));
}

#[test]
fn the_temporary_root_is_this_users_alone() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = tempfile::tempdir().unwrap();
    let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().mode() & 0o777;
    // Missing: made, 0700.
    let root = dir.path().join("made/root");
    private_root(&root).unwrap();
    assert_eq!(mode(&root), 0o700);
    // Ours but open to others (made by an earlier forkd): closed.
    let open = dir.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    private_root(&open).unwrap();
    assert_eq!(mode(&open), 0o700);
    // A symlink (to a directory someone else chose): refused, nothing made through it.
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
    let err = private_root(&link).unwrap_err().to_string();
    assert!(err.contains("is a symbolic link"), "{err}");
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
    // Not a directory.
    let file = dir.path().join("file");
    std::fs::write(&file, "x").unwrap();
    assert!(
        private_root(&file)
            .unwrap_err()
            .to_string()
            .contains("not a directory")
    );
    // Another user's (only root can make one here).
    if nix::unistd::geteuid().is_root() {
        let theirs = dir.path().join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
        let err = private_root(&theirs).unwrap_err().to_string();
        assert!(err.contains("belongs to uid 65534"), "{err}");
        assert_eq!(std::fs::metadata(&theirs).unwrap().uid(), 65534);
    } else {
        eprintln!("not root: no directory of another user's to try");
    }
}

#[test]
fn a_commands_temporary_directory_is_never_a_link() {
    let dir = tempfile::tempdir().unwrap();
    let made = dir.path().join("session/child");
    make_private(&made).unwrap();
    assert!(std::fs::symlink_metadata(&made).unwrap().is_dir());
    make_private(&made).unwrap();
    // A link where the directory goes (to a directory nobody may write): refused, not followed.
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let link = dir.path().join("session/planted");
    std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
    let err = make_private(&link).unwrap_err().to_string();
    assert!(err.contains("is not a directory (a link?)"), "{err}");
}

#[test]
fn a_cover_swapped_after_its_plan_fails_the_view_instead_of_landing_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let (ws, tmp) = (root.join("ws"), root.join("tmp"));
    let other = root.join("other");
    for d in [&ws, &tmp, &other] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::write(other.join("notes.md"), "theirs").unwrap();
    let sandbox = Sandbox {
        mode: SandboxMode::WorkspaceWrite,
        allow_network: false,
        unix_sockets: false,
    };
    let paths = SandboxPaths {
        hidden: vec![other.clone()],
        tmp: tmp.clone(),
        ..SandboxPaths::default()
    };
    let plan = || Setup::new(sandbox, &paths, &ws, &tmp, None).unwrap();
    // As planned: the view is made.
    held::hold(plan(), None).unwrap();
    // Moved away and a directory made in its place (another inode).
    let setup = plan();
    std::fs::rename(&other, root.join("moved")).unwrap();
    std::fs::create_dir(&other).unwrap();
    let err = held::hold(setup, None).unwrap_err().to_string();
    assert!(err.contains("was replaced or moved"), "{err}");
    // A symlink put in its place: not followed.
    let setup = plan();
    std::fs::remove_dir(&other).unwrap();
    std::os::unix::fs::symlink(root.join("moved"), &other).unwrap();
    let err = held::hold(setup, None).unwrap_err().to_string();
    assert!(err.contains("was replaced or moved"), "{err}");
}
