"""pytest-benchmark timings of the CPU cases: forward, kadj's adjoint, hand-written adjoint.

Not part of the default test run (``testpaths = ["tests"]``); run explicitly::

    pytest perf --benchmark-only                       # large sizes
    KADJ_BENCH_SIZE=small pytest perf --benchmark-only
    pytest perf --benchmark-only --benchmark-group-by=group   # one table per case

Every kernel is compiled and called once before timing starts.  Adjoint buffers are
in/out, so each timed round gets buffers refilled from the same seeds by
``benchmark.pedantic``'s ``setup``, which is not timed.  ``scripts/bench_cpu.py`` prints
the same measurements as one table with ratios.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from perf.cases_cpu import CASES, copy_args, make_adjoints

SIZE = os.environ.get("KADJ_BENCH_SIZE", "large")
ROUNDS = int(os.environ.get("KADJ_BENCH_ROUNDS", "20"))

pytestmark = pytest.mark.benchmark(min_rounds=ROUNDS, warmup=False)

_ids = [case.name for case in CASES]


@pytest.fixture(scope="module")
def setups():
    """Per case: forward arguments, pristine adjoint seeds, reusable adjoint buffers."""
    out = {}
    for case in CASES:
        rng = np.random.default_rng(0)
        args = case.make_args(case.size(SIZE), rng)
        seeds = make_adjoints(case, args, rng)
        out[case.name] = (args, seeds, tuple(np.empty_like(s) for s in seeds))
    return out


def _kadj_kernel(case):
    try:
        import kadj
    except Exception as exc:
        pytest.skip(f"kadj is not importable: {exc}")
    if not hasattr(kadj, "differentiate"):
        pytest.skip("kadj.differentiate is not available yet")
    return kadj.differentiate(case.forward)


def _bench_adjoint(benchmark, adjoint, args, seeds, work):
    def setup():
        for w, s in zip(work, seeds):
            np.copyto(w, s)
        return (*args, *work), {}

    call_args, _ = setup()
    adjoint(*call_args)  # compile outside the timed region
    benchmark.pedantic(adjoint, setup=setup, rounds=ROUNDS, iterations=1, warmup_rounds=1)


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_forward(benchmark, setups, case):
    benchmark.group = case.name
    args = copy_args(setups[case.name][0])
    case.forward(*args)
    benchmark(case.forward, *args)


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_forward_kadj(benchmark, setups, case):
    benchmark.group = case.name
    kernel = _kadj_kernel(case)
    args = copy_args(setups[case.name][0])
    kernel(*args)
    benchmark(kernel, *args)


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_adjoint_hand(benchmark, setups, case):
    benchmark.group = case.name
    args, seeds, work = setups[case.name]
    _bench_adjoint(benchmark, case.hand_adjoint, args, seeds, work)


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_adjoint_kadj(benchmark, setups, case):
    benchmark.group = case.name
    kernel = _kadj_kernel(case)
    args, seeds, work = setups[case.name]
    _bench_adjoint(benchmark, kernel.adjoint, args, seeds, work)
