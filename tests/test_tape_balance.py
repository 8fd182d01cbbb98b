"""Every push popped, every push covered: search loops inside replayed iterations.

A loop without reverse code (a search whose trips carry no derivative: a scan for a
bracket, a bisection for an index) must record nothing inside it, since the reverse
sweep never enters it to pop; a ``while`` loop whose trips do record, inside a
replayed iteration, needs a reservation per trip (its trip count is unknown where the
iteration's reservation is made).  Each kernel here ran past the end of its tape
before that: the adjoints are re-jitted with ``boundscheck=True`` and checked against
float64 central differences (:func:`kadj.testing.check_grad`'s inner-product test),
and their sources are audited as Python with strict tapes (tests/sweep.py:
``check_tapes``: exact-size reservations, every tape pointer back at 0 at return).
"""
import math
import os
import sys

import numpy as np
import pytest
from numba import njit

import kadj
from kernels.cpu import by_name

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sweep  # noqa: E402


@njit
def bisect_interp(xk, yk, q, out):
    """Linear interpolation, the bracket of each query found by bisection."""
    m = xk.shape[0]
    for i in range(q.shape[0]):
        t = q[i]
        lo = 0
        hi = m - 1
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if xk[mid] <= t:
                lo = mid
            else:
                hi = mid
        w = (t - xk[lo]) / (xk[hi] - xk[lo])
        out[i] = yk[lo] * (1.0 - w) + yk[hi] * w * t


@njit
def scan_and_interp(xk, yk, q, out):
    """A ``while`` scan with ``and`` in its condition, then a quadratic blend."""
    m = xk.shape[0]
    for i in range(q.shape[0]):
        t = q[i]
        j = 1
        while j < m - 1 and xk[j] < t:
            j += 1
        w = (t - xk[j - 1]) / (xk[j] - xk[j - 1])
        out[i] = yk[j - 1] + w * w * (yk[j] - yk[j - 1])


def knots_and_queries(rng, n):
    """n queries over 8 + n // 8 increasing knots, every query away from every knot
    (no kinks for the central differences)."""
    m = 8 + n // 8
    xk = np.arange(m, dtype=np.float64) + 0.3 * rng.random(m)
    q = np.floor(rng.uniform(0.0, m - 1.0, n)) + rng.uniform(0.45, 0.55, n)
    return xk, rng.standard_normal(m), np.maximum(q, 0.5), np.zeros(n)


@njit
def fixed_point_per_element(x, a, out):
    """Per element, a ``while`` loop whose trips record (a damped iteration with a
    derivative) and run hundreds of times: more pushes in one replayed iteration than
    a fresh tape holds."""
    for i in range(x.shape[0]):
        y = x[i]
        k = 0
        while True:
            y = a[i] * math.sin(y) + 0.5 * x[i]
            k += 1
            if k >= 300 + 3 * i:
                break
        out[i] = y * y


def fixed_point_args(rng, n):
    return rng.uniform(-1.0, 1.0, n), rng.uniform(0.2, 0.5, n), np.zeros(n)


SEARCHES = [(bisect_interp, knots_and_queries), (scan_and_interp, knots_and_queries),
            (fixed_point_per_element, fixed_point_args)]


def test_bracket_interp_every_size_to_200():
    """The gallery kernel that overran its tape from 50 queries on."""
    ex = by_name("bracket_interp")
    k = kadj.differentiate(sweep.bounds_checked(ex.kernel), wrt=ex.wrt)
    sizes = range(2, 201)
    cases = ((f"n={n}", ex.sized(sweep.rng_for(ex.name, n), n)) for n in sizes)
    assert sweep.check_many(k, cases, wrt=ex.wrt) == len(sizes)
    assert sweep.check_tapes(k, ex.sized(sweep.rng_for(ex.name, 300), 300))


@pytest.mark.parametrize("kernel, make", SEARCHES, ids=[f.__name__ for f, _ in SEARCHES])
def test_search_loops_in_replayed_iterations(kernel, make):
    k = kadj.differentiate(sweep.bounds_checked(kernel))
    sizes = (1, 2, 7, 60, 257, 1500)
    cases = ((f"n={n}", make(sweep.rng_for(kernel.__name__, n), n)) for n in sizes)
    assert sweep.check_many(k, cases) == len(sizes)
    assert sweep.check_tapes(k, make(sweep.rng_for(kernel.__name__, 40), 40))


