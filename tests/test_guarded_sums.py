"""A load whose element is fixed during a loop has its adjoint summed in a local and
added to the element once, after the loop.  When the load may not have run (under a
branch in the loop, or a loop of no trips), that element may lie outside the array (a
thread past the end, ``if i < n`` inside the time loop; an index the kernel checks
before reading): the sum is then added only when it is not zero.  Without that, the
adjoint indexed out of bounds (CPU with bounds checks: IndexError; on a GPU: a write
into another array's memory).

The CUDA case runs in the simulator, which checks bounds: this file runs itself as a
script in a subprocess with ``NUMBA_ENABLE_CUDASIM=1``.
"""
import math
import os
import subprocess
import sys

import numpy as np
from numba import cuda, njit

import kadj
from kadj.testing import check_grad

HERE = os.path.dirname(os.path.abspath(__file__))


@njit(boundscheck=True)
def checked_gather(x, idx, out):
    for j in range(idx.shape[0]):
        k = idx[j]
        s = 0.0
        for t in range(1, 4):
            if k < x.shape[0]:          # an index past the end reads nothing
                s += math.sin(x[k]) * t
        out[j] = s


@njit(boundscheck=True)
def empty_inner(x, counts, out):
    for j in range(counts.shape[0]):
        s = 0.0
        for t in range(counts[j]):      # no trips where counts[j] == 0 (and j >= len(x))
            s += x[j] * x[j]
        out[j] = s


@cuda.jit
def guard_inside(a, r, out):
    i = cuda.grid(1)
    v = 0.5
    for t in range(1, 5):
        if i < a.shape[0]:
            v = math.sin(v) * r[i] + a[i]
    if i < a.shape[0]:
        out[i] = v


def test_cpu_index_past_the_end_inside_the_loop():
    rng = np.random.default_rng(1)
    x = rng.uniform(-1.0, 1.0, 5)
    idx = np.array([0, 5, 3, 5, 4])          # 5: past the end, skipped by the forward
    k = kadj.differentiate(checked_gather, wrt=("x",))
    res = check_grad(k, [x, idx, np.zeros(5)])
    assert res.max_rel_error < 1e-6
    adj_x = np.zeros(5)
    k.adjoint(x, idx, np.zeros(5), adj_x, np.ones(5))
    want = np.zeros(5)
    for k_ in (0, 3, 4):
        want[k_] += 6.0 * np.cos(x[k_])
    np.testing.assert_allclose(adj_x, want, rtol=1e-12)


def test_cpu_loop_without_trips_past_the_end():
    rng = np.random.default_rng(2)
    x = rng.uniform(-1.0, 1.0, 3)
    counts = np.array([2, 0, 3, 0, 0])        # rows 3 and 4 have no x element and no trips
    k = kadj.differentiate(empty_inner, wrt=("x",))
    adj_x = np.zeros(3)
    k.adjoint(x, counts, np.zeros(5), adj_x, np.ones(5))
    np.testing.assert_allclose(adj_x, [4.0 * x[0], 0.0, 6.0 * x[2]], rtol=1e-12)


def test_cuda_threads_past_the_end_in_the_simulator():
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env["NUMBA_ENABLE_CUDASIM"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(HERE), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, os.path.abspath(__file__)], env=env,
                          capture_output=True, text=True, timeout=600, cwd=HERE)
    assert proc.returncode == 0 and "CUDA-OK" in proc.stdout, proc.stdout + proc.stderr


if __name__ == "__main__":
    assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", "set NUMBA_ENABLE_CUDASIM=1"
    from kadj.testing import check_grad_cuda
    rng = np.random.default_rng(0)
    args = [rng.uniform(-1, 1, 5), rng.uniform(0.5, 1, 5), np.zeros(5)]
    k = kadj.differentiate(guard_inside)
    res = check_grad_cuda(k, (2, 4), args)        # 8 threads, 5 elements
    assert res.max_rel_error < 1e-6, res.max_rel_error
    print("CUDA-OK", res.max_rel_error)
