//! Server knowledge as data: one TOML profile per server kind, embedded in the binary and
//! extendable by users (`--profiles DIR`, `$XDG_CONFIG_HOME/vigil/profiles/`).
//!
//! A user file whose `name` matches a built-in profile extends it: its rules are tried *before* the
//! built-in ones (so a changed ready marker or an added fatal marker wins), and any `[server]`
//! value it gives replaces the built-in one. A new name adds a new server kind.

use crate::time::TsFormat;
use crate::types::{Cause, Phase};
use regex::Regex;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;

/// The built-in profiles, in detection priority order. `generic` is last and always applies.
pub const BUILTIN: &[(&str, &str)] = &[
    ("sglang", include_str!("../profiles/sglang.toml")),
    ("vllm", include_str!("../profiles/vllm.toml")),
    ("llama-cpp", include_str!("../profiles/llama-cpp.toml")),
    ("tgi", include_str!("../profiles/tgi.toml")),
    ("generic", include_str!("../profiles/generic.toml")),
];

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileFile {
    pub name: String,
    #[serde(default)]
    pub server: ServerSpec,
    #[serde(default)]
    pub prefix: Vec<PrefixSpec>,
    #[serde(default)]
    pub rule: Vec<RuleSpec>,
    /// How generation is proven (the request, where its answer's tokens and speculation numbers live).
    pub proof: Option<ProofSpec>,
    /// Command-line facts: when `/health` proves nothing, whether `check` reads an HF config.
    #[serde(default)]
    pub cmd: CmdSpec,
    /// What the startup history (docs/history.md) needs to know of this server.
    #[serde(default)]
    pub history: HistorySpec,
    /// Where each phase starts in the server's own code, for `scripts/frames/gen.py` (issue #24): the judge
    /// reads the table that script writes (`profiles/frames.tsv`), not these.
    #[serde(default)]
    pub frame_entry: Vec<FrameEntrySpec>,
    /// What a multi-node server's rank says when a peer went away (issue #32).
    #[serde(default)]
    pub multi_node: MultiNodeSpec,
    /// What `vigil up --repair` may change after a failed start, and when (issue #35, docs/repair.md).
    #[serde(default)]
    pub repair: Vec<crate::repair::RepairSpec>,
}

/// `[multi_node]`: the lines by which a rank's failure shows it followed a peer's (the peer's process died
/// or its host went away), so the rank that failed first is taken for the root cause
/// ([`crate::fleet::MultiNode`]).
#[derive(Debug, Deserialize, Clone, Default)]
#[serde(deny_unknown_fields)]
pub struct MultiNodeSpec {
    #[serde(default)]
    pub peer_gone: Vec<PeerGoneSpec>,
}

/// One `peer_gone` pattern and where its text comes from.
#[derive(Debug, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct PeerGoneSpec {
    #[serde(rename = "match")]
    pub pattern: String,
    pub source: String,
}

/// `phase` starts at `at`: `file:qualified name` under the server's package, both fnmatch patterns.
#[derive(Debug, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct FrameEntrySpec {
    pub phase: String,
    pub at: String,
}

/// The generation proof of a server kind, as data. `body` is the JSON request, in which the strings
/// `"$tokens"` and `"$model"` are replaced by the token count and the served model id; paths are JSON
/// pointers (`/usage/completion_tokens`) tried in order.
#[derive(Debug, Default, Deserialize, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ProofSpec {
    pub endpoint: String,
    pub body: serde_json::Value,
    /// The request needs a model id: `GET /v1/models` → `/data/0/id`, else the command's `--model`.
    #[serde(default)]
    pub needs_model: bool,
    /// Where the count of generated tokens is.
    pub tokens: Vec<String>,
    /// Where the generated text is (one token is counted when a count is missing but text came back).
    #[serde(default)]
    pub text: Vec<String>,
    /// Per-request speculation numbers in the answer: drafted and accepted token counts, and the
    /// verification steps (for the accept length). Each is one pointer or a list tried in order.
    #[serde(default, deserialize_with = "one_or_many")]
    pub drafted: Vec<String>,
    #[serde(default, deserialize_with = "one_or_many")]
    pub accepted: Vec<String>,
    #[serde(default, deserialize_with = "one_or_many")]
    pub steps: Vec<String>,
    /// Speculation numbers from another endpoint: the average accept length (SGLang `/server_info`).
    pub accept_length_endpoint: Option<String>,
    #[serde(default)]
    pub accept_length: Vec<String>,
    /// When speculation was asked for and the proof brings no speculation numbers at all: `degraded`
    /// (the server reports drafts per request, so none means off) or `unverified` (it may not report them).
    pub no_drafts: Option<String>,
    /// How the command line asks for speculation, and where else its numbers are.
    pub speculation: Option<SpeculationSpec>,
}

impl ProofSpec {
    /// A proof without speculation numbers is a degraded server (not merely unverified).
    pub fn no_drafts_is_degraded(&self) -> bool {
        self.no_drafts.as_deref() != Some("unverified")
    }
}

