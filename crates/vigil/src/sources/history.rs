//! The startup history's facts (docs/history.md): the SQLite store of past startups, what a start is made
//! of (its key and facts, gathered from the command line, the environment, the model's files and the log),
//! the recorder that a watch feeds (a `sinks::sink::Sink` too: it records the verdict), and a log read
//! offline (`history import`, `timeline`). The judgement (baseline, slow, ETA, learned stall limits, what
//! changed) is in `vigil_core::history`; this module only gathers and stores. How history reads to people
//! is `sinks::history`; the `history` command is `commands::history`.

use crate::error::CliError;
use regex::Regex;
use rusqlite::{params, Connection, TransactionBehavior};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;
use vigil_core::history::{self as core, Baseline, Key, Startup};
use vigil_core::judge::fmt_ms;
use vigil_core::profile::HistorySpec;
use vigil_core::{Judge, Phase, Profiles, Report};

/// Startups kept per key; older ones are pruned on each insert.
pub const KEEP_PER_KEY: usize = 200;
/// How long a writer waits for another's lock before giving up (two vigils finishing at once).
const BUSY: Duration = Duration::from_secs(10);
/// Versions and the arguments line are looked for in a startup's first lines only (they print them
/// first); past these, log lines cost the history nothing.
const SCAN_LINES: usize = 20_000;
/// The largest config file or GGUF header hashed.
const MAX_HASHED: u64 = 64 << 20;

// ---------------------------------------------------------------- the store

/// Where the store is: `$VIGIL_HISTORY`, else `history.db` in the state directory; when that is on a
/// network filesystem (SQLite's locks are unreliable there), a per-host file under /var/tmp, with a
/// note saying so.
pub fn store_path() -> Result<(PathBuf, Option<String>), CliError> {
    if let Some(p) = std::env::var_os("VIGIL_HISTORY").filter(|p| !p.is_empty()) {
        return Ok((PathBuf::from(p), None));
    }
    let root = crate::state::state_root()?;
    let mut probe = root.clone();
    while !probe.exists() {
        match probe.parent() {
            Some(p) => probe = p.to_path_buf(),
            None => break,
        }
    }
    if crate::sources::follow::network_fs_path(&probe) {
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        let p = PathBuf::from(format!("/var/tmp/vigil-{uid}")).join(format!("history-{}.db", hostname()));
        let note = format!(
            "history: {} is on a network filesystem, where SQLite's locking is unreliable: the store is kept on this host at {}",
            root.display(),
            p.display()
        );
        return Ok((p, Some(note)));
    }
    Ok((root.join("history.db"), None))
}

pub fn hostname() -> String {
    let mut b = [0u8; 256];
    // SAFETY: gethostname writes at most len bytes into a buffer we own.
    if unsafe { libc::gethostname(b.as_mut_ptr().cast(), b.len()) } == 0 {
        let n = b.iter().position(|c| *c == 0).unwrap_or(b.len());
        if let Ok(s) = std::str::from_utf8(&b[..n]) {
            return s.to_string();
        }
    }
    "localhost".into()
}

pub struct Store {
    conn: Connection,
    pub path: PathBuf,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS startups (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  name TEXT NOT NULL,
  key_id TEXT NOT NULL,
  server TEXT NOT NULL,
  model TEXT NOT NULL,
  host TEXT NOT NULL,
  verdict TEXT NOT NULL,
  cause TEXT,
  total_ms INTEGER,
  started_unix_ms INTEGER NOT NULL,
  record TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS startups_related ON startups(server, model);
CREATE INDEX IF NOT EXISTS startups_key ON startups(key_id);
CREATE TABLE IF NOT EXISTS phases (
  startup INTEGER NOT NULL REFERENCES startups(id) ON DELETE CASCADE,
  phase TEXT NOT NULL,
  ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS phases_startup ON phases(startup);
";

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _)
        if matches!(f.code, rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked))
}

fn db_err(path: &Path) -> impl Fn(rusqlite::Error) -> String + '_ {
    move |e| format!("{}: {e}", path.display())
}

impl Store {
    /// Opens (creating) the store: WAL, so readers never block the writer, and a busy timeout, so two
    /// vigils writing at once wait for each other instead of losing a record.
    pub fn open(path: &Path) -> Result<Store, String> {
        if let Some(d) = path.parent().filter(|d| !d.as_os_str().is_empty() && !d.exists()) {
            crate::state::mkdir_private(d).map_err(|e| e.message())?;
        }
        // Two vigils opening a new store at once race to switch it to WAL and create its tables; a step
        // the busy handler does not cover (the journal-mode switch, a schema read upgraded to a write)
        // answers BUSY at once: the whole open is tried again until the busy deadline.
        let t0 = std::time::Instant::now();
        loop {
            match Self::try_open(path) {
                Ok(s) => return Ok(s),
                Err(e) if is_busy(&e) && t0.elapsed() < BUSY => std::thread::sleep(Duration::from_millis(10)),
                Err(e) => return Err(db_err(path)(e)),
            }
        }
    }

