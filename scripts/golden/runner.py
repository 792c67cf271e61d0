"""Runs INSIDE a server venv (see refresh.py). Calls the server's own config code on every case and prints
one JSON row per line. `runner.py JOB.json` spawns itself once per environment variant
(`runner.py JOB.json VARIANT`) so that every env value is read by a fresh process, as at a real launch.

Nothing here decides acceptance: each row is what the server's function returned or raised.
"""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import traceback
import warnings

JOB = json.load(open(sys.argv[1]))
SERVER = JOB["server"]
ENV_KEY = "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN" if SERVER == "sglang" else "VLLM_ALLOW_LONG_MAX_MODEL_LEN"
# Variant 0: env unset (derivation, parsing, over-length, drafts, TP). Others: env set to the value.
ENV_VALUES = [None, "1", "true", "True", "yes", "y", "0"]

# EAGLE-3 (target, draft) pairs of the brief.
DRAFT_PAIRS = [
    ("kimi-k2-instruct-0905", "kimi-k25-eagle3"),
    ("kimi-k2-instruct-0905", "x-kimi-eagle3-131072"),
    ("kimi-k2-instruct-0905", "x-eagle3-2layers"),
    ("llama31-8b", "eagle3-llama31-8b-yuhuili"),
    ("llama31-8b", "x-eagle3-llamaarch"),
    ("repo:llama-3.1-8b-instruct", "repo:eagle3-llama3.1-instruct-8b"),
    ("repo:deepseek-v3", "repo:kimi-k25-eagle3-draft"),
    ("deepseek-v3", "sf-deepseek-v3-eagle3"),
    ("gemma3-27b-it", "sf-gemma3-27b-eagle3"),
    ("gemma3-27b-it", "x-gemma3-eagle3-131072"),
    ("gpt-oss-120b", "sf-gpt-oss-120b-eagle3"),
    ("llama33-70b", "sf-llama3-70b-eagle3"),
    ("llama31-8b", "sf-llama3-8b-eagle3"),
    ("qwen3-235b-2507", "sf-qwen3-235b-eagle3"),
    ("qwen3-8b", "sf-qwen3-8b-eagle3"),
    ("qwen3-8b-yarn", "sf-qwen3-8b-eagle3"),
]
HUMAN = {"sglang": ["32k", "32K", "32768"], "vllm": ["32k", "32K", "auto", "-1", "32768"]}
TP_SIZES = [2, 3, 4, 6, 8, 16]

