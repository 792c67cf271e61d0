#!/usr/bin/env bash
# The test command (README and .ci/run call this): builds the real test server if needed (cached),
# checks formatting and lints, runs every test, then runs the end-to-end tests again as an
# unprivileged user (users are not root). Prints how many end-to-end tests ran.
set -euo pipefail
cd "$(dirname "$0")/.."
# setup.sh prints only KEY=VALUE lines on stdout (everything else goes to stderr); a failure stops here.
setup_env=$(scripts/setup.sh)
while IFS='=' read -r k v; do
  [[ $k =~ ^[A-Z_][A-Z0-9_]*$ ]] || { echo "scripts/setup.sh printed a line that is not KEY=VALUE: $k=$v" >&2; exit 1; }
  export "$k=$v"
done <<<"$setup_env"
echo "== llama-server: $VIGIL_LLAMA_SERVER"

# The SSH tests start Debian's real sshd on loopback ports; the portable-build test reads objdump -T;
# the TLS tests put Debian's stunnel in front of llama-server, with certificates made by openssl; the
# Prometheus tests run Debian's prometheus and promtool; the systemd unit test runs systemd-analyze verify;
# the timeline test renders its SVG with resvg, whose text needs a system font (DejaVu); the live page's tests
# (tests/page.rs) drive Debian's chromium headless through the DevTools protocol.
need=()
[ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need+=(fonts-dejavu-core)
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v ssh >/dev/null 2>&1 || need+=(openssh-client)
command -v objdump >/dev/null 2>&1 || need+=(binutils)
[ -x /usr/bin/stunnel4 ] || need+=(stunnel4)
[ -x /usr/bin/openssl ] || need+=(openssl)
[ -x /usr/bin/prometheus ] && [ -x /usr/bin/promtool ] || need+=(prometheus)
[ -x /usr/bin/systemd-analyze ] || need+=(systemd)
[ -x /usr/bin/chromium ] || need+=(chromium)
# Evidence at a stall (issue #17): native stacks with eu-stack from Debian's elfutils.
[ -x /usr/bin/eu-stack ] || need+=(elfutils)
command -v python3 >/dev/null 2>&1 && python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
# vigil inside Slurm jobs (issue #27): Debian's real Slurm (slurmctld, slurmd, the clients) and munge.
[ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] && [ -x /usr/bin/sbatch ] || need+=(slurm-wlm)
[ -x /usr/sbin/munged ] || need+=(munge)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "== apt-get install ${need[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >/dev/null \
      || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >/dev/null; }
  else
    echo "missing: ${need[*]} (install them, e.g. sudo apt-get install ${need[*]})"; exit 1
  fi
fi

# A real Slurm on loopback for the Slurm tests: munged, slurmctld and two slurmd (n1, n2), started once
# (idempotent), checked idle with a deadline; SLURM_CONF points every client (and the jobs) at it.
if [ "$(id -u)" = 0 ]; then
  echo "== Slurm on loopback (scripts/slurm-setup.sh)"
  # through a file, not a pipe, and bounded: a daemon that kept the script's stdout would hold a pipe open
  slurm_out=$(mktemp)
  timeout 300 scripts/slurm-setup.sh > "$slurm_out" || { echo "scripts/slurm-setup.sh failed"; rm -f "$slurm_out"; exit 1; }
  SLURM_CONF=$(sed -n 's/^SLURM_CONF=//p' "$slurm_out")
  rm -f "$slurm_out"
  export SLURM_CONF
elif [ -z "${SLURM_CONF:-}" ]; then
  export SLURM_CONF=/var/tmp/vigil-slurm/slurm.conf
fi

# The release binary for GPU nodes: glibc >= 2.28 (cargo-zigbuild; cached toolchain).
echo "== portable release build (glibc 2.28)"
VIGIL_PORTABLE_BIN=$(scripts/build-portable.sh)
export VIGIL_PORTABLE_BIN

# A PyPI tool in a venv cached under $VIGIL_CACHE, keyed by its version: pip_venv DIR SPEC
pip_venv() {
  if [ ! -f "$1/.done" ]; then
    echo "== $2 into $1"
    rm -rf "$1"
    python3 -m venv "$1"
    "$1/bin/pip" install -q --disable-pip-version-check "$2" >&2
    touch "$1/.done"
  fi
}
# The Kubernetes manifest in docs/kubernetes.md against the API schema, strictly (unknown fields are errors).
KV_VERSION=1.31.0
KV_VENV=${VIGIL_CACHE:-$HOME/.cache/vigil}/venv-kubernetes-validate-$KV_VERSION
pip_venv "$KV_VENV" "kubernetes-validate==$KV_VERSION"
# py-spy for the evidence tests' Python stacks.
PY_SPY_VERSION=0.4.3
PY_SPY_VENV=${VIGIL_CACHE:-$HOME/.cache/vigil}/venv-py-spy-$PY_SPY_VERSION
pip_venv "$PY_SPY_VENV" "py-spy==$PY_SPY_VERSION"
export VIGIL_PY_SPY=$PY_SPY_VENV/bin/py-spy

echo "== kubernetes-validate --strict on the manifest of docs/kubernetes.md"
scripts/k8s-manifest.sh "$KV_VENV/bin/kubernetes-validate"
# The SkyPilot and dstack examples of docs/serving-platforms.md, by the platforms' own parsers.
SKY_VERSION=0.14.1
SKY_VENV=${VIGIL_CACHE:-$HOME/.cache/vigil}/venv-skypilot-$SKY_VERSION
pip_venv "$SKY_VENV" "skypilot==$SKY_VERSION"
DSTACK_VERSION=0.22.5
DSTACK_VENV=${VIGIL_CACHE:-$HOME/.cache/vigil}/venv-dstack-$DSTACK_VERSION
pip_venv "$DSTACK_VENV" "dstack==$DSTACK_VERSION"
echo "== SkyPilot and dstack examples of docs/serving-platforms.md"
scripts/platform-examples.sh "$SKY_VENV/bin/python" "$DSTACK_VENV/bin/python"

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --all-targets -- -D warnings

LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
echo "== tests"
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast 2>&1 | tee "$LOG"
  e2e=$(grep -cE '^\s+PASS .* e2e_' "$LOG" || true)
else
  cargo test --workspace --no-fail-fast 2>&1 | tee "$LOG"
  e2e=$(grep -cE '^test e2e_.* ok$' "$LOG" || true)
fi
echo "== end-to-end tests run against the real llama-server (as $(id -un)): $e2e"
echo "== corpus guard: no project corpus log cites a held-out source"
GUARD=${VIGIL_CORPUS:-../shared/corpus}/guard.py
if [ -f "$GUARD" ]; then
  python3 "$GUARD" corpus
elif [ "${CI:-}" = true ]; then
  echo "corpus guard $GUARD not found (check out shared/ beside the repo)"; exit 1
else
  echo "SKIP: $GUARD not found"
fi
echo "== corpus score table"
cargo test -q -p vigil-core --test corpus corpus_matches -- --nocapture 2>&1 | grep -vE '^(running|test result|$)' | grep -v ' ok$'

# Again as an unprivileged user: processes, ports and files must work without root.
if [ "$(id -u)" = 0 ]; then
  U=vigil-ci
  id "$U" >/dev/null 2>&1 || useradd --system --create-home --home-dir /var/lib/$U --shell /bin/sh "$U"
  W=$(mktemp -d /tmp/vigil-unpriv.XXXXXX)
  BINS=$(cargo test -p vigil --test e2e --test supervise --test proof --test hostile --test remote --test tls --test evidence --test history --test slurm --test runs --test deadlines --test launcher --test repair --test listen --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import sys,json
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m["target"]["name"] in ("e2e","supervise","proof","hostile","remote","tls","evidence","history","slurm","runs","deadlines","launcher","repair","listen") and m.get("executable"): print(m["target"]["name"], m["executable"])')
  mkdir -p "$W/models" "$W/home"
  cp target/debug/vigil "$W/vigil"; cp "$VIGIL_LLAMA_SERVER" "$W/llama-server"
  # the launcher tests' worker rank: found beside llama-server (tests/common.rs Env::rpc_server)
  cp "$VIGIL_LLAMA_RPC_SERVER" "$W/ggml-rpc-server"
  cp "$VIGIL_MODELS"/*.gguf "$W/models/"
  cp "$VIGIL_PY_SPY" "$W/py-spy"
  echo "$BINS" | while read -r t exe; do cp "$exe" "$W/$t"; done
  chmod -R a+rX "$W"; chown -R "$U" "$W"
  n=0
  for t in e2e supervise proof hostile remote tls evidence history slurm runs deadlines launcher repair listen; do
    echo "== end-to-end tests ($t) as unprivileged user $U"
    runuser -u "$U" -- env -i PATH=/usr/bin:/bin HOME="/var/lib/$U" CI="${CI:-}" TMPDIR="$W" \
      VIGIL_BIN="$W/vigil" VIGIL_LLAMA_SERVER="$W/llama-server" VIGIL_MODELS="$W/models" VIGIL_PY_SPY="$W/py-spy" SLURM_CONF="${SLURM_CONF:-}" \
      "$W/$t" --test-threads 2 2>&1 | tee "$LOG"
    grep -qE '^test result: ok\.' "$LOG" || { echo "unprivileged end-to-end tests ($t) failed"; exit 1; }
    n=$((n + $(grep -cE '^test e2e_.* ok$' "$LOG" || true)))
  done
  rm -rf "$W"
  echo "== end-to-end tests run as unprivileged user $U: $n"
fi
echo "== all tests passed"
