#!/usr/bin/env python3
"""Regenerate crates/vigil/tests/golden/check-golden.jsonl from the servers' own code.

For every server version below: a cached venv under ~/.cache/vigil/golden/<server>-<version>/ with the
server wheel installed --no-deps, the transformers version that wheel pins (its METADATA Requires-Dist),
and the few light pure-Python modules its config code imports. torch, triton and the CUDA kernel packages
are stubbed (scripts/golden/stubs.py). Then `runner.py` runs inside each venv, once per environment
variant (SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN / VLLM_ALLOW_LONG_MAX_MODEL_LEN unset / 1 / true / ...),
calling the server's functions on every config under /work/shared/check-cases/configs and
crates/vigil/tests/configs, and this script merges the rows into one deterministic JSONL file.

Usage: python3 scripts/golden/refresh.py [--only sglang-0.5.23,...] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
CACHE = Path(os.environ.get("VIGIL_GOLDEN_CACHE", Path.home() / ".cache" / "vigil" / "golden"))
SHARED_CASES = Path(os.environ.get("VIGIL_CHECK_CASES", "/work/shared/check-cases/configs"))
REPO_CASES = REPO / "crates" / "vigil" / "tests" / "configs"
OUT = REPO / "crates" / "vigil" / "tests" / "golden" / "check-golden.jsonl"

# (server, version). The transformers pin is read from the wheel's METADATA. Every third minor release of the
# covered range (vLLM 0.20-0.33, SGLang 0.5.10-0.5.23) and every release in which a rule that `vigil check`
# models changed, found by diffing the servers' config and model code between consecutive releases
# (tests/golden/README.md, "Versions"): `check` confirms a release between two of them with the lower one.
# Keep in step with `Srv::golden_versions` (crates/vigil/src/check/derive.rs; a test compares them).
VERSIONS = [
    ("sglang", "0.5.23"),  # newest on PyPI
    ("sglang", "0.5.22"),  # EmbeddingGemma2 context capped at 8192 (model_config.py _derive_context_length)
    ("sglang", "0.5.20"),
    ("sglang", "0.5.17"),  # issue #23
    ("sglang", "0.5.14"),  # the layers read the TP size through get_parallel()
    ("sglang", "0.5.12"),  # kimi_k2 config registered; the one-layer EAGLE-3 rule gone
    ("sglang", "0.5.11"),  # last with the one-layer EAGLE-3 rule (B6)
    ("sglang", "0.5.10"),  # oldest covered
    # ("sglang", "0.4.10.post2"),  # 0.4.x (B12). Not covered: with its pin transformers==4.54.1 and the
    #   stubs, `from transformers import AutoProcessor` (sglang/srt/configs/deepseekvl2.py) fails at import.
    ("vllm", "0.33.0"),  # newest on PyPI
    ("vllm", "0.32.0"),  # rope parameters read through iter_rope_parameters (empty per-layer entries skipped)
    ("vllm", "0.30.0"),  # YaRN no longer scaled (M1); layers without RoPE skipped
    ("vllm", "0.29.0"),  # last before the YaRN change (M1)
    ("vllm", "0.26.0"),  # issue #23
    ("vllm", "0.24.0"),  # transformers >= 5.5.3 required (4.x support and GGUF configs gone from get_config)
    ("vllm", "0.23.0"),
    ("vllm", "0.21.0"),  # legacy rope `type` patched before transformers standardises the rope parameters
    ("vllm", "0.20.0"),  # oldest covered
]

# Light modules the config code imports at module level, installed from PyPI as binary wheels.
LIGHT_DEPS = {
    "sglang": [
        "orjson", "psutil", "pybase64", "requests", "pillow", "starlette", "msgspec", "pyzmq", "aiohttp",
        "dill", "sentencepiece", "gguf", "fastapi", "uvicorn", "pydantic", "packaging", "setproctitle",
        "python-multipart", "partial_json_parser", "einops", "interegular", "blobfile", "xxhash", "zstandard",
        "prometheus-client", "uvloop", "openai", "tiktoken", "distro", "easydict",
    ],
    "vllm": [
        "pydantic", "cachetools", "cloudpickle", "msgspec", "psutil", "pyzmq", "requests", "fastapi", "uvicorn",
        "aiohttp", "openai", "prometheus-client", "cbor2", "blake3", "pybase64", "setproctitle", "gguf",
        "sentencepiece", "pillow", "einops", "py-cpuinfo", "diskcache", "regex", "partial_json_parser", "tiktoken",
        "python-json-logger", "ijson", "opentelemetry-api", "opentelemetry-sdk", "watchfiles", "pyyaml",
        "mistral_common", "jinja2", "protobuf", "prometheus-fastapi-instrumentator", "six", "openai-harmony",
        "lark", "typing_extensions", "dill", "uvloop",
    ],
}

# Heavy / GPU-only top-level modules answered by stubs.py (never installed).
# Heavy / GPU-only top-level modules answered by stubs.py (never installed). Only what the imported modules
# need: a stub is visible to transformers' is_X_available() probes (with version 0.0.0 unless pinned), so
# stubbing more than necessary changes which optional code paths transformers takes.
STUBS = {
    "sglang": ["torch", "triton", "sgl_kernel", "flashinfer", "IPython", "torchvision", "tvm_ffi", "compressed_tensors",
               "xgrammar"],
    "vllm": ["torch", "triton", "torchvision", "xgrammar", "llguidance", "compressed_tensors", "cuda"],
}

STUB_VERSIONS_DEFAULT = {"torchvision": "0.29.0", "torchaudio": "2.11.0"}

PIP_TIMEOUT = 900
RUN_TIMEOUT = 1800


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def sh(cmd, timeout, **kw):
    log("+", " ".join(str(c) for c in cmd))
    return subprocess.run([str(c) for c in cmd], timeout=timeout, check=True, **kw)


def wheel_requires(venv: Path, server: str) -> list[str]:
    site = next((venv / "lib").glob("python*/site-packages"))
    meta = next(site.glob(f"{server}-*.dist-info/METADATA"))
    return [l.split(":", 1)[1].strip() for l in meta.read_text().splitlines() if l.startswith("Requires-Dist:")]


def pin_of(reqs: list[str], name: str) -> str | None:
    for r in reqs:
        m = re.match(rf"^{re.escape(name)}\s*(\[[^\]]*\])?\s*([<>=!~][^;]*)?(;.*)?$", r, re.I)
        if m:
            return (m.group(2) or "").strip()
    return None


def ensure_venv(server: str, version: str) -> dict:
    venv = CACHE / f"{server}-{version}"
    stamp = venv / ".vigil-golden.json"
    if stamp.exists():
        return json.loads(stamp.read_text())
    if venv.exists():
        shutil.rmtree(venv)
    CACHE.mkdir(parents=True, exist_ok=True)
    sh([sys.executable, "-m", "venv", venv], 300)
    pip = [venv / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    sh(pip + ["--no-deps", "--only-binary", ":all:", f"{server}=={version}"], PIP_TIMEOUT)
    reqs = wheel_requires(venv, server)
    tf = pin_of(reqs, "transformers") or ""
    # transformers and its own (light, binary) dependencies: huggingface_hub, tokenizers, safetensors, ...
    sh(pip + ["--only-binary", ":all:", f"transformers{tf}"], PIP_TIMEOUT)
    for dep in LIGHT_DEPS[server]:
        # One at a time, binary only: a dep that has no wheel for this Python is skipped, not built.
        try:
            sh(pip + ["--only-binary", ":all:", "--upgrade-strategy", "only-if-needed", dep], PIP_TIMEOUT)
        except subprocess.CalledProcessError:
            log(f"  (skipped {dep}: no binary wheel)")
    # A light dep may have pulled a real torch-dependent package in; the stubs must win.
    for s in STUBS[server]:
        subprocess.run([venv / "bin" / "python", "-m", "pip", "uninstall", "-y", "-q", s], timeout=300,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stub_versions = {n: "0.0.0" for n in STUBS[server]}
    info = {
        "server": server,
        "version": version,
        "transformers_pin": tf,
        "stub_versions": {**stub_versions, **STUB_VERSIONS_DEFAULT, **{n: (pin_of(reqs, n) or "").lstrip("=") or STUB_VERSIONS_DEFAULT.get(n, "2.9.0")
                                                    for n in ("torch", "torchvision", "torchaudio")}},
    }
    for n, v in list(info["stub_versions"].items()):
        if not re.fullmatch(r"[0-9][0-9.]*", v):
            info["stub_versions"][n] = STUB_VERSIONS_DEFAULT.get(n, "2.9.0")
    stamp.write_text(json.dumps(info, indent=1))
    return info


def layout_cases(root: Path) -> list[dict]:
    """Lay every config out as a model directory NAME/config.json (README of check-cases)."""
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    cases = []
    for src, origin in ((SHARED_CASES, "shared"), (REPO_CASES, "repo")):
        for f in sorted(src.glob("*.json")):
            if f.name.endswith(".model.safetensors.index.json"):
                continue
            name = f.stem if origin == "shared" else f"repo:{f.stem}"
            d = root / name.replace(":", "_")
            d.mkdir()
            shutil.copy(f, d / "config.json")
            idx = src / f"{f.stem}.model.safetensors.index.json"
            if idx.exists():
                shutil.copy(idx, d / "model.safetensors.index.json")
                weights = json.loads(idx.read_text()).get("weight_map", {})
                shards = sorted(set(weights.values()))
                for s in shards[:3]:  # three of its four shards present
                    (d / s).write_bytes(b"")
            cases.append({"name": name, "dir": str(d)})
    if SHARED_CASES.exists():
        (root / "x-empty").mkdir()
        cases.append({"name": "x-empty", "dir": str(root / "x-empty")})
    return cases


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="", help="comma-separated server-version list")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    only = {s for s in args.only.split(",") if s}
    t0 = time.time()
    env_base = {k: v for k, v in os.environ.items()
                if not k.startswith(("SGLANG_", "VLLM_", "HF_", "TRANSFORMERS_", "CUDA_", "PYTHON"))}
    env_base.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HOME": str(CACHE / "hf-home"),
                     "TOKENIZERS_PARALLELISM": "false", "PYTHONDONTWRITEBYTECODE": "0",
                     "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "OMP_NUM_THREADS": "1"})
    cases = layout_cases(CACHE / "models")
    rows = []
    timings = {}
    for server, version in VERSIONS:
        key = f"{server}-{version}"
        if only and key not in only:
            continue
        t1 = time.time()
        try:
            info = ensure_venv(server, version)
        except subprocess.SubprocessError as e:
            log(f"   venv for {key} failed: {e}")
            timings[key] = {"error": f"venv: {e}"}
            continue
        t2 = time.time()
        job = {"server": server, "version": version, "cases": cases, "stubs": STUBS[server],
               "stub_versions": {**{n: "0.0.0" for n in STUBS[server]}, **info["stub_versions"]}, "stub_dir": str(CACHE / key / "stub-dist"),
               "here": str(HERE), "models_root": str(CACHE / "models")}
        jf = CACHE / key / "job.json"
        jf.write_text(json.dumps(job))
        py = CACHE / key / "bin" / "python"
        log(f"== {key}: running the server's code")
        p = subprocess.run([py, HERE / "runner.py", jf], env=env_base, timeout=RUN_TIMEOUT,
                           capture_output=True, text=True, cwd=str(CACHE))
        got = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
        if p.returncode != 0:
            # Keep what the variants that ran produced; say which did not.
            log(p.stderr[-4000:])
            log(f"   runner failed for {key} (rc {p.returncode}); keeping {len(got)} rows")
            timings.setdefault(key, {})["error"] = p.stderr.strip().splitlines()[-1][:300] if p.stderr.strip() else "rc"
        rows += got
        timings.setdefault(key, {}).update({"venv_s": round(t2 - t1, 1), "run_s": round(time.time() - t2, 1), "rows": len(got)})
        log(f"   {len(got)} rows; venv {t2 - t1:.0f}s, run {time.time() - t2:.0f}s")
    rows.sort(key=lambda r: (r["server"], _vkey(r["version"]), r["case"], r["seq"]))
    for r in rows:
        r.pop("seq", None)
    out = Path(args.out)
    if only:
        # Keep the rows of the listed versions that were not run (a full run would give them again, in the
        # same order: rows are grouped by server and version, and a group's order is the runner's own).
        # A version whose venv or runner failed before its first row keeps its old rows.
        ran = {(r["server"], r["version"]) for r in rows}
        listed = set(VERSIONS)
        kept = []
        if out.exists():
            for line in out.read_text().splitlines():
                r = json.loads(line)
                if (r["server"], r["version"]) in listed and (r["server"], r["version"]) not in ran:
                    kept.append(r)
        rows = sorted(kept + rows, key=lambda r: (r["server"], _vkey(r["version"])))  # stable: groups keep order
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w") as f:
        for r in rows:
            f.write(json.dumps(r, sort_keys=False, ensure_ascii=False) + "\n")
    log(f"wrote {len(rows)} rows to {out} in {time.time() - t0:.0f}s")
    log(json.dumps(timings))


def _vkey(v: str):
    return tuple(int(x) if x.isdigit() else x for x in re.split(r"[.]", v.replace("post", "")))


if __name__ == "__main__":
    main()
