"""Recurrences and iterations: filters, prefix sums, Horner, RK4, Newton, while loops.

Every one of these carries an active value from one iteration to the next,
through a scalar or through an array element written in place.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from ._example import Example
from ..sizes import at_least


@njit
def linear_recurrence(y, x, a):
    """y[i] = a*y[i-1] + x[i], in place (y[0] kept)."""
    for i in range(1, y.shape[0]):
        y[i] = a * y[i - 1] + x[i]


def linear_recurrence_sized(rng, n):
    n = at_least(n, 1)
    return rng.random(n), rng.random(n), 0.8


def linear_recurrence_args(rng):
    return linear_recurrence_sized(rng, 20)


@njit
def iir_biquad(x, y, b0, b1, b2, a1, a2):
    """Direct-form-I biquad filter: y = IIR(b, a) applied to x."""
    for i in range(x.shape[0]):
        acc = b0 * x[i]
        if i >= 1:
            acc += b1 * x[i - 1] - a1 * y[i - 1]
        if i >= 2:
            acc += b2 * x[i - 2] - a2 * y[i - 2]
        y[i] = acc


def iir_biquad_sized(rng, n):
    n = at_least(n, 1)
    return rng.standard_normal(n), np.zeros(n), 0.3, 0.4, 0.2, -0.5, 0.2


def iir_biquad_args(rng):
    return iir_biquad_sized(rng, 24)


@njit
def cumulative_sum(x, out):
    """Running sum: out[i] = x[0] + ... + x[i]."""
    s = 0.0
    for i in range(x.shape[0]):
        s += x[i]
        out[i] = s


def cumulative_sum_sized(rng, n):
    n = at_least(n, 1)
    return rng.standard_normal(n), rng.random(n)


def cumulative_sum_args(rng):
    return cumulative_sum_sized(rng, 15)


@njit
def moving_average(x, out, width):
    """Trailing moving average over `width` samples (integer window)."""
    n = x.shape[0]
    for i in range(width - 1, n):
        s = 0.0
        for k in range(width):
            s += x[i - k]
        out[i] = s / width


def moving_average_sized(rng, n):
    n = at_least(n, 4)
    return rng.standard_normal(n), np.zeros(n), 4


def moving_average_args(rng):
    return moving_average_sized(rng, 20)


@njit
def exp_moving_average(x, out, alpha):
    """Exponential moving average, the smoothed value carried in a scalar."""
    s = x[0]
    out[0] = s
    for i in range(1, x.shape[0]):
        s = alpha * x[i] + (1.0 - alpha) * s
        out[i] = s


def exp_moving_average_sized(rng, n):
    n = at_least(n, 1)
    return rng.standard_normal(n), np.zeros(n), 0.3


def exp_moving_average_args(rng):
    return exp_moving_average_sized(rng, 18)


@njit
def horner(coeffs, x, y):
    """Polynomial sum_k coeffs[k] x^k at every x[i], by Horner's rule."""
    deg = coeffs.shape[0] - 1
    for i in range(x.shape[0]):
        acc = coeffs[deg]
        for k in range(deg - 1, -1, -1):
            acc = acc * x[i] + coeffs[k]
        y[i] = acc


def horner_sized(rng, n):
    """n evaluation points of a degree-5 polynomial."""
    n = at_least(n, 1)
    return rng.standard_normal(6), rng.uniform(-1.0, 1.0, n), np.zeros(n)


def horner_args(rng):
    return horner_sized(rng, 16)


def horner_f32_sized(rng, n):
    c, x, y = horner_sized(rng, n)
    return c.astype(np.float32), x.astype(np.float32), y.astype(np.float32)


def horner_f32_args(rng):
    return horner_f32_sized(rng, 16)


@njit
def _pendulum_rhs(theta, omega, g_over_l, gamma):
    return omega, -g_over_l * math.sin(theta) - gamma * omega


