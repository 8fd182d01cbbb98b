"""Unusual but legal kernels at the frontend and structuring level: each one either
differentiates (checked against float64 central differences) or is refused with a
:class:`kadj.DifferentiationError` naming the kernel, ``file:line``, the construct and
what to do, never a raw AttributeError/KeyError/NameError from inside kadj.

The line a refusal must point at is marked ``# <- refused`` in the kernel or helper
passed as ``where``.

PYTEST_DONT_REWRITE: the kernels' own ``assert`` statements must stay plain Python
asserts (pytest's rewriting would change the kernels under test).
"""
import inspect
import math
import operator
import os
import sys

import numba
import numpy as np
import pytest
from numba import literal_unroll, njit

import kadj
from kadj import frontend, ir, structurize

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fdcheck import fd_check  # noqa: E402

THIS_FILE = os.path.basename(__file__)


def _x(n=5):
    return np.linspace(0.3, 1.7, n)


def _marked_line(fn):
    py = getattr(fn, "py_func", fn)
    lines, first = inspect.getsourcelines(py)
    hits = [first + j for j, text in enumerate(lines) if "# <- refused" in text]
    assert len(hits) == 1, f"{py.__name__} needs exactly one '# <- refused' marker"
    return hits[0]


def _refusal(kernel, args, where=None, *, construct, remedy):
    """The refusal message of ``kernel``; checks kernel name, file:line of the marked
    line of ``where`` (default: the kernel), the construct and the remedy."""
    with pytest.raises(kadj.DifferentiationError) as info:
        kadj.differentiate(kernel).adjoint_plan(*args)
    msg = str(info.value)
    name = kernel.py_func.__name__
    assert f"kernel '{name}'" in msg, f"message does not name the kernel:\n{msg}"
    line = _marked_line(where or kernel)
    assert f"{THIS_FILE}:{line}" in msg, f"expected {THIS_FILE}:{line} in\n{msg}"
    assert construct in msg, f"expected the construct '{construct}' in\n{msg}"
    assert "What you can do" in msg, f"no remedy in\n{msg}"
    assert remedy in msg.split("What you can do", 1)[1], f"expected '{remedy}' in\n{msg}"
    return msg


# ---- object mode and other with-blocks ---------------------------------------------
@njit
def with_objmode(x, y):
    for i in range(x.shape[0]):
        y[i] = 2.0 * x[i]
    with numba.objmode():  # <- refused
        print("done")


@njit
def objmode_helper(v):
    with numba.objmode(r="float64"):  # <- refused
        r = 2.0 * v
    return r


@njit
def calls_objmode_helper(x, y):
    for i in range(x.shape[0]):
        y[i] = objmode_helper(x[i])


@njit
def with_chunksize(x, y):
    with numba.parallel_chunksize(2):  # <- refused
        for i in numba.prange(x.shape[0]):
            y[i] = 2.0 * x[i]


def test_objmode_block_is_refused():
    msg = _refusal(with_objmode, (_x(), np.zeros(5)), construct="objmode",
                   remedy="move the object-mode code out of the kernel")
    assert "object-mode blocks cannot be differentiated" in msg
    assert "register a custom adjoint" in msg


def test_objmode_block_in_helper_names_the_helper():
    msg = _refusal(calls_objmode_helper, (_x(), np.zeros(5)), where=objmode_helper,
                   construct="objmode", remedy="register a custom adjoint")
    assert "objmode_helper" in msg


def test_other_with_blocks_are_refused():
    _refusal(with_chunksize, (_x(), np.zeros(5)), construct="with-block",
             remedy="remove the with-statement")


# ---- many calls to helpers, nesting, recursion -------------------------------------
@njit
def poly_helper(v):
    return v * v + 0.5 * v


def _straight_line_calls(n):
    """A kernel with ``n`` lines ``s += poly_helper(x[k])`` (no loop, no recursion)."""
    src = "def many_calls(x):\n    s = 0.0\n" + "".join(
        f"    s += poly_helper(x[{k % 5}]) * {1.0 + k / n!r}\n" for k in range(n)) + \
        "    return s\n"
    ns = {"poly_helper": poly_helper}
    exec(compile(src, f"<many_calls_{n}>", "exec"), ns)
    return njit(ns["many_calls"])


