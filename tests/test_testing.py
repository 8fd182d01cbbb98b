"""check_grad tests: it passes correct adjoints and fails wrong ones.

Fake kernels with hand-written adjoints (right and deliberately wrong) check the
checker itself, independently of the code generator: a gradient check that cannot
fail proves nothing.  Later parts run it on real ``@kadj.differentiate`` kernels, check
its steps (small parameters, large values), its reports of kinks and ties, and that it
runs adjoints with bounds checking.
"""
import math
import os
import re

import numpy as np
import pytest

import kadj
from kadj.errors import DifferentiationError
from kadj.plan import AdjointPlan
from kadj.testing import (GradCheckResult, adjoint_jacobian, check_grad,
                          numerical_jacobian)


class FakeKernel:
    """A kernel with a hand-written adjoint that follows the kadj contract."""

    def __init__(self, fn, adjoint, arg_names, written, read, returns_value=False):
        self.fn, self.adj, self.arg_names = fn, adjoint, tuple(arg_names)
        self.written, self.read = frozenset(written), frozenset(read)
        self.returns_value = returns_value
        self.__name__ = fn.__name__

    def adjoint_plan(self, *args):
        floats = tuple(i for i, a in enumerate(args) if np.asarray(a).dtype.kind == "f")
        return AdjointPlan(self.__name__, self.arg_names, floats, self.written,
                           self.read, self.returns_value)

    def forward(self, *args):
        return self.fn(*args)

    def adjoint(self, *args, **kwargs):
        n = len(self.arg_names)
        self.adj(args[:n], args[n:], **kwargs)


def fake(arg_names, written, read, returns_value=False):
    def wrap(fn):
        def with_adjoint(adj):
            return FakeKernel(fn, adj, arg_names, written, read, returns_value)
        return with_adjoint
    return wrap


def _scale(x, y, a):
    y[:] = a * np.sin(x)


# y = a * sin(x)
@fake(("x", "y", "a"), written={1}, read={0})
def scale(x, y, a):
    _scale(x, y, a)


def _scale_adjoint(fwd, adj, factor=1.0):
    """The adjoint of y = a * sin(x), its x part scaled by ``factor`` (1: right)."""
    (x, y, a), (adj_x, adj_y, adj_a) = fwd, adj
    adj_x += a * np.cos(x) * adj_y * factor
    adj_a[0] += np.sum(np.sin(x) * adj_y)
    adj_y[:] = 0.0


@scale
def scale(fwd, adj):
    _scale_adjoint(fwd, adj)


@fake(("x", "y", "a"), written={1}, read={0})
def scale_wrong_factor(x, y, a):
    _scale(x, y, a)


@scale_wrong_factor
def scale_wrong_factor(fwd, adj):
    (x, y, a), (adj_x, adj_y, adj_a) = fwd, adj
    adj_x += np.cos(x) * adj_y          # forgets the factor a
    adj_a[0] += np.sum(np.sin(x) * adj_y)
    adj_y[:] = 0.0


@fake(("x", "y", "a"), written={1}, read={0})
def scale_keeps_cotangent(x, y, a):
    _scale(x, y, a)


@scale_keeps_cotangent
def scale_keeps_cotangent(fwd, adj):
    (x, y, a), (adj_x, adj_y, adj_a) = fwd, adj
    adj_x += a * np.cos(x) * adj_y
    adj_a[0] += np.sum(np.sin(x) * adj_y)
    # forgets to consume adj_y: y's pre-call contents are overwritten


@fake(("x", "y", "a"), written={1}, read={0})
def scale_writes_forward_arg(x, y, a):
    _scale(x, y, a)


@scale_writes_forward_arg
def scale_writes_forward_arg(fwd, adj):
    (x, y, a), (adj_x, adj_y, adj_a) = fwd, adj
    adj_x += a * np.cos(x) * adj_y
    adj_a[0] += np.sum(np.sin(x) * adj_y)
    adj_y[:] = 0.0
    y += 1.0                             # the adjoint must not touch y


@fake(("x", "y", "a"), written={1}, read={0})
def scale_wrong_in_one_element(x, y, a):
    _scale(x, y, a)


@scale_wrong_in_one_element
def scale_wrong_in_one_element(fwd, adj):
    (x, y, a), (adj_x, adj_y, adj_a) = fwd, adj
    adj_x += a * np.cos(x) * adj_y
    adj_x[-1] *= 1.0 + 3e-6
    adj_a[0] += np.sum(np.sin(x) * adj_y)
    adj_y[:] = 0.0


# y[i] += b * y[i-1] * x[i]  (in place, sequential)
@fake(("x", "y", "b"), written={1}, read={0, 1})
def recurrence(x, y, b):
    for i in range(1, y.shape[0]):
        y[i] += b * y[i - 1] * x[i]


