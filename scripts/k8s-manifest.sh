#!/usr/bin/env bash
# Validates every ```yaml block of docs/kubernetes.md with kubernetes-validate --strict (path given as $1).
# Prints the validator's verdict per block; exits non-zero on any error or unknown field.
set -euo pipefail
cd "$(dirname "$0")/.."
kv=${1:?usage: scripts/k8s-manifest.sh PATH/TO/kubernetes-validate}
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
python3 - "$d" <<'PY'
import re, sys
text = open("docs/kubernetes.md").read()
blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
assert blocks, "no yaml block in docs/kubernetes.md"
for i, b in enumerate(blocks):
    open(f"{sys.argv[1]}/manifest-{i}.yaml", "w").write(b)
PY
"$kv" --strict "$d"/manifest-*.yaml
