"""Property tests: random stencil kernels, generated as source text, against finite
differences, at sizes around every boundary of the gather form.

Hypothesis draws a 1-D or 2-D loop nest ``for i in range(lo, n - hi)`` (``prange`` for
the outer loop or not; in 2-D either loop order) whose body writes ``out`` at the loop
counters from a sum of terms over neighbours ``u[i + o]`` with offsets inside the
margins: constant or scalar coefficients, squares, products of two neighbours,
``tanh``, and variable coefficients ``kappa[i + o] * (u[...] - u[...])``.  Such nests
take the gather form of the CPU adjoint (edges, branch-free interior, consumption of
the outputs' adjoints after or lagging behind it) and, with ``prange``, run it in
parallel, in blocks of :data:`kadj.parallel.BLOCK` iterations in 1-D.  Each kernel is
checked with :func:`kadj.testing.check_grad` (float64 central differences against the
adjoint, adjoint compiled with bounds checking) at sizes with no iteration, one
iteration, a few, and in 1-D past one and two blocks.

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
from kadj.parallel import BLOCK

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sweep  # noqa: E402
from random_source import compile_source  # noqa: E402
from test_random_kernels import SETTINGS  # noqa: E402

COUNTERS = ("i", "j", "k")
CONSTS = ("0.5", "-1.5", "2.0", "a")


def _at(name, counters, off):
    """``u[i - 1, j]`` for ``off == (-1, 0)``."""
    parts = []
    for c, o in zip(counters, off):
        parts.append(c if o == 0 else f"{c} + {o}" if o > 0 else f"{c} - {-o}")
    return f"{name}[{', '.join(parts)}]"


@st.composite
def stencil_source(draw):
    """(source lines of ``def k(u, kappa, out, a)``, ndim, margins (lo, hi), whether
    the outer loop is a ``prange``)."""
    ndim = draw(st.sampled_from((1, 1, 2, 2, 3)))
    lo = tuple(draw(st.integers(0, 2)) for _ in range(ndim))
    hi = tuple(draw(st.integers(0, 2)) for _ in range(ndim))
    counters = COUNTERS[:ndim]
    zero = (0,) * ndim

    def nb(name="u"):
        off = tuple(draw(st.integers(-lo[d], hi[d])) for d in range(ndim))
        return _at(name, counters, off)

    def terms(extra=()):
        out = []
        for _ in range(draw(st.integers(1, 4))):
            kind = draw(st.sampled_from(("lin", "sq", "prod", "tanh", "kappa", "other")
                                        + tuple(extra)))
            c = draw(st.sampled_from(CONSTS + tuple(extra)))
            if kind == "lin":
                out.append(f"{c} * {nb()}")
            elif kind == "sq":
                v = nb()
                out.append(f"{c} * {v} * {v}")
            elif kind == "prod":
                out.append(f"{nb()} * {nb()}")
            elif kind == "tanh":
                out.append(f"math.tanh({c} * {nb()})")
            elif kind == "kappa":
                out.append(f"{nb('kappa')} * ({nb()} - {nb()})")
            elif kind == "other":      # a coefficient read at an element of its own
                at = ", ".join([counters[0]] + ["0"] * (ndim - 1)) if ndim > 1 else "0"
                out.append(f"kappa[{at}] * {nb()}")
            else:                      # a local or a hoisted value
                out.append(f"{kind} * {nb()}")
        return " + ".join(out)

    body = []
    hoisted = []
    extra = []
    if ndim > 1 and draw(st.booleans()):          # a statement between the loops
        hoisted.append(f"c = a * {draw(st.sampled_from(CONSTS[:3]))}")
        extra.append("c")
    if draw(st.booleans()):                        # a local used twice
        body.append(f"t = {terms(extra)}")
        extra.append("t")
        extra.append("t")
    expr = terms(extra)
    if "t" in extra and "t" not in expr.split():
        expr = f"t * ({expr})"
    own = _at("out", counters, zero)
    form = draw(st.sampled_from(("=", "+=", "step")))
    if form == "step":
        body.append(f"{own} = {_at('u', counters, zero)} + a * ({expr})")
    else:
        body.append(f"{own} {form} {expr}")
    total = draw(st.booleans())                    # a scalar sum, returned
    if total:
        body.append(f"s += {nb()} * {nb()}")
    parallel = draw(st.booleans())
    order = list(range(ndim))
    if ndim > 1 and draw(st.booleans()):
        order.reverse()                  # the inner loop runs over the first dimension
    lines = ["s = 0.0"] if total else []
    for depth, d in enumerate(order):
        rng = "prange" if parallel and depth == 0 else "range"
        stop = f"u.shape[{d}]" + (f" - {hi[d]}" if hi[d] else "")
        lines.append("    " * depth + f"for {counters[d]} in {rng}({lo[d]}, {stop}):")
        if depth == 0 and hoisted:
            lines += ["    " + h for h in hoisted]
    lines += ["    " * ndim + b for b in body]
    if total:
        lines.append("return s")
    return lines, ndim, (lo, hi), parallel


def _compile(spec):
    lines, parallel = spec[0], spec[-1]
    fn, src = compile_source("s", "u, kappa, out, a", lines, "stencil", parallel)
    return kadj.differentiate(fn, gather=True), src


def _sizes(ndim, margins, many):
    """Shapes with no iteration, one, a few, and (1-D) past one and two blocks."""
    lo, hi = margins
    base = [lo[d] + hi[d] for d in range(ndim)]
    if ndim == 1:
        sizes = [base[0], base[0] + 1, base[0] + 2, base[0] + 5, 37]
        if many:
            sizes += [base[0] + BLOCK + 1, base[0] + 2 * BLOCK + 3]
        return [(n,) for n in sorted(set(max(n, 1) for n in sizes))]
    grow = [(1,) * ndim, (2, 3, 1)[:ndim], (4, 1, 3)[:ndim]]
    shapes = [tuple(b + g for b, g in zip(base, gs)) for gs in grow]
    shapes.append((9, 7, 6)[:ndim])
    if many:
        shapes.append((40, 33) if ndim == 2 else (12, 9, 10))
    return [tuple(max(s, 1) for s in shape) for shape in dict.fromkeys(shapes)]


def _data(seed, shape):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape), 0.5 + rng.random(shape),
            rng.standard_normal(shape), float(rng.uniform(0.2, 1.2)))


def _check(spec, seed, many):
    k, src = _compile(spec)
    note(src)
    _lines, ndim, margins, _parallel = spec
    shapes = _sizes(ndim, margins, many)
    note(f"shapes: {shapes}")
    cases = ((f"shape={s}", _data(seed + i, s)) for i, s in enumerate(shapes))
    assert sweep.check_many(k, cases) == len(shapes)


@settings(max_examples=8, **SETTINGS)
@given(spec=stencil_source(), seed=st.integers(0, 2**16))
def test_random_stencil(private_cache_dir, spec, seed):
    _check(spec, seed, many=True)


@pytest.mark.slow
@settings(max_examples=60, **SETTINGS)
@given(spec=stencil_source(), seed=st.integers(0, 2**16))
def test_many_random_stencils(private_cache_dir, spec, seed):
    _check(spec, seed, many=True)


def test_the_drawn_stencils_take_the_gather_form(private_cache_dir):
    """The generator reaches the form it is meant to test: a drawn 2-D nest and a
    drawn 1-D prange loop get the gather form (in blocks, in parallel)."""
    spec2 = (["for i in range(1, u.shape[0] - 1):",
              "    for j in range(0, u.shape[1] - 2):",
              "        out[i, j] = a * u[i - 1, j + 2] + kappa[i, j] * (u[i + 1, j] - u[i, j])"],
             2, ((1, 0), (1, 2)), False)
    k, _ = _compile(spec2)
    src = k.adjoint_source(*_data(0, (6, 7)))
    assert "gather form" in src
    spec1 = (["for i in prange(2, u.shape[0] - 1):",
              "    out[i] = u[i] + a * (u[i - 2] * u[i + 1] + math.tanh(0.5 * u[i]))"],
             1, ((2,), (1,)), True)
    k, _ = _compile(spec1)
    src = k.adjoint_source(*_data(0, (40,)))
    assert "gather form" in src and "numba.prange" in src and f"{BLOCK}" in src
