"""The demo's PDE kernels for the CPU (``@kadj.differentiate @njit``).

``diffuse`` is one explicit step of the 2-D heat equation ``u_t = div(kappa grad u)``
on a grid of cells with fixed (zero) boundary values; ``objective`` is the misfit to
the observation plus a smoothness penalty on ``kappa``.  kadj generates both adjoints.
"""
from numba import njit

import kadj


@kadj.differentiate(wrt=("u", "kappa"))
@njit
def diffuse(u, v, kappa, r):
    """v = u + r * div(kappa grad u) on the interior cells (face diffusivity: the mean
    of the two cells')."""
    nx, ny = u.shape
    for i in range(1, nx - 1):
        for j in range(1, ny - 1):
            kc = kappa[i, j]
            uc = u[i, j]
            flux = ((kc + kappa[i + 1, j]) * (u[i + 1, j] - uc)
                    - (kc + kappa[i - 1, j]) * (uc - u[i - 1, j])
                    + (kc + kappa[i, j + 1]) * (u[i, j + 1] - uc)
                    - (kc + kappa[i, j - 1]) * (uc - u[i, j - 1]))
            v[i, j] = uc + 0.5 * r * flux


@kadj.differentiate(wrt=("u", "kappa"))
@njit
def objective(u, obs, kappa, weight, beta, out):
    """out[0] = 0.5 * weight * sum((u - obs)**2) + 0.5 * beta * sum(|grad kappa|**2)."""
    nx, ny = u.shape
    misfit = 0.0
    for i in range(nx):
        for j in range(ny):
            d = u[i, j] - obs[i, j]
            misfit += d * d
    rough = 0.0
    for i in range(nx - 1):
        for j in range(ny):
            d = kappa[i + 1, j] - kappa[i, j]
            rough += d * d
    for i in range(nx):
        for j in range(ny - 1):
            d = kappa[i, j + 1] - kappa[i, j]
            rough += d * d
    out[0] = 0.5 * weight * misfit + 0.5 * beta * rough
