"""CUDA kernels with block-wide votes (``cuda.syncthreads_or``, ``_and``, ``_count``:
numba-cuda takes an integer predicate, not a bool), in the simulator (run by tests/test_cuda_votes.py in a subprocess with
NUMBA_ENABLE_CUDASIM=1 set before numba is imported)::

    NUMBA_ENABLE_CUDASIM=1 python tests/votes_cuda_sim.py damp_if_any:mixed [case ...]

CASES: a branch on ``syncthreads_or`` (taken by some blocks and not others), a count
used as a factor, a fixed-point iteration that the block leaves when
``syncthreads_and`` says every thread converged (its loop reversed from checkpoints,
the vote taken again in the replay), a vote on shared-memory values that also orders
the shared writes before the reads, and a vote in every iteration of a loop over
coefficients; each against float64 central differences
(:func:`kadj.testing.check_grad_cuda`).  ``jvp:<case>`` checks the forward mode
against central differences; ``unchanged:<case>`` that ``k.adjoint[...]`` changes only
the gradient buffers.  Prints ``CASE <name> OK <detail>`` or ``CASE <name> FAIL <why>``.
"""
import os
import sys

import numpy as np
from numba import cuda, float64

import kadj

TPB = 8


@kadj.differentiate
@cuda.jit
def damp_if_any(x, y, tol):
    i = cuda.grid(1)
    big = 0
    if i < x.shape[0]:
        big = int(abs(x[i]) > tol)
    anybig = cuda.syncthreads_or(big)
    if i < x.shape[0]:
        if anybig:
            y[i] = 0.5 * x[i] * x[i]
        else:
            y[i] = x[i]


@kadj.differentiate
@cuda.jit
def scale_by_count(x, y, tol):
    i = cuda.grid(1)
    p = 0
    if i < x.shape[0]:
        p = int(x[i] > tol)
    c = cuda.syncthreads_count(p)
    if i < x.shape[0]:
        y[i] = x[i] * c + x[i] * x[i]


@kadj.differentiate
@cuda.jit
def iterate_until_all(x, y, tol):
    i = cuda.grid(1)
    v = 0.0
    a = 0.0
    if i < x.shape[0]:
        a = x[i]
    for it in range(50):
        vn = 0.5 * (v + a / (1.0 + v * v)) if i < x.shape[0] else 0.0
        done = abs(vn - v) < tol
        v = vn
        if cuda.syncthreads_and(int(done)):
            break
    if i < x.shape[0]:
        y[i] = v


@kadj.differentiate
@cuda.jit
def shared_vote(x, y):
    sm = cuda.shared.array(TPB, float64)
    tx = cuda.threadIdx.x
    i = cuda.grid(1)
    sm[tx] = x[i] if i < x.shape[0] else 0.0
    anyneg = cuda.syncthreads_or(int(sm[tx] < 0.0))     # also the barrier after the writes
    if i < x.shape[0]:
        if anyneg:
            y[i] = sm[(tx + 1) % TPB] * sm[tx]
        else:
            y[i] = sm[(tx + TPB - 1) % TPB] + sm[tx]


@kadj.differentiate
@cuda.jit
def vote_per_coefficient(x, w, y):
    i = cuda.grid(1)
    xi = x[i] if i < x.shape[0] else 0.0
    acc = 0.0
    for k in range(w.shape[0]):
        c = cuda.syncthreads_count(1 if xi * w[k] > 0.0 else 0)
        acc += c * w[k] * xi + w[k] * xi * xi
    if i < x.shape[0]:
        y[i] = acc


def _x(r, n=16):
    return r.standard_normal(n)


CASES = {   # kernel, launch, arguments
    "damp_if_any:mixed": (damp_if_any, (2, TPB),
                          lambda r: [np.r_[0.1 * _x(r, 8), 3 + _x(r, 8) ** 2],
                                     np.zeros(16), 1.5]),
    "damp_if_any:none": (damp_if_any, (2, TPB),
                         lambda r: [0.1 * _x(r), np.zeros(16), 1.5]),
    "scale_by_count": (scale_by_count, (2, TPB), lambda r: [_x(r), np.zeros(16), 0.3]),
    "iterate_until_all": (iterate_until_all, (2, TPB),
                          lambda r: [r.uniform(0.5, 2.0, 13), np.zeros(13), 1e-3]),
    "shared_vote": (shared_vote, (2, TPB),
                    lambda r: [np.r_[_x(r, 8), np.abs(_x(r, 5))], np.zeros(13)]),
    "vote_per_coefficient": (vote_per_coefficient, (2, TPB),
                             lambda r: [_x(r, 13), _x(r, 5), np.zeros(13)]),
}


def _args(name, seed):
    k, config, make = CASES[name]
    return k, config, make(np.random.default_rng(seed))


def _gradient(name):
    from kadj.testing import check_grad_cuda
    k, config, args = _args(name, 0)
    return check_grad_cuda(k, config, args).max_rel_error


def _unchanged(name):
    from cudatools import adjoint_keeps_arguments
    k, config, args = _args(name, 2)
    return adjoint_keeps_arguments(k, config, args)


def _run(k, config, args):
    from cudatools import launched_on_copies
    return launched_on_copies(k, config, args)


def _jvp(name):
    """k.jvp against central differences of the launch along a random direction of
    the first argument."""
    k, config, args = _args(name, 4)
    d = np.random.default_rng(5).standard_normal(args[0].shape)
    tangents = [d.copy() if n == 0 else (np.zeros_like(a) if isinstance(a, np.ndarray)
                                         else np.zeros(1))
                for n, a in enumerate(args)]
    moved = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    k.jvp[config](*moved, *tangents)
    h = 1e-6
    plus = _run(k, config, [args[0] + h * d] + args[1:])
    minus = _run(k, config, [args[0] - h * d] + args[1:])
    out = next(n for n, a in enumerate(args) if n and isinstance(a, np.ndarray)
               and not np.array_equal(moved[n], a))
    fd = (plus[out] - minus[out]) / (2 * h)
    err = np.abs(tangents[out] - fd).max() / np.abs(fd).max()
    assert err < 1e-6, f"jvp differs from central differences by {err:.2e}"
    return err


def main(names):
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [here]
    from cudatools import report_cases
    cases = {n: (lambda n=n: _gradient(n)) for n in CASES}
    for n in CASES:
        cases[f"jvp:{n}"] = lambda n=n: _jvp(n)
        cases[f"unchanged:{n}"] = lambda n=n: _unchanged(n)
    report_cases(cases, names)


if __name__ == "__main__":
    assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", "set NUMBA_ENABLE_CUDASIM=1"
    main(sys.argv[1:])