@recurrence
def recurrence(fwd, adj):
    (x, y, b), (adj_x, adj_y, adj_b) = fwd, adj
    ys = [y.copy()]
    for i in range(1, y.shape[0]):      # forward sweep, keep every state
        nxt = ys[-1].copy()
        nxt[i] += b * nxt[i - 1] * x[i]
        ys.append(nxt)
    for i in range(y.shape[0] - 1, 0, -1):
        prev = ys[i - 1]
        adj_x[i] += b * prev[i - 1] * adj_y[i]
        adj_b[0] += prev[i - 1] * x[i] * adj_y[i]
        adj_y[i - 1] += b * x[i] * adj_y[i]


# returns sum(exp(x) * w)
@fake(("x", "w"), written=(), read={0, 1}, returns_value=True)
def weighted_exp_sum(x, w):
    return float(np.sum(np.exp(x) * w))


@weighted_exp_sum
def weighted_exp_sum(fwd, adj, adj_return=1.0):
    (x, w), (adj_x, adj_w) = fwd, adj
    adj_x += np.exp(x) * w * adj_return
    adj_w += np.exp(x) * adj_return


# y = x[idx] * c
@fake(("x", "idx", "c", "y"), written={3}, read={0, 1})
def gather_scale(x, idx, c, y):
    y[:] = x[idx] * c


@gather_scale
def gather_scale(fwd, adj):
    (x, idx, c, y), (adj_x, adj_c, adj_y) = fwd, adj
    np.add.at(adj_x, idx, adj_y * c)
    adj_c[0] += np.sum(x[idx] * adj_y)
    adj_y[:] = 0.0


# y[:] = a (one scalar input, many outputs)
@fake(("y", "a"), written={0}, read=())
def fill(y, a):
    y[:] = a * a


@fill
def fill(fwd, adj):
    (y, a), (adj_y, adj_a) = fwd, adj
    adj_a[0] += 2 * a * np.sum(adj_y)
    adj_y[:] = 0.0


@fake(("n",), written=(), read=())
def nothing(n):
    pass


@nothing
def nothing(fwd, adj):
    pass


@pytest.fixture
def rng():
    return np.random.default_rng(3)


# ------------------------------------------------------------ passing


def test_correct_adjoint_passes(rng):
    result = check_grad(scale, (rng.standard_normal(6), np.zeros(6), 1.7))
    assert isinstance(result, GradCheckResult)
    assert result.kernel_name == "scale"
    assert result.inputs == ("x", "y", "a") and result.outputs == ("y",)
    assert result.precision == "float64" and result.jacobian_checked
    assert result.max_rel_error < 1e-7
    assert result.directional_fd == pytest.approx(result.directional_adjoint)


def test_in_place_sequential_update_passes(rng):
    args = (rng.standard_normal(7), rng.standard_normal(7), 0.8)
    assert check_grad(recurrence, args).jacobian_checked


def test_returning_function_passes(rng):
    result = check_grad(weighted_exp_sum, (rng.standard_normal(5),
                                           rng.standard_normal(5)))
    assert result.outputs == ("return",)


def test_fixed_return_cotangent(rng):
    args = (rng.standard_normal(5), rng.standard_normal(5))
    result = check_grad(weighted_exp_sum, args, adj_return=2.0, wrt="x")
    doubled = check_grad(weighted_exp_sum, args, adj_return=4.0, wrt="x")
    assert result.inputs == ("x",)
    # same direction (same seed), twice the return cotangent: twice the product
    assert doubled.directional_adjoint == pytest.approx(2 * result.directional_adjoint)


def test_integer_arguments_are_left_alone(rng):
    args = (rng.standard_normal(4), np.array([0, 0, 3, 1, 2]), 0.5, np.zeros(5))
    result = check_grad(gather_scale, args)
    assert result.inputs == ("x", "c", "y")


def test_many_outputs_use_random_cotangent_rows(rng):
    result = check_grad(fill, (np.zeros(200), 0.3), wrt="a")
    assert result.jacobian_checked  # one input, 200 outputs


def test_large_inputs_skip_the_full_jacobian(rng):
    result = check_grad(scale, (rng.standard_normal(100), np.zeros(100), 1.1))
    assert not result.jacobian_checked


def test_wrt_narrows_the_checked_inputs(rng):
    args = (rng.standard_normal(4), np.zeros(4), 2.0)
    assert check_grad(scale, args, wrt=("a",)).inputs == ("a",)
    assert check_grad(scale, args, wrt=[0]).inputs == ("x",)


def test_float32_kernels_use_looser_defaults(rng):
    args = (rng.standard_normal(6).astype(np.float32), np.zeros(6, np.float32),
            np.float32(1.3))
    result = check_grad(scale, args)
    assert result.precision == "float32"
    assert result.rtol == 1e-2 and result.eps > 1e-3


def test_user_arguments_are_not_modified(rng):
    args = (rng.standard_normal(5), rng.standard_normal(5), 0.9)
    before = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    check_grad(recurrence, args)
    for a, b in zip(args, before):
        np.testing.assert_array_equal(a, b)


