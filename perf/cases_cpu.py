"""CPU benchmark cases: plain ``@njit`` kernels with careful hand-written adjoints.

Each :class:`Case` pairs a forward kernel with an adjoint written by hand that follows
API.md's in/out rule exactly, with the same argument layout as the adjoint kadj
generates: the forward arguments, then one adjoint buffer per differentiable argument
(every floating-point argument here), in argument order.  An array's adjoint has the
array's shape and dtype; a scalar's adjoint is a 1-element array, accumulated into.  On
entry an adjoint holds the cotangent of its argument's state *after* the forward call,
on return the cotangent of its state *before* the call: elements the forward overwrote
have their incoming cotangent consumed, elements it only read get contributions added.

The hand-written adjoints are the reference kadj is measured against (DESIGN.md: "kadj
within 10% of a careful hand-written adjoint"), so each is the fastest form found by
measurement, written the way a careful person would write it:

- stencils scatter in the forward loop order, reading and consuming ``adj_u_new`` once
  per point and keeping ``adj_alpha``'s sum in a register (the straightforward
  hand-written form; the expert gather-form adjoints, with a branch-free vectorised
  interior, are in ``scripts/bench_cpu.py``);
- the recurrence stores its loop-carried values in one small buffer reused by all
  elements;
- Horner's adjoint needs no stored partial values: the coefficients' partials are powers
  of ``x`` and ``x``'s partial is the derivative polynomial, evaluated alongside.

All kernels use plain ``@njit`` (no fastmath, no parallel), as kadj compiles its adjoint
with the options of the user's kernel.  ``tests/test_perf_cases.py`` checks every
hand-written adjoint against central finite differences of the full state map.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from numba import njit


@dataclass(frozen=True)
class Case:
    """One benchmark case.

    name:          short identifier.
    description:   one line for tables.
    forward:       the plain ``@njit`` kernel.
    hand_adjoint:  the hand-written ``@njit`` adjoint (forward args, then adjoints).
    make_args:     ``make_args(n, rng)`` -> forward arguments for size parameter ``n``.
    adjoint_args:  indices of the arguments that take an adjoint slot, in order.
    check_n, small_n, large_n:  size parameters for finite-difference checks, quick
                   benchmark runs, and benchmark runs of ~1-10 ms per forward call.
    """

    name: str
    description: str
    forward: Callable
    hand_adjoint: Callable
    make_args: Callable[[int, np.random.Generator], tuple]
    adjoint_args: tuple
    check_n: int
    small_n: int
    large_n: int

    def size(self, which):
        """The size parameter for ``"check"``, ``"small"`` or ``"large"``."""
        return {"check": self.check_n, "small": self.small_n, "large": self.large_n}[which]


def make_adjoints(case, args, rng):
    """Random incoming cotangents, one per adjoint slot of ``case`` for ``args``.

    Arrays get a random array of the same shape and dtype; scalars a random 1-element
    float64 array (Python floats are float64 to Numba).  Nonzero values everywhere
    exercise both the consumption of overwritten elements and accumulation.
    """
    adjoints = []
    for index in case.adjoint_args:
        arg = args[index]
        if isinstance(arg, np.ndarray):
            adjoints.append(rng.standard_normal(arg.shape).astype(arg.dtype))
        else:
            adjoints.append(np.array([rng.standard_normal()], dtype=np.float64))
    return tuple(adjoints)


def copy_args(args):
    """A copy of forward arguments: arrays copied, scalars as they are."""
    return tuple(a.copy() if isinstance(a, np.ndarray) else a for a in args)


# --------------------------------------------------------------------------------------
# 1-D heat step (3-point stencil)
# --------------------------------------------------------------------------------------


@njit
def heat1d(u, u_new, alpha):
    for i in range(1, u.shape[0] - 1):
        u_new[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1])


@njit
def heat1d_adjoint(u, u_new, alpha, adj_u, adj_u_new, adj_alpha):
    c = 1.0 - 2.0 * alpha
    s = 0.0
    for i in range(1, u.shape[0] - 1):
        g = adj_u_new[i]
        adj_u_new[i] = 0.0  # overwritten by the forward: its cotangent is consumed
        s += g * (u[i - 1] - 2.0 * u[i] + u[i + 1])
        adj_u[i - 1] += alpha * g
        adj_u[i] += c * g
        adj_u[i + 1] += alpha * g
    adj_alpha[0] += s


def heat1d_args(n, rng):
    return (rng.standard_normal(n), rng.standard_normal(n), 0.2)


# --------------------------------------------------------------------------------------
# 2-D heat step (5-point stencil)
# --------------------------------------------------------------------------------------


@njit
def heat2d(u, u_new, alpha):
    n, m = u.shape
    for i in range(1, n - 1):
        for j in range(1, m - 1):
            u_new[i, j] = u[i, j] + alpha * (
                u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1] - 4.0 * u[i, j]
            )


@njit
def heat2d_adjoint(u, u_new, alpha, adj_u, adj_u_new, adj_alpha):
    n, m = u.shape
    c = 1.0 - 4.0 * alpha
    s = 0.0
    for i in range(1, n - 1):
        for j in range(1, m - 1):
            g = adj_u_new[i, j]
            adj_u_new[i, j] = 0.0
            s += g * (u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1] - 4.0 * u[i, j])
            adj_u[i, j] += c * g
            adj_u[i - 1, j] += alpha * g
            adj_u[i + 1, j] += alpha * g
            adj_u[i, j - 1] += alpha * g
            adj_u[i, j + 1] += alpha * g
    adj_alpha[0] += s


def heat2d_args(n, rng):
    return (rng.standard_normal((n, n)), rng.standard_normal((n, n)), 0.1)


# --------------------------------------------------------------------------------------
# Per-element recurrence with a loop-carried value
# --------------------------------------------------------------------------------------


@njit
def recurrence(x0, a, b, y, steps):
    for i in range(x0.shape[0]):
        x = x0[i]
        for t in range(steps):
            x = x * a[i] + b
        y[i] = x


@njit
def recurrence_adjoint(x0, a, b, y, steps, adj_x0, adj_a, adj_b, adj_y):
    xs = np.empty(steps, dtype=x0.dtype)  # x before each step, reused by every element
    sb = 0.0
    for i in range(x0.shape[0]):
        ai = a[i]
        x = x0[i]
        for t in range(steps):
            xs[t] = x
            x = x * ai + b
        g = adj_y[i]
        adj_y[i] = 0.0
        ga = 0.0
        for t in range(steps - 1, -1, -1):
            ga += g * xs[t]
            sb += g
            g = g * ai
        adj_x0[i] += g
        adj_a[i] += ga
    adj_b[0] += sb


def recurrence_args(n, rng, steps=32):
    x0 = rng.standard_normal(n)
    a = rng.uniform(0.5, 0.95, n)
    return (x0, a, 0.3, np.zeros(n), steps)


def _recurrence_check_args(n, rng):
    return recurrence_args(n, rng, steps=4)


# --------------------------------------------------------------------------------------
# Polynomial (Horner) with coefficients shared by all elements
# --------------------------------------------------------------------------------------


@njit
def horner(coeffs, x, y):
    k = coeffs.shape[0]
    for i in range(x.shape[0]):
        xi = x[i]
        p = coeffs[k - 1]
        for j in range(k - 2, -1, -1):
            p = p * xi + coeffs[j]
        y[i] = p


@njit
def horner_adjoint(coeffs, x, y, adj_coeffs, adj_x, adj_y):
    k = coeffs.shape[0]
    for i in range(x.shape[0]):
        g = adj_y[i]
        adj_y[i] = 0.0
        xi = x[i]
        # d y / d coeffs[j] = xi**j
        w = g
        for j in range(k):
            adj_coeffs[j] += w
            w *= xi
        # d y / d xi: the derivative polynomial, by Horner alongside the value
        p = coeffs[k - 1]
        d = 0.0
        for j in range(k - 2, -1, -1):
            d = d * xi + p
            p = p * xi + coeffs[j]
        adj_x[i] += g * d


@njit
def horner_adjoint_reverse(coeffs, x, y, adj_coeffs, adj_x, adj_y):
    """The same adjoint written the mechanical way: store the Horner iterates of each
    element in a small buffer, then run the recurrence backwards."""
    k = coeffs.shape[0]
    ps = np.empty(k, dtype=x.dtype)
    for i in range(x.shape[0]):
        xi = x[i]
        p = coeffs[k - 1]
        for j in range(k - 2, -1, -1):
            ps[j] = p
            p = p * xi + coeffs[j]
        g = adj_y[i]
        adj_y[i] = 0.0
        gx = 0.0
        for j in range(k - 1):
            adj_coeffs[j] += g
            gx += g * ps[j]
            g = g * xi
        adj_coeffs[k - 1] += g
        adj_x[i] += gx


def horner_args(n, rng, degree=8):
    return (rng.standard_normal(degree + 1) / 2.0, rng.uniform(-1.0, 1.0, n), np.zeros(n))


def _horner_check_args(n, rng):
    return horner_args(n, rng, degree=4)


# --------------------------------------------------------------------------------------
# CSR sparse matrix-vector product
# --------------------------------------------------------------------------------------


@njit
def spmv(data, indices, indptr, x, y):
    for r in range(y.shape[0]):
        s = 0.0
        for k in range(indptr[r], indptr[r + 1]):
            s += data[k] * x[indices[k]]
        y[r] = s


@njit
def spmv_adjoint(data, indices, indptr, x, y, adj_data, adj_x, adj_y):
    for r in range(y.shape[0]):
        g = adj_y[r]
        adj_y[r] = 0.0
        for k in range(indptr[r], indptr[r + 1]):
            c = indices[k]
            adj_data[k] += g * x[c]
            adj_x[c] += g * data[k]


def spmv_args(n, rng, per_row=16, band=1024):
    """A square n x n CSR matrix with 1..2*per_row entries per row, columns sorted,
    drawn from a band around the diagonal (like a discretised operator)."""
    lengths = rng.integers(1, 2 * per_row + 1, n) if n > 1 else np.ones(n, dtype=np.int64)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    nnz = int(indptr[-1])
    rows = np.repeat(np.arange(n), lengths)
    cols = np.clip(rows + rng.integers(-band, band + 1, nnz), 0, n - 1)
    order = np.lexsort((cols, rows))
    indices = cols[order].astype(np.int64)
    data = rng.standard_normal(nnz)
    return (data, indices, indptr, rng.standard_normal(n), np.zeros(n))


def _spmv_check_args(n, rng):
    return spmv_args(n, rng, per_row=3, band=3)


# --------------------------------------------------------------------------------------

CASES = (
    Case(
        name="heat1d",
        description="1-D heat step, 3-point stencil",
        forward=heat1d,
        hand_adjoint=heat1d_adjoint,
        make_args=heat1d_args,
        adjoint_args=(0, 1, 2),
        check_n=9,
        small_n=10_000,
        large_n=1_000_000,
    ),
    Case(
        name="heat2d",
        description="2-D heat step, 5-point stencil",
        forward=heat2d,
        hand_adjoint=heat2d_adjoint,
        make_args=heat2d_args,
        adjoint_args=(0, 1, 2),
        check_n=6,
        small_n=100,
        large_n=1000,
    ),
    Case(
        name="recurrence",
        description="per-element loop x = x*a[i] + b, 32 steps",
        forward=recurrence,
        hand_adjoint=recurrence_adjoint,
        make_args=recurrence_args,
        adjoint_args=(0, 1, 2, 3),
        check_n=4,
        small_n=3_000,
        large_n=200_000,
    ),
    Case(
        name="horner",
        description="degree-8 polynomial, shared coefficients",
        forward=horner,
        hand_adjoint=horner_adjoint,
        make_args=horner_args,
        adjoint_args=(0, 1, 2),
        check_n=5,
        small_n=10_000,
        large_n=500_000,
    ),
    Case(
        name="horner_rev",
        description="Horner again; hand adjoint reverses the recurrence (stored iterates)",
        forward=horner,
        hand_adjoint=horner_adjoint_reverse,
        make_args=horner_args,
        adjoint_args=(0, 1, 2),
        check_n=5,
        small_n=10_000,
        large_n=500_000,
    ),
    Case(
        name="spmv",
        description="CSR SpMV, ~16 nnz/row, banded",
        forward=spmv,
        hand_adjoint=spmv_adjoint,
        make_args=spmv_args,
        adjoint_args=(0, 3, 4),
        check_n=6,
        small_n=2_000,
        large_n=200_000,
    ),
)

# Finite-difference checks use smaller inner loops than the benchmarks.
CHECK_ARGS = {
    "recurrence": _recurrence_check_args,
    "horner": _horner_check_args,
    "horner_rev": _horner_check_args,
    "spmv": _spmv_check_args,
}


def check_args(case, rng, n=None):
    """Small forward arguments for ``case``'s finite-difference check (size ``n``,
    default ``case.check_n``)."""
    make = CHECK_ARGS.get(case.name, case.make_args)
    return make(case.check_n if n is None else n, rng)


def get_case(name):
    for case in CASES:
        if case.name == name:
            return case
    raise KeyError(f"no benchmark case named {name!r}; known: {[c.name for c in CASES]}")
