"""Property tests: random element updates in place, generated as source text, against
finite differences.

Hypothesis draws a loop over an array ``y`` (going up, going down, or with step 2,
possibly inside a time loop) whose body updates ``y`` in place at the element of the
iteration or a neighbour (``y[i + s] = ...``, ``+=``, ``*=``, under a branch or not),
reading ``y`` at the element or a neighbour, before or after the updates, through
temporaries or not, and sometimes writing what it read into ``out``.  These are the
kernels kadj.store_forwarding and kadj.entry_loads rewrite (loads after stores of the
same element, loads of what ``y`` held on entry, at the element or ahead of the sweep)
and the ones they must leave alone (neighbours behind, time loops, stores under
branches).  Each kernel is checked with :func:`kadj.testing.check_grad` (float64 central
differences, adjoint compiled with bounds checking) at several sizes, one past the
tape's first capacity.

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

LOOPS = {"up": "range(2, y.shape[0] - 2)", "down": "range(y.shape[0] - 3, 1, -1)",
         "step2": "range(2, y.shape[0] - 2, 2)"}


def _elem(arr, off):
    return f"{arr}[i]" if off == 0 else f"{arr}[i {'+' if off > 0 else '-'} {abs(off)}]"


@st.composite
def in_place_source(draw):
    """Source lines of ``def k(x, y, out, a)``."""
    offsets = st.sampled_from((-1, 0, 0, 1))
    body = []
    temps = []

    def term():
        kind = draw(st.sampled_from(("y", "y", "x", "temp", "a")))
        if kind == "temp" and temps:
            return draw(st.sampled_from(temps))
        if kind == "x":
            return _elem("x", draw(offsets))
        if kind == "a":
            return "a"
        return _elem("y", draw(offsets))

    def expr():
        form = draw(st.sampled_from(("prod", "sum", "sin", "tanh", "square")))
        if form == "prod":
            return f"{term()} * {term()}"
        if form == "sum":
            return f"{term()} + a * {term()}"
        if form == "sin":
            return f"math.sin({term()}) * {term()}"
        if form == "tanh":
            return f"math.tanh({term()} * a)"
        t = term()
        return f"{t} * {t}"

    def bounded():
        # what a store puts into y stays in (-1, 1): recurrences through neighbours
        # and time steps neither blow up nor die out
        return f"math.tanh({expr()})"

    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(("store", "store", "augmented", "temp", "out",
                                     "branch")))
        if kind == "store":
            body.append(f"{_elem('y', draw(offsets))} = {bounded()}")
        elif kind == "augmented":
            op = draw(st.sampled_from(("+=", "-=", "*=")))
            body.append(f"{_elem('y', draw(offsets))} {op} 0.5 * {bounded()}")
        elif kind == "temp":
            name = f"v{len(temps)}"
            body.append(f"{name} = {expr()}")
            temps.append(name)
        elif kind == "out":
            body.append(f"out[i] += {expr()}")
        else:
            body += ["if x[i] > 0.0:", f"    {_elem('y', draw(offsets))} = {bounded()}"]
    if not any(ln.lstrip().startswith("y[") for ln in body):
        body.append(f"y[i] = {bounded()}")
    loop = draw(st.sampled_from(sorted(LOOPS)))
    lines = [f"for i in {LOOPS[loop]}:"] + ["    " + b for b in body]
    if draw(st.integers(0, 3)) == 0:
        lines = ["for t in range(2):"] + ["    " + ln for ln in lines]
    return lines


#: sizes: the smallest with an interior, odd and even (step 2), and one whose tapes
#: outgrow their first capacity
SIZES = (5, 6, 9, 14, 1201)


def _data(seed, n):
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.3, 1.2, n) * rng.choice([-1.0, 1.0], n)   # |x| >= 0.3: no ties
    return x, rng.uniform(0.2, 0.8, n), np.zeros(n), float(rng.uniform(0.3, 0.7))


def _check(lines, seed):
    fn, src = compile_source("ip", "x, y, out, a", lines, "in-place")
    note(src)
    k = kadj.differentiate(fn)
    cases = ((f"n={n}", _data(seed + n, n)) for n in SIZES)
    assert sweep.check_many(k, cases) == len(SIZES)


@settings(max_examples=10, **SETTINGS)
@given(lines=in_place_source(), seed=st.integers(0, 2**16))
def test_random_update_in_place(private_cache_dir, lines, seed):
    _check(lines, seed)


@pytest.mark.slow
@settings(max_examples=80, **SETTINGS)
@given(lines=in_place_source(), seed=st.integers(0, 2**16))
def test_many_random_updates_in_place(private_cache_dir, lines, seed):
    _check(lines, seed)


def test_the_generator_reaches_entry_loads_and_forwarded_loads(private_cache_dir):
    """Forms it is meant to test: a load after a store of the element in one sequence,
    and a neighbour ahead read on entry."""
    fn, _ = compile_source("ip", "x, y, out, a", [
        "for i in range(2, y.shape[0] - 2):",
        "    y[i] = y[i + 1] * y[i]",
        "    out[i] += y[i] * a"], "in-place")
    k = kadj.differentiate(fn)
    args = _data(0, 9)
    prepared = k.stages(*args, until="prepared")["prepared"].kernel
    from kadj import ir
    loads = [s.expr for s in ir.walk(prepared.body)
             if isinstance(s, ir.Assign) and isinstance(s.expr, ir.Load) and
             s.expr.array.name == "y"]
    assert len(loads) == 2 and all(ld.entry for ld in loads), ir.fmt(prepared.body)
    assert "y_work" not in k.adjoint_source(*args)
    sweep.check_many(k, [("n=9", args)])
