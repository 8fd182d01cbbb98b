"""Gradient checks of ``@cuda.jit`` kernels: :func:`check_grad_cuda`.

The inner-product test of :func:`~kadj.testing.check_grad`, for a kernel launched
on a given ``(griddim, blockdim)``, with several random directions per argument.
Without a GPU it runs under the CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``, set
before numba is imported), whose array accesses are bounds-checked as NumPy's are.
"""
from __future__ import annotations

import numpy as np

from .adjoint import _random_cotangent, _vjp
from .checks import _inner_product_test
from .problem import _as_differentiated, _Point, _problem, _tolerances
from .result import GradCheckResult


class _CudaLaunch:
    """A differentiated CUDA kernel bound to one launch configuration, with the
    ``forward`` / ``adjoint`` / ``adjoint_plan`` interface the shared helpers use."""

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
    arrays and scalars and is not modified (device arrays, of any kind
    :mod:`kadj.arrays` accepts, are copied to the host once and checked there: every
    launch of the check then transfers NumPy arrays).

    The map checked is ``F``: the contents of the differentiable arguments before the
    launch -> the contents of the written floating-point arrays after it (see the
    package docstring).  One adjoint launch, seeded with a random cotangent ``ct`` on
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
    Also raises where the finite differences' rounding noise is too large to decide,
    as :func:`check_grad` does.  Returns a :class:`GradCheckResult`.

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

    def heading(s, k):
        return (f"The adjoint of CUDA kernel '{problem.name}' launched as "
                f"[{_config_text(config)}] fails the inner-product test for "
                f"argument '{s.name}' (direction {k + 1} of {directions}; "
                f"precision {tol.precision}): ")

    total_fd, total_ad, worst = _inner_product_test(
        problem, point, ct, g, rng, tol, explain_max, directions, heading)
    return GradCheckResult(
        kernel_name=problem.name,
        inputs=tuple(s.name for s in problem.inputs),
        outputs=tuple(s.name for s in problem.outputs),
        precision=tol.precision, eps=tol.eps, rtol=tol.rtol, atol=tol.atol,
        directional_fd=total_fd, directional_adjoint=total_ad,
        jacobian_checked=False,
        max_abs_error=worst[0], max_rel_error=worst[1],
    )


def _config_text(config):
    return ", ".join(str(c) for c in config)
