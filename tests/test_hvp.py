"""Hessian-vector products, ``kadj.hvp(f, argnums)(*args, v)`` (reverse over forward).

Every function below returns a float; for each, against independent references:

- ``H v`` matches central finite differences in float64 of the gradient that
  ``kadj.grad`` computes, along the same direction ``v``;
- the Hessian is symmetric: ``<H v, w> == <v, H w>`` for random ``v`` and ``w``
  (relative 1e-10; a product that is not a Hessian, a transposed or one-sided one,
  fails it);
- the arguments are left as they were.

The functions cover branches, loops that carry state, ``while``/``break``, helpers called
from ``f``, a 2-layer MLP loss with ``tanh`` (hidden layer in a scratch array the
function writes), a Lennard-Jones pair-potential energy, ``logsumexp``, scalar
arguments besides arrays and ``argnums`` tuples.  A quadratic form and the Rosenbrock
function are checked against their analytic Hessians.  Then the refusals.
"""
from __future__ import annotations

import math

import numba
import numpy as np
import pytest

import kadj

SEED = 20240811


# ---- the functions ---------------------------------------------------------------------
@numba.njit
def _scaled_tanh(a, b):
    return a * math.tanh(b)


@numba.njit
def branchy(x, w):
    """Branches on the data, a helper, a scalar parameter."""
    s = 0.0
    for i in range(x.shape[0]):
        if x[i] > 0.2:
            s += w * math.sin(x[i]) ** 2 + _scaled_tanh(x[i], w * x[i])
        else:
            s += math.exp(x[i]) * w * x[i]
    return s


@numba.njit
def rnn(x, w, h0):
    """A loop carrying its state from one iteration to the next."""
    h = h0
    for i in range(x.shape[0]):
        h = math.tanh(w * h + x[i] * x[i])
    return h * h


@numba.njit
def until_budget(x, limit):
    """``while`` with a ``break`` on the running value (the exit is piecewise constant)."""
    s = 0.0
    i = 0
    while i < x.shape[0]:
        s += x[i] * x[i] * x[i] + math.cos(x[i] * s)
        if s > limit:
            break
        i += 1
    return s * s


@numba.njit
def _softplus(z):
    if z > 20.0:
        return z
    return math.log(1.0 + math.exp(z))


@numba.njit
def logistic_loss(theta, data, labels):
    """A helper with its own branch, called in a loop."""
    total = 0.0
    for i in range(data.shape[0]):
        z = 0.0
        for j in range(data.shape[1]):
            z += theta[j] * data[i, j]
        total += _softplus(z) - labels[i] * z
    reg = 0.0
    for j in range(theta.shape[0]):
        reg += theta[j] * theta[j]
    return total / data.shape[0] + 0.01 * reg


@numba.njit
def mlp_loss(w1, b1, w2, xs, ys, hidden):
    """A 2-layer perceptron with tanh; the hidden layer goes through a scratch array."""
    m, d = xs.shape
    nh = w1.shape[0]
    loss = 0.0
    for s in range(m):
        for k in range(nh):
            a = b1[k]
            for j in range(d):
                a += w1[k, j] * xs[s, j]
            hidden[k] = math.tanh(a)
        out = 0.0
        for k in range(nh):
            out += w2[k] * hidden[k]
        r = out - ys[s]
        loss += r * r
    return loss / m


@numba.njit
def lennard_jones(pos, eps, sigma):
    """A pair-potential energy of n particles in 3-D."""
    n = pos.shape[0]
    e = 0.0
    for i in range(n):
        for j in range(i + 1, n):
            dx = pos[i, 0] - pos[j, 0]
            dy = pos[i, 1] - pos[j, 1]
            dz = pos[i, 2] - pos[j, 2]
            r2 = dx * dx + dy * dy + dz * dz
            sr6 = (sigma * sigma / r2) ** 3
            e += 4.0 * eps * (sr6 * sr6 - sr6)
    return e


@numba.njit
def logsumexp(x):
    m = x[0]
    for i in range(1, x.shape[0]):
        if x[i] > m:
            m = x[i]
    s = 0.0
    for i in range(x.shape[0]):
        s += math.exp(x[i] - m)
    return m + math.log(s)