/// `[proof.speculation]`: the command-line flags that ask for speculative decoding and the server's other
/// reports of it (engine counters on its metrics page, a periodic log line).
#[derive(Debug, Default, Deserialize, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SpeculationSpec {
    /// Flags that ask for speculation (`--speculative-algorithm`, `-md`).
    #[serde(default)]
    pub flags: Vec<String>,
    /// Values of those flags that ask for none (llama-server's `--spec-type none`).
    #[serde(default)]
    pub off_values: Vec<String>,
    /// The server reads `_` as `-` in long flags (`--speculative_config`).
    #[serde(default)]
    pub underscores: bool,
    /// Where the command line names the method: a flag's value, or a JSON pointer into a flag's JSON value.
    #[serde(default)]
    pub method: Vec<MethodSpec>,
    /// Methods (regex on the method's value) whose drafts come from the text itself (n-gram lookup,
    /// suffix trees): on a short proof, drafting or accepting nothing does not prove them off.
    pub text_drafters: Option<String>,
    /// Engine counters on the server's metrics page, read just before and just after the proof request.
    pub metrics: Option<SpecMetricsSpec>,
    /// A periodic log line with the drafted and accepted counts of an interval: named groups `drafted`,
    /// `accepted` (and `length`, the mean accept length). Used when nothing better came with the proof.
    pub log: Option<String>,
    /// Where the names and patterns come from.
    pub source: Option<String>,
}

/// A place on the command line that names the speculation method.
#[derive(Debug, Default, Deserialize, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MethodSpec {
    pub flag: String,
    /// The flag's value is JSON: the method is at this pointer (`/method` of vLLM's `--speculative-config`).
    pub pointer: Option<String>,
}

/// Prometheus counters of speculation on the server's metrics page (sums over their label sets).
#[derive(Debug, Default, Deserialize, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SpecMetricsSpec {
    /// Path of the metrics page (default `/metrics`).
    pub path: Option<String>,
    /// Draft tokens proposed.
    pub drafted: String,
    /// Draft tokens accepted.
    pub accepted: String,
    /// Verification steps (drafts): the mean accept length is 1 + accepted / steps.
    pub steps: Option<String>,
}

/// A TOML string or array of strings, as a list.
fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    struct V;
    impl<'de> serde::de::Visitor<'de> for V {
        type Value = Vec<String>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a JSON pointer or a list of them")
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Vec<String>, E> {
            Ok(vec![v.to_string()])
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<Vec<String>, A::Error> {
            let mut out = Vec::new();
            while let Some(s) = a.next_element::<String>()? {
                out.push(s);
            }
            Ok(out)
        }
    }
    d.deserialize_any(V)
}

/// Facts about a server's command line.
#[derive(Debug, Default, Deserialize, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CmdSpec {
    /// `/health` is a dummy that always answers 200 when this flag's value is at least `dummy_health_min`
    /// (SGLang's non-zero `--node-rank`).
    pub dummy_health_flag: Option<String>,
    pub dummy_health_min: Option<u64>,
    /// The model's configuration is a Hugging Face `config.json` that `check` reads (else GGUF or unknown).
    #[serde(default)]
    pub hf_config: bool,
    /// A flag that starts no API server at all (vLLM's `--headless` worker nodes): nothing to probe, whatever
    /// `--port` says.
    pub no_api_flag: Option<String>,
}

impl CmdSpec {
    /// Does this command line make `/health` a dummy?
    pub fn dummy_health(&self, argv: &[String]) -> bool {
        let Some(flag) = &self.dummy_health_flag else { return false };
        let min = self.dummy_health_min.unwrap_or(1);
        crate::arg_value(argv, flag).and_then(|v| v.parse::<u64>().ok()).is_some_and(|v| v >= min)
    }

    /// Does this command line start no API server (`no_api_flag` given, alone or `=true`)?
    pub fn no_api(&self, argv: &[String]) -> bool {
        let Some(flag) = &self.no_api_flag else { return false };
        let eq = format!("{flag}=");
        argv.iter().any(|a| a == flag || a.strip_prefix(&eq).is_some_and(|v| v.eq_ignore_ascii_case("true")))
    }
}

/// Does a rank started with this command line serve an API of its own, one to probe and whose readiness is
/// its own? Only on a port its command names (`--port`: a profile's default port would be the head's on a
/// machine that runs both), and not with the profile's flag that starts no API (`no_api_flag`: vLLM's
/// `--headless` workers). `cmd` is the command spec of the server's profile, None when its kind is unknown.
/// The one answer for a multi-node rank's probe (`node::local`) and for whether it follows the head
/// (`supervise::multinode`).
pub fn serves_api(cmd: Option<&CmdSpec>, argv: &[String]) -> bool {
    !cmd.is_some_and(|c| c.no_api(argv)) && crate::arg_value(argv, "--port").is_some()
}

/// `[history]`: which arguments make startups comparable, where the model and its config are, which
/// environment variables and versions matter, which JIT caches make a start cold. Lists of a user file
/// come before the built-in ones; the `generic` profile's apply to every server.
#[derive(Debug, Default, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct HistorySpec {
    /// Flags that change startup time, as `canonical|alias|…` (names without dashes, `-` as `_`, so
    /// `--tp-size` and SGLang's `server_args=` field `tp_size` are one name).
    #[serde(default)]
    pub key_flags: Vec<String>,
    /// Flags naming the model (a path or a hub id).
    #[serde(default)]
    pub model_flags: Vec<String>,
    /// Words after which the first bare argument is the model (`vllm serve MODEL`).
    #[serde(default)]
    pub model_after: Vec<String>,
    /// Flags naming a speculative draft model.
    #[serde(default)]
    pub draft_flags: Vec<String>,
    /// Environment variable prefixes listed by "what changed".
    #[serde(default)]
    pub env_prefixes: Vec<String>,
    /// Log lines that print the parsed arguments (attached runs): the regex's `args` group holds
    /// `name=value`, `'name': value` or `name: value` pairs.
    #[serde(default)]
    pub args_line: Vec<String>,
    #[serde(default)]
    pub versions: Vec<VersionSpec>,
    /// JIT / compile caches: one empty or missing at launch makes the start cold.
    #[serde(default)]
    pub cache_dirs: Vec<CacheDirSpec>,
    /// Process names (comm) of compilers: one running in the server's tree is progress.
    #[serde(default)]
    pub compilers: Vec<String>,
}

