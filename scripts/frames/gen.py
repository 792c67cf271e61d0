#!/usr/bin/env python3
"""Generate the frame table (issue #24): Python function -> phase, from the servers' own source.

For each server (SGLang, vLLM, TGI) and each source tree given (a release's installed package, or a TGI tag's
`server/` folder), this reads every .py file of the package with `ast`, builds a static call graph, and walks
it from each phase's entry functions, which the profiles name (`[[frame_entry]]` in
crates/vigil-core/profiles/<server>.toml, each with the file:line it was read at). A function reached from the
entries of exactly one phase is in that phase; one reached from two phases (the model's forward, run by the
KV profiling, the graph capture and serving alike) is left out, so the judge reads the next frame out. The
walk does not enter another phase's entry (the draft worker's init calls the target's weight loader: that
loader stays `weights`, the draft's own frames say `draft_weights`, and the judge takes the furthest).

Calls resolved (statically, conservatively):
- `f(...)`: a function of the same module, or one imported by name (`from m import f`, `import m` + `m.f`);
  a class name is its `__init__` (and `__post_init__`).
- `self.m(...)` / `cls.m(...)` / `super().m(...)` inside class C: `m` of C, of C's bases (by name, through the
  module's imports) and of C's subclasses in the package (an override may run instead).
- `x.m(...)` on anything else: `m` when exactly one function of that name exists in the whole package; in
  a second, broad serving walk, every function named `m`, for a name defined at most BROAD_MAX times (per-request code runs through objects whose type the
  source does not say: the speculative worker's forward, the model's). The broad walk writes no row: a start-up
  function it reaches is left out rather than taken for the start's.

Entries of phase `launch` (the scheduler's, the engine's, the workers' constructors) only stop the other phases'
walks, so that a function both the server's own start and the draft worker's init run is not taken for the
draft's; launch rows are not written (a launch frame tells the judge nothing).

Output: crates/vigil-core/profiles/frames.tsv, one row per (server, file, function) whose phase is the same in
every version where the function exists and where it was assigned at all, with those versions.

Usage: scripts/frames/gen.py [--sglang DIR ...] [--vllm DIR ...] [--tgi DIR ...] [--out PATH] [--chains PATH]
Without arguments: the golden table's venvs in ~/.cache/vigil/golden (scripts/golden) for SGLang and vLLM, plus
the older releases under VIGIL_FRAMES_OLD (one `<server>-<version>/` folder each, holding the package's .py files),
and TGI's tags (TGI_TAGS) from a git mirror of huggingface/text-generation-inference at VIGIL_TGI_REPO. The table of
2026-12-01 was made with:
  cd /work/frames-src && for v in vllm==0.6.3.post1 vllm==0.8.5 vllm==0.10.2 sglang==0.3.6.post3 \
      sglang==0.4.3.post2 sglang==0.4.6.post5 sglang==0.5.2; do pip download --no-deps --only-binary=:all: -d wheels $v; done
  (unzip each wheel's <package>/**/*.py into <package>-<version>/)
  VIGIL_FRAMES_OLD=/work/frames-src VIGIL_TGI_REPO=<mirror>.git python3 scripts/frames/gen.py     (12-20 min here)
"""
import argparse
import ast
import fnmatch
import glob
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
PROFILES = os.path.join(ROOT, "crates", "vigil-core", "profiles")
PKG = {"sglang": "sglang", "vllm": "vllm", "tgi": "text_generation_server"}
PHASES = ["launch", "dist_init", "weights", "draft_weights", "kv_cache", "compile", "cuda_graphs",
          "draft_cuda_graphs", "http", "warmup", "serving"]
# Functions that torch calls for the caller (nn.Module.__call__ runs `forward`; the model runs for the KV-cache
# profiling, the graph capture, the warmup and every request alike): the static walks see only the calls that name
# them, so a model's `forward` would be placed in whichever phase calls it by name (a fused-MoE layer's forward
# under a weight post-processing step read as `weights`, where its crashes come in serving). Never rows, unless a
# profile names the function as an entry (SGLang's forward_thread_func is the overlap worker's serving loop).
DISPATCHED = re.compile(r"^(?:_?forward\w*|__call__)$")
# The broad serving walk follows a name with at most this many definitions in the package (a name like `forward`
# or `get`, defined hundreds of times, would join every function to every other).
BROAD_MAX = 10
TGI_TAGS = ["v2.0.4", "v2.4.1", "v3.0.2", "v3.2.3", "v3.3.7"]


