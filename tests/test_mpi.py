"""kadj.mpi under mpiexec: gradients of decomposed problems equal the one-process ones.

Each test runs tests/mpi_cases.py on 2 or 4 ranks (CPU kernels, and CUDA kernels on the
simulator); the script compares, on rank 0, every gathered gradient with the gradient
of the same global problem on one process, checked by finite differences (see its
docstring).  A hang is cut by the subprocess timeout after every rank prints its stack.
"""
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _mpiexec():
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else shutil.which("mpiexec")


pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("mpi4py") is None or _mpiexec() is None,
    reason="needs mpi4py and mpiexec")

CASES = ["pingpong_1d_walls", "pingpong_1d_periodic", "pingpong_2d_mixed",
         "checkpointed_2d", "checkpointed_1d_periodic", "online_1d_walls",
         "cuda_sim_pingpong_1d", "cuda_sim_slabs",
         "transpose_3d", "reductions", "config", "mismatch"]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """One compile cache for every rank of every run."""
    return tmp_path_factory.mktemp("mpi_cache")


def _env(cache_dir, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env.update(NUMBA_CACHE_DIR=str(cache_dir / "numba"),
               KADJ_CACHE_DIR=str(cache_dir / "kadj"),
               PYTHONPATH=os.pathsep.join([str(ROOT)] + [
                   p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]),
               **extra)
    env.pop("KADJ_MPI_CUDA_AWARE", None)
    return env


def _mpirun(ranks, args, env, timeout, cwd=ROOT):
    try:
        return subprocess.run([_mpiexec(), "-n", str(ranks), sys.executable] + args,
                              cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"mpiexec -n {ranks} hung for {timeout} s:\n"
                    f"{e.stdout}\n{e.stderr}")


def _run(ranks, cache_dir, timeout):
    env = _env(cache_dir, NUMBA_ENABLE_CUDASIM="1",
               MPI_CASES_DUMP_AFTER=str(timeout - 20))
    done = _mpirun(ranks, [str(ROOT / "tests" / "mpi_cases.py")], env, timeout)
    out = done.stdout
    assert done.returncode == 0, f"mpiexec -n {ranks} failed:\n{out}\n{done.stderr}"
    for case in CASES:
        assert f"ok {case}" in out, f"case {case} did not pass:\n{out}\n{done.stderr}"
    assert f"ALL OK on {ranks} ranks" in out, out


def test_two_ranks(cache_dir):
    _run(2, cache_dir, timeout=200)


def test_four_ranks(cache_dir):
    _run(4, cache_dir, timeout=200)


@pytest.mark.slow
def test_demo_two_ranks(cache_dir, tmp_path):
    """``python -m kadj demo --mpi`` on 2 ranks (a tiny problem): exit status 0, and
    its gradient passes the demo's finite-difference check; rank 0 alone prints."""
    png = tmp_path / "demo.png"
    done = _mpirun(2, ["-m", "kadj", "demo", "--mpi", "--quick", "--size", "16",
                       "--steps", "10", "--iters", "3", "--no-progress", "-o",
                       str(png)], _env(cache_dir), timeout=200, cwd=tmp_path)
    out = done.stdout
    assert done.returncode == 0, f"{out}\n{done.stderr}"
    assert "2 ranks, process grid (2, 1)" in out, out
    check = out[out.index("finite-difference check"):]
    assert "(ok, tolerance" in check.splitlines()[1], out
    assert out.count("summary") == 1 and png.exists(), out
