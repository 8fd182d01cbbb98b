"""Kernels whose generated adjoint sources are pinned in tests/golden/ (kept in their
own module so that the file:line comments in the golden files stay stable)."""
import math

from numba import njit


@njit
def heat_step(u, u_new, alpha):
    for i in range(1, u.shape[0] - 1):
        u_new[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1])


@njit
def horner(x, c, out):
    for i in range(x.shape[0]):
        p = c[c.shape[0] - 1]
        for k in range(c.shape[0] - 2, -1, -1):
            p = p * x[i] + c[k]
        out[i] = p


@njit
def clipped_energy(x, cap):
    s = 0.0
    for i in range(x.shape[0]):
        if x[i] > cap:
            break
        s += 0.5 * x[i] * x[i] + math.sin(x[i])
    return s
