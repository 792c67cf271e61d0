#!/usr/bin/env python3
"""vigil benchmarks against the real llama-server. Prints a markdown table.

Scenarios (release build, N runs each):
  ready-lag   : time from the first 200 on /health (an independent 1 ms prober marks it) to vigil's exit.
                The server is SIGSTOPped at spawn and continued 300 ms later so the start is a window.
  crash-time  : a server dying on a truncated model; time from its exit (harness waitpid) to vigil's exit.
  diagnose-rss: peak RSS and wall time of `vigil diagnose` on a >= 1 GB log.
  probe-log   : `vigil probe --log` on a 2 GiB log (sparse, 8 MiB of real lines at its end): wall time and
                peak RSS (the child's own ru_maxrss from wait4); bound: --timeout 10s, 32 MiB.
  wait-rss    : peak RSS (/usr/bin/time) of `vigil wait --no-generate` from the real llama-server's launch to
                its ready verdict: with --log (the kind read from the log; also with a log whose first lines
                name no server kind), --log --pid (the kind from the command line), --pid alone; goal <= 16 MiB.
  listen      : issue #37, `--listen`: the ready lag with --log (as ready-lag) without a listener, with an idle
                one, and with 1,000 SSE clients attached to /events (connected, and reading, before the server is
                continued); peak RSS of `wait --listen` idle and with the 1,000 clients; goal <= 16 MiB idle.
Usage: scripts/bench.py [--runs N] [--gb G] [--only probe-log|wait-rss|listen] [--vigil PATH]
       (after scripts/setup.sh and cargo build --release; --vigil measures another build)
"""
import argparse, os, resource, signal, socket, statistics, subprocess, sys, tempfile, threading, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VIGIL = os.path.join(ROOT, "target/release/vigil")
HOME = os.path.expanduser("~")
SERVER = os.environ.get("VIGIL_LLAMA_SERVER", f"{HOME}/.cache/vigil/llama-server-0.3.36-rpc/bin/llama-server")
MODELS = os.environ.get("VIGIL_MODELS", f"{HOME}/.cache/vigil/models-v3")


def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p


def health_ok(port):
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=0.2)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = s.recv(64); s.close()
        return data.startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def prober(port, stop, out):
    while not stop.is_set():
        if health_ok(port):
            out.append(time.monotonic()); return
        time.sleep(0.001)


def ready_lag(with_log, d, listen=None, sse=0, rss=None):
    """`listen`: a port for --listen; `sse`: that many /events clients attached before the server goes on;
    `rss`: a list that gets vigil's peak RSS in MiB (wait4)."""
    port = free_port(); log = os.path.join(d, f"r{port}.log")
    f = open(log, "ab")
    srv = subprocess.Popen([SERVER, "-m", f"{MODELS}/tiny.gguf", "--host", "127.0.0.1", "--port", str(port), "-c", "256"],
                           stdout=f, stderr=f)
    os.kill(srv.pid, signal.SIGSTOP)
    args = [VIGIL, "wait", "-q", "--url", f"http://127.0.0.1:{port}/health", "--timeout", "30s"]
    if with_log:
        args += ["--log", log]
    if listen:
        args += ["--listen", str(listen), "--metrics-linger", "0s"]
    v = subprocess.Popen(args, stdout=subprocess.DEVNULL)
    clients = attach_sse(listen, sse) if sse else None
    stop = threading.Event(); first = []
    th = threading.Thread(target=prober, args=(port, stop, first)); th.start()
    time.sleep(0.3)
    os.kill(srv.pid, signal.SIGCONT)
    _, status, ru = os.wait4(v.pid, 0); t_exit = time.monotonic()
    v.returncode = os.waitstatus_to_exitcode(status)
    th.join(5); stop.set()
    if clients:
        got = clients.close()
        assert got >= sse, f"only {got} of {sse} SSE clients got events"
    srv.kill(); srv.wait(); f.close()
    assert v.returncode == 0 and first, (v.returncode, first)
    if rss is not None:
        rss.append(ru.ru_maxrss / 1024)
    return (t_exit - first[0]) * 1000


