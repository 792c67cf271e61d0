#!/usr/bin/env bash
# vigil's main job for real: launch a real llama-server (tiny random-weight model) under `vigil up`,
# watch it come up, look at it with status/logs, stop it with proof; then one that dies on a truncated model.
set -euo pipefail
cd "$(dirname "$0")/.."
# setup.sh prints only KEY=VALUE lines on stdout (everything else goes to stderr); a failure stops here.
setup_env=$(scripts/setup.sh)
while IFS='=' read -r k v; do
  [[ $k =~ ^[A-Z_][A-Z0-9_]*$ ]] || { echo "scripts/setup.sh printed a line that is not KEY=VALUE: $k=$v" >&2; exit 1; }
  export "$k=$v"
done <<<"$setup_env"
cargo build --release -q
V=$PWD/target/release/vigil
export VIGIL_STATE_DIR=$(mktemp -d)
trap '$V down --all >/dev/null 2>&1 || true; rm -rf "$VIGIL_STATE_DIR"' EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')

echo "### 1. vigil up: a keeper owns the server; vigil follows its phases and proves readiness"
$V up --name demo --detach -- "$VIGIL_LLAMA_SERVER" -m "$VIGIL_MODELS/tiny.gguf" --host 127.0.0.1 --port "$port" -c 256
echo; $V status
echo; curl -s "http://127.0.0.1:$port/completion" -d '{"prompt":"hi","n_predict":4}' | head -c 100; echo
echo; $V logs demo -n 3
echo; $V down demo

echo; echo "### 2. a truncated model: vigil check refuses it before any launch"
$V check -- "$VIGIL_LLAMA_SERVER" -m "$VIGIL_MODELS/truncated.gguf" --port "$port" || echo "(exit code $?)"

echo; echo "### 3. launched anyway (--no-check): the crash verdict, cause, root-cause lines, hint"
$V up --name broken --no-check -- "$VIGIL_LLAMA_SERVER" -m "$VIGIL_MODELS/truncated.gguf" --host 127.0.0.1 --port "$port" || echo "(exit code $?)"

echo; echo "### 4. offline post-mortem of its log"
$V diagnose "$VIGIL_STATE_DIR/runs/broken/server.log" || echo "(exit code $?)"
