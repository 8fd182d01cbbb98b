"""Gradient checks: is a kernel's adjoint the transpose of its Jacobian?

A differentiated kernel is checked as the map ``F`` from the state *before* a call
(the contents of the differentiable inputs, ``plan.adjoint_args``) to the state
*after* it (the contents of the floating-point arrays it writes, then the return
value).  :func:`check_grad` establishes, against float64 central finite
differences of ``F`` and independently of how the adjoint was built, that

* the inner-product identity ``<ct, J d> == <adjoint(ct), d>`` holds for one random
  cotangent ``ct`` and, per input argument, one random direction ``d`` (the
  "dot-product test" of adjoint codes; one adjoint call and two forward runs per
  argument, whatever the size, as in JAX's ``check_vjp``);
* for small inputs (at most ``full_jacobian_max`` elements) every Jacobian column from
  finite differences matches the rows the adjoint produces;
* the adjoint call leaves the forward arguments untouched, as API.md promises.

``F`` is always evaluated on copies, so the caller's arguments are never modified.

Precision.  Finite differences are formed in float64 from forward runs of the
kernel as compiled, so a float32 kernel is run in float32: compiling it for float64
would check a different kernel.  Its rounding error is then the limiting factor,
and the defaults adapt to the working precision (the lowest precision among the
differentiable inputs and outputs):

=========  ====================  ======  ======
precision  eps (relative step)   rtol    atol
=========  ====================  ======  ======
float64    cbrt(2.2e-16) ~ 6e-6  1e-6    1e-8
float32    cbrt(1.2e-7)  ~ 5e-3  1e-2    1e-5
=========  ====================  ======  ======

The step for element ``x_j`` is ``eps * max(1, |x_j|)``; the perturbed inputs are
rounded to their dtype and the rounded step is the one used.  On top of ``atol`` the
comparison allows an estimate of the finite-difference rounding noise,
``64 * unit_roundoff * |F| / step``.  Limitations: the check is local (a branch
boundary closer than the step makes finite differences meaningless).

CUDA kernels.  :func:`check_grad_cuda` runs the same inner-product test for a
``@cuda.jit`` kernel launched on a given ``(griddim, blockdim)``, with several random
directions per argument; on a mismatch it reports, for small arguments, the elements
where the adjoint and finite differences disagree.  Without a GPU it runs under the
CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``, set before numba is imported).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .errors import DifferentiationError

__all__ = [
    "GradCheckResult",
    "adjoint_jacobian",
    "check_grad",
    "check_grad_cuda",
    "numerical_jacobian",
]

_DEFAULTS = {
    # precision: (eps, rtol, atol)
    "float64": (float(np.cbrt(np.finfo(np.float64).eps)), 1e-6, 1e-8),
    "float32": (float(np.cbrt(np.finfo(np.float32).eps)), 1e-2, 1e-5),
}
_NOISE_FACTOR = 64.0
_RANDOM_ROWS = 8


@dataclass(frozen=True)
class GradCheckResult:
    """What :func:`check_grad` compared, and how close the adjoint came.

    inputs / outputs:     names of the checked inputs and of the outputs
                          (``"return"`` for a return value), in flattening order.
    precision:            ``"float64"`` or ``"float32"``, which chose the defaults.
    directional_fd:       ``<ct, J d>`` from central differences (per unit step),
                          summed over the per-argument directions.
    directional_adjoint:  ``<adjoint(ct), d>`` (per unit step), summed likewise.
    jacobian_checked:     whether full Jacobian columns were compared too.
    max_abs_error:        largest absolute mismatch over every comparison made.
    max_rel_error:        largest mismatch relative to the reference magnitude.
    """

    kernel_name: str
    inputs: tuple
    outputs: tuple
    precision: str
    eps: float
    rtol: float
    atol: float
    directional_fd: float
    directional_adjoint: float
    jacobian_checked: bool
    max_abs_error: float
    max_rel_error: float


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


# --------------------------------------------------------------------------- public


def _direction(problem, x, s, ct, g, rng, eps, rtol, atol, unit):
    """One random direction along argument ``s``: (finite difference, adjoint, allowed
    difference) of ``<ct, F(x + d)>``'s derivative against ``<g, d>``."""
    h2 = 2.0 * eps
    delta = np.zeros(problem.n_in)
    part = slice(s.start, s.stop)
    delta[part] = (eps * np.maximum(1.0, np.abs(x[part]))
                   * rng.standard_normal(s.stop - s.start))
    y_plus, y_minus, step = _evaluate_pair(problem, x, delta)
    fd = float(ct @ (y_plus - y_minus)) / h2
    ad = float(g @ step) / h2
    magnitude = max(abs(ad), float(np.abs(g * step).sum()) / h2)
    noise = _NOISE_FACTOR * unit * float(
        np.abs(ct) @ np.maximum(np.abs(y_plus), np.abs(y_minus))) / h2
    return fd, ad, atol + rtol * magnitude + noise, magnitude


