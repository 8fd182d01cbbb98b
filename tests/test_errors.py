"""Refusals and argument checks.

A kernel kadj cannot differentiate raises :class:`kadj.DifferentiationError` whose
message names the kernel, ``file:line`` of the offending construct, and a remedy
("What you can do: ..."), per API.md.  The offending line of every kernel below is
marked with ``# <- refused``; the test finds that line and expects it in the message.
"""
import inspect
import math
import os
import re
import sys

import numpy as np
import pytest
from numba import njit

import kadj
from kadj import rules

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fdcheck import fd_check  # noqa: E402

THIS_FILE = os.path.basename(__file__)


# ---- kernels kadj must refuse ------------------------------------------------------------
@njit
def fancy_index(x, idx, y):
    z = x[idx]  # <- refused (whole-array NumPy is lowered; fancy indexing is not)
    for i in range(y.shape[0]):
        y[i] = z[i]


@njit
def variable_axis(A, y):
    col = np.sum(A, axis=A.shape[0] - 3)  # <- refused
    for j in range(y.shape[0]):
        y[j] = col[j] * col[j]


@njit
def cumprod_call(x, y):
    c = np.cumprod(x)  # <- refused
    for i in range(y.shape[0]):
        y[i] = c[i]


@njit
def variable_step_slice(x, y):
    k = x.shape[0] // 2
    s = x[::k]  # <- refused
    for i in range(s.shape[0]):
        y[i] = s[i]


@njit
def no_rule_call(x, y):
    for i in range(x.shape[0]):
        y[i] = np.logaddexp(x[i], 0.5)  # <- refused


@njit
def iterate_array(x):
    s = 0.0
    for v in x:  # <- refused
        s += v * v
    return s


@njit
def scratch_in_loop(x, y):
    for i in range(x.shape[0]):
        t = np.empty(i + 2)  # <- refused (its shape changes with the loop)
        t[0] = x[i]
        t[1] = x[i] * x[i]
        y[i] = t[0] + t[1]


def _a(n=5):
    return np.linspace(0.3, 1.7, n)


REFUSED = [
    ("fancy_index", fancy_index, lambda: (_a(), np.array([4, 0, 2]), np.zeros(3))),
    ("variable_axis", variable_axis, lambda: (np.outer(_a(3), _a(2)), np.zeros(2))),
    ("cumprod_call", cumprod_call, lambda: (_a(), np.zeros(5))),
    ("variable_step_slice", variable_step_slice, lambda: (_a(), np.zeros(3))),
    ("no_rule_call", no_rule_call, lambda: (_a(), np.zeros(5))),
    ("iterate_array", iterate_array, lambda: (_a(),)),
    ("scratch_in_loop", scratch_in_loop, lambda: (_a(), np.zeros(5))),
]


def _refused_line(kernel):
    lines, first = inspect.getsourcelines(kernel.py_func)
    hits = [first + j for j, text in enumerate(lines) if "# <- refused" in text]
    assert len(hits) == 1
    return hits[0]


def _check_message(msg, kernel_name, line):
    assert kernel_name in msg, f"message does not name the kernel:\n{msg}"
    assert re.search(re.escape(THIS_FILE) + r":\d+", msg), f"no file:line in\n{msg}"
    assert f"{THIS_FILE}:{line}" in msg, f"expected {THIS_FILE}:{line} in\n{msg}"
    assert "What you can do" in msg, f"no remedy in\n{msg}"
    remedy = msg.split("What you can do", 1)[1].split("\n", 1)[0]
    assert len(remedy.strip(" :")) > 10, f"empty remedy in\n{msg}"


REFUSED_CASES = [pytest.param(*c, id=c[0]) for c in REFUSED]


@pytest.mark.parametrize("name,kernel,make", REFUSED_CASES)
def test_refused_on_adjoint(name, kernel, make):
    k = kadj.differentiate(kernel)
    args = make()
    plan_like = [np.zeros_like(a) for a in args if isinstance(a, np.ndarray)]
    before = [a.copy() for a in args]
    with pytest.raises(kadj.DifferentiationError) as info:
        k.adjoint(*args, *plan_like)
    _check_message(str(info.value), name, _refused_line(kernel))
    for a, b in zip(args, before):
        np.testing.assert_array_equal(a, b)
    # the forward itself is untouched by the refusal
    k.forward(*args)