@numba.njit
def quadratic(x, a, b):
    """0.5 x^T A x + b.x: Hessian (A + A^T) / 2."""
    n = x.shape[0]
    s = 0.0
    for i in range(n):
        for j in range(n):
            s += 0.5 * x[i] * a[i, j] * x[j]
        s += b[i] * x[i]
    return s


@numba.njit
def rosenbrock(x):
    s = 0.0
    for i in range(x.shape[0] - 1):
        s += 100.0 * (x[i + 1] - x[i] * x[i]) ** 2 + (1.0 - x[i]) ** 2
    return s


@numba.njit
def scalars(x, a, b):
    """Scalar arguments besides an array, mixed in every term."""
    s = 0.0
    for i in range(x.shape[0]):
        s += math.exp(a * x[i]) / (1.0 + b * b * x[i] * x[i]) + a * b * math.sin(x[i])
    return s + math.log(1.0 + a * a)


def _mlp_args(rng):
    nh, d, m = 5, 3, 8
    return (0.6 * rng.standard_normal((nh, d)), 0.3 * rng.standard_normal(nh),
            0.6 * rng.standard_normal(nh), rng.standard_normal((m, d)),
            rng.standard_normal(m), np.zeros(nh))


def _lj_args(rng):
    g = np.array([[i, j, k] for i in range(2) for j in range(2) for k in range(2)], float)
    return (1.2 * g + 0.05 * rng.standard_normal(g.shape), 1.0, 1.0)


CASES = {   # name: (function, make_args, argnums, runs by default)
    "branches_helper_tuple": (branchy, lambda r: (r.uniform(-0.5, 1.0, 9), 1.3), (0, 1),
                              True),
    "branches_helper": (branchy, lambda r: (r.uniform(-0.5, 1.0, 9), 1.3), 0, False),
    "carried_loop": (rnn, lambda r: (r.uniform(-1, 1, 12), 0.8, 0.1), (0, 1, 2), True),
    "while_break": (until_budget, lambda r: (r.uniform(0.2, 0.9, 10), 2.0), 0, True),
    "logistic_helper": (logistic_loss, lambda r: (0.5 * r.standard_normal(4),
                                                  r.standard_normal((12, 4)),
                                                  (r.uniform(size=12) > 0.5) * 1.0), 0,
                        False),
    "mlp_all": (mlp_loss, _mlp_args, (0, 1, 2), True),
    "mlp_w1": (mlp_loss, _mlp_args, 0, False),
    "lennard_jones": (lennard_jones, _lj_args, 0, True),
    "lennard_jones_params": (lennard_jones, _lj_args, (1, 2), False),
    "logsumexp": (logsumexp, lambda r: (r.standard_normal(7),), 0, True),
    "quadratic": (quadratic, lambda r: (r.standard_normal(5), r.standard_normal((5, 5)),
                                        r.standard_normal(5)), 0, False),
    "rosenbrock": (rosenbrock, lambda r: (r.uniform(-1.5, 1.5, 6),), 0, False),
    "scalars_and_array": (scalars, lambda r: (r.uniform(-1, 1, 6), 0.7, -1.1), (2, 0),
                          True),
    "scalars": (scalars, lambda r: (r.uniform(-1, 1, 6), 0.7, -1.1), (1, 2), False),
}
NAMES = [pytest.param(n, id=n, marks=() if c[3] else pytest.mark.slow)
         for n, c in CASES.items()]


# ---- references ------------------------------------------------------------------------
def _nums(argnums):
    return (argnums,) if isinstance(argnums, int) else tuple(argnums)


def _direction(args, nums, rng):
    return tuple(rng.standard_normal(args[i].shape) if isinstance(args[i], np.ndarray)
                 else float(rng.standard_normal()) for i in nums)


def _shifted(args, nums, v, h):
    out = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    for i, d in zip(nums, v):
        out[i] = out[i] + h * d
    return out


def _flat(parts):
    return np.concatenate([np.ravel(np.asarray(p, np.float64)) for p in parts])


def fd_hvp(f, args, argnums, v, h=1e-5):
    """Central differences in float64 of kadj.grad along ``v``."""
    nums = _nums(argnums)
    g = kadj.grad(f, nums)
    gp = _flat(g(*_shifted(args, nums, v, h)))
    gm = _flat(g(*_shifted(args, nums, v, -h)))
    return (gp - gm) / (2 * h)


def _as_tuple(r, argnums):
    return (r,) if isinstance(argnums, int) else tuple(r)


