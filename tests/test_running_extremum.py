"""Running maxima and minima (kadj/running_extremum.py): the loop records the counter of
the last iteration that set the extremum instead of the extremum at every iteration,
and the adjoint adds to that one element.  Gradients against finite differences at
sizes 1..2000 (distinct values), against the rule's tie convention where values repeat
(ties go to the first argument of max/min), NaN values, and the loops that must keep
the recorded form."""
import math

import numpy as np
import pytest
from numba import njit

import kadj
from kadj.tape_measure import cpu_tape_usage
from kadj.testing import check_grad
from kernels.cpu.reductions import logsumexp


lse = logsumexp      # m = max(m, x[i]), then a sum of exp(x[i] - m)


@njit
def plain_max(x):
    m = x[0]
    for i in range(1, x.shape[0]):
        m = max(m, x[i])
    return 2.0 * m


@njit
def running_min_value_first(x, w):
    m = x[0] * w
    for i in range(1, x.shape[0]):
        m = min(x[i] * w, m)          # the value first: it wins ties
    return m * m


@njit
def branch_max(x, out):
    m = x[0]
    for i in range(1, x.shape[0]):
        if x[i] > m:
            m = x[i]
    for i in range(x.shape[0]):
        out[i] = x[i] - m


@njit
def branch_max_ge(x):
    m = x[0]
    for i in range(1, x.shape[0]):
        if x[i] >= m:                 # later equal values take it
            m = x[i]
    return 3.0 * m


@njit
def whole_array(x):
    return np.max(x) - 2.0 * np.min(x * x + 1.0)


@njit
def row_max(a, out):
    for r in range(a.shape[0]):
        m = a[r, 0]
        for j in range(1, a.shape[1]):
            m = max(m, a[r, j])
        out[r] = m * m


KERNELS = {
    "lse": (lse, lambda r, n: (r.standard_normal(n),)),
    "plain_max": (plain_max, lambda r, n: (r.standard_normal(n),)),
    "min_value_first": (running_min_value_first,
                        lambda r, n: (r.standard_normal(n), 0.7)),
    "branch_max": (branch_max, lambda r, n: (r.standard_normal(n), np.zeros(n))),
    "branch_max_ge": (branch_max_ge, lambda r, n: (r.standard_normal(n),)),
    "whole_array": (whole_array, lambda r, n: (r.standard_normal(n),)),
    "row_max": (row_max, lambda r, n: (r.standard_normal((3, n)), np.zeros(3))),
}


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_gradients_and_no_tape_per_iteration(name):
    fn, make = KERNELS[name]
    k = kadj.differentiate(fn)
    for n in (1, 2, 3, 17, 2000):
        check_grad(k, make(np.random.default_rng(n), n))
    src = k.adjoint_source(*make(np.random.default_rng(0), 8))
    assert "_at = -1" in src and "_run = " in src, src
    # nothing recorded per iteration: the tape holds as much at 20 as at 400 elements
    assert _recorded(k, make, 20) == _recorded(k, make, 400)


def _recorded(k, make, n):
    return sum(c for c, _ in cpu_tape_usage(k, make(np.random.default_rng(1), n)).values())


def _grad(k, args):
    plan = k.adjoint_plan(*args)
    bufs = [np.zeros_like(args[i]) if isinstance(args[i], np.ndarray) else np.zeros(1)
            for i in plan.adjoint_args]
    ret = k.adjoint(*args, *bufs)
    return ret, bufs


@pytest.mark.parametrize("fn, winner", [
    (plain_max, 1),                 # max(m, v): m keeps ties, the first 5.0 wins
    (branch_max, 1),                # x[i] > m: the first
    (branch_max_ge, 4),             # x[i] >= m: the last
])
def test_ties_go_where_the_rule_sends_them(fn, winner):
    x = np.array([1.0, 5.0, 2.0, -1.0, 5.0, 0.5])
    k = kadj.differentiate(fn)
    args = (x,) if fn is not branch_max else (x, np.zeros(6))
    _, bufs = _grad(k, args)
    if fn is branch_max:
        # out[i] = x[i] - m: every output's cotangent is 0 here (zero buffers), so
        # give them ones: m's adjoint is -6
        out_bar = np.ones(6)
        gx = np.zeros(6)
        k.adjoint(x, np.zeros(6), gx, out_bar)
        expected = np.ones(6)
        expected[winner] -= 6.0
        np.testing.assert_allclose(gx, expected)
        return
    g = bufs[0]
    assert g[winner] != 0.0 and np.count_nonzero(g[[1, 4]]) == 1, g


