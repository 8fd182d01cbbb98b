"""check_grad tests: it passes correct adjoints and fails wrong ones.

Fake kernels with hand-written adjoints (right and deliberately wrong) check the
checker itself, independently of the code generator: a gradient check that cannot
fail proves nothing.  The last part runs it on real ``@kadj.differentiate`` kernels.
"""
import math

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


@scale
def scale(fwd, adj):
    (x, y, a), (adj_x, adj_y, adj_a) = fwd, adj
    adj_x += a * np.cos(x) * adj_y
    adj_a[0] += np.sum(np.sin(x) * adj_y)
    adj_y[:] = 0.0


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
