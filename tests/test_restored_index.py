"""An element overwritten inside a loop, in an array without an adjoint (a scratch mask
``k[c] = 0.5``), is put back by the reverse sweep at the store's index: the index must
be the one each iteration stored at.  An index assigned more than once per iteration
(clamped by an ``if``, found by a search loop or a ``while``, returned by an inlined
helper with a loop, chosen by a branch) used to be taken at its last value for every
iteration (it was saved once around the loop, since the reverse's restore was not
counted among its reads): a wrong gradient, with no error.  Gradients against float64
central differences (tests/fdcheck.py) at small and larger sizes, with the kernels'
indices crossing the clamp."""
import math

import numpy as np
import pytest
from numba import njit

import kadj
from fdcheck import fd_check


@njit
def clamped(u, pos, alpha, nsteps):
    n = u.shape[0]
    k = np.ones(n)
    for s in range(nsteps):
        c = int(pos[s] * n)
        if c > n - 1:
            c = n - 1
        k[c] = 0.5
        for i in range(n):
            u[i] = u[i] + alpha * k[i] * math.sin(u[i])


@njit
def searched(u, pos, alpha, nsteps):
    n = u.shape[0]
    k = np.ones(n)
    for s in range(nsteps):
        c = 0
        for j in range(n):
            if pos[s] * n >= j:
                c = j
        k[c] = 0.25 + 0.5 * k[c]
        for i in range(n):
            u[i] = u[i] + alpha * k[i] * math.tanh(u[i] * u[i])


@njit
def walked(u, pos, alpha, nsteps):
    n = u.shape[0]
    k = np.ones(n)
    for s in range(nsteps):
        c = 0
        while c < n - 1 and c + 1 <= pos[s] * n:
            c += 1
        k[c] = 0.5
        for i in range(n):
            u[i] = u[i] * (1.0 + alpha * k[i] * math.cos(u[i]))


@njit
def _cell(x, n):
    c = 0
    for j in range(1, n):
        if x * n >= j:
            c = j
    return c


@njit
def by_helper(u, pos, alpha, nsteps):
    n = u.shape[0]
    k = np.ones(n)
    for s in range(nsteps):
        k[_cell(pos[s], n)] = 0.5
        for i in range(n):
            u[i] = u[i] + alpha * k[i] * math.sin(u[i])


@njit
def by_branch(u, pos, alpha, nsteps):
    n = u.shape[0]
    k = np.ones((n, 2))
    for s in range(nsteps):
        if pos[s] > 0.5:
            c = n - 1
            d = 1
        else:
            c = int(pos[s] * n)
            d = 0
        k[c, d] = 0.5
        for i in range(n):
            u[i] = u[i] + alpha * (k[i, 0] + k[i, 1]) * math.sin(u[i])


@njit
def on_an_argument(u, mask, pos, alpha, nsteps):
    # the restored array is an argument: the adjoint's work copy of it is put back
    n = u.shape[0]
    for s in range(nsteps):
        c = int(pos[s] * n)
        if c > n - 1:
            c = n - 1
        mask[c] = 0.5 * mask[c]
        for i in range(n):
            u[i] = u[i] + alpha * mask[i] * math.sin(u[i])


KERNELS = [clamped, searched, walked, by_helper, by_branch]


def _args(rng, n, nsteps):
    pos = rng.uniform(0.0, 1.0, nsteps)
    pos[::3] = 1.0          # indices at the clamp, or the last cell
    return [rng.uniform(0.2, 1.2, n), pos, 0.3, nsteps]


@pytest.mark.parametrize("kernel", KERNELS, ids=[k.__name__ for k in KERNELS])
@pytest.mark.parametrize("n, nsteps", [(4, 3), (9, 17), (40, 60)])
def test_each_iteration_restores_at_its_own_index(kernel, n, nsteps):
    rng = np.random.default_rng(n + nsteps)
    fd_check(kadj.differentiate(kernel), _args(rng, n, nsteps), rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("n, nsteps", [(4, 3), (30, 45)])
def test_a_restored_argument_array(n, nsteps):
    rng = np.random.default_rng(1)
    u, pos, alpha, steps = _args(rng, n, nsteps)
    fd_check(kadj.differentiate(on_an_argument),
             [u, rng.uniform(0.5, 1.5, n), pos, alpha, steps], rtol=1e-5, atol=1e-8)
