"""Repeated CUDA adjoint launches, checked cheaply: the CUDA counterpart of
:mod:`kadj.call_cache`.

The full checks of ``k.adjoint[config](*args)`` (binding, the compiled adjoint's
lookup by numba types, the launch dimensions, every buffer's type, shape, dtype and
memory) run on the first launch of every :func:`signature`: per argument its Python
type and, for an array (NumPy, numba device array, CuPy, the simulator's), its dtype,
number of dimensions and contiguity; for a number its type; and the launch
configuration.  When they pass, a :class:`LaunchFacts` is kept.  A later launch with
the same signature tests only what the values decide:

- shapes: each adjoint buffer against its argument (a scalar's buffer has shape (1,));
- memory: every adjoint buffer and every written argument lies in a byte range that
  meets no other argument's range (the same memory space; contiguous arrays only, so
  disjoint ranges mean disjoint elements).

:meth:`LaunchFacts.accepts` only accepts: anything else (a changed shape, ranges that
meet, a non-contiguous array) takes the full checks, which refuse with their own error
or accept.
"""
from __future__ import annotations

import numpy as np

from .. import arrays
from ..call_cache import MAX_SIGNATURES, _INT64, _NUMBERS, buffer_shapes, shapes_hold


_KINDS = {}   # array type -> kadj.arrays.kind (a type has one kind)


def _contiguous(a, k):
    if k == "host":
        f = a.flags
        return bool(f.c_contiguous or f.f_contiguous)
    if k == "simulator":
        f = a._ary.flags
        return bool(f.c_contiguous or f.f_contiguous)
    flags = getattr(a, "flags", None)
    if isinstance(flags, dict):              # numba's device arrays
        return bool(flags.get("C_CONTIGUOUS") or flags.get("F_CONTIGUOUS"))
    if flags is not None:                    # CuPy
        return bool(getattr(flags, "c_contiguous", False) or
                    getattr(flags, "f_contiguous", False))
    return False


def signature(args, config):
    """A key fixing every type-level fact of a launch, or None when an argument is
    neither an array of a kind kadj knows nor a plain number, or an array is not
    contiguous (those always take the full checks)."""
    try:
        hash(config)
        key = [config]
    except TypeError:           # a configuration with lists in it
        key = [repr(config)]
    for a in args:
        t = type(a)
        if t in _NUMBERS:
            key.append(t)
            continue
        if t is int:
            if not _INT64[0] <= a < _INT64[1]:
                return None
            key.append(t)
            continue
        k = _KINDS.get(t)
        if k is None:
            k = arrays.kind(a)
            if k is not None:
                _KINDS[t] = k
        if k is None or not _contiguous(a, k):
            return None
        key.append((t, np.dtype(a.dtype), a.ndim, a.flags.num if k == "host" else 0))
    return tuple(key)


class LaunchFacts:
    """What a checked launch with one :func:`signature` leaves to test, built from the
    compiled adjoint ``comp`` and the launch's positional ``args`` (forward arguments,
    then adjoint buffers in slot order) once the full checks passed."""

    __slots__ = ("comp", "nargs", "same_shape", "scalar_slots", "guarded", "others",
                 "kinds")

    def __init__(self, comp, args):
        plan = comp.plan
        n = len(plan.arg_names)
        self.comp = comp
        self.nargs = len(args)
        self.same_shape, self.scalar_slots = buffer_shapes(plan, args, arrays.is_array)
        is_arr = [arrays.is_array(a) for a in args]
        self.guarded = tuple(p for p in range(n) if p in plan.written and is_arr[p]) + \
            tuple(range(n, len(args)))
        self.others = tuple(p for p in range(n) if p not in self.guarded and is_arr[p])
        self.kinds = {p: arrays.kind(args[p]) for p in self.guarded + self.others}

    def accepts(self, args):
        """Do ``args`` (of this signature) pass every check?  False: run the full
        checks (they may still pass)."""
        if len(args) != self.nargs or \
                not shapes_hold(args, self.same_shape, self.scalar_slots):
            return False
        spans = {p: _extent(args[p], k) for p, k in self.kinds.items()}
        for k, p in enumerate(self.guarded):
            sp = spans[p]
            for q in self.guarded[k + 1:] + self.others:
                sq = spans[q]
                if sp[0] == sq[0] and sp[1] < sq[2] and sq[1] < sp[2]:
                    return False
        return True


def _extent(a, k):
    """(memory space, first byte, end) of a contiguous array of kind ``k``."""
    if k == "simulator":
        a = a._ary
    if k in ("host", "simulator"):
        p = a.__array_interface__["data"][0]
        return "host", p, p + a.nbytes
    p = a.__cuda_array_interface__["data"][0] or 0
    return "device", p, p + a.nbytes


def remember(cache, key, comp, args):
    """Keep the facts of a launch with ``key`` that the full checks accepted."""
    if len(cache) >= MAX_SIGNATURES:
        cache.clear()
    cache[key] = LaunchFacts(comp, args)
