"""Cheaper host tape code (kadj/tape_alloc.py): unit-step trip counts written as
arithmetic, later straight-line reservations joined to an earlier one, and a tape
allocated at its first reservation.  The arithmetic must equal ``_trips`` for every
start, stop and step of 1 or -1; the adjoints that allocate their tape once (or at the
first reservation, growing it where a later loop's count is known only there) must
compute the same gradients as finite differences, among them at sizes where the
allocation is 0 entries or more than the growable tape's starting size."""
import itertools

import numpy as np
import pytest
from numba import njit

import kadj
from kadj.lowering import GROWABLE_START
from kadj.runtime_helpers import _reserve, _trips
from kadj.tape_alloc import unit_step_trips


@pytest.mark.parametrize("step", [1, -1])
def test_unit_step_trips_equals_trips(step):
    env = {"a": 0, "b": 0, "max": max}
    for lo, hi in [("a", "b"), ("0", "b"), ("a", "-1"), ("(a - 2)", "b + 1"),
                   ("a * 2", "(b)"), ("3", "-2")]:
        text = unit_step_trips(f"2 * _trips({lo}, {hi}, {step}) + 1")
        assert "_trips" not in text, text
        for a, b in itertools.product(range(-4, 5), repeat=2):
            env.update(a=a, b=b)
            want = 2 * _trips.py_func(eval(lo, env), eval(hi, env), step) + 1
            assert eval(text, env) == want, (text, a, b)


def test_other_steps_and_names_are_kept():
    assert unit_step_trips("_trips(0, n, 2)") == "_trips(0, n, 2)"
    assert unit_step_trips("x_trips(0, n, 1)") == "x_trips(0, n, 1)"
    assert unit_step_trips("_trips(0, _trips(0, n, 1), s)") == "_trips(0, max(0, n), s)"


def test_reserve_grows_an_empty_tape():
    t = _reserve(np.empty(0), 5)
    assert t.shape[0] >= 5


@njit
def _reserve_compiled(tape, need):
    return _reserve(tape, need)


@pytest.mark.parametrize("grow", [_reserve_compiled, _reserve_compiled.py_func],
                         ids=["compiled", "python"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int64])
def test_reserve_keeps_the_tape_or_doubles_it_keeping_its_entries(grow, dtype):
    tape = np.arange(6).astype(dtype)
    assert grow(tape, 6) is tape or np.shares_memory(grow(tape, 6), tape)
    assert np.shares_memory(grow(tape, np.int32(3)), tape)
    bigger = grow(tape, 7)
    assert bigger.dtype == tape.dtype and bigger.shape == (12,)
    assert not np.shares_memory(bigger, tape)
    np.testing.assert_array_equal(bigger[:6], tape)
    assert grow(tape, 100).shape == (192,)
    assert grow(np.empty(0, dtype), 5).shape == (8,)
    assert grow(np.empty(0, dtype), 1).shape == (1,)


@njit
def _horner(c, x, y):
    for i in range(x.shape[0]):
        acc = c[c.shape[0] - 1]
        for k in range(c.shape[0] - 2, -1, -1):
            acc = acc * x[i] + c[k]
        y[i] = acc


@njit
def _two_loops(x, y):
    m = x[0]
    for i in range(1, x.shape[0]):
        if x[i] > m:
            m = x[i]
    s = 0.0
    for i in range(x.shape[0]):
        y[i] = np.exp(x[i] - m)
        s += y[i]
    for i in range(x.shape[0]):
        y[i] /= s


def _fd_vjp(f, args, outs, wrt, w, eps=1e-6):
    """Finite-difference gradient of sum(w * output) with respect to args[wrt]."""
    g = np.zeros_like(args[wrt])
    for j in range(g.size):
        vals = []
        for sgn in (1, -1):
            a = [v.copy() for v in args]
            a[wrt].flat[j] += sgn * eps
            o = np.zeros_like(args[outs])
            a[outs] = o
            f(*a)
            vals.append(np.sum(w * o))
        g.flat[j] = (vals[0] - vals[1]) / (2 * eps)
    return g


