"""Gradients of kernels exercising each supported construct, checked against float64
central finite differences (tests/fdcheck.py)."""
import math

import numpy as np
import pytest
from numba import njit, prange

import kadj
from fdcheck import fd_check

rng = np.random.default_rng(42)


def R(*shape):
    return rng.standard_normal(shape)


@njit
def heat_step(u, u_new, alpha):
    for i in range(1, u.shape[0] - 1):
        u_new[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1])


@njit
def recurrence_inplace(y, a):
    for i in range(1, y.shape[0]):
        y[i] = a * y[i - 1] + y[i]


@njit
def horner(x, c, out):
    for i in range(x.shape[0]):
        p = c[c.shape[0] - 1]
        for k in range(c.shape[0] - 2, -1, -1):
            p = p * x[i] + c[k]
        out[i] = p


@njit
def sumsq(x):
    s = 0.0
    for i in range(x.shape[0]):
        s += x[i] * x[i]
    return math.sqrt(s)


@njit
def branchy(x, y):
    for i in range(x.shape[0]):
        if x[i] > 0.0 and x[i] < 1.5:
            y[i] = x[i] * x[i]
        elif x[i] <= -0.5:
            y[i] = -x[i]
        else:
            y[i] = math.sin(x[i])


@njit
def while_loop(x, out):
    for i in range(x.shape[0]):
        v = x[i]
        k = 0
        while k < 5:
            v = v * 0.9 + math.cos(v)
            k += 1
        out[i] = v


@njit
def breaks(x):
    s = 0.0
    for i in range(x.shape[0]):
        if x[i] > 1.2:
            break
        if x[i] < -1.0:
            continue
        s += x[i] * 2.0 + s * 0.1
    return s


@njit
def early_return(x):
    s = 0.0
    for i in range(x.shape[0]):
        s = s + x[i] ** 2
        if s > 3.0:
            return s * 2.0
    return s


@njit
def _pair(a, b):
    return a * b, a + b


@njit
def _sq(a):
    return a * a


@njit
def helpers_tuples(x, y, out):
    for i in range(x.shape[0]):
        p, q = _pair(x[i], y[i])
        out[i] = _sq(p) + q


@njit
def scratch(x, out):
    n = x.shape[0]
    tmp = np.empty(n)
    for i in range(n):
        tmp[i] = math.exp(x[i])
    for i in range(n):
        out[i] = tmp[i] * tmp[(i + 1) % n]


@njit
def stencil2d(u, v, c):
    n, m = u.shape
    for i in range(n):
        for j in range(m):
            v[i, j] = c * (u[(i + 1) % n, j] + u[i - 1, j] + u[i, (j + 1) % m]
                           + u[i, j - 1] - 4.0 * u[i, j])


@njit
def inplace_ops(x, y):
    for i in range(x.shape[0]):
        y[i] += x[i]
        y[i] *= x[i]
        y[i] -= 0.5 * x[i]
        y[i] /= (1.0 + x[i] * x[i])


@njit
def step_neg(x, out):
    acc = 0.0
    for i in range(x.shape[0] - 1, -1, -2):
        acc = acc * 0.5 + x[i]
        out[i] = acc


@njit
def minmax_abs(x, y):
    for i in range(x.shape[0]):
        y[i] = max(x[i], 0.1) + min(x[i] * 2.0, 0.3) + abs(x[i]) + np.minimum(np.maximum(x[i], -0.5), 0.5)


@njit
def gather_scatter(idx, w, x, y):
    for k in range(idx.shape[0]):
        y[idx[k]] += w[k] * x[k]


@njit
def reassigned_scalar(x, out):
    for i in range(x.shape[0]):
        t = x[i]
        t = t * t
        t = math.tanh(t) + t
        out[i] = t


@njit(parallel=True)
def par_map(x, y):
    for i in prange(x.shape[0]):
        y[i] = math.exp(-x[i] * x[i])


@njit
def newton_sqrt(a, out):
    for i in range(a.shape[0]):
        x = 1.0
        for _ in range(20):
            x = 0.5 * (x + a[i] / x)
        out[i] = x


