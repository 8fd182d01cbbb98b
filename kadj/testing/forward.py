"""The forward map ``F``: the checked inputs before a call -> the written
floating-point arrays (then the return value) after it.

``F`` is always evaluated on copies of the arguments, so the caller's arguments are
never modified; inputs are rounded to their dtype when written into the copies.  A
complex argument or output takes two places per element in the flat vectors, its real
and imaginary parts (:func:`real_pairs`), so it is probed in both directions and its
adjoint read as dL/dx + i dL/dy.
"""
from __future__ import annotations

import numpy as np

from .. import arrays


def _is_array(a):
    """A NumPy array (device arrays are brought to the host by ``_problem``)."""
    return arrays.kind(a) == "host"


def _on_host(a):
    """``a``, with a device array's contents copied into a NumPy array."""
    return arrays.to_host(a) if arrays.kind(a) not in (None, "host") else a


def _copy_args(args):
    return [arrays.copy(a) if _is_array(a) else a for a in args]


def _is_float_or_complex_array(a):
    """A NumPy array of floating-point or complex elements."""
    return _is_array(a) and a.dtype.kind in "fc"


def real_pairs(value):
    """The elements of ``value`` (an array or a scalar) flattened; a complex one's as
    (real, imaginary) pairs."""
    flat = np.ravel(np.asarray(value))
    if flat.dtype.kind == "c":
        return np.ascontiguousarray(flat).view(np.finfo(flat.dtype).dtype)
    return flat


def from_pairs(part, slot):
    """The inverse of :func:`real_pairs` for ``slot``'s values ``part``."""
    return part[0::2] + 1j * part[1::2] if slot.complex else part


def _read_inputs(problem, args):
    x = np.empty(problem.n_in)
    for s in problem.inputs:
        x[s.start:s.stop] = real_pairs(args[s.index])
    return x


def _with_inputs(problem, x):
    """Copies of the arguments holding ``x`` (rounded to each input's dtype)."""
    args = _copy_args(problem.args)
    for s in problem.inputs:
        value = from_pairs(x[s.start:s.stop], s)
        if s.is_array:
            args[s.index][...] = value.reshape(s.shape)
        else:
            args[s.index] = _like_scalar(problem.args[s.index], value[0])
    return args


def _like_scalar(original, value):
    if isinstance(original, np.generic):
        return original.dtype.type(value)
    return type(original)(value)


def _run_forward(problem, args):
    """Run the forward on ``args`` (copies, modified in place); return F's value."""
    result = problem.kernel.forward(*args)
    y = np.empty(problem.n_out)
    for s in problem.outputs:
        if s.index >= 0:
            y[s.start:s.stop] = real_pairs(args[s.index])
        elif result is None:
            raise AssertionError(
                f"Kernel '{problem.name}' is planned to return a value, but its "
                "forward returned None.")
        else:
            y[s.start] = float(result)
    return y


def _evaluate(problem, x):
    return _run_forward(problem, _with_inputs(problem, x))
