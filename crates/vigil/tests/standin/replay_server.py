#!/usr/bin/env python3
"""A stand-in that replays what an inference server answered, for the speculation proof: no GPU is needed to
see vigil read vLLM's metrics page or SGLang's meta_info. Used by crates/vigil/tests/proof.rs with the cases
(and files) of crates/vigil-core/tests/proof/cases.toml.

GET /health              200
GET /v1/models           one model, `m`
POST (any path)          --answer's file
GET /metrics             --metrics-before until a POST has been answered, then --metrics-after
GET /server_info         --server-info (also /get_server_info)
A file not given answers 404. Everything after `--` is the replayed server's command line: vigil reads it
from /proc/PID/cmdline to learn whether speculation was asked for.
"""
import argparse
import http.server
import sys

own = sys.argv[1 : sys.argv.index("--")] if "--" in sys.argv else sys.argv[1:]
ap = argparse.ArgumentParser()
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--answer", required=True)
ap.add_argument("--metrics-before")
ap.add_argument("--metrics-after")
ap.add_argument("--server-info")
a = ap.parse_args(own)


def body(path):
    if path is None:
        return None
    with open(path, "rb") as f:
        return f.read()


posted = False


class H(http.server.BaseHTTPRequestHandler):
    def send(self, code, data, ctype="application/json"):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def reply(self, data, ctype="application/json"):
        if data is None:
            self.send(404, b'{"detail":"Not Found"}')
        else:
            self.send(200, data, ctype)

    def do_GET(self):
        p = self.path.split("?")[0]
        if p == "/health":
            self.reply(b"")
        elif p == "/v1/models":
            self.reply(b'{"object":"list","data":[{"id":"m","object":"model"}]}')
        elif p == "/metrics":
            page = body(a.metrics_after if posted else a.metrics_before)
            self.reply(page, "text/plain; version=0.0.4; charset=utf-8")
        elif p in ("/server_info", "/get_server_info"):
            self.reply(body(a.server_info))
        else:
            self.reply(None)

    def do_POST(self):
        global posted
        n = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(n)
        self.reply(body(a.answer))
        posted = True

    def log_message(self, *args):
        pass


http.server.ThreadingHTTPServer(("127.0.0.1", a.port), H).serve_forever()
