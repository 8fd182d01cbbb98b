"""Small jitted helpers that generated adjoints call (tape push, sign)."""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(inline="always", cache=True)
def _push(tape, sp, value):
    """Push ``value`` on a growable tape; returns the (possibly new) tape and pointer."""
    if sp == tape.shape[0]:
        bigger = np.empty(2 * tape.shape[0], tape.dtype)
        bigger[:sp] = tape[:sp]
        tape = bigger
    tape[sp] = value
    return tape, sp + 1


@njit(inline="always", cache=True)
def _sign(x):
    return 1.0 if x > 0 else (-1.0 if x < 0 else 0.0)


@njit(cache=True)
def _reserve(tape, need):
    """The tape itself when it holds ``need`` entries, else a larger copy of it."""
    if need <= tape.shape[0]:
        return tape
    size = tape.shape[0]
    while size < need:
        size *= 2
    bigger = np.empty(size, tape.dtype)
    bigger[: tape.shape[0]] = tape
    return bigger


@njit(inline="always", cache=True)
def _trips(start, stop, step):
    """Number of iterations of range(start, stop, step)."""
    if step > 0:
        return max(0, (stop - start + step - 1) // step)
    return max(0, (start - stop - step - 1) // (-step))
