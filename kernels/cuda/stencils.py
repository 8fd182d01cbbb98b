"""Stencils: heat, wave, advection, Jacobi, red-black SOR, 3-D Laplacian, a
shared-memory tile."""
import math  # noqa: F401  (kernels may use it)

import numpy as np
from numba import cuda, float64

import kadj

from ..sizes import at_least, grid2, grid3
from . import Case, launch_1d, launch_2d, no_trips

TPB = 8          # threads per block of the tiled stencil
TILE = TPB + 2   # the tile with its halo (a compile-time constant)


@kadj.differentiate
@cuda.jit
def heat1d_guarded(u, u_new, alpha):
    """Explicit heat step; the boundary is left to the caller."""
    i = cuda.grid(1)
    if 0 < i < u.shape[0] - 1:
        u_new[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1])


@kadj.differentiate
@cuda.jit
def heat1d_periodic_f32(u, u_new, alpha):
    """Heat step on a ring, in float32."""
    i = cuda.grid(1)
    n = u.shape[0]
    if i < n:
        left = u[(i - 1 + n) % n]
        right = u[(i + 1) % n]
        u_new[i] = u[i] + alpha * (left - np.float32(2.0) * u[i] + right)


@kadj.differentiate
@cuda.jit
def heat2d_step(u, u_new, alpha):
    """2-D heat step; row/column from threadIdx/blockIdx .y/.x."""
    col = cuda.threadIdx.x + cuda.blockIdx.x * cuda.blockDim.x
    row = cuda.threadIdx.y + cuda.blockIdx.y * cuda.blockDim.y
    ny, nx = u.shape
    if row >= 1 and row < ny - 1 and col >= 1 and col < nx - 1:
        lap = (u[row - 1, col] + u[row + 1, col] + u[row, col - 1] + u[row, col + 1]
               - 4.0 * u[row, col])
        u_new[row, col] = u[row, col] + alpha * lap


@kadj.differentiate
@cuda.jit
def diffusion2d_periodic(c, c_new, d):
    """2-D diffusion on a torus with a spatially varying diffusivity d[i, j]."""
    i, j = cuda.grid(2)
    n, m = c.shape
    if i < n and j < m:
        ip = (i + 1) % n
        im = (i - 1 + n) % n
        jp = (j + 1) % m
        jm = (j - 1 + m) % m
        c_new[i, j] = c[i, j] + d[i, j] * (c[ip, j] + c[im, j] + c[i, jp] + c[i, jm]
                                           - 4.0 * c[i, j])


@kadj.differentiate
@cuda.jit
def wave_leapfrog(u_prev, u, u_next, c2):
    """Leapfrog step of the 1-D wave equation, fixed ends."""
    i = cuda.grid(1)
    n = u.shape[0]
    if i < n:
        if i == 0 or i == n - 1:
            u_next[i] = 0.0
        else:
            u_next[i] = (2.0 * u[i] - u_prev[i]
                         + c2 * (u[i - 1] - 2.0 * u[i] + u[i + 1]))


@kadj.differentiate
@cuda.jit
def advection_upwind(q, vel, q_new, dt_dx):
    """First-order upwind advection on a ring with a velocity field."""
    i = cuda.grid(1)
    n = q.shape[0]
    if i < n:
        v = vel[i]
        if v > 0.0:
            flux = v * (q[i] - q[(i - 1 + n) % n])
        else:
            flux = v * (q[(i + 1) % n] - q[i])
        q_new[i] = q[i] - dt_dx * flux


@kadj.differentiate
@cuda.jit
def jacobi2d(u, f, u_new, h2):
    """One Jacobi sweep for -lap(u) = f."""
    i, j = cuda.grid(2)
    if 1 <= i < u.shape[0] - 1 and 1 <= j < u.shape[1] - 1:
        u_new[i, j] = 0.25 * (u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1]
                              + h2 * f[i, j])


@kadj.differentiate
@cuda.jit
def redblack_sor2d(u, f, w, color):
    """One colour's half sweep of red-black SOR for -lap(u) = f, in place: the
    points with (i + j) % 2 == color are updated from their neighbours, which have
    the other colour."""
    i, j = cuda.grid(2)
    n, m = u.shape
    if 0 < i < n - 1 and 0 < j < m - 1:
        if (i + j) % 2 == color:
            gs = 0.25 * (u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1] + f[i, j])
            u[i, j] = u[i, j] + w * (gs - u[i, j])


