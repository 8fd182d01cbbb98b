"""The two comparisons :func:`~kadj.testing.check_grad` makes.

The inner-product test ``<ct, J d> == <adjoint(ct), d>`` with random directions per
input argument (the "dot-product test" of adjoint codes, as in JAX's
``check_vjp``), and, for small inputs, every Jacobian column from finite
differences against the adjoint's rows.  Each raises ``AssertionError`` with a
message from :mod:`kadj.testing.report` on a confirmed disagreement, and the
inner-product test also where finite differences are too noisy to decide.
"""
from __future__ import annotations

import numpy as np

from .adjoint import _round_to_outputs, _vjp
from .probes import _REFINE, _confirmed, _unit
from .problem import _element_name
from .report import _jacobian_failure, _mismatch_text, _row_name

_RANDOM_ROWS = 8


def _direction(problem, point, s, ct, g, rng, tol):
    """The inner-product test along one random direction in argument ``s``.

    Raises where the probe agrees but its rounding noise is too large for the
    agreement to mean anything (see :mod:`kadj.testing.probes`)."""
    d = np.zeros(problem.n_in)
    part = slice(s.start, s.stop)
    d[part] = point.steps[part] / tol.eps * rng.standard_normal(s.stop - s.start)
    verdict = _confirmed(problem, point, d, tol.eps, ct[None, :], g[None, :], tol,
                         f"argument '{s.name}'")
    if not np.all(np.isfinite(verdict.fd)):
        raise AssertionError(_not_finite_text(
            problem, s, tol, f" (<ct, J d> = {float(verdict.fd[0])!r})"))
    if verdict.agrees[0] and verdict.undecidable[0]:
        raise AssertionError(_undecidable_text(problem, s, verdict, tol))
    if verdict.absorbed[0]:
        raise AssertionError(_absorbed_text(problem, s, verdict, tol))
    return verdict


def _cannot_check(problem, s, why, advice):
    """The message of a check that finite differences cannot decide: ``why``, then
    ``advice`` (a sentence without its full stop)."""
    return (f"Finite differences cannot check the gradient of kernel "
            f"'{problem.name}' for argument '{s.name}' at these arguments: {why}. "
            f"{advice}; or leave '{s.name}' out with wrt.")


def _not_finite_text(problem, s, tol, where):
    return _cannot_check(
        problem, s, "the outputs are not finite at the points the finite differences "
        f"step to{where}",
        "Check it at a point farther from where the kernel's outputs become infinite "
        f"or NaN, or with a smaller relative step eps (now {tol.eps:.3g})")


def _finite_outputs(problem, point):
    """Raise when the kernel's outputs at the check's point are not all finite: no
    difference of them tells anything about the gradient."""
    y0 = point.y0
    bad = np.flatnonzero(~np.isfinite(y0))
    if not bad.size:
        return
    shown = ", ".join(f"{_row_name(problem, int(r), True)} = {float(y0[r])!r}" for r in bad[:4])
    more = f", ... ({bad.size} of {y0.size} elements)" if bad.size > 4 else ""
    raise AssertionError(
        f"Finite differences cannot check the gradient of kernel '{problem.name}': "
        f"its outputs at these arguments are not finite ({shown}{more}). Check it at "
        "arguments where the kernel's outputs are finite.")


def _undecidable_text(problem, s, verdict, tol):
    noise, size = float(verdict.noise[0]), float(verdict.magnitude[0])
    first = verdict.first
    where = ""
    if not first.agrees[0]:
        where = (f" (at the {_REFINE:g}x smaller step that was to confirm a "
                 f"disagreement at eps: <adjoint(ct), d> = {float(first.ad[0])!r} "
                 f"against {float(first.fd[0])!r} from finite differences)")
    return _cannot_check(
        problem, s,
        f"the rounding noise of the {tol.precision} finite differences ({noise:.3g}) "
        f"exceeds half the size of the inner product <ct, J d> ({size:.3g}){where}, "
        "so a gradient wrong by half would pass as well",
        "Check it in float64 (with float64 copies of the arguments), at a point where "
        "the outputs are not large next to their changes, or with a larger relative "
        f"step eps (now {tol.eps:.3g}) if the kernel is smooth over it")


def _absorbed_text(problem, s, verdict, tol):
    probe = verdict.second
    return _cannot_check(
        problem, s,
        f"<adjoint(ct), d> = {float(probe.ad[0])!r} against {float(probe.fd[0])!r} "
        "from finite differences, a difference within the rounding of outputs that "
        f"the steps left unchanged (of size up to {float(probe.s_abs[0]):.3g}): an "
        "output large next to its change rounds to the same value on both sides of "
        "the step, and the differences miss the change",
        "Check it at a point where the outputs are not large next to their changes")


def _inner_product_test(problem, point, ct, g, rng, tol, explain_max, directions,
                        heading):
    """``<ct, J d>`` against ``<adjoint(ct), d>``, ``directions`` random ``d`` per
    input, given ``g = adjoint(ct)``.

    One adjoint call serves every input; perturbing one argument at a time costs two
    forward runs per direction (four when a disagreement is confirmed) and names the
    argument whose gradient is wrong.  ``heading(s, k)`` opens the failure message
    for argument ``s`` and direction ``k``.
    """
    _finite_outputs(problem, point)
    total_fd = total_ad = 0.0
    worst = (0.0, 0.0)
    for s in problem.inputs:
        if s.stop == s.start:
            continue        # an array of size 0: no direction to probe
        for k in range(directions):
            verdict = _direction(problem, point, s, ct, g, rng, tol)
            if not verdict.agrees[0]:
                raise AssertionError(
                    heading(s, k) + _mismatch_text(problem, point, s, ct, g, verdict,
                                                   tol, explain_max))
            fd, ad = float(verdict.fd[0]), float(verdict.ad[0])
            total_fd += fd
            total_ad += ad
            worst = max(worst, _errors(np.array([ad]), np.array([fd]),
                                       float(verdict.magnitude[0])))
    return total_fd, total_ad, worst


def _jacobian_test(problem, point, rng, tol, rows_max):
    """Compare ``C^T J`` from finite differences with adjoint rows, column by column.

    ``C`` is the identity (one adjoint call per output element) when there are at
    most ``rows_max`` outputs, else a few random cotangents.
    """
    if problem.n_out == 0:
        return 0.0, 0.0     # no output element: the inner-product test saw the zero
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
        if not np.all(np.isfinite(verdict.fd)):
            s = next(s for s in problem.inputs if s.start <= j < s.stop)
            raise AssertionError(_not_finite_text(
                problem, s, tol, f" along {_element_name(problem, j)}"))
        fd[:, j], ad[:, j] = verdict.fd, verdict.ad
        if not np.all(verdict.agrees):
            failures.append((j, verdict))
    if failures:
        _jacobian_failure(problem, point, cts, unit_rows, failures)
    magnitude = float(np.abs(fd).max(initial=0.0))
    return _errors(ad, fd, magnitude)


def _errors(actual, desired, magnitude):
    abs_err = float(np.abs(actual - desired).max(initial=0.0))
    return abs_err, float(abs_err / magnitude) if magnitude > 0 else abs_err