def _tolerances(problem, eps, rtol, atol):
    """(eps, rtol, atol, unit roundoff): the given ones, else the precision's defaults."""
    precision = _precision(problem)
    d_eps, d_rtol, d_atol = _DEFAULTS[precision]
    return (d_eps if eps is None else float(eps), d_rtol if rtol is None else float(rtol),
            d_atol if atol is None else float(atol), float(np.finfo(precision).eps))


def check_grad(kernel, args, wrt=None, *, rtol=None, atol=None, eps=None, seed=0,
               full_jacobian_max=64, adj_return=None):
    """Check ``kernel``'s adjoint against central finite differences at ``args``.

    ``kernel`` is a differentiated kernel (``kadj.differentiate``); an undecorated
    ``@njit`` function is differentiated first.  ``wrt`` narrows the checked inputs
    (argument names or indices among the kernel's differentiable arguments);
    ``rtol``, ``atol`` and ``eps`` default by precision (see the module docstring).
    ``adj_return`` fixes the cotangent of a return value in the inner-product test
    (random by default).  Raises ``AssertionError`` naming the kernel and argument on
    a mismatch; returns a :class:`GradCheckResult` otherwise.

    Example::

        @kadj.differentiate
        @njit
        def heat_step(u, u_new, alpha): ...

        check_grad(heat_step, (np.random.rand(16), np.zeros(16), 0.1))
    """
    problem = _problem(kernel, args, wrt)
    rng = np.random.default_rng(seed)
    precision = _precision(problem)
    eps, rtol, atol, unit = _tolerances(problem, eps, rtol, atol)

    ct = _random_cotangent(problem, rng, adj_return)
    fd, ad, err_ip = _inner_product_test(problem, ct, rng, eps, rtol, atol, unit)
    errors = [err_ip]
    jacobian_checked = problem.n_in <= full_jacobian_max
    if jacobian_checked:
        errors.append(_jacobian_test(problem, rng, eps, rtol, atol, unit,
                                     full_jacobian_max))
    return GradCheckResult(
        kernel_name=problem.name,
        inputs=tuple(s.name for s in problem.inputs),
        outputs=tuple(s.name for s in problem.outputs),
        precision=precision, eps=eps, rtol=rtol, atol=atol,
        directional_fd=fd, directional_adjoint=ad,
        jacobian_checked=jacobian_checked,
        max_abs_error=max(e[0] for e in errors),
        max_rel_error=max(e[1] for e in errors),
    )


def numerical_jacobian(kernel, args, wrt=None, *, eps=None):
    """The Jacobian of ``kernel`` at ``args`` by float64 central differences.

    Rows are the outputs (written floating-point arrays in argument order, each
    flattened in C order, then the return value); columns are the inputs, flattened
    the same way.  ``args`` is not modified.
    """
    problem = _problem(kernel, args, wrt)
    if eps is None:
        eps = _DEFAULTS[_precision(problem)][0]
    jac, _, _ = _fd_jacobian(problem, float(eps))
    return jac


def adjoint_jacobian(kernel, args, wrt=None):
    """The Jacobian of ``kernel`` at ``args`` built row by row from its adjoint.

    Same layout as :func:`numerical_jacobian`: one adjoint call per output element.
    """
    problem = _problem(kernel, args, wrt)
    return np.stack([_vjp(problem, e) for e in np.eye(problem.n_out)]).reshape(
        problem.n_out, problem.n_in)


# ---------------------------------------------------------------- problem set-up


def _problem(kernel, args, wrt):
    kernel = _as_differentiated(kernel)
    args = tuple(args)
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
    from .api import differentiate  # testing sits on top of the pipeline

    return differentiate(kernel)


def _check_plan_covers_outputs(plan, args):
    for i in plan.written:
        if _is_float_array(args[i]) and i not in plan.adjoint_args:
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
        slots.append(_Slot(i, plan.arg_names[i], shape, dtype, _is_array(a),
                           start, start + size))
        start += size
    return tuple(slots)


def _scalar_dtype(value, plan, i):
    dtype = np.asarray(value).dtype
    if dtype.kind != "f":
        raise DifferentiationError(
            f"Kernel '{plan.kernel_name}' lists argument '{plan.arg_names[i]}' "
            f"({type(value).__name__}) as differentiable, but check_grad can only "
            "perturb floating-point scalars.")
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