#[derive(Debug, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct VersionSpec {
    /// `sglang`, `torch`, `nccl`, `driver`: recorded as `version:NAME`.
    pub name: String,
    /// A log-line regex with a `v` group.
    pub regex: String,
    pub source: Option<String>,
}

#[derive(Debug, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct CacheDirSpec {
    /// The variable that moves the cache, when set.
    pub env: Option<String>,
    /// The default (`~/` is the home directory); with `env` set, `$VAR/sub` under it via `sub`.
    pub path: String,
    /// A subdirectory of the variable's directory that holds this cache.
    pub sub: Option<String>,
    pub source: Option<String>,
}

impl HistorySpec {
    fn extend_front(&mut self, f: &HistorySpec) {
        fn front<T: Clone>(a: &mut Vec<T>, b: &[T]) {
            let mut v = b.to_vec();
            v.append(a);
            *a = v;
        }
        front(&mut self.key_flags, &f.key_flags);
        front(&mut self.model_flags, &f.model_flags);
        front(&mut self.draft_flags, &f.draft_flags);
        front(&mut self.model_after, &f.model_after);
        front(&mut self.env_prefixes, &f.env_prefixes);
        front(&mut self.args_line, &f.args_line);
        front(&mut self.versions, &f.versions);
        front(&mut self.cache_dirs, &f.cache_dirs);
        front(&mut self.compilers, &f.compilers);
    }

    /// This spec followed by `other`'s entries (a server's own, then the generic layer's).
    pub fn with(&self, other: &HistorySpec) -> HistorySpec {
        let mut h = other.clone();
        h.extend_front(self);
        h
    }
}

#[derive(Debug, Default, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct ServerSpec {
    pub description: Option<String>,
    /// Log-line regexes that identify this server kind.
    pub detect: Option<Vec<String>>,
    /// Command-line regexes that identify this server kind.
    pub detect_cmd: Option<Vec<String>>,
    pub port: Option<u16>,
    pub health_path: Option<String>,
    /// Probe timeout in seconds (SGLang's `/health` runs a generation that may take 20 s).
    pub probe_timeout_secs: Option<f64>,
    /// The phase from which the HTTP port may answer: `launch` (llama-server: 503 while loading)
    /// or `http` (SGLang, vLLM, TGI: connection refused until then).
    pub port_opens: Option<String>,
    /// Per-phase stall limits in seconds, overriding the defaults.
    pub stall_secs: Option<BTreeMap<String, u64>>,
    /// Process-title and command-line regexes of this server's processes (`vigil ps`).
    pub ps: Option<Vec<String>>,
    /// Regexes on a process's title (`/proc/PID/cmdline`, which `setproctitle` rewrites) that name
    /// an engine process of the server's tree: its death while the server lives is `engine_dead`.
    pub engine_titles: Option<Vec<String>>,
    /// The server's own Prometheus metrics that show engine progress (read after ready).
    pub metrics: Option<MetricsSpec>,
}

/// Prometheus metric names that show whether the engine makes progress.
#[derive(Debug, Default, Deserialize, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct MetricsSpec {
    /// Path of the metrics page (default `/metrics`).
    pub path: Option<String>,
    /// Gauge: requests waiting in the queue.
    pub waiting: Option<String>,
    /// Gauge: requests being processed.
    pub running: Option<String>,
    /// Counters that grow while tokens are generated or prompts processed (any growth is progress).
    #[serde(default)]
    pub tokens: Vec<String>,
    /// Where the names come from.
    pub source: Option<String>,
}

#[derive(Debug, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct PrefixSpec {
    /// Regex anchored at line start. Named groups: `ts`, `rank`, `level` (all optional).
    pub regex: String,
    /// Timestamp format of the `ts` group: ymd_hms, md_hms, llama_rel, rfc3339.
    pub time: Option<String>,
    /// Where the pattern comes from.
    pub source: Option<String>,
}

#[derive(Debug, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    pub name: String,
    /// Regex searched in the message (the line with its log prefix removed).
    #[serde(rename = "match")]
    pub pattern: String,
    pub kind: RuleKind,
    pub phase: Option<String>,
    /// `phase` rules: the phase to enter instead when the rank already reached `phase`
    /// (SGLang prints `Load weight begin.` again for the draft model).
    pub again: Option<String>,
    pub cause: Option<String>,
    pub hint: Option<String>,
    /// `error` rules: when true, the line alone proves the server is going down.
    #[serde(default)]
    pub terminal: bool,
    /// The rule's `phase` replaces the current phase instead of only filling in an unknown one.
    #[serde(default)]
    pub force: bool,
    /// Where the pattern comes from (a reference note or a corpus log).
    pub source: Option<String>,
    /// Why the rule cannot be more general, for one that matches in a single corpus log (issue #12): the
    /// corpus test requires it there.
    pub narrow: Option<String>,
}