@kadj.differentiate
@cuda.jit
def laplacian3d(u, out, inv_h2):
    """7-point Laplacian in 3-D, interior points."""
    i, j, k = cuda.grid(3)
    nx, ny, nz = u.shape
    if 0 < i < nx - 1 and 0 < j < ny - 1 and 0 < k < nz - 1:
        out[i, j, k] = inv_h2 * (u[i - 1, j, k] + u[i + 1, j, k]
                                 + u[i, j - 1, k] + u[i, j + 1, k]
                                 + u[i, j, k - 1] + u[i, j, k + 1]
                                 - 6.0 * u[i, j, k])


@kadj.differentiate
@cuda.jit
def smooth_tiled(u, out, w):
    """3-point smoothing from a shared-memory tile with a one-cell halo."""
    tile = cuda.shared.array(TILE, float64)
    i = cuda.grid(1)
    t = cuda.threadIdx.x + 1
    n = u.shape[0]
    if i < n:
        tile[t] = u[i]
        if cuda.threadIdx.x == 0 and i > 0:
            tile[0] = u[i - 1]
        if cuda.threadIdx.x == TPB - 1 and i < n - 1:
            tile[t + 1] = u[i + 1]
    cuda.syncthreads()
    if 0 < i < n - 1:
        out[i] = w * tile[t - 1] + (1.0 - 2.0 * w) * tile[t] + w * tile[t + 1]


TB2 = 8                  # threads per block side of the 2-D tiled stencil
TILE2 = (TB2 + 2, TB2 + 2)


@kadj.differentiate
@cuda.jit
def halo_tile2d(u, out, k):
    """9-point stencil from a 2-D shared tile: the edge halos are loaded by the threads
    on the block's edges (``if tx == 0:``), the corners by the corner threads, zero
    outside the domain (nested ``if``)."""
    s = cuda.shared.array(TILE2, float64)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    i, j = cuda.grid(2)
    nx, ny = u.shape
    if i < nx and j < ny:
        last_x = tx == TB2 - 1 or i == nx - 1
        last_y = ty == TB2 - 1 or j == ny - 1
        s[tx + 1, ty + 1] = u[i, j]
        if tx == 0:
            s[0, ty + 1] = u[i - 1, j] if i > 0 else 0.0
        if last_x:
            s[tx + 2, ty + 1] = u[i + 1, j] if i < nx - 1 else 0.0
        if ty == 0:
            s[tx + 1, 0] = u[i, j - 1] if j > 0 else 0.0
        if last_y:
            s[tx + 1, ty + 2] = u[i, j + 1] if j < ny - 1 else 0.0
        if tx == 0 and ty == 0:
            if i > 0 and j > 0:
                s[0, 0] = u[i - 1, j - 1]
            else:
                s[0, 0] = 0.0
        if last_x and last_y:
            if i < nx - 1 and j < ny - 1:
                s[tx + 2, ty + 2] = u[i + 1, j + 1]
            else:
                s[tx + 2, ty + 2] = 0.0
        if tx == 0 and last_y:
            if i > 0 and j < ny - 1:
                s[0, ty + 2] = u[i - 1, j + 1]
            else:
                s[0, ty + 2] = 0.0
        if last_x and ty == 0:
            if i < nx - 1 and j > 0:
                s[tx + 2, 0] = u[i + 1, j - 1]
            else:
                s[tx + 2, 0] = 0.0
    cuda.syncthreads()
    if i < nx and j < ny:
        edge = s[tx, ty + 1] + s[tx + 2, ty + 1] + s[tx + 1, ty] + s[tx + 1, ty + 2]
        corner = s[tx, ty] + s[tx + 2, ty + 2] + s[tx, ty + 2] + s[tx + 2, ty]
        c = s[tx + 1, ty + 1]
        out[i, j] = c + k * (4.0 * edge + corner - 20.0 * c) / 6.0


