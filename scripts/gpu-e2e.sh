#!/usr/bin/env bash
# GPU end-to-end for vigil, on any machine with an NVIDIA GPU, PyTorch and python3 (the H200 machine:
# see shared/gpu/README.md). One self-checking call: exits non-zero on any mismatch and writes its raw
# outputs (vigil JSON, NVML and nvidia-smi captures with date and command) under $OUT.
#   (1) a real CUDA process that allocates in silent steps for longer than the stall window (not
#       stalled: GPU memory changes are progress), then holds ~21 GB and stays silent → the zombie verdict;
#   (2) a real GPU inference server (`transformers serve` on a tiny random Llama) under `vigil up` →
#       ready with GPU memory shown → `vigil down` → memory released, proven;
#   (3) a child of a server that escapes its tree and keeps GPU memory → `down --pid` names it and fails.
# Usage: VIGIL=path/to/vigil OUT=dir scripts/gpu-e2e.sh   (wheels for transformers serve in .whl/ if needed)
set -u
HERE=$(cd "$(dirname "$0")/.." && pwd)
V=${VIGIL:-$HERE/target/release/vigil}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
export VIGIL_STATE_DIR=$(mktemp -d)
W=$(mktemp -d)
FAIL=0
ok() { echo "PASS $1"; echo "PASS $1" >> "$OUT/summary.txt"; }
bad() { echo "FAIL $1"; echo "FAIL $1" >> "$OUT/summary.txt"; FAIL=1; }
capture() {
  {
    echo "## $1  $(date -u +%FT%TZ)"
    echo "# nvidia-smi --query-gpu=index,uuid,memory.used,memory.total,utilization.gpu --format=csv,noheader,nounits"
    nvidia-smi --query-gpu=index,uuid,memory.used,memory.total,utilization.gpu --format=csv,noheader,nounits
    echo "# nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits"
    nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits
  } >> "$OUT/smi-captures.txt"
  printf '{"label":"%s","nvml":%s}\n' "$1" "$("$V" gpu --json)" >> "$OUT/nvml-captures.jsonl"
}
date -u +%FT%TZ > "$OUT/date.txt"
{ nvidia-smi; uname -a; python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name(0))'; "$V" --version; } > "$OUT/machine.txt" 2>&1
"$V" gpu > "$OUT/vigil-gpu.txt" 2>&1
grep -q nvml "$OUT/vigil-gpu.txt" && ok "NVML reader loaded" || bad "NVML reader: $(head -1 "$OUT/vigil-gpu.txt")"
capture "start"

# ---------------------------------------------------------------- (1) zombie vs slow-but-alive
cat > "$W/zombie.py" <<'PY'
import time, torch
print("zombie-test: allocating in silent steps", flush=True)
xs = []
for i in range(14):  # 14 steps x 1.5 s = 21 s of silent allocation: longer than the 8 s stall window
    xs.append(torch.empty(int(1.5 * 2**30), dtype=torch.uint8, device="cuda")); torch.cuda.synchronize()
    time.sleep(1.5)
time.sleep(3600)     # ~21 GB held, silent: a zombie
PY
( sleep 9; capture "zombie-allocating" ) &
t0=$(date +%s)
"$V" up --name zombie --json --no-check --no-probe --stall 8s --gpu-interval 1s --timeout 240s -- python3 "$W/zombie.py" > "$OUT/zombie.jsonl" 2>&1
rc=$?; t1=$(date +%s)
capture "zombie-held"
tail -1 "$OUT/zombie.jsonl" > "$OUT/zombie-verdict.json"
python3 - "$OUT/zombie-verdict.json" "$rc" "$((t1 - t0))" <<'PY' && ok "(1) zombie verdict" || bad "(1) zombie verdict"
import json, sys
v = json.load(open(sys.argv[1])); rc = int(sys.argv[2]); secs = int(sys.argv[3])
print("verdict:", v.get("verdict"), "| detail:", v.get("detail"), "| after", secs, "s, exit", rc)
assert rc == 4 and v["verdict"] == "stalled", "not stalled"
d = v["detail"]
assert "GiB" in d and "on GPU 0" in d and "no log line for" in d and "and flat" in d, d
gib = float(d.split("alive ")[1].split(", ")[1].split(" GiB")[0])
assert 19.0 <= gib <= 23.0, f"held {gib} GiB, expected about 21"
assert secs >= 21 + 8, f"stalled after {secs}s: during the silent allocation (GPU memory changes are progress)"
PY
"$V" down zombie --grace 3s > "$OUT/zombie-down.txt" 2>&1
grep -q "GPU memory released" "$OUT/zombie-down.txt" && ok "(1) zombie down: memory released" || bad "(1) zombie down: $(tail -2 "$OUT/zombie-down.txt")"
capture "zombie-after-down"