    fn try_open(path: &Path) -> rusqlite::Result<Store> {
        // created 0600 before SQLite opens it (its -wal and -shm files take the database's mode), never
        // through a planted link
        crate::state::open_private(path, crate::state::Access::ReadWrite)
            .map_err(|e| rusqlite::Error::InvalidPath(format!("{}: {e}", path.display()).into()))?;
        let conn = Connection::open(path)?;
        conn.busy_timeout(BUSY)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        // WAL with synchronous=NORMAL: a commit does not wait for an fsync (the readiness verdict is not held
        // up by the disk) and the file is never corrupted; a power loss may drop the newest record.
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        // No checkpoint when vigil closes the store: it ran on every exit (an fsync of the database, 15 ms
        // between the verdict and the exit here); SQLite checkpoints on its own as the log grows.
        conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        // the schema in one write transaction taken up front (the busy handler covers BEGIN IMMEDIATE)
        conn.execute_batch(&format!("BEGIN IMMEDIATE; {SCHEMA} COMMIT;"))?;
        Ok(Store { conn, path: path.to_path_buf() })
    }

    pub fn open_default() -> Result<(Store, Option<String>), String> {
        let (p, note) = store_path().map_err(|e| e.message())?;
        Ok((Store::open(&p)?, note))
    }

    /// Records one startup and prunes its key to the newest `KEEP_PER_KEY`, in one transaction.
    pub fn insert(&mut self, s: &Startup) -> Result<(), String> {
        let path = self.path.clone();
        let err = db_err(&path);
        let json = serde_json::to_string(s).map_err(|e| e.to_string())?;
        let key_id = s.key.id();
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(&err)?;
        tx.execute(
            "INSERT INTO startups (name, key_id, server, model, host, verdict, cause, total_ms, started_unix_ms, record)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            params![
                s.name,
                key_id,
                s.key.server,
                s.key.model,
                s.key.host,
                s.verdict.as_str(),
                s.cause.map(|c| c.as_str()),
                s.total_ms.map(|t| t as i64),
                s.started_unix_ms as i64,
                json
            ],
        )
        .map_err(&err)?;
        let id = tx.last_insert_rowid();
        for (p, ms) in &s.phases {
            tx.execute(
                "INSERT INTO phases (startup, phase, ms) VALUES (?1, ?2, ?3)",
                params![id, p.as_str(), *ms as i64],
            )
            .map_err(&err)?;
        }
        tx.execute(
            "DELETE FROM startups WHERE key_id = ?1 AND id NOT IN
               (SELECT id FROM startups WHERE key_id = ?1 ORDER BY id DESC LIMIT ?2)",
            params![key_id, KEEP_PER_KEY as i64],
        )
        .map_err(&err)?;
        tx.commit().map_err(&err)
    }

    fn query(&self, sql: &str, p: &[&dyn rusqlite::ToSql]) -> Result<Vec<Startup>, String> {
        let err = db_err(&self.path);
        let mut st = self.conn.prepare(sql).map_err(&err)?;
        let rows = st.query_map(p, |r| r.get::<_, String>(0)).map_err(&err)?;
        let mut out = Vec::new();
        for r in rows {
            let text = r.map_err(&err)?;
            // a record a newer vigil wrote with fields this one does not know still reads
            if let Ok(s) = serde_json::from_str::<Startup>(&text) {
                out.push(s);
            }
        }
        Ok(out)
    }

    /// Startups of the same server and model (the key's relatives), oldest first.
    pub fn related(&self, server: &str, model: &str) -> Result<Vec<Startup>, String> {
        self.query("SELECT record FROM startups WHERE server = ?1 AND model = ?2 ORDER BY id", &[&server, &model])
    }

    /// Every startup, or those of one name, oldest first.
    pub fn list(&self, name: Option<&str>) -> Result<Vec<Startup>, String> {
        match name {
            Some(n) => self.query("SELECT record FROM startups WHERE name = ?1 ORDER BY id", &[&n]),
            None => self.query("SELECT record FROM startups ORDER BY id", &[]),
        }
    }
}

// ---------------------------------------------------------------- what a start is made of

/// Turns `--tp-size`, `-tp`, `tp_size` into one name; `aliases` maps every spelling the profile lists
/// to its first (canonical) one.
fn norm(flag: &str) -> String {
    flag.trim_start_matches('-').replace('-', "_")
}

fn aliases(spec: &HistorySpec) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    for group in spec.key_flags.iter().chain(&spec.model_flags).chain(&spec.draft_flags) {
        let names: Vec<&str> = group.split('|').collect();
        for n in &names {
            m.entry(norm(n)).or_insert_with(|| norm(names[0]));
        }
    }
    m
}

fn first_of(group: &str) -> String {
    norm(group.split('|').next().unwrap_or(group))
}

/// `--flag value`, `--flag=value` and bare `--switch` (= "true") from a command line, names normalised.
fn parse_argv(argv: &[String], al: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut i = 1;
    while i < argv.len() {
        let a = &argv[i];
        if a.starts_with('-') && a.len() > 1 && a.parse::<f64>().is_err() {
            let (name, inline) = match a.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (a.as_str(), None),
            };
            let n = norm(name);
            let n = al.get(&n).cloned().unwrap_or(n);
            let v = match inline {
                Some(v) => v,
                None => match argv.get(i + 1) {
                    Some(next) if !next.starts_with('-') || next.parse::<f64>().is_ok() => {
                        i += 1;
                        next.clone()
                    }
                    _ => "true".into(),
                },
            };
            out.insert(n, v);
        }
        i += 1;
    }
    out
}

