"""The conditions under which numba compiles what kadj generated.

An adjoint's or tangent's first call (numba compiles it), and a CUDA adjoint's or
tangent's PTX, are compiled with each call's type resolution remembered
(:mod:`kadj.typing_memo`) and Python's cyclic collector paused (:mod:`kadj.gc_pause`).
"""
from __future__ import annotations

import contextlib

from . import gc_pause, typing_memo

__all__ = ["compiling"]


@contextlib.contextmanager
def compiling():
    """Within this block numba compiles kadj's code: type resolutions remembered, the
    collector paused."""
    with typing_memo.memoised(), gc_pause.collector_paused():
        yield
