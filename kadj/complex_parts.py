"""The real and imaginary parts of a complex value as functions (``z.real`` and
``z.imag`` read as calls), and its methods read as calls of functions
(``z.conjugate()`` is ``np.conj(z)``), so that their derivative rules live in the one
rule table (:mod:`kadj.rules`) like those of every other function.  Jitted: the
generated code calls them."""
from __future__ import annotations

import numba
import numpy as np


@numba.njit(inline="always", cache=False)
def real_part(z):
    """``z.real``."""
    return z.real


@numba.njit(inline="always", cache=False)
def imag_part(z):
    """``z.imag``."""
    return z.imag


PARTS = {"real": real_part, "imag": imag_part}


#: methods of a complex value read as calls of a function of the value: ``z.conjugate()``
#: is ``np.conj(z)`` (its rule is the table's)
METHODS = {"conjugate": np.conj}


def method_call(func_ir, types_of, callee):
    """``(function, value variable)`` when ``callee`` (the variable a call calls) is a
    method of :data:`METHODS` read from a complex value (``z.conjugate``), else None."""
    from numba.core import ir as nir
    from numba.core import types
    try:
        d = func_ir.get_definition(callee)
    except Exception:
        return None
    if isinstance(d, nir.Expr) and d.op == "getattr" and d.attr in METHODS and \
            isinstance(types_of.get(d.value.name), types.Complex):
        return METHODS[d.attr], d.value
    return None
