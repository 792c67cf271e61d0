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

/// Creates a directory and its parents, mode 0700 (also when it already existed).
pub fn mkdir_private(p: &Path) -> Result<(), CliError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(p)
        .map_err(|e| CliError::usage(format!("cannot create {}: {e}", p.display())))?;
    let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o700));
    Ok(())
}
