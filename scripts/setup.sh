#!/usr/bin/env bash
# Builds (once) the real test server: llama.cpp's llama-server from the llama-cpp-python sdist on PyPI,
# plus tiny random-weight GGUF models. Everything is cached under ~/.cache/vigil/, keyed by version,
# so a second run does nothing.
#
# stdout carries only KEY=VALUE lines (VIGIL_LLAMA_SERVER, VIGIL_MODELS), which the callers turn into
# `export` lines; everything else goes to stderr. The whole script runs with stdout pointed at stderr
# (fd 3 keeps the real stdout for the final lines), so no step can break that rule by printing.
set -euo pipefail
exec 3>&1 1>&2
LLAMA_CPP_PY_VERSION=0.3.36
GGUF_VERSION=0.19.0
MODELS_VERSION=v3
CACHE=${VIGIL_CACHE:-$HOME/.cache/vigil}
HERE=$(cd "$(dirname "$0")" && pwd)
VENV=$CACHE/venv-py311-gguf$GGUF_VERSION
# "-rpc": built with ggml's RPC backend (GGML_RPC=ON), so llama-server takes --rpc and ggml-rpc-server is there
# too: llama.cpp's own multi-node (issue #32); a new key, so an older cache without it is not taken for this one
BUILD=$CACHE/llama-server-$LLAMA_CPP_PY_VERSION-rpc
MODELS=$CACHE/models-$MODELS_VERSION
mkdir -p "$CACHE"
log() { echo "setup: $*" >&2; }

if [ ! -x "$VENV/bin/python" ] || [ ! -f "$VENV/.done" ]; then
  log "creating python venv $VENV"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check cmake ninja scikit-build-core "gguf==$GGUF_VERSION" numpy
  touch "$VENV/.done"
fi

if [ ! -x "$BUILD/bin/llama-server" ] || [ ! -x "$BUILD/bin/ggml-rpc-server" ]; then
  log "building llama-server from llama-cpp-python $LLAMA_CPP_PY_VERSION sdist (several minutes, once)"
  SRC=$CACHE/src
  mkdir -p "$SRC"
  if [ ! -f "$SRC/llama_cpp_python-$LLAMA_CPP_PY_VERSION.tar.gz" ]; then
    # --no-build-isolation with cmake/scikit-build-core already in the venv: metadata only, no cmake rebuild.
    "$VENV/bin/pip" download -q --disable-pip-version-check --no-deps --no-build-isolation \
      --no-binary llama-cpp-python "llama-cpp-python==$LLAMA_CPP_PY_VERSION" -d "$SRC"
  fi
  rm -rf "$SRC/llama_cpp_python-$LLAMA_CPP_PY_VERSION"
  tar -xzf "$SRC/llama_cpp_python-$LLAMA_CPP_PY_VERSION.tar.gz" -C "$SRC"
  LL=$SRC/llama_cpp_python-$LLAMA_CPP_PY_VERSION/vendor/llama.cpp
  rm -rf "$BUILD.tmp"
  "$VENV/bin/cmake" -S "$LL" -B "$BUILD.tmp/build" -G Ninja -DCMAKE_MAKE_PROGRAM="$VENV/bin/ninja" \
    -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DGGML_RPC=ON -DBUILD_SHARED_LIBS=OFF >"$CACHE/llama-build.log" 2>&1 \
    || { tail -30 "$CACHE/llama-build.log" >&2; exit 1; }
  log "compiling (about 11 minutes on 2 cores; progress every 30 s; full log: $CACHE/llama-build.log)"
  # ninja prints [k/n] per compiled file: report the last one as a percentage while the build runs.
  "$VENV/bin/cmake" --build "$BUILD.tmp/build" --target llama-server ggml-rpc-server -j "$(nproc)" >>"$CACHE/llama-build.log" 2>&1 &
  build_pid=$!
  start=$SECONDS
  while kill -0 "$build_pid" 2>/dev/null; do
    for _ in $(seq 30); do kill -0 "$build_pid" 2>/dev/null || break; sleep 1; done
    kill -0 "$build_pid" 2>/dev/null || break
    step=$(grep -oE '^\[[0-9]+/[0-9]+\]' "$CACHE/llama-build.log" | tail -1 | tr -d '[]' || true)
    if [ -n "$step" ]; then
      log "llama-server build: $((100 * ${step%/*} / ${step#*/}))% (${step} files, $((SECONDS - start)) s)"
    fi
  done
  wait "$build_pid" || { tail -30 "$CACHE/llama-build.log"; exit 1; }
  mkdir -p "$BUILD.tmp/bin"
  cp "$BUILD.tmp/build/bin/llama-server" "$BUILD.tmp/build/bin/ggml-rpc-server" "$BUILD.tmp/bin/"
  cp "$LL/models/ggml-vocab-llama-spm.gguf" "$LL/models/ggml-vocab-gpt-2.gguf" "$BUILD.tmp/" 2>/dev/null || true
  rm -rf "$BUILD.tmp/build" "$BUILD"
  mv "$BUILD.tmp" "$BUILD"
  rm -rf "$SRC/llama_cpp_python-$LLAMA_CPP_PY_VERSION"
fi

if [ ! -f "$MODELS/.done" ]; then
  log "writing tiny GGUF models to $MODELS"
  rm -rf "$MODELS"; mkdir -p "$MODELS"
  "$VENV/bin/python" "$HERE/make_models.py" --vocab "$BUILD/ggml-vocab-llama-spm.gguf" \
    --gpt2-vocab "$BUILD/ggml-vocab-gpt-2.gguf" --out "$MODELS"
  touch "$MODELS/.done"
fi

echo "VIGIL_LLAMA_SERVER=$BUILD/bin/llama-server" >&3
echo "VIGIL_MODELS=$MODELS" >&3
echo "VIGIL_LLAMA_RPC_SERVER=$BUILD/bin/ggml-rpc-server" >&3
