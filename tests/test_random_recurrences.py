"""Property tests: random per-element recurrences, generated as source text, against
finite differences.

Hypothesis draws a loop over elements (``range`` or ``prange``) whose iterations each run
an inner loop that carries a value from step to step (``v = 0.5 * v + c[k] * x[i]``,
``v = math.tanh(v) * c[k] + x[i]``, a second carried value, a branch on the step or on
the element), then write the element's output and possibly add into a returned sum.
Such loops record a tape per iteration; kadj replays each iteration's forward part and
reverses it, on the CPU four iterations side by side (:mod:`kadj.lane_jam`).  Each
kernel is checked with :func:`kadj.testing.check_grad` (float64 central differences,
adjoint compiled with bounds checking) at element counts around every remainder of
four and past the tape's first capacity.

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

INNER = ("range(c.shape[0])", "range(c.shape[0] - 1, -1, -1)", "range(3)",
         "range(2, c.shape[0])")
STEP_TERMS = ("c[k]", "c[k] * x[i]", "w[i]", "a * c[k]", "math.sin(x[i] + c[k])")
COND = ("k % 2 == 0", "x[i] > 0.0", "k < 2")


@st.composite
def recurrence_source(draw):
    """(source lines of ``def k(x, w, c, out, a)``, whether the outer loop is a
    ``prange``)."""
    init = draw(st.sampled_from(("x[i]", "c[0]", "a * x[i]", "0.0")))
    body = [f"v = {init}"]
    second = draw(st.booleans())
    if second:
        body.append("q = w[i]")
    body.append(f"for k in {draw(st.sampled_from(INNER))}:")
    steps = []
    for _ in range(draw(st.integers(1, 2))):
        form = draw(st.sampled_from(("lin", "tanh", "branch")))
        term = draw(st.sampled_from(STEP_TERMS))
        if form == "lin":
            steps.append(f"v = {draw(st.sampled_from(('0.5', 'a', '-0.7')))} * v + {term}")
        elif form == "tanh":
            steps.append(f"v = math.tanh(v) * c[k] + {term}")
        else:
            steps += [f"if {draw(st.sampled_from(COND))}:",
                      f"    v = v * a + {term}",
                      "else:",
                      f"    v = 0.5 * v - {draw(st.sampled_from(STEP_TERMS))}"]
    if second:
        steps.append(f"q = q * 0.5 + v * {draw(st.sampled_from(STEP_TERMS))}")
    body += ["    " + s for s in steps]
    final = draw(st.sampled_from(("v", "v * x[i]", "math.tanh(v) + w[i]", "v * v")))
    if second:
        final = f"{final} + q"
    body.append(f"out[i] {draw(st.sampled_from(('=', '+=')))} {final}")
    total = draw(st.booleans())
    if total:
        body.append(f"s += {draw(st.sampled_from(('v', 'v * w[i]', 'out[i]')))}")
    parallel = draw(st.booleans())
    loop = "prange" if parallel else "range"
    lines = (["s = 0.0"] if total else []) + [f"for i in {loop}(x.shape[0]):"] + \
        ["    " + b for b in body] + (["return s"] if total else [])
    return lines, parallel


def _compile(spec):
    lines, parallel = spec[0], spec[-1]
    fn, src = compile_source("r", "x, w, c, out, a", lines, "recurrence", parallel)
    return kadj.differentiate(fn), src


#: element counts: every remainder of four (the side-by-side lanes), and enough
#: elements that the tape outgrows its first capacity
SIZES = (1, 2, 3, 4, 5, 7, 8, 9, 13, 701)


def _data(seed, n, m):
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.3, 1.5, n) * rng.choice([-1.0, 1.0], n)   # |x| >= 0.3: no ties
    return (x, rng.uniform(-1.0, 1.0, n), rng.uniform(-1.0, 1.0, m),
            rng.uniform(-1.0, 1.0, n), float(rng.uniform(0.2, 0.9)))


def _check(spec, seed, m):
    k, src = _compile(spec)
    note(src)
    cases = ((f"n={n}", _data(seed + n, n, m)) for n in SIZES)
    assert sweep.check_many(k, cases) == len(SIZES)


@settings(max_examples=8, **SETTINGS)
@given(spec=recurrence_source(), seed=st.integers(0, 2**16), m=st.sampled_from((3, 4, 6)))
def test_random_recurrence(private_cache_dir, spec, seed, m):
    _check(spec, seed, m)


@pytest.mark.slow
@settings(max_examples=50, **SETTINGS)
@given(spec=recurrence_source(), seed=st.integers(0, 2**16), m=st.sampled_from((3, 4, 6)))
def test_many_random_recurrences(private_cache_dir, spec, seed, m):
    _check(spec, seed, m)


def test_a_drawn_recurrence_runs_four_elements_side_by_side(private_cache_dir):
    """The generator reaches the form it is meant to test."""
    k, _ = _compile((["for i in range(x.shape[0]):", "    v = x[i]",
                      "    for k in range(c.shape[0]):",
                      "        v = math.tanh(v) * c[k] + w[i]", "    out[i] = v * x[i]"],
                     False))
    src = k.adjoint_source(*_data(0, 9, 3))
    assert "_l1" in src and "_l3" in src
