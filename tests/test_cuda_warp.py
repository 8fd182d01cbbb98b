"""Warp shuffles in differentiated CUDA kernels.

- Simulator (tests/warp_cuda_sim.py in a subprocess, shuffles added to the simulator
  by tests/warp_sim_api.py): a warp sum (shfl_down, in a while loop and written out),
  a butterfly all-reduce (shfl_xor, mask from activemask), a prefix scan (shfl_up),
  a broadcast from lane 0 and a per-lane rotation (shfl_sync), ballot_sync and
  lanemask_lt as integers, a float32 warp sum: adjoints against float64 central
  differences, tangents (k.jvp) too.
- PTX: each tangent compiles with numba.cuda.compile_ptx (no GPU); each adjoint too
  where a GPU is present (its reverse shuffles are device functions, which numba-cuda
  compiles for the current device), with the shuffle modes it needs.
- Refusals, with the shuffle's location: under a branch on the thread, in a loop
  whose trip count depends on the thread, after an early return some threads take,
  with a partial constant mask.
"""
from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

import kadj
import warp_cuda_sim as sim
from cudatools import nvvm_available, run_sim_cases

FULL = 0xFFFFFFFF


@pytest.mark.slow   # the CUDA simulator; its PTX tests run by default (-m slow runs it)
def test_gradients_and_tangents_in_the_simulator():
    names = list(sim.CASES) + [f"jvp:{n}" for n in sim.CASES]
    res = run_sim_cases("warp_cuda_sim.py", names)
    bad = {n: r for n, r in res.items() if r[0] != "OK"}
    assert not bad, bad


def _ptx_or_skip():
    ok, why = nvvm_available()
    if not ok:
        pytest.skip(why)


# the shuffle instruction(s) each adjoint needs (shfl.sync.<mode>)
_MODES = {"warp_sum_while": ("up",), "warp_sum_unrolled": ("up",),
          "butterfly_xor": ("bfly",), "scan_up": ("down",),
          "broadcast_lane0": ("bfly", "idx"), "ballot_count": (),
          "warp_sum_f32": ("up",), "two_level_sum": ("up",),
          "shuffle_by_block": ("bfly",)}


@pytest.mark.parametrize("name", list(sim.CASES))
def test_tangent_compiles_to_ptx(name):
    _ptx_or_skip()
    k, config, make = sim.CASES[name]
    ptx = k.jvp_ptx(*make(np.random.default_rng(0)), cc=(9, 0))
    assert ("shfl.sync" in ptx) == (name != "ballot_count"), name


@pytest.mark.parametrize("name", list(sim.CASES))
def test_adjoint_compiles_to_ptx(name):
    # the reverse shuffles are device functions (kadj.cuda.warp), compiled for ``cc``
    # (kadj.cuda.ptx_cc: no GPU needed)
    _ptx_or_skip()
    k, config, make = sim.CASES[name]
    ptx = k.adjoint_ptx(*make(np.random.default_rng(0)), cc=(9, 0))
    for mode in _MODES[name]:
        assert f"shfl.sync.{mode}" in ptx, (name, mode)


def test_adjoint_source_names_the_reverse_shuffle():
    src = sim.warp_sum_while.adjoint_source(np.zeros(64), np.zeros(2))
    assert "warp_down_adjoint_full" in src
    assert "from kadj.cuda.warp import warp_down_adjoint_full" in src


# ---- refusals --------------------------------------------------------------------------
@kadj.differentiate
@cuda.jit
def shuffle_under_branch(x, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        v = cuda.shfl_down_sync(FULL, x[i], 1)
        out[i] = v


@kadj.differentiate
@cuda.jit
def shuffle_in_thread_loop(x, out):
    i = cuda.grid(1)
    v = x[i]
    for k in range(cuda.laneid):
        v += cuda.shfl_xor_sync(FULL, v, 1)
    out[i] = v


@kadj.differentiate
@cuda.jit
def shuffle_after_early_return(x, out):
    i = cuda.grid(1)
    if i >= x.shape[0]:
        return
    out[i] = cuda.shfl_up_sync(FULL, x[i], 1)


@kadj.differentiate
@cuda.jit
def shuffle_partial_mask(x, out):
    i = cuda.grid(1)
    out[i] = cuda.shfl_down_sync(0xFFFF, x[i], 1)


@kadj.differentiate
@cuda.jit
def shuffle_under_half_warp(x, out):
    i = cuda.grid(1)
    half = cuda.threadIdx.x // 16          # not the same in every lane of a warp
    if half == 0:
        out[i] = cuda.shfl_down_sync(FULL, x[i], 1)


@kadj.differentiate
@cuda.jit
def shuffle_under_2d_warp_id(x, out):
    i, j = cuda.grid(2)
    wid = cuda.threadIdx.x // 32           # a 2-D block: warps span rows
    if wid == 0 and cuda.threadIdx.y == 0:
        out[i] = cuda.shfl_down_sync(FULL, x[i], 1)


@pytest.mark.parametrize("kernel, words", [
    (shuffle_under_branch, "a branch on a thread-dependent condition"),
    (shuffle_under_half_warp, "a branch on a thread-dependent condition"),
    (shuffle_under_2d_warp_id, "a branch on a thread-dependent condition"),
    (shuffle_in_thread_loop, "a loop whose bounds depend on the thread"),
    (shuffle_after_early_return, "thread-dependent condition"),
    (shuffle_partial_mask, "constant mask 0xffff"),
])
def test_refused_with_location(kernel, words):
    with pytest.raises(kadj.DifferentiationError) as info:
        kernel.adjoint_source(np.zeros(8), np.zeros(8))
    msg = str(info.value)
    assert words in msg, msg
    assert "test_cuda_warp.py:" in msg and "cuda.shfl_" in msg, msg


def test_a_wrong_shuffle_rule_fails_the_checks():
    """The gradient checks above can fail: with shfl_down's adjoint reversed in the
    wrong direction (a shfl_down of the adjoint instead of a shfl_up), the warp sum's
    gradients disagree with finite differences."""
    names = ["warp_sum_unrolled"]
    res = run_sim_cases("warp_cuda_sim.py", names, env={"KADJ_TEST_WRONG_WARP_RULE": "1"})
    assert all(res[n][0] == "FAIL" for n in names), res
