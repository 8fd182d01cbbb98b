"""What the random-kernel tests share: compiling a drawn kernel from its source lines,
and a disk cache of their own for the adjoints of the drawn kernels."""
import hashlib
import math
import os

import numpy as np
import pytest
from numba import njit, prange


def compile_source(prefix, params, lines, what, parallel=False):
    """``@njit`` (``parallel=True`` if asked) of ``def <prefix>_<hash>(<params>)`` with
    the body ``lines``, and its source.  The function and file names are unique per
    source: kadj's disk-cache key is built from them (and from co_code, which does not
    see e.g. sin against cos)."""
    tag = hashlib.sha1("\n".join(lines).encode()).hexdigest()[:10]
    name = f"{prefix}_{tag}"
    src = f"def {name}({params}):\n" + "".join(f"    {ln}\n" for ln in lines)
    ns = {"math": math, "np": np, "prange": prange, "__name__": __name__}
    exec(compile(src, f"<kadj random {what} {tag}>", "exec"), ns)
    return (njit(parallel=True) if parallel else njit)(ns[name]), src


@pytest.fixture(scope="module")
def private_cache_dir(tmp_path_factory):
    """Keep the drawn kernels' adjoints out of the user's kadj disk cache."""
    old = os.environ.get("KADJ_CACHE_DIR")
    os.environ["KADJ_CACHE_DIR"] = str(tmp_path_factory.mktemp("kadj_cache_random"))
    yield
    if old is None:
        os.environ.pop("KADJ_CACHE_DIR", None)
    else:
        os.environ["KADJ_CACHE_DIR"] = old
