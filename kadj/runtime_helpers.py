"""Small jitted helpers that generated adjoints call (tape push, sign).

They are cached by numba on disk where numba can write (beside this file, in
``$NUMBA_CACHE_DIR`` or ``~/.cache/numba``) and compiled in every process otherwise
(:func:`kadj.cachedir.cached_njit`)."""
from __future__ import annotations

import numpy as np

from .cachedir import cached_njit


@cached_njit(inline="always")
def _push(tape, sp, value):
    """Push ``value`` on a growable tape; returns the (possibly new) tape and pointer."""
    if sp == tape.shape[0]:
        bigger = np.empty(2 * tape.shape[0], tape.dtype)
        bigger[:sp] = tape[:sp]
        tape = bigger
    tape[sp] = value
    return tape, sp + 1


@cached_njit(inline="always")
def _sign(x):
    return 1.0 if x > 0 else (-1.0 if x < 0 else 0.0)


@cached_njit()
def _reserve(tape, need):
    """The tape itself when it holds ``need`` entries, else a larger copy of it."""
    if need <= tape.shape[0]:
        return tape
    size = max(tape.shape[0], 1)   # a tape allocated with 0 entries grows too
    while size < need:
        size *= 2
    bigger = np.empty(size, tape.dtype)
    for i in range(tape.shape[0]):   # a loop compiles to less code than a slice copy
        bigger[i] = tape[i]
    return bigger


# ---- memory kept between calls (kadj.call_memory, kadj.kept_memory) -------------------
@cached_njit()
def _kept_array(keep, shape, dtype, need, slot):
    """An uninitialised array of ``shape`` and ``dtype``: a view of the kept bytes
    ``keep`` when they are enough, else new memory; ``need[slot]`` notes its bytes."""
    dims = np.array(shape).ravel()
    nbytes = keep[:0].view(dtype).itemsize
    fits = True
    for d in dims:
        if d < 0:              # np.empty raises, as it would have
            fits = False
        nbytes *= d
    if fits and nbytes > need[slot]:
        need[slot] = nbytes
    if fits and nbytes <= keep.shape[0]:
        return keep[:nbytes].view(dtype).reshape(shape)
    return np.empty(shape, dtype)


@cached_njit()
def _kept_zeros(keep, shape, dtype, need, slot):
    """``np.zeros(shape, dtype)`` in kept memory (:func:`_kept_array`)."""
    a = _kept_array(keep, shape, dtype, need, slot)
    a[...] = 0
    return a


@cached_njit()
def _kept_copy(keep, x, need, slot):
    """``x.copy()`` (C order) in kept memory (:func:`_kept_array`)."""
    a = _kept_array(keep, x.shape, x.dtype, need, slot)
    a[...] = x
    return a


@cached_njit()
def _kept_like(keep, x, need, slot):
    """``np.empty_like(x)`` of a C-ordered ``x`` in kept memory (:func:`_kept_array`)."""
    return _kept_array(keep, x.shape, x.dtype, need, slot)


@cached_njit()
def _kept_zeros_like(keep, x, need, slot):
    """``np.zeros_like(x)`` of a C-ordered ``x`` in kept memory (:func:`_kept_array`)."""
    return _kept_zeros(keep, x.shape, x.dtype, need, slot)


@cached_njit(inline="always")
def _trips(start, stop, step):
    """Number of iterations of range(start, stop, step)."""
    if step > 0:
        return max(0, (stop - start + step - 1) // step)
    if step == 0:  # a loop that does not run here (range() refuses a zero step)
        return 0
    return max(0, (start - stop - step - 1) // (-step))