/// `name=value`, `'name': value` and `name: value` pairs of an arguments log line (SGLang's
/// `server_args=ServerArgs(…)`, vLLM's `non-default args: {…}`, TGI's `Args { … }`). `None` values
/// are left out; `Some(x)` is x; quotes go.
/// The flags of a start as facts (issue #33): what the launch command set, when there is one (what the user
/// set); else what the server printed of its arguments (a run vigil attached to). Which of the two is noted
/// (`from:flags`): a flag missing from a log is no change, one dropped from a command line is.
fn flag_facts(
    argv_args: &BTreeMap<String, String>,
    log_args: &BTreeMap<String, String>,
    facts: &mut BTreeMap<String, String>,
) {
    let (from, args) = if argv_args.is_empty() { ("log", log_args) } else { ("command", argv_args) };
    for (k, v) in args {
        facts.insert(format!("flag:{k}"), v.clone());
    }
    facts.insert(core::FROM_FLAGS.into(), from.into());
}

pub fn parse_args_text(text: &str, al: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    static PAIR: std::sync::OnceLock<Regex> = std::sync::OnceLock::new();
    let re = PAIR.get_or_init(|| {
        Regex::new(r#"['"]?(?P<k>[A-Za-z_][A-Za-z0-9_]*)['"]?\s*(?:=|:)\s*(?P<v>'[^']*'|"[^"]*"|\[[^\]]*\]|Some\([^)]*\)|[^,}\)\s][^,}\)]*)"#)
            .expect("static regex")
    });
    let mut out = BTreeMap::new();
    for c in re.captures_iter(text) {
        let k = norm(&c["k"]);
        let mut v = c["v"].trim().to_string();
        if let Some(inner) = v.strip_prefix("Some(").and_then(|x| x.strip_suffix(')')) {
            v = inner.to_string();
        }
        let v = v.trim_matches(|ch| ch == '\'' || ch == '"').to_string();
        if v == "None" {
            continue;
        }
        let k = al.get(&k).cloned().unwrap_or(k);
        // an `api_key='…'` in SGLang's server_args never reaches the store
        let v = if secret_arg(&k) { "***".to_string() } else { v };
        out.entry(k).or_insert(v);
    }
    out
}

/// An argument whose value is a secret (`api_key`, `hf_token`, `admin_api_key`, `api_keys`, `…password…`).
fn secret_arg(name: &str) -> bool {
    let u = name.to_ascii_uppercase();
    crate::sinks::redact::secret_var(&u) || u == "TOKEN" || u.ends_with("API_KEYS") || u.contains("API_KEY")
}

fn expand_home(p: &str, home: Option<&str>) -> Option<PathBuf> {
    let user = std::env::var("USER").unwrap_or_default();
    let p = p.replace("{user}", &user);
    match p.strip_prefix("~/") {
        Some(rest) => home.map(|h| Path::new(h).join(rest)),
        None => Some(PathBuf::from(p)),
    }
}

/// A directory that is missing or holds nothing: the cache it is for starts cold.
fn empty_dir(p: &Path) -> bool {
    match std::fs::read_dir(p) {
        Ok(mut it) => it.next().is_none(),
        Err(_) => true,
    }
}

/// FNV-1a of a small file (a model's config.json), or of a GGUF file's header (metadata and tensor
/// table, never the weights): a change of one key changes it.
fn config_hash(model: &Path) -> Option<String> {
    // never a FIFO or a device: opening one could block the watch (a model on slow storage)
    let (file, max) = if model.is_dir() {
        (model.join("config.json"), 4 << 20)
    } else if model.extension().is_some_and(|e| e == "gguf") && model.metadata().is_ok_and(|m| m.is_file()) {
        let info = crate::sources::gguf::read(model).ok()?;
        (model.to_path_buf(), info.header_end.min(MAX_HASHED))
    } else {
        return None;
    };
    let f = crate::sources::procs::open_regular(&file).ok()?;
    let mut buf = Vec::new();
    use std::io::Read;
    f.take(max).read_to_end(&mut buf).ok()?;
    Some(format!("{:016x}", core::fnv1a(&buf)))
}

fn model_bytes(model: &Path) -> Option<u64> {
    let m = std::fs::metadata(model).ok()?;
    if m.is_file() {
        return Some(m.len());
    }
    let mut total = 0u64;
    for e in std::fs::read_dir(model).ok()?.take(10_000).flatten() {
        if let Ok(md) = e.metadata() {
            if md.is_file() {
                total += md.len();
            }
        }
    }
    Some(total)
}

/// The inputs of a key, as known at a moment.
struct Made {
    key: Key,
    facts: BTreeMap<String, String>,
}

/// The environment of the server: its own (/proc/PID/environ, bounded) when we know its pid, else ours
/// (`vigil up` passes its environment on).
fn server_env(pid: Option<i32>) -> Vec<(String, String)> {
    if let Some(p) = pid {
        if let Ok(b) = crate::sources::procs::read_small(Path::new(&format!("/proc/{p}/environ")), 1 << 20) {
            return b
                .split(|c| *c == 0)
                .filter_map(|kv| {
                    let s = String::from_utf8_lossy(kv);
                    s.split_once('=').map(|(k, v)| (k.to_string(), v.to_string()))
                })
                .collect();
        }
    }
    std::env::vars().collect()
}

// ---------------------------------------------------------------- the recorder

/// The recorder is the first sink a watch tells of its verdict: the startup is recorded (once).
impl crate::sinks::sink::Sink for Recorder {
    fn verdict(&mut self, _t_ms: u64, r: &Report) {
        self.finish(r);
    }
}

/// Gathers one startup while a watch runs, gives the judge its history, records the verdict.
pub struct Recorder {
    name: String,
    server: Option<String>,
    spec: HistorySpec,
    aliases: BTreeMap<String, String>,
    argv_args: BTreeMap<String, String>,
    argv: Vec<String>,
    log_args: BTreeMap<String, String>,
    env: Vec<(String, String)>,
    host: String,
    gpu: Option<String>,
    gpus: u32,
    cold: bool,
    started_unix_ms: u64,
    versions: BTreeMap<String, String>,
    version_res: Vec<(String, Regex)>,
    args_res: Vec<Regex>,
    /// The --stall phases (never overridden by a learned limit); `all`: a global --stall was given.
    keep: BTreeSet<Phase>,
    stall_all: bool,
    slow_floor_ms: u64,
    stall_floor_ms: u64,
    /// Set once the judge got its history (at start, or once the log told the arguments).
    applied: bool,
    /// Something the key depends on changed (the kind detected, the arguments line read): try again.
    dirty: bool,
    /// Lines looked at for versions and arguments: only a startup's first `SCAN_LINES` print them.
    scanned: usize,
    last_good_facts: Option<BTreeMap<String, String>>,
    snap: Option<Measures>,
    repairs: Vec<String>,
    done: bool,
    store: Option<Store>,
    pub notes: Vec<String>,
    /// Config hashes by path, read once: the key is made at start and again at the verdict, and hashing a
    /// GGUF header (its whole vocabulary) there would delay the verdict by milliseconds.
    hashes: std::cell::RefCell<BTreeMap<PathBuf, Option<String>>>,
}

#[derive(Clone)]
struct Measures {
    gaps: BTreeMap<Phase, u64>,
    rates: BTreeMap<Phase, f64>,
    gpu: BTreeMap<Phase, u64>,
    ranks: BTreeMap<String, Vec<(Phase, Option<u64>)>>,
}

/// `VIGIL_SLOW_FLOOR` / `VIGIL_STALL_FLOOR`: the floors of docs/history.md, as durations.
fn floor(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|v| vigil_core::limits::parse_duration(&v).ok())
        .map(|d| d.as_millis() as u64)
        .unwrap_or(default)
}

