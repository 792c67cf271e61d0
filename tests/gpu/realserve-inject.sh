# Scenario I for ../shared/gpu/realserve/scenarios.sh (issue #24): the frame table on the real servers' own
# tracebacks. Sourced through RS_EXTRA (after tests/gpu/realserve-extra.sh, whose serve() it uses):
#   RS_EXTRA="tests/gpu/realserve-extra.sh tests/gpu/realserve-inject.sh" bash .rs-carry/kit/scenarios.sh I
#   RS_EXTRA="tests/gpu/realserve-extra.sh tests/gpu/realserve-inject.sh" RS_STACK=sglang bash .rs-carry-sgl/kit/scenarios.sh I
# Each start runs the server directly (no vigil) with tests/gpu/inject/sitecustomize.py on PYTHONPATH and
# VIGIL_INJECT naming a function of the server's own code (a function the frame table places in a phase, deeper
# than that phase's entry where one exists): its N-th call raises at its first line, so the log holds the
# server's real traceback through the real call chain. The phase is known from where the fault was put, and
# the whole log comes back in $OUT (realserve-<stack>-I.tgz, I/<name>.log) to be scored here by `vigil diagnose`.
# All starts run at once, each on its own port with a small memory share; the serving ones get requests once
# the server answers.
NEED[I]=300
inj() {  # inj NAME PHASE TARGET REQUESTS [server flags]      (RS_I="a b": only those names)
  local name=$1 phase=$2 target=$3 reqs=$4; shift 4
  [ -n "${RS_I:-}" ] && [[ " $RS_I " != *" $name "* ]] && return 0
  B_I=$((B_I + 1)); local port=$((PORT + 100 + B_I)); serve "$M/target" "$port"
  mkdir -p "$OD/I"
  echo "$name	$phase	$target	$reqs	${CMD[*]} $*" >> "$OD/I/INJECTED.tsv"
  (
    PYTHONPATH="$ROOT/tests/gpu/inject${PYTHONPATH:+:$PYTHONPATH}" VIGIL_INJECT="$target" \
      setsid timeout -k 10 240 "${CMD[@]}" $MEMFLAG $SMALLMEM "$@" > "$OD/I/$name.log" 2>&1 &
    local pid=$! i
    if [ "$reqs" -gt 0 ]; then
      for i in $(seq 1 200); do
        kill -0 $pid 2>/dev/null || break
        curl -s -m 2 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/v1/models" 2>/dev/null | grep -q 200 && break
        sleep 1
      done
      for i in $(seq 1 "$reqs"); do
        curl -s -m 30 "http://127.0.0.1:$port/v1/completions" -H 'content-type: application/json' \
          -d "{\"model\":\"$M/target\",\"prompt\":\"Hello, my name is\",\"max_tokens\":8}" \
          -w '\nHTTP %{http_code}\n' >> "$OD/I/$name.requests.txt" 2>&1
      done
      sleep 15   # the engine's death and the API server's answer to it reach the log
      kill -TERM -- -$pid 2>/dev/null; sleep 5; kill -KILL -- -$pid 2>/dev/null
    fi
    wait $pid; echo "exit $?" >> "$OD/I/$name.log.rc"
    note "I/$name: done"
  ) &
}
sc_I() {
  B_I=0
  if [ "$RS_STACK" = sglang ]; then
    local L=sglang.srt.model_loader.loader:DefaultModelLoader._prepare_weights
    inj dist      dist_init   sglang.srt.distributed.parallel_state:GroupCoordinator.__init__ 0
    inj weights   weights     "$L@1" 0
    inj draftw    draft_weights "$L@2" 0 $(SPECS "$M/eagle3")
    inj kv        kv_cache    sglang.srt.mem_cache.memory_pool:MHATokenToKVPool._create_buffers 0
    inj graphs    cuda_graphs sglang.srt.model_executor.runner.decode_cuda_graph_runner:DecodeCudaGraphRunner.capture_one_shape 0
    inj draftg    draft_cuda_graphs sglang.srt.speculative.eagle_draft_cuda_graph_runner:EAGLEDraftCudaGraphRunner.capture_one_shape 0 $(SPECS "$M/eagle3")
    inj warm      warmup      sglang.srt.managers.scheduler:Scheduler.run_batch@1 0
    inj serve     serving     sglang.srt.managers.scheduler:Scheduler.run_batch@60 10
  else
    local L=vllm.model_executor.model_loader.default_loader:DefaultModelLoader._prepare_weights
    inj dist      dist_init   vllm.distributed.parallel_state:GroupCoordinator.__init__ 0
    inj weights   weights     "$L@1" 0
    inj draftw    draft_weights "$L@2" 0 $(SPECS "$M/eagle3")
    # vLLM 0.26 runs the V2 model runner (v1/worker/gpu/model_runner.py): the V1 runner's functions are not called
    inj kv        kv_cache    vllm.v1.worker.gpu.model_runner:GPUModelRunner.initialize_kv_cache 0
    inj compile   compile     vllm.compilation.backends:CompilerManager.compile 0
    inj graphs    cuda_graphs vllm.v1.worker.gpu.cudagraph_utils:ModelCudaGraphManager.capture 0
    inj serve     serving     vllm.v1.worker.gpu.model_runner:GPUModelRunner.execute_model@1 3
  fi
  wait; note "I: all done"
  record I "the injected phase for each log (I/INJECTED.tsv)" /dev/null /dev/null
}
