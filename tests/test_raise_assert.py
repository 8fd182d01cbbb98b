"""``raise`` and ``assert`` in kernels (input validation): the forward keeps them, the
adjoint differentiates the path that does not raise and checks nothing.  Gradients are
compared with float64 central finite differences (tests/fdcheck.py) of the
bounds-checked kernels (tests/conftest.py).  A raise reached on every path is refused
(tests/test_frontend_errors.py).

PYTEST_DONT_REWRITE: the kernels' own ``assert`` statements must stay plain Python
asserts (pytest's rewriting would change the kernels under test).
"""
import math
import re

import numpy as np
import pytest
from numba import njit

import kadj
from fdcheck import fd_check


@njit
def assert_length(x, y):
    n = x.shape[0]
    assert n > 0
    for i in range(n):
        y[i] = x[i] * x[i]


@njit
def shapes_checked(x, y):
    if x.shape[0] != y.shape[0]:
        raise ValueError("x and y differ in length")
    for i in range(x.shape[0]):
        y[i] = math.exp(x[i])


@njit
def raise_in_loop(x, y):
    for i in range(x.shape[0]):
        if x[i] < -10.0:
            raise ValueError("x too small")
        y[i] = x[i] * 3.0 + math.sin(x[i])


@njit
def assert_message_in_loop(x, y):
    s = 0.0
    for i in range(x.shape[0]):
        assert x[i] == x[i], "NaN input"
        s += x[i] ** 2
    y[0] = s


@njit
def raise_then_return(x):
    if x.shape[0] == 0:
        raise ValueError("empty input")
    s = 0.0
    for i in range(x.shape[0]):
        s += x[i] * x[i]
    return s


@njit
def raise_in_else_of_elif(x, y):
    for i in range(x.shape[0]):
        if x[i] > 0.0:
            y[i] = x[i]
        elif x[i] > -100.0:
            y[i] = x[i] * x[i]
        else:
            raise ValueError("x below -100")


@njit
def raise_in_while(x, y):
    z = x[0]
    k = 0
    while abs(z) > 1e-3:
        z = 0.5 * z + 0.1 * z * x[1]
        k += 1
        if k > 1000:
            raise RuntimeError("no convergence")
    y[0] = z + x[1] * k


@njit
def raise_beside_break(x, y):
    s = 0.0
    for i in range(x.shape[0]):
        if x[i] > 5.0:
            raise ValueError("x too large")
        if x[i] > 1.0:
            break
        s += x[i] * x[i]
    y[0] = s


def _v(*xs):
    return np.array(xs, dtype=np.float64)


CASES = [
    ("assert_length", assert_length, lambda: (_v(0.3, -0.7, 1.2, 0.4), np.zeros(4))),
    ("shapes_checked", shapes_checked, lambda: (_v(0.3, -0.7, 1.2, 0.4), np.zeros(4))),
    ("raise_in_loop", raise_in_loop, lambda: (_v(0.3, -0.7, 1.2, 0.4), np.zeros(4))),
    ("assert_message_in_loop", assert_message_in_loop,
     lambda: (_v(0.3, -0.7, 1.2, 0.4), np.zeros(1))),
    ("raise_then_return", raise_then_return, lambda: (_v(0.3, -0.7, 1.2, 0.4),)),
    ("raise_in_else_of_elif", raise_in_else_of_elif,
     lambda: (_v(0.3, -0.7, 1.2, 0.4), np.zeros(4))),
    ("raise_in_while", raise_in_while, lambda: (_v(0.8, 0.3), np.zeros(1))),
    ("raise_beside_break", raise_beside_break,
     lambda: (_v(0.3, -0.9, 1.8, 0.7), np.zeros(1))),
]


@pytest.mark.parametrize("name,kernel,make", CASES, ids=[c[0] for c in CASES])
def test_gradient_matches_finite_differences(name, kernel, make):
    fd_check(kadj.differentiate(kernel), make(), rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("kernel,args,exc", [
    (shapes_checked, (_v(0.3, 0.2), np.zeros(3)), ValueError),
    (raise_in_loop, (_v(0.3, -20.0), np.zeros(2)), ValueError),
    (assert_length, (np.zeros(0), np.zeros(0)), AssertionError),
], ids=["raise_at_entry", "raise_in_loop", "assert"])
def test_the_forward_still_raises(kernel, args, exc):
    k = kadj.differentiate(kernel)
    with pytest.raises(exc):
        k(*args)


def test_the_adjoint_has_no_raise():
    src = kadj.differentiate(raise_in_loop).adjoint_source(_v(0.3, 0.2), np.zeros(2))
    code = [ln.split("#")[0] for ln in src.splitlines()]
    assert not any(re.search(r"\braise\b", ln) or "-10.0" in ln for ln in code), src


@pytest.mark.parametrize("kernel,args,exc", [
    (shapes_checked, (_v(0.3, 0.2), np.zeros(3)), ValueError),
    (raise_in_loop, (_v(0.3, -20.0), np.zeros(2)), ValueError),
    (assert_length, (np.zeros(0), np.zeros(0)), AssertionError),
], ids=["raise_at_entry", "raise_in_loop", "assert"])
def test_jvp_raises_as_the_forward_does_before_changing_anything(kernel, args, exc):
    # kernel.jvp runs the forward: it raises where the forward would, and the
    # arguments keep their values (the check runs the forward on copies first)
    k = kadj.differentiate(kernel)
    before = [np.copy(a) for a in args]
    tangents = [np.ones_like(a) for a in args]
    with pytest.raises(exc):
        k.jvp(*args, *tangents)
    assert all(np.array_equal(a, b) for a, b in zip(args, before))
    assert all(np.all(t == 1.0) for t in tangents)
    assert k.jvp_source(*args) and k.adjoint_plan(*args).forward_raises


@pytest.mark.parametrize("transform", ["value_and_grad", "grad", "jvp", "hvp"])
def test_transforms_of_a_function_raise_as_it_does(transform):
    x = _v(0.3, -0.7, 1.2)
    bad = np.zeros(0)
    f = kadj.differentiate(raise_then_return)
    run = {"value_and_grad": lambda a: kadj.value_and_grad(raise_then_return)(a),
           "grad": lambda a: kadj.grad(raise_then_return)(a),
           "jvp": lambda a: kadj.jvp(raise_then_return, (a,), (np.ones_like(a),)),
           "hvp": lambda a: kadj.hvp(raise_then_return)(a, np.ones_like(a))}[transform]
    with pytest.raises(ValueError, match="empty input"):
        run(bad)
    run(x)                                # a valid input: a result, no exception
    assert f.adjoint_plan(x).forward_raises


def test_only_a_kernel_with_a_raise_is_flagged():
    k = kadj.differentiate(assert_message_in_loop)
    assert k.adjoint_plan(_v(0.3, -0.7), np.zeros(1)).forward_raises
    plain = kadj.differentiate(njit(lambda x, y: None))
    assert not plain.adjoint_plan(_v(0.3), np.zeros(1)).forward_raises
