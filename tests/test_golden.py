"""Golden adjoint sources: codegen changes show up as readable diffs.

Regenerate after an intended change with ``KADJ_UPDATE_GOLDEN=1 pytest tests/test_golden.py``
and review the diff like any other code change.
"""
import os
import pathlib

import numpy as np
import pytest

import kadj
import golden_kernels as gk
import golden_rows as gr

GOLDEN = pathlib.Path(__file__).parent / "golden"
CASES = {
    "heat_step": (gk.heat_step, lambda: (np.ones(8), np.zeros(8), 0.1)),
    "horner": (gk.horner, lambda: (np.ones(5), np.ones(4), np.zeros(5))),
    "clipped_energy": (gk.clipped_energy, lambda: (np.ones(6), 2.0)),
    # row loops replayed one row at a time (kadj.analysis.rewrites)
    "thomas_shared_rows": (gr.thomas_shared_rows,
                           lambda: tuple(np.ones((3, 4)) for _ in range(5))),
    "softmax_rows_inplace": (gr.softmax_rows_inplace, lambda: (np.ones((3, 4)),)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_adjoint_source_matches_golden(name):
    kernel, make = CASES[name]
    source = kadj.differentiate(kernel).adjoint_source(*make())
    path = GOLDEN / f"{name}.py.txt"
    if os.environ.get("KADJ_UPDATE_GOLDEN"):
        path.write_text(source)
    assert path.exists(), f"missing golden file {path}; run with KADJ_UPDATE_GOLDEN=1"
    assert source == path.read_text(), (
        f"generated adjoint of {name} changed; review and regenerate with "
        "KADJ_UPDATE_GOLDEN=1 if intended")


def test_golden_sources_compute_the_right_gradient():
    # the pinned text is also a correct adjoint: check one against an analytic formula
    k = kadj.differentiate(gk.heat_step)
    u = np.linspace(0.0, 1.0, 8) ** 2
    adj_u, adj_un, adj_a = np.zeros(8), np.ones(8), np.zeros(1)
    k.adjoint(u, np.zeros(8), 0.1, adj_u, adj_un, adj_a)
    lap = u[:-2] - 2 * u[1:-1] + u[2:]
    np.testing.assert_allclose(adj_a[0], lap.sum(), rtol=1e-12)
