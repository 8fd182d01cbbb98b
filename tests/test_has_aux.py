"""kadj.grad / kadj.value_and_grad with has_aux=True: f returns (loss, aux), the loss
is differentiated (checked against float64 central differences), aux is returned as
the forward computes it."""
import numpy as np
import pytest
from numba import njit

import kadj


@njit
def fit_with_stats(x, w, b):
    """Least squares of w * x + b against 1; aux: the largest residual."""
    s = 0.0
    worst = 0.0
    for i in range(x.shape[0]):
        r = w * x[i] + b - 1.0
        s += r * r
        worst = max(worst, abs(r))
    return s, worst


@njit
def _energy_and_parts(x, out):
    """A helper returning a tuple: the caller returns it as it is."""
    parts = np.empty(x.shape[0])
    e = 0.0
    for i in range(x.shape[0]):
        parts[i] = np.sin(x[i]) * x[i]
        out[i] = 2.0 * parts[i]
        e += parts[i] * parts[i]
    return e, (parts, x.shape[0])


@njit
def energy_with_parts(x, out):
    return _energy_and_parts(x, out)


@njit
def only_loss(x):
    return x[0] * 2.0


@njit
def three_values(x):
    return x[0], x[1], x[0] * x[1]


def _fd(f, args, i, eps=1e-6):
    """Central differences of f(*args)[0] with respect to args[i], in float64."""
    x = args[i]
    if np.isscalar(x):
        p, m = list(args), list(args)
        p[i], m[i] = x + eps, x - eps
        return (f(*p)[0] - f(*m)[0]) / (2 * eps)
    g = np.zeros(x.shape)
    for idx in np.ndindex(x.shape):
        p = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        m = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        p[i][idx] += eps
        m[i][idx] -= eps
        g[idx] = (f(*p)[0] - f(*m)[0]) / (2 * eps)
    return g


def test_grad_has_aux_scalar_aux_and_several_argnums():
    rng = np.random.default_rng(0)
    x = rng.uniform(-1.0, 1.0, 6)
    (gx, gw, gb), worst = kadj.grad(fit_with_stats, argnums=(0, 1, 2), has_aux=True)(
        x, 0.7, 0.2)
    assert worst == fit_with_stats(x, 0.7, 0.2)[1]
    for i, got in enumerate((gx, gw, gb)):
        np.testing.assert_allclose(got, _fd(fit_with_stats.py_func, (x, 0.7, 0.2), i),
                                   rtol=1e-6, atol=1e-8)
    r = 0.7 * x + 0.2 - 1.0
    np.testing.assert_allclose(gw, 2.0 * np.sum(r * x), rtol=1e-12)


def test_value_and_grad_has_aux():
    x = np.linspace(-0.5, 0.9, 5)
    k = kadj.differentiate(fit_with_stats, wrt=("x",))
    (value, worst), g = kadj.value_and_grad(k, has_aux=True)(x, 1.3, b=-0.1)
    ref_value, ref_worst = fit_with_stats(x, 1.3, -0.1)
    np.testing.assert_allclose(value, ref_value, rtol=1e-14)
    assert worst == ref_worst
    np.testing.assert_allclose(g, _fd(fit_with_stats.py_func, (x, 1.3, -0.1), 0),
                               rtol=1e-6, atol=1e-8)
    with pytest.raises(kadj.DifferentiationError, match="not differentiable"):
        kadj.grad(k, argnums=1, has_aux=True)(x, 1.3, -0.1)


def test_array_and_tuple_aux_from_a_tuple_returning_helper():
    x = np.linspace(0.1, 1.2, 6)
    out = np.full(6, 5.0)
    g, (parts, n) = kadj.grad(energy_with_parts, has_aux=True)(x, out)
    np.testing.assert_allclose(parts, np.sin(x) * x, rtol=1e-14)
    assert n == 6
    np.testing.assert_array_equal(out, 5.0)   # arguments left as they were
    np.testing.assert_allclose(g, _fd(energy_with_parts.py_func, (x, out), 0),
                               rtol=1e-6, atol=1e-8)
    p = np.sin(x) * x
    np.testing.assert_allclose(g, 2.0 * p * (np.cos(x) * x + np.sin(x)), rtol=1e-12)


def test_without_has_aux_a_tuple_return_names_the_option():
    with pytest.raises(kadj.DifferentiationError, match="has_aux=True"):
        kadj.grad(fit_with_stats)(np.ones(3), 1.0, 0.0)


@pytest.mark.parametrize("f", [three_values, only_loss])
def test_has_aux_needs_a_pair(f):
    with pytest.raises(kadj.DifferentiationError, match=r"pair \(loss, aux\)"):
        kadj.grad(f, has_aux=True)(np.ones(3))
