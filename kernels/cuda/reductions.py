"""Reductions: shared-memory block sums, atomic dot products, grid-stride sums, row
norms and log-sum-exp, matrix-vector with the vector in shared memory."""
import math

import numpy as np
from numba import cuda, float32, float64

import kadj

from ..sizes import at_least
from . import Case, blocks, launch_1d, no_trips

BLOCK = 16       # threads per block of the shared-memory reduction
MAXCOLS = 8      # shared-memory vector length of matvec_shared_x


@kadj.differentiate
@cuda.jit
def block_sum_squares(x, out):
    """out[0] += sum(x**2): tree reduction in shared memory, one atomic per block."""
    sm = cuda.shared.array(BLOCK, float64)
    tid = cuda.threadIdx.x
    i = cuda.grid(1)
    if i < x.shape[0]:
        sm[tid] = x[i] * x[i]
    else:
        sm[tid] = 0.0
    cuda.syncthreads()
    s = BLOCK // 2
    while s > 0:
        if tid < s:
            sm[tid] += sm[tid + s]
        cuda.syncthreads()
        s //= 2
    if tid == 0:
        cuda.atomic.add(out, 0, sm[0])


@kadj.differentiate
@cuda.jit
def dot_atomic(x, y, out):
    """out[0] += x . y, one atomic per element."""
    i = cuda.grid(1)
    if i < x.shape[0]:
        cuda.atomic.add(out, 0, x[i] * y[i])


@kadj.differentiate
@cuda.jit
def weighted_sumsq_gridstride(x, w, out):
    """out[0] += sum(w * x**2): grid-stride loop, one atomic per thread."""
    acc = 0.0
    for i in range(cuda.grid(1), x.shape[0], cuda.gridsize(1)):
        acc += w[i] * x[i] * x[i]
    cuda.atomic.add(out, 0, acc)


@kadj.differentiate
@cuda.jit
def mean_atomic_f32(x, out):
    """out[0] += mean(x) in float32."""
    i = cuda.grid(1)
    n = x.shape[0]
    if i < n:
        cuda.atomic.add(out, 0, x[i] / float32(n))


@kadj.differentiate
@cuda.jit
def row_norms(a, out):
    """out[i] = ||a[i, :]||_2, one thread per row."""
    i = cuda.grid(1)
    if i < a.shape[0]:
        acc = 0.0
        for j in range(a.shape[1]):
            acc += a[i, j] * a[i, j]
        out[i] = math.sqrt(acc)


@kadj.differentiate
@cuda.jit
def logsumexp_rows(a, out):
    """out[i] = log(sum_j exp(a[i, j])), max-shifted, one thread per row."""
    i = cuda.grid(1)
    if i < a.shape[0]:
        m = a[i, 0]
        for j in range(1, a.shape[1]):
            if a[i, j] > m:
                m = a[i, j]
        s = 0.0
        for j in range(a.shape[1]):
            s += math.exp(a[i, j] - m)
        out[i] = m + math.log(s)


@kadj.differentiate
@cuda.jit
def matvec_shared_x(a, x, y):
    """y = A x with x staged in shared memory by the block."""
    sx = cuda.shared.array(MAXCOLS, float64)
    tid = cuda.threadIdx.x
    i = cuda.grid(1)
    m = x.shape[0]
    if tid < m:
        sx[tid] = x[tid]
    cuda.syncthreads()
    if i < a.shape[0]:
        acc = 0.0
        for j in range(m):
            acc += a[i, j] * sx[j]
        y[i] = acc


def _block_sum_sized(rng, n, trips=None):
    no_trips(trips, "block_sum_squares")
    n = at_least(n, 1)
    return launch_1d(n, BLOCK), [rng.standard_normal(n), rng.standard_normal(1)]


def _block_sum_args(rng):
    return _block_sum_sized(rng, 28)[1]


def _dot_sized(rng, n, trips=None):
    no_trips(trips, "dot_atomic")
    n = at_least(n, 1)
    return launch_1d(n), [rng.standard_normal(n), rng.standard_normal(n), np.zeros(1)]


def _dot_args(rng):
    return _dot_sized(rng, 20)[1]


GRIDSTRIDE = (2, 16)     # the sized launch of the grid-stride loops: 32 threads


def _gridstride_sized(rng, n, trips=None):
    """trips: iterations of the thread with the most (n = 32 * trips - 5 then)."""
    n = at_least(n, 1) if trips is None else at_least(32 * trips - 5, 1)
    return GRIDSTRIDE, [rng.standard_normal(n), rng.random(n), np.zeros(1)]


