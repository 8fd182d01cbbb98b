"""Codegen: the adjoint's Python source -> a compiled numba function, cached.

The source written by :mod:`kadj.reverse` is saved as a module file in kadj's cache
directory (``$KADJ_CACHE_DIR``, default ``~/.cache/kadj``) next to a JSON record of the
adjoint's plan and of the source files it came from (with their modification times),
then imported and compiled by numba with the user's own jit options and numba's
on-disk cache.  A second process with unchanged sources finds both: it neither
regenerates the adjoint nor recompiles it.  Adjoints that reference objects that cannot
be named in a module file (user functions with custom rules, global arrays) are cached
in memory only.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys

from .plan import AdjointPlan

CACHE_VERSION = "kadj-adjoint-v1"
_STANDARD = {"math", "np", "_push", "_sign", "_reserve", "_trips"}
_HEADER = ("import math\nimport numpy as np\n"
           "from kadj.runtime_helpers import _push, _sign, _reserve, _trips\n\n\n")


def cache_dir():
    d = os.environ.get("KADJ_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache",
                                                         "kadj")
    return d


_SELF_HASH = None


def _kadj_hash():
    """Hash of kadj's own sources: a new kadj never loads an old kadj's adjoints."""
    global _SELF_HASH
    if _SELF_HASH is None:
        h = hashlib.sha256()
        here = os.path.dirname(os.path.abspath(__file__))
        for root, _dirs, files in sorted(os.walk(here)):
            for f in sorted(files):
                if f.endswith(".py"):
                    with open(os.path.join(root, f), "rb") as fh:
                        h.update(fh.read())
        _SELF_HASH = h.hexdigest()[:16]
    return _SELF_HASH


def _fingerprint(obj, h, seen, depth=0):
    """Feed into ``h`` what the adjoint of code depending on ``obj`` depends on: bytecode,
    constants, names, closure values and the globals the code reads (recursively for
    jitted callees).  Objects without a stable description contribute their identity,
    which only costs a cache miss in another process."""
    import types as pytypes

    import numpy as np

    if depth > 8:
        return
    if isinstance(obj, (bool, int, float, complex, str, bytes, type(None))):
        h.update(repr((type(obj).__name__, obj)).encode())
        return
    if isinstance(obj, np.generic):
        h.update(repr((type(obj).__name__, obj.item())).encode())
        return
    if isinstance(obj, np.ndarray):
        h.update(repr((obj.dtype.str, obj.shape)).encode())
        h.update(np.ascontiguousarray(obj).tobytes())
        return
    if isinstance(obj, tuple):
        h.update(b"(")
        for x in obj:
            _fingerprint(x, h, seen, depth + 1)
        h.update(b")")
        return
    if isinstance(obj, pytypes.ModuleType):
        h.update(("module:" + obj.__name__).encode())
        return
    if id(obj) in seen:
        h.update(b"<seen>")
        return
    seen.add(id(obj))
    py_func = getattr(obj, "py_func", None)
    if py_func is not None:
        obj = py_func
    if isinstance(obj, pytypes.FunctionType):
        _fingerprint_code(obj.__code__, h)
        _fingerprint(obj.__defaults__ or (), h, seen, depth + 1)
        for k, v in sorted((obj.__kwdefaults__ or {}).items()):
            h.update(k.encode())
            _fingerprint(v, h, seen, depth + 1)
        for cell in obj.__closure__ or ():
            try:
                _fingerprint(cell.cell_contents, h, seen, depth + 1)
            except ValueError:  # empty cell
                h.update(b"<empty>")
        for name in _global_names(obj.__code__):
            if name in obj.__globals__:
                h.update(name.encode())
                _fingerprint(obj.__globals__[name], h, seen, depth + 1)
        return
    mod = getattr(obj, "__module__", None)
    qual = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if mod and qual:
        h.update(f"{mod}.{qual}".encode())
    else:
        h.update(f"{type(obj).__qualname__}@{id(obj)}".encode())


def _global_names(code):
    import types as pytypes
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, pytypes.CodeType):
            names |= _global_names(c)
    return sorted(names)


def _fingerprint_code(code, h):
    import types as pytypes
    h.update(code.co_code)
    h.update(repr(code.co_names).encode())
    h.update(repr(code.co_varnames).encode())
    for c in code.co_consts:
        if isinstance(c, pytypes.CodeType):
            _fingerprint_code(c, h)
        else:
            h.update(repr(c).encode())


def cache_key(py_func, arg_types, wrt, options, target):
    """Key of one adjoint: kadj's own sources, the kernel (bytecode, closure, the
    globals and jitted callees it reads), argument types, wrt, jit options and the
    user-registered derivative rules."""
    from . import rules
    h = hashlib.sha256()
    parts = [CACHE_VERSION, _kadj_hash(), target, str(py_func.__module__),
             py_func.__qualname__, py_func.__code__.co_filename,
             repr(tuple(str(t) for t in arg_types)), repr(wrt),
             repr(sorted((k, repr(v)) for k, v in options.items()))]
    h.update("\n".join(parts).encode())
    _fingerprint(py_func, h, set())
    for key in sorted(rules.CUSTOM, key=repr):
        h.update(repr(key).encode())
        _fingerprint(rules.CUSTOM[key], h, set())
    return h.hexdigest()[:24]


def _files_fresh(files):
    for path, mtime in files:
        try:
            if os.path.getmtime(path) != mtime:
                return False
        except OSError:
            return False
    return True


def load_cached(key):
    """(plan, source, module) from the disk cache, or None."""
    d = cache_dir()
    meta_path = os.path.join(d, f"adj_{key}.json")
    src_path = os.path.join(d, f"adj_{key}.py")
    if not (os.path.exists(meta_path) and os.path.exists(src_path)):
        return None
    try:
        with open(meta_path) as fh:
            meta = json.load(fh)
        if not _files_fresh(meta["files"]):
            return None
        plan = AdjointPlan(kernel_name=meta["kernel_name"], arg_names=tuple(meta["arg_names"]),
                           adjoint_args=tuple(meta["adjoint_args"]),
                           written=frozenset(meta["written"]), read=frozenset(meta["read"]),
                           returns_value=meta["returns_value"])
        with open(src_path) as fh:
            text = fh.read()
        if meta.get("sha256") != hashlib.sha256(text.encode()).hexdigest():
            return None  # damaged or partly written: regenerate
        module = _import(src_path, key)
        source = text[len(_HEADER):]
        return plan, source, getattr(module, meta["function"]), meta.get("report", "")
    except Exception:  # a damaged cache entry is regenerated
        return None


def _import(path, key):
    name = f"kadj_adjoint_{key}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def build(adj, plan, key, source_files, report=""):
    """Python function object for the generated adjoint (disk-backed when possible).

    Returns (function, disk_cached)."""
    extra = set(adj.namespace) - _STANDARD
    if not extra:
        try:
            d = cache_dir()
            os.makedirs(d, exist_ok=True)
            src_path = os.path.join(d, f"adj_{key}.py")
            tmp = src_path + f".{os.getpid()}.tmp"
            with open(tmp, "w") as fh:
                fh.write(_HEADER + adj.source)
            os.replace(tmp, src_path)
            meta = {"kernel_name": plan.kernel_name, "arg_names": list(plan.arg_names),
                    "adjoint_args": list(plan.adjoint_args), "written": sorted(plan.written),
                    "read": sorted(plan.read), "returns_value": plan.returns_value,
                    "function": adj.name, "report": report,
                    "sha256": hashlib.sha256((_HEADER + adj.source).encode()).hexdigest(),
                    "files": [[f, os.path.getmtime(f)] for f in sorted(source_files)
                              if os.path.exists(f)]}
            tmp = os.path.join(d, f"adj_{key}.json.{os.getpid()}.tmp")
            with open(tmp, "w") as fh:
                json.dump(meta, fh)
            os.replace(tmp, os.path.join(d, f"adj_{key}.json"))
            module = _import(src_path, key)
            return getattr(module, adj.name), True
        except OSError:
            pass
    ns = dict(adj.namespace)
    code = compile(adj.source, f"<kadj adjoint of {plan.kernel_name}>", "exec")
    exec(code, ns)
    return ns[adj.name], False