def test_jacobian_helpers_agree(rng):
    args = (rng.standard_normal(3), np.zeros(3), 1.5)
    fd = numerical_jacobian(scale, args)
    adj = adjoint_jacobian(scale, args)
    assert fd.shape == adj.shape == (3, 7)  # rows: y; columns: x, y, a
    np.testing.assert_allclose(adj, fd, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(adj[:, :3], np.diag(1.5 * np.cos(args[0])))


# ------------------------------------------------------------ failing


@pytest.mark.parametrize("kernel, match", [
    (scale_wrong_factor, "inner-product test for argument 'x'"),
    (scale_keeps_cotangent, "inner-product test for argument 'y'"),
    (scale_writes_forward_arg, "modified its forward argument 'y'"),
])
def test_wrong_adjoints_fail(rng, kernel, match):
    with pytest.raises(AssertionError, match=match) as info:
        check_grad(kernel, (rng.standard_normal(6), np.zeros(6), 1.7))
    assert kernel.__name__ in str(info.value)


def test_the_full_jacobian_catches_a_small_local_error(rng):
    args = (rng.standard_normal(6), np.zeros(6), 1.7)
    with pytest.raises(AssertionError, match=r"d\(y after\)/d\(x before\)"):
        check_grad(scale_wrong_in_one_element, args, rtol=1e-6)


def test_wrong_adjoint_fails_in_float32(rng):
    args = (rng.standard_normal(6).astype(np.float32), np.zeros(6, np.float32),
            np.float32(1.7))
    with pytest.raises(AssertionError, match="scale_wrong_factor"):
        check_grad(scale_wrong_factor, args)


def test_wrong_adjoint_fails_without_the_full_jacobian(rng):
    args = (rng.standard_normal(100), np.zeros(100), 1.7)
    with pytest.raises(AssertionError, match="inner-product"):
        check_grad(scale_wrong_factor, args)


# ------------------------------------------------------ wrong everywhere, at scale
#
# An error by the same factor at every element, in arrays too large for the full
# Jacobian: the inner-product test alone must catch it, at any size.  Its tolerance
# scales with the root-sum-square of the terms, as the inner product does; an
# absolute sum would grow like the size and let such errors pass.


def _square_scaled_by(factor, offset=0.0):
    """y = x * x + offset, with an adjoint ``factor`` times the true one (exact for 1)."""

    @fake(("x", "y"), written={1}, read={0})
    def square(x, y):
        y[:] = x * x + offset

    @square
    def square(fwd, adj):
        (x, y), (adj_x, adj_y) = fwd, adj
        adj_x += factor * 2.0 * x * adj_y
        adj_y[:] = 0.0

    return square


@pytest.mark.parametrize("dtype, n, error", [
    (np.float64, 40009, 1e-2),
    (np.float64, 40009, 1e-4),
    (np.float32, 4099, 1e-1),
    (np.float32, 40009, 1e-1),
], ids=["float64-40009-1%", "float64-40009-0.01%", "float32-4099-10%",
        "float32-40009-10%"])
def test_a_uniform_relative_error_is_caught_at_large_sizes(dtype, n, error):
    for seed in range(4):
        x = np.random.default_rng(seed).uniform(0.5, 1.0, n).astype(dtype)
        args = (x, np.zeros(n, dtype))
        result = check_grad(_square_scaled_by(1.0), args, seed=seed)
        assert not result.jacobian_checked
        # the exact adjoint (analytic, 2 x ct) passes, and its inner products agree
        # with the central differences' over the three directions
        assert result.directional_adjoint == pytest.approx(
            result.directional_fd, rel=10 * result.rtol, abs=1e-3 * math.sqrt(n))
        with pytest.raises(AssertionError,
                           match="inner-product test for argument 'x'"):
            check_grad(_square_scaled_by(1.0 + error), args, seed=seed)


def test_the_adjoints_scaled_square_matches_its_analytic_gradient():
    x = np.linspace(0.5, 1.0, 5)
    adj_x = np.zeros(5)
    _square_scaled_by(1.5).adjoint(x, x * x, adj_x, np.ones(5))
    np.testing.assert_allclose(adj_x, 1.5 * 2.0 * x, rtol=1e-15)


def _far_from_zero(factor):
    """y = x + 1e4 * (1 + w): in float32 the outputs keep about three digits of x.
    The adjoint is ``factor`` times the true one (exact for 1)."""

    @fake(("x", "w", "y"), written={2}, read={0, 1})
    def far_from_zero(x, w, y):
        y[:] = x + 1e4 * (1.0 + w)

    @far_from_zero
    def far_from_zero(fwd, adj):
        (x, w, y), (adj_x, adj_w, adj_y) = fwd, adj
        adj_x += factor * adj_y
        adj_w += factor * 1e4 * adj_y
        adj_y[:] = 0.0

    return far_from_zero


def test_noise_that_hides_the_gradient_fails_instead_of_passing(rng):
    n = 4099
    x, w = rng.uniform(0.5, 1.0, n), np.zeros(n)
    args32 = (x.astype(np.float32), w.astype(np.float32), np.zeros(n, np.float32))
    for factor in (1.0, 1.5):
        with pytest.raises(AssertionError) as info:
            check_grad(_far_from_zero(factor), args32, wrt="x")
        text = str(info.value)
        assert ("cannot check the gradient of kernel 'far_from_zero' for argument "
                "'x'") in text
        assert "float32" in text and "check it in float64" in text.lower()
    # in float64 the same gradient is checked, and one wrong by 10% fails;
    args64 = (x, w, np.zeros(n))
    check_grad(_far_from_zero(1.0), args64, wrt="x")
    with pytest.raises(AssertionError, match="inner-product test for argument 'x'"):
        check_grad(_far_from_zero(1.1), args64, wrt="x")
    # so is float32 with steps large enough for the noise (the map is linear)
    check_grad(_far_from_zero(1.0), args32, wrt="x", eps=0.8)
    with pytest.raises(AssertionError, match="inner-product test for argument 'x'"):
        check_grad(_far_from_zero(1.5), args32, wrt="x", eps=0.8)
    # a disagreement whose confirmation at a smaller step drowns in noise is not
    # passed either
    with pytest.raises(AssertionError, match=r"cannot check .*4x smaller step"):
        check_grad(_far_from_zero(1.5), args32, wrt="x", eps=0.2)


def _ignores_v(adj_v_weight):
    """y = x + 1e4, which does not depend on v; the adjoint claims
    ``adj_v_weight * adj_y`` for v (exact for 0)."""

    @fake(("x", "v", "y"), written={2}, read={0, 1})
    def ignores_v(x, v, y):
        y[:] = x + 1e4

    @ignores_v
    def ignores_v(fwd, adj):
        (x, v, y), (adj_x, adj_v, adj_y) = fwd, adj
        adj_x += adj_y
        adj_v += adj_v_weight * adj_y
        adj_y[:] = 0.0

    return ignores_v


def test_a_zero_gradient_is_checkable_under_noise(rng):
    # the adjoint predicts zero for v, and float32 finite differences confirm it,
    # however large (and noisy) the outputs are; a small nonzero claim fails
    n = 4099
    args = (rng.uniform(0.5, 1.0, n).astype(np.float32),
            rng.uniform(0.5, 1.0, n).astype(np.float32), np.zeros(n, np.float32))
    check_grad(_ignores_v(0.0), args, wrt="v")
    # a small nonzero claim fails: in float32 the change it claims would round away
    # in outputs of 1e4, which finite differences say; in float64 they see it is wrong
    with pytest.raises(AssertionError, match="cannot check .* left unchanged"):
        check_grad(_ignores_v(0.01), args, wrt="v")
    args64 = tuple(a.astype(np.float64) for a in args)
    check_grad(_ignores_v(0.0), args64, wrt="v")
    with pytest.raises(AssertionError, match="inner-product test for argument 'v'"):
        check_grad(_ignores_v(0.01), args64, wrt="v")


def _log_of(factor):
    """y = log(x), with an adjoint ``factor`` times the true one (exact for 1)."""

    @fake(("x", "y"), written={1}, read={0})
    def log_of(x, y):
        with np.errstate(invalid="ignore", divide="ignore"):
            y[:] = np.log(x)

    @log_of
    def log_of(fwd, adj):
        (x, y), (adj_x, adj_y) = fwd, adj
        adj_x += factor * adj_y / x
        adj_y[:] = 0.0

    return log_of


@pytest.mark.parametrize("factor", [1.0, 1.5])
def test_outputs_that_are_not_finite_are_named_not_compared(factor):
    # log(-1) is NaN: no finite difference says anything there, right adjoint or wrong
    args = (np.array([1.0, -1.0, 2.0]), np.zeros(3))
    with pytest.raises(AssertionError) as info:
        check_grad(_log_of(factor), args)
    text = str(info.value)
    assert "cannot check the gradient of kernel 'log_of'" in text
    assert "not finite (y[1] = nan)" in text and "nan > tolerance" not in text
    # a step that reaches across the pole at 0 makes the differences NaN
    args = (np.array([1.0, 1e-9, 2.0]), np.zeros(3))
    with pytest.raises(AssertionError,
                       match="not finite at the points the finite differences step"):
        check_grad(_log_of(factor), args, eps=2.0)
    # where everything is finite the right adjoint passes and the wrong one fails
    args = (np.array([1.0, 0.5, 2.0]), np.zeros(3))
    if factor == 1.0:
        check_grad(_log_of(factor), args)
    else:
        with pytest.raises(AssertionError, match="inner-product test for argument 'x'"):
            check_grad(_log_of(factor), args)


# ------------------------------------------------------------ misuse


def test_unknown_wrt_is_refused(rng):
    with pytest.raises(DifferentiationError, match="not one of the kernel's"):
        check_grad(scale, (rng.standard_normal(3), np.zeros(3), 1.0), wrt="z")


def test_nothing_to_check_is_refused():
    with pytest.raises(DifferentiationError, match="nothing to check"):
        check_grad(nothing, (3,))


# ------------------------------------------------------ real kadj kernels

differentiate = getattr(kadj, "differentiate", None)
needs_core = pytest.mark.skipif(differentiate is None,
                                reason="kadj.differentiate is not available yet")

if differentiate is not None:
    from numba import njit

    @njit
    def heat_step_plain(u, u_new, alpha):
        for i in range(1, u.shape[0] - 1):
            u_new[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1])

    heat_step = differentiate(heat_step_plain)

    @differentiate
    @njit
    def smooth_in_place(u, alpha):
        for i in range(1, u.shape[0] - 1):
            u[i] = u[i] + alpha * math.sin(u[i - 1] - u[i + 1])

    @differentiate
    @njit
    def empty_and_scaled(x, y, z, a):
        for i in range(x.shape[0]):
            y[i] = x[i] * a
        for i in range(z.shape[0]):
            z[i] = z[i] * a

    class _WrongAdjoint:
        """``empty_and_scaled`` with its z gradient off by 10 %."""

        def __init__(self, k):
            self.k, self.__name__ = k, k.__name__

        def adjoint_plan(self, *args):
            return self.k.adjoint_plan(*args)

        def forward(self, *args):
            return self.k(*args)

        def adjoint(self, *args, **kwargs):
            self.k.adjoint(*args, **kwargs)
            args[6][...] *= 1.1     # (adj_z, a buffer of the caller)

    @differentiate
    @njit
    def soft_energy(x, w):
        s = 0.0
        for i in range(x.shape[0]):
            s += w[i] * math.exp(-x[i] * x[i])
        return s