#[derive(Debug, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RuleKind {
    /// Enter `phase` (forward only, per rank).
    Phase,
    /// Progress inside a phase: named groups `k` and `n` (and optionally `detail`); `phase` entered if behind.
    Progress,
    /// A failure line: carries a cause and hint; `terminal = true` proves the crash.
    Error,
    /// Implies a phase for a traceback frame when nothing better is known.
    Implies,
    /// A progress signal that changes no phase.
    Mark,
    /// The server's ready marker.
    Ready,
    /// The HTTP server is up: probe now.
    HttpUp,
    /// A serving server reports it is unhealthy (e.g. SGLang `Health check failed`).
    Unhealthy,
    /// Periodic "still waiting" lines: signs of life, not progress.
    Heartbeat,
    /// Orderly shutdown requested by the operator.
    Shutdown,
    /// The server runs on with a feature off (e.g. speculative decoding); its hint says what.
    Degraded,
    /// Known noise: not progress (access logs, request lines).
    Noise,
    /// A failure scoped to one request (an HTTP handler's traceback, a per-request error line): it proves
    /// the server was serving, and an error block holding it is not fatal by itself.
    RequestError,
}

/// A rule's own regex, compiled on first use. Most rules are only ever matched through their profile's
/// set; their own regex (which reads groups) is built only for the ones that win with groups. Compiling
/// every rule eagerly was most of vigil's resident memory. The pattern is parsed (not compiled) at load, so
/// a bad pattern is still an error there.
#[derive(Debug)]
pub struct LazyRegex {
    src: String,
    groups: usize,
    cell: std::sync::OnceLock<Regex>,
}

impl Clone for LazyRegex {
    fn clone(&self) -> Self {
        LazyRegex { src: self.src.clone(), groups: self.groups, cell: std::sync::OnceLock::new() }
    }
}

impl LazyRegex {
    /// Parses the pattern (syntax and group names) without compiling it.
    fn parse(src: &str) -> Result<(LazyRegex, Vec<String>), String> {
        let hir = regex_syntax::Parser::new().parse(src).map_err(|e| e.to_string())?;
        let mut names = Vec::new();
        collect_names(&hir, &mut names);
        let groups = hir.properties().explicit_captures_len();
        Ok((LazyRegex { src: src.to_string(), groups, cell: std::sync::OnceLock::new() }, names))
    }

    pub fn as_str(&self) -> &str {
        &self.src
    }

    /// Explicit capture groups in the pattern.
    pub fn groups(&self) -> usize {
        self.groups
    }

    pub fn get(&self) -> &Regex {
        self.cell.get_or_init(|| Regex::new(&self.src).expect("pattern parsed at load"))
    }
}

fn collect_names(h: &regex_syntax::hir::Hir, out: &mut Vec<String>) {
    use regex_syntax::hir::HirKind;
    match h.kind() {
        HirKind::Capture(c) => {
            if let Some(n) = &c.name {
                out.push(n.to_string());
            }
            collect_names(&c.sub, out);
        }
        HirKind::Concat(v) | HirKind::Alternation(v) => v.iter().for_each(|x| collect_names(x, out)),
        HirKind::Repetition(r) => collect_names(&r.sub, out),
        _ => {}
    }
}

/// A compiled rule.
#[derive(Debug, Clone)]
pub struct Rule {
    pub name: String,
    pub profile: String,
    pub re: LazyRegex,
    pub kind: RuleKind,
    pub phase: Option<Phase>,
    pub again: Option<Phase>,
    pub cause: Option<Cause>,
    pub hint: Option<String>,
    pub terminal: bool,
    pub force: bool,
    pub source: Option<String>,
    /// Why the rule cannot be more general (see [`RuleSpec::narrow`]).
    pub narrow: Option<String>,
}

#[derive(Debug, Clone)]
pub struct Prefix {
    pub re: Regex,
    pub time: Option<TsFormat>,
}

/// A compiled profile.
#[derive(Debug, Clone)]
pub struct Profile {
    pub name: String,
    pub description: String,
    pub detect: Vec<Regex>,
    pub detect_cmd: Vec<Regex>,
    pub port: u16,
    pub health_path: String,
    pub probe_timeout_secs: f64,
    pub port_opens: Phase,
    pub stall_secs: BTreeMap<Phase, u64>,
    pub ps: Vec<Regex>,
    pub proof: Option<ProofSpec>,
    pub cmd: CmdSpec,
    /// Process titles of the server's engine processes (see [`ServerSpec::engine_titles`]).
    pub engine_titles: Vec<Regex>,
    pub metrics: Option<MetricsSpec>,
    pub history: HistorySpec,
    /// `[multi_node] peer_gone`, compiled.
    pub peer_gone: Vec<Regex>,
    /// `[[repair]]` rules, compiled, in the order they are tried.
    pub repairs: Vec<crate::repair::Repair>,
    pub prefixes: Vec<Prefix>,
    pub rules: Vec<Rule>,
    /// All rule patterns in one set: one pass finds the first matching rule. Byte-oriented and ASCII-only
    /// (`\w`, `\d`, `\s` and case folding on ASCII): log text is ASCII where the rules look, and Unicode
    /// classes make the lazy DFA many times larger and slower on varied lines. The winning rule's own
    /// (Unicode) regex then reads its groups.
    rule_set: std::sync::OnceLock<RuleSet>,
}