def test_nan_keeps_the_forward_value():
    """numba's max keeps a NaN running value: the adjoint's value is the forward's
    (NaN) whichever element the loop recorded."""
    x = np.array([0.5, np.nan, 2.0, 1.0])
    k = kadj.differentiate(lse)
    ret, bufs = _grad(k, (x,))
    fwd = lse(x)
    assert math.isnan(fwd) == math.isnan(ret)
    y = np.array([np.nan, 1.0, 3.0])
    ret, _ = _grad(kadj.differentiate(lse), (y,))
    assert math.isnan(lse(y)) and math.isnan(ret)


@njit
def read_in_loop(x):
    m = x[0]
    s = 0.0
    for i in range(1, x.shape[0]):
        m = max(m, x[i])
        s += m                      # the running value is read: recorded as before
    return s


@njit
def value_stored_in_loop(x, y):
    m = y[0]
    for i in range(1, x.shape[0]):
        y[i] = x[i] * 2.0
        m = max(m, y[i])            # an array the loop writes
    return m


@njit
def leaves_early(x):
    m = x[0]
    for i in range(1, x.shape[0]):
        if x[i] > 10.0:
            break
        m = max(m, x[i])
    return m


@njit
def assigned_twice(x):
    m = x[0]
    for i in range(1, x.shape[0]):
        m = max(m, x[i])
        m = m * 0.5
    return m


@njit
def counter_from_minus_one(x):
    m = -1e300
    for i in range(-1, x.shape[0] - 1):   # x[-1] is the last element
        m = max(m, x[i])             # (a winner at i = -1 is no "none set it" mark)
    return m


@njit
def branch_counter_from_minus_two(x):
    m = x[0]
    for i in range(-2, x.shape[0] - 2):
        v = x[i] * 2.0
        if v > m:
            m = v
    return m


@pytest.mark.parametrize("fn, make", [
    (read_in_loop, lambda r, n: (r.standard_normal(n),)),
    (counter_from_minus_one, lambda r, n: (r.standard_normal(n),)),
    (branch_counter_from_minus_two, lambda r, n: (1.0 + r.random(max(n, 2)),)),
    (value_stored_in_loop, lambda r, n: (r.standard_normal(n), r.standard_normal(n))),
    (leaves_early, lambda r, n: (r.standard_normal(n),)),
    (assigned_twice, lambda r, n: (r.standard_normal(n),)),
], ids=["read_in_loop", "counter_from_minus_one", "branch_counter_from_minus_two",
        "value_stored_in_loop", "leaves_early", "assigned_twice"])
def test_loops_that_do_not_qualify_keep_the_recorded_form(fn, make):
    k = kadj.differentiate(fn)
    for n in (1, 2, 9, 300):
        check_grad(k, make(np.random.default_rng(n), n))
    assert "m_run =" not in k.adjoint_source(*make(np.random.default_rng(0), 5))
    if fn is not value_stored_in_loop:     # (whose y is restored either way)
        assert _recorded(k, make, 20) < _recorded(k, make, 400)


def test_forward_mode_of_a_rewritten_kernel():
    """kernel.jvp goes through the same rewritten kernel: its tangent is the directional
    derivative (the winner's tangent)."""
    x = np.random.default_rng(3).standard_normal(40)
    dx = np.random.default_rng(4).standard_normal(40)
    k = kadj.differentiate(lse)
    value, tangent = kadj.jvp(k, (x,), (dx,))
    h = 1e-6
    fd = (lse(x + h * dx) - lse(x - h * dx)) / (2 * h)
    assert value == lse(x)
    np.testing.assert_allclose(tangent, fd, rtol=1e-6)
