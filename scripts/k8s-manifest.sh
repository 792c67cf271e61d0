#!/usr/bin/env bash
# Validates every ```yaml block of docs/kubernetes.md with kubernetes-validate --strict (path given as $1).
# Prints the validator's verdict per block; exits non-zero on any error or unknown field. A LeaderWorkerSet (a
# CRD, no schema in kubernetes-validate) has its fields checked against the LWS v1 API here (kubernetes-sigs/lws
# api/leaderworkerset/v1: LeaderWorkerSetSpec, LeaderWorkerTemplate, StartupPolicy, RestartPolicy), and its
# leader and worker pod templates validated strictly as v1 PodTemplates.
set -euo pipefail
cd "$(dirname "$0")/.."
kv=${1:?usage: scripts/k8s-manifest.sh PATH/TO/kubernetes-validate}
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
# the validator's own interpreter has PyYAML (kubernetes-validate needs it)
"$(dirname "$kv")/python" - "$d" <<'PY'
import re, sys, yaml
text = open("docs/kubernetes.md").read()
blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
assert blocks, "no yaml block in docs/kubernetes.md"

def only(where, d, allowed):
    extra = set(d) - set(allowed)
    assert not extra, f"{where}: fields the LeaderWorkerSet v1 API does not have: {sorted(extra)}"

n = 0
for i, b in enumerate(blocks):
    doc = yaml.safe_load(b)
    if doc.get("kind") != "LeaderWorkerSet":
        open(f"{sys.argv[1]}/manifest-{n}.yaml", "w").write(b); n += 1
        continue
    assert doc["apiVersion"] == "leaderworkerset.x-k8s.io/v1", doc["apiVersion"]
    only("LeaderWorkerSet", doc, ["apiVersion", "kind", "metadata", "spec"])
    spec = doc["spec"]
    only("spec", spec, ["replicas", "leaderWorkerTemplate", "rolloutStrategy", "startupPolicy", "networkConfig"])
    assert spec.get("startupPolicy", "LeaderCreated") in ("LeaderCreated", "LeaderReady"), spec["startupPolicy"]
    t = spec["leaderWorkerTemplate"]
    only("spec.leaderWorkerTemplate", t, ["leaderTemplate", "workerTemplate", "size", "restartPolicy", "subGroupPolicy"])
    assert isinstance(t["size"], int) and t["size"] >= 1, t["size"]
    assert t.get("restartPolicy", "None") in ("RecreateGroupOnPodRestart", "None"), t["restartPolicy"]
    for role in ("leaderTemplate", "workerTemplate"):
        if role not in t:
            continue
        pt = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"lws-{role.lower()}"}, "template": t[role]}
        open(f"{sys.argv[1]}/manifest-{n}.yaml", "w").write(yaml.safe_dump(pt)); n += 1
    print(f"LeaderWorkerSet {doc['metadata']['name']}: fields match the v1 API; its pod templates follow")
PY
"$kv" --strict "$d"/manifest-*.yaml