def _gridstride_args(rng):
    return _gridstride_sized(rng, 23)[1]


def _mean_f32_sized(rng, n, trips=None):
    no_trips(trips, "mean_atomic_f32")
    n = at_least(n, 1)
    return launch_1d(n), [rng.standard_normal(n).astype(np.float32),
                          np.zeros(1, np.float32)]


def _mean_f32_args(rng):
    return _mean_f32_sized(rng, 24)[1]


def _row_norm_sized(rng, n, trips=None):
    """n rows; trips: columns (6 by default)."""
    n = at_least(n, 1)
    cols = 6 if trips is None else at_least(trips, 1)
    return launch_1d(n), [rng.standard_normal((n, cols)), np.zeros(n)]


def _row_norm_args(rng):
    return _row_norm_sized(rng, 10)[1]


def _lse_sized(rng, n, trips=None):
    """n rows; trips: columns (5 by default)."""
    n = at_least(n, 1)
    cols = 5 if trips is None else at_least(trips, 1)
    return launch_1d(n), [rng.standard_normal((n, cols)), np.zeros(n)]


def _lse_args(rng):
    return _lse_sized(rng, 10)[1]


def _matvec_sized(rng, n, trips=None):
    no_trips(trips, "matvec_shared_x")
    n = at_least(n, 1)
    return launch_1d(n, MAXCOLS), [rng.standard_normal((n, MAXCOLS)),
                                   rng.standard_normal(MAXCOLS), np.zeros(n)]


def _matvec_args(rng):
    return _matvec_sized(rng, 12)[1]


@kadj.differentiate
@cuda.jit
def block_logsumexp(x, out):
    """log(sum(exp(x))) per block by a shared-memory tree whose steps are non-linear:
    the reverse needs each level's values (each thread checkpoints its own element)."""
    sm = cuda.shared.array(BLOCK, float64)
    tid = cuda.threadIdx.x
    i = cuda.grid(1)
    if i < x.shape[0]:
        sm[tid] = x[i]
    else:
        sm[tid] = -1e30
    cuda.syncthreads()
    s = cuda.blockDim.x // 2
    while s > 0:
        if tid < s:
            a = sm[tid]
            b = sm[tid + s]
            m = max(a, b)
            sm[tid] = m + math.log(math.exp(a - m) + math.exp(b - m))
        cuda.syncthreads()
        s //= 2
    if tid == 0:
        out[cuda.blockIdx.x] = sm[0]


def _block_lse_sized(rng, n, trips=None):
    no_trips(trips, "block_logsumexp")
    n = at_least(n, 1)
    return launch_1d(n, BLOCK), [rng.standard_normal(n), np.zeros(blocks(n, BLOCK))]


def _block_lse_args(rng):
    return _block_lse_sized(rng, 27)[1]


CASES = [
    Case("block_sum_squares", block_sum_squares, (2, BLOCK), _block_sum_args,
         note="shared array, syncthreads tree reduction (while), one atomic per block",
         sized=_block_sum_sized),
    Case("dot_atomic", dot_atomic, (3, 8), _dot_args,
         note="dot product with cuda.atomic.add",
         sized=_dot_sized),
    Case("weighted_sumsq_gridstride", weighted_sumsq_gridstride, (2, 8),
         _gridstride_args, note="grid-stride loop, per-thread partial sum, atomic",
         sized=_gridstride_sized,
         trip_loop='for i in range(cuda.grid(1), x.shape[0], cuda.gridsize(1))'),
    Case("mean_atomic_f32", mean_atomic_f32, (3, 8), _mean_f32_args, rtol=None,
         note="float32 atomics",
         sized=_mean_f32_sized),
    Case("row_norms", row_norms, (2, 8), _row_norm_args,
         note="per-thread loop-carried sum, sqrt",
         sized=_row_norm_sized, trip_loop='for j in range(a.shape[1])'),
    Case("logsumexp_rows", logsumexp_rows, (2, 8), _lse_args,
         note="running max with a branch, then sum of exp",
         sized=_lse_sized, trip_loop='for j in range(1, a.shape[1])'),
    Case("matvec_shared_x", matvec_shared_x, (2, MAXCOLS), _matvec_args,
         note="x staged in shared memory, syncthreads",
         sized=_matvec_sized),
    Case("block_logsumexp", block_logsumexp, (2, BLOCK), _block_lse_args,
         note="non-linear shared tree reduction (while): shared state checkpointed",
         sized=_block_lse_sized),
]
