"""CUDA loops whose bodies define values afresh in each iteration, in the simulator (run
by tests/test_first_push.py in a subprocess with NUMBA_ENABLE_CUDASIM=1 set before
numba is imported).  Prints ``CASE <name> OK <max abs error>`` or ``CASE <name> FAIL
<message>`` per case; the reference is float64 central differences of the forward
launch (cuda_sim_cases.fd_check)."""
import math
import os
import sys

assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", "set NUMBA_ENABLE_CUDASIM=1"

import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402

import kadj  # noqa: E402
from cudatools import report_cases  # noqa: E402


@cuda.jit
def steps_fresh(x, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        z = x[i]
        for t in range(4):
            c = math.cos(z)
            w = c * z
            z = z - 0.3 * w
        out[i] = z


@cuda.jit
def nested_fresh(x, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        z = x[i]
        for a in range(3):
            for b in range(3):
                t = math.sin(z + 0.1 * b)
                z = 0.5 * z + t * t
            z = z + 0.2
        out[i] = z


def main(names):
    from cuda_sim_cases import fd_check   # (imported here: the module asserts the simulator)
    rng = np.random.default_rng(5)
    cases = {}
    for name, kern in (("steps_fresh", steps_fresh), ("nested_fresh", nested_fresh)):
        for ck in (None, 3):
            k = kadj.differentiate(kern) if ck is None else \
                kadj.differentiate(kern, checkpoints=ck)
            cases[f"{name}_{'taped' if ck is None else 'checkpointed'}"] = (
                lambda k=k: fd_check(k, (2, 4), [rng.random(7) - 0.5, np.zeros(7)]))
    report_cases(cases, names)


if __name__ == "__main__":
    main(sys.argv[1:])
