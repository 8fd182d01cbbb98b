"""Pointwise layers and math: activations, a dense layer, layer norm, math functions
in float32 and float64, device helpers, grid-stride loops, early return."""
import math

import numpy as np
from numba import cuda, float32, float64

import kadj

from ..sizes import at_least, grid2
from . import Case, blocks, launch_1d, launch_2d, no_trips


@cuda.jit(device=True)
def _sigmoid(z):
    return 1.0 / (1.0 + math.exp(-z))


@cuda.jit(device=True)
def _cube(z):
    return z * z * z


@cuda.jit(device=True)
def _gelu_tanh(z):
    inner = 0.7978845608028654 * (z + 0.044715 * _cube(z))
    return 0.5 * z * (1.0 + math.tanh(inner))


@kadj.differentiate
@cuda.jit
def softplus_f32(x, y):
    """Numerically safe softplus in float32."""
    i = cuda.grid(1)
    if i < x.shape[0]:
        v = x[i]
        if v > float32(15.0):
            y[i] = v
        else:
            y[i] = math.log1p(math.exp(v))


@kadj.differentiate
@cuda.jit
def silu(x, y, beta):
    """y = x * sigmoid(beta x), sigmoid from a device helper."""
    i = cuda.grid(1)
    if i < x.shape[0]:
        y[i] = x[i] * _sigmoid(beta * x[i])


@kadj.differentiate
@cuda.jit
def gelu_nested_helpers(x, y):
    """tanh-approximated GELU; the helper calls another helper."""
    i = cuda.grid(1)
    if i < x.shape[0]:
        y[i] = _gelu_tanh(x[i])


@kadj.differentiate
@cuda.jit
def dense_tanh(w, x, b, y):
    """y[i] = tanh(sum_j W[i, j] x[j] + b[i]), one thread per output."""
    i = cuda.grid(1)
    if i < y.shape[0]:
        acc = b[i]
        for j in range(x.shape[0]):
            acc += w[i, j] * x[j]
        y[i] = math.tanh(acc)


@kadj.differentiate
@cuda.jit
def dense_sigmoid_batch(w, x, b, y):
    """Batched dense layer with sigmoid, 2-D launch (sample, unit)."""
    s, i = cuda.grid(2)
    if s < x.shape[0] and i < w.shape[0]:
        acc = b[i]
        for j in range(w.shape[1]):
            acc += w[i, j] * x[s, j]
        y[s, i] = _sigmoid(acc)


@kadj.differentiate
@cuda.jit
def layernorm_rows(x, gamma, beta, y, eps):
    """Layer norm over each row, learned scale and shift; one thread per row."""
    r = cuda.grid(1)
    if r < x.shape[0]:
        m = x.shape[1]
        mean = 0.0
        for j in range(m):
            mean += x[r, j]
        mean /= m
        var = 0.0
        for j in range(m):
            d = x[r, j] - mean
            var += d * d
        var /= m
        inv = 1.0 / math.sqrt(var + eps)
        for j in range(m):
            y[r, j] = (x[r, j] - mean) * inv * gamma[j] + beta[j]


@kadj.differentiate
@cuda.jit
def axpy_gridstride(a, x, y):
    """y = a x + y in place, grid-stride loop."""
    for i in range(cuda.grid(1), x.shape[0], cuda.gridsize(1)):
        y[i] = a * x[i] + y[i]


@kadj.differentiate
@cuda.jit
def leaky_relu_early_return(x, y, slope):
    """Early-return guard, then a branch per element."""
    i = cuda.threadIdx.x + cuda.blockIdx.x * cuda.blockDim.x
    if i >= x.shape[0]:
        return
    v = x[i]
    if v > 0.0:
        y[i] = v
    else:
        y[i] = slope * v


@kadj.differentiate
@cuda.jit
def math_zoo_f64(x, z, y):
    """sin, cos, exp, log, sqrt, tanh, pow, fabs in float64 (z > 0)."""
    i = cuda.grid(1)
    if i < x.shape[0]:
        a = x[i]
        b = z[i]
        y[i] = (math.sin(a) * math.cos(b) + math.exp(-a * a) + math.log(1.0 + b * b)
                + math.sqrt(b) + math.tanh(a) + math.pow(b, 1.5) + math.fabs(a))


@kadj.differentiate
@cuda.jit
def math_zoo_f32(x, z, y):
    """The same functions in float32."""
    i = cuda.grid(1)
    if i < x.shape[0]:
        a = x[i]
        b = z[i]
        y[i] = (math.sin(a) * math.cos(b) + math.exp(-a * a)
                + math.log(np.float32(1.0) + b) + math.sqrt(b) + math.tanh(a)
                + math.pow(b, np.float32(1.5)) + math.fabs(a))