# ------------------------------------------------------------- the forward map F


def _is_array(a):
    return isinstance(a, np.ndarray)


def _is_float_array(a):
    return _is_array(a) and a.dtype.kind == "f"


def _copy_args(args):
    return [a.copy(order="K") if _is_array(a) else a for a in args]


def _read_inputs(problem, args):
    x = np.empty(problem.n_in)
    for s in problem.inputs:
        x[s.start:s.stop] = np.ravel(args[s.index])
    return x


def _with_inputs(problem, x):
    """Copies of the arguments holding ``x`` (rounded to each input's dtype)."""
    args = _copy_args(problem.args)
    for s in problem.inputs:
        if s.is_array:
            args[s.index][...] = x[s.start:s.stop].reshape(s.shape)
        else:
            args[s.index] = _like_scalar(problem.args[s.index], x[s.start])
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
            y[s.start:s.stop] = np.ravel(args[s.index])
        elif result is None:
            raise AssertionError(
                f"Kernel '{problem.name}' is planned to return a value, but its "
                "forward returned None.")
        else:
            y[s.start] = float(result)
    return y


def _evaluate(problem, x):
    return _run_forward(problem, _with_inputs(problem, x))


def _evaluate_pair(problem, x, delta):
    """F at the rounded ``x + delta`` and ``x - delta``, and the rounded step."""
    plus, minus = _with_inputs(problem, x + delta), _with_inputs(problem, x - delta)
    step = _read_inputs(problem, plus) - _read_inputs(problem, minus)
    return _run_forward(problem, plus), _run_forward(problem, minus), step


# ------------------------------------------------------------------ the adjoint


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
            buffers.append(ct[s.start:s.stop].reshape(s.shape).astype(s.dtype))
        elif _is_array(a):
            buffers.append(np.zeros_like(a))
        else:
            buffers.append(np.zeros(1, dtype=np.asarray(a).dtype))
    kwargs = {}
    if plan.returns_value:
        kwargs["adj_return"] = float(ct[-1])
    problem.kernel.adjoint(*fwd, *buffers, **kwargs)
    _check_untouched(problem, fwd)
    by_index = dict(zip(plan.adjoint_args, buffers))
    g = np.empty(problem.n_in)
    for s in problem.inputs:
        g[s.start:s.stop] = np.ravel(by_index[s.index])
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


# ---------------------------------------------------------------------- the tests


def _inner_product_test(problem, ct, rng, eps, rtol, atol, unit):
    """``<ct, J d>`` against ``<adjoint(ct), d>``, one random ``d`` per input.

    One adjoint call serves every input; perturbing one argument at a time costs two
    forward runs each and names the argument whose gradient is wrong.
    """
    x = _read_inputs(problem, problem.args)
    g = _vjp(problem, ct)
    total_fd = total_ad = 0.0
    worst = (0.0, 0.0)
    for s in problem.inputs:
        fd, ad, tol, magnitude = _direction(problem, x, s, ct, g, rng, eps, rtol,
                                                atol, unit)
        np.testing.assert_allclose(
            ad, fd, rtol=0.0, atol=tol,
            err_msg=(f"The adjoint of kernel '{problem.name}' fails the inner-product "
                     f"test for argument '{s.name}': <adjoint(ct), d> = {ad!r} but "
                     f"central finite differences give <ct, J d> = {fd!r} (outputs: "
                     f"{_names(problem.outputs)}; tolerance {tol:.3g})."))
        total_fd += fd
        total_ad += ad
        worst = max(worst, _errors(np.array([ad]), np.array([fd]), magnitude))
    return total_fd, total_ad, worst


def _fd_jacobian(problem, eps):
    """Column-by-column central differences; also the largest |F| and step."""
    x = _read_inputs(problem, problem.args)
    jac = np.empty((problem.n_out, problem.n_in))
    f_abs = np.zeros(problem.n_out)
    min_step = math.inf
    for j in range(problem.n_in):
        delta = np.zeros(problem.n_in)
        delta[j] = eps * max(1.0, abs(x[j]))
        y_plus, y_minus, step = _evaluate_pair(problem, x, delta)
        if step[j] == 0.0:
            raise AssertionError(
                f"check_grad's step for input {j} of kernel '{problem.name}' rounds "
                "to zero in the input's dtype; pass a larger eps.")
        jac[:, j] = (y_plus - y_minus) / step[j]
        f_abs = np.maximum(f_abs, np.maximum(np.abs(y_plus), np.abs(y_minus)))
        min_step = min(min_step, step[j] / 2.0)
    return jac, f_abs, min_step