def load_entries(server):
    """[[frame_entry]] of the server's profile: (phase, file, qualname or '*')."""
    import tomllib
    with open(os.path.join(PROFILES, f"{server}.toml"), "rb") as f:
        prof = tomllib.load(f)
    out = []
    for e in prof.get("frame_entry", []):
        path, _, qual = e["at"].partition(":")
        if e["phase"] not in PHASES:
            sys.exit(f"{server}: frame_entry {e['at']}: phase {e['phase']} is not in the vocabulary")
        out.append((e["phase"], path, qual))
    return out


class Index:
    """Functions of one package tree: key (relfile, qualname) -> ast node; per module its imports."""

    def __init__(self, root, pkg):
        self.root = root  # folder holding the package folder
        self.pkg = pkg
        self.funcs = {}  # (rel, qual) -> node
        self.by_name = {}  # name -> [(rel, qual)]
        self.classes = {}  # (rel, cls) -> [base names]
        self.class_by_name = {}  # cls -> [(rel, cls)]
        self.imports = {}  # rel -> {local name: (module rel or None, attr or None)}
        for path in glob.glob(os.path.join(root, pkg, "**", "*.py"), recursive=True):
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            try:
                with open(path, encoding="utf-8-sig", errors="replace") as f:
                    tree = ast.parse(f.read())
            except (SyntaxError, ValueError):
                continue
            self._module(rel, tree)
        self.subclasses = {}
        for (rel, cls), bases in self.classes.items():
            for b in bases:
                for tgt in self.resolve_class(rel, b):
                    if tgt != (rel, cls):
                        self.subclasses.setdefault(tgt, []).append((rel, cls))

    def mod_rel(self, dotted):
        p = dotted.replace(".", "/")
        for cand in (p + ".py", p + "/__init__.py"):
            if os.path.exists(os.path.join(self.root, cand)):
                return cand
        return None

    def _module(self, rel, tree):
        imps = {}
        pkgparts = rel.split("/")[:-1]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkgparts[: len(pkgparts) - (node.level - 1)] if node.level > 1 else pkgparts
                    base = ".".join(up + ([base] if base else []))
                for a in node.names:
                    sub = self.mod_rel(f"{base}.{a.name}")
                    imps[a.asname or a.name] = (sub, None) if sub else (self.mod_rel(base), a.name)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    imps[a.asname or a.name.split(".")[0]] = (self.mod_rel(a.name), None) if a.asname else (None, None)
        self.imports[rel] = imps

        def visit(body, prefix, cls):
            for n in body:
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    q = f"{prefix}{n.name}"
                    self.funcs[(rel, q)] = (n, cls)
                    self.by_name.setdefault(n.name, []).append((rel, q))
                    visit(n.body, q + ".", cls)
                elif isinstance(n, ast.ClassDef):
                    q = f"{prefix}{n.name}"
                    self.classes[(rel, q)] = [ast.unparse(b).split("[")[0] for b in n.bases]
                    self.class_by_name.setdefault(n.name, []).append((rel, q))
                    visit(n.body, q + ".", q)

        visit(tree.body, "", None)

    def resolve_class(self, rel, name):
        """A class named in module rel: [(rel, cls)]."""
        if "." in name:
            head, _, attr = name.partition(".")
            m, a = self.imports.get(rel, {}).get(head, (None, None))
            if m and not a and (m, attr) in self.classes:
                return [(m, attr)]
            return []
        if (rel, name) in self.classes:
            return [(rel, name)]
        m, a = self.imports.get(rel, {}).get(name, (None, None))
        if m and a and (m, a) in self.classes:
            return [(m, a)]
        return []

    def methods(self, cls_key, name, seen=None):
        """`name` on class cls_key, its bases and its subclasses."""
        seen = seen if seen is not None else set()
        out = []

        def up(c):
            if c in seen:
                return
            seen.add(c)
            k = (c[0], f"{c[1]}.{name}")
            if k in self.funcs:
                out.append(k)
            for b in self.classes.get(c, []):
                for t in self.resolve_class(c[0], b):
                    up(t)

        below = set()

        def down(c):
            for s in self.subclasses.get(c, []):
                if s in below or s == cls_key:
                    continue
                below.add(s)
                k = (s[0], f"{s[1]}.{name}")
                if k in self.funcs and k not in out:
                    out.append(k)
                down(s)

        up(cls_key)
        down(cls_key)
        return out

    def callees(self, key, broad=False):
        node, cls = self.funcs[key]
        rel = key[0]
        out = set()
        cls_key = (rel, cls) if cls else None
        for n in ast.walk(node):
            if not isinstance(n, ast.Call):
                continue
            f = n.func
            if isinstance(f, ast.Name):
                out.update(self.by_local_name(rel, f.id))
            elif isinstance(f, ast.Attribute):
                v = f.value
                if isinstance(v, ast.Name) and v.id in ("self", "cls") and cls_key:
                    out.update(self.methods(cls_key, f.attr))
                elif isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "super" and cls_key:
                    for b in self.classes.get(cls_key, []):
                        for t in self.resolve_class(rel, b):
                            out.update(self.methods(t, f.attr))
                elif isinstance(v, ast.Name) and v.id in self.imports.get(rel, {}):
                    m, a = self.imports[rel][v.id]
                    if m and not a:
                        if (m, f.attr) in self.funcs:
                            out.add((m, f.attr))
                        elif (m, f.attr) in self.classes:
                            out.update(self.ctor((m, f.attr)))
                    elif m and a and (m, a) in self.classes:
                        out.update(self.methods((m, a), f.attr))
                    elif not f.attr.startswith("__"):
                        out.update(self.named(f.attr, broad))
                elif not f.attr.startswith("__"):
                    out.update(self.named(f.attr, broad))
        out.discard(key)
        return out

    def named(self, name, broad):
        """A call `x.name(...)` on an object of unknown type: the one function of that name; in a broad walk,
        every function of that name."""
        c = self.by_name.get(name, [])
        return c if len(c) == 1 or (broad and len(c) <= BROAD_MAX) else []

    def ctor(self, cls_key):
        return [k for m in ("__init__", "__post_init__") for k in self.methods(cls_key, m)][:4]

    def by_local_name(self, rel, name):
        if (rel, name) in self.funcs:
            return [(rel, name)]
        if (rel, name) in self.classes:
            return self.ctor((rel, name))
        m, a = self.imports.get(rel, {}).get(name, (None, None))
        if m and a:
            if (m, a) in self.funcs:
                return [(m, a)]
            if (m, a) in self.classes:
                return self.ctor((m, a))
        return []


