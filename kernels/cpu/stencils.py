"""Finite-difference stencils: heat, Laplacians, advection, Burgers, waves.

Dirichlet boundaries leave the boundary of the output untouched; periodic ones
wrap with modulo indexing ``(i + 1) % n``.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from ._example import Example
from ..sizes import at_least, grid2, grid3


@njit
def heat_step(u, u_new, alpha):
    """One explicit step of u_t = u_xx, Dirichlet ends (u_new's ends untouched)."""
    for i in range(1, u.shape[0] - 1):
        u_new[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1])


def heat_step_sized(rng, n):
    n = at_least(n, 3)
    return rng.random(n), rng.random(n), 0.2


def heat_step_args(rng):
    return heat_step_sized(rng, 24)


def heat_step_f32_sized(rng, n):
    u, u_new, _ = heat_step_sized(rng, n)
    return u.astype(np.float32), u_new.astype(np.float32), np.float32(0.2)


def heat_step_f32_args(rng):
    return heat_step_f32_sized(rng, 24)


@njit
def heat_step_periodic(u, u_new, alpha):
    """One explicit heat step on a ring: neighbours by modulo indexing."""
    n = u.shape[0]
    for i in range(n):
        left = u[(i - 1 + n) % n]
        right = u[(i + 1) % n]
        u_new[i] = u[i] + alpha * (left - 2.0 * u[i] + right)


def heat_step_periodic_sized(rng, n):
    n = at_least(n, 1)
    return rng.random(n), np.zeros(n), 0.25


def heat_step_periodic_args(rng):
    return heat_step_periodic_sized(rng, 20)


@njit
def heat_steps_scratch(u, alpha, nsteps):
    """nsteps heat steps in place (Dirichlet ends), through a np.zeros scratch row."""
    n = u.shape[0]
    b = np.zeros(n)
    for step in range(nsteps):
        for i in range(1, n - 1):
            b[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1])
        for i in range(1, n - 1):
            u[i] = b[i]


def heat_steps_scratch_sized(rng, n):
    return rng.random(at_least(n, 3)), 0.15, 5


def heat_steps_scratch_args(rng):
    return heat_steps_scratch_sized(rng, 16)


@njit
def gauss_seidel_1d(u, f, h2, nsweeps):
    """Gauss-Seidel sweeps for -u'' = f, in place (Dirichlet ends kept)."""
    n = u.shape[0]
    for sweep in range(nsweeps):
        for i in range(1, n - 1):
            u[i] = 0.5 * (u[i - 1] + u[i + 1] + h2 * f[i])


def gauss_seidel_1d_sized(rng, n):
    n = at_least(n, 3)
    return rng.random(n), rng.random(n), 0.01, 4


def gauss_seidel_1d_args(rng):
    return gauss_seidel_1d_sized(rng, 12)


@njit
def laplacian_5pt(u, out, inv_h2):
    """2-D 5-point Laplacian on the interior."""
    nx, ny = u.shape
    for i in range(1, nx - 1):
        for j in range(1, ny - 1):
            out[i, j] = (u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1]
                         - 4.0 * u[i, j]) * inv_h2


def laplacian_5pt_sized(rng, n):
    shape = grid2(n)
    return rng.random(shape), rng.random(shape), 4.0


def laplacian_5pt_args(rng):
    return rng.random((7, 8)), rng.random((7, 8)), 4.0


@njit
def laplacian_9pt(u, out, inv_h2):
    """2-D 9-point (Mehrstellen) Laplacian on the interior."""
    nx, ny = u.shape
    for i in range(1, nx - 1):
        for j in range(1, ny - 1):
            edges = u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1]
            corners = (u[i - 1, j - 1] + u[i - 1, j + 1]
                       + u[i + 1, j - 1] + u[i + 1, j + 1])
            out[i, j] = (4.0 * edges + corners - 20.0 * u[i, j]) * inv_h2 / 6.0


def laplacian_9pt_sized(rng, n):
    shape = grid2(n)
    return rng.random(shape), np.zeros(shape), 9.0


def laplacian_9pt_args(rng):
    return rng.random((6, 7)), np.zeros((6, 7)), 9.0


