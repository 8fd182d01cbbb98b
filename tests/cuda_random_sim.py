"""Gradient checks of random CUDA kernels (tests/cuda_random_kernels.py) in the CUDA
simulator.

Run by tests/test_random_cuda.py in a subprocess with NUMBA_ENABLE_CUDASIM=1 set
before numba is imported::

    NUMBA_ENABLE_CUDASIM=1 python tests/cuda_random_sim.py SEED [SEED ...]

Runs :func:`kadj.testing.check_grad_cuda` on the kernel drawn from each seed (shared
and local scratch arrays filled with NaN, as for the gallery) and prints one line per
kernel: ``CASE <seed> OK <max abs error> <seconds>`` or ``CASE <seed> FAIL <message>``
(the kernel's source follows a failure, on lines starting with ``SRC``).
"""
import os
import sys
import time

assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", "set NUMBA_ENABLE_CUDASIM=1"

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cuda_gallery_sim import poison_scratch_arrays  # noqa: E402
from cuda_random_kernels import args_for, build, draw  # noqa: E402

from kadj.testing import check_grad_cuda  # noqa: E402


def main(seeds):
    poison_scratch_arrays()
    for seed in seeds:
        src, shape, config = draw(seed)
        t0 = time.perf_counter()
        try:
            res = check_grad_cuda(build(src), config, args_for(shape, seed), seed=seed)
            print(f"CASE {seed} OK {res.max_abs_error:.3e} "
                  f"{time.perf_counter() - t0:.2f}s", flush=True)
        except Exception as exc:  # reported to the parent test
            msg = f"{type(exc).__name__}: {exc}".replace("\n", " | ")
            print(f"CASE {seed} FAIL {msg}", flush=True)
            for line in src.splitlines():
                print(f"SRC {line}", flush=True)


if __name__ == "__main__":
    main([int(s) for s in sys.argv[1:]])
