"""The test suite runs every numba function with bounds checking.

``NUMBA_BOUNDSCHECK=1`` is set here, before any test module imports numba (numba
reads it into ``numba.config.BOUNDSCHECK`` at import and again before each
compilation), so an out-of-bounds access in a generated adjoint raises
``IndexError`` instead of corrupting memory or producing a plausible wrong gradient.
Negative indices still wrap around as in NumPy; only indices outside ``[-n, n)`` are
errors.  Subprocesses started by the tests (the CUDA simulator runs, the disk-cache
tests) inherit the setting through the environment; numba cannot bounds-check code
compiled for a GPU.  An explicit ``NUMBA_BOUNDSCHECK`` in the environment is kept
(``NUMBA_BOUNDSCHECK=0`` runs the suite without bounds checks).

kadj's adjoint cache key includes the setting, so adjoints compiled without bounds
checks are never served to a bounds-checked run.
"""
import os

if not os.environ.get("NUMBA_BOUNDSCHECK"):
    os.environ["NUMBA_BOUNDSCHECK"] = "1"
