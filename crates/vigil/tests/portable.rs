//! The release binary users copy to GPU nodes runs on glibc 2.28 and newer: it needs no glibc
//! symbol version above 2.28 (checked with `objdump -T`, as the README says), and it runs.
//! The binary is built by scripts/build-portable.sh (cargo-zigbuild); test.sh passes its path in
//! VIGIL_PORTABLE_BIN. Under CI=true a missing binary fails.

use std::process::Command;

fn version_tuple(v: &str) -> Vec<u32> {
    v.split('.').filter_map(|x| x.parse().ok()).collect()
}

/// The highest `GLIBC_x.y` version an ELF binary's dynamic symbols need.
fn max_glibc(objdump_t: &str) -> Option<String> {
    let mut best: Option<String> = None;
    for w in objdump_t.split(|c: char| c.is_whitespace() || c == '(' || c == ')') {
        if let Some(v) = w.strip_prefix("GLIBC_") {
            if v.chars().next().is_some_and(|c| c.is_ascii_digit())
                && best.as_deref().is_none_or(|b| version_tuple(v) > version_tuple(b))
            {
                best = Some(v.to_string());
            }
        }
    }
    best
}

#[test]
fn max_glibc_reads_objdump() {
    let sample = "0000 DF *UND* 0000 (GLIBC_2.2.5) malloc\n0000 DF *UND* 0000 (GLIBC_2.28) statx\n0000 DF *UND* 0000 GLIBC_2.18 __cxa_thread_atexit_impl\n0000 DF *UND* (GLIBC_PRIVATE) x\n";
    assert_eq!(max_glibc(sample).as_deref(), Some("2.28"));
    assert_eq!(max_glibc("(GLIBC_2.9) a\n(GLIBC_2.34) b\n").as_deref(), Some("2.34"), "2.34 > 2.9 as versions");
}

#[test]
fn portable_release_needs_glibc_2_28_at_most() {
    let Ok(bin) = std::env::var("VIGIL_PORTABLE_BIN") else {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("VIGIL_PORTABLE_BIN not set: test.sh builds it with scripts/build-portable.sh");
        }
        eprintln!("SKIP: VIGIL_PORTABLE_BIN not set (scripts/build-portable.sh)");
        return;
    };
    let out = Command::new("objdump").arg("-T").arg(&bin).output().expect("objdump (binutils)");
    assert!(out.status.success(), "objdump -T {bin}: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let max = max_glibc(&text).expect("a dynamically linked binary names GLIBC versions");
    assert!(version_tuple(&max) <= vec![2, 28], "{bin} needs GLIBC_{max}");
    let v = Command::new(&bin).arg("--version").output().unwrap();
    assert!(v.status.success());
    assert!(String::from_utf8_lossy(&v.stdout).starts_with("vigil "));
    let p = Command::new(&bin).arg("profiles").output().unwrap();
    assert!(String::from_utf8_lossy(&p.stdout).contains("sglang"), "the portable build carries the profiles");
}
