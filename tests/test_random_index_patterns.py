"""Property tests: random loop nests whose iterations may touch one element twice,
against finite differences.

Hypothesis draws one to three loop nests (1-D or 2-D arrays, an optional time loop
around a nest) whose counters start at -2..2 or at a start given at run time, go up by
1 or 2 or down by 1, and index the arrays at offsets -2..2, at ``n - 1 - i``, at
constants, and (2-D) with the counters in either order, ``y[i, j]`` and ``y[j, i]``.
numba wraps negative indices around, so ``y[-1]`` is ``y[n - 1]``: such loops write
one element at two iterations, and the analyses that take ``y[i]`` to be another
element at every iteration (reversal in forward order, in parallel or side by side;
rows an iteration owns; a running extremum's mark) must not apply.  The statements
store, accumulate into (damped, so that finite differences resolve the chains of
updates) and keep a running maximum of expressions over both arrays (in place) and a
scalar.  Each kernel is checked with :func:`kadj.testing.check_grad`
(float64 central differences, adjoint compiled with bounds checking) with the default
options, ``parallel=True`` and ``gather=True``, at several sizes; the loops stop two
short of the arrays' ends and the arrays have at least four elements along each axis,
so every index lies in [-n, n - 1]: in bounds, negative ones wrapping onto elements
other iterations write.

Derandomized (the same examples on every run); on failure the drawn source is printed
(Hypothesis ``note``).  The default run draws a few kernels; ``-m slow`` many more.
"""
import os
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

CONSTS = ("0.5", "1.5", "(i * 0.25 + 1.0)")


@st.composite
def nest(draw, two_d):
    """Source lines of one loop nest (and the counters it binds)."""
    start = draw(st.sampled_from(("-2", "-1", "0", "1", "2", "lo")))
    step = draw(st.sampled_from((1, 1, -1, 2)))
    rng = (f"range(n - 3, {start} - 1, -1)" if step == -1
           else f"range({start}, n - 2, {step})")
    lines, ind = [], ""
    if draw(st.integers(0, 3)) == 0:
        lines.append("for t in range(2):")
        ind = "    "
    lines.append(f"{ind}for i in {rng}:")
    ind += "    "
    counters = ["i"]
    if two_d or draw(st.integers(0, 2)) == 0:
        lines.append(f"{ind}for j in range({draw(st.sampled_from(('0', '-1', '1')))}, n - 2):")
        ind += "    "
        counters.append("j")

    def one_index():
        if draw(st.integers(0, 9)) == 0:
            return draw(st.sampled_from(("0", f"n - 3 - {counters[0]}")))
        return draw(st.sampled_from(counters)) + draw(st.sampled_from(
            ("", "", " + 1", " - 1", " - 2", " + 2")))

    def index():
        if not two_d:
            return one_index()
        if len(counters) == 2 and draw(st.booleans()):
            return ", ".join(draw(st.permutations(counters)))
        return f"{one_index()}, {draw(st.sampled_from(counters + ['0', '1']))}"

    def leaf(only_x):
        kind = draw(st.integers(0, 9))
        if kind < 5 or (only_x and kind < 7):
            return f"x[{index()}]"
        if kind < 7:
            return f"y[{index()}]"
        if kind < 8:
            return "a"
        return draw(st.sampled_from(CONSTS))

    def expr(depth=2, only_x=False):
        if depth == 0 or draw(st.integers(0, 2)) == 0:
            return leaf(only_x)
        form = draw(st.sampled_from(("math.sin({})", "({}) * ({})", "({}) + ({})")))
        return form.format(*[expr(depth - 1, only_x) for _ in range(form.count("{}"))])

    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(("map", "store", "store", "add", "sum", "max")))
        target = draw(st.sampled_from(("y", "y", "x")))
        # (damped: a chain of updates through nested loops and time steps stays
        # mild enough for finite differences to resolve)
        if kind == "map":
            # y at the counters themselves, from x alone: iterations that look
            # independent (y[i] written once per i) unless i can be negative
            at = ", ".join(draw(st.permutations(counters))) if two_d and \
                len(counters) == 2 else (f"{counters[0]}, 0" if two_d else counters[0])
            lines.append(f"{ind}y[{at}] = 0.5 * ({expr(only_x=True)}) * "
                         f"({counters[0]} + 3)")
        elif kind == "store":
            lines.append(f"{ind}{target}[{index()}] = 0.5 * ({expr()})")
        elif kind == "add":
            lines.append(f"{ind}{target}[{index()}] += 0.1 * ({expr()})")
        elif kind == "sum":
            lines.append(f"{ind}s += {expr()}")
        else:
            lines += [f"{ind}m = {expr()}", f"{ind}if m > s:", f"{ind}    s = m"]
    return lines


@st.composite
def index_source(draw):
    """(source lines of ``def k(x, y, a, lo)``, whether the arrays are 2-D)."""
    two_d = draw(st.booleans())
    lines = ["n = x.shape[0]", "s = 0.0"]
    for _ in range(draw(st.integers(1, 3))):
        lines += draw(nest(two_d))
    lines.append("return s")
    return lines, two_d


def _data(seed, n, two_d):
    rng = np.random.default_rng(seed)
    shape = (n, n) if two_d else (n,)
    return (rng.uniform(-1, 1, shape), rng.uniform(-1, 1, shape), 0.7,
            (-1, 0, 2)[seed % 3])


def _check(drawn, seed):
    lines, two_d = drawn
    fn, src = compile_source("ix", "x, y, a, lo", lines, "index patterns")
    note(src)
    for options in ({}, {"parallel": True}, {"gather": True}):
        k = kadj.differentiate(fn, **options)
        for n in (4, 5, 8):
            sweep.check_redrawing_ties(
                k, f"n={n}, {options}",
                lambda attempt, n=n: _data(seed + n + 1000 * attempt, n, two_d), note)


@settings(max_examples=8, **SETTINGS)
@given(drawn=index_source(), seed=st.integers(0, 2**16))
def test_random_index_patterns(private_cache_dir, drawn, seed):
    _check(drawn, seed)


@pytest.mark.slow
@settings(max_examples=60, **SETTINGS)
@given(drawn=index_source(), seed=st.integers(0, 2**16))
def test_many_random_index_patterns(private_cache_dir, drawn, seed):
    _check(drawn, seed)
