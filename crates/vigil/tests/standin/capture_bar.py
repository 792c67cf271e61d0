#!/usr/bin/env python3
"""A stand-in for vLLM's CUDA-graph capture as its log shows it: a kv-cache line, then a tqdm bar on stderr
that redraws one line with `\\r` (tqdm writes the `\\r` before each state, and one newline when the bar
closes). No real server captures graphs on this machine, and none stops its capture on demand.
Used by crates/vigil/tests/progress_bars.rs.

--every S      seconds between two states of the bar (default 1)
--advance N    states that advance the count, then the bar stops advancing
--total N      the bar's total (default 1000: it never finishes within the test)
--stuck-redraw S  once stopped, redraw the bar once at the same count after S seconds (tqdm's monitor
               thread refreshes a stuck bar like this); 0: never
--desc-env VAR the bar's description ends with the value of this environment variable
--times FILE   one `K UNIX_TIME` line per advance, written right after the state (the test's clock)
After the last advance the process stays alive without output until it is stopped.
"""
import argparse
import os
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--every", type=float, default=1.0)
ap.add_argument("--advance", type=int, required=True)
ap.add_argument("--total", type=int, default=1000)
ap.add_argument("--stuck-redraw", type=float, default=0.0)
ap.add_argument("--desc-env")
ap.add_argument("--times", required=True)
a = ap.parse_args()

print("(EngineCore_0 pid=%d) INFO 02-08 08:54:10 [kv_cache_utils.py:853] Maximum concurrency for "
      "16,384 tokens per request: 43.38x" % os.getpid(), flush=True)

DESC = "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)"
if a.desc_env:
    DESC += " " + os.environ.get(a.desc_env, "")
start = time.monotonic()


def state(k):
    pct = 100 * k // a.total
    filled = 10 * k // a.total
    bar = "\u2588" * filled + " " * (10 - filled)
    el = int(time.monotonic() - start)
    return "\r%s: %3d%%|%s| %d/%d [%02d:%02d<00:00,  1.00it/s]" % (DESC, pct, bar, k, a.total, el // 60, el % 60)


times = open(a.times, "w")
err = sys.stderr
err.write(state(0))
err.flush()
next_at = time.monotonic()
for k in range(1, a.advance + 1):
    next_at += a.every
    time.sleep(max(0.0, next_at - time.monotonic()))
    err.write(state(k))
    err.flush()
    times.write("%d %.6f\n" % (k, time.time()))
    times.flush()
if a.stuck_redraw > 0:
    time.sleep(a.stuck_redraw)
    err.write(state(a.advance))
    err.flush()
while True:
    time.sleep(60)