def test_seventy_calls_to_one_helper_differentiate():
    k = kadj.differentiate(_straight_line_calls(70))
    fd_check(k, (_x(),), rtol=1e-6, atol=1e-9)


@pytest.mark.slow
def test_five_hundred_calls_to_one_helper_are_all_inlined():
    kern = _straight_line_calls(500)
    tk = frontend.type_cpu_kernel(kern, (numba.typeof(_x()),))
    tree = structurize.structurize(tk)
    # each inlined poly_helper multiplies v * v and 0.5 * v; the kernel adds a scale
    muls = [s for s in ir.walk(tree.body) if isinstance(s, ir.Assign) and
            isinstance(s.expr, ir.Op) and s.expr.fn is operator.mul]
    assert len(muls) == 3 * 500


def test_too_many_inlined_calls_are_refused_clearly(monkeypatch):
    monkeypatch.setattr(frontend, "_MAX_INLINED_CALLS", 10)
    with pytest.raises(kadj.DifferentiationError) as info:
        kadj.differentiate(_straight_line_calls(12)).adjoint_plan(_x())
    msg = str(info.value)
    assert "kernel 'many_calls'" in msg and "more than 10 inlined calls" in msg, msg
    assert "register a custom adjoint for 'poly_helper'" in msg, msg


@njit
def level3(v):
    return v * v + 1.0


@njit
def level2(v):
    return level3(v) * math.sin(v) + level3(0.5 * v)


@njit
def level1(v):
    return level2(v) - level3(level2(v))


@njit
def nested_helpers(x, y):
    for i in range(x.shape[0]):
        y[i] = level1(x[i]) + level2(x[i]) * level3(x[i])


def test_nested_helpers_differentiate():
    fd_check(kadj.differentiate(nested_helpers), (_x(), np.zeros(5)), rtol=1e-6,
             atol=1e-9)


@njit
def power_rec(v, n):
    if n <= 0:
        return 1.0
    return v * power_rec(v, n - 1)  # <- refused


@njit
def uses_recursion(x, y):
    for i in range(x.shape[0]):
        y[i] = power_rec(x[i], 3)


@njit
def ping(v, n):
    if n <= 0:
        return v
    return pong(v * 1.1, n - 1)


@njit
def pong(v, n):
    return ping(v + 0.1, n - 1)  # <- refused


@njit
def uses_mutual_recursion(x, y):
    for i in range(x.shape[0]):
        y[i] = ping(x[i], 4)


@njit
def calls_itself(x, y, n):
    if n > 0:
        calls_itself(x, y, n - 1)  # <- refused
    for i in range(x.shape[0]):
        y[i] += x[i]


def test_recursion_is_refused_naming_the_function():
    msg = _refusal(uses_recursion, (_x(), np.zeros(5)), where=power_rec,
                   construct="recursive call", remedy="rewrite 'power_rec' as a loop")
    assert "'power_rec' is recursive (power_rec -> power_rec)" in msg
    assert "register a custom adjoint" in msg


def test_mutual_recursion_names_the_cycle():
    msg = _refusal(uses_mutual_recursion, (_x(), np.zeros(5)), where=pong,
                   construct="recursive call", remedy="as a loop")
    assert "ping -> pong -> ping" in msg, msg


def test_recursive_kernel_is_refused():
    msg = _refusal(calls_itself, (_x(), np.zeros(5), 2), construct="recursive call",
                   remedy="as a loop")
    assert "'calls_itself' is recursive" in msg


def test_recursive_helper_with_custom_adjoint_is_called():
    @njit
    def cube_rec(v, n):  # v ** n by recursion
        if n <= 0:
            return 1.0
        return v * cube_rec(v, n - 1)

    @njit
    def uses_cube(x, y):
        for i in range(x.shape[0]):
            y[i] = cube_rec(x[i], 3) + x[i]

    @kadj.register_adjoint(cube_rec)
    def _cube_vjp(g, out, v, n):
        return (g * n * out / v, None)

    try:
        fd_check(kadj.differentiate(uses_cube), (_x(), np.zeros(5)), rtol=1e-6,
                 atol=1e-9)
    finally:
        for table in (kadj.rules.RULES, kadj.rules.CUSTOM):
            for key in [key for key in table if key is cube_rec]:
                del table[key]


