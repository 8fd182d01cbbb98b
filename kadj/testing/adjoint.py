"""The adjoint as a vector-Jacobian product: one adjoint call seeded with a
cotangent gives the cotangent of the checked inputs.

Establishes, on every call, that the adjoint leaves the forward arguments untouched
and that an out-of-bounds access in it fails the check; draws the random cotangents,
rounded to the outputs' dtypes.
"""
from __future__ import annotations

import numpy as np

from .forward import _copy_args, _is_array, from_pairs, real_pairs


def _vjp(problem, ct):
    """Cotangent of the checked inputs, from one adjoint call seeded with ``ct``."""
    plan = problem.plan
    fwd = _copy_args(problem.args)
    out_slots = {s.index: s for s in problem.outputs}
    buffers = []
    for i in plan.adjoint_args:
        a = problem.args[i]
        if i in out_slots:
            s = out_slots[i]
            # a complex output's cotangent: dL/dx + i dL/dy (kadj's convention)
            seed = from_pairs(ct[s.start:s.stop], s)
            buffers.append(seed.reshape(s.shape).astype(np.asarray(a).dtype))
        elif _is_array(a):
            buffers.append(np.zeros_like(a))
        else:
            buffers.append(np.zeros(1, dtype=np.asarray(a).dtype))
    kwargs = {}
    if plan.returns_value:
        kwargs["adj_return"] = float(ct[-1])
    try:
        problem.kernel.adjoint(*fwd, *buffers, **kwargs)
    except IndexError as exc:
        raise AssertionError(
            f"The adjoint of kernel '{problem.name}' indexed an array out of bounds "
            f"({exc}). Either the kernel itself indexes out of bounds at these "
            "arguments (run its forward with bounds checking, e.g. NUMBA_BOUNDSCHECK=1, "
            "to find out), or its adjoint is wrong: a bug in kadj or in a registered "
            "derivative rule, to be reported with the kernel and its arguments.") from exc
    _check_untouched(problem, fwd)
    by_index = dict(zip(plan.adjoint_args, buffers))
    g = np.empty(problem.n_in)
    for s in problem.inputs:
        g[s.start:s.stop] = real_pairs(by_index[s.index])
    return g


def _check_untouched(problem, after):
    for i, (before, now) in enumerate(zip(problem.args, after)):
        if _is_array(before) and before.tobytes() != now.tobytes():
            changed = int(np.count_nonzero(before != now))
            raise AssertionError(
                f"The adjoint of kernel '{problem.name}' modified its forward "
                f"argument '{problem.plan.arg_names[i]}' ({changed} element(s) "
                "changed); the adjoint call must write only into the adjoint "
                "buffers.")


def _random_cotangent(problem, rng, adj_return):
    ct = rng.standard_normal(problem.n_out)
    if adj_return is not None and problem.plan.returns_value:
        ct[-1] = float(adj_return)
    return _round_to_outputs(problem, ct)


def _round_to_outputs(problem, ct):
    """``ct`` with each output block rounded to that output's dtype."""
    ct = np.array(ct, dtype=np.float64)
    for s in problem.outputs:
        ct[s.start:s.stop] = ct[s.start:s.stop].astype(s.dtype)
    return ct
