"""The demo's PDE kernels for CUDA (``@kadj.differentiate @cuda.jit``): the same
equation and objective as :mod:`kadj.demo.kernels_cpu`, one thread per cell."""
from numba import cuda

import kadj

THREADS = (16, 16)


def launch_config(shape):
    """(blocks, threads) covering a 2-D grid of ``shape`` cells."""
    blocks = tuple((n + t - 1) // t for n, t in zip(shape, THREADS))
    return blocks, THREADS


@kadj.differentiate(wrt=("u", "kappa"))
@cuda.jit
def diffuse(u, v, kappa, r):
    """v = u + r * div(kappa grad u) on the interior cells."""
    i, j = cuda.grid(2)
    if 1 <= i < u.shape[0] - 1 and 1 <= j < u.shape[1] - 1:
        kc = kappa[i, j]
        uc = u[i, j]
        flux = ((kc + kappa[i + 1, j]) * (u[i + 1, j] - uc)
                - (kc + kappa[i - 1, j]) * (uc - u[i - 1, j])
                + (kc + kappa[i, j + 1]) * (u[i, j + 1] - uc)
                - (kc + kappa[i, j - 1]) * (uc - u[i, j - 1]))
        v[i, j] = uc + 0.5 * r * flux


@kadj.differentiate(wrt=("u", "kappa"))
@cuda.jit
def objective(u, obs, kappa, weight, beta, out):
    """out[0] += this cell's share of 0.5 * weight * sum((u - obs)**2)
    + 0.5 * beta * sum(|grad kappa|**2) (out starts at zero)."""
    i, j = cuda.grid(2)
    nx, ny = u.shape
    if i < nx and j < ny:
        d = u[i, j] - obs[i, j]
        term = 0.5 * weight * d * d
        if i + 1 < nx:
            dk = kappa[i + 1, j] - kappa[i, j]
            term += 0.5 * beta * dk * dk
        if j + 1 < ny:
            dk = kappa[i, j + 1] - kappa[i, j]
            term += 0.5 * beta * dk * dk
        cuda.atomic.add(out, 0, term)
