"""Per-thread integration and iteration: Euler, RK2, RK4 with local stages, Horner,
Chebyshev recurrences, Newton's method, an implicit step per row (Thomas, in place)."""
import math

import numpy as np
from numba import cuda, float64

import kadj

from ..sizes import at_least
from . import Case, launch_1d, no_trips

DEG = 5          # degree of the per-thread Taylor polynomial (local array)
NCOEF = DEG + 1


@kadj.differentiate
@cuda.jit
def logistic_euler(y0, r, y_out, capacity, dt, nsteps):
    """Explicit Euler for y' = r y (1 - y / K), one trajectory per thread."""
    i = cuda.grid(1)
    if i < y0.shape[0]:
        y = y0[i]
        ri = r[i]
        for step in range(nsteps):
            y = y + dt * ri * y * (1.0 - y / capacity)
        y_out[i] = y


@kadj.differentiate
@cuda.jit
def damped_oscillator_rk2(x0, v0, omega, x_out, v_out, zeta, dt, nsteps):
    """Midpoint RK2 for x'' + 2 zeta omega x' + omega^2 x = 0."""
    i = cuda.grid(1)
    if i < x0.shape[0]:
        x = x0[i]
        v = v0[i]
        w = omega[i]
        for step in range(nsteps):
            ax = -2.0 * zeta * w * v - w * w * x
            xm = x + 0.5 * dt * v
            vm = v + 0.5 * dt * ax
            axm = -2.0 * zeta * w * vm - w * w * xm
            x = x + dt * vm
            v = v + dt * axm
        x_out[i] = x
        v_out[i] = v


@cuda.jit(device=True)
def _rhs(t, y, a):
    return -a * y + math.sin(t)


@kadj.differentiate
@cuda.jit
def rk4_local_stages(y0, a, y_out, dt, nsteps):
    """Classical RK4 for y' = -a y + sin t; stages in a local array."""
    i = cuda.grid(1)
    if i < y0.shape[0]:
        k = cuda.local.array(4, float64)
        y = y0[i]
        ai = a[i]
        t = 0.0
        for step in range(nsteps):
            k[0] = _rhs(t, y, ai)
            k[1] = _rhs(t + 0.5 * dt, y + 0.5 * dt * k[0], ai)
            k[2] = _rhs(t + 0.5 * dt, y + 0.5 * dt * k[1], ai)
            k[3] = _rhs(t + dt, y + dt * k[2], ai)
            y += dt / 6.0 * (k[0] + 2.0 * k[1] + 2.0 * k[2] + k[3])
            t += dt
        y_out[i] = y


@kadj.differentiate
@cuda.jit
def horner_shared_coeffs(coef, x, y):
    """y[i] = sum_k coef[k] x[i]^k by Horner's rule; coef shared by all threads."""
    i = cuda.grid(1)
    if i < x.shape[0]:
        deg = coef.shape[0] - 1
        xi = x[i]
        acc = coef[deg]
        for k in range(deg - 1, -1, -1):
            acc = acc * xi + coef[k]
        y[i] = acc


@kadj.differentiate
@cuda.jit
def taylor_exp_local(a, t, y):
    """y[i] = sum_k (a_i t_i)^k / k!, coefficients built in a local array."""
    i = cuda.grid(1)
    if i < a.shape[0]:
        c = cuda.local.array(NCOEF, float64)
        c[0] = 1.0
        for k in range(1, DEG + 1):
            c[k] = c[k - 1] * a[i] / k
        ti = t[i]
        acc = c[DEG]
        for k in range(DEG - 1, -1, -1):
            acc = acc * ti + c[k]
        y[i] = acc


@kadj.differentiate
@cuda.jit
def chebyshev_series(c, x, y):
    """y[i] = sum_k c[k] T_k(x[i]) by the three-term recurrence."""
    i = cuda.grid(1)
    if i < x.shape[0]:
        xi = x[i]
        t0 = 1.0
        t1 = xi
        s = c[0] + c[1] * xi
        for k in range(2, c.shape[0]):
            t2 = 2.0 * xi * t1 - t0
            s += c[k] * t2
            t0 = t1
            t1 = t2
        y[i] = s


@kadj.differentiate
@cuda.jit
def newton_cubic(p, q, root, niter):
    """Root of x^3 + p x - q = 0 (p > 0) by a fixed number of Newton steps."""
    i = cuda.grid(1)
    if i < p.shape[0]:
        x = q[i] / (1.0 + p[i])
        for it in range(niter):
            f = x * x * x + p[i] * x - q[i]
            df = 3.0 * x * x + p[i]
            x = x - f / df
        root[i] = x


@kadj.differentiate
@cuda.jit
def implicit_rows_thomas(u, cp, r):
    """One backward-Euler diffusion step per row, (I - r L) u_new = u with zero ends,
    solved in place by the Thomas algorithm: each thread overwrites its row of ``u``
    (forward sweep, then back substitution) and of the sweep's coefficients ``cp``."""
    i = cuda.grid(1)
    if i < u.shape[0]:
        n = u.shape[1]
        ri = r[i]
        b = 1.0 + 2.0 * ri
        cp[i, 0] = -ri / b
        u[i, 0] = u[i, 0] / b
        for k in range(1, n):
            den = b + ri * cp[i, k - 1]
            cp[i, k] = -ri / den
            u[i, k] = (u[i, k] + ri * u[i, k - 1]) / den
        for k in range(n - 2, -1, -1):
            u[i, k] = u[i, k] - cp[i, k] * u[i, k + 1]


