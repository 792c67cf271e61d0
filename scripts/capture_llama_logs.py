#!/usr/bin/env python3
"""Captures whole logs of the real llama-server (the build the tests use) in the situations users meet, for the
project corpus (issue #12: "whole logs captured from the real llama-server runs of the tests").

Each scenario starts llama-server on the tiny random-weight models of scripts/make_models.py, drives it (health,
requests, a signal) and keeps its whole output, byte for byte. Labels live in corpus/llama-cpp/*.log headers,
written from the scenario and the text, not from vigil.

Usage: scripts/capture_llama_logs.py --server PATH --models DIR --out DIR [--only NAME,...]
"""
import argparse, json, os, signal, socket, subprocess, tempfile, time, urllib.request


def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p


def get(port, path, body=None, timeout=10):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode() if body else None,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except Exception:
        return None, b""


def wait_health(port, proc, deadline=60):
    t0 = time.time()
    while time.time() - t0 < deadline:
        if proc.poll() is not None:
            return False
        st, _ = get(port, "/health", timeout=2)
        if st == 200:
            return True
        time.sleep(0.05)
    return False


def run(server, args, port, drive, log_path, deadline=60):
    with open(log_path, "wb") as log:
        host = [] if "--host" in args else ["--host", "127.0.0.1"]
        p = subprocess.Popen([server] + args + ["--port", str(port), "-t", "1"] + host,
                             stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            drive(p, port)
            p.wait(timeout=deadline)
        except subprocess.TimeoutExpired:
            pass
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def ready_then(sig, requests):
    def drive(p, port):
        if not wait_health(port, p):
            return
        for path, body in requests:
            get(port, path, body, timeout=30)
        p.send_signal(sig)
    return drive


def wait_exit(p, port):
    p.wait(timeout=30)


def after(secs):
    def drive(p, port):
        # the situation is a server that never gets further: its log as it stands after `secs`
        try:
            p.wait(timeout=secs)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
    return drive


COMPLETION = ("/completion", {"prompt": "Hello", "n_predict": 4})
CHAT = ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})


def scenarios(m, tmp):
    fifo = os.path.join(tmp, "model-on-slow-storage.gguf")
    if not os.path.exists(fifo):
        os.mkfifo(fifo)
    return {
        "ready-two-slots-chat-sigterm": (["-m", f"{m}/tiny.gguf", "-np", "2", "-c", "512"],
                                         ready_then(signal.SIGTERM, [COMPLETION, CHAT, CHAT])),
        "spec-draft-ready-sigint": (["-m", f"{m}/tiny.gguf", "-md", f"{m}/tiny-draft.gguf", "-c", "512"],
                                    ready_then(signal.SIGINT, [COMPLETION, COMPLETION])),
        "spec-random-draft-rejected-sigint": (["-m", f"{m}/tiny.gguf", "-md", f"{m}/random-draft.gguf", "-c", "512"],
                                              ready_then(signal.SIGINT, [COMPLETION])),
        "spec-draft-other-vocab-request-sigint": (["-m", f"{m}/tiny.gguf", "-md", f"{m}/gpt2-draft.gguf", "-c", "512"],
                                                  ready_then(signal.SIGINT, [COMPLETION])),
        "truncated-model": (["-m", f"{m}/truncated.gguf"], wait_exit),
        "not-a-gguf": (["-m", f"{m}/notgguf.gguf"], wait_exit),
        "model-is-a-directory": (["-m", m], wait_exit),
        "unknown-flag": (["-m", f"{m}/tiny.gguf", "--no-such-flag"], wait_exit),
        "bad-ctx-size-value": (["-m", f"{m}/tiny.gguf", "--ctx-size", "lots"], wait_exit),
        "model-on-fifo-stuck-loading": (["-m", fifo], after(4)),
        "embedding-ready-sigterm": (["-m", f"{m}/tiny.gguf", "--embedding", "-c", "512"],
                                    ready_then(signal.SIGTERM, [("/embedding", {"content": "hello"})])),
        "metrics-ready-sigint": (["-m", f"{m}/tiny.gguf", "--metrics", "-c", "512"],
                                 ready_then(signal.SIGINT, [COMPLETION, ("/metrics", None)])),
        "lora-missing": (["-m", f"{m}/tiny.gguf", "--lora", os.path.join(tmp, "no-such-adapter.gguf")], wait_exit),
        "mmproj-missing": (["-m", f"{m}/tiny.gguf", "--mmproj", os.path.join(tmp, "no-such-mmproj.gguf")], wait_exit),
        "bad-host-address": (["-m", f"{m}/tiny.gguf", "-c", "512", "--host", "256.1.1.1"], wait_exit),
        "port-in-use": (["-m", f"{m}/tiny.gguf", "-c", "512"], wait_exit, squat),
        "ctx-size-above-training-ready-sigterm": (["-m", f"{m}/tiny.gguf", "-c", "100000"],
                                                  ready_then(signal.SIGTERM, [COMPLETION])),
        "api-key-unauthorized-request-sigint": (["-m", f"{m}/tiny.gguf", "-c", "512", "--api-key-file",
                                                 api_key_file(tmp)],
                                                ready_then(signal.SIGINT, [COMPLETION])),
        "unknown-chat-template-name-ready": (["-m", f"{m}/tiny.gguf", "--chat-template", "no-such-template"], after(3)),
        "chat-template-file-missing": (["-m", f"{m}/tiny.gguf", "--chat-template-file",
                                        os.path.join(tmp, "no-such-template.jinja")], wait_exit),
        "gpu-layers-on-cpu-build-ready-sigterm": (["-m", f"{m}/tiny.gguf", "-c", "512", "-ngl", "99"],
                                                  ready_then(signal.SIGTERM, [CHAT])),
        "bad-cache-type": (["-m", f"{m}/tiny.gguf", "--cache-type-k", "q9_9"], wait_exit),
        "bad-rope-scaling": (["-m", f"{m}/tiny.gguf", "--rope-scaling", "sideways"], wait_exit),
        "killed-while-serving": (["-m", f"{m}/tiny.gguf", "-c", "512"], ready_then(signal.SIGKILL, [CHAT, COMPLETION])),
    }


def squat(port):
    # another program holds the port (a listening socket), as a leftover server would
    s = socket.socket()
    s.bind(("127.0.0.1", port))
    s.listen()
    return s


def api_key_file(tmp):
    # a key file, so that no key is on the command line; the request is sent without it
    p = os.path.join(tmp, "api-keys.txt")
    with open(p, "w") as f:
        f.write("not-a-real-key-for-the-test\n")
    return p


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--models", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="vigil-capture-")
    only = set(filter(None, a.only.split(",")))
    # a scenario is (arguments, how to drive the server[, what to set up on its port first])
    for name, (args, drive, *setup) in scenarios(a.models, tmp).items():
        if only and name not in only:
            continue
        port = free_port()
        held = [f(port) for f in setup]
        run(a.server, args, port, drive, os.path.join(a.out, name + ".log"))
        for h in held:
            h.close()
        print(name)


if __name__ == "__main__":
    main()
