#!/usr/bin/env bash
# GPU end-to-end over SSH, on a machine with an NVIDIA GPU and PyTorch (the H200 machine). One
# self-checking call. It starts a real sshd on a loopback port (the machine is its own "remote node";
# sshd/ssh binaries and their libraries may be carried in $CARRY when the image has none) and drives
# vigil only through `--host`:
#   (1) a real CUDA process that allocates in silent steps, then holds ~21 GB silently: over SSH, the GPU
#       readings come from the node's nvidia-smi → the zombie verdict (stalled, "alive …, N GiB on GPU 0
#       and flat"), one SSH connection for the whole `up`;
#   (2) `down --host` → GPU memory released (proven with nvidia-smi on the node);
#   (3) `check --host` counts the node's GPUs against TP (asks for one more than there are).
# Usage: VIGIL=path/to/vigil OUT=dir [CARRY=dir-with-bin-and-lib] scripts/gpu-remote-e2e.sh
set -u
. "$(dirname "$0")/gpu-common.sh"
start_gpunode 22922
{ nvidia-smi; uname -a; "$V" --version; ssh -V; } > "$OUT/remote-machine.txt" 2>&1

cat > "$S/zombie.py" <<'PY'
import time, torch
print("zombie-test: allocating in silent steps", flush=True)
xs = []
for i in range(14):  # 14 x 1.5 s = 21 s of silent allocation: longer than the 8 s stall window
    xs.append(torch.empty(int(1.5 * 2**30), dtype=torch.uint8, device="cuda")); torch.cuda.synchronize()
    time.sleep(1.5)
time.sleep(3600)
PY
t0=$(date +%s)
$R up --name rzombie --json --no-check --no-probe --stall 8s --gpu-interval 1s --timeout 240s -- python3 "$S/zombie.py" > "$OUT/remote-zombie.jsonl" 2>&1
rc=$?; t1=$(date +%s)
n=$(grep -c "Accepted publickey" "$S/sshd.log")
python3 - "$OUT/remote-zombie.jsonl" "$rc" "$((t1 - t0))" "$n" <<'PY' && ok "(1) remote zombie verdict over one SSH connection" || bad "(1) remote zombie verdict"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
v = lines[-1]; rc = int(sys.argv[2]); secs = int(sys.argv[3]); conns = int(sys.argv[4])
print("verdict:", v.get("verdict"), "| detail:", v.get("detail"), "| after", secs, "s, exit", rc, "| connections", conns)
gpu = [l for l in lines if l.get("event") == "gpu"]
print("gpu events:", len(gpu), "max held MiB:", max((g["held_mib"] for g in gpu), default=0))
assert rc == 4 and v["verdict"] == "stalled", "not stalled"
assert "GiB on GPU 0" in v["detail"] and "and flat" in v["detail"], v["detail"]
assert conns == 1, conns
PY
$R down rzombie > "$OUT/remote-zombie-down.txt" 2>&1
rc=$?
cat "$OUT/remote-zombie-down.txt"
{ [ $rc = 0 ] && grep -q "GPU memory released" "$OUT/remote-zombie-down.txt"; } && ok "(2) remote down releases GPU memory (nvidia-smi on the node)" || bad "(2) remote down (exit $rc)"
G=$(nvidia-smi -L | wc -l)   # one more than the node has
$R check -- python3 -m sglang.launch_server --model-path /nonexistent --tp $((G + 1)) > "$OUT/remote-check.txt" 2>&1
cat "$OUT/remote-check.txt"
grep -q "$((G + 1)) GPUs needed, gpunode has $G" "$OUT/remote-check.txt" && ok "(3) remote check counts the node's GPUs" || bad "(3) remote check GPU count"
cp "$S/sshd.log" "$OUT/sshd.log"
kill $SP
exit $FAIL
