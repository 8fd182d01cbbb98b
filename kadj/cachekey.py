"""The disk-cache key of an adjoint, and the check that the key covers the typed IR.

The key is a SHA-256 over everything the generated adjoint depends on:

* kadj's own sources and version, Python's, NumPy's, Numba's and llvmlite's versions,
  and the Numba configuration values that change generated code (``BOUNDSCHECK``,
  ``OPT``, vectorisation, SVML, CPU name and features, ...);
* the target, the kernel's module, qualified name and file, the argument types,
  ``wrt`` and the jit options (``fastmath``, ``error_model``, ...);
* the kernel's Python function, walked by :class:`Fingerprint`: its bytecode,
  constants, defaults and closure values, and every global the code names, followed
  into modules attribute by attribute (``consts.SCALE``, ``helpers.smooth``) and into
  jitted callees (their own bytecode, globals and options) recursively;
* every derivative rule registered with :func:`kadj.register_adjoint`.

Values are keyed by content (numbers, strings, tuples, arrays, enums, numba types);
objects of NumPy, Numba, the standard library and kadj by name (their versions are in
the key).  An object the walk cannot describe by content (an instance of a user class,
a list, ...) makes the key *process-local* (prefix ``mem-``): that adjoint is kept in
memory only, never written to or read from disk.

After typing, :func:`uncovered` checks the other direction: every value Numba froze into
the typed IR (globals, closure variables, module attributes, non-literal constants) must
be one the walk fed into the key, or a versioned library object; otherwise the adjoint is
not written to disk.  A stale adjoint would need a dependency that both checks miss.
"""
from __future__ import annotations

import builtins
import enum
import hashlib
import os
import sys
import threading
import types as pytypes

import numpy as np
from numba.core import types as nbtypes

CACHE_VERSION = "kadj-adjoint-v2"

# Objects of these packages are named, not walked: their versions are in the key.
_VERSIONED = frozenset({"builtins", "math", "cmath", "operator", "_operator", "numpy",
                        "numba", "llvmlite", "kadj"})
_PRIMITIVE = (bool, int, float, complex, str, bytes, type(None))
# numba.config values that change the code numba generates or how kadj types a kernel
_NUMBA_CONFIG = ("BOUNDSCHECK", "OPT", "LOOP_VECTORIZE", "SLP_VECTORIZE", "ENABLE_AVX",
                 "CPU_NAME", "CPU_FEATURES", "DISABLE_INTEL_SVML", "USING_SVML",
                 "DEBUGINFO_DEFAULT", "EXTEND_VARIABLE_LIFETIMES", "DISABLE_JIT",
                 "ENABLE_CUDASIM", "CUDA_DEBUGINFO_DEFAULT", "CUDA_DEFAULT_PTX_CC",
                 "FORCE_CUDA_CC", "PARFOR_MAX_TUPLE_SIZE", "LLVM_REFPRUNE_PASS",
                 "LLVM_REFPRUNE_FLAGS")
_MAX_DEPTH = 40
_RECENT = {}          # key -> Fingerprint, until the adjoint is built (see uncovered)
_RECENT_MAX = 64
_RECENT_LOCK = threading.Lock()


def _root(name):
    return (name or "").split(".", 1)[0]


