"""Sparse and indirect access: CSR products, gathers and scatters through index arrays."""
from __future__ import annotations

import numpy as np
from numba import njit

from ._example import Example
from ..sizes import at_least


def _random_csr(rng, nrows, ncols, per_row):
    indptr = np.zeros(nrows + 1, dtype=np.int64)
    cols = []
    for r in range(nrows):
        k = int(rng.integers(1, per_row + 1))
        cols.append(np.sort(rng.choice(ncols, size=k, replace=False)))
        indptr[r + 1] = indptr[r] + k
    indices = np.concatenate(cols).astype(np.int64)
    data = rng.standard_normal(indices.shape[0])
    return indptr, indices, data


def _random_csr_fast(rng, nrows, ncols, per_row):
    """Like _random_csr, drawn without a Python loop over rows: each row holds 1 to
    per_row distinct columns, consecutive modulo ncols, sorted."""
    per_row = min(per_row, ncols)
    counts = rng.integers(1, per_row + 1, nrows)
    start = rng.integers(0, ncols, nrows)
    cols = (start[:, None] + np.arange(per_row)[None, :]) % ncols
    keep = np.arange(per_row)[None, :] < counts[:, None]
    cols = np.sort(np.where(keep, cols, ncols), axis=1)
    indices = cols[cols < ncols].astype(np.int64)
    indptr = np.zeros(nrows + 1, dtype=np.int64)
    indptr[1:] = np.cumsum(counts)
    return indptr, indices, rng.standard_normal(indices.shape[0])


@njit
def csr_spmv(indptr, indices, data, x, y):
    """y = A @ x for A in CSR form."""
    for row in range(indptr.shape[0] - 1):
        acc = 0.0
        for k in range(indptr[row], indptr[row + 1]):
            acc += data[k] * x[indices[k]]
        y[row] = acc


def csr_spmv_sized(rng, n):
    """n rows, about 0.8 n columns."""
    n = at_least(n, 1)
    ncols = at_least(4 * n // 5, 3)
    indptr, indices, data = _random_csr_fast(rng, n, ncols, 3)
    return indptr, indices, data, rng.standard_normal(ncols), np.zeros(n)


def csr_spmv_args(rng):
    indptr, indices, data = _random_csr(rng, 10, 8, 3)
    return indptr, indices, data, rng.standard_normal(8), np.zeros(10)


@njit
def csr_spmv_transpose(indptr, indices, data, x, y):
    """y += A.T @ x for A in CSR form (a scatter into y)."""
    for row in range(indptr.shape[0] - 1):
        xr = x[row]
        for k in range(indptr[row], indptr[row + 1]):
            y[indices[k]] += data[k] * xr


def csr_spmv_transpose_sized(rng, n):
    """n rows, about 0.8 n columns."""
    n = at_least(n, 1)
    ncols = at_least(4 * n // 5, 3)
    indptr, indices, data = _random_csr_fast(rng, n, ncols, 3)
    return indptr, indices, data, rng.standard_normal(n), rng.standard_normal(ncols)


def csr_spmv_transpose_args(rng):
    indptr, indices, data = _random_csr(rng, 9, 7, 3)
    return indptr, indices, data, rng.standard_normal(9), rng.standard_normal(7)


@njit
def scatter_add(idx, w, x, y):
    """y[idx[k]] += w[k] * x[k], indices repeating."""
    for k in range(idx.shape[0]):
        y[idx[k]] += w[k] * x[k]


def scatter_add_sized(rng, n):
    """n contributions into about n / 3 bins."""
    n = at_least(n, 1)
    nbins = at_least(n // 3, 2)
    idx = rng.integers(0, nbins, n).astype(np.int64)
    return idx, rng.standard_normal(n), rng.standard_normal(n), rng.standard_normal(nbins)


def scatter_add_args(rng):
    idx = rng.integers(0, 6, 14).astype(np.int64)
    return idx, rng.standard_normal(14), rng.standard_normal(14), rng.standard_normal(6)


@njit
def gather_scale(idx, x, w, y):
    """y[k] = w[k] * x[idx[k]], indices repeating."""
    for k in range(idx.shape[0]):
        y[k] = w[k] * x[idx[k]]


def gather_scale_sized(rng, n):
    """n outputs gathered from about n / 2 sources."""
    n = at_least(n, 1)
    nsrc = at_least(n // 2, 2)
    idx = rng.integers(0, nsrc, n).astype(np.int64)
    return idx, rng.standard_normal(nsrc), rng.standard_normal(n), np.zeros(n)


def gather_scale_args(rng):
    idx = rng.integers(0, 7, 15).astype(np.int64)
    return idx, rng.standard_normal(7), rng.standard_normal(15), np.zeros(15)


@njit
def graph_dirichlet_energy(src, dst, weight, x):
    """sum_e w_e (x[src_e] - x[dst_e])^2 over an edge list."""
    energy = 0.0
    for e in range(src.shape[0]):
        d = x[src[e]] - x[dst[e]]
        energy += weight[e] * d * d
    return energy


def graph_dirichlet_energy_sized(rng, n):
    """n edges between about n / 2 nodes, no self-loops."""
    n = at_least(n, 1)
    nodes = at_least(n // 2, 2)
    src = rng.integers(0, nodes, n).astype(np.int64)
    dst = ((src + rng.integers(1, nodes, n)) % nodes).astype(np.int64)
    return src, dst, rng.uniform(0.5, 2.0, n), rng.standard_normal(nodes)


def graph_dirichlet_energy_args(rng):
    src = rng.integers(0, 8, 16).astype(np.int64)
    dst = ((src + rng.integers(1, 8, 16)) % 8).astype(np.int64)
    return src, dst, rng.uniform(0.5, 2.0, 16), rng.standard_normal(8)


EXAMPLES = [
    Example("csr_spmv", csr_spmv, csr_spmv_args, tags=("sparse", "gather"),
            sized=csr_spmv_sized),
    Example("csr_spmv_transpose", csr_spmv_transpose, csr_spmv_transpose_args,
            tags=("sparse", "scatter"),
            sized=csr_spmv_transpose_sized),
    Example("scatter_add", scatter_add, scatter_add_args, tags=("sparse", "scatter"),
            sized=scatter_add_sized),
    Example("gather_scale", gather_scale, gather_scale_args,
            tags=("sparse", "gather"),
            sized=gather_scale_sized),
    Example("graph_dirichlet_energy", graph_dirichlet_energy,
            graph_dirichlet_energy_args, tags=("sparse", "returns"),
            sized=graph_dirichlet_energy_sized),
]