@kadj.differentiate
@cuda.jit
def transpose_scale(a, out, s):
    """out[j, i] = s * a[i, j]^2, 2-D index from threadIdx/blockIdx .x/.y."""
    j = cuda.threadIdx.x + cuda.blockIdx.x * cuda.blockDim.x
    i = cuda.threadIdx.y + cuda.blockIdx.y * cuda.blockDim.y
    if i < a.shape[0] and j < a.shape[1]:
        out[j, i] = s * a[i, j] * a[i, j]


def _away_from_zero(rng, n, lo=0.2, hi=2.0):
    return rng.uniform(lo, hi, n) * rng.choice([-1.0, 1.0], n)


def _softplus_sized(rng, n, trips=None):
    no_trips(trips, "softplus_f32")
    n = at_least(n, 2)
    x = rng.uniform(-4.0, 4.0, n)
    x[:2] = [18.0, 22.0]                     # the large-x branch
    return launch_1d(n), [x.astype(np.float32), np.zeros(n, np.float32)]


def _softplus_args(rng):
    return _softplus_sized(rng, 16)[1]


def _silu_sized(rng, n, trips=None):
    no_trips(trips, "silu")
    n = at_least(n, 1)
    return launch_1d(n), [rng.standard_normal(n), np.zeros(n), 1.3]


def _silu_args(rng):
    return _silu_sized(rng, 16)[1]


def _gelu_sized(rng, n, trips=None):
    no_trips(trips, "gelu_nested_helpers")
    n = at_least(n, 1)
    return launch_1d(n), [rng.standard_normal(n), np.zeros(n)]


def _gelu_args(rng):
    return _gelu_sized(rng, 16)[1]


def _dense_sized(rng, n, trips=None):
    """n outputs; trips: inputs (6 by default)."""
    n = at_least(n, 1)
    m = 6 if trips is None else at_least(trips, 0)
    return launch_1d(n), [rng.standard_normal((n, m)) * 0.5, rng.standard_normal(m),
                          rng.standard_normal(n), np.zeros(n)]


def _dense_args(rng):
    return _dense_sized(rng, 10)[1]


def _dense_batch_sized(rng, n, trips=None):
    """About n (sample, unit) pairs, 4 inputs."""
    no_trips(trips, "dense_sigmoid_batch")
    samples, units = grid2(n, smallest=1)
    return launch_2d(samples, units), [rng.standard_normal((units, 4)) * 0.5,
                                       rng.standard_normal((samples, 4)),
                                       rng.standard_normal(units),
                                       np.zeros((samples, units))]


def _dense_batch_args(rng):
    return [rng.standard_normal((5, 4)) * 0.5, rng.standard_normal((6, 4)),
            rng.standard_normal(5), np.zeros((6, 5))]


def _layernorm_sized(rng, n, trips=None):
    """n rows; trips: columns (6 by default)."""
    n = at_least(n, 1)
    m = 6 if trips is None else at_least(trips, 1)
    return launch_1d(n, 16), [rng.standard_normal((n, m)), rng.uniform(0.5, 1.5, m),
                              rng.standard_normal(m), np.zeros((n, m)), 1e-3]


def _layernorm_args(rng):
    return _layernorm_sized(rng, 8)[1]


def _axpy_sized(rng, n, trips=None):
    no_trips(trips, "axpy_gridstride")
    n = at_least(n, 1)
    return (2, 16), [0.7, rng.standard_normal(n), rng.standard_normal(n)]


def _axpy_args(rng):
    return _axpy_sized(rng, 21)[1]


def _leaky_sized(rng, n, trips=None):
    no_trips(trips, "leaky_relu_early_return")
    n = at_least(n, 1)
    return launch_1d(n), [_away_from_zero(rng, n), np.zeros(n), 0.05]


def _leaky_args(rng):
    return _leaky_sized(rng, 14)[1]


def _zoo64_sized(rng, n, trips=None):
    no_trips(trips, "math_zoo_f64")
    n = at_least(n, 1)
    return launch_1d(n), [_away_from_zero(rng, n), rng.uniform(0.3, 2.0, n), np.zeros(n)]


def _zoo64_args(rng):
    return _zoo64_sized(rng, 14)[1]


def _zoo32_sized(rng, n, trips=None):
    no_trips(trips, "math_zoo_f32")
    n = at_least(n, 1)
    return launch_1d(n), [_away_from_zero(rng, n).astype(np.float32),
                          rng.uniform(0.3, 2.0, n).astype(np.float32),
                          np.zeros(n, np.float32)]


def _zoo32_args(rng):
    return _zoo32_sized(rng, 14)[1]


