"""Sparse and indirect access: CSR products, gathers and scatters through index arrays."""
from __future__ import annotations

import numpy as np
from numba import njit

from ._example import Example


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


@njit
def csr_spmv(indptr, indices, data, x, y):
    """y = A @ x for A in CSR form."""
    for row in range(indptr.shape[0] - 1):
        acc = 0.0
        for k in range(indptr[row], indptr[row + 1]):
            acc += data[k] * x[indices[k]]
        y[row] = acc


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


def csr_spmv_transpose_args(rng):
    indptr, indices, data = _random_csr(rng, 9, 7, 3)
    return indptr, indices, data, rng.standard_normal(9), rng.standard_normal(7)


@njit
def scatter_add(idx, w, x, y):
    """y[idx[k]] += w[k] * x[k], indices repeating."""
    for k in range(idx.shape[0]):
        y[idx[k]] += w[k] * x[k]


def scatter_add_args(rng):
    idx = rng.integers(0, 6, 14).astype(np.int64)
    return idx, rng.standard_normal(14), rng.standard_normal(14), rng.standard_normal(6)


@njit
def gather_scale(idx, x, w, y):
    """y[k] = w[k] * x[idx[k]], indices repeating."""
    for k in range(idx.shape[0]):
        y[k] = w[k] * x[idx[k]]


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


def graph_dirichlet_energy_args(rng):
    src = rng.integers(0, 8, 16).astype(np.int64)
    dst = ((src + rng.integers(1, 8, 16)) % 8).astype(np.int64)
    return src, dst, rng.uniform(0.5, 2.0, 16), rng.standard_normal(8)


EXAMPLES = [
    Example("csr_spmv", csr_spmv, csr_spmv_args, tags=("sparse", "gather")),
    Example("csr_spmv_transpose", csr_spmv_transpose, csr_spmv_transpose_args,
            tags=("sparse", "scatter")),
    Example("scatter_add", scatter_add, scatter_add_args, tags=("sparse", "scatter")),
    Example("gather_scale", gather_scale, gather_scale_args,
            tags=("sparse", "gather")),
    Example("graph_dirichlet_energy", graph_dirichlet_energy,
            graph_dirichlet_energy_args, tags=("sparse", "returns")),
]