@pytest.mark.parametrize("name", NAMES)
def test_hvp_matches_finite_differences_of_the_gradient(name):
    f, make, argnums, _ = CASES[name]
    args = make(np.random.default_rng(SEED))
    nums = _nums(argnums)
    v = _direction(args, nums, np.random.default_rng(SEED + 1))
    before = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    hv = kadj.hvp(f, argnums)(*args, v[0] if isinstance(argnums, int) else v)
    parts = _as_tuple(hv, argnums)
    for i, p in zip(nums, parts):       # shaped like their argument
        if isinstance(args[i], np.ndarray):
            assert isinstance(p, np.ndarray) and p.shape == args[i].shape, name
        else:
            assert isinstance(p, float), name
    for a, b in zip(args, before):
        np.testing.assert_array_equal(a, b)
    ref = fd_hvp(f, args, argnums, v)
    got = _flat(parts)
    scale = max(1.0, float(np.max(np.abs(ref))))
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6 * scale, err_msg=name)


@pytest.mark.parametrize("name", NAMES)
def test_hessian_is_symmetric(name):
    """<H v, w> == <v, H w> for random v, w."""
    f, make, argnums, _ = CASES[name]
    args = make(np.random.default_rng(SEED))
    nums = _nums(argnums)
    rng = np.random.default_rng(SEED + 2)
    v, w = _direction(args, nums, rng), _direction(args, nums, rng)
    hvp = kadj.hvp(f, argnums)
    if isinstance(argnums, int):
        hv, hw = _flat([hvp(*args, v[0])]), _flat([hvp(*args, w[0])])
    else:
        hv, hw = _flat(hvp(*args, v)), _flat(hvp(*args, w))
    lhs, rhs = float(hv @ _flat(w)), float(_flat(v) @ hw)
    scale = np.linalg.norm(hv) * np.linalg.norm(_flat(w)) + \
        np.linalg.norm(hw) * np.linalg.norm(_flat(v))
    assert abs(lhs - rhs) <= 1e-10 * max(scale, 1e-300), (name, lhs, rhs)


def test_analytic_hessians_exactly():
    rng = np.random.default_rng(SEED + 3)
    x, a, b = rng.standard_normal(5), rng.standard_normal((5, 5)), rng.standard_normal(5)
    v = rng.standard_normal(5)
    got = kadj.hvp(quadratic)(x, a, b, v)
    np.testing.assert_allclose(got, 0.5 * (a + a.T) @ v, rtol=1e-13, atol=1e-13)

    x = rng.uniform(-1.5, 1.5, 6)
    n = x.shape[0]
    hess = np.zeros((n, n))
    for i in range(n - 1):
        hess[i, i] += 1200.0 * x[i] ** 2 - 400.0 * x[i + 1] + 2.0
        hess[i, i + 1] -= 400.0 * x[i]
        hess[i + 1, i] -= 400.0 * x[i]
        hess[i + 1, i + 1] += 200.0
    d = rng.standard_normal(n)
    got = kadj.hvp(rosenbrock)(x, d)
    np.testing.assert_allclose(got, hess @ d, rtol=1e-12, atol=1e-12 * np.abs(hess).max())


# ---- the kernel, the source, the refusals ----------------------------------------------
def test_a_decorated_kernel_and_its_source():
    k = kadj.differentiate(rnn)
    x = np.linspace(-0.5, 0.5, 6)
    rng = np.random.default_rng(SEED + 4)
    v = rng.standard_normal(6)
    hvp = kadj.hvp(k, 0)
    got = hvp(x, 0.8, 0.1, v)
    ref = fd_hvp(rnn, (x, 0.8, 0.1), 0, (v,))
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6 * np.abs(ref).max())
    src = hvp.source(x, 0.8, 0.1)
    assert "def rnn_tangent_value(x, w, h0, dot_x):" in src
    assert "def rnn_tangent_value_adjoint(" in src
    assert "return dot_" in src and "math.tanh(" in src