@pytest.mark.parametrize("nc,nx", [(1, 3), (2, 4), (6, 5), (3, 700)])
def test_horner_tape_allocated_at_first_reservation(nc, nx):
    # nc = 1: the inner loop never runs (a tape of 0 entries); (3, 700): 1400 entries,
    # more than the growable tape's starting size
    k = kadj.differentiate(_horner)
    rng = np.random.default_rng(nc * 1000 + nx)
    c, x, y = rng.normal(size=nc), rng.uniform(-1, 1, nx), np.zeros(nx)
    src = k.adjoint_source(c, x, y)
    assert "_reserve(" not in src and "_trips(" not in src, src
    assert "_tape_f64 = _kept_array(_keep_bytes, " in src and f"max({GROWABLE_START}" not in src
    w = rng.normal(size=nx)
    adj_c, adj_x = np.zeros(nc), np.zeros(nx)
    k.adjoint(c.copy(), x.copy(), np.zeros(nx), adj_c, adj_x, w.copy())
    if nx <= 5:
        np.testing.assert_allclose(adj_c, _fd_vjp(_horner.py_func, [c, x, y], 2, 0, w),
                                   rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose(adj_x, _fd_vjp(_horner.py_func, [c, x, y], 2, 1, w),
                                   rtol=1e-6, atol=1e-8)
    else:   # analytic: d y_i / d c_k = x_i ** k
        want = (w[:, None] * x[:, None] ** np.arange(nc)[None, :]).sum(axis=0)
        np.testing.assert_allclose(adj_c, want, rtol=1e-9, atol=1e-9)


def _check_two_loops(kernel, x, w, rng):
    n = x.shape[0]
    adj_x = np.zeros(n)
    kernel.adjoint(x.copy(), np.zeros(n), adj_x, w.copy())
    f = kernel.py_func
    if n <= 7:
        np.testing.assert_allclose(adj_x, _fd_vjp(f, [x, np.zeros(n)], 1, 0, w),
                                   rtol=1e-6, atol=1e-8)
    else:   # a directional derivative against central differences
        d = rng.normal(size=n)
        hi, lo = np.zeros(n), np.zeros(n)
        f(x + 1e-6 * d, hi)
        f(x - 1e-6 * d, lo)
        fd = np.sum(w * (hi - lo)) / 2e-6
        assert abs(adj_x @ d - fd) <= 1e-6 * max(1.0, abs(fd))


@pytest.mark.parametrize("n", [1, 2, 7, 1500])
def test_straight_line_loops_allocated_once(n):
    # the first reservation allocates the tape; the last loop's reservation, whose
    # count (x.shape[0]) is known at the first f64 one, joins it (kadj/tape_alloc.py
    # merge_later_reserves): one f64 allocation, no growth, past the growable tape's
    # starting size when n = 1500.  (The running maximum's position, saved before its
    # loop, is restored where nothing reads it: no i64 tape, kadj/dead_saves.py.)
    k = kadj.differentiate(_two_loops)
    rng = np.random.default_rng(n)
    x = rng.uniform(-1, 1, n)
    src = k.adjoint_source(x, np.zeros(n))
    assert "_tape_f64 = _kept_array(_keep_bytes, 1 + max(0, x.shape[0]), np.float64, _keep_need, " in src, src
    assert "_tape_i64" not in src and "_reserve" not in src, src
    _check_two_loops(k, x, rng.normal(size=n), rng)


@njit
def _two_loops_counted(x, y):
    m = x[0]
    for i in range(1, x.shape[0]):
        if x[i] > m:
            m = x[i]
    s = 0.0
    for i in range(x.shape[0]):
        y[i] = np.exp(x[i] - m)
        s += y[i]
    c = 0
    for i in range(x.shape[0]):
        if y[i] > 0.5:
            c += 1
    for i in range(c):       # a count the first reservation cannot know
        y[i] /= s


@pytest.mark.parametrize("n", [1, 2, 7, 1500])
def test_later_loop_of_data_dependent_count_grows_the_tape(n):
    k = kadj.differentiate(_two_loops_counted)
    rng = np.random.default_rng(n)
    x = rng.uniform(-1, 1, n)
    src = k.adjoint_source(x, np.zeros(n))
    assert "_tape_f64 = _kept_array(_keep_bytes, " in src and "_tape_f64 = _reserve(" in src, src
    _check_two_loops(k, x, rng.normal(size=n), rng)


@njit
def _two_counts(x, y):
    n = x.shape[0]
    s = 0.0
    for i in range(n):
        s = 0.5 * s * s + x[i]
        y[i] = s
    m = n - 2
    for i in range(m, -1, -1):      # records the y[i] it reads, then overwrites
        y[i] = y[i] * y[i] + y[i + 1]


@pytest.mark.parametrize("n", [1, 2, 9, 3000])
def test_later_count_of_a_variable_defined_before_the_first_reservation(n):
    # the second loop's count ``m = n - 2`` reads ``n = x.shape[0]``, assigned once
    # before the first reservation: the later reservation joins the first (one
    # allocation of the exact size, no growth)
    from kadj.testing import check_grad
    k = kadj.differentiate(_two_counts)
    rng = np.random.default_rng(n)
    args = (rng.uniform(-0.5, 0.5, n), np.zeros(n))
    src = k.adjoint_source(*args)
    assert "2 * max(0, n) + 2 * max(0, (n - 2) + 1)" in src and "_reserve" not in src, src
    check_grad(k, args)