def canonical(value):
    """A deterministic text for option values (sets sorted, dicts by key)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{canonical(k)}: {canonical(v)}"
                               for k, v in sorted(value.items(), key=lambda kv: repr(kv[0]))) + "}"
    if isinstance(value, (set, frozenset)):
        return "{" + ", ".join(sorted(canonical(v) for v in value)) + "}"
    if isinstance(value, (list, tuple)):
        return "(" + ", ".join(canonical(v) for v in value) + ")"
    return f"{type(value).__name__}:{value!r}"


class Fingerprint:
    """SHA-256 of a kernel and everything it reads; see the module docstring."""

    def __init__(self):
        self.hash = hashlib.sha256()
        self.kept = {}         # id -> object fed into the hash (kept alive: ids stay unique)
        self.unstable = []     # what the hash could only name by identity
        self._seen = {}        # id (or (module id, name)) -> order of first visit

    def text(self, *parts):
        for p in parts:
            self.hash.update(str(p).encode())
            self.hash.update(b"\x00")

    def hexdigest(self):
        return self.hash.hexdigest()

    def add(self, obj, names=(), depth=0):
        """Feed ``obj`` in; ``names`` are the attribute names the code that reached
        ``obj`` uses (followed when ``obj`` is a module)."""
        self.kept[id(obj)] = obj
        if depth > _MAX_DEPTH:
            self._unstable(obj, "nested too deeply")
            return
        if isinstance(obj, _PRIMITIVE):
            self.text("v", type(obj).__name__, repr(obj))
            return
        if isinstance(obj, np.generic):
            self.text("np", obj.dtype.str, obj.tobytes().hex())
            return
        if isinstance(obj, pytypes.ModuleType):
            self._module(obj, names, depth)
            return
        key = id(obj)
        if key in self._seen:
            self.text("seen", self._seen[key])
            return
        self._seen[key] = len(self._seen)
        if isinstance(obj, np.ndarray):
            if obj.dtype.hasobject:
                self._unstable(obj, "object array")
                return
            self.text("array", obj.dtype.str, obj.shape)
            self.hash.update(np.ascontiguousarray(obj).tobytes())
            return
        if isinstance(obj, tuple):
            self._tuple(obj, names, depth)
            return
        if isinstance(obj, enum.Enum):
            self.add(type(obj), names, depth + 1)
            self.text("member", obj.name)
            return
        py_func = getattr(obj, "py_func", None)
        if isinstance(py_func, pytypes.FunctionType):  # a numba dispatcher
            self.text("dispatcher", canonical(getattr(obj, "targetoptions", None) or {}))
            self.add(py_func, names, depth + 1)
            return
        if isinstance(obj, nbtypes.Type) and _root(type(obj).__module__) == "numba":
            self.text("nbtype", obj.name)
            return
        module = getattr(obj, "__module__", None)
        if isinstance(obj, pytypes.FunctionType) and _root(module) not in _VERSIONED:
            self._function(obj, depth)
            return
        if isinstance(obj, type) and issubclass(obj, enum.Enum):
            self.text("enum", obj.__module__, obj.__qualname__)
            for member in obj:
                self.kept[id(member)] = member
                self.text(member.name)
                self.add(member.value, names, depth + 1)
            return
        if isinstance(obj, type) and issubclass(obj, tuple) and hasattr(obj, "_fields"):
            self.text("namedtuple", obj.__module__, obj.__qualname__, obj._fields)
            self.add(tuple(getattr(obj, "_field_defaults", {}).items()), names, depth + 1)
            return
        qual = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
        if _root(module) in _VERSIONED and isinstance(qual, str):
            self.text("named", module, qual)
            return
        self._unstable(obj, "no stable description")

    # ---- parts ---------------------------------------------------------------------
    def _unstable(self, obj, why):
        self.unstable.append(f"{type(obj).__qualname__} ({why})")
        self.text("identity", type(obj).__qualname__, id(obj))

    def _module(self, mod, names, depth):
        self.text("module", mod.__name__)
        attrs = vars(mod)  # no module __getattr__: it may import or warn
        for name in sorted(names):
            if name in attrs and (id(mod), name) not in self._seen:
                self._seen[(id(mod), name)] = len(self._seen)
                self.text("attr", name)
                self.add(attrs[name], names, depth + 1)

    def _tuple(self, obj, names, depth):
        cls = type(obj)
        if cls is not tuple:
            self.text("tuple-type", cls.__module__, cls.__qualname__,
                      getattr(cls, "_fields", None))
        self.text("(", len(obj))
        for x in obj:
            self.add(x, names, depth + 1)
        self.text(")")

    def _function(self, fn, depth):
        code = fn.__code__
        names = _code_names(code)
        self.text("function", fn.__module__, fn.__qualname__)
        self._code(code)
        self.add(fn.__defaults__ or (), names, depth + 1)
        for k, v in sorted((fn.__kwdefaults__ or {}).items()):
            self.text("kwdefault", k)
            self.add(v, names, depth + 1)
        for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
            self.text("cell", name)
            try:
                self.add(cell.cell_contents, names, depth + 1)
            except ValueError:  # an empty cell
                self.text("empty")
        glb = fn.__globals__
        bt = glb.get("__builtins__", builtins)
        bt = vars(bt) if isinstance(bt, pytypes.ModuleType) else bt
        for name in sorted(names):
            if name in glb:
                self.text("global", name)
                self.add(glb[name], names, depth + 1)
            elif name in bt:
                self.text("builtin", name)
                self.add(bt[name], (), depth + 1)

    def _code(self, code):
        self.text(code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount,
                  code.co_flags, code.co_names, code.co_varnames, code.co_freevars,
                  code.co_cellvars)
        self.hash.update(code.co_code)
        for c in code.co_consts:
            if isinstance(c, pytypes.CodeType):
                self._code(c)
            elif isinstance(c, frozenset):
                self.text("frozenset", sorted(repr(x) for x in c))
            else:
                self.text(type(c).__name__, repr(c))


def _code_names(code):
    """Every name the code (and the code nested in it) loads as a global or attribute."""
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, pytypes.CodeType):
            names |= _code_names(c)
    return frozenset(names)


_SELF_HASH = None


def kadj_hash():
    """Hash of kadj's own sources: a new kadj never loads an old kadj's adjoints."""
    global _SELF_HASH
    if _SELF_HASH is None:
        h = hashlib.sha256()
        here = os.path.dirname(os.path.abspath(__file__))
        for root, dirs, files in os.walk(here):
            dirs.sort()
            for f in sorted(files):
                if f.endswith(".py"):
                    h.update(os.path.relpath(os.path.join(root, f), here).encode())
                    with open(os.path.join(root, f), "rb") as fh:
                        h.update(fh.read())
        _SELF_HASH = h.hexdigest()[:16]
    return _SELF_HASH


def environment():
    """Versions and numba configuration the generated and compiled adjoint depend on."""
    import llvmlite
    import numba
    import numpy

    version = getattr(sys.modules.get(__package__), "__version__", "?")  # kadj's
    parts = [f"python={sys.version}", f"tag={sys.implementation.cache_tag}",
             f"kadj={version}", f"kadj-src={kadj_hash()}",
             f"numpy={numpy.__version__}", f"numba={numba.__version__}",
             f"llvmlite={llvmlite.__version__}"]
    parts += [f"{name}={value}" for name, value in zip(_NUMBA_CONFIG, numba_config())]
    return parts


def numba_config():
    """The values of the numba configuration that changes generated code, as numba's
    next compilation will read them: numba reads its environment variables again only
    when it compiles, so ``numba.config`` can lag behind a variable set since."""
    import numba
    from numba.core import config
    config.reload_config()
    return tuple(str(getattr(numba.config, name, None)) for name in _NUMBA_CONFIG)


def cache_key(py_func, arg_types, wrt, options, target):
    """The key of one adjoint (see the module docstring); ``mem-...`` when it can only be
    trusted within this process."""
    from . import rules
    fp = Fingerprint()
    try:
        fp.text(CACHE_VERSION, *environment())
        fp.text(target, py_func.__module__, py_func.__qualname__,
                py_func.__code__.co_filename, tuple(str(t) for t in arg_types), repr(wrt),
                canonical(options))
        fp.add(py_func)
        entries = []
        for fn, vjp in list(rules.CUSTOM.items()):
            one = Fingerprint()
            one.add(fn)
            one.add(vjp)
            entries.append(one.hexdigest())
            fp.kept.update(one.kept)
            fp.unstable += one.unstable
        fp.text("rules", *sorted(entries))
    except Exception as exc:  # the cache never stops a kernel from being differentiated
        fp.unstable.append(f"the key could not be computed ({exc!r})")
    key = ("mem-" if fp.unstable else "") + fp.hexdigest()[:32]
    with _RECENT_LOCK:
        _RECENT[key] = fp
        while len(_RECENT) > _RECENT_MAX:
            _RECENT.pop(next(iter(_RECENT)))
    return key


def fingerprint_objects(key):
    """The objects the walk of ``key`` fed into it (empty once released)."""
    with _RECENT_LOCK:
        fp = _RECENT.get(key)
    return list(fp.kept.values()) if fp is not None else []


def release(key):
    """Forget the fingerprint kept for :func:`uncovered` (the adjoint came from disk)."""
    with _RECENT_LOCK:
        _RECENT.pop(key, None)


def uncovered(key, func_ir):
    """Descriptions of the values frozen into ``func_ir`` that the key of ``key`` did not
    take in (empty when the key covers the typed IR)."""
    with _RECENT_LOCK:
        fp = _RECENT.pop(key, None)
    if fp is None:
        return ["the key's fingerprint is no longer known"]
    missing = []
    try:
        for what, value in _frozen_values(func_ir):
            if not _covered(value, fp):
                missing.append(f"{what} ({type(value).__qualname__})")
    except Exception as exc:  # an IR kadj cannot inspect: not cached, never an error
        missing.append(f"the typed IR could not be inspected ({exc!r})")
    return missing


def _covered(value, fp):
    if fp.kept.get(id(value)) is value:
        return True
    if isinstance(value, pytypes.ModuleType):
        # a module of a versioned package, or one built by kadj (the CUDA simulator's
        # typing shim, whose content kadj's own sources define)
        return _root(value.__name__) in _VERSIONED or (
            type(value) is not pytypes.ModuleType and
            _root(type(value).__module__) == "kadj")
    if callable(value):  # a function or class of a versioned package, by name
        mod = getattr(value, "__module__", None)
        qual = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
        if _root(mod) in _VERSIONED and isinstance(qual, str) and \
                getattr(value, "py_func", None) is None:
            return True
    if isinstance(value, nbtypes.Type) and _root(type(value).__module__) == "numba":
        return True
    if isinstance(value, property):  # cuda.threadIdx.x: a descriptor of a numba stub
        return _root(getattr(value.fget, "__module__", None)) in _VERSIONED
    return _same_function(getattr(value, "py_func", None), fp)


def _same_function(fn, fp):
    """Is ``fn`` the CUDA simulator's typing clone (:func:`kadj.cuda.shim.clone_for_typing`)
    of a function the key took in?"""
    if not isinstance(fn, pytypes.FunctionType):
        return False
    return any(isinstance(kept, pytypes.FunctionType) and _typing_clone(fn, kept)
               for kept in list(fp.kept.values()))


def _typing_clone(fn, orig, depth=0):
    """``fn`` has ``orig``'s code, defaults and closure cells, and every global its code
    names is ``orig``'s, or kadj's simulator shim in place of ``numba.cuda``, or the
    typing clone of ``orig``'s device function."""
    if fn.__code__ is not orig.__code__ or fn.__defaults__ is not orig.__defaults__ or \
            fn.__closure__ is not orig.__closure__ or depth > _MAX_DEPTH:
        return False
    g, og = fn.__globals__, orig.__globals__
    for name in _code_names(fn.__code__):
        a, b = g.get(name), og.get(name)
        if a is b:
            continue
        if isinstance(a, pytypes.ModuleType) and type(a) is not pytypes.ModuleType and \
                _root(type(a).__module__) == "kadj":
            continue  # the shim
        pa, pb = getattr(a, "py_func", None), getattr(b, "py_func", None)
        if isinstance(pa, pytypes.FunctionType) and isinstance(pb, pytypes.FunctionType) \
                and _typing_clone(pa, pb, depth + 1):
            continue
        return False
    return True


def _literal(value):
    if isinstance(value, _PRIMITIVE):
        return True
    if type(value) is tuple:
        return all(_literal(v) for v in value)
    return type(value) is slice


def _frozen_values(func_ir):
    """(description, value) of every Python object the typed IR holds by value."""
    from numba.core import ir

    from .frontend import resolve_value
    for block in func_ir.blocks.values():
        for st in block.body:
            if not isinstance(st, ir.Assign):
                continue
            v = st.value
            if isinstance(v, (ir.Global, ir.FreeVar)):
                yield f"global '{v.name}'", v.value
            elif isinstance(v, ir.Const) and not _literal(v.value):
                yield "constant", v.value
            elif isinstance(v, ir.Expr) and v.op == "getattr":
                try:
                    base = resolve_value(func_ir, v.value)
                except (LookupError, AttributeError, KeyError):
                    continue  # a runtime value (an argument, a local)
                try:
                    value = getattr(base, v.attr)
                except Exception:  # numba resolves it some other way: not frozen here
                    continue
                yield f"attribute '{v.attr}'", value
