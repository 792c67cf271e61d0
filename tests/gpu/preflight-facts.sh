# Issue #34 on the GPU machine: machine and file mistakes that `vigil check`/`vigil up` should refuse (exit 10)
# in under a second, each run again by the kit's `launch` with --no-check so the real server meets it (its log
# goes to the corpus), and the good starts that must still pass. A scenario file for the kit (RS_EXTRA), from
# the project root on the GPU machine:
#   RS_EXTRA=tests/gpu/preflight-facts.sh bash .rs-carry/kit/scenarios.sh p1 p2 p3 p4 p5 p6 p7 p8 p9
#   RS_EXTRA=tests/gpu/preflight-facts.sh RS_STACK=sglang bash .rs-carry-sgl/kit/scenarios.sh p1 p2 ...
# Each broken model is a copy (or links) of make_tiny.py's models under $W/pf: the kit's own models stay whole.
# What each server should do is in docs/preflight-facts.md (file:line per server); `record` writes expected vs got.
#   p1  a shard cut short by 1 MiB (safetensors MetadataIncompleteBuffer)
#   p2  a sharded copy whose index names a shard that is not there
#   p3  config.json says intermediate_size 2048 over 1536-wide weights (weight_loader asserts)
#   p4  the EAGLE-3 draft's config says draft_vocab_size 16384 over an 8192-row lm_head
#   p5  a LoRA adapter folder that does not exist
#   p6  a chat template path that does not exist
#   p7  TP 2 on this one-GPU node
#   p8  CUDA_VISIBLE_DEVICES naming a GPU this node does not have (1)
#   p9  CUDA_VISIBLE_DEVICES=0,0 (CUDA shows no GPU)
#   p10 config.json says num_hidden_layers 3 over 4 layers (vLLM refuses; SGLang warns and runs: expect ready)

NEED+=([p1]=60 [p2]=45 [p3]=60 [p4]=120 [p5]=120 [p6]=75 [p7]=45 [p8]=45 [p9]=45 [p10]=120)
PF=$W/pf

