"""The gather form spreads the block sums of scalar adjoints over slots that its
consume kernel sums (kadj.cuda.block_sum, kadj.cuda.slots): more blocks than slots, one
block, ten launches in a row (the slots are left at zero), two scalars of different
types on a 2-D grid, a launch failing between the two kernels (its slots are dropped),
and a launch on another stream; against analytic gradients.  In the CUDA simulator in a
subprocess (tests/slots_cuda_sim.py), and the same cases on a GPU when one is present."""
import os

import pytest

from cudatools import run_sim_cases

CASES = ["many_blocks", "one_block", "repeated", "two_rows_2d",
         "failed_launch_drops_slots", "streams"]


def _check(results):
    bad = {c: d for c, (status, d) in results.items() if status != "OK"}
    assert not bad, bad


def test_slots_in_the_simulator():
    _check(run_sim_cases("slots_cuda_sim.py", CASES))


def test_slots_on_a_gpu():
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        pytest.skip("NUMBA_ENABLE_CUDASIM is set: this test needs a real GPU")
    from numba import cuda
    if not cuda.is_available():
        pytest.skip("no CUDA GPU present")
    _check(run_sim_cases("slots_cuda_sim.py", CASES, env={"KADJ_ON_GPU": "1"},
                         simulator=False))
