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


import pytest  # noqa: E402


@pytest.fixture(scope="module")
def private_cache_dir(tmp_path_factory):
    """A kadj disk cache of the module's own (``KADJ_CACHE_DIR``), so that the adjoints
    of kernels the tests make do not go into the user's cache; restored after the
    module.  Modules that want it everywhere say
    ``pytestmark = pytest.mark.usefixtures("private_cache_dir")``."""
    old = os.environ.get("KADJ_CACHE_DIR")
    os.environ["KADJ_CACHE_DIR"] = str(tmp_path_factory.mktemp("kadj_cache"))
    yield
    if old is None:
        os.environ.pop("KADJ_CACHE_DIR", None)
    else:
        os.environ["KADJ_CACHE_DIR"] = old
