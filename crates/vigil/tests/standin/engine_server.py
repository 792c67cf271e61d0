#!/usr/bin/env python3
"""A stand-in for a multi-process inference server (the shape of SGLang and vLLM): an HTTP parent that
answers /health and an engine child named by its process title. It exists because no real server loses
its engine, or hangs in a known Python function, on demand. Used by crates/vigil/tests/evidence.rs.

--dir D      writes D/engine.pid (the engine child's pid) and D/helper.done (a short-lived helper
             child ran and exited)
--ready      /health answers 200 at once (else 503 "loading" until --ready-after seconds pass)
Both processes then wait forever in a named function: `wedged_in_dist_init` in the engine,
`waiting_for_engine` in the parent's main thread (the evidence test looks for them).
"""
import argparse
import http.server
import os
import subprocess
import sys
import threading
import time

ap = argparse.ArgumentParser()
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--dir", required=True)
ap.add_argument("--ready", action="store_true")
a = ap.parse_args()

ENGINE = """
import sys, time
def wedged_in_dist_init():
    while True:
        time.sleep(0.2)
print("engine: init_process_group", flush=True)
wedged_in_dist_init()
"""

# argv[0] is the process title, as setproctitle leaves it in /proc/PID/cmdline
engine = subprocess.Popen(["standin::engine", "-c", ENGINE], executable=sys.executable)
with open(os.path.join(a.dir, "engine.pid.tmp"), "w") as f:
    f.write(str(engine.pid))
os.rename(os.path.join(a.dir, "engine.pid.tmp"), os.path.join(a.dir, "engine.pid"))


def helper():
    # a tokenizer-pool-like helper: no title, no GPU memory, lives 2.5 s and exits
    h = subprocess.Popen(["standin-tokenizer-pool", "-c", "import time; time.sleep(2.5)"], executable=sys.executable)
    h.wait()
    open(os.path.join(a.dir, "helper.done"), "w").close()


threading.Thread(target=helper, daemon=True).start()


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ok = a.ready
        body = b'{"status":"ok"}' if ok else b'{"error":"loading"}'
        self.send_response(200 if ok else 503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


srv = http.server.ThreadingHTTPServer(("127.0.0.1", a.port), Health)
threading.Thread(target=srv.serve_forever, daemon=True).start()
print("standin: listening", flush=True)


def waiting_for_engine():
    while True:
        time.sleep(0.2)


waiting_for_engine()