@needs_core
def test_real_stencil(rng):
    result = check_grad(heat_step, (rng.standard_normal(10), np.zeros(10), 0.3))
    assert result.jacobian_checked and result.outputs == ("u_new",)


@needs_core
def test_real_stencil_float32(rng):
    args = (rng.standard_normal(10).astype(np.float32), np.zeros(10, np.float32),
            np.float32(0.3))
    assert check_grad(heat_step, args).precision == "float32"


@needs_core
def test_arrays_of_size_zero_run_the_adjoint_and_compare_the_rest(rng):
    """Size 0 (a sweep over sizes from 0): the adjoint runs, bounds-checked; an empty
    argument has no direction to probe, the others are checked as usual (a wrong
    gradient of a non-empty one still fails)."""
    result = check_grad(heat_step, (np.zeros(0), np.zeros(0), 0.3))
    assert result.max_abs_error == 0.0 and result.directional_adjoint == 0.0
    result = check_grad(soft_energy, (np.zeros(0), np.zeros(0)))
    assert result.outputs == ("return",)
    args = (np.zeros(0), np.zeros(0), rng.standard_normal(4), 0.7)
    assert check_grad(empty_and_scaled, args).inputs == ("x", "y", "z", "a")
    with pytest.raises(AssertionError, match="argument 'z'"):
        check_grad(_WrongAdjoint(empty_and_scaled), args)


