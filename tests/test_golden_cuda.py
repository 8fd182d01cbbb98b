"""Golden CUDA adjoint sources: a dozen gallery kernels in every form they have
(scatter; gather and zero for stencils that qualify), and their adjoint reports.
A change to the CUDA code generator shows up here as a readable diff.

Regenerate after an intended change with
``KADJ_UPDATE_GOLDEN=1 pytest tests/test_golden_cuda.py`` and review the diff like any
other code change.
"""
import json
import os
import pathlib

import numpy as np
import pytest

pytest.importorskip("numba.cuda")

from kernels.cuda import by_name  # noqa: E402

GOLDEN = pathlib.Path(__file__).parent / "golden" / "cuda"
NAMES = ("heat1d_guarded", "heat2d_step", "wave_leapfrog", "laplacian3d",
         "block_sum_squares", "block_logsumexp", "rk4_local_stages", "newton_cubic",
         "smooth_tiled", "tiled_matmul", "deposit_cic", "spmv_csr", "math_zoo_f32",
         "leaky_relu_early_return", "horner_shared_coeffs", "logsumexp_rows")
FORMS = [(n, f) for n in NAMES for f in ("scatter", "gather", "zero")
         if f == "scatter" or n in ("heat1d_guarded", "heat2d_step", "wave_leapfrog",
                                    "laplacian3d")]


def _check(path, text):
    if os.environ.get("KADJ_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"missing golden file {path}; run with KADJ_UPDATE_GOLDEN=1"
    assert text == path.read_text(), (
        f"{path.name} changed; review and regenerate with KADJ_UPDATE_GOLDEN=1 if "
        "intended")


@pytest.mark.parametrize("name,form", FORMS, ids=[f"{n}-{f}" for n, f in FORMS])
def test_cuda_adjoint_source_matches_golden(name, form):
    case = by_name(name)
    args = case.make_args(np.random.default_rng(0))
    _check(GOLDEN / f"{name}.{form}.py.txt",
           case.kernel.adjoint_source(*args, form=form))


@pytest.mark.parametrize("name", NAMES)
def test_cuda_adjoint_report_matches_golden(name):
    case = by_name(name)
    args = case.make_args(np.random.default_rng(0))
    report = case.kernel.adjoint_report(*args)
    _check(GOLDEN / f"{name}.report.json",
           json.dumps(report, indent=1, sort_keys=True, default=str) + "\n")


def test_every_golden_form_is_the_kernels_form():
    # the gather goldens are of kernels whose gather form exists: a kernel that lost
    # its gather form fails here rather than silently dropping out of the goldens
    for name in {n for n, f in FORMS if f != "scatter"}:
        case = by_name(name)
        report = case.kernel.adjoint_report(*case.make_args(np.random.default_rng(0)))
        assert report["gather"]["used"], (name, report["gather"])
