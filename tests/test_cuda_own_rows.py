"""CUDA kernels whose threads update their own row of a 2-D array in place.

- Refusals, located at the first store into the row: per-row softmax written in place,
  in-place normalisation, a recurrence along the row, a Thomas solve per row (each
  names the thread's own row), and a row another thread also reads (``y[i + 1, j]``:
  the refusal of elements other threads may touch).
- The refusal's remedy (no argument array read back after the kernel wrote it) gives
  correct gradients: tests/own_rows_cuda_sim.py in the simulator against float64
  central differences, the user's arrays unchanged by ``k.adjoint[...]``; the remedies'
  adjoints compile to PTX.
"""
from __future__ import annotations

import inspect

import numpy as np
import pytest

import own_rows_cuda_sim as sim
from cudatools import nvvm_available, run_sim_cases
from kadj import DifferentiationError

# the refused store: (array named in the message, source text of the located line)
STORES = {
    "softmax_in_place": ("y", "y[i, j] = math.exp(x[i, j] - m)"),
    "normalise_in_place": ("p", "p[i, j] /= s"),
    "recurrence_in_place": ("a", "a[i, t] = math.sin(a[i, t - 1]) * r[i] + a[i, t]"),
    "thomas_in_place": ("c, d, x", "c[i, 0] = up[i, 0] / di[i, 0]"),
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


@pytest.mark.parametrize("name", list(STORES))
def test_own_row_in_place_is_refused_with_its_location(name):
    k, err = _refusal(name)
    arrays, text = STORES[name]
    assert err.construct == "thread's own row updated in place", err
    assert f"own row of the array(s) {arrays} in place" in str(err), err
    assert err.loc is not None and err.loc.line == _line_of(k, text), (err.loc, text)
    assert err.remedy and "scalars" in err.remedy


def test_row_read_by_another_thread_keeps_its_refusal():
    k, err = _refusal("neighbour_row")
    assert err.construct == "array read and written", err
    assert "at elements other threads may touch" in str(err)
    assert err.loc.line == _line_of(k, "y[i, j] = y[i, j] * y[i + 1, j]")


def test_remedies_in_the_simulator():
    names = list(sim.CASES) + [f"unchanged:{c}" for c in sim.CASES]
    res = run_sim_cases("own_rows_cuda_sim.py", names)
    bad = {n: r for n, r in res.items() if r[0] != "OK"}
    assert not bad, bad


@pytest.mark.parametrize("name", list(sim.CASES))
def test_remedy_adjoint_compiles_to_ptx(name):
    ok, why = nvvm_available()
    if not ok:
        pytest.skip(why)
    k, config, make = sim.CASES[name]
    ptx = k.adjoint_ptx(*make(np.random.default_rng(0)), cc=(9, 0))
    assert ".entry" in ptx and "ld.global" in ptx