@pytest.mark.parametrize("name,kernel,make", REFUSED_CASES)
def test_refused_on_plan(name, kernel, make):
    k = kadj.differentiate(kernel)
    with pytest.raises(kadj.DifferentiationError) as info:
        k.adjoint_plan(*make())
    _check_message(str(info.value), name, _refused_line(kernel))


def test_no_rule_remedy_names_register_adjoint():
    k = kadj.differentiate(no_rule_call)
    with pytest.raises(kadj.DifferentiationError) as info:
        k.adjoint_plan(_a(), np.zeros(5))
    msg = str(info.value)
    assert "logaddexp" in msg and "register_adjoint" in msg, msg


def test_wrt_on_integer_argument_is_refused():
    @njit
    def scaled_copy(x, n, y):
        for i in range(x.shape[0]):
            y[i] = x[i] * n

    k = kadj.differentiate(scaled_copy, wrt=("x", "n"))
    with pytest.raises(kadj.DifferentiationError) as info:
        k.adjoint_plan(_a(), 3, np.zeros(5))
    assert "scaled_copy" in str(info.value) and "'n'" in str(info.value)


def test_wrt_unknown_name():
    with pytest.raises(ValueError, match="nope"):
        kadj.differentiate(cumprod_call, wrt=("nope",))


def test_differentiate_requires_a_jitted_function():
    def plain(x):
        return x

    with pytest.raises(TypeError, match="njit"):
        kadj.differentiate(plain)


# ---- custom rules -------------------------------------------------------------------------
@njit
def my_softplus(v):
    return np.logaddexp(0.0, v)  # no built-in rule for logaddexp


@njit
def softplus_layer(x, w, y):
    for i in range(x.shape[0]):
        y[i] = my_softplus(w[i] * x[i]) + 0.5 * x[i]


def test_register_adjoint_makes_kernel_differentiable():
    args = (np.array([-2.0, -0.3, 0.4, 1.1, 3.0]), np.array([0.7, -1.2, 0.5, 2.0, 0.9]),
            np.zeros(5))
    assert rules.lookup(my_softplus) is None
    with pytest.raises(kadj.DifferentiationError) as info:
        kadj.differentiate(softplus_layer).adjoint_plan(*args)
    assert "softplus_layer" in str(info.value) and "What you can do" in str(info.value)

    try:
        @kadj.register_adjoint(my_softplus)
        def _softplus_vjp(g, out, v):
            # d softplus / dv = sigmoid(v) = 1 - exp(-softplus(v))
            return (g * (1.0 - kadj.ops.exp(-out)),)

        k = kadj.differentiate(softplus_layer)   # a fresh kernel object
        fd_check(k, args, rtol=1e-6, atol=1e-9)
        # the custom rule is used directly (the helper is called, not differentiated)
        src = k.adjoint_source(*args)
        assert "math.exp" in src or "np.exp" in src, src
    finally:
        for key in [key for key, r in rules.RULES.items() if key is my_softplus]:
            del rules.RULES[key]


# ---- argument checks of .adjoint ------------------------------------------------------------
@njit
def axpy(x, y, a):
    for i in range(x.shape[0]):
        y[i] = a * x[i] + y[i]


def _axpy_args():
    return np.linspace(-1.0, 1.0, 4), np.linspace(0.5, 2.0, 4), 0.3


def _unchanged(args, before):
    for a, b in zip(args, before):
        if isinstance(a, np.ndarray):
            np.testing.assert_array_equal(a, b, err_msg="a failing adjoint call modified a "
                                          "forward argument")
        else:
            assert a == b


@pytest.fixture
def axpy_k():
    return kadj.differentiate(axpy)


def _expect(exc, match, k, args, *bufs):
    before = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    with pytest.raises(exc, match=match) as info:
        k.adjoint(*args, *bufs)
    _unchanged(args, before)
    return str(info.value)


def test_adjoint_too_few_adjoints(axpy_k):
    x, y, a = args = _axpy_args()
    msg = _expect(TypeError, "adjoint", axpy_k, args, np.zeros(4), np.ones(4))
    assert "axpy" in msg and "3" in msg and "2" in msg, msg


