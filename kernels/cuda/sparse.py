"""Sparse and indirect access: CSR products, gathers and scatters through index
arrays."""
import numpy as np
from numba import cuda

import kadj

from ..sizes import at_least
from . import Case, launch_1d, no_trips


@kadj.differentiate
@cuda.jit
def spmv_csr(indptr, indices, data, x, y):
    """y = A x, A in CSR; one thread per row."""
    row = cuda.grid(1)
    if row < y.shape[0]:
        acc = 0.0
        for k in range(indptr[row], indptr[row + 1]):
            acc += data[k] * x[indices[k]]
        y[row] = acc


@kadj.differentiate
@cuda.jit
def spmv_csr_transpose(indptr, indices, data, x, y):
    """y += A^T x, A in CSR; one thread per row scatters into y with atomics."""
    row = cuda.grid(1)
    if row < x.shape[0]:
        xr = x[row]
        for k in range(indptr[row], indptr[row + 1]):
            cuda.atomic.add(y, indices[k], data[k] * xr)


@kadj.differentiate
@cuda.jit
def gather_scale(x, idx, w, y):
    """y[i] = w[i] * x[idx[i]]; idx has repeats."""
    i = cuda.grid(1)
    if i < y.shape[0]:
        y[i] = w[i] * x[idx[i]]


@kadj.differentiate
@cuda.jit
def scatter_add(x, idx, w, y):
    """y[idx[i]] += w[i] * x[i] with atomics (segment sum)."""
    i = cuda.grid(1)
    if i < x.shape[0]:
        cuda.atomic.add(y, idx[i], w[i] * x[i])


@kadj.differentiate
@cuda.jit
def permute_affine(x, perm, y, s, b):
    """y[perm[i]] = s * x[i] + b; perm is a permutation (no write conflicts)."""
    i = cuda.grid(1)
    if i < x.shape[0]:
        y[perm[i]] = s * x[i] + b


def _csr(rng, n_rows, n_cols, per_row=3):
    indptr = [0]
    indices = []
    for _ in range(n_rows):
        cols = np.sort(rng.choice(n_cols, size=rng.integers(1, per_row + 1),
                                  replace=False))
        indices.extend(cols)
        indptr.append(len(indices))
    indptr = np.array(indptr, dtype=np.int64)
    indices = np.array(indices, dtype=np.int64)
    return indptr, indices, rng.standard_normal(len(indices))


def _csr_exact(rng, n_rows, n_cols, per_row):
    """CSR with exactly ``per_row`` distinct sorted columns in every row (consecutive
    modulo n_cols), drawn without a Python loop over rows."""
    per_row = min(per_row, n_cols)
    start = rng.integers(0, n_cols, n_rows)
    cols = np.sort((start[:, None] + np.arange(per_row)[None, :]) % n_cols, axis=1)
    indptr = np.arange(n_rows + 1, dtype=np.int64) * per_row
    return indptr, cols.ravel().astype(np.int64), rng.standard_normal(n_rows * per_row)


def _spmv_sized(rng, n, trips=None):
    """n rows, n - n // 6 columns; trips: nonzeros per row (else 1 to 3)."""
    n = at_least(n, 1)
    n_cols = at_least(n - n // 6, 3)
    if trips is None:
        indptr, indices, data = _csr(rng, n, n_cols)
    else:
        indptr, indices, data = _csr_exact(rng, n, n_cols, at_least(trips, 0))
    return launch_1d(n), [indptr, indices, data, rng.standard_normal(n_cols), np.zeros(n)]


def _spmv_args(rng):
    indptr, indices, data = _csr(rng, 12, 10)
    return [indptr, indices, data, rng.standard_normal(10), np.zeros(12)]


def _spmv_t_sized(rng, n, trips=None):
    no_trips(trips, "spmv_csr_transpose")
    n = at_least(n, 1)
    n_cols = at_least(n - n // 6, 3)
    indptr, indices, data = _csr(rng, n, n_cols)
    return launch_1d(n), [indptr, indices, data, rng.standard_normal(n),
                          rng.standard_normal(n_cols)]


def _spmv_t_args(rng):
    indptr, indices, data = _csr(rng, 12, 10)
    return [indptr, indices, data, rng.standard_normal(12), rng.standard_normal(10)]


def _gather_sized(rng, n, trips=None):
    no_trips(trips, "gather_scale")
    n = at_least(n, 1)
    m = at_least(n // 2, 2)
    return launch_1d(n), [rng.standard_normal(m), rng.integers(0, m, n).astype(np.int64),
                          rng.standard_normal(n), np.zeros(n)]


def _gather_args(rng):
    return [rng.standard_normal(8), rng.integers(0, 8, 14).astype(np.int64),
            rng.standard_normal(14), np.zeros(14)]


def _scatter_sized(rng, n, trips=None):
    no_trips(trips, "scatter_add")
    n = at_least(n, 1)
    m = at_least(n // 3, 2)
    return launch_1d(n), [rng.standard_normal(n), rng.integers(0, m, n).astype(np.int32),
                          rng.standard_normal(n), rng.standard_normal(m)]


def _scatter_args(rng):
    return [rng.standard_normal(14), rng.integers(0, 6, 14).astype(np.int32),
            rng.standard_normal(14), rng.standard_normal(6)]


def _permute_sized(rng, n, trips=None):
    no_trips(trips, "permute_affine")
    n = at_least(n, 1)
    return launch_1d(n), [rng.standard_normal(n), rng.permutation(n).astype(np.int64),
                          np.zeros(n), 1.5, 0.25]


def _permute_args(rng):
    return _permute_sized(rng, 12)[1]


CASES = [
    Case("spmv_csr", spmv_csr, (2, 8), _spmv_args,
         note="CSR SpMV, inner loop over a row's nonzeros, x gathered by index",
         sized=_spmv_sized, trip_loop='for k in range(indptr[row], indptr[row + 1])'),
    Case("spmv_csr_transpose", spmv_csr_transpose, (2, 8), _spmv_t_args,
         note="A^T x scattered with cuda.atomic.add",
         sized=_spmv_t_sized),
    Case("gather_scale", gather_scale, (2, 8), _gather_args,
         note="gather through an index array with repeats",
         sized=_gather_sized),
    Case("scatter_add", scatter_add, (2, 8), _scatter_args,
         note="segment sum with cuda.atomic.add, int32 indices",
         sized=_scatter_sized),
    Case("permute_affine", permute_affine, (2, 8), _permute_args,
         note="scatter through a permutation, two scalars",
         sized=_permute_sized),
]
