"""Property tests: random element updates in place in two-dimensional loop nests,
generated as source text, against finite differences.

Hypothesis draws a nest of two loops over a 2-D array ``y`` (rows outside or columns
outside; each loop going up, down or with step 2; sometimes inside a time loop) whose
inner body updates ``y`` in place at the element of the iteration or a neighbour in
either direction (``y[i + s, j + t] = ...``, ``+=``, ``*=``, under a branch or not),
reading ``y`` at the element, a neighbour, or a boundary row or column, and whose outer
body may read or write a boundary element of its row before or after the inner loop.
These are the nests kadj.entry_loads must judge (a neighbour ahead in the inner loop is
read on entry; a neighbour in the next outer iteration is not, when the inner loop of an
earlier outer iteration wrote it) and kadj.store_forwarding rewrites.  Each kernel is
checked with :func:`kadj.testing.check_grad` (float64 central differences, adjoint
compiled with bounds checking) at several shapes, one whose tapes outgrow their first
capacity.

Derandomized; on failure the drawn source is printed (Hypothesis ``note``).  The
default run draws a few kernels; ``-m slow`` many more.
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


def _loop(var, dim, form):
    n = f"y.shape[{dim}]"
    return {"up": f"range(1, {n} - 1)", "down": f"range({n} - 2, 0, -1)",
            "step2": f"range(1, {n} - 1, 2)"}[form]


def _off(var, s):
    return var if s == 0 else f"{var} {'+' if s > 0 else '-'} {abs(s)}"


@st.composite
def nest_source(draw):
    """Source lines of ``def k(x, y, out, a)`` (all three arrays 2-D)."""
    offsets = st.sampled_from((-1, 0, 0, 1))
    temps = []

    def elem(arr, row_only=False):
        di = draw(offsets)
        if row_only:
            col = draw(st.sampled_from(("0", "y.shape[1] - 1")))
            return f"{arr}[{_off('i', di)}, {col}]"
        form = draw(st.sampled_from(("near", "near", "near", "near", "edge_row",
                                     "edge_col")))
        dj = draw(offsets)
        if form == "edge_row":
            return f"{arr}[0, {_off('j', dj)}]"
        if form == "edge_col":
            return f"{arr}[{_off('i', di)}, 0]"
        return f"{arr}[{_off('i', di)}, {_off('j', dj)}]"

    def term(row_only=False):
        kind = draw(st.sampled_from(("y", "y", "x", "temp", "a")))
        if kind == "temp" and temps and not row_only:
            return draw(st.sampled_from(temps))
        if kind == "x":
            return "x[i, 0]" if row_only else elem("x")
        if kind == "a":
            return "a"
        return elem("y", row_only)

    def expr(row_only=False):
        form = draw(st.sampled_from(("prod", "sum", "sin", "tanh", "square")))
        if form == "prod":
            return f"{term(row_only)} * {term(row_only)}"
        if form == "sum":
            return f"{term(row_only)} + a * {term(row_only)}"
        if form == "sin":
            return f"math.sin({term(row_only)}) * {term(row_only)}"
        if form == "tanh":
            return f"math.tanh({term(row_only)} * a)"
        t = term(row_only)
        return f"{t} * {t}"

    def bounded(row_only=False):
        return f"math.tanh({expr(row_only)})"

    rows_outside = draw(st.booleans())

    def outer_part():
        # with columns outside, the outer body has no row of its own: nothing there
        lines = []
        for _ in range(draw(st.integers(0, 1)) if rows_outside else 0):
            kind = draw(st.sampled_from(("store", "read", "out")))
            if kind == "store":
                lines.append(f"{elem('y', row_only=True)} = {bounded(True)}")
            elif kind == "read":
                name = f"r{len(temps)}"
                lines.append(f"{name} = {expr(True)}")
                temps.append(name)
            else:
                lines.append(f"out[i, 0] += {expr(True)}")
        return lines

    before = outer_part()
    body = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(("store", "store", "augmented", "temp", "out",
                                     "branch")))
        if kind == "store":
            body.append(f"{elem('y')} = {bounded()}")
        elif kind == "augmented":
            op = draw(st.sampled_from(("+=", "-=", "*=")))
            body.append(f"{elem('y')} {op} 0.5 * {bounded()}")
        elif kind == "temp":
            name = f"v{len(temps)}"
            body.append(f"{name} = {expr()}")
            temps.append(name)
        elif kind == "out":
            body.append(f"out[i, j] += {expr()}")
        else:
            body += ["if x[i, j] > 0.0:", f"    {elem('y')} = {bounded()}"]
    if not any(ln.lstrip().startswith("y[") for ln in body):
        body.append(f"y[i, j] = {bounded()}")
    after = [ln for ln in outer_part() if not ln.startswith("r")]
    forms = st.sampled_from(("up", "up", "down", "step2"))
    if rows_outside:
        lines = [f"for i in {_loop('i', 0, draw(forms))}:"]
        lines += ["    " + ln for ln in before]
        lines += [f"    for j in {_loop('j', 1, draw(forms))}:"]
        lines += ["        " + ln for ln in body]
        lines += ["    " + ln for ln in after]
    else:
        lines = [f"for j in {_loop('j', 1, draw(forms))}:"]
        lines += [f"    for i in {_loop('i', 0, draw(forms))}:"]
        lines += ["        " + ln for ln in body]
    if draw(st.integers(0, 3)) == 0:
        lines = ["for t in range(2):"] + ["    " + ln for ln in lines]
    return lines


#: shapes: the smallest with an interior, odd and even (step 2), and one whose tapes
#: outgrow their first capacity
SHAPES = ((3, 3), (4, 5), (6, 4), (7, 8), (37, 34))


def _data(seed, shape):
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.3, 1.2, shape) * rng.choice([-1.0, 1.0], shape)   # no ties
    return (x, rng.uniform(0.2, 0.8, shape), np.zeros(shape),
            float(rng.uniform(0.3, 0.7)))


def _check(lines, seed):
    fn, src = compile_source("ip2", "x, y, out, a", lines, "in-place 2-D")
    note(src)
    k = kadj.differentiate(fn)
    cases = ((f"shape={s}", _data(seed + s[0] * 100 + s[1], s)) for s in SHAPES)
    assert sweep.check_many(k, cases) == len(SHAPES)


@settings(max_examples=int(os.environ.get("KADJ_EXAMPLES", 8)), **SETTINGS)
@given(lines=nest_source(), seed=st.integers(0, 2**16))
def test_random_update_in_place_2d(private_cache_dir, lines, seed):
    _check(lines, seed)


@pytest.mark.slow
@settings(max_examples=int(os.environ.get("KADJ_EXAMPLES", 60)), **SETTINGS)
@given(lines=nest_source(), seed=st.integers(0, 2**16))
def test_many_random_updates_in_place_2d(private_cache_dir, lines, seed):
    _check(lines, seed)
