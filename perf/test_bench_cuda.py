"""pytest-benchmark timings of the CUDA cases: forward, kadj's adjoint, hand-written adjoint.

Needs a CUDA GPU (skipped otherwise).  Not part of the default test run
(``testpaths = ["tests"]``); run explicitly::

    pytest perf/test_bench_cuda.py --benchmark-only                 # large sizes
    KADJ_BENCH_SIZE=small pytest perf/test_bench_cuda.py --benchmark-only
    pytest perf/test_bench_cuda.py --benchmark-group-by=group       # one table per case

pytest-benchmark measures wall-clock time, so every timed call ends with
``cuda.synchronize()``: the times are launch plus kernel, as a user sees them.  Every
kernel runs (and compiles) before timing starts.  Adjoint buffers are in/out, so each
round refills them from the same seeds (device-to-device copies) in
``benchmark.pedantic``'s untimed ``setup``.  ``scripts/bench_cuda.py`` measures the same
with CUDA events and prints one table with ratios.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
from numba import config as _numba_config
from numba import cuda

if getattr(_numba_config, "ENABLE_CUDASIM", False):
    pytest.skip("NUMBA_ENABLE_CUDASIM is set: the simulator's timings mean nothing",
                allow_module_level=True)
if not cuda.is_available():
    pytest.skip("no CUDA GPU present (numba.cuda.is_available() is False)",
                allow_module_level=True)

from perf.cases_cuda import CASES, make_adjoints  # noqa: E402

SIZE = os.environ.get("KADJ_BENCH_SIZE", "large")
ROUNDS = int(os.environ.get("KADJ_BENCH_ROUNDS", "20"))

pytestmark = pytest.mark.benchmark(min_rounds=ROUNDS, warmup=False)

_ids = [case.name for case in CASES]


def _dev(args):
    return tuple(cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in args)


@pytest.fixture(scope="module")
def setups():
    """Per case: launch configuration, device arguments (pre-call state), device
    arguments for the forward to write into, adjoint seeds, adjoint work buffers."""
    out = {}
    for case in CASES:
        rng = np.random.default_rng(0)
        args = case.make_args(case.size(SIZE), rng)
        seeds = _dev(make_adjoints(case, args, rng))
        out[case.name] = (case.launch(args), _dev(args), _dev(args), seeds,
                          tuple(cuda.device_array_like(s) for s in seeds))
    yield out
    out.clear()


def _synced(fn):
    def call(*args):
        fn(*args)
        cuda.synchronize()
    return call


def _bench_adjoint(benchmark, launch, args, seeds, work):
    def setup():
        for w, s in zip(work, seeds):
            w.copy_to_device(s)
        cuda.synchronize()
        return (*args, *work), {}

    call = _synced(launch)
    call(*setup()[0])  # compile outside the timed region
    benchmark.pedantic(call, setup=setup, rounds=ROUNDS, iterations=1, warmup_rounds=1)


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_forward(benchmark, setups, case):
    benchmark.group = case.name
    config, _, fwd_args, _, _ = setups[case.name]
    call = _synced(case.forward[config])
    call(*fwd_args)
    benchmark(call, *fwd_args)


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_adjoint_hand(benchmark, setups, case):
    benchmark.group = case.name
    config, args, _, seeds, work = setups[case.name]
    _bench_adjoint(benchmark, case.hand[config], args, seeds, work)


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_adjoint_kadj(benchmark, setups, case):
    benchmark.group = case.name
    config, args, _, seeds, work = setups[case.name]
    _bench_adjoint(benchmark, case.kernel.adjoint[config], args, seeds, work)