# The attention layer each architecture's decoder layer builds (read from the decoder layers' `__init__`:
# `self.self_attn = X(...)`, or the class the layer picks for this config), per server: (module under the
# server's models package, class). `#attn#N` rows construct it at TP size N.
ATTN_CLASSES = {
    "sglang": {
        "LlamaForCausalLM": ("llama", "LlamaAttention"),
        "MistralForCausalLM": ("llama", "LlamaAttention"),  # mistral.py: class MistralForCausalLM(LlamaForCausalLM)
        "Phi3ForCausalLM": ("llama", "LlamaAttention"),  # registered as a LlamaForCausalLM subclass (llama.py)
        "LlamaForCausalLMEagle3": ("llama", "LlamaAttention"),  # llama_eagle3.py LlamaDecoderLayer(LlamaDecoderLayer)
        "Qwen2ForCausalLM": ("qwen2", "Qwen2Attention"),
        "InternVLChatModel": ("qwen2", "Qwen2Attention"),  # the configs' llm_config is Qwen2ForCausalLM
        "Qwen3ForCausalLM": ("qwen3", "Qwen3Attention"),
        "Qwen3MoeForCausalLM": ("qwen3_moe", "Qwen3MoeAttention"),
        "MixtralForCausalLM": ("mixtral", "MixtralAttention"),
        "Gemma3ForCausalLM": ("gemma3_causal", "Gemma3Attention"),
        "Gemma3ForConditionalGeneration": ("gemma3_causal", "Gemma3Attention"),  # its language_model
        "CohereForCausalLM": ("commandr", "CohereAttention"),
        "Glm4MoeForCausalLM": ("glm4_moe", "Glm4MoeAttention"),
        "MiniMaxM2ForCausalLM": ("minimax_m2", "MiniMaxM2Attention"),
        "GptOssForCausalLM": ("gpt_oss", "GptOssAttention"),
        "DeepseekV3ForCausalLM": ("deepseek_v2", "DeepseekV2AttentionMLA"),
    },
    "vllm": {
        "LlamaForCausalLM": ("llama", "LlamaAttention"),
        "MistralForCausalLM": ("mistral", "MistralAttention"),  # MistralDecoderLayer(attn_layer_type=MistralAttention)
        "Phi3ForCausalLM": ("llama", "LlamaAttention"),  # phi3.py: class Phi3ForCausalLM(LlamaForCausalLM)
        "LlamaForCausalLMEagle3": ("llama", "LlamaAttention"),  # llama_eagle3.py LlamaDecoderLayer(LlamaDecoderLayer)
        "Qwen2ForCausalLM": ("qwen2", "Qwen2Attention"),
        "InternVLChatModel": ("qwen2", "Qwen2Attention"),  # the configs' llm_config is Qwen2ForCausalLM
        "Qwen3ForCausalLM": ("qwen3", "Qwen3Attention"),
        "Qwen3MoeForCausalLM": ("qwen3_moe", "Qwen3MoeAttention"),
        "MixtralForCausalLM": ("mixtral", "MixtralAttention"),
        "Gemma3ForCausalLM": ("gemma3", "Gemma3Attention"),
        "Gemma3ForConditionalGeneration": ("gemma3", "Gemma3Attention"),  # gemma3_mm.py builds Gemma3ForCausalLM
        "CohereForCausalLM": ("commandr", "CohereAttention"),
        "Glm4MoeForCausalLM": ("glm4_moe", "Glm4MoeAttention"),
        "MiniMaxM2ForCausalLM": ("minimax_m2", "MiniMaxM2Attention"),
        "GptOssForCausalLM": ("gpt_oss", "OAIAttention"),
        "DeepseekV3ForCausalLM": ("deepseek_v2", "DeepseekV2MLAAttention"),
    },
}
# Built by the attention layers but holding no TP rule: the rotary embedding computes its cos/sin cache with
# tensors, which the torch stub cannot do, and vLLM's attention-backend selector asks the GPU platform, which
# is not there. Replaced by a stub while a layer is built.
def _not_built(*a, **k):
    import stubs

    return stubs._make("not built")()


def _attn_backend(*a, **k):
    """A backend for vLLM's Attention layer to hold: named FLASH_ATTN (the layer looks its name up in the
    backend registry), without ALiBi; every other attribute a stub."""
    import stubs

    b = stubs._make("attention backend")
    type.__setattr__(b, "get_name", staticmethod(lambda: "FLASH_ATTN"))
    type.__setattr__(b, "supports_alibi_sqrt", staticmethod(lambda: False))
    return b


# Modules the layers import inside their constructors, holding a NOT_BUILT function: imported first, so that the
# stand-in is in place from the first row on.
LAZY_MODULES = {"vllm": ("vllm.model_executor.layers.minimax_rms_norm.lamport_workspace",)}
NOT_BUILT = {"get_rope": _not_built, "get_rope_wrapper": _not_built, "get_attn_backend": _attn_backend,
             # vLLM's MiniMax QK-norm all-reduce buffer (GPU memory over the TP group).
             "get_allreduce_workspace": _not_built}


