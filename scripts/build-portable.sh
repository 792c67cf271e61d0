#!/usr/bin/env bash
# Release build of vigil that runs on glibc 2.28 and newer (RHEL 8, Ubuntu 18.10+, Debian 10+), for
# copying to GPU nodes. A plain build on Debian 12 links against glibc 2.34 symbols; cargo-zigbuild
# links against glibc 2.28 stubs with zig's linker. Both come from PyPI (ziglang, cargo-zigbuild) into
# a venv cached under ~/.cache/vigil/ keyed by their versions. Prints the binary's path.
set -euo pipefail
ZIG_VERSION=0.17.0
ZIGBUILD_VERSION=0.24.0
GLIBC=2.28
CACHE=${VIGIL_CACHE:-$HOME/.cache/vigil}
VENV=$CACHE/venv-zig-$ZIG_VERSION-zb$ZIGBUILD_VERSION
cd "$(dirname "$0")/.."
if [ ! -f "$VENV/.done" ]; then
  echo "build-portable: installing ziglang $ZIG_VERSION and cargo-zigbuild $ZIGBUILD_VERSION into $VENV" >&2
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "ziglang==$ZIG_VERSION" "cargo-zigbuild==$ZIGBUILD_VERSION"
  touch "$VENV/.done"
fi
# cargo-zigbuild finds zig as `python3 -m ziglang` from the venv
PATH="$VENV/bin:$PATH" cargo zigbuild --release --locked --target "x86_64-unknown-linux-gnu.$GLIBC" -p vigil >&2
echo "$PWD/target/x86_64-unknown-linux-gnu/release/vigil"