@needs_core
def test_real_in_place_update(rng):
    check_grad(smooth_in_place, (rng.standard_normal(9), 0.4))


@needs_core
def test_real_returning_function(rng):
    result = check_grad(soft_energy, (rng.standard_normal(8), rng.standard_normal(8)))
    assert result.outputs == ("return",)


@needs_core
def test_undecorated_kernels_are_differentiated_first(rng):
    check_grad(heat_step_plain, (rng.standard_normal(6), np.zeros(6), 0.3))


@needs_core
def test_real_large_input_uses_the_inner_product_only(rng):
    result = check_grad(heat_step, (rng.standard_normal(500), np.zeros(500), 0.3))
    assert not result.jacobian_checked


def _big_total(u, out):
    """A large returned total next to a written array: perturbing ``out`` reaches only
    ``out[0]`` (passed through), not the total."""
    s = 0.0
    for i in range(1, u.shape[0]):
        out[i] = u[i] * 2.0
        s += u[i - 1] * u[i - 1] + 1.0
    return s


@needs_core
def test_outputs_the_step_does_not_reach_add_no_rounding():
    """The central difference is C (F(x+) - F(x-)): as C F(x+) - C F(x-), the two sums
    over 8,000 outputs (one of them a total near 8,000) rounded differently and failed
    the check for 'out' on about half of the draws with a right adjoint."""
    from numba import njit
    k = kadj.differentiate(njit(_big_total))
    for seed in range(8):
        r = np.random.default_rng(seed)
        check_grad(k, (r.standard_normal(8196), r.standard_normal(8196)),
                   full_jacobian_max=0, seed=seed)


class Tampered:
    """A real kernel whose adjoint is made wrong in its last slot (alpha)."""

    def __init__(self, kernel):
        self.kernel = kernel

    def adjoint_plan(self, *args):
        return self.kernel.adjoint_plan(*args)

    def forward(self, *args):
        return self.kernel.forward(*args)

    def adjoint(self, *args, **kwargs):
        self.kernel.adjoint(*args, **kwargs)
        args[-1][0] *= 1.1


@needs_core
def test_a_tampered_real_adjoint_fails(rng):
    with pytest.raises(AssertionError, match="heat_step_plain"):
        check_grad(Tampered(heat_step), (rng.standard_normal(10), np.zeros(10), 0.3))


# ------------------------------------------------ steps relative to each argument


# y = u / dx**2, with a grid spacing dx much smaller than 1
@fake(("u", "y", "dx"), written={1}, read={0})
def over_spacing(u, y, dx):
    y[:] = u / (dx * dx)