/// A profile's rule patterns as one automaton: the rules a line matches, in one pass (what
/// `regex::bytes::RegexSet` does, built through `regex-automata` for the one setting `regex` does not expose:
/// no literal prefilter). The prefilter such a set gets is an Aho-Corasick DFA over the rules' literals: 2 MiB
/// for the llama-cpp and generic sets, 9 MiB for all five profiles (a log whose first lines name no server
/// kind is matched against every profile), most of vigil's heap while it waits, and it bought nothing: without
/// it the lazy DFA alone runs 3 % fewer instructions on both diagnose benchmark logs (docs/benchmarks.md,
/// "Peak memory of `vigil wait`").
#[derive(Debug, Clone)]
pub struct RuleSet(regex_automata::meta::Regex);

impl RuleSet {
    fn build(name: &str, rules: &[Rule]) -> Result<RuleSet, ProfileError> {
        use regex_automata::{meta, util::syntax, MatchKind};
        // regex's own RegexSet settings (size limits, all matches, bytes), plus no prefilter
        let metac = meta::Config::new()
            .nfa_size_limit(Some(10 * (1 << 20)))
            // 4 MiB, not regex's 2: with the framework rules of issue #23/#24 the generic set's lazy DFA
            // cleared its 2 MiB cache so often on real bodies that it gave up and fell back (diagnose 61 -> 31
            // MiB/s on the corpus bodies, docs/benchmarks.md); the cache fills only as states are needed, and
            // peak RSS of `vigil wait` stays 13.3-14.6 MiB.
            .hybrid_cache_capacity(4 * (1 << 20))
            .match_kind(MatchKind::All)
            .utf8_empty(false)
            .which_captures(regex_automata::nfa::thompson::WhichCaptures::None)
            .auto_prefilter(false);
        let syntaxc = syntax::Config::new().unicode(false).utf8(false);
        let pats: Vec<&str> = rules.iter().map(|r| r.re.as_str()).collect();
        meta::Builder::new()
            .configure(metac)
            .syntax(syntaxc)
            .build_many(&pats)
            .map(RuleSet)
            .map_err(|e| ProfileError(format!("profile {name}: {e}")))
    }

    /// How many rules the set holds.
    pub fn len(&self) -> usize {
        self.0.pattern_len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The indexes of the rules that match `hay`, in rule order.
    pub fn matches(&self, hay: &[u8]) -> impl Iterator<Item = usize> {
        let mut set = regex_automata::PatternSet::new(self.len());
        self.0.which_overlapping_matches(&regex_automata::Input::new(hay), &mut set);
        (0..self.len()).filter(move |i| set.contains(regex_automata::PatternID::new_unchecked(*i)))
    }
}

fn rule_set(name: &str, rules: &[Rule]) -> Result<RuleSet, ProfileError> {
    RuleSet::build(name, rules)
}

#[derive(Debug)]
pub struct ProfileError(pub String);

impl fmt::Display for ProfileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ProfileError {}

fn re(origin: &str, what: &str, s: &str) -> Result<Regex, ProfileError> {
    Regex::new(s).map_err(|e| {
        let first = e.to_string().lines().last().unwrap_or("").trim().to_string();
        ProfileError(format!("{origin}: bad regex in {what}: {first}"))
    })
}

/// A log-prefix regex, ASCII-only where the pattern allows it: `\d`, `\w` and `\s` on ASCII make the
/// NFA a fraction of its Unicode size, and the captures of a prefix are read on every line (the
/// backtracker clears a visited set the size of NFA × prefix on each search). A pattern that could then
/// match invalid UTF-8 (a negated class, `.`) keeps Unicode.
fn prefix_re(origin: &str, s: &str) -> Result<Regex, ProfileError> {
    match regex::RegexBuilder::new(s).unicode(false).build() {
        Ok(r) => Ok(r),
        Err(_) => re(origin, "prefix", s),
    }
}

fn phase(origin: &str, what: &str, s: &Option<String>) -> Result<Option<Phase>, ProfileError> {
    match s {
        None => Ok(None),
        Some(s) => {
            Phase::parse(s).map(Some).ok_or_else(|| ProfileError(format!("{origin}: {what}: unknown phase '{s}'")))
        }
    }
}

impl Profile {
    fn empty(name: &str) -> Profile {
        Profile {
            name: name.to_string(),
            description: String::new(),
            detect: vec![],
            detect_cmd: vec![],
            port: 8000,
            health_path: "/health".into(),
            probe_timeout_secs: 5.0,
            port_opens: Phase::Http,
            stall_secs: BTreeMap::new(),
            ps: vec![],
            proof: None,
            cmd: CmdSpec::default(),
            engine_titles: vec![],
            metrics: None,
            history: HistorySpec::default(),
            peer_gone: vec![],
            repairs: vec![],
            prefixes: vec![],
            rules: vec![],
            rule_set: std::sync::OnceLock::new(),
        }
    }

    /// Checks that the rules make a set (the set itself is built on first use, see [`Profile::rule_set`]).
    fn build_set(&mut self) -> Result<(), ProfileError> {
        self.rule_set = std::sync::OnceLock::new();
        Ok(())
    }

    /// All rule patterns in one set, built on the first line this profile classifies: a watch of one
    /// server kind never builds the others'.
    pub fn rule_set(&self) -> &RuleSet {
        self.rule_set.get_or_init(|| {
            rule_set(&self.name, &self.rules).unwrap_or_else(|e| panic!("rule set checked at load: {}", e.0))
        })
    }

