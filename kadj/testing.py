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

Steps.  Finite differences are formed in float64 from forward runs of the kernel as
compiled, so a float32 kernel is run in float32: compiling it for float64 would
check a different kernel.  The step for element ``x_j`` of argument ``a`` is relative
to its magnitude, ``eps * max(|x_j|, mean |a|)`` (``eps * max(|x_j|, 1)`` when ``a``
is all zeros), so a grid spacing ``dx = 0.005`` is perturbed by ``eps * 0.005``, not
by ``eps``.  The perturbed inputs are rounded to their dtype and the rounded step is
the one used.  The defaults adapt to the working precision (the lowest precision
among the differentiable inputs and outputs):

=========  ====================  ======  ======
precision  eps (relative step)   rtol    atol
=========  ====================  ======  ======
float64    cbrt(2.2e-16) ~ 6e-6  1e-6    1e-8
float32    cbrt(1.2e-7)  ~ 5e-3  1e-2    1e-5
=========  ====================  ======  ======

On top of ``atol`` and ``rtol`` the comparison allows an estimate of the
finite-difference rounding noise, ``64 * unit_roundoff * |F| / step``.  The check is
local: the edge of a function's domain (``log`` or ``sqrt`` of an element smaller
than its step) closer than the step makes finite differences meaningless; pass a
smaller ``eps`` there.

Confirmation and kinks.  A disagreement is confirmed with a step four times
smaller: truncation error shrinks sixteen-fold, a wrong gradient stays wrong.  Only a
confirmed disagreement fails.  The failure message then names the elements whose
gradient differs and, where the forward and backward one-sided differences disagree
with each other at both steps (``abs``, ``min``/``max`` and comparisons at a tie, a
clamp at its bound), says that the function looks non-differentiable there (a kink
or tie) and whether the adjoint's value is one of the one-sided derivatives: finite
differences cannot check a gradient at such a point, so choose another one.

Bounds checking.  The adjoint of a CPU kernel is run compiled with numba's
``boundscheck=True`` (unless ``boundscheck=False``), so an out-of-bounds access in it
raises ``IndexError`` and fails the check instead of reading or corrupting memory.
``NUMBA_BOUNDSCHECK=1`` or ``0`` in the environment overrides it, as it overrides
every numba ``boundscheck`` option.

CUDA kernels.  :func:`check_grad_cuda` runs the same inner-product test for a
``@cuda.jit`` kernel launched on a given ``(griddim, blockdim)``, with several random
directions per argument; on a mismatch it reports, for small arguments, the elements
where the adjoint and finite differences disagree, and suspected kinks.  Without a
GPU it runs under the CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``, set before numba is
imported), whose array accesses are bounds-checked as NumPy's are; numba cannot
bounds-check code compiled for a GPU.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from functools import cached_property

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
_REFINE = 4.0       # a disagreement is confirmed with a step this many times smaller
_SHOWN = 8          # elements listed in a failure message


