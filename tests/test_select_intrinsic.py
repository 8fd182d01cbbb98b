"""``_select(c, a, b)`` (kadj/select_intrinsic.py): the conditional expression's value
and type, lowered to one ``select``; CPU adjoints choose with it, CUDA ones keep the
conditional expression."""
import math

import numba
import numpy as np
import pytest
from numba import cuda, njit, types

import kadj
from kadj.select_intrinsic import _select

from fdcheck import fd_check
from test_lean_lowering import _function_body, _lowered_text


@njit(error_model="numpy")
def _chosen(c, a, b):
    return _select(c, a, b)


@njit(error_model="numpy")
def _ternary(c, a, b):
    return a if c else b


_VALUES = [0.0, -0.0, 1.5, -2.25, math.inf, -math.inf, math.nan, 1e-310]


@pytest.mark.parametrize("c", [True, False])
@pytest.mark.parametrize("a", _VALUES)
def test_value_of_the_conditional_expression(c, a):
    for b in _VALUES:
        got, want = _chosen(c, a, b), _ternary(c, a, b)
        assert type(got) is type(want)
        assert (math.isnan(got) and math.isnan(want)) or (
            got == want and math.copysign(1, got) == math.copysign(1, want))
        assert _select(c, a, b) is (a if c else b)          # as Python


@pytest.mark.parametrize("args", [
    (True, np.float32(1.5), np.float32(2.0)),
    (False, 0.0, np.float32(2.5)),
    (True, np.float32(1.5), 0.0),
    (False, 3, 2.5),
    (True, 3, np.int32(4)),
    (np.int64(0), 1.0, 2.0),
    (np.float64(0.5), 1.0, 2.0),
    (False, True, False),
])
def test_type_of_the_conditional_expression(args):
    got, want = _chosen(*args), _ternary(*args)
    assert got == want
    assert _chosen.nopython_signatures[-1].return_type == \
        _ternary.nopython_signatures[-1].return_type


def test_no_complex_or_arrays():
    with pytest.raises(numba.core.errors.TypingError):
        _chosen(True, 1j, 2.0)
    with pytest.raises(numba.core.errors.TypingError):
        _chosen(True, np.ones(2), np.ones(2))


def _lowered(monkeypatch, fn, args):
    """The LLVM IR numba lowered for ``fn``'s own function, before LLVM optimised it."""
    name = fn.py_func.__name__
    return "\n".join(_function_body(_lowered_text(monkeypatch, fn, args, name), name))


def test_one_select_no_branch(monkeypatch):
    def chosen(c, a, b):
        return _select(c > 0.0, a, b)

    def ternary(c, a, b):
        return a if c > 0.0 else b

    lean = _lowered(monkeypatch, njit(chosen), (1.0, 2.0, 3.0))
    plain = _lowered(monkeypatch, njit(ternary), (1.0, 2.0, 3.0))
    assert "select" in lean and "br i1" not in lean
    assert "br i1" in plain


def test_both_values_computed_without_exceptions():
    """A division by zero in the value not chosen: an infinity, not an error."""
    @njit(error_model="numpy")
    def f(g, x):
        return _select(g == 0.0, 0.0, g / x)

    assert f(0.0, 0.0) == 0.0
    assert f(2.0, 4.0) == 0.5


# ---- in adjoints -----------------------------------------------------------------------
@njit
def _sqrt_sum(x, out):
    for i in range(x.shape[0]):
        out[i] = math.sqrt(x[i]) * x[i] + math.sqrt(x[i])


def test_cpu_adjoint_chooses_with_select():
    k = kadj.differentiate(_sqrt_sum)
    x = np.linspace(0.5, 2.0, 7)
    src = k.adjoint_source(x, np.zeros(7))
    assert "_select(" in src and " else " not in src
    assert "from kadj.select_intrinsic import _select" in src
    fd_check(k, (x, np.zeros(7)))


def test_strong_zero_at_a_singular_point():
    """x = 0 with a zero cotangent for that element: sqrt's infinite derivative there
    contributes nothing (the strong zero chosen by _select)."""
    k = kadj.differentiate(_sqrt_sum)
    x = np.array([0.0, 1.0, 4.0])
    adj_x = np.zeros(3)
    k.adjoint(x, np.zeros(3), adj_x, np.array([0.0, 1.0, 1.0]))
    assert adj_x[0] == 0.0
    np.testing.assert_allclose(adj_x[1:], [1.5 * 1.0 + 0.5, 1.5 * 2.0 + 0.25])


@cuda.jit
def _sqrt_cuda(x, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = math.sqrt(x[i]) * x[i]


def test_cuda_adjoint_keeps_the_conditional_expression():
    k = kadj.differentiate(_sqrt_cuda)
    src = k.adjoint_source(np.ones(4), np.zeros(4))
    assert "_select(" not in src and " if " in src


def test_select_types_registered():
    from numba.core.registry import cpu_target
    ctx = cpu_target.typing_context
    fnty = ctx.resolve_value_type(_select)
    sig = fnty.get_call_type(ctx, (types.boolean, types.float64, types.float32), {})
    assert sig.return_type == types.float64


# ---- run as Python ---------------------------------------------------------------------
@njit
def _sqrt_total(x):
    total = 0.0
    for i in range(x.shape[0]):
        s = x[i] * x[i]
        for j in range(2):
            s = math.sqrt(s)
        total += s
    return total


def test_tape_measured_as_python_with_conditional_expressions(monkeypatch):
    """Measured as Python (the cost card's tape usage), the adjoint runs with each
    _select written back as the conditional expression."""
    from kadj import select_intrinsic, tape_measure
    seen = []

    def spy(fn, source):
        seen.append(source)
        out = select_intrinsic.as_conditional(fn, source)
        assert out is not fn
        return out

    monkeypatch.setattr(tape_measure, "as_conditional", spy)
    k = kadj.differentiate(_sqrt_total)
    x = np.array([0.5, 2.0, 3.0])
    usage = tape_measure.cpu_tape_usage(k, (x,))
    assert len(seen) == 1 and "_select(" in seen[0]
    assert usage["f64"][0] > 0


def test_as_conditional_keeps_lines_and_globals():
    from kadj.select_intrinsic import as_conditional
    source = ("def f(g, x):\n"
              "    y = _select(g == 0.0, 0.0, g / x)\n"
              "    return y\n")
    ns = {"_select": _select}
    exec(compile(source, "<f>", "exec"), ns)
    f = ns["f"]
    with pytest.raises(ZeroDivisionError):
        f(0.0, 0.0)
    g = as_conditional(f, source)
    assert g(0.0, 0.0) == 0.0 and g(1.0, 4.0) == 0.25
    assert g.__globals__ is f.__globals__
    assert {ln for _, _, ln in g.__code__.co_lines()} == {ln for _, _, ln in f.__code__.co_lines()}
    assert as_conditional(f, "def f(g, x):\n    return g\n") is f
