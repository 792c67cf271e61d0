# `vigil up --repair` (issue #35) on the GPU machine with the real vLLM 0.26.0 / SGLang 0.5.17: scenarios for
# shared/gpu/realserve/scenarios.sh (its README, "Adding a scenario"). Not yet run: the run this file was written in
# had no GPU. Run (vLLM; SGLang with RS_STACK=sglang and .rs-carry-sgl):
#   RS_EXTRA=tests/gpu/realserve-repair.sh bash .rs-carry/kit/scenarios.sh r1 r2 r3 r4
# Each records what vigil said; the JSON's last line is the `repairs` event (docs/repair.md), the history and the
# restart of the repaired command are kept in the scenario's folder.

# r1: the memory share leaves nothing for the KV cache (LOWMEM): --repair raises it from the server's own numbers
NEED[r1]=240
sc_r1() {
  launch r1 230 --detach --repair=3 -- "${SERVE[@]}" "${LOWMEM[@]}"
  snap "$R"
  "$VIGIL" history "$R" > "$OD/$R/history.txt" 2>&1
  "$VIGIL" history "$R" --json > "$OD/$R/history.jsonl" 2>&1
  if ready "$R"; then
    complete "$OD/$R/completion.txt"
    # the repaired command is what restart replays
    timeout -k 10 200 "$VIGIL" restart "$R" --json > "$OD/$R/restart.jsonl" 2> "$OD/$R/restart.stderr"; echo $? > "$OD/$R/restart.rc"
  fi
  down "$R"
  record "$R" "ready (0) after repairs of the memory share"
}

# r2: a context above the model's (LONG): a model config error, never repaired, even under --repair=any
NEED[r2]=60
sc_r2() {
  launch r2 50 --detach --repair=any -- "${SERVE[@]}" "${LONG[@]}"
  snap "$R"; down "$R"
  record "$R" "crashed (3) or refused, no_repair in the last line"
}

# r3: an earlier attempt of the same run still holds the GPU and the port (its keeper killed): stopped, relaunched
NEED[r3]=260
sc_r3() {
  local d=$OD/r3; mkdir -p "$d"
  rm -rf "${VIGIL_STATE_DIR:?}/runs/r3"
  timeout -k 20 200 "$VIGIL" up --name r3 --detach --json "${ENVA[@]}" -- "${SERVE[@]}" > "$d/first.jsonl" 2> "$d/first.stderr"
  local k; k=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["keeper_pid"])' "$VIGIL_STATE_DIR/runs/r3/state.json")
  note "r3: killing keeper $k; the server lives on holding the GPU"
  kill -9 "$k"; sleep 1
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader > "$d/gpu-before.csv" 2>&1
  R=r3
  timeout -k 20 230 "$VIGIL" up --name r3 --detach --json --repair "${ENVA[@]}" -- "${SERVE[@]}" > "$d/vigil.jsonl" 2> "$d/vigil.stderr"
  echo $? > "$d/vigil.rc"
  snap r3; down r3
  record r3 "ready (0) after stopping the earlier attempt"
}

# r4: another process holds the GPU (the kit's c2 hog, 6 GiB left): no repair, the holder named by vLLM's message
NEED[r4]=200
sc_r4() {
  local d=$OD/r4; mkdir -p "$d"
  rm -f "$W/hog4.ready"
  python3 - "$W/hog4.ready" > "$d/hog.txt" 2>&1 <<'PY' &
import sys, time, torch
free, total = torch.cuda.mem_get_info()
x = torch.empty(free - 6 * 2**30, dtype=torch.uint8, device="cuda")
open(sys.argv[1], "w").write("1")
time.sleep(600)
PY
  local hog=$! i
  for i in $(seq 1 90); do [ -f "$W/hog4.ready" ] && break; kill -0 "$hog" 2>/dev/null || break; sleep 1; done
  launch r4 150 --detach --repair=any -- "${SERVE[@]}"
  snap "$R"
  kill "$hog" 2>/dev/null; wait "$hog" 2>/dev/null
  down "$R"
  record "$R" "vLLM: crashed (3), no repair (foreign GPU holder); SGLang may start in 6 GiB"
}
