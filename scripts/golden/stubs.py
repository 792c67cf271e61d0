"""Import-time stand-ins for heavy / GPU-only modules (torch, triton, CUDA kernels, ...).

The golden generator calls the servers' own config code, which lives in modules that import torch
and friends at the top. None of the code paths exercised here (reading config.json, deriving the
context length, parsing arguments, checking head divisibility) computes anything with these
modules; they only have to *import*. This module installs a meta-path finder that answers every
import of a stubbed top-level name (and any submodule of it) with a permissive fake module whose
attributes are permissive fake classes: subclassable, callable (as a decorator it returns the
decorated function unchanged), subscriptable, falsy, iterable as empty.

A few values are real because server code branches on them at import time: `torch.__version__`
(the version the server pins), `torch.version.cuda/hip` (None: not a CUDA/ROCm build),
`torch.cuda.is_available()` (False), dtypes are distinct cached objects. A fake dist-info is
written for each stub so `importlib.metadata.version("torch")` answers the pinned version.

Nothing here re-implements server logic; it only keeps imports from failing.
"""

from __future__ import annotations

import abc
import json
import importlib.abc
import importlib
import importlib.machinery
import os
import sys
import types
import typing

_CACHE_KEY = "_vigil_stub_attrs"


class _StubMeta(typing._ProtocolMeta):
    # ABCMeta (through typing's Protocol metaclass) so that `class X(torch.nn.Module, ABC)` and vLLM's model
    # classes `class LlamaForCausalLM(nn.Module, SupportsLoRA, SupportsPP)` (Protocols) have a consistent
    # metaclass.
    def __getattr__(cls, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        d = type.__getattribute__(cls, "__dict__")
        if not d.get("_vigil_stub", False):
            # A real class that subclasses a stub: only its own/bases' attributes, except the class attributes
            # its stub base would provide (`_attention.apply` of a `torch.autograd.Function`, at import time).
            if not any(_is_stub(b) and b.__qualname__ in _CLASS_ATTR_BASES for b in cls.__mro__[1:]):
                raise AttributeError(name)
        if name == "name":  # e.g. torch.library.Library(...).m.name, used as an attribute name
            return cls.__qualname__.replace(".", "_").replace("()", "")
        v = _make(f"{cls.__qualname__}.{name}")
        type.__setattr__(cls, name, v)
        return v

    def __call__(cls, *a, **k):
        if not cls.__dict__.get("_vigil_stub", False):
            return super().__call__(*a, **k)
        if len(a) == 1 and not k and (callable(a[0]) and not isinstance(a[0], _StubMeta)):
            return a[0]  # used as a bare decorator
        # One result per stub, so that two calls compare equal (vLLM compares inferred op schemas).
        r = cls.__dict__.get("_vigil_call_result")
        if r is None:
            r = _make(f"{cls.__qualname__}()")
            type.__setattr__(cls, "_vigil_call_result", r)
        return r

    def __getitem__(cls, k):
        if not _is_stub(cls):
            raise TypeError(f"{cls.__name__} is not subscriptable")
        return cls

    def __iter__(cls):
        if not _is_stub(cls):
            raise TypeError(f"{cls.__name__} is not iterable")
        return iter(())

    def __len__(cls):
        if not _is_stub(cls):
            raise TypeError(f"{cls.__name__} has no len()")
        return 0

    def __bool__(cls):
        # Stubs are falsy ("feature not available"); real subclasses of a stub are ordinary classes.
        return not _is_stub(cls)

    def __or__(cls, other):
        return typing.Union[cls, other]

    def __ror__(cls, other):
        return typing.Union[other, cls]

    def __int__(cls):
        return 0

    def _arith(cls, *o):
        if not _is_stub(cls):
            return NotImplemented
        return cls

    __neg__ = __pos__ = __abs__ = _arith
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _arith
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = __pow__ = __rpow__ = __mod__ = _arith

    def __index__(cls):
        return 0

    def __float__(cls):
        return 0.0

    def __enter__(cls):
        return cls

    def __exit__(cls, *a):
        return False

    def __contains__(cls, x):
        return False

    def __lt__(cls, o):
        return False if _is_stub(cls) else NotImplemented

    __le__ = __gt__ = __ge__ = __lt__

    def __hash__(cls):
        return id(cls)

    def __eq__(cls, o):
        return cls is o

    def __repr__(cls):
        return f"<vigil stub {cls.__qualname__}>"

    def __instancecheck__(cls, obj):
        return False if _is_stub(cls) and not type.__instancecheck__(cls, obj) else super().__instancecheck__(obj)


def _is_stub(cls) -> bool:
    return type.__getattribute__(cls, "__dict__").get("_vigil_stub", False)


def _any_schema(cls, source, handler):
    """pydantic: a stub used as a field type (SGLang >= 0.5.20 types a request field `xgrammar.StructuralTag`)
    validates anything."""
    from pydantic_core import core_schema

    return core_schema.any_schema()


def _instance_attr(self, name):
    """An attribute of an instance of a real class built on the stub `torch.nn.Module` that the class did not
    set (`self.register_buffer`, `self.training`): a stub, as for the class itself. The model layers' own
    attributes are set in their `__init__` and found before this."""
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(name)
    return _make(f"{type(self).__qualname__}.{name}")


# Stub classes whose real subclasses are instantiated (layers built at import time, and the attention layers
# that runner.py constructs): their instances answer unknown attributes with stubs.
_MODULE_BASES = {"torch.nn.Module", "torch.nn.modules.module.Module"}
_CLASS_ATTR_BASES = {"torch.autograd.Function"}


def _make(name: str):
    ns = {"_vigil_stub": True, "__qualname__": name, "__module__": "vigil_stub", "_is_protocol": False,
          "__get_pydantic_core_schema__": classmethod(_any_schema)}
    if name in _MODULE_BASES:
        ns["__getattr__"] = _instance_attr
    return _StubMeta(name.rsplit(".", 1)[-1] or "stub", (), ns)


def _false(*a, **k):
    return False


def _none(*a, **k):
    return None


def _zero(*a, **k):
    return 0


# Attributes that must look absent (`hasattr(torch, "npu")` selects another accelerator's code path).
_ABSENT = {
    "torch": {"npu", "hpu", "musa", "mlu"},
    "torch.version": {"musa"},
}


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        if name in _ABSENT.get(self.__name__, ()):
            raise AttributeError(name)
        # A submodule imported later wins; otherwise a stub class.
        full = f"{self.__name__}.{name}"
        if full in sys.modules:
            return sys.modules[full]
        if full in _SPECIAL_MODULES:
            return importlib.import_module(full)
        v = _make(full)
        setattr(self, name, v)
        return v


def _infer_schema(fn, *a, **k):
    """torch.library.infer_schema stand-in: a schema string shaped like the function (vLLM's IR op
    registry splits it on " -> " and counts outputs)."""
    import inspect

    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return "(Tensor x) -> Tensor"
    params = ", ".join(f"Tensor {p}" for p in sig.parameters)
    ret = sig.return_annotation
    if isinstance(ret, str):
        n = ret.count(",") + 1 if ret.startswith(("tuple", "Tuple")) else 1
    elif typing.get_origin(ret) is tuple:
        n = len(typing.get_args(ret))
    elif ret is None or ret is type(None):
        n = 0
    else:
        n = 1
    returns = "()" if n == 0 else ("Tensor" if n == 1 else "(" + ", ".join(["Tensor"] * n) + ")")
    return f"({params}) -> {returns}"


def _custom_op(name, fn=None, **k):
    """torch.library.custom_op: the decorated function, with the registration decorators a custom op has
    (`@op.register_fake`, vLLM >= 0.29 quantization/qutlass_utils.py at import)."""

    def wrap(f):
        for reg in ("register_fake", "register_autograd", "register_kernel", "register_torch_dispatch",
                    "register_vmap"):
            try:
                setattr(f, reg, lambda *a, **k: (a[0] if a and callable(a[0]) else (lambda g: g)))
            except (AttributeError, TypeError):
                pass
        return f

    return wrap(fn) if callable(fn) else wrap


class _NoDriver:
    """triton.runtime.driver: no active GPU driver, as on a machine without GPUs."""

    @property
    def active(self):
        raise RuntimeError("0 active drivers ([]). There should only be one.")


class _FakeTensor:
    """What the tensor factories (`torch.empty(...)`, `torch.nn.Parameter(...)`) return while runner.py builds
    an attention layer: a fresh object per call that has only the attributes set on it, so that the layers'
    `set_weight_attrs` (`assert not hasattr(weight, key)`) sees a new tensor, not a stub that answers every name."""

    def __new__(cls, *a, **k):
        return object.__new__(cls)

    def __init__(self, *a, **k):
        pass


class _Parameter(_FakeTensor):
    """`torch.nn.Parameter`: subclassed by the servers' parameter classes (`super().__new__(cls, data=...)`)."""


class _DType:
    """`torch.dtype`: the dtypes are its instances (module constants such as SGLang's
    `assert isinstance(NIXL_EP_TOPK_INDICES_DTYPE, torch.dtype)` hold), distinct and compared by identity, with
    their `itemsize` (SGLang 0.5.22 reads `torch.float32.itemsize` at import)."""

    def __init__(self, name):
        self.name = name
        bits = "".join(c for c in name.split("_")[0] if c.isdigit())
        self.itemsize = 1 if name == "bool" or name.startswith(("float8", "float4")) else int(bits) // 8
        self.is_floating_point = name.startswith(("float", "bfloat"))

    def __repr__(self):
        return f"torch.{self.name}"


_DTYPES = ("float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool",
           "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2",
           "complex64", "uint16", "uint32", "uint64")


def _fake_tensor(*a, **k):
    return _FakeTensor()


# Values a server reads at import time and branches on.
def _specials(version_map: dict[str, str]) -> dict[str, dict[str, object]]:
    tv = version_map.get("torch", "2.9.0")
    return {
        "torch": {
            "__version__": tv,
            "dtype": _DType,
            **{n: _DType(n) for n in _DTYPES},
            "compile": lambda *a, **k: (a[0] if a and callable(a[0]) else (lambda f: f)),
            "is_grad_enabled": _false,
            "get_default_dtype": lambda: sys.modules["torch"].float32,
            # Not `torch.tensor`: module-level code reads scalars back (`torch.tensor(beta).item()`, SGLang
            # 0.5.22 layers/activation.py), which the permissive stub answers.
            **{f: _fake_tensor for f in ("empty", "zeros", "ones", "full", "rand", "randn", "arange",
                                         "empty_like", "zeros_like", "ones_like")},
        },
        "torch.nn": {"Parameter": _Parameter},
        "torch.nn.parameter": {"Parameter": _Parameter},
        "torch.version": {"__version__": tv, "cuda": None, "hip": None, "git_version": "stub", "xpu": None},
        "torch.cuda": {
            "is_available": _false,
            "device_count": _zero,
            "get_device_capability": lambda *a, **k: (0, 0),
            "get_device_name": lambda *a, **k: "none",
            "current_device": _zero,
            "is_initialized": _false,
        },
        "torch.backends.mps": {"is_available": _false},
        "triton.runtime": {"driver": _NoDriver()},
        # vLLM's IR op registry splits the inferred schema string on " -> ".
        "torch.library": {"infer_schema": _infer_schema, "custom_op": _custom_op},
        "torch.xpu": {"is_available": _false},
        "torch.npu": {"is_available": _false},
        "torch.distributed": {"is_initialized": _false, "is_available": _false},
    }


_SPECIAL_MODULES: set[str] = set()


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots, versions):
        self.roots = set(roots)
        self.specials = _specials(versions)
        # Every stubbed package answers its own `__version__` (transformers' `is_torchvision_greater_or_equal`
        # reads the module's attribute; a stub without one reads as 'N/A' and packaging refuses to parse it).
        for r in roots:
            if r in versions:
                self.specials.setdefault(r, {}).setdefault("__version__", versions[r])
        _SPECIAL_MODULES.update(k for k in self.specials if "." in k)

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".", 1)[0] in self.roots:
            spec = importlib.machinery.ModuleSpec(fullname, self, is_package=True)
            spec.submodule_search_locations = []
            return spec
        return None

    def create_module(self, spec):
        m = _StubModule(spec.name)
        m.__path__ = []
        m.__file__ = f"<vigil stub {spec.name}>"
        m.__vigil_stub__ = True
        for k, v in self.specials.get(spec.name, {}).items():
            setattr(m, k, v)
        if spec.name == "torch":
            m.float = m.float32
            m.half = m.float16
        return m

    def exec_module(self, module):
        pass


