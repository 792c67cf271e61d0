#!/usr/bin/env python3
"""A TP=2 scenario's output from the GPU machine (tests/gpu/tp2.sh through the realserve kit) into a capture
folder for crates/vigil-core/tests/tp2_replay.rs (issue #32).

usage: scripts/tp2_captures.py SCENARIO_DIR OUT_DIR "LABEL"

SCENARIO_DIR: an unpacked realserve-<stack>-<scenarios>.tgz's <tag>/<tN>/ (rankN.jsonl, cmd-rankN.txt,
gpu-after.txt, runN/ = vigil's run folder of rank N). Writes OUT_DIR/rankN.log (the keeper's server.log, byte
for byte), rankN.jsonl (vigil's --json lines without the per-second `gpu` events), rankN.end (how the rank's
server ended, from the run's state.json: `exit N` / `signal N` when it ended on its own (the rank's own watch
saw it end); when vigil's stop came first: `stalled` where the scenario stopped a process (t2), else `running`),
cmd-rankN.txt, gpu-after.txt, and LABEL (`verdict phase cause rank [stall_ms=N]`, given by the person who ran
the scenario, from what was done to which rank)."""
import json, os, shutil, sys

src, out, label = sys.argv[1], sys.argv[2], sys.argv[3]
os.makedirs(out, exist_ok=True)
stall_scenario = "stall_ms=" in label
for r in (0, 1):
    run = os.path.join(src, f"run{r}")
    shutil.copyfile(os.path.join(run, "server.log"), os.path.join(out, f"rank{r}.log"))
    with open(os.path.join(src, f"rank{r}.jsonl"), errors="replace") as f, open(os.path.join(out, f"rank{r}.jsonl"), "w") as g:
        for line in f:
            try:
                if json.loads(line).get("event") == "gpu":
                    continue
            except ValueError:
                pass
            g.write(line)
    st = json.load(open(os.path.join(run, "state.json")))
    # the server ended on its own when the rank's own watch saw it end (its verdict `crashed`, or its end after
    # ready in a note); else vigil stopped it (stop.json; the tarball keeps whole seconds only, too coarse to order)
    own = False
    for line in open(os.path.join(out, f"rank{r}.jsonl"), errors="replace"):
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if e.get("event") == "verdict" and e.get("verdict") == "crashed":
            own = True
        m = e.get("message") or ""
        if e.get("event") == "note" and "after ready: crashed" in m and m.startswith(("its server", f"rank {r}'s server")):
            own = True
    stopped_first = os.path.exists(os.path.join(run, "stop.json")) and not own
    if stopped_first:
        end = "stalled" if stall_scenario else "running"
    elif st.get("exit_code") is not None:
        end = f"exit {st['exit_code']}"
    elif st.get("exit_signal") is not None:
        end = f"signal {st['exit_signal']}"
    else:
        end = "running"
    open(os.path.join(out, f"rank{r}.end"), "w").write(end + "\n")
    for f in (f"cmd-rank{r}.txt",):
        if os.path.exists(os.path.join(src, f)):
            shutil.copyfile(os.path.join(src, f), os.path.join(out, f))
if os.path.exists(os.path.join(src, "gpu-after.txt")):
    shutil.copyfile(os.path.join(src, "gpu-after.txt"), os.path.join(out, "gpu-after.txt"))
open(os.path.join(out, "LABEL"), "w").write(label + "\n")
print(out, [open(os.path.join(out, f"rank{r}.end")).read().strip() for r in (0, 1)])