def test_adjoint_too_many_adjoints(axpy_k):
    args = _axpy_args()
    msg = _expect(TypeError, "adjoint", axpy_k, args, np.zeros(4), np.ones(4), np.zeros(1),
                  np.zeros(1))
    assert "axpy" in msg, msg


def test_adjoint_missing_forward_args(axpy_k):
    x, y, a = _axpy_args()
    with pytest.raises(TypeError, match="axpy"):
        axpy_k.adjoint(x, y)


def test_adjoint_wrong_shape(axpy_k):
    args = _axpy_args()
    msg = _expect(ValueError, "shape", axpy_k, args, np.zeros(5), np.ones(4), np.zeros(1))
    assert "adj_x" in msg or "'x'" in msg or " x " in msg, msg


def test_adjoint_wrong_dtype(axpy_k):
    args = _axpy_args()
    _expect(ValueError, "dtype", axpy_k, args, np.zeros(4, np.float32), np.ones(4),
            np.zeros(1))


def test_adjoint_scalar_slot_must_be_one_element_array(axpy_k):
    args = _axpy_args()
    _expect(TypeError, "array", axpy_k, args, np.zeros(4), np.ones(4), 0.0)
    _expect(ValueError, "1-element", axpy_k, args, np.zeros(4), np.ones(4), np.zeros(2))
    _expect(ValueError, "dtype", axpy_k, args, np.zeros(4), np.ones(4),
            np.zeros(1, np.float32))


def test_adjoint_buffer_aliasing_forward_arg(axpy_k):
    x, y, a = args = _axpy_args()
    msg = _expect(ValueError, "shares memory", axpy_k, args, x, np.ones(4), np.zeros(1))
    assert "axpy" in msg
    # a view of a forward argument counts too
    big = np.linspace(0.0, 1.0, 8)
    args2 = (big[2:6], y, a)
    _expect(ValueError, "shares memory", axpy_k, args2, big[:4], np.ones(4), np.zeros(1))


def test_adjoint_buffers_aliasing_each_other(axpy_k):
    args = _axpy_args()
    buf = np.zeros(4)
    _expect(ValueError, "share memory", axpy_k, args, buf, buf, np.zeros(1))


def test_adjoint_read_only_buffer(axpy_k):
    args = _axpy_args()
    ro = np.zeros(4)
    ro.flags.writeable = False
    _expect(ValueError, "read-only", axpy_k, args, ro, np.ones(4), np.zeros(1))


def test_adjoint_forward_args_overlapping_views(axpy_k):
    big = np.linspace(-1.0, 1.0, 6)
    args = (big[:4], big[2:], 0.3)   # y overlaps x: the kernel writes what it reads as x
    _expect(ValueError, "overlaps", axpy_k, args, np.zeros(4), np.ones(4), np.zeros(1))


# regression: _check_adjoints used to skip `a is w`
def test_adjoint_forward_args_same_array(axpy_k):
    x = np.linspace(-1.0, 1.0, 4)
    args = (x, x, 0.3)     # y is x: the kernel writes an array it also reads as x
    _expect(ValueError, "overlaps", axpy_k, args, np.zeros(4), np.ones(4), np.zeros(1))


def test_adjoint_wrong_forward_arity():
    k = kadj.differentiate(axpy)
    with pytest.raises(TypeError, match="axpy"):
        k.adjoint_plan(np.zeros(4), np.zeros(4))


def test_failing_adjoint_leaves_buffers_and_args_alone(axpy_k):
    x, y, a = args = _axpy_args()
    adj_x, adj_y = np.full(4, 7.0), np.full(4, 3.0)
    with pytest.raises(ValueError):
        axpy_k.adjoint(x, y, a, adj_x, adj_y, np.zeros(2))
    np.testing.assert_array_equal(adj_x, 7.0)
    np.testing.assert_array_equal(adj_y, 3.0)
    _unchanged(args, _axpy_args())
    # and a correct call afterwards works and gives the right gradient
    fd_check(axpy_k, _axpy_args(), rtol=1e-6, atol=1e-9)
