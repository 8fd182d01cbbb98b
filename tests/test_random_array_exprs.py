"""Property tests: random whole-array NumPy kernels, generated as source text, against
finite differences.

Hypothesis draws a kernel ``def k(u, v, w, a, out, loss, steps)`` written with
whole-array NumPy on 1-D arrays: expressions over the views ``u[1:-1]``, ``u[:-2]``,
``u[2:]`` (and of ``v`` and ``w``), earlier results, a scalar ``a`` and constants, with
``+ - *``, ``np.sin``, ``np.tanh``, ``np.exp(np.tanh(.))`` and ``np.where``; results bound
to variables of the source (read once or several times); updates of ``u`` or ``v``
through a slice assignment or an in-place operator that read the array they write at
other offsets (``u[1:-1] = u[1:-1] + a * (u[:-2] - u[2:])``), possibly inside a time
loop; and a loss from ``np.sum``, ``np.mean``, ``np.max`` or a write into ``out``.
Such kernels exercise the lowering to element loops and the fusion of intermediate
results into the loops that read them (:mod:`kadj.array_fusion`): a fused result that
read an array after it changed, or an update that did not see NumPy's copy of its
right-hand side, gives a wrong gradient here.  Each kernel is checked with
:func:`kadj.testing.check_grad` (float64 central differences, adjoint compiled with
bounds checking) at several sizes, down to a 1-element interior.

Derandomized; on failure the drawn source is printed (Hypothesis ``note``).  The
default run draws a few kernels; ``-m slow`` many more.
"""
import os
import re
import sys

import numpy as np
import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st

import kadj

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sweep  # noqa: E402
from random_source import compile_source  # noqa: E402
from test_random_kernels import SETTINGS  # noqa: E402

_VIEWS = ("[1:-1]", "[:-2]", "[2:]")


@st.composite
def array_expr(draw, names, depth=0):
    """An expression over interior-length operands (n - 2 elements)."""
    if depth >= 3 or draw(st.integers(0, 2)) == 0:
        kind = draw(st.sampled_from(("view", "view", "name", "scalar")))
        if kind == "name" and names:
            return draw(st.sampled_from(names))
        if kind == "scalar":
            return draw(st.sampled_from(("a", "0.5", "1.5")))
        return draw(st.sampled_from(("u", "v", "w"))) + draw(st.sampled_from(_VIEWS))
    op = draw(st.sampled_from(("+", "-", "*", "*", "sin", "tanh", "exptanh", "where")))
    x = draw(array_expr(names, depth + 1))
    if op not in ("+", "-", "*") and not _has_array(x):
        x = f"({x} * v[1:-1])"     # (a function of an array, not of a scalar)
    if op in ("+", "-", "*"):
        y = draw(array_expr(names, depth + 1))
        return f"({x} {op} {y})"
    if op == "exptanh":
        return f"np.exp(np.tanh({x}))"
    if op == "where":
        y = draw(array_expr(names, depth + 1))
        return f"np.where({x} > 0.1, {x}, 0.5 * {y})"
    return f"np.{op}({x})"


def _has_array(text):
    return re.search(r"\b([uvw]\[|d\d)", text) is not None


@st.composite
def array_kernel_source(draw):
    """Source lines of ``def k(u, v, w, a, out, loss, steps)``."""
    lines, names = [], []
    for k in range(draw(st.integers(0, 2))):
        e = draw(array_expr(names))
        if not _has_array(e):
            e = f"{e} * w[1:-1]"
        lines.append(f"d{k} = {e}")
        names.append(f"d{k}")
    updates = []
    for _ in range(draw(st.integers(0, 2))):
        dest = draw(st.sampled_from(("u", "v")))
        e = draw(array_expr(names))
        form = draw(st.sampled_from(("assign", "add", "sub")))
        if form == "assign":
            updates.append(f"{dest}[1:-1] = {dest}[1:-1] + 0.25 * {e}")
        else:
            updates.append(f"{dest}[1:-1] {'+' if form == 'add' else '-'}= 0.25 * {e}")
    if updates and draw(st.booleans()):
        lines.append("for t in range(steps):")
        lines += [f"    {x}" for x in updates]
    else:
        lines += updates
    e = draw(array_expr(names))
    if not _has_array(e):
        e = f"{e} * u[1:-1]"
    end = draw(st.sampled_from(("sum", "mean", "max", "out")))
    if end == "out":
        lines.append(f"out[1:-1] = {e}")
    elif end == "max":
        lines.append(f"loss[0] = np.max(np.tanh({e}) + 0.01 * w[1:-1])")
    else:
        lines.append(f"loss[0] = np.{end}({e} * {e})")
    return lines


def _compile(lines):
    fn, src = compile_source("ax", "u, v, w, a, out, loss, steps", lines, "array kernel")
    return kadj.differentiate(fn, wrt=("u", "v", "w", "a")), src


SIZES = ((3, 1), (4, 2), (9, 3))


def _data(seed, n, steps):
    rng = np.random.default_rng(seed)
    # |values| at least 0.2 from the np.where threshold 0.1 and from ties of np.max
    # (a tie has no derivative); small enough that steps stay tame
    x = rng.uniform(0.3, 0.8, (3, n)) * np.where(rng.random((3, n)) < 0.5, -1.0, 1.0)
    return (x[0], x[1], x[2], float(rng.uniform(0.2, 0.6)), np.zeros(n), np.zeros(1),
            steps)


def _check(lines, seed):
    k, src = _compile(lines)
    note(src)
    cases = ((f"n={n}, steps={t}", _data(seed + n, n, t)) for n, t in SIZES)
    assert sweep.check_many(k, cases) == len(SIZES)


@settings(max_examples=6, **SETTINGS)
@given(lines=array_kernel_source(), seed=st.integers(0, 2**16))
def test_random_array_kernel(private_cache_dir, lines, seed):
    _check(lines, seed)


@pytest.mark.slow
@settings(max_examples=60, **SETTINGS)
@given(lines=array_kernel_source(), seed=st.integers(0, 2**16))
def test_many_random_array_kernels(private_cache_dir, lines, seed):
    _check(lines, seed)
