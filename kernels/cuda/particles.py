"""Particles: deposits onto a grid (atomics), histograms, interpolation back to
particles, pairwise forces, per-particle time stepping."""
import math

import numpy as np
from numba import cuda

import kadj

from ..sizes import at_least, pairs_to_points
from . import Case, launch_1d, no_trips


@kadj.differentiate
@cuda.jit
def deposit_cic(pos, q, grid, inv_dx):
    """Cloud-in-cell deposit of charges onto a periodic 1-D grid."""
    p = cuda.grid(1)
    if p < pos.shape[0]:
        s = pos[p] * inv_dx
        cell = int(math.floor(s))
        frac = s - cell
        n = grid.shape[0]
        cuda.atomic.add(grid, cell % n, (1.0 - frac) * q[p])
        cuda.atomic.add(grid, (cell + 1) % n, frac * q[p])


@kadj.differentiate
@cuda.jit
def deposit_nearest(pos, q, grid, inv_dx):
    """Nearest-grid-point deposit with a Gaussian particle weight."""
    p = cuda.grid(1)
    if p < pos.shape[0]:
        cell = int(pos[p] * inv_dx)
        w = math.exp(-0.5 * q[p] * q[p])
        cuda.atomic.add(grid, cell, w * q[p])


@kadj.differentiate
@cuda.jit
def weighted_histogram(x, w, hist, lo, inv_width):
    """hist[bin(x)] += w * x, samples outside the range dropped."""
    i = cuda.grid(1)
    if i < x.shape[0]:
        b = int((x[i] - lo) * inv_width)
        if b >= 0 and b < hist.shape[0]:
            cuda.atomic.add(hist, b, w[i] * x[i])


@kadj.differentiate
@cuda.jit
def interpolate_to_particles(field, pos, vals, inv_dx):
    """Linear interpolation of a periodic grid field at particle positions."""
    p = cuda.grid(1)
    if p < pos.shape[0]:
        n = field.shape[0]
        s = pos[p] * inv_dx
        cell = int(s)
        frac = s - cell
        vals[p] = (1.0 - frac) * field[cell % n] + frac * field[(cell + 1) % n]


@kadj.differentiate
@cuda.jit
def pair_forces(pos, charge, force, soft):
    """Softened Coulomb forces in 2-D, O(N^2), one thread per particle."""
    i = cuda.grid(1)
    n = pos.shape[0]
    if i < n:
        fx = 0.0
        fy = 0.0
        xi = pos[i, 0]
        yi = pos[i, 1]
        for j in range(n):
            if j != i:
                dx = xi - pos[j, 0]
                dy = yi - pos[j, 1]
                r2 = dx * dx + dy * dy + soft
                inv_r3 = 1.0 / (r2 * math.sqrt(r2))
                s = charge[i] * charge[j] * inv_r3
                fx += s * dx
                fy += s * dy
        force[i, 0] = fx
        force[i, 1] = fy


@kadj.differentiate
@cuda.jit
def push_leapfrog(x, v, k, dt, nsteps):
    """Kick-drift leapfrog in a quartic trap, in place, one thread per particle."""
    p = cuda.grid(1)
    if p < x.shape[0]:
        xp = x[p]
        vp = v[p]
        kp = k[p]
        for step in range(nsteps):
            vp -= dt * kp * (xp + 0.1 * xp * xp * xp)
            xp += dt * vp
        x[p] = xp
        v[p] = vp


def _in_cells(rng, n, cells, dx):
    """n positions inside ``cells`` cells of width dx, away from the cell edges."""
    return (rng.integers(0, cells, n) + rng.uniform(0.1, 0.9, n)) * dx


