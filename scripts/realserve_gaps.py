#!/usr/bin/env python3
"""Silences of the real servers' starts (issue #23 step 6: stall defaults that fit real starts).

usage: scripts/realserve_gaps.py CAPTURE_DIR...   (unpacked realserve-<stack>-<scenarios>.tgz folders)

For every run whose server.log carries timestamps (vLLM 'MM-DD HH:MM:SS', SGLang '[YYYY-MM-DD HH:MM:SS]'):
the time from the keeper's start (state.json started_unix_ms) to the first stamped line (Python imports,
silent), and the longest gap between two stamped lines after it, with the line that ended the gap. One-second
resolution (the servers' stamps)."""
import datetime as dt, json, os, re, sys

VLLM = re.compile(r"(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)")
SGL = re.compile(r"^\[(\d{4})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)")


def stamp(line, year):
    m = SGL.search(line)
    if m:
        return dt.datetime(*map(int, m.groups()), tzinfo=dt.timezone.utc).timestamp()
    m = VLLM.search(line)
    if m and ("INFO" in line or "WARNING" in line or "ERROR" in line or "DEBUG" in line):
        mo, d, h, mi, s = map(int, m.groups())
        return dt.datetime(year, mo, d, h, mi, s, tzinfo=dt.timezone.utc).timestamp()
    return None


rows = []
for cap in sys.argv[1:]:
    for tag in sorted(os.listdir(cap)):
        for run in sorted(os.listdir(os.path.join(cap, tag))):
            d = os.path.join(cap, tag, run, "run")
            if not os.path.isfile(os.path.join(d, "server.log")):
                continue
            st = json.load(open(os.path.join(d, "state.json")))
            t0 = st["started_unix_ms"] / 1000
            year = dt.datetime.fromtimestamp(t0, dt.timezone.utc).year
            first, prev, best = None, None, (0, "")
            for line in open(os.path.join(d, "server.log"), errors="replace"):
                t = stamp(line, year)
                if t is None:
                    continue
                if first is None:
                    first = t
                if prev is not None and t - prev > best[0]:
                    best = (t - prev, line.strip()[:110])
                prev = t
            if first is None:
                continue
            rows.append((tag.split("-")[0], run, first - t0, best[0], best[1]))
print(f"{'server':<7} {'run':<10} {'to 1st line':>11} {'longest gap':>11}  line after the gap")
for r in rows:
    print(f"{r[0]:<7} {r[1]:<10} {r[2]:>10.0f}s {r[3]:>10.0f}s  {r[4]}")