def phases_of(index, entries):
    """(rel, qual) -> set of phases, walking from each phase's entries without entering another's."""
    starts = {}
    for phase, path, qual in entries:
        # `file:qualname`, both fnmatch patterns (`*` in a qualname also crosses dots)
        keys = [k for k in index.funcs if fnmatch.fnmatchcase(k[0], path) and fnmatch.fnmatchcase(k[1], qual)]
        for k in keys:
            starts.setdefault(k, set()).add(phase)
    # A broad launch entry (a whole module) gives way to a phase's own entry in it (SGLang's http_server.py is
    # launch code but for its warmup functions).
    for k, ps in starts.items():
        if len(ps) > 1:
            ps.discard("launch")
    reach = {}
    for k, ps in starts.items():
        reach.setdefault(k, set()).update(ps)
    parent = {}  # (phase, key) -> the caller it was first reached from, in the exact walks
    for phase, broad in [(p, False) for p in PHASES] + [("serving", True)]:
        todo = [k for k, ps in starts.items() if phase in ps]
        seen = set(todo)
        while todo:
            k = todo.pop(0)
            for c in sorted(index.callees(k, broad=broad)):
                if c in seen or (c in starts and phase not in starts[c]):
                    continue
                seen.add(c)
                # the broad serving walk only makes a function ambiguous; it writes no serving row
                reach.setdefault(c, set()).add("serving?" if broad else phase)
                if not broad:
                    parent[(phase, c)] = k
                todo.append(c)
    return reach, starts, parent


def chain(parent, phase, key):
    """The call chain from an entry of `phase` to key, outermost first."""
    out = [key]
    while (phase, out[-1]) in parent and len(out) < 40:
        out.append(parent[(phase, out[-1])])
    return out[::-1]