class Capture(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.msgs = []

    def emit(self, record):
        try:
            self.msgs.append(record.getMessage())
        except Exception:
            pass


CAP = Capture()


def captured(fn):
    """Run fn; return (value, exception, warnings logged)."""
    CAP.msgs = []
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        try:
            v, e = fn(), None
        except SystemExit as ex:  # argparse usage error
            v, e = None, ex
        except Exception as ex:
            v, e = None, ex
    msgs = CAP.msgs + [str(x.message) for x in w]
    return v, e, msgs


def relevant(msgs):
    msgs = [m.replace(JOB["models_root"], "<models>") for m in msgs]
    keys = ("context", "max_model_len", "max_position", "max model len", "model_max_length", "draft")
    seen = []
    for m in msgs:
        if any(k in m.lower() for k in keys) and m not in seen:
            seen.append(m)
    return " | ".join(seen)


def errtext(e):
    if isinstance(e, SystemExit):
        lines = [l for l in STDERR.getvalue().splitlines() if "error:" in l]
        return f"SystemExit({e.code}): {lines[-1].strip() if lines else ''}"
    s = str(e).replace(JOB["models_root"], "<models>")
    # pydantic validation errors carry a docs URL line that changes across versions of pydantic.
    s = "\n".join(l for l in s.splitlines() if "errors.pydantic.dev" not in l)
    return f"{type(e).__name__}: {s}"


STDERR = io.StringIO()

# Failures caused by the import stubs, not by the server's checks: reported as harness errors, never as
# a server refusal.
ARTIFACTS = ("vigil stub", "vigil_stub", "is already registered", "Inplace overload", "_StubMeta",
             "No module named", "not enough values to unpack", "metaclass conflict", "'function' object has no attribute")


def result_of_error(e):
    t = errtext(e)
    if any(a in t for a in ARTIFACTS):
        return {"harness_error": t}
    return {"accepted": False, "message": t}


def result_of_build_error(e):
    """A layer's constructor raised: a refusal when an `assert` or a `ValueError` of the server's own code
    raised it (the row names the file:line and the line), otherwise a harness error (a stub the path needed)."""
    import linecache

    if isinstance(e, ImportFailed):
        return {"harness_error": _no_paths(f"import: {e}")}
    if any(a in str(e) for a in ARTIFACTS):
        return {"harness_error": _no_paths(f"{type(e).__name__}: {e}")}
    tb = traceback.extract_tb(e.__traceback__)
    own = [f for f in tb if f"/site-packages/{SERVER}/" in f.filename]
    # Model and layer code only: a ValueError from the runtime plumbing (SGLang's "config namespace 'exec' not
    # published") is the harness's missing set-up, not a check.
    checks = ("/models/", "/layers/", "/distributed/")
    if (isinstance(e, (AssertionError, ValueError, ZeroDivisionError)) and own and own[-1] is tb[-1]
            and any(c in own[-1].filename.split("/site-packages/", 1)[1] for c in checks)):
        f = own[-1]
        where = f.filename.split("/site-packages/", 1)[1]
        line = (f.line or linecache.getline(f.filename, f.lineno)).strip()
        msg = str(e).replace(JOB["models_root"], "<models>")
        return {"accepted": False, "message": f"{type(e).__name__} at {where}:{f.lineno}: {line}" + (f" ({msg})" if msg else "")}
    return {"harness_error": _no_paths(f"{type(e).__name__}: {e} at {tb[-1].filename}:{tb[-1].lineno}")}


def _no_paths(t):
    """A message without the machine's paths (venv site-packages, this checkout): the table is byte-identical
    wherever it is refreshed."""
    import re

    t = re.sub(r"/[^\s'\"()]*/site-packages/", "", t)
    return re.sub(r"/[^\s'\"()]*/scripts/golden/", "scripts/golden/", t)


class FakeParallel:
    """The TP topology a launch with `--tp N` publishes (no DP attention, no PP): what SGLang's
    `get_parallel()` answers for the sizes and ranks the attention layers read."""

    def __init__(self, n, real):
        self.__dict__.update(tp_size=n, tp_rank=0, attn_tp_size=n, attn_tp_rank=0, attn_dp_size=1, attn_dp_rank=0,
                             pp_size=1, pp_rank=0, moe_tp_size=n, moe_ep_size=1, attn_cp_size=1, attn_cp_rank=0,
                             enable_dp_lm_head=False, _real=real)

    def __getattr__(self, k):
        # Other names (flags such as dcp_enabled) from the published server args, as the real context answers;
        # ranks and groups of process groups that do not exist here: rank 0 of a group of one, the TP groups
        # of N ranks.
        try:
            return getattr(self._real, k)
        except Exception:
            if k.endswith("_size"):
                return 1
            if k.endswith("_rank"):
                return 0
            if k.endswith("_group"):
                return FakeGroup(self.tp_size if k in ("tp_group", "attn_tp_group") else 1)
            raise AttributeError(k) from None


class FakeGroup:
    """A TP group of N ranks seen from rank 0; its process groups (`cpu_group`, `device_group`) are stubs."""

    def __init__(self, n):
        self.world_size, self.rank_in_group, self.rank, self.local_rank = n, 0, 0, 0
        self.ranks = list(range(n))

    def __getattr__(self, k):
        import stubs

        return stubs._make(f"tp group.{k}")


REAL_GET_PARALLEL = []


def set_tp(n):
    """Every loaded module of the server that reads the TP size or rank through a getter answers N and 0."""
    if not REAL_GET_PARALLEL:
        rc = sys.modules.get(f"{SERVER}.srt.runtime_context")
        REAL_GET_PARALLEL.append(getattr(rc, "get_parallel", None))
    real = REAL_GET_PARALLEL[0]() if REAL_GET_PARALLEL[0] else None
    answers = {
        "get_tensor_model_parallel_world_size": lambda: n,
        "get_tensor_model_parallel_rank": lambda: 0,
        "get_attention_tp_size": lambda: n,
        "get_attention_tp_rank": lambda: 0,
        "get_attention_dp_size": lambda: 1,
        "get_parallel": (lambda fp=FakeParallel(n, real): fp),
        "get_tp_group": (lambda g=FakeGroup(n): g),
        "get_pp_group": (lambda g=FakeGroup(1): g),
    }
    for name, mod in list(sys.modules.items()):
        if not name.startswith(SERVER + ".") or mod is None:
            continue
        g = mod.__dict__
        for f, v in answers.items():
            if callable(g.get(f)) and not isinstance(g.get(f), type):
                g[f] = v


def build_attention(models_pkg, arch, cfg, n):
    """Constructs the attention layer `arch`'s decoder layer builds, with the TP size N, from the text config."""
    import importlib
    import inspect

    import stubs

    modname, clsname = ATTN_CLASSES[SERVER][arch]
    try:
        mod = importlib.import_module(f"{models_pkg}.{modname}")
    except Exception as e:
        raise ImportFailed(f"{type(e).__name__}: {e}") from e
    for lazy in LAZY_MODULES.get(SERVER, ()):
        try:
            importlib.import_module(lazy)
        except Exception:
            pass
    set_tp(n)
    for name, m in list(sys.modules.items()):
        if name.startswith(SERVER + ".") and m is not None:
            for f, stand_in in NOT_BUILT.items():
                if callable(m.__dict__.get(f)):
                    m.__dict__[f] = stand_in
    cls = getattr(mod, clsname)
    kv = getattr(cfg, "num_key_value_heads", None)
    given = {
        "config": cfg,
        "hidden_size": cfg.hidden_size,
        "num_heads": cfg.num_attention_heads,
        "num_kv_heads": kv if kv is not None else cfg.num_attention_heads,
        "head_dim": getattr(cfg, "head_dim", None),
        "layer_id": 0,
        # What the decoder layers of per-layer-type models pass for layer 0 (GPT-OSS: config.layer_types[0]).
        "layer_type": (getattr(cfg, "layer_types", None) or [None])[0],
        "layer_idx": 0,
        "prefix": "model.layers.0.self_attn",
        "quant_config": None,
        "cache_config": None,
        "max_position": getattr(cfg, "max_position_embeddings", 8192),
        "max_position_embeddings": getattr(cfg, "max_position_embeddings", 8192),
    }
    kw = {}
    for p in list(inspect.signature(cls.__init__).parameters.values())[1:]:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.name in given and (given[p.name] is not None or p.default is p.empty):
            kw[p.name] = given[p.name]
        elif p.default is p.empty:
            if hasattr(cfg, p.name):
                kw[p.name] = getattr(cfg, p.name)
            elif p.name == "vllm_config":
                kw[p.name] = VLLM_CONFIG[0]
            else:
                raise RuntimeError(f"vigil stub: {clsname}.__init__ needs {p.name!r}, not in the config")
    cls(**kw)
    return True


VLLM_CONFIG = [None]


class ImportFailed(Exception):
    """The model module did not import under the stubs (never a refusal)."""


class Rows:
    def __init__(self):
        self.seq = 0

    def emit(self, case, called, config, draft, flags, env, result):
        self.seq += 1
        row = {
            "case": case,
            "server": SERVER,
            "version": JOB["version"],
            "called": called,
            "inputs": {"config": config, "draft": draft, "flags": flags, "env": env},
            "result": result,
            "seq": (JOB.get("variant", 0), self.seq),
        }
        sys.stdout.write(json.dumps(row) + "\n")
        sys.stdout.flush()


# ----------------------------------------------------------------------------------------------- SGLang
class SGLang:
    def __init__(self):
        from sglang.srt.configs import model_config as mc

        self.mc = mc
        self.ModelConfig = mc.ModelConfig
        from sglang.srt import server_args as sa

        self.sa = sa
        self.has_from_sa = hasattr(self.ModelConfig, "from_server_args")

    def server_args(self, argv):
        # `--device cuda`: without it ServerArgs auto-detects the accelerator (0.5.11 raises "No accelerator
        # (CUDA, XPU, HPU, NPU, MUSA, MPS) is available." on this GPU-less machine). Not shown in the rows.
        return self.sa.prepare_server_args(argv + ["--device", "cuda"])

    def called_parse(self):
        return "sglang.srt.server_args.prepare_server_args"

    def called_mc(self):
        return ("sglang.srt.configs.model_config.ModelConfig.from_server_args" if self.has_from_sa
                else "sglang.srt.configs.model_config.ModelConfig") + " -> ModelConfig._derive_context_length"

    def model_config(self, sargs, **kw):
        if self.has_from_sa:
            return self.ModelConfig.from_server_args(sargs, **kw)
        path = kw.pop("model_path", None) or sargs.model_path
        return self.ModelConfig(path, trust_remote_code=sargs.trust_remote_code, revision=sargs.revision,
                                context_length=kw.pop("context_length", None) or sargs.context_length,
                                model_override_args=sargs.json_model_override_args,
                                is_embedding=sargs.is_embedding, dtype=sargs.dtype,
                                quantization=sargs.quantization, **kw)

    def derive(self, d, flags):
        sargs = self.server_args(["--model-path", d] + flags)
        m = self.model_config(sargs)
        return m.context_len, m

    def parse_only(self, d, value):
        sargs = self.server_args(["--model-path", d, "--context-length", value])
        return sargs.context_length

    def draft(self, td, dd, flags):
        # What the EAGLE worker does (speculative/eagle_worker*.py, tp_worker.py): the draft's ModelConfig
        # is built from the same server args with is_draft_model=True and context_length = the target's
        # context_len. Server args without the speculative flags (their post-init wants GPU facts).
        sargs = self.server_args(["--model-path", td] + flags)
        target = self.model_config(sargs)
        import inspect

        if "context_length" in inspect.signature(self.ModelConfig.from_server_args).parameters:
            drf = self.model_config(sargs, model_path=dd, is_draft_model=True, context_length=target.context_len)
        else:
            # <= 0.5.11 (eagle_worker.py): `server_args.context_length = target ... context_len`, then
            # ModelConfig.from_server_args(server_args, model_path=draft, is_draft_model=True).
            sargs.context_length = target.context_len
            drf = self.model_config(sargs, model_path=dd, is_draft_model=True)
        return target.context_len, drf.context_len

    def called_draft(self):
        return self.called_mc() + " (draft: is_draft_model=True, context_length=target.context_len)"

    tp = None
    models_pkg = "sglang.srt.models"

    def publish(self, d, n, m):
        """What the scheduler process does before it builds the model: the server args of `--tp N` published
        process-wide (`set_global_server_args_for_scheduler`, server_args.py), which the layers read."""
        import contextlib

        sargs = self.server_args(["--model-path", d, "--tp-size", str(n)])
        self.sa.set_global_server_args_for_scheduler(sargs)
        return contextlib.nullcontext()

    def text_config(self, m):
        return m.hf_text_config


# ------------------------------------------------------------------------------------------------- vLLM
class VLLM:
    def __init__(self):
        self._patch_inspection()

    @staticmethod
    def _patch_inspection():
        """vLLM inspects a model class by importing its module (torch layers) in a child process. With
        torch stubbed that cannot work, so the inspection answers a fixed decoder-only text-generation
        _ModelInfo. The architecture-name lookup (unknown architectures refused) is not touched."""
        import dataclasses
        import typing

        from vllm.model_executor.models import registry as reg

        def fake(self):
            vals = {}
            for f in dataclasses.fields(reg._ModelInfo):
                t = f.type if not isinstance(f.type, str) else f.name
                if f.name == "architecture":
                    vals[f.name] = self.class_name
                elif f.name in ("is_text_generation_model", "supports_pp", "supports_lora"):
                    vals[f.name] = True
                elif f.name == "attn_type":
                    vals[f.name] = "decoder"
                elif f.name == "default_seq_pooling_type":
                    vals[f.name] = "LAST"
                elif f.name == "default_tok_pooling_type":
                    vals[f.name] = "ALL"
                elif f.name == "score_type":
                    vals[f.name] = "bi-encoder"
                elif f.name.endswith("methods"):
                    vals[f.name] = ()
                elif f.default is not dataclasses.MISSING:
                    vals[f.name] = f.default
                else:
                    vals[f.name] = False
            return reg._ModelInfo(**vals)

        reg._LazyRegisteredModel.inspect_model_cls = fake

    # EngineArgs.add_cli_args / create_model_config construct a ParallelConfig whose validation imports
    # vLLM's IR kernels, which the torch stub cannot satisfy; the flag's value goes through the very type
    # function the CLI registers for --max-model-len and then into vllm.config.ModelConfig directly.
    def parse_value(self, value):
        try:
            from vllm.utils.argparse_utils import human_readable_int_or_auto as f
        except ImportError:
            from vllm.utils import human_readable_int_or_auto as f
        return f(value)

    def called_parse(self):
        return "vllm.utils.argparse_utils.human_readable_int_or_auto"

    def called_mc(self):
        return "vllm.config.ModelConfig(model=..., max_model_len=...) -> ModelConfig.get_and_verify_max_len -> vllm.config.model._get_and_verify_max_len"

    def derive(self, d, flags):
        from vllm.config import ModelConfig

        kw = {}
        if flags:
            kw["max_model_len"] = self.parse_value(flags[1])
        m = ModelConfig(model=d, **kw)
        return m.max_model_len, m

    def parse_only(self, d, value):
        return self.parse_value(value)

    def called_tp(self):
        return "vllm.config.ModelConfig.verify_with_parallel_config(vllm.config.ParallelConfig)"

    models_pkg = "vllm.model_executor.models"

    def publish(self, d, n, m):
        """What the worker does around building the model: the engine's config current
        (`set_current_vllm_config(VllmConfig(model_config, parallel_config))`, vllm/config/vllm.py), which the
        layers read (CustomOp, Attention)."""
        from vllm.config import DeviceConfig, ParallelConfig, VllmConfig, set_current_vllm_config

        # device "cuda": there is no GPU platform to detect it from here. Built at TP 1 and then set to N:
        # VllmConfig's own validation calls verify_with_parallel_config, whose refusal is the `#tp#` rows'.
        vc = VllmConfig(model_config=m, parallel_config=ParallelConfig(tensor_parallel_size=1),
                        device_config=DeviceConfig(device="cuda"))
        vc.parallel_config.tensor_parallel_size = n
        VLLM_CONFIG[0] = vc
        return set_current_vllm_config(vc)

    def text_config(self, m):
        return m.hf_text_config

    def tp(self, m, n):
        from vllm.config import ParallelConfig

        pc = ParallelConfig(tensor_parallel_size=n)
        m.verify_with_parallel_config(pc)
        return True

    draft = None


def name_of(case):
    return case["name"]


def main_variant(variant):
    JOB["variant"] = variant
    env_val = ENV_VALUES[variant]
    for k in list(os.environ):
        if k.startswith(("SGLANG_", "VLLM_")) and k not in ("VLLM_NO_USAGE_STATS",):
            del os.environ[k]
    if env_val is not None:
        os.environ[ENV_KEY] = env_val
    env = {ENV_KEY: env_val} if env_val is not None else {}
    sys.path.insert(0, JOB["here"])
    import stubs

    stubs.install(JOB["stubs"], JOB["stub_versions"], JOB["stub_dir"])
    logging.getLogger().addHandler(CAP)
    logging.getLogger().setLevel(logging.WARNING)
    sys.stderr = STDERR  # argparse writes usage errors here
    a = SGLang() if SERVER == "sglang" else VLLM()
    rows = Rows()
    cases = {c["name"]: c["dir"] for c in JOB["cases"]}
    flagname = "--context-length" if SERVER == "sglang" else "--max-model-len"

    # (a) derived length, no flags (needed by every variant to pick the over-length value).
    derived = {}
    for name, d in cases.items():
        STDERR.seek(0)
        STDERR.truncate()
        v, e, msgs = captured(lambda: a.derive(d, []))
        if e is None:
            derived[name] = (v[0], v[1])
        if variant == 0:
            res = {"context_len": v[0]} if e is None else result_of_error(e)
            rows.emit(f"{name}#derive", a.called_mc(), name, None, [], env, res)

    # (b) over-length values.
    for name, d in cases.items():
        if name not in derived:
            continue
        base = int(derived[name][0])
        lengths = [2 * base] if variant else sorted({2 * base, base + 1, 131072, 262144} - {base})
        lengths = [x for x in lengths if x > base]
        for L in lengths:
            flags = [flagname, str(L)]
            v, e, msgs = captured(lambda: a.derive(d, flags))
            if e is None:
                res = {"accepted": True, "context_len": v[0], "message": relevant(msgs)}
            else:
                res = result_of_error(e)
            rows.emit(f"{name}#over#{L}", a.called_mc(), name, None, flags, env, res)

    if variant == 0:
        # Human-readable values: the parser alone, then the whole model config on llama31-8b.
        for probe in ("llama31-8b", "repo:llama-3.1-8b-instruct"):
            if probe in cases:
                break
        d = cases[probe]
        for value in HUMAN[SERVER]:
            STDERR.seek(0)
            STDERR.truncate()
            v, e, msgs = captured(lambda: a.parse_only(d, value))
            res = {"accepted": True, "parsed": v} if e is None else result_of_error(e)
            rows.emit(f"{probe}#parse#{value}", a.called_parse(), probe, None, [flagname, value], env, res)
            STDERR.seek(0)
            STDERR.truncate()
            v, e, msgs = captured(lambda: a.derive(d, [flagname, value]))
            res = ({"accepted": True, "context_len": v[0], "message": relevant(msgs)} if e is None
                   else result_of_error(e))
            rows.emit(f"{probe}#mc#{value}", a.called_mc(), probe, None, [flagname, value], env, res)

    # (c) drafts (SGLang: the draft ModelConfig built against the target's context).
    if a.draft is not None and variant in (0, 1):
        for t, dr in DRAFT_PAIRS:
            if t not in cases or dr not in cases:
                continue
            flag_sets = [[]]
            if dr in derived and t in derived and derived[dr][0] < derived[t][0]:
                flag_sets.append([flagname, str(int(derived[dr][0]))])
            for flags in flag_sets:
                v, e, msgs = captured(lambda: a.draft(cases[t], cases[dr], flags))
                if e is None:
                    res = {"accepted": True, "context_len": v[0], "draft_context_len": v[1], "message": relevant(msgs)}
                else:
                    res = result_of_error(e)
                rows.emit(f"{t}+{dr}#draft", a.called_draft(), t, dr, flags, env, res)

    # (d) TP divisibility where the server has a config-level check.
    if a.tp is not None and variant == 0:
        for name in cases:
            if name not in derived:
                continue
            m = derived[name][1]
            for n in TP_SIZES:
                v, e, msgs = captured(lambda: a.tp(m, n))
                res = {"accepted": True} if e is None else result_of_error(e)
                rows.emit(f"{name}#tp#{n}", a.called_tp(), name, None, ["--tensor-parallel-size", str(n)], env, res)

    # (e) The attention layer built at each TP size: the heads / KV-heads checks in the model code.
    if variant == 0:
        for name in cases:
            if name not in derived:
                continue
            m = derived[name][1]
            arch = (getattr(m.hf_config, "architectures", None) or ["?"])[0]
            if arch not in ATTN_CLASSES[SERVER]:
                continue
            modname, clsname = ATTN_CLASSES[SERVER][arch]
            called = f"{a.models_pkg}.{modname}.{clsname}(text config, TP size N)"
            for n in TP_SIZES:
                CAP.msgs = []
                try:
                    with a.publish(cases[name], n, m):
                        build_attention(a.models_pkg, arch, a.text_config(m), n)
                    res = {"accepted": True}
                except Exception as e:
                    res = result_of_build_error(e)
                rows.emit(f"{name}#attn#{n}", called, name, None, ["--tensor-parallel-size", str(n)], env, res)


REAL_STDERR = sys.stderr


def main():
    if len(sys.argv) > 2:
        try:
            main_variant(int(sys.argv[2]))
        except BaseException:
            REAL_STDERR.write(traceback.format_exc())
            raise
        return
    for i in range(len(ENV_VALUES)):
        p = subprocess.run([sys.executable, __file__, sys.argv[1], str(i)], capture_output=True, text=True,
                           timeout=1200)
        sys.stdout.write(p.stdout)
        if p.returncode != 0:
            sys.stderr.write(p.stderr[-5000:])
            sys.exit(p.returncode)


if __name__ == "__main__":
    main()
