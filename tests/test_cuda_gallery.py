"""The CUDA gallery (kernels/cuda): gradients in the simulator and PTX of every adjoint.

- Simulator: tests/cuda_gallery_sim.py runs each gallery module in a subprocess with
  NUMBA_ENABLE_CUDASIM=1 set before numba is imported (this process may already have
  imported numba without it); the modules run in parallel, one subprocess each, and
  every case is checked with kadj.testing.check_grad_cuda against float64 central
  differences.
- PTX: every forward kernel and every adjoint compiles with numba.cuda.compile_ptx (no
  GPU needed); the adjoint's atomic counts are recorded (junit properties
  ``ptx_atomics``, ``ptx_global_atomics``, ``ptx_shared_atomics``,
  ``report_atomics``), and an adjoint whose report promises no atomics must hold no
  global atomic.
"""
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

cuda = pytest.importorskip("numba.cuda")

from kernels.cuda import MODULES, load  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PARAMS = [pytest.param(m, c.name, id=c.name) for m in MODULES for c in load(m)]
SELFCHECKS = ["wrong_scalar_adjoint", "wrong_array_element",
              "modified_forward_argument"]
SIM_RUNS = (*MODULES, "selfcheck")


def _run_module(module):
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, os.path.join(HERE, "cuda_gallery_sim.py"),
                           module], env=env, capture_output=True, text=True,
                          timeout=600, cwd=ROOT)
    out = {}
    for line in proc.stdout.splitlines():
        if line.startswith("CASE "):
            _, name, status, rest = line.split(" ", 3)
            out[name] = (status, rest)
    return out, proc


@pytest.fixture(scope="module")
def sim_results():
    """{module: ({case: (status, detail)}, CompletedProcess)}, all modules at once."""
    workers = max(1, min(len(SIM_RUNS), os.cpu_count() or 1))
    with ThreadPoolExecutor(workers) as pool:
        return dict(zip(SIM_RUNS, pool.map(_run_module, SIM_RUNS)))


def _sim_result(sim_results, module, name):
    results, proc = sim_results[module]
    if name not in results:
        pytest.fail(f"no result for {name}: the simulator subprocess for "
                    f"{module} ended with code {proc.returncode}\n"
                    f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return results[name]


@pytest.mark.parametrize("name", SELFCHECKS)
def test_check_grad_cuda_rejects_wrong_adjoints(sim_results, name):
    status, detail = _sim_result(sim_results, "selfcheck",
                                 f"check_grad_cuda_rejects_{name}")
    assert status == "OK", detail


@pytest.mark.parametrize("module,name", PARAMS)
def test_gradient_matches_finite_differences(sim_results, module, name):
    status, detail = _sim_result(sim_results, module, name)
    assert status == "OK", detail


# ------------------------------------------------------------------------------ PTX


from cudatools import nvvm_available as _nvvm_available  # noqa: E402


def _atomics(ptx, space=None):
    """PTX lines with an atomic (``atom.``/``red.``), optionally of one state space."""
    lines = [ln for ln in ptx.splitlines() if re.search(r"\b(atom|red)\.", ln)]
    if space is not None:
        lines = [ln for ln in lines if f".{space}." in ln]
    return lines


def _case(module, name):
    return next(c for c in load(module) if c.name == name)


@pytest.mark.parametrize("module,name", PARAMS)
def test_forward_compiles_to_ptx(module, name):
    """The gallery kernel itself is valid numba-cuda code."""
    ok, why = _nvvm_available_cached()
    if not ok:
        pytest.skip(why)
    import numba
    case = _case(module, name)
    args = case.make_args(np.random.default_rng(0))
    sig = tuple(numba.typeof(a) for a in args)
    from kadj.cuda.ptx_cc import for_cc      # called device functions: for cc 9.0 too
    with for_cc((9, 0)):
        ptx, _ = cuda.compile_ptx(case.kernel.py_func, sig, cc=(9, 0))
    assert ".entry" in ptx


@pytest.mark.parametrize("module,name", PARAMS)
def test_adjoint_compiles_to_ptx(module, name, record_property):
    ok, why = _nvvm_available_cached()
    if not ok:
        pytest.skip(why)
    case = _case(module, name)
    args = case.make_args(np.random.default_rng(0))
    ptx = case.kernel.adjoint_ptx(*args, cc=(9, 0))
    assert ".entry" in ptx
    if module == "warps":    # the forward's shuffles and their reverse (kernels/cuda/warps)
        from kernels.cuda.warps import PTX_SHUFFLES
        assert set(re.findall(r"shfl\.sync\.\w+", ptx)) == PTX_SHUFFLES[name], name
    report = case.kernel.adjoint_report(*args)
    glob = _atomics(ptx, "global")
    record_property("ptx_atomics", len(_atomics(ptx)))
    record_property("ptx_global_atomics", len(glob))
    record_property("ptx_shared_atomics", len(_atomics(ptx, "shared")))
    record_property("report_atomics", report["atomics"])
    # loops may be unrolled, so PTX can hold more atomics than the source; but an
    # adjoint whose accumulations are all thread-private must hold no global atomic
    if report["atomics"] == 0:
        assert not glob, "\n".join(glob)


_PROBE = []


def _nvvm_available_cached():
    if not _PROBE:
        _PROBE.append(_nvvm_available())
    return _PROBE[0]
