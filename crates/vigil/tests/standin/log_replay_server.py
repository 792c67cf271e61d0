"""A scripted stand-in for a behaviour no server that runs here shows: a real server's captured log played back.

usage: log_replay_server.py --port P --log CAPTURED.log --until TEXT --trigger FILE [--exit N]

Prints the captured log's body (after its '# ---' header) up to and including the first line containing TEXT,
answers /health, /v1/models and /v1/completions like an OpenAI server, and once FILE exists prints the rest of
the log and exits with status N (default 0). With the captured vLLM 0.26.0 engine death
(corpus/captured/vllm-0.26.0-e.log) that is the real server's own end: EngineDeadError, then exit 0.
"""
import argparse, http.server, json, os, sys, threading, time

ap = argparse.ArgumentParser()
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--log", required=True)
ap.add_argument("--until", required=True)
ap.add_argument("--trigger", required=True)
ap.add_argument("--exit", type=int, default=0)
a = ap.parse_args()

text = open(a.log, encoding="utf-8", errors="replace").read()
body = text.split("\n# ---\n", 1)[1].splitlines(keepends=True)
cut = next(i for i, l in enumerate(body) if a.until in l) + 1


class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def answer(self, obj):
        b = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)

    def do_GET(self):
        if self.path.startswith("/v1/models"):
            self.answer({"object": "list", "data": [{"id": "m", "object": "model"}]})
        else:
            self.answer({})

    def do_POST(self):
        n = int(self.headers.get("content-length") or 0)
        self.rfile.read(n)
        self.answer({"choices": [{"index": 0, "text": " stand-in"}], "usage": {"completion_tokens": 2}})


srv = http.server.ThreadingHTTPServer(("127.0.0.1", a.port), H)
threading.Thread(target=srv.serve_forever, daemon=True).start()
for line in body[:cut]:
    sys.stdout.write(line)
sys.stdout.flush()
deadline = time.time() + 120
while not os.path.exists(a.trigger) and time.time() < deadline:
    time.sleep(0.05)
for line in body[cut:]:
    sys.stdout.write(line)
sys.stdout.flush()
srv.shutdown()
sys.exit(a.exit)
