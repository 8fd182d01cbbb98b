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


@cached_njit(inline="always")
def _trips(start, stop, step):
    """Number of iterations of range(start, stop, step)."""
    if step > 0:
        return max(0, (stop - start + step - 1) // step)
    if step == 0:  # a loop that does not run here (range() refuses a zero step)
        return 0
    return max(0, (start - stop - step - 1) // (-step))
