//! Where vigil keeps what it knows between commands: the state directory (`$VIGIL_STATE_DIR`, else
//! `$XDG_STATE_HOME/vigil`, else `~/.local/state/vigil`: runs, secrets, the startup history), private
//! directories in it, and the wall clock its records are stamped with. A base module: every layer that
//! reads or writes state (the history store, the run directories, `check`'s disk check) finds it here.

use crate::error::CliError;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// The user's home: `$HOME`, else the password database.
fn home() -> Option<PathBuf> {
    if let Some(h) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        return Some(PathBuf::from(h));
    }
    // Under `env -i` HOME is unset: ask the password database.
    // SAFETY: getpwuid_r with buffers we own.
    unsafe {
        let mut pw: libc::passwd = std::mem::zeroed();
        let mut buf = vec![0 as libc::c_char; 4096];
        let mut out: *mut libc::passwd = std::ptr::null_mut();
        if libc::getpwuid_r(libc::getuid(), &mut pw, buf.as_mut_ptr(), buf.len(), &mut out) == 0 && !out.is_null() {
            let dir = std::ffi::CStr::from_ptr(pw.pw_dir).to_string_lossy().into_owned();
            return Some(PathBuf::from(dir));
        }
    }
    None
}

/// `$VIGIL_STATE_DIR`, else `$XDG_STATE_HOME/vigil`, else `~/.local/state/vigil`.
pub fn state_root() -> Result<PathBuf, CliError> {
    if let Some(d) = std::env::var_os("VIGIL_STATE_DIR").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_STATE_HOME").map(PathBuf::from).filter(|d| d.is_absolute()) {
        return Ok(d.join("vigil"));
    }
    home()
        .map(|h| h.join(".local/state/vigil"))
        .ok_or_else(|| CliError::usage("cannot find the state directory: set HOME, XDG_STATE_HOME or VIGIL_STATE_DIR"))
}

/// Creates a private directory (0700) and its missing parents. Under the state directory, the state
/// directory itself and every folder from it down to `p` must be the user's own ([`check_private`]);
/// elsewhere `p` itself must be.
pub fn mkdir_private(p: &Path) -> Result<(), CliError> {
    let root = state_root().ok();
    let (base, below) = match root.as_deref().and_then(|r| p.strip_prefix(r).ok().map(|b| (r, b))) {
        Some((r, b)) => (r.to_path_buf(), b.to_path_buf()),
        None => (p.to_path_buf(), PathBuf::new()),
    };
    if let Some(parent) = base.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .map_err(|e| CliError::usage(format!("cannot create {}: {e}", parent.display())))?;
    }
    let mut cur = base;
    create_private(&cur)?;
    for c in below.components() {
        cur.push(c);
        create_private(&cur)?;
    }
    Ok(())
}

/// Creates one folder (0700) unless it exists, then checks it.
fn create_private(p: &Path) -> Result<(), CliError> {
    match std::fs::DirBuilder::new().mode(0o700).create(p) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(CliError::usage(format!("cannot create {}: {e}", p.display()))),
    }
    check_private(p).map(|_| ())
}

