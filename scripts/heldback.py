#!/usr/bin/env python3
"""Move a random 20 % of the project corpus, by source, into corpus/heldback/ (issue #24, step 6).

The held-back slice is what nobody reads while writing rules: the corpus test scores it apart and prints only
its totals (`heldback_scores_near_the_rest` in crates/vigil-core/tests/corpus.rs), so the score on logs never
seen can be predicted from it.

- Drawn from the public-tracker folders (llama-cpp, sglang, tgi, vllm), per server (20 % of each server's
  sources, rounded), with Python's random.Random(SEED).
- A source is the `# SOURCE:` line without its `#anchor`: logs from one issue go together.
- Not drawn: corpus/captured (its logs are replayed live by captured_live.rs and diagnose_cli.rs) and logs
  that tests embed by path (history.rs, timeline.rs), found by grepping crates/ for their names.

Usage: scripts/heldback.py [--seed 20261201] [--dry-run]
Re-running on a corpus that already has corpus/heldback/ refuses (the slice is drawn once).
"""
import argparse
import os
import random
import re
import subprocess
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
CORPUS = os.path.join(ROOT, "corpus")
SERVERS = ["llama-cpp", "sglang", "tgi", "vllm"]
SHARE = 0.20


def source_of(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith("# SOURCE:"):
                return line[len("# SOURCE:"):].strip().split("#")[0].split()[0]
            if line.startswith("# ---"):
                break
    sys.exit(f"{path}: no SOURCE line")


def referenced():
    out = subprocess.run(["grep", "-rhoE", r"corpus/[a-z-]+/[A-Za-z0-9._-]+\.log", "crates", "scripts", "docs"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60).stdout
    return {l.strip() for l in out.splitlines()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args()
    dest_root = os.path.join(CORPUS, "heldback")
    if os.path.isdir(dest_root) and not a.dry_run:
        sys.exit("corpus/heldback exists: the slice is drawn once")
    refs = referenced()
    rng = random.Random(a.seed)
    moved = []
    for server in SERVERS:
        d = os.path.join(CORPUS, server)
        by_src = {}
        for f in sorted(os.listdir(d)):
            if f.endswith(".log"):
                by_src.setdefault(source_of(os.path.join(d, f)), []).append(f)
        eligible = sorted(s for s, fs in by_src.items() if not any(f"corpus/{server}/{f}" in refs for f in fs))
        k = round(SHARE * len(by_src))
        pick = sorted(rng.sample(eligible, k))
        files = sorted(f for s in pick for f in by_src[s])
        print(f"{server}: {len(by_src)} sources, {len(eligible)} eligible, {k} held back ({len(files)} logs)")
        moved += [(server, f) for f in files]
    if a.dry_run:
        return
    for server in SERVERS:
        os.makedirs(os.path.join(dest_root, server), exist_ok=True)
        idx = os.path.join(CORPUS, server, "INDEX.tsv")
        mine = {f for s, f in moved if s == server}
        keep, held = [], []
        with open(idx, encoding="utf-8") as fh:
            for line in fh:
                name = line.split("\t", 1)[0].split("/", 1)[-1]
                (held if name in mine else keep).append(line)
        with open(idx, "w", encoding="utf-8") as fh:
            fh.writelines(keep)
        with open(os.path.join(dest_root, server, "INDEX.tsv"), "w", encoding="utf-8") as fh:
            fh.writelines(held)
        for f in sorted(mine):
            subprocess.run(["git", "mv", f"corpus/{server}/{f}", f"corpus/heldback/{server}/{f}"], cwd=ROOT,
                           check=True, timeout=60)
    print(f"moved {len(moved)} logs (seed {a.seed})")


if __name__ == "__main__":
    main()
