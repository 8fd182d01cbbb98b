"""The check's set-up: the map ``F`` of one kernel at one point.

Establishes which arguments are checked (the inputs, ``plan.adjoint_args`` narrowed
by ``wrt``) and which are compared (the written floating-point arrays, then the
return value), each as a :class:`_Slot` in a flat float64 vector; the working
precision and its default tolerances; and the per-element finite-difference steps,
relative to each element's magnitude (see the :mod:`kadj.testing` docstring).
Refuses, with a :class:`~kadj.errors.DifferentiationError`, a kernel that has
nothing to check.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..errors import DifferentiationError
from .boundscheck import _BoundsChecked
from .forward import (_copy_args, _evaluate, _is_array, _is_float_or_complex_array,
                      _on_host, _read_inputs)

_DEFAULTS = {
    # precision: (eps, rtol, atol)
    "float64": (float(np.cbrt(np.finfo(np.float64).eps)), 1e-6, 1e-8),
    "float32": (float(np.cbrt(np.finfo(np.float32).eps)), 1e-2, 1e-5),
}


@dataclass(frozen=True)
class _Slot:
    """One argument's place in a flat float64 vector of inputs or outputs."""

    index: int          # argument index; -1 for the return value
    name: str
    shape: tuple        # () for a scalar
    dtype: np.dtype
    is_array: bool
    start: int
    stop: int
    complex: bool = False   # a complex argument: (real, imaginary) pairs, dtype theirs


@dataclass(frozen=True)
class _Problem:
    """The map F of one kernel at one point, and the adjoint's argument layout."""

    kernel: object
    name: str
    args: tuple
    plan: object
    inputs: tuple       # _Slot, the checked inputs
    outputs: tuple      # _Slot, written float arrays then the return value
    n_in: int
    n_out: int


@dataclass(frozen=True)
class _Tol:
    precision: str      # the working precision, "float64" or "float32"
    eps: float          # relative step
    rtol: float
    atol: float
    unit: float         # unit roundoff of the working precision


class _Point:
    """The point ``x`` of the check, its per-element steps, and ``F(x)`` (run once,
    when first needed)."""

    def __init__(self, problem, eps):
        self.problem = problem
        self.x = _read_inputs(problem, problem.args)
        self.steps = _steps(problem, self.x, eps)

    @cached_property
    def y0(self):
        return _evaluate(self.problem, self.x)


def _problem(kernel, args, wrt, boundscheck):
    kernel = _as_differentiated(kernel)
    if boundscheck:
        kernel = _BoundsChecked.wrap(kernel)
    args = tuple(_on_host(a) for a in args)   # checked on host copies of device arrays
    plan = kernel.adjoint_plan(*args)
    name = plan.kernel_name
    _check_plan_covers_outputs(plan, args)
    checked = _checked_indices(plan, wrt)
    inputs = _slots(plan, args, checked)
    outputs = _slots(plan, args, [i for i in plan.adjoint_args
                                  if i in plan.written and _is_array(args[i])])
    if plan.returns_value:
        start = outputs[-1].stop if outputs else 0
        outputs += (_Slot(-1, "return", (), np.dtype(np.float64), False,
                          start, start + 1),)
    if not inputs:
        raise DifferentiationError(
            f"check_grad has nothing to check for kernel '{name}': it has no "
            "differentiable inputs. Pass floating-point arguments, or widen wrt.")
    if not outputs:
        raise DifferentiationError(
            f"check_grad has nothing to check for kernel '{name}': it writes no "
            "floating-point array and returns no value.")
    return _Problem(kernel, name, args, plan, inputs, outputs,
                    inputs[-1].stop, outputs[-1].stop)


def _as_differentiated(kernel):
    if all(hasattr(kernel, a) for a in ("forward", "adjoint", "adjoint_plan")):
        return kernel
    from ..api import differentiate  # testing sits on top of the pipeline

    return differentiate(kernel)


