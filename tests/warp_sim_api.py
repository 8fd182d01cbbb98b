"""Warp shuffles and votes for numba-cuda's simulator, which has none (test support).

:func:`install` adds ``shfl_sync``, ``shfl_up_sync``, ``shfl_down_sync``,
``shfl_xor_sync``, ``ballot_sync``, ``activemask`` and ``lanemask_lt`` to the
simulator's ``cuda`` module with the hardware's semantics (PTX ``shfl.sync`` with width
32: the lane operand is taken modulo 32; an out-of-range lane reads its own value).
Each call is an exchange through a per-warp table between two barriers of the warp's
lanes, so every lane of a warp must make the same calls in the same order: true of the
kernels kadj accepts, whose shuffles stand where every lane of a warp arrives (the
simulator then also checks that promise: a lane that skipped a shuffle leaves the
others waiting, and they fail after a timeout).  A lane outside the mask reads NaN (undefined on a GPU).
"""
from __future__ import annotations

import math
import threading

_WARPS = {}          # (block, first thread of the warp, lanes) -> (barrier, table)
_LOCK = threading.Lock()
_TIMEOUT = 120.0     # seconds a lane waits for the others (a skipped shuffle fails)


def _me():
    t = threading.current_thread()
    return t, (t.blockIdx.x, t.blockIdx.y, t.blockIdx.z), t.thread_id


def _lanes(t, warp):
    bx, by, bz = t._manager._block_dim
    return min(32, bx * by * bz - warp)


def _exchange(value):
    """Every lane of the warp publishes ``value``; returns (barrier, table, own id)."""
    t, block, tid = _me()
    warp = tid - tid % 32
    key = (block, warp, _lanes(t, warp))
    with _LOCK:
        state = _WARPS.get(key)
        if state is None:
            state = _WARPS[key] = (threading.Barrier(key[2], timeout=_TIMEOUT), {})
    barrier, table = state
    table[tid] = value
    barrier.wait()
    return barrier, table, tid


def _read(barrier, table, tid, mask, src_lane, value):
    warp = tid - tid % 32
    src = warp + src_lane
    if not (int(mask) >> src_lane) & 1 or src not in table:
        out = math.nan if isinstance(value, float) else 0
    else:
        out = table[src]
    barrier.wait()    # every lane has read before the table is reused
    return out


def _shfl(mode):
    def shfl(self, mask, value, b):
        barrier, table, tid = _exchange(value)
        lane, b = tid % 32, int(b) & 31
        if mode == "idx":
            j, ok = b, True
        elif mode == "up":
            j = lane - b
            ok = j >= 0
        elif mode == "down":
            j = lane + b
            ok = j <= 31
        else:
            j = lane ^ b
            ok = j <= 31
        return _read(barrier, table, tid, mask, j if ok else lane, value)
    return shfl


def _ballot(self, mask, predicate):
    barrier, table, tid = _exchange(bool(predicate))
    warp = tid - tid % 32
    bits = 0
    for j in range(32):
        if (int(mask) >> j) & 1 and table.get(warp + j, False):
            bits |= 1 << j
    barrier.wait()
    return bits - (1 << 32) if bits >= 1 << 31 else bits   # int32, like numba-cuda


def _activemask(self):
    t = threading.current_thread()
    bx, by, bz = t._manager._block_dim
    n = bx * by * bz
    warp = t.thread_id - t.thread_id % 32
    return (1 << min(32, n - warp)) - 1


def _lanemask_lt(self):
    return (1 << (threading.current_thread().thread_id % 32)) - 1


def install():
    from numba.cuda.simulator.kernelapi import FakeCUDAModule
    FakeCUDAModule.shfl_sync = _shfl("idx")
    FakeCUDAModule.shfl_up_sync = _shfl("up")
    FakeCUDAModule.shfl_down_sync = _shfl("down")
    FakeCUDAModule.shfl_xor_sync = _shfl("xor")
    FakeCUDAModule.ballot_sync = _ballot
    FakeCUDAModule.activemask = _activemask
    FakeCUDAModule.lanemask_lt = _lanemask_lt
