"""Row loops whose adjoints replay one row at a time (kadj.analysis.rewrites), pinned
in tests/golden/ (kept in their own module so that the file:line comments in the
golden files stay stable)."""
import math

import numpy as np
from numba import njit


@njit
def thomas_shared_rows(lower, diag, upper, rhs, x):
    nsys, n = diag.shape
    c = np.empty(n)
    d = np.empty(n)
    for s in range(nsys):
        cp = upper[s, 0] / diag[s, 0]
        dp = rhs[s, 0] / diag[s, 0]
        c[0] = cp
        d[0] = dp
        for i in range(1, n):
            denom = diag[s, i] - lower[s, i] * cp
            cp = upper[s, i] / denom
            dp = (rhs[s, i] - lower[s, i] * dp) / denom
            c[i] = cp
            d[i] = dp
        xi = dp
        x[s, n - 1] = xi
        for i in range(n - 2, -1, -1):
            xi = d[i] - c[i] * xi
            x[s, i] = xi


@njit
def softmax_rows_inplace(x):
    nrows, ncols = x.shape
    for r in range(nrows):
        m = x[r, 0]
        for j in range(1, ncols):
            m = max(m, x[r, j])
        s = 0.0
        for j in range(ncols):
            x[r, j] = math.exp(x[r, j] - m)
            s += x[r, j]
        for j in range(ncols):
            x[r, j] /= s
