"""numba's type inference, each call's resolution remembered within one function.

numba types a function by propagating its constraints round after round until no
type changes, and every round resolves every call again.  In kadj's adjoints the same
(function, argument types) pair is resolved about 13 times on average (3,074 of 3,315
resolutions of six gallery adjoints were repeats), each going through every template
of the operator or function (``a * b`` tries numba's NumPy ufunc rules before the
scalar ones).  Within :func:`memoised`, each type inferer remembers the signature it
resolved for a call of one of numba's function types (operators, ``math``, NumPy
functions, methods) with given argument types and answers a repeat from it: the
answer is the same, since resolution depends only on the function and the argument
types (literal values included, as part of the types).  Calls of jitted functions,
failures and exceptions are resolved every time, as numba does.

numba's lowering then resolves every operator and call of numba's function types
once more (``a * b`` lowered asks ``Function.get_call_type`` for its signature anew),
and each function typed in a compile (a kernel, its adjoint, numba's overloads)
resolves the same pairs again.  Within :func:`memoised`, ``Function.get_call_type``
also answers a repeat of a (function type, typing context, argument types) it resolved
before, in this or an earlier block: 49,656 of 58,840 such resolutions were repeats
within one kernel's block while the 81 CPU gallery adjoints were generated and
compiled, and most of the rest repeat another kernel's (``float64 * float64``, an
array's ``getitem``).  Kept within each block only, the memo took the gallery's
compile from 20.3 to 19.3 s of CPU (one process, the memo off and on in turn per
kernel, best of 3; median per kernel -5 %); kept for the process, the gallery's
adjoints generated and compiled one after the other in one process (as a test suite
does) take 22.1-22.9 -> 20.2-20.3 s (two runs each way), and ``scripts/bench_compile.py
--repeat 3`` gives a median (generation + compile) / forward compile of 1.54x against
1.58x.  A type that gains templates later (a new ``@overload``) is a new function
type: its resolutions are not the old one's.  (The memo forgets everything past
:data:`_MEMO_LIMIT` entries and starts again.)

kadj types its kernels, generates and compiles its adjoints (a CPU adjoint's or
tangent's first call, a CUDA adjoint's ``compile_ptx``) inside :func:`memoised`;
numba's compilation of anything else is untouched (numba's inferer, and those targets
register, are wrapped once, and the memo is used only on a thread inside
:func:`memoised`).  Compiling six gallery adjoints
(horner, rk4_pendulum, softmax_f32, laplacian_9pt, heat_step, thomas_batched) took
7.2-7.3 s of CPU with the memo against 8.2-8.6 s without.
"""
from __future__ import annotations

import contextlib
import sys
import threading

__all__ = ["memoised"]

_state = threading.local()
_calls = {}          # (function type, typing context, arguments, keywords) -> signature
_MEMO_LIMIT = 100_000
_wrapped = set()     # the entries of _INFERERS wrapped so far
_lock = threading.Lock()


# (module of a TypeInferer class, module of its function types): numba's, and those a
# target adds with register() (the CUDA target: numba-cuda's own copy of the inferer)
_INFERERS = [("numba.core.typeinfer", "numba.core.types")]


def register(infer_module, types_module):
    """Memoise the ``TypeInferer`` of ``infer_module`` too (its function types in
    ``types_module``); a target whose compiler has its own copy of numba's inferer
    registers it."""
    with _lock:
        if (infer_module, types_module) in _INFERERS:
            return
        _INFERERS.append((infer_module, types_module))


def _install():
    """Wrap ``TypeInferer.resolve_call`` of the registered inferers (once each): a memo
    per inferer while :func:`memoised` is active on this thread, numba's own resolution
    otherwise.  An inferer whose package (``numba.cuda`` for numba-cuda's) is not
    imported yet is wrapped on a later call, once it is: a CPU-only user's first
    adjoint does not import numba-cuda (about 0.6 s)."""
    if len(_wrapped) == len(_INFERERS):
        return
    with _lock:
        for entry in _INFERERS:
            infer_module, types_module = entry
            if entry in _wrapped or infer_module.rsplit(".", 2)[0] not in sys.modules:
                continue
            _wrapped.add(entry)
            _wrap(infer_module, types_module)


def _wrap(infer_module, types_module):
    import importlib
    try:
        cls = importlib.import_module(infer_module).TypeInferer
        types = importlib.import_module(types_module)
        kinds = (types.Function, types.BoundFunction, types.NumberClass)
    except (ImportError, AttributeError):
        return                      # (not installed, or another layout: no memo there)
    original = getattr(cls, "resolve_call", None)
    if original is not None and not hasattr(original, "__wrapped__"):
        cls.resolve_call = _memoising(original, kinds)
    original = getattr(types.Function, "get_call_type", None)
    if original is not None and not hasattr(original, "__wrapped__"):
        types.Function.get_call_type = _remembering(original)


def _remembered(memo, key, resolve):
    """``memo[key]`` if there, else ``resolve()``, kept in ``memo`` unless None (a
    failure); a key numba's types cannot hash is resolved every time, as numba does."""
    try:
        k = key()
        if k in memo:
            return memo[k]
    except TypeError:
        return resolve()
    sig = resolve()
    if sig is not None:
        memo[k] = sig
    return sig


def _wrapping(original, wrapper):
    wrapper.__wrapped__ = original
    wrapper.__doc__ = original.__doc__
    return wrapper


def _memoising(original, kinds):
    def resolve_call(self, fnty, pos_args, kw_args):
        if not getattr(_state, "depth", 0) or not isinstance(fnty, kinds):
            return original(self, fnty, pos_args, kw_args)
        return _remembered(
            self.__dict__.setdefault("_kadj_resolved", {}),
            lambda: (fnty, tuple(pos_args), tuple(sorted(kw_args.items()))),
            lambda: original(self, fnty, pos_args, kw_args))

    return _wrapping(original, resolve_call)


def _remembering(original):
    """``Function.get_call_type`` answering, within :func:`memoised`, a repeat from the
    process's memo: numba's lowering resolves every operator and call of numba's
    function types again (``a * b`` lowered asks for its signature anew), as does the
    typing of each function and of each kernel."""
    def get_call_type(self, context, args, kws):
        if not getattr(_state, "depth", 0):
            return original(self, context, args, kws)
        if len(_calls) > _MEMO_LIMIT:
            _calls.clear()
        return _remembered(
            _calls, lambda: (self, context, tuple(args), tuple(sorted(kws.items()))),
            lambda: original(self, context, args, kws))

    return _wrapping(original, get_call_type)


@contextlib.contextmanager
def memoised():
    """Within this block, on this thread, numba's type inference remembers each
    call's resolution per function being typed, and answers each resolution of one of
    numba's function types (``types.Function``: operators, ``math``, NumPy functions)
    with given argument types, in the typing context it is asked in, that this or an
    earlier block made."""
    _install()
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        yield
    finally:
        _state.depth -= 1
