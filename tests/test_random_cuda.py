"""Random CUDA stencil kernels (tests/cuda_random_kernels.py): gradients in the
simulator against finite differences, and every adjoint compiled to PTX.

- Simulator: tests/cuda_random_sim.py checks the kernel drawn from each seed with
  :func:`kadj.testing.check_grad_cuda` (float64 central differences, the last block
  partial, shared and local scratch arrays filled with NaN) in a subprocess with
  NUMBA_ENABLE_CUDASIM=1.  The default run draws 24 kernels; ``-m slow`` 200 more.
- PTX: the adjoint of each of the default kernels compiles with
  ``numba.cuda.compile_ptx`` (no GPU needed).
"""
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("numba.cuda")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from cuda_random_kernels import args_for, build, draw  # noqa: E402
from cudatools import nvvm_available  # noqa: E402

DEFAULT_SEEDS = range(1000, 1024)
SLOW_SEEDS = range(2000, 2200)


def _simulate(seeds):
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, os.path.join(HERE, "cuda_random_sim.py"),
                           *map(str, seeds)], env=env, capture_output=True, text=True,
                          timeout=1200, cwd=ROOT)
    cases = [ln for ln in proc.stdout.splitlines() if ln.startswith("CASE ")]
    failed = [ln for ln in proc.stdout.splitlines()
              if ln.startswith(("SRC ", "CASE ")) and " OK " not in ln]
    assert len(cases) == len(seeds), proc.stdout[-2000:] + proc.stderr[-4000:]
    assert not failed, "\n".join(failed)
    return len(cases)


def test_random_cuda_kernels_in_the_simulator():
    assert _simulate(DEFAULT_SEEDS) == len(DEFAULT_SEEDS)


@pytest.mark.slow
def test_many_random_cuda_kernels_in_the_simulator():
    assert _simulate(SLOW_SEEDS) == len(SLOW_SEEDS)


def test_random_cuda_adjoints_compile_to_ptx():
    ok, why = nvvm_available()
    if not ok:
        pytest.skip(why)
    for seed in DEFAULT_SEEDS:
        src, shape, _config = draw(seed)
        ptx = build(src).adjoint_ptx(*args_for(shape, seed), cc=(9, 0))
        assert ".entry" in ptx, src


def test_the_drawn_kernels_are_varied():
    """The seeds reach both dimensions, every form of the write, atomic totals and
    partial blocks."""
    srcs = [draw(s) for s in DEFAULT_SEEDS]
    text = "\n".join(s for s, _, _ in srcs)
    assert "cuda.grid(1)" in text and "cuda.grid(2)" in text
    assert " += " in text and "+ a * (" in text and "math.tanh" in text
    assert "cuda.atomic.add(loss" in text
    assert any(np.prod(shape) % 8 for _, shape, _ in srcs)
