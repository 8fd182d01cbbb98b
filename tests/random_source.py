"""What the random-kernel tests share: compiling a drawn kernel from its source lines."""
import hashlib
import math

import numpy as np
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
