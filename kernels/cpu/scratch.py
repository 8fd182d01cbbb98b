"""Scratch arrays allocated inside loops: RK4 stage arrays per element, face fluxes
per time step."""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from ._example import Example
from ..sizes import at_least


@njit
def rk4_stage_scratch(theta0, omega0, freq, damp, dt, steps, out):
    """Damped pendulums integrated with RK4, one per element; the four stage slopes
    of each element live in arrays allocated inside the element loop."""
    n = theta0.shape[0]
    for i in range(n):
        kth = np.empty(4)
        kom = np.empty(4)
        th = theta0[i]
        om = omega0[i]
        w2 = freq[i] * freq[i]
        for t in range(steps):
            ths = th
            oms = om
            for s in range(4):
                kth[s] = oms
                kom[s] = -w2 * math.sin(ths) - damp * oms
                if s < 3:
                    h = dt if s == 2 else 0.5 * dt
                    ths = th + h * kth[s]
                    oms = om + h * kom[s]
            th += dt / 6.0 * (kth[0] + 2.0 * kth[1] + 2.0 * kth[2] + kth[3])
            om += dt / 6.0 * (kom[0] + 2.0 * kom[1] + 2.0 * kom[2] + kom[3])
        out[i, 0] = th
        out[i, 1] = om


def rk4_stage_scratch_sized(rng, n):
    n = at_least(n, 1)
    return (rng.uniform(-1.0, 1.0, n), rng.uniform(-0.5, 0.5, n),
            rng.uniform(0.5, 2.0, n), 0.1, 0.05, 6, np.zeros((n, 2)))


def rk4_stage_scratch_args(rng):
    return rk4_stage_scratch_sized(rng, 7)


@njit
def flux_smoothing(u, kappa, steps, out):
    """Nonlinear diffusion with limited fluxes: each step allocates the n + 1 face
    fluxes with np.zeros (the two boundary faces stay zero: no flux through the
    ends) and updates out from them."""
    n = u.shape[0]
    for i in range(n):
        out[i] = u[i]
    for t in range(steps):
        flux = np.zeros(n + 1)
        for i in range(1, n):
            d = out[i] - out[i - 1]
            flux[i] = kappa * d / (1.0 + d * d)
        for i in range(n):
            out[i] += flux[i + 1] - flux[i]


def flux_smoothing_sized(rng, n):
    n = at_least(n, 3)
    return rng.standard_normal(n), 0.2, 4, np.zeros(n)


def flux_smoothing_args(rng):
    return flux_smoothing_sized(rng, 13)


EXAMPLES = [
    Example("rk4_stage_scratch", rk4_stage_scratch, rk4_stage_scratch_args,
            tags=("scratch_in_loop", "rk", "math", "2d"), sized=rk4_stage_scratch_sized),
    Example("flux_smoothing", flux_smoothing, flux_smoothing_args,
            tags=("scratch_in_loop", "stencil", "time_loop"), sized=flux_smoothing_sized),
]
