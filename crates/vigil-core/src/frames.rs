//! The frame table (issue #24): a Python traceback frame (`File ".../vllm/v1/worker/gpu_worker.py", line N, in
//! determine_available_memory`) -> the phase the process was in, generated from the servers' own source by
//! `scripts/frames/gen.py` (`profiles/frames.tsv`; the entries it walks from are each profile's
//! `[[frame_entry]]`). The judge takes the innermost frame the table knows (see `judge.rs`).

use crate::types::Phase;
use std::collections::HashMap;
use std::sync::OnceLock;

/// The generated table, built in.
pub const FRAMES_TSV: &str = include_str!("../profiles/frames.tsv");

/// One row: which server's source it was read from, and the phase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameRow {
    pub server: &'static str,
    pub phase: Phase,
}

/// (file under the package's parent, function name) -> row.
pub struct FrameTable {
    rows: HashMap<&'static str, HashMap<&'static str, FrameRow>>,
    /// The package folders the table's files start with (`sglang`, `vllm`, `text_generation_server`), each
    /// with its `/name/` needle.
    packages: Vec<(&'static str, String)>,
}

impl FrameTable {
    pub fn parse(text: &'static str) -> Result<FrameTable, String> {
        let mut rows = HashMap::new();
        let mut packages: Vec<(&'static str, String)> = Vec::new();
        for (i, l) in text.lines().enumerate() {
            if l.starts_with('#') || l.trim().is_empty() {
                continue;
            }
            let f: Vec<&'static str> = l.split('\t').collect();
            if f.len() != 5 {
                return Err(format!("frames.tsv line {}: {} fields, want 5", i + 1, f.len()));
            }
            let phase = Phase::parse(f[3]).ok_or_else(|| format!("frames.tsv line {}: phase {}", i + 1, f[3]))?;
            let pkg = f[1].split('/').next().unwrap_or("");
            if !packages.iter().any(|(p, _)| *p == pkg) {
                packages.push((pkg, format!("/{pkg}/")));
            }
            rows.entry(f[1]).or_insert_with(HashMap::new).insert(f[2], FrameRow { server: f[0], phase });
        }
        Ok(FrameTable { rows, packages })
    }

    /// The built-in table.
    pub fn builtin() -> &'static FrameTable {
        static T: OnceLock<FrameTable> = OnceLock::new();
        T.get_or_init(|| FrameTable::parse(FRAMES_TSV).expect("profiles/frames.tsv is valid"))
    }

