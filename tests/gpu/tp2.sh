# Issue #32: a real tensor-parallel-2 start with EVERY rank under vigil, on the one-GPU machine, as two "nodes" on
# one GPU (../shared/gpu/realserve/two-nodes.sh: each rank its own NCCL_HOSTID, collectives over loopback sockets).
# Each rank is started by its own process, as a launcher would: `vigil up --multi-node --rank R --ranks 2
# --rendezvous 127.0.0.1:PORT -- <server> --node-rank R`; rank 0's vigil is the head and says the one verdict.
# Sourced through RS_EXTRA, from the project root on the GPU machine:
#   RS_EXTRA=tests/gpu/tp2.sh bash .rs-carry/kit/scenarios.sh t1 t2 t3 t4                    # vLLM 0.26.0
#   RS_EXTRA=tests/gpu/tp2.sh RS_STACK=sglang bash .rs-carry-sgl/kit/scenarios.sh t1 t2 t3 t4  # SGLang 0.5.17
# Scenarios (what is done, and what vigil is expected to say):
#   t1  a good start: both ranks ready, one verdict (ready), a completion through rank 0; then SIGKILL of rank
#       1's engine (VLLM::Worker_TP1 / sglang::scheduler_TP1): crashed, decided by rank 1
#   t2  SIGSTOP of rank 1's engine at the first CUDA-graph capture line, --stall cuda_graphs=15s: stalled in
#       cuda_graphs, decided by rank 1 (its process is stopped; rank 0 only waits), both ranks' evidence
#   t3  SIGKILL of rank 1's engine at its first weight-loading line: crashed, decided by rank 1. The tiny model
#       loads in under 0.1 s, so t3 serves a wide one (tp_wide_model: intermediate_size 1048576, 12.9 GB of bf16
#       zeros in a sparse safetensors file written in a second): each rank reads 6.4 GB, seconds of loading
#   t4  rank 1 with NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME naming no interface: crashed in dist_init,
#       decided by rank 1; rank 0 is stopped (it would wait for its peer for the server's own timeout)
# After each: both vigils' --json lines, both ranks' whole server.log, the GPU's processes after the stop.

NEED+=([t1]=170 [t2]=150 [t3]=110 [t4]=90)
RV_PORT=24811

if [ "$RS_STACK" = sglang ]; then
  TP_COMMON=(--tp-size 2 --nnodes 2 --dist-init-addr 127.0.0.1:29555 --mem-fraction-static 0.35 --disable-custom-all-reduce)
  tp_rank_flags() { [ "$1" = 0 ] && echo "--node-rank 0" || echo "--node-rank 1 --port $((PORT + 1))"; }
  RANK1_ENGINE='^sglang::scheduler_TP1'
else
  TP_COMMON=(--tensor-parallel-size 2 --nnodes 2 --master-addr 127.0.0.1 --master-port 29556 --gpu-memory-utilization 0.4)
  tp_rank_flags() { [ "$1" = 0 ] && echo "--node-rank 0" || echo "--node-rank 1 --headless"; }
  RANK1_ENGINE='^VLLM::Worker_TP1'
fi
WEIGHTS_RE='Load weight begin|Loading weights|Loading safetensors|Starting to load model|load_model'

# tp_start NAME LIMIT RANK [vigil flags] [-- extra env for the server as K=V...]: rank RANK's vigil in the
# background; its pid in TP_PID[RANK]
TP_PID0=""; TP_PID1=""; TP_T0=0; TP_T1=0
tp_start() {
  local name=$1 lim=$2 r=$3; shift 3
  local d=$OD/$name; mkdir -p "$d"
  local ifn=lo; [ -n "${TP_BAD_IF:-}" ] && [ "$r" = 1 ] && ifn=$TP_BAD_IF
  # shellcheck disable=SC2046
  local cmd=("$VIGIL" up --multi-node --rank "$r" --ranks 2 --rendezvous "127.0.0.1:$RV_PORT" --name "$name"
             --replace --json --join-timeout 2m "${ENVA[@]}" --env "NCCL_HOSTID=node$r"
             --env "NCCL_SOCKET_IFNAME=$ifn" --env "GLOO_SOCKET_IFNAME=$ifn" "$@"
             -- "${SERVE[@]}" "${TP_COMMON[@]}" $(tp_rank_flags "$r"))
  printf '%q ' "${cmd[@]}" > "$d/cmd-rank$r.txt"
  rm -rf "${VIGIL_STATE_DIR:?}/runs/$name.n$r"
  # vigil itself in the background (under timeout, which passes a SIGTERM on): its pid is the one to signal
  timeout -k 20 "$lim" "${cmd[@]}" > "$d/rank$r.jsonl" 2> "$d/rank$r.stderr" &
  printf -v "TP_PID$r" %s "$!"
  printf -v "TP_T$r" %s "$SECONDS"
}
tp_pid() { if [ "$1" = 0 ]; then echo "$TP_PID0"; else echo "$TP_PID1"; fi; }
tp_log() { echo "$VIGIL_STATE_DIR/runs/$1.n$2/server.log"; }
# tp_wait_line NAME PATTERN SECONDS [RANKS]: until a rank's log has a line matching PATTERN (0) or time is up (1)
tp_wait_line() {
  local name=$1 re=$2 secs=$3 ranks=${4:-"0 1"} i r
  for i in $(seq 1 $((secs * 20))); do
    for r in $ranks; do grep -aEq "$re" "$(tp_log "$name" "$r")" 2>/dev/null && return 0; done
    kill -0 "$TP_PID0" 2>/dev/null || kill -0 "$TP_PID1" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}
