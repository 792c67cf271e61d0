# Extra scenarios for ../shared/gpu/realserve/scenarios.sh (issue #23), sourced through RS_EXTRA after the kit's own.
# Runs on the GPU machine from the project root:
#   RS_EXTRA=tests/gpu/realserve-extra.sh bash .rs-carry/kit/scenarios.sh k B EF c          (vLLM)
#   RS_EXTRA=tests/gpu/realserve-extra.sh RS_STACK=sglang bash .rs-carry-sgl/kit/scenarios.sh k B EF c
# carry: the stack's carry folder and .rs-extra (py-spy.xz: py-spy 0.4.3's binary from its manylinux wheel, xz -9).
#   k   stall in CUDA-graph capture with --on-stall keep, then `vigil dump` (py-spy) and `vigil down` (GPU proven free)
#   B   a batch of short starts in two waves of concurrent servers (own port each, small memory share): refusals
#       from config, model files, arguments, ports, draft context; and ready starts with other flags. Each one is a
#       whole real log for the corpus.
#   EF  e (engine SIGKILLed after ready, under `vigil watch`) and f (EAGLE-3 with the random draft, foreground
#       `vigil up` stopped by `vigil down` from another shell) side by side, each with part of the GPU; f keeps
#       /metrics before and after each proof-sized request and SGLang's /generate meta_info for the proof.
if [ -f "$ROOT/.rs-extra/py-spy.xz" ]; then   # py-spy for `vigil dump` (xz: the SGLang carry is near 64 MiB)
  mkdir -p "$W/extra-bin"; xz -dc "$ROOT/.rs-extra/py-spy.xz" > "$W/extra-bin/py-spy" && chmod +x "$W/extra-bin/py-spy"
  export PATH="$W/extra-bin:$PATH"
fi
command -v py-spy >/dev/null && echo "py-spy: $(py-spy --version 2>&1)"

if [ "$RS_STACK" = sglang ]; then
  MODELFLAG=--model-path; MEMFLAG=--mem-fraction-static; SMALLMEM=0.07; HALFMEM=0.38
  TPFLAG=--tp-size; EAGER=(--disable-cuda-graph); SMALLCTX=(--context-length 2048 --max-running-requests 4)
  SPECS() { echo --speculative-algorithm EAGLE3 --speculative-draft-model-path "$1" --speculative-num-steps 3 \
            --speculative-eagle-topk 1 --speculative-num-draft-tokens 4; }
else
  MODELFLAG=""; MEMFLAG=--gpu-memory-utilization; SMALLMEM=0.07; HALFMEM=0.38
  TPFLAG=--tensor-parallel-size; EAGER=(--enforce-eager); SMALLCTX=(--max-model-len 2048 --max-num-seqs 4)
  SPECS() { echo --speculative-config "{\"method\":\"eagle3\",\"model\":\"$1\",\"num_speculative_tokens\":3}"; }
fi
# serve MODEL PORT: the stack's server command (the kit's SERVE with another model path and port)
serve() {
  if [ "$RS_STACK" = sglang ]; then
    CMD=(python3 -m sglang.launch_server --model-path "$1" --host 127.0.0.1 --port "$2"
         --attention-backend triton --sampling-backend pytorch --enable-metrics)
  else
    CMD=(vllm serve "$1" --host 127.0.0.1 --port "$2")
  fi
}
# engine_of RUN: the engine process (by title) inside RUN's process tree
engine_of() {
  local top; top=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("server_pid") or json.load(open(sys.argv[1])).get("pid") or "")' "$VIGIL_STATE_DIR/runs/$1/state.json" 2>/dev/null)
  python3 - "$top" "$ENGINE_RE" <<'PY'
import os, re, sys
top, pat = sys.argv[1], re.compile(sys.argv[2])
kids, title = {}, {}
for p in os.listdir("/proc"):
    if not p.isdigit(): continue
    try:
        st = open(f"/proc/{p}/stat").read(); ppid = st[st.rindex(")") + 2:].split()[1]
        title[p] = open(f"/proc/{p}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
    except OSError: continue
    kids.setdefault(ppid, []).append(p)
seen, todo = [], [top] if top else []
while todo:
    p = todo.pop(); seen.append(p); todo += kids.get(p, [])
for p in seen:
    if pat.search(title.get(p, "")): print(p); break
PY
}
metrics() { curl -s -m 10 "$1/metrics" | grep -E "$METRICS_RE" > "$2" 2>&1; }

