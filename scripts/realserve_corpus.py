#!/usr/bin/env python3
"""Whole server logs captured on the GPU machine (tests/gpu/realserve-extra.sh + ../shared/gpu/realserve) into
the corpus, each with the label written by a person from the log before any rule change (issue #23).

usage: scripts/realserve_corpus.py LABELS.tsv CAPTURE_DIR...

LABELS.tsv: one line a run: stack, run name, EXPECT (verdict=.. phase=.. cause=..), LIVE (what the live watch
must say: verdict/cause), note. CAPTURE_DIR: an unpacked realserve-<stack>-<scenarios>.tgz (its <tag>/ folder),
with <run>/run/server.log (the keeper's log: the server's stdout and stderr as it wrote them) and
<run>/run/state.json. Writes corpus/captured/<stack>-<version>-<run>.log (header + the log, byte for byte) and
corpus/captured/LIVE.tsv (file, exit code or 'running', signal, expected live verdict)."""
import csv, json, os, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "corpus", "captured")
VERSION = {"vllm": "vLLM 0.26.0 (torch 2.11.0+cu130), one H200", "sglang": "SGLang 0.5.17 (torch 2.11.0+cu130), one H200"}
SHORT = {"vllm": "vllm-0.26.0", "sglang": "sglang-0.5.17"}


def main():
    labels, caps = sys.argv[1], sys.argv[2:]
    runs = {}
    for cap in caps:
        for tag in os.listdir(cap):
            d = os.path.join(cap, tag)
            if not os.path.isdir(d):
                continue
            stack = tag.split("-")[0]
            for r in os.listdir(d):
                if os.path.isfile(os.path.join(d, r, "run", "server.log")):
                    runs[(stack, r)] = (os.path.join(d, r), tag)
    os.makedirs(OUT, exist_ok=True)
    live = []
    for row in csv.reader(open(labels), delimiter="\t"):
        if not row or row[0].startswith("#"):
            continue
        stack, run, expect, live_expect, note = row
        if (stack, run) not in runs:
            # imported before from a capture not given now: its log and LIVE.tsv row stay as they are
            if os.path.exists(os.path.join(OUT, f"{SHORT[stack]}-{run}.log")):
                continue
            sys.exit(f"no capture for {stack}/{run}")
        d, tag = runs[(stack, run)]
        body = open(os.path.join(d, "run", "server.log"), "rb").read()
        st = json.load(open(os.path.join(d, "run", "state.json")))
        cmd = open(os.path.join(d, "cmd.txt")).read().strip() if os.path.exists(os.path.join(d, "cmd.txt")) else ""
        cmd = cmd.split(" -- ", 1)[-1]
        name = f"{SHORT[stack]}-{run}.log"
        head = [
            f"# SOURCE: captured 2026-12-01 on the GPU machine by tests/gpu/realserve-extra.sh (scenario set {tag}, run {run}); the server's whole stdout+stderr as vigil's keeper wrote it",
            f"# VERSION: {VERSION[stack]}",
            f"# NOTE: command: {cmd[:400]}",
            f"# LABEL: {note}",
            f"# PROOF: read from the log by a person before any rule change",
            f"# SERVER: {stack}",
            f"# EXPECT: {expect}",
            "# ---",
        ]
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(("\n".join(head) + "\n").encode())
            f.write(body)
        if st.get("running"):
            # still running when the run folder was copied (a ready server, stopped by vigil down after that)
            live.append([name, "running", "-", live_expect])
        else:
            live.append([name, str(st.get("exit_code")), str(st.get("exit_signal")), live_expect])
    # rows of logs imported earlier from captures not given now are kept
    done = {r[0] for r in live}
    try:
        for line in open(os.path.join(OUT, "LIVE.tsv")):
            row = line.rstrip("\n").split("\t")
            if line.startswith("#") or len(row) < 4 or row[0] in done:
                continue
            live.append(row)
    except FileNotFoundError:
        pass
    with open(os.path.join(OUT, "LIVE.tsv"), "w") as f:
        f.write("# file\texit_code ('running': alive when the run folder was copied)\texit_signal\tlive verdict the watch must reach (verdict[/cause]); from the label, not from vigil\n")
        for r in sorted(live):
            f.write("\t".join(r) + "\n")


if __name__ == "__main__":
    main()
