"""Derivative rules written like ordinary Python, scratch arrays with a positional dtype,
and the messages of some refusals.

A rule is evaluated once, on symbolic expressions standing for the kernel's values
(:class:`kadj.ops.Sym`): a Python ``if``/``and``/``or`` on them must be refused (it
would be decided once, for every element), comparisons and ``**`` build expressions,
and any error a rule raises is reported naming the rule, the function and the kernel.
Gradients are compared with analytic formulas and float64 finite differences.
"""
import inspect
import math
import os
import sys

import numpy as np
import pytest
from numba import njit

import kadj
from kadj import ops, rules

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fdcheck import fd_check  # noqa: E402

THIS_FILE = os.path.basename(__file__)


# ---- the symbolic vocabulary ------------------------------------------------------------
def test_sym_truth_value_is_refused():
    x, out = ops.var("x"), ops.var("out")
    for cond in (x, out == x, x > 0.0):
        with pytest.raises(kadj.DifferentiationError) as info:
            bool(cond)
        assert "where" in str(info.value) and "What you can do" in str(info.value)
    with pytest.raises(kadj.DifferentiationError):
        max(x, 0.0)  # (compares, then asks for a truth value)


def test_sym_comparisons_build_conditions():
    x, y = ops.var("x"), ops.var("y")
    pairs = [(x == y, ops.eq(x, y)), (x != 1.0, ops.ne(x, 1.0)), (x < y, ops.lt(x, y)),
             (x <= 2.0, ops.le(x, 2.0)), (0.5 < x, ops.gt(x, 0.5)),
             (x >= np.float64(3.0), ops.ge(x, 3.0))]
    for got, want in pairs:
        assert isinstance(got, ops.Sym) and ops.same(got, want), (got, want)
    assert not ops.same(x == y, ops.ne(x, y))
    # structural equality is ops.same, and hashing stays structural
    assert ops.same(ops.var("x") * 2.0, x * 2.0) and not ops.same(x * 2.0, x * 3.0)
    assert hash(ops.var("x") * 2.0) == hash(x * 2.0)
    assert (x == None) is False  # noqa: E711 - an unrelated object is simply unequal


def test_sym_power_operator():
    a, k = ops.var("a"), ops.var("k")
    assert ops.same(a ** (k - 1.0), ops.pow(a, k - 1.0))
    assert ops.same(2.0 ** a, ops.pow(2.0, a))
    assert ops.pow(2.0, 3.0) == 8.0  # numbers stay numbers


# ---- custom rules in kernels ------------------------------------------------------------
@njit
def clamp01(x):
    return min(max(x, 0.0), 1.0)


@njit
def clamp_loss(x):
    s = 0.0
    for i in range(x.shape[0]):
        s += clamp01(x[i]) * (i + 1.0)
    return s


def _rule_line(fn):
    return f"{THIS_FILE}:{inspect.getsourcelines(fn)[1]}"


def test_rule_branching_in_python_is_refused_then_where_works():
    x = np.array([0.2, 0.5, 0.7, 1.5, -0.3])
    try:
        def python_if(g, out, v):
            return (g if out == v else 0.0,)

        kadj.register_adjoint(clamp01)(python_if)
        with pytest.raises(kadj.DifferentiationError) as info:
            kadj.grad(clamp_loss)(x)
        msg = str(info.value)
        for part in ("clamp_loss", "clamp01", _rule_line(python_if), "kadj.ops.where",
                     "What you can do"):
            assert part in msg, f"{part!r} missing from\n{msg}"

        @kadj.register_adjoint(clamp01)
        def symbolic(g, out, v):  # `==` on the arguments builds a runtime condition
            return (ops.where(out == v, g, 0.0),)

        got = kadj.grad(clamp_loss)(x)
        # d/dx_i of clamp(x_i) * (i + 1): i + 1 inside [0, 1], else 0
        np.testing.assert_allclose(got, np.where((x >= 0) & (x <= 1),
                                                 np.arange(1.0, 6.0), 0.0), rtol=1e-14)
    finally:
        rules.unregister(clamp01)


@njit
def powi(a, k):
    return a ** k


@njit
def powi_sum(x):
    s = 0.0
    for i in range(x.shape[0]):
        s += powi(x[i], i + 1)
    return s


def test_rule_with_power_operator_gives_the_gradient():
    x = np.array([1.1, 0.7, 1.3, 0.9])
    try:
        @kadj.register_adjoint(powi)
        def _(g, out, a, k):
            return (g * k * a ** (k - 1), None)

        got = kadj.grad(powi_sum)(x)
        k = np.arange(1.0, 5.0)
        np.testing.assert_allclose(got, k * x ** (k - 1), rtol=1e-13)
        h = 1e-6
        fd = [(powi_sum(x + h * e) - powi_sum(x - h * e)) / (2 * h) for e in np.eye(4)]
        np.testing.assert_allclose(got, fd, rtol=1e-7)
    finally:
        rules.unregister(powi)


