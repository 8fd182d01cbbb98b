"""A CUDA kernel whose variable holds an int and a float (typed with SSA by kadj's
frontend), in the simulator (run by tests/test_mixed_types.py in a subprocess with
NUMBA_ENABLE_CUDASIM=1 set before numba is imported).  Prints ``CASE <name> OK <max abs
error>`` or ``CASE <name> FAIL <message>``; the reference is float64 central differences
of the forward launch (cuda_sim_cases.fd_check)."""
import os
import sys

assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", "set NUMBA_ENABLE_CUDASIM=1"

import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402

import kadj  # noqa: E402
from cudatools import report_cases  # noqa: E402


@cuda.jit
def int_or_float(x, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        k = i
        if x[i] > 0.5:
            k = x[i] * 2.0
        out[i] = k * x[i]


def main(names):
    from cuda_sim_cases import fd_check   # (imported here: the module asserts the simulator)

    x = np.array([0.2, 0.7, 0.35, 0.9, 0.61, 0.1, 0.8])
    k = kadj.differentiate(int_or_float)
    cases = {"int_or_float": lambda: fd_check(k, (2, 4), [x, np.zeros(7)])}
    report_cases(cases, names)


if __name__ == "__main__":
    main(sys.argv[1:])