@dataclass(frozen=True)
class GradCheckResult:
    """What :func:`check_grad` compared, and how close the adjoint came.

    inputs / outputs:     names of the checked inputs and of the outputs
                          (``"return"`` for a return value), in flattening order.
    precision:            ``"float64"`` or ``"float32"``, which chose the defaults.
    eps:                  the relative step (see the module docstring).
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


@dataclass(frozen=True)
class _Tol:
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


# --------------------------------------------------------------------------- public


def check_grad(kernel, args, wrt=None, *, rtol=None, atol=None, eps=None, seed=0,
               full_jacobian_max=64, adj_return=None, boundscheck=True,
               explain_max=256):
    """Check ``kernel``'s adjoint against central finite differences at ``args``.

    ``kernel`` is a differentiated kernel (``kadj.differentiate``); an undecorated
    ``@njit`` function is differentiated first.  ``wrt`` narrows the checked inputs
    (argument names or indices among the kernel's differentiable arguments);
    ``rtol``, ``atol`` and ``eps`` (the relative step) default by precision (see the
    module docstring).  ``adj_return`` fixes the cotangent of a return value in the
    inner-product test (random by default).  ``boundscheck``: run the adjoint
    compiled with bounds checking, so an out-of-bounds access fails the check.
    ``explain_max``: on a failure, arguments with at most this many elements are
    examined element by element for the message.

    Raises ``AssertionError`` naming the kernel and argument on a mismatch confirmed
    with a smaller step (and the elements, and suspected kinks or ties); returns a
    :class:`GradCheckResult` otherwise.

    Example::

        @kadj.differentiate
        @njit
        def heat_step(u, u_new, alpha): ...

        check_grad(heat_step, (np.random.rand(16), np.zeros(16), 0.1))
    """
    problem = _problem(kernel, args, wrt, boundscheck)
    rng = np.random.default_rng(seed)
    precision = _precision(problem)
    tol = _tolerances(problem, eps, rtol, atol)
    point = _Point(problem, tol.eps)

    ct = _random_cotangent(problem, rng, adj_return)
    fd, ad, err_ip = _inner_product_test(problem, point, ct, rng, tol, explain_max)
    errors = [err_ip]
    jacobian_checked = problem.n_in <= full_jacobian_max
    if jacobian_checked:
        errors.append(_jacobian_test(problem, point, rng, tol, full_jacobian_max))
    return GradCheckResult(
        kernel_name=problem.name,
        inputs=tuple(s.name for s in problem.inputs),
        outputs=tuple(s.name for s in problem.outputs),
        precision=precision, eps=tol.eps, rtol=tol.rtol, atol=tol.atol,
        directional_fd=fd, directional_adjoint=ad,
        jacobian_checked=jacobian_checked,
        max_abs_error=max(e[0] for e in errors),
        max_rel_error=max(e[1] for e in errors),
    )


def numerical_jacobian(kernel, args, wrt=None, *, eps=None):
    """The Jacobian of ``kernel`` at ``args`` by float64 central differences.

    Rows are the outputs (written floating-point arrays in argument order, each
    flattened in C order, then the return value); columns are the inputs, flattened
    the same way.  Steps are chosen as by :func:`check_grad`.  ``args`` is not
    modified.
    """
    problem = _problem(kernel, args, wrt, boundscheck=False)
    if eps is None:
        eps = _DEFAULTS[_precision(problem)][0]
    x = _read_inputs(problem, problem.args)
    steps = _steps(problem, x, float(eps))
    jac = np.empty((problem.n_out, problem.n_in))
    for j in range(problem.n_in):
        delta = np.zeros(problem.n_in)
        delta[j] = steps[j]
        plus, minus = _with_inputs(problem, x + delta), _with_inputs(problem, x - delta)
        step = _read_inputs(problem, plus)[j] - _read_inputs(problem, minus)[j]
        if step == 0.0:
            raise AssertionError(_zero_step(problem, _element_name(problem, j)))
        jac[:, j] = (_run_forward(problem, plus) - _run_forward(problem, minus)) / step
    return jac


def adjoint_jacobian(kernel, args, wrt=None, *, boundscheck=True):
    """The Jacobian of ``kernel`` at ``args`` built row by row from its adjoint.

    Same layout as :func:`numerical_jacobian`: one adjoint call per output element.
    """
    problem = _problem(kernel, args, wrt, boundscheck)
    return np.stack([_vjp(problem, e) for e in np.eye(problem.n_out)]).reshape(
        problem.n_out, problem.n_in)


# ---------------------------------------------------------------- problem set-up


def _problem(kernel, args, wrt, boundscheck):
    kernel = _as_differentiated(kernel)
    if boundscheck:
        kernel = _BoundsChecked.wrap(kernel)
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


def _tolerances(problem, eps, rtol, atol):
    """The given eps, rtol and atol, else the working precision's defaults."""
    precision = _precision(problem)
    d_eps, d_rtol, d_atol = _DEFAULTS[precision]
    return _Tol(d_eps if eps is None else float(eps),
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



# ------------------------------------------------------------- bounds checking

_CHECKED = weakref.WeakKeyDictionary()   # adjoint py_func -> bounds-checked dispatcher


class _BoundsChecked:
    """A CPU differentiated kernel whose adjoint runs compiled with bounds checking."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.__name__ = kernel.__name__

    @classmethod
    def wrap(cls, kernel):
        from .api import DifferentiatedKernel  # testing sits on top of the pipeline

        return cls(kernel) if isinstance(kernel, DifferentiatedKernel) else kernel

    def forward(self, *args):
        return self.kernel.forward(*args)

    def adjoint_plan(self, *args):
        return self.kernel.adjoint_plan(*args)

    def adjoint(self, *args, adj_return=1.0):
        n = len(self.kernel.arg_names)
        compiled = self.kernel.compiled(*args[:n])
        call = list(args)
        if compiled.plan.returns_value:
            call.append(float(adj_return))
        return _checked_function(self.kernel, compiled)(*call)


def _checked_function(kernel, compiled):
    """``compiled.function``, recompiled with ``boundscheck=True`` unless it has bounds
    checks already (or ``NUMBA_BOUNDSCHECK`` decides for every function)."""
    from numba import config, njit

    options = kernel._options()
    if config.BOUNDSCHECK is not None or options.get("boundscheck"):
        return compiled.function
    py_func = compiled.function.py_func
    checked = _CHECKED.get(py_func)
    if checked is None:
        # not cached on disk: numba's cache key ignores the boundscheck option
        checked = njit(cache=False, **dict(options, boundscheck=True))(py_func)
        _CHECKED[py_func] = checked
    return checked


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


# -------------------------------------------------------- finite-difference probes


@dataclass(frozen=True)
class _Probe:
    """Differences of ``C F`` at ``x + t d`` and ``x - t d`` for cotangent rows ``C``,
    next to what the adjoint rows ``G`` predict for the same rounded steps.

    Arrays hold one entry per row of ``C``; derivatives are per unit of ``d``, divided
    by the steps actually taken along ``d`` (``sp`` forward, ``sm`` backward).
    """

    sp: float
    sm: float
    cp: np.ndarray      # C F(x+)
    cm: np.ndarray      # C F(x-)
    pp: np.ndarray      # G (x+ - x)
    pm: np.ndarray      # G (x - x-)
    f_abs: np.ndarray   # |C| max(|F(x+)|, |F(x-)|)
    g_abs: np.ndarray   # |G| |x+ - x-|
    tol: _Tol

    @property
    def fd(self):
        return (self.cp - self.cm) / (self.sp + self.sm)

    @property
    def ad(self):
        return (self.pp + self.pm) / (self.sp + self.sm)

    @property
    def magnitude(self):
        return np.maximum(np.abs(self.ad), self.g_abs / (self.sp + self.sm))

    @property
    def allowed(self):
        t = self.tol
        return (t.atol + t.rtol * self.magnitude
                + _NOISE_FACTOR * t.unit * self.f_abs / (self.sp + self.sm))

    @property
    def agrees(self):
        return np.abs(self.fd - self.ad) <= self.allowed

    def one_sided(self, c0, f0_abs):
        """(forward and backward differences, each minus the adjoint's prediction for
        its half step, and the allowed size of their difference), given ``C F(x)``."""
        if self.sp <= 0.0 or self.sm <= 0.0:
            zero = np.zeros_like(self.cp)
            return zero, zero, np.full_like(self.cp, np.inf)
        forward = (self.cp - c0 - self.pp) / self.sp
        backward = (c0 - self.cm - self.pm) / self.sm
        t = self.tol
        allowed = (t.atol + t.rtol * self.magnitude + _NOISE_FACTOR * t.unit
                   * (self.f_abs + f0_abs) / min(self.sp, self.sm))
        return forward, backward, allowed

    def slopes(self, c0):
        """The forward and backward one-sided derivatives, given ``C F(x)``."""
        return (self.cp - c0) / self.sp, (c0 - self.cm) / self.sm


def _probe(problem, point, d, t, cts, rows, tol, what):
    delta = t * d
    plus = _with_inputs(problem, point.x + delta)
    minus = _with_inputs(problem, point.x - delta)
    dp = _read_inputs(problem, plus) - point.x
    dm = point.x - _read_inputs(problem, minus)
    dd = float(d @ d)
    sp, sm = float(dp @ d) / dd, float(dm @ d) / dd
    if not sp + sm > 0.0:
        raise AssertionError(_zero_step(problem, what))
    yp, ym = _run_forward(problem, plus), _run_forward(problem, minus)
    return _Probe(sp, sm, cts @ yp, cts @ ym, rows @ dp, rows @ dm,
                  np.abs(cts) @ np.maximum(np.abs(yp), np.abs(ym)),
                  np.abs(rows) @ np.abs(dp + dm), tol)


def _zero_step(problem, what):
    return (f"check_grad's step for {what} of kernel '{problem.name}' rounds to zero "
            "in the input's dtype; pass a larger eps.")


@dataclass(frozen=True)
class _Verdict:
    """A probe at step t and, where it disagreed, the confirming probe at t / 4."""

    first: _Probe
    second: object      # _Probe or None

    @property
    def agrees(self):
        if self.second is None:
            return self.first.agrees
        return self.first.agrees | self.second.agrees

    def _pick(self, name):
        value = getattr(self.first, name)
        if self.second is None:
            return value
        return np.where(self.first.agrees, value, getattr(self.second, name))

    @property
    def fd(self):
        return self._pick("fd")

    @property
    def ad(self):
        return self._pick("ad")

    @property
    def allowed(self):
        return self._pick("allowed")

    @property
    def magnitude(self):
        return self._pick("magnitude")

    def kinks(self, c0, f0_abs):
        """Rows where the one-sided differences disagree with each other by more than
        the tolerance at both steps, without shrinking as the step does (a smooth
        function's disagreement shrinks with the step; a kink's or a tie's does not)."""
        if self.second is None:
            return np.zeros(self.first.cp.shape, dtype=bool)
        f1, b1, _ = self.first.one_sided(c0, f0_abs)
        f4, b4, allowed = self.second.one_sided(c0, f0_abs)
        jump1, jump4 = np.abs(f1 - b1), np.abs(f4 - b4)
        return ~self.agrees & (jump4 > allowed) & (jump4 > 0.5 * jump1)

    def kink_values(self, c0, row):
        """(forward slope, backward slope, adjoint, whether the adjoint is one of the
        one-sided derivatives) for ``row``, extrapolated to a zero step."""
        f1, b1 = self.first.slopes(c0)
        f4, b4 = self.second.slopes(c0)
        fwd = (_REFINE * f4[row] - f1[row]) / (_REFINE - 1.0)
        bwd = (_REFINE * b4[row] - b1[row]) / (_REFINE - 1.0)
        ad = float(self.second.ad[row])
        slack = max(float(self.second.allowed[row]), 0.05 * abs(fwd - bwd))
        return fwd, bwd, ad, min(abs(ad - fwd), abs(ad - bwd)) <= slack


def _confirmed(problem, point, d, t, cts, rows, tol, what):
    first = _probe(problem, point, d, t, cts, rows, tol, what)
    if bool(np.all(first.agrees)):
        return _Verdict(first, None)
    return _Verdict(first, _probe(problem, point, d, t / _REFINE, cts, rows, tol, what))


def _unit(problem, j):
    d = np.zeros(problem.n_in)
    d[j] = 1.0
    return d


def _element_name(problem, j):
    for s in problem.inputs:
        if s.start <= j < s.stop:
            return _index_name(s, j - s.start)
    raise IndexError(j)


def _index_name(slot, k):
    if not slot.shape:
        return slot.name
    idx = np.unravel_index(k, slot.shape)
    return f"{slot.name}[{', '.join(str(int(v)) for v in idx)}]"


# ---------------------------------------------------------------------- the tests


def _direction(problem, point, s, ct, g, rng, tol):
    """The inner-product test along one random direction in argument ``s``."""
    d = np.zeros(problem.n_in)
    part = slice(s.start, s.stop)
    d[part] = point.steps[part] / tol.eps * rng.standard_normal(s.stop - s.start)
    return _confirmed(problem, point, d, tol.eps, ct[None, :], g[None, :], tol,
                      f"argument '{s.name}'")


def _inner_product_test(problem, point, ct, rng, tol, explain_max):
    """``<ct, J d>`` against ``<adjoint(ct), d>``, one random ``d`` per input.

    One adjoint call serves every input; perturbing one argument at a time costs two
    forward runs each (four when a disagreement is confirmed) and names the argument
    whose gradient is wrong.
    """
    g = _vjp(problem, ct)
    total_fd = total_ad = 0.0
    worst = (0.0, 0.0)
    for s in problem.inputs:
        verdict = _direction(problem, point, s, ct, g, rng, tol)
        fd, ad = float(verdict.fd[0]), float(verdict.ad[0])
        if not verdict.agrees[0]:
            raise AssertionError(
                f"The adjoint of kernel '{problem.name}' fails the inner-product test "
                f"for argument '{s.name}': "
                + _mismatch_text(problem, point, s, ct, g, verdict, tol,
                                 explain_max))
        total_fd += fd
        total_ad += ad
        worst = max(worst, _errors(np.array([ad]), np.array([fd]),
                                   float(verdict.magnitude[0])))
    return total_fd, total_ad, worst


def _mismatch_text(problem, point, s, ct, g, verdict, tol, explain_max):
    first, second = verdict.first, verdict.second
    fd, ad = float(first.fd[0]), float(first.ad[0])
    return (f"<adjoint(ct), d> = {ad!r} but central finite differences give "
            f"<ct, J d> = {fd!r}, difference {abs(ad - fd):.3g} > tolerance "
            f"{float(first.allowed[0]):.3g}; a {_REFINE:g}x smaller step confirms it "
            f"({float(second.fd[0])!r}) (outputs: {_names(problem.outputs)}). "
            + _explain(problem, point, s, ct, g, verdict, tol, explain_max))


def _explain(problem, point, s, ct, g, verdict, tol, explain_max):
    """Which elements of ``s`` disagree, and which look like kinks, as text."""
    c0 = np.array([ct @ point.y0])
    f0_abs = np.array([np.abs(ct) @ np.abs(point.y0)])
    size = s.stop - s.start
    if size > explain_max:
        if verdict.kinks(c0, f0_abs)[0]:
            where = (f"along a random direction in '{s.name}' ({size} elements, more "
                     f"than explain_max={explain_max}, so the element is not located)")
            return _kink_text(s, [(where, *verdict.kink_values(c0, 0))])
        return (f"'{s.name}' has {size} elements, more than explain_max={explain_max}: "
                "the elements that differ are not located.")
    kinks, wrong = [], []
    for k in range(size):
        j = s.start + k
        element = _confirmed(problem, point, _unit(problem, j), point.steps[j],
                             ct[None, :], g[None, :], tol, _index_name(s, k))
        if element.agrees[0]:
            continue
        if element.kinks(c0, f0_abs)[0]:
            kinks.append((_index_name(s, k), *element.kink_values(c0, 0)))
        else:
            wrong.append((abs(float(element.ad[0] - element.fd[0])), _index_name(s, k),
                          float(element.ad[0]), float(element.fd[0])))
    text = _wrong_text(s, wrong, size)
    if kinks:
        text = (text + " " if wrong else "") + _kink_text(s, kinks)
    if not text:
        text = (f"Element by element, the gradient of '{s.name}' agrees with finite "
                "differences (the mismatch is spread over many small errors).")
    return text


def _wrong_text(s, wrong, size):
    if not wrong:
        return ""
    wrong.sort(key=lambda w: -w[0])
    shown = wrong[:_SHOWN]
    more = f" (showing {len(shown)})" if len(wrong) > len(shown) else ""
    items = "; ".join(f"{where}: adjoint {ad:.8g}, finite differences {fd:.8g}"
                      for _, where, ad, fd in shown)
    return (f"Gradient of '{s.name}' for this cotangent differs at {len(wrong)} of "
            f"{size} element(s){more}: {items}.")


def _kink_text(s, kinks):
    """``kinks``: (where, forward slope, backward slope, adjoint, adjoint is one of
    them)."""
    shown = kinks[:_SHOWN]
    one_of = all(k[4] for k in shown)
    items = "; ".join(
        f"{where}: one-sided derivatives {fwd:.6g} (forward) and {bwd:.6g} "
        f"(backward), adjoint {ad:.6g}"
        + ("" if one_of else (" (one of them)" if match else " (neither)"))
        for where, fwd, bwd, ad, match in shown)
    more = f" (showing {len(shown)} of {len(kinks)})" if len(kinks) > len(shown) else ""
    verdict = ("the adjoint's value is one of the one-sided derivatives" if one_of else
               "the adjoint's value is not always one of the one-sided derivatives")
    return (f"The function looks non-differentiable (a kink or tie) near this point; "
            f"{verdict}{more}: {items}. Finite differences cannot check a gradient "
            f"there: check at a point away from kinks and ties (other values of "
            f"'{s.name}'), or leave '{s.name}' out with wrt.")


def _jacobian_test(problem, point, rng, tol, rows_max):
    """Compare ``C^T J`` from finite differences with adjoint rows, column by column.

    ``C`` is the identity (one adjoint call per output element) when there are at
    most ``rows_max`` outputs, else a few random cotangents.
    """
    unit_rows = problem.n_out <= rows_max
    if unit_rows:
        cts = np.eye(problem.n_out)
    else:
        cts = np.stack([_round_to_outputs(problem, rng.standard_normal(problem.n_out))
                        for _ in range(_RANDOM_ROWS)])
    rows = np.stack([_vjp(problem, c) for c in cts])
    fd, ad = np.empty(rows.shape), np.empty(rows.shape)
    failures = []
    for j in range(problem.n_in):
        verdict = _confirmed(problem, point, _unit(problem, j), point.steps[j], cts,
                             rows, tol, _element_name(problem, j))
        fd[:, j], ad[:, j] = verdict.fd, verdict.ad
        if not np.all(verdict.agrees):
            failures.append((j, verdict))
    if failures:
        _jacobian_failure(problem, point, cts, unit_rows, failures)
    magnitude = float(np.abs(fd).max(initial=0.0))
    return _errors(ad, fd, magnitude)


def _jacobian_failure(problem, point, cts, unit_rows, failures):
    """Raise for the first input argument with disagreeing columns."""
    c0, f0_abs = cts @ point.y0, np.abs(cts) @ np.abs(point.y0)
    j0 = failures[0][0]
    s_in = next(s for s in problem.inputs if s.start <= j0 < s.stop)
    kinks, wrong, blocks = [], [], []
    for j, verdict in failures:
        if not s_in.start <= j < s_in.stop:
            continue
        kinky = verdict.kinks(c0, f0_abs)
        for r in np.nonzero(~verdict.agrees)[0]:
            out = _row_name(problem, r, unit_rows)
            where = f"d({out} after)/d({_element_name(problem, j)} before)"
            if kinky[r]:
                kinks.append((where, *verdict.kink_values(c0, r)))
            else:
                wrong.append((abs(float(verdict.ad[r] - verdict.fd[r])), where,
                              float(verdict.ad[r]), float(verdict.fd[r]),
                              float(verdict.allowed[r])))
            block = _row_block(problem, r, unit_rows)
            if block not in blocks:
                blocks.append(block)
    what = ", ".join(f"d({b} after)/d({s_in.name} before)" for b in blocks)
    text = (f"The adjoint of kernel '{problem.name}' disagrees with central finite "
            f"differences in {what} (argument '{s_in.name}'), confirmed with a "
            f"{_REFINE:g}x smaller step.")
    if wrong:
        wrong.sort(key=lambda w: -w[0])
        shown = wrong[:_SHOWN]
        more = f", showing {len(shown)}" if len(wrong) > len(shown) else ""
        text += (f" {len(wrong)} entr{'y differs' if len(wrong) == 1 else 'ies differ'}"
                 f"{more}: " + "; ".join(
                     f"{where}: adjoint {ad:.8g}, finite differences {fd:.8g} "
                     f"(difference {diff:.3g} > tolerance {allowed:.3g})"
                     for diff, where, ad, fd, allowed in shown) + ".")
    if kinks:
        text += " " + _kink_text(s_in, kinks)
    raise AssertionError(text)


def _row_name(problem, r, unit_rows):
    if not unit_rows:
        return f"random cotangent {r}"
    for s in problem.outputs:
        if s.start <= r < s.stop:
            return _index_name(s, r - s.start) if s.index >= 0 else s.name
    raise IndexError(r)


def _row_block(problem, r, unit_rows):
    if not unit_rows:
        return "random cotangents"
    return next(s.name for s in problem.outputs if s.start <= r < s.stop)


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
    (two launches per direction, two more to confirm a disagreement with a smaller
    step).  The adjoint launch must leave the forward arguments untouched.  ``rtol``,
    ``atol`` and ``eps`` default by precision, and steps are chosen, as for
    :func:`check_grad`.

    On a confirmed mismatch, raises ``AssertionError`` naming the kernel, the launch
    and the argument; when that argument has at most ``explain_max`` elements the
    message also lists the elements whose gradient differs (adjoint vs finite
    differences, two to four more launches per element) and suspected kinks or ties.
    Returns a :class:`GradCheckResult`.

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
    problem = _problem(launch, args, None, boundscheck=False)
    rng = np.random.default_rng(seed)
    precision = _precision(problem)
    tol = _tolerances(problem, eps, rtol, atol)
    point = _Point(problem, tol.eps)

    ct = _random_cotangent(problem, rng, None)
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
            verdict = _direction(problem, point, s, ct, g, rng, tol)
            if not verdict.agrees[0]:
                raise AssertionError(
                    f"The adjoint of CUDA kernel '{problem.name}' launched as "
                    f"[{_config_text(config)}] fails the inner-product test for "
                    f"argument '{s.name}' (direction {k + 1} of {directions}; "
                    f"precision {precision}): "
                    + _mismatch_text(problem, point, s, ct, g, verdict, tol,
                                     explain_max))
            fd, ad = float(verdict.fd[0]), float(verdict.ad[0])
            total_fd += fd
            total_ad += ad
            worst = max(worst, _errors(np.array([ad]), np.array([fd]),
                                       float(verdict.magnitude[0])))
    return GradCheckResult(
        kernel_name=problem.name,
        inputs=tuple(s.name for s in problem.inputs),
        outputs=tuple(s.name for s in problem.outputs),
        precision=precision, eps=tol.eps, rtol=tol.rtol, atol=tol.atol,
        directional_fd=total_fd, directional_adjoint=total_ad,
        jacobian_checked=False,
        max_abs_error=worst[0], max_rel_error=worst[1],
    )


def _config_text(config):
    return ", ".join(str(c) for c in config)