class SseClients:
    """`n` clients of /events, each read by one selector thread; counts the clients that received an event."""

    def __init__(self, port, n):
        import selectors
        self.sel = selectors.DefaultSelector(); self.socks = []; self.got = set(); self.stop = threading.Event()
        deadline = time.monotonic() + 20
        while True:  # the listener is up once vigil has parsed its flags
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close(); break
            except OSError:
                assert time.monotonic() < deadline, "the listener never came up"
                time.sleep(0.005)
        for i in range(n):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(b"GET /events HTTP/1.1\r\nHost: x\r\n\r\n")
            s.setblocking(False)
            self.sel.register(s, 1, i); self.socks.append(s)
        self.th = threading.Thread(target=self.run); self.th.start()

    def run(self):
        while not self.stop.is_set():
            for key, _ in self.sel.select(0.05):
                try:
                    data = key.fileobj.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    self.sel.unregister(key.fileobj); continue
                if b"data: " in data:
                    self.got.add(key.data)

    def close(self):
        time.sleep(0.05); self.stop.set(); self.th.join(5)
        for s in self.socks:
            s.close()
        return len(self.got)


class SseProcess:
    """The clients in a process of their own (`--sse-clients PORT N`): their reading never takes the GIL from
    the harness's prober and timer. It says `attached` when all are connected; on stdin's end it prints how many
    received an event and exits."""

    def __init__(self, port, n):
        self.p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--sse-clients", str(port), str(n)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.p.stdout.readline()
        assert line.strip() == "attached", line

    def close(self):
        time.sleep(0.05)
        self.p.stdin.close()
        out = self.p.stdout.read(); self.p.wait(10)
        return int(out.strip() or 0)


def sse_clients_main(port, n):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n + 256:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, n + 1024), hard))
    c = SseClients(port, n)
    print("attached", flush=True)
    sys.stdin.read()
    print(c.close(), flush=True)


def attach_sse(port, n):
    return SseProcess(port, n)


def listen_rows(d, runs):
    rows = []
    for name, kw in [("ready lag after first 200, --log, no listener", {}),
                     ("ready lag after first 200, --log --listen (idle)", {"listen": True}),
                     ("ready lag after first 200, --log --listen, 1,000 SSE clients", {"listen": True, "sse": 1000})]:
        lags, rss = [], []
        for _ in range(runs):
            lp = free_port() if kw.get("listen") else None
            lags.append(ready_lag(True, d, listen=lp, sse=kw.get("sse", 0), rss=rss))
        rows.append((name, lags, rss))
    return rows


def crash_time(with_log, d):
    port = free_port(); log = os.path.join(d, f"c{port}.log")
    f = open(log, "ab")
    srv = subprocess.Popen([SERVER, "-m", f"{MODELS}/truncated.gguf", "--host", "127.0.0.1", "--port", str(port)],
                           stdout=f, stderr=f)
    os.kill(srv.pid, signal.SIGSTOP)
    args = [VIGIL, "wait", "-q", "--pid", str(srv.pid), "--url", f"http://127.0.0.1:{port}/health", "--timeout", "30s"]
    if with_log:
        args += ["--log", log]
    v = subprocess.Popen(args, stdout=subprocess.DEVNULL)
    time.sleep(0.3)
    os.kill(srv.pid, signal.SIGCONT)
    srv.wait(); t_dead = time.monotonic()
    v.wait(); t_exit = time.monotonic()
    f.close()
    assert v.returncode == 3, v.returncode
    return (t_exit - t_dead) * 1000