def test_the_while_loop_gradient_under_the_hvp():
    """The gradient of a while loop that breaks on its running value (its branch
    decision is recorded at every iteration) against central differences."""
    x = np.random.default_rng(SEED).uniform(0.2, 0.9, 10)
    g = kadj.grad(until_budget)(x, 2.0)
    h = 1e-6
    ref = np.array([(until_budget(x + h * e, 2.0) - until_budget(x - h * e, 2.0)) / (2 * h)
                    for e in np.eye(10)])
    assert np.count_nonzero(ref) >= 2       # the loop ran more than one iteration
    np.testing.assert_allclose(g, ref, rtol=1e-6, atol=1e-6 * np.abs(ref).max())


@numba.njit
def _writes(x, out):
    for i in range(x.shape[0]):
        out[i] = x[i] * x[i]


@numba.njit
def _count(x, n):
    s = 0.0
    for i in range(n):
        s += x[i] * x[i] * n
    return s


def test_refusals():
    x = np.ones(4)
    with pytest.raises(kadj.DifferentiationError, match="does not return a float"):
        kadj.hvp(_writes)(x, np.zeros(4), np.ones(4))
    with pytest.raises(kadj.DifferentiationError, match="'n' .* not floating point"):
        kadj.hvp(_count, 1)(x, 4, 1.0)
    with pytest.raises(kadj.DifferentiationError, match="not in the kernel's wrt"):
        kadj.hvp(kadj.differentiate(rnn, wrt=("x",)), 1)(x, 0.8, 0.1, 1.0)
    with pytest.raises(TypeError, match="one direction per argnums"):
        kadj.hvp(rnn, (0, 1))(x, 0.8, 0.1, (np.ones(4),))
    with pytest.raises(ValueError, match="shape"):
        kadj.hvp(rnn, 0)(x, 0.8, 0.1, np.ones(5))
    with pytest.raises(IndexError, match="out of range"):
        kadj.hvp(rnn, 3)(x, 0.8, 0.1, 1.0)
    # the direction left out: the last value would be taken as v, leaving h0 unset
    with pytest.raises(TypeError, match=r"^kadj.hvp\(rnn\) takes the function's "
                       r"arguments \('x', 'w', 'h0'\) followed by the direction v "
                       r"\(shaped like 'x'\), and one is missing"):
        kadj.hvp(rnn)(x, 0.8, 0.1)
    with pytest.raises(TypeError, match=r"a tuple of directions shaped like 'x' and "
                       r"'w'.*2 positional value\(s\) \(and h0 by keyword\)"):
        kadj.hvp(rnn, (0, 1))(x, 0.8, h0=0.1)


@numba.njit
def _min_times(x, y):
    return np.min(x) * np.max(y) + np.min(x) * x[0]


def test_hvp_of_a_whole_array_minimum():
    """np.min(x): the tangent starts its running minimum at math.inf, which the
    tangent's adjoint dropped (NameError at compile); now against differences of
    kadj.grad."""
    rng = np.random.default_rng(3)
    x, y, v = rng.uniform(-1, 1, 5), rng.uniform(-1, 1, 4), rng.standard_normal(5)
    hv = kadj.hvp(_min_times, argnums=0)(x, y, v)
    h = 1e-6
    gp = kadj.grad(_min_times, argnums=0)(x + h * v, y)
    gm = kadj.grad(_min_times, argnums=0)(x - h * v, y)
    np.testing.assert_allclose(hv, (gp - gm) / (2 * h), rtol=1e-6, atol=1e-8)
    assert np.abs(hv).max() > 0


@numba.njit
def _real_part_of_complex(w, a, out):
    s = 0.0
    for i in range(w.shape[0]):
        out[i] = complex(a, w[i].imag).real     # its tangent along a is real
        s += a * out[i] + (complex(a, w[i].real) ** 2).real
    return s


def test_hvp_through_the_real_part_of_a_complex_built_from_a_real():
    """The tangent of complex(a, y).real along a real direction is a real value whose
    .real the tangent reads; the Hessian-vector product read it too (it was refused:
    "attribute '.real' is not supported").  Against differences of kadj.grad."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal(5) + 1j * rng.standard_normal(5)
    a, v = 0.8, 1.3
    hv = kadj.hvp(_real_part_of_complex, argnums=1)(w, a, np.zeros(5), v)
    h = 1e-6
    gp = kadj.grad(_real_part_of_complex, argnums=1)(w, a + h * v, np.zeros(5))
    gm = kadj.grad(_real_part_of_complex, argnums=1)(w, a - h * v, np.zeros(5))
    assert float(hv) == pytest.approx((gp - gm) / (2 * h), rel=1e-6)