pub struct Setup<'a> {
    pub profiles: &'a Profiles,
    pub server: Option<&'a str>,
    pub argv: &'a [String],
    pub pid: Option<i32>,
    pub name: &'a str,
    /// A remote run: the host it runs on (its key says so; recorded locally).
    pub remote_host: Option<&'a str>,
    pub stall_phases: BTreeSet<Phase>,
    pub stall_all: bool,
    /// The repairs `up --repair` made before this startup (issue #35).
    pub repairs: Vec<String>,
}

impl Recorder {
    pub fn new(s: Setup) -> Recorder {
        let generic = s.profiles.get("generic").map(|p| p.history.clone()).unwrap_or_default();
        let spec = match s.server.and_then(|k| s.profiles.get(k)) {
            Some(p) if p.name != "generic" => p.history.with(&generic),
            _ => generic,
        };
        let (argv_red, _, _) = crate::sinks::redact::redact(s.argv, &[]);
        let al = aliases(&spec);
        let env: Vec<(String, String)> = if s.remote_host.is_some() { vec![] } else { server_env(s.pid) };
        let (store, notes) = match Store::open_default() {
            Ok((st, note)) => (Some(st), note.into_iter().collect()),
            Err(e) => {
                // one warning line; the watch and its exit code go on as without history
                eprintln!(
                    "vigil: warning: history: the store is unreadable ({e}): this startup is not compared or recorded"
                );
                (None, vec![])
            }
        };
        let mut r = Recorder {
            name: s.name.to_string(),
            server: s.server.map(String::from),
            aliases: al.clone(),
            argv_args: parse_argv(&argv_red, &al),
            argv: argv_red,
            log_args: BTreeMap::new(),
            host: s.remote_host.map(String::from).unwrap_or_else(hostname),
            gpu: None,
            gpus: 0,
            cold: false,
            started_unix_ms: crate::state::now_ms(),
            versions: BTreeMap::new(),
            version_res: spec
                .versions
                .iter()
                .filter_map(|v| Some((v.name.clone(), Regex::new(&v.regex).ok()?)))
                .collect(),
            args_res: spec.args_line.iter().filter_map(|a| Regex::new(a).ok()).collect(),
            keep: s.stall_phases,
            stall_all: s.stall_all,
            slow_floor_ms: floor("VIGIL_SLOW_FLOOR", core::SLOW_FLOOR_MS),
            stall_floor_ms: floor("VIGIL_STALL_FLOOR", core::STALL_FLOOR_MS),
            applied: false,
            dirty: false,
            scanned: 0,
            last_good_facts: None,
            snap: None,
            repairs: s.repairs.clone(),
            done: false,
            store,
            notes,
            hashes: Default::default(),
            spec,
            env,
        };
        r.cold = r.cache_cold();
        // the GPUs of this host (a remote run's are not known here: 0)
        if s.remote_host.is_none() {
            if let Some((m, n)) = crate::sources::gpu::Reader::open().ok().and_then(|g| g.model_and_count()) {
                (r.gpu, r.gpus) = (Some(m), n);
            }
        }
        r
    }