    /// Merges a parsed file into this profile. `front` puts the file's rules before the existing ones.
    fn merge(&mut self, origin: &str, f: &ProfileFile, front: bool) -> Result<(), ProfileError> {
        let s = &f.server;
        if let Some(d) = &s.description {
            self.description = d.clone();
        }
        if let Some(v) = &s.detect {
            let mut d = v.iter().map(|p| re(origin, "detect", p)).collect::<Result<Vec<_>, _>>()?;
            if front {
                d.append(&mut self.detect);
            }
            self.detect = d;
        }
        if let Some(v) = &s.detect_cmd {
            self.detect_cmd = v.iter().map(|p| re(origin, "detect_cmd", p)).collect::<Result<_, _>>()?;
        }
        if let Some(p) = s.port {
            self.port = p;
        }
        if let Some(h) = &s.health_path {
            self.health_path = h.clone();
        }
        if let Some(t) = s.probe_timeout_secs {
            if !(t > 0.0 && t < 86_400.0) {
                return Err(ProfileError(format!("{origin}: probe_timeout_secs must be > 0")));
            }
            self.probe_timeout_secs = t;
        }
        if let Some(p) = phase(origin, "port_opens", &s.port_opens)? {
            self.port_opens = p;
        }
        if let Some(m) = &s.stall_secs {
            for (k, v) in m {
                let p = Phase::parse(k)
                    .ok_or_else(|| ProfileError(format!("{origin}: stall_secs: unknown phase '{k}'")))?;
                self.stall_secs.insert(p, *v);
            }
        }
        if let Some(v) = &s.ps {
            self.ps = v.iter().map(|p| re(origin, "ps", p)).collect::<Result<_, _>>()?;
        }
        if let Some(p) = &f.proof {
            if !p.endpoint.starts_with('/') || p.tokens.is_empty() {
                return Err(ProfileError(format!("{origin}: proof: needs an endpoint path and `tokens`")));
            }
            if let Some(n) = p.no_drafts.as_deref().filter(|n| !matches!(*n, "degraded" | "unverified")) {
                return Err(ProfileError(format!("{origin}: proof: no_drafts is degraded or unverified, not '{n}'")));
            }
            if let Some(sp) = &p.speculation {
                if let Some(r) = &sp.text_drafters {
                    re(origin, "proof.speculation.text_drafters", r)?;
                }
                if let Some(l) = &sp.log {
                    let r = re(origin, "proof.speculation.log", l)?;
                    let names: Vec<&str> = r.capture_names().flatten().collect();
                    if !(names.contains(&"drafted") && names.contains(&"accepted")) {
                        return Err(ProfileError(format!(
                            "{origin}: proof.speculation.log needs (?P<drafted>..) and (?P<accepted>..)"
                        )));
                    }
                }
            }
            self.proof = Some(p.clone());
        }
        for g in &f.multi_node.peer_gone {
            self.peer_gone.push(re(origin, "multi_node.peer_gone", &g.pattern)?);
        }
        let mut repairs = f
            .repair
            .iter()
            .map(|r| crate::repair::Repair::compile(origin, &f.name, r).map_err(ProfileError))
            .collect::<Result<Vec<_>, _>>()?;
        if front {
            repairs.append(&mut self.repairs);
            self.repairs = repairs;
        } else {
            self.repairs.append(&mut repairs);
        }
        let c = &f.cmd;
        if c.dummy_health_flag.is_some() {
            self.cmd.dummy_health_flag = c.dummy_health_flag.clone();
            self.cmd.dummy_health_min = c.dummy_health_min;
        }
        self.cmd.hf_config |= c.hf_config;
        if c.no_api_flag.is_some() {
            self.cmd.no_api_flag = c.no_api_flag.clone();
        }
        if let Some(v) = &s.engine_titles {
            self.engine_titles = v.iter().map(|p| re(origin, "engine_titles", p)).collect::<Result<_, _>>()?;
        }
        if let Some(m) = &s.metrics {
            if m.waiting.is_none() && m.running.is_none() || m.tokens.is_empty() {
                return Err(ProfileError(format!(
                    "{origin}: metrics: needs `tokens` and at least one of `waiting`, `running`"
                )));
            }
            self.metrics = Some(m.clone());
        }
        for v in &f.history.versions {
            re(origin, &format!("history version '{}'", v.name), &v.regex)?;
        }
        for a in &f.history.args_line {
            re(origin, "history args_line", a)?;
        }
        self.history.extend_front(&f.history);
        let mut prefixes = Vec::new();
        for p in &f.prefix {
            let time = match &p.time {
                None => None,
                Some(t) => Some(
                    TsFormat::parse_name(t)
                        .ok_or_else(|| ProfileError(format!("{origin}: prefix: unknown time format '{t}'")))?,
                ),
            };
            prefixes.push(Prefix { re: prefix_re(origin, &p.regex)?, time });
        }
        let mut rules = Vec::new();
        for r in &f.rule {
            let what = format!("rule '{}'", r.name);
            let cause = match &r.cause {
                None => None,
                Some(c) => Some(
                    Cause::parse(c).ok_or_else(|| ProfileError(format!("{origin}: {what}: unknown cause '{c}'")))?,
                ),
            };
            let lazy = LazyRegex::parse(&r.pattern).map_err(|e| {
                let first = e.lines().last().unwrap_or("").trim().to_string();
                ProfileError(format!("{origin}: bad regex in {what}: {first}"))
            })?;
            let names = lazy.1.clone();
            let rule = Rule {
                name: r.name.clone(),
                profile: f.name.clone(),
                re: lazy.0,
                kind: r.kind,
                phase: phase(origin, &what, &r.phase)?,
                again: phase(origin, &what, &r.again)?,
                cause,
                hint: r.hint.clone(),
                terminal: r.terminal,
                force: r.force,
                source: r.source.clone(),
                narrow: r.narrow.clone(),
            };
            // An `implies` rule may name only a cause: its frames' phase is then the frame table's.
            let needs_phase = rule.kind == RuleKind::Phase || (rule.kind == RuleKind::Implies && rule.cause.is_none());
            if needs_phase && rule.phase.is_none() {
                return Err(ProfileError(format!("{origin}: {what}: kind needs a phase")));
            }
            let has = |n: &str| names.iter().any(|x| x == n);
            if rule.kind == RuleKind::Progress && !(has("k") && has("n")) {
                return Err(ProfileError(format!("{origin}: {what}: progress needs (?P<k>..) and (?P<n>..)")));
            }
            rules.push(rule);
        }
        if front {
            prefixes.append(&mut self.prefixes);
            rules.append(&mut self.rules);
        } else {
            self.prefixes.append(&mut prefixes);
            self.rules.append(&mut rules);
            prefixes = std::mem::take(&mut self.prefixes);
            rules = std::mem::take(&mut self.rules);
        }
        self.prefixes = prefixes;
        self.rules = rules;
        self.build_set()
    }