# --- k: the seed's zombie, kept for the evidence, then a proven stop
NEED[k]=130
sc_k() {
  local d=$OD/k; mkdir -p "$d"
  ( up k 240 --detach --on-stall keep --stall "${RS_D_STALL:-cuda_graphs=15s}" -- "${SERVE[@]}" ) &
  local bg=$! log=$VIGIL_STATE_DIR/runs/k/server.log i ec=""
  for i in $(seq 1 6000); do
    grep -aEq "$CAPTURE_RE" "$log" 2>/dev/null && break
    kill -0 $bg 2>/dev/null || break
    sleep 0.05
  done
  ec=$(engine_pid)
  if [ -n "$ec" ] && grep -aEq "$CAPTURE_RE" "$log" 2>/dev/null; then
    kill -STOP "$ec"; note "k: SIGSTOP engine pid $ec"
  else
    note "k: no capture line or no engine process seen (engine pid '$ec'): nothing stopped"
  fi
  wait $bg
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv > "$d/gpu-at-stall.csv" 2>&1
  timeout -k 10 120 "$VIGIL" dump k --json > "$d/dump.jsonl" 2> "$d/dump.stderr"; echo $? > "$d/dump.rc"
  cp -a "$VIGIL_STATE_DIR/runs/k" "$d/run-after-dump" 2>/dev/null
  note "k: vigil dump exit $(cat "$d/dump.rc")"
  timeout -k 10 120 "$VIGIL" down k --json > "$d/vigil-down.jsonl" 2> "$d/vigil-down.stderr"; echo $? > "$d/vigil-down.rc"
  note "k: vigil down (engine still stopped) exit $(cat "$d/vigil-down.rc")"
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv > "$d/gpu-after-down.csv" 2>&1
  [ -n "$ec" ] && kill -CONT "$ec" 2>/dev/null
  snap k; down k
  record k "stalled (4), cuda_graphs; dump with py-spy; down frees the GPU"
}