# ---------------------------------------------------------------- (2) transformers serve under vigil up
if ls "$HERE"/.whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$HERE"/.whl/*.whl && export PYTHONPATH=/tmp/site
fi
python3 - <<'PY' > "$OUT/tiny-llama.txt" 2>&1
import torch, transformers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from tokenizers import Tokenizer, models, pre_tokenizers
cfg = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=4, max_position_embeddings=2048, torch_dtype="bfloat16")
LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained("/tmp/tiny-llama")
tok = Tokenizer(models.WordLevel(vocab={f"t{i}": i for i in range(512)}, unk_token="t0")); tok.pre_tokenizer = pre_tokenizers.Whitespace()
fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", bos_token="t1", eos_token="t2", pad_token="t3")
fast.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
fast.save_pretrained("/tmp/tiny-llama")
print("saved", transformers.__version__)
PY
"$V" up --name tserve --detach --json --no-check --gpu-interval 1s --timeout 240s --generate-timeout 60s -- \
  transformers serve /tmp/tiny-llama --port 8011 > "$OUT/tserve-up.jsonl" 2>&1
rc=$?
capture "tserve-ready"
"$V" status > "$OUT/tserve-status.txt" 2>&1
"$V" ps > "$OUT/tserve-ps.txt" 2>&1
python3 - "$OUT/tserve-up.jsonl" "$rc" <<'PY' && ok "(2) transformers serve ready with GPU memory" || bad "(2) transformers serve ready"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
v = lines[-1]; rc = int(sys.argv[2])
gpu = [l for l in lines if l.get("event") == "gpu" and l.get("held_mib", 0) > 0]
print("verdict:", v.get("verdict"), "| detail:", v.get("detail"), "| gpu events:", [(g["held_mib"], g["per_gpu_mib"]) for g in gpu][-1:])
assert rc == 0 and v["verdict"] == "ready", f"exit {rc}"
assert gpu, "no GPU memory seen for the server's tree"
PY
"$V" down tserve --grace 10s > "$OUT/tserve-down.txt" 2>&1
rc=$?
capture "tserve-after-down"
[ $rc = 0 ] && grep -q "GPU memory released" "$OUT/tserve-down.txt" && ok "(2) down: memory released, proven" || bad "(2) down: $(tail -3 "$OUT/tserve-down.txt")"
cp "$VIGIL_STATE_DIR/runs/tserve/server.log" "$OUT/tserve-server.log" 2>/dev/null

# ---------------------------------------------------------------- (3) an escaped child keeps GPU memory
cat > "$W/escape.py" <<'PY'
import os, time, sys
# A server stand-in whose child escapes the process tree (double fork + setsid) and keeps GPU memory.
pid = os.fork()
if pid == 0:
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    import torch
    x = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda"); torch.cuda.synchronize()
    open(sys.argv[1], "w").write(str(os.getpid()))
    time.sleep(3600)
os.waitpid(pid, 0)
import torch
y = torch.empty(1 * 2**30, dtype=torch.uint8, device="cuda"); torch.cuda.synchronize()
print("server stand-in ready", flush=True)
time.sleep(3600)
PY
python3 "$W/escape.py" "$W/escapee.pid" > "$W/escape.log" 2>&1 &
parent=$!
for i in $(seq 1 120); do grep -q ready "$W/escape.log" && [ -s "$W/escapee.pid" ] && break; sleep 0.5; done
escapee=$(cat "$W/escapee.pid" 2>/dev/null)
capture "escape-before-down"
"$V" down --pid "$parent" --grace 3s > "$OUT/escape-down.txt" 2>&1
rc=$?
capture "escape-after-down"
cat "$OUT/escape-down.txt"
[ $rc = 9 ] && grep -q "pid $escapee .* holds .* MiB on GPU 0; it started after the server and left its process tree" "$OUT/escape-down.txt" \
  && ok "(3) escaped child named, down fails (exit $rc)" || bad "(3) escaped child (exit $rc, escapee $escapee)"
kill -9 "$escapee" 2>/dev/null; sleep 2
capture "end"

cp "$OUT"/summary.txt "$OUT/summary-final.txt" 2>/dev/null
echo "== $(grep -c PASS "$OUT/summary.txt") passed, $(grep -c FAIL "$OUT/summary.txt") failed"
exit $FAIL