    pub fn stall_limit_secs(&self, p: Phase) -> u64 {
        self.stall_secs.get(&p).copied().unwrap_or_else(|| p.default_stall_secs())
    }
}

pub fn parse_file(origin: &str, text: &str) -> Result<ProfileFile, ProfileError> {
    toml::from_str::<ProfileFile>(text).map_err(|e| {
        let msg = e.message().replace('\n', " ");
        ProfileError(format!("{origin}: {msg}"))
    })
}

/// The set of known profiles, in detection order, `generic` last.
#[derive(Debug, Clone)]
pub struct Profiles {
    pub list: Vec<Profile>,
}

impl Profiles {
    /// Built-in profiles only.
    pub fn builtin() -> Profiles {
        Profiles::load(&[]).expect("built-in profiles are valid")
    }

    /// Built-ins extended by user files `(origin, text)`, applied in order.
    pub fn load(user: &[(String, String)]) -> Result<Profiles, ProfileError> {
        let mut list: Vec<Profile> = Vec::new();
        for (name, text) in BUILTIN {
            let f = parse_file(&format!("built-in profile {name}"), text)?;
            let mut p = Profile::empty(&f.name);
            p.merge(name, &f, false)?;
            list.push(p);
        }
        for (origin, text) in user {
            let f = parse_file(origin, text)?;
            if f.name.trim().is_empty() {
                return Err(ProfileError(format!("{origin}: name must not be empty")));
            }
            let p = match list.iter().position(|p| p.name == f.name) {
                Some(i) => {
                    list[i].merge(origin, &f, true)?;
                    &mut list[i]
                }
                None => {
                    let mut p = Profile::empty(&f.name);
                    p.merge(origin, &f, false)?;
                    let at = list.len() - 1; // before generic
                    list.insert(at, p);
                    &mut list[at]
                }
            };
            // A user's patterns are built now, so that one the set cannot take is an error at load.
            let set = rule_set(&p.name, &p.rules).map_err(|e| ProfileError(format!("{origin}: {}", e.0)))?;
            let _ = p.rule_set.set(set);
        }
        Ok(Profiles { list })
    }

    pub fn get(&self, name: &str) -> Option<&Profile> {
        self.list.iter().find(|p| p.name == name)
    }

    pub fn generic(&self) -> &Profile {
        self.get("generic").expect("generic profile")
    }

    /// Whether a rank's failure text (its root-cause lines) says a peer went away: the server kind's
    /// The `[[repair]]` rules for a server kind: its own, then the framework layer's.
    pub fn repairs_for(&self, kind: Option<&str>) -> Vec<&crate::repair::Repair> {
        let own = kind.and_then(|k| self.get(k)).filter(|p| p.name != "generic");
        own.into_iter().chain(std::iter::once(self.generic())).flat_map(|p| p.repairs.iter()).collect()
    }

    /// `[multi_node] peer_gone` patterns and the framework layer's.
    pub fn peer_gone<'a>(&self, kind: Option<&str>, lines: impl IntoIterator<Item = &'a str> + Clone) -> bool {
        let own = kind.and_then(|k| self.get(k)).filter(|p| p.name != "generic");
        own.into_iter()
            .chain(std::iter::once(self.generic()))
            .any(|p| p.peer_gone.iter().any(|r| lines.clone().into_iter().any(|l| r.is_match(l))))
    }

    /// The generation proof for a server kind: its own, else the framework layer's (OpenAI completions).
    pub fn proof_for(&self, kind: Option<&str>) -> &ProofSpec {
        kind.and_then(|k| self.get(k))
            .and_then(|p| p.proof.as_ref())
            .or(self.generic().proof.as_ref())
            .expect("the generic profile has a proof")
    }

    /// The server kind whose process patterns match a process title or command line (`vigil ps`).
    pub fn ps_kind(&self, cmdline: &str) -> Option<&str> {
        self.list.iter().find(|p| p.ps.iter().any(|r| r.is_match(cmdline))).map(|p| p.name.as_str())
    }

