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