def _jacobian_test(problem, rng, eps, rtol, atol, unit, rows_max):
    """Compare ``C^T J`` from finite differences with adjoint rows.

    ``C`` is the identity (one adjoint call per output element) when there are at
    most ``rows_max`` outputs, else a few random cotangents.
    """
    jac, f_abs, min_step = _fd_jacobian(problem, eps)
    unit_rows = problem.n_out <= rows_max
    if unit_rows:
        cts = np.eye(problem.n_out)
    else:
        cts = np.stack([_round_to_outputs(problem, rng.standard_normal(problem.n_out))
                        for _ in range(_RANDOM_ROWS)])
    adjoint_rows = np.stack([_vjp(problem, c) for c in cts])
    reference = cts @ jac
    noise = _NOISE_FACTOR * unit * float((np.abs(cts) @ f_abs).max()) / min_step
    tol = atol + noise
    row_blocks = problem.outputs if unit_rows else (None,)
    worst = (0.0, 0.0)
    magnitude = np.abs(reference).max(initial=0.0)
    for s_in in problem.inputs:
        cols = slice(s_in.start, s_in.stop)
        for s_out in row_blocks:
            rows = slice(None) if s_out is None else slice(s_out.start, s_out.stop)
            _assert_block(problem, s_in, s_out, adjoint_rows[rows, cols],
                          reference[rows, cols], rtol, tol)
        worst = max(worst, _errors(adjoint_rows[:, cols], reference[:, cols],
                                   magnitude))
    return worst


def _assert_block(problem, s_in, s_out, actual, desired, rtol, tol):
    what = (f"d({s_out.name} after)/d({s_in.name} before)" if s_out is not None
            else f"the gradient with respect to '{s_in.name}' for random cotangents")
    np.testing.assert_allclose(
        actual, desired, rtol=rtol, atol=tol,
        err_msg=(f"The adjoint of kernel '{problem.name}' disagrees with central "
                 f"finite differences in {what} (argument '{s_in.name}'; adjoint "
                 "rows are 'actual', finite differences 'desired')."))


def _errors(actual, desired, magnitude):
    abs_err = float(np.abs(actual - desired).max(initial=0.0))
    return abs_err, float(abs_err / magnitude) if magnitude > 0 else abs_err


def _names(slots):
    return ", ".join(s.name for s in slots)


# ------------------------------------------------------------------ CUDA kernels


class _CudaLaunch:
    """A differentiated CUDA kernel bound to one launch configuration, with the
    ``forward`` / ``adjoint`` / ``adjoint_plan`` interface the helpers above use."""

    def __init__(self, kernel, config):
        self.kernel, self.config = kernel, tuple(config)
        self.__name__ = getattr(kernel, "__name__", "kernel")

    def forward(self, *args):
        self.kernel[self.config](*args)

    def adjoint(self, *args):
        self.kernel.adjoint[self.config](*args)

    def adjoint_plan(self, *args):
        return self.kernel.adjoint_plan(*args)