def table_for(server, trees):
    """trees: [(version, root)] -> rows {(file, func): (phase, [versions])} and a count of dropped keys."""
    entries = load_entries(server)
    per = {}  # (file, func) -> {version: set(phases)}
    found = {}
    where = {}  # entry -> where it was found in the newest version that has it
    entry_keys = set()  # (file, function name) of every entry function in some version
    chains_of = {}
    for version, root in trees:
        idx = Index(root, PKG[server])
        reach, starts, parent = phases_of(idx, entries)
        entry_keys.update((k[0], k[1].rsplit(".", 1)[-1]) for k in starts)
        chains_of[version] = (parent, {k: idx.funcs[k][0].lineno for k in idx.funcs}, starts)
        for ph, path, qual in entries:
            ks = sorted(k for k in starts if fnmatch.fnmatchcase(k[0], path) and fnmatch.fnmatchcase(k[1], qual))
            if ks:
                where[(ph, path, qual)] = f"{version} {ks[0][0]}:{idx.funcs[ks[0]][0].lineno} {ks[0][1]}" + (
                    f" (+{len(ks) - 1})" if len(ks) > 1 else "")
        found[version] = sum(1 for e in entries
                             if any(fnmatch.fnmatchcase(k[0], e[1]) and fnmatch.fnmatchcase(k[1], e[2]) for k in starts))
        for (rel, qual), ps in reach.items():
            func = qual.rsplit(".", 1)[-1]
            if func.startswith("<"):
                continue
            per.setdefault((rel, func), {}).setdefault(version, set()).update(ps)
        # A function name whose other definitions in the same file were not reached is ambiguous in a
        # traceback (which shows the name only): mark them reached from every phase.
        for (rel, qual) in idx.funcs:
            func = qual.rsplit(".", 1)[-1]
            if (rel, func) in per and version in per[(rel, func)] and (rel, qual) not in reach:
                per[(rel, func)][version].add("*")
        print(f"{server} {version}: {len(idx.funcs)} functions, {found[version]} of {len(entries)} entries found, "
              f"{len(reach)} reached", file=sys.stderr)
    rows, dropped = {}, 0
    for key, byv in per.items():
        if DISPATCHED.match(key[1]) and key not in entry_keys:
            dropped += 1
            continue
        ps = set().union(*byv.values())
        if "serving?" in ps:
            ps.discard("serving?")
            if ps - {"serving", "launch"}:
                ps.add("*")  # a start-up function that the serving walk may reach too
        if not ps or ps == {"launch"}:
            continue  # launch entries only stop the other phases' walks: a launch frame tells nothing
        if len(ps) == 1 and "*" not in ps:
            rows[key] = (next(iter(ps)), sorted(byv, key=vkey))
        else:
            dropped += 1
    missing = [e for e in entries if e not in where]
    if missing:
        print(f"{server}: entries found in no version: {missing}", file=sys.stderr)
    # Call chains for the tests (crates/vigil-core/tests/frames_from_source.rs): per phase, from the newest
    # version, the longest chains (up to 6) from an entry to a function whose row is in the table, every frame
    # of it either in the table with that phase or not in the table at all.
    newest = max(chains_of, key=vkey)
    parent, lines, _ = chains_of[newest]
    chains = []
    starts_newest = chains_of[newest][2]
    for phase in PHASES:
        # an entry alone is a chain of one frame
        cands = [(1, [k]) for k, ps in starts_newest.items()
                 if phase in ps and rows.get((k[0], k[1].rsplit(".", 1)[-1]), (None,))[0] == phase]
        for (ph, key) in parent:
            if ph != phase:
                continue
            c = chain(parent, phase, key)
            names = [(k[0], k[1].rsplit(".", 1)[-1]) for k in c]
            if (DISPATCHED.match(names[-1][1]) and names[-1] not in entry_keys) or rows.get(names[-1], (None,))[0] != phase:
                continue
            if any(n in rows and rows[n][0] != phase for n in names):
                continue
            cands.append((len(c), c))
        # the longest chain from each entry in turn, so that the chains start at different entries
        by_entry = {}
        for _, c in sorted(cands, key=lambda t: (-t[0], t[1])):
            by_entry.setdefault(c[0], []).append(c)
        picked = []
        while len(picked) < 6 and any(by_entry.values()):
            for e in sorted(by_entry):
                if by_entry[e] and len(picked) < 6:
                    picked.append(by_entry[e].pop(0))
        for c in picked:
            chains.append((phase, newest, [(k[0], lines[k], k[1].rsplit(".", 1)[-1]) for k in c]))
    return rows, dropped, where, chains


def vkey(v):
    return [int(x) if x.isdigit() else x for x in re.split(r"[.\-]", v.lstrip("v"))]


