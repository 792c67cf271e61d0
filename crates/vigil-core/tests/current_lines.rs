//! The newest releases' startup lines, phase by phase.
//!
//! The corpus comes from public issue trackers, which lean to older message families. Each file in
//! `tests/current-lines/` is one startup of a server's newest release, written from the format strings of its
//! wheel in source order (each row names the file and line). The text is fed without naming the server;
//! after each line the offline verdict and phase must be the row's (or one of its `|` alternatives).

use std::path::PathBuf;
use vigil_core::{Offline, Profiles};

#[test]
fn newest_releases_startup_lines_reach_their_phases() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/current-lines");
    let profiles = Profiles::builtin();
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    assert!(files.len() >= 2, "expected startups in {}", dir.display());
    let mut wrong = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let rows: Vec<(&str, &str, &str)> = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .map(|l| {
                let mut it = l.splitn(3, '\t');
                (it.next().unwrap(), it.next().expect("source column"), it.next().expect("line column"))
            })
            .collect();
        assert!(rows.len() >= 10, "{}: a whole startup has more lines", f.display());
        for i in 0..rows.len() {
            let mut o = Offline::new(&profiles, None);
            for (_, _, line) in &rows[..=i] {
                o.push(line, &mut |_| {});
            }
            let r = o.finish(&mut |_| {});
            let got = format!("{}/{}", r.verdict.as_str(), r.phase.as_str());
            let (want, source, line) = rows[i];
            if !want.split('|').any(|w| w == got) {
                wrong.push(format!(
                    "{} line {} ({source}): got {got}, want {want}\n    {line}",
                    f.file_name().unwrap().to_string_lossy(),
                    i + 1
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "newest-release lines read wrong:\n{}", wrong.join("\n"));
}