    fn home(&self) -> Option<String> {
        self.env.iter().find(|(k, _)| k == "HOME").map(|(_, v)| v.clone()).or_else(|| std::env::var("HOME").ok())
    }

    fn env_of(&self, k: &str) -> Option<&str> {
        self.env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }

    /// Any cache dir of the profile empty or missing (remote runs: unknown, so warm).
    fn cache_cold(&self) -> bool {
        if self.env.is_empty() {
            return false;
        }
        let home = self.home();
        self.spec.cache_dirs.iter().any(|c| {
            let dir = match c.env.as_deref().and_then(|e| self.env_of(e)).filter(|v| !v.is_empty()) {
                Some(v) => Some(match &c.sub {
                    Some(sub) => Path::new(v).join(sub),
                    None => PathBuf::from(v),
                }),
                None => expand_home(&c.path, home.as_deref()),
            };
            dir.is_some_and(|d| empty_dir(&d))
        })
    }

    fn args(&self) -> BTreeMap<String, String> {
        let mut a = self.log_args.clone();
        for (k, v) in &self.argv_args {
            a.insert(k.clone(), v.clone());
        }
        a
    }

    fn model(&self, args: &BTreeMap<String, String>) -> Option<String> {
        for g in &self.spec.model_flags {
            if let Some(v) = args.get(&first_of(g)) {
                return Some(v.clone());
            }
        }
        // `vllm serve MODEL`: the first bare word after one of `model_after`
        let pos = self.argv.iter().position(|a| self.spec.model_after.iter().any(|w| w == a))?;
        self.argv.get(pos + 1).filter(|m| !m.starts_with('-')).cloned()
    }

    /// The key and facts, once the server kind and the model are known.
    fn hash(&self, p: &Path) -> Option<String> {
        self.hashes.borrow_mut().entry(p.to_path_buf()).or_insert_with(|| config_hash(p)).clone()
    }

    fn made(&self) -> Option<Made> {
        let server = self.server.clone()?;
        let args = self.args();
        let model = self.model(&args)?;
        let mut key_args = BTreeMap::new();
        for g in &self.spec.key_flags {
            let c = first_of(g);
            if let Some(v) = args.get(&c) {
                key_args.insert(c, v.clone());
            }
        }
        let local = Path::new(&model);
        let local_ok = !self.env.is_empty() && local.exists();
        let mut facts = BTreeMap::new();
        flag_facts(&self.argv_args, &self.log_args, &mut facts);
        for (k, v) in &self.env {
            if self.spec.env_prefixes.iter().any(|p| k.starts_with(p.as_str())) && !crate::sinks::redact::secret_var(k)
            {
                facts.insert(format!("env:{k}"), v.clone());
            }
        }
        if !self.env.is_empty() {
            facts.insert(core::FROM_ENV.into(), "launch".into());
        }
        if local_ok {
            if let Some(h) = self.hash(local) {
                facts.insert("config:model".into(), h);
            }
        }
        for g in &self.spec.draft_flags {
            if let Some(d) = args.get(&first_of(g)) {
                if let Some(h) = self.hash(Path::new(d)) {
                    facts.insert("config:draft".into(), h);
                }
            }
        }
        for (k, v) in &self.versions {
            facts.insert(format!("version:{k}"), v.clone());
        }
        facts.insert("cache".into(), if self.cold { "cold" } else { "warm" }.into());
        let key = Key {
            server,
            version: None,
            model_bytes: if local_ok { model_bytes(local) } else { None },
            model,
            args: key_args,
            host: self.host.clone(),
            gpu: self.gpu.clone(),
            gpus: self.gpus,
            cold_cache: self.cold,
        };
        Some(Made { key, facts })
    }

    /// Gives the judge its history when the key is known; notes what it found. Call at start and after
    /// each line until it has been applied.
    pub fn apply(&mut self, judge: &mut Judge) {
        if self.applied {
            return;
        }
        let (Some(made), Some(store)) = (self.made(), &self.store) else {
            return;
        };
        self.applied = true;
        let past = match store.related(&made.key.server, &made.key.model) {
            Ok(p) => p,
            Err(e) => {
                self.notes.push(format!("history: cannot read the store ({e}): no baseline"));
                return;
            }
        };
        let Some(m) = core::match_key(&made.key, &past) else {
            return;
        };
        let baseline = Baseline::from_matched(&m, self.slow_floor_ms);
        let learned = if self.stall_all { BTreeMap::new() } else { core::learned_stalls(&m, self.stall_floor_ms) };
        self.last_good_facts = core::last_good(&m.startups).map(|s| s.facts.clone());
        let changes = self.changes(&made.facts);
        if let Some(b) = &baseline {
            let mut n = format!("history: {} good startups", b.startups);
            if let Some(t) = b.total_ms_median {
                n.push_str(&format!(", usually ready in {}", fmt_ms(t)));
            }
            if !m.exact() {
                n.push_str(&format!(" (nearest key; differs: {})", m.differs.join(", ")));
            }
            self.notes.push(n);
        }
        if !learned.is_empty() {
            let l: Vec<String> = learned
                .iter()
                .filter(|(p, _)| !self.keep.contains(p))
                .map(|(p, v)| format!("{p} {}", fmt_ms(*v)))
                .collect();
            if !l.is_empty() {
                self.notes.push(format!(
                    "history: stall limits learned from good startups ({}× the longest silent gap, floor {}): {}",
                    core::STALL_MULTIPLE,
                    fmt_ms(self.stall_floor_ms),
                    l.join(", ")
                ));
            }
        }
        judge.set_history(baseline, learned, &self.keep, changes);
    }

