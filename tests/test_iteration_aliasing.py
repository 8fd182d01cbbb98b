"""Loops whose iterations write one element twice, where the analyses that take ``y[i]``
to be a different element at every iteration (iterations reversed in forward order, in
parallel, side by side; rows an iteration owns; a running extremum's "no winner" mark)
must not apply:

* a counter that can be negative: numba wraps ``y[-1]`` around to ``y[n - 1]``, so
  ``for i in range(-1, n)`` touches one element at two iterations.  These analyses
  now need a counter that starts at a constant 0 or more (or, going down, stops at a
  constant -1 or more);
* the counter at different positions of the index, ``y[i, j]`` and ``y[j, i]``:
  iteration i writes ``y[1, 0]`` as ``y[j, i]`` at i = 0 and as ``y[i, j]`` at i = 1.

Every kernel here but ``max_from_minus_one`` (fixed with the running extremum's rule)
gave a wrong gradient before."""
import math

import numpy as np
import pytest
from numba import njit

import kadj
from kadj.testing import check_grad


@njit
def from_minus_one(x, y):
    for i in range(-1, x.shape[0]):          # i = -1 and i = n - 1 write y[n - 1]
        y[i] = math.sin(x[i]) * (i + 2)


@njit
def rows_from_minus_one(x, y):
    for i in range(-1, x.shape[0]):
        for j in range(x.shape[1]):
            y[i, j] = x[i, j] * x[i, j] * (i + 3)


@njit
def step_two_from_minus_one(x, y):
    for i in range(-1, x.shape[0], 2):
        y[i] = x[i] * x[i] * (i + 2)


@njit
def down_to_minus_one(x, y):
    for i in range(x.shape[0] - 1, -2, -1):  # the last iteration, i = -1, writes y[n - 1]
        y[i] = math.cos(x[i]) * (i + 3)


@njit
def start_given(x, y, lo):
    for i in range(lo, x.shape[0]):          # lo = -1 at run time
        y[i] = math.cos(x[i]) * (i + 3)


@njit
def replayed_from_minus_one(c, x, y):
    for i in range(-1, x.shape[0]):          # a replayed loop (Horner per element)
        p = c[0]
        for k in range(1, c.shape[0]):
            p = p * x[i] + c[k]
        y[i] = p * (i + 2)


@njit
def replayed_start_given(c, x, y, lo):
    for i in range(lo, x.shape[0]):
        p = c[0]
        for k in range(1, c.shape[0]):
            p = math.sin(p * x[i]) + c[k]
        y[i] = p * (i + 2)


@njit
def max_from_minus_one(x):
    m = -1e300
    for i in range(-1, x.shape[0] - 1):
        m = max(m, x[i])
    return m * m


@njit
def transposed_stores(x, y):
    n = x.shape[0]
    for i in range(n):
        for j in range(n):
            y[i, j] = x[i, j] * x[i, j] * 2.0
            y[j, i] = math.sin(x[j, i]) * 3.0


def _vec(r, n):
    return (r.standard_normal(n), np.zeros(n))


CASES = {
    "from_minus_one": (from_minus_one, _vec),
    "rows_from_minus_one": (rows_from_minus_one,
                            lambda r, n: (r.standard_normal((n, 3)), np.zeros((n, 3)))),
    "step_two_from_minus_one": (step_two_from_minus_one, _vec),
    "down_to_minus_one": (down_to_minus_one, _vec),
    "start_given": (start_given, lambda r, n: _vec(r, n) + (-1,)),
    "replayed_from_minus_one": (replayed_from_minus_one,
                                lambda r, n: (r.standard_normal(5),) + _vec(r, n)),
    "replayed_start_given": (replayed_start_given,
                             lambda r, n: (r.standard_normal(5),) + _vec(r, n) + (-1,)),
    "max_from_minus_one": (max_from_minus_one, lambda r, n: (r.standard_normal(n),)),
    "transposed_stores": (transposed_stores,
                          lambda r, n: (r.standard_normal((n, n)), np.zeros((n, n)))),
}


@pytest.mark.parametrize("parallel", [None, True])
@pytest.mark.parametrize("name", sorted(CASES))
def test_one_element_at_two_iterations(name, parallel):
    fn, make = CASES[name]
    k = kadj.differentiate(fn, parallel=parallel)
    for n in (2, 3, 4, 5, 7, 40):
        check_grad(k, make(np.random.default_rng(n), n))


def test_start_given_at_zero_or_more():
    """The same kernels with the start at 0 or more at run time: still right (reversed
    in reverse order, since the start is not known to be at least 0)."""
    for name in ("start_given", "replayed_start_given"):
        fn, make = CASES[name]
        k = kadj.differentiate(fn)
        for lo in (0, 2):
            args = make(np.random.default_rng(lo), 9)[:-1] + (lo,)
            check_grad(k, args)