@njit
def diffusion_2d_periodic(u, u_new, kappa):
    """One explicit 2-D diffusion step on a torus (modulo indexing both ways)."""
    nx, ny = u.shape
    for i in range(nx):
        ip = (i + 1) % nx
        im = (i - 1 + nx) % nx
        for j in range(ny):
            jp = (j + 1) % ny
            jm = (j - 1 + ny) % ny
            lap = u[ip, j] + u[im, j] + u[i, jp] + u[i, jm] - 4.0 * u[i, j]
            u_new[i, j] = u[i, j] + kappa * lap


def diffusion_2d_periodic_sized(rng, n):
    shape = grid2(n, smallest=1)
    return rng.random(shape), np.zeros(shape), 0.1


def diffusion_2d_periodic_args(rng):
    return rng.random((6, 5)), np.zeros((6, 5)), 0.1


@njit
def stencil_3d_7pt(u, out, c0, c1):
    """3-D 7-point stencil on the interior: out = c0*u + c1*(sum of 6 neighbours)."""
    nx, ny, nz = u.shape
    for i in range(1, nx - 1):
        for j in range(1, ny - 1):
            for k in range(1, nz - 1):
                nb = (u[i - 1, j, k] + u[i + 1, j, k] + u[i, j - 1, k]
                      + u[i, j + 1, k] + u[i, j, k - 1] + u[i, j, k + 1])
                out[i, j, k] = c0 * u[i, j, k] + c1 * nb


def stencil_3d_7pt_sized(rng, n):
    shape = grid3(n)
    return rng.random(shape), rng.random(shape), -0.6, 0.1


def stencil_3d_7pt_args(rng):
    return rng.random((4, 4, 5)), rng.random((4, 4, 5)), -0.6, 0.1


@njit
def advection_upwind(u, c, u_new, dt_dx):
    """First-order upwind advection with a spatially varying velocity c."""
    for i in range(1, u.shape[0] - 1):
        if c[i] > 0.0:
            u_new[i] = u[i] - dt_dx * c[i] * (u[i] - u[i - 1])
        else:
            u_new[i] = u[i] - dt_dx * c[i] * (u[i + 1] - u[i])


def _signed_away_from_zero(rng, n, low=0.2, high=1.0):
    sign = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    return sign * rng.uniform(low, high, n)


def advection_upwind_sized(rng, n):
    n = at_least(n, 3)
    return rng.random(n), _signed_away_from_zero(rng, n), rng.random(n), 0.4


def advection_upwind_args(rng):
    return advection_upwind_sized(rng, 22)


@njit
def burgers_step(u, u_new, dt_dx, nu):
    """Inviscid-flux upwind Burgers step with viscosity, periodic boundary."""
    n = u.shape[0]
    for i in range(n):
        im = (i - 1 + n) % n
        ip = (i + 1) % n
        if u[i] >= 0.0:
            flux_diff = 0.5 * (u[i] * u[i] - u[im] * u[im])
        else:
            flux_diff = 0.5 * (u[ip] * u[ip] - u[i] * u[i])
        u_new[i] = u[i] - dt_dx * flux_diff + nu * (u[ip] - 2.0 * u[i] + u[im])


def burgers_step_sized(rng, n):
    n = at_least(n, 1)
    return _signed_away_from_zero(rng, n), np.zeros(n), 0.3, 0.05


def burgers_step_args(rng):
    return burgers_step_sized(rng, 18)


@njit
def wave_step(u_prev, u, u_next, c2):
    """One leapfrog step of the wave equation, Dirichlet ends."""
    for i in range(1, u.shape[0] - 1):
        u_next[i] = 2.0 * u[i] - u_prev[i] + c2 * (u[i + 1] - 2.0 * u[i] + u[i - 1])


def wave_step_sized(rng, n):
    n = at_least(n, 3)
    return rng.random(n), rng.random(n), rng.random(n), 0.3


def wave_step_args(rng):
    return wave_step_sized(rng, 16)


@njit
def wave_leapfrog(u_prev, u, u_next, c2, nsteps):
    """nsteps leapfrog steps, rotating the three time levels in place."""
    n = u.shape[0]
    for step in range(nsteps):
        for i in range(1, n - 1):
            u_next[i] = (2.0 * u[i] - u_prev[i]
                         + c2 * (u[i + 1] - 2.0 * u[i] + u[i - 1]))
        for i in range(n):
            u_prev[i] = u[i]
            u[i] = u_next[i]


def wave_leapfrog_sized(rng, n):
    n = at_least(n, 3)
    u = np.sin(np.linspace(0.0, np.pi, n)) + 0.1 * rng.random(n)
    return u.copy(), u + 0.01 * rng.random(n), np.zeros(n), 0.25, 4