    pub fn names(&self) -> Vec<&str> {
        self.list.iter().map(|p| p.name.as_str()).collect()
    }

    /// The server kind named by a command line (`python -m sglang.launch_server ...`), if any.
    pub fn detect_cmd(&self, argv: &[String]) -> Option<&str> {
        let line = argv.join(" ");
        self.list.iter().find(|p| p.detect_cmd.iter().any(|r| r.is_match(&line))).map(|p| p.name.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_and_command_facts_are_data() {
        let p = Profiles::builtin();
        assert_eq!(p.proof_for(Some("llama-cpp")).endpoint, "/completion");
        assert_eq!(p.proof_for(Some("sglang")).accept_length_endpoint.as_deref(), Some("/server_info"));
        // kinds without their own proof use the framework layer's OpenAI completion
        assert!(p.proof_for(Some("tgi")).needs_model && p.proof_for(None).needs_model);
        assert!(!p.proof_for(Some("vllm")).no_drafts_is_degraded());
        assert!(p.proof_for(Some("llama-cpp")).no_drafts_is_degraded());
        let argv = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let sg = &p.get("sglang").unwrap().cmd;
        assert!(sg.dummy_health(&argv(&["x", "--node-rank", "1"])));
        assert!(!sg.dummy_health(&argv(&["x", "--node-rank=0"])));
        assert!(!p.get("vllm").unwrap().cmd.dummy_health(&argv(&["x", "--node-rank", "1"])));
        assert_eq!(p.ps_kind("python3 -m sglang.launch_server --model m"), Some("sglang"));
        assert_eq!(p.ps_kind("VLLM::EngineCore"), Some("vllm"));
        assert_eq!(p.ps_kind("/opt/llama-server -m x.gguf"), Some("llama-cpp"));
        assert_eq!(p.ps_kind("vim llama-server.txt"), None);
    }

    #[test]
    fn a_rank_serves_an_api_on_a_port_it_names_unless_its_command_starts_none() {
        let p = Profiles::builtin();
        let vllm = Some(&p.get("vllm").unwrap().cmd);
        let a = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
        assert!(serves_api(vllm, &a("vllm serve m --port 8001")));
        assert!(!serves_api(vllm, &a("vllm serve m --port 8001 --headless")));
        assert!(!serves_api(vllm, &a("vllm serve m --headless=true --port=8001")));
        assert!(!serves_api(vllm, &a("vllm serve m --headless")));
        assert!(serves_api(None, &a("server --port=9")));
        assert!(!serves_api(None, &a("server")), "no port named: the default port would be the head's");
    }

    #[test]
    fn a_bad_proof_section_is_an_error() {
        let text = "name = \"x\"\n[proof]\nendpoint = \"gen\"\nbody = {}\ntokens = [\"/n\"]\n";
        let err = Profiles::load(&[("u.toml".into(), text.into())]).unwrap_err();
        assert!(err.0.contains("u.toml: proof: needs an endpoint path"), "{}", err.0);
    }

    #[test]
    fn builtins_load() {
        let p = Profiles::builtin();
        assert_eq!(p.names(), vec!["sglang", "vllm", "llama-cpp", "tgi", "generic"]);
        for prof in &p.list {
            for r in &prof.rules {
                assert!(r.source.is_some() || prof.name == "generic", "{}: rule {} has no source", prof.name, r.name);
                // compiled lazily in use: every built-in pattern must compile
                assert!(Regex::new(r.re.as_str()).is_ok(), "{}: rule {}", prof.name, r.name);
            }
            // and every built-in set must build (it is built on first use)
            assert_eq!(prof.rule_set().len(), prof.rules.len(), "{}", prof.name);
        }
    }

    #[test]
    fn unknown_field_is_error() {
        let e = Profiles::load(&[("x.toml".into(), "name='x'\n[server]\nbogus=1\n".into())]).unwrap_err();
        assert!(e.0.contains("x.toml") && e.0.contains("bogus"), "{}", e.0);
    }

    #[test]
    fn bad_regex_is_error() {
        let t = "name='x'\n[[rule]]\nname='r'\nmatch='('\nkind='ready'\n";
        let e = Profiles::load(&[("x.toml".into(), t.into())]).unwrap_err();
        assert!(e.0.contains("bad regex"), "{}", e.0);
    }

    #[test]
    fn user_rules_come_first() {
        let t = "name='llama-cpp'\n[[rule]]\nname='mine'\nmatch='hello'\nkind='ready'\n";
        let p = Profiles::load(&[("x.toml".into(), t.into())]).unwrap();
        assert_eq!(p.get("llama-cpp").unwrap().rules[0].name, "mine");
    }

    #[test]
    fn detect_cmd() {
        let p = Profiles::builtin();
        let a = |s: &str| s.split(' ').map(String::from).collect::<Vec<_>>();
        assert_eq!(p.detect_cmd(&a("python -m sglang.launch_server --model-path x")), Some("sglang"));
        assert_eq!(p.detect_cmd(&a("vllm serve Qwen/Qwen3")), Some("vllm"));
        assert_eq!(p.detect_cmd(&a("/opt/bin/llama-server -m x.gguf")), Some("llama-cpp"));
        assert_eq!(p.detect_cmd(&a("text-generation-launcher --model-id x")), Some("tgi"));
        assert_eq!(p.detect_cmd(&a("sleep 10")), None);
    }
}
