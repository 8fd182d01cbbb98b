"""CUDA thread-local arrays allocated inside loops, in the simulator (run by
tests/test_scratch_in_loops.py in a subprocess with NUMBA_ENABLE_CUDASIM=1 set before
numba is imported).  Prints ``CASE <name> OK <max abs error>`` or ``CASE <name> FAIL
<message>`` per case; the reference is float64 central differences of the forward
launch (cuda_sim_cases.fd_check)."""
import math
import os
import sys

assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", "set NUMBA_ENABLE_CUDASIM=1"

import numpy as np  # noqa: E402
from numba import cuda, float64  # noqa: E402

import kadj  # noqa: E402
from cudatools import report_cases  # noqa: E402

STAGES = 3


@kadj.differentiate
@cuda.jit
def local_stages_per_step(x, out, dt):
    """Stage slopes in a local array allocated in every step of a time loop (refilled
    with zeros there: cuda.local.array is not np.empty)."""
    i = cuda.grid(1)
    if i < x.shape[0]:
        y = x[i]
        for t in range(4):
            k = cuda.local.array(STAGES, float64)
            k[0] = math.sin(y) - 0.3 * y
            k[1] = math.sin(y + 0.5 * dt * k[0])
            k[2] = math.sin(y + dt * k[1]) * k[0]
            y = y + dt * (k[0] + 2.0 * k[1] + k[2]) / 4.0
        out[i] = y


@kadj.differentiate
@cuda.jit
def local_partial_sums(x, w, out):
    """A local array per element of a loop over the row, filled by an inner loop that
    reads only the row's inputs."""
    i = cuda.grid(1)
    if i < x.shape[0]:
        acc = 0.0
        for j in range(w.shape[0]):
            p = cuda.local.array(STAGES, float64)
            for s in range(STAGES):
                p[s] = math.tanh(w[j] * x[i] * (s + 1.0))
            acc += p[0] * p[1] + p[2]
        out[i] = acc


def main(names):
    from cuda_sim_cases import fd_check   # (imported here: the module asserts the simulator)

    rng = np.random.default_rng(5)
    cases = {
        "local_stages_per_step": lambda: fd_check(
            local_stages_per_step, (2, 4), [rng.uniform(-1.0, 1.0, 7), np.zeros(7), 0.2]),
        "local_partial_sums": lambda: fd_check(
            local_partial_sums, (2, 4),
            [rng.uniform(-1.0, 1.0, 7), rng.uniform(0.2, 0.8, 3), np.zeros(7)]),
    }
    report_cases(cases, names)


if __name__ == "__main__":
    main(sys.argv[1:])
