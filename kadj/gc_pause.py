"""Python's cyclic garbage collector paused while kadj types, generates or compiles.

Generating an adjoint and numba's compilation of it allocate many short-lived objects
(numba's IR, types, llvmlite's instructions) and free almost all of them by reference
counting.  Each allocation can trigger a collection, and a full one walks every object
the process holds, numba's and the user's, for nothing: about 6 % of compiling the CPU
gallery's adjoints (one process, alternating, best of 4: 20.9 -> 19.6 s of CPU).
Cycles left behind are collected after, as usual.
"""
from __future__ import annotations

import contextlib
import gc

__all__ = ["collector_paused"]


@contextlib.contextmanager
def collector_paused():
    """The collector off inside the block (left as it was if already off)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
