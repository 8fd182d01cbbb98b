"""cuda.atomic.max/min in differentiated CUDA kernels, in the simulator (run by
tests/test_cuda_atomic_extrema.py in a subprocess with NUMBA_ENABLE_CUDASIM=1 set before
numba is imported)::

    NUMBA_ENABLE_CUDASIM=1 python tests/atomic_extrema_cuda_sim.py max_pool [case ...]

Each case checks ``k.adjoint`` against float64 central differences of forward launches
(:func:`kadj.testing.check_grad_cuda`); the values are distinct (a tie's finite
differences are one-sided).  ``exact:<kernel>`` compares the adjoint with the
analytic one: the cotangent of each element goes to the winning value, or stays on
the element when its pre-call value won.  Prints ``CASE <name> OK <detail>`` or
``CASE <name> FAIL <why>``.
"""
import os
import sys

import numpy as np
from numba import cuda

import kadj

K = 4


@kadj.differentiate
@cuda.jit
def max_pool(x, out):
    """Max pooling by windows of K: one atomic.max per thread."""
    i = cuda.grid(1)
    if i < x.shape[0]:
        cuda.atomic.max(out, i // K, x[i] * x[i] + x[i])


@kadj.differentiate
@cuda.jit
def max_all(x, out, scale):
    """The maximum of all elements (scaled), over a pre-call floor out[0]."""
    i = cuda.grid(1)
    if i < x.shape[0]:
        cuda.atomic.max(out, 0, scale * math_sin(x[i]))


@cuda.jit(device=True)
def math_sin(v):
    return v - v * v * v / 6.0


@kadj.differentiate
@cuda.jit
def min_pool_2d(x, out):
    """Minimum of each row of a 2-D array (cuda.grid(2)), atomic.min."""
    i, j = cuda.grid(2)
    if i < x.shape[0] and j < x.shape[1]:
        cuda.atomic.min(out, i, 2.0 * x[i, j] - x[i, j] * x[i, j])


def _pool_args(r):
    x = r.permutation(np.linspace(-2.0, 2.0, 16))     # distinct values
    out = np.full(4, -10.0)
    out[2] = 50.0                                     # this window keeps its floor
    return [x, out]


def _all_args(r):
    return [r.permutation(np.linspace(-1.0, 1.0, 24)), np.array([0.1]), 1.5]


def _min_args(r):
    x = r.permutation(np.linspace(1.2, 3.0, 15)).reshape(3, 5)   # 2x - x^2 decreasing
    out = np.array([10.0, -50.0, 10.0])              # row 1 keeps its floor
    return [x, out]


CASES = {
    "max_pool": (max_pool, (2, 8), _pool_args),
    "max_all": (max_all, (3, 8), _all_args),
    "min_pool_2d": (min_pool_2d, ((1, 2), (4, 4)), _min_args),
}


def _exact_max_pool(rng):
    """The adjoint of max_pool against the analytic cotangent routing."""
    x, out = _pool_args(rng)
    ct = rng.standard_normal(4)
    adj_x, adj_out = np.zeros_like(x), ct.copy()
    max_pool.adjoint[(2,), (8,)](x.copy(), out.copy(), adj_x, adj_out)
    ref_x, ref_out = np.zeros_like(x), ct.copy()
    v = x * x + x
    for j in range(4):
        w = v[j * K:(j + 1) * K]
        if out[j] >= w.max():
            continue
        m = j * K + int(np.argmax(w))
        ref_x[m], ref_out[j] = ct[j] * (2 * x[m] + 1), 0.0
    assert np.allclose(adj_x, ref_x) and np.allclose(adj_out, ref_out), \
        (adj_x, ref_x, adj_out, ref_out)
    return float(np.max(np.abs(adj_x - ref_x)))


def _ties(rng):
    """Equal values: the cotangent goes to one of them only (the lowest thread), and
    not at all when the pre-call value equals the maximum."""
    x = np.array([1.0, 3.0, 3.0, 2.0, 3.0, 0.0, 3.0, 1.0])
    out = np.array([-1.0, 12.0])      # window 1: the floor equals the maximum
    adj_x, adj_out = np.zeros(8), np.array([2.0, 5.0])
    max_pool.adjoint[(1,), (8,)](x.copy(), out.copy(), adj_x, adj_out)
    v = x * x + x
    want = np.zeros(8)
    want[1] = 2.0 * (2 * x[1] + 1)     # window 0: lanes 1 and 2 tie, lane 1 wins
    assert v[1] == v[2] and np.allclose(adj_x, want), adj_x
    assert np.allclose(adj_out, [0.0, 5.0]), adj_out   # window 1: the floor won
    return 0.0


def run_case(name):
    from kadj.testing import check_grad_cuda
    rng = np.random.default_rng(0)
    if name == "exact:max_pool":
        return _exact_max_pool(rng)
    if name == "ties":
        return _ties(rng)
    k, config, make = CASES[name]
    return check_grad_cuda(k, config, make(rng)).max_rel_error


def main(names):
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [here]
    from cudatools import report_cases
    cases = {n: (lambda n=n: run_case(n)) for n in list(CASES) + ["exact:max_pool",
                                                                   "ties"]}
    report_cases(cases, names)


if __name__ == "__main__":
    assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", "set NUMBA_ENABLE_CUDASIM=1"
    main(sys.argv[1:])
