"""x * sqrt(x) differentiated as x ** 1.5 (kadj/fused_ops.py): where it applies and where
not, gradients against finite differences and the analytic derivative (also at x = 0),
forward values bit for bit, forward mode and Hessian-vector products."""
import math

import numpy as np
import pytest
from numba import njit

import kadj
from kadj.testing import check_grad


@njit
def cube_norm(x, y):
    for i in range(x.shape[0]):
        r2 = x[i] * x[i] + 0.5
        y[i] = 1.0 / (r2 * math.sqrt(r2))


@njit
def root_first(x, y):
    for i in range(x.shape[0]):
        a = x[i]
        s = np.sqrt(a)
        y[i] = s * a


@njit
def plain(x, y):
    for i in range(x.shape[0]):
        a = x[i]
        y[i] = a * math.sqrt(a)


@njit
def two_loads(x, y):
    for i in range(x.shape[0]):
        y[i] = x[i] * math.sqrt(x[i])     # (two loads: two values to numba)


@njit
def reassigned_between(x, y):
    for i in range(x.shape[0]):
        a = x[i]
        s = math.sqrt(a)
        a = a + 1.0
        y[i] = a * s


@njit
def root_of_another(x, z, y):
    for i in range(x.shape[0]):
        s = math.sqrt(z[i])
        y[i] = x[i] * s


@njit
def root_in_a_branch(x, y):
    for i in range(x.shape[0]):
        a = x[i]
        s = 1.0
        if a > 1.0:
            s = math.sqrt(a)
        y[i] = a * s


@njit
def root_used_twice(x, y):
    for i in range(x.shape[0]):
        a = x[i]
        s = math.sqrt(a)
        y[i] = a * s + 3.0 * s


def _src(fn, *args):
    return kadj.differentiate(fn).adjoint_source(*args)


@pytest.mark.parametrize("fn, root_rule", [(cube_norm, False), (root_first, False),
                                           (plain, False), (root_used_twice, True)])
def test_fused_where_the_root_is_of_the_value_multiplied(fn, root_rule):
    """The product's contribution is 1.5 * sqrt(x); the square root's own rule (a
    division by 2 sqrt(x)) is left only where something else reads the root."""
    x = np.linspace(0.2, 2.0, 6)
    src = _src(fn, x, np.zeros(6))
    assert "1.5 * math.sqrt(" in src and ("(2.0 * " in src) == root_rule, src
    check_grad(kadj.differentiate(fn), (x, np.zeros(6)))


@pytest.mark.parametrize("fn, args", [
    (two_loads, (np.linspace(0.2, 2.0, 6), np.zeros(6))),
    (reassigned_between, (np.linspace(0.2, 2.0, 6), np.zeros(6))),
    (root_of_another, (np.linspace(0.2, 2.0, 6), np.linspace(0.5, 1.5, 6), np.zeros(6))),
    (root_in_a_branch, (np.linspace(0.2, 2.0, 6), np.zeros(6))),
])
def test_not_fused_otherwise(fn, args):
    src = _src(fn, *args)
    assert "_x_sqrt_x" not in src and "1.5 *" not in src, src
    check_grad(kadj.differentiate(fn), args)


def test_not_fused_in_float32_mixed_with_float64():
    @njit
    def mixed(x, y):
        for i in range(x.shape[0]):
            a = np.float64(x[i])
            s = np.sqrt(x[i])           # float32
            y[i] = a * s
    x = np.linspace(0.2, 2.0, 6).astype(np.float32)
    assert "_x_sqrt_x" not in _src(mixed, x, np.zeros(6))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_derivative_is_one_and_a_half_root_also_at_zero(dtype):
    k = kadj.differentiate(plain)
    x = np.array([0.0, 1e-300 if dtype == np.float64 else 1e-30, 0.25, 4.0], dtype)
    gx = np.zeros_like(x)
    k.adjoint(x.copy(), np.zeros_like(x), gx, np.ones_like(x))
    np.testing.assert_allclose(gx, 1.5 * np.sqrt(x), rtol=1e-6 if dtype == np.float32
                               else 1e-15, atol=0)
    assert gx[0] == 0.0 and np.all(np.isfinite(gx))


@njit
def loss(x):
    s = 0.0
    for i in range(x.shape[0]):
        r2 = x[i] * x[i] + 0.1
        s += r2 * math.sqrt(r2)
    return s


def test_values_and_all_three_derivatives():
    """The fused operation computes exactly the kernel's product of its square root
    (the tangent's value is the kernel's, bit for bit); reverse mode, forward mode and
    Hessian-vector products agree with the analytic derivatives of sum((x^2 + 0.1)^1.5)."""
    k = kadj.differentiate(loss)
    x = np.random.default_rng(0).standard_normal(50)
    v = np.random.default_rng(1).standard_normal(50)
    r2 = x * x + 0.1
    grad = 3.0 * np.sqrt(r2) * x
    hess_v = (3.0 * np.sqrt(r2) + 3.0 * x * x / np.sqrt(r2)) * v
    assert "_x_sqrt_x(" in k.adjoint_source(x) and "1.5 * math.sqrt(" in k.adjoint_source(x)
    gx = np.zeros_like(x)
    assert k.adjoint(x, gx, adj_return=1.0) == loss(x)      # the forward value, exactly
    np.testing.assert_allclose(gx, grad, rtol=1e-13)
    value, dot = k.jvp(x, v)
    assert value == loss(x)
    np.testing.assert_allclose(dot, grad @ v, rtol=1e-12)
    np.testing.assert_allclose(kadj.hvp(loss, 0)(x, v), hess_v, rtol=1e-10)