@kadj.differentiate
@cuda.jit
def pingpong_diffusion(u, out, alpha, steps):
    """``steps`` non-linear diffusion steps inside each block, in shared memory: the
    halo is loaded from global memory by the block's first and last threads and held
    fixed; each step writes ``b`` from ``a``'s neighbours, a barrier, copies ``b`` back
    into ``a``, a barrier; the result goes to global memory at the end."""
    a = cuda.shared.array(TILE, float64)
    b = cuda.shared.array(TILE, float64)
    tx = cuda.threadIdx.x
    i = cuda.grid(1)
    n = u.shape[0]
    if i < n:
        a[tx + 1] = u[i]
    else:
        a[tx + 1] = 0.0
    if tx == 0:
        if 0 < i <= n:
            a[0] = u[i - 1]
        else:
            a[0] = 0.0
    if tx == TPB - 1:
        if i + 1 < n:
            a[TPB + 1] = u[i + 1]
        else:
            a[TPB + 1] = 0.0
    cuda.syncthreads()
    for t in range(steps):
        v = a[tx + 1]
        b[tx + 1] = v + alpha * (a[tx] - 2.0 * v + a[tx + 2]) / (1.0 + v * v)
        cuda.syncthreads()
        a[tx + 1] = b[tx + 1]
        cuda.syncthreads()
    if i < n:
        out[i] = a[tx + 1]


def _heat1d_sized(rng, n, trips=None):
    no_trips(trips, "heat1d_guarded")
    n = at_least(n, 3)
    return launch_1d(n), [rng.random(n), np.zeros(n), 0.2]


def _heat1d_args(rng):
    return _heat1d_sized(rng, 13)[1]


def _heat1d_f32_sized(rng, n, trips=None):
    no_trips(trips, "heat1d_periodic_f32")
    n = at_least(n, 1)
    return launch_1d(n), [rng.random(n).astype(np.float32), np.zeros(n, np.float32),
                          np.float32(0.15)]


def _heat1d_f32_args(rng):
    return _heat1d_f32_sized(rng, 16)[1]


def _heat2d_sized(rng, n, trips=None):
    no_trips(trips, "heat2d_step")
    ny, nx = grid2(n)
    return launch_2d(nx, ny), [rng.random((ny, nx)), np.zeros((ny, nx)), 0.1]


def _heat2d_args(rng):
    return [rng.random((8, 7)), np.zeros((8, 7)), 0.1]


def _diffusion2d_sized(rng, n, trips=None):
    no_trips(trips, "diffusion2d_periodic")
    shape = grid2(n, smallest=1)
    return launch_2d(*shape), [rng.random(shape), np.zeros(shape),
                               0.05 + 0.1 * rng.random(shape)]


def _diffusion2d_args(rng):
    return [rng.random((6, 6)), np.zeros((6, 6)), 0.05 + 0.1 * rng.random((6, 6))]


def _wave_sized(rng, n, trips=None):
    no_trips(trips, "wave_leapfrog")
    n = at_least(n, 3)
    x = np.linspace(0.0, 1.0, n)
    u_prev = np.sin(np.pi * x) + 0.1 * rng.random(n)
    u = np.sin(np.pi * x) + 0.1 * rng.random(n)
    return launch_1d(n), [u_prev, u, rng.random(n), 0.25]


def _wave_args(rng):
    return _wave_sized(rng, 17)[1]


def _advection_sized(rng, n, trips=None):
    no_trips(trips, "advection_upwind")
    n = at_least(n, 1)
    vel = rng.uniform(0.2, 1.0, n) * rng.choice([-1.0, 1.0], n)
    return launch_1d(n), [rng.random(n), vel, np.zeros(n), 0.4]


def _advection_args(rng):
    return _advection_sized(rng, 20)[1]


def _jacobi_sized(rng, n, trips=None):
    no_trips(trips, "jacobi2d")
    shape = grid2(n)
    return launch_2d(*shape), [rng.random(shape), rng.random(shape), np.zeros(shape),
                               0.01]


def _jacobi_args(rng):
    return [rng.random((7, 8)), rng.random((7, 8)), np.zeros((7, 8)), 0.01]


def _redblack_sized(rng, n, trips=None):
    no_trips(trips, "redblack_sor2d")
    shape = grid2(n)
    return launch_2d(*shape), [rng.random(shape), 0.01 * rng.random(shape), 1.5, 1]


