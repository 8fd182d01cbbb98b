"""Gradient checks: is a kernel's adjoint the transpose of its Jacobian?

A differentiated kernel is checked as the map ``F`` from the state *before* a call
(the contents of the differentiable inputs, ``plan.adjoint_args``) to the state
*after* it (the contents of the floating-point arrays it writes, then the return
value).  :func:`check_grad` establishes, against float64 central finite
differences of ``F`` and independently of how the adjoint was built, that

* the inner-product identity ``<ct, J d> == <adjoint(ct), d>`` holds for one random
  cotangent ``ct`` and, per input argument, random directions ``d`` (the
  "dot-product test" of adjoint codes, as in JAX's ``check_vjp``; one adjoint call,
  and two forward runs per argument and direction whatever the size: one direction
  when the Jacobian is compared too, three otherwise);
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

Tolerances at any size.  ``<ct, J d>`` and ``<adjoint(ct), d>`` are sums of many
terms of random sign, which grow like the square root of their number, so
the tolerance scales the same way: ``rtol`` is relative to the larger of the inner
product and the root-sum-square of its terms ``sqrt(sum_i (adjoint(ct)_i d_i)^2)``
(or of the outputs' contributions ``sqrt(sum_k (ct_k (J d)_k)^2)``), and on top of
``atol`` and ``rtol`` the comparison allows an estimate of the finite-difference
rounding noise, ``64 * unit_roundoff * sqrt(sum_k (ct_k F_k)^2) / step`` over the
outputs the step changes.  A gradient wrong by a relative error a few times ``rtol``
at every element therefore fails at 40 000 elements as at 10.  Where that noise
exceeds half the inner product the adjoint predicts (a float32 kernel whose outputs
are large next to their changes), finite differences cannot tell the adjoint from
one wrong by half: the check then fails with a message saying so (check in float64,
at a better-conditioned point, or with a larger ``eps``) rather than pass.  The
check is local: the edge of a function's domain (``log`` or ``sqrt`` of an element
smaller than its step) closer than the step makes finite differences meaningless;
pass a smaller ``eps`` there.

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

import numpy as np

from .adjoint import _random_cotangent, _vjp
from .checks import _inner_product_test, _jacobian_test
from .cuda import check_grad_cuda
from .forward import _read_inputs, _run_forward, _with_inputs
from .probes import _zero_step
from .problem import (_DEFAULTS, _element_name, _Point, _precision, _problem,
                      _steps, _tolerances)
from .result import GradCheckResult

# random directions per argument in the inner-product test when it is the only test
_DIRECTIONS = 3

__all__ = [
    "GradCheckResult",
    "adjoint_jacobian",
    "check_grad",
    "check_grad_cuda",
    "numerical_jacobian",
]


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

    Complex arguments and written complex arrays are checked as their real and
    imaginary parts: each element is probed in both directions, and the adjoint is read
    as ``dL/dx + i dL/dy`` (kadj's convention); a mismatch names the part
    (``z[3].imag``).

    Raises ``AssertionError`` naming the kernel and argument on a mismatch confirmed
    with a smaller step (and the elements, and suspected kinks or ties), and where
    finite-difference rounding noise is too large for the inner-product test to
    decide (see the module docstring); returns a :class:`GradCheckResult` otherwise.

    Example::

        @kadj.differentiate
        @njit
        def heat_step(u, u_new, alpha): ...

        check_grad(heat_step, (np.random.rand(16), np.zeros(16), 0.1))
    """
    problem = _problem(kernel, args, wrt, boundscheck)
    rng = np.random.default_rng(seed)
    tol = _tolerances(problem, eps, rtol, atol)
    point = _Point(problem, tol.eps)

    ct = _random_cotangent(problem, rng, adj_return)
    if problem.n_in == 0:
        # no input element (arrays of size 0): the adjoint still runs once, bounds-
        # checked, and returns its (empty) gradients; there is nothing to compare
        _vjp(problem, ct)
        return _nothing_to_compare(problem, tol)
    jacobian_checked = problem.n_in <= full_jacobian_max
    fd, ad, err_ip = _inner_product_test(
        problem, point, ct, _vjp(problem, ct), rng, tol, explain_max,
        1 if jacobian_checked else _DIRECTIONS,
        lambda s, k: (f"The adjoint of kernel '{problem.name}' fails the "
                      f"inner-product test for argument '{s.name}': "))
    errors = [err_ip]
    if jacobian_checked:
        errors.append(_jacobian_test(problem, point, rng, tol, full_jacobian_max))
    return GradCheckResult(
        kernel_name=problem.name,
        inputs=tuple(s.name for s in problem.inputs),
        outputs=tuple(s.name for s in problem.outputs),
        precision=tol.precision, eps=tol.eps, rtol=tol.rtol, atol=tol.atol,
        directional_fd=fd, directional_adjoint=ad,
        jacobian_checked=jacobian_checked,
        max_abs_error=max(e[0] for e in errors),
        max_rel_error=max(e[1] for e in errors),
    )


def _nothing_to_compare(problem, tol):
    return GradCheckResult(
        kernel_name=problem.name, inputs=tuple(s.name for s in problem.inputs),
        outputs=tuple(s.name for s in problem.outputs), precision=tol.precision,
        eps=tol.eps, rtol=tol.rtol, atol=tol.atol, directional_fd=0.0,
        directional_adjoint=0.0, jacobian_checked=True, max_abs_error=0.0,
        max_rel_error=0.0)


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