def golden_trees(server):
    base = os.path.expanduser("~/.cache/vigil/golden")
    out = []
    # Older releases, from their wheels (`pip download --no-deps`; only the .py files are read): VIGIL_FRAMES_OLD
    # is a folder of `<server>-<version>/` trees.
    old = os.environ.get("VIGIL_FRAMES_OLD")
    if old:
        for d in glob.glob(os.path.join(old, f"{server}-*")):
            if os.path.isdir(os.path.join(d, PKG[server])):
                out.append((d.rsplit("-", 1)[1], d))
    for d in glob.glob(os.path.join(base, f"{server}-*")):
        sp = glob.glob(os.path.join(d, "lib", "python3*", "site-packages"))
        if sp and os.path.isdir(os.path.join(sp[0], PKG[server])):
            out.append((d.rsplit("-", 1)[1], sp[0]))
    return sorted(out, key=lambda t: vkey(t[0]))


def tgi_trees(repo, tmp):
    out = []
    for tag in TGI_TAGS:
        dest = os.path.join(tmp, tag)
        os.makedirs(dest, exist_ok=True)
        tar = subprocess.run(["git", "--git-dir", repo, "archive", tag, "server/text_generation_server"],
                             capture_output=True, timeout=300, check=True).stdout
        subprocess.run(["tar", "-x", "-C", dest, "--strip-components=1"], input=tar, check=True, timeout=300)
        out.append((tag.lstrip("v"), dest))
    return out


def ranges(versions, all_versions):
    """'0.5.10-0.5.23' for a run of consecutive versions of all_versions, comma-joined."""
    idx = [all_versions.index(v) for v in versions]
    out, start = [], idx[0]
    for a, b in zip(idx, idx[1:] + [None]):
        if b != a + 1:
            out.append(all_versions[start] if start == a else f"{all_versions[start]}-{all_versions[a]}")
            start = b
    return ",".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sglang", nargs="*")
    ap.add_argument("--vllm", nargs="*")
    ap.add_argument("--tgi", nargs="*")
    ap.add_argument("--out", default=os.path.join(PROFILES, "frames.tsv"))
    ap.add_argument("--chains", default=os.path.join(ROOT, "crates", "vigil-core", "tests", "frames-chains.tsv"))
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="vigil-frames-")
    sources = {}
    for server in ("sglang", "vllm"):
        given = getattr(a, server)
        sources[server] = [(os.path.basename(p.rstrip("/")), p) for p in given] if given else golden_trees(server)
    if a.tgi:
        sources["tgi"] = [(os.path.basename(p.rstrip("/")), p) for p in a.tgi]
    elif os.environ.get("VIGIL_TGI_REPO"):
        sources["tgi"] = tgi_trees(os.environ["VIGIL_TGI_REPO"], tmp)
    lines = [
        "# The frame table (issue #24): a Python traceback frame -> the phase the process was in.",
        "# Generated by scripts/frames/gen.py from the servers' own source; do not edit by hand: change the",
        "# [[frame_entry]] lines of a profile and run the script again (see its docstring for the method).",
        "# Versions read: " + "; ".join(f"{s} {', '.join(v for v, _ in t)}" for s, t in sources.items()),
        "# server\tfile\tfunction\tphase\tversions",
    ]
    stats = []
    chain_lines = ["# Call chains read from the servers' source by scripts/frames/gen.py (file:line:function, outermost",
                   "# first): the frame-table tests build tracebacks from them. server, phase, version, chain."]
    for server, trees in sources.items():
        if not trees:
            sys.exit(f"no source trees for {server}")
        rows, dropped, where, chains = table_for(server, trees)
        for phase, version, c in chains:
            chain_lines.append(f"{server}\t{phase}\t{version}\t" + " > ".join(f"{f}:{n}:{fn}" for f, n, fn in c))
        allv = [v for v, _ in trees]
        for (ph, path, qual), at in sorted(where.items()):
            lines.insert(4, f"# entry {server} {ph} {path}:{qual} -> {at}")
        per_phase = {}
        for (f, fn), (ph, vs) in sorted(rows.items()):
            lines.append(f"{server}\t{f}\t{fn}\t{ph}\t{ranges(vs, allv)}")
            per_phase[ph] = per_phase.get(ph, 0) + 1
        stats.append(f"{server}: {len(rows)} rows ({dropped} names left out as reached from several phases); "
                     + ", ".join(f"{p} {per_phase.get(p, 0)}" for p in PHASES if per_phase.get(p)))
    with open(a.out, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    with open(a.chains, "w", encoding="utf-8") as f:
        f.write("\n".join(chain_lines) + "\n")
    for s in stats:
        print(s)


if __name__ == "__main__":
    main()