def _redblack_args(rng):
    return [rng.random((7, 8)), 0.01 * rng.random((7, 8)), 1.5, 0]


def _laplacian3d_sized(rng, n, trips=None):
    no_trips(trips, "laplacian3d")
    shape = grid3(n)
    block = (2, 2, 8)
    grid = tuple(-(-s // b) for s, b in zip(shape, block))
    return (grid, block), [rng.random(shape), np.zeros(shape), 4.0]


def _laplacian3d_args(rng):
    return [rng.random((5, 5, 5)), np.zeros((5, 5, 5)), 4.0]


def _tiled_sized(rng, n, trips=None):
    no_trips(trips, "smooth_tiled")
    n = at_least(n, 1)
    return launch_1d(n, TPB), [rng.random(n), np.zeros(n), 0.25]


def _tiled_args(rng):
    return _tiled_sized(rng, 24)[1]


def _halo2d_sized(rng, n, trips=None):
    no_trips(trips, "halo_tile2d")
    nx, ny = grid2(n, smallest=1)
    return launch_2d(nx, ny, (TB2, TB2)), [rng.uniform(-1.0, 1.0, (nx, ny)),
                                           np.zeros((nx, ny)), 0.3]


def _halo2d_args(rng):
    return [rng.uniform(-1.0, 1.0, (13, 7)), np.zeros((13, 7)), 0.3]


def _pingpong_sized(rng, n, trips=None):
    n = at_least(n, 1)
    return launch_1d(n, TPB), [rng.uniform(-1.0, 1.0, n), np.zeros(n), 0.2,
                               4 if trips is None else trips]


def _pingpong_args(rng):
    return _pingpong_sized(rng, 13)[1]


CASES = [
    Case("heat1d_guarded", heat1d_guarded, (2, 8), _heat1d_args,
         note="guard 0 < i < n-1, scalar alpha",
         sized=_heat1d_sized),
    Case("heat1d_periodic_f32", heat1d_periodic_f32, (2, 8), _heat1d_f32_args,
         rtol=None, note="float32, periodic wrap (i + 1) % n",
         sized=_heat1d_f32_sized),
    Case("heat2d_step", heat2d_step, ((2, 2), (4, 4)), _heat2d_args,
         note="2-D index from threadIdx/blockIdx .x/.y",
         sized=_heat2d_sized),
    Case("diffusion2d_periodic", diffusion2d_periodic, ((2, 2), (3, 3)),
         _diffusion2d_args, note="cuda.grid(2), periodic in both axes",
         sized=_diffusion2d_sized),
    Case("wave_leapfrog", wave_leapfrog, (3, 6), _wave_args,
         note="u_prev, u, u_next; boundary branch",
         sized=_wave_sized),
    Case("advection_upwind", advection_upwind, (3, 8), _advection_args,
         note="upwind branch on the velocity sign, periodic",
         sized=_advection_sized),
    Case("jacobi2d", jacobi2d, ((2, 2), (4, 4)), _jacobi_args,
         note="Jacobi sweep, cuda.grid(2)",
         sized=_jacobi_sized),
    Case("redblack_sor2d", redblack_sor2d, ((2, 2), (4, 4)), _redblack_args,
         note="red-black SOR half sweep in place: (i + j) % 2 == color",
         sized=_redblack_sized),
    Case("laplacian3d", laplacian3d, ((1, 1, 1), (5, 5, 5)), _laplacian3d_args,
         note="cuda.grid(3), 7-point stencil",
         sized=_laplacian3d_sized),
    Case("smooth_tiled", smooth_tiled, (3, TPB), _tiled_args,
         note="shared-memory tile with halo, syncthreads",
         sized=_tiled_sized),
    Case("halo_tile2d", halo_tile2d, ((2, 1), (TB2, TB2)), _halo2d_args,
         note="2-D shared tile, edge and corner halos loaded under branches",
         sized=_halo2d_sized),
    Case("pingpong_diffusion", pingpong_diffusion, (2, TPB), _pingpong_args,
         note="time steps in shared memory (ping-pong), barriers, carried state "
              "checkpointed per thread",
         sized=_pingpong_sized, trip_loop="for t in range(steps)",
         trip_plan=((1, (0, 3)), (2, (5,)), (None, (1, 6)))),
]
