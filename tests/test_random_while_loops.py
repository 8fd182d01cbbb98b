"""Property tests: random loops with data-dependent exits, generated as source text,
against finite differences.

Hypothesis draws a loop over elements whose body runs an inner ``while`` loop (or a
``for`` loop left by ``break``) that updates a value until it passes a limit, with a
step counter bound, an optional ``continue`` or second ``break`` under a condition on
the value, an optional early ``return`` from the kernel, and an output written after
the loop (possibly depending on the trip count).  The trip counts differ from element
to element, so the adjoint records them (:mod:`kadj.analysis`) or reverses the loop
from its exits.  The data are continuous, so a value lands within the finite-difference
step of a limit with a probability about the step size per comparison; where one does
(check_grad names a kink or tie), the case is drawn again with other data, at most
twice, since a wrong adjoint fails on any data.  Each kernel is checked with :func:`kadj.testing.check_grad` (float64 central differences, adjoint
compiled with bounds checking) at several sizes.

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

UPDATES = ("v = v * 1.3 + a", "v = v + a * (1.0 + 0.1 * math.sin(v))",
           "v = v + 0.5 * w[i] * w[i] + a", "v = math.sqrt(v * v + a) + 0.2")


@st.composite
def while_source(draw):
    """Source lines of ``def k(x, w, out, a, limit)``."""
    form = draw(st.sampled_from(("while", "for-break", "while-true")))
    update = draw(st.sampled_from(UPDATES))
    extra = draw(st.sampled_from(("", "continue", "break")))
    body = ["v = abs(x[i]) + 0.1", "k = 0"]
    if form == "while":
        body.append("while v < limit and k < 30:")
    elif form == "for-break":
        body.append("for k in range(30):")
    else:
        body.append("while True:")
    inner = []
    if form == "for-break":
        inner += ["if v >= limit:", "    break"]
    if form == "while-true":
        inner += ["if v >= limit or k >= 30:", "    break"]
    inner.append(update)
    if form != "for-break":
        inner.append("k += 1")
    if extra == "continue":
        inner += ["if v > 0.5 * limit:", "    v = v + 0.01 * a", "    continue"]
        inner.append("v = v + 0.02 * w[i]")
    elif extra == "break":
        inner += [f"if v * w[i] > {draw(st.sampled_from(('1.5', '2.5')))}:", "    break"]
    body += ["    " + s for s in inner]
    final = draw(st.sampled_from(("v", "v * x[i]", "v + k * a", "math.tanh(v) * w[i]")))
    body.append(f"out[i] = {final}")
    lines = ["for i in range(x.shape[0]):"] + ["    " + b for b in body]
    if draw(st.booleans()):            # an early return from the kernel
        lines[1:1] = ["    if x[i] > 1.7:", "        return"]
    return lines


def _compile(lines):
    fn, src = compile_source("wl", "x, w, out, a, limit", lines, "while loop")
    return kadj.differentiate(fn, wrt=("x", "w", "a")), src


#: element counts.  Kept small: a trip count that changes within the finite-difference
#: step (about one comparison in a million) breaks the check, and every element makes
#: up to 30 comparisons
SIZES = (1, 2, 5, 17, 90)


def _data(seed, n):
    rng = np.random.default_rng(seed)
    return (rng.uniform(-2.0, 2.0, n), rng.uniform(-1.5, 1.5, n), np.zeros(n),
            float(rng.uniform(0.2, 0.6)), float(rng.uniform(3.0, 6.0)))


def _check(lines, seed):
    """Every size checked; a case whose data put a trip count's change within the
    finite-difference step (check_grad names a kink or tie, or finds every element's
    gradient right) is drawn again, at most twice: a wrong adjoint fails on any data."""
    k, src = _compile(lines)
    note(src)
    for n in SIZES:
        sweep.check_redrawing_ties(
            k, f"n={n}", lambda attempt, n=n: _data(seed + n + 1000 * attempt, n), note)


@settings(max_examples=8, **SETTINGS)
@given(lines=while_source(), seed=st.integers(0, 2**16))
def test_random_while_loop(private_cache_dir, lines, seed):
    _check(lines, seed)


@pytest.mark.slow
@settings(max_examples=50, **SETTINGS)
@given(lines=while_source(), seed=st.integers(0, 2**16))
def test_many_random_while_loops(private_cache_dir, lines, seed):
    _check(lines, seed)
