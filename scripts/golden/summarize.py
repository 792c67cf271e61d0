#!/usr/bin/env python3
"""Print a summary of crates/vigil/tests/golden/check-golden.jsonl: the derived context length per config per
server version, the cases where versions/servers disagree, and the distinct refusal messages.

Usage: python3 scripts/golden/summarize.py [PATH]
"""

import collections
import json
import sys
from pathlib import Path

path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2] / "crates/vigil/tests/golden/check-golden.jsonl"
rows = [json.loads(l) for l in open(path)]
cols = []
for r in rows:
    k = f"{r['server']} {r['version']}"
    if k not in cols:
        cols.append(k)


def cell(res):
    if "context_len" in res and "accepted" not in res:
        return str(res["context_len"])
    if "harness_error" in res:
        return "(harness)"
    if res.get("accepted") is False:
        return "refused"
    if res.get("accepted") is True:
        return "ok" + (f" {res['context_len']}" if "context_len" in res else "") + (f" parsed={res['parsed']}" if "parsed" in res else "")
    return json.dumps(res)


def table(suffix, title):
    t = collections.defaultdict(dict)
    for r in rows:
        if r["case"].endswith(suffix) or (suffix.startswith("#") and f"{suffix}" in r["case"]):
            key = r["case"] + ("" if not r["inputs"]["env"] else " " + ",".join(f"{k}={v}" for k, v in r["inputs"]["env"].items())) + (" " + " ".join(r["inputs"]["flags"]) if r["inputs"]["flags"] and "#draft" in r["case"] else "")
            t[key][f"{r['server']} {r['version']}"] = cell(r["result"])
    print(f"\n## {title}\n")
    print("| case | " + " | ".join(cols) + " |")
    print("|---|" + "---|" * len(cols))
    for k in sorted(t):
        print(f"| {k} | " + " | ".join(t[k].get(c, "") for c in cols) + " |")
    return t


t = table("#derive", "derived context length, no flags")
print("\n## disagreements (derive)\n")
for k in sorted(t):
    vals = {c: v for c, v in t[k].items()}
    if len(set(vals.values())) > 1:
        print(f"- {k}: " + ", ".join(f"{c}={v}" for c, v in vals.items()))

# over-length, parse and drafts: rows that differ across versions of one server or across servers
print("\n## disagreements (other rows, same case+flags+env)\n")
g = collections.defaultdict(dict)
for r in rows:
    if r["case"].endswith("#derive") or "#tp#" in r["case"]:
        continue
    key = (r["case"], tuple(r["inputs"]["flags"]), tuple(sorted(r["inputs"]["env"].items())))
    g[key][f"{r['server']} {r['version']}"] = cell(r["result"])
for k in sorted(g):
    if len(set(g[k].values())) > 1:
        print(f"- {k[0]} {' '.join(k[1])} {dict(k[2])}: " + ", ".join(f"{c}={v}" for c, v in g[k].items()))

print("\n## distinct refusal messages\n")
seen = collections.OrderedDict()
for r in rows:
    m = r["result"].get("message") if r["result"].get("accepted") is False else None
    if m:
        seen.setdefault((r["server"], m), []).append(f"{r['version']} {r['case']}")
for (srv, m), where in seen.items():
    print(f"- [{srv}] ({len(where)} rows, e.g. {where[0]}): {m}")
print("\n## attention-layer refusal sites (#attn#): every one must be a heads / KV-heads check\n")
sites = collections.defaultdict(set)
for r in rows:
    m = r["result"].get("message", "") if "#attn#" in r["case"] and r["result"].get("accepted") is False else ""
    if m:
        site = m.split(": ", 1)
        sites[(r["server"], site[0], site[1].split(" (")[0] if len(site) > 1 else "")].add(r["version"])
for (srv, where, line), vs in sorted(sites.items()):
    print(f"- [{srv}] {where}: `{line}` ({', '.join(sorted(vs, key=lambda v: [int(x) for x in v.split('.')]))})")
print("\n## harness errors\n")
for r in rows:
    if "harness_error" in r["result"]:
        print(f"- {r['server']} {r['version']} {r['case']}: {r['result']['harness_error'][:200]}")
print(f"\n{len(rows)} rows")
