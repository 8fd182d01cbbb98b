"""The 2-D heat step and interior misfit of the MPI inverse heat problem
(``scripts/mpi_heat_inverse.py``), also the 2-D kernels of the MPI tests
(``tests/mpi_cases.py``): ``@kadj.differentiate @njit`` CPU kernels on a rank's block
with one ghost layer, which they read but do not write.
"""
import numba

import kadj


@kadj.differentiate
@numba.njit(cache=True)
def heat2d(u, v, alpha):
    """One explicit 5-point heat step on the interior cells."""
    for i in range(1, u.shape[0] - 1):
        for j in range(1, u.shape[1] - 1):
            v[i, j] = u[i, j] + alpha * (u[i - 1, j] + u[i + 1, j] + u[i, j - 1]
                                         + u[i, j + 1] - 4.0 * u[i, j])


# The same step differentiated with respect to u alone: the inverse problem recovers
# u0, and its adjoint then leaves alpha's gradient (a reduction over every cell) out.
heat2d_wrt_u = kadj.differentiate(heat2d, wrt=("u",))


@kadj.differentiate
@numba.njit(cache=True)
def misfit2d(u, target, part):
    """part[0] = 0.5 * sum((u - target)**2) over the interior cells."""
    s = 0.0
    for i in range(1, u.shape[0] - 1):
        for j in range(1, u.shape[1] - 1):
            s += 0.5 * (u[i, j] - target[i, j]) ** 2
    part[0] = s
