"""The real and imaginary parts of a complex value as functions (``z.real`` and
``z.imag`` read as calls), so that their derivative rules live in the one rule table
(:mod:`kadj.rules`) like those of every other function.  Jitted: the generated code
calls them."""
from __future__ import annotations

import numba


@numba.njit(inline="always", cache=False)
def real_part(z):
    """``z.real``."""
    return z.real


@numba.njit(inline="always", cache=False)
def imag_part(z):
    """``z.imag``."""
    return z.imag


PARTS = {"real": real_part, "imag": imag_part}
