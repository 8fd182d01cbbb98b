"""CUDA red-black (checkerboard) sweeps that update one colour of a grid in place
(:mod:`kadj.cuda.parity`).

- SOR in 2-D and 3-D, a 1-D Gauss-Seidel half sweep left by early returns, one that
  never reads its own element (no load of it in the adjoint) and a grid-stride sweep, both colours each: gradients against float64 central
  differences in the simulator (tests/checkerboard_cuda_sim.py), also at 40x33 and
  301 points; eight alternating half sweeps on a Tape; the forward mode; the user's
  arrays unchanged by ``k.adjoint[...]``.
- The adjoints compile to PTX; the report says which array is a red-black cell.
- Refusals, at the store: reads the parity does not keep apart from the writes (a
  diagonal neighbour, a neighbour two away), a colour that ``!=`` or an array gives
  (colour 5 would make every thread write), a read before the colour's test.
"""
from __future__ import annotations

import inspect

import numpy as np
import pytest

import checkerboard_cuda_sim as sim
from cudatools import nvvm_available, run_sim_cases
from kadj import DifferentiationError


def _args(name):
    k, make, launch = sim.KERNELS[name]
    return k, make(np.random.default_rng(0)) + [1]


@pytest.mark.parametrize("name", sorted(sim.REFUSED))
def test_reads_the_parity_does_not_separate_are_refused(name):
    k, make = sim.REFUSED[name]
    with pytest.raises(DifferentiationError) as info:
        k.adjoint_source(*make(np.random.default_rng(0)))
    err = info.value
    assert err.construct == "array read and written", err
    assert "red-black sweep" in str(err)
    lines, first = inspect.getsourcelines(k.py_func)
    stores = [first + n for n, line in enumerate(lines) if line.strip().startswith("u[")]
    assert err.loc.line == stores[0], (err.loc, stores)


@pytest.mark.parametrize("name", sorted(sim.KERNELS))
def test_the_report_names_the_red_black_cell(name):
    k, args = _args(name)
    rep = k.adjoint_report(*args)
    assert "red-black" in rep["in_place_cells"]["u"], rep["in_place_cells"]
    assert rep["arrays"]["u"]["accumulation"] == "atomic"     # the neighbours' adjoints
    assert not rep["gather"]["used"]


@pytest.mark.parametrize("name", sorted(sim.KERNELS))
def test_adjoint_and_tangent_compile_to_ptx(name):
    ok, why = nvvm_available()
    if not ok:
        pytest.skip(why)
    k, args = _args(name)
    ptx = k.adjoint_ptx(*args, cc=(9, 0))
    assert ".entry" in ptx and "atom.global.add.f64" in ptx
    tangent = k.jvp_ptx(*args, cc=(9, 0))
    assert ".entry" in tangent and "st.global.f64" in tangent


def test_a_write_only_own_element_is_not_loaded():
    k, args = _args("half_sweep_1d")
    src = k.adjoint_source(*args)
    assert "u__cell = u[" not in src and "adj_u, i," not in src, src


@pytest.mark.slow   # the CUDA simulator; the PTX tests and refusals run by default
def test_red_black_sweeps_in_the_simulator():
    names = list(sim.CASES) + ["sweeps"] + [f"{w}:{n}:{c}" for n in sim.KERNELS
                                            for w, c in (("jvp", 1), ("unchanged", 0))]
    res = run_sim_cases("checkerboard_cuda_sim.py", names)
    bad = {n: r for n, r in res.items() if r[0] != "OK"}
    assert not bad, bad


def test_one_sweep_in_the_simulator():
    res = run_sim_cases("checkerboard_cuda_sim.py", ["sor_2d:0", "gauss_seidel_1d:1"])
    bad = {n: r for n, r in res.items() if r[0] != "OK"}
    assert not bad, bad
