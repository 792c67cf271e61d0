//! The server's process tree as a fact: which of its processes are engines, and when one dies.
//!
//! An engine is a process of the tree that held GPU memory in some sample, or whose title matches one
//! of the profile's `engine_titles` (SGLang's `sglang::scheduler_TP3`, vLLM's `VLLM::EngineCore`).
//! Every other child (a compiler, a tokenizer pool, a `nvidia-smi` the server ran) may come and go:
//! it holds no GPU memory and has no engine title, so it is never an engine. The death of an engine
//! while the server's root process lives is an [`EngineDeath`], which the judge turns into a verdict.
//! Pure: samples come in with their time.

use regex::Regex;
use serde::Serialize;
use std::collections::BTreeMap;

/// One process of the tree (the root excluded) in one sample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcSample {
    pub pid: i32,
    /// Start time (clock ticks after boot): a pid reused by a new process is another process.
    pub start: u64,
    /// The title: `/proc/PID/cmdline` with NULs as spaces (what `ps` shows), bounded by the reader.
    pub title: String,
    /// GPU memory this process holds, in MiB (0 when unknown or none).
    pub gpu_mib: u64,
}

/// One sample of the tree below the server's root process.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TreeSample {
    /// The root (the server process vigil watches) was alive when the sample was taken.
    pub root_alive: bool,
    pub procs: Vec<ProcSample>,
}

/// Why a process counts as an engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineBy {
    /// Its title matches the profile's `engine_titles`.
    Title,
    /// It held GPU memory.
    Gpu,
}

/// An engine process of the tree, recognised.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EngineSeen {
    pub pid: i32,
    pub title: String,
    pub by: EngineBy,
}

/// An engine process of the tree that disappeared while the root lived.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EngineDeath {
    pub pid: i32,
    pub title: String,
    pub by: EngineBy,
    /// The most GPU memory it was seen holding (MiB).
    pub gpu_mib: u64,
    /// Milliseconds between the first sample that saw it and the sample that missed it.
    pub lived_ms: u64,
}

impl EngineDeath {
    /// "engine process `VLLM::EngineCore` (pid 4242, held 70.0 GiB of GPU memory)".
    pub fn describe(&self) -> String {
        let mut s = format!("engine process `{}` (pid {}", short_title(&self.title), self.pid);
        if self.gpu_mib > 0 {
            s.push_str(&format!(", held {:.1} GiB of GPU memory", self.gpu_mib as f64 / 1024.0));
        }
        s.push(')');
        s
    }
}

/// The first line of a title, at most 80 characters: the name, not the whole command line.
pub fn short_title(t: &str) -> String {
    let t = t.trim();
    // `python -c CODE` puts a whole program in the command line: its first line names it
    let t = t.lines().next().unwrap_or("").trim();
    match t.char_indices().nth(80) {
        Some((i, _)) => format!("{}…", &t[..i]),
        None => t.to_string(),
    }
}

#[derive(Debug, Clone)]
struct Known {
    title: String,
    by: Option<EngineBy>,
    /// Told to the caller by [`TreeWatch::new_engines`].
    told: bool,
    gpu_mib: u64,
    first_at: u64,
}

/// Follows the tree across samples.
#[derive(Debug, Clone)]
pub struct TreeWatch {
    titles: Vec<Regex>,
    known: BTreeMap<(i32, u64), Known>,
}

impl TreeWatch {
    pub fn new(titles: Vec<Regex>) -> TreeWatch {
        TreeWatch { titles, known: BTreeMap::new() }
    }

    /// Replaces the title patterns (the server kind became known from the log); what was seen stays.
    pub fn set_titles(&mut self, titles: &[Regex]) {
        let same =
            titles.len() == self.titles.len() && titles.iter().zip(&self.titles).all(|(a, b)| a.as_str() == b.as_str());
        if !same {
            self.titles = titles.to_vec();
        }
    }

    /// Engines recognised since the last call (each told once), in pid order.
    pub fn new_engines(&mut self) -> Vec<EngineSeen> {
        let mut v = Vec::new();
        for ((pid, _), k) in self.known.iter_mut() {
            if let (Some(by), false) = (k.by, k.told) {
                k.told = true;
                v.push(EngineSeen { pid: *pid, title: k.title.clone(), by });
            }
        }
        v
    }

    /// Engines seen so far (alive at the last sample).
    pub fn engines(&self) -> Vec<(i32, String)> {
        self.known.iter().filter(|(_, k)| k.by.is_some()).map(|((pid, _), k)| (*pid, k.title.clone())).collect()
    }

    /// Takes one sample at `at` (ms); gives the engines that died since the last one, while the root lives.
    /// A sample taken after the root died says nothing about engines: the server's own exit is the fact then.
    pub fn observe(&mut self, at: u64, s: &TreeSample) -> Vec<EngineDeath> {
        let mut seen = BTreeMap::new();
        for p in &s.procs {
            let key = (p.pid, p.start);
            let k = self.known.remove(&key).unwrap_or(Known {
                title: p.title.clone(),
                by: None,
                told: false,
                gpu_mib: 0,
                first_at: at,
            });
            let mut k = k;
            // setproctitle runs after the fork: the title may change between samples; the latest wins.
            if !p.title.is_empty() {
                k.title = p.title.clone();
            }
            k.gpu_mib = k.gpu_mib.max(p.gpu_mib);
            if self.titles.iter().any(|r| r.is_match(&k.title)) {
                k.by = Some(EngineBy::Title);
            } else if p.gpu_mib > 0 && k.by.is_none() {
                k.by = Some(EngineBy::Gpu);
            }
            seen.insert(key, k);
        }
        let gone = std::mem::replace(&mut self.known, seen);
        if !s.root_alive {
            return vec![];
        }
        gone.into_iter()
            .filter_map(|((pid, _), k)| {
                Some(EngineDeath {
                    pid,
                    title: k.title,
                    by: k.by?,
                    gpu_mib: k.gpu_mib,
                    lived_ms: at.saturating_sub(k.first_at),
                })
            })
            .collect()
    }
}
