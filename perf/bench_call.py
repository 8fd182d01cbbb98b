"""Call overhead benchmarks: what kadj adds to a tiny kernel's forward and adjoint call.

Not part of the default test run; run explicitly::

    pytest perf/bench_call.py --benchmark-only
    python scripts/bench_call.py            # the same measurements as one table

Cases: a 1-D three-point stencil on 8 elements and a 2-D five-point stencil on 8 x 8,
each launched ``launches`` times in a loop (10,000 by default) as

- *forward*: ``k(u, v, alpha)`` (no tape active), against the numba dispatcher called
  directly (``k.dispatcher``);
- *adjoint*: ``k.adjoint(u, v, alpha, adj_u, adj_v, adj_alpha)``, every argument check
  included, against the compiled adjoint called directly
  (``k.compiled(...).function``, which checks nothing).

The kernels do almost nothing, so the difference is kadj's Python per call.  The
machine's load shows in single runs: take the best of several.
"""
from __future__ import annotations

import time

import numba
import numpy as np
import pytest

import kadj

LAUNCHES = 10_000
ROUNDS = 5


@kadj.differentiate
@numba.njit
def tiny1d(u, v, alpha):
    n = u.shape[0]
    for i in range(1, n - 1):
        v[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1])


@kadj.differentiate
@numba.njit
def tiny2d(u, v, alpha):
    nx, ny = u.shape
    for i in range(1, nx - 1):
        for j in range(1, ny - 1):
            v[i, j] = u[i, j] + alpha * (u[i - 1, j] + u[i + 1, j] + u[i, j - 1] +
                                         u[i, j + 1] - 4.0 * u[i, j])


CASES = {"1-D (8)": (tiny1d, (8,)), "2-D (8x8)": (tiny2d, (8, 8))}


def arguments(case):
    """(kernel, forward arguments, adjoint buffers) of a case."""
    kern, shape = CASES[case]
    rng = np.random.default_rng(0)
    fwd = (rng.random(shape), np.zeros(shape), 0.1)
    adjs = (np.zeros(shape), rng.random(shape), np.zeros(1))
    return kern, fwd, adjs


def calls(case):
    """The four calls timed for ``case``: name -> a function of no arguments."""
    kern, fwd, adjs = arguments(case)
    kern(*fwd)
    kern.adjoint(*fwd, *adjs)                   # compiled, and checked once
    comp = kern.compiled(*fwd)
    compiled, tapes = comp.function, comp.fresh_memory()
    dispatcher = kern.dispatcher
    return {
        "forward": lambda: kern(*fwd),
        "dispatcher": lambda: dispatcher(*fwd),
        "adjoint": lambda: kern.adjoint(*fwd, *adjs),
        "compiled adjoint": lambda: compiled(*fwd, *adjs, *tapes),
    }


def per_call_us(fn, launches=LAUNCHES):
    """Microseconds per call of ``fn`` over ``launches`` calls in a loop."""
    t0 = time.perf_counter()
    for _ in range(launches):
        fn()
    return (time.perf_counter() - t0) / launches * 1e6


def measure(case, launches=LAUNCHES, repeat=ROUNDS):
    """Best-of-``repeat`` microseconds per call of each of :func:`calls`."""
    return {name: min(per_call_us(fn, launches) for _ in range(repeat))
            for name, fn in calls(case).items()}


# ---- pytest-benchmark ------------------------------------------------------------------
@pytest.mark.parametrize("what", ["forward", "dispatcher", "adjoint", "compiled adjoint"])
@pytest.mark.parametrize("case", list(CASES))
def test_calls(benchmark, case, what):
    benchmark.group = f"call overhead: {case}, {LAUNCHES:,} launches"
    fn = calls(case)[what]

    def launches():
        for _ in range(LAUNCHES):
            fn()

    benchmark.pedantic(launches, rounds=ROUNDS, iterations=1, warmup_rounds=1)
