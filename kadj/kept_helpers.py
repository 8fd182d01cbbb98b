"""The helpers through which a CPU adjoint allocates in memory its caller keeps.

:mod:`kadj.kept_memory` writes an adjoint's allocations as calls of these
(``_kept_array``, ``_kept_zeros``, ``_kept_copy``, ``_kept_like``,
``_kept_zeros_like``); :mod:`kadj.call_memory` passes the kept bytes.  Each returns a
view of the kept bytes ``keep`` (a ``uint8`` array) when they are enough, else new
memory, as the allocation it replaces would have made, and then notes the bytes it
asked for in ``need[slot]`` and sets ``need[0]`` (the slots start at 1).

Each is a function numba compiles through an overload that ignores literal values
(``prefer_literal=False``): a generated call passes its slot, and often a size, as a
constant, and a jitted function called with constants would be compiled once per
constant.  The overload calls one jitted implementation per kind of argument (dtype,
dimensions), cached on disk like kadj's other runtime helpers.  Called from Python (an
adjoint's source run as plain Python) they run that implementation.
"""
from __future__ import annotations

import numpy as np
from numba.core import types
from numba.extending import overload

from .cachedir import cached_njit

__all__ = ["_kept_array", "_kept_zeros", "_kept_copy", "_kept_like", "_kept_zeros_like"]


@cached_njit()
def _array(keep, shape, dtype, need, slot):
    """An array of ``shape`` (a tuple of integers) and ``dtype``: a view of ``keep``
    when it holds enough bytes, else new memory."""
    nbytes = keep[:0].view(dtype).itemsize
    fits = True
    for d in shape:
        if d < 0:              # np.empty raises, as it would have
            fits = False
        nbytes *= d
    if fits and nbytes <= keep.shape[0]:
        return keep[:nbytes].view(dtype).reshape(shape)
    if fits:
        if nbytes > need[slot]:
            need[slot] = nbytes    # what the caller's pool grows this slot to
        need[0] = 1                # (slot 0: some slot asked for more than it keeps)
    return np.empty(shape, dtype)


@cached_njit()
def _zeros(keep, shape, dtype, need, slot):
    a = _array(keep, shape, dtype, need, slot)
    a.fill(0)
    return a


@cached_njit()
def _copy(keep, x, need, slot):
    a = _array(keep, x.shape, x.dtype, need, slot)
    flat = a.reshape(a.size)
    k = 0
    for v in x.flat:           # (a slice assignment compiles its shape-error messages)
        flat[k] = v
        k += 1
    return a


def _kept_array(keep, shape, dtype, need, slot):
    """``np.empty(shape, dtype)`` in kept memory."""
    return _array(keep, tuple(np.atleast_1d(shape)), dtype, need, slot)


def _kept_zeros(keep, shape, dtype, need, slot):
    """``np.zeros(shape, dtype)`` in kept memory."""
    return _zeros(keep, tuple(np.atleast_1d(shape)), dtype, need, slot)


def _kept_copy(keep, x, need, slot):
    """``x.copy()`` (C order) in kept memory."""
    return _copy(keep, x, need, slot)


def _kept_like(keep, x, need, slot):
    """``np.empty_like(x)`` of a C-ordered ``x`` in kept memory."""
    return _array(keep, x.shape, x.dtype, need, slot)


def _kept_zeros_like(keep, x, need, slot):
    """``np.zeros_like(x)`` of a C-ordered ``x`` in kept memory."""
    return _zeros(keep, x.shape, x.dtype, need, slot)


def _kind(shape):
    """How an overload passes ``shape`` on: "int" (as a 1-tuple), "tuple" (a tuple of
    integers, as it is), or None when kept memory cannot take it (np.empty instead)."""
    if isinstance(shape, types.Integer):
        return "int"
    if isinstance(shape, types.UniTuple) and isinstance(shape.dtype, types.Integer):
        return "tuple"
    return None


def _overload_new(stub, impl, fallback):
    """Overload ``stub(keep, shape, dtype, need, slot)`` by ``impl`` with ``shape`` as
    a tuple, or by ``fallback(shape, dtype)`` (np.empty, np.zeros) for other shapes."""
    @overload(stub, prefer_literal=False)
    def _ov(keep, shape, dtype, need, slot):
        kind = _kind(shape)
        if kind == "int":
            return lambda keep, shape, dtype, need, slot: impl(keep, (shape,), dtype, need,
                                                               slot)
        if kind == "tuple":
            return lambda keep, shape, dtype, need, slot: impl(keep, shape, dtype, need,
                                                               slot)
        return lambda keep, shape, dtype, need, slot: fallback(shape, dtype)
    return _ov


_overload_new(_kept_array, _array, np.empty)
_overload_new(_kept_zeros, _zeros, np.zeros)


@overload(_kept_copy, prefer_literal=False)
def _ov_copy(keep, x, need, slot):
    return lambda keep, x, need, slot: _copy(keep, x, need, slot)


@overload(_kept_like, prefer_literal=False)
def _ov_like(keep, x, need, slot):
    return lambda keep, x, need, slot: _array(keep, x.shape, x.dtype, need, slot)


@overload(_kept_zeros_like, prefer_literal=False)
def _ov_zeros_like(keep, x, need, slot):
    return lambda keep, x, need, slot: _zeros(keep, x.shape, x.dtype, need, slot)
