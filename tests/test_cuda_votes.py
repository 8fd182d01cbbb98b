"""Block-wide votes in differentiated CUDA kernels: ``cuda.syncthreads_or``, ``_and``
and ``_count`` (a barrier that returns an integer).

- Gradients against float64 central differences in the simulator
  (tests/votes_cuda_sim.py): a branch on ``syncthreads_or`` (taken in one block and
  not the other, and in neither), a count used as a factor, a fixed-point iteration
  left when ``syncthreads_and`` says the block converged (reversed from checkpoints),
  a vote on shared-memory values, a vote in each iteration of a loop; the forward
  mode; the user's arrays unchanged by ``k.adjoint[...]``.
- The adjoint takes the vote again in its forward sweep (a loop's vote at the top of
  each reversed iteration, which every thread runs as the forward's) and mirrors its
  barrier in the reverse sweep; adjoints and tangents compile to PTX (``bar.red``).
"""
from __future__ import annotations

import numpy as np
import pytest

import votes_cuda_sim as sim
from cudatools import nvvm_available, run_sim_cases

_NAMES = ["damp_if_any:mixed", "scale_by_count", "iterate_until_all", "shared_vote",
          "vote_per_coefficient"]


def _args(name):
    k, config, make = sim.CASES[name]
    return k, make(np.random.default_rng(0))


@pytest.mark.parametrize("name", _NAMES)
def test_the_vote_is_taken_again_and_its_barrier_mirrored(name):
    k, args = _args(name)
    src = k.adjoint_source(*args)
    forward, reverse = src.split("# ---- reverse sweep ----")
    # in the forward sweep, or (a loop's vote, recomputed) in the reversed loop
    where = reverse if name == "vote_per_coefficient" else forward
    assert "cuda.syncthreads_" in where, src
    assert "cuda.syncthreads()  # mirrors the forward barrier" in reverse, src


@pytest.mark.parametrize("name", _NAMES)
def test_adjoint_and_tangent_compile_to_ptx(name):
    ok, why = nvvm_available()
    if not ok:
        pytest.skip(why)
    k, args = _args(name)
    for ptx in (k.adjoint_ptx(*args, cc=(9, 0)), k.jvp_ptx(*args, cc=(9, 0))):
        assert ".entry" in ptx and "bar.red" in ptx


def test_votes_in_the_simulator():
    names = list(sim.CASES) + [f"{w}:{n}" for n in sim.CASES
                               for w in ("jvp", "unchanged")]
    res = run_sim_cases("votes_cuda_sim.py", names)
    bad = {n: r for n, r in res.items() if r[0] != "OK"}
    assert not bad, bad
