"""Gradient checks of CUDA kernels in the simulator (run by tests/test_cuda_sim.py in a
subprocess with NUMBA_ENABLE_CUDASIM=1 set before numba is imported).

Each case launches the forward in the simulator on NumPy arrays, builds the
vector-Jacobian product by float64 central differences of the forward, and compares it
with kadj's adjoint launched on the same grid.  Prints one line per case:
``CASE <name> OK <max abs error>`` or ``CASE <name> FAIL <message>``.
"""
import os
import sys

assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", "set NUMBA_ENABLE_CUDASIM=1"

import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402

import kadj  # noqa: E402


@kadj.differentiate
@cuda.jit
def heat_step(u, u_new, alpha):
    i = cuda.grid(1)
    if 0 < i < u.shape[0] - 1:
        u_new[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1])


@kadj.differentiate
@cuda.jit
def laplace2d(u, v, c):
    i, j = cuda.grid(2)
    if 0 < i < u.shape[0] - 1 and 0 < j < u.shape[1] - 1:
        v[i, j] = c * (u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1]
                       - 4.0 * u[i, j])


@kadj.differentiate
@cuda.jit
def scaled_sin(x, y, a):
    i = cuda.threadIdx.x + cuda.blockIdx.x * cuda.blockDim.x
    if i < x.shape[0]:
        y[i] = a * math.sin(x[i]) + x[i] * x[i]


@kadj.differentiate
@cuda.jit
def pointwise(x, w, y):
    i = cuda.grid(1)
    if i < x.shape[0]:
        y[i] = x[i] * w[i] + math.exp(-x[i])


@cuda.jit(device=True)
def _scaled_tanh(a, b):
    return a * math.tanh(b)


@kadj.differentiate
@cuda.jit
def with_device_helper(x, y, s):
    i = cuda.grid(1)
    if i < x.shape[0]:
        y[i] = _scaled_tanh(s, x[i])


import math  # noqa: E402  (used by the kernels above at launch time)


def fd_check(k, config, args, eps=1e-6, seed=0):
    rng = np.random.default_rng(seed)
    plan = k.adjoint_plan(*args)
    written = [i for i in sorted(plan.written)]

    def outputs(xargs):
        cp = [a.copy() if isinstance(a, np.ndarray) else a for a in xargs]
        k[config](*cp)
        return [cp[i] for i in written]

    cts = {i: rng.standard_normal(args[i].shape) for i in written}

    def f(xargs):
        return sum(float(np.sum(cts[i] * o)) for i, o in zip(written, outputs(xargs)))

    bufs = []
    for i in plan.adjoint_args:
        x = args[i]
        if isinstance(x, np.ndarray):
            bufs.append(cts[i].copy() if i in cts else np.zeros_like(x))
        else:
            bufs.append(np.zeros(1, dtype=np.asarray(x).dtype))
    before = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    k.adjoint[config](*args, *bufs)
    for a, b in zip(args, before):
        if isinstance(a, np.ndarray):
            assert np.array_equal(a, b), "the adjoint modified a forward argument"
    worst = 0.0
    for slot, i in enumerate(plan.adjoint_args):
        x = args[i]
        if isinstance(x, np.ndarray):
            ref = np.zeros(x.shape)
            for idx in np.ndindex(x.shape):
                xp = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
                xm = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
                xp[i][idx] += eps
                xm[i][idx] -= eps
                ref[idx] = (f(xp) - f(xm)) / (2 * eps)
            # written-only arrays: the adjoint of the state before the call
            got = bufs[slot]
        else:
            xp, xm = list(args), list(args)
            xp[i] = x + eps
            xm[i] = x - eps
            ref = np.array([(f(xp) - f(xm)) / (2 * eps)])
            got = bufs[slot]
        err = float(np.max(np.abs(got - ref)))
        scale = max(1.0, float(np.max(np.abs(ref))))
        if err > 1e-6 * scale:
            raise AssertionError(f"gradient of {plan.arg_names[i]} differs: max error "
                                 f"{err}\ngot {got}\nref {ref}")
        worst = max(worst, err)
    return worst


def main(names):
    rng = np.random.default_rng(1)
    cases = {
        "heat_step": lambda: fd_check(heat_step, (2, 8), [rng.random(13), np.zeros(13),
                                                          0.1]),
        "laplace2d": lambda: fd_check(laplace2d, ((2, 2), (4, 4)),
                                      [rng.random((7, 6)), np.zeros((7, 6)), 0.7]),
        "scaled_sin": lambda: fd_check(scaled_sin, (3, 4), [rng.random(10), np.zeros(10),
                                                            1.3]),
        "pointwise": lambda: fd_check(pointwise, (2, 8), [rng.random(11), rng.random(11),
                                                          np.zeros(11)]),
        "with_device_helper": lambda: fd_check(with_device_helper, (2, 8),
                                               [rng.random(9), np.zeros(9), 0.3]),
    }
    for name in names or cases:
        try:
            err = cases[name]()
            print(f"CASE {name} OK {err:.3e}", flush=True)
        except Exception as exc:  # reported to the parent test
            msg = f"{type(exc).__name__}: {exc}".replace("\n", " | ")
            print(f"CASE {name} FAIL {msg}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
