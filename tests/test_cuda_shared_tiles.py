"""CUDA shared-memory tiles loaded under a branch, and ping-pong shared buffers.

- Halo tiles (1-D, and 2-D with a 16 x 16 block and an (18, 18) tile) whose halo and
  corner cells are loaded by the threads on the block's edges (``if tx == 0:``), zero
  outside the domain through nested ``if``; ping-pong time steps inside a block with
  barriers between them: two shared arrays swapped by copy, a (2, n) buffer whose row
  is the step's parity (``buf[t % 2, tx]``, ``buf[1 - p, tx]``), a loss summed over
  threads (the diffusivity's adjoint), a shift (``a[tx] = b[tx + 1]``), a 2-D
  ping-pong, a reflecting boundary read in the update, the arrays' names swapped at
  the end of each step (``a, b = b, a``: unrolled by two, kadj.buffer_swap; odd and
  even step counts).  (The gallery's
  ``halo_tile2d`` and ``pingpong_diffusion``, a non-linear step with a halo loaded from
  global memory and the result written to global memory, are checked by
  tests/test_cuda_gallery.py.)  Checked in the simulator
  against float64 central differences (tests/shared_tiles_cuda_sim.py, shared and
  local arrays filled with NaN first), and compiled to PTX.
- Refusals, each a located DifferentiationError: the result written back over the
  array other blocks read as their halo, and boundary cells rewritten inside the loop
  by one thread.
"""
from __future__ import annotations

import inspect

import numpy as np
import pytest

import shared_tiles_cuda_sim as sim
from cudatools import nvvm_available, run_sim_cases
from kadj import DifferentiationError

# the refusal: (construct, phrase of the message, source text of the located line)
REFUSALS = {
    "block_iteration_all_read": ("overwritten array", "read a per-thread copy instead",
                                 "v[tid] = v0[b, tid]"),
    "halo_steps_in_place": ("array read and written", "at elements other threads may touch",
                            "u[i] = a[tx + 1]"),
    "pingpong_reflect": ("unbounded tape in a loop", "cannot be reversed from checkpoints",
                         "for t in range(steps):"),
}


def _line_of(k, text):
    lines, first = inspect.getsourcelines(k.py_func)
    hits = [first + n for n, line in enumerate(lines) if line.strip() == text]
    assert len(hits) == 1, (text, hits)
    return hits[0]


def test_every_refused_kernel_has_its_expectation():
    assert set(REFUSALS) == set(sim.REFUSED)


@pytest.mark.parametrize("name", list(REFUSALS))
def test_refused_with_its_location(name):
    k, make = sim.REFUSED[name]
    construct, phrase, text = REFUSALS[name]
    with pytest.raises(DifferentiationError) as info:
        k.adjoint_source(*make(np.random.default_rng(0)))
    err = info.value
    assert err.construct == construct, err
    assert phrase in str(err) or phrase in (err.remedy or ""), err
    assert err.loc is not None and err.loc.line == _line_of(k, text), (err.loc, text)


@pytest.mark.slow   # the CUDA simulator; its PTX tests run by default (-m slow runs it)
def test_gradients_in_the_simulator():
    res = run_sim_cases("shared_tiles_cuda_sim.py", list(sim.CASES))
    bad = {n: r for n, r in res.items() if r[0] != "OK"}
    assert not bad, bad


def test_carried_shared_state_is_checkpointed_per_thread():
    # the thread's own element of the carried array: at an offset (a[tx + 1]), and of
    # every row of a parity-indexed buffer; each restored between two barriers
    k, _, make = sim.CASES["pingpong_copy"]
    src = k.adjoint_source(*make(np.random.default_rng(0)))
    assert "if tx + 1 < a.shape[0]:" in src and "a[tx + 1] = _ck_a" in src, src
    k, _, make = sim.CASES["pingpong_parity"]
    src = k.adjoint_source(*make(np.random.default_rng(0)))
    for row in (0, 1):
        assert f"buf[{row}, tx + 1] = _ck_buf" in src, src
    assert "every thread restored its element" in src
    # barriers: the gather form does not apply, and the report says so
    report = k.adjoint_report(*make(np.random.default_rng(0)))
    assert report["gather"] == {"used": False, "why": "the kernel uses barriers"}


@pytest.mark.parametrize("name", [
    pytest.param("halo2d", marks=pytest.mark.slow),   # the gallery's halo_tile2d compiles
    "pingpong_parity", "pingpong_swap"])
def test_adjoint_compiles_to_ptx(name):
    ok, why = nvvm_available()
    if not ok:
        pytest.skip(why)
    k, config, make = sim.CASES[name]
    ptx = k.adjoint_ptx(*make(np.random.default_rng(0)), cc=(9, 0))
    assert ".entry" in ptx and "bar.sync" in ptx and ".shared" in ptx
