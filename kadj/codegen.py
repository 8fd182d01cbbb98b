"""Codegen: the adjoint's Python source -> a compiled numba function, cached on disk.

The source written by :mod:`kadj.reverse` is saved as a module file in kadj's cache
directory (``$KADJ_CACHE_DIR``, default ``~/.cache/kadj``) next to a JSON record of the
adjoint's plan, the SHA-256 of the module and the source files it came from, then
executed and compiled by numba with the user's own jit options and numba's on-disk cache
(``__pycache__`` inside the same directory, or ``$NUMBA_CACHE_DIR`` when that is set).
A second process with unchanged dependencies finds both: it neither regenerates the
adjoint nor recompiles it.

The key (:mod:`kadj.cachekey`) covers the kernel's code and every value it reads,
followed through modules and jitted callees, the registered derivative rules, the
argument types, ``wrt`` and jit options, kadj's sources and the versions of Python,
NumPy, Numba and llvmlite, and the numba configuration that changes generated code; the
typed IR is checked against it before an entry is written.

Trust model (:mod:`kadj.cachedir`): the directory is trusted as the user's own files
are, like ``__pycache__``, since its entries are code.  kadj makes it private (0700),
refuses one owned by another user or writable by group or others, writes entries with
exclusive creation under unpredictable names and renames them into place, and never
reads an entry through a symbolic link or one that is not the user's own.  An entry is
used only when the key matches, the directory and both files pass these checks, the
module's SHA-256 (a damage check, not a signature) matches the record and the recorded
source files are unchanged, or changed only outside the kernel's functions, whose lines
may have moved (:mod:`kadj.cache_lines`; the record is then rewritten with the moves and
the files' new modification times, so that later loads read no source); anything else
regenerates it.

An adjoint of several functions (a CUDA kernel's scatter, gather and zero forms) is one
entry too (:func:`build_many`, :func:`load_many`): the module is the functions' sources
one after the other, and the record keeps each function's span of the module and the
data the compiled adjoint needs (its report).

Every source begins with its own imports (:mod:`kadj.source_header`): the module file
is exactly the source :meth:`adjoint_source` shows.

Adjoints that reference objects a module file cannot name (custom derivative rules,
global arrays), or whose key is process-local, are kept in memory only.  Without a
usable directory kadj compiles without a disk cache and says so once per cause
(:class:`kadj.cachedir.CacheWarning`); ``KADJ_DISABLE_CACHE=1`` turns the cache off.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys

from . import cache_lines, cachedir, ssa_free
from .cachekey import CACHE_VERSION, cache_key, release, uncovered  # noqa: F401
from .cachedir import CacheWarning  # noqa: F401  (re-exported)
from .plan import AdjointPlan

def cache_dir():
    """The configured cache directory (whether or not kadj may use it)."""
    return cachedir.configured_dir()


def _stale_files(files):
    """{path: modification time now (None: gone)} of the recorded source files whose
    modification time changed."""
    stale = {}
    for path, mtime in files:
        try:
            now = os.path.getmtime(path)
        except OSError:
            stale[path] = None
            continue
        if now != mtime:
            stale[path] = now
    return stale


def _same(text):
    return text


def _disk_key(key):
    return bool(key) and not key.startswith("mem-")


def _verified_entry(key, *required):
    """(metadata, source text, module) of the disk-cache entry ``key`` when it passes
    every check (format, key, the source's hash, the kernel's files unchanged, the
    ``required`` metadata fields present), its module run; None otherwise: a damaged,
    partly written, renamed or out-of-date entry is regenerated."""
    if not _disk_key(key):
        return None
    d = cachedir.private_dir()
    if d is None:
        return None
    src_path = os.path.join(d, f"adj_{key}.py")
    raw_meta = cachedir.read_entry(os.path.join(d, f"adj_{key}.json"))
    raw_src = cachedir.read_entry(src_path) if raw_meta is not None else None
    if raw_src is None:
        return None
    meta = json.loads(raw_meta.decode())
    if meta.get("format") != CACHE_VERSION or meta.get("key") != key or \
            any(f not in meta for f in required) or \
            meta.get("sha256") != hashlib.sha256(raw_src).hexdigest():
        return None
    text = raw_src.decode()
    relocate = cache_lines.stored(meta) or _same
    stale = _stale_files(meta["files"])
    if stale:  # the kernel's lines may only have moved (kadj.cache_lines)
        found = cache_lines.relocation(meta, key, stale)
        if found is None or cache_lines.checked(found[0], text) is None:
            return None
        relocate = found[0]
        if None not in stale.values():   # later loads: the stored moves, no sources read
            _rewrite_record(d, key, cache_lines.rewritten(meta, found[1], stale))
    module = _exec_module(src_path, key, text)
    release(key)
    return meta, text, module, relocate


def _rewrite_record(d, key, meta):
    """Replace the record of entry ``key`` (its module file, and so numba's cache of
    it, stay as they are); a directory kadj cannot write to keeps the old record."""
    try:
        cachedir.write_entry(d, f"adj_{key}.json", json.dumps(meta).encode())
    except OSError:
        pass


def load_cached(key):
    """(plan, source, function, report) from the disk cache, or None."""
    try:
        entry = _verified_entry(key)
        if entry is None:
            return None
        meta, text, module, relocate = entry
        return _plan_of(meta), relocate(text), getattr(module, meta["function"]), \
            meta.get("report", "")
    except Exception:  # a damaged cache entry is regenerated
        return None


def _exec_module(path, key, text):
    """Run the verified ``text`` as the module at ``path`` (never re-reading the file,
    and writing no bytecode cache beside it)."""
    name = f"kadj_adjoint_{key}"
    spec = importlib.util.spec_from_loader(name, loader=None, origin=path)
    module = importlib.util.module_from_spec(spec)
    module.__file__ = path
    code = compile(text, path, "exec", dont_inherit=True)
    sys.modules[name] = module
    exec(code, module.__dict__)
    return module


def build(adj, plan, key, source_files, report="", func_ir=None):
    """Python function object for the generated adjoint, written to the disk cache when
    the key is disk-safe, ``func_ir`` (the kernel's typed IR) holds no value the key
    missed, and the cache directory is usable.

    Returns (function, disk_cached)."""
    lines = cache_lines.record(key, source_files)  # before uncovered() drops the walk
    missed = uncovered(key, func_ir) if func_ir is not None else ["no typed IR given"]
    if not adj.namespace and _disk_key(key) and not missed:
        d = cachedir.private_dir()
        if d is not None:
            try:
                return _write(d, adj, plan, key, source_files, report, lines), True
            except OSError as exc:
                cachedir.warn_once(
                    f"kadj cannot write to its cache directory {d} ({exc.strerror or exc}); "
                    "adjoints are compiled without a disk cache. Make the directory "
                    "writable, set KADJ_CACHE_DIR to another directory of your own, or "
                    "KADJ_DISABLE_CACHE=1.")
    ns = dict(adj.namespace)
    code = compile(adj.source, f"<kadj adjoint of {plan.kernel_name}>", "exec")
    exec(code, ns)
    return ns[adj.name], False


def _write(d, adj, plan, key, source_files, report, lines):
    text = adj.source
    data = text.encode()
    cachedir.write_entry(d, f"adj_{key}.py", data)
    meta = {"format": CACHE_VERSION, "key": key, "kernel_name": plan.kernel_name,
            "arg_names": list(plan.arg_names), "adjoint_args": list(plan.adjoint_args),
            "written": sorted(plan.written), "read": sorted(plan.read),
            "returns_value": plan.returns_value, "forward_raises": plan.forward_raises,
            "function": adj.name, "report": report,
            "sha256": hashlib.sha256(data).hexdigest(),
            "files": [[f, os.path.getmtime(f)] for f in sorted(source_files)
                      if os.path.exists(f)],
            "kernel_lines": lines}
    cachedir.write_entry(d, f"adj_{key}.json", json.dumps(meta).encode())
    module = _exec_module(os.path.join(d, f"adj_{key}.py"), key, text)
    return getattr(module, adj.name)


def jit(pyfn, disk_cached, options):
    """``(jitted, cached)``: ``pyfn`` compiled lazily by numba with ``options``, with
    numba's on-disk cache when the adjoint is disk-cached and numba can write a cache.
    A serial adjoint compiles without numba's SSA reconstruction where that cannot
    change what it computes (:mod:`kadj.ssa_free`)."""
    # called from Python (its dispatcher) and from jitted code, never through a C
    # function pointer: no C-callable wrapper to compile (about 6% of a gallery
    # adjoint's compile)
    options = dict(ssa_free.options_for(options), no_cfunc_wrapper=True)
    if disk_cached:
        return cachedir.njit_cached(pyfn, options)
    from numba import njit
    return njit(**options)(pyfn), False


def source_files(func_ir):
    """The source files a typed IR came from (their changes invalidate an entry)."""
    return {loc.filename for blk in func_ir.blocks.values() for s in blk.body
            for loc in [getattr(s, "loc", None)]
            if loc is not None and loc.filename}


# ---- entries of several functions (a kernel's adjoint in several forms) ----------------
def _to_json(v):
    """JSON-ready form of ``v`` that keeps tuples, sets and non-string keys."""
    if isinstance(v, dict):
        if all(isinstance(k, str) for k in v):
            return {k: _to_json(x) for k, x in v.items()}
        return {"__items__": [[_to_json(k), _to_json(x)] for k, x in v.items()]}
    if isinstance(v, tuple):
        return {"__tuple__": [_to_json(x) for x in v]}
    if isinstance(v, (set, frozenset)):
        return {"__frozenset__": sorted((_to_json(x) for x in v), key=json.dumps)}
    if isinstance(v, list):
        return [_to_json(x) for x in v]
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    raise TypeError(f"{type(v).__name__} cannot be kept in a cache entry")


def _from_json(v):
    if isinstance(v, list):
        return [_from_json(x) for x in v]
    if isinstance(v, dict):
        if "__tuple__" in v:
            return tuple(_from_json(x) for x in v["__tuple__"])
        if "__frozenset__" in v:
            return frozenset(_from_json(x) for x in v["__frozenset__"])
        if "__items__" in v:
            return {_from_json(k): _from_json(x) for k, x in v["__items__"]}
        return {k: _from_json(x) for k, x in v.items()}
    return v


def build_many(sources, plan, key, source_files, extra, func_ir=None):
    """Python functions for the adjoint ``sources`` (:class:`kadj.reverse.AdjointSource`,
    distinct names), written to the disk cache as one entry, with ``extra`` (JSON-ready
    data: tuples, sets, dicts...) beside them, when the key is disk-safe, ``func_ir``
    holds no value the key missed, no source needs an object without an importable name
    and the cache directory is usable.

    Returns ({name: function}, disk_cached)."""
    lines = cache_lines.record(key, source_files)  # before uncovered() drops the walk
    missed = uncovered(key, func_ir) if func_ir is not None else ["no typed IR given"]
    supplied = any(s.namespace for s in sources)
    if not supplied and _disk_key(key) and not missed:
        d = cachedir.private_dir()
        if d is not None:
            try:
                return _write_many(d, sources, plan, key, source_files, extra, lines), True
            except (OSError, TypeError) as exc:
                if isinstance(exc, OSError):
                    cachedir.warn_once(
                        f"kadj cannot write to its cache directory {d} "
                        f"({exc.strerror or exc}); adjoints are compiled without a disk "
                        "cache. Make the directory writable, set KADJ_CACHE_DIR to "
                        "another directory of your own, or KADJ_DISABLE_CACHE=1.")
    out = {}
    for s in sources:
        ns = dict(s.namespace)
        exec(compile(s.source, f"<kadj adjoint of {plan.kernel_name}>", "exec"), ns)
        out[s.name] = ns[s.name]
    return out, False


def _plan_meta(plan):
    return {"kernel_name": plan.kernel_name, "arg_names": list(plan.arg_names),
            "adjoint_args": list(plan.adjoint_args), "written": sorted(plan.written),
            "read": sorted(plan.read), "returns_value": plan.returns_value,
            "forward_raises": plan.forward_raises}


def _plan_of(meta):
    return AdjointPlan(kernel_name=meta["kernel_name"], arg_names=tuple(meta["arg_names"]),
                       adjoint_args=tuple(meta["adjoint_args"]),
                       written=frozenset(meta["written"]), read=frozenset(meta["read"]),
                       returns_value=meta["returns_value"],
                       forward_raises=bool(meta.get("forward_raises", False)))


def _write_many(d, sources, plan, key, source_files, extra, lines):
    extra_json = _to_json(extra)  # before writing: a value JSON cannot keep is refused
    text, spans = "", []
    for s in sources:
        spans.append([s.name, len(text), len(text) + len(s.source)])
        text += s.source + "\n\n"
    data = text.encode()
    cachedir.write_entry(d, f"adj_{key}.py", data)
    meta = dict(_plan_meta(plan), format=CACHE_VERSION, key=key, functions=spans,
                extra=extra_json, sha256=hashlib.sha256(data).hexdigest(),
                files=[[f, os.path.getmtime(f)] for f in sorted(source_files)
                       if os.path.exists(f)],
                kernel_lines=lines)
    cachedir.write_entry(d, f"adj_{key}.json", json.dumps(meta).encode())
    module = _exec_module(os.path.join(d, f"adj_{key}.py"), key, text)
    return {name: getattr(module, name) for name, _, _ in spans}


def load_many(key):
    """(plan, {name: (source, function)}, extra) of an entry written by
    :func:`build_many`, or None (no entry, or one that fails a check)."""
    try:
        entry = _verified_entry(key, "functions")
        if entry is None:
            return None
        meta, text, module, relocate = entry
        functions = {name: (relocate(text[a:b]), getattr(module, name))
                     for name, a, b in meta["functions"]}
        return _plan_of(meta), functions, _from_json(meta["extra"])
    except Exception:  # a damaged cache entry is regenerated
        return None
