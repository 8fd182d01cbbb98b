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


def _memoising(original, kinds):
    def resolve_call(self, fnty, pos_args, kw_args):
        if not getattr(_state, "depth", 0) or not isinstance(fnty, kinds):
            return original(self, fnty, pos_args, kw_args)
        try:
            key = (fnty, tuple(pos_args), tuple(sorted(kw_args.items())))
            memo = self.__dict__.setdefault("_kadj_resolved", {})
            if key in memo:
                return memo[key]
        except TypeError:           # an unhashable type: resolve it as numba does
            return original(self, fnty, pos_args, kw_args)
        sig = original(self, fnty, pos_args, kw_args)
        if sig is not None:
            memo[key] = sig
        return sig

    resolve_call.__wrapped__ = original
    resolve_call.__doc__ = original.__doc__
    return resolve_call


@contextlib.contextmanager
def memoised():
    """Within this block, on this thread, numba's type inference remembers each
    call's resolution per function being typed."""
    _install()
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        yield
    finally:
        _state.depth -= 1
