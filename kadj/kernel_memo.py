"""What the analyses compute again and again from one kernel, kept per kernel.

A typed kernel (:class:`kadj.ir.Kernel`) is never changed once built, so what is
derived from it alone (the variables it assigns once, what a loop's outside reads) can
be kept and answered again.  The last few kernels' values are kept; the kernel itself
is held with them, so its id is not reused while they are.
"""
from __future__ import annotations

_KEPT = {}          # id(kernel) -> (kernel, {key: value})


def per_kernel(kernel, key, compute):
    """``compute()``, kept for ``kernel`` under ``key``."""
    got = _KEPT.get(id(kernel))
    if got is None or got[0] is not kernel:
        if len(_KEPT) >= 8:
            _KEPT.clear()
        got = _KEPT[id(kernel)] = (kernel, {})
    memo = got[1]
    if key not in memo:
        memo[key] = compute()
    return memo[key]
