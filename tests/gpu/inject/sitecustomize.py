# Fault injection for the frame-table check on the real servers (issue #24; tests/gpu/realserve-inject.sh).
# VIGIL_INJECT="package.module:Class.method@N" makes the N-th call (default 1) of that function raise a
# RuntimeError at its first line, inside the function's own frame, so the server's real traceback shows the real
# call chain down to it (plus one frame of this file's wrapper just outside it). Every process the server spawns
# inherits PYTHONPATH and so this file. Nothing happens without the variable.
import os
import sys

_SPEC = os.environ.get("VIGIL_INJECT", "")
if _SPEC:
    import functools
    import importlib.abc
    import threading

    _target, _, _nth = _SPEC.partition("@")
    _NTH = int(_nth or 1)
    _MOD, _, _QUAL = _target.partition(":")
    _count = [0]
    _lock = threading.Lock()

    def _trap(frame, event, arg):
        if event == "line":
            raise RuntimeError(f"vigil fault injection: {_QUAL} call {_NTH} fails here")
        return _trap

    def _patch(mod):
        owner = mod
        parts = _QUAL.split(".")
        for p in parts[:-1]:
            owner = getattr(owner, p)
        orig = owner.__dict__.get(parts[-1]) if isinstance(owner, type) else getattr(owner, parts[-1])
        func = getattr(orig, "__func__", orig)
        code = func.__code__

        @functools.wraps(func)
        def wrapper(*a, **k):
            with _lock:
                _count[0] += 1
                fire = _count[0] == _NTH
            if not fire:
                return func(*a, **k)

            def tracer(frame, event, arg):
                return _trap if event == "call" and frame.f_code is code else None

            old = sys.gettrace()
            sys.settrace(tracer)
            try:
                return func(*a, **k)
            finally:
                sys.settrace(old)

        new = staticmethod(wrapper) if isinstance(orig, staticmethod) else (
            classmethod(wrapper) if isinstance(orig, classmethod) else wrapper)
        setattr(owner, parts[-1], new)
        print(f"[vigil-inject] patched {_MOD}:{_QUAL}@{_NTH} in pid {os.getpid()}", file=sys.stderr, flush=True)

    class _Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != _MOD:
                return None
            sys.meta_path.remove(self)
            try:
                import importlib.util
                spec = importlib.util.find_spec(name)
            finally:
                sys.meta_path.insert(0, self)
            if spec is None or spec.loader is None:
                return None
            real_exec = spec.loader.exec_module

            def exec_module(module):
                real_exec(module)
                _patch(module)

            spec.loader.exec_module = exec_module
            return spec

    if _MOD in sys.modules:
        _patch(sys.modules[_MOD])
    else:
        sys.meta_path.insert(0, _Finder())
