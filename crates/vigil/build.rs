//! Build script: the git commit vigil is built from, for `vigil --version`.
//!
//! Sets `VIGIL_GIT_COMMIT` to the short commit (`3a288c3`), with `-dirty` when the sources that go
//! into the binary differ from that commit, or to `unknown` when there is no git repository of this
//! workspace (a source tarball, `cargo install` from a registry) or no `git`. It never fails the
//! build. A packager can set `VIGIL_GIT_COMMIT` in the environment to name the commit themselves.
//!
//! Why so careful about reruns: every rerun of this script rebuilds the whole vigil package (its
//! integration tests too), so it reruns only when the answer can change: a new commit or checkout,
//! or a change to one of the source paths that the dirty check looks at.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The paths, relative to the workspace root, whose content is compiled into the binary: the dirty
/// check is limited to them, and a change to any of them reruns this script.
const SOURCES: &[&str] = &[
    "Cargo.toml",
    "Cargo.lock",
    "crates/vigil/Cargo.toml",
    "crates/vigil/build.rs",
    "crates/vigil/src",
    "crates/vigil-core/Cargo.toml",
    "crates/vigil-core/src",
    "crates/vigil-core/profiles",
];

fn main() {
    println!("cargo:rerun-if-env-changed=VIGIL_GIT_COMMIT");
    let commit = match std::env::var("VIGIL_GIT_COMMIT") {
        Ok(c) if !c.trim().is_empty() => c.trim().to_string(),
        _ => from_git().unwrap_or_else(|| "unknown".to_string()),
    };
    println!("cargo:rustc-env=VIGIL_GIT_COMMIT={commit}");
}

/// The short commit and the dirty mark, or `None` when this workspace is not a git checkout.
fn from_git() -> Option<String> {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR")?);
    let root = manifest.parent()?.parent()?.to_path_buf();
    for s in SOURCES {
        let p = root.join(s);
        if p.exists() {
            println!("cargo:rerun-if-changed={}", p.display());
        }
    }
    // Only this workspace's own repository counts: a tarball unpacked inside another git checkout
    // would otherwise be stamped with that checkout's commit.
    let top = git(&root, &["rev-parse", "--show-toplevel"])?;
    if !same_dir(Path::new(&top), &root) {
        return None;
    }
    // A new commit or checkout moves HEAD or the branch it points to; a worktree's HEAD lives in its
    // own git dir, the branches in the common one.
    let git_dir = abs(&root, &git(&root, &["rev-parse", "--git-dir"])?);
    let common = abs(&root, &git(&root, &["rev-parse", "--git-common-dir"])?);
    // (A path that does not exist would rerun this script on every build: only existing ones.)
    let mut watch = vec![git_dir.join("HEAD"), common.join("packed-refs")];
    if let Some(r) = git(&root, &["symbolic-ref", "-q", "HEAD"]) {
        watch.push(common.join(r));
    }
    for p in watch.iter().filter(|p| p.exists()) {
        println!("cargo:rerun-if-changed={}", p.display());
    }
    let short = git(&root, &["rev-parse", "--short", "HEAD"])?;
    // `--no-optional-locks`: a build must not rewrite the index (other git commands may be running).
    let mut args = vec!["--no-optional-locks", "status", "--porcelain", "--untracked-files=no", "--"];
    args.extend(SOURCES);
    let dirty = match git(&root, &args) {
        Some(s) => !s.is_empty(),
        None => false,
    };
    Some(if dirty { format!("{short}-dirty") } else { short })
}

/// Runs git in `dir`; its trimmed stdout on success, else `None` (no git, not a repository, ...).
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git").arg("-C").arg(dir).args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    Some(String::from_utf8(out.stdout).ok()?.trim().to_string())
}

fn abs(root: &Path, p: &str) -> PathBuf {
    let p = PathBuf::from(p);
    if p.is_absolute() {
        p
    } else {
        root.join(p)
    }
}

fn same_dir(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}
