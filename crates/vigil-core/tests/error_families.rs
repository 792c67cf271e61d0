//! Causes from what an error is (issue #33): each case is the end of a traceback, rendered from the format
//! string or the exception the servers' (or their frameworks') code raises, cited in the case. None of these
//! texts is in the corpus; they test that a family maps to its cause whatever words the server puts around
//! it, and that the hint names the thing to fix (the path, the variable) where the line names it.
//!
//! Every text is fed offline without naming the server, and must end `crashed` with the case's cause.

use vigil_core::{Cause, Offline, Profiles, Verdict};

struct Case {
    /// Where the text comes from.
    source: &'static str,
    text: &'static str,
    cause: Cause,
    /// A piece of the hint (the path or variable it must name).
    hint: &'static str,
}

const CASES: &[Case] = &[
    Case {
        source: "vllm 0.26.0 model_executor/model_loader/weight_utils.py:1242 default_weight_loader",
        text: r#"(EngineCore_DP0 pid=812) ERROR 12-02 10:00:01 [core.py:1330] EngineCore failed to start.
(EngineCore_DP0 pid=812) ERROR 12-02 10:00:01 [core.py:1330] Traceback (most recent call last):
(EngineCore_DP0 pid=812) ERROR 12-02 10:00:01 [core.py:1330]   File "/usr/lib/python3.12/site-packages/vllm/model_executor/model_loader/weight_utils.py", line 1242, in default_weight_loader
(EngineCore_DP0 pid=812) ERROR 12-02 10:00:01 [core.py:1330]     assert param.size() == loaded_weight.size(), (
(EngineCore_DP0 pid=812) ERROR 12-02 10:00:01 [core.py:1330] AssertionError: Attempted to load weight (torch.Size([4096, 2048])) into parameter (torch.Size([4096, 4096]))"#,
        cause: Cause::ModelFile,
        hint: "config.json",
    },
    Case {
        source: "vllm 0.26.0 model_executor/layers/linear.py:549 (a bare assert: Python prints its source line)",
        text: r#"Traceback (most recent call last):
  File "/opt/venv/lib/python3.12/site-packages/vllm/model_executor/layers/linear.py", line 549, in weight_loader
    assert param_data.shape == loaded_weight.shape
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
AssertionError"#,
        cause: Cause::ModelFile,
        hint: "does not match its config",
    },
    Case {
        source: "sglang 0.5.17 srt/layers/linear.py:438 ColumnParallelLinear.weight_loader",
        text: r#"[2026-12-02 10:00:01 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/layers/linear.py", line 438, in weight_loader
    assert (
AssertionError: param_data.shape=torch.Size([2048, 1024]) != loaded_weight.shape=torch.Size([4096, 1024])"#,
        cause: Cause::ModelFile,
        hint: "config.json",
    },
    Case {
        source: "PyTorch torch/nn/modules/module.py load_state_dict",
        text: r#"Traceback (most recent call last):
  File "/app/server.py", line 10, in <module>
    model.load_state_dict(sd)
RuntimeError: Error(s) in loading state_dict for Linear:
	size mismatch for weight: copying a param with shape torch.Size([8, 4]) from checkpoint, the shape in current model is torch.Size([8, 8])."#,
        cause: Cause::ModelFile,
        hint: "checkpoint",
    },
    Case {
        source: "vllm 0.26.0 models/utils.py:390 AutoWeightsLoader",
        text: r#"Traceback (most recent call last):
  File "/usr/lib/python3.12/site-packages/vllm/model_executor/models/utils.py", line 390, in _load_module
    raise ValueError(msg)
ValueError: There is no module or parameter named 'model.layers.40' in LlamaForCausalLM. The available parameters belonging to model.layers (ModuleList) are: {}"#,
        cause: Cause::ModelFile,
        hint: "config.json",
    },
    Case {
        source: "vllm 0.26.0 exceptions.py:62 LoRAAdapterNotFoundError, re-raised by entrypoints/openai/models/serving.py:139",
        text: r#"(APIServer pid=100) Traceback (most recent call last):
(APIServer pid=100)   File "/usr/lib/python3.12/site-packages/vllm/entrypoints/openai/models/serving.py", line 139, in init_static_loras
(APIServer pid=100)     raise ValueError(load_result.error.message)
(APIServer pid=100) ValueError: Loading lora sql failed: No adapter found for /data/loras/sql-lora"#,
        cause: Cause::ModelFile,
        hint: "/data/loras/sql-lora",
    },
    Case {
        source: "sglang 0.5.17 srt/lora/lora_config.py:84 (open adapter_config.json)",
        text: r#"[2026-12-02 10:00:01] Scheduler hit an exception: Traceback (most recent call last):
  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/lora/lora_config.py", line 84, in get_lora_config
    with open(os.path.join(weights_dir, config_name), "r") as f:
FileNotFoundError: [Errno 2] No such file or directory: '/data/loras/empty/adapter_config.json'"#,
        cause: Cause::ModelFile,
        hint: "/data/loras/empty/adapter_config.json",
    },
    Case {
        source: "CPython FileNotFoundError from a model folder's open() (safetensors index, transformers)",
        text: r#"Traceback (most recent call last):
  File "/usr/lib/python3.12/site-packages/safetensors/torch.py", line 313, in load_file
    with safe_open(filename, framework="pt", device=device) as f:
FileNotFoundError: [Errno 2] No such file or directory: '/models/llama/model-00002-of-00004.safetensors'"#,
        cause: Cause::ModelFile,
        hint: "/models/llama/model-00002-of-00004.safetensors",
    },
    Case {
        source: "CPython FileNotFoundError for a --chat-template file opened by a server",
        text: r#"Traceback (most recent call last):
  File "/app/serve.py", line 20, in load_template
    with open(path) as f:
FileNotFoundError: [Errno 2] No such file or directory: '/templates/chatml.jinja'"#,
        cause: Cause::Config,
        hint: "/templates/chatml.jinja",
    },
    Case {
        source: "CPython FileNotFoundError for any other path the command named",
        text: r#"Traceback (most recent call last):
  File "/app/serve.py", line 30, in main
    cfg = json.load(open(args.speculative_config))
FileNotFoundError: [Errno 2] No such file or directory: '/etc/spec/eagle.json'"#,
        cause: Cause::Config,
        hint: "/etc/spec/eagle.json",
    },
    Case {
        source: "glibc dlopen error through ctypes (OSError)",
        text: r#"Traceback (most recent call last):
  File "/usr/lib/python3.12/ctypes/__init__.py", line 379, in __init__
    self._handle = _dlopen(self._name, mode)
OSError: libcudart.so.13: cannot open shared object file: No such file or directory"#,
        cause: Cause::Config,
        hint: "libcudart.so.13",
    },
    Case {
        source: "CPython PermissionError (EACCES) opening a cache folder",
        text: r#"Traceback (most recent call last):
  File "/usr/lib/python3.12/os.py", line 225, in makedirs
    mkdir(name, mode)
PermissionError: [Errno 13] Permission denied: '/root/.cache/huggingface'"#,
        cause: Cause::Config,
        hint: "/root/.cache/huggingface",
    },
    Case {
        source: "CPython OSError ENOSPC writing the compile cache",
        text: r#"Traceback (most recent call last):
  File "/usr/lib/python3.12/site-packages/torch/_inductor/codecache.py", line 400, in write_atomic
    f.write(content)
OSError: [Errno 28] No space left on device"#,
        cause: Cause::Config,
        hint: "full disk",
    },
    Case {
        source: "CPython OSError errno 12 (ENOMEM) at fork",
        text: r#"Traceback (most recent call last):
  File "/usr/lib/python3.12/multiprocessing/popen_fork.py", line 66, in _launch
    self.pid = os.fork()
OSError: [Errno 12] Cannot allocate memory"#,
        cause: Cause::HostOom,
        hint: "host memory",
    },
    Case {
        source: "PyTorch c10/core/impl/alloc_cpu.cpp (DefaultCPUAllocator)",
        text: r#"Traceback (most recent call last):
  File "/usr/lib/python3.12/site-packages/vllm/model_executor/model_loader/weight_utils.py", line 700, in safetensors_weights_iterator
    param = f.get_tensor(name)
RuntimeError: [enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough memory: you tried to allocate 939524096 bytes."#,
        cause: Cause::HostOom,
        hint: "host memory",
    },
    Case {
        source: "CPython MemoryError",
        text: r#"Traceback (most recent call last):
  File "/app/x.py", line 3, in <module>
    buf = bytearray(1 << 40)
MemoryError"#,
        cause: Cause::HostOom,
        hint: "host memory",
    },
    Case {
        source: "PyTorch c10/cuda/CUDAFunctions.cpp (no visible device)",
        text: r#"Traceback (most recent call last):
  File "/usr/lib/python3.12/site-packages/torch/cuda/__init__.py", line 372, in _lazy_init
    torch._C._cuda_init()
RuntimeError: No CUDA GPUs are available"#,
        cause: Cause::Config,
        hint: "CUDA_VISIBLE_DEVICES",
    },
    Case {
        source: "pynvml NVMLError_InvalidArgument from nvmlDeviceGetHandleByIndex (vllm 0.26.0 platforms/cuda.py:772)",
        text: r#"(APIServer pid=7) Traceback (most recent call last):
(APIServer pid=7)   File "/usr/lib/python3.12/site-packages/vllm/platforms/cuda.py", line 772, in get_device_total_memory
(APIServer pid=7)     handle = pynvml.nvmlDeviceGetHandleByIndex(physical_device_id)
(APIServer pid=7) pynvml.NVMLError_InvalidArgument: Invalid Argument"#,
        cause: Cause::Config,
        hint: "CUDA_VISIBLE_DEVICES",
    },
    Case {
        source: "sglang 0.5.17 srt/utils/common.py:916",
        text: r#"Traceback (most recent call last):
  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/utils/common.py", line 916, in get_device
    raise RuntimeError(
RuntimeError: No accelerator (CUDA, XPU, HPU, NPU, MUSA, MPS) or platform plugin is available."#,
        cause: Cause::Config,
        hint: "nvidia-smi",
    },
    Case {
        source: "sglang 0.5.17 srt/server_args.py (ServerArgs.__post_init__ -> check_server_args raises)",
        text: r#"Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/usr/local/lib/python3.12/dist-packages/sglang/launch_server.py", line 30, in <module>
    server_args = prepare_server_args(sys.argv[1:])
  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/server_args.py", line 5210, in __post_init__
    self.check_server_args()
  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/server_args.py", line 5600, in check_server_args
    assert self.dp_size * self.tp_size <= 8
AssertionError"#,
        cause: Cause::Config,
        hint: "configuration check",
    },
    Case {
        source: "pydantic_core ValidationError of a config class (a server other than vLLM's own rule)",
        text: r#"Traceback (most recent call last):
  File "/app/serve.py", line 12, in <module>
    cfg = Settings(**args)
pydantic_core._pydantic_core.ValidationError: 1 validation error for Settings
max_batch
  Input should be a valid integer [type=int_parsing, input_value='x', input_type=str]"#,
        cause: Cause::Config,
        hint: "Value error",
    },
    Case {
        source: "Rust std::io::Error for ENOENT (TGI launcher/router)",
        text: r#"Error: Os { code: 2, kind: NotFound, message: "No such file or directory" }
thread 'main' panicked at router/src/main.rs:300:10:
tokenizer: No such file or directory (os error 2)"#,
        cause: Cause::Config,
        hint: "does not exist",
    },
];

#[test]
fn error_families_map_to_their_causes() {
    let profiles = Profiles::builtin();
    let mut wrong = Vec::new();
    for c in CASES {
        let mut o = Offline::new(&profiles, None);
        for line in c.text.lines() {
            o.push(line, &mut |_| {});
        }
        let r = o.finish(&mut |_| {});
        let hint = r.hint.clone().unwrap_or_default();
        if r.verdict != Verdict::Crashed || r.cause != Some(c.cause) || !hint.contains(c.hint) {
            wrong.push(format!(
                "{}: got {} {:?}, hint {hint:?}; want crashed {} with {:?} in the hint",
                c.source,
                r.verdict.as_str(),
                r.cause.map(|c| c.as_str()),
                c.cause.as_str(),
                c.hint
            ));
        }
    }
    assert!(wrong.is_empty(), "error families read wrong:\n{}", wrong.join("\n"));
}
