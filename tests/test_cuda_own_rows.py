"""CUDA kernels whose threads update their own row of a 2-D array in place
(:mod:`kadj.cuda.own_rows`).

- The in-place family (per-row softmax written in place, in-place normalisation, a
  recurrence along the row, a Thomas solve per row) at rows of 1, 7 and 200 elements,
  softmax with respect to ``x`` only, a row loop that every launched thread runs
  (threads past the last row too), and the scalar-carrying rewrites: correct
  gradients in the simulator against float64 central differences
  (tests/own_rows_cuda_sim.py), the user's arrays unchanged by ``k.adjoint[...]``; the
  adjoints compile to PTX.
- The adjoint takes one buffer per own-row array, sized from the report; the forward
  mode (``jvp``) updates the row in place as the kernel does.
- Refusals, located at the first store into the row: a row another thread reads
  (``y[i + 1, j]``), a row of a 3-D array, a row rewritten in nested loops, a row
  picked by a grid-stride loop.
"""
from __future__ import annotations

import inspect
import re

import numpy as np
import pytest

import own_rows_cuda_sim as sim
from cudatools import nvvm_available, run_sim_cases
from kadj import DifferentiationError

# the refused store's source line, and the reason the message gives
REFUSED = {
    "row_of_3d": ("y[i, j, 0] = y[i, j - 1, 0] * y[i, j, 0]", "y has 3 dimensions"),
    "nested_row": ("y[i, j] = math.sin(y[i, j - 1]) * r[i]",
                   "rewritten in a loop nested in another loop"),
    "grid_stride_row": ("y[i, j] = y[i, j] * y[i, j - 1]",
                        "picked by a grid-stride loop"),
}


def _refusal(name):
    k, make = sim.REFUSED[name]
    with pytest.raises(DifferentiationError) as info:
        k.adjoint_source(*make(np.random.default_rng(0)))
    return k, info.value


def _line_of(k, text):
    lines, first = inspect.getsourcelines(k.py_func)
    hits = [first + n for n, line in enumerate(lines) if line.strip() == text]
    assert len(hits) == 1, (text, hits)
    return hits[0]


@pytest.mark.parametrize("name", list(REFUSED))
def test_unsupported_own_row_is_refused_with_its_location(name):
    k, err = _refusal(name)
    text, why = REFUSED[name]
    assert err.construct == "thread's own row updated in place", err
    assert "own row of the array(s) y in place" in str(err) and why in str(err), err
    assert err.loc is not None and err.loc.line == _line_of(k, text), (err.loc, text)
    assert err.remedy and "scalars" in err.remedy


def test_row_read_by_another_thread_keeps_its_refusal():
    k, err = _refusal("neighbour_row")
    assert err.construct == "array read and written", err
    assert "at elements other threads may touch" in str(err)
    assert err.loc.line == _line_of(k, "y[i, j] = y[i, j] * y[i + 1, j]")


@pytest.mark.slow   # the CUDA simulator; its PTX tests run by default (-m slow runs it)
def test_in_place_rows_in_the_simulator():
    unchanged = [f"unchanged:{n}:7" for n in sim.FAMILY] + [
        "unchanged:recurrence_scalar", "unchanged:recurrence_guard_inside"]
    repeated = ["repeated:thomas_in_place:7", "repeated:softmax_in_place:7"]
    names = list(sim.CASES) + unchanged + repeated
    res = run_sim_cases("own_rows_cuda_sim.py", names)
    bad = {n: r for n, r in res.items() if r[0] != "OK"}
    assert not bad, bad


def test_adjoint_takes_a_buffer_per_own_row_array():
    k = sim.thomas_in_place
    args = sim._thomas(np.random.default_rng(0), 7)
    rep = k.adjoint_report(*args)
    rows = {e["array"]: e for e in rep["own_rows"]}
    assert sorted(rows) == ["c", "d", "x"]
    assert [rows[a]["arg"] for a in "cdx"] == [3, 4, 5]
    # the row itself, then (slots + 1 entry) rows per checkpointed loop rewriting it
    assert all(e["rows"] >= 1 + 25 for e in rows.values()), rows
    src = k.adjoint_source(*args)
    sig = src[src.index("def thomas_in_place_adjoint("):].split(")")[0]
    assert "kadj_rows_c, kadj_rows_d, kadj_rows_x, adj_lo" in sig, sig
    assert "cuda.local.array('kadj_n" not in src
    assert len(k.adjoint_signature(*args)) == 6 + 3 + 6


def test_forward_mode_updates_the_row_in_place():
    src = sim.normalise_in_place.jvp_source(np.ones((3, 4)))
    assert "kadj_rows" not in src and "__row" not in src
    assert re.search(r"\n +p\[\w+, \w+\] = ", src), src
    assert re.search(r"\n +dot_p\[\w+, \w+\] = ", src), src


# the Thomas and softmax rows in the default run (the gallery's implicit_rows_thomas
# compiles there too); the rest with -m slow
_PTX_DEFAULT = {"thomas_in_place", "softmax_in_place"}


@pytest.mark.parametrize("name", [
    n if n in _PTX_DEFAULT else pytest.param(n, marks=pytest.mark.slow)
    for n in list(sim.FAMILY) + ["softmax_recomputed", "recurrence_scalar"]])
def test_adjoint_compiles_to_ptx(name):
    ok, why = nvvm_available()
    if not ok:
        pytest.skip(why)
    if name in sim.FAMILY:
        k, make = sim.FAMILY[name]
        args = make(np.random.default_rng(0), 7)
    else:
        k, config, make = sim.CASES[name]
        args = make(np.random.default_rng(0))
    ptx = k.adjoint_ptx(*args, cc=(9, 0))
    assert ".entry" in ptx and "ld.global" in ptx