def big_log(path, gb):
    block = []
    for i in range(2000):
        block.append(f"[2025-01-01 00:00:{i % 60:02d} TP{i % 8}] Decode batch. #running-req: 12, #token: 3411, token usage: 0.02, gen throughput (token/s): 812.3\n")
        block.append(f"Capturing batches (bs={i % 160} avail_mem=38.07 GB):  50%|#####     | {i % 52}/52 [00:04<00:04, 10.83it/s]\r")
    block = "".join(block).encode()
    head = b"[2025-01-01 00:00:00 TP0] Load weight begin. avail mem=70.00 GB\n"
    with open(path, "wb") as f:
        f.write(head)
        n = 0
        while n < gb * (1 << 30):
            f.write(block); n += len(block)
        f.write(b"[2025-01-01 00:10:00 TP0] Capture cuda graph end. Time elapsed: 12.1 s\n")
    return os.path.getsize(path)


def diagnose_rss(path):
    t0 = time.monotonic()
    p = subprocess.run([VIGIL, "diagnose", "-q", path], stdout=subprocess.PIPE)
    dt = time.monotonic() - t0
    kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return dt, kb, p.stdout.decode().strip()


def check_time(d, runs=9):
    """`vigil check` on the field case (Kimi-K2-style target, EAGLE-3 draft at 131072)."""
    import json
    cfgs = os.path.join(ROOT, "crates/vigil/tests/configs")
    t = json.load(open(os.path.join(cfgs, "deepseek-v3.json")))
    t.update(max_position_embeddings=262144, num_attention_heads=64, num_key_value_heads=64, vocab_size=163840,
             rope_scaling={"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096})
    dr = json.load(open(os.path.join(cfgs, "kimi-k25-eagle3-draft.json")))
    dr["max_position_embeddings"] = 131072
    for name, c in (("target", t), ("draft", dr)):
        os.makedirs(os.path.join(d, name), exist_ok=True)
        json.dump(c, open(os.path.join(d, name, "config.json"), "w"))
    cmd = [VIGIL, "check", "--json", "--", "python3", "-m", "sglang.launch_server", "--model-path", os.path.join(d, "target"),
           "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", os.path.join(d, "draft"), "--tp", "8",
           "--port", str(free_port())]
    xs = []
    for _ in range(runs):
        t0 = time.monotonic()
        p = subprocess.run(cmd, stdout=subprocess.PIPE)
        xs.append((time.monotonic() - t0) * 1000)
        assert p.returncode == 10, p.returncode
    return xs


def probe_log(d, runs=5):
    path = os.path.join(d, "probe-2g.log")
    tail = b"".join(f"[2025-01-01 00:00:{i % 60:02d} TP{i % 8}] Decode batch. #running-req: 12, #token: 3411, token usage: 0.02, gen throughput (token/s): 812.3\n".encode() for i in range(60000))
    with open(path, "wb") as f:
        f.truncate((2 << 30) - len(tail))
        f.seek(0, 2)
        f.write(tail)
    times, rss = [], []
    try:
        for _ in range(runs):
            t0 = time.monotonic()
            # /usr/bin/time reports the peak of vigil alone: a wait4 on a child forked from this (large) Python
            # process would count the pages the fork shared before exec
            tf = os.path.join(d, "time.txt")
            subprocess.run(["/usr/bin/time", "-f", "%M", "-o", tf, VIGIL, "probe", "--server", "sglang", "--log", path,
                            "--timeout", "10s"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            times.append((time.monotonic() - t0) * 1000)
            rss.append(int(open(tf).read().split()[-1]) / 1024)
    finally:
        os.unlink(path)
    return times, rss


WAIT_RSS = [("vigil wait --no-generate --log L --url U", ["log"]),
            ("  the same, L starting with a launcher's banner (no server kind in its first lines)", ["log", "banner"]),
            ("vigil wait --no-generate --log L --url U --pid P", ["log", "pid"]),
            ("vigil wait --no-generate --url U --pid P", ["pid"])]


def wait_rss(d, flags, runs):
    """Peak RSS in MiB of `vigil wait --no-generate` started with the real llama-server, until its ready verdict."""
    out = []
    for _ in range(runs):
        port = free_port(); log = os.path.join(d, f"w{port}.log")
        f = open(log, "wb")
        if "banner" in flags:  # what an entrypoint script prints first: every profile's rules face these lines
            f.write(b"== node gpu7: starting the inference server ==\n+ ulimit -n 65536\n"); f.flush()
        srv = subprocess.Popen([SERVER, "-m", f"{MODELS}/tiny.gguf", "--host", "127.0.0.1", "--port", str(port), "-c", "256",
                                "-t", "1"], stdout=f, stderr=f)
        args = [VIGIL, "wait", "-q", "--no-generate", "--url", f"http://127.0.0.1:{port}/health", "--timeout", "60s"]
        if "log" in flags:
            args += ["--log", log]
        if "pid" in flags:
            args += ["--pid", str(srv.pid)]
        if "listen" in flags:
            args += ["--listen", str(free_port()), "--metrics-linger", "0s"]
        tf = os.path.join(d, "time.txt")
        p = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", tf] + args, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
        srv.kill(); srv.wait(); f.close()
        assert p.returncode == 0, (args, p.returncode)
        out.append(int(open(tf).read().split()[-1]) / 1024)
    return out


def row(name, xs):
    return f"| {name} | {len(xs)} | {statistics.median(xs):.1f} | {max(xs):.1f} |"


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--sse-clients":
        return sse_clients_main(int(sys.argv[2]), int(sys.argv[3]))
    ap = argparse.ArgumentParser(); ap.add_argument("--runs", type=int, default=20); ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--only", choices=["probe-log", "wait-rss", "listen"])
    ap.add_argument("--vigil", help="the vigil binary to measure (default: target/release/vigil)")
    a = ap.parse_args()
    global VIGIL
    VIGIL = a.vigil or VIGIL
    with tempfile.TemporaryDirectory() as d:
        if a.only == "listen":
            rows = listen_rows(d, a.runs)
            print("| scenario | runs | median ms | max ms |\n|---|---|---|---|")
            for name, lags, _ in rows:
                print(row(name, lags), flush=True)
            print("\n| scenario | runs | median peak RSS MiB | max MiB |\n|---|---|---|---|")
            for name, _, rss in rows:
                print(row(name.replace("ready lag after first 200, ", "vigil wait (with the proof) "), rss), flush=True)
            for name, flags in [("vigil wait --no-generate --log L --url U (as wait-rss)", ["log"]),
                                ("vigil wait --no-generate --log L --url U --listen (idle)", ["log", "listen"])]:
                print(row(name, wait_rss(d, flags, a.runs)), flush=True)
            return
        if a.only == "wait-rss":
            print("| scenario | runs | median peak RSS MiB | max MiB |\n|---|---|---|---|")
            for name, flags in WAIT_RSS:
                print(row(name, wait_rss(d, flags, a.runs)), flush=True)
            return
        print("| scenario | runs | median ms | max ms |\n|---|---|---|---|")
        times, rss = probe_log(d)
        print(row("vigil probe --log on a 2 GiB log (--timeout 10s)", times), flush=True)
        print(row("  peak RSS of it, MiB (bound 32)", rss), flush=True)
        if a.only:
            return
        for name, fn, wl in [("ready lag after first 200, with --log", ready_lag, True),
                             ("ready lag after first 200, --url only", ready_lag, False),
                             ("crash verdict after exit, with --log", crash_time, True),
                             ("crash verdict after exit, --pid/--url only", crash_time, False)]:
            print(row(name, [fn(wl, d) for _ in range(a.runs)]), flush=True)
        print(row("vigil check, field case (error found)", check_time(d)), flush=True)
        path = os.path.join(d, "big.log")
        size = big_log(path, a.gb)
        dt, kb, out = diagnose_rss(path)
        print(f"\ndiagnose on a {size / (1 << 30):.2f} GiB log: {dt:.1f} s wall, {size / (1 << 20) / dt:.0f} MiB/s, peak RSS {kb / 1024:.1f} MiB")
        print(f"verdict: {out}")


if __name__ == "__main__":
    sys.exit(main())
