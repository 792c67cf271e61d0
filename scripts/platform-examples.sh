#!/usr/bin/env bash
# Validates the SkyPilot and dstack examples of docs/serving-platforms.md with the platforms' own parsers:
# SkyPilot's sky.Task.from_yaml_config (its JSON schemas refuse unknown fields) and dstack's
# parse_run_configuration (pydantic, extra fields forbidden). Each ```yaml block follows a marker line
# `<!-- validated by scripts/platform-examples.sh: skypilot|dstack -->`.
# Usage: scripts/platform-examples.sh PATH/TO/skypilot-venv/bin/python PATH/TO/dstack-venv/bin/python
set -euo pipefail
cd "$(dirname "$0")/.."
sky_py=${1:?usage: scripts/platform-examples.sh SKYPILOT_PYTHON DSTACK_PYTHON}
dstack_py=${2:?usage: scripts/platform-examples.sh SKYPILOT_PYTHON DSTACK_PYTHON}
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
python3 - "$d" <<'PY'
import re, sys
text = open("docs/serving-platforms.md").read()
blocks = re.findall(r"<!-- validated by scripts/platform-examples.sh: (\w+) -->\n```yaml\n(.*?)```", text, re.S)
kinds = sorted(k for k, _ in blocks)
assert kinds == ["dstack", "skypilot"], f"expected one skypilot and one dstack block, found {kinds}"
for k, b in blocks:
    open(f"{sys.argv[1]}/{k}.yaml", "w").write(b)
PY
# SkyPilot reads its config dir on import; keep it away from the user's
HOME="$d" timeout 120 "$sky_py" - "$d/skypilot.yaml" <<'PY'
import sys, yaml, sky
task = sky.Task.from_yaml_config(yaml.safe_load(open(sys.argv[1])))
assert task.service is not None, "no service section"
p = task.service
print(f"skypilot: service valid: probe {'POST' if p.post_data else 'GET'} {p.readiness_path}, "
      f"initial delay {p.initial_delay_seconds}s, timeout {p.readiness_timeout_seconds}s")
PY
HOME="$d" timeout 120 "$dstack_py" - "$d/dstack.yaml" <<'PY'
import sys, yaml
from dstack._internal.core.models.configurations import parse_run_configuration
c = parse_run_configuration(yaml.safe_load(open(sys.argv[1])))
assert c.type == "service", c.type
print(f"dstack: {c.type} valid: " + ", ".join(f"{p.method or 'get'} {p.url} every {p.interval}s" for p in c.probes))
PY
