"""Warp-level reductions: a dot-product loss summed with ``shfl_down_sync`` within each
warp and one atomic per warp, and a per-warp log-sum-exp (softmax normaliser) with a
``shfl_xor_sync`` butterfly for the maximum and the sum.

Every lane of a warp takes part in every shuffle (the loads are guarded, not the
shuffles), as the hardware requires of a full mask.  The CUDA simulator has no warp
shuffles: the tests add them (tests/warp_sim_api.py) before running these kernels.
"""
import math

import numpy as np
from numba import cuda

import kadj

from ..sizes import at_least
from . import Case, blocks, no_trips

FULL = 0xFFFFFFFF
WARP = 32
BLOCK = 64       # two warps per block


@kadj.differentiate
@cuda.jit
def warp_dot_loss(x, y, w, out):
    """out[0] += sum_i w[i] * (x[i] * y[i])**2: each warp sums its lanes' terms with a
    shfl_down tree, then its lane 0 adds the warp's sum with one atomic."""
    i = cuda.grid(1)
    v = 0.0
    if i < x.shape[0]:
        p = x[i] * y[i]
        v = w[i] * p * p
    off = WARP // 2
    while off > 0:
        v += cuda.shfl_down_sync(FULL, v, off)
        off //= 2
    if cuda.laneid == 0:
        cuda.atomic.add(out, 0, v)


@kadj.differentiate
@cuda.jit
def warp_logsumexp(a, out):
    """out[r] = log(sum_j exp(a[r, j])) for each row r of 32 values, one warp per row:
    the row's maximum and the sum of exp(a - max) are each reduced with a shfl_xor
    butterfly, so every lane holds them; lane 0 writes the row's result."""
    i = cuda.grid(1)
    r = i // WARP
    lane = cuda.laneid
    rows = a.shape[0]
    v = -1e300
    if r < rows:
        v = a[r, lane]
    m = v
    for k in range(5):
        m = max(m, cuda.shfl_xor_sync(FULL, m, 16 >> k))
    e = 0.0
    if r < rows:
        e = math.exp(v - m)
    for k in range(5):
        e += cuda.shfl_xor_sync(FULL, e, 16 >> k)
    if lane == 0 and r < rows:
        out[r] = m + math.log(e)


def _launch(threads):
    """A launch of whole warps, ``BLOCK`` threads per block, covering ``threads``."""
    return blocks(threads, BLOCK), BLOCK


def _dot_sized(rng, n, trips=None):
    no_trips(trips, "warp_dot_loss")
    n = at_least(n, 1)
    return _launch(n), [rng.standard_normal(n), rng.standard_normal(n),
                        rng.random(n) + 0.5, np.zeros(1)]


def _dot_args(rng):
    return _dot_sized(rng, 50)[1]


def _lse_sized(rng, n, trips=None):
    """about ``n`` elements: rows of 32."""
    no_trips(trips, "warp_logsumexp")
    rows = at_least(-(-int(n) // WARP), 1)
    return _launch(rows * WARP), [rng.standard_normal((rows, WARP)), np.zeros(rows)]


def _lse_args(rng):
    return _lse_sized(rng, 64)[1]


# the shuffle instructions each adjoint's PTX holds (tests/test_cuda_gallery.py): the
# adjoint of shfl_down is a shfl_up (the reverse shuffle), beside the forward's replayed
# shfl_down; a xor butterfly's adjoint is a butterfly
PTX_SHUFFLES = {"warp_dot_loss": {"shfl.sync.down", "shfl.sync.up"},
                "warp_logsumexp": {"shfl.sync.bfly"}}

CASES = [
    Case("warp_dot_loss", warp_dot_loss, _launch(50), _dot_args,
         note="shfl_down_sync warp tree, one atomic.add per warp, guarded loads",
         sized=_dot_sized),
    Case("warp_logsumexp", warp_logsumexp, _launch(64), _lse_args,
         note="shfl_xor_sync butterflies for a row's max and sum of exp (softmax "
              "normaliser), one warp per row",
         sized=_lse_sized),
]