def _transpose_sized(rng, n, trips=None):
    no_trips(trips, "transpose_scale")
    rows, cols = grid2(n, smallest=1)
    return launch_2d(cols, rows), [rng.standard_normal((rows, cols)),
                                   np.zeros((cols, rows)), 0.8]


def _transpose_args(rng):
    return [rng.standard_normal((5, 7)), np.zeros((7, 5)), 0.8]


TPB = 4  # tile width of tiled_matmul (its blocks are TPB x TPB threads)


@kadj.differentiate
@cuda.jit
def tiled_matmul(A, B, C):
    """C = A B with shared-memory tiles, in the style of numba's documentation: each
    iteration loads a tile of A and of B, synchronises, multiplies, synchronises."""
    sA = cuda.shared.array(shape=(TPB, TPB), dtype=float64)
    sB = cuda.shared.array(shape=(TPB, TPB), dtype=float64)
    x, y = cuda.grid(2)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    tmp = 0.0
    for t in range(cuda.gridDim.x):
        sA[tx, ty] = 0.0
        sB[tx, ty] = 0.0
        if x < A.shape[0] and ty + t * TPB < A.shape[1]:
            sA[tx, ty] = A[x, ty + t * TPB]
        if y < B.shape[1] and tx + t * TPB < B.shape[0]:
            sB[tx, ty] = B[tx + t * TPB, y]
        cuda.syncthreads()
        for j in range(TPB):
            tmp += sA[tx, j] * sB[j, ty]
        cuda.syncthreads()
    if x < C.shape[0] and y < C.shape[1]:
        C[x, y] = tmp


def _matmul_sized(rng, n, trips=None):
    """C (m, m + 1) = A (m, m - 1) B (m - 1, m + 1), m near sqrt(n); the tile loop runs
    over the grid's x extent, which covers A's rows and columns."""
    no_trips(trips, "tiled_matmul")
    m = at_least(round(math.sqrt(max(n, 1))), 2)
    grid = (blocks(m, TPB), blocks(m + 1, TPB))
    return (grid, (TPB, TPB)), [rng.standard_normal((m, m - 1)),
                                rng.standard_normal((m - 1, m + 1)),
                                np.zeros((m, m + 1))]


def _matmul_args(rng):
    return [rng.standard_normal((8, 7)), rng.standard_normal((7, 8)), np.zeros((8, 8))]


CASES = [
    Case("softplus_f32", softplus_f32, (2, 8), _softplus_args, rtol=None,
         note="float32, branch on x, log1p/exp",
         sized=_softplus_sized),
    Case("silu", silu, (2, 8), _silu_args, note="device helper (sigmoid)",
         sized=_silu_sized),
    Case("gelu_nested_helpers", gelu_nested_helpers, (2, 8), _gelu_args,
         note="device helper calling another device helper",
         sized=_gelu_sized),
    Case("dense_tanh", dense_tanh, (2, 8), _dense_args,
         note="dense layer, W row per thread, x read by every thread",
         sized=_dense_sized, trip_loop='for j in range(x.shape[0])'),
    Case("dense_sigmoid_batch", dense_sigmoid_batch, ((2, 2), (4, 4)),
         _dense_batch_args, note="batched dense layer, cuda.grid(2)",
         sized=_dense_batch_sized),
    Case("layernorm_rows", layernorm_rows, (2, 4), _layernorm_args,
         note="three loops per thread: mean, variance, normalise",
         sized=_layernorm_sized, trip_loop='for j in range(m)'),
    Case("axpy_gridstride", axpy_gridstride, (2, 4), _axpy_args,
         note="grid-stride loop, y updated in place",
         sized=_axpy_sized),
    Case("leaky_relu_early_return", leaky_relu_early_return, (2, 8), _leaky_args,
         note="if i >= n: return, index from threadIdx/blockIdx/blockDim",
         sized=_leaky_sized),
    Case("math_zoo_f64", math_zoo_f64, (2, 8), _zoo64_args,
         note="sin cos exp log sqrt tanh pow fabs, float64",
         sized=_zoo64_sized),
    Case("math_zoo_f32", math_zoo_f32, (2, 8), _zoo32_args, rtol=None,
         note="sin cos exp log sqrt tanh pow fabs, float32",
         sized=_zoo32_sized),
    Case("transpose_scale", transpose_scale, ((1, 1), (8, 8)), _transpose_args,
         note="write to out[j, i], 2-D threadIdx/blockIdx",
         sized=_transpose_sized),
    Case("tiled_matmul", tiled_matmul, ((2, 2), (TPB, TPB)), _matmul_args,
         note="shared-memory tiles reloaded each iteration between barriers",
         sized=_matmul_sized),
]