@over_spacing
def over_spacing(fwd, adj):
    (u, y, dx), (adj_u, adj_y, adj_dx) = fwd, adj
    adj_u += adj_y / (dx * dx)
    adj_dx[0] += np.sum(-2.0 * u / dx ** 3 * adj_y)
    adj_y[:] = 0.0


@fake(("u", "y", "dx"), written={1}, read={0})
def over_spacing_slightly_wrong(u, y, dx):
    y[:] = u / (dx * dx)


@over_spacing_slightly_wrong
def over_spacing_slightly_wrong(fwd, adj):
    (u, y, dx), (adj_u, adj_y, adj_dx) = fwd, adj
    adj_u += adj_y / (dx * dx)
    adj_dx[0] += np.sum(-2.0 * u / dx ** 3 * adj_y) * (1.0 + 1e-4)
    adj_y[:] = 0.0


# y = a * sin(x), for x far from zero (the step grows with |x|)
@fake(("x", "y", "a"), written={1}, read={0})
def sine_far_out(x, y, a):
    y[:] = a * np.sin(x)


@sine_far_out
def sine_far_out(fwd, adj):
    _scale_adjoint(fwd, adj)


def test_a_small_grid_spacing_gets_a_small_step(rng):
    args = (rng.standard_normal(5), np.zeros(5), 0.005)
    result = check_grad(over_spacing, args)
    assert result.jacobian_checked and result.max_rel_error < 1e-7
    # the dx column of the finite-difference Jacobian against d(u/dx^2)/ddx
    jac = numerical_jacobian(over_spacing, args, wrt="dx")
    np.testing.assert_allclose(jac[:, 0], -2.0 * args[0] / 0.005 ** 3, rtol=1e-8)


def test_a_small_error_in_a_small_parameter_still_fails(rng):
    args = (rng.standard_normal(5), np.zeros(5), 0.005)
    with pytest.raises(AssertionError, match="argument 'dx'"):
        check_grad(over_spacing_slightly_wrong, args)


def test_truncation_error_is_cleared_by_the_confirming_step(rng):
    # at |x| ~ 1000 the first step's truncation error (~6e-6 relative) exceeds rtol;
    # the step four times smaller agrees
    x = 1000.0 + rng.standard_normal(6)
    assert check_grad(sine_far_out, (x, np.zeros(6), 1.3)).max_rel_error < 1e-6
    with pytest.raises(AssertionError, match=r"d\(y after\)/d\(x before\)"):
        check_grad(scale_wrong_in_one_element, (x, np.zeros(6), 1.3), rtol=1e-6)


@fake(("x", "y", "a"), written={1}, read={0})
def scale_slightly_wrong_everywhere(x, y, a):
    _scale(x, y, a)


@scale_slightly_wrong_everywhere
def scale_slightly_wrong_everywhere(fwd, adj):
    _scale_adjoint(fwd, adj, factor=1.0 + 1e-4)


def test_truncation_error_of_both_steps_is_extrapolated_away(rng):
    # at |x| ~ 10^4 both steps' truncation errors exceed rtol, shrinking sixteen-fold
    # from one to the other; extrapolated to a zero step (Richardson) the differences
    # agree with the right adjoint and not with one wrong by 1e-4
    x = 1.0e4 + rng.standard_normal(6)
    kernel = sine_far_out
    assert check_grad(kernel, (x, np.zeros(6), 1.3)).max_rel_error < 1e-6
    with pytest.raises(AssertionError, match=r"d\(y after\)/d\(x before\)"):
        check_grad(scale_wrong_in_one_element, (x, np.zeros(6), 1.3), rtol=1e-6)
    big = 1.0e4 + rng.standard_normal(400)      # the inner-product test alone
    assert not check_grad(kernel, (big, np.zeros(400), 1.3)).jacobian_checked
    with pytest.raises(AssertionError, match="argument 'x'"):
        check_grad(scale_slightly_wrong_everywhere, (big, np.zeros(400), 1.3))


# ---------------------------------------------------------------- kinks and ties


def _clamp_below(x, y):
    y[:] = np.maximum(x, 0.5)


# y = max(x, 0.5); at a tie the adjoint takes the x side
@fake(("x", "y"), written={1}, read={0})
def clamp_below(x, y):
    _clamp_below(x, y)


@clamp_below
def clamp_below(fwd, adj):
    (x, y), (adj_x, adj_y) = fwd, adj
    adj_x += np.where(x >= 0.5, adj_y, 0.0)
    adj_y[:] = 0.0


@fake(("x", "y"), written={1}, read={0})
def clamp_below_wrong_at_tie(x, y):
    _clamp_below(x, y)


@clamp_below_wrong_at_tie
def clamp_below_wrong_at_tie(fwd, adj):
    (x, y), (adj_x, adj_y) = fwd, adj
    adj_x += np.where(x > 0.5, adj_y, np.where(x == 0.5, 3.0 * adj_y, 0.0))
    adj_y[:] = 0.0