@njit
def rk4_pendulum(theta, omega, g_over_l, gamma, dt, nsteps):
    """Damped pendulums integrated with classic RK4, in place, nsteps per element."""
    for i in range(theta.shape[0]):
        th = theta[i]
        om = omega[i]
        for step in range(nsteps):
            k1t, k1o = _pendulum_rhs(th, om, g_over_l, gamma)
            k2t, k2o = _pendulum_rhs(th + 0.5 * dt * k1t, om + 0.5 * dt * k1o,
                                     g_over_l, gamma)
            k3t, k3o = _pendulum_rhs(th + 0.5 * dt * k2t, om + 0.5 * dt * k2o,
                                     g_over_l, gamma)
            k4t, k4o = _pendulum_rhs(th + dt * k3t, om + dt * k3o, g_over_l, gamma)
            th = th + dt / 6.0 * (k1t + 2.0 * k2t + 2.0 * k3t + k4t)
            om = om + dt / 6.0 * (k1o + 2.0 * k2o + 2.0 * k3o + k4o)
        theta[i] = th
        omega[i] = om


def rk4_pendulum_sized(rng, n):
    n = at_least(n, 1)
    return rng.uniform(-1.0, 1.0, n), rng.uniform(-0.5, 0.5, n), 9.81, 0.3, 0.05, 8


def rk4_pendulum_args(rng):
    return rk4_pendulum_sized(rng, 6)


@njit
def _chain_rhs(x, v, k, dx, dv):
    n = x.shape[0]
    for i in range(n):
        left = x[i - 1] if i > 0 else 0.0
        right = x[i + 1] if i < n - 1 else 0.0
        dx[i] = v[i]
        dv[i] = k * (left - 2.0 * x[i] + right)


@njit
def rk4_chain(x, v, k, dt, nsteps):
    """RK4 for a chain of springs (fixed ends), stages in np.empty scratch arrays."""
    n = x.shape[0]
    k1x = np.empty(n)
    k1v = np.empty(n)
    k2x = np.empty(n)
    k2v = np.empty(n)
    k3x = np.empty(n)
    k3v = np.empty(n)
    k4x = np.empty(n)
    k4v = np.empty(n)
    xt = np.empty(n)
    vt = np.empty(n)
    for step in range(nsteps):
        _chain_rhs(x, v, k, k1x, k1v)
        for i in range(n):
            xt[i] = x[i] + 0.5 * dt * k1x[i]
            vt[i] = v[i] + 0.5 * dt * k1v[i]
        _chain_rhs(xt, vt, k, k2x, k2v)
        for i in range(n):
            xt[i] = x[i] + 0.5 * dt * k2x[i]
            vt[i] = v[i] + 0.5 * dt * k2v[i]
        _chain_rhs(xt, vt, k, k3x, k3v)
        for i in range(n):
            xt[i] = x[i] + dt * k3x[i]
            vt[i] = v[i] + dt * k3v[i]
        _chain_rhs(xt, vt, k, k4x, k4v)
        for i in range(n):
            x[i] += dt / 6.0 * (k1x[i] + 2.0 * k2x[i] + 2.0 * k3x[i] + k4x[i])
            v[i] += dt / 6.0 * (k1v[i] + 2.0 * k2v[i] + 2.0 * k3v[i] + k4v[i])


def rk4_chain_sized(rng, n):
    n = at_least(n, 1)
    return rng.uniform(-0.5, 0.5, n), rng.uniform(-0.5, 0.5, n), 2.0, 0.1, 4


def rk4_chain_args(rng):
    return rk4_chain_sized(rng, 6)


@njit
def newton_sqrt(a, out, niter):
    """sqrt(a) by a fixed number of Newton (Heron) iterations."""
    for i in range(a.shape[0]):
        x = 0.5 * (a[i] + 1.0)
        for it in range(niter):
            x = 0.5 * (x + a[i] / x)
        out[i] = x


def newton_sqrt_sized(rng, n):
    n = at_least(n, 1)
    return rng.uniform(0.5, 4.0, n), np.zeros(n), 6


def newton_sqrt_args(rng):
    return newton_sqrt_sized(rng, 12)


@njit
def kepler_solve(mean_anomaly, ecc, ecc_anomaly):
    """Kepler's equation E - e sin E = M by 8 Newton steps per element."""
    for i in range(mean_anomaly.shape[0]):
        m = mean_anomaly[i]
        e = m + ecc * math.sin(m)
        for it in range(8):
            e = e - (e - ecc * math.sin(e) - m) / (1.0 - ecc * math.cos(e))
        ecc_anomaly[i] = e