    pub fn len(&self) -> usize {
        self.rows.values().map(HashMap::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The row for a traceback frame line's message, if it names a function the table knows.
    pub fn lookup(&self, message: &str) -> Option<(&FrameRow, &'static str, &'static str)> {
        let (file, func) = self.locate(message)?;
        self.get(file, func)
    }

    /// A frame line's file as the table names it (`sglang/srt/...`, when the table has that file) and its
    /// function: one parse, no allocation.
    pub fn locate<'m>(&self, message: &'m str) -> Option<(&'static str, &'m str)> {
        let (path, func) = parse_frame(message)?;
        self.packages.iter().find_map(|(pkg, needle)| {
            // The last `/<pkg>/` of the path starts the package (a checkout `vllm/vllm/v1/...` too).
            let i = path.rfind(needle.as_str()).map(|i| i + 1).or_else(|| path.starts_with(pkg).then_some(0))?;
            self.rows.get_key_value(&path[i..]).map(|(f, _)| (*f, func))
        })
    }

    /// The row for `func` of `file` (a table file).
    pub fn get(&self, file: &str, func: &str) -> Option<(&FrameRow, &'static str, &'static str)> {
        let (f, funcs) = self.rows.get_key_value(file)?;
        let (n, row) = funcs.get_key_value(func)?;
        Some((row, f, n))
    }
}

/// `File "<path>", line <n>, in <func>` anywhere in the message (CPython's traceback frame line; faulthandler's
/// dump writes `line <n> in <func>`, no comma) -> (path, func).
pub fn parse_frame(message: &str) -> Option<(&str, &str)> {
    let i = message.find("File \"")?;
    let rest = &message[i + 6..];
    let q = rest.find('"')?;
    let path = &rest[..q];
    let after = rest[q + 1..].trim_start_matches(',').trim_start();
    let after = after.strip_prefix("line ")?;
    let digits = after.len() - after.trim_start_matches(|c: char| c.is_ascii_digit()).len();
    if digits == 0 {
        return None;
    }
    let after = after[digits..].trim_start_matches(',').trim_start().strip_prefix("in ")?;
    let func = after.split_whitespace().next()?;
    Some((path, func))
}

/// The function a traceback's code line calls: `    self.load_model()`, `x = init_worker(...)` -> the last
/// name before the first `(` (a method of the frame's own file when called on `self`).
pub fn called(code: &str) -> Option<&str> {
    let t = code.trim_start();
    let p = t.find('(')?;
    let head = &t[..p];
    let name_start = head.rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).map_or(0, |i| i + 1);
    let name = &head[name_start..];
    (!name.is_empty() && !name.starts_with(|c: char| c.is_ascii_digit())).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_lines_parse() {
        assert_eq!(
            parse_frame(
                r#"  File "/usr/lib/python3/dist-packages/vllm/v1/worker/gpu_worker.py", line 12, in load_model"#
            ),
            Some(("/usr/lib/python3/dist-packages/vllm/v1/worker/gpu_worker.py", "load_model"))
        );
        assert_eq!(
            parse_frame(r#"(EngineCore pid=1)   File "/a/b.py", line 3, in <module>"#),
            Some(("/a/b.py", "<module>"))
        );
        assert_eq!(
            parse_frame(r#"  File "/a/sglang/srt/x.py", line 7 in event_loop"#),
            Some(("/a/sglang/srt/x.py", "event_loop"))
        );
        assert_eq!(parse_frame("File not found"), None);
        assert_eq!(called("    self.maybe_init_draft_worker()"), Some("maybe_init_draft_worker"));
        assert_eq!(called("    scheduler = Scheduler("), Some("Scheduler"));
        assert_eq!(called("    return"), None);
        assert_eq!(parse_frame(r#"File "x", says nothing, in it"#), None);
    }

    #[test]
    fn builtin_table_loads_and_covers_every_server() {
        let t = FrameTable::builtin();
        assert!(t.len() > 100, "{} rows", t.len());
        for s in ["sglang", "vllm", "tgi"] {
            assert!(t.rows.values().flat_map(|m| m.values()).any(|r| r.server == s), "no rows for {s}");
        }
    }

    #[test]
    fn no_model_forward_is_placed_in_a_phase() {
        // torch runs a module's forward for the KV-cache profiling, the capture and every request alike: a
        // fused-MoE layer's forward once read as `weights` (scripts/frames/gen.py DISPATCHED).
        let t = FrameTable::builtin();
        let bad: Vec<String> = t
            .rows
            .iter()
            .flat_map(|(f, m)| m.keys().map(move |n| (*f, *n)))
            .filter(|(f, n)| {
                (f.contains("/models/") || f.contains("/layers/")) && (*n == "forward" || *n == "__call__")
            })
            .map(|(f, n)| format!("{f} {n}"))
            .collect();
        assert!(bad.is_empty(), "{bad:?}");
    }

    #[test]
    fn lookup_takes_the_last_package_folder_of_the_path() {
        let t = FrameTable::parse("sglang\tsglang/srt/a.py\tf\tweights\t1\n").unwrap();
        let l = r#"  File "/ws/sglang/python/sglang/srt/a.py", line 1, in f"#;
        assert_eq!(t.lookup(l).map(|r| r.0.phase), Some(Phase::Weights));
        assert!(t.lookup(r#"  File "/ws/sglang/srt/b.py", line 1, in f"#).is_none());
    }
}