def _steps(trips, default):
    return default if trips is None else at_least(trips, 0)


def _logistic_sized(rng, n, trips=None):
    n = at_least(n, 1)
    return launch_1d(n), [rng.uniform(0.1, 0.5, n), rng.uniform(0.5, 2.0, n),
                          np.zeros(n), 1.5, 0.1, _steps(trips, 12)]


def _logistic_args(rng):
    return _logistic_sized(rng, 14)[1]


def _oscillator_sized(rng, n, trips=None):
    n = at_least(n, 1)
    return launch_1d(n), [rng.standard_normal(n), rng.standard_normal(n),
                          rng.uniform(0.5, 2.0, n), np.zeros(n), np.zeros(n), 0.1, 0.05,
                          _steps(trips, 10)]


def _oscillator_args(rng):
    return _oscillator_sized(rng, 10)[1]


def _rk4_sized(rng, n, trips=None):
    n = at_least(n, 1)
    return launch_1d(n), [rng.standard_normal(n), rng.uniform(0.2, 1.5, n), np.zeros(n),
                          0.1, _steps(trips, 6)]


def _rk4_args(rng):
    return _rk4_sized(rng, 12)[1]


def _horner_sized(rng, n, trips=None):
    """trips: the polynomial's degree."""
    n = at_least(n, 1)
    return launch_1d(n), [rng.standard_normal(_steps(trips, 5) + 1),
                          rng.uniform(-1.0, 1.0, n), np.zeros(n)]


def _horner_args(rng):
    return _horner_sized(rng, 16)[1]


def _taylor_sized(rng, n, trips=None):
    no_trips(trips, "taylor_exp_local")
    n = at_least(n, 1)
    return launch_1d(n), [rng.uniform(-1.0, 1.0, n), rng.uniform(0.0, 1.0, n),
                          np.zeros(n)]


def _taylor_args(rng):
    return _taylor_sized(rng, 12)[1]


def _chebyshev_sized(rng, n, trips=None):
    """trips: terms beyond the first two."""
    n = at_least(n, 1)
    return launch_1d(n), [rng.standard_normal(_steps(trips, 5) + 2),
                          rng.uniform(-0.95, 0.95, n), np.zeros(n)]


def _chebyshev_args(rng):
    return _chebyshev_sized(rng, 16)[1]


def _newton_sized(rng, n, trips=None):
    n = at_least(n, 1)
    return launch_1d(n), [rng.uniform(0.5, 2.0, n), rng.standard_normal(n), np.zeros(n),
                          _steps(trips, 8)]


def _newton_args(rng):
    return _newton_sized(rng, 12)[1]


def _thomas_sized(rng, n, trips=None):
    """n rows; trips: the forward sweep's trip count (rows of trips + 1 elements)."""
    n = at_least(n, 1)
    m = _steps(trips, 6) + 1
    return launch_1d(n), [rng.standard_normal((n, m)), np.zeros((n, m)),
                          rng.uniform(0.1, 1.0, n)]


def _thomas_args(rng):
    return _thomas_sized(rng, 10)[1]


CASES = [
    Case("logistic_euler", logistic_euler, (2, 8), _logistic_args,
         note="explicit Euler, loop-carried y, one trajectory per thread",
         sized=_logistic_sized, trip_loop='for step in range(nsteps)'),
    Case("damped_oscillator_rk2", damped_oscillator_rk2, (2, 8), _oscillator_args,
         note="RK2 (midpoint), two loop-carried states, two outputs",
         sized=_oscillator_sized, trip_loop='for step in range(nsteps)'),
    Case("rk4_local_stages", rk4_local_stages, (2, 8), _rk4_args,
         note="RK4, stages in cuda.local.array, device helper for the RHS",
         sized=_rk4_sized, trip_loop='for step in range(nsteps)'),
    Case("horner_shared_coeffs", horner_shared_coeffs, (2, 8), _horner_args,
         note="Horner recurrence, coefficients read by every thread",
         sized=_horner_sized, trip_loop='for k in range(deg - 1, -1, -1)'),
    Case("taylor_exp_local", taylor_exp_local, (2, 8), _taylor_args,
         note="coefficients built in cuda.local.array, then Horner",
         sized=_taylor_sized),
    Case("chebyshev_series", chebyshev_series, (2, 8), _chebyshev_args,
         note="three-term recurrence with rotated loop-carried values",
         sized=_chebyshev_sized, trip_loop='for k in range(2, c.shape[0])'),
    Case("newton_cubic", newton_cubic, (2, 8), _newton_args,
         note="fixed-count Newton iteration",
         sized=_newton_sized, trip_loop='for it in range(niter)'),
    Case("implicit_rows_thomas", implicit_rows_thomas, (2, 8), _thomas_args,
         note="each thread solves its row in place (own rows of u and cp)",
         sized=_thomas_sized, trip_loop='for k in range(1, n)'),
]