def kepler_solve_sized(rng, n):
    n = at_least(n, 1)
    return rng.uniform(0.1, 3.0, n), 0.3, np.zeros(n)


def kepler_solve_args(rng):
    return kepler_solve_sized(rng, 10)


@njit
def fixed_point_cos(p, out, n):
    """Solve x = p*cos(x) by n damped fixed-point iterations (a while loop)."""
    for i in range(p.shape[0]):
        x = 0.5
        k = 0
        while k < n:
            x = 0.5 * x + 0.5 * p[i] * math.cos(x)
            k += 1
        out[i] = x


def fixed_point_cos_sized(rng, n):
    n = at_least(n, 1)
    return rng.uniform(0.5, 1.5, n), np.zeros(n), 12


def fixed_point_cos_args(rng):
    return fixed_point_cos_sized(rng, 8)


@njit
def euler_until(y0, out, rate, dt, t_end):
    """Forward Euler for y' = 1 - rate*y while t < t_end (data-dependent count)."""
    for i in range(y0.shape[0]):
        y = y0[i]
        t = 0.0
        while t < t_end:
            y = y + dt * (1.0 - rate * y)
            t += dt
        out[i] = y


def euler_until_sized(rng, n):
    # 0.55 / 0.1: six steps, t never near t_end.
    n = at_least(n, 1)
    return rng.random(n), np.zeros(n), 1.5, 0.1, 0.55


def euler_until_args(rng):
    return euler_until_sized(rng, 9)


@njit
def newton_cbrt_converge(a, out, tol, maxit):
    """Cube root by Newton until the step is below tol (while loop with break)."""
    for i in range(a.shape[0]):
        x = 1.0
        k = 0
        while k < maxit:
            step = (x * x * x - a[i]) / (3.0 * x * x)
            x -= step
            k += 1
            if abs(step) < tol:
                break
        out[i] = x


def newton_cbrt_converge_sized(rng, n):
    # tol is a float but not an input to differentiate: wrt=("a",).
    n = at_least(n, 1)
    return rng.uniform(0.5, 8.0, n), np.zeros(n), 1e-13, 50


def newton_cbrt_converge_args(rng):
    return newton_cbrt_converge_sized(rng, 10)


@njit
def thomas_solve(lower, diag, upper, rhs, x):
    """Tridiagonal solve (Thomas algorithm), both sweeps through np.empty scratch."""
    n = diag.shape[0]
    c = np.empty(n)
    d = np.empty(n)
    c[0] = upper[0] / diag[0]
    d[0] = rhs[0] / diag[0]
    for i in range(1, n):
        denom = diag[i] - lower[i] * c[i - 1]
        c[i] = upper[i] / denom
        d[i] = (rhs[i] - lower[i] * d[i - 1]) / denom
    x[n - 1] = d[n - 1]
    for i in range(n - 2, -1, -1):
        x[i] = d[i] - c[i] * x[i + 1]


def thomas_solve_sized(rng, n):
    """One diagonally dominant system of n unknowns."""
    n = at_least(n, 1)
    lower = rng.uniform(-1.0, 1.0, n)
    upper = rng.uniform(-1.0, 1.0, n)
    diag = 3.0 + rng.random(n)                 # diagonally dominant
    return lower, diag, upper, rng.standard_normal(n), np.zeros(n)


def thomas_solve_args(rng):
    return thomas_solve_sized(rng, 10)


@njit
def thomas_batched(lower, diag, upper, rhs, x):
    """Thomas solves of many tridiagonal systems (one per row): the sweeps carry their
    last coefficients and unknown in scalars, the scratch rows are shared."""
    nsys, n = diag.shape
    c = np.empty(n)
    d = np.empty(n)
    for s in range(nsys):
        cp = upper[s, 0] / diag[s, 0]
        dp = rhs[s, 0] / diag[s, 0]
        c[0] = cp
        d[0] = dp
        for i in range(1, n):
            denom = diag[s, i] - lower[s, i] * cp
            cp = upper[s, i] / denom
            dp = (rhs[s, i] - lower[s, i] * dp) / denom
            c[i] = cp
            d[i] = dp
        xi = dp
        x[s, n - 1] = xi
        for i in range(n - 2, -1, -1):
            xi = d[i] - c[i] * xi
            x[s, i] = xi