def check_grad_cuda(kernel, config, args, *, directions=3, seed=0, rtol=None,
                    atol=None, eps=None, explain_max=64):
    """Check a ``@cuda.jit`` kernel's adjoint against central finite differences.

    ``kernel`` is a differentiated CUDA kernel (``kadj.differentiate`` above
    ``@cuda.jit``; a plain ``@cuda.jit`` kernel is differentiated first), launched as
    ``kernel[config](*args)`` with ``config = (griddim, blockdim)``; ``args`` holds
    NumPy arrays and scalars and is not modified.

    The map checked is ``F``: the contents of the differentiable arguments before the
    launch -> the contents of the written floating-point arrays after it (see the
    module docstring).  One adjoint launch, seeded with a random cotangent ``ct`` on
    the written arrays, gives ``adjoint(ct)``; for each differentiable argument and
    each of ``directions`` random directions ``d``, ``<adjoint(ct), d>`` is compared
    with ``<ct, J d>`` from float64 central differences of forward launches on copies
    (two launches per direction).  The adjoint launch must leave the forward
    arguments untouched.  ``rtol``, ``atol`` and ``eps`` default by precision as for
    :func:`check_grad`.

    On a mismatch, raises ``AssertionError`` naming the kernel, the launch and the
    argument; when that argument has at most ``explain_max`` elements the message
    also lists the elements whose gradient differs (adjoint vs finite differences,
    two more launches per element).  Returns a :class:`GradCheckResult`.

    Example (in a process started with ``NUMBA_ENABLE_CUDASIM=1``)::

        @kadj.differentiate
        @cuda.jit
        def heat_step(u, u_new, alpha): ...

        check_grad_cuda(heat_step, (2, 8), [rng.random(13), np.zeros(13), 0.1])
    """
    if directions < 1:
        raise ValueError("check_grad_cuda needs at least one direction")
    differentiated = _as_differentiated(kernel)
    launch = _CudaLaunch(differentiated, config)
    problem = _problem(launch, args, None)
    rng = np.random.default_rng(seed)
    precision = _precision(problem)
    eps, rtol, atol, unit = _tolerances(problem, eps, rtol, atol)

    ct = _random_cotangent(problem, rng, None)
    x = _read_inputs(problem, problem.args)
    g = _vjp(problem, ct)
    if not np.all(np.isfinite(g)):
        bad = [s.name for s in problem.inputs
               if not np.all(np.isfinite(g[s.start:s.stop]))]
        raise AssertionError(
            f"The adjoint of CUDA kernel '{problem.name}' launched as "
            f"[{_config_text(config)}] produced non-finite gradients for "
            f"{', '.join(bad)}.")
    total_fd = total_ad = 0.0
    worst = (0.0, 0.0)
    for s in problem.inputs:
        for k in range(directions):
            fd, ad, tol, magnitude = _direction(problem, x, s, ct, g, rng, eps, rtol,
                                                atol, unit)
            if not abs(ad - fd) <= tol:
                detail = _explain_cuda(problem, s, ct, g, x, eps, rtol, atol, unit,
                                       explain_max)
                raise AssertionError(
                    f"The adjoint of CUDA kernel '{problem.name}' launched as "
                    f"[{_config_text(config)}] fails the inner-product test for "
                    f"argument '{s.name}' (direction {k + 1} of {directions}): "
                    f"<adjoint(ct), d> = {ad!r} but central finite differences give "
                    f"<ct, J d> = {fd!r}, difference {abs(ad - fd):.3g} > tolerance "
                    f"{tol:.3g} (outputs: {_names(problem.outputs)}; precision "
                    f"{precision}).{detail}")
            total_fd += fd
            total_ad += ad
            worst = max(worst, _errors(np.array([ad]), np.array([fd]), magnitude))
    return GradCheckResult(
        kernel_name=problem.name,
        inputs=tuple(s.name for s in problem.inputs),
        outputs=tuple(s.name for s in problem.outputs),
        precision=precision, eps=eps, rtol=rtol, atol=atol,
        directional_fd=total_fd, directional_adjoint=total_ad,
        jacobian_checked=False,
        max_abs_error=worst[0], max_rel_error=worst[1],
    )


def _config_text(config):
    return ", ".join(str(c) for c in config)


def _explain_cuda(problem, s, ct, g, x, eps, rtol, atol, unit, explain_max,
                  shown=8):
    """The elements of argument ``s`` whose gradient ``<ct, dF/dx_j>`` differs from
    central differences, as text (empty when ``s`` is larger than ``explain_max``)."""
    size = s.stop - s.start
    if size > explain_max:
        return ""
    fd = np.empty(size)
    noise = np.empty(size)
    for j in range(size):
        delta = np.zeros(problem.n_in)
        delta[s.start + j] = eps * max(1.0, abs(x[s.start + j]))
        y_plus, y_minus, step = _evaluate_pair(problem, x, delta)
        h = step[s.start + j]
        if h == 0.0:
            return ""
        fd[j] = float(ct @ (y_plus - y_minus)) / h
        noise[j] = _NOISE_FACTOR * unit * float(
            np.abs(ct) @ np.maximum(np.abs(y_plus), np.abs(y_minus))) / abs(h / 2.0)
    ad = g[s.start:s.stop]
    err = np.abs(ad - fd)
    bad = np.nonzero(err > atol + noise + rtol * np.abs(fd))[0]
    if bad.size == 0:
        return (f" Element by element, the gradient of '{s.name}' agrees with finite "
                "differences (the mismatch is spread over many small errors).")
    order = bad[np.argsort(-err[bad])][:shown]
    items = []
    for j in order:
        idx = np.unravel_index(j, s.shape) if s.shape else ()
        where = f"[{', '.join(str(int(v)) for v in idx)}]" if s.shape else ""
        items.append(f"{s.name}{where}: adjoint {ad[j]:.6g}, finite differences "
                     f"{fd[j]:.6g}")
    more = f" (showing {len(order)})" if bad.size > len(order) else ""
    return (f" Gradient of '{s.name}' for this cotangent differs at {bad.size} of "
            f"{size} element(s){more}: " + "; ".join(items) + ".")