def wave_leapfrog_args(rng):
    return wave_leapfrog_sized(rng, 12)


@njit(parallel=True)
def diffusion_1d_parallel(u, kappa, u_new, dt):
    """One explicit 1-D diffusion step with a variable coefficient, over prange."""
    for i in prange(1, u.shape[0] - 1):
        flux = kappa[i] * (u[i + 1] - u[i]) - kappa[i - 1] * (u[i] - u[i - 1])
        u_new[i] = u[i] + dt * flux


def diffusion_1d_parallel_sized(rng, n):
    n = at_least(n, 3)
    return rng.random(n), 0.5 + rng.random(n), np.zeros(n), 0.2


def diffusion_1d_parallel_args(rng):
    return diffusion_1d_parallel_sized(rng, 24)


@njit(parallel=True)
def diffusion_2d_parallel(u, kappa, u_new, dt):
    """One explicit 2-D diffusion step with a variable coefficient, rows over prange."""
    nx, ny = u.shape
    for i in prange(1, nx - 1):
        for j in range(1, ny - 1):
            lap = u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1] - 4.0 * u[i, j]
            u_new[i, j] = u[i, j] + dt * kappa[i, j] * lap


def diffusion_2d_parallel_sized(rng, n):
    shape = grid2(n)
    return rng.random(shape), 0.5 + rng.random(shape), np.zeros(shape), 0.1


def diffusion_2d_parallel_args(rng):
    return rng.random((7, 9)), 0.5 + rng.random((7, 9)), np.zeros((7, 9)), 0.1


EXAMPLES = [
    Example("heat_step", heat_step, heat_step_args, tags=("stencil",),
            sized=heat_step_sized),
    Example("heat_step_wrt_u", heat_step, heat_step_args, wrt=("u",),
            tags=("stencil", "wrt"),
            sized=heat_step_sized),
    Example("heat_step_periodic", heat_step_periodic, heat_step_periodic_args,
            tags=("stencil", "periodic"),
            sized=heat_step_periodic_sized),
    Example("heat_steps_scratch", heat_steps_scratch, heat_steps_scratch_args,
            tags=("stencil", "scratch", "int_args", "inplace"),
            sized=heat_steps_scratch_sized),
    Example("gauss_seidel_1d", gauss_seidel_1d, gauss_seidel_1d_args,
            tags=("stencil", "inplace", "int_args"),
            sized=gauss_seidel_1d_sized),
    Example("laplacian_5pt", laplacian_5pt, laplacian_5pt_args,
            tags=("stencil", "2d"),
            sized=laplacian_5pt_sized),
    Example("laplacian_9pt", laplacian_9pt, laplacian_9pt_args,
            tags=("stencil", "2d"),
            sized=laplacian_9pt_sized),
    Example("diffusion_2d_periodic", diffusion_2d_periodic,
            diffusion_2d_periodic_args, tags=("stencil", "2d", "periodic"),
            sized=diffusion_2d_periodic_sized),
    Example("stencil_3d_7pt", stencil_3d_7pt, stencil_3d_7pt_args,
            tags=("stencil", "3d"),
            sized=stencil_3d_7pt_sized),
    Example("advection_upwind", advection_upwind, advection_upwind_args,
            tags=("stencil", "branch"),
            sized=advection_upwind_sized),
    Example("burgers_step", burgers_step, burgers_step_args,
            tags=("stencil", "branch", "periodic"),
            sized=burgers_step_sized),
    Example("wave_step", wave_step, wave_step_args, tags=("stencil",),
            sized=wave_step_sized),
    Example("wave_leapfrog", wave_leapfrog, wave_leapfrog_args,
            tags=("stencil", "inplace", "int_args"),
            sized=wave_leapfrog_sized),
    Example("heat_step_f32", heat_step, heat_step_f32_args,
            tags=("stencil", "float32"),
            sized=heat_step_f32_sized),
    Example("diffusion_1d_parallel", diffusion_1d_parallel, diffusion_1d_parallel_args,
            tags=("stencil", "parallel"),
            sized=diffusion_1d_parallel_sized),
    Example("diffusion_2d_parallel", diffusion_2d_parallel, diffusion_2d_parallel_args,
            tags=("stencil", "2d", "parallel"),
            sized=diffusion_2d_parallel_sized),
]
