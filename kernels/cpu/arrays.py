"""Whole-array NumPy inside kernels: slices, element-wise expressions, reductions
and matrix products mixed with loops."""
from __future__ import annotations

import numpy as np
from numba import njit

from ._example import Example
from ..sizes import at_least


@njit
def diffusion_numpy(u, alpha, steps, target, loss):
    """Explicit diffusion written with slices, then a least-squares misfit."""
    for t in range(steps):
        u[1:-1] = u[1:-1] + alpha * (u[:-2] - 2.0 * u[1:-1] + u[2:])
    d = u - target
    loss[0] = 0.5 * np.sum(d * d)


def diffusion_numpy_sized(rng, n):
    n = at_least(n, 3)
    return (rng.standard_normal(n), 0.2, 4, rng.standard_normal(n), np.zeros(1))


def diffusion_numpy_args(rng):
    return diffusion_numpy_sized(rng, 24)


@njit
def mlp_numpy(W, b, V, x, y, loss):
    """A two-layer network on a batch of samples (rows of x) in NumPy notation:
    matrix products, row views, tanh, a mean squared error and weight decay."""
    m = x.shape[0]
    err = 0.0
    for j in range(m):
        h = np.tanh(W @ x[j] + b)
        r = V @ h - y[j]
        err += np.dot(r, r)
    loss[0] = err / m + 1e-3 * (np.sum(W * W) + np.sum(V * V))


def mlp_numpy_sized(rng, n):
    m = at_least(n, 1)
    return (rng.standard_normal((8, 5)) * 0.5, rng.standard_normal(8) * 0.1,
            rng.standard_normal((3, 8)) * 0.5, rng.standard_normal((m, 5)),
            rng.standard_normal((m, 3)), np.zeros(1))


def mlp_numpy_args(rng):
    return mlp_numpy_sized(rng, 6)


EXAMPLES = [
    Example("diffusion_numpy", diffusion_numpy, diffusion_numpy_args,
            wrt=("u", "alpha", "target"), tags=("numpy_arrays", "stencil", "time_loop"),
            sized=diffusion_numpy_sized),
    Example("mlp_numpy", mlp_numpy, mlp_numpy_args,
            tags=("numpy_arrays", "nn", "2d"), sized=mlp_numpy_sized),
]