def install(roots: list[str], versions: dict[str, str], distinfo_dir: str | None = None) -> None:
    """Install the finder for `roots`; write fake dist-info for `versions` under distinfo_dir."""
    for r in roots:
        if r in sys.modules and not getattr(sys.modules[r], "__vigil_stub__", False):
            raise RuntimeError(f"{r} already imported for real; cannot stub it")
    if any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _Finder(roots, versions))
    os.environ["VIGIL_GOLDEN_STUBS"] = json.dumps({"roots": list(roots), "versions": versions, "dist": distinfo_dir})
    if distinfo_dir:
        os.makedirs(distinfo_dir, exist_ok=True)
        for name, ver in versions.items():
            d = os.path.join(distinfo_dir, f"{name.replace('-', '_')}-{ver}.dist-info")
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "METADATA"), "w") as f:
                f.write(f"Metadata-Version: 2.1\nName: {name}\nVersion: {ver}\n")
        if distinfo_dir not in sys.path:
            sys.path.append(distinfo_dir)


def boot_from_env() -> None:
    """Called from a .pth file in the golden venvs, so that subprocesses the server spawns (vLLM inspects
    model classes in a child `python -m vllm.model_executor.models.registry`) get the same stubs. No-op
    unless VIGIL_GOLDEN_STUBS is set (pip in the venv is unaffected)."""
    spec = os.environ.get("VIGIL_GOLDEN_STUBS")
    if not spec:
        return
    s = json.loads(spec)
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        install(s["roots"], s["versions"], s["dist"])
