"""``kadj.jvp(f, primals, tangents)``: forward mode of an ``@njit`` function returning a
float, in the functional form (like ``jax.jvp``), on top of ``kernel.jvp``
(:mod:`kadj.jvp_call`)."""
from __future__ import annotations

import numpy as np

from . import jvp_call
from .api import _as_kernel
from .errors import DifferentiationError


def jvp(f, primals, tangents):
    """``kadj.jvp(f, primals, tangents) -> (value, tangent)`` for an ``@njit`` function
    ``f`` returning a float (like ``jax.jvp``): the value of ``f(*primals)`` and its
    directional derivative along ``tangents`` (one per primal: an array shaped like an
    array argument, a float for a scalar, None for a zero tangent or an argument
    without one).  The primals are not modified (arrays ``f`` writes run on copies)."""
    k = _as_kernel(f)
    primals, tangents = tuple(primals), tuple(tangents)
    if len(tangents) != len(primals):
        raise TypeError(f"kadj.jvp({k.__name__}): {len(primals)} primals but "
                        f"{len(tangents)} tangents; pass one tangent per primal (None "
                        "for none).")
    args = k.complete_args(primals)
    comp = jvp_call.compiled(k, args)
    plan = comp.plan
    if not plan.returns_value:
        raise DifferentiationError(
            f"{k.__name__} does not return a float, so kadj.jvp has no tangent to return",
            kernel=k.__name__, remedy="use kernel.jvp(...) with tangent buffers for a "
                                      "kernel that writes arrays")
    args = tuple(a.copy() if i in plan.written else a for i, a in enumerate(args))
    bufs = []
    for i, (name, x, t) in enumerate(zip(k.arg_names, args, tangents)):
        if i not in plan.adjoint_args:
            if t is not None:
                raise TypeError(f"kadj.jvp({k.__name__}): argument '{name}' has no "
                                "tangent (not a floating-point argument, or not in wrt); "
                                "pass None for it.")
            continue
        dtype = np.asarray(x).dtype
        if isinstance(x, np.ndarray):
            bufs.append(np.zeros_like(x) if t is None else np.array(t, dtype=dtype))
        else:
            scalar = complex if dtype.kind == "c" else float
            bufs.append(np.zeros(1, dtype) if t is None else
                        np.full(1, scalar(t), dtype))
    return jvp_call.run(k, args + tuple(bufs), {})