    fn changes(&self, facts: &BTreeMap<String, String>) -> Vec<core::Change> {
        match &self.last_good_facts {
            Some(g) => core::what_changed(g, facts),
            None => vec![],
        }
    }

    /// A log line: the arguments (attached runs) and versions it prints.
    pub fn line(&mut self, raw: &str, judge: &mut Judge) {
        if self.server.is_none() || self.scanned >= SCAN_LINES {
            return;
        }
        self.scanned += 1;
        let mut new_version = false;
        for (name, re) in &self.version_res {
            if !self.versions.contains_key(name) {
                if let Some(c) = re.captures(raw) {
                    if let Some(v) = c.name("v") {
                        self.versions.insert(name.clone(), v.as_str().to_string());
                        new_version = true;
                    }
                }
            }
        }
        if self.log_args.is_empty() {
            for re in &self.args_res {
                if let Some(a) = re.captures(raw).and_then(|c| c.name("args")) {
                    self.log_args = parse_args_text(a.as_str(), &self.aliases);
                    self.dirty = true;
                    break;
                }
            }
        }
        if !self.applied {
            if std::mem::take(&mut self.dirty) {
                self.apply(judge);
            }
        } else if new_version && self.last_good_facts.is_some() {
            if let Some(m) = self.made() {
                judge.set_changes(self.changes(&m.facts));
            }
        }
    }

    /// The server kind, once the log revealed it.
    pub fn detected(&mut self, profiles: &Profiles, kind: &str) {
        if self.server.is_none() {
            let generic = profiles.get("generic").map(|p| p.history.clone()).unwrap_or_default();
            if let Some(p) = profiles.get(kind) {
                self.spec = p.history.with(&generic);
                self.aliases = aliases(&self.spec);
                self.argv_args = parse_argv(&self.argv, &self.aliases);
                self.version_res = self
                    .spec
                    .versions
                    .iter()
                    .filter_map(|v| Some((v.name.clone(), Regex::new(&v.regex).ok()?)))
                    .collect();
                self.args_res = self.spec.args_line.iter().filter_map(|a| Regex::new(a).ok()).collect();
                self.cold = self.cache_cold();
            }
            self.server = Some(kind.to_string());
            self.dirty = true;
        }
    }

    /// The judge reached a verdict: keep what it measured (the recorded verdict may come later,
    /// after the generation proof).
    pub fn observe(&mut self, j: &Judge) {
        if self.snap.is_none() && j.report().is_some() {
            self.snap = Some(Measures {
                gaps: j.gaps().clone(),
                rates: j.rates(),
                gpu: j.gpu_at_end().clone(),
                ranks: j.rank_timelines(),
            });
        }
    }

    /// Records the startup's verdict (once). A store that cannot be written is one warning on stderr.
    pub fn finish(&mut self, r: &Report) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        if self.store.is_none() {
            return;
        }
        let made = match self.made() {
            Some(m) => m,
            None => {
                // the model is unknown (a log without its arguments): recorded under the run name
                let mut k = Key { server: r.server.clone().unwrap_or_else(|| "unknown".into()), ..Key::default() };
                k.model = format!("unknown ({})", self.name);
                k.host = self.host.clone();
                Made { key: k, facts: BTreeMap::new() }
            }
        };
        let mut s = startup_of(&self.name, made.key, made.facts, r, self.snap.as_ref(), self.started_unix_ms);
        s.repairs = self.repairs.clone();
        if let Some(Err(e)) = self.store.as_mut().map(|st| st.insert(&s)) {
            eprintln!("vigil: warning: history: this startup was not recorded: {e}");
        }
    }

    /// Compiler process names (comm) that count as progress.
    pub fn compilers(&self) -> Vec<String> {
        self.spec.compilers.clone()
    }
}

fn startup_of(
    name: &str,
    key: Key,
    facts: BTreeMap<String, String>,
    r: &Report,
    m: Option<&Measures>,
    started_unix_ms: u64,
) -> Startup {
    let mut phases = BTreeMap::new();
    for e in &r.timeline {
        if let (Some(d), true) = (e.duration_ms, e.phase != Phase::Serving) {
            *phases.entry(e.phase).or_insert(0) += d;
        }
    }
    let end = r.elapsed_ms;
    let mut ranks = BTreeMap::new();
    if let Some(m) = m {
        for (rank, tl) in &m.ranks {
            if rank.is_empty() && m.ranks.len() > 1 {
                continue;
            }
            let mut per = BTreeMap::new();
            for (i, (p, at)) in tl.iter().enumerate() {
                let next = tl.get(i + 1).map(|x| x.1).unwrap_or(end);
                if let (Some(a), Some(b), true) = (at, next, *p != Phase::Serving) {
                    per.insert(*p, b.saturating_sub(*a));
                }
            }
            ranks.insert(if rank.is_empty() { "0".to_string() } else { rank.clone() }, per);
        }
    }
    Startup {
        name: name.to_string(),
        key,
        verdict: r.verdict,
        cause: r.cause,
        total_ms: r.elapsed_ms,
        phases,
        ranks,
        gaps: m.map(|m| m.gaps.clone()).unwrap_or_default(),
        rates: m.map(|m| m.rates.clone()).unwrap_or_default(),
        gpu_mib: m.map(|m| m.gpu.clone()).unwrap_or_default(),
        facts,
        started_unix_ms,
        slow: r.slow.iter().map(|x| x.phase).collect(),
        repairs: vec![],
    }
}