# y = x + 0.01 * max(x, 0.5): at one element of thirty, a kink too small for the
# inner-product test to see (its error is diluted by the other terms), not the Jacobian
@fake(("x", "y"), written={1}, read={0})
def small_kink(x, y):
    y[:] = x + 0.01 * np.maximum(x, 0.5)


@small_kink
def small_kink(fwd, adj):
    (x, y), (adj_x, adj_y) = fwd, adj
    adj_x += (1.0 + 0.01 * (x >= 0.5)) * adj_y
    adj_y[:] = 0.0


def _with_tie(rng, n, at):
    x = rng.standard_normal(n)
    x[at] = 0.5
    return x


def test_a_tie_is_reported_as_a_kink(rng):
    x = _with_tie(rng, 6, 3)
    with pytest.raises(AssertionError) as info:
        check_grad(clamp_below, (x, np.zeros(6)))
    text = str(info.value)
    assert "inner-product test for argument 'x'" in text
    assert ("the function looks non-differentiable (a kink or tie) near this point; "
            "the adjoint's value is one of the one-sided derivatives") in text.lower()
    assert "x[3]: one-sided derivatives" in text
    x[3] = 0.7   # away from the tie the same adjoint passes
    check_grad(clamp_below, (x, np.zeros(6)))


def test_a_wrong_value_at_a_tie_is_neither_one_sided_derivative(rng):
    with pytest.raises(AssertionError, match=r"kink or tie.*x\[2\].*\(neither\)"):
        check_grad(clamp_below_wrong_at_tie, (_with_tie(rng, 5, 2), np.zeros(5)))


def test_the_jacobian_test_reports_a_kink_with_its_entry(rng):
    x = _with_tie(rng, 30, 7)
    with pytest.raises(AssertionError,
                       match=r"kink or tie.*d\(y\[7\] after\)/d\(x\[7\] before\)"):
        check_grad(small_kink, (x, np.zeros(30)), rtol=3e-3)
    x[7] = 0.6
    check_grad(small_kink, (x, np.zeros(30)), rtol=3e-3)


# ------------------------------------------------ real kernels: steps and kinks

if differentiate is not None:
    @differentiate
    @njit
    def diffusion_step(u, u_new, dx, dt):
        for i in range(1, u.shape[0] - 1):
            u_new[i] = u[i] + dt * (u[i - 1] - 2.0 * u[i] + u[i + 1]) / (dx * dx)

    @differentiate
    @njit
    def floor_at(x, y, floor):
        for i in range(x.shape[0]):
            y[i] = max(x[i], floor)


class ScaledSlot:
    """A real kernel whose adjoint is scaled by ``factor`` in adjoint slot ``slot``."""

    def __init__(self, kernel, slot, factor):
        self.kernel, self.slot, self.factor = kernel, slot, factor

    def adjoint_plan(self, *args):
        return self.kernel.adjoint_plan(*args)

    def forward(self, *args):
        return self.kernel.forward(*args)

    def adjoint(self, *args, **kwargs):
        self.kernel.adjoint(*args, **kwargs)
        n = len(self.kernel.arg_names)
        args[n + self.slot][...] *= self.factor


@needs_core
def test_real_kernel_with_a_small_grid_spacing(rng):
    args = (rng.standard_normal(8), np.zeros(8), 0.005, 1e-5)
    assert check_grad(diffusion_step, args).max_rel_error < 1e-7
    # slots: u, u_new, dx, dt; a relative error of 1e-5 in d/d(dx) is caught
    with pytest.raises(AssertionError, match="argument 'dx'"):
        check_grad(ScaledSlot(diffusion_step, 2, 1.0 + 1e-5), args)


@needs_core
def test_real_kernel_at_a_tie_reports_the_kink(rng):
    x = rng.standard_normal(5)
    x[2] = 0.25
    with pytest.raises(AssertionError, match=r"kink or tie.*x\[2\]"):
        check_grad(floor_at, (x, np.zeros(5), 0.25))
    x[2] = 0.4
    check_grad(floor_at, (x, np.zeros(5), 0.25))


# ------------------------------------------------------------- bounds checking

if differentiate is not None:
    import dataclasses

    from numba.core import config as numba_config

    @njit
    def doubled(x, y):
        for i in range(x.shape[0]):
            y[i] = 2.0 * x[i]

    def _doubled_adjoint_off_by_one(x, y, adj_x, adj_y):
        for i in range(x.shape[0]):
            adj_x[i] += 2.0 * adj_y[i + 1]      # one element past the end
        for i in range(y.shape[0]):
            adj_y[i] = 0.0

    class OffByOne(kadj.DifferentiatedKernel):
        """``doubled`` with a compiled adjoint that reads past the end of adj_y."""

        def __init__(self):
            super().__init__(doubled)
            self.broken = njit(_doubled_adjoint_off_by_one)

        def compiled(self, *args):
            return dataclasses.replace(super().compiled(*args), function=self.broken,
                                       disk_cached=False)

    @njit
    def _doubled_row(i, x, adj_x, adj_y):
        adj_x[i] += 2.0 * adj_y[i]
        if adj_y[i + 1] == adj_y[i + 1] + 1.0:    # one element past the end, no effect
            adj_x[i] += 0.0

    def _doubled_adjoint_through_a_row(x, y, adj_x, adj_y):
        for i in range(x.shape[0]):
            _doubled_row(i, x, adj_x, adj_y)
        for i in range(y.shape[0]):
            adj_y[i] = 0.0

    class OffByOneInARow(OffByOne):
        """``doubled`` whose adjoint calls a function of its module (as the bodies of
        parallel loops are) that reads past the end of adj_y without using the value."""

        def __init__(self):
            super().__init__()
            self.broken = njit(_doubled_adjoint_through_a_row)


