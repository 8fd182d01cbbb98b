"""CUDA benchmark cases: ``@cuda.jit`` kernels differentiated by kadj, each beside an
adjoint written by hand the way a careful CUDA programmer would write it.

Every :class:`CudaCase` holds

- ``forward``: the plain ``@cuda.jit`` kernel, and ``kernel``: the same kernel through
  ``kadj.differentiate`` (launched as ``kernel[grid, block](*args)``; its adjoint as
  ``kernel.adjoint[grid, block](*args, *adjoints)``);
- ``hand``: the hand-written adjoint, launched exactly like kadj's,
  ``case.hand[grid, block](*args, *adjoints)``, with the same argument layout: the
  forward arguments, then one adjoint buffer per differentiable argument (every
  floating-point argument here) in argument order, a scalar's adjoint being a 1-element
  array.  It follows API.md's in/out rule: on entry an adjoint holds the cotangent of its
  argument's state *after* the forward launch, on return the cotangent of the state
  *before* it, so elements the forward overwrote have their cotangent consumed (zeroed)
  and elements it only read get contributions added;
- ``make_args(n, rng)`` and ``launch(args)`` -> ``(grid, block)``: arguments for a size
  parameter ``n`` (``case.size("check" | "small" | "large")``) and the launch
  configuration, shared by the forward and both adjoints.

How the hand-written adjoints are written (scatter-to-gather, as in the adjoint-stencil
literature, e.g. Hückelheim et al., "A parallel reverse mode for stencils", 2019):

- stencils (``heat1d``, ``heat2d``, ``lap3d``) *gather*: the thread of point ``p``
  computes ``adj_u[p]`` itself from the incoming cotangents of the outputs whose stencil
  reads ``u[p]``, with one plain read-modify-write and no atomics.  A single launch
  cannot both read its neighbours' ``adj_u_new`` and consume (zero) its own, because
  nothing orders threads of different blocks; so the hand adjoint is two launches, the
  gather, then a launch that zeroes the consumed cotangents.  The scalar coefficient's
  adjoint is summed per block (warp shuffles, then one warp over the per-warp sums in
  shared memory) and added with one atomic per block;
- ``spmv`` (one thread per row) keeps ``adj_data`` plain, since each nonzero belongs to
  one row, and scatters into ``adj_x`` with atomics: with only the CSR arrays in the
  argument list, the transpose that a gather would need is not available;
- ``deposit`` (particles scattered onto a grid with ``cuda.atomic.add``) is the
  scatter-to-gather example in the other direction: its adjoint reads ``adj_rho`` at
  the particle's two cells and writes the particle's own adjoints, no atomics.

The simulator (``NUMBA_ENABLE_CUDASIM=1``) has no warp shuffles; there the block sum is
a plain sum in shared memory by thread 0 (same contract: every thread of the block
calls it, one atomic per block).  ``tests/test_ptx_report.py`` checks every hand-written
adjoint against finite differences of the forward in the simulator, and
``scripts/bench_cuda.py`` checks kadj's adjoints against them on a GPU.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Callable

import numba
import numpy as np
from numba import cuda, float64

import kadj

SIMULATOR = bool(getattr(numba.config, "ENABLE_CUDASIM", False))

# --------------------------------------------------------------------------------------
# case records
# --------------------------------------------------------------------------------------


class _HandLaunch:
    def __init__(self, kernels, config):
        self.kernels, self.config = kernels, config

    def __call__(self, *args):
        for k in self.kernels:
            k[self.config](*args)


@dataclass(frozen=True)
class HandAdjoint:
    """A hand-written adjoint: ``kernels`` (``@cuda.jit``), launched one after another
    on the forward's grid (and stream, if the configuration names one), each taking
    the forward arguments followed by the adjoint buffers."""

    kernels: tuple

    def __getitem__(self, config):
        return _HandLaunch(self.kernels, config)

    @property
    def py_funcs(self):
        return tuple(k.py_func for k in self.kernels)


@dataclass(frozen=True)
class CudaCase:
    """One benchmark case (see the module docstring).

    adjoint_args:  indices of the arguments that take an adjoint slot, in order (the
                   layout kadj uses: every floating-point argument).
    written:       indices of the arrays the forward writes.
    check_n, small_n, large_n:  size parameters for simulator checks, quick GPU runs,
                   and GPU runs of ~0.1-1 ms per forward launch on a large GPU.
    naive:         the hand-written adjoint with its scalar adjoint added by one atomic
                   per thread instead of one per block (what the block reduction buys),
                   when the case has a scalar adjoint.
    """

    name: str
    description: str
    forward: object
    kernel: object
    hand: HandAdjoint
    make_args: Callable[[int, np.random.Generator], tuple]
    launch: Callable[[tuple], tuple]
    adjoint_args: tuple
    written: tuple
    check_n: int
    small_n: int
    large_n: int
    naive: HandAdjoint | None = None


    def size(self, which):
        """The size parameter for ``"check"``, ``"small"`` or ``"large"``."""
        return {"check": self.check_n, "small": self.small_n, "large": self.large_n}[which]

    def adjoint_names(self):
        names = self.forward.py_func.__code__.co_varnames
        return tuple("adj_" + names[i] for i in self.adjoint_args)


def make_adjoints(case, args, rng):
    """Random incoming cotangents (NumPy), one per adjoint slot of ``case``: arrays of
    the argument's shape and dtype, 1-element arrays of the scalar's dtype."""
    out = []
    for index in case.adjoint_args:
        a = args[index]
        if isinstance(a, np.ndarray):
            out.append(rng.standard_normal(a.shape).astype(a.dtype))
        else:
            out.append(np.array([rng.standard_normal()], dtype=np.asarray(a).dtype))
    return tuple(out)


def adjoint_signature(case, args):
    """numba signature (tuple of types) of a hand-written adjoint kernel for ``args``:
    the forward argument types, then one array type per adjoint slot."""
    fwd = tuple(numba.typeof(a) for a in args)
    adj = []
    for index in case.adjoint_args:
        t = fwd[index]
        adj.append(t if isinstance(t, numba.types.Array) else numba.types.Array(t, 1, "C"))
    return fwd + tuple(adj)


def _blocks(n, b):
    return (n + b - 1) // b


# --------------------------------------------------------------------------------------
# block sum of one value per thread, added into out[0] with one atomic per block
# (every thread of the block must call it; blocks of whole warps, at most 1024 threads)
# --------------------------------------------------------------------------------------

if SIMULATOR:

    @cuda.jit(device=True)
    def block_sum_add(out, v):
        buf = cuda.shared.array(1024, float64)
        t = cuda.threadIdx.x + cuda.blockDim.x * (
            cuda.threadIdx.y + cuda.blockDim.y * cuda.threadIdx.z)
        nt = cuda.blockDim.x * cuda.blockDim.y * cuda.blockDim.z
        buf[t] = v
        cuda.syncthreads()
        if t == 0:
            s = 0.0
            for k in range(nt):
                s += buf[k]
            cuda.atomic.add(out, 0, s)

else:

    @cuda.jit(device=True, inline="always")
    def _warp_sum(v):
        off = 16
        while off > 0:
            v += cuda.shfl_down_sync(0xFFFFFFFF, v, off)
            off >>= 1
        return v

    @cuda.jit(device=True, inline="always")
    def block_sum_add(out, v):
        warps = cuda.shared.array(32, float64)
        t = cuda.threadIdx.x + cuda.blockDim.x * (
            cuda.threadIdx.y + cuda.blockDim.y * cuda.threadIdx.z)
        nt = cuda.blockDim.x * cuda.blockDim.y * cuda.blockDim.z
        lane = t & 31
        w = t >> 5
        v = _warp_sum(v)
        if lane == 0:
            warps[w] = v
        cuda.syncthreads()
        if w == 0:
            v = warps[lane] if lane < ((nt + 31) >> 5) else 0.0
            v = _warp_sum(v)
            if lane == 0:
                cuda.atomic.add(out, 0, v)


@cuda.jit
def copy(a, b):
    """b = a, one thread per element: the bandwidth ceiling of ``scripts/bench_cuda.py``."""
    i = cuda.grid(1)
    if i < a.shape[0]:
        b[i] = a[i]


# --------------------------------------------------------------------------------------
# 1-D heat step (3-point stencil)
# --------------------------------------------------------------------------------------


def heat1d(u, u_new, alpha):
    i = cuda.grid(1)
    if 0 < i < u.shape[0] - 1:
        u_new[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1])


def heat1d_gather(u, u_new, alpha, adj_u, adj_u_new, adj_alpha):
    i = cuda.grid(1)
    n = u.shape[0]
    s = 0.0
    if i < n:
        acc = 0.0
        if 0 < i < n - 1:  # the output at i reads u[i-1], u[i], u[i+1]
            g = adj_u_new[i]
            s = g * (u[i - 1] - 2.0 * u[i] + u[i + 1])
            acc = (1.0 - 2.0 * alpha) * g
        if 1 < i:  # output i-1 (interior when 0 < i-1 < n-1) reads u[i]
            acc += alpha * adj_u_new[i - 1]
        if i < n - 2:  # output i+1
            acc += alpha * adj_u_new[i + 1]
        adj_u[i] += acc
    block_sum_add(adj_alpha, s)


def heat1d_gather_naive(u, u_new, alpha, adj_u, adj_u_new, adj_alpha):
    """heat1d_gather with one atomic per thread into adj_alpha (no block reduction)."""
    i = cuda.grid(1)
    n = u.shape[0]
    if i < n:
        acc = 0.0
        if 0 < i < n - 1:
            g = adj_u_new[i]
            cuda.atomic.add(adj_alpha, 0, g * (u[i - 1] - 2.0 * u[i] + u[i + 1]))
            acc = (1.0 - 2.0 * alpha) * g
        if 1 < i:
            acc += alpha * adj_u_new[i - 1]
        if i < n - 2:
            acc += alpha * adj_u_new[i + 1]
        adj_u[i] += acc


def heat1d_consume(u, u_new, alpha, adj_u, adj_u_new, adj_alpha):
    i = cuda.grid(1)
    if 0 < i < u.shape[0] - 1:
        adj_u_new[i] = 0.0


def heat1d_args(n, rng):
    return (rng.standard_normal(n), rng.standard_normal(n), 0.2)


def heat1d_launch(args):
    return (_blocks(args[0].shape[0], 256),), (256,)


# --------------------------------------------------------------------------------------
# 2-D heat step (5-point stencil); x threads run along the contiguous axis
# --------------------------------------------------------------------------------------


def heat2d(u, u_new, alpha):
    j, i = cuda.grid(2)
    if 0 < i < u.shape[0] - 1 and 0 < j < u.shape[1] - 1:
        u_new[i, j] = u[i, j] + alpha * (
            u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1] - 4.0 * u[i, j])


def heat2d_gather(u, u_new, alpha, adj_u, adj_u_new, adj_alpha):
    j, i = cuda.grid(2)
    n, m = u.shape
    s = 0.0
    if i < n and j < m:
        acc = 0.0
        ri = 0 < i < n - 1
        rj = 0 < j < m - 1
        if ri and rj:
            g = adj_u_new[i, j]
            s = g * (u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1] - 4.0 * u[i, j])
            acc = (1.0 - 4.0 * alpha) * g
        nb = 0.0  # cotangents of the interior outputs whose stencil reads u[i, j]
        if rj:
            if 1 < i:
                nb += adj_u_new[i - 1, j]
            if i < n - 2:
                nb += adj_u_new[i + 1, j]
        if ri:
            if 1 < j:
                nb += adj_u_new[i, j - 1]
            if j < m - 2:
                nb += adj_u_new[i, j + 1]
        adj_u[i, j] += acc + alpha * nb
    block_sum_add(adj_alpha, s)


def heat2d_gather_naive(u, u_new, alpha, adj_u, adj_u_new, adj_alpha):
    """heat2d_gather with one atomic per thread into adj_alpha (no block reduction)."""
    j, i = cuda.grid(2)
    n, m = u.shape
    if i < n and j < m:
        acc = 0.0
        ri = 0 < i < n - 1
        rj = 0 < j < m - 1
        if ri and rj:
            g = adj_u_new[i, j]
            cuda.atomic.add(adj_alpha, 0, g * (u[i - 1, j] + u[i + 1, j] + u[i, j - 1]
                                               + u[i, j + 1] - 4.0 * u[i, j]))
            acc = (1.0 - 4.0 * alpha) * g
        nb = 0.0
        if rj:
            if 1 < i:
                nb += adj_u_new[i - 1, j]
            if i < n - 2:
                nb += adj_u_new[i + 1, j]
        if ri:
            if 1 < j:
                nb += adj_u_new[i, j - 1]
            if j < m - 2:
                nb += adj_u_new[i, j + 1]
        adj_u[i, j] += acc + alpha * nb


def heat2d_consume(u, u_new, alpha, adj_u, adj_u_new, adj_alpha):
    j, i = cuda.grid(2)
    if 0 < i < u.shape[0] - 1 and 0 < j < u.shape[1] - 1:
        adj_u_new[i, j] = 0.0


def heat2d_args(n, rng):
    shape = (n, n + 3)  # not square: catches swapped axes
    return (rng.standard_normal(shape), rng.standard_normal(shape), 0.2)


def heat2d_launch(args):
    n, m = args[0].shape
    return (_blocks(m, 32), _blocks(n, 8)), (32, 8)


# --------------------------------------------------------------------------------------
# 3-D 7-point Laplacian, v = c * lap(u) in the interior
# --------------------------------------------------------------------------------------


def lap3d(u, v, c):
    k, j, i = cuda.grid(3)
    if 0 < i < u.shape[0] - 1 and 0 < j < u.shape[1] - 1 and 0 < k < u.shape[2] - 1:
        v[i, j, k] = c * (u[i - 1, j, k] + u[i + 1, j, k] + u[i, j - 1, k]
                          + u[i, j + 1, k] + u[i, j, k - 1] + u[i, j, k + 1]
                          - 6.0 * u[i, j, k])


def lap3d_gather(u, v, c, adj_u, adj_v, adj_c):
    k, j, i = cuda.grid(3)
    n0, n1, n2 = u.shape
    s = 0.0
    if i < n0 and j < n1 and k < n2:
        ri = 0 < i < n0 - 1
        rj = 0 < j < n1 - 1
        rk = 0 < k < n2 - 1
        acc = 0.0
        if ri and rj and rk:
            g = adj_v[i, j, k]
            s = g * (u[i - 1, j, k] + u[i + 1, j, k] + u[i, j - 1, k] + u[i, j + 1, k]
                     + u[i, j, k - 1] + u[i, j, k + 1] - 6.0 * u[i, j, k])
            acc = -6.0 * g
        if rj and rk:
            if 1 < i:
                acc += adj_v[i - 1, j, k]
            if i < n0 - 2:
                acc += adj_v[i + 1, j, k]
        if ri and rk:
            if 1 < j:
                acc += adj_v[i, j - 1, k]
            if j < n1 - 2:
                acc += adj_v[i, j + 1, k]
        if ri and rj:
            if 1 < k:
                acc += adj_v[i, j, k - 1]
            if k < n2 - 2:
                acc += adj_v[i, j, k + 1]
        adj_u[i, j, k] += c * acc
    block_sum_add(adj_c, s)


def lap3d_consume(u, v, c, adj_u, adj_v, adj_c):
    k, j, i = cuda.grid(3)
    if 0 < i < u.shape[0] - 1 and 0 < j < u.shape[1] - 1 and 0 < k < u.shape[2] - 1:
        adj_v[i, j, k] = 0.0


def lap3d_args(n, rng):
    shape = (n, n + 1, n + 2)
    return (rng.standard_normal(shape), rng.standard_normal(shape), 0.7)


def lap3d_launch(args):
    n0, n1, n2 = args[0].shape
    return (_blocks(n2, 32), _blocks(n1, 4), _blocks(n0, 2)), (32, 4, 2)


# --------------------------------------------------------------------------------------
# CSR sparse matrix-vector product, one thread per row
# --------------------------------------------------------------------------------------

NNZ_PER_ROW = 16


def spmv(indptr, indices, data, x, y):
    row = cuda.grid(1)
    if row < y.shape[0]:
        s = 0.0
        for k in range(indptr[row], indptr[row + 1]):
            s += data[k] * x[indices[k]]
        y[row] = s


def spmv_hand(indptr, indices, data, x, y, adj_data, adj_x, adj_y):
    row = cuda.grid(1)
    if row < y.shape[0]:
        g = adj_y[row]
        adj_y[row] = 0.0
        for k in range(indptr[row], indptr[row + 1]):
            col = indices[k]
            adj_data[k] += g * x[col]  # each nonzero belongs to this row only
            cuda.atomic.add(adj_x, col, g * data[k])


def spmv_args(n, rng):
    """``n`` rows and columns, 1..2*NNZ_PER_ROW-1 nonzeros per row at random columns."""
    counts = rng.integers(1, 2 * NNZ_PER_ROW, size=n)
    indptr = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=indptr[1:])
    nnz = int(indptr[-1])
    indices = rng.integers(0, n, size=nnz).astype(np.int32)
    data = rng.standard_normal(nnz)
    return (indptr, indices, data, rng.standard_normal(n), rng.standard_normal(n))


def spmv_launch(args):
    return (_blocks(args[4].shape[0], 128),), (128,)


# --------------------------------------------------------------------------------------
# particle deposit: cloud-in-cell charge deposition with forward atomics
# --------------------------------------------------------------------------------------


def deposit(x, q, rho):
    p = cuda.grid(1)
    if p < x.shape[0]:
        xp = x[p]
        c = int(math.floor(xp))
        f = xp - c
        cuda.atomic.add(rho, c, q[p] * (1.0 - f))
        cuda.atomic.add(rho, c + 1, q[p] * f)


def deposit_hand(x, q, rho, adj_x, adj_q, adj_rho):
    # rho only receives additions: adj_rho passes through unchanged
    p = cuda.grid(1)
    if p < x.shape[0]:
        xp = x[p]
        c = int(math.floor(xp))
        f = xp - c
        g0 = adj_rho[c]
        g1 = adj_rho[c + 1]
        adj_q[p] += (1.0 - f) * g0 + f * g1
        adj_x[p] += q[p] * (g1 - g0)


def deposit_args(n, rng):
    """``n`` particles on ``max(n // 8, 4)`` cells (positions away from cell edges, so
    that finite differences do not straddle a kink)."""
    cells = max(n // 8, 4)
    c = rng.integers(0, cells - 1, size=n)
    x = c + rng.uniform(0.05, 0.95, size=n)
    return (x, rng.standard_normal(n), rng.standard_normal(cells))


def deposit_launch(args):
    return (_blocks(args[0].shape[0], 256),), (256,)


# --------------------------------------------------------------------------------------


def _case(name, description, fwd, hand, make_args, launch, adjoint_args, written,
          check_n, small_n, large_n, naive=None):
    forward = cuda.jit(fwd)
    return CudaCase(name, description, forward, kadj.differentiate(forward),
                    HandAdjoint(tuple(cuda.jit(h) for h in hand)), make_args, launch,
                    adjoint_args, written, check_n, small_n, large_n,
                    HandAdjoint(tuple(cuda.jit(h) for h in naive)) if naive else None)


CASES = (
    _case("heat2d", "2-D heat step, 5-point stencil (n x (n+3), float64)",
          heat2d, (heat2d_gather, heat2d_consume), heat2d_args, heat2d_launch,
          (0, 1, 2), (1,), 9, 1024, 8192,
          naive=(heat2d_gather_naive, heat2d_consume)),
    _case("heat1d", "1-D heat step, 3-point stencil (n, float64)",
          heat1d, (heat1d_gather, heat1d_consume), heat1d_args, heat1d_launch,
          (0, 1, 2), (1,), 300, 1 << 20, 1 << 26,
          naive=(heat1d_gather_naive, heat1d_consume)),
    _case("lap3d", "3-D 7-point Laplacian (n x (n+1) x (n+2), float64)",
          lap3d, (lap3d_gather, lap3d_consume), lap3d_args, lap3d_launch,
          (0, 1, 2), (1,), 6, 96, 384),
    _case("spmv", f"CSR SpMV, one thread per row (n rows, ~{NNZ_PER_ROW} nonzeros/row)",
          spmv, (spmv_hand,), spmv_args, spmv_launch,
          (2, 3, 4), (4,), 150, 1 << 16, 1 << 22),
    _case("deposit", "cloud-in-cell deposit with forward atomics (n particles, n/8 cells)",
          deposit, (deposit_hand,), deposit_args, deposit_launch,
          (0, 1, 2), (2,), 300, 1 << 20, 1 << 25),
)

CASES_BY_NAME = {c.name: c for c in CASES}


# --------------------------------------------------------------------------------------
# dot-product test of an adjoint against central differences of the forward
# --------------------------------------------------------------------------------------


def _launch_forward(case, config, args, device):
    if not device:
        case.forward[config](*args)
        return args
    d_args = [cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in args]
    case.forward[config](*d_args)
    cuda.synchronize()
    return [a.copy_to_host() if hasattr(a, "copy_to_host") else a for a in d_args]


def dot_test(case, adjoint, n, seed=0, eps=1e-3, device=False):
    """Check ``adjoint`` (``case.hand`` or ``case.kernel.adjoint``) on ``case`` at size
    ``n``: for each adjoint slot, with a random direction ``d`` for that argument and
    random cotangents ``ct`` of the written arrays, compare ``<adjoint result, d>`` with
    the central difference of ``L = sum <ct, written outputs>`` along ``d``.  Read-only
    arguments' adjoint buffers start from random values (the adjoint must add to them).
    The forward launches run on the same grid; ``device=True`` launches everything on
    device arrays.  Every case here is linear in each argument separately, so the
    difference is exact up to rounding.  Returns ``{adjoint name: relative error}``."""
    rng = np.random.default_rng(seed)
    args = case.make_args(n, rng)
    config = case.launch(args)
    cts = {w: rng.standard_normal(args[w].shape) for w in case.written}

    def loss(xargs):
        out = _launch_forward(case, config, [a.copy() if isinstance(a, np.ndarray) else a
                                             for a in xargs], device)
        return sum(float(np.sum(cts[w] * out[w])) for w in case.written)

    init = []
    for index in case.adjoint_args:
        a = args[index]
        if index in cts:
            init.append(cts[index].astype(a.dtype))
        elif isinstance(a, np.ndarray):
            init.append(rng.standard_normal(a.shape).astype(a.dtype))
        else:
            init.append(np.array([rng.standard_normal()], dtype=np.asarray(a).dtype))
    before = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    if device:
        d_args = [cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in args]
        d_bufs = [cuda.to_device(b) for b in init]
        adjoint[config](*d_args, *d_bufs)
        cuda.synchronize()
        bufs = [b.copy_to_host() for b in d_bufs]
        after = [a.copy_to_host() if hasattr(a, "copy_to_host") else a for a in d_args]
    else:
        bufs = [b.copy() for b in init]
        adjoint[config](*args, *bufs)
        after = args
    for a, b in zip(after, before):
        if isinstance(a, np.ndarray) and not np.array_equal(a, b):
            raise AssertionError(f"{case.name}: the adjoint modified a forward argument")

    errors = {}
    for slot, index in enumerate(case.adjoint_args):
        a = args[index]
        grad = bufs[slot] if index in cts else bufs[slot] - init[slot]
        if isinstance(a, np.ndarray):
            d = rng.standard_normal(a.shape)
            plus, minus = list(args), list(args)
            plus[index] = a + eps * d
            minus[index] = a - eps * d
        else:
            d = np.array([rng.standard_normal()])
            plus, minus = list(args), list(args)
            plus[index] = a + eps * float(d[0])
            minus[index] = a - eps * float(d[0])
        fd = (loss(plus) - loss(minus)) / (2.0 * eps)
        got = float(np.sum(grad * d))
        scale = max(float(np.sum(np.abs(grad * d))), abs(fd), 1e-30)
        errors[case.adjoint_names()[slot]] = abs(got - fd) / scale
    return errors


def main(argv):
    """``python -m perf.cases_cuda [hand|naive|kadj] [case ...]``: dot-product tests at
    the ``check`` sizes (in the simulator, or on a GPU); one line per case,
    ``CASE <name> OK|FAIL <detail>`` (``naive``: the cases that have a naive-atomics
    hand adjoint)."""
    which = "hand"
    if argv and argv[0] in ("hand", "naive", "kadj"):
        which, argv = argv[0], argv[1:]
    failed = False
    for case in (CASES_BY_NAME[n] for n in argv) if argv else CASES:
        if which == "naive" and case.naive is None:
            continue
        adjoint = {"hand": case.hand, "naive": case.naive,
                   "kadj": case.kernel.adjoint}[which]
        try:
            errors = dot_test(case, adjoint, case.check_n)
            worst = max(errors.values())
            status = "OK" if worst < 1e-8 else "FAIL"
            detail = " ".join(f"{k}={v:.1e}" for k, v in errors.items())
        except Exception as exc:
            status, detail = "FAIL", f"{type(exc).__name__}: {exc}".replace("\n", " | ")
        failed |= status != "OK"
        print(f"CASE {case.name} {status} {detail}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