/// One log read offline: its verdict, what the judge measured, and the arguments it printed.
pub struct Offline {
    pub report: Report,
    pub ranks: BTreeMap<String, Vec<(Phase, Option<u64>)>>,
    /// Per rank, its last line in each phase (the timeline shows who waited for whom).
    pub last_lines: BTreeMap<String, BTreeMap<Phase, u64>>,
    gaps: BTreeMap<Phase, u64>,
    rates: BTreeMap<Phase, f64>,
    args: BTreeMap<String, String>,
    versions: BTreeMap<String, String>,
}

/// Reads a log file line by line (any size; each line bounded by the splitter) through the offline judge.
pub fn read_log(path: &Path, profiles: &Profiles) -> Result<Offline, String> {
    use std::io::{BufRead, Read};
    let f = crate::sources::procs::open_regular(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut o = vigil_core::Offline::new(profiles, None);
    let mut arg_res: Vec<Regex> = Vec::new();
    let mut ver_res: Vec<(String, Regex)> = Vec::new();
    let mut spec_for: Option<String> = None;
    let mut args = BTreeMap::new();
    let mut versions = BTreeMap::new();
    let mut al = BTreeMap::new();
    let mut rd = std::io::BufReader::new(f);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let n =
            Read::take(&mut rd, 1 << 20).read_until(b'\n', &mut buf).map_err(|e| format!("{}: {e}", path.display()))?;
        if n == 0 {
            break;
        }
        while buf.last().is_some_and(|c| *c == b'\n' || *c == b'\r') {
            buf.pop();
        }
        let text = String::from_utf8_lossy(&buf);
        for raw in text.split(['\n', '\r']) {
            o.push(raw, &mut |_| {});
            if spec_for.is_none() {
                if let Some(s) = o.judge().server().map(String::from) {
                    let generic = profiles.get("generic").map(|p| p.history.clone()).unwrap_or_default();
                    let spec = profiles.get(&s).map(|p| p.history.with(&generic)).unwrap_or(generic);
                    al = aliases(&spec);
                    arg_res = spec.args_line.iter().filter_map(|a| Regex::new(a).ok()).collect();
                    ver_res = spec
                        .versions
                        .iter()
                        .filter_map(|v| Some((v.name.clone(), Regex::new(&v.regex).ok()?)))
                        .collect();
                    spec_for = Some(s);
                }
            }
            if args.is_empty() {
                if let Some(a) = arg_res.iter().find_map(|re| re.captures(raw).and_then(|c| c.name("args"))) {
                    args = parse_args_text(a.as_str(), &al);
                }
            }
            for (name, re) in &ver_res {
                if !versions.contains_key(name) {
                    if let Some(v) = re.captures(raw).and_then(|c| c.name("v")) {
                        versions.insert(name.clone(), v.as_str().to_string());
                    }
                }
            }
        }
    }
    let report = o.finish(&mut |_| {});
    let j = o.judge();
    Ok(Offline {
        report,
        ranks: j.rank_timelines(),
        last_lines: j.rank_last_lines(),
        gaps: j.gaps().clone(),
        rates: j.rates(),
        args,
        versions,
    })
}

