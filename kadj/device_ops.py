"""Small CUDA kernels for the arrays kadj keeps on a device (imported on first use,
by :mod:`kadj.arrays`, only for numba device and simulator arrays)."""
from __future__ import annotations

from numba import cuda

__all__ = ["add_flat"]


@cuda.jit
def _add(dst, src):
    i = cuda.grid(1)
    if i < dst.shape[0]:
        dst[i] += src[i]


def add_flat(dst, src, n, stream=None):
    """``dst[:n] += src[:n]`` over 1-D device arrays, on ``stream`` (default stream
    without it)."""
    threads = 128
    blocks = (n + threads - 1) // threads
    config = (blocks, threads) if stream is None else (blocks, threads, stream)
    _add[config](dst, src)