# ---- generators, closures, print ---------------------------------------------------
@njit
def squares(x):
    for i in range(x.shape[0]):
        yield x[i] * x[i]


@njit
def sums_generator(x):
    s = 0.0
    for v in squares(x):  # <- refused
        s += v
    return s


def test_generator_helper_is_refused():
    msg = _refusal(sums_generator, (_x(),), construct="generator",
                   remedy="write the values into an array")
    assert "'squares' is a generator function" in msg


@njit
def closure_over_array(x, w, y):
    def term(i):
        return w[i] * x[i] * x[i]

    for i in range(x.shape[0]):
        y[i] = term(i) + math.exp(-x[i])


def test_closure_over_arrays_differentiates():
    fd_check(kadj.differentiate(closure_over_array),
             (_x(), np.linspace(-1.0, 1.0, 5), np.zeros(5)), rtol=1e-6, atol=1e-9)


@njit
def prints_and_asserts(x, y):
    assert x.shape[0] == y.shape[0], "shapes differ"
    for i in range(x.shape[0]):
        assert x[i] > -1e6
        y[i] = x[i] * math.sin(x[i])
        print("y", i, y[i])


def test_print_and_assert_differentiate(capsys):
    fd_check(kadj.differentiate(prints_and_asserts), (_x(), np.zeros(5)), rtol=1e-6,
             atol=1e-9)
    assert "y 0" in capsys.readouterr().out  # the forward still prints


# ---- raise: the path that does not raise is differentiated --------------------------
@njit
def raise_in_branch(x, y):
    for i in range(x.shape[0]):
        if x[i] > 0.0:
            if x[i] > 1e6:
                raise ValueError("too large", x[i])
            y[i] = x[i] * x[i]
        else:
            y[i] = -x[i]
        y[i] += math.sqrt(x[i] + 1.0)


@njit
def cube_root(a):
    z = a
    for _ in range(60):
        dz = (z * z * z - a) / (3.0 * z * z)
        z = z - dz
        if abs(dz) < 1e-14:
            return z
    raise RuntimeError("no convergence")


@njit
def newton_or_raise(x, y):
    for i in range(x.shape[0]):
        y[i] = cube_root(x[i]) * x[i]


@njit
def always_raises(x, y):
    for i in range(x.shape[0]):
        y[i] = x[i]
    raise ValueError("unconditional")  # <- refused


@njit
def loop_left_by_raise_only(x):
    z = x[0]
    while True:
        z = 0.5 * z + x[1]
        if z > 1e300:
            raise OverflowError("diverged")  # <- refused


def test_raise_in_branch_differentiates_the_other_path():
    x = np.array([-0.5, 0.3, 0.9, 1.4, -0.2])
    k = kadj.differentiate(raise_in_branch)
    fd_check(k, (x, np.zeros(5)), rtol=1e-6, atol=1e-9)
    with pytest.raises(ValueError):  # the forward still raises
        k(np.array([2e6]), np.zeros(1))


def test_raise_after_loop_with_return_differentiates():
    fd_check(kadj.differentiate(newton_or_raise), (_x(), np.zeros(5)), rtol=1e-6,
             atol=1e-9)


def test_unconditional_raise_is_refused():
    _refusal(always_raises, (_x(), np.zeros(5)), construct="raise",
             remedy="make the raise conditional")


def test_loop_left_only_by_raise_is_refused():
    msg = _refusal(loop_left_by_raise_only, (_x(),), construct="raise",
                   remedy="make the raise conditional")
    assert "reached on every path" in msg


@njit
def try_except(x, y):
    for i in range(x.shape[0]):
        try:
            y[i] = 3.0 * x[i]  # <- refused
        except Exception:
            y[i] = 0.0


def test_try_except_is_refused():
    _refusal(try_except, (_x(), np.zeros(5)), construct="try/except",
             remedy="remove the try/except")


# ---- tuples, literal_unroll, strings ----------------------------------------------
COEFFS = (0.5, -0.25, 0.125, 2.0)