/// A log read offline (`f`), as `history import` records it: named after the file, keyed by the
/// arguments it printed on host `imported`, started at the file's modification time.
pub fn imported(f: &Path, o: &Offline, profiles: &Profiles) -> Startup {
    let name = f.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "log".into());
    let server = o.report.server.clone().unwrap_or_else(|| "unknown".into());
    let generic = profiles.get("generic").map(|p| p.history.clone()).unwrap_or_default();
    let spec = profiles.get(&server).map(|p| p.history.with(&generic)).unwrap_or(generic);
    let model = spec
        .model_flags
        .iter()
        .find_map(|g| o.args.get(&first_of(g)).cloned())
        .unwrap_or_else(|| format!("unknown ({name})"));
    let key_args =
        spec.key_flags.iter().filter_map(|g| o.args.get(&first_of(g)).map(|v| (first_of(g), v.clone()))).collect();
    let mut facts = BTreeMap::new();
    flag_facts(&BTreeMap::new(), &o.args, &mut facts);
    for (k, v) in &o.versions {
        facts.insert(format!("version:{k}"), v.clone());
    }
    let key = Key { server, model, args: key_args, host: "imported".into(), ..Key::default() };
    let mtime = std::fs::metadata(f)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_millis() as u64);
    let m = Measures { gaps: o.gaps.clone(), rates: o.rates.clone(), gpu: BTreeMap::new(), ranks: o.ranks.clone() };
    startup_of(&name, key, facts, &o.report, Some(&m), mtime)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue #33, from the captured logs of a real SGLang 0.5.17 (corpus/captured): a start that crashed
    /// (`--tp-size 3` on one GPU) after a good one lists only what the user changed on the command line, where
    /// comparing every argument the server printed listed the whole ServerArgs.
    #[test]
    fn a_crashed_sglang_start_lists_only_what_the_user_changed() {
        let profiles = Profiles::builtin();
        let generic = profiles.get("generic").unwrap().history.clone();
        let spec = profiles.get("sglang").unwrap().history.with(&generic);
        let al = aliases(&spec);
        let res: Vec<Regex> = spec.args_line.iter().map(|a| Regex::new(a).unwrap()).collect();
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../corpus/captured");
        let read = |name: &str| {
            let text = std::fs::read_to_string(dir.join(name)).unwrap();
            let cmd = text.lines().find_map(|l| l.strip_prefix("# NOTE: command: ")).unwrap().to_string();
            let argv: Vec<String> = cmd.split_whitespace().map(String::from).collect();
            let printed = text
                .lines()
                .find_map(|l| res.iter().find_map(|r| r.captures(l)?.name("args").map(|a| a.as_str().to_string())))
                .map(|a| parse_args_text(&a, &al))
                .unwrap_or_default();
            (parse_argv(&argv, &al), printed)
        };
        let facts = |(argv, printed): &(BTreeMap<String, String>, BTreeMap<String, String>)| {
            let mut f = BTreeMap::new();
            flag_facts(argv, printed, &mut f);
            f
        };
        let good = read("sglang-0.5.17-eager.log");
        let crashed = read("sglang-0.5.17-tp3.log");
        assert!(good.1.len() > 50, "the good start printed its ServerArgs: {}", good.1.len());
        let c = core::what_changed(&facts(&good), &facts(&crashed));
        let items: Vec<&str> = c.iter().map(|c| c.item.as_str()).collect();
        assert_eq!(
            items,
            ["flag:port", "flag:tp_size", "flag:disable_cuda_graph", "flag:mem_fraction_static"],
            "{c:?}"
        );
        // a crashed start that died before printing its ServerArgs (what the GPU run showed) lists the same
        let unprinted = (crashed.0.clone(), BTreeMap::new());
        assert_eq!(core::what_changed(&facts(&good), &facts(&unprinted)), c);
        let tp = c.iter().find(|c| c.item == "flag:tp_size").unwrap();
        assert_eq!((tp.before.as_deref(), tp.after.as_deref()), (None, Some("3")));
        // what the printed arguments gave (both starts printed them here): one line per differing field
        let merged = |(argv, printed): &(BTreeMap<String, String>, BTreeMap<String, String>)| {
            let mut f = BTreeMap::new();
            let mut all = printed.clone();
            all.extend(argv.clone());
            flag_facts(&BTreeMap::new(), &all, &mut f);
            f
        };
        let before = core::what_changed(&merged(&good), &merged(&crashed)).len();
        eprintln!("changes listed: {} (comparing the printed arguments: {before})", items.len());
        eprintln!("changes listed: {} (comparing the printed arguments: {before})", items.len());
        assert!(before > items.len(), "{before}");
    }

    #[test]
    fn args_from_the_three_log_formats() {
        let spec = HistorySpec {
            key_flags: vec!["tp_size|tp".into(), "tensor_parallel_size|tp".into()],
            ..HistorySpec::default()
        };
        let al = aliases(&spec);
        let sg = parse_args_text("model_path='/m/llama', tp_size=8, dtype='auto', quantization=None", &al);
        assert_eq!(sg.get("model_path").map(String::as_str), Some("/m/llama"));
        assert_eq!(sg.get("tp_size").map(String::as_str), Some("8"));
        assert!(!sg.contains_key("quantization"));
        let vl = parse_args_text("'model': '/m/q', 'tensor_parallel_size': 2, 'enforce_eager': True", &al);
        assert_eq!(vl.get("tensor_parallel_size").map(String::as_str), Some("2"));
        let tgi = parse_args_text(r#"model_id: "google/flan-t5-xxl", revision: None, num_shard: Some(2)"#, &al);
        assert_eq!(tgi.get("model_id").map(String::as_str), Some("google/flan-t5-xxl"));
        assert_eq!(tgi.get("num_shard").map(String::as_str), Some("2"));
    }

    #[test]
    fn secret_arguments_of_a_log_line_are_never_kept() {
        let a = parse_args_text(
            "model_path='/m', api_key='sk-123', hf_token=\"hf_x\", admin_api_key='k'",
            &BTreeMap::new(),
        );
        assert_eq!(a.get("api_key").map(String::as_str), Some("***"));
        assert_eq!(a.get("hf_token").map(String::as_str), Some("***"));
        assert_eq!(a.get("admin_api_key").map(String::as_str), Some("***"));
        assert_eq!(a.get("model_path").map(String::as_str), Some("/m"));
    }

    #[test]
    fn argv_flags_are_normalised_with_aliases() {
        let spec = HistorySpec { key_flags: vec!["ctx_size|c".into()], ..HistorySpec::default() };
        let al = aliases(&spec);
        let argv: Vec<String> =
            ["llama-server", "-m", "x.gguf", "-c", "2048", "--flash-attn", "--port=8080"].map(String::from).to_vec();
        let a = parse_argv(&argv, &al);
        assert_eq!(a.get("ctx_size").map(String::as_str), Some("2048"));
        assert_eq!(a.get("flash_attn").map(String::as_str), Some("true"));
        assert_eq!(a.get("port").map(String::as_str), Some("8080"));
    }
}
