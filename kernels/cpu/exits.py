"""Loops with several exits and input validation: Newton's method for Kepler's
equation stopped by a two-condition test, a bracketing search left by several breaks,
and a 5-point stencil that validates its inputs with ``assert`` and ``raise``.

PYTEST_DONT_REWRITE: pytest rewrites the asserts of every module of a distribution that
registers a pytest plugin (kadj does: ``kadj_pytest``); the kernels' own ``assert``
statements must stay plain Python for numba."""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from ._example import Example
from ..sizes import at_least


@njit
def kepler_newton(m, e, out):
    """Eccentric anomaly E with E - e sin E = M by Newton's method; the loop stops
    when a step is tiny after at least two steps (``and``), or after 50 steps."""
    for i in range(m.shape[0]):
        big_e = m[i]
        k = 0
        while True:
            d = (big_e - e[i] * math.sin(big_e) - m[i]) / (1.0 - e[i] * math.cos(big_e))
            big_e = big_e - d
            k += 1
            if k >= 2 and abs(d) < 1e-13:
                break
            if k >= 50:
                break
        out[i] = big_e


def kepler_newton_sized(rng, n):
    n = at_least(n, 1)
    return rng.uniform(0.2, 3.0, n), rng.uniform(0.05, 0.6, n), np.zeros(n)


def kepler_newton_args(rng):
    return kepler_newton_sized(rng, 9)


@njit
def bracket_interp(xk, yk, q, out):
    """Piecewise-linear interpolation through knots (xk, yk) by a scan from the left
    that stops at the first knot at or beyond q (if/elif/else with two breaks); queries
    beyond the last knot are extrapolated from the last segment, with a flatter
    slope."""
    n = xk.shape[0]
    for i in range(q.shape[0]):
        t = q[i]
        j = 1
        scale = 1.0
        while True:
            if t <= xk[j]:
                break
            elif j == n - 1:
                scale = 0.5
                break
            else:
                j += 1
        w = (t - xk[j - 1]) / (xk[j] - xk[j - 1])
        out[i] = yk[j - 1] + scale * w * (yk[j] - yk[j - 1])


def bracket_interp_sized(rng, n):
    """n queries over 8 + n // 8 knots, every query away from every knot."""
    n = at_least(n, 2)
    m = 8 + n // 8
    xk = np.arange(m, dtype=np.float64) + 0.3 * rng.random(m)
    q = np.floor(rng.uniform(0.0, m + 1.0, n)) + rng.uniform(0.45, 0.55, n)
    q = np.maximum(q, 0.5)
    return xk, rng.standard_normal(m), q, np.zeros(n)


def bracket_interp_args(rng):
    return bracket_interp_sized(rng, 12)


@njit
def validated_smooth(u, w, out):
    """out[i] = tanh of a weighted 5-point average, after checking the inputs (assert
    on the size, raise on mismatched shapes and on NaN); the two end points at each
    side are copied."""
    n = u.shape[0]
    assert n >= 5, "need at least five points"
    if out.shape[0] != n or w.shape[0] != 5:
        raise ValueError("out must match u and w must hold five weights")
    for i in range(n):
        if u[i] != u[i]:
            raise ValueError("NaN in u")
        if i < 2 or i > n - 3:
            out[i] = u[i]
        else:
            out[i] = math.tanh(w[0] * u[i - 2] + w[1] * u[i - 1] + w[2] * u[i] +
                               w[3] * u[i + 1] + w[4] * u[i + 2])


def validated_smooth_sized(rng, n):
    n = at_least(n, 5)
    return rng.standard_normal(n), rng.uniform(0.1, 0.3, 5), np.zeros(n)


def validated_smooth_args(rng):
    return validated_smooth_sized(rng, 11)


EXAMPLES = [
    Example("kepler_newton", kepler_newton, kepler_newton_args,
            tags=("while", "break", "newton", "math"), sized=kepler_newton_sized),
    Example("bracket_interp", bracket_interp, bracket_interp_args,
            tags=("while", "break", "branch"), sized=bracket_interp_sized),
    Example("validated_smooth", validated_smooth, validated_smooth_args,
            tags=("raise", "assert", "stencil"), sized=validated_smooth_sized),
]