# --- B: many short starts, concurrently
# one NAME EXPECT MODEL [flags...]: a start of its own on its own port (the scenario's name picks the port)
B_I=0
one() {
  local name=$1 exp=$2 model=$3; shift 3
  B_I=$((B_I + 1)); local port=$((PORT + 1000 * B_I))   # SGLang takes its NCCL port in [port+100, port+1000]
  serve "$model" "$port"
  (
    launch "$name" 200 --detach --stall launch=6m -- "${CMD[@]}" "$@"
    local r=$R
    if ready "$r"; then
      curl -s -m 60 "http://127.0.0.1:$port/v1/completions" -H 'content-type: application/json' \
        -d "{\"model\":\"$model\",\"prompt\":\"Hello, my name is\",\"max_tokens\":8,\"temperature\":0}" \
        -w '\nHTTP %{http_code}\n' > "$OD/$r/completion.txt" 2>&1
    fi
    snap "$r"
    timeout -k 10 120 "$VIGIL" down "$r" > "$OD/$r/down.txt" 2>&1; echo $? > "$OD/$r/down.rc"
    record "$r" "$exp"
  ) &
}
# the model folders for the refusals, written once from the tiny target
broken_models() {
  [ -f "$M/.broken-done" ] && return
  python3 - "$M" <<'PY'
import json, os, shutil, sys
m = sys.argv[1]; t = f"{m}/target"
def clone(name):
    d = f"{m}/{name}"; shutil.rmtree(d, ignore_errors=True); shutil.copytree(t, d); return d
d = clone("notok")                                  # no tokenizer files
for f in os.listdir(d):
    if f.startswith("tokenizer") or f in ("special_tokens_map.json", "vocab.json", "merges.txt"): os.remove(f"{d}/{f}")
d = clone("badjson"); s = open(f"{d}/config.json").read(); open(f"{d}/config.json", "w").write(s[: len(s) // 2])
d = clone("trunc")                                  # the weights cut in half
for f in os.listdir(d):
    if f.endswith(".safetensors"):
        p = f"{d}/{f}"; n = os.path.getsize(p); os.truncate(p, n // 2)
d = clone("badarch"); c = json.load(open(f"{d}/config.json")); c["architectures"] = ["VigilNoSuchForCausalLM"]
json.dump(c, open(f"{d}/config.json", "w"), indent=2)
e = f"{m}/eagle3-short"; shutil.rmtree(e, ignore_errors=True); shutil.copytree(f"{m}/eagle3", e)
c = json.load(open(f"{e}/config.json")); c["max_position_embeddings"] = 2048
json.dump(c, open(f"{e}/config.json", "w"), indent=2)
open(f"{m}/.broken-done", "w").write("1")
PY
}
NEED[B]=220
sc_B() {
  broken_models
  local T=$M/target
  # wave 1: the starts that reach the GPU
  B_I=0
  one eager  "ready (0)"                         "$T" $MEMFLAG $SMALLMEM "${EAGER[@]}"
  one small  "ready (0)"                         "$T" $MEMFLAG $SMALLMEM "${SMALLCTX[@]}"
  one fp16   "ready (0)"                         "$T" $MEMFLAG $SMALLMEM --dtype float16
  one fp8    "ready (0) or crashed, quantization" "$T" $MEMFLAG $SMALLMEM --quantization fp8
  one kvfp8  "ready (0) or crashed, kv_cache"     "$T" $MEMFLAG $SMALLMEM --kv-cache-dtype fp8
  one tmpl   "crashed (3), model_file/config"     "$T" $MEMFLAG $SMALLMEM --chat-template /nonexistent/template.jinja
  one long   "crashed (3), launch, config"        "$T" "${LONG[@]}"
  one lowmem "crashed (3), kv_cache, gpu_oom"     "$T" "${LOWMEM[@]}"
  one short  "draft context < target: server's own verdict" "$T" $MEMFLAG $SMALLMEM $(SPECS "$M/eagle3-short")
  wait; note "B: wave 1 done"
  # wave 2: refusals before the GPU
  one nomodel "crashed (3), launch, model_file"   "$M/no-such-model"
  one tp3     "crashed (3), launch, config"       "$T" $TPFLAG 3
  one notok   "crashed (3), model_file"           "$M/notok"
  one badjson "crashed (3), launch, config/model_file" "$M/badjson"
  one trunc   "crashed (3), weights, model_file"  "$M/trunc" $MEMFLAG $SMALLMEM
  one badarch "crashed (3), launch, config"       "$M/badarch"
  one badarg  "crashed (3), launch, config (argument)" "$T" --dtype no-such-dtype
  one badtok  "crashed (3), model_file"           "$T" --tokenizer "$M/no-such-tokenizer"
  # a port taken after the launch (vigil's own preflight found it free): the server meets it itself
  B_I=$((B_I + 1)); local pport=$((PORT + 1000 * B_I)); serve "$T" "$pport"
  (
    R=portlate; up portlate 200 --detach -- "${CMD[@]}" $MEMFLAG $SMALLMEM &
    local u=$! i
    for i in $(seq 1 100); do [ -f "$VIGIL_STATE_DIR/runs/portlate/server.log" ] && break; sleep 0.1; done
    python3 -c 'import socket,sys,time; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(); time.sleep(180)' "$pport" &
    local sq=$!
    wait $u; kill $sq 2>/dev/null
    snap portlate; timeout -k 10 60 "$VIGIL" down portlate > "$OD/portlate/down.txt" 2>&1
    record portlate "crashed (3), launch/http, port_in_use"
  ) &
  wait; note "B: wave 2 done"
}

# f_proof URL DIR N: the speculation proof's raw material from a ready f (N completions with /metrics just before
# and after each; SGLang's /generate meta_info and server info; the log's speculation lines), then `vigil down f`
# from this shell while the foreground `vigil up f` waits.
f_proof() {
  local FU=$1 f=$2 n=$3 i
  for i in $(seq 1 "$n"); do
    metrics "$FU" "$f/metrics-$i-before.txt"
    curl -s -m 60 "$FU/v1/completions" -H 'content-type: application/json' \
      -d "{\"model\":\"$M/target\",\"prompt\":\"Hello, my name is\",\"max_tokens\":32,\"temperature\":0}" \
      -w '\nHTTP %{http_code}\n' > "$f/completion-$i.txt" 2>&1
    metrics "$FU" "$f/metrics-$i-after.txt"
  done
  if [ "$RS_STACK" = sglang ]; then
    curl -s -m 60 "$FU/generate" -H 'content-type: application/json' \
      -d '{"text":"Hello, my name is","sampling_params":{"max_new_tokens":32,"temperature":0}}' > "$f/generate.json" 2>&1
    curl -s -m 10 "$FU/get_server_info" > "$f/get_server_info.json" 2>&1
    curl -s -m 10 "$FU/server_info" > "$f/server_info.json" 2>&1
  fi
  sleep 11   # vLLM logs "SpecDecoding metrics" with its 10 s stats
  grep -aE "$SPEC_LOG_RE" "$VIGIL_STATE_DIR/runs/f/server.log" | tail -5 > "$f/spec-lines.txt"
  cp -a "$VIGIL_STATE_DIR/runs/f" "$f/run-before-down" 2>/dev/null
  timeout -k 10 120 "$VIGIL" down f > "$f/down-other-shell.txt" 2>&1; echo $? > "$f/down-other-shell.rc"
  note "f: vigil down from another shell exit $(cat "$f/down-other-shell.rc")"
}

# --- EF: engine death under watch, and speculation with a foreground up stopped from another shell
NEED[EF]=170
sc_EF() {
  local e=$OD/e f=$OD/f; mkdir -p "$e" "$f"
  local fport=$((PORT + 21000))
  # f: foreground vigil up (no --detach)
  serve "$M/target" "$fport"; local fcmd=("${CMD[@]}" $MEMFLAG $HALFMEM $(SPECS "$M/eagle3"))
  "$VIGIL" check --json -- "${fcmd[@]}" > "$f/check.json" 2>&1; echo $? > "$f/check.rc"
  ( up f 300 -- "${fcmd[@]}" ) &
  local fbg=$!
  # e: detached, the kit's own port
  ( up e 240 --detach -- "${SERVE[@]}" $MEMFLAG $HALFMEM ) &
  local ebg=$! i
  for i in $(seq 1 2400); do { ready e || ! kill -0 $ebg 2>/dev/null; } && { ready f || ! kill -0 $fbg 2>/dev/null; } && break; sleep 0.1; done
  wait $ebg
  if ready e; then
    "$VIGIL" timeline e > "$e/timeline.txt" 2>&1
    complete "$e/completion.txt" 16
    curl -s -m 60 "$URL/v1/chat/completions" -H 'content-type: application/json' \
      -d "{\"model\":\"$M/target\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":8}" \
      -w '\nHTTP %{http_code}\n' > "$e/chat.txt" 2>&1
    curl -s -m 10 "$URL/v1/models" > "$e/models.json" 2>&1
    metrics "$URL" "$e/metrics.txt"
    ( timeout -k 10 120 "$VIGIL" watch e --json --unhealthy-after 10s --generate-every 20s > "$e/watch.jsonl" 2> "$e/watch.stderr"
      echo $? > "$e/watch.rc" ) &
    local w=$!
    sleep 5; complete "$e/before-kill.txt"
    local ec; ec=$(engine_of e); [ -z "$ec" ] && ec=$(engine_pid)
    note "e: SIGKILL engine pid $ec ($(tr '\0' ' ' < /proc/$ec/cmdline 2>/dev/null | head -c 80))"
    kill -9 "$ec"
    sleep 3; complete "$e/after-kill.txt"
    wait $w; note "e: vigil watch exit $(cat "$e/watch.rc")"
  fi
  snap e; timeout -k 10 120 "$VIGIL" down e > "$e/down.txt" 2>&1
  record e "watch: unhealthy (6), engine_dead" "$e/watch.jsonl" "$e/watch.rc"
  # f: the proof's raw material, then vigil down from another shell
  local FU=http://127.0.0.1:$fport
  ready f && f_proof "$FU" "$f" 4
  wait $fbg
  snap f; down f
  record f "ready/degraded (spec), then down from another shell: foreground up exit 0"
}

# --- F: f alone, with the stack's default memory share (EF's half-and-half left SGLang's EAGLE-3 no KV cache)
NEED[F]=120
sc_F() {
  # the f half of EF: foreground up, proof material, vigil down from another shell
  local f=$OD/f; mkdir -p "$f"
  local fport=$((PORT + 21000))
  serve "$M/target" "$fport"; local fcmd=("${CMD[@]}" $(SPECS "$M/eagle3"))
  "$VIGIL" check --json -- "${fcmd[@]}" > "$f/check.json" 2>&1; echo $? > "$f/check.rc"
  ( up f 200 -- "${fcmd[@]}" ) &
  local fbg=$! i
  for i in $(seq 1 1800); do { ready f || ! kill -0 $fbg 2>/dev/null; } && break; sleep 0.1; done
  local FU=http://127.0.0.1:$fport
  ready f && f_proof "$FU" "$f" 2
  wait $fbg
  snap f; down f
  record f "ready/degraded (spec), then down from another shell: foreground up exit 0"
}
