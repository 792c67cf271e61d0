#!/usr/bin/env python3
"""`vigil diagnose` throughput and memory on two logs, for one or more vigil binaries side by side.

  synthetic : SGLang decode lines (the 1 GiB log of scripts/bench.py): one line shape, the fast path.
  corpus    : the bodies of every real corpus log (../shared/corpus and corpus/) concatenated and repeated to
              the requested size: varied real lines from four servers, what the rules really face.

Each binary reads each log twice; the table gives the better wall time, MiB/s and peak RSS (from wait4).
Usage: scripts/bench_diagnose.py [--gb 1.0] [--corpus-mb 300] BINARY [BINARY...]
"""
import argparse, glob, os, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def synthetic(path, gb):
    block = b"".join(
        b"[2025-01-01 00:%02d:%02d TP0] Decode batch. #running-req: 1, #token: 2048, token usage: 0.01, "
        b"gen throughput (token/s): 100.00, #queue-req: 0\n" % (i // 60 % 60, i % 60) for i in range(2000))
    with open(path, "wb") as f:
        f.write(b"[2025-01-01 00:00:00 TP0] Load weight begin. avail mem=70.00 GB\n")
        n = 0
        while n < gb * (1 << 30):
            f.write(block); n += len(block)
        f.write(b"[2025-01-01 00:10:00 TP0] Capture cuda graph end. Time elapsed: 12.1 s\n")


def corpus(path, mb):
    bodies = []
    for d in (os.path.join(ROOT, "..", "shared", "corpus"), os.path.join(ROOT, "corpus")):
        for f in sorted(glob.glob(os.path.join(d, "*", "*.log"))):
            data = open(f, "rb").read()
            i = data.find(b"\n# ---\n")
            bodies.append(data[i + 7:] if i >= 0 else data)
    block = b"\n".join(bodies)
    with open(path, "wb") as f:
        n = 0
        while n < mb * (1 << 20):
            f.write(block); n += len(block)
    return len(bodies)


def run(binary, path):
    best = None
    for _ in range(2):
        t0 = time.monotonic()
        pid = os.fork()
        if pid == 0:
            fd = os.open(os.devnull, os.O_WRONLY)
            os.dup2(fd, 1)
            os.execv(binary, [binary, "diagnose", "-q", path])
        _, status, ru = os.wait4(pid, 0)
        dt = time.monotonic() - t0
        code = os.waitstatus_to_exitcode(status)
        assert code in (0, 3, 5, 6, 7), (binary, code)
        best = min(best or (dt, ru.ru_maxrss), (dt, ru.ru_maxrss))
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--corpus-mb", type=float, default=300)
    ap.add_argument("binaries", nargs="+")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        logs = [("synthetic decode log", os.path.join(d, "syn.log")), ("real corpus bodies", os.path.join(d, "cor.log"))]
        synthetic(logs[0][1], a.gb)
        n = corpus(logs[1][1], a.corpus_mb)
        print(f"corpus log: {n} real bodies repeated to {os.path.getsize(logs[1][1]) / (1 << 20):.0f} MiB\n")
        print("| binary | log | size MiB | wall s | MiB/s | peak RSS MiB |\n|---|---|---|---|---|---|")
        for b in a.binaries:
            for name, p in logs:
                size = os.path.getsize(p) / (1 << 20)
                dt, kb = run(b, p)
                print(f"| {b} | {name} | {size:.0f} | {dt:.1f} | {size / dt:.1f} | {kb / 1024:.1f} |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