pf_copy() {  # pf_copy NAME: a folder of links to the tiny target's files (config.json a real copy)
  local d=$PF/$1; rm -rf "$d"; mkdir -p "$d"
  local f; for f in "$M/target"/*; do ln -s "$f" "$d/"; done
  rm "$d/config.json"; cp "$M/target/config.json" "$d/config.json"
  echo "$d"
}
pf_cfg() {  # pf_cfg FILE KEY JSON-VALUE
  python3 - "$1" "$2" "$3" <<'PY'
import json, sys
p, k, v = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
c = json.load(open(p)); c[k] = v; json.dump(c, open(p, "w"), indent=1)
PY
}
# pf_serve DIR: the kit's server command on another model folder
pf_serve() {
  local out=() a
  for a in "${SERVE[@]}"; do [ "$a" = "$M/target" ] && out+=("$1") || out+=("$a"); done
  printf '%s\n' "${out[@]}"
}
pf_run() {  # pf_run NAME LIMIT EXPECT -- server args after the kit's command (model: $PFM; env: $PF_ENV K=V)
  local name=$1 lim=$2 exp=$3; shift 4
  local flags=() envs=()
  [ -n "${PF_ENV:-}" ] && { flags+=(--env "$PF_ENV"); envs+=("$PF_ENV"); }
  local cmd; mapfile -t cmd < <(pf_serve "${PFM:-$M/target}")
  mkdir -p "$OD/$name"
  local t0=$(date +%s%N)
  env "${envs[@]}" "$VIGIL" check --json -- "${cmd[@]}" "$@" > "$OD/$name/check.json" 2>&1; echo $? > "$OD/$name/check.rc"
  echo $(( ($(date +%s%N) - t0) / 1000000 )) > "$OD/$name/check.ms"
  note "$name: vigil check exit $(cat "$OD/$name/check.rc") in $(cat "$OD/$name/check.ms") ms"
  launch "$name" "$lim" --detach "${flags[@]}" -- "${cmd[@]}" "$@"
  snap "$R"; down "$R"
  record "$R" "$exp"
}

sc_p1() {
  PFM=$(pf_copy trunc); rm "$PFM/model.safetensors"; cp "$M/target/model.safetensors" "$PFM/"
  truncate -s -1M "$PFM/model.safetensors"
  pf_run p1 120 "refused (10); nc: crashed, safetensors MetadataIncompleteBuffer" --; PFM=
}
sc_p2() {
  PFM=$(pf_copy shard)
  python3 - "$PFM" <<'PY'
import json, os, sys
d = sys.argv[1]
os.rename(os.path.join(d, "model.safetensors"), os.path.join(d, "model-00001-of-00002.safetensors"))
from struct import unpack
with open(os.path.join(d, "model-00001-of-00002.safetensors"), "rb") as f:
    n = unpack("<Q", f.read(8))[0]; names = [k for k in json.loads(f.read(n)) if k != "__metadata__"]
wm = {k: "model-00001-of-00002.safetensors" for k in names}
wm["lm_head.weight"] = "model-00002-of-00002.safetensors"
json.dump({"metadata": {}, "weight_map": wm}, open(os.path.join(d, "model.safetensors.index.json"), "w"))
PY
  pf_run p2 90 "refused (10); nc: crashed, shard missing" --; PFM=
}
sc_p3() {
  PFM=$(pf_copy ffn); pf_cfg "$PFM/config.json" intermediate_size 2048
  pf_run p3 120 "refused (10); nc: crashed, weight_loader assert" --; PFM=
}
sc_p4() {
  local e=$PF/eagle3-bad; rm -rf "$e"; mkdir -p "$e"; ln -s "$M/eagle3/model.safetensors" "$e/"
  cp "$M/eagle3/config.json" "$e/"; pf_cfg "$e/config.json" draft_vocab_size 16384
  local spec=("${SPEC[@]}") i
  for i in "${!spec[@]}"; do spec[$i]=${spec[$i]//$M\/eagle3/$e}; done
  pf_run p4 240 "refused (10); nc: crashed after the target loaded, draft shape" -- "${spec[@]}"
}
sc_p5() {
  if [ "$RS_STACK" = sglang ]; then
    pf_run p5 200 "refused (10); nc: crashed, adapter_config.json" -- --lora-paths "a=$PF/no-such-adapter"
  else
    pf_run p5 200 "refused (10); nc: crashed in init_static_loras" -- --enable-lora --lora-modules "a=$PF/no-such-adapter"
  fi
}
sc_p6() { pf_run p6 150 "refused (10); nc: crashed, chat template" -- --chat-template "$PF/no-such-template.jinja"; }
sc_p7() {
  if [ "$RS_STACK" = sglang ]; then pf_run p7 90 "refused (10); nc: crashed, set_device" -- --tp 2
  else pf_run p7 90 "refused (10); nc: crashed, World size (2) is larger" -- --tensor-parallel-size 2; fi
}
sc_p8() {
  local exp="refused (10); nc: crashed, no GPU"; [ "$RS_STACK" = vllm ] && exp="ERROR? (up launches, TP 1 not cited); crashed, no GPU"
  PF_ENV=CUDA_VISIBLE_DEVICES=1 pf_run p8 90 "$exp" --
}
sc_p9() {
  local exp="refused (10); nc: crashed, no GPU"; [ "$RS_STACK" = vllm ] && exp="ERROR? (up launches, TP 1 not cited); crashed, no GPU"
  PF_ENV=CUDA_VISIBLE_DEVICES=0,0 pf_run p9 90 "$exp" --
}
sc_p10() {
  PFM=$(pf_copy layers); pf_cfg "$PFM/config.json" num_hidden_layers 3
  local exp="refused (10); nc: crashed, There is no module or parameter named"
  [ "$RS_STACK" = sglang ] && exp="ERROR? then ready (SGLang warns and runs)"
  pf_run p10 200 "$exp" --; PFM=
}
