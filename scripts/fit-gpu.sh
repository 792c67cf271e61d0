#!/usr/bin/env bash
# The H200 run of the real llama-server for the fit scoring (docs/fit.md): builds llama-server with CUDA
# (sm_90) from the llama.cpp tree of the llama-cpp-python sdist that scripts/setup.sh uses, writes
# constant-weight GGUF models of real shapes (scripts/fit_models.py), starts llama-server on each
# launch below until it listens, and keeps the lines that print the real memory numbers.
# Usage on the GPU machine: scripts/fit-gpu.sh LLAMA_CPP_TARBALL TINY_GGUF OUTDIR
set -u
TAR=$1; TINY=$2; OUT=$3
W=$(mktemp -d)
mkdir -p "$OUT"
LOG=$OUT/llama-h200.log
tar -xzf "$TAR" -C "$W"
LL=$W/llama.cpp
t0=$SECONDS
cmake -S "$LL" -B "$W/b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DGGML_CUDA_FA=OFF -DGGML_CUDA_NCCL=OFF -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DBUILD_SHARED_LIBS=OFF \
  > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
cmake --build "$W/b" --target llama-server -j "$(nproc)" >> "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "build: $((SECONDS - t0)) s"
S=$W/b/bin/llama-server
PYTHONPATH=$LL/gguf-py python3 "$(dirname "$0")/fit_models.py" "$LL/models/ggml-vocab-llama-spm.gguf" "$W/m" || exit 1
cp "$TINY" "$W/m/tiny.gguf"
ls -l "$W/m"
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; } > "$LOG"
port=18100
run() {
  local name=$1; shift
  port=$((port + 1))
  echo "### $name: llama-server $* --port $port" >> "$LOG"
  "$S" "$@" -v --port "$port" > "$W/$name.log" 2>&1 &
  local pid=$!
  for _ in $(seq 240); do
    grep -q "listening on\|server is listening" "$W/$name.log" && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.5
  done
  grep -E " I .*(buffer size|n_ctx|llama_kv_cache: size|offloaded|n_seq_max|print_info: (n_layer|n_head|n_embd|file size|model params)|fit)" "$W/$name.log" >> "$LOG"
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader >> "$LOG"
  kill $pid 2>/dev/null; wait $pid 2>/dev/null
  grep -v " D " "$W/$name.log" | head -c 4000000 > "$OUT/$name.log"
}
run l8b-ngl99-c8192 -m "$W/m/l8b-f16.gguf" -ngl 99 -c 8192
run l8b-ngl99-c65536-ctkq8 -m "$W/m/l8b-f16.gguf" -ngl 99 -c 65536 -ctk q8_0
run l8b-ngl10-c16384 -m "$W/m/l8b-f16.gguf" -ngl 10 -c 16384
run q15b-default-np4 -m "$W/m/q15b-f16.gguf" -ngl 99 -np 4
run tiny-ngl99-c512 -m "$W/m/tiny.gguf" -ngl 99 -c 512
echo "total: $((SECONDS - t0)) s"
cat "$LOG"
