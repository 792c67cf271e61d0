#!/usr/bin/env bash
# vigil's main job for real: start a real llama-server (tiny random-weight model) and watch it come
# up with `vigil wait`; then watch one that dies on a truncated model and read vigil's verdict.
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/setup.sh | sed 's/^/export /')"
cargo build --release -q
V=target/release/vigil
D=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$D"' EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')

echo "### 1. a healthy server: vigil follows its log and probes /health lazily"
"$VIGIL_LLAMA_SERVER" -m "$VIGIL_MODELS/tiny.gguf" --host 127.0.0.1 --port "$port" -c 256 >>"$D/ok.log" 2>&1 &
$V wait --log "$D/ok.log" --pid $! --url "http://127.0.0.1:$port/health" --timeout 60s || true
curl -s "http://127.0.0.1:$port/completion" -d '{"prompt":"hi","n_predict":4}' | head -c 120; echo
kill %1

echo; echo "### 2. a server dying on a truncated model: verdict, cause, root-cause lines, hint"
"$VIGIL_LLAMA_SERVER" -m "$VIGIL_MODELS/truncated.gguf" --host 127.0.0.1 --port "$port" >>"$D/bad.log" 2>&1 &
$V wait --log "$D/bad.log" --pid $! --url "http://127.0.0.1:$port/health" --timeout 60s || echo "(exit code $?)"

echo; echo "### 3. offline post-mortem of the same log"
$V diagnose "$D/bad.log" || echo "(exit code $?)"