def _cic_sized(rng, n, trips=None):
    """n particles on a grid of about n / 2 cells."""
    no_trips(trips, "deposit_cic")
    n = at_least(n, 1)
    m = at_least(n // 2, 2)
    return launch_1d(n), [_in_cells(rng, n, m, 0.5), rng.standard_normal(n),
                          rng.standard_normal(m), 2.0]


def _cic_args(rng):
    cells = rng.integers(0, 10, 16)
    pos = (cells + rng.uniform(0.1, 0.9, 16)) * 0.5
    return [pos, rng.standard_normal(16), rng.standard_normal(10), 2.0]


def _nearest_sized(rng, n, trips=None):
    no_trips(trips, "deposit_nearest")
    n = at_least(n, 1)
    m = at_least(n // 2, 2)
    return launch_1d(n), [_in_cells(rng, n, m, 0.25), rng.standard_normal(n),
                          np.zeros(m), 4.0]


def _nearest_args(rng):
    cells = rng.integers(0, 8, 16)
    pos = (cells + rng.uniform(0.1, 0.9, 16)) * 0.25
    return [pos, rng.standard_normal(16), np.zeros(8), 4.0]


def _hist_sized(rng, n, trips=None):
    """n samples into about n / 3 bins of [-1, ...), some outside on either side."""
    no_trips(trips, "weighted_histogram")
    n = at_least(n, 1)
    m = at_least(n // 3, 2)
    bins = rng.integers(-1, m + 1, n)
    x = -1.0 + (bins + rng.uniform(0.1, 0.9, n)) * 0.5
    return launch_1d(n), [x, rng.random(n), np.zeros(m), -1.0, 2.0]


def _hist_args(rng):
    bins = rng.integers(-1, 7, 20)          # some samples fall outside [lo, hi)
    x = -1.0 + (bins + rng.uniform(0.1, 0.9, 20)) * 0.5
    return [x, rng.random(20), np.zeros(6), -1.0, 2.0]


def _interp_sized(rng, n, trips=None):
    no_trips(trips, "interpolate_to_particles")
    n = at_least(n, 1)
    m = at_least(n // 2, 2)
    return launch_1d(n), [rng.standard_normal(m), _in_cells(rng, n, m, 0.5),
                          np.zeros(n), 2.0]


def _interp_args(rng):
    cells = rng.integers(0, 10, 14)
    pos = (cells + rng.uniform(0.1, 0.9, 14)) * 0.5
    return [rng.standard_normal(10), pos, np.zeros(14), 2.0]


def _pair_sized(rng, n, trips=None):
    """About n pairs: one thread per particle, each looping over all particles."""
    no_trips(trips, "pair_forces")
    p = pairs_to_points(n)
    return launch_1d(p, 8), [rng.standard_normal((p, 2)), rng.uniform(0.5, 1.5, p),
                             np.zeros((p, 2)), 0.1]


def _pair_args(rng):
    return [rng.standard_normal((10, 2)), rng.uniform(0.5, 1.5, 10),
            np.zeros((10, 2)), 0.1]


def _push_sized(rng, n, trips=None):
    n = at_least(n, 1)
    steps = 10 if trips is None else at_least(trips, 0)
    return launch_1d(n), [rng.standard_normal(n), rng.standard_normal(n),
                          rng.uniform(0.5, 2.0, n), 0.05, steps]


def _push_args(rng):
    return _push_sized(rng, 12)[1]


CASES = [
    Case("deposit_cic", deposit_cic, (2, 8), _cic_args,
         note="particle-to-grid, two cuda.atomic.add per particle, periodic",
         sized=_cic_sized),
    Case("deposit_nearest", deposit_nearest, (2, 8), _nearest_args,
         note="particle-to-grid, weight exp(-q^2/2) * q",
         sized=_nearest_sized),
    Case("weighted_histogram", weighted_histogram, (3, 8), _hist_args,
         note="bin guard, cuda.atomic.add",
         sized=_hist_sized),
    Case("interpolate_to_particles", interpolate_to_particles, (2, 8), _interp_args,
         note="grid-to-particle gather, periodic",
         sized=_interp_sized),
    Case("pair_forces", pair_forces, (2, 8), _pair_args,
         note="O(N^2) loop with j != i, loop-carried sums",
         sized=_pair_sized),
    Case("push_leapfrog", push_leapfrog, (2, 8), _push_args,
         note="per-thread time loop, loop-carried state, in place",
         sized=_push_sized, trip_loop='for step in range(nsteps)'),
]