@njit
def cond_on_scalar_reassign(x, out, alpha):
    for i in range(x.shape[0]):
        a = alpha
        if x[i] > 0:
            a = alpha * 2.0
        out[i] = a * x[i]


@njit
def min_max_three(x, y):
    for i in range(x.shape[0]):
        y[i] = min(x[i], 0.5, x[i] * x[i]) + max(x[i], -x[i], 0.1)


@njit
def float_mod(x, y):
    for i in range(x.shape[0]):
        y[i] = (x[i] * 3.0) % 1.0 + x[i] % 0.4


@njit
def scratch_2d(x, y):
    n = x.shape[0]
    t = np.zeros((n, 2))
    for i in range(n):
        t[i, 0] = x[i] * 2.0
        t[i, 1] = x[i] * x[i]
    for i in range(n):
        y[i] = t[i, 0] * t[i, 1]


@njit
def reused_loop_variable(x, y, a):
    for i in range(x.shape[0]):
        y[i] = a * x[i]
    for i in range(x.shape[0]):
        y[i] = y[i] * y[i] + x[i]


CASES = [
    ("min_max_three", min_max_three, lambda: (np.array([0.3, -0.8, 1.3, 0.6]), np.zeros(4))),
    ("float_mod", float_mod, lambda: (np.array([0.31, 0.52, 1.13]), np.zeros(3))),
    ("scratch_2d", scratch_2d, lambda: (np.array([0.31, 0.52, 1.13]), np.zeros(3))),
    ("reused_loop_variable", reused_loop_variable, lambda: (R(5), np.zeros(5), 0.7)),
    ("heat_step", heat_step, lambda: (R(9), np.zeros(9), 0.1)),
    ("recurrence_inplace", recurrence_inplace, lambda: (R(7), 0.7)),
    ("horner", horner, lambda: (R(5), R(4), np.zeros(5))),
    ("sumsq", sumsq, lambda: (R(6),)),
    ("branchy", branchy, lambda: (np.array([0.3, 1.0, -0.7, -0.2, 1.8, 0.6]), np.zeros(6))),
    ("while_loop", while_loop, lambda: (R(4), np.zeros(4))),
    ("breaks", breaks, lambda: (np.array([0.3, -1.5, 0.8, 0.2, 1.6, 0.4]),)),
    ("early_return", early_return, lambda: (np.array([0.5, 0.9, 1.1, 1.3, 0.2]),)),
    ("early_return_none", early_return, lambda: (np.array([0.5, 0.2, 0.3]),)),
    ("helpers_tuples", helpers_tuples, lambda: (R(5), R(5), np.zeros(5))),
    ("scratch", scratch, lambda: (R(6) * 0.3, np.zeros(6))),
    ("stencil2d", stencil2d, lambda: (R(4, 5), np.zeros((4, 5)), 0.3)),
    ("inplace_ops", inplace_ops, lambda: (R(5), R(5))),
    ("step_neg", step_neg, lambda: (R(7), np.zeros(7))),
    ("minmax_abs", minmax_abs, lambda: (np.array([0.31, -0.72, 0.05, 1.3, -1.1]),
                                        np.zeros(5))),
    ("gather_scatter", gather_scatter, lambda: (np.array([0, 2, 2, 1, 0]), R(5), R(5),
                                                np.zeros(3))),
    ("reassigned_scalar", reassigned_scalar, lambda: (R(5), np.zeros(5))),
    ("par_map", par_map, lambda: (R(6), np.zeros(6))),
    ("newton_sqrt", newton_sqrt, lambda: (np.array([0.5, 2.0, 3.0]), np.zeros(3))),
    ("cond_on_scalar_reassign", cond_on_scalar_reassign,
     lambda: (np.array([0.5, -0.3, 1.2]), np.zeros(3), 0.7)),
]