def test_fixed_point_gradient_formula():
    """An independent reference: y' = a cos(y) y' + 0.5 (and da), iterated by hand."""
    x, a, out = fixed_point_args(np.random.default_rng(4), 5)
    adj_x, adj_a, adj_out = np.zeros(5), np.zeros(5), np.ones(5)
    kadj.differentiate(fixed_point_per_element).adjoint(x, a, out, adj_x, adj_a, adj_out)
    gx, ga = np.zeros(5), np.zeros(5)
    for i in range(5):
        y, dy_dx, dy_da = x[i], 1.0, 0.0
        for _ in range(300 + 3 * i):
            c = a[i] * math.cos(y)
            dy_dx, dy_da = c * dy_dx + 0.5, c * dy_da + math.sin(y)
            y = a[i] * math.sin(y) + 0.5 * x[i]
        gx[i], ga[i] = 2 * y * dy_dx, 2 * y * dy_da
    np.testing.assert_allclose(adj_x, gx, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(adj_a, ga, rtol=1e-10, atol=1e-13)


def test_tape_audit_catches_an_unbalanced_tape():
    """The audit itself fails on a source that pops one entry too few (the tape
    pointer left one too high: a later pop reads an entry never pushed)."""
    ex = by_name("kepler_newton")
    k = kadj.differentiate(ex.kernel, wrt=ex.wrt)
    args = ex.sized(sweep.rng_for(ex.name, 30), 30)
    source = k.adjoint_source(*args)
    unpopped = source.replace("_sp_i64 -= 1", "_sp_i64 -= 0", 1)
    assert unpopped != source

    class Doctored:
        adjoint_plan = k.adjoint_plan

        def adjoint_source(self, *a):
            return unpopped
    with pytest.raises(sweep.TapeError, match="kepler_newton: "):
        sweep.check_tapes(Doctored(), args)
    assert sweep.check_tapes(k, args)


# ---- arrays restored without an adjoint ---------------------------------------------
# An array the reverse sweep reads as it was (a recomputed load) but that has no adjoint
# (an inactive float scratch array, an integer index array) is restored element by
# element like any other: every overwritten element the forward sweep pushes, the
# reverse sweep pops where the store was.  The pops were missing (the tape pointer left
# high, the loads read the last values: wrong gradients) until the stores into such
# arrays counted as reverse code.

@njit
def inactive_weights(x, out, steps):
    """A float work array that depends on no input, rewritten every step and read by
    the active update before that."""
    n = x.shape[0]
    w = np.ones(n)
    for t in range(steps):
        for i in range(n):
            out[i] += x[i] * w[i] * x[i]
        for i in range(n):
            w[i] = w[i] * 0.5 + 1.0


@njit
def rotating_indices(x, idx, out, steps):
    """An integer index array updated in place, used to gather the active input."""
    n = x.shape[0]
    for t in range(steps):
        for i in range(n):
            out[i] += x[idx[i]] * x[idx[i]] * (t + 1.0)
        for i in range(n):
            idx[i] = (idx[i] + 1) % n


@njit
def counters_in_while(x, out):
    """Integer counters bumped in a ``while`` loop, read by the active sum before each
    bump (balanced before the change too: the counters' elements are recorded in the
    loop that reads them)."""
    n = x.shape[0]
    hits = np.zeros(n, np.int64)
    s = 0.0
    k = 0
    while k < 3 * n:
        j = (k * 7) % n
        s += x[j] * x[j] * (hits[j] + 1)
        hits[j] += 1
        k += 1
    out[0] = s


def _restored_args(kernel):
    if kernel is inactive_weights:
        return lambda rng, n: (rng.standard_normal(n), np.zeros(n), 4)
    if kernel is rotating_indices:
        return lambda rng, n: (rng.standard_normal(n), rng.integers(0, n, n), np.zeros(n),
                               4)
    return lambda rng, n: (rng.standard_normal(n), np.zeros(1))


RESTORED = [(inactive_weights, None), (rotating_indices, None), (inactive_weights, 2),
            (rotating_indices, 2), (counters_in_while, None)]


@pytest.mark.parametrize("kernel, checkpoints", RESTORED,
                         ids=[f"{f.__name__}-ckpt{c}" for f, c in RESTORED])
def test_arrays_restored_without_adjoint_pop_every_push(kernel, checkpoints):
    k = kadj.differentiate(sweep.bounds_checked(kernel), checkpoints=checkpoints)
    make = _restored_args(kernel)
    sizes = (1, 2, 7, 60, 300)
    cases = ((f"n={n}", make(sweep.rng_for(kernel.__name__, n), n)) for n in sizes)
    assert sweep.check_many(k, cases) == len(sizes)
    assert sweep.check_tapes(k, make(sweep.rng_for(kernel.__name__, 20), 20))


def test_rotating_indices_gradient_formula():
    """An independent reference: out[i] = sum_t (t + 1) x[(idx0[i] + t) % n] ** 2."""
    rng = np.random.default_rng(5)
    n, steps = 6, 4
    x, idx = rng.standard_normal(n), rng.integers(0, n, n)
    adj_x, adj_out = np.zeros(n), rng.standard_normal(n)
    kadj.differentiate(rotating_indices).adjoint(x, idx.copy(), np.zeros(n), steps,
                                                 adj_x, adj_out.copy())
    want = np.zeros(n)
    for i in range(n):
        for t in range(steps):
            j = (idx[i] + t) % n
            want[j] += adj_out[i] * (t + 1.0) * 2.0 * x[j]
    np.testing.assert_allclose(adj_x, want, rtol=1e-12, atol=1e-14)