@njit
def thomas_batched_private(lower, diag, upper, rhs, x):
    """Thomas solves of many tridiagonal systems (one per row), each system with its
    own scratch rows (the out-of-place twin of thomas_batched)."""
    nsys, n = diag.shape
    c = np.empty((nsys, n))
    d = np.empty((nsys, n))
    for s in range(nsys):
        cp = upper[s, 0] / diag[s, 0]
        dp = rhs[s, 0] / diag[s, 0]
        c[s, 0] = cp
        d[s, 0] = dp
        for i in range(1, n):
            denom = diag[s, i] - lower[s, i] * cp
            cp = upper[s, i] / denom
            dp = (rhs[s, i] - lower[s, i] * dp) / denom
            c[s, i] = cp
            d[s, i] = dp
        xi = dp
        x[s, n - 1] = xi
        for i in range(n - 2, -1, -1):
            xi = d[s, i] - c[s, i] * xi
            x[s, i] = xi


def thomas_batched_shaped(rng, nsys, n):
    """nsys diagonally dominant systems of n unknowns each."""
    shape = (at_least(nsys, 1), at_least(n, 1))
    lower = rng.uniform(-1.0, 1.0, shape)
    upper = rng.uniform(-1.0, 1.0, shape)
    diag = 3.0 + rng.random(shape)
    return lower, diag, upper, rng.standard_normal(shape), np.zeros(shape)


def thomas_batched_sized(rng, n):
    """n systems of 6 unknowns."""
    return thomas_batched_shaped(rng, n, 6)


def thomas_batched_args(rng):
    return thomas_batched_shaped(rng, 5, 6)


EXAMPLES = [
    Example("linear_recurrence", linear_recurrence, linear_recurrence_args,
            tags=("recurrence", "inplace"),
            sized=linear_recurrence_sized),
    Example("iir_biquad", iir_biquad, iir_biquad_args, tags=("recurrence",),
            sized=iir_biquad_sized),
    Example("cumulative_sum", cumulative_sum, cumulative_sum_args,
            tags=("recurrence",),
            sized=cumulative_sum_sized),
    Example("moving_average", moving_average, moving_average_args,
            tags=("int_args",),
            sized=moving_average_sized),
    Example("exp_moving_average", exp_moving_average, exp_moving_average_args,
            tags=("recurrence",),
            sized=exp_moving_average_sized),
    Example("horner", horner, horner_args, tags=("recurrence",),
            sized=horner_sized),
    Example("horner_f32", horner, horner_f32_args, tags=("recurrence", "float32"),
            sized=horner_f32_sized),
    Example("rk4_pendulum", rk4_pendulum, rk4_pendulum_args,
            tags=("ode", "helper", "tuple", "int_args", "inplace"),
            sized=rk4_pendulum_sized),
    Example("rk4_chain", rk4_chain, rk4_chain_args,
            tags=("ode", "helper", "scratch", "int_args", "inplace"),
            sized=rk4_chain_sized),
    Example("newton_sqrt", newton_sqrt, newton_sqrt_args,
            tags=("newton", "int_args"),
            sized=newton_sqrt_sized),
    Example("kepler_solve", kepler_solve, kepler_solve_args, tags=("newton",),
            sized=kepler_solve_sized),
    Example("fixed_point_cos", fixed_point_cos, fixed_point_cos_args,
            tags=("while", "int_args"),
            sized=fixed_point_cos_sized),
    Example("euler_until", euler_until, euler_until_args, tags=("while", "ode"),
            sized=euler_until_sized),
    Example("newton_cbrt_converge", newton_cbrt_converge, newton_cbrt_converge_args,
            wrt=("a",), tags=("newton", "while", "break", "int_args", "wrt"),
            sized=newton_cbrt_converge_sized),
    Example("thomas_solve", thomas_solve, thomas_solve_args,
            tags=("recurrence", "scratch"),
            sized=thomas_solve_sized),
    Example("thomas_batched", thomas_batched, thomas_batched_args,
            tags=("recurrence", "scratch", "2d"),
            sized=thomas_batched_sized),
    Example("thomas_batched_private", thomas_batched_private, thomas_batched_args,
            tags=("recurrence", "scratch", "2d"),
            sized=thomas_batched_sized),
]
