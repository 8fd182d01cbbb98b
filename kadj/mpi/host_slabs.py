"""Fused loops over the ghost layers and slabs of a C-contiguous NumPy array along one
axis, seen as a 3-D array ``(A, n, B)`` (axis ``d`` in the middle): each touches every
element once, where NumPy would pass over strided slabs two or three times
(:mod:`kadj.mpi.halo` uses them for a periodic axis that is not split, and for the
adjoint's sends of strided ghost layers).  Compiled on first use, cached on disk."""
from __future__ import annotations

import numba

__all__ = ["add_zero", "pack_zero", "wrap_adjoint", "wrap_forward"]


@numba.njit(cache=True, nogil=True)
def wrap_forward(a, w):
    """The low ghost layers get the high slab, the high ghost layers the low slab."""
    n = a.shape[1]
    for i in range(a.shape[0]):
        for j in range(w):
            for k in range(a.shape[2]):
                a[i, j, k] = a[i, n - 2 * w + j, k]
                a[i, n - w + j, k] = a[i, w + j, k]


@numba.njit(cache=True, nogil=True)
def wrap_adjoint(a, w):
    """Its transpose: each ghost layer's cotangent is added into the slab it was copied
    from, and zeroed."""
    n = a.shape[1]
    for i in range(a.shape[0]):
        for j in range(w):
            for k in range(a.shape[2]):
                a[i, n - 2 * w + j, k] += a[i, j, k]
                a[i, j, k] = 0
                a[i, w + j, k] += a[i, n - w + j, k]
                a[i, n - w + j, k] = 0


@numba.njit(cache=True, nogil=True)
def pack_zero(src, out):
    """``out[...] = src; src[...] = 0`` in one pass (3-D arrays of one shape)."""
    for i in range(src.shape[0]):
        for j in range(src.shape[1]):
            for k in range(src.shape[2]):
                out[i, j, k] = src[i, j, k]
                src[i, j, k] = 0


@numba.njit(cache=True, nogil=True)
def add_zero(slab, src, ghost, zero):
    """``slab[...] += src``, and ``ghost[...] = 0`` in the same pass when ``zero``
    (3-D arrays of one shape): the adjoint's work after its messages arrive."""
    for i in range(slab.shape[0]):
        for j in range(slab.shape[1]):
            for k in range(slab.shape[2]):
                slab[i, j, k] += src[i, j, k]
                if zero:
                    ghost[i, j, k] = 0