def _check_plan_covers_outputs(plan, args):
    for i in plan.written:
        if _is_float_or_complex_array(args[i]) and i not in plan.adjoint_args:
            raise AssertionError(
                f"Kernel '{plan.kernel_name}' writes floating-point array "
                f"'{plan.arg_names[i]}' but its adjoint plan gives it no adjoint "
                "slot; the contract says written floating-point arrays always "
                "have one.")


def _checked_indices(plan, wrt):
    if wrt is None:
        return list(plan.adjoint_args)
    wanted = (wrt,) if isinstance(wrt, (str, int)) else tuple(wrt)
    indices = []
    for w in wanted:
        i = plan.arg_names.index(w) if w in plan.arg_names else w
        if not isinstance(i, int) or i not in plan.adjoint_args:
            names = ", ".join(plan.arg_names[j] for j in plan.adjoint_args)
            raise DifferentiationError(
                f"check_grad cannot check the gradient of kernel "
                f"'{plan.kernel_name}' with respect to {w!r}: it is not one of the "
                f"kernel's differentiable arguments ({names}).")
        indices.append(i)
    return sorted(set(indices))


def _slots(plan, args, indices):
    slots, start = [], 0
    for i in indices:
        a = args[i]
        if _is_array(a):
            shape, dtype, size = a.shape, a.dtype, a.size
        else:
            shape, dtype, size = (), _scalar_dtype(a, plan, i), 1
        cplx = dtype.kind == "c"
        if cplx:    # probed in the real and the imaginary direction of each element
            dtype, size = np.dtype(np.finfo(dtype).dtype), 2 * size
        slots.append(_Slot(i, plan.arg_names[i], shape, dtype, _is_array(a),
                           start, start + size, cplx))
        start += size
    return tuple(slots)


def _scalar_dtype(value, plan, i):
    dtype = np.asarray(value).dtype
    if dtype.kind not in "fc":
        raise DifferentiationError(
            f"Kernel '{plan.kernel_name}' lists argument '{plan.arg_names[i]}' "
            f"({type(value).__name__}) as differentiable, but check_grad can only "
            "perturb floating-point and complex scalars.")
    return dtype


def _precision(problem):
    """The working precision: the lowest among differentiable inputs and outputs."""
    dtypes = [s.dtype for s in problem.inputs + problem.outputs if s.index >= 0]
    if problem.plan.returns_value:
        result = problem.kernel.forward(*_copy_args(problem.args))
        dtype = np.asarray(result).dtype
        dtypes.append(dtype if dtype.kind == "f" else np.dtype(np.float64))
    worst = max(float(np.finfo(dt).eps) for dt in dtypes)
    return "float64" if worst <= np.finfo(np.float64).eps else "float32"


def _tolerances(problem, eps, rtol, atol):
    """The given eps, rtol and atol, else the working precision's defaults."""
    precision = _precision(problem)
    d_eps, d_rtol, d_atol = _DEFAULTS[precision]
    return _Tol(precision, d_eps if eps is None else float(eps),
                d_rtol if rtol is None else float(rtol),
                d_atol if atol is None else float(atol),
                float(np.finfo(precision).eps))


def _steps(problem, x, eps):
    """Per-element steps, relative to each element's magnitude: ``eps * max(|x_j|,
    m)`` with ``m`` the mean magnitude of the element's argument (1 if it is all
    zeros), so that small parameters get small steps and zeros get a sensible one."""
    steps = np.empty(problem.n_in)
    for s in problem.inputs:
        part = np.abs(x[s.start:s.stop])
        typical = float(part.mean()) if part.size else 0.0
        if not (np.isfinite(typical) and typical > 0.0):
            typical = 1.0
        steps[s.start:s.stop] = eps * np.maximum(part, typical)
    return steps


def _element_name(problem, j):
    for s in problem.inputs:
        if s.start <= j < s.stop:
            return _index_name(s, j - s.start)
    raise IndexError(j)


def _index_name(slot, k):
    part = ""
    if slot.complex:
        k, part = k // 2, (".real", ".imag")[k % 2]
    if not slot.shape:
        return slot.name + part
    idx = np.unravel_index(k, slot.shape)
    return f"{slot.name}[{', '.join(str(int(v)) for v in idx)}]{part}"