# tp_end NAME: wait for both vigils (bounded), keep what they left, prove the GPU free
tp_end() {
  local name=$1 d=$OD/$1 r i
  for i in $(seq 1 240); do
    kill -0 "$TP_PID0" 2>/dev/null || kill -0 "$TP_PID1" 2>/dev/null || break
    sleep 0.5
  done
  for r in 0 1; do
    kill -0 "$(tp_pid "$r")" 2>/dev/null && { note "$name: rank $r's vigil still running: SIGTERM"; kill "$(tp_pid "$r")"; }
  done
  for r in 0 1; do
    wait "$(tp_pid "$r")" 2>/dev/null; echo $? > "$d/rank$r.rc"
    local t0v; if [ "$r" = 0 ]; then t0v=$TP_T0; else t0v=$TP_T1; fi; echo $((SECONDS - t0v)) > "$d/rank$r.secs"
  done
  for r in 0 1; do
    cp -a "$VIGIL_STATE_DIR/runs/$name.n$r" "$d/run$r" 2>/dev/null
    pkill -CONT -f "$RANK1_ENGINE" 2>/dev/null
  done
  # the GPU after vigil's stop: every process of both ranks gone, their memory released
  local apps=""
  for i in $(seq 1 20); do
    apps=$(nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader 2>/dev/null)
    [ -z "$apps" ] && break; sleep 0.5
  done
  echo "${apps:-none}" > "$d/gpu-after.txt"
  note "$name: GPU after the stop: ${apps:-no process holds memory}"
  for r in 0 1; do timeout 60 "$VIGIL" down "$name.n$r" > "$d/down$r.txt" 2>&1; done
  local left; left=$(pgrep -f '^VLLM::|^sglang::'; pgrep -f "vllm serve $M/target|sglang.launch_server --model-path $M/target")
  [ -n "$left" ] && { note "$name: leftover server processes: $(echo $left) (killed)"; kill -9 $left 2>/dev/null; sleep 2; }
}
# tp_record NAME EXPECT: the head's combined verdict (the multi_node_verdict event of rank 0's --json)
tp_record() {
  local name=$1 exp=$2 d=$OD/$1
  local got; got=$(python3 - "$d/rank0.jsonl" "$d/rank1.jsonl" <<'PY'
import json, sys
mv, verdicts = None, {}
for i, f in enumerate(sys.argv[1:]):
    try:
        lines = open(f, errors="replace").read().splitlines()
    except OSError:
        continue
    for line in lines:
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if e.get("event") == "multi_node_verdict":
            mv = e
        if e.get("event") == "verdict":
            verdicts[i] = f"{e.get('verdict')}/{e.get('phase')}/{e.get('cause')}"
if mv is None:
    print("no multi_node_verdict; rank verdicts " + str(verdicts))
else:
    by = (mv.get("decided_by") or {}).get("rank")
    print(f"verdict={mv.get('verdict')} phase={mv.get('phase')} decided_by_rank={by} exit={mv.get('exit')} ranks={verdicts}")
PY
)
  printf '%-4s expect: %-44s got: rc0=%s rc1=%s %s\n' "$name" "$exp" "$(cat "$d/rank0.rc" 2>/dev/null)" \
    "$(cat "$d/rank1.rc" 2>/dev/null)" "$got" | tee -a "$SUM"
}

