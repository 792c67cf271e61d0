#!/usr/bin/env bash
# Two-GPU check (the nvidia-h200-x2 machine): per-GPU readings on real hardware, locally (NVML) and
# over SSH (the node's nvidia-smi; sshd/ssh carried in $CARRY when the image has none).
#   (1) a silent CUDA process allocating 6 GiB on GPU 0 and 3 GiB on GPU 1 (each GPU also holds its
#       CUDA context, ~0.5 GiB) → zombie verdict naming both GPUs ("GPU0 6.5 GiB, GPU1 3.5 GiB … and
#       flat"); `down` proves both released;
#   (2) the same over `--host` (one SSH connection);
#   (3) equal allocations (4 GiB on each) → "4.5 GiB held on each of GPUs 0-1".
# Usage: VIGIL=path/to/vigil OUT=dir [CARRY=dir] scripts/gpu2-e2e.sh
set -u
. "$(dirname "$0")/gpu-common.sh"
export VIGIL_STATE_DIR=$(mktemp -d)
W=$(mktemp -d)
{ nvidia-smi -L; "$V" gpu; } > "$OUT/gpu2-machine.txt" 2>&1
[ "$(nvidia-smi -L | wc -l)" -ge 2 ] || { bad "fewer than 2 GPUs"; exit 1; }
cat > "$W/z2.py" <<'PY'
import sys, time, torch
a, b = float(sys.argv[1]), float(sys.argv[2])
print("zombie2: allocating on two GPUs", flush=True)
x = [torch.empty(int(a * 2**30), dtype=torch.uint8, device="cuda:0"),
     torch.empty(int(b * 2**30), dtype=torch.uint8, device="cuda:1")]
torch.cuda.synchronize(0); torch.cuda.synchronize(1)
time.sleep(3600)
PY
check() {  # file rc needle
  python3 - "$1" "$2" "$3" <<'PY'
import json, re, sys
v = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")][-1]
print("verdict:", v.get("verdict"), "| detail:", v.get("detail"), "| exit", sys.argv[2])
assert sys.argv[2] == "4" and v["verdict"] == "stalled", "not stalled"
assert re.search(sys.argv[3], v["detail"]) and "and flat" in v["detail"], v["detail"]
PY
}
"$V" up --name z2 --json --no-check --no-probe --stall 8s --gpu-interval 1s --timeout 120s -- python3 "$W/z2.py" 6 3 > "$OUT/gpu2-local.jsonl" 2>&1
check "$OUT/gpu2-local.jsonl" $? "GPU0 6\\.[0-9] GiB, GPU1 3\\.[0-9] GiB" && ok "(1) local zombie names both GPUs" || bad "(1) local zombie"
"$V" down z2 > "$OUT/gpu2-local-down.txt" 2>&1; rc=$?; cat "$OUT/gpu2-local-down.txt"
{ [ $rc = 0 ] && grep -q "GPU memory released" "$OUT/gpu2-local-down.txt"; } && ok "(1) local down releases both" || bad "(1) local down"
"$V" up --name z3 --json --no-check --no-probe --stall 8s --gpu-interval 1s --timeout 120s -- python3 "$W/z2.py" 4 4 > "$OUT/gpu2-equal.jsonl" 2>&1
check "$OUT/gpu2-equal.jsonl" $? "4\\.[0-9] GiB held on each of GPUs 0-1" && ok "(3) equal holdings summarised" || bad "(3) equal holdings"
"$V" down z3 > /dev/null 2>&1

# (2) over SSH
start_gpunode 22923
$R up --name rz2 --json --no-check --no-probe --stall 8s --gpu-interval 1s --timeout 120s -- python3 "$W/z2.py" 6 3 > "$OUT/gpu2-remote.jsonl" 2>&1
rc=$?
n=$(grep -c "Accepted publickey" "$S/sshd.log")
{ check "$OUT/gpu2-remote.jsonl" $rc "GPU0 6\\.[0-9] GiB, GPU1 3\\.[0-9] GiB" && [ "$n" = 1 ]; } && ok "(2) remote zombie names both GPUs, 1 connection" || bad "(2) remote zombie (connections $n)"
$R down rz2 > "$OUT/gpu2-remote-down.txt" 2>&1; rc=$?; cat "$OUT/gpu2-remote-down.txt"
{ [ $rc = 0 ] && grep -q "GPU memory released" "$OUT/gpu2-remote-down.txt"; } && ok "(2) remote down releases both" || bad "(2) remote down"
kill $SP
exit $FAIL
