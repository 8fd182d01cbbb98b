"""CUDA loops with several exits, and raise/assert, in the simulator (run by
tests/test_loop_exits.py in a subprocess with NUMBA_ENABLE_CUDASIM=1 set before numba is
imported).  Prints ``CASE <name> OK <max abs error>`` or ``CASE <name> FAIL <message>``
per case; the reference is float64 central differences of the forward launch
(cuda_sim_cases.fd_check)."""
import math
import os
import sys

assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", "set NUMBA_ENABLE_CUDASIM=1"

import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402

import kadj  # noqa: E402
from cudatools import report_cases  # noqa: E402


@kadj.differentiate
@cuda.jit
def newton_and_stop(a, out):
    """``while True`` left by ``if k >= 2 and small: break`` or a second break."""
    i = cuda.grid(1)
    if i < a.shape[0]:
        x = 1.0
        k = 0
        while True:
            d = 0.5 * (x - a[i] / x)
            x = x - d
            k += 1
            if k >= 2 and abs(d) < 1e-13:
                break
            if k >= 60:
                break
        out[i] = x * a[i]


@kadj.differentiate
@cuda.jit
def damped_exits(x, out):
    """Three breaks with code of their own, one under a conditional expression."""
    i = cuda.grid(1)
    if i < x.shape[0]:
        z = x[i]
        k = 0
        r = 0.0
        while True:
            k += 1
            z = 0.8 * z + 0.3 * math.sin(z)
            if (z > 0.9) if k > 1 else (z > 1.5):
                r = z * z
                break
            elif z < -0.9:
                r = -z * x[i]
                break
            if k > 6:
                r = 3.0 * z
                break
        out[i] = r + z


@kadj.differentiate
@cuda.jit
def checked_scale(x, out, a):
    """An input check that raises, kept out of the adjoint."""
    i = cuda.grid(1)
    if i < x.shape[0]:
        if x[i] < -1e6:
            raise ValueError("x out of range")
        out[i] = a * x[i] * x[i]


def main(names):
    from cuda_sim_cases import fd_check   # (imported here: the module asserts the simulator)

    rng = np.random.default_rng(3)
    cases = {
        "newton_and_stop": lambda: fd_check(newton_and_stop, (2, 4),
                                            [rng.random(6) + 0.5, np.zeros(6)]),
        "damped_exits": lambda: fd_check(
            damped_exits, (2, 4),
            [np.array([0.3, 1.8, -1.4, 0.05, -0.2, 1.1]), np.zeros(6)]),
        "checked_scale": lambda: fd_check(checked_scale, (2, 4),
                                          [rng.random(7), np.zeros(7), 0.7]),
    }
    report_cases(cases, names)


if __name__ == "__main__":
    main(sys.argv[1:])