sc_t1() {
  local d=$OD/t1; mkdir -p "$d"
  tp_start t1 300 1; tp_start t1 300 0
  local i
  for i in $(seq 1 5000); do
    grep -q '"multi_node_verdict"' "$d/rank0.jsonl" 2>/dev/null && break
    kill -0 "$TP_PID0" 2>/dev/null || break
    sleep 0.05
  done
  note "t1: head's first verdict: $(grep '"multi_node_verdict"' "$d/rank0.jsonl" | head -1 | cut -c1-200)"
  if python3 -c 'import json,sys; sys.exit(0 if any(e.get("event")=="multi_node_verdict" and e.get("exit")==0 for e in map(json.loads, filter(str.strip, open(sys.argv[1])))) else 1)' "$d/rank0.jsonl" 2>/dev/null; then
    complete "$d/completion.txt" 16
    nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv > "$d/gpu-ready.csv" 2>&1
    cp "$d/rank0.jsonl" "$d/rank0-at-ready.jsonl"
    local ec; ec=$(pgrep -f "$RANK1_ENGINE" | head -1)
    note "t1: SIGKILL rank 1's engine pid $ec ($(tr '\0' ' ' < /proc/$ec/cmdline 2>/dev/null | head -c 60))"
    [ -n "$ec" ] && kill -9 "$ec"
  fi
  tp_end t1
  tp_record t1 "ready, then crashed decided by rank 1"
}
sc_t2() {
  local d=$OD/t2; mkdir -p "$d"
  tp_start t2 240 1 --stall cuda_graphs=15s; tp_start t2 240 0 --stall cuda_graphs=15s
  if tp_wait_line t2 "$CAPTURE_RE" 200; then
    local ec; ec=$(pgrep -f "$RANK1_ENGINE" | head -1)
    kill -STOP "$ec"
    note "t2: SIGSTOP rank 1's engine pid $ec at the first capture line"
  else
    note "t2: no capture line seen: nothing stopped"
  fi
  tp_end t2
  tp_record t2 "stalled, cuda_graphs, decided by rank 1"
}
# tp_wide_model: $W/wide, the tiny target with intermediate_size 1048576 (each MLP matrix 1 GiB), its weights
# zeros in a sparse safetensors file (header written here, the data a hole): loading takes seconds, not 0.1 s
tp_wide_model() {
  local d=$W/wide f
  [ -f "$d/model.safetensors" ] && { echo "$d"; return; }
  rm -rf "$d"; mkdir -p "$d"
  for f in "$M/target"/*; do case "$f" in *.safetensors|*/config.json) ;; *) ln -s "$f" "$d/";; esac; done
  python3 - "$M/target/config.json" "$d" <<'PY'
import json, struct, sys
cfg = json.load(open(sys.argv[1])); out = sys.argv[2]
cfg["intermediate_size"] = 1048576
json.dump(cfg, open(out + "/config.json", "w"), indent=1)
h, v, ffn, L = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
q = cfg["num_attention_heads"] * cfg["head_dim"]; kv = cfg["num_key_value_heads"] * cfg["head_dim"]
shapes = {"model.embed_tokens.weight": [v, h], "model.norm.weight": [h], "lm_head.weight": [v, h]}
for i in range(L):
    p = f"model.layers.{i}."
    shapes.update({p + "input_layernorm.weight": [h], p + "post_attention_layernorm.weight": [h],
                   p + "self_attn.q_proj.weight": [q, h], p + "self_attn.k_proj.weight": [kv, h],
                   p + "self_attn.v_proj.weight": [kv, h], p + "self_attn.o_proj.weight": [h, q],
                   p + "mlp.gate_proj.weight": [ffn, h], p + "mlp.up_proj.weight": [ffn, h],
                   p + "mlp.down_proj.weight": [h, ffn]})
hdr, off = {"__metadata__": {"format": "pt"}}, 0
for k, sh in shapes.items():
    n = 2
    for x in sh: n *= x
    hdr[k] = {"dtype": "BF16", "shape": sh, "data_offsets": [off, off + n]}; off += n
b = json.dumps(hdr).encode(); b += b" " * (-len(b) % 8)
with open(out + "/model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(b))); f.write(b); f.truncate(8 + len(b) + off)
print(f"wide model: {off / 2**30:.1f} GiB of zeros (sparse)", file=sys.stderr)
PY
  echo "$d"
}
sc_t3() {
  local d=$OD/t3; mkdir -p "$d"
  local wide; wide=$(tp_wide_model)
  local keep=("${SERVE[@]}") i
  for i in "${!SERVE[@]}"; do [ "${SERVE[$i]}" = "$M/target" ] && SERVE[$i]=$wide; done
  tp_start t3 200 1; tp_start t3 200 0
  SERVE=("${keep[@]}")
  # rank 1's own weights line: rank 0's may come while rank 1 is still in its rendezvous
  if tp_wait_line t3 "$WEIGHTS_RE" 150 1; then
    local ec; ec=$(pgrep -f "$RANK1_ENGINE" | head -1)
    kill -9 "$ec"
    note "t3: SIGKILL rank 1's engine pid $ec at its first weights line ($(grep -aEh "$WEIGHTS_RE" "$(tp_log t3 1)" 2>/dev/null | head -1 | cut -c1-100)); its log's last line then: $(tail -c 300 "$(tp_log t3 1)" | tr '\r' '\n' | tail -1 | cut -c1-120)"
  else
    note "t3: no weights line seen: nothing killed"
  fi
  tp_end t3
  tp_record t3 "crashed (weights or later), decided by rank 1"
}
sc_t4() {
  local d=$OD/t4; mkdir -p "$d"
  TP_BAD_IF=nosuch0 tp_start t4 200 1; tp_start t4 200 0
  tp_end t4
  tp_record t4 "crashed, dist_init, decided by rank 1"
}