@pytest.fixture
def no_global_boundscheck(monkeypatch):
    """Numba's own default (``boundscheck`` per function) instead of the suite's
    NUMBA_BOUNDSCHECK=1, so that only check_grad's bounds checking is at work."""
    monkeypatch.delenv("NUMBA_BOUNDSCHECK", raising=False)
    numba_config.reload_config()
    assert numba_config.BOUNDSCHECK is None
    yield
    monkeypatch.undo()
    numba_config.reload_config()


@needs_core
def test_check_grad_runs_the_adjoint_with_bounds_checking(rng, no_global_boundscheck):
    with pytest.raises(AssertionError, match="indexed an array out of bounds") as info:
        check_grad(OffByOne(), (rng.standard_normal(6), np.zeros(6)))
    assert "'doubled'" in str(info.value)
    assert isinstance(info.value.__cause__, IndexError)


@needs_core
def test_check_grad_bounds_checks_the_functions_the_adjoint_calls(rng,
                                                                  no_global_boundscheck):
    args = (rng.standard_normal(6), np.zeros(6))
    kernel = OffByOneInARow()
    kernel.adjoint(*args, np.zeros(6), np.ones(6))      # unchecked, the read goes unseen
    with pytest.raises(AssertionError, match="indexed an array out of bounds") as info:
        check_grad(kernel, args)
    assert isinstance(info.value.__cause__, IndexError)
    # the module's own function is left as it was
    assert _doubled_row.targetoptions.get("boundscheck") is None


@needs_core
def test_the_suite_compiles_with_bounds_checking(rng):
    # tests/conftest.py sets NUMBA_BOUNDSCHECK=1 unless the environment sets it
    assert numba_config.BOUNDSCHECK == int(os.environ["NUMBA_BOUNDSCHECK"])
    kernel, x = OffByOne(), rng.standard_normal(6)
    if numba_config.BOUNDSCHECK:
        with pytest.raises(IndexError):
            kernel.adjoint(x, np.zeros(6), np.zeros(6), np.ones(6))


def test_changes_lost_in_large_outputs_cannot_be_checked(rng):
    # x * x + 1e20 rounds to 1e20 on both sides of every step: the differences see no
    # change, and a right adjoint is not declared wrong; it cannot be checked there
    x = rng.uniform(0.5, 1.0, 64)
    with pytest.raises(AssertionError) as info:
        check_grad(_square_scaled_by(1.0, 1e20), (x, np.zeros(64)), full_jacobian_max=0)
    text = str(info.value)
    assert "cannot check the gradient of kernel 'square' for argument 'x'" in text
    assert "left unchanged" in text and re.search(r"of size up to [\d.]+e\+2\d", text)
    # at an offset the differences resolve, the same adjoint passes and a wrong one
    # is still reported as wrong
    check_grad(_square_scaled_by(1.0, 1e4), (x, np.zeros(64)), full_jacobian_max=0)
    with pytest.raises(AssertionError, match="inner-product test for argument 'x'"):
        check_grad(_square_scaled_by(1.1, 1e4), (x, np.zeros(64)), full_jacobian_max=0)


def _cancels(big, factor):
    """y = (x + big) - big: x itself, computed through an intermediate ``big`` times
    larger than the outputs, whose rounding the outputs' sizes do not show; the
    adjoint is ``factor`` times the true one (exact for 1)."""

    @fake(("x", "y"), written={1}, read={0})
    def cancels(x, y):
        y[:] = (x + big) - big

    @cancels
    def cancels(fwd, adj):
        (x, y), (adj_x, adj_y) = fwd, adj
        adj_x += factor * adj_y
        adj_y[:] = 0.0

    return cancels


@pytest.mark.parametrize("n", [40, 5000])
def test_rounding_noise_of_intermediates_is_measured_not_reported(rng, n):
    # the outputs are about 1, the intermediates 1e8: finite differences carry noise
    # of about 1e-8 / step, far above rtol, which the outputs' sizes do not predict;
    # measured along the direction, it clears the right adjoint (no "kink" either)
    args = (rng.uniform(0.5, 1.0, n), np.zeros(n))
    check_grad(_cancels(1e8, 1.0), args)
    # a wrong adjoint still fails where finite differences see it
    with pytest.raises(AssertionError, match="inner-product test for argument 'x'"):
        check_grad(_cancels(1e8, 1.5), args)
    # and noise larger than half the inner product cannot decide: said, not passed
    with pytest.raises(AssertionError, match="cannot check the gradient"):
        check_grad(_cancels(1e11, 1.0), args)