/// Is `p` a folder no one else controls? A symlink, a folder owned by another user, or one writable by
/// group or others is refused with a one-line error (as ssh refuses such a `~/.ssh`: whoever can write
/// there can plant a symlink, or swap a run's record for one naming a process of theirs); a folder of the
/// user's that others may read is made 0700. Ok(false): `p` does not exist.
pub fn check_private(p: &Path) -> Result<bool, CliError> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::MetadataExt;
    let refuse = |why: String| CliError::usage(format!("refusing the state folder {}: {why}", p.display()));
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(|_| refuse("a NUL in its path".into()))?;
    // SAFETY: open with a valid C string; the descriptor is closed below.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC) };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return match std::fs::symlink_metadata(p) {
            // missing, or a path through a file: nothing to check (creating it says why it cannot be)
            Err(m) if m.kind() == std::io::ErrorKind::NotFound || m.raw_os_error() == Some(libc::ENOTDIR) => Ok(false),
            Ok(m) if m.file_type().is_symlink() => {
                Err(refuse("it is a symbolic link (vigil follows none in its state folder)".into()))
            }
            Ok(m) if !m.is_dir() => Err(refuse("it is not a folder".into())),
            _ => Err(refuse(format!("{e}"))),
        };
    }
    // SAFETY: the descriptor was just opened and is owned here.
    let f = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let m = f.metadata().map_err(|e| refuse(format!("{e}")))?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if m.uid() != me {
        return Err(refuse(format!("it is owned by uid {}, not by you (uid {me})", m.uid())));
    }
    if m.mode() & 0o022 != 0 {
        return Err(refuse(format!(
            "it is writable by {} (mode {:04o}): `chmod 700 {}`",
            if m.mode() & 0o002 != 0 { "others" } else { "its group" },
            m.mode() & 0o7777,
            p.display()
        )));
    }
    if m.mode() & 0o077 != 0 {
        let _ = f.set_permissions(std::fs::Permissions::from_mode(0o700));
    }
    Ok(true)
}

/// How [`open_private`] opens a file.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Access {
    /// Appends (a log, a record of events).
    Append,
    /// Reads and writes, keeping what is there (a lock, a database).
    ReadWrite,
    /// Writes from empty (a file written whole).
    Truncate,
}

/// Opens a private file (0600), creating it if missing, never through a symlink: `O_NOFOLLOW` (a link
/// planted at its name is refused, never followed) and `O_CLOEXEC`; a file that existed with other modes is
/// made 0600. Every file vigil creates in its state folder is opened here or written by `run::write_atomic`.
pub fn open_private(p: &Path, access: Access) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let mut o = std::fs::OpenOptions::new();
    match access {
        Access::Append => o.append(true),
        Access::ReadWrite => o.read(true).write(true).truncate(false),
        Access::Truncate => o.write(true).truncate(true),
    };
    let f = o.create(true).mode(0o600).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(p)?;
    if f.metadata()?.mode() & 0o777 != 0o600 {
        f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(f)
}

/// Writes a private file (0600) that is not a symlink ([`open_private`]), from empty.
pub fn write_private(p: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    open_private(p, Access::Truncate)?.write_all(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("vigil-state-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_folder_others_control_is_refused_and_ours_made_private() {
        let d = temp("private");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let ours = d.join("ours");
        std::fs::create_dir(&ours).unwrap();
        std::fs::set_permissions(&ours, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(check_private(&ours).unwrap());
        assert_eq!(mode(&ours), 0o700, "readable by others: made 0700");
        assert!(!check_private(&d.join("missing")).unwrap());
        for (m, why) in [(0o770, "its group"), (0o707, "others")] {
            let p = d.join(format!("open{m:o}"));
            std::fs::create_dir(&p).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(m)).unwrap();
            let e = check_private(&p).unwrap_err().message();
            assert!(e.contains(&format!("writable by {why}")), "{e}");
            assert_eq!(mode(&p), m, "a refused folder is left as it was");
        }
        std::os::unix::fs::symlink(&ours, d.join("link")).unwrap();
        let e = check_private(&d.join("link")).unwrap_err().message();
        assert!(e.contains("symbolic link"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_private_file_is_never_written_through_a_planted_link() {
        let d = temp("nofollow");
        let victim = d.join("victim");
        std::fs::write(&victim, "keep").unwrap();
        std::os::unix::fs::symlink(&victim, d.join("evidence.txt")).unwrap();
        assert!(write_private(&d.join("evidence.txt"), b"x").is_err());
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        write_private(&d.join("new.txt"), b"y").unwrap();
        assert_eq!(std::fs::metadata(d.join("new.txt")).unwrap().permissions().mode() & 0o777, 0o600);
        let _ = std::fs::remove_dir_all(&d);
    }
}