@pytest.mark.parametrize("name,kernel,make", CASES, ids=[c[0] for c in CASES])
def test_gradient_matches_finite_differences(name, kernel, make):
    k = kadj.differentiate(kernel)
    fd_check(k, make(), rtol=1e-5, atol=1e-8)


def test_float32_stays_float32():
    k = kadj.differentiate(heat_step)
    u = R(8).astype(np.float32)
    args = (u, np.zeros(8, np.float32), np.float32(0.1))
    plan = k.adjoint_plan(*args)
    bufs = [np.zeros(8, np.float32), np.ones(8, np.float32), np.zeros(1, np.float32)]
    k.adjoint(*args, *bufs)
    assert all(b.dtype == np.float32 for b in bufs)
    assert "float64" not in k.adjoint_source(*args).replace("np.float64", "")
    ref = [np.zeros(8), np.ones(8), np.zeros(1)]
    k.adjoint(u.astype(np.float64), np.zeros(8), 0.1, *ref)
    np.testing.assert_allclose(bufs[0], ref[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bufs[2], ref[2], rtol=1e-4)
    assert plan.adjoint_args == (0, 1, 2)


@njit
def _returns_pair(x):
    s = 0.0
    for i in range(x.shape[0]):
        s += x[i]
    return s, s * s


def test_tuple_return_is_refused():
    with pytest.raises(kadj.DifferentiationError, match="single float"):
        kadj.differentiate(_returns_pair).adjoint_plan(np.ones(3))


# ---- regressions: values of inner loops used after them -------------------------------
@njit
def inner_index_after_loop(x, out):
    for i in range(1, x.shape[0]):
        for j in range(i):
            pass
        out[i] = x[j] * x[i]


@njit
def _find_first(x, t):
    for k in range(x.shape[0]):
        if x[k] > t:
            return k
    return x.shape[0] - 1


@njit
def helper_search_index(x, out, t):
    for i in range(x.shape[0]):
        k = _find_first(x, x[i] + t)
        out[i] = x[k] - x[i]


@njit
def for_else_inner(x, out, thr):
    for i in range(x.shape[0]):
        for j in range(x.shape[0]):
            if x[j] > thr:
                out[i] = x[j] * x[i]
                break
        else:
            out[i] = -x[i]


@njit
def break_two_levels(x, out):
    for i in range(x.shape[0]):
        for j in range(x.shape[0]):
            for k in range(x.shape[0]):
                if x[k] > x[i] + x[j]:
                    break
            out[i] += x[k] * x[j]


_u = np.random.default_rng(7).uniform(0.0, 1.0, 7)
REGRESSIONS = [
    ("inner_index_after_loop", inner_index_after_loop, lambda: (R(5), np.zeros(5))),
    ("helper_search_index", helper_search_index,
     lambda: (np.array([0.31, 0.12, 0.53, 0.24, 0.45]), np.zeros(5), 0.05)),
    ("for_else_taken", for_else_inner, lambda: (_u.copy(), np.zeros(7), 0.8)),
    ("for_else_not_taken", for_else_inner, lambda: (_u.copy(), np.zeros(7), 5.0)),
    ("break_two_levels", break_two_levels, lambda: (_u.copy(), R(7))),
]


@pytest.mark.parametrize("name,kernel,make", REGRESSIONS, ids=[c[0] for c in REGRESSIONS])
def test_regressions(name, kernel, make):
    fd_check(kadj.differentiate(kernel), make(), rtol=1e-5, atol=1e-8)


def test_negative_argnums():
    x, y = R(4), R(4)
    g1 = kadj.grad(sumsq_pair, argnums=-1)(x, y)
    g2 = kadj.grad(sumsq_pair, argnums=1)(x, y)
    np.testing.assert_array_equal(g1, g2)
    np.testing.assert_allclose(g2, 2.0 * y * x * x, rtol=1e-12)


@njit
def sumsq_pair(x, y):
    s = 0.0
    for i in range(x.shape[0]):
        s += (x[i] * y[i]) ** 2
    return s


@njit
def loop_returns_first_iteration(x, a):
    for i in range(x.shape[0]):
        return a * x[i]
    return 0.0


@njit
def loop_breaks_first_iteration(x, y):
    s = 1.0
    for i in range(x.shape[0]):
        s = s * x[i]
        break
    y[0] = s


@pytest.mark.parametrize("kernel,make", [
    (loop_returns_first_iteration, lambda: (R(4), 0.5)),
    (loop_returns_first_iteration, lambda: (np.zeros(0), 0.5)),
    (loop_breaks_first_iteration, lambda: (R(4), np.zeros(1))),
], ids=["return", "return_empty", "break"])
def test_loop_without_second_iteration(kernel, make):
    fd_check(kadj.differentiate(kernel), make(), rtol=1e-6, atol=1e-9)


@njit
def return_after_nested_if_with_loop(x, y):
    n = x.shape[0]
    v = 0.5
    if x[0] > 0.3:
        y[1] = x[1] * x[1]
        if x[1] > 0.2:
            for j in range(n):
                v = y[j] * x[2]
    else:
        return 0.0
    return v


def test_return_reached_once_after_nested_branches():
    # the return block must be structured once: its adjoint was counted twice
    rng = np.random.default_rng(1)
    args = (rng.uniform(0.35, 1.0, 5), rng.uniform(-0.5, 0.5, 5))
    fd_check(kadj.differentiate(return_after_nested_if_with_loop), args, rtol=1e-6,
             atol=1e-9)


@njit
def rebind_scalar(y, s):
    s = 2.0 * s
    y[0] = s * s


@njit
def rebind_in_branch(y, s):
    if y.shape[0] > 1:
        s = 2.0 * s + y[1]
    y[0] = s


@njit
def rebind_index(x, y, i):
    a = x[i] * x[i]
    i = i + 1
    b = x[i] * x[i]
    y[0] = a + 2.0 * b


@pytest.mark.parametrize("kernel, make", [
    (rebind_scalar, lambda: (np.zeros(3), 0.6)),
    (rebind_in_branch, lambda: (np.array([0.0, 0.3, 0.1]), 0.6)),
    (rebind_in_branch, lambda: (np.array([0.0]), 0.6)),
    (rebind_index, lambda: (np.array([0.2, 0.5, -0.7]), np.zeros(2), 0)),
])
def test_an_argument_assigned_once_holds_two_values(kernel, make):
    # an argument assigned in the body holds its caller's value before and the new one
    # after: the adjoint of the new value is consumed at the assignment (a regression:
    # assigned once under an if, it was not, and 's = 2.0 * s' gave 3x the gradient)
    fd_check(kadj.differentiate(kernel), make())


@njit
def _iterated(v, c=1.5, m=2, s=0.25):
    r = v
    for _ in range(m):
        r = math.sin(r) * c + s * r
    return r


@njit
def helper_keywords(x, y, a):
    # keyword arguments in any order, defaults left in the gaps between them
    for i in range(x.shape[0]):
        y[i] = _iterated(x[i], c=a, m=3) + _iterated(x[i], s=a) + \
            _iterated(x[i], a, s=0.5 * a)


@njit
def _keyword_only(v, *, c=1.0):
    return v * c


@njit
def helper_keyword_only(x, y):
    for i in range(x.shape[0]):
        y[i] = _keyword_only(x[i], c=2.0)


def test_helpers_called_with_keyword_arguments():
    x = rng.uniform(-1.0, 1.0, 7)
    fd_check(kadj.differentiate(helper_keywords), (x, np.zeros(7), 0.8))
    with pytest.raises(kadj.DifferentiationError, match="not a plain one"):
        kadj.differentiate(helper_keyword_only).adjoint_source(x, np.zeros(7))


@njit
def piecewise_constant_arm(x, y, out):
    # v holds a piecewise-constant value in one arm (no derivative) and a
    # differentiable one in the other: the first arm's assignment is active only
    # because the second's is
    for i in range(x.shape[0]):
        if x[i] > 0.0:
            v = y[i] // 0.7
        elif x[i] > -0.5:
            v = np.sign(y[i]) + math.floor(y[i] * 3.0)
        else:
            v = 2.0 * y[i]
        out[i] = v * y[i] + x[i]


def test_piecewise_constant_values_in_one_branch():
    """v = y // 0.7 (or floor, sign) in one arm, v = 2.0 * y in another: the
    piecewise-constant arms contribute nothing (they were refused, "no derivative
    rule for floordiv()"); adjoint, jvp and kadj.grad against finite differences."""
    x = np.array([0.4, -0.3, -0.9, 1.2, -0.2, -2.0])
    y = np.array([1.13, -0.41, 0.66, 2.29, 0.31, -1.44])   # away from the jumps
    args = (x, y, np.zeros(6))
    k = kadj.differentiate(piecewise_constant_arm)
    fd_check(k, args)
    dx, dy = rng.standard_normal(6), rng.standard_normal(6)
    out, dout = np.zeros(6), np.zeros(6)
    k.jvp(x, y, out, dx, dy, dout)
    h = 1e-6
    plus, minus = np.zeros(6), np.zeros(6)
    piecewise_constant_arm(x + h * dx, y + h * dy, plus)
    piecewise_constant_arm(x - h * dx, y - h * dy, minus)
    np.testing.assert_allclose(dout, (plus - minus) / (2 * h), rtol=1e-6, atol=1e-8)


@njit
def running_min_from_inf(x, y):
    m = math.inf                # a module's number, the variable assigned again below
    for i in range(x.shape[0]):
        m = min(m, x[i])
    p = np.pi
    for i in range(y.shape[0]):
        p = p * 0.5 + y[i]
    return m * m + p


def test_a_module_number_given_to_a_reassigned_variable():
    """m = math.inf, then m = min(m, x[i]): the first assignment was dropped (m
    started from the declared 0.0, so an all-positive x gave a zero gradient and a
    wrong value)."""
    x = np.array([0.3, 0.2, 0.5, 0.9])
    y = np.array([0.1, -0.4, 0.7])
    g = kadj.grad(running_min_from_inf, argnums=(0, 1))(x, y)
    np.testing.assert_allclose(g[0], [0.0, 0.4, 0.0, 0.0])
    np.testing.assert_allclose(g[1], [0.25, 0.5, 1.0])
    k = kadj.differentiate(running_min_from_inf)
    fd_check(k, (x, y))
    value = k.adjoint(x, y, np.zeros(4), np.zeros(3), adj_return=1.0)
    assert value == pytest.approx(running_min_from_inf(x, y))


@njit
def numpy_integer_casts(x, out):
    for i in range(x.shape[0]):
        out[i] = x[i] * np.int32(x[i] * 3.0) + x[i] * np.int64(x[i] * 2.0) + \
            x[i] * np.round(x[i] * 1.5)


def test_numpy_integer_casts_and_round_carry_no_derivative():
    """np.int32(v), np.int64(v), np.round(v) of a float: piecewise constant, like
    int(v) and round(v) (they were refused: "no derivative rule for int32()")."""
    x = np.array([0.77, -1.1, 1.37, 2.05])        # away from the jumps
    fd_check(kadj.differentiate(numpy_integer_casts), (x, np.zeros(4)))


@njit
def diagnostics_scratch(x, out):
    diag = np.empty(x.shape[0])         # written for a look, never read by the kernel
    s = 0.0
    for i in range(x.shape[0]):
        diag[i] = x[i] * 2.0
        s += math.sin(x[i])
        out[i] = s * x[i]
    return s


def test_a_scratch_array_never_read_gets_no_adjoint():
    """What is stored into a scratch array the kernel never loads reaches nothing:
    no adjoint array (zeroed, consumed, its zeros added into adj_x), no copy."""
    args = (np.linspace(-1.0, 1.0, 7), np.zeros(7))
    k = kadj.differentiate(diagnostics_scratch)
    src = k.adjoint_source(*args)
    assert "adj_diag" not in src and "diag = " not in src, src
    fd_check(k, args)