@njit
def softsign(v):
    return v / (1.0 + abs(v))


@njit
def softsign_layer(x, y):
    for i in range(x.shape[0]):
        y[i] = softsign(x[i]) * 2.0


def test_rule_raising_an_error_is_reported_with_rule_function_and_kernel():
    args = (np.array([0.3, -0.4]), np.zeros(2))
    try:
        def uses_math(g, out, v):
            return (g / (1.0 + math.fabs(v)) ** 2,)  # math cannot take a symbolic value

        kadj.register_adjoint(softsign)(uses_math)
        with pytest.raises(kadj.DifferentiationError) as info:
            kadj.differentiate(softsign_layer).adjoint_plan(*args)
        msg = str(info.value)
        for part in ("softsign_layer", "softsign", _rule_line(uses_math), "TypeError",
                     "kadj.ops", "What you can do"):
            assert part in msg, f"{part!r} missing from\n{msg}"

        def raises(g, out, v):
            raise ValueError("an arbitrary failure")

        kadj.register_adjoint(softsign)(raises)
        with pytest.raises(kadj.DifferentiationError) as info:
            kadj.differentiate(softsign_layer).adjoint_plan(*args)
        msg = str(info.value)
        for part in ("softsign_layer", _rule_line(raises), "ValueError: an arbitrary failure",
                     "What you can do"):
            assert part in msg, f"{part!r} missing from\n{msg}"
    finally:
        rules.unregister(softsign)


# ---- scratch arrays with a positional dtype ----------------------------------------------
@njit
def int_counter_scratch(x, y):
    c = np.zeros(1, np.int64)
    for i in range(x.shape[0]):
        c[0] += 1
        y[i] = x[i] * c[0]


@njit
def dtype_scratch(x, y):
    w = np.zeros(x.shape, x.dtype)
    v = np.empty((x.shape[0], 2), np.float64)
    u = np.ones_like(x, dtype=x.dtype)
    for i in range(x.shape[0]):
        w[i] = x[i] * 3.0
        v[i, 0] = x[i] * x[i]
        v[i, 1] = v[i, 0] * x[i] + u[i]
        y[i] = w[i] * w[0] + v[i, 1]


def test_integer_scratch_with_positional_dtype():
    k = kadj.differentiate(int_counter_scratch)
    x = np.array([0.5, -1.0, 2.0])
    assert "np.int64" in k.adjoint_source(x, np.zeros(3))
    adj_x = np.zeros(3)
    k.adjoint(x, np.zeros(3), adj_x, np.ones(3))
    np.testing.assert_array_equal(adj_x, [1.0, 2.0, 3.0])  # y_i = (i + 1) x_i
    fd_check(k, (x, np.zeros(3)))


def test_float_scratch_with_dtype_from_argument_and_global():
    fd_check(kadj.differentiate(dtype_scratch), (np.array([0.4, -0.8, 1.2]), np.zeros(3)))


# ---- messages of refusals -----------------------------------------------------------------
@njit
def uses_transpose(x, y):
    xt = x.T  # <- refused
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            y[j, i] = xt[j, i]


@njit
def uses_reshape(x, y):
    v = y.reshape(y.size)  # <- refused
    for i in range(v.shape[0]):
        v[i] = x[i]


@njit
def uses_arange(x, y):
    idx = np.arange(x.shape[0])  # <- refused
    for i in range(x.shape[0]):
        y[idx[i]] = x[idx[i]] * x[i]


@njit
def uses_full(x, y):
    w = np.full(x.shape[0], 2.0)  # <- refused
    for i in range(x.shape[0]):
        w[i] = w[i] * x[i]
        y[i] = w[i]


@pytest.mark.parametrize("kernel,args,expected", [
    (uses_transpose, (np.ones((2, 3)), np.zeros((3, 2))), ("'.T'", "x[j, i]")),
    (uses_reshape, (np.ones(4), np.zeros(4)), ("'.reshape'", "computed indices")),
    (uses_arange, (np.ones(4), np.zeros(4)), ("np.arange() is not supported",
                                              "range(", "pass it in")),
    (uses_full, (np.ones(4), np.zeros(4)), ("np.full() is not supported", "np.empty",
                                            "loop")),
], ids=["T", "reshape", "arange", "full"])
def test_refusal_messages(kernel, args, expected):
    with pytest.raises(kadj.DifferentiationError) as info:
        kadj.differentiate(kernel).adjoint_plan(*args)
    msg = str(info.value)
    lines, first = inspect.getsourcelines(kernel.py_func)
    line = first + next(j for j, t in enumerate(lines) if "# <- refused" in t)
    assert kernel.__name__ in msg and f"{THIS_FILE}:{line}" in msg, msg
    remedy = msg.split("What you can do:", 1)[1].split("\n", 1)[0]
    assert len(remedy.strip()) > 20, msg
    for part in expected:
        assert part in msg, f"{part!r} missing from\n{msg}"
    assert "register_adjoint" not in msg and "aliased" not in msg, msg