@njit
def global_tuple(x, y):
    for i in range(x.shape[0]):
        acc = COEFFS[0] + COEFFS[3] * x[i]
        for k in range(1, 3):
            acc += COEFFS[k] * x[i] ** (k + 1)
        y[i] = acc


@njit
def local_tuple(x, y):
    weights = (1.5, -2.0, 0.75)
    for i in range(1, x.shape[0] - 1):
        acc = 0.0
        for k in range(3):
            acc += weights[k] * x[i + k - 1] * x[i]
        y[i] = acc


def test_constant_tuples_indexed_in_loops_differentiate():
    fd_check(kadj.differentiate(global_tuple), (_x(), np.zeros(5)), rtol=1e-6,
             atol=1e-9)
    fd_check(kadj.differentiate(local_tuple), (_x(), np.zeros(5)), rtol=1e-6,
             atol=1e-9)


@njit
def tuple_argument_in_loop(x, c):
    s = 0.0
    for k in range(2):
        s += c[k] * x[k]  # <- refused
    return s


def test_tuple_argument_indexed_by_loop_is_refused():
    _refusal(tuple_argument_in_loop, (_x(), (0.5, 0.25)), construct="tuple index",
             remedy="pass the values as an array")


@njit
def unrolled(x):
    s = 0.0
    for c in literal_unroll((1.5, 2.5, 3.5)):  # <- refused
        s += c * x[0] * x[1]
    return s


def test_literal_unroll_is_refused():
    _refusal(unrolled, (_x(),), construct="literal_unroll",
             remedy="loop over range(n)")


@njit
def scheme(x, y, mode):
    for i in range(1, x.shape[0]):
        if mode == "upwind":
            y[i] = x[i] * (x[i] - x[i - 1])
        else:
            y[i] = 0.5 * x[i] * (x[i] + x[i - 1])


@njit
def scheme_constant(x, y):
    mode = "central"
    label = "unused label"
    for i in range(1, x.shape[0]):
        if mode == "upwind" or len(label) == 0:
            y[i] = x[i] - x[i - 1]
        else:
            y[i] = 0.5 * (x[i] + x[i - 1]) * x[i]


@pytest.mark.parametrize("mode", ["upwind", "central"])
def test_string_argument_compared_in_loop(mode):
    fd_check(kadj.differentiate(scheme), (_x(), np.zeros(5), mode), rtol=1e-6,
             atol=1e-9)


def test_string_constants():
    fd_check(kadj.differentiate(scheme_constant), (_x(), np.zeros(5)), rtol=1e-6,
             atol=1e-9)


# ---- clearer refusals of other legal constructs -------------------------------------
@njit
def enumerate_loop(x):
    s = 0.0
    for k, v in enumerate(x):  # <- refused
        s += v * k
    return s


@njit
def list_of_floats(x):
    weights = [1.0, 2.0, 3.0]  # <- refused
    s = 0.0
    for k in range(3):
        s += weights[k] * x[k]
    return s


@njit
def random_noise(x):
    s = 0.0
    for k in range(x.shape[0]):
        s += np.random.rand() * x[k]  # <- refused
    return s


def test_enumerate_is_refused_as_a_loop():
    _refusal(enumerate_loop, (_x(),), construct="enumerate",
             remedy="loop over range(len(x))")


def test_lists_are_refused():
    _refusal(list_of_floats, (_x(),), construct="list", remedy="tuple of constants")


def test_random_numbers_are_refused():
    _refusal(random_noise, (_x(),), construct="rand",
             remedy="draw the random numbers outside the kernel")


@njit
def _square(v):
    return v * v


@njit
def function_argument(f, x):
    s = 0.0
    for k in range(x.shape[0]):
        s += f(x[k])  # <- refused
    return s


def test_a_function_passed_as_an_argument_is_refused_with_what_to_do():
    _refusal(function_argument, (_square, _x()), construct="dynamic call",
             remedy="factory that closes over the function")

    def make(f):
        @njit
        def total(x):
            s = 0.0
            for k in range(x.shape[0]):
                s += f(x[k])
            return s
        return total
    x = _x()
    assert np.allclose(kadj.grad(make(_square))(x), 2 * x)
